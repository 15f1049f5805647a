//! The seed's pmap program: the per-device training step written by hand, with the gradients
//! and the loss averaged over the devices by `pmean`. Each device trains on 64 rows; the data
//! is `n_devices * 64` rows. JAX 0.10.2 prints 1.042890, 1.030457, 1.021400, 1.014672, 1.009591
//! for steps 0 to 40 on 8 devices, and 1.122127, 1.086606, 1.059886, 1.038828, 1.021637 on one.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example data_parallel_pmap`

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, loss};

/// Replicates every parameter along a new leading axis of size `n`, as `jnp.stack([a] * n)`.
fn replicate(p: &Mlp, n: usize) -> Mlp {
    tree::map(p, |a| {
        let mut dims = vec![n];
        dims.extend_from_slice(a.shape());
        let lead: Vec<usize> = (1..=a.rank()).collect();
        a.broadcast_in_dim(dims, &lead)
    })
}

/// The per-device step: local gradients, averaged over the devices with `pmean`.
fn train_step((p, x, y): (Mlp, Tensor, Tensor)) -> (Mlp, Tensor) {
    let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
    let g = tree::map(&g, |g| pmean(g, "i"));
    (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
}

/// Trains for `steps` steps on `n` devices and returns each step's loss (device 0's).
pub fn train(n: usize, steps: usize, backend: Backend) -> Result<Vec<f32>> {
    let mut params = replicate(&init(Key::new(0), 10, 32, 1), n);
    let x = random::normal(&Key::new(1), [n * 64, 10]).reshape([n, 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]).reshape([n, 64, 1]);
    let step = pmap("i", train_step)
        .named("train_step_pmap")
        .backend(backend);
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        losses.push(l.to_vec::<f32>()[0]);
    }
    Ok(losses)
}

fn time_per_step(n: usize, backend: Backend, steps: usize) -> Result<f64> {
    let mut params = replicate(&init(Key::new(0), 10, 32, 1), n);
    let x = random::normal(&Key::new(1), [n * 64, 10]).reshape([n, 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]).reshape([n, 64, 1]);
    let step = pmap("i", train_step)
        .named("train_step_pmap")
        .backend(backend);
    params = step.call((params, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        params = step.call((params, x.clone(), y.clone()))?.0;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

fn main() -> Result<()> {
    let n = device_count();
    println!("devices: {n}");
    for (i, l) in train(n, 50, Backend::Cranelift)?
        .iter()
        .enumerate()
        .step_by(10)
    {
        println!("Step {i}: Loss = {l:.6}");
    }
    let compiled = time_per_step(n, Backend::Cranelift, 500)?;
    let interpreted = time_per_step(n, Backend::Interpreter, 20)?;
    println!(
        "Time per step: compiled {compiled:.4} ms, interpreted {interpreted:.4} ms ({:.0}x)",
        interpreted / compiled
    );
    Ok(())
}
