//! The elementwise functions, activations and reductions of `math.rs` and `nn.rs` against JAX
//! 0.10.2 (`fixtures/elementwise/make.py` writes the JSON: values at specials and domain edges,
//! gradients where the function is differentiable, all computed by JAX in f32), under jit on
//! both backends; and the compositions against an f64 reference over many inputs.

use serde_json::Value;
use tessera::prelude::*;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/elementwise/elementwise.json")).expect("JSON")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|b| f32::from_bits(b.as_u64().expect("u32 bits") as u32))
        .collect()
}

fn ulp(c: f32) -> f64 {
    let e = (c.to_bits() >> 23) & 0xff;
    2f64.powi(e.max(1) as i32 - 150)
}

/// The distance of `got` from `want` in ulps of `want` (0 for matching NaN/inf; infinite for a
/// wrong special); `abs` is an absolute slack (for results that cancel to near zero).
fn dist(got: f32, want: f32, abs: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if want.is_infinite() || got.is_infinite() {
        return if want == got { 0.0 } else { f64::INFINITY };
    }
    // XLA's CPU backend runs with flush-to-zero/denormals-are-zero, so JAX
    // returns 0 where the exact f32 result is subnormal; Tessera keeps
    // subnormals. A subnormal (or zero) result against JAX's flushed 0 is
    // the same value modulo FTZ. XLA's exp2 also flushes 2^-126, the smallest
    // normal (exact here), to 0: a result at most that small is accepted too.
    if want == 0.0 && got.abs() <= f32::MIN_POSITIVE {
        return 0.0;
    }
    let d = (got as f64 - want as f64).abs();
    if d <= abs {
        return 0.0;
    }
    d / ulp(want)
}

type F = fn(&Tensor) -> Tensor;

/// (fixture name, function, value bound in ulps of JAX's value, gradient bound, absolute
/// slack): the bounds cover Tessera's own error and JAX's (XLA:CPU's expansions of the
/// inverse and hyperbolic functions are a few ulp; compositions of several roundings more).
const UNARY: &[(&str, F, f64, f64, f64)] = &[
    ("tan", |x| x.tan(), 4.0, 8.0, 0.0),
    ("asin", |x| x.asin(), 4.0, 4.0, 0.0),
    ("acos", |x| x.acos(), 4.0, 4.0, 0.0),
    ("atan", |x| x.atan(), 4.0, 4.0, 0.0),
    // JAX (XLA CPU) is 5 ulp off the correctly rounded sinh(-30) and 13 ulp off sinh(50) = 2.5923527e21 that
    // Tessera returns (libm f64 rounded once): the bound is JAX's error, measured.
    ("sinh", |x| x.sinh(), 32.0, 32.0, 0.0),
    ("cosh", |x| x.cosh(), 32.0, 32.0, 0.0),
    ("asinh", |x| x.asinh(), 4.0, 4.0, 0.0),
    ("acosh", |x| x.acosh(), 4.0, 4.0, 0.0),
    ("atanh", |x| x.atanh(), 4.0, 4.0, 0.0),
    // exp2(-30) is 2^-30 exactly here; JAX (XLA CPU) is 8 ulp off it (measured).
    ("exp2", |x| x.exp2(), 16.0, 16.0, 0.0),
    ("log2", |x| x.log2(), 4.0, 4.0, 0.0),
    ("log10", |x| x.log10(), 4.0, 4.0, 0.0),
    ("reciprocal", |x| x.reciprocal(), 0.0, 1.0, 0.0),
    // At x = -3, 1 + tanh(..) cancels: Tessera and JAX are each ~1.5e-7 (absolute) off
    // the f64 derivative -0.0115841666 (measured), 2.8e-7 apart.
    ("gelu_tanh", |x| x.gelu(true), 8.0, 8.0, 5e-7),
    ("gelu_erf", |x| x.gelu(false), 8.0, 8.0, 1e-6),
    ("silu", |x| x.silu(), 6.0, 8.0, 1e-7),
    ("softplus", |x| x.softplus(), 6.0, 8.0, 1e-7),
    ("log_sigmoid", |x| x.log_sigmoid(), 6.0, 8.0, 1e-7),
    ("elu", |x| x.elu(1.0), 4.0, 4.0, 0.0),
    ("leaky_relu", |x| x.leaky_relu(0.01), 0.0, 0.0, 0.0),
    ("relu6", |x| x.relu6(), 0.0, 0.0, 0.0),
    ("hard_tanh", |x| x.hard_tanh(), 0.0, 0.0, 0.0),
    ("celu", |x| x.celu(1.0), 4.0, 4.0, 0.0),
    ("selu", |x| x.selu(), 4.0, 4.0, 0.0),
    ("clip", |x| x.clip(-1.0, 2.0), 0.0, 0.0, 0.0),
];

fn run1(f: F, xs: &[f32], backend: Backend, grad_of: bool) -> Vec<f32> {
    let x = Tensor::from_vec(xs.to_vec(), [xs.len()]);
    let out = if grad_of {
        jit(move |x: Tensor| grad(move |x: &Tensor| f(x).sum())(&x))
            .backend(backend)
            .call(x)
    } else {
        jit(move |x: Tensor| f(&x)).backend(backend).call(x)
    };
    out.expect("runs").to_vec::<f32>()
}

/// Checks `got` against `want` within `bound` ulps, returning the worst distance.
fn worst(what: &str, xs: &[f32], got: &[f32], want: &[f32], bound: f64, abs: f64) -> f64 {
    let mut w = 0.0f64;
    for i in 0..want.len() {
        // XLA's CPU backend reads a subnormal input as 0 (DAZ): JAX's result
        // there is f(0), not f(x); Tessera computes f(x).
        if xs[i].is_subnormal() {
            continue;
        }
        let d = dist(got[i], want[i], abs);
        assert!(
            d <= bound,
            "{what} at x = {:e}: got {:e}, JAX {:e} ({d} ulp > {bound})",
            xs[i],
            got[i],
            want[i]
        );
        w = w.max(d);
    }
    w
}

#[test]
fn unary_functions_match_jax_on_both_backends() {
    let all = fixture();
    for &(name, f, vb, gb, abs) in UNARY {
        let case = &all["unary"][name];
        assert!(case.is_object(), "{name} missing from the fixture");
        let (xs, ys) = (f32s(&case["x"]), f32s(&case["y"]));
        let (gx, gs) = (f32s(&case["gx"]), f32s(&case["g"]));
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let got = run1(f, &xs, backend, false);
            let v = worst(&format!("{name} {backend:?}"), &xs, &got, &ys, vb, abs);
            let got = run1(f, &gx, backend, true);
            let g = worst(&format!("{name}' {backend:?}"), &gx, &got, &gs, gb, abs);
            println!("{name:>12} {backend:?}: value {v:.2} ulp, gradient {g:.2} ulp");
        }
    }
}

#[test]
fn atan2_matches_jax_on_both_backends() {
    let all = fixture();
    let c = &all["atan2"];
    let (x, y, want) = (f32s(&c["x"]), f32s(&c["y"]), f32s(&c["out"]));
    let (gx, gy) = (f32s(&c["gx"]), f32s(&c["gy"]));
    let (dx, dy) = (f32s(&c["dx"]), f32s(&c["dy"]));
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), [v.len()]);
        let got = jit(|(a, b): (Tensor, Tensor)| a.atan2(&b))
            .backend(backend)
            .call((t(&x), t(&y)))
            .unwrap()
            .to_vec::<f32>();
        worst("atan2", &x, &got, &want, 2.0, 0.0);
        // Signed zeros and the quadrants exactly (C99 Annex F, as JAX).
        for i in 0..want.len() {
            if want[i] == 0.0 {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "atan2({}, {})",
                    x[i],
                    y[i]
                );
            }
        }
        let g = jit(|(a, b): (Tensor, Tensor)| {
            let f = |p: &Vec<Tensor>| p[0].atan2(&p[1]).sum();
            grad(f)(&vec![a, b])
        })
        .backend(backend)
        .call((t(&gx), t(&gy)))
        .unwrap();
        worst("atan2/dx", &gx, &g[0].to_vec::<f32>(), &dx, 4.0, 0.0);
        worst("atan2/dy", &gx, &g[1].to_vec::<f32>(), &dy, 4.0, 0.0);
    }
}

type R = fn(&Tensor) -> Tensor;

const REDUCTIONS: &[(&str, R, f64)] = &[
    ("prod", |a| a.prod_axes(-1), 8.0),
    ("var", |a| a.var_axes(-1, 0), 8.0),
    ("var_ddof1", |a| a.var_axes(-1, 1), 8.0),
    ("std", |a| a.std_axes(-1, 0), 8.0),
    ("norm", |a| a.norm_axes(-1), 8.0),
    ("norm1", |a| a.norm_ord(1.0, -1), 8.0),
    ("norm_inf", |a| a.norm_ord(f64::INFINITY, -1), 0.0),
    ("norm3", |a| a.norm_ord(3.0, -1), 8.0),
    ("logsumexp", |a| a.logsumexp(-1), 8.0),
];

#[test]
fn reductions_match_jax_on_both_backends() {
    let all = fixture();
    let m = f32s(&all["matrix"]);
    let w = [0.5f32, -1.0, 2.0];
    for &(name, f, bound) in REDUCTIONS {
        let c = &all["reductions"][name];
        let (want, want_g) = (f32s(&c["out"]), f32s(&c["grad"]));
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let a = Tensor::from_vec(m.clone(), [3, 7]);
            let (v, g) = jit(move |a: Tensor| {
                let wt = Tensor::from_vec(w.to_vec(), [3]);
                let loss = move |a: &Tensor| f(a).mul(&wt).sum();
                (f(&a), grad(loss)(&a))
            })
            .backend(backend)
            .call(a)
            .unwrap();
            let what = format!("{name} {backend:?}");
            worst(&what, &m, &v.to_vec::<f32>(), &want, bound, 0.0);
            let mut g = g.to_vec::<f32>();
            let mut want_g = want_g.clone();
            if name == "norm1" {
                // |x|' at 0: Tessera's VJP of abs is sign(x) (the subgradient
                // 0, as everywhere in tessera-autodiff); JAX's abs JVP is
                // select(x >= 0, 1, -1). Check ours is 0 there and compare
                // JAX elsewhere.
                for i in 0..m.len() {
                    if m[i] == 0.0 {
                        assert_eq!(g[i].abs(), 0.0, "norm1 grad at 0 ({backend:?})");
                        g[i] = 0.0;
                        want_g[i] = 0.0;
                    }
                }
            }
            worst(&format!("{what} grad"), &m, &g, &want_g, bound, 1e-7);
        }
    }
}

#[test]
fn argmin_any_all_match_jax() {
    let all = fixture();
    let c = &all["indexing"];
    let a = f32s(&c["a"]);
    let ints = |v: &Value| -> Vec<i32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i32)
            .collect()
    };
    let bools = |v: &Value| -> Vec<bool> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_bool().unwrap())
            .collect()
    };
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let t = Tensor::from_vec(a.clone(), [3, 4]);
        let (am, am0, any, al, al0) = jit(|a: Tensor| {
            (
                a.argmin(-1),
                a.argmin(0),
                a.any_axes(-1),
                a.all_axes(-1),
                a.all_axes(0),
            )
        })
        .backend(backend)
        .call(t)
        .unwrap();
        assert_eq!(am.to_vec::<i32>(), ints(&c["argmin"]), "{backend:?}");
        assert_eq!(am0.to_vec::<i32>(), ints(&c["argmin0"]), "{backend:?}");
        assert_eq!(any.to_vec::<bool>(), bools(&c["any"]), "{backend:?}");
        assert_eq!(al.to_vec::<bool>(), bools(&c["all"]), "{backend:?}");
        assert_eq!(al0.to_vec::<bool>(), bools(&c["all0"]), "{backend:?}");
    }
}

#[test]
fn integer_argmin_prod_and_empty_reductions() {
    let x = Tensor::from_vec(vec![3i32, i32::MIN, 7, i32::MIN, -2, 0], [2, 3]);
    assert_eq!(x.argmin(-1).to_vec::<i32>(), vec![1, 0]);
    let u = Tensor::from_vec(vec![5u32, u32::MAX, 0, 0], [4]);
    assert_eq!(u.argmin(0).to_vec::<i32>(), vec![2]);
    let p = Tensor::from_vec(vec![2i32, 3, 5, 7, 11], [5]);
    assert_eq!(p.prod().to_vec::<i32>(), vec![2310]);
    let e = Tensor::from_vec(Vec::<f32>::new(), [2, 0]);
    assert_eq!(e.prod_axes(-1).to_vec::<f32>(), vec![1.0, 1.0]);
    assert_eq!(e.any_axes(-1).to_vec::<bool>(), vec![false, false]);
    assert_eq!(e.all_axes(-1).to_vec::<bool>(), vec![true, true]);
    let b = Tensor::from_vec(vec![true, false, true, true], [2, 2]);
    assert_eq!(b.argmin(-1).to_vec::<i32>(), vec![1, 0]);
    assert_eq!(b.prod_axes(-1).to_vec::<i32>(), vec![0, 1]);
    let k = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    assert_eq!(k.prod_axes(keepdims(0)).shape(), &[1, 2]);
    assert_eq!(
        k.var_axes(keepdims(-1), 0).to_vec::<f32>(),
        vec![0.25, 0.25]
    );
    let f = Tensor::from_vec(vec![1.0f32, f32::NAN, f32::INFINITY, -f32::INFINITY], [4]);
    assert_eq!(f.isnan().to_vec::<bool>(), vec![false, true, false, false]);
    assert_eq!(f.isinf().to_vec::<bool>(), vec![false, false, true, true]);
    assert_eq!(
        f.isfinite().to_vec::<bool>(),
        vec![true, false, false, false]
    );
    assert_eq!(x.isfinite().to_vec::<bool>(), vec![true; 6]);
}

/// The compositions' stated error bounds (doc comments of `math.rs`), against f64 over
/// 20000 inputs per function, compiled.
#[test]
fn compositions_within_their_stated_bounds_of_f64() {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    };
    let xs: Vec<f32> = (0..20000)
        .map(|_| (2f64.powf(next() * 200.0 - 100.0)) as f32)
        .collect();
    type C = (&'static str, F, fn(f64) -> f64, f64);
    let cases: [C; 2] = [
        ("log2", |x| x.log2(), f64::log2, 2.0),
        ("log10", |x| x.log10(), f64::log10, 2.0),
    ];
    for (name, f, reference, bound) in cases {
        let got = run1(f, &xs, Backend::Cranelift, false);
        let mut w = 0.0f64;
        for (&x, &g) in xs.iter().zip(&got) {
            let want = reference(x as f64);
            let d = (g as f64 - want).abs() / ulp(want as f32);
            assert!(d <= bound, "{name}({x:e}) = {g:e}, f64 {want:e}: {d} ulp");
            w = w.max(d);
        }
        println!("{name}: max {w:.3} ulp against f64");
    }
}

#[test]
fn bad_operands_name_the_op_and_the_caller() {
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| i.tan()))
        .expect_err("tan of i32 must fail");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("tan"), "{msg}");
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| i.norm()))
        .expect_err("norm of i32 must fail");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains("norm") && msg.contains("elementwise.rs"),
        "{msg}"
    );
}
