//! The persistent compilation cache (`set_compilation_cache_dir`, `TESSERA_CACHE_DIR`):
//! a compile of the same kernels takes their code from the directory, in this process and in
//! another one, and computes the same bits as a compile without it; a damaged entry is a
//! miss that is rewritten; a directory that cannot be written costs only the compile.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use tessera::prelude::*;

/// The cache's directory and counters are per process: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A small training step: products, tanh, a reduction and its gradient; several kernels.
fn step_result() -> Vec<f32> {
    let f = jit(|(w, x): (Tensor, Tensor)| {
        value_and_grad(|w: &Tensor| x.matmul(w).tanh().square().mean())(&w)
    });
    let w = random::normal(&Key::new(3), [5, 3]);
    let x = random::normal(&Key::new(4), [7, 5]);
    let (l, g) = f.call((w, x)).unwrap();
    let mut out = g.to_vec::<f32>();
    out.push(l.item::<f32>());
    out
}

/// The entry files under the cache directory `dir` (in its one subdirectory, of this build's
/// dependencies).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(subdirs.len(), 1, "{subdirs:?}");
    assert!(
        subdirs[0]
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("cranelift-"),
        "{subdirs:?}"
    );
    let mut out: Vec<PathBuf> = std::fs::read_dir(&subdirs[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_second_compile_takes_every_kernel_from_the_cache_with_the_same_bits() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tessera::set_compilation_cache_dir(None);
    let uncached = step_result();
    let dir = fresh_dir("same");
    tessera::set_compilation_cache_dir(Some(dir.clone()));
    let before = tessera::compilation_cache_stats();
    let first = step_result();
    let stored = tessera::compilation_cache_stats();
    let compiled = stored.misses - before.misses;
    assert!(compiled > 0, "{stored:?}");
    assert_eq!(stored.hits, before.hits, "an empty directory has nothing");
    assert_eq!(entries(&dir).len() as u64, compiled);
    // A new jit of the same step compiles again: every kernel is found.
    let second = step_result();
    let after = tessera::compilation_cache_stats();
    assert_eq!(after.hits - stored.hits, compiled, "{after:?}");
    assert_eq!(after.misses, stored.misses, "{after:?}");
    assert_eq!(bits(&first), bits(&uncached));
    assert_eq!(bits(&second), bits(&uncached));
    tessera::set_compilation_cache_dir(None);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_entry_is_a_miss_and_is_rewritten() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tessera::set_compilation_cache_dir(None);
    let uncached = step_result();
    let dir = fresh_dir("damaged");
    tessera::set_compilation_cache_dir(Some(dir.clone()));
    step_result();
    let files = entries(&dir);
    assert!(files.len() > 4, "{files:?}");
    // One entry with a flipped bit in its code, one cut short, one emptied, and two swapped
    // (each whole, under the other's name).
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&files[0], bytes).unwrap();
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(&files[2], b"").unwrap();
    let (three, four) = (
        std::fs::read(&files[3]).unwrap(),
        std::fs::read(&files[4]).unwrap(),
    );
    std::fs::write(&files[3], four).unwrap();
    std::fs::write(&files[4], three).unwrap();
    let before = tessera::compilation_cache_stats();
    let again = step_result();
    let after = tessera::compilation_cache_stats();
    assert_eq!(after.rejected - before.rejected, 5, "{after:?}");
    assert_eq!(after.misses - before.misses, 5, "{after:?}");
    assert_eq!(bits(&again), bits(&uncached));
    // Rewritten: the next compile finds all of them.
    let before = after;
    step_result();
    let after = tessera::compilation_cache_stats();
    assert_eq!(after.misses, before.misses, "{after:?}");
    assert_eq!(after.rejected, before.rejected, "{after:?}");
    assert_eq!(after.hits - before.hits, files.len() as u64);
    tessera::set_compilation_cache_dir(None);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_that_cannot_be_written_costs_only_the_compile() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tessera::set_compilation_cache_dir(None);
    let uncached = step_result();
    // A regular file where the directory should be: neither created nor written.
    let file = fresh_dir("not-a-dir");
    std::fs::write(&file, b"a file").unwrap();
    tessera::set_compilation_cache_dir(Some(file.clone()));
    let before = tessera::compilation_cache_stats();
    let result = step_result();
    let after = tessera::compilation_cache_stats();
    assert!(after.write_errors > before.write_errors, "{after:?}");
    assert_eq!(after.hits, before.hits);
    assert_eq!(bits(&result), bits(&uncached));
    tessera::set_compilation_cache_dir(None);
    std::fs::remove_file(&file).unwrap();
}

const CHILD: &str = "cache_child";

/// Run in a child process by the test below, with `TESSERA_CACHE_DIR` set: prints the step's
/// bits and the cache's counters.
#[test]
#[ignore = "run by another_process_finds_the_entries_through_the_environment"]
fn cache_child() {
    let result = step_result();
    let s = tessera::compilation_cache_stats();
    println!("bits {:?}", bits(&result));
    println!("hits {} misses {}", s.hits, s.misses);
}

fn child(dir: &Path) -> (String, u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([CHILD, "--exact", "--ignored", "--nocapture"])
        .env("TESSERA_CACHE_DIR", dir)
        .env_remove("TESSERA_DISASM")
        .env_remove("TESSERA_CACHE_VERIFY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |p: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("no {p} in {stdout}"))
            .to_string()
    };
    let counts: Vec<u64> = line("hits ")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (line("bits "), counts[0], counts[1])
}

#[test]
fn another_process_finds_the_entries_through_the_environment() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fresh_dir("processes");
    let (first_bits, hits, misses) = child(&dir);
    assert_eq!(hits, 0);
    assert!(misses > 0);
    // Another process, its code at other addresses: every kernel is found.
    let (second_bits, hits, again) = child(&dir);
    assert_eq!((hits, again), (misses, 0));
    assert_eq!(first_bits, second_bits);
    tessera::set_compilation_cache_dir(None);
    assert_eq!(first_bits, format!("bits {:?}", bits(&step_result())));
    std::fs::remove_dir_all(&dir).unwrap();
}
