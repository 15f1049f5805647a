//! Names the dependency set this crate is built with, for the persistent compilation cache
//! (`src/cache.rs`): a hash of the workspace's `Cargo.lock` (Cranelift's and regalloc2's exact
//! versions among others), so code compiled by other versions of the compiler is kept apart
//! and never found. Without its workspace's lock file (a build from a registry), the hash is
//! of this crate's version alone; Cranelift still refuses another version's entries itself,
//! but another regalloc2 is then not told apart.

use std::path::{Path, PathBuf};

/// FNV-1a, 64 bits: a salt that changes with the lock file, not a security boundary (the
/// entries' checksums and Cranelift's keys are SHA-256).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The lock file of the workspace this crate is built in: the first ancestor directory whose
/// `Cargo.toml` declares a `[workspace]`, if its `Cargo.lock` lists this crate. Anything else
/// (a registry or git checkout with no such workspace above it, an unrelated lock file) is
/// not this build's, and is not used.
fn lock_file(start: &Path) -> Option<PathBuf> {
    let root = start.ancestors().find(|d| {
        std::fs::read_to_string(d.join("Cargo.toml"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
    })?;
    let lock = root.join("Cargo.lock");
    let text = std::fs::read_to_string(&lock).ok()?;
    text.contains("name = \"tessera-codegen\"").then_some(lock)
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let version = std::env::var("CARGO_PKG_VERSION").expect("set by cargo");
    let mut salt = format!("tessera-codegen {version}\n").into_bytes();
    if let Some(lock) = lock_file(&manifest) {
        println!("cargo:rerun-if-changed={}", lock.display());
        if let Ok(bytes) = std::fs::read(&lock) {
            salt.extend_from_slice(&bytes);
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=TESSERA_CODEGEN_DEPS={:016x}", fnv1a(&salt));
}
