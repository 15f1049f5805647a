//! `Lowered::svg()` renders the program with Graphviz (issue 16, item 8). The suite installs
//! Graphviz when it can (`support/system.rs`), so this path is always tested.

#[path = "support/system.rs"]
mod system;

use tessera::prelude::*;

#[test]
fn lowered_renders_to_svg_with_graphviz() {
    system::require("dot", "-V", "graphviz");
    let f = jit(|(w, x): (Tensor, Tensor)| x.matmul(&w).tanh().sum());
    let lowered = f
        .lower(&(Tensor::ones([3, 2]), Tensor::ones([4, 3])))
        .unwrap();
    let svg = lowered.svg().unwrap();
    assert!(svg.contains("<svg"), "{svg}");
    for op in ["dot_general", "tanh", "reduce_sum"] {
        assert!(svg.contains(op), "the SVG shows {op}:\n{svg}");
    }
    // One box per node of the program.
    let boxes = svg.matches("class=\"node\"").count();
    assert_eq!(boxes, lowered.graph().node_count(), "{svg}");
}

/// Labels with quotes, backslashes and non-ASCII names survive the DOT escaping: Graphviz
/// parses the text (it would fail on a broken string).
#[test]
fn labels_are_escaped_for_dot() {
    system::require("dot", "-V", "graphviz");
    let name = "i\"\\é";
    // Over one device the psum is dropped (the identity); `axis_index` stays, named.
    let p = pmap(name, move |x: Tensor| {
        psum(&x.exp(), name) + axis_index(name).astype(DType::F32)
    });
    let lowered = p.lower(&Tensor::ones([1, 2])).unwrap();
    assert!(lowered.dot().contains("\\\""), "{}", lowered.dot());
    let svg = lowered.svg().unwrap();
    assert!(svg.contains("<svg") && svg.contains("axis_index"), "{svg}");
}
