//! The MPI link between Tessera processes (`tessera::distributed`, feature `mpi`): rank and
//! size from `mpirun`, and the one primitive the spanning collectives need
//! (`tessera_transport::process::ProcessLink::all_gather`) as a non-blocking
//! `MPI_Iallgather` polled against a deadline, so no wait is without a timeout.
//!
//! - MPI is initialized with `MPI_THREAD_SERIALIZED`: any device thread may make the call (the
//!   elected one of its process's meeting), never two at once (`CALLS`, a lock around every
//!   MPI call).
//! - The communicators return errors (`MPI_ERRORS_RETURN`) instead of aborting; an error or a
//!   deadline passed leaves the processes out of step, so the link refuses every later call.
//! - `MPI_Finalize` runs at process exit (`atexit`): Open MPI reports a process that exits
//!   without it as failed.
//!
//! Architecture invariant: the only crate that calls MPI; it sees bytes, never values.

use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, Group, SimpleCommunicator};
use tessera_transport::process::ProcessLink;

/// Whether this process was started by `mpirun` (Open MPI's, or another launcher's PMI).
pub fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The lock every MPI call is made under (`MPI_THREAD_SERIALIZED`), and what it guards: the
/// universe (finalized at exit) and the communicators of process subsets.
struct State {
    universe: Option<Universe>,
    world: Option<SimpleCommunicator>,
    subsets: Vec<(Vec<usize>, SimpleCommunicator)>,
}

// SAFETY: MPI handles are process-wide (Open MPI's are pointers into its own tables) and MPI
// was initialized with `MPI_THREAD_SERIALIZED`, which allows calls from any thread as long as
// no two run at once: every use of these handles is under `CALLS`'s lock.
unsafe impl Send for State {}

static CALLS: Mutex<State> = Mutex::new(State {
    universe: None,
    world: None,
    subsets: Vec::new(),
});

fn lock() -> std::sync::MutexGuard<'static, State> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link through MPI's world communicator.
pub struct MpiLink {
    index: usize,
    count: usize,
    /// A call failed or timed out: the processes are out of step.
    broken: AtomicBool,
}

extern "C" fn finalize() {
    let mut state = lock();
    state.subsets.clear();
    state.world = None;
    // Dropping the universe calls `MPI_Finalize`.
    state.universe = None;
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

/// Initializes MPI and returns the link to the other processes, after checking that every
/// process has `local_devices` devices. Fails when MPI was initialized before, does not offer
/// `MPI_THREAD_SERIALIZED`, or the processes disagree on their device counts (every process
/// gets the error), or they do not all answer within `timeout`.
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
        let link = MpiLink {
            index: world.rank() as usize,
            count: world.size() as usize,
            broken: AtomicBool::new(false),
        };
        state.universe = Some(universe);
        state.world = Some(world);
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

impl MpiLink {
    fn gather(
        &self,
        state: &mut State,
        processes: &[usize],
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let world = state.world.as_ref().ok_or("MPI was finalized")?;
        if !processes.contains(&self.index) {
            return Err(format!("process {} is not among {processes:?}", self.index));
        }
        let len = c_int::try_from(mine.len())
            .map_err(|_| format!("a block of {} bytes is too large for MPI", mine.len()))?;
        let comm = if processes.len() == self.count {
            world.as_raw()
        } else {
            if !state.subsets.iter().any(|(p, _)| p == processes) {
                let ranks: Vec<i32> = processes.iter().map(|&p| p as i32).collect();
                let group = world.group().include(&ranks);
                let sub = world
                    .split_by_subgroup(&group)
                    .ok_or("MPI_Comm_create_group gave no communicator")?;
                state.subsets.push((processes.to_vec(), sub));
            }
            state
                .subsets
                .iter()
                .find(|(p, _)| p == processes)
                .map(|(_, c)| c.as_raw())
                .expect("inserted above")
        };
        let send = mine;
        let mut recv = vec![0u8; send.len() * processes.len()];
        // SAFETY: a null request handle, written by `MPI_Iallgather`.
        let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: `send` holds `len` bytes and `recv` `len` per process of `comm`; both stay
        // allocated until the request completes (or forever: see the deadline below).
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
        check(rc, "MPI_Iallgather")?;
        let deadline = Instant::now() + timeout;
        loop {
            let mut done: c_int = 0;
            // SAFETY: `request` is the live request started above.
            let rc = unsafe { ffi::MPI_Test(&mut request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if let Err(e) = check(rc, "MPI_Test") {
                // The request may still use the buffers: they are never freed.
                std::mem::forget(send);
                std::mem::forget(recv);
                return Err(e);
            }
            if done != 0 {
                return Ok(recv);
            }
            if Instant::now() >= deadline {
                // MPI cannot cancel a collective: the request may still write `recv` and read
                // `send`, so both are leaked rather than freed under it.
                std::mem::forget(send);
                std::mem::forget(recv);
                return Err(format!(
                    "processes {processes:?} did not all answer within {} (a process died, \
                     failed, or runs another program)",
                    tessera_transport::show(timeout)
                ));
            }
            // Open MPI moves a large message along only inside its calls (`MPI_Test` here):
            // sleeping between tests measured 8-20x slower on 7 MB. The process's other
            // device threads are parked at the meeting, so the core is this thread's.
            std::thread::yield_now();
        }
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
        if self.broken.load(Ordering::SeqCst) {
            return Err(
                "an earlier exchange between processes failed, so they are out of step".into(),
            );
        }
        let r = self.gather(&mut state, processes, mine, timeout);
        if r.is_err() {
            self.broken.store(true, Ordering::SeqCst);
        }
        r
    }
}
