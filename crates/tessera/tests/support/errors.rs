//! The message of a front-end error (eager ops raise it as a panic with a `String` payload).

/// The panic message `f` raises; fails the test when it does not panic.
pub fn err_of(f: impl FnOnce() -> tessera::Tensor + std::panic::UnwindSafe) -> String {
    let e = std::panic::catch_unwind(f).expect_err("an error");
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
