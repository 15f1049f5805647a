//! The generated corpus: every op appears in it, every sample passes the verifier and survives
//! the text round trip, and type rules reject malformed uses of every op family.

use tessera_ir::corpus::{covered_op_names, op_samples};
use tessera_ir::*;

/// Every op but the region ops has a sample. The region ops (`REGION_OP_NAMES`) own bodies, so
/// a one-op sample cannot hold them; they are tested by `tests/regions.rs` (text format,
/// verifier), `tessera-codegen/tests/regions.rs` (compiled against interpreted), the
/// `regions.ir` filetests of every pass and the fuzzer (`tessera/tests/fuzz.rs`).
#[test]
fn corpus_covers_every_op() {
    let samples = op_samples();
    let covered = covered_op_names(&samples);
    let missing: Vec<&&str> = ALL_OP_NAMES
        .iter()
        .filter(|n| !covered.contains(**n) && !REGION_OP_NAMES.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a corpus sample: {missing:?}"
    );
    assert_eq!(
        covered.len() + REGION_OP_NAMES.len(),
        ALL_OP_NAMES.len(),
        "an op name is missing from ALL_OP_NAMES"
    );
    let in_corpus: Vec<_> = REGION_OP_NAMES
        .iter()
        .filter(|n| covered.contains(**n))
        .collect();
    assert!(
        in_corpus.is_empty(),
        "region ops in the corpus: {in_corpus:?}"
    );
    assert!(
        REGION_OP_NAMES.iter().all(|n| ALL_OP_NAMES.contains(n)),
        "a region op missing from ALL_OP_NAMES"
    );
}

#[test]
fn corpus_round_trips_through_text() {
    for s in op_samples() {
        verify(&s.graph).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        let text = print(&s.graph);
        let back = parse(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name));
        assert!(
            back.structurally_eq(&s.graph),
            "{}: round trip changed the graph\n{text}",
            s.name
        );
        assert_eq!(print(&back), text, "{}", s.name);
    }
}

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, dims.to_vec())
}

/// One malformed use per op family: each must be a `TypeError` naming the op.
#[test]
fn type_rules_reject_bad_operands() {
    let f = ty(DType::F32, &[2, 3]);
    let i = ty(DType::I32, &[2, 3]);
    let b = ty(DType::Bool, &[2, 3]);
    let mesh = Mesh::new("m", vec![("x".into(), 2)]);
    let cases: Vec<(Op, Vec<TensorType>)> = vec![
        (Op::Unary(UnaryOp::Exp), vec![i.clone()]),
        (Op::Unary(UnaryOp::Not), vec![f.clone()]),
        (Op::Binary(BinaryOp::Add), vec![f.clone(), i.clone()]),
        (Op::Binary(BinaryOp::ShiftLeft), vec![f.clone(), f.clone()]),
        (Op::Binary(BinaryOp::Pow), vec![i.clone(), i.clone()]),
        (
            Op::Compare(CompareOp::Lt),
            vec![f.clone(), ty(DType::F32, &[3, 2])],
        ),
        (Op::Select, vec![f.clone(), f.clone(), f.clone()]),
        (Op::Bitcast(DType::F64), vec![f.clone()]),
        (
            Op::BroadcastInDim {
                shape: [4, 3].into(),
                dims: vec![0, 1],
            },
            vec![f.clone()],
        ),
        (Op::Reshape([7].into()), vec![f.clone()]),
        (Op::Transpose(vec![0, 0]), vec![f.clone()]),
        (
            Op::Slice {
                start: vec![0, 2],
                limit: vec![2, 1],
                stride: vec![1, 1],
            },
            vec![f.clone()],
        ),
        (
            Op::Concatenate { dim: 0 },
            vec![f.clone(), ty(DType::F32, &[2, 4])],
        ),
        (
            Op::Pad {
                low: vec![0, 0],
                high: vec![0, 0],
                interior: vec![0, 0],
            },
            vec![f.clone(), f.clone()],
        ),
        (
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![2],
            },
            vec![f.clone()],
        ),
        (
            Op::Reduce {
                kind: ReduceKind::Max,
                axes: vec![0],
            },
            vec![b.clone()],
        ),
        (Op::ArgMax { axis: 0 }, vec![ty(DType::F32, &[0, 2])]),
        (
            Op::DotGeneral(DotDims::matmul()),
            vec![f.clone(), f.clone()],
        ),
        (
            Op::Iota {
                dim: 2,
                ty: f.clone(),
            },
            vec![],
        ),
        (Op::Constant(Literal::scalar_f32(1.0)), vec![f.clone()]),
        (
            Op::Collective(CollectiveOp::AllReduce {
                kind: ReduceKind::Sum,
                axes: vec!["y".into()],
            }),
            vec![f.clone()],
        ),
        (
            Op::Collective(CollectiveOp::AllGather {
                dim: 2,
                axes: vec!["x".into()],
            }),
            vec![f.clone()],
        ),
        (
            Op::Collective(CollectiveOp::ReduceScatter {
                kind: ReduceKind::Sum,
                dim: 1,
                axes: vec!["x".into()],
            }),
            vec![f.clone()],
        ),
        (
            Op::Collective(CollectiveOp::AllToAll {
                split_dim: 1,
                concat_dim: 0,
                axes: vec!["x".into()],
            }),
            vec![f.clone()],
        ),
        (
            Op::Collective(CollectiveOp::CollectivePermute {
                axes: vec!["x".into()],
                pairs: vec![(0, 1), (1, 1)],
            }),
            vec![f.clone()],
        ),
        (
            Op::Collective(CollectiveOp::AxisIndex {
                axes: vec!["x".into(), "x".into()],
            }),
            vec![],
        ),
        (
            Op::ShardingConstraint(Sharding::replicated("m", 3)),
            vec![f.clone()],
        ),
        (Op::Convert(DType::F32), vec![]),
    ];
    for (op, operands) in cases {
        let refs: Vec<&TensorType> = operands.iter().collect();
        let err = op
            .infer_type(&refs, Some(&mesh))
            .expect_err(&format!("{} accepted {operands:?}", op.name()));
        assert_eq!(err.op, op.name());
        assert!(err.to_string().starts_with(op.name()), "{err}");
    }
}
