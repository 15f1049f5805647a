//! Trees of the user's own types (issue 16, item 4): `#[derive(Tree)]` on structs of every
//! shape, enums and generics, `#[tree(static)]` fields and `tree::Static` as static arguments
//! of `jit`, and the N-ary `tree::map_n` / `map3`, `tree::reduce`, `tree::map_with_path`.

use tessera::prelude::*;
use tessera::tree::{Static, TreeDef};

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Act {
    Tanh,
    Relu,
}

#[derive(Tree, Clone)]
struct Dense {
    w: Tensor,
    b: Tensor,
    #[tree(static)]
    act: Act,
    #[tree(static)]
    name: String,
}

fn apply(d: &Dense, x: &Tensor) -> Tensor {
    let h = x.matmul(&d.w) + &d.b;
    match d.act {
        Act::Tanh => h.tanh(),
        Act::Relu => h.relu(),
    }
}

fn v(xs: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(xs.to_vec(), shape.to_vec())
}

fn dense(act: Act) -> Dense {
    Dense {
        w: v(&[1.0, -2.0, 0.5, 1.5], &[2, 2]),
        b: v(&[0.25, -0.5], &[2]),
        act,
        name: "layer".into(),
    }
}

/// A static field is part of the structure: it has no leaves, it survives a round trip, and
/// `jit` traces once per value of it (and reuses the program for a value it has seen).
#[test]
fn static_fields_key_the_jit_cache() {
    let d = dense(Act::Relu);
    let (leaves, def) = tree::flatten(&d);
    assert_eq!(leaves.len(), 2, "the static fields have no leaves");
    assert_eq!(def.leaf_paths(), ["w", "b"]);
    let back: Dense = tree::unflatten(&def, leaves).unwrap();
    assert_eq!((back.act, back.name.as_str()), (Act::Relu, "layer"));

    let f = jit(|(d, x): (Dense, Tensor)| apply(&d, &x));
    let x = v(&[1.0, 1.0], &[1, 2]);
    let relu = f.call((dense(Act::Relu), x.clone())).unwrap();
    let tanh = f.call((dense(Act::Tanh), x.clone())).unwrap();
    assert_eq!(f.trace_count(), 2, "one trace per static value");
    assert_eq!(
        f.call((dense(Act::Relu), x.clone()))
            .unwrap()
            .to_vec::<f32>(),
        relu.to_vec::<f32>()
    );
    assert_eq!(f.trace_count(), 2, "a value seen before reuses its program");
    let mut other = dense(Act::Relu);
    other.name = "other".into();
    f.call((other, x.clone())).unwrap();
    assert_eq!(f.trace_count(), 3, "every static field is in the key");
    // x @ w + b = [1 + 0.5, -2 + 1.5] + [0.25, -0.5] = [1.75, -1.0].
    assert_eq!(relu.to_vec::<f32>(), [1.75, 0.0]);
    assert_eq!(tanh.to_vec::<f32>(), [1.75f32.tanh(), (-1.0f32).tanh()]);
}

/// `grad` of a struct with static fields returns the same struct, the static fields as given
/// and gradients in the tensor fields.
#[test]
fn grad_passes_static_fields_through() {
    let x = v(&[1.0, 1.0], &[1, 2]);
    let g = grad(|d: &Dense| apply(d, &x).sum())(&dense(Act::Relu));
    assert_eq!(g.act, Act::Relu);
    assert_eq!(g.name, "layer");
    // relu' is 1 for the first output (1.75) and 0 for the second (-1.0).
    assert_eq!(g.b.to_vec::<f32>(), [1.0, 0.0]);
    assert_eq!(g.w.to_vec::<f32>(), [1.0, 0.0, 1.0, 0.0]);
}

/// `tree::Static` wraps a value of any hashable type as a static argument.
#[test]
fn the_static_wrapper_is_a_static_argument() {
    let f = jit(|(x, Static(act)): (Tensor, Static<Act>)| match act {
        Act::Tanh => x.tanh(),
        Act::Relu => x.relu(),
    });
    let x = v(&[-1.0, 2.0], &[2]);
    assert_eq!(
        f.call((x.clone(), Static(Act::Relu)))
            .unwrap()
            .to_vec::<f32>(),
        [0.0, 2.0]
    );
    f.call((x.clone(), Static(Act::Tanh))).unwrap();
    f.call((x.clone(), Static(Act::Relu))).unwrap();
    assert_eq!(f.trace_count(), 2);
}

#[derive(Tree, Clone)]
enum Layer {
    Linear { w: Tensor, b: Tensor },
    Scale(Tensor),
    Identity,
}

fn run(l: &Layer, x: &Tensor) -> Tensor {
    match l {
        Layer::Linear { w, b } => x.matmul(w) + b,
        Layer::Scale(s) => x * s,
        Layer::Identity => x.clone(),
    }
}

/// An enum's structure names its variant, so a `Vec` of layers of different kinds flattens,
/// round-trips, differentiates and jits; another variant is another structure.
#[test]
fn enums_are_trees_keyed_by_variant() {
    let layers = vec![
        Layer::Linear {
            w: v(&[2.0, 0.0, 0.0, 3.0], &[2, 2]),
            b: v(&[1.0, 1.0], &[2]),
        },
        Layer::Identity,
        Layer::Scale(v(&[0.5], &[])),
    ];
    let (leaves, def) = tree::flatten(&layers);
    assert_eq!(leaves.len(), 3);
    assert_eq!(def.leaf_paths(), ["0.w", "0.b", "2.0"]);
    assert!(
        def.describe().contains("Layer::Identity"),
        "{}",
        def.describe()
    );
    let back: Vec<Layer> = tree::unflatten(&def, leaves).unwrap();
    assert!(matches!(back[1], Layer::Identity));
    assert!(matches!(&back[2], Layer::Scale(s) if s.item::<f32>() == 0.5));

    let x = v(&[1.0, 2.0], &[1, 2]);
    let forward = |ls: &Vec<Layer>| ls.iter().fold(x.clone(), |h, l| run(l, &h)).sum();
    // ((x @ diag(2,3)) + 1) * 0.5 = [1.5, 3.5].
    assert_eq!(forward(&layers).item::<f32>(), 5.0);
    let g = grad(forward)(&layers);
    match &g[2] {
        Layer::Scale(s) => assert_eq!(s.item::<f32>(), 10.0),
        _ => panic!("the gradient keeps the variants"),
    }
    match &g[0] {
        Layer::Linear { w, b } => {
            assert_eq!(b.to_vec::<f32>(), [0.5, 0.5]);
            assert_eq!(w.to_vec::<f32>(), [0.5, 0.5, 1.0, 1.0]);
        }
        _ => panic!("the gradient keeps the variants"),
    }

    let f = jit(|(l, x): (Layer, Tensor)| run(&l, &x));
    f.call((Layer::Identity, x.clone())).unwrap();
    f.call((Layer::Scale(v(&[2.0], &[])), x.clone())).unwrap();
    f.call((Layer::Scale(v(&[3.0], &[])), x.clone())).unwrap();
    assert_eq!(f.trace_count(), 2, "one trace per variant");

    let wrong = tree::unflatten::<Layer>(&TreeDef::node("Other", vec![], vec![]), vec![]);
    let msg = wrong.err().unwrap().to_string();
    assert!(
        msg.contains("Layer::Linear or Layer::Scale or Layer::Identity"),
        "{msg}"
    );
}

#[derive(Tree, Clone)]
struct Pair(Tensor, Tensor);

#[derive(Tree, Clone)]
struct Unit;

#[derive(Tree, Clone)]
struct Wrapped<T> {
    inner: T,
    extra: Tensor,
}

/// Tuple, unit and generic structs derive too; a generic parameter must itself be a tree.
#[test]
fn tuple_unit_and_generic_structs() {
    let p = Pair(v(&[1.0], &[1]), v(&[2.0], &[1]));
    assert_eq!(tree::flatten(&p).1.leaf_paths(), ["0", "1"]);
    assert_eq!(tree::leaves(&Unit).len(), 0);
    let w = Wrapped {
        inner: p,
        extra: v(&[3.0], &[1]),
    };
    assert_eq!(
        tree::flatten(&w).1.leaf_paths(),
        ["inner.0", "inner.1", "extra"]
    );
    let doubled = tree::map(&w, |x| x * 2.0);
    assert_eq!(doubled.inner.1.to_vec::<f32>(), [4.0]);
    let _: Unit = tree::unflatten(&tree::flatten(&Unit).1, vec![]).unwrap();
}

/// `map_n` sees the leaves of all its trees at one position; `map3` is its three-tree form;
/// `reduce` folds the leaves in order; `map_with_path` names each leaf.
#[test]
fn n_ary_map_reduce_and_paths() {
    let a = (v(&[1.0, 2.0], &[2]), v(&[3.0], &[1]));
    let b = (v(&[10.0, 20.0], &[2]), v(&[30.0], &[1]));
    let c = (v(&[100.0, 200.0], &[2]), v(&[300.0], &[1]));
    let s = tree::map_n(&[&a, &b, &c], |xs| {
        xs.iter().fold(Tensor::scalar(0.0f32), |acc, x| acc + *x)
    });
    assert_eq!(s.0.to_vec::<f32>(), [111.0, 222.0]);
    assert_eq!(s.1.to_vec::<f32>(), [333.0]);
    let m = tree::map3(&a, &b, &c, |x, y, z| x * y - z);
    assert_eq!(m.0.to_vec::<f32>(), [-90.0, -160.0]);
    let sq = tree::reduce(&a, Tensor::scalar(0.0f32), |acc, x| acc + x.square().sum());
    assert_eq!(sq.item::<f32>(), 14.0);
    let count = tree::reduce(&c, 0usize, |n, x| n + x.numel());
    assert_eq!(count, 3);
    let named = tree::map_with_path(&a, |path, x| if path == "1" { x * 0.0 } else { x.clone() });
    assert_eq!(named.1.to_vec::<f32>(), [0.0]);
    assert_eq!(named.0.to_vec::<f32>(), [1.0, 2.0]);

    let empty = std::panic::catch_unwind(|| tree::map_n::<(Tensor, Tensor)>(&[], |x| x[0].clone()));
    assert!(empty.is_err(), "map_n of no trees is an error");
    let other = (a.0.clone(), (a.1.clone(),));
    let differ = std::panic::catch_unwind(|| tree::map3(&a, &b, &other, |x, _, _| x.clone()));
    assert!(differ.is_err(), "map3 of different structures is an error");
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Config {
    depth: usize,
}

/// A type parameter used only in a static field needs no `Tree` bound, and a `PhantomData`
/// of one is fine; an enum without variants derives too.
#[derive(Tree, Clone)]
struct Generic<A, T> {
    w: T,
    #[tree(static)]
    conf: A,
    #[tree(static)]
    marker: std::marker::PhantomData<A>,
}

#[derive(Tree, Clone)]
enum Never {}

#[test]
fn generic_static_fields_need_no_tree_bound() {
    let g = Generic {
        w: Tensor::ones([2]),
        conf: Config { depth: 3 },
        marker: std::marker::PhantomData,
    };
    let (leaves, def) = tree::flatten(&g);
    assert_eq!(leaves.len(), 1);
    let back: Generic<Config, Tensor> = tree::unflatten(&def, leaves).unwrap();
    assert_eq!(back.conf.depth, 3);
    let f = jit(|g: Generic<Config, Tensor>| &g.w * (g.conf.depth as f32));
    assert_eq!(f.call(g).unwrap().to_vec::<f32>(), [3.0, 3.0]);
    assert!(tree::unflatten::<Never>(&TreeDef::node("x", vec![], vec![]), vec![]).is_err());
}

#[derive(Tree, Clone)]
struct Named {
    a: Tensor,
    #[tree(static)]
    k: usize,
}

/// A tree of some type, behind one type: given a structure, its own structure and whether
/// `flatten_if` says it is that one (appending its leaves).
type Shaped = Box<dyn Fn(&mut Vec<Tensor>, &TreeDef) -> (TreeDef, bool)>;

/// Builds a value of one of several structures (every container, static leaves whose texts
/// are prefixes of each other, enum variants, derived structs) under a common type.
fn shaped(i: usize) -> Shaped {
    fn both<T: Tree + 'static>(t: T) -> Shaped {
        Box::new(move |leaves, def| {
            let own = t.flatten_into(&mut Vec::new());
            (own, t.flatten_if(def, leaves))
        })
    }
    let x = || v(&[1.0], &[1]);
    match i {
        0 => both(x()),
        1 => both(()),
        2 => both((x(),)),
        3 => both((x(), x())),
        4 => both(vec![x()]),
        5 => both(vec![x(), x()]),
        6 => both(Vec::<Tensor>::new()),
        7 => both([x(), x()]),
        8 => both(Some(x())),
        9 => both(None::<Tensor>),
        10 => both(1usize),
        11 => both(12usize),
        12 => both(-0.0f32),
        13 => both(0.0f32),
        14 => both(Static(Act::Tanh)),
        15 => both(Static(Act::Relu)),
        16 => both(Named { a: x(), k: 1 }),
        17 => both(Named { a: x(), k: 12 }),
        18 => both(Layer::Scale(x())),
        19 => both(Layer::Identity),
        20 => both(Pair(x(), x())),
        21 => both(Unit),
        22 => both(Key::new(0)),
        23 => both(std::collections::BTreeMap::from([("w".to_string(), x())])),
        24 => both(std::collections::BTreeMap::from([("b".to_string(), x())])),
        25 => both((vec![Some(x())], 3u8)),
        26 => both((vec![None::<Tensor>], 3u8)),
        27 => both((vec![Some(x())], 30u8)),
        28 => both(true),
        _ => both(String::from("ab")),
    }
}

/// `Tree::flatten_if` (how `jit` checks a call against the last one's structure without
/// building a `TreeDef`) says `true` exactly when `flatten_into` would give an equal
/// structure, for every pair of a varied set of trees, and then appends the same leaves.
#[test]
fn flatten_if_agrees_with_comparing_the_built_structure() {
    const N: usize = 30;
    for i in 0..N {
        let (def_i, _) = shaped(i)(&mut Vec::new(), &TreeDef::Leaf);
        for j in 0..N {
            let mut leaves = Vec::new();
            let (def_j, same) = shaped(j)(&mut leaves, &def_i);
            assert_eq!(
                same,
                def_j == def_i,
                "{} against {}",
                def_j.describe(),
                def_i.describe()
            );
            if same {
                assert_eq!(leaves.len(), def_i.num_leaves());
            }
        }
    }
}

/// A hand-written tree whose `flatten_into` calls the very jit it is an argument of (once,
/// when `NEST` is set), with a new shape: the nested call compiles while the outer one is
/// checking its structure against the last call's (`Cache::last_hit_of` takes that
/// signature out of its cell while the tree flattens, so the nested compile can replace it).
struct Reentrant(Tensor);

impl tessera::tree::Tree for Reentrant {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        if NEST.with(|n| n.replace(false)) {
            let inner = J.with(|j| j.call(Reentrant(Tensor::ones([3]))).unwrap());
            assert_eq!(inner.to_vec::<f32>(), [2.0; 3]);
        }
        leaves.push(self.0.clone());
        TreeDef::node("reentrant", vec![], vec![TreeDef::Leaf])
    }
    fn unflatten_from(
        def: &TreeDef,
        leaves: &mut tessera::tree::Leaves<'_>,
    ) -> tessera::Result<Self> {
        let c = def.children_of("reentrant")?;
        Ok(Reentrant(Tensor::unflatten_from(&c[0], leaves)?))
    }
}

fn doubled(r: Reentrant) -> Tensor {
    &r.0 * 2.0
}

type ReentrantJit = tessera::jit::Jitted<fn(Reentrant) -> Tensor, Reentrant, Tensor>;

thread_local! {
    static NEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static J: ReentrantJit = jit(doubled as fn(Reentrant) -> Tensor);
}

#[test]
fn a_tree_may_call_its_own_jit_while_it_flattens() {
    J.with(|j| {
        let x = Tensor::full([2], 1.5f32);
        assert_eq!(
            j.call(Reentrant(x.clone())).unwrap().to_vec::<f32>(),
            [3.0; 2]
        );
        NEST.with(|n| n.set(true));
        assert_eq!(
            j.call(Reentrant(x.clone())).unwrap().to_vec::<f32>(),
            [3.0; 2]
        );
        assert!(!NEST.with(|n| n.get()), "the nested call ran");
        assert_eq!(j.call(Reentrant(x)).unwrap().to_vec::<f32>(), [3.0; 2]);
        assert_eq!(j.trace_count(), 2);
    });
}
