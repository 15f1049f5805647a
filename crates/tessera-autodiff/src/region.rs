//! Reverse mode through region ops.
//!
//! Every rule is built from one piece, [`body_vjp`]: the VJP of a body as a function of its
//! own, `(params, output cotangents) -> parameter cotangents`, which recomputes the body's
//! forward values inside itself. So the backward of a region saves no intermediate of its
//! body; it saves only what a body needs to be run again:
//!
//! - `scan`: the carries at the start of every step. The forward scan is given those as extra
//!   stacked results (its body returns its carry parameters once more), and the backward is a
//!   `scan` in the opposite direction over `(xs, saved carries, ys' cotangents)` that carries the
//!   carries' cotangents and the running sum of the consts' cotangents, and returns the xs'
//!   cotangents per step. The work is one extra forward of the body per step, the memory one
//!   carry per step (JAX's `scan` saves every residual of the body instead; our choice is that
//!   of `checkpoint` on the body, which costs compute and saves memory).
//! - `case`: a `case` on the same index whose branches are the branches' VJPs.
//! - `checkpoint`: a `checkpoint` whose body is the body's VJP: the forward values of the body
//!   are recomputed in the backward pass, and being inside a region they are never merged with
//!   the forward's by CSE.
//! - `custom_vjp`: the user's `bwd` applied to the residuals `fwd` returned.
//! - `while`: no rule. Its trip count is known only when it runs, so there is no static
//!   backward loop to build (JAX refuses it too); forward mode works.

use tessera_ir::{DType, Graph, Literal, NodeId, Op, RegionOp, TensorType};

use super::{AutodiffError, Builder, Result, vjp as graph_vjp};

/// The cotangents of a region's operands, given those of its results (`None`: zero).
pub(super) fn vjp(
    b: &mut Builder,
    r: &RegionOp,
    id: NodeId,
    xs: &[NodeId],
    needed: &[bool],
    cts: &[Option<NodeId>],
) -> Result<Vec<Option<NodeId>>> {
    let mut out = match r {
        RegionOp::Scan {
            length,
            reverse,
            consts,
            carries,
            body,
        } => scan(b, (*length, *reverse, *consts, *carries), body, id, xs, cts)?,
        RegionOp::While { .. } => {
            return Err(AutodiffError::NotDifferentiable {
                op: "while".into(),
                why: " in reverse mode: a while_loop's trip count is known only when it runs \
                      (JAX refuses it too); use fori_loop or scan with a static trip count, \
                      or forward mode (jvp)"
                    .into(),
            });
        }
        RegionOp::Case { branches } => {
            let types = param_types(&branches[0]);
            let (float_p, float_o) = (floats(&types), floats(&out_types(&branches[0])));
            let bodies = branches
                .iter()
                .map(|br| body_vjp(br, &float_p, &float_o))
                .collect::<Result<Vec<_>>>()?;
            let mut operands = xs.to_vec();
            operands.extend(output_cts(b, &branches[0], &float_o, cts)?);
            let grads = emit(b, RegionOp::Case { branches: bodies }, &operands)?;
            let mut out = vec![None];
            out.extend(spread(&float_p, grads));
            out
        }
        RegionOp::Checkpoint { body } => {
            let (float_p, float_o) = (floats(&param_types(body)), floats(&out_types(body)));
            let grad_body = body_vjp(body, &float_p, &float_o)?;
            let mut operands = xs.to_vec();
            operands.extend(output_cts(b, body, &float_o, cts)?);
            let grads = emit(b, RegionOp::Checkpoint { body: grad_body }, &operands)?;
            spread(&float_p, grads)
        }
        RegionOp::CustomVjp { primals, fwd, bwd } => {
            let types = out_types(fwd);
            let mut operands = Vec::new();
            for (index, ty) in types.iter().enumerate().skip(*primals) {
                let op = Op::GetResult {
                    index,
                    ty: ty.clone(),
                };
                operands.push(b.add(op, &[id])?);
            }
            for (i, ty) in types.iter().take(*primals).enumerate() {
                operands.push(match cts[i] {
                    Some(c) => c,
                    None => zeros(b, ty)?,
                });
            }
            let grads = emit(b, RegionOp::Checkpoint { body: bwd.clone() }, &operands)?;
            grads
                .into_iter()
                .zip(xs)
                .map(|(g, &x)| b.ty(x).dtype.is_float().then_some(g))
                .collect()
        }
    };
    for (o, &n) in out.iter_mut().zip(needed) {
        if !n {
            *o = None;
        }
    }
    Ok(out)
}

/// The scan rule (see the module doc). `shape` is `(length, reverse, consts, carries)`.
fn scan(
    b: &mut Builder,
    (length, reverse, nc, nk): (usize, bool, usize, usize),
    body: &Graph,
    id: NodeId,
    xs: &[NodeId],
    cts: &[Option<NodeId>],
) -> Result<Vec<Option<NodeId>>> {
    let p_types = param_types(body);
    let o_types = out_types(body);
    let nx = p_types.len() - nc - nk;
    let ny = o_types.len() - nk;
    let float_p = floats(&p_types);
    let float_o = floats(&o_types);
    let grad_body = body_vjp(body, &float_p, &float_o)?;

    // The forward scan also returns the carries at the start of each step.
    let mut saving = body.clone();
    let mut outs = saving.outputs().to_vec();
    outs.extend_from_slice(&saving.params()[nc..nc + nk]);
    saving.set_outputs(outs);
    b.g.node_mut(id).op = Op::Region(Box::new(RegionOp::Scan {
        length,
        reverse,
        consts: nc,
        carries: nk,
        body: saving,
    }));
    let mut saved = Vec::new();
    for (k, t) in p_types[nc..nc + nk].iter().enumerate() {
        let op = Op::GetResult {
            index: nk + ny + k,
            ty: stacked(length, t),
        };
        saved.push(b.add(op, &[id])?);
    }

    // The backward body: params consts, carry cotangents, consts' cotangent sums | x, saved
    // carry, ys' cotangents (one step's slices).
    let mut bb = Graph::new("body");
    bb.mesh = body.mesh.clone();
    let c_p: Vec<NodeId> = p_types[..nc]
        .iter()
        .map(|t| bb.add_param(t.clone()))
        .collect();
    let float_k: Vec<usize> = (0..nk).filter(|&k| float_p[nc + k]).collect();
    let float_c: Vec<usize> = (0..nc).filter(|&i| float_p[i]).collect();
    let ctk_p: Vec<NodeId> = float_k
        .iter()
        .map(|&k| bb.add_param(p_types[nc + k].clone()))
        .collect();
    let acc_p: Vec<NodeId> = float_c
        .iter()
        .map(|&i| bb.add_param(p_types[i].clone()))
        .collect();
    let x_p: Vec<NodeId> = p_types[nc + nk..]
        .iter()
        .map(|t| bb.add_param(t.clone()))
        .collect();
    let k_p: Vec<NodeId> = p_types[nc..nc + nk]
        .iter()
        .map(|t| bb.add_param(t.clone()))
        .collect();
    let float_y: Vec<usize> = (0..ny).filter(|&y| float_o[nk + y]).collect();
    let cty_p: Vec<NodeId> = float_y
        .iter()
        .map(|&y| bb.add_param(o_types[nk + y].clone()))
        .collect();
    let mut args: Vec<NodeId> = c_p.clone();
    args.extend(&k_p);
    args.extend(&x_p);
    args.extend(&ctk_p);
    args.extend(&cty_p);
    let grads = bb
        .inline(&grad_body, &args)
        .map_err(|error| AutodiffError::Rule {
            op: "scan".into(),
            error,
        })?;
    // `grads` holds the cotangents of the float params, in parameter order.
    let mut per_param: Vec<Option<NodeId>> = spread(&float_p, grads);
    let mut outputs: Vec<NodeId> = float_k
        .iter()
        .map(|&k| {
            per_param[nc + k]
                .take()
                .expect("a float carry has a cotangent")
        })
        .collect();
    for (&i, &acc) in float_c.iter().zip(&acc_p) {
        let step = per_param[i].take().expect("a float const has a cotangent");
        let sum = bb
            .add(Op::Binary(tessera_ir::BinaryOp::Add), &[acc, step])
            .map_err(|error| AutodiffError::Rule {
                op: "scan".into(),
                error,
            })?;
        outputs.push(sum);
    }
    let float_x: Vec<usize> = (0..nx).filter(|&j| float_p[nc + nk + j]).collect();
    for &j in &float_x {
        outputs.push(
            per_param[nc + nk + j]
                .take()
                .expect("a float x has a cotangent"),
        );
    }
    bb.set_outputs(outputs);

    let mut operands: Vec<NodeId> = xs[..nc].to_vec();
    for &k in &float_k {
        operands.push(match cts[k] {
            Some(c) => c,
            None => zeros(b, &p_types[nc + k])?,
        });
    }
    for &i in &float_c {
        operands.push(zeros(b, &p_types[i])?);
    }
    operands.extend_from_slice(&xs[nc + nk..]);
    operands.extend(saved);
    for &y in &float_y {
        operands.push(match cts[nk + y] {
            Some(c) => c,
            None => zeros(b, &stacked(length, &o_types[nk + y]))?,
        });
    }
    let backward = RegionOp::Scan {
        length,
        reverse: !reverse,
        consts: nc,
        carries: float_k.len() + float_c.len(),
        body: bb,
    };
    let results = emit(b, backward, &operands)?;
    let mut out: Vec<Option<NodeId>> = vec![None; xs.len()];
    let mut it = results.into_iter();
    for &k in &float_k {
        out[nc + k] = it.next();
    }
    for &i in &float_c {
        out[i] = it.next();
    }
    for &j in &float_x {
        out[nc + nk + j] = it.next();
    }
    Ok(out)
}

/// The VJP of `body` as a graph of its own: parameters are `body`'s, then one cotangent per
/// output that `outs` marks; outputs are the cotangents of the parameters `wrt` marks (zeros
/// where the outputs do not depend on one). It recomputes `body`'s forward values it needs.
fn body_vjp(body: &Graph, wrt: &[bool], outs: &[bool]) -> Result<Graph> {
    let mut g = body.clone();
    let n = g.params().len();
    let out_nodes: Vec<NodeId> = g
        .outputs()
        .iter()
        .zip(outs)
        .filter(|(_, m)| **m)
        .map(|(&o, _)| o)
        .collect();
    let ct_params: Vec<NodeId> = out_nodes
        .iter()
        .map(|&o| {
            let t = g.ty(o).clone();
            g.add_param(t)
        })
        .collect();
    let wrt_nodes: Vec<NodeId> = g.params()[..n]
        .iter()
        .zip(wrt)
        .filter(|(_, m)| **m)
        .map(|(&p, _)| p)
        .collect();
    let grads = graph_vjp(&mut g, &out_nodes, &ct_params, &wrt_nodes)?;
    let mut outputs = Vec::new();
    for (&w, c) in wrt_nodes.iter().zip(grads) {
        outputs.push(match c {
            Some(c) => c,
            None => {
                let t = g.ty(w).clone();
                zeros_in(&mut g, &t).map_err(|error| AutodiffError::Rule {
                    op: "region".into(),
                    error,
                })?
            }
        });
    }
    g.set_outputs(outputs);
    g.remove_dead();
    Ok(g)
}

/// Adds region op `r` on `operands` and returns its result nodes.
fn emit(b: &mut Builder, r: RegionOp, operands: &[NodeId]) -> Result<Vec<NodeId>> {
    let name = r.name();
    let id = b.add(Op::Region(Box::new(r)), operands)?;
    let types = b.g.result_types(id).map_err(|error| AutodiffError::Rule {
        op: name.into(),
        error,
    })?;
    types
        .into_iter()
        .enumerate()
        .map(|(index, ty)| b.add(Op::GetResult { index, ty }, &[id]))
        .collect()
}

/// The cotangents of the outputs `float_o` marks, zeros where none reached them.
fn output_cts(
    b: &mut Builder,
    body: &Graph,
    float_o: &[bool],
    cts: &[Option<NodeId>],
) -> Result<Vec<NodeId>> {
    let types = out_types(body);
    let mut v = Vec::new();
    for (i, t) in types.iter().enumerate() {
        if float_o[i] {
            v.push(match cts[i] {
                Some(c) => c,
                None => zeros(b, t)?,
            });
        }
    }
    Ok(v)
}

/// `values` (one per marked position) spread over the positions of `mask`.
fn spread(mask: &[bool], values: Vec<NodeId>) -> Vec<Option<NodeId>> {
    let mut it = values.into_iter();
    mask.iter()
        .map(|&m| if m { it.next() } else { None })
        .collect()
}

fn param_types(g: &Graph) -> Vec<TensorType> {
    g.params().iter().map(|&p| g.ty(p).clone()).collect()
}

fn out_types(g: &Graph) -> Vec<TensorType> {
    tessera_ir::region::output_types(g)
}

fn floats(types: &[TensorType]) -> Vec<bool> {
    types.iter().map(|t| t.dtype.is_float()).collect()
}

fn stacked(length: usize, t: &TensorType) -> TensorType {
    let mut dims = vec![length];
    dims.extend_from_slice(t.dims());
    TensorType::new(t.dtype, dims)
}

fn zeros(b: &mut Builder, ty: &TensorType) -> Result<NodeId> {
    let c = b.add(Op::Constant(Literal::splat(&scalar(ty.dtype), 0.0)), &[])?;
    if ty.rank() == 0 {
        return Ok(c);
    }
    b.add(
        Op::BroadcastInDim {
            shape: ty.shape.clone(),
            dims: vec![],
        },
        &[c],
    )
}

fn zeros_in(g: &mut Graph, ty: &TensorType) -> std::result::Result<NodeId, tessera_ir::TypeError> {
    let c = g.add(Op::Constant(Literal::splat(&scalar(ty.dtype), 0.0)), &[])?;
    if ty.rank() == 0 {
        return Ok(c);
    }
    g.add(
        Op::BroadcastInDim {
            shape: ty.shape.clone(),
            dims: vec![],
        },
        &[c],
    )
}

fn scalar(dtype: DType) -> TensorType {
    TensorType::scalar(dtype)
}
