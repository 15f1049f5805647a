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
//!   sum is the product itself, with a contraction of all the devices' rows.
//!
//! Both go the same way, with no member waiting for another to wake up: the members meet and
//! publish their operands' views, and the last to arrive allocates the stacked operands and the
//! result in buffers the launch owns (freed when it ends); every member copies its own block in
//! (on both cores at once); the last to finish copying multiplies, on both cores, while the
//! others wait parked; every member then reads its rows of the result (or the whole sum) in
//! place, until the launch ends.
//!
//! The shared right operand of `shared_rhs` is read only while every member waits in the call:
//! the multiplier counts as one of the slot's readers, and a member that gives up (every wait
//! times out) returns only once it has stopped reading. A member that times out at the meeting
//! marks the slot abandoned under the lock and retracts its part, so nobody touches the
//! buffers of a member that has left; a panic in the copying or the product abandons the slot
//! before it unwinds.

use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_interp::{GemmCall, GemmPart, InterpError};
use tessera_ir::{CollectiveOp, DType, DotDims, Mesh, Op, ReduceKind};

use crate::collectives::{Seat, SharedCollectives, Wait, group};

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

/// A shared product's meeting: the op it stands for (for messages), the slot, the group,
/// every member's part in order, and the buffers (stacked left and right operands, result).
struct Meeting<'a> {
    seat: Seat<'a>,
    parts: Vec<PartAddr>,
    stacks: [usize; 3],
}

/// From every member's part: the bytes of the stacked left and right operands and of the
/// result, or `None` when the members do not agree on a product to share.
type Layout = fn(&[PartAddr]) -> Option<[usize; 3]>;

/// A buffer of `bytes` bytes the launch owns until it ends; returns its address. Its
/// elements are written before anyone reads them.
fn launch_buffer(c: &SharedCollectives<'_>, bytes: usize) -> usize {
    let mut b = Box::<[u64]>::new_uninit_slice(bytes.div_ceil(8).max(1));
    let at = b.as_mut_ptr() as usize;
    // Moving the box keeps its elements where they are.
    c.rendezvous.keep(b);
    at
}

/// The meeting: every member publishes its part; the last to arrive, still holding the lock,
/// decides with `layout` whether the product is shared and allocates its buffers, so every
/// member leaves the meeting with the same answer: the meeting, or `None` (the slot is then
/// left).
fn meet<'a>(
    c: &SharedCollectives<'_>,
    op: &'a Op,
    members: &'a [usize],
    me: usize,
    part: &GemmPart,
    layout: Layout,
) -> Result<Option<Meeting<'a>>, InterpError> {
    let (mut slots, seat) = c.meet(
        op,
        members,
        me,
        |s| {
            s.gemms[me] = Some(PartAddr::of(part));
            if s.gemms.iter().all(|g| g.is_some()) {
                let parts: Vec<PartAddr> = s.gemms.iter().flatten().copied().collect();
                s.stacks = layout(&parts).map(|bytes| bytes.map(|b| launch_buffer(c, b)));
            }
        },
        |s| s.gemms.iter().all(|g| g.is_some()),
    )?;
    let slot = &slots[&seat.key];
    let parts: Vec<PartAddr> = slot.gemms.iter().flatten().copied().collect();
    let Some(stacks) = slot.stacks else {
        c.leave(&mut slots, &seat.key, members.len());
        return Ok(None);
    };
    Ok(Some(Meeting {
        seat,
        parts,
        stacks,
    }))
}

/// The rest of a shared product: this member copies its blocks into the stacked operands with
/// `fill`; the last member to finish multiplies with `multiply` while the others wait parked.
///
/// The multiplier reads the members' shared right operand (`shared_rhs`), so it counts
/// itself among the slot's readers, under the lock and only if the slot is not abandoned; a
/// member that gives up waiting for the product waits for it to stop reading (`bail`). A panic
/// in `fill` or `multiply` abandons the slot before it unwinds, so the others fail at once.
fn fill_and_multiply(
    c: &SharedCollectives<'_>,
    Meeting { seat, .. }: &Meeting<'_>,
    fill: impl FnOnce(),
    multiply: impl FnOnce(),
) -> Result<(), InterpError> {
    let n = seat.members.len();
    let r = c.rendezvous;
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(fill)) {
        let mut slots = r.lock();
        slots.give_up(&seat.key, c.device_id());
        c.bail(seat, slots, false, ());
        std::panic::resume_unwind(panic);
    }
    let mut slots = r.lock();
    let launch_failed = !slots.failed.is_empty();
    let slot = slots.get_mut(&seat.key).expect("slot present");
    slot.copied += 1;
    slot.progress[seat.me] = 2;
    if slot.copied == n && !slot.abandoned() && !launch_failed {
        slot.readers += 1;
        slot.multiplier = Some(seat.me);
        drop(slots);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(multiply));
        slots = r.lock();
        let slot = slots.get_mut(&seat.key).expect("slot present");
        slot.readers -= 1;
        match &outcome {
            Ok(()) => {
                slot.gemm_done = true;
                SHARED_GEMMS.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => slots.give_up(&seat.key, c.device_id()),
        }
        r.arrived.notify_all();
        if let Err(panic) = outcome {
            c.bail(seat, slots, false, ());
            std::panic::resume_unwind(panic);
        }
    } else {
        r.arrived.notify_all();
    }
    // The product is done (by this member: no wait), or another member's to wait for; an
    // abandoned slot fails here first.
    slots = c.wait(seat, slots, Wait::Product, false, |s| s.gemm_done)?;
    c.leave(&mut slots, &seat.key, n);
    Ok(())
}

/// `shared_rhs`'s agreement: one right operand (the same buffer, strides and sizes).
fn stacked_rows(parts: &[PartAddr]) -> Option<[usize; 3]> {
    let first = parts[0];
    let same = |p: &PartAddr| {
        (p.rhs, p.rhs_strides, p.n, p.k, p.dtype)
            == (first.rhs, first.rhs_strides, first.n, first.k, first.dtype)
    };
    let size = first.dtype.byte_width();
    let rows: usize = parts.iter().map(|p| p.m).sum();
    parts
        .iter()
        .all(same)
        .then_some([rows * first.k * size, 0, rows * first.n * size])
}

/// `all_reduce`'s agreement: one result shape, and views that stack the same way.
fn stacked_depth(parts: &[PartAddr]) -> Option<[usize; 3]> {
    let first = parts[0];
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
    let size = first.dtype.byte_width();
    parts.iter().all(|p| lay(p) == lay(&first)).then_some([
        m * depth * size,
        depth * n * size,
        m * n * size,
    ])
}

/// See `Collectives::gemm_shared_rhs`; the group is the whole mesh. Every member's rows of the
/// result are a dense row-major block of the stacked result.
///
/// # Safety
/// As `Collectives::gemm_shared_rhs`.
pub(crate) unsafe fn shared_rhs(
    c: &SharedCollectives<'_>,
    mesh: &Mesh,
    part: &GemmPart,
    gemm: &(dyn Fn(&GemmCall) + Sync),
) -> Result<Option<*const u8>, InterpError> {
    let axes: Vec<String> = mesh.axes.iter().map(|(a, _)| a.clone()).collect();
    let (members, me) = group(mesh, &axes, c.position);
    if members.len() < 2 {
        return Ok(None);
    }
    let op = Op::DotGeneral(DotDims::matmul());
    let Some(meeting) = meet(c, &op, &members, me, part, stacked_rows)? else {
        return Ok(None);
    };
    let ([lhs, _, out], parts) = (meeting.stacks, &meeting.parts);
    let first = parts[0];
    let (size, k, nn) = (first.dtype.byte_width(), first.k, first.n);
    let rows: usize = parts.iter().map(|p| p.m).sum();
    let row0: usize = parts[..me].iter().map(|p| p.m).sum();
    fill_and_multiply(
        c,
        &meeting,
        || {
            // SAFETY: this member's left operand is a live `m x k` view (its own); its block
            // of the stacked operand, rows `row0..row0 + m`, is written by it alone.
            unsafe {
                copy_block(
                    (part.lhs, part.lhs_strides),
                    ((lhs as *mut u8).add(row0 * k * size), [k as isize, 1]),
                    (part.m, k, size),
                )
            }
        },
        || {
            gemm(&GemmCall {
                m: rows,
                n: nn,
                k,
                lhs: lhs as *const u8,
                lhs_strides: [k as isize, 1],
                // Every member's right operand: the members wait in the call, so it lives.
                rhs: first.rhs as *const u8,
                rhs_strides: first.rhs_strides,
                out: out as *mut u8,
                out_strides: [nn as isize, 1],
            })
        },
    )?;
    // SAFETY: rows `row0..row0 + m` lie inside the stacked result.
    Ok(Some(unsafe { (out as *const u8).add(row0 * nn * size) }))
}

/// See `Collectives::gemm_all_reduce`: the sum, a dense row-major `m x n` buffer the launch
/// owns, is read by every member in place of its all-reduce's result.
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
    let Op::Collective(CollectiveOp::AllReduce {
        kind: ReduceKind::Sum,
        axes,
    }) = op
    else {
        return Ok(None);
    };
    let (members, me) = group(mesh, axes, c.position);
    if members.len() < 2 {
        return Ok(None);
    }
    let Some(meeting) = meet(c, op, &members, me, part, stacked_depth)? else {
        return Ok(None);
    };
    let ([lhs, rhs, out], parts) = (meeting.stacks, &meeting.parts);
    let (size, m, nn) = (part.dtype.byte_width(), part.m, part.n);
    let depth: usize = parts.iter().map(|p| p.k).sum();
    let at: usize = parts[..me].iter().map(|p| p.k).sum();
    // Stacked so that each member's view moves as whole lines (the same for all: `meet`).
    let ls = stacked_strides(m, depth, part.lhs_strides[0] == 1);
    let rs = stacked_strides(depth, nn, part.rhs_strides[0] == 1);
    fill_and_multiply(
        c,
        &meeting,
        || {
            let (z, at) = (size as isize, at as isize);
            // SAFETY: this member's operands are live views (its own); its blocks of the
            // stacked operands, columns (rows) `at..at + k`, are written by it alone.
            unsafe {
                copy_block(
                    (part.lhs, part.lhs_strides),
                    ((lhs as *mut u8).offset(at * ls[1] * z), ls),
                    (m, part.k, size),
                );
                copy_block(
                    (part.rhs, part.rhs_strides),
                    ((rhs as *mut u8).offset(at * rs[0] * z), rs),
                    (part.k, nn, size),
                );
            }
        },
        // The sum over the group is one product over all the members' rows.
        || {
            gemm(&GemmCall {
                m,
                n: nn,
                k: depth,
                lhs: lhs as *const u8,
                lhs_strides: ls,
                rhs: rhs as *const u8,
                rhs_strides: rs,
                out: out as *mut u8,
                out_strides: [nn as isize, 1],
            })
        },
    )?;
    Ok(Some(out as *const u8))
}
