//! The rewrite rules, grouped by topic, each with the law it encodes. No general commutativity
//! or associativity: every rule is a direct pattern whose right side is never worse.
//! `tests/rules.rs` evaluates both sides of every rule with the interpreter on random inputs.

use egg::{
    Applier, ConditionalApplier, EGraph, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var,
};
use tessera_ir::{BinaryOp, DotDims, Op, ReduceKind, TensorType};

use crate::lang::{Node, TensorAnalysis, splat_literal};

type EG = EGraph<Node, TensorAnalysis>;

fn pat(s: &str) -> Pattern<Node> {
    s.parse().expect("rule patterns parse")
}

/// `?v` is a splat of `value` with the matched class's type.
/// `?v` is a splat of zero that leaves every `x` as it is under the rule: for floats only the
/// zero of the given sign (`x + -0 == x` and `x - +0 == x` bit for bit, `-0` included, while
/// `-0 + +0` is `+0`); for integers any zero.
fn identity_zero(v: &'static str, negative: bool) -> impl Fn(&mut EG, Id, &Subst) -> bool {
    let var: Var = v.parse().expect("a variable");
    move |eg, class, subst| {
        let data = &eg[subst[var]].data;
        data.ty == eg[class].data.ty
            && data.splat.is_some_and(|z| {
                let float = data.ty.as_ref().is_some_and(|t| t.dtype.is_float());
                z == 0.0 && (!float || z.is_sign_negative() == negative)
            })
    }
}

fn splat_of(v: &'static str, value: f64) -> impl Fn(&mut EG, Id, &Subst) -> bool {
    let var: Var = v.parse().expect("a variable");
    move |eg, class, subst| {
        eg[subst[var]].data.splat == Some(value) && eg[subst[var]].data.ty == eg[class].data.ty
    }
}

fn cond(
    name: &str,
    lhs: &str,
    rhs: &str,
    c: impl Fn(&mut EG, Id, &Subst) -> bool + Send + Sync + 'static,
) -> Rewrite<Node, TensorAnalysis> {
    Rewrite::new(
        name,
        pat(lhs),
        ConditionalApplier {
            condition: c,
            applier: pat(rhs),
        },
    )
    .expect("rule is well formed")
}

fn custom(
    name: &str,
    lhs: &str,
    f: fn(&mut EG, Id, &Subst) -> Vec<Id>,
) -> Rewrite<Node, TensorAnalysis> {
    Rewrite::new(name, pat(lhs), Custom(f)).expect("rule is well formed")
}

/// An applier written in Rust: it reads the attributes of the matched nodes.
struct Custom(fn(&mut EG, Id, &Subst) -> Vec<Id>);

impl Applier<Node, TensorAnalysis> for Custom {
    fn apply_one(
        &self,
        eg: &mut EG,
        class: Id,
        subst: &Subst,
        _: Option<&PatternAst<Node>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let want = eg[class].data.ty.clone();
        let out = (self.0)(eg, class, subst);
        // A rewrite never changes a value's type; a rule that would is a bug, caught here.
        debug_assert!(
            out.iter().all(|&i| eg[i].data.ty == want),
            "rule {rule} changed a type: {want:?} -> {:?}",
            out.iter()
                .map(|&i| eg[i].data.ty.clone())
                .collect::<Vec<_>>()
        );
        // An applier unions what it built with the matched class itself, and reports the
        // classes that changed.
        let mut changed = Vec::new();
        let keep: Vec<Id> = out.into_iter().filter(|&i| eg[i].data.ty == want).collect();
        for i in keep {
            if eg.union(class, i) {
                changed.push(eg.find(class));
            }
        }
        changed
    }
}

/// `rules()`, built once per process: building them parses every pattern and compiles its
/// matcher, 6% of lowering the seed step (`perf`, warm process), on every `simplify`.
pub(crate) fn all() -> &'static [Rewrite<Node, TensorAnalysis>] {
    static RULES: std::sync::OnceLock<Vec<Rewrite<Node, TensorAnalysis>>> =
        std::sync::OnceLock::new();
    RULES.get_or_init(rules)
}

/// Every rule, by topic.
pub fn rules() -> Vec<Rewrite<Node, TensorAnalysis>> {
    vec![
        // ---- arithmetic
        // x * 1 = x
        cond("mul-one", "(mul ?x ?c)", "?x", splat_of("?c", 1.0)),
        cond("one-mul", "(mul ?c ?x)", "?x", splat_of("?c", 1.0)),
        // x + -0 = x (for floats not x + +0: -0 + +0 is +0)
        cond("add-zero", "(add ?x ?c)", "?x", identity_zero("?c", true)),
        cond("zero-add", "(add ?c ?x)", "?x", identity_zero("?c", true)),
        // x - +0 = x (for floats not x - -0: -0 - -0 is +0)
        cond("sub-zero", "(sub ?x ?c)", "?x", identity_zero("?c", false)),
        // -(-x) = x
        Rewrite::new("neg-neg", pat("(neg (neg ?x))"), pat("?x")).expect("rule"),
        // x / 1 = x
        cond("div-one", "(div ?x ?c)", "?x", splat_of("?c", 1.0)),
        // x - x = 0, for integers only: for floats NaN - NaN and inf - inf are NaN, not 0
        custom("sub-self", "(sub ?x ?x)", sub_self),
        // ---- movement
        // transpose(transpose(x, p), q) = transpose(x, p∘q), or x when that is the identity
        custom(
            "transpose-transpose",
            "(transpose (transpose ?x))",
            transpose_transpose,
        ),
        // reshape(reshape(x)) = reshape(x)
        custom("reshape-reshape", "(reshape (reshape ?x))", reshape_reshape),
        // broadcast(broadcast(x, d1), d2) = broadcast(x, d2∘d1)
        custom(
            "broadcast-broadcast",
            "(broadcast_in_dim (broadcast_in_dim ?x))",
            broadcast_broadcast,
        ),
        // ---- reductions
        // sum over the added dims of broadcast(x) = x * (product of their sizes)
        custom(
            "reduce-broadcast",
            "(reduce_sum (broadcast_in_dim ?x))",
            reduce_broadcast,
        ),
        // ---- dot
        // dot(transpose(a), b) = dot(a, b) with the transpose in the dimension numbers, when
        // the free dims keep their order (the result is then the same array)
        custom(
            "dot-transpose-lhs",
            "(dot_general (transpose ?a) ?b)",
            dot_transpose_lhs,
        ),
        custom(
            "dot-transpose-rhs",
            "(dot_general ?a (transpose ?b))",
            dot_transpose_rhs,
        ),
        // transpose(dot(a, b)) = dot(b, a) when the transpose swaps the two operands' free dims
        // (batch dims staying first): the product comes out in the layout its users read, so
        // no kernel reads it strided (the weight gradients of a dense layer)
        custom(
            "transpose-dot",
            "(transpose (dot_general ?a ?b))",
            transpose_dot,
        ),
    ]
}

/// The nodes of `class` with the mnemonic `name`.
fn nodes(eg: &EG, class: Id, name: &str) -> Vec<Node> {
    eg[class]
        .nodes
        .iter()
        .filter(|n| n.op.name() == name)
        .cloned()
        .collect()
}

fn ty(eg: &EG, c: Id) -> Option<TensorType> {
    eg[c].data.ty.clone()
}

fn add(eg: &mut EG, op: Op, children: Vec<Id>) -> Id {
    eg.add(Node::new(op, children, None))
}

fn sub_self(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let x = subst["?x".parse::<Var>().expect("var")];
    match ty(eg, x).filter(|t| t.dtype.is_int()) {
        Some(t) => {
            let zero = add(eg, Op::Constant(splat_literal(&t, 0.0)), vec![]);
            let _ = class;
            vec![zero]
        }
        None => vec![],
    }
}

fn transpose_transpose(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let x = eg.find(subst["?x".parse::<Var>().expect("var")]);
    let mut out = Vec::new();
    for outer in nodes(eg, class, "transpose") {
        let Op::Transpose(q) = &*outer.op else {
            continue;
        };
        for inner in nodes(eg, outer.children[0], "transpose") {
            let Op::Transpose(p) = &*inner.op else {
                continue;
            };
            if eg.find(inner.children[0]) != x {
                continue;
            }
            let perm: Vec<usize> = q.iter().map(|&i| p[i]).collect();
            if perm.iter().enumerate().all(|(i, &v)| i == v) {
                out.push(x);
            } else {
                out.push(add(eg, Op::Transpose(perm), vec![x]));
            }
        }
    }
    out
}

fn reshape_reshape(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let x = eg.find(subst["?x".parse::<Var>().expect("var")]);
    let mut out = Vec::new();
    for outer in nodes(eg, class, "reshape") {
        let Op::Reshape(shape) = &*outer.op else {
            continue;
        };
        if nodes(eg, outer.children[0], "reshape")
            .iter()
            .any(|n| eg.find(n.children[0]) == x)
        {
            if ty(eg, x).is_some_and(|t| t.shape == *shape) {
                out.push(x);
            } else {
                out.push(add(eg, Op::Reshape(shape.clone()), vec![x]));
            }
        }
    }
    out
}

fn broadcast_broadcast(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let x = eg.find(subst["?x".parse::<Var>().expect("var")]);
    let mut out = Vec::new();
    for outer in nodes(eg, class, "broadcast_in_dim") {
        let Op::BroadcastInDim { shape, dims: d2 } = &*outer.op else {
            continue;
        };
        for inner in nodes(eg, outer.children[0], "broadcast_in_dim") {
            let Op::BroadcastInDim { dims: d1, .. } = &*inner.op else {
                continue;
            };
            if eg.find(inner.children[0]) != x {
                continue;
            }
            let dims: Vec<usize> = d1.iter().map(|&d| d2[d]).collect();
            out.push(add(
                eg,
                Op::BroadcastInDim {
                    shape: shape.clone(),
                    dims,
                },
                vec![x],
            ));
        }
    }
    out
}

fn reduce_broadcast(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let x = eg.find(subst["?x".parse::<Var>().expect("var")]);
    let Some(xt) = ty(eg, x) else { return vec![] };
    let mut out = Vec::new();
    for red in nodes(eg, class, "reduce_sum") {
        let Op::Reduce {
            kind: ReduceKind::Sum,
            axes,
        } = &*red.op
        else {
            continue;
        };
        for b in nodes(eg, red.children[0], "broadcast_in_dim") {
            let Op::BroadcastInDim { shape, dims } = &*b.op else {
                continue;
            };
            if eg.find(b.children[0]) != x {
                continue;
            }
            let added: Vec<usize> = (0..shape.rank()).filter(|d| !dims.contains(d)).collect();
            let mut sorted = axes.clone();
            sorted.sort_unstable();
            let kept_whole = dims
                .iter()
                .enumerate()
                .all(|(i, &d)| xt.dims()[i] == shape.dims()[d]);
            if sorted != added || !kept_whole || xt.dtype == tessera_ir::DType::Bool {
                continue;
            }
            let count: usize = added.iter().map(|&d| shape.dims()[d]).product();
            let c = add(
                eg,
                Op::Constant(splat_literal(&TensorType::scalar(xt.dtype), count as f64)),
                vec![],
            );
            let cb = if xt.rank() == 0 {
                c
            } else {
                add(
                    eg,
                    Op::BroadcastInDim {
                        shape: xt.shape.clone(),
                        dims: vec![],
                    },
                    vec![c],
                )
            };
            out.push(add(eg, Op::Binary(BinaryOp::Mul), vec![x, cb]));
        }
    }
    out
}

/// Folds `transpose(a, p)` into the `side` operand's dimension numbers, when `a`'s free dims
/// keep the order they have in the transposed operand.
fn fold_transpose(dd: &DotDims, p: &[usize], lhs: bool) -> Option<DotDims> {
    let map = |v: &[usize]| v.iter().map(|&i| p[i]).collect::<Vec<usize>>();
    let mut out = dd.clone();
    let free_t = if lhs {
        dd.lhs_free(p.len())
    } else {
        dd.rhs_free(p.len())
    };
    let free_a = map(&free_t);
    if free_a.windows(2).any(|w| w[0] > w[1]) {
        return None;
    }
    if lhs {
        out.lhs_batch = map(&dd.lhs_batch);
        out.lhs_contract = map(&dd.lhs_contract);
    } else {
        out.rhs_batch = map(&dd.rhs_batch);
        out.rhs_contract = map(&dd.rhs_contract);
    }
    Some(out)
}

fn dot_transpose(eg: &mut EG, class: Id, subst: &Subst, lhs: bool) -> Vec<Id> {
    let (ta, other) = if lhs { ("?a", "?b") } else { ("?b", "?a") };
    let a = eg.find(subst[ta.parse::<Var>().expect("var")]);
    let o = eg.find(subst[other.parse::<Var>().expect("var")]);
    let mut out = Vec::new();
    for dot in nodes(eg, class, "dot_general") {
        let Op::DotGeneral(dd) = &*dot.op else {
            continue;
        };
        let side = if lhs {
            dot.children[0]
        } else {
            dot.children[1]
        };
        for t in nodes(eg, side, "transpose") {
            let Op::Transpose(p) = &*t.op else { continue };
            if eg.find(t.children[0]) != a {
                continue;
            }
            if let Some(nd) = fold_transpose(dd, p, lhs) {
                let kids = if lhs { vec![a, o] } else { vec![o, a] };
                out.push(add(eg, Op::DotGeneral(nd), kids));
            }
        }
    }
    out
}

fn transpose_dot(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    let a = eg.find(subst["?a".parse::<Var>().expect("var")]);
    let b = eg.find(subst["?b".parse::<Var>().expect("var")]);
    let mut out = Vec::new();
    for t in nodes(eg, class, "transpose") {
        let Op::Transpose(p) = &*t.op else { continue };
        for dot in nodes(eg, t.children[0], "dot_general") {
            let Op::DotGeneral(dd) = &*dot.op else {
                continue;
            };
            if eg.find(dot.children[0]) != a || eg.find(dot.children[1]) != b {
                continue;
            }
            let (Some(ta), Some(tb)) = (ty(eg, a), ty(eg, b)) else {
                continue;
            };
            let nb = dd.lhs_batch.len();
            let na = dd.lhs_free(ta.rank()).len();
            let nr = dd.rhs_free(tb.rank()).len();
            let swapped: Vec<usize> = (0..nb)
                .chain(nb + na..nb + na + nr)
                .chain(nb..nb + na)
                .collect();
            if *p != swapped {
                continue;
            }
            let nd = DotDims {
                lhs_batch: dd.rhs_batch.clone(),
                rhs_batch: dd.lhs_batch.clone(),
                lhs_contract: dd.rhs_contract.clone(),
                rhs_contract: dd.lhs_contract.clone(),
            };
            out.push(add(eg, Op::DotGeneral(nd), vec![b, a]));
        }
    }
    out
}

fn dot_transpose_lhs(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    dot_transpose(eg, class, subst, true)
}

fn dot_transpose_rhs(eg: &mut EG, class: Id, subst: &Subst) -> Vec<Id> {
    dot_transpose(eg, class, subst, false)
}
