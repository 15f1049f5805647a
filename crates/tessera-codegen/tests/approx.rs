//! The inline f32 approximations against f64 references over dense input ranges, as relative
//! (or, below a floor, absolute) errors, scalar and f32x4 alike (the inputs run through a
//! vectorized kernel with a scalar tail). A second net under `tests/ulp.rs`, which checks the
//! ulp bounds `approx.rs` states over the whole f32 range.

#[path = "support/elementwise.rs"]
mod support;
use support::compiled;
use tessera_ir::{BinaryOp, Op, UnaryOp};

fn range(lo: f64, hi: f64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32)
        .collect()
}

/// Max relative error (against `max(|want|, floor)`) of `op` against `reference`.
fn max_error(op: UnaryOp, xs: &[f32], reference: impl Fn(f64) -> f64, floor: f64) -> (f64, f32) {
    let got = compiled(Op::Unary(op), &[xs.to_vec()]);
    let mut worst = (0.0, 0.0f32);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = reference(x as f64);
        let err = (g as f64 - want).abs() / want.abs().max(floor);
        if err > worst.0 || (err.is_nan() && !want.is_nan()) {
            worst = (err, x);
        }
    }
    worst
}

fn erf_inv_f64(y: f64) -> f64 {
    tessera_interp::scalar::erf_inv_f64(y)
}

/// (op, input range low and high, f64 reference, relative bound, magnitude under which the
/// bound is absolute).
type Case = (UnaryOp, f64, f64, fn(f64) -> f64, f64, f64);

#[test]
fn approximations_stay_within_their_stated_bounds() {
    let n = 20_003;
    let cases: Vec<Case> = vec![
        (UnaryOp::Exp, -87.0, 88.0, f64::exp, 2e-7, 0.0),
        (UnaryOp::Log, 1e-30, 1e30, f64::ln, 3e-7, 1.0),
        (UnaryOp::Log, 0.5, 2.0, f64::ln, 3e-7, 0.3),
        (UnaryOp::Log1p, -0.99, 10.0, f64::ln_1p, 3e-7, 0.0),
        (UnaryOp::Expm1, -20.0, 20.0, f64::exp_m1, 3e-7, 0.0),
        (UnaryOp::Tanh, -12.0, 12.0, f64::tanh, 3e-7, 1.0),
        (
            UnaryOp::Logistic,
            -80.0,
            80.0,
            |x| 1.0 / (1.0 + (-x).exp()),
            2e-7,
            0.0,
        ),
        (UnaryOp::Sin, -100.0, 100.0, f64::sin, 1e-7, 1.0),
        (UnaryOp::Cos, -100.0, 100.0, f64::cos, 1e-7, 1.0),
        (UnaryOp::Erf, -6.0, 6.0, libm::erf, 4e-7, 1.0),
        (UnaryOp::ErfInv, -0.9999, 0.9999, erf_inv_f64, 4e-6, 0.0),
    ];
    let mut report = Vec::new();
    for (op, lo, hi, reference, bound, floor) in cases {
        let (err, at) = max_error(op, &range(lo, hi, n), reference, floor.max(1e-300));
        report.push(format!(
            "{:>9} on [{lo}, {hi}]: max error {err:.2e} at {at} (bound {bound:.0e})",
            op.name()
        ));
        if std::env::var_os("APPROX_REPORT").is_none() {
            assert!(err <= bound, "{}", report.last().unwrap());
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn special_values() {
    let xs = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        100.0,
    ];
    let exp = compiled(Op::Unary(UnaryOp::Exp), std::slice::from_ref(&xs));
    assert!(
        exp[0].is_nan()
            && exp[1] == f32::INFINITY
            && exp[2] == 0.0
            && exp[3] == 1.0
            && exp[7] == f32::INFINITY
    );
    let log = compiled(Op::Unary(UnaryOp::Log), std::slice::from_ref(&xs));
    assert!(
        log[0].is_nan()
            && log[1] == f32::INFINITY
            && log[2].is_nan()
            && log[3] == f32::NEG_INFINITY
            && log[5] == 0.0
            && log[6].is_nan()
    );
    let tanh = compiled(Op::Unary(UnaryOp::Tanh), std::slice::from_ref(&xs));
    assert!(
        tanh[0].is_nan()
            && (tanh[1] - 1.0).abs() < 3e-7
            && (tanh[2] + 1.0).abs() < 3e-7
            && tanh[3] == 0.0
    );
    let ei = compiled(Op::Unary(UnaryOp::ErfInv), std::slice::from_ref(&xs));
    assert!(ei[5] == f32::INFINITY && ei[6] == f32::NEG_INFINITY && ei[7].is_nan());
    let round = compiled(
        Op::Unary(UnaryOp::Round),
        &[vec![0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, 8388609.0, -0.0]],
    );
    assert_eq!(round, vec![1.0, -1.0, 2.0, 3.0, -3.0, 0.0, 8388609.0, 0.0]);
    let pow = compiled(
        Op::Binary(BinaryOp::Pow),
        &[
            vec![-2.0, -2.0, 0.0, 2.0, 1.0, -8.0],
            vec![2.0, 3.0, 0.0, 0.5, f32::NAN, 1.0 / 3.0],
        ],
    );
    assert_eq!(&pow[..3], &[4.0, -8.0, 1.0]);
    assert!((pow[3] - 2f32.sqrt()).abs() < 1e-6 && pow[4] == 1.0 && pow[5].is_nan());
}
