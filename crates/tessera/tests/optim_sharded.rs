//! `tessera::optim` on devices (issue 16, item 3): the optimizer state shards with the step.
//! (Its own binary: it sets `TESSERA_DEVICES` before any other thread reads the environment.)

use tessera::optim::{self, GradientTransformation};
use tessera::prelude::*;

/// The optimizer state is a tree: placed replicated on an 8-device mesh with the data split,
/// the jitted step gives the one-device parameters, and the state comes back placed.
#[test]
fn the_state_shards_with_the_step() {
    // SAFETY: the only test of this binary, so no other thread reads the environment; set
    // before the device pool starts.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    let mesh = Mesh::new([8], ["dp"]);
    let x = random::normal(&Key::new(1), [64, 3]);
    let y = x.sum_axes(keepdims(1));
    let opt = optim::clip_by_global_norm(1.0).then(optim::adam(1e-2));
    let step = jit(|(w, s, x, y): (Tensor, _, Tensor, Tensor)| {
        let g = grad(|w: &Tensor| (x.matmul(w) - &y).square().mean())(&w);
        let (u, s) = opt.update(g, &s, &w);
        (optim::apply_updates(&w, &u), s)
    });
    let w0 = Tensor::zeros([3, 1]);
    let (mut w1, mut s1) = (w0.clone(), opt.init(&w0));
    let rep = NamedSharding::new(&mesh, P![]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let (mut w8, mut s8) = (
        device_put(w0.clone(), &rep),
        device_put(opt.init(&w0), &rep),
    );
    let (x8, y8) = (device_put(x.clone(), &split), device_put(y.clone(), &split));
    for _ in 0..5 {
        (w1, s1) = step.call((w1, s1, x.clone(), y.clone())).unwrap();
        (w8, s8) = step.call((w8, s8, x8.clone(), y8.clone())).unwrap();
    }
    let close = tessera::testing::Tol::new(1e-6, 1e-7);
    tessera::testing::assert_allclose(&w8, &w1, close);
    let (m1, m8) = (&s1.1.adam.mu, &s8.1.adam.mu);
    tessera::testing::assert_allclose(m8, m1, close);
    assert_eq!(s8.1.adam.count.item::<i32>(), 5);
    assert!(m8.sharding().is_some(), "the state stays on the mesh");
}
