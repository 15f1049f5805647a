//! i64, f16 and bf16 against JAX 0.10.2 (`fixtures/dtypes/make.py` writes the JSON): one jitted
//! op per case, on both backends. f16 and bf16 compute in f32 and round each op's result once,
//! so correctly rounded f32 ops give JAX's bits exactly; a transcendental function or an
//! order-dependent f32 sum may differ by one ulp of the narrow type. i64 wraps as JAX's does.

use serde_json::Value;
use tessera::ir::{bf16, f16};
use tessera::prelude::*;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/dtypes/dtypes.json")).expect("JSON")
}

fn dtype(name: &str) -> DType {
    DType::from_name(name).expect("a Tessera dtype")
}

/// A fixture array of `dtype`: bit patterns for f16, bf16 and f32, integers for i64, numbers
/// for f64.
fn tensor(v: &Value, dtype: DType, shape: &[usize]) -> Tensor {
    let a = v.as_array().expect("array");
    let shape = shape.to_vec();
    let bits = || a.iter().map(|b| b.as_u64().expect("16-bit pattern") as u16);
    match dtype {
        DType::F16 => Tensor::from_vec(bits().map(f16::from_bits).collect(), shape),
        DType::BF16 => Tensor::from_vec(bits().map(bf16::from_bits).collect(), shape),
        DType::I64 => Tensor::from_vec(a.iter().map(|x| x.as_i64().expect("i64")).collect(), shape),
        DType::F32 => Tensor::from_vec(
            a.iter()
                .map(|x| f32::from_bits(x.as_u64().expect("32-bit pattern") as u32))
                .collect(),
            shape,
        ),
        DType::F64 => Tensor::from_vec(a.iter().map(|x| x.as_f64().expect("f64")).collect(), shape),
        other => panic!("no fixture arrays of {other}"),
    }
}

/// Element `i` as (value, ulp of the narrow type at it, bits or the integer).
fn element(t: &Tensor, i: usize) -> (f64, f64, i128) {
    match t.dtype() {
        DType::F16 => {
            let x = t.to_vec::<f16>()[i];
            let e = ((x.to_bits() >> 10) & 0x1f).max(1) as i32;
            (x.to_f64(), 2f64.powi(e - 25), x.to_bits() as i128)
        }
        DType::BF16 => {
            let x = t.to_vec::<bf16>()[i];
            let e = ((x.to_bits() >> 7) & 0xff).max(1) as i32;
            (x.to_f64(), 2f64.powi(e - 134), x.to_bits() as i128)
        }
        DType::I64 => {
            let x = t.to_vec::<i64>()[i];
            (x as f64, 0.0, x as i128)
        }
        DType::F32 => {
            let x = t.to_vec::<f32>()[i];
            (x as f64, 0.0, x.to_bits() as i128)
        }
        other => panic!("no fixture results of {other}"),
    }
}

type Op1 = fn(&Tensor) -> Tensor;
type Op2 = fn(&Tensor, &Tensor) -> Tensor;

fn unary(name: &str) -> Option<Op1> {
    Some(match name {
        "sqrt" => |x| x.sqrt(),
        "exp" => |x| x.exp(),
        "log" => |x| x.log(),
        "tanh" => |x| x.tanh(),
        "sin" => |x| x.sin(),
        "to_f32" => |x| x.astype(DType::F32),
        "sum" => |x| {
            if x.dtype() == DType::I64 {
                x.sum().reshape([1])
            } else {
                x.sum_axes([1])
            }
        },
        _ => return None,
    })
}

fn binary(name: &str) -> Option<Op2> {
    Some(match name {
        "add" => |a, b| a + b,
        "sub" => |a, b| a - b,
        "mul" => |a, b| a * b,
        "div" => |a, b| a / b,
        "max" => |a, b| a.maximum(b),
        "floor_divide" => |a, b| a.floor_divide(b),
        "dot" => |a, b| a.matmul(b),
        _ => return None,
    })
}

#[test]
fn i64_f16_and_bf16_ops_match_jax() {
    let fx = fixture();
    let cases = fx["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 37, "regenerate with make.py");
    let mut failures = Vec::new();
    for c in cases {
        let name = c["name"].as_str().expect("name");
        let dt = dtype(c["dtype"].as_str().expect("dtype"));
        let out_dt = dtype(c["out_dtype"].as_str().expect("out_dtype"));
        let exact = c["exact"].as_bool().expect("exact");
        let ins = c["inputs"].as_array().expect("inputs");
        // Inputs are the op's dtype, except the conversions' from f32 and f64.
        let in_dt = match name {
            "from_f32" => DType::F32,
            "from_f64" => DType::F64,
            _ => dt,
        };
        let n_in = ins[0].as_array().expect("input").len();
        let in_shape: Vec<usize> = match name {
            "sum" if dt != DType::I64 => vec![8, 8],
            "dot" => vec![8, 8],
            _ => vec![n_in],
        };
        let args: Vec<Tensor> = ins.iter().map(|v| tensor(v, in_dt, &in_shape)).collect();
        let want_shape: Vec<usize> = c["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let want = tensor(&c["out"], out_dt, &want_shape);
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let got = if let Some(f) = unary(name) {
                jit(move |x: Tensor| f(&x))
                    .backend(backend)
                    .call(args[0].clone())
            } else if let Some(f) = binary(name) {
                jit(move |(a, b): (Tensor, Tensor)| f(&a, &b))
                    .backend(backend)
                    .call((args[0].clone(), args[1].clone()))
            } else {
                let to = dt;
                jit(move |x: Tensor| x.astype(to))
                    .backend(backend)
                    .call(args[0].clone())
            }
            .expect("runs");
            if got.dtype() != out_dt || got.shape() != want.shape() {
                failures.push(format!(
                    "{name} {dt} {backend:?}: {} {:?}, JAX {out_dt} {:?}",
                    got.dtype(),
                    got.shape(),
                    want.shape()
                ));
                continue;
            }
            for i in 0..want_shape.iter().product() {
                let (g, ulp, gb) = element(&got, i);
                let (w, _, wb) = element(&want, i);
                let same = gb == wb || (g.is_nan() && w.is_nan());
                let near = !exact && (g - w).abs() <= ulp;
                if !same && !near {
                    failures.push(format!(
                        "{name} {dt} {backend:?} element {i}: {g} ({gb:#x}), JAX {w} ({wb:#x})"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Narrow floats are storage: every op computes in f32 and rounds its result once, so a chain
/// rounds after each op (not once at the end), the same on both backends and in eager mode.
#[test]
fn each_narrow_op_rounds_its_result() {
    // 1 + 2^-11 is not a bf16 or an f16: (x + tiny) - x is 0 after rounding, not tiny.
    let x = Tensor::from_vec(vec![f16::from_f32(1.0); 4], [4]);
    let tiny = Tensor::from_vec(vec![f16::from_f32(2f32.powi(-12)); 4], [4]);
    let f = |(a, b): (Tensor, Tensor)| (&a + &b) - &a;
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let got = jit(f)
            .backend(backend)
            .call((x.clone(), tiny.clone()))
            .expect("runs");
        assert_eq!(got.dtype(), DType::F16);
        assert_eq!(got.to_vec::<f16>(), vec![f16::ZERO; 4], "{backend:?}");
    }
    assert_eq!(f((x, tiny)).to_vec::<f16>(), vec![f16::ZERO; 4]);
}

/// The promotion of the new dtypes in ops: a weak Rust number takes the narrow type, f16 and
/// bf16 meet at f32, an i64 keeps 64 bits with an f32 float... as `result_type` says.
#[test]
fn new_dtypes_promote_in_ops() {
    let h = Tensor::from_vec(vec![f16::from_f32(1.5); 2], [2]);
    let b = Tensor::from_vec(vec![bf16::from_f32(2.0); 2], [2]);
    let l = Tensor::from_vec(vec![3i64, 1 << 40], [2]);
    assert_eq!((&h * 2.0).dtype(), DType::F16);
    assert_eq!((&h * 2.0).to_vec::<f16>(), vec![f16::from_f32(3.0); 2]);
    assert_eq!((&h + &b).dtype(), DType::F32);
    assert_eq!((&b + 1).dtype(), DType::BF16);
    assert_eq!((&l + 1).to_vec::<i64>(), vec![4, (1 << 40) + 1]);
    assert_eq!((&l * 0.5).dtype(), DType::F64);
    assert_eq!((&l / &l).dtype(), DType::F64);
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    assert_eq!((&i + &l).dtype(), DType::I64);
    assert_eq!((&h + &i).dtype(), DType::F16);
    assert_eq!(l.astype(DType::F16).to_vec::<f16>()[1], f16::INFINITY);
}

/// Gradients flow through f16 and bf16 like through f32, computed in f32 and rounded per op.
#[test]
fn gradients_of_narrow_floats_match_the_f32_gradient_rounded() {
    for dt in [DType::F16, DType::BF16] {
        let xs = [0.5f32, -1.25, 2.0, 3.0];
        let x = Tensor::from_vec(xs.to_vec(), [4]).astype(dt);
        let f = |x: &Tensor| (x * x).sum();
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let g = jit(move |x: Tensor| grad(f)(&x))
                .backend(backend)
                .call(x.clone())
                .expect("runs");
            assert_eq!(g.dtype(), dt);
            let got = g.astype(DType::F32).to_vec::<f32>();
            let want: Vec<f32> = xs.iter().map(|x| 2.0 * x).collect();
            assert_eq!(got, want, "{dt} {backend:?}");
        }
    }
}
