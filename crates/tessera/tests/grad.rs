//! Gradients: every VJP rule against central finite differences in f64, the transformations'
//! API (grad inside jit, grad of grad, has_aux, argnums, vjp), and their errors.

use std::collections::BTreeSet;

use tessera::ir::corpus::{Lcg, op_samples, random_inputs};
use tessera::ir::{ALL_OP_NAMES, DType, Graph, Literal};
use tessera::prelude::*;

/// Ops without a gradient (integer and boolean results, counters, bit reinterpretation), and
/// the collectives, whose rules are exercised by the sharding tests on real device groups.
const NOT_DIFFERENTIATED_HERE: &[&str] = &[
    "parameter",
    "constant",
    "iota",
    "not",
    "and",
    "or",
    "xor",
    "shift_left",
    "shift_right_logical",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "bitcast",
    "argmax",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "axis_index",
    "sharding_constraint",
    // Its derivative is zero by definition, not the identity's that finite differences of its
    // values would measure: `grad_through_stop_gradient_is_zero` below.
    "stop_gradient",
    // The region ops have no one-op sample; their reverse mode is in the autodiff filetests
    // (`tests/filetests/autodiff/regions.ir`) and `tessera/tests/control_flow.rs`.
    "scan",
    "while",
    "case",
    "checkpoint",
    "custom_vjp",
    "get_result",
];

/// `sum(graph(inputs) * w)`, with the float inputs given and the others fixed.
fn weighted_output(g: &Graph, floats: &[Tensor], fixed: &[Option<Tensor>], w: &Tensor) -> Tensor {
    let mut it = floats.iter();
    let inputs: Vec<Tensor> = fixed
        .iter()
        .map(|f| {
            f.clone()
                .unwrap_or_else(|| it.next().expect("a float input").clone())
        })
        .collect();
    let out = eval_graph(g, &inputs).expect("sample evaluates");
    (&out[0] * w).sum()
}

#[test]
fn every_vjp_rule_matches_finite_differences() {
    let mut rng = Lcg(7);
    let mut covered = BTreeSet::new();
    let mut failures = Vec::new();
    for s in op_samples() {
        let g = &s.graph;
        let out_ty = g.ty(g.outputs()[0]).clone();
        let params: Vec<_> = g.params().iter().map(|&p| g.ty(p).clone()).collect();
        if g.mesh.is_some()
            || out_ty.dtype != DType::F64
            || !params.iter().any(|t| t.dtype == DType::F64)
            || params.iter().any(|t| t.dtype == DType::F32)
        {
            continue;
        }
        let op_name = g.op(g.outputs()[0]).name();
        if op_name == "stop_gradient" {
            continue;
        }
        covered.insert(op_name);
        let inputs = random_inputs(&s, &mut rng);
        let fixed: Vec<Option<Tensor>> = inputs
            .iter()
            .map(|l| (l.ty.dtype != DType::F64).then(|| Tensor::from_literal(l.clone())))
            .collect();
        let floats: Vec<Tensor> = inputs
            .iter()
            .filter(|l| l.ty.dtype == DType::F64)
            .map(|l| Tensor::from_literal(l.clone()))
            .collect();
        let n_out = out_ty.numel();
        let w = Tensor::from_vec(
            (0..n_out)
                .map(|_| rng.range(-1.0, 1.0))
                .collect::<Vec<f64>>(),
            out_ty.shape.clone(),
        );
        let grads = grad(|xs: &Vec<Tensor>| weighted_output(g, xs, &fixed, &w))(&floats);
        for (k, x) in floats.iter().enumerate() {
            let base = x.to_vec::<f64>();
            let got = grads[k].to_vec::<f64>();
            for i in 0..base.len() {
                let h = 1e-6 * base[i].abs().max(1.0);
                let eval = |delta: f64| {
                    let mut v = base.clone();
                    v[i] += delta;
                    let mut xs = floats.clone();
                    xs[k] = Tensor::from_vec(v, x.shape().to_vec());
                    weighted_output(g, &xs, &fixed, &w).item::<f64>()
                };
                let fd = (eval(h) - eval(-h)) / (2.0 * h);
                if (got[i] - fd).abs() > 1e-6 * fd.abs().max(1.0) {
                    failures.push(format!(
                        "{}: input {k}[{i}]: autodiff {} vs finite difference {fd}",
                        s.name, got[i]
                    ));
                    break;
                }
            }
        }
    }
    let expected: BTreeSet<&str> = ALL_OP_NAMES
        .iter()
        .copied()
        .filter(|n| !NOT_DIFFERENTIATED_HERE.contains(n))
        .collect();
    let missing: Vec<_> = expected.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "differentiable ops without a finite-difference check: {missing:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `stop_gradient` is the identity on values and has a zero derivative: through
/// `sum(stop_gradient(x) * x)` the gradient is `x` (the stopped factor is a constant), not the
/// `2x` of `sum(x * x)`; through `sum(exp(stop_gradient(x)))` it is zero. Eagerly and under jit.
#[test]
fn grad_through_stop_gradient_is_zero() {
    let product = tessera::ir::parse(
        "func @f(%0: f64[3]) {
  %1 = stop_gradient %0 : f64[3]
  %2 = mul %1, %0 : f64[3]
  return %2
}",
    )
    .unwrap();
    let stopped = tessera::ir::parse(
        "func @f(%0: f64[3]) {
  %1 = stop_gradient %0 : f64[3]
  %2 = exp %1 : f64[3]
  %3 = add %2, %0 : f64[3]
  %4 = sub %3, %0 : f64[3]
  return %4
}",
    )
    .unwrap();
    let x = Tensor::from_vec(vec![0.5f64, -2.0, 3.0], [3]);
    let through = |g: &Graph, x: &Tensor| eval_graph(g, std::slice::from_ref(x)).unwrap()[0].sum();
    let g1 = grad(|x: &Tensor| through(&product, x))(&x);
    assert_eq!(g1.to_vec::<f64>(), vec![0.5, -2.0, 3.0]);
    let g2 = grad(|x: &Tensor| through(&stopped, x))(&x);
    assert_eq!(g2.to_vec::<f64>(), vec![0.0, 0.0, 0.0]);
    // The values are the identity's.
    let v = eval_graph(&product, std::slice::from_ref(&x)).unwrap();
    assert_eq!(v[0].to_vec::<f64>(), vec![0.25, 4.0, 9.0]);
    let jitted = jit(|x: Tensor| grad(|x: &Tensor| through(&product, x))(&x));
    assert_eq!(
        jitted.call(x.clone()).unwrap().to_vec::<f64>(),
        vec![0.5, -2.0, 3.0]
    );
}

#[test]
fn grad_inside_jit_appends_the_backward_graph() {
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3]);
    let f = jit(|x: Tensor| {
        let (l, g) = value_and_grad(|x: &Tensor| (x * &w).tanh().sum())(&x);
        (l, g)
    });
    let x = Tensor::from_vec(vec![0.1f32, 0.2, 0.3], [3]);
    let (l, g) = f.call(x.clone()).unwrap();
    let (le, ge) = value_and_grad(|x: &Tensor| (x * &w).tanh().sum())(&x);
    // Compiled (jit) and eager (interpreted) agree within the tanh approximation's bound.
    for (a, b) in [(&l, &le), (&g, &ge)] {
        for (x, y) in a.to_vec::<f32>().iter().zip(b.to_vec::<f32>()) {
            assert!((x - y).abs() <= 1e-6, "{x} vs {y}");
        }
    }
    let ir = f.lower(&x).unwrap().ir();
    assert!(ir.contains("vjp of tanh"), "{ir}");
    let gd = g.to_vec::<f32>();
    for i in 0..3 {
        let (wi, xi) = ([0.5f32, -1.0, 2.0][i], [0.1f32, 0.2, 0.3][i]);
        let want = wi * (1.0 - (wi * xi).tanh().powi(2));
        assert!((gd[i] - want).abs() < 1e-6, "{} vs {want}", gd[i]);
    }
}

#[test]
fn grad_of_grad() {
    // d/dx of d/dx x^3 = 6x, and of tanh: -2 tanh(x) (1 - tanh(x)^2).
    let d2 = grad(|x: &Tensor| grad(|x: &Tensor| (x * x * x).sum())(x).sum());
    let x = Tensor::from_vec(vec![0.5f64, -2.0], [2]);
    assert_eq!(d2(&x).to_vec::<f64>(), vec![3.0, -12.0]);
    let t2 = grad(|x: &Tensor| grad(|x: &Tensor| x.tanh().sum())(x).sum());
    let got = t2(&x).to_vec::<f64>();
    for (g, xi) in got.iter().zip([0.5f64, -2.0]) {
        let t = xi.tanh();
        assert!((g - (-2.0 * t * (1.0 - t * t))).abs() < 1e-12);
    }
    // And under jit, where both levels record into the one program.
    let j = jit(|x: Tensor| d2(&x));
    assert_eq!(j.call(x.clone()).unwrap().to_vec::<f64>(), vec![3.0, -12.0]);
}

#[test]
fn has_aux_argnums_and_vjp() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let y = Tensor::from_vec(vec![3.0f32, 4.0], [2]);
    let ((l, aux), g) = value_and_grad_with_aux(|x: &Tensor| {
        let sq = x * x;
        (sq.sum(), sq)
    })(&x);
    assert_eq!(l.item::<f32>(), 5.0);
    assert_eq!(aux.to_vec::<f32>(), vec![1.0, 4.0]);
    assert_eq!(g.to_vec::<f32>(), vec![2.0, 4.0]);

    let f = |(a, b): &(Tensor, Tensor)| (a * b).sum();
    let (_, (ga, gb)) = value_and_grad_argnums(f, &[1])(&(x.clone(), y.clone()));
    assert_eq!(ga.to_vec::<f32>(), vec![0.0, 0.0], "not differentiated");
    assert_eq!(gb.to_vec::<f32>(), vec![1.0, 2.0]);
    let (ga, gb) = grad(f)(&(x.clone(), y.clone()));
    assert_eq!(
        (ga.to_vec::<f32>(), gb.to_vec::<f32>()),
        (vec![3.0, 4.0], vec![1.0, 2.0])
    );

    let (out, pullback) = vjp(|x: &Tensor| (x.exp(), x * 3.0), &x);
    assert_eq!(out.1.to_vec::<f32>(), vec![3.0, 6.0]);
    let ct = pullback.call(&(Tensor::ones([2]), Tensor::full([2], 2.0)));
    let e = [1.0f32.exp(), 2.0f32.exp()];
    assert_eq!(ct.to_vec::<f32>(), vec![e[0] + 6.0, e[1] + 6.0]);
}

#[test]
fn independent_inputs_get_zero_gradients() {
    let (a, b) = (Tensor::ones([2]), Tensor::ones([3]));
    let (ga, gb) = grad(|(a, _b): &(Tensor, Tensor)| a.sum())(&(a, b));
    assert_eq!(ga.to_vec::<f32>(), vec![1.0, 1.0]);
    assert_eq!(gb.to_vec::<f32>(), vec![0.0, 0.0, 0.0]);
}

#[test]
fn integer_inputs_and_vector_outputs_are_errors() {
    let f = jit(|x: Tensor| grad(|x: &Tensor| x.astype(DType::F32).sum())(&x));
    let err = f.call(Tensor::arange(3)).unwrap_err().to_string();
    assert!(
        err.contains("i32[3]") && err.contains("f32 or f64"),
        "{err}"
    );
    assert!(err.contains(file!()), "{err}");

    let g = jit(|x: Tensor| grad(|x: &Tensor| x * 2.0)(&x));
    let err = g.call(Tensor::ones([3])).unwrap_err().to_string();
    assert!(err.contains("scalar") && err.contains("f32[3]"), "{err}");

    let caught = std::panic::catch_unwind(|| grad(|x: &Tensor| x.matmul(x))(&Tensor::ones([2, 3])));
    let msg = caught
        .unwrap_err()
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        msg.contains("matmul: contracting dims differ") && msg.contains(file!()),
        "{msg}"
    );
}

#[test]
fn gradient_of_a_literal_program() {
    // eval_graph records an IR program into the trace of a gradient like any other ops.
    let g = tessera::ir::parse(
        "func @f(%0: f64[3]) {\n  %1 = sin %0 : f64[3]\n  %2 = reduce_sum %1 axes=[0] : f64[]\n  return %2\n}\n",
    )
    .unwrap();
    let x = Tensor::from_literal(
        Literal::new([3], tessera::ir::Data::F64(vec![0.0, 1.0, 2.0])).unwrap(),
    );
    let d = grad(|x: &Tensor| eval_graph(&g, std::slice::from_ref(x)).unwrap().remove(0))(&x);
    let want: Vec<f64> = [0.0f64, 1.0, 2.0].iter().map(|v| v.cos()).collect();
    assert_eq!(d.to_vec::<f64>(), want);
}
