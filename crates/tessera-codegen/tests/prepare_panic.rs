//! `prepare`'s extra task (`tessera`'s: the simplifier's rules) may panic without taking the
//! process down: a panicking rayon task aborts it, so the task catches its own panic, and the
//! rest of the process (the pool included) carries on. A test binary of its own: `prepare`
//! runs once per process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_ir::{Literal, TensorType, parse};
use tessera_transport::SingleDevice;

static RAN: AtomicBool = AtomicBool::new(false);

fn panics() {
    RAN.store(true, Ordering::SeqCst);
    panic!("prepare's extra task panics on purpose (tests/prepare_panic.rs)");
}

#[test]
fn a_panic_in_prepares_task_stays_in_it() {
    // The pool starts with the caller's count of cores: one more than the machine has, so
    // rayon's own default cannot pass for it.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) + 1;
    tessera_codegen::prepare(panics, true, threads);
    if ["RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS"]
        .iter()
        .all(|v| std::env::var_os(v).is_none())
    {
        assert_eq!(rayon::current_num_threads(), threads);
    }
    let start = Instant::now();
    while !RAN.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "prepare's task did not run"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Without the catch, rayon aborts the process as the panic leaves the task, well inside
    // this wait, and the test binary fails.
    std::thread::sleep(Duration::from_millis(300));
    let g = parse(
        "func @f(%0: f32[4]) {
  %1 = add %0, %0 : f32[4]
  return %1
}",
    )
    .unwrap();
    let exe = tessera_codegen::compile(&g).unwrap();
    let x = Literal::splat(&TensorType::new(tessera_ir::DType::F32, vec![4]), 1.5);
    let out = exe.run(&[&x], &SingleDevice).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![3.0; 4]);
}
