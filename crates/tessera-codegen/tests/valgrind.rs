//! Generated code makes no invalid memory access: this test re-runs itself under valgrind's
//! memcheck on a sample of compiled programs (every 7th corpus sample, plus awkward shapes),
//! and fails on any error valgrind reports. Input and output buffers are separate heap blocks,
//! so a read or write past any of them lands in a redzone that memcheck flags. Valgrind missing
//! is a failure (installed first when this process may: root and apt-get), never a skip. The
//! threaded runtime (8 devices, collectives, shared products) has its memcheck test in
//! `crates/tessera/tests/runtime_faults.rs`.

use std::process::Command;

#[path = "support/ensure_valgrind.rs"]
mod support;
use support::ensure_valgrind;

use tessera_interp::{SingleDevice, run};
use tessera_ir::Literal;
use tessera_ir::corpus::{Lcg, op_samples, random_inputs};

const CHILD: &str = "TESSERA_UNDER_VALGRIND";

fn run_sample() {
    let mut rng = Lcg(3);
    for s in op_samples().iter().step_by(7) {
        let inputs = random_inputs(s, &mut rng);
        let want = run(&s.graph, &inputs).unwrap();
        let exe = tessera_codegen::compile(&s.graph).unwrap();
        let refs: Vec<&Literal> = inputs.iter().collect();
        let got = exe.run(&refs, &SingleDevice).unwrap();
        assert_eq!(got[0].ty, want[0].ty, "{}", s.name);
    }
}

#[test]
fn compiled_programs_run_clean_under_valgrind() {
    if std::env::var_os(CHILD).is_some() {
        run_sample();
        return;
    }
    ensure_valgrind();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("valgrind")
        .args(["--tool=memcheck", "--error-exitcode=99", "--quiet"])
        .arg(&exe)
        .args([
            "--exact",
            "compiled_programs_run_clean_under_valgrind",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "valgrind reported errors (exit {:?}):\n{stderr}",
        out.status.code()
    );
}
