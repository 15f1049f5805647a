//! Sharded execution on 8 host devices: every sharded program against its single-device run
//! (1, 2, 4, 8 devices and 2D meshes, both backends), the seed step's collectives, pmap with
//! collectives and their gradients, `visualize_array_sharding`, and bad input.

use tessera::prelude::*;

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn init(key: Key) -> Mlp {
    let [k1, k2] = key.split();
    Mlp {
        w1: random::normal(&k1, [10, 32]) * 0.1,
        b1: random::normal(&k2, [32]) * 0.1,
        w2: random::normal(&k2, [32, 1]) * 0.1,
        b2: Tensor::full([1], 0.1),
    }
}

fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&p.w1) + &p.b1).tanh();
    (h.matmul(&p.w2) + &p.b2 - y).square().mean()
}

fn step(p: Mlp, x: Tensor, y: Tensor) -> (Mlp, Tensor) {
    let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
    (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
}

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

fn data() -> (Tensor, Tensor) {
    (
        random::normal(&Key::new(1), [64, 10]),
        random::normal(&Key::new(2), [64, 1]),
    )
}

/// A mesh (shape, axis names) and the placements of x, w1 and w2.
type Layout = (
    Vec<usize>,
    Vec<&'static str>,
    PartitionSpec,
    PartitionSpec,
    PartitionSpec,
);

#[test]
fn sharded_steps_match_the_single_device_run() {
    eight_devices();
    let (x, y) = data();
    let single = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let (mut want_p, mut want_l) = (init(Key::new(0)), Tensor::zeros([]));
    let mut wants = Vec::new();
    for _ in 0..3 {
        let (p, l) = single.call((want_p, x.clone(), y.clone())).unwrap();
        want_p = p.clone();
        want_l = l.clone();
        wants.push((p, l));
    }
    let _ = want_l;
    let layouts: Vec<Layout> = vec![
        (vec![1], vec!["dp"], P!["dp"], P![], P![]),
        (vec![2], vec!["dp"], P!["dp"], P![], P![]),
        (vec![4], vec!["dp"], P!["dp"], P![], P![]),
        (vec![8], vec!["dp"], P!["dp"], P![], P![]),
        (
            vec![4, 2],
            vec!["dp", "mp"],
            P!["dp", None],
            P![None, "mp"],
            P!["mp", None],
        ),
        (
            vec![2, 4],
            vec!["dp", "mp"],
            P!["dp", None],
            P![None, "mp"],
            P!["mp", None],
        ),
        (vec![2, 2], vec!["a", "b"], P![("a", "b")], P![], P![]),
    ];
    for (shape, names, xs, w1s, w2s) in layouts {
        let mesh = Mesh::try_new(&shape, &names).unwrap();
        for backend in [Backend::Cranelift, Backend::Interpreter] {
            let put =
                |t: Tensor, s: &PartitionSpec| device_put(t, NamedSharding::new(&mesh, s.clone()));
            let p0 = init(Key::new(0));
            let mut p = Mlp {
                w1: put(p0.w1, &w1s),
                b1: put(p0.b1, &P![]),
                w2: put(p0.w2, &w2s),
                b2: put(p0.b2, &P![]),
            };
            let (sx, sy) = (put(x.clone(), &xs), put(y.clone(), &xs));
            let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y)).backend(backend);
            for (i, (wp, wl)) in wants.iter().enumerate() {
                let (np, l) = f.call((p, sx.clone(), sy.clone())).unwrap();
                let what = format!("{shape:?} {backend:?} step {i}");
                close(&l, wl, &format!("{what} loss"));
                close(&np.w1, &wp.w1, &format!("{what} w1"));
                close(&np.b1, &wp.b1, &format!("{what} b1"));
                close(&np.w2, &wp.w2, &format!("{what} w2"));
                close(&np.b2, &wp.b2, &format!("{what} b2"));
                p = np;
            }
            // Outputs come back placed as propagation decided; where that differs from the
            // inputs' placement (b1 split over mp in the 2D layouts), the second step has a new
            // signature, and the third reuses it.
            assert!(f.trace_count() <= 2, "one trace per signature");
        }
    }
}

#[test]
fn the_seed_step_reduces_its_gradients_over_dp_only() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let (x, y) = data();
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let p = device_put(init(Key::new(0)), NamedSharding::new(&mesh, P![]));
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let args = (p, device_put(x, &data), device_put(y, &data));
    let lowered = f.lower(&args).unwrap();
    // Replicated values are one buffer on every device, inputs and outputs alike; split ones
    // are one per device.
    let one_buffer = |t: &Tensor| {
        let shards = t.try_array().unwrap().shards().unwrap();
        shards.iter().all(|s| std::sync::Arc::ptr_eq(s, &shards[0]))
    };
    assert!(one_buffer(&args.0.w1) && !one_buffer(&args.1));
    let (new_p, loss) = f.call(args.clone()).unwrap();
    assert!(one_buffer(&new_p.w1) && one_buffer(&new_p.b2) && one_buffer(&loss));
    let global = lowered.ir();
    assert!(
        global.contains(r#"f32[64,10] <@mesh, [{"dp"}, {}]>"#),
        "{global}"
    );
    let local = lowered.per_device_ir();
    let collectives: Vec<&str> = local
        .lines()
        .filter(|l| {
            [
                "all_reduce",
                "all_gather",
                "reduce_scatter",
                "all_to_all",
                "collective_permute",
                "axis_index",
            ]
            .iter()
            .any(|c| l.contains(c))
        })
        .collect();
    // Four gradients and the loss, combined into one all-reduce over dp.
    assert_eq!(collectives.len(), 1, "{local}");
    assert!(
        collectives[0].contains(r#"all_reduce"#) && collectives[0].contains(r#"axes=["dp"]"#),
        "{local}"
    );
    assert!(collectives[0].contains("5 all-reduces combined"), "{local}");
    assert!(local.contains("f32[8,10]"), "local shapes: {local}");
}

#[test]
fn pmap_collectives_and_their_gradients() {
    eight_devices();
    let n = 4;
    let x = Tensor::from_vec(
        (0..n * 3).map(|i| i as f32 * 0.5 - 2.0).collect::<Vec<_>>(),
        [n, 3],
    );
    let w = Tensor::from_vec(
        (0..n * 3).map(|i| (i % 5) as f32 - 1.0).collect::<Vec<_>>(),
        [n, 3],
    );
    // Forward collectives.
    let f = pmap("i", |(x,): (Tensor,)| {
        let s = psum(&x, "i");
        let m = pmean(&x, "i");
        let g = all_gather(&x, "i");
        let next = ppermute(&x, "i", &[(0, 1), (1, 2), (2, 3), (3, 0)]);
        let i = axis_index("i");
        (s, m, g, next, i, pmax(&x, "i"))
    });
    let (s, m, g, next, i, mx) = f.call((x.clone(),)).unwrap();
    let xs = x.to_vec::<f32>();
    let col = |j: usize| (0..n).map(|d| xs[d * 3 + j]).collect::<Vec<f32>>();
    for d in 0..n {
        for j in 0..3 {
            assert_eq!(s.to_vec::<f32>()[d * 3 + j], col(j).iter().sum::<f32>());
            assert_eq!(
                m.to_vec::<f32>()[d * 3 + j],
                col(j).iter().sum::<f32>() / n as f32
            );
            assert_eq!(
                mx.to_vec::<f32>()[d * 3 + j],
                col(j).iter().cloned().fold(f32::MIN, f32::max)
            );
            assert_eq!(
                next.to_vec::<f32>()[d * 3 + j],
                xs[((d + n - 1) % n) * 3 + j]
            );
        }
    }
    assert_eq!(g.shape(), &[n, n, 3]);
    assert_eq!(g.to_vec::<f32>()[..12], xs[..]);
    assert_eq!(i.to_vec::<i32>(), vec![0, 1, 2, 3]);

    // Gradients through psum and all_gather: each device's gradient is that of the sum of
    // every device's loss, which one device computes from the whole arrays.
    let grads = pmap("i", |(x, w): (Tensor, Tensor)| {
        let g1 = grad(|x: &Tensor| (psum(&x.tanh(), "i") * &w).sum())(&x);
        let g2 = grad(|x: &Tensor| (all_gather(x, "i").square().sum_axes([0]) * &w).sum())(&x);
        (g1, g2)
    });
    let (g1, g2) = grads.call((x.clone(), w.clone())).unwrap();
    // The reference is compiled too, so both sides use the same tanh.
    let total1 = jit(|(x, w): (Tensor, Tensor)| {
        grad(|x: &Tensor| {
            let s = x.tanh().sum_axes([0]);
            (&w * s.broadcast_to(&[n, 3])).sum()
        })(&x)
    })
    .call((x.clone(), w.clone()))
    .unwrap();
    close(&g1, &total1, "grad through psum");
    let total2 = grad(|x: &Tensor| {
        let s = x.square().sum_axes([0]);
        (&w * s.broadcast_to(&[n, 3])).sum()
    })(&x);
    close(&g2, &total2, "grad through all_gather");

    // ppermute, psum_scatter and all_to_all: forward values and gradients, each against the
    // same function of the whole arrays computed by hand.
    let ring = [(0, 1), (1, 2), (2, 3), (3, 0)];
    let h = pmap("i", move |(x, w): (Tensor, Tensor)| {
        let g3 = grad(|x: &Tensor| (ppermute(x, "i", &ring) * &w).sum())(&x);
        let sc = psum_scatter(&x.reshape([3, 1]).broadcast_to(&[3, 4]).t(), "i", 0);
        let g4 = grad(|x: &Tensor| {
            (psum_scatter(&x.reshape([3, 1]).broadcast_to(&[3, 4]).t(), "i", 0)
                * w.slice(&[0], &[3]).reshape([1, 3]))
            .sum()
        })(&x);
        let a2a = all_to_all(&x.reshape([1, 3]).broadcast_to(&[4, 3]), "i", 0, 1);
        let g5 = grad(|x: &Tensor| {
            (all_to_all(&x.reshape([1, 3]).broadcast_to(&[4, 3]), "i", 0, 1) * 2.0).sum()
        })(&x);
        (g3, sc, g4, a2a, g5)
    });
    let (g3, sc, g4, a2a, g5) = h.call((x.clone(), w.clone())).unwrap();
    let ws = w.to_vec::<f32>();
    for d in 0..n {
        for j in 0..3 {
            // sum_d sum(x_{d-1} * w_d): the gradient for x_k is w_{k+1}.
            assert_eq!(g3.to_vec::<f32>()[d * 3 + j], ws[((d + 1) % n) * 3 + j]);
            // Row d of the sum over devices of each device's x repeated in 4 rows.
            assert_eq!(sc.to_vec::<f32>()[d * 3 + j], col(j).iter().sum::<f32>());
            // sum_d sum(row d of sum_e x_e * w_d[..3]): x_k's gradient is sum_d w_d[j].
            let want: f32 = (0..n).map(|e| ws[e * 3 + j]).sum();
            assert!((g4.to_vec::<f32>()[d * 3 + j] - want).abs() < 1e-5);
            // Each device receives one row of every device's x: summed over the devices, the
            // loss counts each element of x once per device, times 2.
            assert_eq!(g5.to_vec::<f32>()[d * 3 + j], 2.0 * n as f32);
        }
    }
    assert_eq!(sc.shape(), &[n, 1, 3]);
    assert_eq!(a2a.shape(), &[n, 1, 12]);
    assert_eq!(a2a.to_vec::<f32>()[..12], xs[..]);
}

#[test]
fn visualize_matches_jax() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let a = device_put(Tensor::zeros([128, 4]), NamedSharding::new(&mesh, P!["dp"]));
    let want1 = "┌───────┐\n│ CPU 0 │\n├───────┤\n│ CPU 1 │\n├───────┤\n│ CPU 2 │\n├───────┤\n│ CPU 3 │\n├───────┤\n│ CPU 4 │\n├───────┤\n│ CPU 5 │\n├───────┤\n│ CPU 6 │\n├───────┤\n│ CPU 7 │\n└───────┘";
    assert_eq!(sharding_table(&a), want1);
    let mesh2 = Mesh::new([4, 2], ["dp", "mp"]);
    let b = device_put(
        Tensor::zeros([8, 8]),
        NamedSharding::new(&mesh2, P!["dp", "mp"]),
    );
    let want2 = "┌──────────┬──────────┐\n│  CPU 0   │  CPU 1   │\n├──────────┼──────────┤\n│  CPU 2   │  CPU 3   │\n├──────────┼──────────┤\n│  CPU 4   │  CPU 5   │\n├──────────┼──────────┤\n│  CPU 6   │  CPU 7   │\n└──────────┴──────────┘";
    assert_eq!(sharding_table(&b), want2);
    // Shards live where `shard_range` says, and the global value reads back whole.
    let c = Tensor::from_vec((0..64).map(|i| i as f32).collect::<Vec<_>>(), [8, 8]);
    let placed = device_put(c.clone(), NamedSharding::new(&mesh2, P!["dp", "mp"]));
    assert_eq!(placed.to_vec::<f32>(), c.to_vec::<f32>());
    assert_eq!(placed.sharding().unwrap().spec, P!["dp", "mp"]);
}

fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let e = std::panic::catch_unwind(f).unwrap_err();
    e.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn bad_input_gives_clear_errors() {
    eight_devices();
    let e = Mesh::try_new(&[16], &["dp"]).unwrap_err().to_string();
    assert!(e.contains("16 devices") && e.contains("8"), "{e}");
    let e = Mesh::try_new(&[2, 2], &["a", "a"]).unwrap_err().to_string();
    assert!(e.contains("named twice"), "{e}");
    let mesh = Mesh::new([4], ["dp"]);
    let m = panic_message(|| {
        device_put(Tensor::zeros([8, 2]), NamedSharding::new(&mesh, P!["xx"]));
    });
    assert!(
        m.contains("unknown mesh axis \"xx\"") && m.contains(file!()),
        "{m}"
    );
    let m = panic_message(|| {
        device_put(Tensor::zeros([6, 2]), NamedSharding::new(&mesh, P!["dp"]));
    });
    assert!(m.contains("not divisible") && m.contains("f32[6,2]"), "{m}");
    let mesh2 = Mesh::new([2, 2], ["a", "b"]);
    let m = panic_message(|| {
        device_put(
            Tensor::zeros([4, 4]),
            NamedSharding::new(&mesh2, P!["a", "a"]),
        );
    });
    assert!(m.contains("used twice"), "{m}");
    let m = panic_message(|| {
        device_put(
            Tensor::zeros([4]),
            NamedSharding::new(&mesh, P!["dp", None]),
        );
    });
    assert!(m.contains("rank 1"), "{m}");

    // A collective over an axis not in scope.
    let f = pmap("i", |x: Tensor| psum(&x, "j"));
    let e = f.call(Tensor::zeros([2, 3])).unwrap_err().to_string();
    assert!(
        e.contains("psum") && e.contains("\"j\"") && e.contains(file!()),
        "{e}"
    );
    // Outside any pmap, eagerly.
    let m = panic_message(|| {
        psum(&Tensor::zeros([2]), "i");
    });
    assert!(m.contains("not in scope"), "{m}");
    // Leading axes that differ, or exceed the devices.
    let g = pmap("i", |(a, b): (Tensor, Tensor)| &a + &b);
    let e = g
        .call((Tensor::zeros([2, 3]), Tensor::zeros([4, 3])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("leading size 2"), "{e}");
    let e = g
        .call((Tensor::zeros([9, 3]), Tensor::zeros([9, 3])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("9") && e.contains("8 devices"), "{e}");
    // Inputs on two different meshes.
    let other = Mesh::new([2], ["dp"]);
    let h = jit(|(a, b): (Tensor, Tensor)| &a + &b);
    let a = device_put(Tensor::zeros([4]), NamedSharding::new(&mesh, P!["dp"]));
    let b = device_put(Tensor::zeros([4]), NamedSharding::new(&other, P!["dp"]));
    let e = h.call((a, b)).unwrap_err().to_string();
    assert!(e.contains("different meshes"), "{e}");
}

#[test]
fn sharding_constraints_reshard_and_conflicts_are_errors() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let x = device_put(
        Tensor::from_vec((0..32).map(|i| i as f32).collect::<Vec<_>>(), [8, 4]),
        NamedSharding::new(&mesh, P!["dp"]),
    );
    let want = NamedSharding::new(&mesh, P![None, "mp"]);
    let f = jit(|x: Tensor| with_sharding_constraint(&(x * 2.0), &want));
    let y = f.call(x.clone()).unwrap();
    assert_eq!(y.sharding().unwrap().spec, P![None, "mp"]);
    assert_eq!(
        y.to_vec::<f32>(),
        (0..32).map(|i| i as f32 * 2.0).collect::<Vec<_>>()
    );
    let bad = NamedSharding::new(&mesh, P!["mp", "mp"]);
    let g = jit(|x: Tensor| with_sharding_constraint(&x, &bad));
    let e = g.call(x).unwrap_err().to_string();
    assert!(
        e.contains("sharding_constraint") && e.contains("twice") && e.contains(file!()),
        "{e}"
    );
}

/// A jit whose inputs are all host values compiles for the mesh its sharding constraints or
/// `out_shardings` name, the inputs replicated on it (JAX's uncommitted arrays); a grad of
/// such a constraint outside any jit, and a constraint on another mesh than the inputs', are
/// clear errors at the caller's line.
#[test]
fn host_inputs_compile_for_the_mesh_a_constraint_names() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let x = Tensor::from_vec((0..32).map(|i| i as f32).collect::<Vec<_>>(), [8, 4]);
    let twice: Vec<f32> = (0..32).map(|i| i as f32 * 2.0).collect();
    let split = NamedSharding::new(&mesh, P!["dp"]);

    let f = jit(|x: Tensor| x * 2.0).out_shardings(&split);
    let y = f.call(x.clone()).unwrap();
    assert_eq!(y.sharding().unwrap().spec, P!["dp"]);
    assert_eq!(y.to_vec::<f32>(), twice);
    // The next call hits the compiled program.
    assert_eq!(f.call(x.clone()).unwrap().to_vec::<f32>(), twice);
    assert_eq!(f.trace_count(), 1);

    let cols = NamedSharding::new(&mesh, P![None, "mp"]);
    let g = jit(|x: Tensor| with_sharding_constraint(&(x * 2.0), &cols).sum_axes(keepdims(0)));
    let y = g.call(x.clone()).unwrap();
    assert!(y.sharding().is_some(), "compiled for the mesh");
    let eager = (&x * 2.0).sum_axes(keepdims(0));
    assert_eq!(y.to_vec::<f32>(), eager.to_vec::<f32>());

    // A grad traced inside the jit: the constraint is on its values.
    let h =
        jit(|x: Tensor| grad(|x: &Tensor| with_sharding_constraint(&(x * x), &split).sum())(&x));
    assert_eq!(h.call(x.clone()).unwrap().to_vec::<f32>(), twice);

    // A shard_map on host inputs inside a jit: compiled for its mesh.
    let line = Mesh::new([8], ["dp"]);
    let sm = shard_map(|x: Tensor| psum(&x, "dp"), &line, P!["dp"], P![]);
    let eager = sm.call(x.clone()).unwrap() * 2.0;
    let j = jit(|x: Tensor| sm.call(x).expect("traced") * 2.0);
    assert_eq!(
        j.call(x.clone()).unwrap().to_vec::<f32>(),
        eager.to_vec::<f32>()
    );

    // Outside any jit there is no program to compile for the mesh.
    let message = panic_message(|| {
        let _ = grad(|x: &Tensor| with_sharding_constraint(&(x * x), &split).sum())(&x);
    });
    assert!(
        message.contains("traced on no mesh") && message.contains(file!()),
        "{message}"
    );

    // The errors of out_shardings name the call's line.
    let scalar = jit(|x: Tensor| x.sum()).out_shardings(&split);
    let e = scalar.call(x.clone()).unwrap_err().to_string();
    assert!(e.contains(file!()) && e.contains("out_shardings"), "{e}");
    let uneven = jit(|x: Tensor| x.slice(&[0, 0], &[3, 4])).out_shardings(&split);
    let e = uneven.call(x.clone()).unwrap_err().to_string();
    assert!(
        e.contains("does not split evenly") && e.contains(file!()),
        "{e}"
    );

    // Inputs on one mesh, the outputs asked on another.
    let other = Mesh::new([8], ["mp"]);
    let placed = device_put(x, &split);
    let k = jit(|x: Tensor| x * 2.0).out_shardings(NamedSharding::new(&other, P!["mp"]));
    let e = k.call(placed).unwrap_err().to_string();
    assert!(
        e.contains("the sharding is on mesh") && e.contains("the value on mesh"),
        "{e}"
    );
}

#[test]
fn many_steps_back_to_back_never_deadlock() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let x = device_put(Tensor::ones([16, 4]), NamedSharding::new(&mesh, P!["dp"]));
    let f = jit(|x: Tensor| (x.sum(), x * 2.0));
    // Several threads launch at once: launches queue, none interleave.
    std::thread::scope(|s| {
        for _ in 0..3 {
            let mesh = mesh.clone();
            s.spawn(move || {
                // Tensors belong to their thread: each makes its own.
                let x = device_put(Tensor::ones([16, 4]), NamedSharding::new(&mesh, P!["dp"]));
                let f = jit(|x: Tensor| (x.sum(), x * 2.0));
                for _ in 0..100 {
                    let (sum, _) = f.call(x.clone()).unwrap();
                    assert_eq!(sum.item::<f32>(), 64.0);
                }
            });
        }
    });
    for _ in 0..200 {
        assert_eq!(f.call(x.clone()).unwrap().0.item::<f32>(), 64.0);
    }
}

#[test]
fn constraints_propagate_backward_and_reductions_scatter() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let rows = NamedSharding::new(&mesh, P!["dp"]);
    let values: Vec<f32> = (0..128).map(|i| i as f32 / 50.0).collect();
    let host = Tensor::from_vec(values.clone(), [16, 8]);
    let want_exp: Vec<f32> = values.iter().map(|v| v.tanh().exp()).collect();
    let want_sum: Vec<f32> = (0..8)
        .map(|c| (0..16).map(|r| values[r * 8 + c]).sum())
        .collect();
    // Replicated: the constraint decides where the work happens.
    let whole = device_put(host.clone(), NamedSharding::new(&mesh, P![]));
    let split = device_put(host, &rows);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        // The constraint on the output pulls the split back to the input's first use: tanh
        // and exp run on a quarter of the rows each, and nothing is gathered.
        let f = jit(|x: Tensor| with_sharding_constraint(&x.tanh().exp(), &rows)).backend(backend);
        let local = f.lower(&whole).unwrap().per_device_ir();
        assert!(
            local
                .lines()
                .any(|l| l.contains("= tanh") && l.contains("f32[4,8]")),
            "tanh should run on the local rows:\n{local}"
        );
        assert!(!local.contains("all_gather"), "{local}");
        let y = f.call(whole.clone()).unwrap();
        assert_eq!(y.sharding().unwrap().spec, P!["dp"]);
        for (a, b) in y.to_vec::<f32>().iter().zip(&want_exp) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{backend:?}: {a} vs {b}");
        }
        // A column sum over rows split on dp, wanted split over dp: each device only needs its
        // chunk of the sum, so the partial sums meet in a reduce_scatter.
        let g = jit(|x: Tensor| with_sharding_constraint(&x.sum_axes([0]), &rows)).backend(backend);
        let local = g.lower(&split).unwrap().per_device_ir();
        assert!(
            local.contains("reduce_scatter") && !local.contains("all_reduce"),
            "{local}"
        );
        let s = g.call(split.clone()).unwrap();
        assert_eq!(s.sharding().unwrap().spec, P!["dp"]);
        for (a, b) in s.to_vec::<f32>().iter().zip(&want_sum) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{backend:?}: {a} vs {b}");
        }
    }
}

#[test]
fn products_with_a_replicated_weight_run_once_for_all_devices() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let rows = NamedSharding::new(&mesh, P!["dp"]);
    let whole = NamedSharding::new(&mesh, P![]);
    // 64 rows per device times a 256 x 256 weight: 2^22 multiply-adds each, large enough.
    let x = random::normal(&Key::new(3), [512, 256]);
    let w = random::normal(&Key::new(4), [256, 256]) * 0.1;
    let f = |(x, w): (Tensor, Tensor)| {
        let h = x.matmul(&w).tanh();
        // The transposed weight: a strided right operand.
        h.matmul(&w.transpose(&[1, 0]))
    };
    let want = jit(f).call((x.clone(), w.clone())).unwrap();
    let before = tessera::shared_gemm_count();
    let sharded = jit(f);
    let got = sharded
        .call((device_put(x.clone(), &rows), device_put(w.clone(), &whole)))
        .unwrap();
    assert!(
        tessera::shared_gemm_count() >= before + 2,
        "both products are shared"
    );
    close(&got, &want, "shared-weight products");
    // Each device with a weight of its own (split over dp on the free dim: 32 columns each)
    // multiplies alone, and the result is the same.
    let before = tessera::shared_gemm_count();
    let cols = NamedSharding::new(&mesh, P![None, "dp"]);
    let g = jit(|(x, w): (Tensor, Tensor)| x.matmul(&w));
    let got = g
        .call((device_put(x.clone(), &whole), device_put(w.clone(), &cols)))
        .unwrap();
    assert_eq!(
        tessera::shared_gemm_count(),
        before,
        "distinct weights are not shared"
    );
    close(
        &got,
        &jit(|(x, w): (Tensor, Tensor)| x.matmul(&w))
            .call((x.clone(), w))
            .unwrap(),
        "split weight",
    );
    // A weight gradient: the product contracts the rows split over dp, and the all-reduce
    // that completes it is one product over all the rows.
    let d = random::normal(&Key::new(5), [512, 256]);
    let grad = |(x, d): (Tensor, Tensor)| x.t().matmul(&d);
    let want = jit(grad).call((x.clone(), d.clone())).unwrap();
    let before = tessera::shared_gemm_count();
    let step = jit(grad);
    let args = (device_put(x, &rows), device_put(d, &rows));
    // Many launches back to back: each device reads the sum the leader wrote, every time.
    for _ in 0..20 {
        let got = step.call(args.clone()).unwrap();
        assert_eq!(got.sharding().unwrap().spec, P![]);
        close(&got, &want, "weight gradient");
    }
    assert!(
        tessera::shared_gemm_count() >= before + 20,
        "the product and its sum are one"
    );
}

#[test]
fn reshards_move_the_right_chunks() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let values: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let host = Tensor::from_vec(values.clone(), [8, 8]);
    let put = |spec: PartitionSpec| device_put(host.clone(), NamedSharding::new(&mesh, spec));
    let twice: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    let squares: Vec<f32> = values.iter().map(|v| v * v).collect();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        // Operands split on different dims: the second moves its axis with an all_to_all.
        let mul = jit(|(a, b): (Tensor, Tensor)| &a * &b).backend(backend);
        let (a, b) = (put(P!["dp"]), put(P![None, "dp"]));
        let local = mul.lower(&(a.clone(), b.clone())).unwrap().per_device_ir();
        assert!(
            local.contains("all_to_all") && !local.contains("all_gather"),
            "{local}"
        );
        assert_eq!(
            mul.call((a, b)).unwrap().to_vec::<f32>(),
            squares,
            "{backend:?}"
        );
        // Two axes trading dims: both gathered before either is sliced.
        let want = NamedSharding::new(&mesh, P!["mp", "dp"]);
        let swap = jit(|x: Tensor| with_sharding_constraint(&(x * 2.0), &want)).backend(backend);
        let y = swap.call(put(P!["dp", "mp"])).unwrap();
        assert_eq!(y.sharding().unwrap().spec, P!["mp", "dp"]);
        assert_eq!(y.to_vec::<f32>(), twice, "{backend:?}");
        // A minor axis added to a split dim (a slice within the chunk), then dropped (a
        // gather over it alone).
        let finer = NamedSharding::new(&mesh, P![("dp", "mp")]);
        let coarser = NamedSharding::new(&mesh, P!["dp"]);
        let refine = jit(|x: Tensor| {
            let y = with_sharding_constraint(&(x * 2.0), &finer);
            (with_sharding_constraint(&(&y * 1.0), &coarser), y)
        })
        .backend(backend);
        let (back, fine) = refine.call(put(P!["dp"])).unwrap();
        assert_eq!(fine.sharding().unwrap().spec, P![("dp", "mp")]);
        assert_eq!(back.sharding().unwrap().spec, P!["dp"]);
        assert_eq!(fine.to_vec::<f32>(), twice, "{backend:?}");
        assert_eq!(back.to_vec::<f32>(), twice, "{backend:?}");
    }
}
