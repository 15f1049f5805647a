//! Meshes and per-value sharding annotations as plain data, in Shardy's vocabulary.
//!
//! The rules that compute shardings live in `tessera-shard`; this module only says what a
//! sharding is, so that the graph can carry one per value and the text format can print it.
//!
//! One vocabulary says how a tensor is split, from the user API down to the runtime: a [`Spec`],
//! for each dimension the mesh axes it is split over, major first, on a [`Mesh`]. The graph's
//! annotation [`Sharding`] is a spec with the mesh's name and Shardy's open/closed marks
//! (`Sharding::closed`, `Sharding::spec` convert); the user's `PartitionSpec` is a spec whose
//! trailing whole dims may be left out; the runtime's placement is a spec with the device of each
//! mesh position. Where the pieces of a split tensor are is [`Mesh::shard_range`], the one
//! definition every layer uses.

use std::fmt;

/// How the compiler treats a mesh axis, as JAX's `jax.sharding.AxisType`:
/// - `Auto`: shardings over it are hints; propagation decides where each value is split
///   (`tessera_shard::propagate`);
/// - `Explicit`: a value's split over it is part of its type, fixed by each op's rule
///   (`tessera_shard::explicit`), and an ambiguous op is an error;
/// - `Manual`: inside `shard_map`, the program sees one device's shard and communicates by axis
///   name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AxisType {
    #[default]
    Auto,
    Explicit,
    Manual,
}

impl AxisType {
    pub fn name(self) -> &'static str {
        match self {
            AxisType::Auto => "auto",
            AxisType::Explicit => "explicit",
            AxisType::Manual => "manual",
        }
    }
}

/// A logical mesh of devices: named axes with sizes, printed `mesh @mesh = <"dp"=4, "mp"=2>`;
/// an axis that is not `Auto` prints its type after its size (`"dp"=4 explicit`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub name: String,
    pub axes: Vec<(String, usize)>,
    /// One type per axis.
    pub types: Vec<AxisType>,
}

impl Mesh {
    /// A mesh of `Auto` axes.
    pub fn new(name: impl Into<String>, axes: Vec<(String, usize)>) -> Mesh {
        let types = vec![AxisType::Auto; axes.len()];
        Mesh {
            name: name.into(),
            axes,
            types,
        }
    }

    /// The same mesh with the given axis types (one per axis).
    pub fn with_types(mut self, types: Vec<AxisType>) -> Mesh {
        assert_eq!(types.len(), self.axes.len(), "one axis type per mesh axis");
        self.types = types;
        self
    }

    /// The type of a named axis (`Auto` for an axis the mesh lacks, checked elsewhere).
    pub fn axis_type(&self, axis: &str) -> AxisType {
        self.axes
            .iter()
            .position(|(n, _)| n == axis)
            .map_or(AxisType::Auto, |i| self.types[i])
    }

    /// Whether any axis is `Explicit`: values then carry their sharding in their types.
    pub fn is_explicit(&self) -> bool {
        self.types.contains(&AxisType::Explicit)
    }

    /// The size of a named axis, `None` when the mesh has no such axis.
    pub fn axis_size(&self, axis: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == axis).map(|(_, s)| *s)
    }

    /// Number of devices in the mesh.
    pub fn device_count(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// The number of devices in the group of `axes` (the product of their sizes; an axis the
    /// mesh lacks counts 1, for a spec checked elsewhere).
    pub fn group_size(&self, axes: &[String]) -> usize {
        axes.iter().filter_map(|a| self.axis_size(a)).product()
    }

    /// The dims of one piece of a tensor of dims `dims` split as `spec`.
    pub fn local_dims(&self, dims: &[usize], spec: &Spec) -> Vec<usize> {
        dims.iter()
            .zip(spec)
            .map(|(&d, axes)| d / self.group_size(axes))
            .collect()
    }

    /// The piece that mesh position `pos` (row-major over the axes) holds of a tensor of dims
    /// `dims` split as `spec`: for each dim, (offset, size) in the whole tensor. A dim split over
    /// axes `[a, b]` is cut into `|a| * |b|` chunks, the device at coordinates `(i, j)` holding
    /// chunk `i * |b| + j`. Panics on an axis the mesh lacks (check the spec first).
    pub fn shard_range(&self, dims: &[usize], spec: &Spec, pos: usize) -> Vec<(usize, usize)> {
        let mut coords = vec![0; self.axes.len()];
        let mut rest = pos;
        for i in (0..self.axes.len()).rev() {
            coords[i] = rest % self.axes[i].1;
            rest /= self.axes[i].1;
        }
        dims.iter()
            .zip(spec)
            .map(|(&d, axes)| {
                let (mut n, mut k) = (1, 0);
                for a in axes {
                    let i = self
                        .axes
                        .iter()
                        .position(|(m, _)| m == a)
                        .unwrap_or_else(|| panic!("shard_range: no axis \"{a}\" in {self}"));
                    k = k * self.axes[i].1 + coords[i];
                    n *= self.axes[i].1;
                }
                (k * d / n, d / n)
            })
            .collect()
    }
}

/// How a tensor is split: for each dimension, the mesh axes it is split over, major first (empty:
/// the dim is whole on every device). See the module doc.
pub type Spec = Vec<Vec<String>>;

/// Whether a spec splits no dim.
pub fn is_replicated(spec: &Spec) -> bool {
    spec.iter().all(|axes| axes.is_empty())
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mesh @{} = <", self.name)?;
        for (i, (n, s)) in self.axes.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "\"{n}\"={s}")?;
            match self.types[i] {
                AxisType::Auto => {}
                t @ (AxisType::Explicit | AxisType::Manual) => write!(f, " {}", t.name())?,
            }
        }
        write!(f, ">")
    }
}

/// How one tensor dimension is split: the mesh axes it is split over, major to minor, and whether
/// propagation may still add axes to it (open) or not (closed).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DimSharding {
    pub axes: Vec<String>,
    pub open: bool,
}

impl DimSharding {
    pub fn closed(axes: Vec<String>) -> DimSharding {
        DimSharding { axes, open: false }
    }
}

/// A tensor's sharding: `<@mesh, [{"dp"}, {}], replicated={"mp"}>`. `unreduced={"mp"}` (an
/// Explicit-mode type, JAX's `P(..., unreduced={"mp"})`) says each device holds a partial sum
/// over those axes: a dot whose contracting dims are sharded, before the sharding the user
/// gives it (`out_sharding`, `reshard`) completes the sum.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    pub mesh: String,
    pub dims: Vec<DimSharding>,
    pub replicated: Vec<String>,
    pub unreduced: Vec<String>,
}

impl Sharding {
    /// A sharding with every dimension whole and closed.
    pub fn replicated(mesh: impl Into<String>, rank: usize) -> Sharding {
        Sharding {
            mesh: mesh.into(),
            dims: vec![DimSharding::default(); rank],
            replicated: Vec::new(),
            unreduced: Vec::new(),
        }
    }

    /// The closed annotation of `spec` on `mesh`.
    pub fn closed(mesh: &Mesh, spec: &Spec) -> Sharding {
        Sharding {
            mesh: mesh.name.clone(),
            dims: spec
                .iter()
                .map(|a| DimSharding::closed(a.clone()))
                .collect(),
            replicated: Vec::new(),
            unreduced: Vec::new(),
        }
    }

    /// The axes of each dim, open or closed.
    pub fn spec(&self) -> Spec {
        self.dims.iter().map(|d| d.axes.clone()).collect()
    }

    /// Every axis named anywhere in the sharding, in order of appearance.
    pub fn axes(&self) -> impl Iterator<Item = &String> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter())
            .chain(self.replicated.iter())
            .chain(self.unreduced.iter())
    }
}

fn write_axes(f: &mut fmt::Formatter<'_>, axes: &[String], open: bool) -> fmt::Result {
    write!(f, "{{")?;
    for (i, a) in axes.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "\"{a}\"")?;
    }
    if open {
        if axes.is_empty() {
            write!(f, "?")?;
        } else {
            write!(f, ", ?")?;
        }
    }
    write!(f, "}}")
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<@{}, [", self.mesh)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write_axes(f, &d.axes, d.open)?;
        }
        write!(f, "]")?;
        if !self.replicated.is_empty() {
            write!(f, ", replicated=")?;
            write_axes(f, &self.replicated, false)?;
        }
        if !self.unreduced.is_empty() {
            write!(f, ", unreduced=")?;
            write_axes(f, &self.unreduced, false)?;
        }
        write!(f, ">")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh::new("mesh", vec![("a".into(), 2), ("b".into(), 3)])
    }

    #[test]
    fn shard_range_is_row_major_over_the_mesh_and_major_first_over_a_dims_axes() {
        let m = mesh();
        let ab: Spec = vec![vec!["a".into(), "b".into()], vec![]];
        let ba: Spec = vec![vec!["b".into(), "a".into()], vec![]];
        // Position 4 is coordinates (a=1, b=1).
        assert_eq!(m.shard_range(&[12, 5], &ab, 4), vec![(8, 2), (0, 5)]);
        assert_eq!(m.shard_range(&[12, 5], &ba, 4), vec![(6, 2), (0, 5)]);
        let split: Spec = vec![vec!["b".into()], vec!["a".into()]];
        assert_eq!(m.shard_range(&[6, 4], &split, 5), vec![(4, 2), (2, 2)]);
        assert_eq!(m.local_dims(&[6, 4], &split), vec![2, 2]);
        assert_eq!(m.group_size(&["a".into(), "b".into()]), 6);
        // Every position holds a distinct piece, and the pieces tile the tensor.
        let mut seen: Vec<Vec<(usize, usize)>> = (0..6)
            .map(|pos| m.shard_range(&[12, 5], &ab, pos))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn closed_annotation_and_spec_round_trip() {
        let m = mesh();
        let spec: Spec = vec![vec!["a".into()], vec![], vec!["b".into()]];
        let s = Sharding::closed(&m, &spec);
        assert_eq!(s.to_string(), "<@mesh, [{\"a\"}, {}, {\"b\"}]>");
        assert_eq!(s.spec(), spec);
        assert!(!is_replicated(&spec));
        assert!(is_replicated(&vec![Vec::new(); 2]));
    }
}
