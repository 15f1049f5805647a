//! Collective insertion: the communication the shardings need, made explicit.
//!
//! Consumes the output of `propagate`: a global graph on a mesh, every node annotated with where
//! propagation wants it. Produces a global graph (same global types) in which every node's
//! annotation is where the value actually is, every op's operands arrive in the shardings its
//! factor rule wants, and all communication is a node of its own:
//! - a reshard is a `sharding_constraint` whose operand is annotated elsewhere (the next pass
//!   lowers it to `all_to_all`, `all_gather` and local slices by `axis_index`); a splat or a
//!   broadcast is rather built again in the wanted sharding (no communication);
//! - a sharded reduction factor leaves each device a partial result, which an `all_reduce` over
//!   those axes completes. Where the result is wanted split over some of them, the all_reduce's
//!   annotation splits that dim: a `reduce_scatter`, as the next pass lowers it.
//!
//! So the program still means what it meant globally (read as one device, a reshard and an
//! all-reduce are the identity), and the next pass (`partition::per_device`) decides nothing:
//! it only makes shapes local and lowers the reshards.
//!
//! One forward walk: each op's factor rule (`factors.rs`) reads where its operands are and where
//! propagation wants its result, settles its factors (`propagate::resolve`, the larger tensor
//! winning a conflict), and from them the sharding it wants its operands in, its result's, and
//! its reduction factors' axes. Each conflict and reshard is noted in the location comment of
//! the op in the annotated copy of the input (the `02-sharded` dump).

use std::collections::HashMap;

use tessera_ir::{CollectiveOp, Graph, Mesh, NodeId, Op, ReduceKind, RegionOp, Sharding};

use crate::factors::rule_of;
use crate::propagate::{project, settle};
use crate::region::{self, Settling, slot_type};
use crate::spec::{ShardError, Spec, annotation, check_spec, mesh_of, order, spec_text};

const PASS: &str = "insert_collectives";

/// What the pass makes of its input.
pub struct Inserted {
    /// The program with its communication explicit (the pass's output).
    pub explicit: Graph,
    /// The input graph, each value annotated where it actually is, each op's location comment
    /// noting its conflicts and reshards.
    pub annotated: Graph,
}

/// The pass (see the module doc).
pub fn insert_collectives(g: &Graph) -> Result<Graph, ShardError> {
    Ok(insert(g)?.explicit)
}

/// The pass, also returning the annotated copy of its input with the conflicts and reshards
/// noted (the readable global program the pipeline shows as the stage `sharded`).
pub fn insert_annotated(g: &Graph) -> Result<Inserted, ShardError> {
    insert(g)
}

/// The pass on a program whose every value is annotated with its type (an Explicit mesh,
/// `explicit::type_graph`): as `insert_annotated`, and each output resharded to its annotation
/// where it ends up elsewhere.
pub fn insert_keeping_outputs(g: &Graph) -> Result<Inserted, ShardError> {
    let mesh = mesh_of(g, PASS)?;
    let outs = crate::explicit::output_specs(g);
    insert_graph(g, mesh, None, Some(&outs))
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

struct Inserter<'a> {
    g: &'a Graph,
    mesh: &'a Mesh,
    x: Graph,
    /// For each node of the input, the node of the output that holds its value, and where.
    at: HashMap<NodeId, (NodeId, Spec)>,
    /// For each region node of the input, where each of its results is.
    results: HashMap<NodeId, Vec<Spec>>,
}

pub(crate) fn insert(g: &Graph) -> Result<Inserted, ShardError> {
    let mesh = mesh_of(g, PASS)?;
    insert_graph(g, mesh, None, None)
}

/// The pass on `g` (the whole program, or a region's body). For a body, `params` are the
/// shardings its parameters are in (its region's slots, `region.rs`) and `outs` the shardings
/// its outputs must leave in; the program's outputs leave where they are.
fn insert_graph(
    g: &Graph,
    mesh: &Mesh,
    params: Option<&[Spec]>,
    outs: Option<&[Spec]>,
) -> Result<Inserted, ShardError> {
    let order = order(g, PASS)?;
    let mut wanted: HashMap<NodeId, Spec> = HashMap::new();
    for id in g.node_ids() {
        if let Op::Region(_) = g.op(id) {
            // A token, not annotated: its results are.
            continue;
        }
        let spec = annotation(g, id, PASS, "propagate")?;
        check_spec(mesh, g.ty(id), &spec)
            .map_err(|e| ShardError::Invalid(format!("{PASS}: {}: {e}", g.op(id).name())))?;
        wanted.insert(id, spec);
    }
    if let Some(ps) = params {
        for (&param, spec) in g.params().iter().zip(ps) {
            wanted.insert(param, spec.clone());
        }
    }
    if let Some(id) = g.node_ids().find(|&id| g.op(id).is_collective()) {
        return Err(ShardError::Invalid(format!(
            "{PASS}: the input holds {}; collectives are this pass's output",
            g.op(id).name()
        )));
    }
    let mut annotated = g.clone();
    let mut p = Inserter {
        g,
        mesh,
        x: Graph::with_capacity(g.name.clone(), g.node_count() + g.node_count() / 4),
        at: HashMap::new(),
        results: HashMap::new(),
    };
    p.x.mesh = Some(mesh.clone());
    annotated.mesh = Some(mesh.clone());
    for &param in g.params() {
        let l = p.x.add_param(g.ty(param).clone());
        p.x.node_mut(l).loc = g.node(param).loc.clone();
        p.x.node_mut(l).sharding = Some(Sharding::closed(mesh, &wanted[&param]));
        annotated.node_mut(param).sharding = Some(Sharding::closed(mesh, &wanted[&param]));
        p.at.insert(param, (l, wanted[&param].clone()));
    }
    for id in order {
        let op = g.op(id).clone();
        let operands = g.operands(id);
        let why = match &op {
            Op::Parameter(_) => continue,
            Op::Region(r) => p.region(id, r, &wanted, &mut annotated)?,
            Op::GetResult { index, .. } => {
                // The region's result is where its slot is.
                let region = operands[0];
                let spec = p.results[&region][*index].clone();
                let n = p.add(op.clone(), &[p.at[&region].0], &spec)?;
                p.x.node_mut(n).loc = g.node(id).loc.clone();
                annotated.node_mut(id).sharding = Some(Sharding::closed(mesh, &spec));
                p.at.insert(id, (n, spec));
                Vec::new()
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
            | Op::Collective(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => p.op(id, op, &wanted, &mut annotated)?,
        };
        // The dump says where communication was inserted and why.
        if !why.is_empty() {
            note(&mut annotated, id, &why);
        }
    }
    let mut xouts = Vec::new();
    for (j, o) in g.outputs().iter().enumerate() {
        let n = match outs.map(|w| &w[j]) {
            Some(want) => {
                let mut why = Vec::new();
                let n = p.moved(*o, want, || format!("output {j}"), &mut why)?;
                if !why.is_empty() {
                    note(&mut annotated, *o, &why);
                }
                n
            }
            None => p.at[o].0,
        };
        xouts.push(n);
    }
    p.x.set_outputs(xouts);
    // Values built again in another sharding may leave their first version unused.
    p.x.remove_dead();
    Ok(Inserted {
        explicit: p.x,
        annotated,
    })
}

/// Appends `why` to the location comment of node `id` of the annotated copy.
fn note(annotated: &mut Graph, id: NodeId, why: &[String]) {
    let name = annotated.op(id).name();
    let node = annotated.node_mut(id);
    let base = node.loc.clone().unwrap_or_default();
    node.loc = Some(
        format!("{base} [{name}: {}]", why.join("; "))
            .trim()
            .to_string(),
    );
}

impl Inserter<'_> {
    /// An op other than a region's: its operands moved where its factor rule wants them, and
    /// an `all_reduce` after it where its result is partial. Returns the dump's notes.
    fn op(
        &mut self,
        id: NodeId,
        op: Op,
        wanted: &HashMap<NodeId, Spec>,
        annotated: &mut Graph,
    ) -> Result<Vec<String>, ShardError> {
        let (g, mesh) = (self.g, self.mesh);
        let operands = g.operands(id);
        let d = {
            let specs: Vec<&Spec> = operands.iter().map(|o| &self.at[o].1).collect();
            self.decide(id, &op, &specs, &wanted[&id])
        };
        let mut args = Vec::new();
        let mut why = d.conflicts;
        for (k, &o) in operands.iter().enumerate() {
            args.push(self.moved(o, &d.want[k], || format!("operand {k}"), &mut why)?);
        }
        // A sharding constraint has done its work once its operand is resharded.
        if let Op::ShardingConstraint(_) = op {
            annotated.node_mut(id).sharding = Some(Sharding::closed(mesh, &d.out));
            self.at.insert(id, (args[0], d.out));
            return Ok(why);
        }
        let mut out = d.out;
        let mut n = self.add(op, &args, &out)?;
        self.x.node_mut(n).loc = g.node(id).loc.clone();
        if let Some((kind, axes)) = d.partial.filter(|(_, a)| !a.is_empty()) {
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
            if let Some((dim, w)) = scatter {
                out[dim] = w;
            }
            n = self.add(
                Op::Collective(CollectiveOp::AllReduce { kind, axes }),
                &[n],
                &out,
            )?;
            self.x.node_mut(n).loc = g.node(id).loc.clone();
        }
        annotated.node_mut(id).sharding = Some(Sharding::closed(mesh, &out));
        self.at.insert(id, (n, out));
        Ok(why)
    }

    /// The value of input node `o` in the sharding `want`: as it is, built again (`rebuild`),
    /// or resharded by a `sharding_constraint` (noted in `why` as `what` resharded).
    fn moved(
        &mut self,
        o: NodeId,
        want: &Spec,
        what: impl FnOnce() -> String,
        why: &mut Vec<String>,
    ) -> Result<NodeId, ShardError> {
        Ok(match self.rebuild(o, want)? {
            Some(n) => n,
            None if self.at[&o].1 == *want => self.at[&o].0,
            None => {
                let (xnode, spec) = &self.at[&o];
                let xnode = *xnode;
                why.push(format!(
                    "{} resharded {} -> {}",
                    what(),
                    spec_text(spec),
                    spec_text(want)
                ));
                self.add(
                    Op::ShardingConstraint(Sharding::closed(self.mesh, want)),
                    &[xnode],
                    want,
                )?
            }
        })
    }

    /// A region op: each slot's sharding (`region.rs`) read from its body parameters'
    /// annotations (a slot with none, a result only, from the result's and the body outputs'
    /// annotations); the operands moved into their slots; each body inserted recursively, its
    /// parameters in their slots and its outputs moved into theirs; the results where their
    /// slots are. Returns the dump's notes.
    fn region(
        &mut self,
        id: NodeId,
        r: &RegionOp,
        wanted: &HashMap<NodeId, Spec>,
        annotated: &mut Graph,
    ) -> Result<Vec<String>, ShardError> {
        let (g, mesh) = (self.g, self.mesh);
        let operands = g.operands(id);
        let slots = region::slots(r, operands.len());
        let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
        let mut slot_specs = Vec::new();
        for s in &slots {
            let spec = match s.params.first() {
                Some(&(b, p)) => annotation(bodies[b], bodies[b].params()[p], PASS, "propagate")?,
                None => {
                    let (b, j) = s.outputs[0];
                    let rank = bodies[b].ty(bodies[b].outputs()[j]).rank();
                    let mut st = Settling::whole(rank);
                    for u in g.users(id) {
                        if let Op::GetResult { index, .. } = g.op(u)
                            && s.result == Some(*index)
                        {
                            st.merge(mesh, &region::unstack(s, &wanted[&u]));
                        }
                    }
                    for &(b, j) in &s.outputs {
                        let out = bodies[b].outputs()[j];
                        st.merge(mesh, &annotation(bodies[b], out, PASS, "propagate")?);
                    }
                    st.spec
                }
            };
            check_spec(mesh, slot_type(&bodies, s), &spec).map_err(|e| {
                ShardError::Invalid(format!("{PASS}: a {} body's value: {e}", r.name()))
            })?;
            slot_specs.push(spec);
        }
        let whole = |rank: usize| vec![Vec::new(); rank];
        let mut want: Vec<Spec> = operands.iter().map(|&o| whole(g.ty(o).rank())).collect();
        let mut param_specs: Vec<Vec<Spec>> = bodies
            .iter()
            .map(|b| b.params().iter().map(|&q| whole(b.ty(q).rank())).collect())
            .collect();
        let mut out_specs: Vec<Vec<Spec>> = bodies
            .iter()
            .map(|b| b.outputs().iter().map(|&q| whole(b.ty(q).rank())).collect())
            .collect();
        let n_results = g.result_types(id).map_err(|error| ShardError::Type {
            op: r.name().into(),
            error,
        })?;
        let mut results: Vec<Spec> = n_results.iter().map(|t| whole(t.rank())).collect();
        for (s, spec) in slots.iter().zip(&slot_specs) {
            if let Some(k) = s.operand {
                want[k] = region::stack(s, spec);
            }
            if let Some(i) = s.result {
                results[i] = region::stack(s, spec);
            }
            for &(b, q) in &s.params {
                param_specs[b][q] = spec.clone();
            }
            for &(b, j) in &s.outputs {
                out_specs[b][j] = spec.clone();
            }
        }
        let mut why = Vec::new();
        let mut args = Vec::new();
        for (k, &o) in operands.iter().enumerate() {
            args.push(self.moved(o, &want[k], || format!("operand {k}"), &mut why)?);
        }
        let mut explicit = r.clone();
        let mut noted = r.clone();
        for (b, (xb, nb)) in explicit
            .regions_mut()
            .into_iter()
            .zip(noted.regions_mut())
            .enumerate()
        {
            let inner = insert_graph(bodies[b], mesh, Some(&param_specs[b]), Some(&out_specs[b]))?;
            *xb = inner.explicit;
            *nb = inner.annotated;
        }
        let token = whole(1);
        let n = self.add(Op::Region(Box::new(explicit)), &args, &token)?;
        // A token holds no data: only its results are annotated.
        self.x.node_mut(n).sharding = None;
        self.x.node_mut(n).loc = g.node(id).loc.clone();
        annotated.node_mut(id).op = Op::Region(Box::new(noted));
        self.results.insert(id, results);
        self.at.insert(id, (n, token));
        Ok(why)
    }

    /// The op's decision from its factor rule: operands where they are, the result where
    /// propagation wants it; a sharding constraint simply wants its operand in its sharding.
    fn decide(&self, id: NodeId, op: &Op, specs: &[&Spec], wanted: &Spec) -> Decision {
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
        let a = settle(g, self.mesh, &rule, id, specs, wanted);
        Decision {
            want: (0..specs.len())
                .map(|k| project(self.mesh, &rule, rule.dims_of(Some(k)), &a.axes))
                .collect(),
            out: project(self.mesh, &rule, rule.dims_of(None), &a.axes),
            partial: rule.partial(&a.axes),
            conflicts: a.conflicts,
        }
    }

    /// Adds `op` to the output, annotated `spec`.
    fn add(&mut self, op: Op, args: &[NodeId], spec: &Spec) -> Result<NodeId, ShardError> {
        let name = op.name();
        let n = self.x.add(op, args).map_err(|error| ShardError::Type {
            op: name.to_string(),
            error,
        })?;
        self.x.node_mut(n).sharding = Some(Sharding::closed(self.mesh, spec));
        Ok(n)
    }

    /// A value that costs nothing to compute (a splat constant, or a broadcast of a value whose
    /// carried dims already agree) is computed again directly in the sharding `to` instead of
    /// being resharded: this is what lets `bias + x` with `x` split over `dp` broadcast the bias
    /// straight into the local shape, with no communication.
    fn rebuild(&mut self, o: NodeId, to: &Spec) -> Result<Option<NodeId>, ShardError> {
        let g = self.g;
        if self.at[&o].1 == *to {
            return Ok(None);
        }
        if let Op::Constant(lit) = g.op(o)
            && lit.data.is_splat()
            && !lit.data.is_empty()
        {
            return Ok(Some(self.add(Op::Constant(lit.clone()), &[], to)?));
        }
        if let Op::BroadcastInDim { shape, dims } = g.op(o) {
            let src = g.operands(o)[0];
            let (xsrc, sspec) = self.at[&src].clone();
            let from = g.ty(src);
            let carried_ok = dims.iter().enumerate().all(|(i, &d)| {
                if from.dims()[i] == shape.dims()[d] {
                    sspec[i] == to[d]
                } else {
                    sspec[i].is_empty()
                }
            });
            if carried_ok {
                let op = Op::BroadcastInDim {
                    shape: shape.clone(),
                    dims: dims.clone(),
                };
                return Ok(Some(self.add(op, &[xsrc], to)?));
            }
        }
        Ok(None)
    }
}
