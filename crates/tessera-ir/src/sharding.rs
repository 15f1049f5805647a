//! Meshes and per-value sharding annotations as plain data, in Shardy's vocabulary.
//!
//! The rules that compute shardings live in `tessera-shard`; this module only says what a
//! sharding is, so that the graph can carry one per value and the text format can print it.

use std::fmt;

/// A logical mesh of devices: named axes with sizes, printed `mesh @mesh = <"dp"=4, "mp"=2>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub name: String,
    pub axes: Vec<(String, usize)>,
}

impl Mesh {
    pub fn new(name: impl Into<String>, axes: Vec<(String, usize)>) -> Mesh {
        Mesh {
            name: name.into(),
            axes,
        }
    }

    /// The size of a named axis, `None` when the mesh has no such axis.
    pub fn axis_size(&self, axis: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == axis).map(|(_, s)| *s)
    }

    /// Number of devices in the mesh.
    pub fn device_count(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mesh @{} = <", self.name)?;
        for (i, (n, s)) in self.axes.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "\"{n}\"={s}")?;
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

/// A tensor's sharding: `<@mesh, [{"dp"}, {}], replicated={"mp"}>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    pub mesh: String,
    pub dims: Vec<DimSharding>,
    pub replicated: Vec<String>,
}

impl Sharding {
    /// A sharding with every dimension whole and closed.
    pub fn replicated(mesh: impl Into<String>, rank: usize) -> Sharding {
        Sharding {
            mesh: mesh.into(),
            dims: vec![DimSharding::default(); rank],
            replicated: Vec::new(),
        }
    }

    /// Every axis named anywhere in the sharding, in order of appearance.
    pub fn axes(&self) -> impl Iterator<Item = &String> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter())
            .chain(self.replicated.iter())
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
        write!(f, ">")
    }
}
