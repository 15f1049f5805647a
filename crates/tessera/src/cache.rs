//! What `jit` and `pmap` share: the options their pipeline runs with, and the compiled
//! programs by input signature (a miss traces and compiles, a hit reuses).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use hashbrown::HashMap;
use tessera_ir::TensorType;
use tessera_runtime::ShardSpec;

use crate::error::Result;
use crate::pipeline::{Backend, Dump, Options};
use crate::tensor::Tensor;
use crate::tree::TreeDef;

/// What a compiled program is specialized to: the input tree, each leaf's type, and each
/// leaf's placement (mesh and per-dim axes) when it lives on devices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Signature {
    pub(crate) def: TreeDef,
    pub(crate) types: Vec<TensorType>,
    /// Empty when placement does not change the program (`pmap`).
    pub(crate) placements: Vec<Option<ShardSpec>>,
}

impl Signature {
    /// The leaves' types and placements.
    pub(crate) fn placed(leaves: &[Tensor], def: TreeDef) -> Signature {
        Signature {
            def,
            types: leaves.iter().map(|t| t.ty().clone()).collect(),
            placements: leaves.iter().map(|t| t.placement()).collect(),
        }
    }

    /// The leaves' types only.
    pub(crate) fn unplaced(leaves: &[Tensor], def: TreeDef) -> Signature {
        Signature {
            def,
            types: leaves.iter().map(|t| t.ty().clone()).collect(),
            placements: Vec::new(),
        }
    }
}

/// The options and the compiled programs (`V`) of one transformed closure.
pub(crate) struct Cache<V> {
    pub(crate) options: Options,
    entries: RefCell<HashMap<Signature, Rc<V>>>,
    traces: Cell<usize>,
}

impl<V> Cache<V> {
    /// Cranelift, and simplification unless `TESSERA_SIMPLIFY=0`.
    pub(crate) fn new(name: String) -> Cache<V> {
        Cache {
            options: Options {
                name,
                backend: Backend::default(),
                simplify: crate::pipeline::simplify_enabled(),
            },
            entries: RefCell::new(HashMap::new()),
            traces: Cell::new(0),
        }
    }

    pub(crate) fn set_name(&mut self, name: &str) {
        self.options.name = name.to_string();
    }

    pub(crate) fn set_backend(&mut self, backend: Backend) {
        self.options.backend = backend;
        self.clear();
    }

    pub(crate) fn set_simplify(&mut self, on: bool) {
        self.options.simplify = on;
        self.clear();
    }

    /// Forgets every compiled program (an option they were compiled with changed).
    pub(crate) fn clear(&mut self) {
        self.entries.get_mut().clear();
    }

    /// How many times the closure has been traced for a compilation.
    pub(crate) fn trace_count(&self) -> usize {
        self.traces.get()
    }

    /// The program for `sig`: on a miss, `compile` traces and compiles it (a new trace,
    /// dumped under its number when `TESSERA_DUMP` is set), and it is kept for the next call.
    pub(crate) fn get_or_compile(
        &self,
        sig: Signature,
        compile: impl FnOnce(&Signature, Dump) -> Result<V>,
    ) -> Result<Rc<V>> {
        if let Some(v) = self.entries.borrow().get(&sig) {
            return Ok(v.clone());
        }
        self.traces.set(self.traces.get() + 1);
        let dump = Dump::from_env(&self.options.name, self.traces.get());
        let v = Rc::new(compile(&sig, dump)?);
        self.entries.borrow_mut().insert(sig, v.clone());
        Ok(v)
    }
}
