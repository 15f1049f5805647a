//! f32 products on hosts with AVX2 and FMA but no AVX-512 (Zen 3, Haswell to Alder Lake): a
//! packed, blocked product of our own, in place of the `gemm` crate's, whose split over two
//! cores ran the big MLP's 512 x 1024 x 1024 product at 95-130 GFLOP/s where one core alone
//! reached 80-88 (Zen 3, docs/PERFORMANCE.md, "twenty-fourth pass"). On AVX-512 hosts the
//! library's wider kernel stays (`available`).
//!
//! The scheme is the usual one (Goto, BLIS): the right operand is packed into panels of
//! `NR` columns, one contraction block after another; each task packs its own block of rows
//! of the left operand into panels of `MR` rows and runs the `MR x NR` register kernel (12
//! accumulators, the 6 x 16 FMA tile of BLIS's Haswell kernel) over every pair of panels. Both
//! phases hand out their tasks through an atomic counter to every thread that joins
//! (`spread`), so a core the machine takes away for a while leaves its tasks to the other
//! instead of holding the product up: a static halving waits for the slower half.
//!
//! The sums. Each result element is a chain of multiply-adds over each contraction block,
//! from zero, in order; the blocks' sums are added to the result one after another. The block
//! length depends on `k` alone (`block`), and a task's tile is computed by the same kernel
//! whichever thread takes it, so a product gives the same bits on one thread or several,
//! whatever the layouts of its operands (`tests`): a shared product's elected member and
//! devices run in turn on one thread (`exec::multiply_shared`) agree. (Up to NaN payloads,
//! which the transposed orientation of a narrow product may pick from the other operand; and
//! a caller's flush-to-zero reaches the team's helper, `team::join`, but not a rayon worker
//! off the team, as with the library.)
//!
//! Any (row, column) strides: the packing reads either layout (a transposed operand is a
//! packing order, not a copy), and a result tile with unit column stride is written from the
//! registers, any other through a small buffer.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The register tile: rows of the left operand, columns of the right.
const MR: usize = 6;
const NR: usize = 16;
/// The longest contraction block: a kernel's panels (`KC x (MR + NR)` values, 22 KiB) stay in
/// a 32 KiB L1.
const KC: usize = 256;
/// The most rows a compute task takes (a multiple of `MR`): its packed left block (`60 x KC`,
/// 60 KiB) stays in L2. The rows are shared out in whole panels as evenly as the tasks allow,
/// in a number of tasks that is a multiple of the threads (`row_tasks`).
const TASK_ROWS: usize = 60;
/// The packed right operand of one column block at most this many values (8 MiB), or `NR`
/// columns of it when the contraction is longer than `PACKED_RIGHT / NR`: the right operand
/// is packed a column block at a time, every contraction block of it.
const PACKED_RIGHT: usize = 2 << 20;
/// At most this many right panels, a compute task reads a left operand with a unit stride in
/// place (`compute`).
const IN_PLACE: usize = 4;
/// At most this many result rows, the right operand's full panels are read in place when its
/// columns have a unit stride: each is read by at most two left panels, and packing it cost
/// more than the product (the small CNN's kernel gradient, each of its halves 9 x 16 x 4096: 33 against 14 us
/// alone, Zen 3). With more, a panel packed once stays in L1 for every left panel: in place,
/// rows 4 KiB apart share L1 sets.
const IN_PLACE_ROWS: usize = 2 * MR;
/// Right panels a packing task takes.
const PACK_PANELS: usize = 8;

/// Whether `exec::gemm_view` computes f32 products here: an x86-64 host with AVX2 and FMA
/// and without AVX-512F (where the library's AVX-512 kernel and `thin.rs` run), and
/// `TESSERA_NO_SGEMM` unset (to measure the library).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE
        .get_or_init(|| supported() && !avx512() && std::env::var_os("TESSERA_NO_SGEMM").is_none())
}

/// Whether `exec::gemm_view` computes this f32 product here: `available()`, and a product the
/// library does not send to its vector kernels (a contraction of 1 or 2, whose sums the
/// interpreter's match bit for bit, or a single row or column: matrix-vector products, where
/// most of a register tile would be padding), nor a wide result of a short contraction (at
/// most 16, more than `IN_PLACE` panels: writing the result is the work, and `exec.rs`'s
/// `row_parts` splits it better; the big MLP's `g @ W^T`, 512 x 1024 x 10, 253-591 us here
/// against 222-321 there, three alternating profiles, Zen 3).
pub(crate) fn plan((m, n, k): (usize, usize, usize)) -> bool {
    let short_and_wide = k <= 16 && n > IN_PLACE * NR;
    m >= 2 && n >= 2 && (3..=MAX_K).contains(&k) && !short_and_wide && available()
}

/// The longest contraction computed here (`plan`): a column block packs at least `NR` columns
/// of all of it, `MAX_K * NR` f32 (64 MiB), kept by the calling thread.
const MAX_K: usize = 1 << 20;

/// The host can run the kernel (AVX2 and FMA).
fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The contraction block for a contraction of `k`: at most `KC`, the blocks as even as
/// possible. A function of `k` alone: the sums do not depend on the split (module doc).
fn block(k: usize) -> usize {
    k.div_ceil(k.div_ceil(KC).max(1)).max(1)
}

#[cfg(test)]
thread_local! {
    /// How many products `run` was called for on this thread (tests: `gemm_view` sends f32
    /// products here).
    static RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// The calling thread's packed right operand and each thread's packed left block, kept
    /// for the thread's next product (`transpose::with_scratch`: a step allocates nothing once
    /// warm, `tests/allocations.rs` of the tessera crate; a product inside another on the same
    /// thread gets a buffer of its own).
    static RIGHT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static LEFT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// A strided f32 view: address and (row, column) strides in elements.
#[derive(Clone, Copy)]
struct View {
    at: *mut f32,
    rows: isize,
    cols: isize,
}

impl View {
    /// The address of element `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` must be inside the view the caller vouches for.
    unsafe fn at(self, i: usize, j: usize) -> *mut f32 {
        // SAFETY: the caller's: the element is inside the view's buffer, so the offset stays
        // inside one allocation.
        unsafe {
            self.at
                .offset(i as isize * self.rows)
                .offset(j as isize * self.cols)
        }
    }
}

/// What the threads of one product share: the three views, the packed right block and the
/// shape. Sent to the threads that join (`spread`).
struct Product {
    left: View,
    right: View,
    out: View,
    m: usize,
    k: usize,
    kc: usize,
    /// The packed right block: `k * panels * NR` values.
    packed: *mut f32,
    /// Full right panels are read in place, not packed (`IN_PLACE_ROWS`).
    right_in_place: bool,
    /// The column block: its first column and its number of columns.
    cols: (usize, usize),
    /// Compute tasks: `row_tasks` row tasks (`rows_of_task`), each split in `parts` column
    /// parts of `part_panels` panels.
    row_tasks: usize,
    parts: usize,
    part_panels: usize,
}

/// How many row tasks share `m` rows on `threads` threads: enough for at most `TASK_ROWS`
/// rows each, and a multiple of the threads (while there are rows enough), so that tasks of
/// near-equal size come out even. With `TASK_ROWS` a task, the big MLP's 512 rows made 8
/// tasks of 60 and one of 32, and 784 rows 13 of 60 and one of 4: at the end one thread
/// computed a whole task while the other waited (a 784-row product's two threads 420
/// and 364 rows).
fn row_tasks(m: usize, threads: usize) -> usize {
    let panels = m.div_ceil(MR);
    let tasks = panels.div_ceil(TASK_ROWS / MR).max(1);
    match threads {
        0 | 1 => tasks,
        _ => tasks.next_multiple_of(threads).min(panels.max(1)),
    }
}

/// Rows `(first, count)` of row task `t` of `tasks` over `m` rows: whole panels of `MR`
/// shared out evenly (each task's share at most `TASK_ROWS`, `row_tasks`), the last panel
/// possibly short.
fn rows_of_task(m: usize, tasks: usize, t: usize) -> (usize, usize) {
    let panels = m.div_ceil(MR);
    let (p0, p1) = (t * panels / tasks, (t + 1) * panels / tasks);
    let i0 = (p0 * MR).min(m);
    (i0, (p1 * MR).min(m) - i0)
}

// SAFETY: the threads (sharing `&Product`) only read `left`, `right` and (after the packing
// phase, which `spread` finishes before the compute phase starts) `packed`; the packing tasks
// write disjoint panels of `packed`, and the compute tasks disjoint tiles of `out` (distinct
// elements at distinct addresses, `run`'s contract), every address inside the views the
// caller of `run` vouches for, alive until `run` returns, after every thread is done.
unsafe impl Sync for Product {}

/// `out = left x right` over `(m, n, k)` f32 views, each an address and (row, column)
/// strides in elements, on every core when `parallel` (`spread`). `k == 0` writes zeros.
///
/// # Safety
/// `available()` (or, in tests, `supported()`); `k <= MAX_K`; the views must lie inside live
/// f32 buffers, distinct elements of `out` at distinct addresses and `out` not overlapping
/// the operands.
pub(crate) unsafe fn run(
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const f32, [isize; 2]),
    (r, rs): (*const f32, [isize; 2]),
    (o, os): (*mut f32, [isize; 2]),
    parallel: bool,
) {
    #[cfg(test)]
    RUNS.with(|r| r.set(r.get() + 1));
    // SAFETY: the caller's contract.
    unsafe { multiply((m, n, k), (l, ls), (r, rs), (o, os), parallel) }
}

/// `run`'s product.
///
/// # Safety
/// As `run`'s.
unsafe fn multiply(
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const f32, [isize; 2]),
    (r, rs): (*const f32, [isize; 2]),
    (o, os): (*mut f32, [isize; 2]),
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    // A narrow result (a classifier's 10 columns) of a left operand that must be packed (no
    // unit stride, `compute`'s `IN_PLACE`) would pack all of it for a few columns: computed transposed,
    // `out^T = right^T x left^T`, the long side is the right one, packed once into full
    // panels. The same sums (each a chain over `k` in order), only the roles swapped.
    if n < m && n % NR != 0 && n <= IN_PLACE * NR && ls[0] != 1 && ls[1] != 1 {
        let t = |s: [isize; 2]| [s[1], s[0]];
        // SAFETY: the same views, transposed.
        unsafe { multiply((n, m, k), (r, t(rs)), (l, t(ls)), (o, t(os)), parallel) };
        return;
    }
    let out = View {
        at: o,
        rows: os[0],
        cols: os[1],
    };
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: `(i, j)` is inside the caller's `m x n` view of `out`.
                unsafe { *out.at(i, j) = 0.0 };
            }
        }
        return;
    }
    let block_cols = (PACKED_RIGHT / k / NR * NR).clamp(NR, n.div_ceil(NR) * NR);
    // At most `max(PACKED_RIGHT, MAX_K * NR)` values (`run`'s contract): no overflow.
    let len = k * block_cols;
    crate::transpose::with_scratch::<f32, _>(&RIGHT, len, |scratch| {
        // The scratch's words hold at least `len` f32 (`with_scratch`).
        let packed = scratch.as_mut_ptr() as *mut f32;
        // SAFETY: the caller's contract; `packed` holds `k * block_cols` values.
        unsafe {
            blocks(
                (m, n, k),
                (l, ls),
                (r, rs),
                out,
                (packed, block_cols),
                parallel,
            )
        }
    })
}

/// `multiply`'s product with its right operand packed into `packed`, a column block of
/// `block_cols` (a multiple of `NR`) at a time.
///
/// # Safety
/// As `run`'s; `packed` holds `k * block_cols` values.
unsafe fn blocks(
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const f32, [isize; 2]),
    (r, rs): (*const f32, [isize; 2]),
    out: View,
    (packed, block_cols): (*mut f32, usize),
    parallel: bool,
) {
    let kc = block(k);
    let threads = if parallel { crate::team::threads() } else { 1 };
    let row_tasks = row_tasks(m, threads);
    let mut product = Product {
        left: View {
            at: l as *mut f32,
            rows: ls[0],
            cols: ls[1],
        },
        right: View {
            at: r as *mut f32,
            rows: rs[0],
            cols: rs[1],
        },
        out,
        m,
        k,
        kc,
        packed,
        right_in_place: rs[1] == 1 && m <= IN_PLACE_ROWS,
        cols: (0, 0),
        row_tasks,
        parts: 1,
        part_panels: 0,
    };
    for j0 in (0..n).step_by(block_cols) {
        let nc = (n - j0).min(block_cols);
        let panels = nc.div_ceil(NR);
        // Enough tasks for every thread to take several: short products split their columns.
        let parts = match threads {
            1 => 1,
            _ => (4 * threads).div_ceil(row_tasks).clamp(1, panels),
        };
        product.cols = (j0, nc);
        product.parts = parts;
        product.part_panels = panels.div_ceil(parts);
        let p = &product;
        let chunks = panels.div_ceil(PACK_PANELS);
        // Nothing to pack when every panel is full and read in place.
        let packs = match p.right_in_place && nc % NR == 0 {
            true => 0,
            false => k.div_ceil(kc) * chunks,
        };
        let next = AtomicUsize::new(0);
        if packs > 0 {
            spread(threads, &|| {
                loop {
                    let t = next.fetch_add(1, Ordering::Relaxed);
                    if t >= packs {
                        break;
                    }
                    // SAFETY: task `t` is taken once (the counter), and packs its own panels.
                    unsafe { pack_right(p, t / chunks, t % chunks) };
                }
            });
        }
        let tasks = row_tasks * parts;
        let next = AtomicUsize::new(0);
        let left_len = TASK_ROWS.div_ceil(MR) * MR * kc;
        spread(threads, &|| {
            crate::transpose::with_scratch::<f32, _>(&LEFT, left_len, |scratch| {
                // SAFETY: the scratch holds at least `left_len` f32 (its words, 8-aligned,
                // every bit pattern an f32), this thread's own while the closure runs.
                let left = unsafe {
                    std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut f32, left_len)
                };
                loop {
                    let t = next.fetch_add(1, Ordering::Relaxed);
                    if t >= tasks {
                        break;
                    }
                    // SAFETY: task `t` is taken once, and writes its own tiles; `left` holds a
                    // task's packed block.
                    unsafe { compute(p, t / parts, t % parts, left) };
                }
            })
        });
    }
}

/// Runs `work` on `threads` threads at once (the team's helper or rayon's workers), or once
/// here. Every call runs the same loop over a shared counter, so whichever threads come do
/// all the tasks: a `work` that finds no task left returns.
fn spread(threads: usize, work: &(dyn Fn() + Sync)) {
    match threads {
        0 | 1 => work(),
        2 => {
            crate::team::join(work, work);
        }
        _ => {
            let half = threads / 2;
            rayon::join(|| spread(half, work), || spread(threads - half, work));
        }
    }
}

/// Packs chunk `chunk` (panels `chunk * PACK_PANELS ..`) of contraction block `kb` of the
/// column block `p.cols` of the right operand: panel `q` of block `kb` (at `k0 = kb * kc`,
/// `kcc` long) holds, for each `kk`, the `NR` values of row `k0 + kk` of its columns, zeros
/// past the block's last column, at `k0 * panels * NR + q * kcc * NR`.
///
/// Row by row across the chunk's panels when the columns have a unit stride (each row's
/// `PACK_PANELS * NR` values are one contiguous read: a panel at a time, rows 4 KiB apart,
/// took 4% of the big MLP step's samples with this and the transposed copy, `perf`, Zen 3);
/// eight by eight through registers (`transposed`) when the rows have one.
///
/// # Safety
/// `run`'s views; no other task packs the same chunk.
unsafe fn pack_right(p: &Product, kb: usize, chunk: usize) {
    let (j0, nc) = p.cols;
    let panels = nc.div_ceil(NR);
    let k0 = kb * p.kc;
    let kcc = (p.k - k0).min(p.kc);
    let q0 = chunk * PACK_PANELS;
    let q1 = (q0 + PACK_PANELS).min(panels);
    // Panel `q`'s first value in the packed buffer (inside it for `q < panels`: `k * panels *
    // NR` values; each use below is for such a `q`).
    let panel = |q: usize| p.packed.wrapping_add(k0 * panels * NR + q * kcc * NR);
    let packs = |q: usize| !(p.right_in_place && nc - q * NR >= NR);
    if p.right.cols == 1 {
        for kk in 0..kcc {
            for q in (q0..q1).filter(|&q| packs(q)) {
                let col = j0 + q * NR;
                let width = (nc - q * NR).min(NR);
                // SAFETY: row `k0 + kk`, columns `col .. col + width` are inside the view (unit
                // column stride: contiguous); the panel's row `kk` is inside the buffer.
                unsafe {
                    let (from, to) = (p.right.at(k0 + kk, col), panel(q).add(kk * NR));
                    if width == NR {
                        // A constant length: moves in registers, not a call.
                        std::ptr::copy_nonoverlapping(from, to, NR);
                    } else {
                        std::ptr::copy_nonoverlapping(from, to, width);
                        std::ptr::write_bytes(to.add(width), 0, NR - width);
                    }
                }
            }
        }
        return;
    }
    for q in (q0..q1).filter(|&q| packs(q)) {
        let col = j0 + q * NR;
        let width = (nc - q * NR).min(NR);
        let to = panel(q);
        let mut done = 0;
        if p.right.rows == 1 && width == NR {
            // SAFETY: the panel's `NR` columns (`width == NR`: all inside the view) of `kcc`
            // rows from `k0` are inside the view, each column's values contiguous (unit row
            // stride), and the packed panel (`q < panels`) inside the buffer; the host runs
            // AVX2 (`run`'s contract).
            done = unsafe { transposed(p.right.at(k0, col), p.right.cols, to, kcc) };
        }
        // Down each column (a transposed operand reads along its contiguous dimension).
        for j in 0..NR {
            for kk in done..kcc {
                let v = match j < width {
                    // SAFETY: `(k0 + kk, col + j)` is inside the view.
                    true => unsafe { *p.right.at(k0 + kk, col + j) },
                    false => 0.0,
                };
                // SAFETY: inside the panel.
                unsafe { *to.add(kk * NR + j) = v };
            }
        }
    }
}

/// Packs the first multiple of 8 of `kcc` rows of a right panel whose rows have a unit
/// stride (a transposed operand: column `j` is `kcc` contiguous values from `from + j *
/// stride`) into `to` (`kcc` rows of `NR`), eight rows of eight columns at a time through an
/// in-register transpose; returns how many rows it packed.
///
/// # Safety
/// The host runs AVX2; `from + j * stride + kk` is readable and `to + kk * NR + j` writable
/// for every `j < NR`, `kk < kcc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transposed(from: *const f32, stride: isize, to: *mut f32, kcc: usize) -> usize {
    use std::arch::x86_64::*;
    let rows = kcc / 8 * 8;
    for kk in (0..rows).step_by(8) {
        for h in 0..NR / 8 {
            // SAFETY: columns `8h .. 8h + 8`, rows `kk .. kk + 8` (`kk + 8 <= kcc`), inside
            // the caller's view and panel.
            unsafe {
                let columns: [__m256; 8] = std::array::from_fn(|j| {
                    _mm256_loadu_ps(from.offset((8 * h + j) as isize * stride).add(kk))
                });
                for (r, row) in transpose8(columns).into_iter().enumerate() {
                    _mm256_storeu_ps(to.add((kk + r) * NR + 8 * h), row);
                }
            }
        }
    }
    rows
}

/// No packing off x86-64: `run` is never called there.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn transposed(_: *const f32, _: isize, _: *mut f32, _: usize) -> usize {
    unreachable!("sgemm::run off x86-64")
}

/// The transpose of an 8 x 8 block: lane `i` of result `j` is lane `j` of `rows[i]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then pairs of pairs, then the two 128-bit halves.
    let t = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(s[0], s[4]),
        _mm256_permute2f128_ps::<0x20>(s[1], s[5]),
        _mm256_permute2f128_ps::<0x20>(s[2], s[6]),
        _mm256_permute2f128_ps::<0x20>(s[3], s[7]),
        _mm256_permute2f128_ps::<0x31>(s[0], s[4]),
        _mm256_permute2f128_ps::<0x31>(s[1], s[5]),
        _mm256_permute2f128_ps::<0x31>(s[2], s[6]),
        _mm256_permute2f128_ps::<0x31>(s[3], s[7]),
    ]
}

/// Packs rows `i0 .. i0 + rows` of contraction block `k0 .. k0 + kcc` of the left operand:
/// panel `p` holds, for each `kk`, the `MR` values of its rows at column `k0 + kk`, zeros past
/// the last row, at `p * kcc * MR`. A column-major operand copies each column's `MR`
/// contiguous values; a row-major one goes eight columns at a time through an in-register
/// transpose (`rows_transposed`). Value by value, the two took 5% of the big MLP step's
/// samples (`perf`, Zen 3).
///
/// # Safety
/// `run`'s views; `to` holds `rows.div_ceil(MR) * MR * kcc` values.
unsafe fn pack_left(
    p: &Product,
    (i0, rows): (usize, usize),
    (k0, kcc): (usize, usize),
    to: &mut [f32],
) {
    if p.left.rows == 1 {
        // Column-major (a transposed operand): each column's rows are contiguous, read whole
        // (`rows` values) into every panel's `MR` before the next column.
        for kk in 0..kcc {
            // SAFETY: `(i0 .. i0 + rows, k0 + kk)` are inside the view, contiguous, and
            // nothing writes the operand while the slice lives (`out` is apart from it).
            let column =
                unsafe { std::slice::from_raw_parts(p.left.at(i0, k0 + kk) as *const f32, rows) };
            for (panel, from) in column.chunks(MR).enumerate() {
                let to = &mut to[(panel * kcc + kk) * MR..][..MR];
                if let (Ok(to), Ok(from)) = (
                    <&mut [f32; MR]>::try_from(&mut *to),
                    <&[f32; MR]>::try_from(from),
                ) {
                    // A constant length: moves in registers, not a call.
                    *to = *from;
                } else {
                    to[..from.len()].copy_from_slice(from);
                    to[from.len()..].fill(0.0);
                }
            }
        }
        return;
    }
    for panel in 0..rows.div_ceil(MR) {
        let to = &mut to[panel * kcc * MR..(panel + 1) * kcc * MR];
        let row = i0 + panel * MR;
        let height = (rows - panel * MR).min(MR);
        let mut done = 0;
        if p.left.cols == 1 && height == MR {
            // SAFETY: the panel's `MR` rows (`height == MR`) of `kcc` values from `k0` are
            // inside the view, each row's contiguous, and `to` holds `kcc * MR`; the host runs
            // AVX2 (`run`'s contract).
            done = unsafe { rows_transposed(p.left.at(row, k0), p.left.rows, (to, kcc)) };
        }
        for i in 0..MR {
            for kk in done..kcc {
                to[kk * MR + i] = match i < height {
                    // SAFETY: `(row + i, k0 + kk)` is inside the view.
                    true => unsafe { *p.left.at(row + i, k0 + kk) },
                    false => 0.0,
                };
            }
        }
    }
}

/// Packs the first multiple of 8 of the `kcc` columns of `MR` row-major rows (row `i` from
/// `from + i * stride`, unit column stride) into `to`, column by column, eight columns at a
/// time through an in-register transpose (two rows of zeros below); returns how many columns
/// it packed.
///
/// # Safety
/// The host runs AVX2; `from + i * stride + kk` is readable for every `i < MR`, `kk < kcc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_transposed(
    from: *const f32,
    stride: isize,
    (to, kcc): (&mut [f32], usize),
) -> usize {
    use std::arch::x86_64::*;
    debug_assert!(to.len() >= kcc * MR);
    let cols = kcc / 8 * 8;
    for kk in (0..cols).step_by(8) {
        // SAFETY: rows `i < MR`, columns `kk .. kk + 8` (`kk + 8 <= kcc`) are inside the
        // caller's view.
        let rows: [__m256; 8] = std::array::from_fn(|i| match i < MR {
            true => unsafe { _mm256_loadu_ps(from.offset(i as isize * stride).add(kk)) },
            false => _mm256_setzero_ps(),
        });
        for (c, column) in transpose8(rows).into_iter().enumerate() {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 f32.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), column) };
            to[(kk + c) * MR..(kk + c + 1) * MR].copy_from_slice(&lanes[..MR]);
        }
    }
    cols
}

/// No packing off x86-64: `run` is never called there.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn rows_transposed(_: *const f32, _: isize, _: (&mut [f32], usize)) -> usize {
    unreachable!("sgemm::run off x86-64")
}

/// Compute task `(row_task, part)`: its rows (`rows_of_task`) by the columns of panels
/// `part * part_panels ..` of the column block, over every contraction block in order.
///
/// # Safety
/// `run`'s views, the right block packed; no other task computes the same `(row_task, part)`.
unsafe fn compute(p: &Product, row_task: usize, part: usize, left: &mut [f32]) {
    let (j0, nc) = p.cols;
    let panels = nc.div_ceil(NR);
    let (i0, rows) = rows_of_task(p.m, p.row_tasks, row_task);
    // `left` holds `TASK_ROWS` rows of a block (`row_tasks` keeps every task within it): the
    // packing and the kernel's reads of it below rely on this, so it is checked in every
    // build (once a task).
    assert!(rows <= TASK_ROWS, "a row task of {rows} rows");
    if rows == 0 {
        return;
    }
    let q0 = part * p.part_panels;
    let q1 = (q0 + p.part_panels).min(panels);
    if q0 >= q1 {
        // The last parts of a block with fewer panels than parts times `part_panels`.
        return;
    }
    let direct = p.out.cols == 1;
    // For a narrow result (a column block of at most `IN_PLACE` panels) a left operand with a unit
    // stride (row-major, or a transposed one) is read in place by the kernel, its `MR` rows
    // at their own addresses: packing it cost as much as the product (512 x 10 x 1024: 0.41
    // against 0.23 ms alone, Zen 3); a last panel of fewer than `MR` rows repeats its last
    // row. A wide result packs: read in place, the big MLP's step was 10%
    // slower (geomean of 12 alternating pairs), its rows' strides of 4 KiB sharing L1 sets.
    let unit = (p.left.cols == 1 || p.left.rows == 1) && panels <= IN_PLACE;
    for k0 in (0..p.k).step_by(p.kc) {
        let kcc = (p.k - k0).min(p.kc);
        let first = k0 == 0;
        if !unit {
            // SAFETY: `run`'s views; `left` holds `TASK_ROWS` rounded up to `MR` rows of `kc`.
            unsafe { pack_left(p, (i0, rows), (k0, kcc), left) };
        }
        for q in q0..q1 {
            let col = j0 + q * NR;
            let width = (nc - q * NR).min(NR);
            let b = match p.right_in_place && width == NR {
                // SAFETY: `(k0, col)` is inside the view (`k0 < k`, `col < n`).
                true => (unsafe { p.right.at(k0, col) } as *const f32, p.right.rows),
                // SAFETY: panel `q` of this block, inside the packed buffer.
                false => (
                    unsafe { p.packed.add(k0 * panels * NR + q * kcc * NR) } as *const f32,
                    NR as isize,
                ),
            };
            for panel in 0..rows.div_ceil(MR) {
                let row = i0 + panel * MR;
                let height = (p.m - row).min(MR);
                // The kernel's `MR` left rows: in place, a short last panel repeats its last
                // row (read, never written: the tile path below stores `height` rows).
                let a = match unit {
                    true => (
                        // SAFETY: `(row + i.min(height - 1), k0)` is inside the view.
                        std::array::from_fn(|i| unsafe {
                            p.left.at(row + i.min(height - 1), k0) as *const f32
                        }),
                        p.left.cols,
                    ),
                    false => {
                        let panel = left[panel * kcc * MR..].as_ptr();
                        (std::array::from_fn(|i| panel.wrapping_add(i)), MR as isize)
                    }
                };
                if direct && height == MR && width == NR {
                    // SAFETY: the tile's `MR` rows of `NR` contiguous values are inside
                    // `out` (unit column stride), the `MR` left rows' columns `k0 .. k0 +
                    // kcc` inside their view or packed panel, the right panel's
                    // `kcc` rows of `NR` inside its view or the packed buffer, and the host
                    // runs AVX2 and FMA (`run`'s contract).
                    unsafe { kernel(kcc, a, b, p.out.at(row, col), p.out.rows, first) }
                } else {
                    let mut tile = [0.0f32; MR * NR];
                    // SAFETY: the tile buffer holds `MR` rows of `NR`; as above otherwise.
                    unsafe { kernel(kcc, a, b, tile.as_mut_ptr(), NR as isize, true) };
                    for i in 0..height {
                        for j in 0..width {
                            // SAFETY: `(row + i, col + j)` is inside `out`.
                            let to = unsafe { &mut *p.out.at(row + i, col + j) };
                            *to = match first {
                                true => tile[i * NR + j],
                                false => *to + tile[i * NR + j],
                            };
                        }
                    }
                }
            }
        }
    }
}

/// The register kernel: `c[i][j] (=|+=) sum over kk of rows[i][kk * a_k] * b[kk * b_k + j]`
/// for the `MR x NR` tile at `c` (rows `ldc` apart), each sum a chain of multiply-adds from
/// zero in `kk` order, added to `c` (or stored, `first`) once at the end. A packed left panel
/// is `(panel + i, MR)`, a packed right one `(b, NR)`; a view read in place its own strides.
///
/// # Safety
/// The host runs AVX2 and FMA; `rows[i] + kk * a_k` and `b + kk * b_k + j` are readable for
/// every `i < MR`, `j < NR`, `kk < kc`, and `c + i * ldc + j` is writable for every `i < MR`,
/// `j < NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel(
    kc: usize,
    (rows, a_k): ([*const f32; MR], isize),
    (b, b_k): (*const f32, isize),
    c: *mut f32,
    ldc: isize,
    first: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for kk in 0..kc {
        // SAFETY: `kk < kc`: the right panel's row `kk` and each left row's element `kk` are
        // inside them.
        unsafe {
            let b = b.offset(kk as isize * b_k);
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            let at = kk as isize * a_k;
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*rows[i].offset(at));
                acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: row `i` of the tile, `NR` values from `c + i * ldc`, is writable.
        unsafe {
            let c = c.offset(i as isize * ldc);
            for (h, v) in acc.iter().enumerate() {
                let c = c.add(8 * h);
                let v = match first {
                    true => *v,
                    false => _mm256_add_ps(_mm256_loadu_ps(c), *v),
                };
                _mm256_storeu_ps(c, v);
            }
        }
    }
}

/// No kernel off x86-64: `available` and `supported` are false there, so `run` is never
/// called.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel(
    _: usize,
    _: ([*const f32; MR], isize),
    _: (*const f32, isize),
    _: *mut f32,
    _: isize,
    _: bool,
) {
    unreachable!("sgemm::run off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strided `rows x cols` f32 matrix: its buffer, the index of element `(0, 0)` in it
    /// and (row, column) strides.
    struct Matrix {
        data: Vec<f32>,
        origin: usize,
        strides: [isize; 2],
    }

    /// Layouts: row-major, column-major, row-major rows 3 values longer, every other value
    /// of rows one value longer than twice (no unit stride: the left one is packed),
    /// row-major with both strides negative (the last element first in memory), and one
    /// unit stride with the other negative (the last row, or column, first: the fast
    /// packing paths taken with a negative stride beside them).
    #[derive(Clone, Copy, Debug)]
    enum Layout {
        Rows,
        Columns,
        Padded,
        Gapped,
        Reversed,
        Flipped,
        FlippedColumns,
    }

    impl Matrix {
        fn new(
            rows: usize,
            cols: usize,
            layout: Layout,
            value: impl Fn(usize, usize) -> f32,
        ) -> Matrix {
            let (len, strides) = match layout {
                Layout::Rows => (rows * cols, [cols as isize, 1]),
                Layout::Columns => (rows * cols, [1, rows as isize]),
                Layout::Padded => (rows * (cols + 3), [(cols + 3) as isize, 1]),
                Layout::Gapped => (rows * (2 * cols + 1), [(2 * cols + 1) as isize, 2]),
                Layout::Reversed => (rows * cols, [-(cols as isize), -1]),
                Layout::Flipped => (rows * cols, [-(cols as isize), 1]),
                Layout::FlippedColumns => (rows * cols, [1, -(rows as isize)]),
            };
            let origin = match layout {
                Layout::Reversed => len.saturating_sub(1),
                Layout::Flipped => rows.saturating_sub(1) * cols,
                Layout::FlippedColumns => cols.saturating_sub(1) * rows,
                _ => 0,
            };
            let mut m = Matrix {
                data: vec![f32::NAN; len],
                origin,
                strides,
            };
            for i in 0..rows {
                for j in 0..cols {
                    let at = m.index(i, j);
                    m.data[at] = value(i, j);
                }
            }
            m
        }

        fn index(&self, i: usize, j: usize) -> usize {
            let at =
                self.origin as isize + i as isize * self.strides[0] + j as isize * self.strides[1];
            usize::try_from(at).expect("inside the buffer")
        }

        fn get(&self, i: usize, j: usize) -> f32 {
            self.data[self.index(i, j)]
        }

        fn at(&self) -> *const f32 {
            self.data.as_ptr().wrapping_add(self.origin)
        }

        fn at_mut(&mut self) -> *mut f32 {
            self.data.as_mut_ptr().wrapping_add(self.origin)
        }
    }

    /// The sum `run` promises for element `(i, j)`: over each block of `block(k)` a chain of
    /// fused multiply-adds from zero, the blocks' sums added in order.
    fn model(a: &Matrix, b: &Matrix, (i, j): (usize, usize), k: usize) -> f32 {
        let kc = block(k);
        let mut c = 0.0f32;
        for k0 in (0..k).step_by(kc) {
            let mut acc = 0.0f32;
            for kk in k0..(k0 + kc).min(k) {
                acc = a.get(i, kk).mul_add(b.get(kk, j), acc);
            }
            c = if k0 == 0 { acc } else { c + acc };
        }
        c
    }

    fn product(
        (m, n, k): (usize, usize, usize),
        (a, b): (&Matrix, &Matrix),
        layout: Layout,
        parallel: bool,
    ) -> Matrix {
        let mut c = Matrix::new(m, n, layout, |_, _| f32::NAN);
        assert!(supported(), "only called where `runs_here`");
        let out = c.at_mut();
        // SAFETY: the three views are `m x k`, `k x n` and `m x n` inside their buffers
        // (`Matrix::new`: `at` is element (0, 0), every element at its own index), the result
        // apart from the operands; the host runs the kernel.
        unsafe {
            run(
                (m, n, k),
                (a.at(), a.strides),
                (b.at(), b.strides),
                (out, c.strides),
                parallel,
            )
        };
        c
    }

    /// Whether this host runs the kernel (AVX2 and FMA). Where it does not, the tests check
    /// that nothing sends a product here and say so.
    fn runs_here() -> bool {
        if supported() {
            return true;
        }
        assert!(
            !available() && !plan((64, 64, 64)),
            "no kernel, yet offered products"
        );
        eprintln!("sgemm: this host lacks AVX2 or FMA; only checked that no product comes here");
        false
    }

    fn value(seed: usize) -> impl Fn(usize, usize) -> f32 {
        move |i, j| ((i * 7919 + j * 104_729 + seed) % 1999) as f32 / 997.0 - 1.0
    }

    /// Every element is the promised sum, bit for bit, at shapes around the tile (6 x 16),
    /// the block (256), the in-place reads (`IN_PLACE`, `IN_PLACE_ROWS`) and the narrow-result
    /// transposition, in every layout of the three operands (negative strides included), on
    /// one thread and on several; and within the f32 error bound of an f64 reference (an
    /// index off by one breaks both).
    #[test]
    fn every_element_is_the_promised_sum_in_every_layout() {
        if !runs_here() {
            return;
        }
        let shapes = [
            (1, 1, 1),
            (6, 16, 3),
            (7, 17, 256),
            (5, 15, 257),
            (9, 32, 600),
            (13, 33, 520),
            (61, 10, 100),
            (130, 3, 40),
            (64, 70, 9),
            (121, 200, 300),
        ];
        // Operands: packed or read in place, forwards and backwards; results: written from
        // the registers (row strides n and n + 3) or through the tile buffer.
        let operands = [
            Layout::Rows,
            Layout::Columns,
            Layout::Gapped,
            Layout::Reversed,
        ];
        let results = [
            Layout::Rows,
            Layout::Columns,
            Layout::Padded,
            Layout::Reversed,
        ];
        // One negative stride beside a unit one, for either operand, into a row-major result.
        let flipped = [Layout::Flipped, Layout::FlippedColumns];
        let more = flipped
            .iter()
            .flat_map(|&f| [(f, Layout::Rows), (Layout::Columns, f), (f, f)])
            .map(|(a, b)| (a, b, Layout::Rows));
        for (m, n, k) in shapes {
            for (la, lb, lc) in operands
                .iter()
                .flat_map(|&a| {
                    operands
                        .iter()
                        .flat_map(move |&b| results.map(|c| (a, b, c)))
                })
                .chain(more.clone())
            {
                let a = Matrix::new(m, k, la, value(1));
                let b = Matrix::new(k, n, lb, value(2));
                for parallel in [false, true] {
                    let c = product((m, n, k), (&a, &b), lc, parallel);
                    for i in 0..m {
                        for j in 0..n {
                            let what =
                                format!("{m}x{n}x{k} {la:?} {lb:?} {lc:?} {parallel} ({i}, {j})");
                            assert_eq!(
                                c.get(i, j).to_bits(),
                                model(&a, &b, (i, j), k).to_bits(),
                                "{what}"
                            );
                            let (mut exact, mut size) = (0.0f64, 0.0f64);
                            for kk in 0..k {
                                let t = a.get(i, kk) as f64 * b.get(kk, j) as f64;
                                exact += t;
                                size += t.abs();
                            }
                            let bound = k as f64 * f32::EPSILON as f64 * size;
                            assert!((c.get(i, j) as f64 - exact).abs() <= bound, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// The big MLP's shapes give the same bits on one thread and on two (the tasks' split
    /// does not touch the sums), and so does a right operand of two column blocks
    /// (`PACKED_RIGHT`), packed or read in place.
    #[test]
    fn the_same_bits_on_one_thread_or_two_at_the_big_mlps_shapes() {
        if !runs_here() {
            return;
        }
        const { assert!(PACKED_RIGHT / 2000 < 1100, "two column blocks below") };
        for (m, n, k, lb) in [
            (512, 1024, 784, Layout::Columns),
            (1024, 10, 512, Layout::Columns),
            (512, 1024, 10, Layout::Columns),
            (2, 1100, 2000, Layout::Columns),
            (14, 1100, 2000, Layout::Rows),
            (12, 1100, 2000, Layout::Rows),
        ] {
            let a = Matrix::new(m, k, Layout::Rows, value(3));
            let b = Matrix::new(k, n, lb, value(4));
            let one = product((m, n, k), (&a, &b), Layout::Rows, false);
            let two = product((m, n, k), (&a, &b), Layout::Rows, true);
            assert!(
                one.data
                    .iter()
                    .zip(&two.data)
                    .all(|(x, y)| x.to_bits() == y.to_bits())
            );
            // Every element where that is quick, else a few.
            let every = m * n * k < 1 << 25;
            let all = (0..m).flat_map(|i| (0..n).map(move |j| (i, j)));
            let some = [(0, 0), (m - 1, n - 1), (m / 2, n / 3)];
            for (i, j) in all.filter(|_| every).chain(some) {
                let what = format!("{m}x{n}x{k} {lb:?} ({i}, {j})");
                assert_eq!(
                    one.get(i, j).to_bits(),
                    model(&a, &b, (i, j), k).to_bits(),
                    "{what}"
                );
            }
        }
    }

    /// Row tasks cover every row once, in order, at most `TASK_ROWS` each and in whole panels
    /// but the last; with two threads or more their number is a multiple of the threads (while
    /// there are panels enough) and their sizes differ by at most a panel: the big MLP's 512
    /// and 784 rows come out even on two threads.
    #[test]
    fn row_tasks_cover_the_rows_evenly() {
        for threads in [0, 1, 2, 3, 8] {
            for m in (1..=200).chain([511, 512, 513, 784, 1024, 4097]) {
                let tasks = row_tasks(m, threads);
                let mut next = 0;
                let (mut least, mut most) = (usize::MAX, 0);
                for t in 0..tasks {
                    let (i0, rows) = rows_of_task(m, tasks, t);
                    assert_eq!(i0, next, "m={m} threads={threads} task {t}");
                    assert!(rows > 0 && rows <= TASK_ROWS, "m={m} task {t}: {rows} rows");
                    assert!(i0 % MR == 0);
                    next += rows;
                    if i0 + rows < m {
                        assert_eq!(rows % MR, 0, "whole panels but the last");
                        least = least.min(rows);
                    }
                    most = most.max(rows);
                }
                assert_eq!(next, m, "m={m} threads={threads}");
                if least != usize::MAX {
                    assert!(most - least <= MR, "m={m}: {least}..{most} rows");
                }
                let panels = m.div_ceil(MR);
                if threads > 1 && panels >= threads * TASK_ROWS.div_ceil(MR) {
                    assert_eq!(tasks % threads, 0, "m={m} threads={threads}: {tasks}");
                }
            }
        }
        // 512 rows on two threads: 10 tasks of 8 or 9 panels, 43 panels a thread in turn.
        let half = |m: usize| -> usize {
            (0..row_tasks(m, 2))
                .step_by(2)
                .map(|t| rows_of_task(m, row_tasks(m, 2), t).1)
                .sum()
        };
        assert_eq!(row_tasks(512, 2), 10);
        assert!(half(512).abs_diff(512 - half(512)) <= MR);
        assert!(half(784).abs_diff(784 - half(784)) <= MR);
    }

    /// Infinities and NaNs reach exactly the elements whose sums they enter (the padding of a
    /// tile never leaks into a result); `k == 0` writes zeros, and an empty result nothing.
    #[test]
    fn specials_stay_in_their_rows_and_columns_and_k_zero_writes_zeros() {
        if !runs_here() {
            return;
        }
        let (m, n, k) = (13, 21, 300);
        let a = Matrix::new(m, k, Layout::Rows, |i, kk| match (i, kk) {
            (2, 5) => f32::INFINITY,
            (7, 299) => f32::NAN,
            _ => value(5)(i, kk),
        });
        let b = Matrix::new(k, n, Layout::Rows, |kk, j| match (kk, j) {
            (17, 20) => f32::NEG_INFINITY,
            _ => value(6)(kk, j),
        });
        let c = product((m, n, k), (&a, &b), Layout::Rows, true);
        for i in 0..m {
            for j in 0..n {
                let (got, want) = (c.get(i, j), model(&a, &b, (i, j), k));
                assert!(
                    got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                    "({i}, {j})"
                );
                assert_eq!(got.is_finite(), i != 2 && i != 7 && j != 20, "({i}, {j})");
            }
        }
        let empty = Matrix::new(4, 0, Layout::Rows, value(7));
        let c = product(
            (5, 3, 0),
            (&empty, &Matrix::new(0, 3, Layout::Rows, value(8))),
            Layout::Padded,
            true,
        );
        for i in 0..5 {
            for j in 0..3 {
                assert_eq!(c.get(i, j).to_bits(), 0.0f32.to_bits());
            }
        }
        // An empty result: nothing written (the buffer keeps its NaNs, and no view is read).
        let c = product(
            (0, 3, 4),
            (
                &Matrix::new(0, 4, Layout::Rows, value(9)),
                &Matrix::new(4, 3, Layout::Rows, value(9)),
            ),
            Layout::Rows,
            true,
        );
        assert!(c.data.is_empty());
    }

    /// `exec::gemm_view` sends an f32 product here exactly when `available()` (an AVX2 host
    /// without AVX-512, `TESSERA_NO_SGEMM` unset), whatever its layout, unless `plan` leaves
    /// it to the library; f64 never.
    #[test]
    fn gemm_view_sends_f32_products_here_on_avx2_hosts() {
        let (m, n, k) = (65, 7, 300);
        let a = Matrix::new(m, k, Layout::Columns, value(10));
        let b = Matrix::new(k, n, Layout::Rows, value(11));
        let mut c = vec![0.0f32; m * n];
        let a64: Vec<f64> = a.data.iter().map(|&x| x as f64).collect();
        let b64: Vec<f64> = b.data.iter().map(|&x| x as f64).collect();
        let mut c64 = vec![0.0f64; m * n];
        type Operand<'a, T> = (&'a [T], [isize; 2]);
        /// `gemm_view` on `(m, n, k)` views of the f32 or f64 vectors (the operands' strides
        /// those of this test's matrices, whose first rows and columns they are), row-major
        /// results; how many products came here.
        fn via_gemm_view<T: 'static>(
            (m, n, k): (usize, usize, usize),
            (a, b): (Operand<T>, Operand<T>),
            c: &mut [T],
        ) -> usize {
            use std::any::TypeId;
            let dtype = match TypeId::of::<T>() {
                t if t == TypeId::of::<f32>() => tessera_ir::DType::F32,
                t if t == TypeId::of::<f64>() => tessera_ir::DType::F64,
                _ => panic!("f32 or f64"),
            };
            assert!(c.len() >= m * n && a.0.len() >= m * k && b.0.len() >= k * n);
            let before = RUNS.with(std::cell::Cell::get);
            // SAFETY: `m x k`, `k x n` and `m x n` views inside their vectors (the operands'
            // strides are their full matrices', at least `m x k` and `k x n` here), the result
            // apart from the operands, of `dtype`'s type (`T`).
            unsafe {
                crate::exec::gemm_view(
                    dtype,
                    (m, n, k),
                    (a.0.as_ptr() as *const u8, a.1),
                    (b.0.as_ptr() as *const u8, b.1),
                    (c.as_mut_ptr() as *mut u8, [n as isize, 1]),
                    gemm::Parallelism::None,
                )
            };
            RUNS.with(std::cell::Cell::get) - before
        }
        let (a32, b32) = ((&a.data[..], a.strides), (&b.data[..], b.strides));
        let f32_runs = via_gemm_view((m, n, k), (a32, b32), &mut c);
        let (a64, b64) = ((&a64[..], a.strides), (&b64[..], b.strides));
        let f64_runs = via_gemm_view((m, n, k), (a64, b64), &mut c64);
        assert_eq!((f32_runs, f64_runs), (usize::from(available()), 0));
        // A contraction of 2 and a matrix-vector product stay the library's.
        // Nor a wide result of a short contraction, nor a contraction past `MAX_K`.
        assert!(!plan((512, 1024, 10)) && !plan((2, 2, MAX_K + 1)));
        assert_eq!(plan((512, 64, 10)), available());
        let mut scratch = vec![0.0f32; m * n];
        for (m, n, k) in [(65, 7, 2), (65, 1, 300), (1, 7, 300)] {
            let runs = via_gemm_view((m, n, k), (a32, b32), &mut scratch);
            assert_eq!(runs, 0, "{m}x{n}x{k}");
        }
        if available() {
            for (i, j) in [(0, 0), (64, 6), (31, 3)] {
                assert_eq!(c[i * n + j].to_bits(), model(&a, &b, (i, j), k).to_bits());
            }
        }
    }
}
