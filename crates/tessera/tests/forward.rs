//! Forward mode and Jacobians: every JVP rule against central finite differences in f64 (the
//! collectives on 4 devices under pmap), jvp against the VJP-based Jacobian, jacfwd against
//! jacrev, the Hessian against finite differences of the gradient, under jit on both backends,
//! nested in grad, linearize, and the errors.

use std::collections::BTreeSet;

use tessera::ir::corpus::{Lcg, op_samples, random_inputs};
use tessera::ir::{ALL_OP_NAMES, DType, Graph, REGION_OP_NAMES};
use tessera::prelude::*;

/// Ops without a tangent (integer and boolean results, counters, bit reinterpretation,
/// `stop_gradient`), the collectives and the annotation, which need a mesh
/// (`collectives_under_pmap_match_finite_differences` covers them), and the region ops, whose
/// samples are graphs with bodies (`crates/tessera-autodiff/tests/jvp.rs` and
/// `regions_under_jit_match_finite_differences` cover them).
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
    "stop_gradient",
];

/// `graph(inputs)`, with the float inputs given and the others fixed.
fn run(g: &Graph, floats: &[Tensor], fixed: &[Option<Tensor>]) -> Tensor {
    let mut it = floats.iter();
    let inputs: Vec<Tensor> = fixed
        .iter()
        .map(|f| {
            f.clone()
                .unwrap_or_else(|| it.next().expect("a float input").clone())
        })
        .collect();
    eval_graph(g, &inputs).expect("sample evaluates").remove(0)
}

fn random_like(x: &Tensor, rng: &mut Lcg) -> Tensor {
    Tensor::from_vec(
        (0..x.numel())
            .map(|_| rng.range(-1.0, 1.0))
            .collect::<Vec<f64>>(),
        x.shape().to_vec(),
    )
}

/// `x + s * t`, elementwise in f64.
fn axpy(x: &Tensor, s: f64, t: &Tensor) -> Tensor {
    let v: Vec<f64> = x
        .to_vec::<f64>()
        .iter()
        .zip(t.to_vec::<f64>())
        .map(|(a, b)| a + s * b)
        .collect();
    Tensor::from_vec(v, x.shape().to_vec())
}

/// The first element where `got` and `want` differ by more than `tol` (relative, floor 1).
fn mismatch(got: &[f64], want: &[f64], tol: f64) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} elements vs {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| (*g - *w).abs().is_nan() || (*g - *w).abs() > tol * w.abs().max(1.0))
        .map(|(i, (g, w))| format!("[{i}]: {g} vs {w}"))
}

#[test]
fn every_jvp_rule_matches_finite_differences() {
    let mut rng = Lcg(11);
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
        covered.insert(g.op(g.outputs()[0]).name());
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
        let tangents: Vec<Tensor> = floats.iter().map(|x| random_like(x, &mut rng)).collect();
        let (out, t) = jvp(|xs: &Vec<Tensor>| run(g, xs, &fixed), &floats, &tangents);
        // By bits: a sample may produce NaN (a gather in fill mode fills with NaN).
        let bits = |t: &Tensor| {
            t.to_vec::<f64>()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&out), bits(&run(g, &floats, &fixed)), "{}", s.name);
        if g.op(g.outputs()[0]).name() == "stop_gradient" {
            // The identity on values whose derivative is zero by definition, not the identity's.
            assert!(t.to_vec::<f64>().iter().all(|&v| v == 0.0), "{}", s.name);
            continue;
        }
        let h = 1e-6;
        let shifted = |s: f64| -> Vec<f64> {
            let xs: Vec<Tensor> = floats
                .iter()
                .zip(&tangents)
                .map(|(x, t)| axpy(x, s, t))
                .collect();
            run(g, &xs, &fixed).to_vec::<f64>()
        };
        let fd: Vec<f64> = shifted(h)
            .iter()
            .zip(shifted(-h))
            .map(|(a, b)| (a - b) / (2.0 * h))
            .collect();
        // Where the value itself is NaN (a gather's fill), the difference quotient is NaN and
        // says nothing: the tangent there is not checked.
        let (tv, ov) = (t.to_vec::<f64>(), out.to_vec::<f64>());
        let fd: Vec<f64> = fd
            .iter()
            .zip(&ov)
            .zip(&tv)
            .map(|((&d, o), &tan)| if o.is_nan() { tan } else { d })
            .collect();
        if let Some(m) = mismatch(&tv, &fd, 1e-6) {
            failures.push(format!("{}: jvp vs finite difference {m}", s.name));
        }
    }
    let expected: BTreeSet<&str> = ALL_OP_NAMES
        .iter()
        .copied()
        .filter(|n| !NOT_DIFFERENTIATED_HERE.contains(n) && !REGION_OP_NAMES.contains(n))
        .collect();
    let missing: Vec<_> = expected.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "differentiable ops without a finite-difference check: {missing:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

fn f64s(v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape.to_vec())
}

fn lcg_tensor(rng: &mut Lcg, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    f64s((0..n).map(|_| rng.range(-1.0, 1.0)).collect(), shape)
}

/// A reduce_scatter max over `i`, which has no Tensor method: an IR program replayed by
/// `eval_graph` inside the pmap.
const REDUCE_SCATTER_MAX: &str = "mesh @m = <\"i\"=4>\n\
func @f(%0: f64[8,3]) {\n  %1 = reduce_scatter %0 max dim=0 axes=[\"i\"] : f64[2,3]\n  return %1\n}\n";

#[test]
fn collectives_under_pmap_match_finite_differences() {
    eight_devices();
    let rs_max = tessera::ir::parse(REDUCE_SCATTER_MAX).unwrap();
    let cases: Vec<Named> = vec![
        ("psum", Box::new(|x| psum(&x.sin(), "i"))),
        ("pmean", Box::new(|x| pmean(&(x * x), "i"))),
        ("pmax", Box::new(|x| pmax(&x.tanh(), "i"))),
        ("pmin", Box::new(|x| pmin(&(x * 3.0), "i"))),
        ("all_gather", Box::new(|x| all_gather(&x.exp(), "i"))),
        ("psum_scatter", Box::new(|x| psum_scatter(&(x * x), "i", 0))),
        ("all_to_all", Box::new(|x| all_to_all(&x.sin(), "i", 0, 1))),
        (
            "ppermute",
            Box::new(|x| ppermute(&x.cos(), "i", &[(0, 1), (1, 2), (2, 0)])),
        ),
        (
            "reduce_scatter max",
            Box::new(move |x| {
                eval_graph(&rs_max, std::slice::from_ref(x))
                    .unwrap()
                    .remove(0)
            }),
        ),
    ];
    let mut rng = Lcg(3);
    let mut failures = Vec::new();
    for (name, f) in &cases {
        let x = lcg_tensor(&mut rng, &[4, 8, 3]);
        let t = lcg_tensor(&mut rng, &[4, 8, 3]);
        let both = pmap("i", |(x, t): (Tensor, Tensor)| {
            jvp(|x: &Tensor| f(x), &x, &t)
        });
        let (y, ty) = both.call((x.clone(), t.clone())).unwrap();
        let plain = pmap("i", |x: Tensor| f(&x));
        assert_eq!(
            y.to_vec::<f64>(),
            plain.call(x.clone()).unwrap().to_vec::<f64>()
        );
        let h = 1e-6;
        let up = plain.call(axpy(&x, h, &t)).unwrap().to_vec::<f64>();
        let down = plain.call(axpy(&x, -h, &t)).unwrap().to_vec::<f64>();
        let fd: Vec<f64> = up
            .iter()
            .zip(&down)
            .map(|(a, b)| (a - b) / (2.0 * h))
            .collect();
        if let Some(m) = mismatch(&ty.to_vec::<f64>(), &fd, 1e-6) {
            failures.push(format!("{name}: {m}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_max_over_devices_at_a_tie_takes_the_mean_tangent() {
    eight_devices();
    // Every device holds the same value, so every one wins: the tangent is their mean, the
    // transpose of the VJP's equal share.
    let x = f64s(vec![2.0; 4], &[4, 1]);
    let t = f64s(vec![1.0, 2.0, 3.0, 6.0], &[4, 1]);
    let f = pmap("i", |(x, t): (Tensor, Tensor)| {
        jvp(|x: &Tensor| pmax(x, "i"), &x, &t).1
    });
    assert_eq!(f.call((x, t)).unwrap().to_vec::<f64>(), vec![3.0; 4]);

    // The same for reduce_scatter max: device d's chunk (rows 2d, 2d+1) gets the mean over the
    // devices of their tangents' rows.
    let g = tessera::ir::parse(REDUCE_SCATTER_MAX).unwrap();
    let x = f64s(vec![2.0; 96], &[4, 8, 3]);
    let t = lcg_tensor(&mut Lcg(5), &[4, 8, 3]);
    let f = pmap("i", |(x, t): (Tensor, Tensor)| {
        jvp(
            |x: &Tensor| eval_graph(&g, std::slice::from_ref(x)).unwrap().remove(0),
            &x,
            &t,
        )
        .1
    });
    let got = f.call((x, t.clone())).unwrap().to_vec::<f64>();
    let tv = t.to_vec::<f64>();
    let want: Vec<f64> = (0..4)
        .flat_map(|d| (0..6).map(move |k| (d, k)))
        .map(|(d, k)| (0..4).map(|e| tv[e * 24 + d * 6 + k]).sum::<f64>() / 4.0)
        .collect();
    assert_eq!(mismatch(&got, &want, 1e-15), None);
}

/// A weight for the test functions.
fn weight() -> Tensor {
    lcg_tensor(&mut Lcg(17), &[3, 4])
}

/// `f64[2,3] -> f64[2,4]`: a layer with a product and a max, so that every Jacobian entry is
/// nonzero and the rules of several families take part.
fn layer(x: &Tensor, w: &Tensor) -> Tensor {
    let h = x.matmul(w).tanh();
    &h * &x.sum_axes([1]).reshape([2, 1]).sin() + h.max_axes([1]).reshape([2, 1]) * 0.5
}

/// `f64[2,3] -> f64[]`: a scalar with a nonzero, non-diagonal Hessian.
fn energy(x: &Tensor, w: &Tensor) -> Tensor {
    x.matmul(w).tanh().sum() + (x * x * x).sum() * 0.25 + (x.exp() * x.sum()).sum()
}

fn sample_x() -> Tensor {
    lcg_tensor(&mut Lcg(23), &[2, 3])
}

/// `J . v`: contracts the trailing `v.numel()` elements of each row of `j` with `v`.
fn contract(j: &Tensor, v: &Tensor) -> Vec<f64> {
    let (jv, vv) = (j.to_vec::<f64>(), v.to_vec::<f64>());
    jv.chunks(vv.len())
        .map(|row| row.iter().zip(&vv).map(|(a, b)| a * b).sum())
        .collect()
}

/// The Jacobian of `f` at `x` by central differences, in JAX's layout.
fn fd_jacobian(f: impl Fn(&Tensor) -> Tensor, x: &Tensor) -> Vec<f64> {
    let n = x.numel();
    let h = 1e-6;
    let columns: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let mut e = vec![0.0; n];
            e[i] = 1.0;
            let e = f64s(e, x.shape());
            let up = f(&axpy(x, h, &e)).to_vec::<f64>();
            let down = f(&axpy(x, -h, &e)).to_vec::<f64>();
            up.iter()
                .zip(&down)
                .map(|(a, b)| (a - b) / (2.0 * h))
                .collect()
        })
        .collect();
    let m = columns[0].len();
    (0..m)
        .flat_map(|o| columns.iter().map(move |c| c[o]))
        .collect()
}

#[test]
fn jacfwd_equals_jacrev_and_finite_differences() {
    eight_devices();
    let (x, w) = (sample_x(), weight());
    let f = |x: &Tensor| layer(x, &w);
    let jf = jacfwd(f)(&x);
    let jr = jacrev(f)(&x);
    assert_eq!(jf.shape(), &[2, 4, 2, 3]);
    assert_eq!(jr.shape(), &[2, 4, 2, 3]);
    assert_eq!(
        mismatch(&jf.to_vec::<f64>(), &jr.to_vec::<f64>(), 1e-14),
        None
    );
    assert_eq!(
        mismatch(&jf.to_vec::<f64>(), &fd_jacobian(f, &x), 1e-7),
        None
    );
    // jvp . v is the Jacobian (built by vjps) times v.
    let v = lcg_tensor(&mut Lcg(29), &[2, 3]);
    let (y, t) = jvp(|x: &Tensor| f(x), &x, &v);
    assert_eq!(y.to_vec::<f64>(), f(&x).to_vec::<f64>());
    assert_eq!(
        mismatch(&t.to_vec::<f64>(), &contract(&jr, &v), 1e-14),
        None
    );
    // A scalar input and a scalar output: shapes out ++ in degenerate as in JAX.
    let s = Tensor::scalar(0.7f64);
    let d = jacfwd(|s: &Tensor| s.sin() * 2.0)(&s);
    assert_eq!(d.shape(), &[] as &[usize]);
    assert!((d.item::<f64>() - 2.0 * 0.7f64.cos()).abs() < 1e-15);
    let g = jacrev(|x: &Tensor| (x * x).sum())(&x);
    let want: Vec<f64> = x.to_vec::<f64>().iter().map(|v| 2.0 * v).collect();
    assert_eq!(g.to_vec::<f64>(), want);
}

#[test]
fn hessian_is_symmetric_and_matches_finite_differences_of_grad() {
    eight_devices();
    let (x, w) = (sample_x(), weight());
    let e = |x: &Tensor| energy(x, &w);
    let h = hessian(e)(&x);
    assert_eq!(h.shape(), &[2, 3, 2, 3]);
    let hv = h.to_vec::<f64>();
    for i in 0..6 {
        for j in 0..6 {
            let (a, b) = (hv[i * 6 + j], hv[j * 6 + i]);
            assert!(
                (a - b).abs() <= 1e-13 * a.abs().max(1.0),
                "H[{i},{j}] {a} vs {b}"
            );
        }
    }
    assert_eq!(mismatch(&hv, &fd_jacobian(grad(e), &x), 1e-7), None);
    // Forward over reverse: jvp of grad is the Hessian times v.
    let v = lcg_tensor(&mut Lcg(31), &[2, 3]);
    let (_, hvp) = jvp(|x: &Tensor| grad(e)(x), &x, &v);
    assert_eq!(
        mismatch(&hvp.to_vec::<f64>(), &contract(&h, &v), 1e-13),
        None
    );
}

#[test]
fn under_jit_on_both_backends() {
    eight_devices();
    let (x, w) = (sample_x(), weight());
    let v = lcg_tensor(&mut Lcg(37), &[2, 3]);
    let eager = {
        let f = |x: &Tensor| layer(x, &w);
        let e = |x: &Tensor| energy(x, &w);
        (
            jvp(|x: &Tensor| f(x), &x, &v).1,
            jacfwd(f)(&x),
            jacrev(f)(&x),
            hessian(e)(&x),
        )
    };
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let j = jit(|(x, v): (Tensor, Tensor)| {
            let f = |x: &Tensor| layer(x, &w);
            let e = |x: &Tensor| energy(x, &w);
            (
                jvp(|x: &Tensor| f(x), &x, &v).1,
                jacfwd(f)(&x),
                jacrev(f)(&x),
                hessian(e)(&x),
            )
        })
        .backend(backend);
        let got = j.call((x.clone(), v.clone())).unwrap();
        let pairs = [
            (&got.0, &eager.0, "jvp"),
            (&got.1, &eager.1, "jacfwd"),
            (&got.2, &eager.2, "jacrev"),
            (&got.3, &eager.3, "hessian"),
        ];
        for (a, b, what) in pairs {
            assert_eq!(a.shape(), b.shape(), "{backend:?} {what}");
            assert_eq!(
                mismatch(&a.to_vec::<f64>(), &b.to_vec::<f64>(), 1e-12),
                None,
                "{backend:?} {what}"
            );
        }
        let ir = j.lower(&(x.clone(), v.clone())).unwrap().ir();
        assert!(ir.contains("jvp of tanh"), "{ir}");
    }
}

#[test]
fn jvp_nested_in_grad_and_grad_nested_in_jvp() {
    eight_devices();
    let (x, w) = (sample_x(), weight());
    let v = lcg_tensor(&mut Lcg(41), &[2, 3]);
    // d/dx <1, J(x) v>: reverse over forward.
    let inner = |x: &Tensor| jvp(|x: &Tensor| layer(x, &w), x, &v).1.sum();
    let g = grad(inner)(&x);
    assert_eq!(
        mismatch(&g.to_vec::<f64>(), &fd_jacobian(inner, &x), 1e-7),
        None
    );
    // jvp of a function that takes a gradient inside.
    let outer = |x: &Tensor| grad(|x: &Tensor| energy(x, &w))(x).sin();
    let (_, t) = jvp(|x: &Tensor| outer(x), &x, &v);
    let h = 1e-6;
    let up = outer(&axpy(&x, h, &v)).to_vec::<f64>();
    let down = outer(&axpy(&x, -h, &v)).to_vec::<f64>();
    let fd: Vec<f64> = up
        .iter()
        .zip(&down)
        .map(|(a, b)| (a - b) / (2.0 * h))
        .collect();
    assert_eq!(mismatch(&t.to_vec::<f64>(), &fd, 1e-7), None);
}

#[test]
fn linearize_trees_and_zero_tangents() {
    eight_devices();
    let (x, w) = (sample_x(), weight());
    let (y, lin) = linearize(|x: &Tensor| layer(x, &w), &x);
    assert_eq!(y.to_vec::<f64>(), layer(&x, &w).to_vec::<f64>());
    for seed in [43, 47] {
        let v = lcg_tensor(&mut Lcg(seed), &[2, 3]);
        let want = jvp(|x: &Tensor| layer(x, &w), &x, &v).1;
        assert_eq!(lin.call(&v).to_vec::<f64>(), want.to_vec::<f64>());
    }
    // Trees in and out; an output that does not depend on the inputs has a zero tangent, an
    // integer output too.
    let a = f64s(vec![1.0, 2.0], &[2]);
    let b = f64s(vec![3.0, -1.0], &[2]);
    let (ta, tb) = (f64s(vec![0.5, 1.0], &[2]), f64s(vec![2.0, 0.0], &[2]));
    let ((p, s, c, i), (tp, ts, tc, ti)) = jvp(
        |(a, b): &(Tensor, Tensor)| (a * b, a.sin(), Tensor::ones([3]), Tensor::arange(2)),
        &(a, b),
        &(ta, tb),
    );
    assert_eq!(p.to_vec::<f64>(), vec![3.0, -2.0]);
    assert_eq!(tp.to_vec::<f64>(), vec![0.5 * 3.0 + 2.0, -1.0]);
    assert_eq!(s.to_vec::<f64>(), vec![1f64.sin(), 2f64.sin()]);
    assert_eq!(ts.to_vec::<f64>(), vec![0.5 * 1f64.cos(), 2f64.cos()]);
    assert_eq!((c.shape(), tc.to_vec::<f32>()), (&[3][..], vec![0.0; 3]));
    assert_eq!((i.dtype(), ti.to_vec::<i32>()), (DType::I32, vec![0, 0]));
    // A Jacobian of an input with no elements, and of an output that ignores its input.
    let empty = jacfwd(|x: &Tensor| x.sum_axes([0]) * 2.0)(&Tensor::zeros([0, 2]));
    assert_eq!(empty.shape(), &[2, 0, 2]);
    let flat = jacrev(|_x: &Tensor| Tensor::ones([2]))(&Tensor::ones([3]));
    assert_eq!(flat.to_vec::<f32>(), vec![0.0; 6]);
}

/// The message of the panic `f` raises.
fn panic_message(f: impl FnOnce()) -> String {
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("the call fails");
    caught.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn bad_input_names_the_op_and_the_callers_line() {
    eight_devices();
    let x = Tensor::ones([3]);
    // An integer primal, eagerly and under jit.
    let msg = panic_message(|| {
        jvp(|x: &Tensor| x + x, &Tensor::arange(3), &Tensor::arange(3));
    });
    assert!(
        msg.contains("jvp") && msg.contains("i32[3]") && msg.contains(file!()),
        "{msg}"
    );
    let j = jit(|x: Tensor| jacfwd(|x: &Tensor| x.astype(DType::F32))(&x));
    let err = j.call(Tensor::arange(3)).unwrap_err().to_string();
    assert!(
        err.contains("jacfwd") && err.contains("i32[3]") && err.contains(file!()),
        "{err}"
    );
    // A tangent of another shape or tree.
    let msg = panic_message(|| {
        jvp(|x: &Tensor| x.sin(), &x, &Tensor::ones([4]));
    });
    assert!(
        msg.contains("jvp")
            && msg.contains("f32[4]")
            && msg.contains("f32[3]")
            && msg.contains(file!()),
        "{msg}"
    );
    let msg = panic_message(|| {
        jvp(
            |p: &Vec<Tensor>| p[0].sin(),
            &vec![x.clone()],
            &vec![x.clone(), x.clone()],
        );
    });
    assert!(
        msg.contains("tree structure") && msg.contains(file!()),
        "{msg}"
    );
    // A Jacobian of an integer output.
    let j = jit(|x: Tensor| jacrev(|x: &Tensor| x.argmax(0))(&x));
    let err = j.call(Tensor::ones([3])).unwrap_err().to_string();
    assert!(
        err.contains("jacrev") && err.contains("float output") && err.contains(file!()),
        "{err}"
    );
}

/// A scan with a const, a carry and a per-step output.
const SCAN: &str = "func @f(%0: f64[3], %1: f64[4,3], %2: f64[3]) {
  %3 = scan %2, %0, %1 length=4 consts=1 carries=1 : (f64[3], f64[4,3])
    body(%0: f64[3], %1: f64[3], %2: f64[3]) {
      %3 = mul %1, %0 : f64[3]
      %4 = add %3, %2 : f64[3]
      %5 = tanh %4 : f64[3]
      %6 = sin %1 : f64[3]
      return %5, %6
    }
  %4 = get_result %3 index=0 : f64[3]
  %5 = get_result %3 index=1 : f64[4,3]
  return %4, %5
}
";

/// A while loop with a data-dependent trip count: x <- 1.5 x + 0.1 a until sum(x) >= 10.
const WHILE: &str = "func @f(%0: f64[3], %1: f64[3]) {
  %2 = constant 0 : i32[]
  %3 = while %1, %0, %2 consts=1 : (f64[3], i32[])
    cond(%0: f64[3], %1: f64[3], %2: i32[]) {
      %3 = reduce_sum %1 axes=[0] : f64[]
      %4 = constant 10.0 : f64[]
      %5 = lt %3, %4 : bool[]
      return %5
    }
    body(%0: f64[3], %1: f64[3], %2: i32[]) {
      %3 = constant 1.5 : f64[]
      %4 = broadcast_in_dim %3 dims=[] : f64[3]
      %5 = mul %1, %4 : f64[3]
      %6 = constant 0.1 : f64[]
      %7 = broadcast_in_dim %6 dims=[] : f64[3]
      %8 = mul %0, %7 : f64[3]
      %9 = add %5, %8 : f64[3]
      %10 = constant 1 : i32[]
      %11 = add %2, %10 : i32[]
      return %9, %11
    }
  %4 = get_result %3 index=0 : f64[3]
  %5 = get_result %3 index=1 : i32[]
  return %4, %5
}
";

/// A three-way case on an index the test closes over.
const CASE: &str = "func @f(%0: i32[], %1: f64[3], %2: f64[3]) {
  %3 = case %0, %1, %2 : (f64[3])
    branch(%0: f64[3], %1: f64[3]) {
      %2 = mul %0, %1 : f64[3]
      return %2
    }
    branch(%0: f64[3], %1: f64[3]) {
      %2 = sin %0 : f64[3]
      %3 = add %2, %1 : f64[3]
      return %3
    }
    branch(%0: f64[3], %1: f64[3]) {
      %2 = checkpoint %0, %1 : (f64[3])
        body(%0: f64[3], %1: f64[3]) {
          %2 = exp %0 : f64[3]
          %3 = mul %2, %1 : f64[3]
          return %3
        }
      %3 = get_result %2 index=0 : f64[3]
      return %3
    }
  %4 = get_result %3 index=0 : f64[3]
  return %4
}
";

#[test]
fn regions_under_jit_match_finite_differences() {
    eight_devices();
    let mut rng = Lcg(53);
    let scan_in = vec![
        lcg_tensor(&mut rng, &[3]),
        lcg_tensor(&mut rng, &[4, 3]),
        lcg_tensor(&mut rng, &[3]),
    ];
    let while_in = vec![
        f64s(vec![1.0, 0.5, 0.25], &[3]),
        f64s(vec![0.3, -0.2, 0.7], &[3]),
    ];
    let case_in = vec![lcg_tensor(&mut rng, &[3]), lcg_tensor(&mut rng, &[3])];
    let mut cases: Vec<(String, Graph, Option<i32>, Vec<Tensor>)> = vec![
        (
            "scan".into(),
            tessera::ir::parse(SCAN).unwrap(),
            None,
            scan_in.clone(),
        ),
        (
            "reverse scan".into(),
            tessera::ir::parse(&SCAN.replace("length=4", "reverse length=4")).unwrap(),
            None,
            scan_in,
        ),
        (
            "while".into(),
            tessera::ir::parse(WHILE).unwrap(),
            None,
            while_in,
        ),
    ];
    for index in 0..3 {
        let g = tessera::ir::parse(CASE).unwrap();
        cases.push((format!("case {index}"), g, Some(index), case_in.clone()));
    }
    for (name, g, index, xs) in &cases {
        let call = |xs: &Vec<Tensor>| -> Vec<Tensor> {
            let mut args: Vec<Tensor> = index.iter().map(|&i| Tensor::scalar(i)).collect();
            args.extend(xs.iter().cloned());
            eval_graph(g, &args).unwrap()
        };
        let ts: Vec<Tensor> = xs.iter().map(|x| random_like(x, &mut rng)).collect();
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let primal = jit(|xs: Vec<Tensor>| call(&xs)).backend(backend);
            let tangent = jit(|(xs, ts): (Vec<Tensor>, Vec<Tensor>)| {
                jvp(|xs: &Vec<Tensor>| call(xs), &xs, &ts).1
            })
            .backend(backend);
            let got = tangent.call((xs.clone(), ts.clone())).unwrap();
            let h = 1e-6;
            let at = |s: f64| -> Vec<Tensor> {
                let shifted: Vec<Tensor> = xs.iter().zip(&ts).map(|(x, t)| axpy(x, s, t)).collect();
                primal.call(shifted).unwrap()
            };
            let (up, down) = (at(h), at(-h));
            for (o, t) in got.iter().enumerate() {
                if !t.dtype().is_float() {
                    continue;
                }
                let fd: Vec<f64> = up[o]
                    .to_vec::<f64>()
                    .iter()
                    .zip(down[o].to_vec::<f64>())
                    .map(|(a, b)| (a - b) / (2.0 * h))
                    .collect();
                assert_eq!(
                    mismatch(&t.to_vec::<f64>(), &fd, 1e-6),
                    None,
                    "{name}, {backend:?}, output {o}"
                );
            }
        }
    }
}

/// A recurrent cell over a scan, a Newton iteration in a data-dependent while_loop, a cond, a
/// fori_loop and a stop_gradient: one `f64[3] -> f64[3]` function of each.
/// A named test function.
type Named = (&'static str, Box<dyn Fn(&Tensor) -> Tensor>);

fn control_flow_functions() -> Vec<Named> {
    let w = lcg_tensor(&mut Lcg(59), &[3, 3]);
    let xs = lcg_tensor(&mut Lcg(61), &[5, 3]);
    vec![
        (
            "scan",
            Box::new(move |h: &Tensor| {
                let (h, ys) = scan(
                    |h: &Tensor, x: &Tensor| {
                        let n = (h.reshape([1, 3]).matmul(&w).reshape([3]) + x).tanh();
                        (n.clone(), n.sin())
                    },
                    h,
                    &xs,
                    None,
                    false,
                );
                h + ys.sum_axes([0])
            }),
        ),
        (
            "while_loop",
            // sqrt(a) by Newton from a/2 until |x^2 - a| < 1e-12 (about 5-7 steps).
            Box::new(|a: &Tensor| {
                let (x, _) = while_loop(
                    |(x, a): &(Tensor, Tensor)| {
                        (x * x - a).abs().max().gt(&Tensor::scalar(1e-12f64))
                    },
                    |(x, a): &(Tensor, Tensor)| ((x + &(a / x)) * 0.5, a.clone()),
                    &(a * 0.5 + 0.5, a.clone()),
                );
                x
            }),
        ),
        (
            "cond",
            Box::new(|x: &Tensor| {
                cond(
                    &x.sum().gt(&Tensor::scalar(0.0f64)),
                    |x: &Tensor| x.square(),
                    |x: &Tensor| x.sin() * 3.0,
                    x,
                )
            }),
        ),
        (
            "fori_loop",
            Box::new(|x: &Tensor| fori_loop(0, 4, |_i: &Tensor, c: &Tensor| (c * x).tanh() + x, x)),
        ),
        (
            "stop_gradient",
            Box::new(|x: &Tensor| x * &stop_gradient(&x.exp())),
        ),
    ]
}

#[test]
fn jvp_jacfwd_and_hessian_through_the_control_flow_api() {
    eight_devices();
    let mut rng = Lcg(67);
    for (name, f) in control_flow_functions() {
        // Positive inputs keep the square root's argument positive.
        let x = f64s((0..3).map(|_| rng.range(0.5, 2.0)).collect(), &[3]);
        let v = lcg_tensor(&mut rng, &[3]);
        let (y, t) = jvp(|x: &Tensor| f(x), &x, &v);
        assert_eq!(y.to_vec::<f64>(), f(&x).to_vec::<f64>(), "{name}");
        if name == "stop_gradient" {
            // d/dx x * stop(e^x) = e^x, not e^x (1 + x).
            let want: Vec<f64> = x
                .to_vec::<f64>()
                .iter()
                .zip(v.to_vec::<f64>())
                .map(|(x, v)| x.exp() * v)
                .collect();
            assert_eq!(mismatch(&t.to_vec::<f64>(), &want, 1e-15), None, "{name}");
            continue;
        }
        let fd = contract_fd(&f, &x, &v);
        assert_eq!(mismatch(&t.to_vec::<f64>(), &fd, 1e-7), None, "{name}: jvp");
        let jf = jacfwd(|x: &Tensor| f(x))(&x);
        assert_eq!(
            mismatch(
                &jf.to_vec::<f64>(),
                &fd_jacobian(|x: &Tensor| f(x), &x),
                1e-7
            ),
            None,
            "{name}: jacfwd"
        );
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let j =
                jit(|(x, v): (Tensor, Tensor)| jvp(|x: &Tensor| f(x), &x, &v).1).backend(backend);
            let got = j.call((x.clone(), v.clone())).unwrap();
            assert_eq!(
                mismatch(&got.to_vec::<f64>(), &t.to_vec::<f64>(), 1e-12),
                None,
                "{name}: jvp under jit, {backend:?}"
            );
            // Only the tangents are used: the primal region is dead and removed, the jvp'd
            // one computes both.
            let lowered = j.lower(&(x.clone(), v.clone())).unwrap();
            let (traced, ir) = (lowered.traced_ir(), lowered.ir());
            for region in ["= scan", "= while", "= case"] {
                let n = traced.matches(region).count();
                assert!(
                    n == 0 || n == 2,
                    "{name}: {n} {region} in the trace\n{traced}"
                );
                assert!(
                    ir.matches(region).count() <= 1,
                    "{name}: {region} twice in\n{ir}"
                );
            }
        }
        if name == "while_loop" {
            // Reverse mode through a while_loop is refused, so no jacrev or hessian.
            continue;
        }
        let jr = jacrev(|x: &Tensor| f(x))(&x);
        assert_eq!(
            mismatch(&jr.to_vec::<f64>(), &jf.to_vec::<f64>(), 1e-13),
            None,
            "{name}: jacrev vs jacfwd"
        );
        // Reverse over forward: the gradient of <1, J(x) v>.
        let inner = |x: &Tensor| jvp(|x: &Tensor| f(x), x, &v).1.sum();
        assert_eq!(
            mismatch(
                &grad(inner)(&x).to_vec::<f64>(),
                &fd_jacobian(inner, &x),
                1e-6
            ),
            None,
            "{name}: grad of jvp"
        );
        let e = |x: &Tensor| f(x).sum();
        let h = hessian(e)(&x);
        assert_eq!(
            mismatch(&h.to_vec::<f64>(), &fd_jacobian(grad(e), &x), 1e-6),
            None,
            "{name}: hessian"
        );
    }
}

/// `J v` by central differences along `v`.
fn contract_fd(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor, v: &Tensor) -> Vec<f64> {
    let h = 1e-6;
    let up = f(&axpy(x, h, v)).to_vec::<f64>();
    let down = f(&axpy(x, -h, v)).to_vec::<f64>();
    up.iter()
        .zip(&down)
        .map(|(a, b)| (a - b) / (2.0 * h))
        .collect()
}

/// Forward mode of a data-parallel loss on a mesh: the tangent program is sharded like the
/// primal one, and its reduction over the batch gets an all_reduce, as the gradient's does.
#[test]
fn jvp_with_inputs_on_a_mesh_matches_the_single_device_run() {
    eight_devices();
    let w = lcg_tensor(&mut Lcg(71), &[3, 4]);
    let x = lcg_tensor(&mut Lcg(73), &[16, 3]);
    let v = lcg_tensor(&mut Lcg(79), &[3, 4]);
    let loss = |w: &Tensor, x: &Tensor| x.matmul(w).tanh().square().mean();
    let single = jit(|(w, x, v): (Tensor, Tensor, Tensor)| jvp(|w: &Tensor| loss(w, &x), &w, &v));
    let (want_l, want_t) = single.call((w.clone(), x.clone(), v.clone())).unwrap();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let mesh = Mesh::new([8], ["dp"]);
        let sx = device_put(x.clone(), NamedSharding::new(&mesh, P!["dp"]));
        let f = jit(|(w, x, v): (Tensor, Tensor, Tensor)| jvp(|w: &Tensor| loss(w, &x), &w, &v))
            .backend(backend);
        let (l, t) = f.call((w.clone(), sx.clone(), v.clone())).unwrap();
        for (a, b, what) in [(&l, &want_l, "loss"), (&t, &want_t, "tangent")] {
            assert_eq!(
                mismatch(&a.to_vec::<f64>(), &b.to_vec::<f64>(), 1e-13),
                None,
                "{backend:?} {what}"
            );
        }
        let per_device = f
            .lower(&(w.clone(), sx, v.clone()))
            .unwrap()
            .per_device_ir();
        assert!(per_device.contains("all_reduce"), "{per_device}");
    }
}

/// The Jacobians of a 256-wide layer agree by both modes, eagerly and under jit; the times
/// (`cargo test -p tessera --test forward wide -- --nocapture`) are the figures of
/// docs/notes-jvp.md.
#[test]
fn jacobians_of_a_wide_layer_agree_and_their_times() {
    eight_devices();
    let n = 256;
    let w = random::normal(&Key::new(1), [n, n]) * 0.1;
    let x = random::normal(&Key::new(2), [n]);
    let f = |x: &Tensor| x.reshape([1, n]).matmul(&w).reshape([n]).tanh();
    let time = |what: &str, g: &dyn Fn() -> Tensor| {
        let t0 = std::time::Instant::now();
        let out = g();
        println!("n={n}: {what} {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        out
    };
    let jf = time("eager jacfwd", &|| jacfwd(f)(&x));
    let jr = time("eager jacrev", &|| jacrev(f)(&x));
    let j = jit(|x: Tensor| jacfwd(f)(&x));
    let jj = time("jit(jacfwd) first call", &|| j.call(x.clone()).unwrap());
    time("jit(jacfwd) second call", &|| j.call(x.clone()).unwrap());
    let h = time("eager hessian of sum", &|| {
        hessian(|x: &Tensor| f(x).sum())(&x)
    });
    assert_eq!(jf.shape(), &[n, n]);
    assert_eq!(h.shape(), &[n, n]);
    let (a, b, c) = (jf.to_vec::<f32>(), jr.to_vec::<f32>(), jj.to_vec::<f32>());
    for i in 0..a.len() {
        assert!(
            (a[i] - b[i]).abs() <= 1e-6,
            "[{i}] jacfwd {} vs jacrev {}",
            a[i],
            b[i]
        );
        assert!(
            (a[i] - c[i]).abs() <= 1e-6,
            "[{i}] eager {} vs jit {}",
            a[i],
            c[i]
        );
    }
    // d/dx_j of (1 - tanh(z_i)^2) w_ji summed over i: symmetric.
    let hv = h.to_vec::<f32>();
    for i in 0..n {
        for k in 0..i {
            let (p, q) = (hv[i * n + k], hv[k * n + i]);
            assert!(
                (p - q).abs() <= 1e-6 * p.abs().max(1.0),
                "H[{i},{k}] {p} vs {q}"
            );
        }
    }
}
