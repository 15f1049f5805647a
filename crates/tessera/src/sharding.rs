//! The modern sharding API, as JAX's: `Mesh`, `P!` (PartitionSpec), `NamedSharding`,
//! `device_put`, and `visualize_array_sharding`.
//!
//! The types are thin wrappers over the one vocabulary of a split (`tessera_ir::sharding::Spec`,
//! checked by `tessera_shard::check_spec`): a `PartitionSpec` is a spec whose trailing whole
//! dims may be left out, a `NamedSharding` adds the mesh (and its devices), and the runtime's
//! placement and the IR's annotation are built from the padded spec.

use std::cell::Cell;
use std::fmt;
use std::panic::Location;

pub use tessera_ir::AxisType;
use tessera_ir::sharding::Spec;
use tessera_runtime::{ShardSpec, try_device_count};
use tessera_shard::check_spec;
use tessera_shard::explicit::{self, Typed};

use crate::error::{Error, Result, loc_text, raise};
use crate::tensor::{Repr, Tensor};
use crate::tree::{self, Tree};

/// A logical mesh of devices with named axes, like `jax.make_mesh`. Device `i` of the mesh is
/// host device `i`, row-major over the axes.
///
/// Each axis has an [`AxisType`]. `Mesh::new` makes `Auto` axes, as `jax.sharding.Mesh` does
/// (the compiler propagates shardings; the seeds' programs are written for this);
/// `Mesh::explicit` (JAX 0.10's `jax.make_mesh` default) makes `Explicit` ones: every value's
/// sharding is part of its type and each op's result sharding follows a fixed rule
/// (`tessera_shard::explicit`). To make Explicit the default, change `AxisType::Auto` to
/// `AxisType::Explicit` in `Mesh::try_new`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub(crate) ir: tessera_ir::Mesh,
    pub(crate) devices: Vec<usize>,
}

impl Mesh {
    /// `Mesh::new([4, 2], ["dp", "mp"])`: a mesh of `Auto` axes over host devices `0..4*2`
    /// (`jax.sharding.Mesh`). Panics (with the caller's line) when the mesh needs more devices
    /// than there are, has an axis of size 0, or names an axis twice; `try_new` returns the
    /// error.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let n = device_count();
    /// let mesh = Mesh::new([n, 1], ["dp", "mp"]);
    /// assert_eq!((mesh.shape(), mesh.size()), (vec![n, 1], n));
    /// assert_eq!(mesh.axis_names(), ["dp", "mp"]);
    /// assert!(Mesh::try_new(&[n + 1], &["dp"]).is_err());
    /// ```
    #[track_caller]
    pub fn new<const N: usize>(shape: [usize; N], names: [&str; N]) -> Mesh {
        Mesh::try_new(&shape, &names).unwrap_or_else(|e| raise(e))
    }

    /// `Mesh::new` with the shape and names as slices, returning the error instead of
    /// panicking (also when the two lengths differ).
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
        crate::distributed::auto().map_err(fail)?;
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
            )
            .with_types(vec![AxisType::Auto; shape.len()]),
            devices: (0..n).collect(),
        })
    }

    /// A mesh over the given devices, in that order (row-major over the axes), as
    /// `jax.sharding.Mesh(np.array(devices).reshape(shape), names)`: position `i` of the mesh
    /// is host device `devices[i]`. Every device once, each one that exists, and as many as
    /// the shape holds; otherwise an error naming the caller's line.
    #[track_caller]
    pub fn from_devices(devices: &[usize], shape: &[usize], names: &[&str]) -> Result<Mesh> {
        let location = loc_text(Location::caller());
        let fail = |message: String| Error::Op {
            op: "Mesh::from_devices".into(),
            message,
            location: location.clone(),
        };
        let mut mesh = Mesh::try_new(shape, names)?;
        if devices.len() != mesh.devices.len() {
            return Err(fail(format!(
                "{} devices for a mesh of shape {shape:?} ({} positions)",
                devices.len(),
                mesh.devices.len()
            )));
        }
        let n = try_device_count().map_err(fail)?;
        for (i, &d) in devices.iter().enumerate() {
            if d >= n {
                return Err(fail(format!(
                    "device {d} does not exist: there are {n} (set TESSERA_DEVICES)"
                )));
            }
            if devices[..i].contains(&d) {
                return Err(fail(format!("device {d} is listed twice")));
            }
        }
        mesh.devices = devices.to_vec();
        Ok(mesh)
    }

    /// The host device of each mesh position, row-major.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// A mesh of `Explicit` axes: `jax.make_mesh(shape, names)` in JAX 0.10.
    #[track_caller]
    pub fn explicit<const N: usize>(shape: [usize; N], names: [&str; N]) -> Mesh {
        Mesh::new(shape, names).with_axis_types([AxisType::Explicit; N])
    }

    /// The same mesh with one type per axis (`axis_types=` of `jax.make_mesh`). Panics with the
    /// caller's line when the count differs from the axes'.
    #[track_caller]
    pub fn with_axis_types(mut self, types: impl AsRef<[AxisType]>) -> Mesh {
        let types = types.as_ref();
        if types.len() != self.ir.axes.len() {
            raise(Error::Op {
                op: "Mesh::with_axis_types".into(),
                message: format!(
                    "{} axis types for the {} axes of {self}",
                    types.len(),
                    self.ir.axes.len()
                ),
                location: loc_text(Location::caller()),
            });
        }
        self.ir = self.ir.with_types(types.to_vec());
        self
    }

    /// The type of each axis.
    pub fn axis_types(&self) -> Vec<AxisType> {
        self.ir.types.clone()
    }

    /// The axis names, in order (`mesh.axis_names`).
    pub fn axis_names(&self) -> Vec<&str> {
        self.ir.axes.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The size of each axis, in order (`mesh.devices.shape`).
    pub fn shape(&self) -> Vec<usize> {
        self.ir.axes.iter().map(|(_, s)| *s).collect()
    }

    /// The number of devices, the product of the axis sizes (`mesh.size`).
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
        if self.ir.types.iter().all(|t| *t == AxisType::Auto) {
            return write!(f, "Mesh({})", axes.join(", "));
        }
        let types: Vec<&str> = self
            .ir
            .types
            .iter()
            .map(|t| match t {
                AxisType::Auto => "Auto",
                AxisType::Explicit => "Explicit",
                AxisType::Manual => "Manual",
            })
            .collect();
        write!(
            f,
            "Mesh({}, axis_types=({}))",
            axes.join(", "),
            types.join(", ")
        )
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
    /// The mesh axes this entry splits a dim over (none: the dim is whole).
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
        write!(f, "{}", explicit::p_text(&self.0))
    }
}

/// A mesh and a partition spec: where an array lives (JAX's `NamedSharding`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedSharding {
    /// The devices and their named axes.
    pub mesh: Mesh,
    /// Which mesh axes split each dim.
    pub spec: PartitionSpec,
}

impl NamedSharding {
    /// `NamedSharding(mesh, spec)`. The spec is not checked here: [`device_put`] (or the op
    /// that uses it) reports an unknown axis, too many entries or a dim the axes do not divide.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let mesh = Mesh::new([device_count()], ["dp"]);
    /// let s = NamedSharding::new(&mesh, P!["dp", None]);
    /// assert_eq!(s.to_string(), format!("NamedSharding(mesh={mesh}, spec={})", s.spec));
    /// let x = device_put(Tensor::zeros([device_count(), 2]), &s);
    /// // As JAX prints it: trailing whole dims left out.
    /// assert_eq!(x.sharding().unwrap().spec, P!["dp"]);
    /// ```
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

/// Where each leaf of a tree goes: one sharding for every leaf, or a tree of specs on a mesh
/// (a prefix of the value's tree, as JAX's trees of shardings).
#[derive(Clone, Debug)]
pub enum Shardings {
    /// The same sharding for every leaf.
    All(NamedSharding),
    /// A tree of specs, a prefix of the value's tree, on one mesh.
    Tree(Mesh, crate::shard_map::Specs),
}

impl From<&NamedSharding> for Shardings {
    fn from(s: &NamedSharding) -> Shardings {
        Shardings::All(s.clone())
    }
}

impl From<NamedSharding> for Shardings {
    fn from(s: NamedSharding) -> Shardings {
        Shardings::All(s)
    }
}

impl<S: Into<crate::shard_map::Specs>> From<(&Mesh, S)> for Shardings {
    fn from((m, s): (&Mesh, S)) -> Shardings {
        Shardings::Tree(m.clone(), s.into())
    }
}

impl Shardings {
    /// One sharding per leaf of `def`, or why the tree of specs does not fit it.
    pub(crate) fn resolve(
        &self,
        def: &tree::TreeDef,
    ) -> std::result::Result<Vec<NamedSharding>, String> {
        match self {
            Shardings::All(s) => Ok(vec![s.clone(); def.num_leaves()]),
            Shardings::Tree(mesh, specs) => Ok(specs
                .resolve(def)?
                .into_iter()
                .map(|p| NamedSharding::new(mesh, p))
                .collect()),
        }
    }
}

/// Places every leaf of `value` on the mesh as `sharding` says (one sharding for all, or a tree
/// of specs: `device_put(p, (&mesh, specs![P![], P!["dp"]]))`), like `jax.device_put`.
/// Panics (with the caller's line) on a tracer, a tree of specs that does not fit `value`, or
/// a spec the leaf's shape and the mesh reject (an unknown axis, a dim the axes do not
/// divide).
///
/// ```
/// use tessera::prelude::*;
///
/// let n = device_count();
/// let mesh = Mesh::new([n], ["dp"]);
/// let args = (Tensor::ones([2 * n, 3]), Tensor::ones([3]));
/// let (x, b) = device_put(args, (&mesh, specs![P!["dp"], P![]])); // x split, b replicated
/// assert_eq!(x.sharding(), Some(NamedSharding::new(&mesh, P!["dp"])));
/// let y = jit(|(x, b): (Tensor, Tensor)| (x + b).sum()).call((x, b)).unwrap();
/// assert_eq!(y.item::<f32>(), (12 * n) as f32);
/// ```
#[track_caller]
pub fn device_put<T: Tree>(value: T, sharding: impl Into<Shardings>) -> T {
    let location = loc_text(Location::caller());
    let (leaves, def) = tree::flatten(&value);
    let fail = |message: String| -> ! {
        raise(Error::Op {
            op: "device_put".into(),
            message,
            location: location.clone(),
        })
    };
    let shardings = sharding.into().resolve(&def).unwrap_or_else(|m| fail(m));
    let placed: Vec<Tensor> = leaves
        .iter()
        .zip(&shardings)
        .map(|(t, sharding)| {
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

/// `jax.device_get`: a host copy of every leaf of `value` (a placed array assembled from its
/// shards), placed nowhere.
pub fn device_get<T: Tree>(value: &T) -> T {
    let (leaves, def) = tree::flatten(value);
    let host: Vec<Tensor> = leaves
        .iter()
        .map(|t| match &t.repr {
            Repr::Concrete(a) => Tensor::from_literal(a.literal().clone()),
            Repr::Traced(_) => t.clone(),
        })
        .collect();
    tree::unflatten(&def, host).unwrap_or_else(|e| raise(e))
}

thread_local! {
    /// The mesh a sharding constraint asked for in a trace on no mesh (`with_sharding_constraint`),
    /// for the jit that traced it to compile for (`take_wanted_mesh`).
    static WANTED_MESH: std::cell::RefCell<Option<Mesh>> = const { std::cell::RefCell::new(None) };
}

/// The mesh a sharding constraint asked for since the last call, in a trace on no mesh.
pub(crate) fn take_wanted_mesh() -> Option<Mesh> {
    WANTED_MESH.with(|w| w.borrow_mut().take())
}

/// Notes `mesh` for the jit tracing on no mesh (`take_wanted_mesh`): a `shard_map`'s.
pub(crate) fn want_mesh(mesh: &Mesh) {
    WANTED_MESH.with(|w| *w.borrow_mut() = Some(mesh.clone()));
}

/// `jax.lax.with_sharding_constraint`: inside `jit`, a hint that propagation must respect (the
/// value is resharded to it; on an Explicit mesh, `reshard`); on concrete tensors,
/// `device_put`. `x` is any tree, `sharding` one sharding for every leaf or a tree of specs.
/// In a jit whose inputs are all host values the program is compiled for the constraint's
/// mesh, the inputs replicated on it (JAX's uncommitted arrays; `out_shardings` and
/// `shard_map` likewise; the closure is traced twice on that first compile); a constraint on
/// another mesh than the inputs', on a dim its axes do not divide, or under `grad`/`vmap` of
/// host values outside any jit, is an error.
#[track_caller]
pub fn with_sharding_constraint<T: Tree>(x: &T, sharding: impl Into<Shardings>) -> T {
    constrain_at(x, sharding.into(), loc_text(Location::caller()))
}

/// `with_sharding_constraint` with its errors at `location` (a jit's `out_shardings` name the
/// call's line).
pub(crate) fn constrain_at<T: Tree>(x: &T, sharding: Shardings, location: String) -> T {
    let (leaves, def) = tree::flatten(x);
    let fail = |message: String| -> ! {
        raise(Error::Op {
            op: "sharding_constraint".into(),
            message,
            location: location.clone(),
        })
    };
    let shardings = sharding.resolve(&def).unwrap_or_else(|m| fail(m));
    let out: Vec<Tensor> = leaves
        .iter()
        .zip(&shardings)
        .map(|(t, s)| {
            if !t.is_tracer() {
                return device_put(t.clone(), s);
            }
            match crate::trace::mesh_of(t) {
                // Traced on no mesh (every input a host value): a jit traces again on this one
                // (`take_wanted_mesh`, `Jitted::run_passes`), as JAX compiles for the mesh a
                // constraint names; elsewhere (grad, vmap) this error is the answer.
                None => {
                    want_mesh(&s.mesh);
                    fail(format!(
                        "the value is traced on no mesh (its inputs are host values) and the \
                         sharding is on mesh {:?}: inside jit the program is then compiled \
                         for that mesh; under grad or vmap alone, jit the computation or \
                         device_put an input on the mesh",
                        s.mesh.ir.axes
                    ))
                }
                Some(m) if m.axes != s.mesh.ir.axes => fail(format!(
                    "the sharding is on mesh {:?}, the value on mesh {:?} (its trace's: its \
                     inputs' or an earlier constraint's): one program runs on one mesh",
                    s.mesh.ir.axes, m.axes
                )),
                Some(_) => {}
            }
            let dims = s.dims(t.rank()).unwrap_or_else(|m| fail(m));
            for (d, axes) in dims.iter().enumerate() {
                let (size, parts) = (t.shape()[d], s.mesh.ir.group_size(axes));
                if parts > 1 && size % parts != 0 {
                    fail(format!(
                        "dim {d} of {} (size {size}) does not split evenly over {axes:?} \
                         ({parts} devices)",
                        t.ty()
                    ));
                }
            }
            crate::trace::apply_at(
                tessera_ir::Op::ShardingConstraint(tessera_ir::Sharding::closed(&s.mesh.ir, &dims)),
                &[t],
                location.clone(),
            )
        })
        .collect();
    tree::unflatten(&def, out).unwrap_or_else(|e| raise(e))
}

impl Tensor {
    /// Where the tensor lives: its mesh and partition spec, or `None` for a host value. Inside a
    /// trace on an Explicit mesh, a tracer's sharding is its type's (`jax.typeof(x).sharding`);
    /// other tracers have none.
    pub fn sharding(&self) -> Option<NamedSharding> {
        let Repr::Concrete(a) = &self.repr else {
            let s = crate::trace::typed_sharding(self)?;
            let mesh = crate::trace::mesh_of(self)?;
            let n = mesh.device_count();
            // A type holds the Explicit axes only (the Auto ones are propagation's).
            let spec = explicit::explicit_only(&mesh, &s.spec());
            return Some(NamedSharding {
                mesh: Mesh {
                    ir: mesh,
                    devices: (0..n).collect(),
                },
                spec: PartitionSpec::of(&spec),
            });
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

/// The table `jax.debug.visualize_array_sharding` prints (without color, as JAX prints it to a
/// non-terminal): for a 1-D array one row of cells, for a 2-D array a grid, each cell naming
/// the devices that hold that block, sized as JAX sizes it. Other ranks are an error (JAX's:
/// "only works for shapes with 1 and 2 dimensions"), raised at the caller's line.
///
/// It prints the table to stdout and also returns it; [`sharding_table`] only returns it.
///
/// ```
/// use tessera::prelude::*;
///
/// let n = device_count();
/// let mesh = Mesh::new([n], ["dp"]);
/// let x = device_put(Tensor::zeros([n, 4]), NamedSharding::new(&mesh, P!["dp"]));
/// let table = visualize_array_sharding(&x);
/// assert!(table.contains("CPU 0") && table.contains(&format!("CPU {}", n - 1)));
/// assert_eq!(table, sharding_table(&x));
/// ```
#[track_caller]
pub fn visualize_array_sharding(t: &Tensor) -> String {
    let text = sharding_table(t);
    println!("{text}");
    text
}

/// The text of `visualize_array_sharding`, without printing it.
///
/// JAX's layout (`jax/_src/debugging.py`, `visualize_sharding`): base height 10, base width
/// `int(10 * cols / rows)` of the array's shape; a cell's width is `int(its fraction of the
/// columns times the base width times 2.5)` clamped to 9..80, its height `int(its fraction of
/// the rows times 10)` (1 line for a 1-D array); the label centered with the left padding `(width - len - 2) div 2` and the
/// top padding `(height - 2) div 2`, the rest right and below. A table wider than 80 columns is
/// drawn whole (rich would shrink it and crop the labels).
#[track_caller]
pub fn sharding_table(t: &Tensor) -> String {
    let Repr::Concrete(a) = &t.repr else {
        return "Traced (no placement)".into();
    };
    let ty = a.ty();
    let rank = ty.rank();
    if !(1..=2).contains(&rank) {
        raise(Error::Op {
            op: "visualize_array_sharding".into(),
            message: format!(
                "`visualize_sharding` only works for shapes with 1 and 2 dimensions (got {ty})"
            ),
            location: loc_text(Location::caller()),
        });
    }
    let dims = ty.dims();
    // The devices of each block: (row, column) -> device ids.
    let (spec, devices, mesh) = match a.spec() {
        None => (
            vec![Vec::new(); rank],
            vec![0],
            tessera_ir::Mesh::new("host", Vec::new()),
        ),
        Some(s) => (s.dims.clone(), s.devices.clone(), s.mesh.clone()),
    };
    let chunks = |d: usize| mesh.group_size(&spec[d]);
    let (rows, cols) = if rank == 1 {
        (1, chunks(0))
    } else {
        (chunks(0), chunks(1))
    };
    let mut cells = vec![vec![Vec::<usize>::new(); cols]; rows];
    for (pos, &dev) in devices.iter().enumerate() {
        let r = if spec.iter().all(|a| a.is_empty()) {
            dims.iter().map(|&d| (0, d)).collect()
        } else {
            mesh.shard_range(dims, &spec, pos)
        };
        let chunk = |(o, s): (usize, usize)| o.checked_div(s).unwrap_or(0);
        let (i, j) = if rank == 1 {
            (0, chunk(r[0]))
        } else {
            (chunk(r[0]), chunk(r[1]))
        };
        cells[i][j].push(dev);
    }
    let (h, w) = (
        dims[0].max(1) as f64,
        if rank == 2 { dims[1].max(1) } else { 1 } as f64,
    );
    let base_height = 10.0;
    let base_width = (base_height * (w / h)).trunc();
    // Each cell: its label and its padding (top, right, bottom, left).
    let laid: Vec<Vec<(String, [usize; 4])>> = cells
        .iter()
        .map(|row| {
            row.iter()
                .map(|devs| {
                    let mut devs = devs.clone();
                    devs.sort_unstable();
                    let label = format!(
                        "CPU {}",
                        devs.iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    );
                    let width = ((1.0 / cols as f64) * base_width * 2.5).trunc() as i64;
                    let height = if rank == 1 {
                        1
                    } else {
                        ((1.0 / rows as f64) * base_height).trunc() as i64
                    };
                    let width = width.clamp(9, 80);
                    let len = label.chars().count() as i64;
                    let (left, lr) = (
                        (width - len - 2).div_euclid(2),
                        (width - len - 2).rem_euclid(2),
                    );
                    let (top, tr) = ((height - 2).div_euclid(2), (height - 2).rem_euclid(2));
                    let pad = |v: i64| v.max(0) as usize;
                    (label, [pad(top), pad(left + lr), pad(top + tr), pad(left)])
                })
                .collect()
        })
        .collect();
    let col_width: Vec<usize> = (0..cols)
        .map(|j| {
            laid.iter()
                .map(|row| {
                    let (l, p) = &row[j];
                    p[3] + l.chars().count() + p[1]
                })
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |l: &str, m: &str, r: &str| -> String {
        let segs: Vec<String> = col_width.iter().map(|&n| "─".repeat(n)).collect();
        format!("{l}{}{r}", segs.join(m))
    };
    let mut out = vec![line("┌", "┬", "┐")];
    for (i, row) in laid.iter().enumerate() {
        let height = row.iter().map(|(_, p)| p[0] + 1 + p[2]).max().unwrap_or(1);
        for k in 0..height {
            let segs: Vec<String> = row
                .iter()
                .zip(&col_width)
                .map(|((label, p), &cw)| {
                    let body = p[3] + label.chars().count() + p[1];
                    let extra = cw - body;
                    let text = if k == p[0] {
                        format!("{}{label}{}", " ".repeat(p[3]), " ".repeat(p[1]))
                    } else {
                        " ".repeat(body)
                    };
                    format!(
                        "{}{text}{}",
                        " ".repeat(extra / 2),
                        " ".repeat(extra - extra / 2)
                    )
                })
                .collect();
            out.push(format!("│{}│", segs.join("│")));
        }
        if i + 1 < rows {
            out.push(line("├", "┼", "┤"));
        }
    }
    out.push(line("└", "┴", "┘"));
    out.join("\n")
}

thread_local! {
    /// How many `*_out` calls are running on this thread: inside one, a dot may leave a partial
    /// sum, which the call completes into its `out_sharding`.
    static OUT_SHARDING: Cell<usize> = const { Cell::new(0) };
}

/// Restores the count when the call unwinds too.
struct OutScope;

impl OutScope {
    fn enter() -> OutScope {
        OUT_SHARDING.with(|c| c.set(c.get() + 1));
        OutScope
    }
}

impl Drop for OutScope {
    fn drop(&mut self) {
        OUT_SHARDING.with(|c| c.set(c.get() - 1));
    }
}

/// After a user's dot on an Explicit mesh: its result must not be a partial sum unless the
/// caller gives `out_sharding` (JAX's error otherwise, at the caller's line).
#[track_caller]
pub(crate) fn check_reduced(out: &Tensor, lhs: &Tensor, rhs: &Tensor, dims: &tessera_ir::DotDims) {
    if OUT_SHARDING.with(|c| c.get()) > 0 {
        return;
    }
    let Some(s) = crate::trace::typed_sharding(out) else {
        return;
    };
    if s.unreduced.is_empty() {
        return;
    }
    let typed = |t: &Tensor| {
        crate::trace::typed_sharding(t)
            .map(|s| Typed::from_sharding(&s))
            .unwrap_or_else(|| Typed::replicated(t.rank()))
    };
    raise(Error::Op {
        op: "dot_general".into(),
        message: explicit::ambiguous_dot(&typed(lhs), &typed(rhs), dims),
        location: loc_text(Location::caller()),
    })
}

/// Runs `f` (a dot, an einsum) allowing it a partial-sum result, then reshards its result to
/// `out`: JAX's `out_sharding=`.
#[track_caller]
fn with_out(op: &str, out: &PartitionSpec, f: impl FnOnce() -> Tensor) -> Tensor {
    let y = {
        let _scope = OutScope::enter();
        f()
    };
    if !y.is_tracer() && y.sharding().is_none() {
        // A host value has no mesh to be split over.
        return y;
    }
    reshard_named(&y, out, op)
}

impl Tensor {
    /// `jnp.matmul(a, b, out_sharding=spec)`: the product with its sharding given, as an
    /// Explicit mesh needs where the contracting dims are split (the partial sums are completed
    /// into `out`: an all-reduce, or a reduce-scatter where `out` splits a dim).
    #[track_caller]
    pub fn matmul_out(&self, rhs: &Tensor, out: PartitionSpec) -> Tensor {
        with_out("matmul", &out, || self.matmul(rhs))
    }

    /// `lax.dot_general(.., out_sharding=spec)`.
    #[track_caller]
    pub fn dot_general_out(
        &self,
        rhs: &Tensor,
        dims: tessera_ir::DotDims,
        out: PartitionSpec,
    ) -> Tensor {
        with_out("dot_general", &out, || self.dot_general(rhs, dims))
    }

    /// `jnp.reshape(x, shape, out_sharding=spec)`: a reshape whose result sharding the rule
    /// cannot derive (a minor dim split, dims split into ones the axes do not divide) with it
    /// given. The value is gathered, reshaped and split again as `out` says.
    #[track_caller]
    pub fn reshape_out(&self, shape: impl Into<tessera_ir::Shape>, out: PartitionSpec) -> Tensor {
        if !self.is_tracer() && self.sharding().is_none() {
            return self.reshape(shape);
        }
        let whole = reshard_named(self, &PartitionSpec::default(), "reshape");
        reshard_named(&whole.reshape(shape), &out, "reshape")
    }
}

/// `jnp.einsum(spec, *operands, out_sharding=out)`.
#[track_caller]
pub fn einsum_out(spec: &str, operands: &[&Tensor], out: PartitionSpec) -> Tensor {
    with_out("einsum", &out, || crate::einsum::einsum(spec, operands))
}

/// `jax.sharding.reshard(x, spec)`: `x` with the sharding `spec` on its mesh, an explicit op
/// that becomes the collective the change needs (an all-gather, an all-to-all, a local slice;
/// an all-reduce or reduce-scatter for a partial sum). On a concrete tensor, `device_put` on
/// the mesh it lives on.
#[track_caller]
pub fn reshard(x: &Tensor, spec: PartitionSpec) -> Tensor {
    reshard_named(x, &spec, "reshard")
}

#[track_caller]
fn reshard_named(x: &Tensor, spec: &PartitionSpec, op: &str) -> Tensor {
    let location = loc_text(Location::caller());
    let fail = |message: String| -> ! {
        raise(Error::Op {
            op: op.into(),
            message,
            location: location.clone(),
        })
    };
    let dims = spec.padded(x.rank()).unwrap_or_else(|m| fail(m));
    if !x.is_tracer() {
        let Some(placed) = x.sharding() else {
            fail(format!(
                "{} lives on the host: reshard moves a value between shardings of its mesh;                  place it with device_put",
                x.ty()
            ))
        };
        return device_put(x.clone(), NamedSharding::new(&placed.mesh, spec.clone()));
    }
    let Some(mesh) = crate::trace::current_mesh() else {
        fail(format!(
            "out_sharding {spec} needs a mesh: the inputs of the jit are not placed on one"
        ))
    };
    check_spec(&mesh, x.ty(), &dims).unwrap_or_else(|e| fail(format!("{} to {spec}: {e}", x.ty())));
    crate::trace::apply(
        tessera_ir::Op::ShardingConstraint(tessera_ir::Sharding::closed(&mesh, &dims)),
        &[x],
    )
}
