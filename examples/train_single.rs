//! The seed program on one device: a 10 -> 32 tanh -> 1 MLP trained with MSE and SGD
//! (learning rate 0.01) for 50 steps, with JAX's PRNG for parameters and data. JAX 0.10.2 prints
//! 1.070808, 1.050034, 1.034792, 1.023355, 1.014618 for steps 0 to 40.
//!
//! Run: `cargo run --release --example train_single`

use tessera::prelude::*;

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn init(key: Key, i: usize, h: usize, o: usize) -> Mlp {
    let [k1, k2] = key.split();
    Mlp {
        w1: random::normal(&k1, [i, h]) * 0.1,
        b1: Tensor::zeros([h]),
        w2: random::normal(&k2, [h, o]) * 0.1,
        b2: Tensor::zeros([o]),
    }
}

fn forward(p: &Mlp, x: &Tensor) -> Tensor {
    (x.matmul(&p.w1) + &p.b1).tanh().matmul(&p.w2) + &p.b2
}

fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    (forward(p, x) - y).square().mean()
}

/// Trains for `steps` steps and returns the loss of every step.
pub fn train(steps: usize) -> Result<Vec<f32>> {
    let mut params = init(Key::new(0), 10, 32, 1);
    let x = random::normal(&Key::new(1), [256, 10]);
    let y = random::normal(&Key::new(2), [256, 1]);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| {
        let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
        (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
    })
    .named("train_step");
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        losses.push(l.item::<f32>());
    }
    Ok(losses)
}

fn main() -> Result<()> {
    for (i, l) in train(50)?.iter().enumerate().step_by(10) {
        println!("Step {i}: Loss = {l:.6}");
    }
    Ok(())
}
