//! Shared by the memcheck tests (`tessera-codegen/tests/valgrind.rs`,
//! `tessera/tests/runtime_faults.rs`): valgrind missing is a failure, never a silent skip.

use std::process::Command;

/// Makes sure valgrind is there: installs it when it is missing and this process may
/// (root, apt-get); otherwise fails with the line that installs it.
pub fn ensure_valgrind() {
    let present = || {
        Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if present() {
        return;
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !apt(&["install", "-y", "valgrind"]) {
            apt(&["update"]);
            apt(&["install", "-y", "valgrind"]);
        }
    }
    assert!(
        present(),
        "valgrind is not installed (and could not be installed from here): the memcheck test \
         cannot run. Install it with: sudo apt-get update && sudo apt-get install -y valgrind"
    );
}
