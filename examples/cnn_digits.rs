//! A small CNN trained on real data: the UCI handwritten digits (8x8, from the `smartcore`
//! crate; see `common/digits.rs`) as NHWC images: a 3x3 conv (1 -> 16, SAME) with relu and a
//! 2x2 max-pool, a 3x3 conv (16 -> 32, SAME) with relu and a 2x2 max-pool, then a dense layer
//! to 10 logits; softmax cross-entropy on integer labels, Adam. Data-parallel: the batch split
//! over a mesh axis `dp` of every device, the parameters replicated. Prints the loss, the test
//! accuracy, and the compiled against the interpreted step time.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example cnn_digits`

use tessera::prelude::*;

#[path = "common/digits.rs"]
pub mod digits;
use digits::{Digits, State, adam_update, cross_entropy};

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

pub fn step((p, s): State<Cnn>, images: Tensor, labels: Tensor) -> (State<Cnn>, Tensor) {
    let (l, g) = value_and_grad(|p: &Cnn| loss(p, &images, &labels))(&p);
    let (p, s) = adam_update(&p, &g, &s, 3e-3);
    ((p, s), l)
}

/// One step's arguments as `benches/cnn.rs` and `examples/side_by_side.rs` time it: the
/// initial parameters and Adam state, replicated, and the first batch of the training images
/// split over a mesh of every device (`dp`).
pub fn step_inputs(data: &Digits) -> (State<Cnn>, Tensor, Tensor) {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let p = init(Key::new(0));
    let state = device_put(
        (p.clone(), digits::adam_init(&p)),
        NamedSharding::new(&mesh, P![]),
    );
    let (x, y) = data.batch(0, BATCH);
    (state, device_put(x, &split), device_put(y, &split))
}

/// Trains `epochs` passes over the training images on `backend`, the batch split over every
/// device; returns each epoch's mean loss and the final parameters.
pub fn train(data: &Digits, epochs: usize, backend: Backend) -> Result<(Vec<f32>, Cnn)> {
    digits::train(
        data,
        (epochs, BATCH),
        backend,
        ("cnn_step", init(Key::new(0))),
        step,
    )
}

/// Mean time of one training step on `backend`, in ms.
pub fn time_per_step(data: &Digits, backend: Backend, steps: usize) -> Result<f64> {
    digits::time_per_step(data, (BATCH, steps), backend, init(Key::new(0)), step)
}

fn main() -> Result<()> {
    let data = digits::load();
    digits::report(&data, (20, 4), train, forward, time_per_step, (50, 3))
}
