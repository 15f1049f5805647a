//! `tessera::random` against JAX 0.10.2's own values (`fixtures/prng_reference.json`, made by
//! `fixtures/prng_reference.py` with `pip install jax==0.10.2`) and `fixtures/prng_many.json`
//! (`fixtures/prng_many.py`: many keys, shapes and ranges): keys, bits, uniform, normal and
//! `erf_inv` bit for bit, eagerly and under `jit` on both backends.

use serde_json::Value;
use tessera::prelude::*;

fn reference() -> Value {
    let text = include_str!("fixtures/prng_reference.json");
    let all: Value = serde_json::from_str(text).expect("valid JSON");
    all["variants"]["threefry_partitionable=True (default)"].clone()
}

fn u32s(v: &Value) -> Vec<u32> {
    fn walk(v: &Value, out: &mut Vec<u32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Number(n) => out.push(n.as_u64().expect("u32") as u32),
            _ => panic!("not a number: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(&v["uint32"], &mut out);
    out
}

fn f32_bits(v: &Value) -> Vec<u32> {
    fn walk(v: &Value, out: &mut Vec<u32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::String(s) => {
                out.push(u32::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex"))
            }
            _ => panic!("not hex: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(&v["bits_hex"], &mut out);
    out
}

fn bits_of(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().iter().map(|x| x.to_bits()).collect()
}

/// Distance in units in the last place between two finite f32 of the same sign.
fn ulps(a: u32, b: u32) -> u32 {
    a.abs_diff(b)
}

#[test]
fn keys_split_and_fold_in() {
    let r = reference();
    assert_eq!(
        Key::new(0).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(0))"])
    );
    assert_eq!(
        Key::new(1).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(1))"])
    );
    assert_eq!(
        Key::new(2).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(2))"])
    );
    let [a, b] = Key::new(0).split();
    let want = u32s(&r["split(PRNGKey(0))"]);
    assert_eq!(
        [a.data().to_vec::<u32>(), b.data().to_vec::<u32>()].concat(),
        want
    );
    let three: Vec<u32> = Key::new(0)
        .split_n(3)
        .iter()
        .flat_map(|k| k.data().to_vec::<u32>())
        .collect();
    assert_eq!(three, u32s(&r["split(PRNGKey(0), 3)"]));
    assert_eq!(
        Key::new(0).fold_in(1).data().to_vec::<u32>(),
        u32s(&r["fold_in(PRNGKey(0), 1)"])
    );
    let m = &r["seed_model"];
    assert_eq!(a.data().to_vec::<u32>(), u32s(&m["k1"]));
    assert_eq!(b.data().to_vec::<u32>(), u32s(&m["k2"]));
}

#[test]
fn bits_and_uniform_are_bit_exact() {
    let r = reference();
    let k = Key::new(0);
    assert_eq!(
        random::bits(&k, [6]).to_vec::<u32>(),
        u32s(&r["bits(PRNGKey(0), (6,), uint32)"])
    );
    assert_eq!(
        random::bits(&k, [4, 3]).to_vec::<u32>(),
        u32s(&r["bits(PRNGKey(0), (4,3), uint32)"])
    );
    assert_eq!(
        bits_of(&random::uniform(&k, [6], 0.0, 1.0)),
        f32_bits(&r["uniform(PRNGKey(0), (6,))"])
    );
    let lo = f32::from_bits((-1.0f32).to_bits() - 1);
    let u = random::uniform(&k, [4, 3], lo, 1.0);
    assert_eq!(
        bits_of(&u),
        f32_bits(
            &r["uniform(PRNGKey(0), (4,3), minval=nextafter(-1,0), maxval=1)  [the u inside normal]"]
        )
    );
}

fn assert_bit_exact(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w,
            "{what}[{i}]: {} vs JAX {} ({} ulp)",
            f32::from_bits(g),
            f32::from_bits(w),
            ulps(g, w)
        );
    }
}

#[test]
fn normal_is_bit_exact() {
    let r = reference();
    let n = random::normal(&Key::new(0), [4, 3]);
    assert_bit_exact(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(0), (4,3))"]),
        "normal(0)",
    );
    let n = random::normal(&Key::new(1), [3, 2]);
    assert_bit_exact(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(1), (3,2))"]),
        "normal(1)",
    );
}

#[test]
fn the_seed_models_parameters_and_data() {
    let m = &reference()["seed_model"];
    let [k1, k2] = Key::new(0).split();
    let w1 = random::normal(&k1, [10, 32]) * 0.1;
    let w2 = random::normal(&k2, [32, 1]) * 0.1;
    assert_bit_exact(
        &bits_of(&w1.slice(&[0, 0], &[1, 32])),
        &f32_bits(&m["w1[0,:]"]),
        "w1 row 0",
    );
    assert_bit_exact(
        &bits_of(&w1.slice(&[0, 0], &[10, 1])),
        &f32_bits(&m["w1[:,0] (first column, 10)"]),
        "w1 col 0",
    );
    assert_bit_exact(&bits_of(&w2), &f32_bits(&m["w2[:,0] (all 32)"]), "w2");
    for n in [256, 512, 64] {
        let x = random::normal(&Key::new(1), [n, 10]);
        let key = format!("X=normal(PRNGKey(1),({n},10)) row 0");
        assert_bit_exact(
            &bits_of(&x.slice(&[0, 0], &[1, 10])),
            &f32_bits(&m[&key]),
            &key,
        );
    }
    let y = random::normal(&Key::new(2), [256, 1]);
    assert_bit_exact(
        &bits_of(&y.slice(&[0, 0], &[5, 1])),
        &f32_bits(&m["y=normal(PRNGKey(2),(256,1))[:5,0]"]),
        "y",
    );
}

#[test]
fn random_numbers_are_traced_ops_under_jit() {
    let r = reference();
    let f = jit(|k: Key| random::normal(&k, [4, 3]));
    let n = f.call(Key::new(0)).unwrap();
    assert_bit_exact(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(0), (4,3))"]),
        "jit normal",
    );
    let ir = f.lower(&Key::new(0)).unwrap().ir();
    for op in ["shift_left", "xor", "bitcast", "erf_inv"] {
        assert!(ir.contains(op), "{op} missing from\n{ir}");
    }
    let eager = random::normal(&Key::new(0), [4, 3]);
    assert_eq!(
        bits_of(&n),
        bits_of(&eager),
        "jit and eager draw the same numbers"
    );
}

// ------------------------------------------------------------------------------------------
// `fixtures/prng_many.json` (made by `fixtures/prng_many.py`): 40 keys (seeds, splits,
// fold_ins), shapes from `()` to `(20000,)`, bits, uniform over eight ranges, normal; every
// value bit for bit, eagerly (the interpreter, op by op) and under `jit` on both backends.

fn many() -> Value {
    serde_json::from_str(include_str!("fixtures/prng_many.json")).expect("valid JSON")
}

fn hex_words(s: &str) -> Vec<u32> {
    assert_eq!(s.len() % 8, 0, "hex string of whole words");
    (0..s.len() / 8)
        .map(|i| u32::from_str_radix(&s[8 * i..8 * i + 8], 16).expect("hex"))
        .collect()
}

fn index(v: &Value) -> usize {
    v.as_u64().expect("index") as usize
}

/// The fixture's keys, each rebuilt through Tessera's API from its recipe and checked against
/// JAX's `key_data`.
fn many_keys(all: &Value) -> Vec<Key> {
    let mut keys: Vec<Key> = Vec::new();
    for k in all["keys"].as_array().expect("keys") {
        let d = k["derive"].as_array().expect("derive");
        let key = match d[0].as_str().expect("recipe") {
            "seed" => Key::new(d[1].as_i64().expect("seed")),
            "split" => keys[index(&d[1])].split_n(index(&d[2]))[index(&d[3])].clone(),
            "fold_in" => keys[index(&d[1])].fold_in(d[2].as_u64().expect("data") as u32),
            other => panic!("unknown key recipe {other}"),
        };
        let want: Vec<u32> = k["words"]
            .as_array()
            .expect("words")
            .iter()
            .flat_map(|w| hex_words(w.as_str().expect("hex")))
            .collect();
        assert_eq!(key.data().to_vec::<u32>(), want, "key {}", k["name"]);
        keys.push(key);
    }
    keys
}

/// A draw as a function of the key.
type Draw = Box<dyn Fn(&Key) -> Tensor>;

/// One fixture draw as a function of the key, and its description.
fn draw_fn(d: &Value) -> (String, Draw) {
    let shape: Vec<usize> = d["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(index)
        .collect();
    let f32_of = |v: &Value| f32::from_bits(hex_words(v.as_str().expect("hex"))[0]);
    match d["fn"].as_str().expect("fn") {
        "bits" => (
            format!("bits({shape:?})"),
            Box::new(move |k: &Key| random::bits(k, shape.clone())),
        ),
        "uniform" => {
            let (lo, hi) = (f32_of(&d["minval"]), f32_of(&d["maxval"]));
            (
                format!("uniform({shape:?}, {lo:e}, {hi:e})"),
                Box::new(move |k: &Key| random::uniform(k, shape.clone(), lo, hi)),
            )
        }
        "normal" => (
            format!("normal({shape:?})"),
            Box::new(move |k: &Key| random::normal(k, shape.clone())),
        ),
        other => panic!("unknown draw {other}"),
    }
}

fn raw_bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::U32 => t.to_vec::<u32>(),
        DType::F32 => bits_of(t),
        other => panic!("unexpected dtype {other}"),
    }
}

/// Every fixture draw computed by `run` for every key; panics with the number of differing
/// values, the largest ulp distance and the first few differences if any value differs.
fn check_many(how: &str, run: impl Fn(&dyn Fn(&Key) -> Tensor, &[&Key]) -> Vec<Tensor>) {
    let all = many();
    let keys = many_keys(&all);
    let (mut total, mut wrong, mut worst) = (0usize, 0usize, 0u32);
    let mut report = Vec::new();
    // Per kind of draw (function and range, all shapes): values, differing values, worst ulp.
    let mut kinds: Vec<(String, usize, usize, u32)> = Vec::new();
    for d in all["draws"].as_array().expect("draws") {
        let (what, f) = draw_fn(d);
        let ks: Vec<&Key> = d["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| &keys[index(k)])
            .collect();
        let got = run(&*f, &ks);
        let kind = what.replace(
            &format!(
                "{:?}",
                d["shape"]
                    .as_array()
                    .expect("shape")
                    .iter()
                    .map(index)
                    .collect::<Vec<_>>()
            ),
            "_",
        );
        let at = match kinds.iter().position(|k| k.0 == kind) {
            Some(at) => at,
            None => {
                kinds.push((kind, 0, 0, 0));
                kinds.len() - 1
            }
        };
        for ((t, want), k) in got
            .iter()
            .zip(d["values"].as_array().expect("values"))
            .zip(&d["keys"].as_array().expect("keys")[..])
        {
            let want = hex_words(want.as_str().expect("hex"));
            let got = raw_bits(t);
            assert_eq!(got.len(), want.len(), "{how} {what}: size");
            total += want.len();
            kinds[at].1 += want.len();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if g != w {
                    wrong += 1;
                    worst = worst.max(ulps(g, w));
                    kinds[at].2 += 1;
                    kinds[at].3 = kinds[at].3.max(ulps(g, w));
                    if report.len() < 12 {
                        report.push(format!(
                            "  {what} key {} [{i}]: {g:08x} ({:e}) vs JAX {w:08x} ({:e})",
                            all["keys"][index(k)]["name"],
                            f32::from_bits(g),
                            f32::from_bits(w)
                        ));
                    }
                }
            }
        }
    }
    assert!(total > 150_000, "the fixture has all its draws ({total})");
    assert!(
        wrong == 0,
        "{how}: {wrong} of {total} values differ from JAX's, by up to {worst} ulp:\n{}\nfirst differences:\n{}",
        kinds
            .iter()
            .map(|(k, n, w, u)| format!("  {k}: {w} of {n} differ, by up to {u} ulp"))
            .collect::<Vec<_>>()
            .join("\n"),
        report.join("\n")
    );
}

#[test]
fn many_keys_and_shapes_are_bit_exact_eagerly() {
    check_many("eager", |f, keys| keys.iter().map(|k| f(k)).collect());
}

#[test]
fn many_keys_and_shapes_are_bit_exact_under_jit() {
    check_many("jit (Cranelift)", |f, keys| {
        let j = jit(|k: Key| f(&k));
        keys.iter()
            .map(|&k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

#[test]
fn many_keys_and_shapes_are_bit_exact_under_jit_on_the_interpreter() {
    check_many("jit (interpreter)", |f, keys| {
        let j = jit(|k: Key| f(&k)).backend(Backend::Interpreter);
        keys.iter()
            .map(|&k| j.call(k.clone()).expect("jit"))
            .collect()
    });
}

/// `erf_inv` itself against `lax.erf_inv` on inputs the draws reach rarely or never (the
/// `w >= 5` branch next to +-1, subnormals, signed zeros, +-1), on both backends.
#[test]
fn erf_inv_is_bit_exact_on_both_backends() {
    let all = many();
    let xs: Vec<f32> = hex_words(all["erf_inv"]["x"].as_str().expect("hex"))
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let want = hex_words(all["erf_inv"]["erf_inv"].as_str().expect("hex"));
    let n = xs.len();
    let x = Tensor::from_vec(xs.clone(), [n]);
    let runs = [
        ("eager", x.erf_inv()),
        (
            "jit (Cranelift)",
            jit(|x: Tensor| x.erf_inv()).call(x.clone()).expect("jit"),
        ),
        (
            "jit (interpreter)",
            jit(|x: Tensor| x.erf_inv())
                .backend(Backend::Interpreter)
                .call(x.clone())
                .expect("jit"),
        ),
    ];
    for (how, got) in runs {
        let got = bits_of(&got);
        let wrong: Vec<String> = (0..n)
            .filter(|&i| got[i] != want[i])
            .map(|i| {
                format!(
                    "erf_inv({:e}) = {:e} ({:08x}) vs JAX {:e} ({:08x})",
                    xs[i],
                    f32::from_bits(got[i]),
                    got[i],
                    f32::from_bits(want[i]),
                    want[i]
                )
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{how}: {} of {n} differ:\n{}",
            wrong.len(),
            wrong[..wrong.len().min(12)].join("\n")
        );
    }
}

/// `uniform` rounds `f * (hi - lo) + lo` once with the cheapest ops that can for its range; the
/// fixture ranges exercise all three ways (f32 ops, an exact f64 sum, the general fused
/// multiply-add from f64 ops).
#[test]
fn uniform_picks_the_cheapest_exact_rounding() {
    let ir = |lo: f32, hi: f32| {
        jit(move |k: Key| random::uniform(&k, [8], lo, hi))
            .lower(&Key::new(0))
            .expect("lower")
            .ir()
    };
    let power_of_two = ir(0.5, 0.75);
    assert!(!power_of_two.contains("f64"), "{power_of_two}");
    let exact_f64 = ir(-2.0, 3.0);
    assert!(
        exact_f64.contains("f64") && !exact_f64.contains("select"),
        "{exact_f64}"
    );
    let general = ir(2f32.powi(-100), 1.5);
    assert!(general.contains("select"), "{general}");
    let subnormal = ir(0.0, 2e-38);
    assert!(subnormal.contains("select"), "{subnormal}");
}

/// `fixtures/prng_seeds.json` (made by `fixtures/prng_seeds.py`): JAX's key words for seeds
/// past 32 bits and negative ones, in JAX's default mode (`Key::new`) and with x64
/// (`Key::new_x64`).
#[test]
fn keys_from_large_and_negative_seeds_are_jaxs() {
    let all: Value =
        serde_json::from_str(include_str!("fixtures/prng_seeds.json")).expect("valid JSON");
    let mut checked = 0;
    for (mode, make) in [("x32", Key::new as fn(i64) -> Key), ("x64", Key::new_x64)] {
        for case in all[mode].as_array().expect("cases") {
            let seed = case[0].as_i64().expect("seed");
            let want: Vec<u32> = case[1]
                .as_array()
                .expect("words")
                .iter()
                .map(|w| w.as_u64().expect("word") as u32)
                .collect();
            assert_eq!(
                make(seed).data().to_vec::<u32>(),
                want,
                "{mode} seed {seed}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 30);
}
