//! The seed MLP's loss and gradients against JAX's (`fixtures/seed_grads.json`, made by
//! `fixtures/seed_grads.py`), at the initial parameters and after one SGD step.

use serde_json::Value;
use tessera::prelude::*;

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&p.w1) + &p.b1).tanh();
    (h.matmul(&p.w2) + &p.b2 - y).square().mean()
}

fn values(v: &Value) -> Vec<f32> {
    v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn check(name: &str, got: &Tensor, want: &Value) {
    let shape: Vec<usize> = want["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(got.shape(), shape.as_slice(), "{name}");
    let want = values(want);
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.to_vec::<f32>().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs() + 1e-6 * scale,
            "{name}[{i}]: {g} vs JAX {w}"
        );
    }
}

#[test]
fn seed_loss_gradients_match_jax() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/seed_grads.json")).unwrap();
    let [k1, k2] = Key::new(0).split();
    let mut p = Mlp {
        w1: random::normal(&k1, [10, 32]) * 0.1,
        b1: Tensor::zeros([32]),
        w2: random::normal(&k2, [32, 1]) * 0.1,
        b2: Tensor::zeros([1]),
    };
    let x = random::normal(&Key::new(1), [256, 10]);
    let y = random::normal(&Key::new(2), [256, 1]);
    let vg = jit(|(p, x, y): (Mlp, Tensor, Tensor)| value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p));
    for step in ["step0", "step1"] {
        let want = &fixture[step];
        let (l, g) = vg.call((p.clone(), x.clone(), y.clone())).unwrap();
        check("loss", &l, &want["loss"]);
        check("grad w1", &g.w1, &want["grad_w1"]);
        check("grad b1", &g.b1, &want["grad_b1"]);
        check("grad w2", &g.w2, &want["grad_w2"]);
        check("grad b2", &g.b2, &want["grad_b2"]);
        // The eager (interpreted) transformation computes the same gradient.
        let (le, ge) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
        check("eager loss", &le, &want["loss"]);
        check("eager grad w1", &ge.w1, &want["grad_w1"]);
        p = tree::map2(&p, &g, |p, g| p - g * 0.01);
    }
}

/// The simplification pass changes no loss: 41 training steps with and without it agree.
#[test]
fn simplification_changes_no_loss() {
    let [k1, k2] = Key::new(0).split();
    let p0 = Mlp {
        w1: random::normal(&k1, [10, 32]) * 0.1,
        b1: Tensor::zeros([32]),
        w2: random::normal(&k2, [32, 1]) * 0.1,
        b2: Tensor::zeros([1]),
    };
    let x = random::normal(&Key::new(1), [256, 10]);
    let y = random::normal(&Key::new(2), [256, 1]);
    let run = |on: bool| -> Vec<f32> {
        let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| {
            let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
            (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
        })
        .simplify(on);
        let mut p = p0.clone();
        (0..41)
            .map(|_| {
                let (np, l) = step.call((p.clone(), x.clone(), y.clone())).unwrap();
                p = np;
                l.item::<f32>()
            })
            .collect()
    };
    let (on, off) = (run(true), run(false));
    for (a, b) in on.iter().zip(&off) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{a} vs {b}");
    }
}
