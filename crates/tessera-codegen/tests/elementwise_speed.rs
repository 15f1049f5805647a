//! Throughput of the compiled f32 elementwise functions, in ns per element over 2^20 elements
//! (best of 5 runs), on inputs inside the fast paths and, for sin/cos, beyond the inline
//! limit. A measurement, not a check: run by hand with
//! `cargo test -p tessera-codegen --test elementwise_speed --release -- --ignored --nocapture`.

use std::time::Instant;
use tessera_interp::SingleDevice;
#[path = "support/elementwise.rs"]
mod support;

use tessera_ir::{BinaryOp, Literal, Op, UnaryOp};

fn ns_per_element(op: Op, inputs: &[Vec<f32>]) -> f64 {
    let n = inputs[0].len();
    let (exe, lits) = support::build(op, inputs);
    let refs: Vec<&Literal> = lits.iter().collect();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            let out = exe.run(&refs, &SingleDevice).unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(out[0].ty.numel(), n);
            dt * 1e9 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn spread(n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n)
        .map(|i| (lo + (hi - lo) * ((i * 7919) % n) as f64 / n as f64) as f32)
        .collect()
}

#[test]
#[ignore]
fn elementwise_throughput() {
    let n = 1 << 20;
    let unary = [
        (UnaryOp::Exp, -80.0, 80.0),
        (UnaryOp::Log, 1e-3, 1e3),
        (UnaryOp::Log1p, -0.5, 10.0),
        (UnaryOp::Expm1, -10.0, 10.0),
        (UnaryOp::Tanh, -5.0, 5.0),
        (UnaryOp::Logistic, -20.0, 20.0),
        (UnaryOp::Erf, -3.0, 3.0),
        (UnaryOp::Sin, -100.0, 100.0),
        (UnaryOp::Cos, -100.0, 100.0),
        (UnaryOp::Sin, 1e4, 1e9),
    ];
    for (op, lo, hi) in unary {
        let t = ns_per_element(Op::Unary(op), &[spread(n, lo, hi)]);
        println!("{:>9} on [{lo:e}, {hi:e}]: {t:.2} ns/element", op.name());
    }
    let t = ns_per_element(
        Op::Binary(BinaryOp::Pow),
        &[spread(n, 0.1, 10.0), spread(n, -3.0, 3.0)],
    );
    println!("      pow on [0.1, 10] x [-3, 3]: {t:.2} ns/element");
}
