//! The seed programs and the distributed API under `mpirun` (issue 15): 2 processes x 4
//! devices and 4 x 2 print the 8-device losses JAX prints, on both backends; the errors reach
//! every process; a killed or failing process ends the run with an error in bounded time.
//!
//! `mpirun` comes with Open MPI, which `scripts/test.sh` installs (`scripts/system-deps.sh`);
//! a machine without it fails here with the install line, never a skip.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// JAX 0.10.2's losses at steps 0, 10, .., 40 on 8 devices (`shared/anchors/jax`).
const SHARDING: [&str; 5] = ["1.070808", "1.050034", "1.034792", "1.023355", "1.014618"];
const PMAP: [&str; 5] = ["1.042890", "1.030457", "1.021400", "1.014672", "1.009591"];

fn mpirun_present() {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "these tests need Open MPI's mpirun; install it with: sudo apt-get install -y \
         libopenmpi-dev openmpi-bin libclang-dev (or run bash scripts/test.sh as root)"
    );
}

/// What one `mpirun` printed: each rank's stdout (from `--output-filename`, whole lines, not
/// interleaved), and mpirun's own output with every rank's stderr.
struct Run {
    ranks: Vec<String>,
    all: String,
    code: i32,
    took: Duration,
}

impl Run {
    /// The lines rank `r` printed to stdout.
    fn lines(&self, r: usize) -> Vec<&str> {
        self.ranks[r].lines().collect()
    }
}

/// `mpirun -np <np>` of `bin args` with `TESSERA_DEVICES=<devices>`, under a deadline.
fn mpirun(np: usize, devices: usize, bin: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    mpirun_present();
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tessera-mpirun-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "10", "180", "mpirun", "--oversubscribe"])
        .arg("--output-filename")
        .arg(&dir)
        .args(["-np", &np.to_string()])
        .args(["-x", "TESSERA_DEVICES", "-x", "TESSERA_COLLECTIVE_TIMEOUT"])
        .arg(bin)
        .args(args)
        .env("TESSERA_DEVICES", devices.to_string())
        .env("TESSERA_COLLECTIVE_TIMEOUT", "20")
        // Root runs in CI; Open MPI refuses root without these.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("RUST_BACKTRACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run timeout/mpirun");
    let took = start.elapsed();
    let read = |r: usize, f: &str| {
        std::fs::read_to_string(dir.join("1").join(format!("rank.{r}")).join(f)).unwrap_or_default()
    };
    let ranks: Vec<String> = (0..np).map(|r| read(r, "stdout")).collect();
    let mut all = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    for (r, out) in ranks.iter().enumerate() {
        all += &format!(
            "\n--- rank {r} stdout:\n{out}--- rank {r} stderr:\n{}",
            read(r, "stderr")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        ranks,
        all,
        code: status.code().unwrap_or(-1),
        took,
    }
}

/// Every rank printed exactly JAX's five losses, in order.
fn assert_losses(run: &Run, np: usize, jax: [&str; 5]) {
    for r in 0..np {
        let losses: Vec<&str> = run
            .lines(r)
            .into_iter()
            .filter_map(|l| {
                l.strip_prefix("Step ")
                    .and_then(|l| l.split("Loss = ").nth(1))
            })
            .collect();
        assert_eq!(
            losses, jax,
            "rank {r}'s losses; the whole output:\n{}",
            run.all
        );
    }
}

#[test]
fn the_sharding_seed_prints_jax_losses_on_2x4_and_4x2() {
    for (np, devices) in [(2, 4), (4, 2)] {
        let run = mpirun(
            np,
            devices,
            env!("CARGO_BIN_EXE_data_parallel_sharding"),
            &[],
            &[],
        );
        assert_eq!(run.code, 0, "{}", run.all);
        assert_losses(&run, np, SHARDING);
        assert!(run.lines(0).contains(&"devices: 8"), "{}", run.all);
    }
}

/// On 2 x 1 each process runs one device of the mesh (a given-up argument's one shard is
/// taken apart as a one-device array's, `jit.rs::give_shards_up`): the steps print what one
/// process of 2 devices prints (2 devices sum the gradients in another order than JAX's 8:
/// 1.050035 at step 10, not 1.050034).
#[test]
fn the_sharding_seed_on_2x1_prints_what_one_process_of_2_devices_prints() {
    let bin = env!("CARGO_BIN_EXE_data_parallel_sharding");
    let one = Command::new(bin)
        .env("TESSERA_DEVICES", "2")
        .output()
        .expect("run data_parallel_sharding");
    assert!(one.status.success());
    let one = String::from_utf8_lossy(&one.stdout).into_owned();
    let steps = |text: &str| -> Vec<String> {
        (text.lines())
            .filter(|l| l.starts_with("Step "))
            .map(str::to_string)
            .collect()
    };
    let run = mpirun(2, 1, bin, &[], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        assert_eq!(steps(&run.lines(r).join("\n")), steps(&one), "rank {r}");
    }
    assert_eq!(steps(&one).len(), 5, "{one}");
}

#[test]
fn the_pmap_seed_prints_jax_losses_on_2x4_and_4x2() {
    for (np, devices) in [(2, 4), (4, 2)] {
        let run = mpirun(
            np,
            devices,
            env!("CARGO_BIN_EXE_data_parallel_pmap"),
            &[],
            &[],
        );
        assert_eq!(run.code, 0, "{}", run.all);
        assert_losses(&run, np, PMAP);
    }
}

#[test]
fn the_interpreter_backend_prints_the_same_losses_across_processes() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["interpreted"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    assert_losses(&run, 2, SHARDING);
}

#[test]
fn the_4x2_mesh_over_two_processes_prints_what_one_process_prints() {
    let bin = env!("CARGO_BIN_EXE_mesh_2d");
    let one = Command::new(bin)
        .env("TESSERA_DEVICES", "8")
        .output()
        .expect("run mesh_2d");
    assert!(one.status.success());
    let one = String::from_utf8_lossy(&one.stdout).into_owned();
    let run = mpirun(2, 4, bin, &[], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        assert_eq!(run.lines(r).join("\n"), one.trim_end(), "rank {r}");
    }
    assert!(one.contains("Step 40: Loss = "), "{one}");
}

#[test]
fn each_process_feeds_its_own_rows_and_gets_the_global_losses() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["local-data"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    assert_losses(&run, 2, SHARDING);
    for r in 0..2 {
        assert!(
            run.lines(r)
                .contains(&"global x: [256, 10] NamedSharding(mesh=Mesh('dp': 8), spec=P('dp'))"),
            "{}",
            run.all
        );
    }
}

#[test]
fn split_values_are_gathered_on_demand_and_a_direct_read_is_an_error() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["gather"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        let lines = run.lines(r);
        for want in [
            "allgather equal: true",
            "allgather of a jit output equal: true",
            "local shards: 4",
        ] {
            assert!(lines.contains(&want), "rank {r}: {want}:\n{}", run.all);
        }
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("save: ERROR") && l.contains("not fully addressable")),
            "rank {r}: checkpoint::save of a split value:\n{}",
            run.all
        );
        assert!(
            lines.iter().any(
                |l| l.starts_with("direct read: ERROR to_vec: a f32[256,10]")
                    && l.contains("not fully addressable")
                    && l.contains("process_allgather")
            ),
            "{}",
            run.all
        );
    }
}

#[test]
fn a_program_that_differs_by_rank_is_an_error_on_every_rank() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["diverge"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        let line = run
            .lines(r)
            .into_iter()
            .find(|l| l.starts_with("diverge:"))
            .unwrap_or_else(|| panic!("rank {r} printed no result:\n{}", run.all));
        assert!(
            line.contains("the program differs between processes 0 and 1")
                && line.contains("process 0 has `%1 = reduce_sum")
                && line.contains("process 1 has `%1 = constant 3.0"),
            "rank {r}: {line}"
        );
    }
}

#[test]
fn bad_input_is_an_error_on_every_rank() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["bad"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        let lines = run.lines(r);
        let has = |prefix: &str, needle: &str| {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with(prefix) && l.contains(needle)),
                "rank {r}: {prefix} {needle}:\n{}",
                run.all
            )
        };
        has(&format!("process {r} of 2"), "devices 8 (4 local)");
        has("mesh: ERROR", "needs 9 devices, there are 8");
        has("initialize: ERROR", "called twice");
        has("local data: ERROR", "3 does not divide into 4");
        has(
            "uneven: ERROR",
            "every process must pass the same local shape",
        );
        has(
            "shapes: ERROR",
            "every process must pass the same local shape",
        );
    }
}

/// Open MPI's `mpirun` ends the job when a rank dies on a signal (it kills the others and
/// exits non-zero): no rank is left waiting in a collective.
#[test]
fn a_killed_process_ends_the_run_with_an_error() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["kill"], &[]);
    assert_ne!(run.code, 0, "{}", run.all);
    assert_ne!(
        run.code, 124,
        "the run hung until the deadline:\n{}",
        run.all
    );
    assert!(run.all.contains("exited on signal"), "{}", run.all);
    assert!(run.took < Duration::from_secs(60), "{:?}", run.took);
}

/// A rank that returns an error (and exits, finalizing MPI) leaves the others at a collective
/// that cannot complete: they fail within the collective timeout (2 s here), not hang.
#[test]
fn a_failing_process_leaves_the_others_an_error_within_the_timeout() {
    let run = mpirun(
        2,
        4,
        env!("CARGO_BIN_EXE_probe"),
        &["fail"],
        &[("TESSERA_COLLECTIVE_TIMEOUT", "2")],
    );
    assert_ne!(run.code, 0, "{}", run.all);
    assert_ne!(
        run.code, 124,
        "the run hung until the deadline:\n{}",
        run.all
    );
    assert!(run.took < Duration::from_secs(60), "{:?}", run.took);
    assert!(run.all.contains("process 1 gives up"), "{}", run.all);
}

/// A mesh of half the devices leaves processes out: its exchanges are point-to-point between
/// the processes that hold it, which print the losses (JAX's on any number of devices); the
/// others hold no shard of the result and get an error reading it, and from the pmap.
#[test]
fn a_mesh_over_some_processes_runs_on_them_and_the_others_get_errors() {
    let bin = env!("CARGO_BIN_EXE_probe");
    let alone = Command::new(bin)
        .arg("subset")
        .env("TESSERA_DEVICES", "8")
        .output()
        .expect("run the probe");
    let alone = String::from_utf8_lossy(&alone.stdout).into_owned();
    let steps = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("Step "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(steps(&alone).len(), 5, "{alone}");
    assert!(alone.contains("Step 0: Loss = 1.070808"), "{alone}");
    let run = mpirun(4, 2, bin, &["subset"], &[]);
    assert_eq!(run.code, 0, "{}", run.all);
    for r in 0..2 {
        assert_eq!(
            steps(&run.ranks[r]),
            steps(&alone),
            "rank {r}:\n{}",
            run.all
        );
    }
    for r in 0..2 {
        assert!(run.lines(r).contains(&"pmap: 12"), "rank {r}:\n{}", run.all);
        assert!(
            run.lines(r).contains(&"allgather: equal true"),
            "rank {r}:\n{}",
            run.all
        );
    }
    for r in 2..4 {
        let lines = run.lines(r);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("subset: ERROR to_vec:") && l.contains("holds 0")),
            "rank {r}:\n{}",
            run.all
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("pmap: ERROR") && l.contains("holds none of the 4 devices")),
            "rank {r}:\n{}",
            run.all
        );
        assert!(
            lines.iter().any(|l| l.starts_with("allgather: ERROR")
                && l.contains("holds none of the value's devices")),
            "rank {r}:\n{}",
            run.all
        );
    }
}

/// Process 1 makes an exchange (a `process_allgather`) that process 0 does not: the next
/// exchange's headers differ, and both processes get the error instead of each other's bytes.
#[test]
fn exchanges_in_different_orders_are_an_error_on_every_process() {
    let run = mpirun(2, 4, env!("CARGO_BIN_EXE_probe"), &["order"], &[]);
    for r in 0..2 {
        let line = run
            .lines(r)
            .into_iter()
            .find(|l| l.starts_with("order:"))
            .unwrap_or_else(|| panic!("rank {r} printed no result:\n{}", run.all));
        assert!(
            line.starts_with("order: ERROR")
                && line.contains("at exchange")
                && line.contains("different orders"),
            "rank {r}: {line}"
        );
    }
}
