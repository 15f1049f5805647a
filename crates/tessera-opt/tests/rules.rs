//! Every rule is sound: for each, programs where it applies (at several shapes) are simplified,
//! the rule's left side must be gone, and both programs compute the same values with the
//! interpreter on random inputs. A rule without a case here fails the coverage check.

use std::collections::BTreeSet;

use tessera_interp::run;
use tessera_ir::corpus::Lcg;
use tessera_ir::{DType, Data, Graph, Literal, parse, print};
use tessera_opt::{Limits, rules::rules, simplify};

/// (rule, program template with `N` and `M` as sizes, an op the rule removes).
const CASES: &[(&str, &str, &str)] = &[
    (
        "mul-one",
        "func @f(%0: f32[N,M]) {\n  %1 = constant 1.0 : f32[N,M]\n  %2 = mul %0, %1 : f32[N,M]\n  return %2\n}\n",
        "mul",
    ),
    (
        "one-mul",
        "func @f(%0: f32[N,M]) {\n  %1 = constant 1.0 : f32[]\n  %2 = broadcast_in_dim %1 dims=[] : f32[N,M]\n  %3 = mul %2, %0 : f32[N,M]\n  return %3\n}\n",
        "mul",
    ),
    (
        "add-zero",
        "func @f(%0: f32[N,M]) {\n  %1 = constant -0.0 : f32[N,M]\n  %2 = add %0, %1 : f32[N,M]\n  return %2\n}\n",
        "add",
    ),
    (
        "zero-add",
        "func @f(%0: i32[N,M]) {\n  %1 = constant 0 : i32[N,M]\n  %2 = add %1, %0 : i32[N,M]\n  return %2\n}\n",
        "add",
    ),
    (
        "sub-zero",
        "func @f(%0: f64[N,M]) {\n  %1 = constant 0.0 : f64[N,M]\n  %2 = sub %0, %1 : f64[N,M]\n  return %2\n}\n",
        "sub",
    ),
    (
        "neg-neg",
        "func @f(%0: f32[N,M]) {\n  %1 = neg %0 : f32[N,M]\n  %2 = neg %1 : f32[N,M]\n  return %2\n}\n",
        "neg",
    ),
    (
        "div-one",
        "func @f(%0: f32[N,M]) {\n  %1 = constant 1.0 : f32[N,M]\n  %2 = div %0, %1 : f32[N,M]\n  return %2\n}\n",
        "div",
    ),
    (
        "sub-self",
        "func @f(%0: i32[N,M]) {\n  %1 = sub %0, %0 : i32[N,M]\n  return %1\n}\n",
        "sub",
    ),
    (
        "transpose-transpose",
        "func @f(%0: f32[N,M,3]) {\n  %1 = transpose %0 perm=[2,0,1] : f32[3,N,M]\n  %2 = transpose %1 perm=[0,2,1] : f32[3,M,N]\n  return %2\n}\n",
        "transpose %1",
    ),
    (
        "reshape-reshape",
        "func @f(%0: f32[N,M]) {\n  %1 = reshape %0 : f32[M,N]\n  %2 = reshape %1 : f32[NM]\n  return %2\n}\n",
        "reshape %1",
    ),
    (
        "broadcast-broadcast",
        "func @f(%0: f32[M]) {\n  %1 = broadcast_in_dim %0 dims=[1] : f32[N,M]\n  %2 = broadcast_in_dim %1 dims=[0,2] : f32[N,2,M]\n  return %2\n}\n",
        "broadcast_in_dim %1",
    ),
    (
        "reduce-broadcast",
        "func @f(%0: f32[M]) {\n  %1 = broadcast_in_dim %0 dims=[1] : f32[N,M]\n  %2 = reduce_sum %1 axes=[0] : f32[M]\n  return %2\n}\n",
        "reduce_sum",
    ),
    (
        "dot-transpose-lhs",
        "func @f(%0: f32[N,M], %1: f32[N,3]) {\n  %2 = transpose %0 perm=[1,0] : f32[M,N]\n  %3 = dot_general %2, %1 contracting=[1]x[0] : f32[M,3]\n  return %3\n}\n",
        "transpose",
    ),
    (
        "dot-transpose-rhs",
        "func @f(%0: f32[3,N], %1: f32[M,N]) {\n  %2 = transpose %1 perm=[1,0] : f32[N,M]\n  %3 = dot_general %0, %2 contracting=[1]x[0] : f32[3,M]\n  return %3\n}\n",
        "transpose",
    ),
    (
        // A dense layer's weight gradient, with a batch dim in front.
        "transpose-dot",
        "func @f(%0: f32[2,N,3], %1: f32[2,N,M]) {\n  %2 = dot_general %0, %1 batch=[0]x[0] contracting=[1]x[1] : f32[2,3,M]\n  %3 = transpose %2 perm=[0,2,1] : f32[2,M,3]\n  return %3\n}\n",
        "transpose",
    ),
];

fn inputs(g: &Graph, rng: &mut Lcg) -> Vec<Literal> {
    g.params()
        .iter()
        .map(|&p| {
            let ty = g.ty(p);
            let n = ty.numel();
            let data = match ty.dtype {
                DType::F32 => Data::F32((0..n).map(|_| rng.range(-3.0, 3.0) as f32).collect()),
                DType::F64 => Data::F64((0..n).map(|_| rng.range(-3.0, 3.0)).collect()),
                DType::I32 => Data::I32((0..n).map(|_| rng.range(-50.0, 50.0) as i32).collect()),
                _ => unreachable!("cases use f32, f64 and i32"),
            };
            Literal {
                ty: ty.clone(),
                data,
            }
        })
        .collect()
}

#[test]
fn every_rule_is_sound_and_fires() {
    let named: BTreeSet<String> = rules().iter().map(|r| r.name.to_string()).collect();
    let covered: BTreeSet<String> = CASES.iter().map(|(n, _, _)| n.to_string()).collect();
    assert_eq!(named, covered, "every rule needs a case, every case a rule");
    let mut rng = Lcg(5);
    for (rule, template, removed) in CASES {
        for (n, m) in [(2usize, 3usize), (4, 1), (1, 5), (3, 7)] {
            let text = template
                .replace("NM", &(n * m).to_string())
                .replace('N', &n.to_string())
                .replace('M', &m.to_string());
            let g = parse(&text).unwrap_or_else(|e| panic!("{rule}: {e}\n{text}"));
            let (s, report) = simplify(&g, Limits::default()).unwrap();
            let out = print(&s);
            assert!(
                !out.contains(&format!(" = {removed}")) && !out.contains(&format!(" = {removed} ")),
                "{rule} at {n}x{m} did not fire ({report}):\n{out}"
            );
            let x = inputs(&g, &mut rng);
            let (a, b) = (run(&g, &x).unwrap(), run(&s, &x).unwrap());
            for (p, q) in a.iter().zip(&b) {
                assert_eq!(p.ty, q.ty, "{rule}");
                for i in 0..p.data.len() {
                    let (u, v) = (p.data.get_f64(i), q.data.get_f64(i));
                    assert!(
                        (u - v).abs() <= 1e-5 * u.abs().max(1.0),
                        "{rule} at {n}x{m}: element {i}: {u} vs {v}"
                    );
                }
            }
        }
    }
}

#[test]
fn float_self_subtraction_is_kept() {
    let g = parse("func @f(%0: f32[2]) {\n  %1 = sub %0, %0 : f32[2]\n  return %1\n}\n").unwrap();
    let (s, _) = simplify(&g, Limits::default()).unwrap();
    assert!(
        print(&s).contains("sub"),
        "NaN - NaN is NaN: x - x must stay for floats"
    );
}

#[test]
fn limits_are_counts_and_reported() {
    let g = parse(
        "func @f(%0: f32[2]) {\n  %1 = neg %0 : f32[2]\n  %2 = neg %1 : f32[2]\n  return %2\n}\n",
    )
    .unwrap();
    let (_, r) = simplify(
        &g,
        Limits {
            iterations: 1,
            nodes: 10_000,
        },
    )
    .unwrap();
    assert!(r.iterations <= 1, "{r}");
    assert!(r.to_string().contains("stopped"), "{r}");
}
