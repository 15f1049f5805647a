//! The oracle kernels of the windowed ops: `conv_general_dilated` and `reduce_window`, as
//! straightforward loops over the result's elements and each one's window.
//!
//! Along a spatial dim, result position `p` and window position `k` read the dilated, padded
//! operand at `q = p * stride + k * window_dilation - lo`; it is an operand element when
//! `0 <= q < dilate(n)` and `q` is a multiple of the base (lhs) dilation, `q / dilation` its
//! index; anything else is padding (a hole of the dilation or beyond the edges), which adds
//! nothing to a conv and holds the reduction's identity in a `reduce_window`.
//!
//! With `window_reversal`, window position `k` reads kernel element `K - 1 - k`.
//!
//! Each result element accumulates in the operand's own type in window order (the window's
//! dims row-major; for a conv, input features outermost), the order the compiled kernels
//! use for `reduce_window`.

use tessera_ir::{ConvDims, Data, Literal, Op, ReduceKind, TensorType, WindowDims};

use crate::scalar::{fmax, fmin};
use crate::{InterpError, op_error, unravel};

/// The operand index that window position `k` of result position `p` reads along one dim,
/// or `None` in the padding.
#[allow(clippy::too_many_arguments)]
pub fn source_index(
    p: usize,
    k: usize,
    stride: usize,
    lo: i64,
    window_dilation: usize,
    base_dilation: usize,
    n: usize,
) -> Option<usize> {
    let q = p as i128 * stride as i128 + k as i128 * window_dilation as i128 - lo as i128;
    if q < 0 || q % base_dilation as i128 != 0 {
        return None;
    }
    let i = (q / base_dilation as i128) as usize;
    (i < n).then_some(i)
}

/// `conv_general_dilated` (see the module doc).
pub(crate) fn conv(
    op: &Op,
    cd: &ConvDims,
    l: &Literal,
    r: &Literal,
    ty: &TensorType,
) -> Result<Data, InterpError> {
    let (ld, rd, od) = (l.ty.dims(), r.ty.dims(), ty.dims());
    let (ls, rs) = (l.ty.shape.strides(), r.ty.shape.strides());
    let s = cd.spatial();
    let c = ld[cd.lhs_spec[1]];
    let n_out_batch = od[cd.out_spec[0]];
    let o_feat = rd[cd.rhs_spec[0]];
    let (fg, bg) = (cd.feature_group_count, cd.batch_group_count);
    let cin = c / fg;
    let kdims: Vec<usize> = (0..s).map(|j| rd[cd.rhs_spec[2 + j]]).collect();
    let nk: usize = kdims.iter().product();
    // For every result element, the (lhs, rhs) offset pairs whose products it sums.
    let pairs_of = |f: usize| -> Vec<(usize, usize)> {
        let oi = unravel(f, od);
        let b = oi[cd.out_spec[0]];
        let o = oi[cd.out_spec[1]];
        let fgrp = o / (o_feat / fg);
        let bgrp = o / (o_feat / bg);
        let lb = bgrp * n_out_batch + b;
        let mut v = Vec::new();
        for i in 0..cin {
            let ch = fgrp * cin + i;
            'k: for kf in 0..nk {
                let k = unravel(kf, &kdims);
                let mut lo = lb * ls[cd.lhs_spec[0]] + ch * ls[cd.lhs_spec[1]];
                let mut ro = o * rs[cd.rhs_spec[0]] + i * rs[cd.rhs_spec[1]];
                for j in 0..s {
                    let Some(x) = source_index(
                        oi[cd.out_spec[2 + j]],
                        k[j],
                        cd.strides[j],
                        cd.padding[j].0,
                        cd.rhs_dilation[j],
                        cd.lhs_dilation[j],
                        ld[cd.lhs_spec[2 + j]],
                    ) else {
                        continue 'k;
                    };
                    let kj = if cd.window_reversal {
                        kdims[j] - 1 - k[j]
                    } else {
                        k[j]
                    };
                    lo += x * ls[cd.lhs_spec[2 + j]];
                    ro += kj * rs[cd.rhs_spec[2 + j]];
                }
                v.push((lo, ro));
            }
        }
        v
    };
    let n = ty.numel();
    Ok(match (&l.data, &r.data) {
        (Data::F32(a), Data::F32(w)) => Data::F32(
            (0..n)
                .map(|f| {
                    pairs_of(f)
                        .iter()
                        .fold(0.0f32, |acc, &(x, y)| acc + a[x] * w[y])
                })
                .collect(),
        ),
        (Data::F64(a), Data::F64(w)) => Data::F64(
            (0..n)
                .map(|f| {
                    pairs_of(f)
                        .iter()
                        .fold(0.0f64, |acc, &(x, y)| acc + a[x] * w[y])
                })
                .collect(),
        ),
        _ => return Err(op_error(op, "conv of f32 or f64 operands only")),
    })
}

/// The operand offsets that result element `f` of a `reduce_window` combines, in window order.
/// Per dim it visits the operand's indices (not the window's positions, which a huge window or
/// dilation makes too many to visit): index `i` is in the window at position `k` when
/// `i * base_dilation - lo + ... = p * stride + k * window_dilation`, and the positions grow
/// with `i`, so the row-major order of the hits is the window's order.
pub fn window_offsets(
    wd: &WindowDims,
    in_dims: &[usize],
    out_dims: &[usize],
    f: usize,
) -> Vec<usize> {
    let strides = tessera_ir::Shape::new(in_dims.to_vec()).strides();
    let oi = unravel(f, out_dims);
    let mut offs = vec![0usize];
    for d in 0..in_dims.len() {
        let (wdil, win) = (wd.window_dilation[d] as i128, wd.window[d] as i128);
        let hits: Vec<usize> = (0..in_dims[d])
            .filter(|&i| {
                let t = i as i128 * wd.base_dilation[d] as i128 + wd.padding[d].0 as i128
                    - oi[d] as i128 * wd.strides[d] as i128;
                t >= 0 && wdil > 0 && t % wdil == 0 && t / wdil < win
            })
            .collect();
        offs = offs
            .iter()
            .flat_map(|&o| {
                let step = strides[d];
                hits.iter().map(move |&i| o + i * step)
            })
            .collect();
    }
    offs
}

/// `reduce_window` (see the module doc).
pub(crate) fn reduce_window(
    op: &Op,
    kind: ReduceKind,
    wd: &WindowDims,
    x: &Literal,
    ty: &TensorType,
) -> Result<Data, InterpError> {
    let n = ty.numel();
    let offs = |f: usize| window_offsets(wd, x.ty.dims(), ty.dims(), f);
    macro_rules! fold {
        ($v:expr, $init:expr, $f:expr) => {
            (0..n)
                .map(|f| offs(f).iter().fold($init, |acc, &o| $f(acc, $v[o])))
                .collect()
        };
    }
    macro_rules! float {
        ($v:expr, $t:ty) => {
            match kind {
                ReduceKind::Sum => fold!($v, 0.0 as $t, |a, b| a + b),
                ReduceKind::Max => fold!($v, <$t>::NEG_INFINITY, fmax),
                ReduceKind::Min => fold!($v, <$t>::INFINITY, fmin),
            }
        };
    }
    macro_rules! int {
        ($v:expr, $t:ty) => {
            match kind {
                ReduceKind::Sum => fold!($v, 0, |a: $t, b| a.wrapping_add(b)),
                ReduceKind::Max => fold!($v, <$t>::MIN, |a: $t, b| a.max(b)),
                ReduceKind::Min => fold!($v, <$t>::MAX, |a: $t, b| a.min(b)),
            }
        };
    }
    Ok(match &x.data {
        Data::F32(v) => Data::F32(float!(v, f32)),
        Data::F64(v) => Data::F64(float!(v, f64)),
        Data::I32(v) => Data::I32(int!(v, i32)),
        Data::U32(v) => Data::U32(int!(v, u32)),
        Data::I64(v) => Data::I64(int!(v, i64)),
        Data::Bool(_) => return Err(op_error(op, "reduce_window of bool")),
        Data::F16(_) | Data::BF16(_) => {
            return Err(op_error(op, "f16 and bf16 compute in f32 (in_f32)"));
        }
    })
}
