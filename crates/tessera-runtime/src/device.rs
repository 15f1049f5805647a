//! Host devices: `TESSERA_DEVICES=N` worker threads (default: the number of cores), each owning
//! what runs on it. A launch hands one job to each of its devices and waits for all of them.
//! A kept launch (`Launcher`) is the hot path of a multi-device step: every launch after its
//! first reuses its rendezvous, answer list and per-device slots, and its jobs go to the
//! devices as a shared reference and an index, so a launch allocates nothing
//! (`launch` and its variants make a `Launcher` for one launch).
//!
//! Faults: a device whose program fails or panics gives up on the launch
//! (`SharedCollectives::give_up`), so the others fail at their next wait instead of at their
//! timeout; the launch returns the error of the device that gave up first (the others' errors
//! only say it did). A panic leaves the executable fit for the next launch: the lock around it
//! is taken back from poisoning (an executable holds no state between runs but its scratch
//! arena, which every run rewrites).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use tessera_transport::rendezvous::Rendezvous;
use tessera_transport::{YIELDS_BEFORE_PARKING, show};

use crate::collectives::{SharedCollectives, collective_timeout};
use crate::process::{local_index, try_device_count};

/// What a device thread runs: one position of a kept launch (`Task::run_position`).
trait Task: Send + Sync {
    /// Runs job `k` and answers (a panic of its program answered too).
    fn run_position(&self, k: usize);

    /// Answers job `k` as panicked unless it has answered: `run_position` unwound outside
    /// its program (it never should), and the launch must not wait for an answer that will
    /// not come.
    fn answer_lost(&self, k: usize);
}

/// A job: position `k` of a launch whose state the job shares.
type Job = (Arc<dyn Task>, usize);

/// A device thread's jobs, in order. Its capacity stays between launches, so queueing a job
/// allocates nothing once the queue has held as many as it ever holds at once (one, unless a
/// launch timed out with the device busy).
struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl Queue {
    fn jobs(&self) -> MutexGuard<'_, VecDeque<Job>> {
        // Only pushes and pops under the lock, which leave the queue whole.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, job: Job) {
        self.jobs().push_back(job);
        self.ready.notify_one();
    }

    /// The next job: polled while yielding the core a bounded number of times (steps come
    /// back to back), then waited for parked. No timeout: an idle device waits for work and
    /// holds nothing anybody waits for.
    fn next(&self) -> Job {
        for _ in 0..YIELDS_BEFORE_PARKING {
            if let Some(job) = self.jobs().pop_front() {
                return job;
            }
            std::thread::yield_now();
        }
        let mut jobs = self.jobs();
        loop {
            if let Some(job) = jobs.pop_front() {
                return job;
            }
            jobs = self.ready.wait(jobs).unwrap_or_else(|e| e.into_inner());
        }
    }
}

struct Devices {
    queues: Vec<Arc<Queue>>,
}

/// The device threads, started on first use; an error when `TESSERA_DEVICES` is bad.
fn devices() -> Result<&'static Devices, String> {
    static DEVICES: OnceLock<Result<Devices, String>> = OnceLock::new();
    DEVICES
        .get_or_init(|| {
            let n = try_local_device_count()?;
            let queues = (0..n)
                .map(|d| {
                    let queue = Arc::new(Queue {
                        jobs: Mutex::new(VecDeque::with_capacity(4)),
                        ready: Condvar::new(),
                    });
                    let mine = queue.clone();
                    std::thread::Builder::new()
                        .name(format!("tessera-device-{d}"))
                        .spawn(move || {
                            loop {
                                let (task, k) = mine.next();
                                // A job catches its program's panics (`Shared::run_position`);
                                // this catches the rest, so the thread outlives every job.
                                let run = std::panic::AssertUnwindSafe(|| task.run_position(k));
                                if let Err(payload) = std::panic::catch_unwind(run) {
                                    // Not dropped: a payload whose drop panics would end
                                    // the thread.
                                    std::mem::forget(payload);
                                    task.answer_lost(k);
                                }
                            }
                        })
                        .map_err(|e| format!("could not start device thread {d}: {e}"))?;
                    Ok(queue)
                })
                .collect::<Result<_, String>>()?;
            Ok(Devices { queues })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The number of this process's host devices: `TESSERA_DEVICES`, or the number of cores when
/// it is unset or empty (an empty value counts as unset). Read once per process. Anything but
/// a positive integer is an error that says so. (`try_device_count` is the global count.)
pub fn try_local_device_count() -> Result<usize, String> {
    static COUNT: OnceLock<Result<usize, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            let v = std::env::var_os("TESSERA_DEVICES");
            match v.as_ref().map(|v| v.to_str()) {
                None => parse_device_count(None),
                Some(Some(v)) => parse_device_count(Some(v)),
                Some(None) => Err(format!(
                    "TESSERA_DEVICES={v:?}: expected a positive integer (the number of host \
                     devices), or unset for the number of cores"
                )),
            }
        })
        .clone()
}

/// The number of cores this process may use (`std::thread::available_parallelism`, 1 if it
/// cannot tell), read once per process: std reads the cgroup files on every call (tens of
/// microseconds; 8% of the pmap step's samples when it was read per call). The default device
/// count, the rayon pool's size (`tessera_codegen::prepare`) and the one-thread launch's test
/// all read this.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `try_device_count` for the variable's value `v` (`None`: unset).
pub fn parse_device_count(v: Option<&str>) -> Result<usize, String> {
    let cores = cores();
    match v.map(str::trim) {
        None | Some("") => Ok(cores),
        Some(v) => v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            format!(
                "TESSERA_DEVICES={v:?}: expected a positive integer (the number of host \
                 devices), or unset for the number of cores ({cores})"
            )
        }),
    }
}

/// The number of host devices over all processes (`try_device_count`).
///
/// # Panics
/// When `TESSERA_DEVICES` is set to anything but a positive integer, with the message of
/// `try_device_count`, naming the caller. (`Mesh::new` and `pmap` return that error as `Err`.)
#[track_caller]
pub fn device_count() -> usize {
    match try_device_count() {
        Ok(n) => n,
        Err(e) => panic!("{e}, at {}", std::panic::Location::caller()),
    }
}

/// Why a launch failed.
#[derive(Debug)]
pub enum LaunchError<E> {
    /// The devices or the launch could not be set up (`TESSERA_DEVICES`,
    /// `TESSERA_COLLECTIVE_TIMEOUT`, a device that does not exist).
    Config(String),
    /// Device `device`'s program failed, first: the other devices' errors follow from it.
    Failed { device: usize, error: E },
    /// Device `device` panicked, first.
    Panicked { device: usize, message: String },
    /// Device `device`'s executable was still in use.
    Busy { device: usize },
    /// These devices did not answer within `timeout` of another device's answer.
    NoAnswer {
        devices: Vec<usize>,
        timeout: Duration,
    },
}

impl<E: std::fmt::Display> std::fmt::Display for LaunchError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Config(m) => write!(f, "{m}"),
            LaunchError::Failed { device, error } => write!(f, "device {device}: {error}"),
            LaunchError::Panicked { device, message } => {
                write!(f, "device {device} panicked: {message}")
            }
            LaunchError::Busy { device } => {
                write!(f, "device {device}: its executable is still in use")
            }
            LaunchError::NoAnswer { devices, timeout } => write!(
                f,
                "devices {devices:?} did not finish within {} of the others",
                show(*timeout)
            ),
        }
    }
}

/// How one device's job ended.
enum Answer<E> {
    Done,
    Failed(E),
    Panicked(String),
    Busy,
}

/// The program a kept launch runs on each device: `run(executable, slot, transport,
/// position)`, `slot` being what the caller left for this device and where the run leaves its
/// results (`Launcher::slot`).
pub type SlotFn<X, S, E> =
    dyn Fn(&X, &mut S, &SharedCollectives<'_>, usize) -> Result<(), E> + Send + Sync;

/// The program that `launch` runs on each device: `run(executable, transport, position)`.
pub type DeviceFn<X, T, E> =
    dyn Fn(&X, &SharedCollectives<'_>, usize) -> Result<T, E> + Send + Sync;

/// The program that `Launcher::spanning` runs on each device: `run(executable, slot,
/// transport, position)`, the transport spanning processes.
pub type SpanningFn<X, S, E> =
    dyn Fn(&X, &mut S, &dyn tessera_transport::Collectives, usize) -> Result<(), E> + Send + Sync;

/// What a kept launch's jobs share with its caller. The caller changes it only while no job
/// holds it (`Arc::get_mut`): a launch begins so and, once every job has answered and let go,
/// ends so (`Launcher::launch`).
struct Shared<X, S, E> {
    executables: Arc<Vec<Mutex<X>>>,
    /// Each job's slot (`SlotFn`).
    slots: Vec<Mutex<S>>,
    run: Arc<SlotFn<X, S, E>>,
    rendezvous: Rendezvous,
    /// The device id of every mesh position (for messages).
    ids: Vec<usize>,
    /// Each job's mesh position.
    positions: Vec<usize>,
    /// This launch's number (the rendezvous's slot keys).
    launch: u64,
    /// Each job's answer, and how many there are; `wake` when one comes.
    answers: Mutex<Vec<Option<Answer<E>>>>,
    answered: AtomicUsize,
    wake: Condvar,
}

impl<X, S: Default, E> Shared<X, S, E> {
    /// A state like `self` with nothing of a launch in it (when a job of the last launch still
    /// holds `self`: its device did not answer).
    fn fresh(
        executables: Arc<Vec<Mutex<X>>>,
        run: Arc<SlotFn<X, S, E>>,
        ids: Vec<usize>,
        positions: Vec<usize>,
        timeout: Duration,
    ) -> Self {
        let n = positions.len();
        Shared {
            executables,
            slots: (0..n).map(|_| Mutex::new(S::default())).collect(),
            run,
            rendezvous: Rendezvous::with_timeout(timeout),
            ids,
            positions,
            launch: 0,
            answers: Mutex::new((0..n).map(|_| None).collect()),
            answered: AtomicUsize::new(0),
            wake: Condvar::new(),
        }
    }
}

impl<X, S, E> Shared<X, S, E> {
    fn answers(&self) -> MutexGuard<'_, Vec<Option<Answer<E>>>> {
        // Only whole entries are written under the lock.
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<X: Send, S: Send, E: Send> Task for Shared<X, S, E> {
    /// Job `k`: runs its device's program on its slot, then answers. A panic is caught and
    /// answered; a device that does not finish well gives up on the launch, so the others'
    /// waits fail at once.
    fn run_position(&self, k: usize) {
        let pos = self.positions[k];
        let coll = SharedCollectives::new(&self.rendezvous, self.launch, pos, &self.ids);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let exe = match self.executables[k].try_lock() {
                Ok(exe) => exe,
                // A run that panicked: the executable keeps nothing from it but scratch.
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return Answer::Busy,
            };
            // Nobody else takes a slot's lock while the launch runs (the caller reaches the
            // slots only through `Arc::get_mut`, and each job has its own).
            let mut slot = match self.slots[k].try_lock() {
                Ok(s) => s,
                Err(TryLockError::Poisoned(s)) => s.into_inner(),
                Err(TryLockError::WouldBlock) => return Answer::Busy,
            };
            match (self.run)(&exe, &mut slot, &coll, pos) {
                Ok(()) => Answer::Done,
                Err(e) => Answer::Failed(e),
            }
        }));
        let answer = outcome.unwrap_or_else(|p| {
            Answer::Panicked(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a device panicked".into()),
            )
        });
        if !matches!(answer, Answer::Done) {
            coll.give_up();
        }
        self.answer(k, answer);
    }

    fn answer_lost(&self, k: usize) {
        let lost = || Answer::Panicked("the device's job failed outside its program".into());
        self.answer(k, lost());
    }
}

impl<X, S, E> Shared<X, S, E> {
    /// Job `k`'s answer, unless it has one; wakes the caller.
    fn answer(&self, k: usize, answer: Answer<E>) {
        let mut answers = self.answers();
        if answers[k].is_none() {
            answers[k] = Some(answer);
            self.answered.fetch_add(1, Ordering::Release);
        }
        drop(answers);
        self.wake.notify_all();
    }
}

/// A launch kept for repeated runs of the same executables on the same devices: the state its
/// jobs share (rendezvous, answers, each device's slot) is reused by every launch whose last
/// one ended well, so a launch in steady state allocates nothing. Its jobs go to the device
/// threads as a reference to that state and an index.
pub struct Launcher<X, S, E> {
    /// The global device of every mesh position.
    devices: Vec<usize>,
    /// Each job's device thread.
    threads: Vec<usize>,
    timeout: Duration,
    shared: Arc<Shared<X, S, E>>,
}

/// One launch at a time: two launches whose jobs queue on the devices in different orders
/// would each hold a device the other waits for in a collective (the deadlock XLA's CPU
/// client runs into with many steps in flight). The lock is held until every device of a
/// launch is done. It guards nothing but the order: poisoning is ignored.
static LAUNCH: Mutex<()> = Mutex::new(());

static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(0);

impl<X: Send + 'static, S: Default + Send + 'static, E: Send + 'static> Launcher<X, S, E> {
    /// The launch of mesh positions `positions` (this process's) of a mesh over the global
    /// devices `devices_used` (one per position): job `k` runs `run` on `executables[k]` and
    /// slot `k` on the thread of position `positions[k]`'s device, connected to the others
    /// by a rendezvous whose waits give up after `timeout`.
    pub fn new(
        devices_used: &[usize],
        positions: &[usize],
        executables: Arc<Vec<Mutex<X>>>,
        timeout: Duration,
        run: Arc<SlotFn<X, S, E>>,
    ) -> Result<Self, LaunchError<E>> {
        let d = devices().map_err(LaunchError::Config)?;
        let global = try_device_count().map_err(LaunchError::Config)?;
        if let Some(&bad) = devices_used.iter().find(|&&x| x >= global) {
            return Err(LaunchError::Config(format!(
                "device {bad} does not exist: there are {global} (TESSERA_DEVICES)",
            )));
        }
        let threads: Vec<usize> = positions
            .iter()
            .map(|&p| {
                devices_used
                    .get(p)
                    .and_then(|&dev| local_index(dev))
                    .filter(|&t| t < d.queues.len())
                    .ok_or_else(|| {
                        LaunchError::Config(format!(
                            "mesh position {p} is not a device of this process"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        if executables.len() != positions.len() {
            return Err(LaunchError::Config(format!(
                "{} executables for {} devices",
                executables.len(),
                positions.len()
            )));
        }
        let shared = Shared::fresh(
            executables,
            run,
            devices_used.to_vec(),
            positions.to_vec(),
            timeout,
        );
        Ok(Launcher {
            devices: devices_used.to_vec(),
            threads,
            timeout,
            shared: Arc::new(shared),
        })
    }

    /// The launch of this process's positions of `mesh` over the global devices `devices`
    /// (one per position, row-major): `executables[k]` runs the `k`-th of them
    /// (`process::local_positions`). The collectives are the shared-memory ones inside the
    /// process and, for a step whose group spans processes, one exchange through the
    /// processes' link (`spanning`); with one process, the shared-memory ones alone. The
    /// waits give up after `TESSERA_COLLECTIVE_TIMEOUT`.
    pub fn spanning(
        mesh: &tessera_ir::Mesh,
        devices: &[usize],
        executables: Arc<Vec<Mutex<X>>>,
        run: Arc<SpanningFn<X, S, E>>,
    ) -> Result<Self, LaunchError<E>> {
        let timeout = collective_timeout().map_err(LaunchError::Config)?;
        let positions = crate::process::local_positions(devices);
        let link =
            crate::process::link().filter(|_| crate::process::processes_of(devices).len() > 1);
        let run: Arc<SlotFn<X, S, E>> = match link {
            None => Arc::new(move |x: &X, s: &mut S, c: &SharedCollectives<'_>, p| run(x, s, c, p)),
            Some(link) => {
                let (mesh, all, mine) = (mesh.clone(), devices.to_vec(), positions.clone());
                Arc::new(move |x: &X, s: &mut S, c: &SharedCollectives<'_>, p| {
                    let spanning = crate::spanning::Spanning::new(c, &mesh, &all, &mine, link);
                    run(x, s, &spanning, p)
                })
            }
        };
        Launcher::new(devices, &positions, executables, timeout, run)
    }

    /// How many jobs a launch has (this process's positions).
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The state, to change between launches: a fresh one when a job of the last launch
    /// still holds it (it did not answer in time; it keeps its own state alive while it runs).
    fn exclusive(&mut self) -> &mut Shared<X, S, E> {
        if Arc::get_mut(&mut self.shared).is_none() {
            let s = &self.shared;
            let fresh = Shared::fresh(
                s.executables.clone(),
                s.run.clone(),
                s.ids.clone(),
                s.positions.clone(),
                self.timeout,
            );
            self.shared = Arc::new(fresh);
        }
        match Arc::get_mut(&mut self.shared) {
            Some(s) => s,
            None => unreachable!("a state just made is held by nobody else"),
        }
    }

    /// Job `k`'s slot, between launches: what the next launch's job `k` gets, and what the
    /// last one left (empty, `S::default()`, after a launch some device did not answer).
    ///
    /// # Panics
    /// When `k` is not below `len()`.
    pub fn slot(&mut self, k: usize) -> &mut S {
        self.exclusive().slots[k]
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Runs every job at once and waits for them: `Ok` when every device's run returned `Ok`,
    /// its results in its slot; otherwise the error of the device that gave up first (the
    /// others' errors only say it did).
    ///
    /// The launch waits for its devices as long as they compute (nothing there waits for
    /// another device: every wait of a device times out); once one device has answered, each
    /// other one must answer within the timeout, or the launch fails with `NoAnswer` (memory
    /// stays safe: a job holds the state it uses, which the next launch then does not reuse,
    /// and the next launch's job on that device queues behind it).
    pub fn launch(&mut self) -> Result<(), LaunchError<E>> {
        let d = devices().map_err(LaunchError::Config)?;
        let _launch = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.threads.len();
        {
            let s = self.exclusive();
            s.launch = NEXT_LAUNCH.fetch_add(1, Ordering::Relaxed);
            *s.answered.get_mut() = 0;
            let answers = s.answers.get_mut().unwrap_or_else(|e| e.into_inner());
            answers.iter_mut().for_each(|a| *a = None);
        }
        for (k, &t) in self.threads.iter().enumerate() {
            d.queues[t].push((self.shared.clone(), k));
        }
        let late = self.wait_for_answers(n);
        if late.is_none() {
            // Each job lets go of the state just after answering: wait for that (a few
            // instructions), bounded by the timeout, so the next launch can reuse it.
            let until = Instant::now() + self.timeout;
            let mut turns = 0usize;
            while Arc::strong_count(&self.shared) > 1 && Instant::now() < until {
                turns += 1;
                if turns < YIELDS_BEFORE_PARKING {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        let outcome = self.outcome(n, late.as_deref());
        match Arc::get_mut(&mut self.shared) {
            Some(s) => {
                s.rendezvous.end_launch();
                outcome
            }
            // A job still holds the state, so its results cannot be read (the next `slot`
            // starts a fresh state): not a good launch, whatever the answers say.
            None => outcome.and_then(|()| {
                Err(LaunchError::NoAnswer {
                    devices: (0..n)
                        .map(|k| self.devices[self.shared.positions[k]])
                        .collect(),
                    timeout: self.timeout,
                })
            }),
        }
    }

    /// Waits until all `n` jobs have answered (`None`), or until `timeout` has passed since
    /// the first answer without the rest (the jobs that had not answered then). Polled while
    /// yielding a bounded number of times (short steps), then parked.
    fn wait_for_answers(&self, n: usize) -> Option<Vec<usize>> {
        let s = &self.shared;
        for _ in 0..YIELDS_BEFORE_PARKING {
            if s.answered.load(Ordering::Acquire) == n {
                return None;
            }
            std::thread::yield_now();
        }
        let mut deadline: Option<Instant> = None;
        let mut answers = s.answers();
        loop {
            let got = s.answered.load(Ordering::Acquire);
            if got == n {
                return None;
            }
            if got > 0 && deadline.is_none() {
                deadline = Some(Instant::now() + self.timeout);
            }
            answers = match deadline {
                None => s.wake.wait(answers).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Some((0..n).filter(|&k| answers[k].is_none()).collect());
                    }
                    s.wake
                        .wait_timeout(answers, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// The launch's result from its `n` answers (taken); `late`: the jobs that had not
    /// answered by the deadline (their answers since do not count).
    fn outcome(&self, n: usize, late: Option<&[usize]>) -> Result<(), LaunchError<E>> {
        let s = &self.shared;
        let mut answers = s.answers();
        let device = |k: usize| self.devices[s.positions[k]];
        let failure = |k: usize, a: Answer<E>| match a {
            Answer::Done => None,
            Answer::Failed(error) => Some(LaunchError::Failed {
                device: device(k),
                error,
            }),
            Answer::Panicked(message) => Some(LaunchError::Panicked {
                device: device(k),
                message,
            }),
            Answer::Busy => Some(LaunchError::Busy { device: device(k) }),
        };
        let is_late = |k: usize| late.is_some_and(|l| l.contains(&k));
        let root = s
            .rendezvous
            .first_to_give_up()
            .and_then(|dev| (0..n).find(|&k| device(k) == dev))
            .filter(|&k| !is_late(k));
        if let Some(k) = root
            && let Some(a) = answers[k].take()
            && let Some(e) = failure(k, a)
        {
            return Err(e);
        }
        if late.is_none() && answers.iter().all(|a| matches!(a, Some(Answer::Done))) {
            return Ok(());
        }
        let missing: Vec<usize> = (0..n)
            .filter(|&k| is_late(k) || answers[k].is_none())
            .map(device)
            .collect();
        for k in (0..n).filter(|&k| !is_late(k)) {
            if let Some(e) = answers[k].take().and_then(|a| failure(k, a)) {
                return Err(e);
            }
        }
        Err(LaunchError::NoAnswer {
            devices: missing,
            timeout: self.timeout,
        })
    }
}

/// One launch: runs `run(&executables[p], collectives, p)` on device `devices_used[p]`'s
/// thread for every mesh position `p`, all at once, connected by one rendezvous whose waits
/// give up after `TESSERA_COLLECTIVE_TIMEOUT`; returns the results in order.
pub fn launch<X: Send + 'static, T: Send + 'static, E: Send + 'static>(
    devices_used: &[usize],
    executables: Arc<Vec<Mutex<X>>>,
    run: Arc<DeviceFn<X, T, E>>,
) -> Result<Vec<T>, LaunchError<E>> {
    let timeout = collective_timeout().map_err(LaunchError::Config)?;
    launch_with_timeout(devices_used, executables, timeout, run)
}

/// `launch` with the collective timeout `timeout` (a `Launcher` for one launch: see
/// `Launcher::launch` for how long it waits).
pub fn launch_with_timeout<X: Send + 'static, T: Send + 'static, E: Send + 'static>(
    devices_used: &[usize],
    executables: Arc<Vec<Mutex<X>>>,
    timeout: Duration,
    run: Arc<DeviceFn<X, T, E>>,
) -> Result<Vec<T>, LaunchError<E>> {
    let positions: Vec<usize> = (0..devices_used.len()).collect();
    let mut launcher = Launcher::<X, Option<T>, E>::new(
        devices_used,
        &positions,
        executables,
        timeout,
        Arc::new(
            move |x: &X, slot: &mut Option<T>, c: &SharedCollectives<'_>, p| {
                *slot = Some(run(x, c, p)?);
                Ok(())
            },
        ),
    )?;
    launcher.launch()?;
    (0..positions.len())
        .map(|k| {
            launcher.slot(k).take().ok_or_else(|| {
                LaunchError::Config(format!(
                    "device {} answered without a result",
                    devices_used[k]
                ))
            })
        })
        .collect()
}

/// What a launch on `devices_used` checks before it runs anything, for a caller that runs
/// this process's devices' programs itself (`tessera::spmd`'s one-thread route): the
/// collective timeout (`TESSERA_COLLECTIVE_TIMEOUT`), the device count, and that every device
/// exists. The error is the launch's `LaunchError::Config` message.
pub fn check_launch(devices_used: &[usize]) -> Result<(), String> {
    collective_timeout()?;
    try_local_device_count()?;
    let global = try_device_count()?;
    if let Some(&bad) = devices_used.iter().find(|&&x| x >= global) {
        return Err(format!(
            "device {bad} does not exist: there are {global} (TESSERA_DEVICES)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_device_counts_are_errors_that_say_what_was_expected() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(parse_device_count(None), Ok(cores));
        assert_eq!(parse_device_count(Some("")), Ok(cores));
        assert_eq!(parse_device_count(Some(" 8 ")), Ok(8));
        for bad in ["abc", "0", "-1", "2.5"] {
            let e = parse_device_count(Some(bad)).unwrap_err();
            assert!(
                e.contains(&format!("TESSERA_DEVICES={bad:?}"))
                    && e.contains("expected a positive integer"),
                "{e}"
            );
        }
    }
}
