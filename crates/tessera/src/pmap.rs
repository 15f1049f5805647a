//! `pmap` and the collectives by axis name (`psum`, `pmean`, `pmax`, `pmin`, `all_gather`,
//! `ppermute`, `axis_index`), as JAX's.
//!
//! `pmap(axis, f)` maps the leading axis of every input over that many devices: `f` is traced
//! once on one device's slice, in a graph whose mesh has the one axis, so the collectives the
//! user writes are typed against it; the program runs on every device at once, and the outputs
//! are stacked back along a new leading axis.

use std::marker::PhantomData;
use std::panic::Location;
use std::sync::Arc;

use tessera_ir::{CollectiveOp, Data, Literal, Mesh, Op, ReduceKind, TensorType};
use tessera_runtime::try_device_count;

use crate::cache::{Cache, Signature};
use crate::error::{Error, Result, loc_text, raise};
use crate::pipeline::{Backend, Dump, Lowered, Pipeline, Target};
use crate::spmd::DeviceProgram;
use crate::tensor::Tensor;
use crate::trace::{apply, current_mesh};
use crate::tree::{self, Tree, TreeDef};

/// A compiled `pmap` program for one signature.
struct PmapEntry {
    out_def: TreeDef,
    program: DeviceProgram,
}

/// A pmapped closure.
pub struct Pmapped<F, In, Out> {
    f: F,
    axis: String,
    cache: Cache<PmapEntry>,
    _types: PhantomData<fn(In) -> Out>,
}

/// Like `jax.pmap(f, axis_name=axis)`.
pub fn pmap<In: Tree, Out: Tree, F: Fn(In) -> Out>(axis: &str, f: F) -> Pmapped<F, In, Out> {
    Pmapped {
        f,
        axis: axis.to_string(),
        cache: Cache::new("pmap".into()),
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

/// Stacks equal-typed values along a new leading axis (every device's output of one program,
/// so one type; a device whose output differs is an error, not a silent gap).
fn stack(parts: Vec<Literal>) -> Result<Literal> {
    let n = parts.len();
    let ty = parts[0].ty.clone();
    let mut dims = vec![n];
    dims.extend_from_slice(ty.dims());
    let mut data = Data::zeros(ty.dtype, 0);
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
        ty: TensorType::new(ty.dtype, dims),
        data,
    })
}

impl<In: Tree, Out: Tree, F: Fn(In) -> Out> Pmapped<F, In, Out> {
    /// Names the function in the IR and in dumps.
    pub fn named(mut self, name: &str) -> Self {
        self.cache.set_name(name);
        self
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
        let n = self.mapped_size(&leaves, &location)?;
        let sig = Signature::unplaced(&leaves, def);
        let dump = Dump::disabled(&self.cache.options.name);
        let (pipeline, lowered) = self.run_passes(&sig, n, dump, &location, true)?;
        pipeline.report_timing()?;
        Ok(lowered)
    }

    /// The size of the mapped (leading) axis, the same for every input and at most the
    /// number of devices.
    fn mapped_size(&self, leaves: &[Tensor], location: &str) -> Result<usize> {
        let fail = |message: String| Error::Op {
            op: "pmap".into(),
            message,
            location: location.to_string(),
        };
        if crate::trace::any_active() {
            return Err(fail(
                "pmap cannot run inside a trace (jit, grad or another pmap): call it at the top \
                 level, or use jit with inputs placed on a mesh (device_put) for a sharded \
                 program inside other transformations"
                    .into(),
            ));
        }
        let Some(first) = leaves.first() else {
            return Err(fail("no inputs to map over".into()));
        };
        let n = *first.shape().first().ok_or_else(|| {
            fail(format!(
                "input 0 ({}) has no leading axis to map",
                first.ty()
            ))
        })?;
        for (i, t) in leaves.iter().enumerate() {
            if t.shape().first() != Some(&n) {
                return Err(fail(format!(
                    "input {i} ({}) does not have the leading size {n} of input 0",
                    t.ty()
                )));
            }
        }
        let devices = try_device_count().map_err(fail)?;
        if n == 0 || n > devices {
            return Err(fail(format!(
                "the leading axis has size {n}, there are {devices} devices (set TESSERA_DEVICES)"
            )));
        }
        Ok(n)
    }

    /// Runs `f` on every slice of the leading axis, one device each.
    #[track_caller]
    pub fn call(&self, args: In) -> Result<Out> {
        let location = loc_text(Location::caller());
        let (leaves, def) = tree::flatten(&args);
        let n = self.mapped_size(&leaves, &location)?;
        let sig = Signature::unplaced(&leaves, def);
        let compiled = self
            .cache
            .get_or_compile(sig, |sig, dump| self.compile(sig, n, dump, &location))?;
        let hosts: Vec<Arc<Literal>> = leaves
            .iter()
            .map(|t| t.try_array().map(|a| a.literal_arc()))
            .collect::<Result<_>>()?;
        let inputs: Vec<Vec<Arc<Literal>>> = (0..n)
            .map(|p| {
                hosts
                    .iter()
                    .map(|h| Arc::new(leading_slice(h, p, n)))
                    .collect()
            })
            .collect();
        let per_device = compiled.program.run(inputs)?;
        let n_out = per_device[0].len();
        let mut columns: Vec<Vec<Literal>> = (0..n_out).map(|_| Vec::with_capacity(n)).collect();
        for outs in per_device {
            for (o, l) in outs.into_iter().enumerate() {
                columns[o].push(l.expect("pmap drops no output"));
            }
        }
        let tensors: Vec<Tensor> = columns
            .into_iter()
            .map(|c| stack(c).map(Tensor::from_literal))
            .collect::<Result<_>>()?;
        tree::unflatten(&compiled.out_def, tensors)
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
        let local: Vec<TensorType> = sig
            .types
            .iter()
            .map(|t| TensorType::new(t.dtype, t.dims()[1..].to_vec()))
            .collect();
        let options = &self.cache.options;
        let target = Target::PerDevice { mesh: mesh.clone() };
        let mut pipeline = Pipeline::new(target, options, location, dump);
        let trace =
            || crate::jit::trace_fn_on(&options.name, &self.f, &sig.def, &local, Some(mesh));
        let lowered = pipeline.lower(trace, keep_stages)?;
        Ok((pipeline, lowered))
    }

    fn compile(&self, sig: &Signature, n: usize, dump: Dump, location: &str) -> Result<PmapEntry> {
        let (mut pipeline, lowered) = self.run_passes(sig, n, dump, location, false)?;
        let programs = pipeline.schedule(&lowered, n, &[])?;
        let Target::PerDevice { mesh } = pipeline.target() else {
            unreachable!("pmap's pipeline runs for its mesh")
        };
        let program = DeviceProgram::new(programs, mesh.clone(), (0..n).collect());
        pipeline.report_timing()?;
        Ok(PmapEntry {
            out_def: lowered.out_def,
            program,
        })
    }
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
