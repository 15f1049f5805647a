//! `shard_map` on 8 host devices: every collective by axis name inside it against what it must
//! compute, gradients through it against the sum of the devices' losses, a shard_map over `mp`
//! inside a jit that is automatic over `dp` against the unsharded program, the replication
//! check of out_specs, bad specs, and shard_map on an Explicit mesh.

use tessera::prelude::*;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32).collect(), shape.to_vec())
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * y.abs().max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn collectives_by_axis_name_compute_what_they_say() {
    eight_devices();
    let mesh = Mesh::new([8], ["i"]);
    let x = arange(&[16, 3]);
    // Each device's block of two rows.
    let per_device = |f: fn(&Tensor) -> Tensor, out: PartitionSpec| {
        shard_map(move |x: Tensor| f(&x), &mesh, P!["i"], out)
            .call(x.clone())
            .expect("runs")
    };
    // psum: every device's block summed, the same everywhere.
    let s = per_device(|x| psum(x, "i"), P![]);
    let blocks: Vec<Vec<f32>> = (0..8)
        .map(|d| x.to_vec::<f32>()[d * 6..d * 6 + 6].to_vec())
        .collect();
    let sum: Vec<f32> = (0..6).map(|k| blocks.iter().map(|b| b[k]).sum()).collect();
    assert_eq!(s.shape(), &[2, 3]);
    close(&s.to_vec::<f32>(), &sum, "psum");
    // pmean.
    let m = per_device(|x| pmean(x, "i"), P![]);
    let mean: Vec<f32> = sum.iter().map(|v| v / 8.0).collect();
    close(&m.to_vec::<f32>(), &mean, "pmean");
    // axis_index, split back over i: 0..8.
    let idx = per_device(
        |x| axis_index("i").broadcast_to(&[1]).astype(DType::F32) + x.sum() * 0.0,
        P!["i"],
    );
    assert_eq!(
        idx.to_vec::<f32>(),
        (0..8).map(|i| i as f32).collect::<Vec<_>>()
    );
    // all_gather (tiled as a leading axis of 8 blocks), the same everywhere: the whole input.
    let g = per_device(|x| all_gather(x, "i"), P![]);
    assert_eq!(g.shape(), &[8, 2, 3]);
    assert_eq!(g.to_vec::<f32>(), x.to_vec::<f32>());
    // ppermute: device d sends its block to d+1.
    let shift: Vec<(usize, usize)> = (0..8).map(|d| (d, (d + 1) % 8)).collect();
    let mesh2 = Mesh::new([8], ["i"]);
    let p = shard_map(
        move |x: Tensor| ppermute(&x, "i", &shift),
        &mesh2,
        P!["i"],
        P!["i"],
    )
    .call(x.clone())
    .expect("runs");
    let xs = x.to_vec::<f32>();
    let want: Vec<f32> = (0..8)
        .flat_map(|d| xs[((d + 7) % 8) * 6..((d + 7) % 8) * 6 + 6].to_vec())
        .collect();
    assert_eq!(p.to_vec::<f32>(), want);
    // psum_scatter: the sum of a [8, 3] block per device, device d keeping row d.
    let y = arange(&[64, 3]);
    let mesh3 = Mesh::new([8], ["i"]);
    let sc = shard_map(
        |x: Tensor| psum_scatter(&x, "i", 0),
        &mesh3,
        P!["i"],
        P!["i"],
    )
    .call(y.clone())
    .expect("runs");
    let ys = y.to_vec::<f32>();
    let total: Vec<f32> = (0..24)
        .map(|k| (0..8).map(|d| ys[d * 24 + k]).sum())
        .collect();
    close(&sc.to_vec::<f32>(), &total, "psum_scatter");
    // all_to_all: the transpose of the block matrix.
    let mesh4 = Mesh::new([8], ["i"]);
    let t = shard_map(
        |x: Tensor| all_to_all(&x, "i", 0, 0),
        &mesh4,
        P!["i"],
        P!["i"],
    )
    .call(y.clone())
    .expect("runs");
    // Device d holds rows 8d..8d+8; after the exchange it holds row d of every device's block.
    let want: Vec<f32> = (0..8)
        .flat_map(|d| (0..8).flat_map(move |s| (0..3).map(move |c| ((s * 8 + d) * 3 + c) as f32)))
        .collect();
    assert_eq!(t.to_vec::<f32>(), want);
}

#[derive(Tree, Clone)]
struct Params {
    w: Tensor,
    b: Tensor,
}

fn local_loss(p: &Params, x: &Tensor) -> Tensor {
    (x.matmul(&p.w) + &p.b).tanh().square().mean()
}

#[test]
fn gradients_through_shard_map_are_the_sum_over_devices() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let p = Params {
        w: random::normal(&Key::new(3), [5, 4]) * 0.3,
        b: random::normal(&Key::new(4), [4]) * 0.1,
    };
    let x = random::normal(&Key::new(5), [32, 5]);
    let sm = shard_map(
        |(p, x): (Params, Tensor)| psum(&local_loss(&p, &x), "dp"),
        &mesh,
        specs![P![], P!["dp"]],
        P![],
    );
    let step = jit(|(p, x): (Params, Tensor)| {
        value_and_grad(|p: &Params| sm.call((p.clone(), x.clone())).expect("traced"))(&p)
    });
    let placed = device_put(x.clone(), NamedSharding::new(&mesh, P!["dp"]));
    let (l, g) = step.call((p.clone(), placed)).expect("runs");
    // The host reference: the sum of each device's loss on its 4 rows.
    let host_total = |p: &Params| {
        (0..8)
            .map(|d| local_loss(p, &x.slice_rows(d * 4, d * 4 + 4)))
            .fold(Tensor::zeros([]), |a, b| a + b)
    };
    let (hl, hg) = value_and_grad(host_total)(&p);
    close(&[l.item::<f32>()], &[hl.item::<f32>()], "loss");
    close(&g.w.to_vec::<f32>(), &hg.w.to_vec::<f32>(), "dw");
    close(&g.b.to_vec::<f32>(), &hg.b.to_vec::<f32>(), "db");
    // Eagerly too (the shard_map runs through jit on its own).
    let eager = sm.call((p.clone(), x.clone())).expect("runs");
    close(&[eager.item::<f32>()], &[hl.item::<f32>()], "eager loss");
}

trait Rows {
    fn slice_rows(&self, a: usize, b: usize) -> Tensor;
}

impl Rows for Tensor {
    fn slice_rows(&self, a: usize, b: usize) -> Tensor {
        self.slice(&[a, 0], &[b, self.shape()[1]])
    }
}

#[test]
fn a_shard_map_over_mp_inside_a_jit_automatic_over_dp_is_the_unsharded_program() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let x = random::normal(&Key::new(6), [16, 6]);
    let w1 = random::normal(&Key::new(7), [6, 8]) * 0.4;
    let w2 = random::normal(&Key::new(8), [8, 3]) * 0.4;
    let put = |t: &Tensor, s: PartitionSpec| device_put(t.clone(), NamedSharding::new(&mesh, s));
    // The second layer by hand over mp: each device's columns of h times its rows of w2,
    // summed over mp.
    let second = shard_map(
        |(h, w2): (Tensor, Tensor)| psum(&h.matmul(&w2), "mp"),
        &mesh,
        specs![P![None, "mp"], P!["mp", None]],
        P![],
    )
    .axis_names(&["mp"]);
    let f = |(x, w1, w2): (Tensor, Tensor, Tensor)| {
        let h = x.matmul(&w1).tanh();
        second.call((h, w2)).expect("traced").square().sum()
    };
    let step = jit(|a: (Tensor, Tensor, Tensor)| {
        value_and_grad(|a: &(Tensor, Tensor, Tensor)| f(a.clone()))(&a)
    });
    let args = (
        put(&x, P!["dp", None]),
        put(&w1, P![None, "mp"]),
        put(&w2, P!["mp", None]),
    );
    let (l, (gx, gw1, gw2)) = step.call(args.clone()).expect("runs");
    let plain =
        |(x, w1, w2): &(Tensor, Tensor, Tensor)| x.matmul(w1).tanh().matmul(w2).square().sum();
    let (hl, (hx, hw1, hw2)) = value_and_grad(plain)(&(x.clone(), w1.clone(), w2.clone()));
    close(&[l.item::<f32>()], &[hl.item::<f32>()], "loss");
    close(&gx.to_vec::<f32>(), &hx.to_vec::<f32>(), "dx");
    close(&gw1.to_vec::<f32>(), &hw1.to_vec::<f32>(), "dw1");
    close(&gw2.to_vec::<f32>(), &hw2.to_vec::<f32>(), "dw2");
    // The batch stays split over dp: the per-device program's x parameter is 4 of the 16 rows.
    let ir = step.lower(&args).expect("lowers").per_device_ir();
    let x_param = ir
        .lines()
        .find(|l| l.trim_start().starts_with("%0:"))
        .unwrap_or_else(|| panic!("x's parameter line:\n{ir}"));
    assert!(x_param.contains("f32[4,6]"), "{x_param}\n{ir}");
}

#[test]
fn out_specs_claiming_replication_are_checked_and_bad_specs_are_errors() {
    eight_devices();
    let mesh = Mesh::new([8], ["i"]);
    let x = arange(&[16, 3]);
    // A value that differs per device returned as replicated: JAX's check_vma.
    let e = shard_map(|x: Tensor| x * 2.0, &mesh, P!["i"], P![])
        .call(x.clone())
        .expect_err("varies over i");
    let text = e.to_string();
    assert!(
        text.contains("check_vma") && text.contains("'i'") && text.contains("tests/shard_map.rs:"),
        "{text}"
    );
    // psum makes it the same everywhere: accepted.
    shard_map(|x: Tensor| psum(&(x * 2.0), "i"), &mesh, P!["i"], P![])
        .call(x.clone())
        .expect("replicated");
    // An axis the mesh lacks, a spec that does not divide, specs that do not match the tree.
    let e = shard_map(|x: Tensor| x, &mesh, P!["j"], P!["j"])
        .call(x.clone())
        .expect_err("no axis j")
        .to_string();
    assert!(e.contains("\"j\""), "{e}");
    let e = shard_map(|x: Tensor| x, &mesh, P![None, "i"], P![None, "i"])
        .call(x.clone())
        .expect_err("3 columns over 8")
        .to_string();
    assert!(e.contains("not divisible"), "{e}");
    let e = shard_map(
        |(a, _b): (Tensor, Tensor)| a,
        &mesh,
        specs![P!["i"]],
        P!["i"],
    )
    .call((x.clone(), x.clone()))
    .expect_err("one spec for two")
    .to_string();
    assert!(e.contains("in_specs") && e.contains("do not match"), "{e}");
}

#[test]
fn shard_map_on_an_explicit_mesh_types_its_results() {
    eight_devices();
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let x = random::normal(&Key::new(9), [8, 6]);
    let w = random::normal(&Key::new(10), [6, 4]);
    let put = |t: &Tensor, s: PartitionSpec| device_put(t.clone(), NamedSharding::new(&mesh, s));
    let sm = shard_map(
        |(x, w): (Tensor, Tensor)| psum(&x.matmul(&w), "mp"),
        &mesh,
        specs![P!["dp", "mp"], P!["mp", None]],
        P!["dp", None],
    );
    let seen = std::cell::RefCell::new(None);
    let f = jit(|a: (Tensor, Tensor)| {
        let y = sm.call(a).expect("traced");
        *seen.borrow_mut() = y.sharding().map(|s| s.spec);
        y
    });
    let y = f
        .call((put(&x, P!["dp", "mp"]), put(&w, P!["mp", None])))
        .expect("runs");
    assert_eq!(*seen.borrow(), Some(P!["dp"]));
    assert_eq!(y.sharding().expect("placed").spec, P!["dp"]);
    close(&y.to_vec::<f32>(), &x.matmul(&w).to_vec::<f32>(), "x @ w");
}

#[test]
fn collectives_and_permutes_on_an_explicit_mesh_and_bad_out_specs() {
    eight_devices();
    let mesh = Mesh::explicit([8], ["i"]);
    let x = arange(&[16, 3]);
    // axis_index (no operand) and ppermute inside a shard_map on Explicit axes.
    let shift: Vec<(usize, usize)> = (0..8).map(|d| (d, (d + 1) % 8)).collect();
    let f = shard_map(
        move |x: Tensor| {
            let i = axis_index("i").astype(DType::F32);
            ppermute(&x, "i", &shift) + i
        },
        &mesh,
        P!["i"],
        P!["i"],
    );
    let y = jit(|x: Tensor| f.call(x).expect("traced"))
        .call(device_put(x.clone(), NamedSharding::new(&mesh, P!["i"])))
        .expect("runs");
    let xs = x.to_vec::<f32>();
    let want: Vec<f32> = (0..8)
        .flat_map(|d| {
            let s = (d + 7) % 8;
            xs[s * 6..s * 6 + 6]
                .iter()
                .map(move |v| v + d as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(y.to_vec::<f32>(), want);
    // Trees whose structure differs but whose leaves do not: each gets its own program.
    let m = Mesh::new([8], ["i"]);
    let g = shard_map(
        |p: (Option<Tensor>, Option<Tensor>)| match p {
            (Some(a), None) => (Some(psum(&a, "i")), None),
            (None, Some(b)) => (None, Some(psum(&(b * 2.0), "i"))),
            _ => (None, None),
        },
        &m,
        P!["i"],
        P![],
    );
    let a = g.call((Some(x.clone()), None)).expect("first");
    let b = g.call((None, Some(x.clone()))).expect("second");
    let (a, b) = (a.0.expect("a"), b.1.expect("b"));
    let twice: Vec<f32> = a.to_vec::<f32>().iter().map(|v| v * 2.0).collect();
    close(&b.to_vec::<f32>(), &twice, "the second structure's program");
    // out_specs that do not fit the output, a collective over a non-manual axis.
    let e = shard_map(|x: Tensor| x, &m, P!["i"], P!["i", "i"])
        .call(x.clone())
        .expect_err("i twice")
        .to_string();
    assert!(
        e.contains("out_specs") && e.contains("tests/shard_map.rs:"),
        "{e}"
    );
    let m2 = Mesh::new([4, 2], ["dp", "mp"]);
    let e = shard_map(|x: Tensor| psum(&x, "dp"), &m2, P!["mp"], P!["mp"])
        .axis_names(&["mp"])
        .call(x.clone())
        .expect_err("dp is automatic")
        .to_string();
    assert!(
        e.contains("over \"dp\"") && e.contains("manual axes only"),
        "{e}"
    );
}
