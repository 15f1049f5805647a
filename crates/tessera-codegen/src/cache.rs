//! The persistent compilation cache: each kernel's machine code kept on disk between
//! processes, as JAX's `jax_compilation_cache_dir` keeps compiled executables. Off unless a
//! directory is given (`set_dir`, or `TESSERA_CACHE_DIR` read at the first compile).
//!
//! The key is Cranelift's own (`incremental_cache::compute_cache_key`): a SHA-256 of the
//! function's CLIF (its external functions by signature, its constants) and of the ISA (the
//! triple and every shared and CPU flag: `opt_level`, AVX-512 or not). Tessera's choices are
//! all in the CLIF (FMA or not, unrolling, inline or outlined functions), so a change in how a
//! kernel is lowered is another key. The compiler's own version is not in that key: entries
//! live under a subdirectory named by the dependency set this crate was built with (`build.rs`:
//! a hash of the workspace's `Cargo.lock`, so another Cranelift or regalloc2 never finds them),
//! and Cranelift also refuses, on reading, an entry of another version (counted `rejected`).
//! The value is Cranelift's serialized `CompiledCodeStencil`: the code, and relocations naming
//! the function's own imports, which `ModuleReloc::from_mach_reloc` resolves in the module at
//! hand (its ids may differ between processes).
//!
//! On disk, one file per key, named by the key in hex: an 8-byte magic, the payload's length
//! and the SHA-256 of the key and the payload, then the payload. A file that is not a regular
//! file, is short, too large, of another format or whose key and payload do not hash to its
//! header is a miss (and is replaced when the kernel is compiled again): a torn or corrupted
//! file, or one copied under another key's name, never reaches the code buffer. Entries are
//! written to a fresh temporary file (`create_new`) and renamed into place, so processes may
//! share one directory. The cache is best effort: a directory that cannot be read or written
//! costs a compile, never an error (`stats` counts what failed).
//!
//! Verification (`set_verify`, `TESSERA_CACHE_VERIFY=1`): every hit is compiled again and
//! compared with the entry; a mismatch is counted, the entry removed and the fresh code used.
//!
//! Trust: a cache entry is machine code the process will run. The checksum catches damage,
//! not an attacker: the directory must be as trusted as the binary itself (as JAX's is).
//! There is no eviction; entries are small (the seed step's 12 kernels: 172 to 1,328 bytes
//! each, 4.7 KB in all, on the Xeon of docs/PERFORMANCE.md's eighth pass).

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use cranelift_codegen::incremental_cache::CacheKvStore;
use sha2::{Digest, Sha256};

/// The entries' first bytes: the format and its version.
const MAGIC: &[u8; 8] = b"TSRCC\x00\x00\x01";
/// Header: magic, payload length (u64 LE), SHA-256 of the key and the payload.
const HEADER: usize = 8 + 8 + 32;
/// An entry larger than this is neither read nor written (a kernel's code is KBs).
const MAX_PAYLOAD: u64 = 64 << 20;

/// `set_dir`'s choice, over `TESSERA_CACHE_DIR`.
static DIR: Mutex<Option<Option<PathBuf>>> = Mutex::new(None);
/// `set_verify`'s choice, over `TESSERA_CACHE_VERIFY`.
static VERIFY: Mutex<Option<bool>> = Mutex::new(None);

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static REJECTED: AtomicU64 = AtomicU64::new(0);
static MISMATCHED: AtomicU64 = AtomicU64::new(0);
static WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Sets the cache's directory for this process (`None`: no cache), over `TESSERA_CACHE_DIR`.
/// The directory is created at the first store. Compiles already running keep the directory
/// they started with.
pub fn set_dir(dir: Option<PathBuf>) {
    *DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
}

/// Whether every hit is compiled again and compared with its entry (for tests and for
/// checking a cache directory), over `TESSERA_CACHE_VERIFY=1`.
pub fn set_verify(on: bool) {
    *VERIFY.lock().unwrap_or_else(|e| e.into_inner()) = Some(on);
}

/// An environment variable's value, read once per process; empty is unset.
fn env_once(
    cell: &'static OnceLock<Option<std::ffi::OsString>>,
    name: &str,
) -> Option<&'static std::ffi::OsStr> {
    cell.get_or_init(|| std::env::var_os(name).filter(|v| !v.is_empty()))
        .as_deref()
}

/// The cache's directory: `set_dir`'s, else `TESSERA_CACHE_DIR` (read once per process; an
/// empty value is no cache).
pub fn dir() -> Option<PathBuf> {
    static ENV: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    if let Some(set) = DIR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return set.clone();
    }
    env_once(&ENV, "TESSERA_CACHE_DIR").map(PathBuf::from)
}

/// Forgets `set_verify`'s choice (`TESSERA_CACHE_VERIFY` decides again): for tests.
#[cfg(test)]
pub(crate) fn reset_verify() {
    *VERIFY.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Whether hits are verified: `set_verify`'s choice, else `TESSERA_CACHE_VERIFY=1`.
pub fn verifying() -> bool {
    static ENV: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    if let Some(on) = *VERIFY.lock().unwrap_or_else(|e| e.into_inner()) {
        return on;
    }
    env_once(&ENV, "TESSERA_CACHE_VERIFY").is_some_and(|v| v == "1")
}

/// Where this build's entries live under the cache directory `dir`: a subdirectory named by
/// the dependency set (`build.rs`).
pub(crate) fn entries_dir(dir: &Path) -> PathBuf {
    dir.join(concat!("cranelift-", env!("TESSERA_CODEGEN_DEPS")))
}

/// What the cache did in this process, counted over every compile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Functions whose code came from the cache.
    pub hits: u64,
    /// Functions compiled with the cache on and no usable entry (then stored, unless the
    /// store failed: `write_errors`).
    pub misses: u64,
    /// Entries found but not used: not a regular file, short, too large, another format, a
    /// checksum mismatch, or written by another version of Cranelift.
    pub rejected: u64,
    /// Hits whose code differed from a fresh compile's, when verifying (`set_verify`).
    pub mismatched: u64,
    /// Entries that could not be written (the directory is read-only, the disk full).
    pub write_errors: u64,
}

/// The counters so far.
pub fn stats() -> Stats {
    Stats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        rejected: REJECTED.load(Ordering::Relaxed),
        mismatched: MISMATCHED.load(Ordering::Relaxed),
        write_errors: WRITE_ERRORS.load(Ordering::Relaxed),
    }
}

/// How one function's compile used the cache, for the counters.
pub(crate) enum Outcome {
    Hit,
    Miss,
    /// A hit whose code a fresh compile did not reproduce (verifying).
    Mismatch,
}

/// Counts an entry Cranelift found but could not use (another version's).
pub(crate) fn count_rejected() {
    REJECTED.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn count(outcome: Outcome) {
    match outcome {
        Outcome::Hit => &HITS,
        Outcome::Miss => &MISSES,
        Outcome::Mismatch => &MISMATCHED,
    }
    .fetch_add(1, Ordering::Relaxed);
}

/// One function's view of the entries directory as Cranelift's key-value store: it remembers
/// the key it was asked for and whether an entry was found, so the caller can tell a version
/// mismatch (found, not used) and remove an entry that failed verification.
pub(crate) struct DirStore<'a> {
    dir: &'a Path,
    /// The key looked up, and whether a whole entry was found for it.
    looked_up: RefCell<Option<(Vec<u8>, bool)>>,
}

impl<'a> DirStore<'a> {
    /// A store over `dir`, the entries directory (`entries_dir`).
    pub(crate) fn new(dir: &'a Path) -> Self {
        DirStore {
            dir,
            looked_up: RefCell::new(None),
        }
    }

    /// Whether `get` found a whole entry.
    pub(crate) fn found(&self) -> bool {
        self.looked_up.borrow().as_ref().is_some_and(|(_, f)| *f)
    }

    /// Removes the entry `get` found (it did not verify).
    pub(crate) fn remove_found(&self) {
        if let Some((key, true)) = self.looked_up.borrow().as_ref() {
            let _ = std::fs::remove_file(file_of(self.dir, key));
        }
    }
}

fn file_of(dir: &Path, key: &[u8]) -> PathBuf {
    let mut name = String::with_capacity(2 * key.len());
    for b in key {
        name.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        name.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    dir.join(name)
}

/// The SHA-256 of an entry's key and payload.
fn checksum(key: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(payload);
    h.finalize().into()
}

/// The payload of an entry's bytes, if they are a whole, undamaged entry for `key`.
fn payload_of<'a>(key: &[u8], bytes: &'a [u8]) -> Option<&'a [u8]> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let payload = &bytes[HEADER..];
    if u64::try_from(payload.len()).ok()? != len {
        return None;
    }
    (checksum(key, payload)[..] == bytes[16..HEADER]).then_some(payload)
}

/// An entry's bytes for `key` and `payload`.
fn entry_of(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(key, payload));
    out.extend_from_slice(payload);
    out
}

/// The bytes of the entry file at `path`: `None` if there is none; `Some(Err)` for something
/// there that is not a regular file (a directory; a FIFO, opened without blocking so it
/// cannot hang the compile), is larger than an entry can be, or cannot be read.
fn read_entry(path: &Path) -> Option<Result<Vec<u8>, ()>> {
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK on Linux: opening a FIFO with no writer returns at once.
        open.custom_flags(0o4000);
    }
    let file = match open.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(_) => return Some(Err(())),
    };
    // The open file's own metadata: what was opened, not what the path names now.
    match file.metadata() {
        Ok(m) if m.is_file() && m.len() <= HEADER as u64 + MAX_PAYLOAD => {}
        _ => return Some(Err(())),
    }
    let mut bytes = Vec::new();
    // One byte past the bound tells a file grown past it since from one at the bound.
    match file
        .take(HEADER as u64 + MAX_PAYLOAD + 1)
        .read_to_end(&mut bytes)
    {
        Ok(_) => Some(Ok(bytes)),
        Err(_) => Some(Err(())),
    }
}

impl CacheKvStore for DirStore<'_> {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let entry = read_entry(&file_of(self.dir, key));
        let payload = match &entry {
            Some(Ok(bytes)) => payload_of(key, bytes).map(<[u8]>::len),
            Some(Err(())) | None => None,
        };
        *self.looked_up.borrow_mut() = Some((key.to_vec(), payload.is_some()));
        match (entry, payload) {
            (Some(Ok(mut bytes)), Some(len)) => {
                bytes.drain(..HEADER);
                debug_assert_eq!(bytes.len(), len);
                Some(Cow::Owned(bytes))
            }
            (Some(_), _) => {
                REJECTED.fetch_add(1, Ordering::Relaxed);
                None
            }
            (None, _) => None,
        }
    }

    fn insert(&mut self, key: &[u8], val: Vec<u8>) {
        if write_entry(self.dir, key, &val).is_err() {
            WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes an entry through a temporary file of its own (created new: never one another
/// writer has open) renamed into place: a reader sees the old entry, the new one or none,
/// never half of one.
fn write_entry(dir: &Path, key: &[u8], payload: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    if u64::try_from(payload.len()).map_or(true, |n| n > MAX_PAYLOAD) {
        return Err(std::io::Error::other("entry too large"));
    }
    std::fs::create_dir_all(dir)?;
    let path = file_of(dir, key);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let tmp = path.with_extension(format!(
            "tmp.{}.{nanos:x}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let written = file
        .write_all(&entry_of(key, payload))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Replaces the entry for `key` in `dir` by one holding `payload` with a valid checksum: a
/// test's way to plant an entry that is not its key's code.
#[cfg(test)]
pub(crate) fn plant(dir: &Path, key: &[u8], payload: &[u8]) {
    std::fs::write(file_of(dir, key), entry_of(key, payload)).unwrap();
}

/// Every entry in `dir`: its key and its payload.
#[cfg(test)]
pub(crate) fn entries(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let key: Vec<u8> = (0..name.len() / 2)
            .map(|i| u8::from_str_radix(&name[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let bytes = std::fs::read(&path).unwrap();
        let payload = payload_of(&key, &bytes).unwrap().to_vec();
        out.push((key, payload));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_any_damage_is_a_miss() {
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let entry = entry_of(b"key", &payload);
        assert_eq!(payload_of(b"key", &entry), Some(&payload[..]));
        // The same bytes under another key's name.
        assert_eq!(payload_of(b"kez", &entry), None);
        // Every single flipped bit, truncation at every length and a trailing byte.
        for i in 0..entry.len() {
            for bit in 0..8 {
                let mut bad = entry.clone();
                bad[i] ^= 1 << bit;
                assert_eq!(payload_of(b"key", &bad), None, "byte {i} bit {bit}");
            }
        }
        for n in 0..entry.len() {
            assert_eq!(payload_of(b"key", &entry[..n]), None, "truncated to {n}");
        }
        let mut longer = entry.clone();
        longer.push(0);
        assert_eq!(payload_of(b"key", &longer), None);
    }

    #[test]
    fn the_store_reads_what_it_wrote_and_rejects_a_damaged_file() {
        let dir = std::env::temp_dir().join(format!("tessera-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = DirStore::new(&dir);
        assert!(store.get(b"k1").is_none());
        store.insert(b"k1", b"machine code".to_vec());
        assert_eq!(store.get(b"k1").as_deref(), Some(&b"machine code"[..]));
        assert!(store.found());
        let path = file_of(&dir, b"k1");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let rejected = stats().rejected;
        assert!(store.get(b"k1").is_none());
        assert!(!store.found());
        assert!(stats().rejected > rejected);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("6b31")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_or_a_fifo_at_an_entry_is_rejected_without_blocking() {
        let dir = std::env::temp_dir().join(format!("tessera-cache-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(file_of(&dir, b"d")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(file_of(&dir, b"f"))
            .status()
            .expect("mkfifo (coreutils) runs");
        assert!(made.success());
        let store = DirStore::new(&dir);
        let rejected = stats().rejected;
        assert!(store.get(b"d").is_none());
        assert!(store.get(b"f").is_none());
        assert!(stats().rejected >= rejected + 2);
        // An entry too large to read back is not written.
        let mut store = DirStore::new(&dir);
        let errors = stats().write_errors;
        store.insert(b"big", vec![0; (MAX_PAYLOAD + 1) as usize]);
        assert!(stats().write_errors > errors);
        assert!(!file_of(&dir, b"big").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
