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
//! - scatter mul, min and max have no rule here (`NotDifferentiable`).

use tessera_ir::{
    CompareOp, DType, GatherDims, IndexMode, Literal, NodeId, Op, ScatterDims, ScatterKind,
    TensorType,
};

use super::{At, AutodiffError, Builder, Result};

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

fn not_differentiable(d: &ScatterDims) -> AutodiffError {
    AutodiffError::NotDifferentiable {
        op: "scatter".into(),
        why: format!(
            " with combiner {} (only set and add have a derivative here)",
            d.kind.name()
        ),
    }
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
        ScatterKind::Mul | ScatterKind::Min | ScatterKind::Max => Err(not_differentiable(d)),
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
    (x, idx, u): (NodeId, NodeId, NodeId),
    (tx, tu): (Option<NodeId>, Option<NodeId>),
) -> Result<Option<NodeId>> {
    match d.kind {
        // Linear in (operand, updates) jointly; set picks the same winner for the tangents.
        ScatterKind::Add | ScatterKind::Set => {
            if tx.is_none() && tu.is_none() {
                return Ok(None);
            }
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
        ScatterKind::Mul | ScatterKind::Min | ScatterKind::Max => Err(not_differentiable(d)),
    }
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
