//! Random op graphs and awkward shapes (size 0 and 1 dims, inner dims that are not multiples
//! of 4) through both backends: compiled agrees with interpreted.

use proptest::prelude::*;
use tessera_interp::{SingleDevice, run};
use tessera_ir::corpus::Lcg;
use tessera_ir::{
    BinaryOp, CompareOp, DType, Data, DotDims, Graph, Literal, NodeId, Op, ReduceKind, Shape,
    TensorType, UnaryOp,
};

fn agree(got: &Literal, want: &Literal) -> Result<(), String> {
    if got.ty != want.ty {
        return Err(format!("type {} vs {}", got.ty, want.ty));
    }
    for i in 0..got.data.len() {
        let (a, b) = (got.data.get_f64(i), want.data.get_f64(i));
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 * b.abs() + 1e-5;
        if !ok {
            return Err(format!("element {i}: compiled {a}, interpreted {b}"));
        }
    }
    Ok(())
}

fn check(g: &Graph, seed: u64) -> Result<(), String> {
    tessera_ir::verify(g).map_err(|e| e.to_string())?;
    let mut rng = Lcg(seed);
    let inputs: Vec<Literal> = g
        .params()
        .iter()
        .map(|&p| {
            let ty = g.ty(p);
            Literal::new(
                ty.shape.clone(),
                Data::F32(
                    (0..ty.numel())
                        .map(|_| rng.range(-2.0, 2.0) as f32)
                        .collect(),
                ),
            )
            .unwrap()
        })
        .collect();
    let want = run(g, &inputs).map_err(|e| e.to_string())?;
    let exe = tessera_codegen::compile(g).map_err(|e| e.to_string())?;
    let refs: Vec<&Literal> = inputs.iter().collect();
    let got = exe.run(&refs, &SingleDevice).map_err(|e| e.to_string())?;
    for (a, b) in got.iter().zip(&want) {
        agree(a, b).map_err(|e| format!("{e}\n{}\n{}", tessera_ir::print(g), exe.describe()))?;
    }
    Ok(())
}

/// Builds a random f32 graph from a stream of choices.
fn random_graph(choices: &[u32]) -> Graph {
    let mut it = choices.iter().copied().cycle();
    let mut next = |n: u32| it.next().unwrap_or(0) % n.max(1);
    const DIMS: [usize; 8] = [1, 2, 3, 4, 5, 7, 9, 17];
    let mut g = Graph::new("random");
    let rank = 1 + next(3) as usize;
    let shape: Vec<usize> = (0..rank).map(|_| DIMS[next(8) as usize]).collect();
    let mut nodes: Vec<NodeId> = (0..1 + next(2))
        .map(|_| g.add_param(TensorType::new(DType::F32, shape.clone())))
        .collect();
    for _ in 0..3 + next(8) {
        let a = nodes[next(nodes.len() as u32) as usize];
        let at = g.ty(a).clone();
        let same: Vec<NodeId> = nodes.iter().copied().filter(|&n| g.ty(n) == &at).collect();
        let b = same[next(same.len() as u32) as usize];
        let op = match next(10) {
            0 => Op::Unary(
                [
                    UnaryOp::Tanh,
                    UnaryOp::Logistic,
                    UnaryOp::Sin,
                    UnaryOp::Neg,
                    UnaryOp::Abs,
                    UnaryOp::Exp,
                ][next(6) as usize],
            ),
            1 | 2 => Op::Binary(
                [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Max,
                    BinaryOp::Min,
                ][next(5) as usize],
            ),
            3 if at.rank() > 0 => Op::Reduce {
                kind: [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min][next(3) as usize],
                axes: vec![next(at.rank() as u32) as usize],
            },
            4 if at.rank() > 1 => {
                let mut perm: Vec<usize> = (0..at.rank()).collect();
                perm.rotate_left(1 + next(at.rank() as u32 - 1) as usize);
                Op::Transpose(perm)
            }
            5 if at.rank() < 3 => {
                let pos = next(at.rank() as u32 + 1) as usize;
                let mut dims = at.dims().to_vec();
                dims.insert(pos, DIMS[next(8) as usize]);
                let map: Vec<usize> = (0..at.rank())
                    .map(|i| if i < pos { i } else { i + 1 })
                    .collect();
                Op::BroadcastInDim {
                    shape: Shape::new(dims),
                    dims: map,
                }
            }
            6 if at.rank() > 0 => {
                let start: Vec<usize> =
                    at.dims().iter().map(|&d| next(d as u32) as usize).collect();
                let limit: Vec<usize> = at.dims().to_vec();
                let stride = at.dims().iter().map(|_| 1 + next(2) as usize).collect();
                Op::Slice {
                    start,
                    limit,
                    stride,
                }
            }
            7 => Op::Reshape(Shape::new(vec![at.numel()])),
            8 if at.rank() == 2 => {
                // a (m x k) times its transpose viewed as k x m: a dot with a free transposed operand.
                let t = g.add(Op::Transpose(vec![1, 0]), &[b]).unwrap();
                nodes.push(t);
                let d = g.add(Op::DotGeneral(DotDims::matmul()), &[a, t]).unwrap();
                nodes.push(d);
                continue;
            }
            9 => {
                let c = g.add(Op::Compare(CompareOp::Gt), &[a, b]).unwrap();
                let s = g.add(Op::Select, &[c, a, b]).unwrap();
                nodes.push(s);
                continue;
            }
            _ => Op::Unary(UnaryOp::Tanh),
        };
        let operands: Vec<NodeId> = if matches!(op, Op::Binary(_)) {
            vec![a, b]
        } else {
            vec![a]
        };
        if let Ok(n) = g.add(op, &operands) {
            nodes.push(n);
        }
    }
    let last = *nodes.last().unwrap();
    let other = nodes[next(nodes.len() as u32) as usize];
    g.set_outputs(vec![last, other]);
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_graphs_agree(choices in prop::collection::vec(any::<u32>(), 64), seed in any::<u64>()) {
        let g = random_graph(&choices);
        if let Err(e) = check(&g, seed) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn awkward_shapes_agree() {
    let shapes: &[&[usize]] = &[
        &[0],
        &[1],
        &[3],
        &[4],
        &[7],
        &[1, 1],
        &[2, 13],
        &[5, 1, 3],
        &[0, 3],
        &[3, 0],
        &[],
    ];
    for (i, dims) in shapes.iter().enumerate() {
        let ty = TensorType::new(DType::F32, dims.to_vec());
        let mut g = Graph::new("awkward");
        let x = g.add_param(ty.clone());
        let y = g.add_param(ty.clone());
        let t = g.add(Op::Unary(UnaryOp::Tanh), &[x]).unwrap();
        let m = g.add(Op::Binary(BinaryOp::Mul), &[t, y]).unwrap();
        let mut outs = vec![m];
        for axis in 0..ty.rank() {
            outs.push(
                g.add(
                    Op::Reduce {
                        kind: ReduceKind::Sum,
                        axes: vec![axis],
                    },
                    &[m],
                )
                .unwrap(),
            );
            outs.push(
                g.add(
                    Op::Reduce {
                        kind: ReduceKind::Max,
                        axes: vec![axis],
                    },
                    &[x],
                )
                .unwrap(),
            );
        }
        let all: Vec<usize> = (0..ty.rank()).collect();
        outs.push(
            g.add(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: all,
                },
                &[m],
            )
            .unwrap(),
        );
        if ty.rank() >= 2 {
            let perm: Vec<usize> = (0..ty.rank()).rev().collect();
            outs.push(g.add(Op::Transpose(perm), &[m]).unwrap());
        }
        g.set_outputs(outs);
        check(&g, i as u64).unwrap_or_else(|e| panic!("shape {dims:?}: {e}"));
    }
}
