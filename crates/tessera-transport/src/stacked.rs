//! How a group's parts of a shared product (`SharedProducts`) stack into one product: the
//! rule both the threaded transport (`tessera_runtime::shared_gemm`) and several devices run on
//! one thread (`tessera_codegen::together`) follow, so the two give the same bits.
//!
//! - `Stacking::Rows` (`gemm_shared_rhs`): every member multiplies the same right operand (a
//!   replicated weight); the left operands are stacked by rows, in group order, into a dense
//!   row-major `rows x k` block, and member `p`'s rows of the row-major result are its product.
//! - `Stacking::Depth` (`gemm_all_reduce`): the products are summed over the group; the
//!   operands are stacked along the contraction (in group order), so the sum is one product
//!   over every member's rows. Each stacked operand is laid out so a member's view moves as
//!   whole lines (`stacked_strides`).
//!
//! Parts that already are the stacked operand are not copied (`Stacking::in_place`): when every
//! member's view lies in one allocation the members share (`PartAddr::regions`, a group
//! region several devices run on one thread lay their operands out in), with the stacked
//! operand's strides, each at its block's place. The product is then the same call on the same
//! values, only read where they are: the same bits.

use tessera_ir::DType;

use crate::values::copy_view;
use crate::{GemmCall, GemmPart};

/// A `GemmPart` as plain numbers, to sit in a slot shared between threads or in a list of
/// the devices' paused runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartAddr {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lhs: usize,
    pub lhs_strides: [isize; 2],
    pub rhs: usize,
    pub rhs_strides: [isize; 2],
    /// For the left and right operand: the start of one allocation that holds this view and
    /// the same operand's view of every other member, or 0 when there is none (each
    /// member's buffers its own). Only parts in one region can be stacked in place.
    pub regions: [usize; 2],
}

impl PartAddr {
    /// The part's addresses, in no shared region.
    pub fn of(p: &GemmPart) -> PartAddr {
        PartAddr {
            dtype: p.dtype,
            m: p.m,
            n: p.n,
            k: p.k,
            lhs: p.lhs as usize,
            lhs_strides: p.lhs_strides,
            rhs: p.rhs as usize,
            rhs_strides: p.rhs_strides,
            regions: [0, 0],
        }
    }
}

/// How many stacked operands were found in place since the process started (for tests).
pub fn stacked_in_place() -> usize {
    IN_PLACE.load(std::sync::atomic::Ordering::Relaxed)
}

static IN_PLACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Row-major strides of a `rows x cols` block when the views copied into it have unit column
/// stride (or are scalar-strided anyway), column-major ones when they have unit row stride: so
/// that `copy_view` moves whole lines.
pub fn stacked_strides(rows: usize, cols: usize, unit_row_stride: bool) -> [isize; 2] {
    if unit_row_stride {
        [1, rows as isize]
    } else {
        [cols as isize, 1]
    }
}

/// Which way a group's parts stack (see the module's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacking {
    Rows,
    Depth,
}

/// The addresses of the stacked left operand, right operand and result (`Rows` has no stacked
/// right operand: its entry is unused).
pub type Stacks = [usize; 3];

impl Stacking {
    /// The stacked left (`0`) or right (`1`) operand's strides, and how many elements its
    /// blocks advance by a row of `Rows` or a contraction index of `Depth` (`Rows` stacks only
    /// the left one). For parts `layout` accepted: the members agree on every extent but the
    /// stacked one.
    fn stacked(self, parts: &[PartAddr], operand: usize) -> ([isize; 2], isize) {
        let first = parts[0];
        match self {
            Stacking::Rows => ([first.k as isize, 1], first.k as isize),
            Stacking::Depth => {
                let depth: usize = parts.iter().map(|p| p.k).sum();
                if operand == 0 {
                    let s = stacked_strides(first.m, depth, first.lhs_strides[0] == 1);
                    (s, s[1])
                } else {
                    let s = stacked_strides(depth, first.n, first.rhs_strides[0] == 1);
                    (s, s[0])
                }
            }
        }
    }

    /// For the left and right operand: whether the members' views already are the stacked
    /// operand, in one shared region (`PartAddr::regions`), each with the stacked strides at
    /// its block's place (`fill` would copy every element onto itself). The stacked view is
    /// then the union of the members' views: its every element is one member's, inside the
    /// one region. `Rows` has no stacked right operand (`false`). One pass over the members.
    pub fn in_place(self, parts: &[PartAddr]) -> [bool; 2] {
        let Some(first) = parts.first() else {
            return [false, false];
        };
        let size = first.dtype.byte_width() as isize;
        let operand = |j: usize| {
            let (region, base) = match j {
                0 => (first.regions[0], first.lhs),
                _ => (first.regions[1], first.rhs),
            };
            if region == 0 {
                return false;
            }
            let (want, step) = self.stacked(parts, j);
            // Member `me`'s block starts `at` rows (contraction indices) into the stack.
            let mut at = 0isize;
            parts.iter().all(|p| {
                let (addr, strides) = match j {
                    0 => (p.lhs, p.lhs_strides),
                    _ => (p.rhs, p.rhs_strides),
                };
                let here = at
                    .checked_mul(step)
                    .and_then(|e| e.checked_mul(size))
                    .and_then(|o| (base as isize).checked_add(o));
                at += match self {
                    Stacking::Rows => p.m,
                    Stacking::Depth => p.k,
                } as isize;
                p.regions[j] == region && strides == want && here == Some(addr as isize)
            })
        };
        match self {
            Stacking::Rows => [operand(0), false],
            Stacking::Depth => [operand(0), operand(1)],
        }
    }

    /// From every member's part (in group order): the bytes of the stacked left and right
    /// operands and of the result, or `None` when the parts do not stack this way (then every
    /// member multiplies its own). An operand in place (`in_place`) needs no bytes.
    pub fn layout(self, parts: &[PartAddr]) -> Option<[usize; 3]> {
        let first = *parts.first()?;
        let size = first.dtype.byte_width();
        match self {
            Stacking::Rows => {
                let same = |p: &PartAddr| {
                    (p.rhs, p.rhs_strides, p.n, p.k, p.dtype)
                        == (first.rhs, first.rhs_strides, first.n, first.k, first.dtype)
                };
                let rows: usize = parts.iter().map(|p| p.m).sum();
                let lhs = if self.in_place(parts)[0] {
                    0
                } else {
                    rows * first.k * size
                };
                parts
                    .iter()
                    .all(same)
                    .then_some([lhs, 0, rows * first.n * size])
            }
            Stacking::Depth => {
                let (m, n) = (first.m, first.n);
                let depth: usize = parts.iter().map(|p| p.k).sum();
                let lay = |p: &PartAddr| {
                    (
                        p.m,
                        p.n,
                        p.dtype,
                        stacked_strides(m, depth, p.lhs_strides[0] == 1),
                        stacked_strides(depth, n, p.rhs_strides[0] == 1),
                    )
                };
                let [l, r] = self.in_place(parts);
                parts.iter().all(|p| lay(p) == lay(&first)).then_some([
                    if l { 0 } else { m * depth * size },
                    if r { 0 } else { depth * n * size },
                    m * n * size,
                ])
            }
        }
    }

    /// Copies member `me`'s operands into its blocks of the stacked ones.
    ///
    /// # Safety
    /// `parts` must be ones `layout` accepted, `parts[me]`'s views inside live buffers that
    /// nothing writes meanwhile, and `stacks` buffers of `layout`'s sizes, writable, with no
    /// other writer of member `me`'s blocks.
    pub unsafe fn fill(self, parts: &[PartAddr], me: usize, stacks: Stacks) {
        let part = parts[me];
        let size = part.dtype.byte_width();
        let [lhs_in_place, rhs_in_place] = self.in_place(parts);
        match self {
            Stacking::Rows if lhs_in_place => {}
            Stacking::Rows => {
                let k = part.k;
                let row0: usize = parts[..me].iter().map(|p| p.m).sum();
                // SAFETY: the member's left operand is a live `m x k` view; rows
                // `row0..row0 + m` of the stacked `rows x k` operand are its block.
                unsafe {
                    copy_view(
                        (part.lhs as *const u8, part.lhs_strides),
                        ((stacks[0] as *mut u8).add(row0 * k * size), [k as isize, 1]),
                        (part.m, k, size),
                    )
                }
            }
            Stacking::Depth => {
                let (m, n) = (part.m, part.n);
                let depth: usize = parts.iter().map(|p| p.k).sum();
                let at = parts[..me].iter().map(|p| p.k).sum::<usize>() as isize;
                let ls = stacked_strides(m, depth, part.lhs_strides[0] == 1);
                let rs = stacked_strides(depth, n, part.rhs_strides[0] == 1);
                let z = size as isize;
                // SAFETY: the member's operands are live views; columns (rows) `at..at + k` of
                // the stacked `m x depth` (`depth x n`) operands are its blocks (an operand in
                // place has no stacked buffer, and nothing to copy).
                unsafe {
                    if !lhs_in_place {
                        copy_view(
                            (part.lhs as *const u8, part.lhs_strides),
                            ((stacks[0] as *mut u8).offset(at * ls[1] * z), ls),
                            (m, part.k, size),
                        );
                    }
                    if !rhs_in_place {
                        copy_view(
                            (part.rhs as *const u8, part.rhs_strides),
                            ((stacks[1] as *mut u8).offset(at * rs[0] * z), rs),
                            (part.k, n, size),
                        );
                    }
                }
            }
        }
    }

    /// The one product of the stacked operands into the stacked result (a dense row-major
    /// block). `Rows` reads the members' shared right operand itself.
    pub fn call(self, parts: &[PartAddr], stacks: Stacks) -> GemmCall {
        let first = parts[0];
        let in_place = self.in_place(parts);
        let found = in_place.iter().filter(|&&b| b).count();
        IN_PLACE.fetch_add(found, std::sync::atomic::Ordering::Relaxed);
        // An operand in place is read where the members' views are: the first member's is
        // the stacked operand's start (`in_place`).
        let stacks = [
            if in_place[0] { first.lhs } else { stacks[0] },
            if in_place[1] { first.rhs } else { stacks[1] },
            stacks[2],
        ];
        match self {
            Stacking::Rows => {
                let rows: usize = parts.iter().map(|p| p.m).sum();
                GemmCall {
                    m: rows,
                    n: first.n,
                    k: first.k,
                    lhs: stacks[0] as *const u8,
                    lhs_strides: [first.k as isize, 1],
                    rhs: first.rhs as *const u8,
                    rhs_strides: first.rhs_strides,
                    out: stacks[2] as *mut u8,
                    out_strides: [first.n as isize, 1],
                }
            }
            Stacking::Depth => {
                let (m, n) = (first.m, first.n);
                let depth: usize = parts.iter().map(|p| p.k).sum();
                GemmCall {
                    m,
                    n,
                    k: depth,
                    lhs: stacks[0] as *const u8,
                    lhs_strides: stacked_strides(m, depth, first.lhs_strides[0] == 1),
                    rhs: stacks[1] as *const u8,
                    rhs_strides: stacked_strides(depth, n, first.rhs_strides[0] == 1),
                    out: stacks[2] as *mut u8,
                    out_strides: [n as isize, 1],
                }
            }
        }
    }

    /// Member `me`'s result in the stacked one: its rows (`Rows`) or the whole sum (`Depth`),
    /// a dense row-major `m x n` block.
    pub fn result(self, parts: &[PartAddr], me: usize, stacks: Stacks) -> *const u8 {
        match self {
            Stacking::Rows => {
                let first = parts[0];
                let row0: usize = parts[..me].iter().map(|p| p.m).sum();
                // Inside the stacked result: rows `row0..row0 + m` of `rows x n`.
                (stacks[2] + row0 * first.n * first.dtype.byte_width()) as *const u8
            }
            Stacking::Depth => stacks[2] as *const u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Member `p`'s part of a product stacked by rows: `rows[p] x 3` left operands, one
    /// `3 x 2` right operand, laid out from `lhs[p]` with strides `s`.
    fn rows_parts(lhs: &[usize], rows: &[usize], s: [isize; 2], region: usize) -> Vec<PartAddr> {
        lhs.iter()
            .zip(rows)
            .map(|(&lhs, &m)| PartAddr {
                dtype: DType::F32,
                m,
                n: 2,
                k: 3,
                lhs,
                lhs_strides: s,
                rhs: 4096,
                rhs_strides: [2, 1],
                regions: [region, 0],
            })
            .collect()
    }

    /// Parts that lie one after another in one region, row-major, are the stacked operand:
    /// no bytes, no copy, and the call reads the first member's view. Any other arrangement
    /// copies.
    #[test]
    fn parts_already_stacked_in_one_region_are_read_in_place() {
        let mut region = [0f32; 18];
        let base = region.as_mut_ptr() as usize;
        // Rows 2, 3 and 1, each 3 floats wide: at 0, 6 and 15 floats.
        let lhs = [base, base + 24, base + 60];
        let parts = rows_parts(&lhs, &[2, 3, 1], [3, 1], base);
        assert_eq!(Stacking::Rows.in_place(&parts), [true, false]);
        assert_eq!(Stacking::Rows.layout(&parts), Some([0, 0, 6 * 2 * 4]));
        let mut out = [0f32; 12];
        let stacks = [0, 0, out.as_mut_ptr() as usize];
        for me in 0..3 {
            // SAFETY: the operand is in place: `fill` copies nothing.
            unsafe { Stacking::Rows.fill(&parts, me, stacks) };
        }
        let before = stacked_in_place();
        let call = Stacking::Rows.call(&parts, stacks);
        assert_eq!(call.lhs as usize, base);
        assert_eq!((call.m, call.lhs_strides), (6, [3, 1]));
        assert!(stacked_in_place() > before);

        // Not in one region, out of group order, another stride, a gap: copied.
        let copied = |parts: &[PartAddr]| {
            Stacking::Rows.in_place(parts) == [false, false]
                && Stacking::Rows.layout(parts) == Some([6 * 3 * 4, 0, 6 * 2 * 4])
        };
        assert!(copied(&rows_parts(&lhs, &[2, 3, 1], [3, 1], 0)));
        let swapped = [lhs[1], lhs[0], lhs[2]];
        assert!(copied(&rows_parts(&swapped, &[2, 3, 1], [3, 1], base)));
        assert!(copied(&rows_parts(&lhs, &[2, 3, 1], [1, 2], base)));
        let gap = [base, base + 28, base + 64];
        assert!(copied(&rows_parts(&gap, &[2, 3, 1], [3, 1], base)));
        let mut other = rows_parts(&lhs, &[2, 3, 1], [3, 1], base);
        other[2].regions[0] = base + 4;
        assert!(copied(&other));
    }

    /// Stacked along the contraction: a transposed left operand (`x_p^T`, unit row stride)
    /// and a row-major right one, each member's rows after the last's in one region, are both
    /// in place; the right operand alone in place keeps the left one's copy.
    #[test]
    fn a_contraction_stacks_in_place_operand_by_operand() {
        let (m, n) = (4usize, 5usize);
        let depth = [2usize, 3];
        let (xs, gs) = (0x10000usize, 0x20000usize);
        let part = |me: usize, lhs_region: usize| {
            let at: usize = depth[..me].iter().sum();
            PartAddr {
                dtype: DType::F32,
                m,
                n,
                k: depth[me],
                lhs: xs + at * m * 4,
                lhs_strides: [1, m as isize],
                rhs: gs + at * n * 4,
                rhs_strides: [n as isize, 1],
                regions: [lhs_region, xs],
            }
        };
        let both = [part(0, xs), part(1, xs)];
        assert_eq!(Stacking::Depth.in_place(&both), [true, true]);
        assert_eq!(Stacking::Depth.layout(&both), Some([0, 0, m * n * 4]));
        let call = Stacking::Depth.call(&both, [0, 0, 64]);
        assert_eq!((call.lhs as usize, call.rhs as usize), (xs, gs));
        assert_eq!(
            (call.k, call.lhs_strides, call.rhs_strides),
            (5, [1, 4], [5, 1])
        );
        let right = [part(0, 0), part(1, 0)];
        assert_eq!(Stacking::Depth.in_place(&right), [false, true]);
        assert_eq!(
            Stacking::Depth.layout(&right),
            Some([m * 5 * 4, 0, m * n * 4])
        );
    }
}
