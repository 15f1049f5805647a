//! Fusion: turns a per-device graph into a schedule of steps over buffers.
//!
//! Consumes a verified graph; produces a `Schedule`: the buffers (inputs, constants,
//! temporaries) and the steps that fill them, in order. A node is materialized into a buffer
//! when it is a parameter, an output, a non-splat constant, a dot, a reduction, an argmax, a
//! collective, an operand of reshape/pad/concatenate/dot (but not a reshape's that only merges
//! dims for elementwise readers: `Refinement`), or used more than once and not free to
//! recompute. Every other node (elementwise ops, broadcasts, transposes, slices, splat constants,
//! iota) is inlined into the kernel of each materialized node that uses it, as index arithmetic
//! and scalar expressions: one loop nest per materialized node.

use std::collections::{HashMap, HashSet};

use tessera_ir::{
    DType, Data, DotDims, Graph, Literal, NodeId, Op, ReduceKind, RegionOp, TensorType,
};

use crate::kernel::{Combine, Cond, Coord, Expr, Kernel, Lin, Scalar, Start};

/// Where a buffer's contents come from.
#[derive(Clone, Debug)]
pub enum BufKind {
    /// The `i`-th input of the program.
    Input(usize),
    /// A constant baked into the executable.
    Constant(Literal),
    /// Written by a step; its memory is planned in the arena.
    Temp,
}

#[derive(Clone, Debug)]
pub struct Buf {
    pub ty: TensorType,
    pub kind: BufKind,
}

/// A matrix product on strided views, for the GEMM library: for every batch index,
/// `out[m, n] = sum_k lhs[m, k] * rhs[k, n]`. Strides are in elements.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmSpec {
    pub dtype: DType,
    /// Extent and (lhs, rhs, out) strides of each batch dim.
    pub batch: Vec<(usize, [isize; 3])>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// (row, col) strides: lhs is m x k, rhs k x n, out m x n.
    pub lhs: [isize; 2],
    pub rhs: [isize; 2],
    pub out: [isize; 2],
}

#[derive(Clone, Debug)]
pub enum StepKind {
    Kernel(Kernel),
    Gemm(GemmSpec),
    /// A collective op, run through the program's transport.
    Collective(Op),
    /// A region op: its bodies are compiled as programs of their own (`compile`) and run in
    /// place on this step's buffers by the region's control flow (`Executable::run_region`);
    /// it writes one buffer per result.
    Region(Box<RegionStep>),
    /// A conv or reduce_window, run by its native kernel (`window.rs`).
    Window(Box<crate::window::WindowStep>),
    /// A `sort`, run by a Rust kernel over whole buffers (`native.rs`).
    Native(Op),
}

/// A region step: the op (its layouts and bodies) and the buffer of each of its results.
#[derive(Clone, Debug)]
pub struct RegionStep {
    pub op: RegionOp,
    pub results: Vec<usize>,
}

/// One step: reads `inputs`, writes `output` (a region step: its token, and its results).
#[derive(Clone, Debug)]
pub struct Step {
    pub kind: StepKind,
    pub inputs: Vec<usize>,
    pub output: usize,
}

impl Step {
    /// Every buffer the step writes: its output, and a region step's results.
    pub fn writes(&self) -> Vec<usize> {
        let mut w = vec![self.output];
        if let StepKind::Region(r) = &self.kind {
            w.extend_from_slice(&r.results);
        }
        w
    }
}

/// The schedule of a program.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub bufs: Vec<Buf>,
    pub steps: Vec<Step>,
    /// The buffer of each program output.
    pub outputs: Vec<usize>,
}

fn row_major(dims: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as i64;
    }
    s
}

/// The deepest expression tree a kernel gets: a node whose inlined expression reaches this
/// depth is materialized, and its users load it. This bounds the recursion of fusion
/// (`Fuser::expr`), of the kernel IR's walks and drops, and of lowering (`lower.rs`), so a
/// chain of any length compiles on a small stack (a 100,000-op chain on a 2 MiB thread), and it
/// keeps each Cranelift function small. Real programs fuse far less (the seed MLP's training
/// step fuses at most 6 deep and 11 ops), so their schedules do not change.
pub const MAX_FUSED_DEPTH: usize = 128;

/// The most ops inlined into one kernel before a node is materialized: a kernel's expression
/// has fewer than `3 * MAX_FUSED_SIZE` ops (an op has at most three operands), however wide the
/// tree of single-use nodes feeding it.
pub const MAX_FUSED_SIZE: usize = 2048;

/// The most elements of a splat constant that is baked into the executable when it needs a
/// buffer (64 Ki elements, at most 512 KiB); a larger one is filled by a kernel at run time.
pub const MAX_BAKED_SPLAT: usize = 1 << 16;

struct Fuser<'a> {
    g: &'a Graph,
    materialized: HashMap<NodeId, usize>,
    sched: Schedule,
    /// The kernels that iterate finer dims than their result's (`Refinement`): a refined
    /// reshape's chain of readers, and the reshape itself, whichever get buffers.
    refined: HashMap<NodeId, Refinement>,
}

/// A reshape that only merges dims (`[128, 4, 2, 4, 2, 16]` to `[128, 8, 8, 16]`), of a
/// single-use elementwise result, read by an elementwise op: the reader's kernel iterates the
/// operand's finer dims, where the reshape is the identity and every other load of the
/// reader's expression is still affine (result dim `i` is `sum_j stride_j * var_j` over the
/// fine dims it merges), so the operand is inlined rather than written to a buffer. The
/// kernel writes its result in the same row-major order either way. The reader's own
/// single-use elementwise readers join the chain; its last gets the buffer. (A pool's
/// gradient: the cotangent routed to each window's maximum in the pool's 6-D shape, then
/// multiplied by the activation's gradient in the 4-D one.)
#[derive(Clone, Debug)]
struct Refinement {
    /// The operand's dims.
    operand: Vec<usize>,
    /// The kernel's loop: the operand's dims other than 1s.
    fine: Vec<usize>,
    /// For each dim of the reshape's result, the range of `fine` dims it merges.
    groups: Vec<std::ops::Range<usize>>,
}

impl Refinement {
    /// The refinement of `reshape` (with `users` counted, outputs included, and each node's
    /// `reader`) and its chain of readers, the first reading the reshape, each next the only
    /// reader of the one before; `None` where the operand needs a buffer.
    fn of(
        g: &Graph,
        reshape: NodeId,
        reader: &HashMap<NodeId, NodeId>,
        users: &HashMap<NodeId, usize>,
    ) -> Option<(Vec<NodeId>, Refinement)> {
        let operand = g.operands(reshape)[0];
        let single = |id: NodeId| users.get(&id).copied() == Some(1) && !g.outputs().contains(&id);
        if !single(operand) || !single(reshape) || !is_elementwise(g.op(operand)) {
            return None;
        }
        let coarse = g.ty(reshape).dims();
        let joins = |id: NodeId| is_elementwise(g.op(id)) && g.ty(id).dims() == coarse;
        let mut chain = vec![*reader.get(&reshape).filter(|&&r| joins(r))?];
        while let Some(&last) = chain.last()
            && single(last)
            && let Some(&next) = reader.get(&last)
            && joins(next)
        {
            chain.push(next);
        }
        let dims = g.ty(operand).dims();
        if dims.contains(&0) {
            return None;
        }
        // Each coarse dim the product of the next run of the operand's dims, counted without
        // its 1s (the loop's dims).
        let fine: Vec<usize> = dims.iter().copied().filter(|&d| d != 1).collect();
        let mut groups = Vec::with_capacity(coarse.len());
        let mut j = 0;
        for &d in coarse {
            let start = j;
            let mut p = 1usize;
            while p < d && j < fine.len() {
                p = p.checked_mul(fine[j])?;
                j += 1;
            }
            if p != d {
                return None;
            }
            groups.push(start..j);
        }
        if j != fine.len() {
            return None;
        }
        // The loop's outermost and innermost dims are the result's (or the result's are 1):
        // the kernel splits over the threads by the one and vectorizes along the other as
        // before, or better.
        let whole = |r: Option<&std::ops::Range<usize>>| r.is_none_or(|r| r.len() <= 1);
        if !whole(groups.first()) || !whole(groups.last()) {
            return None;
        }
        let operand = dims.to_vec();
        Some((
            chain,
            Refinement {
                operand,
                fine,
                groups,
            },
        ))
    }

    /// Whether `self` and `other` refine to the same loop and coordinates.
    fn same(&self, other: &Refinement) -> bool {
        self.operand == other.operand && self.fine == other.fine && self.groups == other.groups
    }

    /// The operand's coordinates over the loop's variables (0 along its dims of 1).
    fn operand_map(&self) -> Vec<Lin> {
        let n = self.fine.len();
        let mut next = 0;
        self.operand
            .iter()
            .map(|&d| {
                if d == 1 {
                    Lin::zero(n)
                } else {
                    next += 1;
                    Lin::var(n, next - 1)
                }
            })
            .collect()
    }

    /// The coarse dims' coordinates over the fine loop's variables.
    fn coarse_map(&self) -> Vec<Lin> {
        let n = self.fine.len();
        let strides = row_major(&self.fine);
        self.groups
            .iter()
            .map(|r| {
                let mut l = Lin::zero(n);
                for j in r.clone() {
                    l.coef[j] = strides[j] / strides[r.end - 1];
                }
                l
            })
            .collect()
    }
}

/// Whether `op` computes each element from its operands' elements at the same index.
fn is_elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_)
    )
}

/// Builds the schedule of `g` (see the module doc).
pub fn fuse(g: &Graph) -> Schedule {
    let order = g.topo_order();
    let mut users: HashMap<NodeId, usize> = HashMap::new();
    let mut forced: HashSet<NodeId> = HashSet::new();
    // Each node's reader (the last one seen: `Refinement` follows single-use nodes only).
    let mut reader: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in &order {
        for o in g.operands(id) {
            *users.entry(o).or_default() += 1;
            reader.insert(o, id);
        }
        // Operands that must be buffers: what a kernel cannot index affinely, a GEMM's
        // operands, and what the transport reads and writes as whole buffers.
        let must_be_buffers = match g.op(id) {
            Op::DotGeneral(dd) => !is_outer_product(dd, g.ty(g.operands(id)[0])),
            // Decided once every node's users are counted (`Refinement`).
            Op::Reshape(_) => false,
            Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Collective(_)
            | Op::Region(_)
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Sort { .. } => true,
            // A scan evaluates its operand's expression once per element, in order.
            Op::Cumulative { .. } => false,
            // The operand is read at data-dependent coordinates (a scatter's is copied into
            // its result first); the indices and updates may be inlined.
            Op::Gather(_) | Op::Scatter(_) => {
                forced.insert(g.operands(id)[0]);
                false
            }
            Op::Rev { .. } => false,
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::GetResult { .. } => false,
        };
        if must_be_buffers {
            forced.extend(g.operands(id));
        }
    }
    for &o in g.outputs() {
        *users.entry(o).or_default() += 1;
    }
    // A reshape's operand gets a buffer, unless the reshape is refined into its readers'
    // kernel (`Refinement`; a chain refined one way only), whose last reader gets the buffer.
    let mut refined: HashMap<NodeId, Refinement> = HashMap::new();
    for &id in &order {
        if let Op::Reshape(_) = g.op(id) {
            let fits = |chain: &[NodeId], r: &Refinement| {
                chain
                    .iter()
                    .all(|c| refined.get(c).is_none_or(|other| other.same(r)))
            };
            match Refinement::of(g, id, &reader, &users) {
                Some((chain, r)) if fits(&chain, &r) => {
                    forced.extend(chain.last());
                    for c in chain {
                        refined.insert(c, r.clone());
                    }
                    refined.insert(id, r);
                }
                Some(_) | None => {
                    forced.insert(g.operands(id)[0]);
                }
            }
        }
    }
    let mut f = Fuser {
        g,
        materialized: HashMap::new(),
        sched: Schedule {
            bufs: Vec::new(),
            steps: Vec::new(),
            outputs: Vec::new(),
        },
        refined,
    };
    // Free to recompute in every user: splat constants, iota, views of such or of buffers, and
    // small arithmetic without transcendental functions (as XLA duplicates cheap producers
    // rather than writing them out).
    let mut cheap: HashMap<NodeId, bool> = HashMap::new();
    // For a node that would be inlined: its expression size, and whether it calls a
    // transcendental function somewhere inside.
    let mut size: HashMap<NodeId, (usize, bool)> = HashMap::new();
    // For a node that would be inlined: the depth of its expression tree (the nodes on the
    // longest path down to a load or a constant, both included).
    let mut depth: HashMap<NodeId, usize> = HashMap::new();
    for &id in &order {
        let op = g.op(id);
        let decide = match op {
            Op::Parameter(i) => {
                f.add_buf(id, BufKind::Input(*i));
                continue;
            }
            Op::Constant(lit) if !lit.data.is_splat() || lit.data.is_empty() => {
                f.add_buf(id, BufKind::Constant(lit.clone()));
                continue;
            }
            Op::DotGeneral(dd) if !is_outer_product(dd, g.ty(g.operands(id)[0])) => true,
            Op::Scatter(_) => true,
            Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::Collective(_)
            | Op::Region(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. } => true,
            Op::Conv(_) | Op::ReduceWindow { .. } => true,
            // Its buffer is one of the results its region's step writes.
            Op::GetResult { .. } => continue,
            // Inlined into its users unless a rule below writes it out.
            Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
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
            | Op::DotGeneral(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Gather(_)
            | Op::Rev { .. } => {
                let (mut n, mut heavy, mut d) = (1, is_transcendental(op), 1);
                for o in g.operands(id) {
                    if f.materialized.contains_key(&o) {
                        // A load.
                        d = d.max(2);
                    } else {
                        let (on, oh) = size.get(&o).copied().unwrap_or((1, false));
                        n += on;
                        heavy |= oh;
                        d = d.max(1 + depth.get(&o).copied().unwrap_or(1));
                    }
                }
                size.insert(id, (n, heavy));
                depth.insert(id, d);
                let is_cheap = match op {
                    Op::Constant(_) | Op::Iota { .. } => true,
                    Op::BroadcastInDim { .. }
                    | Op::Transpose(_)
                    | Op::Slice { .. }
                    | Op::ShardingConstraint(_)
                    | Op::StopGradient
                    | Op::Rev { .. } => {
                        let o = g.operands(id)[0];
                        f.materialized.contains_key(&o) || cheap.get(&o).copied().unwrap_or(false)
                    }
                    Op::Unary(_)
                    | Op::Binary(_)
                    | Op::Compare(_)
                    | Op::Select
                    | Op::Convert(_)
                    | Op::DotGeneral(_) => !heavy && n <= 8,
                    Op::Bitcast(_)
                    | Op::Reshape(_)
                    | Op::Concatenate { .. }
                    | Op::Pad { .. }
                    | Op::Gather(_) => false,
                    // Written out above, never inlined.
                    Op::Parameter(_)
                    | Op::Reduce { .. }
                    | Op::ArgMax { .. }
                    | Op::Collective(_)
                    | Op::Region(_)
                    | Op::GetResult { .. }
                    | Op::Conv(_)
                    | Op::ReduceWindow { .. }
                    | Op::Scatter(_)
                    | Op::Sort { .. }
                    | Op::Cumulative { .. } => false,
                };
                cheap.insert(id, is_cheap);
                forced.contains(&id)
                    || g.outputs().contains(&id)
                    || (users.get(&id).copied().unwrap_or(0) > 1 && !is_cheap)
                    // The bound on every kernel's expression tree (see `MAX_FUSED_DEPTH`).
                    || d >= MAX_FUSED_DEPTH
                    || n >= MAX_FUSED_SIZE
            }
        };
        if decide {
            f.materialize(id);
        }
    }
    f.sched.outputs = g.outputs().iter().map(|o| f.materialized[o]).collect();
    // Elementwise kernels over their result's own elements run as one loop over them.
    for step in &mut f.sched.steps {
        if let StepKind::Kernel(k) = &mut step.kind
            && let Some(flat) = k.flattened()
        {
            *k = flat;
        }
    }
    f.sched
}

impl Fuser<'_> {
    fn add_buf(&mut self, id: NodeId, kind: BufKind) -> usize {
        let b = self.sched.bufs.len();
        self.sched.bufs.push(Buf {
            ty: self.g.ty(id).clone(),
            kind,
        });
        self.materialized.insert(id, b);
        b
    }

    /// Emits the step that computes `id` into a new buffer.
    fn materialize(&mut self, id: NodeId) {
        let g = self.g;
        let ty = g.ty(id).clone();
        let operands = g.operands(id);
        let op = g.op(id).clone();
        let name = format!("{}_{}", op.name(), self.sched.steps.len());
        if let Op::Constant(lit) = &op
            && ty.numel() <= MAX_BAKED_SPLAT
        {
            // A small splat that must be a buffer (a region's operand, an output) is baked into
            // the executable: no kernel to compile for it.
            self.add_buf(id, BufKind::Constant(lit.clone()));
            return;
        }
        let (kind, inputs) = match &op {
            Op::Region(r) => {
                let inputs: Vec<usize> =
                    operands.iter().map(|o| self.materialized_buf(*o)).collect();
                let types = g
                    .result_types(id)
                    .expect("a verified region's operands fit its bodies");
                // One buffer per result; a `get_result` reads its result's buffer.
                let results: Vec<usize> = types
                    .into_iter()
                    .map(|ty| {
                        let b = self.sched.bufs.len();
                        self.sched.bufs.push(Buf {
                            ty,
                            kind: BufKind::Temp,
                        });
                        b
                    })
                    .collect();
                for user in g.users(id) {
                    if let Op::GetResult { index, .. } = g.op(user) {
                        self.materialized.insert(user, results[*index]);
                    }
                }
                let step = RegionStep {
                    op: (**r).clone(),
                    results,
                };
                (StepKind::Region(Box::new(step)), inputs)
            }
            // Materialized by its region (above), never here.
            Op::GetResult { .. } => return,
            Op::Collective(_) => {
                let inputs = operands.iter().map(|o| self.materialized_buf(*o)).collect();
                (StepKind::Collective(op.clone()), inputs)
            }
            Op::Conv(cd) => {
                let inputs = operands.iter().map(|o| self.materialized_buf(*o)).collect();
                let step = crate::window::WindowStep::Conv {
                    dims: (**cd).clone(),
                    lhs: g.ty(operands[0]).clone(),
                    rhs: g.ty(operands[1]).clone(),
                    out: ty.clone(),
                    plan: Default::default(),
                };
                (StepKind::Window(Box::new(step)), inputs)
            }
            Op::ReduceWindow { kind, win } if window_as_kernel(win, g.ty(operands[0]), &ty) => {
                let mut inputs = Vec::new();
                let k = self.reduce_window_kernel(name, operands[0], *kind, win, &ty, &mut inputs);
                (StepKind::Kernel(k), inputs)
            }
            Op::ReduceWindow { kind, win } => {
                let inputs = vec![self.materialized_buf(operands[0])];
                let step = crate::window::WindowStep::ReduceWindow {
                    kind: *kind,
                    win: (**win).clone(),
                    operand: g.ty(operands[0]).clone(),
                    out: ty.clone(),
                    plan: Default::default(),
                };
                (StepKind::Window(Box::new(step)), inputs)
            }
            Op::Scatter(sd) => {
                let mut inputs = Vec::new();
                let k = self.scatter_kernel(name, sd, &operands, &ty, &mut inputs);
                (StepKind::Kernel(k), inputs)
            }
            Op::Sort { .. } => {
                let inputs = operands.iter().map(|o| self.materialized_buf(*o)).collect();
                (StepKind::Native(op.clone()), inputs)
            }
            // Along the outermost dim that is not 1, each operand (a buffer: row-major, dense)
            // is one block of the result: block copies, no guarded loads per element.
            Op::Concatenate { dim } if ty.dims()[..*dim].iter().all(|&d| d == 1) => {
                let inputs = operands.iter().map(|o| self.materialized_buf(*o)).collect();
                (StepKind::Native(op.clone()), inputs)
            }
            Op::Cumulative {
                kind,
                axis,
                reverse,
            } => {
                let n = ty.rank();
                let map: Vec<Lin> = (0..n).map(|j| Lin::var(n, j)).collect();
                let mut inputs = Vec::new();
                let body = self.expr(operands[0], &map, n, &mut inputs);
                let op = match kind {
                    tessera_ir::CumulativeKind::Sum => tessera_ir::BinaryOp::Add,
                    tessera_ir::CumulativeKind::Prod => tessera_ir::BinaryOp::Mul,
                    tessera_ir::CumulativeKind::Max => tessera_ir::BinaryOp::Max,
                    tessera_ir::CumulativeKind::Min => tessera_ir::BinaryOp::Min,
                };
                let k = Kernel {
                    name,
                    out_dtype: ty.dtype,
                    out_dims: ty.dims().to_vec(),
                    reduce: None,
                    body,
                    n_inputs: inputs.len(),
                    scatter: None,
                    scan: Some(crate::kernel::Scan {
                        op,
                        axis: *axis,
                        reverse: *reverse,
                    }),
                };
                (StepKind::Kernel(k), inputs)
            }
            Op::DotGeneral(dd) if !is_outer_product(dd, g.ty(operands[0])) => {
                if let Some(mk) = column_product(dd, g.ty(operands[0]), g.ty(operands[1])) {
                    let mut inputs = Vec::new();
                    let ops = (operands[0], operands[1]);
                    let k = self.column_kernel(name, ops, dd, mk, &ty, &mut inputs);
                    (StepKind::Kernel(k), inputs)
                } else {
                    let (l, r) = (
                        self.materialized_buf(operands[0]),
                        self.materialized_buf(operands[1]),
                    );
                    match gemm_spec(dd, g.ty(operands[0]), g.ty(operands[1]), &ty) {
                        Some(spec) => (StepKind::Gemm(spec), vec![l, r]),
                        None => {
                            let mut inputs = Vec::new();
                            let k = self.dot_kernel(
                                name,
                                dd,
                                operands[0],
                                operands[1],
                                &ty,
                                &mut inputs,
                            );
                            (StepKind::Kernel(k), inputs)
                        }
                    }
                }
            }
            Op::Reduce { kind, axes } => {
                let mut inputs = Vec::new();
                let k =
                    self.reduce_kernel(name, operands[0], axes, combine(*kind), &ty, &mut inputs);
                (StepKind::Kernel(k), inputs)
            }
            Op::ArgMax { axis } => {
                let mut inputs = Vec::new();
                let k = self.reduce_kernel(
                    name,
                    operands[0],
                    &[*axis],
                    Combine::ArgMax,
                    &ty,
                    &mut inputs,
                );
                (StepKind::Kernel(k), inputs)
            }
            // One elementwise kernel over the result's index space.
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
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
            | Op::DotGeneral(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Gather(_)
            | Op::Rev { .. } => {
                let (out_dims, map) = match self.refined.get(&id) {
                    Some(r) => (r.fine.clone(), r.coarse_map()),
                    None => {
                        let n = ty.rank();
                        (ty.dims().to_vec(), (0..n).map(|j| Lin::var(n, j)).collect())
                    }
                };
                let n = out_dims.len();
                let mut inputs = Vec::new();
                let body = self.expr_inner(id, &map, n, &mut inputs);
                let k = Kernel {
                    name,
                    out_dtype: ty.dtype,
                    out_dims,
                    reduce: None,
                    body,
                    n_inputs: inputs.len(),
                    scatter: None,
                    scan: None,
                };
                (StepKind::Kernel(k), inputs)
            }
        };
        let output = self.add_buf(id, BufKind::Temp);
        self.sched.steps.push(Step {
            kind,
            inputs,
            output,
        });
    }

    fn materialized_buf(&self, id: NodeId) -> usize {
        self.materialized[&id]
    }

    /// The kernel input slot of buffer `b`, adding it on first use.
    fn slot(inputs: &mut Vec<usize>, b: usize) -> usize {
        match inputs.iter().position(|&x| x == b) {
            Some(i) => i,
            None => {
                inputs.push(b);
                inputs.len() - 1
            }
        }
    }

    /// The value of node `id` at the index whose coordinates are `map`, over `nvars` loop
    /// variables: a load when `id` has a buffer, else its op inlined.
    fn expr(&mut self, id: NodeId, map: &[Lin], nvars: usize, inputs: &mut Vec<usize>) -> Expr {
        if let Some(&b) = self.materialized.get(&id) {
            let ty = self.g.ty(id);
            return load(Self::slot(inputs, b), ty.dtype, row_major(ty.dims()), map);
        }
        self.expr_inner(id, map, nvars, inputs)
    }

    /// Node `id`'s own op applied to its operands' expressions. This `match` only dispatches,
    /// by op family: elementwise ops build one scalar expression of their operands at the same
    /// index (`elementwise`), movement ops rewrite the index (`*_map`) or read their operand's
    /// buffer (`reshape_expr`, `pad_expr`, `concatenate_expr`), and ops with a buffer of their
    /// own are loaded (`buffer_load`).
    fn expr_inner(
        &mut self,
        id: NodeId,
        map: &[Lin],
        nvars: usize,
        inputs: &mut Vec<usize>,
    ) -> Expr {
        let g = self.g;
        let ops = g.operands(id);
        let dt = g.ty(id).dtype;
        match g.op(id).clone() {
            Op::Constant(lit) => Expr::Const(dt, scalar_of(&lit.data)),
            Op::Iota { dim, .. } => Expr::Index(dt, map[dim].clone()),
            Op::Unary(u) => self.elementwise(&ops, map, nvars, inputs, |[x]| Expr::Unary(u, dt, x)),
            Op::Binary(b) => {
                self.elementwise(&ops, map, nvars, inputs, |[x, y]| Expr::Binary(b, dt, x, y))
            }
            Op::Compare(c) => {
                let from = g.ty(ops[0]).dtype;
                self.elementwise(&ops, map, nvars, inputs, |[x, y]| {
                    Expr::Compare(c, from, x, y)
                })
            }
            Op::Select => self.elementwise(&ops, map, nvars, inputs, |[p, t, f]| {
                Expr::Select(dt, p, t, f)
            }),
            Op::Convert(to) => {
                let from = g.ty(ops[0]).dtype;
                self.elementwise(&ops, map, nvars, inputs, |[x]| Expr::Convert {
                    from,
                    to,
                    x,
                })
            }
            Op::Bitcast(to) => {
                let from = g.ty(ops[0]).dtype;
                self.elementwise(&ops, map, nvars, inputs, |[x]| Expr::Bitcast {
                    from,
                    to,
                    x,
                })
            }
            Op::BroadcastInDim { dims, .. } => {
                let m = broadcast_map(g.ty(ops[0]).dims(), &dims, map, nvars);
                self.expr(ops[0], &m, nvars, inputs)
            }
            Op::Transpose(perm) => {
                self.expr(ops[0], &transpose_map(&perm, map, nvars), nvars, inputs)
            }
            Op::Slice { start, stride, .. } => {
                self.expr(ops[0], &slice_map(&start, &stride, map), nvars, inputs)
            }
            Op::ShardingConstraint(_) | Op::StopGradient => self.expr(ops[0], map, nvars, inputs),
            Op::Rev { dims } => {
                let from = g.ty(ops[0]).dims().to_vec();
                self.expr(ops[0], &rev_map(&dims, &from, map), nvars, inputs)
            }
            // Every contracting dim has size 1: a broadcast product, fused like elementwise ops.
            Op::DotGeneral(dd) if is_outer_product(&dd, g.ty(ops[0])) => {
                let (lmap, rmap) = outer_product_maps(&dd, g.ty(ops[0]), g.ty(ops[1]), map, nvars);
                let x = self.expr(ops[0], &lmap, nvars, inputs);
                let y = self.expr(ops[1], &rmap, nvars, inputs);
                Expr::Binary(tessera_ir::BinaryOp::Mul, dt, Box::new(x), Box::new(y))
            }
            Op::Reshape(shape) => self.reshape_expr(id, ops[0], &shape, map, inputs),
            Op::Pad { low, interior, .. } => {
                self.pad_expr(ops[0], ops[1], &low, &interior, dt, map, nvars, inputs)
            }
            Op::Concatenate { dim } => self.concatenate_expr(ops, dim, dt, map, inputs),
            Op::Gather(gd) => self.gather_expr(ops[0], ops[1], &gd, dt, map, nvars, inputs),
            Op::Parameter(_)
            | Op::DotGeneral(_)
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::Collective(_)
            | Op::Region(_)
            | Op::GetResult { .. }
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. } => self.buffer_load(id, map, inputs),
        }
    }

    /// An elementwise op: `build` applied to the expressions of its `N` operands, all at the
    /// result's index (built in operand order, which fixes the kernel's input slots).
    fn elementwise<const N: usize>(
        &mut self,
        ops: &[NodeId],
        map: &[Lin],
        nvars: usize,
        inputs: &mut Vec<usize>,
        build: impl FnOnce([Box<Expr>; N]) -> Expr,
    ) -> Expr {
        let args: Vec<Box<Expr>> = ops[..N]
            .iter()
            .map(|&o| Box::new(self.expr(o, map, nvars, inputs)))
            .collect();
        let args: [Box<Expr>; N] = args
            .try_into()
            .expect("an elementwise op has as many operands as its arity");
        build(args)
    }

    /// The value of a node that has its own buffer (fusion forces it): a plain load.
    fn buffer_load(&mut self, id: NodeId, map: &[Lin], inputs: &mut Vec<usize>) -> Expr {
        let b = self.materialized_buf(id);
        let ty = self.g.ty(id);
        load(Self::slot(inputs, b), ty.dtype, row_major(ty.dims()), map)
    }

    /// The operand is a buffer (fusion forces it): the reshape reads it at the row-major
    /// offset of the reshaped index. Or it is refined (`Refinement`): the kernel iterates the
    /// operand's dims, and the operand's expression is inlined at them.
    fn reshape_expr(
        &mut self,
        reshape: NodeId,
        operand: NodeId,
        shape: &tessera_ir::Shape,
        map: &[Lin],
        inputs: &mut Vec<usize>,
    ) -> Expr {
        let Some(&b) = self.materialized.get(&operand) else {
            // A refined reshape (`Refinement`): only its readers' kernel (or its own) reads
            // it, iterating the operand's dims (1s aside), where it is the identity.
            let r = self.refined.get(&reshape).filter(|r| r.coarse_map() == map);
            let r = r.expect("fusion: a reshape's operand unbuffered outside its refined kernel");
            let (at, n) = (r.operand_map(), r.fine.len());
            return self.expr(operand, &at, n, inputs);
        };
        load(
            Self::slot(inputs, b),
            self.g.ty(operand).dtype,
            row_major(shape.dims()),
            map,
        )
    }

    /// `pad operand, value`: a guarded load of the operand's buffer, `value` elsewhere.
    #[allow(clippy::too_many_arguments)]
    fn pad_expr(
        &mut self,
        operand: NodeId,
        value: NodeId,
        low: &[i64],
        interior: &[usize],
        dt: DType,
        map: &[Lin],
        nvars: usize,
        inputs: &mut Vec<usize>,
    ) -> Expr {
        let src = self.g.ty(operand).clone();
        // An empty input is never read: every element is padding (a guarded load would be
        // clamped into an empty range, to -1).
        if src.numel() == 0 {
            return self.expr(value, &[], nvars, inputs);
        }
        let b = self.materialized_buf(operand);
        let mut conds = Vec::new();
        let mut coords = Vec::new();
        for d in 0..src.rank() {
            let lin = map[d].offset(-low[d]);
            let div = interior[d] as i64 + 1;
            let extent = src.dims()[d] as i64;
            conds.push(Cond {
                lin: lin.clone(),
                div,
                extent,
            });
            coords.push(Coord {
                lin,
                div,
                clamp: Some(extent),
            });
        }
        let then = Expr::Load {
            buf: Self::slot(inputs, b),
            dtype: src.dtype,
            strides: row_major(src.dims()),
            coords,
        };
        let value = self.expr(value, &[], nvars, inputs);
        Expr::Guard {
            dtype: dt,
            conds,
            then: Box::new(then),
            otherwise: Box::new(value),
        }
    }

    /// `gather operand, indices` at the result index `map`: a load of the operand's buffer
    /// whose indexed dims start where the indices say (`Expr::Gather`), the indices' own
    /// producers inlined.
    #[allow(clippy::too_many_arguments)]
    fn gather_expr(
        &mut self,
        operand: NodeId,
        indices: NodeId,
        gd: &tessera_ir::GatherDims,
        dt: DType,
        map: &[Lin],
        nvars: usize,
        inputs: &mut Vec<usize>,
    ) -> Expr {
        let src = self.g.ty(operand).clone();
        // An empty operand means an empty result (a non-empty slice of every operand dim is
        // needed for one element): the expression is never evaluated.
        if src.numel() == 0 {
            return Expr::Const(dt, scalar_of(&Data::zeros(dt, 1)));
        }
        let b = self.materialized_buf(operand);
        let buf = Self::slot(inputs, b);
        let (coords, starts) = self.gather_map(src.dims(), indices, gd, map, nvars, inputs);
        let fill = match gd.mode {
            tessera_ir::IndexMode::Clip => None,
            tessera_ir::IndexMode::Fill => Some(Box::new(Expr::Const(
                dt,
                scalar_of(&Data::splat(dt, gd.fill, 1)),
            ))),
        };
        Expr::Gather {
            buf,
            dtype: src.dtype,
            strides: row_major(src.dims()),
            coords,
            starts,
            fill,
        }
    }

    /// The operand coordinates a gather reads at result index `map` (`GatherDims::source`):
    /// the affine part of each operand dim, and the starts read from `indices` (inlined). The
    /// result dims split as the type rule says (`GatherDims::infer`): the offset dims walk the
    /// operand's window dims in order, the others the indices' dims but `index_vector_dim`; an
    /// operand batching dim is the coordinate of its indices dim.
    fn gather_map(
        &mut self,
        operand_dims: &[usize],
        indices: NodeId,
        gd: &tessera_ir::GatherDims,
        map: &[Lin],
        nvars: usize,
        inputs: &mut Vec<usize>,
    ) -> (Vec<Coord>, Vec<Start>) {
        let ity = self.g.ty(indices).clone();
        let (offset, batch): (Vec<usize>, Vec<usize>) =
            (0..map.len()).partition(|i| gd.offset_dims.contains(i));
        // The index into the indices at batch position `map`, index-vector entry left at 0.
        let mut imap = vec![Lin::zero(nvars); ity.rank()];
        let mut b = batch.iter();
        for (d, slot) in imap.iter_mut().enumerate() {
            if d != gd.index_vector_dim {
                *slot = map[*b.next().expect("one batch dim per indices dim")].clone();
            }
        }
        let mut coords: Vec<Lin> = vec![Lin::zero(nvars); operand_dims.len()];
        for (&o, &i) in gd
            .operand_batching_dims
            .iter()
            .zip(&gd.start_indices_batching_dims)
        {
            coords[o] = imap[i].clone();
        }
        let mut w = offset.iter();
        for (d, c) in coords.iter_mut().enumerate() {
            if !gd.collapsed_slice_dims.contains(&d) && !gd.operand_batching_dims.contains(&d) {
                *c = map[*w.next().expect("one offset dim per window dim")].clone();
            }
        }
        let mut starts = Vec::new();
        for (j, &d) in gd.start_index_map.iter().enumerate() {
            let mut at = imap.clone();
            if gd.index_vector_dim < ity.rank() {
                at[gd.index_vector_dim] = Lin::zero(nvars).offset(j as i64);
            }
            let index = self.expr(indices, &at, nvars, inputs);
            starts.push(Start {
                dim: d,
                index: Box::new(index),
                hi: operand_dims[d] as i64 - gd.slice_sizes[d] as i64,
            });
        }
        let coords = coords
            .into_iter()
            .map(|lin| Coord {
                lin,
                div: 1,
                clamp: None,
            })
            .collect();
        (coords, starts)
    }

    /// `scatter operand, indices, updates` as a kernel (`ScatterPhase`): a loop over the
    /// updates, each combined into the element the gather map of the updates names.
    fn scatter_kernel(
        &mut self,
        name: String,
        sd: &tessera_ir::ScatterDims,
        ops: &[NodeId],
        ty: &TensorType,
        inputs: &mut Vec<usize>,
    ) -> Kernel {
        let (operand, indices, updates) = (ops[0], ops[1], ops[2]);
        let uty = self.g.ty(updates).clone();
        let nvars = uty.rank();
        let map: Vec<Lin> = (0..nvars).map(|j| Lin::var(nvars, j)).collect();
        let ob = self.materialized_buf(operand);
        let operand_slot = Self::slot(inputs, ob);
        let gd = sd.as_gather(ty.rank(), uty.dims());
        let (coords, starts) = self.gather_map(ty.dims(), indices, &gd, &map, nvars, inputs);
        let body = self.expr(updates, &map, nvars, inputs);
        Kernel {
            name,
            out_dtype: ty.dtype,
            out_dims: uty.dims().to_vec(),
            reduce: None,
            body,
            n_inputs: inputs.len(),
            scatter: Some(Box::new(crate::kernel::ScatterPhase {
                kind: sd.kind,
                dims: ty.dims().to_vec(),
                operand: operand_slot,
                coords,
                starts,
                drop: sd.mode == tessera_ir::IndexMode::Fill,
            })),
            scan: None,
        }
    }

    /// `concatenate` along `dim`: a balanced tree of guarded loads (`concat_tree`).
    fn concatenate_expr(
        &mut self,
        ops: Vec<NodeId>,
        dim: usize,
        dt: DType,
        map: &[Lin],
        inputs: &mut Vec<usize>,
    ) -> Expr {
        let g = self.g;
        // An empty operand holds no coordinate of the result: it is never read (its
        // clamp range would be empty), so it takes no part in the guards.
        let ops: Vec<NodeId> = ops.into_iter().filter(|&o| g.ty(o).numel() > 0).collect();
        let mut offsets = Vec::new();
        let mut acc = 0i64;
        for &o in &ops {
            offsets.push(acc);
            acc += g.ty(o).dims()[dim] as i64;
        }
        offsets.push(acc);
        if ops.is_empty() {
            // With every operand empty the result is empty too, and the kernel's loops
            // run zero times: any expression of the right dtype will do.
            return Expr::Const(dt, scalar_of(&Data::zeros(dt, 1)));
        }
        // Input slots in the order of the former linear guard chain (last operand
        // first), so small concatenates keep their kernels.
        for &o in ops.iter().rev() {
            let b = self.materialized_buf(o);
            Self::slot(inputs, b);
        }
        self.concat_tree(&ops, &offsets, 0, ops.len(), dim, dt, map, inputs)
    }

    /// Operands `lo..hi` of a concatenate along `dim` (`offsets[k]` is where operand `k`
    /// starts, `offsets[hi]` where the last ends) as a balanced tree of guards: the index is
    /// in the first half's range, or else in the second half's. Each operand is a load with
    /// its concatenated coordinate clamped. The tree is `log2` of the operand count deep, so a
    /// concatenate of any number of tensors is a shallow expression (a chain of guards, one
    /// per operand, would be as deep as the operand count).
    #[allow(clippy::too_many_arguments)]
    fn concat_tree(
        &mut self,
        ops: &[NodeId],
        offsets: &[i64],
        lo: usize,
        hi: usize,
        dim: usize,
        dt: DType,
        map: &[Lin],
        inputs: &mut Vec<usize>,
    ) -> Expr {
        if hi - lo == 1 {
            let src = self.g.ty(ops[lo]).clone();
            let b = self.materialized_buf(ops[lo]);
            let extent = src.dims()[dim] as i64;
            let coords: Vec<Coord> = (0..src.rank())
                .map(|d| {
                    if d == dim {
                        Coord {
                            lin: map[d].offset(-offsets[lo]),
                            div: 1,
                            clamp: Some(extent),
                        }
                    } else {
                        Coord {
                            lin: map[d].clone(),
                            div: 1,
                            clamp: None,
                        }
                    }
                })
                .collect();
            return Expr::Load {
                buf: Self::slot(inputs, b),
                dtype: src.dtype,
                strides: row_major(src.dims()),
                coords,
            };
        }
        // The first half is the smaller one: up to three operands, the tree is the chain of
        // guards the kernels had before.
        let mid = lo + (hi - lo) / 2;
        let then = self.concat_tree(ops, offsets, lo, mid, dim, dt, map, inputs);
        let otherwise = self.concat_tree(ops, offsets, mid, hi, dim, dt, map, inputs);
        Expr::Guard {
            dtype: dt,
            conds: vec![Cond {
                lin: map[dim].offset(-offsets[lo]),
                div: 1,
                extent: offsets[mid] - offsets[lo],
            }],
            then: Box::new(then),
            otherwise: Box::new(otherwise),
        }
    }

    /// A reduction over `axes` of `operand`, its elementwise producers fused into the body.
    fn reduce_kernel(
        &mut self,
        name: String,
        operand: NodeId,
        axes: &[usize],
        how: Combine,
        ty: &TensorType,
        inputs: &mut Vec<usize>,
    ) -> Kernel {
        let src = self.g.ty(operand).clone();
        let kept: Vec<usize> = (0..src.rank()).filter(|d| !axes.contains(d)).collect();
        let nvars = kept.len() + axes.len();
        let mut map = vec![Lin::zero(nvars); src.rank()];
        for (j, &d) in kept.iter().enumerate() {
            map[d] = Lin::var(nvars, j);
        }
        for (j, &d) in axes.iter().enumerate() {
            map[d] = Lin::var(nvars, kept.len() + j);
        }
        let body = self.expr(operand, &map, nvars, inputs);
        Kernel {
            name,
            out_dtype: ty.dtype,
            out_dims: ty.dims().to_vec(),
            reduce: Some((how, axes.iter().map(|&a| src.dims()[a]).collect())),
            body,
            n_inputs: inputs.len(),
            scatter: None,
            scan: None,
        }
    }

    /// `reduce_window` as a reduction kernel (`window_as_kernel` says when): the result's dims,
    /// then one loop variable for each window dim longer than 1, innermost last, so each
    /// element combines its window in row-major window order from the combine's identity, the
    /// interpreter's order (`tessera_interp::conv::reduce_window`). Operand dim `d` is read at
    /// `stride * o + window_dilation * w - low`, divided by the base dilation; padding and
    /// dilation holes are guarded loads that give the identity, which the interpreter skips:
    /// the same result, since a maximum or minimum with its identity is unchanged and a sum
    /// starts from +0 and so is never -0, where adding +0 would change it.
    fn reduce_window_kernel(
        &mut self,
        name: String,
        operand: NodeId,
        kind: ReduceKind,
        win: &tessera_ir::WindowDims,
        ty: &TensorType,
        inputs: &mut Vec<usize>,
    ) -> Kernel {
        let src = self.g.ty(operand).clone();
        let r = src.rank();
        let reduced: Vec<usize> = (0..r).filter(|&d| win.window[d] != 1).collect();
        let nvars = r + reduced.len();
        let mut lins: Vec<Lin> = (0..r)
            .map(|d| {
                Lin::var(nvars, d)
                    .scale(win.strides[d] as i64)
                    .offset(-win.padding[d].0)
            })
            .collect();
        for (j, &d) in reduced.iter().enumerate() {
            let w = Lin::var(nvars, r + j).scale(win.window_dilation[d] as i64);
            lins[d] = lins[d].add(&w);
        }
        let how = combine(kind);
        let identity = match (how, src.dtype.is_float()) {
            (Combine::Sum, true) => Scalar::F(0.0),
            (Combine::Max, true) => Scalar::F(f64::NEG_INFINITY),
            (Combine::Min, true) => Scalar::F(f64::INFINITY),
            (Combine::Sum, false) => Scalar::I(0),
            (Combine::Max, false) => Scalar::I(crate::lower::int_range(src.dtype).0),
            (Combine::Min, false) => Scalar::I(crate::lower::int_range(src.dtype).1),
            (Combine::ArgMax, _) => unreachable!("a reduce_window sums, or takes a max or min"),
        };
        let guarded = win.padding.iter().any(|&(lo, hi)| lo != 0 || hi != 0)
            || win.base_dilation.iter().any(|&d| d != 1);
        let body = if src.numel() == 0 {
            // Every window is padding: nothing to read (a clamped load of an empty buffer
            // would have no element to read).
            Expr::Const(src.dtype, identity)
        } else {
            let b = Self::slot(inputs, self.materialized_buf(operand));
            let strides = row_major(src.dims());
            if guarded {
                let coords = (0..r)
                    .map(|d| Coord {
                        lin: lins[d].clone(),
                        div: win.base_dilation[d] as i64,
                        clamp: Some(src.dims()[d] as i64),
                    })
                    .collect();
                let conds = (0..r)
                    .map(|d| Cond {
                        lin: lins[d].clone(),
                        div: win.base_dilation[d] as i64,
                        extent: src.dims()[d] as i64,
                    })
                    .collect();
                Expr::Guard {
                    dtype: src.dtype,
                    conds,
                    then: Box::new(Expr::Load {
                        buf: b,
                        dtype: src.dtype,
                        strides,
                        coords,
                    }),
                    otherwise: Box::new(Expr::Const(src.dtype, identity)),
                }
            } else {
                load(b, src.dtype, strides, &lins)
            }
        };
        Kernel {
            name,
            out_dtype: ty.dtype,
            out_dims: ty.dims().to_vec(),
            reduce: Some((how, reduced.iter().map(|&d| win.window[d]).collect())),
            body,
            n_inputs: inputs.len(),
            scatter: None,
            scan: None,
        }
    }

    /// `column_product`'s matrix-vector product as a reduction kernel over the result's `m`
    /// elements (`[m]`: the result's unit dims dropped, the same bytes), summing the lhs's
    /// rows times the vector's elements in order: `out[j] = sum_i lhs[i, j] * v[i]`, the
    /// interpreter's order and roundings (separate multiply and add, from +0).
    fn column_kernel(
        &mut self,
        name: String,
        (l, r): (NodeId, NodeId),
        dd: &DotDims,
        (m, k): (usize, usize),
        ty: &TensorType,
        inputs: &mut Vec<usize>,
    ) -> Kernel {
        let nvars = 2;
        // Variable 0 is the result element `j`, variable 1 the row `i` summed over.
        let lmap = vec![Lin::var(nvars, 1), Lin::var(nvars, 0)];
        let rt = self.g.ty(r).clone();
        let rmap: Vec<Lin> = (0..rt.rank())
            .map(|d| {
                if dd.rhs_contract.contains(&d) {
                    Lin::var(nvars, 1)
                } else {
                    Lin::zero(nvars)
                }
            })
            .collect();
        let x = self.expr(l, &lmap, nvars, inputs);
        let y = self.expr(r, &rmap, nvars, inputs);
        Kernel {
            name,
            out_dtype: ty.dtype,
            out_dims: vec![m],
            reduce: Some((Combine::Sum, vec![k])),
            body: Expr::Binary(
                tessera_ir::BinaryOp::Mul,
                ty.dtype,
                Box::new(x),
                Box::new(y),
            ),
            n_inputs: inputs.len(),
            scatter: None,
            scan: None,
        }
    }

    /// A `dot_general` as a loop nest: the result's indices, then the contracting ones.
    fn dot_kernel(
        &mut self,
        name: String,
        dd: &DotDims,
        l: NodeId,
        r: NodeId,
        ty: &TensorType,
        inputs: &mut Vec<usize>,
    ) -> Kernel {
        let (lt, rt) = (self.g.ty(l).clone(), self.g.ty(r).clone());
        let nb = dd.lhs_batch.len();
        let lfree = dd.lhs_free(lt.rank());
        let rfree = dd.rhs_free(rt.rank());
        let nout = ty.rank();
        let nvars = nout + dd.lhs_contract.len();
        let mut lmap = vec![Lin::zero(nvars); lt.rank()];
        let mut rmap = vec![Lin::zero(nvars); rt.rank()];
        for (i, (&a, &b)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
            lmap[a] = Lin::var(nvars, i);
            rmap[b] = Lin::var(nvars, i);
        }
        for (j, &a) in lfree.iter().enumerate() {
            lmap[a] = Lin::var(nvars, nb + j);
        }
        for (j, &b) in rfree.iter().enumerate() {
            rmap[b] = Lin::var(nvars, nb + lfree.len() + j);
        }
        for (k, (&a, &b)) in dd.lhs_contract.iter().zip(&dd.rhs_contract).enumerate() {
            lmap[a] = Lin::var(nvars, nout + k);
            rmap[b] = Lin::var(nvars, nout + k);
        }
        let x = self.expr(l, &lmap, nvars, inputs);
        let y = self.expr(r, &rmap, nvars, inputs);
        Kernel {
            name,
            out_dtype: ty.dtype,
            out_dims: ty.dims().to_vec(),
            reduce: Some((
                Combine::Sum,
                dd.lhs_contract.iter().map(|&a| lt.dims()[a]).collect(),
            )),
            body: Expr::Binary(
                tessera_ir::BinaryOp::Mul,
                ty.dtype,
                Box::new(x),
                Box::new(y),
            ),
            n_inputs: inputs.len(),
            scatter: None,
            scan: None,
        }
    }
}

/// The operand index a `broadcast_in_dim` reads at the result index `map`: result dim
/// `dims[i]` for operand dim `i`, 0 where the operand dim has size 1.
fn broadcast_map(from: &[usize], dims: &[usize], map: &[Lin], nvars: usize) -> Vec<Lin> {
    dims.iter()
        .enumerate()
        .map(|(i, &d)| {
            if from[i] == 1 {
                Lin::zero(nvars)
            } else {
                map[d].clone()
            }
        })
        .collect()
}

/// The operand index a `transpose` reads: operand dim `perm[i]` is result dim `i`.
fn transpose_map(perm: &[usize], map: &[Lin], nvars: usize) -> Vec<Lin> {
    let mut m = vec![Lin::zero(nvars); perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        m[p] = map[i].clone();
    }
    m
}

/// The operand index a `slice` reads: `start + stride * i` in every dim.
/// The operand index of `rev` at result index `map`: `size - 1 - i` along each reversed dim.
fn rev_map(dims: &[usize], from: &[usize], map: &[Lin]) -> Vec<Lin> {
    map.iter()
        .enumerate()
        .map(|(d, l)| {
            if dims.contains(&d) {
                l.scale(-1).offset(from[d] as i64 - 1)
            } else {
                l.clone()
            }
        })
        .collect()
}

fn slice_map(start: &[usize], stride: &[usize], map: &[Lin]) -> Vec<Lin> {
    map.iter()
        .enumerate()
        .map(|(d, l)| l.scale(stride[d] as i64).offset(start[d] as i64))
        .collect()
}

/// The lhs and rhs indices of an outer-product `dot_general` at the result index `map`
/// (batch dims, then the lhs free dims, then the rhs free dims; contracting dims are 0).
fn outer_product_maps(
    dd: &DotDims,
    lt: &TensorType,
    rt: &TensorType,
    map: &[Lin],
    nvars: usize,
) -> (Vec<Lin>, Vec<Lin>) {
    let nb = dd.lhs_batch.len();
    let lfree = dd.lhs_free(lt.rank());
    let rfree = dd.rhs_free(rt.rank());
    let mut lmap = vec![Lin::zero(nvars); lt.rank()];
    let mut rmap = vec![Lin::zero(nvars); rt.rank()];
    for (i, (&a, &b)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
        lmap[a] = map[i].clone();
        rmap[b] = map[i].clone();
    }
    for (j, &a) in lfree.iter().enumerate() {
        lmap[a] = map[nb + j].clone();
    }
    for (j, &b) in rfree.iter().enumerate() {
        rmap[b] = map[nb + lfree.len() + j].clone();
    }
    (lmap, rmap)
}

/// A `dot_general` that contracts nothing but size-1 dims: an elementwise product.
fn is_outer_product(dd: &DotDims, lhs: &TensorType) -> bool {
    dd.lhs_contract.iter().all(|&d| lhs.dims()[d] == 1)
}

/// The multiply-adds below which `column_product` applies: the size below which a GEMM runs
/// on one core anyway (`exec`'s `PARALLEL_GEMM_FROM`); a reduction kernel is one core's.
const COLUMN_PRODUCT_BELOW: usize = 64 * 64 * 64;

/// `(m, k)` when an f32 `dot_general` is a matrix-vector product summed down the rows of a
/// `[k, m]` lhs (`out[j] = sum_i lhs[i, j] v[i]`, the rhs's other dims all 1: a one-output
/// layer's weight gradient `h^T g`) with `m` small enough for the result to stay in
/// registers (`lower::REGISTER_LANES`) and the product small (`COLUMN_PRODUCT_BELOW`): a
/// reduction kernel over contiguous rows then beats
/// the GEMM library, whose packing and dispatch dominate such a product (the seed step's
/// `h^T g`, 32 x 1 x 256: 1.2 us through the gemm crate).
fn column_product(dd: &DotDims, lt: &TensorType, rt: &TensorType) -> Option<(usize, usize)> {
    let (ld, rd) = (lt.dims(), rt.dims());
    let f32s = lt.dtype == DType::F32 && rt.dtype == DType::F32;
    let rhs_vector = dd.rhs_free(rd.len()).iter().all(|&d| rd[d] == 1);
    let fits = f32s
        && dd.lhs_batch.is_empty()
        && ld.len() == 2
        && dd.lhs_contract == [0]
        && dd.rhs_contract.len() == 1
        && rhs_vector
        && ld[1] <= crate::lower::REGISTER_LANES
        && ld[0].saturating_mul(ld[1]) < COLUMN_PRODUCT_BELOW;
    fits.then(|| (ld[1], ld[0]))
}

/// Ops whose inline code is long (polynomial approximations or calls): never duplicated.
pub(crate) fn is_transcendental(op: &Op) -> bool {
    use tessera_ir::{BinaryOp, UnaryOp};
    match op {
        Op::Unary(u) => match u {
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not => false,
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Expm1
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Erf
            | UnaryOp::ErfInv
            | UnaryOp::Tan
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
        Op::Binary(b) => match b {
            BinaryOp::Pow | BinaryOp::Rem | BinaryOp::Atan2 => true,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRightLogical => false,
        },
        Op::Parameter(_)
        | Op::Constant(_)
        | Op::Iota { .. }
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
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::DotGeneral(_)
        | Op::Collective(_)
        | Op::ShardingConstraint(_)
        | Op::StopGradient
        | Op::Region(_)
        | Op::GetResult { .. }
        | Op::Conv(_)
        | Op::ReduceWindow { .. }
        | Op::Gather(_)
        | Op::Scatter(_)
        | Op::Sort { .. }
        | Op::Cumulative { .. }
        | Op::Rev { .. } => false,
    }
}

/// The largest coordinate a `reduce_window` kernel may compute: its loop bounds and
/// coordinates are i64, so every term is kept far from overflow.
const WINDOW_KERNEL_COORD_MAX: i128 = 1 << 60;

/// A `reduce_window` kernel's window has at most this many positions, or as many as its
/// operand has elements.
const WINDOW_KERNEL_POSITIONS: usize = 4096;

/// Whether `reduce_window` runs as a reduction kernel (`Fuser::reduce_window_kernel`) rather
/// than the window step's direct loop (`window.rs`): when every coordinate it computes stays
/// below `WINDOW_KERNEL_COORD_MAX` (a window or padding near the type's limits takes the
/// direct loop, whose tables check their sizes), its window is not much larger than its
/// operand, and the operand has a dim (a scalar's window is the scalar).
fn window_as_kernel(win: &tessera_ir::WindowDims, src: &TensorType, out: &TensorType) -> bool {
    let r = src.rank();
    let fits = (0..r).all(|d| {
        let o = out.dims()[d].saturating_sub(1) as i128;
        let w = win.window[d].saturating_sub(1) as i128;
        let (lo, hi) = win.padding[d];
        // Saturating: a dilated window past i128 (the type rule admits one past the
        // operand, with an empty result) is simply too far.
        let reach = [
            (win.strides[d] as i128).saturating_mul(o),
            (win.window_dilation[d] as i128).saturating_mul(w),
            (lo as i128).abs(),
            (hi as i128).abs(),
            win.base_dilation[d] as i128,
            win.window[d] as i128,
            src.dims()[d] as i128,
        ]
        .into_iter()
        .fold(0i128, i128::saturating_add);
        reach < WINDOW_KERNEL_COORD_MAX
    });
    let window: Option<usize> = win.window.iter().try_fold(1usize, |n, &w| n.checked_mul(w));
    // A window far larger than its operand (mostly padding) would loop over every position;
    // the direct loop visits what the window covers.
    let room = src.numel().max(WINDOW_KERNEL_POSITIONS);
    r > 0 && fits && window.is_some_and(|n| n <= room)
}

fn combine(k: ReduceKind) -> Combine {
    match k {
        ReduceKind::Sum => Combine::Sum,
        ReduceKind::Max => Combine::Max,
        ReduceKind::Min => Combine::Min,
    }
}

/// Element 0 of `d` as a kernel constant, exact (every type but i64 fits in an f64).
fn scalar_of(d: &Data) -> Scalar {
    let x = d.get_f64(0);
    match d.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Scalar::F(x),
        DType::I32 | DType::U32 => Scalar::I(x as i64),
        // Not through f64: an i64 past 2^53 is not exact there.
        DType::I64 => Scalar::I(d.as_i64().map_or(0, |v| v[0])),
        DType::Bool => Scalar::B(x != 0.0),
    }
}

/// A plain load of buffer slot `buf` at the coordinates `map` (no division, no clamp).
fn load(buf: usize, dtype: tessera_ir::DType, strides: Vec<i64>, map: &[Lin]) -> Expr {
    Expr::Load {
        buf,
        dtype,
        strides,
        coords: map
            .iter()
            .map(|l| Coord {
                lin: l.clone(),
                div: 1,
                clamp: None,
            })
            .collect(),
    }
}

/// Merges dims into one strided axis when they are contiguous in the given order (size-1 dims
/// are skipped). Returns (extent, stride), or `None` when they cannot merge.
fn merge(dims: &[usize], sizes: &[usize], strides: &[i64]) -> Option<(usize, isize)> {
    let live: Vec<usize> = dims.iter().copied().filter(|&d| sizes[d] != 1).collect();
    let extent: usize = live.iter().map(|&d| sizes[d]).product();
    match live.last() {
        None => Some((extent, 0)),
        Some(&last) => {
            for w in live.windows(2) {
                if strides[w[0]] != strides[w[1]] * sizes[w[1]] as i64 {
                    return None;
                }
            }
            Some((extent, strides[last] as isize))
        }
    }
}

/// The GEMM form of a float `dot_general`, when its free and contracting dims each merge into
/// one strided axis (always so for a matmul and its transposes).
fn gemm_spec(dd: &DotDims, lt: &TensorType, rt: &TensorType, out: &TensorType) -> Option<GemmSpec> {
    if !lt.dtype.is_float() {
        return None;
    }
    let (ls, rs) = (row_major(lt.dims()), row_major(rt.dims()));
    let os = row_major(out.dims());
    let nb = dd.lhs_batch.len();
    let lfree = dd.lhs_free(lt.rank());
    let rfree = dd.rhs_free(rt.rank());
    let (m, lm) = merge(&lfree, lt.dims(), &ls)?;
    let (n, rn) = merge(&rfree, rt.dims(), &rs)?;
    let (k, lk) = merge(&dd.lhs_contract, lt.dims(), &ls)?;
    let (k2, rk) = merge(&dd.rhs_contract, rt.dims(), &rs)?;
    if k != k2 {
        return None;
    }
    // Both operands' contracting dims must merge in the same pairing order.
    let out_m_dims: Vec<usize> = (nb..nb + lfree.len()).collect();
    let out_n_dims: Vec<usize> = (nb + lfree.len()..out.rank()).collect();
    let (_, om) = merge(&out_m_dims, out.dims(), &os)?;
    let (_, on) = merge(&out_n_dims, out.dims(), &os)?;
    let batch = (0..nb)
        .map(|i| {
            let (a, b) = (dd.lhs_batch[i], dd.rhs_batch[i]);
            (
                lt.dims()[a],
                [ls[a] as isize, rs[b] as isize, os[i] as isize],
            )
        })
        .collect();
    Some(GemmSpec {
        dtype: lt.dtype,
        batch,
        m,
        n,
        k,
        lhs: [lm, lk],
        rhs: [rk, rn],
        out: [om, on],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{BinaryOp, UnaryOp};

    fn kernels(s: &Schedule) -> Vec<&Kernel> {
        s.steps
            .iter()
            .filter_map(|st| match &st.kind {
                StepKind::Kernel(k) => Some(k),
                StepKind::Gemm(_)
                | StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => None,
            })
            .collect()
    }

    /// Compiles `text` (f32 parameters), checks its schedule has `steps` steps, and runs it
    /// on a 2-thread pool and on one thread, on values with specials: the interpreter's bits.
    fn fused_with_the_interpreters_bits(text: &str, steps: usize) {
        use tessera_ir::{Data, Literal};
        let g = tessera_ir::parse(text).unwrap();
        let s = fuse(&g);
        assert_eq!(s.steps.len(), steps, "{text}");
        let specials = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, 3e38];
        let args: Vec<Literal> = g
            .params()
            .iter()
            .enumerate()
            .map(|(salt, &p)| {
                let ty = g.ty(p);
                let v = (0..ty.numel())
                    .map(|i| match (i * 7 + salt) % 13 {
                        0..=5 => specials[(i * 7 + salt) % 13],
                        _ => ((i * 7919 + salt) % 1013) as f32 * 0.37 - 150.0,
                    })
                    .collect();
                Literal::new(ty.dims().to_vec(), Data::F32(v)).unwrap()
            })
            .collect();
        let reference = tessera_interp::run(&g, &args).unwrap();
        let args: Vec<&Literal> = args.iter().collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let pooled = pool.install(|| {
            crate::compile(&g)
                .unwrap()
                .run(&args, &tessera_transport::SingleDevice)
                .unwrap()
        });
        let alone = crate::compile(&g)
            .unwrap()
            .single_threaded()
            .run(&args, &tessera_transport::SingleDevice)
            .unwrap();
        // Any NaN for a NaN: the interpreter's optimized build fixes no NaN's sign
        // (`Data::bits_eq_any_nan`); the release build's tests failed on one.
        for (i, want) in reference.iter().enumerate() {
            assert!(pooled[i].data.bits_eq_any_nan(&want.data), "{text}");
            assert!(alone[i].data.bits_eq_any_nan(&want.data), "{text}");
        }
    }

    /// A reshape that only merges dims of a single-use elementwise result, read by elementwise
    /// ops, fuses into one kernel over the finer dims (`Refinement`) that writes the
    /// interpreter's bits: dims of 1 anywhere (the operand's and the result's), a broadcast
    /// operand in the reader, specials, and a size the team splits. One that splits the
    /// result's outermost or innermost dim (not of 1) keeps the operand's buffer (two
    /// kernels), still with the interpreter's bits.
    #[test]
    fn refined_reshapes_fuse_with_the_interpreters_bits() {
        let dims = |d: &[usize]| {
            d.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let cases: [(&[usize], &[usize], usize); 10] = [
            (&[2, 2, 2, 2, 2, 3], &[2, 4, 4, 3], 1),
            (&[3, 1, 2, 5, 1], &[1, 6, 5], 1),
            (&[128, 4, 2, 4, 2, 16], &[128, 8, 8, 16], 1),
            (&[1, 1], &[1], 1),
            (&[4, 1, 3, 2, 5], &[4, 1, 6, 5], 1),
            (&[1, 1, 8, 2, 16], &[1, 16, 16], 1),
            // The outermost and the innermost dim split: a buffer.
            (&[2, 8, 16], &[16, 16], 2),
            (&[4, 8, 2], &[4, 16], 2),
            (&[5, 7], &[35], 2),
            (&[4, 3, 1], &[12, 1], 2),
        ];
        for (fine, coarse, steps) in cases {
            let last = coarse[coarse.len() - 1];
            let text = format!(
                "func @f(%0: f32[{f}], %1: f32[{c}], %2: f32[{last}]) {{\n  \
                 %3 = mul %0, %0 : f32[{f}]\n  %4 = reshape %3 : f32[{c}]\n  \
                 %5 = broadcast_in_dim %2 dims=[{d}] : f32[{c}]\n  \
                 %6 = sub %4, %1 : f32[{c}]\n  %7 = mul %6, %5 : f32[{c}]\n  \
                 return %7\n}}\n",
                f = dims(fine),
                c = dims(coarse),
                d = coarse.len() - 1,
            );
            fused_with_the_interpreters_bits(&text, steps);
        }
        // Two reshapes refined the same way, and a transpose and an iota in the readers.
        fused_with_the_interpreters_bits(
            "func @f(%0: f32[4,2,2,3], %1: f32[4,2,2,3], %2: f32[3,4,4]) {\n  \
             %3 = mul %0, %0 : f32[4,2,2,3]\n  %4 = reshape %3 : f32[4,4,3]\n  \
             %5 = neg %1 : f32[4,2,2,3]\n  %6 = reshape %5 : f32[4,4,3]\n  \
             %7 = add %4, %6 : f32[4,4,3]\n  %8 = transpose %2 perm=[2,1,0] : f32[4,4,3]\n  \
             %9 = iota dim=1 : f32[4,4,3]\n  %10 = mul %8, %9 : f32[4,4,3]\n  \
             %11 = add %7, %10 : f32[4,4,3]\n  return %11\n}\n",
            1,
        );
    }

    /// A refined reshape's chain of readers longer than a kernel's depth bound
    /// (`MAX_FUSED_DEPTH`): the nodes written out on the way iterate the finer dims too, and
    /// the last kernels load them there, with the interpreter's bits.
    #[test]
    fn a_refined_chain_deeper_than_a_kernel_keeps_its_bits() {
        let mut text = String::from(
            "func @f(%0: f32[4,2,2,8], %1: f32[4,4,8]) {\n  %2 = neg %0 : f32[4,2,2,8]\n  \
             %3 = reshape %2 : f32[4,4,8]\n",
        );
        let n = MAX_FUSED_DEPTH + 40;
        for i in 0..n {
            let op = if i % 2 == 0 { "add" } else { "mul" };
            text.push_str(&format!(
                "  %{} = {op} %{}, %1 : f32[4,4,8]\n",
                i + 4,
                i + 3
            ));
        }
        text.push_str(&format!("  return %{}\n}}\n", n + 3));
        let g = tessera_ir::parse(&text).unwrap();
        let s = fuse(&g);
        assert!(s.steps.len() >= 2, "the depth bound writes out a node");
        assert!(
            kernels(&s)
                .iter()
                .all(|k| k.out_dims == [4, 2, 2, 8] || k.is_flat()),
            "every kernel iterates the finer dims"
        );
        fused_with_the_interpreters_bits(&text, s.steps.len());
    }

    /// `reduce_window` of every kind and dtype runs as a reduction kernel with the
    /// interpreter's bits (NaNs aside, as everywhere between the two), over windows that tile,
    /// overlap, reach past the operand, hold one element, or read padding (negative too) and
    /// dilation holes, on operands holding NaN, infinities and both zeros (a sum of -0s is
    /// +0). A window much larger than its operand keeps the direct loop.
    #[test]
    fn reduce_windows_run_as_kernels_with_the_interpreters_bits() {
        use tessera_ir::{Data, Literal, ReduceKind, WindowDims};
        let win = |window: Vec<usize>, strides: Vec<usize>, padding: Vec<(i64, i64)>| {
            let n = window.len();
            WindowDims {
                window,
                strides,
                padding,
                base_dilation: vec![1; n],
                window_dilation: vec![1; n],
            }
        };
        let mut dilated = win(vec![2, 3, 1], vec![1, 2, 3], vec![(1, 0), (-1, 2), (0, 1)]);
        dilated.base_dilation = vec![1, 2, 1];
        dilated.window_dilation = vec![2, 1, 1];
        let cases: Vec<(Vec<usize>, WindowDims)> = vec![
            // A 2x2 max-pool of NHWC, and a SAME 3x3 one that overlaps.
            (
                vec![2, 6, 6, 5],
                win(vec![1, 2, 2, 1], vec![1, 2, 2, 1], vec![(0, 0); 4]),
            ),
            (
                vec![2, 5, 7, 3],
                win(
                    vec![1, 3, 3, 1],
                    vec![1; 4],
                    vec![(0, 0), (1, 1), (1, 1), (0, 0)],
                ),
            ),
            (vec![3, 9, 4], dilated),
            // Windows longer than the operand, of padding only, of one element.
            (vec![4], win(vec![6], vec![1], vec![(3, 2)])),
            (vec![3], win(vec![2], vec![1], vec![(4, 4)])),
            (
                vec![3, 4],
                win(vec![1, 1], vec![2, 3], vec![(0, 0), (1, 0)]),
            ),
            (
                vec![0, 3],
                win(vec![1, 1], vec![1, 1], vec![(1, 1), (0, 0)]),
            ),
            (
                vec![5, 0],
                win(vec![2, 1], vec![2, 1], vec![(0, 0), (0, 0)]),
            ),
        ];
        let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1e30];
        let float = |i: usize| match (i * 5 + 3) % 11 {
            0..=5 => specials[(i * 5 + 3) % 11],
            _ => ((i * 7919) % 1013) as f64 * 0.37 - 150.0,
        };
        for (dims, w) in &cases {
            for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
                for dtype in [DType::F32, DType::F64, DType::I32, DType::U32, DType::I64] {
                    let mut g = Graph::new("w");
                    let x = g.add_param(TensorType::new(dtype, dims.clone()));
                    let op = Op::ReduceWindow {
                        kind,
                        win: Box::new(w.clone()),
                    };
                    let y = g.add(op, &[x]).unwrap();
                    g.set_outputs(vec![y]);
                    let s = fuse(&g);
                    assert!(
                        s.steps
                            .iter()
                            .all(|st| matches!(st.kind, StepKind::Kernel(_))),
                        "{kind:?} {dtype} {dims:?}"
                    );
                    let n: usize = dims.iter().product();
                    // The last two dims' first elements are -0: some sums are of -0s alone.
                    let data = match dtype {
                        DType::F32 => Data::F32((0..n).map(|i| float(i) as f32).collect()),
                        DType::F64 => Data::F64((0..n).map(float).collect()),
                        DType::I32 => Data::I32(
                            (0..n)
                                .map(|i| (i as i32).wrapping_mul(0x3000_0001))
                                .collect(),
                        ),
                        DType::U32 => Data::U32(
                            (0..n)
                                .map(|i| (i as u32).wrapping_mul(0x9000_0001))
                                .collect(),
                        ),
                        _ => Data::I64(
                            (0..n as i64)
                                .map(|i| i.wrapping_mul(0x3000_0000_0000_0001))
                                .collect(),
                        ),
                    };
                    let lit = Literal::new(dims.clone(), data).unwrap();
                    let got = crate::compile(&g)
                        .unwrap()
                        .run(&[&lit], &tessera_transport::SingleDevice)
                        .unwrap();
                    let want = tessera_interp::run(&g, std::slice::from_ref(&lit)).unwrap();
                    let same = match (&got[0].data, &want[0].data) {
                        (Data::I64(a), Data::I64(b)) => a == b,
                        (a, b) => (0..a.len()).all(|i| {
                            let (p, q) = (a.get_f64(i), b.get_f64(i));
                            (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits()
                        }),
                    };
                    assert!(
                        same && got[0].ty == want[0].ty,
                        "{kind:?} {dtype} {dims:?} {w:?}: {:?} against {:?}",
                        got[0],
                        want[0]
                    );
                }
            }
        }
        // A dilated window near 2^127 (its result empty, which the type rule admits) is
        // refused without overflowing i128 (this test's build checks overflow).
        let src = TensorType::new(DType::F32, vec![1]);
        let mut w = win(vec![(1 << 63) + 1], vec![1], vec![(0, 0)]);
        w.window_dilation = vec![usize::MAX];
        assert!(!window_as_kernel(
            &w,
            &src,
            &TensorType::new(DType::F32, vec![0])
        ));
        // A window of 2^13 positions over three elements keeps the direct loop.
        let mut g = Graph::new("w");
        let x = g.add_param(TensorType::new(DType::F32, vec![3]));
        let op = Op::ReduceWindow {
            kind: ReduceKind::Max,
            win: Box::new(win(vec![1 << 13], vec![1], vec![(1 << 12, (1 << 12) - 1)])),
        };
        let y = g.add(op, &[x]).unwrap();
        g.set_outputs(vec![y]);
        assert!(matches!(fuse(&g).steps[0].kind, StepKind::Window(_)));
    }

    fn nodes(e: &Expr) -> usize {
        let mut n = 0;
        e.walk(&mut |_| n += 1);
        n
    }

    /// A chain of single-use elementwise ops is cut into kernels no deeper than the cap, and
    /// each cut is a buffer the next kernel loads: nothing is dropped.
    #[test]
    fn a_deep_chain_is_cut_at_the_depth_cap() {
        let ty = TensorType::new(DType::F32, vec![5]);
        let mut g = Graph::new("chain");
        let mut y = g.add_param(ty);
        let len = 5 * MAX_FUSED_DEPTH + 7;
        for _ in 0..len {
            y = g.add(Op::Unary(UnaryOp::Tanh), &[y]).unwrap();
        }
        g.set_outputs(vec![y]);
        let s = fuse(&g);
        let ks = kernels(&s);
        assert!(ks.iter().all(|k| k.body.depth() <= MAX_FUSED_DEPTH));
        // Every tanh is in exactly one kernel.
        let tanhs: usize = ks
            .iter()
            .map(|k| {
                let mut n = 0;
                k.body
                    .walk(&mut |e| n += matches!(e, Expr::Unary(UnaryOp::Tanh, ..)) as usize);
                n
            })
            .sum();
        assert_eq!(tanhs, len);
        assert_eq!(ks.len(), len.div_ceil(MAX_FUSED_DEPTH - 1));
    }

    /// A kernel of a few tanh layers keeps the unrolled vector loop; a depth-capped chain of
    /// 127 tanh (what a 100,000-op chain fuses into) gets one vector copy of its body.
    #[test]
    fn long_transcendental_bodies_are_not_unrolled() {
        let chain = |len: usize| {
            let ty = TensorType::new(DType::F32, vec![9]);
            let mut g = Graph::new("chain");
            let mut y = g.add_param(ty);
            for _ in 0..len {
                y = g.add(Op::Unary(UnaryOp::Tanh), &[y]).unwrap();
            }
            g.set_outputs(vec![y]);
            kernels(&fuse(&g))[0].clone()
        };
        assert!(crate::lower::unrolls(&chain(3)));
        assert!(!crate::lower::unrolls(&chain(MAX_FUSED_DEPTH - 1)));
    }

    /// A wide tree of single-use adds (shallow, so the depth cap does not apply) is cut at the
    /// size cap.
    #[test]
    fn a_wide_tree_is_cut_at_the_size_cap() {
        let ty = TensorType::new(DType::F32, vec![3]);
        let mut g = Graph::new("tree");
        let mut level: Vec<NodeId> = (0..4 * MAX_FUSED_SIZE)
            .map(|_| g.add_param(ty.clone()))
            .collect();
        while level.len() > 1 {
            level = level
                .chunks(2)
                .map(|p| g.add(Op::Binary(BinaryOp::Add), p).unwrap())
                .collect();
        }
        g.set_outputs(level);
        let s = fuse(&g);
        let ks = kernels(&s);
        assert!(ks.len() > 1);
        let adds: Vec<usize> = ks
            .iter()
            .map(|k| {
                let mut n = 0;
                k.body
                    .walk(&mut |e| n += matches!(e, Expr::Binary(..)) as usize);
                n
            })
            .collect();
        assert!(adds.iter().all(|&n| n < 3 * MAX_FUSED_SIZE), "{adds:?}");
        assert_eq!(adds.iter().sum::<usize>(), 4 * MAX_FUSED_SIZE - 1);
    }

    /// `walk` and `depth` need no stack for a deep tree (they are loops); dropping it does,
    /// so the tree is taken apart by hand.
    #[test]
    fn walk_and_depth_of_a_deep_expression() {
        let n = 200_000;
        let mut e = Expr::Const(DType::F32, Scalar::F(1.0));
        for _ in 0..n {
            e = Expr::Unary(UnaryOp::Neg, DType::F32, Box::new(e));
        }
        let depth = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let d = e.depth();
                assert_eq!(nodes(&e), n + 1);
                let mut e = e;
                while let Expr::Unary(_, _, x) = e {
                    e = *x;
                }
                d
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(depth, n + 1);
    }

    /// A concatenate of many tensors is a balanced tree of guards, not a chain as long as the
    /// operand list, and computes what the interpreter does.
    #[test]
    fn a_concatenate_of_many_operands_is_a_shallow_tree() {
        // Many enough for a deep tree; compiling the one kernel is most of the test's time
        // (Cranelift's register allocator on 2000 loads: about 5 s in the test profile).
        let n = 2000;
        let mut g = Graph::new("concat");
        let parts: Vec<NodeId> = (0..n)
            .map(|k| g.add_param(TensorType::new(DType::F32, vec![2, 1 + k % 3])))
            .collect();
        let c = g.add(Op::Concatenate { dim: 1 }, &parts).unwrap();
        g.set_outputs(vec![c]);
        let s = fuse(&g);
        let ks = kernels(&s);
        assert_eq!(ks.len(), 1);
        // 2000 leaves: 11 levels of guards and the load.
        assert_eq!(ks[0].body.depth(), 12);
        let inputs: Vec<Literal> = (0..n)
            .map(|k| {
                let len = 2 * (1 + k % 3);
                let data = (0..len).map(|i| (k * 10 + i) as f32).collect();
                Literal::new(vec![2, 1 + k % 3], Data::F32(data)).unwrap()
            })
            .collect();
        let want = tessera_interp::run(&g, &inputs).unwrap();
        let exe = crate::compile(&g).unwrap();
        let refs: Vec<&Literal> = inputs.iter().collect();
        let got = exe.run(&refs, &tessera_interp::SingleDevice).unwrap();
        assert!(got[0].data.bits_eq(&want[0].data));
    }
}
