//! Array manipulation as `jax.numpy` has it, built from the movement primitives (reshape,
//! broadcast, slice, concatenate, transpose) and `iota`/`select`, so that every function has
//! gradients, batching and sharding through its primitives: `stack`, `split`, `squeeze`,
//! `expand_dims`, `moveaxis`, `swapaxes`, `roll`, `tile`, `repeat`, `eye`, `tril`, `triu`,
//! `concat` with signed axes.

use std::panic::Location;

use tessera_ir::DType;

use crate::axis::{Axis, AxisList};
use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::join;

#[track_caller]
fn fail(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// How `split` cuts an axis: into `n` equal parts, or at the given indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// `n` equal parts (`jnp.split(x, n)`); the axis's size must be divisible by `n`.
    Sections(usize),
    /// Cut before each of these indices (`jnp.split(x, [i, j])`): `len + 1` parts, as NumPy's
    /// (an index past the end is clamped; a smaller index after a larger gives an empty part).
    Indices(Vec<usize>),
}

impl From<usize> for Split {
    fn from(n: usize) -> Split {
        Split::Sections(n)
    }
}

impl From<i32> for Split {
    fn from(n: i32) -> Split {
        Split::Sections(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

impl From<&[usize]> for Split {
    fn from(ix: &[usize]) -> Split {
        Split::Indices(ix.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Split {
    fn from(ix: [usize; N]) -> Split {
        Split::Indices(ix.to_vec())
    }
}

impl From<Vec<usize>> for Split {
    fn from(ix: Vec<usize>) -> Split {
        Split::Indices(ix)
    }
}

impl Tensor {
    /// `jnp.concatenate(tensors, axis)` with a signed axis.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], axis: impl Into<Axis>) -> Tensor {
        let Some(first) = tensors.first() else {
            fail("concatenate", "needs at least one operand".into())
        };
        let axis = first.resolve_axis("concatenate", axis);
        Tensor::concatenate(tensors, axis)
    }

    /// `jnp.stack(tensors, axis)`: equal shapes, joined along a new axis (`-1`: last).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], axis: impl Into<Axis>) -> Tensor {
        let Some(first) = tensors.first() else {
            fail("stack", "needs at least one operand".into())
        };
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            fail(
                "stack",
                format!(
                    "operands must have equal shapes, got {} and {}",
                    first.ty(),
                    t.ty()
                ),
            );
        }
        // The new axis counts in the result's rank (rank + 1), as NumPy's.
        let axis = new_axis("stack", axis.into(), first);
        let joined = join(tensors);
        let expanded: Vec<Tensor> = joined.iter().map(|t| t.expand_dims(axis)).collect();
        let refs: Vec<&Tensor> = expanded.iter().collect();
        Tensor::concatenate(&refs, axis)
    }

    /// `jnp.expand_dims(x, axis)`: a size-1 dim inserted at `axis` of the result (`-1`: last).
    #[track_caller]
    pub fn expand_dims(&self, axis: impl Into<Axis>) -> Tensor {
        let a = new_axis("expand_dims", axis.into(), self);
        let mut shape = self.shape().to_vec();
        shape.insert(a, 1);
        self.reshape(shape)
    }

    /// `jnp.squeeze(x, axes)`: removes the given size-1 dims (an error if one is not size 1).
    #[track_caller]
    pub fn squeeze(&self, axes: impl Into<AxisList>) -> Tensor {
        let (axes, _) = self.resolve_axes("squeeze", axes);
        if let Some(&d) = axes.iter().find(|&&d| self.shape()[d] != 1) {
            fail(
                "squeeze",
                format!(
                    "dim {d} has size {}, not 1 (operand: {})",
                    self.shape()[d],
                    self.ty()
                ),
            );
        }
        let shape: Vec<usize> = (0..self.rank())
            .filter(|d| !axes.contains(d))
            .map(|d| self.shape()[d])
            .collect();
        self.reshape(shape)
    }

    /// Removes every size-1 dim (`jnp.squeeze(x)` with no axis).
    #[track_caller]
    pub fn squeeze_all(&self) -> Tensor {
        let shape: Vec<usize> = self.shape().iter().copied().filter(|&d| d != 1).collect();
        self.reshape(shape)
    }

    /// `jnp.moveaxis(x, source, destination)`.
    #[track_caller]
    pub fn moveaxis(&self, source: impl Into<Axis>, destination: impl Into<Axis>) -> Tensor {
        let s = self.resolve_axis("moveaxis", source);
        let d = self.resolve_axis("moveaxis", destination);
        let mut perm: Vec<usize> = (0..self.rank()).filter(|&x| x != s).collect();
        perm.insert(d, s);
        self.transpose(&perm)
    }

    /// `jnp.swapaxes(x, a, b)`.
    #[track_caller]
    pub fn swapaxes(&self, a: impl Into<Axis>, b: impl Into<Axis>) -> Tensor {
        let a = self.resolve_axis("swapaxes", a);
        let b = self.resolve_axis("swapaxes", b);
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.transpose(&perm)
    }

    /// `jnp.split(x, n or indices, axis)`: `n` equal parts (an error if the dim does not
    /// divide), or the pieces between the sorted `indices` (clamped to the dim, as NumPy).
    #[track_caller]
    pub fn split(&self, how: impl Into<Split>, axis: impl Into<Axis>) -> Vec<Tensor> {
        let axis = self.resolve_axis("split", axis);
        let n = self.shape()[axis];
        let cuts: Vec<usize> = match how.into() {
            Split::Sections(0) => fail(
                "split",
                format!("0 sections is not a split (operand: {})", self.ty()),
            ),
            Split::Sections(k) => {
                if !n.is_multiple_of(k) {
                    fail(
                        "split",
                        format!(
                            "dim {axis} of size {n} does not divide into {k} equal sections \
                             (operand: {})",
                            self.ty()
                        ),
                    );
                }
                (1..k).map(|i| i * (n / k)).collect()
            }
            Split::Indices(ix) => ix.iter().map(|&i| i.min(n)).collect(),
        };
        let mut bounds = vec![0];
        bounds.extend(cuts);
        bounds.push(n);
        bounds
            .windows(2)
            .map(|w| {
                let (lo, hi) = (w[0], w[1].max(w[0]));
                let mut start = vec![0; self.rank()];
                let mut limit = self.shape().to_vec();
                start[axis] = lo;
                limit[axis] = hi;
                self.slice(&start, &limit)
            })
            .collect()
    }

    /// `jnp.roll(x, shift, axis)`: elements shifted along `axis`, wrapping around.
    #[track_caller]
    pub fn roll(&self, shift: i64, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("roll", axis);
        let n = self.shape()[axis];
        if n == 0 {
            return self.clone();
        }
        let s = shift.rem_euclid(n as i64) as usize;
        if s == 0 {
            return self.clone();
        }
        let parts = self.split(vec![n - s], axis);
        Tensor::concatenate(&[&parts[1], &parts[0]], axis)
    }

    /// `jnp.tile(x, reps)`: the tensor repeated `reps[i]` times along dim `i` (`reps` aligned
    /// at the right, as NumPy).
    #[track_caller]
    pub fn tile(&self, reps: &[usize]) -> Tensor {
        let rank = self.rank().max(reps.len());
        let mut shape = vec![1; rank - self.rank()];
        shape.extend_from_slice(self.shape());
        let mut r = vec![1; rank - reps.len()];
        r.extend_from_slice(reps);
        // [.., d, ..] -> broadcast [.., r, d, ..] -> reshape [.., r*d, ..].
        let x = self.reshape(shape.clone());
        let mut big = Vec::with_capacity(2 * rank);
        let mut dims = Vec::with_capacity(rank);
        for (i, (&d, &k)) in shape.iter().zip(&r).enumerate() {
            big.push(k);
            big.push(d);
            dims.push(2 * i + 1);
        }
        let out: Vec<usize> = shape.iter().zip(&r).map(|(&d, &k)| d * k).collect();
        checked_numel("tile", &big, self);
        x.broadcast_in_dim(big, &dims).reshape(out)
    }

    /// `jnp.repeat(x, repeats, axis)`: each element repeated `repeats` times along `axis`.
    #[track_caller]
    pub fn repeat(&self, repeats: usize, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("repeat", axis);
        let mut big = self.shape().to_vec();
        big.insert(axis + 1, repeats);
        checked_numel("repeat", &big, self);
        let dims: Vec<usize> = (0..self.rank())
            .map(|d| if d <= axis { d } else { d + 1 })
            .collect();
        let mut out = self.shape().to_vec();
        out[axis] *= repeats;
        self.broadcast_in_dim(big, &dims).reshape(out)
    }

    /// `jnp.eye(n, m, k)`: ones on the `k`-th diagonal (`k > 0` above the main one).
    #[track_caller]
    pub fn eye(n: usize, m: usize, k: i64, dtype: DType) -> Tensor {
        let mask = diagonal_mask("eye", n, m, k, |i, j| i.eq(j));
        Tensor::select(
            &mask,
            &Tensor::full_dtype([n, m], 1.0, dtype),
            &Tensor::full_dtype([n, m], 0.0, dtype),
        )
    }

    /// `jnp.tril(x, k)`: the last two dims with elements above the `k`-th diagonal zeroed.
    #[track_caller]
    pub fn tril(&self, k: i64) -> Tensor {
        self.triangle("tril", k, |i, j| i.ge(j))
    }

    /// `jnp.triu(x, k)`: the last two dims with elements below the `k`-th diagonal zeroed.
    #[track_caller]
    pub fn triu(&self, k: i64) -> Tensor {
        self.triangle("triu", k, |i, j| i.le(j))
    }

    #[track_caller]
    fn triangle(&self, op: &str, k: i64, keep: impl Fn(&Tensor, &Tensor) -> Tensor) -> Tensor {
        if self.rank() < 2 {
            fail(op, format!("needs rank 2 or more (operand: {})", self.ty()));
        }
        let r = self.rank();
        let (n, m) = (self.shape()[r - 2], self.shape()[r - 1]);
        let mask = diagonal_mask(op, n, m, k, keep);
        let mask = mask.broadcast_to(self.shape());
        let x = &join(&[self, &mask])[0];
        Tensor::select(&mask, x, &x.zeros_like())
    }
}

/// `[n, m]` bool: `rel(i + k, j)` for row `i`, column `j` (rows shifted by the diagonal
/// offset `k`), computed in i64-free i32 when it fits, else an error naming `op`.
#[track_caller]
fn diagonal_mask(
    op: &str,
    n: usize,
    m: usize,
    k: i64,
    rel: impl Fn(&Tensor, &Tensor) -> Tensor,
) -> Tensor {
    let fits = |v: Option<i64>| v.is_some_and(|v| i32::try_from(v).is_ok());
    let reach = k.checked_abs().and_then(|a| a.checked_add(n as i64));
    if !fits(reach) || !fits(Some(m as i64)) {
        fail(
            op,
            format!("dims {n}x{m} with diagonal offset {k} exceed i32 index arithmetic"),
        );
    }
    let i = Tensor::iota(DType::I32, [n, m], 0);
    let j = Tensor::iota(DType::I32, [n, m], 1);
    let shifted = i.add(&Tensor::full_dtype([n, m], k as f64, DType::I32));
    rel(&shifted, &j)
}

/// A signed axis of a result one rank higher than `t` (a new dim's position).
#[track_caller]
fn new_axis(op: &str, Axis(a): Axis, t: &Tensor) -> usize {
    let r = t.rank() as i64 + 1;
    if !(-r..r).contains(&a) {
        fail(
            op,
            format!(
                "axis {a} is out of range for a result of rank {r} (operand: {})",
                t.ty()
            ),
        );
    }
    (if a < 0 { a + r } else { a }) as usize
}

#[track_caller]
fn checked_numel(op: &str, shape: &[usize], t: &Tensor) {
    if shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .is_none()
    {
        fail(
            op,
            format!(
                "the result of {shape:?} elements overflows (operand: {})",
                t.ty()
            ),
        );
    }
}
