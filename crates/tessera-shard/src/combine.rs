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
//!
//! Before combining, `drop_single_device_collectives` removes the collectives whose group is
//! one device (every axis of size 1: a mesh of one device, a 2D mesh's axis of size 1, a pmap
//! over one device), which are the identity: on a 1-device mesh the program then is the host
//! program, with no meeting, no concatenate and no slices (the seed step's 22 kernels were
//! 13 without them).

use std::collections::{HashMap, HashSet};

use tessera_ir::{CollectiveOp, Graph, NodeId, Op, ReduceKind, Shape};

use crate::ShardError;

/// All-reduces of at least this many elements keep their own meeting.
pub const COMBINE_BELOW: usize = 1 << 16;

/// What all-reduces must share to combine: the reduction, the axes and the element type.
type GroupKey = (ReduceKind, Vec<String>, tessera_ir::DType);

/// Removes the collectives of `g` (and of its regions' bodies) over a group of one device,
/// replacing each by its operand: `all_reduce`, `all_gather`, `reduce_scatter` and
/// `all_to_all` of one member return their operand, as a `collective_permute` that sends
/// device 0 to itself does. A permute without that pair gives zeros and `axis_index` gives 0:
/// both stay, as does any collective whose type differs from its operand's. Returns how many
/// it removed; a graph without a mesh is left as it is.
pub fn drop_single_device_collectives(g: &mut Graph) -> Result<usize, ShardError> {
    let Some(mesh) = g.mesh.clone() else {
        return Ok(0);
    };
    drop_in(g, &mesh)
}

fn drop_in(g: &mut Graph, mesh: &tessera_ir::Mesh) -> Result<usize, ShardError> {
    let one = |axes: &[String]| axes.iter().all(|a| mesh.axis_size(a) == Some(1));
    let mut removed = 0;
    for id in g.topo_order() {
        let identity = match g.op(id) {
            Op::Collective(c) => match c {
                CollectiveOp::AllReduce { axes, .. }
                | CollectiveOp::AllGather { axes, .. }
                | CollectiveOp::ReduceScatter { axes, .. }
                | CollectiveOp::AllToAll { axes, .. } => one(axes),
                CollectiveOp::CollectivePermute { axes, pairs } => {
                    one(axes) && pairs.contains(&(0, 0))
                }
                CollectiveOp::AxisIndex { .. } => false,
            },
            Op::Region(_) => {
                if let Op::Region(r) = &mut g.node_mut(id).op {
                    for body in r.regions_mut() {
                        removed += drop_in(body, mesh)?;
                    }
                }
                false
            }
            // tidy: allow-wildcard(only a collective is a meeting; a region's bodies are walked)
            _ => false,
        };
        let operands = g.operands(id);
        if identity && operands.len() == 1 && g.ty(operands[0]) == g.ty(id) {
            g.replace_all_uses(id, operands[0]);
            g.remove(id);
            removed += 1;
        }
    }
    Ok(removed)
}

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

#[cfg(test)]
mod tests {
    use super::drop_single_device_collectives;

    /// Over one device a permute is the identity only with the pair (0, 0) (without it, zeros),
    /// and `axis_index` is a value, not a meeting: only the first goes.
    #[test]
    fn only_identities_go() {
        let mut g = tessera_ir::parse(
            r#"mesh @mesh = <"dp"=2, "one"=1>
func @f(%0: f32[4]) {
  %1 = collective_permute %0 axes=["one"] pairs=[[0,0]] : f32[4]
  %2 = collective_permute %0 axes=["one"] pairs=[] : f32[4]
  %3 = axis_index axes=["one"] : i32[]
  %4 = all_reduce %0 sum axes=["dp"] : f32[4]
  %5 = all_gather %0 dim=0 axes=["one"] : f32[4]
  return %1, %2, %3, %4, %5
}"#,
        )
        .unwrap();
        assert_eq!(drop_single_device_collectives(&mut g).unwrap(), 2);
        let text = tessera_ir::print(&g);
        assert!(text.contains("pairs=[]"), "{text}");
        assert!(text.contains("axis_index"), "{text}");
        assert!(text.contains("all_reduce %0 sum axes=[\"dp\"]"), "{text}");
        assert!(
            !text.contains("all_gather") && !text.contains("[[0,0]]"),
            "{text}"
        );
    }
}
