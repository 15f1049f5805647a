//! Table test: every sample of the op corpus (every op and accepted dtype) through the
//! interpreter, against a naive reference written here in another style: values widened to
//! f64/i64, layout ops as scatters from the operand rather than gathers into the result, and
//! transcendental functions from f64 math (erf_inv by bisection).

use tessera_interp::run;
use tessera_ir::corpus::{Lcg, covered_op_names, op_samples, random_inputs};
use tessera_ir::{
    ALL_OP_NAMES, BinaryOp, CollectiveOp, CompareOp, CumulativeKind, DType, Data, Graph, Literal,
    Op, REGION_OP_NAMES, ReduceKind, TensorType, UnaryOp, bf16, f16,
};

/// One element, widened.
#[derive(Clone, Copy, Debug, PartialEq)]
enum V {
    F(f64),
    I(i64),
    B(bool),
}

impl V {
    fn f(self) -> f64 {
        match self {
            V::F(x) => x,
            V::I(x) => x as f64,
            V::B(b) => b as u8 as f64,
        }
    }
    fn i(self) -> i64 {
        match self {
            V::I(x) => x,
            V::F(x) => x as i64,
            V::B(b) => b as i64,
        }
    }
}

fn to_vs(l: &Literal) -> Vec<V> {
    match &l.data {
        Data::F32(v) => v.iter().map(|&x| V::F(x as f64)).collect(),
        Data::F64(v) => v.iter().map(|&x| V::F(x)).collect(),
        Data::I32(v) => v.iter().map(|&x| V::I(x as i64)).collect(),
        Data::U32(v) => v.iter().map(|&x| V::I(x as i64)).collect(),
        Data::Bool(v) => v.iter().map(|&x| V::B(x)).collect(),
        Data::I64(v) => v.iter().map(|&x| V::I(x)).collect(),
        Data::F16(v) => v.iter().map(|&x| V::F(x.to_f64())).collect(),
        Data::BF16(v) => v.iter().map(|&x| V::F(x.to_f64())).collect(),
    }
}

/// Rounds or wraps a widened value into `d`, the way the result type stores it.
fn narrow(d: DType, x: V) -> V {
    match (d, x) {
        (DType::F32, v) => V::F(v.f() as f32 as f64),
        (DType::F64, v) => V::F(v.f()),
        (DType::I32, V::I(x)) => V::I(x as i32 as i64),
        (DType::U32, V::I(x)) => V::I(x as u32 as i64),
        (DType::I32, V::F(x)) => V::I(x as i32 as i64),
        (DType::U32, V::F(x)) => V::I(x as u32 as i64),
        (DType::I32 | DType::U32 | DType::I64, V::B(b)) => V::I(b as i64),
        (DType::I64, V::I(x)) => V::I(x),
        (DType::I64, V::F(x)) => V::I(x as i64),
        // Rounded once from the f64 value (the interpreter rounds its f32 result: within the
        // narrow type's tolerance in `close`).
        (DType::F16, v) => V::F(f16::from_f64(v.f()).to_f64()),
        (DType::BF16, v) => V::F(bf16::from_f64(v.f()).to_f64()),
        (DType::Bool, v) => V::B(v.f() != 0.0),
    }
}

/// Every multi-index of `dims`, row-major.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out
            .into_iter()
            .flat_map(|p| (0..d).map(move |i| [p.clone(), vec![i]].concat()))
            .collect();
    }
    out
}

fn flat(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (i, d)| acc * d + i)
}

fn erf_inv_bisect(y: f64) -> f64 {
    let (mut lo, mut hi) = (-6.0f64, 6.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if libm::erf(mid) < y {
            lo = mid
        } else {
            hi = mid
        }
    }
    0.5 * (lo + hi)
}

fn unary(u: UnaryOp, d: DType, x: V) -> V {
    if d.is_float() {
        let x = x.f();
        return V::F(match u {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Log1p => (1.0 + x).ln(),
            UnaryOp::Expm1 => x.exp() - 1.0,
            UnaryOp::Tanh => (x.exp() - (-x).exp()) / (x.exp() + (-x).exp()),
            UnaryOp::Logistic => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.signum() * (x.abs() + 0.5).floor(),
            UnaryOp::Erf => libm::erf(x),
            UnaryOp::ErfInv => erf_inv_bisect(x),
            UnaryOp::Not => unreachable!("not on floats"),
            UnaryOp::Tan => x.sin() / x.cos(),
            UnaryOp::Asin => (x / (1.0 - x * x).sqrt()).atan(),
            UnaryOp::Acos => std::f64::consts::FRAC_PI_2 - (x / (1.0 - x * x).sqrt()).atan(),
            UnaryOp::Atan => (x / (1.0 + x * x).sqrt()).asin(),
            UnaryOp::Sinh => (x.exp() - (-x).exp()) / 2.0,
            UnaryOp::Cosh => (x.exp() + (-x).exp()) / 2.0,
            UnaryOp::Asinh => x.signum() * (x.abs() + (x * x + 1.0).sqrt()).ln(),
            UnaryOp::Acosh => (x + (x * x - 1.0).sqrt()).ln(),
            UnaryOp::Atanh => 0.5 * ((1.0 + x) / (1.0 - x)).ln(),
            UnaryOp::Exp2 => (x * std::f64::consts::LN_2).exp(),
        });
    }
    if d == DType::Bool {
        let V::B(b) = x else { unreachable!() };
        return V::B(!b);
    }
    let x = x.i();
    V::I(match u {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => {
            if d == DType::U32 {
                x
            } else {
                x.wrapping_abs()
            }
        }
        UnaryOp::Sign => x.signum(),
        UnaryOp::Not => !x,
        // tidy: allow-wildcard(the naive reference: the type rule admits no other op on integers)
        _ => unreachable!("float op on integers"),
    })
}

fn binary(b: BinaryOp, d: DType, x: V, y: V) -> V {
    if d.is_float() {
        let (x, y) = (x.f(), y.f());
        return V::F(match b {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Rem => x - (x / y).trunc() * y,
            BinaryOp::Max => {
                if x >= y {
                    x
                } else {
                    y
                }
            }
            BinaryOp::Min => {
                if x <= y {
                    x
                } else {
                    y
                }
            }
            BinaryOp::Pow => x.powf(y),
            // The angle of (y, x): atan(x / y), shifted by pi in the left half-plane.
            BinaryOp::Atan2 => {
                let a = (x / y).atan();
                if y < 0.0 {
                    a + std::f64::consts::PI.copysign(x)
                } else {
                    a
                }
            }
            // tidy: allow-wildcard(the naive reference: the type rule admits no other op for this dtype)
            _ => unreachable!(),
        });
    }
    if d == DType::Bool {
        let (V::B(x), V::B(y)) = (x, y) else {
            unreachable!()
        };
        return V::B(match b {
            BinaryOp::And => x && y,
            BinaryOp::Or => x || y,
            BinaryOp::Xor => x != y,
            // tidy: allow-wildcard(the naive reference: the type rule admits no other op for this dtype)
            _ => unreachable!(),
        });
    }
    let (x, y) = (x.i(), y.i());
    // i32 and u32 values are exact in i64 and wrap when narrowed; i64 wraps here.
    let width = d.bit_width() as u64;
    let mask = if width == 64 {
        u64::MAX
    } else {
        (1 << width) - 1
    };
    let bits = |v: i64| v as u64 & mask;
    V::I(match b {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div => {
            if y == 0 {
                -1
            } else {
                x.wrapping_div(y)
            }
        }
        BinaryOp::Rem => {
            if y == 0 {
                x
            } else {
                x.wrapping_rem(y)
            }
        }
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::And => (bits(x) & bits(y)) as i64,
        BinaryOp::Or => (bits(x) | bits(y)) as i64,
        BinaryOp::Xor => (bits(x) ^ bits(y)) as i64,
        BinaryOp::ShiftLeft => {
            if bits(y) >= width {
                0
            } else {
                ((bits(x) << bits(y)) & mask) as i64
            }
        }
        BinaryOp::ShiftRightLogical => {
            if bits(y) >= width {
                0
            } else {
                (bits(x) >> bits(y)) as i64
            }
        }
        BinaryOp::Pow | BinaryOp::Atan2 => unreachable!(),
    })
}

fn compare(c: CompareOp, x: V, y: V) -> bool {
    if let (V::I(x), V::I(y)) = (x, y) {
        return match c {
            CompareOp::Eq => x == y,
            CompareOp::Ne => x != y,
            CompareOp::Lt => x < y,
            CompareOp::Le => x <= y,
            CompareOp::Gt => x > y,
            CompareOp::Ge => x >= y,
        };
    }
    let (x, y) = (x.f(), y.f());
    match c {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    }
}

/// The reference result of a one-op sample graph, as widened values.
fn reference(g: &Graph, inputs: &[Literal]) -> Vec<V> {
    let out = g.outputs()[0];
    let op = g.op(out).clone();
    let ty = g.ty(out).clone();
    let args: Vec<Vec<V>> = inputs.iter().map(to_vs).collect();
    let in_ty = |i: usize| &inputs[i].ty;
    let n = ty.numel();
    let r: Vec<V> = match &op {
        Op::Parameter(_) => unreachable!(),
        Op::Constant(l) => to_vs(l),
        Op::Iota { dim, .. } => indices(ty.dims())
            .iter()
            .map(|ix| V::I(ix[*dim] as i64))
            .collect(),
        Op::Unary(u) => args[0].iter().map(|&x| unary(*u, ty.dtype, x)).collect(),
        Op::Binary(b) => args[0]
            .iter()
            .zip(&args[1])
            .map(|(&x, &y)| binary(*b, ty.dtype, x, y))
            .collect(),
        Op::Compare(c) => args[0]
            .iter()
            .zip(&args[1])
            .map(|(&x, &y)| V::B(compare(*c, x, y)))
            .collect(),
        Op::Select => (0..n)
            .map(|i| {
                if args[0][i] == V::B(true) {
                    args[1][i]
                } else {
                    args[2][i]
                }
            })
            .collect(),
        Op::Convert(_) => args[0]
            .iter()
            .map(|&x| match (in_ty(0).dtype, ty.dtype, x) {
                (_, DType::I32 | DType::U32 | DType::I64, V::F(f)) if f.is_nan() => V::I(0),
                (_, DType::I64, V::F(f)) if f >= 9.223_372_036_854_776e18 => V::I(i64::MAX),
                (_, DType::I64, V::F(f)) if f < -9.223_372_036_854_776e18 => V::I(i64::MIN),
                (_, DType::I64, V::F(f)) => V::I(f.trunc() as i64),
                // Integers reach a narrow float through f32.
                (_, DType::F16 | DType::BF16, V::I(i)) => V::F(i as f32 as f64),
                (_, DType::I32, V::F(f)) => {
                    V::I(f.trunc().clamp(i32::MIN as f64, i32::MAX as f64) as i64)
                }
                (_, DType::U32, V::F(f)) => V::I(f.trunc().clamp(0.0, u32::MAX as f64) as i64),
                (_, DType::I32, V::I(i)) => V::I(i as i32 as i64),
                (_, DType::U32, V::I(i)) => V::I(i as u32 as i64),
                _ => x,
            })
            .collect(),
        Op::Bitcast(to) => {
            let bits: Vec<u64> = match &inputs[0].data {
                Data::F32(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
                Data::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
                Data::U32(v) => v.iter().map(|&x| x as u64).collect(),
                Data::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
                Data::I64(v) => v.iter().map(|&x| x as u64).collect(),
                Data::F16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
                Data::BF16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
                Data::Bool(_) => unreachable!(),
            };
            bits.iter()
                .map(|&b| match to {
                    DType::F32 => V::F(f32::from_bits(b as u32) as f64),
                    DType::F64 => V::F(f64::from_bits(b)),
                    DType::I32 => V::I(b as u32 as i32 as i64),
                    DType::U32 => V::I(b as i64),
                    DType::I64 => V::I(b as i64),
                    DType::F16 => V::F(f16::from_bits(b as u16).to_f64()),
                    DType::BF16 => V::F(bf16::from_bits(b as u16).to_f64()),
                    DType::Bool => unreachable!(),
                })
                .collect()
        }
        Op::BroadcastInDim { dims, .. } => {
            // Scatter: each operand element fills every result index that projects onto it.
            let mut out = vec![V::B(false); n];
            for ix in indices(ty.dims()) {
                let src: Vec<usize> = dims
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if in_ty(0).dims()[i] == 1 { 0 } else { ix[d] })
                    .collect();
                out[flat(&ix, ty.dims())] = args[0][flat(&src, in_ty(0).dims())];
            }
            out
        }
        // stop_gradient is the identity on values (its derivative is zero).
        Op::Reshape(_) | Op::ShardingConstraint(_) | Op::StopGradient => args[0].clone(),
        Op::Region(_) | Op::GetResult { .. } => {
            unreachable!("region ops have no corpus sample (tessera-codegen/tests/regions.rs)")
        }
        Op::Gather(d) => gather_reference(d, &args[0], in_ty(0), &args[1], in_ty(1), &ty),
        Op::Scatter(d) => scatter_reference(d, &args, in_ty(0), in_ty(1), in_ty(2)),
        Op::Collective(CollectiveOp::AllReduce { .. })
        | Op::Collective(CollectiveOp::AllGather { .. })
        | Op::Collective(CollectiveOp::ReduceScatter { .. })
        | Op::Collective(CollectiveOp::AllToAll { .. }) => args[0].clone(),
        Op::Collective(CollectiveOp::CollectivePermute { pairs, .. }) => {
            if pairs.is_empty() {
                vec![V::F(0.0); n]
            } else {
                args[0].clone()
            }
        }
        Op::Collective(CollectiveOp::AxisIndex { .. }) => vec![V::I(0)],
        Op::Transpose(perm) => {
            let mut out = vec![V::B(false); n];
            for ix in indices(in_ty(0).dims()) {
                let dst: Vec<usize> = perm.iter().map(|&p| ix[p]).collect();
                out[flat(&dst, ty.dims())] = args[0][flat(&ix, in_ty(0).dims())];
            }
            out
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let mut out = Vec::new();
            for ix in indices(in_ty(0).dims()) {
                let keep = (0..ix.len()).all(|d| {
                    ix[d] >= start[d] && ix[d] < limit[d] && (ix[d] - start[d]) % stride[d] == 0
                });
                if keep {
                    out.push(args[0][flat(&ix, in_ty(0).dims())]);
                }
            }
            out
        }
        Op::Concatenate { dim } => {
            let mut out = vec![V::B(false); n];
            let mut offset = 0;
            for (k, a) in args.iter().enumerate() {
                for ix in indices(in_ty(k).dims()) {
                    let mut dst = ix.clone();
                    dst[*dim] += offset;
                    out[flat(&dst, ty.dims())] = a[flat(&ix, in_ty(k).dims())];
                }
                offset += in_ty(k).dims()[*dim];
            }
            out
        }
        Op::Pad { low, interior, .. } => {
            let mut out = vec![args[1][0]; n];
            for ix in indices(in_ty(0).dims()) {
                let dst: Vec<i64> = (0..ix.len())
                    .map(|d| low[d] + ix[d] as i64 * (interior[d] as i64 + 1))
                    .collect();
                if dst
                    .iter()
                    .zip(ty.dims())
                    .all(|(&p, &s)| p >= 0 && (p as usize) < s)
                {
                    let dst: Vec<usize> = dst.iter().map(|&p| p as usize).collect();
                    out[flat(&dst, ty.dims())] = args[0][flat(&ix, in_ty(0).dims())];
                }
            }
            out
        }
        Op::Reduce { kind, axes } => {
            let mut acc: Vec<Option<V>> = vec![None; n];
            for ix in indices(in_ty(0).dims()) {
                let kept: Vec<usize> = (0..ix.len())
                    .filter(|d| !axes.contains(d))
                    .map(|d| ix[d])
                    .collect();
                let t = flat(&kept, ty.dims());
                let x = args[0][flat(&ix, in_ty(0).dims())];
                acc[t] = Some(match (acc[t], kind) {
                    (None, _) => x,
                    (Some(a), ReduceKind::Sum) => {
                        if ty.dtype.is_float() {
                            V::F(a.f() + x.f())
                        } else {
                            V::I(a.i().wrapping_add(x.i()))
                        }
                    }
                    (Some(a), ReduceKind::Max) => {
                        if x.f() > a.f() {
                            x
                        } else {
                            a
                        }
                    }
                    (Some(a), ReduceKind::Min) => {
                        if x.f() < a.f() {
                            x
                        } else {
                            a
                        }
                    }
                });
            }
            acc.into_iter()
                .map(|a| a.expect("no empty reductions in the corpus"))
                .collect()
        }
        Op::ArgMax { axis } => indices(ty.dims())
            .iter()
            .map(|ix| {
                let vals: Vec<f64> = (0..in_ty(0).dims()[*axis])
                    .map(|k| {
                        let mut full = ix.clone();
                        full.insert(*axis, k);
                        args[0][flat(&full, in_ty(0).dims())].f()
                    })
                    .collect();
                let m = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                V::I(vals.iter().position(|&v| v == m).unwrap_or(0) as i64)
            })
            .collect(),
        Op::DotGeneral(dd) => {
            let (l, r) = (in_ty(0), in_ty(1));
            let mut acc = vec![0.0f64; n];
            let mut iacc = vec![0i64; n];
            // Every (lhs element, rhs element) pair that agrees on batch and contracting
            // indices adds its product to the result element its free indices name.
            for li in indices(l.dims()) {
                for ri in indices(r.dims()) {
                    let agree = dd
                        .lhs_batch
                        .iter()
                        .zip(&dd.rhs_batch)
                        .chain(dd.lhs_contract.iter().zip(&dd.rhs_contract))
                        .all(|(&a, &b)| li[a] == ri[b]);
                    if !agree {
                        continue;
                    }
                    let mut o: Vec<usize> = dd.lhs_batch.iter().map(|&a| li[a]).collect();
                    o.extend(dd.lhs_free(l.rank()).iter().map(|&a| li[a]));
                    o.extend(dd.rhs_free(r.rank()).iter().map(|&b| ri[b]));
                    let t = flat(&o, ty.dims());
                    let (x, y) = (args[0][flat(&li, l.dims())], args[1][flat(&ri, r.dims())]);
                    acc[t] += x.f() * y.f();
                    iacc[t] = iacc[t].wrapping_add(x.i().wrapping_mul(y.i()));
                }
            }
            if ty.dtype.is_float() {
                acc.into_iter().map(V::F).collect()
            } else {
                iacc.into_iter().map(V::I).collect()
            }
        }
        Op::Conv(cd) => conv_reference(cd, in_ty(0), in_ty(1), &args[0], &args[1], &ty),
        Op::ReduceWindow { kind, win } => {
            let x = in_ty(0);
            let window = |o: &[usize]| -> Vec<Vec<usize>> {
                indices(&win.window)
                    .iter()
                    .map(|k| {
                        (0..o.len())
                            .map(|d| o[d] * win.strides[d] + k[d] * win.window_dilation[d])
                            .collect()
                    })
                    .collect()
            };
            if x.dtype.is_float() {
                let init = match kind {
                    ReduceKind::Sum => 0.0,
                    ReduceKind::Max => f64::NEG_INFINITY,
                    ReduceKind::Min => f64::INFINITY,
                };
                let vals: Vec<f64> = args[0].iter().map(|v| v.f()).collect();
                let (p, pd) = dilate_pad(&vals, x.dims(), &win.base_dilation, &win.padding, init);
                indices(ty.dims())
                    .iter()
                    .map(|o| {
                        V::F(window(o).iter().fold(init, |acc, q| {
                            let v = p[flat(q, &pd)];
                            match kind {
                                ReduceKind::Sum => acc + v,
                                ReduceKind::Max => acc.max(v),
                                ReduceKind::Min => acc.min(v),
                            }
                        }))
                    })
                    .collect()
            } else {
                // Integers exactly, from the type's lowest (highest) value for max (min).
                let (lo, hi) = match x.dtype {
                    DType::U32 => (0, u32::MAX as i64),
                    DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                    _ => (i64::MIN, i64::MAX),
                };
                let init = match kind {
                    ReduceKind::Sum => 0,
                    ReduceKind::Max => lo,
                    ReduceKind::Min => hi,
                };
                let vals: Vec<i64> = args[0].iter().map(|v| v.i()).collect();
                let (p, pd) = dilate_pad(&vals, x.dims(), &win.base_dilation, &win.padding, init);
                indices(ty.dims())
                    .iter()
                    .map(|o| {
                        V::I(window(o).iter().fold(init, |acc, q| {
                            let v = p[flat(q, &pd)];
                            match kind {
                                ReduceKind::Sum => acc.wrapping_add(v),
                                ReduceKind::Max => acc.max(v),
                                ReduceKind::Min => acc.min(v),
                            }
                        }))
                    })
                    .collect()
            }
        }
        Op::Sort {
            dim,
            num_keys,
            output,
        } => {
            // The stable rank of each element: the elements of its lane with a smaller key, or
            // an equal key and a smaller position (no NaN or -0 in the corpus's inputs).
            let dims = in_ty(0).dims();
            // Integers compare exactly (an i64 past 2^53 is not exact as f64).
            let key = |ix: &[usize]| -> Vec<Result<i64, f64>> {
                (0..*num_keys)
                    .map(|k| match args[k][flat(ix, dims)] {
                        V::I(i) => Ok(i),
                        v => Err(v.f()),
                    })
                    .collect()
            };
            let mut out = vec![V::I(0); n];
            for ix in indices(dims) {
                let kx = key(&ix);
                let mut rank = 0;
                for j in 0..dims[*dim] {
                    let mut jx = ix.clone();
                    jx[*dim] = j;
                    let kj = key(&jx);
                    let before = kj.partial_cmp(&kx) == Some(std::cmp::Ordering::Less);
                    if before || (kj == kx && j < ix[*dim]) {
                        rank += 1;
                    }
                }
                let mut dst = ix.clone();
                dst[*dim] = rank;
                out[flat(&dst, dims)] = args[*output][flat(&ix, dims)];
            }
            out
        }
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => indices(ty.dims())
            .iter()
            .map(|ix| {
                // Every element of the lane up to this one (from the end when reversed).
                let len = ty.dims()[*axis];
                let range: Vec<usize> = if *reverse {
                    (ix[*axis]..len).collect()
                } else {
                    (0..=ix[*axis]).collect()
                };
                let vals: Vec<V> = range
                    .into_iter()
                    .map(|k| {
                        let mut full = ix.clone();
                        full[*axis] = k;
                        args[0][flat(&full, ty.dims())]
                    })
                    .collect();
                let float = ty.dtype.is_float();
                match kind {
                    CumulativeKind::Sum if float => V::F(vals.iter().map(|v| v.f()).sum()),
                    CumulativeKind::Sum => {
                        V::I(vals.iter().fold(0i64, |a, v| a.wrapping_add(v.i())))
                    }
                    CumulativeKind::Prod if float => V::F(vals.iter().map(|v| v.f()).product()),
                    CumulativeKind::Prod => {
                        V::I(vals.iter().fold(1i64, |a, v| a.wrapping_mul(v.i())))
                    }
                    CumulativeKind::Max => *vals
                        .iter()
                        .max_by(|a, b| a.f().total_cmp(&b.f()))
                        .expect("a lane holds this element"),
                    CumulativeKind::Min => *vals
                        .iter()
                        .min_by(|a, b| a.f().total_cmp(&b.f()))
                        .expect("a lane holds this element"),
                }
            })
            .collect(),
        Op::Rev { dims: rdims } => indices(ty.dims())
            .iter()
            .map(|ix| {
                let mut src = ix.clone();
                for &d in rdims {
                    src[d] = ty.dims()[d] - 1 - ix[d];
                }
                args[0][flat(&src, ty.dims())]
            })
            .collect(),
    };
    r.into_iter().map(|v| narrow(ty.dtype, v)).collect()
}

/// The operand scattered into a dilated, padded copy (negative padding crops): element `i`
/// lands at `i * dilation + lo`.
fn dilate_pad<T: Copy>(
    v: &[T],
    dims: &[usize],
    dil: &[usize],
    pad: &[(i64, i64)],
    fill: T,
) -> (Vec<T>, Vec<usize>) {
    let pd: Vec<usize> = (0..dims.len())
        .map(|d| {
            let n = if dims[d] == 0 {
                0
            } else {
                (dims[d] - 1) * dil[d] + 1
            } as i64;
            (n + pad[d].0 + pad[d].1).max(0) as usize
        })
        .collect();
    let mut out = vec![fill; pd.iter().product()];
    for ix in indices(dims) {
        let q: Vec<i64> = (0..dims.len())
            .map(|d| ix[d] as i64 * dil[d] as i64 + pad[d].0)
            .collect();
        if q.iter().zip(&pd).all(|(&a, &n)| a >= 0 && (a as usize) < n) {
            let q: Vec<usize> = q.iter().map(|&a| a as usize).collect();
            out[flat(&q, &pd)] = v[flat(&ix, dims)];
        }
    }
    (out, pd)
}

/// A conv written as XLA documents it: the lhs moved to canonical `[N, C, spatial]` order,
/// dilated and padded; then every result element `[b, o, p]` sums
/// `lhs[group batch, group channel, p * stride + k * rhs_dilation] * rhs[o, i, k]`.
fn conv_reference(
    cd: &tessera_ir::ConvDims,
    lt: &TensorType,
    rt: &TensorType,
    l: &[V],
    r: &[V],
    ty: &TensorType,
) -> Vec<V> {
    let s = cd.spatial();
    let canon = |t: &TensorType, spec: &[usize], v: &[V]| -> (Vec<f64>, Vec<usize>) {
        let cd: Vec<usize> = spec.iter().map(|&d| t.dims()[d]).collect();
        let mut out = vec![0.0; v.len()];
        for ix in indices(t.dims()) {
            let c: Vec<usize> = spec.iter().map(|&d| ix[d]).collect();
            out[flat(&c, &cd)] = v[flat(&ix, t.dims())].f();
        }
        (out, cd)
    };
    let (lc, ldims) = canon(lt, &cd.lhs_spec, l);
    let (rc, rdims) = canon(rt, &cd.rhs_spec, r);
    let mut dil = vec![1, 1];
    dil.extend(&cd.lhs_dilation);
    let mut pad = vec![(0, 0), (0, 0)];
    pad.extend(&cd.padding);
    let (p, pd) = dilate_pad(&lc, &ldims, &dil, &pad, 0.0);
    let (fg, bg) = (cd.feature_group_count, cd.batch_group_count);
    let (o_feat, cin) = (rdims[0], rdims[1]);
    let nb = ldims[0] / bg;
    let mut odims = vec![ty.dims()[cd.out_spec[0]], ty.dims()[cd.out_spec[1]]];
    odims.extend((0..s).map(|j| ty.dims()[cd.out_spec[2 + j]]));
    let mut canon_out = vec![0.0; ty.numel()];
    for o in indices(&odims) {
        let (b, f) = (o[0], o[1]);
        let ch0 = f / (o_feat / fg) * cin;
        let lb = f / (o_feat / bg) * nb + b;
        let mut acc = 0.0;
        for i in 0..cin {
            for k in indices(&rdims[2..]) {
                let mut q = vec![lb, ch0 + i];
                q.extend((0..s).map(|j| o[2 + j] * cd.strides[j] + k[j] * cd.rhs_dilation[j]));
                let mut ri = vec![f, i];
                if cd.window_reversal {
                    ri.extend(k.iter().zip(&rdims[2..]).map(|(&a, &n)| n - 1 - a));
                } else {
                    ri.extend(&k);
                }
                acc += p[flat(&q, &pd)] * rc[flat(&ri, &rdims)];
            }
        }
        canon_out[flat(&o, &odims)] = acc;
    }
    let mut out = vec![V::F(0.0); ty.numel()];
    for ix in indices(ty.dims()) {
        let c: Vec<usize> = cd.out_spec.iter().map(|&d| ix[d]).collect();
        out[flat(&ix, ty.dims())] = V::F(canon_out[flat(&c, &odims)]);
    }
    out
}

fn close(d: DType, got: V, want: V) -> bool {
    match (got, want) {
        (V::F(a), V::F(b)) => {
            if a.is_nan() || b.is_nan() {
                return a.is_nan() && b.is_nan();
            }
            if a == b {
                return true;
            }
            // f16 and bf16: a result may differ by one of their ulps (2^-10, 2^-7) from the
            // once-rounded reference, as the op computes in f32 and rounds again.
            let tol = match d {
                DType::F32 => 1e-5,
                DType::F16 => 2e-3,
                DType::BF16 => 1.6e-2,
                _ => 1e-12,
            };
            (a - b).abs() <= tol * b.abs().max(1.0)
        }
        (a, b) => a == b,
    }
}

#[test]
fn every_op_and_dtype_matches_the_reference() {
    let samples = op_samples();
    let covered = covered_op_names(&samples);
    // The region ops own bodies and have no one-op sample; `tessera-codegen/tests/regions.rs`
    // runs each of them interpreted against compiled, and `tessera-ir/tests/regions.rs` checks
    // their text and type rules.
    assert!(
        ALL_OP_NAMES
            .iter()
            .all(|n| covered.contains(n) || REGION_OP_NAMES.contains(n)),
        "the corpus misses an op"
    );
    let mut rng = Lcg(42);
    let mut failures = Vec::new();
    for s in &samples {
        let out = s.graph.outputs()[0];
        let inputs = random_inputs(s, &mut rng);
        let got = match run(&s.graph, &inputs) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{}: {e}", s.name));
                continue;
            }
        };
        let got = to_vs(&got[0]);
        let want = reference(&s.graph, &inputs);
        let dtype = s.graph.ty(out).dtype;
        if got.len() != want.len() {
            failures.push(format!(
                "{}: {} values, reference has {}",
                s.name,
                got.len(),
                want.len()
            ));
            continue;
        }
        if let Some(i) = (0..got.len()).find(|&i| !close(dtype, got[i], want[i])) {
            failures.push(format!(
                "{}: element {i}: got {:?}, reference {:?} (inputs {:?})",
                s.name,
                got[i],
                want[i],
                inputs
                    .iter()
                    .map(|l| to_vs(l).get(i).copied())
                    .collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn inputs_are_checked() {
    let g = &op_samples()[0].graph;
    assert!(run(g, &[]).is_err());
    let wrong = Literal::zeros(&TensorType::new(DType::F64, vec![3, 5]));
    let err = run(g, &[wrong]).unwrap_err();
    assert!(err.to_string().contains("input 0"), "{err}");
}

#[test]
fn collectives_over_real_groups_need_the_runtime() {
    let g = tessera_ir::parse("mesh @m = <\"x\"=2>\nfunc @f(%0: f32[2]) {\n  %1 = all_reduce %0 sum axes=[\"x\"] : f32[2]\n  return %1\n}\n").unwrap();
    let err = run(&g, &[Literal::zeros(&TensorType::new(DType::F32, vec![2]))]).unwrap_err();
    assert!(err.to_string().contains("sharded runtime"), "{err}");
}

/// For each batch position of the indices (the indices' dims but `index_vector_dim`, row-major):
/// its start vector, as the operand index of the window's first element per indexed dim, with
/// `None` where a `fill`/`drop` window is out of bounds.
#[allow(clippy::too_many_arguments)] // the scatter reference mirrors XLA's dimension numbers one by one
fn window_starts(
    index_vector_dim: usize,
    to_operand: &[usize],
    batching: &[(usize, usize)],
    clip: bool,
    window: &[usize],
    operand_dims: &[usize],
    idx: &[V],
    idx_dims: &[usize],
) -> Vec<(Vec<usize>, Option<Vec<usize>>)> {
    let batch_dims: Vec<usize> = (0..idx_dims.len())
        .filter(|&d| d != index_vector_dim)
        .collect();
    let extents: Vec<usize> = batch_dims.iter().map(|&d| idx_dims[d]).collect();
    indices(&extents)
        .into_iter()
        .map(|pos| {
            let mut start = vec![0usize; operand_dims.len()];
            let mut ok = true;
            for (k, &od) in to_operand.iter().enumerate() {
                let mut full = vec![0usize; idx_dims.len()];
                for (j, &d) in batch_dims.iter().enumerate() {
                    full[d] = pos[j];
                }
                if index_vector_dim < idx_dims.len() {
                    full[index_vector_dim] = k;
                }
                let v = idx[flat(&full, idx_dims)].i();
                let hi = operand_dims[od] as i64 - window[od] as i64;
                if hi < 0 {
                    ok = false;
                } else if clip {
                    start[od] = v.max(0).min(hi) as usize;
                } else if v < 0 || v > hi {
                    ok = false;
                } else {
                    start[od] = v as usize;
                }
            }
            for &(od, id) in batching {
                let j = batch_dims.iter().position(|&d| d == id).unwrap();
                start[od] = pos[j];
            }
            (pos, ok.then_some(start))
        })
        .collect()
}

fn gather_reference(
    d: &tessera_ir::GatherDims,
    x: &[V],
    xt: &TensorType,
    idx: &[V],
    it: &TensorType,
    ty: &TensorType,
) -> Vec<V> {
    let fill = narrow(ty.dtype, V::F(d.fill));
    let mut out = vec![fill; ty.numel()];
    let batching: Vec<(usize, usize)> = d
        .operand_batching_dims
        .iter()
        .copied()
        .zip(d.start_indices_batching_dims.iter().copied())
        .collect();
    let clip = d.mode == tessera_ir::IndexMode::Clip;
    let kept: Vec<usize> = (0..xt.rank())
        .filter(|o| !d.collapsed_slice_dims.contains(o) && !d.operand_batching_dims.contains(o))
        .collect();
    let batch_out: Vec<usize> = (0..ty.rank())
        .filter(|o| !d.offset_dims.contains(o))
        .collect();
    let starts = window_starts(
        d.index_vector_dim,
        &d.start_index_map,
        &batching,
        clip,
        &d.slice_sizes,
        xt.dims(),
        idx,
        it.dims(),
    );
    for (pos, start) in starts {
        let Some(start) = start else { continue };
        // Copy the window element by element into its place in the result.
        for w in indices(&d.slice_sizes) {
            let src: Vec<usize> = start.iter().zip(&w).map(|(s, o)| s + o).collect();
            let mut dst = vec![0usize; ty.rank()];
            for (j, &o) in batch_out.iter().enumerate() {
                dst[o] = pos[j];
            }
            for (j, &o) in d.offset_dims.iter().enumerate() {
                dst[o] = w[kept[j]];
            }
            out[flat(&dst, ty.dims())] = x[flat(&src, xt.dims())];
        }
    }
    out
}

fn scatter_reference(
    d: &tessera_ir::ScatterDims,
    args: &[Vec<V>],
    xt: &TensorType,
    it: &TensorType,
    ut: &TensorType,
) -> Vec<V> {
    use tessera_ir::ScatterKind;
    let mut out = args[0].clone();
    let kept: Vec<usize> = (0..xt.rank())
        .filter(|o| !d.inserted_window_dims.contains(o) && !d.input_batching_dims.contains(o))
        .collect();
    let mut window = vec![1usize; xt.rank()];
    for (j, &o) in kept.iter().enumerate() {
        window[o] = ut.dims()[d.update_window_dims[j]];
    }
    let batching: Vec<(usize, usize)> = d
        .input_batching_dims
        .iter()
        .copied()
        .zip(d.scatter_indices_batching_dims.iter().copied())
        .collect();
    let scatter_upd: Vec<usize> = (0..ut.rank())
        .filter(|o| !d.update_window_dims.contains(o))
        .collect();
    let starts = window_starts(
        d.index_vector_dim,
        &d.scatter_dims_to_operand_dims,
        &batching,
        d.mode == tessera_ir::IndexMode::Clip,
        &window,
        xt.dims(),
        &args[1],
        it.dims(),
    );
    // Every (update index, operand index) pair, applied in row-major order of the updates.
    let mut writes: Vec<(usize, usize)> = Vec::new();
    for (pos, start) in starts {
        let Some(start) = start else { continue };
        // A window wider than its operand dim (an inserted dim of size 0 that no index
        // names) lands nowhere, as XLA skips an out-of-bounds window.
        if (0..xt.rank()).any(|o| start[o] + window[o] > xt.dims()[o]) {
            continue;
        }
        for w in indices(&window) {
            let dst: Vec<usize> = start.iter().zip(&w).map(|(s, o)| s + o).collect();
            let mut u = vec![0usize; ut.rank()];
            for (j, &o) in scatter_upd.iter().enumerate() {
                u[o] = pos[j];
            }
            for (j, &o) in d.update_window_dims.iter().enumerate() {
                u[o] = w[kept[j]];
            }
            writes.push((flat(&u, ut.dims()), flat(&dst, xt.dims())));
        }
    }
    writes.sort();
    for (u, t) in writes {
        let (a, b) = (out[t], args[2][u]);
        out[t] = match (d.kind, a, b) {
            (ScatterKind::Set, _, b) => b,
            (ScatterKind::Add, V::I(a), V::I(b)) => V::I(a.wrapping_add(b)),
            (ScatterKind::Mul, V::I(a), V::I(b)) => V::I(a.wrapping_mul(b)),
            (ScatterKind::Add, a, b) => V::F(a.f() + b.f()),
            (ScatterKind::Mul, a, b) => V::F(a.f() * b.f()),
            (ScatterKind::Min, V::F(a), V::F(b)) if a.is_nan() || b.is_nan() => V::F(f64::NAN),
            (ScatterKind::Max, V::F(a), V::F(b)) if a.is_nan() || b.is_nan() => V::F(f64::NAN),
            (ScatterKind::Min, V::B(a), V::B(b)) => V::B(a && b),
            (ScatterKind::Max, V::B(a), V::B(b)) => V::B(a || b),
            (ScatterKind::Min, a, b) => {
                if b.f() < a.f() {
                    b
                } else {
                    a
                }
            }
            (ScatterKind::Max, a, b) => {
                if b.f() > a.f() {
                    b
                } else {
                    a
                }
            }
        };
        out[t] = narrow(xt.dtype, out[t]);
    }
    out
}

/// i64 sort keys and argmax compare exactly (through f64, `i64::MAX - 1` and `i64::MAX` are one
/// value: the interpreter's sort kept their order and argmax took the first).
#[test]
fn i64_order_is_exact() {
    let ty = TensorType::new(DType::I64, vec![3]);
    let x = Literal::new([3], Data::I64(vec![i64::MAX, i64::MAX - 1, i64::MAX - 2])).unwrap();
    let sorted = tessera_interp::eval_op(
        &Op::Sort {
            dim: 0,
            num_keys: 1,
            output: 0,
        },
        &[&x],
        &ty,
    )
    .unwrap();
    assert_eq!(
        sorted.data.as_i64(),
        Some(&[i64::MAX - 2, i64::MAX - 1, i64::MAX][..])
    );
    let y = Literal::new([3], Data::I64(vec![i64::MAX - 2, i64::MAX, i64::MAX - 1])).unwrap();
    let am = tessera_interp::eval_op(
        &Op::ArgMax { axis: 0 },
        &[&y],
        &TensorType::new(DType::I32, vec![]),
    )
    .unwrap();
    assert_eq!(am.data.as_i32(), Some(&[1][..]));
}
