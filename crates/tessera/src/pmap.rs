//! `pmap` and the collectives by axis name (`psum`, `pmean`, `pmax`, `pmin`, `all_gather`,
//! `ppermute`, `axis_index`), as JAX's.
//!
//! `pmap(axis, f)` maps the leading axis of every input over that many devices: `f` is traced
//! once on one device's slice, in a graph whose mesh has the one axis, so the collectives the
//! user writes are typed against it; the program runs on every device at once, and the outputs
//! are stacked back along a new leading axis. `in_axes` and `out_axes` (trees of axes, as
//! `vmap`'s) choose another dim to map, or `None`: an input every device gets whole, an
//! output that is the same on every device, returned once.

use std::marker::PhantomData;
use std::panic::Location;
use std::sync::{Arc, Mutex};

use tessera_interp::eval_op;
use tessera_ir::{CollectiveOp, Data, Literal, Mesh, Op, ReduceKind, Shape, TensorType};
use tessera_runtime::try_device_count;

use crate::cache::{Cache, Signature};
use crate::error::{Error, Result, loc_text, raise};
use crate::pipeline::{Backend, Dump, Lowered, Pipeline, Target};
use crate::spmd::DeviceProgram;
use crate::tensor::Tensor;
use crate::trace::{apply, current_mesh};
use crate::tree::{self, Tree, TreeDef};
use crate::vmap::Axes;

/// A compiled `pmap` program for one signature.
struct PmapEntry {
    out_def: TreeDef,
    program: DeviceProgram,
    /// The mapped dim of each input leaf (`in_axes` resolved for the signature's structure).
    spec: Vec<Option<usize>>,
    /// The devices dim of each output (`out_axes` resolved for `out_def`), or what was wrong
    /// with `out_axes`: reported by every call, after its run, as before it was kept here.
    out_spec: std::result::Result<Vec<Option<usize>>, String>,
}

/// What a pmap call keeps for the next, so a step allocates no slice and none of its
/// per-device lists (docs/PERFORMANCE.md, twenty-third pass).
#[derive(Default)]
struct PmapScratch {
    /// The last call's per-device slices of the mapped inputs (`None` for an unmapped one),
    /// refilled in place by the next call when no one else holds them: a step with its
    /// parameters chained allocates no slice. (They keep one copy of the mapped inputs alive
    /// between calls.)
    slices: Vec<Vec<Option<Arc<Literal>>>>,
    /// The devices' inputs and outputs, and each output's parts by device: emptied after a
    /// call, their allocations kept.
    inputs: Vec<Vec<Arc<Literal>>>,
    outputs: Vec<Vec<Option<Literal>>>,
    columns: Vec<Vec<Literal>>,
    /// The call's input leaves (flattened against the last call's structure: a call with the
    /// same structure builds no `TreeDef`), their host values, and its output tensors.
    leaves: Vec<Tensor>,
    hosts: Vec<Arc<Literal>>,
    tensors: Vec<Tensor>,
}

/// A pmapped closure.
pub struct Pmapped<F, In, Out> {
    f: F,
    axis: String,
    in_axes: Axes,
    out_axes: Axes,
    cache: Cache<PmapEntry>,
    /// What a call keeps for the next (`PmapScratch`).
    scratch: Mutex<PmapScratch>,
    _types: PhantomData<fn(In) -> Out>,
}

/// Like `jax.pmap(f, axis_name=axis)`: `f` runs on one device per slice of the inputs'
/// leading axis, whose size must be between 1 and [`device_count`](crate::device_count) (else
/// `call` returns an error).
///
/// ```
/// use tessera::prelude::*;
///
/// let n = device_count();
/// let x = Tensor::from_vec((0..n).map(|i| i as f32).collect(), [n, 1]);
/// let f = pmap("i", |x: Tensor| psum(&x, "i") - x); // the sum of the other devices' values
/// let total = (n * (n - 1) / 2) as f32;
/// let want: Vec<f32> = (0..n).map(|i| total - i as f32).collect();
/// assert_eq!(f.call(x).unwrap().to_vec::<f32>(), want);
/// ```
pub fn pmap<In: Tree, Out: Tree, F: Fn(In) -> Out>(axis: &str, f: F) -> Pmapped<F, In, Out> {
    crate::pipeline::prepare_compiler();
    Pmapped {
        f,
        axis: axis.to_string(),
        in_axes: Axes::Leaf(Some(0)),
        out_axes: Axes::Leaf(Some(0)),
        cache: Cache::new("pmap".into()),
        scratch: Mutex::default(),
        _types: PhantomData,
    }
}

/// Host-side slice `p` of `n` along the leading axis (row-major: one contiguous run).
fn leading_slice(lit: &Literal, p: usize, n: usize) -> Literal {
    let m = lit.ty.numel() / n;
    let data = lit.data.slice(p * m..(p + 1) * m);
    Literal {
        ty: TensorType::new(lit.ty.dtype, lit.ty.dims()[1..].to_vec()),
        data,
    }
}

/// Host-side slice `p` along dim `axis`, which is dropped (the interpreter's slice and
/// reshape, so the elements are exactly the input's).
fn axis_slice(lit: &Literal, axis: usize, p: usize) -> Result<Literal> {
    if axis == 0 {
        return Ok(leading_slice(lit, p, lit.ty.dims()[0]));
    }
    let rank = lit.ty.rank();
    let (mut start, mut limit) = (vec![0; rank], lit.ty.dims().to_vec());
    start[axis] = p;
    limit[axis] = p + 1;
    let mut one = limit.clone();
    one[axis] = 1;
    let s = eval_op(
        &Op::Slice {
            start,
            limit,
            stride: vec![1; rank],
        },
        &[lit],
        &TensorType::new(lit.ty.dtype, one),
    )?;
    let mut dims = lit.ty.dims().to_vec();
    dims.remove(axis);
    let shape = Shape::from(dims);
    Ok(eval_op(
        &Op::Reshape(shape.clone()),
        &[&s],
        &TensorType::new(lit.ty.dtype, shape),
    )?)
}

/// `axis_slice` into `prev`'s elements when no one else holds them and the slice has its
/// type (the last call's slice of the same input), else into a new literal.
fn axis_slice_reusing(
    prev: Option<Arc<Literal>>,
    lit: &Literal,
    axis: usize,
    p: usize,
) -> Result<Arc<Literal>> {
    if axis == 0
        && let Some(mut prev) = prev
    {
        let refilled = match Arc::get_mut(&mut prev) {
            Some(into)
                if into.ty.dtype == lit.ty.dtype && into.ty.dims() == &lit.ty.dims()[1..] =>
            {
                let m = into.ty.numel();
                let (from, to) = (p * m, (p + 1) * m);
                into.data
                    .copy_block(0, &lit.data, from..to)
                    .map_err(|e| Error::Device(format!("pmap: slicing an input: {e}")))?;
                true
            }
            _ => false,
        };
        if refilled {
            return Ok(prev);
        }
    }
    axis_slice(lit, axis, p).map(Arc::new)
}

/// The stacked value (devices along dim 0) with the devices' dim moved to `axis`.
fn move_leading(lit: Literal, axis: usize) -> Result<Literal> {
    if axis == 0 {
        return Ok(lit);
    }
    let dims = lit.ty.dims().to_vec();
    let mut perm: Vec<usize> = (1..dims.len()).collect();
    perm.insert(axis, 0);
    let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    Ok(eval_op(
        &Op::Transpose(perm),
        &[&lit],
        &TensorType::new(lit.ty.dtype, out),
    )?)
}

/// Stacks equal-typed values along a new leading axis (every device's output of one program,
/// so one type; a device whose output differs is an error, not a silent gap).
fn stack(parts: &[Literal]) -> Result<Literal> {
    let n = parts.len();
    let ty = parts[0].ty.clone();
    // Inline up to rank 4 (`Shape`): no allocation for a stacked output's shape.
    let mut dims = tessera_ir::types::Dims::new();
    dims.push(n);
    dims.extend_from_slice(ty.dims());
    // Room for every part at once: no reallocation while appending.
    let mut data = Data::try_with_capacity(ty.dtype, n.saturating_mul(ty.numel()))
        .map_err(|e| Error::Device(format!("pmap: stacking {n} outputs of type {ty}: {e}")))?;
    for (d, p) in parts.iter().enumerate() {
        if p.ty != ty {
            return Err(Error::Device(format!(
                "pmap: device {d} returned {} where device 0 returned {ty}",
                p.ty
            )));
        }
        data.extend(&p.data)
            .map_err(|e| Error::Device(format!("pmap: device {d}'s output: {e}")))?;
    }
    Ok(Literal {
        ty: TensorType::new(ty.dtype, Shape(dims)),
        data,
    })
}

impl<In: Tree, Out: Tree, F: Fn(In) -> Out> Pmapped<F, In, Out> {
    /// Which dim of each input is mapped over the devices: `0` (the default), another dim,
    /// `None` (every device gets the whole input), or a tree `axes![None, 0]`.
    pub fn in_axes(mut self, axes: impl Into<Axes>) -> Self {
        self.in_axes = axes.into();
        self.cache.clear();
        self
    }

    /// Where each output's devices dim goes; `None` for an output that is the same on every
    /// device (checked), returned once.
    pub fn out_axes(mut self, axes: impl Into<Axes>) -> Self {
        self.out_axes = axes.into();
        self.cache.clear();
        self
    }

    /// Names the function in the IR and in dumps.
    pub fn named(mut self, name: &str) -> Self {
        self.cache.set_name(name);
        self
    }

    /// Keeps at most `n` compiled programs, one per input signature (default
    /// [`DEFAULT_CACHE_CAPACITY`](crate::DEFAULT_CACHE_CAPACITY), 64); a new signature when the cache
    /// is full drops the least recently used program.
    pub fn cache_capacity(mut self, n: usize) -> Self {
        self.cache.set_capacity(n);
        self
    }

    /// How many compiled programs are kept now.
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Chooses the backend each device runs (Cranelift by default).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.cache.set_backend(backend);
        self
    }

    /// Turns the simplification pass (egg rewrites, CSE, DCE) on or off; on by default unless
    /// `TESSERA_SIMPLIFY=0`.
    pub fn simplify(mut self, on: bool) -> Self {
        self.cache.set_simplify(on);
        self
    }

    /// How many times the closure has been traced (once per new signature).
    pub fn trace_count(&self) -> usize {
        self.cache.trace_count()
    }

    /// Traces the per-device program for `args` and runs every pass up to code generation,
    /// as `call` does, without running it: `stages()` holds every stage's graph, the last one
    /// the program each device runs.
    #[track_caller]
    pub fn lower(&self, args: &In) -> Result<Lowered> {
        let location = loc_text(Location::caller());
        let (leaves, def) = tree::flatten(args);
        let (n, _) = self.mapped_size(&leaves, &def, &|| location.clone())?;
        let sig = Signature::unplaced(&leaves, def);
        let dump = Dump::disabled(&self.cache.options.name);
        let (pipeline, lowered) = self.run_passes(&sig, n, dump, &location, true)?;
        pipeline.report_timing()?;
        Ok(lowered)
    }

    /// The size of the mapped axis (the same for every mapped input, at most the number of
    /// devices) and the mapped dim of each input leaf.
    fn mapped_size(
        &self,
        leaves: &[Tensor],
        def: &TreeDef,
        location: &dyn Fn() -> String,
    ) -> Result<(usize, Vec<Option<usize>>)> {
        let fail = |message: String| Error::Op {
            op: "pmap".into(),
            message,
            location: location(),
        };
        top_level(location)?;
        let spec = self
            .in_axes
            .resolve(def)
            .map_err(|m| fail(format!("in_axes: {m}")))?;
        let mut size: Option<(usize, usize)> = None;
        for (i, (t, a)) in leaves.iter().zip(&spec).enumerate() {
            let Some(a) = *a else { continue };
            let Some(&n) = t.shape().get(a) else {
                let what = if a == 0 {
                    "no leading axis".to_string()
                } else {
                    format!("no dim {a}")
                };
                return Err(fail(format!("input {i} ({}) has {what} to map", t.ty())));
            };
            match size {
                None => size = Some((n, i)),
                Some((m, j)) if m != n => {
                    // The paths only for the message: a call builds none.
                    let paths = def.leaf_paths();
                    return Err(fail(format!(
                        "input {i} ({}) does not have the leading size {m} of input {j} ({}) \
                         along its mapped dim {a} (input paths {} and {})",
                        t.ty(),
                        leaves[j].ty(),
                        paths[i],
                        paths[j]
                    )));
                }
                Some(_) => {}
            }
        }
        let Some((n, _)) = size else {
            return Err(fail(
                "no input is mapped (in_axes is None for every one, or there are no inputs)".into(),
            ));
        };
        crate::distributed::auto().map_err(fail)?;
        let devices = try_device_count().map_err(fail)?;
        if n == 0 || n > devices {
            return Err(fail(format!(
                "the mapped axis has size {n}, there are {devices} devices (set TESSERA_DEVICES)"
            )));
        }
        Ok((n, spec))
    }

    /// Runs `f` on every slice of the mapped axis, one device each.
    #[track_caller]
    pub fn call(&self, args: In) -> Result<Out> {
        // The caller's `file:line` as text only where an error or a compilation needs it.
        let caller = Location::caller();
        let location = || loc_text(caller);
        let mut kept = match self.scratch.try_lock() {
            Ok(mut k) => std::mem::take(&mut *k),
            Err(_) => PmapScratch::default(),
        };
        let out = self.call_kept(args, &mut kept, &location);
        // The slices are kept (the unmapped inputs are the caller's); the lists emptied.
        let PmapScratch {
            slices,
            inputs,
            outputs,
            columns,
            leaves,
            hosts,
            tensors,
        } = &mut kept;
        if let Ok((compiled, _)) = &out {
            slices.resize_with(inputs.len(), Vec::new);
            for (kept, ins) in slices.iter_mut().zip(inputs.iter_mut()) {
                kept.clear();
                kept.extend(ins.drain(..).zip(&compiled.spec).map(|(l, a)| a.map(|_| l)));
            }
        }
        inputs.iter_mut().for_each(Vec::clear);
        outputs.iter_mut().for_each(Vec::clear);
        columns.iter_mut().for_each(Vec::clear);
        leaves.clear();
        hosts.clear();
        tensors.clear();
        if let Ok(mut k) = self.scratch.try_lock() {
            *k = kept;
        }
        out.map(|(_, out)| out)
    }

    /// `call` on the vectors `kept` holds: the program (the last call's when the structure
    /// and types are the same, found without building a `TreeDef`), its run, and its outputs.
    /// When there is a last call but not the same structure, the arguments are flattened a
    /// second time, into a `TreeDef` (as `jit` does): a hand-written `flatten_into` runs twice.
    fn call_kept(
        &self,
        args: In,
        kept: &mut PmapScratch,
        location: &dyn Fn() -> String,
    ) -> Result<(std::rc::Rc<PmapEntry>, Out)> {
        let compiled = match self.cache.last_hit_of(&args, &mut kept.leaves, false) {
            Some(hit) => {
                // What `mapped_size` checks of every call (the rest is the signature's).
                top_level(location)?;
                hit
            }
            None => {
                kept.leaves.clear();
                let def = args.flatten_into(&mut kept.leaves);
                let mapped = self.mapped_size(&kept.leaves, &def, location)?;
                let sig = Signature::unplaced(&kept.leaves, def);
                self.cache.get_or_compile(sig, |sig, dump| {
                    self.compile(sig, mapped, dump, &location())
                })?
            }
        };
        drop(args);
        let mut hosts = std::mem::take(&mut kept.hosts);
        hosts.clear();
        let host_values = (kept.leaves.iter()).try_for_each(|t| {
            hosts.push(t.try_array()?.literal_arc());
            Ok(())
        });
        let out = host_values.and_then(|()| self.call_on(&compiled, &hosts, kept, location));
        kept.hosts = hosts;
        out?;
        let out = tree::unflatten_drain(&compiled.out_def, &mut kept.tensors)?;
        Ok((compiled, out))
    }

    /// The run of one call on `kept`'s vectors: each device's inputs (its mapped slices
    /// refilled), the launch, and the outputs stacked (or checked alike, `out_axes` None).
    fn call_on(
        &self,
        compiled: &PmapEntry,
        hosts: &[Arc<Literal>],
        kept: &mut PmapScratch,
        location: &dyn Fn() -> String,
    ) -> Result<()> {
        let positions = &compiled.program.positions;
        let spec = &compiled.spec;
        let PmapScratch {
            slices,
            inputs,
            outputs,
            columns,
            tensors,
            ..
        } = kept;
        inputs.resize_with(positions.len(), Vec::new);
        for (k, (&p, ins)) in positions.iter().zip(inputs.iter_mut()).enumerate() {
            ins.clear();
            let mut prev = slices.get_mut(k).map(|v| v.iter_mut());
            for (h, a) in hosts.iter().zip(spec) {
                let prev = prev
                    .as_mut()
                    .and_then(Iterator::next)
                    .and_then(Option::take);
                ins.push(match a {
                    Some(a) => axis_slice_reusing(prev, h, *a, p)?,
                    None => h.clone(),
                });
            }
        }
        {
            let _span = tracing::debug_span!("launch", function = self.cache.options.name.as_str())
                .entered();
            compiled.program.run(inputs, outputs)?;
            *outputs = crate::distributed::gather_positions(
                &compiled.program.devices,
                std::mem::take(outputs),
            )?;
        }
        let n_out = outputs[0].len();
        columns.truncate(n_out);
        columns.resize_with(n_out, || Vec::with_capacity(outputs.len()));
        for outs in outputs.iter_mut() {
            for (o, l) in outs.drain(..).enumerate() {
                columns[o].push(l.expect("pmap drops no output"));
            }
        }
        // A device's outputs, once stacked, go back to its program's output pool (this
        // process's devices' own; the others' were gathered from other processes).
        let recycle = |parts: &mut Vec<Literal>| {
            for (p, part) in parts.drain(..).enumerate() {
                if let Ok(k) = positions.binary_search(&p) {
                    compiled.program.recycle(k, part.data);
                }
            }
        };
        let out_spec = compiled.out_spec.as_ref().map_err(|m| Error::Op {
            op: "pmap".into(),
            message: format!("out_axes: {m}"),
            location: location(),
        })?;
        tensors.clear();
        for (o, (c, a)) in columns.iter_mut().zip(out_spec).enumerate() {
            tensors.push(match a {
                Some(a) => {
                    let stacked = stack(c)?;
                    recycle(c);
                    move_leading(stacked, *a).map(Tensor::from_literal)?
                }
                None => unmapped(c, o, &location()).map(Tensor::from_literal)?,
            });
        }
        Ok(())
    }

    /// Traces the per-device program (each input without its leading axis, in a graph whose
    /// mesh has the one axis of size `n`) and runs the pipeline's passes on it.
    fn run_passes<'a>(
        &'a self,
        sig: &Signature,
        n: usize,
        dump: Dump,
        location: &'a str,
        keep_stages: bool,
    ) -> Result<(Pipeline<'a>, Lowered)> {
        let mesh = Mesh::new("pmap", vec![(self.axis.clone(), n)]);
        let spec = self.in_axes.resolve(&sig.def).map_err(|m| Error::Op {
            op: "pmap".into(),
            message: format!("in_axes: {m}"),
            location: location.to_string(),
        })?;
        let local: Vec<TensorType> = sig
            .types
            .iter()
            .zip(&spec)
            .map(|(t, a)| match a {
                Some(a) => {
                    let mut dims = t.dims().to_vec();
                    dims.remove(*a);
                    TensorType::new(t.dtype, dims)
                }
                None => t.clone(),
            })
            .collect();
        let options = &self.cache.options;
        let target = Target::PerDevice { mesh: mesh.clone() };
        let mut pipeline = Pipeline::new(target, options, location, dump);
        let trace =
            || crate::jit::trace_fn_on(&options.name, &self.f, &sig.def, &local, Some(mesh), None);
        let lowered = pipeline.lower(trace, keep_stages)?;
        Ok((pipeline, lowered))
    }

    /// The program for `sig`, whose mapped size and input dims `mapped_size` found.
    fn compile(
        &self,
        sig: &Signature,
        (n, spec): (usize, Vec<Option<usize>>),
        dump: Dump,
        location: &str,
    ) -> Result<PmapEntry> {
        let (mut pipeline, lowered) = self.run_passes(sig, n, dump, location, false)?;
        let devices: Vec<usize> = (0..n).collect();
        let programs = pipeline.schedule_on(&lowered, &devices, &[], location)?;
        let Target::PerDevice { mesh } = pipeline.target() else {
            unreachable!("pmap's pipeline runs for its mesh")
        };
        let program = DeviceProgram::new(programs, mesh.clone(), devices);
        pipeline.report_timing()?;
        Ok(PmapEntry {
            out_spec: self.out_axes.resolve(&lowered.out_def),
            out_def: lowered.out_def,
            program,
            spec,
        })
    }
}

/// An error unless the call is outside every trace.
fn top_level(location: &dyn Fn() -> String) -> Result<()> {
    if crate::trace::any_active() {
        return Err(Error::Op {
            op: "pmap".into(),
            message: "pmap cannot run inside a trace (jit, grad or another pmap): call it at \
                      the top level, or use jit with inputs placed on a mesh (device_put) for \
                      a sharded program inside other transformations"
                .into(),
            location: location(),
        });
    }
    Ok(())
}

/// An output with `out_axes` `None`: every device's value, which must all be the same.
fn unmapped(parts: &mut Vec<Literal>, output: usize, location: &str) -> Result<Literal> {
    for (d, p) in parts.iter().enumerate().skip(1) {
        if p.ty != parts[0].ty || !p.data.bits_eq(&parts[0].data) {
            return Err(Error::Op {
                op: "pmap".into(),
                message: format!(
                    "out_axes is None for output {output}, but device {d}'s value differs from \
                     device 0's (an unmapped output must be the same on every device)"
                ),
                location: location.to_string(),
            });
        }
    }
    Ok(parts.swap_remove(0))
}

/// The size of a named axis of the enclosing pmap, or an error naming the caller.
#[track_caller]
fn axis_size(op: &str, axis: &str) -> usize {
    let location = loc_text(Location::caller());
    match current_mesh().and_then(|m| m.axis_size(axis)) {
        Some(n) => n,
        None => raise(Error::Op {
            op: op.into(),
            message: format!(
                "axis \"{axis}\" is not in scope: collectives by axis name run inside pmap over that axis"
            ),
            location,
        }),
    }
}

/// `lax.psum`: the sum over the devices of `axis`.
#[track_caller]
pub fn psum(x: &Tensor, axis: &str) -> Tensor {
    axis_size("psum", axis);
    apply(
        Op::Collective(CollectiveOp::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec![axis.into()],
        }),
        &[x],
    )
}

/// `lax.pmean`: the mean over the devices of `axis` (f32 for an integer or bool `x`, as JAX's
/// true division gives, never a truncated integer).
#[track_caller]
pub fn pmean(x: &Tensor, axis: &str) -> Tensor {
    if !x.dtype().is_float() {
        return pmean(&x.astype(tessera_ir::DType::F32), axis);
    }
    let n = axis_size("pmean", axis);
    let s = psum(x, axis);
    let d = s.scalar_like(n as f64);
    Tensor::div(&s, &d)
}

/// `lax.pmax`.
#[track_caller]
pub fn pmax(x: &Tensor, axis: &str) -> Tensor {
    axis_size("pmax", axis);
    apply(
        Op::Collective(CollectiveOp::AllReduce {
            kind: ReduceKind::Max,
            axes: vec![axis.into()],
        }),
        &[x],
    )
}

/// `lax.pmin`.
#[track_caller]
pub fn pmin(x: &Tensor, axis: &str) -> Tensor {
    axis_size("pmin", axis);
    apply(
        Op::Collective(CollectiveOp::AllReduce {
            kind: ReduceKind::Min,
            axes: vec![axis.into()],
        }),
        &[x],
    )
}

/// `lax.all_gather`: every device's value, stacked along a new leading axis.
#[track_caller]
pub fn all_gather(x: &Tensor, axis: &str) -> Tensor {
    axis_size("all_gather", axis);
    let mut dims = vec![1];
    dims.extend_from_slice(x.shape());
    let x1 = x.reshape(dims);
    apply(
        Op::Collective(CollectiveOp::AllGather {
            dim: 0,
            axes: vec![axis.into()],
        }),
        &[&x1],
    )
}

/// `lax.ppermute`: device `src` sends its value to device `dst` for each pair; devices that
/// receive nothing get zeros.
#[track_caller]
pub fn ppermute(x: &Tensor, axis: &str, perm: &[(usize, usize)]) -> Tensor {
    axis_size("ppermute", axis);
    apply(
        Op::Collective(CollectiveOp::CollectivePermute {
            axes: vec![axis.into()],
            pairs: perm.to_vec(),
        }),
        &[x],
    )
}

/// `lax.axis_index`: this device's index along `axis` (i32).
#[track_caller]
pub fn axis_index(axis: &str) -> Tensor {
    axis_size("axis_index", axis);
    apply(
        Op::Collective(CollectiveOp::AxisIndex {
            axes: vec![axis.into()],
        }),
        &[],
    )
}

/// `lax.psum_scatter(x, axis, scatter_dimension=dim, tiled=True)`: the sum over the devices of
/// `axis`, of which each device keeps its chunk of `dim`.
#[track_caller]
pub fn psum_scatter(x: &Tensor, axis: &str, dim: usize) -> Tensor {
    axis_size("psum_scatter", axis);
    apply(
        Op::Collective(CollectiveOp::ReduceScatter {
            kind: ReduceKind::Sum,
            dim,
            axes: vec![axis.into()],
        }),
        &[x],
    )
}

/// `lax.all_to_all(x, axis, split_axis, concat_axis, tiled=True)`: `split` is cut into one
/// chunk per device of `axis`; chunk `j` goes to device `j`, which concatenates what it
/// receives along `concat`.
#[track_caller]
pub fn all_to_all(x: &Tensor, axis: &str, split: usize, concat: usize) -> Tensor {
    axis_size("all_to_all", axis);
    apply(
        Op::Collective(CollectiveOp::AllToAll {
            split_dim: split,
            concat_dim: concat,
            axes: vec![axis.into()],
        }),
        &[x],
    )
}
