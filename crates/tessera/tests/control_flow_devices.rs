//! Control flow on 8 devices: collectives inside a loop body meet on every device once per
//! iteration (pmap), and a data-parallel `jit` step with a `scan` inside gives the
//! single-device results, on both backends.

use tessera::prelude::*;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

/// Each device carries `c`; every step adds the psum of `c * x_t` over the devices. Checked
/// against the same recurrence computed on the host.
#[test]
fn a_psum_inside_a_scan_body_meets_on_every_device_each_step() {
    eight_devices();
    let t = 5;
    let xs: Vec<f32> = (0..8 * t).map(|i| ((i % 7) as f32 - 3.0) * 0.125).collect();
    let x = Tensor::from_vec(xs.clone(), [8, t]);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let p = pmap("i", |x: Tensor| {
            let (c, ys) = scan(
                |c: &Tensor, xt: &Tensor| {
                    let s = psum(&(c * xt), "i");
                    let c2 = c + &(&s * 0.5);
                    (c2.clone(), s)
                },
                &Tensor::scalar(1.0f32),
                &x,
                None,
                false,
            );
            (c, ys)
        })
        .backend(backend);
        let (c, ys) = p.call(x.clone()).unwrap();
        // Host reference: every device has the same carry (they all start at 1 and add the
        // same psum).
        let mut carry = 1.0f32;
        let mut want_ys = Vec::new();
        for step in 0..t {
            let s: f32 = (0..8).map(|d| carry * xs[d * t + step]).sum();
            want_ys.push(s);
            carry += s * 0.5;
        }
        for v in c.to_vec::<f32>() {
            assert!(
                (v - carry).abs() <= 1e-5 * carry.abs().max(1.0),
                "{backend:?}: {v} vs {carry}"
            );
        }
        let got = ys.to_vec::<f32>();
        for d in 0..8 {
            for step in 0..t {
                let (a, b) = (got[d * t + step], want_ys[step]);
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{backend:?} dev {d} step {step}: {a} vs {b}"
                );
            }
        }
    }
}

/// A `fori_loop` whose body all-reduces: the loop runs its iterations on all 8 devices in step.
#[test]
fn a_fori_loop_with_a_pmean_in_its_body_agrees_across_devices() {
    eight_devices();
    let x = Tensor::from_vec((0..8).map(|i| i as f32).collect::<Vec<_>>(), [8]);
    let p = pmap("i", |x: Tensor| {
        fori_loop(0, 4, |_i: &Tensor, v: &Tensor| pmean(v, "i") + v * 0.5, &x)
    });
    let got = p.call(x).unwrap().to_vec::<f32>();
    let mut v: Vec<f32> = (0..8).map(|i| i as f32).collect();
    for _ in 0..4 {
        let mean = v.iter().sum::<f32>() / 8.0;
        v = v.iter().map(|x| mean + x * 0.5).collect();
    }
    for (a, b) in got.iter().zip(&v) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
}

fn rnn_loss(w: &Tensor, xs: &Tensor) -> Tensor {
    let b = xs.shape()[1];
    let (h, _) = scan(
        |h: &Tensor, x: &Tensor| ((x.matmul(w) + h).tanh(), ()),
        &Tensor::zeros([b, 4]),
        xs,
        None,
        false,
    );
    h.square().mean()
}

/// A data-parallel step (the batch of the scanned inputs split over 8 devices) with a `scan`
/// inside: the loss and gradient of the single-device run.
#[test]
fn a_sharded_jit_step_with_a_scan_inside_matches_one_device() {
    eight_devices();
    let w = random::normal(&Key::new(1), [3, 4]) * 0.5;
    let xs = random::normal(&Key::new(2), [6, 16, 3]);
    let step = |(w, xs): (Tensor, Tensor)| value_and_grad(|w: &Tensor| rnn_loss(w, &xs))(&w);
    let (l1, g1) = jit(step).call((w.clone(), xs.clone())).unwrap();
    let mesh = Mesh::try_new(&[8], &["dp"]).unwrap();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let xs8 = device_put(xs.clone(), NamedSharding::new(&mesh, P![None, "dp", None]));
        let w8 = device_put(w.clone(), NamedSharding::new(&mesh, P![]));
        let (l, g) = jit(step).backend(backend).call((w8, xs8)).unwrap();
        let (a, b) = (l.item::<f32>(), l1.item::<f32>());
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "{backend:?}: loss {a} vs {b}"
        );
        for (p, q) in g.to_vec::<f32>().iter().zip(g1.to_vec::<f32>()) {
            assert!(
                (p - q).abs() <= 1e-5 * q.abs().max(1e-3),
                "{backend:?}: grad {p} vs {q}"
            );
        }
    }
}
