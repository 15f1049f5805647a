//! The transport under faults: a device that arrives late, one that panics, a timeout at
//! every kind of wait. Scenarios that could crash the process (a use-after-free) run in a
//! child process, so a crash is reported as this test failing instead of taking the harness
//! down with it.

use std::process::Command;
use std::time::Duration;

use tessera_ir::{Data, Literal, parse};
use tessera_runtime::{Rendezvous, SharedCollectives};

const CHILD: &str = "TESSERA_FAULTS_CHILD";

/// Runs test `name` of this binary again in a child process with `CHILD` set; returns its
/// exit status and output.
fn in_child(name: &str) -> (std::process::ExitStatus, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn all_reduce_f64(len: usize) -> tessera_codegen::Executable {
    let g = parse(&format!(
        "mesh @mesh = <\"dp\"=2>\n\
         func @f(%0: f64[{len}]) {{\n  \
           %1 = all_reduce %0 sum axes=[\"dp\"] : f64[{len}]\n  \
           return %1\n}}\n"
    ))
    .unwrap();
    tessera_codegen::compile(&g).unwrap().single_threaded()
}

/// Issue 10, item 1: two forks of a compiled `all_reduce` on `f64[1<<20]` (the in-place path),
/// a 100 ms timeout, device 1 arriving 400 ms late. Device 0 gives up and frees its buffers;
/// device 1 must then fail too, without reading them (before the fix it found the slot
/// "complete" with device 0's stale addresses and crashed with SIGSEGV).
fn late_member_scenario() {
    let len = 1 << 20;
    let exe = all_reduce_f64(len);
    let forks = [exe.fork(), exe.fork()];
    drop(exe);
    let r = Rendezvous::with_timeout(Duration::from_millis(100));
    let ids = [0, 1];
    let results: Vec<Result<Vec<Literal>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = forks
            .into_iter()
            .enumerate()
            .map(|(p, f)| {
                let (r, ids) = (&r, &ids);
                s.spawn(move || {
                    if p == 1 {
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    let x = Literal::new([len], Data::F64(vec![p as f64 + 1.0; len])).unwrap();
                    let c = SharedCollectives::new(r, 0, p, ids);
                    let out = f.run(&[&x], &c).map_err(|e| e.to_string());
                    // Device 0's operand and result are freed here, long before device 1
                    // arrives.
                    drop(x);
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e0 = results[0].as_ref().unwrap_err();
    assert!(
        e0.contains("all_reduce") && e0.contains("[1]") && e0.contains("within 100 ms"),
        "{e0}"
    );
    let e1 = results[1].as_ref().unwrap_err();
    assert!(
        e1.contains("all_reduce") && e1.contains("device 0 gave up"),
        "{e1}"
    );
    println!("late member: both failed cleanly");
}

#[test]
fn a_late_member_never_reads_the_buffers_of_one_that_gave_up() {
    if std::env::var_os(CHILD).is_some() {
        late_member_scenario();
        return;
    }
    let (status, out) = in_child("a_late_member_never_reads_the_buffers_of_one_that_gave_up");
    assert!(
        status.success() && out.contains("late member: both failed cleanly"),
        "the scenario failed or crashed ({status}):\n{out}"
    );
}
