//! The differential fuzzer: random well-typed programs over every op and dtype, with edge
//! shapes (zero-size dims, size 1, primes) and edge values (0, -0, subnormals, +-inf, NaN,
//! values near overflow, huge arguments for the periodic functions), compiled against the
//! interpreter by `tessera::check::check_program`: every op within its stated bound, and the
//! program compiled whole bit for bit equal to its ops compiled alone.
//!
//! `cargo test --test fuzz` runs a short, fixed set of seeds. The long run is
//! `TESSERA_FUZZ_SECONDS=600 cargo test --release -p tessera --test fuzz -- --ignored fuzz_long`;
//! a failure prints the seed and the program in the IR text format, ready for a filetest.

use std::time::{Duration, Instant};

use tessera::check::check_program;
use tessera::ir::corpus::Lcg;
use tessera::ir::{
    BinaryOp, CompareOp, DType, Data, DotDims, Graph, Literal, NodeId, Op, ReduceKind, Shape,
    TensorType, UnaryOp, print,
};

/// Dims the shapes are drawn from: empty, one, small primes, a size past the 8-lane loops.
const DIMS: [usize; 8] = [0, 1, 1, 2, 3, 5, 7, 17];

struct Gen {
    rng: Lcg,
}

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        ((self.rng.next_f64() * n as f64) as usize).min(n.saturating_sub(1))
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.next_f64() < p
    }

    fn dtype(&mut self) -> DType {
        self.pick(&[
            DType::F32,
            DType::F32,
            DType::F32,
            DType::F64,
            DType::I32,
            DType::U32,
            DType::Bool,
        ])
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = self.below(4);
        (0..rank).map(|_| self.pick(&DIMS)).collect()
    }

    fn f32_value(&mut self) -> f32 {
        const EDGES: [f32; 20] = [
            0.0,
            -0.0,
            1e-45,
            -1e-45,
            f32::MIN_POSITIVE,
            1.0,
            -1.0,
            0.5,
            2.5,
            -2.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            -f32::MAX,
            88.7,
            -103.0,
            1e30,
            3e9,
            -1e-40,
        ];
        match self.below(4) {
            0 => self.pick(&EDGES),
            // Huge arguments for sin and cos: a random exponent up to 2^127.
            1 => {
                let e = self.below(128) as i32;
                let m = self.rng.range(1.0, 2.0) as f32;
                let s = if self.chance(0.5) { -1.0 } else { 1.0 };
                s * m * 2f32.powi(e)
            }
            _ => self.rng.range(-4.0, 4.0) as f32,
        }
    }

    fn data(&mut self, dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32((0..n).map(|_| self.f32_value()).collect()),
            DType::F64 => Data::F64(
                (0..n)
                    .map(|_| match self.below(4) {
                        0 => self.pick(&[
                            0.0,
                            -0.0,
                            5e-324,
                            f64::INFINITY,
                            f64::NAN,
                            f64::MAX,
                            1e300,
                        ]),
                        _ => self.f32_value() as f64,
                    })
                    .collect(),
            ),
            DType::I32 => Data::I32(
                (0..n)
                    .map(|_| match self.below(3) {
                        0 => self.pick(&[0, 1, -1, i32::MAX, i32::MIN, 31, 32, 33]),
                        _ => self.rng.range(-50.0, 50.0) as i32,
                    })
                    .collect(),
            ),
            DType::U32 => Data::U32(
                (0..n)
                    .map(|_| match self.below(3) {
                        0 => self.pick(&[0, 1, u32::MAX, 31, 32, 33, 1 << 31]),
                        _ => self.rng.range(0.0, 100.0) as u32,
                    })
                    .collect(),
            ),
            DType::Bool => Data::Bool((0..n).map(|_| self.chance(0.5)).collect()),
        }
    }

    /// A node of the wanted type: an existing one, or a new parameter.
    fn operand_like(&mut self, g: &mut Graph, nodes: &mut Vec<NodeId>, ty: &TensorType) -> NodeId {
        let same: Vec<NodeId> = nodes.iter().copied().filter(|&n| g.ty(n) == ty).collect();
        if !same.is_empty() && self.chance(0.7) {
            return self.pick(&same);
        }
        let p = g.add_param(ty.clone());
        nodes.push(p);
        p
    }

    /// One random op on the nodes so far (or a new leaf). `None` when the draw is not
    /// well-typed (the type rule decides; the program just draws again).
    fn op(&mut self, g: &mut Graph, nodes: &mut Vec<NodeId>) -> Option<NodeId> {
        let x = self.pick(nodes);
        let xt = g.ty(x).clone();
        let rank = xt.rank();
        let dims = xt.dims().to_vec();
        let (op, args): (Op, Vec<NodeId>) = match self.below(17) {
            0..=2 => (Op::Unary(self.pick(&UnaryOp::ALL)), vec![x]),
            3..=5 => {
                let y = self.operand_like(g, nodes, &xt);
                (Op::Binary(self.pick(&BinaryOp::ALL)), vec![x, y])
            }
            6 => {
                let y = self.operand_like(g, nodes, &xt);
                (Op::Compare(self.pick(&CompareOp::ALL)), vec![x, y])
            }
            7 => {
                let p = self.operand_like(g, nodes, &TensorType::new(DType::Bool, dims.clone()));
                let y = self.operand_like(g, nodes, &xt);
                (Op::Select, vec![p, x, y])
            }
            8 => {
                if self.chance(0.5) {
                    (Op::Convert(self.dtype()), vec![x])
                } else {
                    // The bits of a NaN an op computes are not specified (each backend makes its
                    // own); a parameter's or an integer's bits are, so only those are
                    // reinterpreted.
                    if xt.dtype.is_float() && !matches!(g.op(x), Op::Parameter(_)) {
                        return None;
                    }
                    (
                        Op::Bitcast(self.pick(&[DType::F32, DType::I32, DType::U32])),
                        vec![x],
                    )
                }
            }
            9 => {
                // Insert one new dim.
                let at = self.below(rank + 1);
                let mut shape = dims.clone();
                shape.insert(at, self.pick(&DIMS));
                let map: Vec<usize> = (0..rank).map(|i| if i < at { i } else { i + 1 }).collect();
                (
                    Op::BroadcastInDim {
                        shape: Shape::new(shape),
                        dims: map,
                    },
                    vec![x],
                )
            }
            10 => {
                let shape = match self.below(3) {
                    0 => vec![xt.numel()],
                    1 => {
                        let mut s = dims.clone();
                        s.insert(self.below(rank + 1), 1);
                        s
                    }
                    _ => dims.iter().rev().copied().collect(),
                };
                (Op::Reshape(Shape::new(shape)), vec![x])
            }
            11 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    let j = self.below(i + 1);
                    perm.swap(i, j);
                }
                (Op::Transpose(perm), vec![x])
            }
            12 => {
                let mut start = Vec::new();
                let mut limit = Vec::new();
                let mut stride = Vec::new();
                for &d in &dims {
                    let a = self.below(d + 1);
                    let b = a + self.below(d - a + 1);
                    start.push(a);
                    limit.push(b);
                    stride.push(1 + self.below(3));
                }
                (
                    Op::Slice {
                        start,
                        limit,
                        stride,
                    },
                    vec![x],
                )
            }
            13 => {
                if rank == 0 {
                    return None;
                }
                let d = self.below(rank);
                let mut other = dims.clone();
                other[d] = self.pick(&DIMS);
                let y = self.operand_like(g, nodes, &TensorType::new(xt.dtype, other));
                (Op::Concatenate { dim: d }, vec![x, y])
            }
            14 => {
                let pv =
                    self.operand_like(g, nodes, &TensorType::new(xt.dtype, Vec::<usize>::new()));
                let low: Vec<i64> = (0..rank).map(|_| self.below(4) as i64 - 1).collect();
                let high: Vec<i64> = (0..rank).map(|_| self.below(4) as i64 - 1).collect();
                let interior: Vec<usize> = (0..rank).map(|_| self.below(3)).collect();
                (
                    Op::Pad {
                        low,
                        high,
                        interior,
                    },
                    vec![x, pv],
                )
            }
            15 => {
                if self.chance(0.3) && rank > 0 {
                    (
                        Op::ArgMax {
                            axis: self.below(rank),
                        },
                        vec![x],
                    )
                } else {
                    let axes: Vec<usize> = (0..rank).filter(|_| self.chance(0.5)).collect();
                    (
                        Op::Reduce {
                            kind: self.pick(&ReduceKind::ALL),
                            axes,
                        },
                        vec![x],
                    )
                }
            }
            _ => {
                // x [.., k] times a new [k, n] (or [k]).
                if rank == 0 {
                    return None;
                }
                let k = dims[rank - 1];
                let rhs_shape = if self.chance(0.5) {
                    vec![k, self.pick(&DIMS)]
                } else {
                    vec![k]
                };
                let y = self.operand_like(g, nodes, &TensorType::new(xt.dtype, rhs_shape));
                (
                    Op::DotGeneral(DotDims {
                        lhs_contract: vec![rank - 1],
                        rhs_contract: vec![0],
                        ..DotDims::default()
                    }),
                    vec![x, y],
                )
            }
        };
        let id = g.add(op, &args).ok()?;
        nodes.push(id);
        Some(id)
    }

    fn program(&mut self) -> (Graph, Vec<Literal>) {
        let mut g = Graph::new("fuzz");
        let mut nodes = Vec::new();
        for _ in 0..1 + self.below(2) {
            let ty = TensorType::new(self.dtype(), self.shape());
            nodes.push(g.add_param(ty));
        }
        if self.chance(0.3) {
            let ty = TensorType::new(self.dtype(), self.shape());
            let n = ty.numel();
            let lit = Literal::new(ty.shape.clone(), self.data(ty.dtype, n)).expect("sized");
            nodes.push(
                g.add(Op::Constant(lit), &[])
                    .expect("a constant is well-typed"),
            );
        }
        if self.chance(0.2) {
            let ty = TensorType::new(
                self.pick(&[DType::F32, DType::I32, DType::U32]),
                self.shape(),
            );
            if ty.rank() > 0 {
                let dim = self.below(ty.rank());
                nodes.push(
                    g.add(Op::Iota { dim, ty }, &[])
                        .expect("iota is well-typed"),
                );
            }
        }
        let mut made = Vec::new();
        for _ in 0..2 + self.below(10) {
            if let Some(id) = self.op(&mut g, &mut nodes) {
                made.push(id);
            }
        }
        let mut outputs = vec![*nodes.last().expect("at least one node")];
        if let Some(&o) = made.first()
            && !outputs.contains(&o)
        {
            outputs.push(o);
        }
        g.set_outputs(outputs);
        let inputs = g
            .params()
            .iter()
            .map(|&p| {
                let ty = g.ty(p).clone();
                let n = ty.numel();
                Literal::new(ty.shape.clone(), self.data(ty.dtype, n)).expect("sized")
            })
            .collect();
        (g, inputs)
    }
}

/// Runs the fuzzer from `first_seed` until `count` programs or `budget` are done; returns how
/// many ran, or the first failure with its seed and program.
fn fuzz(first_seed: u64, count: u64, budget: Duration) -> Result<u64, String> {
    let start = Instant::now();
    let mut ran = 0;
    for seed in first_seed..first_seed + count {
        if start.elapsed() > budget {
            break;
        }
        let mut gen_ = Gen { rng: Lcg(seed) };
        let (g, inputs) = gen_.program();
        if std::env::var_os("TESSERA_FUZZ_VERBOSE").is_some() {
            // A crash (the class of bug this looks for) leaves the program it died on here.
            eprintln!("seed {seed}:\n{}", print(&g));
        }
        if let Err(e) = check_program(&g, &inputs) {
            let values: Vec<String> = inputs.iter().map(|l| format!("{:?}", l.data)).collect();
            return Err(format!(
                "seed {seed}: {e}\n{}\ninputs: {}",
                print(&g),
                values.join("\n        ")
            ));
        }
        ran += 1;
    }
    Ok(ran)
}

#[test]
fn fuzz_short() {
    // A fixed range of seeds, so the suite is deterministic; the time budget only guards
    // against a slow machine.
    let ran = fuzz(1, 1500, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    assert!(ran >= 200, "only {ran} programs ran in the time budget");
}

#[test]
#[ignore = "long run: TESSERA_FUZZ_SECONDS=600 cargo test --release -p tessera --test fuzz -- --ignored"]
fn fuzz_long() {
    let secs: u64 = std::env::var("TESSERA_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let first: u64 = std::env::var("TESSERA_FUZZ_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let ran =
        fuzz(first, u64::MAX / 2, Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("fuzz_long: {ran} programs in {secs} s, no mismatch");
}
