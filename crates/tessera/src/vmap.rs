//! `vmap`: trace the per-example function, run the batching pass on its graph, and replay the
//! result.
//!
//! As `grad` does, `vmap(f).call(&args)` traces `f` in a trace of its own on one example of
//! each argument (the mapped dim removed), runs `tessera_autodiff::batch` on that graph, and
//! replays the batched graph: eagerly on concrete arguments, or into the enclosing trace (a
//! `vmap` inside `jit`, `grad` or another `vmap`), so `vmap(grad(f))`, `grad(vmap(f))` and
//! nested `vmap`s compose. With an axis name, the per-example trace's mesh gains that axis
//! (of the batch size), so `psum(x, name)` and the other collectives by name type-check inside
//! `f`; the pass turns them into ops over the batch dim (JAX's semantics).
//!
//! `in_axes` and `out_axes` are trees of axes ([`Axes`]), prefixes of the argument and output
//! trees: a leaf applies to every tensor below it, `None` broadcasts (the argument is the same
//! for every example; the output does not depend on the batch).

use std::marker::PhantomData;
use std::panic::Location;

use tessera_ir::{Mesh, NodeId, TensorType};

use crate::error::{Error, catch, loc_text, raise};
use crate::grad::replay;
use crate::tensor::Tensor;
use crate::trace::{self, current_mesh};
use crate::tree::{self, Tree, TreeDef};

/// A tree of axes, JAX's `in_axes`/`out_axes`: `Leaf(Some(d))` maps dim `d` of every tensor
/// below it, `Leaf(None)` none; `Node` has one child per child of the tree it is matched with
/// (a tuple's elements, a struct's fields in order, a `Vec`'s items).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Axes {
    /// The mapped dim of every tensor below it (`None`: not mapped; an input is shared by
    /// every lane).
    Leaf(Option<usize>),
    /// One child per child of the tree it is matched with; `axes![..]` builds one.
    Node(Vec<Axes>),
}

impl From<usize> for Axes {
    fn from(d: usize) -> Axes {
        Axes::Leaf(Some(d))
    }
}

impl From<Option<usize>> for Axes {
    fn from(d: Option<usize>) -> Axes {
        Axes::Leaf(d)
    }
}

impl From<Vec<Axes>> for Axes {
    fn from(children: Vec<Axes>) -> Axes {
        Axes::Node(children)
    }
}

/// `axes![None, 0, 0]`: a node of axes, each entry a dim, `None`, or a nested `axes![..]`.
#[macro_export]
macro_rules! axes {
    ($($e:expr),* $(,)?) => {
        $crate::vmap::Axes::Node(vec![$($crate::vmap::Axes::from($e)),*])
    };
}

impl Axes {
    /// A short text: `(None, 0, (1, None))`.
    pub fn describe(&self) -> String {
        match self {
            Axes::Leaf(Some(d)) => d.to_string(),
            Axes::Leaf(None) => "None".into(),
            Axes::Node(c) => {
                let inner: Vec<String> = c.iter().map(Axes::describe).collect();
                format!("({})", inner.join(", "))
            }
        }
    }

    /// One axis per leaf of `def`, or why the axes are not a prefix of `def`.
    pub fn resolve(&self, def: &TreeDef) -> std::result::Result<Vec<Option<usize>>, String> {
        let mut out = Vec::with_capacity(def.num_leaves());
        self.resolve_into(def, &mut out)?;
        Ok(out)
    }

    fn resolve_into(
        &self,
        def: &TreeDef,
        out: &mut Vec<Option<usize>>,
    ) -> std::result::Result<(), String> {
        match (self, def) {
            (Axes::Leaf(a), d) => {
                out.extend(std::iter::repeat_n(*a, d.num_leaves()));
                Ok(())
            }
            (Axes::Node(c), TreeDef::Node { children, .. }) if c.len() == children.len() => {
                for (a, d) in c.iter().zip(children) {
                    a.resolve_into(d, out)?;
                }
                Ok(())
            }
            (Axes::Node(_), d) => Err(format!(
                "the axes {} do not match the tree {} (each node of the axes needs one entry \
                 per child)",
                self.describe(),
                d.describe()
            )),
        }
    }
}

/// A vmapped function; see the module doc. Configure with [`Vmapped::in_axes`],
/// [`Vmapped::out_axes`], [`Vmapped::axis_name`], [`Vmapped::axis_size`]; apply with
/// [`Vmapped::call`].
pub struct Vmapped<F, In, Out> {
    f: F,
    in_axes: Axes,
    out_axes: Axes,
    axis_name: Option<String>,
    axis_size: Option<usize>,
    _types: PhantomData<fn(&In) -> Out>,
}

/// `jax.vmap(f)`: maps `f` over dim 0 of every argument, stacking the outputs along dim 0.
/// Configure with `in_axes`/`out_axes`/`axis_name`, then apply with [`Vmapped::call`].
///
/// ```
/// use tessera::prelude::*;
///
/// let dot = |(a, b): &(Tensor, Tensor)| (a * b).sum();
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
/// let b = Tensor::from_vec(vec![1.0f32, 10.0], [2]);
/// // in_axes=(0, None): one dot per row of `a`, `b` shared.
/// let out = vmap(dot).in_axes(axes![0, None]).call(&(a, b));
/// assert_eq!(out.to_vec::<f32>(), vec![21.0, 43.0]);
/// ```
pub fn vmap<In: Tree, Out: Tree, F: Fn(&In) -> Out>(f: F) -> Vmapped<F, In, Out> {
    Vmapped {
        f,
        in_axes: Axes::Leaf(Some(0)),
        out_axes: Axes::Leaf(Some(0)),
        axis_name: None,
        axis_size: None,
        _types: PhantomData,
    }
}

impl<In: Tree, Out: Tree, F: Fn(&In) -> Out> Vmapped<F, In, Out> {
    /// Which dim of each argument is mapped: `0`, `None`, or a tree `axes![None, 0, 0]`.
    pub fn in_axes(mut self, axes: impl Into<Axes>) -> Self {
        self.in_axes = axes.into();
        self
    }

    /// Where each output's batch dim goes (`None`: the output does not depend on the batch
    /// and is returned once).
    pub fn out_axes(mut self, axes: impl Into<Axes>) -> Self {
        self.out_axes = axes.into();
        self
    }

    /// Names the mapped axis, so that `psum(x, name)`, `pmean`, `pmax`, `pmin`, `all_gather`,
    /// `ppermute`, `psum_scatter`, `all_to_all` and `axis_index` inside `f` run over the batch.
    pub fn axis_name(mut self, name: &str) -> Self {
        self.axis_name = Some(name.to_string());
        self
    }

    /// The batch size when no argument is mapped (JAX's `axis_size`).
    pub fn axis_size(mut self, n: usize) -> Self {
        self.axis_size = Some(n);
        self
    }

    /// Applies the vmapped function. Bad axes, arguments whose mapped dims disagree in size,
    /// or an axes tree that does not match the arguments are errors naming the caller's line
    /// (inside `jit`, returned by `call`; eagerly, a panic).
    #[track_caller]
    pub fn call(&self, args: &In) -> Out {
        let location = loc_text(Location::caller());
        let fail = |message: String| -> ! {
            raise(Error::Op {
                op: "vmap".into(),
                message,
                location: location.clone(),
            })
        };
        let (leaves, def) = tree::flatten(args);
        let in_spec = self
            .in_axes
            .resolve(&def)
            .unwrap_or_else(|m| fail(format!("in_axes: {m}")));
        let paths = def.leaf_paths();
        let mut size: Option<(usize, usize)> = None;
        for (i, (t, a)) in leaves.iter().zip(&in_spec).enumerate() {
            let Some(a) = *a else { continue };
            if a >= t.rank() {
                fail(format!(
                    "in_axes maps dim {a} of argument {} ({}), which has rank {}",
                    paths[i],
                    t.ty(),
                    t.rank()
                ));
            }
            let n = t.shape()[a];
            match size {
                None => size = Some((n, i)),
                Some((m, j)) if m != n => fail(format!(
                    "the mapped dims differ in size: argument {} ({}) has {m} along dim {}, \
                     argument {} ({}) has {n} along dim {a}",
                    paths[j],
                    leaves[j].ty(),
                    in_spec[j].unwrap_or(0),
                    paths[i],
                    t.ty()
                )),
                Some(_) => {}
            }
        }
        let size = match (size, self.axis_size) {
            (Some((n, _)), Some(m)) if n != m => fail(format!(
                "axis_size is {m}, the mapped arguments have size {n}"
            )),
            (Some((n, _)), _) => n,
            (None, Some(m)) => m,
            (None, None) => {
                fail("no argument is mapped (in_axes is None for every one): give axis_size".into())
            }
        };
        let types: Vec<TensorType> = leaves
            .iter()
            .zip(&in_spec)
            .map(|(t, a)| match a {
                Some(a) => {
                    let mut dims = t.shape().to_vec();
                    dims.remove(*a);
                    TensorType::new(t.dtype(), dims)
                }
                None => t.ty().clone(),
            })
            .collect();
        let outer = current_mesh();
        let mesh = match &self.axis_name {
            None => outer,
            Some(name) => {
                if outer.as_ref().is_some_and(|m| m.axis_size(name).is_some()) {
                    fail(format!(
                        "axis_name \"{name}\" is already an axis of the enclosing mesh or vmap"
                    ));
                }
                let (mname, mut axes) = match outer {
                    Some(m) => (m.name, m.axes),
                    None => ("vmap".to_string(), Vec::new()),
                };
                axes.push((name.clone(), size));
                Some(Mesh::new(mname, axes))
            }
        };

        let (guard, tracers) = trace::begin_on("vmap", &types, mesh);
        let ex: In = tree::unflatten(&def, tracers).unwrap_or_else(|e| raise(e));
        let out = match catch(|| (self.f)(&ex)) {
            Ok(out) => out,
            Err(e) => {
                drop(guard);
                raise(e)
            }
        };
        let (out_leaves, out_def) = tree::flatten(&out);
        let rec = catch(|| trace::finish(guard, &out_leaves)).unwrap_or_else(|e| raise(e));
        let out_spec = self
            .out_axes
            .resolve(&out_def)
            .unwrap_or_else(|m| fail(format!("out_axes: {m}")));
        let mut all_in = in_spec;
        all_in.extend(std::iter::repeat_n(None, rec.captures.len()));
        let batched = tessera_autodiff::batch(
            &rec.graph,
            &all_in,
            size,
            self.axis_name.as_deref(),
            &out_spec,
        )
        .unwrap_or_else(|e| fail(e.to_string()));

        let mut env = std::collections::HashMap::new();
        let params: Vec<NodeId> = batched.params().to_vec();
        for (p, t) in params.iter().zip(leaves.iter().chain(&rec.captures)) {
            env.insert(*p, t.clone());
        }
        replay(&batched, &batched.topo_order(), &mut env);
        let outs: Vec<Tensor> = batched.outputs().iter().map(|o| env[o].clone()).collect();
        tree::unflatten(&out_def, outs).unwrap_or_else(|e| raise(e))
    }
}
