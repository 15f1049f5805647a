//! Matrix products done once for a group of devices, through shared memory.
//!
//! Devices on one host can read each other's buffers, so two products that a data-parallel
//! step repeats on every device are done once, on both cores, by the group's first member while
//! the others wait:
//! - `shared_rhs`: a product whose right operand is the same buffer on every device (a
//!   replicated weight): the left operands are stacked by rows, so the weight is read and packed
//!   once instead of once per device;
//! - `all_reduce`: a product whose result is summed over the group right after (a weight
//!   gradient, `dot` then `all_reduce`): the operands are stacked along the contraction, so the
//!   sum is the product itself, with a contraction of all the devices' rows; it lands in a
//!   buffer the launch owns (freed when the launch ends), which every member reads in place of
//!   its all-reduce's result: one copy of the gradient instead of one per device.
//!
//! Every member returns only after the last access to its buffers; a member that times out at
//! the first meeting marks the slot abandoned under the lock, so nobody touches the buffers of a
//! member that has left; a panic in the leader's product abandons the slot before it unwinds.

use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_interp::{GemmCall, GemmPart, InterpError};
use tessera_ir::{DType, DotDims, Mesh, Op, ReduceKind};

use crate::collectives::{Key, SharedCollectives, Wait, group};

/// A `GemmPart` as plain numbers, to sit in a slot shared between threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PartAddr {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    lhs: usize,
    lhs_strides: [isize; 2],
    rhs: usize,
    rhs_strides: [isize; 2],
    out: usize,
    out_strides: [isize; 2],
}

impl PartAddr {
    fn of(p: &GemmPart) -> PartAddr {
        PartAddr {
            dtype: p.dtype,
            m: p.m,
            n: p.n,
            k: p.k,
            lhs: p.lhs as usize,
            lhs_strides: p.lhs_strides,
            rhs: p.rhs as usize,
            rhs_strides: p.rhs_strides,
            out: p.out as usize,
            out_strides: p.out_strides,
        }
    }
}

/// How many products were done once for a group, since the process started: for tests and
/// benchmarks.
pub fn shared_gemm_count() -> usize {
    SHARED_GEMMS.load(Ordering::Relaxed)
}

static SHARED_GEMMS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The stacked operands, kept by the thread that multiplies them.
    static STACKED: std::cell::RefCell<(Vec<u64>, Vec<u64>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Copies a `rows x cols` view at `src` (element strides `s`) into the view at `dst` (strides
/// `d`): whole rows or whole columns when both sides are contiguous that way, else element by
/// element.
///
/// # Safety
/// Both views must be valid for `size`-byte elements (4 or 8) and not overlap.
unsafe fn copy_block(
    (src, s): (*const u8, [isize; 2]),
    (dst, d): (*mut u8, [isize; 2]),
    (rows, cols, size): (usize, usize, usize),
) {
    let z = size as isize;
    // SAFETY: every address is inside one of the two views (the caller's contract).
    unsafe {
        if s[1] == 1 && d[1] == 1 {
            for r in 0..rows as isize {
                std::ptr::copy_nonoverlapping(
                    src.offset(r * s[0] * z),
                    dst.offset(r * d[0] * z),
                    cols * size,
                );
            }
        } else if s[0] == 1 && d[0] == 1 {
            for c in 0..cols as isize {
                std::ptr::copy_nonoverlapping(
                    src.offset(c * s[1] * z),
                    dst.offset(c * d[1] * z),
                    rows * size,
                );
            }
        } else {
            for r in 0..rows as isize {
                for c in 0..cols as isize {
                    let (from, to) = (
                        src.offset((r * s[0] + c * s[1]) * z),
                        dst.offset((r * d[0] + c * d[1]) * z),
                    );
                    match size {
                        4 => {
                            (to as *mut u32).write_unaligned((from as *const u32).read_unaligned())
                        }
                        _ => {
                            (to as *mut u64).write_unaligned((from as *const u64).read_unaligned())
                        }
                    }
                }
            }
        }
    }
}

/// Row-major strides of a `rows x cols` block when the views copied into it have unit column
/// stride (or are scalar-strided anyway), column-major ones when they have unit row stride: so
/// that `copy_block` moves whole lines.
fn stacked_strides(rows: usize, cols: usize, unit_row_stride: bool) -> [isize; 2] {
    if unit_row_stride {
        [1, rows as isize]
    } else {
        [cols as isize, 1]
    }
}

/// Meeting 1: every member of `members` publishes its part; returns them all in order.
fn meet(
    c: &SharedCollectives<'_>,
    op: &Op,
    members: &[usize],
    me: usize,
    part: &GemmPart,
) -> Result<(Key, Vec<PartAddr>), InterpError> {
    let (slots, key) = c.meet(
        op,
        members,
        |s| s.gemms[me] = Some(PartAddr::of(part)),
        |s| s.gemms.iter().all(|g| g.is_some()),
    )?;
    let parts = slots[&key]
        .gemms
        .iter()
        .map(|g| g.expect("complete"))
        .collect();
    Ok((key, parts))
}

/// The leader runs `work`; a panic in it abandons the slot (so the others, waiting without a
/// timeout, fail) before it unwinds. Otherwise the slot is marked done.
fn lead(c: &SharedCollectives<'_>, key: &Key, work: impl FnOnce()) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    let r = c.rendezvous;
    let mut slots = r.slots.lock().expect("rendezvous lock");
    let slot = slots.get_mut(key).expect("slot present");
    match &outcome {
        Ok(()) => {
            slot.gemm_done = true;
            SHARED_GEMMS.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => slot.abandoned = true,
    }
    r.arrived.notify_all();
    drop(slots);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// See `Collectives::gemm_shared_rhs`; the group is the whole mesh.
///
/// # Safety
/// As `Collectives::gemm_shared_rhs`.
pub(crate) unsafe fn shared_rhs(
    c: &SharedCollectives<'_>,
    mesh: &Mesh,
    part: &GemmPart,
    gemm: &(dyn Fn(&GemmCall) + Sync),
) -> Result<bool, InterpError> {
    let axes: Vec<String> = mesh.axes.iter().map(|(a, _)| a.clone()).collect();
    let (members, me) = group(mesh, &axes, c.position);
    let n = members.len();
    if n < 2 {
        return Ok(false);
    }
    let op = Op::DotGeneral(DotDims::matmul());
    let (key, parts) = meet(c, &op, &members, me, part)?;
    let first = parts[0];
    let same = |p: &PartAddr| {
        (p.rhs, p.rhs_strides, p.n, p.k, p.dtype)
            == (first.rhs, first.rhs_strides, first.n, first.k, first.dtype)
    };
    let r = c.rendezvous;
    if !parts.iter().all(same) {
        let mut slots = r.slots.lock().expect("rendezvous lock");
        c.leave(&mut slots, &key, n);
        return Ok(false);
    }
    if me == 0 {
        let (size, k, nn) = (first.dtype.byte_width(), first.k, first.n);
        let rows: usize = parts.iter().map(|p| p.m).sum();
        lead(c, &key, || {
            STACKED.with(|stacked| {
                let (lhs, out) = &mut *stacked.borrow_mut();
                lhs.resize((rows * k * size).div_ceil(8), 0);
                out.resize((rows * nn * size).div_ceil(8), 0);
                let (lhs, out) = (lhs.as_mut_ptr() as *mut u8, out.as_mut_ptr() as *mut u8);
                let mut row = 0;
                for p in &parts {
                    // SAFETY: member `p`'s left operand is a live `m x k` view (the member
                    // waits in this call); the stacked block has room for its rows.
                    unsafe {
                        copy_block(
                            (p.lhs as *const u8, p.lhs_strides),
                            (lhs.add(row * k * size), [k as isize, 1]),
                            (p.m, k, size),
                        )
                    };
                    row += p.m;
                }
                gemm(&GemmCall {
                    m: rows,
                    n: nn,
                    k,
                    lhs,
                    lhs_strides: [k as isize, 1],
                    rhs: first.rhs as *const u8,
                    rhs_strides: first.rhs_strides,
                    out,
                    out_strides: [nn as isize, 1],
                });
                let mut row = 0;
                for p in &parts {
                    // SAFETY: member `p`'s result is a live view nobody else touches until the
                    // member returns, after the slot is marked done.
                    unsafe {
                        copy_block(
                            (out.add(row * nn * size), [nn as isize, 1]),
                            (p.out as *mut u8, p.out_strides),
                            (p.m, nn, size),
                        )
                    };
                    row += p.m;
                }
            })
        });
        let mut slots = r.slots.lock().expect("rendezvous lock");
        c.leave(&mut slots, &key, n);
    } else {
        let slots = r.slots.lock().expect("rendezvous lock");
        let mut slots = c.wait(&op, slots, &key, &members, |s| s.gemm_done, Wait::Parked)?;
        c.leave(&mut slots, &key, n);
    }
    Ok(true)
}

/// See `Collectives::gemm_all_reduce`: the leader multiplies the stacked operands into a
/// buffer the launch owns, which every member then reads in place of its all-reduce's result.
///
/// # Safety
/// As `Collectives::gemm_all_reduce`.
pub(crate) unsafe fn all_reduce(
    c: &SharedCollectives<'_>,
    op: &Op,
    mesh: &Mesh,
    part: &GemmPart,
    gemm: &(dyn Fn(&GemmCall) + Sync),
) -> Result<Option<*const u8>, InterpError> {
    let Op::AllReduce {
        kind: ReduceKind::Sum,
        axes,
    } = op
    else {
        return Ok(None);
    };
    let (members, me) = group(mesh, axes, c.position);
    let n = members.len();
    if n < 2 {
        return Ok(None);
    }
    let (key, parts) = meet(c, op, &members, me, part)?;
    let first = parts[0];
    let r = c.rendezvous;
    let same = |p: &PartAddr| {
        (p.m, p.n, p.out_strides, p.dtype) == (first.m, first.n, first.out_strides, first.dtype)
    };
    if !parts.iter().all(same) {
        let mut slots = r.slots.lock().expect("rendezvous lock");
        c.leave(&mut slots, &key, n);
        return Ok(None);
    }
    let (size, m, nn) = (first.dtype.byte_width(), first.m, first.n);
    if me == 0 {
        let depth: usize = parts.iter().map(|p| p.k).sum();
        // Stack so that each member's view moves as whole lines.
        let ls = stacked_strides(m, depth, first.lhs_strides[0] == 1);
        let rs = stacked_strides(depth, nn, first.rhs_strides[0] == 1);
        // The result, laid out as the all-reduce's buffer is: its last element's offset + 1.
        let os = first.out_strides;
        let extent = ((m as isize - 1) * os[0] + (nn as isize - 1) * os[1] + 1) as usize;
        // Uninitialized: the product writes every element of the view, which is the whole
        // buffer (a dense `m x n` layout), before anyone reads it.
        let mut sum = Box::<[u64]>::new_uninit_slice((extent * size).div_ceil(8));
        let sum_ptr = sum.as_mut_ptr() as *mut u8;
        // Published before the product is marked done (moving the box keeps its elements
        // where they are; the launch frees them when it ends).
        r.results.lock().expect("results lock").push(sum);
        r.slots
            .lock()
            .expect("rendezvous lock")
            .get_mut(&key)
            .expect("slot present")
            .result = sum_ptr as usize;
        lead(c, &key, || {
            STACKED.with(|stacked| {
                let (lhs, rhs) = &mut *stacked.borrow_mut();
                lhs.resize((m * depth * size).div_ceil(8), 0);
                rhs.resize((depth * nn * size).div_ceil(8), 0);
                let (lhs, rhs) = (lhs.as_mut_ptr() as *mut u8, rhs.as_mut_ptr() as *mut u8);
                let mut at = 0isize;
                for p in &parts {
                    let z = size as isize;
                    // SAFETY: member `p`'s operands are live views (it waits in this call);
                    // its block of the stacked operands is columns (rows) `at..at + k`.
                    unsafe {
                        copy_block(
                            (p.lhs as *const u8, p.lhs_strides),
                            (lhs.offset(at * ls[1] * z), ls),
                            (m, p.k, size),
                        );
                        copy_block(
                            (p.rhs as *const u8, p.rhs_strides),
                            (rhs.offset(at * rs[0] * z), rs),
                            (p.k, nn, size),
                        );
                    }
                    at += p.k as isize;
                }
                // The sum over the group is one product over all the members' rows.
                gemm(&GemmCall {
                    m,
                    n: nn,
                    k: depth,
                    lhs,
                    lhs_strides: ls,
                    rhs,
                    rhs_strides: rs,
                    out: sum_ptr,
                    out_strides: os,
                });
            })
        });
        let mut slots = r.slots.lock().expect("rendezvous lock");
        c.leave(&mut slots, &key, n);
        return Ok(Some(sum_ptr as *const u8));
    }
    let slots = r.slots.lock().expect("rendezvous lock");
    let mut slots = c.wait(op, slots, &key, &members, |s| s.gemm_done, Wait::Parked)?;
    let sum = slots[&key].result as *const u8;
    c.leave(&mut slots, &key, n);
    Ok(Some(sum))
}
