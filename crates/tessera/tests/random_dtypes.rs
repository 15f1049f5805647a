//! The `*_dtype` distributions in f16 and bf16 and `randint` in i64 against JAX 0.10.2
//! (`fixtures/random/dtypes.json`, made by `fixtures/random/make_dtypes.py`), bit for bit,
//! eagerly and under `jit` on both backends. Ranges include spans past 2^32 and 2^63, an empty
//! one, and a reversed one (JAX returns `minval`).

use serde_json::Value;
use tessera::ir::Shape;
use tessera::random::{
    Key, bernoulli, categorical, exponential_dtype, gumbel_dtype, laplace_dtype, logistic_dtype,
    normal_dtype, randint, truncated_normal_dtype, uniform_dtype,
};
use tessera::{Backend, DType, Tensor, jit};

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/random/dtypes.json")).expect("valid JSON")
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("dims")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

fn dtype(name: &str) -> DType {
    match name {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "i64" => DType::I64,
        "i32" => DType::I32,
        "bool" => DType::Bool,
        other => panic!("dtype {other}"),
    }
}

/// The f32 value of an f16 or bf16 bit pattern (exact: both widen to f32 without rounding).
fn widen(bits: u16, dt: DType) -> f32 {
    match dt {
        DType::BF16 => f32::from_bits(u32::from(bits) << 16),
        _ => {
            let sign = u32::from(bits >> 15) << 31;
            let (exp, mant) = (u32::from(bits >> 10) & 0x1f, u32::from(bits) & 0x3ff);
            let mag = match exp {
                0 => mant as f32 * 2f32.powi(-24),
                0x1f if mant == 0 => f32::INFINITY,
                0x1f => f32::NAN,
                e => f32::from_bits(((e + 112) << 23) | (mant << 13)),
            };
            f32::from_bits(mag.to_bits() | sign)
        }
    }
}

/// Each element as a comparable integer: f16/bf16 as the bits of their exact f32 value.
fn got_words(t: &Tensor) -> Vec<i64> {
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>(),
        DType::I32 => t.to_vec::<i32>().into_iter().map(i64::from).collect(),
        DType::Bool => t.to_vec::<bool>().into_iter().map(i64::from).collect(),
        _ => t
            .astype(DType::F32)
            .to_vec::<f32>()
            .iter()
            .map(|v| i64::from(v.to_bits()))
            .collect(),
    }
}

fn want_words(out: &Value, dt: DType) -> Vec<i64> {
    match dt {
        DType::I64 | DType::I32 | DType::Bool => out["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_i64().expect("i64"))
            .collect(),
        _ => out["bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|v| i64::from(widen(v.as_u64().expect("bits") as u16, dt).to_bits()))
            .collect(),
    }
}

type Draw = Box<dyn Fn(&Key) -> Tensor>;

/// The f32 values of a JSON list (nested lists flattened) as a tensor of `dt` and `shape`.
fn param(v: &Value, shape: Vec<usize>, dt: DType) -> Tensor {
    let flat: Vec<f32> = v
        .as_array()
        .expect("list")
        .iter()
        .flat_map(|x| match x.as_array() {
            Some(row) => row.iter().map(|y| y.as_f64().unwrap() as f32).collect(),
            None => vec![x.as_f64().unwrap() as f32],
        })
        .collect();
    Tensor::from_vec(flat, shape).astype(dt)
}

fn draw_fn(name: &str, p: &Value) -> Draw {
    let dt = dtype(p["dtype"].as_str().expect("dtype"));
    match name {
        "bernoulli" => {
            let (shape, prob) = (dims(&p["shape"]), param(&p["p"], vec![3], dt));
            return Box::new(move |k| bernoulli(k, &prob, shape.clone()));
        }
        "categorical" => {
            let logits = param(&p["logits"], vec![2, 3], dt);
            let shape = p["shape"].as_array().map(|_| Shape::new(dims(&p["shape"])));
            return Box::new(move |k| categorical(k, &logits, -1, shape.clone()));
        }
        _ => {}
    }
    let shape = dims(&p["shape"]);
    match name {
        "uniform" => {
            let (lo, hi) = (p["minval"].as_f64().unwrap(), p["maxval"].as_f64().unwrap());
            Box::new(move |k| uniform_dtype(k, shape.clone(), dt, lo, hi))
        }
        "normal" => Box::new(move |k| normal_dtype(k, shape.clone(), dt)),
        "gumbel" => Box::new(move |k| gumbel_dtype(k, shape.clone(), dt)),
        "exponential" => Box::new(move |k| exponential_dtype(k, shape.clone(), dt)),
        "laplace" => Box::new(move |k| laplace_dtype(k, shape.clone(), dt)),
        "logistic" => Box::new(move |k| logistic_dtype(k, shape.clone(), dt)),
        "truncated_normal" => {
            let (lo, hi) = (p["lower"].as_f64().unwrap(), p["upper"].as_f64().unwrap());
            Box::new(move |k| truncated_normal_dtype(k, lo as f32, hi as f32, shape.clone(), dt))
        }
        "randint" => {
            let (lo, hi) = (p["minval"].as_i64().unwrap(), p["maxval"].as_i64().unwrap());
            Box::new(move |k| randint(k, shape.clone(), lo, hi, dt))
        }
        other => panic!("draw {other}"),
    }
}

fn check(how: &str, run: impl Fn(&dyn Fn(&Key) -> Tensor, &Key) -> Tensor) {
    let fx = fixture();
    let draws = fx["draws"].as_array().expect("draws");
    assert!(draws.len() >= 780, "{} draws", draws.len());
    let (mut total, mut wrong, mut report) = (0usize, 0usize, Vec::new());
    for d in draws {
        let name = d["name"].as_str().unwrap();
        let f = draw_fn(name, &d["params"]);
        let w: Vec<u32> = d["key"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let t = run(&*f, &Key::from_words(w[0], w[1]));
        let what = format!("{how} {name} key {w:?} {}", d["params"]);
        let dt = dtype(d["out"]["dtype"].as_str().unwrap());
        assert_eq!(t.shape(), &dims(&d["out"]["shape"])[..], "{what}: shape");
        assert_eq!(t.dtype(), dt, "{what}: dtype");
        let (g, e) = (got_words(&t), want_words(&d["out"], dt));
        total += e.len();
        for (i, (a, b)) in g.iter().zip(&e).enumerate() {
            if a != b {
                wrong += 1;
                if report.len() < 12 {
                    report.push(format!("  {what} [{i}]: {a:#x} vs JAX {b:#x}"));
                }
            }
        }
    }
    assert!(total > 10_000, "the fixture has {total} values");
    assert!(
        wrong == 0,
        "{wrong} of {total} values differ from JAX:\n{}",
        report.join("\n")
    );
}

#[test]
fn narrow_floats_and_i64_are_bit_exact_eagerly() {
    check("eager", |f, k| f(k));
}

#[test]
fn narrow_floats_and_i64_are_bit_exact_under_jit() {
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        check(&format!("{backend:?}"), |f, k| {
            jit(|k: Key| f(&k))
                .backend(backend)
                .call(k.clone())
                .expect("jit")
        });
    }
}

#[test]
fn other_dtypes_are_errors_naming_the_draw() {
    for (what, r) in [
        (
            "uniform",
            std::panic::catch_unwind(|| uniform_dtype(&Key::new(0), [2], DType::I32, 0.0, 1.0)),
        ),
        (
            "normal",
            std::panic::catch_unwind(|| normal_dtype(&Key::new(0), [2], DType::F64)),
        ),
        (
            "randint",
            std::panic::catch_unwind(|| randint(&Key::new(0), [2], 0, 3, DType::F16)),
        ),
    ] {
        let e = r.expect_err(what);
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(
            msg.contains(what) && msg.contains("dtype must be"),
            "{what}: {msg}"
        );
    }
}
