//! The RNN of `examples/rnn_scan.rs` (T = 400, batch 8, 16 hidden units): one SGD step with
//! the time loop as a `scan` against the same step unrolled by a Rust loop, compiled, and the
//! first call (trace, passes, compile, run) of the scan step. Run with
//! `cargo bench --bench rnn_scan`; figures are recorded in docs/PERFORMANCE.md.

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tessera::prelude::*;

#[allow(dead_code)]
#[path = "../examples/rnn_scan.rs"]
mod rnn_scan;
use rnn_scan::{Rnn, T, data, init, loss_scan, loss_unrolled};

type Loss = fn(&Rnn, &Tensor, &Tensor) -> Tensor;

fn step_fn(loss: Loss) -> impl Fn((Rnn, Tensor, Tensor)) -> (Rnn, Tensor) {
    move |(p, xs, ys)| {
        let (l, g) = value_and_grad(|p: &Rnn| loss(p, &xs, &ys))(&p);
        (tree::map2(&p, &g, |p, g| p - g * 0.05), l)
    }
}

fn rnn_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("rnn_step");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let (xs, ys) = data(T);
    for (name, loss) in [
        ("scan", loss_scan as Loss),
        ("unrolled", loss_unrolled as Loss),
    ] {
        let step = jit(step_fn(loss));
        let p = step.call((init(), xs.clone(), ys.clone())).unwrap().0;
        g.bench_function(name, |b| {
            b.iter(|| step.call((p.clone(), xs.clone(), ys.clone())).unwrap())
        });
    }
    g.finish();
}

fn rnn_first_call(c: &mut Criterion) {
    let mut g = c.benchmark_group("rnn_first_call");
    g.sample_size(10);
    let (xs, ys) = data(T);
    g.bench_function("scan", |b| {
        b.iter_batched(
            || jit(step_fn(loss_scan)),
            |step| step.call((init(), xs.clone(), ys.clone())).unwrap(),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, rnn_step, rnn_first_call);
criterion_main!(benches);
