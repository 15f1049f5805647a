//! The data-parallel programs on 8 host devices (threads on this machine's cores), compiled
//! against interpreted: the seed sharding step, the seed pmap step, and the big MLP step with
//! the batch split over 8 devices. Run with `cargo bench --bench sharded`.

use std::time::Duration;

use criterion::Criterion;
use tessera::prelude::*;

#[path = "../examples/common/mlp.rs"]
mod mlp;
use mlp::{Layer, Mlp, deep_sgd_step, init, init_deep, loss, seed_data, sgd_step};

fn seed_sharding(c: &mut Criterion) {
    let mut g = c.benchmark_group("seed_sharding_8dev");
    let mesh = Mesh::new([8], ["dp"]);
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).backend(backend);
        let mut p = device_put(
            init(Key::new(0), 10, 32, 1),
            NamedSharding::new(&mesh, P![]),
        );
        p = step.call((p, x.clone(), y.clone())).unwrap().0;
        g.bench_function(format!("{backend:?}"), |b| {
            b.iter(|| step.call((p.clone(), x.clone(), y.clone())).unwrap())
        });
    }
    g.finish();
}

/// Trace, partition, compile for every device, and one step: what a user waits for first.
fn first_call_sharded(c: &mut Criterion) {
    let mut g = c.benchmark_group("first_call_8dev");
    g.sample_size(10);
    let mesh = Mesh::new([8], ["dp"]);
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    let p = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    g.bench_function("seed_sharding_Cranelift", |b| {
        b.iter_batched(
            || jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)),
            |step| step.call((p.clone(), x.clone(), y.clone())).unwrap(),
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn pmap_step((p, x, y): (Mlp, Tensor, Tensor)) -> (Mlp, Tensor) {
    let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
    let g = tree::map(&g, |g| pmean(g, "i"));
    (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
}

fn seed_pmap(c: &mut Criterion) {
    let mut g = c.benchmark_group("seed_pmap_8dev");
    let n = 8;
    let p = tree::map(&init(Key::new(0), 10, 32, 1), |a| {
        let mut dims = vec![n];
        dims.extend_from_slice(a.shape());
        let lead: Vec<usize> = (1..=a.rank()).collect();
        a.broadcast_in_dim(dims, &lead)
    });
    let x = random::normal(&Key::new(1), [n * 64, 10]).reshape([n, 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]).reshape([n, 64, 1]);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let step = pmap("i", pmap_step).backend(backend);
        let p1 = step.call((p.clone(), x.clone(), y.clone())).unwrap().0;
        g.bench_function(format!("{backend:?}"), |b| {
            b.iter(|| step.call((p1.clone(), x.clone(), y.clone())).unwrap())
        });
    }
    g.finish();
}

fn big_mlp_dp8(c: &mut Criterion) {
    let mut g = c.benchmark_group("big_mlp_step_dp8");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    let mesh = Mesh::new([8], ["dp"]);
    let p = device_put(
        init_deep(Key::new(0), &[784, 1024, 1024, 10]),
        NamedSharding::new(&mesh, P![]),
    );
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let x = device_put(random::normal(&Key::new(1), [512, 784]), &data);
    let y = device_put(random::normal(&Key::new(2), [512, 10]), &data);
    let step = jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
    step.call((p.clone(), x.clone(), y.clone())).unwrap();
    g.bench_function("Cranelift", |b| {
        b.iter(|| step.call((p.clone(), x.clone(), y.clone())).unwrap())
    });
    g.finish();
}

fn main() {
    // SAFETY: set before any thread starts, so no other thread reads the environment.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    let mut c = Criterion::default().configure_from_args();
    seed_sharding(&mut c);
    seed_pmap(&mut c);
    big_mlp_dp8(&mut c);
    first_call_sharded(&mut c);
    c.final_summary();
}
