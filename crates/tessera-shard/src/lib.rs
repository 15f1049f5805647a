//! Tessera's sharding: where each value lives on a mesh of devices, and the per-device program
//! that follows. `partition` is the pass (propagation, reshards and collectives, SPMD
//! partitioning); the user-facing `Mesh`, `P!` and `NamedSharding` live in the `tessera` crate
//! and reduce to the plain `Spec` this crate works on.

pub mod combine;
pub mod factors;
pub mod partition;
pub mod propagate;

pub use combine::combine_all_reduces;
pub use factors::{FactorKind, FactorRule};
pub use partition::{Partitioned, ShardError, Spec, check_spec, partition, sharding_of};
