//! Two layouts the `gemm` crate is slow at, worked around by copies:
//! - a GEMM's right operand, when it is column-major (the `W^T` of every dense layer's input
//!   gradient, `dy @ W^T`), copied row-major before the product: whole (`with_row_major`), or,
//!   for products of more than 64 rows, 128 columns (f32) at a time, each chunk multiplied
//!   by the thread that copied it while it is in that core's cache (`with_row_major_chunks`);
//! - a narrow row-major result of a column-major left operand (a few-output layer's weight
//!   gradient, `h^T @ dy`, 1024 x 10 x 512), computed column-major into a scratch and copied
//!   out (`with_column_major_out`).
//!
//! The first:
//! The `gemm` crate (0.19) multiplies a row-major `lhs` by a column-major `rhs` into a
//! row-major `out` at a fraction of its row-major speed, and at small `m` it collapses:
//! 512x1024x1024 155 GFLOP/s against 222 row-major, 64x1024x1024 48 against 215,
//! 8x1024x1024 9 against 131 (AMD EPYC Zen 4, both cores; docs/PERFORMANCE.md). Copying the
//! operand costs about 0.45 ns an element on two cores, a tenth of the loss at the big MLP's
//! shapes, so `gemm_view` copies the operands that are large enough for the loss to show.
//! For the shapes copied the product is the same sum in the same order over the same values:
//! the copy changes where the library reads `rhs`, not what it computes (`tests` below compare
//! bits). That needs `m * n > 256`: at or below it, with a unit-stride `rhs` column, the
//! library takes another kernel (per-lane partial sums over `k`) that the copy would leave.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many operands `with_row_major` has copied since the process started (for tests).
static COPIES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// How many operands this thread has copied chunk by chunk (for tests: `gemm_view` takes
    /// that path).
    static CHUNKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether `gemm_view` copies the `k x n` right operand with (row, column) strides `rs` into
/// a row-major scratch before multiplying into an `out` with strides `os`: a column-major
/// operand (unit stride along `k`), a row-major result, and a product where the library's
/// column-major path is measurably slower than the copy (below `m*n*k = 2^20`, or with
/// `n` or `k` under 64, the two measured within a few percent). The columns must not overlap
/// (a column stride of at least `k`), so the copy's `k * n` elements (`k * ld` with its
/// padding, `padded_row`) are no more than about the operand's buffer holds, and `m * n` must
/// exceed 256 (the module doc: the same bits).
pub(crate) fn worth_copying(
    (m, n, k): (usize, usize, usize),
    rs: [isize; 2],
    os: [isize; 2],
) -> bool {
    rs[0] == 1
        && rs[1] > 1
        && rs[1] >= k as isize
        && os[1] == 1
        && m >= 2
        && n >= 64
        && k >= 64
        && m * n > 256
        && m.saturating_mul(n).saturating_mul(k) >= 1 << 20
}

/// Whether `gemm_view` computes the `m x n` product of a left operand with (row, column)
/// strides `ls` into a column-major scratch and copies it into the row-major `out` (strides
/// `os`) instead of multiplying into `out` itself: a left operand with unit row stride (a
/// transposed view, `h^T`) and a narrow result (`2 <= n <= 16`, at least 64 rows). The library
/// transposes a row-major product into one of `n` rows, which its kernels, tiled for many
/// rows, waste: column-major, one core, 1024 x 10 x 512 took 118 against 329 us, 1024 x 10 x
/// 64 8.6 against 28, 2048 x 2 x 2048 710 against 2843 (Xeon, every shape tried faster,
/// docs/PERFORMANCE.md). Both give the same sums in the same order (the same bits at every
/// shape tried, `tests` below): the library's inner loop runs over `k` either way.
pub(crate) fn narrow_column_result(
    (m, n, _k): (usize, usize, usize),
    ls: [isize; 2],
    os: [isize; 2],
) -> bool {
    ls[0] == 1 && os[1] == 1 && (2..=16).contains(&n) && m >= 64
}

/// How many products `with_column_major_out` has computed since the process started (for
/// tests).
static NARROW: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Each thread's scratch for a narrow product's column-major result (at most 16 columns),
    /// kept between products as `SCRATCH` is.
    static COLUMNS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with a column-major `m x n` scratch (element `(i, j)` at `j * m + i`) for it to
/// fill with values of `T`, then copies the scratch into the `m x n` view at `out` with
/// strides `os`.
///
/// # Safety
/// `T` is `f32` or `f64`; `f` writes every element of the scratch (a product does) and
/// nothing outside it; `out` holds the view (every `(i, j)` at `i * os[0] + j * os[1]`
/// writable, overlapping nothing `f` reads).
pub(crate) unsafe fn with_column_major_out<T: Copy>(
    out: *mut T,
    os: [isize; 2],
    (m, n): (usize, usize),
    f: impl FnOnce(*mut T),
) {
    NARROW.fetch_add(1, Ordering::Relaxed);
    with_scratch::<T, _>(&COLUMNS, m * n, |scratch| {
        let col = scratch.as_mut_ptr() as *mut T;
        f(col);
        for j in 0..n {
            // SAFETY: column `j` of the scratch, written by `f` (the caller's contract), holds
            // `m` values of `T` from `j * m` (the scratch holds `m * n`, 8-aligned).
            let column = unsafe { std::slice::from_raw_parts(col.add(j * m), m) };
            for (i, &v) in column.iter().enumerate() {
                // SAFETY: element `(i, j)` of the caller's `out` view.
                unsafe { *out.offset(i as isize * os[0] + j as isize * os[1]) = v };
            }
        }
    })
}

/// Calls `f` with this thread's scratch `key`, grown to hold at least `len` values of `T` (a
/// type of at most 8 bytes and 8-aligned: its words are 8-aligned); zeroed when grown, else
/// as the last product left it. A product on this thread inside another (the library's
/// rayon tasks steal work) finds the scratch taken and gets one of its own.
pub(crate) fn with_scratch<T, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<u64>>>,
    len: usize,
    f: impl FnOnce(&mut [u64]) -> R,
) -> R {
    assert!(std::mem::size_of::<T>() <= 8 && std::mem::align_of::<T>() <= 8);
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    key.with(|s| match s.try_borrow_mut() {
        Ok(mut scratch) => {
            if scratch.len() < words {
                scratch.resize(words, 0);
            }
            f(&mut scratch[..words])
        }
        Err(_) => f(&mut vec![0; words]),
    })
}

/// Operands with more elements than this are copied on both cores (below, waking the pool
/// costs more than the copy).
const PARALLEL_FROM: usize = 1 << 16;

/// The side of the square tiles the copy moves through a local buffer: 16 f32 are one cache
/// line, so every line read and written is used whole, and the column reads (one element of
/// each of 16 rows, a row stride apart) never stay in the cache long enough to conflict.
const TILE: usize = 16;

thread_local! {
    /// Each thread's scratch for the copied operand, kept between products (it only grows)
    /// so a steady-state step allocates nothing. It lives as long as its thread: a device
    /// thread keeps up to its largest copied operand (4.25 MB for a 1024 x 1024 f32 weight
    /// with its rows padded, `padded_row`).
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// A column-major operand's base, for the copy's tasks.
#[derive(Clone, Copy)]
struct Src<T>(*const T);
// SAFETY: the tasks only read through the pointer, inside the view the caller of
// `with_row_major` vouches for, while that call blocks.
unsafe impl<T: Sync> Send for Src<T> {}
// SAFETY: as above: shared reads only.
unsafe impl<T: Sync> Sync for Src<T> {}

impl<T> Src<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper, not its field).
    fn get(self) -> *const T {
        self.0
    }
}

/// The row stride of the row-major copy of a `k x n` operand of `T`: `n`, padded by one cache
/// line when a row is a multiple of 1 KB. Rows 4 KB apart (the big MLP's 1024-wide weight)
/// all fall in one set of the L1 cache (64 sets of 64-byte lines), so a band of 16 rows
/// written a few bytes at a time (`band_4x4`) keeps 16 lines in a set of 12 ways, evicting and
/// refetching each line four times; the product's packing reads the rows across the same sets.
/// A row a line longer puts consecutive rows in consecutive sets.
pub(crate) fn padded_row<T>(n: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    if n >= 64 && (n * size).is_multiple_of(1024) {
        n + 64 / size
    } else {
        n
    }
}

/// Calls `f` with the `k x n` view whose element `(kk, nn)` is at `src + nn * stride + kk`,
/// copied row-major with row stride `ld = padded_row::<T>(n)` (element `(kk, nn)` at
/// `kk * ld + nn`), and `ld`.
///
/// # Safety
/// `T` is `f32` or `f64` (every bit pattern a value: the scratch is reused as it is). Every
/// element of the view must be readable: `src` points into a live allocation of `T` holding
/// offsets up to `(n - 1) * stride + k - 1`, not written while this runs, with `stride >= k`
/// (so `k * n` is at most that allocation's length and does not overflow).
pub(crate) unsafe fn with_row_major<T: Copy + Default + Send + Sync, R>(
    src: *const T,
    stride: usize,
    (k, n): (usize, usize),
    parallel: bool,
    f: impl FnOnce(*const T, usize) -> R,
) -> R {
    COPIES.fetch_add(1, Ordering::Relaxed);
    let ld = padded_row::<T>(n);
    // `k * n` fits (the caller's contract), and padding happens only for rows of at least
    // 1 KB, adding 64 bytes: `ld <= 17 n / 16`, so `k * ld` fits as well (a scratch too large
    // to allocate is a capacity panic in `Vec::resize`, never an overflowed length).
    let len = k * ld;
    with_scratch::<T, _>(&SCRATCH, len, |scratch| {
        // SAFETY: the scratch holds at least `len` values of `T` (its bytes, 8-aligned, and
        // `T` is at most 8 bytes and 8-aligned); `T` is f32 or f64 (the caller's contract),
        // for which every bit pattern is a value.
        let dst = unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut T, len) };
        // SAFETY: forwarded from the caller.
        unsafe {
            copy_row_major(
                Src(src),
                stride,
                (n, ld),
                dst,
                parallel && len > PARALLEL_FROM,
            )
        };
        f(dst.as_ptr(), ld)
    })
}

/// How many columns of the product one chunk of `with_row_major_chunks` covers: 512 bytes of
/// a copied row (128 f32, 64 f64), so a chunk of a 1024-deep operand (512 KB) stays in a
/// core's L2 cache between its copy and the product that reads it.
fn chunk_columns<T>() -> usize {
    (512 / std::mem::size_of::<T>().max(1)).max(1)
}

/// Whether a copied product (`worth_copying`) of `m` rows and `n` columns of `size`-byte
/// values goes chunk by chunk (`with_row_major_chunks`) instead of through one whole copy
/// (`with_row_major`): when `m > 64`, and, for a product on the pool (`parallel`), when there
/// are at least as many chunks as the pool has threads (a chunk's product runs on one thread:
/// fewer chunks would leave cores idle that the library's own split uses). With `m > 64`
/// neither the whole product nor any chunk takes the library's small-product path (both sides
/// at most 64, where it blocks the contraction by `min(k, 512)`); everywhere else its
/// contraction blocks depend on `k` and the caches alone, so every element is the same sum in
/// the same order either way (`tests` compare bits).
pub(crate) fn in_chunks(m: usize, n: usize, size: usize, parallel: bool) -> bool {
    let chunks = n / (512 / size.max(1)).max(1);
    m > 64 && (!parallel || chunks >= rayon::current_num_threads())
}

/// Calls `f(n0, nn, copy, ld)` for each chunk of `chunk_columns::<T>()` columns (the last
/// with the columns left over) `n0..n0 + nn` of the `k x n` view of `with_row_major` (element `(kk, nn)` at
/// `src + nn * stride + kk`), with that chunk copied row-major into the calling thread's
/// scratch (element `(kk, j)` of the chunk at `copy + kk * ld + j`, `ld = padded_row(nn)`):
/// on every thread of the current rayon pool when `parallel`, else in order on this one. Each
/// chunk is copied by the thread that multiplies it, right before, so the copy is read from
/// that core's cache, and the two cores copy and multiply at once (the big MLP's `g @ W^T`:
/// docs/PERFORMANCE.md).
///
/// # Safety
/// As `with_row_major`'s; and `f` must not wait inside rayon (a product on one thread, a
/// serial copy): a pool thread that did could take another chunk meanwhile, and the two would
/// share that thread's region of the scratch.
pub(crate) unsafe fn with_row_major_chunks<T, F>(
    src: *const T,
    stride: usize,
    (k, n): (usize, usize),
    parallel: bool,
    f: F,
) where
    T: Copy + Default + Send + Sync,
    F: Fn(usize, usize, *const T, usize) + Sync,
{
    COPIES.fetch_add(1, Ordering::Relaxed);
    CHUNKED.with(|c| c.set(c.get() + 1));
    let width = chunk_columns::<T>();
    let src = Src(src);
    // The last chunk takes the columns left over, so no chunk is narrower than `width` or
    // the whole `n` (the library takes other kernels, summing in other orders, for a product
    // of one column, or of at most 256 elements).
    let chunks = (n / width).max(1);
    let last = n - (chunks - 1) * width;
    // The copies go to regions of the calling thread's scratch (one buffer that only grows,
    // so steady state allocates nothing whichever pool thread takes a chunk), each big enough
    // for any chunk (the last is the widest): one region per pool thread (and one for a
    // caller outside the pool), reused by every chunk that thread takes, so a copy is
    // written over lines still in that core's cache; or one per chunk when there are no more
    // chunks than that. A pool thread runs one chunk at a time: a chunk never waits inside
    // rayon (its copy is serial, its product `Parallelism::None`), so it cannot take another
    // chunk while it holds its region (the caller's contract). `k * n` fits (the caller's
    // contract) and a row stride is at most 17/16 of its width (`padded_row`); a region holds
    // the widest chunk (under two chunks' width), so `regions * region` is at most twice the
    // whole copy's size.
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        0
    };
    let by_chunk = threads + 1 >= chunks;
    let regions = if by_chunk { chunks } else { threads + 1 };
    let region = k * padded_row::<T>(width).max(padded_row::<T>(last));
    with_scratch::<T, _>(&SCRATCH, regions * region, |scratch| {
        let base = Dst(scratch.as_mut_ptr() as *mut T);
        let chunk = |c: usize| {
            let n0 = c * width;
            let nn = if c + 1 == chunks { last } else { width };
            let ld = padded_row::<T>(nn);
            let r = match by_chunk {
                true => c,
                false => rayon::current_thread_index()
                    .filter(|&i| i < threads)
                    .unwrap_or(threads),
            };
            // SAFETY: region `r < regions` of the scratch, `region >= k * ld` values from
            // `r * region`, inside the scratch's `regions * region` (8-aligned words, `T` at
            // most 8 bytes), used by this chunk alone while it runs (above); `T` is f32 or
            // f64, every bit pattern a value.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.get().add(r * region), k * ld) };
            // SAFETY: columns `n0..n0 + nn` of the caller's view are the view of `nn`
            // columns from `src + n0 * stride`, with the same stride and `k`.
            unsafe {
                copy_row_major(
                    Src(src.get().wrapping_add(n0 * stride)),
                    stride,
                    (nn, ld),
                    dst,
                    false,
                )
            };
            f(n0, nn, dst.as_ptr(), ld)
        };
        if parallel {
            use rayon::prelude::*;
            let _quiet = crate::team::Quiet::new();
            (0..chunks).into_par_iter().for_each(chunk);
        } else {
            (0..chunks).for_each(chunk);
        }
    })
}

/// The scratch's base, for the chunks' tasks.
#[derive(Clone, Copy)]
struct Dst<T>(*mut T);
// SAFETY: each task writes only the region of the scratch it holds alone while it runs, and
// `with_row_major_chunks` holds the scratch until every task is done.
unsafe impl<T: Send> Send for Dst<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Dst<T> {}

impl<T> Dst<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper, not its field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// `dst`, row-major `[cols, rows]`, the transpose of `src`, row-major `[rows, cols]` (a
/// conv's lhs with its features moved innermost, `window.rs`), through the tiles of
/// `copy_row_major`.
pub(crate) fn transpose_into<T: Copy + Default + Send + Sync>(
    src: &[T],
    (rows, cols): (usize, usize),
    dst: &mut [T],
) {
    assert!(rows.checked_mul(cols) == Some(src.len()) && dst.len() == src.len());
    if src.is_empty() {
        return;
    }
    // SAFETY: the view `src[nn * cols + kk]`, `nn < rows`, `kk < cols`, is `src` itself
    // (asserted: `rows * cols` elements), borrowed shared for the call, so not written;
    // `stride = cols >= k = cols`; `dst` holds `cols * rows` values (`ld = rows >= n`).
    unsafe { copy_row_major(Src(src.as_ptr()), cols, (rows, rows), dst, false) }
}

/// `dst[kk * ld + nn] = src[nn * stride + kk]` for the `k = dst.len() / ld` rows of `dst`, a
/// band of `TILE` rows a task (the padding between `n` and `ld` is left as it is).
///
/// # Safety
/// As `with_row_major`'s, `dst` holding `k * ld` values, `ld >= n`.
unsafe fn copy_row_major<T: Copy + Default + Send + Sync>(
    src: Src<T>,
    stride: usize,
    (n, ld): (usize, usize),
    dst: &mut [T],
    parallel: bool,
) {
    if n == 0 {
        return;
    }
    let band = |(b, rows): (usize, &mut [T])| {
        let k0 = b * TILE;
        let kn = rows.len() / ld;
        #[cfg(target_arch = "x86_64")]
        if std::mem::size_of::<T>() == 4 {
            // SAFETY: `T` is 4 bytes (f32: the caller's contract), read and written as `u32`
            // bit patterns; the band's reads are the caller's view, its writes `rows`.
            unsafe {
                band_4x4(
                    src.get() as *const u32,
                    stride,
                    (k0, kn, n, ld),
                    rows.as_mut_ptr() as *mut u32,
                )
            };
            return;
        }
        let mut tile = [[T::default(); TILE]; TILE];
        for n0 in (0..n).step_by(TILE) {
            let nn = (n - n0).min(TILE);
            for (j, row) in tile.iter_mut().enumerate().take(nn) {
                // SAFETY: `(n0 + j) * stride + k0 + i` for `i < kn` is inside the view.
                let col = unsafe {
                    std::slice::from_raw_parts(src.get().add((n0 + j) * stride + k0), kn)
                };
                row[..kn].copy_from_slice(col);
            }
            for i in 0..kn {
                let out = &mut rows[i * ld + n0..][..nn];
                for (j, o) in out.iter_mut().enumerate() {
                    *o = tile[j][i];
                }
            }
        }
    };
    if parallel {
        use rayon::prelude::*;
        let _quiet = crate::team::Quiet::new();
        dst.par_chunks_mut(TILE * ld).enumerate().for_each(band);
    } else {
        dst.chunks_mut(TILE * ld).enumerate().for_each(band);
    }
}

/// `band_4x4`'s copy of the `kn` rows from `k0` of the view, `rows[i * ld + j] =
/// src[j * stride + k0 + i]`, four columns at a time: each 4 x 4 block is four unaligned
/// 16-byte loads down four columns, a transpose in registers (unpack and move, which move bits
/// and never round or quiet a NaN) and four stores along four rows, where the generic tile
/// moves every element alone. The copy of the big MLP's 1024 x 1024 weight, 4 MB: see
/// docs/PERFORMANCE.md.
///
/// # Safety
/// `src` holds the view of `with_row_major` (`(jj, kk)` at `jj * stride + kk` readable for
/// `jj < n`, `kk < k0 + kn`), and `rows` has room for `kn * ld` values (`ld >= n`),
/// overlapping nothing the view holds.
#[cfg(target_arch = "x86_64")]
unsafe fn band_4x4(
    src: *const u32,
    stride: usize,
    (k0, kn, n, ld): (usize, usize, usize, usize),
    rows: *mut u32,
) {
    use std::arch::x86_64::{
        _mm_loadu_ps, _mm_movehl_ps, _mm_movelh_ps, _mm_storeu_ps, _mm_unpackhi_ps, _mm_unpacklo_ps,
    };
    let whole = n - n % 4;
    for j0 in (0..whole).step_by(4) {
        let col = |j: usize| src.wrapping_add((j0 + j) * stride + k0) as *const f32;
        let mut i = 0;
        while i + 4 <= kn {
            // SAFETY: elements `i..i + 4` of columns `j0..j0 + 4` are inside the view (the
            // caller's contract: `i + 4 <= kn`, `j0 + 4 <= n`), and rows `i..i + 4` of
            // `rows` (each `ld >= n` long) have room for columns `j0..j0 + 4`. SSE is part of
            // x86_64.
            unsafe {
                let c0 = _mm_loadu_ps(col(0).add(i));
                let c1 = _mm_loadu_ps(col(1).add(i));
                let c2 = _mm_loadu_ps(col(2).add(i));
                let c3 = _mm_loadu_ps(col(3).add(i));
                let lo01 = _mm_unpacklo_ps(c0, c1);
                let lo23 = _mm_unpacklo_ps(c2, c3);
                let hi01 = _mm_unpackhi_ps(c0, c1);
                let hi23 = _mm_unpackhi_ps(c2, c3);
                let out = |r: usize| rows.add((i + r) * ld + j0) as *mut f32;
                _mm_storeu_ps(out(0), _mm_movelh_ps(lo01, lo23));
                _mm_storeu_ps(out(1), _mm_movehl_ps(lo23, lo01));
                _mm_storeu_ps(out(2), _mm_movelh_ps(hi01, hi23));
                _mm_storeu_ps(out(3), _mm_movehl_ps(hi23, hi01));
            }
            i += 4;
        }
        for i in i..kn {
            for j in 0..4 {
                // SAFETY: as above, one element.
                unsafe { *rows.add(i * ld + j0 + j) = *src.add((j0 + j) * stride + k0 + i) };
            }
        }
    }
    for j in whole..n {
        for i in 0..kn {
            // SAFETY: as above, one element of the last columns.
            unsafe { *rows.add(i * ld + j) = *src.add(j * stride + k0 + i) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `with_row_major`'s copy of the `k x n` view of `src` (column stride `stride`), read back
    /// without its padding, after checking the row stride it was given.
    fn copied<T: Copy + Default + Send + Sync>(
        src: &[T],
        stride: usize,
        (k, n): (usize, usize),
        parallel: bool,
    ) -> Vec<T> {
        assert!(n == 0 || (n - 1) * stride + k <= src.len());
        // SAFETY: the view is inside `src` (asserted), read-only, `stride >= k` at every
        // call below; the reads stay inside the copy's `k` rows of `ld` values.
        unsafe {
            with_row_major(src.as_ptr(), stride, (k, n), parallel, |p, ld| {
                assert_eq!(ld, padded_row::<T>(n));
                (0..k)
                    .flat_map(|kk| std::slice::from_raw_parts(p.add(kk * ld), n).to_vec())
                    .collect()
            })
        }
    }

    /// Copies of a strided view, serial and parallel, at sizes around the tile and the
    /// parallel threshold: every element lands at its row-major place.
    #[test]
    fn copies_every_element_to_its_row_major_place() {
        for (k, n, pad) in [
            (1, 1, 0),
            (17, 5, 3),
            (16, 16, 0),
            (64, 300, 7),
            (300, 257, 1),
            // Rows of 1 KB and 2 KB: copied with a line of padding a row (`padded_row`).
            (37, 256, 2),
            (70, 512, 0),
        ] {
            let stride = k + pad;
            // Every bit pattern, NaNs with payloads included, is moved as it is.
            let src: Vec<f32> = (0..n * stride)
                .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)))
                .collect();
            for parallel in [false, true] {
                let got = copied(&src, stride, (k, n), parallel);
                for kk in 0..k {
                    for nn in 0..n {
                        assert_eq!(
                            got[kk * n + nn].to_bits(),
                            src[nn * stride + kk].to_bits(),
                            "{k}x{n} at {kk},{nn}"
                        );
                    }
                }
            }
        }
    }

    /// f64 rows of 1 KB (128 values) are padded too, through the generic tile path.
    #[test]
    fn f64_rows_of_a_kilobyte_are_copied_padded() {
        let (k, n, stride) = (21, 128, 23);
        let src: Vec<f64> = (0..n * stride).map(|i| i as f64 * 1.5 - 7.0).collect();
        assert_eq!(padded_row::<f64>(n), n + 8);
        for parallel in [false, true] {
            let got = copied(&src, stride, (k, n), parallel);
            for kk in 0..k {
                for nn in 0..n {
                    assert_eq!(got[kk * n + nn], src[nn * stride + kk], "{kk},{nn}");
                }
            }
        }
    }

    /// A product through the copy is bit-identical to the library's own column-major path,
    /// at shapes the copy is taken for, whole (at most 64 rows: the smallest `m * n` above
    /// 256 among them) and chunk by chunk (more rows: `k = 700`, which the library's
    /// small-product path would block otherwise; `n` not a whole number of chunks; 1024-wide
    /// rows, copied padded), in f32 and f64, on one core and on two; at and below 256 it is
    /// not taken (the library's other kernel would sum in another order).
    #[test]
    fn the_copied_product_is_the_same_bits() {
        assert!(!worth_copying((2, 128, 4096), [1, 4096], [128, 1]));
        assert!(!in_chunks(64, 1024, 4, false) && in_chunks(65, 1024, 4, false));
        // On the pool, only with a chunk for every thread.
        let threads = rayon::current_num_threads();
        assert!(in_chunks(65, 128 * threads, 4, true) && in_chunks(65, 64 * threads, 8, true));
        assert!(!in_chunks(65, 128 * threads - 1, 4, true));
        fn check<T: Copy + PartialEq + std::fmt::Debug + From<f32> + Into<f64> + 'static>(
            (m, n, k): (usize, usize, usize),
            dtype: tessera_ir::DType,
            par: gemm::Parallelism,
        ) {
            assert!(worth_copying((m, n, k), [1, k as isize], [n as isize, 1]));
            let a: Vec<T> = (0..m * k)
                .map(|i| T::from(((i * 7919) % 1000) as f32 / 997.0 - 0.5))
                .collect();
            // W is n x k row-major; the operand is W^T, column-major.
            let w: Vec<T> = (0..n * k)
                .map(|i| T::from(((i * 104_729) % 1000) as f32 / 991.0 - 0.5))
                .collect();
            let zero = T::from(0.0);
            let mut direct = vec![zero; m * n];
            let mut copied = vec![zero; m * n];
            let before = COPIES.load(Ordering::Relaxed);
            let chunked = CHUNKED.with(|c| c.get());
            // SAFETY: every view is inside its vector, `m x k`, `k x n` (column-major, stride
            // k) and `m x n`; the output does not overlap the operands.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    direct.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    zero,
                    T::from(1.0),
                    false,
                    false,
                    false,
                    par,
                );
                crate::exec::gemm_view(
                    dtype,
                    (m, n, k),
                    (a.as_ptr() as *const u8, [k as isize, 1]),
                    (w.as_ptr() as *const u8, [1, k as isize]),
                    (copied.as_mut_ptr() as *mut u8, [n as isize, 1]),
                    par,
                );
            }
            assert!(
                COPIES.load(Ordering::Relaxed) > before,
                "gemm_view took the copy"
            );
            let parallel = !matches!(par, gemm::Parallelism::None);
            let size = std::mem::size_of::<T>();
            assert_eq!(
                CHUNKED.with(|c| c.get()) - chunked,
                usize::from(in_chunks(m, n, size, parallel)),
                "{m}x{n}x{k} chunk by chunk"
            );
            let bits = |v: &[T]| v.iter().map(|&x| x.into().to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&direct),
                bits(&copied),
                "{m}x{n}x{k} {dtype:?} {par:?}"
            );
        }
        let shapes = [
            (16, 128, 512),
            (3, 128, 4096),
            (2, 1024, 512),
            (64, 1024, 256),
            (65, 300, 700),
            (130, 1024, 64),
            (200, 129, 96),
            (70, 259, 64),
        ];
        let pars = [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)];
        for (shape, par) in shapes.into_iter().flat_map(|s| pars.map(|p| (s, p))) {
            // Where `sgemm.rs` computes f32 products (AVX2 hosts), the copy is the library's
            // f64 path alone; `sgemm`'s tests cover f32 in every layout there.
            if !crate::sgemm::available() {
                check::<f32>(shape, tessera_ir::DType::F32, par);
            }
            check::<f64>(shape, tessera_ir::DType::F64, par);
        }
    }

    /// The chunks cover every column once (`n` of 2.5 chunks, of less than one, and of more
    /// chunks than threads), serial and parallel, none narrower than a chunk or the whole
    /// `n`, every chunk's copy has the row stride `padded_row` gives its width, and two
    /// copies share scratch only when one thread made both.
    #[test]
    fn chunks_cover_every_column_once() {
        for ((k, n, stride), parallel) in [(5, 320, 7), (3, 100, 3), (4, 1100, 5)]
            .into_iter()
            .flat_map(|s| [(s, false), (s, true)])
        {
            let src: Vec<f32> = (0..n * stride).map(|i| i as f32).collect();
            let seen = std::sync::Mutex::new(vec![0u32; k * n]);
            let regions = std::sync::Mutex::new(Vec::new());
            // SAFETY: the `k x n` view with column stride `stride >= k` is inside `src`
            // (`(n - 1) * stride + k <= n * stride`), read-only; the reads stay inside each
            // chunk's `k` rows of `ld` values.
            unsafe {
                with_row_major_chunks(src.as_ptr(), stride, (k, n), parallel, |n0, nn, c, ld| {
                    assert_eq!(ld, padded_row::<f32>(nn));
                    assert!(nn >= chunk_columns::<f32>().min(n), "{nn} of {n}");
                    let mut seen = seen.lock().unwrap();
                    let here = std::thread::current().id();
                    let span = (c as usize, c.add(k * ld) as usize, here);
                    regions.lock().unwrap().push(span);
                    for kk in 0..k {
                        for j in 0..nn {
                            assert_eq!(*c.add(kk * ld + j), src[(n0 + j) * stride + kk]);
                            seen[kk * n + n0 + j] += 1;
                        }
                    }
                })
            };
            assert!(seen.into_inner().unwrap().iter().all(|&s| s == 1));
            // Two chunks' copies overlap only when one thread made both, one after the other.
            let regions = regions.into_inner().unwrap();
            for (i, a) in regions.iter().enumerate() {
                for b in &regions[i + 1..] {
                    assert!(a.1 <= b.0 || b.1 <= a.0 || a.2 == b.2, "{a:?} {b:?}");
                }
            }
        }
    }

    /// A narrow row-major product of a transposed left operand, computed column-major and
    /// copied out, has the bits of the library's own row-major path (which transposes the
    /// product), in f32 and f64, on one core and on every core, at the big MLP's shapes and
    /// at odd ones; a row-major left operand or a wide result keeps the direct path.
    #[test]
    fn a_narrow_product_through_a_column_major_result_is_the_same_bits() {
        assert!(!narrow_column_result((1024, 10, 512), [512, 1], [10, 1]));
        assert!(!narrow_column_result((1024, 17, 512), [1, 1024], [17, 1]));
        assert!(!narrow_column_result((1024, 1, 512), [1, 1024], [1, 1]));
        assert!(!narrow_column_result((63, 10, 512), [1, 63], [10, 1]));
        for (m, n, k) in [
            (1024, 10, 512),
            (1024, 10, 64),
            (2048, 16, 1024),
            (784, 2, 512),
            (100, 3, 50),
            (65, 7, 1),
        ] {
            assert!(narrow_column_result(
                (m, n, k),
                [1, m as isize],
                [n as isize, 1]
            ));
            // The left operand is `h^T` for a row-major `k x m` h; the right is row-major.
            let h: Vec<f64> = (0..k * m)
                .map(|i| ((i * 7919) % 1013) as f64 * 0.001 - 0.5)
                .collect();
            let g: Vec<f64> = (0..k * n)
                .map(|i| ((i * 104_729) % 1009) as f64 * 0.001 - 0.5)
                .collect();
            for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(0)] {
                fn both<T: Copy + Default + PartialEq + std::fmt::Debug + 'static>(
                    (m, n, k): (usize, usize, usize),
                    (h, g): (&[T], &[T]),
                    dtype: tessera_ir::DType,
                    par: gemm::Parallelism,
                ) {
                    let mut direct = vec![T::default(); m * n];
                    let mut narrow = vec![T::default(); m * n];
                    let before = NARROW.load(Ordering::Relaxed);
                    let ls = [1, m as isize];
                    let (rs, os) = ([n as isize, 1], [n as isize, 1]);
                    // SAFETY: `h^T` (m x k, strides [1, m]), `g` (k x n) and the results
                    // (m x n row-major) lie inside their vectors; the results overlap neither
                    // operand.
                    unsafe {
                        crate::exec::gemm_dense_for_tests(
                            dtype,
                            (m, n, k),
                            (h.as_ptr() as *const u8, ls),
                            (g.as_ptr() as *const u8, rs),
                            (direct.as_mut_ptr() as *mut u8, os),
                            par,
                        );
                        crate::exec::gemm_view(
                            dtype,
                            (m, n, k),
                            (h.as_ptr() as *const u8, ls),
                            (g.as_ptr() as *const u8, rs),
                            (narrow.as_mut_ptr() as *mut u8, os),
                            par,
                        );
                    }
                    assert!(
                        NARROW.load(Ordering::Relaxed) > before,
                        "the narrow path taken"
                    );
                    assert_eq!(direct, narrow, "{m}x{n}x{k} {dtype:?}");
                }
                let h32: Vec<f32> = h.iter().map(|&x| x as f32).collect();
                let g32: Vec<f32> = g.iter().map(|&x| x as f32).collect();
                // As in `the_copied_product_is_the_same_bits`: f32 goes to `sgemm.rs` there.
                if !crate::sgemm::available() {
                    both((m, n, k), (&h32, &g32), tessera_ir::DType::F32, par);
                }
                both((m, n, k), (&h, &g), tessera_ir::DType::F64, par);
            }
        }
    }
}
