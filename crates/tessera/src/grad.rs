//! `grad`, `value_and_grad`, `vjp`: trace the function, run the autodiff pass on its graph, and
//! replay the result.
//!
//! The function is traced in a trace of its own (tracers of an enclosing trace that it closes
//! over become capture parameters). The autodiff pass appends the backward graph to that graph.
//! Replaying a graph applies its ops to `Tensor`s (`trace::apply_staged`): outside any trace
//! that runs them eagerly; inside one (a `grad` inside `jit`, or the inner `grad` of a `grad`
//! of a `grad`) it records them into the innermost active trace, even an op on constants only
//! (JAX's omnistaging), so the backward graph is appended to the enclosing program and a
//! constant it builds stays a scalar and a broadcast. As in JAX, a value replayed inside a
//! trace is a tracer there: reading it (`to_vec`) is an error, and it cannot escape the trace.
//! The forward part is replayed once; its values are kept as the residuals of the backward part.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::panic::Location;

use tessera_ir::{Graph, Literal, NodeId, Op, TensorType, verify};

use crate::error::{Error, catch, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::{self, apply_region, apply_staged};
use crate::tree::{self, Tree, TreeDef};

/// A function traced and differentiated, with its forward values computed.
struct Linearized {
    graph: Graph,
    /// Values of the forward nodes (concrete, or tracers of the enclosing trace).
    env: HashMap<NodeId, Tensor>,
    /// One cotangent parameter per differentiated output leaf.
    ct_params: Vec<NodeId>,
    /// The cotangent of each primal leaf, `None` where the outputs do not depend on it.
    grads: Vec<Option<NodeId>>,
    primals: Vec<Tensor>,
    /// The structure of the primal argument.
    pdef: TreeDef,
    location: String,
}

/// Applies every node of `order` not yet in `env`, in order.
pub(crate) fn replay(g: &Graph, order: &[NodeId], env: &mut HashMap<NodeId, Tensor>) {
    for &id in order {
        if env.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        let operands: Vec<Tensor> = g.operands(id).iter().map(|o| env[o].clone()).collect();
        let refs: Vec<&Tensor> = operands.iter().collect();
        let loc = node.loc.clone().unwrap_or_else(|| "grad".into());
        if let Op::Region(r) = &node.op {
            // A region's results are its `get_result` nodes' values; its own node has none.
            let results = apply_region((**r).clone(), &refs, loc);
            for user in g.users(id) {
                if let Op::GetResult { index, .. } = g.op(user) {
                    env.insert(user, results[*index].clone());
                }
            }
            env.insert(id, Tensor::from_literal(Literal::zeros(&node.ty)));
            continue;
        }
        env.insert(id, apply_staged(node.op.clone(), &refs, loc));
    }
}

/// Traces `f` at `primals`, differentiates its first `n_diff` output leaves with respect to the
/// primal leaves selected by `selected`, and replays the forward part.
fn linearize<P: Tree, O: Tree>(
    f: impl FnOnce(&P) -> O,
    primals: &P,
    selected: &[bool],
    n_diff: usize,
    location: String,
) -> (O, Linearized) {
    let (leaves, pdef) = tree::flatten(primals);
    let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
    for (t, &sel) in leaves.iter().zip(selected) {
        if sel && !t.dtype().is_float() {
            raise(Error::Op {
                op: "grad".into(),
                message: format!(
                    "cannot differentiate with respect to an input of type {}: gradients need \
                     f32 or f64 inputs",
                    t.ty()
                ),
                location,
            });
        }
    }
    let (guard, tracers) = trace::begin("vjp", &types);
    // On an Explicit mesh the function sees its inputs' types, shardings included.
    let mesh = trace::current_mesh().filter(|m| m.is_explicit());
    let shardings: Vec<_> = leaves
        .iter()
        .map(|t| {
            trace::typed_sharding(t).or_else(|| match &mesh {
                // A host value is the same on every device.
                Some(m) if !t.is_tracer() => {
                    Some(tessera_ir::Sharding::replicated(m.name.clone(), t.rank()))
                }
                _ => None,
            })
        })
        .collect();
    trace::type_params(&guard, &shardings);
    let p_tr: P = tree::unflatten(&pdef, tracers).unwrap_or_else(|e| raise(e));
    let out = match catch(|| f(&p_tr)) {
        Ok(out) => out,
        Err(e) => {
            drop(guard);
            raise(e)
        }
    };
    let (out_leaves, odef) = tree::flatten(&out);
    let rec = match catch(|| trace::finish(guard, &out_leaves)) {
        Ok(r) => r,
        Err(e) => raise(e),
    };
    let mut graph = rec.graph;
    let outputs = graph.outputs().to_vec();
    let diff_outputs: Vec<NodeId> = outputs
        .iter()
        .take(n_diff)
        .copied()
        .filter(|&o| graph.ty(o).dtype.is_float())
        .collect();
    let ct_params: Vec<NodeId> = diff_outputs
        .iter()
        .map(|&o| {
            let ty = graph.ty(o).clone();
            graph.add_param(ty)
        })
        .collect();
    let wrt: Vec<NodeId> = graph.params()[..leaves.len()]
        .iter()
        .zip(selected)
        .filter(|(_, s)| **s)
        .map(|(p, _)| *p)
        .collect();
    let grads_sel = tessera_autodiff::vjp(&mut graph, &diff_outputs, &ct_params, &wrt)
        .unwrap_or_else(|e| {
            raise(Error::Op {
                op: "grad".into(),
                message: e.to_string(),
                location: location.clone(),
            })
        });
    let mut sel_iter = grads_sel.into_iter();
    let grads: Vec<Option<NodeId>> = selected
        .iter()
        .map(|&s| if s { sel_iter.next().flatten() } else { None })
        .collect();
    let mut all_outputs = outputs.clone();
    all_outputs.extend(grads.iter().flatten());
    graph.set_outputs(all_outputs);
    if let Err(e) = verify(&graph) {
        raise(Error::Op {
            op: "grad".into(),
            message: format!("the differentiated program is malformed: {e}"),
            location,
        });
    }

    // Replay the forward part: every node that does not depend on a cotangent.
    let mut env: HashMap<NodeId, Tensor> = HashMap::with_capacity(graph.node_count());
    let params = graph.params().to_vec();
    for (p, t) in params.iter().zip(leaves.iter().chain(&rec.captures)) {
        env.insert(*p, t.clone());
    }
    let order = graph.topo_order();
    let backward = backward_nodes(&graph, &order, &ct_params);
    let forward: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|n| !backward.contains(n))
        .collect();
    replay(&graph, &forward, &mut env);
    let out_values: Vec<Tensor> = outputs.iter().map(|o| env[o].clone()).collect();
    let out = tree::unflatten(&odef, out_values).unwrap_or_else(|e| raise(e));
    let lin = Linearized {
        graph,
        env,
        ct_params,
        grads,
        primals: leaves,
        pdef,
        location,
    };
    (out, lin)
}

/// The nodes that depend on a cotangent parameter.
fn backward_nodes(g: &Graph, order: &[NodeId], cts: &[NodeId]) -> HashSet<NodeId> {
    let mut set: HashSet<NodeId> = cts.iter().copied().collect();
    for &id in order {
        if !matches!(g.op(id), Op::Parameter(_)) && g.operands(id).iter().any(|o| set.contains(o)) {
            set.insert(id);
        }
    }
    set
}

impl Linearized {
    /// The cotangent of every primal leaf, given one cotangent per differentiated output.
    fn backward(&self, cts: &[Tensor]) -> Vec<Tensor> {
        let mut env = self.env.clone();
        for (&p, ct) in self.ct_params.iter().zip(cts) {
            if ct.ty() != self.graph.ty(p) {
                raise(Error::Op {
                    op: "vjp".into(),
                    message: format!(
                        "the cotangent has type {}, the output it belongs to {}",
                        ct.ty(),
                        self.graph.ty(p)
                    ),
                    location: self.location.clone(),
                });
            }
            env.insert(p, ct.clone());
        }
        let order = self.graph.topo_order();
        let backward = backward_nodes(&self.graph, &order, &self.ct_params);
        let nodes: Vec<NodeId> = order.into_iter().filter(|n| backward.contains(n)).collect();
        // The backward program is the compiler's: typed leniently on an Explicit mesh.
        trace::lenient(|| replay(&self.graph, &nodes, &mut env));
        self.grads
            .iter()
            .zip(&self.primals)
            .map(|(g, p)| match g {
                Some(g) => env[g].clone(),
                None => p.zeros_like(),
            })
            .collect()
    }
}

/// A one-valued scalar of the output's dtype: the seed cotangent of `grad`.
fn seed(out: &Tensor, location: &str) -> Tensor {
    if out.rank() != 0 || !out.dtype().is_float() {
        raise(Error::Op {
            op: "grad".into(),
            message: format!(
                "grad needs a function with a scalar float output, this one returns {}",
                out.ty()
            ),
            location: location.into(),
        });
    }
    out.scalar_like(1.0)
}

fn all_selected<P: Tree>(p: &P) -> Vec<bool> {
    vec![true; tree::leaves(p).len()]
}

/// `jax.value_and_grad`: `value_and_grad(f)(&p)` is `(f(p), df/dp)`, the gradient shaped like
/// `p`. `f` returns a float scalar; any other output panics (or fails the enclosing trace).
///
/// ```
/// use tessera::prelude::*;
///
/// let f = value_and_grad(|x: &Tensor| x.sin().sum());
/// let (v, g) = f(&Tensor::zeros([2]));
/// assert_eq!(v.item::<f32>(), 0.0);
/// assert_eq!(g.to_vec::<f32>(), vec![1.0, 1.0]); // cos(0)
/// ```
#[track_caller]
pub fn value_and_grad<P: Tree, F: Fn(&P) -> Tensor>(f: F) -> impl Fn(&P) -> (Tensor, P) {
    let location = loc_text(Location::caller());
    move |p: &P| {
        let (out, lin) = linearize(&f, p, &all_selected(p), 1, location.clone());
        let g = lin.backward(&[seed(&out, &location)]);
        (out, unflatten_like(p, g, &location))
    }
}

/// `jax.grad`: the gradient of a scalar function, shaped like its argument (any tree). `f`
/// returns a float scalar; any other output panics (or fails the enclosing trace).
///
/// ```
/// use tessera::prelude::*;
///
/// let g = grad(|x: &Tensor| (x * x).sum())(&Tensor::from_vec(vec![1.0f32, -2.0], [2]));
/// assert_eq!(g.to_vec::<f32>(), vec![2.0, -4.0]);
/// // A tree argument gets a gradient of the same structure.
/// let p = (Tensor::ones([2]), Tensor::zeros([]));
/// let (gw, gb) = grad(|(w, b): &(Tensor, Tensor)| (w * 3.0 + b).sum())(&p);
/// assert_eq!((gw.to_vec::<f32>(), gb.item::<f32>()), (vec![3.0, 3.0], 2.0));
/// ```
#[track_caller]
pub fn grad<P: Tree, F: Fn(&P) -> Tensor>(f: F) -> impl Fn(&P) -> P {
    let vg = value_and_grad(f);
    move |p: &P| vg(p).1
}

/// `value_and_grad(f, has_aux=True)`: `f` returns `(loss, aux)`; the result is
/// `((loss, aux), gradient)`.
#[track_caller]
pub fn value_and_grad_with_aux<P: Tree, A: Tree, F: Fn(&P) -> (Tensor, A)>(
    f: F,
) -> impl Fn(&P) -> ((Tensor, A), P) {
    let location = loc_text(Location::caller());
    move |p: &P| {
        let (out, lin) = linearize(&f, p, &all_selected(p), 1, location.clone());
        let g = lin.backward(&[seed(&out.0, &location)]);
        (out, unflatten_like(p, g, &location))
    }
}

/// `value_and_grad(f, argnums=...)`: `p` is a tuple or struct tree, and only its top-level
/// children at `argnums` are differentiated; the others are held constant and their entries of
/// the returned gradient are zeros.
#[track_caller]
pub fn value_and_grad_argnums<P: Tree, F: Fn(&P) -> Tensor>(
    f: F,
    argnums: &[usize],
) -> impl Fn(&P) -> (Tensor, P) {
    let location = loc_text(Location::caller());
    let argnums = argnums.to_vec();
    move |p: &P| {
        let (_, def) = tree::flatten(p);
        let selected = match &def {
            TreeDef::Node { children, .. } => {
                if let Some(&bad) = argnums.iter().find(|&&a| a >= children.len()) {
                    raise(Error::Op {
                        op: "grad".into(),
                        message: format!(
                            "argnums names argument {bad}, the argument {} has {}",
                            def.describe(),
                            children.len()
                        ),
                        location: location.clone(),
                    });
                }
                children
                    .iter()
                    .enumerate()
                    .flat_map(|(i, c)| vec![argnums.contains(&i); c.num_leaves()])
                    .collect()
            }
            TreeDef::Leaf => vec![argnums.contains(&0)],
            TreeDef::Static(_) => vec![],
        };
        let (out, lin) = linearize(&f, p, &selected, 1, location.clone());
        let g = lin.backward(&[seed(&out, &location)]);
        (out, unflatten_like(p, g, &location))
    }
}

fn unflatten_like<P: Tree>(p: &P, leaves: Vec<Tensor>, location: &str) -> P {
    let (_, def) = tree::flatten(p);
    tree::unflatten(&def, leaves).unwrap_or_else(|e| {
        raise(Error::Op {
            op: "grad".into(),
            message: e.to_string(),
            location: location.into(),
        })
    })
}

/// The pullback returned by `vjp`: maps a cotangent of the outputs to one of the inputs.
pub struct Vjp<P, O> {
    lin: Linearized,
    out_def: TreeDef,
    _types: PhantomData<fn(O) -> P>,
}

impl<P: Tree, O: Tree> Vjp<P, O> {
    /// The cotangent of the inputs for the cotangent `ct` of the outputs (same structure as the
    /// outputs; entries for integer outputs are ignored).
    pub fn call(&self, ct: &O) -> P {
        let (cts, def) = tree::flatten(ct);
        if def != self.out_def {
            raise(Error::Tree {
                message: format!(
                    "the cotangent is {}, the outputs are {}",
                    def.describe(),
                    self.out_def.describe()
                ),
                location: self.lin.location.clone(),
            });
        }
        let float_cts: Vec<Tensor> = cts.into_iter().filter(|c| c.dtype().is_float()).collect();
        let g = self.lin.backward(&float_cts);
        tree::unflatten(&self.lin.pdef, g).unwrap_or_else(|e| raise(e))
    }
}

/// `jax.vjp`: returns `f(primals)` and its pullback; `f` may return any tree.
///
/// ```
/// use tessera::prelude::*;
///
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
/// let (y, pullback) = vjp(|x: &Tensor| x * x * 3.0, &x);
/// assert_eq!(y.to_vec::<f32>(), vec![3.0, 12.0]);
/// // The cotangent of x for the cotangent [1, 1] of y: 6x.
/// assert_eq!(pullback.call(&Tensor::ones([2])).to_vec::<f32>(), vec![6.0, 12.0]);
/// ```
#[track_caller]
pub fn vjp<P: Tree, O: Tree>(f: impl FnOnce(&P) -> O, primals: &P) -> (O, Vjp<P, O>) {
    let location = loc_text(Location::caller());
    let (out, lin) = linearize(f, primals, &all_selected(primals), usize::MAX, location);
    let (_, out_def) = tree::flatten(&out);
    (
        out,
        Vjp {
            lin,
            out_def,
            _types: PhantomData,
        },
    )
}
