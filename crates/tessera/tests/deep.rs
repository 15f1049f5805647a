//! Deep graphs (issue 10, item 7): a 100,000-op chain traces, simplifies, differentiates,
//! fuses, compiles, dumps, prints, parses and runs on a thread with Rust's default 2 MiB stack,
//! and every result equals the interpreter's and an f64 reference.
//!
//! The tests take turns (`SERIAL`): each is heavy. `TESSERA_DEEP_OPS` overrides the chain
//! length, to measure.

use std::sync::Mutex;
use std::time::Instant;

use tessera::prelude::*;

/// Rust's default stack for spawned threads.
const STACK: usize = 2 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// Ops in the deep chains: the 100,000 unless `TESSERA_DEEP_OPS` says otherwise.
fn ops() -> usize {
    std::env::var("TESSERA_DEEP_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

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

fn xs() -> Vec<f32> {
    vec![-2.0, -0.5, 0.0, 0.25, 1.0, 3.0, -7.0, 0.1, 0.7]
}

fn input() -> Tensor {
    Tensor::from_vec(xs(), [9])
}

/// `steps` times `y = tanh(y) + 1`: `2 * steps` ops, each using the one before.
fn chain(x: &Tensor, steps: usize) -> Tensor {
    let mut y = x.clone();
    for _ in 0..steps {
        y = y.tanh() + 1.0;
    }
    y
}

/// `chain` in f64. `tanh(y) + 1` has slope at most 1, so rounding errors do not grow along
/// the chain (it settles at its fixed point, about 1.96).
fn chain_f64(x: f32, steps: usize) -> f64 {
    (0..steps).fold(x as f64, |y, _| y.tanh() + 1.0)
}

/// The sum of every value of `chain`: `3 * steps + 1` ops. Unlike `chain`'s end value, whose
/// derivative vanishes (a product of `steps` factors `1 - tanh^2 y` near 0.08), its gradient
/// is well away from 0, and the backward pass is a chain as long as the forward one.
fn running_sum(x: &Tensor, steps: usize) -> Tensor {
    let mut y = x.clone();
    let mut acc = x.zeros_like();
    for _ in 0..steps {
        y = y.tanh() + 1.0;
        acc += &y;
    }
    acc.sum()
}

/// Each element's `running_sum` term and its derivative, in f64 (forward mode).
fn running_sum_f64(x: f32, steps: usize) -> (f64, f64) {
    let (mut y, mut dy, mut acc, mut dacc) = (x as f64, 1.0, 0.0, 0.0);
    for _ in 0..steps {
        let t = y.tanh();
        (y, dy) = (t + 1.0, dy * (1.0 - t * t));
        (acc, dacc) = (acc + y, dacc + dy);
    }
    (acc, dacc)
}

/// The error bound of f32 recursive summation of `n` positive terms, relative to the sum.
fn summation_bound(n: usize) -> f64 {
    n as f64 * f32::EPSILON as f64 / 2.0
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: {g} vs {w} (all: {got:?} vs {want:?})"
        );
    }
}

fn as_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn chain_of_100k_ops_under_jit_matches_the_interpreter() {
    on_small_stack(|| {
        let (n, steps) = (ops(), ops() / 2);
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
        assert_close("native vs interpreter", &a, &as_f64(&b), 1e-5);
        let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, steps)).collect();
        assert_close("interpreter vs f64", &b, &want, 1e-5);
        assert_close("native vs f64", &a, &want, 1e-5);
    });
}

#[test]
fn grad_of_a_100k_op_chain_under_jit_matches_the_interpreter() {
    on_small_stack(|| {
        let (n, steps) = (ops(), ops() / 3);
        let f = move |x: Tensor| value_and_grad(move |x: &Tensor| running_sum(x, steps))(&x);
        let native = jit(f);
        let interp = jit(f).backend(Backend::Interpreter);
        let t = Instant::now();
        let (va, ga) = native.call(input()).unwrap();
        eprintln!(
            "value_and_grad of a {n}-op chain, native: {:?}",
            t.elapsed()
        );
        let t = Instant::now();
        let (vb, gb) = interp.call(input()).unwrap();
        eprintln!(
            "value_and_grad of a {n}-op chain, interpreter: {:?}",
            t.elapsed()
        );
        let (value, grads): (Vec<f64>, Vec<f64>) =
            xs().iter().map(|&x| running_sum_f64(x, steps)).unzip();
        let value: f64 = value.iter().sum();
        let bound = summation_bound(steps + xs().len());
        assert_close("value, native", &[va.item::<f32>()], &[value], bound);
        assert_close("value, interpreter", &[vb.item::<f32>()], &[value], bound);
        assert_close(
            "grad, native vs interpreter",
            &ga.to_vec(),
            &as_f64(&gb.to_vec()),
            1e-5,
        );
        assert_close("grad, interpreter vs f64", &gb.to_vec(), &grads, 1e-5);
        assert_close("grad, native vs f64", &ga.to_vec(), &grads, 1e-5);
    });
}

#[test]
fn eager_chain_and_grad_of_100k_ops() {
    on_small_stack(|| {
        let n = ops();
        let t = Instant::now();
        let y = chain(&input(), n / 2).to_vec::<f32>();
        let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, n / 2)).collect();
        assert_close("eager chain", &y, &want, 1e-5);
        let steps = n / 3;
        let (v, g) = value_and_grad(move |x: &Tensor| running_sum(x, steps))(&input());
        eprintln!("eager {n}-op chain and value_and_grad: {:?}", t.elapsed());
        let (value, grads): (Vec<f64>, Vec<f64>) =
            xs().iter().map(|&x| running_sum_f64(x, steps)).unzip();
        let bound = summation_bound(steps + xs().len());
        assert_close(
            "eager value",
            &[v.item::<f32>()],
            &[value.iter().sum()],
            bound,
        );
        assert_close("eager grad", &g.to_vec(), &grads, 1e-5);
    });
}

/// The text format of a deep program: print, parse back, print again (the same text), and
/// the parsed program evaluates to the same values.
#[test]
fn a_100k_op_program_prints_parses_and_evaluates() {
    on_small_stack(|| {
        let steps = ops() / 2;
        let lowered = make_ir(move |x: Tensor| chain(&x, steps))(&input()).unwrap();
        let text = lowered.ir();
        let parsed = tessera::ir::parse(&text).unwrap();
        assert_eq!(tessera::ir::print(&parsed), text);
        assert!(parsed.structurally_eq(lowered.graph()));
        let out = eval_graph(&parsed, &[input()]).unwrap();
        let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, steps)).collect();
        assert_close("parsed program", &out[0].to_vec(), &want, 1e-5);
    });
}

/// The name of the dump test's child process run (see below).
const DUMP_CHILD: &str = "dump_child_writes_the_deep_program";

/// `TESSERA_DUMP` on a deep program: the trace and the simplified program are written and
/// parse back. `TESSERA_DUMP` is read from the environment of the whole process, so this runs
/// the test binary again with the variable set, for the one ignored test below.
#[test]
fn tessera_dump_of_a_100k_op_program() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("tessera-deep-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([DUMP_CHILD, "--exact", "--ignored", "--nocapture"])
        .env("TESSERA_DUMP", &dir)
        .env("TESSERA_DEEP_OPS", ops().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the dump run failed: {status}");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["deep-1.00-trace.ir", "deep-1.01-simplified.ir"]);
    let steps = ops() / 2;
    let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, steps)).collect();
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let g = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || {
                let g = tessera::ir::parse(&text).unwrap();
                let out = eval_graph(&g, &[input()]).unwrap()[0].to_vec::<f32>();
                (
                    g.node_count(),
                    out,
                    text.lines().next().unwrap_or("").to_string(),
                )
            })
            .unwrap()
            .join()
            .unwrap();
        eprintln!("{name}: {} nodes; {}", g.0, g.2);
        assert!(g.0 >= ops(), "{name}: {} nodes", g.0);
        assert_close(name, &g.1, &want, 1e-5);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "run by tessera_dump_of_a_100k_op_program, in a process with TESSERA_DUMP set"]
fn dump_child_writes_the_deep_program() {
    assert!(std::env::var_os("TESSERA_DUMP").is_some());
    on_small_stack(|| {
        let steps = ops() / 2;
        let f = jit(move |x: Tensor| chain(&x, steps))
            .named("deep")
            .backend(Backend::Interpreter);
        let y = f.call(input()).unwrap().to_vec::<f32>();
        let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, steps)).collect();
        assert_close("dumped program", &y, &want, 1e-5);
    });
}

/// Inputs placed on a mesh: propagation, partitioning and the all-reduce combiner walk the
/// 100k-op program, and the per-device program runs (on the interpreter: the native backend
/// compiles this program in the first test).
#[test]
fn sharded_chain_of_100k_ops() {
    on_small_stack(|| {
        let steps = ops() / 2;
        let mesh = Mesh::new([1], ["dp"]);
        let x = device_put(input(), NamedSharding::new(&mesh, P!["dp"]));
        let f = jit(move |x: Tensor| chain(&x, steps)).backend(Backend::Interpreter);
        let t = Instant::now();
        let y = f.call(x).unwrap().to_vec::<f32>();
        eprintln!("sharded {}-op chain, interpreter: {:?}", ops(), t.elapsed());
        let want: Vec<f64> = xs().iter().map(|&x| chain_f64(x, steps)).collect();
        assert_close("sharded chain", &y, &want, 1e-5);
    });
}

/// One step of `mixed`: views, a select (relu), a transcendental, slices and a concatenate
/// (whose operands fusion materializes), a reshape pair, and the running sum: 17 ops.
fn mixed_step(y: &Tensor, acc: &Tensor) -> (Tensor, Tensor) {
    let a = y.t();
    let b = a.relu() * 0.9 + a.sigmoid() * 0.1;
    let c = b.t();
    let d = Tensor::concatenate(&[&c.slice(&[0, 0], &[3, 1]), &c.slice(&[0, 1], &[3, 4])], 1);
    let y = d.reshape([12]).reshape([3, 4]);
    let acc = acc + &y;
    (y, acc)
}

fn mixed(x: &Tensor, steps: usize) -> Tensor {
    let (mut y, mut acc) = (x.clone(), x.zeros_like());
    for _ in 0..steps {
        (y, acc) = mixed_step(&y, &acc);
    }
    acc.sum()
}

/// A deep chain of many kinds of ops, differentiated: native against the interpreter.
#[test]
fn grad_of_a_deep_chain_of_mixed_ops() {
    on_small_stack(|| {
        let steps = ops() / 40;
        let x = Tensor::from_vec(
            (0..12)
                .map(|i| (i as f32 - 5.5) * 0.4)
                .collect::<Vec<f32>>(),
            [3, 4],
        );
        let f = move |x: Tensor| value_and_grad(move |x: &Tensor| mixed(x, steps))(&x);
        let t = Instant::now();
        let (va, ga) = jit(f).call(x.clone()).unwrap();
        eprintln!(
            "value_and_grad of {} mixed steps, native: {:?}",
            steps,
            t.elapsed()
        );
        let (vb, gb) = jit(f).backend(Backend::Interpreter).call(x).unwrap();
        assert_close(
            "value",
            &[va.item::<f32>()],
            &[vb.item::<f32>() as f64],
            1e-4,
        );
        assert_close("grad", &ga.to_vec(), &as_f64(&gb.to_vec()), 1e-4);
        assert!(gb.to_vec::<f32>().iter().all(|g| g.abs() > 1e-3), "{gb:?}");
    });
}
