//! Soundness of the user surface (issue 10): programs just outside the seeds' shape compile and
//! equal their single-device run, every user error names the caller's line, and mixing an
//! integer tensor with a float number is an error instead of a silent truncation.

use tessera::ir::{DType, Graph, Op, TensorType, UnaryOp};
use tessera::prelude::*;

fn two_devices() -> Mesh {
    // SAFETY: every test of this binary sets the same value before the device pool starts and
    // before any other thread reads the environment.
    unsafe { std::env::set_var("TESSERA_DEVICES", "2") };
    Mesh::new([2], ["dp"])
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().iter().map(|x| x.to_bits()).collect()
}

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}");
    for (x, y) in a.to_vec::<f32>().iter().zip(b.to_vec::<f32>()) {
        assert!(
            (x - y).abs() <= 1e-4 * y.abs().max(1.0),
            "{what}: {x} vs {y}"
        );
    }
}

/// The line of the caller, as errors print it.
#[track_caller]
fn here() -> String {
    let l = std::panic::Location::caller();
    format!("{}:{}", l.file(), l.line())
}

/// Asserts that `err` names this file at `offset` lines below `line` (from `here()`).
#[track_caller]
fn names_line(err: &str, line: &str, offset: i64) {
    let at: i64 = line.rsplit(':').next().unwrap().parse().unwrap();
    let want = format!("tests/soundness.rs:{}", at + offset);
    assert!(err.contains(&want), "{err}: expected {want}");
}

/// The message of an eager panic.
fn panic_text(f: impl FnOnce()) -> String {
    let p =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("expected a panic");
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn loss(w: &Tensor, x: &Tensor, mesh: Option<&Mesh>) -> Tensor {
    let h = x.matmul(w).tanh();
    let h = match mesh {
        Some(m) => with_sharding_constraint(&h, NamedSharding::new(m, P!["dp"])),
        None => h,
    };
    h.square().mean()
}

#[test]
fn sharding_constraint_inside_grad_inside_jit() {
    let mesh = two_devices();
    let w = random::normal(&Key::new(3), [6, 4]);
    let x = random::normal(&Key::new(4), [8, 6]);
    let single = jit(|(w, x): (Tensor, Tensor)| value_and_grad(|w: &Tensor| loss(w, &x, None))(&w));
    let (l1, g1) = single.call((w.clone(), x.clone())).unwrap();
    let m = mesh.clone();
    let sharded =
        jit(move |(w, x): (Tensor, Tensor)| value_and_grad(|w: &Tensor| loss(w, &x, Some(&m)))(&w));
    let args = (
        device_put(w, NamedSharding::new(&mesh, P![])),
        device_put(x, NamedSharding::new(&mesh, P!["dp"])),
    );
    let (l2, g2) = sharded.call(args).unwrap();
    close(&l2, &l1, "loss");
    close(&g2, &g1, "gradient");
}

/// A causal mask built from `iota` and compared: a boolean constant that partitioning must
/// slice per device.
fn masked_loss(w: &Tensor, x: &Tensor) -> Tensor {
    let n = x.shape()[0];
    let rows = Tensor::iota(DType::I32, [n, n], 0);
    let cols = Tensor::iota(DType::I32, [n, n], 1);
    let mask = rows.ge(&cols);
    let scores = x.matmul(w).matmul(&x.matmul(w).transpose(&[1, 0]));
    let masked = Tensor::select(&mask, &scores, &Tensor::full([], -0.0));
    masked.tanh().sum()
}

#[test]
fn data_parallel_grad_through_a_boolean_mask() {
    let mesh = two_devices();
    let w = random::normal(&Key::new(5), [6, 3]);
    let x = random::normal(&Key::new(6), [8, 6]);
    let f = |(w, x): (Tensor, Tensor)| value_and_grad(|w: &Tensor| masked_loss(w, &x))(&w);
    let (l1, g1) = jit(f).call((w.clone(), x.clone())).unwrap();
    let args = (
        device_put(w, NamedSharding::new(&mesh, P![])),
        device_put(x, NamedSharding::new(&mesh, P!["dp"])),
    );
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let (l2, g2) = jit(f).backend(backend).call(args.clone()).unwrap();
        close(&l2, &l1, "loss");
        close(&g2, &g1, "gradient");
    }
}

#[test]
fn a_sliced_negative_zero_keeps_its_sign() {
    // Partitioning takes a device's chunk of a replicated value by masking and summing: the
    // filler must not turn -0.0 into +0.0.
    let mesh = two_devices();
    let x = Tensor::from_vec(vec![-0.0f32, 1.0, -0.0, f32::NAN], [4]);
    let f = jit(|x: Tensor| {
        with_sharding_constraint(
            &x.neg().neg(),
            NamedSharding::new(&Mesh::new([2], ["dp"]), P!["dp"]),
        )
    });
    let placed = device_put(x.clone(), NamedSharding::new(&mesh, P![]));
    let got = f.call(placed).unwrap();
    assert_eq!(bits(&got), bits(&x));
}

#[test]
fn lower_shows_the_simplified_program_that_runs() {
    let mesh = two_devices();
    let w = random::normal(&Key::new(7), [6, 4]);
    let x = random::normal(&Key::new(8), [8, 6]);
    // `* 1.0` is removed by the simplifier: the lowered program must not show it.
    let f = jit(|(w, x): (Tensor, Tensor)| {
        value_and_grad(|w: &Tensor| (x.matmul(w) * 1.0).tanh().sum())(&w)
    });
    let single = f.lower(&(w.clone(), x.clone())).unwrap();
    assert!(single.traced_ir().contains("mul"), "{}", single.traced_ir());
    let runs = single.ir();
    assert!(
        single.graph().node_count()
            < tessera::ir::parse(&single.traced_ir())
                .unwrap()
                .node_count(),
        "the lowered program is the simplified one:\n{runs}"
    );
    let args = (
        device_put(w, NamedSharding::new(&mesh, P![])),
        device_put(x, NamedSharding::new(&mesh, P!["dp"])),
    );
    let sharded = f.lower(&args).unwrap();
    let local = sharded.per_device_graph().unwrap();
    let simplified = tessera::ir::parse(&single.ir()).unwrap();
    // The per-device program is the partitioned simplified program: no more compute nodes
    // than it (partitioning adds only collectives, reshapes and slices).
    let count = |g: &Graph, name: &str| g.node_ids().filter(|&n| g.op(n).name() == name).count();
    assert_eq!(count(local, "tanh"), count(&simplified, "tanh"));
    assert_eq!(
        count(local, "mul"),
        count(&simplified, "mul"),
        "{}",
        sharded.per_device_ir()
    );
}

#[test]
fn broadcast_errors_name_the_callers_line() {
    let a = Tensor::zeros([3]);
    let b = Tensor::zeros([4]);
    for (f, name) in [
        (
            Box::new(|a: &Tensor, b: &Tensor| a + b) as Box<dyn Fn(&Tensor, &Tensor) -> Tensor>,
            "add",
        ),
        (Box::new(|a: &Tensor, b: &Tensor| a.sub(b)), "sub"),
        (Box::new(|a: &Tensor, b: &Tensor| a.lt(b)), "lt"),
        (
            Box::new(|a: &Tensor, b: &Tensor| Tensor::select(&a.lt(a), a, b)),
            "select",
        ),
    ] {
        let (a, b) = (a.clone(), b.clone());
        let text = panic_text(|| {
            f(&a, &b);
        });
        assert!(text.contains("tests/soundness.rs"), "{name}: {text}");
        assert!(!text.contains("ops.rs"), "{name}: {text}");
    }
    // Inside jit: an `Err` naming the line of the op.
    let f = jit(|(a, b): (Tensor, Tensor)| a.mul(&b));
    let line = here();
    let err = f.call((a.clone(), b.clone())).unwrap_err().to_string();
    names_line(&err, &line, -1);
}

#[test]
fn read_errors_name_the_callers_line() {
    let t = Tensor::zeros([2]);
    let line = here();
    let err = t.try_to_vec::<i32>().unwrap_err().to_string();
    names_line(&err, &line, 1);
}

#[test]
fn inputs_on_two_meshes_name_the_call() {
    two_devices();
    let m1 = Mesh::new([2], ["a"]);
    let m2 = Mesh::new([2], ["b"]);
    let x = device_put(Tensor::zeros([4]), NamedSharding::new(&m1, P!["a"]));
    let y = device_put(Tensor::zeros([4]), NamedSharding::new(&m2, P!["b"]));
    let f = jit(|(x, y): (Tensor, Tensor)| x + y);
    let line = here();
    let err = f.call((x, y)).unwrap_err().to_string();
    names_line(&err, &line, 1);
}

#[test]
fn pmap_inside_jit_says_so() {
    two_devices();
    let f = jit(|x: Tensor| {
        let p = pmap("i", |x: Tensor| x.sin());
        match p.call(x.clone()) {
            Ok(y) => y,
            Err(e) => {
                assert!(
                    e.to_string().contains("pmap cannot run inside a trace"),
                    "{e}"
                );
                x
            }
        }
    });
    f.call(Tensor::zeros([2, 3])).unwrap();
}

/// The same refusal when the call would find its program compiled by an earlier call at
/// the top level (the last call's program is found before any other check).
#[test]
fn pmap_compiled_outside_then_called_inside_jit_says_so() {
    two_devices();
    let p = std::rc::Rc::new(pmap("i", |x: Tensor| x.sin()));
    p.call(Tensor::zeros([2, 3])).unwrap();
    let inner = p.clone();
    let f = jit(move |x: Tensor| match inner.call(x.clone()) {
        Ok(y) => y,
        Err(e) => {
            assert!(
                e.to_string().contains("pmap cannot run inside a trace"),
                "{e}"
            );
            x * 2.0
        }
    });
    let y = f.call(Tensor::ones([2, 3])).unwrap();
    assert_eq!(y.to_vec::<f32>(), vec![2.0; 6], "the error branch ran");
}

#[test]
fn eval_graph_reports_malformed_graphs() {
    let mut g = Graph::new("cyclic");
    let p = g.add_param(TensorType::new(DType::F32, vec![2]));
    let a = g.add(Op::Unary(UnaryOp::Tanh), &[p]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    g.set_outputs(vec![b]);
    let mut cyclic = g.clone();
    cyclic.replace_all_uses(a, b);
    let x = Tensor::zeros([2]);
    let err = eval_graph(&cyclic, std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("cycle"), "{err}");

    let mut dangling = g.clone();
    let mut bigger = g.clone();
    let extra = bigger.add(Op::Unary(UnaryOp::Sin), &[b]).unwrap();
    dangling.set_outputs(vec![extra]);
    let err = eval_graph(&dangling, std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("output"), "{err}");

    let err = eval_graph(&g, &[Tensor::zeros([3])]).unwrap_err();
    assert!(err.to_string().contains("input 0 is f32[3]"), "{err}");

    let collective = tessera::ir::parse(
        "mesh @m = <\"x\"=2>\nfunc @f(%0: f32[2]) {\n  %1 = all_reduce %0 sum axes=[\"x\"] : f32[2]\n  return %1\n}\n",
    );
    let collective = match collective {
        Ok(g) => g,
        Err(e) => panic!("test program does not parse: {e}"),
    };
    let err = eval_graph(&collective, std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("collective"), "{err}");

    // A well-formed graph still evaluates.
    let y = eval_graph(&g, std::slice::from_ref(&x)).unwrap();
    assert_eq!(y[0].to_vec::<f32>(), vec![1.0, 1.0]);
}

#[test]
fn integer_tensors_never_truncate_a_float_number() {
    // A float number with an integer tensor promotes to f32, as in JAX (this used to be an
    // error before Tessera had type promotion; `tests/promotion.rs` has the whole table).
    let i = Tensor::arange(3);
    let r = &i + 0.5;
    assert_eq!(
        (r.dtype(), r.to_vec::<f32>()),
        (DType::F32, vec![0.5, 1.5, 2.5])
    );
    let u = Tensor::arange(2).astype(DType::U32);
    assert_eq!((&u - 1.0).to_vec::<f32>(), vec![-1.0, 0.0]);
    // Inside jit too.
    let f = jit(|x: Tensor| x * 0.25);
    assert_eq!(
        f.call(Tensor::arange(4)).unwrap().to_vec::<f32>(),
        vec![0.0, 0.25, 0.5, 0.75]
    );
    // An integer number that the integer type cannot hold is an error, never a wrap.
    let text = panic_text(|| {
        let _ = &u + -2;
    });
    assert!(text.contains("u32") && text.contains("-2"), "{text}");
    assert!(text.contains("tests/soundness.rs"), "{text}");
    let g = jit(|x: Tensor| x + (1i64 << 33));
    assert!(g.call(Tensor::arange(4)).is_err());
    // `scalar_like` (a scalar of the tensor's own dtype) still refuses what it cannot hold.
    assert_eq!((&i * &i.scalar_like(2.0)).to_vec::<i32>(), vec![0, 2, 4]);
    let text = panic_text(|| {
        let _ = i.scalar_like(0.5);
    });
    assert!(text.contains("not a i32 value"), "{text}");
    // The mean of an integer tensor is f32, as in JAX.
    let m = Tensor::from_vec(vec![1i32, 2], [2]).mean();
    assert_eq!(m.dtype(), DType::F32);
    assert_eq!(m.to_vec::<f32>(), vec![1.5]);
}

#[test]
fn checked_mode_runs_both_backends_and_agrees() {
    let mesh = two_devices();
    let w = random::normal(&Key::new(9), [6, 4]);
    let x = random::normal(&Key::new(10), [8, 6]);
    let step = |(w, x): (Tensor, Tensor)| {
        let (l, g) = value_and_grad(|w: &Tensor| {
            (x.matmul(w).tanh().exp().logistic() - 0.5).square().mean()
        })(&w);
        (w - g * 0.1, l)
    };
    let (w1, l1) = jit(step).call((w.clone(), x.clone())).unwrap();
    let (w2, l2) = jit(step)
        .checked(true)
        .call((w.clone(), x.clone()))
        .unwrap();
    assert_eq!(
        bits(&w1),
        bits(&w2),
        "checked mode returns the compiled results"
    );
    assert_eq!(bits(&l1), bits(&l2));
    let args = (
        device_put(w, NamedSharding::new(&mesh, P![])),
        device_put(x, NamedSharding::new(&mesh, P!["dp"])),
    );
    let (w3, _) = jit(step).checked(true).call(args).unwrap();
    close(&w3, &w1, "sharded, checked");
}

#[test]
fn every_pass_entry_point_rejects_a_malformed_graph() {
    let mut g = Graph::new("cyclic");
    let p = g.add_param(TensorType::new(DType::F32, vec![2]));
    let a = g.add(Op::Unary(UnaryOp::Tanh), &[p]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    g.set_outputs(vec![b]);
    g.replace_all_uses(a, b);
    let x = tessera::ir::Literal::zeros(&TensorType::new(DType::F32, vec![2]));
    let cycle = |e: String| assert!(e.contains("cycle"), "{e}");
    cycle(
        tessera_interp::run(&g, std::slice::from_ref(&x))
            .unwrap_err()
            .to_string(),
    );
    cycle(
        tessera_codegen::compile(&g)
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    );
    cycle(
        tessera_opt::simplify(&g, tessera_opt::Limits::default())
            .map(|_| ())
            .unwrap_err(),
    );
    let mesh = tessera::ir::Mesh::new("mesh", vec![("dp".into(), 2)]);
    cycle(
        tessera_shard::partition(&g, &mesh, &[vec![vec![]]])
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    );
    cycle(
        tessera_shard::combine_all_reduces(&mut g.clone())
            .unwrap_err()
            .to_string(),
    );
    let mut d = g.clone();
    cycle(
        tessera_autodiff::vjp(&mut d, &[b], &[p], &[p])
            .unwrap_err()
            .to_string(),
    );
}

#[test]
fn results_too_large_for_the_machine_are_errors() {
    // 1 PiB is more than any address space gives; 40 GB (the case) is more than this
    // machine kind's 24 GiB, which Linux refuses at once unless it overcommits always (mode 1).
    let always_overcommits =
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1");
    let mut cases = vec![([1usize << 24, 1 << 24], "1125899906842624")];
    if always_overcommits {
        eprintln!(
            "vm.overcommit_memory is 1: the 40 GB case is not checked here, the 1 PiB one is"
        );
    } else {
        cases.push(([100_000, 100_000], "40000000000"));
    }
    for (huge, bytes) in cases {
        let want = format!("cannot allocate {bytes} bytes");
        let f = jit(move |x: Tensor| x.broadcast_to(&huge));
        let err = f
            .call(Tensor::zeros([1]))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&want), "{err}");
        let f = jit(move |x: Tensor| x.broadcast_to(&huge)).backend(Backend::Interpreter);
        let err = f
            .call(Tensor::zeros([1]))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&want), "{err}");
        let text = panic_text(|| {
            Tensor::zeros([1]).broadcast_to(&huge);
        });
        assert!(text.contains(&want), "{text}");
    }
}

#[test]
fn simplification_keeps_signed_zeros() {
    // -0 + +0 is +0 and -0 - -0 is +0: the simplifier may drop only `+ -0` and `- +0`.
    let x = Tensor::from_vec(vec![-0.0f32, 0.0, 1.0], [3]);
    let plus_zero = |x: Tensor| (&x + 0.0, &x - (-0.0), &x + (-0.0), &x - 0.0);
    for simplify in [true, false] {
        let (a, b, c, d) = jit(plus_zero).simplify(simplify).call(x.clone()).unwrap();
        assert_eq!(bits(&a)[0], 0, "x + 0 at -0, simplify {simplify}");
        assert_eq!(bits(&b)[0], 0, "x - -0 at -0, simplify {simplify}");
        assert_eq!(bits(&c)[0], (-0.0f32).to_bits(), "x + -0 at -0");
        assert_eq!(bits(&d)[0], (-0.0f32).to_bits(), "x - 0 at -0");
    }
}

#[test]
fn pmean_of_integers_is_f32() {
    two_devices();
    let x = Tensor::from_vec(vec![1i32, 2], [2, 1]);
    let m = pmap("i", |x: Tensor| pmean(&x, "i")).call(x).unwrap();
    assert_eq!(m.dtype(), DType::F32);
    assert_eq!(m.to_vec::<f32>(), vec![1.5, 1.5]);
}

/// What a jit call gives back as text: its error, or the panic of a trace-time error.
fn jit_error<T>(f: impl FnOnce() -> tessera::Result<T>) -> String {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    match r {
        Ok(Ok(_)) => panic!("expected an error"),
        Ok(Err(e)) => e.to_string(),
        Err(p) => p.downcast_ref::<String>().cloned().unwrap_or_else(|| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .unwrap_or_default()
        }),
    }
}

/// Hostile windows and paddings (found by adversarial probes) are errors that name the op, or
/// work: before, an interior padding of `usize::MAX` killed the process with SIGILL on
/// Cranelift and divided by zero in the interpreter, a pool's gradient with a stride past 2^62
/// was silently wrong on Cranelift, a huge conv padding aborted on a failed allocation of its
/// work tables, a huge window took memory by the window position, and an overlapping pool's
/// gradient by the position times the operand.
#[test]
fn hostile_windows_and_paddings_are_errors() {
    let one = || Tensor::from_vec(vec![1f32], vec![1]);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let e = jit_error(|| {
            jit(|x: Tensor| x.pad(&Tensor::scalar(0f32), &[0], &[0], &[usize::MAX]))
                .backend(backend)
                .call(one())
        });
        assert!(
            e.contains("pad") && e.contains("past 2^62"),
            "{backend:?}: {e}"
        );
        // A stride past 2^62 leaves one window, which tiles: the gradient goes to its first
        // maximum (before, the per-position gradient's pads needed interior padding past
        // 2^62, an error).
        let g =
            jit(|x: Tensor| grad(|x: &Tensor| x.max_pool(&[2], &[usize::MAX], "SAME").sum())(&x))
                .backend(backend)
                .call(Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], vec![1, 4, 1]))
                .expect("one window's gradient");
        assert_eq!(g.to_vec::<f32>(), vec![0.0, 1.0, 0.0, 0.0], "{backend:?}");
    }
    // Gradients whose transposed convs or pads would need paddings past i64 (strides and
    // paddings near 2^62..2^63): an error naming the op, not an overflow panic.
    let x4 = || Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], vec![1, 1, 4]);
    for (stride, pad) in [
        (1usize << 62, (0i64, 0i64)),
        (usize::MAX, (0, 0)),
        (1, (i64::MAX - 8, 0)),
        (1 << 62, (0, i64::MAX - 8)),
        (1, (i64::MIN + 8, 0)),
        (1 << 61, (-(1 << 61), 1 << 61)),
    ] {
        for backend in [Backend::Cranelift, Backend::Interpreter] {
            let r = std::panic::catch_unwind(|| {
                jit(move |(x, w): (Tensor, Tensor)| {
                    grad(move |x: &Tensor| x.conv(&w, &[stride], vec![pad]).sum())(&x)
                })
                .backend(backend)
                .call((x4(), Tensor::ones([1, 1, 2])))
            });
            match r {
                Ok(Ok(g)) => assert_eq!(g.shape(), x4().shape(), "{stride} {pad:?}"),
                Ok(Err(e)) => {
                    let e = e.to_string();
                    assert!(e.contains("conv"), "{stride} {pad:?} {backend:?}: {e}");
                }
                Err(p) => {
                    let m = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    // A panic is the eager front end's error report: it names the op.
                    assert!(
                        m.contains("conv") && !m.contains("overflow"),
                        "{stride} {pad:?} {backend:?}: {m}"
                    );
                }
            }
        }
    }
    // A window of 2^62 positions over 4 elements fits nowhere: the result is empty and the
    // gradient zero, with any stride (before, a stride of 1 made the gradient unroll one
    // slice per window position: an error). Below: windows that overlap.
    let g = jit(|x: Tensor| {
        grad(|x: &Tensor| {
            x.reduce_window(tessera::ir::ReduceKind::Max, &[1 << 62], &[1], "VALID")
                .sum()
        })(&x)
    })
    .call(Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], vec![4]))
    .expect("no window fits");
    assert_eq!(g.to_vec::<f32>(), vec![0.0; 4]);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let g = jit(|x: Tensor| {
            grad(|x: &Tensor| {
                x.reduce_window(
                    tessera::ir::ReduceKind::Max,
                    &[1 << 62],
                    &[1 << 62],
                    "VALID",
                )
                .sum()
            })(&x)
        })
        .backend(backend)
        .call(Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], vec![4]))
        .expect("a tiling window past the operand has a zero gradient");
        assert_eq!(g.to_vec::<f32>(), vec![0.0; 4], "{backend:?}");
    }
    // The interpreter (and eager mode) visit the operand's elements, not the window's 2^40
    // positions: a huge SAME window answers at once with the max/sum of what it covers.
    let x3 = || Tensor::from_vec(vec![1f32, 5.0, 2.0], vec![3]);
    let huge = 1usize << 40;
    let eager = x3().reduce_window(tessera::ir::ReduceKind::Max, &[huge], &[1], "SAME");
    assert_eq!(eager.to_vec::<f32>(), vec![5.0; 3]);
    let interp = jit(move |x: Tensor| {
        x.reduce_window(tessera::ir::ReduceKind::Sum, &[huge], &[huge], "SAME")
    })
    .backend(Backend::Interpreter)
    .call(x3())
    .expect("runs");
    assert_eq!(interp.to_vec::<f32>(), vec![8.0]);
    // Compiled too, a window of many more positions than its operand has elements visits
    // what it covers (before, its tables took 16 bytes a position: 6.3 GB for 2^28, and
    // 2^36 could not be allocated).
    for w in [1usize << 28, 1 << 36] {
        let got =
            jit(move |x: Tensor| x.reduce_window(tessera::ir::ReduceKind::Max, &[w], &[w], "SAME"))
                .backend(Backend::Cranelift)
                .call(x3())
                .expect("runs");
        assert_eq!(got.to_vec::<f32>(), vec![5.0], "window {w}");
    }
    // The gradient of overlapping windows takes a pass over the padded operand per window
    // position: past 2^28 elements in all it is an error naming the op (a window of 100,000
    // over 3 elements took 7.8 GB before, and was killed).
    let e = jit_error(|| {
        jit(|x: Tensor| {
            grad(|x: &Tensor| {
                x.reduce_window(tessera::ir::ReduceKind::Max, &[100_000], &[1], "SAME")
                    .sum()
            })(&x)
        })
        .call(x3())
    });
    assert!(
        e.contains("reduce_window is not differentiable") && e.contains("padded operand"),
        "{e}"
    );
    let (k, p) = (1usize << 17, 1i64 << 17);
    let e = jit_error(|| {
        jit(move |(x, w): (Tensor, Tensor)| x.conv(&w, &[1], vec![(p, p)]))
            .backend(Backend::Cranelift)
            .call((
                Tensor::from_vec(vec![1f32], vec![1, 1, 1]),
                Tensor::zeros([1, 1, k]),
            ))
    });
    assert!(
        e.contains("conv_general_dilated") && e.contains("cannot allocate"),
        "{e}"
    );
}

/// Checked mode on products whose terms overflow: a fused multiply-add keeps finite a product
/// the interpreter rounds to infinity, so the compiled sum may be -inf where the
/// interpreter's is NaN; every op agrees within its bound, and the call must not be reported.
#[test]
fn checked_mode_accepts_sums_past_the_largest_float() {
    let vals = [
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0,
        3.0e38,
        -2.0e38,
    ];
    let mut s: u64 = 12345;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let step = |(a, b): (Tensor, Tensor)| (a.matmul(&b).tanh(), a.sum_axes([1]), a * 2.0);
    let (f, checked) = (jit(step), jit(step).checked(true));
    for _ in 0..40 {
        let (m, k, n) = (1 + next() % 5, 1 + next() % 9, 1 + next() % 5);
        let a: Vec<f32> = (0..m * k).map(|_| vals[next() % vals.len()]).collect();
        let b: Vec<f32> = (0..k * n).map(|_| vals[next() % vals.len()]).collect();
        let args = (Tensor::from_vec(a, [m, k]), Tensor::from_vec(b, [k, n]));
        let (product, _, _) = checked.call(args.clone()).unwrap();
        assert_eq!(bits(&product), bits(&f.call(args).unwrap().0));
    }
    // The same products in a loop body, which checked mode does not check op by op.
    let looped = |(a, b): (Tensor, Tensor)| {
        let (_, rows) = scan(
            |c: &Tensor, row: &Tensor| {
                let c = c + row.reshape([1, 4]).matmul(&b);
                (c.clone(), c)
            },
            &Tensor::zeros([1, 3]),
            &a,
            None,
            false,
        );
        rows
    };
    let (f, checked) = (jit(looped), jit(looped).checked(true));
    for _ in 0..40 {
        let a: Vec<f32> = (0..5 * 4).map(|_| vals[next() % vals.len()]).collect();
        let b: Vec<f32> = (0..4 * 3).map(|_| vals[next() % vals.len()]).collect();
        let args = (Tensor::from_vec(a, [5, 4]), Tensor::from_vec(b, [4, 3]));
        let rows = checked.call(args.clone()).unwrap();
        assert_eq!(bits(&rows), bits(&f.call(args).unwrap()));
    }
}
