//! The IR text printer. The grammar is in `docs/ir.md`; `parse::parse` reads this text back to
//! a structurally equal graph.
//!
//! Values are renumbered `%0, %1, ...` in the canonical order (`Graph::topo_order`), so two
//! structurally equal graphs print the same text.

use std::collections::HashMap;
use std::fmt::Write;

use crate::graph::{Graph, NodeId};
use crate::literal::Literal;
use crate::op::{CollectiveOp, Op};

/// Prints a graph (its mesh line, if any, then the function) in the IR text format.
pub fn print(g: &Graph) -> String {
    let mut out = String::new();
    if let Some(mesh) = &g.mesh {
        writeln!(out, "{mesh}").unwrap();
    }
    write_func(&mut out, g, &format!("func @{}", g.name), 0);
    out
}

/// Writes `g` as `header(params) { nodes return }`, nested `depth` levels deep (two spaces a
/// level). A region op's bodies follow its line, one level deeper, each under its label; each
/// body numbers its values from `%0`, as it is a function of its own.
fn write_func(out: &mut String, g: &Graph, header: &str, depth: usize) {
    let pad = "  ".repeat(depth);
    let order = g.try_topo_order().unwrap_or_else(|| g.node_ids().collect());
    let names: HashMap<NodeId, String> = order
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, format!("%{i}")))
        .collect();
    let name = |id: &NodeId| names.get(id).cloned().unwrap_or_else(|| "%?".into());

    let params_have_locs = g
        .params()
        .iter()
        .any(|&p| g.node(p).loc.is_some() || g.node(p).why.is_some());
    write!(out, "{pad}{header}(").unwrap();
    for (i, &p) in g.params().iter().enumerate() {
        let node = g.node(p);
        if params_have_locs {
            write!(out, "\n{pad}    ").unwrap();
        } else if i > 0 {
            write!(out, ", ").unwrap();
        }
        write!(out, "{}: {}", name(&p), node.ty).unwrap();
        if let Some(s) = &node.sharding {
            write!(out, " {s}").unwrap();
        }
        if params_have_locs {
            write!(out, ",").unwrap();
            if let Some(c) = comment(node) {
                write!(out, "  # {c}").unwrap();
            }
        }
    }
    if params_have_locs {
        write!(out, "\n{pad}").unwrap();
    }
    writeln!(out, ") {{").unwrap();
    for &id in &order {
        let node = g.node(id);
        if let Op::Parameter(_) = node.op {
            continue;
        }
        let mut line = format!("{pad}  {} = {}", name(&id), node.op.name());
        let operands: Vec<String> = g.operands(id).iter().map(name).collect();
        if !operands.is_empty() {
            write!(line, " {}", operands.join(", ")).unwrap();
        }
        let attrs = attrs_text(&node.op);
        if !attrs.is_empty() {
            write!(line, " {attrs}").unwrap();
        }
        if let Op::Region(r) = &node.op {
            // The region's result types; its own node is a token.
            let _ = r;
            write!(line, " : ({})", result_types_text(g, id).join(", ")).unwrap();
        } else {
            write!(line, " : {}", node.ty).unwrap();
        }
        if let Some(s) = &node.sharding {
            write!(line, " {s}").unwrap();
        }
        if let Some(c) = comment(node) {
            write!(line, "  # {c}").unwrap();
        }
        writeln!(out, "{line}").unwrap();
        if let Op::Region(r) = &node.op {
            for (label, body) in r.regions() {
                write_func(out, body, label, depth + 2);
            }
        }
    }
    let outs: Vec<String> = g.outputs().iter().map(name).collect();
    if outs.is_empty() {
        writeln!(out, "{pad}  return").unwrap();
    } else {
        writeln!(out, "{pad}  return {}", outs.join(", ")).unwrap();
    }
    writeln!(out, "{pad}}}").unwrap();
}

/// The result types of region node `id` as text (`?` when its operands do not fit its bodies,
/// which the verifier reports; the printer prints what it is given).
fn result_types_text(g: &Graph, id: NodeId) -> Vec<String> {
    match g.result_types(id) {
        Ok(types) => types.iter().map(|t| t.to_string()).collect(),
        Err(_) => vec!["?".into()],
    }
}

fn ints<T: ToString>(v: &[T]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    )
}

fn axes(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// A constant's payload: one element when every element is equal (a splat), else the list.
pub fn literal_text(lit: &Literal) -> String {
    let n = lit.data.len();
    if n > 0 && lit.data.is_splat() {
        return lit.data.element_text(0);
    }
    let elems: Vec<String> = (0..n).map(|i| lit.data.element_text(i)).collect();
    format!("[{}]", elems.join(", "))
}

/// The attributes of an op as printed after its operands. Attributes that the result type
/// already states (a broadcast's or reshape's shape, a conversion's dtype) are not repeated.
pub fn attrs_text(op: &Op) -> String {
    match op {
        Op::Parameter(i) => format!("index={i}"),
        Op::Constant(lit) => literal_text(lit),
        Op::Iota { dim, .. } => format!("dim={dim}"),
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select => String::new(),
        Op::Convert(_) | Op::Bitcast(_) | Op::Reshape(_) => String::new(),
        Op::BroadcastInDim { dims, .. } => format!("dims={}", ints(dims)),
        Op::Transpose(perm) => format!("perm={}", ints(perm)),
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let mut s = format!("start={} limit={}", ints(start), ints(limit));
            if stride.iter().any(|&x| x != 1) {
                write!(s, " stride={}", ints(stride)).unwrap();
            }
            s
        }
        Op::Concatenate { dim } => format!("dim={dim}"),
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let mut s = format!("low={} high={}", ints(low), ints(high));
            if interior.iter().any(|&x| x != 0) {
                write!(s, " interior={}", ints(interior)).unwrap();
            }
            s
        }
        Op::Reduce { axes, .. } => format!("axes={}", ints(axes)),
        Op::ArgMax { axis } => format!("axis={axis}"),
        Op::DotGeneral(d) => {
            let mut s = String::new();
            if !d.lhs_batch.is_empty() {
                write!(s, "batch={}x{} ", ints(&d.lhs_batch), ints(&d.rhs_batch)).unwrap();
            }
            write!(
                s,
                "contracting={}x{}",
                ints(&d.lhs_contract),
                ints(&d.rhs_contract)
            )
            .unwrap();
            s
        }
        Op::Collective(CollectiveOp::AllReduce { kind, axes: a }) => {
            format!("{} axes={}", kind.name(), axes(a))
        }
        Op::Collective(CollectiveOp::AllGather { dim, axes: a }) => {
            format!("dim={dim} axes={}", axes(a))
        }
        Op::Collective(CollectiveOp::ReduceScatter { kind, dim, axes: a }) => {
            format!("{} dim={dim} axes={}", kind.name(), axes(a))
        }
        Op::Collective(CollectiveOp::AllToAll {
            split_dim,
            concat_dim,
            axes: a,
        }) => format!(
            "split_dim={split_dim} concat_dim={concat_dim} axes={}",
            axes(a)
        ),
        Op::Collective(CollectiveOp::CollectivePermute { axes: a, pairs }) => {
            let p: Vec<String> = pairs.iter().map(|(s, d)| format!("[{s},{d}]")).collect();
            format!("axes={} pairs=[{}]", axes(a), p.join(","))
        }
        Op::Collective(CollectiveOp::AxisIndex { axes: a }) => format!("axes={}", axes(a)),
        Op::ShardingConstraint(s) => format!("sharding={s}"),
        Op::StopGradient => String::new(),
        Op::Region(r) => r.attrs_text(),
        Op::GetResult { index, .. } => format!("index={index}"),
        Op::Conv(cd) => crate::conv::conv_attrs(cd),
        Op::ReduceWindow { win, .. } => crate::conv::window_attrs(win),
        Op::Gather(d) => crate::gather::gather_attrs_text(d),
        Op::Scatter(d) => crate::gather::scatter_attrs_text(d),
        Op::Sort {
            dim,
            num_keys,
            output,
        } => format!("dim={dim} keys={num_keys} output={output}"),
        Op::Cumulative { axis, reverse, .. } => {
            if *reverse {
                format!("axis={axis} reverse=1")
            } else {
                format!("axis={axis}")
            }
        }
        Op::Rev { dims } => format!("dims={}", ints(dims)),
    }
}

/// A node's location comment: its `loc`, then why it is sharded as it is.
fn comment(node: &crate::graph::Node) -> Option<String> {
    match (&node.loc, &node.why) {
        (Some(loc), Some(why)) => Some(format!("{loc} [sharding: {why}]")),
        (Some(loc), None) => Some(loc.clone()),
        (None, Some(why)) => Some(format!("[sharding: {why}]")),
        (None, None) => None,
    }
}
