//! Running one per-device program on several devices at once (sharded `jit` and `pmap`): an
//! executable per device, launched together on the device threads (`tessera_runtime::launch`),
//! with the shared-memory collectives connecting them.

use std::sync::{Arc, Mutex};

use tessera_ir::{Graph, Literal, Mesh};
use tessera_runtime::{LaunchError, launch};

use crate::error::{Error, Result};
use crate::pipeline::{Backend, Dump, Executable, compile_device_programs};

/// A per-device program compiled for every device of a mesh.
pub(crate) struct DeviceProgram {
    pub(crate) mesh: Mesh,
    pub(crate) devices: Vec<usize>,
    executables: Arc<Vec<Mutex<Executable>>>,
}

impl DeviceProgram {
    /// Compiles `local` once and forks it for every device; the native schedule is dumped as
    /// `dump_index` (`TESSERA_DUMP`). Outputs marked in `first_only` are computed by the first
    /// device only (replicated outputs, alike on every device): the others skip their work and
    /// `run` gives `None` for them.
    pub(crate) fn compile(
        local: &Graph,
        mesh: Mesh,
        devices: Vec<usize>,
        backend: Backend,
        (dump, dump_index): (&Dump, usize),
        first_only: &[bool],
    ) -> Result<DeviceProgram> {
        let executables = compile_device_programs(
            local,
            backend,
            devices.len(),
            (dump, dump_index),
            first_only,
        )?
        .into_iter()
        .map(Mutex::new)
        .collect();
        Ok(DeviceProgram {
            mesh,
            devices,
            executables: Arc::new(executables),
        })
    }

    /// Runs the program on every device; `inputs[p]` are mesh position `p`'s inputs. Returns
    /// each position's outputs, or the error of the device that failed first (a timeout, a
    /// panic, a bad `TESSERA_COLLECTIVE_TIMEOUT`); the program stays fit for the next call.
    pub(crate) fn run(&self, inputs: Vec<Vec<Arc<Literal>>>) -> Result<Vec<Vec<Option<Literal>>>> {
        let inputs = Arc::new(inputs);
        launch(
            &self.devices,
            self.executables.clone(),
            Arc::new(move |exe: &Executable, coll, pos| {
                let refs: Vec<&Literal> = inputs[pos].iter().map(|l| l.as_ref()).collect();
                exe.run_partial(&refs, coll)
            }),
        )
        .map_err(|e| match e {
            LaunchError::Failed { error, .. } => error,
            LaunchError::Config(message) => Error::Io(message),
            other => Error::Io(format!("a device failed: {other}")),
        })
    }
}
