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

use tessera_ir::{CollectiveOp, Graph, Mesh, NodeId, Op, ReduceKind, Sharding};

use crate::factors::rule_of;
use crate::propagate::{project, settle};
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
}

pub(crate) fn insert(g: &Graph) -> Result<Inserted, ShardError> {
    let order = order(g, PASS)?;
    let mesh = mesh_of(g, PASS)?;
    let mut wanted: HashMap<NodeId, Spec> = HashMap::new();
    for id in g.node_ids() {
        let spec = annotation(g, id, PASS, "propagate")?;
        check_spec(mesh, g.ty(id), &spec)
            .map_err(|e| ShardError::Invalid(format!("{PASS}: {}: {e}", g.op(id).name())))?;
        wanted.insert(id, spec);
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
        x: Graph::new(g.name.clone()),
        at: HashMap::new(),
    };
    p.x.mesh = Some(mesh.clone());
    for &param in g.params() {
        let l = p.x.add_param(g.ty(param).clone());
        p.x.node_mut(l).loc = g.node(param).loc.clone();
        p.x.node_mut(l).sharding = Some(Sharding::closed(mesh, &wanted[&param]));
        p.at.insert(param, (l, wanted[&param].clone()));
    }
    for id in order {
        let op = g.op(id).clone();
        if let Op::Parameter(_) = op {
            continue;
        }
        let operands = g.operands(id);
        let specs: Vec<Spec> = operands.iter().map(|o| p.at[o].1.clone()).collect();
        let d = p.decide(id, &op, &specs, &wanted[&id]);
        let mut args = Vec::new();
        let mut why = d.conflicts.clone();
        for (k, &o) in operands.iter().enumerate() {
            let (xnode, spec) = p.at[&o].clone();
            let moved = match p.rebuild(o, &d.want[k])? {
                Some(n) => n,
                None if spec == d.want[k] => xnode,
                None => {
                    why.push(format!(
                        "operand {k} resharded {} -> {}",
                        spec_text(&spec),
                        spec_text(&d.want[k])
                    ));
                    p.add(
                        Op::ShardingConstraint(Sharding::closed(mesh, &d.want[k])),
                        &[xnode],
                        &d.want[k],
                    )?
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
            annotated.node_mut(id).sharding = Some(Sharding::closed(mesh, &d.out));
            p.at.insert(id, (args[0], d.out));
            continue;
        }
        let mut out = d.out;
        let mut n = p.add(op, &args, &out)?;
        p.x.node_mut(n).loc = g.node(id).loc.clone();
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
            n = p.add(
                Op::Collective(CollectiveOp::AllReduce { kind, axes }),
                &[n],
                &out,
            )?;
            p.x.node_mut(n).loc = g.node(id).loc.clone();
        }
        annotated.node_mut(id).sharding = Some(Sharding::closed(mesh, &out));
        p.at.insert(id, (n, out));
    }
    let outs: Vec<NodeId> = g.outputs().iter().map(|o| p.at[o].0).collect();
    p.x.set_outputs(outs);
    // Values built again in another sharding may leave their first version unused.
    p.x.remove_dead();
    Ok(Inserted {
        explicit: p.x,
        annotated,
    })
}

impl Inserter<'_> {
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
        let name = op.name().to_string();
        let n = self
            .x
            .add(op, args)
            .map_err(|error| ShardError::Type { op: name, error })?;
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
