//! Sharding propagation, collective insertion and SPMD partitioning, in one forward walk.
//!
//! Consumes a global graph, its mesh, and a sharding for every parameter; produces the same
//! graph annotated with each value's sharding (Shardy syntax in the IR text), and the
//! per-device program: local shapes, with the collectives the shardings need.
//!
//! Each op has a rule (`rule`, one arm per op) that, from its operands' shardings, picks the
//! shardings it wants its operands in and the sharding of its result, in the manner of Shardy's
//! factor rules: elementwise ops keep the dims' shardings; broadcasts, transposes and reshapes
//! carry them along the dims they map; a dot keeps batch and free dims and, when a contracting
//! dim is sharded, computes partial sums that an `all_reduce` over those axes completes (one
//! per dot, so the data-parallel step gets one per gradient plus one for the loss); reductions
//! over sharded dims likewise. An operand whose sharding differs from what the rule wants is
//! resharded: `all_gather` to make a dim whole, a local slice by `axis_index` to split one.
//! Where operands disagree, the first operand's sharding of a dim wins (operands of an
//! elementwise op have the same size, so neither moves more bytes). Propagation runs forward
//! from the parameters and sharding constraints; results no input constrains are replicated.

use std::collections::HashMap;

use tessera_ir::{
    CompareOp, DType, DimSharding, DotDims, Graph, Literal, Mesh, NodeId, Op, ReduceKind, Shape,
    Sharding, TensorType, TypeError,
};

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

fn replicated(rank: usize) -> Spec {
    vec![Vec::new(); rank]
}

fn group_size(mesh: &Mesh, axes: &[String]) -> usize {
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

/// A spec in Shardy's per-dim syntax, for messages.
fn spec_text(spec: &Spec) -> String {
    let dims: Vec<String> = spec
        .iter()
        .map(|axes| {
            format!(
                "{{{}}}",
                axes.iter()
                    .map(|a| format!("\"{a}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
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

/// What an op's rule decides.
struct Decision {
    /// The sharding each operand must be in.
    want: Vec<Spec>,
    /// The result's sharding.
    out: Spec,
    /// Axes over which the local result is a partial value, and how to complete it.
    partial: Option<(ReduceKind, Vec<String>)>,
}

/// Partitions `g` (see the module doc).
pub fn partition(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Partitioned, ShardError> {
    if in_specs.len() != g.params().len() {
        return Err(ShardError::Invalid(format!(
            "{} parameter shardings for {} parameters",
            in_specs.len(),
            g.params().len()
        )));
    }
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
        check_spec(mesh, g.ty(param), &in_specs[i])
            .map_err(|e| ShardError::Invalid(format!("input {i}: {e}")))?;
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
        if op.is_collective() {
            return Err(ShardError::Invalid(format!(
                "{} written inside a sharded jit: collectives by axis name belong in pmap",
                op.name()
            )));
        }
        let operands = g.operands(id);
        let specs: Vec<Spec> = operands.iter().map(|o| local[o].1.clone()).collect();
        let d = p.rule(id, &op, &operands, &specs);
        let mut args = Vec::new();
        let mut why = Vec::new();
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
                    p.reshard(*lnode, g.ty(o), spec, &d.want[k])?
                }
            };
            args.push(moved);
        }
        // The dump says where communication was inserted and why: the op's rule wanted its
        // operands so (for elementwise ops, the first operand's sharding of each dim wins).
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
            check_spec(mesh, g.ty(id), &d.out).map_err(|e| {
                ShardError::Invalid(format!(
                    "sharding_constraint at {}: {e}",
                    g.node(id).loc.clone().unwrap_or_default()
                ))
            })?;
            annotated.node_mut(id).sharding = Some(sharding_of(mesh, &d.out));
            local.insert(id, (args[0], d.out));
            continue;
        }
        let lop = localize(&op, mesh, g.ty(id), &d.out);
        let mut n = p.add(lop, &args)?;
        p.lg.node_mut(n).loc = g.node(id).loc.clone();
        if let Some((kind, axes)) = d.partial.filter(|(_, a)| !a.is_empty()) {
            n = p.add(Op::AllReduce { kind, axes }, &[n])?;
            p.lg.node_mut(n).loc = g.node(id).loc.clone();
        }
        annotated.node_mut(id).sharding = Some(sharding_of(mesh, &d.out));
        local.insert(id, (n, d.out));
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

/// Merges the dims' shardings of same-shaped operands: the first operand that splits a dim
/// decides, unless that axis is already used by another dim.
fn merge(specs: &[&Spec], rank: usize) -> Spec {
    let mut out = replicated(rank);
    let mut used: Vec<String> = Vec::new();
    for (d, slot) in out.iter_mut().enumerate() {
        let pick = specs.iter().find_map(|s| {
            s.get(d)
                .filter(|a| !a.is_empty() && a.iter().all(|x| !used.contains(x)))
        });
        if let Some(axes) = pick {
            used.extend(axes.iter().cloned());
            *slot = axes.clone();
        }
    }
    out
}

/// Keeps each axis only on the first dim that names it.
fn dedup(spec: &mut Spec) {
    let mut used: Vec<String> = Vec::new();
    for axes in spec.iter_mut() {
        if axes.iter().any(|a| used.contains(a)) {
            axes.clear();
        } else {
            used.extend(axes.iter().cloned());
        }
    }
}

impl Partitioner<'_> {
    fn add(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShardError> {
        let name = op.name().to_string();
        self.lg
            .add(op, args)
            .map_err(|error| ShardError::Type { op: name, error })
    }

    /// The sharding rule of one op.
    fn rule(&self, id: NodeId, op: &Op, operands: &[NodeId], specs: &[Spec]) -> Decision {
        let g = self.g;
        let rank = g.ty(id).rank();
        let same = |out: Spec, n: usize| Decision {
            want: vec![out.clone(); n],
            out,
            partial: None,
        };
        match op {
            Op::Parameter(_) => same(replicated(rank), 0),
            Op::Constant(_) | Op::Iota { .. } => same(replicated(rank), 0),
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_) => {
                let refs: Vec<&Spec> = specs.iter().collect();
                same(merge(&refs, rank), specs.len())
            }
            Op::BroadcastInDim { shape, dims } => {
                let from = g.ty(operands[0]);
                let mut want = specs[0].clone();
                let mut out = replicated(rank);
                for (i, &d) in dims.iter().enumerate() {
                    if from.dims()[i] == shape.dims()[d] {
                        out[d] = want[i].clone();
                    } else {
                        want[i].clear();
                    }
                }
                Decision {
                    want: vec![want],
                    out,
                    partial: None,
                }
            }
            Op::Reshape(shape) => {
                let from = g.ty(operands[0]);
                let mut want = specs[0].clone();
                let mut out = replicated(rank);
                // A dim keeps its sharding when it is a dim of the result too: same size, same
                // product of the dims before it.
                let mut prefix = 1;
                for (i, &s) in from.dims().iter().enumerate() {
                    if !want[i].is_empty() {
                        let mut q = 1;
                        let mut found = None;
                        for (j, &t) in shape.dims().iter().enumerate() {
                            if q == prefix && t == s {
                                found = Some(j);
                                break;
                            }
                            q *= t;
                        }
                        match found {
                            Some(j) => out[j] = want[i].clone(),
                            None => want[i].clear(),
                        }
                    }
                    prefix *= s;
                }
                Decision {
                    want: vec![want],
                    out,
                    partial: None,
                }
            }
            Op::Transpose(perm) => {
                let out = perm.iter().map(|&p| specs[0][p].clone()).collect();
                Decision {
                    want: vec![specs[0].clone()],
                    out,
                    partial: None,
                }
            }
            Op::Slice {
                start,
                limit,
                stride,
            } => {
                let from = g.ty(operands[0]);
                let mut want = specs[0].clone();
                for d in 0..rank {
                    if start[d] != 0 || limit[d] != from.dims()[d] || stride[d] != 1 {
                        want[d].clear();
                    }
                }
                same_with(want)
            }
            Op::Pad {
                low,
                high,
                interior,
            } => {
                let mut want = specs[0].clone();
                for d in 0..rank {
                    if low[d] != 0 || high[d] != 0 || interior[d] != 0 {
                        want[d].clear();
                    }
                }
                Decision {
                    want: vec![want.clone(), Vec::new()],
                    out: want,
                    partial: None,
                }
            }
            Op::Concatenate { dim } => {
                let refs: Vec<&Spec> = specs.iter().collect();
                let mut out = merge(&refs, rank);
                out[*dim].clear();
                same(out, specs.len())
            }
            Op::Reduce { kind, axes } => {
                let want = specs[0].clone();
                let out: Spec = (0..want.len())
                    .filter(|d| !axes.contains(d))
                    .map(|d| want[d].clone())
                    .collect();
                let partial: Vec<String> = axes.iter().flat_map(|&d| want[d].clone()).collect();
                Decision {
                    want: vec![want],
                    out,
                    partial: Some((*kind, partial)),
                }
            }
            Op::ArgMax { axis } => {
                let mut want = specs[0].clone();
                want[*axis].clear();
                let out = (0..want.len())
                    .filter(|d| d != axis)
                    .map(|d| want[d].clone())
                    .collect();
                Decision {
                    want: vec![want],
                    out,
                    partial: None,
                }
            }
            Op::DotGeneral(dd) => self.dot_rule(dd, operands, specs),
            Op::ShardingConstraint(s) => {
                let out: Spec = s.dims.iter().map(|d| d.axes.clone()).collect();
                same(out, 1)
            }
            Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::AllToAll { .. }
            | Op::CollectivePermute { .. }
            | Op::AxisIndex { .. } => same(replicated(rank), operands.len()),
        }
    }

    fn dot_rule(&self, dd: &DotDims, operands: &[NodeId], specs: &[Spec]) -> Decision {
        let (lt, rt) = (self.g.ty(operands[0]), self.g.ty(operands[1]));
        let (mut l, mut r) = (specs[0].clone(), specs[1].clone());
        // Batch dims: both sides split alike (the lhs decides).
        for (&a, &b) in dd.lhs_batch.iter().zip(&dd.rhs_batch) {
            let axes = if l[a].is_empty() {
                r[b].clone()
            } else {
                l[a].clone()
            };
            l[a] = axes.clone();
            r[b] = axes;
        }
        // Contracting dims: both sides split alike, leaving partial sums.
        let mut partial = Vec::new();
        for (&a, &b) in dd.lhs_contract.iter().zip(&dd.rhs_contract) {
            let axes = if l[a].is_empty() {
                r[b].clone()
            } else {
                l[a].clone()
            };
            l[a] = axes.clone();
            r[b] = axes.clone();
            partial.extend(axes);
        }
        let lfree = dd.lhs_free(lt.rank());
        let rfree = dd.rhs_free(rt.rank());
        let mut out: Spec = dd.lhs_batch.iter().map(|&a| l[a].clone()).collect();
        out.extend(lfree.iter().map(|&a| l[a].clone()));
        out.extend(rfree.iter().map(|&b| r[b].clone()));
        // An axis used by the contraction cannot also split a result dim.
        for axes in out.iter_mut() {
            if axes.iter().any(|a| partial.contains(a)) {
                axes.clear();
            }
        }
        dedup(&mut out);
        // Operands' free dims follow what the result kept.
        let nb = dd.lhs_batch.len();
        for (j, &a) in lfree.iter().enumerate() {
            l[a] = out[nb + j].clone();
        }
        for (j, &b) in rfree.iter().enumerate() {
            r[b] = out[nb + lfree.len() + j].clone();
        }
        Decision {
            want: vec![l, r],
            out,
            partial: Some((ReduceKind::Sum, partial)),
        }
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

    /// Moves a local value from sharding `from` to `to`: `all_gather` where a dim must become
    /// whole, a local slice by `axis_index` where it must be split.
    fn reshard(
        &mut self,
        v: NodeId,
        gty: &TensorType,
        from: &Spec,
        to: &Spec,
    ) -> Result<NodeId, ShardError> {
        let mut v = v;
        for d in 0..from.len() {
            if from[d] == to[d] {
                continue;
            }
            if !from[d].is_empty() {
                v = self.add(
                    Op::AllGather {
                        dim: d,
                        axes: from[d].clone(),
                    },
                    &[v],
                )?;
            }
            if !to[d].is_empty() {
                v = self.local_slice(v, d, &to[d])?;
            }
        }
        let _ = gty;
        Ok(v)
    }

    /// This device's chunk of dim `d` (whole locally) over `axes`: the dim is viewed as
    /// `[n, size/n]`, the chunk picked by comparing an iota with `axis_index` and summing the
    /// selected one out.
    fn local_slice(&mut self, v: NodeId, d: usize, axes: &[String]) -> Result<NodeId, ShardError> {
        let ty = self.lg.ty(v).clone();
        let n = group_size(self.mesh, axes);
        let mut split: Vec<usize> = ty.dims().to_vec();
        let size = split[d];
        split[d] = size / n;
        split.insert(d, n);
        let r = self.add(Op::Reshape(Shape::new(split.clone())), &[v])?;
        let idx = self.add(
            Op::AxisIndex {
                axes: axes.to_vec(),
            },
            &[],
        )?;
        let iota = self.add(
            Op::Iota {
                dim: 0,
                ty: TensorType::new(DType::I32, vec![n]),
            },
            &[],
        )?;
        let idx_b = self.add(
            Op::BroadcastInDim {
                shape: Shape::new(vec![n]),
                dims: vec![],
            },
            &[idx],
        )?;
        let mask = self.add(Op::Compare(CompareOp::Eq), &[iota, idx_b])?;
        let mask_b = self.add(
            Op::BroadcastInDim {
                shape: Shape::new(split.clone()),
                dims: vec![d],
            },
            &[mask],
        )?;
        let zero = self.add(
            Op::Constant(Literal::zeros(&TensorType::scalar(ty.dtype))),
            &[],
        )?;
        let zeros = self.add(
            Op::BroadcastInDim {
                shape: Shape::new(split),
                dims: vec![],
            },
            &[zero],
        )?;
        let picked = self.add(Op::Select, &[mask_b, r, zeros])?;
        self.add(
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![d],
            },
            &[picked],
        )
    }
}

fn same_with(want: Spec) -> Decision {
    Decision {
        want: vec![want.clone()],
        out: want,
        partial: None,
    }
}
