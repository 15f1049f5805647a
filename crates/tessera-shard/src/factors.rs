//! Factor sharding rules, in the manner of Shardy's `OpShardingRule`.
//!
//! An op's rule names the independent index "factors" of its iteration space and says which of
//! them make up each dim of each operand and of the result (major first). A dim of size 6
//! reshaped to `[2, 3]` is two factors, of sizes 2 and 3; a matmul `[i, k] x [k, j] -> [i, j]`
//! has three factors, `k` a reduction. Propagation and partitioning never look at an op again:
//! they move shardings between tensors only through these factors.
//!
//! A factor is one of three kinds:
//! - pass-through: sharding it splits the operands and the result alike, with no communication;
//! - reduction: it appears in operands but not in the result; sharding it leaves each device a
//!   partial result that an `all_reduce` (or a `reduce_scatter`) completes;
//! - need-replication: it must be whole on every device (a sliced, padded or concatenated dim,
//!   the `argmax` axis, the counting dim of an `iota`, any dim of a non-splat constant).

use std::fmt;

use tessera_ir::{DotDims, Graph, NodeId, Op, ReduceKind, TensorType};

/// What sharding a factor does to the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorKind {
    PassThrough,
    Reduction(ReduceKind),
    NeedReplication,
}

/// An op's factors and where they appear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorRule {
    /// The size of each factor.
    pub sizes: Vec<usize>,
    pub kinds: Vec<FactorKind>,
    /// For each operand, for each of its dims, the factors that make it up, major first.
    pub operands: Vec<Vec<Vec<usize>>>,
    /// For each result dim, its factors, major first.
    pub result: Vec<Vec<usize>>,
}

impl FactorRule {
    pub(crate) fn new(n_operands: usize) -> FactorRule {
        FactorRule {
            sizes: Vec::new(),
            kinds: Vec::new(),
            operands: vec![Vec::new(); n_operands],
            result: Vec::new(),
        }
    }

    pub(crate) fn factor(&mut self, size: usize, kind: FactorKind) -> usize {
        self.sizes.push(size);
        self.kinds.push(kind);
        self.sizes.len() - 1
    }

    /// One pass-through factor per dim, shared by every operand and the result (all of the
    /// same shape), except the dims listed in `blocked`, which need replication.
    fn same_shape(dims: &[usize], n_operands: usize, blocked: &[usize]) -> FactorRule {
        let mut r = FactorRule::new(n_operands);
        for (d, &size) in dims.iter().enumerate() {
            let kind = if blocked.contains(&d) {
                FactorKind::NeedReplication
            } else {
                FactorKind::PassThrough
            };
            let f = r.factor(size, kind);
            for op in r.operands.iter_mut() {
                op.push(vec![f]);
            }
            r.result.push(vec![f]);
        }
        r
    }

    /// The reduction and the axes over which a result is partial when the factors are split
    /// over `axes` (`None` when the rule has no reduction factor; empty axes when none is split).
    pub fn partial(&self, axes: &[Vec<String>]) -> Option<(ReduceKind, Vec<String>)> {
        let mut partial: Option<(ReduceKind, Vec<String>)> = None;
        for (f, kind) in self.kinds.iter().enumerate() {
            if let FactorKind::Reduction(kind) = kind {
                partial
                    .get_or_insert((*kind, Vec::new()))
                    .1
                    .extend(axes[f].iter().cloned());
            }
        }
        partial
    }

    /// The factors of an operand (`Some(k)`) or of the result (`None`).
    pub fn dims_of(&self, tensor: Option<usize>) -> &[Vec<usize>] {
        match tensor {
            Some(k) => &self.operands[k],
            None => &self.result,
        }
    }
}

/// Every dim of every operand and of the result its own factor, each needing replication.
fn replicated_rule(operands: &[&TensorType], rdims: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(operands.len());
    for (k, t) in operands.iter().enumerate() {
        for &size in t.dims() {
            let f = r.factor(size, FactorKind::NeedReplication);
            r.operands[k].push(vec![f]);
        }
    }
    for &size in rdims {
        let f = r.factor(size, FactorKind::NeedReplication);
        r.result.push(vec![f]);
    }
    r
}

/// The factor rule of node `id` of `g`. Collectives have no rule: they do not appear in a
/// program before partitioning.
pub fn rule_of(g: &Graph, id: NodeId) -> FactorRule {
    let operands: Vec<&TensorType> = g.operands(id).iter().map(|&o| g.ty(o)).collect();
    rule(g.op(id), &operands, g.ty(id))
}

/// The factor rule of `op` applied to operands of types `operands`, giving `result`. The match
/// only dispatches, one helper per op family, as JAX groups its rules.
pub fn rule(op: &Op, operands: &[&TensorType], result: &TensorType) -> FactorRule {
    let rdims = result.dims();
    let from = || operands[0].dims();
    match op {
        Op::Parameter(_) => FactorRule::same_shape(rdims, 0, &[]),
        Op::Constant(lit) => constant_rule(lit.data.is_splat(), rdims),
        Op::Iota { dim, .. } => FactorRule::same_shape(rdims, 0, &[*dim]),
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert(_)
        | Op::Bitcast(_)
        | Op::ShardingConstraint(_)
        | Op::StopGradient => elementwise_rule(rdims, operands.len()),
        // The passes never use these: `region.rs` ties a region's operands and results to its
        // bodies' parameters and outputs (slots), and each body has its own rules. Seen from
        // outside its bodies, a region is whole.
        Op::Region(_) | Op::GetResult { .. } => replicated_rule(operands, rdims),
        Op::BroadcastInDim { dims, .. } => broadcast_rule(from(), dims, rdims),
        Op::Reshape(_) => reshape_rule(from(), rdims),
        Op::Transpose(perm) => transpose_rule(from(), perm),
        Op::Slice {
            start,
            limit,
            stride,
        } => slice_rule(from(), start, limit, stride, rdims),
        Op::Pad {
            low,
            high,
            interior,
        } => pad_rule(from(), low, high, interior, rdims),
        Op::Concatenate { dim } => concatenate_rule(operands, *dim, rdims),
        Op::Reduce { kind, axes } => reduce_rule(from(), *kind, axes),
        Op::ArgMax { axis } => argmax_rule(from(), *axis),
        Op::DotGeneral(dd) => dot_rule(dd, from(), operands[1].dims()),
        Op::Collective(_) => collective_rule(operands, rdims),
        Op::Conv(cd) => conv_rule(cd, from(), operands[1].dims(), rdims),
        Op::ReduceWindow { win, .. } => window_rule(win, from(), rdims),
        Op::Gather(d) => crate::gather::gather_rule(d, from(), operands[1].dims(), rdims),
        Op::Scatter(d) => crate::gather::scatter_rule(d, operands),
        // The sorted, scanned or reversed dims need replication (a device's chunk of a lane
        // does not sort, scan or mirror locally); every other dim passes through.
        Op::Sort { dim, .. } => FactorRule::same_shape(rdims, operands.len(), &[*dim]),
        Op::Cumulative { axis, .. } => FactorRule::same_shape(rdims, 1, &[*axis]),
        Op::Rev { dims } => FactorRule::same_shape(rdims, 1, dims),
    }
}

/// `conv_general_dilated`: the batch dim passes through (unless batch-grouped), the kernel's
/// output features pass through, the input features are contracted (a split gives partial
/// sums, as a dot's contracting dim); with groups, the feature dims are whole. Spatial dims
/// are whole (a split would need halos).
fn conv_rule(cd: &tessera_ir::ConvDims, lt: &[usize], rt: &[usize], rdims: &[usize]) -> FactorRule {
    use FactorKind::*;
    let mut r = FactorRule::new(2);
    r.operands[0] = vec![Vec::new(); lt.len()];
    r.operands[1] = vec![Vec::new(); rt.len()];
    r.result = vec![Vec::new(); rdims.len()];
    let grouped = cd.feature_group_count > 1 || cd.batch_group_count > 1;
    let (lb, lf, rof, rif, ob, of) = (
        cd.lhs_spec[0],
        cd.lhs_spec[1],
        cd.rhs_spec[0],
        cd.rhs_spec[1],
        cd.out_spec[0],
        cd.out_spec[1],
    );
    if cd.batch_group_count == 1 {
        let f = r.factor(lt[lb], PassThrough);
        r.operands[0][lb] = vec![f];
        r.result[ob] = vec![f];
    } else {
        let f = r.factor(lt[lb], NeedReplication);
        r.operands[0][lb] = vec![f];
        let f = r.factor(rdims[ob], NeedReplication);
        r.result[ob] = vec![f];
    }
    if grouped {
        for (k, d, size) in [(0, lf, lt[lf]), (1, rif, rt[rif]), (1, rof, rt[rof])] {
            let f = r.factor(size, NeedReplication);
            r.operands[k][d] = vec![f];
        }
        let f = r.factor(rdims[of], NeedReplication);
        r.result[of] = vec![f];
    } else {
        let f = r.factor(lt[lf], Reduction(ReduceKind::Sum));
        r.operands[0][lf] = vec![f];
        r.operands[1][rif] = vec![f];
        let f = r.factor(rt[rof], PassThrough);
        r.operands[1][rof] = vec![f];
        r.result[of] = vec![f];
    }
    for j in 0..cd.spatial() {
        let (a, b, c) = (cd.lhs_spec[2 + j], cd.rhs_spec[2 + j], cd.out_spec[2 + j]);
        let f = r.factor(lt[a], NeedReplication);
        r.operands[0][a] = vec![f];
        let f = r.factor(rt[b], NeedReplication);
        r.operands[1][b] = vec![f];
        let f = r.factor(rdims[c], NeedReplication);
        r.result[c] = vec![f];
    }
    r
}

/// `reduce_window`: a dim whose window is 1 with unit stride and no padding or dilation passes
/// through; any other is whole.
fn window_rule(win: &tessera_ir::WindowDims, from: &[usize], rdims: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(1);
    for d in 0..from.len() {
        let trivial = win.window[d] == 1
            && win.strides[d] == 1
            && win.padding[d] == (0, 0)
            && win.base_dilation[d] == 1
            && win.window_dilation[d] == 1;
        if trivial {
            let f = r.factor(from[d], FactorKind::PassThrough);
            r.operands[0].push(vec![f]);
            r.result.push(vec![f]);
        } else {
            let f = r.factor(from[d], FactorKind::NeedReplication);
            r.operands[0].push(vec![f]);
            let f = r.factor(rdims[d], FactorKind::NeedReplication);
            r.result.push(vec![f]);
        }
    }
    r
}

/// Elementwise ops (and `sharding_constraint`): one pass-through factor per dim, shared by every
/// operand and the result.
fn elementwise_rule(rdims: &[usize], n_operands: usize) -> FactorRule {
    FactorRule::same_shape(rdims, n_operands, &[])
}

/// A splat is built locally in any sharding; other constants are whole.
fn constant_rule(splat: bool, rdims: &[usize]) -> FactorRule {
    let blocked: Vec<usize> = if splat {
        Vec::new()
    } else {
        (0..rdims.len()).collect()
    };
    FactorRule::same_shape(rdims, 0, &blocked)
}

/// `broadcast_in_dim`: a carried dim shares its result dim's factor; a dim of size 1 stretched is
/// its own factor, never split.
fn broadcast_rule(from: &[usize], dims: &[usize], rdims: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(1);
    for &size in rdims {
        let f = r.factor(size, FactorKind::PassThrough);
        r.result.push(vec![f]);
    }
    for (i, &d) in dims.iter().enumerate() {
        let size = from[i];
        let f = if size == rdims[d] {
            r.result[d][0]
        } else {
            r.factor(size, FactorKind::NeedReplication)
        };
        r.operands[0].push(vec![f]);
    }
    r
}

/// `transpose`: the operand's factors, permuted.
fn transpose_rule(from: &[usize], perm: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(1);
    for &size in from {
        let f = r.factor(size, FactorKind::PassThrough);
        r.operands[0].push(vec![f]);
    }
    r.result = perm.iter().map(|&p| vec![p]).collect();
    r
}

/// `slice`: a dim sliced (not taken whole) needs replication.
fn slice_rule(
    from: &[usize],
    start: &[usize],
    limit: &[usize],
    stride: &[usize],
    rdims: &[usize],
) -> FactorRule {
    let blocked: Vec<usize> = (0..from.len())
        .filter(|&d| start[d] != 0 || limit[d] != from[d] || stride[d] != 1)
        .collect();
    with_own_sizes(FactorRule::same_shape(from, 1, &blocked), rdims)
}

/// `pad`: a padded dim needs replication; the padding value is a scalar.
fn pad_rule(
    from: &[usize],
    low: &[i64],
    high: &[i64],
    interior: &[usize],
    rdims: &[usize],
) -> FactorRule {
    let blocked: Vec<usize> = (0..from.len())
        .filter(|&d| low[d] != 0 || high[d] != 0 || interior[d] != 0)
        .collect();
    let mut r = with_own_sizes(FactorRule::same_shape(from, 1, &blocked), rdims);
    r.operands.push(Vec::new());
    r
}

/// `concatenate`: operands differ in the concatenated dim; it is whole everywhere.
fn concatenate_rule(operands: &[&TensorType], dim: usize, rdims: &[usize]) -> FactorRule {
    let mut r = FactorRule::same_shape(rdims, operands.len(), &[dim]);
    for (k, t) in operands.iter().enumerate() {
        let f = r.factor(t.dims()[dim], FactorKind::NeedReplication);
        r.operands[k][dim] = vec![f];
    }
    r
}

/// `reduce`: the reduced dims are reduction factors, the others pass through.
fn reduce_rule(from: &[usize], kind: ReduceKind, axes: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(1);
    for (d, &size) in from.iter().enumerate() {
        if axes.contains(&d) {
            let f = r.factor(size, FactorKind::Reduction(kind));
            r.operands[0].push(vec![f]);
        } else {
            let f = r.factor(size, FactorKind::PassThrough);
            r.operands[0].push(vec![f]);
            r.result.push(vec![f]);
        }
    }
    r
}

/// `argmax`: the axis searched needs replication (an index is not a partial sum).
fn argmax_rule(from: &[usize], axis: usize) -> FactorRule {
    let mut r = FactorRule::new(1);
    for (d, &size) in from.iter().enumerate() {
        let kind = if d == axis {
            FactorKind::NeedReplication
        } else {
            FactorKind::PassThrough
        };
        let f = r.factor(size, kind);
        r.operands[0].push(vec![f]);
        if d != axis {
            r.result.push(vec![f]);
        }
    }
    r
}

/// `dot_general`: batch and free dims pass through (batch first, then lhs free, then rhs free,
/// the result's order); contracting dims are sum reductions.
fn dot_rule(dd: &DotDims, lt: &[usize], rt: &[usize]) -> FactorRule {
    use FactorKind::*;
    let mut r = FactorRule::new(2);
    r.operands[0] = vec![Vec::new(); lt.len()];
    r.operands[1] = vec![Vec::new(); rt.len()];
    for (&a, &b) in dd.lhs_batch.iter().zip(&dd.rhs_batch) {
        let f = r.factor(lt[a], PassThrough);
        r.operands[0][a] = vec![f];
        r.operands[1][b] = vec![f];
        r.result.push(vec![f]);
    }
    for a in dd.lhs_free(lt.len()) {
        let f = r.factor(lt[a], PassThrough);
        r.operands[0][a] = vec![f];
        r.result.push(vec![f]);
    }
    for b in dd.rhs_free(rt.len()) {
        let f = r.factor(rt[b], PassThrough);
        r.operands[1][b] = vec![f];
        r.result.push(vec![f]);
    }
    for (&a, &b) in dd.lhs_contract.iter().zip(&dd.rhs_contract) {
        let f = r.factor(lt[a], Reduction(ReduceKind::Sum));
        r.operands[0][a] = vec![f];
        r.operands[1][b] = vec![f];
    }
    r
}

/// Collectives and `axis_index` only exist in per-device programs (pmap, or the partitioner's
/// output): every dim is whole as far as propagation is concerned.
fn collective_rule(operands: &[&TensorType], rdims: &[usize]) -> FactorRule {
    let mut r = FactorRule::new(operands.len());
    for (k, t) in operands.iter().enumerate() {
        for &size in t.dims() {
            let f = r.factor(size, FactorKind::NeedReplication);
            r.operands[k].push(vec![f]);
        }
    }
    for &size in rdims {
        let f = r.factor(size, FactorKind::NeedReplication);
        r.result.push(vec![f]);
    }
    r
}

/// The result of a slice or pad has its own sizes in the blocked dims: give those dims a
/// result-only factor so the sizes stay right (they need replication all the same).
fn with_own_sizes(mut r: FactorRule, rdims: &[usize]) -> FactorRule {
    for (d, &size) in rdims.iter().enumerate() {
        let f = r.result[d][0];
        if r.sizes[f] != size {
            let g = r.factor(size, FactorKind::NeedReplication);
            r.result[d] = vec![g];
        }
    }
    r
}

/// Reshape: the common refinement of the two shapes. Dims of size 1 are factors of their own;
/// the others are split, major first, into factors the size of the greatest common divisor of
/// what is left of the two current dims (`[6, 4] -> [24]` is factors 6 and 4; `[24] -> [2, 12]`
/// is 2 and 12; `[6, 4] -> [4, 6]` starts with a common factor 2). Once the two current dims
/// have nothing in common (3 left of the 6, 2 left of the 4), the rest of both shapes needs
/// replication: it is not a product of common factors.
fn reshape_rule(from: &[usize], to: &[usize]) -> FactorRule {
    use FactorKind::*;
    let mut r = FactorRule::new(1);
    r.operands[0] = vec![Vec::new(); from.len()];
    r.result = vec![Vec::new(); to.len()];
    for (d, _) in from.iter().enumerate().filter(|(_, s)| **s == 1) {
        let f = r.factor(1, PassThrough);
        r.operands[0][d].push(f);
    }
    for (d, _) in to.iter().enumerate().filter(|(_, s)| **s == 1) {
        let f = r.factor(1, PassThrough);
        r.result[d].push(f);
    }
    let fi: Vec<usize> = (0..from.len()).filter(|&d| from[d] > 1).collect();
    let ti: Vec<usize> = (0..to.len()).filter(|&d| to[d] > 1).collect();
    let (mut a, mut b) = (0, 0);
    let (mut rf, mut rt) = (
        fi.first().map_or(1, |&d| from[d]),
        ti.first().map_or(1, |&d| to[d]),
    );
    while a < fi.len() && b < ti.len() {
        let size = gcd(rf, rt);
        if size == 1 {
            // Incompatible: what is left of each side is whole.
            let f = r.factor(rf, NeedReplication);
            r.operands[0][fi[a]].push(f);
            for &d in &fi[a + 1..] {
                let f = r.factor(from[d], NeedReplication);
                r.operands[0][d].push(f);
            }
            let f = r.factor(rt, NeedReplication);
            r.result[ti[b]].push(f);
            for &d in &ti[b + 1..] {
                let f = r.factor(to[d], NeedReplication);
                r.result[d].push(f);
            }
            break;
        }
        let f = r.factor(size, PassThrough);
        r.operands[0][fi[a]].push(f);
        r.result[ti[b]].push(f);
        rf /= size;
        rt /= size;
        if rf == 1 {
            a += 1;
            rf = fi.get(a).map_or(1, |&d| from[d]);
        }
        if rt == 1 {
            b += 1;
            rt = ti.get(b).map_or(1, |&d| to[d]);
        }
    }
    r
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Factor names as Shardy prints them: `i`, `j`, `k`, ..., then `z_1`, `z_2`, ...
fn factor_name(f: usize) -> String {
    const NAMES: &[u8] = b"ijklmnopqrstuvwxyz";
    match NAMES.get(f) {
        Some(&c) => (c as char).to_string(),
        None => format!("z_{}", f - NAMES.len() + 1),
    }
}

impl fmt::Display for FactorRule {
    /// `([i, k], [k, j])->([i, j]) {i=8, j=5, k=3} reduction={k}`, Shardy's notation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tensor = |dims: &[Vec<usize>]| {
            let ds: Vec<String> = dims
                .iter()
                .map(|fs| fs.iter().map(|&x| factor_name(x)).collect::<String>())
                .collect();
            format!("[{}]", ds.join(", "))
        };
        let ops: Vec<String> = self.operands.iter().map(|o| tensor(o)).collect();
        write!(f, "({})->({})", ops.join(", "), tensor(&self.result))?;
        let sizes: Vec<String> = self
            .sizes
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{}={s}", factor_name(i)))
            .collect();
        write!(f, " {{{}}}", sizes.join(", "))?;
        let of_kind = |want: fn(&FactorKind) -> bool| -> Vec<String> {
            self.kinds
                .iter()
                .enumerate()
                .filter(|(_, k)| want(k))
                .map(|(i, _)| factor_name(i))
                .collect()
        };
        let red = of_kind(|k| matches!(k, FactorKind::Reduction(_)));
        if !red.is_empty() {
            write!(f, " reduction={{{}}}", red.join(", "))?;
        }
        let rep = of_kind(|k| *k == FactorKind::NeedReplication);
        if !rep.is_empty() {
            write!(f, " need_replication={{{}}}", rep.join(", "))?;
        }
        Ok(())
    }
}
