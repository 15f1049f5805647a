//! Reverse-mode automatic differentiation as a graph-to-graph pass.
//!
//! Consumes a graph, the values to differentiate (`outputs`), a cotangent node for each, and the
//! values to differentiate with respect to (`wrt`). Appends the backward graph to the same graph
//! and returns, for each `wrt`, the node holding its cotangent (`None` when the outputs do not
//! depend on it). Preserves every existing node and value: the forward program computes what
//! it computed; the one change is that a differentiated `scan` gains results (the carries at
//! the start of each step, which its backward scan reads), see `region.rs`.
//!
//! One VJP rule per op, in `vjp_rule`, a `match` with no wildcard arm. The rules are written in
//! ops that have rules themselves, so the backward graph can be differentiated again (`grad`
//! of `grad`). Where JAX defines a gradient by a particular formula (tanh, max at ties), the rule
//! follows that formula, so results match JAX's to the last bit where the arithmetic allows.

pub mod batch;
pub use batch::{BatchError, batch};

use std::collections::{HashMap, HashSet};

mod elem;
mod jvp;
mod sorting;
pub use jvp::jvp;

use tessera_ir::{
    BinaryOp, CompareOp, DType, DotDims, Graph, Literal, NodeId, Op, ReduceKind, Shape, TensorType,
    TypeError, UnaryOp,
};

/// Why a graph could not be differentiated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    /// Differentiating with respect to a value that is not floating point.
    #[error(
        "cannot differentiate with respect to a value of type {0}: gradients need f32 or f64 inputs"
    )]
    NonFloatInput(TensorType),
    /// An op on the path from the inputs to the outputs has no gradient.
    #[error("{op} is not differentiable{why}")]
    NotDifferentiable { op: String, why: String },
    /// The graph to differentiate breaks an IR invariant, or names nodes it does not have.
    #[error("the graph to differentiate is malformed: {0}")]
    Malformed(String),
    /// A rule built an ill-typed node: a bug in the rule, reported instead of a panic.
    #[error("internal error in the VJP of {op}: {error}")]
    Rule { op: String, error: TypeError },
}

type Result<T> = std::result::Result<T, AutodiffError>;

mod conv;
mod gather;
mod region;

/// Appends the backward graph; see the module doc.
pub fn vjp(
    g: &mut Graph,
    outputs: &[NodeId],
    cotangents: &[NodeId],
    wrt: &[NodeId],
) -> Result<Vec<Option<NodeId>>> {
    tessera_ir::verify(g).map_err(|e| AutodiffError::Malformed(e.to_string()))?;
    if let Some(id) = outputs
        .iter()
        .chain(cotangents)
        .chain(wrt)
        .find(|&&id| !g.contains(id))
    {
        return Err(AutodiffError::Malformed(format!(
            "{id:?} (an output, cotangent or input to differentiate) is not a node of the graph"
        )));
    }
    if outputs.len() != cotangents.len() {
        return Err(AutodiffError::Malformed(format!(
            "{} outputs with {} cotangents",
            outputs.len(),
            cotangents.len()
        )));
    }
    for &w in wrt {
        if !g.ty(w).dtype.is_float() {
            return Err(AutodiffError::NonFloatInput(g.ty(w).clone()));
        }
    }
    let order = g.topo_order();
    // Nodes that depend on some `wrt`: only they receive cotangents.
    let mut active: HashSet<NodeId> = wrt.iter().copied().collect();
    for &id in &order {
        // A region node's token is not a float, but its results may be.
        let carries_ct = g.ty(id).dtype.is_float() || matches!(g.op(id), Op::Region(_));
        if carries_ct
            && !has_zero_derivative(g.op(id))
            && g.operands(id).iter().any(|o| active.contains(o))
        {
            active.insert(id);
        }
    }
    let mut ct: HashMap<NodeId, NodeId> = HashMap::with_capacity(active.len());
    // The cotangent of each result of a region node, from its `get_result`s.
    let mut result_ct: HashMap<(NodeId, usize), NodeId> = HashMap::new();
    let mut b = Builder {
        g,
        loc: None,
        op: String::new(),
    };
    for (&o, &c) in outputs.iter().zip(cotangents) {
        if active.contains(&o) {
            b.accumulate(&mut ct, o, c)?;
        }
    }
    for &id in order.iter().rev() {
        if !active.contains(&id) {
            continue;
        }
        let operands = b.g.operands(id);
        let node = b.g.node(id).clone();
        b.op = node.op.name().to_string();
        b.loc = Some(match &node.loc {
            Some(l) => format!("{l} (vjp of {})", node.op.name()),
            None => format!("vjp of {}", node.op.name()),
        });
        let needed: Vec<bool> = operands.iter().map(|o| active.contains(o)).collect();
        let contributions = if let Op::Region(r) = &node.op {
            let n = b.g.result_types(id).map_err(|error| AutodiffError::Rule {
                op: r.name().into(),
                error,
            })?;
            let cts: Vec<Option<NodeId>> = (0..n.len())
                .map(|i| result_ct.get(&(id, i)).copied())
                .collect();
            if cts.iter().all(Option::is_none) {
                continue;
            }
            region::vjp(&mut b, r, id, &operands, &needed, &cts)?
        } else {
            let Some(&g_ct) = ct.get(&id) else { continue };
            if let Op::GetResult { index, .. } = &node.op {
                let key = (operands[0], *index);
                let sum = match result_ct.get(&key) {
                    Some(&prev) => b.bin(BinaryOp::Add, prev, g_ct)?,
                    None => g_ct,
                };
                result_ct.insert(key, sum);
                continue;
            }
            vjp_rule(&mut b, &node.op, id, &operands, &needed, g_ct)?
        };
        for (pos, contribution) in contributions.into_iter().enumerate() {
            if let Some(c) = contribution {
                let operand = operands[pos];
                if active.contains(&operand) {
                    b.accumulate(&mut ct, operand, c)?;
                }
            }
        }
    }
    Ok(wrt.iter().map(|w| ct.get(w).copied()).collect())
}

/// Ops whose derivative is zero everywhere (their VJP rules give no share): a value one of them
/// computes is a constant for differentiation, so nothing that depends only through it is
/// differentiated (JAX's symbolic zeros: a `while_loop` behind a `stop_gradient` needs no
/// reverse mode).
fn has_zero_derivative(op: &Op) -> bool {
    matches!(
        op,
        Op::StopGradient
            | Op::Unary(UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round)
    )
}

/// Emits backward nodes, tagging each with the forward op's location.
struct Builder<'a> {
    g: &'a mut Graph,
    loc: Option<String>,
    op: String,
}

impl Builder<'_> {
    fn add(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        let id = self
            .g
            .add(op, operands)
            .map_err(|error| AutodiffError::Rule {
                op: self.op.clone(),
                error,
            })?;
        self.g.node_mut(id).loc = self.loc.clone();
        Ok(id)
    }

    fn ty(&self, id: NodeId) -> TensorType {
        self.g.ty(id).clone()
    }

    fn accumulate(
        &mut self,
        ct: &mut HashMap<NodeId, NodeId>,
        at: NodeId,
        c: NodeId,
    ) -> Result<()> {
        let sum = match ct.get(&at) {
            Some(&prev) => self.bin(BinaryOp::Add, prev, c)?,
            None => c,
        };
        ct.insert(at, sum);
        Ok(())
    }

    fn un(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        self.add(Op::Unary(op), &[x])
    }

    fn bin(&mut self, op: BinaryOp, x: NodeId, y: NodeId) -> Result<NodeId> {
        self.add(Op::Binary(op), &[x, y])
    }

    fn mul(&mut self, x: NodeId, y: NodeId) -> Result<NodeId> {
        self.bin(BinaryOp::Mul, x, y)
    }

    /// A tensor shaped like `like` filled with `v`: a scalar constant broadcast to the shape.
    fn full_like(&mut self, like: NodeId, v: f64) -> Result<NodeId> {
        let ty = self.ty(like);
        let c = self.add(
            Op::Constant(Literal::splat(&TensorType::scalar(ty.dtype), v)),
            &[],
        )?;
        if ty.rank() == 0 {
            return Ok(c);
        }
        self.add(
            Op::BroadcastInDim {
                shape: ty.shape,
                dims: vec![],
            },
            &[c],
        )
    }

    fn select(&mut self, p: NodeId, t: NodeId, f: NodeId) -> Result<NodeId> {
        self.add(Op::Select, &[p, t, f])
    }

    fn cmp(&mut self, op: CompareOp, x: NodeId, y: NodeId) -> Result<NodeId> {
        self.add(Op::Compare(op), &[x, y])
    }

    fn broadcast(&mut self, x: NodeId, shape: &Shape, dims: Vec<usize>) -> Result<NodeId> {
        if self.ty(x).shape == *shape {
            return Ok(x);
        }
        self.add(
            Op::BroadcastInDim {
                shape: shape.clone(),
                dims,
            },
            &[x],
        )
    }

    fn reduce_sum(&mut self, x: NodeId, axes: Vec<usize>) -> Result<NodeId> {
        if axes.is_empty() {
            return Ok(x);
        }
        self.add(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes,
            },
            &[x],
        )
    }

    fn reshape(&mut self, x: NodeId, shape: &Shape) -> Result<NodeId> {
        if self.ty(x).shape == *shape {
            return Ok(x);
        }
        self.add(Op::Reshape(shape.clone()), &[x])
    }

    fn transpose(&mut self, x: NodeId, perm: Vec<usize>) -> Result<NodeId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.add(Op::Transpose(perm), &[x])
    }

    /// A scalar zero of `dtype`.
    fn zero_scalar(&mut self, dtype: DType) -> Result<NodeId> {
        self.add(
            Op::Constant(Literal::splat(&TensorType::scalar(dtype), 0.0)),
            &[],
        )
    }
}

/// The node a VJP rule differentiates: `y = op(xs)` with cotangent `g`; `needed[i]` says
/// whether operand `i` depends on the inputs (the others' shares are not built).
struct At<'a> {
    y: NodeId,
    xs: &'a [NodeId],
    needed: &'a [bool],
    g: NodeId,
}

impl At<'_> {
    /// Operand `i`'s share, built by `f` only when it is needed.
    fn want(
        &self,
        b: &mut Builder,
        i: usize,
        f: impl FnOnce(&mut Builder) -> Result<NodeId>,
    ) -> Result<Option<NodeId>> {
        if self.needed[i] {
            Ok(Some(f(b)?))
        } else {
            Ok(None)
        }
    }
}

/// The cotangent contribution of `g` (the cotangent of node `y = op(operands)`) to each operand
/// that `needed` marks (the others do not depend on the inputs, so their share is not built).
///
/// The rules are grouped by op family, as JAX groups its primitives; this `match` only
/// dispatches. An empty vector means no operand receives a share (no gradient).
fn vjp_rule(
    b: &mut Builder,
    op: &Op,
    y: NodeId,
    xs: &[NodeId],
    needed: &[bool],
    g: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let at = At { y, xs, needed, g };
    match op {
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => Ok(vec![]),
        Op::Unary(u) => elementwise::unary(b, *u, &at),
        Op::Binary(op2) => elementwise::binary(b, *op2, &at),
        Op::Compare(_) => Ok(vec![]),
        Op::Select => elementwise::select(b, &at),
        Op::Convert(_) => elementwise::convert(b, &at),
        Op::Bitcast(to) => elementwise::bitcast(b, *to, &at),
        Op::BroadcastInDim { shape, dims } => movement::broadcast_in_dim(b, shape, dims, &at),
        Op::Reshape(_) => movement::reshape(b, &at),
        Op::Transpose(perm) => movement::transpose(b, perm, &at),
        Op::Slice { start, stride, .. } => movement::slice(b, start, stride, &at),
        Op::Concatenate { dim } => movement::concatenate(b, *dim, &at),
        Op::Pad {
            low,
            high,
            interior,
        } => movement::pad(b, low, high, interior, &at),
        Op::Reduce { kind, axes } => reduction::reduce(b, *kind, axes, &at),
        Op::ArgMax { .. } => Ok(vec![]),
        Op::DotGeneral(dd) => dot_general_vjp(b, dd, xs[0], xs[1], needed, g),
        Op::Collective(c) => collective::collective(b, op, c, &at),
        Op::ShardingConstraint(s) => {
            // On an Explicit mesh a reshard's cotangent goes back to the operand's type (JAX's
            // reshard transpose); elsewhere it keeps the user's hint.
            let back = match b.g.node(xs[0]).sharding.clone() {
                Some(o) if b.g.mesh.as_ref().is_some_and(|m| m.is_explicit()) => {
                    tessera_ir::Sharding {
                        unreduced: Vec::new(),
                        ..o
                    }
                }
                _ => s.clone(),
            };
            Ok(vec![Some(b.add(Op::ShardingConstraint(back), &[g])?)])
        }
        // The identity on values, with no derivative.
        Op::StopGradient => Ok(vec![]),
        // `vjp` routes a `get_result`'s cotangent to its region and calls `region::vjp` for
        // the region node; neither reaches this table.
        Op::Region(_) | Op::GetResult { .. } => Err(AutodiffError::Malformed(format!(
            "{} reached the per-op table: region cotangents go through region::vjp",
            op.name()
        ))),
        Op::Conv(cd) => conv::conv_vjp(b, cd, &at),
        Op::ReduceWindow { kind, win } => conv::reduce_window_vjp(b, *kind, win, &at),
        Op::Gather(d) => gather::gather_vjp(b, d, &at),
        Op::Scatter(d) => gather::scatter_vjp(b, d, &at),
        Op::Sort {
            dim,
            num_keys,
            output,
        } => sorting::sort_vjp(b, *dim, *num_keys, *output, xs, needed, g),
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => Ok(vec![sorting::cumulative_vjp(
            b, *kind, *axis, *reverse, xs[0], g,
        )?]),
        Op::Rev { .. } => Ok(vec![Some(b.add(op.clone(), &[g])?)]),
    }
}

/// VJPs of the elementwise ops.
mod elementwise {
    use super::{At, Builder, Result, elem};
    use tessera_ir::{BinaryOp, CompareOp, DType, NodeId, Op, UnaryOp};

    pub(super) fn unary(b: &mut Builder, u: UnaryOp, at: &At) -> Result<Vec<Option<NodeId>>> {
        let (x, y, g) = (at.xs[0], at.y, at.g);
        let ct = match u {
            UnaryOp::Neg => Some(b.un(UnaryOp::Neg, g)?),
            UnaryOp::Abs => {
                let s = b.un(UnaryOp::Sign, x)?;
                Some(b.mul(g, s)?)
            }
            // Piecewise constant: zero almost everywhere, as in JAX.
            UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => None,
            UnaryOp::Exp => Some(b.mul(g, y)?),
            UnaryOp::Log => Some(b.bin(BinaryOp::Div, g, x)?),
            UnaryOp::Log1p => {
                let one = b.full_like(x, 1.0)?;
                let d = b.bin(BinaryOp::Add, x, one)?;
                Some(b.bin(BinaryOp::Div, g, d)?)
            }
            UnaryOp::Expm1 => {
                let one = b.full_like(y, 1.0)?;
                let d = b.bin(BinaryOp::Add, y, one)?;
                Some(b.mul(g, d)?)
            }
            // JAX: (g + g*ans) * (1 - ans), transposed: a = g*(1-ans); a + a*ans.
            UnaryOp::Tanh => {
                let one = b.full_like(y, 1.0)?;
                let t = b.bin(BinaryOp::Sub, one, y)?;
                let a = b.mul(g, t)?;
                let ay = b.mul(a, y)?;
                Some(b.bin(BinaryOp::Add, a, ay)?)
            }
            UnaryOp::Logistic => {
                let one = b.full_like(y, 1.0)?;
                let t = b.bin(BinaryOp::Sub, one, y)?;
                let gy = b.mul(g, y)?;
                Some(b.mul(gy, t)?)
            }
            UnaryOp::Sin => {
                let c = b.un(UnaryOp::Cos, x)?;
                Some(b.mul(g, c)?)
            }
            UnaryOp::Cos => {
                let s = b.un(UnaryOp::Sin, x)?;
                let gs = b.mul(g, s)?;
                Some(b.un(UnaryOp::Neg, gs)?)
            }
            UnaryOp::Sqrt => {
                let half = b.full_like(y, 0.5)?;
                let d = b.bin(BinaryOp::Div, half, y)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Rsqrt => {
                let c = b.full_like(y, -0.5)?;
                let q = b.bin(BinaryOp::Div, y, x)?;
                let d = b.mul(c, q)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Erf => {
                let c = b.full_like(x, std::f64::consts::FRAC_2_SQRT_PI)?;
                let x2 = b.mul(x, x)?;
                let nx2 = b.un(UnaryOp::Neg, x2)?;
                let e = b.un(UnaryOp::Exp, nx2)?;
                let d = b.mul(c, e)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::ErfInv => {
                let c = b.full_like(y, std::f64::consts::PI.sqrt() / 2.0)?;
                let y2 = b.mul(y, y)?;
                let e = b.un(UnaryOp::Exp, y2)?;
                let d = b.mul(c, e)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Not => None,
            UnaryOp::Tan => {
                let d = elem::tan(b, y)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Asin => {
                let d = elem::asin(b, x, false)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Acos => {
                let d = elem::asin(b, x, true)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Atan => {
                let d = elem::atan(b, x)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Sinh => {
                let d = elem::sinh_cosh(b, x, false)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Cosh => {
                let d = elem::sinh_cosh(b, x, true)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Asinh => {
                let d = elem::asinh_acosh(b, x, false)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Acosh => {
                let d = elem::asinh_acosh(b, x, true)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Atanh => {
                let d = elem::atanh(b, x)?;
                Some(b.mul(g, d)?)
            }
            UnaryOp::Exp2 => {
                let d = elem::exp2(b, y)?;
                Some(b.mul(g, d)?)
            }
        };
        Ok(vec![ct])
    }

    pub(super) fn binary(b: &mut Builder, op: BinaryOp, at: &At) -> Result<Vec<Option<NodeId>>> {
        let (x, z, y, g) = (at.xs[0], at.xs[1], at.y, at.g);
        Ok(match op {
            BinaryOp::Add => vec![Some(g), Some(g)],
            BinaryOp::Sub => vec![Some(g), at.want(b, 1, |b| b.un(UnaryOp::Neg, g))?],
            BinaryOp::Mul => vec![
                at.want(b, 0, |b| b.mul(g, z))?,
                at.want(b, 1, |b| b.mul(x, g))?,
            ],
            BinaryOp::Div => {
                let cx = at.want(b, 0, |b| b.bin(BinaryOp::Div, g, z))?;
                let cz = at.want(b, 1, |b| {
                    let ng = b.un(UnaryOp::Neg, g)?;
                    let n = b.mul(ng, x)?;
                    let zz = b.mul(z, z)?;
                    b.bin(BinaryOp::Div, n, zz)
                })?;
                vec![cx, cz]
            }
            // rem(x, z) = x - z * trunc(x / z).
            BinaryOp::Rem => {
                let cz = at.want(b, 1, |b| {
                    let q = b.bin(BinaryOp::Div, x, z)?;
                    let s = b.un(UnaryOp::Sign, q)?;
                    let a = b.un(UnaryOp::Abs, q)?;
                    let f = b.un(UnaryOp::Floor, a)?;
                    let t = b.mul(s, f)?;
                    let gt = b.mul(g, t)?;
                    b.un(UnaryOp::Neg, gt)
                })?;
                vec![Some(g), cz]
            }
            // JAX's balanced rule: the whole cotangent to the larger operand, half each at
            // a tie.
            BinaryOp::Max | BinaryOp::Min => {
                let half = b.full_like(y, 0.5)?;
                let one = b.full_like(y, 1.0)?;
                let zero = b.full_like(y, 0.0)?;
                let side = |b: &mut Builder, a: NodeId, other: NodeId| -> Result<NodeId> {
                    let a_is = b.cmp(CompareOp::Eq, a, y)?;
                    let o_is = b.cmp(CompareOp::Eq, other, y)?;
                    let w = b.select(o_is, half, one)?;
                    let w = b.select(a_is, w, zero)?;
                    b.mul(g, w)
                };
                vec![
                    at.want(b, 0, |b| side(b, x, z))?,
                    at.want(b, 1, |b| side(b, z, x))?,
                ]
            }
            BinaryOp::Pow => {
                let cx = at.want(b, 0, |b| {
                    let one = b.full_like(z, 1.0)?;
                    let zm1 = b.bin(BinaryOp::Sub, z, one)?;
                    let p = b.bin(BinaryOp::Pow, x, zm1)?;
                    let d = b.mul(z, p)?;
                    b.mul(g, d)
                })?;
                // log(x) * x^z, with x == 0 giving 0 rather than NaN, as JAX.
                let cz = at.want(b, 1, |b| {
                    let zero = b.full_like(x, 0.0)?;
                    let is0 = b.cmp(CompareOp::Eq, x, zero)?;
                    let one_x = b.full_like(x, 1.0)?;
                    let safe = b.select(is0, one_x, x)?;
                    let l = b.un(UnaryOp::Log, safe)?;
                    let gy = b.mul(g, y)?;
                    b.mul(gy, l)
                })?;
                vec![cx, cz]
            }
            BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRightLogical => vec![],
            BinaryOp::Atan2 => {
                let cx = at.want(b, 0, |b| {
                    let d = elem::atan2(b, x, z, true)?;
                    b.mul(g, d)
                })?;
                let cz = at.want(b, 1, |b| {
                    let d = elem::atan2(b, x, z, false)?;
                    b.mul(g, d)
                })?;
                vec![cx, cz]
            }
        })
    }

    pub(super) fn select(b: &mut Builder, at: &At) -> Result<Vec<Option<NodeId>>> {
        let (p, g) = (at.xs[0], at.g);
        let zero = b.full_like(g, 0.0)?;
        Ok(vec![
            None,
            at.want(b, 1, |b| b.select(p, g, zero))?,
            at.want(b, 2, |b| b.select(p, zero, g))?,
        ])
    }

    pub(super) fn convert(b: &mut Builder, at: &At) -> Result<Vec<Option<NodeId>>> {
        let from = b.ty(at.xs[0]).dtype;
        Ok(if from.is_float() {
            vec![Some(b.add(Op::Convert(from), &[at.g])?)]
        } else {
            vec![]
        })
    }

    /// Reinterpreting bits has no derivative, except the identity (a type to itself).
    pub(super) fn bitcast(b: &mut Builder, to: DType, at: &At) -> Result<Vec<Option<NodeId>>> {
        Ok(if b.ty(at.xs[0]).dtype == to {
            vec![Some(at.g)]
        } else {
            vec![]
        })
    }
}

/// VJPs of the ops that move elements: each moves the cotangent back.
mod movement {
    use super::{At, Builder, Result};
    use tessera_ir::{BinaryOp, NodeId, Op, Shape};

    pub(super) fn broadcast_in_dim(
        b: &mut Builder,
        shape: &Shape,
        dims: &[usize],
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let from = b.ty(at.xs[0]);
        let summed: Vec<usize> = (0..shape.rank())
            .filter(|d| match dims.iter().position(|x| x == d) {
                None => true,
                Some(i) => from.dims()[i] == 1 && shape.dims()[*d] != 1,
            })
            .collect();
        let s = b.reduce_sum(at.g, summed)?;
        Ok(vec![Some(b.reshape(s, &from.shape)?)])
    }

    pub(super) fn reshape(b: &mut Builder, at: &At) -> Result<Vec<Option<NodeId>>> {
        let from = b.ty(at.xs[0]);
        Ok(vec![Some(b.reshape(at.g, &from.shape)?)])
    }

    pub(super) fn transpose(
        b: &mut Builder,
        perm: &[usize],
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let mut inv = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok(vec![Some(b.transpose(at.g, inv)?)])
    }

    pub(super) fn slice(
        b: &mut Builder,
        start: &[usize],
        stride: &[usize],
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let from = b.ty(at.xs[0]);
        let out = b.ty(at.y);
        let zero = b.zero_scalar(from.dtype)?;
        let interior: Vec<usize> = stride.iter().map(|s| s - 1).collect();
        let low: Vec<i64> = start.iter().map(|&s| s as i64).collect();
        let high: Vec<i64> = (0..from.rank())
            .map(|d| {
                let n = out.dims()[d] as i64;
                from.dims()[d] as i64 - low[d] - (n + (n - 1).max(0) * interior[d] as i64)
            })
            .collect();
        Ok(vec![Some(b.add(
            Op::Pad {
                low,
                high,
                interior,
            },
            &[at.g, zero],
        )?)])
    }

    pub(super) fn concatenate(b: &mut Builder, dim: usize, at: &At) -> Result<Vec<Option<NodeId>>> {
        let gt = b.ty(at.g);
        let mut offset = 0;
        let mut cts = Vec::new();
        for (i, &x) in at.xs.iter().enumerate() {
            let t = b.ty(x);
            let mut start = vec![0; gt.rank()];
            let mut limit = gt.dims().to_vec();
            start[dim] = offset;
            limit[dim] = offset + t.dims()[dim];
            offset += t.dims()[dim];
            cts.push(at.want(b, i, |b| {
                b.add(
                    Op::Slice {
                        start,
                        limit,
                        stride: vec![1; gt.rank()],
                    },
                    &[at.g],
                )
            })?);
        }
        Ok(cts)
    }

    pub(super) fn pad(
        b: &mut Builder,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let g = at.g;
        let gt = b.ty(g);
        let zero = b.zero_scalar(gt.dtype)?;
        let unpadded = b.add(
            Op::Pad {
                low: low.iter().map(|l| -l).collect(),
                high: high.iter().map(|h| -h).collect(),
                interior: vec![0; gt.rank()],
            },
            &[g, zero],
        )?;
        let ut = b.ty(unpadded);
        let ct_x = b.add(
            Op::Slice {
                start: vec![0; gt.rank()],
                limit: ut.dims().to_vec(),
                stride: interior.iter().map(|i| i + 1).collect(),
            },
            &[unpadded],
        )?;
        let ct_v = at.want(b, 1, |b| {
            let all: Vec<usize> = (0..gt.rank()).collect();
            let total = b.reduce_sum(g, all.clone())?;
            let inner = b.reduce_sum(ct_x, all)?;
            b.bin(BinaryOp::Sub, total, inner)
        })?;
        Ok(vec![Some(ct_x), ct_v])
    }
}

/// VJPs of the reductions.
mod reduction {
    use super::{At, Builder, Result};
    use tessera_ir::{BinaryOp, CompareOp, NodeId, Op, ReduceKind};

    pub(super) fn reduce(
        b: &mut Builder,
        kind: ReduceKind,
        axes: &[usize],
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let (x, y, g) = (at.xs[0], at.y, at.g);
        let from = b.ty(x);
        let kept: Vec<usize> = (0..from.rank()).filter(|d| !axes.contains(d)).collect();
        Ok(match kind {
            ReduceKind::Sum => vec![Some(b.broadcast(g, &from.shape, kept)?)],
            // JAX's chooser rule: the cotangent is shared equally by every element that
            // attains the extremum.
            ReduceKind::Max | ReduceKind::Min => {
                let yb = b.broadcast(y, &from.shape, kept.clone())?;
                let eq = b.cmp(CompareOp::Eq, x, yb)?;
                let mask = b.add(Op::Convert(from.dtype), &[eq])?;
                let counts = b.reduce_sum(mask, axes.to_vec())?;
                let share = b.bin(BinaryOp::Div, g, counts)?;
                let sb = b.broadcast(share, &from.shape, kept)?;
                vec![Some(b.mul(sb, mask)?)]
            }
        })
    }
}

/// VJPs of the collectives: each is the transposed collective over the same axes.
mod collective {
    use super::{At, AutodiffError, Builder, Result};
    use tessera_ir::{CollectiveOp, NodeId, Op, ReduceKind};

    pub(super) fn collective(
        b: &mut Builder,
        op: &Op,
        c: &CollectiveOp,
        at: &At,
    ) -> Result<Vec<Option<NodeId>>> {
        let not_diff = |why: &str| AutodiffError::NotDifferentiable {
            op: op.name().into(),
            why: why.into(),
        };
        let transposed = match c {
            CollectiveOp::AxisIndex { .. } => return Ok(vec![]),
            CollectiveOp::AllReduce { kind, axes } => match kind {
                ReduceKind::Sum => CollectiveOp::AllReduce {
                    kind: ReduceKind::Sum,
                    axes: axes.clone(),
                },
                ReduceKind::Max | ReduceKind::Min => {
                    return Err(not_diff(
                        " (only the sum all_reduce has a gradient, as in JAX)",
                    ));
                }
            },
            CollectiveOp::AllGather { dim, axes } => CollectiveOp::ReduceScatter {
                kind: ReduceKind::Sum,
                dim: *dim,
                axes: axes.clone(),
            },
            CollectiveOp::ReduceScatter { kind, dim, axes } => match kind {
                ReduceKind::Sum => CollectiveOp::AllGather {
                    dim: *dim,
                    axes: axes.clone(),
                },
                ReduceKind::Max | ReduceKind::Min => {
                    return Err(not_diff(" (only the sum reduce_scatter has a gradient)"));
                }
            },
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
                axes,
            } => CollectiveOp::AllToAll {
                split_dim: *concat_dim,
                concat_dim: *split_dim,
                axes: axes.clone(),
            },
            CollectiveOp::CollectivePermute { axes, pairs } => CollectiveOp::CollectivePermute {
                axes: axes.clone(),
                pairs: pairs.iter().map(|&(s, d)| (d, s)).collect(),
            },
        };
        Ok(vec![Some(b.add(Op::Collective(transposed), &[at.g])?)])
    }
}

/// `out = dot_general(l, r)`: each operand's cotangent is a `dot_general` of the output
/// cotangent with the other operand over the other operand's free dims, then a transpose back
/// into the operand's dim order.
fn dot_general_vjp(
    b: &mut Builder,
    dd: &DotDims,
    l: NodeId,
    r: NodeId,
    needed: &[bool],
    g: NodeId,
) -> Result<Vec<Option<NodeId>>> {
    let (lt, rt) = (b.ty(l), b.ty(r));
    let nb = dd.lhs_batch.len();
    let lfree = dd.lhs_free(lt.rank());
    let rfree = dd.rhs_free(rt.rank());
    let batch: Vec<usize> = (0..nb).collect();

    // Cotangent of one operand (`mine`) from the other (`other`); see the doc above.
    let mut side = |mine: NodeId,
                    my_batch: &[usize],
                    my_free: &[usize],
                    my_contract: &[usize],
                    other: NodeId,
                    other_batch: &[usize],
                    other_free: &[usize],
                    other_contract: &[usize],
                    g_other_free: Vec<usize>|
     -> Result<NodeId> {
        let d = b.add(
            Op::DotGeneral(DotDims {
                lhs_batch: batch.clone(),
                rhs_batch: other_batch.to_vec(),
                lhs_contract: g_other_free,
                rhs_contract: other_free.to_vec(),
            }),
            &[g, other],
        )?;
        let mine_rank = b.ty(mine).rank();
        let mut sorted: Vec<usize> = other_contract.to_vec();
        sorted.sort_unstable();
        let mut perm = vec![0; mine_rank];
        for (i, &dim) in my_batch.iter().enumerate() {
            perm[dim] = i;
        }
        for (j, &dim) in my_free.iter().enumerate() {
            perm[dim] = nb + j;
        }
        for (k, &dim) in my_contract.iter().enumerate() {
            let rank = sorted
                .iter()
                .position(|&s| s == other_contract[k])
                .unwrap_or(0);
            perm[dim] = nb + my_free.len() + rank;
        }
        // On an Explicit mesh the product takes the primal operand's sharding, permuted (JAX's
        // transpose rule passes it as `out_sharding`): where its contraction is split, that
        // is what completes the partial sums.
        let d = match b.g.node(mine).sharding.clone() {
            Some(s) if b.g.mesh.as_ref().is_some_and(|m| m.is_explicit()) => {
                let mut dims = vec![tessera_ir::DimSharding::default(); mine_rank];
                for (q, &p) in perm.iter().enumerate() {
                    dims[p] = tessera_ir::DimSharding::closed(s.dims[q].axes.clone());
                }
                let c = tessera_ir::Sharding {
                    dims,
                    replicated: Vec::new(),
                    unreduced: Vec::new(),
                    ..s
                };
                b.add(Op::ShardingConstraint(c), &[d])?
            }
            _ => d,
        };
        // `transpose` reads result dim `dim` from operand dim `perm[dim]`.
        b.transpose(d, perm)
    };
    let g_rfree: Vec<usize> = (nb + lfree.len()..nb + lfree.len() + rfree.len()).collect();
    let g_lfree: Vec<usize> = (nb..nb + lfree.len()).collect();
    let ct_l = if !needed[0] {
        None
    } else {
        Some(side(
            l,
            &dd.lhs_batch,
            &lfree,
            &dd.lhs_contract,
            r,
            &dd.rhs_batch,
            &rfree,
            &dd.rhs_contract,
            g_rfree,
        )?)
    };
    let ct_r = if !needed[1] {
        None
    } else {
        Some(side(
            r,
            &dd.rhs_batch,
            &rfree,
            &dd.rhs_contract,
            l,
            &dd.lhs_batch,
            &lfree,
            &dd.lhs_contract,
            g_lfree,
        )?)
    };
    Ok(vec![ct_l, ct_r])
}
