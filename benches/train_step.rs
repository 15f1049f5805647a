//! Compiled against interpreted, in one process: the seed train step (10-32-1, batch 256), the
//! big MLP step (784-1024-1024-10 tanh, batch 512, MSE, SGD), and first-call times (trace,
//! passes, compile, run), the elementwise kernels alone, one GEMM in both layouts of its
//! weight, and an eager `random::normal`. Run with `cargo bench --bench
//! train_step`; figures are recorded in docs/PERFORMANCE.md.

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tessera::prelude::*;

#[path = "../examples/common/mlp.rs"]
mod mlp;
use mlp::{Layer, Mlp, deep_sgd_step, init, init_deep, seed_data, sgd_step};

fn seed_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("seed_step");
    let (x, y) = seed_data(256);
    for (backend, simplify) in [
        (Backend::Cranelift, true),
        (Backend::Interpreter, true),
        (Backend::Cranelift, false),
    ] {
        let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y))
            .backend(backend)
            .simplify(simplify);
        let mut p = init(Key::new(0), 10, 32, 1);
        p = step.call((p, x.clone(), y.clone())).unwrap().0;
        let name = if simplify {
            format!("{backend:?}")
        } else {
            format!("{backend:?}_unsimplified")
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let (np, _) = step.call((p.clone(), x.clone(), y.clone())).unwrap();
                np
            })
        });
    }
    g.finish();
}

fn big_data() -> (Vec<Layer>, Tensor, Tensor) {
    let p = init_deep(Key::new(0), &[784, 1024, 1024, 10]);
    let x = random::normal(&Key::new(1), [512, 784]);
    let y = random::normal(&Key::new(2), [512, 10]);
    (p, x, y)
}

fn big_mlp_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("big_mlp_step");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    let (p, x, y) = big_data();
    let step = jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
    step.call((p.clone(), x.clone(), y.clone())).unwrap();
    g.bench_function("Cranelift", |b| {
        b.iter(|| step.call((p.clone(), x.clone(), y.clone())).unwrap())
    });
    g.finish();
}

fn first_call(c: &mut Criterion) {
    let mut g = c.benchmark_group("first_call");
    g.sample_size(10);
    let (x, y) = seed_data(256);
    let p = init(Key::new(0), 10, 32, 1);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        g.bench_function(format!("seed_{backend:?}"), |b| {
            b.iter_batched(
                || jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).backend(backend),
                |step| step.call((p.clone(), x.clone(), y.clone())).unwrap(),
                BatchSize::PerIteration,
            )
        });
    }
    g.bench_function("seed_Cranelift_unsimplified", |b| {
        b.iter_batched(
            || jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).simplify(false),
            |step| step.call((p.clone(), x.clone(), y.clone())).unwrap(),
            BatchSize::PerIteration,
        )
    });
    let (bp, bx, by) = big_data();
    for simplify in [true, false] {
        let name = if simplify {
            "big_Cranelift"
        } else {
            "big_Cranelift_unsimplified"
        };
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y))
                        .simplify(simplify)
                },
                |step| step.call((bp.clone(), bx.clone(), by.clone())).unwrap(),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// The elementwise kernels alone, 8192 elements (the seed step's hidden layer), one jit call
/// each: `tanh` on inputs whose spread decides its path (below 0.625 the polynomial; above,
/// the exp form, which a vector runs when any lane needs it) and an `add`, the call's floor.
/// Divide the time by 8192 for ns per element (docs/PERFORMANCE.md).
fn elementwise(c: &mut Criterion) {
    let mut g = c.benchmark_group("elementwise_8192");
    let tanh = jit(|x: Tensor| x.tanh());
    let add = jit(|x: Tensor| x + 1.0);
    for (name, scale) in [("0.2", 0.2f32), ("0.32", 0.32), ("1", 1.0), ("5", 5.0)] {
        let x = random::normal(&Key::new(1), [256, 32]) * scale;
        g.bench_function(format!("tanh_normal_times_{name}"), |b| {
            b.iter(|| tanh.call(x.clone()).unwrap())
        });
    }
    let x = random::normal(&Key::new(1), [256, 32]);
    g.bench_function("add", |b| b.iter(|| add.call(x.clone()).unwrap()));
    g.finish();
}

/// The big MLP's 512x1024x1024 product with the weight as given and transposed (`g @ w^T`,
/// every dense layer's input gradient): the transposed weight is column-major, the gemm
/// crate's slow layout, which `gemm_view` copies row-major first (`transpose.rs`). The two
/// should be close; docs/PERFORMANCE.md has the library's own figures for both layouts.
fn gemm_layouts(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm_512x1024x1024");
    g.sample_size(20);
    let a = random::normal(&Key::new(1), [512, 1024]);
    let w = random::normal(&Key::new(2), [1024, 1024]);
    let (a, w) = (
        Tensor::from_vec(a.to_vec::<f32>(), [512, 1024]),
        Tensor::from_vec(w.to_vec::<f32>(), [1024, 1024]),
    );
    let plain = jit(|(a, w): (Tensor, Tensor)| a.matmul(&w));
    let transposed = jit(|(a, w): (Tensor, Tensor)| a.matmul(&w.transpose(&[1, 0])));
    plain.call((a.clone(), w.clone())).unwrap();
    g.bench_function("w", |b| {
        b.iter(|| plain.call((a.clone(), w.clone())).unwrap())
    });
    transposed.call((a.clone(), w.clone())).unwrap();
    g.bench_function("w_transposed", |b| {
        b.iter(|| transposed.call((a.clone(), w.clone())).unwrap())
    });
    g.finish();
}

/// Eager (interpreted, op by op) `random::normal` of the big MLP's first weight, 784 x 1024:
/// threefry's rounds, the uniform floats and `erf_inv` on the host, as a user's parameter
/// initialization runs them.
fn eager_random(c: &mut Criterion) {
    let mut g = c.benchmark_group("eager_random");
    g.sample_size(10);
    g.bench_function("normal_784x1024", |b| {
        b.iter(|| random::normal(&Key::new(0), [784, 1024]).to_vec::<f32>())
    });
    g.finish();
}

/// A step over many small parameters (`p * 0.5 + 1` of each of 1,000 and of 4,000 [16]s,
/// chained): the per-run cost of an executable's outputs, which should grow linearly with
/// their count (docs/PERFORMANCE.md, twenty-third pass: the scans it replaced made 4,000 take
/// 7.9-16.3 ms a step where 1,000 took 0.7-1.4; 1.0-1.7 and 0.24-0.36 after).
fn many_outputs(c: &mut Criterion) {
    let mut g = c.benchmark_group("many_outputs");
    for n in [1000usize, 4000] {
        let f = jit(|ps: Vec<Tensor>| ps.iter().map(|p| p * 0.5 + 1.0).collect::<Vec<Tensor>>());
        let mut ps: Option<Vec<Tensor>> =
            Some((0..n).map(|i| Tensor::full([16], i as f32)).collect());
        g.bench_function(format!("{n}_params"), |b| {
            b.iter(|| ps = Some(f.call(ps.take().unwrap()).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    seed_step,
    many_outputs,
    big_mlp_step,
    first_call,
    elementwise,
    gemm_layouts,
    eager_random
);
criterion_main!(benches);
