//! The persistent compilation cache: each kernel's machine code kept on disk between
//! processes, as JAX's `jax_compilation_cache_dir` keeps compiled executables. Off unless a
//! directory is given (`set_dir`, or `TESSERA_CACHE_DIR` read at the first compile).
//!
//! The key is Cranelift's own (`incremental_cache::compute_cache_key`): a SHA-256 of the
//! function's CLIF with its external names abstracted, of the ISA (triple, every shared and
//! CPU flag: `opt_level`, the verifier, AVX-512 or not) and of Cranelift's version. So a key
//! names exactly the code Cranelift would produce: a change in how Tessera lowers a kernel is
//! a change in its CLIF, hence another key, and a stale entry is never found. The value is
//! Cranelift's serialized `CompiledCodeStencil` (code, relocations by the function's own
//! name table, which is re-applied on a hit: the module's ids may differ between processes).
//!
//! On disk, one file per key, named by the key in hex: an 8-byte magic, the payload's length
//! and the SHA-256 of the key and the payload, then the payload. A file that is short, too
//! large, of another format or whose key and payload do not hash to its header is a miss (and
//! is replaced when the kernel is compiled again): a torn or corrupted file, or one copied
//! under another key's name, never reaches the code buffer. Entries are written to a temporary file and renamed into place, so processes may
//! share one directory. The cache is best effort: a directory that cannot be read or written
//! costs a compile, never an error (`stats` counts what failed).
//!
//! Trust: a cache entry is machine code the process will run. The checksum catches damage,
//! not an attacker: the directory must be as trusted as the binary itself (as JAX's is).
//! There is no eviction; entries are a few KB each (the seed step's 12 kernels: about 40 KB).

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use cranelift_codegen::incremental_cache::CacheKvStore;
use sha2::{Digest, Sha256};

/// The entries' first bytes: the format and its version.
const MAGIC: &[u8; 8] = b"TSRCC\x00\x00\x01";
/// Header: magic, payload length (u64 LE), SHA-256 of the key and the payload.
const HEADER: usize = 8 + 8 + 32;
/// An entry larger than this is not read (a kernel's code is KBs; a huge file is damage).
const MAX_PAYLOAD: u64 = 64 << 20;

/// `set_dir`'s choice, over `TESSERA_CACHE_DIR`.
static DIR: Mutex<Option<Option<PathBuf>>> = Mutex::new(None);

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static REJECTED: AtomicU64 = AtomicU64::new(0);
static WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Sets the cache's directory for this process (`None`: no cache), over `TESSERA_CACHE_DIR`.
/// The directory is created at the first store. Compiles already running keep the directory
/// they started with.
pub fn set_dir(dir: Option<PathBuf>) {
    *DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
}

/// The cache's directory: `set_dir`'s, else `TESSERA_CACHE_DIR` (read once per process; an
/// empty value is no cache).
pub fn dir() -> Option<PathBuf> {
    static ENV: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(set) = DIR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return set.clone();
    }
    ENV.get_or_init(|| {
        std::env::var_os("TESSERA_CACHE_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .clone()
}

/// What the cache did in this process, counted over every compile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Functions whose code came from the cache.
    pub hits: u64,
    /// Functions compiled with the cache on and no usable entry (then stored).
    pub misses: u64,
    /// Entries found but not used: short, too large, another format, or a checksum mismatch.
    pub rejected: u64,
    /// Entries that could not be written (the directory is read-only, the disk full).
    pub write_errors: u64,
}

/// The counters so far.
pub fn stats() -> Stats {
    Stats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        rejected: REJECTED.load(Ordering::Relaxed),
        write_errors: WRITE_ERRORS.load(Ordering::Relaxed),
    }
}

/// Counts a compile that found its code (`true`) or compiled it.
pub(crate) fn count(hit: bool) {
    if hit { &HITS } else { &MISSES }.fetch_add(1, Ordering::Relaxed);
}

/// A directory as Cranelift's key-value store.
pub(crate) struct DirStore<'a> {
    pub dir: &'a Path,
}

fn file_of(dir: &Path, key: &[u8]) -> PathBuf {
    let mut name = String::with_capacity(2 * key.len());
    for b in key {
        name.push_str(&format!("{b:02x}"));
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

fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    // One byte past the bound tells a too-large file from one at the bound.
    file.take(HEADER as u64 + MAX_PAYLOAD + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

impl CacheKvStore for DirStore<'_> {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let mut bytes = read_entry(&file_of(self.dir, key))?;
        let Some(payload) = payload_of(key, &bytes) else {
            REJECTED.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let len = payload.len();
        bytes.drain(..HEADER);
        debug_assert_eq!(bytes.len(), len);
        Some(Cow::Owned(bytes))
    }

    fn insert(&mut self, key: &[u8], val: Vec<u8>) {
        if write_entry(self.dir, key, &val).is_err() {
            WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes an entry through a temporary file renamed into place: a reader sees the old entry,
/// the new one or none, never half of one.
fn write_entry(dir: &Path, key: &[u8], payload: &[u8]) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let path = file_of(dir, key);
    let tmp = path.with_extension(format!(
        "tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written =
        std::fs::write(&tmp, entry_of(key, payload)).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
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
        let mut store = DirStore { dir: &dir };
        assert!(store.get(b"k1").is_none());
        store.insert(b"k1", b"machine code".to_vec());
        assert_eq!(store.get(b"k1").as_deref(), Some(&b"machine code"[..]));
        let path = file_of(&dir, b"k1");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let rejected = stats().rejected;
        assert!(store.get(b"k1").is_none());
        assert!(stats().rejected > rejected);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("6b31")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
