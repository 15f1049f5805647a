//! Sorting, cumulative ops and flipping, as `jax.lax`/`jax.numpy` have them: `sort`,
//! `argsort`, `sort_multiple`, `sort_key_val`, `top_k`, `cumsum`/`cumprod`/`cummax`/`cummin`
//! (and `cumulative` with a `reverse` flag), `flip`. Each is a `sort`, cumulative or `rev`
//! primitive (see `tessera_ir::sorting`), or a few of them, so gradients, batching and sharding
//! come from the primitives' rules.

use std::panic::Location;

use tessera_ir::{CumulativeKind, DType, Op};

use crate::axis::{Axis, AxisList};
use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::{apply, join};

#[track_caller]
fn fail(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

impl Tensor {
    /// `lax.sort` of several same-shaped operands along `axis`, stably, lexicographically over
    /// the first `num_keys`: every operand, permuted the same way. Floats sort as JAX sorts
    /// them: -0 equals +0, NaNs last.
    #[track_caller]
    pub fn sort_multiple(
        operands: &[&Tensor],
        axis: impl Into<Axis>,
        num_keys: usize,
    ) -> Vec<Tensor> {
        let Some(first) = operands.first() else {
            fail("sort", "needs at least one operand".into())
        };
        let dim = first.resolve_axis("sort", axis);
        if num_keys == 0 || num_keys > operands.len() {
            fail(
                "sort",
                format!(
                    "num_keys {num_keys} must be in 1..={} (the operand count)",
                    operands.len()
                ),
            );
        }
        let joined = join(operands);
        let refs: Vec<&Tensor> = joined.iter().collect();
        // A loop, not a closure: each node records the caller's line.
        let mut out = Vec::with_capacity(operands.len());
        for output in 0..operands.len() {
            let op = Op::Sort {
                dim,
                num_keys,
                output,
            };
            out.push(apply(op, &refs));
        }
        out
    }

    /// `jnp.sort(x, axis)` (stable; -0 equals +0, NaNs last).
    #[track_caller]
    pub fn sort(&self, axis: impl Into<Axis>) -> Tensor {
        let dim = self.resolve_axis("sort", axis);
        apply(
            Op::Sort {
                dim,
                num_keys: 1,
                output: 0,
            },
            &[self],
        )
    }

    /// `jnp.argsort(x, axis, stable=True)`: the i32 indices that sort `x` along `axis`.
    #[track_caller]
    pub fn argsort(&self, axis: impl Into<Axis>) -> Tensor {
        let dim = self.resolve_axis("argsort", axis);
        let iota = Tensor::iota(DType::I32, self.shape().to_vec(), dim);
        let joined = join(&[self, &iota]);
        apply(
            Op::Sort {
                dim,
                num_keys: 1,
                output: 1,
            },
            &[&joined[0], &joined[1]],
        )
    }

    /// `lax.sort_key_val(keys, values, axis)`: the keys sorted (stably) and the values
    /// permuted with them.
    #[track_caller]
    pub fn sort_key_val(keys: &Tensor, values: &Tensor, axis: impl Into<Axis>) -> (Tensor, Tensor) {
        let mut out = Tensor::sort_multiple(&[keys, values], axis, 1);
        let v = out.pop().expect("two results");
        let k = out.pop().expect("two results");
        (k, v)
    }

    /// `lax.top_k(x, k)`: the `k` largest elements along the last axis, in descending order,
    /// and their i32 indices; among equal elements the lower index comes first. NaNs rank
    /// highest and +0 above -0, as in JAX.
    #[track_caller]
    pub fn top_k(&self, k: usize) -> (Tensor, Tensor) {
        if self.rank() == 0 {
            fail(
                "top_k",
                format!("needs an operand of rank >= 1, got {}", self.ty()),
            );
        }
        let last = self.rank() - 1;
        let n = self.shape()[last];
        if k > n {
            fail(
                "top_k",
                format!("k = {k} is larger than the last axis of {}", self.ty()),
            );
        }
        if n > i32::MAX as usize {
            fail(
                "top_k",
                format!("the last axis of {} overflows i32 indices", self.ty()),
            );
        }
        // Ascending by (x, -index), then reversed: descending x, lower index first at ties.
        // As XLA's TopK, +0 ranks above -0: a middle key, whether 1/x is above zero, tells
        // them apart (equal keys are of one sign otherwise).
        let iota = Tensor::iota(DType::I32, self.shape().to_vec(), last);
        let neg = iota.neg();
        let sorted = if self.dtype().is_float() {
            let positive = self.scalar_like(1.0).div(self).gt(&self.scalar_like(0.0));
            let sign = positive.astype(DType::I32);
            let mut s = Tensor::sort_multiple(&[self, &sign, &neg, &iota], last as i64, 3);
            s.remove(1);
            s
        } else {
            Tensor::sort_multiple(&[self, &neg, &iota], last as i64, 2)
        };
        let mut limit = self.shape().to_vec();
        limit[last] = k;
        let start = vec![0; self.rank()];
        let take = |t: &Tensor| t.flip(last as i64).slice(&start, &limit);
        (take(&sorted[0]), take(&sorted[2]))
    }

    /// `lax.cumsum`/`cumprod`/`cummax`/`cummin` along `axis`, from the end when `reverse`.
    #[track_caller]
    pub fn cumulative(&self, kind: CumulativeKind, axis: impl Into<Axis>, reverse: bool) -> Tensor {
        let axis = self.resolve_axis(kind.name(), axis);
        apply(
            Op::Cumulative {
                kind,
                axis,
                reverse,
            },
            &[self],
        )
    }

    /// `jnp.cumsum(x, axis)`.
    #[track_caller]
    pub fn cumsum(&self, axis: impl Into<Axis>) -> Tensor {
        self.cumulative(CumulativeKind::Sum, axis, false)
    }

    /// `jnp.cumprod(x, axis)`.
    #[track_caller]
    pub fn cumprod(&self, axis: impl Into<Axis>) -> Tensor {
        self.cumulative(CumulativeKind::Prod, axis, false)
    }

    /// `lax.cummax(x, axis)`.
    #[track_caller]
    pub fn cummax(&self, axis: impl Into<Axis>) -> Tensor {
        self.cumulative(CumulativeKind::Max, axis, false)
    }

    /// `lax.cummin(x, axis)`.
    #[track_caller]
    pub fn cummin(&self, axis: impl Into<Axis>) -> Tensor {
        self.cumulative(CumulativeKind::Min, axis, false)
    }

    /// `jnp.flip(x, axes)`: reverses the order along each of `axes` (`AxisList::all()`: every
    /// axis), the `rev` primitive.
    #[track_caller]
    pub fn flip(&self, axes: impl Into<AxisList>) -> Tensor {
        let (dims, _) = self.resolve_axes("flip", axes);
        if dims.is_empty() {
            return self.clone();
        }
        apply(Op::Rev { dims }, &[self])
    }
}
