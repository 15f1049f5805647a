//! DOT export of a graph (petgraph's `Dot`), and an SVG through Graphviz when `dot` is on the PATH.

use std::io::Write;
use std::process::{Command, Stdio};

use petgraph::dot::{Config, Dot};

use crate::graph::Graph;
use crate::print::attrs_text;

/// The graph in Graphviz's DOT language: one box per node (op, attributes, type), one edge per
/// operand labelled with its position.
pub fn to_dot(g: &Graph) -> String {
    let dot = Dot::with_attr_getters(
        g.petgraph(),
        &[Config::EdgeNoLabel, Config::NodeNoLabel],
        &|_, e| format!("label=\"{}\"", e.weight()),
        &|_, (_, node)| {
            let attrs = attrs_text(&node.op);
            let attrs = if attrs.len() > 40 {
                format!("{}...", &attrs[..37])
            } else {
                attrs
            };
            let label = format!("{} {}\\n{}", node.op.name(), attrs, node.ty).replace('"', "\\\"");
            format!("shape=box label=\"{label}\"")
        },
    );
    format!("{dot:?}")
}

/// Renders the graph to SVG with Graphviz; `None` when `dot` is not installed or fails.
pub fn to_svg(g: &Graph) -> Option<String> {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(to_dot(g).as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
