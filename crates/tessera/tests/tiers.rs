//! Tiered compilation through `jit` (`tessera_codegen::compile_tiered`): by default a jitted
//! program's small kernels are compiled quick first and optimized in the background from its
//! second call (a program called once is not compiled again), with the same results; `TESSERA_TIERED=0` compiles them optimized at once; any
//! other value is a configuration error naming the variable. Each case runs in a child
//! process with the variable set.

use std::process::Command;
use std::time::{Duration, Instant};

use tessera::prelude::*;

const CHILD: &str = "tiers_child";

/// Run in a child process by the test below, with `TESSERA_TIERED` set (or not).
#[test]
#[ignore = "run by jit_tiers_unless_told_not_to, in a process with TESSERA_TIERED set"]
fn tiers_child() {
    let f = jit(|x: Tensor| ((x.tanh() * 2.0).exp() + 1.0).log().sum());
    let x = Tensor::from_vec(
        (0..1000).map(|i| i as f32 * 0.01 - 5.0).collect(),
        [10, 100],
    );
    let first = match f.call(x.clone()) {
        Ok(v) => v.item::<f32>(),
        Err(e) => return println!("call failed: {e}"),
    };
    // Nothing is compiled again after one call.
    std::thread::sleep(Duration::from_millis(50));
    println!(
        "after one call: {}",
        tessera_codegen::optimized_in_background()
    );
    let second = f.call(x.clone()).unwrap().item::<f32>();
    // The background compile takes milliseconds; without tiering nothing comes.
    let wait = match std::env::var("TESSERA_TIERED").as_deref() {
        Ok("0") => Duration::from_millis(300),
        Ok(_) | Err(_) => Duration::from_secs(60),
    };
    let deadline = Instant::now() + wait;
    while tessera_codegen::optimized_in_background() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let later = f.call(x).unwrap().item::<f32>();
    println!(
        "optimized in the background: {}; same bits: {}",
        tessera_codegen::optimized_in_background(),
        first.to_bits() == later.to_bits() && second.to_bits() == later.to_bits()
    );
}

fn child(value: Option<&str>) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([CHILD, "--exact", "--ignored", "--nocapture"])
        .env_remove("TESSERA_CACHE_DIR")
        .env_remove("TESSERA_DISASM")
        .env_remove("TESSERA_TIERED");
    if let Some(v) = value {
        cmd.env("TESSERA_TIERED", v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn jit_tiers_unless_told_not_to() {
    for default in [None, Some("1")] {
        let out = child(default);
        assert!(out.contains("after one call: 0"), "{default:?}: {out}");
        assert!(
            out.contains("optimized in the background: 1; same bits: true"),
            "{default:?}: {out}"
        );
    }
    let out = child(Some("0"));
    assert!(
        out.contains("optimized in the background: 0; same bits: true"),
        "{out}"
    );
    let out = child(Some("off"));
    assert!(
        out.contains("call failed: configuration: TESSERA_TIERED=\"off\": expected 1"),
        "{out}"
    );
}
