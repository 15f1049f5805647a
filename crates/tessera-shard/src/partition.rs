//! SPMD partitioning: collective insertion and the per-device program.
//!
//! Consumes a global graph, its mesh, and a sharding for every parameter; produces the same
//! graph annotated with each value's sharding (Shardy syntax in the IR text), and the
//! per-device program: local shapes, with the collectives the shardings need.
//!
//! First `propagate` settles where every value should live. Then one forward walk builds the
//! per-device program: each op's factor rule (`factors.rs`) reads where its operands are and
//! where its result is wanted, settles its factors (`propagate::resolve`, the larger tensor
//! winning a conflict), and from them the sharding it wants its operands in, its result's, and
//! its reduction factors' axes. An operand elsewhere is resharded: `all_to_all` where an axis
//! moves to another dim, `all_gather` to make a dim whole, a local slice by `axis_index` to
//! split one; a splat or a broadcast is rather built
//! again in place. A sharded reduction factor leaves partial results that an `all_reduce`
//! completes, or a `reduce_scatter` where the result is wanted split over those axes. The dump
//! records each reshard and each conflict in the node's location comment.

use std::collections::HashMap;

use tessera_ir::{
    CollectiveOp, CompareOp, DType, DimSharding, Graph, Literal, Mesh, NodeId, Op, ReduceKind,
    Sharding, TensorType, TypeError,
};

use crate::factors::{FactorKind, rule_of};
use crate::propagate::{project, propagate, settle};

/// For each dimension, the mesh axes it is split over (major first).
pub type Spec = Vec<Vec<String>>;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShardError {
    #[error("{0}")]
    Invalid(String),
    #[error("partitioning {op}: {error}")]
    Type { op: String, error: TypeError },
}

/// The result of partitioning.
pub struct Partitioned {
    /// The global program with every value's sharding.
    pub annotated: Graph,
    /// The program each device runs: local shapes and collectives.
    pub local: Graph,
    /// The sharding of each output.
    pub out_specs: Vec<Spec>,
}

pub(crate) fn group_size(mesh: &Mesh, axes: &[String]) -> usize {
    axes.iter().filter_map(|a| mesh.axis_size(a)).product()
}

fn local_type(mesh: &Mesh, ty: &TensorType, spec: &Spec) -> TensorType {
    let dims: Vec<usize> = ty
        .dims()
        .iter()
        .zip(spec)
        .map(|(&d, axes)| d / group_size(mesh, axes))
        .collect();
    TensorType::new(ty.dtype, dims)
}

/// Checks that `spec` fits a value of type `ty` on `mesh`.
pub fn check_spec(mesh: &Mesh, ty: &TensorType, spec: &Spec) -> Result<(), ShardError> {
    if spec.len() != ty.rank() {
        return Err(ShardError::Invalid(format!(
            "a sharding with {} dims for a value of type {ty}",
            spec.len()
        )));
    }
    let mut seen: Vec<&String> = Vec::new();
    for (d, axes) in spec.iter().enumerate() {
        for a in axes {
            if mesh.axis_size(a).is_none() {
                return Err(ShardError::Invalid(format!(
                    "unknown mesh axis \"{a}\" (the mesh has {:?})",
                    mesh.axes.iter().map(|(n, _)| n).collect::<Vec<_>>()
                )));
            }
            if seen.contains(&a) {
                return Err(ShardError::Invalid(format!(
                    "mesh axis \"{a}\" is used twice in one sharding"
                )));
            }
            seen.push(a);
        }
        let n = group_size(mesh, axes);
        if !ty.dims()[d].is_multiple_of(n) {
            return Err(ShardError::Invalid(format!(
                "dim {d} of {ty} (size {}) is not divisible by {n}, the size of {axes:?}",
                ty.dims()[d]
            )));
        }
    }
    Ok(())
}

/// One dim's axes in Shardy's syntax, for messages: `{"dp", "mp"}`.
pub(crate) fn axes_text(axes: &[String]) -> String {
    let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
    format!("{{{}}}", names.join(", "))
}

/// A spec in Shardy's per-dim syntax, for messages.
pub(crate) fn spec_text(spec: &[Vec<String>]) -> String {
    let dims: Vec<String> = spec.iter().map(|a| axes_text(a)).collect();
    format!("[{}]", dims.join(", "))
}

/// The IR annotation of a spec.
pub fn sharding_of(mesh: &Mesh, spec: &Spec) -> Sharding {
    Sharding {
        mesh: mesh.name.clone(),
        dims: spec
            .iter()
            .map(|a| DimSharding::closed(a.clone()))
            .collect(),
        replicated: Vec::new(),
    }
}

struct Partitioner<'a> {
    g: &'a Graph,
    mesh: &'a Mesh,
    lg: Graph,
}

/// What an op's factor rule decides, given where its operands are and where propagation wants
/// its result.
struct Decision {
    /// The sharding each operand must be in.
    want: Vec<Spec>,
    /// The result's sharding.
    out: Spec,
    /// Axes over which the local result is a partial value, and how to complete it.
    partial: Option<(ReduceKind, Vec<String>)>,
    /// Conflicts settled, for the dump.
    conflicts: Vec<String>,
}

/// Partitions `g` (see the module doc).
pub fn partition(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Partitioned, ShardError> {
    // The input shardings are checked first, for their clearer message; their parameters must
    // exist for that, which the verifier checks next.
    let verified = tessera_ir::verify(g);
    if g.params().iter().all(|&p| g.contains(p)) {
        if in_specs.len() != g.params().len() {
            return Err(ShardError::Invalid(format!(
                "{} parameter shardings for {} parameters",
                in_specs.len(),
                g.params().len()
            )));
        }
        for (i, &param) in g.params().iter().enumerate() {
            check_spec(mesh, g.ty(param), &in_specs[i])
                .map_err(|e| ShardError::Invalid(format!("input {i}: {e}")))?;
        }
    }
    verified
        .map_err(|e| ShardError::Invalid(format!("the graph to partition is malformed: {e}")))?;
    if let Some(id) = g
        .topo_order()
        .into_iter()
        .find(|&id| g.op(id).is_collective())
    {
        return Err(ShardError::Invalid(format!(
            "{} written inside a sharded jit: collectives by axis name belong in pmap",
            g.op(id).name()
        )));
    }
    let wanted = propagate(g, mesh, in_specs)?;
    let mut annotated = g.clone();
    annotated.mesh = Some(mesh.clone());
    let mut p = Partitioner {
        g,
        mesh,
        lg: Graph::new(format!("{}_per_device", g.name)),
    };
    p.lg.mesh = Some(mesh.clone());
    let mut local: HashMap<NodeId, (NodeId, Spec)> = HashMap::new();
    for (i, &param) in g.params().iter().enumerate() {
        let lty = local_type(mesh, g.ty(param), &in_specs[i]);
        let l = p.lg.add_param(lty);
        p.lg.node_mut(l).loc = g.node(param).loc.clone();
        local.insert(param, (l, in_specs[i].clone()));
    }
    for id in g.topo_order() {
        let op = g.op(id).clone();
        if let Op::Parameter(_) = op {
            annotated.node_mut(id).sharding = Some(sharding_of(mesh, &local[&id].1));
            continue;
        }
        let operands = g.operands(id);
        let specs: Vec<Spec> = operands.iter().map(|o| local[o].1.clone()).collect();
        let d = p.decide(id, &op, &specs, &wanted[&id]);
        let mut args = Vec::new();
        let mut why = d.conflicts.clone();
        for (k, &o) in operands.iter().enumerate() {
            let (lnode, spec) = &local[&o];
            let moved = match p.rebuild(o, &d.want[k], &local)? {
                Some(n) => n,
                None => {
                    if *spec != d.want[k] {
                        why.push(format!(
                            "operand {k} resharded {} -> {}",
                            spec_text(spec),
                            spec_text(&d.want[k])
                        ));
                    }
                    p.reshard(*lnode, spec, &d.want[k])?
                }
            };
            args.push(moved);
        }
        // The dump says where communication was inserted and why.
        if !why.is_empty() {
            let node = annotated.node_mut(id);
            let base = node.loc.clone().unwrap_or_default();
            node.loc = Some(
                format!("{base} [{}: {}]", op.name(), why.join("; "))
                    .trim()
                    .to_string(),
            );
        }
        // A sharding constraint has done its work once its operand is resharded.
        if let Op::ShardingConstraint(_) = op {
            annotated.node_mut(id).sharding = Some(sharding_of(mesh, &d.out));
            local.insert(id, (args[0], d.out));
            continue;
        }
        let mut out = d.out;
        let lop = localize(&op, mesh, g.ty(id), &out);
        let mut n = p.add(lop, &args)?;
        p.lg.node_mut(n).loc = g.node(id).loc.clone();
        if let Some((kind, mut axes)) = d.partial.filter(|(_, a)| !a.is_empty()) {
            // Where the result is wanted split over some of the partial axes, each device
            // only needs its chunk of the sum: a reduce_scatter on that dim.
            let scatter = (0..out.len()).find_map(|dim| {
                let w = &wanted[&id][dim];
                let fits = out[dim].is_empty()
                    && !w.is_empty()
                    && w.iter().all(|a| axes.contains(a))
                    && w.iter().all(|a| !out.iter().flatten().any(|b| b == a));
                fits.then(|| (dim, w.clone()))
            });
            if let Some((_, w)) = &scatter {
                axes.retain(|a| !w.contains(a));
            }
            if !axes.is_empty() {
                n = p.add(Op::Collective(CollectiveOp::AllReduce { kind, axes }), &[n])?;
                p.lg.node_mut(n).loc = g.node(id).loc.clone();
            }
            if let Some((dim, w)) = scatter {
                n = p.add(
                    Op::Collective(CollectiveOp::ReduceScatter {
                        kind,
                        dim,
                        axes: w.clone(),
                    }),
                    &[n],
                )?;
                p.lg.node_mut(n).loc = g.node(id).loc.clone();
                out[dim] = w;
            }
        }
        annotated.node_mut(id).sharding = Some(sharding_of(mesh, &out));
        local.insert(id, (n, out));
    }
    let outs: Vec<NodeId> = g.outputs().iter().map(|o| local[o].0).collect();
    let out_specs = g.outputs().iter().map(|o| local[o].1.clone()).collect();
    p.lg.set_outputs(outs);
    // Values resharded by rebuilding leave their first local version unused.
    p.lg.remove_dead();
    Ok(Partitioned {
        annotated,
        local: p.lg,
        out_specs,
    })
}

/// The op with its shape attributes made local.
fn localize(op: &Op, mesh: &Mesh, ty: &TensorType, out: &Spec) -> Op {
    let lty = local_type(mesh, ty, out);
    match op {
        Op::BroadcastInDim { dims, .. } => Op::BroadcastInDim {
            shape: lty.shape,
            dims: dims.clone(),
        },
        Op::Reshape(_) => Op::Reshape(lty.shape),
        Op::Iota { dim, .. } => Op::Iota { dim: *dim, ty: lty },
        // Only splats are ever split (`factors.rs`).
        Op::Constant(lit) if lit.data.is_splat() && !lit.data.is_empty() => {
            Op::Constant(Literal::splat(&lty, lit.data.get_f64(0)))
        }
        // A split dim is only ever sliced whole (the rule gathers it otherwise).
        Op::Slice {
            start,
            limit,
            stride,
        } => Op::Slice {
            start: start.clone(),
            limit: limit
                .iter()
                .zip(lty.dims())
                .zip(out)
                .map(|((&l, &local), axes)| if axes.is_empty() { l } else { local })
                .collect(),
            stride: stride.clone(),
        },
        other => other.clone(),
    }
}

impl Partitioner<'_> {
    /// The op's decision from its factor rule: operands where they are, the result where
    /// propagation wants it; a sharding constraint simply wants its operand in its sharding.
    fn decide(&self, id: NodeId, op: &Op, specs: &[Spec], wanted: &Spec) -> Decision {
        if let Op::ShardingConstraint(_) = op {
            return Decision {
                want: vec![wanted.clone()],
                out: wanted.clone(),
                partial: None,
                conflicts: Vec::new(),
            };
        }
        let g = self.g;
        let rule = rule_of(g, id);
        let a = settle(
            g,
            self.mesh,
            &rule,
            id,
            &specs.iter().collect::<Vec<_>>(),
            wanted,
        );
        let mut partial: Option<(ReduceKind, Vec<String>)> = None;
        for (f, kind) in rule.kinds.iter().enumerate() {
            if let FactorKind::Reduction(kind) = kind {
                partial
                    .get_or_insert((*kind, Vec::new()))
                    .1
                    .extend(a.axes[f].iter().cloned());
            }
        }
        Decision {
            want: (0..specs.len())
                .map(|k| project(self.mesh, &rule, rule.dims_of(Some(k)), &a.axes))
                .collect(),
            out: project(self.mesh, &rule, rule.dims_of(None), &a.axes),
            partial,
            conflicts: a.conflicts,
        }
    }

    fn add(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShardError> {
        let name = op.name().to_string();
        self.lg
            .add(op, args)
            .map_err(|error| ShardError::Type { op: name, error })
    }

    /// A value that costs nothing to compute (a splat constant, or a broadcast of a value whose
    /// carried dims already agree) is computed again directly in the sharding `to` instead of
    /// being sliced: this is what lets `bias + x` with `x` split over `dp` broadcast the bias
    /// straight into the local shape, with no communication.
    fn rebuild(
        &mut self,
        o: NodeId,
        to: &Spec,
        local: &HashMap<NodeId, (NodeId, Spec)>,
    ) -> Result<Option<NodeId>, ShardError> {
        let g = self.g;
        if local[&o].1 == *to {
            return Ok(None);
        }
        let lty = local_type(self.mesh, g.ty(o), to);
        match g.op(o) {
            Op::Constant(lit) if lit.data.is_splat() && !lit.data.is_empty() => {
                // Exact: f64 holds every f32, i32 and u32 value.
                let c = Literal::splat(&lty, lit.data.get_f64(0));
                Ok(Some(self.add(Op::Constant(c), &[])?))
            }
            Op::BroadcastInDim { shape, dims } => {
                let src = g.operands(o)[0];
                let (lsrc, sspec) = &local[&src];
                let from = g.ty(src);
                let carried_ok = dims.iter().enumerate().all(|(i, &d)| {
                    if from.dims()[i] == shape.dims()[d] {
                        sspec[i] == to[d]
                    } else {
                        sspec[i].is_empty()
                    }
                });
                if !carried_ok {
                    return Ok(None);
                }
                let n = self.add(
                    Op::BroadcastInDim {
                        shape: lty.shape,
                        dims: dims.clone(),
                    },
                    &[*lsrc],
                )?;
                Ok(Some(n))
            }
            _ => Ok(None),
        }
    }

    /// Moves a local value from sharding `from` to `to`: first an `all_to_all` for each axis
    /// that moves from one dim to another, then an `all_gather` for each dim that must become
    /// whole, then a local slice by `axis_index` for each dim that must be split. (Gathering
    /// every dim before slicing any matters: a dim sliced over an axis another dim is still
    /// split over would pair chunks from different devices.)
    fn reshard(&mut self, v: NodeId, from: &Spec, to: &Spec) -> Result<NodeId, ShardError> {
        let mut v = v;
        let mut cur = from.clone();
        for d1 in 0..cur.len() {
            if cur[d1].is_empty() || cur[d1] == to[d1] {
                continue;
            }
            let moved =
                (0..cur.len()).find(|&d2| d2 != d1 && cur[d2].is_empty() && to[d2] == cur[d1]);
            if let Some(d2) = moved {
                v = self.add(
                    Op::Collective(CollectiveOp::AllToAll {
                        split_dim: d2,
                        concat_dim: d1,
                        axes: cur[d1].clone(),
                    }),
                    &[v],
                )?;
                cur[d2] = std::mem::take(&mut cur[d1]);
            }
        }
        // A dim split over more axes than wanted gathers only the minor ones it must lose
        // (`{dp, mp}` to `{dp}`: over `mp`); one split over fewer slices only by the extra
        // ones (`{dp}` to `{dp, mp}`: by `mp`, within this device's `dp` chunk).
        for d in 0..cur.len() {
            if !to[d].starts_with(&cur[d]) {
                let keep = if cur[d].starts_with(&to[d]) {
                    to[d].len()
                } else {
                    0
                };
                let axes = cur[d].split_off(keep);
                v = self.add(
                    Op::Collective(CollectiveOp::AllGather { dim: d, axes }),
                    &[v],
                )?;
            }
        }
        for d in 0..cur.len() {
            if cur[d] != to[d] {
                let extra = &to[d][cur[d].len()..];
                v = self.local_slice(v, d, extra)?;
            }
        }
        Ok(v)
    }

    /// This device's chunk of dim `d` (whole locally) over `axes`: the dim is viewed as
    /// `[n, size/n]`, the chunk picked by comparing an iota with `axis_index` and summing the
    /// selected one out.
    /// This device's chunk of dim `d` of `v`, split over `axes`: each chunk is a static slice,
    /// and a chain of selects on the device's index picks one. Selects move values without
    /// arithmetic, so the chunk is bit for bit the slice (`-0.0`, NaN payloads, bools and
    /// integers included), which a masked sum would not be (`+0.0 + -0.0` is `+0.0`).
    fn local_slice(&mut self, v: NodeId, d: usize, axes: &[String]) -> Result<NodeId, ShardError> {
        let ty = self.lg.ty(v).clone();
        let n = group_size(self.mesh, axes);
        let chunk = ty.dims()[d] / n;
        let idx = self.add(
            Op::Collective(CollectiveOp::AxisIndex {
                axes: axes.to_vec(),
            }),
            &[],
        )?;
        let chunks: Vec<NodeId> = (0..n)
            .map(|j| {
                let mut start = vec![0; ty.rank()];
                let mut limit = ty.dims().to_vec();
                start[d] = j * chunk;
                limit[d] = (j + 1) * chunk;
                self.add(
                    Op::Slice {
                        start,
                        limit,
                        stride: vec![1; ty.rank()],
                    },
                    &[v],
                )
            })
            .collect::<Result<_, _>>()?;
        let mut picked = chunks[n - 1];
        for j in (0..n - 1).rev() {
            let j_const = self.add(
                Op::Constant(Literal::splat(&TensorType::scalar(DType::I32), j as f64)),
                &[],
            )?;
            let is_j = self.add(Op::Compare(CompareOp::Eq), &[idx, j_const])?;
            let mask = self.add(
                Op::BroadcastInDim {
                    shape: self.lg.ty(picked).shape.clone(),
                    dims: vec![],
                },
                &[is_j],
            )?;
            picked = self.add(Op::Select, &[mask, chunks[j], picked])?;
        }
        Ok(picked)
    }
}
