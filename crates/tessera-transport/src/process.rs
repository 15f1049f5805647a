//! The link between the processes of a multi-process run (`mpirun`): what a transport that
//! spans processes needs from the engine underneath (MPI in `tessera-mpi`), and nothing more.
//!
//! One primitive: an all-gather of equal-length byte blocks among a set of processes, with a
//! deadline. The collectives between processes are built on it in the runtime
//! (`tessera_runtime::spanning`), so they compute every device's result from all members'
//! values in member order, with the same arithmetic (`values`) as the shared-memory
//! transport: a program gets the same bits on one process and on several.

use std::time::Duration;

/// A process's view of the others. Every process of `processes` calls `all_gather` with the
/// same `processes` and the same block length at the same point of its program.
pub trait ProcessLink: Send + Sync {
    /// This process's index (its MPI rank).
    fn index(&self) -> usize;

    /// The number of processes.
    fn count(&self) -> usize;

    /// Every process's `mine` in the order of `processes` (ascending, this one among them),
    /// concatenated. `mine` is moved in: past a deadline the engine may still read it, so the
    /// link keeps it alive forever rather than free it under the engine. Fails when the others do not answer within `timeout`, or the engine
    /// reports an error; after a failure the processes are out of step, and every later call
    /// fails at once.
    fn all_gather(
        &self,
        processes: &[usize],
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String>;
}
