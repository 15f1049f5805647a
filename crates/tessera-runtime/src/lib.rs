//! Tessera's runtime: devices as long-lived worker threads, global arrays split into one shard
//! per device, and collectives over shared memory (the transport `tessera_transport` defines).
//!
//! Architecture invariant: the runtime sees executables (closures run on device threads) and
//! buffers, never graphs.

pub mod array;
pub mod collectives;
pub mod device;
pub mod process;
pub mod shared_gemm;
pub mod spanning;

pub use array::{Array, PlacedShell, ShardSpec, ShardsShell, Shell};
pub use collectives::{SharedCollectives, collective_timeout, parse_timeout};
pub use device::{
    DeviceFn, LaunchError, Launcher, SlotFn, SpanningFn, check_launch, cores, device_count, launch,
    launch_with_timeout, parse_device_count, try_local_device_count,
};
pub use process::{local_positions, process_count, process_index, processes_of, try_device_count};
pub use shared_gemm::shared_gemm_count;
pub use tessera_transport::rendezvous::{Rendezvous, release_spare_launch_buffers};
pub use tessera_transport::values::{append_bytes, from_bytes};
