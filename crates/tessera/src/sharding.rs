//! The modern sharding API, as JAX's: `Mesh`, `P!` (PartitionSpec), `NamedSharding`,
//! `device_put`, and `visualize_array_sharding`.
//!
//! The types are thin wrappers over the one vocabulary of a split (`tessera_ir::sharding::Spec`,
//! checked by `tessera_shard::check_spec`): a `PartitionSpec` is a spec whose trailing whole
//! dims may be left out, a `NamedSharding` adds the mesh (and its devices), and the runtime's
//! placement and the IR's annotation are built from the padded spec.

use std::fmt;
use std::panic::Location;

use tessera_ir::sharding::Spec;
use tessera_runtime::{ShardSpec, try_device_count};
use tessera_shard::check_spec;

use crate::error::{Error, Result, loc_text, raise};
use crate::tensor::{Repr, Tensor};
use crate::tree::{self, Tree};

/// A logical mesh of devices with named axes, like `jax.make_mesh`. Device `i` of the mesh is
/// host device `i`, row-major over the axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub(crate) ir: tessera_ir::Mesh,
    pub(crate) devices: Vec<usize>,
}

impl Mesh {
    /// `Mesh::new([4, 2], ["dp", "mp"])`. Panics (with the caller's line) when the mesh needs
    /// more devices than there are, or names an axis twice; `try_new` returns the error.
    #[track_caller]
    pub fn new<const N: usize>(shape: [usize; N], names: [&str; N]) -> Mesh {
        Mesh::try_new(&shape, &names).unwrap_or_else(|e| raise(e))
    }

    #[track_caller]
    pub fn try_new(shape: &[usize], names: &[&str]) -> Result<Mesh> {
        let location = loc_text(Location::caller());
        let fail = |message: String| Error::Op {
            op: "Mesh::new".into(),
            message,
            location: location.clone(),
        };
        if shape.len() != names.len() {
            return Err(fail(format!(
                "{} sizes for {} axis names",
                shape.len(),
                names.len()
            )));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(fail(format!("axis \"{n}\" is named twice")));
            }
        }
        if shape.contains(&0) {
            return Err(fail(format!("an axis of size 0 in {shape:?}")));
        }
        let n: usize = shape.iter().product();
        let devices = try_device_count().map_err(fail)?;
        if n > devices {
            return Err(fail(format!(
                "a mesh of {shape:?} needs {n} devices, there are {devices} (set TESSERA_DEVICES)"
            )));
        }
        Ok(Mesh {
            ir: tessera_ir::Mesh::new(
                "mesh",
                names
                    .iter()
                    .zip(shape)
                    .map(|(n, &s)| (n.to_string(), s))
                    .collect(),
            ),
            devices: (0..n).collect(),
        })
    }

    pub fn axis_names(&self) -> Vec<&str> {
        self.ir.axes.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub fn shape(&self) -> Vec<usize> {
        self.ir.axes.iter().map(|(_, s)| *s).collect()
    }

    pub fn size(&self) -> usize {
        self.devices.len()
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self
            .ir
            .axes
            .iter()
            .map(|(n, s)| format!("'{n}': {s}"))
            .collect();
        write!(f, "Mesh({})", axes.join(", "))
    }
}

/// `PartitionSpec`: for each leading dimension, the mesh axes it is split over; dimensions past
/// the end are replicated. Built with `P![...]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct PartitionSpec(pub Spec);

impl PartitionSpec {
    /// The spec of a value of rank `rank`: the entries, then whole dims.
    pub fn padded(&self, rank: usize) -> Result<Spec, String> {
        if self.0.len() > rank {
            return Err(format!(
                "{self} has {} entries for a value of rank {rank}",
                self.0.len()
            ));
        }
        let mut d = self.0.clone();
        d.resize(rank, Vec::new());
        Ok(d)
    }

    /// The partition spec of `spec`: its trailing whole dims left out, as JAX prints it.
    pub fn of(spec: &Spec) -> PartitionSpec {
        let mut entries = spec.clone();
        while entries.last().is_some_and(|e| e.is_empty()) {
            entries.pop();
        }
        PartitionSpec(entries)
    }
}

/// One entry of `P![...]`: an axis name, `None`, or a tuple of axis names.
pub trait SpecEntry {
    fn entry(self) -> Vec<String>;
}

impl SpecEntry for &str {
    fn entry(self) -> Vec<String> {
        vec![self.to_string()]
    }
}

impl SpecEntry for Option<&str> {
    fn entry(self) -> Vec<String> {
        self.map(|s| vec![s.to_string()]).unwrap_or_default()
    }
}

impl SpecEntry for (&str, &str) {
    fn entry(self) -> Vec<String> {
        vec![self.0.to_string(), self.1.to_string()]
    }
}

impl SpecEntry for (&str, &str, &str) {
    fn entry(self) -> Vec<String> {
        vec![self.0.to_string(), self.1.to_string(), self.2.to_string()]
    }
}

/// `P!["dp", None]`, `P![("dp", "mp")]`, `P![]`: a `PartitionSpec`.
#[macro_export]
macro_rules! P {
    () => { $crate::sharding::PartitionSpec(Vec::new()) };
    ($($e:expr),+ $(,)?) => {
        $crate::sharding::PartitionSpec(vec![$($crate::sharding::SpecEntry::entry($e)),+])
    };
}

impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|axes| match axes.len() {
                0 => "None".into(),
                1 => format!("'{}'", axes[0]),
                _ => format!(
                    "({})",
                    axes.iter()
                        .map(|a| format!("'{a}'"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect();
        write!(f, "P({})", parts.join(", "))
    }
}

/// A mesh and a partition spec: where an array lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedSharding {
    pub mesh: Mesh,
    pub spec: PartitionSpec,
}

impl NamedSharding {
    pub fn new(mesh: &Mesh, spec: PartitionSpec) -> NamedSharding {
        NamedSharding {
            mesh: mesh.clone(),
            spec,
        }
    }

    /// The spec of a value of rank `rank`.
    pub(crate) fn dims(&self, rank: usize) -> Result<Spec, String> {
        self.spec.padded(rank)
    }
}

impl fmt::Display for NamedSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamedSharding(mesh={}, spec={})", self.mesh, self.spec)
    }
}

/// Places every leaf of `value` on the mesh as `sharding` says, like `jax.device_put`.
#[track_caller]
pub fn device_put<T: Tree>(value: T, sharding: &NamedSharding) -> T {
    let location = loc_text(Location::caller());
    let (leaves, def) = tree::flatten(&value);
    let placed: Vec<Tensor> = leaves
        .iter()
        .map(|t| {
            let fail = |message: String| -> ! {
                raise(Error::Op {
                    op: "device_put".into(),
                    message,
                    location: location.clone(),
                })
            };
            let array = match &t.repr {
                Repr::Concrete(a) => a,
                Repr::Traced(_) => {
                    fail("a tracer cannot be placed on devices; place its inputs".into())
                }
            };
            let dims = sharding.dims(t.rank()).unwrap_or_else(|m| fail(m));
            check_spec(&sharding.mesh.ir, t.ty(), &dims)
                .unwrap_or_else(|e| fail(format!("{} on {}: {e}", t.ty(), sharding)));
            Tensor::from_array(array.shard(ShardSpec {
                mesh: sharding.mesh.ir.clone(),
                devices: sharding.mesh.devices.clone(),
                dims,
            }))
        })
        .collect();
    tree::unflatten(&def, placed).unwrap_or_else(|e| raise(e))
}

/// `jax.lax.with_sharding_constraint`: inside `jit`, a hint that propagation must respect (the
/// value is resharded to it); on a concrete tensor, `device_put`.
#[track_caller]
pub fn with_sharding_constraint(x: &Tensor, sharding: &NamedSharding) -> Tensor {
    if !x.is_tracer() {
        return device_put(x.clone(), sharding);
    }
    let dims = sharding.dims(x.rank()).unwrap_or_else(|message| {
        raise(Error::Op {
            op: "sharding_constraint".into(),
            message,
            location: loc_text(Location::caller()),
        })
    });
    crate::trace::apply(
        tessera_ir::Op::ShardingConstraint(tessera_ir::Sharding::closed(&sharding.mesh.ir, &dims)),
        &[x],
    )
}

impl Tensor {
    /// Where the tensor lives: its mesh and partition spec, or `None` for a host value.
    pub fn sharding(&self) -> Option<NamedSharding> {
        let Repr::Concrete(a) = &self.repr else {
            return None;
        };
        let spec = a.spec()?;
        Some(NamedSharding {
            mesh: Mesh {
                ir: spec.mesh.clone(),
                devices: spec.devices.clone(),
            },
            spec: PartitionSpec::of(&spec.dims),
        })
    }
}

/// The table `jax.debug.visualize_array_sharding` prints: one cell per block of the first two
/// dimensions, naming the devices that hold it.
pub fn visualize_array_sharding(t: &Tensor) -> String {
    let text = sharding_table(t);
    println!("{text}");
    text
}

/// The text of `visualize_array_sharding`, without printing it.
pub fn sharding_table(t: &Tensor) -> String {
    let Repr::Concrete(a) = &t.repr else {
        return "Traced (no placement)".into();
    };
    let (rows, cols, labels) = match a.spec() {
        None => (1, 1, vec![vec!["CPU 0".to_string()]]),
        Some(spec) => {
            let ty = a.ty();
            let split = |d: usize| -> usize {
                spec.dims
                    .get(d)
                    .map_or(1, |axes| spec.mesh.group_size(axes))
            };
            let (rows, cols) = (split(0), if ty.rank() > 1 { split(1) } else { 1 });
            let mut labels = vec![vec![Vec::<usize>::new(); cols]; rows];
            for pos in 0..spec.devices.len() {
                let r = spec.shard_range(ty, pos);
                let row = r.first().map_or(0, |&(o, s)| o.checked_div(s).unwrap_or(0));
                let col = if ty.rank() > 1 {
                    r[1].0 / r[1].1.max(1)
                } else {
                    0
                };
                labels[row][col].push(spec.devices[pos]);
            }
            let labels = labels
                .into_iter()
                .map(|row| {
                    row.into_iter()
                        .map(|ds| {
                            format!(
                                "CPU {}",
                                ds.iter()
                                    .map(|d| d.to_string())
                                    .collect::<Vec<_>>()
                                    .join(",")
                            )
                        })
                        .collect()
                })
                .collect();
            (rows, cols, labels)
        }
    };
    let len = labels
        .iter()
        .flatten()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(5);
    let width = if cols == 1 { len + 2 } else { len + 5 };
    let line = |l: &str, m: &str, r: &str| -> String {
        let cells: Vec<String> = (0..cols).map(|_| "─".repeat(width)).collect();
        format!("{l}{}{r}", cells.join(m))
    };
    let mut out = vec![line("┌", "┬", "┐")];
    for (i, row) in labels.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .map(|l| {
                let pad = width - l.chars().count();
                format!("{}{l}{}", " ".repeat(pad / 2), " ".repeat(pad - pad / 2))
            })
            .collect();
        out.push(format!("│{}│", cells.join("│")));
        if i + 1 < rows {
            out.push(line("├", "┼", "┤"));
        }
    }
    out.push(line("└", "┴", "┘"));
    out.join("\n")
}
