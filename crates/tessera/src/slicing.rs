//! NumPy-style indexing: `x.index(s![.., 2..5, idx])`, as `x[:, 2:5, idx]` in JAX.
//!
//! Each entry of `s![..]` indexes one dim, in order; dims left over are taken whole:
//! - `..`, `a..b`, `a..`, `..b`, `a..=b` (negative bounds count from the end and clamp, as
//!   Python slices do), `stride(range, k)` for every `k`-th element; a negative `k` walks
//!   backwards from the range's end (`stride(.., -1)` is `::-1`, `stride(5..1, -2)` is `5:1:-2`,
//!   with Python's bounds);
//! - an integer (`2`, `-1`): that element, the dim dropped; out of range is an error (JAX raises
//!   `IndexError` for a static index);
//! - an integer tensor: the elements at those indices along the dim (a gather; negative indices
//!   wrap, one still out of range is clamped, as JAX's `x[idx]` on CPU; `take` fills instead). Several integer tensors broadcast
//!   together and index their dims jointly, as NumPy's advanced indexing;
//! - `None` (NumPy's `newaxis`) inserts a dim of size 1; `...` stands for as many `..` as the
//!   dims the other entries leave (at most one).
//!
//! As in NumPy, the dims the integer tensors bring (their broadcast shape) go where they stand
//! when the advanced entries (tensors, and integers beside them) are side by side, else first.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo};
use std::panic::Location;

use tessera_ir::{DType, GatherDims, IndexMode, Op};

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::{apply, join};

/// One entry of an index expression (`s![..]` builds them).
#[derive(Clone, Debug)]
pub enum Index {
    /// Elements `start..stop` (each `None` for the dim's end in the step's direction,
    /// negatives from the end), every `step`-th (negative: backwards).
    Slice {
        /// The first element (`None`: the start in the step's direction).
        start: Option<i64>,
        /// One past the last element (`None`: the end in the step's direction).
        stop: Option<i64>,
        /// The stride; negative walks backwards, 0 panics.
        step: i64,
    },
    /// One element; the dim is dropped.
    At(i64),
    /// An integer tensor of indices.
    Array(Tensor),
    /// A new dim of size 1 (`None` in `s![..]`, NumPy's `newaxis`).
    NewAxis,
    /// `...` in `s![..]`: whole dims, as many as the other entries leave.
    Ellipsis,
}

/// A value usable as one entry of `s![..]`.
pub trait IntoIndex {
    /// This value as an index entry (a range as [`Index::Slice`], an integer as
    /// [`Index::At`], a tensor as [`Index::Array`]).
    fn into_index(self) -> Index;

    /// The entry taking every `step`-th element (`stride`); an integer or tensor ignores it.
    fn with_step(self, step: i64) -> Index
    where
        Self: Sized,
    {
        match self.into_index() {
            Index::Slice { start, stop, .. } => Index::Slice { start, stop, step },
            other => other,
        }
    }
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
                self.with_step(1)
            }
            fn with_step(self, step: i64) -> Index {
                let (a, b) = self.into_inner();
                // Through `b` in the step's direction: `..=-1` forwards is to the end (`a:`
                // in Python), `..=0` backwards to the beginning.
                let stop = if step > 0 {
                    sat(b).checked_add(1).filter(|&s| s != 0)
                } else {
                    sat(b).checked_sub(1).filter(|_| sat(b) != 0)
                };
                Index::Slice { start: Some(sat(a)), stop, step }
            }
        }
    )*};
}
int_indices!(i32, i64, isize, usize, u32);

/// Every `step`-th element of `range` (`a:b:step`); a negative `step` walks backwards from
/// `range`'s start (`stride(.., -1)` reverses). `step` must not be 0.
pub fn stride(range: impl IntoIndex, step: i64) -> Index {
    range.with_step(step)
}

/// `s![.., 2..5, idx]`: an index expression for [`Tensor::index`]. `None` is a new axis and
/// `...` an ellipsis, as in NumPy.
#[macro_export]
macro_rules! s {
    (@acc [$($done:expr),*]) => { vec![$($done),*] };
    (@acc [$($done:expr),*] ... $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($done,)* $crate::slicing::Index::Ellipsis] $($($rest)*)?)
    };
    (@acc [$($done:expr),*] None $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($done,)* $crate::slicing::Index::NewAxis] $($($rest)*)?)
    };
    (@acc [$($done:expr),*] $e:expr $(, $($rest:tt)*)?) => {
        $crate::s!(@acc [$($done,)* $crate::slicing::IntoIndex::into_index($e)] $($($rest)*)?)
    };
    ($($t:tt)*) => { $crate::s!(@acc [] $($t)*) };
}

#[track_caller]
fn fail(message: String) -> ! {
    raise(Error::Op {
        op: "index".into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// A Python slice bound resolved against a dim of `n` (positive step): negatives from the end,
/// clamped to `0..=n`.
fn bound(b: Option<i64>, n: usize, default: usize) -> usize {
    match b {
        None => default,
        Some(b) if b < 0 => (n as i128 + b as i128).max(0) as usize,
        Some(b) => (b as u128).min(n as u128) as usize,
    }
}

/// A bound of a backwards slice: negatives from the end, clamped to `-1..=n-1` (`-1`: before
/// the first element), as CPython's `PySlice_AdjustIndices`.
fn back_bound(b: Option<i64>, n: usize, default: i128) -> i128 {
    let n = n as i128;
    match b {
        None => default,
        Some(b) => {
            let b = if b < 0 { n + b as i128 } else { b as i128 };
            b.clamp(-1, n - 1)
        }
    }
}

/// A dim's part of the basic (slicing) step: `start..limit` by `step` after reversing the dim
/// if `rev`.
struct Basic {
    start: usize,
    limit: usize,
    step: usize,
    rev: bool,
}

/// What becomes of one entry in the result.
enum Out {
    /// A dim of the operand (sliced).
    Dim(usize),
    /// A new dim of size 1.
    New,
    /// An advanced index into operand dim `.0` (an integer tensor, or an integer while
    /// tensors are present).
    Adv(usize, Tensor),
    /// An integer without tensors: the dim is dropped.
    Drop,
}

#[track_caller]
fn resolve_at(i: i64, d: usize, shape: &[usize]) -> usize {
    let n = shape[d];
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
    j as usize
}

#[track_caller]
fn resolve_slice(
    start: Option<i64>,
    stop: Option<i64>,
    k: i64,
    d: usize,
    shape: &[usize],
) -> Basic {
    let n = shape[d];
    if k == 0 {
        fail(format!("slice step 0 along dim {d} of shape {shape:?}"));
    }
    if k > 0 {
        let a = bound(start, n, 0);
        let b = bound(stop, n, n).max(a);
        return Basic {
            start: a,
            limit: b,
            step: k.unsigned_abs() as usize,
            rev: false,
        };
    }
    // Backwards: elements s, s - |k|, .. down to (not including) t; on the reversed dim,
    // element i is n - 1 - i, so they run from n - 1 - s upwards by |k|.
    let s = back_bound(start, n, n as i128 - 1);
    let t = back_bound(stop, n, -1);
    let step = k.unsigned_abs().min(usize::MAX as u64) as usize;
    let count = if s > t {
        ((s - t - 1) / step as i128 + 1) as usize
    } else {
        0
    };
    let first = (n as i128 - 1 - s) as usize;
    let limit = if count == 0 {
        first
    } else {
        first + (count - 1) * step + 1
    };
    Basic {
        start: first,
        limit,
        step,
        rev: true,
    }
}

impl Tensor {
    /// `x[idx]` with NumPy's rules (see the module doc), e.g. `x.index(s![.., 1..-1, 0])`.
    #[track_caller]
    pub fn index(&self, idx: Vec<Index>) -> Tensor {
        let shape = self.shape().to_vec();
        let r = shape.len();
        let ellipses = idx.iter().filter(|e| matches!(e, Index::Ellipsis)).count();
        if ellipses > 1 {
            fail(format!(
                "an index can only have a single ellipsis ('...'), got {ellipses} (shape {shape:?})"
            ));
        }
        let consuming = idx
            .iter()
            .filter(|e| !matches!(e, Index::NewAxis | Index::Ellipsis))
            .count();
        if consuming > r {
            fail(format!(
                "{consuming} entries index a tensor of shape {shape:?} ({r} dims)"
            ));
        }
        let any_array = idx.iter().any(|e| matches!(e, Index::Array(_)));
        let mut basic: Vec<Basic> = shape
            .iter()
            .map(|&n| Basic {
                start: 0,
                limit: n,
                step: 1,
                rev: false,
            })
            .collect();
        let mut outs = Vec::with_capacity(r + idx.len());
        // The positions of the advanced entries among the entries as written: an ellipsis
        // between two separates them even when it stands for no dims (NumPy's rule).
        let mut advanced_at = Vec::new();
        let mut d = 0;
        for (pos, e) in idx.into_iter().enumerate() {
            if matches!(e, Index::Array(_)) || (any_array && matches!(e, Index::At(_))) {
                advanced_at.push(pos);
            }
            match e {
                Index::Slice { start, stop, step } => {
                    basic[d] = resolve_slice(start, stop, step, d, &shape);
                    outs.push(Out::Dim(d));
                    d += 1;
                }
                Index::At(i) => {
                    let j = resolve_at(i, d, &shape);
                    if any_array {
                        let t = match i32::try_from(j) {
                            Ok(j) => Tensor::scalar(j),
                            Err(_) => Tensor::scalar(j as i64),
                        };
                        outs.push(Out::Adv(d, t));
                    } else {
                        basic[d].start = j;
                        basic[d].limit = j + 1;
                        outs.push(Out::Drop);
                    }
                    d += 1;
                }
                Index::Array(t) => {
                    outs.push(Out::Adv(d, t));
                    d += 1;
                }
                Index::NewAxis => outs.push(Out::New),
                // Whole dims, as many as the other entries leave.
                Index::Ellipsis => {
                    outs.extend((d..d + r - consuming).map(Out::Dim));
                    d += r - consuming;
                }
            }
        }
        // The dims left over are whole (none after an ellipsis took them).
        outs.extend((d..r).map(Out::Dim));
        let mut x = self.clone();
        let rev: Vec<usize> = (0..r).filter(|&d| basic[d].rev).collect();
        if !rev.is_empty() {
            x = x.flip(rev);
        }
        let full = basic
            .iter()
            .zip(&shape)
            .all(|(b, &n)| b.start == 0 && b.limit == n && b.step == 1);
        if !full {
            let start: Vec<usize> = basic.iter().map(|b| b.start).collect();
            let limit: Vec<usize> = basic.iter().map(|b| b.limit).collect();
            let step: Vec<usize> = basic.iter().map(|b| b.step).collect();
            x = x.slice_strided(&start, &limit, &step);
        }
        let sliced = x.shape().to_vec();
        if !any_array {
            // Dropped dims have size 1 and new ones are size 1: one reshape places both.
            let out: Vec<usize> = outs
                .iter()
                .filter_map(|o| match o {
                    Out::Dim(d) => Some(sliced[*d]),
                    Out::New => Some(1),
                    Out::Drop | Out::Adv(..) => None,
                })
                .collect();
            return if out == sliced { x } else { x.reshape(out) };
        }
        let adjacent = advanced_at.windows(2).all(|w| w[1] == w[0] + 1);
        advanced(&x, outs, adjacent)
    }
}

/// The advanced-indexing step on the sliced operand `x`: one gather over every advanced dim,
/// the indices broadcast together; its dims placed by NumPy's rule, new axes by a reshape.
#[track_caller]
fn advanced(x: &Tensor, outs: Vec<Out>, adjacent: bool) -> Tensor {
    let shape = x.shape().to_vec();
    let positions: Vec<usize> = outs
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o, Out::Adv(..)))
        .map(|(i, _)| i)
        .collect();
    let mut dims = Vec::new();
    let mut arrays = Vec::new();
    for o in &outs {
        if let Out::Adv(d, t) = o {
            if !matches!(t.dtype(), DType::I32 | DType::U32 | DType::I64) {
                fail(format!(
                    "indices must be integers, got {} (shape {:?}) for dim {d} of shape {shape:?}",
                    t.dtype(),
                    t.shape()
                ));
            }
            dims.push(*d);
            arrays.push(wrapped(t, shape[*d]));
        }
    }
    // Mixed index types index in i64 (which holds every i32 and u32).
    let dtype = if arrays.iter().all(|t| t.dtype() == arrays[0].dtype()) {
        arrays[0].dtype()
    } else {
        DType::I64
    };
    let refs: Vec<&Tensor> = arrays.iter().collect();
    let b = broadcast_shapes(&refs, &shape);
    let k = arrays.len();
    // Where the broadcast dims go: in place of the first advanced entry (counting the result
    // dims before it) when the advanced entries are side by side, else first.
    let at = if adjacent {
        outs[..positions[0]]
            .iter()
            .filter(|o| matches!(o, Out::Dim(_)))
            .count()
    } else {
        0
    };
    let kept = shape.len() - k;
    let mut out_shape: Vec<usize> = Vec::new();
    let mut placed = !adjacent;
    if placed {
        out_shape.extend(&b);
    }
    for (i, o) in outs.iter().enumerate() {
        match o {
            Out::Dim(d) => out_shape.push(shape[*d]),
            Out::New => out_shape.push(1),
            Out::Adv(..) if !placed && i == positions[0] => {
                out_shape.extend(&b);
                placed = true;
            }
            Out::Adv(..) | Out::Drop => {}
        }
    }
    let numel: usize = b.iter().product();
    if dims.iter().any(|&d| shape[d] == 0) {
        if numel > 0 {
            fail(format!(
                "cannot index {numel} positions into an empty dim of shape {shape:?}"
            ));
        }
        return Tensor::full_dtype(out_shape, 0.0, x.dtype());
    }
    let cols: Vec<Tensor> = arrays
        .iter()
        .map(|t| t.astype(dtype).broadcast_to(&b).expand_dims(-1))
        .collect();
    let col_refs: Vec<&Tensor> = cols.iter().collect();
    let ids = Tensor::concat(&col_refs, -1);
    let mut collapsed = dims.clone();
    collapsed.sort_unstable();
    let mut slice_sizes = shape.clone();
    for &d in &dims {
        slice_sizes[d] = 1;
    }
    let nb = b.len();
    let offset_dims: Vec<usize> = (0..at).chain(at + nb..kept + nb).collect();
    let g = GatherDims {
        offset_dims,
        collapsed_slice_dims: collapsed,
        start_index_map: dims,
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        index_vector_dim: nb,
        slice_sizes,
        mode: IndexMode::Clip,
        fill: 0.0,
    };
    let j = join(&[x, &ids]);
    let y = apply(Op::Gather(Box::new(g)), &[&j[0], &j[1]]);
    if y.shape() == &out_shape[..] {
        y
    } else {
        y.reshape(out_shape)
    }
}

/// Negative indices wrapped by the dim's size `n` (u32 ones are never negative).
fn wrapped(t: &Tensor, n: usize) -> Tensor {
    match t.dtype() {
        DType::U32 => t.clone(),
        _ => {
            let limit = if t.dtype() == DType::I32 {
                i32::MAX as usize
            } else {
                i64::MAX as usize
            };
            let neg = t.lt(&t.scalar_like(0.0));
            let up = t.add(&t.scalar_like(n.min(limit) as f64));
            Tensor::select(&neg, &up, t)
        }
    }
}

/// NumPy's broadcast of the index tensors' shapes; a mismatch is an error naming them.
#[track_caller]
fn broadcast_shapes(ts: &[&Tensor], operand: &[usize]) -> Vec<usize> {
    let rank = ts.iter().map(|t| t.rank()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for t in ts {
        let off = rank - t.rank();
        for (i, &n) in t.shape().iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = n;
            } else if n != 1 && n != *o {
                let shapes: Vec<&[usize]> = ts.iter().map(|t| t.shape()).collect();
                fail(format!(
                    "index tensors of shapes {shapes:?} cannot broadcast together (indexing shape {operand:?})"
                ));
            }
        }
    }
    out
}
