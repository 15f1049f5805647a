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
//! - `cummax`/`cummin`: the derivative of JAX's definition, whose JVP differentiates the
//!   associative (parallel prefix) scan of binary `max`/`min` over the axis (its
//!   `_cumulative_jvp_rule`): the rules here build that scan's tree (`scan_tree`: combine
//!   adjacent pairs, scan the halves recursively, combine the evens, interleave) on the primal
//!   and differentiate it with the `vjp`/`jvp` passes themselves. Binary `max` shares a tie
//!   1/2 : 1/2 at each combine, so ties of any multiplicity split as JAX's do (by the tree, not
//!   equally), and the cost is linear in the scanned length with log depth.
//! - `rev`: linear and its own transpose.

use tessera_ir::{BinaryOp, CompareOp, CumulativeKind, DType, NodeId, Op, TensorType};

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

/// `x` sliced along `axis` from `start` to `limit` by `stride` (the other dims whole).
fn slice_axis(
    b: &mut Builder,
    x: NodeId,
    axis: usize,
    (start, limit, stride): (usize, usize, usize),
) -> Result<NodeId> {
    let dims = b.ty(x).dims().to_vec();
    let mut lo = vec![0; dims.len()];
    let mut step = vec![1; dims.len()];
    let mut hi = dims;
    lo[axis] = start;
    hi[axis] = limit.max(start);
    step[axis] = stride;
    b.add(
        Op::Slice {
            start: lo,
            limit: hi,
            stride: step,
        },
        &[x],
    )
}

/// JAX's `associative_scan` of the binary `op` along `axis` (forward): pairs `(0,1), (2,3), ..`
/// combined, that half scanned recursively (the odd outputs), each even output `2j` the odd
/// output `2j - 1` combined with element `2j`, and the two interleaved. Built so that its
/// derivative is JAX's derivative of `cummax`/`cummin`; its value equals the cumulative op's.
fn scan_tree(b: &mut Builder, op: BinaryOp, axis: usize, x: NodeId) -> Result<NodeId> {
    let n = b.ty(x).dims()[axis];
    if n < 2 {
        return Ok(x);
    }
    let evens = slice_axis(b, x, axis, (0, n - 1, 2))?;
    let odds = slice_axis(b, x, axis, (1, n, 2))?;
    let pairs = b.bin(op, evens, odds)?;
    let odd = scan_tree(b, op, axis, pairs)?;
    let m = n / 2;
    let prev = if n.is_multiple_of(2) {
        slice_axis(b, odd, axis, (0, m - 1, 1))?
    } else {
        odd
    };
    let rest = slice_axis(b, x, axis, (2, n, 2))?;
    let tail = b.bin(op, prev, rest)?;
    let first = slice_axis(b, x, axis, (0, 1, 1))?;
    let even = b.add(Op::Concatenate { dim: axis }, &[first, tail])?;
    // Interleave as JAX's `_interleave`: each padded with zeros between its elements, added.
    let rank = b.ty(x).rank();
    let zero = b.zero_scalar(b.ty(x).dtype)?;
    let pad = |b: &mut Builder, v: NodeId, low: i64, high: i64| {
        let mut lo = vec![0; rank];
        let mut hi = vec![0; rank];
        let mut interior = vec![0; rank];
        lo[axis] = low;
        hi[axis] = high;
        interior[axis] = 1;
        b.add(
            Op::Pad {
                low: lo,
                high: hi,
                interior,
            },
            &[v, zero],
        )
    };
    let same = n.is_multiple_of(2);
    let e = pad(b, even, 0, i64::from(same))?;
    let o = pad(b, odd, 1, i64::from(!same))?;
    b.bin(BinaryOp::Add, e, o)
}

/// The binary op a cumulative extremum scans with (sum and prod are never rebuilt: their
/// rules are closed forms).
fn extremum_op(kind: CumulativeKind) -> BinaryOp {
    match kind {
        CumulativeKind::Max => BinaryOp::Max,
        CumulativeKind::Min => BinaryOp::Min,
        CumulativeKind::Sum => BinaryOp::Add,
        CumulativeKind::Prod => BinaryOp::Mul,
    }
}

/// `cummax`/`cummin` of `x` rebuilt as JAX's scan tree (reversed around it for `reverse`).
fn extremum_scan(
    b: &mut Builder,
    op: BinaryOp,
    axis: usize,
    reverse: bool,
    x: NodeId,
) -> Result<NodeId> {
    let rev = |b: &mut Builder, v: NodeId| b.add(Op::Rev { dims: vec![axis] }, &[v]);
    let start = if reverse { rev(b, x)? } else { x };
    let s = scan_tree(b, op, axis, start)?;
    if reverse { rev(b, s) } else { Ok(s) }
}

/// The cotangent of a cumulative op's operand.
pub(super) fn cumulative_vjp(
    b: &mut Builder,
    kind: CumulativeKind,
    axis: usize,
    reverse: bool,
    x: NodeId,
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
            let op = extremum_op(kind);
            let s = extremum_scan(b, op, axis, reverse, x)?;
            match super::vjp(b.g, &[s], &[g], &[x])?.pop().flatten() {
                Some(ct) => ct,
                None => b.full_like(x, 0.0)?,
            }
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
            let op = extremum_op(kind);
            let s = extremum_scan(b, op, axis, reverse, x)?;
            match super::jvp(b.g, &[x], &[t], &[s])?.pop().flatten() {
                Some(tan) => tan,
                None => b.full_like(x, 0.0)?,
            }
        }
    }))
}
