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
    BinaryOp, CompareOp, ConvDims, CumulativeKind, DType, Data, DotDims, GatherDims, Graph,
    IndexMode, Literal, NodeId, Op, ReduceKind, RegionOp, ScatterDims, ScatterKind, Shape,
    TensorType, UnaryOp, WindowDims, bf16, f16, print,
};

/// Dims the shapes are drawn from: empty, one, small primes, a size past the 8-lane loops.
const DIMS: [usize; 8] = [0, 1, 1, 2, 3, 5, 7, 17];

struct Gen {
    rng: Lcg,
    /// How deep in region bodies the generator is (0: the program itself). A body cannot gain
    /// parameters, so inside one a missing operand is a new constant instead.
    depth: usize,
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
            DType::I64,
            DType::F16,
            DType::BF16,
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
            DType::I64 => Data::I64(
                (0..n)
                    .map(|_| match self.below(3) {
                        0 => self.pick(&[0, 1, -1, i64::MAX, i64::MIN, 63, 64, 1 << 40]),
                        _ => self.rng.range(-50.0, 50.0) as i64,
                    })
                    .collect(),
            ),
            // The f32 edge values round to the narrow types' (overflowing to inf, flushing
            // to their subnormals or zero), plus their own extremes.
            DType::F16 => Data::F16(
                (0..n)
                    .map(|_| match self.below(5) {
                        0 => self.pick(&[f16::MAX, f16::MIN_POSITIVE_SUBNORMAL, f16::NEG_ZERO]),
                        _ => f16::from_f32(self.f32_value()),
                    })
                    .collect(),
            ),
            DType::BF16 => Data::BF16(
                (0..n)
                    .map(|_| match self.below(5) {
                        0 => self.pick(&[bf16::MAX, bf16::MIN_POSITIVE, bf16::NEG_ZERO]),
                        _ => bf16::from_f32(self.f32_value()),
                    })
                    .collect(),
            ),
        }
    }

    /// A node of the wanted type: an existing one, or a new parameter.
    fn operand_like(&mut self, g: &mut Graph, nodes: &mut Vec<NodeId>, ty: &TensorType) -> NodeId {
        let same: Vec<NodeId> = nodes.iter().copied().filter(|&n| g.ty(n) == ty).collect();
        if !same.is_empty() && self.chance(0.7) {
            return self.pick(&same);
        }
        let p = if self.depth > 0 {
            self.constant(g, ty)
        } else {
            g.add_param(ty.clone())
        };
        nodes.push(p);
        p
    }

    /// A new constant of type `ty` with random (edge) values.
    fn constant(&mut self, g: &mut Graph, ty: &TensorType) -> NodeId {
        let lit = Literal::new(ty.shape.clone(), self.data(ty.dtype, ty.numel())).expect("sized");
        g.add(Op::Constant(lit), &[])
            .expect("a constant is well-typed")
    }

    /// A node of type `ty` among `nodes`, else a new constant (a body's output of a fixed type).
    fn node_of_type(&mut self, g: &mut Graph, nodes: &[NodeId], ty: &TensorType) -> NodeId {
        let same: Vec<NodeId> = nodes.iter().copied().filter(|&n| g.ty(n) == ty).collect();
        if same.is_empty() {
            self.constant(g, ty)
        } else {
            self.pick(&same)
        }
    }

    /// A random body over parameters of the given types: a few random ops (and, two levels
    /// deep at most, a region of its own); returns it with its nodes, outputs not yet set.
    fn body(&mut self, params: &[TensorType]) -> (Graph, Vec<NodeId>) {
        let mut g = Graph::new("body");
        let mut nodes: Vec<NodeId> = params.iter().map(|t| g.add_param(t.clone())).collect();
        self.depth += 1;
        for _ in 0..1 + self.below(4) {
            if nodes.is_empty() {
                break;
            }
            if self.depth < 3 && self.chance(0.15) {
                self.region(&mut g, &mut nodes);
            } else {
                self.op(&mut g, &mut nodes);
            }
        }
        self.depth -= 1;
        (g, nodes)
    }

    /// Sets a body's outputs: one node of each type in `fixed`, then up to `free` random
    /// nodes of types whose stacked form (a scan's ys: `[stack, ..dims]`) is small.
    fn finish(
        &mut self,
        g: &mut Graph,
        nodes: &[NodeId],
        fixed: &[TensorType],
        free: usize,
        stack: usize,
    ) {
        let mut outs: Vec<NodeId> = fixed
            .iter()
            .map(|t| self.node_of_type(g, nodes, t))
            .collect();
        if !nodes.is_empty() {
            for _ in 0..self.below(free + 1) {
                let n = self.pick(nodes);
                if g.ty(n).numel().saturating_mul(stack) <= 1 << 16 {
                    outs.push(n);
                }
            }
        }
        g.set_outputs(outs);
    }

    /// Up to `n` distinct nodes of `nodes` (at least one).
    fn some(&mut self, nodes: &[NodeId], n: usize) -> Vec<NodeId> {
        let mut out = Vec::new();
        for _ in 0..1 + self.below(n) {
            let x = self.pick(nodes);
            if !out.contains(&x) {
                out.push(x);
            }
        }
        out
    }

    /// One random region op (scan, while, case, checkpoint or custom_vjp) with random small
    /// bodies over the nodes so far; some of its results (not always all) are read by
    /// `get_result` nodes, which join `nodes`.
    fn region(&mut self, g: &mut Graph, nodes: &mut Vec<NodeId>) -> Option<NodeId> {
        let ty_of = |g: &Graph, ids: &[NodeId]| -> Vec<TensorType> {
            ids.iter().map(|&i| g.ty(i).clone()).collect()
        };
        let (r, operands) = match self.below(5) {
            0 => {
                let length = self.pick(&[0, 1, 2, 3]);
                let consts = if self.chance(0.5) {
                    self.some(nodes, 1)
                } else {
                    vec![]
                };
                let carries = self.some(nodes, 2);
                let mut xs = Vec::new();
                for _ in 0..self.below(3) {
                    let mut dims = vec![length];
                    dims.extend(self.shape());
                    let ty = TensorType::new(self.dtype(), dims);
                    xs.push(self.operand_like(g, nodes, &ty));
                }
                let mut params = ty_of(g, &consts);
                params.extend(ty_of(g, &carries));
                let carry_types = ty_of(g, &carries);
                for &x in &xs {
                    let t = g.ty(x);
                    params.push(TensorType::new(t.dtype, t.dims()[1..].to_vec()));
                }
                let (mut body, body_nodes) = self.body(&params);
                self.finish(&mut body, &body_nodes, &carry_types, 2, length);
                let mut operands = consts.clone();
                operands.extend(&carries);
                operands.extend(&xs);
                let r = RegionOp::Scan {
                    length,
                    reverse: self.chance(0.5),
                    consts: consts.len(),
                    carries: carries.len(),
                    body,
                };
                (r, operands)
            }
            1 => {
                // A counter carry bounds the trip count: `while n < limit` with the counter
                // starting in -1..=1 and the limit in 0..4, so at most 5 iterations.
                let start = self.below(3) as i32 - 1;
                let limit = self.below(4) as i32;
                let counter = g
                    .add(
                        Op::Constant(
                            Literal::new(Shape::scalar(), Data::I32(vec![start])).expect("scalar"),
                        ),
                        &[],
                    )
                    .expect("a constant is well-typed");
                let consts = if self.chance(0.5) {
                    self.some(nodes, 1)
                } else {
                    vec![]
                };
                let mut carries = vec![counter];
                carries.extend(self.some(nodes, 2));
                let mut params = ty_of(g, &consts);
                params.extend(ty_of(g, &carries));
                let n = consts.len();
                let mut cond = Graph::new("cond");
                let ps: Vec<NodeId> = params.iter().map(|t| cond.add_param(t.clone())).collect();
                let lim = cond
                    .add(
                        Op::Constant(
                            Literal::new(Shape::scalar(), Data::I32(vec![limit])).expect("scalar"),
                        ),
                        &[],
                    )
                    .expect("a constant is well-typed");
                let go = cond
                    .add(Op::Compare(CompareOp::Lt), &[ps[n], lim])
                    .expect("i32[] < i32[]");
                cond.set_outputs(vec![go]);
                let (mut body, mut body_nodes) = self.body(&params);
                let one = body
                    .add(
                        Op::Constant(
                            Literal::new(Shape::scalar(), Data::I32(vec![1])).expect("scalar"),
                        ),
                        &[],
                    )
                    .expect("a constant is well-typed");
                let next = body
                    .add(Op::Binary(BinaryOp::Add), &[body.params()[n], one])
                    .expect("i32[] + i32[]");
                // The counter's successor is the body's first output, not a value the random
                // ops may pick as another carry.
                body_nodes.retain(|&x| x != body.params()[n]);
                let rest = ty_of(g, &carries[1..]);
                self.finish(&mut body, &body_nodes, &rest, 0, 1);
                let mut outs = vec![next];
                outs.extend(body.outputs().iter().copied());
                body.set_outputs(outs);
                let mut operands = consts.clone();
                operands.extend(&carries);
                let r = RegionOp::While {
                    consts: n,
                    cond,
                    body,
                };
                (r, operands)
            }
            2 => {
                let index =
                    self.operand_like(g, nodes, &TensorType::new(DType::I32, Vec::<usize>::new()));
                let args = self.some(nodes, 2);
                let params = ty_of(g, &args);
                let (mut first, first_nodes) = self.body(&params);
                self.finish(&mut first, &first_nodes, &[], 2, 1);
                let out_types = tessera::ir::region::output_types(&first);
                let mut branches = vec![first];
                for _ in 0..1 + self.below(2) {
                    let (mut b, b_nodes) = self.body(&params);
                    self.finish(&mut b, &b_nodes, &out_types, 0, 1);
                    branches.push(b);
                }
                let mut operands = vec![index];
                operands.extend(&args);
                (RegionOp::Case { branches }, operands)
            }
            3 => {
                let args = self.some(nodes, 2);
                let (mut body, body_nodes) = self.body(&ty_of(g, &args));
                self.finish(&mut body, &body_nodes, &[], 3, 1);
                (RegionOp::Checkpoint { body }, args)
            }
            _ => {
                let args = self.some(nodes, 2);
                let arg_types = ty_of(g, &args);
                let (mut fwd, fwd_nodes) = self.body(&arg_types);
                self.finish(&mut fwd, &fwd_nodes, &[], 3, 1);
                let outs = tessera::ir::region::output_types(&fwd);
                let primals = if outs.is_empty() {
                    0
                } else {
                    1 + self.below(outs.len())
                };
                let mut bwd_params = outs[primals..].to_vec();
                bwd_params.extend_from_slice(&outs[..primals]);
                let (mut bwd, bwd_nodes) = self.body(&bwd_params);
                self.finish(&mut bwd, &bwd_nodes, &arg_types, 0, 1);
                (RegionOp::CustomVjp { primals, fwd, bwd }, args)
            }
        };
        let id = g.add(Op::Region(Box::new(r)), &operands).ok()?;
        let types = g.result_types(id).ok()?;
        let mut last = None;
        for (index, ty) in types.into_iter().enumerate() {
            if self.chance(0.8) {
                let res = g.add(Op::GetResult { index, ty }, &[id]).ok()?;
                nodes.push(res);
                last = Some(res);
            }
        }
        last
    }

    /// One random op on the nodes so far (or a new leaf). `None` when the draw is not
    /// well-typed (the type rule decides; the program just draws again).
    fn op(&mut self, g: &mut Graph, nodes: &mut Vec<NodeId>) -> Option<NodeId> {
        let x = self.pick(nodes);
        let xt = g.ty(x).clone();
        let rank = xt.rank();
        let dims = xt.dims().to_vec();
        let (op, args): (Op, Vec<NodeId>) = match self.below(22) {
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
                    let same_width: Vec<DType> = DType::ALL
                        .into_iter()
                        .filter(|d| *d != DType::Bool && d.bit_width() == xt.dtype.bit_width())
                        .collect();
                    if same_width.is_empty() {
                        return None;
                    }
                    (Op::Bitcast(self.pick(&same_width)), vec![x])
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
            17 => {
                if rank == 0 {
                    return None;
                }
                let axis = self.below(rank);
                match self.below(3) {
                    0 => (
                        Op::Cumulative {
                            kind: self.pick(&CumulativeKind::ALL),
                            axis,
                            reverse: self.chance(0.5),
                        },
                        vec![x],
                    ),
                    1 => (
                        Op::Rev {
                            dims: (0..rank).filter(|_| self.chance(0.5)).collect(),
                        },
                        vec![x],
                    ),
                    _ => {
                        // One key, or two (the second a tie-breaker) carrying either operand.
                        let two = self.chance(0.5);
                        let mut args = vec![x];
                        if two {
                            args.push(self.operand_like(g, nodes, &xt));
                        }
                        let output = self.below(args.len());
                        let num_keys = 1 + self.below(args.len());
                        (
                            Op::Sort {
                                dim: axis,
                                num_keys,
                                output,
                            },
                            args,
                        )
                    }
                }
            }
            18 => {
                // A window of up to 3 per dim, strides up to 2, padding and dilations up to 1.
                let mut w = WindowDims::new(
                    dims.iter()
                        .map(|&d| 1 + self.below(d.clamp(1, 3)))
                        .collect(),
                    (0..rank).map(|_| 1 + self.below(2)).collect(),
                );
                w.padding = (0..rank)
                    .map(|_| (self.below(2) as i64, self.below(2) as i64))
                    .collect();
                w.base_dilation = (0..rank).map(|_| 1 + self.below(2)).collect();
                w.window_dilation = (0..rank).map(|_| 1 + self.below(2)).collect();
                (
                    Op::ReduceWindow {
                        kind: self.pick(&ReduceKind::ALL),
                        win: Box::new(w),
                    },
                    vec![x],
                )
            }
            19 => {
                // `take` along a dim: random i32 or u32 indices (in and out of range), either
                // out-of-bounds mode.
                if rank == 0 {
                    return None;
                }
                let axis = self.below(rank);
                let k = self.below(3);
                let ishape: Vec<usize> = (0..k).map(|_| self.pick(&DIMS)).collect();
                let ity = TensorType::new(self.pick(&[DType::I32, DType::U32]), ishape);
                let idx = self.operand_like(g, nodes, &ity);
                let mut slice_sizes = dims.clone();
                slice_sizes[axis] = 1;
                let d = GatherDims {
                    offset_dims: (0..axis).chain(axis + k..rank - 1 + k).collect(),
                    collapsed_slice_dims: vec![axis],
                    start_index_map: vec![axis],
                    operand_batching_dims: vec![],
                    start_indices_batching_dims: vec![],
                    index_vector_dim: k,
                    slice_sizes,
                    mode: self.pick(&[IndexMode::Clip, IndexMode::Fill]),
                    fill: 0.0,
                };
                (Op::Gather(Box::new(d)), vec![x, idx])
            }
            20 => {
                // `x.at[idx]` updates of rows: scatter of a random kind along dim 0.
                if rank == 0 {
                    return None;
                }
                let n = self.pick(&DIMS);
                let ity = TensorType::new(self.pick(&[DType::I32, DType::U32]), vec![n]);
                let idx = self.operand_like(g, nodes, &ity);
                let mut ushape = dims.clone();
                ushape[0] = n;
                let upd = self.operand_like(g, nodes, &TensorType::new(xt.dtype, ushape));
                let d = ScatterDims {
                    kind: self.pick(&ScatterKind::ALL),
                    update_window_dims: (1..rank).collect(),
                    inserted_window_dims: vec![0],
                    scatter_dims_to_operand_dims: vec![0],
                    input_batching_dims: vec![],
                    scatter_indices_batching_dims: vec![],
                    index_vector_dim: 1,
                    mode: self.pick(&[IndexMode::Clip, IndexMode::Fill]),
                };
                (Op::Scatter(Box::new(d)), vec![x, idx, upd])
            }
            21 => {
                // x [n, c, spatial..] convolved with a new kernel [o, c / groups, k..].
                if rank < 3 {
                    return None;
                }
                let mut cd = ConvDims::nchw(rank - 2);
                let c = dims[1];
                let groups = if c > 1 && c.is_multiple_of(2) && self.chance(0.3) {
                    2
                } else {
                    1
                };
                cd.feature_group_count = groups;
                let mut kshape = vec![groups * (1 + self.below(3)), c / groups.max(1)];
                kshape.extend(dims[2..].iter().map(|&d| 1 + self.below(d.clamp(1, 3))));
                cd.strides = (2..rank).map(|_| 1 + self.below(2)).collect();
                cd.padding = (2..rank)
                    .map(|_| (self.below(2) as i64, self.below(2) as i64))
                    .collect();
                cd.rhs_dilation = (2..rank).map(|_| 1 + self.below(2)).collect();
                let k = self.operand_like(g, nodes, &TensorType::new(xt.dtype, kshape));
                (Op::Conv(Box::new(cd)), vec![x, k])
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
        self.program_with(0.0)
    }

    /// A program whose steps are region ops with probability `regions` (drawn only when it is
    /// positive, so `program`'s seeds keep their programs).
    fn program_with(&mut self, regions: f64) -> (Graph, Vec<Literal>) {
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
            let id = if regions > 0.0 && self.chance(regions) {
                self.region(&mut g, &mut nodes)
            } else {
                self.op(&mut g, &mut nodes)
            };
            if let Some(id) = id {
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
        let mut gen_ = Gen {
            rng: Lcg(seed),
            depth: 0,
        };
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

/// Whether both backends compute every op of `g` and of its bodies bit for bit alike: not
/// the f32 transcendental functions (each backend has its own within the stated bounds) nor
/// float sums and dots (the order of the terms is the backend's); f64 functions are Rust's
/// libm on both, `pow` the same f64 call, `sqrt` correctly rounded, `rsqrt` `1 / sqrt(x)`.
fn exact_between_backends(g: &Graph) -> bool {
    g.node_ids().all(|id| {
        let float = g.ty(id).dtype.is_float();
        match g.op(id) {
            Op::Unary(u) => match u {
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Expm1
                | UnaryOp::Tanh
                | UnaryOp::Logistic
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::ErfInv => g.ty(id).dtype == DType::F64,
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Not => true,
                // The same libm call on both backends (tessera-interp/src/elem.rs).
                UnaryOp::Tan
                | UnaryOp::Asin
                | UnaryOp::Acos
                | UnaryOp::Atan
                | UnaryOp::Sinh
                | UnaryOp::Cosh
                | UnaryOp::Asinh
                | UnaryOp::Acosh
                | UnaryOp::Atanh
                | UnaryOp::Exp2 => true,
            },
            Op::Reduce { kind, .. } => match kind {
                ReduceKind::Sum => !float,
                ReduceKind::Max | ReduceKind::Min => true,
            },
            Op::DotGeneral(_) => !float,
            Op::Conv(_) => !float,
            Op::ReduceWindow { .. } => true,
            Op::Region(r) => r.regions().iter().all(|(_, b)| exact_between_backends(b)),
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::ArgMax { .. }
            | Op::Collective(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::GetResult { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => true,
        }
    })
}

/// Every body of every region op of `g`, nested ones included.
fn bodies(g: &Graph) -> Vec<Graph> {
    let mut out = Vec::new();
    for id in g.node_ids() {
        if let Op::Region(r) = g.op(id) {
            for (_, b) in r.regions() {
                out.push(b.clone());
                out.extend(bodies(b));
            }
        }
    }
    out
}

/// Bitwise equality of two program outputs, any NaN equal to any NaN.
fn same_bits(a: &Literal, b: &Literal) -> bool {
    a.ty == b.ty
        && (0..a.data.len()).all(|i| {
            let (x, y) = (a.data.get_f64(i), b.data.get_f64(i));
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        })
}

/// The fuzzer over programs with region ops (scan, while, case, checkpoint, custom_vjp, two
/// levels of nesting at most, some results unused) with random small bodies. Each program:
/// `check_program` on it (its regions compiled alone against the program compiled whole, bit
/// for bit; the other ops within their bounds) and on each body with random inputs (the body's
/// ops compiled against interpreted); and when all its ops are exact between the backends,
/// the program compiled whole against the interpreter, bit for bit. Returns how many programs
/// with a region ran and how many of them were exact.
fn fuzz_regions(first_seed: u64, count: u64, budget: Duration) -> Result<(u64, u64), String> {
    let start = Instant::now();
    let (mut ran, mut exact) = (0, 0);
    for seed in first_seed..first_seed + count {
        if start.elapsed() > budget {
            break;
        }
        let mut gen_ = Gen {
            rng: Lcg(seed),
            depth: 0,
        };
        let (g, inputs) = gen_.program_with(0.4);
        let inner = bodies(&g);
        if inner.is_empty() {
            continue;
        }
        let text = print(&g);
        if std::env::var_os("TESSERA_FUZZ_VERBOSE").is_some() {
            eprintln!("seed {seed}:\n{text}");
        }
        let fail = |what: String| {
            let values: Vec<String> = inputs.iter().map(|l| format!("{:?}", l.data)).collect();
            format!(
                "seed {seed}: {what}\n{text}\ninputs: {}",
                values.join("\n        ")
            )
        };
        check_program(&g, &inputs).map_err(|e| fail(e.to_string()))?;
        for b in &inner {
            let body_inputs: Vec<Literal> = b
                .params()
                .iter()
                .map(|&p| {
                    let ty = b.ty(p).clone();
                    let n = ty.numel();
                    Literal::new(ty.shape.clone(), gen_.data(ty.dtype, n)).expect("sized")
                })
                .collect();
            check_program(b, &body_inputs)
                .map_err(|e| fail(format!("body {}: {e}\n{}", b.name, print(b))))?;
        }
        if exact_between_backends(&g) {
            let want = tessera_interp::run(&g, &inputs).map_err(|e| fail(e.to_string()))?;
            let exe = tessera_codegen::compile(&g).map_err(|e| fail(e.to_string()))?;
            let refs: Vec<&Literal> = inputs.iter().collect();
            let got = exe
                .run(&refs, &tessera_interp::SingleDevice)
                .map_err(|e| fail(e.to_string()))?;
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                if !same_bits(a, b) {
                    return Err(fail(format!(
                        "output {i}: compiled {:?}, interpreted {:?}",
                        a.data, b.data
                    )));
                }
            }
            exact += 1;
        }
        ran += 1;
    }
    Ok((ran, exact))
}

#[test]
fn fuzz_regions_short() {
    let (ran, exact) =
        fuzz_regions(1, 600, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("fuzz_regions_short: {ran} programs with regions, {exact} of them exact");
    assert!(ran >= 100, "only {ran} programs with regions ran");
    assert!(
        exact >= 20,
        "only {exact} programs were compared bit for bit"
    );
}

#[test]
#[ignore = "long run: TESSERA_FUZZ_SECONDS=600 cargo test --release -p tessera --test fuzz -- --ignored fuzz_regions_long"]
fn fuzz_regions_long() {
    let secs: u64 = std::env::var("TESSERA_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let first: u64 = std::env::var("TESSERA_FUZZ_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (ran, exact) = fuzz_regions(first, u64::MAX / 2, Duration::from_secs(secs))
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("fuzz_regions_long: {ran} programs ({exact} exact) in {secs} s, no mismatch");
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

/// The programs whose schedules `hoist.rs` reorders (`tests/filetests/schedule/hoist.ir`, the
/// cases without a mesh: a parameter update moved before a large tanh, column sums moved past
/// large kernels, a pair with a step behind it) compute, compiled whole in the new order, the
/// bits of their ops compiled alone, on inputs of every sign.
#[test]
fn hoisted_schedules_compute_the_bits_of_their_ops() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/filetests/schedule/hoist.ir"
    );
    let text = std::fs::read_to_string(path).expect("the hoist filetests");
    let mut checked = 0;
    for case in text.split("// case:").skip(1) {
        let program = case.split("// expect:").next().expect("a case");
        if program.contains("mesh @") {
            continue;
        }
        // The program's lines: from its `func` line (the lines before are the case's comment).
        let at = program.find("func @").expect("a func");
        let g = tessera::ir::parse(&program[at..]).unwrap_or_else(|e| panic!("{e}"));
        let inputs: Vec<Literal> = g
            .params()
            .iter()
            .enumerate()
            .map(|(p, &id)| {
                let ty = g.ty(id);
                let data = (0..ty.numel())
                    .map(|i| ((i * 7919 + p * 104_729) % 1013) as f32 / 1013.0 * 4.0 - 2.0)
                    .collect();
                Literal::new(ty.shape.clone(), Data::F32(data)).expect("sized")
            })
            .collect();
        check_program(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", print(&g)));
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} cases ran");
}
