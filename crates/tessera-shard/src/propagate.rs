//! Sharding propagation to a fixed point, forward and backward, in the manner of Shardy.
//!
//! Consumes a global graph (no collectives) and a spec for each parameter; produces the same
//! graph on the mesh with every node's sharding annotated: where propagation wants each value.
//! It inserts no communication: where an op's operands disagree with what it wants, the next
//! pass (`insert_collectives`) reshards them.
//!
//! The user's shardings come first: parameters' shardings and `sharding_constraint` results are
//! fixed ("closed"); every other value starts unsharded and open. Each op, through its factor
//! rule (`factors.rs`), reads its operands' and result's shardings as shardings of its factors,
//! settles them (`resolve`), and writes them back to every open tensor it touches: forward to
//! its result and backward to its operands. A dim only ever goes from whole to split, so the
//! walk ends. Ops go by priority, as Shardy's op-priority propagation does: first only the ops
//! that move dims without communication (elementwise, broadcast, reshape, transpose, slice,
//! pad, concatenate) until nothing changes, then also dots and reductions, again until nothing
//! changes. So a sharding flows along elementwise chains before a dot or a reduction gets to
//! decide what the chain's values should be.
//!
//! A region op (loop, branch, call) is not an op with factors: its operands, results, body
//! parameters and body outputs form slots (`region.rs`), each one value that keeps one
//! sharding. A region's turn starts each slot from its operand's and result's shardings,
//! propagates each body as a function of its own (this pass, recursively) from its slots, and
//! lets each slot take what its parameters and outputs became, until no slot changes: a carried
//! value then has one sharding across iterations (where members disagree, the slot keeps the
//! axes they share). The slots flow back to the open operands and to the results.
//!
//! Where tensors disagree on a factor, the sharding of the larger tensor wins (the smaller one
//! is resharded, which moves fewer bytes); between tensors of one size, the first operand wins,
//! and operands win over the result. `insert_collectives` records each conflict in the dump.

use std::collections::HashMap;

use tessera_ir::{Graph, Mesh, NodeId, Op, OpClass, RegionOp, Sharding};

use crate::factors::{FactorKind, FactorRule, rule_of};
use crate::region::{self, Settling, Slot, slot_type};
use crate::spec::{ShardError, Spec, axes_text, check_spec};

/// How an op's factors are split, as settled from its tensors' shardings.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The mesh axes of each factor (empty: whole).
    pub axes: Vec<Vec<String>>,
    /// What lost where tensors disagreed, for the dump.
    pub conflicts: Vec<String>,
}

/// One tensor of an op, as `resolve` sees it.
pub struct View<'a> {
    /// `Some(k)` for operand `k`, `None` for the result.
    pub tensor: Option<usize>,
    pub spec: &'a Spec,
    /// Its element count, to settle conflicts.
    pub elems: usize,
}

fn label(tensor: Option<usize>) -> String {
    match tensor {
        Some(k) => format!("operand {k}"),
        None => "the result".to_string(),
    }
}

/// The factors of one dim sharded over `axes`, each with its run of them, given to `take`:
/// the major factor takes axes (major first) until it is split completely, then the next one
/// does; an axis that does not divide what is left of its factor ends the walk (the minor
/// axes stay unassigned).
fn dim_to_factors<'s>(
    mesh: &Mesh,
    rule: &FactorRule,
    factors: &[usize],
    axes: &'s [String],
    mut take: impl FnMut(usize, &'s [String]),
) {
    let mut next = 0;
    for &f in factors {
        if next == axes.len() {
            break;
        }
        let (start, mut prod) = (next, 1);
        while prod < rule.sizes[f] && next < axes.len() {
            let size = mesh.axis_size(&axes[next]).unwrap_or(1);
            if !rule.sizes[f].is_multiple_of(prod * size) {
                break;
            }
            prod *= size;
            next += 1;
        }
        if next > start {
            take(f, &axes[start..next]);
        }
        if prod < rule.sizes[f] {
            break;
        }
    }
}

/// The sharding of a tensor whose dims are made of `dims` factors, under an assignment: each
/// dim takes its factors' axes major first, as long as each factor before is split completely
/// (a dim cannot be split over a minor factor while its major factor is whole).
pub fn project(mesh: &Mesh, rule: &FactorRule, dims: &[Vec<usize>], axes: &[Vec<String>]) -> Spec {
    dims.iter()
        .map(|fs| project_dim(mesh, rule, fs, axes))
        .collect()
}

/// `project` of one dim made of the factors `fs`.
fn project_dim(mesh: &Mesh, rule: &FactorRule, fs: &[usize], axes: &[Vec<String>]) -> Vec<String> {
    let mut d = Vec::new();
    for &f in fs {
        d.extend(axes[f].iter().cloned());
        if mesh.group_size(&axes[f]) != rule.sizes[f] {
            break;
        }
    }
    d
}

/// Settles the sharding of each factor from the tensors' shardings: proposals from larger
/// tensors first; a factor that needs replication is never split; a mesh axis splits one
/// factor at most.
pub fn resolve(mesh: &Mesh, rule: &FactorRule, views: &[View]) -> Assignment {
    struct Proposal<'s> {
        factor: usize,
        /// A run of one tensor's spec (borrowed: only the winners' are copied).
        axes: &'s [String],
        elems: usize,
        order: usize,
        /// Which tensor, which dim: for messages.
        at: (Option<usize>, usize),
    }
    let mut proposals = Vec::new();
    for (order, v) in views.iter().enumerate() {
        for (d, factors) in rule.dims_of(v.tensor).iter().enumerate() {
            dim_to_factors(mesh, rule, factors, &v.spec[d], |factor, axes| {
                proposals.push(Proposal {
                    factor,
                    axes,
                    elems: v.elems,
                    order,
                    at: (v.tensor, d),
                })
            });
        }
    }
    proposals.sort_by_key(|p| (std::cmp::Reverse(p.elems), p.order));
    let where_ = |(t, d): (Option<usize>, usize)| format!("dim {d} of {}", label(t));
    let mut axes: Vec<Vec<String>> = vec![Vec::new(); rule.sizes.len()];
    let mut winner: Vec<Option<&Proposal>> = vec![None; rule.sizes.len()];
    let mut owner: Vec<(&str, &Proposal)> = Vec::new();
    let mut conflicts = Vec::new();
    for p in &proposals {
        if rule.kinds[p.factor] == FactorKind::NeedReplication {
            continue;
        }
        if let Some(w) = winner[p.factor] {
            if w.axes != p.axes {
                let why = if w.elems > p.elems {
                    format!("the larger tensor wins ({} elements)", w.elems)
                } else {
                    "same size: the first wins".to_string()
                };
                conflicts.push(format!(
                    "{} split over {} conflicts with {} split over {}; {why}",
                    where_(p.at),
                    axes_text(p.axes),
                    where_(w.at),
                    axes_text(w.axes),
                ));
            }
        } else if let Some((a, o)) = owner.iter().find(|(a, _)| p.axes.iter().any(|b| b == a)) {
            conflicts.push(format!(
                "{} split over {} conflicts with {} split over {}: \"{a}\" splits one dim only",
                where_(p.at),
                axes_text(p.axes),
                where_(o.at),
                axes_text(o.axes),
            ));
        } else {
            owner.extend(p.axes.iter().map(|a| (a.as_str(), p)));
            axes[p.factor] = p.axes.to_vec();
            winner[p.factor] = Some(p);
        }
    }
    // A dim split over a minor factor while a factor before it is not split completely would
    // be strided: such a factor stays whole in every tensor.
    loop {
        let mut changed = false;
        for dims in rule.operands.iter().chain([&rule.result]) {
            for fs in dims {
                let mut partial = false;
                for &f in fs {
                    if partial && !axes[f].is_empty() {
                        axes[f].clear();
                        changed = true;
                    }
                    partial |= mesh.group_size(&axes[f]) != rule.sizes[f];
                }
            }
        }
        if !changed {
            break;
        }
    }
    Assignment { axes, conflicts }
}

/// `resolve` for node `id` of `g`, its operands sharded `operands` and its result `result`.
pub fn settle(
    g: &Graph,
    mesh: &Mesh,
    rule: &FactorRule,
    id: NodeId,
    operands: &[&Spec],
    result: &Spec,
) -> Assignment {
    settle_on(g, mesh, rule, id, &g.operands(id), operands, result)
}

/// `settle` with `id`'s operands given (`g.operands(id)`, which allocates, found once).
fn settle_on(
    g: &Graph,
    mesh: &Mesh,
    rule: &FactorRule,
    id: NodeId,
    operand_ids: &[NodeId],
    operands: &[&Spec],
    result: &Spec,
) -> Assignment {
    let mut views: Vec<View> = operands
        .iter()
        .zip(operand_ids.iter().copied())
        .enumerate()
        .map(|(k, (spec, o))| View {
            tensor: Some(k),
            spec,
            elems: g.ty(o).numel(),
        })
        .collect();
    views.push(View {
        tensor: None,
        spec: result,
        elems: g.ty(id).numel(),
    });
    resolve(mesh, rule, &views)
}

/// Fills the whole dims of an open tensor from `new`, where the axes are not in use yet.
fn absorb(cur: &mut Spec, new: &Spec) -> bool {
    let mut changed = false;
    for d in 0..cur.len() {
        if cur[d].is_empty()
            && !new[d].is_empty()
            && new[d].iter().all(|a| !cur.iter().flatten().any(|b| b == a))
        {
            cur[d] = new[d].clone();
            changed = true;
        }
    }
    changed
}

/// 0: ops that move dims without communication; 1: dots and reductions; `None`: nothing to
/// propagate (no operands, or a collective, which the input may not hold).
fn priority(op: &Op) -> Option<u8> {
    if let Op::GetResult { .. } = op {
        // Written by its region's turn (`region_step`) and by its users'.
        return None;
    }
    match op.class() {
        OpClass::Parameter | OpClass::Constant | OpClass::Collective => None,
        OpClass::Reduction | OpClass::Dot => Some(1),
        OpClass::ElementwiseUnary
        | OpClass::ElementwiseBinary
        | OpClass::Select
        | OpClass::Movement
        | OpClass::Annotation
        | OpClass::Region => Some(0),
    }
}

/// Checks the pass's input: a spec per parameter that fits it, a well-formed graph, no
/// collectives. The input shardings are checked first, for their clearer message; their
/// parameters must exist for that, which the verifier checks next.
fn check_input(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<(), ShardError> {
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
    if let Some(name) = collective_in(g) {
        return Err(ShardError::Invalid(format!(
            "{name} written inside a sharded jit: collectives by axis name belong in pmap"
        )));
    }
    Ok(())
}

/// The name of a collective in `g` or in one of its bodies, if it holds one.
fn collective_in(g: &Graph) -> Option<&'static str> {
    g.topo_order().into_iter().find_map(|id| {
        let op = g.op(id);
        if let Op::Region(r) = op {
            r.regions().into_iter().find_map(|(_, b)| collective_in(b))
        } else {
            op.is_collective().then(|| op.name())
        }
    })
}

/// The pass: `g` on `mesh`, every node annotated with the sharding propagation wants for it,
/// from the parameters' `in_specs` and the program's sharding constraints (see the module doc).
/// Region bodies are annotated too: each is propagated as a function of its own, its
/// parameters sharded as the region's operands (`region.rs`).
pub fn propagate(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Graph, ShardError> {
    check_input(g, mesh, in_specs)?;
    let specs = fixed_point(g, mesh, in_specs, true)?;
    let mut annotated = g.clone();
    annotate(&mut annotated, mesh, &specs);
    Ok(annotated)
}

/// [`propagate`] on a graph the caller gives up: annotated in place, not copied (the pipeline,
/// whose passes own their input; the copy was a fifth of the pass's allocation time, perf).
pub fn propagate_owned(mut g: Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Graph, ShardError> {
    check_input(&g, mesh, in_specs)?;
    let specs = fixed_point(&g, mesh, in_specs, true)?;
    annotate(&mut g, mesh, &specs);
    Ok(g)
}

/// Every value's sharding in a graph and, for each region node, in each of its bodies.
#[derive(Clone, Debug, Default)]
struct Specs {
    of: HashMap<NodeId, Spec>,
    bodies: HashMap<NodeId, Vec<Specs>>,
    /// Why each value got its sharding: the user's annotation, or each propagation step that
    /// split one of its dims (and the conflict it settled), in order.
    why: HashMap<NodeId, Vec<String>>,
}

/// Writes `specs` into `g` and its bodies, all of them on `mesh`.
fn annotate(g: &mut Graph, mesh: &Mesh, specs: &Specs) {
    g.mesh = Some(mesh.clone());
    for (&id, spec) in &specs.of {
        // A region's own node is a token that holds no data: its results are annotated.
        if !matches!(g.op(id), Op::Region(_)) {
            g.node_mut(id).sharding = Some(Sharding::closed(mesh, spec));
            if let Some(why) = specs
                .why
                .get(&id)
                .filter(|_| !tessera_ir::sharding::is_replicated(spec))
            {
                g.node_mut(id).why = Some(why.join("; "));
            }
        }
    }
    for (&id, bodies) in &specs.bodies {
        if let Op::Region(r) = &mut g.node_mut(id).op {
            for (body, s) in r.regions_mut().into_iter().zip(bodies) {
                annotate(body, mesh, s);
            }
        }
    }
}

/// The sharding of every value of `g`, from the parameters' `params` (fixed when
/// `params_closed`; otherwise where they start, as a region body's parameters do) and the
/// program's sharding constraints.
fn fixed_point(
    g: &Graph,
    mesh: &Mesh,
    params: &[Spec],
    params_closed: bool,
) -> Result<Specs, ShardError> {
    let order = g.topo_order();
    let mut specs = Specs::default();
    let mut closed: Vec<NodeId> = Vec::new();
    // Values typed by the Explicit axes of a mixed mesh (`explicit::type_graph`) keep them.
    let typed = mesh.is_explicit();
    for &id in &order {
        // The user's shardings are closed; every other value starts whole.
        let spec = if let Op::Parameter(i) = g.op(id) {
            let why = if params_closed {
                closed.push(id);
                "the input's placement"
            } else {
                "the region's slot"
            };
            specs.why.insert(id, vec![why.to_string()]);
            params[*i].clone()
        } else if let Op::ShardingConstraint(s) = g.op(id) {
            let at = match &g.node(id).loc {
                Some(loc) => format!(" at {loc}"),
                None => String::new(),
            };
            if s.mesh != mesh.name {
                return Err(ShardError::Invalid(format!(
                    "sharding_constraint{at} names mesh @{} but the inputs live on @{}",
                    s.mesh, mesh.name
                )));
            }
            let spec: Spec = s.spec();
            check_spec(mesh, g.ty(id), &spec)
                .map_err(|e| ShardError::Invalid(format!("sharding_constraint{at}: {e}")))?;
            closed.push(id);
            specs
                .why
                .insert(id, vec!["the user's sharding_constraint".to_string()]);
            spec
        } else if let Some(s) = g.node(id).sharding.as_ref().filter(|_| typed) {
            // On a mesh that mixes axis types, a value starts from its Explicit type.
            specs
                .why
                .insert(id, vec![g.node(id).why.clone().unwrap_or_default()]);
            s.spec()
        } else {
            vec![Vec::new(); g.ty(id).rank()]
        };
        specs.of.insert(id, spec);
    }
    // Each node's factor rule and operands, found once for every visit of the loop below, by
    // node index.
    let mut rules: Vec<Option<(FactorRule, Vec<NodeId>)>> = vec![None; g.node_bound()];
    for &id in &order {
        if priority(g.op(id)).is_some() && !matches!(g.op(id), Op::Region(_)) {
            rules[id.index()] = Some((rule_of(g, id), g.operands(id)));
        }
    }
    let mut regions: HashMap<NodeId, Settled> = HashMap::new();
    let mut turns = Turns::new(g.node_bound());
    for level in 0..=1 {
        loop {
            let mut changed = false;
            for &id in order.iter().chain(order.iter().rev()) {
                if priority(g.op(id)).is_none_or(|p| p > level) {
                    continue;
                }
                changed |= if let Op::Region(r) = g.op(id) {
                    let c = region_step(g, mesh, r, id, &mut specs, &closed, &mut regions)?;
                    if c {
                        turns.region_changed();
                    }
                    c
                } else {
                    let (rule, operands) = rules[id.index()]
                        .as_ref()
                        .expect("every op with a priority but a region has a rule");
                    match turns.take(id, operands) {
                        Some(stamp) => step(
                            g,
                            mesh,
                            rule,
                            operands,
                            id,
                            &mut specs,
                            &closed,
                            level,
                            &mut turns.changed,
                            stamp,
                        ),
                        None => false,
                    }
                };
            }
            if !changed {
                break;
            }
        }
    }
    Ok(specs)
}

thread_local! {
    static TURNS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many op turns (`step`s) propagation has taken on this thread: for tests of the walk's
/// cost (a count, not a time).
#[doc(hidden)]
pub fn turns_taken() -> u64 {
    TURNS.with(std::cell::Cell::get)
}

/// When each value's sharding last changed and when each op last took its turn, on one clock.
/// An op's turn (`step`) is a function of its tensors' shardings that writes only what it
/// changes; so an op none of whose tensors changed since its last turn would change nothing,
/// and its turn is skipped. The walk visits the ops in the same order and every turn taken
/// sees the same shardings as without skipping, so the result is the same, in fewer turns
/// (the seed step: most of a walk's turns are the last sweeps', which change nothing).
struct Turns {
    /// Starts at 1: 0 in the tables below is "never".
    clock: u64,
    /// When each value's sharding last changed, by node index (0: never).
    changed: Vec<u64>,
    /// When each op last took its turn, by node index (0: never).
    took: Vec<u64>,
    /// When a region's turn last changed a value (its writes are not stamped one by one).
    region: u64,
}

impl Turns {
    /// Tables for the nodes of a graph whose indices are below `bound`
    /// (`StableGraph::node_bound`). Indexed tables, not maps: the walk asks them several times
    /// per visit (on the seed step the pass went from 92 to 84 us warm with them, a probe
    /// running it 3000 times).
    fn new(bound: usize) -> Turns {
        Turns {
            clock: 1,
            changed: vec![0; bound],
            took: vec![0; bound],
            region: 0,
        }
    }

    /// Whether op `id` (of `operands`) takes its turn now: `Some` of the stamp for what its
    /// turn changes (later than the turn, so its own writes bring it back), or `None` to skip.
    fn take(&mut self, id: NodeId, operands: &[NodeId]) -> Option<u64> {
        let took = self.took[id.index()];
        if took != 0 {
            let since = |n: &NodeId| self.changed[n.index()] > took;
            if self.region <= took && !operands.iter().chain([&id]).any(since) {
                return None;
            }
        }
        self.clock += 1;
        self.took[id.index()] = self.clock;
        self.clock += 1;
        TURNS.with(|t| t.set(t.get() + 1));
        Some(self.clock)
    }

    fn region_changed(&mut self) {
        self.clock += 1;
        self.region = self.clock;
    }
}

/// A region's slots settled from the outer shardings `from`, and its bodies' shardings.
#[derive(Clone)]
struct Settled {
    from: Vec<Settling>,
    slots: Vec<Settling>,
    bodies: Vec<Specs>,
}

/// A region's turn: its slots start from the outer values' shardings (operands and results);
/// the bodies are propagated with their parameters sharded as their slots, and each slot takes
/// what its parameters and outputs became (`Settling::merge`), until no slot changes (a
/// carry's sharding is then one across iterations); the slots are written back to the open
/// operands and to the results. Returns whether an outer value changed.
fn region_step(
    g: &Graph,
    mesh: &Mesh,
    r: &RegionOp,
    id: NodeId,
    specs: &mut Specs,
    closed: &[NodeId],
    cache: &mut HashMap<NodeId, Settled>,
) -> Result<bool, ShardError> {
    let operands = g.operands(id);
    let slots = region::slots(r, operands.len());
    let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
    let results: Vec<(usize, NodeId)> = g
        .users(id)
        .into_iter()
        .filter_map(|u| {
            if let Op::GetResult { index, .. } = g.op(u) {
                Some((*index, u))
            } else {
                None
            }
        })
        .collect();
    let mut from: Vec<Settling> = slots
        .iter()
        .map(|s| Settling::whole(slot_type(&bodies, s).rank()))
        .collect();
    for (s, st) in slots.iter().zip(from.iter_mut()) {
        if let Some(k) = s.operand {
            st.merge(mesh, &region::unstack(s, &specs.of[&operands[k]]));
        }
        for (i, n) in &results {
            if s.result == Some(*i) {
                st.merge(mesh, &region::unstack(s, &specs.of[n]));
            }
        }
    }
    let settled = match cache.get(&id) {
        Some(c) if c.from == from => c.clone(),
        _ => {
            let s = settle_region(mesh, &bodies, &slots, from)?;
            cache.insert(id, s.clone());
            s
        }
    };
    let mut changed = false;
    for (s, st) in slots.iter().zip(&settled.slots) {
        let outer = region::stack(s, &st.spec);
        if let Some(k) = s.operand
            && !closed.contains(&operands[k])
            && absorb(specs.of.get_mut(&operands[k]).expect("a spec"), &outer)
        {
            changed = true;
            let why = format!("backward from its user {} (a body's slot)", r.name());
            specs.why.entry(operands[k]).or_default().push(why);
        }
        for (i, n) in &results {
            if s.result == Some(*i) && absorb(specs.of.get_mut(n).expect("a spec"), &outer) {
                changed = true;
                let why = format!("forward from its {} body's slot", r.name());
                specs.why.entry(*n).or_default().push(why);
            }
        }
    }
    specs.bodies.insert(id, settled.bodies);
    Ok(changed)
}

/// The fixed point of a region's slots from `from` (see `region_step`); the bodies' shardings
/// are those of a last run with every parameter fixed at its slot's sharding, so each body's
/// parameters are exactly their slots.
fn settle_region(
    mesh: &Mesh,
    bodies: &[&Graph],
    slots: &[Slot],
    from: Vec<Settling>,
) -> Result<Settled, ShardError> {
    let param_specs = |st: &[Settling]| -> Vec<Vec<Spec>> {
        let mut ps: Vec<Vec<Spec>> = bodies
            .iter()
            .map(|b| {
                b.params()
                    .iter()
                    .map(|&p| vec![Vec::new(); b.ty(p).rank()])
                    .collect()
            })
            .collect();
        for (s, stl) in slots.iter().zip(st) {
            for &(b, p) in &s.params {
                ps[b][p] = stl.spec.clone();
            }
        }
        ps
    };
    let run = |st: &[Settling], closed: bool| -> Result<Vec<Specs>, ShardError> {
        bodies
            .iter()
            .zip(param_specs(st))
            .map(|(b, ps)| fixed_point(b, mesh, &ps, closed))
            .collect()
    };
    let mut st = from.clone();
    loop {
        let runs = run(&st, false)?;
        let mut changed = false;
        for (s, stl) in slots.iter().zip(st.iter_mut()) {
            for &(b, p) in &s.params {
                changed |= stl.merge(mesh, &runs[b].of[&bodies[b].params()[p]]);
            }
            for &(b, j) in &s.outputs {
                changed |= stl.merge(mesh, &runs[b].of[&bodies[b].outputs()[j]]);
            }
        }
        if !changed {
            break;
        }
    }
    let bodies = run(&st, true)?;
    Ok(Settled {
        from,
        slots: st,
        bodies,
    })
}

/// One op's turn: settle its factors, write them to its open tensors, and say why in each
/// tensor it changed (`level`: 0 for the ops that move dims, 1 once dots and reductions join).
/// Each value it changes gets `stamp` in `changed` (`Turns`).
#[allow(clippy::too_many_arguments)] // one visit's node, its rule, operands and the state
fn step(
    g: &Graph,
    mesh: &Mesh,
    rule: &FactorRule,
    operands: &[NodeId],
    id: NodeId,
    all: &mut Specs,
    closed: &[NodeId],
    level: u8,
    changed_at: &mut [u64],
    stamp: u64,
) -> bool {
    let specs = &mut all.of;
    let assignment = {
        let op_specs: Vec<&Spec> = operands.iter().map(|o| &specs[o]).collect();
        settle_on(g, mesh, rule, id, operands, &op_specs, &specs[&id])
    };
    // The reasons' text, written only when a spec changes (most visits change nothing).
    let at = || match &g.node(id).loc {
        Some(loc) => format!(" at {}", loc.split(" (").next().unwrap_or(loc)),
        None => String::new(),
    };
    let settled = || match assignment.conflicts.is_empty() {
        true => String::new(),
        false => format!(", settling: {}", assignment.conflicts.join("; ")),
    };
    let stage = if level == 0 {
        "movement pass"
    } else {
        "dot/reduction pass"
    };
    let mut changed = false;
    let targets = operands
        .iter()
        .enumerate()
        .map(|(k, &o)| (o, Some(k)))
        .chain([(id, None)]);
    for (node, tensor) in targets {
        if closed.contains(&node) {
            continue;
        }
        // `absorb` of the projected spec, one dim at a time, projecting only the open dims
        // (most turns change nothing, and building the whole spec allocated for every dim).
        let cur = specs.get_mut(&node).expect("every value has a spec");
        let mut gained: Vec<String> = Vec::new();
        for (d, fs) in rule.dims_of(tensor).iter().enumerate() {
            if !cur[d].is_empty() {
                continue;
            }
            let new = project_dim(mesh, rule, fs, &assignment.axes);
            if !new.is_empty() && new.iter().all(|a| !cur.iter().flatten().any(|b| b == a)) {
                gained.push(format!("dim {d} over {}", axes_text(&new)));
                cur[d] = new;
            }
        }
        if !gained.is_empty() {
            changed = true;
            changed_at[node.index()] = stamp;
            let how = match tensor {
                None => {
                    let from: Vec<String> = operands
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| !tessera_ir::sharding::is_replicated(&specs[o]))
                        .map(|(k, _)| format!("operand {k}"))
                        .collect();
                    format!("forward from {}", from.join(" and "))
                }
                Some(k) => format!(
                    "backward from its user {}{} (operand {k})",
                    g.op(id).name(),
                    at()
                ),
            };
            all.why.entry(node).or_default().push(format!(
                "{} {how}, {stage}{}",
                gained.join(", "),
                settled()
            ));
        }
    }
    changed
}
