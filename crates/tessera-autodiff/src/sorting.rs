//! Reverse and forward rules of the sorting family (`sort`, the cumulative ops, `rev`), written
//! in ops that have rules of their own, so the derivative graphs differentiate again.
//!
//! - `sort`: output `o` is operand `o` permuted. The permutation is `sort` of the keys with an
//!   i32 iota as an extra operand (as JAX's `_sort_jvp`); the tangent is `sort` of the keys
//!   with the tangent as the extra operand (the stable sort permutes it the same way); the
//!   cotangent is the cotangent sorted by the permutation (which applies the inverse).
//! - `cumsum`: the tangent is `cumsum` of the tangent, the cotangent the reversed `cumsum`.
//! - `cumprod`: the derivative of `prod_{j<=i} x_j` in `x_k` is the product of the others,
//!   computed without dividing by zero: with `z = (x == 0)`, `x'` = x with its zeros set to
//!   one, `P = cumprod(x')` and `c = cumsum(z)`, the product over `j <= i, j != k` is
//!   `P_i / x'_k` when `c_i == z_k`, and zero otherwise. So the JVP is
//!   `select(c == 0, P * cumsum(t / x'), select(c == 1, P * cumsum(t * z), 0))` and the VJP
//!   `select(z, rcumsum(g * P * (c == 1)), rcumsum(g * P * (c == 0)) / x')` (`rcumsum` runs the
//!   other way). The values are JAX's (its derivative of the associative scan is the same
//!   polynomial) up to rounding.
//! - `cummax`/`cummin`: output `i` takes its derivative from the elements `k` up to it that
//!   equal it, shared equally among them (as `reduce_max`'s rule shares among ties): with the
//!   mask `M[k, i] = (k before-or-at i) & (x_k == y_i)` and `n_i = sum_k M[k, i]`, the tangent is
//!   `y'_i = sum_k M[k, i] t_k / n_i` and the cotangent `x̄_k = sum_i M[k, i] g_i / n_i`. The
//!   mask is n x n per lane (memory quadratic in the scanned length). JAX differentiates its
//!   associative scan, whose binary `max` shares a tie 1/2 : 1/2 at each combine: the values
//!   agree wherever at most two elements tie for an output, and differ for three-way ties
//!   (JAX's shares follow its scan tree).
//! - `rev`: linear and its own transpose.

use tessera_ir::{BinaryOp, CompareOp, CumulativeKind, DType, NodeId, Op, Shape, TensorType};

use super::{Builder, Result};

fn iota_i32(b: &mut Builder, like: NodeId, dim: usize) -> Result<NodeId> {
    let ty = TensorType::new(DType::I32, b.ty(like).shape);
    b.add(Op::Iota { dim, ty }, &[])
}

fn cumulative(
    b: &mut Builder,
    kind: CumulativeKind,
    axis: usize,
    reverse: bool,
    x: NodeId,
) -> Result<NodeId> {
    b.add(
        Op::Cumulative {
            kind,
            axis,
            reverse,
        },
        &[x],
    )
}

/// `convert(p)` of a bool mask to `like`'s dtype.
fn as_float(b: &mut Builder, p: NodeId, like: NodeId) -> Result<NodeId> {
    let dt = b.ty(like).dtype;
    b.add(Op::Convert(dt), &[p])
}

/// The cotangent of operand `output` of `sort` (the others get none).
pub(super) fn sort_vjp(
    b: &mut Builder,
    dim: usize,
    num_keys: usize,
    output: usize,
    xs: &[NodeId],
    needed: &[bool],
    g: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let mut out = vec![None; xs.len()];
    if !needed[output] || !b.ty(xs[output]).dtype.is_float() {
        return Ok(out);
    }
    let iota = iota_i32(b, xs[0], dim)?;
    let mut ops: Vec<NodeId> = xs[..num_keys].to_vec();
    ops.push(iota);
    let perm = b.add(
        Op::Sort {
            dim,
            num_keys,
            output: num_keys,
        },
        &ops,
    )?;
    // Sorting `(perm, g)` by `perm` puts `g[i]` at position `perm[i]`: the inverse permutation.
    out[output] = Some(b.add(
        Op::Sort {
            dim,
            num_keys: 1,
            output: 1,
        },
        &[perm, g],
    )?);
    Ok(out)
}

/// The tangent of `sort`'s output `output` from the tangent `t` of that operand.
pub(super) fn sort_jvp(
    b: &mut Builder,
    dim: usize,
    num_keys: usize,
    xs: &[NodeId],
    t: NodeId,
) -> Result<NodeId> {
    let mut ops: Vec<NodeId> = xs[..num_keys].to_vec();
    ops.push(t);
    b.add(
        Op::Sort {
            dim,
            num_keys,
            output: num_keys,
        },
        &ops,
    )
}

/// The pieces of `cumprod`'s derivative: `(z, x', P, c)` (see the module doc).
fn cumprod_parts(
    b: &mut Builder,
    axis: usize,
    reverse: bool,
    x: NodeId,
) -> Result<(NodeId, NodeId, NodeId, NodeId)> {
    let zero = b.full_like(x, 0.0)?;
    let one = b.full_like(x, 1.0)?;
    let z = b.cmp(CompareOp::Eq, x, zero)?;
    let xp = b.select(z, one, x)?;
    let p = cumulative(b, CumulativeKind::Prod, axis, reverse, xp)?;
    let zf = as_float(b, z, x)?;
    let c = cumulative(b, CumulativeKind::Sum, axis, reverse, zf)?;
    Ok((z, xp, p, c))
}

/// `c == v` for the zero count `c`.
fn count_is(b: &mut Builder, c: NodeId, v: f64) -> Result<NodeId> {
    let k = b.full_like(c, v)?;
    b.cmp(CompareOp::Eq, c, k)
}

/// The n x n mask of `cummax`/`cummin` along `axis` (inserted as dims `axis` = k and
/// `axis + 1` = i), as the dtype of `x`, and the count per output, shaped like `y`.
fn extremum_mask(
    b: &mut Builder,
    axis: usize,
    reverse: bool,
    x: NodeId,
    y: NodeId,
) -> Result<(NodeId, NodeId)> {
    let ty = b.ty(x);
    let r = ty.rank();
    let mut dims = ty.dims().to_vec();
    dims.insert(axis + 1, ty.dims()[axis]);
    let big = Shape::from(dims.clone());
    // x_k: every dim but the new `axis + 1`; y_i: every dim but `axis`.
    let xk_dims: Vec<usize> = (0..r).map(|d| if d <= axis { d } else { d + 1 }).collect();
    let yi_dims: Vec<usize> = (0..r).map(|d| if d < axis { d } else { d + 1 }).collect();
    let xk = b.broadcast(x, &big, xk_dims)?;
    let yi = b.broadcast(y, &big, yi_dims)?;
    let eq = b.cmp(CompareOp::Eq, xk, yi)?;
    let ity = TensorType::new(DType::I32, big.clone());
    let k = b.add(
        Op::Iota {
            dim: axis,
            ty: ity.clone(),
        },
        &[],
    )?;
    let i = b.add(
        Op::Iota {
            dim: axis + 1,
            ty: ity,
        },
        &[],
    )?;
    let order = b.cmp(
        if reverse {
            CompareOp::Ge
        } else {
            CompareOp::Le
        },
        k,
        i,
    )?;
    let both = b.add(Op::Binary(BinaryOp::And), &[eq, order])?;
    let m = b.add(Op::Convert(ty.dtype), &[both])?;
    let n = b.reduce_sum(m, vec![axis])?;
    Ok((m, n))
}

/// The cotangent of a cumulative op's operand.
pub(super) fn cumulative_vjp(
    b: &mut Builder,
    kind: CumulativeKind,
    axis: usize,
    reverse: bool,
    x: NodeId,
    y: NodeId,
    g: NodeId,
) -> Result<Option<NodeId>> {
    if !b.ty(x).dtype.is_float() {
        return Ok(None);
    }
    Ok(Some(match kind {
        CumulativeKind::Sum => cumulative(b, CumulativeKind::Sum, axis, !reverse, g)?,
        CumulativeKind::Prod => {
            let (z, xp, p, c) = cumprod_parts(b, axis, reverse, x)?;
            let gp = b.mul(g, p)?;
            let zero = b.full_like(x, 0.0)?;
            let c0 = count_is(b, c, 0.0)?;
            let c1 = count_is(b, c, 1.0)?;
            let a0 = b.select(c0, gp, zero)?;
            let a1 = b.select(c1, gp, zero)?;
            let s0 = cumulative(b, CumulativeKind::Sum, axis, !reverse, a0)?;
            let s1 = cumulative(b, CumulativeKind::Sum, axis, !reverse, a1)?;
            let d0 = b.bin(BinaryOp::Div, s0, xp)?;
            b.select(z, s1, d0)?
        }
        CumulativeKind::Max | CumulativeKind::Min => {
            let (m, n) = extremum_mask(b, axis, reverse, x, y)?;
            let share = b.bin(BinaryOp::Div, g, n)?;
            let big = b.ty(m).shape;
            let r = b.ty(x).rank();
            let yi_dims: Vec<usize> = (0..r).map(|d| if d < axis { d } else { d + 1 }).collect();
            let sb = b.broadcast(share, &big, yi_dims)?;
            let prod = b.mul(m, sb)?;
            b.reduce_sum(prod, vec![axis + 1])?
        }
    }))
}

/// The tangent of a cumulative op from its operand's tangent `t`.
pub(super) fn cumulative_jvp(
    b: &mut Builder,
    kind: CumulativeKind,
    axis: usize,
    reverse: bool,
    x: NodeId,
    y: NodeId,
    t: NodeId,
) -> Result<Option<NodeId>> {
    if !b.ty(x).dtype.is_float() {
        return Ok(None);
    }
    Ok(Some(match kind {
        CumulativeKind::Sum => cumulative(b, CumulativeKind::Sum, axis, reverse, t)?,
        CumulativeKind::Prod => {
            let (z, xp, p, c) = cumprod_parts(b, axis, reverse, x)?;
            let zero = b.full_like(x, 0.0)?;
            let q = b.bin(BinaryOp::Div, t, xp)?;
            let s0 = cumulative(b, CumulativeKind::Sum, axis, reverse, q)?;
            let tz = b.select(z, t, zero)?;
            let s1 = cumulative(b, CumulativeKind::Sum, axis, reverse, tz)?;
            let v0 = b.mul(p, s0)?;
            let v1 = b.mul(p, s1)?;
            let c0 = count_is(b, c, 0.0)?;
            let c1 = count_is(b, c, 1.0)?;
            let inner = b.select(c1, v1, zero)?;
            b.select(c0, v0, inner)?
        }
        CumulativeKind::Max | CumulativeKind::Min => {
            let (m, n) = extremum_mask(b, axis, reverse, x, y)?;
            let big = b.ty(m).shape;
            let r = b.ty(x).rank();
            let xk_dims: Vec<usize> = (0..r).map(|d| if d <= axis { d } else { d + 1 }).collect();
            let tb = b.broadcast(t, &big, xk_dims)?;
            let prod = b.mul(m, tb)?;
            let s = b.reduce_sum(prod, vec![axis])?;
            b.bin(BinaryOp::Div, s, n)?
        }
    }))
}
