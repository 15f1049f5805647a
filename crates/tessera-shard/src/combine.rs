//! Combining all-reduces: independent `all_reduce`s of one kind over the same axes become one,
//! of their operands flattened and concatenated, as XLA combines a step's gradient reductions
//! into one all-reduce of a tuple. Each device then meets the others once per step instead of
//! once per gradient, which is what a step costs on few cores with many devices.
//!
//! Only small all-reduces combine (fewer than `COMBINE_BELOW` elements each): for those the
//! meeting is the cost. A large one pays for its own meeting many times over in the copies that
//! combining adds (a concatenate and a slice each, over every element): on the big MLP over 8
//! devices, combining the 0.8 M and 1 M element gradients put concatenate and slice kernels at
//! 30% of the step's time (`perf record` on `cargo bench --bench sharded`).
//!
//! Consumes a per-device graph; produces the same program with each group of independent
//! all-reduces (none depends on another's result) replaced by reshape, concatenate, one
//! all-reduce, and slices back. Preserves every value.

use std::collections::{HashMap, HashSet};

use tessera_ir::{CollectiveOp, Graph, NodeId, Op, ReduceKind, Shape};

use crate::ShardError;

/// All-reduces of at least this many elements keep their own meeting.
pub const COMBINE_BELOW: usize = 1 << 16;

/// What all-reduces must share to combine: the reduction, the axes and the element type.
type GroupKey = (ReduceKind, Vec<String>, tessera_ir::DType);

/// Combines the graph's all-reduces (see the module doc); returns how many it removed.
pub fn combine_all_reduces(g: &mut Graph) -> Result<usize, ShardError> {
    tessera_ir::verify(g).map_err(|e| ShardError::Invalid(format!("malformed graph: {e}")))?;
    let order = g.topo_order();
    // The all-reduces each node depends on.
    let mut deps: HashMap<NodeId, HashSet<NodeId>> = HashMap::new();
    for &id in &order {
        let mut d: HashSet<NodeId> = HashSet::new();
        for o in g.operands(id) {
            if let Some(od) = deps.get(&o) {
                d.extend(od.iter().copied());
            }
            if matches!(g.op(o), Op::Collective(CollectiveOp::AllReduce { .. })) {
                d.insert(o);
            }
        }
        deps.insert(id, d);
    }
    // Groups by (kind, axes, dtype), in order; a member joins the open batch of its group
    // unless it depends on one of its members.
    let mut batches: Vec<(GroupKey, Vec<NodeId>)> = Vec::new();
    for &id in &order {
        let Op::Collective(CollectiveOp::AllReduce { kind, axes }) = g.op(id).clone() else {
            continue;
        };
        if g.ty(id).numel() >= COMBINE_BELOW {
            continue;
        }
        let key = (kind, axes, g.ty(id).dtype);
        let open = batches.iter_mut().rev().find(|(k, _)| *k == key);
        match open {
            Some((_, members)) if !members.iter().any(|m| deps[&id].contains(m)) => {
                members.push(id)
            }
            _ => batches.push((key, vec![id])),
        }
    }
    let mut removed = 0;
    for ((kind, axes, _), members) in batches {
        if members.len() < 2 {
            continue;
        }
        let add = |g: &mut Graph, op: Op, args: &[NodeId]| {
            let name = op.name().to_string();
            g.add(op, args)
                .map_err(|error| ShardError::Type { op: name, error })
        };
        let mut flat = Vec::new();
        let mut sizes = Vec::new();
        for &m in &members {
            let x = g.operands(m)[0];
            let n = g.ty(x).numel();
            flat.push(add(g, Op::Reshape(Shape::new(vec![n])), &[x])?);
            sizes.push(n);
        }
        let cat = add(g, Op::Concatenate { dim: 0 }, &flat)?;
        let all = add(
            g,
            Op::Collective(CollectiveOp::AllReduce {
                kind,
                axes: axes.clone(),
            }),
            &[cat],
        )?;
        g.node_mut(all).loc = Some(format!("{} all-reduces combined", members.len()));
        let mut offset = 0;
        for (&m, &n) in members.iter().zip(&sizes) {
            let part = add(
                g,
                Op::Slice {
                    start: vec![offset],
                    limit: vec![offset + n],
                    stride: vec![1],
                },
                &[all],
            )?;
            let shaped = add(g, Op::Reshape(g.ty(m).shape.clone()), &[part])?;
            g.node_mut(shaped).loc = g.node(m).loc.clone();
            g.replace_all_uses(m, shaped);
            g.remove(m);
            offset += n;
        }
        removed += members.len() - 1;
    }
    // Inside a region's body, its own all-reduces combine (a loop body meets once per
    // iteration); never across the boundary.
    let regions: Vec<NodeId> = g
        .node_ids()
        .filter(|&id| matches!(g.op(id), Op::Region(_)))
        .collect();
    for id in regions {
        if let Op::Region(r) = &mut g.node_mut(id).op {
            for body in r.regions_mut() {
                removed += combine_all_reduces(body)?;
            }
        }
    }
    Ok(removed)
}
