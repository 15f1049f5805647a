//! Indexing front ends over the `gather` and `scatter` primitives (as `jax.numpy`'s indexing
//! over `lax.gather`/`lax.scatter`), so gradients, batching and sharding come from the
//! primitives' rules: `take`, `take_along_axis`, `at(idx).get/set/add/mul/min/max`, `dynamic_slice`,
//! `dynamic_update_slice` and `one_hot`.
//!
//! Out-of-bounds behavior is JAX's defaults (checked against jax 0.10.2 by
//! `tests/fixtures/gather`): a negative index counts from the end; `take` fills a slice at an index
//! still out of range (NaN for floats), `at().get()` clamps it; an update (`at().set()`, ...) drops it;
//! `dynamic_slice`/`dynamic_update_slice` clamp the start so the window fits; `one_hot` gives a
//! zero row for a label out of range.

use std::panic::Location;

use tessera_ir::{DType, GatherDims, IndexMode, Op, ScatterDims, ScatterKind};

use crate::axis::Axis;
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

/// Integer indices with negative ones counted from the end of a dim of size `n`.
#[track_caller]
fn normalized(op: &str, idx: &Tensor, n: usize) -> Tensor {
    match idx.dtype() {
        DType::U32 => idx.clone(),
        DType::I32 => {
            let n = i32::try_from(n).unwrap_or(i32::MAX);
            let neg = idx.lt(&idx.scalar_like(0.0));
            let wrapped = idx.add(&idx.scalar_like(f64::from(n)));
            Tensor::select(&neg, &wrapped, idx)
        }
        d => fail(
            op,
            format!(
                "indices must be i32 or u32, got {d} (shape {:?})",
                idx.shape()
            ),
        ),
    }
}

/// A pending indexed update or read of `x` at `idx` along dim 0 (`x.at[idx]` in JAX). Updates
/// return a new tensor; an index out of range after wrapping negatives is dropped (JAX's
/// default for scatters), and `v` of another dtype than `x` panics.
///
/// ```
/// use tessera::prelude::*;
///
/// let idx = Tensor::from_vec(vec![0i32, 2, 2, -1], [4]);
/// let y = Tensor::zeros([3]).at(&idx).add(&Tensor::ones([4]));
/// assert_eq!(y.to_vec::<f32>(), vec![1.0, 0.0, 3.0]); // -1 is the last row
/// assert_eq!(y.at(&idx).get().to_vec::<f32>(), vec![1.0, 3.0, 3.0, 3.0]);
/// ```
pub struct At<'a> {
    x: &'a Tensor,
    idx: Tensor,
}

impl Tensor {
    /// The elements of `self` at `idx` along `axis` (`jnp.take`: an index out of range after wrapping negatives gives a slice of JAX's fill, NaN for floats): the result's shape
    /// is `shape[..axis] + idx.shape + shape[axis+1..]`.
    #[track_caller]
    pub fn take(&self, idx: &Tensor, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("take", axis);
        let idx = normalized("take", idx, self.shape()[axis]);
        self.take_mode(&idx, axis, IndexMode::Fill)
    }

    #[track_caller]
    fn take_mode(&self, idx: &Tensor, axis: usize, mode: IndexMode) -> Tensor {
        let n = self.shape()[axis];
        if n == 0 && idx.ty().numel() > 0 {
            fail(
                "take",
                format!(
                    "cannot take {} indices from the empty axis {axis} of shape {:?}",
                    idx.ty().numel(),
                    self.shape()
                ),
            );
        }
        let (r, k) = (self.rank(), idx.rank());
        if n == 0 {
            // No index to take from an empty axis (refused above unless there is none): the
            // empty result, as JAX gives (the gather's type rule refuses a slice of an empty
            // dim).
            let mut shape = self.shape()[..axis].to_vec();
            shape.extend_from_slice(idx.shape());
            shape.extend_from_slice(&self.shape()[axis + 1..]);
            return Tensor::full_dtype(shape, 0.0, self.dtype());
        }
        let mut slice_sizes = self.shape().to_vec();
        slice_sizes[axis] = 1;
        let offset_dims: Vec<usize> = (0..axis).chain(axis + k..r - 1 + k).collect();
        let d = GatherDims {
            offset_dims,
            collapsed_slice_dims: vec![axis],
            start_index_map: vec![axis],
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            index_vector_dim: k,
            slice_sizes,
            mode,
            fill: tessera_ir::gather::default_fill(self.dtype()),
        };
        let j = join(&[self, idx]);
        apply(Op::Gather(Box::new(d)), &[&j[0], &j[1]])
    }

    /// `jnp.take_along_axis(self, idx, axis)`: for every position of `idx` (of `self`'s rank),
    /// the element of `self` at that index along `axis` and at the same position along the
    /// other dims, which broadcast between the two (NumPy's rules, as JAX). The result has
    /// `idx`'s extent along `axis`. Negative indices count from the end; one still out of
    /// range gives JAX's fill (NaN for floats). A gather with every other dim a batching dim.
    #[track_caller]
    pub fn take_along_axis(&self, idx: &Tensor, axis: impl Into<Axis>) -> Tensor {
        let op = "take_along_axis";
        let r = self.rank();
        if idx.rank() != r {
            fail(
                op,
                format!(
                    "indices {} must have the rank of the operand {}",
                    idx.ty(),
                    self.ty()
                ),
            );
        }
        let axis = self.resolve_axis(op, axis);
        let mut common = Vec::with_capacity(r);
        for d in 0..r {
            let (a, b) = (self.shape()[d], idx.shape()[d]);
            common.push(match (a, b) {
                _ if d == axis || a == b => a,
                (1, b) => b,
                (a, 1) => a,
                _ => fail(
                    op,
                    format!(
                        "dim {d} of the operand {} and of the indices {} cannot broadcast",
                        self.ty(),
                        idx.ty()
                    ),
                ),
            });
        }
        let x = self.broadcast_to(&common);
        common[axis] = idx.shape()[axis];
        let i = idx.broadcast_to(&common);
        let n = x.shape()[axis];
        if n == 0 && i.ty().numel() > 0 {
            fail(
                op,
                format!(
                    "cannot take {} indices from the empty axis {axis} of {}",
                    i.ty().numel(),
                    self.ty()
                ),
            );
        }
        if i.ty().numel() == 0 {
            // No element to take (the gather's type rule would refuse a batching dim of size
            // 0): the empty result, as JAX gives.
            return Tensor::full_dtype(i.shape().to_vec(), 0.0, self.dtype());
        }
        let i = normalized(op, &i, n);
        let batch: Vec<usize> = (0..r).filter(|&d| d != axis).collect();
        let d = GatherDims {
            offset_dims: vec![],
            collapsed_slice_dims: vec![axis],
            start_index_map: vec![axis],
            operand_batching_dims: batch.clone(),
            start_indices_batching_dims: batch,
            index_vector_dim: r,
            slice_sizes: vec![1; r],
            mode: IndexMode::Fill,
            fill: tessera_ir::gather::default_fill(self.dtype()),
        };
        let j = join(&[&x, &i]);
        apply(Op::Gather(Box::new(d)), &[&j[0], &j[1]])
    }

    /// `x.at[idx]`: reads and updates of the rows `idx` (dim 0).
    #[track_caller]
    pub fn at(&self, idx: &Tensor) -> At<'_> {
        if self.rank() == 0 {
            fail("at", "cannot index a scalar".into());
        }
        At {
            x: self,
            idx: normalized("at", idx, self.shape()[0]),
        }
    }

    /// The `sizes` window at `starts` (one i32/u32 scalar per dim), each start clamped so the
    /// window fits (`lax.dynamic_slice`).
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[Tensor], sizes: &[usize]) -> Tensor {
        let r = self.rank();
        if starts.len() != r || sizes.len() != r {
            fail(
                "dynamic_slice",
                format!(
                    "needs one start and one size per dim of shape {:?}, got {} starts and sizes \
                     {sizes:?}",
                    self.shape(),
                    starts.len()
                ),
            );
        }
        if let Some(d) = (0..r).find(|&d| sizes[d] > self.shape()[d]) {
            fail(
                "dynamic_slice",
                format!(
                    "size {} of dim {d} is larger than the dim of shape {:?}",
                    sizes[d],
                    self.shape()
                ),
            );
        }
        let idx = start_vector("dynamic_slice", starts, self.shape());
        let d = GatherDims {
            offset_dims: (0..r).collect(),
            collapsed_slice_dims: vec![],
            start_index_map: (0..r).collect(),
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            index_vector_dim: 0,
            slice_sizes: sizes.to_vec(),
            mode: IndexMode::Clip,
            fill: 0.0,
        };
        let j = join(&[self, &idx]);
        apply(Op::Gather(Box::new(d)), &[&j[0], &j[1]])
    }

    /// `self` with `update` written at `starts`, each clamped so the update fits
    /// (`lax.dynamic_update_slice`).
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[Tensor]) -> Tensor {
        let r = self.rank();
        if starts.len() != r
            || update.rank() != r
            || update.dtype() != self.dtype()
            || (0..r).any(|d| update.shape()[d] > self.shape()[d])
        {
            fail(
                "dynamic_update_slice",
                format!(
                    "needs an update of {} and rank {r} no larger than shape {:?} and {r} \
                     starts, got {} and {} starts",
                    self.dtype(),
                    self.shape(),
                    update.ty(),
                    starts.len()
                ),
            );
        }
        let idx = start_vector("dynamic_update_slice", starts, self.shape());
        let d = ScatterDims {
            kind: ScatterKind::Set,
            update_window_dims: (0..r).collect(),
            inserted_window_dims: vec![],
            scatter_dims_to_operand_dims: (0..r).collect(),
            input_batching_dims: vec![],
            scatter_indices_batching_dims: vec![],
            index_vector_dim: 0,
            mode: IndexMode::Clip,
        };
        let j = join(&[self, &idx, update]);
        apply(Op::Scatter(Box::new(d)), &[&j[0], &j[1], &j[2]])
    }

    /// `jax.nn.one_hot(self, n)`: an f32 tensor of shape `shape + [n]` with a 1 where the last
    /// index equals the label; a label out of `0..n` gives a zero row.
    #[track_caller]
    pub fn one_hot(&self, n: usize) -> Tensor {
        if !matches!(self.dtype(), DType::I32 | DType::U32 | DType::I64) {
            fail(
                "one_hot",
                format!("labels must be i32, u32 or i64, got {}", self.ty()),
            );
        }
        let mut shape = self.shape().to_vec();
        shape.push(n);
        // Checked here, so that the error names one_hot rather than the iota it builds.
        if let Err(e) = tessera_ir::TensorType::new(DType::F32, shape.clone()).check_size() {
            fail(
                "one_hot",
                format!("{n} classes for labels {}: {e}", self.ty()),
            );
        }
        let classes = Tensor::iota(self.dtype(), shape.clone(), self.rank());
        let labels = self.expand_dims(-1).broadcast_to(&shape);
        labels.eq(&classes).astype(DType::F32)
    }
}

/// The start scalars as one i32 vector (u32 starts above `i32::MAX` clamp the same way).
#[track_caller]
fn start_vector(op: &str, starts: &[Tensor], dims: &[usize]) -> Tensor {
    // A loop, not a closure: errors and ops report the caller's line.
    let mut parts: Vec<Tensor> = Vec::with_capacity(starts.len());
    for (s, &n) in starts.iter().zip(dims) {
        if s.rank() != 0 || !matches!(s.dtype(), DType::I32 | DType::U32 | DType::I64) {
            fail(
                op,
                format!(
                    "each start must be an i32, u32 or i64 scalar, got {}",
                    s.ty()
                ),
            );
        }
        let s = match s.dtype() {
            // Clamp into i32 first: every start above i32::MAX clamps to the last window.
            DType::U32 => s
                .minimum(&s.scalar_like(f64::from(i32::MAX)))
                .astype(DType::I32),
            DType::I64 => normalized(
                op,
                &s.minimum(&s.scalar_like(f64::from(i32::MAX)))
                    .maximum(&s.scalar_like(f64::from(i32::MIN)))
                    .astype(DType::I32),
                n,
            ),
            // A negative start counts from the end, as in JAX.
            _ => normalized(op, s, n),
        };
        parts.push(s.reshape(vec![1]));
    }
    if parts.is_empty() {
        return Tensor::full_dtype(vec![0], 0.0, DType::I32);
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Tensor::concat(&refs, 0)
}

impl At<'_> {
    #[track_caller]
    fn scatter(&self, kind: ScatterKind, v: &Tensor) -> Tensor {
        let x = self.x;
        let k = self.idx.rank();
        let mut shape = self.idx.shape().to_vec();
        shape.extend_from_slice(&x.shape()[1..]);
        if v.dtype() != x.dtype() {
            fail(
                kind.name(),
                format!("updates of {} into {}", v.ty(), x.ty()),
            );
        }
        let v = v.broadcast_to(&shape);
        let d = ScatterDims {
            kind,
            update_window_dims: (k..k + x.rank() - 1).collect(),
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![0],
            input_batching_dims: vec![],
            scatter_indices_batching_dims: vec![],
            index_vector_dim: k,
            mode: IndexMode::Fill,
        };
        let j = join(&[x, &self.idx, &v]);
        apply(Op::Scatter(Box::new(d)), &[&j[0], &j[1], &j[2]])
    }

    /// The rows at the indices (clamped, as `x.at[idx].get()` and `x[idx]`).
    #[track_caller]
    pub fn get(&self) -> Tensor {
        self.x.take_mode(&self.idx, 0, IndexMode::Clip)
    }

    /// Rows replaced by `v` (broadcast); for a repeated index the last update wins.
    #[track_caller]
    pub fn set(&self, v: &Tensor) -> Tensor {
        self.scatter(ScatterKind::Set, v)
    }

    /// Rows incremented by `v` (broadcast); repeated indices accumulate (`x.at[idx].add(v)`).
    #[track_caller]
    pub fn add(&self, v: &Tensor) -> Tensor {
        self.scatter(ScatterKind::Add, v)
    }

    /// Rows multiplied by `v` (broadcast); repeated indices multiply (`x.at[idx].multiply(v)`).
    #[track_caller]
    pub fn mul(&self, v: &Tensor) -> Tensor {
        self.scatter(ScatterKind::Mul, v)
    }

    /// Rows replaced by their elementwise minimum with `v` (broadcast; `x.at[idx].min(v)`).
    #[track_caller]
    pub fn min(&self, v: &Tensor) -> Tensor {
        self.scatter(ScatterKind::Min, v)
    }

    /// Rows replaced by their elementwise maximum with `v` (broadcast; `x.at[idx].max(v)`).
    #[track_caller]
    pub fn max(&self, v: &Tensor) -> Tensor {
        self.scatter(ScatterKind::Max, v)
    }
}
