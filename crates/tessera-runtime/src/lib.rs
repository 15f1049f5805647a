//! Tessera's runtime: devices as long-lived worker threads, global arrays split into one shard
//! per device, and collectives over shared memory (the transport `tessera_transport` defines).
//!
//! Architecture invariant: the runtime sees executables (closures run on device threads) and
//! buffers, never graphs.

pub mod array;
pub mod collectives;
pub mod device;
pub mod shared_gemm;

pub use array::{Array, ShardSpec};
pub use collectives::{SharedCollectives, collective_timeout, parse_timeout};
pub use device::{
    DeviceFn, LaunchError, device_count, launch, launch_with_timeout, parse_device_count,
    try_device_count,
};
pub use shared_gemm::shared_gemm_count;
pub use tessera_transport::rendezvous::Rendezvous;
