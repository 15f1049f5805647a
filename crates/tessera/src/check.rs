//! Checked mode (`TESSERA_CHECK=1`, or `jit(f).checked(true)`): every call also runs the
//! reference interpreter and compares.
//!
//! Two checks, in this order:
//! 1. Op by op: the interpreter evaluates the program (the global one, before partitioning,
//!    after simplification) keeping every value; each op is compiled alone (once per op and
//!    operand types, cached) and run on the interpreter's operands. Its result must equal the
//!    interpreter's within the op's stated bound (`bound`): bit for bit for exact ops, within the
//!    ulp bound of `approx.rs` for the transcendental functions, within the rounding error of
//!    a reordered sum for reductions and dots. The first op outside its bound is reported with
//!    its source line, its operands' summaries and both values.
//! 2. The whole program: the outputs of the call (compiled, fused, partitioned, with real
//!    collectives) against the interpreter's, within a tolerance relative to each output's
//!    largest magnitude. This catches what the ops alone cannot (fusion, partitioning,
//!    collectives); its report says that every op agreed alone. An output that depends on a
//!    sum past the type's largest finite value may differ in any way (`Leeway`).
//!
//! Collectives are not checked alone (they need the devices); a sharded program's global form
//! has none, and its collectives are covered by the whole-program check.

use std::cell::RefCell;
use std::rc::Rc;

use hashbrown::HashMap;
use tessera_ir::{
    BinaryOp, DType, Data, Graph, Literal, NodeId, Op, ReduceKind, TensorType, UnaryOp, bf16, f16,
    print,
};

use crate::error::{Error, Result};

/// How far an op's compiled result may be from the interpreter's.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Bound {
    /// Bit for bit (any NaN equals any NaN: NaN payloads are not specified).
    Exact,
    /// Within this many units in the last place (infinities, zeros and NaN exactly).
    Ulps(u64),
    /// A sum whose order the backends choose: within `n * eps * sum(|terms|)`.
    Accumulated,
    /// Not checked alone (the value is an input, or needs the devices).
    Unchecked,
}

/// What check 2 may accept in an output although every op agreed alone: an op's value within
/// its bound can still differ from the interpreter's, and what follows it computes on that
/// value. A sum is the case where that difference is unbounded: past the type's largest
/// finite value a reordered sum may overflow where the interpreter's did not, and a fused
/// multiply-add keeps finite a product the interpreter rounds to infinity (`inf - inf` is NaN
/// in one, `-inf` in the other). Ordered: an output takes the largest of its operands'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Leeway {
    /// The whole-program tolerance.
    Tolerance,
    /// Also any difference where either value is infinite or NaN: the value depends on an
    /// f16 or bf16 sum past the type's largest value (rounded once from f32: inf against the
    /// largest finite value), or on a region (loop, branch) whose body sums and whose operands
    /// or results hold an inf or NaN (regions are not checked op by op, so their sums'
    /// magnitudes are not known).
    NonFinite,
    /// Any difference: the value depends on a sum whose terms' magnitudes add up past the
    /// type's largest finite value.
    Any,
}

/// The interpreter's outputs of one call, and how far the compiled ones may be from them.
pub(crate) struct Reference {
    outputs: Vec<Literal>,
    leeway: Vec<Leeway>,
}

/// How far each float function's compiled form may be from the interpreter's, in ulps: the
/// sum of the two backends' distances from the correctly rounded result, each rounded up to
/// whole ulps (the compiled bounds are stated in `tessera-codegen/src/approx.rs`, with FMA and
/// without; the interpreter's, Rust std over glibc and `libm::erff`, are measured by
/// `tessera-codegen/tests/ulp.rs`: within 1 ulp but `tanhf` 2.05 and the composite logistic
/// 2.22). Exact IEEE operations, and the functions both backends compute the same way, are
/// `Exact`.
fn unary_bound(u: UnaryOp) -> Bound {
    match u {
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Not => Bound::Exact,
        // Both backends follow XLA's f32 erf_inv step by step (tests/prng.rs).
        UnaryOp::ErfInv => Bound::Exact,
        // compiled 1 (1.5 without FMA), interpreter 1.
        UnaryOp::Exp => Bound::Ulps(3),
        // compiled 1, interpreter 1.
        UnaryOp::Log => Bound::Ulps(2),
        // compiled 2, interpreter 1.
        UnaryOp::Log1p | UnaryOp::Expm1 => Bound::Ulps(3),
        // compiled 1.5, interpreter (glibc's tanhf) 2.05.
        UnaryOp::Tanh => Bound::Ulps(5),
        // compiled 2 (2.5 without FMA), interpreter 2.22.
        UnaryOp::Logistic => Bound::Ulps(6),
        // compiled 1.5, interpreter 1.
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Erf => Bound::Ulps(3),
        // libm's f64 function rounded once, the same call on both backends
        // (`tessera-interp/src/elem.rs`).
        UnaryOp::Tan
        | UnaryOp::Asin
        | UnaryOp::Acos
        | UnaryOp::Atan
        | UnaryOp::Sinh
        | UnaryOp::Cosh
        | UnaryOp::Asinh
        | UnaryOp::Acosh
        | UnaryOp::Atanh
        | UnaryOp::Exp2 => Bound::Exact,
    }
}

fn binary_bound(b: BinaryOp) -> Bound {
    match b {
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Rem
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => Bound::Exact,
        // f64 `pow` rounded once, the same call on both backends.
        BinaryOp::Pow => Bound::Exact,
        // f64 libm `atan2` rounded once, the same call on both backends.
        BinaryOp::Atan2 => Bound::Exact,
    }
}

fn bound(op: &Op) -> Bound {
    match op {
        Op::Parameter(_) | Op::Constant(_) => Bound::Unchecked,
        Op::Unary(u) => unary_bound(*u),
        Op::Binary(b) => binary_bound(*b),
        Op::Iota { .. }
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
        | Op::ShardingConstraint(_)
        | Op::StopGradient => Bound::Exact,
        Op::Reduce { kind, .. } => match kind {
            ReduceKind::Sum => Bound::Accumulated,
            ReduceKind::Max | ReduceKind::Min => Bound::Exact,
        },
        Op::DotGeneral(_) => Bound::Accumulated,
        Op::Collective(_) => Bound::Unchecked,
        // A region is checked whole: its compiled results against the interpreter's by the
        // whole-program check, and, in `check_program`, the program compiled whole against
        // the composition in which the region is compiled alone.
        Op::Region(_) | Op::GetResult { .. } => Bound::Unchecked,
        Op::Conv(_) => Bound::Accumulated,
        // Each window combined in the interpreter's order, from the identity: by a reduction
        // kernel (`fusion.rs::reduce_window_kernel`) or the direct loop (`window.rs`).
        Op::ReduceWindow { .. } => Bound::Exact,
        // A gather copies elements; the compiled scatter applies its updates in the
        // interpreter's order (row-major over the updates, on one thread: `ScatterPhase`), so
        // even a scatter's sums with repeated indices agree bit for bit.
        Op::Gather(_) | Op::Scatter(_) => Bound::Exact,
        // A permutation, a mirror, and a scan in the interpreter's order (the scan kernel
        // combines each lane's elements one after another, as the interpreter does).
        Op::Sort { .. } | Op::Rev { .. } | Op::Cumulative { .. } => Bound::Exact,
    }
}

/// The differential check of a whole program, for tests and fuzzers: every op against the
/// interpreter within its bound (as checked mode does), then the program compiled whole
/// against the composition of its ops (the inexact ones compiled alone, the exact ones
/// interpreted), bit for bit, and the program at Cranelift's quick tier (what `jit` runs
/// until the optimized code is ready: `tessera_codegen::compile_tiered`) against the
/// optimized one, bit for bit. In both comparisons any NaN equals any NaN. Collectives are
/// not supported (single device).
pub fn check_program(graph: &Graph, inputs: &[Literal]) -> Result<()> {
    tessera_ir::verify(graph)?;
    let refs: Vec<&Literal> = inputs.iter().collect();
    let checker = Checker::new(graph.clone());
    let (_, composed) = checker.walk(&refs, true)?;
    let exe = tessera_codegen::compile(graph).map_err(|e| Error::Codegen(e.to_string()))?;
    let got = exe.run(&refs, &tessera_interp::SingleDevice)?;
    if let Some((i, diff)) = first_difference(&got, &composed) {
        return Err(Error::Check(format!(
            "output {i} of the program compiled whole differs from its ops compiled alone (the \
             exact ones interpreted): {diff}; every op agreed with the interpreter alone, so \
             the difference comes from fusion"
        )));
    }
    let quick = tessera_codegen::compile_quick(graph).map_err(|e| Error::Codegen(e.to_string()))?;
    let fast = quick.run(&refs, &tessera_interp::SingleDevice)?;
    if let Some((i, diff)) = first_difference(&fast, &got) {
        return Err(Error::Check(format!(
            "output {i} of the program at the quick tier differs from the optimized program: \
             {diff}"
        )));
    }
    Ok(())
}

/// The first output of `got` that differs from `want`'s in any bit (any NaN equal to any
/// NaN), and how.
fn first_difference(got: &[Literal], want: &[Literal]) -> Option<(usize, String)> {
    got.iter()
        .zip(want)
        .enumerate()
        .find_map(|(i, (g, w))| Some((i, compare(&Op::Select, Bound::Exact, g, w, &[], None)?)))
}

/// The whole-program tolerance, relative to the largest magnitude of each output.
const PROGRAM_TOLERANCE_F32: f64 = 1e-4;
const PROGRAM_TOLERANCE_F64: f64 = 1e-10;
/// f16 and bf16: a few ulps of the narrow type (2^-10 and 2^-7): each op rounds once more
/// than its f32 kernel, so a compiled value one f32 ulp off can round to the neighbour.
const PROGRAM_TOLERANCE_F16: f64 = 4e-3;
const PROGRAM_TOLERANCE_BF16: f64 = 3e-2;

/// The program a checked `jit` compares against, and the kernels compiled for its ops.
pub(crate) struct Checker {
    graph: Graph,
    kernels: RefCell<HashMap<String, Rc<tessera_codegen::Executable>>>,
}

impl Checker {
    pub(crate) fn new(graph: Graph) -> Checker {
        Checker {
            graph,
            kernels: RefCell::new(HashMap::new()),
        }
    }

    /// Check 1 (op by op); returns the interpreter's outputs for check 2.
    pub(crate) fn check_ops(&self, inputs: &[&Literal]) -> Result<Reference> {
        Ok(self.walk(inputs, false)?.0)
    }

    /// Check 1, and also the composition of the ops compiled alone: every inexact op run
    /// compiled on the composed values of its operands, the exact ones interpreted. A single
    /// device program compiled whole (fused) must equal that composition bit for bit, since
    /// fusion changes where values live, not how each op computes.
    fn walk(&self, inputs: &[&Literal], compose: bool) -> Result<(Reference, Vec<Literal>)> {
        let g = &self.graph;
        let mut leeway: std::collections::HashMap<NodeId, Leeway> =
            std::collections::HashMap::new();
        let mut values: std::collections::HashMap<NodeId, Literal> =
            std::collections::HashMap::new();
        let mut composed: std::collections::HashMap<NodeId, Literal> =
            std::collections::HashMap::new();
        // The results of each region node (interpreted, and compiled alone).
        let mut results_of: std::collections::HashMap<NodeId, Vec<Literal>> =
            std::collections::HashMap::new();
        let mut composed_results: std::collections::HashMap<NodeId, Vec<Literal>> =
            std::collections::HashMap::new();
        for (&p, &l) in g.params().iter().zip(inputs) {
            values.insert(p, l.clone());
            composed.insert(p, l.clone());
        }
        for id in g.topo_order() {
            if values.contains_key(&id) {
                continue;
            }
            let node = g.node(id);
            let operands: Vec<NodeId> = g.operands(id);
            let args: Vec<&Literal> = operands.iter().map(|o| &values[o]).collect();
            let inherited = operands
                .iter()
                .filter_map(|o| leeway.get(o).copied())
                .max()
                .unwrap_or(Leeway::Tolerance);
            leeway.insert(id, inherited);
            if let Op::Region(r) = &node.op {
                let results = tessera_interp::run_region(r, &args, &tessera_interp::SingleDevice)?;
                let non_finite =
                    |l: &Literal| (0..l.data.len()).any(|k| !l.data.get_f64(k).is_finite());
                if r.regions().iter().any(|(_, body)| sums(body))
                    && (args.iter().any(|a| non_finite(a)) || results.iter().any(non_finite))
                {
                    leeway.insert(id, inherited.max(Leeway::NonFinite));
                }
                results_of.insert(id, results);
                if compose {
                    let cargs: Vec<&Literal> = operands.iter().map(|o| &composed[o]).collect();
                    composed_results.insert(id, self.run_region_alone(id, &cargs)?);
                }
                values.insert(id, Literal::zeros(&node.ty));
                composed.insert(id, Literal::zeros(&node.ty));
                continue;
            }
            if let Op::GetResult { index, .. } = &node.op {
                let region = operands[0];
                values.insert(id, results_of[&region][*index].clone());
                if compose {
                    composed.insert(id, composed_results[&region][*index].clone());
                }
                continue;
            }
            let want = tessera_interp::eval_op(&node.op, &args, &node.ty)?;
            let b = bound(&node.op);
            let magnitude = match b {
                Bound::Accumulated => magnitudes(&node.op, &args, &node.ty),
                Bound::Exact | Bound::Ulps(_) | Bound::Unchecked => None,
            };
            if let Some(m) = &magnitude {
                let most = m.iter().fold(Leeway::Tolerance, |l, &m| {
                    l.max(sum_leeway(node.ty.dtype, m))
                });
                leeway.insert(id, inherited.max(most));
            }
            if b != Bound::Unchecked {
                let got = self.run_alone(id, &args)?;
                if let Some(diff) = compare(&node.op, b, &got, &want, &args, magnitude.as_deref()) {
                    return Err(self.report(id, &args, &diff));
                }
            }
            if compose {
                let cargs: Vec<&Literal> = operands.iter().map(|o| &composed[o]).collect();
                let c = match b {
                    Bound::Exact | Bound::Unchecked => {
                        tessera_interp::eval_op(&node.op, &cargs, &node.ty)?
                    }
                    Bound::Ulps(_) | Bound::Accumulated => self.run_alone(id, &cargs)?,
                };
                composed.insert(id, c);
            }
            values.insert(id, want);
        }
        let outs = |m: &std::collections::HashMap<NodeId, Literal>| -> Vec<Literal> {
            g.outputs()
                .iter()
                .filter_map(|o| m.get(o).cloned())
                .collect()
        };
        let reference = Reference {
            outputs: outs(&values),
            leeway: g
                .outputs()
                .iter()
                .filter(|o| values.contains_key(o))
                .map(|o| leeway.get(o).copied().unwrap_or(Leeway::Tolerance))
                .collect(),
        };
        Ok((reference, outs(&composed)))
    }

    /// Check 2: the call's outputs against the interpreter's.
    pub(crate) fn check_outputs(&self, got: &[Literal], want: &Reference) -> Result<()> {
        for (i, ((g, w), &leeway)) in got.iter().zip(&want.outputs).zip(&want.leeway).enumerate() {
            let fail = |message: String| {
                Err(Error::Check(format!(
                    "output {i} ({}) of {}: {message}; every op agreed with the interpreter \
                     on its own, so the difference comes from fusion, partitioning or a \
                     collective",
                    w.ty, self.graph.name
                )))
            };
            if g.ty != w.ty {
                return fail(format!("compiled type {} differs", g.ty));
            }
            if leeway == Leeway::Any {
                continue;
            }
            let tol = match w.ty.dtype {
                DType::F32 => PROGRAM_TOLERANCE_F32,
                DType::F64 => PROGRAM_TOLERANCE_F64,
                DType::F16 => PROGRAM_TOLERANCE_F16,
                DType::BF16 => PROGRAM_TOLERANCE_BF16,
                DType::I32 | DType::U32 | DType::Bool | DType::I64 => 0.0,
            };
            let scale = (0..w.data.len())
                .map(|k| w.data.get_f64(k).abs())
                .filter(|x| x.is_finite())
                .fold(0.0f64, f64::max)
                .max(f64::MIN_POSITIVE);
            for k in 0..w.data.len() {
                let (a, b) = (g.data.get_f64(k), w.data.get_f64(k));
                let same = match (g.data.as_i64(), w.data.as_i64()) {
                    // Exactly: f64 rounds an i64 past 2^53.
                    (Some(x), Some(y)) => x[k] == y[k],
                    _ => a == b || (a.is_nan() && b.is_nan()),
                };
                // A NaN difference (inf - inf) is outside every tolerance.
                let within = w.ty.dtype != DType::I64 && (a - b).abs() <= tol * scale
                    || leeway == Leeway::NonFinite && !(a.is_finite() && b.is_finite());
                if !same && !within {
                    return fail(format!(
                        "element {k}: compiled {a:e}, interpreter {b:e} (tolerance {:e})",
                        tol * scale
                    ));
                }
            }
        }
        Ok(())
    }

    /// The op `id` compiled on its own and run on `args`.
    fn run_alone(&self, id: NodeId, args: &[&Literal]) -> Result<Literal> {
        let node = self.graph.node(id);
        let mut one = Graph::new(format!("check_{}", node.op.name()));
        one.mesh = self.graph.mesh.clone();
        let params: Vec<NodeId> = args.iter().map(|a| one.add_param(a.ty.clone())).collect();
        let out = one
            .add(node.op.clone(), &params)
            .map_err(|e| Error::Check(format!("{}: {e}", node.op.name())))?;
        one.set_outputs(vec![out]);
        let key = print(&one);
        let cached = self.kernels.borrow().get(&key).cloned();
        let exe = match cached {
            Some(e) => e,
            None => {
                let e = Rc::new(
                    tessera_codegen::compile(&one).map_err(|e| Error::Codegen(e.to_string()))?,
                );
                self.kernels.borrow_mut().insert(key, e.clone());
                e
            }
        };
        let mut outs = exe.run(args, &tessera_interp::SingleDevice)?;
        Ok(outs.remove(0))
    }

    /// Region node `id` compiled on its own (with its results as outputs) and run on `args`.
    fn run_region_alone(&self, id: NodeId, args: &[&Literal]) -> Result<Vec<Literal>> {
        let node = self.graph.node(id);
        let mut one = Graph::new(format!("check_{}", node.op.name()));
        one.mesh = self.graph.mesh.clone();
        let params: Vec<NodeId> = args.iter().map(|a| one.add_param(a.ty.clone())).collect();
        let region = one
            .add(node.op.clone(), &params)
            .map_err(|e| Error::Check(format!("{}: {e}", node.op.name())))?;
        let results = one
            .add_results(region)
            .map_err(|e| Error::Check(format!("{}: {e}", node.op.name())))?;
        one.set_outputs(results);
        let exe = tessera_codegen::compile(&one).map_err(|e| Error::Codegen(e.to_string()))?;
        Ok(exe.run(args, &tessera_interp::SingleDevice)?)
    }

    fn report(&self, id: NodeId, args: &[&Literal], diff: &str) -> Error {
        let node = self.graph.node(id);
        let operands: Vec<String> = args.iter().map(|a| summary(a)).collect();
        Error::Check(format!(
            "`{}` at {} differs from the interpreter beyond its bound: {diff}; operands: [{}]",
            node.op.name(),
            node.loc.as_deref().unwrap_or("an unknown line"),
            operands.join("; ")
        ))
    }
}

/// Type, range and NaN/inf count of a value, for reports.
fn summary(l: &Literal) -> String {
    let n = l.data.len();
    let (mut lo, mut hi, mut nan, mut inf) = (f64::INFINITY, f64::NEG_INFINITY, 0, 0);
    for k in 0..n {
        let x = l.data.get_f64(k);
        if x.is_nan() {
            nan += 1;
        } else if x.is_infinite() {
            inf += 1;
        } else {
            lo = lo.min(x);
            hi = hi.max(x);
        }
    }
    if n == 0 {
        return format!("{} (empty)", l.ty);
    }
    let mut s = format!("{} in [{lo:e}, {hi:e}]", l.ty);
    if nan + inf > 0 {
        s.push_str(&format!(", {nan} NaN, {inf} inf"));
    }
    s
}

/// Element pairs as f64 (compiled, interpreter, same bits, ulps apart) with their width's
/// epsilon, smallest subnormal and largest finite value.
type FloatPairs = (Vec<Pair>, f64, f64, f64);

/// One element pair: compiled and interpreter values, whether their bits are equal, and how
/// many ulps apart they are (`None` when one is not finite).
type Pair = (f64, f64, bool, Option<u64>);

/// The first element outside the bound, described, or `None` when all are within it.
/// `magnitude` is an accumulated op's [`magnitudes`] (`None` for other bounds: an accumulated
/// op without them is not checked).
fn compare(
    op: &Op,
    b: Bound,
    got: &Literal,
    want: &Literal,
    args: &[&Literal],
    magnitude: Option<&[f64]>,
) -> Option<String> {
    if got.ty != want.ty {
        return Some(format!("compiled type {} vs {}", got.ty, want.ty));
    }
    if b == Bound::Accumulated {
        magnitude?;
    }
    let terms = match op {
        Op::Reduce { axes, .. } => axes.iter().map(|&a| args[0].ty.dims()[a]).product(),
        Op::DotGeneral(d) => d
            .lhs_contract
            .iter()
            .map(|&a| args[0].ty.dims()[a])
            .product(),
        // One rounding per element.
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
        | Op::ArgMax { .. }
        | Op::Collective(_)
        | Op::ShardingConstraint(_)
        | Op::StopGradient
        | Op::Region(_)
        | Op::GetResult { .. }
        | Op::ReduceWindow { .. }
        | Op::Gather(_)
        | Op::Scatter(_)
        | Op::Sort { .. }
        | Op::Cumulative { .. }
        | Op::Rev { .. } => 1usize,
        // Input features of a group times the kernel's window.
        Op::Conv(cd) => {
            let r = args[1].ty.dims();
            std::iter::once(cd.rhs_spec[1])
                .chain(cd.rhs_spec[2..].iter().copied())
                .map(|d| r[d])
                .product()
        }
    };
    let describe = |k: usize, extra: String| {
        Some(format!(
            "element {k} of {}: compiled {}, interpreter {}{extra}",
            want.ty,
            got.data.element_text(k),
            want.data.element_text(k)
        ))
    };
    // One float path for both widths: the values as f64, with the width's ulp distance,
    // epsilon, smallest subnormal and largest finite value.
    let f32s = got.data.as_f32().zip(want.data.as_f32());
    let f64s = got.data.as_f64().zip(want.data.as_f64());
    let floats: Option<FloatPairs> = if let Some((g, w)) = f32s {
        Some((
            g.iter()
                .zip(w)
                .map(|(&x, &y)| {
                    (
                        x as f64,
                        y as f64,
                        x.to_bits() == y.to_bits(),
                        ulps_f32(x, y),
                    )
                })
                .collect(),
            f32::EPSILON as f64,
            1.401_298_5e-45,
            f32::MAX as f64,
        ))
    } else if let Some(pairs) = narrow_pairs(got, want) {
        // f16/bf16: the f32 op rounded once more, so an f32 ulp bound is one narrow ulp; an
        // accumulated one gains the final rounding (`eps`, the narrow type's).
        let (eps, tiny, max) = match want.ty.dtype {
            DType::F16 => (2f64.powi(-10), 2f64.powi(-24), 65504.0),
            _ => (2f64.powi(-7), 2f64.powi(-133), bf16::MAX.to_f64()),
        };
        Some((pairs, eps, tiny, max))
    } else {
        f64s.map(|(g, w)| {
            (
                g.iter()
                    .zip(w)
                    .map(|(&x, &y)| (x, y, x.to_bits() == y.to_bits(), ulps_f64(x, y)))
                    .collect(),
                f64::EPSILON,
                5e-324,
                f64::MAX,
            )
        })
    };
    if let Some((pairs, eps, tiny, max)) = floats {
        for (k, &(x, y, same_bits, ulps)) in pairs.iter().enumerate() {
            if same_bits || (x.is_nan() && y.is_nan()) {
                continue;
            }
            let narrow = want.ty.dtype.is_narrow_float();
            let ok = match b {
                Bound::Exact | Bound::Unchecked => false,
                Bound::Ulps(u) if narrow => ulps.is_some_and(|d| d <= u.min(1)),
                Bound::Ulps(u) => ulps.is_some_and(|d| d <= u),
                Bound::Accumulated if narrow => {
                    let m = magnitude.map_or(0.0, |m| m[k]);
                    let tol = terms as f64 * (f32::EPSILON as f64 * m + 2.0 * tiny) + eps * y.abs();
                    within_sum_bound(x, y, m, tol, max)
                }
                Bound::Accumulated => {
                    let m = magnitude.map_or(0.0, |m| m[k]);
                    // Relative error per step, plus, where values are subnormal, an absolute
                    // half-ulp of the smallest subnormal per product and per sum.
                    let tol = terms as f64 * (eps * m + 2.0 * tiny);
                    within_sum_bound(x, y, m, tol, max)
                }
            };
            if !ok {
                let extra = match ulps {
                    Some(d) => format!(" ({d} ulp, bound {b:?})"),
                    None => format!(" (bound {b:?})"),
                };
                return describe(k, extra);
            }
        }
        return None;
    }
    // Integers and bools: bit for bit.
    let (g, w) = (&got.data, &want.data);
    (0..w.len())
        .find(|&k| g.element_text(k) != w.element_text(k))
        .and_then(|k| describe(k, String::new()))
}

/// f16 or bf16 element pairs as f64 (compiled, interpreter, same bits, ulps of the narrow type
/// apart), or `None` for other types.
fn narrow_pairs(got: &Literal, want: &Literal) -> Option<Vec<Pair>> {
    fn pairs<T: Copy>(g: &[T], w: &[T], bits: fn(T) -> u16, value: fn(T) -> f64) -> Vec<Pair> {
        // Ordered like the integers, as `ulps_f32`'s key.
        let key = |b: u16| {
            let b = b as i64;
            if b < 0x8000 { b } else { 0x8000 - b }
        };
        g.iter()
            .zip(w)
            .map(|(&x, &y)| {
                let (xv, yv) = (value(x), value(y));
                let ulps =
                    (xv.is_finite() && yv.is_finite()).then(|| key(bits(x)).abs_diff(key(bits(y))));
                (xv, yv, bits(x) == bits(y), ulps)
            })
            .collect()
    }
    match (&got.data, &want.data) {
        (Data::F16(g), Data::F16(w)) => Some(pairs(g, w, f16::to_bits, f16::to_f64)),
        (Data::BF16(g), Data::BF16(w)) => Some(pairs(g, w, bf16::to_bits, bf16::to_f64)),
        _ => None,
    }
}

/// Whether a sum computed in some order (`got`) is within the rounding error of another
/// order (`want`), given `m`, the sum of the terms' magnitudes: NaN when a term is NaN (then
/// every order gives NaN); past the type's largest finite value partial sums may overflow in
/// one order and not another, so inf, -inf, NaN and finite values are all possible results.
fn within_sum_bound(got: f64, want: f64, m: f64, tol: f64, max: f64) -> bool {
    if m.is_nan() {
        got.is_nan() && want.is_nan()
    } else if m > max {
        true
    } else {
        (got - want).abs() <= tol
    }
}

/// Ulps between two finite floats of the same sign class; `None` when one is NaN or infinite
/// and they differ (never within any bound).
fn ulps_f32(x: f32, y: f32) -> Option<u64> {
    if !x.is_finite() || !y.is_finite() {
        return None;
    }
    let key = |v: f32| {
        let b = v.to_bits() as i64;
        if b < 0x8000_0000 { b } else { 0x8000_0000 - b }
    };
    Some(key(x).abs_diff(key(y)))
}

fn ulps_f64(x: f64, y: f64) -> Option<u64> {
    if !x.is_finite() || !y.is_finite() {
        return None;
    }
    let key = |v: f64| {
        let b = v.to_bits() as i128;
        if b < 1 << 63 { b } else { (1i128 << 63) - b }
    };
    u64::try_from(key(x).abs_diff(key(y))).ok()
}

/// What a sum whose terms' magnitudes add up to `m` leaves its users: past f32's (f64's)
/// largest value, partial sums overflow in some orders and not others (`Any`); f16 and bf16
/// sum in f32 and round once, so past their own largest value only that rounding differs
/// (inf against the largest finite value: `NonFinite`). Integer sums are exact modulo 2^n in
/// every order.
fn sum_leeway(dtype: DType, m: f64) -> Leeway {
    let wide = f32::MAX as f64;
    let (any, non_finite) = match dtype {
        DType::F32 => (wide, wide),
        DType::F64 => (f64::MAX, f64::MAX),
        DType::F16 => (wide, 65504.0),
        DType::BF16 => (wide, bf16::MAX.to_f64()),
        DType::I32 | DType::U32 | DType::Bool | DType::I64 => return Leeway::Tolerance,
    };
    if m > any {
        Leeway::Any
    } else if m > non_finite {
        Leeway::NonFinite
    } else {
        Leeway::Tolerance
    }
}

/// Whether a graph, or a region inside it, sums (an op whose bound is `Accumulated`).
fn sums(g: &Graph) -> bool {
    g.topo_order().into_iter().any(|id| {
        let op = &g.node(id).op;
        bound(op) == Bound::Accumulated
            || matches!(op, Op::Region(r) if r.regions().iter().any(|(_, body)| sums(body)))
    })
}

/// For a sum or a dot: the same reduction over the operands' absolute values, in f64, which
/// bounds the rounding error of any order of summation. An infinite operand counts as 0: a
/// term it makes is infinite (or NaN) in every order, and the sum then is the same in every
/// order (inf, -inf, or NaN when both or a NaN occur) unless the finite terms overflow, which
/// their magnitudes tell. A NaN operand stays NaN (the sum is NaN in every order).
fn magnitudes(op: &Op, args: &[&Literal], ty: &TensorType) -> Option<Vec<f64>> {
    let abs = |l: &Literal| {
        let finite_abs = |x: f64| if x.is_infinite() { 0.0 } else { x.abs() };
        let v: Vec<f64> = (0..l.data.len())
            .map(|k| finite_abs(l.data.get_f64(k)))
            .collect();
        Literal::new(l.ty.shape.clone(), Data::F64(v))
    };
    let wide: Vec<Literal> = args.iter().map(|a| abs(a)).collect::<Option<_>>()?;
    let refs: Vec<&Literal> = wide.iter().collect();
    let out_ty = TensorType::new(DType::F64, ty.shape.clone());
    let m = tessera_interp::eval_op(op, &refs, &out_ty).ok()?;
    m.data.into_vec::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_count_across_zero() {
        assert_eq!(ulps_f32(0.0, -0.0), Some(0));
        assert_eq!(ulps_f32(1.0, f32::from_bits(1.0f32.to_bits() + 3)), Some(3));
        assert_eq!(ulps_f32(f32::from_bits(1), -f32::from_bits(1)), Some(2));
        assert_eq!(ulps_f32(f32::INFINITY, f32::MAX), None);
    }

    #[test]
    fn a_wrong_kernel_is_reported_with_its_line() {
        let mut g = Graph::new("f");
        let p = g.add_param(TensorType::new(DType::F32, vec![3]));
        let t = g.add(Op::Unary(UnaryOp::Tanh), &[p]).unwrap();
        g.node_mut(t).loc = Some("src/model.rs:7".into());
        g.set_outputs(vec![t]);
        let checker = Checker::new(g);
        let x = Literal::new(vec![3], Data::F32(vec![0.5, -1.0, 3.0])).unwrap();
        // The real kernel agrees with the interpreter.
        let want = checker.check_ops(&[&x]).unwrap();
        checker.check_outputs(&want.outputs, &want).unwrap();
        // A result off by 100 ulp in one element is reported by the whole-program check
        // only beyond its tolerance, and by `compare` with the op's bound.
        let Data::F32(v) = &want.outputs[0].data else {
            panic!()
        };
        let mut bad = v.clone();
        bad[1] = f32::from_bits(bad[1].to_bits() + 100);
        let bad = Literal::new(vec![3], Data::F32(bad)).unwrap();
        let diff = compare(
            &Op::Unary(UnaryOp::Tanh),
            Bound::Ulps(8),
            &bad,
            &want.outputs[0],
            &[&x],
            None,
        );
        assert!(diff.unwrap().contains("element 1"));
        let err = checker.report(t, &[&x], "element 1").to_string();
        assert!(err.contains("`tanh` at src/model.rs:7"), "{err}");
    }

    #[test]
    fn exact_ops_tell_the_zeros_apart_and_ulps_bounds_hold() {
        let l = |v: f32| Literal::new(Vec::<usize>::new(), Data::F32(vec![v])).unwrap();
        let l64 = |v: f64| Literal::new(Vec::<usize>::new(), Data::F64(vec![v])).unwrap();
        let neg = Op::Unary(UnaryOp::Neg);
        assert!(compare(&neg, Bound::Exact, &l(0.0), &l(-0.0), &[], None).is_some());
        assert!(compare(&neg, Bound::Exact, &l64(0.0), &l64(-0.0), &[], None).is_some());
        assert_eq!(
            compare(&neg, Bound::Exact, &l(f32::NAN), &l(-f32::NAN), &[], None),
            None
        );
        let near = f32::from_bits(1.0f32.to_bits() + 2);
        assert_eq!(
            compare(&neg, Bound::Ulps(2), &l(near), &l(1.0), &[], None),
            None
        );
        assert!(compare(&neg, Bound::Ulps(1), &l(near), &l(1.0), &[], None).is_some());
        assert!(
            compare(
                &neg,
                Bound::Ulps(9),
                &l(f32::INFINITY),
                &l(f32::MAX),
                &[],
                None
            )
            .is_some()
        );
    }

    #[test]
    fn a_reordered_sum_is_within_its_bound_and_a_wrong_one_is_not() {
        let x = Literal::new(vec![4], Data::F32(vec![1e8, 1.0, -1e8, 1.0])).unwrap();
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![0],
        };
        let want = Literal::new(Vec::<usize>::new(), Data::F32(vec![2.0])).unwrap();
        let ty = want.ty.clone();
        let m = magnitudes(&op, &[&x], &ty);
        let m = m.as_deref();
        // Summed left to right in f32 the ones are lost: 0, within 4 * eps * 2e8 + 2.
        let reordered = Literal::new(Vec::<usize>::new(), Data::F32(vec![0.0])).unwrap();
        assert_eq!(
            compare(&op, Bound::Accumulated, &reordered, &want, &[&x], m),
            None
        );
        let wrong = Literal::new(Vec::<usize>::new(), Data::F32(vec![1e3])).unwrap();
        assert!(compare(&op, Bound::Accumulated, &wrong, &want, &[&x], m).is_some());
    }

    /// A sum past f32's largest value may come out of the compiled program as anything (a
    /// fused multiply-add gives `-MAX * -MAX + -inf = -inf` where the interpreter's rounded
    /// product gives `inf + -inf = NaN`): check 2 accepts any difference in the outputs that
    /// depend on it, and only in those.
    #[test]
    fn outputs_past_an_overflowing_sum_may_differ_and_only_those() {
        let mut g = Graph::new("f");
        let a = g.add_param(TensorType::new(DType::F32, vec![1, 2]));
        let b = g.add_param(TensorType::new(DType::F32, vec![2, 1]));
        let dot = Op::DotGeneral(tessera_ir::DotDims::matmul());
        let d = g.add(dot, &[a, b]).unwrap();
        let t = g.add(Op::Unary(UnaryOp::Tanh), &[d]).unwrap();
        let other = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        g.set_outputs(vec![t, other]);
        let checker = Checker::new(g);
        let lit = |shape: Vec<usize>, v: Vec<f32>| Literal::new(shape, Data::F32(v)).unwrap();
        let x = lit(vec![1, 2], vec![-f32::MAX, f32::NEG_INFINITY]);
        let y = lit(vec![2, 1], vec![-f32::MAX, 1.0]);
        let want = checker.check_ops(&[&x, &y]).unwrap();
        assert_eq!(want.leeway, vec![Leeway::Any, Leeway::Tolerance]);
        assert!(want.outputs[0].data.get_f64(0).is_nan());
        let fused = [lit(vec![1, 1], vec![-1.0]), want.outputs[1].clone()];
        checker.check_outputs(&fused, &want).unwrap();
        let wrong = [
            want.outputs[0].clone(),
            lit(vec![1, 2], vec![f32::MAX, 0.0]),
        ];
        let err = checker
            .check_outputs(&wrong, &want)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("output 1") && err.contains("element 1"),
            "{err}"
        );
        // Finite terms: the whole-program tolerance.
        let y = lit(vec![2, 1], vec![1.0, 0.0]);
        let x = lit(vec![1, 2], vec![0.5, 2.0]);
        let want = checker.check_ops(&[&x, &y]).unwrap();
        assert_eq!(want.leeway, vec![Leeway::Tolerance; 2]);
        let off = [lit(vec![1, 1], vec![-1.0]), want.outputs[1].clone()];
        assert!(checker.check_outputs(&off, &want).is_err());
        // An infinite term with small finite ones: the same sum in every order (inf).
        let x = lit(vec![1, 2], vec![f32::INFINITY, 3.0]);
        let want = checker.check_ops(&[&x, &y]).unwrap();
        assert_eq!(want.leeway, vec![Leeway::Tolerance; 2]);
    }

    /// The leeway of a sum by width: f16 sums in f32 and rounds once, so past 65504 only
    /// inf against a finite value may differ; a NonFinite output still rejects a finite
    /// difference.
    #[test]
    fn sum_leeway_by_width_and_what_non_finite_accepts() {
        assert_eq!(sum_leeway(DType::F16, 7e4), Leeway::NonFinite);
        assert_eq!(sum_leeway(DType::F16, 4e38), Leeway::Any);
        assert_eq!(sum_leeway(DType::F32, 7e4), Leeway::Tolerance);
        assert_eq!(sum_leeway(DType::F32, 4e38), Leeway::Any);
        assert_eq!(sum_leeway(DType::I32, 4e38), Leeway::Tolerance);
        let mut g = Graph::new("f");
        let p = g.add_param(TensorType::new(DType::F32, vec![2]));
        g.set_outputs(vec![p]);
        let checker = Checker::new(g);
        let lit = |v: Vec<f32>| Literal::new(vec![2], Data::F32(v)).unwrap();
        let want = Reference {
            outputs: vec![lit(vec![1.0, f32::INFINITY])],
            leeway: vec![Leeway::NonFinite],
        };
        checker
            .check_outputs(&[lit(vec![1.0, f32::NAN])], &want)
            .unwrap();
        checker
            .check_outputs(&[lit(vec![1.0, 2.0])], &want)
            .unwrap();
        let err = checker
            .check_outputs(&[lit(vec![1.5, f32::INFINITY])], &want)
            .unwrap_err();
        assert!(err.to_string().contains("element 0"), "{err}");
    }

    /// A loop whose body sums gives NonFinite leeway only when its operands or results hold
    /// an inf or a NaN.
    #[test]
    fn a_summing_loop_gets_leeway_only_with_non_finite_values() {
        use crate::prelude::*;
        let looped = |(c, xs): (Tensor, Tensor)| {
            let (c, _) = scan(
                |c: &Tensor, x: &Tensor| (c + x.sum(), c.clone()),
                &c,
                &xs,
                None,
                false,
            );
            c
        };
        let c = Tensor::zeros([]);
        let graph = |xs: &Tensor| {
            crate::jit::make_ir(looped)(&(c.clone(), xs.clone()))
                .unwrap()
                .graph()
                .clone()
        };
        let finite = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        let checker = Checker::new(graph(&finite));
        let leeway = |xs: &Tensor| {
            let inputs = [&c, xs].map(|t| t.try_array().unwrap().literal());
            checker.check_ops(&inputs).unwrap().leeway
        };
        assert_eq!(leeway(&finite), vec![Leeway::Tolerance]);
        let inf = Tensor::from_vec(vec![1.0f32, f32::INFINITY, 3.0, 4.0], [2, 2]);
        assert_eq!(leeway(&inf), vec![Leeway::NonFinite]);
    }
}
