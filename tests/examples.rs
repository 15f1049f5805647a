//! The examples print what they promise: each example file is compiled here as a module and its
//! entry point checked against the reference numbers.

#[allow(dead_code)]
#[path = "../examples/train_single.rs"]
mod train_single;

/// JAX 0.10.2 prints these for the seed program (`shared/anchors/jax/seed_outputs.txt`).
const JAX_SEED_LOSSES: [&str; 5] = ["1.070808", "1.050034", "1.034792", "1.023355", "1.014618"];

#[test]
fn train_single_prints_jax_losses_on_both_backends() {
    for backend in [tessera::Backend::Cranelift, tessera::Backend::Interpreter] {
        let losses = train_single::train(41, backend).unwrap();
        let printed: Vec<String> = losses
            .iter()
            .step_by(10)
            .map(|l| format!("{l:.6}"))
            .collect();
        assert_eq!(printed, JAX_SEED_LOSSES, "{backend:?}");
    }
}
