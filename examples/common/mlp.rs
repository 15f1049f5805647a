//! The models the examples, tests and benches share: the seed MLP (10 -> 32 tanh -> 1) and a
//! deeper tanh MLP of any widths, with MSE losses and one SGD step.
#![allow(dead_code)]

use tessera::prelude::*;

/// The seed model.
#[derive(Tree, Clone)]
pub struct Mlp {
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub b2: Tensor,
}

/// `init_params` of the seed programs: normal weights scaled by 0.1, zero biases.
pub fn init(key: Key, i: usize, h: usize, o: usize) -> Mlp {
    let [k1, k2] = key.split();
    Mlp {
        w1: random::normal(&k1, [i, h]) * 0.1,
        b1: Tensor::zeros([h]),
        w2: random::normal(&k2, [h, o]) * 0.1,
        b2: Tensor::zeros([o]),
    }
}

pub fn forward(p: &Mlp, x: &Tensor) -> Tensor {
    (x.matmul(&p.w1) + &p.b1).tanh().matmul(&p.w2) + &p.b2
}

pub fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    (forward(p, x) - y).square().mean()
}

/// The seed's data: `X = normal(Key(1), [n, 10])`, `y = normal(Key(2), [n, 1])`.
pub fn seed_data(n: usize) -> (Tensor, Tensor) {
    (
        random::normal(&Key::new(1), [n, 10]),
        random::normal(&Key::new(2), [n, 1]),
    )
}

/// One SGD step with learning rate 0.01, returning the new parameters and the loss.
pub fn sgd_step(p: Mlp, x: Tensor, y: Tensor) -> (Mlp, Tensor) {
    let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
    (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
}

/// One dense layer.
#[derive(Tree, Clone)]
pub struct Layer {
    pub w: Tensor,
    pub b: Tensor,
}

/// A tanh MLP with the given widths (input first).
pub fn init_deep(key: Key, widths: &[usize]) -> Vec<Layer> {
    let keys = key.split_n(widths.len() - 1);
    widths
        .windows(2)
        .zip(keys)
        .map(|(w, k)| Layer {
            w: random::normal(&k, [w[0], w[1]]) * (1.0 / (w[0] as f32).sqrt()),
            b: Tensor::zeros([w[1]]),
        })
        .collect()
}

pub fn deep_loss(layers: &[Layer], x: &Tensor, y: &Tensor) -> Tensor {
    let mut h = x.clone();
    for (i, l) in layers.iter().enumerate() {
        h = h.matmul(&l.w) + &l.b;
        if i + 1 < layers.len() {
            h = h.tanh();
        }
    }
    (h - y).square().mean()
}

pub fn deep_sgd_step(p: Vec<Layer>, x: Tensor, y: Tensor) -> (Vec<Layer>, Tensor) {
    let (l, g) = value_and_grad(|p: &Vec<Layer>| deep_loss(p, &x, &y))(&p);
    (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
}
