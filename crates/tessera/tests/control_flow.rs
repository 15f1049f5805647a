//! Control flow and the autodiff controls (`scan`, `fori_loop`, `while_loop`, `cond`,
//! `switch`, `checkpoint`, `custom_vjp`, `stop_gradient`): against loops and branches written
//! out in Rust (the unrolled program), against closed forms and against f64 finite
//! differences, eagerly and under `jit` on both backends, and their errors.

use tessera::prelude::*;

const BACKENDS: [Backend; 2] = [Backend::Cranelift, Backend::Interpreter];

fn close(a: &[f32], b: &[f32], rel: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= rel * y.abs().max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

fn close64(a: f64, b: f64, rel: f64, what: &str) {
    assert!(
        (a - b).abs() <= rel * b.abs().max(1.0),
        "{what}: {a} vs {b}"
    );
}

// ---------------------------------------------------------------------------------------
// An RNN: scan against the unrolled loop.

fn rnn_inputs(t: usize) -> (Tensor, Tensor, Tensor, Tensor) {
    let wx = random::normal(&Key::new(1), [3, 8]) * 0.5;
    let wh = random::normal(&Key::new(2), [8, 8]) * 0.3;
    let wo = random::normal(&Key::new(3), [8]);
    let xs = random::normal(&Key::new(4), [t, 2, 3]);
    (wx, wh, wo, xs)
}

fn rnn_cell(h: &Tensor, x: &Tensor, wx: &Tensor, wh: &Tensor) -> Tensor {
    (x.matmul(wx) + h.matmul(wh)).tanh()
}

fn rnn_scan(w: &(Tensor, Tensor, Tensor), xs: &Tensor) -> Tensor {
    let (wx, wh, wo) = w;
    let h0 = Tensor::zeros([2, 8]);
    let (h, ys) = scan(
        |h: &Tensor, x: &Tensor| {
            let h2 = rnn_cell(h, x, wx, wh);
            let y = (&h2 * wo).sum();
            (h2, y)
        },
        &h0,
        xs,
        None,
        false,
    );
    ys.sum() + h.square().sum()
}

fn rnn_unrolled(w: &(Tensor, Tensor, Tensor), xs: &Tensor) -> Tensor {
    let (wx, wh, wo) = w;
    let t = xs.shape()[0];
    let mut h = Tensor::zeros([2, 8]);
    let mut ys = Vec::new();
    for i in 0..t {
        let x = xs.slice(&[i, 0, 0], &[i + 1, 2, 3]).reshape([2, 3]);
        h = rnn_cell(&h, &x, wx, wh);
        ys.push((&h * wo).sum().reshape([1]));
    }
    let refs: Vec<&Tensor> = ys.iter().collect();
    Tensor::concatenate(&refs, 0).sum() + h.square().sum()
}

#[test]
fn an_rnn_written_with_scan_equals_the_unrolled_loop_with_gradients() {
    let (wx, wh, wo, xs) = rnn_inputs(12);
    let w = (wx, wh, wo);
    let (l_scan, g_scan) = value_and_grad(|w: &(Tensor, Tensor, Tensor)| rnn_scan(w, &xs))(&w);
    let (l_unr, g_unr) = value_and_grad(|w: &(Tensor, Tensor, Tensor)| rnn_unrolled(w, &xs))(&w);
    close(&l_scan.to_vec(), &l_unr.to_vec(), 1e-6, "eager loss");
    close(&g_scan.0.to_vec(), &g_unr.0.to_vec(), 1e-5, "eager d wx");
    close(&g_scan.1.to_vec(), &g_unr.1.to_vec(), 1e-5, "eager d wh");
    close(&g_scan.2.to_vec(), &g_unr.2.to_vec(), 1e-5, "eager d wo");
    for backend in BACKENDS {
        let step = jit(|(w, xs): ((Tensor, Tensor, Tensor), Tensor)| {
            value_and_grad(|w: &(Tensor, Tensor, Tensor)| rnn_scan(w, &xs))(&w)
        })
        .backend(backend);
        let (l, g) = step.call((w.clone(), xs.clone())).unwrap();
        close(&l.to_vec(), &l_unr.to_vec(), 1e-6, "jit loss");
        close(&g.0.to_vec(), &g_unr.0.to_vec(), 1e-5, "jit d wx");
        close(&g.1.to_vec(), &g_unr.1.to_vec(), 1e-5, "jit d wh");
        close(&g.2.to_vec(), &g_unr.2.to_vec(), 1e-5, "jit d wo");
    }
}

/// The IR of a scan is the size of its body: the same for 10 steps and for 400.
#[test]
fn the_ir_of_a_scan_does_not_grow_with_its_length() {
    let lines = |t: usize| {
        let (wx, wh, wo, xs) = rnn_inputs(t);
        let f = jit(|(w, xs): ((Tensor, Tensor, Tensor), Tensor)| {
            value_and_grad(|w: &(Tensor, Tensor, Tensor)| rnn_scan(w, &xs))(&w)
        });
        let lowered = f.lower(&((wx, wh, wo), xs)).unwrap();
        (lowered.traced_ir().lines().count(), lowered.ir())
    };
    let (short, _) = lines(10);
    let (long, ir) = lines(400);
    assert_eq!(short, long, "{ir}");
    assert!(ir.contains("scan"), "{ir}");
}

// ---------------------------------------------------------------------------------------
// scan in detail.

#[test]
fn scan_computes_cumulative_sums_forward_and_reversed() {
    let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    let cum = |reverse: bool, xs: &Tensor| {
        scan(
            |c: &Tensor, x: &Tensor| {
                let c2 = c + x;
                (c2.clone(), c2)
            },
            &Tensor::scalar(0.0f32),
            xs,
            None,
            reverse,
        )
    };
    let (total, ys) = cum(false, &xs);
    assert_eq!(total.item::<f32>(), 10.0);
    assert_eq!(ys.to_vec::<f32>(), vec![1.0, 3.0, 6.0, 10.0]);
    let (_, ys) = cum(true, &xs);
    assert_eq!(ys.to_vec::<f32>(), vec![10.0, 9.0, 7.0, 4.0]);
    for backend in BACKENDS {
        let f = jit(move |xs: Tensor| cum(true, &xs)).backend(backend);
        let (t, ys) = f.call(xs.clone()).unwrap();
        assert_eq!(t.item::<f32>(), 10.0);
        assert_eq!(ys.to_vec::<f32>(), vec![10.0, 9.0, 7.0, 4.0]);
    }
}

/// A discounted return, `G_t = r_t + gamma G_{t+1}`, is a reverse scan; its gradient with
/// respect to the rewards is `gamma^(t-s)` summed, and with respect to gamma too.
#[test]
fn a_reverse_scan_of_discounted_returns_has_the_right_gradients() {
    let rewards = Tensor::from_vec(vec![1.0f64, -0.5, 2.0, 0.25, 1.5], [5]);
    let gamma = Tensor::scalar(0.9f64);
    let returns = |(r, g): &(Tensor, Tensor)| {
        let (_, gs) = scan(
            |acc: &Tensor, rt: &Tensor| {
                let v = rt + &(g * acc);
                (v.clone(), v)
            },
            &Tensor::scalar(0.0f64),
            r,
            None,
            true,
        );
        gs.sum()
    };
    let manual = |r: &[f64], g: f64| {
        let mut total = 0.0;
        for t in 0..r.len() {
            let mut v = 0.0;
            for (k, &rk) in r[t..].iter().enumerate() {
                v += g.powi(k as i32) * rk;
            }
            total += v;
        }
        total
    };
    let args = (rewards.clone(), gamma.clone());
    let (l, (dr, dg)) = value_and_grad(returns)(&args);
    let r = rewards.to_vec::<f64>();
    close64(l.item::<f64>(), manual(&r, 0.9), 1e-12, "total");
    let h = 1e-6;
    for i in 0..r.len() {
        let mut up = r.clone();
        up[i] += h;
        let mut dn = r.clone();
        dn[i] -= h;
        let fd = (manual(&up, 0.9) - manual(&dn, 0.9)) / (2.0 * h);
        close64(dr.to_vec::<f64>()[i], fd, 1e-7, "d reward");
    }
    let fd = (manual(&r, 0.9 + h) - manual(&r, 0.9 - h)) / (2.0 * h);
    close64(dg.item::<f64>(), fd, 1e-7, "d gamma");
    for backend in BACKENDS {
        let f = jit(move |a: (Tensor, Tensor)| value_and_grad(returns)(&a)).backend(backend);
        let (l2, (dr2, dg2)) = f.call(args.clone()).unwrap();
        close64(l2.item::<f64>(), l.item::<f64>(), 1e-14, "jit total");
        for (a, b) in dr2.to_vec::<f64>().iter().zip(dr.to_vec::<f64>()) {
            close64(*a, b, 1e-14, "jit d reward");
        }
        close64(dg2.item::<f64>(), dg.item::<f64>(), 1e-14, "jit d gamma");
    }
}

#[derive(Tree, Clone)]
struct State {
    pos: Tensor,
    vel: Tensor,
}

/// A `#[derive(Tree)]` struct as the carry, a tuple of per-step outputs, and `length` without
/// xs.
#[test]
fn a_struct_carry_and_tuple_outputs_scan_without_xs() {
    let init = State {
        pos: Tensor::scalar(0.0f32),
        vel: Tensor::scalar(1.0f32),
    };
    let (end, (ps, vs)) = scan(
        |s: &State, _: &()| {
            let vel = &s.vel * 0.5;
            let pos = &s.pos + &vel;
            (
                State {
                    pos: pos.clone(),
                    vel: vel.clone(),
                },
                (pos, vel),
            )
        },
        &init,
        &(),
        Some(3),
        false,
    );
    assert_eq!(end.pos.item::<f32>(), 0.875);
    assert_eq!(ps.to_vec::<f32>(), vec![0.5, 0.75, 0.875]);
    assert_eq!(vs.to_vec::<f32>(), vec![0.5, 0.25, 0.125]);
}

// ---------------------------------------------------------------------------------------
// fori_loop, while_loop.

/// Newton's iteration for `sqrt(a)`: its value, and its gradient with respect to `a` through
/// the loop (`1 / (2 sqrt(a))` once converged).
#[test]
fn fori_loop_newton_iterations_differentiate_with_respect_to_a_parameter() {
    let newton = |a: &Tensor| {
        fori_loop(
            0,
            30,
            |_i: &Tensor, x: &Tensor| (x + &(a / x)) * 0.5,
            &Tensor::scalar(1.0f64),
        )
    };
    let a = Tensor::scalar(2.0f64);
    let (v, g) = value_and_grad(newton)(&a);
    close64(v.item::<f64>(), 2f64.sqrt(), 1e-15, "sqrt 2");
    close64(g.item::<f64>(), 0.5 / 2f64.sqrt(), 1e-12, "d sqrt 2");
    for backend in BACKENDS {
        let f = jit(move |a: Tensor| value_and_grad(newton)(&a)).backend(backend);
        let (v2, g2) = f.call(a.clone()).unwrap();
        close64(v2.item::<f64>(), 2f64.sqrt(), 1e-15, "jit sqrt 2");
        close64(g2.item::<f64>(), 0.5 / 2f64.sqrt(), 1e-12, "jit d sqrt 2");
    }
    // The counter runs from lo to hi; an empty range runs no iteration.
    let count = fori_loop(3, 7, |i: &Tensor, s: &Tensor| s + i, &Tensor::scalar(0i32));
    assert_eq!(count.item::<i32>(), 3 + 4 + 5 + 6);
    let none = fori_loop(7, 3, |i: &Tensor, s: &Tensor| s + i, &Tensor::scalar(5i32));
    assert_eq!(none.item::<i32>(), 5);
}

/// Second derivatives through a loop: `a^3` as a `fori_loop`, differentiated twice (the
/// backward scan is differentiated in turn).
#[test]
fn grad_of_grad_through_a_fori_loop() {
    let cube = |a: &Tensor| {
        fori_loop(
            0,
            3,
            |_i: &Tensor, x: &Tensor| x * a,
            &Tensor::scalar(1.0f64),
        )
    };
    let d2 = |a: &Tensor| grad(|a: &Tensor| grad(cube)(a))(a);
    let a = Tensor::scalar(1.5f64);
    close64(d2(&a).item::<f64>(), 6.0 * 1.5, 1e-14, "d2 a^3");
    for backend in BACKENDS {
        let j = jit(move |a: Tensor| d2(&a)).backend(backend);
        close64(
            j.call(a.clone()).unwrap().item::<f64>(),
            9.0,
            1e-14,
            "jit d2 a^3",
        );
    }
}

/// Halving until below 1: the trip count depends on the data, under jit too.
#[test]
fn while_loop_runs_a_data_dependent_number_of_times() {
    let halvings = |x: &Tensor| {
        let (_, n) = while_loop(
            |(v, _): &(Tensor, Tensor)| v.ge(&Tensor::scalar(1.0f32)),
            |(v, n): &(Tensor, Tensor)| (v * 0.5, n + &Tensor::scalar(1i32)),
            &(x.clone(), Tensor::scalar(0i32)),
        );
        n
    };
    assert_eq!(halvings(&Tensor::scalar(10.0f32)).item::<i32>(), 4);
    assert_eq!(halvings(&Tensor::scalar(0.5f32)).item::<i32>(), 0);
    for backend in BACKENDS {
        let f = jit(move |x: Tensor| halvings(&x)).backend(backend);
        assert_eq!(f.call(Tensor::scalar(10.0f32)).unwrap().item::<i32>(), 4);
        assert_eq!(f.call(Tensor::scalar(1000.0f32)).unwrap().item::<i32>(), 10);
        assert_eq!(f.call(Tensor::scalar(0.25f32)).unwrap().item::<i32>(), 0);
    }
}

#[test]
fn reverse_mode_through_a_while_loop_is_a_clear_error() {
    let f = jit(|x: Tensor| {
        grad(|x: &Tensor| {
            while_loop(
                |v: &Tensor| v.lt(&Tensor::scalar(10.0f32)),
                |v: &Tensor| v * 2.0,
                x,
            )
        })(&x)
    });
    let e = f.call(Tensor::scalar(1.0f32)).unwrap_err().to_string();
    assert!(e.contains("while"), "{e}");
    assert!(e.contains("fori_loop or scan"), "{e}");
}

// ---------------------------------------------------------------------------------------
// cond, switch.

#[test]
fn cond_takes_each_branch_with_gradients() {
    let f = |x: &Tensor| {
        cond(
            &x.gt(&Tensor::scalar(0.0f64)),
            |x: &Tensor| x.square(),
            |x: &Tensor| x.sin() * 3.0,
            x,
        )
    };
    for (x, want, dwant) in [
        (2.0f64, 4.0, 4.0),
        (-1.0, -3.0 * 1f64.sin(), 3.0 * 1f64.cos()),
    ] {
        let (v, g) = value_and_grad(f)(&Tensor::scalar(x));
        close64(v.item::<f64>(), want, 1e-15, "cond value");
        close64(g.item::<f64>(), dwant, 1e-15, "cond grad");
        for backend in BACKENDS {
            let j = jit(move |x: Tensor| value_and_grad(f)(&x)).backend(backend);
            let (v, g) = j.call(Tensor::scalar(x)).unwrap();
            close64(v.item::<f64>(), want, 1e-15, "jit cond value");
            close64(g.item::<f64>(), dwant, 1e-15, "jit cond grad");
        }
    }
}

#[test]
fn switch_clamps_its_index_like_jax() {
    let pick = |i: i32| {
        let x = Tensor::scalar(1.0f32);
        let b0 = |x: &Tensor| x * 10.0;
        let b1 = |x: &Tensor| x * 20.0;
        let b2 = |x: &Tensor| x * 30.0;
        switch(&Tensor::scalar(i), &[&b0, &b1, &b2], &x).item::<f32>()
    };
    assert_eq!(pick(0), 10.0);
    assert_eq!(pick(1), 20.0);
    assert_eq!(pick(2), 30.0);
    assert_eq!(pick(-5), 10.0);
    assert_eq!(pick(9), 30.0);
}

// ---------------------------------------------------------------------------------------
// checkpoint, custom_vjp, stop_gradient.

/// A 16-layer tanh MLP whose layers are checkpointed in blocks of 4: the same gradients, and
/// the compiled step holds less memory at its peak (only the blocks' inputs are kept for the
/// backward pass; the activations inside a block are recomputed there).
#[test]
fn checkpointed_blocks_of_a_deep_mlp_hold_less_memory_with_the_same_gradient() {
    let ws: Vec<Tensor> = Key::new(5)
        .split_n(16)
        .iter()
        .map(|k| random::normal(k, [128, 128]) * (1.0 / 128f32.sqrt()))
        .collect();
    let x = random::normal(&Key::new(6), [64, 128]);
    let layers = |h: &Tensor, ws: &[Tensor]| ws.iter().fold(h.clone(), |h, w| h.matmul(w).tanh());
    let plain = move |(ws, x): &(Vec<Tensor>, Tensor)| layers(x, ws).square().mean();
    let remat = move |(ws, x): &(Vec<Tensor>, Tensor)| {
        let block = checkpoint(move |(h, ws): &(Tensor, Vec<Tensor>)| layers(h, ws));
        let mut h = x.clone();
        for b in ws.chunks(4) {
            h = block(&(h, b.to_vec()));
        }
        h.square().mean()
    };
    let args = (ws.clone(), x.clone());
    let step_plain = jit(move |a: (Vec<Tensor>, Tensor)| grad(plain)(&a).0);
    let step_remat = jit(move |a: (Vec<Tensor>, Tensor)| grad(remat)(&a).0);
    let (gp, gr) = (
        step_plain.call(args.clone()).unwrap(),
        step_remat.call(args.clone()).unwrap(),
    );
    for (a, b) in gp.iter().zip(&gr) {
        close(&b.to_vec(), &a.to_vec(), 1e-5, "checkpointed grad");
    }
    let peak = |lowered: Lowered| {
        tessera_codegen::compile(lowered.program())
            .unwrap()
            .peak_bytes()
    };
    let p_plain = peak(step_plain.lower(&args).unwrap());
    let p_remat = peak(step_remat.lower(&args).unwrap());
    // Plain keeps all 16 activations of 64x128 f32 (32 KiB each) for the backward pass.
    assert!(
        p_remat < p_plain,
        "peak bytes: checkpointed {p_remat}, plain {p_plain}"
    );
    eprintln!("peak temporaries: plain {p_plain} bytes, checkpointed {p_remat} bytes");
}

#[test]
fn checkpoint_gives_the_same_gradient() {
    let layer = |x: &Tensor| (x * 1.5).tanh().sin();
    let plain = |x: &Tensor| layer(&layer(x)).sum();
    let remat = |x: &Tensor| {
        let l = checkpoint(layer);
        l(&l(x)).sum()
    };
    let x = Tensor::from_vec(vec![0.1f64, -0.7, 1.3], [3]);
    let (a, ga) = value_and_grad(plain)(&x);
    let (b, gb) = value_and_grad(remat)(&x);
    assert_eq!(a.item::<f64>(), b.item::<f64>());
    assert_eq!(ga.to_vec::<f64>(), gb.to_vec::<f64>());
    for backend in BACKENDS {
        let j = jit(move |x: Tensor| grad(remat)(&x)).backend(backend);
        let g = j.call(x.clone()).unwrap();
        for (p, q) in g.to_vec::<f64>().iter().zip(ga.to_vec::<f64>()) {
            close64(*p, q, 1e-14, "jit checkpoint grad");
        }
    }
}

/// `log1p(exp(x))` differentiated naively is `exp(x) / (1 + exp(x))`, NaN where `exp`
/// overflows; a custom VJP gives the stable `logistic(x)`.
#[test]
fn custom_vjp_gives_the_stable_gradient_of_softplus() {
    let naive = |x: &Tensor| x.exp().log1p().sum();
    let softplus = custom_vjp(
        |x: &Tensor| (x.exp().log1p(), x.clone()),
        |x: &Tensor, g: &Tensor| g * &x.logistic(),
    );
    let stable = move |x: &Tensor| softplus(x).sum();
    let x = Tensor::from_vec(vec![-3.0f32, 0.0, 100.0], [3]);
    let g_naive = grad(naive)(&x).to_vec::<f32>();
    assert!(g_naive[2].is_nan(), "{g_naive:?}");
    let g = grad(&stable)(&x).to_vec::<f32>();
    let want: Vec<f32> = [-3.0f32, 0.0, 100.0]
        .iter()
        .map(|&v| 1.0 / (1.0 + (-v).exp()))
        .collect();
    close(&g, &want, 1e-6, "custom_vjp grad");
    for backend in BACKENDS {
        let stable = stable.clone();
        let j = jit(move |x: Tensor| grad(&stable)(&x)).backend(backend);
        close(
            &j.call(x.clone()).unwrap().to_vec(),
            &want,
            1e-6,
            "jit custom_vjp grad",
        );
    }
}

#[test]
fn stop_gradient_blocks_the_derivative() {
    let f = |x: &Tensor| (x * &stop_gradient(x)).sum();
    let x = Tensor::from_vec(vec![2.0f32, -3.0], [2]);
    // d/dx (x * sg(x)) = sg(x) = x.
    assert_eq!(grad(f)(&x).to_vec::<f32>(), vec![2.0, -3.0]);
    let j = jit(move |x: Tensor| grad(f)(&x));
    assert_eq!(j.call(x).unwrap().to_vec::<f32>(), vec![2.0, -3.0]);
}

// ---------------------------------------------------------------------------------------
// Bad input: each error names the op and this file's line.

fn error_of<T: std::fmt::Debug>(f: impl FnOnce() -> T) -> String {
    let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
    match p.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&str>() {
            Ok(s) => s.to_string(),
            Err(_) => "a panic without a message".into(),
        },
    }
}

#[test]
fn a_carry_that_changes_type_in_the_body_is_an_error_with_the_line() {
    let e = error_of(|| {
        scan(
            |c: &Tensor, x: &Tensor| (c.astype(DType::F64) + x.astype(DType::F64), ()),
            &Tensor::scalar(0.0f32),
            &Tensor::zeros([3]),
            None,
            false,
        )
    });
    assert!(e.contains("carried value keeps its shape and dtype"), "{e}");
    assert!(e.contains("control_flow.rs:"), "{e}");
    let e = error_of(|| {
        jit(|x: Tensor| {
            while_loop(
                |v: &Tensor| v.sum().lt(&Tensor::scalar(10.0f32)),
                |v: &Tensor| Tensor::concatenate(&[v, v], 0),
                &x,
            )
        })
        .call(Tensor::ones([2]))
        .unwrap()
    });
    assert!(e.contains("while_loop"), "{e}");
    assert!(e.contains("f32[4]") && e.contains("f32[2]"), "{e}");
}

#[test]
fn a_non_scalar_predicate_is_an_error_with_the_line() {
    let r = jit(|x: Tensor| {
        while_loop(
            |v: &Tensor| v.lt(&Tensor::zeros([3])),
            |v: &Tensor| v * 2.0,
            &x,
        )
    })
    .call(Tensor::ones([3]));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("not a scalar bool"), "{e}");
    assert!(e.contains("control_flow.rs:"), "{e}");
    let e = error_of(|| {
        cond(
            &Tensor::from_vec(vec![true, false], [2]),
            |x: &Tensor| x.clone(),
            |x: &Tensor| x.clone(),
            &Tensor::ones([2]),
        )
    });
    assert!(e.contains("cond") && e.contains("not a scalar bool"), "{e}");
    assert!(e.contains("control_flow.rs:"), "{e}");
}

#[test]
fn branches_returning_different_trees_are_an_error_with_the_line() {
    let e = error_of(|| {
        cond(
            &Tensor::scalar(true),
            |x: &Tensor| (x.clone(), x.clone()),
            |x: &Tensor| (x.clone(), x.sum()),
            &Tensor::ones([2]),
        )
    });
    assert!(e.contains("every branch must return the same tree"), "{e}");
    assert!(
        e.contains("true_fn returns") && e.contains("false_fn returns"),
        "{e}"
    );
    assert!(e.contains("control_flow.rs:"), "{e}");
}

/// A `while_loop` that no gradient reaches (its input is behind `stop_gradient` or `floor`)
/// needs no reverse mode: the gradient is that of the rest (JAX's symbolic zeros).
#[test]
fn a_while_loop_behind_a_zero_derivative_does_not_block_grad() {
    let doubled = |v: &Tensor| {
        while_loop(
            |v: &Tensor| v.lt(&Tensor::scalar(10.0f32)),
            |v: &Tensor| v * 2.0,
            v,
        )
    };
    let f = move |x: &Tensor| x + &doubled(&stop_gradient(x));
    let g = move |x: &Tensor| x * 3.0 + doubled(&x.floor());
    let x = Tensor::scalar(1.5f32);
    assert_eq!(grad(f)(&x).item::<f32>(), 1.0);
    assert_eq!(grad(g)(&x).item::<f32>(), 3.0);
    for backend in BACKENDS {
        let j = jit(move |x: Tensor| (grad(f)(&x), grad(g)(&x))).backend(backend);
        let (a, b) = j.call(x.clone()).unwrap();
        assert_eq!((a.item::<f32>(), b.item::<f32>()), (1.0, 3.0));
    }
}

#[test]
fn scanned_values_of_different_lengths_are_an_error_with_the_line() {
    let e = error_of(|| {
        scan(
            |c: &Tensor, (a, b): &(Tensor, Tensor)| (c + &(a + b).sum(), ()),
            &Tensor::scalar(0.0f32),
            &(Tensor::zeros([3, 2]), Tensor::zeros([4, 2])),
            None,
            false,
        )
    });
    assert!(e.contains("leading axis of 4, but the length is 3"), "{e}");
    assert!(e.contains("control_flow.rs:"), "{e}");
}
