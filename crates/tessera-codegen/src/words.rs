//! A run's zeroed memory (an executable's arena, its group region): words from the global
//! allocator, or, for a one-device program's arena of `MAPPED_FROM` bytes or more on Linux,
//! an anonymous mapping whose 2 MiB-aligned part is advised to use transparent huge pages
//! (`MADV_HUGEPAGE`).
//!
//! Why: a fresh arena's pages are faulted in by the first run, one 4 KiB page at a time. On
//! the Xeon VM of docs/PERFORMANCE.md (twenty-eighth pass) a first touch of 12 MiB (the big
//! MLP's arena) took 3.8-16.6 ms in 4 KiB pages, 0.6-1.8 ms in 2 MiB ones, and the big step's
//! first call faulted 3,690 pages. Either way the memory comes zeroed by the kernel and a page
//! no run touches is never backed (at 2 MiB granularity here), as `calloc`'s fresh pages.
//! Where transparent huge pages are off (or not built into the kernel), the mapping stays in
//! 4 KiB pages: the same contents, the same laziness.

#[cfg(target_os = "linux")]
use std::ptr::NonNull;

/// From this many bytes, zeroed words come from a mapping of their own (Linux).
#[cfg(target_os = "linux")]
pub(crate) const MAPPED_FROM: usize = 2 << 20;

/// A transparent huge page: the mapping's alignment and granule.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// `len` zeroed words.
pub(crate) enum Words {
    Heap(Vec<u64>),
    /// `len` words at `at`, inside the mapping of `bytes` bytes at `base`, which this owns.
    #[cfg(target_os = "linux")]
    Mapped {
        base: NonNull<u8>,
        bytes: usize,
        at: NonNull<u64>,
        len: usize,
    },
}

// SAFETY: `Words` owns its memory alone, as a `Vec<u64>` does (the mapping is made by `zeroed`,
// unmapped only by `drop`, and reached only through `&self`/`&mut self`), so moving it to
// another thread or sharing `&Words` (read-only words) is as sound as for the vector.
unsafe impl Send for Words {}
// SAFETY: as above: `&Words` gives only `&[u64]`.
unsafe impl Sync for Words {}

impl Words {
    /// The number of words (without making a slice of them all, as `Vec::len`).
    pub(crate) fn len(&self) -> usize {
        match self {
            Words::Heap(v) => v.len(),
            #[cfg(target_os = "linux")]
            Words::Mapped { len, .. } => *len,
        }
    }

    /// The first word's address, without making a slice of them all (`Vec::as_mut_ptr`'s
    /// promise: pointers taken from it earlier stay valid).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u64 {
        match self {
            Words::Heap(v) => v.as_mut_ptr(),
            #[cfg(target_os = "linux")]
            Words::Mapped { at, .. } => at.as_ptr(),
        }
    }
}

impl Default for Words {
    fn default() -> Words {
        Words::Heap(Vec::new())
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            Words::Heap(v) => v,
            #[cfg(target_os = "linux")]
            // SAFETY: `at` holds `len` words of the live mapping this owns (`zeroed`): zero or
            // written since, valid `u64`s either way, aligned to 2 MiB.
            Words::Mapped { at, len, .. } => unsafe {
                std::slice::from_raw_parts(at.as_ptr(), *len)
            },
        }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            Words::Heap(v) => v,
            #[cfg(target_os = "linux")]
            // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
            Words::Mapped { at, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(at.as_ptr(), *len)
            },
        }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Words::Mapped { base, bytes, .. } = self {
            // SAFETY: `base..base + bytes` is the mapping `zeroed` made, which nothing else
            // unmaps, and no reference into it outlives `self`. A failure leaves it mapped (its
            // address space leaked), nothing worse.
            unsafe { libc::munmap(base.as_ptr().cast(), *bytes) };
        }
    }
}

/// `words` zeroed words, or `None` when there is no room: from `MAPPED_FROM` bytes, when
/// `huge` (a one-device program's arena, touched whole every run) and on Linux, a mapping in
/// huge pages; otherwise from the global allocator, allocated zeroed (`calloc`), not zeroed by
/// writing: a large block comes as fresh pages the kernel zeroes on first touch, so pages a
/// run never touches (a device that skips the replicated updates another computes) are never
/// faulted in. (Writing the zeros was 40 ms of the first step of the big MLP over 8 devices on
/// one thread; huge pages there, 8 arenas of 12.9 MB mostly untouched but by the first device,
/// made its first call 30-36 -> 30-67 ms.)
pub(crate) fn zeroed(words: usize, huge: bool) -> Option<Words> {
    if words == 0 {
        return Some(Words::default());
    }
    // At most `isize::MAX` bytes, as any allocation (and slice) must be.
    let layout = std::alloc::Layout::array::<u64>(words).ok()?;
    #[cfg(target_os = "linux")]
    if huge
        && layout.size() >= MAPPED_FROM
        && let Some(w) = mapped(words)
    {
        return Some(w);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = huge;
    // SAFETY: the layout has a non-zero size (`words > 0`).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u64;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `words` u64s (the
    // one `Vec<u64>` with capacity `words` uses), and zeroed memory is `words` valid u64s.
    Some(Words::Heap(unsafe { Vec::from_raw_parts(p, words, words) }))
}

/// `words` zeroed words in an anonymous mapping, at a 2 MiB boundary inside it (one huge page
/// more is mapped than they need, its unused parts never touched), advised to use huge pages.
#[cfg(target_os = "linux")]
fn mapped(words: usize) -> Option<Words> {
    let len = words.checked_mul(8)?.checked_next_multiple_of(HUGE_PAGE)?;
    let bytes = len.checked_add(HUGE_PAGE)?;
    // SAFETY: a new private anonymous mapping at an address the kernel picks: it touches no
    // memory of this process, and its pages read as zero until written.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let Some(base) = NonNull::new(raw.cast::<u8>()) else {
        // SAFETY: the mapping just made (at address 0), which nothing else refers to.
        unsafe { libc::munmap(raw, bytes) };
        return None;
    };
    let offset = (raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize;
    // SAFETY: `offset < HUGE_PAGE`, so `raw + offset .. raw + offset + len` lies inside the
    // `len + HUGE_PAGE` bytes just mapped (and `base + offset` is not null).
    let at = unsafe { base.add(offset) };
    // SAFETY: the range is inside the mapping (above); the advice changes how its pages are
    // backed, never what they hold. Refused (no huge pages in the kernel): 4 KiB pages.
    unsafe { libc::madvise(at.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
    Some(Words::Mapped {
        base,
        bytes,
        at: at.cast::<u64>(),
        len: words,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags of the mapping holding `addr` (`VmFlags` of its entry in /proc/self/smaps).
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&addr);
            } else if inside && let Some(v) = line.strip_prefix("VmFlags:") {
                return v.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    /// Large zeroed words asked for in huge pages are a mapping aligned to 2 MiB, zero,
    /// writable, advised to use huge pages; small ones, and those not asked for so, come from
    /// the allocator.
    #[test]
    fn large_zeroed_words_are_huge_page_mappings() {
        let small = zeroed(1000, true).unwrap();
        assert!(matches!(small, Words::Heap(_)));
        assert!(small.iter().all(|&w| w == 0));
        let words = (12 << 20) / 8 + 3;
        assert!(matches!(zeroed(words, false).unwrap(), Words::Heap(_)));
        let mut big = zeroed(words, true).unwrap();
        assert_eq!(big.len(), words);
        for i in (0..words).step_by(512) {
            assert_eq!(big[i], 0);
            big[i] = i as u64;
        }
        assert_eq!(big[512 * 7], 512 * 7);
        assert_eq!(big[words - 1], 0);
        #[cfg(target_os = "linux")]
        {
            assert!(matches!(big, Words::Mapped { .. }));
            assert_eq!(big.as_ptr() as usize % HUGE_PAGE, 0);
            // Advised (`hg`) wherever the kernel has transparent huge pages at all, whatever
            // their setting.
            if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
                let flags = vm_flags(big.as_ptr() as usize);
                assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
            }
        }
        assert!(zeroed(0, true).unwrap().is_empty());
        // Past `isize::MAX` bytes; then too large to map (2^61 bytes) or allocate.
        assert!(zeroed(usize::MAX / 4, true).is_none());
        assert!(zeroed(1 << 58, true).is_none());
    }
}
