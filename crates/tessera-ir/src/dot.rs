//! DOT export of a graph (petgraph's `Dot`), and an SVG through Graphviz when `dot` is on the PATH.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
            let attrs = if attrs.chars().count() > 40 {
                format!("{}...", attrs.chars().take(37).collect::<String>())
            } else {
                attrs
            };
            let esc = |t: String| t.replace('\\', "\\\\").replace('"', "\\\"");
            let label = format!(
                "{} {}\\n{}",
                node.op.name(),
                esc(attrs),
                esc(node.ty.to_string())
            );
            format!("shape=box label=\"{label}\"")
        },
    );
    format!("{dot:?}")
}

/// How long Graphviz may take before `to_svg` gives up (and kills it).
pub const SVG_TIMEOUT: Duration = Duration::from_secs(60);

/// The line that installs Graphviz on Debian and Ubuntu.
pub const INSTALL_GRAPHVIZ: &str = "apt-get install -y graphviz";

/// Renders the graph to SVG with Graphviz's `dot -Tsvg`. Errors, with the install line, when
/// `dot` is not on the PATH; with its message when it fails; and after [`SVG_TIMEOUT`].
pub fn to_svg(g: &Graph) -> Result<String, String> {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("Graphviz `dot` could not be run ({e}); install it: {INSTALL_GRAPHVIZ}")
        })?;
    // Writer and readers on their own threads: a large graph fills the pipes both ways.
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("dot: its pipes were not set up".into());
    };
    let text = to_dot(g);
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).map(|_| v)
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        stderr.read_to_end(&mut v).map(|_| v)
    });
    let deadline = Instant::now() + SVG_TIMEOUT;
    let status = loop {
        let state = match child.try_wait() {
            Ok(state) => state,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("dot: {e}"));
            }
        };
        match state {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "dot did not finish within {} s",
                    SVG_TIMEOUT.as_secs()
                ));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    // The process has exited: its pipes are closed, so these joins return.
    let _ = writer.join();
    let out = out.join().map_err(|_| "dot: reader panicked")?;
    let err = err.join().map_err(|_| "dot: reader panicked")?;
    let (out, err) = (
        out.map_err(|e| format!("dot: {e}"))?,
        err.map_err(|e| format!("dot: {e}"))?,
    );
    if !status.success() {
        return Err(format!(
            "dot -Tsvg failed ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        ));
    }
    String::from_utf8(out).map_err(|e| format!("dot: output is not UTF-8: {e}"))
}
