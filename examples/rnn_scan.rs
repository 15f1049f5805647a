//! A small sequence model trained with `scan`: an Elman RNN (1 -> 16 tanh, linear readout)
//! over T = 400 steps learns to predict the next value of 8 phase-shifted sine waves, by SGD on
//! the mean squared error. Prints the loss every 10 steps, the first call (trace + compile) and
//! the time per step of the `scan` program and of the same RNN unrolled by a Rust `for` loop,
//! and the scan step compiled against interpreted.
//!
//! Run: `cargo run --release --example rnn_scan`

use std::time::Instant;

use tessera::prelude::*;

pub const T: usize = 400;
const B: usize = 8;
const H: usize = 16;

#[derive(Tree, Clone)]
pub struct Rnn {
    pub wx: Tensor,
    pub wh: Tensor,
    pub b: Tensor,
    pub wo: Tensor,
}

pub fn init() -> Rnn {
    let ks = Key::new(0).split_n(3);
    let (k1, k2, k3) = (&ks[0], &ks[1], &ks[2]);
    Rnn {
        wx: random::normal(k1, [1, H]) * 0.5,
        wh: random::normal(k2, [H, H]) * (1.0 / (H as f32).sqrt()),
        b: Tensor::zeros([H]),
        wo: random::normal(k3, [H, 1]) * 0.1,
    }
}

/// Inputs `[T, B, 1]` and next-step targets `[T, B, 1]`.
pub fn data(t: usize) -> (Tensor, Tensor) {
    let wave = |k: usize, b: usize| (0.05 * k as f32 + 0.7 * b as f32).sin();
    let xs: Vec<f32> = (0..t)
        .flat_map(|k| (0..B).map(move |b| wave(k, b)))
        .collect();
    let ys: Vec<f32> = (0..t)
        .flat_map(|k| (0..B).map(move |b| wave(k + 1, b)))
        .collect();
    (
        Tensor::from_vec(xs, [t, B, 1]),
        Tensor::from_vec(ys, [t, B, 1]),
    )
}

fn cell(p: &Rnn, h: &Tensor, x: &Tensor) -> Tensor {
    (x.matmul(&p.wx) + h.matmul(&p.wh) + &p.b).tanh()
}

/// The loss with the time loop as a `scan`: one body in the IR, whatever `T`.
pub fn loss_scan(p: &Rnn, xs: &Tensor, ys: &Tensor) -> Tensor {
    let (_, errs) = scan(
        |h: &Tensor, (x, y): &(Tensor, Tensor)| {
            let h2 = cell(p, h, x);
            let e = (h2.matmul(&p.wo) - y).square().sum();
            (h2, e)
        },
        &Tensor::zeros([B, H]),
        &(xs.clone(), ys.clone()),
        None,
        false,
    );
    errs.sum() / (xs.shape()[0] * B) as f32
}

/// The same loss with the time loop unrolled by Rust: `T` copies of the body in the IR.
pub fn loss_unrolled(p: &Rnn, xs: &Tensor, ys: &Tensor) -> Tensor {
    let t = xs.shape()[0];
    let mut h = Tensor::zeros([B, H]);
    let mut total = Tensor::scalar(0.0f32);
    for k in 0..t {
        let x = xs.slice(&[k, 0, 0], &[k + 1, B, 1]).reshape([B, 1]);
        let y = ys.slice(&[k, 0, 0], &[k + 1, B, 1]).reshape([B, 1]);
        h = cell(p, &h, &x);
        total += (h.matmul(&p.wo) - &y).square().sum();
    }
    total / (t * B) as f32
}

type Loss = fn(&Rnn, &Tensor, &Tensor) -> Tensor;

fn sgd(loss: Loss) -> impl Fn((Rnn, Tensor, Tensor)) -> (Rnn, Tensor) {
    move |(p, xs, ys)| {
        let (l, g) = value_and_grad(|p: &Rnn| loss(p, &xs, &ys))(&p);
        (tree::map2(&p, &g, |p, g| p - g * 0.05), l)
    }
}

/// Trains for `steps` steps of sequences of length `t` and returns every step's loss.
pub fn train(steps: usize, t: usize, loss: Loss, backend: Backend) -> Result<Vec<f32>> {
    let (xs, ys) = data(t);
    let step = jit(sgd(loss)).named("rnn_step").backend(backend);
    let mut p = init();
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (q, l) = step.call((p, xs.clone(), ys.clone()))?;
        p = q;
        losses.push(l.item::<f32>());
    }
    Ok(losses)
}

/// The first call (trace, compile, run) and the mean time of a step after it, in ms.
pub fn timings(loss: Loss, backend: Backend, steps: usize) -> Result<(f64, f64)> {
    let (xs, ys) = data(T);
    let step = jit(sgd(loss)).backend(backend);
    let t0 = Instant::now();
    let mut p = step.call((init(), xs.clone(), ys.clone()))?.0;
    let first = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    for _ in 0..steps {
        p = step.call((p, xs.clone(), ys.clone()))?.0;
    }
    Ok((first, t1.elapsed().as_secs_f64() * 1e3 / steps as f64))
}

fn main() -> Result<()> {
    for (i, l) in train(41, T, loss_scan, Backend::Cranelift)?
        .iter()
        .enumerate()
        .step_by(10)
    {
        println!("Step {i}: Loss = {l:.6}");
    }
    let (scan_first, scan_step) = timings(loss_scan, Backend::Cranelift, 50)?;
    let (unr_first, unr_step) = timings(loss_unrolled, Backend::Cranelift, 20)?;
    let (_, interp_step) = timings(loss_scan, Backend::Interpreter, 3)?;
    println!("T = {T}: first call scan {scan_first:.1} ms, unrolled {unr_first:.1} ms");
    println!(
        "Time per step: scan {scan_step:.3} ms, unrolled {unr_step:.3} ms; scan interpreted \
         {interp_step:.3} ms ({:.0}x)",
        interp_step / scan_step
    );
    Ok(())
}
