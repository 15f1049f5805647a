//! Golden IR of the examples' training steps after every pipeline stage: for each program,
//! `tests/golden/<program>/<NN>-<stage>.ir` holds `lower(..)`'s stage `NN` (the last one the
//! program each device runs) and `<NN>-schedule.txt` the native schedule code generation makes
//! from it. Any difference fails; `UPDATE_EXPECT=1 cargo test --test golden` re-blesses the
//! files from the actual output (and removes stale ones).
//!
//! The programs and shapes are the examples': `train_single` (one device), `data_parallel_pmap`
//! (pmap over 8 devices), `data_parallel_sharding` (jit over an 8-device `dp` mesh) and
//! `mesh_2d` (jit over a 4x2 `dp` x `mp` mesh). This binary sets `TESSERA_DEVICES=8` first.

use std::fs;
use std::path::{Path, PathBuf};

use tessera::prelude::*;

#[path = "../examples/common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, loss, seed_data, sgd_step};

fn eight_devices() {
    // SAFETY: set before the device pool starts (every test calls this first) and before any
    // other thread reads the environment; the value is the same for every test.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(tessera::device_count(), 8);
}

/// `data_parallel_pmap`'s per-device step: local gradients averaged with `pmean`.
fn pmap_step((p, x, y): (Mlp, Tensor, Tensor)) -> (Mlp, Tensor) {
    let (l, g) = value_and_grad(|p: &Mlp| loss(p, &x, &y))(&p);
    let g = tree::map(&g, |g| pmean(g, "i"));
    (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
}

/// Every file of a program's golden directory: name and text.
fn golden_files(lowered: &Lowered) -> Vec<(String, String)> {
    let stages = lowered.stages();
    let mut files: Vec<(String, String)> = stages
        .iter()
        .enumerate()
        .map(|(i, (stage, g))| (format!("{i:02}-{stage}.ir"), tessera::ir::print(g)))
        .collect();
    let (_, last) = stages.last().expect("at least the trace");
    let schedule = tessera_codegen::compile(last)
        .expect("the program compiles")
        .describe();
    files.push((format!("{:02}-schedule.txt", stages.len()), schedule));
    files
}

/// Compares (or with `UPDATE_EXPECT` rewrites) `tests/golden/<program>/`.
fn check_golden(program: &str, lowered: &Lowered) {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(program);
    let files = golden_files(lowered);
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut existing: Vec<String> = fs::read_dir(&dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    existing.sort();
    let mut wanted: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    wanted.sort();
    if update {
        fs::create_dir_all(&dir).unwrap();
        for stale in existing.iter().filter(|n| !wanted.contains(n)) {
            fs::remove_file(dir.join(stale)).unwrap();
        }
        for (name, text) in &files {
            fs::write(dir.join(name), text).unwrap();
        }
        return;
    }
    assert_eq!(
        existing, wanted,
        "{program}: the golden files are not the stages (re-bless with UPDATE_EXPECT=1)"
    );
    let mut failures = Vec::new();
    for (name, text) in &files {
        let want = fs::read_to_string(dir.join(name)).unwrap();
        if &want != text {
            let line = want
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(want.lines().count().min(text.lines().count()));
            failures.push(format!(
                "{program}/{name}: differs from line {}:\n--- golden\n{}\n--- actual\n{}",
                line + 1,
                want.lines()
                    .skip(line)
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n"),
                text.lines()
                    .skip(line)
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n"),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden file(s) differ (re-bless with UPDATE_EXPECT=1 cargo test --test golden):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The stage names, in order.
fn stage_names(lowered: &Lowered) -> Vec<&'static str> {
    lowered.stages().iter().map(|(s, _)| *s).collect()
}

#[test]
fn train_single_step() {
    eight_devices();
    let params = init(Key::new(0), 10, 32, 1);
    let (x, y) = seed_data(256);
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("train_step");
    let lowered = step.lower(&(params, x, y)).unwrap();
    assert_eq!(stage_names(&lowered), ["trace", "simplified"]);
    check_golden("train_single", &lowered);
}

#[test]
fn data_parallel_pmap_step() {
    eight_devices();
    let n = 8;
    let params = tree::map(&init(Key::new(0), 10, 32, 1), |a| {
        let mut dims = vec![n];
        dims.extend_from_slice(a.shape());
        let lead: Vec<usize> = (1..=a.rank()).collect();
        a.broadcast_in_dim(dims, &lead)
    });
    let x = random::normal(&Key::new(1), [n * 64, 10]).reshape([n, 64, 10]);
    let y = random::normal(&Key::new(2), [n * 64, 1]).reshape([n, 64, 1]);
    let step = pmap("i", pmap_step).named("train_step_pmap");
    let lowered = step.lower(&(params, x, y)).unwrap();
    assert_eq!(stage_names(&lowered), ["trace", "simplified", "combined"]);
    check_golden("data_parallel_pmap", &lowered);
}

#[test]
fn data_parallel_sharding_step() {
    eight_devices();
    let mesh = Mesh::new([8], ["dp"]);
    let params = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = (device_put(x, &data), device_put(y, &data));
    let step =
        jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("train_step_sharded");
    let lowered = step.lower(&(params, x, y)).unwrap();
    assert_eq!(
        stage_names(&lowered),
        [
            "trace",
            "simplified",
            "propagated",
            "sharded",
            "collectives",
            "partitioned",
            "combined"
        ]
    );
    check_golden("data_parallel_sharding", &lowered);
}

#[test]
fn mesh_2d_step() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let p = init(Key::new(0), 10, 32, 1);
    let put = |t: Tensor, spec: PartitionSpec| device_put(t, NamedSharding::new(&mesh, spec));
    let params = Mlp {
        w1: put(p.w1, P![None, "mp"]),
        b1: put(p.b1, P!["mp"]),
        w2: put(p.w2, P!["mp", None]),
        b2: put(p.b2, P![]),
    };
    let (x, y) = seed_data(256);
    let (x, y) = (put(x, P!["dp", None]), put(y, P!["dp", None]));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("train_step_2d");
    let lowered = step.lower(&(params, x, y)).unwrap();
    assert_eq!(
        stage_names(&lowered),
        [
            "trace",
            "simplified",
            "propagated",
            "sharded",
            "collectives",
            "partitioned",
            "combined"
        ]
    );
    check_golden("mesh_2d", &lowered);
}
