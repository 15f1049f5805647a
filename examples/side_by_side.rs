//! Tessera's side of the side-by-side with JAX (`benches/side_by_side.sh`): one workload per
//! process, as the JAX script runs it, printing one line:
//! `tessera PROGRAM dev=N first_ms=.. loop_ms=.. wrap_ms=..` (the first call: trace, compile
//! and one step; then the mean of a loop of steps with the params chained and one read of the
//! loss at the end; then the time from just before wrapping the program, `jit` or `pmap`, to
//! its first call: wrapping starts the compiler's threads, `tessera_codegen::prepare`, so
//! `wrap_ms + first_ms` is what a first call costs when nothing comes between the two).
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
//! and two comparisons inside one process, the two sides in turn (in the order A B, then B A),
//! where a change in the machine's load moves both sides of a pair alike (separate processes
//! within half an hour measured the same one-device big step at 40.6-56 ms on a shared VM),
//! each printing both sides' median time and the median of the per-pair ratios:
//! - `meshes`: the `big` step on a mesh of one device (set up first) and on a mesh of every
//!   device, 5 steps of each in turn: `tessera meshes dev=N one_ms=.. all_ms=.. ratio=..` (ms a
//!   step; all over one): what the devices cost. (Until each program's outputs were written
//!   into the buffers of the parameters moved into it, on every device, the second program's
//!   outputs went back to the system every step, about 1340 page faults a step, and this
//!   measured 1.12-1.27; docs/PERFORMANCE.md, twenty-second and twenty-third passes);
//! - `paths`: the seed step on a mesh of one device and as `host`, 50 steps of each in turn:
//!   `tessera paths dev=1 mesh_us=.. host_us=.. ratio=..` (mesh over host).

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;

#[allow(dead_code)]
#[path = "cnn_digits.rs"]
mod cnn_digits;
use mlp::{Layer, Mlp, deep_sgd_step, init, init_deep, loss, seed_data, sgd_step};

/// Runs `step` once (the first call), then `steps` times, chaining the params; returns
/// (ms from `made`, when the program was wrapped, to the first call; first call ms; ms per
/// step) after reading the last loss.
fn time<P: Tree + Clone>(
    made: Instant,
    mut params: P,
    steps: usize,
    mut step: impl FnMut(P) -> Result<(P, Tensor)>,
) -> Result<(f64, f64, f64)> {
    let t = Instant::now();
    let wrap = t.duration_since(made).as_secs_f64() * 1e3;
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
    Ok((
        wrap,
        first,
        t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64,
    ))
}

fn sharded(widths: &[usize], batch: usize, steps: usize) -> Result<(f64, f64, f64)> {
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
        let made = Instant::now();
        let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y));
        time(made, p, steps, |p| step.call((p, x.clone(), y.clone())))
    } else {
        let p = device_put(
            init_deep(Key::new(0), widths),
            NamedSharding::new(&mesh, P![]),
        );
        let made = Instant::now();
        let step = jit(|(p, x, y): (Vec<Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
        time(made, p, steps, |p| step.call((p, x.clone(), y.clone())))
    }
}

fn host(steps: usize) -> Result<(f64, f64, f64)> {
    let (x, y) = seed_data(256);
    let params = init(Key::new(0), 10, 32, 1);
    let made = Instant::now();
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y));
    time(made, params, steps, |p| {
        step.call((p, x.clone(), y.clone()))
    })
}

fn pmapped(steps: usize) -> Result<(f64, f64, f64)> {
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
    let made = Instant::now();
    let step = pmap("i", |(p, x, y): (Mlp, Tensor, Tensor)| {
        let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
        let g = tree::map(&g, |g| pmean(g, "i"));
        (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
    });
    time(made, p, steps, |p| step.call((p, x.clone(), y.clone())))
}

/// The small CNN of `examples/cnn_digits.rs` (Adam, batch 128 of the digits, the batch over
/// a mesh of every device), as `benches/cnn.rs` runs it.
fn cnn(steps: usize) -> Result<(f64, f64, f64)> {
    use cnn_digits::{digits, step, step_inputs};
    let (state, x, y) = step_inputs(&digits::load());
    let made = Instant::now();
    let f = jit(|(s, x, y)| step(s, x, y));
    time(made, state, steps, |s| f.call((s, x.clone(), y.clone())))
}

/// Runs `sides[k]` for `k` in 0, 1 and then 1, 0, round after round: `warm` rounds, then
/// `rounds` timed ones. Returns the two sides' median time (ms) and the median of the
/// per-round ratios of side 1 over side 0 (the upper median of an even count; a median of
/// ratios, which can differ from the ratio of the medians).
fn in_turn(
    warm: usize,
    rounds: usize,
    sides: &mut [&mut dyn FnMut() -> Result<()>; 2],
) -> Result<(f64, f64, f64)> {
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..warm + rounds {
        for k in 0..2 {
            let side = if round % 2 == 0 { k } else { 1 - k };
            let start = Instant::now();
            (sides[side])()?;
            if round >= warm {
                times[side].push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratios: Vec<f64> = times[1].iter().zip(&times[0]).map(|(b, a)| b / a).collect();
    Ok((median(&times[0]), median(&times[1]), median(&ratios)))
}

/// The `big` step on a one-device mesh and on a mesh of every device, 5 steps of each in turn
/// (`meshes`).
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
    // Each side's own `jit`, as a program of one mesh has (one `jit` called on both would miss
    // its last call's entry every time).
    type Args = (Vec<Layer>, Tensor, Tensor);
    type Step = fn(Args) -> (Vec<Layer>, Tensor);
    let big_step: Step = |(p, x, y)| deep_sgd_step(p, x, y);
    let (one_step, all_step) = (jit(big_step), jit(big_step));
    // CHUNK steps with the params chained (moved into each call, as `time` does), the last
    // loss read.
    const CHUNK: usize = 5;
    let run =
        |step: &Jitted<Step, Args, (Vec<Layer>, Tensor)>, (p, x, y): &mut Args| -> Result<()> {
            let mut last = None;
            for _ in 0..CHUNK {
                let (next, l) = step.call((std::mem::take(p), x.clone(), y.clone()))?;
                *p = next;
                last = Some(l);
            }
            if let Some(l) = last {
                let _ = l.to_vec::<f32>();
            }
            Ok(())
        };
    let (mut one, mut all) = (setup(1), setup(device_count()));
    let rounds = steps.div_ceil(CHUNK).max(1);
    let (one_ms, all_ms, ratio) = in_turn(
        rounds.min(4),
        rounds,
        &mut [&mut || run(&one_step, &mut one), &mut || {
            run(&all_step, &mut all)
        }],
    )?;
    let (one_ms, all_ms) = (one_ms / CHUNK as f64, all_ms / CHUNK as f64);
    println!(
        "tessera meshes dev={} one_ms={one_ms:.3} all_ms={all_ms:.3} ratio={ratio:.3}",
        device_count()
    );
    Ok(())
}

/// The seed step on a one-device mesh and on host values, 50 steps of each in turn (`paths`).
fn paths(steps: usize) -> Result<()> {
    let mesh = Mesh::new([1], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = seed_data(256);
    let (xm, ym) = (device_put(x.clone(), &data), device_put(y.clone(), &data));
    let replicated = NamedSharding::new(&mesh, P![]);
    let mut on_mesh = Some(device_put(init(Key::new(0), 10, 32, 1), replicated));
    let mut on_host = Some(init(Key::new(0), 10, 32, 1));
    // Each side's own `jit`, as in `meshes`.
    type Step = fn((Mlp, Tensor, Tensor)) -> (Mlp, Tensor);
    let seed_step: Step = |(p, x, y)| sgd_step(p, x, y);
    let (host_step, mesh_step) = (jit(seed_step), jit(seed_step));
    const CHUNK: usize = 50;
    // CHUNK steps with the params chained (moved into each call, as `time` does).
    let run = |step: &Jitted<Step, (Mlp, Tensor, Tensor), (Mlp, Tensor)>,
               slot: &mut Option<Mlp>,
               x: &Tensor,
               y: &Tensor|
     -> Result<()> {
        let Some(mut p) = slot.take() else {
            return Err(Error::Config("paths: a side's params were lost".into()));
        };
        for _ in 0..CHUNK {
            p = step.call((p, x.clone(), y.clone()))?.0;
        }
        *slot = Some(p);
        Ok(())
    };
    let rounds = steps.div_ceil(CHUNK).max(1);
    let (host_ms, mesh_ms, ratio) = in_turn(
        rounds.min(20),
        rounds,
        &mut [&mut || run(&host_step, &mut on_host, &x, &y), &mut || {
            run(&mesh_step, &mut on_mesh, &xm, &ym)
        }],
    )?;
    let us = |ms: f64| ms * 1e3 / CHUNK as f64;
    println!(
        "tessera paths dev={} mesh_us={:.2} host_us={:.2} ratio={:.3}",
        device_count(),
        us(mesh_ms),
        us(host_ms),
        ratio
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let program = args.first().map(String::as_str).unwrap_or("seed");
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    match program {
        "meshes" => return meshes(steps),
        "paths" => return paths(steps),
        _ => {}
    }
    let (wrap, first, step) = match program {
        "seed" => sharded(&[10, 32, 1], 256, steps)?,
        "big" => sharded(&[784, 1024, 1024, 10], 512, steps)?,
        "host" => host(steps)?,
        "pmap" => pmapped(steps)?,
        "cnn" => cnn(steps)?,
        other => {
            return Err(Error::Config(format!(
                "side_by_side: unknown program {other:?} (seed, host, pmap, big, cnn, meshes, paths)"
            )));
        }
    };
    println!(
        "tessera {program} dev={} first_ms={first:.2} loop_ms={step:.4} wrap_ms={wrap:.3}",
        device_count()
    );
    Ok(())
}
