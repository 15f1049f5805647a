//! A causal self-attention block trained on real data: each 8x8 handwritten digit (UCI optical
//! digits, from the `smartcore` crate; see `common/digits.rs`) is read as a sequence of its 8
//! pixel rows. Rows are embedded, a pre-LayerNorm transformer block (4-head causal attention
//! with `einsum`, a GELU MLP, keepdims LayerNorms, residuals) runs over them, and the last row's
//! state (which, under the causal mask, has seen the whole image) classifies the digit.
//! Softmax cross-entropy on integer labels, Adam, data-parallel: the batch split over a mesh
//! axis `dp` of every device, the parameters replicated. Prints the loss, the test accuracy, and
//! the compiled against the interpreted step time.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example attention_digits`

use tessera::prelude::*;

#[path = "common/digits.rs"]
pub mod digits;
use digits::{Digits, State, adam_update, cross_entropy};

pub const T: usize = 8;
const D: usize = 32;
const HEADS: usize = 4;
const DH: usize = D / HEADS;
pub const BATCH: usize = 128;

#[derive(Tree, Clone)]
pub struct Block {
    pub embed: Tensor,
    pub pos: Tensor,
    pub ln1: (Tensor, Tensor),
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub wo: Tensor,
    pub ln2: (Tensor, Tensor),
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub b2: Tensor,
    pub lnf: (Tensor, Tensor),
    pub head: Tensor,
    pub head_b: Tensor,
}

pub fn init(key: Key) -> Block {
    let k = key.split_n(8);
    let w = |k: &Key, i: usize, o: usize| random::normal(k, [i, o]) * (1.0 / (i as f32).sqrt());
    let ln = || (Tensor::ones([D]), Tensor::zeros([D]));
    Block {
        embed: w(&k[0], T, D),
        pos: random::normal(&k[1], [T, D]) * 0.1,
        ln1: ln(),
        wq: w(&k[2], D, D),
        wk: w(&k[3], D, D),
        wv: w(&k[4], D, D),
        wo: w(&k[5], D, D) * 0.5,
        ln2: ln(),
        w1: w(&k[6], D, 4 * D),
        b1: Tensor::zeros([4 * D]),
        w2: w(&k[7], 4 * D, D) * 0.5,
        b2: Tensor::zeros([D]),
        lnf: ln(),
        head: Tensor::zeros([D, 10]),
        head_b: Tensor::zeros([10]),
    }
}

/// LayerNorm over the last axis, with the mean and variance kept as size-1 dims.
fn layer_norm(x: &Tensor, (g, b): &(Tensor, Tensor)) -> Tensor {
    let mu = x.mean_axes(keepdims(-1));
    let d = x - &mu;
    let var = d.square().mean_axes(keepdims(-1));
    &d * (var + 1e-5).rsqrt() * g + b
}

/// GELU, tanh form (`jax.nn.gelu(approximate=True)`).
fn gelu(x: &Tensor) -> Tensor {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    x * 0.5 * (1.0 + ((x + x * x * x * 0.044715) * c).tanh())
}

/// Multi-head causal self-attention over `[b, t, d]`.
fn attention(p: &Block, x: &Tensor) -> Tensor {
    let b = x.shape()[0];
    let heads = |w: &Tensor| x.matmul(w).reshape([b, T, HEADS, DH]);
    let (q, k, v) = (heads(&p.wq), heads(&p.wk), heads(&p.wv));
    let scores = einsum("bqhd,bkhd->bhqk", &[&q, &k]) * (1.0 / (DH as f32).sqrt());
    // Row q attends to rows k <= q: the lower triangle of the [t, t] score matrix.
    let causal = Tensor::ones([T, T]).tril(0).gt(&Tensor::scalar(0.0f32));
    let mask = causal.broadcast_to(scores.shape());
    let masked = Tensor::select(&mask, &scores, &Tensor::full(scores.shape().to_vec(), -1e9));
    let att = masked.softmax(-1);
    einsum("bhqk,bkhd->bqhd", &[&att, &v])
        .reshape([b, T, D])
        .matmul(&p.wo)
}

pub fn forward(p: &Block, images: &Tensor) -> Tensor {
    let h = images.matmul(&p.embed) + &p.pos;
    let h = &h + attention(p, &layer_norm(&h, &p.ln1));
    let m = gelu(&(layer_norm(&h, &p.ln2).matmul(&p.w1) + &p.b1)).matmul(&p.w2) + &p.b2;
    let h = layer_norm(&(h + m), &p.lnf);
    let b = h.shape()[0];
    let last = h.slice(&[0, T - 1, 0], &[b, T, D]).squeeze(1);
    last.matmul(&p.head) + &p.head_b
}

pub fn loss(p: &Block, images: &Tensor, labels: &Tensor) -> Tensor {
    cross_entropy(&forward(p, images), labels)
}

pub fn step((p, s): State<Block>, images: Tensor, labels: Tensor) -> (State<Block>, Tensor) {
    let (l, g) = value_and_grad(|p: &Block| loss(p, &images, &labels))(&p);
    let (p, s) = adam_update(&p, &g, &s, 3e-3);
    ((p, s), l)
}

/// Trains `epochs` passes over the training images on `backend`, the batch split over every
/// device; returns each epoch's mean loss and the final parameters.
pub fn train(data: &Digits, epochs: usize, backend: Backend) -> Result<(Vec<f32>, Block)> {
    digits::train(
        data,
        (epochs, BATCH),
        backend,
        ("attention_step", init(Key::new(0))),
        step,
    )
}

/// Mean time of one training step on `backend`, in ms.
pub fn time_per_step(data: &Digits, backend: Backend, steps: usize) -> Result<f64> {
    digits::time_per_step(data, (BATCH, steps), backend, init(Key::new(0)), step)
}

fn main() -> Result<()> {
    let data = digits::load();
    digits::report(&data, (30, 5), train, forward, time_per_step, (100, 5))
}
