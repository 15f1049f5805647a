//! A small CNN trained on real data: the UCI handwritten digits (8x8, from the `smartcore`
//! crate; see `common/digits.rs`) as NHWC images: a 3x3 conv (1 -> 16, SAME) with relu and a
//! 2x2 max-pool, a 3x3 conv (16 -> 32, SAME) with relu and a 2x2 max-pool, then a dense layer
//! to 10 logits; softmax cross-entropy on integer labels, Adam. Data-parallel: the batch split
//! over a mesh axis `dp` of every device, the parameters replicated. Prints the loss, the test
//! accuracy, and the compiled against the interpreted step time.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example cnn_digits`

use std::time::Instant;

use tessera::prelude::*;

#[path = "common/digits.rs"]
pub mod digits;
use digits::{Adam, Digits, TRAIN, accuracy, adam_init, adam_update, cross_entropy};

pub const BATCH: usize = 128;

#[derive(Tree, Clone)]
pub struct Cnn {
    pub k1: Tensor,
    pub c1: Tensor,
    pub k2: Tensor,
    pub c2: Tensor,
    pub w: Tensor,
    pub b: Tensor,
}

pub fn init(key: Key) -> Cnn {
    let k = key.split_n(3);
    Cnn {
        k1: random::normal(&k[0], [3, 3, 1, 16]) * (1.0 / 3.0),
        c1: Tensor::zeros([16]),
        k2: random::normal(&k[1], [3, 3, 16, 32]) * (1.0 / 12.0),
        c2: Tensor::zeros([32]),
        w: random::normal(&k[2], [2 * 2 * 32, 10]) * (1.0 / 11.3),
        b: Tensor::zeros([10]),
    }
}

fn conv_relu(x: &Tensor, k: &Tensor, c: &Tensor) -> Tensor {
    let opts = ConvOptions::new()
        .padding("SAME")
        .layout("NHWC", "HWIO", "NHWC");
    (x.conv_general_dilated(k, opts) + c).relu()
}

pub fn forward(p: &Cnn, images: &Tensor) -> Tensor {
    let n = images.shape()[0];
    let x = images.reshape([n, 8, 8, 1]);
    let h = conv_relu(&x, &p.k1, &p.c1).max_pool(&[2, 2], &[2, 2], "VALID");
    let h = conv_relu(&h, &p.k2, &p.c2).max_pool(&[2, 2], &[2, 2], "VALID");
    h.reshape([n, 2 * 2 * 32]).matmul(&p.w) + &p.b
}

pub fn loss(p: &Cnn, images: &Tensor, labels: &Tensor) -> Tensor {
    cross_entropy(&forward(p, images), labels)
}

type State = (Cnn, Adam<Cnn>);

pub fn step((p, s): State, images: Tensor, labels: Tensor) -> (State, Tensor) {
    let (l, g) = value_and_grad(|p: &Cnn| loss(p, &images, &labels))(&p);
    let (p, s) = adam_update(&p, &g, &s, 3e-3);
    ((p, s), l)
}

/// Trains `epochs` passes over the training images on `backend`, the batch split over every
/// device; returns each epoch's mean loss and the final parameters.
pub fn train(data: &Digits, epochs: usize, backend: Backend) -> Result<(Vec<f32>, Cnn)> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let p = init(Key::new(0));
    let mut state = device_put((p.clone(), adam_init(&p)), &NamedSharding::new(&mesh, P![]));
    let f = jit(|(s, x, y): (State, Tensor, Tensor)| step(s, x, y))
        .named("cnn_step")
        .backend(backend);
    let mut epoch_losses = Vec::with_capacity(epochs);
    for _ in 0..epochs {
        let mut total = 0.0;
        let batches = TRAIN / BATCH;
        for i in 0..batches {
            let (x, y) = data.batch(i * BATCH, (i + 1) * BATCH);
            let (s, l) = f.call((state, device_put(x, &split), device_put(y, &split)))?;
            state = s;
            total += l.item::<f32>();
        }
        epoch_losses.push(total / batches as f32);
    }
    Ok((epoch_losses, state.0))
}

/// Mean time of one training step on `backend`, in ms.
pub fn time_per_step(data: &Digits, backend: Backend, steps: usize) -> Result<f64> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let p = init(Key::new(0));
    let mut state = device_put((p.clone(), adam_init(&p)), &NamedSharding::new(&mesh, P![]));
    let (x, y) = data.batch(0, BATCH);
    let (x, y) = (device_put(x, &split), device_put(y, &split));
    let f = jit(|(s, x, y): (State, Tensor, Tensor)| step(s, x, y)).backend(backend);
    state = f.call((state, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        state = f.call((state, x.clone(), y.clone()))?.0;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

fn main() -> Result<()> {
    let data = digits::load();
    println!(
        "devices: {}; digits: {} train, {} test",
        device_count(),
        TRAIN,
        data.n - TRAIN
    );
    let (losses, p) = train(&data, 20, Backend::Cranelift)?;
    for (e, l) in losses.iter().enumerate().step_by(4) {
        println!("Epoch {e}: Loss = {l:.6}");
    }
    let (x, y) = data.batch(TRAIN, data.n);
    println!("test accuracy: {:.3}", accuracy(&forward(&p, &x), &y));
    let compiled = time_per_step(&data, Backend::Cranelift, 50)?;
    let interpreted = time_per_step(&data, Backend::Interpreter, 3)?;
    println!(
        "Time per step: compiled {compiled:.3} ms, interpreted {interpreted:.3} ms ({:.0}x)",
        interpreted / compiled
    );
    Ok(())
}
