//! `jit`: trace a closure once per input signature, run the compiled program on every call.
//!
//! The cache key is the input tree's structure, each leaf's type, and each leaf's placement on a
//! mesh. A miss traces the closure with one tracer per leaf and runs the pipeline (partitioned
//! for every device when the inputs are placed on a mesh); a hit goes straight to the
//! executable.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use tessera_ir::{Graph, Literal, TensorType};
use tessera_runtime::{Array, PlacedShell, ShardSpec, ShardsShell, Shell};
use tessera_shard::Spec;

pub use crate::pipeline::Lowered;

use crate::cache::{Cache, Signature};
use crate::check::Checker;
use crate::error::{Error, Result, catch, catch_eager};
use crate::pipeline::{Backend, BackendProgram, Dump, Pipeline, Target};
use crate::sharding::{Shardings, device_put};
use crate::spmd::DeviceProgram;
use crate::tensor::Tensor;
use crate::trace;
use crate::tree::{self, Tree, TreeDef};

/// A compiled `jit` program for one signature.
enum JitEntry {
    /// One device: the program runs on the calling thread.
    Single {
        out_def: TreeDef,
        program: BackendProgram,
        checker: Option<Checker>,
    },
    /// Sharded inputs: the per-device program runs on every device of the mesh.
    Sharded {
        out_def: TreeDef,
        program: DeviceProgram,
        out_types: Vec<TensorType>,
        out_specs: Vec<Spec>,
        /// Each output's layout, built once: every call's outputs share it.
        out_layouts: Vec<Arc<ShardSpec>>,
        checker: Option<Checker>,
    },
}

/// The mesh the placed leaves share (with its device list), or an error when they disagree.
fn common_mesh(placements: &[Option<Arc<ShardSpec>>], location: &str) -> Result<Option<ShardSpec>> {
    let mut mesh: Option<&ShardSpec> = None;
    for p in placements.iter().flatten().map(Arc::as_ref) {
        match mesh {
            None => mesh = Some(p),
            Some(m) if m.mesh == p.mesh && m.devices == p.devices => {}
            Some(m) => {
                return Err(Error::Op {
                    op: "jit".into(),
                    message: format!(
                        "inputs live on different meshes ({:?} and {:?}); device_put them on one",
                        m.mesh.axes, p.mesh.axes
                    ),
                    location: location.into(),
                });
            }
        }
    }
    Ok(mesh.cloned())
}

/// What a signature compiles for: one device, or the mesh its placed leaves share with each
/// leaf's per-dim axes (replicated for host values).
fn target_of(sig: &Signature, location: &str) -> Result<Target> {
    Ok(match common_mesh(&sig.placements, location)? {
        None => Target::Single,
        Some(mesh) => Target::Sharded {
            mesh,
            specs: sig
                .types
                .iter()
                .zip(&sig.placements)
                .map(|(t, p)| match p {
                    Some(p) => p.dims.clone(),
                    None => vec![Vec::new(); t.rank()],
                })
                .collect(),
        },
    })
}

/// A jitted closure. `call` compiles on the first call with each new input signature.
pub struct Jitted<F, In, Out> {
    f: F,
    cache: Cache<JitEntry>,
    /// Checked mode: `None` follows `TESSERA_CHECK`.
    check: Option<bool>,
    /// `in_shardings`/`out_shardings`, JAX's.
    in_shardings: Option<Shardings>,
    out_shardings: Option<Shardings>,
    /// The vectors a call reuses from the last one.
    scratch: RefCell<CallScratch>,
    _types: PhantomData<fn(In) -> Out>,
}

/// What a call keeps for the next (issue 14): with them, a steady-state call of a one-device
/// program allocates only the outputs no given-up argument's allocations held
/// (`take_given_up`; `give_shards_up` on several devices). Every vector of values is emptied
/// at the end of a call (an error may leave outputs until the next); the given-up arguments'
/// shells (allocations holding no value) are kept for the next call's outputs.
#[derive(Default)]
struct CallScratch {
    /// The argument leaves.
    leaves: Vec<Tensor>,
    /// The leaves' host values, as the program reads them (see `relifetime`).
    inputs: Vec<&'static Literal>,
    /// The program's outputs.
    outputs: Vec<Literal>,
    /// A one-device mesh program's outputs.
    partial: Vec<Option<Literal>>,
    /// The output tensors, before they become the output tree.
    tensors: Vec<Tensor>,
    /// Donated arguments' allocations, emptied, for the next outputs (at most one per output).
    shells: Vec<Shell>,
    /// The same for a one-device mesh program's outputs.
    placed_shells: Vec<PlacedShell>,
    /// A multi-device program's inputs and outputs, by device (`DeviceProgram::run`).
    device_inputs: Vec<Vec<Arc<Literal>>>,
    device_outputs: Vec<Vec<Option<Literal>>>,
    /// The given-up arguments' allocations of a multi-device program (`give_shards_up`):
    /// replicated arrays', then split arrays'.
    shards_shells: [Vec<ShardsShell>; 2],
}

/// Gives the shards of each of `leaves` that no one else holds (an argument the caller moved
/// into the call and kept no clone of, nor of any of its shards) to the output pools of the
/// program's devices (`recycle(k, data)`: the `k`th of this process's devices), so their next
/// outputs are written there instead of allocated (and freed by the caller every step, which
/// faulted pages in again each step with two programs in one process: docs/PERFORMANCE.md,
/// twenty-second pass), and keeps its array's allocations for the next outputs of the same
/// layout (`shells`: the replicated ones, then the split ones; `placed`: an array of one
/// shard, a process's one device of a mesh over several processes; at most `keep` of each).
/// A replicated array's shards are one value, which goes to the first device, the one that
/// computes replicated outputs (`Pipeline::schedule`'s `first_only`).
fn give_shards_up(
    leaves: &mut Vec<Tensor>,
    keep: usize,
    (shells, placed): (&mut [Vec<ShardsShell>; 2], &mut Vec<PlacedShell>),
    recycle: impl Fn(usize, tessera_ir::Data),
) {
    for t in leaves.drain(..) {
        if t.try_array().ok().and_then(Array::shards).map(<[_]>::len) == Some(1) {
            if let Some((shell, data)) = t.into_placed_shell() {
                recycle(0, data);
                if placed.len() < keep {
                    placed.push(shell);
                }
            }
        } else if let Some(shell) = t.into_shards_shell(&recycle) {
            let kept = &mut shells[usize::from(!shell.layout().1)];
            if kept.len() < keep {
                kept.push(shell);
            }
        }
    }
}

/// Drops the leaves after a run, each through `split`: for a leaf no one else holds (an
/// argument the caller moved into the call and kept no clone of), `split` gives its buffer to
/// the program's pool and returns its allocations, kept in `shells` for the next outputs (at
/// most `keep`); a leaf another tensor shares is only dropped. So a loop that passes the
/// parameters back in allocates nothing for them in steady state, and no output buffer is
/// freed and allocated again every step (which glibc can give back to the system and fault
/// in again each time: docs/PERFORMANCE.md, twenty-second pass).
fn take_given_up<S>(
    leaves: &mut Vec<Tensor>,
    keep: usize,
    shells: &mut Vec<S>,
    split: impl Fn(Tensor) -> Option<S>,
) {
    for t in leaves.drain(..) {
        if let Some(shell) = split(t)
            && shells.len() < keep
        {
            shells.push(shell);
        }
    }
}

/// `v`, emptied, as a vector of references of another lifetime in the same allocation: an
/// in-place collect of an empty vector (same size and alignment), so a vector of borrowed
/// inputs is kept between calls without `unsafe`. `tests/allocations.rs` checks that it
/// allocates nothing.
fn relifetime<'b>(mut v: Vec<&Literal>) -> Vec<&'b Literal> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

/// Wraps `f` for tracing and compilation, like `jax.jit`. `f` takes one argument tree (a
/// tuple for several) and returns a tree; nothing runs until [`Jitted::call`].
///
/// ```
/// use tessera::prelude::*;
///
/// let f = jit(|(x, y): (Tensor, Tensor)| (&x * &y).sum() + 1.0);
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
/// assert_eq!(f.call((x.clone(), x.clone())).unwrap().item::<f32>(), 15.0);
/// f.call((x.clone(), x)).unwrap(); // the same signature: the cached program runs
/// assert_eq!(f.trace_count(), 1);
/// f.call((Tensor::ones([2]), Tensor::ones([2]))).unwrap(); // a new shape: traced again
/// assert_eq!(f.trace_count(), 2);
/// ```
pub fn jit<In: Tree, Out: Tree, F: Fn(In) -> Out>(f: F) -> Jitted<F, In, Out> {
    crate::pipeline::prepare_compiler();
    Jitted {
        cache: Cache::new(closure_name::<F>()),
        f,
        check: None,
        in_shardings: None,
        out_shardings: None,
        scratch: RefCell::default(),
        _types: PhantomData,
    }
}

/// A readable function name from a closure's type: `inspect::main::{{closure}}` gives `main`.
fn closure_name<F>() -> String {
    let full = std::any::type_name::<F>();
    let name = full
        .split("::")
        .filter(|s| !s.starts_with('{') && !s.is_empty())
        .last()
        .unwrap_or("f");
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() { "f".into() } else { clean }
}

/// The trace stage: `f` on tracers of the given types, in a graph with the given mesh (the
/// inputs' for a sharded `jit`, pmap's so its collectives type-check). Returns the graph and
/// the structure of `f`'s result.
pub(crate) fn trace_fn_on<In: Tree, Out: Tree>(
    name: &str,
    f: &impl Fn(In) -> Out,
    def: &TreeDef,
    types: &[TensorType],
    mesh: Option<tessera_ir::Mesh>,
    specs: Option<&[Spec]>,
) -> Result<(Graph, TreeDef)> {
    let ir_mesh = mesh.clone();
    let (guard, tracers) = trace::begin_on(name, types, mesh);
    if let (Some(specs), Some(m)) = (specs, &ir_mesh) {
        // On an Explicit mesh the inputs' shardings are their types.
        let shardings: Vec<_> = specs
            .iter()
            .map(|s| Some(tessera_ir::Sharding::closed(m, s)))
            .collect();
        trace::type_params(&guard, &shardings);
    }
    {
        // Name each parameter by its place in the argument tree.
        let mut g = guard.state.graph.borrow_mut();
        let params = g.params().to_vec();
        for (p, path) in params.into_iter().zip(def.leaf_paths()) {
            g.node_mut(p).loc = Some(path);
        }
    }
    let args: In = tree::unflatten(def, tracers)?;
    let out = catch(|| f(args))?;
    let (leaves, out_def) = tree::flatten(&out);
    let recorded = catch(|| trace::finish(guard, &leaves))?;
    if !recorded.captures.is_empty() {
        return Err(Error::Op {
            op: "jit".into(),
            message: "the function closes over tracers of an enclosing trace".into(),
            location: name.into(),
        });
    }
    Ok((recorded.graph, out_def))
}

/// Whether a sharding splits no dim.
fn is_replicated(spec: &Spec) -> bool {
    spec.iter().all(|axes| axes.is_empty())
}

impl<In: Tree, Out: Tree, F: Fn(In) -> Out> Jitted<F, In, Out> {
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

    /// JAX's `donate_argnums`, accepted for its API: a call already does what donation asks.
    /// `call` takes its arguments by value, so an argument moved into it cannot be used after
    /// (a compile error: use of a moved value); after the run, the buffer of every argument
    /// leaf no other tensor shares goes to the compiled program's output pool, and the next
    /// call's outputs of the same dtype and size are written into it (and wrapped in that
    /// tensor's own allocations) instead of new allocations, so a training loop that passes
    /// the parameters back in allocates nothing for them in steady state, donated or not. A
    /// leaf whose buffer another tensor still shares (a clone kept alive) is not reused: that
    /// tensor keeps its value. On a mesh of several devices each shard goes to its device's
    /// pool (a replicated value's to the first device's) when no one holds the array or any
    /// of its shards, and the array's allocations hold the next output of its layout.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let step = jit(|(w, g): (Tensor, Tensor)| &w - &g * 0.5).donate(&[0]);
    /// let mut w = Tensor::ones([3]);
    /// for _ in 0..3 {
    ///     w = step.call((w, Tensor::ones([3]))).unwrap();
    /// }
    /// assert_eq!(w.to_vec::<f32>(), [-0.5; 3]);
    /// ```
    pub fn donate(self, argnums: &[usize]) -> Self {
        let _ = argnums;
        self
    }

    /// Chooses the backend (Cranelift by default; the interpreter runs the very same program).
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

    /// Checked mode: every call also runs the reference interpreter and compares, op by op
    /// and output by output, and returns an error naming the first op (with its line, its
    /// operands and both values) whose compiled result is outside its stated bound. Off by
    /// default unless `TESSERA_CHECK=1`; slow (it is for finding a miscompilation, not for
    /// training).
    pub fn checked(mut self, on: bool) -> Self {
        self.check = Some(on);
        self.cache.clear();
        self
    }

    /// `jax.jit(f, in_shardings=..)`: where each argument leaf must be (one sharding for all, or
    /// `(&mesh, specs)`, a tree of specs that is a prefix of the arguments). A host value is
    /// placed so; a placed array elsewhere is an error naming the argument, as JAX rejects a
    /// committed array of another sharding.
    pub fn in_shardings(mut self, shardings: impl Into<Shardings>) -> Self {
        self.in_shardings = Some(shardings.into());
        self.cache.clear();
        self
    }

    /// `jax.jit(f, out_shardings=..)`: each output leaf is constrained to its sharding (the
    /// program reshards it there), so it comes back placed so.
    pub fn out_shardings(mut self, shardings: impl Into<Shardings>) -> Self {
        self.out_shardings = Some(shardings.into());
        self.cache.clear();
        self
    }

    /// The argument leaves where `in_shardings` wants them.
    fn place_inputs(
        &self,
        leaves: Vec<Tensor>,
        def: &TreeDef,
        location: &str,
    ) -> Result<Vec<Tensor>> {
        let Some(shardings) = &self.in_shardings else {
            return Ok(leaves);
        };
        let fail = |message: String| Error::Op {
            op: "jit".into(),
            message: format!("in_shardings: {message}"),
            location: location.into(),
        };
        let want = shardings.resolve(def).map_err(fail)?;
        let paths = def.leaf_paths();
        leaves
            .into_iter()
            .zip(want)
            .zip(paths)
            .map(|((t, w), path)| {
                if t.is_tracer() {
                    let at = format!("{location} (in_shardings)");
                    return Ok(crate::sharding::constrain_at(&t, Shardings::from(&w), at));
                }
                match t.sharding() {
                    None => catch_eager(|| device_put(t.clone(), &w)),
                    Some(have) => {
                        let rank = t.rank();
                        let same = have.mesh == w.mesh
                            && have.spec.padded(rank).ok() == w.spec.padded(rank).ok();
                        if same {
                            Ok(t)
                        } else {
                            Err(fail(format!(
                                "argument {path} ({}) is placed as {have}, but in_shardings \
                                 says {w}: reshard or device_put it first",
                                t.ty()
                            )))
                        }
                    }
                }
            })
            .collect()
    }

    /// The outputs constrained to `out_shardings`.
    fn constrain_outputs(&self, out: Out, location: &str) -> Out {
        let Some(shardings) = &self.out_shardings else {
            return out;
        };
        let (leaves, def) = tree::flatten(&out);
        let want = shardings.resolve(&def).unwrap_or_else(|m| {
            crate::error::raise(Error::Op {
                op: "jit".into(),
                message: format!("out_shardings: {m}"),
                location: location.into(),
            })
        });
        let constrained: Vec<Tensor> = leaves
            .iter()
            .zip(&want)
            .map(|(t, w)| {
                let at = format!("{location} (out_shardings)");
                crate::sharding::constrain_at(t, Shardings::from(w), at)
            })
            .collect();
        tree::unflatten(&def, constrained).unwrap_or_else(|e| crate::error::raise(e))
    }

    /// How many times the closure has been traced (once per new signature).
    pub fn trace_count(&self) -> usize {
        self.cache.trace_count()
    }

    /// Traces the closure for `args`' signature and runs every pass up to code generation,
    /// without running it: `stages()` holds every stage's graph, the last one the program
    /// `call` compiles for these arguments; `ir()` and `per_device_ir()` show the global and
    /// the per-device program as they run; `traced_ir()` shows it as traced. JAX's
    /// `jax.jit(f).lower(x)`.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let f = jit(|x: Tensor| (x * 2.0).tanh());
    /// let lowered = f.lower(&Tensor::ones([4])).unwrap();
    /// assert!(lowered.ir().contains("tanh"));
    /// assert_eq!(lowered.stages()[0].0, "trace");
    /// println!("{}", lowered.ir());
    /// ```
    #[track_caller]
    pub fn lower(&self, args: &In) -> Result<Lowered> {
        let location = crate::error::loc_text(std::panic::Location::caller());
        let (leaves, def) = tree::flatten(args);
        let leaves = self.place_inputs(leaves, &def, &location)?;
        let sig = Signature::placed(&leaves, def);
        let dump = Dump::disabled(&self.cache.options.name);
        let (pipeline, lowered) = self.run_passes(&sig, dump, &location, true)?;
        pipeline.report_timing()?;
        Ok(lowered)
    }

    /// Runs the closure compiled. Inside another trace (a `jit` in a `jit`, a `grad`), it is
    /// inlined into that trace instead. Inputs placed on a mesh run the partitioned program on
    /// every device of the mesh, and the outputs come back placed as propagation decided.
    /// An error while tracing (an op's type rule, a tree mismatch), compiling or running is
    /// returned as `Err`, not a panic.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let f = jit(|x: Tensor| (x.matmul(&x.t()), x.sum()));
    /// let (gram, total) = f.call(Tensor::ones([2, 3])).unwrap();
    /// assert_eq!((gram.shape(), total.item::<f32>()), (&[2, 2][..], 6.0));
    /// // x @ x is ill-typed for a [2, 3] x: the trace fails, and `call` says why.
    /// let bad = jit(|x: Tensor| x.matmul(&x));
    /// let err = bad.call(Tensor::ones([2, 3])).unwrap_err();
    /// assert!(err.to_string().contains("contracting dims differ"), "{err}");
    /// ```
    #[track_caller]
    pub fn call(&self, args: In) -> Result<Out> {
        // The caller's `file:line` as text only where an error or a compilation needs it: a
        // cache hit allocates nothing for it.
        let caller = std::panic::Location::caller();
        let location = || crate::error::loc_text(caller);
        if trace::any_active() {
            let (leaves, def) = tree::flatten(&args);
            let leaves = self.place_inputs(leaves, &def, &location())?;
            let args: In = tree::unflatten(&def, leaves)?;
            return Ok(self.constrain_outputs((self.f)(args), &location()));
        }
        let mut scratch = self.scratch.take();
        let out = self.call_concrete(args, &mut scratch, &location);
        scratch.leaves.clear();
        scratch.tensors.clear();
        // An error may leave a device's inputs (the arguments' shards) or outputs behind.
        scratch.device_inputs.iter_mut().for_each(Vec::clear);
        scratch.device_outputs.iter_mut().for_each(Vec::clear);
        *self.scratch.borrow_mut() = scratch;
        out
    }

    /// `call` outside any trace, on the vectors `scratch` keeps between calls.
    fn call_concrete(
        &self,
        args: In,
        scratch: &mut CallScratch,
        location: &dyn Fn() -> String,
    ) -> Result<Out> {
        let leaves = &mut scratch.leaves;
        // The last call's program, the structure compared while flattening (no `TreeDef`
        // built); otherwise the full signature.
        let hit = match self.in_shardings {
            Some(_) => None,
            None => self.cache.last_hit_of(&args, leaves, true),
        };
        let compiled = match hit {
            Some(hit) => {
                // The leaves hold the values now: a given-up buffer must have no other owner.
                drop(args);
                hit
            }
            None => {
                leaves.clear();
                let def = args.flatten_into(leaves);
                drop(args);
                // Placed as `in_shardings` says, the leaves may be the last call's after all.
                let placed_hit = match self.in_shardings {
                    Some(_) => {
                        *leaves = self.place_inputs(std::mem::take(leaves), &def, &location())?;
                        self.cache.last_hit(leaves, &def, true)
                    }
                    None => None,
                };
                match placed_hit {
                    Some(hit) => hit,
                    None => {
                        let sig = Signature::placed(leaves, def);
                        self.cache
                            .get_or_compile(sig, |sig, dump| self.compile(sig, dump, &location()))?
                    }
                }
            }
        };
        match compiled.as_ref() {
            JitEntry::Single {
                out_def,
                program,
                checker,
            } => {
                let mut inputs = relifetime(std::mem::take(&mut scratch.inputs));
                for t in leaves.iter() {
                    inputs.push(t.try_array()?.try_literal().map_err(|m| Error::Op {
                        op: "jit".into(),
                        message: format!("an input: {m}"),
                        location: location(),
                    })?);
                }
                let outputs = &mut scratch.outputs;
                outputs.clear();
                {
                    let _span =
                        tracing::debug_span!("launch", function = self.cache.options.name.as_str())
                            .entered();
                    program.run_into(&inputs, outputs)?;
                }
                if let Some(checker) = checker {
                    let want = checker.check_ops(&inputs)?;
                    checker.check_outputs(outputs, &want)?;
                }
                scratch.inputs = relifetime(inputs);
                let keep = outputs.len();
                take_given_up(leaves, keep, &mut scratch.shells, |t| {
                    let (shell, data) = t.into_shell()?;
                    program.recycle(data);
                    Some(shell)
                });
                let tensors = &mut scratch.tensors;
                for lit in outputs.drain(..) {
                    tensors.push(match scratch.shells.pop() {
                        Some(shell) if lit.check().is_ok() => Tensor::from_array(shell.fill(lit)),
                        // A literal that fails the check gets `from_literal`'s error.
                        _ => Tensor::from_literal(lit),
                    });
                }
                tree::unflatten_drain(out_def, tensors)
            }
            JitEntry::Sharded {
                out_def,
                program,
                out_types,
                out_specs,
                out_layouts,
                checker,
            } => {
                // One device: its program on the calling thread, on the kept vectors.
                if checker.is_none() && program.positions.len() == 1 {
                    let mut inputs = relifetime(std::mem::take(&mut scratch.inputs));
                    for t in leaves.iter() {
                        let a = t.try_array()?;
                        inputs.push(match a.shards() {
                            Some([s]) => s.as_ref(),
                            _ => a.try_literal().map_err(|m| Error::Op {
                                op: "jit".into(),
                                message: format!("an input: {m}"),
                                location: location(),
                            })?,
                        });
                    }
                    let outputs = &mut scratch.partial;
                    outputs.clear();
                    let run = {
                        let _span = tracing::debug_span!(
                            "launch",
                            function = self.cache.options.name.as_str()
                        )
                        .entered();
                        program.run_one_into(&inputs, outputs)
                    };
                    scratch.inputs = relifetime(inputs);
                    if let Some(run) = run {
                        run?;
                        let keep = outputs.len();
                        take_given_up(leaves, keep, &mut scratch.placed_shells, |t| {
                            let (shell, data) = t.into_placed_shell()?;
                            program.recycle_one(data);
                            Some(shell)
                        });
                        let tensors = &mut scratch.tensors;
                        for ((lit, ty), layout) in outputs.drain(..).zip(out_types).zip(out_layouts)
                        {
                            let lit = lit.expect("a one-device program computes every output");
                            let (ty, layout) = (ty.clone(), layout.clone());
                            let array = match scratch.placed_shells.pop() {
                                Some(shell) => shell.fill(ty, layout, lit),
                                None => Array::from_shards(ty, layout, [Arc::new(lit)]),
                            };
                            tensors.push(Tensor::from_array(array));
                        }
                        return tree::unflatten_drain(out_def, tensors);
                    }
                }
                let local = program.positions.len();
                let inputs = &mut scratch.device_inputs;
                inputs.resize_with(local, Vec::new);
                inputs.iter_mut().for_each(Vec::clear);
                for t in leaves.iter() {
                    let a = t.try_array()?;
                    for (k, ins) in inputs.iter_mut().enumerate() {
                        ins.push(match a.shards() {
                            Some(s) if s.len() == local => s[k].clone(),
                            _ => {
                                a.try_literal()
                                    .map(|_| a.literal_arc())
                                    .map_err(|m| Error::Op {
                                        op: "jit".into(),
                                        message: format!("an input: {m}"),
                                        location: location(),
                                    })?
                            }
                        });
                    }
                }
                let per_device = &mut scratch.device_outputs;
                let ran = {
                    let _span =
                        tracing::debug_span!("launch", function = self.cache.options.name.as_str())
                            .entered();
                    program.run(inputs, per_device)
                };
                // The inputs' references dropped (the vectors kept), the given-up arguments'
                // shards go to the devices' pools, unless the checker still reads them.
                inputs.iter_mut().for_each(Vec::clear);
                ran?;
                if checker.is_none() {
                    give_shards_up(
                        leaves,
                        out_types.len(),
                        (&mut scratch.shards_shells, &mut scratch.placed_shells),
                        |k, data| program.recycle(k, data),
                    );
                }
                let [replicated_shells, split_shells] = &mut scratch.shards_shells;
                let placed_shells = &mut scratch.placed_shells;
                let tensors = &mut scratch.tensors;
                for (o, ty) in out_types.iter().enumerate() {
                    // Each device's value of output `o`.
                    let mut next = per_device
                        .iter_mut()
                        .map(|outs| outs.get_mut(o).expect("one value per output").take());
                    // A replicated output is alike on every device (its inputs are replicated
                    // or all-reduced, in one order everywhere), so only the first device
                    // computes it (`Pipeline::schedule`'s `first_only`) and its buffer serves
                    // all, as `device_put` does: the next step's devices read one copy of the
                    // parameters instead of eight. (The other devices' places for it are
                    // `None`: dropped outputs.)
                    let (ty, layout) = (ty.clone(), out_layouts[o].clone());
                    let replicated = is_replicated(&out_specs[o]);
                    // A given-up argument's allocations of the same layout, if any.
                    let shell = match (local, replicated) {
                        (0 | 1, _) => None,
                        (_, true) => replicated_shells.pop(),
                        (_, false) => split_shells.pop(),
                    }
                    .filter(|s| s.layout() == (local, replicated));
                    let array = if local == 0 {
                        Array::from_shards(ty, layout, [])
                    } else if local == 1 {
                        let one = next
                            .next()
                            .flatten()
                            .expect("a process's one device computes every output");
                        match placed_shells.pop() {
                            Some(shell) => shell.fill(ty, layout, one),
                            None => Array::from_shards(ty, layout, [Arc::new(one)]),
                        }
                    } else if replicated {
                        let first = next
                            .next()
                            .flatten()
                            .expect("the first device computes all");
                        match shell {
                            Some(shell) => {
                                let mut first = Some(first);
                                shell.fill(ty, layout, |_| first.take().expect("called once"))
                            }
                            None => Array::from_shards(
                                ty,
                                layout,
                                std::iter::repeat_n(Arc::new(first), local),
                            ),
                        }
                    } else {
                        let mut next =
                            next.map(|l| l.expect("split outputs are computed everywhere"));
                        match shell {
                            Some(shell) => {
                                shell.fill(ty, layout, |_| next.next().expect("one value a device"))
                            }
                            None => Array::from_shards(ty, layout, next.map(Arc::new)),
                        }
                    };
                    tensors.push(Tensor::from_array(array));
                }
                per_device.iter_mut().for_each(Vec::clear);
                if let Some(checker) = checker {
                    if tessera_runtime::processes_of(&program.devices).len() > 1 {
                        return Err(Error::Config(
                            "checked mode (TESSERA_CHECK=1, .checked(true)) runs the global \
                             program on the host: it needs every shard in one process"
                                .into(),
                        ));
                    }
                    // The global values, assembled on the host.
                    let inputs: Vec<&Literal> = leaves
                        .iter()
                        .map(|t| t.try_array().map(Array::literal))
                        .collect::<Result<_>>()?;
                    let want = checker.check_ops(&inputs)?;
                    let got: Vec<Literal> = tensors
                        .iter()
                        .map(|t| t.try_array().map(|a| a.literal().clone()))
                        .collect::<Result<_>>()?;
                    checker.check_outputs(&got, &want)?;
                }
                tree::unflatten_drain(out_def, tensors)
            }
        }
    }

    /// Traces one signature and runs the pipeline's passes (`pipeline::PASSES`). `lower` and
    /// `compile` both go through here, so what `lower` shows is what runs.
    fn run_passes<'a>(
        &'a self,
        sig: &Signature,
        dump: Dump,
        location: &'a str,
        keep_stages: bool,
    ) -> Result<(Pipeline<'a>, Lowered)> {
        let target = target_of(sig, location)?;
        let single = matches!(target, Target::Single);
        crate::sharding::take_wanted_mesh();
        match self.run_passes_for(target, sig, dump.clone(), location, keep_stages) {
            // Every input a host value, and a sharding constraint (or `out_shardings`) on a
            // mesh: compiled for that mesh, the inputs replicated on it, as JAX does.
            Err(e) if single => match crate::sharding::take_wanted_mesh() {
                Some(mesh) => {
                    let target = Target::Sharded {
                        mesh: ShardSpec {
                            mesh: mesh.ir.clone(),
                            devices: mesh.devices.clone(),
                            dims: Vec::new(),
                        },
                        specs: sig
                            .types
                            .iter()
                            .map(|t| vec![Vec::new(); t.rank()])
                            .collect(),
                    };
                    self.run_passes_for(target, sig, dump, location, keep_stages)
                }
                None => Err(e),
            },
            other => other,
        }
    }

    /// `run_passes` for `target`.
    fn run_passes_for<'a>(
        &'a self,
        target: Target,
        sig: &Signature,
        dump: Dump,
        location: &'a str,
        keep_stages: bool,
    ) -> Result<(Pipeline<'a>, Lowered)> {
        // The trace knows the inputs' mesh from the start, so that sharding constraints
        // type-check in it and in the traces nested in it (a `grad` inside the function).
        let (mesh, specs) = match &target {
            Target::Sharded { mesh, specs } => (Some(mesh.mesh.clone()), Some(specs.clone())),
            Target::Single | Target::PerDevice { .. } => (None, None),
        };
        let options = &self.cache.options;
        let mut pipeline = Pipeline::new(target, options, location, dump);
        let f = |args: In| self.constrain_outputs((self.f)(args), location);
        let trace = || {
            trace_fn_on(
                &options.name,
                &f,
                &sig.def,
                &sig.types,
                mesh,
                specs.as_deref(),
            )
        };
        let lowered = pipeline.lower(trace, keep_stages)?;
        Ok((pipeline, lowered))
    }

    /// Traces and compiles for one signature.
    fn compile(&self, sig: &Signature, dump: Dump, location: &str) -> Result<JitEntry> {
        let (mut pipeline, lowered) = self.run_passes(sig, dump, location, false)?;
        let checked = match self.check {
            Some(on) => on,
            None => crate::pipeline::check_from_env()?,
        };
        // The global program after simplification (with shardings, which change no value).
        let checker = checked.then(|| Checker::new(lowered.graph().clone()));
        let entry = match pipeline.target() {
            Target::Single => JitEntry::Single {
                program: pipeline.schedule(&lowered, 1, &[])?.remove(0),
                out_def: lowered.out_def,
                checker,
            },
            Target::Sharded { mesh, .. } => {
                let (mesh, devices) = (mesh.mesh.clone(), mesh.devices.clone());
                let out_specs = lowered
                    .out_specs
                    .clone()
                    .expect("`partition` gives every output's sharding");
                let first_only: Vec<bool> = out_specs.iter().map(is_replicated).collect();
                let programs = pipeline.schedule_on(&lowered, &devices, &first_only, location)?;
                // An output laid out as an input shares its layout: the next call, given the
                // outputs back (parameters chained), compares its leaves by pointer.
                let out_layouts = out_specs
                    .iter()
                    .map(|dims| {
                        let input =
                            sig.placements.iter().flatten().find(|p| {
                                p.dims == *dims && p.mesh == mesh && p.devices == devices
                            });
                        match input {
                            Some(p) => p.clone(),
                            None => Arc::new(ShardSpec {
                                mesh: mesh.clone(),
                                devices: devices.clone(),
                                dims: dims.clone(),
                            }),
                        }
                    })
                    .collect();
                JitEntry::Sharded {
                    out_types: lowered.out_types(),
                    out_layouts,
                    program: DeviceProgram::new(programs, mesh, devices),
                    out_def: lowered.out_def,
                    out_specs,
                    checker,
                }
            }
            Target::PerDevice { .. } => unreachable!("`target_of` gives no per-device target"),
        };
        pipeline.report_timing()?;
        Ok(entry)
    }
}

/// Like `jax.make_jaxpr`: `make_ir(f)(&args)` traces `f` for `args` and returns the program.
pub fn make_ir<In: Tree, Out: Tree, F: Fn(In) -> Out>(f: F) -> impl Fn(&In) -> Result<Lowered> {
    let name = closure_name::<F>();
    move |args: &In| {
        let (leaves, def) = tree::flatten(args);
        let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
        let (graph, out_def) = trace_fn_on(&name, &f, &def, &types, trace::current_mesh(), None)?;
        Ok(Lowered::traced(graph, out_def))
    }
}

/// Evaluates an IR program on tensors, like `jax.core.eval_jaxpr`: eagerly outside any trace,
/// recorded into the innermost active trace inside one (even on concrete inputs, as JAX's
/// omnistaging does). A malformed graph (one
/// the verifier rejects), inputs of the wrong types, and collectives run outside a program
/// placed on a mesh are errors.
#[track_caller]
pub fn eval_graph(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let location = crate::error::loc_text(std::panic::Location::caller());
    let fail = |message: String| Error::Op {
        op: "eval_graph".into(),
        message: format!("{message} (graph {})", graph.name),
        location: location.clone(),
    };
    tessera_ir::verify(graph)?;
    if inputs.len() != graph.params().len() {
        return Err(fail(format!(
            "{} inputs for {} parameters",
            inputs.len(),
            graph.params().len()
        )));
    }
    for (i, (p, t)) in graph.params().iter().zip(inputs).enumerate() {
        if graph.ty(*p) != t.ty() {
            return Err(fail(format!(
                "input {i} is {} but parameter {i} is {}",
                t.ty(),
                graph.ty(*p)
            )));
        }
    }
    let order = graph.topo_order();
    if !trace::any_active()
        && let Some(&c) = order.iter().find(|&&id| graph.op(id).is_collective())
    {
        return Err(fail(format!(
            "{} is a collective: it needs the devices of a mesh, so run the program with `jit` \
             on inputs placed with `device_put`, or inside `pmap`",
            graph.op(c).name()
        )));
    }
    catch_eager(|| {
        let mut env = std::collections::HashMap::new();
        for (p, t) in graph.params().iter().zip(inputs) {
            env.insert(*p, t.clone());
        }
        crate::grad::replay(graph, &order, &mut env);
        graph.outputs().iter().map(|o| env[o].clone()).collect()
    })
}
