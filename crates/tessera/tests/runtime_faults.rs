//! The threaded runtime from the user's side: bad `TESSERA_DEVICES` / `TESSERA_COLLECTIVE_TIMEOUT`
//! are errors that say what was expected (each case in a child process: both are read once
//! per process), and an 8-device sharded training step that takes every threaded path (the
//! in-place all-reduce, both shared products, the small copying all-reduces) runs clean
//! under valgrind's memcheck.

use std::process::Command;

#[path = "../../tessera-codegen/tests/support/ensure_valgrind.rs"]
mod support;
use support::ensure_valgrind;

use tessera::prelude::*;

const CASE: &str = "TESSERA_RUNTIME_CASE";

/// Runs test `name` of this binary again with `env` set (and `CASE`); returns whether it
/// passed, and its output.
fn child(name: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CASE, "1")
        .env_remove("TESSERA_DEVICES")
        .env_remove("TESSERA_COLLECTIVE_TIMEOUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let p = std::panic::catch_unwind(f).unwrap_err();
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// In a child with a bad `TESSERA_DEVICES`: the API calls that need the devices return the
/// error naming this file (`Mesh::try_new`, `pmap`; `Mesh::new` and `device_count` panic
/// with it).
#[test]
fn bad_device_count_case() {
    let Ok(bad) = std::env::var("TESSERA_DEVICES") else {
        return;
    };
    if std::env::var_os(CASE).is_none() {
        return;
    }
    let err = Mesh::try_new(&[1], &["dp"]).err().unwrap().to_string();
    let want = format!("TESSERA_DEVICES={bad:?}: expected a positive integer");
    assert!(
        err.contains(&want) && err.contains("runtime_faults.rs"),
        "{err}"
    );
    let p = panic_message(|| {
        Mesh::new([1], ["dp"]);
    });
    assert!(p.contains(&want) && p.contains("runtime_faults.rs"), "{p}");
    let p = panic_message(|| {
        device_count();
    });
    assert!(p.contains(&want) && p.contains("runtime_faults.rs"), "{p}");
    let f = pmap("i", |x: Tensor| psum(&x, "i"));
    let err = f.call(Tensor::zeros([1, 4])).err().unwrap().to_string();
    assert!(
        err.contains(&want) && err.contains("runtime_faults.rs"),
        "{err}"
    );
    println!("case passed");
}

/// In a child with `TESSERA_COLLECTIVE_TIMEOUT=abc`: the first sharded call over every device
/// returns the error, on the device threads (2 devices) and on the one-thread route (64, more
/// than any test machine's cores).
#[test]
fn bad_timeout_case() {
    if std::env::var_os(CASE).is_none() || std::env::var_os("TESSERA_COLLECTIVE_TIMEOUT").is_none()
    {
        return;
    }
    let n = device_count();
    let mesh = Mesh::new([n], ["dp"]);
    let x = device_put(
        Tensor::from_vec((0..4 * n).map(|i| i as f32).collect::<Vec<f32>>(), [4 * n]),
        NamedSharding::new(&mesh, P!["dp"]),
    );
    let f = jit(|x: Tensor| x.sum());
    let err = f.call(x).err().unwrap().to_string();
    assert!(
        err.contains("TESSERA_COLLECTIVE_TIMEOUT=\"abc\": expected a positive number of seconds"),
        "{err}"
    );
    println!("case passed");
}

#[test]
fn bad_configuration_is_an_error_saying_what_was_expected() {
    if std::env::var_os(CASE).is_some() {
        return;
    }
    for bad in ["abc", "0", "-1", "1.5"] {
        let (ok, out) = child("bad_device_count_case", &[("TESSERA_DEVICES", bad)]);
        assert!(
            ok && out.contains("case passed"),
            "TESSERA_DEVICES={bad:?}:\n{out}"
        );
    }
    for devices in ["2", "64"] {
        let (ok, out) = child(
            "bad_timeout_case",
            &[
                ("TESSERA_DEVICES", devices),
                ("TESSERA_COLLECTIVE_TIMEOUT", "abc"),
            ],
        );
        assert!(
            ok && out.contains("case passed"),
            "{devices} devices:
{out}"
        );
    }
}

/// An empty `TESSERA_DEVICES` counts as unset: the number of cores.
#[test]
fn empty_device_count_case() {
    if std::env::var_os(CASE).is_none() || std::env::var("TESSERA_DEVICES").as_deref() != Ok("") {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(device_count(), cores);
    assert!(Mesh::try_new(&[cores], &["dp"]).is_ok());
    println!("case passed");
}

#[test]
fn an_empty_device_count_means_the_cores() {
    if std::env::var_os(CASE).is_some() {
        return;
    }
    let (ok, out) = child("empty_device_count_case", &[("TESSERA_DEVICES", "")]);
    assert!(ok && out.contains("case passed"), "{out}");
}

// ---- The threaded runtime under memcheck.

#[derive(Tree, Clone)]
struct Net {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn net_loss(p: &Net, x: &Tensor, y: &Tensor) -> Tensor {
    let h = (x.matmul(&p.w1) + &p.b1).tanh();
    (h.matmul(&p.w2) + &p.b2 - y).square().mean()
}

fn net_step(p: Net, x: Tensor, y: Tensor) -> (Net, Tensor) {
    let (l, g) = value_and_grad(|p: &Net| net_loss(p, &x, &y))(&p);
    (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
}

/// Values spread like a standard normal's (a sum of four uniforms, centred and scaled), made on
/// the host: the eager PRNG runs in the interpreter, which under memcheck took most of the
/// scenario's time and is not what it checks.
fn pseudo_normal(seed: u64, shape: [usize; 2]) -> Tensor {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let data = (0..shape[0] * shape[1])
        .map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * 3f32.sqrt())
        .collect();
    Tensor::from_vec::<f32>(data, shape)
}

/// The seed's data-parallel step on 8 devices, sized so that each threaded path runs, with
/// 32 rows per device: `h @ w2` (32 x 256 x 512 = 2^22 multiply-adds, `w2` replicated) is a
/// shared product with a shared right operand, `w2`'s gradient (256 x 512 x 32) a shared
/// product with its all-reduce; `w1`'s gradient (256 x 256 x 32, below the shared size) is
/// multiplied locally and summed by the in-place all-reduce (65536 elements); the biases'
/// and the loss's all-reduces take the copying path. One step against the single-device
/// step: memcheck runs it about 50x slower, and a second step took the same paths again.
fn threaded_step_scenario() {
    assert_eq!(device_count(), 8);
    let mesh = Mesh::new([8], ["dp"]);
    let init = Net {
        w1: pseudo_normal(1, [256, 256]) * 0.05,
        b1: Tensor::zeros([256]),
        w2: pseudo_normal(2, [256, 512]) * 0.05,
        b2: Tensor::zeros([512]),
    };
    let x = pseudo_normal(3, [256, 256]);
    let y = pseudo_normal(4, [256, 512]);
    let single = jit(|(p, x, y): (Net, Tensor, Tensor)| net_step(p, x, y));
    let sharded = jit(|(p, x, y): (Net, Tensor, Tensor)| net_step(p, x, y));
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (xs, ys) = (device_put(x.clone(), &data), device_put(y.clone(), &data));
    let p_single = init.clone();
    let p_sharded = device_put(init, NamedSharding::new(&mesh, P![]));
    let before = tessera::shared_gemm_count();
    let (p_single, l_want) = single.call((p_single, x, y)).unwrap();
    let (p_sharded, l_got) = sharded.call((p_sharded, xs, ys)).unwrap();
    let (want, got) = (l_want.item::<f32>(), l_got.item::<f32>());
    assert!(
        (want - got).abs() <= 1e-5 * want.abs(),
        "loss {got} vs {want}"
    );
    for (a, b) in [(&p_sharded.w1, &p_single.w1), (&p_sharded.w2, &p_single.w2)] {
        for (u, v) in a.to_vec::<f32>().iter().zip(b.to_vec::<f32>()) {
            assert!((u - v).abs() <= 1e-5, "{u} vs {v}");
        }
    }
    // Two shared products at least (h @ w2, and w2's gradient with its all-reduce).
    assert!(
        tessera::shared_gemm_count() >= before + 2,
        "{} shared products",
        tessera::shared_gemm_count() - before
    );
    println!("threaded step passed");
}

#[test]
fn threaded_step_case() {
    if std::env::var_os(CASE).is_none() || std::env::var("TESSERA_DEVICES").as_deref() != Ok("8") {
        return;
    }
    threaded_step_scenario();
}

/// The scenario above, under memcheck with `--error-exitcode`: any invalid read or write,
/// use of uninitialized memory or invalid free on any device thread fails the test.
#[test]
fn the_threaded_runtime_runs_clean_under_valgrind() {
    if std::env::var_os(CASE).is_some() {
        return;
    }
    ensure_valgrind();
    let start = std::time::Instant::now();
    let out = Command::new("valgrind")
        .args(["--tool=memcheck", "--error-exitcode=99", "--quiet"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "threaded_step_case",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CASE, "1")
        .env("TESSERA_DEVICES", "8")
        // Valgrind runs one thread at a time, about 50x slower.
        .env("TESSERA_COLLECTIVE_TIMEOUT", "600")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("threaded step passed"),
        "memcheck failed (exit {:?}) after {:?}:\n{text}",
        out.status.code(),
        start.elapsed()
    );
    eprintln!("memcheck of the threaded step: {:?}", start.elapsed());
}
