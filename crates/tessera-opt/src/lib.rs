//! Algebraic simplification by equality saturation (egg), common subexpressions, and dead code
//! elimination.
//!
//! Consumes a verified graph; produces an equivalent graph that is never worse under the cost
//! model (bytes written plus flops): the graph goes into an e-graph (hash-consing merges equal
//! subexpressions, which is CSE), the rules in `rules.rs` run under node and iteration limits
//! (never a wall-clock limit, so the output does not depend on machine load), and the cheapest
//! program is extracted. Preserves parameters, outputs and each kept node's location.

pub mod lang;
pub mod rules;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use egg::{CostFunction, EGraph, Extractor, Id, Language, Runner};
use tessera_ir::{Graph, NodeId, Op};

pub use lang::{Node, TensorAnalysis};

/// The limits of one run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub iterations: usize,
    pub nodes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            iterations: 12,
            nodes: 20_000,
        }
    }
}

/// What a run did, for the dump.
#[derive(Clone, Debug)]
pub struct Report {
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub iterations: usize,
    pub egraph_nodes: usize,
    pub stop_reason: String,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "simplify: {} -> {} nodes; {} iterations, e-graph of {} nodes; stopped: {}",
            self.nodes_before,
            self.nodes_after,
            self.iterations,
            self.egraph_nodes,
            self.stop_reason
        )
    }
}

/// Removes the nodes no output depends on; returns how many.
pub fn dce(g: &mut Graph) -> usize {
    g.remove_dead()
}

/// Bytes written plus flops: what a node costs to compute.
struct Cost<'a> {
    egraph: &'a EGraph<Node, TensorAnalysis>,
}

impl CostFunction<Node> for Cost<'_> {
    type Cost = f64;
    fn cost<C>(&mut self, enode: &Node, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let children: f64 = enode.children().iter().map(|&c| costs(c)).sum();
        let class = self.egraph.lookup(enode.clone());
        let ty = class.and_then(|c| self.egraph[c].data.ty.clone());
        let numel = ty.as_ref().map_or(1, |t| t.numel()) as f64;
        let bytes = ty.as_ref().map_or(4, |t| t.byte_size().max(1)) as f64;
        let own = match &*enode.op {
            Op::Parameter(_) => 0.0,
            // A splat is free to recompute; a constant array is read.
            Op::Constant(l) if l.data.is_splat() => 1.0,
            Op::Constant(_) => bytes,
            Op::DotGeneral(dd) => {
                let k: f64 = enode
                    .children()
                    .first()
                    .and_then(|&c| self.egraph[c].data.ty.clone())
                    .map_or(1.0, |t| {
                        dd.lhs_contract
                            .iter()
                            .map(|&d| t.dims()[d] as f64)
                            .product()
                    });
                bytes + 2.0 * numel * k
            }
            // Every other op costs the bytes it writes plus one per element: views cost what the
            // data they move costs.
            Op::Iota { .. }
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
            | Op::Collective(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            // A region's cost is its bodies'; it has no alternative to be weighed against.
            | Op::Region(_)
            | Op::GetResult { .. }
            | Op::Gather(_)
            | Op::Scatter(_) => bytes + numel,
            | Op::Cumulative { .. }
            | Op::Rev { .. } => bytes + numel,
            // A comparison sort: n log n comparisons per lane, over every element.
            Op::Sort { .. } => bytes + numel * (numel.max(2.0)).log2(),
            // A multiply-add per result element and kernel element it reads (as dot's).
            Op::Conv(_) | Op::ReduceWindow { .. } => {
                let k: f64 = enode
                    .children()
                    .get(1)
                    .and_then(|&c| self.egraph[c].data.ty.clone())
                    .map_or(1.0, |t| t.numel() as f64 / t.dims().first().map_or(1, |&d| d.max(1)) as f64);
                bytes + 2.0 * numel * k
            }
        };
        own + children
    }
}

/// Builds the rules once per process ahead of the first `simplify` (parsing every pattern and
/// compiling its matcher; `tessera` runs this in the background while it traces the first
/// program). `simplify` builds them itself when this has not run.
pub fn prepare() {
    let _ = rules::all();
}

/// Simplifies `g` (see the module doc).
pub fn simplify(g: &Graph, limits: Limits) -> Result<(Graph, Report), String> {
    // egg times its iterations with `quanta`, whose first reading of the clock in a process
    // calibrates the TSC by busy-waiting (at least 500 rounds of 1 us; measured 0.5-4 ms of the
    // first jit call). The limits are counts (below), so egg's clock is frozen instead: its
    // time limit never fires and its per-iteration times read zero.
    let (frozen, _) = quanta::Clock::mock();
    quanta::with_clock(&frozen, || simplify_counted(g, limits))
}

fn simplify_counted(g: &Graph, limits: Limits) -> Result<(Graph, Report), String> {
    tessera_ir::verify(g).map_err(|e| format!("the input graph is malformed: {e}"))?;
    let mut egraph = EGraph::new(TensorAnalysis::new(g.mesh.clone()));
    // Each node's e-class, by node index (`topo_order` fills a node's operands first).
    let mut class_of: Vec<Option<Id>> = vec![None; g.node_bound()];
    let class = |class_of: &[Option<Id>], o: NodeId| {
        class_of[o.index()].expect("topo_order gives a node after its operands")
    };
    let mut locs: HashMap<Node, &str> = HashMap::with_capacity(g.node_count());
    for id in g.topo_order() {
        let node = g.node(id);
        let children: Vec<Id> = g
            .operands(id)
            .iter()
            .map(|&o| class(&class_of, o))
            .collect();
        let mut op = node.op.clone();
        if let Op::Region(r) = &mut op {
            // Each body is simplified as a function of its own: its parameters and outputs
            // stay, so the region still fits its operands. Nothing crosses the boundary: a
            // value inside is never merged with one outside.
            for body in r.regions_mut() {
                let (simple, _) = simplify(body, limits)?;
                *body = simple;
            }
        }
        let n = Node::new(
            op,
            children,
            matches!(node.op, Op::Parameter(_)).then(|| node.ty.clone()),
        );
        if let Some(l) = &node.loc {
            locs.insert(n.clone(), l.as_str());
        }
        class_of[id.index()] = Some(egraph.add(n));
    }
    let roots: Vec<Id> = g.outputs().iter().map(|&o| class(&class_of, o)).collect();
    let size = egraph.total_size();
    let (egraph, iterations, stop) = if size > limits.nodes {
        // egg would stop before its first search; say why in the report.
        egraph.rebuild();
        let why = format!(
            "NodeLimit({size}): the program alone exceeds the node limit ({}), so no rewrite \
             ran (hash-consing CSE and DCE only)",
            limits.nodes
        );
        (egraph, 0, why)
    } else {
        let runner: Runner<Node, TensorAnalysis, ()> =
            Runner::new(TensorAnalysis::new(g.mesh.clone()))
                .with_egraph(egraph)
                .with_iter_limit(limits.iterations)
                .with_node_limit(limits.nodes)
                // Limits are counts only: a wall clock would make the output depend on load.
                .with_time_limit(Duration::from_secs(u64::MAX / 4))
                .run(rules::all());
        let stop = runner
            .stop_reason
            .as_ref()
            .map_or("none".to_string(), |r| format!("{r:?}"));
        (runner.egraph, runner.iterations.len(), stop)
    };
    let extractor = Extractor::new(&egraph, Cost { egraph: &egraph });
    let mut out = Graph::with_capacity(g.name.clone(), g.node_count());
    out.mesh = g.mesh.clone();
    let mut built: HashMap<Id, NodeId> = HashMap::with_capacity(g.node_count());
    for &p in g.params() {
        let np = out.add_param(g.ty(p).clone());
        out.node_mut(np).loc = g.node(p).loc.clone();
        out.node_mut(np).sharding = g.node(p).sharding.clone();
        built.insert(egraph.find(class(&class_of, p)), np);
    }
    // Locations were recorded under the original children ids; map them to canonical ones.
    let locs_canon: HashMap<Node, &str> = locs
        .into_iter()
        .map(|(n, l)| (n.map_children(|c| egraph.find(c)), l))
        .collect();
    // Rebuild the cheapest program, sharing each class's node (a DAG, not a tree). An explicit
    // post-order walk (no recursion): a class is built once all its children are, so a chain
    // of any depth rebuilds on a small stack.
    let mut outputs = Vec::new();
    let mut in_progress: HashSet<Id> = HashSet::new();
    for r in roots {
        let root = egraph.find(r);
        // (class, whether its children have been pushed)
        let mut stack: Vec<(Id, bool)> = vec![(root, false)];
        while let Some((class, expanded)) = stack.pop() {
            if built.contains_key(&class) {
                continue;
            }
            let node = extractor.find_best_node(class);
            if !expanded {
                // A class whose children are being built is an ancestor of itself.
                if !in_progress.insert(class) {
                    return Err(format!(
                        "extraction: the cheapest {} depends on itself (a cycle)",
                        node.op.name()
                    ));
                }
                stack.push((class, true));
                for &c in node.children().iter().rev() {
                    let c = egraph.find(c);
                    if !built.contains_key(&c) {
                        stack.push((c, false));
                    }
                }
                continue;
            }
            let args: Vec<NodeId> = node
                .children()
                .iter()
                .map(|&c| built[&egraph.find(c)])
                .collect();
            let id = out
                .add(Op::clone(&node.op), &args)
                .map_err(|e| format!("extraction built an ill-typed node: {e}"))?;
            out.node_mut(id).loc = locs_canon.get(node).map(|l| l.to_string());
            built.insert(class, id);
            in_progress.remove(&class);
        }
        outputs.push(built[&root]);
    }
    out.set_outputs(outputs);
    out.remove_dead();
    tessera_ir::verify(&out).map_err(|e| format!("simplified program: {e}"))?;
    let report = Report {
        nodes_before: g.node_count(),
        nodes_after: out.node_count(),
        iterations,
        egraph_nodes: egraph.total_number_of_nodes(),
        stop_reason: stop,
    };
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{BinaryOp, DType, Literal, TensorType};

    /// `x * 1` over and over: the rules remove every multiply, unless the program is larger
    /// than the node limit, where only CSE runs and the report says so.
    fn times_one(n: usize) -> Graph {
        let ty = TensorType::new(DType::F32, vec![4]);
        let mut g = Graph::new("times_one");
        let mut y = g.add_param(ty.clone());
        for _ in 0..n {
            let one = g.add(Op::Constant(Literal::splat(&ty, 1.0)), &[]).unwrap();
            y = g.add(Op::Binary(BinaryOp::Mul), &[y, one]).unwrap();
        }
        g.set_outputs(vec![y]);
        g
    }

    /// Equal ops on equal operands are one node; an op with other integer attributes (a
    /// broadcast to another shape) is another; NaN constants of one type are one (compared
    /// as text).
    #[test]
    fn nodes_are_merged_by_op_attributes_and_operands() {
        use tessera_ir::Shape;
        let ty = TensorType::new(DType::F32, vec![3]);
        let mut g = Graph::new("f");
        let x = g.add_param(ty.clone());
        let broadcast = |shape: Vec<usize>, dims: Vec<usize>| Op::BroadcastInDim {
            shape: Shape::new(shape),
            dims,
        };
        let a = g.add(broadcast(vec![2, 3], vec![1]), &[x]).unwrap();
        let b = g.add(broadcast(vec![2, 3], vec![1]), &[x]).unwrap();
        let c = g.add(broadcast(vec![3, 2], vec![0]), &[x]).unwrap();
        let t = g.add(Op::Transpose(vec![1, 0]), &[a]).unwrap();
        let nan = |g: &mut Graph| {
            g.add(Op::Constant(Literal::splat(&ty, f64::NAN)), &[])
                .unwrap()
        };
        let (n1, n2) = (nan(&mut g), nan(&mut g));
        let s = g.add(Op::Binary(BinaryOp::Add), &[n1, n2]).unwrap();
        g.set_outputs(vec![a, b, c, t, s]);
        let (out, _) = simplify(&g, Limits::default()).unwrap();
        let o = out.outputs();
        assert_eq!(o[0], o[1], "equal broadcasts are one node");
        assert_ne!(o[0], o[2], "a broadcast to another shape is another node");
        let add = out.operands(o[4]);
        assert_eq!(add[0], add[1], "NaN constants of one type are one node");
    }

    /// Slices of one value at different offsets hash apart (an unrolled loop's many slices of
    /// one value would otherwise share one hash and be compared pairwise), equal ones alike.
    #[test]
    fn ops_with_attributes_hash_by_them() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let slice = |start: usize| {
            let op = Op::Slice {
                start: vec![start],
                limit: vec![start + 1],
                stride: vec![1],
            };
            Node::new(op, vec![Id::from(0usize)], None)
        };
        let hash = |n: &Node| {
            BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(n)
        };
        assert_eq!(hash(&slice(3)), hash(&slice(3)));
        assert_eq!(slice(3), slice(3));
        assert_ne!(slice(3), slice(4));
        let distinct: HashSet<u64> = (0..100).map(|k| hash(&slice(k))).collect();
        assert_eq!(distinct.len(), 100);
    }

    /// Nodes compare equal exactly when they order equal (egg keeps both views of them): a
    /// gather's fill is a float, so gathers filling NaNs of different bits (which print
    /// alike) must not be equal by their attributes and equal by their text.
    #[test]
    fn equality_and_order_agree_for_nan_filled_gathers() {
        use tessera_ir::{GatherDims, IndexMode};
        let gather = |fill: f64| {
            let dims = GatherDims {
                offset_dims: vec![],
                collapsed_slice_dims: vec![0],
                start_index_map: vec![0],
                operand_batching_dims: vec![],
                start_indices_batching_dims: vec![],
                index_vector_dim: 1,
                slice_sizes: vec![1],
                mode: IndexMode::Fill,
                fill,
            };
            Node::new(
                Op::Gather(Box::new(dims)),
                vec![Id::from(0usize), Id::from(1usize)],
                None,
            )
        };
        let quiet = f64::NAN;
        let payload = f64::from_bits(f64::NAN.to_bits() | 1);
        assert_ne!(quiet.to_bits(), payload.to_bits());
        for (a, b) in [
            (gather(quiet), gather(payload)),
            (gather(quiet), gather(quiet)),
            (gather(1.0), gather(2.0)),
            (gather(0.0), gather(-0.0)),
        ] {
            assert_eq!(
                a == b,
                a.cmp(&b) == std::cmp::Ordering::Equal,
                "{:?} against {:?}",
                a.op,
                b.op
            );
        }
        assert_eq!(gather(quiet), gather(quiet), "a NaN fill equals itself");
    }

    #[test]
    fn a_program_over_the_node_limit_is_only_deduplicated_and_the_report_says_so() {
        let g = times_one(10);
        let (small, report) = simplify(&g, Limits::default()).unwrap();
        assert_eq!(small.node_count(), 1, "{report}");
        let limits = Limits {
            nodes: 8,
            ..Limits::default()
        };
        let (big, report) = simplify(&g, limits).unwrap();
        // The ten constants are one; the ten multiplies stay.
        assert_eq!(big.node_count(), 12, "{report}");
        assert_eq!(report.iterations, 0);
        assert!(
            report.stop_reason.contains("exceeds the node limit (8)"),
            "{report}"
        );
    }

    /// Rebuilding the extracted program is a loop: a 20,000-deep chain needs no stack.
    #[test]
    fn a_deep_chain_rebuilds_on_a_small_stack() {
        let g = times_one(20_000);
        let out = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || simplify(&g, Limits::default()).unwrap().0.node_count())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(out, 20_000 + 2);
    }

    /// egg's own passes (search, union, rebuild, extraction) are loops too: rewrites that
    /// shorten a 900-deep chain to nothing run on a 64 KiB stack. (Fewer than egg's 1,000
    /// matches per rule and iteration, above which its scheduler bans a rule for a while.)
    #[test]
    fn rewrites_run_on_a_deep_chain_on_a_small_stack() {
        let g = times_one(900);
        let (n, report) = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let (out, report) = simplify(&g, Limits::default()).unwrap();
                (out.node_count(), report)
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(report.iterations > 0, "{report}");
        assert_eq!(n, 1, "{report}");
    }
}
