//! The scaling bench (`docs/PERFORMANCE.md`, "Processes"): run it as one process with
//! `TESSERA_DEVICES=8`, and under `mpirun -np 2` with `TESSERA_DEVICES=4`, in one session
//! (`benches/mpi.sh` alternates them). Prints, from process 0:
//! - `seed`: the seed sharding step's time (ms per step, params chained);
//! - `big`: the big MLP step (784-1024-1024-10, batch 512) over every device;
//! - `allreduce N`: one all-reduce of N floats over a mesh of one device per process
//!   (`TESSERA_DEVICES=1`).
#![allow(clippy::duplicate_mod)]

use std::time::Instant;

use tessera::distributed::process_index;
use tessera::prelude::*;

#[path = "../../../../examples/common/mlp.rs"]
mod mlp;
use mlp::{Mlp, deep_sgd_step, init, init_deep, sgd_step};

fn report(what: &str, ms: f64) {
    if process_index() == 0 {
        println!("{what}: {ms:.4} ms");
    }
}

fn seed(steps: usize) -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let mut params = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    let (x, y) = mlp::seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y));
    params = step.call((params, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        params = step.call((params, x.clone(), y.clone()))?.0;
    }
    report("seed step", t.elapsed().as_secs_f64() * 1e3 / steps as f64);
    Ok(())
}

fn big(steps: usize) -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let mut params = device_put(
        init_deep(Key::new(0), &[784, 1024, 1024, 10]),
        NamedSharding::new(&mesh, P![]),
    );
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let x = device_put(random::normal(&Key::new(1), [512, 784]), &data);
    let y = device_put(random::normal(&Key::new(2), [512, 10]), &data);
    let step = jit(|(p, x, y): (Vec<mlp::Layer>, Tensor, Tensor)| deep_sgd_step(p, x, y));
    params = step.call((params, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        params = step.call((params, x.clone(), y.clone()))?.0;
    }
    let _ = params[0].w.to_vec::<f32>();
    report(
        "big MLP step",
        t.elapsed().as_secs_f64() * 1e3 / steps as f64,
    );
    Ok(())
}

fn allreduce(n: usize, reps: usize) -> Result<()> {
    let mesh = Mesh::new([device_count()], ["p"]);
    let x = device_put(
        Tensor::ones([device_count(), n]),
        NamedSharding::new(&mesh, P!["p"]),
    );
    // The sum over the split dim: one all-reduce of n floats between the devices.
    let f = jit(|x: Tensor| x.sum_axes(0));
    let _ = f.call(x.clone())?;
    let t = Instant::now();
    for _ in 0..reps {
        let _ = f.call(x.clone())?;
    }
    report(
        &format!("all-reduce of {n} f32 over {} devices", device_count()),
        t.elapsed().as_secs_f64() * 1e3 / reps as f64,
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("seed") => seed(2000),
        Some("big") => big(10),
        Some("allreduce") => {
            let n = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1);
            allreduce(n, if n > 100_000 { 20 } else { 2000 })
        }
        _ => Err(Error::Config("scaling: seed | big | allreduce N".into())),
    }
}
