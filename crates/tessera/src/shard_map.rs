//! `shard_map`: the manual, per-device style, as `jax.shard_map(f, mesh=, in_specs=,
//! out_specs=, axis_names=)`.
//!
//! `f` is traced once on one device's shards (each input's dims divided by the manual axes its
//! spec names), in a trace on the mesh, so the collectives it calls by axis name (`psum`,
//! `pmean`, `all_gather`, `psum_scatter`, `ppermute`, `all_to_all`, `axis_index`) type-check.
//! That per-device program then becomes a global one, JAX's "shard_map is a vmap over the mesh"
//! reading: each input is reshaped so that every manual axis it is split over is a block dim of
//! its own (in mesh order, in front), the program is batched over each manual axis in turn
//! (`tessera_autodiff::batch`, which turns a collective over the mapped axis into the op over
//! the block dim), and the outputs are put back together as `out_specs` says. Sharding
//! constraints pin each block dim to its axis, so partitioning gives every device exactly its
//! block, and the collectives are the all-reduces, all-gathers and permutes the user wrote.
//!
//! Because the result is an ordinary global program, everything composes: `shard_map` inside
//! `jit` (the trace records it), `grad` through it (the gradient of the global function: a
//! replicated input's cotangent is the sum over devices), `vmap` of it, and the axes not named
//! in `axis_names` stay automatic (propagation shards the per-device program over them).
//! Called on concrete tensors, it places them as `in_specs` says and runs through `jit`.
//!
//! An output whose `out_specs` leaves out a manual axis claims to be the same on every device
//! of that axis; the batching pass proves it or the call is an error naming the axis (JAX's
//! `check_vma`), before anything runs.

use std::cell::RefCell;
use std::panic::Location;
use std::rc::Rc;

use tessera_ir::{DimSharding, Mesh as IrMesh, NodeId, Op, Sharding, TensorType};
use tessera_shard::check_spec;

use crate::error::{Error, Result, catch, loc_text, raise};
use crate::grad::replay;
use crate::jit::{Jitted, Lowered, jit};
use crate::sharding::{Mesh, NamedSharding, PartitionSpec, device_put};
use crate::tensor::Tensor;
use crate::trace::{self, apply};
use crate::tree::{self, Tree, TreeDef};

/// A tree of partition specs, JAX's `in_specs`/`out_specs`: a prefix of the argument (or
/// output) tree, a leaf applying to every tensor below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Specs {
    /// One spec for every tensor of the subtree it is matched with.
    Leaf(PartitionSpec),
    /// One child per child of the tree it is matched with (a tuple's elements, a struct's
    /// fields in order, a `Vec`'s items); `specs![..]` builds one.
    Node(Vec<Specs>),
}

impl From<PartitionSpec> for Specs {
    fn from(p: PartitionSpec) -> Specs {
        Specs::Leaf(p)
    }
}

impl From<Vec<Specs>> for Specs {
    fn from(children: Vec<Specs>) -> Specs {
        Specs::Node(children)
    }
}

/// `specs![P!["dp"], P![]]`: a node of specs, each entry a `P!` or a nested `specs![..]`.
#[macro_export]
macro_rules! specs {
    ($($e:expr),* $(,)?) => {
        $crate::shard_map::Specs::Node(vec![$($crate::shard_map::Specs::from($e)),*])
    };
}

impl Specs {
    fn describe(&self) -> String {
        match self {
            Specs::Leaf(p) => p.to_string(),
            Specs::Node(c) => {
                let inner: Vec<String> = c.iter().map(Specs::describe).collect();
                format!("({})", inner.join(", "))
            }
        }
    }

    /// One spec per leaf of `def`, or why the specs are not a prefix of `def`.
    pub(crate) fn resolve(&self, def: &TreeDef) -> std::result::Result<Vec<PartitionSpec>, String> {
        let mut out = Vec::with_capacity(def.num_leaves());
        self.resolve_into(def, &mut out)?;
        Ok(out)
    }

    fn resolve_into(
        &self,
        def: &TreeDef,
        out: &mut Vec<PartitionSpec>,
    ) -> std::result::Result<(), String> {
        match (self, def) {
            (Specs::Leaf(p), d) => {
                out.extend(std::iter::repeat_n(p.clone(), d.num_leaves()));
                Ok(())
            }
            (Specs::Node(c), TreeDef::Node { children, .. }) if c.len() == children.len() => {
                for (s, d) in c.iter().zip(children) {
                    s.resolve_into(d, out)?;
                }
                Ok(())
            }
            (Specs::Node(_), d) => Err(format!(
                "the specs {} do not match the tree {} (each node of the specs needs one entry \
                 per child)",
                self.describe(),
                d.describe()
            )),
        }
    }
}

/// What a `shard_map` is: the function, its mesh, specs and manual axes.
struct Inner<F> {
    f: F,
    mesh: Mesh,
    in_specs: Specs,
    out_specs: Specs,
    /// The manual axes, in mesh order.
    manual: Vec<String>,
}

type Leaves = Vec<Tensor>;

/// The run of one argument structure on concrete inputs: the global program under `jit`,
/// over leaves, and the result structure its trace found.
struct Entry {
    jitted: Jitted<Box<dyn Fn(Leaves) -> Leaves>, Leaves, Leaves>,
    out: Rc<RefCell<Option<TreeDef>>>,
    /// The caller's line of the call being traced.
    location: Rc<RefCell<String>>,
}

/// A shard-mapped function; apply it with [`ShardMapped::call`].
pub struct ShardMapped<F, In, Out> {
    inner: Rc<Inner<F>>,
    /// One `jit` per argument structure (the `jit` itself keys on the leaves only).
    entries: RefCell<std::collections::HashMap<TreeDef, Rc<Entry>>>,
    _types: std::marker::PhantomData<fn(In) -> Out>,
}

/// `jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)`: `f` runs on each
/// device's shards; see the module doc. Every mesh axis is manual; `axis_names` picks fewer.
///
/// ```
/// use tessera::prelude::*;
///
/// let n = device_count();
/// let mesh = Mesh::new([n], ["i"]);
/// // Each device sums its [2, 3] block; psum adds up the devices' sums.
/// let f = shard_map(|x: Tensor| psum(&x.sum(), "i"), &mesh, P!["i"], P![]);
/// assert_eq!(f.call(Tensor::ones([2 * n, 3])).unwrap().item::<f32>(), (6 * n) as f32);
/// ```
pub fn shard_map<In: Tree + 'static, Out: Tree + 'static, F: Fn(In) -> Out + 'static>(
    f: F,
    mesh: &Mesh,
    in_specs: impl Into<Specs>,
    out_specs: impl Into<Specs>,
) -> ShardMapped<F, In, Out> {
    ShardMapped {
        inner: Rc::new(Inner {
            f,
            mesh: mesh.clone(),
            in_specs: in_specs.into(),
            out_specs: out_specs.into(),
            manual: mesh.axis_names().iter().map(|a| a.to_string()).collect(),
        }),
        entries: RefCell::default(),
        _types: std::marker::PhantomData,
    }
}

impl<In: Tree + 'static, Out: Tree + 'static, F: Fn(In) -> Out + 'static> ShardMapped<F, In, Out> {
    /// The `jit` of argument structure `def`.
    fn entry(&self, def: &TreeDef) -> Rc<Entry> {
        if let Some(e) = self.entries.borrow().get(def) {
            return e.clone();
        }
        let out: Rc<RefCell<Option<TreeDef>>> = Rc::default();
        let location: Rc<RefCell<String>> = Rc::default();
        let (i, d, o, l) = (
            self.inner.clone(),
            def.clone(),
            out.clone(),
            location.clone(),
        );
        let run: Box<dyn Fn(Leaves) -> Leaves> = Box::new(move |leaves: Leaves| {
            let args: In = tree::unflatten(&d, leaves).unwrap_or_else(|e| raise(e));
            let result = i.apply(args, l.borrow().clone());
            let (out_leaves, out_def) = tree::flatten(&result);
            *o.borrow_mut() = Some(out_def);
            out_leaves
        });
        let e = Rc::new(Entry {
            jitted: jit(run).named("shard_map"),
            out,
            location,
        });
        self.entries.borrow_mut().insert(def.clone(), e.clone());
        e
    }

    /// Only these mesh axes are manual (`axis_names=`); the others stay automatic: the
    /// per-device program is partitioned over them as any `jit` program is.
    #[track_caller]
    pub fn axis_names(self, axes: &[&str]) -> Self {
        let names = self.inner.mesh.axis_names();
        if let Some(a) = axes.iter().find(|a| !names.contains(a)) {
            raise(Error::Op {
                op: "shard_map".into(),
                message: format!(
                    "axis_names names \"{a}\", which the mesh {} lacks",
                    self.inner.mesh
                ),
                location: loc_text(Location::caller()),
            });
        }
        let manual = names
            .iter()
            .filter(|n| axes.contains(n))
            .map(|n| n.to_string())
            .collect();
        let ShardMapped { inner, entries, .. } = self;
        // The jitted closures hold the other references.
        drop(entries);
        let inner = Rc::into_inner(inner).expect("no other reference");
        ShardMapped {
            inner: Rc::new(Inner { manual, ..inner }),
            entries: RefCell::default(),
            _types: std::marker::PhantomData,
        }
    }

    /// Applies the function: recorded into the enclosing trace when an argument is a tracer,
    /// run through `jit` on the mesh otherwise. Bad specs and a failed replication check are
    /// errors naming the caller's line (inside `jit` returned by its `call`; eagerly here).
    #[track_caller]
    pub fn call(&self, args: In) -> Result<Out> {
        let location = loc_text(Location::caller());
        let (leaves, def) = tree::flatten(&args);
        if let Some(t) = leaves.iter().find(|t| t.is_tracer()) {
            // Traced on no mesh (host inputs): unwinds to the trace like a traced op's error
            // (not an `Err` the closure would unwrap), so that a jit compiles for this mesh
            // (`sharding::want_mesh`) and grad or vmap alone report it.
            if crate::trace::mesh_of(t).is_none() {
                crate::sharding::want_mesh(&self.inner.mesh);
                self.inner.fail(
                    &location,
                    format!(
                        "the arguments are traced on no mesh (their inputs are host values) \
                         and this shard_map is on mesh {:?}: inside jit the program is then \
                         compiled for that mesh; under grad or vmap alone, jit the \
                         computation or device_put an input on the mesh",
                        self.inner.mesh.ir.axes
                    ),
                );
            }
            return catch(|| self.inner.apply(args, location.clone()));
        }
        let placed = self.place(&leaves, &def, &location)?;
        let e = self.entry(&def);
        *e.location.borrow_mut() = location;
        let outs = e.jitted.call(placed)?;
        let out_def = e.out.borrow().clone().expect("traced on the first call");
        tree::unflatten(&out_def, outs)
    }

    /// The global program and its per-device program for concrete `args`.
    #[track_caller]
    pub fn lower(&self, args: &In) -> Result<Lowered> {
        let location = loc_text(Location::caller());
        let (leaves, def) = tree::flatten(args);
        let placed = self.place(&leaves, &def, &location)?;
        let e = self.entry(&def);
        *e.location.borrow_mut() = location;
        e.jitted.lower(&placed)
    }

    /// Each concrete leaf placed on the mesh as its spec says.
    fn place(&self, leaves: &[Tensor], def: &TreeDef, location: &str) -> Result<Leaves> {
        let specs = self.inner.in_specs.resolve(def).map_err(|m| Error::Op {
            op: "shard_map".into(),
            message: format!("in_specs: {m}"),
            location: location.into(),
        })?;
        let paths = def.leaf_paths();
        let fail = |message: String| Error::Op {
            op: "shard_map".into(),
            message,
            location: location.into(),
        };
        let mut placed = Vec::with_capacity(leaves.len());
        for ((t, s), path) in leaves.iter().zip(specs).zip(&paths) {
            let dims = s
                .padded(t.rank())
                .map_err(|m| fail(format!("in_specs of {path}: {m}")))?;
            check_spec(&self.inner.mesh.ir, t.ty(), &dims)
                .map_err(|e| fail(format!("in_specs of {path} ({}): {e}", t.ty())))?;
            placed.push(device_put(
                t.clone(),
                NamedSharding::new(&self.inner.mesh, s),
            ));
        }
        Ok(placed)
    }
}

impl<F> Inner<F> {
    fn fail(&self, location: &str, message: String) -> ! {
        raise(Error::Op {
            op: "shard_map".into(),
            message,
            location: location.into(),
        })
    }

    /// The manual axes of one dim's spec, checked to be manual.
    fn size_of(&self, axis: &str) -> usize {
        self.mesh.ir.axis_size(axis).unwrap_or(1)
    }

    /// The shard_map applied to tracers (see the module doc), in the enclosing trace.
    fn apply<In: Tree, Out: Tree>(&self, args: In, location: String) -> Out
    where
        F: Fn(In) -> Out,
    {
        let ir = &self.mesh.ir;
        let (leaves, def) = tree::flatten(&args);
        let paths = def.leaf_paths();
        let in_specs = self
            .in_specs
            .resolve(&def)
            .unwrap_or_else(|m| self.fail(&location, format!("in_specs: {m}")));
        let mut specs = Vec::with_capacity(leaves.len());
        let mut local = Vec::with_capacity(leaves.len());
        for ((t, p), path) in leaves.iter().zip(&in_specs).zip(&paths) {
            let spec = p
                .padded(t.rank())
                .unwrap_or_else(|m| self.fail(&location, format!("in_specs of {path}: {m}")));
            check_spec(ir, t.ty(), &spec).unwrap_or_else(|e| {
                self.fail(&location, format!("in_specs of {path} ({}): {e}", t.ty()))
            });
            if let Some(a) = spec.iter().flatten().find(|a| !self.manual.contains(a)) {
                self.fail(
                    &location,
                    format!(
                        "in_specs of {path} names \"{a}\", which is not a manual axis of this \
                         shard_map (axis_names {:?})",
                        self.manual
                    ),
                );
            }
            let dims: Vec<usize> = t
                .shape()
                .iter()
                .zip(&spec)
                .map(|(&d, axes)| d / ir.group_size(axes))
                .collect();
            local.push(TensorType::new(t.dtype(), dims));
            specs.push(spec);
        }
        // The per-device trace, on the mesh so the collectives type-check.
        // Every axis Manual inside: the body is untyped (no Explicit rule sees a collective).
        let manual_mesh = ir
            .clone()
            .with_types(vec![tessera_ir::AxisType::Manual; ir.axes.len()]);
        let (guard, tracers) = trace::begin_on("shard_map", &local, Some(manual_mesh));
        let ex: In = tree::unflatten(&def, tracers).unwrap_or_else(|e| raise(e));
        let out = match catch(|| (self.f)(ex)) {
            Ok(out) => out,
            Err(e) => {
                drop(guard);
                raise(e)
            }
        };
        let (out_leaves, out_def) = tree::flatten(&out);
        let rec = catch(|| trace::finish(guard, &out_leaves)).unwrap_or_else(|e| raise(e));
        let out_paths = out_def.leaf_paths();
        let out_specs: Vec<Vec<Vec<String>>> = self
            .out_specs
            .resolve(&out_def)
            .unwrap_or_else(|m| self.fail(&location, format!("out_specs: {m}")))
            .iter()
            .zip(&out_leaves)
            .zip(&out_paths)
            .map(|((p, t), path)| {
                let spec = p
                    .padded(t.rank())
                    .unwrap_or_else(|m| self.fail(&location, format!("out_specs of {path}: {m}")));
                if let Some(a) = spec.iter().flatten().find(|a| !self.manual.contains(a)) {
                    self.fail(
                        &location,
                        format!("out_specs of {path} names \"{a}\", which is not a manual axis"),
                    );
                }
                let global: Vec<usize> = t
                    .shape()
                    .iter()
                    .zip(&spec)
                    .map(|(&d, axes)| d.saturating_mul(ir.group_size(axes)))
                    .collect();
                check_spec(ir, &TensorType::new(t.dtype(), global), &spec).unwrap_or_else(|e| {
                    self.fail(&location, format!("out_specs of {path} ({}): {e}", t.ty()))
                });
                spec
            })
            .collect();
        if let Some(c) = foreign_collective(&rec.graph, &self.manual) {
            self.fail(
                &location,
                format!(
                    "{c} inside a shard_map whose manual axes are {:?}: a collective names \
                     manual axes only",
                    self.manual
                ),
            );
        }
        // Batch over each manual axis, the last (innermost) first.
        let uses = |spec: &Vec<Vec<String>>, a: &str| spec.iter().flatten().any(|b| b == a);
        let mut g = rec.graph;
        for a in self.manual.iter().rev() {
            let mut in_axes: Vec<Option<usize>> =
                specs.iter().map(|s| uses(s, a).then_some(0)).collect();
            in_axes.extend(std::iter::repeat_n(None, rec.captures.len()));
            let out_axes: Vec<Option<usize>> =
                out_specs.iter().map(|s| uses(s, a).then_some(0)).collect();
            g = tessera_autodiff::batch(&g, &in_axes, self.size_of(a), Some(a), &out_axes)
                .unwrap_or_else(|e| match e {
                    tessera_autodiff::BatchError::OutAxis { index, ty, .. } => self.fail(
                        &location,
                        format!(
                            "out_specs of {} is {} ({ty} per device), which claims the value \
                             is the same on every device along mesh axis '{a}', but it varies \
                             over '{a}' (check_vma): reduce it over '{a}' (psum, pmean, \
                             all_gather) or name '{a}' in its out_specs",
                            out_paths[index],
                            PartitionSpec::of(&out_specs[index])
                        ),
                    ),
                    other => self.fail(&location, other.to_string()),
                });
        }
        // The inputs in block layout, each block dim pinned to its axis.
        let mut env = std::collections::HashMap::new();
        let params: Vec<NodeId> = g.params().to_vec();
        for (k, t) in leaves.iter().enumerate() {
            let whole = constrain(t, &self.global_dims(&specs[k]), ir);
            let blocked = self.to_blocked(&whole, &specs[k]);
            let pinned = constrain(&blocked, &self.pins(&specs[k], t.rank()), ir);
            env.insert(params[k], pinned);
        }
        for (p, c) in params[leaves.len()..].iter().zip(&rec.captures) {
            env.insert(*p, c.clone());
        }
        // The batched program is the compiler's: typed leniently on an Explicit mesh (its
        // block-dim slices have no Explicit rule; their values are right in any sharding).
        trace::lenient(|| replay(&g, &g.topo_order(), &mut env));
        let outs: Vec<Tensor> = g
            .outputs()
            .iter()
            .zip(&out_specs)
            .zip(&out_leaves)
            .map(|((o, spec), local)| {
                let blocked = constrain(&env[o], &self.pins(spec, local.rank()), ir);
                let whole = self.unblocked(&blocked, spec, local.shape());
                constrain(&whole, &self.global_dims(spec), ir)
            })
            .collect();
        tree::unflatten(&out_def, outs).unwrap_or_else(|e| raise(e))
    }

    /// A global value split as `spec` over the manual axes: closed, or where axes stay
    /// automatic, open on the dims the spec leaves whole (propagation may split them).
    fn global_dims(&self, spec: &[Vec<String>]) -> Vec<DimSharding> {
        let auto = self.manual.len() < self.mesh.ir.axes.len();
        spec.iter()
            .map(|axes| DimSharding {
                axes: axes.clone(),
                open: auto && axes.is_empty(),
            })
            .collect()
    }

    /// The manual axes `spec` splits over, in mesh order.
    fn blocks(&self, spec: &[Vec<String>]) -> Vec<String> {
        self.manual
            .iter()
            .filter(|a| spec.iter().flatten().any(|b| b == *a))
            .cloned()
            .collect()
    }

    /// A block dim per manual axis in front (closed to that axis), the local dims open.
    fn pins(&self, spec: &[Vec<String>], rank: usize) -> Vec<DimSharding> {
        let mut dims: Vec<DimSharding> = self
            .blocks(spec)
            .into_iter()
            .map(|a| DimSharding::closed(vec![a]))
            .collect();
        let open = self.manual.len() < self.mesh.ir.axes.len();
        dims.extend((0..rank).map(|_| DimSharding {
            axes: Vec::new(),
            open,
        }));
        dims
    }

    /// `x` (global, split as `spec`) as `[block per manual axis in mesh order, local dims]`.
    fn to_blocked(&self, x: &Tensor, spec: &[Vec<String>]) -> Tensor {
        let blocks = self.blocks(spec);
        // Each dim split into its axes' sizes (spec order), then its local size.
        let mut sizes = Vec::new();
        let mut block_at = vec![0; blocks.len()];
        let mut local_at = Vec::with_capacity(spec.len());
        for (d, axes) in spec.iter().enumerate() {
            for a in axes {
                let i = blocks.iter().position(|b| b == a).expect("a manual axis");
                block_at[i] = sizes.len();
                sizes.push(self.size_of(a));
            }
            local_at.push(sizes.len());
            sizes.push(x.shape()[d] / self.mesh.ir.group_size(axes));
        }
        if blocks.is_empty() {
            return x.clone();
        }
        let perm: Vec<usize> = block_at.into_iter().chain(local_at).collect();
        x.reshape(sizes).transpose(&perm)
    }

    /// The inverse of `to_blocked` for an output of local dims `local`, split as `spec`.
    fn unblocked(&self, y: &Tensor, spec: &[Vec<String>], local: &[usize]) -> Tensor {
        let blocks = self.blocks(spec);
        if blocks.is_empty() {
            return y.clone();
        }
        let mut perm = Vec::new();
        let mut global = Vec::with_capacity(spec.len());
        for (d, axes) in spec.iter().enumerate() {
            for a in axes {
                perm.push(blocks.iter().position(|b| b == a).expect("a manual axis"));
            }
            perm.push(blocks.len() + d);
            global.push(local[d] * self.mesh.ir.group_size(axes));
        }
        y.transpose(&perm).reshape(global)
    }
}

/// `x` under a sharding constraint on `mesh`.
fn constrain(x: &Tensor, dims: &[DimSharding], mesh: &IrMesh) -> Tensor {
    let s = Sharding {
        mesh: mesh.name.clone(),
        dims: dims.to_vec(),
        replicated: Vec::new(),
        unreduced: Vec::new(),
    };
    apply(Op::ShardingConstraint(s), &[x])
}

/// A collective of `g` (or of its bodies) over an axis that is not manual, as text.
fn foreign_collective(g: &tessera_ir::Graph, manual: &[String]) -> Option<String> {
    g.topo_order().into_iter().find_map(|id| match g.op(id) {
        Op::Collective(c) => c
            .axes()
            .iter()
            .find(|a| !manual.contains(a))
            .map(|a| format!("{} over \"{a}\"", g.op(id).name())),
        Op::Region(r) => r
            .regions()
            .into_iter()
            .find_map(|(_, b)| foreign_collective(b, manual)),
        // tidy: allow-wildcard(only collectives and the regions that may hold them)
        _ => None,
    })
}
