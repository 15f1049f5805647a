//! The small CNN of `examples/cnn_digits.rs` (two SAME 3x3 convs with relu and 2x2 max-pools,
//! a dense layer, softmax cross-entropy on integer labels, Adam; batch 128 of 8x8 digits): one
//! training step compiled and interpreted, and the first call (trace, passes, compile, run).
//! Devices: `TESSERA_DEVICES` (the batch split over them); JAX runs the same step in
//! `benches/jax_compare.py`. Run with `cargo bench --bench cnn`; figures are recorded in
//! docs/PERFORMANCE.md.

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tessera::prelude::*;

#[allow(dead_code)]
#[path = "../examples/cnn_digits.rs"]
mod cnn_digits;
use cnn_digits::{digits, step, step_inputs};

fn inputs() -> (
    (cnn_digits::Cnn, digits::Adam<cnn_digits::Cnn>),
    Tensor,
    Tensor,
) {
    step_inputs(&digits::load())
}

fn cnn_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("cnn_step");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for (name, backend) in [
        ("compiled", Backend::Cranelift),
        ("interpreted", Backend::Interpreter),
    ] {
        let (state, x, y) = inputs();
        let f = jit(|(s, x, y)| step(s, x, y)).backend(backend);
        let state = f.call((state, x.clone(), y.clone())).unwrap().0;
        g.bench_function(name, |b| {
            b.iter(|| f.call((state.clone(), x.clone(), y.clone())).unwrap())
        });
    }
    g.finish();
}

fn cnn_first_call(c: &mut Criterion) {
    let mut g = c.benchmark_group("cnn_first_call");
    g.sample_size(10);
    let (state, x, y) = inputs();
    g.bench_function("compiled", |b| {
        b.iter_batched(
            || jit(|(s, x, y)| step(s, x, y)),
            |f| f.call((state.clone(), x.clone(), y.clone())).unwrap(),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, cnn_step, cnn_first_call);
criterion_main!(benches);
