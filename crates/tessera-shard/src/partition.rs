//! SPMD partitioning: the per-device program.
//!
//! Consumes the output of `insert_collectives`: a global graph on a mesh, every node annotated
//! where its value is, every op's operands in the shardings its factor rule wants, the
//! communication explicit (reshards as `sharding_constraint`, completions of partial results as
//! `all_reduce`). Produces the program each device runs: the same ops with local shapes (and
//! shape attributes made local), each reshard lowered to `all_to_all`, `all_gather` and a local
//! slice by `axis_index`, each `all_reduce` whose result is split where its operand is whole
//! lowered to an `all_reduce` over the other axes and a `reduce_scatter`.
//!
//! The pass decides nothing; it checks that its input is consistent (each op's shardings agree
//! with its factor rule, each partial result is completed by `all_reduce`s over its axes), so a
//! hand-written or broken input is an error naming the op, not a wrong program.

use std::collections::HashMap;

use tessera_ir::{
    CollectiveOp, CompareOp, DType, Graph, Literal, Mesh, NodeId, Op, ReduceKind, RegionOp,
    TensorType,
};

use crate::factors::rule_of;
use crate::propagate::{project, settle};
use crate::region;
use crate::spec::{
    ShardError, Spec, annotation, check_spec, local_type, mesh_of, order, spec_text,
};

const PASS: &str = "partition";

struct Partitioner<'a> {
    mesh: &'a Mesh,
    lg: Graph,
}

/// The pass (see the module doc).
pub fn per_device(g: &Graph) -> Result<Graph, ShardError> {
    let mesh = mesh_of(g, PASS)?;
    per_device_graph(g, mesh, format!("{}_per_device", g.name))
}

/// The pass on `g`, the program or a region's body, on `mesh`, the local graph named `name`.
fn per_device_graph(g: &Graph, mesh: &Mesh, name: String) -> Result<Graph, ShardError> {
    let order = order(g, PASS)?;
    let mut specs: HashMap<NodeId, Spec> = HashMap::new();
    for id in g.node_ids() {
        if let Op::Region(_) = g.op(id) {
            // A token, not annotated: its results are.
            specs.insert(id, vec![Vec::new()]);
            continue;
        }
        let spec = annotation(g, id, PASS, "insert_collectives")?;
        check_spec(mesh, g.ty(id), &spec)
            .map_err(|e| ShardError::Invalid(format!("{PASS}: {}: {e}", g.op(id).name())))?;
        specs.insert(id, spec);
    }
    let mut p = Partitioner {
        mesh,
        lg: Graph::new(name),
    };
    p.lg.mesh = Some(mesh.clone());
    let mut local: HashMap<NodeId, NodeId> = HashMap::new();
    for &param in g.params() {
        let l =
            p.lg.add_param(local_type(mesh, g.ty(param), &specs[&param]));
        p.lg.node_mut(l).loc = g.node(param).loc.clone();
        local.insert(param, l);
    }
    // The ops whose local results are partial, with their reduction and axes: only
    // `all_reduce`s of exactly those may use them.
    let mut partial: HashMap<NodeId, (ReduceKind, Vec<String>)> = HashMap::new();
    // For each region node, where each of its results is.
    let mut results: HashMap<NodeId, Vec<Spec>> = HashMap::new();
    for id in order {
        let op = g.op(id);
        let operands = g.operands(id);
        let args: Vec<NodeId> = operands.iter().map(|o| local[o]).collect();
        let spec = &specs[&id];
        let n = match op {
            Op::Parameter(_) => continue,
            Op::ShardingConstraint(_) => {
                if partial.contains_key(&operands[0]) {
                    return Err(incomplete(g, operands[0], &partial));
                }
                p.reshard(args[0], &specs[&operands[0]], spec)?
            }
            Op::Collective(CollectiveOp::AllReduce { kind, axes }) => {
                let src = operands[0];
                if partial.get(&src) != Some(&(*kind, axes.clone())) {
                    return Err(ShardError::Invalid(format!(
                        "{PASS}: all_reduce {kind:?} over {axes:?} of the {} : {}, which is not \
                         partial over exactly those axes",
                        g.op(src).name(),
                        g.ty(src)
                    )));
                }
                let loc = g.node(id).loc.clone();
                p.complete(args[0], (*kind, axes), (&specs[&src], spec), loc)?
            }
            Op::Collective(
                CollectiveOp::AllGather { .. }
                | CollectiveOp::ReduceScatter { .. }
                | CollectiveOp::AllToAll { .. }
                | CollectiveOp::CollectivePermute { .. }
                | CollectiveOp::AxisIndex { .. },
            ) => {
                return Err(ShardError::Invalid(format!(
                    "{PASS}: {} in the input; its communication is sharding_constraint and \
                     all_reduce only",
                    op.name()
                )));
            }
            Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::DotGeneral(_)
            | Op::StopGradient
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => {
                if let Some(&o) = operands.iter().find(|o| partial.contains_key(o)) {
                    return Err(incomplete(g, o, &partial));
                }
                let operand_specs: Vec<&Spec> = operands.iter().map(|o| &specs[o]).collect();
                if let Some(reduced) = check_op(g, mesh, id, &operand_specs, spec)? {
                    partial.insert(id, reduced);
                }
                let n = p.add(localize(op, mesh, g.ty(id), spec), &args)?;
                p.lg.node_mut(n).loc = g.node(id).loc.clone();
                n
            }
            Op::Region(r) => {
                if let Some(&o) = operands.iter().find(|o| partial.contains_key(o)) {
                    return Err(incomplete(g, o, &partial));
                }
                let (local_r, specs_of_results) = region(g, mesh, id, r, &specs)?;
                results.insert(id, specs_of_results);
                let n = p.add(Op::Region(Box::new(local_r)), &args)?;
                p.lg.node_mut(n).loc = g.node(id).loc.clone();
                n
            }
            Op::GetResult { index, .. } => {
                let want = &results[&operands[0]][*index];
                if spec != want {
                    return Err(ShardError::Invalid(format!(
                        "{PASS}: get_result index={index} : {} is sharded {} but the {}'s \
                         result {index} is {}; run insert_collectives first",
                        g.ty(id),
                        spec_text(spec),
                        g.op(operands[0]).name(),
                        spec_text(want)
                    )));
                }
                let n = p.add(localize(op, mesh, g.ty(id), spec), &args)?;
                p.lg.node_mut(n).loc = g.node(id).loc.clone();
                n
            }
        };
        local.insert(id, n);
    }
    if let Some(&o) = g.outputs().iter().find(|o| partial.contains_key(o)) {
        return Err(incomplete(g, o, &partial));
    }
    let outs: Vec<NodeId> = g.outputs().iter().map(|o| local[o]).collect();
    p.lg.set_outputs(outs);
    p.lg.remove_dead();
    Ok(p.lg)
}

/// The pass on a mesh of one device, in place of `per_device` and `combine`: every value is
/// whole on the one device, so the program it runs is `g`, insert_collectives' output, without
/// its annotations, each `sharding_constraint` (a reshard between two names of one placement)
/// replaced by its operand and each collective over the one device by its operand
/// (`combine::drop_single_device_collectives`), in every region body too. Returns that program
/// and each output's sharding, its annotation (where insert_collectives settled it, as on a
/// larger mesh). `per_device` and `combine` reach the same program: local shapes are global
/// on one device, and `combine` drops the same collectives. Takes `g` by value: the program
/// is `g` itself, changed in place.
pub fn on_one_device(mut g: Graph) -> Result<(Graph, Vec<Spec>), ShardError> {
    const PASS: &str = "one_device";
    let mesh = mesh_of(&g, PASS)?.clone();
    if mesh.device_count() != 1 {
        return Err(ShardError::Invalid(format!(
            "{PASS}: the mesh has {} devices; the pass is for a mesh of one",
            mesh.device_count()
        )));
    }
    let out_specs = g
        .outputs()
        .iter()
        .map(|&o| annotation(&g, o, PASS, "insert_collectives"))
        .collect::<Result<Vec<Spec>, ShardError>>()?;
    g.name = format!("{}_per_device", g.name);
    unannotate(&mut g, &mesh)?;
    crate::combine::drop_single_device_collectives(&mut g)?;
    Ok((g, out_specs))
}

/// `on_one_device` on `g` and its region bodies: every annotation checked against `mesh` and
/// dropped (with the note of why it was chosen), every `sharding_constraint` replaced by its
/// operand.
fn unannotate(g: &mut Graph, mesh: &Mesh) -> Result<(), ShardError> {
    const PASS: &str = "one_device";
    g.mesh = Some(mesh.clone());
    for id in order(g, PASS)? {
        if let Op::Region(r) = &mut g.node_mut(id).op {
            for body in r.regions_mut() {
                unannotate(body, mesh)?;
            }
            // A token, not annotated: its results are.
            continue;
        }
        let spec = annotation(g, id, PASS, "insert_collectives")?;
        check_spec(mesh, g.ty(id), &spec)
            .map_err(|e| ShardError::Invalid(format!("{PASS}: {}: {e}", g.op(id).name())))?;
        let node = g.node_mut(id);
        node.sharding = None;
        node.why = None;
        if let Op::ShardingConstraint(_) = g.op(id) {
            let operand = g.operands(id)[0];
            g.replace_all_uses(id, operand);
            g.remove(id);
        }
    }
    Ok(())
}

/// A region node's per-device op: each slot (`region.rs`) must be sharded alike wherever it
/// appears (operands, body parameters and outputs; a stacked slot's leading dim whole, what
/// `insert_collectives` guarantees); each body partitioned recursively. Returns the op and
/// where each of its results is.
fn region(
    g: &Graph,
    mesh: &Mesh,
    id: NodeId,
    r: &RegionOp,
    specs: &HashMap<NodeId, Spec>,
) -> Result<(RegionOp, Vec<Spec>), ShardError> {
    let operands = g.operands(id);
    let slots = region::slots(r, operands.len());
    let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
    let whole = |rank: usize| vec![Vec::new(); rank];
    // Where each operand and body value must be: whole unless its slot says otherwise.
    let mut want_operands: Vec<Spec> = operands.iter().map(|&o| whole(g.ty(o).rank())).collect();
    let mut want_params: Vec<Vec<Spec>> = bodies
        .iter()
        .map(|b| b.params().iter().map(|&q| whole(b.ty(q).rank())).collect())
        .collect();
    let mut want_outputs: Vec<Vec<Spec>> = bodies
        .iter()
        .map(|b| b.outputs().iter().map(|&q| whole(b.ty(q).rank())).collect())
        .collect();
    let result_types = g.result_types(id).map_err(|error| ShardError::Type {
        op: r.name().into(),
        error,
    })?;
    let mut results: Vec<Spec> = result_types.iter().map(|t| whole(t.rank())).collect();
    for s in &slots {
        let (b, v) = match (s.params.first(), s.outputs.first()) {
            (Some(&(b, q)), _) => (b, bodies[b].params()[q]),
            (None, Some(&(b, j))) => (b, bodies[b].outputs()[j]),
            (None, None) => continue,
        };
        let spec = annotation(bodies[b], v, PASS, "insert_collectives")?;
        if let Some(k) = s.operand {
            want_operands[k] = region::stack(s, &spec);
        }
        if let Some(i) = s.result {
            results[i] = region::stack(s, &spec);
        }
        for &(b, q) in &s.params {
            want_params[b][q] = spec.clone();
        }
        for &(b, j) in &s.outputs {
            want_outputs[b][j] = spec.clone();
        }
    }
    let mismatch = |what: String, have: &Spec, want: &Spec| {
        ShardError::Invalid(format!(
            "{PASS}: {what} of the {} is sharded {} but its slot is {}; run insert_collectives \
             first",
            r.name(),
            spec_text(have),
            spec_text(want)
        ))
    };
    for (k, &o) in operands.iter().enumerate() {
        if specs[&o] != want_operands[k] {
            return Err(mismatch(
                format!("operand {k}"),
                &specs[&o],
                &want_operands[k],
            ));
        }
    }
    let mut local = r.clone();
    let labels: Vec<&str> = r.regions().iter().map(|(l, _)| *l).collect();
    for (b, lb) in local.regions_mut().into_iter().enumerate() {
        let body = bodies[b];
        for (q, &param) in body.params().iter().enumerate() {
            let have = annotation(body, param, PASS, "insert_collectives")?;
            if have != want_params[b][q] {
                let what = format!("{} parameter {q}", labels[b]);
                return Err(mismatch(what, &have, &want_params[b][q]));
            }
        }
        for (j, &out) in body.outputs().iter().enumerate() {
            let have = annotation(body, out, PASS, "insert_collectives")?;
            if have != want_outputs[b][j] {
                let what = format!("{} output {j}", labels[b]);
                return Err(mismatch(what, &have, &want_outputs[b][j]));
            }
        }
        *lb = per_device_graph(body, mesh, labels[b].to_string())?;
    }
    Ok((local, results))
}

/// The error for a partial result used before an `all_reduce` completes it.
fn incomplete(
    g: &Graph,
    id: NodeId,
    partial: &HashMap<NodeId, (ReduceKind, Vec<String>)>,
) -> ShardError {
    let (kind, axes) = &partial[&id];
    ShardError::Invalid(format!(
        "{PASS}: the {} : {} is partial ({kind:?} over {axes:?}) and is used or returned \
         before an all_reduce completes it",
        g.op(id).name(),
        g.ty(id)
    ))
}

/// Checks that an op's shardings are what its factor rule makes of them (what
/// `insert_collectives` guarantees); returns the axes its result is partial over, if any.
fn check_op(
    g: &Graph,
    mesh: &Mesh,
    id: NodeId,
    operands: &[&Spec],
    result: &Spec,
) -> Result<Option<(ReduceKind, Vec<String>)>, ShardError> {
    let rule = rule_of(g, id);
    let a = settle(g, mesh, &rule, id, operands, result);
    let mismatch = |what: String, have: &Spec, want: Spec| {
        ShardError::Invalid(format!(
            "{PASS}: {what} of the {} : {} is sharded {} but its factor rule makes it {}; \
             run insert_collectives first",
            g.op(id).name(),
            g.ty(id),
            spec_text(have),
            spec_text(&want)
        ))
    };
    for (k, have) in operands.iter().enumerate() {
        let want = project(mesh, &rule, rule.dims_of(Some(k)), &a.axes);
        if **have != want {
            return Err(mismatch(format!("operand {k}"), have, want));
        }
    }
    let want = project(mesh, &rule, rule.dims_of(None), &a.axes);
    if *result != want {
        return Err(mismatch("the result".into(), result, want));
    }
    Ok(rule.partial(&a.axes).filter(|(_, axes)| !axes.is_empty()))
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
        Op::GetResult { index, .. } => Op::GetResult {
            index: *index,
            ty: lty,
        },
        // Only splats are ever split (`factors.rs`); other constants are whole.
        Op::Constant(lit) => {
            if lit.data.is_splat() && !lit.data.is_empty() {
                Op::Constant(Literal::splat(&lty, lit.data.get_f64(0)))
            } else {
                op.clone()
            }
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
        // No shape in the attributes (a padded or concatenated dim is whole; reductions, dots
        // and collectives name dims and axes, not sizes).
        Op::Parameter(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::Bitcast(_)
        | Op::Transpose(_)
        | Op::Concatenate { .. }
        | Op::Pad { .. }
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::DotGeneral(_)
        | Op::Collective(_)
        | Op::ShardingConstraint(_)
        | Op::StopGradient
        // `per_device` makes its bodies local (`region`); `length` stays global, as a scan's
        // leading dim is whole.
        | Op::Region(_)
        // Only whole spatial dims and pass-through windows split (`factors.rs`): the
        // attributes hold no sizes.
        | Op::Conv(_)
        | Op::ReduceWindow { .. } => op.clone(),
        | Op::Scatter(_) => op.clone(),
        // A split offset dim is a window the slice takes whole: its local size.
        Op::Gather(d) => {
            let window = (0..d.slice_sizes.len()).filter(|o| {
                !d.collapsed_slice_dims.contains(o) && !d.operand_batching_dims.contains(o)
            });
            let mut local = d.clone();
            for (&i, o) in d.offset_dims.iter().zip(window) {
                if !out[i].is_empty() {
                    local.slice_sizes[o] = lty.dims()[i];
                }
            }
            Op::Gather(local)
        }
        // The sorted, scanned and reversed dims are whole (`factors.rs`); dims are named.
        | Op::Sort { .. }
        | Op::Cumulative { .. }
        | Op::Rev { .. } => op.clone(),
    }
}

impl Partitioner<'_> {
    fn add(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShardError> {
        let name = op.name().to_string();
        self.lg
            .add(op, args)
            .map_err(|error| ShardError::Type { op: name, error })
    }

    /// Completes a local partial value `v` (sharded `from`) over `axes`: an `all_reduce`, or,
    /// where `to` splits a dim `from` leaves whole over some of those axes, an `all_reduce` over
    /// the others and a `reduce_scatter` over them.
    /// Both carry the all_reduce's location `loc`.
    fn complete(
        &mut self,
        v: NodeId,
        (kind, axes): (ReduceKind, &[String]),
        (from, to): (&Spec, &Spec),
        loc: Option<String>,
    ) -> Result<NodeId, ShardError> {
        let changed: Vec<usize> = (0..to.len()).filter(|&d| from[d] != to[d]).collect();
        let scatter = match changed[..] {
            [] => None,
            [dim]
                if from[dim].is_empty()
                    && to[dim].iter().all(|a| axes.contains(a))
                    && to[dim]
                        .iter()
                        .all(|a| !from.iter().flatten().any(|b| b == a)) =>
            {
                Some((dim, to[dim].clone()))
            }
            _ => {
                return Err(ShardError::Invalid(format!(
                    "{PASS}: all_reduce over {axes:?} from {} to {}: only one dim, whole before, \
                     may be split after, over some of the reduced axes",
                    spec_text(from),
                    spec_text(to)
                )));
            }
        };
        let mut rest = axes.to_vec();
        if let Some((_, w)) = &scatter {
            rest.retain(|a| !w.contains(a));
        }
        let mut n = v;
        if !rest.is_empty() {
            n = self.add(
                Op::Collective(CollectiveOp::AllReduce { kind, axes: rest }),
                &[n],
            )?;
            self.lg.node_mut(n).loc = loc.clone();
        }
        if let Some((dim, w)) = scatter {
            n = self.add(
                Op::Collective(CollectiveOp::ReduceScatter { kind, dim, axes: w }),
                &[n],
            )?;
            self.lg.node_mut(n).loc = loc;
        }
        Ok(n)
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
        let n = self.mesh.group_size(axes);
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
