//! `jit`: trace a closure once per input signature, run the compiled program on every call.
//!
//! The cache key is the input tree's structure and each leaf's type (shardings join it with the
//! sharding work). A miss traces the closure with one tracer per leaf and runs the pipeline; a
//! hit goes straight to the executable.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use hashbrown::HashMap;
use tessera_ir::{Graph, Literal, TensorType, print};

use crate::error::{Error, Result, catch};
use crate::pipeline::{Backend, Dump, Executable, compile};
use crate::tensor::Tensor;
use crate::trace;
use crate::tree::{self, Tree, TreeDef};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Signature {
    def: TreeDef,
    types: Vec<TensorType>,
}

struct Compiled {
    out_def: TreeDef,
    executable: Executable,
}

/// A jitted closure. `call` compiles on the first call with each new input signature.
pub struct Jitted<F, In, Out> {
    f: F,
    name: String,
    cache: RefCell<HashMap<Signature, Rc<Compiled>>>,
    traces: Cell<usize>,
    backend: Backend,
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

/// A traced program: the graph with its output structure. Printing it gives the IR text.
pub struct Lowered {
    graph: Graph,
    out_def: TreeDef,
}

impl Lowered {
    /// The program in the IR text format.
    pub fn ir(&self) -> String {
        print(&self.graph)
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
    let (guard, tracers) = trace::begin(name, types);
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
    })
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

    /// How many times the closure has been traced (once per new signature).
    pub fn trace_count(&self) -> usize {
        self.traces.get()
    }

    /// Traces the closure for `args`' signature without running it.
    pub fn lower(&self, args: &In) -> Result<Lowered> {
        let (leaves, def) = tree::flatten(args);
        let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
        trace_fn(&self.name, &self.f, &def, &types)
    }

    /// Runs the closure compiled. Inside another trace (a `jit` in a `jit`, a `grad`), it is
    /// inlined into that trace instead.
    pub fn call(&self, args: In) -> Result<Out> {
        if trace::any_active() {
            return Ok((self.f)(args));
        }
        let (leaves, def) = tree::flatten(&args);
        let types: Vec<TensorType> = leaves.iter().map(|t| t.ty().clone()).collect();
        let sig = Signature { def, types };
        let cached = self.cache.borrow().get(&sig).cloned();
        let compiled = match cached {
            Some(c) => c,
            None => {
                let lowered = trace_fn(&self.name, &self.f, &sig.def, &sig.types)?;
                self.traces.set(self.traces.get() + 1);
                let dump = Dump::from_env(&self.name, self.traces.get());
                let compiled = Rc::new(Compiled {
                    out_def: lowered.out_def,
                    executable: compile(lowered.graph, self.backend, &dump)?,
                });
                self.cache.borrow_mut().insert(sig, compiled.clone());
                compiled
            }
        };
        let inputs: Vec<&Literal> = leaves
            .iter()
            .map(|t| t.try_array().map(|a| a.literal()))
            .collect::<Result<_>>()?;
        let outputs = compiled.executable.run(&inputs)?;
        let tensors: Vec<Tensor> = outputs.into_iter().map(Tensor::from_literal).collect();
        tree::unflatten(&compiled.out_def, tensors)
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
/// concrete, recorded into the enclosing trace when they are tracers.
pub fn eval_graph(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    if inputs.len() != graph.params().len() {
        return Err(Error::Op {
            op: "eval_graph".into(),
            message: format!(
                "{} inputs for {} parameters",
                inputs.len(),
                graph.params().len()
            ),
            location: graph.name.clone(),
        });
    }
    catch(|| {
        let mut env = std::collections::HashMap::new();
        for (p, t) in graph.params().iter().zip(inputs) {
            env.insert(*p, t.clone());
        }
        crate::grad::replay(graph, &graph.topo_order(), &mut env);
        graph.outputs().iter().map(|o| env[o].clone()).collect()
    })
}
