//! The MPI link between Tessera processes (`tessera::distributed`, feature `mpi`): rank and
//! size from `mpirun`, and the one primitive the spanning collectives need
//! (`tessera_transport::process::ProcessLink::all_gather`) as a non-blocking
//! `MPI_Iallgather` polled against a deadline, so no wait is without a timeout.
//!
//! - MPI is initialized with `MPI_THREAD_SERIALIZED`: any device thread may make the call (the
//!   elected one of its process's meeting), never two at once (`CALLS`, a lock around every
//!   MPI call).
//! - The link's communicator (a duplicate of the world's) returns errors
//!   (`MPI_ERRORS_RETURN`) instead of aborting; an error or a deadline passed leaves the
//!   processes out of step, so the link refuses every later call, and the process aborts the
//!   job at exit instead of finalizing.
//! - Every exchange is two: a fixed-size header (the exchange's number and the block's
//!   length), then the blocks, so processes at different exchanges get an error naming both
//!   and never hand MPI blocks of different lengths.
//! - Over all processes one `MPI_Iallgather`; over a subset (a mesh that leaves processes
//!   out), point-to-point messages between its members, which the others never see.
//! - `MPI_Finalize` runs at process exit (`atexit`): Open MPI reports a process that exits
//!   without it as failed.
//!
//! Architecture invariant: the only crate that calls MPI; it sees bytes, never values.

use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use tessera_transport::process::ProcessLink;

/// Whether this process was started by `mpirun` (Open MPI's, or another launcher's PMI).
pub fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The lock every MPI call is made under (`MPI_THREAD_SERIALIZED`), and what it guards: the
/// universe (finalized at exit) and the communicator the link uses.
struct State {
    universe: Option<Universe>,
    /// A duplicate of the world communicator: the link's exchanges never meet a user's own
    /// MPI traffic.
    comm: Option<SimpleCommunicator>,
}

// SAFETY: MPI handles are process-wide (Open MPI's are pointers into its own tables) and MPI
// was initialized with `MPI_THREAD_SERIALIZED`, which allows calls from any thread as long as
// no two run at once: every use of these handles is under `CALLS`'s lock.
unsafe impl Send for State {}

static CALLS: Mutex<State> = Mutex::new(State {
    universe: None,
    comm: None,
});

/// Set when an exchange failed after MPI started it: the processes are out of step.
static BROKEN: AtomicBool = AtomicBool::new(false);

fn lock() -> std::sync::MutexGuard<'static, State> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link through MPI (a duplicate of the world communicator).
pub struct MpiLink {
    index: usize,
    count: usize,
    /// How many exchanges this process has made: every block's header carries it, so
    /// processes at different exchanges are found out.
    exchanges: AtomicU64,
}

/// At exit: `MPI_Finalize` (Open MPI reports a process that exits without it as failed), or,
/// when an exchange failed and requests may still be pending, `MPI_Abort`, which ends the
/// whole job instead of waiting in finalize for processes that are out of step. When another
/// thread holds the lock (it is in an exchange, which ends by its deadline), nothing: the
/// process exits without waiting for it.
extern "C" fn finalize() {
    let Ok(mut state) = CALLS.try_lock() else {
        return;
    };
    if BROKEN.load(Ordering::SeqCst) {
        if let Some(comm) = &state.comm {
            // The abort's own deadline: should Open MPI's abort not end this process (a CI run
            // once sat in a failed job's teardown until its 180 s deadline, maybe here, maybe
            // in `mpirun`: not found), a watchdog thread ends it, and `mpirun` ends the job as
            // for a killed process. (Not covered: a process that finalizes, or that another
            // thread's exchange keeps from both, above.)
            std::thread::spawn(|| {
                std::thread::sleep(ABORT_WITHIN);
                // SAFETY: `_exit` ends the process at once, running no handler.
                unsafe { _exit(1) }
            });
            // SAFETY: a valid communicator; MPI_Abort ends every process of the job.
            unsafe { ffi::MPI_Abort(comm.as_raw(), 1) };
        }
        return;
    }
    state.comm = None;
    // Dropping the universe calls `MPI_Finalize`.
    state.universe = None;
}

/// How long a process that aborts the job waits for `MPI_Abort` to end it.
const ABORT_WITHIN: Duration = Duration::from_secs(10);

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
    fn _exit(status: c_int) -> !;
}

/// Initializes MPI and returns the link to the other processes, after checking that every
/// process has `local_devices` devices (every process gets the error when they differ).
/// Fails when MPI was initialized before or does not offer `MPI_THREAD_SERIALIZED`. The check
/// between processes is bounded by `timeout`; `MPI_Init_thread` and `MPI_Comm_dup` before it
/// are not (MPI offers no deadline for them; a launcher that cannot start a process fails
/// them itself).
pub fn initialize(local_devices: usize, timeout: Duration) -> Result<MpiLink, String> {
    let link = {
        let mut state = lock();
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or("MPI was already initialized in this process")?;
        if provided < Threading::Serialized {
            return Err(format!(
                "this MPI offers threads at level {provided:?}; Tessera needs Serialized"
            ));
        }
        let world = universe.world();
        // SAFETY: `world` is a valid communicator and the handler a predefined one.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(world.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
        check(rc, "MPI_Comm_set_errhandler")?;
        // The duplicate inherits the error handler.
        let comm = world.duplicate();
        let link = MpiLink {
            index: world.rank() as usize,
            count: world.size() as usize,
            exchanges: AtomicU64::new(0),
        };
        state.universe = Some(universe);
        state.comm = Some(comm);
        // SAFETY: `finalize` is an `extern "C" fn()` that lives as long as the program.
        if unsafe { atexit(finalize) } != 0 {
            return Err("could not register MPI_Finalize to run at exit".into());
        }
        link
    };
    let all: Vec<usize> = (0..link.count).collect();
    let counts = link.all_gather(&all, (local_devices as u64).to_le_bytes().to_vec(), timeout)?;
    let counts: Vec<u64> = counts
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if counts.iter().any(|&c| c != local_devices as u64) {
        return Err(format!(
            "every process needs the same number of devices (TESSERA_DEVICES); by process: \
             {counts:?}"
        ));
    }
    Ok(link)
}

/// An MPI error code as an error naming the call.
fn check(rc: c_int, call: &str) -> Result<(), String> {
    if rc == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for `MPI_MAX_ERROR_STRING` characters, as the call requires.
    unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut _, &mut len) };
    buf.truncate(len.clamp(0, buf.len() as c_int) as usize);
    Err(format!("{call}: {}", String::from_utf8_lossy(&buf)))
}

/// The tag of the link's point-to-point messages (on its own communicator).
const TAG: c_int = 0x7e55;

/// The first word of every header.
const MAGIC: u64 = 0x7465_7373_6572_614c;

/// Why an exchange failed: before MPI started anything (the link stays usable), or after.
enum Failure {
    Early(String),
    Broken(String),
}

impl MpiLink {
    /// Every member's `send` (all of one length), in the order of `processes`: one
    /// `MPI_Iallgather` over all processes, or point-to-point messages between a subset
    /// (`MPI_Isend`/`MPI_Irecv` to and from every other member); polled with `MPI_Test` until
    /// `deadline`.
    fn raw_gather(
        &self,
        comm: ffi::MPI_Comm,
        processes: &[usize],
        send: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, String> {
        let len = c_int::try_from(send.len())
            .map_err(|_| format!("a block of {} bytes is too large for MPI", send.len()))?;
        let n = send.len();
        let mut recv = vec![0u8; n * processes.len()];
        let mut requests: Vec<ffi::MPI_Request> = Vec::new();
        let started = |rc: c_int,
                       call: &str,
                       requests: &mut Vec<ffi::MPI_Request>,
                       request: ffi::MPI_Request| {
            check(rc, call)?;
            requests.push(request);
            Ok::<(), String>(())
        };
        let mut fail: Option<String> = None;
        if processes.len() == self.count {
            // SAFETY: a zeroed handle, written by `MPI_Iallgather`.
            let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
            // SAFETY: `send` holds `len` bytes and `recv` `len` per process of `comm`; both
            // stay allocated until the request completes (or forever: see below).
            let rc = unsafe {
                ffi::MPI_Iallgather(
                    send.as_ptr() as *const _,
                    len,
                    ffi::RSMPI_UINT8_T,
                    recv.as_mut_ptr() as *mut _,
                    len,
                    ffi::RSMPI_UINT8_T,
                    comm,
                    &mut request,
                )
            };
            if let Err(e) = started(rc, "MPI_Iallgather", &mut requests, request) {
                fail = Some(e);
            }
        } else {
            for (k, &q) in processes.iter().enumerate() {
                let block = &mut recv[k * n..(k + 1) * n];
                if q == self.index {
                    block.copy_from_slice(&send);
                    continue;
                }
                // SAFETY: zeroed handles, written by the calls below.
                let (mut r, mut s): (ffi::MPI_Request, ffi::MPI_Request) =
                    unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
                // SAFETY: `block` is `len` bytes of `recv` and `send` holds `len` bytes; both
                // stay allocated until the requests complete (or forever: see below).
                let rc = unsafe {
                    ffi::MPI_Irecv(
                        block.as_mut_ptr() as *mut _,
                        len,
                        ffi::RSMPI_UINT8_T,
                        q as c_int,
                        TAG,
                        comm,
                        &mut r,
                    )
                };
                if let Err(e) = started(rc, "MPI_Irecv", &mut requests, r) {
                    fail = Some(e);
                    break;
                }
                // SAFETY: as above.
                let rc = unsafe {
                    ffi::MPI_Isend(
                        send.as_ptr() as *const _,
                        len,
                        ffi::RSMPI_UINT8_T,
                        q as c_int,
                        TAG,
                        comm,
                        &mut s,
                    )
                };
                if let Err(e) = started(rc, "MPI_Isend", &mut requests, s) {
                    fail = Some(e);
                    break;
                }
            }
        }
        loop {
            if fail.is_none() {
                let mut done: c_int = 0;
                // SAFETY: `requests` holds the live requests started above (a completed one
                // becomes MPI_REQUEST_NULL, which MPI_Testall accepts).
                let rc = unsafe {
                    ffi::MPI_Testall(
                        requests.len() as c_int,
                        requests.as_mut_ptr(),
                        &mut done,
                        ffi::RSMPI_STATUSES_IGNORE,
                    )
                };
                match check(rc, "MPI_Testall") {
                    Err(e) => fail = Some(e),
                    Ok(()) if done != 0 => return Ok(recv),
                    Ok(()) if Instant::now() >= deadline => {
                        fail = Some(format!(
                            "processes {processes:?} did not all answer in time (a process \
                             died, failed, or runs another program)"
                        ))
                    }
                    Ok(()) => {}
                }
            }
            if let Some(e) = fail {
                // MPI cannot cancel a collective, and the requests may still write `recv` and
                // read `send`: all three are leaked rather than freed under MPI.
                std::mem::forget(send);
                std::mem::forget(recv);
                std::mem::forget(requests);
                return Err(e);
            }
            // Open MPI moves a large message along only inside its calls (`MPI_Testall`
            // here): sleeping between tests measured 8-20x slower on 7 MB. The process's
            // other device threads are parked at the meeting, so the core is this thread's.
            std::thread::yield_now();
        }
    }

    fn gather(
        &self,
        state: &mut State,
        processes: &[usize],
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, Failure> {
        let comm = state
            .comm
            .as_ref()
            .ok_or_else(|| Failure::Early("MPI was finalized".into()))?
            .as_raw();
        if !processes.contains(&self.index) {
            return Err(Failure::Early(format!(
                "process {} is not among {processes:?}",
                self.index
            )));
        }
        if processes.windows(2).any(|w| w[0] >= w[1]) || processes.iter().any(|&q| q >= self.count)
        {
            return Err(Failure::Early(format!(
                "{processes:?} are not ascending processes of {}",
                self.count
            )));
        }
        let now = Instant::now();
        // A deadline past what `Instant` holds is a year away: still a deadline.
        let deadline = now
            .checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(365 * 86_400));
        // Phase 1: a fixed-size header (the exchange's number and the block's length), so
        // processes at different exchanges never hand MPI blocks of different lengths.
        let number = self.exchanges.fetch_add(1, Ordering::SeqCst);
        let header: Vec<u8> = [MAGIC, number, mine.len() as u64]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let headers = self
            .raw_gather(comm, processes, header.clone(), deadline)
            .map_err(Failure::Broken)?;
        if let Some((k, theirs)) = headers
            .chunks(header.len())
            .enumerate()
            .find(|(_, h)| *h != header.as_slice())
        {
            let words: Vec<u64> = theirs
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            return Err(Failure::Broken(format!(
                "process {} is at exchange {} with {} bytes where process {} is at exchange \
                 {number} with {} (the processes make their distributed calls in different \
                 orders)",
                processes[k],
                words.get(1).copied().unwrap_or(0),
                words.get(2).copied().unwrap_or(0),
                self.index,
                mine.len()
            )));
        }
        self.raw_gather(comm, processes, mine, deadline)
            .map_err(Failure::Broken)
    }
}

impl ProcessLink for MpiLink {
    fn index(&self) -> usize {
        self.index
    }

    fn count(&self) -> usize {
        self.count
    }

    fn all_gather(
        &self,
        processes: &[usize],
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let mut state = lock();
        if BROKEN.load(Ordering::SeqCst) {
            return Err(
                "an earlier exchange between processes failed, so they are out of step".into(),
            );
        }
        match self.gather(&mut state, processes, mine, timeout) {
            Ok(v) => Ok(v),
            Err(Failure::Early(e)) => Err(e),
            Err(Failure::Broken(e)) => {
                BROKEN.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }
}
