//! The seed's modern-sharding program: a mesh over every device with one axis `dp`, the data
//! split over it (`P!["dp"]`), the parameters replicated (`P![]`), and a plain `jit` of the
//! training step: the compiler finds the communication (one all_reduce over `dp` per gradient
//! and one for the loss). JAX 0.10.2 prints 1.070808, 1.050034, 1.034792, 1.023355, 1.014618 on
//! any number of devices.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example data_parallel_sharding`

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, seed_data, sgd_step};

/// Trains for `steps` steps on `backend` over all devices and returns every step's loss.
pub fn train(steps: usize, backend: Backend) -> Result<(Vec<f32>, Mlp, Tensor)> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let mut params = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y))
        .named("train_step_sharded")
        .backend(backend);
    let mut losses = Vec::with_capacity(steps);
    let mut loss = Tensor::zeros([]);
    for _ in 0..steps {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        losses.push(l.item::<f32>());
        loss = l;
    }
    Ok((losses, params, loss))
}

fn time_per_step(backend: Backend, steps: usize) -> Result<f64> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let mut params = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).backend(backend);
    params = step.call((params, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        params = step.call((params, x.clone(), y.clone()))?.0;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

fn main() -> Result<()> {
    println!("devices: {}", device_count());
    let (losses, params, loss) = train(50, Backend::Cranelift)?;
    for (i, l) in losses.iter().enumerate().step_by(10) {
        println!("Step {i}: Loss = {l:.6}");
    }
    let show = |t: &Tensor| t.sharding().map_or("host".to_string(), |s| s.to_string());
    println!(
        "final loss sharding: {}; w1 sharding: {}",
        show(&loss),
        show(&params.w1)
    );
    let compiled = time_per_step(Backend::Cranelift, 500)?;
    let interpreted = time_per_step(Backend::Interpreter, 20)?;
    println!(
        "Time per step: compiled {compiled:.4} ms, interpreted {interpreted:.4} ms ({:.0}x)",
        interpreted / compiled
    );
    Ok(())
}
