//! What `jit` and `pmap` share: the options their pipeline runs with, and the compiled
//! programs by input signature (a miss traces and compiles, a hit reuses).
//!
//! The cache is bounded: at most [`DEFAULT_CAPACITY`] programs per jitted function (set with
//! `.cache_capacity(n)`); a miss when it is full drops the least recently used program (its
//! native code is freed). A dropped signature seen again is traced and compiled again.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap as StdHashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;
use tessera_ir::TensorType;
use tessera_runtime::ShardSpec;

use crate::error::Result;
use crate::pipeline::{Backend, Dump, Options};
use crate::tensor::Tensor;
use crate::tree::{Tree, TreeDef};

/// What a compiled program is specialized to: the input tree, each leaf's type, and each
/// leaf's placement (mesh and per-dim axes) when it lives on devices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Signature {
    pub(crate) def: TreeDef,
    pub(crate) types: Vec<TensorType>,
    /// Empty when placement does not change the program (`pmap`). Shared with the leaves'
    /// arrays (and the program's outputs where equal): a later call's leaves are compared by
    /// pointer first.
    pub(crate) placements: Vec<Option<Arc<ShardSpec>>>,
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

/// How many compiled programs a jitted or pmapped function keeps by default: enough for
/// every shape a training loop meets (a last partial batch, an eval batch), small enough that
/// a loop over thousands of shapes stays within a few MB.
pub const DEFAULT_CAPACITY: usize = 64;

/// The options and the compiled programs (`V`) of one transformed closure.
pub(crate) struct Cache<V> {
    pub(crate) options: Options,
    /// Each program with the tick of its last use (shared with `last`).
    entries: RefCell<HashMap<Signature, (Rc<V>, Used)>>,
    capacity: usize,
    tick: Cell<u64>,
    traces: Cell<usize>,
    /// This closure's number among those of its name, for unique dump file names.
    instance: OnceCell<usize>,
    /// The signature of the last call, its program and its entry's tick: a call with the same
    /// leaves' types and placements and the same structure reuses it without building a
    /// `Signature` or hashing one. An entry of `entries` unless evicted since, which the
    /// shared tick tells (the entry holds the other reference).
    last: RefCell<Option<(Signature, Rc<V>, Used)>>,
}

/// The tick of an entry's last use, shared by the entry and `Cache::last`.
type Used = Rc<Cell<u64>>;

/// How many closures of each name have dumped (`Dump::from_env`'s prefix): the first is
/// `name`, the next `name~2`, in the order of their first compilation.
static INSTANCES: Mutex<Option<StdHashMap<String, usize>>> = Mutex::new(None);

fn next_instance(name: &str) -> usize {
    let mut map = INSTANCES.lock().unwrap_or_else(|p| p.into_inner());
    let n = map
        .get_or_insert_with(StdHashMap::new)
        .entry(name.to_string())
        .or_insert(0);
    *n += 1;
    *n
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
            capacity: DEFAULT_CAPACITY,
            tick: Cell::new(0),
            traces: Cell::new(0),
            instance: OnceCell::new(),
            last: RefCell::new(None),
        }
    }

    /// Keeps at most `n` programs (at least one).
    pub(crate) fn set_capacity(&mut self, n: usize) {
        self.capacity = n.max(1);
        let entries = self.entries.get_mut();
        while entries.len() > self.capacity {
            Self::evict(entries);
        }
        let last = self.last.get_mut();
        if last
            .as_ref()
            .is_some_and(|(sig, ..)| !entries.contains_key(sig))
        {
            *last = None;
        }
    }

    /// How many programs are kept now.
    pub(crate) fn len(&self) -> usize {
        self.entries.borrow().len()
    }

    fn evict(entries: &mut HashMap<Signature, (Rc<V>, Used)>) {
        let oldest = entries
            .iter()
            .min_by_key(|(_, (_, t))| t.get())
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            entries.remove(&k);
        }
    }

    pub(crate) fn set_name(&mut self, name: &str) {
        self.options.name = name.to_string();
        // Numbered again among the closures of the new name at the next compilation.
        self.instance = OnceCell::new();
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
        *self.last.get_mut() = None;
    }

    /// The program of the last call when `leaves` and `def` have its signature (`placed`:
    /// placements are part of it), found without allocating; it becomes the most recently
    /// used entry.
    pub(crate) fn last_hit(&self, leaves: &[Tensor], def: &TreeDef, placed: bool) -> Option<Rc<V>> {
        self.last_hit_where(|d| d == def, leaves, placed)
    }

    /// [`Cache::last_hit`] for the tree `args`, flattened into `leaves` (emptied first) while
    /// its structure is compared with the last call's ([`Tree::flatten_if`]): no `TreeDef` is
    /// built. On `None` the leaves are unspecified.
    pub(crate) fn last_hit_of<T: Tree>(
        &self,
        args: &T,
        leaves: &mut Vec<Tensor>,
        placed: bool,
    ) -> Option<Rc<V>> {
        leaves.clear();
        // Taken out while the tree flattens: a hand-written `flatten_into` (what the default
        // `flatten_if` calls) may call this very jit.
        let last = self.last.borrow_mut().take()?;
        let same_def = args.flatten_if(&last.0.def, leaves);
        *self.last.borrow_mut() = Some(last);
        self.last_hit_where(|_| same_def, leaves, placed)
    }

    /// The last call's program when `same_def` accepts its structure and `leaves` have its
    /// types (and, when `placed`, placements).
    fn last_hit_where(
        &self,
        same_def: impl FnOnce(&TreeDef) -> bool,
        leaves: &[Tensor],
        placed: bool,
    ) -> Option<Rc<V>> {
        let last = self.last.borrow();
        let (sig, v, used) = last.as_ref()?;
        // Its entry still shares the tick: not evicted (a closure's `flatten_into` may have
        // called this jit and filled the cache while the last call was taken out).
        let same = Rc::strong_count(used) > 1
            && same_def(&sig.def)
            && sig.types.len() == leaves.len()
            && leaves.iter().zip(&sig.types).all(|(t, ty)| t.ty() == ty)
            && (!placed
                || (sig.placements.len() == leaves.len()
                    && leaves
                        .iter()
                        .zip(&sig.placements)
                        .all(|(t, p)| t.placed_as(p.as_ref()))));
        if !same {
            return None;
        }
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        used.set(tick);
        Some(v.clone())
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
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        if let Some((v, used)) = self.entries.borrow().get(&sig) {
            used.set(tick);
            *self.last.borrow_mut() = Some((sig, v.clone(), used.clone()));
            return Ok(v.clone());
        }
        self.traces.set(self.traces.get() + 1);
        let _span = tracing::info_span!(
            "compile",
            function = self.options.name.as_str(),
            trace = self.traces.get()
        )
        .entered();
        let instance = *self
            .instance
            .get_or_init(|| next_instance(&self.options.name));
        let prefix = match instance {
            1 => self.options.name.clone(),
            k => format!("{}~{k}", self.options.name),
        };
        let dump = Dump::from_env(&prefix, self.traces.get());
        let v = Rc::new(compile(&sig, dump)?);
        let mut entries = self.entries.borrow_mut();
        while entries.len() >= self.capacity {
            Self::evict(&mut entries);
        }
        let used = Rc::new(Cell::new(tick));
        entries.insert(sig.clone(), (v.clone(), used.clone()));
        drop(entries);
        *self.last.borrow_mut() = Some((sig, v.clone(), used));
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Leaves;

    /// One leaf whose flattening compiles another signature in the cache it is looked up in:
    /// what a hand-written `flatten_into` that calls its own jit does.
    struct CallsBack<'a> {
        x: Tensor,
        cache: &'a Cache<u32>,
        other: Tensor,
    }

    impl Tree for CallsBack<'_> {
        fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
            let sig = Signature::unplaced(std::slice::from_ref(&self.other), TreeDef::Leaf);
            let _ = self.cache.get_or_compile(sig, |_, _| Ok(2));
            self.x.flatten_into(leaves)
        }

        fn unflatten_from(_: &TreeDef, _: &mut Leaves<'_>) -> Result<Self> {
            Err(crate::Error::Config(
                "CallsBack is an argument only: never rebuilt".into(),
            ))
        }
    }

    #[test]
    fn the_last_call_evicted_while_the_arguments_flatten_is_not_served() {
        let mut cache: Cache<u32> = Cache::new("t".into());
        cache.set_capacity(1);
        let x = Tensor::zeros([2]);
        let first = Signature::unplaced(std::slice::from_ref(&x), TreeDef::Leaf);
        assert_eq!(*cache.get_or_compile(first, |_, _| Ok(1)).unwrap(), 1);
        let mut leaves = Vec::new();
        // Not evicted: served without a lookup.
        assert_eq!(
            cache.last_hit_of(&x, &mut leaves, false).as_deref(),
            Some(&1)
        );
        // The flattening compiles `other`, which evicts `x`'s entry (capacity 1): the last
        // call's program is no longer an entry, and the call must look it up again.
        let args = CallsBack {
            x: x.clone(),
            cache: &cache,
            other: Tensor::zeros([3]),
        };
        assert_eq!(cache.last_hit_of(&args, &mut leaves, false), None);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.trace_count(), 2);
    }
}
