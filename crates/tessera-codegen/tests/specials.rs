//! Interpreter and compiled code agree on the special values, bit for bit: every float unary
//! op on every special, every float binary op on every pair of specials, f32 and f64, on shape
//! [1] (the scalar code) and [37] (f32x4 loops and a scalar tail). NaN payloads are not part of
//! the semantics (any NaN matches any NaN); the sign of zero is. The f32 transcendental
//! functions are approximations in compiled code: on non-special results they must be within
//! their stated ulp bound of the interpreter instead, and bit for bit wherever either result
//! is NaN, infinite or zero. Also: signed zeros through `max`/`min`/`round`/relu, and empty and
//! signed-zero reductions.

use tessera_interp::SingleDevice;
use tessera_ir::{
    BinaryOp, DType, Data, Graph, Literal, NodeId, Op, ReduceKind, TensorType, UnaryOp,
};

const SPECIALS: [f64; 16] = [
    0.0,
    -0.0,
    1.401_298_464_324_817e-45, // f32 min subnormal
    -1.401_298_464_324_817e-45,
    1.175_494_350_822_287_5e-38, // f32::MIN_POSITIVE
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.5,
    -2.5,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    3.402_823_466_385_288_6e38, // f32::MAX
    -3.402_823_466_385_288_6e38,
];

/// A value list of `dtype`.
fn lit(dtype: DType, dims: &[usize], v: &[f64]) -> Literal {
    let data = match dtype {
        DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
        DType::F64 => Data::F64(v.to_vec()),
        other => panic!("float dtype expected, got {other:?}"),
    };
    Literal::new(dims.to_vec(), data).unwrap()
}

fn values(l: &Literal) -> Vec<f64> {
    match &l.data {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        other => panic!("float result expected, got {other:?}"),
    }
}

/// `(interpreter, compiled)` results of `g` on `inputs`.
fn both(g: &Graph, exe: &tessera_codegen::Executable, inputs: &[Literal]) -> (Vec<f64>, Vec<f64>) {
    let want = tessera_interp::run(g, inputs).unwrap();
    let refs: Vec<&Literal> = inputs.iter().collect();
    let got = exe.run(&refs, &SingleDevice).unwrap();
    (values(&want[0]), values(&got[0]))
}

fn graph(op: Op, dtype: DType, n: usize, arity: usize) -> Graph {
    let mut g = Graph::new("specials");
    let ps: Vec<NodeId> = (0..arity)
        .map(|_| g.add_param(TensorType::new(dtype, vec![n])))
        .collect();
    let y = g.add(op, &ps).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// The stated ulp bound of an f32 approximation (`approx.rs`), or `None` for the ops that are
/// exact or computed like the interpreter (bit for bit).
fn approximate(op: Op, dtype: DType) -> Option<f64> {
    if dtype != DType::F32 {
        return None;
    }
    match op {
        Op::Unary(u) => match u {
            // The looser of the FMA and no-FMA bounds (`tests/ulp.rs` checks each).
            UnaryOp::Log => Some(1.0),
            UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Erf => Some(1.5),
            UnaryOp::Log1p | UnaryOp::Expm1 => Some(2.0),
            UnaryOp::Logistic => Some(2.5),
            // 4e-6 relative.
            UnaryOp::ErfInv => Some(70.0),
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not => None,
            // libm's f64 function rounded once on both backends (`tessera-interp/src/elem.rs`).
            UnaryOp::Tan
            | UnaryOp::Asin
            | UnaryOp::Acos
            | UnaryOp::Atan
            | UnaryOp::Sinh
            | UnaryOp::Cosh
            | UnaryOp::Asinh
            | UnaryOp::Acosh
            | UnaryOp::Atanh
            | UnaryOp::Exp2 => None,
        },
        // tidy: allow-wildcard(a test table: only unary float functions have an ulp bound here)
        _ => None,
    }
}

fn f32_ulp(c: f32) -> f64 {
    let e = (c.to_bits() >> 23) & 0xff;
    2f64.powi(e.max(1) as i32 - 150)
}

/// Whether `got` matches `want` under `bound` (see the module doc).
fn agrees(want: f64, got: f64, bound: Option<f64>) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    let special = |v: f64| v == 0.0 || v.is_infinite();
    match bound {
        Some(b) if !special(want) && !special(got) => {
            (got - want).abs() <= b * f32_ulp(want as f32)
        }
        _ => want.to_bits() == got.to_bits(),
    }
}

fn check(
    op: Op,
    dtype: DType,
    inputs: &[Vec<f64>],
    want: &[f64],
    got: &[f64],
    bad: &mut Vec<String>,
) {
    let bound = approximate(op.clone(), dtype);
    for i in 0..want.len() {
        if !agrees(want[i], got[i], bound) {
            let args: Vec<String> = inputs.iter().map(|v| format!("{:e}", v[i])).collect();
            bad.push(format!(
                "{op:?} {dtype:?} n={} ({}): interpreter {:e} ({:#x}), compiled {:e} ({:#x})",
                want.len(),
                args.join(", "),
                want[i],
                want[i].to_bits(),
                got[i],
                got[i].to_bits()
            ));
        }
    }
}

/// Runs `op` on the argument columns `cols` in shape [1], element by element, and in shape
/// [37] chunks (the last chunk padded by repeating its first rows).
fn table(op: Op, dtype: DType, cols: &[Vec<f64>], bad: &mut Vec<String>) {
    let arity = cols.len();
    let g1 = graph(op.clone(), dtype, 1, arity);
    let e1 = tessera_codegen::compile(&g1).unwrap();
    for i in 0..cols[0].len() {
        let args: Vec<Vec<f64>> = cols.iter().map(|c| vec![c[i]]).collect();
        let lits: Vec<Literal> = args.iter().map(|a| lit(dtype, &[1], a)).collect();
        let (want, got) = both(&g1, &e1, &lits);
        check(op.clone(), dtype, &args, &want, &got, bad);
    }
    let g37 = graph(op.clone(), dtype, 37, arity);
    let e37 = tessera_codegen::compile(&g37).unwrap();
    for start in (0..cols[0].len()).step_by(37) {
        let args: Vec<Vec<f64>> = cols
            .iter()
            .map(|c| (0..37).map(|k| c[(start + k) % c.len()]).collect())
            .collect();
        let lits: Vec<Literal> = args.iter().map(|a| lit(dtype, &[37], a)).collect();
        let (want, got) = both(&g37, &e37, &lits);
        check(op.clone(), dtype, &args, &want, &got, bad);
    }
}

fn float_binary_ops() -> Vec<BinaryOp> {
    BinaryOp::ALL
        .into_iter()
        .filter(|b| {
            matches!(
                b,
                BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Mul
                    | BinaryOp::Div
                    | BinaryOp::Rem
                    | BinaryOp::Max
                    | BinaryOp::Min
                    | BinaryOp::Pow
                    | BinaryOp::Atan2
            )
        })
        .collect()
}

#[test]
fn unary_ops_agree_on_specials() {
    let mut bad = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        for u in UnaryOp::ALL {
            if u == UnaryOp::Not {
                continue;
            }
            table(Op::Unary(u), dtype, &[SPECIALS.to_vec()], &mut bad);
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn binary_ops_agree_on_all_pairs_of_specials() {
    let xs: Vec<f64> = SPECIALS.iter().flat_map(|&a| [a; 16]).collect();
    let ys: Vec<f64> = (0..16).flat_map(|_| SPECIALS).collect();
    let mut bad = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        for op in float_binary_ops() {
            table(Op::Binary(op), dtype, &[xs.clone(), ys.clone()], &mut bad);
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// JAX's choices, on both backends: max(-0, +0) = +0 and min = -0 in either order, relu
/// (max(x, 0)) of -0 is +0 and of NaN is NaN, round keeps the sign of zero.
#[test]
fn signed_zeros_and_nan_follow_jax() {
    let bits = |v: &[f64]| -> Vec<u64> { v.iter().map(|x| x.to_bits()).collect() };
    for dtype in [DType::F32, DType::F64] {
        for n in [1usize, 37] {
            let cases: [(Op, f64, f64, f64); 6] = [
                (Op::Binary(BinaryOp::Max), -0.0, 0.0, 0.0),
                (Op::Binary(BinaryOp::Max), 0.0, -0.0, 0.0),
                (Op::Binary(BinaryOp::Min), -0.0, 0.0, -0.0),
                (Op::Binary(BinaryOp::Min), 0.0, -0.0, -0.0),
                (Op::Binary(BinaryOp::Max), -0.0, 0.0, 0.0),
                (Op::Binary(BinaryOp::Max), f64::NAN, 0.0, f64::NAN),
            ];
            for (op, x, y, want) in cases {
                let g = graph(op.clone(), dtype, n, 2);
                let e = tessera_codegen::compile(&g).unwrap();
                let lits = [lit(dtype, &[n], &vec![x; n]), lit(dtype, &[n], &vec![y; n])];
                let (i, c) = both(&g, &e, &lits);
                let w = values(&lit(dtype, &[n], &vec![want; n]));
                if want.is_nan() {
                    assert!(i.iter().chain(&c).all(|v| v.is_nan()), "{op:?}({x}, {y})");
                } else {
                    assert_eq!(bits(&i), bits(&w), "interpreter {op:?}({x}, {y}) {dtype:?}");
                    assert_eq!(bits(&c), bits(&w), "compiled {op:?}({x}, {y}) {dtype:?}");
                }
            }
            let g = graph(Op::Unary(UnaryOp::Round), dtype, n, 1);
            let e = tessera_codegen::compile(&g).unwrap();
            for (x, want) in [
                (-0.4, -0.0),
                (-0.0, -0.0),
                (0.4, 0.0),
                (-0.5, -1.0),
                (2.5, 3.0),
            ] {
                let (i, c) = both(&g, &e, &[lit(dtype, &[n], &vec![x; n])]);
                let w = values(&lit(dtype, &[n], &vec![want; n]));
                assert_eq!(bits(&i), bits(&w), "interpreter round({x}) {dtype:?}");
                assert_eq!(bits(&c), bits(&w), "compiled round({x}) {dtype:?}");
            }
        }
    }
}

/// A reduction of `x` (shape `dims`) over `axes` on both backends, bit for bit, every NaN
/// one value (a NaN's sign and payload are not specified, as in XLA: x86's max makes its
/// negative default NaN).
fn reduce_both(
    kind: ReduceKind,
    dtype: DType,
    dims: &[usize],
    axes: &[usize],
    x: &[f64],
) -> Vec<u64> {
    let mut g = Graph::new("reduce");
    let p = g.add_param(TensorType::new(dtype, dims.to_vec()));
    let y = g
        .add(
            Op::Reduce {
                kind,
                axes: axes.to_vec(),
            },
            &[p],
        )
        .unwrap();
    g.set_outputs(vec![y]);
    let e = tessera_codegen::compile(&g).unwrap();
    let (i, c) = both(&g, &e, &[lit(dtype, dims, x)]);
    let bits = |v: &f64| if v.is_nan() { f64::NAN } else { *v }.to_bits();
    let (ib, cb): (Vec<u64>, Vec<u64>) =
        (i.iter().map(bits).collect(), c.iter().map(bits).collect());
    assert_eq!(ib, cb, "{kind:?} {dtype:?} {dims:?} over {axes:?} of {x:?}");
    ib
}

/// Empty sum +0, empty max -inf, empty min +inf; a sum of -0s is +0 (XLA starts from +0);
/// max/min of signed zeros order -0 below +0. Rank-0 results (the f32 sum accumulates in f64)
/// and rank-1 results (the vectorized accumulation) alike.
#[test]
fn reductions_of_empty_and_signed_zeros() {
    let b = |v: f64| v.to_bits();
    for dtype in [DType::F32, DType::F64] {
        assert_eq!(
            reduce_both(ReduceKind::Sum, dtype, &[0], &[0], &[]),
            vec![b(0.0)]
        );
        assert_eq!(
            reduce_both(ReduceKind::Max, dtype, &[0], &[0], &[]),
            vec![b(f64::NEG_INFINITY)]
        );
        assert_eq!(
            reduce_both(ReduceKind::Min, dtype, &[0], &[0], &[]),
            vec![b(f64::INFINITY)]
        );
        assert_eq!(
            reduce_both(ReduceKind::Sum, dtype, &[8, 0], &[1], &[]),
            vec![b(0.0); 8]
        );
        assert_eq!(
            reduce_both(ReduceKind::Sum, dtype, &[0, 8], &[0], &[]),
            vec![b(0.0); 8]
        );
        assert_eq!(
            reduce_both(ReduceKind::Sum, dtype, &[3], &[0], &[-0.0; 3]),
            vec![b(0.0)]
        );
        // Rows (-0, +0, -0, ...) and (+0, -0, +0, ...): each column has both zeros, in
        // both orders across columns.
        let zs: Vec<f64> = (0..16)
            .map(|i| if (i / 8 + i % 8) % 2 == 0 { -0.0 } else { 0.0 })
            .collect();
        assert_eq!(
            reduce_both(ReduceKind::Max, dtype, &[2, 8], &[0], &zs),
            vec![b(0.0); 8]
        );
        assert_eq!(
            reduce_both(ReduceKind::Min, dtype, &[2, 8], &[0], &zs),
            vec![b(-0.0); 8]
        );
        assert_eq!(
            reduce_both(ReduceKind::Max, dtype, &[16], &[0], &zs),
            vec![b(0.0)]
        );
        assert_eq!(
            reduce_both(ReduceKind::Min, dtype, &[16], &[0], &zs),
            vec![b(-0.0)]
        );
    }
}

/// Reductions over outer axes with a narrow result row (up to 32 wide: accumulated in
/// registers; 33: through the result) are the interpreter's bits for every kind, with NaN,
/// infinities and signed zeros among the values, over rows of every remainder width.
#[test]
fn narrow_rows_reduce_in_the_interpreters_order() {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        1e30,
        -1e30,
    ];
    for width in [1, 3, 4, 7, 8, 31, 32, 33] {
        for (dims, axes) in [(vec![5, width], vec![0]), (vec![2, 6, width], vec![1])] {
            let n: usize = dims.iter().product();
            let x: Vec<f64> = (0..n)
                .map(|i| {
                    if i % 11 == 3 {
                        specials[(i / 11) % specials.len()]
                    } else {
                        ((i * 7919) % 1000) as f64 / 37.0 - 13.0
                    }
                })
                .collect();
            for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
                reduce_both(kind, DType::F32, &dims, &axes, &x);
            }
        }
    }
}

/// A one-output layer's weight gradient `h^T g` (`[k, m]^T x [k, 1]`, compiled as a
/// reduction kernel: `fusion::column_product`) gives the interpreter's bits: the same sum over
/// the rows in order, with NaN, infinities, signed zeros and overflow among the values, at
/// result widths through the register limit (32), and a rank-1 vector; one past it, and a
/// product of 2^18 multiply-adds (which a GEMM runs on both cores), are GEMMs.
#[test]
fn column_products_sum_in_the_interpreters_order() {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        1e30,
        -1e30,
    ];
    let value = |i: usize, salt: usize| {
        if i % 13 == salt {
            specials[(i / 13) % specials.len()]
        } else {
            ((i * 7919 + salt * 31) % 1000) as f64 / 37.0 - 13.0
        }
    };
    for (m, k, rank1) in [
        (1, 5, false),
        (3, 9, false),
        (8, 256, false),
        (31, 7, true),
        (32, 256, false),
        (33, 40, false),
        (32, 8192, false),
    ] {
        let mut g = Graph::new("column");
        let h = g.add_param(TensorType::new(DType::F32, vec![k, m]));
        let vdims = if rank1 { vec![k] } else { vec![k, 1] };
        let v = g.add_param(TensorType::new(DType::F32, vdims.clone()));
        let dd = tessera_ir::DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![0],
            rhs_contract: vec![0],
        };
        let y = g.add(Op::DotGeneral(dd), &[h, v]).unwrap();
        g.set_outputs(vec![y]);
        let exe = tessera_codegen::compile(&g).unwrap();
        let kernel = exe.describe().contains("reduce Sum over");
        let small = m <= 32 && m * k < 64 * 64 * 64;
        assert_eq!(kernel, small, "m={m} k={k}: {}", exe.describe());
        let hv: Vec<f64> = (0..k * m).map(|i| value(i, 3)).collect();
        let vv: Vec<f64> = (0..k).map(|i| value(i, 5)).collect();
        let inputs = [lit(DType::F32, &[k, m], &hv), lit(DType::F32, &vdims, &vv)];
        let (want, got) = both(&g, &exe, &inputs);
        for (j, (w, o)) in want.iter().zip(&got).enumerate() {
            let same = (w.is_nan() && o.is_nan()) || w.to_bits() == o.to_bits();
            if small {
                assert!(
                    same,
                    "m={m} k={k}: element {j}: interpreter {w}, compiled {o}"
                );
            }
        }
    }
}

/// Dots that are not column products stay GEMMs or dot kernels, whatever the operands' ranks
/// (a vector times a vector, a vector times a matrix: a rank-1 lhs).
#[test]
fn rank_one_dots_are_not_column_products() {
    for (ldims, rdims) in [(vec![7], vec![7]), (vec![7], vec![7, 3])] {
        let mut g = Graph::new("dot");
        let l = g.add_param(TensorType::new(DType::F32, ldims.clone()));
        let r = g.add_param(TensorType::new(DType::F32, rdims.clone()));
        let dd = tessera_ir::DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![0],
            rhs_contract: vec![0],
        };
        let y = g.add(Op::DotGeneral(dd), &[l, r]).unwrap();
        g.set_outputs(vec![y]);
        let exe = tessera_codegen::compile(&g).unwrap();
        let n = |d: &[usize]| d.iter().product::<usize>();
        let lv: Vec<f64> = (0..n(&ldims)).map(|i| i as f64 * 0.5 - 1.0).collect();
        let rv: Vec<f64> = (0..n(&rdims)).map(|i| 2.0 - i as f64 * 0.25).collect();
        let inputs = [lit(DType::F32, &ldims, &lv), lit(DType::F32, &rdims, &rv)];
        let (want, got) = both(&g, &exe, &inputs);
        assert_eq!(want, got, "{ldims:?} x {rdims:?}");
    }
}

/// The domain edges of the libm-computed functions, compiled (f32 and f64, scalar and vector
/// code), against the values C99 Annex F fixes: `asin(+-1) = +-pi/2`, `acos(1) = +0`,
/// `acos(-1) = pi`, `acosh(1) = +0`, `atanh(+-1) = +-inf`, NaN just outside the domains,
/// `sinh`/`cosh`/`exp2` overflowing to inf and `exp2` reaching the smallest subnormal, `tan`
/// of a huge argument finite, `atan(+-inf) = +-pi/2`, `atan2`'s quadrants and signed zeros.
#[test]
fn libm_functions_at_their_domain_edges() {
    use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, PI};
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let unary: &[(UnaryOp, f64, f64)] = &[
        (UnaryOp::Asin, 1.0, FRAC_PI_2),
        (UnaryOp::Asin, -1.0, -FRAC_PI_2),
        (UnaryOp::Asin, 1.5, nan),
        (UnaryOp::Asin, -0.0, -0.0),
        (UnaryOp::Acos, 1.0, 0.0),
        (UnaryOp::Acos, -1.0, PI),
        (UnaryOp::Acos, -1.5, nan),
        (UnaryOp::Acosh, 1.0, 0.0),
        (UnaryOp::Acosh, 0.5, nan),
        (UnaryOp::Acosh, inf, inf),
        (UnaryOp::Atanh, 1.0, inf),
        (UnaryOp::Atanh, -1.0, -inf),
        (UnaryOp::Atanh, 2.0, nan),
        (UnaryOp::Atanh, -0.0, -0.0),
        (UnaryOp::Atan, inf, FRAC_PI_2),
        (UnaryOp::Atan, -inf, -FRAC_PI_2),
        (UnaryOp::Atan, 1.0, FRAC_PI_4),
        (UnaryOp::Sinh, 1000.0, inf),
        (UnaryOp::Sinh, -1000.0, -inf),
        (UnaryOp::Sinh, -0.0, -0.0),
        (UnaryOp::Cosh, -1000.0, inf),
        (UnaryOp::Cosh, 0.0, 1.0),
        (UnaryOp::Asinh, -inf, -inf),
        (UnaryOp::Asinh, -0.0, -0.0),
        (UnaryOp::Exp2, 2000.0, inf),
        (UnaryOp::Exp2, -inf, 0.0),
        (UnaryOp::Exp2, 10.0, 1024.0),
        (UnaryOp::Tan, -0.0, -0.0),
        (UnaryOp::Tan, inf, nan),
    ];
    let mut bad = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        let round = |v: f64| {
            if dtype == DType::F32 {
                v as f32 as f64
            } else {
                v
            }
        };
        for &(u, x, want) in unary {
            for n in [1, 37] {
                let g = graph(Op::Unary(u), dtype, n, 1);
                let exe = tessera_codegen::compile(&g).unwrap();
                let (_, got) = both(&g, &exe, &[lit(dtype, &[n], &vec![x; n])]);
                let want = round(want);
                if got.iter().any(|&v| !agrees(want, v, None)) {
                    bad.push(format!(
                        "{u:?} {dtype:?} n={n} ({x:e}): {:e}, want {want:e}",
                        got[0]
                    ));
                }
            }
        }
        // tan of a huge argument: finite, and the correctly reduced value (libm's reduction).
        let g = graph(Op::Unary(UnaryOp::Tan), dtype, 1, 1);
        let exe = tessera_codegen::compile(&g).unwrap();
        let (_, got) = both(&g, &exe, &[lit(dtype, &[1], &[1e30])]);
        if !got[0].is_finite() {
            bad.push(format!("tan {dtype:?} (1e30): {:e}", got[0]));
        }
        let atan2: &[(f64, f64, f64)] = &[
            (0.0, -1.0, PI),
            (-0.0, -1.0, -PI),
            (0.0, 1.0, 0.0),
            (-0.0, 1.0, -0.0),
            (1.0, 0.0, FRAC_PI_2),
            (-1.0, -0.0, -FRAC_PI_2),
            (inf, inf, FRAC_PI_4),
            (-1.0, -1.0, -3.0 * FRAC_PI_4),
            (nan, 1.0, nan),
        ];
        for n in [1, 37] {
            let g = graph(Op::Binary(BinaryOp::Atan2), dtype, n, 2);
            let exe = tessera_codegen::compile(&g).unwrap();
            for &(x, y, want) in atan2 {
                let lits = [lit(dtype, &[n], &vec![x; n]), lit(dtype, &[n], &vec![y; n])];
                let (_, got) = both(&g, &exe, &lits);
                if got.iter().any(|&v| !agrees(round(want), v, None)) {
                    bad.push(format!(
                        "atan2 {dtype:?} n={n} ({x:e}, {y:e}): {:e}",
                        got[0]
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
