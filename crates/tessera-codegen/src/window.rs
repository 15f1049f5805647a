//! Native kernels of the windowed ops, run as schedule steps of their own
//! (`StepKind::Window`): `conv_general_dilated` as im2col + GEMM (the `gemm` crate, as
//! `dot_general`), and `reduce_window` as a direct loop when fusion does not make it a
//! reduction kernel (`fusion::window_as_kernel`: a window far larger than its operand, or
//! coordinates near i64's limits).
//!
//! Both see the window through per-dim tables: for result position `p` and window position
//! `k` along a dim, the operand index read, or none in the padding (a dilation hole, or beyond
//! an edge: `tessera_interp::conv::source_index`). Every index comes from these tables, so
//! every read is inside the operand whatever the shapes: zero-size dims give empty loops,
//! padding larger than the operand gives windows of padding only.
//!
//! `reduce_window` combines each window in row-major window order, skipping padding, in the
//! operand's type: the interpreter's order, so the results agree bit for bit. A conv's sums
//! run in the GEMM's order (an accumulated bound, as `dot_general`); a kernel holding an inf
//! or NaN takes direct loops that skip the padding, as XLA does (im2col's zeros would make
//! `0 * inf` NaNs there).

use tessera_interp::conv::source_index;
use tessera_interp::scalar::{fmax, fmin};
use tessera_interp::unravel;
use tessera_ir::{ConvDims, DType, ReduceKind, TensorType, WindowDims};

use std::sync::{Arc, OnceLock};

use tessera_interp::InterpError;

use crate::exec::gemm_view;

/// A work table of `n` elements, each `v` (`n` elements reserved, none set when `v` is
/// `None`), or an error naming `op` when it cannot be allocated: a huge window or padding
/// (a window of 2^36 positions, a padding of 2^17 around a kernel of 2^17) asks for more
/// memory than there is, which is an error, not an abort.
fn table<T: Clone>(op: &str, n: Option<usize>, v: Option<T>) -> Result<Vec<T>, InterpError> {
    let fail = |n: Option<usize>| InterpError::Op {
        op: op.into(),
        message: format!(
            "cannot allocate a work table of {} elements of {} bytes (the window and padding \
             are too large)",
            n.map_or("more than usize::MAX".into(), |n| n.to_string()),
            std::mem::size_of::<T>()
        ),
    };
    let n = n.ok_or_else(|| fail(None))?;
    let mut t = Vec::new();
    t.try_reserve_exact(n).map_err(|_| fail(Some(n)))?;
    if let Some(v) = v {
        t.resize(n, v);
    }
    Ok(t)
}

/// A windowed op with its operand types and result type, and its index tables (built by the
/// first run, which depend on the shapes only, then shared by every run and device thread).
#[derive(Clone, Debug)]
pub enum WindowStep {
    Conv {
        dims: ConvDims,
        lhs: TensorType,
        rhs: TensorType,
        out: TensorType,
        plan: Arc<OnceLock<ConvPlan>>,
    },
    ReduceWindow {
        kind: ReduceKind,
        win: WindowDims,
        operand: TensorType,
        out: TensorType,
        plan: Arc<OnceLock<PoolPlan>>,
    },
}

/// `cache`'s value, or `build`'s, stored when it succeeds (an allocation failure is an error
/// each time, never cached).
fn cached<T>(
    cache: &OnceLock<T>,
    build: impl FnOnce() -> Result<T, InterpError>,
) -> Result<&T, InterpError> {
    if let Some(t) = cache.get() {
        return Ok(t);
    }
    let t = build()?;
    Ok(cache.get_or_init(|| t))
}

impl WindowStep {
    pub fn summary(&self) -> String {
        match self {
            WindowStep::Conv { lhs, rhs, out, .. } => format!("conv {lhs} x {rhs} -> {out}"),
            WindowStep::ReduceWindow {
                kind, operand, out, ..
            } => format!("reduce_window {} {operand} -> {out}", kind.name()),
        }
    }
}

/// For one dim: `table[p * nk + k]` is the operand index result position `p`, window
/// position `k` reads, or `None`.
#[allow(clippy::too_many_arguments)]
fn dim_table(
    op: &str,
    n_out: usize,
    nk: usize,
    stride: usize,
    lo: i64,
    window_dilation: usize,
    base_dilation: usize,
    n: usize,
) -> Result<Vec<Option<usize>>, InterpError> {
    let mut t = table(op, n_out.checked_mul(nk), None)?;
    for p in 0..n_out {
        for k in 0..nk {
            t.push(source_index(
                p,
                k,
                stride,
                lo,
                window_dilation,
                base_dilation,
                n,
            ));
        }
    }
    Ok(t)
}

/// Element access over the buffers' element types.
trait Elem:
    Copy + Default + Send + Sync + 'static + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    const DTYPE: DType;
    fn is_finite(self) -> bool;
}
impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}
impl Elem for f64 {
    const DTYPE: DType = DType::F64;
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}

/// Runs `step` on its operand buffers `inputs` (as many elements as their types hold) into
/// `out`; a conv's GEMMs of at least `parallel_from` multiply-adds use the thread pool (the
/// executable's policy: never, for a device thread of the sharded runtime).
///
/// An error when a work table cannot be allocated (nothing is written then).
///
/// # Safety
/// `inputs[i]` points to a readable value of the step's operand `i` type, `out` to writable
/// room for a value of its result type that overlaps no input.
pub unsafe fn run(
    step: &WindowStep,
    inputs: &[*const u8],
    out: *mut u8,
    parallel_from: usize,
) -> Result<(), InterpError> {
    match step {
        WindowStep::Conv {
            dims,
            lhs,
            rhs,
            out: ot,
            plan,
        } => {
            if ot.numel() == 0 {
                return Ok(());
            }
            let plan = cached(plan, || ConvPlan::new(dims, lhs, rhs, ot))?;
            // SAFETY: the caller's contract: each buffer holds a value of its type.
            unsafe {
                match lhs.dtype {
                    DType::F32 => {
                        conv::<f32>(dims, (lhs, rhs, ot), plan, (inputs, out), parallel_from)
                    }
                    DType::F64 => {
                        conv::<f64>(dims, (lhs, rhs, ot), plan, (inputs, out), parallel_from)
                    }
                    // The type rule admits float convs only, and narrow.rs computes f16 and
                    // bf16 in f32.
                    DType::I32
                    | DType::U32
                    | DType::Bool
                    | DType::I64
                    | DType::F16
                    | DType::BF16 => Ok(()),
                }
            }
        }
        WindowStep::ReduceWindow {
            kind,
            win,
            operand,
            out: ot,
            plan,
        } => {
            let n_in = operand.numel();
            let n_out = ot.numel();
            if n_out == 0 {
                return Ok(());
            }
            let plan = cached(plan, || PoolPlan::new(win, operand.dims(), ot.dims()))?;
            // SAFETY: the caller's contract: the input holds `n_in` elements of its dtype, the
            // output has room for `n_out`, and they do not overlap.
            unsafe {
                macro_rules! go {
                    ($t:ty, $init:expr, $f:expr) => {{
                        let x = std::slice::from_raw_parts(inputs[0] as *const $t, n_in);
                        let o = std::slice::from_raw_parts_mut(out as *mut $t, n_out);
                        reduce_window(plan, ot.dims(), x, o, $init, $f);
                        Ok(())
                    }};
                }
                match (operand.dtype, kind) {
                    (DType::F32, ReduceKind::Sum) => go!(f32, 0.0, |a, b| a + b),
                    (DType::F32, ReduceKind::Max) => go!(f32, f32::NEG_INFINITY, fmax),
                    (DType::F32, ReduceKind::Min) => go!(f32, f32::INFINITY, fmin),
                    (DType::F64, ReduceKind::Sum) => go!(f64, 0.0, |a, b| a + b),
                    (DType::F64, ReduceKind::Max) => go!(f64, f64::NEG_INFINITY, fmax),
                    (DType::F64, ReduceKind::Min) => go!(f64, f64::INFINITY, fmin),
                    (DType::I32, ReduceKind::Sum) => go!(i32, 0, |a: i32, b| a.wrapping_add(b)),
                    (DType::I32, ReduceKind::Max) => go!(i32, i32::MIN, |a: i32, b| a.max(b)),
                    (DType::I32, ReduceKind::Min) => go!(i32, i32::MAX, |a: i32, b| a.min(b)),
                    (DType::U32, ReduceKind::Sum) => go!(u32, 0, |a: u32, b| a.wrapping_add(b)),
                    (DType::U32, ReduceKind::Max) => go!(u32, u32::MIN, |a: u32, b| a.max(b)),
                    (DType::U32, ReduceKind::Min) => go!(u32, u32::MAX, |a: u32, b| a.min(b)),
                    (DType::I64, ReduceKind::Sum) => go!(i64, 0, |a: i64, b| a.wrapping_add(b)),
                    (DType::I64, ReduceKind::Max) => go!(i64, i64::MIN, |a: i64, b| a.max(b)),
                    (DType::I64, ReduceKind::Min) => go!(i64, i64::MAX, |a: i64, b| a.min(b)),
                    // The type rule rejects bool; narrow.rs computes f16 and bf16 in f32.
                    (DType::Bool | DType::F16 | DType::BF16, _) => Ok(()),
                }
            }
        }
    }
}

/// `reduce_window`'s tables: per dim, the operand offset (index times stride) of result
/// position `p` and window position `k` at `p * window + k`, or none in the padding; and the
/// window positions, flat (`r` coordinates each, row-major).
#[derive(Clone, Debug)]
pub struct PoolPlan {
    offs: Vec<Vec<Option<usize>>>,
    window: Vec<usize>,
    ks: Vec<usize>,
    /// Without padding or base dilation every window lies inside the operand: then each
    /// result position's window starts at `sum(p[d] * step[d])` and holds the offsets `kofs`
    /// (row-major window order).
    dense: Option<(Vec<usize>, Vec<usize>)>,
}

impl PoolPlan {
    fn new(win: &WindowDims, in_dims: &[usize], out_dims: &[usize]) -> Result<Self, InterpError> {
        let op = "reduce_window";
        let r = in_dims.len();
        let strides = tessera_ir::Shape::new(in_dims.to_vec()).strides();
        let offs = (0..r)
            .map(|d| {
                let t = dim_table(
                    op,
                    out_dims[d],
                    win.window[d],
                    win.strides[d],
                    win.padding[d].0,
                    win.window_dilation[d],
                    win.base_dilation[d],
                    in_dims[d],
                )?;
                Ok(t.into_iter().map(|i| i.map(|i| i * strides[d])).collect())
            })
            .collect::<Result<_, InterpError>>()?;
        let nk = win.window.iter().try_fold(1usize, |a, &w| a.checked_mul(w));
        let mut ks = table(op, nk.and_then(|n| n.checked_mul(r)), None)?;
        // `table` has refused an `nk` past usize::MAX.
        for kf in 0..nk.unwrap_or(0) {
            ks.extend(unravel(kf, &win.window));
        }
        let unpadded = win.padding.iter().all(|&(lo, hi)| lo == 0 && hi == 0)
            && win.base_dilation.iter().all(|&d| d == 1);
        let dense = unpadded.then(|| {
            let step: Vec<usize> = (0..r).map(|d| win.strides[d] * strides[d]).collect();
            let kofs: Vec<usize> = ks
                .chunks_exact(r.max(1))
                .map(|k| {
                    (0..r)
                        .map(|d| k[d] * win.window_dilation[d] * strides[d])
                        .sum()
                })
                .collect();
            (step, kofs)
        });
        Ok(PoolPlan {
            offs,
            window: win.window.clone(),
            ks,
            dense,
        })
    }
}

/// Each result element: its window combined in row-major window order, padding skipped (the
/// interpreter's order). The result position runs as an odometer over `out_dims`.
fn reduce_window<T: Copy>(
    plan: &PoolPlan,
    out_dims: &[usize],
    x: &[T],
    o: &mut [T],
    init: T,
    f: impl Fn(T, T) -> T,
) {
    let r = out_dims.len();
    if r == 0 {
        // A scalar: its one element, combined once.
        if let (Some(slot), Some(&v)) = (o.first_mut(), x.first()) {
            *slot = f(init, v);
        }
        return;
    }
    let mut p = vec![0usize; r];
    if let Some((step, kofs)) = &plan.dense {
        // Every window inside the operand (the tables say so too): the same reads in the same
        // order, from a running base offset.
        let mut base = 0usize;
        for slot in o.iter_mut() {
            let mut acc = init;
            for &k in kofs {
                acc = f(acc, x[base + k]);
            }
            *slot = acc;
            for d in (0..r).rev() {
                p[d] += 1;
                base += step[d];
                if p[d] < out_dims[d] {
                    break;
                }
                base -= step[d] * p[d];
                p[d] = 0;
            }
        }
        return;
    }
    for slot in o.iter_mut() {
        let mut acc = init;
        'k: for k in plan.ks.chunks_exact(r) {
            let mut off = 0;
            for d in 0..r {
                match plan.offs[d][p[d] * plan.window[d] + k[d]] {
                    Some(i) => off += i,
                    None => continue 'k,
                }
            }
            acc = f(acc, x[off]);
        }
        *slot = acc;
        for d in (0..r).rev() {
            p[d] += 1;
            if p[d] < out_dims[d] {
                break;
            }
            p[d] = 0;
        }
    }
}

/// A conv's tables: for every (result position, window position) the lhs offset of its
/// spatial part or none in the padding (`sp_off[pf * nk + kf]`), the kernel's spatial offset
/// of each window position (reversed with `window_reversal`), and each result position's
/// spatial offset in the result.
///
/// When the lhs features are not adjacent in memory (a kernel gradient reads the batch as
/// its features), the run first repacks the lhs with the feature dim innermost, so the patch
/// rows are contiguous copies: `lhs_strides` are the strides of the layout the tables use.
#[derive(Clone, Debug)]
pub struct ConvPlan {
    sp_off: Vec<Option<usize>>,
    k_off: Vec<usize>,
    p_out: Vec<usize>,
    lhs_strides: Vec<usize>,
    repack: bool,
}

impl ConvPlan {
    fn new(
        cd: &ConvDims,
        lt: &TensorType,
        rt: &TensorType,
        ot: &TensorType,
    ) -> Result<Self, InterpError> {
        let op = "conv_general_dilated";
        let s = cd.spatial();
        let (ld, rd, od) = (lt.dims(), rt.dims(), ot.dims());
        let (rs, os) = (rt.shape.strides(), ot.shape.strides());
        let feat = cd.lhs_spec[1];
        let repack = lt.shape.strides()[feat] != 1 && ld[feat] > 1;
        let ls = if repack {
            // Row-major over the other dims in order, then the features.
            let mut ls = vec![0; ld.len()];
            let mut acc = 1;
            for d in std::iter::once(feat).chain((0..ld.len()).rev().filter(|&d| d != feat)) {
                ls[d] = acc;
                acc *= ld[d];
            }
            ls
        } else {
            lt.shape.strides()
        };
        let kdims: Vec<usize> = (0..s).map(|j| rd[cd.rhs_spec[2 + j]]).collect();
        let pdims: Vec<usize> = (0..s).map(|j| od[cd.out_spec[2 + j]]).collect();
        let nk: usize = kdims.iter().product();
        let np: usize = pdims.iter().product();
        let tables: Vec<Vec<Option<usize>>> = (0..s)
            .map(|j| {
                dim_table(
                    op,
                    pdims[j],
                    kdims[j],
                    cd.strides[j],
                    cd.padding[j].0,
                    cd.rhs_dilation[j],
                    cd.lhs_dilation[j],
                    ld[cd.lhs_spec[2 + j]],
                )
            })
            .collect::<Result<_, _>>()?;
        let mut ks: Vec<Vec<usize>> = table(op, Some(nk), None)?;
        ks.extend((0..nk).map(|kf| unravel(kf, &kdims)));
        let mut ps: Vec<Vec<usize>> = table(op, Some(np), None)?;
        ps.extend((0..np).map(|pf| unravel(pf, &pdims)));
        let mut sp_off: Vec<Option<usize>> = table(op, np.checked_mul(nk), None)?;
        for p in &ps {
            'k: for k in &ks {
                let mut off = 0;
                for j in 0..s {
                    match tables[j][p[j] * kdims[j] + k[j]] {
                        Some(i) => off += i * ls[cd.lhs_spec[2 + j]],
                        None => {
                            sp_off.push(None);
                            continue 'k;
                        }
                    }
                }
                sp_off.push(Some(off));
            }
        }
        let k_off = ks
            .iter()
            .map(|k| {
                (0..s)
                    .map(|j| {
                        let kj = if cd.window_reversal {
                            kdims[j] - 1 - k[j]
                        } else {
                            k[j]
                        };
                        kj * rs[cd.rhs_spec[2 + j]]
                    })
                    .sum()
            })
            .collect();
        let p_out = ps
            .iter()
            .map(|p| (0..s).map(|j| p[j] * os[cd.out_spec[2 + j]]).sum())
            .collect();
        Ok(ConvPlan {
            sp_off,
            k_off,
            p_out,
            lhs_strides: ls,
            repack,
        })
    }
}

/// `l` (row-major over `dims`) copied into the layout with `strides`, a permutation of it.
fn repack<T: Copy + Default>(
    op: &str,
    l: &[T],
    dims: &[usize],
    strides: &[usize],
) -> Result<Vec<T>, InterpError> {
    let mut out = table(op, Some(l.len()), Some(T::default()))?;
    let r = dims.len();
    let mut idx = vec![0usize; r];
    let mut off = 0usize;
    for &v in l {
        out[off] = v;
        for d in (0..r).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < dims[d] {
                break;
            }
            off -= strides[d] * dims[d];
            idx[d] = 0;
        }
    }
    Ok(out)
}

/// The most patch-matrix elements one GEMM of a conv takes (16 MiB of f32): the batch is
/// folded into the GEMM's rows in chunks of at most this.
const PATCH_ELEMENTS: usize = 1 << 22;

/// im2col + GEMM per group over chunks of the result batch: the patch matrix
/// `[batch * positions, K * cin]` (columns: window position, then input feature, so an NHWC
/// operand's features are copied contiguously) times the group's kernel matrix
/// `[K * cin, O / G]`, scattered into the result's layout.
///
/// # Safety
/// As [`run`].
unsafe fn conv<T: Elem>(
    cd: &ConvDims,
    (lt, rt, ot): (&TensorType, &TensorType, &TensorType),
    plan: &ConvPlan,
    (inputs, out): (&[*const u8], *mut u8),
    parallel_from: usize,
) -> Result<(), InterpError> {
    let op = "conv_general_dilated";
    let n_out = ot.numel();
    // SAFETY: the caller's contract: each buffer holds a value of its type, the output does not
    // overlap the inputs.
    let (l, r, o) = unsafe {
        (
            std::slice::from_raw_parts(inputs[0] as *const T, lt.numel()),
            std::slice::from_raw_parts(inputs[1] as *const T, rt.numel()),
            std::slice::from_raw_parts_mut(out as *mut T, n_out),
        )
    };
    if o.is_empty() {
        return Ok(());
    }
    let (ld, rd, od) = (lt.dims(), rt.dims(), ot.dims());
    let (ls, rs, os) = (&plan.lhs_strides, rt.shape.strides(), ot.shape.strides());
    let repacked;
    let l: &[T] = if plan.repack {
        repacked = repack(op, l, ld, ls)?;
        &repacked
    } else {
        l
    };
    let (fg, bg) = (cd.feature_group_count, cd.batch_group_count);
    let groups = fg * bg;
    let cin = ld[cd.lhs_spec[1]] / fg;
    let o_feat = rd[cd.rhs_spec[0]];
    let og = o_feat / groups;
    let nb = od[cd.out_spec[0]];
    let (sp_off, k_off, p_out) = (&plan.sp_off, &plan.k_off, &plan.p_out);
    let nk = k_off.len();
    let np = p_out.len();
    let kk = cin * nk;
    let (lc, lbs) = (ls[cd.lhs_spec[1]], ls[cd.lhs_spec[0]]);
    let (oc, obs) = (os[cd.out_spec[1]], os[cd.out_spec[0]]);
    if !r.iter().all(|w| w.is_finite()) {
        // im2col writes the padding as zeros, and a zero times an inf or NaN weight is NaN
        // where XLA (and the interpreter) skip the padding: such kernels take direct loops,
        // in the interpreter's order (input features, then the window row-major).
        for gi in 0..groups {
            let ch0 = if fg > 1 { gi * cin } else { 0 };
            for b in 0..nb {
                let lb = if bg > 1 { gi * nb + b } else { b };
                let base = lb * lbs;
                let ob = b * obs;
                for pf in 0..np {
                    for oo in 0..og {
                        let of = gi * og + oo;
                        let mut acc = T::default();
                        for i in 0..cin {
                            let cb = base + (ch0 + i) * lc;
                            let wb = of * rs[cd.rhs_spec[0]] + i * rs[cd.rhs_spec[1]];
                            for kf in 0..nk {
                                if let Some(off) = sp_off[pf * nk + kf] {
                                    acc = acc + l[cb + off] * r[wb + k_off[kf]];
                                }
                            }
                        }
                        o[ob + of * oc + p_out[pf]] = acc;
                    }
                }
            }
        }
        return Ok(());
    }
    // Result batch elements per GEMM: as many as keep the patch matrix within PATCH_ELEMENTS.
    let per_b = np.saturating_mul(kk).max(1);
    let chunk = (PATCH_ELEMENTS / per_b).clamp(1, nb);
    let rows = chunk * np;
    let mut patches = table(op, rows.checked_mul(kk), Some(T::default()))?;
    let mut wmat = table(op, kk.checked_mul(og), Some(T::default()))?;
    let mut res = table(op, rows.checked_mul(og), Some(T::default()))?;
    for gi in 0..groups {
        // The group's kernel matrix: row (k, i), column o'.
        for (kf, &ko) in k_off.iter().enumerate() {
            for i in 0..cin {
                for oo in 0..og {
                    let of = gi * og + oo;
                    wmat[(kf * cin + i) * og + oo] =
                        r[of * rs[cd.rhs_spec[0]] + i * rs[cd.rhs_spec[1]] + ko];
                }
            }
        }
        let ch0 = if fg > 1 { gi * cin } else { 0 };
        for b0 in (0..nb).step_by(chunk) {
            let n = chunk.min(nb - b0);
            for bi in 0..n {
                let b = b0 + bi;
                let lb = if bg > 1 { gi * nb + b } else { b };
                let base = lb * lbs + ch0 * lc;
                for pf in 0..np {
                    let row = &mut patches[(bi * np + pf) * kk..(bi * np + pf + 1) * kk];
                    for (kf, cols) in row.chunks_exact_mut(cin.max(1)).enumerate().take(nk) {
                        match sp_off[pf * nk + kf] {
                            // Features adjacent in memory (NHWC): one copy.
                            Some(off) if lc == 1 => {
                                cols.copy_from_slice(&l[base + off..base + off + cols.len()]);
                            }
                            Some(off) => {
                                for (i, c) in cols.iter_mut().enumerate() {
                                    *c = l[base + off + i * lc];
                                }
                            }
                            None => cols.fill(T::default()),
                        }
                    }
                }
            }
            let m = n * np;
            let par = if m.saturating_mul(og).saturating_mul(kk) >= parallel_from {
                gemm::Parallelism::Rayon(0)
            } else {
                gemm::Parallelism::None
            };
            // SAFETY: the three views lie within `patches` (m x kk of its rows x kk,
            // row-major), `wmat` (kk x og) and `res` (m x og of its rows x og), distinct live
            // vectors of T = the dtype's type.
            unsafe {
                gemm_view(
                    T::DTYPE,
                    (m, og, kk),
                    (patches.as_ptr() as *const u8, [kk as isize, 1]),
                    (wmat.as_ptr() as *const u8, [og as isize, 1]),
                    (res.as_mut_ptr() as *mut u8, [og as isize, 1]),
                    par,
                );
            }
            for bi in 0..n {
                let ob = (b0 + bi) * obs;
                for pf in 0..np {
                    let src = &res[(bi * np + pf) * og..(bi * np + pf + 1) * og];
                    for (oo, &v) in src.iter().enumerate() {
                        o[ob + (gi * og + oo) * oc + p_out[pf]] = v;
                    }
                }
            }
        }
    }
    Ok(())
}
