//! A generated corpus: one small graph per op and accepted element type. Table tests iterate
//! over it (round trip through the text format, interpreter against a reference, and later
//! compiled against interpreted), and a test checks that it names every op in `ALL_OP_NAMES`
//! but the region ops (`REGION_OP_NAMES`: a region's sample is a graph with bodies, tested by
//! `tessera-ir/tests/regions.rs`, `tessera-codegen/tests/regions.rs`, the `regions.ir`
//! filetests of every pass and the fuzzer), so an op added without a sample fails the suite.

use crate::graph::Graph;
use crate::literal::{Data, Literal};
use crate::op::{BinaryOp, CollectiveOp, CompareOp, DotDims, Op, ReduceKind, UnaryOp};
use crate::sharding::{DimSharding, Mesh, Sharding};
use crate::types::{DType, TensorType};

/// One op applied to parameters of fixed types.
pub struct Sample {
    /// `op.dtype`, e.g. `exp.f32`, `convert.i32_to_f32`.
    pub name: String,
    pub graph: Graph,
}

fn one(name: String, op: Op, params: &[TensorType], mesh: Option<Mesh>) -> Sample {
    let mut g = Graph::new("sample");
    g.mesh = mesh;
    let ps: Vec<_> = params.iter().map(|t| g.add_param(t.clone())).collect();
    let n = g
        .add(op, &ps)
        .unwrap_or_else(|e| panic!("corpus sample {name} is ill-typed: {e}"));
    g.set_outputs(vec![n]);
    Sample { name, graph: g }
}

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

/// Every sample of the corpus.
pub fn op_samples() -> Vec<Sample> {
    use DType::*;
    let mut out = Vec::new();
    let numeric = [F32, F64, I32, U32, I64, F16, BF16];
    for u in UnaryOp::ALL {
        for d in DType::ALL.into_iter().filter(|&d| u.accepts(d)) {
            out.push(one(
                format!("{}.{d}", u.name()),
                Op::Unary(u),
                &[t(d, &[3, 5])],
                None,
            ));
        }
    }
    for b in BinaryOp::ALL {
        for d in DType::ALL.into_iter().filter(|&d| b.accepts(d)) {
            let ty = t(d, &[3, 5]);
            out.push(one(
                format!("{}.{d}", b.name()),
                Op::Binary(b),
                &[ty.clone(), ty],
                None,
            ));
        }
    }
    for c in CompareOp::ALL {
        for d in DType::ALL {
            let ty = t(d, &[3, 5]);
            out.push(one(
                format!("{}.{d}", c.name()),
                Op::Compare(c),
                &[ty.clone(), ty],
                None,
            ));
        }
    }
    for d in DType::ALL {
        let ty = t(d, &[3, 5]);
        out.push(one(
            format!("select.{d}"),
            Op::Select,
            &[t(Bool, &[3, 5]), ty.clone(), ty],
            None,
        ));
        for to in DType::ALL {
            out.push(one(
                format!("convert.{d}_to_{to}"),
                Op::Convert(to),
                &[t(d, &[7])],
                None,
            ));
        }
        out.push(one(
            format!("broadcast_in_dim.{d}"),
            Op::BroadcastInDim {
                shape: [2, 3, 4].into(),
                dims: vec![0, 2],
            },
            &[t(d, &[2, 1])],
            None,
        ));
        out.push(one(
            format!("reshape.{d}"),
            Op::Reshape([6, 2].into()),
            &[t(d, &[3, 4])],
            None,
        ));
        out.push(one(
            format!("transpose.{d}"),
            Op::Transpose(vec![2, 0, 1]),
            &[t(d, &[2, 3, 4])],
            None,
        ));
        out.push(one(
            format!("slice.{d}"),
            Op::Slice {
                start: vec![1, 0],
                limit: vec![5, 3],
                stride: vec![2, 1],
            },
            &[t(d, &[6, 4])],
            None,
        ));
        out.push(one(
            format!("concatenate.{d}"),
            Op::Concatenate { dim: 1 },
            &[t(d, &[2, 3]), t(d, &[2, 1]), t(d, &[2, 2])],
            None,
        ));
        out.push(one(
            format!("pad.{d}"),
            Op::Pad {
                low: vec![1, -1],
                high: vec![0, 2],
                interior: vec![1, 0],
            },
            &[t(d, &[3, 4]), t(d, &[])],
            None,
        ));
        let mesh = Mesh::new("mesh", vec![("x".into(), 1), ("y".into(), 1)]);
        let xy = vec!["x".to_string(), "y".to_string()];
        out.push(one(
            format!("all_gather.{d}"),
            Op::Collective(CollectiveOp::AllGather {
                dim: 1,
                axes: xy.clone(),
            }),
            &[t(d, &[2, 3])],
            Some(mesh.clone()),
        ));
        out.push(one(
            format!("all_to_all.{d}"),
            Op::Collective(CollectiveOp::AllToAll {
                split_dim: 0,
                concat_dim: 1,
                axes: vec!["x".into()],
            }),
            &[t(d, &[2, 3])],
            Some(mesh.clone()),
        ));
        out.push(one(
            format!("collective_permute.{d}"),
            Op::Collective(CollectiveOp::CollectivePermute {
                axes: vec!["y".into()],
                pairs: vec![(0, 0)],
            }),
            &[t(d, &[2, 3])],
            Some(mesh.clone()),
        ));
        out.push(one(
            format!("sharding_constraint.{d}"),
            Op::ShardingConstraint(Sharding {
                mesh: "mesh".into(),
                dims: vec![
                    DimSharding::closed(vec!["x".into()]),
                    DimSharding::default(),
                ],
                replicated: vec!["y".into()],
                unreduced: Vec::new(),
            }),
            &[t(d, &[2, 3])],
            Some(mesh),
        ));
    }
    // Identity on values (its derivative, zero, is tested in `tessera/tests/grad.rs`).
    for d in [F32, F64] {
        out.push(one(
            format!("stop_gradient.{d}"),
            Op::StopGradient,
            &[t(d, &[3, 5])],
            None,
        ));
    }
    for (from, to) in [
        (F32, I32),
        (F32, U32),
        (I32, F32),
        (U32, F32),
        (I32, U32),
        (U32, I32),
        (F64, F64),
    ] {
        out.push(one(
            format!("bitcast.{from}_to_{to}"),
            Op::Bitcast(to),
            &[t(from, &[7])],
            None,
        ));
    }
    for d in numeric {
        out.push(one(
            format!("iota.{d}"),
            Op::Iota {
                dim: 1,
                ty: t(d, &[2, 3]),
            },
            &[],
            None,
        ));
        let lit = match d {
            F32 => Data::F32(vec![1.5, -2.0, 0.1, 3e-8, 1e30, -0.0]),
            F64 => Data::F64(vec![1.5, -2.0, 0.1, 3e-300, 1e300, -0.0]),
            I32 => Data::I32(vec![1, -2, 0, i32::MAX, i32::MIN, 7]),
            U32 => Data::U32(vec![1, 2, 0, u32::MAX, 5, 7]),
            I64 => Data::I64(vec![1, -2, 0, i64::MAX, i64::MIN, 1 << 40]),
            F16 => Data::F16(
                [1.5, -2.0, 0.1, 6e-8, 65504.0, -0.0]
                    .map(crate::literal::f16::from_f32)
                    .to_vec(),
            ),
            BF16 => Data::BF16(
                [1.5, -2.0, 0.1, 1e-40, 3e38, -0.0]
                    .map(crate::literal::bf16::from_f32)
                    .to_vec(),
            ),
            Bool => unreachable!("not numeric"),
        };
        out.push(one(
            format!("constant.{d}"),
            Op::Constant(Literal::new([2, 3], lit).expect("six elements")),
            &[],
            None,
        ));
        for k in ReduceKind::ALL {
            out.push(one(
                format!("reduce_{}.{d}", k.name()),
                Op::Reduce {
                    kind: k,
                    axes: vec![0, 2],
                },
                &[t(d, &[3, 4, 5])],
                None,
            ));
            let mesh = Mesh::new("mesh", vec![("x".into(), 1)]);
            out.push(one(
                format!("all_reduce_{}.{d}", k.name()),
                Op::Collective(CollectiveOp::AllReduce {
                    kind: k,
                    axes: vec!["x".into()],
                }),
                &[t(d, &[2, 3])],
                Some(mesh.clone()),
            ));
            out.push(one(
                format!("reduce_scatter_{}.{d}", k.name()),
                Op::Collective(CollectiveOp::ReduceScatter {
                    kind: k,
                    dim: 0,
                    axes: vec!["x".into()],
                }),
                &[t(d, &[2, 3])],
                Some(mesh),
            ));
        }
        out.push(one(
            format!("argmax.{d}"),
            Op::ArgMax { axis: 1 },
            &[t(d, &[3, 6, 2])],
            None,
        ));
        out.extend(crate::sorting::corpus::samples(d));
        out.push(one(
            format!("dot_general.{d}"),
            Op::DotGeneral(DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![1],
                lhs_contract: vec![2],
                rhs_contract: vec![0],
            }),
            &[t(d, &[2, 3, 4]), t(d, &[4, 2, 5])],
            None,
        ));
        out.push(one(
            format!("matmul.{d}"),
            Op::DotGeneral(DotDims::matmul()),
            &[t(d, &[5, 7]), t(d, &[7, 3])],
            None,
        ));
    }
    // The windowed ops (`conv.rs`): a grouped, strided, dilated, padded NCHW conv, an NHWC/HWIO
    // one, one with a batch group, one with a zero-size batch; reduce_window of every kind.
    for d in [F32, F64] {
        let mut cd = crate::conv::ConvDims::nchw(2);
        cd.strides = vec![2, 1];
        cd.padding = vec![(1, 1), (0, 2)];
        cd.lhs_dilation = vec![1, 2];
        cd.rhs_dilation = vec![2, 1];
        cd.feature_group_count = 2;
        out.push(one(
            format!("conv_general_dilated.{d}"),
            Op::Conv(Box::new(cd)),
            &[t(d, &[2, 4, 5, 4]), t(d, &[6, 2, 2, 3])],
            None,
        ));
        let mut nhwc = crate::conv::ConvDims::nchw(2);
        nhwc.lhs_spec = vec![0, 3, 1, 2];
        nhwc.rhs_spec = vec![3, 2, 0, 1];
        nhwc.out_spec = vec![0, 3, 1, 2];
        nhwc.padding = vec![(1, 1), (1, 1)];
        nhwc.window_reversal = true;
        out.push(one(
            format!("conv_nhwc.{d}"),
            Op::Conv(Box::new(nhwc.clone())),
            &[t(d, &[2, 4, 3, 3]), t(d, &[3, 3, 3, 4])],
            None,
        ));
        let mut bg = crate::conv::ConvDims::nchw(1);
        bg.batch_group_count = 2;
        out.push(one(
            format!("conv_batch_group.{d}"),
            Op::Conv(Box::new(bg)),
            &[t(d, &[4, 3, 5]), t(d, &[4, 3, 2])],
            None,
        ));
        out.push(one(
            format!("conv_empty_batch.{d}"),
            Op::Conv(Box::new(nhwc)),
            &[t(d, &[0, 4, 3, 3]), t(d, &[3, 3, 3, 4])],
            None,
        ));
    }
    for kind in ReduceKind::ALL {
        for d in numeric {
            let mut win = crate::conv::WindowDims::new(vec![1, 3, 2], vec![1, 2, 1]);
            win.padding = vec![(0, 0), (1, 1), (0, 1)];
            win.window_dilation = vec![1, 1, 2];
            out.push(one(
                format!("{}.{d}", crate::conv::reduce_window_name(kind)),
                Op::ReduceWindow {
                    kind,
                    win: Box::new(win),
                },
                &[t(d, &[2, 5, 6])],
                None,
            ));
        }
    }
    out.push(one(
        "constant.bool".into(),
        Op::Constant(Literal::new([3], Data::Bool(vec![true, false, true])).expect("three")),
        &[],
        None,
    ));
    out.push(one(
        "axis_index.i32".into(),
        Op::Collective(CollectiveOp::AxisIndex {
            axes: vec!["x".into(), "y".into()],
        }),
        &[],
        Some(Mesh::new("mesh", vec![("x".into(), 1), ("y".into(), 1)])),
    ));
    for (name, op, params) in crate::gather::corpus_samples() {
        out.push(one(name, op, &params, None));
    }
    out
}

/// The mnemonics of every op in the corpus, parameters included.
pub fn covered_op_names(samples: &[Sample]) -> std::collections::BTreeSet<&'static str> {
    samples
        .iter()
        .flat_map(|s| s.graph.node_ids().map(|id| s.graph.op(id).name()))
        .collect()
}

/// A small deterministic generator (an LCG), so table tests need no dependency and reproduce.
pub struct Lcg(pub u64);

impl Lcg {
    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
}

/// Random inputs for a sample, inside the domain of its op: positive for log and sqrt, inside
/// (-1, 1) for erf_inv, shift amounts in 0..40 (some past the width), integers small with a few
/// near u32::MAX to exercise wrapping.
pub fn random_inputs(sample: &Sample, rng: &mut Lcg) -> Vec<Literal> {
    let g = &sample.graph;
    let op = g.op(g.outputs()[0]).clone();
    let shift = matches!(
        op,
        Op::Binary(BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical)
    );
    let (lo, hi) = match op {
        Op::Unary(UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt) | Op::Binary(BinaryOp::Pow) => {
            (0.1, 3.0)
        }
        Op::Unary(UnaryOp::Log1p) => (-0.9, 3.0),
        Op::Unary(UnaryOp::ErfInv | UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atanh) => {
            (-0.99, 0.99)
        }
        Op::Unary(UnaryOp::Acosh) => (1.1, 4.0),
        // Away from tan's poles at +-pi/2, for finite differences.
        Op::Unary(UnaryOp::Tan) => (-1.2, 1.2),
        // Integer indices from -2 to 7: in and out of bounds of the samples' dims.
        Op::Gather(_) | Op::Scatter(_) => (-0.2, 0.7),
        // tidy: allow-wildcard(a default input range for test samples, not per-op policy)
        _ if shift => (0.0, 40.0),
        // tidy: allow-wildcard(a default input range for test samples, not per-op policy)
        _ => (-4.0, 4.0),
    };
    g.params()
        .iter()
        .map(|&p| {
            let ty = g.ty(p);
            let n = ty.numel();
            let data = match ty.dtype {
                DType::F32 => Data::F32((0..n).map(|_| rng.range(lo, hi) as f32).collect()),
                DType::F64 => Data::F64((0..n).map(|_| rng.range(lo, hi)).collect()),
                DType::I32 if shift => {
                    Data::I32((0..n).map(|_| rng.range(lo, hi) as i32).collect())
                }
                DType::I32 => Data::I32(
                    (0..n)
                        .map(|_| (rng.range(lo, hi) * 10.0).round() as i32)
                        .collect(),
                ),
                DType::U32 => Data::U32(
                    (0..n)
                        .map(|i| match (shift, i % 5) {
                            (true, _) => rng.range(lo, hi) as u32,
                            (false, 4) => u32::MAX - i as u32,
                            (false, _) => (rng.range(0.0, hi) * 10.0) as u32,
                        })
                        .collect(),
                ),
                DType::Bool => Data::Bool((0..n).map(|_| rng.next_f64() < 0.5).collect()),
                DType::I64 if shift => {
                    Data::I64((0..n).map(|_| rng.range(lo, hi) as i64).collect())
                }
                DType::I64 => Data::I64(
                    (0..n)
                        .map(|i| match i % 5 {
                            4 => i64::MAX - i as i64,
                            _ => (rng.range(lo, hi) * 1e10).round() as i64,
                        })
                        .collect(),
                ),
                DType::F16 => Data::F16(
                    (0..n)
                        .map(|_| crate::literal::f16::from_f64(rng.range(lo, hi)))
                        .collect(),
                ),
                DType::BF16 => Data::BF16(
                    (0..n)
                        .map(|_| crate::literal::bf16::from_f64(rng.range(lo, hi)))
                        .collect(),
                ),
            };
            Literal {
                ty: ty.clone(),
                data,
            }
        })
        .collect()
}
