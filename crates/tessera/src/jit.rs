//! `jit`: trace a closure once per input signature, run the compiled program on every call.
//!
//! The cache key is the input tree's structure, each leaf's type, and each leaf's placement on a
//! mesh. A miss traces the closure with one tracer per leaf and runs the pipeline (partitioned
//! for every device when the inputs are placed on a mesh); a hit goes straight to the
//! executable.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use hashbrown::HashMap;
use tessera_ir::{Graph, Literal, TensorType, print};

use crate::error::{Error, Result, catch, catch_eager};
use std::sync::Arc;

use tessera_runtime::{Array, ShardSpec};
use tessera_shard::Spec;

use crate::check::Checker;
use crate::pipeline::{Backend, Dump, Executable, compile};
use crate::spmd::DeviceProgram;
use crate::tensor::Tensor;
use crate::trace;
use crate::tree::{self, Tree, TreeDef};

/// What a compiled program is specialized to: the input tree, each leaf's type, and each
/// leaf's placement (mesh and per-dim axes) when it lives on devices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Signature {
    def: TreeDef,
    types: Vec<TensorType>,
    placements: Vec<Option<ShardSpec>>,
}

enum Compiled {
    /// One device: the program runs on the calling thread.
    Single {
        out_def: TreeDef,
        executable: Executable,
        checker: Option<Checker>,
    },
    /// Sharded inputs: the per-device program runs on every device of the mesh.
    Sharded {
        out_def: TreeDef,
        program: DeviceProgram,
        out_types: Vec<TensorType>,
        out_specs: Vec<Spec>,
        checker: Option<Checker>,
    },
}

/// The mesh the placed leaves share (with its device list), or an error when they disagree.
fn common_mesh(placements: &[Option<ShardSpec>], location: &str) -> Result<Option<ShardSpec>> {
    let mut mesh: Option<&ShardSpec> = None;
    for p in placements.iter().flatten() {
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

/// Each leaf's per-dim axes on the common mesh (replicated for host values).
fn in_specs(types: &[TensorType], placements: &[Option<ShardSpec>]) -> Vec<Spec> {
    types
        .iter()
        .zip(placements)
        .map(|(t, p)| match p {
            Some(p) => p.dims.clone(),
            None => vec![Vec::new(); t.rank()],
        })
        .collect()
}

/// The mesh of a partitioned program and the sharding of each of its outputs.
type Placed = (ShardSpec, Vec<Spec>);

/// A jitted closure. `call` compiles on the first call with each new input signature.
pub struct Jitted<F, In, Out> {
    f: F,
    name: String,
    cache: RefCell<HashMap<Signature, Rc<Compiled>>>,
    traces: Cell<usize>,
    backend: Backend,
    simplify: bool,
    /// Checked mode: `None` follows `TESSERA_CHECK`.
    check: Option<bool>,
    _types: PhantomData<fn(In) -> Out>,
}

/// Wraps `f` for tracing and compilation, like `jax.jit`.
pub fn jit<In: Tree, Out: Tree, F: Fn(In) -> Out>(f: F) -> Jitted<F, In, Out> {
    Jitted {
        name: closure_name::<F>(),
        f,
        cache: RefCell::new(HashMap::new()),
        traces: Cell::new(0),
        backend: Backend::default(),
        simplify: crate::pipeline::simplify_enabled(),
        check: None,
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

/// A traced program: the graph with its output structure. Printing it gives the IR text. For
/// inputs placed on a mesh it also holds the shardings and the per-device program.
pub struct Lowered {
    pub(crate) graph: Graph,
    pub(crate) out_def: TreeDef,
    per_device: Option<Graph>,
    /// The program as traced, before any pass (kept by `Jitted::lower`).
    traced: Option<Graph>,
}

impl Lowered {
    /// The program in the IR text format (with each value's sharding when inputs are placed).
    /// From `Jitted::lower` it is the program after simplification, as it runs.
    pub fn ir(&self) -> String {
        print(&self.graph)
    }

    /// The program as traced, before simplification (the same as `ir()` for `make_ir`).
    pub fn traced_ir(&self) -> String {
        print(self.traced.as_ref().unwrap_or(&self.graph))
    }

    /// After partitioning: the program every device runs, with local shapes and collectives
    /// (the global program itself when no input is placed on a mesh).
    pub fn per_device_ir(&self) -> String {
        print(self.per_device.as_ref().unwrap_or(&self.graph))
    }

    pub fn per_device_graph(&self) -> Option<&Graph> {
        self.per_device.as_ref()
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The structure of the function's result.
    pub fn out_tree(&self) -> &TreeDef {
        &self.out_def
    }

    /// The graph in Graphviz's DOT language.
    pub fn dot(&self) -> String {
        tessera_ir::dot::to_dot(&self.graph)
    }
}

impl fmt::Display for Lowered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.ir())
    }
}

/// Traces `f` on tracers of the given signature.
fn trace_fn<In: Tree, Out: Tree>(
    name: &str,
    f: &impl Fn(In) -> Out,
    def: &TreeDef,
    types: &[TensorType],
) -> Result<Lowered> {
    trace_fn_on(name, f, def, types, trace::current_mesh())
}

/// `trace_fn` in a graph with the given mesh (pmap's, so its collectives type-check).
pub(crate) fn trace_fn_on<In: Tree, Out: Tree>(
    name: &str,
    f: &impl Fn(In) -> Out,
    def: &TreeDef,
    types: &[TensorType],
    mesh: Option<tessera_ir::Mesh>,
) -> Result<Lowered> {
    let (guard, tracers) = trace::begin_on(name, types, mesh);
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
    Ok(Lowered {
        graph: recorded.graph,
        out_def,
        per_device: None,
        traced: None,
    })
}

/// Whether a sharding splits no dim.
fn is_replicated(spec: &Spec) -> bool {
    spec.iter().all(|axes| axes.is_empty())
}

/// Partitions a traced program for inputs placed on `mesh`.
fn partition_lowered(
    lowered: Lowered,
    mesh: &ShardSpec,
    specs: &[Spec],
    (name, location): (&str, &str),
) -> Result<(Lowered, Vec<Spec>)> {
    let fail = |e: tessera_shard::ShardError| Error::Op {
        op: "sharding".into(),
        message: format!("in {name}: {e}"),
        location: location.into(),
    };
    let mut p = tessera_shard::partition(&lowered.graph, &mesh.mesh, specs).map_err(fail)?;
    // One rendezvous per step for the reductions that can wait for each other.
    tessera_shard::combine_all_reduces(&mut p.local).map_err(fail)?;
    Ok((
        Lowered {
            graph: p.annotated,
            out_def: lowered.out_def,
            per_device: Some(p.local),
            traced: lowered.traced,
        },
        p.out_specs,
    ))
}

impl<In: Tree, Out: Tree, F: Fn(In) -> Out> Jitted<F, In, Out> {
    /// Names the function in the IR and in dumps.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Chooses the backend (Cranelift by default; the interpreter runs the very same program).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self.cache.borrow_mut().clear();
        self
    }

    /// Turns the simplification pass (egg rewrites, CSE, DCE) on or off; on by default unless
    /// `TESSERA_SIMPLIFY=0`.
    pub fn simplify(mut self, on: bool) -> Self {
        self.simplify = on;
        self.cache.borrow_mut().clear();
        self
    }

    /// Checked mode: every call also runs the reference interpreter and compares, op by op
    /// and output by output, and returns an error naming the first op (with its line, its
    /// operands and both values) whose compiled result is outside its stated bound. Off by
    /// default unless `TESSERA_CHECK=1`; slow (it is for finding a miscompilation, not for
    /// training).
    pub fn checked(mut self, on: bool) -> Self {
        self.check = Some(on);
        self.cache.borrow_mut().clear();
        self
    }

    /// How many times the closure has been traced (once per new signature).
    pub fn trace_count(&self) -> usize {
        self.traces.get()
    }

    /// Traces the closure for `args`' signature and runs every pass up to code generation,
    /// without running it: `ir()` and `per_device_ir()` show exactly the program that `call`
    /// runs for these arguments (simplified, and partitioned when the arguments are placed on a
    /// mesh); `traced_ir()` shows it as traced.
    #[track_caller]
    pub fn lower(&self, args: &In) -> Result<Lowered> {
        let location = crate::error::loc_text(std::panic::Location::caller());
        let (leaves, def) = tree::flatten(args);
        let sig = Signature {
            def,
            types: leaves.iter().map(|t| t.ty().clone()).collect(),
            placements: leaves.iter().map(|t| t.placement()).collect(),
        };
        let dump = Dump::disabled();
        Ok(self.prepare(&sig, &dump, &location)?.0)
    }

    /// Runs the closure compiled. Inside another trace (a `jit` in a `jit`, a `grad`), it is
    /// inlined into that trace instead. Inputs placed on a mesh run the partitioned program on
    /// every device of the mesh, and the outputs come back placed as propagation decided.
    #[track_caller]
    pub fn call(&self, args: In) -> Result<Out> {
        let location = crate::error::loc_text(std::panic::Location::caller());
        if trace::any_active() {
            return Ok((self.f)(args));
        }
        let (leaves, def) = tree::flatten(&args);
        let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
        let placements: Vec<Option<ShardSpec>> = leaves.iter().map(|t| t.placement()).collect();
        let sig = Signature {
            def,
            types,
            placements,
        };
        let cached = self.cache.borrow().get(&sig).cloned();
        let compiled = match cached {
            Some(c) => c,
            None => {
                let c = Rc::new(self.compile(&sig, &location)?);
                self.cache.borrow_mut().insert(sig.clone(), c.clone());
                c
            }
        };
        match compiled.as_ref() {
            Compiled::Single {
                out_def,
                executable,
                checker,
            } => {
                let inputs: Vec<&Literal> = leaves
                    .iter()
                    .map(|t| t.try_array().map(|a| a.literal()))
                    .collect::<Result<_>>()?;
                let outputs = executable.run(&inputs)?;
                if let Some(checker) = checker {
                    let want = checker.check_ops(&inputs)?;
                    checker.check_outputs(&outputs, &want)?;
                }
                let tensors: Vec<Tensor> = outputs.into_iter().map(Tensor::from_literal).collect();
                tree::unflatten(out_def, tensors)
            }
            Compiled::Sharded {
                out_def,
                program,
                out_types,
                out_specs,
                checker,
            } => {
                let arrays: Vec<&Array> = leaves
                    .iter()
                    .map(|t| t.try_array())
                    .collect::<Result<_>>()?;
                let inputs: Vec<Vec<Arc<Literal>>> = (0..program.devices.len())
                    .map(|pos| {
                        arrays
                            .iter()
                            .map(|a| match a.shards() {
                                Some(s) => s[pos].clone(),
                                None => a.literal_arc(),
                            })
                            .collect()
                    })
                    .collect();
                let mut per_device = program.run(inputs)?;
                let n_out = out_types.len();
                let tensors: Vec<Tensor> = (0..n_out)
                    .rev()
                    .map(|o| {
                        let mut outs: Vec<Option<Literal>> = per_device
                            .iter_mut()
                            .map(|outs| outs.pop().expect("one value per output"))
                            .collect();
                        // A replicated output is alike on every device (its inputs are
                        // replicated or all-reduced, in one order everywhere), so only the
                        // first device computes it (`DeviceProgram::compile`) and its buffer
                        // serves all, as `device_put` does: the next step's devices read one
                        // copy of the parameters instead of eight.
                        let shards: Vec<Arc<Literal>> = if is_replicated(&out_specs[o]) {
                            let first = outs[0].take().expect("the first device computes all");
                            let first = Arc::new(first);
                            (0..outs.len()).map(|_| first.clone()).collect()
                        } else {
                            outs.into_iter()
                                .map(|l| {
                                    Arc::new(l.expect("split outputs are computed everywhere"))
                                })
                                .collect()
                        };
                        Tensor::from_array(Array::from_shards(
                            out_types[o].clone(),
                            ShardSpec {
                                mesh: program.mesh.clone(),
                                devices: program.devices.clone(),
                                dims: out_specs[o].clone(),
                            },
                            shards,
                        ))
                    })
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                if let Some(checker) = checker {
                    // The global values, assembled on the host.
                    let inputs: Vec<&Literal> = arrays.iter().map(|a| a.literal()).collect();
                    let want = checker.check_ops(&inputs)?;
                    let got: Vec<Literal> = tensors
                        .iter()
                        .map(|t| t.try_array().map(|a| a.literal().clone()))
                        .collect::<Result<_>>()?;
                    checker.check_outputs(&got, &want)?;
                }
                tree::unflatten(out_def, tensors)
            }
        }
    }

    /// Traces one signature and runs the passes before code generation: simplification, and
    /// for inputs on a mesh propagation, partitioning and combining. `lower` and `compile` both
    /// go through here, so what `lower` shows is what runs.
    fn prepare(
        &self,
        sig: &Signature,
        dump: &Dump,
        location: &str,
    ) -> Result<(Lowered, Option<Placed>)> {
        let mesh = common_mesh(&sig.placements, location)?;
        // The trace knows the inputs' mesh from the start, so that sharding constraints type-check
        // in it and in the traces nested in it (a `grad` inside the jitted function).
        let mut lowered = trace_fn_on(
            &self.name,
            &self.f,
            &sig.def,
            &sig.types,
            mesh.as_ref().map(|m| m.mesh.clone()),
        )?;
        lowered.traced = Some(lowered.graph.clone());
        // 00: the program as traced; 01: simplified (egg rewrites, CSE, DCE).
        dump.write(0, "trace", &lowered.graph)?;
        lowered.graph = crate::pipeline::simplify(lowered.graph, self.simplify, dump, 1)?;
        match mesh {
            None => Ok((lowered, None)),
            Some(mesh) => {
                let specs = in_specs(&sig.types, &sig.placements);
                let (lowered, out_specs) =
                    partition_lowered(lowered, &mesh, &specs, (&self.name, location))?;
                // 02: every value's sharding; 03: the program each device runs.
                dump.write(2, "sharded", &lowered.graph)?;
                if let Some(local) = &lowered.per_device {
                    dump.write(3, "per-device", local)?;
                }
                Ok((lowered, Some((mesh, out_specs))))
            }
        }
    }

    /// Traces and compiles for one signature.
    fn compile(&self, sig: &Signature, location: &str) -> Result<Compiled> {
        self.traces.set(self.traces.get() + 1);
        let dump = Dump::from_env(&self.name, self.traces.get());
        let (lowered, mesh) = self.prepare(sig, &dump, location)?;
        let checked = match self.check {
            Some(on) => on,
            None => crate::pipeline::check_from_env()?,
        };
        // The global program after simplification (with shardings, which change no value).
        let checker = checked.then(|| Checker::new(lowered.graph.clone()));
        match mesh {
            None => Ok(Compiled::Single {
                out_def: lowered.out_def,
                executable: compile(lowered.graph, self.backend, &dump)?,
                checker,
            }),
            Some((mesh, out_specs)) => {
                let out_types = lowered
                    .graph
                    .outputs()
                    .iter()
                    .map(|&o| lowered.graph.ty(o).clone())
                    .collect();
                let local = lowered.per_device.expect("partition_lowered sets it");
                let program = DeviceProgram::compile(
                    &local,
                    mesh.mesh.clone(),
                    mesh.devices.clone(),
                    self.backend,
                    (&dump, 4),
                    &out_specs.iter().map(is_replicated).collect::<Vec<_>>(),
                )?;
                Ok(Compiled::Sharded {
                    out_def: lowered.out_def,
                    program,
                    out_types,
                    out_specs,
                    checker,
                })
            }
        }
    }
}

/// Like `jax.make_jaxpr`: `make_ir(f)(&args)` traces `f` for `args` and returns the program.
pub fn make_ir<In: Tree, Out: Tree, F: Fn(In) -> Out>(f: F) -> impl Fn(&In) -> Result<Lowered> {
    let name = closure_name::<F>();
    move |args: &In| {
        let (leaves, def) = tree::flatten(args);
        let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
        trace_fn(&name, &f, &def, &types)
    }
}

/// Evaluates an IR program on tensors, like `jax.core.eval_jaxpr`: eagerly when the inputs are
/// concrete, recorded into the enclosing trace when they are tracers. A malformed graph (one
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
