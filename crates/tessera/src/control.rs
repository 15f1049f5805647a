//! Control flow as region ops (`jax.lax`'s `scan`, `fori_loop`, `while_loop`, `cond`,
//! `switch`) and the autodiff controls `checkpoint`, `custom_vjp` and `stop_gradient`.
//!
//! Each traces the user's function once, into a graph of its own (a body), the way `grad`
//! does; the values it closes over become the body's extra parameters, passed to the region op
//! as operands (the `consts` of a loop). So a loop's IR is the size of its body whatever its
//! trip count, and it compiles once. With concrete operands the region runs at once (the
//! interpreter); inside `jit` or `grad` it is recorded.
//!
//! Carries, per-step values and branch results are trees (`#[derive(Tree)]` structs work). A
//! carry whose structure, shape or dtype changes in the body, a predicate that is not a scalar
//! bool, or branches returning different trees are errors naming the caller's `file:line`.

use std::panic::Location;

use tessera_ir::{DType, Graph, Literal, NodeId, Op, RegionOp, Shape, TensorType};

use crate::error::{Error, catch, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::{self, apply_at, apply_region};
use crate::tree::{self, Tree, TreeDef};

/// A function traced into a body: its graph (declared parameters, then captures), the outer
/// values of its captures, and the structure of its result.
struct Body {
    graph: Graph,
    captures: Vec<Tensor>,
    out_def: TreeDef,
}

impl Body {
    fn out_types(&self) -> Vec<TensorType> {
        tessera_ir::region::output_types(&self.graph)
    }
}

fn trace_body<O: Tree>(
    label: &str,
    types: &[TensorType],
    f: impl FnOnce(Vec<Tensor>) -> O,
) -> Body {
    let (guard, tracers) = trace::begin(label, types);
    let out = match catch(|| f(tracers)) {
        Ok(o) => o,
        Err(e) => {
            drop(guard);
            raise(e)
        }
    };
    let (leaves, out_def) = tree::flatten(&out);
    let rec = trace::finish(guard, &leaves);
    Body {
        graph: rec.graph,
        captures: rec.captures,
        out_def,
    }
}

/// `g` with its parameters laid out anew: new parameter `j` has type `types[j]`, and old
/// parameter `i` becomes new parameter `map[i]` (new parameters nothing maps to are unused).
fn relayout(g: &Graph, types: &[TensorType], map: &[usize]) -> Graph {
    let mut out = Graph::new(g.name.clone());
    out.mesh = g.mesh.clone();
    let ps: Vec<NodeId> = types.iter().map(|t| out.add_param(t.clone())).collect();
    let args: Vec<NodeId> = map.iter().map(|&j| ps[j]).collect();
    let outs = out
        .inline(g, &args)
        .expect("relayout keeps every parameter's type");
    out.set_outputs(outs);
    out
}

fn types_of(ts: &[Tensor]) -> Vec<TensorType> {
    ts.iter().map(|t| t.ty().clone()).collect()
}

fn op_error(op: &str, message: String, location: &str) -> Error {
    Error::Op {
        op: op.into(),
        message,
        location: location.into(),
    }
}

/// Checks that a body returned the carry it was given: the same tree, leaf types alike.
fn check_carry(
    op: &str,
    want: (&TreeDef, &[TensorType]),
    got: (&TreeDef, &[TensorType]),
    at: &str,
) {
    if want.0 != got.0 {
        raise(Error::Tree {
            message: format!(
                "{op}: the body returns a carry {} but was given {} (a carry keeps its \
                 structure)",
                got.0.describe(),
                want.0.describe()
            ),
            location: at.into(),
        });
    }
    let paths = want.0.leaf_paths();
    for (k, (w, g)) in want.1.iter().zip(got.1).enumerate() {
        if w != g {
            raise(op_error(
                op,
                format!(
                    "the body returns {g} for the carry {} of type {w} (a carried value keeps \
                     its shape and dtype)",
                    paths.get(k).map_or("leaf", |p| p.as_str())
                ),
                at,
            ));
        }
    }
}

/// `lax.scan`: runs `f(carry, x) -> (carry, y)` over the leading axis of `xs` (of length
/// `length`, which must be given when `xs` has no leaves), from the last slice to the first
/// when `reverse`. Returns the final carry and the `y`s stacked along a new leading axis. The
/// body is traced once, so the program's size does not grow with the length.
///
/// ```
/// use tessera::prelude::*;
///
/// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
/// let step = |c: &Tensor, x: &Tensor| { let c = c + x; (c.clone(), c) };
/// let (total, sums) = scan(step, &Tensor::zeros([]), &xs, None, false);
/// assert_eq!((total.item::<f32>(), sums.to_vec::<f32>()), (10.0, vec![1.0, 3.0, 6.0, 10.0]));
/// let (_, rsums) = scan(step, &Tensor::zeros([]), &xs, None, true);
/// assert_eq!(rsums.to_vec::<f32>(), vec![10.0, 9.0, 7.0, 4.0]);
/// ```
#[track_caller]
pub fn scan<C: Tree, X: Tree, Y: Tree>(
    f: impl Fn(&C, &X) -> (C, Y),
    init: &C,
    xs: &X,
    length: Option<usize>,
    reverse: bool,
) -> (C, Y) {
    let at = loc_text(Location::caller());
    let (carry, cdef) = tree::flatten(init);
    let (x_leaves, xdef) = tree::flatten(xs);
    let mut n = length;
    for (k, x) in x_leaves.iter().enumerate() {
        let Some(&lead) = x.shape().first() else {
            raise(op_error(
                "scan",
                format!(
                    "xs leaf {k} is a scalar ({}); scanned values need a leading axis",
                    x.ty()
                ),
                &at,
            ));
        };
        match n {
            Some(m) if m != lead => raise(op_error(
                "scan",
                format!(
                    "xs leaf {k} ({}) has a leading axis of {lead}, but the length is {m} (every \
                     scanned value needs the same leading size)",
                    x.ty()
                ),
                &at,
            )),
            _ => n = Some(lead),
        }
    }
    let Some(length) = n else {
        raise(op_error(
            "scan",
            "no xs to scan over and no length given".into(),
            &at,
        ));
    };
    let carry_types = types_of(&carry);
    let slice_types: Vec<TensorType> = x_leaves
        .iter()
        .map(|x| TensorType::new(x.dtype(), x.shape()[1..].to_vec()))
        .collect();
    let mut types = carry_types.clone();
    types.extend(slice_types.iter().cloned());
    let nk = carry.len();
    let mut ydef = None;
    let body = trace_body("body", &types, |tracers| {
        let c: C = tree::unflatten(&cdef, tracers[..nk].to_vec()).unwrap_or_else(|e| raise(e));
        let x: X = tree::unflatten(&xdef, tracers[nk..].to_vec()).unwrap_or_else(|e| raise(e));
        let (c2, y) = f(&c, &x);
        let (c_leaves, c2def) = tree::flatten(&c2);
        let (y_leaves, yd) = tree::flatten(&y);
        check_carry(
            "scan",
            (&cdef, &carry_types),
            (&c2def, &types_of(&c_leaves)),
            &at,
        );
        ydef = Some(yd);
        let mut out = c_leaves;
        out.extend(y_leaves);
        out
    });
    let ydef = ydef.expect("the body ran");
    // Body parameters: carries, slices, captures -> captures (consts), carries, slices.
    let nc = body.captures.len();
    let mut layout = types_of(&body.captures);
    layout.extend(types);
    let map: Vec<usize> = (0..body.graph.params().len())
        .map(|i| {
            if i < nk + slice_types.len() {
                nc + i
            } else {
                i - nk - slice_types.len()
            }
        })
        .collect();
    let graph = relayout(&body.graph, &layout, &map);
    let mut operands: Vec<&Tensor> = body.captures.iter().collect();
    operands.extend(carry.iter());
    operands.extend(x_leaves.iter());
    let op = RegionOp::Scan {
        length,
        reverse,
        consts: nc,
        carries: nk,
        body: graph,
    };
    let mut results = apply_region(op, &operands, at.clone());
    let ys = results.split_off(nk);
    let c: C = tree::unflatten(&cdef, results).unwrap_or_else(|e| raise(e));
    let y: Y = tree::unflatten(&ydef, ys).unwrap_or_else(|e| raise(e));
    (c, y)
}

/// `lax.fori_loop` with static bounds: `body(i, carry) -> carry` for `i` in `lo..hi` (an `i32`
/// scalar; no iteration when `hi <= lo`, as for a Rust range). A `scan` with the counter as a
/// carry, so it has a reverse mode.
#[track_caller]
pub fn fori_loop<C: Tree>(lo: i32, hi: i32, body: impl Fn(&Tensor, &C) -> C, init: &C) -> C {
    let length = (hi as i64 - lo as i64).max(0) as usize;
    let (leaves, def) = tree::flatten(init);
    let c: C = tree::unflatten(&def, leaves).unwrap_or_else(|e| raise(e));
    let start = (Tensor::scalar(lo), c);
    let ((_, out), ()) = scan(
        |(i, c): &(Tensor, C), _: &()| ((i + &Tensor::scalar(1i32), body(i, c)), ()),
        &start,
        &(),
        Some(length),
        false,
    );
    out
}

/// `lax.while_loop`: `body(carry) -> carry` while `cond(carry)` (a scalar bool) holds. Its
/// trip count is known only when it runs, so it has no reverse mode (as in JAX); `jvp`
/// through it works.
#[track_caller]
pub fn while_loop<C: Tree>(cond: impl Fn(&C) -> Tensor, body: impl Fn(&C) -> C, init: &C) -> C {
    let at = loc_text(Location::caller());
    let (carry, cdef) = tree::flatten(init);
    let carry_types = types_of(&carry);
    let nk = carry.len();
    let c_body = trace_body("cond", &carry_types, |tracers| {
        let c: C = tree::unflatten(&cdef, tracers).unwrap_or_else(|e| raise(e));
        let p = cond(&c);
        if p.ty() != &TensorType::new(DType::Bool, Shape::scalar()) {
            raise(op_error(
                "while_loop",
                format!("the condition returns {}, not a scalar bool", p.ty()),
                &at,
            ));
        }
        p
    });
    let b_body = trace_body("body", &carry_types, |tracers| {
        let c: C = tree::unflatten(&cdef, tracers).unwrap_or_else(|e| raise(e));
        let c2 = body(&c);
        let (leaves, def) = tree::flatten(&c2);
        check_carry(
            "while_loop",
            (&cdef, &carry_types),
            (&def, &types_of(&leaves)),
            &at,
        );
        leaves
    });
    // Parameters: cond's captures, body's captures, carries.
    let (ncc, nbc) = (c_body.captures.len(), b_body.captures.len());
    let mut layout = types_of(&c_body.captures);
    layout.extend(types_of(&b_body.captures));
    layout.extend(carry_types);
    let cond_map: Vec<usize> = (0..nk + ncc)
        .map(|i| if i < nk { ncc + nbc + i } else { i - nk })
        .collect();
    let body_map: Vec<usize> = (0..nk + nbc)
        .map(|i| if i < nk { ncc + nbc + i } else { ncc + i - nk })
        .collect();
    let op = RegionOp::While {
        consts: ncc + nbc,
        cond: relayout(&c_body.graph, &layout, &cond_map),
        body: relayout(&b_body.graph, &layout, &body_map),
    };
    let mut operands: Vec<&Tensor> = c_body.captures.iter().collect();
    operands.extend(b_body.captures.iter());
    operands.extend(carry.iter());
    let results = apply_region(op, &operands, at);
    tree::unflatten(&cdef, results).unwrap_or_else(|e| raise(e))
}

/// `lax.cond`: `true_fn(operands)` when `pred` (a scalar bool) is true, else
/// `false_fn(operands)`. Both branches must return the same tree of the same types. Only the
/// branch taken runs, also inside `jit`.
///
/// ```
/// use tessera::prelude::*;
///
/// let f = jit(|x: Tensor| {
///     let pred = x.sum().gt(&Tensor::zeros([]));
///     cond(&pred, |x: &Tensor| x * 2.0, |x: &Tensor| -x, &x)
/// });
/// assert_eq!(f.call(Tensor::ones([2])).unwrap().to_vec::<f32>(), vec![2.0, 2.0]);
/// assert_eq!(f.call(-Tensor::ones([2])).unwrap().to_vec::<f32>(), vec![1.0, 1.0]);
/// ```
#[track_caller]
pub fn cond<A: Tree, O: Tree>(
    pred: &Tensor,
    true_fn: impl Fn(&A) -> O,
    false_fn: impl Fn(&A) -> O,
    operands: &A,
) -> O {
    let at = loc_text(Location::caller());
    if pred.ty() != &TensorType::new(DType::Bool, Shape::scalar()) {
        raise(op_error(
            "cond",
            format!("the predicate has type {}, not a scalar bool", pred.ty()),
            &at,
        ));
    }
    let index = apply_at(Op::Convert(DType::I32), &[pred], at.clone());
    let branches: [&dyn Fn(&A) -> O; 2] = [&false_fn, &true_fn];
    switch_at(&index, &branches, operands, "cond", at)
}

/// `lax.switch`: `branches[index](operands)`, with `index` (an `i32` scalar) clamped to the
/// branches. Every branch must return the same tree of the same types.
#[track_caller]
pub fn switch<A: Tree, O: Tree>(index: &Tensor, branches: &[&dyn Fn(&A) -> O], operands: &A) -> O {
    let at = loc_text(Location::caller());
    if index.ty() != &TensorType::new(DType::I32, Shape::scalar()) {
        raise(op_error(
            "switch",
            format!("the index has type {}, not an i32 scalar", index.ty()),
            &at,
        ));
    }
    switch_at(index, branches, operands, "switch", at)
}

fn switch_at<A: Tree, O: Tree>(
    index: &Tensor,
    branches: &[&dyn Fn(&A) -> O],
    operands: &A,
    name: &str,
    at: String,
) -> O {
    if branches.is_empty() {
        raise(op_error(name, "no branches".into(), &at));
    }
    let (args, adef) = tree::flatten(operands);
    let arg_types = types_of(&args);
    let na = args.len();
    let bodies: Vec<Body> = branches
        .iter()
        .map(|f| {
            trace_body("branch", &arg_types, |tracers| {
                let a: A = tree::unflatten(&adef, tracers).unwrap_or_else(|e| raise(e));
                f(&a)
            })
        })
        .collect();
    let first_types = bodies[0].out_types();
    // `cond`'s branches are named as the user passed them.
    let label = |k: usize| match (name, k) {
        ("cond", 0) => "false_fn".to_string(),
        ("cond", _) => "true_fn".to_string(),
        _ => format!("branch {k}"),
    };
    for (k, b) in bodies.iter().enumerate().skip(1) {
        if b.out_def != bodies[0].out_def || b.out_types() != first_types {
            raise(Error::Tree {
                message: format!(
                    "{name}: {} returns {} {} but {} returns {} {} (every branch must return \
                     the same tree of the same types)",
                    label(k),
                    b.out_def.describe(),
                    list(&b.out_types()),
                    label(0),
                    bodies[0].out_def.describe(),
                    list(&first_types)
                ),
                location: at.clone(),
            });
        }
    }
    // Parameters: args, then every branch's captures in branch order.
    let mut layout = arg_types.clone();
    let mut offsets = Vec::new();
    for b in &bodies {
        offsets.push(layout.len());
        layout.extend(types_of(&b.captures));
    }
    let graphs: Vec<Graph> = bodies
        .iter()
        .zip(&offsets)
        .map(|(b, &off)| {
            let map: Vec<usize> = (0..b.graph.params().len())
                .map(|i| if i < na { i } else { off + i - na })
                .collect();
            relayout(&b.graph, &layout, &map)
        })
        .collect();
    let mut ops: Vec<&Tensor> = vec![index];
    ops.extend(args.iter());
    for b in &bodies {
        ops.extend(b.captures.iter());
    }
    let results = apply_region(RegionOp::Case { branches: graphs }, &ops, at);
    tree::unflatten(&bodies[0].out_def, results).unwrap_or_else(|e| raise(e))
}

fn list(ts: &[TensorType]) -> String {
    let v: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
    format!("({})", v.join(", "))
}

/// `jax.checkpoint` (remat): `f` computed as usual, but reverse mode recomputes its
/// intermediate values in the backward pass instead of keeping them from the forward one.
#[track_caller]
pub fn checkpoint<A: Tree, O: Tree>(f: impl Fn(&A) -> O) -> impl Fn(&A) -> O + Clone {
    let at = loc_text(Location::caller());
    let f = std::rc::Rc::new(f);
    move |a: &A| {
        let at = at.clone();
        let (args, adef) = tree::flatten(a);
        let body = trace_body("body", &types_of(&args), |tracers| {
            let a: A = tree::unflatten(&adef, tracers).unwrap_or_else(|e| raise(e));
            f(&a)
        });
        let mut ops: Vec<&Tensor> = args.iter().collect();
        ops.extend(body.captures.iter());
        let results = apply_region(RegionOp::Checkpoint { body: body.graph }, &ops, at);
        tree::unflatten(&body.out_def, results).unwrap_or_else(|e| raise(e))
    }
}

/// `jax.custom_vjp`: a function whose reverse mode is given. `fwd(args) -> (out, residuals)`
/// computes it (and what the backward needs); `bwd(residuals, out_cotangent) ->
/// args_cotangent` is its VJP. `bwd` may use only its arguments: a value it closes over from an
/// enclosing trace is an error (JAX's rule too), pass it through the residuals.
#[track_caller]
pub fn custom_vjp<A: Tree, O: Tree, R: Tree>(
    fwd: impl Fn(&A) -> (O, R),
    bwd: impl Fn(&R, &O) -> A,
) -> impl Fn(&A) -> O + Clone {
    let at = loc_text(Location::caller());
    let (fwd, bwd) = (std::rc::Rc::new(fwd), std::rc::Rc::new(bwd));
    move |a: &A| {
        let at = at.clone();
        let (args, adef) = tree::flatten(a);
        let arg_types = types_of(&args);
        let mut shapes = None;
        let f_body = trace_body("fwd", &arg_types, |tracers| {
            let a: A = tree::unflatten(&adef, tracers).unwrap_or_else(|e| raise(e));
            let (o, r) = fwd(&a);
            let (ol, od) = tree::flatten(&o);
            let (rl, rd) = tree::flatten(&r);
            shapes = Some((od, rd, ol.len()));
            let mut out = ol;
            out.extend(rl);
            out
        });
        let (odef, rdef, n_out) = shapes.expect("fwd ran");
        let f_types = f_body.out_types();
        let mut b_types = f_types[n_out..].to_vec();
        b_types.extend_from_slice(&f_types[..n_out]);
        let n_res = f_types.len() - n_out;
        let b_body = trace_body("bwd", &b_types, |tracers| {
            let r: R =
                tree::unflatten(&rdef, tracers[..n_res].to_vec()).unwrap_or_else(|e| raise(e));
            let o: O =
                tree::unflatten(&odef, tracers[n_res..].to_vec()).unwrap_or_else(|e| raise(e));
            let g = bwd(&r, &o);
            let (leaves, gdef) = tree::flatten(&g);
            if gdef != adef || types_of(&leaves) != arg_types {
                raise(Error::Tree {
                    message: format!(
                        "custom_vjp: bwd returns {} {} but the arguments are {} {} (one \
                         cotangent per argument, of its type)",
                        gdef.describe(),
                        list(&types_of(&leaves)),
                        adef.describe(),
                        list(&arg_types)
                    ),
                    location: at.clone(),
                });
            }
            leaves
        });
        if !b_body.captures.is_empty() {
            raise(op_error(
                "custom_vjp",
                format!(
                    "bwd closes over {} traced value(s) of an enclosing function; pass them \
                     through the residuals",
                    b_body.captures.len()
                ),
                &at,
            ));
        }
        // fwd's captures are extra arguments: bwd gives them zero cotangents.
        let mut bwd_graph = b_body.graph;
        let mut outs = bwd_graph.outputs().to_vec();
        for c in &f_body.captures {
            let z = zeros(&mut bwd_graph, c.ty());
            outs.push(z);
        }
        bwd_graph.set_outputs(outs);
        let mut ops: Vec<&Tensor> = args.iter().collect();
        ops.extend(f_body.captures.iter());
        let op = RegionOp::CustomVjp {
            primals: n_out,
            fwd: f_body.graph,
            bwd: bwd_graph,
        };
        let mut results = apply_region(op, &ops, at);
        results.truncate(n_out);
        tree::unflatten(&odef, results).unwrap_or_else(|e| raise(e))
    }
}

fn zeros(g: &mut Graph, ty: &TensorType) -> NodeId {
    let c = g
        .add(
            Op::Constant(Literal::splat(&TensorType::scalar(ty.dtype), 0.0)),
            &[],
        )
        .expect("a scalar constant");
    if ty.rank() == 0 {
        return c;
    }
    g.add(
        Op::BroadcastInDim {
            shape: ty.shape.clone(),
            dims: vec![],
        },
        &[c],
    )
    .expect("a broadcast of a scalar")
}

/// `lax.stop_gradient`: `x`, with a derivative of zero.
#[track_caller]
pub fn stop_gradient(x: &Tensor) -> Tensor {
    crate::trace::apply(Op::StopGradient, &[x])
}
