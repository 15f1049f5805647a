//! Forward-mode automatic differentiation (JVP) as a graph-to-graph pass.
//!
//! Consumes a graph, the values to differentiate with respect to (`wrt`), a tangent node for
//! each (typically new parameters the caller added), and the values whose tangents are wanted
//! (`outputs`). Walks the graph once in topological order and appends, for every node that
//! depends on a `wrt` and that an output depends on, the node holding its tangent; returns the tangent of each output (`None`
//! when the output does not depend on any `wrt`: its tangent is zero). Preserves every existing
//! node.
//!
//! One JVP rule per op, in `jvp_rule`, a `match` with no wildcard arm. Rules only combine the
//! tangents that exist (a missing tangent is a zero that is never built). They are written in
//! ops that have both JVP and VJP rules, so the tangent graph can be differentiated again in
//! either mode (`hessian = jacfwd(jacrev(f))`). Where the VJP follows a particular formula (max
//! at ties shares equally), the JVP is its transpose, so `jacfwd` and `jacrev` agree.

use std::collections::{HashMap, HashSet};

use tessera_ir::{
    BinaryOp, CollectiveOp, CompareOp, DotDims, Graph, NodeId, Op, ReduceKind, UnaryOp,
};

use super::{AutodiffError, Builder, Result, elem};

/// Appends the tangent graph; see the module doc.
pub fn jvp(
    g: &mut Graph,
    wrt: &[NodeId],
    tangents: &[NodeId],
    outputs: &[NodeId],
) -> Result<Vec<Option<NodeId>>> {
    tessera_ir::verify(g).map_err(|e| AutodiffError::Malformed(e.to_string()))?;
    if let Some(id) = wrt
        .iter()
        .chain(tangents)
        .chain(outputs)
        .find(|&&id| !g.contains(id))
    {
        return Err(AutodiffError::Malformed(format!(
            "{id:?} (an input, tangent or output of the jvp) is not a node of the graph"
        )));
    }
    if wrt.len() != tangents.len() {
        return Err(AutodiffError::Malformed(format!(
            "jvp: {} inputs with {} tangents",
            wrt.len(),
            tangents.len()
        )));
    }
    for (&w, &t) in wrt.iter().zip(tangents) {
        if !g.ty(w).dtype.is_float() {
            return Err(AutodiffError::NonFloatInput(g.ty(w).clone()));
        }
        if g.ty(t) != g.ty(w) {
            return Err(AutodiffError::Malformed(format!(
                "jvp: the tangent {t:?} has type {}, its input {w:?} has type {}",
                g.ty(t),
                g.ty(w)
            )));
        }
    }
    let order = g.topo_order();
    // Only the outputs' ancestors need tangents: a caller that runs the pass once per basis
    // vector on one graph must not differentiate the earlier passes' (dead) tangent nodes.
    let mut wanted: HashSet<NodeId> = outputs.iter().copied().collect();
    let mut stack: Vec<NodeId> = outputs.to_vec();
    while let Some(n) = stack.pop() {
        for o in g.operands(n) {
            if wanted.insert(o) {
                stack.push(o);
            }
        }
    }
    let seeds: HashSet<NodeId> = wrt.iter().copied().collect();
    let mut tan: HashMap<NodeId, NodeId> = HashMap::new();
    let mut b = Builder {
        g,
        loc: None,
        op: String::new(),
    };
    for (&w, &t) in wrt.iter().zip(tangents) {
        // The same input named twice: its tangents add up.
        let sum = match tan.get(&w) {
            Some(&prev) => b.bin(BinaryOp::Add, prev, t)?,
            None => t,
        };
        tan.insert(w, sum);
    }
    // The tangent of each result of a region node, read by its `get_result`s.
    let mut result_tan: HashMap<(NodeId, usize), NodeId> = HashMap::new();
    for &id in &order {
        // A region node's token is not a float, but its results may be.
        let is_region = matches!(b.g.op(id), Op::Region(_));
        if seeds.contains(&id)
            || !wanted.contains(&id)
            || !(is_region || b.g.ty(id).dtype.is_float())
        {
            continue;
        }
        let xs = b.g.operands(id);
        if let Op::GetResult { index, .. } = b.g.op(id) {
            if let Some(&t) = result_tan.get(&(xs[0], *index)) {
                tan.insert(id, t);
            }
            continue;
        }
        let ts: Vec<Option<NodeId>> = xs.iter().map(|x| tan.get(x).copied()).collect();
        if ts.iter().all(Option::is_none) {
            continue;
        }
        let node = b.g.node(id).clone();
        b.op = format!("{} (forward mode)", node.op.name());
        b.loc = Some(match &node.loc {
            Some(l) => format!("{l} (jvp of {})", node.op.name()),
            None => format!("jvp of {}", node.op.name()),
        });
        let at = Tan {
            y: id,
            xs: &xs,
            ts: &ts,
        };
        if let Op::Region(r) = &node.op {
            // The results some wanted `get_result` reads: only their tangents are read out.
            let used: HashSet<usize> =
                b.g.users(id)
                    .into_iter()
                    .filter(|u| wanted.contains(u))
                    .filter_map(|u| {
                        if let Op::GetResult { index, .. } = b.g.op(u) {
                            Some(*index)
                        } else {
                            None
                        }
                    })
                    .collect();
            for (i, t) in region::jvp(&mut b, r, &xs, &ts, &used)?
                .into_iter()
                .enumerate()
            {
                if let Some(t) = t {
                    result_tan.insert((id, i), t);
                }
            }
        } else if let Some(t) = jvp_rule(&mut b, &node.op, &at)? {
            tan.insert(id, t);
        }
    }
    Ok(outputs.iter().map(|o| tan.get(o).copied()).collect())
}

/// The node a JVP rule differentiates: `y = op(xs)`, `ts[i]` the tangent of `xs[i]` (`None`:
/// zero). At least one tangent is present.
struct Tan<'a> {
    y: NodeId,
    xs: &'a [NodeId],
    ts: &'a [Option<NodeId>],
}

impl Tan<'_> {
    /// Operand `i`'s tangent, or a zero shaped like the operand.
    fn or_zero(&self, b: &mut Builder, i: usize) -> Result<NodeId> {
        match self.ts[i] {
            Some(t) => Ok(t),
            None => b.full_like(self.xs[i], 0.0),
        }
    }

    /// The first present tangent (the rule of a one-operand op).
    fn t(&self) -> Result<NodeId> {
        self.ts
            .iter()
            .flatten()
            .next()
            .copied()
            .ok_or_else(|| AutodiffError::Malformed("a JVP rule was called with no tangent".into()))
    }
}

/// `a + c` where each may be absent (zero).
fn add_opt(b: &mut Builder, a: Option<NodeId>, c: Option<NodeId>) -> Result<Option<NodeId>> {
    Ok(match (a, c) {
        (Some(a), Some(c)) => Some(b.bin(BinaryOp::Add, a, c)?),
        (Some(a), None) => Some(a),
        (None, c) => c,
    })
}

/// `f(t)` for a present tangent `t`, `None` for an absent one.
fn map_opt(
    b: &mut Builder,
    t: Option<NodeId>,
    f: impl FnOnce(&mut Builder, NodeId) -> Result<NodeId>,
) -> Result<Option<NodeId>> {
    t.map(|t| f(b, t)).transpose()
}

/// The tangent of `y = op(xs)` from its operands' tangents (`None`: zero).
///
/// Grouped by op family like `vjp_rule`; this `match` only dispatches.
fn jvp_rule(b: &mut Builder, op: &Op, at: &Tan) -> Result<Option<NodeId>> {
    match op {
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => Ok(None),
        Op::Unary(u) => unary(b, *u, at),
        Op::Binary(op2) => binary(b, *op2, at),
        Op::Compare(_) | Op::ArgMax { .. } => Ok(None),
        Op::Select => {
            let p = at.xs[0];
            let t = at.or_zero(b, 1)?;
            let f = at.or_zero(b, 2)?;
            Ok(Some(b.select(p, t, f)?))
        }
        Op::Convert(to) => {
            let from = b.ty(at.xs[0]).dtype;
            if from.is_float() && to.is_float() {
                Ok(Some(b.add(op.clone(), &[at.t()?])?))
            } else {
                Ok(None)
            }
        }
        // Reinterpreting bits has no derivative, except the identity (a type to itself).
        Op::Bitcast(to) => {
            if b.ty(at.xs[0]).dtype == *to {
                Ok(Some(at.t()?))
            } else {
                Ok(None)
            }
        }
        // The linear ops: the same op on the tangent.
        Op::BroadcastInDim { .. }
        | Op::Reshape(_)
        | Op::Transpose(_)
        | Op::Slice { .. }
        | Op::ShardingConstraint(_) => Ok(Some(b.add(op.clone(), &[at.t()?])?)),
        Op::Concatenate { .. } => {
            let ts = (0..at.xs.len())
                .map(|i| at.or_zero(b, i))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(b.add(op.clone(), &ts)?))
        }
        Op::Pad { .. } => {
            let tx = at.or_zero(b, 0)?;
            let tv = at.or_zero(b, 1)?;
            Ok(Some(b.add(op.clone(), &[tx, tv])?))
        }
        Op::Reduce { kind, axes } => reduce(b, *kind, axes, at),
        Op::DotGeneral(dd) => dot_general(b, dd, at),
        Op::Collective(c) => collective(b, op, c, at),
        // The identity on values, with no derivative.
        Op::StopGradient => Ok(None),
        // `jvp` reads a `get_result`'s tangent from its region's, and calls `region::jvp` for
        // the region node; neither reaches this table.
        Op::Region(_) | Op::GetResult { .. } => Err(AutodiffError::Malformed(format!(
            "{} reached the per-op JVP table: region tangents go through region::jvp",
            op.name()
        ))),
        Op::Conv(cd) => super::conv::conv_jvp(b, cd, at.xs, at.ts),
        Op::ReduceWindow { kind, win } => {
            super::conv::reduce_window_jvp(b, *kind, win, at.xs[0], at.y, at.t()?)
        }
        Op::Gather(d) => crate::gather::gather_jvp(b, d, at.xs[1], at.ts[0]),
        Op::Scatter(d) => crate::gather::scatter_jvp(
            b,
            d,
            (at.xs[0], at.xs[1], at.xs[2], at.y),
            (at.ts[0], at.ts[2]),
        ),
        Op::Sort {
            dim,
            num_keys,
            output,
        } => match at.ts[*output] {
            Some(t) if b.ty(t).dtype.is_float() => Ok(Some(super::sorting::sort_jvp(
                b, *dim, *num_keys, at.xs, t,
            )?)),
            Some(_) | None => Ok(None),
        },
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => super::sorting::cumulative_jvp(b, *kind, *axis, *reverse, at.xs[0], at.t()?),
        Op::Rev { .. } => Ok(Some(b.add(op.clone(), &[at.t()?])?)),
    }
}

/// JVPs of the unary elementwise ops: the tangent times the derivative, in the VJP's formulas.
fn unary(b: &mut Builder, u: UnaryOp, at: &Tan) -> Result<Option<NodeId>> {
    let (x, y, t) = (at.xs[0], at.y, at.t()?);
    let derivative = match u {
        UnaryOp::Neg => return Ok(Some(b.un(UnaryOp::Neg, t)?)),
        UnaryOp::Abs => b.un(UnaryOp::Sign, x)?,
        // Piecewise constant: zero almost everywhere, as in JAX.
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Not => {
            return Ok(None);
        }
        UnaryOp::Exp => y,
        UnaryOp::Log => return Ok(Some(b.bin(BinaryOp::Div, t, x)?)),
        UnaryOp::Log1p => {
            let one = b.full_like(x, 1.0)?;
            let d = b.bin(BinaryOp::Add, x, one)?;
            return Ok(Some(b.bin(BinaryOp::Div, t, d)?));
        }
        UnaryOp::Expm1 => {
            let one = b.full_like(y, 1.0)?;
            b.bin(BinaryOp::Add, y, one)?
        }
        // JAX: (t + t*ans) * (1 - ans).
        UnaryOp::Tanh => {
            let one = b.full_like(y, 1.0)?;
            let ty = b.mul(t, y)?;
            let s = b.bin(BinaryOp::Add, t, ty)?;
            let d = b.bin(BinaryOp::Sub, one, y)?;
            return Ok(Some(b.mul(s, d)?));
        }
        UnaryOp::Logistic => {
            let one = b.full_like(y, 1.0)?;
            let d = b.bin(BinaryOp::Sub, one, y)?;
            let ty = b.mul(t, y)?;
            return Ok(Some(b.mul(ty, d)?));
        }
        UnaryOp::Sin => b.un(UnaryOp::Cos, x)?,
        UnaryOp::Cos => {
            let s = b.un(UnaryOp::Sin, x)?;
            let ts = b.mul(t, s)?;
            return Ok(Some(b.un(UnaryOp::Neg, ts)?));
        }
        UnaryOp::Sqrt => {
            let half = b.full_like(y, 0.5)?;
            b.bin(BinaryOp::Div, half, y)?
        }
        UnaryOp::Rsqrt => {
            let c = b.full_like(y, -0.5)?;
            let q = b.bin(BinaryOp::Div, y, x)?;
            b.mul(c, q)?
        }
        UnaryOp::Erf => {
            let c = b.full_like(x, std::f64::consts::FRAC_2_SQRT_PI)?;
            let x2 = b.mul(x, x)?;
            let nx2 = b.un(UnaryOp::Neg, x2)?;
            let e = b.un(UnaryOp::Exp, nx2)?;
            b.mul(c, e)?
        }
        UnaryOp::ErfInv => {
            let c = b.full_like(y, std::f64::consts::PI.sqrt() / 2.0)?;
            let y2 = b.mul(y, y)?;
            let e = b.un(UnaryOp::Exp, y2)?;
            b.mul(c, e)?
        }
        UnaryOp::Tan => elem::tan(b, y)?,
        UnaryOp::Asin => elem::asin(b, x, false)?,
        UnaryOp::Acos => elem::asin(b, x, true)?,
        UnaryOp::Atan => elem::atan(b, x)?,
        UnaryOp::Sinh => elem::sinh_cosh(b, x, false)?,
        UnaryOp::Cosh => elem::sinh_cosh(b, x, true)?,
        UnaryOp::Asinh => elem::asinh_acosh(b, x, false)?,
        UnaryOp::Acosh => elem::asinh_acosh(b, x, true)?,
        UnaryOp::Atanh => elem::atanh(b, x)?,
        UnaryOp::Exp2 => elem::exp2(b, y)?,
    };
    Ok(Some(b.mul(t, derivative)?))
}

/// JVPs of the binary elementwise ops: the sum of each present tangent's share.
fn binary(b: &mut Builder, op: BinaryOp, at: &Tan) -> Result<Option<NodeId>> {
    let (x, z, y) = (at.xs[0], at.xs[1], at.y);
    let (tx, tz) = (at.ts[0], at.ts[1]);
    match op {
        BinaryOp::Add => add_opt(b, tx, tz),
        BinaryOp::Sub => match (tx, tz) {
            (Some(tx), Some(tz)) => Ok(Some(b.bin(BinaryOp::Sub, tx, tz)?)),
            (tx, tz) => {
                let nz = map_opt(b, tz, |b, t| b.un(UnaryOp::Neg, t))?;
                add_opt(b, tx, nz)
            }
        },
        BinaryOp::Mul => {
            let sx = map_opt(b, tx, |b, t| b.mul(t, z))?;
            let sz = map_opt(b, tz, |b, t| b.mul(x, t))?;
            add_opt(b, sx, sz)
        }
        BinaryOp::Div => {
            let sx = map_opt(b, tx, |b, t| b.bin(BinaryOp::Div, t, z))?;
            let sz = map_opt(b, tz, |b, t| {
                let nt = b.un(UnaryOp::Neg, t)?;
                let n = b.mul(nt, x)?;
                let zz = b.mul(z, z)?;
                b.bin(BinaryOp::Div, n, zz)
            })?;
            add_opt(b, sx, sz)
        }
        // rem(x, z) = x - z * trunc(x / z).
        BinaryOp::Rem => {
            let sz = map_opt(b, tz, |b, t| {
                let q = b.bin(BinaryOp::Div, x, z)?;
                let s = b.un(UnaryOp::Sign, q)?;
                let a = b.un(UnaryOp::Abs, q)?;
                let f = b.un(UnaryOp::Floor, a)?;
                let tr = b.mul(s, f)?;
                let p = b.mul(t, tr)?;
                b.un(UnaryOp::Neg, p)
            })?;
            add_opt(b, tx, sz)
        }
        // The transpose of the VJP's balanced rule: the tangent of the larger operand, the
        // mean of both at a tie (JAX's `_balanced_eq`).
        BinaryOp::Max | BinaryOp::Min => {
            let weight = |b: &mut Builder, a: NodeId, other: NodeId| -> Result<NodeId> {
                let half = b.full_like(y, 0.5)?;
                let one = b.full_like(y, 1.0)?;
                let zero = b.full_like(y, 0.0)?;
                let a_is = b.cmp(CompareOp::Eq, a, y)?;
                let o_is = b.cmp(CompareOp::Eq, other, y)?;
                let w = b.select(o_is, half, one)?;
                b.select(a_is, w, zero)
            };
            let sx = map_opt(b, tx, |b, t| {
                let w = weight(b, x, z)?;
                b.mul(t, w)
            })?;
            let sz = map_opt(b, tz, |b, t| {
                let w = weight(b, z, x)?;
                b.mul(t, w)
            })?;
            add_opt(b, sx, sz)
        }
        BinaryOp::Pow => {
            let sx = map_opt(b, tx, |b, t| {
                let one = b.full_like(z, 1.0)?;
                let zm1 = b.bin(BinaryOp::Sub, z, one)?;
                let p = b.bin(BinaryOp::Pow, x, zm1)?;
                let d = b.mul(z, p)?;
                b.mul(t, d)
            })?;
            // log(x) * x^z, with x == 0 giving 0 rather than NaN, as JAX.
            let sz = map_opt(b, tz, |b, t| {
                let zero = b.full_like(x, 0.0)?;
                let is0 = b.cmp(CompareOp::Eq, x, zero)?;
                let one = b.full_like(x, 1.0)?;
                let safe = b.select(is0, one, x)?;
                let l = b.un(UnaryOp::Log, safe)?;
                let ty = b.mul(t, y)?;
                b.mul(ty, l)
            })?;
            add_opt(b, sx, sz)
        }
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => Ok(None),
        BinaryOp::Atan2 => {
            let sx = map_opt(b, tx, |b, t| {
                let d = elem::atan2(b, x, z, true)?;
                b.mul(t, d)
            })?;
            let sz = map_opt(b, tz, |b, t| {
                let d = elem::atan2(b, x, z, false)?;
                b.mul(t, d)
            })?;
            add_opt(b, sx, sz)
        }
    }
}

/// `sum(t * mask) / sum(mask)` over `axes`, `mask` the elements equal to the extremum `y`:
/// the tangent of a max or min is the mean tangent of the elements that attain it (the
/// transpose of the VJP's chooser rule, as JAX's `_reduce_chooser_jvp_rule`).
fn reduce(b: &mut Builder, kind: ReduceKind, axes: &[usize], at: &Tan) -> Result<Option<NodeId>> {
    let (x, y, t) = (at.xs[0], at.y, at.t()?);
    match kind {
        ReduceKind::Sum => Ok(Some(b.reduce_sum(t, axes.to_vec())?)),
        ReduceKind::Max | ReduceKind::Min => {
            let from = b.ty(x);
            let kept: Vec<usize> = (0..from.rank()).filter(|d| !axes.contains(d)).collect();
            let yb = b.broadcast(y, &from.shape, kept)?;
            let eq = b.cmp(CompareOp::Eq, x, yb)?;
            let mask = b.add(Op::Convert(from.dtype), &[eq])?;
            let tm = b.mul(t, mask)?;
            let num = b.reduce_sum(tm, axes.to_vec())?;
            let counts = b.reduce_sum(mask, axes.to_vec())?;
            Ok(Some(b.bin(BinaryOp::Div, num, counts)?))
        }
    }
}

/// `dot(tl, r) + dot(l, tr)`, with the same dimension numbers.
fn dot_general(b: &mut Builder, dd: &DotDims, at: &Tan) -> Result<Option<NodeId>> {
    let (l, r) = (at.xs[0], at.xs[1]);
    let op = Op::DotGeneral(dd.clone());
    let sl = map_opt(b, at.ts[0], |b, t| b.add(op.clone(), &[t, r]))?;
    let sr = map_opt(b, at.ts[1], |b, t| b.add(op.clone(), &[l, t]))?;
    add_opt(b, sl, sr)
}

/// JVPs of the collectives. The sums and the data movers are linear: the same collective on
/// the tangent. A max or min takes the mean tangent of the devices whose value won (as
/// `reduce`), built from sum collectives so that it has a VJP too.
fn collective(b: &mut Builder, op: &Op, c: &CollectiveOp, at: &Tan) -> Result<Option<NodeId>> {
    let (x, y, t) = (at.xs[0], at.y, at.t()?);
    let chooser = |b: &mut Builder, full: NodeId, sum: CollectiveOp| -> Result<Option<NodeId>> {
        let dtype = b.ty(x).dtype;
        let eq = b.cmp(CompareOp::Eq, x, full)?;
        let mask = b.add(Op::Convert(dtype), &[eq])?;
        let tm = b.mul(t, mask)?;
        let num = b.add(Op::Collective(sum.clone()), &[tm])?;
        let counts = b.add(Op::Collective(sum), &[mask])?;
        Ok(Some(b.bin(BinaryOp::Div, num, counts)?))
    };
    match c {
        CollectiveOp::AxisIndex { .. } => Ok(None),
        CollectiveOp::AllReduce { kind, axes } => match kind {
            ReduceKind::Sum => Ok(Some(b.add(op.clone(), &[t])?)),
            ReduceKind::Max | ReduceKind::Min => chooser(
                b,
                y,
                CollectiveOp::AllReduce {
                    kind: ReduceKind::Sum,
                    axes: axes.clone(),
                },
            ),
        },
        CollectiveOp::ReduceScatter { kind, dim, axes } => match kind {
            ReduceKind::Sum => Ok(Some(b.add(op.clone(), &[t])?)),
            ReduceKind::Max | ReduceKind::Min => {
                // Each device holds one chunk of the result: gather it whole to compare.
                let full = b.add(
                    Op::Collective(CollectiveOp::AllGather {
                        dim: *dim,
                        axes: axes.clone(),
                    }),
                    &[y],
                )?;
                chooser(
                    b,
                    full,
                    CollectiveOp::ReduceScatter {
                        kind: ReduceKind::Sum,
                        dim: *dim,
                        axes: axes.clone(),
                    },
                )
            }
        },
        CollectiveOp::AllGather { .. }
        | CollectiveOp::AllToAll { .. }
        | CollectiveOp::CollectivePermute { .. } => Ok(Some(b.add(op.clone(), &[t])?)),
    }
}

/// Forward mode through region ops. Every rule is built from [`body_jvp`], the JVP of a body
/// as a graph of its own (`(params, tangents of some params) -> (outputs, tangents of the
/// float outputs)`), placed in a region of the same kind:
///
/// - `scan`: a `scan` whose consts, carries and xs each gain their tangents (every float carry
///   gains one, zero where the operand has none, since a carry's tangent can become nonzero in
///   a later step), and whose ys gain theirs;
/// - `while`: likewise, with the condition reading the primal carries only, so the trip count
///   is the primal loop's (forward mode needs no static trip count);
/// - `case`: a `case` on the same index whose branches are the branches' JVPs;
/// - `checkpoint`: a `checkpoint` of the body's JVP;
/// - `custom_vjp`: no rule, as in JAX: the user gave a reverse rule only.
///
/// The new region recomputes the primal results beside the tangents; the original region stays
/// (the primal program is untouched), and DCE removes it when only the tangents are used.
mod region {
    use std::collections::HashSet;

    use tessera_ir::{Graph, NodeId, Op, RegionOp, TensorType};

    use super::{AutodiffError, Builder, Result};

    /// The tangent of each result of region `r` applied to `xs`, whose tangents are `ts`.
    pub(super) fn jvp(
        b: &mut Builder,
        r: &RegionOp,
        xs: &[NodeId],
        ts: &[Option<NodeId>],
        used: &HashSet<usize>,
    ) -> Result<Vec<Option<NodeId>>> {
        let float = |b: &Builder, x: NodeId| b.ty(x).dtype.is_float();
        let results = |b: &mut Builder, r, operands: &[NodeId], at: &[Option<usize>]| {
            let at: Vec<Option<usize>> = (0..at.len())
                .map(|i| at[i].filter(|_| used.contains(&i)))
                .collect();
            results(b, r, operands, &at)
        };
        match r {
            RegionOp::Scan {
                length,
                reverse,
                consts: nc,
                carries: nk,
                body,
            } => {
                let (nc, nk) = (*nc, *nk);
                let nx = xs.len() - nc - nk;
                // Consts and xs gain the tangents they have; every float carry gains one.
                let mask: Vec<bool> = (0..xs.len())
                    .map(|i| {
                        if (nc..nc + nk).contains(&i) {
                            float(b, xs[i])
                        } else {
                            ts[i].is_some()
                        }
                    })
                    .collect();
                let (jb, float_o) = body_jvp(body, &mask)?;
                let ny = float_o.len() - nk;
                let m = |r: std::ops::Range<usize>| mask[r].iter().filter(|&&m| m).count();
                let (mc, mk, mx) = (m(0..nc), m(nc..nc + nk), m(nc + nk..xs.len()));
                let fy = float_o[nk..].iter().filter(|&&f| f).count();
                // The inner graph's params are [c, k, x, tc, tk, tx]; the region wants
                // [c, tc, k, tk, x, tx]. Its outputs are [k, y, tk, ty]; the region wants
                // [k, tk, y, ty].
                let (c, tc) = (0..nc, nc..nc + mc);
                let (k, tk) = (tc.end..tc.end + nk, tc.end + nk..tc.end + nk + mk);
                let (x, tx) = (tk.end..tk.end + nx, tk.end + nx..tk.end + nx + mx);
                let args: Vec<usize> = [c, k, x, tc, tk, tx].into_iter().flatten().collect();
                let outs: Vec<usize> = [
                    0..nk,
                    nk + ny..nk + ny + mk,
                    nk..nk + ny,
                    nk + ny + mk..nk + ny + mk + fy,
                ]
                .into_iter()
                .flatten()
                .collect();
                let wrapped = rewire("body", &jb, &args, &outs)?;
                let mut operands = xs[..nc].to_vec();
                operands.extend(tangents_of(b, xs, ts, &mask, 0..nc)?);
                operands.extend_from_slice(&xs[nc..nc + nk]);
                operands.extend(tangents_of(b, xs, ts, &mask, nc..nc + nk)?);
                operands.extend_from_slice(&xs[nc + nk..]);
                operands.extend(tangents_of(b, xs, ts, &mask, nc + nk..xs.len())?);
                let new = RegionOp::Scan {
                    length: *length,
                    reverse: *reverse,
                    consts: nc + mc,
                    carries: nk + mk,
                    body: wrapped,
                };
                // Results [k, tk, y, ty]: a carry's tangent after the carries, a y's after
                // the ys.
                let (mut kr, mut yr) = (0, 0);
                let at: Vec<Option<usize>> = (0..nk + ny)
                    .map(|i| {
                        float_o[i].then(|| {
                            if i < nk {
                                kr += 1;
                                nk + kr - 1
                            } else {
                                yr += 1;
                                nk + mk + ny + yr - 1
                            }
                        })
                    })
                    .collect();
                results(b, new, &operands, &at)
            }
            RegionOp::While {
                consts: nc,
                cond,
                body,
            } => {
                let nc = *nc;
                let nk = xs.len() - nc;
                let mask: Vec<bool> = (0..xs.len())
                    .map(|i| {
                        if i < nc {
                            ts[i].is_some()
                        } else {
                            float(b, xs[i])
                        }
                    })
                    .collect();
                let (jb, float_o) = body_jvp(body, &mask)?;
                let mc = mask[..nc].iter().filter(|&&m| m).count();
                let mk = mask[nc..].iter().filter(|&&m| m).count();
                // Region params [c, tc, k, tk]; the body's JVP takes [c, k, tc, tk].
                let (c, tc) = (0..nc, nc..nc + mc);
                let (k, tk) = (tc.end..tc.end + nk, tc.end + nk..tc.end + nk + mk);
                let body_args: Vec<usize> = [c.clone(), k.clone(), tc, tk]
                    .into_iter()
                    .flatten()
                    .collect();
                let all_outs: Vec<usize> = (0..nk + mk).collect();
                let new_body = rewire("body", &jb, &body_args, &all_outs)?;
                // The condition reads the primal consts and carries only.
                let types = param_types(&new_body);
                let cond_args: Vec<usize> = c.chain(k).collect();
                let new_cond = rewire_typed("cond", &types, cond, &cond_args, &[0])?;
                let mut operands = xs[..nc].to_vec();
                operands.extend(tangents_of(b, xs, ts, &mask, 0..nc)?);
                operands.extend_from_slice(&xs[nc..]);
                operands.extend(tangents_of(b, xs, ts, &mask, nc..xs.len())?);
                let new = RegionOp::While {
                    consts: nc + mc,
                    cond: new_cond,
                    body: new_body,
                };
                let mut next = nk;
                let at: Vec<Option<usize>> = float_o
                    .iter()
                    .map(|&f| {
                        f.then(|| {
                            next += 1;
                            next - 1
                        })
                    })
                    .collect();
                results(b, new, &operands, &at)
            }
            RegionOp::Case { branches } => {
                // The index (operand 0) has no tangent; the args gain the tangents they have.
                let mask: Vec<bool> = ts[1..].iter().map(Option::is_some).collect();
                let mut bodies = Vec::new();
                let mut float_o = Vec::new();
                for br in branches {
                    let (jb, f) = body_jvp(br, &mask)?;
                    bodies.push(jb);
                    float_o = f;
                }
                let mut operands = xs.to_vec();
                operands.extend(tangents_of(b, &xs[1..], &ts[1..], &mask, 0..mask.len())?);
                let new = RegionOp::Case { branches: bodies };
                let at = tangent_slots(&float_o);
                results(b, new, &operands, &at)
            }
            RegionOp::Checkpoint { body } => {
                let mask: Vec<bool> = ts.iter().map(Option::is_some).collect();
                let (jb, float_o) = body_jvp(body, &mask)?;
                let mut operands = xs.to_vec();
                operands.extend(tangents_of(b, xs, ts, &mask, 0..mask.len())?);
                let new = RegionOp::Checkpoint { body: jb };
                let at = tangent_slots(&float_o);
                results(b, new, &operands, &at)
            }
            RegionOp::CustomVjp { .. } => Err(AutodiffError::NotDifferentiable {
                op: "custom_vjp".into(),
                why: " in forward mode: it defines a reverse rule only (JAX refuses jvp of a \
                      custom_vjp function too); use custom_jvp-style code or reverse mode"
                    .into(),
            }),
        }
    }

    /// For outputs `[o, t(o) for float o]`: the result index of each output's tangent.
    fn tangent_slots(float_o: &[bool]) -> Vec<Option<usize>> {
        let mut next = float_o.len();
        float_o
            .iter()
            .map(|&f| {
                f.then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect()
    }

    /// The tangents of the operands `range` of `xs` that `mask` marks: `ts`, zero where absent.
    fn tangents_of(
        b: &mut Builder,
        xs: &[NodeId],
        ts: &[Option<NodeId>],
        mask: &[bool],
        range: std::ops::Range<usize>,
    ) -> Result<Vec<NodeId>> {
        let mut out = Vec::new();
        for i in range {
            if mask[i] {
                out.push(match ts[i] {
                    Some(t) => t,
                    None => b.full_like(xs[i], 0.0)?,
                });
            }
        }
        Ok(out)
    }

    /// Adds region `r` on `operands`; returns the `get_result` at each slot of `at`.
    fn results(
        b: &mut Builder,
        r: RegionOp,
        operands: &[NodeId],
        at: &[Option<usize>],
    ) -> Result<Vec<Option<NodeId>>> {
        let id = b.add(Op::Region(Box::new(r)), operands)?;
        let types = b.g.result_types(id).map_err(|error| AutodiffError::Rule {
            op: b.op.clone(),
            error,
        })?;
        at.iter()
            .map(|slot| {
                slot.map(|index| {
                    let ty = types[index].clone();
                    b.add(Op::GetResult { index, ty }, &[id])
                })
                .transpose()
            })
            .collect()
    }

    fn param_types(g: &Graph) -> Vec<TensorType> {
        g.params().iter().map(|&p| g.ty(p).clone()).collect()
    }

    /// The JVP of `body` as a graph: parameters `body`'s, then one tangent per parameter that
    /// `mask` marks; outputs `body`'s, then one tangent per float output (zero where the
    /// output does not depend on the marked parameters). Also returns which outputs are float.
    fn body_jvp(body: &Graph, mask: &[bool]) -> Result<(Graph, Vec<bool>)> {
        let mut g = body.clone();
        let wrt: Vec<NodeId> = g
            .params()
            .iter()
            .zip(mask)
            .filter(|(_, m)| **m)
            .map(|(&p, _)| p)
            .collect();
        let t_params: Vec<NodeId> = wrt
            .iter()
            .map(|&p| {
                let ty = g.ty(p).clone();
                g.add_param(ty)
            })
            .collect();
        let outs = g.outputs().to_vec();
        let float_o: Vec<bool> = outs.iter().map(|&o| g.ty(o).dtype.is_float()).collect();
        let tangents = super::jvp(&mut g, &wrt, &t_params, &outs)?;
        let mut all = outs.clone();
        let mut b = Builder {
            g: &mut g,
            loc: None,
            op: "region".into(),
        };
        for ((&o, t), &f) in outs.iter().zip(tangents).zip(&float_o) {
            if f {
                all.push(match t {
                    Some(t) => t,
                    None => b.full_like(o, 0.0)?,
                });
            }
        }
        g.set_outputs(all);
        g.remove_dead();
        Ok((g, float_o))
    }

    /// A graph with `inner`'s parameters permuted: its parameter `args[j]` is `inner`'s `j`-th;
    /// its outputs are `inner`'s at `outs`.
    fn rewire(label: &str, inner: &Graph, args: &[usize], outs: &[usize]) -> Result<Graph> {
        let inner_types = param_types(inner);
        let mut types = vec![None; args.len()];
        for (j, &a) in args.iter().enumerate() {
            types[a] = Some(inner_types[j].clone());
        }
        let types: Vec<TensorType> = types
            .into_iter()
            .map(|t| t.ok_or_else(|| AutodiffError::Malformed("a gap in a rewiring".into())))
            .collect::<Result<_>>()?;
        rewire_typed(label, &types, inner, args, outs)
    }

    /// A graph with parameters of `types` that runs `inner` on its parameters at `args` and
    /// returns `inner`'s outputs at `outs`.
    fn rewire_typed(
        label: &str,
        types: &[TensorType],
        inner: &Graph,
        args: &[usize],
        outs: &[usize],
    ) -> Result<Graph> {
        let mut g = Graph::new(label);
        g.mesh = inner.mesh.clone();
        let params: Vec<NodeId> = types.iter().map(|t| g.add_param(t.clone())).collect();
        let inner_args: Vec<NodeId> = args.iter().map(|&a| params[a]).collect();
        let results = g
            .inline(inner, &inner_args)
            .map_err(|error| AutodiffError::Rule {
                op: label.into(),
                error,
            })?;
        g.set_outputs(outs.iter().map(|&o| results[o]).collect());
        Ok(g)
    }
}
