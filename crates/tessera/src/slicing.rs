//! NumPy-style indexing: `x.index(s![.., 2..5, idx])`, as `x[:, 2:5, idx]` in JAX.
//!
//! Each entry of `s![..]` indexes one dim, in order; dims left over are taken whole:
//! - `..`, `a..b`, `a..`, `..b`, `a..=b` (negative bounds count from the end and clamp, as
//!   Python slices do), `stride(range, k)` for every `k`-th element;
//! - an integer (`2`, `-1`): that element, the dim dropped; out of range is an error (JAX raises
//!   `IndexError` for a static index);
//! - an integer tensor: JAX's `take` along the dim (a gather; negative indices wrap, an index past
//!   the end gives the fill value). At most one per `index` call.
//!
//! As in NumPy, the dims an integer tensor brings go where it stands, unless an integer entry is
//! separated from it by a slice: then they go first.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo};
use std::panic::Location;

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;

/// One entry of an index expression (`s![..]` builds them).
#[derive(Clone, Debug)]
pub enum Index {
    /// Elements `start..stop` (each `None` for the dim's end, negatives from the end), every
    /// `step`-th.
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: usize,
    },
    /// One element; the dim is dropped.
    At(i64),
    /// An integer tensor of indices (`take`).
    Array(Tensor),
}

/// A value usable as one entry of `s![..]`.
pub trait IntoIndex {
    fn into_index(self) -> Index;
}

impl IntoIndex for Index {
    fn into_index(self) -> Index {
        self
    }
}

impl IntoIndex for RangeFull {
    fn into_index(self) -> Index {
        Index::Slice {
            start: None,
            stop: None,
            step: 1,
        }
    }
}

impl IntoIndex for Tensor {
    fn into_index(self) -> Index {
        Index::Array(self)
    }
}

impl IntoIndex for &Tensor {
    fn into_index(self) -> Index {
        Index::Array(self.clone())
    }
}

/// An index bound as i64, saturating: a `usize` past `i64::MAX` is past every dim's end (a
/// wrapping `as` would make it -1, the last element).
fn sat<T: TryInto<i64>>(x: T) -> i64 {
    x.try_into().unwrap_or(i64::MAX)
}

macro_rules! int_indices {
    ($($t:ty),*) => {$(
        impl IntoIndex for $t {
            fn into_index(self) -> Index {
                Index::At(sat(self))
            }
        }
        impl IntoIndex for Range<$t> {
            fn into_index(self) -> Index {
                Index::Slice { start: Some(sat(self.start)), stop: Some(sat(self.end)), step: 1 }
            }
        }
        impl IntoIndex for RangeFrom<$t> {
            fn into_index(self) -> Index {
                Index::Slice { start: Some(sat(self.start)), stop: None, step: 1 }
            }
        }
        impl IntoIndex for RangeTo<$t> {
            fn into_index(self) -> Index {
                Index::Slice { start: None, stop: Some(sat(self.end)), step: 1 }
            }
        }
        impl IntoIndex for RangeInclusive<$t> {
            fn into_index(self) -> Index {
                let (a, b) = self.into_inner();
                // `..=-1` is to the end, as `a:` in Python.
                let stop = sat(b).checked_add(1).filter(|&s| s != 0);
                Index::Slice { start: Some(sat(a)), stop, step: 1 }
            }
        }
    )*};
}
int_indices!(i32, i64, isize, usize, u32);

/// Every `step`-th element of `range` (`a:b:step`); `step` must be positive.
pub fn stride(range: impl IntoIndex, step: usize) -> Index {
    match range.into_index() {
        Index::Slice { start, stop, .. } => Index::Slice { start, stop, step },
        other => other,
    }
}

/// `s![.., 2..5, idx]`: an index expression for [`Tensor::index`].
#[macro_export]
macro_rules! s {
    ($($e:expr),* $(,)?) => {
        vec![$($crate::slicing::IntoIndex::into_index($e)),*]
    };
}

#[track_caller]
fn fail(message: String) -> ! {
    raise(Error::Op {
        op: "index".into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// A Python slice bound resolved against a dim of `n`: negatives from the end, clamped.
fn bound(b: Option<i64>, n: usize, default: usize) -> usize {
    match b {
        None => default,
        Some(b) if b < 0 => (n as i128 + b as i128).max(0) as usize,
        Some(b) => (b as u128).min(n as u128) as usize,
    }
}

impl Tensor {
    /// `x[idx]` with NumPy's rules (see the module doc), e.g. `x.index(s![.., 1..-1, 0])`.
    #[track_caller]
    pub fn index(&self, idx: Vec<Index>) -> Tensor {
        let shape = self.shape().to_vec();
        if idx.len() > shape.len() {
            fail(format!(
                "{} entries index a tensor of shape {shape:?} ({} dims)",
                idx.len(),
                shape.len()
            ));
        }
        let r = shape.len();
        let (mut start, mut limit, mut step) = (vec![0; r], shape.clone(), vec![1; r]);
        let mut dropped = Vec::new();
        let mut array: Option<(usize, Tensor)> = None;
        for (d, e) in idx.into_iter().enumerate() {
            let n = shape[d];
            match e {
                Index::Slice {
                    start: a,
                    stop: b,
                    step: k,
                } => {
                    if k == 0 {
                        fail(format!("slice step 0 along dim {d} of shape {shape:?}"));
                    }
                    start[d] = bound(a, n, 0);
                    limit[d] = bound(b, n, n).max(start[d]);
                    step[d] = k;
                }
                Index::At(i) => {
                    let j = if i < 0 {
                        n as i128 + i as i128
                    } else {
                        i as i128
                    };
                    if j < 0 || j >= n as i128 {
                        fail(format!(
                            "index {i} is out of bounds for dim {d} of shape {shape:?}"
                        ));
                    }
                    start[d] = j as usize;
                    limit[d] = j as usize + 1;
                    dropped.push(d);
                }
                Index::Array(t) => {
                    if array.is_some() {
                        fail(format!(
                            "more than one integer-tensor index into shape {shape:?}: use \
                             `gather` for several"
                        ));
                    }
                    array = Some((d, t));
                }
            }
        }
        let full = (0..r).all(|d| start[d] == 0 && limit[d] == shape[d] && step[d] == 1);
        let mut x = if full {
            self.clone()
        } else {
            self.slice_strided(&start, &limit, &step)
        };
        let Some((t, ids)) = array else {
            return if dropped.is_empty() {
                x
            } else {
                x.squeeze(dropped)
            };
        };
        let k = ids.rank();
        x = x.take(&ids, t);
        // The dropped dims after the array's moved by its rank, less the dim it replaced.
        let moved: Vec<usize> = dropped
            .iter()
            .map(|&a| if a > t { a + k - 1 } else { a })
            .collect();
        if !moved.is_empty() {
            x = x.squeeze(moved);
        }
        // NumPy: the advanced indices (the array and the integers) not side by side put the
        // array's dims first.
        let lo = dropped.iter().copied().chain([t]).min().unwrap_or(t);
        let hi = dropped.iter().copied().chain([t]).max().unwrap_or(t);
        let adjacent = hi - lo == dropped.len();
        let at = t - dropped.iter().filter(|&&a| a < t).count();
        if !dropped.is_empty() && !adjacent && at > 0 {
            let rank = x.rank();
            let perm: Vec<usize> = (at..at + k).chain(0..at).chain(at + k..rank).collect();
            x = x.transpose(&perm);
        }
        x
    }
}
