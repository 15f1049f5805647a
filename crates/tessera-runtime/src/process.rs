//! The processes of a run: one by default; several under `mpirun` once a link joins them
//! (`join`, called by `tessera::distributed::initialize`).
//!
//! Devices are global: every process contributes the same number of local devices
//! (`TESSERA_DEVICES`), and global device `d` is local device `d % local` of process
//! `d / local`, the order of JAX's `jax.devices()` (by process, then local device). A mesh
//! names global devices; each process runs only the positions whose devices are its own
//! (`local_positions`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_transport::process::ProcessLink;

use crate::device::try_local_device_count;

struct World {
    link: Box<dyn ProcessLink>,
}

static WORLD: OnceLock<World> = OnceLock::new();

/// Set once a device count was read: the devices of a one-process run are then in use, and a
/// link may no longer join.
static COUNTED: AtomicBool = AtomicBool::new(false);

/// Joins this process to the others through `link`. Fails when a link already joined, or when
/// devices were already counted (a `Mesh`, `device_count()` or a launch) as a one-process
/// run's: they would name other devices than the global list.
pub fn join(link: Box<dyn ProcessLink>) -> Result<(), String> {
    if COUNTED.load(Ordering::SeqCst) {
        return Err(
            "the devices were already counted for a one-process run (a Mesh, \
             device_count() or a launch came first): call it before any of them"
                .into(),
        );
    }
    let mut link = Some(link);
    WORLD.get_or_init(|| World {
        link: link.take().expect("taken once"),
    });
    match link {
        None => Ok(()),
        Some(_) => Err("the processes were already joined (called twice)".into()),
    }
}

/// Whether a link joined this process to others (`join`).
pub fn joined() -> bool {
    WORLD.get().is_some()
}

/// The link to the other processes (`None` in a one-process run).
pub fn link() -> Option<&'static dyn ProcessLink> {
    WORLD.get().map(|w| w.link.as_ref())
}

/// This process's index (0 in a one-process run).
pub fn process_index() -> usize {
    link().map_or(0, |l| l.index())
}

/// The number of processes (1 in a one-process run).
pub fn process_count() -> usize {
    link().map_or(1, |l| l.count())
}

/// The number of devices over all processes: each process's `TESSERA_DEVICES` (the same on
/// every process, checked when they join) times the number of processes.
pub fn try_device_count() -> Result<usize, String> {
    COUNTED.store(true, Ordering::SeqCst);
    Ok(try_local_device_count()? * process_count())
}

/// The process that runs global device `device`.
pub fn process_of(device: usize) -> usize {
    device / try_local_device_count().unwrap_or(1).max(1)
}

/// The local index (its thread) of global device `device`, when it is this process's.
pub fn local_index(device: usize) -> Option<usize> {
    let local = try_local_device_count().ok()?;
    (process_of(device) == process_index()).then(|| device % local)
}

/// The mesh positions (indices into `devices`, a mesh's global device per position) whose
/// devices are this process's, ascending: every position in a one-process run.
pub fn local_positions(devices: &[usize]) -> Vec<usize> {
    (0..devices.len())
        .filter(|&p| local_index(devices[p]).is_some())
        .collect()
}

/// The processes that hold positions of a mesh over `devices`, ascending.
pub fn processes_of(devices: &[usize]) -> Vec<usize> {
    let mut ps: Vec<usize> = devices.iter().map(|&d| process_of(d)).collect();
    ps.sort_unstable();
    ps.dedup();
    ps
}
