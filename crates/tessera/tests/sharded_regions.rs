//! Region ops under `jit` with sharded inputs on 8 host devices: shardings propagate through the
//! bodies (`tessera_shard`'s slots), so a data-parallel RNN written with `scan` keeps its batch
//! split through the loop, with no gather before it, and trains with the 1-device run's losses;
//! a body that contracts a split dim gets its all-reduce inside the loop.

use tessera::prelude::*;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (x, y) in a.to_vec::<f32>().iter().zip(b.to_vec::<f32>()) {
        assert!(
            (x - y).abs() <= 1e-5 * y.abs().max(1e-2),
            "{what}: {x} vs {y}"
        );
    }
}

const COLLECTIVES: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "axis_index",
];

/// The collectives of a per-device program's text, split into those of the top level before
/// the first region op, those inside region bodies, and those after: (before, inside, after).
fn collectives(text: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut before, mut inside, mut after) = (Vec::new(), Vec::new(), Vec::new());
    let mut seen_region = false;
    for line in text.lines() {
        let depth = line.len() - line.trim_start().len();
        let is_region = ["= scan ", "= while ", "= case "]
            .iter()
            .any(|r| line.contains(r));
        if depth == 2 && is_region {
            seen_region = true;
        }
        if !COLLECTIVES
            .iter()
            .any(|c| line.contains(&format!("= {c} ")))
        {
            continue;
        }
        let l = line.trim().to_string();
        if depth > 2 {
            inside.push(l);
        } else if seen_region {
            after.push(l);
        } else {
            before.push(l);
        }
    }
    (before, inside, after)
}

#[derive(Tree, Clone)]
struct Rnn {
    w: Tensor,
    u: Tensor,
    v: Tensor,
}

const T: usize = 6;
const B: usize = 16;
const D: usize = 3;
const H: usize = 5;

fn rnn_init() -> Rnn {
    let k = Key::new(0).split_n(3);
    Rnn {
        w: random::normal(&k[0], [H, H]) * 0.3,
        u: random::normal(&k[1], [D, H]) * 0.3,
        v: random::normal(&k[2], [H, 1]) * 0.3,
    }
}

/// The final hidden state of an RNN over the leading (time) axis of `xs` (`[T, B, D]`).
fn rnn_last(p: &Rnn, xs: &Tensor) -> Tensor {
    let h0 = Tensor::zeros([B, H]);
    let (h, ys) = scan(
        |h: &Tensor, x: &Tensor| {
            let h = (h.matmul(&p.w) + x.matmul(&p.u)).tanh();
            (h.clone(), h)
        },
        &h0,
        xs,
        None,
        false,
    );
    // The stacked outputs are used too, so the ys slot is checked end to end.
    h + ys.sum_axes([0]) * 0.0
}

fn rnn_loss(p: &Rnn, xs: &Tensor, y: &Tensor) -> Tensor {
    (rnn_last(p, xs).matmul(&p.v) - y).square().mean()
}

fn rnn_step(p: Rnn, xs: Tensor, y: Tensor) -> (Rnn, Tensor) {
    let (l, g) = value_and_grad(|p: &Rnn| rnn_loss(p, &xs, &y))(&p);
    (tree::map2(&p, &g, |p, g| p - g * 0.1), l)
}

fn rnn_data() -> (Tensor, Tensor) {
    (
        random::normal(&Key::new(1), [T, B, D]),
        random::normal(&Key::new(2), [B, 1]),
    )
}

#[test]
fn a_batch_sharded_rnn_scan_keeps_its_batch_split_through_the_loop() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let (xs, _) = rnn_data();
    let p = device_put(rnn_init(), NamedSharding::new(&mesh, P![]));
    let sx = device_put(xs.clone(), NamedSharding::new(&mesh, P![None, "dp"]));
    let f = jit(|(p, xs): (Rnn, Tensor)| rnn_last(&p, &xs));
    let lowered = f.lower(&(p.clone(), sx.clone())).unwrap();
    let local = lowered.per_device_ir();
    let (before, inside, after) = collectives(&local);
    assert!(
        before.is_empty(),
        "gathered before the loop: {before:?}\n{local}"
    );
    assert!(
        inside.is_empty(),
        "communicates in the loop: {inside:?}\n{local}"
    );
    assert!(
        after.is_empty(),
        "communicates after the loop: {after:?}\n{local}"
    );
    // The loop runs on each device's rows: local carries and slices.
    assert!(local.contains(&format!("f32[{},{H}]", B / 8)), "{local}");
    assert!(
        local.contains(&format!("f32[{T},{},{D}]", B / 8)),
        "{local}"
    );
    let got = f.call((p.clone(), sx)).unwrap();
    let want = jit(|(p, xs): (Rnn, Tensor)| rnn_last(&p, &xs))
        .call((rnn_init(), xs))
        .unwrap();
    close(&got, &want, "final hidden state");
}

#[test]
fn a_data_parallel_rnn_trains_with_the_single_device_losses() {
    eight_devices();
    let (xs, y) = rnn_data();
    let single = jit(|(p, xs, y): (Rnn, Tensor, Tensor)| rnn_step(p, xs, y));
    let mut want = Vec::new();
    let mut p = rnn_init();
    for _ in 0..3 {
        let (np, l) = single.call((p, xs.clone(), y.clone())).unwrap();
        want.push((np.clone(), l));
        p = np;
    }
    let mesh = Mesh::new([8], ["dp"]);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let mut p = device_put(rnn_init(), NamedSharding::new(&mesh, P![]));
        let sx = device_put(xs.clone(), NamedSharding::new(&mesh, P![None, "dp"]));
        let sy = device_put(y.clone(), NamedSharding::new(&mesh, P!["dp"]));
        let f = jit(|(p, xs, y): (Rnn, Tensor, Tensor)| rnn_step(p, xs, y)).backend(backend);
        let local = f
            .lower(&(p.clone(), sx.clone(), sy.clone()))
            .unwrap()
            .per_device_ir();
        let (before, _, _) = collectives(&local);
        assert!(
            before.is_empty(),
            "gathered before the loop: {before:?}\n{local}"
        );
        for (i, (wp, wl)) in want.iter().enumerate() {
            let (np, l) = f.call((p, sx.clone(), sy.clone())).unwrap();
            let what = format!("{backend:?} step {i}");
            close(&l, wl, &format!("{what} loss"));
            close(&np.w, &wp.w, &format!("{what} w"));
            close(&np.u, &wp.u, &format!("{what} u"));
            close(&np.v, &wp.v, &format!("{what} v"));
            p = np;
        }
    }
}

#[test]
fn a_body_contracting_a_split_dim_reduces_inside_the_loop() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let xs = random::normal(&Key::new(3), [4, 16]);
    let w = random::normal(&Key::new(4), [16, 3]);
    let run = |(xs, w): (Tensor, Tensor)| {
        let (c, _) = scan(
            |c: &Tensor, x: &Tensor| {
                let c = (c + x.matmul(&w)).tanh();
                (c.clone(), c)
            },
            &Tensor::zeros([3]),
            &xs,
            None,
            false,
        );
        c
    };
    let (xs_host, w_host) = (xs.clone(), w.clone());
    let want = jit(run).call((xs.clone(), w.clone())).unwrap();
    let sxs = device_put(xs, NamedSharding::new(&mesh, P![None, "dp"]));
    let sw = device_put(w, NamedSharding::new(&mesh, P!["dp"]));
    let f = jit(run);
    let local = f.lower(&(sxs.clone(), sw.clone())).unwrap().per_device_ir();
    let (before, inside, _) = collectives(&local);
    assert!(
        before.is_empty(),
        "gathered before the loop: {before:?}\n{local}"
    );
    assert_eq!(inside.len(), 1, "{inside:?}\n{local}");
    assert!(
        inside[0].starts_with('%') && inside[0].contains(r#"all_reduce"#),
        "{local}"
    );
    assert!(inside[0].contains(r#"axes=["dp"]"#), "{local}");
    // The split contraction sums in another order than the single device's, so both are
    // checked against an f64 reference: 16-term dot products of unit normals through 4 tanh
    // steps stay well within 1e-5 in f32.
    let (xv, wv) = (xs_host.to_vec::<f32>(), w_host.to_vec::<f32>());
    let mut c = [0f64; 3];
    for t in 0..4 {
        let mut next = [0f64; 3];
        for (j, n) in next.iter_mut().enumerate() {
            let dot: f64 = (0..16)
                .map(|k| xv[t * 16 + k] as f64 * wv[k * 3 + j] as f64)
                .sum();
            *n = (c[j] + dot).tanh();
        }
        c = next;
    }
    let got = f.call((sxs, sw)).unwrap();
    for (what, t) in [("sharded", &got), ("single device", &want)] {
        for (j, v) in t.to_vec::<f32>().iter().enumerate() {
            assert!(
                (*v as f64 - c[j]).abs() <= 1e-5,
                "{what} carry {j}: {v} vs {}",
                c[j]
            );
        }
    }
}
