//! Collectives over shared memory between the device threads of one process, built on the
//! transport's rendezvous (`tessera_transport::rendezvous`: the protocol, its faults and its
//! safety argument are there).
//!
//! A copying collective publishes each member's value and, once the group is complete,
//! computes this member's result from all the values in group order
//! (`tessera_transport::values`), so every device gets bit-identical sums. Large all-reduces
//! run between the devices' buffers instead (`all_reduce_buffers`, three meetings), and the
//! shared products are in `shared_gemm.rs`.

use std::cell::Cell;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tessera_ir::{DType, Literal, ReduceKind, TensorType};
use tessera_transport::rendezvous::{Barrier, Items, Member, Rendezvous, Seat, SlotKey};
use tessera_transport::{Collectives, Group, SharedProducts, TransportError, values};

/// The default collective timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// `TESSERA_COLLECTIVE_TIMEOUT`: seconds, a positive number (`0.1` is 100 ms); unset or empty
/// means 60 s. Read once per process; anything else is an error saying what was expected.
pub fn collective_timeout() -> Result<Duration, String> {
    static TIMEOUT: std::sync::OnceLock<Result<Duration, String>> = std::sync::OnceLock::new();
    TIMEOUT
        .get_or_init(|| parse_timeout(std::env::var("TESSERA_COLLECTIVE_TIMEOUT").ok().as_deref()))
        .clone()
}

/// `collective_timeout` for the variable's value `v` (`None`: unset).
pub fn parse_timeout(v: Option<&str>) -> Result<Duration, String> {
    let v = match v.map(str::trim) {
        None | Some("") => return Ok(DEFAULT_TIMEOUT),
        Some(v) => v,
    };
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            format!(
                "TESSERA_COLLECTIVE_TIMEOUT={v:?}: expected a positive number of seconds \
                 (e.g. 60 or 0.5), or unset for 60 s"
            )
        })
}

/// One device's view of the collectives of a launch.
pub struct SharedCollectives<'a> {
    pub rendezvous: &'a Rendezvous,
    pub launch: u64,
    /// This device's position in the mesh (row-major over the mesh axes).
    pub position: usize,
    /// Device ids of the mesh positions, for error messages.
    pub device_ids: &'a [usize],
    seq: Cell<u64>,
}

impl<'a> SharedCollectives<'a> {
    pub fn new(
        rendezvous: &'a Rendezvous,
        launch: u64,
        position: usize,
        device_ids: &'a [usize],
    ) -> Self {
        SharedCollectives {
            rendezvous,
            launch,
            position,
            device_ids,
            seq: Cell::new(0),
        }
    }

    /// How many meetings this member has taken a seat at (the next one's sequence number).
    pub(crate) fn seq(&self) -> u64 {
        self.seq.get()
    }

    /// The device id of mesh position `p`.
    fn id_of(&self, p: usize) -> usize {
        self.device_ids.get(p).copied().unwrap_or(p)
    }

    /// Tells the launch's other devices that this one gave up (its program failed or
    /// panicked): every wait of the launch, now or later, fails at once naming it, instead of
    /// waiting for its timeout.
    pub fn give_up(&self) {
        self.rendezvous.give_up_as(self.id_of(self.position));
    }

    /// This member's seat at its next meeting, with `group`; messages name it `op` over
    /// `label`. Takes the next sequence number.
    pub(crate) fn seat<T, D>(
        &self,
        group: &Group,
        op: &'static str,
        label: Arc<str>,
    ) -> Seat<'a, T, D>
    where
        T: Clone + Send + 'static,
        D: Clone + Send + 'static,
    {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        self.rendezvous.seat(Member {
            key: SlotKey {
                launch: self.launch,
                seq,
                members: group.members.iter().copied().collect(),
            },
            me: group.me,
            ids: group.members.iter().map(|&p| self.id_of(p)).collect(),
            op,
            group: label,
        })
    }

    /// Every member's value, in group order (no meeting for a group of one).
    fn exchange(
        &self,
        op: &'static str,
        group: &Group,
        x: &Literal,
    ) -> Result<Items<Arc<Literal>>, TransportError> {
        let x = Arc::new(x.clone());
        if group.len() == 1 {
            return Ok(smallvec::smallvec![x]);
        }
        let mut seat = self.seat::<Arc<Literal>, ()>(group, op, group.label());
        let (values, ()) = seat.arrive(x, |_| (), false)?;
        seat.leave();
        Ok(values)
    }
}

fn refs(values: &[Arc<Literal>]) -> Vec<&Literal> {
    values.iter().map(|v| v.as_ref()).collect()
}

/// Below this many elements an all-reduce takes one meeting instead of two (copying) or three
/// (in place).
pub(crate) const SMALL_ALL_REDUCE: usize = 1 << 14;

/// An all-reduce operand's element count and dtype, which every member publishes beside its
/// buffers' addresses.
type Operand = (usize, DType);

/// Refuses a meeting whose members' operands differ in element count or dtype (their programs
/// differ): each would read the others' buffers as its own. Every member sees the same items,
/// so every member refuses.
fn same_operands(
    mine: Operand,
    theirs: impl Iterator<Item = Operand>,
) -> Result<(), TransportError> {
    let mut theirs = theirs;
    match theirs.find(|&o| o != mine) {
        None => Ok(()),
        Some((len, dtype)) => Err(TransportError::Invalid {
            op: "all_reduce",
            message: format!(
                "the members' operands differ: {} {:?} elements here, {len} {dtype:?} on another \
                 (their programs differ)",
                mine.0, mine.1
            ),
        }),
    }
}

/// The element range of chunk `k` of `n` over `len` elements.
fn chunk_range(len: usize, k: usize, n: usize) -> Range<usize> {
    let per = len.div_ceil(n);
    (k * per).min(len)..((k + 1) * per).min(len)
}

impl SharedCollectives<'_> {
    /// A small all-reduce (fewer than `SMALL_ALL_REDUCE` elements, a group of two or more)
    /// in one meeting: each member copies its operand into a launch buffer, which lives
    /// until the launch ends and which its owner never writes again, and publishes its
    /// address; once all have arrived, each reduces every member's copy, in group order,
    /// into its own result (the bits of the copying path, `values::reduce_widened`, on every
    /// member). A member leaves at once: the copies it read outlive every reader, so no second
    /// meeting waits for the reads. Allocates nothing once the launch buffers and the
    /// meeting's slot are kept (`Rendezvous::launch_buffer`, `end_launch`).
    ///
    /// # Safety
    /// As `Collectives::all_reduce_buffers`: `input` holds a value of type `ty`, `out` has
    /// room for one, and they stay valid for the call.
    unsafe fn all_reduce_staged(
        &self,
        group: &Group,
        kind: ReduceKind,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), TransportError> {
        let bytes = ty.byte_size();
        let staged = self.rendezvous.launch_buffer(bytes);
        // SAFETY: `input` holds `bytes` bytes (the caller's contract); `staged` has room for
        // them (`launch_buffer`) and is a buffer of this launch no one else has.
        unsafe { std::ptr::copy_nonoverlapping(input, staged, bytes) };
        let mut seat = self.seat::<(usize, Operand), ()>(group, "all_reduce", group.label());
        let mine = (ty.numel(), ty.dtype);
        let (copies, ()) = seat.arrive((staged as usize, mine), |_| (), false)?;
        same_operands(mine, copies.iter().map(|&(_, o)| o))?;
        let srcs: Items<*const u8> = copies.iter().map(|&(a, _)| a as *const u8).collect();
        // SAFETY: every copy holds `ty.numel()` elements of `ty.dtype` (checked above), written
        // by its owner before it arrived (the meeting's lock orders that write before these
        // reads) and not written again before every member has left; it lives until the launch
        // ends or, given back by the last member to leave, until then. `out` has room for the
        // result and is none of the copies.
        let reduced = unsafe { values::reduce_raw(kind, ty.dtype, &srcs, out, ty.numel()) };
        debug_assert!(reduced, "bool all-reduces take the copying path");
        if seat.leave() {
            for &(a, _) in &copies {
                // SAFETY: each copy came from `launch_buffer(bytes)` of this launch (every
                // member's has `bytes`: checked above), and every member has left, after its
                // reads: nobody reads or writes it any more.
                unsafe { self.rendezvous.give_back(a as *mut u8, bytes) };
            }
        }
        Ok(())
    }
}

impl Collectives for SharedCollectives<'_> {
    fn position(&self) -> usize {
        self.position
    }

    /// Small values: one meeting, every member reduces all of them (the same order on each,
    /// so the same bits), which saves a second meeting that costs more than the arithmetic.
    /// Large ones in two: every member reduces its own chunk of the elements over all the
    /// values, then every member assembles the chunks. Each device does 1/n of the arithmetic.
    fn all_reduce(
        &self,
        group: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let n = group.len();
        if n == 1 {
            return Ok(x.clone());
        }
        let mut seat = self.seat::<Arc<Literal>, ()>(group, "all_reduce", group.label());
        let (values, ()) = seat.arrive(Arc::new(x.clone()), |_| (), false)?;
        let len = x.data.len();
        if len < SMALL_ALL_REDUCE {
            seat.leave();
            return Ok(Literal {
                ty: x.ty.clone(),
                data: values::reduce_widened(kind, &refs(&values), 0..len)?,
            });
        }
        let mine = values::reduce_widened(kind, &refs(&values), chunk_range(len, group.me, n))?;
        drop(values);
        let chunk = Literal {
            ty: TensorType::new(x.ty.dtype, vec![mine.len()]),
            data: mine,
        };
        seat.advance(2, Some(Arc::new(chunk)));
        let chunks = seat.wait(Barrier::all(2, "did not deliver their reduced chunk"))?;
        seat.leave();
        let parts = refs(&chunks);
        let whole = values::concat("all_reduce", &parts, 0)?;
        Ok(Literal {
            ty: x.ty.clone(),
            data: whole.data,
        })
    }

    fn all_gather(
        &self,
        group: &Group,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let values = self.exchange("all_gather", group, x)?;
        values::concat("all_gather", &refs(&values), dim)
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let values = self.exchange("reduce_scatter", group, x)?;
        let sum = values::reduce(kind, &refs(&values))?;
        values::chunk("reduce_scatter", &sum, dim, group.me, group.len())
    }

    fn all_to_all(
        &self,
        group: &Group,
        split_dim: usize,
        concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let values = self.exchange("all_to_all", group, x)?;
        values::all_to_all(&refs(&values), split_dim, concat_dim, group.me)
    }

    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let values = self.exchange("collective_permute", group, x)?;
        Ok(values::permute(&refs(&values), pairs, group.me))
    }

    /// Large all-reduces (`SMALL_ALL_REDUCE` elements or more, not bool, a group of two or
    /// more) run between the devices' buffers in three meetings:
    /// 1. every member publishes its operand's and result's addresses;
    /// 2. each member has reduced its chunk of every member's operand into its own result;
    /// 3. each member has copied the other chunks from their owners' results into its own.
    ///
    /// From meeting 1 to leaving, a member is one of the slot's readers; the rendezvous's
    /// protocol keeps every buffer alive while it is read. Small ones (not bool, a group of
    /// two or more) meet once over copies in launch buffers (`all_reduce_staged`); the others
    /// copy (`tessera_transport::all_reduce_by_copy`).
    unsafe fn all_reduce_buffers(
        &self,
        group: &Group,
        kind: ReduceKind,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), TransportError> {
        let n = group.len();
        if n >= 2 && ty.numel() < SMALL_ALL_REDUCE && ty.dtype != DType::Bool {
            // SAFETY: forwarded from the caller.
            return unsafe { self.all_reduce_staged(group, kind, ty, input, out) };
        }
        if n < 2 || ty.numel() < SMALL_ALL_REDUCE || ty.dtype == DType::Bool {
            // SAFETY: forwarded from the caller.
            return unsafe {
                tessera_transport::all_reduce_by_copy(self, group, kind, ty, input, out)
            };
        }
        let me = group.me;
        let mut seat = self.seat::<(usize, usize, Operand), ()>(group, "all_reduce", group.label());
        let operand = (ty.numel(), ty.dtype);
        let (buffers, ()) = seat.arrive((input as usize, out as usize, operand), |_| (), true)?;
        same_operands(operand, buffers.iter().map(|&(_, _, o)| o))?;
        let len = ty.numel();
        let size = ty.dtype.byte_width();
        let mine = chunk_range(len, me, n);
        let srcs: Items<*const u8> = buffers
            .iter()
            // SAFETY: `mine` lies inside every operand (they all have type `ty`: checked).
            .map(|&(i, _, _)| unsafe { (i as *const u8).add(mine.start * size) })
            .collect();
        // SAFETY: each member's operand stays valid and unwritten until no member reads it
        // (the rendezvous's rule 2; it leaves meeting 3 only after everyone's reads); only this
        // member writes chunk `mine` of `out` (its own result), and it reads chunk `mine` of its
        // own operand in the same block before writing it, if they are the same.
        let reduced = unsafe {
            values::reduce_raw(
                kind,
                ty.dtype,
                &srcs,
                out.add(mine.start * size),
                mine.len(),
            )
        };
        debug_assert!(reduced, "bool all-reduces take the copying path");
        seat.advance(2, None);
        seat.wait(Barrier::all(2, "did not finish their share"))?;
        for (k, &(_, theirs, _)) in buffers.iter().enumerate() {
            if k == me {
                continue;
            }
            let c = chunk_range(len, k, n);
            // SAFETY: member `k` wrote chunk `c` of its result before meeting 2 and nobody
            // writes it again before everyone leaves meeting 3 (or, giving up, stops reading);
            // this member's result is a different allocation, and only this member writes it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (theirs as *const u8).add(c.start * size),
                    out.add(c.start * size),
                    c.len() * size,
                )
            };
        }
        seat.advance(3, None);
        seat.wait(Barrier::all(3, "did not finish copying the result"))?;
        seat.leave();
        Ok(())
    }

    fn shared_products(&self) -> Option<&dyn SharedProducts> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{CollectiveOp, Data, Mesh, Op};

    fn mesh() -> Mesh {
        Mesh::new("m", vec![("x".into(), 2), ("y".into(), 2)])
    }

    fn all_reduce(kind: ReduceKind) -> CollectiveOp {
        CollectiveOp::AllReduce {
            kind,
            axes: vec!["x".into(), "y".into()],
        }
    }

    #[test]
    fn a_device_that_never_arrives_is_an_error_naming_it() {
        let r = Rendezvous::with_timeout(Duration::from_millis(50));
        let ids = [10, 11, 12, 13];
        let c = SharedCollectives::new(&r, 0, 0, &ids);
        let op = CollectiveOp::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec!["x".into()],
        };
        let x = Literal::scalar_f32(1.0);
        let err = tessera_transport::run(&c, &op, &mesh(), Some(&x), &x.ty)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "all_reduce: over [\"x\"]: devices [12] did not arrive within 50 ms (device 10 gave up)"
        );
    }

    #[test]
    fn bad_timeouts_are_errors_that_say_what_was_expected() {
        assert_eq!(parse_timeout(None), Ok(Duration::from_secs(60)));
        assert_eq!(parse_timeout(Some(" ")), Ok(Duration::from_secs(60)));
        assert_eq!(parse_timeout(Some("0.1")), Ok(Duration::from_millis(100)));
        assert_eq!(parse_timeout(Some("2")), Ok(Duration::from_secs(2)));
        for bad in ["abc", "0", "-1", "nan", "inf", "1e300", "1e-12"] {
            let e = parse_timeout(Some(bad)).unwrap_err();
            assert!(
                e.contains(&format!("TESSERA_COLLECTIVE_TIMEOUT={bad:?}"))
                    && e.contains("expected a positive number of seconds"),
                "{e}"
            );
        }
    }

    /// Runs `f(collectives, position)` on four threads, one per position of `mesh()`.
    fn on_four<T: Send>(f: impl Fn(&SharedCollectives<'_>, usize) -> T + Sync) -> Vec<T> {
        let r = Rendezvous::default();
        let ids = [0, 1, 2, 3];
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|p| {
                    let (r, ids, f) = (&r, &ids, &f);
                    s.spawn(move || f(&SharedCollectives::new(r, 7, p, ids), p))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Small values (one meeting) and large ones (reduced chunk-wise in two meetings).
    #[test]
    fn all_reduce_between_threads() {
        for len in [3, SMALL_ALL_REDUCE + 5] {
            let results = on_four(|c, p| {
                let v: Vec<f32> = (0..len).map(|i| (i % 7) as f32 + p as f32).collect();
                let x = Literal::new([len], Data::F32(v)).unwrap();
                tessera_transport::run(c, &all_reduce(ReduceKind::Sum), &mesh(), Some(&x), &x.ty)
                    .unwrap()
            });
            for l in results {
                for i in [0, 1, len / 2, len - 1] {
                    assert_eq!(
                        l.data.get_f64(i),
                        4.0 * (i % 7) as f64 + 6.0,
                        "len {len} element {i}"
                    );
                }
            }
        }
    }

    /// The all-reduce between buffers against the copying one, every kind and numeric dtype,
    /// with the result in a separate buffer and in the operand's own (the plan may share
    /// them): large (in place, a chunk count that does not divide the length), small (over
    /// staged copies, `all_reduce_staged`) and empty; and 1/10 + 2/10 + ... summed in f64.
    #[test]
    fn all_reduce_between_buffers_matches_the_copying_path() {
        for len in [SMALL_ALL_REDUCE + 13, 37, 0] {
            all_reduce_between_buffers_of(len);
        }
    }

    fn all_reduce_between_buffers_of(len: usize) {
        let value = |p: usize, i: usize| ((i * 7 + p * 3) % 11) as f64 / 10.0 - 0.4;
        let make = |dtype: DType, p: usize| {
            let vs = (0..len).map(|i| value(p, i));
            let ints = || vs.clone().map(|v| (v * 10.0 + 4.0).round());
            let data = match dtype {
                DType::F32 => Data::F32(vs.clone().map(|v| v as f32).collect()),
                DType::F64 => Data::F64(vs.clone().collect()),
                DType::I32 => Data::I32(ints().map(|v| v as i32).collect()),
                DType::U32 => Data::U32(ints().map(|v| v as u32).collect()),
                DType::I64 => Data::I64(ints().map(|v| v as i64 - (1 << 40)).collect()),
                DType::F16 => Data::F16(vs.clone().map(tessera_ir::f16::from_f64).collect()),
                DType::BF16 => Data::BF16(vs.clone().map(tessera_ir::bf16::from_f64).collect()),
                DType::Bool => unreachable!("not reduced"),
            };
            Literal::new([len], data).unwrap()
        };
        for dtype in DType::ALL.into_iter().filter(|&d| d != DType::Bool) {
            for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
                for aliased in [false, true] {
                    let results = on_four(|c, p| {
                        let x = make(dtype, p);
                        let op = all_reduce(kind);
                        let want =
                            tessera_transport::run(c, &op, &mesh(), Some(&x), &x.ty).unwrap();
                        let mut operand = make(dtype, p);
                        let mut out = Literal::zeros(&x.ty);
                        let input = values::data_ptr(&operand.data);
                        let dst = if aliased {
                            values::data_ptr_mut(&mut operand.data)
                        } else {
                            values::data_ptr_mut(&mut out.data)
                        };
                        let group = Group::of(&mesh(), op.axes(), p);
                        // SAFETY: both buffers hold `len` elements of the type and live until
                        // the call returns.
                        unsafe { c.all_reduce_buffers(&group, kind, &x.ty, input, dst) }.unwrap();
                        (want, if aliased { operand } else { out })
                    });
                    for (want, got) in results {
                        assert_eq!(want, got, "{len} {dtype:?} {kind:?} aliased {aliased}");
                    }
                }
            }
        }
    }

    /// Small all-reduces repeated in one launch (a loop body's) reuse their staged copies: the
    /// launch holds a member's worth of buffers, not one a meeting and member.
    #[test]
    fn a_loop_of_small_all_reduces_keeps_a_bounded_number_of_buffers() {
        let r = Rendezvous::default();
        let ids = [0, 1, 2, 3];
        let group = |p: usize| Group::of(&mesh(), &["x".to_string(), "y".to_string()], p);
        std::thread::scope(|s| {
            for p in 0..4 {
                let (r, ids) = (&r, &ids);
                s.spawn(move || {
                    let c = SharedCollectives::new(r, 7, p, ids);
                    let x = Literal::new([3], Data::F32(vec![p as f32, 1.0, 2.0])).unwrap();
                    let mut out = Literal::zeros(&x.ty);
                    for _ in 0..200 {
                        let dst = values::data_ptr_mut(&mut out.data);
                        // SAFETY: both buffers hold 3 f32 and live until the call returns.
                        unsafe {
                            c.all_reduce_buffers(
                                &group(p),
                                ReduceKind::Sum,
                                &x.ty,
                                values::data_ptr(&x.data),
                                dst,
                            )
                        }
                        .unwrap();
                        assert!(out.data.bits_eq(&Data::F32(vec![6.0, 4.0, 8.0])));
                    }
                });
            }
        });
        // Four members' copies a meeting; a member may take its next copy before the last one
        // to leave gives the meeting's back, so a few meetings' worth at most.
        assert!(r.kept_buffers() <= 16, "{} buffers kept", r.kept_buffers());
    }

    /// Members whose all-reduce operands differ (programs that differ) all refuse the
    /// meeting with an error saying so, small or large, instead of reading each other's
    /// buffers as their own.
    #[test]
    fn all_reduce_operands_that_differ_are_an_error() {
        for len in [5, SMALL_ALL_REDUCE + 5] {
            let errors = on_four(|c, p| {
                let x = Literal::zeros(&TensorType::new(DType::F32, vec![len + p % 2]));
                let mut out = Literal::zeros(&x.ty);
                let group = Group::of(&mesh(), &["x".to_string(), "y".to_string()], p);
                // SAFETY: both buffers hold the type's elements and live until the call
                // returns.
                let r = unsafe {
                    c.all_reduce_buffers(
                        &group,
                        ReduceKind::Sum,
                        &x.ty,
                        values::data_ptr(&x.data),
                        values::data_ptr_mut(&mut out.data),
                    )
                };
                r.unwrap_err().to_string()
            });
            for e in errors {
                assert!(
                    e.contains("the members' operands differ") || e.contains("gave up"),
                    "{len}: {e}"
                );
            }
        }
    }

    /// Every copying collective between four threads against the same values' arithmetic
    /// done by one thread (`tessera_transport::values`), whose agreement with the interpreter
    /// `tessera-transport`'s oracle test checks.
    #[test]
    fn copying_collectives_between_threads() {
        let value = |p: usize| {
            let v: Vec<f32> = (0..32).map(|i| i as f32 * 0.1 + p as f32).collect();
            Literal::new([4, 8], Data::F32(v)).unwrap()
        };
        let all: Vec<Literal> = (0..4).map(value).collect();
        let refs: Vec<&Literal> = all.iter().collect();
        let axes = || vec!["x".into(), "y".into()];
        let ops = [
            CollectiveOp::AllGather {
                dim: 1,
                axes: axes(),
            },
            CollectiveOp::ReduceScatter {
                kind: ReduceKind::Sum,
                dim: 1,
                axes: axes(),
            },
            CollectiveOp::AllToAll {
                split_dim: 0,
                concat_dim: 1,
                axes: axes(),
            },
            CollectiveOp::CollectivePermute {
                axes: axes(),
                pairs: vec![(0, 1), (1, 2), (2, 0)],
            },
        ];
        for op in &ops {
            let got = on_four(|c, p| {
                let x = value(p);
                let out = Op::Collective(op.clone())
                    .infer_type(&[&x.ty], Some(&mesh()))
                    .unwrap();
                tessera_transport::run(c, op, &mesh(), Some(&x), &out).unwrap()
            });
            for (p, got) in got.iter().enumerate() {
                let want = match op {
                    CollectiveOp::AllGather { dim, .. } => {
                        values::concat("all_gather", &refs, *dim)
                    }
                    CollectiveOp::ReduceScatter { kind, dim, .. } => values::chunk(
                        "reduce_scatter",
                        &values::reduce(*kind, &refs).unwrap(),
                        *dim,
                        p,
                        4,
                    ),
                    CollectiveOp::AllToAll {
                        split_dim,
                        concat_dim,
                        ..
                    } => values::all_to_all(&refs, *split_dim, *concat_dim, p),
                    CollectiveOp::CollectivePermute { pairs, .. } => {
                        Ok(values::permute(&refs, pairs, p))
                    }
                    CollectiveOp::AllReduce { .. } | CollectiveOp::AxisIndex { .. } => {
                        unreachable!("not in the table")
                    }
                }
                .unwrap();
                assert_eq!(got, &want, "{} at {p}", op.name());
            }
        }
    }
}
