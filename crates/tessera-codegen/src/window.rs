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
//! `0 * inf` NaNs there). A conv whose lhs features are outermost (a kernel gradient's batch
//! read as the features) sums over two halves of the features, one per core, and adds the
//! halves' sums in a fixed order (`conv_halves`).

use tessera_interp::conv::source_index;
use tessera_interp::scalar::{fmax, fmin};
use tessera_interp::unravel;
use tessera_ir::{ConvDims, DType, ReduceKind, TensorType, WindowDims};

use std::cell::RefCell;
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
    /// A window of many more positions than its operand has elements (mostly padding): no
    /// tables, which grow with the window (16 bytes a position: 6.3 GB for 2^28); each result
    /// visits the operand elements its window covers (`window_offsets`, the interpreter's
    /// walk, in the same order).
    sparse: Option<(WindowDims, Vec<usize>)>,
}

/// A window with more positions than this and than its operand has elements takes the
/// sparse walk (`PoolPlan::sparse`).
const SPARSE_WINDOW_FROM: usize = 1 << 16;

impl PoolPlan {
    fn new(win: &WindowDims, in_dims: &[usize], out_dims: &[usize]) -> Result<Self, InterpError> {
        let op = "reduce_window";
        let r = in_dims.len();
        let positions = win.window.iter().try_fold(1usize, |a, &w| a.checked_mul(w));
        let elements: usize = in_dims.iter().product();
        if positions.is_none_or(|n| n > SPARSE_WINDOW_FROM.max(elements)) {
            return Ok(PoolPlan {
                offs: Vec::new(),
                window: win.window.clone(),
                ks: Vec::new(),
                dense: None,
                sparse: Some((win.clone(), in_dims.to_vec())),
            });
        }
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
            sparse: None,
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
    if let Some((win, in_dims)) = &plan.sparse {
        for (at, slot) in o.iter_mut().enumerate() {
            let offs = tessera_interp::conv::window_offsets(win, in_dims, out_dims, at);
            *slot = offs.iter().fold(init, |acc, &i| f(acc, x[i]));
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
    /// The kernel's strides of its output and input features, and the result's of its
    /// features and batch (read by every run: kept here, not computed per run).
    rhs_oi: (usize, usize),
    out_cb: (usize, usize),
    /// The result's layout is the product's (`[batch, positions, features]`, row-major, as
    /// NHWC): each group's product is written into it directly, no copy after.
    direct_out: bool,
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
        let p_out: Vec<usize> = ps
            .iter()
            .map(|p| (0..s).map(|j| p[j] * os[cd.out_spec[2 + j]]).sum())
            .collect();
        let o_feat = od[cd.out_spec[1]];
        let direct_out = os[cd.out_spec[1]] == 1
            && os[cd.out_spec[0]] == np * o_feat
            && p_out.iter().enumerate().all(|(pf, &at)| at == pf * o_feat);
        Ok(ConvPlan {
            sp_off,
            k_off,
            p_out,
            lhs_strides: ls,
            repack,
            rhs_oi: (rs[cd.rhs_spec[0]], rs[cd.rhs_spec[1]]),
            out_cb: (os[cd.out_spec[1]], os[cd.out_spec[0]]),
            direct_out,
        })
    }
}

/// `l` (row-major over `dims`) with dim `feat` moved innermost (the other dims row-major in
/// order): for each index of the dims before `feat`, a transpose of `[F, B]` into `[B, F]`.
fn repack<T: Copy + Default + Send + Sync>(l: &[T], dims: &[usize], feat: usize, out: &mut [T]) {
    let f = dims[feat];
    let b: usize = dims[feat + 1..].iter().product();
    let block = f * b;
    if block == 0 {
        return;
    }
    for (src, dst) in l.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
        crate::transpose::transpose_into(src, (f, b), dst);
    }
}

thread_local! {
    /// Each thread's work memory for a conv's shared parts (the repacked lhs, the kernel
    /// matrix), kept between runs: it only grows, so a steady-state step allocates nothing
    /// for its convs.
    static CONV_SHARED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Likewise for each part of a conv's rows (its patches and its product).
    static CONV_PART: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `len` values of `T` (f32 or f64) of this thread's conv scratch `key`, grown
/// (with zeros) when short; or an error naming the op when that memory cannot be had
/// (`None`: more than `usize` counts). A conv on this thread inside another (a task taken
/// while the outer one waits in rayon) finds the scratch taken and gets memory of its own.
fn with_conv_scratch<T: Elem, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<u64>>>,
    len: Option<usize>,
    f: impl FnOnce(&mut [T]) -> R,
) -> Result<R, InterpError> {
    const { assert!(std::mem::size_of::<T>() <= 8 && std::mem::align_of::<T>() <= 8) };
    let words = len
        .and_then(|n| n.checked_mul(std::mem::size_of::<T>()))
        .map(|b| b.div_ceil(8));
    let grow = |v: &mut Vec<u64>, words: Option<usize>| -> Result<(), InterpError> {
        let want = words.ok_or_else(|| too_large(None))?;
        if v.len() < want {
            v.try_reserve_exact(want - v.len())
                .map_err(|_| too_large(Some(want)))?;
            v.resize(want, 0);
        }
        Ok(())
    };
    let view = |v: &mut [u64]| -> &mut [T] {
        let n = len.unwrap_or(0);
        // SAFETY: `v` holds at least `n * size_of::<T>()` bytes (grown above), 8-aligned
        // (u64 words), and `T` (f32 or f64: `Elem`) is at most 8 bytes and 8-aligned, with
        // every bit pattern a value; the borrow of `v` is exclusive and outlives the slice.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut T, n) }
    };
    key.with(|s| match s.try_borrow_mut() {
        Ok(mut scratch) => {
            grow(&mut scratch, words)?;
            Ok(f(view(&mut scratch)))
        }
        Err(_) => {
            let mut own = Vec::new();
            grow(&mut own, words)?;
            Ok(f(view(&mut own)))
        }
    })
}

/// The error of a conv whose work memory cannot be allocated.
fn too_large(words: Option<usize>) -> InterpError {
    InterpError::Op {
        op: "conv_general_dilated".into(),
        message: format!(
            "cannot allocate a work table of {} bytes (the window and padding are too large)",
            words.map_or("more than usize::MAX".into(), |w| (w as u128 * 8)
                .to_string())
        ),
    }
}

/// The most patch-matrix elements one GEMM of a conv takes (256 KiB of f32, so a chunk's
/// patches are still in the core's cache when its product reads them): the batch is folded
/// into the GEMM's rows in chunks of at most this (or one batch element, if that is more).
/// The small CNN's step on the Xeon of docs/PERFORMANCE.md, by this budget: 1.66 ms at 2^22,
/// 1.63 at 2^20, 1.60 at 2^18, 1.52 at 2^16, 1.61 at 2^14 (criterion, one run each).
const PATCH_ELEMENTS: usize = 1 << 16;

/// im2col + GEMM per group over chunks of the result batch: the patch matrix
/// `[batch * positions, K * cin]` (columns: window position, then input feature, so an NHWC
/// operand's features are copied contiguously) times the group's kernel matrix
/// `[K * cin, O / G]`, written into the result when its layout is the product's (NHWC,
/// `direct_out`), else scattered into it; or, for a conv whose lhs features are outermost
/// (`sums_in_halves`), over two halves of the features (`conv_halves`). The work memory is the
/// thread's conv scratch.
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
    let ls = &plan.lhs_strides;
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
    let ((oc, obs), (ro, ri)) = (plan.out_cb, plan.rhs_oi);
    // A large conv's work is shared out among the threads. `usize::MAX` means never.
    let large = parallel_from < usize::MAX
        && nb.saturating_mul(np).saturating_mul(og).saturating_mul(kk) >= parallel_from;
    let halves = sums_in_halves(cd, ld, plan, (nb.saturating_mul(np), og, kk));
    // im2col writes the padding as zeros, and a zero times an inf or NaN weight is NaN where
    // XLA (and the interpreter) skip the padding: such kernels take direct loops, in the
    // interpreter's order (input features, then the window row-major). A conv summed in
    // halves checks its kernel in its parts, each the half it reads (a kernel gradient's
    // kernel is the cotangent, as large as the activations).
    let finite = if halves {
        let threads = if large { crate::team::threads() } else { 1 };
        conv_halves((cd, ld, od), plan, (l, r, o), threads)?
    } else {
        r.iter().all(|w| w.is_finite())
    };
    if !finite {
        let rep_len = Some(if plan.repack { l.len() } else { 0 });
        return with_conv_scratch::<T, _>(&CONV_SHARED, rep_len, |rep| {
            let l: &[T] = if plan.repack {
                repack(l, ld, cd.lhs_spec[1], rep);
                rep
            } else {
                l
            };
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
                                let wb = of * ro + i * ri;
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
        });
    }
    if halves {
        return Ok(());
    }
    // Result batch elements per GEMM: as many as keep the patch matrix within PATCH_ELEMENTS,
    // whatever the threads, so each chunk's product (and so its sums' order) is the same on
    // every machine. Two parts split the batch at `nb / 2`, where the next kernel's split
    // does (`team.rs`: each half on the core that wrote it).
    let (shift, bound) = batch_chunks(nb, np.saturating_mul(kk));
    let chunks = 1usize << shift;
    let chunk = nb.div_ceil(chunks);
    // A large conv's chunks are shared out among the threads, a part of whole chunks each: a
    // part copies its patches and multiplies them on one core, in that core's cache (the
    // library's split of one product of these shapes over both cores ran 2-3x slower in the
    // small CNN's step). A conv of one chunk splits its product instead, as the library does
    // (the same sums).
    let parts = if large {
        crate::team::threads().clamp(1, chunks)
    } else {
        1
    };
    // On a team's leader, a product under 2^23 multiply-adds stays on this thread: the
    // library's split over the rayon pool parks the helper and wakes it again, which cost
    // more than it saved (the small CNN's first kernel gradient, 9 x 16 x 8192: 123-163 us
    // split, about 108 us here).
    let product_par = if large
        && parts == 1
        && (!crate::team::leads() || (chunk * np).saturating_mul(og).saturating_mul(kk) >= 1 << 23)
    {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    #[cfg(test)]
    if parts > 1 {
        PARTED.with(|c| c.set(c.get() + 1));
    }
    let rows = chunk * np;
    // The shared scratch: the repacked lhs and the kernel matrix; each part's: its patches
    // and its product (none when the product is written into the result).
    let rep_len = if plan.repack { l.len() } else { 0 };
    let wmat_len = kk.checked_mul(og);
    let shared_len = wmat_len.and_then(|w| w.checked_add(rep_len));
    let res_len = if plan.direct_out {
        Some(0)
    } else {
        rows.checked_mul(og)
    };
    let part_len = rows.checked_mul(kk).and_then(|p| p.checked_add(res_len?));
    let out = OutRows {
        o: o.as_mut_ptr(),
        len: n_out,
    };
    with_conv_scratch::<T, _>(&CONV_SHARED, shared_len, |shared| {
        let (rep, wmat) = shared.split_at_mut(rep_len);
        let l: &[T] = if plan.repack {
            repack(l, ld, cd.lhs_spec[1], rep);
            rep
        } else {
            l
        };
        for gi in 0..groups {
            // The group's kernel matrix: row (k, i), column o', each row a copy when the
            // output features are adjacent in the kernel (HWIO and its gradients).
            kernel_rows(wmat, r, k_off, gi * og * ro, (cin, og), (ro, ri));
            let wmat: &[T] = wmat;
            let ch0 = if fg > 1 { gi * cin } else { 0 };
            // Chunks `c0..c1`: patches, product, and the product into the result.
            let part = |(c0, c1): (usize, usize)| {
                with_conv_scratch::<T, _>(&CONV_PART, part_len, |scratch| {
                    let (patches, res) = scratch.split_at_mut(rows * kk);
                    for c in c0..c1 {
                        let (b0, n) = (bound(c), bound(c + 1) - bound(c));
                        if n == 0 {
                            continue;
                        }
                        for bi in 0..n {
                            let b = b0 + bi;
                            let lb = if bg > 1 { gi * nb + b } else { b };
                            let base = lb * lbs + ch0 * lc;
                            for pf in 0..np {
                                let row = &mut patches[(bi * np + pf) * kk..][..kk];
                                im2col_row(row, &sp_off[pf * nk..][..nk], l, base, (cin, lc));
                            }
                        }
                        let m = n * np;
                        let (dst, dst_rows) = if plan.direct_out {
                            // Rows (b, position) from batch element b0, columns the group's
                            // features: `b0 * obs + gi * og + row * o_feat + col`, below
                            // `(b0 + n) * obs <= n_out` (`obs = np * o_feat`, `direct_out`).
                            (out.at(b0 * obs + gi * og), o_feat)
                        } else {
                            (res.as_mut_ptr(), og)
                        };
                        // SAFETY: the three views lie within `patches` (m x kk of its rows x
                        // kk, row-major), `wmat` (kk x og) and the result view (m x og, rows
                        // `dst_rows` apart: `res`, or this part's batch elements of the
                        // result as above, which no other part writes), which overlaps
                        // neither (scratch and result are distinct memory), of T = the
                        // dtype's type.
                        unsafe {
                            gemm_view(
                                T::DTYPE,
                                (m, og, kk),
                                (patches.as_ptr() as *const u8, [kk as isize, 1]),
                                (wmat.as_ptr() as *const u8, [og as isize, 1]),
                                (dst as *mut u8, [dst_rows as isize, 1]),
                                product_par,
                            );
                        }
                        if plan.direct_out {
                            continue;
                        }
                        for bi in 0..n {
                            let ob = (b0 + bi) * obs;
                            for pf in 0..np {
                                let src = &res[(bi * np + pf) * og..][..og];
                                for (oo, &v) in src.iter().enumerate() {
                                    out.put(ob + (gi * og + oo) * oc + p_out[pf], v);
                                }
                            }
                        }
                    }
                })
            };
            // Part `p` takes chunks `p * chunks / parts ..`: whole chunks.
            if parts == 2 {
                let (a, b) =
                    crate::team::join(|| part((0, chunks / 2)), || part((chunks / 2, chunks)));
                a.and(b)?;
            } else if parts > 1 {
                use rayon::prelude::*;
                (0..parts)
                    .into_par_iter()
                    .map(|p| part((p * chunks / parts, (p + 1) * chunks / parts)))
                    .collect::<Result<(), InterpError>>()?;
            } else {
                part((0, chunks))?;
            }
        }
        Ok(())
    })?
}

#[cfg(test)]
thread_local! {
    /// How many convs this thread ran in batch parts on several threads (tests).
    static PARTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// How many convs this thread summed in two halves of the input features (tests).
    static HALVED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The batch of `nb` elements of `per_b` patch-matrix elements each in `2^shift` chunks, the
/// fewest of at most `PATCH_ELEMENTS` (or one element) each; chunk `c` holds the elements
/// from `bound(c)` to `bound(c + 1)` (`c * nb >> shift`: near-equal, the first half of the
/// chunks the first `nb / 2` elements).
fn batch_chunks(nb: usize, per_b: usize) -> (u32, impl Fn(usize) -> usize) {
    let fit = (PATCH_ELEMENTS / per_b.max(1)).clamp(1, nb.max(1));
    let mut shift = 0u32;
    while 1usize
        .checked_shl(shift)
        .is_some_and(|d| nb.div_ceil(d) > fit)
    {
        shift += 1;
    }
    (shift, move |c: usize| {
        ((c as u128 * nb as u128) >> shift) as usize
    })
}

/// Products of fewer multiply-adds than this are summed whole (`sums_in_halves`).
const HALVES_FROM: usize = 1 << 16;

/// Whether a conv sums over its input features in two halves (`conv_halves`): one group, the
/// lhs's features its outermost dim in memory and not innermost (a kernel gradient, which
/// reads the batch as the features; or a conv of one batch element in NCHW), and a
/// contraction of at least twice the product's `rows` (the partial results are small beside
/// the patches). Shapes alone decide, so the bits never depend on the threads.
fn sums_in_halves(
    cd: &ConvDims,
    ld: &[usize],
    plan: &ConvPlan,
    (rows, og, kk): (usize, usize, usize),
) -> bool {
    let feat = cd.lhs_spec[1];
    cd.feature_group_count == 1
        && cd.batch_group_count == 1
        && plan.repack
        && ld[..feat].iter().all(|&d| d == 1)
        && ld[feat] >= 2
        && kk >= rows.saturating_mul(2)
        && rows.saturating_mul(og).saturating_mul(kk) >= HALVES_FROM
}

/// A conv (as `sums_in_halves` admits) summed over two halves of its input features: half
/// `p` of the `f` features (`p * f / 2 ..`) transposes its rows of the lhs (contiguous: the
/// features are outermost) into its own repacked copy, gathers its rows of the kernel matrix
/// and its patches (`[chunk rows, K * f_p]`), and multiplies them into its partial result;
/// each result element is then the first half's sum plus the second's, in that order on any
/// number of threads. With `threads >= 2` the halves run at once (`team::join`): for a kernel
/// gradient, the halves of the batch the previous op's split wrote, each read on the core
/// that wrote it; with more than two, each half's products are also split over the pool, as
/// the library splits a product (the same sums).
///
/// Each part keeps its copy of half the lhs in its thread's scratch, sized for the larger
/// half whichever it runs (the leader runs the second half when the helper has not taken it).
/// The sums' buffer is the caller's thread's.
///
/// `false`, with nothing written, when the kernel holds an inf or NaN (each half checks the
/// kernel rows it gathered, which together are the whole kernel): the caller then takes the
/// direct loops.
fn conv_halves<T: Elem>(
    (cd, ld, od): (&ConvDims, &[usize], &[usize]),
    plan: &ConvPlan,
    (l, r, o): (&[T], &[T], &mut [T]),
    threads: usize,
) -> Result<bool, InterpError> {
    let feat = cd.lhs_spec[1];
    let f = ld[feat];
    // The lhs is `[f, rest]` row-major (every dim before the features is 1).
    let rest = l.len() / f;
    let half = [(0, f / 2), (f / 2, f)];
    let (sp_off, k_off, p_out) = (&plan.sp_off, &plan.k_off, &plan.p_out);
    let (nk, np) = (k_off.len(), p_out.len());
    let og = od[cd.out_spec[1]];
    let nb = od[cd.out_spec[0]];
    let rows = nb * np;
    let ((oc, obs), (ro, ri)) = (plan.out_cb, plan.rhs_oi);
    // The repacked lhs's batch stride and window offsets are multiples of `f` (the features
    // innermost): a half's copy, `f_p` features wide, has them times `f_p / f`.
    let lbs = plan.lhs_strides[cd.lhs_spec[0]];
    let (shift, bound) = batch_chunks(nb, np.saturating_mul(nk * (f - f / 2)));
    let chunks = 1usize << shift;
    let chunk = nb.div_ceil(chunks);
    let product_par = if threads > 2 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    #[cfg(test)]
    HALVED.with(|c| c.set(c.get() + 1));
    #[cfg(test)]
    if threads > 1 {
        PARTED.with(|c| c.set(c.get() + 1));
    }
    // Each part's scratch, for the larger half: its lhs copy, kernel rows and patches.
    let (fp_max, kk_max) = (f - f / 2, nk * (f - f / 2));
    let len = (rest.checked_mul(fp_max))
        .and_then(|n| n.checked_add(kk_max.checked_mul(og)?))
        .and_then(|n| n.checked_add(chunk.checked_mul(np)?.checked_mul(kk_max)?));
    let sums_len = rows.checked_mul(og).and_then(|n| n.checked_mul(2));
    with_conv_scratch::<T, _>(&CONV_SHARED, sums_len, |sums| {
        let sums_out = OutRows {
            o: sums.as_mut_ptr(),
            len: sums.len(),
        };
        let part = |p: usize| {
            let (i0, i1) = half[p];
            let fp = i1 - i0;
            let kkp = nk * fp;
            with_conv_scratch::<T, _>(&CONV_PART, len, |scratch| {
                let (rep, scratch) = scratch.split_at_mut(rest * fp);
                let (wmat, patches) = scratch.split_at_mut(kkp * og);
                crate::transpose::transpose_into(&l[i0 * rest..i1 * rest], (fp, rest), rep);
                // The kernel matrix's rows (k, i) for this half's features.
                kernel_rows(wmat, r, k_off, i0 * ri, (fp, og), (ro, ri));
                let wmat: &[T] = wmat;
                if !wmat.iter().fold(true, |all, w| all & w.is_finite()) {
                    return false;
                }
                for c in 0..chunks {
                    let (b0, n) = (bound(c), bound(c + 1) - bound(c));
                    if n == 0 {
                        continue;
                    }
                    for bi in 0..n {
                        let base = (b0 + bi) * (lbs / f) * fp;
                        for pf in 0..np {
                            let row = &mut patches[(bi * np + pf) * kkp..][..kkp];
                            let offs = &sp_off[pf * nk..][..nk];
                            for (cols, off) in row.chunks_exact_mut(fp).zip(offs) {
                                match *off {
                                    Some(off) => {
                                        let at = base + off / f * fp;
                                        copy_row(cols, &rep[at..at + fp]);
                                    }
                                    None => cols.fill(T::default()),
                                }
                            }
                        }
                    }
                    // Rows (b, position) from `b0`, of this half's partial sums.
                    let dst = sums_out.at((p * rows + b0 * np) * og);
                    // SAFETY: the views lie within `patches` (n * np rows of kkp, row-major),
                    // `wmat` (kkp x og) and this half's partial sums (rows `b0 * np ..
                    // (b0 + n) * np` of `rows`, og wide, in the half's own `rows * og`
                    // elements of `sums`, which no other part writes), which overlaps neither
                    // (distinct scratch), of T = the dtype's type.
                    unsafe {
                        gemm_view(
                            T::DTYPE,
                            (n * np, og, kkp),
                            (patches.as_ptr() as *const u8, [kkp as isize, 1]),
                            (wmat.as_ptr() as *const u8, [og as isize, 1]),
                            (dst as *mut u8, [og as isize, 1]),
                            product_par,
                        );
                    }
                }
                true
            })
        };
        let finite = if threads >= 2 {
            let (a, b) = crate::team::join(|| part(0), || part(1));
            a? & b?
        } else {
            part(0)? && part(1)?
        };
        if !finite {
            return Ok(false);
        }
        let (first, second) = sums.split_at(rows * og);
        for b in 0..nb {
            for pf in 0..np {
                let at = (b * np + pf) * og;
                let (s0, s1) = (&first[at..at + og], &second[at..at + og]);
                for (oo, (&x, &y)) in s0.iter().zip(s1).enumerate() {
                    o[b * obs + oo * oc + p_out[pf]] = x + y;
                }
            }
        }
        Ok(true)
    })?
}

/// One row of the patch matrix: for each window position, the `cin` input features at its
/// offset (`None`: padding, zeros), read `lc` apart from `base`. Inlined into the loop over a
/// chunk's rows: no call per row, a row of one feature being nine copies for a 3x3 window
/// (the small CNN's first conv alone, Zen 3, eight alternating pairs of processes: 93-161 ->
/// 87-132 us, faster in seven, the ranges overlapping on a loaded machine;
/// docs/PERFORMANCE.md).
#[inline(always)]
fn im2col_row<T: Elem>(
    row: &mut [T],
    offs: &[Option<usize>],
    l: &[T],
    base: usize,
    (cin, lc): (usize, usize),
) {
    if cin == 0 {
        // No input features: an empty row (the product sums nothing, zeros).
        return;
    }
    if cin == 1 {
        for (c, off) in row.iter_mut().zip(offs) {
            *c = off.map_or(T::default(), |off| l[base + off]);
        }
        return;
    }
    for (cols, off) in row.chunks_exact_mut(cin).zip(offs) {
        match *off {
            // Features adjacent in memory (NHWC): one copy.
            Some(off) if lc == 1 => copy_row(cols, &l[base + off..base + off + cin]),
            Some(off) => {
                for (i, c) in cols.iter_mut().enumerate() {
                    *c = l[base + off + i * lc];
                }
            }
            None => cols.fill(T::default()),
        }
    }
}

/// The kernel matrix `wmat` (`[K * cin, og]`): row `(k, i)`, column `o` is the kernel's
/// element at `at0 + i * ri + k_off[k] + o * ro` (one copy per row when the output features
/// are adjacent, `ro == 1`).
fn kernel_rows<T: Copy>(
    wmat: &mut [T],
    r: &[T],
    k_off: &[usize],
    at0: usize,
    (cin, og): (usize, usize),
    (ro, ri): (usize, usize),
) {
    for (kf, &ko) in k_off.iter().enumerate() {
        for i in 0..cin {
            let row = &mut wmat[(kf * cin + i) * og..][..og];
            let at = at0 + i * ri + ko;
            if ro == 1 {
                copy_row(row, &r[at..at + og]);
            } else {
                for (oo, w) in row.iter_mut().enumerate() {
                    *w = r[at + oo * ro];
                }
            }
        }
    }
}

/// `dst.copy_from_slice(src)`, inline for the short rows of 8, 16 and 32 elements a conv's
/// patches and kernel matrix copy most (features and output features of small CNNs), where a
/// call of `memcpy` per row cost more than the copy.
#[inline(always)]
fn copy_row<T: Copy>(dst: &mut [T], src: &[T]) {
    match dst.len() {
        8 => dst[..8].copy_from_slice(&src[..8]),
        16 => dst[..16].copy_from_slice(&src[..16]),
        32 => dst[..32].copy_from_slice(&src[..32]),
        _ => dst.copy_from_slice(src),
    }
}

/// A conv's result (or `conv_halves`' two buffers of sums), written by its parts at
/// disjoint elements: their own batch elements (their own half's sums).
struct OutRows<T> {
    o: *mut T,
    len: usize,
}

// SAFETY: the parts write through the pointer at disjoint elements (their own batch
// elements, or their own half's sums), inside the result the caller of `run` vouches for (or
// the sums' scratch, borrowed for the whole conv), while the conv blocks.
unsafe impl<T: Send> Send for OutRows<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for OutRows<T> {}

impl<T> OutRows<T> {
    /// Element `i`'s address (`i < len`).
    fn at(&self, i: usize) -> *mut T {
        assert!(i < self.len, "a conv index inside its buffer");
        // SAFETY: `i < len`, inside the buffer's allocation.
        unsafe { self.o.add(i) }
    }

    /// Writes element `i` (`i < len`).
    fn put(&self, i: usize, v: T) {
        // SAFETY: `at` checked the index; the element is this part's alone (the caller's
        // batch elements, or its half's sums).
        unsafe { self.at(i).write(v) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{Data, Graph, Literal, Op};

    /// Convs large enough to run in batch parts on several threads, in every layout the
    /// parts handle (the result written directly (NHWC, grouped too) or scattered (NCHW);
    /// the lhs repacked per batch element (NCHW); one input feature; feature and batch
    /// groups), and kernel gradients (the batch read as features, outermost), which sum in
    /// two halves of the features (an even and an odd count), in f32 and f64: on two threads
    /// in parts (and on three: three parts, or each half's products over the pool), with the
    /// bits of one thread (each chunk's product, and each half's sums,
    /// are the same whatever the threads), and within the products' accumulated bound of the
    /// interpreter.
    #[test]
    fn large_convs_run_in_batch_parts_with_the_bits_of_one_thread() {
        let nhwc = |cd: &mut ConvDims| {
            cd.lhs_spec = vec![0, 3, 1, 2];
            cd.rhs_spec = vec![3, 2, 0, 1];
            cd.out_spec = vec![0, 3, 1, 2];
        };
        // Name, dims, lhs and rhs shapes, and whether the result is written directly, the
        // lhs repacked and the sums taken in halves of the features.
        type Case = (
            &'static str,
            ConvDims,
            Vec<usize>,
            Vec<usize>,
            bool,
            bool,
            bool,
        );
        let mut cases: Vec<Case> = Vec::new();
        let mut cd = ConvDims::nchw(2);
        nhwc(&mut cd);
        cd.padding = vec![(1, 1), (1, 1)];
        cases.push((
            "NHWC SAME",
            cd.clone(),
            vec![16, 8, 8, 8],
            vec![3, 3, 8, 16],
            true,
            false,
            false,
        ));
        cd.feature_group_count = 2;
        cases.push((
            "NHWC grouped",
            cd,
            vec![64, 8, 8, 8],
            vec![3, 3, 4, 16],
            true,
            false,
            false,
        ));
        let mut cd = ConvDims::nchw(2);
        cd.padding = vec![(1, 1), (1, 1)];
        cd.strides = vec![2, 1];
        cd.rhs_dilation = vec![1, 2];
        cd.feature_group_count = 2;
        cases.push((
            "NCHW grouped",
            cd,
            vec![64, 8, 16, 16],
            vec![16, 4, 3, 3],
            false,
            true,
            false,
        ));
        let mut cd = ConvDims::nchw(2);
        cd.lhs_spec = vec![3, 0, 1, 2];
        cd.rhs_spec = vec![3, 0, 1, 2];
        cd.out_spec = vec![2, 3, 0, 1];
        cd.padding = vec![(1, 1), (1, 1)];
        cases.push((
            "kernel gradient",
            cd.clone(),
            vec![32, 6, 6, 8],
            vec![32, 6, 6, 16],
            false,
            true,
            true,
        ));
        cases.push((
            "kernel gradient, odd features",
            cd,
            vec![33, 8, 8, 3],
            vec![33, 8, 8, 16],
            false,
            true,
            true,
        ));
        // NCHW's kernel gradient into OIHW, strided: the kernel's output features are not
        // adjacent (its rows gathered one by one).
        let mut cd = ConvDims::nchw(2);
        cd.lhs_spec = vec![1, 0, 2, 3];
        cd.rhs_spec = vec![1, 0, 2, 3];
        cd.out_spec = vec![1, 0, 2, 3];
        cd.padding = vec![(1, 1), (1, 1)];
        cd.strides = vec![2, 1];
        cases.push((
            "NCHW kernel gradient, strided",
            cd,
            vec![32, 4, 8, 8],
            vec![32, 16, 8, 8],
            false,
            true,
            true,
        ));
        // One NCHW image: its features are outermost too.
        let mut cd = ConvDims::nchw(2);
        cd.padding = vec![(1, 1), (1, 1)];
        cases.push((
            "one NCHW image",
            cd,
            vec![1, 64, 8, 8],
            vec![16, 64, 3, 3],
            false,
            true,
            true,
        ));
        let mut cd = ConvDims::nchw(2);
        cd.batch_group_count = 2;
        cases.push((
            "batch groups",
            cd,
            vec![64, 8, 10, 10],
            vec![16, 8, 3, 3],
            false,
            true,
            false,
        ));
        let mut cd = ConvDims::nchw(2);
        nhwc(&mut cd);
        cd.padding = vec![(1, 1), (1, 1)];
        cases.push((
            "one feature",
            cd,
            vec![64, 12, 12, 1],
            vec![3, 3, 1, 16],
            true,
            false,
            false,
        ));
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let (one, two, three) = (pool(1), pool(2), pool(3));
        for (name, cd, ld, rd, direct, repacked, halved) in cases {
            for dtype in [DType::F32, DType::F64] {
                let mut g = Graph::new("c");
                let x = g.add_param(TensorType::new(dtype, ld.clone()));
                let w = g.add_param(TensorType::new(dtype, rd.clone()));
                let y = g.add(Op::Conv(Box::new(cd.clone())), &[x, w]).unwrap();
                g.set_outputs(vec![y]);
                let (lt, rt, ot) = (g.ty(x).clone(), g.ty(w).clone(), g.ty(y).clone());
                let plan = ConvPlan::new(&cd, &lt, &rt, &ot).unwrap();
                assert_eq!((plan.direct_out, plan.repack), (direct, repacked), "{name}");
                let lit = |t: &TensorType, seed: usize| {
                    let n = t.numel();
                    let v = (0..n).map(|i| ((i * 7919 + seed) % 2001) as f64 / 1000.0 - 1.0);
                    let data = match dtype {
                        DType::F32 => Data::F32(v.map(|x| x as f32).collect()),
                        _ => Data::F64(v.collect()),
                    };
                    Literal::new(t.dims().to_vec(), data).unwrap()
                };
                let (xl, wl) = (lit(&lt, 3), lit(&rt, 11));
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                // Each run on the pool's thread, where its parts and halves are counted.
                let run = |p: &rayon::ThreadPool| {
                    p.install(|| {
                        let (parted, halves) = (PARTED.with(|c| c.get()), HALVED.with(|c| c.get()));
                        let got = crate::compile(&g)
                            .unwrap()
                            .run(&[&xl, &wl], &tessera_transport::SingleDevice)
                            .unwrap();
                        assert_eq!(
                            HALVED.with(|c| c.get()) > halves,
                            halved,
                            "{name} {dtype}: summed in halves of the features"
                        );
                        (got[0].to_f64_vec(), PARTED.with(|c| c.get()) > parted)
                    })
                };
                let ((a, in_parts), (b, alone)) = (run(&two), run(&one));
                // Three threads: three parts of chunks, or each half's products split over
                // the pool.
                let (c, _) = run(&three);
                assert_eq!(
                    bits(&c),
                    bits(&b),
                    "{name} {dtype}: three threads, one's bits"
                );
                assert!(
                    in_parts && !alone,
                    "{name} {dtype}: in parts on two threads only ({in_parts} {alone})"
                );
                assert_eq!(bits(&a), bits(&b), "{name} {dtype}: the bits of one thread");
                let want = tessera_interp::run(&g, &[xl.clone(), wl.clone()]).unwrap();
                // Every term is at most 1 in magnitude: the sums' accumulated bound.
                let terms = (lt.numel() + rt.numel()) as f64;
                let eps = if dtype == DType::F32 { 1.2e-7 } else { 2.3e-16 };
                assert_eq!(a.len(), ot.numel());
                for (i, (p, q)) in a.iter().zip(&want[0].to_f64_vec()).enumerate() {
                    assert!(
                        (p - q).abs() <= terms * eps,
                        "{name} {dtype} [{i}]: {p} vs {q}"
                    );
                }
            }
        }
    }

    /// A kernel gradient whose cotangent (its kernel) holds an inf in one half of the
    /// features and a NaN in the other, each alone: the halves find it and the conv takes
    /// the direct loops, with the interpreter's bits (the padded taps add nothing), on one
    /// thread and on two, in f32 and f64.
    #[test]
    fn kernel_gradients_with_an_inf_or_nan_take_the_direct_loops_in_either_half() {
        let mut cd = ConvDims::nchw(2);
        cd.lhs_spec = vec![3, 0, 1, 2];
        cd.rhs_spec = vec![3, 0, 1, 2];
        cd.out_spec = vec![2, 3, 0, 1];
        cd.padding = vec![(1, 1), (1, 1)];
        let (ld, rd) = (vec![32usize, 6, 6, 8], vec![32usize, 6, 6, 16]);
        for dtype in [DType::F32, DType::F64] {
            let mut g = Graph::new("c");
            let x = g.add_param(TensorType::new(dtype, ld.clone()));
            let w = g.add_param(TensorType::new(dtype, rd.clone()));
            let y = g.add(Op::Conv(Box::new(cd.clone())), &[x, w]).unwrap();
            g.set_outputs(vec![y]);
            let lit = |dims: &[usize], v: Vec<f64>| {
                let data = match dtype {
                    DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
                    _ => Data::F64(v),
                };
                Literal::new(dims.to_vec(), data).unwrap()
            };
            let values = |n: usize, seed: usize| -> Vec<f64> {
                (0..n)
                    .map(|i| ((i * 7919 + seed) % 2001) as f64 / 1000.0 - 1.0)
                    .collect()
            };
            let xl = lit(&ld, values(ld.iter().product(), 3));
            let per_feature = rd[1..].iter().product::<usize>();
            // Feature 2 is in the first half, feature 30 in the second; window position
            // (5, 5) meets the padding for the last result row and column.
            for (feature, bad) in [(2, f64::NAN), (30, f64::INFINITY)] {
                let mut wv = values(rd.iter().product(), 11);
                wv[feature * per_feature + (5 * 6 + 5) * 16 + 5] = bad;
                let wl = lit(&rd, wv);
                let want = tessera_interp::run(&g, &[xl.clone(), wl.clone()]).unwrap();
                let want = want[0].to_f64_vec();
                assert!(want.iter().any(|v| !v.is_finite()) && want.iter().any(|v| v.is_finite()));
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let got = pool.install(|| {
                        let halves = HALVED.with(|c| c.get());
                        let got = crate::compile(&g)
                            .unwrap()
                            .run(&[&xl, &wl], &tessera_transport::SingleDevice)
                            .unwrap();
                        assert!(HALVED.with(|c| c.get()) > halves, "summed in halves first");
                        got[0].to_f64_vec()
                    });
                    for (i, (p, q)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                            "{dtype} {bad} in feature {feature}, {threads} threads [{i}]: \
                             {p} vs {q}"
                        );
                    }
                }
            }
        }
    }

    /// A kernel gradient run from a thread outside the rayon pool (a one-device program's
    /// caller) sums its halves on the team (`team.rs`: the second half on the helper) when
    /// the pool is two threads wide, with the bits of one thread.
    #[test]
    fn kernel_gradients_sum_their_halves_on_the_team_with_the_bits_of_one_thread() {
        let mut cd = ConvDims::nchw(2);
        cd.lhs_spec = vec![3, 0, 1, 2];
        cd.rhs_spec = vec![3, 0, 1, 2];
        cd.out_spec = vec![2, 3, 0, 1];
        cd.padding = vec![(1, 1), (1, 1)];
        let (ld, rd) = (vec![64usize, 8, 8, 8], vec![64usize, 8, 8, 16]);
        let mut g = Graph::new("c");
        let x = g.add_param(TensorType::new(DType::F32, ld.clone()));
        let w = g.add_param(TensorType::new(DType::F32, rd.clone()));
        let y = g.add(Op::Conv(Box::new(cd)), &[x, w]).unwrap();
        g.set_outputs(vec![y]);
        let lit = |dims: &[usize], seed: usize| {
            let n: usize = dims.iter().product();
            let v = (0..n)
                .map(|i| ((i * 7919 + seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            Literal::new(dims.to_vec(), Data::F32(v)).unwrap()
        };
        let (xl, wl) = (lit(&ld, 3), lit(&rd, 11));
        let one = crate::compile(&g)
            .unwrap()
            .single_threaded()
            .run(&[&xl, &wl], &tessera_transport::SingleDevice)
            .unwrap();
        let exe = crate::compile(&g).unwrap();
        let (posts, team) = crate::team::posts_once_the_team_is_free(|| {
            let halves = HALVED.with(|c| c.get());
            let out = exe
                .run(&[&xl, &wl], &tessera_transport::SingleDevice)
                .unwrap();
            assert!(out[0].data.bits_eq(&one[0].data), "the bits of one thread");
            assert!(HALVED.with(|c| c.get()) > halves, "summed in halves");
        });
        assert_eq!(posts, usize::from(team), "one join: the two halves");
    }
}
