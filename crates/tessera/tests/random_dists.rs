//! `tessera::random`'s distributions against JAX 0.10.2's own values
//! (`fixtures/random/random.json`, made by `fixtures/random/make.py`): bernoulli, randint
//! (i32/u32), truncated_normal, gumbel, exponential, laplace, logistic, categorical and a
//! flax-style dropout, for several keys, shapes (zero-size and odd ones among them) and
//! parameters, bit for bit (floats by their bits), eagerly and under `jit` on both backends.
//! Also XLA:CPU's own `log`/`log1p`, which the distributions are built on.

use serde_json::Value;
use tessera::prelude::*;
use tessera_ir::Shape;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/random/random.json")).expect("valid JSON")
}

fn hex(v: &Value) -> u32 {
    u32::from_str_radix(v.as_str().expect("hex").trim_start_matches("0x"), 16).expect("hex")
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

fn f32_tensor(v: &Value) -> Tensor {
    let data: Vec<f32> = v["bits"]
        .as_array()
        .expect("bits")
        .iter()
        .map(|b| f32::from_bits(hex(b)))
        .collect();
    Tensor::from_vec(data, dims(&v["shape"]))
}

fn scalar_f32(v: &Value) -> f32 {
    f32::from_bits(hex(&v["bits"][0]))
}

/// `jax.random.PRNGKey(seed)` as JAX 0.10.2 makes it with x64 off (its default): the seed is
/// taken as 32 bits, so a seed of `7 << 32 | n` gives the key `[0, n]` (`make.py` uses one).
/// `Key::new` splits a 64-bit seed into two words, as JAX does only with x64 on.
fn jax_key(seed: u64) -> Key {
    Key::from_words(0, seed as u32)
}

type Draw = Box<dyn Fn(&Key) -> Tensor>;

fn draw_fn(name: &str, p: &Value) -> Draw {
    let shape = || dims(&p["shape"]);
    match name {
        "bernoulli" => {
            let (pr, s) = (f32_tensor(&p["p"]), shape());
            Box::new(move |k| random::bernoulli(k, &pr, s.clone()))
        }
        "randint" => {
            let (lo, hi, s) = (
                p["minval"].as_i64().expect("minval"),
                p["maxval"].as_i64().expect("maxval"),
                shape(),
            );
            let dtype = match p["dtype"].as_str().expect("dtype") {
                "int32" => DType::I32,
                "uint32" => DType::U32,
                other => panic!("dtype {other}"),
            };
            Box::new(move |k| random::randint(k, s.clone(), lo, hi, dtype))
        }
        "truncated_normal" => {
            let (lo, hi, s) = (scalar_f32(&p["lower"]), scalar_f32(&p["upper"]), shape());
            Box::new(move |k| random::truncated_normal(k, lo, hi, s.clone()))
        }
        "gumbel" => {
            let s = shape();
            Box::new(move |k| random::gumbel(k, s.clone()))
        }
        "exponential" => {
            let s = shape();
            Box::new(move |k| random::exponential(k, s.clone()))
        }
        "laplace" => {
            let s = shape();
            Box::new(move |k| random::laplace(k, s.clone()))
        }
        "logistic" => {
            let s = shape();
            Box::new(move |k| random::logistic(k, s.clone()))
        }
        "categorical" => {
            let logits = f32_tensor(&p["logits"]);
            let axis = p["axis"].as_i64().expect("axis");
            let s = (!p["shape"].is_null()).then(|| Shape::new(dims(&p["shape"])));
            Box::new(move |k| random::categorical(k, &logits, axis, s.clone()))
        }
        "dropout" => {
            let (rate, x) = (p["rate"].as_f64().expect("rate"), f32_tensor(&p["x"]));
            Box::new(move |k| random::dropout(k, rate, &x))
        }
        "permutation_n" => {
            let n = p["n"].as_u64().expect("n") as usize;
            Box::new(move |k| random::permutation(k, n))
        }
        "permutation" => {
            let xs = dims(&p["x_shape"]);
            let n: usize = xs.iter().product();
            let x = (Tensor::iota(DType::F32, [n], 0) * 0.5 - 3.0).reshape(xs);
            let axis = p["axis"].as_i64().expect("axis");
            let indep = p["independent"].as_bool().expect("independent");
            Box::new(move |k| random::permutation_of(k, &x, axis, indep))
        }
        "choice" => {
            let n = p["n"].as_u64().expect("n") as usize;
            let replace = p["replace"].as_bool().expect("replace");
            let pr = (!p["p"].is_null()).then(|| {
                let v: Vec<f32> = p["p"]
                    .as_array()
                    .expect("p")
                    .iter()
                    .map(|b| f32::from_bits(hex(b)))
                    .collect();
                let len = v.len();
                Tensor::from_vec(v, [len])
            });
            let s = shape();
            Box::new(move |k| random::choice(k, n, s.clone(), replace, pr.as_ref()))
        }
        other => panic!("unknown draw {other}"),
    }
}

/// A draw's values as words: f32 by their bits, integers and bools as i64.
fn words(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .iter()
            .map(|x| x.to_bits() as i64)
            .collect(),
        DType::I32 => t.to_vec::<i32>().iter().map(|&x| x as i64).collect(),
        DType::U32 => t.to_vec::<u32>().iter().map(|&x| x as i64).collect(),
        DType::Bool => words(&t.astype(DType::I32)),
        other => panic!("unexpected dtype {other}"),
    }
}

fn want_words(out: &Value) -> Vec<i64> {
    if out["dtype"] == "f32" {
        out["bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| hex(b) as i64)
            .collect()
    } else {
        out["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_i64().expect("int"))
            .collect()
    }
}

fn want_dtype(out: &Value) -> DType {
    match out["dtype"].as_str().expect("dtype") {
        "f32" => DType::F32,
        "int32" => DType::I32,
        "uint32" => DType::U32,
        "bool" => DType::Bool,
        other => panic!("dtype {other}"),
    }
}

/// Every fixture draw, grouped by function and parameters (one traced function serves all
/// keys), computed by `run`; panics listing the first differences.
fn check_all(how: &str, run: impl Fn(&dyn Fn(&Key) -> Tensor, &[Key]) -> Vec<Tensor>) {
    check_fixture(fixture(), 10_000, how, run);
}

/// `fixtures/random/shuffle.json`: permutation, permutation_of and choice.
fn check_shuffles(how: &str, run: impl Fn(&dyn Fn(&Key) -> Tensor, &[Key]) -> Vec<Tensor>) {
    let all =
        serde_json::from_str(include_str!("fixtures/random/shuffle.json")).expect("valid JSON");
    check_fixture(all, 5_000, how, run);
}

fn check_fixture(
    all: Value,
    at_least: usize,
    how: &str,
    run: impl Fn(&dyn Fn(&Key) -> Tensor, &[Key]) -> Vec<Tensor>,
) {
    let draws = all["draws"].as_array().expect("draws");
    let mut groups: Vec<(String, Vec<&Value>)> = Vec::new();
    for d in draws {
        let id = format!("{}{}", d["fn"], d["params"]);
        match groups.iter_mut().find(|g| g.0 == id) {
            Some(g) => g.1.push(d),
            None => groups.push((id, vec![d])),
        }
    }
    let (mut total, mut wrong, mut report) = (0usize, 0usize, Vec::new());
    for (_, ds) in &groups {
        let name = ds[0]["fn"].as_str().expect("fn");
        let f = draw_fn(name, &ds[0]["params"]);
        let keys: Vec<Key> = ds
            .iter()
            .map(|d| jax_key(d["seed"].as_str().expect("seed").parse().expect("u64")))
            .collect();
        let got = run(&*f, &keys);
        for (t, d) in got.iter().zip(ds) {
            let what = format!("{name} seed {} {}", d["seed"], d["params"]);
            let what: String = what.chars().take(160).collect();
            assert_eq!(
                t.shape(),
                &dims(&d["out"]["shape"])[..],
                "{how} {what}: shape"
            );
            assert_eq!(t.dtype(), want_dtype(&d["out"]), "{how} {what}: dtype");
            let (g, w) = (words(t), want_words(&d["out"]));
            total += w.len();
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                if a != b {
                    wrong += 1;
                    if report.len() < 12 {
                        report.push(format!("  {what} [{i}]: {a:#x} vs JAX {b:#x}"));
                    }
                }
            }
        }
    }
    assert!(total > at_least, "the fixture has {total} values");
    assert!(
        wrong == 0,
        "{how}: {wrong} of {total} values differ from JAX:\n{}",
        report.join("\n")
    );
}

#[test]
fn distributions_are_bit_exact_eagerly() {
    check_all("eager", |f, keys| keys.iter().map(f).collect());
}

#[test]
fn distributions_are_bit_exact_under_jit() {
    check_all("jit (Cranelift)", |f, keys| {
        let j = jit(|k: Key| f(&k));
        keys.iter()
            .map(|k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

#[test]
fn distributions_are_bit_exact_under_jit_on_the_interpreter() {
    check_all("jit (interpreter)", |f, keys| {
        let j = jit(|k: Key| f(&k)).backend(Backend::Interpreter);
        keys.iter()
            .map(|k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

#[test]
fn permutation_and_choice_are_bit_exact_eagerly() {
    check_shuffles("eager", |f, keys| keys.iter().map(f).collect());
}

#[test]
fn permutation_and_choice_are_bit_exact_under_jit() {
    check_shuffles("jit (Cranelift)", |f, keys| {
        let j = jit(|k: Key| f(&k));
        keys.iter()
            .map(|k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

#[test]
fn permutation_and_choice_are_bit_exact_under_jit_on_the_interpreter() {
    check_shuffles("jit (interpreter)", |f, keys| {
        let j = jit(|k: Key| f(&k)).backend(Backend::Interpreter);
        keys.iter()
            .map(|k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

fn check_func(name: &str, f: fn(&Tensor) -> Tensor) {
    let all = fixture();
    let case = &all["funcs"][name];
    let x = f32_tensor(case);
    let want: Vec<u32> = case["out"]
        .as_array()
        .expect("out")
        .iter()
        .map(hex)
        .collect();
    let runs = [
        ("eager", f(&x)),
        (
            "jit (Cranelift)",
            jit(move |x: Tensor| f(&x)).call(x.clone()).expect("jit"),
        ),
        (
            "jit (interpreter)",
            jit(move |x: Tensor| f(&x))
                .backend(Backend::Interpreter)
                .call(x.clone())
                .expect("jit"),
        ),
    ];
    let xs = x.to_vec::<f32>();
    for (how, got) in runs {
        let got: Vec<u32> = got.to_vec::<f32>().iter().map(|v| v.to_bits()).collect();
        let bad: Vec<String> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .map(|(i, (g, w))| format!("{name}({:e}) = {g:08x}, JAX {w:08x}", xs[i]))
            .collect();
        assert!(
            bad.is_empty(),
            "{how}: {} of {} differ: {:?}",
            bad.len(),
            want.len(),
            &bad[..bad.len().min(8)]
        );
    }
}

#[test]
fn xla_log_and_log1p_are_bit_exact() {
    check_func("log", |x| random::xla_log(x));
    check_func("log1p", |x| random::xla_log1p(x));
}
