//! The rendezvous: where the device threads of one launch meet for a collective or a shared
//! product. It is the whole protocol of the shared-memory transport; the collectives and the
//! shared products (in `tessera-runtime`) only say what they publish and at which stages they
//! meet.
//!
//! # The protocol
//!
//! Each meeting has a slot, keyed by (launch, sequence number, group): every member takes
//! the same sequence number at the same step, as they run the same program. A member holds a
//! typed `Seat<T, D>`: `T` is what each member publishes (a value, its buffers' addresses, its
//! part of a product), `D` what the last member to arrive decides for all from everything
//! published (the shared product's buffers). On its seat a member:
//! - `arrive`s: publishes its item (stage 1) and waits until every member has (the barrier);
//!   the last to arrive runs `decide` under the lock, so every member leaves with the same
//!   decision. With `read: true` it leaves as one of the slot's *readers* (below).
//! - `advance`s to a later stage, perhaps publishing a new item (the copying all-reduce's
//!   reduced chunk), and `wait`s until every member has reached a stage (`Barrier::all`), or
//!   until the one member elected by `advance_and_elect` (the last to reach a stage: the
//!   multiplier of a shared product) has reached the next (`Barrier::elected`: the others park
//!   at once, leaving the cores to it).
//! - `leave`s: done with the slot; the last member to leave removes it.
//!
//! A seat dropped without `leave` (a panic, an early return) *abandons* the slot.
//!
//! # Faults
//!
//! Every wait gives up after the rendezvous's timeout, with `TransportError::Timeout` naming
//! the members late by that wait's measure. The member that gives up abandons the slot and the
//! launch (`Rendezvous::give_up_as` does the latter for a device whose program failed
//! elsewhere), so every other wait of the launch fails at once with `TransportError::GaveUp`
//! naming it. A wait checks for abandonment before its barrier.
//!
//! # Safety argument (for members that read each other's memory)
//!
//! The published items may be addresses of the members' buffers, which a member reads (or, the
//! multiplier of a shared product, passes to the GEMM) between two meetings. Two rules keep
//! every such read inside a live buffer:
//! 1. **A member's buffers are read only by readers.** A member becomes a reader atomically
//!    with passing a barrier (under the lock, the slot not abandoned): `arrive(.., true)` or
//!    `advance_and_elect(.., true)`; it stops at `leave`, at its next failed wait, or when its
//!    seat is dropped.
//! 2. **A member that fails returns only once the slot has no readers.** Abandoning (a failed
//!    wait, or a dropped seat) retracts the member's item (a member arriving later finds
//!    nothing of it), stops its own reading, and then waits, without a timeout, until the
//!    slot's reader count is 0. The readers it waits for are inside the collective, between
//!    two of their waits, doing bounded work (a block copy or reduction, the product); their
//!    next wait fails at once on the abandoned slot and stops their reading. So the member's
//!    caller cannot free a buffer that another member still reads.
//!
//! A member that succeeds leaves the last meeting only after every member has finished its
//! reads of that stage (that is what the meeting waits for), so its buffers outlive them too.
//!
//! A panic while the lock is held (a device thread's, caught by the launch) leaves the slots
//! consistent: every critical section changes whole fields of one slot, and a member that
//! unwinds through a collective abandons its slot on the way (its seat's `Drop`); so the lock's
//! poisoning is ignored.

use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::{TransportError, YIELDS_BEFORE_PARKING};

/// The members' items of a meeting, in group order: on the stack for groups of up to 8, so a
/// meeting of those allocates nothing.
pub type Items<T> = SmallVec<[T; 8]>;

/// A group's positions or device ids, on the stack up to 8.
pub type Positions = SmallVec<[usize; 8]>;

/// A meeting's identity: every member computes the same key at the same step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlotKey {
    pub launch: u64,
    /// The meeting's sequence number in the launch (each member counts its meetings).
    pub seq: u64,
    /// The group's mesh positions.
    pub members: Positions,
}

/// What the members published at each stage (`items[s - 1]` at stage `s`: a member that
/// publishes at a later stage leaves what it published before for the members still reading
/// it), and what the last to arrive decided.
struct Board<T, D> {
    items: Vec<Vec<Option<T>>>,
    decision: Option<D>,
}

impl<T: Clone, D> Board<T, D> {
    /// The items published at `stage`, in group order.
    fn at(&self, stage: u8) -> Items<T> {
        self.items
            .get(usize::from(stage).wrapping_sub(1))
            .map(|v| v.iter().flatten().cloned().collect())
            .unwrap_or_default()
    }

    /// Empty, for a meeting of `n` (its lists keep their capacity: `State::slot`).
    fn reset(&mut self, n: usize) {
        if self.items.is_empty() {
            self.items.push(Vec::new());
        }
        for v in &mut self.items {
            v.clear();
            v.resize(n, None);
        }
        self.decision = None;
    }

    fn publish(&mut self, stage: u8, me: usize, item: T) {
        let i = usize::from(stage) - 1;
        let n = self.items[0].len();
        while self.items.len() <= i {
            self.items.push(vec![None; n]);
        }
        self.items[i][me] = Some(item);
    }
}

impl<T, D> Board<T, D> {
    /// Takes back everything `me` published.
    fn retract(&mut self, me: usize) {
        for v in &mut self.items {
            v[me] = None;
        }
    }
}

struct Slot {
    /// A `Board<T, D>` of the seats' types.
    board: Box<dyn Any + Send>,
    /// Each member's stage: 0 not arrived, 1 arrived, then as the meeting's stages go.
    stage: Vec<u8>,
    /// The member elected by `advance_and_elect`.
    elected: Option<usize>,
    /// How many members may be reading other members' buffers right now.
    readers: usize,
    /// The devices that gave up on this slot (nonempty: abandoned).
    gave_up: Vec<usize>,
    /// How many members have left.
    left: usize,
}

impl Slot {
    fn abandoned(&self) -> bool {
        !self.gave_up.is_empty()
    }
}

/// The state behind the lock: the open slots, and the devices that gave up on the launch,
/// in the order they did; the slots of meetings that ended, kept for the next ones.
#[derive(Default)]
struct State {
    slots: HashMap<SlotKey, Slot>,
    failed: Vec<usize>,
    spare: Vec<Slot>,
}

/// How many ended meetings' slots a rendezvous keeps (`State::slot`).
const SPARE_SLOTS: usize = 32;

impl State {
    /// A slot for a meeting of `n` with items `T` and decision `D`: an ended meeting's (one of
    /// the same types first), so a launch that repeats its meetings allocates nothing for
    /// them.
    fn slot<T: Clone + Send + 'static, D: Send + 'static>(spare: &mut Vec<Slot>, n: usize) -> Slot {
        let same = spare.iter().rposition(|s| s.board.is::<Board<T, D>>());
        let mut slot = match same.map(|i| spare.swap_remove(i)).or_else(|| spare.pop()) {
            Some(slot) => slot,
            None => Slot {
                board: Box::new(Board::<T, D> {
                    items: Vec::new(),
                    decision: None,
                }),
                stage: Vec::new(),
                elected: None,
                readers: 0,
                gave_up: Vec::new(),
                left: 0,
            },
        };
        match slot.board.downcast_mut::<Board<T, D>>() {
            Some(board) => board.reset(n),
            None => {
                slot.board = Box::new(Board::<T, D> {
                    items: vec![vec![None; n]],
                    decision: None,
                })
            }
        }
        slot.stage.clear();
        slot.stage.resize(n, 0);
        slot.elected = None;
        slot.readers = 0;
        slot.gave_up.clear();
        slot.left = 0;
        slot
    }

    /// `device` gives up on slot `key` (if any) and on the launch.
    fn give_up(&mut self, key: &SlotKey, device: usize) {
        if let Some(slot) = self.slots.get_mut(key)
            && !slot.gave_up.contains(&device)
        {
            slot.gave_up.push(device);
        }
        if !self.failed.contains(&device) {
            self.failed.push(device);
        }
    }
}

type Guard<'a> = MutexGuard<'a, State>;

/// The meeting point of one launch's devices.
pub struct Rendezvous {
    state: Mutex<State>,
    changed: Condvar,
    timeout: Duration,
    /// Buffers the launch's members read until it ends (`launch_buffer`).
    kept: Mutex<Vec<Vec<MaybeUninit<u64>>>>,
    /// Buffers of `kept` given back during the launch (`give_back`), as (words, address): the
    /// next `launch_buffer` of this launch that fits one takes it.
    free: Mutex<Vec<(usize, usize)>>,
}

impl Default for Rendezvous {
    /// Waits give up after 60 s.
    fn default() -> Self {
        Rendezvous::with_timeout(Duration::from_secs(60))
    }
}

/// Launch buffers given back by ended launches (`Rendezvous`'s `Drop`), for the next ones
/// (`launch_buffer`): the threaded devices' shared products asked for about 10 MB of fresh
/// pages a step of the big MLP over 2 devices (2,700 page faults a step, `perf stat`), which
/// the allocator handed back to the system between launches. At most `SPARE_BYTES` kept (the
/// largest buffers of the launches so far), until `release_spare_launch_buffers`.
static SPARE: Mutex<Vec<Vec<MaybeUninit<u64>>>> = Mutex::new(Vec::new());

/// The most bytes `SPARE` keeps.
const SPARE_BYTES: usize = 256 << 20;

/// How many launch buffers were allocated rather than taken from `SPARE` (for tests).
static FRESH_BUFFERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Gives the spare launch buffers (`SPARE`) back to the allocator and returns their bytes;
/// the next launch that needs one allocates it afresh.
pub fn release_spare_launch_buffers() -> usize {
    let spare = std::mem::take(&mut *SPARE.lock().unwrap_or_else(|e| e.into_inner()));
    // Freed here, outside the lock.
    spare.iter().map(|b| b.len() * 8).sum()
}

/// How many launch buffers were allocated rather than reused, since the process started.
pub fn fresh_launch_buffers() -> usize {
    FRESH_BUFFERS.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for Rendezvous {
    /// The launch has ended (`end_launch`).
    fn drop(&mut self) {
        self.end_launch();
    }
}

/// Keeps the largest buffers of `spare` whose bytes total at most `bound`: largest first, each
/// kept if it still fits (one too large is dropped, the smaller ones after it still kept).
fn trim(spare: &mut Vec<Vec<MaybeUninit<u64>>>, bound: usize) {
    spare.sort_unstable_by_key(|b| std::cmp::Reverse(b.len()));
    let mut total = 0usize;
    spare.retain(|b| {
        let bytes = b.len() * 8;
        if total.saturating_add(bytes) <= bound {
            total += bytes;
            true
        } else {
            false
        }
    });
}

/// Room for `bytes` bytes, 8-aligned, uninitialized (at least one word).
pub fn uninit_words(bytes: usize) -> Vec<MaybeUninit<u64>> {
    let words = bytes.div_ceil(8).max(1);
    let mut v = Vec::with_capacity(words);
    v.resize_with(words, MaybeUninit::uninit);
    v
}

impl Rendezvous {
    /// A rendezvous whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Rendezvous {
        Rendezvous {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            timeout,
            kept: Mutex::new(Vec::new()),
            free: Mutex::new(Vec::new()),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Ends a launch, readying the rendezvous for the next one (a kept launch's,
    /// `tessera_runtime::device::Launcher`) with the capacity of its slot table and lists:
    /// the slots left open (abandoned by a failed launch) and the devices that gave up are
    /// forgotten, and the launch buffers go to `SPARE`. Exclusive access is the argument:
    /// every member's job holds the rendezvous until its run has returned (an error, a
    /// timeout or a caught panic included), and a run reads a launch buffer only while it
    /// runs (a pointer left in its scratch by an unwinding run is replaced before any use,
    /// `bind`), so no member reads a buffer after this.
    pub fn end_launch(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        state.slots.clear();
        state.failed.clear();
        state.spare.truncate(SPARE_SLOTS);
        self.free
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let kept = self.kept.get_mut().unwrap_or_else(|e| e.into_inner());
        if kept.is_empty() {
            return;
        }
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        spare.append(kept);
        trim(&mut spare, SPARE_BYTES);
    }

    /// The lock (see the module doc for why poisoning is ignored).
    fn lock(&self) -> Guard<'_> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for `bytes` bytes (8-aligned) that stays until the rendezvous (the launch) ends.
    /// Its contents are uninitialized: write before reading. It is an earlier launch's buffer
    /// when one large enough was given back (`SPARE`), so a step that repeats a launch's
    /// shared products allocates (and faults in) nothing for them.
    pub fn launch_buffer(&self, bytes: usize) -> *mut u8 {
        let words = bytes.div_ceil(8).max(1);
        let fits = |&(w, _): &(usize, usize)| (words..=words.saturating_mul(2)).contains(&w);
        {
            // (Pushes and removals: consistent whatever panicked.)
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = free.iter().position(fits) {
                return free.swap_remove(i).1 as *mut u8;
            }
        }
        let spare = {
            let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
            // The smallest that holds `words`, if it is at most twice as large.
            let best = (0..spare.len())
                .filter(|&i| (words..=words.saturating_mul(2)).contains(&spare[i].len()))
                .min_by_key(|&i| spare[i].len());
            best.map(|i| spare.swap_remove(i))
        };
        let buffer = spare.unwrap_or_else(|| {
            FRESH_BUFFERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            uninit_words(bytes)
        });
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        // (A push: consistent whatever panicked.) The address is taken from the vector where
        // it stays: moving a vector keeps its elements where they are.
        kept.push(buffer);
        kept.last_mut()
            .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr() as *mut u8)
    }

    /// How many launch buffers this launch holds (a diagnostic: a loop of meetings keeps it
    /// bounded, `give_back`).
    pub fn kept_buffers(&self) -> usize {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Gives back a buffer of this launch for its next `launch_buffer` of at most its size (and
    /// at least half): a launch that meets many times in a loop keeps as many buffers as it
    /// uses at once, not one a meeting.
    ///
    /// # Safety
    /// `ptr` came from this rendezvous's `launch_buffer(bytes)` during this launch, was not
    /// given back since, and nobody reads or writes it any more.
    pub unsafe fn give_back(&self, ptr: *mut u8, bytes: usize) {
        let words = bytes.div_ceil(8).max(1);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push((words, ptr as usize));
    }

    /// Records that `device` gave up on the launch: every wait of the launch, now or later,
    /// fails at once naming it.
    pub fn give_up_as(&self, device: usize) {
        let mut st = self.lock();
        if !st.failed.contains(&device) {
            st.failed.push(device);
        }
        self.changed.notify_all();
    }

    /// The first device that gave up on the launch: the one whose error explains the others'.
    pub fn first_to_give_up(&self) -> Option<usize> {
        self.lock().failed.first().copied()
    }

    /// Member `me`'s seat at the meeting `key`. Nothing is published yet.
    pub fn seat<T, D>(&self, member: Member) -> Seat<'_, T, D>
    where
        T: Clone + Send + 'static,
        D: Clone + Send + 'static,
    {
        Seat {
            r: self,
            m: member,
            open: false,
            reading: false,
            _types: PhantomData,
        }
    }
}

/// Who takes a seat, and how messages name the meeting.
#[derive(Clone, Debug)]
pub struct Member {
    pub key: SlotKey,
    /// This member's index in the group.
    pub me: usize,
    /// Each member's device id, for messages.
    pub ids: Positions,
    /// The collective's name, and its group as messages name it.
    pub op: &'static str,
    pub group: std::sync::Arc<str>,
}

impl Member {
    fn n(&self) -> usize {
        self.key.members.len()
    }

    fn device(&self) -> usize {
        self.ids[self.me]
    }
}

/// What a wait waits for.
#[derive(Clone, Copy, Debug)]
pub struct Barrier {
    stage: u8,
    /// What the late members did not do, for the timeout's message.
    what: &'static str,
    elected: bool,
}

impl Barrier {
    /// Every member at `stage` or later.
    pub const fn all(stage: u8, what: &'static str) -> Barrier {
        Barrier {
            stage,
            what,
            elected: false,
        }
    }

    /// The elected member at `stage` or later (it was elected at `stage - 1`). The waiting
    /// members park at once.
    pub const fn elected(stage: u8, what: &'static str) -> Barrier {
        Barrier {
            stage,
            what,
            elected: true,
        }
    }

    fn done(self, slot: &Slot) -> bool {
        if self.elected {
            slot.elected.is_some_and(|e| slot.stage[e] >= self.stage)
        } else {
            slot.stage.iter().all(|&s| s >= self.stage)
        }
    }

    /// Whether member `k` is one this wait waits for.
    fn late(self, slot: &Slot, k: usize) -> bool {
        if self.elected {
            let before = self.stage.saturating_sub(1);
            slot.stage[k] < before
                || (slot.stage.iter().all(|&s| s >= before) && slot.elected == Some(k))
        } else {
            slot.stage[k] < self.stage
        }
    }
}

/// The arrival barrier.
const ARRIVAL: Barrier = Barrier::all(1, "did not arrive");

/// A member's place at one meeting (see the module doc). Dropped without `leave`, it
/// abandons the slot.
pub struct Seat<'r, T: 'static, D: 'static = ()> {
    r: &'r Rendezvous,
    m: Member,
    /// Arrived, and neither left nor failed: dropping abandons.
    open: bool,
    /// One of the slot's readers.
    reading: bool,
    _types: PhantomData<fn() -> (T, D)>,
}

impl<'r, T, D> Seat<'r, T, D>
where
    T: Clone + Send + 'static,
    D: Clone + Send + 'static,
{
    /// Publishes `item` and waits for every member's; the last to arrive decides with
    /// `decide`, under the lock. Returns every member's item in group order and the decision;
    /// with `read`, this member is one of the slot's readers from then on.
    pub fn arrive(
        &mut self,
        item: T,
        decide: impl FnOnce(&[T]) -> D,
        read: bool,
    ) -> Result<(Items<T>, D), TransportError> {
        let (me, n) = (self.m.me, self.m.n());
        let mut st = self.r.lock();
        let State { slots, spare, .. } = &mut *st;
        let slot =
            (slots.entry(self.m.key.clone())).or_insert_with(|| State::slot::<T, D>(spare, n));
        let Some(board) = slot.board.downcast_mut::<Board<T, D>>() else {
            // Another collective sits at this step: the programs differ. Nobody may wait on.
            let err = TransportError::Mismatch {
                op: self.m.op,
                group: self.m.group.to_string(),
                me: self.m.device(),
                seq: self.m.key.seq,
            };
            st.give_up(&self.m.key, self.m.device());
            self.r.changed.notify_all();
            return Err(err);
        };
        board.publish(1, me, item);
        if board.items[0].iter().all(Option::is_some) {
            board.decision = Some(decide(&board.at(1)));
        }
        slot.stage[me] = slot.stage[me].max(1);
        self.open = true;
        self.r.changed.notify_all();
        let mut st = self.wait_locked(st, ARRIVAL)?;
        let slot = st
            .slots
            .get_mut(&self.m.key)
            .expect("slot stays until all left");
        if read {
            slot.readers += 1;
            self.reading = true;
        }
        let board = board_of::<T, D>(slot);
        let items = board.at(1);
        let decision = board
            .decision
            .clone()
            .expect("decided by the last to arrive");
        Ok((items, decision))
    }

    /// Marks this member at `stage` (a later one than it is at), publishing `item` for that
    /// stage if given, and wakes the others.
    pub fn advance(&mut self, stage: u8, item: Option<T>) {
        let mut st = self.r.lock();
        let slot = st.slots.get_mut(&self.m.key).expect("arrived");
        if let Some(item) = item {
            board_of::<T, D>(slot).publish(stage, self.m.me, item);
        }
        slot.stage[self.m.me] = stage;
        self.r.changed.notify_all();
    }

    /// Marks this member at `stage`; if that makes it the last to get there, the slot not
    /// abandoned and the launch not failed, elects it (and, with `read`, makes it one of the
    /// slot's readers, under the lock) and returns `true`.
    pub fn advance_and_elect(&mut self, stage: u8, read: bool) -> bool {
        let mut st = self.r.lock();
        let launch_failed = !st.failed.is_empty();
        let slot = st.slots.get_mut(&self.m.key).expect("arrived");
        slot.stage[self.m.me] = stage;
        let elected = slot.elected.is_none()
            && slot.stage.iter().all(|&s| s >= stage)
            && !slot.abandoned()
            && !launch_failed;
        if elected {
            slot.elected = Some(self.m.me);
            if read {
                slot.readers += 1;
                self.reading = true;
            }
        }
        self.r.changed.notify_all();
        elected
    }

    /// Stops reading other members' buffers (if it did) and marks this member at `stage`.
    pub fn finish(&mut self, stage: u8) {
        let mut st = self.r.lock();
        let slot = st.slots.get_mut(&self.m.key).expect("arrived");
        if self.reading {
            slot.readers -= 1;
            self.reading = false;
        }
        slot.stage[self.m.me] = stage;
        self.r.changed.notify_all();
    }

    /// Waits for `barrier`; returns the items published at its stage, in group order (none
    /// when nobody published at that stage).
    pub fn wait(&mut self, barrier: Barrier) -> Result<Items<T>, TransportError> {
        let st = self.r.lock();
        let mut st = self.wait_locked(st, barrier)?;
        let slot = st
            .slots
            .get_mut(&self.m.key)
            .expect("slot stays until all left");
        Ok(board_of::<T, D>(slot).at(barrier.stage))
    }

    /// Done with the slot: stops reading; the last member to leave removes the slot (and
    /// gets `true`: every member has left, after all it read).
    pub fn leave(mut self) -> bool {
        let mut st = self.r.lock();
        let slot = st.slots.get_mut(&self.m.key).expect("arrived");
        if self.reading {
            slot.readers -= 1;
            self.reading = false;
        }
        slot.left += 1;
        let last = slot.left == self.m.n();
        if last
            && let Some(mut ended) = st.slots.remove(&self.m.key)
            && st.spare.len() < SPARE_SLOTS
        {
            // Its items let go of now, as the removed slot's were.
            if let Some(board) = ended.board.downcast_mut::<Board<T, D>>() {
                board.reset(0);
            }
            st.spare.push(ended);
        }
        self.open = false;
        self.r.changed.notify_all();
        last
    }

    /// Waits (yielding a while, then parked; parked at once for an elected barrier) until
    /// `barrier` holds. Fails when the slot is abandoned or the launch failed (checked first),
    /// or after the timeout (this member then abandons the slot and the launch); on failure it
    /// abandons as the module doc says before it returns.
    fn wait_locked(
        &mut self,
        mut st: Guard<'r>,
        barrier: Barrier,
    ) -> Result<Guard<'r>, TransportError> {
        let r = self.r;
        let start = Instant::now();
        let yields = if barrier.elected {
            0
        } else {
            YIELDS_BEFORE_PARKING
        };
        let mut yielded = 0;
        loop {
            let State { slots, failed, .. } = &mut *st;
            let slot = slots
                .get_mut(&self.m.key)
                .expect("slot stays until all left");
            if !failed.is_empty() && !slot.abandoned() {
                slot.gave_up.extend_from_slice(failed);
            }
            if slot.abandoned() {
                let err = TransportError::GaveUp {
                    op: self.m.op,
                    group: self.m.group.to_string(),
                    devices: slot.gave_up.clone(),
                    me: self.m.device(),
                };
                return Err(self.bail(st, err));
            }
            if barrier.done(slot) {
                return Ok(st);
            }
            let waited = start.elapsed();
            if waited >= r.timeout {
                let late: Vec<usize> = (0..self.m.n())
                    .filter(|&k| barrier.late(slot, k))
                    .map(|k| self.m.ids[k])
                    .collect();
                let err = TransportError::Timeout {
                    op: self.m.op,
                    group: self.m.group.to_string(),
                    late,
                    what: barrier.what,
                    timeout: r.timeout,
                    me: self.m.device(),
                };
                st.give_up(&self.m.key, self.m.device());
                return Err(self.bail(st, err));
            }
            if yielded < yields {
                yielded += 1;
                drop(st);
                std::thread::yield_now();
                st = r.lock();
            } else {
                st = r
                    .changed
                    .wait_timeout(st, r.timeout - waited)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

impl<'r, T: 'static, D: 'static> Seat<'r, T, D> {
    /// Abandons the (already given up) slot and returns `err`: retracts this member's item,
    /// stops its reading, wakes the others, and waits until no member reads any more.
    ///
    /// This is the one wait without the timeout, and it waits for no missing member: the
    /// readers are between two of their waits doing bounded work, and stop at their next
    /// wait, which fails at once on the abandoned slot.
    fn bail<E>(&mut self, mut st: Guard<'r>, err: E) -> E {
        let r = self.r;
        self.open = false;
        let Some(slot) = st.slots.get_mut(&self.m.key) else {
            return err;
        };
        if let Some(board) = slot.board.downcast_mut::<Board<T, D>>() {
            board.retract(self.m.me);
        }
        if self.reading {
            slot.readers -= 1;
            self.reading = false;
        }
        r.changed.notify_all();
        while st.slots.get(&self.m.key).is_some_and(|s| s.readers > 0) {
            st = r.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        err
    }
}

impl<T: 'static, D: 'static> Drop for Seat<'_, T, D> {
    /// A seat dropped while open (a panic between meetings, an early return) gives up on the
    /// slot and the launch, then abandons the slot as a failed wait does.
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let mut st = self.r.lock();
        st.give_up(&self.m.key, self.m.device());
        self.bail(st, ());
    }
}

fn board_of<T: 'static, D: 'static>(slot: &mut Slot) -> &mut Board<T, D> {
    slot.board
        .downcast_mut::<Board<T, D>>()
        .expect("the arrival checked the slot's type")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A launch's buffers serve the next launch's requests of the same sizes: nothing is
    /// allocated again. No other test of this crate asks for launch buffers, so none takes
    /// these (a request takes any spare of 1 to 2 times its size) or moves the global count
    /// meanwhile.
    #[test]
    fn the_next_launch_reuses_the_last_ones_buffers() {
        let sizes = [3_000_017usize, 1_000_003];
        let first = Rendezvous::with_timeout(Duration::from_secs(1));
        let mut addrs: Vec<usize> = sizes
            .iter()
            .map(|&b| first.launch_buffer(b) as usize)
            .collect();
        drop(first);
        let fresh = fresh_launch_buffers();
        let next = Rendezvous::with_timeout(Duration::from_secs(1));
        let mut again: Vec<usize> = sizes
            .iter()
            .map(|&b| next.launch_buffer(b) as usize)
            .collect();
        addrs.sort_unstable();
        again.sort_unstable();
        assert_eq!(again, addrs, "the same buffers");
        assert_eq!(fresh_launch_buffers(), fresh, "nothing allocated");
        // Released, the spares are gone: the next launch allocates both afresh.
        drop(next);
        let bytes: usize = sizes.iter().map(|b| b.div_ceil(8) * 8).sum();
        assert!(release_spare_launch_buffers() >= bytes);
        assert_eq!(release_spare_launch_buffers(), 0);
        let last = Rendezvous::with_timeout(Duration::from_secs(1));
        for &b in &sizes {
            last.launch_buffer(b);
        }
        assert_eq!(
            fresh_launch_buffers(),
            fresh + sizes.len(),
            "allocated afresh"
        );
    }

    /// A buffer given back during a launch serves the launch's next request that it fits (of
    /// at most its size and at least half), and none other.
    #[test]
    fn a_buffer_given_back_serves_the_next_request_that_fits() {
        let r = Rendezvous::with_timeout(Duration::from_secs(1));
        let a = r.launch_buffer(800);
        // SAFETY: `a` came from `r.launch_buffer(800)` and nothing uses it.
        unsafe { r.give_back(a, 800) };
        let small = r.launch_buffer(8);
        assert_ne!(small, a, "a tenth of it: not served by it");
        assert_eq!(r.launch_buffer(500), a, "served by the one given back");
        assert_ne!(r.launch_buffer(500), a, "given once, taken once");
        assert_eq!(r.kept_buffers(), 3);
    }

    /// The spare list keeps the largest buffers within its bound, skipping one too large.
    #[test]
    fn the_spare_list_keeps_the_largest_that_fit() {
        let words = |w: usize| uninit_words(w * 8);
        let mut spare = vec![words(10), words(300), words(200), words(100)];
        trim(&mut spare, 250 * 8);
        let kept: Vec<usize> = spare.iter().map(Vec::len).collect();
        assert_eq!(kept, [200, 10]);
    }

    const IDS: [usize; 3] = [10, 11, 12];

    fn member(seq: u64, me: usize, n: usize) -> Member {
        Member {
            key: SlotKey {
                launch: 0,
                seq,
                members: (0..n).collect(),
            },
            me,
            ids: IDS[..n].iter().copied().collect(),
            op: "test_op",
            group: "over [\"x\"]".into(),
        }
    }

    fn open_slots(r: &Rendezvous) -> usize {
        r.lock().slots.len()
    }

    /// Runs `f(position)` on `n` threads at once.
    fn on<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|p| {
                    let f = &f;
                    s.spawn(move || f(p))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Publish and meet: every member sees every item in group order and the one decision,
    /// made once by the last to arrive; a later stage's items replace the first; the last to
    /// leave removes the slot.
    #[test]
    fn members_meet_see_every_item_and_one_decision() {
        let r = Rendezvous::with_timeout(Duration::from_secs(5));
        let decided = AtomicUsize::new(0);
        let got = on(3, |p| {
            let mut seat: Seat<'_, usize, usize> = r.seat(member(0, p, 3));
            let (items, d) = seat
                .arrive(
                    p * 10,
                    |all| {
                        decided.fetch_add(1, Ordering::SeqCst);
                        all.iter().sum()
                    },
                    false,
                )
                .unwrap();
            seat.advance(2, Some(p + 100));
            let later = seat.wait(Barrier::all(2, "did not advance")).unwrap();
            seat.leave();
            (items, d, later)
        });
        assert_eq!(decided.load(Ordering::SeqCst), 1);
        for (items, d, later) in got {
            assert_eq!(items.as_slice(), [0, 10, 20]);
            assert_eq!(d, 30);
            assert_eq!(later.as_slice(), [100, 101, 102]);
        }
        assert_eq!(open_slots(&r), 0);
    }

    #[test]
    fn a_member_that_never_arrives_is_named_after_the_timeout() {
        let r = Rendezvous::with_timeout(Duration::from_millis(50));
        let got = on(2, |p| {
            let mut seat: Seat<'_, u8> = r.seat(member(0, p, 3));
            let start = Instant::now();
            let e = seat.arrive(0, |_| (), false).unwrap_err();
            (e, start.elapsed())
        });
        // The first to time out gives up; the other fails naming it, or times out itself.
        let timeouts: Vec<&TransportError> = got
            .iter()
            .map(|(e, _)| e)
            .filter(|e| matches!(e, TransportError::Timeout { .. }))
            .collect();
        assert!(!timeouts.is_empty());
        let msg = timeouts[0].to_string();
        assert!(
            msg.starts_with("test_op: over [\"x\"]: devices [12] did not arrive within 50 ms"),
            "{msg}"
        );
        assert!(got.iter().all(|(_, t)| *t < Duration::from_secs(2)));
    }

    /// A device that gave up on the launch (its program failed elsewhere) fails every wait at
    /// once, naming it, instead of after the timeout.
    #[test]
    fn a_launch_given_up_fails_every_wait_at_once() {
        let r = Rendezvous::with_timeout(Duration::from_secs(30));
        r.give_up_as(12);
        let start = Instant::now();
        let mut seat: Seat<'_, u8> = r.seat(member(0, 0, 3));
        let e = seat.arrive(0, |_| (), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "test_op: over [\"x\"]: device 12 gave up, so device 10 cannot go on"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(r.first_to_give_up(), Some(12));
    }

    /// A seat dropped between meetings (a panic while reading) abandons the slot: the other
    /// member fails at once naming it, and the dropping member returns only after the reader
    /// stopped.
    #[test]
    fn a_dropped_seat_abandons_and_waits_for_the_readers() {
        let r = Rendezvous::with_timeout(Duration::from_secs(30));
        let got = on(2, |p| {
            let mut seat: Seat<'_, u8> = r.seat(member(0, p, 2));
            seat.arrive(0, |_| (), true).unwrap();
            if p == 0 {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    let _seat = seat;
                    panic!("injected");
                }));
                assert!(outcome.is_err());
                return (Instant::now(), Instant::now(), String::new());
            }
            // Reading the other member's buffers for a while.
            std::thread::sleep(Duration::from_millis(200));
            let read_until = Instant::now();
            seat.advance(2, None);
            let e = seat.wait(Barrier::all(2, "did not finish")).unwrap_err();
            (read_until, Instant::now(), e.to_string())
        });
        let (left0, _, _) = &got[0];
        let (read1, _, e1) = &got[1];
        assert!(left0 >= read1, "device 10 left while device 11 still read");
        assert_eq!(
            e1,
            "test_op: over [\"x\"]: device 10 gave up, so device 11 cannot go on"
        );
    }

    /// Issue 10, item 2: a member that times out between two meetings names the late member,
    /// and returns only after that member stopped reading the group's buffers; the late one
    /// then fails naming it.
    #[test]
    fn a_timeout_between_meetings_waits_for_the_readers() {
        let r = Rendezvous::with_timeout(Duration::from_millis(100));
        let got = on(2, |p| {
            let mut seat: Seat<'_, u8> = r.seat(member(0, p, 2));
            seat.arrive(0, |_| (), true).unwrap();
            std::thread::sleep(if p == 1 {
                Duration::from_millis(400)
            } else {
                Duration::ZERO
            });
            let read_until = Instant::now();
            seat.advance(2, None);
            let e = seat
                .wait(Barrier::all(2, "did not finish their share"))
                .unwrap_err();
            (e.to_string(), read_until, Instant::now())
        });
        let ((e0, _, left0), (e1, read1, _)) = (&got[0], &got[1]);
        assert!(
            e0.contains("devices [11] did not finish their share within 100 ms"),
            "{e0}"
        );
        assert!(e1.contains("device 10 gave up"), "{e1}");
        assert!(left0 >= read1, "device 10 left while device 11 still read");
    }

    /// One member is elected, the last to reach the stage; the others wait for it; a wait for
    /// an elected member that is too slow names it, and returns once it stopped reading.
    #[test]
    fn the_last_member_is_elected_and_the_others_wait_for_it() {
        for slow in [Duration::ZERO, Duration::from_millis(300)] {
            let r = Rendezvous::with_timeout(Duration::from_millis(100));
            let got = on(3, |p| {
                let mut seat: Seat<'_, u8> = r.seat(member(0, p, 3));
                seat.arrive(0, |_| (), false).unwrap();
                let elected = seat.advance_and_elect(2, true);
                let mut worked = None;
                if elected {
                    std::thread::sleep(slow);
                    worked = Some(Instant::now());
                    seat.finish(3);
                }
                let outcome = seat.wait(Barrier::elected(3, "did not finish the product"));
                if outcome.is_ok() {
                    seat.leave();
                }
                (elected, worked, outcome.map(|_| ()), Instant::now())
            });
            assert_eq!(got.iter().filter(|g| g.0).count(), 1, "{slow:?}");
            let worked = got.iter().find_map(|g| g.1).unwrap();
            if slow.is_zero() {
                assert!(got.iter().all(|g| g.2.is_ok()));
                assert_eq!(open_slots(&r), 0);
            } else {
                let e = got
                    .iter()
                    .find_map(|g| g.2.clone().err())
                    .unwrap()
                    .to_string();
                assert!(
                    e.contains("did not finish the product within 100 ms") || e.contains("gave up"),
                    "{e}"
                );
                for (elected, _, _, left) in &got {
                    assert!(
                        *elected || *left >= worked,
                        "a member left while the product ran"
                    );
                }
            }
        }
    }

    /// Members that reach the same step with different collectives (programs that differ)
    /// fail, naming the step, instead of reading each other's items as the wrong type.
    #[test]
    fn members_of_different_collectives_are_an_error() {
        let r = Rendezvous::with_timeout(Duration::from_secs(5));
        let got = on(2, |p| {
            if p == 0 {
                let mut seat: Seat<'_, u8> = r.seat(member(3, 0, 2));
                seat.arrive(0, |_| (), false).map(|_| ()).unwrap_err()
            } else {
                std::thread::sleep(Duration::from_millis(50));
                let mut seat: Seat<'_, (usize, usize)> = r.seat(member(3, 1, 2));
                seat.arrive((0, 0), |_| (), false).map(|_| ()).unwrap_err()
            }
        });
        assert_eq!(
            got[1].to_string(),
            "test_op: over [\"x\"]: device 11 met devices that run another collective (step 3 of the launch)"
        );
        assert!(
            got[0].to_string().contains("device 11 gave up"),
            "{}",
            got[0]
        );
    }

    /// A member that leaves while reading wakes a member that bailed and waits for the
    /// readers (before, leaving did not notify: the bailing member, whose wait has no timeout,
    /// slept until some other event).
    #[test]
    fn leaving_wakes_a_member_that_waits_for_the_readers() {
        let r = Rendezvous::with_timeout(Duration::from_secs(30));
        let (passed_tx, passed_rx) = std::sync::mpsc::channel();
        let (failed_tx, failed_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let r = &r;
            s.spawn(move || {
                let mut seat: Seat<'_, u8> = r.seat(member(0, 0, 2));
                seat.arrive(0, |_| (), true).unwrap();
                seat.advance(2, None);
                seat.wait(Barrier::all(2, "did not finish")).unwrap();
                passed_tx.send(()).unwrap();
                // Still reading while the other member fails.
                failed_rx.recv().unwrap();
                std::thread::sleep(Duration::from_millis(100));
                seat.leave();
            });
            s.spawn(move || {
                let mut seat: Seat<'_, u8> = r.seat(member(0, 1, 2));
                seat.arrive(0, |_| (), true).unwrap();
                seat.advance(2, None);
                passed_rx.recv().unwrap();
                // Another device of the launch fails: this member's next wait gives up.
                r.give_up_as(99);
                failed_tx.send(()).unwrap();
                let e = seat.wait(Barrier::all(3, "did not finish")).unwrap_err();
                done_tx.send(e.to_string()).unwrap();
            });
            let e = done_rx.recv_timeout(Duration::from_secs(5));
            if e.is_err() {
                // Wake it, so the test fails instead of hanging.
                r.give_up_as(100);
            }
            let e = e.expect("the member waiting for the readers was never woken");
            assert!(e.contains("device 99 gave up"), "{e}");
        });
    }
}
