//! Collectives over shared memory between the device threads of one process.
//!
//! Every device of a group deposits its value in a slot keyed by (launch, sequence number,
//! group); each waits (yielding a bounded number of times, then parked on a condition
//! variable) until the group is complete, then computes its own result from all the values, in
//! group order, so every device gets bit-identical sums.
//!
//! Faults. Every wait gives up after the collective timeout (`TESSERA_COLLECTIVE_TIMEOUT`),
//! with an error naming the collective, the late devices and the timeout in ms; the member
//! that gives up abandons the slot and the launch, so every other wait of the launch fails at
//! once naming it ("device 3 gave up"). A wait checks for abandonment before completion, and a
//! member that leaves retracts what it published, so a late member never uses the addresses of
//! one that has left. Members that read other members' buffers (the in-place all-reduce after
//! its first meeting, the multiplier of a shared product) count as the slot's readers; a
//! member that gives up, or unwinds from a panic (`Reading`), returns only when the slot has no
//! readers left, so its buffers outlive every read of them.
//!
//! This is the one transport behind the `Collectives` interface today; a process-spanning one
//! (MPI) would implement the same trait.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_interp::{Collectives, GemmCall, GemmPart, InterpError, eval_op};
use tessera_ir::{BinaryOp, CollectiveOp, DType, Data, Literal, Mesh, Op, ReduceKind, TensorType};

pub(crate) type Key = (u64, u64, Vec<usize>);

#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) values: Vec<Option<Arc<Literal>>>,
    /// For an all-reduce: each member's reduced chunk of the result (sized on the first
    /// chunk's arrival: only the copying path of large all-reduces uses it).
    pub(crate) chunks: Vec<Option<Literal>>,
    /// For an all-reduce in place: each member's operand and result addresses.
    pub(crate) buffers: Vec<Option<(usize, usize)>>,
    /// Each member's progress through the collective: 0 not arrived, 1 arrived, 2 reduced its
    /// chunk (in place) or copied its blocks in (shared product), 3 copied the rest (in
    /// place). For the timeout's message: who is late.
    pub(crate) progress: Vec<u8>,
    /// For an all-reduce in place: how many members reduced their chunk, then copied the rest.
    pub(crate) reduced: usize,
    pub(crate) copied: usize,
    /// For a GEMM with a shared right operand: each member's part, and whether the stacked
    /// product is written back.
    pub(crate) gemms: Vec<Option<crate::shared_gemm::PartAddr>>,
    pub(crate) gemm_done: bool,
    /// For a shared product: the member that multiplies (the last to copy its blocks in).
    pub(crate) multiplier: Option<usize>,
    /// For a shared product: the stacked left and right operands and the result, allocated by
    /// the last member to arrive (`None`: not shared).
    pub(crate) stacks: Option<[usize; 3]>,
    /// How many members may be reading other members' buffers right now (see `Reading`). A
    /// member that gives up does not return before this is 0: its buffers die with the call.
    pub(crate) readers: usize,
    /// The devices that gave up on this slot (nonempty: abandoned, nobody may use anybody's
    /// buffers any more).
    pub(crate) gave_up: Vec<usize>,
    pub(crate) taken: usize,
}

impl Slot {
    /// The slot of a group of `n` members, nobody arrived.
    fn new(n: usize) -> Slot {
        Slot {
            values: vec![None; n],
            buffers: vec![None; n],
            gemms: vec![None; n],
            progress: vec![0; n],
            ..Slot::default()
        }
    }

    /// Whether member `k` has arrived, whatever it brought.
    fn arrived(&self, k: usize) -> bool {
        self.progress[k] >= 1
    }

    pub(crate) fn abandoned(&self) -> bool {
        !self.gave_up.is_empty()
    }

    /// Takes back what member `me` published: nobody may find its addresses once it has left.
    fn retract(&mut self, me: usize) {
        self.values[me] = None;
        self.buffers[me] = None;
        self.gemms[me] = None;
    }
}

/// The state behind a rendezvous's lock: the open slots, and the devices that gave up on the
/// launch (`SharedCollectives::give_up`), in the order they did.
#[derive(Default)]
pub(crate) struct Slots {
    map: HashMap<Key, Slot>,
    pub(crate) failed: Vec<usize>,
}

impl std::ops::Deref for Slots {
    type Target = HashMap<Key, Slot>;
    fn deref(&self) -> &HashMap<Key, Slot> {
        &self.map
    }
}

impl std::ops::DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut HashMap<Key, Slot> {
        &mut self.map
    }
}

impl Slots {
    /// `device` gives up on slot `key` and on the launch: every member of the slot, and every
    /// wait of the launch, fails from now on, naming it.
    pub(crate) fn give_up(&mut self, key: &Key, device: usize) {
        if let Some(slot) = self.map.get_mut(key)
            && !slot.gave_up.contains(&device)
        {
            slot.gave_up.push(device);
        }
        if !self.failed.contains(&device) {
            self.failed.push(device);
        }
    }
}

pub(crate) type Guard<'a> = MutexGuard<'a, Slots>;

/// The meeting point of one launch's devices.
pub struct Rendezvous {
    slots: Mutex<Slots>,
    pub(crate) arrived: Condvar,
    timeout: Duration,
    /// Buffers the launch's members read until it ends (`shared_gemm::all_reduce`).
    results: Mutex<Vec<Box<[std::mem::MaybeUninit<u64>]>>>,
}

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

/// A duration as a timeout message prints it: whole seconds, or milliseconds.
pub(crate) fn show(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    }
}

impl Default for Rendezvous {
    /// Waits give up after 60 s (`Rendezvous::from_env` reads `TESSERA_COLLECTIVE_TIMEOUT`).
    fn default() -> Self {
        Rendezvous::with_timeout(DEFAULT_TIMEOUT)
    }
}

impl Rendezvous {
    /// A rendezvous whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Rendezvous {
        Rendezvous {
            slots: Mutex::new(Slots::default()),
            arrived: Condvar::new(),
            timeout,
            results: Mutex::new(Vec::new()),
        }
    }

    /// A rendezvous whose waits give up after `TESSERA_COLLECTIVE_TIMEOUT` (`collective_timeout`).
    pub fn from_env() -> Result<Rendezvous, String> {
        Ok(Rendezvous::with_timeout(collective_timeout()?))
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The lock over the slots. A panic while it is held (a device thread's, caught by the
    /// launch) leaves the slots consistent: every critical section changes whole fields of one
    /// slot, and a member that unwinds through a collective abandons its slot first
    /// (`Reading`, `shared_gemm::fill_and_multiply`); so poisoning is ignored.
    pub(crate) fn lock(&self) -> Guard<'_> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buffer` alive until the launch ends. (A push: consistent whatever panicked.)
    pub(crate) fn keep(&self, buffer: Box<[std::mem::MaybeUninit<u64>]>) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buffer);
    }

    /// Records that `device` gave up on the launch (`SharedCollectives::give_up`).
    pub fn give_up_as(&self, device: usize) {
        let mut slots = self.lock();
        if !slots.failed.contains(&device) {
            slots.failed.push(device);
        }
        self.arrived.notify_all();
    }

    /// The first device that gave up on the launch (`SharedCollectives::give_up`): the one
    /// whose error explains the others'.
    pub fn first_to_give_up(&self) -> Option<usize> {
        self.lock().failed.first().copied()
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

    /// This device's id (its mesh position's).
    pub(crate) fn device_id(&self) -> usize {
        self.device_ids
            .get(self.position)
            .copied()
            .unwrap_or(self.position)
    }

    /// Tells the launch's other devices that this one gave up (its program failed or
    /// panicked): every wait of the launch, now or later, fails at once naming it, instead of
    /// waiting for its timeout.
    pub fn give_up(&self) {
        self.rendezvous.give_up_as(self.device_id());
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
        let Op::Collective(CollectiveOp::AllReduce { axes, .. }) = op else {
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
        if let Op::Collective(CollectiveOp::AxisIndex { .. }) = op {
            return Ok(Literal {
                ty: out.clone(),
                data: tessera_ir::Data::I32(vec![me as i32]),
            });
        }
        let input = input.ok_or_else(|| InterpError::Op {
            op: op.name().into(),
            message: "missing operand".into(),
        })?;
        if let (Op::Collective(CollectiveOp::AllReduce { kind, .. }), true) = (op, n > 1) {
            return self.all_reduce(op, *kind, &members, me, input, out);
        }
        let values: Vec<Literal> = if n == 1 {
            vec![input.clone()]
        } else {
            let mut slots = self.deposit(op, &members, me, input)?;
            let vals = slots.1.iter().map(|v| (**v).clone()).collect();
            self.leave(&mut slots.0, &slots.2.key, members.len());
            vals
        };
        let r = match op {
            Op::Collective(CollectiveOp::AllReduce { kind, .. }) => combine(*kind, &values)?,
            Op::Collective(CollectiveOp::AllGather { dim, .. }) => concat(&values, *dim)?,
            Op::Collective(CollectiveOp::ReduceScatter { kind, dim, .. }) => {
                chunk(&combine(*kind, &values)?, *dim, me, n)?
            }
            Op::Collective(CollectiveOp::AllToAll {
                split_dim,
                concat_dim,
                ..
            }) => {
                let parts: Vec<Literal> = values
                    .iter()
                    .map(|v| chunk(v, *split_dim, me, n))
                    .collect::<Result<_, _>>()?;
                concat(&parts, *concat_dim)?
            }
            Op::Collective(CollectiveOp::CollectivePermute { pairs, .. }) => {
                match pairs.iter().find(|(_, d)| *d == me) {
                    Some(&(s, _)) => values[s].clone(),
                    None => Literal::zeros(out),
                }
            }
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

/// What a member waits for. Every wait gives up after the collective timeout, naming the
/// members that are late by this measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The group's arrival.
    Arrival,
    /// Every member's reduced chunk (the copying all-reduce).
    Chunks,
    /// Every member's progress at this stage or later (`Slot::progress`).
    Progress(u8),
    /// Another member's product for the group: parks at once, so that the waiting threads
    /// leave the cores to it.
    Product,
}

impl Wait {
    /// Whether member `k` is the one (or one of those) this wait waits for.
    fn late(self, slot: &Slot, k: usize) -> bool {
        match self {
            Wait::Arrival => !slot.arrived(k),
            Wait::Chunks => slot.chunks.get(k).is_none_or(|c| c.is_none()),
            Wait::Progress(p) => slot.progress[k] < p,
            Wait::Product => {
                slot.progress[k] < 2
                    || (slot.progress.iter().all(|&p| p >= 2) && slot.multiplier == Some(k))
            }
        }
    }

    /// What the late members did not do, for the timeout's message.
    fn what(self) -> &'static str {
        match self {
            Wait::Arrival => "did not arrive",
            Wait::Chunks => "did not deliver their reduced chunk",
            Wait::Progress(p) if p <= 2 => "did not finish their share",
            Wait::Progress(_) => "did not finish copying the result",
            Wait::Product => "did not finish the group's product",
        }
    }
}

/// The group a message is about: the collective's mesh axes, or the shared product's.
fn group_text(op: &Op) -> String {
    match op.mesh_axes() {
        [] => "the devices' shared product".into(),
        axes => format!("over {axes:?}"),
    }
}

/// A member's place in one collective: the collective (for messages), its slot, the group,
/// and the member's index in the group.
pub(crate) struct Seat<'a> {
    pub(crate) op: &'a Op,
    pub(crate) key: Key,
    pub(crate) members: &'a [usize],
    pub(crate) me: usize,
}

/// While alive, its member is one of the slot's `readers`. If that member unwinds (a panic)
/// it abandons the slot on the way out and waits until no member reads any buffer, so its
/// own buffers outlive every read of them.
pub(crate) struct Reading<'c, 'r, 's> {
    pub(crate) c: &'c SharedCollectives<'r>,
    pub(crate) seat: &'s Seat<'s>,
}

impl Drop for Reading<'_, '_, '_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut slots = self.c.rendezvous.lock();
        slots.give_up(&self.seat.key, self.c.device_id());
        self.c.bail(self.seat, slots, true, ());
    }
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

type Held<'r, 'm> = (Guard<'r>, Vec<Arc<Literal>>, Seat<'m>);

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
        let (mut guard, values, seat) = self.deposit(op, members, me, input)?;
        let len = input.data.len();
        // A small value: every member reduces all of it (the same order on each, so the same
        // bits), which saves the second meeting; that costs more than the arithmetic here.
        if len < SMALL_ALL_REDUCE {
            self.leave(&mut guard, &seat.key, n);
            drop(guard);
            return Ok(Literal {
                ty: out.clone(),
                data: reduce_range(kind, &values, 0..len),
            });
        }
        drop(guard);
        let mine = reduce_range(kind, &values, chunk_range(len, me, n));
        let r = self.rendezvous;
        let mut slots = r.lock();
        let slot = slots.get_mut(&seat.key).expect("slot stays until all took");
        if slot.chunks.is_empty() {
            slot.chunks = vec![None; n];
        }
        slot.chunks[me] = Some(Literal {
            ty: TensorType::new(input.ty.dtype, vec![mine.len()]),
            data: mine,
        });
        r.arrived.notify_all();
        slots = self.wait(&seat, slots, Wait::Chunks, false, |s| {
            s.chunks.iter().all(|c| c.is_some())
        })?;
        let slot = slots.get(&seat.key).expect("slot present");
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
        self.leave(&mut slots, &seat.key, n);
        Ok(Literal {
            ty: out.clone(),
            data,
        })
    }

    /// Waits (yielding a while, then parked; at once parked for `Wait::Product`) until `done`
    /// holds for the seat's slot. Fails when the slot is abandoned or the launch failed
    /// (naming the devices that gave up; checked before `done`, so nobody goes on with the
    /// addresses of a member that left), or after the timeout (naming the late members; this
    /// member then abandons the slot, under the lock, so the others fail at once). On failure
    /// it leaves as `bail` says: it retracts what it published, stops reading (`reading`: it
    /// is one of the slot's readers) and waits for the other readers to stop.
    pub(crate) fn wait(
        &self,
        seat: &Seat<'_>,
        mut slots: Guard<'r>,
        wait: Wait,
        reading: bool,
        done: impl Fn(&Slot) -> bool,
    ) -> Result<Guard<'r>, InterpError> {
        let r = self.rendezvous;
        let start = Instant::now();
        // With more devices than cores the others need this core to arrive: offer it a few
        // times (cheaper than a futex sleep and wake-up) before parking on the condition
        // variable.
        let yields = if wait == Wait::Product {
            0
        } else {
            YIELDS_BEFORE_PARKING
        };
        let mut yielded = 0;
        loop {
            let Slots { map, failed } = &mut *slots;
            let slot = map.get_mut(&seat.key).expect("slot stays until all took");
            if !failed.is_empty() && !slot.abandoned() {
                slot.gave_up.extend_from_slice(failed);
            }
            if slot.abandoned() {
                let err = self.gave_up_error(seat.op, &slot.gave_up);
                return Err(self.bail(seat, slots, reading, err));
            }
            if done(slot) {
                return Ok(slots);
            }
            let waited = start.elapsed();
            if waited >= r.timeout {
                let late: Vec<usize> = (0..seat.members.len())
                    .filter(|&k| wait.late(slot, k))
                    .map(|k| self.id_of(seat.members[k]))
                    .collect();
                let err = InterpError::Op {
                    op: seat.op.name().into(),
                    message: format!(
                        "{}: devices {late:?} {} within {} (device {} gave up)",
                        group_text(seat.op),
                        wait.what(),
                        show(r.timeout),
                        self.device_id(),
                    ),
                };
                slots.give_up(&seat.key, self.device_id());
                return Err(self.bail(seat, slots, reading, err));
            }
            if yielded < yields {
                yielded += 1;
                drop(slots);
                std::thread::yield_now();
                slots = r.lock();
            } else {
                slots = r
                    .arrived
                    .wait_timeout(slots, r.timeout - waited)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }

    /// The device id of mesh position `p`.
    fn id_of(&self, p: usize) -> usize {
        self.device_ids.get(p).copied().unwrap_or(p)
    }

    /// The error of a member that finds its slot abandoned by `devices`.
    fn gave_up_error(&self, op: &Op, devices: &[usize]) -> InterpError {
        let who = match devices {
            [d] => format!("device {d} gave up"),
            _ => format!("devices {devices:?} gave up"),
        };
        InterpError::Op {
            op: op.name().into(),
            message: format!(
                "{}: {who}, so device {} cannot go on",
                group_text(op),
                self.device_id()
            ),
        }
    }

    /// Leaves the seat's abandoned slot and returns `err`: takes back what this member
    /// published (a late member finds nothing of it), stops reading if it is one of the
    /// slot's readers, wakes the others, and waits until no member reads anybody's buffers
    /// any more, so this member's buffers outlive every read of them.
    ///
    /// This is the one wait of a device without the collective timeout, and it waits for no
    /// missing device: the readers are inside the collective, between two of its waits, doing
    /// bounded work (a block copy or reduction, or the shared product), and stop at their next
    /// wait, which fails at once on the abandoned slot. Returning earlier would let the caller
    /// free memory they read.
    pub(crate) fn bail<E>(
        &self,
        seat: &Seat<'_>,
        mut slots: Guard<'r>,
        reading: bool,
        err: E,
    ) -> E {
        let r = self.rendezvous;
        let slot = slots.get_mut(&seat.key).expect("slot stays until all took");
        slot.retract(seat.me);
        if reading {
            slot.readers -= 1;
        }
        r.arrived.notify_all();
        while slots.get(&seat.key).expect("slot stays").readers > 0 {
            slots = r.arrived.wait(slots).unwrap_or_else(|e| e.into_inner());
        }
        err
    }

    /// The in-place all-reduce (see `Collectives::all_reduce_in_place`), in three meetings:
    /// 1. every member publishes its operand's and result's addresses;
    /// 2. each member has reduced its chunk of every member's operand into its own result;
    /// 3. each member has copied the other chunks from their owners' results into its own.
    ///
    /// Every meeting may time out. A member that leaves meeting 1 (under the lock, the slot
    /// not abandoned) counts itself among the slot's `readers` until it leaves the call; a
    /// member that gives up at any meeting, or panics in between (`Reading`), abandons the
    /// slot, retracts its addresses and returns only once no member reads any more: so its
    /// buffers outlive every read of them, and a member arriving later never sees them.
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
        let Op::Collective(CollectiveOp::AllReduce { kind, .. }) = *op else {
            unreachable!("called for all_reduce only")
        };
        let n = members.len();
        let r = self.rendezvous;
        let (mut slots, seat) = self.meet(
            op,
            members,
            me,
            |s| s.buffers[me] = Some((input as usize, out as usize)),
            |s| s.buffers.iter().all(|b| b.is_some()),
        )?;
        let slot = slots.get_mut(&seat.key).expect("slot present");
        slot.readers += 1;
        let buffers: Vec<(usize, usize)> =
            slot.buffers.iter().map(|b| b.expect("complete")).collect();
        drop(slots);
        let reading = Reading {
            c: self,
            seat: &seat,
        };
        let len = ty.numel();
        let size = ty.dtype.byte_width();
        let mine = chunk_range(len, me, n);
        let srcs: Vec<*const u8> = buffers
            .iter()
            // SAFETY: `mine` lies inside every operand (they all have type `ty`).
            .map(|&(i, _)| unsafe { (i as *const u8).add(mine.start * size) })
            .collect();
        // SAFETY: each member's operand stays valid and unwritten until no member reads it
        // (it leaves meeting 3, or, giving up, waits for the readers); only this member
        // writes chunk `mine` of `out` (its own result), and it reads chunk `mine` of its own
        // operand in the same block before writing it, if they are the same.
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
        let mut slots = r.lock();
        let slot = slots.get_mut(&seat.key).expect("slot present");
        slot.reduced += 1;
        slot.progress[me] = 2;
        r.arrived.notify_all();
        slots = self.wait(&seat, slots, Wait::Progress(2), true, |s| s.reduced == n)?;
        drop(slots);
        for (k, &(_, theirs)) in buffers.iter().enumerate() {
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
        let mut slots = r.lock();
        let slot = slots.get_mut(&seat.key).expect("slot present");
        slot.copied += 1;
        slot.progress[me] = 3;
        r.arrived.notify_all();
        slots = self.wait(&seat, slots, Wait::Progress(3), true, |s| s.copied == n)?;
        drop(reading);
        slots.get_mut(&seat.key).expect("slot present").readers -= 1;
        self.leave(&mut slots, &seat.key, n);
        Ok(())
    }

    /// The first meeting of a collective: takes the next sequence number, records member
    /// `me`'s arrival in the group's slot with `arrive`, and waits (up to the timeout) until
    /// `all_here` holds. Returns the lock and this member's seat.
    pub(crate) fn meet<'m>(
        &self,
        op: &'m Op,
        members: &'m [usize],
        me: usize,
        arrive: impl FnOnce(&mut Slot),
        all_here: impl Fn(&Slot) -> bool,
    ) -> Result<(Guard<'r>, Seat<'m>), InterpError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let key: Key = (self.launch, seq, members.to_vec());
        let r = self.rendezvous;
        let mut slots = r.lock();
        let slot = slots
            .entry(key.clone())
            .or_insert_with(|| Slot::new(members.len()));
        slot.progress[me] = 1;
        arrive(slot);
        r.arrived.notify_all();
        let seat = Seat {
            op,
            key,
            members,
            me,
        };
        let slots = self.wait(&seat, slots, Wait::Arrival, false, all_here)?;
        Ok((slots, seat))
    }

    /// Deposits `input` and waits for the whole group; returns the lock, every member's value
    /// in order, and this member's seat.
    fn deposit<'m>(
        &self,
        op: &'m Op,
        members: &'m [usize],
        me: usize,
        input: &Literal,
    ) -> Result<Held<'r, 'm>, InterpError> {
        let input = Arc::new(input.clone());
        let (slots, seat) = self.meet(
            op,
            members,
            me,
            |s| s.values[me] = Some(input),
            |s| s.values.iter().all(|v| v.is_some()),
        )?;
        let values = slots[&seat.key]
            .values
            .iter()
            .map(|v| v.clone().expect("complete"))
            .collect();
        Ok((slots, values, seat))
    }

    /// Marks this member done with the slot; the last one removes it.
    pub(crate) fn leave(&self, slots: &mut Guard<'_>, key: &Key, n: usize) {
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
        let op = Op::Collective(CollectiveOp::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec!["x".into()],
        });
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
        assert_eq!(show(Duration::from_millis(100)), "100 ms");
        assert_eq!(show(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(show(Duration::from_secs(60)), "60 s");
    }

    /// Issue 10, item 2: a member that times out between two meetings of the in-place
    /// all-reduce (before: no timeout there) names the late member, and returns only after
    /// that member stopped reading the group's buffers; the late one then fails naming it.
    #[test]
    fn a_timeout_between_meetings_waits_for_the_readers() {
        let r = Rendezvous::with_timeout(Duration::from_millis(100));
        let ids = [10, 11];
        let m = Mesh::new("m", vec![("x".into(), 2)]);
        let op = Op::Collective(CollectiveOp::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec!["x".into()],
        });
        let (members, _) = group(&m, &["x".into()], 0);
        let member = |p: usize, work: Duration| {
            let c = SharedCollectives::new(&r, 0, p, &ids);
            let (mut slots, seat) = c
                .meet(
                    &op,
                    &members,
                    p,
                    |s| s.buffers[p] = Some((0, 0)),
                    |s| s.buffers.iter().all(|b| b.is_some()),
                )
                .unwrap();
            slots.get_mut(&seat.key).unwrap().readers += 1;
            drop(slots);
            // Reading the others' buffers.
            std::thread::sleep(work);
            let read_until = Instant::now();
            let mut slots = r.lock();
            let slot = slots.get_mut(&seat.key).unwrap();
            slot.reduced += 1;
            slot.progress[p] = 2;
            r.arrived.notify_all();
            let err = c
                .wait(&seat, slots, Wait::Progress(2), true, |s| s.reduced == 2)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            (err, read_until, Instant::now())
        };
        let ((e0, _, left0), (e1, read1, _)) = std::thread::scope(|s| {
            let a = s.spawn(|| member(0, Duration::ZERO));
            let b = s.spawn(|| member(1, Duration::from_millis(400)));
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(
            e0.contains("devices [11] did not finish their share within 100 ms"),
            "{e0}"
        );
        assert!(e1.contains("device 10 gave up"), "{e1}");
        assert!(left0 >= read1, "device 10 left while device 11 still read");
    }

    /// Small values (one meeting) and large ones (reduced chunk-wise in two meetings).
    #[test]
    fn all_reduce_between_threads() {
        for len in [3, SMALL_ALL_REDUCE + 5] {
            let r = Rendezvous::default();
            let ids = [0, 1, 2, 3];
            let op = Op::Collective(CollectiveOp::AllReduce {
                kind: ReduceKind::Sum,
                axes: vec!["x".into(), "y".into()],
            });
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
                    let op = Op::Collective(CollectiveOp::AllReduce {
                        kind,
                        axes: vec!["x".into(), "y".into()],
                    });
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
