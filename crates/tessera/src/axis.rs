//! Axis arguments as JAX takes them: signed (`-1` is the last axis), one or several, and for
//! reductions a `keepdims` flag.
//!
//! Every axis-taking method of `Tensor` accepts `impl Into<Axis>` (one axis: `0`, `-1`, a
//! `usize` variable) or `impl Into<AxisList>` (several: `-1`, `[0, 2]`, `&[1, -1]`, a
//! `Vec<usize>`, [`keepdims`]`(-1)`), and resolves it against its rank with
//! [`Tensor::resolve_axis`] / [`Tensor::resolve_axes`], which name the op, the rank and the
//! caller's line when an axis is out of range or repeated.

use std::panic::Location;

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;

/// One axis, counted from the front (`0..rank`) or, when negative, from the back (`-rank..0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis(pub i64);

macro_rules! axis_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Axis {
            fn from(a: $t) -> Axis {
                // Every value of these types fits i64 except usize/u64 above i64::MAX, which
                // no rank reaches: saturate so that it is reported as out of range.
                Axis(i64::try_from(a).unwrap_or(i64::MAX))
            }
        }
    )*};
}
axis_from!(i32, i64, isize, usize, u32, u64);

/// Several axes (`None`: every axis) and whether a reduction keeps them as size-1 dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisList {
    /// The axes, signed as given (`None`: every axis); resolved against the rank by
    /// [`Tensor::resolve_axes`].
    pub axes: Option<Vec<i64>>,
    /// Whether a reduction keeps the reduced axes as size-1 dims (`keepdims=True`).
    pub keepdims: bool,
}

impl AxisList {
    /// Every axis of the operand.
    pub fn all() -> AxisList {
        AxisList {
            axes: None,
            keepdims: false,
        }
    }

    /// The same axes, kept as size-1 dims by a reduction (`keepdims=True`).
    pub fn keepdims(mut self) -> AxisList {
        self.keepdims = true;
        self
    }
}

/// `axes` kept as size-1 dims: `x.sum_axes(keepdims(-1))` is `jnp.sum(x, -1, keepdims=True)`.
pub fn keepdims(axes: impl Into<AxisList>) -> AxisList {
    axes.into().keepdims()
}

fn list<T: Into<Axis> + Copy>(axes: &[T]) -> AxisList {
    AxisList {
        axes: Some(axes.iter().map(|&a| a.into().0).collect()),
        keepdims: false,
    }
}

macro_rules! axis_list_from {
    ($($t:ty),*) => {$(
        impl From<$t> for AxisList {
            fn from(a: $t) -> AxisList {
                AxisList { axes: Some(vec![Axis::from(a).0]), keepdims: false }
            }
        }
        impl From<&[$t]> for AxisList {
            fn from(a: &[$t]) -> AxisList { list(a) }
        }
        impl<const N: usize> From<[$t; N]> for AxisList {
            fn from(a: [$t; N]) -> AxisList { list(&a) }
        }
        impl<const N: usize> From<&[$t; N]> for AxisList {
            fn from(a: &[$t; N]) -> AxisList { list(a) }
        }
        impl From<Vec<$t>> for AxisList {
            fn from(a: Vec<$t>) -> AxisList { list(&a) }
        }
        impl From<&Vec<$t>> for AxisList {
            fn from(a: &Vec<$t>) -> AxisList { list(a) }
        }
    )*};
}
axis_list_from!(i32, i64, isize, usize);

impl From<Axis> for AxisList {
    fn from(a: Axis) -> AxisList {
        AxisList {
            axes: Some(vec![a.0]),
            keepdims: false,
        }
    }
}

impl Tensor {
    /// `axis` as an index into this tensor's dims, or an error naming `op`, the rank and the
    /// caller's line.
    #[track_caller]
    pub fn resolve_axis(&self, op: &str, axis: impl Into<Axis>) -> usize {
        let Axis(a) = axis.into();
        resolve(op, a, self.rank(), self, Location::caller())
    }

    /// `axes` as sorted, distinct indices into this tensor's dims (every dim for
    /// [`AxisList::all`]), and the `keepdims` flag.
    #[track_caller]
    pub fn resolve_axes(&self, op: &str, axes: impl Into<AxisList>) -> (Vec<usize>, bool) {
        let list = axes.into();
        let loc = Location::caller();
        let mut out: Vec<usize> = match &list.axes {
            None => (0..self.rank()).collect(),
            Some(v) => v
                .iter()
                .map(|&a| resolve(op, a, self.rank(), self, loc))
                .collect(),
        };
        out.sort_unstable();
        if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
            raise(Error::Op {
                op: op.into(),
                message: format!(
                    "axis {} is repeated in {:?} (operand: {})",
                    w[0],
                    list.axes.unwrap_or_default(),
                    self.ty()
                ),
                location: loc_text(loc),
            });
        }
        (out, list.keepdims)
    }
}

fn resolve(op: &str, a: i64, rank: usize, t: &Tensor, loc: &'static Location<'static>) -> usize {
    let r = rank as i64;
    if (-r..r).contains(&a) {
        (if a < 0 { a + r } else { a }) as usize
    } else {
        raise(Error::Op {
            op: op.into(),
            message: format!(
                "axis {a} is out of range for rank {rank} (valid: {}..{rank}; operand: {})",
                -r,
                t.ty()
            ),
            location: loc_text(loc),
        })
    }
}
