//! The reference kernels of the sorting family: `sort`, the cumulative ops and `rev`, written
//! from their definitions (one lane at a time, every index from first principles).

use std::cmp::Ordering;

use tessera_ir::sorting::float_sort_cmp;
use tessera_ir::{BinaryOp, CumulativeKind, Data, Literal, TensorType};

use crate::scalar::{Float, Int};
use crate::{ravel, unravel};

/// The base offsets of every lane along `dim` of `dims` (row-major, the lane's first element).
fn lanes(dims: &[usize], dim: usize) -> Vec<usize> {
    let strides = tessera_ir::Shape::new(dims.to_vec()).strides();
    let mut outer = dims.to_vec();
    outer[dim] = 1;
    let count: usize = outer.iter().product();
    if dims[dim] == 0 {
        return Vec::new();
    }
    (0..count)
        .map(|f| ravel(&unravel(f, &outer), &strides))
        .collect()
}

/// Compares element `i` with element `j` of `d` in JAX's sort order.
fn cmp_at(d: &Data, i: usize, j: usize) -> Ordering {
    if d.dtype().is_float() {
        float_sort_cmp(d.get_f64(i), d.get_f64(j))
    } else {
        crate::int_at(d, i).cmp(&crate::int_at(d, j))
    }
}

/// `sort`: the stable lexicographic permutation of each lane, applied to operand `output`.
pub(crate) fn sort(args: &[&Literal], dim: usize, num_keys: usize, output: usize) -> Data {
    let dims = args[0].ty.dims();
    let stride = args[0].ty.shape.strides()[dim];
    let n = dims[dim];
    let src = &args[output].data;
    let mut sources: Vec<Option<usize>> = (0..src.len()).map(Some).collect();
    for base in lanes(dims, dim) {
        let mut perm: Vec<usize> = (0..n).collect();
        // `sort_by` is stable.
        perm.sort_by(|&a, &b| {
            for k in &args[..num_keys] {
                let o = cmp_at(&k.data, base + a * stride, base + b * stride);
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
        for (i, p) in perm.into_iter().enumerate() {
            sources[base + i * stride] = Some(base + p * stride);
        }
    }
    src.gather(&sources, None)
        .expect("a permutation reads only in-range elements")
}

fn scan<T: Copy>(
    v: &[T],
    dims: &[usize],
    axis: usize,
    reverse: bool,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = v.to_vec();
    let stride = tessera_ir::Shape::new(dims.to_vec()).strides()[axis];
    let n = dims[axis];
    for base in lanes(dims, axis) {
        let at = |k: usize| base + (if reverse { n - 1 - k } else { k }) * stride;
        for k in 1..n {
            out[at(k)] = f(out[at(k - 1)], v[at(k)]);
        }
    }
    out
}

/// The cumulative ops: each element combines every element before it along `axis` (after it
/// when `reverse`), in order, with the IR's own `add`/`mul`/`max`/`min`.
pub(crate) fn cumulative(kind: CumulativeKind, axis: usize, reverse: bool, x: &Literal) -> Data {
    let op = match kind {
        CumulativeKind::Sum => BinaryOp::Add,
        CumulativeKind::Prod => BinaryOp::Mul,
        CumulativeKind::Max => BinaryOp::Max,
        CumulativeKind::Min => BinaryOp::Min,
    };
    let dims = x.ty.dims();
    match &x.data {
        Data::F32(v) => Data::F32(scan(v, dims, axis, reverse, |a, b| f32::binary(op, a, b))),
        Data::F64(v) => Data::F64(scan(v, dims, axis, reverse, |a, b| f64::binary(op, a, b))),
        Data::I32(v) => Data::I32(scan(v, dims, axis, reverse, |a, b| i32::binary(op, a, b))),
        Data::U32(v) => Data::U32(scan(v, dims, axis, reverse, |a, b| u32::binary(op, a, b))),
        Data::I64(v) => Data::I64(scan(v, dims, axis, reverse, |a, b| i64::binary(op, a, b))),
        // The type rule rejects bool, and f16/bf16 compute in f32 (`in_f32`); the identity
        // keeps this total.
        Data::Bool(_) | Data::F16(_) | Data::BF16(_) => x.data.clone(),
    }
}

/// `rev`: the element at the mirrored index along each of `dims`.
pub(crate) fn rev(dims: &[usize], x: &Literal, ty: &TensorType) -> Data {
    let shape = x.ty.dims();
    let strides = x.ty.shape.strides();
    let sources: Vec<Option<usize>> = (0..ty.numel())
        .map(|f| {
            let mut idx = unravel(f, shape);
            for &d in dims {
                idx[d] = shape[d] - 1 - idx[d];
            }
            Some(ravel(&idx, &strides))
        })
        .collect();
    x.data
        .gather(&sources, None)
        .expect("a mirrored index is in range")
}
