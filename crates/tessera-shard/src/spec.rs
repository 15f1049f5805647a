//! The vocabulary of a split, as the passes use it: a [`Spec`] (per dim, the mesh axes it is
//! split over, major first; defined in `tessera_ir::sharding`, shared with the user API and the
//! runtime), its check against a mesh and a type, the local type it gives, how a pass reads it
//! from an annotated graph, and its text in messages. (Its IR annotation is
//! `tessera_ir::Sharding::closed`; its group sizes and pieces are `Mesh::group_size` and
//! `Mesh::shard_range`.) Every other module of the crate builds on this one and on nothing
//! above it.

use tessera_ir::{Graph, Mesh, NodeId, TensorType, TypeError};

pub use tessera_ir::sharding::{Spec, is_replicated};

/// A sharding pass's failure: bad input (a spec that does not fit, a malformed graph), or an op
/// the pass built that does not type-check.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShardError {
    #[error("{0}")]
    Invalid(String),
    #[error("partitioning {op}: {error}")]
    Type { op: String, error: TypeError },
}

/// The type of one piece of a value of type `ty` split as `spec`.
pub fn local_type(mesh: &Mesh, ty: &TensorType, spec: &Spec) -> TensorType {
    TensorType::new(ty.dtype, mesh.local_dims(ty.dims(), spec))
}

/// Checks that `spec` fits a value of type `ty` on `mesh`: one entry per dim, axes of the mesh,
/// each axis once, every dim divisible by its group's size.
pub fn check_spec(mesh: &Mesh, ty: &TensorType, spec: &Spec) -> Result<(), ShardError> {
    if spec.len() != ty.rank() {
        return Err(ShardError::Invalid(format!(
            "a sharding with {} dims for a value of type {ty}",
            spec.len()
        )));
    }
    let mut seen: Vec<&String> = Vec::new();
    for (d, axes) in spec.iter().enumerate() {
        for a in axes {
            if mesh.axis_size(a).is_none() {
                return Err(ShardError::Invalid(format!(
                    "unknown mesh axis \"{a}\" (the mesh has {:?})",
                    mesh.axes.iter().map(|(n, _)| n).collect::<Vec<_>>()
                )));
            }
            if seen.contains(&a) {
                return Err(ShardError::Invalid(format!(
                    "mesh axis \"{a}\" is used twice in one sharding"
                )));
            }
            seen.push(a);
        }
        let n = mesh.group_size(axes);
        if !ty.dims()[d].is_multiple_of(n) {
            return Err(ShardError::Invalid(format!(
                "dim {d} of {ty} (size {}) is not divisible by {n}, the size of {axes:?}",
                ty.dims()[d]
            )));
        }
    }
    Ok(())
}

/// The spec a node of an annotated graph carries, or an error naming the pass, the node and the
/// pass whose output the input should be.
pub(crate) fn annotation(
    g: &Graph,
    id: NodeId,
    pass: &str,
    producer: &str,
) -> Result<Spec, ShardError> {
    match &g.node(id).sharding {
        Some(s) => Ok(s.spec()),
        None => Err(ShardError::Invalid(format!(
            "{pass}: the {} : {} has no sharding; the input is the output of {producer}",
            g.op(id).name(),
            g.ty(id),
        ))),
    }
}

/// The mesh of an annotated graph, or an error naming the pass.
pub(crate) fn mesh_of<'g>(g: &'g Graph, pass: &str) -> Result<&'g Mesh, ShardError> {
    g.mesh
        .as_ref()
        .ok_or_else(|| ShardError::Invalid(format!("{pass}: the graph declares no mesh")))
}

/// One dim's axes in Shardy's syntax, for messages: `{"dp", "mp"}`.
pub(crate) fn axes_text(axes: &[String]) -> String {
    let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
    format!("{{{}}}", names.join(", "))
}

/// A spec in Shardy's per-dim syntax, for messages.
pub(crate) fn spec_text(spec: &[Vec<String>]) -> String {
    let dims: Vec<String> = spec.iter().map(|a| axes_text(a)).collect();
    format!("[{}]", dims.join(", "))
}
