//! The verifier: checks the IR's invariants. Passes run it on their output in debug builds.
//!
//! Invariants of a well-formed graph:
//! 1. The graph is acyclic.
//! 2. Every node has as many operands as its op takes, at positions `0..n` with no gaps.
//! 3. Every node's type is what its op's type rule gives for its operands' types (and, for
//!    collectives, the graph's mesh).
//! 4. The parameters are exactly the `Op::Parameter` nodes, and `params()[i]` is `Parameter(i)`.
//! 5. Every output is a node of the graph.
//! 6. Every value's type is within the size limit of one tensor (`TensorType::check_size`:
//!    its element count and byte size do not overflow), and every constant's data has the
//!    declared element type and element count.
//! 7. Every sharding names the graph's mesh, has one entry per dimension, names only axes of
//!    the mesh, names no axis twice, and splits each dimension into whole parts.
//! 8. A `get_result` reads a region node, and its index and type are one of the region's
//!    results; a region's bodies are well-formed graphs themselves (recursively, at most
//!    [`MAX_REGION_DEPTH`] deep) that fit its operands (`RegionOp::result_types`).
//!
//! Errors name the value as the printer numbers it (`%7`), so they can be matched with a dump.

use petgraph::Direction;

use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::region::MAX_REGION_DEPTH;
use crate::sharding::Sharding;
use crate::types::TensorType;

/// A broken invariant, naming the value (as printed) and the op.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{value}: {message}")]
pub struct VerifyError {
    /// `%7 (add)`, or `graph` for errors about the whole graph.
    pub value: String,
    pub message: String,
}

/// Checks every invariant listed in the module doc; returns the first violation.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    // The nesting limit first, as one message (not one line per level).
    if let Some(deep) = nesting_beyond(g, 0) {
        return Err(VerifyError {
            value: deep,
            message: format!("regions nest deeper than {MAX_REGION_DEPTH} levels"),
        });
    }
    verify_at(g, 0)
}

/// The region op (as `%n (op, loc)` of the top-level graph) under which regions nest deeper
/// than `MAX_REGION_DEPTH`, if any. Recurses at most `MAX_REGION_DEPTH + 1` levels.
fn nesting_beyond(g: &Graph, depth: usize) -> Option<String> {
    for id in g.node_ids() {
        if let Op::Region(r) = g.op(id) {
            let too_deep = depth >= MAX_REGION_DEPTH
                || r.regions()
                    .iter()
                    .any(|(_, b)| nesting_beyond(b, depth + 1).is_some());
            if too_deep {
                let node = g.node(id);
                return Some(match &node.loc {
                    Some(loc) => format!("{} ({loc})", node.op.name()),
                    None => node.op.name().to_string(),
                });
            }
        }
    }
    None
}

/// Whether the operand positions on `id`'s incoming edges are 0..n, once each (without
/// allocating for the usual few operands: a bit mask up to 64).
fn positions_are_a_range(g: &Graph, id: NodeId) -> bool {
    let edges = || g.petgraph().edges_directed(id, Direction::Incoming);
    let n = edges().count();
    if n <= 64 {
        let mut seen = 0u64;
        for e in edges() {
            let p = *e.weight();
            if p >= n || seen & (1 << p) != 0 {
                return false;
            }
            seen |= 1 << p;
        }
        return true;
    }
    let mut positions: Vec<usize> = edges().map(|e| *e.weight()).collect();
    positions.sort_unstable();
    positions.iter().enumerate().all(|(i, &p)| i == p)
}

fn verify_at(g: &Graph, depth: usize) -> Result<(), VerifyError> {
    let whole = |message: String| VerifyError {
        value: "graph".into(),
        message,
    };
    let Some(order) = g.try_topo_order() else {
        return Err(whole("the graph has a cycle".into()));
    };
    for (i, &p) in g.params().iter().enumerate() {
        if !g.contains(p) || g.op(p) != &Op::Parameter(i) {
            return Err(whole(format!("parameter {i} is not a Parameter({i}) node")));
        }
    }
    for &o in g.outputs() {
        if !g.contains(o) {
            return Err(whole("an output is not a node of the graph".into()));
        }
    }
    // One pair of vectors for every node's operands and their types.
    let (mut operands, mut types): (Vec<NodeId>, Vec<&TensorType>) = (Vec::new(), Vec::new());
    // A node's name in the printed text is its place in this order.
    for (name, &id) in order.iter().enumerate() {
        let node = g.node(id);
        let at = |message: String| VerifyError {
            value: match &node.loc {
                Some(loc) => format!("%{name} ({}, {loc})", node.op.name()),
                None => format!("%{name} ({})", node.op.name()),
            },
            message,
        };
        if !positions_are_a_range(g, id) {
            let mut positions: Vec<usize> = g
                .petgraph()
                .edges_directed(id, Direction::Incoming)
                .map(|e| *e.weight())
                .collect();
            positions.sort_unstable();
            return Err(at(format!(
                "operand positions {positions:?} are not 0..{}",
                positions.len()
            )));
        }
        node.ty.check_size().map_err(&at)?;
        if let Op::Parameter(i) = &node.op {
            if g.params().get(*i) != Some(&id) {
                return Err(at(format!(
                    "Parameter({i}) is not parameter {i} of the graph"
                )));
            }
        } else {
            let op = &node.op;
            g.operands_into(id, &mut operands);
            types.clear();
            types.extend(operands.iter().map(|&o| g.ty(o)));
            let ty = op
                .infer_type(&types, g.mesh.as_ref())
                .map_err(|e| at(e.to_string()))?;
            if ty != node.ty {
                return Err(at(format!(
                    "has type {} but its type rule gives {ty}",
                    node.ty
                )));
            }
        }
        if let Some(s) = &node.sharding {
            check_sharding(g, s, &node.ty).map_err(at)?;
        }
        if let Op::ShardingConstraint(s) = &node.op {
            check_sharding(g, s, &node.ty).map_err(at)?;
        }
        if let Op::GetResult { index, ty } = &node.op {
            let region = g.operands(id)[0];
            let types = g.result_types(region).map_err(|e| at(e.to_string()))?;
            match types.get(*index) {
                Some(t) if t == ty => {}
                Some(t) => {
                    return Err(at(format!(
                        "reads result {index} as {ty} but the region's result {index} is {t}"
                    )));
                }
                None => {
                    return Err(at(format!(
                        "reads result {index} of a region with {} results",
                        types.len()
                    )));
                }
            }
        }
        if let Op::Region(r) = &node.op {
            if depth >= MAX_REGION_DEPTH {
                return Err(at(format!(
                    "regions nest deeper than {MAX_REGION_DEPTH} levels"
                )));
            }
            for (label, body) in r.regions() {
                verify_at(body, depth + 1)
                    .map_err(|e| at(format!("in region {label}: {}: {}", e.value, e.message)))?;
            }
        }
    }
    Ok(())
}

/// Checks that a sharding fits the graph's mesh and a value of type `ty`.
pub fn check_sharding(g: &Graph, s: &Sharding, ty: &TensorType) -> Result<(), String> {
    let Some(mesh) = &g.mesh else {
        return Err(format!("sharding {s} but the graph declares no mesh"));
    };
    if s.mesh != mesh.name {
        return Err(format!(
            "sharding names mesh @{}, the graph's is @{}",
            s.mesh, mesh.name
        ));
    }
    if s.dims.len() != ty.rank() {
        return Err(format!("sharding {s} has {} dims for {ty}", s.dims.len()));
    }
    let mut seen: Vec<&String> = Vec::new();
    for a in s.axes() {
        if mesh.axis_size(a).is_none() {
            return Err(format!("sharding {s} names unknown mesh axis \"{a}\""));
        }
        if seen.contains(&a) {
            return Err(format!("sharding {s} names mesh axis \"{a}\" twice"));
        }
        seen.push(a);
    }
    for (d, dim) in s.dims.iter().enumerate() {
        let parts = dim
            .axes
            .iter()
            .filter_map(|a| mesh.axis_size(a))
            .try_fold(1usize, usize::checked_mul)
            .ok_or_else(|| {
                format!(
                    "sharding {s}: the product of the sizes of {:?} overflows",
                    dim.axes
                )
            })?;
        if !ty.dims()[d].is_multiple_of(parts) {
            return Err(format!(
                "dim {d} of {ty} (size {}) is not divisible by {parts}, the size of {:?}",
                ty.dims()[d],
                dim.axes
            ));
        }
    }
    Ok(())
}
