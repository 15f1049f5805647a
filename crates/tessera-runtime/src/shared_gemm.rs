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
//! Both go the same way: the members meet and publish their operands' views; the leader (the
//! group's first member) allocates the stacked operands and the result in buffers the launch
//! owns (freed when it ends); every member copies its own block in (on both cores at once);
//! the leader multiplies; every member then reads its rows of the result (or the whole sum) in
//! place, until the launch ends.
//!
//! The leader reads the members' right operand (shared) only while they wait in the call; a
//! member that times out at the first meeting marks the slot abandoned under the lock, so
//! nobody touches the buffers of a member that has left; a panic in the leader's product
//! abandons the slot before it unwinds.

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

/// A shared product's meeting: the op it stands for (for messages), the slot, the group and
/// this member's index in it.
struct Meeting<'a> {
    op: &'a Op,
    key: Key,
    members: &'a [usize],
    me: usize,
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

/// A buffer of `bytes` bytes the launch owns until it ends; returns its address. Its
/// elements are written before anyone reads them.
fn launch_buffer(c: &SharedCollectives<'_>, bytes: usize) -> usize {
    let mut b = Box::<[u64]>::new_uninit_slice(bytes.div_ceil(8).max(1));
    let at = b.as_mut_ptr() as usize;
    // Moving the box keeps its elements where they are.
    c.rendezvous.results.lock().expect("results lock").push(b);
    at
}

/// The rest of a shared product, once the members agreed to do it (`meet`): the leader
/// allocates the stacked operands and the result (`bytes` of each) and publishes them; every
/// member copies its own blocks in with `fill(lhs, rhs)`; the leader multiplies with
/// `multiply(lhs, rhs, out)` while the others wait parked. Returns the result's address,
/// readable until the launch ends.
fn stack_and_multiply(
    c: &SharedCollectives<'_>,
    Meeting {
        op,
        key,
        members,
        me,
    }: &Meeting<'_>,
    bytes: [usize; 3],
    fill: impl FnOnce(usize, usize),
    multiply: impl FnOnce(usize, usize, usize),
) -> Result<usize, InterpError> {
    let (n, me, key) = (members.len(), *me, key);
    let r = c.rendezvous;
    if me == 0 {
        let bufs = bytes.map(|b| launch_buffer(c, b));
        let mut slots = r.slots.lock().expect("rendezvous lock");
        slots.get_mut(key).expect("slot present").stacks = Some(bufs);
        r.arrived.notify_all();
    }
    let slots = r.slots.lock().expect("rendezvous lock");
    let slots = c.wait(op, slots, key, members, |s| s.stacks.is_some(), Wait::Step)?;
    let [lhs, rhs, out] = slots[key].stacks.expect("published");
    drop(slots);
    fill(lhs, rhs);
    let mut slots = r.slots.lock().expect("rendezvous lock");
    slots.get_mut(key).expect("slot present").copied += 1;
    r.arrived.notify_all();
    if me == 0 {
        slots = c.wait(op, slots, key, members, |s| s.copied == n, Wait::Step)?;
        drop(slots);
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| multiply(lhs, rhs, out)));
        slots = r.slots.lock().expect("rendezvous lock");
        let slot = slots.get_mut(key).expect("slot present");
        match &outcome {
            Ok(()) => {
                slot.gemm_done = true;
                SHARED_GEMMS.fetch_add(1, Ordering::Relaxed);
            }
            // The others wait without a timeout: they must hear of it before it unwinds.
            Err(_) => slot.abandoned = true,
        }
        r.arrived.notify_all();
        if let Err(panic) = outcome {
            drop(slots);
            std::panic::resume_unwind(panic);
        }
    } else {
        slots = c.wait(op, slots, key, members, |s| s.gemm_done, Wait::Parked)?;
    }
    c.leave(&mut slots, key, n);
    Ok(out)
}

/// Leaves the slot without doing anything: the members did not agree.
fn decline(
    c: &SharedCollectives<'_>,
    key: &Key,
    n: usize,
) -> Result<Option<*const u8>, InterpError> {
    let mut slots = c.rendezvous.slots.lock().expect("rendezvous lock");
    c.leave(&mut slots, key, n);
    Ok(None)
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
    let n = members.len();
    if n < 2 {
        return Ok(None);
    }
    let op = Op::DotGeneral(DotDims::matmul());
    let (key, parts) = meet(c, &op, &members, me, part)?;
    let first = parts[0];
    let same = |p: &PartAddr| {
        (p.rhs, p.rhs_strides, p.n, p.k, p.dtype)
            == (first.rhs, first.rhs_strides, first.n, first.k, first.dtype)
    };
    if !parts.iter().all(same) {
        return decline(c, &key, n);
    }
    let (size, k, nn) = (first.dtype.byte_width(), first.k, first.n);
    let rows: usize = parts.iter().map(|p| p.m).sum();
    let row0: usize = parts[..me].iter().map(|p| p.m).sum();
    let meeting = Meeting {
        op: &op,
        key,
        members: &members,
        me,
    };
    let out = stack_and_multiply(
        c,
        &meeting,
        [rows * k * size, 0, rows * nn * size],
        |lhs, _| {
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
        |lhs, _, out| {
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
    let same = |p: &PartAddr| (p.m, p.n, p.dtype) == (first.m, first.n, first.dtype);
    if !parts.iter().all(same) {
        return decline(c, &key, n);
    }
    let (size, m, nn) = (first.dtype.byte_width(), first.m, first.n);
    let depth: usize = parts.iter().map(|p| p.k).sum();
    let at: usize = parts[..me].iter().map(|p| p.k).sum();
    // Stack so that each member's view moves as whole lines.
    let ls = stacked_strides(m, depth, part.lhs_strides[0] == 1);
    let rs = stacked_strides(depth, nn, part.rhs_strides[0] == 1);
    if parts.iter().any(|p| {
        stacked_strides(m, depth, p.lhs_strides[0] == 1) != ls
            || stacked_strides(depth, nn, p.rhs_strides[0] == 1) != rs
    }) {
        return decline(c, &key, n);
    }
    let meeting = Meeting {
        op,
        key,
        members: &members,
        me,
    };
    let out = stack_and_multiply(
        c,
        &meeting,
        [m * depth * size, depth * nn * size, m * nn * size],
        |lhs, rhs| {
            let z = size as isize;
            let at = at as isize;
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
        |lhs, rhs, out| {
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
