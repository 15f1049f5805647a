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
