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
    for (i, (&p, &axis)) in g.params().iter().zip(in_axes).enumerate() {
        let ty = g.ty(p);
        if let Some(a) = axis
            && a > ty.rank()
        {
            return Err(BatchError::InAxis {
                index: i,
                axis: a,
                ty: ty.clone(),
            });
        }
    }
    let (mut b, outs) = run(g, in_axes, size, axis_name)?;
    let mut outputs = Vec::with_capacity(g.outputs().len());
    for (i, ((&o, &axis), &v)) in g.outputs().iter().zip(out_axes).zip(&outs).enumerate() {
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

/// The mesh of the batched graph: `mesh` without the mapped axis.
fn batched_mesh(mesh: Option<&Mesh>, axis: Option<&str>, size: usize) -> Result<Option<Mesh>> {
    Ok(match (mesh, axis) {
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
        (m, _) => m.cloned(),
    })
}

/// Batches the nodes of `g` (a function or a region's body) into a new graph whose parameters
/// are `g`'s batched by `in_axes`; returns its builder (outputs not yet set) and the batched
/// value of each output of `g`.
fn run(
    g: &Graph,
    in_axes: &[Option<usize>],
    size: usize,
    axis_name: Option<&str>,
) -> Result<(Builder, Vec<Val>)> {
    let mut out = Graph::new(g.name.clone());
    out.mesh = batched_mesh(g.mesh.as_ref(), axis_name, size)?;
    let mut b = Builder {
        g: out,
        loc: None,
        op: String::new(),
        size,
        axis: axis_name.map(str::to_string),
        results: HashMap::new(),
    };
    let mut env: HashMap<NodeId, Val> = HashMap::new();
    for (&p, &axis) in g.params().iter().zip(in_axes) {
        let ty = g.ty(p).clone();
        let bty = match axis {
            None => ty,
            Some(a) => b.batched_type(&ty, a),
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
        let srcs = g.operands(id);
        let vals: Vec<Val> = srcs.iter().map(|o| env[o]).collect();
        b.op = node.op.name().to_string();
        b.loc = node.loc.clone();
        let v = if vals.iter().all(|v| v.1.is_none()) && !b.needs_rule(&node.op) {
            let ops: Vec<NodeId> = vals.iter().map(|v| v.0).collect();
            (b.add(node.op.clone(), &ops)?, None)
        } else {
            rule(&mut b, id, &node.op, &node.ty, &srcs, &vals)?
        };
        if let Some(s) = &node.sharding
            && v.1.is_none()
        {
            b.g.node_mut(v.0).sharding = Some(s.clone());
        }
        env.insert(id, v);
    }
    let outs = g.outputs().iter().map(|o| env[o]).collect();
    Ok((b, outs))
}

mod conv;

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
    /// The batched results of each region node of the source graph (read by `get_result`).
    results: HashMap<NodeId, Vec<Val>>,
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

    /// Whether `op` needs its rule even on unbatched operands: a collective over the mapped
    /// axis (`psum` of an unbatched value is `x * size`, `axis_index` has no operand), and the
    /// region ops (their bodies may hold such collectives, and declare the batched graph's
    /// mesh) with their `get_result`s.
    fn needs_rule(&self, op: &Op) -> bool {
        matches!(op, Op::Region(_) | Op::GetResult { .. })
            || self
                .axis
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

    /// A placeholder value for a region that has neither results nor operands.
    fn token(&mut self) -> Result<NodeId> {
        self.add(
            Op::Constant(Literal::splat(
                &TensorType::scalar(tessera_ir::DType::F32),
                0.0,
            )),
            &[],
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
fn rule(
    b: &mut Builder,
    id: NodeId,
    op: &Op,
    ty: &TensorType,
    srcs: &[NodeId],
    vals: &[Val],
) -> Result<Val> {
    match op {
        // No operands: never batched (parameters are placed by `batch` itself).
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => {
            let ops: Vec<NodeId> = vals.iter().map(|v| v.0).collect();
            Ok((b.add(op.clone(), &ops)?, None))
        }
        Op::Unary(_) | Op::Convert(_) | Op::Bitcast(_) | Op::StopGradient => {
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
        Op::Region(r) => {
            let results = region::region(b, r, vals)?;
            // The region node's own value is a token nothing reads but `get_result`.
            let token = results
                .first()
                .map_or(vals.first().map_or(b.token()?, |v| v.0), |v| v.0);
            b.results.insert(id, results);
            Ok((token, None))
        }
        Op::GetResult { index, .. } => b
            .results
            .get(&srcs[0])
            .and_then(|r| r.get(*index))
            .copied()
            .ok_or_else(|| b.unsupported(format!("result {index} of a region it did not batch"))),
        Op::Conv(cd) => conv::conv(b, cd, vals[0], vals[1], ty),
        Op::ReduceWindow { kind, win } => conv::reduce_window(b, *kind, win, vals[0]),
        Op::Gather(d) => {
            let ops: Vec<NodeId> = vals
                .iter()
                .map(|&v| b.materialize(v, 0))
                .collect::<Result<_>>()?;
            if b.size == 0 {
                // No example: the empty result (a batching dim of size 0 cannot be sliced).
                let mut dims = vec![0];
                dims.extend_from_slice(ty.dims());
                return Ok((b.full(&TensorType::new(ty.dtype, dims), 0.0)?, Some(0)));
            }
            let dd = crate::gather::batch_gather(d);
            Ok((b.add(Op::Gather(Box::new(dd)), &ops)?, Some(0)))
        }
        Op::Scatter(d) => {
            let ops: Vec<NodeId> = vals
                .iter()
                .map(|&v| b.materialize(v, 0))
                .collect::<Result<_>>()?;
            if b.size == 0 {
                // No example: the (empty) operand is the result.
                return Ok((ops[0], Some(0)));
            }
            let dd = crate::gather::batch_scatter(d);
            Ok((b.add(Op::Scatter(Box::new(dd)), &ops)?, Some(0)))
        }
        Op::Sort {
            dim,
            num_keys,
            output,
        } => {
            // Every operand batched at 0 (broadcast if unbatched); the sorted dim moves by one.
            let ops = vals
                .iter()
                .map(|&v| b.materialize(v, 0))
                .collect::<Result<Vec<_>>>()?;
            let s = Op::Sort {
                dim: dim + 1,
                num_keys: *num_keys,
                output: *output,
            };
            Ok((b.add(s, &ops)?, Some(0)))
        }
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => {
            let (x, bd) = (vals[0].0, vals[0].1.expect("a batched operand"));
            let c = Op::Cumulative {
                kind: *kind,
                axis: shift(*axis, bd),
                reverse: *reverse,
            };
            Ok((b.add(c, &[x])?, Some(bd)))
        }
        Op::Rev { dims } => {
            let (x, bd) = (vals[0].0, vals[0].1.expect("a batched operand"));
            let r = Op::Rev {
                dims: dims.iter().map(|&d| shift(d, bd)).collect(),
            };
            Ok((b.add(r, &[x])?, Some(bd)))
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

/// Rules of the region ops. A body is batched as a function of its own, its batched
/// parameters and outputs with the batch dim first; a loop's carry that becomes batched in the
/// body is batched from the start, to a fixed point (as JAX does).
mod region {
    use super::{BatchError, Builder, Result, Val, run};
    use tessera_ir::{BinaryOp, TensorType};
    use tessera_ir::{CompareOp, DType, Graph, Literal, NodeId, Op, ReduceKind, RegionOp, Shape};

    /// `g` batched with parameter `i` batched (at dim 0) where `batched[i]`.
    fn body(b: &Builder, g: &Graph, batched: &[bool]) -> Result<(Builder, Vec<Val>)> {
        let axes: Vec<Option<usize>> = batched.iter().map(|&x| x.then_some(0)).collect();
        run(g, &axes, b.size, b.axis.as_deref())
    }

    fn is_b(vals: &[Val]) -> Vec<bool> {
        vals.iter().map(|v| v.1.is_some()).collect()
    }

    /// The body graph with output `i` batched at dim 0 where `force[i]` (the others are
    /// unbatched: the fixed points guarantee it).
    fn finish(mut bb: Builder, outs: &[Val], force: &[bool]) -> Result<Graph> {
        bb.loc = None;
        bb.op = "vmap of a region's body".into();
        let mut o = Vec::with_capacity(outs.len());
        for (&v, &f) in outs.iter().zip(force) {
            o.push(match (f, v.1) {
                (true, _) => bb.materialize(v, 0)?,
                (false, None) => v.0,
                (false, Some(_)) => {
                    return Err(bb.unsupported("a batched output where none was planned".into()));
                }
            });
        }
        bb.g.set_outputs(o);
        Ok(bb.g)
    }

    /// The operand, batched at `at` when `batched` (broadcast if it was not), else as it is.
    fn operand(b: &mut Builder, v: Val, batched: bool, at: usize) -> Result<NodeId> {
        if batched {
            b.materialize(v, at)
        } else {
            Ok(v.0)
        }
    }

    /// Adds the region and reads its results, batched as `bdims` says.
    fn emit(
        b: &mut Builder,
        r: RegionOp,
        operands: &[NodeId],
        bdims: Vec<Option<usize>>,
    ) -> Result<Vec<Val>> {
        let op = r.name().to_string();
        let (node, results) =
            b.g.add_region(r, operands)
                .map_err(|error| BatchError::Rule { op, error })?;
        b.g.node_mut(node).loc = b.loc.clone();
        for &n in &results {
            b.g.node_mut(n).loc = b.loc.clone();
        }
        Ok(results.into_iter().zip(bdims).collect())
    }

    /// The batched results of region `r` applied to `vals`.
    pub(super) fn region(b: &mut Builder, r: &RegionOp, vals: &[Val]) -> Result<Vec<Val>> {
        match r {
            RegionOp::Scan {
                length,
                reverse,
                consts,
                carries,
                body: g,
            } => scan(b, (*length, *reverse, *consts, *carries), g, vals),
            RegionOp::While {
                consts,
                cond,
                body: g,
            } => while_loop(b, *consts, cond, g, vals),
            RegionOp::Case { branches } => case(b, branches, vals),
            RegionOp::Checkpoint { body: g } => {
                let (bb, outs) = body(b, g, &is_b(vals))?;
                let out_b = is_b(&outs);
                let new = finish(bb, &outs, &out_b)?;
                let ops = vals
                    .iter()
                    .map(|&v| operand(b, v, v.1.is_some(), 0))
                    .collect::<Result<Vec<_>>>()?;
                let bdims = out_b.iter().map(|&x| x.then_some(0)).collect();
                emit(b, RegionOp::Checkpoint { body: new }, &ops, bdims)
            }
            RegionOp::CustomVjp { primals, fwd, bwd } => custom_vjp(b, *primals, fwd, bwd, vals),
        }
    }

    /// `scan`: consts and xs batched as given (xs at dim 1, so a step's slice has it first),
    /// carries batched where the body makes them so, to a fixed point.
    fn scan(
        b: &mut Builder,
        (length, reverse, nc, nk): (usize, bool, usize, usize),
        g: &Graph,
        vals: &[Val],
    ) -> Result<Vec<Val>> {
        let in_b = is_b(vals);
        let mut kb = in_b[nc..nc + nk].to_vec();
        loop {
            let mut pb = in_b[..nc].to_vec();
            pb.extend(&kb);
            pb.extend(&in_b[nc + nk..]);
            let (bb, outs) = body(b, g, &pb)?;
            let mut changed = false;
            for (k, o) in kb.iter_mut().zip(&outs[..nk]) {
                if o.1.is_some() && !*k {
                    *k = true;
                    changed = true;
                }
            }
            if changed {
                continue;
            }
            let yb = is_b(&outs[nk..]);
            let mut force = kb.clone();
            force.extend(&yb);
            let new = finish(bb, &outs, &force)?;
            let mut ops = Vec::with_capacity(vals.len());
            for (i, &v) in vals.iter().enumerate() {
                ops.push(if i < nc {
                    operand(b, v, in_b[i], 0)?
                } else if i < nc + nk {
                    operand(b, v, kb[i - nc], 0)?
                } else {
                    operand(b, v, in_b[i], 1)?
                });
            }
            let mut bdims: Vec<Option<usize>> = kb.iter().map(|&x| x.then_some(0)).collect();
            bdims.extend(yb.iter().map(|&x| x.then_some(1)));
            let r = RegionOp::Scan {
                length,
                reverse,
                consts: nc,
                carries: nk,
                body: new,
            };
            return emit(b, r, &ops, bdims);
        }
    }

    /// `while`: carries batched to a fixed point of the body. A batched predicate (lanes
    /// that stop at different steps) makes every carry batched and becomes JAX's rule: run
    /// while any lane's predicate holds, and keep each lane's old carries where its own does
    /// not.
    fn while_loop(
        b: &mut Builder,
        nc: usize,
        cond: &Graph,
        g: &Graph,
        vals: &[Val],
    ) -> Result<Vec<Val>> {
        let in_b = is_b(vals);
        let mut kb = in_b[nc..].to_vec();
        loop {
            let mut pb = in_b[..nc].to_vec();
            pb.extend(&kb);
            let (bb, outs) = body(b, g, &pb)?;
            let mut changed = false;
            for (k, o) in kb.iter_mut().zip(&outs) {
                if o.1.is_some() && !*k {
                    *k = true;
                    changed = true;
                }
            }
            if changed {
                continue;
            }
            let (cb, couts) = body(b, cond, &pb)?;
            let pred_b = couts[0].1.is_some();
            if pred_b && !kb.iter().all(|&k| k) {
                kb = vec![true; kb.len()];
                continue;
            }
            let new_body = finish(bb, &outs, &kb)?;
            let new_cond = finish(cb, &couts, &[pred_b])?;
            let mut ops = Vec::with_capacity(vals.len());
            for (i, &v) in vals.iter().enumerate() {
                let batched = if i < nc { in_b[i] } else { kb[i - nc] };
                ops.push(operand(b, v, batched, 0)?);
            }
            let bdims = kb.iter().map(|&x| x.then_some(0)).collect();
            let (cond, body) = if pred_b {
                (
                    any_lane(b, &new_cond)?,
                    select_lanes(b, &new_cond, &new_body, nc)?,
                )
            } else {
                (new_cond, new_body)
            };
            let r = RegionOp::While {
                consts: nc,
                cond,
                body,
            };
            return emit(b, r, &ops, bdims);
        }
    }

    /// A graph over `like`'s parameters, for a new body.
    fn over_params(b: &Builder, like: &Graph) -> (Graph, Vec<NodeId>) {
        let mut g = Graph::new(like.name.clone());
        g.mesh = b.g.mesh.clone();
        let ps = like
            .params()
            .iter()
            .map(|&p| g.add_param(like.ty(p).clone()))
            .collect();
        (g, ps)
    }

    fn rule_err(error: tessera_ir::TypeError) -> BatchError {
        BatchError::Rule {
            op: "while".into(),
            error,
        }
    }

    /// The condition `any(pred)` of a batched predicate `cond` (`bool[n]`).
    fn any_lane(b: &Builder, cond: &Graph) -> Result<Graph> {
        let (mut g, ps) = over_params(b, cond);
        let p = g.inline(cond, &ps).map_err(rule_err)?[0];
        let i = g.add(Op::Convert(DType::I32), &[p]).map_err(rule_err)?;
        let m = g
            .add(
                Op::Reduce {
                    kind: ReduceKind::Max,
                    axes: vec![0],
                },
                &[i],
            )
            .map_err(rule_err)?;
        let zero = g
            .add(
                Op::Constant(Literal::splat(&TensorType::scalar(DType::I32), 0.0)),
                &[],
            )
            .map_err(rule_err)?;
        let any = g
            .add(Op::Compare(CompareOp::Gt), &[m, zero])
            .map_err(rule_err)?;
        g.set_outputs(vec![any]);
        Ok(g)
    }

    /// The body that steps only the lanes whose predicate holds: `select(pred, body(c), c)`
    /// for every carry `c` (all batched at dim 0).
    fn select_lanes(b: &Builder, cond: &Graph, body: &Graph, nc: usize) -> Result<Graph> {
        let (mut g, ps) = over_params(b, body);
        let p = g.inline(cond, &ps).map_err(rule_err)?[0];
        let new = g.inline(body, &ps).map_err(rule_err)?;
        let mut outs = Vec::with_capacity(new.len());
        for (&n, &old) in new.iter().zip(&ps[nc..]) {
            let shape = g.ty(old).shape.clone();
            let pb = g
                .add(
                    Op::BroadcastInDim {
                        shape,
                        dims: vec![0],
                    },
                    &[p],
                )
                .map_err(rule_err)?;
            outs.push(g.add(Op::Select, &[pb, n, old]).map_err(rule_err)?);
        }
        g.set_outputs(outs);
        Ok(g)
    }

    /// `case`: with an unbatched index, a `case` of the batched branches (an output batched in
    /// one branch batched in all). With a batched index (each lane its own branch), JAX's rule:
    /// every branch runs on the whole batch and each lane selects its branch's result by its
    /// index, clamped as `case` clamps it.
    fn case(b: &mut Builder, branches: &[Graph], vals: &[Val]) -> Result<Vec<Val>> {
        let (idx, args) = (vals[0], &vals[1..]);
        let ab = is_b(args);
        let batched: Vec<(Builder, Vec<Val>)> = branches
            .iter()
            .map(|g| body(b, g, &ab))
            .collect::<Result<_>>()?;
        let n_out = branches[0].outputs().len();
        let out_b: Vec<bool> = (0..n_out)
            .map(|o| idx.1.is_some() || batched.iter().any(|(_, outs)| outs[o].1.is_some()))
            .collect();
        let mut new = Vec::with_capacity(branches.len());
        for (bb, outs) in batched {
            new.push(finish(bb, &outs, &out_b)?);
        }
        let ops = args
            .iter()
            .map(|&v| operand(b, v, v.1.is_some(), 0))
            .collect::<Result<Vec<_>>>()?;
        let Some(ib) = idx.1 else {
            let mut all = vec![idx.0];
            all.extend(ops);
            let bdims = out_b.iter().map(|&x| x.then_some(0)).collect();
            return emit(b, RegionOp::Case { branches: new }, &all, bdims);
        };
        debug_assert_eq!(ib, 0, "a batched scalar has its batch dim first");
        let n = b.size;
        let lanes = TensorType::new(DType::I32, vec![n]);
        let top = b.full(&lanes, (new.len() - 1) as f64)?;
        let zero = b.full(&lanes, 0.0)?;
        let i = b.add(Op::Binary(BinaryOp::Min), &[idx.0, top])?;
        let i = b.add(Op::Binary(BinaryOp::Max), &[i, zero])?;
        let mut results: Vec<Vec<NodeId>> = Vec::with_capacity(new.len());
        for g in &new {
            let r = b.g.inline(g, &ops).map_err(|error| BatchError::Rule {
                op: "case".into(),
                error,
            })?;
            results.push(r);
        }
        let mut out = Vec::with_capacity(n_out);
        for o in 0..n_out {
            let mut r = results[0][o];
            for (k, res) in results.iter().enumerate().skip(1) {
                let kk = b.full(&lanes, k as f64)?;
                let is_k = b.add(Op::Compare(CompareOp::Eq), &[i, kk])?;
                let shape: Shape = b.ty(r).shape;
                let p = b.add(
                    Op::BroadcastInDim {
                        shape,
                        dims: vec![0],
                    },
                    &[is_k],
                )?;
                r = b.add(Op::Select, &[p, res[o], r])?;
            }
            out.push((r, Some(0)));
        }
        Ok(out)
    }

    /// `custom_vjp`: `fwd` batched as its arguments are; `bwd` with its residuals batched as
    /// `fwd` returns them and each cotangent as its primal output. An argument whose cotangent
    /// `bwd` makes batched is batched from the start, to a fixed point.
    fn custom_vjp(
        b: &mut Builder,
        primals: usize,
        fwd: &Graph,
        bwd: &Graph,
        vals: &[Val],
    ) -> Result<Vec<Val>> {
        let mut ab = is_b(vals);
        loop {
            let (fb, fouts) = body(b, fwd, &ab)?;
            let fo_b = is_b(&fouts);
            let mut bw_in = fo_b[primals..].to_vec();
            bw_in.extend(&fo_b[..primals]);
            let (bb, bouts) = body(b, bwd, &bw_in)?;
            let mut changed = false;
            for (a, o) in ab.iter_mut().zip(&bouts) {
                if o.1.is_some() && !*a {
                    *a = true;
                    changed = true;
                }
            }
            if changed {
                continue;
            }
            let new_fwd = finish(fb, &fouts, &fo_b)?;
            let new_bwd = finish(bb, &bouts, &ab)?;
            let ops = vals
                .iter()
                .zip(&ab)
                .map(|(&v, &x)| operand(b, v, x, 0))
                .collect::<Result<Vec<_>>>()?;
            let bdims = fo_b.iter().map(|&x| x.then_some(0)).collect();
            let r = RegionOp::CustomVjp {
                primals,
                fwd: new_fwd,
                bwd: new_bwd,
            };
            return emit(b, r, &ops, bdims);
        }
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
