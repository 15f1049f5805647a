//! f16 and bf16 compute in f32 (XLA:CPU's float normalization): before fusion, every op with a
//! narrow operand or result is rewritten to run on f32, its narrow operands widened by
//! `convert` and a narrow result rounded back by one. What is left narrow are the buffers
//! (parameters, constants, results, region carries, collective operands) and the converts and
//! bitcasts between them, which the kernels lower to loads, stores and conversion calls.
//!
//! Which ops keep their narrow types is `Op::keeps_narrow`. This is the interpreter's
//! semantics (`tessera_interp::eval_op` runs the same ops in f32 and rounds each narrow result
//! once, by the same table): compiled equals interpreted bit for bit for the correctly rounded
//! f32 ops, and within one narrow ulp where the f32 kernel has an ulp bound (`approx.rs`).

use std::collections::HashMap;

use tessera_ir::{DType, Graph, NodeId, Op, TypeError};

/// `g` with its f16 and bf16 arithmetic done in f32, or `None` when `g` has no narrow value.
/// Region bodies are left to their own compilation (`compile` rewrites each body it compiles).
pub fn widen(g: &Graph) -> Result<Option<Graph>, TypeError> {
    let order = g.topo_order();
    if !order.iter().any(|&id| g.ty(id).dtype.is_narrow_float()) {
        return Ok(None);
    }
    let mut out = Graph::new(g.name.clone());
    out.set_mesh(g.mesh.clone());
    // Each value in its own type, and (made on first use) widened to f32.
    let mut own: HashMap<NodeId, NodeId> = HashMap::new();
    let mut wide: HashMap<NodeId, NodeId> = HashMap::new();
    for &p in g.params() {
        let q = out.add_param(g.ty(p).clone());
        out.node_mut(q).sharding = g.node(p).sharding.clone();
        out.node_mut(q).loc = g.node(p).loc.clone();
        own.insert(p, q);
    }
    for id in order {
        if own.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        let operands = g.operands(id);
        let narrow = node.ty.dtype.is_narrow_float()
            || operands.iter().any(|&o| g.ty(o).dtype.is_narrow_float());
        let annotate = |out: &mut Graph, n: NodeId| {
            out.node_mut(n).sharding = node.sharding.clone();
            out.node_mut(n).loc = node.loc.clone();
        };
        if !narrow || node.op.keeps_narrow() {
            let args: Vec<NodeId> = operands.iter().map(|o| own[o]).collect();
            let n = out.add(node.op.clone(), &args)?;
            annotate(&mut out, n);
            own.insert(id, n);
            continue;
        }
        let mut args = Vec::with_capacity(operands.len());
        for &o in &operands {
            if !g.ty(o).dtype.is_narrow_float() {
                args.push(own[&o]);
                continue;
            }
            let w = match wide.get(&o) {
                Some(&w) => w,
                None => {
                    let w = out.add(Op::Convert(DType::F32), &[own[&o]])?;
                    out.node_mut(w).sharding = g.node(o).sharding.clone();
                    out.node_mut(w).loc = g.node(o).loc.clone();
                    wide.insert(o, w);
                    w
                }
            };
            args.push(w);
        }
        let n = out.add(node.op.widened(), &args)?;
        annotate(&mut out, n);
        if node.ty.dtype.is_narrow_float() {
            // Users widen the rounded value (not `n`): each op's result is rounded once.
            let r = out.add(Op::Convert(node.ty.dtype), &[n])?;
            annotate(&mut out, r);
            own.insert(id, r);
        } else {
            own.insert(id, n);
        }
    }
    out.set_outputs(g.outputs().iter().map(|o| own[o]).collect());
    Ok(Some(out))
}
