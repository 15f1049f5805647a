//! Data and model parallelism on a 4x2 mesh (`dp` x `mp`), Megatron style: the batch split over
//! `dp`, the first layer's columns and the second layer's rows over `mp`. The compiler keeps
//! the hidden activations split over both axes and completes the second layer's partial sums
//! with an all_reduce over `mp`; the losses equal the single-device program's.
//!
//! The same model on a mesh of Explicit axes (`Mesh::explicit`, JAX 0.10's `jax.make_mesh`
//! default): every value's sharding is part of its type, and the second product, whose
//! contracting dim is split over `mp`, is ambiguous until given `out_sharding` (JAX's error
//! otherwise); with it, the program compiles to the same two all-reduces.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example mesh_2d`

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, seed_data, sgd_step};

/// The seed parameters and data on the 4x2 mesh, Megatron style: the batch over `dp`, the
/// first layer's columns and the second layer's rows over `mp`.
fn placed(mesh: &Mesh) -> (Mlp, Tensor, Tensor) {
    let p = init(Key::new(0), 10, 32, 1);
    let put = |t: Tensor, spec: PartitionSpec| device_put(t, NamedSharding::new(mesh, spec));
    let params = Mlp {
        w1: put(p.w1, P![None, "mp"]),
        b1: put(p.b1, P!["mp"]),
        w2: put(p.w2, P!["mp", None]),
        b2: put(p.b2, P![]),
    };
    let (x, y) = seed_data(256);
    (params, put(x, P!["dp", None]), put(y, P!["dp", None]))
}

/// The seed loss with the second product's sharding given, as an Explicit mesh needs.
fn explicit_loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&p.w1) + &p.b1).tanh();
    (h.matmul_out(&p.w2, P!["dp", None]) + &p.b2 - y)
        .square()
        .mean()
}

/// The losses of `steps` steps on the Explicit 4x2 mesh, the per-device IR, and the error the
/// program without `out_sharding` gets.
pub fn train_explicit(steps: usize) -> Result<(Vec<f32>, String, String)> {
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let (mut params, x, y) = placed(&mesh);
    let ambiguous = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y))
        .call((params.clone(), x.clone(), y.clone()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| {
        let (l, g) = value_and_grad(|p: &Mlp| explicit_loss(p, &x, &y))(&p);
        (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
    })
    .named("train_step_explicit");
    let per_device = step
        .lower(&(params.clone(), x.clone(), y.clone()))?
        .per_device_ir();
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (np, l) = step.call((params, x.clone(), y.clone()))?;
        params = np;
        losses.push(l.item::<f32>());
    }
    Ok((losses, per_device, ambiguous))
}

/// The losses of `steps` steps on the 4x2 mesh, the per-device IR, and the placed inputs.
pub fn train(steps: usize) -> Result<(Vec<f32>, String, Tensor, Tensor)> {
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let (mut params, x, y) = placed(&mesh);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("train_step_2d");
    let per_device = step
        .lower(&(params.clone(), x.clone(), y.clone()))?
        .per_device_ir();
    let w1 = params.w1.clone();
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (np, l) = step.call((params, x.clone(), y.clone()))?;
        params = np;
        losses.push(l.item::<f32>());
    }
    Ok((losses, per_device, x, w1))
}

fn main() -> Result<()> {
    let (losses, per_device, x, w1) = train(50)?;
    println!("x {}:", x.sharding().expect("placed"));
    visualize_array_sharding(&x);
    println!("w1 {}:", w1.sharding().expect("placed"));
    visualize_array_sharding(&w1);
    println!("per-device program:\n{per_device}");
    for (i, l) in losses.iter().enumerate().step_by(10) {
        println!("Step {i}: Loss = {l:.6}");
    }
    let (explicit, per_device, ambiguous) = train_explicit(50)?;
    println!("\nExplicit axes, without out_sharding:\n  {ambiguous}");
    println!("with out_sharding=P('dp', None), per-device program:\n{per_device}");
    for (i, l) in explicit.iter().enumerate().step_by(10) {
        println!("Step {i}: Loss = {l:.6}");
    }
    Ok(())
}
