//! Tessera's runtime: devices as long-lived worker threads, global arrays split into one shard
//! per device, and collectives over shared memory.
//!
//! Architecture invariant: the runtime sees executables (closures run on device threads) and
//! buffers, never graphs.

pub mod array;
pub mod collectives;
pub mod device;

pub use array::{Array, ShardSpec};
pub use collectives::{Rendezvous, SharedCollectives, shared_gemm_count};
pub use device::{device_count, run_on_devices};
