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
//! The meetings are the transport's rendezvous (`tessera_transport::rendezvous`, where the
//! safety argument is): the shared right operand of `shared_rhs` is read only by the elected
//! multiplier, one of the slot's readers, and a member that gives up (every wait times out)
//! returns only once it has stopped reading; a panic in the copying or the product drops the
//! member's seat, which abandons the slot before the panic goes on.

use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_ir::DType;
use tessera_transport::rendezvous::{Barrier, Seat};
use tessera_transport::values::copy_view;
use tessera_transport::{GemmCall, GemmPart, Group, SharedProducts, TransportError};

use crate::collectives::SharedCollectives;

/// A `GemmPart` as plain numbers, to sit in a slot shared between threads.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PartAddr {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    lhs: usize,
    lhs_strides: [isize; 2],
    rhs: usize,
    rhs_strides: [isize; 2],
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
        }
    }
}

/// How many products were done once for a group, since the process started: for tests and
/// benchmarks.
pub fn shared_gemm_count() -> usize {
    SHARED_GEMMS.load(Ordering::Relaxed)
}

static SHARED_GEMMS: AtomicUsize = AtomicUsize::new(0);

/// Row-major strides of a `rows x cols` block when the views copied into it have unit column
/// stride (or are scalar-strided anyway), column-major ones when they have unit row stride: so
/// that `copy_view` moves whole lines.
fn stacked_strides(rows: usize, cols: usize, unit_row_stride: bool) -> [isize; 2] {
    if unit_row_stride {
        [1, rows as isize]
    } else {
        [cols as isize, 1]
    }
}

/// The addresses of the stacked left and right operands and of the result, in buffers the
/// launch owns; every member's seat gets the same (or `None`: not shared).
type Stacks = Option<[usize; 3]>;

/// A shared product's seat: every member publishes its part, the last to arrive decides.
type ProductSeat<'r> = Seat<'r, PartAddr, Stacks>;

/// A shared product's meeting: the member's seat, every member's part in group order, and
/// the stacked left and right operands and the result.
type Meeting<'r> = (ProductSeat<'r>, Vec<PartAddr>, [usize; 3]);

/// From every member's part: the bytes of the stacked left and right operands and of the
/// result, or `None` when the members do not agree on a product to share.
type Layout = fn(&[PartAddr]) -> Option<[usize; 3]>;

/// The meeting: every member publishes its part; the last to arrive, still holding the lock,
/// decides with `layout` whether the product is shared and allocates its buffers, so every
/// member leaves the meeting with the same answer: its seat, every part and the buffers, or
/// `None` (the slot is then left).
fn meet<'r>(
    c: &SharedCollectives<'r>,
    group: &Group,
    (op, label): (&'static str, String),
    part: &GemmPart,
    layout: Layout,
) -> Result<Option<Meeting<'r>>, TransportError> {
    let r = c.rendezvous;
    let mut seat: ProductSeat<'r> = c.seat(group, op, label);
    let decide =
        |parts: &[PartAddr]| layout(parts).map(|bytes| bytes.map(|b| r.launch_buffer(b) as usize));
    let (parts, stacks) = seat.arrive(PartAddr::of(part), decide, false)?;
    match stacks {
        Some(stacks) => Ok(Some((seat, parts, stacks))),
        None => {
            seat.leave();
            Ok(None)
        }
    }
}

/// The rest of a shared product: this member copies its blocks into the stacked operands with
/// `fill` (stage 2); the last member to finish is elected and multiplies with `multiply`
/// (reading the members' buffers: one of the slot's readers) while the others wait parked
/// for stage 3. A panic in `fill` or `multiply` drops the seat, which abandons the slot, so
/// the others fail at once.
fn fill_and_multiply(
    mut seat: ProductSeat<'_>,
    fill: impl FnOnce(),
    multiply: impl FnOnce(),
) -> Result<(), TransportError> {
    fill();
    if seat.advance_and_elect(2, true) {
        multiply();
        SHARED_GEMMS.fetch_add(1, Ordering::Relaxed);
        seat.finish(3);
    }
    // Done by this member (no wait), or another member's to wait for; an abandoned slot fails
    // here first.
    seat.wait(Barrier::elected(3, "did not finish the group's product"))?;
    seat.leave();
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

impl SharedProducts for SharedCollectives<'_> {
    /// Every member's rows of the result are a dense row-major block of the stacked result.
    unsafe fn gemm_shared_rhs(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        if group.len() < 2 {
            return Ok(None);
        }
        let label = ("dot_general", "the devices' shared product".to_string());
        let Some((seat, parts, [lhs, _, out])) = meet(self, group, label, part, stacked_rows)?
        else {
            return Ok(None);
        };
        let first = parts[0];
        let (size, k, nn) = (first.dtype.byte_width(), first.k, first.n);
        let rows: usize = parts.iter().map(|p| p.m).sum();
        let row0: usize = parts[..group.me].iter().map(|p| p.m).sum();
        fill_and_multiply(
            seat,
            || {
                // SAFETY: this member's left operand is a live `m x k` view (its own); its
                // block of the stacked operand, rows `row0..row0 + m`, is written by it alone.
                unsafe {
                    copy_view(
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

    /// The sum, a dense row-major `m x n` buffer the launch owns, is read by every member in
    /// place of its all-reduce's result.
    unsafe fn gemm_all_reduce(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        if group.len() < 2 {
            return Ok(None);
        }
        let label = ("all_reduce", group.describe());
        let Some((seat, parts, [lhs, rhs, out])) = meet(self, group, label, part, stacked_depth)?
        else {
            return Ok(None);
        };
        let (size, m, nn) = (part.dtype.byte_width(), part.m, part.n);
        let depth: usize = parts.iter().map(|p| p.k).sum();
        let at: usize = parts[..group.me].iter().map(|p| p.k).sum();
        // Stacked so that each member's view moves as whole lines (the same for all: `meet`).
        let ls = stacked_strides(m, depth, part.lhs_strides[0] == 1);
        let rs = stacked_strides(depth, nn, part.rhs_strides[0] == 1);
        fill_and_multiply(
            seat,
            || {
                let (z, at) = (size as isize, at as isize);
                // SAFETY: this member's operands are live views (its own); its blocks of the
                // stacked operands, columns (rows) `at..at + k`, are written by it alone.
                unsafe {
                    copy_view(
                        (part.lhs, part.lhs_strides),
                        ((lhs as *mut u8).offset(at * ls[1] * z), ls),
                        (m, part.k, size),
                    );
                    copy_view(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::Mesh;
    use tessera_transport::rendezvous::Rendezvous;

    /// `out = lhs x rhs` over f32 views, element by element (the test's GEMM).
    fn naive(c: &GemmCall) {
        for i in 0..c.m as isize {
            for j in 0..c.n as isize {
                let mut acc = 0f32;
                for p in 0..c.k as isize {
                    // SAFETY: the transport passes views inside live f32 buffers.
                    unsafe {
                        let l = *(c.lhs as *const f32)
                            .offset(i * c.lhs_strides[0] + p * c.lhs_strides[1]);
                        let r = *(c.rhs as *const f32)
                            .offset(p * c.rhs_strides[0] + j * c.rhs_strides[1]);
                        acc += l * r;
                    }
                }
                // SAFETY: as above, and only this call writes `out`.
                unsafe {
                    *(c.out as *mut f32).offset(i * c.out_strides[0] + j * c.out_strides[1]) = acc
                };
            }
        }
    }

    /// Integer-valued, so every sum is exact whatever the order.
    fn matrix(rows: usize, cols: usize, seed: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7 + seed * 3) % 5) as f32 - 2.0)
            .collect()
    }

    /// Row-major `lhs (m x k) x rhs (k x n)`.
    fn product(lhs: &[f32], rhs: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| lhs[i * k + p] * rhs[p * n + j]).sum();
            }
        }
        out
    }

    /// Runs `f(collectives, group)` on one thread per position of a `dp=3` mesh.
    fn on_three<T: Send>(f: impl Fn(&SharedCollectives<'_>, &Group) -> T + Sync) -> Vec<T> {
        let r = Rendezvous::with_timeout(std::time::Duration::from_secs(10));
        let ids = [0, 1, 2];
        let mesh = Mesh::new("m", vec![("dp".into(), 3)]);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|p| {
                    let (r, ids, f, mesh) = (&r, &ids, &f, &mesh);
                    s.spawn(move || {
                        f(
                            &SharedCollectives::new(r, 0, p, ids),
                            &Group::whole(mesh, p),
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Three members with 2, 3 and 1 rows times one shared weight: each gets its own rows of
    /// the one stacked product. Members with different weights do not share (`None`).
    #[test]
    fn a_shared_rhs_product_gives_every_member_its_rows() {
        let (n, k) = (4, 5);
        let rows = [2, 3, 1];
        let w = matrix(k, n, 9);
        let before = shared_gemm_count();
        let got = on_three(|c, g| {
            let m = rows[g.me];
            let x = matrix(m, k, g.me);
            let part = GemmPart {
                dtype: DType::F32,
                m,
                n,
                k,
                lhs: x.as_ptr() as *const u8,
                lhs_strides: [k as isize, 1],
                rhs: w.as_ptr() as *const u8,
                rhs_strides: [n as isize, 1],
                out: std::ptr::null_mut(),
                out_strides: [n as isize, 1],
            };
            // SAFETY: the views lie inside `x` and `w`, alive and unwritten during the call.
            let block = unsafe { c.gemm_shared_rhs(g, &part, &naive) }
                .unwrap()
                .unwrap();
            // SAFETY: the block is a dense `m x n` f32 product alive until the launch (the
            // rendezvous) ends, after this copy.
            let got = unsafe { std::slice::from_raw_parts(block as *const f32, m * n) }.to_vec();
            (got, product(&x, &w, (m, n, k)))
        });
        for (p, (got, want)) in got.iter().enumerate() {
            assert_eq!(got, want, "member {p}");
        }
        assert!(shared_gemm_count() > before);
        // Each member its own weight: nothing to share, every member multiplies alone.
        let declined = on_three(|c, g| {
            let (x, w) = (matrix(1, k, 0), matrix(k, n, g.me));
            let part = GemmPart {
                dtype: DType::F32,
                m: 1,
                n,
                k,
                lhs: x.as_ptr() as *const u8,
                lhs_strides: [k as isize, 1],
                rhs: w.as_ptr() as *const u8,
                rhs_strides: [n as isize, 1],
                out: std::ptr::null_mut(),
                out_strides: [n as isize, 1],
            };
            // SAFETY: as above.
            unsafe { c.gemm_shared_rhs(g, &part, &naive) }
                .unwrap()
                .is_none()
        });
        assert_eq!(declined, [true, true, true]);
    }

    /// A weight gradient and its all-reduce as one product: every member's `x_p^T dy_p`
    /// (the left operand a transposed view, as fusion gives it), summed over the members,
    /// with contractions of different depths.
    #[test]
    fn a_product_and_its_all_reduce_are_one_product_over_every_members_rows() {
        let (m, n) = (3, 4);
        let depth = [2, 5, 3];
        let got = on_three(|c, g| {
            let k = depth[g.me];
            // `x` is `k x m` row-major: the left operand `x^T` is its transposed view.
            let x = matrix(k, m, g.me);
            let dy = matrix(k, n, g.me + 4);
            let part = GemmPart {
                dtype: DType::F32,
                m,
                n,
                k,
                lhs: x.as_ptr() as *const u8,
                lhs_strides: [1, m as isize],
                rhs: dy.as_ptr() as *const u8,
                rhs_strides: [n as isize, 1],
                out: std::ptr::null_mut(),
                out_strides: [n as isize, 1],
            };
            // SAFETY: the views lie inside `x` and `dy`, alive and unwritten during the call.
            let sum = unsafe { c.gemm_all_reduce(g, &part, &naive) }
                .unwrap()
                .unwrap();
            // SAFETY: a dense `m x n` f32 block alive until the rendezvous ends.
            unsafe { std::slice::from_raw_parts(sum as *const f32, m * n) }.to_vec()
        });
        let mut want = vec![0f32; m * n];
        for (p, &k) in depth.iter().enumerate() {
            let x = matrix(k, m, p);
            let xt: Vec<f32> = (0..m * k).map(|i| x[(i % k) * m + i / k]).collect();
            for (w, v) in want
                .iter_mut()
                .zip(product(&xt, &matrix(k, n, p + 4), (m, n, k)))
            {
                *w += v;
            }
        }
        for (p, got) in got.iter().enumerate() {
            assert_eq!(got, &want, "member {p}");
        }
    }
}
