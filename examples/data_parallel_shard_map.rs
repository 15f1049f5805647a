//! Both seed programs written with `shard_map`, the per-device style that replaces pmap in new
//! JAX code: the step sees one device's rows, averages its gradients and loss over the mesh
//! with `pmean`, and returns parameters the same on every device (out_specs `P()`, which the
//! compiler checks). The pmap seed (64 rows per device) prints JAX's pmap losses, 1.042890,
//! 1.030457, 1.021400, 1.014672, 1.009591 on 8 devices; the sharding seed (256 rows split over
//! `dp`) prints JAX's jit losses, 1.070808, 1.050034, 1.034792, 1.023355, 1.014618.
//!
//! Run: `TESSERA_DEVICES=8 cargo run --release --example data_parallel_shard_map`

use tessera::prelude::*;

#[path = "common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, loss, seed_data};

/// The per-device step: local gradients and loss, averaged over `axis` with `pmean`.
fn local_step(axis: &'static str) -> impl Fn((Mlp, Tensor, Tensor)) -> (Mlp, Tensor) {
    move |(p, x, y)| {
        let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
        let g = tree::map(&g, |g| pmean(g, axis));
        (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, axis))
    }
}

/// `steps` steps of the step shard-mapped over a mesh of every device on axis `axis`, with
/// data `x`, `y` split over it; the losses, and the per-device program.
fn train(
    axis: &'static str,
    x: Tensor,
    y: Tensor,
    steps: usize,
) -> Result<(Vec<f32>, Mlp, String)> {
    let mesh = Mesh::new([device_count()], [axis]);
    let step = shard_map(
        local_step(axis),
        &mesh,
        specs![P![], P![axis], P![axis]],
        specs![P![], P![]],
    );
    let mut params = init(Key::new(0), 10, 32, 1);
    let ir = step.lower(&(params.clone(), x.clone(), y.clone()))?;
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        losses.push(l.item::<f32>());
    }
    Ok((losses, params, ir.per_device_ir()))
}

/// The pmap seed: 64 rows per device.
pub fn train_pmap_seed(steps: usize) -> Result<(Vec<f32>, Mlp, String)> {
    let n = device_count();
    let x = random::normal(&Key::new(1), [n * 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]);
    train("i", x, y, steps)
}

/// The sharding seed: 256 rows split over `dp`.
pub fn train_sharding_seed(steps: usize) -> Result<(Vec<f32>, Mlp, String)> {
    let (x, y) = seed_data(256);
    train("dp", x, y, steps)
}

fn main() -> Result<()> {
    println!("devices: {}", device_count());
    let (pmap_losses, _, _) = train_pmap_seed(50)?;
    let (sharding_losses, params, per_device) = train_sharding_seed(50)?;
    println!("per-device program of the sharding seed's step:\n{per_device}");
    for i in (0..50).step_by(10) {
        println!(
            "Step {i}: Loss = {:.6} (pmap seed), {:.6} (sharding seed)",
            pmap_losses[i], sharding_losses[i]
        );
    }
    println!("w1 {}", params.w1.sharding().expect("placed"));
    Ok(())
}
