//! System tools a test needs (Graphviz's `dot`): present, installed here when the test runs
//! as root with apt-get, or the test fails with the exact install line. Never a silent skip.

use std::process::{Command, Stdio};
use std::sync::Mutex;

/// One install at a time in this process.
static INSTALL: Mutex<()> = Mutex::new(());

fn runs(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn apt_install(package: &str) -> bool {
    // Under `timeout`: a held dpkg lock or a dead mirror fails the test instead of hanging it.
    let install = || {
        Command::new("timeout")
            .args([
                "600",
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                package,
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    install()
        || (Command::new("timeout")
            .args(["300", "apt-get", "update"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && install())
}

/// Makes sure `tool` runs (checked with `version_arg`), installing the Debian `package` when
/// it does not and this process may; panics with the install line otherwise.
pub fn require(tool: &str, version_arg: &str, package: &str) {
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if runs(tool, version_arg) {
        return;
    }
    if is_root() && runs("apt-get", "--version") && apt_install(package) && runs(tool, version_arg)
    {
        return;
    }
    panic!(
        "this test needs `{tool}` and could not install it; install it with: \
         sudo apt-get install -y {package}"
    );
}
