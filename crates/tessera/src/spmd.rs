//! Running one per-device program on several devices at once (sharded `jit` and `pmap`): a
//! program per device (`Pipeline::schedule`), launched together on the device threads
//! (`tessera_runtime::launch`), with the shared-memory collectives connecting them.

use std::sync::{Arc, Mutex, TryLockError};

use tessera_ir::{Literal, Mesh};
use tessera_runtime::{LaunchError, launch_spanning, local_positions};

use crate::error::{Error, Result};
use crate::pipeline::BackendProgram;

/// A per-device program compiled for this process's devices of a mesh (every device in a
/// one-process run).
pub(crate) struct DeviceProgram {
    pub(crate) mesh: Mesh,
    /// The global device of every mesh position.
    pub(crate) devices: Vec<usize>,
    /// The mesh positions this process runs (`local_positions`), ascending.
    pub(crate) positions: Vec<usize>,
    programs: Arc<Vec<Mutex<BackendProgram>>>,
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
            positions,
            programs: Arc::new(programs.into_iter().map(Mutex::new).collect()),
        }
    }

    /// Runs the program on this process's devices; `inputs[k]` are the inputs of mesh
    /// position `positions[k]`. Returns their outputs, or the error of the device that failed
    /// first (a timeout, a panic, a bad `TESSERA_COLLECTIVE_TIMEOUT`, another process's
    /// failure); the program stays fit for the next call.
    pub(crate) fn run(&self, inputs: Vec<Vec<Arc<Literal>>>) -> Result<Vec<Vec<Option<Literal>>>> {
        // One device: no other device to meet, so the program runs on the calling thread, as a
        // one-device jit does (its collectives are over groups of one: `SingleDevice`). The
        // hand-off to a device thread and back cost a third of the seed step.
        // As on a device thread: a program still in use is `Busy` (never a wait), and a
        // panic while it runs is a device failure, not an unwind into the caller.
        if let ([program], [ins], [_]) = (
            self.programs.as_slice(),
            inputs.as_slice(),
            self.devices.as_slice(),
        ) {
            let device = self.devices[0];
            let program = match program.try_lock() {
                Ok(p) => p,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    return Err(launch_error(LaunchError::Busy { device }));
                }
            };
            let refs: Vec<&Literal> = ins.iter().map(|l| l.as_ref()).collect();
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                program.run_partial(&refs, &tessera_interp::SingleDevice)
            }));
            return match run {
                Ok(outputs) => Ok(vec![outputs?]),
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic without a message".into());
                    Err(launch_error(LaunchError::Panicked { device, message }))
                }
            };
        }
        let inputs = Arc::new(inputs);
        let positions = Arc::new(self.positions.clone());
        launch_spanning(
            &self.mesh,
            &self.devices,
            self.programs.clone(),
            Arc::new(move |program: &BackendProgram, coll, pos| {
                let k = positions.binary_search(&pos).map_err(|_| {
                    Error::Device(format!("mesh position {pos} is not this process's"))
                })?;
                let refs: Vec<&Literal> = inputs[k].iter().map(|l| l.as_ref()).collect();
                program.run_partial(&refs, coll)
            }),
        )
        .map_err(launch_error)
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
