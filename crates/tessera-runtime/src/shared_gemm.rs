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
//! How the parts stack is `tessera_transport::stacked`'s rule (which several devices run on
//! one thread follow too, `tessera_codegen::together`).
//!
//! Both go the same way, with no member waiting for another to wake up: the members meet and
//! publish their operands' views, and the last to arrive allocates the stacked operands and the
//! result in buffers the launch owns (freed when it ends); every member copies its own block in
//! (on both cores at once); the last to finish copying multiplies, on both cores, while the
//! others wait parked; every member then reads its rows of the result (or the whole sum) in
//! place, until the launch ends.
//!
//! The multiply runs on the runtime's own pool (`on_product_pool`), not on rayon's global
//! pool: a caller may be one of that pool's workers, waiting for the device threads, and with
//! every worker so waiting, nothing would run a multiply queued there
//! (`tests/rayon_callers.rs` of `tessera`).
//!
//! The meetings are the transport's rendezvous (`tessera_transport::rendezvous`, where the
//! safety argument is): the shared right operand of `shared_rhs` is read only by the elected
//! multiplier, one of the slot's readers, and a member that gives up (every wait times out)
//! returns only once it has stopped reading; a panic in the copying or the product drops the
//! member's seat, which abandons the slot before the panic goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_transport::rendezvous::{Barrier, Items, Seat};
use tessera_transport::stacked::{PartAddr, Stacking};
use tessera_transport::{GemmCall, GemmPart, Group, SharedProducts, TransportError};

use crate::collectives::SharedCollectives;

/// How many products were done once for a group, since the process started: for tests and
/// benchmarks.
pub fn shared_gemm_count() -> usize {
    SHARED_GEMMS.load(Ordering::Relaxed)
}

static SHARED_GEMMS: AtomicUsize = AtomicUsize::new(0);

/// The addresses of the stacked left and right operands and of the result, in buffers the
/// launch owns; every member's seat gets the same (or `None`: not shared).
type Stacks = Option<[usize; 3]>;

/// A shared product's seat: every member publishes its part, the last to arrive decides.
type ProductSeat<'r> = Seat<'r, PartAddr, Stacks>;

/// A shared product's meeting: the member's seat, every member's part in group order, and
/// the stacked left and right operands and the result.
type Meeting<'r> = (ProductSeat<'r>, Items<PartAddr>, [usize; 3]);

/// From every member's part: the bytes of the stacked left and right operands and of the
/// result, or `None` when the members do not agree on a product to share.
type Layout<'a> = &'a dyn Fn(&[PartAddr]) -> Option<[usize; 3]>;

/// The meeting: every member publishes its part; the last to arrive, still holding the lock,
/// decides with `layout` whether the product is shared and allocates its buffers, so every
/// member leaves the meeting with the same answer: its seat, every part and the buffers, or
/// `None` (the slot is then left).
fn meet<'r>(
    c: &SharedCollectives<'r>,
    group: &Group,
    (op, label): (&'static str, Arc<str>),
    part: &GemmPart,
    layout: Layout<'_>,
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

/// A product's views, sent to the pool's thread that multiplies.
struct CallRef<'a>(&'a GemmCall);

// SAFETY: the views' buffers are the members' and the launch's, alive while every member
// waits in the product (`stacked`). `install` blocks the elected member until the job has
// finished on the pool, a panic included (caught there and raised again on the member's
// thread only after the wait), so no pool thread uses the views after the borrow ends; while
// it runs, the pool's threads are the result's only writers and the operands' only readers
// besides the members, who only read.
unsafe impl Send for CallRef<'_> {}

impl CallRef<'_> {
    /// The call (a method, so that a closure captures the `Send` wrapper, not its field).
    fn get(&self) -> &GemmCall {
        self.0
    }
}

/// `gemm(call)` on the runtime's pool for products: as many threads as rayon's global pool
/// has (`RAYON_NUM_THREADS` is heeded), which run nothing but these multiplies and so never
/// wait for a caller. The elected member, a device thread, waits for it there. If the pool
/// cannot be built (no thread could be spawned), that is said once on stderr and the member
/// multiplies on the pool the GEMM library finds, as before the pool existed.
fn on_product_pool(gemm: &(dyn Fn(&GemmCall) + Sync), call: &GemmCall) {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("tessera-product-{i}"))
            .build();
        if let Err(e) = &built {
            eprintln!(
                "tessera: no pool for the devices' shared products ({e}): they multiply on \
                 rayon's global pool, which a call from one of its workers can starve"
            );
        }
        built.ok()
    });
    match pool {
        Some(pool) => {
            let call = CallRef(call);
            pool.install(move || gemm(call.get()));
        }
        None => gemm(call),
    }
}

impl SharedCollectives<'_> {
    /// A shared product stacked as `stacking` says (`tessera_transport::stacked`): the members
    /// meet, each copies its blocks in, the last to finish multiplies, and each gets its
    /// result in the stacked one (`Stacking::result`).
    ///
    /// # Safety
    /// As `SharedProducts::gemm_shared_rhs`.
    unsafe fn stacked(
        &self,
        stacking: Stacking,
        group: &Group,
        label: (&'static str, Arc<str>),
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        if group.len() < 2 {
            return Ok(None);
        }
        let layout = |parts: &[PartAddr]| stacking.layout(parts);
        let Some((seat, parts, stacks)) = meet(self, group, label, part, &layout)? else {
            return Ok(None);
        };
        fill_and_multiply(
            seat,
            // SAFETY: this member's views are live (the caller's contract) and its blocks of
            // the stacked operands are written by it alone (`Stacking::fill`); the buffers have
            // `layout`'s sizes.
            || unsafe { stacking.fill(&parts, group.me, stacks) },
            // Every member's operands: the members wait in the call, so they live.
            || on_product_pool(gemm, &stacking.call(&parts, stacks)),
        )?;
        Ok(Some(stacking.result(&parts, group.me, stacks)))
    }
}

impl SharedProducts for SharedCollectives<'_> {
    /// Every member's rows of the result are a dense row-major block of the stacked result.
    unsafe fn gemm_shared_rhs(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        let label = ("dot_general", "the devices' shared product".into());
        // SAFETY: the caller's contract.
        unsafe { self.stacked(Stacking::Rows, group, label, part, gemm) }
    }

    /// The sum, a dense row-major `m x n` buffer the launch owns, is read by every member in
    /// place of its all-reduce's result.
    unsafe fn gemm_all_reduce(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        let label = ("all_reduce", group.label());
        // SAFETY: the caller's contract.
        unsafe { self.stacked(Stacking::Depth, group, label, part, gemm) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{DType, Mesh};
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
