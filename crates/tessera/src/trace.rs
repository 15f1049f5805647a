//! The tracer: records ops on tracer tensors into a graph.
//!
//! Traces nest (a `grad` inside a `jit`, a `grad` of a `grad`); each has an id, larger for inner
//! traces, and a thread-local stack holds the live ones. An op goes to the innermost trace among
//! its operands; operands from outside that trace are lifted into it: a concrete tensor becomes
//! a `constant`, a tracer of an enclosing trace becomes an extra parameter (a capture) whose
//! outer value the caller supplies. Ops whose operands are all concrete run eagerly.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::Location;
use std::rc::Rc;

use tessera_interp::eval_op;
use tessera_ir::{Graph, Literal, Mesh, NodeId, Op, RegionOp, Sharding, TensorType};
use tessera_runtime::Array;
use tessera_shard::explicit::{self, Typed};

use crate::error::{Error, loc_text, raise};
use crate::tensor::{Repr, Tensor, Tracer};

/// One trace being recorded.
pub(crate) struct TraceState {
    /// Unique in the process (traces on different threads never share an id).
    pub(crate) id: u64,
    /// The thread recording this trace: its tracers are usable only there.
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) graph: RefCell<Graph>,
    /// Outer values captured as extra parameters, in parameter order after the declared inputs.
    captures: RefCell<Vec<Tensor>>,
    /// Parameter node of each captured outer tracer, keyed by (trace id, node).
    capture_nodes: RefCell<HashMap<(u64, NodeId), NodeId>>,
    /// Constant node of each captured concrete buffer; the tensor keeps the buffer alive so its
    /// address is not reused while the trace runs.
    constants: RefCell<HashMap<usize, (NodeId, Tensor)>>,
}

thread_local! {
    /// Inside `lenient`: ops replayed from a program the compiler built (a VJP, a batched
    /// shard_map body) whose Explicit rule has no answer are typed replicated instead of
    /// failing: their values are right in any sharding, and the user's own ops were typed
    /// strictly when they were traced.
    static LENIENT: Cell<usize> = const { Cell::new(0) };
    static STACK: RefCell<Vec<Rc<TraceState>>> = const { RefCell::new(Vec::new()) };
}

/// The next trace id, shared by all threads so that an id names one trace in the process.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// True while any trace is being recorded on this thread.
pub(crate) fn any_active() -> bool {
    STACK.with(|s| !s.borrow().is_empty())
}

fn is_live(id: u64) -> bool {
    STACK.with(|s| s.borrow().iter().any(|t| t.id == id))
}

/// The live state of a tracer's trace: `None` when that trace has ended or runs on another
/// thread.
fn live(tr: &Tracer) -> Option<Rc<TraceState>> {
    STACK.with(|s| s.borrow().iter().rev().find(|t| t.id == tr.trace).cloned())
}

/// Pops its trace when dropped, also when the user's closure unwinds.
pub(crate) struct TraceGuard {
    pub(crate) state: Rc<TraceState>,
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(pos) = s.iter().rposition(|t| t.id == self.state.id) {
                s.remove(pos);
            }
        });
    }
}

/// The mesh of the innermost live trace: collectives by axis name are typed against it.
pub(crate) fn current_mesh() -> Option<Mesh> {
    STACK.with(|s| {
        s.borrow()
            .last()
            .and_then(|t| t.graph.borrow().mesh.clone())
    })
}

/// Starts a trace of a function with parameters of the given types, returning the guard and
/// one tracer per parameter. The trace inherits the mesh of the trace it is nested in.
pub(crate) fn begin(name: &str, params: &[TensorType]) -> (TraceGuard, Vec<Tensor>) {
    begin_on(name, params, current_mesh())
}

/// `begin` with an explicit mesh (pmap's).
pub(crate) fn begin_on(
    name: &str,
    params: &[TensorType],
    mesh: Option<Mesh>,
) -> (TraceGuard, Vec<Tensor>) {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Room for a small program's nodes (a training step traces dozens to hundreds).
    let mut graph = Graph::with_capacity(name, 64);
    graph.mesh = mesh;
    let nodes: Vec<NodeId> = params.iter().map(|t| graph.add_param(t.clone())).collect();
    let state = Rc::new(TraceState {
        id,
        thread: std::thread::current().id(),
        graph: RefCell::new(graph),
        captures: RefCell::new(Vec::new()),
        capture_nodes: RefCell::new(HashMap::new()),
        constants: RefCell::new(HashMap::new()),
    });
    STACK.with(|s| s.borrow_mut().push(state.clone()));
    let tracers = nodes
        .into_iter()
        .zip(params)
        .map(|(node, ty)| Tensor::traced(state.clone(), node, ty.clone()))
        .collect();
    (TraceGuard { state }, tracers)
}

/// A finished trace: the graph, and the outer values of its capture parameters.
pub(crate) struct Recorded {
    pub(crate) graph: Graph,
    pub(crate) captures: Vec<Tensor>,
}

/// Ends a trace, making `outputs` the graph's results.
#[track_caller]
pub(crate) fn finish(guard: TraceGuard, outputs: &[Tensor]) -> Recorded {
    let state = guard.state.clone();
    let nodes: Vec<NodeId> = outputs.iter().map(|t| lift(&state, t)).collect();
    drop(guard);
    let mut graph = state.graph.replace(Graph::new(""));
    graph.set_outputs(nodes);
    Recorded {
        graph,
        captures: state.captures.take(),
    }
}

/// The node that stands for `t` inside `trace`, lifting it in if it comes from outside.
#[track_caller]
pub(crate) fn lift(trace: &Rc<TraceState>, t: &Tensor) -> NodeId {
    match &t.repr {
        Repr::Traced(tr) if tr.trace == trace.id => tr.node,
        Repr::Traced(tr) => {
            if !is_live(tr.trace) {
                raise(escaped(tr));
            }
            let key = (tr.trace, tr.node);
            if let Some(&n) = trace.capture_nodes.borrow().get(&key) {
                return n;
            }
            let n = trace.graph.borrow_mut().add_param(tr.ty.clone());
            // On an Explicit mesh the capture keeps its type's sharding.
            trace.graph.borrow_mut().node_mut(n).sharding = typed_sharding(t);
            trace.capture_nodes.borrow_mut().insert(key, n);
            trace.captures.borrow_mut().push(t.clone());
            n
        }
        Repr::Concrete(a) => {
            if let Some((n, _)) = trace.constants.borrow().get(&a.buffer_id()) {
                return *n;
            }
            let n = trace
                .graph
                .borrow_mut()
                .add(Op::Constant(a.literal().clone()), &[])
                .expect("a constant always has a type");
            // On an Explicit mesh a closed-over placed array keeps its placement as its type.
            let explicit = trace
                .graph
                .borrow()
                .mesh
                .as_ref()
                .is_some_and(|m| m.is_explicit());
            if explicit
                && let Some(spec) = a.spec()
                && trace.graph.borrow().mesh.as_ref() == Some(&spec.mesh)
            {
                trace.graph.borrow_mut().node_mut(n).sharding =
                    Some(Sharding::closed(&spec.mesh, &spec.dims));
            }
            trace
                .constants
                .borrow_mut()
                .insert(a.buffer_id(), (n, t.clone()));
            n
        }
    }
}

#[track_caller]
fn escaped(tr: &Tracer) -> Error {
    let ty = &tr.ty;
    let message = if tr.thread != std::thread::current().id() {
        format!(
            "a tracer of type {ty} was used on another thread than the one tracing it (tracers \
             are bound to their trace's thread; send concrete tensors between threads)"
        )
    } else {
        format!(
            "a tracer of type {ty} was used after the trace that made it ended (it escaped its \
             jit or grad, e.g. stored in a variable outside the closure)"
        )
    };
    Error::Op {
        op: "trace".into(),
        message,
        location: loc_text(Location::caller()),
    }
}

/// The innermost live trace among `operands`, if any of them is a tracer.
#[track_caller]
pub(crate) fn innermost(operands: &[&Tensor]) -> Option<Rc<TraceState>> {
    let mut best: Option<&Tracer> = None;
    for t in operands {
        if let Repr::Traced(tr) = &t.repr {
            if !is_live(tr.trace) {
                raise(escaped(tr));
            }
            if best.is_none_or(|b| tr.trace > b.trace) {
                best = Some(tr);
            }
        }
    }
    best.and_then(live)
}

/// Lifts every operand into the innermost trace among them, so that later ops (a broadcast of a
/// scalar, say) are recorded rather than run eagerly on a constant.
#[track_caller]
pub(crate) fn join(operands: &[&Tensor]) -> Vec<Tensor> {
    match innermost(operands) {
        None => operands.iter().map(|t| (*t).clone()).collect(),
        Some(trace) => operands
            .iter()
            .map(|t| {
                let node = lift(&trace, t);
                let ty = trace.graph.borrow().ty(node).clone();
                Tensor::traced(trace.clone(), node, ty).with_weak(t.weak)
            })
            .collect(),
    }
}

/// Applies a primitive: records it in the innermost trace of its operands, or runs it at once
/// when they are all concrete. A type error names the op, the operand types and the caller.
#[track_caller]
pub(crate) fn apply(op: Op, operands: &[&Tensor]) -> Tensor {
    apply_at(op, operands, loc_text(Location::caller()))
}

/// `apply` with an explicit location (replaying a graph keeps each node's own).
pub(crate) fn apply_at(op: Op, operands: &[&Tensor], location: String) -> Tensor {
    // A collective always belongs to the innermost trace (the pmap it is written in), even on
    // constants or (axis_index) with no operands at all.
    let trace = innermost(operands).or_else(|| {
        if op.is_collective() {
            STACK.with(|s| s.borrow().last().cloned())
        } else {
            None
        }
    });
    apply_in(trace, op, operands, location)
}

/// `apply_at`, except that an op none of whose operands is traced goes into the innermost
/// active trace when there is one (JAX's omnistaging) instead of being evaluated. How `grad`
/// replays its derivative into the `jit` around it: a constant the derivative builds (the 1
/// of tanh's `1 - y^2`, broadcast to `y`'s shape) stays a scalar and a broadcast in the
/// program, instead of a literal of `y`'s size evaluated by the interpreter at trace time
/// (the big MLP step's trace: 16.8 ms, most of it materializing two f32[512,1024] ones).
/// Without an active trace (an eager `grad`) it evaluates, as `apply_at` does.
pub(crate) fn apply_staged(op: Op, operands: &[&Tensor], location: String) -> Tensor {
    let trace = innermost(operands).or_else(|| STACK.with(|s| s.borrow().last().cloned()));
    apply_in(trace, op, operands, location)
}

fn apply_in(
    trace: Option<Rc<TraceState>>,
    op: Op,
    operands: &[&Tensor],
    location: String,
) -> Tensor {
    match trace {
        None => {
            let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
            let ty = match op.infer_type(&types, None) {
                Ok(ty) => ty,
                Err(error) => raise(Error::Type { error, location }),
            };
            let literals: Vec<&Literal> = operands
                .iter()
                .map(|t| match &t.repr {
                    Repr::Concrete(a) => a.literal(),
                    Repr::Traced(_) => unreachable!("no tracer among eager operands"),
                })
                .collect();
            match eval_op(&op, &literals, &ty) {
                Ok(value) => Tensor::from_array(Array::new(value)),
                Err(e) => raise(Error::Op {
                    op: op.name().into(),
                    message: e.to_string(),
                    location,
                }),
            }
        }
        Some(trace) => {
            let nodes: Vec<NodeId> = operands.iter().map(|t| lift(&trace, t)).collect();
            let mut graph = trace.graph.borrow_mut();
            let node = match graph.add(op, &nodes) {
                Ok(node) => node,
                Err(error) => {
                    drop(graph);
                    raise(Error::Type { error, location })
                }
            };
            graph.node_mut(node).loc = Some(location.clone());
            if let Err(message) = type_node(&mut graph, node) {
                let name = graph.op(node).name().to_string();
                drop(graph);
                raise(Error::Op {
                    op: name,
                    message,
                    location,
                })
            }
            let ty = graph.ty(node).clone();
            drop(graph);
            Tensor::traced(trace, node, ty)
        }
    }
}

/// The Explicit-mode type of node `o` of a trace's graph: its annotation over the Explicit axes
/// (on a mesh that mixes axis types, a type holds those only), a constant's replicated, or
/// `None` for a value of no known type (a body's parameter).
fn operand_type(graph: &Graph, o: NodeId, mesh: &Mesh) -> Option<Typed> {
    match (&graph.node(o).sharding, graph.op(o)) {
        (Some(s), _) => {
            let mut t = Typed::from_sharding(s);
            t.spec = explicit::explicit_only(mesh, &t.spec);
            Some(t)
        }
        (None, Op::Constant(_)) => Some(Typed::replicated(graph.ty(o).rank())),
        (None, _) => None,
    }
}

/// Runs `f` with the Explicit rules lenient (see `LENIENT`), also when it unwinds.
pub(crate) fn lenient<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            LENIENT.with(|c| c.set(c.get() - 1));
        }
    }
    LENIENT.with(|c| c.set(c.get() + 1));
    let _restore = Restore;
    f()
}

/// On a trace whose mesh has Explicit axes, the type rule of the node just added
/// (`tessera_shard::explicit::rule`): its sharding annotated, or the rule's error. A node with
/// an operand of no known type (a parameter of a body or of a transformation's trace, typed
/// later by the pass `type_graph`) stays untyped.
fn type_node(graph: &mut Graph, node: NodeId) -> Result<(), String> {
    let Some(mesh) = graph.mesh.clone().filter(|m| m.is_explicit()) else {
        return Ok(());
    };
    let Some(typed) = graph
        .operands(node)
        .into_iter()
        .map(|o| operand_type(graph, o, &mesh))
        .collect::<Option<Vec<Typed>>>()
    else {
        return Ok(());
    };
    let operands: Vec<(&TensorType, &Typed)> = graph
        .operands(node)
        .iter()
        .zip(&typed)
        .map(|(&o, t)| (graph.ty(o), t))
        .collect();
    let t = match explicit::rule(&mesh, graph.op(node), &operands, graph.ty(node)) {
        Ok(t) => t,
        Err(_) if LENIENT.with(|c| c.get()) > 0 => Typed::replicated(graph.ty(node).rank()),
        Err(e) => return Err(e),
    };
    graph.node_mut(node).sharding = Some(t.sharding(&mesh));
    Ok(())
}

/// The Explicit-mode sharding of a tensor: a tracer's annotation, a placed array's spec on the
/// trace's mesh, `None` for an untyped tracer or a host value.
pub(crate) fn typed_sharding(t: &Tensor) -> Option<Sharding> {
    match &t.repr {
        // An escaped tracer's trace has ended (its graph is gone): no type.
        Repr::Traced(tr) => live(tr)?.graph.borrow().node(tr.node).sharding.clone(),
        Repr::Concrete(a) => {
            let spec = a.spec()?;
            Some(Sharding::closed(&spec.mesh, &spec.dims))
        }
    }
}

/// The mesh of a tracer's own trace (`None` for a concrete tensor or an escaped tracer).
pub(crate) fn mesh_of(t: &Tensor) -> Option<Mesh> {
    match &t.repr {
        Repr::Traced(tr) => live(tr)?.graph.borrow().mesh.clone(),
        Repr::Concrete(_) => None,
    }
}

/// Annotates the parameters of the trace `guard` records with `shardings` (an Explicit-mode
/// trace's input types).
pub(crate) fn type_params(guard: &TraceGuard, shardings: &[Option<Sharding>]) {
    let mut g = guard.state.graph.borrow_mut();
    if !g.mesh.as_ref().is_some_and(|m| m.is_explicit()) {
        return;
    }
    let params = g.params().to_vec();
    for (p, s) in params.iter().zip(shardings) {
        g.node_mut(*p).sharding = s.clone();
    }
}

/// Applies a region op: records it (and one `get_result` per result) in the innermost trace
/// of its operands, or runs it at once (the interpreter) when they are all concrete. Returns
/// its results.
pub(crate) fn apply_region(r: RegionOp, operands: &[&Tensor], location: String) -> Vec<Tensor> {
    let has_collectives = r.regions().iter().any(|(_, b)| {
        b.node_ids()
            .any(|id| b.op(id).is_collective() || matches!(b.op(id), Op::Region(_)))
    });
    let trace = innermost(operands).or_else(|| {
        if has_collectives {
            STACK.with(|s| s.borrow().last().cloned())
        } else {
            None
        }
    });
    match trace {
        None => {
            let literals: Vec<&Literal> = operands
                .iter()
                .map(|t| match &t.repr {
                    Repr::Concrete(a) => a.literal(),
                    Repr::Traced(_) => unreachable!("no tracer among eager operands"),
                })
                .collect();
            match tessera_interp::run_region(&r, &literals, &tessera_interp::SingleDevice) {
                Ok(values) => values
                    .into_iter()
                    .map(|v| Tensor::from_array(Array::new(v)))
                    .collect(),
                Err(e) => raise(Error::Op {
                    op: r.name().into(),
                    message: e.to_string(),
                    location,
                }),
            }
        }
        Some(trace) => {
            let nodes: Vec<NodeId> = operands.iter().map(|t| lift(&trace, t)).collect();
            let mut graph = trace.graph.borrow_mut();
            let added = graph.add(Op::Region(Box::new(r)), &nodes).and_then(|node| {
                let results = graph.add_results(node)?;
                Ok((node, results))
            });
            let (node, results) = match added {
                Ok(v) => v,
                Err(error) => {
                    drop(graph);
                    raise(Error::Type { error, location })
                }
            };
            graph.node_mut(node).loc = Some(location.clone());
            if let Some(mesh) = graph.mesh.clone().filter(|m| m.is_explicit()) {
                let typed: Option<Vec<Typed>> = nodes
                    .iter()
                    .map(|&o| operand_type(&graph, o, &mesh))
                    .collect();
                if let Some(typed) = typed {
                    let Op::Region(r) = graph.op(node) else {
                        unreachable!("just added as a region")
                    };
                    match explicit::region_results(&mesh, r, &typed) {
                        Ok(ts) => {
                            for (&n, t) in results.iter().zip(&ts) {
                                graph.node_mut(n).sharding = Some(t.sharding(&mesh));
                            }
                        }
                        // Replaying a compiler-built program: leave the results untyped.
                        Err(_) if LENIENT.with(|c| c.get()) > 0 => {}
                        Err(message) => {
                            let name = graph.op(node).name().to_string();
                            drop(graph);
                            raise(Error::Op {
                                op: name,
                                message,
                                location,
                            })
                        }
                    }
                }
            }
            let out: Vec<(NodeId, TensorType)> = results
                .iter()
                .map(|&n| {
                    graph.node_mut(n).loc = Some(location.clone());
                    (n, graph.ty(n).clone())
                })
                .collect();
            drop(graph);
            out.into_iter()
                .map(|(n, ty)| Tensor::traced(trace.clone(), n, ty))
                .collect()
        }
    }
}

impl Tracer {
    pub(crate) fn trace_id(&self) -> u64 {
        self.trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::DType;

    /// A tracer of an enclosing trace used in an inner trace becomes a capture parameter of the
    /// inner graph, once however often it is used; concrete values become constants.
    #[test]
    fn inner_trace_captures_outer_tracers() {
        let ty = TensorType::new(DType::F32, vec![3]);
        let (outer, xs) = begin("outer", std::slice::from_ref(&ty));
        let x = &xs[0];
        let (inner, ys) = begin("inner", std::slice::from_ref(&ty));
        let y = &ys[0];
        let a = y * x;
        let b = &a + x;
        let c = &b * 2.0;
        let rec = finish(inner, &[c]);
        assert_eq!(
            rec.graph.params().len(),
            2,
            "the declared input and one capture"
        );
        assert_eq!(rec.captures.len(), 1);
        assert!(matches!(&rec.captures[0].repr, Repr::Traced(t) if t.trace == outer.state.id));
        let text = tessera_ir::print(&rec.graph);
        assert!(text.contains("constant 2.0 : f32[]"), "{text}");
        tessera_ir::verify(&rec.graph).unwrap();
        let outer_rec = finish(outer, std::slice::from_ref(x));
        assert_eq!(outer_rec.graph.node_count(), 1);
    }
}
