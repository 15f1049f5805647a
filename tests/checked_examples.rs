//! Checked mode on the main example: `TESSERA_CHECK=1` runs the interpreter beside every
//! jitted call of the data-parallel training loop on 8 devices, finds no op outside its bound
//! and no output apart, and the losses are still JAX's. (Its own binary: it sets
//! `TESSERA_CHECK` for the whole process.)
// The example includes the shared `examples/common/mlp.rs`.
#![allow(clippy::duplicate_mod)]

#[allow(dead_code)]
#[path = "../examples/data_parallel_sharding.rs"]
mod data_parallel_sharding;

#[test]
fn data_parallel_sharding_under_checked_mode() {
    // SAFETY: the only test of this binary sets both before the device pool starts and before
    // any other thread reads the environment.
    unsafe {
        std::env::set_var("TESSERA_DEVICES", "8");
        std::env::set_var("TESSERA_CHECK", "1");
    }
    let (losses, _, _) = data_parallel_sharding::train(11, tessera::Backend::Cranelift)
        .unwrap_or_else(|e| panic!("checked mode reported: {e}"));
    let printed: Vec<String> = losses
        .iter()
        .step_by(10)
        .map(|l| format!("{l:.6}"))
        .collect();
    assert_eq!(printed, ["1.070808", "1.050034"]);
}
