//! Tessera's runtime: devices as long-lived worker threads, global arrays split into one shard
//! per device, and collectives over shared memory.
//!
//! Architecture invariant: the runtime sees executables (closures run on device threads) and
//! buffers, never graphs.

pub mod array;
pub mod collectives;
pub mod device;
pub mod shared_gemm;

pub use array::{Array, ShardSpec};
pub use collectives::{Rendezvous, SharedCollectives};
pub use device::{device_count, run_on_devices};
pub use shared_gemm::shared_gemm_count;
