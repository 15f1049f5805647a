//! Tessera's sharding, in Shardy's structure: where each value lives on a mesh of devices, and
//! the per-device program that follows. Three passes, each a graph to a graph, dependencies one
//! way (`spec` <- `factors` <- `propagate` <- `insert_collectives`, `partition`):
//! - [`propagate`]: global graph + parameter specs -> every node annotated where it is wanted;
//! - [`insert_collectives`]: -> every node annotated where it is, reshards and all-reduces as
//!   nodes of their own;
//! - [`per_device`] (`partition.rs`): -> the program each device runs, local shapes;
//!
//! then [`combine_all_reduces`] on the per-device program. On a mesh of one device,
//! [`on_one_device`] (`partition.rs`) takes the place of `per_device` and `combine`: the
//! explicit program without its annotations, reshards and collectives is the one that device
//! runs. Each pass recurses into region
//! bodies (`region.rs`: the slots that tie a region's operands and results to its bodies), so
//! a loop body is propagated, gets its own collectives and runs on local shapes. [`partition`] runs the three.
//! `spec.rs` is the vocabulary of a split, the one the user-facing `Mesh`, `P!` and
//! `NamedSharding` of the `tessera` crate reduce to.

pub mod combine;
pub mod explicit;
pub mod factors;
mod gather;
pub mod insert_collectives;
pub mod partition;
pub mod propagate;
mod region;
pub mod spec;

pub use combine::combine_all_reduces;
pub use factors::{FactorKind, FactorRule};
pub use insert_collectives::{Inserted, insert_annotated, insert_collectives};
pub use partition::{on_one_device, per_device};
pub use propagate::propagate;
pub use spec::{ShardError, Spec, check_spec, local_type};

use tessera_ir::{Graph, Mesh};

/// The result of partitioning.
pub struct Partitioned {
    /// The global program with every value's sharding, each op's location comment noting its
    /// conflicts and reshards.
    pub annotated: Graph,
    /// The global program with its communication explicit (`insert_collectives`'s output).
    pub explicit: Graph,
    /// The program each device runs: local shapes and collectives.
    pub local: Graph,
    /// The sharding of each output.
    pub out_specs: Vec<Spec>,
}

/// Partitions `g` for parameters split as `in_specs` on `mesh`: the three passes in order.
pub fn partition(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Partitioned, ShardError> {
    let propagated = propagate(g, mesh, in_specs)?;
    let inserted = insert_collectives::insert(&propagated)?;
    let local = per_device(&inserted.explicit)?;
    let out_specs = inserted
        .explicit
        .outputs()
        .iter()
        .map(|&o| spec::annotation(&inserted.explicit, o, "partition", "insert_collectives"))
        .collect::<Result<_, _>>()?;
    Ok(Partitioned {
        annotated: inserted.annotated,
        explicit: inserted.explicit,
        local,
        out_specs,
    })
}
