//! The seed program on one device: a 10 -> 32 tanh -> 1 MLP trained with MSE and SGD
//! (learning rate 0.01) for 50 steps, with JAX's PRNG for parameters and data. JAX 0.10.2 prints
//! 1.070808, 1.050034, 1.034792, 1.023355, 1.014618 for steps 0 to 40. Then times a step
//! compiled with Cranelift and interpreted.
//!
//! Run: `cargo run --release --example train_single`

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, seed_data, sgd_step};

/// Trains for `steps` steps on `backend` and returns the loss of every step.
pub fn train(steps: usize, backend: Backend) -> Result<Vec<f32>> {
    let mut params = init(Key::new(0), 10, 32, 1);
    let (x, y) = seed_data(256);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y))
        .named("train_step")
        .backend(backend);
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        losses.push(l.item::<f32>());
    }
    Ok(losses)
}

/// Mean time of one step after the first call, in milliseconds.
fn time_per_step(backend: Backend, steps: usize) -> Result<f64> {
    let mut params = init(Key::new(0), 10, 32, 1);
    let (x, y) = seed_data(256);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).backend(backend);
    params = step.call((params, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        params = step.call((params, x.clone(), y.clone()))?.0;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

fn main() -> Result<()> {
    for (i, l) in train(50, Backend::Cranelift)?
        .iter()
        .enumerate()
        .step_by(10)
    {
        println!("Step {i}: Loss = {l:.6}");
    }
    let compiled = time_per_step(Backend::Cranelift, 2000)?;
    let interpreted = time_per_step(Backend::Interpreter, 50)?;
    println!(
        "Time per step: compiled {compiled:.4} ms, interpreted {interpreted:.4} ms ({:.0}x)",
        interpreted / compiled
    );
    Ok(())
}
