//! Traces the seed MLP's loss (10 -> 32 tanh -> 1, MSE, batch 256), prints its IR, checks that
//! the text parses back to the same graph, and writes `inspect.svg` when Graphviz is installed.
//!
//! Run: `cargo run --example inspect`

use tessera::prelude::*;

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn forward(p: &Mlp, x: &Tensor) -> Tensor {
    (x.matmul(&p.w1) + &p.b1).tanh().matmul(&p.w2) + &p.b2
}

fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    (forward(p, x) - y).square().mean()
}

/// Deterministic stand-in values: the IR only depends on shapes.
fn filled(shape: [usize; 2], scale: f32) -> Tensor {
    let n = shape[0] * shape[1];
    Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 7919 % 101) as f32 / 50.0 - 1.0) * scale)
            .collect(),
        shape,
    )
}

fn main() -> Result<()> {
    let params = Mlp {
        w1: filled([10, 32], 0.1),
        b1: Tensor::zeros([32]),
        w2: filled([32, 1], 0.1),
        b2: Tensor::zeros([1]),
    };
    let x = filled([256, 10], 1.0);
    let y = filled([256, 1], 1.0);

    let loss_fn = jit(|(p, x, y): (Mlp, Tensor, Tensor)| loss(&p, &x, &y)).named("loss");
    let lowered = loss_fn.lower(&(params.clone(), x.clone(), y.clone()))?;
    let text = lowered.ir();
    println!("{text}");

    let parsed = tessera::ir::parse(&text)?;
    assert!(
        parsed.structurally_eq(lowered.graph()),
        "the printed IR parses back to the same graph"
    );
    println!(
        "// the text parses back to the same graph ({} nodes)",
        parsed.node_count()
    );

    let l = loss_fn.call((params.clone(), x.clone(), y.clone()))?;
    let eager = loss(&params, &x, &y);
    println!(
        "// loss: jit {:.6}, eager {:.6}",
        l.item::<f32>(),
        eager.item::<f32>()
    );

    // An SVG of the graph when Graphviz is installed (`lowered.dot()` is the DOT text).
    match lowered.svg() {
        Ok(svg) => {
            std::fs::write("inspect.svg", svg).map_err(|e| Error::Io(e.to_string()))?;
            println!("// wrote inspect.svg");
        }
        Err(e) => println!("// no SVG: {e}"),
    }
    Ok(())
}
