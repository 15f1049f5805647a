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
}

impl PartAddr {
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
        }
    }
}

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
    /// From every member's part (in group order): the bytes of the stacked left and right
    /// operands and of the result, or `None` when the parts do not stack this way (then every
    /// member multiplies its own).
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
                parts
                    .iter()
                    .all(same)
                    .then_some([rows * first.k * size, 0, rows * first.n * size])
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
                parts.iter().all(|p| lay(p) == lay(&first)).then_some([
                    m * depth * size,
                    depth * n * size,
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
        match self {
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
                // the stacked `m x depth` (`depth x n`) operands are its blocks.
                unsafe {
                    copy_view(
                        (part.lhs as *const u8, part.lhs_strides),
                        ((stacks[0] as *mut u8).offset(at * ls[1] * z), ls),
                        (m, part.k, size),
                    );
                    copy_view(
                        (part.rhs as *const u8, part.rhs_strides),
                        ((stacks[1] as *mut u8).offset(at * rs[0] * z), rs),
                        (part.k, n, size),
                    );
                }
            }
        }
    }

    /// The one product of the stacked operands into the stacked result (a dense row-major
    /// block). `Rows` reads the members' shared right operand itself.
    pub fn call(self, parts: &[PartAddr], stacks: Stacks) -> GemmCall {
        let first = parts[0];
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
