//! `permutation`, `shuffle` and `choice`, bit for bit JAX 0.10.2's: JAX's `_shuffle` (rounds
//! of `sort_key_val` over fresh random u32 keys), `choice` by `randint`, by a permutation, by
//! `cumsum` + `searchsorted` or by the Gumbel top-k trick.

use tessera_ir::{DType, Shape};

use super::dists::{fail, gumbel, randint, xla_log};
use super::{Key, bits, uniform};
use crate::axis::Axis;
use crate::tensor::Tensor;

/// JAX's static round count: `ceil(3 ln(max(1, n)) / ln(2^32 - 1))`, enough sorts that the
/// concatenated 32-bit keys are distinct with high probability.
fn rounds(n: usize) -> usize {
    (3.0 * (n.max(1) as f64).ln() / (u32::MAX as f64).ln()).ceil() as usize
}

/// JAX's `_shuffle` of `x` along `axis`, with the random sort keys of shape `keys_dims`
/// (broadcast along the other axes when it is `[x.shape[axis]]`: every slice permuted alike).
#[track_caller]
fn shuffle_with(key: &Key, x: &Tensor, axis: usize, n: usize, same_for_all: bool) -> Tensor {
    let mut key = key.clone();
    let mut x = x.clone();
    for _ in 0..rounds(n) {
        let [k, sub] = key.split();
        key = k;
        let sort_keys = if same_for_all {
            bits(&sub, [x.shape()[axis]]).broadcast_in_dim(x.shape().to_vec(), &[axis])
        } else {
            bits(&sub, x.shape().to_vec())
        };
        x = Tensor::sort_key_val(&sort_keys, &x, axis).1;
    }
    x
}

/// `jax.random.permutation(key, n)`: a random permutation of `0..n`, i32.
#[track_caller]
pub fn permutation(key: &Key, n: usize) -> Tensor {
    if n > i32::MAX as usize {
        fail("permutation", format!("n = {n} does not fit in i32"));
    }
    shuffle_with(key, &Tensor::iota(DType::I32, [n], 0), 0, n, false)
}

/// `jax.random.permutation(key, x, axis, independent)`: `x` with its slices along `axis`
/// shuffled; with `independent`, every 1-D line along `axis` is shuffled on its own (JAX's
/// `_shuffle` of the whole array), else all lines the same way (JAX's `take` of a shuffled
/// `arange`, here the same sorts with the keys broadcast: identical data movement).
#[track_caller]
pub fn permutation_of(key: &Key, x: &Tensor, axis: impl Into<Axis>, independent: bool) -> Tensor {
    if x.rank() == 0 {
        fail(
            "permutation",
            "x must be at least 1-D (use `permutation(key, n)` for a range)".into(),
        );
    }
    let axis = x.resolve_axis("permutation", axis);
    if independent || x.rank() == 1 {
        shuffle_with(key, x, axis, x.numel(), false)
    } else {
        shuffle_with(key, x, axis, x.shape()[axis], true)
    }
}

/// `jax.random.shuffle` (deprecated in JAX, kept for its bits): `permutation_of(key, x, axis,
/// independent = true)`.
#[track_caller]
pub fn shuffle(key: &Key, x: &Tensor, axis: impl Into<Axis>) -> Tensor {
    permutation_of(key, x, axis, true)
}

/// `jax.random.choice(key, n, shape, replace, p)`: i32 samples from `0..n`. Without `p`:
/// `randint(key, shape, 0, n)` with replacement, the first draws of `permutation(key, n)`
/// without. With an f32 `p` of shape `[n]`: `searchsorted(cumsum(p), cumsum(p)[-1] * (1 -
/// uniform))` with replacement, the top `prod(shape)` of `gumbel + log p` without.
#[track_caller]
pub fn choice(
    key: &Key,
    n: usize,
    shape: impl Into<Shape>,
    replace: bool,
    p: Option<&Tensor>,
) -> Tensor {
    let shape = shape.into();
    let draws = shape.numel();
    if draws == 0 {
        return Tensor::full_dtype(shape, 0.0, DType::I32);
    }
    if n == 0 || n > i32::MAX as usize {
        fail(
            "choice",
            format!(
                "n must be in 1..2^31 unless no samples are taken, got {n} (shape {:?})",
                shape.dims()
            ),
        );
    }
    if !replace && draws > n {
        fail(
            "choice",
            format!(
                "cannot take {draws} samples (shape {:?}) from {n} without replacement",
                shape.dims()
            ),
        );
    }
    let Some(p) = p else {
        return if replace {
            randint(key, shape, 0, n as i64, DType::I32)
        } else {
            permutation(key, n).slice(&[0], &[draws]).reshape(shape)
        };
    };
    if p.dtype() != DType::F32 || p.shape() != [n] {
        fail(
            "choice",
            format!(
                "p must be an f32 vector of shape [{n}], got {}{:?}",
                p.dtype().name(),
                p.shape()
            ),
        );
    }
    if replace {
        let cuml = p.cumsum(0);
        let total = cuml.slice(&[n - 1], &[n]).reshape([]);
        let r: Tensor = total * (1.0f32 - uniform(key, shape.clone(), 0.0, 1.0));
        // `searchsorted(cuml, r)` (side left): how many partial sums are below `r`.
        let mut dims = shape.dims().to_vec();
        dims.push(1);
        cuml.lt(&r.reshape(dims))
            .astype(DType::I32)
            .sum_axes([shape.rank()])
    } else {
        let g = gumbel(key, [n]) + xla_log(p);
        g.top_k(draws).1.reshape(shape)
    }
}
