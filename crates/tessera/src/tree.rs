//! Trees (JAX's pytrees): values that flatten to a list of tensor leaves plus a structure
//! descriptor, and rebuild from them. `jit` keys its cache on the structure; `grad` and
//! `tree::map` walk the leaves.

use std::collections::BTreeMap;
use std::panic::Location;

use crate::error::{Error, Result, loc_text, raise};
use crate::tensor::Tensor;

/// The structure of a tree with its leaves taken out. Equal structures flatten to the same
/// number of leaves in the same order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeDef {
    Leaf,
    Node {
        /// What kind of node: `tuple`, `vec`, `array`, `option`, `map`, or a struct's name.
        kind: String,
        /// Field names or map keys, when the node has them.
        keys: Vec<String>,
        children: Vec<TreeDef>,
    },
}

impl TreeDef {
    pub fn node(kind: &str, keys: Vec<String>, children: Vec<TreeDef>) -> TreeDef {
        TreeDef::Node {
            kind: kind.to_string(),
            keys,
            children,
        }
    }

    /// The number of leaves.
    pub fn num_leaves(&self) -> usize {
        match self {
            TreeDef::Leaf => 1,
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
    pub fn keys(&self) -> &[String] {
        match self {
            TreeDef::Leaf => &[],
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
                TreeDef::Node { keys, children, .. } => {
                    for (i, c) in children.iter().enumerate() {
                        let part = keys.get(i).cloned().unwrap_or_else(|| i.to_string());
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

/// A value made of tensors. Implemented for `Tensor`, tuples up to 8, arrays, `Vec`, `Option`,
/// `BTreeMap<String, T>`, and derived for structs with `#[derive(Tree)]`.
pub trait Tree: Sized {
    /// Appends the leaves in order and returns the structure.
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef;
    /// Rebuilds a value of structure `def` from the next leaves.
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self>;
}

/// The leaves and the structure of a tree.
pub fn flatten<T: Tree>(t: &T) -> (Vec<Tensor>, TreeDef) {
    let mut leaves = Vec::new();
    let def = t.flatten_into(&mut leaves);
    (leaves, def)
}

/// Rebuilds a tree from its structure and exactly as many leaves as it has.
pub fn unflatten<T: Tree>(def: &TreeDef, leaves: Vec<Tensor>) -> Result<T> {
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
    let mut it = leaves.into_iter();
    T::unflatten_from(def, &mut it)
}

/// The leaves of a tree, in order.
pub fn leaves<T: Tree>(t: &T) -> Vec<Tensor> {
    flatten(t).0
}

/// Applies `f` to every leaf, keeping the structure.
#[track_caller]
pub fn map<T: Tree>(t: &T, f: impl FnMut(&Tensor) -> Tensor) -> T {
    let (leaves, def) = flatten(t);
    let out: Vec<Tensor> = leaves.iter().map(f).collect();
    unflatten(&def, out).unwrap_or_else(|e| raise(e))
}

/// Applies `f` to the leaves of two trees of the same structure, pairwise.
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

impl Tree for Tensor {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        leaves.push(self.clone());
        TreeDef::Leaf
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
    fn unflatten_from(def: &TreeDef, _: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
        def.children_of("tuple").map(|_| ())
    }
}

/// A static leaf (JAX's `static_argnums`): a non-tensor value that is part of the structure,
/// so `jit` keys its cache on it (one trace per value) and `grad`, `vmap` and `tree::map` pass
/// it through untouched. Its value is the node's one key, written so that it reads back
/// exactly (floats by their bits).
fn static_node(kind: &str, text: String) -> TreeDef {
    TreeDef::node(kind, vec![text], vec![])
}

/// The text of a static leaf of `kind`, or the mismatch.
fn static_text<'a>(def: &'a TreeDef, kind: &str) -> Result<&'a str> {
    def.children_of(kind)?;
    def.keys()
        .first()
        .map(String::as_str)
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
            fn unflatten_from(def: &TreeDef, _: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
            fn unflatten_from(def: &TreeDef, _: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
            fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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

fn seq_unflatten<T: Tree>(
    def: &TreeDef,
    kind: &str,
    leaves: &mut std::vec::IntoIter<Tensor>,
) -> Result<Vec<T>> {
    def.children_of(kind)?
        .iter()
        .map(|c| T::unflatten_from(c, leaves))
        .collect()
}

impl<T: Tree> Tree for Vec<T> {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        TreeDef::node(
            "vec",
            vec![],
            self.iter().map(|x| x.flatten_into(leaves)).collect(),
        )
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
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
            self.keys().cloned().collect(),
            self.values().map(|x| x.flatten_into(leaves)).collect(),
        )
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut std::vec::IntoIter<Tensor>) -> Result<Self> {
        let children = def.children_of("map")?;
        def.keys()
            .iter()
            .zip(children)
            .map(|(k, c)| Ok((k.clone(), T::unflatten_from(c, leaves)?)))
            .collect()
    }
}
