//! A team of two threads for a run that splits its ops (a one-device program's, `steps_from`,
//! or a process's devices run in turn on one thread, `together::run_together_in`): the thread
//! running it (the leader) and one helper thread, which spins while the run goes on and takes
//! the second half of each split kernel, conv and product, or of a phase's devices (`join`).
//!
//! Why not rayon's `join`: handing a half to a sleeping pool worker and waiting for it costs a
//! futex wake each way, 12-65 us an empty `rayon::join` on the Xeon VM of docs/PERFORMANCE.md
//! (and the leader, outside the pool, sleeps in turn); the small CNN's step splits 15 ops.
//! A spinning helper answers in 0.2-0.5 us. And the halves land on the same cores every time:
//! the first half of every op on the leader, the second on the helper, so a batch half written
//! by one op is read by the next from its own core's cache (moving a line between the cores
//! of that VM costs about 0.5 ns an f32: the step pinned to one core ran faster, 1.30 ms, than
//! on two unpinned, 1.56 ms).
//!
//! The protocol (one mailbox for the process; one leader at a time, `lead`): the leader
//! writes the job and sets `POSTED`; the helper claims it (`POSTED -> TAKEN`), runs it and sets
//! `DONE`; the leader, after its own half, either takes the job back (`POSTED -> IDLE`) and
//! runs it itself, or waits for `DONE`. A job is only ever run by the one that moved it out
//! of `POSTED`, and the leader returns only once it is finished, so a job may borrow the
//! leader's stack. The helper spins for `SPIN` after its last job (across the gap between two
//! runs of a training loop), and otherwise parks; a leader wakes it when it posts to a parked
//! helper, and meanwhile runs both halves itself if the helper has not come. On the helper, and
//! inside a job, `join` runs its halves one after the other, and a job never enters rayon: a
//! job never waits for another thread, so the leader's wait for a taken job is bounded by the
//! job's own work. A rayon worker never leads (its pool's other worker would compete with the
//! helper for the cores), nor does a thread of a pool other than two threads wide.

use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// No job; only the leader writes the mailbox's job in this state.
const IDLE: u32 = 0;
/// A job waits for the helper (or the leader, to take back).
const POSTED: u32 = 1;
/// The helper runs the job.
const TAKEN: u32 = 2;
/// The helper finished the job.
const DONE: u32 = 3;
/// The job panicked on the helper.
const PANICKED: u32 = 4;

/// How long the helper spins after its last job before it parks. Longer than the gaps between
/// split ops of a step (a few us) and between the steps of a training loop (the small CNN's:
/// at 100 us the helper was parked at 1.9 of the 10 posts of each step); short enough that a
/// program that stops splitting gives its core back soon.
const SPIN: Duration = Duration::from_micros(300);

/// A job: runs the second half of a `join` (a pointer to the leader's closure, alive while
/// the job is posted or taken: see `join`).
type Job = *const (dyn Fn() + Sync);

struct Mailbox {
    state: AtomicU32,
    /// Written by the leader in state `IDLE` only; read by the helper after it moves the state
    /// from `POSTED` to `TAKEN`, which the leader's write happens before (release/acquire).
    job: UnsafeCell<Option<Job>>,
    /// A thread holds the team (`Lease`).
    led: AtomicBool,
    /// The leader wants the cores to itself for a while (`Quiet`): the helper parks.
    quiet: AtomicBool,
    /// The helper is parked or about to park: a poster must unpark it.
    parked: AtomicBool,
}

// SAFETY: `job` is the only field without its own synchronization; the protocol above orders
// every access to it (the leader writes it only in `IDLE`, when no helper reads it; the helper
// reads it only between its `POSTED -> TAKEN` and its `DONE`/`PANICKED`, during which the
// leader neither writes it nor returns).
unsafe impl Sync for Mailbox {}

static TEAM: Mailbox = Mailbox {
    state: AtomicU32::new(IDLE),
    job: UnsafeCell::new(None),
    led: AtomicBool::new(false),
    quiet: AtomicBool::new(false),
    parked: AtomicBool::new(true),
};

/// The helper thread, started by the first post (`None`: it could not be started, and there
/// is no team).
static HELPER: OnceLock<Option<std::thread::Thread>> = OnceLock::new();

thread_local! {
    /// This thread holds the team.
    static LEADING: Cell<bool> = const { Cell::new(false) };
    /// This thread is inside a `join` (either half) or is the helper: `join` runs in turn.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// This thread is the helper.
    static HELPING: Cell<bool> = const { Cell::new(false) };
    /// How many joins this thread posted to the team (tests).
    #[cfg(test)]
    pub(crate) static POSTS: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is the team's helper, where nothing may enter rayon (`Quiet::new`
/// checks it on the paths that do).
fn on_helper() -> bool {
    HELPING.with(Cell::get)
}

/// The team, held by one thread for a run (`lead`); released when dropped. Not `Send`: the
/// lease is the thread's.
pub(crate) struct Lease {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

/// Takes the team for this thread: `join` then splits over the leader and the helper. `None`
/// (`join` stays rayon's) when the rayon pool is not two threads wide (a larger pool keeps
/// rayon's splits, which use every core), this thread is one of its workers (the other worker
/// may be running a run of its own: three busy threads on two cores), it may not post (one
/// CPU: a leader that can never post would only keep the team from others), or `take`
/// refuses.
pub(crate) fn lead() -> Option<Lease> {
    if rayon::current_num_threads() != 2 || rayon::current_thread_index().is_some() || !may_post() {
        return None;
    }
    take()
}

/// Takes the team, if no other thread holds it, this thread is not already leading or inside a
/// join, and the helper has not failed to start.
fn take() -> Option<Lease> {
    if LEADING.with(Cell::get) || INSIDE.with(Cell::get) {
        return None;
    }
    // The helper starts at the first post (`join`): a program that never splits (the seed
    // step) never pays for the thread; one that failed to start means no team.
    if HELPER.get().is_some_and(Option::is_none) {
        return None;
    }
    TEAM.led
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .ok()?;
    LEADING.with(|l| l.set(true));
    Some(Lease {
        _thread_bound: std::marker::PhantomData,
    })
}

impl Drop for Lease {
    fn drop(&mut self) {
        LEADING.with(|l| l.set(false));
        TEAM.quiet.store(false, Ordering::Relaxed);
        TEAM.led.store(false, Ordering::Release);
    }
}

/// While alive, the helper parks and `join` is rayon's: for a product the gemm library spreads
/// over the rayon pool itself, whose threads need both cores.
pub(crate) struct Quiet {
    was: bool,
}

impl Quiet {
    pub(crate) fn new() -> Quiet {
        // A job on the helper never enters rayon (`join`'s contract; this is where code does).
        debug_assert!(!on_helper(), "a team job entered rayon");
        let was = LEADING.with(Cell::get) && !TEAM.quiet.swap(true, Ordering::Relaxed);
        Quiet { was }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        if self.was {
            TEAM.quiet.store(false, Ordering::SeqCst);
            // The helper parked for the product: wake it for the splits that follow (the next
            // step's first, when this was the last product of a step), so that they do not
            // wait for it to come back.
            if TEAM.parked.load(Ordering::SeqCst) {
                wake();
            }
        }
    }
}

/// The threads `join` splits over on this thread: 2 for a leader (the team), else rayon's.
pub(crate) fn threads() -> usize {
    if leads() {
        2
    } else {
        rayon::current_num_threads()
    }
}

/// This thread runs a team job, either half of a `join` or the helper's: what it runs must
/// not split or enter rayon (`join`'s contract; `Executable::kernel_threads_from`).
pub(crate) fn in_job() -> bool {
    INSIDE.with(Cell::get)
}

/// This thread holds the team and may post a job now.
pub(crate) fn leads() -> bool {
    LEADING.with(Cell::get) && !INSIDE.with(Cell::get) && !TEAM.quiet.load(Ordering::Relaxed)
}

/// Runs `a` and `b`, possibly at once, and returns both results. On a leader, `a` runs on this
/// thread and `b` on the helper (or here, after `a`, when the helper has not taken it); inside
/// a job or on the helper, one after the other; elsewhere, `rayon::join`. A panic in either is
/// resumed here once both have finished, with its own payload.
///
/// `b` must not wait for another thread (no rayon, no lock another thread may hold): the
/// leader waits for a `b` the helper has taken with no timeout, bounded by `b`'s own work.
pub(crate) fn join<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: Fn() -> RB + Sync + Send,
    RA: Send,
    RB: Send,
{
    if INSIDE.with(Cell::get) {
        return (a(), b());
    }
    if !leads() || !may_post() || HELPER.get_or_init(start_helper).is_none() {
        return rayon::join(a, b);
    }
    // The helper computes with this thread's floating-point controls (a caller's
    // flush-to-zero applies to both halves).
    let controls = float_controls();
    // `b`'s result or its panic, kept for this thread: a panic's payload is resumed (and
    // dropped) here, never on the helper.
    type Caught<R> = std::thread::Result<R>;
    let slot: std::sync::Mutex<Option<Caught<RB>>> = std::sync::Mutex::new(None);
    let job = || {
        let theirs = float_controls();
        set_float_controls(controls);
        let r = catch_unwind(AssertUnwindSafe(&b));
        set_float_controls(theirs);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    };
    let job_ref: &(dyn Fn() + Sync) = &job;
    // SAFETY: only the pointer's lifetime is erased (same layout). The helper calls it only
    // between taking the job (`POSTED -> TAKEN`) and setting `DONE`/`PANICKED`, and this
    // function returns only after that (or after taking the job back, when no helper will
    // call it), so `job` and what it borrows outlive every call.
    let ptr: Job = unsafe { std::mem::transmute::<*const (dyn Fn() + Sync + '_), Job>(job_ref) };
    // SAFETY: the state is `IDLE`: this thread is the only leader (`take`), it has no join in
    // flight (`leads` checked `INSIDE`), and every join returns the state to `IDLE` before it
    // returns (a panic in `a` is caught below, before that), so no helper reads the job now.
    unsafe { *TEAM.job.get() = Some(ptr) };
    TEAM.state.store(POSTED, Ordering::SeqCst);
    #[cfg(test)]
    POSTS.with(|p| p.set(p.get() + 1));
    if TEAM.parked.load(Ordering::SeqCst) {
        wake();
    }
    INSIDE.with(|i| i.set(true));
    let ra = catch_unwind(AssertUnwindSafe(a));
    match TEAM
        .state
        .compare_exchange(POSTED, IDLE, Ordering::AcqRel, Ordering::Acquire)
    {
        // Not taken: this thread runs it.
        Ok(_) => job(),
        Err(taken) => {
            debug_assert!(matches!(taken, TAKEN | DONE | PANICKED), "state {taken}");
            // Taken: the helper is running it, a computation that waits for no other thread
            // (`join`'s contract: a kernel half, a conv part or a product on one thread), so
            // this ends when its work does.
            let mut spins = 0u32;
            // `PANICKED`: the job's own catch could not store its result; the slot is then
            // empty, reported below.
            while !matches!(TEAM.state.load(Ordering::Acquire), DONE | PANICKED) {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            TEAM.state.store(IDLE, Ordering::Release);
        }
    }
    // SAFETY: the state is `IDLE` again: no helper reads the job.
    unsafe { *TEAM.job.get() = None };
    INSIDE.with(|i| i.set(false));
    let ra = ra.unwrap_or_else(|p| resume_unwind(p));
    let rb = slot.into_inner().unwrap_or_else(|e| e.into_inner());
    match rb {
        Some(Ok(rb)) => (ra, rb),
        Some(Err(p)) => resume_unwind(p),
        None => panic!("a team job ended without its result (the helper thread failed)"),
    }
}

/// Whether this thread may post to the helper: it may run on two CPUs or more (read once a
/// thread: a thread pinned to one CPU would share it with the helper it starts, and a pinned
/// thread's halves are better run by rayon's workers).
fn may_post() -> bool {
    thread_local! {
        // The thread's own CPUs first: only a thread that may run on two fills
        // `process_cores`'s value, which is then the process's (its cgroup's quota).
        static WIDE: bool = thread_cpus() >= 2 && process_cores() >= 2;
    }
    WIDE.with(|w| *w)
}

/// The cores this process may use, as `prepare` was told (`set_cores`; otherwise std's
/// `available_parallelism`, read once, by a thread that may run on two CPUs or more: `may_post`
/// asks only then): the cgroup's quota is read from files, 0.1 ms of the seed step's first
/// call when `may_post` read it on every thread (perf, Xeon VM).
static CORES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Records the cores this process may use (`prepare`'s `threads`).
pub(crate) fn set_cores(n: usize) {
    CORES.store(n, Ordering::Relaxed);
}

fn process_cores() -> usize {
    match CORES.load(Ordering::Relaxed) {
        0 => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            CORES.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// The CPUs this thread may run on (its affinity mask: one system call).
#[cfg(target_os = "linux")]
fn thread_cpus() -> usize {
    // SAFETY: `cpu_set_t` is plain data (all zeros is the empty set); `sched_getaffinity`
    // writes at most `size_of::<cpu_set_t>()` bytes into it, the size we pass, and `CPU_COUNT`
    // only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let read = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        match usize::try_from(libc::CPU_COUNT(&set)) {
            Ok(n) if read == 0 && n > 0 => n,
            // No answer (more CPUs than the set holds) or an empty set: std's reading, which
            // falls back to the CPUs online, as the per-thread reading before this did.
            _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn thread_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// This thread's floating-point control register (MXCSR: rounding, flush-to-zero,
/// denormals-are-zero, exception masks).
#[cfg(target_arch = "x86_64")]
fn float_controls() -> u32 {
    let mut v = 0u32;
    // SAFETY: `stmxcsr` stores the 32-bit register into `v`, a valid, aligned u32 this
    // function owns; it touches no other memory and no flags.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags));
    }
    v
}

/// Sets this thread's MXCSR to `v`, a value read by `float_controls` (so its reserved bits
/// are zero, and `ldmxcsr` does not fault).
#[cfg(target_arch = "x86_64")]
fn set_float_controls(v: u32) {
    // SAFETY: `ldmxcsr` loads 4 bytes from `v`, a valid u32 on this stack frame; `v` came
    // from `stmxcsr` on this machine, so its reserved bits are clear (no #GP); it changes
    // only this thread's floating-point controls, which the caller restores.
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, readonly, preserves_flags));
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn float_controls() -> u32 {
    0
}

#[cfg(not(target_arch = "x86_64"))]
fn set_float_controls(_: u32) {}

/// Unparks the helper.
fn wake() {
    TEAM.parked.store(false, Ordering::SeqCst);
    if let Some(Some(t)) = HELPER.get() {
        t.unpark();
    }
}

/// Starts the helper thread (from a thread that may run on two CPUs or more, whose affinity
/// it inherits: `may_post`); `None` when the system refuses a thread.
fn start_helper() -> Option<std::thread::Thread> {
    std::thread::Builder::new()
        .name("tessera-team".into())
        .spawn(helper)
        .ok()
        .map(|h| h.thread().clone())
}

/// Starts the helper thread now if it has not started (`prepare`, on a pool worker, so that
/// the first compile's `join` finds it and the caller pays no thread start).
pub(crate) fn start() {
    HELPER.get_or_init(start_helper);
}

/// The helper's loop: takes posted jobs while a leader holds the team, spinning up to `SPIN`
/// after the last; parks otherwise.
fn helper() {
    INSIDE.with(|i| i.set(true));
    HELPING.with(|h| h.set(true));
    let mut last = Instant::now();
    let mut spins = 0u32;
    loop {
        if TEAM.state.load(Ordering::Acquire) == POSTED
            && TEAM
                .state
                .compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // SAFETY: taken: the leader wrote the job before posting it and keeps it alive
            // until this thread sets `DONE` or `PANICKED` (see `join`).
            let job = unsafe { *TEAM.job.get() };
            let ok = match job {
                // SAFETY: as above: the closure is alive and `Sync`.
                Some(f) => catch_unwind(AssertUnwindSafe(|| unsafe { (*f)() })).is_ok(),
                None => false,
            };
            TEAM.state
                .store(if ok { DONE } else { PANICKED }, Ordering::Release);
            last = Instant::now();
            spins = 0;
            continue;
        }
        spins = spins.wrapping_add(1);
        let quiet = TEAM.quiet.load(Ordering::Relaxed);
        if !quiet && (!spins.is_multiple_of(256) || last.elapsed() < SPIN) {
            std::hint::spin_loop();
            continue;
        }
        // Park, unless a job was posted meanwhile: a poster that sees `parked` unparks, and
        // one that posted before this store is seen by the load after it (both SeqCst).
        TEAM.parked.store(true, Ordering::SeqCst);
        if TEAM.state.load(Ordering::SeqCst) != POSTED {
            // Idle until a post (an idle wait: nothing waits for it; the timeout only wakes it
            // to look again).
            std::thread::park_timeout(Duration::from_secs(1));
        }
        TEAM.parked.store(false, Ordering::SeqCst);
        last = Instant::now();
        spins = 0;
    }
}

/// Runs `f` as a team job runs (`in_job`), for the tests of what a job may do.
#[cfg(test)]
pub(crate) fn as_a_job<R>(f: impl FnOnce() -> R) -> R {
    let was = INSIDE.with(|i| i.replace(true));
    let r = f();
    INSIDE.with(|i| i.set(was));
    r
}

/// For tests of runs that split: calls `run` until a call posts to the team, when this thread
/// can lead it (a pool of two threads, two CPUs; another test may hold the team for a while,
/// so up to a minute), or once when it cannot; returns how many joins that call posted, and
/// whether this thread could lead.
#[cfg(test)]
pub(crate) fn posts_once_the_team_is_free(mut run: impl FnMut()) -> (usize, bool) {
    let team = rayon::current_num_threads() == 2 && may_post();
    let start = std::time::Instant::now();
    loop {
        let before = POSTS.with(Cell::get);
        run();
        let posts = POSTS.with(Cell::get) - before;
        if !team || posts > 0 {
            return (posts, team);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "no run got the team"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader's `join` runs `b` on the helper once it spins, every result comes back, and
    /// a panic in either half reaches the caller after both finished.
    #[test]
    fn a_leaders_halves_run_on_two_threads_and_panics_come_back() {
        // The team is the process's: wait for it if another test holds it.
        let start = Instant::now();
        let lease = loop {
            if let Some(l) = take() {
                break l;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the team stayed taken"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        // One CPU to run on: nothing is posted (explicitly, not a skipped test).
        if !may_post() {
            let before = POSTS.with(Cell::get);
            assert_eq!(join(|| 1, || 2), (1, 2));
            assert_eq!(POSTS.with(Cell::get), before);
            return;
        }
        let me = std::thread::current().id();
        // The helper takes a half once it is awake (the first post wakes it; a loaded machine
        // may keep it waiting for a core, so this allows seconds).
        let start = Instant::now();
        assert!(lead().is_none(), "this thread leads already");
        let mut elsewhere = 0;
        for i in 0u64.. {
            let (a, (b, id)) = join(|| i * 2, || (i * 3, std::thread::current().id()));
            assert_eq!((a, b), (i * 2, i * 3));
            elsewhere += usize::from(id != me);
            if elsewhere >= 100 || start.elapsed() > Duration::from_secs(20) {
                break;
            }
        }
        assert!(
            elsewhere >= 100,
            "the helper took {elsewhere} halves in 20 s"
        );
        // Nested: in turn, on whichever thread runs the half.
        let (x, y) = join(|| join(|| 1, || 2), || join(|| 3, || 4));
        assert_eq!((x, y), ((1, 2), (3, 4)));
        // Each side's own panic comes back (its payload, whichever thread ran it).
        for side in 0..2 {
            for _ in 0..10 {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    join(
                        || assert!(side != 0, "left"),
                        || assert!(side != 1, "right"),
                    )
                }));
                let p = r.expect_err("the panic came back");
                let message = p
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied());
                assert_eq!(message, Some(["left", "right"][side]));
            }
        }
        // The team still works after the panics.
        assert_eq!(join(|| 5, || 6), (5, 6));
        // Both halves compute under the leader's floating-point controls (flush-to-zero and
        // denormals-are-zero here: bits every x86-64 CPU's MXCSR has), and the helper's own
        // come back after.
        let mine = float_controls();
        #[cfg(target_arch = "x86_64")]
        set_float_controls(mine | 0x8040);
        let ftz = if cfg!(target_arch = "x86_64") {
            0x8040
        } else {
            0
        };
        for _ in 0..100 {
            assert_eq!(
                join(float_controls, float_controls),
                (mine | ftz, mine | ftz)
            );
        }
        set_float_controls(mine);
        let (_, theirs) = join(|| (), || (float_controls(), std::thread::current().id()));
        assert_eq!(theirs.0, mine, "on {:?}", theirs.1);
        drop(lease);
        // Without a lease: rayon's join.
        assert_eq!(join(|| 7, || 8), (7, 8));
    }

    /// Pins this thread to one CPU of its own set.
    #[cfg(target_os = "linux")]
    fn pin_to_one_cpu() {
        // SAFETY: `cpu_set_t` is plain data (all zeros is the empty set); the calls read or
        // write at most the size we pass, and the set given holds one CPU of the thread's own.
        let ok = unsafe {
            let mut mine: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut mine), 0);
            let cpu = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &mine))
                .expect("a CPU to run on");
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            libc::sched_setaffinity(0, size, &one) == 0
        };
        assert!(ok, "sched_setaffinity: {}", std::io::Error::last_os_error());
    }

    /// A thread pinned to one CPU may not post, and so never leads, whatever the process's
    /// cores (read first, on this thread, as `prepare` or a wider thread would); the affinity
    /// is read with one system call and agrees with std's reading (which the cgroup's quota
    /// may lower).
    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_on_one_cpu_never_leads() {
        let wide = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(thread_cpus() >= wide, "{} < {wide}", thread_cpus());
        // The pool and the process's cores as an unpinned thread finds them.
        let (pool, cores) = (rayon::current_num_threads(), process_cores());
        let pinned = std::thread::spawn(|| {
            pin_to_one_cpu();
            (thread_cpus(), may_post(), lead().is_some())
        });
        assert_eq!(pinned.join().expect("the pinned thread"), (1, false, false));
        // Unchanged by the pinned thread.
        assert_eq!(
            (rayon::current_num_threads(), process_cores()),
            (pool, cores)
        );
    }

    /// A pinned thread asking first, in a fresh process (before `prepare` or any wider thread
    /// has read the process's cores), leaves them unread: a thread that may run on every CPU
    /// still may post after it. (Reading the process's cores on the pinned thread first
    /// recorded one core for the whole process.) Run in a child process, where nothing has
    /// read them yet.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_pinned_thread_asking_first_leaves_the_process_wide() {
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "team::tests::pinned_first_then_wide",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .output()
            .expect("the child test runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let wide = std::thread::available_parallelism().map_or(1, |n| n.get());
        // On one CPU neither thread may post (explicitly, not a skipped check).
        let want = format!("pinned=false wide={}", wide >= 2);
        assert!(text.contains(&want), "want {want:?} in {text}");
    }

    /// The child of the test above.
    #[test]
    #[ignore = "run by a_pinned_thread_asking_first_leaves_the_process_wide in a fresh process"]
    #[cfg(target_os = "linux")]
    fn pinned_first_then_wide() {
        assert_eq!(CORES.load(Ordering::Relaxed), 0, "read before this test");
        let pinned = std::thread::spawn(|| {
            pin_to_one_cpu();
            may_post()
        })
        .join()
        .expect("the pinned thread");
        let wide = std::thread::spawn(may_post)
            .join()
            .expect("the wide thread");
        println!("pinned={pinned} wide={wide}");
    }
}
