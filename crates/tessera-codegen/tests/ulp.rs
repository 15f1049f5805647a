//! Whole-range accuracy of the compiled f32 functions: every binade of both signs (2000
//! random mantissas each, subnormals included) plus the specials, against a correctly rounded
//! f64 reference (computed in f64, rounded to f32). Errors are in ulps of the correctly
//! rounded result; each must stay within the bound `approx.rs` states. Specials (NaN, +-0,
//! +-inf, overflow to inf, underflow to 0) must match the reference exactly. Set
//! `APPROX_REPORT=1` to print the measured maxima without asserting.

#[path = "support/elementwise.rs"]
mod support;
use support::compiled;
use tessera_interp::SingleDevice;
use tessera_ir::{BinaryOp, DType, Data, Graph, Literal, Op, TensorType, UnaryOp};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

const SPECIALS: [f32; 16] = [
    0.0,
    -0.0,
    f32::from_bits(1),
    -f32::from_bits(1),
    f32::MIN_POSITIVE,
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.5,
    -2.5,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::MAX,
    -f32::MAX,
];

/// Every binade (biased exponent 0..=254, so subnormals too) of both signs, `per` random
/// mantissas each, then the specials.
fn sweep(per: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut xs = Vec::with_capacity(255 * 2 * per + SPECIALS.len());
    for sign in [0u32, 1] {
        for e in 0..=254u32 {
            for _ in 0..per {
                let m = (rng.next() >> 41) as u32 & 0x007f_ffff;
                xs.push(f32::from_bits((sign << 31) | (e << 23) | m));
            }
        }
    }
    xs.extend_from_slice(&SPECIALS);
    xs
}

/// The spacing of f32 at `c` (an f32 value): 2^-149 for zero and subnormals.
fn ulp(c: f32) -> f64 {
    let e = (c.to_bits() >> 23) & 0xff;
    2f64.powi(e.max(1) as i32 - 150)
}

/// The error of `got` against the exact value `want` (in f64), in ulps of `want` rounded to
/// f32; infinite for a wrong special (NaN, infinity, a zero where the reference is not, or a
/// zero of the wrong sign).
fn ulps(got: f32, want: f64) -> f64 {
    let cr = want as f32;
    if cr.is_nan() || got.is_nan() {
        return if cr.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if cr.is_infinite() || got.is_infinite() {
        return if cr == got { 0.0 } else { f64::INFINITY };
    }
    // Zero (underflow included) is a special: exactly where the reference rounds to zero,
    // with its sign.
    if (cr == 0.0 || got == 0.0) && cr.to_bits() != got.to_bits() {
        return f64::INFINITY;
    }
    (got as f64 - want).abs() / ulp(cr)
}

/// `(worst ulps, input at the worst)` of compiled `op` against `reference` on `xs`.
fn worst(op: UnaryOp, xs: &[f32], reference: fn(f64) -> f64) -> (f64, f32, f32) {
    let got = compiled(Op::Unary(op), &[xs.to_vec()]);
    let mut w = (0.0, 0.0f32, 0.0f32);
    for (&x, &g) in xs.iter().zip(&got) {
        let e = ulps(g, reference(x as f64));
        if e > w.0 || e.is_nan() {
            w = (e, x, g);
        }
    }
    w
}

fn logistic(x: f64) -> f64 {
    let e = (-x.abs()).exp();
    if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

fn rsqrt(x: f64) -> f64 {
    1.0 / x.sqrt()
}

/// (op, f64 reference, stated bound in ulps with a native FMA, and without): the table of
/// `approx.rs`. `TESSERA_NO_FMA=1` measures the second on an FMA host.
type Bound = (UnaryOp, fn(f64) -> f64, f64, f64);

const BOUNDS: [Bound; 21] = [
    (UnaryOp::Exp, f64::exp, 1.0, 1.5),
    (UnaryOp::Log, f64::ln, 1.0, 1.0),
    (UnaryOp::Log1p, f64::ln_1p, 2.0, 2.0),
    (UnaryOp::Expm1, f64::exp_m1, 2.0, 2.0),
    (UnaryOp::Tanh, f64::tanh, 1.5, 1.5),
    (UnaryOp::Logistic, logistic, 2.0, 2.5),
    (UnaryOp::Sin, f64::sin, 1.5, 1.5),
    (UnaryOp::Cos, f64::cos, 1.5, 1.5),
    (UnaryOp::Erf, libm::erf, 1.5, 1.5),
    (UnaryOp::Sqrt, f64::sqrt, 0.5, 0.5),
    (UnaryOp::Rsqrt, rsqrt, 1.5, 1.5),
    // libm (musl) in f64 rounded once, against Rust std's f64 functions (glibc's for most):
    // 0.5 ulp plus the two f64 errors.
    (UnaryOp::Tan, f64::tan, 0.501, 0.501),
    (UnaryOp::Asin, f64::asin, 0.501, 0.501),
    (UnaryOp::Acos, f64::acos, 0.501, 0.501),
    (UnaryOp::Atan, f64::atan, 0.501, 0.501),
    (UnaryOp::Sinh, f64::sinh, 0.501, 0.501),
    (UnaryOp::Cosh, f64::cosh, 0.501, 0.501),
    (UnaryOp::Asinh, f64::asinh, 0.501, 0.501),
    (UnaryOp::Acosh, f64::acosh, 0.501, 0.501),
    (UnaryOp::Atanh, f64::atanh, 0.501, 0.501),
    (UnaryOp::Exp2, f64::exp2, 0.501, 0.501),
];

/// The bound that applies to this host's code.
fn stated(b: &Bound) -> f64 {
    if tessera_codegen::lower::host_has_fma() {
        b.2
    } else {
        b.3
    }
}

#[test]
fn every_binade_within_the_stated_bound() {
    let xs = sweep(2000, 0x9e37_79b9_7f4a_7c15);
    let report_only = std::env::var_os("APPROX_REPORT").is_some();
    let mut failures = Vec::new();
    for b in BOUNDS {
        let (op, reference, bound) = (b.0, b.1, stated(&b));
        let (e, at, got) = worst(op, &xs, reference);
        let line = format!(
            "{:>9}: max {e:.3} ulp at x = {at:e} (got {got:e}, want {:e}), bound {bound}",
            op.name(),
            reference(at as f64) as f32
        );
        println!("{line}");
        if e > bound {
            failures.push(line);
        }
    }
    assert!(report_only || failures.is_empty(), "{failures:#?}");
}

fn bound_of(op: UnaryOp) -> f64 {
    BOUNDS.iter().find(|b| b.0 == op).map(stated).unwrap()
}

/// Asserts every compiled `op(x)` within the stated bound of the reference.
fn assert_within(op: UnaryOp, xs: &[f32], reference: fn(f64) -> f64) {
    let bound = bound_of(op);
    let got = compiled(Op::Unary(op), &[xs.to_vec()]);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = reference(x as f64);
        let e = ulps(g, want);
        assert!(
            e <= bound,
            "{}({x:e}) = {g:e}, want {:e}: {e:.2} ulp > {bound}",
            op.name(),
            want as f32
        );
    }
}

/// Issue 10: sin(3e9) was 6.6e14, and 3097 of 4096 random |x| <= 1e9 fell outside [-1, 1].
#[test]
fn sin_cos_of_large_arguments() {
    let mut rng = Rng(42);
    let mut xs: Vec<f32> = (0..4096)
        .map(|_| ((rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2e9 - 1e9) as f32)
        .collect();
    xs.extend([
        3e9,
        -3e9,
        1e30,
        -1e30,
        f32::MAX,
        8192.0,
        8192.001,
        1e8,
        1.5e38,
    ]);
    for op in [UnaryOp::Sin, UnaryOp::Cos] {
        let reference = if op == UnaryOp::Sin {
            f64::sin
        } else {
            f64::cos
        };
        assert_within(op, &xs, reference);
        let got = compiled(Op::Unary(op), std::slice::from_ref(&xs));
        assert!(got.iter().all(|v| (-1.0..=1.0).contains(v)));
    }
    let s = compiled(Op::Unary(UnaryOp::Sin), &[vec![3e9]])[0];
    assert_eq!(s, (3e9f64).sin() as f32);
}

/// The inline path's hard cases: the floats nearest to multiples of pi/2 (and their
/// neighbours) up to the inline limit, where the reduced argument is tiny and the reduction's
/// error would show.
#[test]
fn sin_cos_near_multiples_of_half_pi() {
    let mut xs = Vec::new();
    let mut j = 1.0f64;
    while j * std::f64::consts::FRAC_PI_2 < 8192.0 * 1.01 {
        let c = (j * std::f64::consts::FRAC_PI_2) as f32;
        for d in -2i32..=2 {
            xs.push(f32::from_bits((c.to_bits() as i32 + d) as u32));
        }
        j += 1.0;
    }
    let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(neg);
    assert_within(UnaryOp::Sin, &xs, f64::sin);
    assert_within(UnaryOp::Cos, &xs, f64::cos);
}

/// Issue 10: exp on [88.38, 88.72] was up to 28% low; the subnormal results
/// (x in [-103.97, -87.34]) were flushed to 0.
#[test]
fn exp_near_overflow_and_into_the_subnormals() {
    let dense = |lo: f64, hi: f64| -> Vec<f32> {
        (0..20_001)
            .map(|i| (lo + (hi - lo) * i as f64 / 20_000.0) as f32)
            .collect()
    };
    assert_within(UnaryOp::Exp, &dense(88.38, 88.8), f64::exp);
    assert_within(UnaryOp::Exp, &dense(-104.5, -87.0), f64::exp);
    let got = compiled(
        Op::Unary(UnaryOp::Exp),
        &[vec![88.72283, 88.7229, -88.5, -103.0, -104.0, f32::NAN]],
    );
    assert_eq!(got[0], (88.72283f32 as f64).exp() as f32);
    assert!(got[0].is_finite() && got[1] == f32::INFINITY);
    assert!(got[2] > 0.0 && got[2] < f32::MIN_POSITIVE && got[3] > 0.0);
    assert!(got[4] == 0.0 && got[5].is_nan());
}

/// Issue 10: log1p(inf) was NaN, expm1(88.7) was inf; expm1(-inf) = -1.
#[test]
fn log1p_and_expm1_at_the_ends() {
    let l = compiled(
        Op::Unary(UnaryOp::Log1p),
        &[vec![f32::INFINITY, -1.0, -2.0, f32::MAX, -0.0, 1e-40]],
    );
    assert_eq!(l[0], f32::INFINITY);
    assert_eq!(l[1], f32::NEG_INFINITY);
    assert!(l[2].is_nan());
    assert_eq!(l[3], (f32::MAX as f64).ln_1p() as f32);
    assert!(l[4] == 0.0 && l[4].is_sign_negative());
    assert_eq!(l[5], 1e-40);
    let e = compiled(
        Op::Unary(UnaryOp::Expm1),
        &[vec![88.7, 88.72, 88.8, f32::NEG_INFINITY, -0.0, 1e-40]],
    );
    assert!(e[0].is_finite() && ulps(e[0], (88.7f32 as f64).exp_m1()) <= bound_of(UnaryOp::Expm1));
    assert!(e[1].is_finite() && e[2] == f32::INFINITY);
    assert_eq!(e[3], -1.0);
    assert!(e[4] == 0.0 && e[4].is_sign_negative());
    assert_eq!(e[5], 1e-40);
}

/// Issue 10: pow(f32::MAX, 1) was 2.406e38, and the C99 Annex F special cases were wrong.
/// Scalar and vector code (the pairs run in a [n >= 8] kernel and one by one).
#[test]
fn pow_special_cases_follow_c99_annex_f() {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    let cases: Vec<(f32, f32, f32)> = vec![
        (f32::MAX, 1.0, f32::MAX),
        (-inf, 0.5, inf),
        (-1.0, inf, 1.0),
        (-1.0, -inf, 1.0),
        (-0.0, -1.0, -inf),
        (0.0, -1.0, inf),
        (-0.0, -2.0, inf),
        (-0.0, 3.0, -0.0),
        (-0.0, 0.5, 0.0),
        (nan, 0.0, 1.0),
        (nan, -0.0, 1.0),
        (1.0, nan, 1.0),
        (1.0, inf, 1.0),
        (-2.0, 0.5, nan),
        (-8.0, 1.0 / 3.0, nan),
        (-2.0, 3.0, -8.0),
        (-inf, -1.0, -0.0),
        (-inf, 3.0, -inf),
        (-inf, 2.0, inf),
        (0.5, inf, 0.0),
        (2.0, -inf, 0.0),
        (0.5, -inf, inf),
        (2.0, -149.0, f32::from_bits(1)),
        (f32::from_bits(1), 1.0, f32::from_bits(1)),
        (f32::from_bits(2), 0.5, 2f32.powi(-74)),
        (2.0, 128.0, inf),
        (nan, 1.0, nan),
        (2.0, nan, nan),
    ];
    let xs: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let ys: Vec<f32> = cases.iter().map(|c| c.1).collect();
    let vector = compiled(Op::Binary(BinaryOp::Pow), &[xs.clone(), ys.clone()]);
    for (i, &(x, y, want)) in cases.iter().enumerate() {
        let scalar = compiled(Op::Binary(BinaryOp::Pow), &[vec![x], vec![y]])[0];
        for got in [vector[i], scalar] {
            let ok = (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits();
            assert!(ok, "pow({x:e}, {y:e}) = {got:e}, want {want:e}");
        }
    }
}

/// Every f32 in `(0, 2 * SIN_COS_INLINE_LIMIT]` through compiled `sin` and `cos` (both signs
/// follow by symmetry of the code): the inline path and the first binade of the call. Slow
/// (about 10^9 evaluations): run by hand with `--ignored`.
#[test]
#[ignore]
fn sin_cos_exhaustive_over_the_inline_range() {
    let limit = 2.0 * tessera_codegen::approx::SIN_COS_INLINE_LIMIT;
    let chunk = 1 << 22;
    for (op, reference) in [
        (UnaryOp::Sin, f64::sin as fn(f64) -> f64),
        (UnaryOp::Cos, f64::cos),
    ] {
        let mut g = Graph::new("exhaustive");
        let p = g.add_param(TensorType::new(DType::F32, vec![chunk]));
        let y = g.add(Op::Unary(op), &[p]).unwrap();
        g.set_outputs(vec![y]);
        let exe = tessera_codegen::compile(&g).unwrap();
        let mut w = (0.0f64, 0.0f32);
        let mut bits = 1u32;
        while f32::from_bits(bits) <= limit {
            let xs: Vec<f32> = (0..chunk as u32)
                .map(|k| f32::from_bits(bits + k))
                .collect();
            bits += chunk as u32;
            let lit = Literal::new([chunk], Data::F32(xs.clone())).unwrap();
            let out = exe.run(&[&lit], &SingleDevice).unwrap();
            let Data::F32(got) = &out[0].data else {
                panic!("f32 result expected")
            };
            for (&x, &g) in xs.iter().zip(got) {
                let e = ulps(g, reference(x as f64));
                if e > w.0 {
                    w = (e, x);
                }
            }
        }
        println!("{}: max {:.3} ulp at {:e}", op.name(), w.0, w.1);
        assert!(w.0 <= bound_of(op), "{}: {w:?}", op.name());
    }
}

/// The interpreter's f32 functions (Rust std, i.e. the platform libm, and `libm::erff`) on the
/// same sweep, against the same reference: the oracle's own error, in ulps.
const INTERPRETER_BOUNDS: [(UnaryOp, f64); 11] = [
    (UnaryOp::Exp, 1.0),
    (UnaryOp::Log, 1.0),
    (UnaryOp::Log1p, 1.0),
    (UnaryOp::Expm1, 1.0),
    (UnaryOp::Tanh, 2.5),
    (UnaryOp::Logistic, 2.5),
    (UnaryOp::Sin, 1.0),
    (UnaryOp::Cos, 1.0),
    (UnaryOp::Erf, 1.5),
    (UnaryOp::Sqrt, 0.5),
    (UnaryOp::Rsqrt, 1.5),
];

#[test]
fn interpreter_functions_within_their_bounds() {
    use tessera_interp::scalar::Float;
    let xs = sweep(2000, 0x2545_f491_4f6c_dd1d);
    let report_only = std::env::var_os("APPROX_REPORT").is_some();
    let mut failures = Vec::new();
    for (b, (op, bound)) in BOUNDS.iter().zip(INTERPRETER_BOUNDS) {
        assert_eq!(b.0, op);
        let mut w = (0.0, 0.0f32, 0.0f32);
        for &x in &xs {
            let g = <f32 as Float>::unary(op, x);
            let e = ulps(g, (b.1)(x as f64));
            if e > w.0 {
                w = (e, x, g);
            }
        }
        let line = format!(
            "interpreter {:>9}: max {:.3} ulp at x = {:e} (got {:e}), bound {bound}",
            op.name(),
            w.0,
            w.1,
            w.2
        );
        println!("{line}");
        if w.0 > bound {
            failures.push(line);
        }
    }
    assert!(report_only || failures.is_empty(), "{failures:#?}");
}

/// The calls (sin/cos past the inline limit, pow) inside fused kernels and reductions: the
/// vectorized accumulation over an outer dimension, a scalar reduction to rank 0 (wide f32
/// sum) and an elementwise chain, all against the interpreter.
#[test]
fn calls_inside_fused_kernels_and_reductions() {
    use tessera_ir::ReduceKind;
    let mut rng = Rng(7);
    let xs: Vec<f32> = (0..3 * 37)
        .map(|i| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            // Mixed lanes: some inline, some past the limit.
            if i % 3 == 0 {
                u * 10.0
            } else {
                (u - 0.5) * 2e7
            }
        } as f32)
        .collect();
    let ys: Vec<f32> = (0..3 * 37).map(|i| 0.5 + (i % 5) as f32).collect();
    for (axes, dims_out) in [(vec![0usize], vec![37usize]), (vec![0, 1], vec![])] {
        let mut g = Graph::new("fused");
        let p = g.add_param(TensorType::new(DType::F32, vec![3, 37]));
        let q = g.add_param(TensorType::new(DType::F32, vec![3, 37]));
        let s = g.add(Op::Unary(UnaryOp::Sin), &[p]).unwrap();
        let c = g.add(Op::Unary(UnaryOp::Cos), &[p]).unwrap();
        let a = g.add(Op::Unary(UnaryOp::Abs), &[p]).unwrap();
        let w = g.add(Op::Binary(BinaryOp::Pow), &[a, q]).unwrap();
        let sc = g.add(Op::Binary(BinaryOp::Mul), &[s, c]).unwrap();
        let t = g.add(Op::Binary(BinaryOp::Add), &[sc, s]).unwrap();
        let r = g
            .add(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: axes.clone(),
                },
                &[t],
            )
            .unwrap();
        let rw = g
            .add(
                Op::Reduce {
                    kind: ReduceKind::Max,
                    axes,
                },
                &[w],
            )
            .unwrap();
        g.set_outputs(vec![r, rw, t]);
        let lits = [
            Literal::new([3, 37], Data::F32(xs.clone())).unwrap(),
            Literal::new([3, 37], Data::F32(ys.clone())).unwrap(),
        ];
        let want = tessera_interp::run(&g, &lits).unwrap();
        let exe = tessera_codegen::compile(&g).unwrap();
        let refs: Vec<&Literal> = lits.iter().collect();
        let got = exe.run(&refs, &SingleDevice).unwrap();
        assert_eq!(got[0].ty.dims(), &dims_out[..]);
        for (w, g) in want.iter().zip(&got) {
            let (Data::F32(w), Data::F32(g)) = (&w.data, &g.data) else {
                panic!("f32 results expected")
            };
            for (a, b) in w.iter().zip(g) {
                // A few ulps of terms of magnitude <= 2 (sums of three), and pow bit for bit.
                let tol = 1e-6 * a.abs().max(2.0);
                assert!((a - b).abs() <= tol, "interpreter {a:e}, compiled {b:e}");
            }
        }
    }
}

/// Every one of the 2^32 f32 inputs through the compiled functions named in `ULP_EXHAUSTIVE`
/// (comma separated, e.g. `exp,log`; default all but sin/cos, which have their own exhaustive
/// test), against the stated bounds. Minutes per function: run by hand with `--ignored`.
#[test]
#[ignore]
fn every_f32_within_the_stated_bound() {
    let wanted = std::env::var("ULP_EXHAUSTIVE")
        .unwrap_or_else(|_| "exp,log,log1p,expm1,tanh,logistic,erf,sqrt,rsqrt".into());
    let chunk = 1usize << 22;
    let mut failures = Vec::new();
    for b in BOUNDS {
        let (op, reference, bound) = (b.0, b.1, stated(&b));
        if !wanted.split(',').any(|w| w == op.name()) {
            continue;
        }
        let mut g = Graph::new("exhaustive");
        let p = g.add_param(TensorType::new(DType::F32, vec![chunk]));
        let y = g.add(Op::Unary(op), &[p]).unwrap();
        g.set_outputs(vec![y]);
        let exe = tessera_codegen::compile(&g).unwrap();
        let mut w = (0.0f64, 0.0f32);
        for start in (0..1u64 << 32).step_by(chunk) {
            let xs: Vec<f32> = (start..start + chunk as u64)
                .map(|k| f32::from_bits(k as u32))
                .collect();
            let lit = Literal::new([chunk], Data::F32(xs.clone())).unwrap();
            let out = exe.run(&[&lit], &SingleDevice).unwrap();
            let Data::F32(got) = &out[0].data else {
                panic!("f32 result expected")
            };
            for (&x, &g) in xs.iter().zip(got) {
                let e = ulps(g, reference(x as f64));
                if e > w.0 || e.is_nan() {
                    w = (e, x);
                }
            }
        }
        let line = format!(
            "{}: max {:.3} ulp at {:e}, bound {bound}",
            op.name(),
            w.0,
            w.1
        );
        println!("{line}");
        if w.0 > bound {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
