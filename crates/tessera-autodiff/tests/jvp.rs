//! Forward mode (`tessera_autodiff::jvp`) on IR text: the tangent graphs of a few rules,
//! printed (text in, text out), and the region ops' JVPs against central finite differences in
//! f64, evaluated by the interpreter (the oracle).

use tessera_autodiff::{jvp, vjp};
use tessera_interp::run;
use tessera_ir::{DType, Data, Graph, Literal, NodeId, parse, print, verify};

/// The float parameters of `g` as `wrt`, one new tangent parameter each, and the tangents of
/// the float outputs as the outputs. Returns the graph and which outputs got no tangent.
fn tangent_graph(text: &str) -> (Graph, Vec<usize>) {
    let mut g = parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let wrt: Vec<NodeId> = g
        .params()
        .iter()
        .copied()
        .filter(|&p| g.ty(p).dtype.is_float())
        .collect();
    let tangents: Vec<NodeId> = wrt
        .iter()
        .map(|&p| {
            let ty = g.ty(p).clone();
            g.add_param(ty)
        })
        .collect();
    let outputs: Vec<NodeId> = g
        .outputs()
        .iter()
        .copied()
        .filter(|&o| g.ty(o).dtype.is_float())
        .collect();
    let t = jvp(&mut g, &wrt, &tangents, &outputs).unwrap_or_else(|e| panic!("{e}"));
    let missing: Vec<usize> = t
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_none())
        .map(|(i, _)| i)
        .collect();
    g.set_outputs(t.into_iter().flatten().collect());
    verify(&g).unwrap_or_else(|e| panic!("the tangent graph is malformed: {e}\n{}", print(&g)));
    (g, missing)
}

/// Asserts that the tangent graph of `input` prints as `expected`.
fn check(input: &str, expected: &str) {
    let (g, missing) = tangent_graph(input);
    assert!(missing.is_empty(), "outputs without a tangent: {missing:?}");
    let got = print(&g);
    assert_eq!(got, expected, "got:\n{got}");
}

#[test]
fn tanh_follows_jaxs_formula() {
    check(
        "func @f(%0: f32[3]) {\n  %1 = tanh %0 : f32[3]\n  return %1\n}\n",
        "func @f(%0: f32[3], %1: f32[3]) {
  %2 = tanh %0 : f32[3]
  %3 = constant 1.0 : f32[]  # jvp of tanh
  %4 = broadcast_in_dim %3 dims=[] : f32[3]  # jvp of tanh
  %5 = mul %1, %2 : f32[3]  # jvp of tanh
  %6 = add %1, %5 : f32[3]  # jvp of tanh
  %7 = sub %4, %2 : f32[3]  # jvp of tanh
  %8 = mul %6, %7 : f32[3]  # jvp of tanh
  return %8
}
",
    );
}

#[test]
fn mul_and_dot_general_sum_the_shares_of_both_tangents() {
    check(
        "func @f(%0: f32[4,3], %1: f32[3,2]) {
  %2 = dot_general %0, %1 contracting=[1]x[0] : f32[4,2]
  return %2
}
",
        "func @f(%0: f32[4,3], %1: f32[3,2], %2: f32[4,3], %3: f32[3,2]) {
  %4 = dot_general %0, %1 contracting=[1]x[0] : f32[4,2]
  %5 = dot_general %2, %1 contracting=[1]x[0] : f32[4,2]  # jvp of dot_general
  %6 = dot_general %0, %3 contracting=[1]x[0] : f32[4,2]  # jvp of dot_general
  %7 = add %5, %6 : f32[4,2]  # jvp of dot_general
  return %7
}
",
    );
}

#[test]
fn only_present_tangents_are_used_and_integer_paths_have_none() {
    // The integer parameter has no tangent, so the product's rule builds one share only.
    check(
        "func @f(%0: f32[3], %1: i32[3]) {
  %2 = convert %1 : f32[3]
  %3 = mul %0, %2 : f32[3]
  return %3
}
",
        "func @f(%0: f32[3], %1: i32[3], %2: f32[3]) {
  %3 = convert %1 : f32[3]
  %4 = mul %0, %3 : f32[3]
  %5 = mul %2, %3 : f32[3]  # jvp of mul
  return %5
}
",
    );
    // An output that depends on no input has no tangent (zero).
    let (_, missing) =
        tangent_graph("func @f(%0: f32[3]) {\n  %1 = constant 2.0 : f32[]\n  return %1\n}\n");
    assert_eq!(missing, vec![0]);
}

#[test]
fn reduce_max_takes_the_mean_tangent_of_the_winners() {
    check(
        "func @f(%0: f32[2,3]) {\n  %1 = reduce_max %0 axes=[1] : f32[2]\n  return %1\n}\n",
        "func @f(%0: f32[2,3], %1: f32[2,3]) {
  %2 = reduce_max %0 axes=[1] : f32[2]
  %3 = broadcast_in_dim %2 dims=[0] : f32[2,3]  # jvp of reduce_max
  %4 = eq %0, %3 : bool[2,3]  # jvp of reduce_max
  %5 = convert %4 : f32[2,3]  # jvp of reduce_max
  %6 = mul %1, %5 : f32[2,3]  # jvp of reduce_max
  %7 = reduce_sum %6 axes=[1] : f32[2]  # jvp of reduce_max
  %8 = reduce_sum %5 axes=[1] : f32[2]  # jvp of reduce_max
  %9 = div %7, %8 : f32[2]  # jvp of reduce_max
  return %9
}
",
    );
}

#[test]
fn stop_gradient_has_a_zero_tangent() {
    // x * stop_gradient(x): the tangent is t * x, not 2 t x.
    check(
        "func @f(%0: f32[3]) {
  %1 = stop_gradient %0 : f32[3]
  %2 = mul %0, %1 : f32[3]
  return %2
}
",
        "func @f(%0: f32[3], %1: f32[3]) {
  %2 = stop_gradient %0 : f32[3]
  %3 = mul %0, %2 : f32[3]
  %4 = mul %1, %2 : f32[3]  # jvp of mul
  return %4
}
",
    );
}

#[test]
fn a_scan_gains_tangent_carries_and_outputs() {
    check(
        "func @f(%0: f32[3], %1: f32[4,3]) {
  %2 = scan %0, %1 length=4 consts=0 carries=1 : (f32[3], f32[4,3])
    body(%0: f32[3], %1: f32[3]) {
      %2 = mul %0, %1 : f32[3]
      return %2, %0
    }
  %3 = get_result %2 index=0 : f32[3]
  return %3
}
",
        "func @f(%0: f32[3], %1: f32[4,3], %2: f32[3], %3: f32[4,3]) {
  %4 = scan %0, %1 length=4 consts=0 carries=1 : (f32[3], f32[4,3])
    body(%0: f32[3], %1: f32[3]) {
      %2 = mul %0, %1 : f32[3]
      return %2, %0
    }
  %5 = get_result %4 index=0 : f32[3]
  %6 = scan %0, %2, %1, %3 length=4 consts=0 carries=2 : (f32[3], f32[3], f32[4,3], f32[4,3])  # jvp of scan
    body(%0: f32[3], %1: f32[3], %2: f32[3], %3: f32[3]) {
      %4 = mul %0, %2 : f32[3]
      %5 = mul %1, %2 : f32[3]  # jvp of mul
      %6 = mul %0, %3 : f32[3]  # jvp of mul
      %7 = add %5, %6 : f32[3]  # jvp of mul
      return %4, %7, %0, %1
    }
  %7 = get_result %6 index=1 : f32[3]  # jvp of scan
  return %7
}
",
    );
}

// ---- region ops against finite differences ---------------------------------------------------

fn f64s(v: &[f64], shape: &[usize]) -> Literal {
    Literal::new(shape.to_vec(), Data::F64(v.to_vec())).expect("a literal")
}

fn values(l: &Literal) -> Vec<f64> {
    l.data.to_vec::<f64>().expect("f64 values")
}

/// A deterministic pseudo-random vector in [-1, 1).
fn wiggle(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// Checks the JVP of every float output of `text` at `inputs` against central differences
/// along random tangents of the float inputs; returns the tangents for further checks.
fn check_fd(text: &str, inputs: &[Literal]) -> Vec<Vec<f64>> {
    let g = parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&g).unwrap();
    let (tg, missing) = tangent_graph(text);
    let float_in: Vec<usize> = (0..inputs.len())
        .filter(|&i| inputs[i].ty.dtype.is_float())
        .collect();
    let tangents: Vec<Literal> = float_in
        .iter()
        .map(|&i| {
            let l = &inputs[i];
            f64s(&wiggle(i as u64 + 1, l.ty.numel()), l.ty.dims())
        })
        .collect();
    let mut all = inputs.to_vec();
    all.extend(tangents.iter().cloned());
    let got = run(&tg, &all).unwrap_or_else(|e| panic!("{e}\n{}", print(&tg)));
    let h = 1e-6;
    let shifted = |s: f64| -> Vec<Literal> {
        let mut xs = inputs.to_vec();
        for (k, &i) in float_in.iter().enumerate() {
            let v: Vec<f64> = values(&inputs[i])
                .iter()
                .zip(values(&tangents[k]))
                .map(|(x, t)| x + s * t)
                .collect();
            xs[i] = f64s(&v, inputs[i].ty.dims());
        }
        run(&g, &xs).unwrap()
    };
    let (up, down) = (shifted(h), shifted(-h));
    let float_out: Vec<usize> = (0..up.len())
        .filter(|&o| up[o].ty.dtype.is_float())
        .collect();
    let mut got_it = got.iter();
    let mut out = Vec::new();
    for (k, &o) in float_out.iter().enumerate() {
        let fd: Vec<f64> = values(&up[o])
            .iter()
            .zip(values(&down[o]))
            .map(|(a, b)| (a - b) / (2.0 * h))
            .collect();
        let t = if missing.contains(&k) {
            vec![0.0; fd.len()]
        } else {
            values(got_it.next().expect("a tangent output"))
        };
        for (i, (a, b)) in t.iter().zip(&fd).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "output {o}[{i}]: jvp {a} vs finite difference {b}\n{}",
                print(&tg)
            );
        }
        out.push(t);
    }
    out
}

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

fn scan_inputs() -> Vec<Literal> {
    vec![
        f64s(&wiggle(11, 3), &[3]),
        f64s(&wiggle(12, 12), &[4, 3]),
        f64s(&wiggle(13, 3), &[3]),
    ]
}

#[test]
fn scan_forward_and_reverse_match_finite_differences() {
    check_fd(SCAN, &scan_inputs());
    check_fd(
        &SCAN.replace("length=4", "reverse length=4"),
        &scan_inputs(),
    );
    // A scan without carries, and one whose const is an integer (no tangent).
    check_fd(
        "func @f(%0: f64[4,3], %1: i32[]) {
  %2 = scan %1, %0 length=4 consts=1 carries=0 : (f64[4,3])
    body(%0: i32[], %1: f64[3]) {
      %2 = convert %0 : f64[]
      %3 = broadcast_in_dim %2 dims=[] : f64[3]
      %4 = mul %1, %3 : f64[3]
      %5 = exp %4 : f64[3]
      return %5
    }
  %3 = get_result %2 index=0 : f64[4,3]
  return %3
}
",
        &[
            f64s(&wiggle(3, 12), &[4, 3]),
            Literal::new(vec![], Data::I32(vec![2])).unwrap(),
        ],
    );
}

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

#[test]
fn while_with_a_data_dependent_trip_count_matches_finite_differences() {
    for (start, steps) in [([1.0, 0.5, 0.25], 5), ([3.0, 3.0, 2.0], 1)] {
        let inputs = [f64s(&start, &[3]), f64s(&[0.3, -0.2, 0.7], &[3])];
        let g = parse(WHILE).unwrap();
        let out = run(&g, &inputs).unwrap();
        assert_eq!(out[1].data.to_vec::<i32>(), Some(vec![steps]));
        let t = check_fd(WHILE, &inputs);
        // d x_n / d x_0 = 1.5^n along the tangent of x_0, plus the a-term.
        assert_eq!(t.len(), 1, "one float output");
    }
}

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
      return %1
    }
  %4 = get_result %3 index=0 : f64[3]
  return %4
}
";

#[test]
fn case_matches_finite_differences_in_every_branch() {
    for index in [0, 1, 2, 7] {
        check_fd(
            CASE,
            &[
                Literal::new(vec![], Data::I32(vec![index])).unwrap(),
                f64s(&wiggle(21, 3), &[3]),
                f64s(&wiggle(22, 3), &[3]),
            ],
        );
    }
}

#[test]
fn checkpoint_and_stop_gradient_match_finite_differences() {
    let t = check_fd(
        "func @f(%0: f64[3], %1: f64[3]) {
  %2 = checkpoint %0, %1 : (f64[3])
    body(%0: f64[3], %1: f64[3]) {
      %2 = exp %0 : f64[3]
      %3 = mul %2, %1 : f64[3]
      return %3
    }
  %3 = get_result %2 index=0 : f64[3]
  return %3
}
",
        &[f64s(&wiggle(31, 3), &[3]), f64s(&wiggle(32, 3), &[3])],
    );
    assert_eq!(t.len(), 1);
    // stop_gradient: the derivative of x * stop_gradient(x) is x, which finite differences
    // of x * x (2x) would not give: check the value directly.
    let text = "func @f(%0: f64[3]) {
  %1 = stop_gradient %0 : f64[3]
  %2 = mul %0, %1 : f64[3]
  return %2
}
";
    let (tg, _) = tangent_graph(text);
    let x = f64s(&[1.0, -2.0, 3.0], &[3]);
    let t = f64s(&[1.0, 1.0, 0.5], &[3]);
    assert_eq!(values(&run(&tg, &[x, t]).unwrap()[0]), vec![1.0, -2.0, 1.5]);
}

#[test]
fn forward_over_reverse_through_a_scan_is_the_hessian_times_v() {
    // The gradient of sum(carry) with respect to the init carry, by the lead's reverse rule;
    // its JVP along v against central differences of the gradient.
    let mut g = parse(SCAN).unwrap();
    let loss = {
        let out = g.outputs()[0];
        g.add(
            tessera_ir::Op::Reduce {
                kind: tessera_ir::ReduceKind::Sum,
                axes: vec![0],
            },
            &[out],
        )
        .unwrap()
    };
    let seed = g
        .add(
            tessera_ir::Op::Constant(Literal::splat(
                &tessera_ir::TensorType::scalar(DType::F64),
                1.0,
            )),
            &[],
        )
        .unwrap();
    let wrt = g.params()[0];
    let grads = vjp(&mut g, &[loss], &[seed], &[wrt]).unwrap();
    g.set_outputs(vec![grads[0].expect("a gradient")]);
    verify(&g).unwrap();
    let text = print(&g);
    check_fd(&text, &scan_inputs());
}

#[test]
fn custom_vjp_has_no_forward_rule() {
    let mut g = parse(
        "func @f(%0: f32[4]) {
  %1 = custom_vjp %0 primals=1 : (f32[4], f32[4])
    fwd(%0: f32[4]) {
      %1 = exp %0 : f32[4]
      return %1, %1
    }
    bwd(%0: f32[4], %1: f32[4]) {
      %2 = mul %0, %1 : f32[4]
      return %2
    }
  %2 = get_result %1 index=0 : f32[4]
  return %2
}
",
    )
    .unwrap();
    let x = g.params()[0];
    let t = g.add_param(g.ty(x).clone());
    let out = g.outputs()[0];
    let err = jvp(&mut g, &[x], &[t], &[out]).unwrap_err().to_string();
    assert!(
        err.contains("custom_vjp") && err.contains("forward mode"),
        "{err}"
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let mut g = parse("func @f(%0: f32[3], %1: i32[3]) {\n  return %0\n}\n").unwrap();
    let (x, i) = (g.params()[0], g.params()[1]);
    let t4 = g.add_param(tessera_ir::TensorType::new(DType::F32, vec![4]));
    let e = jvp(&mut g, &[x], &[t4], &[x]).unwrap_err().to_string();
    assert!(e.contains("f32[4]") && e.contains("f32[3]"), "{e}");
    let e = jvp(&mut g, &[i], &[i], &[x]).unwrap_err().to_string();
    assert!(e.contains("i32[3]"), "{e}");
    let e = jvp(&mut g, &[x], &[], &[x]).unwrap_err().to_string();
    assert!(e.contains("1 inputs with 0 tangents"), "{e}");
}

#[test]
fn annotations_and_linear_collectives_apply_to_the_tangent() {
    let (g, missing) = tangent_graph(
        "mesh @mesh = <\"dp\"=2>
func @f(%0: f32[8,3]) {
  %1 = sharding_constraint %0 sharding=<@mesh, [{\"dp\"}, {}]> : f32[8,3]
  %2 = all_reduce %1 sum axes=[\"dp\"] : f32[8,3]
  %3 = all_reduce %1 max axes=[\"dp\"] : f32[8,3]
  return %2, %3
}
",
    );
    assert!(missing.is_empty());
    let text = print(&g);
    // The sum is linear: the same all_reduce on the tangent of the constrained value. The max
    // is the mean tangent of the winning devices, made of sum all_reduces only (which have a
    // VJP), so the tangent graph can be differentiated again.
    for line in [
        "%5 = sharding_constraint %1 sharding=<@mesh, [{\"dp\"}, {}]> : f32[8,3]  # jvp of sharding_constraint",
        "%6 = all_reduce %5 sum axes=[\"dp\"] : f32[8,3]  # jvp of all_reduce",
        "%7 = eq %2, %4 : bool[8,3]  # jvp of all_reduce",
        "%10 = all_reduce %9 sum axes=[\"dp\"] : f32[8,3]  # jvp of all_reduce",
        "%11 = all_reduce %8 sum axes=[\"dp\"] : f32[8,3]  # jvp of all_reduce",
        "%12 = div %10, %11 : f32[8,3]  # jvp of all_reduce",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
    assert!(
        !text.contains("max axes=[\"dp\"] : f32[8,3]  # jvp"),
        "{text}"
    );
}
