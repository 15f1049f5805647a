//! The program graph: a petgraph `StableDiGraph` of typed nodes behind a small API.
//!
//! An edge runs from an operand to its user and carries the operand's position, so both the
//! operands and the users of a node are cheap to find, and a value used twice by one op (`x * x`)
//! is two edges. Node ids stay valid when other nodes are removed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};

use crate::op::{Op, TypeError};
use crate::region::RegionOp;
use crate::sharding::{Mesh, Sharding};
use crate::types::TensorType;

pub type NodeId = NodeIndex<u32>;

/// One value of the program: the op that computes it, its type, and what passes and the tracer
/// attach to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub ty: TensorType,
    /// Where propagation (or the user) placed this value on the mesh.
    pub sharding: Option<Sharding>,
    /// Where the value came from: the user's `file:line`, and a readable origin, as one line.
    pub loc: Option<String>,
    /// Why the value is sharded as it is: the user's annotation, the propagation step (and the
    /// conflict it settled) or the Explicit-mode rule that decided it. Set by the sharding
    /// passes on the global program; printed in the location comment, `[sharding: ...]`.
    pub why: Option<String>,
}

/// A function: parameters, nodes, outputs, and the mesh its collectives and shardings refer to.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub mesh: Option<Mesh>,
    graph: StableDiGraph<Node, usize, u32>,
    params: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            mesh: None,
            graph: StableDiGraph::default(),
            params: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// An empty graph with room for `nodes` nodes (and twice as many edges) before its
    /// vectors grow: a node is about 300 bytes, and growing them one doubling at a time copied
    /// every node again (a third of adding nodes while tracing the seed step: 38 of 110 perf
    /// samples of `Graph::add` in 30 first calls).
    pub fn with_capacity(name: impl Into<String>, nodes: usize) -> Graph {
        Graph {
            graph: StableDiGraph::with_capacity(nodes, nodes.saturating_mul(2)),
            ..Graph::new(name)
        }
    }

    /// Appends a parameter of the given type.
    pub fn add_param(&mut self, ty: TensorType) -> NodeId {
        let index = self.params.len();
        let id = self.graph.add_node(Node {
            op: Op::Parameter(index),
            ty,
            sharding: None,
            loc: None,
            why: None,
        });
        self.params.push(id);
        id
    }

    /// Adds `op` applied to `operands`, with its type from the op's type rule.
    pub fn add(&mut self, mut op: Op, operands: &[NodeId]) -> Result<NodeId, TypeError> {
        if let Op::Region(r) = &mut op {
            // A body is named by its label, as the text format prints it.
            let labels: Vec<&str> = r.regions().iter().map(|(l, _)| *l).collect();
            for (g, l) in r.regions_mut().into_iter().zip(labels) {
                if g.name != l {
                    g.name = l.to_string();
                }
                // A body runs on the mesh of the graph it sits in.
                if g.mesh != self.mesh {
                    g.set_mesh(self.mesh.clone());
                }
            }
        }
        if let Op::Parameter(_) = op {
            return Err(TypeError {
                op: op.name().into(),
                operands: vec![],
                reason: "add parameters with add_param".into(),
            });
        }
        let types: Vec<&TensorType> = operands.iter().map(|&o| &self.graph[o].ty).collect();
        let ty = op.infer_type(&types, self.mesh.as_ref())?;
        let id = self.graph.add_node(Node {
            op,
            ty,
            sharding: None,
            loc: None,
            why: None,
        });
        for (pos, &o) in operands.iter().enumerate() {
            self.graph.add_edge(o, id, pos);
        }
        Ok(id)
    }

    /// Sets the mesh of this graph and of every region body inside it.
    pub fn set_mesh(&mut self, mesh: Option<Mesh>) {
        let ids: Vec<NodeId> = self.graph.node_indices().collect();
        for id in ids {
            if let Op::Region(r) = &mut self.graph[id].op {
                for body in r.regions_mut() {
                    body.set_mesh(mesh.clone());
                }
            }
        }
        self.mesh = mesh;
    }

    /// Adds the region op `r` applied to `operands`, and one `get_result` node per result.
    /// Returns the region node and the result nodes.
    pub fn add_region(
        &mut self,
        r: RegionOp,
        operands: &[NodeId],
    ) -> Result<(NodeId, Vec<NodeId>), TypeError> {
        let region = self.add(Op::Region(Box::new(r)), operands)?;
        let results = self.add_results(region)?;
        Ok((region, results))
    }

    /// The result types of region node `region` (its operands checked against its bodies).
    pub fn result_types(&self, region: NodeId) -> Result<Vec<TensorType>, TypeError> {
        let Op::Region(r) = self.op(region) else {
            return Err(TypeError {
                op: self.op(region).name().into(),
                operands: vec![],
                reason: "is not a region op: it has one result, its node".into(),
            });
        };
        let types: Vec<TensorType> = self
            .operands(region)
            .iter()
            .map(|&o| self.ty(o).clone())
            .collect();
        let refs: Vec<&TensorType> = types.iter().collect();
        r.result_types(&refs, self.mesh.as_ref())
            .map_err(|reason| TypeError {
                op: r.name().into(),
                operands: types.clone(),
                reason,
            })
    }

    /// Adds one `get_result` node per result of region node `region`.
    pub fn add_results(&mut self, region: NodeId) -> Result<Vec<NodeId>, TypeError> {
        let types = self.result_types(region)?;
        types
            .into_iter()
            .enumerate()
            .map(|(index, ty)| self.add(Op::GetResult { index, ty }, &[region]))
            .collect()
    }

    /// Copies the nodes of `src` into this graph with `src`'s parameters replaced by `args`
    /// (one per parameter, of the same types), keeping each node's location and sharding.
    /// Returns the nodes that stand for `src`'s outputs. Region ops are copied whole.
    pub fn inline(&mut self, src: &Graph, args: &[NodeId]) -> Result<Vec<NodeId>, TypeError> {
        let fail = |reason: String| TypeError {
            op: "inline".into(),
            operands: vec![],
            reason,
        };
        if args.len() != src.params().len() {
            return Err(fail(format!(
                "@{} takes {} parameters, given {}",
                src.name,
                src.params().len(),
                args.len()
            )));
        }
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        for (&p, &a) in src.params().iter().zip(args) {
            if src.ty(p) != self.ty(a) {
                return Err(fail(format!(
                    "a parameter of @{} has type {}, given {}",
                    src.name,
                    src.ty(p),
                    self.ty(a)
                )));
            }
            map.insert(p, a);
        }
        let order = src
            .try_topo_order()
            .ok_or_else(|| fail(format!("@{} has a cycle", src.name)))?;
        for id in order {
            if map.contains_key(&id) {
                continue;
            }
            let node = src.node(id);
            let operands: Vec<NodeId> = src.operands(id).iter().map(|o| map[o]).collect();
            let new = self.add(node.op.clone(), &operands)?;
            self.graph[new].loc = node.loc.clone();
            self.graph[new].sharding = node.sharding.clone();
            map.insert(id, new);
        }
        Ok(src.outputs().iter().map(|o| map[o]).collect())
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.contains_node(id)
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.graph[id]
    }

    pub fn ty(&self, id: NodeId) -> &TensorType {
        &self.graph[id].ty
    }

    pub fn op(&self, id: NodeId) -> &Op {
        &self.graph[id].op
    }

    /// One more than the largest node index in use: a table indexed by `NodeId::index()` of
    /// this length holds every node of the graph as it is now (removed nodes leave holes,
    /// which a later `add` may fill).
    pub fn node_bound(&self) -> usize {
        self.graph.node_bound()
    }

    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// Every node id, in insertion order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.graph.node_indices()
    }

    /// The operands of `id`, in position order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut ops = Vec::new();
        self.operands_into(id, &mut ops);
        ops
    }

    /// [`Graph::operands`] into `ops` (emptied first), reusing its room: a loop over every
    /// node (the verifier's) allocates once, not once a node.
    pub fn operands_into(&self, id: NodeId, ops: &mut Vec<NodeId>) {
        // Each edge's weight is its operand's position, 0..n once each in a well-formed graph:
        // each operand goes straight to its place (this runs for every node of every pass).
        // Positions that are not exactly 0..n (a graph the verifier rejects) take the sort
        // below, which orders whatever is there.
        let n = self.graph.edges_directed(id, Direction::Incoming).count();
        ops.clear();
        ops.resize(n, NodeId::end());
        let mut placed = true;
        for e in self.graph.edges_directed(id, Direction::Incoming) {
            match ops.get_mut(*e.weight()) {
                Some(slot) if *slot == NodeId::end() => *slot = e.source(),
                _ => placed = false,
            }
        }
        if placed {
            return;
        }
        let mut edges: Vec<(usize, NodeId)> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        edges.sort_unstable();
        ops.clear();
        ops.extend(edges.into_iter().map(|(_, n)| n));
    }

    /// The distinct nodes that use `id` as an operand, in id order.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut users: Vec<NodeId> = self
            .graph
            .edges_directed(id, Direction::Outgoing)
            .map(|e| e.target())
            .collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    pub fn params(&self) -> &[NodeId] {
        &self.params
    }

    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    /// Makes every user of `old` (and every output that is `old`) use `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        let uses: Vec<(NodeId, usize, petgraph::stable_graph::EdgeIndex<u32>)> = self
            .graph
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight(), e.id()))
            .collect();
        for (user, pos, edge) in uses {
            self.graph.remove_edge(edge);
            self.graph.add_edge(new, user, pos);
        }
        for o in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Removes a node that no other node uses. Parameters cannot be removed.
    pub fn remove(&mut self, id: NodeId) -> bool {
        if self.params.contains(&id)
            || self.outputs.contains(&id)
            || self
                .graph
                .edges_directed(id, Direction::Outgoing)
                .next()
                .is_some()
        {
            return false;
        }
        self.graph.remove_node(id).is_some()
    }

    /// Removes every node that no output depends on (parameters stay): dead code elimination.
    /// Returns how many nodes it removed.
    pub fn remove_dead(&mut self) -> usize {
        let mut live: std::collections::HashSet<NodeId> = self.outputs.iter().copied().collect();
        let mut stack: Vec<NodeId> = self.outputs.clone();
        while let Some(n) = stack.pop() {
            for o in self.operands(n) {
                if live.insert(o) {
                    stack.push(o);
                }
            }
        }
        let dead: Vec<NodeId> = self
            .graph
            .node_indices()
            .filter(|n| !live.contains(n) && !self.params.contains(n))
            .collect();
        for &n in &dead {
            self.graph.remove_node(n);
        }
        dead.len()
    }

    /// All nodes in the canonical order: parameters in parameter order, then every other node
    /// after its operands, ties broken by id, so the order is deterministic and survives a print
    /// and parse. Returns `None` when the graph has a cycle.
    pub fn try_topo_order(&self) -> Option<Vec<NodeId>> {
        // Indexed by node index (a stable graph's indices stay below `node_bound`): one
        // allocation, where a map allocated as it grew (this runs after every pass).
        let mut indegree = vec![0usize; self.graph.node_bound()];
        let mut ready = BinaryHeap::new();
        for id in self.graph.node_indices() {
            let d = self.graph.edges_directed(id, Direction::Incoming).count();
            if d > 0 {
                indegree[id.index()] = d;
            } else if !matches!(self.graph[id].op, Op::Parameter(_)) {
                ready.push(Reverse(id));
            }
        }
        let mut order = Vec::with_capacity(self.graph.node_count());
        let mut visit =
            |id: NodeId, order: &mut Vec<NodeId>, ready: &mut BinaryHeap<Reverse<NodeId>>| {
                order.push(id);
                for e in self.graph.edges_directed(id, Direction::Outgoing) {
                    let d = &mut indegree[e.target().index()];
                    debug_assert!(*d > 0, "edge target has an indegree");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Reverse(e.target()));
                    }
                }
            };
        for &p in &self.params {
            visit(p, &mut order, &mut ready);
        }
        while let Some(Reverse(id)) = ready.pop() {
            visit(id, &mut order, &mut ready);
        }
        (order.len() == self.graph.node_count()).then_some(order)
    }

    /// Topological order of a verified (acyclic) graph.
    pub fn topo_order(&self) -> Vec<NodeId> {
        self.try_topo_order()
            .expect("topo_order on a cyclic graph: run the verifier first")
    }

    /// The underlying petgraph, for algorithms and DOT export.
    pub fn petgraph(&self) -> &StableDiGraph<Node, usize, u32> {
        &self.graph
    }

    /// Structural equality: same mesh, same parameters, and in topological order the same ops,
    /// types, shardings, locations and operand wiring, and the same outputs. Node ids may differ.
    pub fn structurally_eq(&self, other: &Graph) -> bool {
        if self.name != other.name
            || self.mesh != other.mesh
            || self.params.len() != other.params.len()
            || self.outputs.len() != other.outputs.len()
            || self.node_count() != other.node_count()
        {
            return false;
        }
        let (Some(a), Some(b)) = (self.try_topo_order(), other.try_topo_order()) else {
            return false;
        };
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        for (&x, &y) in a.iter().zip(&b) {
            if self.graph[x] != other.graph[y] {
                return false;
            }
            let (ox, oy) = (self.operands(x), other.operands(y));
            if ox.len() != oy.len() || ox.iter().zip(&oy).any(|(p, q)| map.get(p) != Some(q)) {
                return false;
            }
            map.insert(x, y);
        }
        self.outputs
            .iter()
            .zip(&other.outputs)
            .all(|(p, q)| map.get(p) == Some(q))
    }
}

/// Graphs compare structurally ([`Graph::structurally_eq`]): region ops hold their bodies by
/// value, and two bodies are equal when they compute the same thing the same way.
impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.structurally_eq(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, DType};

    /// Operands come in position order, a value used twice twice; positions that are not
    /// 0..n (only reachable by editing the petgraph directly) fall back to sorting, and the
    /// verifier names them.
    #[test]
    fn operands_follow_their_positions() {
        let mut g = Graph::new("f");
        let ty = TensorType::new(DType::F32, vec![2]);
        let (a, b) = (g.add_param(ty.clone()), g.add_param(ty));
        let sub = g.add(Op::Binary(BinaryOp::Sub), &[b, a]).unwrap();
        let sq = g.add(Op::Binary(BinaryOp::Mul), &[sub, sub]).unwrap();
        g.set_outputs(vec![sq]);
        assert_eq!(g.operands(sub), [b, a]);
        assert_eq!(g.operands(sq), [sub, sub]);
        assert_eq!(g.try_topo_order().unwrap(), [a, b, sub, sq]);
        crate::verify(&g).unwrap();
        // A third edge at position 5: sorted by position, and rejected by the verifier.
        g.graph.add_edge(a, sq, 5);
        assert_eq!(g.operands(sq), [sub, sub, a]);
        let e = crate::verify(&g).unwrap_err().to_string();
        assert!(
            e.contains("operand positions [0, 1, 5] are not 0..3"),
            "{e}"
        );
    }
}
