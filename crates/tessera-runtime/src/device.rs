//! Host devices: `TESSERA_DEVICES=N` worker threads (default: the number of cores), each owning
//! what runs on it. A launch (`launch`) hands one job to each of its devices and waits for all
//! of them.
//!
//! Faults: a device whose program fails or panics gives up on the launch
//! (`SharedCollectives::give_up`), so the others fail at their next wait instead of at their
//! timeout; the launch returns the error of the device that gave up first (the others' errors
//! only say it did). A panic leaves the executable fit for the next launch: the lock around it
//! is taken back from poisoning (an executable holds no state between runs but its scratch
//! arena, which every run rewrites).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use tessera_transport::rendezvous::Rendezvous;
use tessera_transport::{YIELDS_BEFORE_PARKING, show};

use crate::collectives::{SharedCollectives, collective_timeout};
use crate::process::{local_index, try_device_count};

type Job = Box<dyn FnOnce() + Send>;

struct Devices {
    senders: Vec<Mutex<Sender<Job>>>,
}

/// The device threads, started on first use; an error when `TESSERA_DEVICES` is bad.
fn devices() -> Result<&'static Devices, String> {
    static DEVICES: OnceLock<Result<Devices, String>> = OnceLock::new();
    DEVICES
        .get_or_init(|| {
            let n = try_local_device_count()?;
            let senders = (0..n)
                .map(|d| {
                    let (tx, rx) = channel::<Job>();
                    std::thread::Builder::new()
                        .name(format!("tessera-device-{d}"))
                        .spawn(move || {
                            // Between launches: yield a while (steps come back to back), then
                            // park. No timeout here: an idle device waits for work
                            // and holds nothing anybody waits for.
                            while let Some(job) = receive(&rx) {
                                job();
                            }
                        })
                        .map_err(|e| format!("could not start device thread {d}: {e}"))?;
                    Ok(Mutex::new(tx))
                })
                .collect::<Result<_, String>>()?;
            Ok(Devices { senders })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The next message: polled while yielding the core a bounded number of times, then waited for
/// parked. `None` when the sender is gone.
fn receive<T>(rx: &std::sync::mpsc::Receiver<T>) -> Option<T> {
    for _ in 0..YIELDS_BEFORE_PARKING {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
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
enum Answer<T, E> {
    Done(T),
    Failed(E),
    Panicked(String),
    Busy,
}

/// The program that `launch` runs on each device: `run(executable, transport, position)`.
pub type DeviceFn<X, T, E> =
    dyn Fn(&X, &SharedCollectives<'_>, usize) -> Result<T, E> + Send + Sync;

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

/// The program that `launch_spanning` runs on each device: `run(executable, transport,
/// position)`, the transport spanning processes.
pub type SpanningFn<X, T, E> =
    dyn Fn(&X, &dyn tessera_transport::Collectives, usize) -> Result<T, E> + Send + Sync;

/// The launch of this process's positions of `mesh` over the global devices `devices` (one
/// per position, row-major): `executables[k]` runs the `k`-th of them
/// (`process::local_positions`). The collectives are the shared-memory ones inside the
/// process and, for a step whose group spans processes, one exchange through the processes'
/// link (`spanning`); with one process, the shared-memory ones alone. Results in the order of
/// the local positions.
pub fn launch_spanning<X: Send + 'static, T: Send + 'static, E: Send + 'static>(
    mesh: &tessera_ir::Mesh,
    devices: &[usize],
    executables: Arc<Vec<Mutex<X>>>,
    run: Arc<SpanningFn<X, T, E>>,
) -> Result<Vec<T>, LaunchError<E>> {
    let timeout = collective_timeout().map_err(LaunchError::Config)?;
    let positions = crate::process::local_positions(devices);
    let link = crate::process::link().filter(|_| crate::process::processes_of(devices).len() > 1);
    let Some(link) = link else {
        return launch_positions(
            devices,
            &positions,
            executables,
            timeout,
            Arc::new(move |x: &X, c: &SharedCollectives<'_>, p| run(x, c, p)),
        );
    };
    let (mesh, all, mine) = (
        Arc::new(mesh.clone()),
        Arc::new(devices.to_vec()),
        Arc::new(positions.clone()),
    );
    launch_positions(
        devices,
        &positions,
        executables,
        timeout,
        Arc::new(move |x: &X, c: &SharedCollectives<'_>, p| {
            let spanning = crate::spanning::Spanning::new(c, &mesh, &all, &mine, link);
            run(x, &spanning, p)
        }),
    )
}

static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(0);

/// `launch` with the collective timeout `timeout`.
///
/// The launch waits for its devices as long as they compute (nothing there waits for
/// another device: every wait of a device times out); once one device has answered, each
/// other one must answer within `timeout`, or the launch fails with `NoAnswer` (memory stays
/// safe: a job owns what it reads, and the next launch's job on that device queues behind it).
pub fn launch_with_timeout<X: Send + 'static, T: Send + 'static, E: Send + 'static>(
    devices_used: &[usize],
    executables: Arc<Vec<Mutex<X>>>,
    timeout: Duration,
    run: Arc<DeviceFn<X, T, E>>,
) -> Result<Vec<T>, LaunchError<E>> {
    let positions: Vec<usize> = (0..devices_used.len()).collect();
    launch_positions(devices_used, &positions, executables, timeout, run)
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

/// The launch of mesh positions `positions` (this process's) of a mesh over the global
/// devices `devices_used` (one per position): `executables[k]` runs position `positions[k]`
/// on its device's thread; results in the order of `positions`.
pub(crate) fn launch_positions<X: Send + 'static, T: Send + 'static, E: Send + 'static>(
    devices_used: &[usize],
    positions: &[usize],
    executables: Arc<Vec<Mutex<X>>>,
    timeout: Duration,
    run: Arc<DeviceFn<X, T, E>>,
) -> Result<Vec<T>, LaunchError<E>> {
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
                .filter(|&t| t < d.senders.len())
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
    // One launch at a time: two launches whose jobs queue on the devices in different orders
    // would each hold a device the other waits for in a collective (the deadlock XLA's CPU
    // client runs into with many steps in flight). The lock is held until every device of
    // this launch is done. It guards nothing but the order: poisoning is ignored.
    static LAUNCH: Mutex<()> = Mutex::new(());
    let _launch = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    let id = NEXT_LAUNCH.fetch_add(1, Ordering::Relaxed);
    let rendezvous = Arc::new(Rendezvous::with_timeout(timeout));
    let ids: Arc<Vec<usize>> = Arc::new(devices_used.to_vec());
    let (tx, rx) = channel::<(usize, Answer<T, E>)>();
    for (k, (&pos, &thread)) in positions.iter().zip(&threads).enumerate() {
        let dev = devices_used[pos];
        let (run, exes, shared, ids, tx) = (
            run.clone(),
            executables.clone(),
            rendezvous.clone(),
            ids.clone(),
            tx.clone(),
        );
        let job: Job = Box::new(move || {
            let coll = SharedCollectives::new(&shared, id, pos, &ids);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let exe = match exes[k].try_lock() {
                    Ok(exe) => exe,
                    // A run that panicked: the executable keeps nothing from it but scratch.
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return Answer::Busy,
                };
                match run(&exe, &coll, pos) {
                    Ok(v) => Answer::Done(v),
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
            if !matches!(answer, Answer::Done(_)) {
                coll.give_up();
            }
            // The launch's closure and programs let go of before the answer: once the caller
            // has every answer, it holds the only reference to what the closure captured
            // (`DeviceProgram::run` takes its inputs back), and to the rendezvous, which it
            // drops before the next launch may start, giving its buffers back for that one.
            drop((run, exes, shared));
            let _ = tx.send((k, answer));
        });
        let sent = d.senders[thread]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job);
        if sent.is_err() {
            rendezvous.give_up_as(dev);
            return Err(LaunchError::Config(format!(
                "device {dev}'s thread is gone"
            )));
        }
    }
    drop(tx);
    let n = positions.len();
    let mut answers: Vec<Option<Answer<T, E>>> = (0..n).map(|_| None).collect();
    let mut deadline: Option<Instant> = None;
    for _ in 0..n {
        let next = match deadline {
            None => receive(&rx),
            Some(t) => rx
                .recv_timeout(t.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let Some((pos, answer)) = next else { break };
        answers[pos] = Some(answer);
        deadline.get_or_insert_with(|| Instant::now() + timeout);
    }
    let root = rendezvous
        .first_to_give_up()
        .and_then(|dev| positions.iter().position(|&p| devices_used[p] == dev));
    let failure = |k: usize, a: Answer<T, E>| {
        let device = devices_used[positions[k]];
        match a {
            Answer::Done(_) => None,
            Answer::Failed(error) => Some(LaunchError::Failed { device, error }),
            Answer::Panicked(message) => Some(LaunchError::Panicked { device, message }),
            Answer::Busy => Some(LaunchError::Busy { device }),
        }
    };
    if let Some(pos) = root
        && let Some(a) = answers[pos].take()
        && let Some(e) = failure(pos, a)
    {
        return Err(e);
    }
    if answers.iter().any(|a| !matches!(a, Some(Answer::Done(_)))) {
        let missing: Vec<usize> = (0..n)
            .filter(|&k| answers[k].is_none())
            .map(|k| devices_used[positions[k]])
            .collect();
        for (pos, a) in answers.into_iter().enumerate() {
            if let Some(e) = a.and_then(|a| failure(pos, a)) {
                return Err(e);
            }
        }
        return Err(LaunchError::NoAnswer {
            devices: missing,
            timeout,
        });
    }
    Ok(answers
        .into_iter()
        .map(|a| match a {
            Some(Answer::Done(v)) => v,
            _ => unreachable!("every answer is Done (checked above)"),
        })
        .collect())
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
