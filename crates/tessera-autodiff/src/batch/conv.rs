//! Batching rules of the windowed ops.
//!
//! `conv_general_dilated` (JAX's `_conv_general_dilated_batch_rule`): a batched lhs with an
//! unbatched kernel folds the mapped dim into the conv's batch dim; otherwise both are batched
//! (an unbatched one broadcast) and the mapped dim folds into the lhs feature dim and the
//! kernel's output feature dim as `size` times more feature groups (batch groups for a
//! batch-grouped conv), then comes out of the result's feature dim. A zero-size map gives
//! zeros. `reduce_window` gets a window of 1 along the mapped dim.

use tessera_ir::{ConvDims, Op, ReduceKind, Shape, TensorType, WindowDims};

use super::{Builder, Result, Val};
use tessera_ir::NodeId;

fn axis_into(b: &mut Builder, src: usize, dst: usize, x: NodeId) -> Result<NodeId> {
    let ty = b.ty(x);
    let mut perm: Vec<usize> = (0..ty.rank()).filter(|&d| d != src).collect();
    perm.insert(dst, src);
    let t = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x
    } else {
        b.add(Op::Transpose(perm), &[x])?
    };
    let mut dims: Vec<usize> = ty.dims().to_vec();
    let s = dims.remove(src);
    dims[dst] *= s;
    b.add(Op::Reshape(Shape::new(dims)), &[t])
}

fn axis_out_of(b: &mut Builder, src: usize, size1: usize, x: NodeId) -> Result<NodeId> {
    let mut dims = b.ty(x).dims().to_vec();
    dims[src] /= size1.max(1);
    dims.insert(src, size1);
    b.add(Op::Reshape(Shape::new(dims)), &[x])
}

pub(super) fn conv(b: &mut Builder, cd: &ConvDims, l: Val, r: Val, ty: &TensorType) -> Result<Val> {
    let n = b.size;
    if n == 0 {
        let bty = b.batched_type(ty, 0);
        return Ok((b.full(&bty, 0.0)?, Some(0)));
    }
    if let (Some(lb), None, 1) = (l.1, r.1, cd.batch_group_count) {
        let nl = axis_into(b, lb, cd.lhs_spec[0], l.0)?;
        let out = b.add(Op::Conv(Box::new(cd.clone())), &[nl, r.0])?;
        let out = axis_out_of(b, cd.out_spec[0], n, out)?;
        return Ok((out, Some(cd.out_spec[0])));
    }
    let (lx, lb) = match l.1 {
        Some(d) => (l.0, d),
        None => (b.materialize(l, 0)?, 0),
    };
    let (rx, rb) = match r.1 {
        Some(d) => (r.0, d),
        None => (b.materialize(r, 0)?, 0),
    };
    let mut nd = cd.clone();
    let nl = if cd.batch_group_count > 1 {
        nd.batch_group_count *= n;
        axis_into(b, lb, cd.lhs_spec[0], lx)?
    } else {
        nd.feature_group_count *= n;
        axis_into(b, lb, cd.lhs_spec[1], lx)?
    };
    let nr = axis_into(b, rb, cd.rhs_spec[0], rx)?;
    let out = b.add(Op::Conv(Box::new(nd)), &[nl, nr])?;
    let out = axis_out_of(b, cd.out_spec[1], n, out)?;
    Ok((out, Some(cd.out_spec[1])))
}

pub(super) fn reduce_window(
    b: &mut Builder,
    kind: ReduceKind,
    win: &WindowDims,
    x: Val,
) -> Result<Val> {
    let (x, bd) = (x.0, x.1.expect("a batched operand"));
    let mut w = win.clone();
    w.window.insert(bd, 1);
    w.strides.insert(bd, 1);
    w.padding.insert(bd, (0, 0));
    w.base_dilation.insert(bd, 1);
    w.window_dilation.insert(bd, 1);
    let out = b.add(
        Op::ReduceWindow {
            kind,
            win: Box::new(w),
        },
        &[x],
    )?;
    Ok((out, Some(bd)))
}
