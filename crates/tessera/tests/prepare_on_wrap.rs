//! Wrapping a program starts the compiler's one-time work (`tessera_codegen::prepare`: the
//! rayon pool, Cranelift's ISAs, the simplifier's rules) before its first call, so the work
//! overlaps what the caller does in between (the seed step's first call 2.11 -> 1.83 ms,
//! median of 30 alternating processes on a Xeon VM, docs/PERFORMANCE.md). A test binary of its
//! own: `prepare` runs once per process.

use tessera::{Tensor, jit};

#[test]
fn jit_starts_the_compilers_work_before_the_first_call() {
    assert!(!tessera_codegen::prepared(), "nothing has prepared yet");
    let f = jit(|x: Tensor| x.tanh());
    assert!(
        tessera_codegen::prepared(),
        "jit() started the compiler's threads"
    );
    let y = f
        .call(Tensor::from_vec(vec![0.5f32], [1]))
        .unwrap()
        .to_vec::<f32>();
    assert!((y[0] - 0.5f32.tanh()).abs() < 1e-6, "{y:?}");
}
