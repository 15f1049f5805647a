//! f32 products with at most 16 result columns and a row-major left operand (a classifier
//! layer's `h @ w`, 512 x 10 x 1024), in AVX-512 registers: the `gemm` crate tiles for many
//! columns, and at this shape ran at about 45 GFLOP/s in the big MLP step. (Its weight
//! gradient `h^T @ dy` keeps `transpose::with_column_major_out`: a register tile of 16 rows
//! of `h^T` down all of `k`, tried, read 512 strided lines a tile and was slower in the step,
//! 298-360 against 201-208 us.)
//!
//! Each result element is the sum the library forms for it, bit for bit (`tests` compare with
//! `gemm::gemm` at many shapes): a chain of multiply-adds over each block of the contraction,
//! from zero, in order, and the blocks' sums added to the result one after another. The block
//! length is the library's: `min(k, 512)` when both sides of its problem are at most 64 (the
//! result has at most 64 rows here), else `gemm_common::cache::kernel_params`'s, which depends
//! on `k` and the caches alone, computed with the register tile of the library's AVX-512 f32
//! kernel (64 x 6). Taken only where the library would take that general path (`plan`), and
//! only on AVX-512F hosts, where the library runs that kernel.

/// The library's register tile for f32 on AVX-512 (rows, columns of its transposed problem).
const LIBRARY_TILE: (usize, usize) = (64, 6);

/// Products of at least this many multiply-adds are split over the pool by rows.
const PARALLEL_FROM: usize = 1 << 20;

/// Whether `gemm_view` computes the f32 `m x n x k` product with these (row, column) strides
/// here: `2 <= n <= 16`, a contraction of at least 3 and more than 256 result elements (where
/// the library takes its general path: other kernels sum in other orders), unit column
/// strides in all three operands, non-negative row strides (the library runs a contraction
/// with a negative one backwards), result rows that do not overlap (the two row parts write
/// apart), and an AVX-512F host.
pub(crate) fn plan(
    (m, n, k): (usize, usize, usize),
    ls: [isize; 2],
    rs: [isize; 2],
    os: [isize; 2],
) -> bool {
    let general = (2..=16).contains(&n) && k >= 3 && m.saturating_mul(n) > 256;
    let rows = ls[0] >= 0 && rs[0] >= 0 && os[0] >= n as isize;
    general && rows && ls[1] == 1 && rs[1] == 1 && os[1] == 1 && available()
}

/// Whether the host runs AVX-512F (and `TESSERA_NO_THIN` is unset, to measure the library).
fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f")
                && std::env::var_os("TESSERA_NO_THIN").is_none()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

thread_local! {
    /// How many products `run` has computed on this thread (for tests: `gemm_view` takes
    /// this path).
    static RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The library's contraction block for an `m`-row product with a short result (`n <= 16`).
fn block(m: usize, n: usize, k: usize) -> usize {
    if m <= 64 {
        k.min(512)
    } else {
        let (mr, nr) = LIBRARY_TILE;
        gemm_common::cache::kernel_params(n, m, k, mr, nr, 4)
            .kc
            .max(1)
    }
}

/// The views of one product, for the row parts' threads.
#[derive(Clone, Copy)]
struct Views {
    l: *const f32,
    r: *const f32,
    o: *mut f32,
}
// SAFETY: the parts only read `l` and `r` and write disjoint rows of `o` (rows `os[0] >= n`
// apart: `plan`), inside the views `run`'s caller vouches for, and `run` returns only once
// both parts are done.
unsafe impl Send for Views {}
// SAFETY: as above.
unsafe impl Sync for Views {}

impl Views {
    /// The views (a method, so closures capture the wrapper, not its fields).
    fn get(self) -> (*const f32, *const f32, *mut f32) {
        (self.l, self.r, self.o)
    }
}

/// `out = lhs x rhs` over the `(m, n, k)` views (element `(i, j)` of a view at
/// `i * s[0] + j * s[1]`), in two row parts on the pool when `parallel` and the product is
/// large.
///
/// # Safety
/// `plan` holds for these shapes and strides (so the host has AVX-512F); the views lie inside
/// live f32 buffers, `out` overlapping neither operand.
pub(crate) unsafe fn run(
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const f32, [isize; 2]),
    (r, rs): (*const f32, [isize; 2]),
    (o, os): (*mut f32, [isize; 2]),
    parallel: bool,
) {
    debug_assert!(
        plan((m, n, k), ls, rs, os),
        "`run`'s contract: `plan` holds"
    );
    RUNS.with(|r| r.set(r.get() + 1));
    let kc = block(m, n, k);
    let views = Views { l, r, o };
    // Rows `from..from + rows` of the product: `from` rows along each view's row stride.
    let part = move |from: usize, rows: usize| {
        let (l, r, o) = views.get();
        let l = l.wrapping_offset(from as isize * ls[0]);
        let o = o.wrapping_offset(from as isize * os[0]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's views, `rows` of them from `l` and `o`; AVX-512F (`plan`).
        unsafe {
            x86::row_lhs((rows, n, k, kc), (l, ls[0]), (r, rs[0]), (o, os[0]))
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("`plan` is false off x86_64: {l:?} {r:?} {o:?} {rows}")
    };
    let half = (m / 2) & !15;
    if parallel && m.saturating_mul(n).saturating_mul(k) >= PARALLEL_FROM && half >= 16 {
        crate::team::join(|| part(0, half), || part(half, m - half));
    } else {
        part(0, m)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows of the left operand a `row_lhs` tile holds, one register of sums each.
    const ROWS: usize = 8;

    /// `out = lhs x rhs`, `lhs` row-major (row stride `lr`), `rhs` row-major (row stride `rr`),
    /// `out` row-major (row stride `or`), `n <= 16` columns as the lanes of one register: each
    /// tile of `ROWS` rows runs the contraction in blocks of `kc`, each block's sums from zero
    /// in order, added to the result after the first.
    ///
    /// # Safety
    /// AVX-512F; element `(i, kk)` of `lhs` at `lhs + i * lr + kk`, `(kk, j)` of `rhs` at
    /// `rhs + kk * rr + j`, `(i, j)` of `out` at `out + i * or + j`, all inside live
    /// buffers for `i < m`, `kk < k`, `j < n`; `out` overlaps neither operand.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn row_lhs(
        (m, n, k, kc): (usize, usize, usize, usize),
        (lhs, lr): (*const f32, isize),
        (rhs, rr): (*const f32, isize),
        (out, or): (*mut f32, isize),
    ) {
        let lanes: __mmask16 = ((1u32 << n) - 1) as u16;
        let at = |p: *const f32, i: usize, s: isize| p.wrapping_offset(i as isize * s);
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(ROWS);
            let mut k0 = 0;
            while k0 < k {
                let k1 = (k0 + kc).min(k);
                let mut acc = [_mm512_setzero_ps(); ROWS];
                for kk in k0..k1 {
                    // SAFETY: row `kk` of `rhs`, its `n` lanes (masked); element `(i + q, kk)`
                    // of `lhs` for `q < rows`.
                    unsafe {
                        let w = _mm512_maskz_loadu_ps(lanes, at(rhs, kk, rr));
                        for (q, a) in acc.iter_mut().enumerate().take(rows) {
                            let x = _mm512_set1_ps(*at(lhs, i + q, lr).add(kk));
                            *a = _mm512_fmadd_ps(x, w, *a);
                        }
                    }
                }
                for (q, a) in acc.iter().enumerate().take(rows) {
                    let o = at(out, i + q, or) as *mut f32;
                    // SAFETY: row `i + q` of `out`, its `n` lanes (masked).
                    unsafe {
                        let sum = match k0 {
                            0 => *a,
                            _ => _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, o), *a),
                        };
                        _mm512_mask_storeu_ps(o, lanes, sum);
                    }
                }
                k0 = k1;
            }
            i += rows;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a x b` over views with these (row, column) strides, by the library and by `run`, into
    /// `len` values filled with `fill` first: (the library's, `run`'s).
    ///
    /// # Safety
    /// The views lie inside the slices and `len` values; `plan` holds.
    unsafe fn both(
        (m, n, k): (usize, usize, usize),
        (a, ls): (&[f32], [isize; 2]),
        (b, rs): (&[f32], [isize; 2]),
        (len, fill, os): (usize, f32, [isize; 2]),
        par: gemm::Parallelism,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut want = vec![fill; len];
        let mut got = vec![fill; len];
        // SAFETY: the caller's views; the outputs are vectors of their own.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                want.as_mut_ptr(),
                os[1],
                os[0],
                false,
                a.as_ptr(),
                ls[1],
                ls[0],
                b.as_ptr(),
                rs[1],
                rs[0],
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            );
            run(
                (m, n, k),
                (a.as_ptr(), ls),
                (b.as_ptr(), rs),
                (got.as_mut_ptr(), os),
                !matches!(par, gemm::Parallelism::None),
            );
        }
        (want, got)
    }

    /// Thin products give `gemm::gemm`'s bits, at the big MLP's shape (512 x 10 x 1024), at
    /// contractions of several library blocks and of a part of one, at 64 rows and fewer (the
    /// library's other block) and odd row counts, on one thread and two. `plan` declines the
    /// library's other kernels, other layouts, and every product on a host without AVX-512F
    /// (where the library's own path is the one tested everywhere else).
    #[test]
    fn thin_products_are_the_librarys_bits() {
        let row = |n: usize, k: usize| ([k as isize, 1], [n as isize, 1], [n as isize, 1]);
        let (ls, rs, os) = row(10, 1024);
        assert_eq!(plan((512, 10, 1024), ls, rs, os), available());
        if !available() {
            return;
        }
        assert!(!plan((16, 16, 8), [8, 1], [16, 1], [16, 1]));
        assert!(!plan((512, 17, 8), [8, 1], [17, 1], [17, 1]));
        assert!(!plan((512, 10, 2), [2, 1], [10, 1], [10, 1]));
        assert!(!plan((512, 1, 64), [64, 1], [1, 1], [1, 1]));
        assert!(!plan((512, 10, 64), [1, 512], [10, 1], [10, 1]));
        assert!(!plan((512, 10, 64), [64, 1], [-10, 1], [10, 1]));
        assert!(!plan((512, 10, 64), [64, 1], [10, 1], [9, 1]));
        // 64 and 65 rows at k = 1537: the library's two blocks differ there (512 against
        // `kernel_params`'s), as at 33 x 9 x 700, 70 x 5 x 1537 and 129 x 16 x 2000.
        for (m, n, k) in [
            (512, 10, 1024),
            (1024, 10, 512),
            (64, 10, 1537),
            (65, 10, 1537),
            (33, 9, 700),
            (129, 16, 2000),
            (300, 2, 3),
            (70, 5, 1537),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104_729) % 1009) as f32 / 1009.0 - 0.5)
                .collect();
            let (ls, rs, os) = row(n, k);
            assert!(plan((m, n, k), ls, rs, os));
            for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                // SAFETY: every view is inside its vector (`m x k`, `k x n`, `m x n`); `plan`
                // holds.
                let (want, got) =
                    unsafe { both((m, n, k), (&a, ls), (&b, rs), (m * n, 0.0, os), par) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} {par:?}");
                // `gemm_view`, every product's entry, takes this path, with these bits.
                let before = RUNS.with(|r| r.get());
                let mut via = vec![2f32; m * n];
                // SAFETY: as above.
                unsafe {
                    crate::exec::gemm_view(
                        tessera_ir::DType::F32,
                        (m, n, k),
                        (a.as_ptr() as *const u8, ls),
                        (b.as_ptr() as *const u8, rs),
                        (via.as_mut_ptr() as *mut u8, os),
                        par,
                    )
                };
                assert_eq!(
                    RUNS.with(|r| r.get()),
                    before + 1,
                    "gemm_view took the path"
                );
                assert_eq!(bits(&via), bits(&want));
            }
        }
        // Padded rows in all three views: the library's bits in the result's columns, the
        // padding between its rows untouched.
        let (m, n, k) = (100, 7, 600);
        let (ls, rs, os) = (
            [k as isize + 3, 1],
            [n as isize + 1, 1],
            [n as isize + 2, 1],
        );
        assert!(plan((m, n, k), ls, rs, os));
        let a: Vec<f32> = (0..m * (k + 3))
            .map(|i| (i % 101) as f32 * 0.01 - 0.5)
            .collect();
        let b: Vec<f32> = (0..k * (n + 1))
            .map(|i| (i % 97) as f32 * 0.01 - 0.5)
            .collect();
        let par = gemm::Parallelism::Rayon(2);
        // SAFETY: the padded views lie inside their vectors (row `i` of each at `i * s[0]`, its
        // `k`, `n` and `n` elements within the row); `plan` holds.
        let (want, got) =
            unsafe { both((m, n, k), (&a, ls), (&b, rs), (m * (n + 2), -3.0, os), par) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert!(got.chunks(n + 2).all(|row| row[n..] == [-3.0, -3.0]));
    }
}
