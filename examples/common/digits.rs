//! The UCI optical-recognition handwritten digits (1,797 8x8 images, pixel values 0..16,
//! labels 0..9; the copy scikit-learn ships as `load_digits`), from the `smartcore` crate's
//! embedded dataset (`smartcore::dataset::digits`, feature `datasets`), and a fixed split:
//! the first 1,536 images train, the other 261 test.
#![allow(dead_code)]

use tessera::prelude::*;

pub const TRAIN: usize = 1536;

/// Images scaled to [0, 1] as `[n, 8, 8]` f32, and labels as `[n]` i32.
pub struct Digits {
    pub images: Vec<f32>,
    pub labels: Vec<i32>,
    pub n: usize,
}

pub fn load() -> Digits {
    let d = smartcore::dataset::digits::load_dataset();
    assert_eq!((d.num_samples, d.num_features), (1797, 64));
    Digits {
        images: d.data.iter().map(|p| p / 16.0).collect(),
        labels: d.target.iter().map(|&y| y as i32).collect(),
        n: d.num_samples,
    }
}

impl Digits {
    /// Images `lo..hi` as a `[hi - lo, 8, 8]` tensor and their labels as `[hi - lo]` i32.
    pub fn batch(&self, lo: usize, hi: usize) -> (Tensor, Tensor) {
        (
            Tensor::from_vec(self.images[lo * 64..hi * 64].to_vec(), [hi - lo, 8, 8]),
            Tensor::from_vec(self.labels[lo..hi].to_vec(), [hi - lo]),
        )
    }
}

/// Adam's state (optax's `ScaleByAdamState`): first and second moments and the step count.
pub type Adam<P> = (P, P, Tensor);

/// Adam (Kingma and Ba; optax's defaults b1 = 0.9, b2 = 0.999, eps = 1e-8) over any tree.
pub fn adam_init<P: Tree>(p: &P) -> Adam<P> {
    (
        tree::map(p, |x| x.zeros_like()),
        tree::map(p, |x| x.zeros_like()),
        Tensor::scalar(0.0f32),
    )
}

/// One Adam step with learning rate `lr`: the new parameters and state.
pub fn adam_update<P: Tree>(p: &P, g: &P, (m, v, t): &Adam<P>, lr: f32) -> (P, Adam<P>) {
    let t = t + 1.0;
    let m = tree::map2(m, g, |m, g| m * 0.9 + g * 0.1);
    let v = tree::map2(v, g, |v, g| v * 0.999 + g.square() * 0.001);
    // Bias corrections 1 - b^t, as tensors so the step count can be traced.
    let c1 = 1.0 - (&t * 0.9f32.ln()).exp();
    let c2 = 1.0 - (&t * 0.999f32.ln()).exp();
    let (pl, def) = tree::flatten(p);
    let (ml, vl) = (tree::leaves(&m), tree::leaves(&v));
    let new: Vec<Tensor> = pl
        .iter()
        .zip(ml.iter().zip(&vl))
        .map(|(p, (m, v))| p - (m / &c1) / ((v / &c2).sqrt() + 1e-8) * lr)
        .collect();
    (tree::unflatten(&def, new).expect("same tree"), (m, v, t))
}

/// Softmax cross-entropy of `logits [b, 10]` against integer `labels [b]`: each row's
/// log-probability of its label, by `take_along_axis` (`optax.softmax_cross_entropy_with_
/// integer_labels`).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    let b = logits.shape()[0];
    let picked = logits
        .log_softmax(-1)
        .take_along_axis(&labels.reshape([b, 1]), 1);
    -picked.sum() / b as f32
}

/// The fraction of `logits`' argmaxes equal to `labels`.
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> f32 {
    let pred = logits.argmax(-1).to_vec::<i32>();
    let want = labels.to_vec::<i32>();
    pred.iter().zip(&want).filter(|(a, b)| a == b).count() as f32 / want.len() as f32
}
