//! A data-loading thread feeding a jitted training step: tensors are `Send`, so a loader
//! builds each minibatch (here: draws inputs from JAX's PRNG and computes a target function)
//! on its own thread while the main thread trains the seed MLP on the previous one with
//! `tessera::optim`'s Adam. A bounded channel keeps the loader two batches ahead.
//!
//! Run: `cargo run --release --example data_loader -- --plot loss.svg` (the plot is optional;
//! a progress bar shows on a terminal).

use std::sync::mpsc;
use std::thread;

use tessera::optim::{self, GradientTransformation};
use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
#[path = "common/progress.rs"]
pub mod progress;
use mlp::{Mlp, init, loss};

/// Batch `i`: 64 inputs of 10 features and the target `tanh(0.3 * sum of the features)`.
pub fn batch(i: usize) -> (Tensor, Tensor) {
    let x = random::normal(&Key::new(1000 + i as i64), [64, 10]);
    let y = (x.sum_axes(keepdims(1)) * 0.3).tanh();
    (x, y)
}

/// Trains for `steps` steps on batches built by a loader thread (or, with `threaded` false,
/// on this thread), returning every step's loss.
pub fn train(steps: usize, threaded: bool) -> Result<Vec<f32>> {
    let opt = optim::adam(3e-3);
    let step = jit(
        |(p, s, x, y): (Mlp, optim::AdamOptState<Mlp>, Tensor, Tensor)| {
            let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
            let (u, s) = opt.update(g, &s, &p);
            (optim::apply_updates(&p, &u), s, l)
        },
    )
    .named("loader_step");
    let mut params = init(Key::new(0), 10, 32, 1);
    let mut state = opt.init(&params);
    let (tx, rx) = mpsc::sync_channel::<(Tensor, Tensor)>(2);
    let loader = threaded.then(|| {
        thread::spawn(move || {
            for i in 0..steps {
                // The receiver hangs up when training stops early (an error): stop too.
                if tx.send(batch(i)).is_err() {
                    break;
                }
            }
        })
    });
    let bar = progress::bar(steps, "train");
    let mut losses = Vec::with_capacity(steps);
    for i in 0..steps {
        let (x, y) = if threaded {
            rx.recv()
                .map_err(|_| Error::Io("the loader thread stopped early".into()))?
        } else {
            batch(i)
        };
        let (p, s, l) = step.call((params, state, x, y))?;
        (params, state) = (p, s);
        let l = l.item::<f32>();
        bar.set_message(format!("loss {l:.4}"));
        bar.inc(1);
        losses.push(l);
    }
    bar.finish_and_clear();
    if let Some(h) = loader {
        h.join()
            .map_err(|_| Error::Io("the loader thread panicked".into()))?;
    }
    Ok(losses)
}

fn main() -> Result<()> {
    let plot = progress::plot_arg()?;
    let losses = train(400, true)?;
    for (i, l) in losses.iter().enumerate().step_by(50) {
        println!("Step {i}: Loss = {l:.6}");
    }
    if let Some(path) = plot {
        progress::plot_losses(&path, "seed MLP, Adam, loader thread", "step", &losses)?;
        println!("wrote the loss curve to {}", path.display());
    }
    Ok(())
}
