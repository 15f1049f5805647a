//! `vmap`: against the loop of the per-example function (bit for bit on the interpreter, where
//! the batched program does the same arithmetic per example; within 4 ulp compiled, where GEMM
//! blocking and fusion may order a sum differently), against JAX's values
//! (`fixtures/vmap/vmap.json`, made by `fixtures/vmap/make.py`), composed with `grad`, `jit`
//! (1 and 8 devices) and itself, with an axis name and collectives, and its errors.

use serde_json::Value;
use tessera::prelude::*;

#[path = "support/fixture.rs"]
mod fixture;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

/// One example's loss: `x` is `[4]`, `y` is `[1]`.
fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&p.w1) + &p.b1).tanh();
    (h.matmul(&p.w2) + &p.b2 - y).square().mean()
}

/// Deterministic values in (-1, 1), as `make.py`'s `det`.
fn det(shape: &[usize], k: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as f64 * 0.7 + k).sin() * 0.9) as f32)
        .collect();
    Tensor::from_vec(v, shape.to_vec())
}

fn mlp() -> Mlp {
    Mlp {
        w1: det(&[4, 8], 1.0),
        b1: det(&[8], 2.0) * 0.1,
        w2: det(&[8, 1], 3.0),
        b2: det(&[1], 4.0),
    }
}

/// Example `i` of `t` along `axis`.
fn row(t: &Tensor, axis: usize, i: usize) -> Tensor {
    let mut start = vec![0; t.rank()];
    let mut limit = t.shape().to_vec();
    start[axis] = i;
    limit[axis] = i + 1;
    let mut dims = t.shape().to_vec();
    dims.remove(axis);
    t.slice(&start, &limit).reshape(dims)
}

/// `parts` stacked along a new dim `axis`.
fn stack(parts: &[Tensor], axis: usize) -> Tensor {
    let ones: Vec<Tensor> = parts
        .iter()
        .map(|p| {
            let mut d = p.shape().to_vec();
            d.insert(axis, 1);
            p.reshape(d)
        })
        .collect();
    let refs: Vec<&Tensor> = ones.iter().collect();
    Tensor::concatenate(&refs, axis)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().iter().map(|x| x.to_bits()).collect()
}

fn same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    assert_eq!(
        bits(a),
        bits(b),
        "{what}: {:?} vs {:?}",
        a.to_vec::<f32>(),
        b.to_vec::<f32>()
    );
}

/// Distance in units in the last place between two finite f32s.
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 { i32::MIN - i } else { i }
    };
    (key(a) as i64 - key(b) as i64).unsigned_abs() as u32
}

/// Within `n` ulp, or within `n` ulp of the largest magnitude (a sum near cancellation).
fn close(a: &Tensor, b: &Tensor, n: u32, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    let (x, y) = (a.to_vec::<f32>(), b.to_vec::<f32>());
    let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        let tol = scale * f32::EPSILON * n as f32;
        assert!(
            ulps(*p, *q) <= n || (p - q).abs() <= tol,
            "{what}[{i}]: {p} vs {q} ({} ulp)",
            ulps(*p, *q)
        );
    }
}

fn per_example_grads_loop(p: &Mlp, x: &Tensor, y: &Tensor) -> Mlp {
    let gs: Vec<Mlp> = (0..x.shape()[0])
        .map(|i| {
            let (xi, yi) = (row(x, 0, i), row(y, 0, i));
            grad(|p: &Mlp| loss(p, &xi, &yi))(p)
        })
        .collect();
    let pick =
        |f: fn(&Mlp) -> &Tensor| stack(&gs.iter().map(|g| f(g).clone()).collect::<Vec<_>>(), 0);
    Mlp {
        w1: pick(|g| &g.w1),
        b1: pick(|g| &g.b1),
        w2: pick(|g| &g.w2),
        b2: pick(|g| &g.b2),
    }
}

fn per_example_grads(args: &(Mlp, Tensor, Tensor)) -> Mlp {
    vmap(grad(|(p, x, y): &(Mlp, Tensor, Tensor)| loss(p, x, y)))
        .in_axes(axes![None, 0, 0])
        .call(args)
        .0
}

fn same_mlp(a: &Mlp, b: &Mlp, what: &str) {
    same(&a.w1, &b.w1, &format!("{what} w1"));
    same(&a.b1, &b.b1, &format!("{what} b1"));
    same(&a.w2, &b.w2, &format!("{what} w2"));
    same(&a.b2, &b.b2, &format!("{what} b2"));
}

fn close_mlp(a: &Mlp, b: &Mlp, n: u32, what: &str) {
    close(&a.w1, &b.w1, n, &format!("{what} w1"));
    close(&a.b1, &b.b1, n, &format!("{what} b1"));
    close(&a.w2, &b.w2, n, &format!("{what} w2"));
    close(&a.b2, &b.b2, n, &format!("{what} b2"));
}

/// `vmap(grad(loss), in_axes=(None, 0, 0))` is the loop of per-example gradients: bit for bit
/// eagerly (both on the interpreter's kernels), within 4 ulp under `jit` on both backends.
#[test]
fn per_example_grads_equal_the_loop() {
    eight_devices();
    let p = mlp();
    let (x, y) = (det(&[6, 4], 5.0), det(&[6, 1], 6.0));
    let want = per_example_grads_loop(&p, &x, &y);
    let args = (p.clone(), x.clone(), y.clone());
    same_mlp(&per_example_grads(&args), &want, "eager");
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let f = jit(|a: (Mlp, Tensor, Tensor)| per_example_grads(&a)).backend(backend);
        let got = f.call(args.clone()).unwrap();
        close_mlp(&got, &want, 4, &format!("{backend:?}"));
    }
}

/// The same per-example gradients under `jit` with the examples split over 8 devices.
#[test]
fn per_example_grads_under_jit_on_eight_devices() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let p = mlp();
    let (x, y) = (det(&[16, 4], 5.0), det(&[16, 1], 6.0));
    let want = per_example_grads_loop(&p, &x, &y);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let whole = NamedSharding::new(&mesh, P![]);
    let args = (
        device_put(p, &whole),
        device_put(x, &split),
        device_put(y, &split),
    );
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let f = jit(|a: (Mlp, Tensor, Tensor)| per_example_grads(&a)).backend(backend);
        let got = f.call(args.clone()).unwrap();
        close_mlp(&got, &want, 4, &format!("8 devices {backend:?}"));
    }
}

/// `grad(vmap(loss).mean())` is the gradient of the mean of the per-example losses, written as
/// an unrolled sum; the vmapped function closes over the parameters (a capture of grad's trace).
#[test]
fn grad_of_vmap_equals_the_grad_of_the_unrolled_mean() {
    eight_devices();
    let p = mlp();
    let (x, y) = (det(&[6, 4], 5.0), det(&[6, 1], 6.0));
    let batched = |p: &Mlp| {
        vmap(|(x, y): &(Tensor, Tensor)| loss(p, x, y))
            .call(&(x.clone(), y.clone()))
            .mean()
    };
    let unrolled = |p: &Mlp| {
        let mut s = loss(p, &row(&x, 0, 0), &row(&y, 0, 0));
        for i in 1..6 {
            s += loss(p, &row(&x, 0, i), &row(&y, 0, i));
        }
        s / 6.0
    };
    let want = grad(unrolled)(&p);
    close_mlp(&grad(batched)(&p), &want, 4, "eager");
    let f = jit(|p: Mlp| grad(batched)(&p));
    close_mlp(&f.call(p.clone()).unwrap(), &want, 4, "jit");
}

fn pair(a: &Tensor, b: &Tensor) -> Tensor {
    (a * b).tanh().sum() + a.max()
}

/// A vmap of a vmap is the double loop; the inner closure captures the outer's tracer.
#[test]
fn nested_vmap_equals_the_double_loop() {
    eight_devices();
    let (a, b) = (det(&[5, 3], 7.0), det(&[4, 3], 8.0));
    let f =
        |a: &Tensor, b: &Tensor| vmap(|a: &Tensor| vmap(|b: &Tensor| pair(a, b)).call(b)).call(a);
    let rows: Vec<Tensor> = (0..5)
        .map(|i| {
            let cols: Vec<Tensor> = (0..4)
                .map(|j| pair(&row(&a, 0, i), &row(&b, 0, j)))
                .collect();
            stack(&cols, 0)
        })
        .collect();
    let want = stack(&rows, 0);
    same(&f(&a, &b), &want, "eager");
    let j = jit(|(a, b): (Tensor, Tensor)| f(&a, &b));
    close(&j.call((a.clone(), b.clone())).unwrap(), &want, 4, "jit");
}

fn named(x: &Tensor) -> Tensor {
    x / psum(x, "b") + pmax(x, "b") + axis_index("b").astype(DType::F32) * 0.5
}

/// With `axis_name`, the collectives by name run over the batch: against pmap of the same
/// function (JAX's semantics are that they agree), and against the hand-batched formula.
#[test]
fn axis_name_collectives_run_over_the_batch() {
    eight_devices();
    let x = det(&[4, 3], 9.0) + 2.0;
    let v = vmap(named).axis_name("b");
    let got = v.call(&x);
    let by_hand = &x / x.sum_axes([0]).broadcast_in_dim([4, 3], &[1])
        + x.max_axes([0]).broadcast_in_dim([4, 3], &[1])
        + Tensor::iota(DType::F32, [4, 3], 0) * 0.5;
    close(&got, &by_hand, 1, "by hand");
    let pm = pmap("b", |x: Tensor| named(&x)).call(x.clone()).unwrap();
    close(&got, &pm, 1, "pmap");
    // The other collectives by name, each against pmap.
    let others = |x: &Tensor| {
        (
            pmean(x, "b"),
            all_gather(x, "b"),
            ppermute(x, "b", &[(0, 1), (1, 2), (2, 0)]),
            psum_scatter(&Tensor::concatenate(&[x, &x.slice(&[0], &[1])], 0), "b", 0),
            all_to_all(&x.broadcast_in_dim([4, 3], &[1]), "b", 0, 1),
        )
    };
    let x3 = det(&[4, 3], 3.0);
    let g = vmap(others).axis_name("b").call(&x3);
    let w = pmap("b", |x: Tensor| others(&x)).call(x3.clone()).unwrap();
    close(&g.0, &w.0, 1, "pmean");
    same(&g.1, &w.1, "all_gather");
    same(&g.2, &w.2, "ppermute");
    close(&g.3, &w.3, 1, "psum_scatter");
    same(&g.4, &w.4, "all_to_all");
    // Under jit too.
    let j = jit(|x: Tensor| vmap(others).axis_name("b").call(&x));
    let gj = j.call(x3).unwrap();
    same(&gj.1, &w.1, "jit all_gather");
    same(&gj.4, &w.4, "jit all_to_all");
}

/// `out_axes=1` puts the batch dim second; `None` returns an unbatched output once.
#[test]
fn out_axes_place_the_batch_dim() {
    eight_devices();
    let (x, m) = (det(&[6, 3], 10.0), det(&[3, 2], 11.0));
    let got = vmap(|v: &Tensor| v.tanh().matmul(&m)).out_axes(1).call(&x);
    let want = stack(
        &(0..6)
            .map(|i| row(&x, 0, i).tanh().matmul(&m))
            .collect::<Vec<_>>(),
        1,
    );
    same(&got, &want, "out_axes 1");
    let (s, t) = vmap(|(a, v): &(Tensor, Tensor)| (a * 2.0, v + a))
        .in_axes(axes![None, 0])
        .out_axes(axes![None, 0])
        .call(&(
            m.slice(&[0, 0], &[1, 2]).reshape([2]),
            x.slice(&[0, 0], &[6, 2]),
        ));
    assert_eq!(s.shape(), &[2]);
    assert_eq!(t.shape(), &[6, 2]);
}

/// A function over most op families, batched along dim 1, against the loop.
fn families(x: &Tensor) -> (Tensor, Tensor, Tensor) {
    // x: [5, 4]
    let a = x.exp() - x.square();
    let r = a.sum_axes([1]).max();
    let t = x.t().reshape([2, 10]);
    let s = t.slice_strided(&[0, 1], &[2, 9], &[1, 3]);
    let c = Tensor::concatenate(&[&s, &s.neg()], 1);
    let p = c.pad(&r, &[1, 0], &[0, 2], &[0, 1]);
    let sel = Tensor::select(&p.gt(&p.scalar_like(0.0)), &p, &(p.clone() * 0.25));
    let d = x.matmul(&x.t()).relu();
    let am = d.argmax(1).astype(DType::F32);
    (
        sel,
        d + am.broadcast_in_dim([5, 5], &[0]),
        x.sum_axes([0]).softmax(0),
    )
}

#[test]
fn op_families_equal_the_loop_on_both_backends() {
    eight_devices();
    let x = det(&[5, 3, 4], 12.0);
    let n = 3;
    let lanes: Vec<(Tensor, Tensor, Tensor)> = (0..n).map(|i| families(&row(&x, 1, i))).collect();
    let want = (
        stack(&lanes.iter().map(|l| l.0.clone()).collect::<Vec<_>>(), 0),
        stack(&lanes.iter().map(|l| l.1.clone()).collect::<Vec<_>>(), 0),
        stack(&lanes.iter().map(|l| l.2.clone()).collect::<Vec<_>>(), 0),
    );
    let v = |x: &Tensor| vmap(families).in_axes(1).call(x);
    let got = v(&x);
    same(&got.0, &want.0, "eager 0");
    same(&got.1, &want.1, "eager 1");
    same(&got.2, &want.2, "eager 2");
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let j = jit(|x: Tensor| v(&x)).backend(backend);
        let g = j.call(x.clone()).unwrap();
        close(&g.0, &want.0, 4, &format!("{backend:?} 0"));
        close(&g.1, &want.1, 4, &format!("{backend:?} 1"));
        close(&g.2, &want.2, 4, &format!("{backend:?} 2"));
    }
}

/// JAX's values for the same programs (its CPU kernels sum in another order: within 8 ulp).
#[test]
fn jax_fixtures() {
    eight_devices();
    let fx: Value = serde_json::from_str(include_str!("fixtures/vmap/vmap.json")).unwrap();
    let inp = &fx["mlp"]["inputs"];
    let p = Mlp {
        w1: fixture::tensor(&inp["w1"]),
        b1: fixture::tensor(&inp["b1"]),
        w2: fixture::tensor(&inp["w2"]),
        b2: fixture::tensor(&inp["b2"]),
    };
    same(&p.w1, &mlp().w1, "make.py's det is this file's det");
    let (x, y) = (fixture::tensor(&inp["x"]), fixture::tensor(&inp["y"]));
    let g = per_example_grads(&(p, x, y));
    let gw = &fx["mlp"]["grads"];
    close(&g.w1, &fixture::tensor(&gw["w1"]), 8, "jax grad w1");
    close(&g.b1, &fixture::tensor(&gw["b1"]), 8, "jax grad b1");
    close(&g.w2, &fixture::tensor(&gw["w2"]), 8, "jax grad w2");
    close(&g.b2, &fixture::tensor(&gw["b2"]), 8, "jax grad b2");

    let nx = &fx["nested"];
    let (a, b) = (fixture::tensor(&nx["a"]), fixture::tensor(&nx["b"]));
    let nest = vmap(|a: &Tensor| vmap(|b: &Tensor| pair(a, b)).call(&b)).call(&a);
    close(&nest, &fixture::tensor(&nx["out"]), 8, "jax nested");

    let nm = &fx["named"];
    close(
        &vmap(named).axis_name("b").call(&fixture::tensor(&nm["x"])),
        &fixture::tensor(&nm["out"]),
        8,
        "jax axis_name",
    );

    let o1 = &fx["out_axes_1"];
    let m = fixture::tensor(&o1["m"]);
    let got = vmap(|v: &Tensor| v.tanh().matmul(&m))
        .out_axes(1)
        .call(&fixture::tensor(&o1["x"]));
    close(&got, &fixture::tensor(&o1["out"]), 8, "jax out_axes=1");

    // Control flow under vmap: scan (and its gradient), while_loop, cond.
    let c = &fx["control"];
    let (w, h0, xs, x) = (
        fixture::tensor(&c["w"]),
        fixture::tensor(&c["h0"]),
        fixture::tensor(&c["xs"]),
        fixture::tensor(&c["x"]),
    );
    same(&xs, &det(&[4, 5, 3], 19.0), "make.py's det");
    let s = vmap(|s: &Tensor| rnn(&w, &h0, s)).call(&xs);
    close(&s, &fixture::tensor(&c["scan"]), 8, "jax vmap of scan");
    let gs = vmap(|s: &Tensor| grad(|w: &Tensor| rnn(w, &h0, s))(&w)).call(&xs);
    close(
        &gs,
        &fixture::tensor(&c["grad_scan"]),
        8,
        "jax vmap of grad of scan",
    );
    let trips = vmap(|v: &Tensor| {
        while_loop(
            |c: &(Tensor, Tensor)| c.0.sum().lt(&c.0.scalar_like(8.0)),
            |c: &(Tensor, Tensor)| (c.0.abs() * 1.5 + 0.25, &c.1 + 1.0),
            &(v.clone(), Tensor::scalar(0.0f32)),
        )
        .1
    })
    .call(&x);
    same(
        &trips,
        &fixture::tensor(&c["while_loop"]),
        "jax vmap of while_loop",
    );
    let br = vmap(|v: &Tensor| {
        cond(
            &v.sum().gt(&v.scalar_like(0.0)),
            |v: &Tensor| v.exp(),
            |v: &Tensor| v.sin() * 2.0,
            v,
        )
    })
    .call(&x);
    close(&br, &fixture::tensor(&c["cond"]), 8, "jax vmap of cond");
}

/// The message of the error a jitted vmap returns.
fn jit_error<T: Tree>(f: impl Fn(Tensor) -> T, x: &Tensor) -> String {
    match jit(f).call(x.clone()) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_axes_are_errors_at_the_callers_line() {
    eight_devices();
    let x = Tensor::ones([4, 3]);
    // The error names a line of this file within the few lines after `line` (the call).
    let here = |e: &str, line: u32| {
        let at = e.rsplit("tests/vmap.rs:").next().unwrap();
        let n: u32 = at.trim().parse().unwrap_or(0);
        n > line && n <= line + 4
    };

    let line = line!();
    let e = jit_error(|x| vmap(|x: &Tensor| x.exp()).in_axes(2).call(&x), &x);
    assert!(e.contains("in_axes maps dim 2") && here(&e, line), "{e}");

    let line = line!();
    let e = jit_error(
        |x| vmap(|(a, b): &(Tensor, Tensor)| a + b).call(&(x.clone(), x.slice(&[0, 0], &[3, 3]))),
        &x,
    );
    assert!(
        e.contains("differ in size") && e.contains("has 4") && e.contains("has 3"),
        "{e}"
    );
    assert!(here(&e, line), "{e}");

    let line = line!();
    let e = jit_error(
        |x| vmap(|x: &Tensor| x.exp()).in_axes(axes![0, 0]).call(&x),
        &x,
    );
    assert!(e.contains("do not match the tree") && here(&e, line), "{e}");

    let line = line!();
    let e = jit_error(|x| vmap(|x: &Tensor| x.exp()).out_axes(None).call(&x), &x);
    assert!(e.contains("out_axes is None") && here(&e, line), "{e}");

    let e = jit_error(|x| vmap(|x: &Tensor| x.exp()).in_axes(None).call(&x), &x);
    assert!(e.contains("give axis_size"), "{e}");

    // Eagerly, the same error is a panic with the same text.
    let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        vmap(|x: &Tensor| x.exp()).in_axes(5).call(&x)
    }));
    let msg = p.unwrap_err();
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(msg.contains("in_axes maps dim 5"), "{msg}");
}

/// `pmap` with `in_axes`/`out_axes`: an input every device gets whole, one mapped along dim 1,
/// an output stacked along dim 1 and one returned once.
#[test]
fn pmap_in_axes_and_out_axes() {
    eight_devices();
    let (w, x) = (det(&[3], 13.0), det(&[3, 4], 14.0));
    let f = pmap("d", |(w, x): (Tensor, Tensor)| {
        let y = &x * &w;
        (&y + axis_index("d").astype(DType::F32), psum(&y, "d"))
    })
    .in_axes(axes![None, 1])
    .out_axes(axes![1, None]);
    let (a, s) = f.call((w.clone(), x.clone())).unwrap();
    let cols: Vec<Tensor> = (0..4).map(|j| &row(&x, 1, j) * &w + (j as f32)).collect();
    same(&a, &stack(&cols, 1), "mapped output along dim 1");
    close(
        &s,
        &(&x * &w.broadcast_in_dim([3, 4], &[0])).sum_axes([1]),
        1,
        "unmapped psum",
    );
    // The same as vmap with the axis named.
    let v = vmap(|(w, x): &(Tensor, Tensor)| {
        let y = x * w;
        (&y + axis_index("d").astype(DType::F32), psum(&y, "d"))
    })
    .in_axes(axes![None, 1])
    .out_axes(axes![1, None])
    .axis_name("d")
    .call(&(w.clone(), x.clone()));
    same(&v.0, &a, "vmap = pmap");
    close(&v.1, &s, 1, "vmap = pmap psum");
    // An unmapped output that differs between devices is an error, not device 0's value.
    let bad = pmap("d", |x: Tensor| x * 2.0).in_axes(1).out_axes(None);
    let e = bad.call(x.clone()).unwrap_err().to_string();
    assert!(e.contains("out_axes is None for output 0"), "{e}");
    let e = pmap("d", |x: Tensor| x)
        .in_axes(2)
        .call(x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no dim 2 to map"), "{e}");
}

/// The random ops are composites of primitives (threefry on u32 words), so a vmap over keys
/// draws exactly what the loop over the keys draws (which is JAX's, `tests/prng.rs`).
#[test]
fn vmap_over_keys_draws_what_the_loop_draws() {
    eight_devices();
    let keys = Key::new(3).split_n(5);
    let words = stack(
        &keys.iter().map(|k| k.data().clone()).collect::<Vec<_>>(),
        0,
    );
    let draw = |k: &Key| {
        (
            random::normal(k, [3]),
            random::uniform(&k.fold_in(7), [2, 2], -1.0, 2.0),
        )
    };
    let got = vmap(draw).call(&Key(words.clone()));
    let loop_n = stack(&keys.iter().map(|k| draw(k).0).collect::<Vec<_>>(), 0);
    let loop_u = stack(&keys.iter().map(|k| draw(k).1).collect::<Vec<_>>(), 0);
    same(&got.0, &loop_n, "normal");
    same(&got.1, &loop_u, "uniform");
    let j = jit(|w: Tensor| vmap(draw).call(&Key(w)));
    let gj = j.call(words).unwrap();
    same(&gj.0, &loop_n, "jit normal");
    same(&gj.1, &loop_u, "jit uniform");
}

/// Per-example gradients at batch 256, vmapped against the Rust loop inside one `jit` (the
/// issue's numbers: the loop's first call grows with the batch). Prints both first calls and
/// steps; run with `cargo test -p tessera --test vmap -- --ignored --nocapture timing`.
#[test]
#[ignore]
fn timing_per_example_grads_at_batch_256() {
    eight_devices();
    let p = mlp();
    let (x, y) = (det(&[256, 4], 5.0), det(&[256, 1], 6.0));
    let args = (p, x, y);
    let looped = |(p, x, y): (Mlp, Tensor, Tensor)| {
        let gs: Vec<Tensor> = (0..256)
            .map(|i| {
                let (xi, yi) = (row(&x, 0, i), row(&y, 0, i));
                grad(|p: &Mlp| loss(p, &xi, &yi))(&p).w1
            })
            .collect();
        stack(&gs, 0)
    };
    let vmapped = |a: (Mlp, Tensor, Tensor)| per_example_grads(&a).w1;
    let time = |f: &dyn Fn() -> Tensor| {
        let t = std::time::Instant::now();
        let out = f();
        (out, t.elapsed().as_secs_f64() * 1e3)
    };
    let (jl, jv) = (jit(looped), jit(vmapped));
    let (l, l_first) = time(&|| jl.call(args.clone()).unwrap());
    let (v, v_first) = time(&|| jv.call(args.clone()).unwrap());
    close(&v, &l, 4, "vmap vs loop");
    let steps = 20;
    let (_, l_step) = time(&|| {
        (0..steps)
            .map(|_| jl.call(args.clone()).unwrap())
            .last()
            .unwrap()
    });
    let (_, v_step) = time(&|| {
        (0..steps)
            .map(|_| jv.call(args.clone()).unwrap())
            .last()
            .unwrap()
    });
    println!(
        "batch 256 per-example grads: first call loop {l_first:.1} ms, vmap {v_first:.1} ms; \
         step loop {:.3} ms, vmap {:.3} ms",
        l_step / steps as f64,
        v_step / steps as f64
    );
}

/// Nested vmaps with two axis names: the inner pass leaves the collective over the outer name
/// as a collective (its dims shifted), which the outer pass then maps. A psum of a value that
/// does not depend on the batch is the value times the batch size (JAX's rule).
#[test]
fn nested_axis_names() {
    eight_devices();
    let x = det(&[3, 4], 15.0) + 2.0;
    let inner = |r: &Tensor| {
        vmap(|v: &Tensor| v / psum(v, "i") + psum(v, "j") + psum(&v.scalar_like(1.0), "j"))
            .axis_name("j")
            .call(r)
    };
    let got = vmap(inner).axis_name("i").call(&x);
    let want = &x / x.sum_axes([0]).broadcast_in_dim([3, 4], &[1])
        + x.sum_axes([1]).broadcast_in_dim([3, 4], &[0])
        + 4.0;
    close(&got, &want, 1, "nested names");
    let j = jit(|x: Tensor| vmap(inner).axis_name("i").call(&x));
    close(&j.call(x.clone()).unwrap(), &want, 2, "jit nested names");
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        vmap(|r: &Tensor| vmap(|v: &Tensor| psum(v, "i")).axis_name("i").call(r))
            .axis_name("i")
            .call(&x)
    }))
    .unwrap_err();
    let e = e.downcast_ref::<String>().unwrap();
    assert!(e.contains("axis_name \"i\" is already an axis"), "{e}");
}

/// Inside pmap, a collective over the devices' axis in a vmapped function stays a collective
/// over the devices, its dims shifted past the batch dim: the same values as the collective on
/// the hand-batched value.
#[test]
fn mesh_collectives_inside_vmap_inside_pmap() {
    eight_devices();
    let x = det(&[4, 3, 4], 16.0);
    let per_row = |r: &Tensor| {
        (
            psum(r, "d"),
            all_gather(r, "d"),
            psum_scatter(r, "d", 0),
            all_to_all(&r.reshape([4, 1]), "d", 0, 1),
        )
    };
    let got = pmap("d", |x: Tensor| vmap(per_row).call(&x))
        .call(x.clone())
        .unwrap();
    let want = pmap("d", |x: Tensor| {
        (
            psum(&x, "d"),
            all_gather(&x, "d").transpose(&[1, 0, 2]),
            psum_scatter(&x, "d", 1),
            all_to_all(&x.reshape([3, 4, 1]), "d", 1, 2),
        )
    })
    .call(x)
    .unwrap();
    same(&got.0, &want.0, "psum");
    same(&got.1, &want.1, "all_gather");
    same(&got.2, &want.2, "psum_scatter");
    same(&got.3, &want.3, "all_to_all");
}

/// An RNN step over one example's sequence (`xs`: `[5, 3]`), the initial state unbatched.
fn rnn(w: &Tensor, h0: &Tensor, xs: &Tensor) -> Tensor {
    let (h, ys) = scan(
        |h: &Tensor, x: &Tensor| {
            let h2 = (h.matmul(w) + x).tanh();
            (h2.clone(), h2.sum())
        },
        h0,
        xs,
        None,
        false,
    );
    h.sum() + ys.sum()
}

/// Runs `f` over the first dim of `x`, stacking the results (the loop oracle).
fn loop_over(x: &Tensor, f: impl Fn(&Tensor) -> Tensor) -> Tensor {
    stack(
        &(0..x.shape()[0])
            .map(|i| f(&row(x, 0, i)))
            .collect::<Vec<_>>(),
        0,
    )
}

/// The control-flow ops under vmap, each against the loop: a scan whose carry becomes batched
/// through its xs (and its gradient), a while_loop whose trip count differs per example, cond
/// and switch on a batched predicate or index, fori_loop, checkpoint and custom_vjp under
/// vmap(grad). Bit for bit eagerly (but for a sum to a scalar, see below); within 4 ulp
/// compiled.
#[test]
fn control_flow_under_vmap_equals_the_loop() {
    eight_devices();
    let w = det(&[3, 3], 17.0);
    let h0 = det(&[3], 18.0);
    let xs = det(&[4, 5, 3], 19.0);
    let x = det(&[6, 3], 20.0) * 3.0;
    type Case<'a> = (&'a str, Box<dyn Fn(&Tensor) -> Tensor + 'a>, &'a Tensor);
    let cases: Vec<Case> = vec![
        ("scan", Box::new(|s: &Tensor| rnn(&w, &h0, s)), &xs),
        (
            "grad of scan",
            Box::new(|s: &Tensor| grad(|w: &Tensor| rnn(w, &h0, s))(&w)),
            &xs,
        ),
        (
            "while_loop",
            Box::new(|v: &Tensor| {
                while_loop(
                    |c: &(Tensor, Tensor)| c.0.sum().lt(&c.0.scalar_like(8.0)),
                    |c: &(Tensor, Tensor)| (c.0.abs() * 1.5 + 0.25, &c.1 + 1.0),
                    &(v.clone(), Tensor::scalar(0.0f32)),
                )
                .1
                .broadcast_in_dim([1], &[])
            }),
            &x,
        ),
        (
            "cond",
            Box::new(|v: &Tensor| {
                cond(
                    &v.sum().gt(&v.scalar_like(0.0)),
                    |v: &Tensor| v.exp(),
                    |v: &Tensor| v.sin() * 2.0,
                    v,
                )
            }),
            &x,
        ),
        (
            "switch",
            Box::new(|v: &Tensor| {
                let i = (v.sum() * 0.7).astype(DType::I32);
                let branches: [&dyn Fn(&Tensor) -> Tensor; 3] =
                    [&|v| v.neg(), &|v| v * v, &|v| v.tanh()];
                switch(&i, &branches, v)
            }),
            &x,
        ),
        (
            "fori_loop",
            Box::new(|v: &Tensor| {
                fori_loop(
                    0,
                    4,
                    |i: &Tensor, c: &Tensor| (c * 0.5).sin() + i.astype(DType::F32),
                    v,
                )
            }),
            &x,
        ),
        (
            "grad of checkpoint",
            Box::new(|v: &Tensor| {
                let f = checkpoint(|v: &Tensor| (v.sin() * v).sum());
                grad(&f)(v)
            }),
            &x,
        ),
        (
            "grad of custom_vjp",
            Box::new(|v: &Tensor| {
                let softplus = custom_vjp(
                    |v: &Tensor| {
                        let y = (v.exp() + 1.0).log();
                        (y, v.clone())
                    },
                    |v: &Tensor, g: &Tensor| g * v.sigmoid(),
                );
                grad(|v: &Tensor| softplus(v).sum())(v)
            }),
            &x,
        ),
    ];
    for (name, f, input) in &cases {
        let want = loop_over(input, f);
        let got = vmap(|v: &Tensor| f(v)).call(input);
        if *name == "scan" {
            // `h.sum()` per example is a sum to a scalar, which the interpreter accumulates in
            // f64 and rounds once; batched it is a sum along one axis, in f32.
            close(&got, &want, 1, &format!("eager {name}"));
        } else {
            same(&got, &want, &format!("eager {name}"));
        }
        for backend in [Backend::Cranelift, Backend::Interpreter] {
            let j = jit(|v: Tensor| vmap(|v: &Tensor| f(v)).call(&v)).backend(backend);
            close(
                &j.call((*input).clone()).unwrap(),
                &want,
                4,
                &format!("{backend:?} {name}"),
            );
        }
    }
}

/// A sharding constraint inside a vmapped function under a sharded jit: the batch dim is left
/// open (`{?}`, JAX's unconstrained dim), and the values are the loop's. (Propagation closes
/// every dim of a constraint today, open ones too, so this program still gathers the batch
/// after the constraint; see docs/notes-vmap.md.)
#[test]
fn sharding_constraints_leave_the_batch_dim_to_propagation() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let x = det(&[16, 6], 21.0);
    let whole = NamedSharding::new(&mesh, P![]);
    let f =
        |x: Tensor| vmap(|r: &Tensor| with_sharding_constraint(&r.tanh(), &whole) * 2.0).call(&x);
    let xs = device_put(x.clone(), NamedSharding::new(&mesh, P!["dp"]));
    let j = jit(f);
    let got = j.call(xs.clone()).unwrap();
    close(&got, &loop_over(&x, |r| r.tanh() * 2.0), 1, "values");
    let ir = j.lower(&xs).unwrap().ir();
    assert!(ir.contains("sharding_constraint"), "{ir}");
    assert!(
        ir.contains("sharding=<@mesh, [{?}, {}]>"),
        "the batch dim is open:\n{ir}"
    );
}

/// vmap over a batch of 0 examples through the indexing ops (gather and scatter, whose batched
/// form slices the batch dim): empty results of the right shapes, eager and under jit.
#[test]
fn vmap_over_no_examples_through_gather_and_scatter() {
    let x = Tensor::from_vec(Vec::<f32>::new(), vec![0, 5]);
    let i2 = Tensor::from_vec(Vec::<i32>::new(), vec![0, 2]);
    let i0 = Tensor::from_vec(Vec::<i32>::new(), vec![0]);
    let v = Tensor::from_vec(Vec::<f32>::new(), vec![0]);
    let shape = |t: Tensor| t.shape().to_vec();
    let take = |(x, i): &(Tensor, Tensor)| x.take(i, 0);
    let along = |(x, i): &(Tensor, Tensor)| x.take_along_axis(i, 0);
    let dslice = |(x, i): &(Tensor, Tensor)| x.dynamic_slice(std::slice::from_ref(i), &[2]);
    let get = |(x, i): &(Tensor, Tensor)| x.at(i).get();
    assert_eq!(shape(vmap(take).call(&(x.clone(), i2.clone()))), [0, 2]);
    assert_eq!(shape(vmap(along).call(&(x.clone(), i2.clone()))), [0, 2]);
    assert_eq!(shape(vmap(dslice).call(&(x.clone(), i0.clone()))), [0, 2]);
    assert_eq!(shape(vmap(get).call(&(x.clone(), i0.clone()))), [0]);
    let add = |(x, i, v): &(Tensor, Tensor, Tensor)| x.at(i).add(v);
    assert_eq!(
        shape(vmap(add).call(&(x.clone(), i0.clone(), v.clone()))),
        [0, 5]
    );
    let jitted = jit(move |(x, i): (Tensor, Tensor)| vmap(take).call(&(x, i)))
        .call((x, i2))
        .expect("runs");
    assert_eq!(jitted.shape(), [0, 2]);
}
