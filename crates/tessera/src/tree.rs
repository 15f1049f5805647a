//! Trees (JAX's pytrees): values that flatten to a list of tensor leaves plus a structure
//! descriptor, and rebuild from them. `jit` keys its cache on the structure; `grad` and
//! `tree::map` walk the leaves.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::panic::Location;
use std::sync::Arc;

use crate::error::{Error, Result, loc_text, raise};
use crate::tensor::Tensor;

/// The structure of a tree with its leaves taken out. Equal structures flatten to the same
/// number of leaves in the same order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeDef {
    /// A tensor.
    Leaf,
    /// A static value of any type ([`Static`], a `#[tree(static)]` field): no leaves; `jit`
    /// keys its cache on the value (compared with `==`, hashed with `Hash`).
    Static(StaticValue),
    /// A container of children.
    Node {
        /// What kind of node: `tuple`, `vec`, `array`, `some`/`none` (an `Option`), `map`,
        /// `static <type>` (a static number or bool), or a struct's name.
        kind: Name,
        /// Field names or map keys, when the node has them (a static number's value).
        keys: Vec<Name>,
        /// The subtrees, in flattening order.
        children: Vec<TreeDef>,
    },
}

/// A node kind or key: borrowed for the names known at compile time (struct, field and
/// container names), so flattening a tree allocates no strings for them.
pub type Name = std::borrow::Cow<'static, str>;

impl TreeDef {
    /// A [`TreeDef::Node`] (what `#[derive(Tree)]` and hand-written [`Tree`] impls build).
    pub fn node(kind: impl Into<Name>, keys: Vec<Name>, children: Vec<TreeDef>) -> TreeDef {
        TreeDef::Node {
            kind: kind.into(),
            keys,
            children,
        }
    }

    /// The number of leaves.
    pub fn num_leaves(&self) -> usize {
        match self {
            TreeDef::Leaf => 1,
            TreeDef::Static(_) => 0,
            TreeDef::Node { children, .. } => children.iter().map(TreeDef::num_leaves).sum(),
        }
    }

    /// The children of a node of the expected kind, or an error describing the mismatch.
    pub fn children_of(&self, kind: &str) -> Result<&[TreeDef]> {
        match self {
            TreeDef::Node {
                kind: k, children, ..
            } if k == kind => Ok(children),
            other => Err(Error::Tree {
                message: format!("expected a {kind} node, found {}", other.describe()),
                location: String::from("tree::unflatten"),
            }),
        }
    }

    /// The keys of a node (field names, map keys).
    pub fn keys(&self) -> &[Name] {
        match self {
            TreeDef::Leaf | TreeDef::Static(_) => &[],
            TreeDef::Node { keys, .. } => keys,
        }
    }

    /// A readable path for every leaf, in order: `0.w1` is field `w1` of tuple element 0.
    pub fn leaf_paths(&self) -> Vec<String> {
        fn walk(def: &TreeDef, prefix: &str, out: &mut Vec<String>) {
            match def {
                TreeDef::Leaf => out.push(if prefix.is_empty() {
                    "arg".into()
                } else {
                    prefix.into()
                }),
                TreeDef::Static(_) => {}
                TreeDef::Node { keys, children, .. } => {
                    for (i, c) in children.iter().enumerate() {
                        let part = keys.get(i).map_or_else(|| i.to_string(), |k| k.to_string());
                        let p = if prefix.is_empty() {
                            part
                        } else {
                            format!("{prefix}.{part}")
                        };
                        walk(c, &p, out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(self, "", &mut out);
        out
    }

    /// A short text of the structure, `(Mlp{w1: *, b1: *}, *)`.
    pub fn describe(&self) -> String {
        match self {
            TreeDef::Leaf => "*".into(),
            TreeDef::Static(v) => format!("static {v:?}"),
            TreeDef::Node {
                kind,
                keys,
                children,
            } => {
                let inner: Vec<String> = children
                    .iter()
                    .enumerate()
                    .map(|(i, c)| match keys.get(i) {
                        Some(k) => format!("{k}: {}", c.describe()),
                        None => c.describe(),
                    })
                    .collect();
                format!("{kind}{{{}}}", inner.join(", "))
            }
        }
    }
}

/// A static value inside a [`TreeDef`]: any `Clone + Eq + Hash + Debug` value, compared and
/// hashed by its type and its own `==` and `Hash`.
#[derive(Clone)]
pub struct StaticValue(Arc<dyn DynStatic>);

/// The object-safe face of a static value's `Eq`, `Hash` and `Debug`.
trait DynStatic: Any + Send + Sync {
    fn eq_dyn(&self, other: &dyn DynStatic) -> bool;
    fn hash_dyn(&self, h: &mut dyn Hasher);
    fn fmt_dyn(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any + Eq + Hash + fmt::Debug + Send + Sync> DynStatic for T {
    fn eq_dyn(&self, other: &dyn DynStatic) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
    fn hash_dyn(&self, mut h: &mut dyn Hasher) {
        TypeId::of::<T>().hash(&mut h);
        self.hash(&mut h);
    }
    fn fmt_dyn(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl StaticValue {
    /// Wraps `value`.
    pub fn new<T: Any + Eq + Hash + fmt::Debug + Send + Sync>(value: T) -> StaticValue {
        StaticValue(Arc::new(value))
    }

    /// The value, when it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }
}

impl PartialEq for StaticValue {
    fn eq(&self, other: &StaticValue) -> bool {
        self.0.eq_dyn(&*other.0)
    }
}

impl Eq for StaticValue {}

impl Hash for StaticValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash_dyn(state);
    }
}

impl fmt::Debug for StaticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_dyn(f)
    }
}

/// A static argument of any type (JAX's `static_argnums` for a value of your own, an enum
/// choosing an activation, say): it has no leaves, `jit` traces once per distinct value, and
/// `grad`, `vmap` and `tree::map` pass it through. Fields of a `#[derive(Tree)]` struct marked
/// `#[tree(static)]` are the same without the wrapper.
///
/// ```
/// use tessera::prelude::*;
/// use tessera::tree::Static;
///
/// #[derive(Clone, PartialEq, Eq, Hash, Debug)]
/// enum Act { Tanh, Relu }
///
/// let f = jit(|(x, Static(act)): (Tensor, Static<Act>)| match act {
///     Act::Tanh => x.tanh(),
///     Act::Relu => x.relu(),
/// });
/// let x = Tensor::from_vec(vec![-1.0f32, 2.0], [2]);
/// assert_eq!(f.call((x.clone(), Static(Act::Relu))).unwrap().to_vec::<f32>(), [0.0, 2.0]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Static<T>(pub T);

/// The structure of a static value (what a `#[tree(static)]` field flattens to).
pub fn static_def<T: Any + Clone + Eq + Hash + fmt::Debug + Send + Sync>(value: &T) -> TreeDef {
    TreeDef::Static(StaticValue::new(value.clone()))
}

/// The value of a static node, or the mismatch.
pub fn static_value<T: Any + Clone>(def: &TreeDef) -> Result<T> {
    match def {
        TreeDef::Static(v) => v.get::<T>().cloned().ok_or_else(|| Error::Tree {
            message: format!(
                "expected a static {}, found static {v:?}",
                std::any::type_name::<T>()
            ),
            location: String::from("tree::unflatten"),
        }),
        other => Err(Error::Tree {
            message: format!(
                "expected a static {}, found {}",
                std::any::type_name::<T>(),
                other.describe()
            ),
            location: String::from("tree::unflatten"),
        }),
    }
}

impl<T: Any + Clone + Eq + Hash + fmt::Debug + Send + Sync> Tree for Static<T> {
    fn flatten_into(&self, _: &mut Vec<Tensor>) -> TreeDef {
        static_def(&self.0)
    }
    fn flatten_if(&self, def: &TreeDef, _: &mut Vec<Tensor>) -> bool {
        static_is(&self.0, def)
    }
    fn unflatten_from(def: &TreeDef, _: &mut Leaves<'_>) -> Result<Self> {
        static_value(def).map(Static)
    }
}

/// The leaves a tree is rebuilt from, in order: drained from a vector, so a caller that
/// rebuilds trees in a loop keeps one allocation.
pub type Leaves<'a> = std::vec::Drain<'a, Tensor>;

/// A value made of tensors. Implemented for `Tensor`, tuples up to 8, arrays, `Vec`, `Option`,
/// `BTreeMap<String, T>`, and derived for structs with `#[derive(Tree)]`.
pub trait Tree: Sized {
    /// Appends the leaves in order and returns the structure.
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef;
    /// Appends the leaves in order and says whether the structure is `def` (after `false`, the
    /// leaves appended are unspecified). `jit` checks a call against its last one this way: the
    /// containers here and `#[derive(Tree)]` compare without building a `TreeDef`, so a cache
    /// hit allocates nothing for the structure. The default builds it and compares.
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        self.flatten_into(leaves) == *def
    }
    /// Rebuilds a value of structure `def` from the next leaves.
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self>;
}

/// The children of `def` when it is a node of `kind` keyed exactly by `keys` (a derived
/// struct's test in [`Tree::flatten_if`]).
pub fn node_is<'a>(def: &'a TreeDef, kind: &str, keys: &[&str]) -> Option<&'a [TreeDef]> {
    match def {
        TreeDef::Node {
            kind: k,
            keys: ks,
            children,
        } if k == kind
            && ks.len() == keys.len()
            && children.len() == keys.len()
            && ks.iter().zip(keys).all(|(a, b)| a == b) =>
        {
            Some(children)
        }
        _ => None,
    }
}

/// The children of `def` when it is a key-less node of `kind`.
pub(crate) fn unkeyed_node<'a>(def: &'a TreeDef, kind: &str) -> Option<&'a [TreeDef]> {
    match def {
        TreeDef::Node {
            kind: k,
            keys,
            children,
        } if k == kind && keys.is_empty() => Some(children),
        _ => None,
    }
}

/// Whether `def` is the static node of `value` ([`static_def`]'s), compared without
/// allocating.
pub fn static_is<T: Any + Eq>(value: &T, def: &TreeDef) -> bool {
    matches!(def, TreeDef::Static(v) if v.get::<T>() == Some(value))
}

/// Whether `def` is the static leaf of `kind` whose value's text is `value`'s `Display`,
/// compared as it is written (no string is built).
fn static_text_is(def: &TreeDef, kind: &str, value: impl fmt::Display) -> bool {
    /// Matches what is written against the front of `rest`.
    struct Against<'a>(&'a str);
    impl fmt::Write for Against<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            match self.0.strip_prefix(s) {
                Some(rest) => {
                    self.0 = rest;
                    Ok(())
                }
                None => Err(fmt::Error),
            }
        }
    }
    match def {
        TreeDef::Node {
            kind: k,
            keys,
            children,
        } if k == kind && children.is_empty() && keys.len() == 1 => {
            let mut w = Against(&keys[0]);
            fmt::Write::write_fmt(&mut w, format_args!("{value}")).is_ok() && w.0.is_empty()
        }
        _ => false,
    }
}

/// The leaves and the structure of a tree.
pub fn flatten<T: Tree>(t: &T) -> (Vec<Tensor>, TreeDef) {
    let mut leaves = Vec::new();
    let def = t.flatten_into(&mut leaves);
    (leaves, def)
}

/// Rebuilds a tree from its structure and exactly as many leaves as it has.
pub fn unflatten<T: Tree>(def: &TreeDef, mut leaves: Vec<Tensor>) -> Result<T> {
    unflatten_drain(def, &mut leaves)
}

/// [`unflatten`] from the leaves of `leaves`, which is left empty (its allocation kept).
pub(crate) fn unflatten_drain<T: Tree>(def: &TreeDef, leaves: &mut Vec<Tensor>) -> Result<T> {
    let n = leaves.len();
    if n != def.num_leaves() {
        return Err(Error::Tree {
            message: format!(
                "{} has {} leaves, {n} were given",
                def.describe(),
                def.num_leaves()
            ),
            location: String::from("tree::unflatten"),
        });
    }
    T::unflatten_from(def, &mut leaves.drain(..))
}

/// The leaves of a tree, in order.
pub fn leaves<T: Tree>(t: &T) -> Vec<Tensor> {
    flatten(t).0
}

/// Applies `f` to every leaf, keeping the structure (`jax.tree.map`).
///
/// ```
/// use tessera::prelude::*;
///
/// #[derive(Tree, Clone)]
/// struct Params { w: Tensor, b: Tensor }
/// let p = Params { w: Tensor::ones([2, 2]), b: Tensor::zeros([2]) };
/// let q = tree::map(&p, |x| x * 0.5 + 1.0);
/// assert_eq!((q.w.to_vec::<f32>()[0], q.b.to_vec::<f32>()), (1.5, vec![1.0, 1.0]));
/// ```
#[track_caller]
pub fn map<T: Tree>(t: &T, f: impl FnMut(&Tensor) -> Tensor) -> T {
    let (leaves, def) = flatten(t);
    let out: Vec<Tensor> = leaves.iter().map(f).collect();
    unflatten(&def, out).unwrap_or_else(|e| raise(e))
}

/// Applies `f` to the leaves of two trees of the same structure, pairwise (`jax.tree.map(f,
/// a, b)`); the result has `a`'s type. Trees of different structures panic, naming both.
///
/// ```
/// use tessera::prelude::*;
///
/// let a = (Tensor::ones([2]), vec![Tensor::scalar(1.0f32)]);
/// let b = (Tensor::full([2], 3.0), vec![Tensor::scalar(2.0f32)]);
/// let s = tree::map2(&a, &b, |x, y| x + y);
/// assert_eq!((s.0.to_vec::<f32>(), s.1[0].item::<f32>()), (vec![4.0, 4.0], 3.0));
/// let other: (Tensor, Vec<Tensor>) = (Tensor::ones([2]), vec![]);
/// let mismatch = std::panic::AssertUnwindSafe(|| tree::map2(&a, &other, |x, _| x.clone()));
/// assert!(std::panic::catch_unwind(mismatch).is_err());
/// ```
#[track_caller]
pub fn map2<T: Tree, U: Tree>(a: &T, b: &U, mut f: impl FnMut(&Tensor, &Tensor) -> Tensor) -> T {
    let (la, da) = flatten(a);
    let (lb, db) = flatten(b);
    if da != db {
        raise(Error::Tree {
            message: format!("{} vs {}", da.describe(), db.describe()),
            location: loc_text(Location::caller()),
        });
    }
    let out: Vec<Tensor> = la.iter().zip(&lb).map(|(x, y)| f(x, y)).collect();
    unflatten(&da, out).unwrap_or_else(|e| raise(e))
}

/// Applies `f` to the leaves of any number of trees of one structure, leaf by leaf: `f`
/// gets the `trees.len()` leaves at one position (JAX's `tree.map(f, *trees)`). Panics (or
/// fails the trace) when the structures differ or `trees` is empty.
#[track_caller]
pub fn map_n<T: Tree>(trees: &[&T], mut f: impl FnMut(&[&Tensor]) -> Tensor) -> T {
    let location = loc_text(Location::caller());
    let Some(first) = trees.first() else {
        raise(Error::Tree {
            message: "tree::map_n of no trees".into(),
            location,
        });
    };
    let (l0, d0) = flatten(*first);
    let mut all = vec![l0];
    for t in &trees[1..] {
        let (l, d) = flatten(*t);
        if d != d0 {
            raise(Error::Tree {
                message: format!("{} vs {}", d0.describe(), d.describe()),
                location,
            });
        }
        all.push(l);
    }
    let out: Vec<Tensor> = (0..d0.num_leaves())
        .map(|i| {
            let row: Vec<&Tensor> = all.iter().map(|l| &l[i]).collect();
            f(&row)
        })
        .collect();
    unflatten(&d0, out).unwrap_or_else(|e| raise(e))
}

/// Applies `f` to the leaves of three trees of one structure.
#[track_caller]
pub fn map3<T: Tree, U: Tree, V: Tree>(
    a: &T,
    b: &U,
    c: &V,
    mut f: impl FnMut(&Tensor, &Tensor, &Tensor) -> Tensor,
) -> T {
    let (la, da) = flatten(a);
    let (lb, db) = flatten(b);
    let (lc, dc) = flatten(c);
    if da != db || da != dc {
        raise(Error::Tree {
            message: format!(
                "{} vs {} vs {}",
                da.describe(),
                db.describe(),
                dc.describe()
            ),
            location: loc_text(Location::caller()),
        });
    }
    let out: Vec<Tensor> = (0..la.len()).map(|i| f(&la[i], &lb[i], &lc[i])).collect();
    unflatten(&da, out).unwrap_or_else(|e| raise(e))
}

/// Folds `f` over the leaves in order, from `init` (JAX's `tree.reduce`): the global norm of
/// a gradient is `tree::reduce(&g, Tensor::scalar(0.0f32), |acc, x| acc + x.square().sum())`.
pub fn reduce<T: Tree, A>(t: &T, init: A, f: impl FnMut(A, &Tensor) -> A) -> A {
    leaves(t).iter().fold(init, f)
}

/// Applies `f` to every leaf with its path (`0.w1`, as [`TreeDef::leaf_paths`] names them;
/// JAX's `tree_util.tree_map_with_path`).
#[track_caller]
pub fn map_with_path<T: Tree>(t: &T, mut f: impl FnMut(&str, &Tensor) -> Tensor) -> T {
    let (leaves, def) = flatten(t);
    let paths = def.leaf_paths();
    let out: Vec<Tensor> = leaves.iter().zip(&paths).map(|(x, p)| f(p, x)).collect();
    unflatten(&def, out).unwrap_or_else(|e| raise(e))
}

impl Tree for Tensor {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        leaves.push(self.clone());
        TreeDef::Leaf
    }
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        leaves.push(self.clone());
        *def == TreeDef::Leaf
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
        match def {
            TreeDef::Leaf => leaves.next().ok_or_else(|| Error::Tree {
                message: "ran out of leaves".into(),
                location: String::from("tree::unflatten"),
            }),
            other => Err(Error::Tree {
                message: format!("expected a tensor, found {}", other.describe()),
                location: String::from("tree::unflatten"),
            }),
        }
    }
}

impl Tree for () {
    fn flatten_into(&self, _: &mut Vec<Tensor>) -> TreeDef {
        TreeDef::node("tuple", vec![], vec![])
    }
    fn flatten_if(&self, def: &TreeDef, _: &mut Vec<Tensor>) -> bool {
        unkeyed_node(def, "tuple").is_some_and(<[TreeDef]>::is_empty)
    }
    fn unflatten_from(def: &TreeDef, _: &mut Leaves<'_>) -> Result<Self> {
        def.children_of("tuple").map(|_| ())
    }
}

/// A static leaf (JAX's `static_argnums`): a non-tensor value that is part of the structure,
/// so `jit` keys its cache on it (one trace per value) and `grad`, `vmap` and `tree::map` pass
/// it through untouched. Its value is the node's one key, written so that it reads back
/// exactly (floats by their bits).
fn static_node(kind: &'static str, text: String) -> TreeDef {
    TreeDef::node(kind, vec![Name::Owned(text)], vec![])
}

/// The text of a static leaf of `kind`, or the mismatch.
fn static_text<'a>(def: &'a TreeDef, kind: &str) -> Result<&'a str> {
    def.children_of(kind)?;
    def.keys()
        .first()
        .map(|k| k.as_ref())
        .ok_or_else(|| Error::Tree {
            message: format!("a {kind} static leaf without its value"),
            location: String::from("tree::unflatten"),
        })
}

macro_rules! static_tree {
    ($($t:ty),+) => {$(
        impl Tree for $t {
            fn flatten_into(&self, _: &mut Vec<Tensor>) -> TreeDef {
                static_node(concat!("static ", stringify!($t)), self.to_string())
            }
            fn flatten_if(&self, def: &TreeDef, _: &mut Vec<Tensor>) -> bool {
                static_text_is(def, concat!("static ", stringify!($t)), self)
            }
            fn unflatten_from(def: &TreeDef, _: &mut Leaves<'_>) -> Result<Self> {
                let kind = concat!("static ", stringify!($t));
                let text = static_text(def, kind)?;
                text.parse().map_err(|_| Error::Tree {
                    message: format!("{text:?} is not a {kind}"),
                    location: String::from("tree::unflatten"),
                })
            }
        }
    )+};
}

static_tree!(
    usize, u8, u16, u32, u64, isize, i8, i16, i32, i64, bool, char, String
);

macro_rules! static_float_tree {
    ($($t:ty),+) => {$(
        impl Tree for $t {
            fn flatten_into(&self, _: &mut Vec<Tensor>) -> TreeDef {
                // By its bits: -0.0 and 0.0 (and each NaN) are distinct values for the cache.
                static_node(concat!("static ", stringify!($t)), format!("{:#x}", self.to_bits()))
            }
            fn flatten_if(&self, def: &TreeDef, _: &mut Vec<Tensor>) -> bool {
                let bits = format_args!("{:#x}", self.to_bits());
                static_text_is(def, concat!("static ", stringify!($t)), bits)
            }
            fn unflatten_from(def: &TreeDef, _: &mut Leaves<'_>) -> Result<Self> {
                let kind = concat!("static ", stringify!($t));
                let text = static_text(def, kind)?;
                text.strip_prefix("0x")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .and_then(|b| b.try_into().ok())
                    .map(<$t>::from_bits)
                    .ok_or_else(|| Error::Tree {
                        message: format!("{text:?} is not a {kind}"),
                        location: String::from("tree::unflatten"),
                    })
            }
        }
    )+};
}

static_float_tree!(f32, f64);

macro_rules! tuple_tree {
    ($($name:ident . $idx:tt),+) => {
        impl<$($name: Tree),+> Tree for ($($name,)+) {
            fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
                TreeDef::node("tuple", vec![], vec![$(self.$idx.flatten_into(leaves)),+])
            }
            fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
                match unkeyed_node(def, "tuple") {
                    Some(c) => c.len() == [$($idx),+].len() $(&& self.$idx.flatten_if(&c[$idx], leaves))+,
                    None => false,
                }
            }
            fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
                let c = def.children_of("tuple")?;
                let n = [$($idx),+].len();
                if c.len() != n {
                    return Err(Error::Tree {
                        message: format!("expected a tuple of {n}, found {}", def.describe()),
                        location: String::from("tree::unflatten"),
                    });
                }
                Ok(($($name::unflatten_from(&c[$idx], leaves)?,)+))
            }
        }
    };
}

tuple_tree!(A.0);
tuple_tree!(A.0, B.1);
tuple_tree!(A.0, B.1, C.2);
tuple_tree!(A.0, B.1, C.2, D.3);
tuple_tree!(A.0, B.1, C.2, D.3, E.4);
tuple_tree!(A.0, B.1, C.2, D.3, E.4, F.5);
tuple_tree!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
tuple_tree!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);

fn seq_unflatten<T: Tree>(def: &TreeDef, kind: &str, leaves: &mut Leaves<'_>) -> Result<Vec<T>> {
    def.children_of(kind)?
        .iter()
        .map(|c| T::unflatten_from(c, leaves))
        .collect()
}

/// Whether `def` is a key-less node of `kind` whose children are `items`' structures.
fn seq_flatten_if<T: Tree>(
    items: &[T],
    def: &TreeDef,
    kind: &str,
    leaves: &mut Vec<Tensor>,
) -> bool {
    unkeyed_node(def, kind).is_some_and(|c| {
        c.len() == items.len() && items.iter().zip(c).all(|(x, c)| x.flatten_if(c, leaves))
    })
}

impl<T: Tree> Tree for Vec<T> {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        TreeDef::node(
            "vec",
            vec![],
            self.iter().map(|x| x.flatten_into(leaves)).collect(),
        )
    }
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        seq_flatten_if(self, def, "vec", leaves)
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
        seq_unflatten(def, "vec", leaves)
    }
}

impl<T: Tree, const N: usize> Tree for [T; N] {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        TreeDef::node(
            "array",
            vec![],
            self.iter().map(|x| x.flatten_into(leaves)).collect(),
        )
    }
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        seq_flatten_if(self, def, "array", leaves)
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
        let v: Vec<T> = seq_unflatten(def, "array", leaves)?;
        v.try_into().map_err(|v: Vec<T>| Error::Tree {
            message: format!("expected an array of {N}, found {} items", v.len()),
            location: String::from("tree::unflatten"),
        })
    }
}

impl<T: Tree> Tree for Option<T> {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        match self {
            None => TreeDef::node("none", vec![], vec![]),
            Some(x) => TreeDef::node("some", vec![], vec![x.flatten_into(leaves)]),
        }
    }
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        match self {
            None => unkeyed_node(def, "none").is_some_and(<[TreeDef]>::is_empty),
            Some(x) => matches!(unkeyed_node(def, "some"), Some([c]) if x.flatten_if(c, leaves)),
        }
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
        match def.children_of("some") {
            Ok([c]) => Ok(Some(T::unflatten_from(c, leaves)?)),
            _ => def.children_of("none").map(|_| None),
        }
    }
}

impl<T: Tree> Tree for BTreeMap<String, T> {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        TreeDef::node(
            "map",
            self.keys().map(|k| Name::Owned(k.clone())).collect(),
            self.values().map(|x| x.flatten_into(leaves)).collect(),
        )
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut Leaves<'_>) -> Result<Self> {
        let children = def.children_of("map")?;
        def.keys()
            .iter()
            .zip(children)
            .map(|(k, c)| Ok((k.to_string(), T::unflatten_from(c, leaves)?)))
            .collect()
    }
}
