//! The batching pass (`tessera_autodiff::batch`): every corpus op, batched along every
//! combination of in_axes, equals the loop of the per-example op on the interpreter, bit for
//! bit; and text-in/text-out cases of the pass on the IR text format.

use tessera_autodiff::batch;
use tessera_interp::{eval_op, run};
use tessera_ir::corpus::{Lcg, op_samples, random_inputs};
use tessera_ir::{Data, Literal, Op, Shape, TensorType, parse, print};

/// `parts` (one per example, one type) stacked along a new dim `axis`.
fn stack(parts: &[Literal], axis: usize) -> Literal {
    let ty = parts[0].ty.clone();
    let mut data = Data::zeros(ty.dtype, 0);
    for p in parts {
        data.extend(&p.data).unwrap();
    }
    let mut dims = vec![parts.len()];
    dims.extend_from_slice(ty.dims());
    let front = Literal {
        ty: TensorType::new(ty.dtype, dims.clone()),
        data,
    };
    let mut perm: Vec<usize> = (1..dims.len()).collect();
    perm.insert(axis, 0);
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    eval_op(
        &Op::Transpose(perm),
        &[&front],
        &TensorType::new(ty.dtype, out_dims),
    )
    .unwrap()
}

/// Example `i` of `x`, whose batch dim is `axis`.
fn lane(x: &Literal, axis: usize, i: usize) -> Literal {
    let rank = x.ty.rank();
    let mut start = vec![0; rank];
    let mut limit = x.ty.dims().to_vec();
    start[axis] = i;
    limit[axis] = i + 1;
    let mut one = limit.clone();
    one[axis] = 1;
    let s = eval_op(
        &Op::Slice {
            start,
            limit,
            stride: vec![1; rank],
        },
        &[x],
        &TensorType::new(x.ty.dtype, one),
    )
    .unwrap();
    let mut dims = x.ty.dims().to_vec();
    dims.remove(axis);
    let shape = Shape::from(dims);
    eval_op(
        &Op::Reshape(shape.clone()),
        &[&s],
        &TensorType::new(x.ty.dtype, shape),
    )
    .unwrap()
}

/// Bitwise equality, any NaN equal to any NaN.
fn same(a: &Literal, b: &Literal) -> bool {
    if a.ty != b.ty {
        return false;
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    a.data.bits_eq(&b.data)
        || x.iter()
            .zip(&y)
            .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
}

/// Every in_axes combination for parameters of these ranks: each `None` or any dim up to the
/// rank; at most `cap` of them, spread over the space.
fn axis_choices(ranks: &[usize], cap: usize) -> Vec<Vec<Option<usize>>> {
    let mut all: Vec<Vec<Option<usize>>> = vec![vec![]];
    for &r in ranks {
        let mut next = Vec::new();
        for prefix in &all {
            for a in std::iter::once(None).chain((0..=r).map(Some)) {
                let mut p = prefix.clone();
                p.push(a);
                next.push(p);
            }
        }
        all = next;
    }
    let step = all.len().div_ceil(cap).max(1);
    all.into_iter().step_by(step).collect()
}

#[test]
fn every_corpus_op_batched_equals_the_loop_of_the_op() {
    let size = 3;
    let mut rng = Lcg(12);
    let mut cases = 0;
    for sample in op_samples() {
        let g = &sample.graph;
        let ranks: Vec<usize> = g.params().iter().map(|&p| g.ty(p).rank()).collect();
        let out_rank = g.ty(g.outputs()[0]).rank();
        for in_axes in axis_choices(&ranks, 12) {
            for out_axis in [0, out_rank] {
                let examples: Vec<Vec<Literal>> = (0..size)
                    .map(|_| random_inputs(&sample, &mut rng))
                    .collect();
                let inputs: Vec<Literal> = in_axes
                    .iter()
                    .enumerate()
                    .map(|(p, a)| match a {
                        Some(a) => {
                            let parts: Vec<Literal> =
                                examples.iter().map(|e| e[p].clone()).collect();
                            stack(&parts, *a)
                        }
                        None => examples[0][p].clone(),
                    })
                    .collect();
                let bg = batch(g, &in_axes, size, None, &[Some(out_axis)])
                    .unwrap_or_else(|e| panic!("{}: {in_axes:?}: {e}", sample.name));
                let got = run(&bg, &inputs).unwrap_or_else(|e| {
                    panic!("{}: {in_axes:?}: {e}\n{}", sample.name, print(&bg))
                });
                for i in 0..size {
                    let per: Vec<Literal> = in_axes
                        .iter()
                        .zip(&inputs)
                        .map(|(a, x)| match a {
                            Some(a) => lane(x, *a, i),
                            None => x.clone(),
                        })
                        .collect();
                    let want = run(g, &per).unwrap();
                    let lane_got = lane(&got[0], out_axis, i);
                    assert!(
                        same(&lane_got, &want[0]),
                        "{}: in_axes {in_axes:?}, out_axis {out_axis}, example {i}:\n{}\ngot {:?}\nwant {:?}",
                        sample.name,
                        print(&bg),
                        lane_got.to_f64_vec(),
                        want[0].to_f64_vec()
                    );
                }
                cases += 1;
            }
        }
    }
    assert!(cases > 500, "only {cases} cases");
}

/// A text case: the per-example program, the pass's arguments, and the batched program.
struct Case {
    name: &'static str,
    input: &'static str,
    in_axes: &'static [Option<usize>],
    size: usize,
    axis_name: Option<&'static str>,
    out_axes: &'static [Option<usize>],
    expect: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "an unbatched weight stays unbatched; the dot gets a free dim, the bias a broadcast",
        input: "func @f(%0: f32[3,4], %1: f32[4], %2: f32[3]) {
  %3 = dot_general %0, %2 contracting=[0]x[0] : f32[4]
  %4 = add %3, %1 : f32[4]
  %5 = tanh %4 : f32[4]
  return %5
}
",
        in_axes: &[None, None, Some(0)],
        size: 5,
        axis_name: None,
        out_axes: &[Some(0)],
        expect: "func @f(%0: f32[3,4], %1: f32[4], %2: f32[5,3]) {
  %3 = dot_general %0, %2 contracting=[0]x[1] : f32[4,5]
  %4 = broadcast_in_dim %1 dims=[0] : f32[4,5]
  %5 = add %3, %4 : f32[4,5]
  %6 = tanh %5 : f32[4,5]
  %7 = transpose %6 perm=[1,0] : f32[5,4]
  return %7
}
",
    },
    Case {
        name: "both operands batched: the batch dims become dot batch dims",
        input: "func @f(%0: f32[3,4], %1: f32[4,2]) {
  %2 = dot_general %0, %1 contracting=[1]x[0] : f32[3,2]
  return %2
}
",
        in_axes: &[Some(0), Some(2)],
        size: 6,
        axis_name: None,
        out_axes: &[Some(1)],
        expect: "func @f(%0: f32[6,3,4], %1: f32[4,2,6]) {
  %2 = dot_general %0, %1 batch=[0]x[2] contracting=[2]x[0] : f32[6,3,2]
  %3 = transpose %2 perm=[1,0,2] : f32[3,6,2]
  return %3
}
",
    },
    Case {
        name: "psum over the mapped axis is a sum over the batch dim, its result unbatched",
        input: "mesh @vmap = <\"b\"=4>
func @f(%0: f32[3], %1: f32[3]) {
  %2 = all_reduce %0 sum axes=[\"b\"] : f32[3]
  %3 = all_reduce %1 sum axes=[\"b\"] : f32[3]
  %4 = div %0, %2 : f32[3]
  %5 = axis_index axes=[\"b\"] : i32[]
  return %4, %3, %5
}
",
        in_axes: &[Some(0), None],
        size: 4,
        axis_name: Some("b"),
        out_axes: &[Some(0), None, Some(0)],
        expect: "func @f(%0: f32[4,3], %1: f32[3]) {
  %2 = reduce_sum %0 axes=[0] : f32[3]
  %3 = constant 4.0 : f32[]
  %4 = broadcast_in_dim %3 dims=[] : f32[3]
  %5 = mul %1, %4 : f32[3]
  %6 = broadcast_in_dim %2 dims=[1] : f32[4,3]
  %7 = div %0, %6 : f32[4,3]
  %8 = iota dim=0 : i32[4]
  return %7, %5, %8
}
",
    },
    Case {
        name: "a reduction keeps the batch dim where it is, shifted past the reduced axes",
        input: "func @f(%0: f32[2,3,4]) {
  %1 = reduce_max %0 axes=[0,2] : f32[3]
  %2 = argmax %0 axis=2 : i32[2,3]
  return %1, %2
}
",
        in_axes: &[Some(2)],
        size: 5,
        axis_name: None,
        out_axes: &[Some(0), Some(2)],
        expect: "func @f(%0: f32[2,3,5,4]) {
  %1 = reduce_max %0 axes=[0,3] : f32[3,5]
  %2 = argmax %0 axis=3 : i32[2,3,5]
  %3 = transpose %1 perm=[1,0] : f32[5,3]
  return %3, %2
}
",
    },
];

#[test]
fn text_cases() {
    let update = std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for c in CASES {
        let g = parse(c.input).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let bg = batch(&g, c.in_axes, c.size, c.axis_name, c.out_axes)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let text = print(&bg);
        if update || text != c.expect {
            failures.push(format!("case: {}\n{text}", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every region op: a scan whose carry becomes batched through its body (the fixed point), a
/// while whose predicate is batched when its carry is (JAX's select rule) or not, a case on a
/// batched or unbatched index (clamped), a checkpoint, a custom_vjp and a stop_gradient.
const REGIONS: &str = r#"func @regions(%0: f32[4], %1: f32[3,4], %2: i32[], %3: f32[]) {
  %4 = scan %3, %0, %1 length=3 consts=1 carries=1 : (f32[4], f32[3,4])
    body(%0: f32[], %1: f32[4], %2: f32[4]) {
      %3 = add %1, %2 : f32[4]
      %4 = broadcast_in_dim %0 dims=[] : f32[4]
      %5 = mul %3, %4 : f32[4]
      %6 = tanh %5 : f32[4]
      return %6, %3
    }
  %5 = get_result %4 index=0 : f32[4]
  %6 = get_result %4 index=1 : f32[3,4]
  %7 = while %5 consts=0 : (f32[4])
    cond(%0: f32[4]) {
      %1 = abs %0 : f32[4]
      %2 = reduce_sum %1 axes=[0] : f32[]
      %3 = constant 6.0 : f32[]
      %4 = lt %2, %3 : bool[]
      return %4
    }
    body(%0: f32[4]) {
      %1 = constant 0.5 : f32[]
      %2 = broadcast_in_dim %1 dims=[] : f32[4]
      %3 = add %0, %2 : f32[4]
      %4 = add %0, %3 : f32[4]
      return %4
    }
  %8 = get_result %7 index=0 : f32[4]
  %9 = case %2, %8, %0 : (f32[4])
    branch(%0: f32[4], %1: f32[4]) {
      %2 = neg %0 : f32[4]
      return %2
    }
    branch(%0: f32[4], %1: f32[4]) {
      return %0
    }
    branch(%0: f32[4], %1: f32[4]) {
      %2 = mul %0, %1 : f32[4]
      return %2
    }
  %10 = get_result %9 index=0 : f32[4]
  %11 = checkpoint %10 : (f32[4])
    body(%0: f32[4]) {
      %1 = sin %0 : f32[4]
      return %1
    }
  %12 = get_result %11 index=0 : f32[4]
  %13 = custom_vjp %12 primals=1 : (f32[4], f32[4])
    fwd(%0: f32[4]) {
      %1 = exp %0 : f32[4]
      return %1, %1
    }
    bwd(%0: f32[4], %1: f32[4]) {
      %2 = mul %0, %1 : f32[4]
      return %2
    }
  %14 = get_result %13 index=0 : f32[4]
  %15 = stop_gradient %14 : f32[4]
  return %15, %6
}
"#;

/// A while whose predicate depends only on an unbatched counter: the loop stays one loop.
const COUNTED_WHILE: &str = r#"func @counted(%0: i32[], %1: f32[4]) {
  %2 = while %0, %1 consts=0 : (i32[], f32[4])
    cond(%0: i32[], %1: f32[4]) {
      %2 = constant 3 : i32[]
      %3 = lt %0, %2 : bool[]
      return %3
    }
    body(%0: i32[], %1: f32[4]) {
      %2 = constant 1 : i32[]
      %3 = add %0, %2 : i32[]
      %4 = sin %1 : f32[4]
      %5 = add %1, %4 : f32[4]
      return %3, %5
    }
  %3 = get_result %2 index=1 : f32[4]
  %4 = get_result %2 index=0 : i32[]
  return %3, %4
}
"#;

/// Random inputs for `g`'s parameters: floats in (-2, 2), i32 indices in -1..4 (so a case
/// clamps on both sides).
fn inputs_for(g: &tessera_ir::Graph, rng: &mut Lcg) -> Vec<Literal> {
    g.params()
        .iter()
        .map(|&p| {
            let ty = g.ty(p).clone();
            let n = ty.numel();
            let data = match ty.dtype {
                tessera_ir::DType::I32 => Data::I32(
                    (0..n)
                        .map(|_| rng.range(-1.0, 4.0).floor() as i32)
                        .collect(),
                ),
                tessera_ir::DType::F32 => {
                    Data::F32((0..n).map(|_| rng.range(-2.0, 2.0) as f32).collect())
                }
                other => panic!("no inputs of {other} in these tests"),
            };
            Literal { ty, data }
        })
        .collect()
}

/// `g` batched along every in_axes combination equals the loop over its examples.
fn check_against_loop(g: &tessera_ir::Graph, size: usize) -> usize {
    let mut rng = Lcg(7);
    let ranks: Vec<usize> = g.params().iter().map(|&p| g.ty(p).rank()).collect();
    let mut cases = 0;
    for in_axes in axis_choices(&ranks, usize::MAX) {
        let examples: Vec<Vec<Literal>> = (0..size).map(|_| inputs_for(g, &mut rng)).collect();
        let inputs: Vec<Literal> = in_axes
            .iter()
            .enumerate()
            .map(|(p, a)| match a {
                Some(a) => stack(
                    &examples.iter().map(|e| e[p].clone()).collect::<Vec<_>>(),
                    *a,
                ),
                None => examples[0][p].clone(),
            })
            .collect();
        let out_axes: Vec<Option<usize>> = g.outputs().iter().map(|_| Some(0)).collect();
        let bg = batch(g, &in_axes, size, None, &out_axes)
            .unwrap_or_else(|e| panic!("{in_axes:?}: {e}"));
        let got = run(&bg, &inputs).unwrap_or_else(|e| panic!("{in_axes:?}: {e}\n{}", print(&bg)));
        for i in 0..size {
            let per: Vec<Literal> = in_axes
                .iter()
                .zip(&inputs)
                .map(|(a, x)| match a {
                    Some(a) => lane(x, *a, i),
                    None => x.clone(),
                })
                .collect();
            let want = run(g, &per).unwrap();
            for (o, w) in want.iter().enumerate() {
                let l = lane(&got[o], 0, i);
                assert!(
                    same(&l, w),
                    "in_axes {in_axes:?}, output {o}, example {i}:\n{}\ngot {:?}\nwant {:?}",
                    print(&bg),
                    l.to_f64_vec(),
                    w.to_f64_vec()
                );
            }
        }
        cases += 1;
    }
    cases
}

#[test]
fn region_ops_batched_equal_the_loop() {
    let g = parse(REGIONS).unwrap();
    assert_eq!(check_against_loop(&g, 3), 48);
    let g = parse(COUNTED_WHILE).unwrap();
    assert_eq!(check_against_loop(&g, 3), 6);
}

#[test]
fn region_structure() {
    let g = parse(COUNTED_WHILE).unwrap();
    // The counter stays unbatched: the loop is one loop over a batched carry.
    let bg = batch(&g, &[None, Some(0)], 5, None, &[Some(0), None]).unwrap();
    let text = print(&bg);
    assert!(
        text.contains("while %0, %1 consts=0 : (i32[], f32[5,4])"),
        "{text}"
    );
    assert!(!text.contains("reduce_max"), "{text}");
    // A batched carry that decides the predicate: any lane's predicate runs the loop.
    let g = parse(REGIONS).unwrap();
    let bg = batch(
        &g,
        &[Some(0), None, None, None],
        5,
        None,
        &[Some(0), Some(0)],
    )
    .unwrap();
    let text = print(&bg);
    assert!(
        text.contains("reduce_max") && text.contains("select"),
        "{text}"
    );
    // The scan's carry is batched from the start when only its xs are (the fixed point).
    let bg = batch(
        &g,
        &[None, Some(0), None, None],
        5,
        None,
        &[Some(0), Some(0)],
    )
    .unwrap();
    let text = print(&bg);
    assert!(
        text.contains("body(%0: f32[], %1: f32[5,4], %2: f32[5,4])"),
        "{text}"
    );
}

/// `axis_index` over the mapped axis inside a scan body whose operands are all unbatched: the
/// body still becomes batched (each lane adds its own index per step).
#[test]
fn mapped_collectives_inside_a_body() {
    let g = parse(
        r#"mesh @vmap = <"b"=4>
func @f(%0: f32[]) {
  %1 = scan %0 length=3 consts=0 carries=1 : (f32[])
    body(%0: f32[]) {
      %1 = axis_index axes=["b"] : i32[]
      %2 = convert %1 : f32[]
      %3 = add %0, %2 : f32[]
      return %3
    }
  %2 = get_result %1 index=0 : f32[]
  return %2
}
"#,
    )
    .unwrap();
    let bg = batch(&g, &[None], 4, Some("b"), &[Some(0)]).unwrap();
    assert!(bg.mesh.is_none(), "{}", print(&bg));
    let out = run(&bg, &[Literal::scalar_f32(1.0)]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![1.0, 4.0, 7.0, 10.0]);
}
