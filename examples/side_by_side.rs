//! Tessera's side of the side-by-side with JAX (`benches/side_by_side.sh`): one workload per
//! process, as the JAX script runs it, printing one line:
//! `tessera PROGRAM dev=N first_ms=.. loop_ms=..` (the first call: trace, compile and one
//! step; then the mean of a loop of steps with the params chained and one read of the loss at
//! the end).
//!
//! Run: `TESSERA_DEVICES=N cargo run --release --example side_by_side -- PROGRAM STEPS`, with
//! PROGRAM one of
//! - `seed`: the seed sharding step over a mesh of every device (`dp`), data `P!["dp"]`,
//!   parameters replicated (the README's program);
//! - `host`: the seed step as a plain `jit` on host values (no mesh);
//! - `pmap`: the seed pmap step (params stacked, `pmean` of the gradients);
//! - `big`: the 784-1024-1024-10 tanh MLP, batch 512, as `seed` over every device;
//! - `cnn`: the small CNN of `examples/cnn_digits.rs` (two 3x3 convs with max-pools, Adam,
//!   batch 128), the batch over every device.
//!
//! and `meshes`: the `big` step on a mesh of one device and on a mesh of every device, one
//! step of each in turn in this one process, printing
//! `tessera meshes dev=N one_ms=.. all_ms=.. ratio=..` (each mesh's median step and the median
//! of the per-pair ratios, all devices over one): what the devices cost over one device,
//! measured where a change in the machine's load moves both sides of a pair alike (separate
//! processes a minute apart measured the same one-device step at 40-54 ms on a shared VM).

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;

#[allow(dead_code)]
#[path = "cnn_digits.rs"]
mod cnn_digits;
use mlp::{Layer, Mlp, deep_sgd_step, init, init_deep, loss, seed_data, sgd_step};

/// Runs `step` once (the first call), then `steps` times, chaining the params; returns
/// (first call ms, ms per step) after reading the last loss.
fn time<P: Tree + Clone>(
    mut params: P,
    steps: usize,
    mut step: impl FnMut(P) -> Result<(P, Tensor)>,
) -> Result<(f64, f64)> {
    let t = Instant::now();
    let (p, l) = step(params)?;
    let _ = l.to_vec::<f32>();
    let first = t.elapsed().as_secs_f64() * 1e3;
    params = p;
    for _ in 0..steps.min(50) {
        params = step(params)?.0;
    }
    let t = Instant::now();
    let mut last = None;
    for _ in 0..steps {
        let (p, l) = step(params)?;
        params = p;
        last = Some(l);
    }
    if let Some(l) = last {
        let _ = l.to_vec::<f32>();
    }
    Ok((first, t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64))
}

fn sharded(widths: &[usize], batch: usize, steps: usize) -> Result<(f64, f64)> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let x = device_put(random::normal(&Key::new(1), [batch, widths[0]]), &data);
    let y = device_put(
        random::normal(&Key::new(2), [batch, widths[widths.len() - 1]]),
        &data,
    );
    if widths.len() == 3 {
        let p = device_put(
            init(Key::new(0), 10, 32, 1),
            NamedSharding::new(&mesh, P![]),
        );
        let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y));
        time(p, steps, |p| step.call((p, x.clone(), y.clone())))
    } else {
        let p = device_put(
            init_deep(Key::new(0), widths),
            NamedSharding::new(&mesh, P![]),
        );
        let step = jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
        time(p, steps, |p| step.call((p, x.clone(), y.clone())))
    }
}

fn host(steps: usize) -> Result<(f64, f64)> {
    let (x, y) = seed_data(256);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y));
    time(init(Key::new(0), 10, 32, 1), steps, |p| {
        step.call((p, x.clone(), y.clone()))
    })
}

fn pmapped(steps: usize) -> Result<(f64, f64)> {
    let n = device_count();
    let stack = |a: &Tensor| {
        let mut dims = vec![n];
        dims.extend_from_slice(a.shape());
        let lead: Vec<usize> = (1..=a.rank()).collect();
        a.broadcast_in_dim(dims, &lead)
    };
    let p = tree::map(&init(Key::new(0), 10, 32, 1), stack);
    let x = random::normal(&Key::new(1), [n * 64, 10]).reshape([n, 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]).reshape([n, 64, 1]);
    let step = pmap("i", |(p, x, y): (Mlp, Tensor, Tensor)| {
        let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
        let g = tree::map(&g, |g| pmean(g, "i"));
        (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
    });
    time(p, steps, |p| step.call((p, x.clone(), y.clone())))
}

/// The small CNN of `examples/cnn_digits.rs` (Adam, batch 128 of the digits, the batch over
/// a mesh of every device), as `benches/cnn.rs` runs it.
fn cnn(steps: usize) -> Result<(f64, f64)> {
    use cnn_digits::{digits, step, step_inputs};
    let (state, x, y) = step_inputs(&digits::load());
    let f = jit(|(s, x, y)| step(s, x, y));
    time(state, steps, |s| f.call((s, x.clone(), y.clone())))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let program = args.first().map(String::as_str).unwrap_or("seed");
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    if program == "meshes" {
        return meshes(steps);
    }
    let (first, step) = match program {
        "seed" => sharded(&[10, 32, 1], 256, steps)?,
        "big" => sharded(&[784, 1024, 1024, 10], 512, steps)?,
        "host" => host(steps)?,
        "pmap" => pmapped(steps)?,
        "cnn" => cnn(steps)?,
        other => {
            return Err(Error::Config(format!(
                "side_by_side: unknown program {other:?} (seed, host, pmap, big, cnn, meshes)"
            )));
        }
    };
    println!(
        "tessera {program} dev={} first_ms={first:.2} loop_ms={step:.4}",
        device_count()
    );
    Ok(())
}

/// The `big` step on a one-device mesh and on a mesh of every device, in turn (`meshes`).
fn meshes(steps: usize) -> Result<()> {
    let widths = [784, 1024, 1024, 10];
    let setup = |devices: usize| {
        let mesh = Mesh::new([devices], ["dp"]);
        let data = NamedSharding::new(&mesh, P!["dp"]);
        let x = device_put(random::normal(&Key::new(1), [512, widths[0]]), &data);
        let y = device_put(random::normal(&Key::new(2), [512, widths[3]]), &data);
        let p = device_put(
            init_deep(Key::new(0), &widths),
            NamedSharding::new(&mesh, P![]),
        );
        (p, x, y)
    };
    let step = jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
    let mut sides = [setup(1), setup(device_count())];
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..steps.min(50) + steps.max(1) {
        for (side, t) in sides.iter_mut().zip(&mut times) {
            let (p, x, y) = side.clone();
            let start = Instant::now();
            let (p, l) = step.call((p, x, y))?;
            let _ = l.to_vec::<f32>();
            if round >= steps.min(50) {
                t.push(start.elapsed().as_secs_f64() * 1e3);
            }
            side.0 = p;
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratios: Vec<f64> = times[1].iter().zip(&times[0]).map(|(a, o)| a / o).collect();
    println!(
        "tessera meshes dev={} one_ms={:.3} all_ms={:.3} ratio={:.3}",
        device_count(),
        median(&times[0]),
        median(&times[1]),
        median(&ratios)
    );
    Ok(())
}
