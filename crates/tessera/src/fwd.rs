//! Forward mode and Jacobians: `jvp`, `linearize`, `jacfwd`, `jacrev`, `hessian`.
//!
//! As in `grad.rs`, the function is traced in a trace of its own, a pass of
//! `tessera_autodiff` appends the derivative to that graph, and the graph is replayed: eagerly
//! on concrete inputs, or into the enclosing trace (under `jit`, inside `grad`, or inside
//! another `jacfwd`/`jacrev`, which is how `hessian = jacfwd(jacrev(f))` works).
//!
//! Without `vmap`, a Jacobian is built from one derivative per basis vector: `jacfwd` traces
//! the function once, runs the forward-mode pass once with a tangent parameter, replays the
//! primal part once, then the tangent part once per input element (a one-hot tangent);
//! `jacrev` likewise with the reverse pass and one one-hot cotangent per output element. The
//! results are stacked into JAX's layout, `out.shape ++ in.shape`. Under `jit` each replay is
//! recorded, so the program grows linearly with the number of elements.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::panic::Location;

use tessera_ir::{Data, Graph, Literal, NodeId, Op, Shape, TensorType, verify};

use crate::error::{Error, catch, loc_text, raise};
use crate::grad::replay;
use crate::tensor::Tensor;
use crate::trace;
use crate::tree::{self, Tree, TreeDef};

/// A function traced at some primal values.
struct Traced {
    graph: Graph,
    /// The value of every parameter of `graph`: the primal leaves, then the captures.
    inputs: Vec<Tensor>,
    /// The structure of the result.
    odef: TreeDef,
}

/// Traces `f` at the leaves `leaves` (structure `pdef`).
fn trace_at<P: Tree, O: Tree>(
    f: impl FnOnce(&P) -> O,
    name: &str,
    leaves: &[Tensor],
    pdef: &TreeDef,
) -> Traced {
    let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
    let (guard, tracers) = trace::begin(name, &types);
    let p_tr: P = tree::unflatten(pdef, tracers).unwrap_or_else(|e| raise(e));
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
    let mut inputs = leaves.to_vec();
    inputs.extend(rec.captures);
    Traced {
        graph: rec.graph,
        inputs,
        odef,
    }
}

fn op_error(op: &str, message: String, location: &str) -> Error {
    Error::Op {
        op: op.into(),
        message,
        location: location.into(),
    }
}

/// Every leaf of the input is floating point.
fn check_float(op: &str, leaves: &[Tensor], location: &str) {
    if let Some(t) = leaves.iter().find(|t| !t.dtype().is_float()) {
        raise(op_error(
            op,
            format!(
                "cannot differentiate with respect to an input of type {}: derivatives need \
                 f32 or f64 inputs",
                t.ty()
            ),
            location,
        ));
    }
}

/// The tangent tree has the primal tree's structure and each leaf the primal leaf's type.
fn check_tangents(
    op: &str,
    pdef: &TreeDef,
    primal_types: &[TensorType],
    tangents: &[Tensor],
    tdef: &TreeDef,
    location: &str,
) {
    if tdef != pdef {
        raise(Error::Tree {
            message: format!(
                "{op}: the tangents are {}, the primals are {}",
                tdef.describe(),
                pdef.describe()
            ),
            location: location.into(),
        });
    }
    let paths = pdef.leaf_paths();
    for ((p, t), path) in primal_types.iter().zip(tangents).zip(&paths) {
        if t.ty() != p {
            raise(op_error(
                op,
                format!(
                    "the tangent of the primal {path} has type {}, the primal has type {p}",
                    t.ty()
                ),
                location,
            ));
        }
    }
}

/// The nodes that depend on one of `seeds`.
fn dependents(g: &Graph, order: &[NodeId], seeds: &[NodeId]) -> HashSet<NodeId> {
    let mut set: HashSet<NodeId> = seeds.iter().copied().collect();
    for &id in order {
        if !matches!(g.op(id), Op::Parameter(_)) && g.operands(id).iter().any(|o| set.contains(o)) {
            set.insert(id);
        }
    }
    set
}

/// A traced function with a derivative pass appended, split at the pass's seed parameters
/// (tangents or cotangents): the part that does not depend on a seed is replayed once, at
/// construction; `apply` replays the rest for given seed values, as often as needed.
struct Split {
    graph: Graph,
    /// The values of the seed-free part (concrete, or tracers of the enclosing trace).
    env: HashMap<NodeId, Tensor>,
    seeds: Vec<NodeId>,
    /// The nodes that depend on a seed, in topological order.
    rest: Vec<NodeId>,
    /// The derivative nodes (`None`: zero).
    outs: Vec<Option<NodeId>>,
}

impl Split {
    /// `inputs` are the values of the graph's parameters before the seeds; `keep` are the
    /// primal nodes the caller reads from `env`.
    fn new(
        mut graph: Graph,
        inputs: Vec<Tensor>,
        seeds: Vec<NodeId>,
        outs: Vec<Option<NodeId>>,
        keep: &[NodeId],
        (op, location): (&str, &str),
    ) -> Split {
        let mut all = keep.to_vec();
        all.extend(outs.iter().flatten());
        graph.set_outputs(all);
        if let Err(e) = verify(&graph) {
            raise(op_error(
                op,
                format!("the differentiated program is malformed: {e}"),
                location,
            ));
        }
        let mut env: HashMap<NodeId, Tensor> = graph.params().iter().copied().zip(inputs).collect();
        let order = graph.topo_order();
        let seeded = dependents(&graph, &order, &seeds);
        let (rest, fixed): (Vec<NodeId>, Vec<NodeId>) =
            order.into_iter().partition(|n| seeded.contains(n));
        replay(&graph, &fixed, &mut env);
        Split {
            graph,
            env,
            seeds,
            rest,
            outs,
        }
    }

    /// The derivative outputs for these seed values.
    fn apply(&self, seed_values: &[Tensor]) -> Vec<Option<Tensor>> {
        let mut env = self.env.clone();
        for (&p, t) in self.seeds.iter().zip(seed_values) {
            env.insert(p, t.clone());
        }
        replay(&self.graph, &self.rest, &mut env);
        self.outs
            .iter()
            .map(|o| o.map(|o| env[&o].clone()))
            .collect()
    }
}

/// The linear map returned by `linearize`: tangents of the inputs to tangents of the outputs,
/// at the primal point it was built at (the forward values are computed once).
pub struct Linearized<P, O> {
    split: Split,
    /// The primal outputs (their zeros stand for absent tangents).
    outs: Vec<Tensor>,
    pdef: TreeDef,
    primal_types: Vec<TensorType>,
    odef: TreeDef,
    location: String,
    _types: PhantomData<fn(P) -> O>,
}

impl<P: Tree, O: Tree> Linearized<P, O> {
    /// The tangent of the outputs for the tangent `t` of the inputs (same structure and types
    /// as the primals).
    pub fn call(&self, t: &P) -> O {
        let (leaves, tdef) = tree::flatten(t);
        check_tangents(
            "jvp",
            &self.pdef,
            &self.primal_types,
            &leaves,
            &tdef,
            &self.location,
        );
        let out: Vec<Tensor> = self
            .split
            .apply(&leaves)
            .into_iter()
            .zip(&self.outs)
            .map(|(t, o)| t.unwrap_or_else(|| o.zeros_like()))
            .collect();
        tree::unflatten(&self.odef, out).unwrap_or_else(|e| raise(e))
    }
}

fn linearize_at<P: Tree, O: Tree>(
    f: impl FnOnce(&P) -> O,
    primals: &P,
    location: String,
) -> (O, Linearized<P, O>) {
    let (leaves, pdef) = tree::flatten(primals);
    check_float("jvp", &leaves, &location);
    let Traced {
        mut graph,
        inputs,
        odef,
    } = trace_at(f, "jvp", &leaves, &pdef);
    let outputs = graph.outputs().to_vec();
    let wrt: Vec<NodeId> = graph.params()[..leaves.len()].to_vec();
    let t_params: Vec<NodeId> = wrt
        .iter()
        .map(|&p| {
            let ty = graph.ty(p).clone();
            graph.add_param(ty)
        })
        .collect();
    let t_outs = tessera_autodiff::jvp(&mut graph, &wrt, &t_params, &outputs)
        .unwrap_or_else(|e| raise(op_error("jvp", e.to_string(), &location)));
    let split = Split::new(
        graph,
        inputs,
        t_params,
        t_outs,
        &outputs,
        ("jvp", &location),
    );
    let outs: Vec<Tensor> = outputs.iter().map(|o| split.env[o].clone()).collect();
    let out = tree::unflatten(&odef, outs.clone()).unwrap_or_else(|e| raise(e));
    let lin = Linearized {
        split,
        outs,
        pdef,
        primal_types: leaves.iter().map(|t| t.ty().clone()).collect(),
        odef,
        location,
        _types: PhantomData,
    };
    (out, lin)
}

/// `jax.linearize`: `f(primals)` and the linear map from input tangents to output tangents at
/// `primals`. The forward part runs once; each `call` runs the tangent part only.
#[track_caller]
pub fn linearize<P: Tree, O: Tree>(f: impl FnOnce(&P) -> O, primals: &P) -> (O, Linearized<P, O>) {
    linearize_at(f, primals, loc_text(Location::caller()))
}

/// `jax.jvp`: `(f(primals), df(primals) . tangents)`. `tangents` has the structure and the leaf
/// types of `primals`; every primal leaf is floating point. An output that does not depend on
/// the inputs has a zero tangent.
///
/// ```
/// use tessera::prelude::*;
///
/// let x = Tensor::from_vec(vec![0.0f32, 1.0], [2]);
/// let (y, dy) = jvp(|x: &Tensor| x.exp(), &x, &Tensor::ones([2]));
/// assert_eq!(y.to_vec::<f32>(), dy.to_vec::<f32>()); // exp' = exp
/// let (_, d) = jvp(|x: &Tensor| (x * x).sum(), &x, &Tensor::from_vec(vec![1.0f32, 0.0], [2]));
/// assert_eq!(d.item::<f32>(), 0.0); // d/dx0 of the sum of squares at x0 = 0
/// ```
#[track_caller]
pub fn jvp<P: Tree, O: Tree>(f: impl FnOnce(&P) -> O, primals: &P, tangents: &P) -> (O, O) {
    let location = loc_text(Location::caller());
    let (pl, pdef) = tree::flatten(primals);
    let (tl, tdef) = tree::flatten(tangents);
    let types: Vec<TensorType> = pl.iter().map(|t| t.ty().clone()).collect();
    check_tangents("jvp", &pdef, &types, &tl, &tdef, &location);
    let (out, lin) = linearize_at(f, primals, location);
    let t = lin.call(tangents);
    (out, t)
}

/// A one-hot tensor of type `ty`: 1 at flat index `i`, 0 elsewhere.
fn one_hot(ty: &TensorType, i: usize) -> Tensor {
    let mut data = Data::zeros(ty.dtype, ty.numel());
    data.copy_element(i, &Data::splat(ty.dtype, 1.0, 1), 0)
        .expect("index within the tensor and one dtype");
    Tensor::from_literal(Literal {
        ty: ty.clone(),
        data,
    })
}

/// Stacks `parts` (each of type `part`, `None` a zero) along new axes shaped `axes`, after the
/// part's dims (`trailing`, jacfwd's columns) or before them (jacrev's rows).
fn stack(parts: Vec<Option<Tensor>>, part: &TensorType, axes: &Shape, trailing: bool) -> Tensor {
    let dims: Vec<usize> = if trailing {
        [part.dims(), axes.dims()].concat()
    } else {
        [axes.dims(), part.dims()].concat()
    };
    if dims.iter().product::<usize>() == 0 {
        return Tensor::full_dtype(dims, 0.0, part.dtype);
    }
    let one: Vec<usize> = if trailing {
        [part.dims(), &[1]].concat()
    } else {
        [&[1], part.dims()].concat()
    };
    let pieces: Vec<Tensor> = parts
        .into_iter()
        .map(|p| {
            p.unwrap_or_else(|| Tensor::full_dtype(part.dims().to_vec(), 0.0, part.dtype))
                .reshape(one.clone())
        })
        .collect();
    let joined = if pieces.len() == 1 {
        pieces[0].clone()
    } else {
        let refs: Vec<&Tensor> = pieces.iter().collect();
        Tensor::concatenate(&refs, if trailing { part.rank() } else { 0 })
    };
    joined.reshape(dims)
}

/// Traces a one-argument function for a Jacobian, checking that input and output are float.
fn trace_jac(f: impl FnOnce(&Tensor) -> Tensor, x: &Tensor, name: &str, location: &str) -> Traced {
    check_float(name, std::slice::from_ref(x), location);
    let traced = trace_at(f, name, std::slice::from_ref(x), &TreeDef::Leaf);
    let out_ty = traced.graph.ty(traced.graph.outputs()[0]);
    if !out_ty.dtype.is_float() {
        raise(op_error(
            name,
            format!("the function returns {out_ty}: a Jacobian needs a float output"),
            location,
        ));
    }
    traced
}

fn jacfwd_at(f: impl Fn(&Tensor) -> Tensor, location: String) -> impl Fn(&Tensor) -> Tensor {
    move |x: &Tensor| {
        let Traced {
            mut graph, inputs, ..
        } = trace_jac(&f, x, "jacfwd", &location);
        let (p, o) = (graph.params()[0], graph.outputs()[0]);
        let (in_ty, out_ty) = (graph.ty(p).clone(), graph.ty(o).clone());
        let t = graph.add_param(in_ty.clone());
        let t_out = tessera_autodiff::jvp(&mut graph, &[p], &[t], &[o])
            .unwrap_or_else(|e| raise(op_error("jacfwd", e.to_string(), &location)));
        let split = Split::new(graph, inputs, vec![t], t_out, &[], ("jacfwd", &location));
        let columns: Vec<Option<Tensor>> = (0..in_ty.numel())
            .map(|i| split.apply(&[one_hot(&in_ty, i)]).remove(0))
            .collect();
        stack(columns, &out_ty, &in_ty.shape, true)
    }
}

fn jacrev_at(f: impl Fn(&Tensor) -> Tensor, location: String) -> impl Fn(&Tensor) -> Tensor {
    move |x: &Tensor| {
        let Traced {
            mut graph, inputs, ..
        } = trace_jac(&f, x, "jacrev", &location);
        let (p, o) = (graph.params()[0], graph.outputs()[0]);
        let (in_ty, out_ty) = (graph.ty(p).clone(), graph.ty(o).clone());
        let c = graph.add_param(out_ty.clone());
        let ct = tessera_autodiff::vjp(&mut graph, &[o], &[c], &[p])
            .unwrap_or_else(|e| raise(op_error("jacrev", e.to_string(), &location)));
        let split = Split::new(graph, inputs, vec![c], ct, &[], ("jacrev", &location));
        let rows: Vec<Option<Tensor>> = (0..out_ty.numel())
            .map(|j| split.apply(&[one_hot(&out_ty, j)]).remove(0))
            .collect();
        stack(rows, &in_ty, &out_ty.shape, false)
    }
}

/// `jax.jacfwd`: the Jacobian of `f` by forward mode, shaped `f(x).shape ++ x.shape`. One JVP
/// per element of `x` (a one-hot tangent) over one trace of `f`, stacked: cheap for few inputs.
/// `x` and `f(x)` are floating point.
#[track_caller]
pub fn jacfwd(f: impl Fn(&Tensor) -> Tensor) -> impl Fn(&Tensor) -> Tensor {
    jacfwd_at(f, loc_text(Location::caller()))
}

/// `jax.jacrev`: the Jacobian of `f` by reverse mode, shaped `f(x).shape ++ x.shape`. One VJP
/// per element of `f(x)` (a one-hot cotangent) over one trace of `f`, stacked: cheap for few
/// outputs.
#[track_caller]
pub fn jacrev(f: impl Fn(&Tensor) -> Tensor) -> impl Fn(&Tensor) -> Tensor {
    jacrev_at(f, loc_text(Location::caller()))
}

/// `jax.hessian`: `jacfwd(jacrev(f))`, shaped `f(x).shape ++ x.shape ++ x.shape`.
#[track_caller]
pub fn hessian(f: impl Fn(&Tensor) -> Tensor) -> impl Fn(&Tensor) -> Tensor {
    let location = loc_text(Location::caller());
    jacfwd_at(jacrev_at(f, location.clone()), location)
}
