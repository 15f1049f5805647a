//! Running one per-device program on several devices at once (sharded `jit` and `pmap`): a
//! program per device (`Pipeline::schedule`), launched together on the device threads
//! (`tessera_runtime::launch`), with the shared-memory collectives connecting them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use smallvec::SmallVec;
use tessera_ir::{Literal, Mesh};
use tessera_runtime::{LaunchError, Launcher, local_positions};

use crate::error::{Error, Result};
use crate::pipeline::BackendProgram;

/// A per-device program compiled for this process's devices of a mesh (every device in a
/// one-process run).
pub(crate) struct DeviceProgram {
    pub(crate) mesh: Mesh,
    /// The global device of every mesh position.
    pub(crate) devices: Vec<usize>,
    /// The mesh positions this process runs (`local_positions`), ascending; shared with a
    /// launch's closure (no copy a launch).
    pub(crate) positions: Arc<Vec<usize>>,
    programs: Arc<Vec<Mutex<BackendProgram>>>,
    /// Whether the last run was on the calling thread (`recycle` then gives a buffer to its
    /// program's pool at once; after a launch on the device threads it leaves it in the
    /// device's slot for its next run, as taking a program's lock then could make another
    /// thread's launch find it `Busy`).
    ran_here: AtomicBool,
    /// The launch on the device threads, kept between calls (made at the first), with each
    /// device's slot: a launch allocates nothing.
    launcher: Box<Mutex<Option<Launcher<BackendProgram, Slot, Error>>>>,
    /// The vectors of runs on the calling thread (`run_on_this_thread`), kept between calls.
    together: Box<Mutex<tessera_codegen::together::Together>>,
}

impl DeviceProgram {
    /// `programs[k]` runs the `k`-th of this process's mesh positions (`local_positions`),
    /// on its device.
    pub(crate) fn new(
        programs: Vec<BackendProgram>,
        mesh: Mesh,
        devices: Vec<usize>,
    ) -> DeviceProgram {
        let positions = local_positions(&devices);
        assert_eq!(
            programs.len(),
            positions.len(),
            "one program per local device"
        );
        DeviceProgram {
            mesh,
            devices,
            positions: Arc::new(positions),
            programs: Arc::new(programs.into_iter().map(Mutex::new).collect()),
            ran_here: AtomicBool::new(false),
            launcher: Box::default(),
            together: Box::default(),
        }
    }

    /// Runs the program on this process's devices; `inputs[k]` are the inputs of mesh
    /// position `positions[k]`. Returns their outputs, or the error of the device that failed
    /// first (a timeout, a panic, a bad `TESSERA_COLLECTIVE_TIMEOUT`, another process's
    /// failure); the program stays fit for the next call. `inputs` holds the inputs again
    /// afterwards (for the caller to refill, as `pmap` does), or is empty when the device
    /// threads kept a hold on them. The outputs are written into `out`, one list a device
    /// (their vectors reused when the devices ran on this thread).
    pub(crate) fn run(
        &self,
        inputs: &mut Vec<Vec<Arc<Literal>>>,
        out: &mut Vec<Vec<Option<Literal>>>,
    ) -> Result<()> {
        // One device: no other device to meet, so the program runs on the calling thread, as a
        // one-device jit does (its collectives are over groups of one: `SingleDevice`). The
        // hand-off to a device thread and back cost a third of the seed step.
        // As on a device thread: a program still in use is `Busy` (never a wait), and a
        // panic while it runs is a device failure, not an unwind into the caller.
        if let [ins] = inputs.as_slice() {
            let refs: SmallVec<[&Literal; LOCAL_INPUTS]> = ins.iter().map(|l| l.as_ref()).collect();
            out.truncate(1);
            out.resize_with(1, Vec::new);
            out[0].clear();
            if let Some(run) = self.run_one_into(&refs, &mut out[0]) {
                self.ran_here.store(true, Ordering::Relaxed);
                return run;
            }
        }
        if let Some(ran) = self.run_on_this_thread(inputs, out) {
            self.ran_here.store(true, Ordering::Relaxed);
            return ran;
        }
        self.ran_here.store(false, Ordering::Relaxed);
        // The kept launcher, or one for this call when another thread's call holds it.
        let mut kept = match self.launcher.try_lock() {
            Ok(l) => Some(l),
            Err(TryLockError::Poisoned(l)) => Some(l.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let mut fresh = None;
        let launcher = match kept.as_deref_mut() {
            Some(Some(l)) => l,
            Some(none) => none.insert(self.launcher()?),
            None => fresh.insert(self.launcher()?),
        };
        let n = launcher.len();
        if inputs.len() != n {
            return Err(Error::Device(format!(
                "{} devices' inputs for {n} devices",
                inputs.len()
            )));
        }
        // The vectors change places: each device's inputs into its slot, and back after.
        for (k, ins) in inputs.iter_mut().enumerate() {
            std::mem::swap(&mut launcher.slot(k).inputs, ins);
        }
        let launched = launcher.launch().map_err(launch_error);
        out.truncate(n);
        out.resize_with(n, Vec::new);
        for (k, (ins, outs)) in inputs.iter_mut().zip(out.iter_mut()).enumerate() {
            let slot = launcher.slot(k);
            std::mem::swap(&mut slot.inputs, ins);
            slot.inputs.clear();
            outs.clear();
            std::mem::swap(&mut slot.outputs, outs);
        }
        launched
    }

    /// The launch of this program on its devices' threads: job `k` runs program `k` on slot
    /// `k`'s inputs, giving it slot `k`'s recycled buffers first.
    fn launcher(&self) -> Result<Launcher<BackendProgram, Slot, Error>> {
        let run = |program: &BackendProgram,
                   slot: &mut Slot,
                   coll: &dyn tessera_interp::Collectives,
                   _pos: usize| {
            for data in slot.recycled.drain(..) {
                program.recycle(data);
            }
            let refs: SmallVec<[&Literal; LOCAL_INPUTS]> =
                slot.inputs.iter().map(|l| l.as_ref()).collect();
            slot.outputs.clear();
            program.run_partial_into(&refs, coll, &mut slot.outputs)
        };
        Launcher::spanning(
            &self.mesh,
            &self.devices,
            self.programs.clone(),
            Arc::new(run),
        )
        .map_err(launch_error)
    }

    /// Gives an output's buffer, which no one else holds, to the output pool of the program
    /// of this process's `k`-th device (`Executable::recycle`): its next run writes an output
    /// of that dtype and size there instead of allocating. Dropped while that program runs,
    /// and after a launch on the device threads (`ran_here`).
    pub(crate) fn recycle(&self, k: usize, data: tessera_ir::Data) {
        if self.ran_here.load(Ordering::Relaxed) {
            self.give(k, data);
        } else if let Ok(mut launcher) = self.launcher.try_lock()
            && let Some(launcher) = launcher.as_mut()
            && k < launcher.len()
        {
            let recycled = &mut launcher.slot(k).recycled;
            if recycled.len() < RECYCLED_PER_DEVICE {
                recycled.push(data);
            }
        }
    }

    /// `data` to program `k`'s pool, unless that program is running.
    fn give(&self, k: usize, data: tessera_ir::Data) {
        if let Some(program) = self.programs.get(k)
            && let Ok(p) = program.try_lock()
        {
            p.recycle(data);
        }
    }
}

impl DeviceProgram {
    /// Runs a program on one device (of a one-process mesh) on the calling thread, as a
    /// one-device jit does (its collectives are over groups of one: `SingleDevice`), its
    /// outputs appended to `out`; `None` for a program on several devices. The hand-off to a
    /// device thread and back cost a third of the seed step. As on a device thread: a program
    /// still in use is `Busy` (never a wait), and a panic while it runs is a device failure,
    /// not an unwind into the caller.
    pub(crate) fn run_one_into(
        &self,
        inputs: &[&Literal],
        out: &mut Vec<Option<Literal>>,
    ) -> Option<Result<()>> {
        let ([program], [device]) = (self.programs.as_slice(), self.devices.as_slice()) else {
            return None;
        };
        let device = *device;
        let program = match program.try_lock() {
            Ok(p) => p,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Some(Err(launch_error(LaunchError::Busy { device })));
            }
        };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            program.run_partial_into(inputs, &tessera_interp::SingleDevice, out)
        }));
        Some(match run {
            Ok(done) => done,
            Err(payload) => {
                out.clear();
                let message = tessera_codegen::together::panic_message(payload.as_ref());
                Err(launch_error(LaunchError::Panicked { device, message }))
            }
        })
    }
}

impl DeviceProgram {
    /// Gives a given-up input's buffer to a one-device program's output pool (`recycle`);
    /// dropped on several devices, or while the program runs elsewhere.
    pub(crate) fn recycle_one(&self, data: tessera_ir::Data) {
        // One device always runs on the calling thread (`run_one_into`).
        if self.programs.len() == 1 {
            self.give(0, data);
        }
    }
}

/// Below this many multiply-adds of GEMM per device, not counting the shared products (done
/// once for all devices on every core either way), a program on more devices than cores runs
/// on the calling thread (`run_on_this_thread`): its step is launch and meeting costs, which
/// threads on shared cores multiply. Above it the device threads' own arithmetic on every
/// core pays for their switches. (The big MLP over 8 devices: 51 M a device, all but 2 M of
/// it in shared products.)
const ON_ONE_THREAD_BELOW: usize = 1 << 22;

/// How many given-back buffers a device's slot holds for its next run at most (`recycle`).
const RECYCLED_PER_DEVICE: usize = 64;

/// What a launch's job `k` finds in its slot, and leaves there (`Launcher::slot`); the
/// vectors are kept between calls.
#[derive(Default)]
pub(crate) struct Slot {
    /// The device's inputs, this call.
    inputs: Vec<Arc<Literal>>,
    /// Its outputs, after the run.
    outputs: Vec<Option<Literal>>,
    /// Buffers given back since its last run (`recycle`), for its program's output pool.
    recycled: Vec<tessera_ir::Data>,
}

/// How many devices' programs a run on one thread holds without allocating (`run_on_this_thread`).
const LOCAL_DEVICES: usize = 16;

/// How many inputs a device's run lists without allocating (`run`).
const LOCAL_INPUTS: usize = 16;

/// Whether `devices` devices' programs (`all_local`: every one in this process) run cheaper in
/// turn on one thread than on a thread each: when there are more of them than `cores`.
fn one_thread_pays(devices: usize, cores: usize, all_local: bool) -> bool {
    all_local && devices > cores
}

impl DeviceProgram {
    /// Runs every device's program in turn on the calling thread, pausing each at its
    /// collectives (`tessera_codegen::together`), when that is the cheaper way: all devices
    /// are this process's, there are more of them than cores, the programs are native, do
    /// little arithmetic outside their shared products (`ON_ONE_THREAD_BELOW`) and meet only
    /// outside region bodies. `None`: launch them on the
    /// device threads instead. The results are the threaded launch's bits.
    fn run_on_this_thread(
        &self,
        inputs: &[Vec<Arc<Literal>>],
        out: &mut Vec<Vec<Option<Literal>>>,
    ) -> Option<Result<()>> {
        let n = self.programs.len();
        let cores = tessera_runtime::cores();
        if !one_thread_pays(n, cores, self.positions.len() == self.devices.len()) {
            return None;
        }
        // What a launch checks first (a bad `TESSERA_COLLECTIVE_TIMEOUT` is an error here too).
        if let Err(message) = tessera_runtime::check_launch(&self.devices) {
            return Some(Err(launch_error(LaunchError::Config(message))));
        }
        // On the stack up to `LOCAL_DEVICES` devices: a step allocates nothing for them.
        let mut guards: SmallVec<[_; LOCAL_DEVICES]> = SmallVec::with_capacity(n);
        for (k, program) in self.programs.iter().enumerate() {
            match program.try_lock() {
                Ok(p) => guards.push(p),
                Err(TryLockError::Poisoned(p)) => guards.push(p.into_inner()),
                Err(TryLockError::WouldBlock) => {
                    let device = self.devices[self.positions[k]];
                    return Some(Err(launch_error(LaunchError::Busy { device })));
                }
            }
        }
        let mut exes: SmallVec<[_; LOCAL_DEVICES]> = SmallVec::with_capacity(n);
        for g in &mut guards {
            match &mut **g {
                BackendProgram::Native(e)
                    if e.pauses_at_collectives()
                        && e.unshared_multiply_adds() < ON_ONE_THREAD_BELOW =>
                {
                    exes.push(&mut **e)
                }
                _ => return None,
            }
        }
        // As on the device threads, a panic is a device failure (`run_together_in` catches
        // it and drops every run), not an unwind into the caller.
        use tessera_codegen::together::{Failed, Together, run_together_in};
        let device = |k: usize| self.devices[self.positions[k]];
        // The kept vectors (held by no one else: every program's lock is held here; a
        // panic inside `run_together_in` is caught after it empties them, so a poisoned lock
        // holds plain capacity).
        let mut fresh = Together::default();
        let mut kept = match self.together.try_lock() {
            Ok(t) => Some(t),
            Err(TryLockError::Poisoned(t)) => Some(t.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let kept: &mut Together = kept.as_deref_mut().unwrap_or(&mut fresh);
        Some(
            match run_together_in(&mut exes, inputs, &self.positions, kept, out) {
                Ok(()) => Ok(()),
                Err(Failed::Error { error, .. }) => Err(error.into()),
                Err(Failed::Panicked { device: k, message }) => {
                    Err(launch_error(LaunchError::Panicked {
                        device: device(k),
                        message,
                    }))
                }
            },
        )
    }
}

/// A failed launch as the user's error: the failing device's own error, a configuration
/// error, or a device failure (a panic, a busy or silent device).
fn launch_error(e: LaunchError<Error>) -> Error {
    match e {
        LaunchError::Failed { error, .. } => error,
        LaunchError::Config(message) => Error::Config(message),
        other @ (LaunchError::Panicked { .. }
        | LaunchError::Busy { .. }
        | LaunchError::NoAnswer { .. }) => Error::Device(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_local_devices_than_cores_run_on_one_thread() {
        assert!(one_thread_pays(8, 2, true));
        assert!(!one_thread_pays(2, 2, true), "a core each");
        assert!(!one_thread_pays(8, 2, false), "devices in other processes");
    }

    #[test]
    fn launch_failures_get_their_own_error_variants() {
        let config = launch_error(LaunchError::Config("TESSERA_DEVICES=\"x\"".into()));
        assert_eq!(config, Error::Config("TESSERA_DEVICES=\"x\"".into()));
        let panicked = launch_error(LaunchError::Panicked {
            device: 3,
            message: "boom".into(),
        });
        assert_eq!(panicked, Error::Device("device 3 panicked: boom".into()));
        assert_eq!(panicked.to_string(), "device: device 3 panicked: boom");
        let silent = launch_error(LaunchError::NoAnswer {
            devices: vec![1],
            timeout: std::time::Duration::from_secs(2),
        });
        assert!(
            matches!(&silent, Error::Device(m) if m.contains("[1]")),
            "{silent:?}"
        );
        let own = Error::Check("x".into());
        assert_eq!(
            launch_error(LaunchError::Failed {
                device: 0,
                error: own.clone()
            }),
            own
        );
    }
}
