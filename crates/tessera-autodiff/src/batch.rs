//! Batching (`vmap`) as a graph-to-graph pass.
//!
//! Consumes the graph of a per-example function, for each parameter the dim of the batched
//! argument that is mapped (`None`: the argument is the same for every example), the batch
//! size, the name of the mapped axis (so that collectives over it can be rewritten), and for
//! each output the dim where its batch dim goes (`None`: the output must not depend on the
//! batch). Produces a new graph over the batched parameters whose outputs are the batched
//! outputs. The input graph is untouched.
//!
//! Every value carries its batch dim (`Option<usize>`, JAX's `bdim`): `None` for a value that
//! depends on no batched input (JAX's `not_mapped`), which stays unbatched; ops whose operands
//! are all unbatched are copied as they are. One rule per op in [`rule`], a `match` with no
//! wildcard arm; each keeps the batch dim where it is when it can (elementwise ops whose batched
//! operands agree, slices, reductions, broadcasts) and moves it to the front otherwise.
//!
//! A collective over the mapped axis (`psum(x, "batch")` inside `vmap(.., axis_name="batch")`)
//! becomes the op over the batch dim, as in JAX: `all_reduce` a reduction over it (of an
//! unbatched value: `x * size` for a sum, `x` for max and min), `all_gather` a reshape of the
//! batch dim into the gathered dim, `reduce_scatter` a reduction then a split, `all_to_all` a
//! transpose, `collective_permute` a permutation of the lanes, `axis_index` an `iota`. A
//! collective over other mesh axes stays one, its dims shifted.

use std::collections::HashMap;

use tessera_ir::{
    DimSharding, DotDims, Graph, Literal, Mesh, NodeId, Op, Shape, TensorType, TypeError,
};

/// Why a graph could not be batched.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// The graph breaks an IR invariant, or the axes do not match its parameters or outputs.
    #[error("the graph to batch is malformed: {0}")]
    Malformed(String),
    /// An in_axes entry names a dim the batched argument cannot have.
    #[error("in_axes[{index}] = {axis} is out of range for an argument of type {ty} (per example), which batched has rank {}", .ty.rank() + 1)]
    InAxis {
        index: usize,
        axis: usize,
        ty: TensorType,
    },
    /// An out_axes entry names a dim the batched output cannot have, or is `None` for an
    /// output that depends on the batch.
    #[error("output {index} ({ty} per example): {reason}")]
    OutAxis {
        index: usize,
        ty: TensorType,
        reason: String,
    },
    /// An op this pass has no rule for in this form.
    #[error("vmap of {op}: {why}")]
    Unsupported { op: String, why: String },
    /// A rule built an ill-typed node: a bug in the rule, reported instead of a panic.
    #[error("internal error in the batching rule of {op}: {error}")]
    Rule { op: String, error: TypeError },
}

type Result<T> = std::result::Result<T, BatchError>;

/// A value of the batched graph and where its batch dim is (`None`: not batched).
type Val = (NodeId, Option<usize>);

/// Batches `g`; see the module doc. `in_axes` has one entry per parameter of `g`, `out_axes`
/// one per output. The result's mesh is `g`'s without the axis `axis_name`.
pub fn batch(
    g: &Graph,
    in_axes: &[Option<usize>],
    size: usize,
    axis_name: Option<&str>,
    out_axes: &[Option<usize>],
) -> Result<Graph> {
    tessera_ir::verify(g).map_err(|e| BatchError::Malformed(e.to_string()))?;
    if in_axes.len() != g.params().len() || out_axes.len() != g.outputs().len() {
        return Err(BatchError::Malformed(format!(
            "{} in_axes for {} parameters, {} out_axes for {} outputs",
            in_axes.len(),
            g.params().len(),
            out_axes.len(),
            g.outputs().len()
        )));
    }
    let mut out = Graph::new(g.name.clone());
    out.mesh = match (&g.mesh, axis_name) {
        (Some(m), Some(name)) => {
            if let Some(n) = m.axis_size(name)
                && n != size
            {
                return Err(BatchError::Malformed(format!(
                    "the mesh gives axis \"{name}\" size {n}, the batch has size {size}"
                )));
            }
            let axes: Vec<(String, usize)> =
                m.axes.iter().filter(|(a, _)| a != name).cloned().collect();
            (!axes.is_empty()).then(|| Mesh::new(m.name.clone(), axes))
        }
        (m, _) => m.clone(),
    };
    let mut b = Builder {
        g: out,
        loc: None,
        op: String::new(),
        size,
        axis: axis_name.map(str::to_string),
    };
    let mut env: HashMap<NodeId, Val> = HashMap::new();
    for (i, (&p, &axis)) in g.params().iter().zip(in_axes).enumerate() {
        let ty = g.ty(p).clone();
        let bty = match axis {
            None => ty,
            Some(a) if a <= ty.rank() => b.batched_type(&ty, a),
            Some(a) => {
                return Err(BatchError::InAxis {
                    index: i,
                    axis: a,
                    ty,
                });
            }
        };
        let id = b.g.add_param(bty);
        b.g.node_mut(id).loc = g.node(p).loc.clone();
        env.insert(p, (id, axis));
    }
    for id in g.topo_order() {
        if env.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        let vals: Vec<Val> = g.operands(id).iter().map(|o| env[o]).collect();
        b.op = node.op.name().to_string();
        b.loc = node.loc.clone();
        let v = if vals.iter().all(|v| v.1.is_none()) && !b.is_mapped_collective(&node.op) {
            let ops: Vec<NodeId> = vals.iter().map(|v| v.0).collect();
            (b.add(node.op.clone(), &ops)?, None)
        } else {
            rule(&mut b, &node.op, &node.ty, &vals)?
        };
        if let Some(s) = &node.sharding
            && v.1.is_none()
        {
            b.g.node_mut(v.0).sharding = Some(s.clone());
        }
        env.insert(id, v);
    }
    let mut outputs = Vec::with_capacity(g.outputs().len());
    for (i, (&o, &axis)) in g.outputs().iter().zip(out_axes).enumerate() {
        let v = env[&o];
        let ty = g.ty(o).clone();
        b.op = "vmap".into();
        b.loc = g.node(o).loc.clone();
        outputs.push(match axis {
            None if v.1.is_some() => {
                return Err(BatchError::OutAxis {
                    index: i,
                    ty,
                    reason: "out_axes is None, but the output depends on the mapped inputs".into(),
                });
            }
            None => v.0,
            Some(a) if a > ty.rank() => {
                return Err(BatchError::OutAxis {
                    index: i,
                    ty: ty.clone(),
                    reason: format!(
                        "out_axes {a} is out of range for rank {} batched",
                        ty.rank() + 1
                    ),
                });
            }
            Some(a) => b.materialize(v, a)?,
        });
    }
    b.g.set_outputs(outputs);
    tessera_ir::verify(&b.g).map_err(|e| BatchError::Rule {
        op: "vmap".into(),
        error: TypeError {
            op: "vmap".into(),
            operands: vec![],
            reason: format!("the batched graph is malformed: {e}"),
        },
    })?;
    Ok(b.g)
}

/// Where per-example dim `d` is in a value whose batch dim is at `bd`.
fn shift(d: usize, bd: usize) -> usize {
    if d < bd { d } else { d + 1 }
}

/// Emits the batched graph's nodes, tagging each with the per-example node's location.
struct Builder {
    g: Graph,
    loc: Option<String>,
    op: String,
    size: usize,
    axis: Option<String>,
}

impl Builder {
    fn add(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        let id = self.g.add(op, operands).map_err(|error| BatchError::Rule {
            op: self.op.clone(),
            error,
        })?;
        self.g.node_mut(id).loc = self.loc.clone();
        Ok(id)
    }

    fn ty(&self, id: NodeId) -> TensorType {
        self.g.ty(id).clone()
    }

    /// `ty` with a batch dim of the batch size inserted at `at`.
    fn batched_type(&self, ty: &TensorType, at: usize) -> TensorType {
        let mut dims = ty.dims().to_vec();
        dims.insert(at, self.size);
        TensorType::new(ty.dtype, dims)
    }

    /// Whether `op` is a collective over the mapped axis (which has a rule even on unbatched
    /// operands: `psum` of an unbatched value is `x * size`, `axis_index` has no operand).
    fn is_mapped_collective(&self, op: &Op) -> bool {
        self.axis
            .as_ref()
            .is_some_and(|a| op.mesh_axes().iter().any(|m| m == a))
    }

    /// The value with its batch dim at `to`: moved there by a transpose, or, for an unbatched
    /// value, broadcast along a new dim there.
    fn materialize(&mut self, v: Val, to: usize) -> Result<NodeId> {
        let (x, bd) = v;
        let ty = self.ty(x);
        match bd {
            None => {
                let bty = self.batched_type(&ty, to);
                let dims: Vec<usize> = (0..ty.rank()).map(|d| shift(d, to)).collect();
                self.add(
                    Op::BroadcastInDim {
                        shape: bty.shape,
                        dims,
                    },
                    &[x],
                )
            }
            Some(from) if from == to => Ok(x),
            Some(from) => {
                let mut perm: Vec<usize> = (0..ty.rank()).filter(|&d| d != from).collect();
                perm.insert(to, from);
                self.add(Op::Transpose(perm), &[x])
            }
        }
    }

    /// The per-example dims of a batched value (its dims without the batch dim).
    fn example_dims(&self, v: Val) -> Vec<usize> {
        let mut dims = self.ty(v.0).dims().to_vec();
        if let Some(bd) = v.1 {
            dims.remove(bd);
        }
        dims
    }

    /// A tensor of `ty` filled with `x`.
    fn full(&mut self, ty: &TensorType, x: f64) -> Result<NodeId> {
        let c = self.add(
            Op::Constant(Literal::splat(&TensorType::scalar(ty.dtype), x)),
            &[],
        )?;
        if ty.rank() == 0 {
            return Ok(c);
        }
        self.add(
            Op::BroadcastInDim {
                shape: ty.shape.clone(),
                dims: vec![],
            },
            &[c],
        )
    }

    fn unsupported(&self, why: String) -> BatchError {
        BatchError::Unsupported {
            op: self.op.clone(),
            why,
        }
    }
}

/// The batched value of `op` applied to `vals` (at least one batched, or `op` a collective over
/// the mapped axis); `ty` is the per-example result type. Dispatches to one helper per family.
fn rule(b: &mut Builder, op: &Op, ty: &TensorType, vals: &[Val]) -> Result<Val> {
    match op {
        // No operands: never batched (parameters are placed by `batch` itself).
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => {
            let ops: Vec<NodeId> = vals.iter().map(|v| v.0).collect();
            Ok((b.add(op.clone(), &ops)?, None))
        }
        Op::Unary(_) | Op::Convert(_) | Op::Bitcast(_) => {
            Ok((b.add(op.clone(), &[vals[0].0])?, vals[0].1))
        }
        Op::Binary(_) | Op::Compare(_) | Op::Select => elementwise(b, op, vals),
        Op::BroadcastInDim { shape, dims } => movement::broadcast_in_dim(b, shape, dims, vals[0]),
        Op::Reshape(shape) => {
            let x = b.materialize(vals[0], 0)?;
            let mut dims = vec![b.size];
            dims.extend_from_slice(shape.dims());
            Ok((b.add(Op::Reshape(Shape::from(dims)), &[x])?, Some(0)))
        }
        Op::Transpose(perm) => movement::transpose(b, perm, vals[0]),
        Op::Slice {
            start,
            limit,
            stride,
        } => movement::slice(b, start, limit, stride, vals[0]),
        Op::Concatenate { dim } => movement::concatenate(b, *dim, vals),
        Op::Pad {
            low,
            high,
            interior,
        } => movement::pad(b, low, high, interior, ty, vals),
        Op::Reduce { kind, axes } => {
            let (x, bd) = (vals[0].0, vals[0].1.expect("a batched operand"));
            let shifted: Vec<usize> = axes.iter().map(|&a| shift(a, bd)).collect();
            let nd = bd - axes.iter().filter(|&&a| a < bd).count();
            let r = b.add(
                Op::Reduce {
                    kind: *kind,
                    axes: shifted,
                },
                &[x],
            )?;
            Ok((r, Some(nd)))
        }
        Op::ArgMax { axis } => {
            let (x, bd) = (vals[0].0, vals[0].1.expect("a batched operand"));
            let r = b.add(
                Op::ArgMax {
                    axis: shift(*axis, bd),
                },
                &[x],
            )?;
            Ok((r, Some(bd - usize::from(*axis < bd))))
        }
        Op::DotGeneral(dd) => dot_general(b, dd, vals[0], vals[1]),
        Op::Collective(c) => collective::collective(b, c, ty, vals),
        Op::ShardingConstraint(s) => {
            let (x, bd) = (vals[0].0, vals[0].1.expect("a batched operand"));
            let mut s = s.clone();
            // The batch dim is left to propagation (open), as JAX leaves it unconstrained.
            s.dims.insert(
                bd,
                DimSharding {
                    axes: vec![],
                    open: true,
                },
            );
            Ok((b.add(Op::ShardingConstraint(s), &[x])?, Some(bd)))
        }
    }
}

/// Binary ops, comparisons and `select`: the batched operands' common batch dim if they agree,
/// else the front; unbatched operands are broadcast along it.
fn elementwise(b: &mut Builder, op: &Op, vals: &[Val]) -> Result<Val> {
    let mut bds = vals.iter().filter_map(|v| v.1);
    let first = bds.next().expect("a batched operand");
    let at = if bds.all(|d| d == first) { first } else { 0 };
    let ops: Vec<NodeId> = vals
        .iter()
        .map(|&v| b.materialize(v, at))
        .collect::<Result<_>>()?;
    Ok((b.add(op.clone(), &ops)?, Some(at)))
}

/// Rules of the ops that move elements.
mod movement {
    use super::{Builder, Result, Val, shift};
    use tessera_ir::{Literal, NodeId, Op, Shape, TensorType};

    /// The batch dim goes right after the result dim of the operand dim before it, so no
    /// transpose is needed.
    pub(super) fn broadcast_in_dim(
        b: &mut Builder,
        shape: &Shape,
        dims: &[usize],
        v: Val,
    ) -> Result<Val> {
        let (x, bd) = (v.0, v.1.expect("a batched operand"));
        let at = if bd == 0 { 0 } else { dims[bd - 1] + 1 };
        let mut rdims = shape.dims().to_vec();
        rdims.insert(at, b.size);
        let mut ndims: Vec<usize> = dims.iter().map(|&d| shift(d, at)).collect();
        ndims.insert(bd, at);
        let r = b.add(
            Op::BroadcastInDim {
                shape: Shape::from(rdims),
                dims: ndims,
            },
            &[x],
        )?;
        Ok((r, Some(at)))
    }

    /// The batch dim becomes the result's first dim, within the same transpose.
    pub(super) fn transpose(b: &mut Builder, perm: &[usize], v: Val) -> Result<Val> {
        let (x, bd) = (v.0, v.1.expect("a batched operand"));
        let mut p = vec![bd];
        p.extend(perm.iter().map(|&d| shift(d, bd)));
        Ok((b.add(Op::Transpose(p), &[x])?, Some(0)))
    }

    pub(super) fn slice(
        b: &mut Builder,
        start: &[usize],
        limit: &[usize],
        stride: &[usize],
        v: Val,
    ) -> Result<Val> {
        let (x, bd) = (v.0, v.1.expect("a batched operand"));
        let (mut s, mut l, mut t) = (start.to_vec(), limit.to_vec(), stride.to_vec());
        s.insert(bd, 0);
        l.insert(bd, b.size);
        t.insert(bd, 1);
        let r = b.add(
            Op::Slice {
                start: s,
                limit: l,
                stride: t,
            },
            &[x],
        )?;
        Ok((r, Some(bd)))
    }

    pub(super) fn concatenate(b: &mut Builder, dim: usize, vals: &[Val]) -> Result<Val> {
        let mut bds = vals.iter().filter_map(|v| v.1);
        let first = bds.next().expect("a batched operand");
        let at = if bds.all(|d| d == first) { first } else { 0 };
        let ops: Vec<NodeId> = vals
            .iter()
            .map(|&v| b.materialize(v, at))
            .collect::<Result<_>>()?;
        let r = b.add(
            Op::Concatenate {
                dim: shift(dim, at),
            },
            &ops,
        )?;
        Ok((r, Some(at)))
    }

    /// With an unbatched padding value, a pad that leaves the batch dim alone. With a batched
    /// one (one value per example), JAX's rule: pad with zero, then select each example's value
    /// where a pad of `true` with `false` says the element is padding.
    pub(super) fn pad(
        b: &mut Builder,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
        ty: &TensorType,
        vals: &[Val],
    ) -> Result<Val> {
        let (x, value) = (vals[0], vals[1]);
        let at = x.1.unwrap_or(0);
        let (mut l, mut h, mut i) = (low.to_vec(), high.to_vec(), interior.to_vec());
        l.insert(at, 0);
        h.insert(at, 0);
        i.insert(at, 0);
        let batched_pad = Op::Pad {
            low: l,
            high: h,
            interior: i,
        };
        let Some(_) = value.1 else {
            let r = b.add(batched_pad, &[x.0, value.0])?;
            return Ok((r, Some(at)));
        };
        let xb = b.materialize(x, at)?;
        let zero = b.add(
            Op::Constant(Literal::splat(&TensorType::scalar(ty.dtype), 0.0)),
            &[],
        )?;
        let padded = b.add(batched_pad, &[xb, zero])?;
        let inside_ty = TensorType::new(tessera_ir::DType::Bool, b.example_dims(x));
        let inside = b.full(&inside_ty, 1.0)?;
        let no = b.add(
            Op::Constant(Literal::splat(
                &TensorType::scalar(tessera_ir::DType::Bool),
                0.0,
            )),
            &[],
        )?;
        let mask = b.add(
            Op::Pad {
                low: low.to_vec(),
                high: high.to_vec(),
                interior: interior.to_vec(),
            },
            &[inside, no],
        )?;
        let mask = b.materialize((mask, None), at)?;
        let rdims = b.ty(padded).dims().to_vec();
        let fill = b.add(
            Op::BroadcastInDim {
                shape: Shape::from(rdims),
                dims: vec![at],
            },
            &[value.0],
        )?;
        Ok((b.add(Op::Select, &[mask, padded, fill])?, Some(at)))
    }
}

/// Batched operands of a dot become dot batch dims when both are batched (the result's first
/// dim); one batched operand's batch dim is a free dim of that operand.
fn dot_general(b: &mut Builder, dd: &DotDims, l: Val, r: Val) -> Result<Val> {
    let sh = |dims: &[usize], bd: Option<usize>| -> Vec<usize> {
        match bd {
            Some(bd) => dims.iter().map(|&d| shift(d, bd)).collect(),
            None => dims.to_vec(),
        }
    };
    let mut nd = DotDims {
        lhs_batch: sh(&dd.lhs_batch, l.1),
        rhs_batch: sh(&dd.rhs_batch, r.1),
        lhs_contract: sh(&dd.lhs_contract, l.1),
        rhs_contract: sh(&dd.rhs_contract, r.1),
    };
    let nb = dd.lhs_batch.len();
    let (lrank, rrank) = (b.ty(l.0).rank(), b.ty(r.0).rank());
    let at = match (l.1, r.1) {
        (Some(bl), Some(br)) => {
            nd.lhs_batch.insert(0, bl);
            nd.rhs_batch.insert(0, br);
            0
        }
        (Some(bl), None) => {
            let free = nd.lhs_free(lrank);
            nb + free.iter().position(|&d| d == bl).expect("a free dim")
        }
        (None, Some(br)) => {
            let free = nd.rhs_free(rrank);
            nb + nd.lhs_free(lrank).len() + free.iter().position(|&d| d == br).expect("free")
        }
        (None, None) => unreachable!("a dot with no batched operand is copied"),
    };
    Ok((b.add(Op::DotGeneral(nd), &[l.0, r.0])?, Some(at)))
}

/// Rules of the collectives: over the mapped axis, the op over the batch dim; over mesh axes,
/// the same collective with its dims shifted past the batch dim.
mod collective {
    use super::{Builder, Result, Val, shift};
    use tessera_ir::{BinaryOp, CollectiveOp, DType, NodeId, Op, ReduceKind, Shape, TensorType};

    pub(super) fn collective(
        b: &mut Builder,
        c: &CollectiveOp,
        ty: &TensorType,
        vals: &[Val],
    ) -> Result<Val> {
        let axis = b.axis.clone();
        let mapped = axis
            .as_ref()
            .is_some_and(|a| c.axes().iter().any(|m| m == a));
        if !mapped {
            return over_mesh(b, c, vals[0]);
        }
        let name = axis.expect("mapped implies a name");
        let rest: Vec<String> = c.axes().iter().filter(|a| **a != name).cloned().collect();
        match c {
            CollectiveOp::AllReduce { kind, .. } => {
                let r = all_reduce(b, *kind, vals[0])?;
                if rest.is_empty() {
                    return Ok((r, None));
                }
                let op = Op::Collective(CollectiveOp::AllReduce {
                    kind: *kind,
                    axes: rest,
                });
                Ok((b.add(op, &[r])?, None))
            }
            CollectiveOp::AxisIndex { axes } => {
                let pos = axes.iter().position(|a| *a == name).expect("mapped");
                axis_index(b, &axes[..pos], &axes[pos + 1..])
            }
            CollectiveOp::AllGather { dim, .. } if rest.is_empty() => {
                let x = b.materialize(vals[0], *dim)?;
                Ok((b.add(Op::Reshape(ty.shape.clone()), &[x])?, None))
            }
            CollectiveOp::ReduceScatter { kind, dim, .. } if rest.is_empty() => {
                let r = all_reduce(b, *kind, vals[0])?;
                let mut dims = b.ty(r).dims().to_vec();
                let chunk = dims[*dim] / b.size;
                dims.splice(*dim..=*dim, [b.size, chunk]);
                Ok((b.add(Op::Reshape(Shape::from(dims)), &[r])?, Some(*dim)))
            }
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
                ..
            } if rest.is_empty() => all_to_all(b, *split_dim, *concat_dim, vals[0]),
            CollectiveOp::CollectivePermute { pairs, .. } if rest.is_empty() => {
                permute(b, pairs, vals[0])
            }
            CollectiveOp::AllGather { .. }
            | CollectiveOp::ReduceScatter { .. }
            | CollectiveOp::AllToAll { .. }
            | CollectiveOp::CollectivePermute { .. } => Err(b.unsupported(format!(
                "over the mapped axis \"{name}\" together with mesh axes {rest:?}: write one \
                 collective per axis"
            ))),
        }
    }

    /// A collective over mesh axes only: the batch dim rides along.
    fn over_mesh(b: &mut Builder, c: &CollectiveOp, v: Val) -> Result<Val> {
        let (x, bd) = (v.0, v.1.expect("a batched operand"));
        let shifted = match c {
            CollectiveOp::AllReduce { .. }
            | CollectiveOp::CollectivePermute { .. }
            | CollectiveOp::AxisIndex { .. } => c.clone(),
            CollectiveOp::AllGather { dim, axes } => CollectiveOp::AllGather {
                dim: shift(*dim, bd),
                axes: axes.clone(),
            },
            CollectiveOp::ReduceScatter { kind, dim, axes } => CollectiveOp::ReduceScatter {
                kind: *kind,
                dim: shift(*dim, bd),
                axes: axes.clone(),
            },
            CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
                axes,
            } => CollectiveOp::AllToAll {
                split_dim: shift(*split_dim, bd),
                concat_dim: shift(*concat_dim, bd),
                axes: axes.clone(),
            },
        };
        Ok((b.add(Op::Collective(shifted), &[x])?, Some(bd)))
    }

    /// The reduction over the lanes: over the batch dim, or of a value every lane shares.
    fn all_reduce(b: &mut Builder, kind: ReduceKind, v: Val) -> Result<NodeId> {
        match (v.1, kind) {
            (Some(bd), _) => b.add(
                Op::Reduce {
                    kind,
                    axes: vec![bd],
                },
                &[v.0],
            ),
            (None, ReduceKind::Sum) => {
                let ty = b.ty(v.0);
                let n = b.full(&ty, b.size as f64)?;
                b.add(Op::Binary(BinaryOp::Mul), &[v.0, n])
            }
            (None, ReduceKind::Max | ReduceKind::Min) => Ok(v.0),
        }
    }

    /// The index within the group of `before ++ [mapped] ++ after` (major first): the lane's
    /// index times the size of `after`, plus the indices over the mesh axes.
    fn axis_index(b: &mut Builder, before: &[String], after: &[String]) -> Result<Val> {
        let n = b.size;
        let lane_ty = TensorType::new(DType::I32, vec![n]);
        let mut idx = b.add(
            Op::Iota {
                dim: 0,
                ty: lane_ty,
            },
            &[],
        )?;
        let mesh = b.g.mesh.clone();
        let group = |axes: &[String]| mesh.as_ref().map_or(1, |m| m.group_size(axes));
        let splat = |b: &mut Builder, x: NodeId| -> Result<NodeId> {
            b.add(
                Op::BroadcastInDim {
                    shape: Shape::from(vec![n]),
                    dims: vec![],
                },
                &[x],
            )
        };
        if !after.is_empty() {
            let k = b.full(&TensorType::new(DType::I32, vec![n]), group(after) as f64)?;
            idx = b.add(Op::Binary(BinaryOp::Mul), &[idx, k])?;
            let lo = b.add(
                Op::Collective(CollectiveOp::AxisIndex {
                    axes: after.to_vec(),
                }),
                &[],
            )?;
            let lo = splat(b, lo)?;
            idx = b.add(Op::Binary(BinaryOp::Add), &[idx, lo])?;
        }
        if !before.is_empty() {
            let hi = b.add(
                Op::Collective(CollectiveOp::AxisIndex {
                    axes: before.to_vec(),
                }),
                &[],
            )?;
            let hi = splat(b, hi)?;
            let k = b.full(
                &TensorType::new(DType::I32, vec![n]),
                (n * group(after)) as f64,
            )?;
            let hi = b.add(Op::Binary(BinaryOp::Mul), &[hi, k])?;
            idx = b.add(Op::Binary(BinaryOp::Add), &[idx, hi])?;
        }
        Ok((idx, Some(0)))
    }

    /// Lane `i` cuts `split` into `n` chunks and sends chunk `j` to lane `j`, which concatenates
    /// what it receives along `concat`: split the dim, swap the two lane axes, merge.
    fn all_to_all(b: &mut Builder, split: usize, concat: usize, v: Val) -> Result<Val> {
        let n = b.size;
        let x = b.materialize(v, 0)?;
        let dims = b.ty(x).dims().to_vec();
        let e: Vec<usize> = dims[1..].to_vec();
        // Axes after the reshape: 0 = the sending lane I, then the per-example dims with
        // `split` replaced by (J, chunk).
        let mut rdims = vec![n];
        for (k, &d) in e.iter().enumerate() {
            if k == split {
                rdims.extend([n, d / n]);
            } else {
                rdims.push(d);
            }
        }
        let r = b.add(Op::Reshape(Shape::from(rdims)), &[x])?;
        // Where per-example dim k (its chunk, for `split`) is after the reshape.
        let pos = |k: usize| 1 + k + usize::from(k >= split);
        let mut perm = vec![1 + split];
        let mut out = vec![n];
        for (k, &d) in e.iter().enumerate() {
            let dk = if k == split { d / n } else { d };
            if k == concat {
                perm.push(0);
                out.push(n * dk);
            } else {
                out.push(dk);
            }
            perm.push(pos(k));
        }
        let t = b.add(Op::Transpose(perm), &[r])?;
        Ok((b.add(Op::Reshape(Shape::from(out)), &[t])?, Some(0)))
    }

    /// Lane `dst` gets lane `src`'s value for each pair, zeros where no pair sends to it.
    fn permute(b: &mut Builder, pairs: &[(usize, usize)], v: Val) -> Result<Val> {
        let x = b.materialize(v, 0)?;
        let ty = b.ty(x);
        let mut one = ty.dims().to_vec();
        one[0] = 1;
        let one_ty = TensorType::new(ty.dtype, one.clone());
        let mut parts = Vec::with_capacity(b.size);
        for dst in 0..b.size {
            parts.push(match pairs.iter().find(|p| p.1 == dst) {
                Some(&(src, _)) => {
                    let mut start = vec![0; one.len()];
                    let mut limit = ty.dims().to_vec();
                    start[0] = src;
                    limit[0] = src + 1;
                    b.add(
                        Op::Slice {
                            start,
                            limit,
                            stride: vec![1; one.len()],
                        },
                        &[x],
                    )?
                }
                None => b.full(&one_ty, 0.0)?,
            });
        }
        if parts.is_empty() {
            return Ok((x, Some(0)));
        }
        Ok((b.add(Op::Concatenate { dim: 0 }, &parts)?, Some(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::DType;

    #[test]
    fn shift_skips_the_batch_dim() {
        assert_eq!((0..3).map(|d| shift(d, 1)).collect::<Vec<_>>(), [0, 2, 3]);
    }

    #[test]
    fn an_in_axis_beyond_the_batched_rank_is_an_error() {
        let mut g = Graph::new("f");
        let p = g.add_param(TensorType::new(DType::F32, vec![3]));
        g.set_outputs(vec![p]);
        let e = batch(&g, &[Some(2)], 4, None, &[Some(0)]).unwrap_err();
        assert!(e.to_string().contains("in_axes[0] = 2"), "{e}");
    }
}
