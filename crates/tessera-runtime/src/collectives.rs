//! Collectives over shared memory between the device threads of one process.
//!
//! Every device of a group deposits its value in a slot keyed by (launch, sequence number,
//! group); each waits (parked on a condition variable, never spinning) until the group is
//! complete, then computes its own result from all the values, in group order, so every device
//! gets bit-identical sums. A device that does not arrive within the timeout turns into an
//! error naming the collective and the missing devices.
//!
//! This is the one transport behind the `Collectives` interface today; a process-spanning one
//! (MPI) would implement the same trait.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_interp::{Collectives, GemmCall, GemmPart, InterpError, eval_op};
use tessera_ir::{BinaryOp, DType, Data, Literal, Mesh, Op, ReduceKind, TensorType};

pub(crate) type Key = (u64, u64, Vec<usize>);

#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) values: Vec<Option<Arc<Literal>>>,
    /// For an all-reduce: each member's reduced chunk of the result.
    pub(crate) chunks: Vec<Option<Literal>>,
    /// For an all-reduce in place: each member's operand and result addresses.
    pub(crate) buffers: Vec<Option<(usize, usize)>>,
    /// For an all-reduce in place: how many members reduced their chunk, then copied the rest.
    pub(crate) reduced: usize,
    pub(crate) copied: usize,
    /// For a GEMM with a shared right operand: each member's part, and whether the stacked
    /// product is written back.
    pub(crate) gemms: Vec<Option<crate::shared_gemm::PartAddr>>,
    pub(crate) gemm_done: bool,
    /// For a shared product: the stacked left and right operands and the result, allocated by
    /// the last member to arrive (`None`: not shared).
    pub(crate) stacks: Option<[usize; 3]>,
    /// A member gave up waiting: nobody may use anybody's buffers.
    pub(crate) abandoned: bool,
    pub(crate) taken: usize,
}

impl Slot {
    /// The slot of a group of `n` members, nobody arrived.
    fn new(n: usize) -> Slot {
        Slot {
            values: vec![None; n],
            chunks: vec![None; n],
            buffers: vec![None; n],
            gemms: vec![None; n],
            ..Slot::default()
        }
    }

    /// Whether member `k` has arrived, whatever it brought.
    fn arrived(&self, k: usize) -> bool {
        self.values[k].is_some() || self.buffers[k].is_some() || self.gemms[k].is_some()
    }
}

/// The meeting point of one launch's devices.
pub struct Rendezvous {
    pub(crate) slots: Mutex<HashMap<Key, Slot>>,
    pub(crate) arrived: Condvar,
    timeout: Duration,
    /// Buffers the launch's members read until it ends (`shared_gemm::all_reduce`).
    pub(crate) results: Mutex<Vec<Box<[std::mem::MaybeUninit<u64>]>>>,
}

impl Default for Rendezvous {
    /// Waits give up after `TESSERA_COLLECTIVE_TIMEOUT` seconds (60 by default; read once).
    fn default() -> Self {
        static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
        let timeout = *TIMEOUT.get_or_init(|| {
            let secs = std::env::var("TESSERA_COLLECTIVE_TIMEOUT")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .unwrap_or(60.0);
            Duration::from_secs_f64(secs)
        });
        Rendezvous {
            slots: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            timeout,
            results: Mutex::new(Vec::new()),
        }
    }
}

impl Rendezvous {
    /// A rendezvous whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Rendezvous {
        Rendezvous {
            timeout,
            ..Rendezvous::default()
        }
    }
}

/// One device's view of the collectives of a launch.
pub struct SharedCollectives<'a> {
    pub rendezvous: &'a Rendezvous,
    pub launch: u64,
    /// This device's position in the mesh (row-major over the mesh axes).
    pub position: usize,
    /// Device ids of the mesh positions, for error messages.
    pub device_ids: &'a [usize],
    pub(crate) seq: Cell<u64>,
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
}

/// The mesh positions in this position's group over `axes` (ordered by the coordinates on
/// `axes`, major first), and this position's index in it.
pub fn group(mesh: &Mesh, axes: &[String], position: usize) -> (Vec<usize>, usize) {
    let sizes: Vec<usize> = mesh.axes.iter().map(|(_, s)| *s).collect();
    let mut coords = vec![0; sizes.len()];
    let mut rest = position;
    for i in (0..sizes.len()).rev() {
        coords[i] = rest % sizes[i];
        rest /= sizes[i];
    }
    let axis_pos: Vec<usize> = axes
        .iter()
        .filter_map(|a| mesh.axes.iter().position(|(n, _)| n == a))
        .collect();
    let n: usize = axis_pos.iter().map(|&i| sizes[i]).product();
    let mut members = Vec::with_capacity(n);
    let mut me = 0;
    for k in 0..n {
        let mut c = coords.clone();
        let mut r = k;
        for &i in axis_pos.iter().rev() {
            c[i] = r % sizes[i];
            r /= sizes[i];
        }
        let lin = c.iter().zip(&sizes).fold(0, |acc, (x, s)| acc * s + x);
        if lin == position {
            me = k;
        }
        members.push(lin);
    }
    (members, me)
}

fn apply(op: Op, args: &[&Literal], ty: &TensorType) -> Result<Literal, InterpError> {
    eval_op(&op, args, ty)
}

fn combine(kind: ReduceKind, values: &[Literal]) -> Result<Literal, InterpError> {
    let op = Op::Binary(match kind {
        ReduceKind::Sum => BinaryOp::Add,
        ReduceKind::Max => BinaryOp::Max,
        ReduceKind::Min => BinaryOp::Min,
    });
    let mut acc = values[0].clone();
    for v in &values[1..] {
        acc = apply(op.clone(), &[&acc, v], &v.ty)?;
    }
    Ok(acc)
}

/// Chunk `k` of `n` along `dim`.
fn chunk(x: &Literal, dim: usize, k: usize, n: usize) -> Result<Literal, InterpError> {
    let size = x.ty.dims()[dim] / n;
    let mut start = vec![0; x.ty.rank()];
    let mut limit = x.ty.dims().to_vec();
    start[dim] = k * size;
    limit[dim] = (k + 1) * size;
    let mut dims = x.ty.dims().to_vec();
    dims[dim] = size;
    apply(
        Op::Slice {
            start,
            limit,
            stride: vec![1; x.ty.rank()],
        },
        &[x],
        &TensorType::new(x.ty.dtype, dims),
    )
}

fn concat(parts: &[Literal], dim: usize) -> Result<Literal, InterpError> {
    let refs: Vec<&Literal> = parts.iter().collect();
    let mut dims = parts[0].ty.dims().to_vec();
    dims[dim] = parts.iter().map(|p| p.ty.dims()[dim]).sum();
    apply(
        Op::Concatenate { dim },
        &refs,
        &TensorType::new(parts[0].ty.dtype, dims),
    )
}

impl Collectives for SharedCollectives<'_> {
    /// Large all-reduces (`SMALL_ALL_REDUCE` elements or more, not bool) run between the
    /// devices' buffers; the others take `run`'s copying path.
    unsafe fn all_reduce_in_place(
        &self,
        op: &Op,
        mesh: &Mesh,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<bool, InterpError> {
        let Op::AllReduce { axes, .. } = op else {
            return Ok(false);
        };
        let (members, me) = group(mesh, axes, self.position);
        if members.len() < 2 || ty.numel() < SMALL_ALL_REDUCE || ty.dtype == DType::Bool {
            return Ok(false);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.all_reduce_buffers(op, &members, me, ty, input, out)? };
        Ok(true)
    }

    unsafe fn gemm_shared_rhs(
        &self,
        mesh: &Mesh,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, InterpError> {
        // SAFETY: forwarded from the caller.
        unsafe { crate::shared_gemm::shared_rhs(self, mesh, part, gemm) }
    }

    unsafe fn gemm_all_reduce(
        &self,
        op: &Op,
        mesh: &Mesh,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, InterpError> {
        // SAFETY: forwarded from the caller.
        unsafe { crate::shared_gemm::all_reduce(self, op, mesh, part, gemm) }
    }

    fn run(
        &self,
        op: &Op,
        mesh: &Mesh,
        input: Option<&Literal>,
        out: &TensorType,
    ) -> Result<Literal, InterpError> {
        let (members, me) = group(mesh, op.mesh_axes(), self.position);
        let n = members.len();
        if let Op::AxisIndex { .. } = op {
            return Ok(Literal {
                ty: out.clone(),
                data: tessera_ir::Data::I32(vec![me as i32]),
            });
        }
        let input = input.ok_or_else(|| InterpError::Op {
            op: op.name().into(),
            message: "missing operand".into(),
        })?;
        if let (Op::AllReduce { kind, .. }, true) = (op, n > 1) {
            return self.all_reduce(op, *kind, &members, me, input, out);
        }
        let values: Vec<Literal> = if n == 1 {
            vec![input.clone()]
        } else {
            let mut slots = self.deposit(op, &members, me, input)?;
            let vals = slots.1.iter().map(|v| (**v).clone()).collect();
            self.leave(&mut slots.0, &slots.2, members.len());
            vals
        };
        let r = match op {
            Op::AllReduce { kind, .. } => combine(*kind, &values)?,
            Op::AllGather { dim, .. } => concat(&values, *dim)?,
            Op::ReduceScatter { kind, dim, .. } => chunk(&combine(*kind, &values)?, *dim, me, n)?,
            Op::AllToAll {
                split_dim,
                concat_dim,
                ..
            } => {
                let parts: Vec<Literal> = values
                    .iter()
                    .map(|v| chunk(v, *split_dim, me, n))
                    .collect::<Result<_, _>>()?;
                concat(&parts, *concat_dim)?
            }
            Op::CollectivePermute { pairs, .. } => match pairs.iter().find(|(_, d)| *d == me) {
                Some(&(s, _)) => values[s].clone(),
                None => Literal::zeros(out),
            },
            other => {
                return Err(InterpError::Op {
                    op: other.name().into(),
                    message: "not a collective".into(),
                });
            }
        };
        Ok(Literal {
            ty: out.clone(),
            data: r.data,
        })
    }
}

/// How many times a waiting device yields its core before it parks.
const YIELDS_BEFORE_PARKING: usize = 256;

/// How a member waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// For the group to arrive: gives up after the timeout, naming who is missing.
    Meeting,
    /// For the others to finish a short bounded step, once all have arrived: no timeout.
    Step,
    /// For another member's long computation (a product for the group): parks at once, so
    /// the waiting threads leave the cores to it.
    Parked,
}

/// Below this many elements an all-reduce takes one meeting instead of two.
const SMALL_ALL_REDUCE: usize = 1 << 14;

/// The element range of chunk `k` of `n` over `len` elements.
fn chunk_range(len: usize, k: usize, n: usize) -> std::ops::Range<usize> {
    let per = len.div_ceil(n);
    (k * per).min(len)..((k + 1) * per).min(len)
}

/// Elements reduced at a time: the f64 accumulator stays in L1.
const BLOCK: usize = 1024;

/// An element type the all-reduce adds, maxes and mins; `Acc` is what it accumulates in.
trait Elem: Copy {
    type Acc: Copy + Default;
    fn widen(self) -> Self::Acc;
    fn narrow(a: Self::Acc) -> Self;
    fn fold(kind: ReduceKind, a: Self::Acc, b: Self) -> Self::Acc;
}

use tessera_interp::scalar::{fmax, fmin};

/// f32 accumulates in f64 and rounds once, as a sum to one value does in the kernels: the
/// devices' partial losses add up to the correctly rounded total. (Max and min are exact
/// either way.)
impl Elem for f32 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self as f64
    }
    fn narrow(a: f64) -> f32 {
        a as f32
    }
    fn fold(kind: ReduceKind, a: f64, b: f32) -> f64 {
        match kind {
            ReduceKind::Sum => a + b as f64,
            ReduceKind::Max => fmax(a, b as f64),
            ReduceKind::Min => fmin(a, b as f64),
        }
    }
}

impl Elem for f64 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self
    }
    fn narrow(a: f64) -> f64 {
        a
    }
    fn fold(kind: ReduceKind, a: f64, b: f64) -> f64 {
        match kind {
            ReduceKind::Sum => a + b,
            ReduceKind::Max => fmax(a, b),
            ReduceKind::Min => fmin(a, b),
        }
    }
}

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn narrow(a: $t) -> $t {
                a
            }
            fn fold(kind: ReduceKind, a: $t, b: $t) -> $t {
                match kind {
                    ReduceKind::Sum => a.wrapping_add(b),
                    ReduceKind::Max => a.max(b),
                    ReduceKind::Min => a.min(b),
                }
            }
        }
    };
}
int_elem!(i32);
int_elem!(u32);

/// Reduces `n` elements from each of `srcs`, in member order, into `dst`, a block at a time.
///
/// # Safety
/// Every `srcs[i]` must be valid for reading `n` elements and `dst` for writing `n`; no one
/// writes them meanwhile except this call. `dst` may equal one of `srcs` (each block is read
/// whole before it is written).
unsafe fn reduce_into<T: Elem>(kind: ReduceKind, srcs: &[*const T], dst: *mut T, n: usize) {
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        // SAFETY: `start + len <= n`, so every access is in bounds (see the contract).
        unsafe {
            let first = std::slice::from_raw_parts(srcs[0].add(start), len);
            for (a, &b) in acc.iter_mut().zip(first) {
                *a = b.widen();
            }
            for &s in &srcs[1..] {
                let src = std::slice::from_raw_parts(s.add(start), len);
                for (a, &b) in acc.iter_mut().zip(src) {
                    *a = T::fold(kind, *a, b);
                }
            }
            // The source slices are dead: writing `dst` (perhaps one of them) aliases nothing.
            let out = std::slice::from_raw_parts_mut(dst.add(start), len);
            for (o, &a) in out.iter_mut().zip(&acc[..len]) {
                *o = T::narrow(a);
            }
        }
        start += len;
    }
}

/// The address of element `offset` of `data`, untyped.
fn elem_ptr(data: &Data, offset: usize) -> *const u8 {
    match data {
        Data::F32(v) => v[offset..].as_ptr() as *const u8,
        Data::F64(v) => v[offset..].as_ptr() as *const u8,
        Data::I32(v) => v[offset..].as_ptr() as *const u8,
        Data::U32(v) => v[offset..].as_ptr() as *const u8,
        Data::Bool(v) => v[offset..].as_ptr() as *const u8,
    }
}

/// The address of the first element of `data`, for writing.
fn elem_ptr_mut(data: &mut Data) -> *mut u8 {
    match data {
        Data::F32(v) => v.as_mut_ptr() as *mut u8,
        Data::F64(v) => v.as_mut_ptr() as *mut u8,
        Data::I32(v) => v.as_mut_ptr() as *mut u8,
        Data::U32(v) => v.as_mut_ptr() as *mut u8,
        Data::Bool(v) => v.as_mut_ptr() as *mut u8,
    }
}

/// `reduce_into` for the element type `dtype`, on untyped addresses; `false` for bool, which
/// has no all-reduce here.
///
/// # Safety
/// As `reduce_into`, with the addresses aligned for `dtype`.
unsafe fn reduce_untyped(
    kind: ReduceKind,
    dtype: DType,
    srcs: &[*const u8],
    dst: *mut u8,
    n: usize,
) -> bool {
    fn cast<T>(srcs: &[*const u8]) -> Vec<*const T> {
        srcs.iter().map(|&p| p as *const T).collect()
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => reduce_into::<f32>(kind, &cast(srcs), dst as *mut f32, n),
            DType::F64 => reduce_into::<f64>(kind, &cast(srcs), dst as *mut f64, n),
            DType::I32 => reduce_into::<i32>(kind, &cast(srcs), dst as *mut i32, n),
            DType::U32 => reduce_into::<u32>(kind, &cast(srcs), dst as *mut u32, n),
            DType::Bool => return false,
        }
    }
    true
}

/// Reduces elements `range` of every value, in member order, into a literal of that length.
fn reduce_range(kind: ReduceKind, values: &[Arc<Literal>], range: std::ops::Range<usize>) -> Data {
    let dtype = values[0].ty.dtype;
    let mut out = Data::zeros(dtype, range.len());
    if range.is_empty() {
        return out;
    }
    let srcs: Vec<*const u8> = values
        .iter()
        .map(|v| elem_ptr(&v.data, range.start))
        .collect();
    let dst = elem_ptr_mut(&mut out);
    // SAFETY: every value holds at least `range.end` elements of `dtype` (all-reduce operands
    // share a type), `out` holds `range.len()`, and they are distinct allocations.
    let reduced = unsafe { reduce_untyped(kind, dtype, &srcs, dst, range.len()) };
    if !reduced {
        // A bool all-reduce only arises from a program that reduces bools: keep the first.
        if let (Data::Bool(o), Data::Bool(v)) = (&mut out, &values[0].data) {
            o.copy_from_slice(&v[range]);
        }
    }
    out
}

type Held<'a> = (MutexGuard<'a, HashMap<Key, Slot>>, Vec<Arc<Literal>>, Key);

impl<'r> SharedCollectives<'r> {
    /// An all-reduce in two phases: every member reduces its own chunk of the elements over all
    /// the values (in member order, so every device gets the same bits), then every member
    /// assembles the chunks. Each device does 1/n of the arithmetic and no value is copied
    /// before it is needed.
    fn all_reduce(
        &self,
        op: &Op,
        kind: ReduceKind,
        members: &[usize],
        me: usize,
        input: &Literal,
        out: &TensorType,
    ) -> Result<Literal, InterpError> {
        let n = members.len();
        let (mut guard, values, key) = self.deposit(op, members, me, input)?;
        let len = input.data.len();
        // A small value: every member reduces all of it (the same order on each, so the same
        // bits), which saves the second meeting; that costs more than the arithmetic here.
        if len < SMALL_ALL_REDUCE {
            self.leave(&mut guard, &key, n);
            drop(guard);
            return Ok(Literal {
                ty: out.clone(),
                data: reduce_range(kind, &values, 0..len),
            });
        }
        drop(guard);
        let mine = reduce_range(kind, &values, chunk_range(len, me, n));
        let r = self.rendezvous;
        let mut slots = r.slots.lock().expect("rendezvous lock");
        slots
            .get_mut(&key)
            .expect("slot stays until all took")
            .chunks[me] = Some(Literal {
            ty: TensorType::new(input.ty.dtype, vec![mine.len()]),
            data: mine,
        });
        r.arrived.notify_all();
        slots = self.wait_for(op, slots, &key, members, |s| {
            s.chunks.iter().all(|c| c.is_some())
        })?;
        let slot = slots.get(&key).expect("slot present");
        let mut data = Data::zeros(input.ty.dtype, 0);
        for c in &slot.chunks {
            let c = c.as_ref().expect("complete");
            match (&mut data, &c.data) {
                (Data::F32(d), Data::F32(v)) => d.extend_from_slice(v),
                (Data::F64(d), Data::F64(v)) => d.extend_from_slice(v),
                (Data::I32(d), Data::I32(v)) => d.extend_from_slice(v),
                (Data::U32(d), Data::U32(v)) => d.extend_from_slice(v),
                (Data::Bool(d), Data::Bool(v)) => d.extend_from_slice(v),
                _ => {}
            }
        }
        self.leave(&mut slots, &key, n);
        Ok(Literal {
            ty: out.clone(),
            data,
        })
    }

    /// Waits (parked) until `done` holds for the slot, or the timeout names who is missing.
    /// A member that gives up marks the slot abandoned, under the lock, so that the others
    /// fail at once instead of waiting for their own timeout.
    pub(crate) fn wait_for(
        &self,
        op: &Op,
        slots: MutexGuard<'r, HashMap<Key, Slot>>,
        key: &Key,
        members: &[usize],
        done: impl Fn(&Slot) -> bool,
    ) -> Result<MutexGuard<'r, HashMap<Key, Slot>>, InterpError> {
        self.wait(op, slots, key, members, done, Wait::Meeting)
    }

    pub(crate) fn wait(
        &self,
        op: &Op,
        mut slots: MutexGuard<'r, HashMap<Key, Slot>>,
        key: &Key,
        members: &[usize],
        done: impl Fn(&Slot) -> bool,
        mode: Wait,
    ) -> Result<MutexGuard<'r, HashMap<Key, Slot>>, InterpError> {
        let r = self.rendezvous;
        let start = Instant::now();
        let gave_up = || InterpError::Op {
            op: op.name().into(),
            message: format!(
                "over {:?}: another device of the group gave up waiting",
                op.mesh_axes()
            ),
        };
        // With more devices than cores the others need this core to arrive: offer it a few
        // times (cheaper than a futex sleep and wake-up) before parking on the condition
        // variable.
        let yields = if mode == Wait::Parked {
            0
        } else {
            YIELDS_BEFORE_PARKING
        };
        for _ in 0..yields {
            let slot = slots.get(key).expect("slot stays until all took");
            if done(slot) {
                return Ok(slots);
            }
            if slot.abandoned {
                return Err(gave_up());
            }
            drop(slots);
            std::thread::yield_now();
            slots = r.slots.lock().expect("rendezvous lock");
        }
        loop {
            let slot = slots.get_mut(key).expect("slot stays until all took");
            if done(slot) {
                return Ok(slots);
            }
            if slot.abandoned {
                return Err(gave_up());
            }
            let waited = start.elapsed();
            if mode != Wait::Meeting {
                slots = r.arrived.wait(slots).expect("rendezvous lock");
                continue;
            }
            if waited >= r.timeout {
                slot.abandoned = true;
                r.arrived.notify_all();
                let n = members.len();
                let arrived = |k: usize| slot.arrived(k);
                let all_arrived = (0..n).all(arrived);
                let missing: Vec<usize> = (0..n)
                    .filter(|&k| {
                        !arrived(k)
                            || (all_arrived && slot.chunks.get(k).is_some_and(|c| c.is_none()))
                    })
                    .map(|k| {
                        self.device_ids
                            .get(members[k])
                            .copied()
                            .unwrap_or(members[k])
                    })
                    .collect();
                return Err(InterpError::Op {
                    op: op.name().into(),
                    message: format!(
                        "over {:?}: devices {missing:?} did not arrive within {:.0} s",
                        op.mesh_axes(),
                        r.timeout.as_secs_f64()
                    ),
                });
            }
            slots = r
                .arrived
                .wait_timeout(slots, r.timeout - waited)
                .expect("rendezvous lock")
                .0;
        }
    }

    /// The in-place all-reduce (see `Collectives::all_reduce_in_place`), in three meetings:
    /// 1. every member publishes its operand's and result's addresses (this wait may time out;
    ///    a member that gives up marks the slot abandoned under the lock, so nobody ever reads
    ///    the buffers of a member that has left);
    /// 2. each member has reduced its chunk of every member's operand into its own result;
    /// 3. each member has copied the other chunks from their owners' results into its own.
    ///
    /// A member returns only after meeting 3, so its buffers outlive every read of them. Once
    /// meeting 1 is complete every member is inside this call and the work between meetings is
    /// bounded, so meetings 2 and 3 wait without a timeout.
    ///
    /// # Safety
    /// As `Collectives::all_reduce_in_place`; `ty` is the operand's type on every member.
    unsafe fn all_reduce_buffers(
        &self,
        op: &Op,
        members: &[usize],
        me: usize,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), InterpError> {
        let Op::AllReduce { kind, .. } = *op else {
            unreachable!("called for all_reduce only")
        };
        let n = members.len();
        let r = self.rendezvous;
        let (slots, key) = self.meet(
            op,
            members,
            |s| s.buffers[me] = Some((input as usize, out as usize)),
            |s| s.buffers.iter().all(|b| b.is_some()),
        )?;
        let buffers: Vec<(usize, usize)> = slots[&key]
            .buffers
            .iter()
            .map(|b| b.expect("complete"))
            .collect();
        drop(slots);
        let len = ty.numel();
        let size = ty.dtype.byte_width();
        let mine = chunk_range(len, me, n);
        let srcs: Vec<*const u8> = buffers
            .iter()
            // SAFETY: `mine` lies inside every operand (they all have type `ty`).
            .map(|&(i, _)| unsafe { (i as *const u8).add(mine.start * size) })
            .collect();
        // SAFETY: each member's operand stays valid and unwritten until it leaves meeting 3;
        // only this member writes chunk `mine` of `out` (its own result), and it reads chunk
        // `mine` of its own operand in the same block before writing it, if they are the same.
        let reduced = unsafe {
            reduce_untyped(
                kind,
                ty.dtype,
                &srcs,
                out.add(mine.start * size),
                mine.len(),
            )
        };
        debug_assert!(reduced, "bool all-reduces take the copying path");
        let mut slots = r.slots.lock().expect("rendezvous lock");
        slots.get_mut(&key).expect("slot present").reduced += 1;
        r.arrived.notify_all();
        slots = self.wait(op, slots, &key, members, |s| s.reduced == n, Wait::Step)?;
        drop(slots);
        for (k, &(_, theirs)) in buffers.iter().enumerate() {
            if k == me {
                continue;
            }
            let c = chunk_range(len, k, n);
            // SAFETY: member `k` wrote chunk `c` of its result before meeting 2 and nobody
            // writes it again before everyone leaves meeting 3; this member's result is a
            // different allocation, and only this member writes it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (theirs as *const u8).add(c.start * size),
                    out.add(c.start * size),
                    c.len() * size,
                )
            };
        }
        let mut slots = r.slots.lock().expect("rendezvous lock");
        slots.get_mut(&key).expect("slot present").copied += 1;
        r.arrived.notify_all();
        slots = self.wait(op, slots, &key, members, |s| s.copied == n, Wait::Step)?;
        self.leave(&mut slots, &key, n);
        Ok(())
    }

    /// The first meeting of a collective: takes the next sequence number, records this
    /// member's arrival in the group's slot with `arrive`, and waits (up to the timeout) until
    /// `all_here` holds. Returns the lock and the slot's key.
    pub(crate) fn meet(
        &self,
        op: &Op,
        members: &[usize],
        arrive: impl FnOnce(&mut Slot),
        all_here: impl Fn(&Slot) -> bool,
    ) -> Result<(MutexGuard<'r, HashMap<Key, Slot>>, Key), InterpError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let key: Key = (self.launch, seq, members.to_vec());
        let r = self.rendezvous;
        let mut slots = r.slots.lock().expect("rendezvous lock");
        arrive(
            slots
                .entry(key.clone())
                .or_insert_with(|| Slot::new(members.len())),
        );
        r.arrived.notify_all();
        let slots = self.wait_for(op, slots, &key, members, all_here)?;
        Ok((slots, key))
    }

    /// Deposits `input` and waits for the whole group; returns the lock, every member's value
    /// in order, and the slot's key.
    fn deposit(
        &self,
        op: &Op,
        members: &[usize],
        me: usize,
        input: &Literal,
    ) -> Result<Held<'_>, InterpError> {
        let input = Arc::new(input.clone());
        let (slots, key) = self.meet(
            op,
            members,
            |s| s.values[me] = Some(input),
            |s| s.values.iter().all(|v| v.is_some()),
        )?;
        let values = slots[&key]
            .values
            .iter()
            .map(|v| v.clone().expect("complete"))
            .collect();
        Ok((slots, values, key))
    }

    /// Marks this member done with the slot; the last one removes it.
    pub(crate) fn leave(
        &self,
        slots: &mut MutexGuard<'_, HashMap<Key, Slot>>,
        key: &Key,
        n: usize,
    ) {
        let slot = slots.get_mut(key).expect("slot present");
        slot.taken += 1;
        if slot.taken == n {
            slots.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh::new("m", vec![("x".into(), 2), ("y".into(), 2)])
    }

    #[test]
    fn groups_follow_the_axes() {
        let m = mesh();
        assert_eq!(group(&m, &["x".into()], 3), (vec![1, 3], 1));
        assert_eq!(group(&m, &["y".into()], 2), (vec![2, 3], 0));
        assert_eq!(
            group(&m, &["x".into(), "y".into()], 2),
            (vec![0, 1, 2, 3], 2)
        );
        assert_eq!(
            group(&m, &["y".into(), "x".into()], 1),
            (vec![0, 2, 1, 3], 2)
        );
    }

    #[test]
    fn a_device_that_never_arrives_is_an_error_naming_it() {
        let r = Rendezvous::with_timeout(Duration::from_millis(50));
        let ids = [10, 11, 12, 13];
        let c = SharedCollectives::new(&r, 0, 0, &ids);
        let op = Op::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec!["x".into()],
        };
        let x = Literal::scalar_f32(1.0);
        let err = c
            .run(&op, &mesh(), Some(&x), &x.ty)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("all_reduce") && err.contains("[12]") && err.contains("did not arrive"),
            "{err}"
        );
    }

    /// Small values (one meeting) and large ones (reduced chunk-wise in two meetings).
    #[test]
    fn all_reduce_between_threads() {
        for len in [3, SMALL_ALL_REDUCE + 5] {
            let r = Rendezvous::default();
            let ids = [0, 1, 2, 3];
            let op = Op::AllReduce {
                kind: ReduceKind::Sum,
                axes: vec!["x".into(), "y".into()],
            };
            let results: Vec<Literal> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|p| {
                        let (r, ids, op) = (&r, &ids, &op);
                        s.spawn(move || {
                            let c = SharedCollectives::new(r, 7, p, ids);
                            let v: Vec<f32> = (0..len).map(|i| (i % 7) as f32 + p as f32).collect();
                            let x = Literal::new([len], Data::F32(v)).unwrap();
                            c.run(op, &mesh(), Some(&x), &x.ty).unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
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

    /// The in-place all-reduce against the copying one, every kind and numeric dtype, with
    /// the result in a separate buffer and in the operand's own (the plan may share them); a
    /// chunk count that does not divide the length; and 1/10 + 2/10 + ... summed in f64.
    #[test]
    fn all_reduce_in_place_matches_the_copying_path() {
        let len = SMALL_ALL_REDUCE + 13;
        let value = |p: usize, i: usize| ((i * 7 + p * 3) % 11) as f64 / 10.0 - 0.4;
        for dtype in [DType::F32, DType::F64, DType::I32, DType::U32] {
            for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
                for aliased in [false, true] {
                    let r = Rendezvous::default();
                    let ids = [0, 1, 2, 3];
                    let op = Op::AllReduce {
                        kind,
                        axes: vec!["x".into(), "y".into()],
                    };
                    let make = |p: usize| {
                        let vs = (0..len).map(|i| value(p, i));
                        let ints = || vs.clone().map(|v| (v * 10.0 + 4.0).round());
                        let data = match dtype {
                            DType::F32 => Data::F32(vs.clone().map(|v| v as f32).collect()),
                            DType::F64 => Data::F64(vs.clone().collect()),
                            DType::I32 => Data::I32(ints().map(|v| v as i32).collect()),
                            _ => Data::U32(ints().map(|v| v as u32).collect()),
                        };
                        Literal::new([len], data).unwrap()
                    };
                    let results: Vec<(Literal, Literal)> = std::thread::scope(|s| {
                        let hs: Vec<_> = (0..4)
                            .map(|p| {
                                let (r, ids, op) = (&r, &ids, &op);
                                s.spawn(move || {
                                    let c = SharedCollectives::new(r, 7, p, ids);
                                    let x = make(p);
                                    let want = c.run(op, &mesh(), Some(&x), &x.ty).unwrap();
                                    let mut operand = make(p);
                                    let mut out = Literal::zeros(&x.ty);
                                    let input = elem_ptr(&operand.data, 0);
                                    let dst = if aliased {
                                        elem_ptr_mut(&mut operand.data)
                                    } else {
                                        elem_ptr_mut(&mut out.data)
                                    };
                                    // SAFETY: both buffers hold `len` elements of the type
                                    // and live until the call returns.
                                    let done = unsafe {
                                        c.all_reduce_in_place(op, &mesh(), &x.ty, input, dst)
                                    }
                                    .unwrap();
                                    assert!(done);
                                    (want, if aliased { operand } else { out })
                                })
                            })
                            .collect();
                        hs.into_iter().map(|h| h.join().unwrap()).collect()
                    });
                    for (want, got) in results {
                        assert_eq!(want, got, "{dtype:?} {kind:?} aliased {aliased}");
                    }
                }
            }
        }
    }
}
