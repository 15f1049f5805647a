//! The copying collectives' arithmetic (`tessera_transport::values`) against the interpreter,
//! bit for bit: `reduce` is a chain of the interpreter's `add`/`max`/`min`, `reduce_widened`
//! its f32 sum in f64 rounded once (`convert`, `add`, `convert`; f16 and bf16 then rounded
//! from that f32), `chunk` a `slice`,
//! `concat` a `concatenate`, `all_to_all` slices concatenated. Values include NaN, both
//! zeros, infinities and integer overflow.

use tessera_interp::eval_op;
use tessera_ir::{BinaryOp, DType, Data, Literal, Op, ReduceKind, TensorType};
use tessera_transport::values;

const DIMS: [usize; 3] = [4, 6, 2];
const N: usize = 4 * 6 * 2;

/// Member `p`'s value of `dtype`: a pseudo-random mix with the special values in it.
fn value(dtype: DType, p: usize) -> Literal {
    let specials = [f64::NAN, 0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e30];
    let f = |i: usize| {
        let h = (i * 2654435761 + p * 40503) % 1000;
        if h.is_multiple_of(13) {
            specials[(h / 13) % specials.len()]
        } else {
            h as f64 / 7.0 - 70.0
        }
    };
    let data = match dtype {
        DType::F32 => Data::F32((0..N).map(|i| f(i) as f32).collect()),
        DType::F64 => Data::F64((0..N).map(f).collect()),
        DType::I32 => Data::I32(
            (0..N)
                .map(|i| (i as i32 * 1_000_003 + p as i32 * 7).wrapping_mul(i32::MAX / 3))
                .collect(),
        ),
        DType::U32 => Data::U32(
            (0..N)
                .map(|i| (i as u32 * 2_000_003 + p as u32).wrapping_mul(u32::MAX / 3))
                .collect(),
        ),
        DType::Bool => Data::Bool((0..N).map(|i| (i + p).is_multiple_of(3)).collect()),
        DType::I64 => Data::I64(
            (0..N)
                .map(|i| (i as i64 * 1_000_003 + p as i64 * 7).wrapping_mul(i64::MAX / 3))
                .collect(),
        ),
        DType::F16 => Data::F16((0..N).map(|i| tessera_ir::f16::from_f64(f(i))).collect()),
        DType::BF16 => Data::BF16((0..N).map(|i| tessera_ir::bf16::from_f64(f(i))).collect()),
    };
    Literal::new(DIMS, data).unwrap()
}

fn members(dtype: DType) -> Vec<Literal> {
    (0..4).map(|p| value(dtype, p)).collect()
}

fn binary(kind: ReduceKind) -> Op {
    Op::Binary(match kind {
        ReduceKind::Sum => BinaryOp::Add,
        ReduceKind::Max => BinaryOp::Max,
        ReduceKind::Min => BinaryOp::Min,
    })
}

const KINDS: [ReduceKind; 3] = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min];
const NUMERIC: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::F16,
    DType::BF16,
];
const ALL: [DType; 8] = DType::ALL;

#[test]
fn reduce_is_a_chain_of_the_interpreters_binary_ops() {
    for dtype in NUMERIC {
        let vs = members(dtype);
        let refs: Vec<&Literal> = vs.iter().collect();
        for kind in KINDS {
            let mut want = vs[0].clone();
            for v in &vs[1..] {
                want = eval_op(&binary(kind), &[&want, v], &v.ty).unwrap();
            }
            let got = values::reduce(kind, &refs).unwrap();
            assert_eq!(got, want, "{dtype:?} {kind:?}");
        }
    }
}

#[test]
fn the_widened_all_reduce_is_the_interpreters_f64_sum_rounded_once() {
    for dtype in NUMERIC {
        let vs = members(dtype);
        let refs: Vec<&Literal> = vs.iter().collect();
        for kind in KINDS {
            let wide = |x: &Literal| match dtype {
                DType::F32 | DType::F16 | DType::BF16 => {
                    eval_op(&Op::Convert(DType::F64), &[x], &x.ty.with_dtype(DType::F64)).unwrap()
                }
                DType::F64 | DType::I32 | DType::U32 | DType::Bool | DType::I64 => x.clone(),
            };
            let mut acc = wide(&vs[0]);
            for v in &vs[1..] {
                let w = wide(v);
                acc = eval_op(&binary(kind), &[&acc, &w], &w.ty).unwrap();
            }
            let to = |t: DType, x: &Literal| {
                eval_op(&Op::Convert(t), &[x], &x.ty.with_dtype(t)).unwrap()
            };
            // f16 and bf16: as f32's all-reduce between two converts (rounded to f32 first).
            let want = match dtype {
                DType::F32 => to(DType::F32, &acc),
                DType::F16 | DType::BF16 => to(dtype, &to(DType::F32, &acc)),
                DType::F64 | DType::I32 | DType::U32 | DType::Bool | DType::I64 => acc,
            };
            for range in [0..N, 5..17, 9..9] {
                let got = values::reduce_widened(kind, &refs, range.clone()).unwrap();
                let want_part = values::chunk_elements(&want.data, range.clone());
                let got = Literal::new([range.len()], got).unwrap();
                let want_part = Literal::new([range.len()], want_part).unwrap();
                assert_eq!(got, want_part, "{dtype:?} {kind:?} {range:?}");
            }
        }
    }
}

fn slice(x: &Literal, dim: usize, k: usize, n: usize) -> Literal {
    let size = x.ty.dims()[dim] / n;
    let mut start = vec![0; x.ty.rank()];
    let mut limit = x.ty.dims().to_vec();
    start[dim] = k * size;
    limit[dim] = (k + 1) * size;
    let mut dims = x.ty.dims().to_vec();
    dims[dim] = size;
    let op = Op::Slice {
        start,
        limit,
        stride: vec![1; x.ty.rank()],
    };
    eval_op(&op, &[x], &TensorType::new(x.ty.dtype, dims)).unwrap()
}

fn concatenate(parts: &[&Literal], dim: usize) -> Literal {
    let mut dims = parts[0].ty.dims().to_vec();
    dims[dim] = parts.iter().map(|p| p.ty.dims()[dim]).sum();
    let ty = TensorType::new(parts[0].ty.dtype, dims);
    eval_op(&Op::Concatenate { dim }, parts, &ty).unwrap()
}

#[test]
fn chunks_and_concatenations_are_the_interpreters_slices_and_concatenations() {
    for dtype in ALL {
        let vs = members(dtype);
        let refs: Vec<&Literal> = vs.iter().collect();
        for dim in 0..3 {
            for n in [1, 2] {
                for k in 0..n {
                    let got = values::chunk("test", &vs[1], dim, k, n).unwrap();
                    assert_eq!(got, slice(&vs[1], dim, k, n), "{dtype:?} dim {dim} {k}/{n}");
                }
            }
            let got = values::concat("test", &refs, dim).unwrap();
            assert_eq!(got, concatenate(&refs, dim), "{dtype:?} dim {dim}");
        }
        for (split, cat) in [(0, 1), (0, 0), (1, 2), (2, 0)] {
            for me in 0..2 {
                let pair = &refs[..2];
                let parts: Vec<Literal> = pair.iter().map(|v| slice(v, split, me, 2)).collect();
                let part_refs: Vec<&Literal> = parts.iter().collect();
                let want = concatenate(&part_refs, cat);
                let got = values::all_to_all(pair, split, cat, me).unwrap();
                assert_eq!(got, want, "{dtype:?} all_to_all {split}->{cat} at {me}");
            }
        }
    }
}

/// Bit for bit, but a NaN matches any NaN: neither Rust nor LLVM fixes a NaN result's sign or
/// payload (an optimized build may commute an `fadd`, and x86 keeps the first operand's NaN),
/// so `inf + -inf + NaN` is a NaN of either sign between two loops. Signed zeros still count.
fn same_but_nan_bits(a: &Literal, b: &Literal) -> bool {
    a.ty == b.ty && a.data.bits_eq_any_nan(&b.data)
}

/// Every combination over four members of +0, -0, NaN, the infinities and 1 at one element
/// (the cases where max and min order zeros and propagate NaN).
#[test]
fn every_combination_of_special_values_reduces_as_the_interpreter() {
    let specials = [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0];
    let n = specials.len().pow(4);
    for dtype in [DType::F32, DType::F64] {
        let vs: Vec<Literal> = (0..4)
            .map(|p| {
                let f = |i: usize| specials[(i / specials.len().pow(p as u32)) % specials.len()];
                let data = match dtype {
                    DType::F32 => Data::F32((0..n).map(|i| f(i) as f32).collect()),
                    DType::F64
                    | DType::I32
                    | DType::U32
                    | DType::Bool
                    | DType::I64
                    | DType::F16
                    | DType::BF16 => Data::F64((0..n).map(f).collect()),
                };
                Literal::new([n], data).unwrap()
            })
            .collect();
        let refs: Vec<&Literal> = vs.iter().collect();
        for kind in KINDS {
            let mut want = vs[0].clone();
            for v in &vs[1..] {
                want = eval_op(&binary(kind), &[&want, v], &v.ty).unwrap();
            }
            let got = values::reduce(kind, &refs).unwrap();
            assert!(
                same_but_nan_bits(&got, &want),
                "{dtype:?} {kind:?}: {got:?} against {want:?}"
            );
            let wide = values::reduce_widened(kind, &refs, 0..n).unwrap();
            if kind != ReduceKind::Sum {
                // Max and min are exact: widening changes nothing.
                let wide = Literal::new([n], wide).unwrap();
                assert!(
                    same_but_nan_bits(&wide, &want),
                    "{dtype:?} {kind:?} widened: {wide:?} against {want:?}"
                );
            }
        }
    }
}
