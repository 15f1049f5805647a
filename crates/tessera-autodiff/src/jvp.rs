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

use super::{AutodiffError, Builder, Result};

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
    for &id in &order {
        if seeds.contains(&id) || !wanted.contains(&id) || !b.g.ty(id).dtype.is_float() {
            continue;
        }
        let xs = b.g.operands(id);
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
        if let Some(t) = jvp_rule(&mut b, &node.op, &at)? {
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
