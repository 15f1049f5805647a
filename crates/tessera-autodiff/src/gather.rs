//! The derivatives of `gather` and `scatter` (as JAX's `_gather_transpose_rule`,
//! `_scatter_add_transpose_rule`, `_scatter_transpose_rule` and their JVPs). Indices are
//! integers and get no share.
//!
//! - gather: the operand's cotangent is the cotangent scatter-added into zeros (a filled slice's
//!   elements dropped); the tangent is the gather of the tangent with fill 0.
//! - scatter add: the operand's cotangent is the cotangent; the updates' is the gather of the
//!   cotangent at each update's target (0 where it was dropped).
//! - scatter set: the operand's cotangent is the cotangent with every written position zeroed;
//!   an update's is the cotangent at its target if it is the write that won there (the last in
//!   row-major order of the updates), else 0 (JAX's rule for non-unique indices: it scatters
//!   update ids and compares).
//! - scatter min/max (as JAX's `_scatter_extremal_jvp`): an output element takes its derivative
//!   from the values equal to it, shared equally: the operand element if it was retained
//!   (`R = x == y`, or no update lands there) and each update that succeeded (`S = u == y` at its target); with
//!   `k` = the number of successful updates at each position and `n = k + R`, the operand's
//!   cotangent is `g * R / n` and an update's `S * (g / n)` at its target.
//! - scatter mul: `y = x * M` with `M` the product of the updates landing on each position
//!   (`M` = the same scatter into ones), so the operand's cotangent is `g * M`; an update's is
//!   `g * x` at its target times the product of the *other* updates there, computed without
//!   dividing by zero (JAX only differentiates unique indices; this is general): with `Z` the
//!   number of zero updates at each position, `N` the product of the nonzero ones and `r` the
//!   number landing there, the others' product is 1 when `r = 1`, else `N * (Z == 1)` for a
//!   zero update and `N * (Z == 0) / u` for a nonzero one. (With repeated indices that
//!   division makes it NaN or infinite where `N` overflows or an update is infinite.)

use tessera_ir::{
    BinaryOp, CompareOp, DType, GatherDims, IndexMode, Literal, NodeId, Op, ScatterDims,
    ScatterKind, TensorType,
};

use super::{At, Builder, Result};

fn zeros(b: &mut Builder, ty: &TensorType) -> Result<NodeId> {
    b.add(Op::Constant(Literal::splat(ty, 0.0)), &[])
}

/// `d` reading tangents or cotangents: a filled slice is 0.
fn zero_filled(d: &GatherDims) -> GatherDims {
    let mut d = d.clone();
    if d.mode == IndexMode::Fill {
        d.fill = 0.0;
    }
    d
}

pub(super) fn gather_vjp(b: &mut Builder, d: &GatherDims, at: &At) -> Result<Vec<Option<NodeId>>> {
    let (x, idx, g) = (at.xs[0], at.xs[1], at.g);
    let op = at.want(b, 0, |b| {
        let ty = b.ty(x);
        let z = zeros(b, &ty)?;
        b.add(
            Op::Scatter(Box::new(d.as_scatter(ScatterKind::Add))),
            &[z, idx, g],
        )
    })?;
    Ok(vec![op, None])
}

fn ones(b: &mut Builder, ty: &TensorType) -> Result<NodeId> {
    b.add(Op::Constant(Literal::splat(ty, 1.0)), &[])
}

/// `d` with another combiner.
fn with_kind(d: &ScatterDims, kind: ScatterKind) -> Op {
    let mut d = d.clone();
    d.kind = kind;
    Op::Scatter(Box::new(d))
}

/// The shares of a scatter min/max: `(R / n, S, n)` with `R`, `S`, `n` as in the module doc
/// (`R / n` shaped like the operand, `S` like the updates, as floats; `n` at least 1).
fn extremal_shares(
    b: &mut Builder,
    d: &ScatterDims,
    (x, idx, u, y): (NodeId, NodeId, NodeId, NodeId),
) -> Result<(NodeId, NodeId, NodeId)> {
    let (xty, uty) = (b.ty(x), b.ty(u));
    let read = Op::Gather(Box::new(d.as_gather(xty.rank(), uty.dims())));
    let at = b.add(read, &[y, idx])?;
    let won = b.cmp(CompareOp::Eq, u, at)?;
    let s = b.add(Op::Convert(uty.dtype), &[won])?;
    let z = zeros(b, &xty)?;
    let k = b.add(with_kind(d, ScatterKind::Add), &[z, idx, s])?;
    // Retained: equal to the result, or untouched by any update (a NaN operand element no
    // update lands on passes its derivative through, as JAX's tangent does).
    let equal = b.cmp(CompareOp::Eq, x, y)?;
    let one_u = ones(b, &uty)?;
    let z2 = zeros(b, &xty)?;
    let refs = b.add(with_kind(d, ScatterKind::Add), &[z2, idx, one_u])?;
    let z3 = zeros(b, &xty)?;
    let untouched = b.cmp(CompareOp::Eq, refs, z3)?;
    let kept = b.add(Op::Binary(BinaryOp::Or), &[equal, untouched])?;
    let r = b.add(Op::Convert(xty.dtype), &[kept])?;
    let n0 = b.bin(BinaryOp::Add, k, r)?;
    // Only a NaN result has no equal value; its derivative is 0 / 1.
    let one = ones(b, &xty)?;
    let n = b.bin(BinaryOp::Max, n0, one)?;
    let rn = b.bin(BinaryOp::Div, r, n)?;
    Ok((rn, s, n))
}

/// Scatter mul: `(M, P)` with `M` the product landing on each position (shaped like the
/// operand) and `P` each update's product of the other updates at its target.
fn mul_parts(
    b: &mut Builder,
    d: &ScatterDims,
    (x, idx, u): (NodeId, NodeId, NodeId),
) -> Result<(NodeId, NodeId)> {
    let (xty, uty) = (b.ty(x), b.ty(u));
    let read = Op::Gather(Box::new(d.as_gather(xty.rank(), uty.dims())));
    let one_x = ones(b, &xty)?;
    let zero_x = zeros(b, &xty)?;
    let one_u = ones(b, &uty)?;
    let zero_u = zeros(b, &uty)?;
    let m = b.add(with_kind(d, ScatterKind::Mul), &[one_x, idx, u])?;
    let is_zero = b.cmp(CompareOp::Eq, u, zero_u)?;
    let zf = b.add(Op::Convert(uty.dtype), &[is_zero])?;
    let zc = b.add(with_kind(d, ScatterKind::Add), &[zero_x, idx, zf])?;
    let refs = b.add(with_kind(d, ScatterKind::Add), &[zero_x, idx, one_u])?;
    let nonzero = b.select(is_zero, one_u, u)?;
    let np = b.add(with_kind(d, ScatterKind::Mul), &[one_x, idx, nonzero])?;
    let (zc_u, refs_u, np_u) = (
        b.add(read.clone(), &[zc, idx])?,
        b.add(read.clone(), &[refs, idx])?,
        b.add(read, &[np, idx])?,
    );
    let one_z = b.cmp(CompareOp::Eq, zc_u, one_u)?;
    let no_z = b.cmp(CompareOp::Eq, zc_u, zero_u)?;
    let for_zero = b.select(one_z, np_u, zero_u)?;
    let q = b.bin(BinaryOp::Div, np_u, nonzero)?;
    let for_nonzero = b.select(no_z, q, zero_u)?;
    let general = b.select(is_zero, for_zero, for_nonzero)?;
    let alone = b.cmp(CompareOp::Eq, refs_u, one_u)?;
    let p = b.select(alone, one_u, general)?;
    Ok((m, p))
}

pub(super) fn scatter_vjp(
    b: &mut Builder,
    d: &ScatterDims,
    at: &At,
) -> Result<Vec<Option<NodeId>>> {
    let (x, idx, u, g) = (at.xs[0], at.xs[1], at.xs[2], at.g);
    let uty = b.ty(u);
    let rank = b.ty(x).rank();
    let read = Op::Gather(Box::new(d.as_gather(rank, uty.dims())));
    match d.kind {
        ScatterKind::Add => {
            let op = at.want(b, 0, |_| Ok(g))?;
            let upd = at.want(b, 2, |b| b.add(read.clone(), &[g, idx]))?;
            Ok(vec![op, None, upd])
        }
        ScatterKind::Set => {
            let op = at.want(b, 0, |b| {
                let z = zeros(b, &uty)?;
                b.add(Op::Scatter(Box::new(d.clone())), &[g, idx, z])
            })?;
            let upd = at.want(b, 2, |b| {
                let gathered = b.add(read.clone(), &[g, idx])?;
                let won = winners(b, d, x, idx, u)?;
                let z = zeros(b, &uty)?;
                b.select(won, gathered, z)
            })?;
            Ok(vec![op, None, upd])
        }
        ScatterKind::Min | ScatterKind::Max => {
            let (rn, s, n) = extremal_shares(b, d, (x, idx, u, at.y))?;
            let op = at.want(b, 0, |b| b.mul(g, rn))?;
            let upd = at.want(b, 2, |b| {
                let gn = b.bin(BinaryOp::Div, g, n)?;
                let gathered = b.add(read.clone(), &[gn, idx])?;
                b.mul(gathered, s)
            })?;
            Ok(vec![op, None, upd])
        }
        ScatterKind::Mul => {
            let (m, p) = mul_parts(b, d, (x, idx, u))?;
            let op = at.want(b, 0, |b| b.mul(g, m))?;
            let upd = at.want(b, 2, |b| {
                let gx = b.mul(g, x)?;
                let gathered = b.add(read.clone(), &[gx, idx])?;
                b.mul(gathered, p)
            })?;
            Ok(vec![op, None, upd])
        }
    }
}

/// Bool, shaped like the updates: whether each update is the write that stands in the result.
fn winners(b: &mut Builder, d: &ScatterDims, x: NodeId, idx: NodeId, u: NodeId) -> Result<NodeId> {
    let (xty, uty) = (b.ty(x), b.ty(u));
    let n = uty.numel();
    let flat = b.add(
        Op::Iota {
            dim: 0,
            ty: TensorType::new(DType::I32, vec![n]),
        },
        &[],
    )?;
    let ids = b.add(Op::Reshape(uty.shape.clone()), &[flat])?;
    let none = b.add(
        Op::Constant(Literal::splat(&xty.with_dtype(DType::I32), -1.0)),
        &[],
    )?;
    let mut set = d.clone();
    set.kind = ScatterKind::Set;
    let stand = b.add(Op::Scatter(Box::new(set)), &[none, idx, ids])?;
    let read = d.as_gather(xty.rank(), uty.dims());
    let back = b.add(Op::Gather(Box::new(read)), &[stand, idx])?;
    b.add(Op::Compare(CompareOp::Eq), &[back, ids])
}

/// The tangent of a gather (`t` the operand's, `None`: zero).
pub(super) fn gather_jvp(
    b: &mut Builder,
    d: &GatherDims,
    idx: NodeId,
    t: Option<NodeId>,
) -> Result<Option<NodeId>> {
    t.map(|t| b.add(Op::Gather(Box::new(zero_filled(d))), &[t, idx]))
        .transpose()
}

/// The tangent of a scatter from its operand's and updates' (`x`, `u` the primals).
pub(super) fn scatter_jvp(
    b: &mut Builder,
    d: &ScatterDims,
    (x, idx, u, y): (NodeId, NodeId, NodeId, NodeId),
    (tx, tu): (Option<NodeId>, Option<NodeId>),
) -> Result<Option<NodeId>> {
    if tx.is_none() && tu.is_none() {
        return Ok(None);
    }
    match d.kind {
        // Linear in (operand, updates) jointly; set picks the same winner for the tangents.
        ScatterKind::Add | ScatterKind::Set => {
            let tx = match tx {
                Some(t) => t,
                None => {
                    let ty = b.ty(x);
                    zeros(b, &ty)?
                }
            };
            let tu = match tu {
                Some(t) => t,
                None => {
                    let ty = b.ty(u);
                    zeros(b, &ty)?
                }
            };
            Ok(Some(
                b.add(Op::Scatter(Box::new(d.clone())), &[tx, idx, tu])?,
            ))
        }
        // The transposes of the VJPs: (tx * R + scatter_add(tu * S)) / n, and
        // tx * M + x * scatter_add(tu * P).
        ScatterKind::Min | ScatterKind::Max => {
            let (rn, s, n) = extremal_shares(b, d, (x, idx, u, y))?;
            let from_x = tx.map(|t| b.mul(t, rn)).transpose()?;
            let from_u = tu
                .map(|t| {
                    let ts = b.mul(t, s)?;
                    let ty = b.ty(x);
                    let z = zeros(b, &ty)?;
                    let summed = b.add(with_kind(d, ScatterKind::Add), &[z, idx, ts])?;
                    b.bin(BinaryOp::Div, summed, n)
                })
                .transpose()?;
            sum_of(b, from_x, from_u)
        }
        ScatterKind::Mul => {
            let (m, p) = mul_parts(b, d, (x, idx, u))?;
            let from_x = tx.map(|t| b.mul(t, m)).transpose()?;
            let from_u = tu
                .map(|t| {
                    let tp = b.mul(t, p)?;
                    let ty = b.ty(x);
                    let z = zeros(b, &ty)?;
                    let summed = b.add(with_kind(d, ScatterKind::Add), &[z, idx, tp])?;
                    b.mul(x, summed)
                })
                .transpose()?;
            sum_of(b, from_x, from_u)
        }
    }
}

/// `a + b` where either may be a zero never built.
fn sum_of(b: &mut Builder, x: Option<NodeId>, y: Option<NodeId>) -> Result<Option<NodeId>> {
    Ok(match (x, y) {
        (Some(x), Some(y)) => Some(b.bin(BinaryOp::Add, x, y)?),
        (x, None) => x,
        (None, y) => y,
    })
}

/// `vmap` of a gather (as JAX's `_gather_batching_rule` with batching dims): both operands get
/// the batch dim in front (an unbatched one broadcast), which becomes a batching dim of the
/// dimension numbers and the result's dim 0.
pub(crate) fn batch_gather(d: &GatherDims) -> GatherDims {
    let up = |v: &[usize]| v.iter().map(|&x| x + 1).collect::<Vec<_>>();
    let front = |v: &[usize]| [vec![0], up(v)].concat();
    GatherDims {
        offset_dims: up(&d.offset_dims),
        collapsed_slice_dims: up(&d.collapsed_slice_dims),
        start_index_map: up(&d.start_index_map),
        operand_batching_dims: front(&d.operand_batching_dims),
        start_indices_batching_dims: front(&d.start_indices_batching_dims),
        index_vector_dim: d.index_vector_dim + 1,
        slice_sizes: [vec![1], d.slice_sizes.clone()].concat(),
        mode: d.mode,
        fill: d.fill,
    }
}

/// `vmap` of a scatter: operand, indices and updates with the batch dim in front, a batching
/// dim of the dimension numbers; the result is batched in dim 0.
pub(crate) fn batch_scatter(d: &ScatterDims) -> ScatterDims {
    let up = |v: &[usize]| v.iter().map(|&x| x + 1).collect::<Vec<_>>();
    let front = |v: &[usize]| [vec![0], up(v)].concat();
    ScatterDims {
        kind: d.kind,
        update_window_dims: up(&d.update_window_dims),
        inserted_window_dims: up(&d.inserted_window_dims),
        scatter_dims_to_operand_dims: up(&d.scatter_dims_to_operand_dims),
        input_batching_dims: front(&d.input_batching_dims),
        scatter_indices_batching_dims: front(&d.scatter_indices_batching_dims),
        index_vector_dim: d.index_vector_dim + 1,
        mode: d.mode,
    }
}
