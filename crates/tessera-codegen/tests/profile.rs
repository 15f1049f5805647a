//! `Executable::profiled` (what `TESSERA_PROFILE=1` turns on): every step's time over the runs,
//! reported against the schedule's own description.

use tessera_ir::{Literal, TensorType, parse};
use tessera_transport::SingleDevice;

#[test]
fn a_profile_counts_runs_and_names_every_step() {
    let g = parse(
        "func @f(%0: f32[64,64], %1: f32[64,64]) {
  %2 = dot_general %0, %1 contracting=[1]x[0] : f32[64,64]
  %3 = tanh %2 : f32[64,64]
  return %3
}",
    )
    .unwrap();
    let exe = tessera_codegen::compile(&g).unwrap();
    assert!(exe.profile_report().is_none(), "not profiled");
    let exe = exe.profiled();
    assert!(exe.profile_report().is_none(), "profiled, not yet run");
    let x = Literal::splat(&TensorType::new(tessera_ir::DType::F32, vec![64, 64]), 0.5);
    for _ in 0..3 {
        exe.run(&[&x, &x], &SingleDevice).unwrap();
    }
    let report = exe.profile_report().unwrap();
    assert!(report.starts_with("TESSERA_PROFILE: 3 runs"), "{report}");
    let steps: Vec<&str> = report.lines().skip(2).collect();
    assert_eq!(steps.len(), exe.describe().lines().count() - 1, "{report}");
    assert!(steps[0].contains("gemm f32 m=64 n=64 k=64"), "{report}");
    assert!(steps[1].contains("kernel tanh"), "{report}");
    let us: f64 = steps[0].split_whitespace().next().unwrap().parse().unwrap();
    assert!(us > 0.0, "{report}");
}
