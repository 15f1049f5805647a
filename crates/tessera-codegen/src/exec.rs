//! The executable: a schedule of steps (native kernels, GEMM calls, collectives) over buffers
//! in one arena, with inputs and outputs bound at launch.

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::Arc;

use tessera_interp::InterpError;
use tessera_ir::{CollectiveOp, DType, Data, Literal, Mesh, Op, RegionOp, TensorType};
use tessera_transport::stacked::{PartAddr, Stacking};
use tessera_transport::values::{data_ptr, literal_from_raw};
use tessera_transport::{Collectives, GemmCall, GemmPart, Group};

use crate::fusion::{BufKind, GemmSpec, RegionStep, Schedule, Step, StepKind};
use crate::kernel::Kernel;
use crate::lower::{Compiled, KernelFn};
use crate::plan::Plan;
use crate::pool::Pool;
use std::ops::Range;

/// A compiled program. `run` may be called from one thread at a time per executable (each
/// device of the sharded runtime owns its own).
pub struct Executable {
    schedule: Schedule,
    /// The compiled kernel of each step that has one.
    kernels: Vec<Option<KernelFn>>,
    /// Each kernel step's tail: a function applied in place to the rows the kernel wrote
    /// (`vmath::split_tail`).
    tails: Vec<Option<crate::vmath::Tail>>,
    /// Each kernel step's split over two threads (`run_kernel`), decided once (both
    /// `lower::splits_outer` and `lower::form` walk the kernel's expression, on a stack they
    /// allocate): `None` for a step that is not a kernel or whose kernel does not split
    /// (`splits_outer`: a scatter, a scan along its outermost dim, a result of no dims...),
    /// else whether its halves meet on a multiple of 8 (a rank-1 vector loop).
    splits: Vec<Option<bool>>,
    /// Shared by the executables `fork` makes: one compilation serves every device.
    _code: Arc<Compiled>,
    /// With tiered compilation, the optimized code of the kernels `_code` has at the quick
    /// tier, once the background thread has it (`tier.rs`); shared by the forks.
    upgrade: Option<Arc<crate::tier::Upgrade>>,
    /// How many kernel functions `_code` has at the quick tier.
    quick_functions: usize,
    plan: Plan,
    mesh: Option<Mesh>,
    /// The arena, kept between runs so a step allocates nothing.
    arena: RefCell<Vec<u64>>,
    /// Buffers given back (`recycle`: a given-up input's), taken by the next runs' outputs of
    /// the same dtype and element count instead of allocating (`pool.rs`).
    pool: RefCell<Pool>,
    /// Each buffer's first position among the program's outputs, if it is one (what `bind`,
    /// `collect` and `place` ask of every buffer: a scan of the outputs made a run O(n^2) in
    /// its outputs).
    output_index: Vec<Option<usize>>,
    /// Each collective step's op, shared, for the pauses at it (`Meeting::Collective`: a
    /// clone of its axes' names was two allocations a device and collective each step).
    collective_ops: Vec<Option<Arc<CollectiveOp>>>,
    /// The run's vectors (`Scratch`).
    scratch: RefCell<Scratch>,
    /// Each all-reduce step's group at the mesh position it last ran at, keyed by the step's
    /// output buffer (`group_of`): a group made anew was four allocations a device and
    /// all-reduce each step.
    groups: RefCell<Vec<(usize, usize, Group)>>,
    /// Use both cores for GEMMs this large (m*n*k), when running alone on the machine.
    parallel_gemm_from: usize,
    /// Split elementwise kernels with this many elements over two threads.
    parallel_kernel_from: usize,
    /// Offer GEMMs this large (m*n*k) whose right operand is a program input to the
    /// transport, to be done once for all devices (`SharedProducts::gemm_shared_rhs`).
    shared_gemm_from: usize,
    /// For a GEMM step whose result only feeds a sum all-reduce right after: that step.
    reduced_by: Vec<Option<usize>>,
    /// Steps this executable skips, and buffers it does not produce (`dropping_outputs`).
    skipped: Vec<bool>,
    dropped: Vec<bool>,
    /// For each region step, its bodies compiled (in `RegionOp::regions` order); empty for
    /// other steps.
    regions: Vec<Vec<Executable>>,
    /// `TESSERA_PROFILE=1`: each step's total time and run count, printed when the executable
    /// is dropped (`Profile`).
    profile: Option<RefCell<Profile>>,
    /// A paused run's next step (`start`, `advance`, `finish`).
    cursor: std::cell::Cell<usize>,
    /// Whether the paused run waits for its last pause's result (`finish` refuses then: the
    /// collective's output is not written).
    awaiting: std::cell::Cell<bool>,
    /// The all-reduce step a paused shared product did along with its GEMM
    /// (`settle_product`): the next `advance` skips it.
    fused_pending: std::cell::Cell<Option<usize>>,
    /// Whether the run is paused at a shared product not yet settled (`advance` refuses).
    unsettled: std::cell::Cell<bool>,
    /// Whether a started run (`start`) has the machine to itself: devices run in turn on one
    /// thread, so its GEMMs and kernels use both cores as a one-device program's do.
    alone: std::cell::Cell<bool>,
    /// Whether a region body (at any depth) meets other devices (a collective, or a shared
    /// product): such a program cannot pause where it meets them (`pauses_at_collectives`).
    meets_in_regions: bool,
    /// `multiply_adds`, counted once.
    multiply_adds: usize,
    /// `kernel_elements`, counted again when steps are skipped (`dropping_outputs`).
    kernel_elements: usize,
    /// `unshared_multiply_adds`, counted again whenever what is shared changes.
    unshared_multiply_adds: usize,
    /// The buffers laid out in a group region when devices run together (`GroupPlace`): the
    /// operands of the shared products that are temporaries, each at this offset in one
    /// device's share of the region (bytes), so a group's parts are one stacked operand.
    grouped: Vec<Option<usize>>,
    /// One device's share of a group region: the bytes of the `grouped` buffers.
    grouped_bytes: usize,
    /// The group region this executable keeps for the devices it runs with, as the first of
    /// them (`together::run_together`), kept between runs so a step allocates nothing.
    group_region: RefCell<Vec<u64>>,
    /// The start and length in bytes of the group region a started run's grouped buffers
    /// lie in, or `(0, 0)` (`start`): `advance` tags the shared products' parts that lie in
    /// it with its start (`PartAddr::regions`).
    group_base: std::cell::Cell<(usize, usize)>,
}

/// Where a run started together with others lays out its `grouped` buffers: the `devices`
/// runs' shares of one region of `devices * grouped_bytes` bytes from `base`, each grouped
/// buffer's block (`devices` copies, one a run, in order) at `devices` times its offset, this
/// run's copy the `index`th. The copies of one buffer are then one stacked operand by rows, in
/// run order, and no two buffers' blocks overlap, whatever step each run is at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupPlace {
    pub(crate) base: usize,
    pub(crate) devices: usize,
    pub(crate) index: usize,
}

/// Where a paused run (`Executable::advance`) waits: a step that meets other devices.
#[derive(Clone, Debug)]
pub(crate) struct Pause {
    /// The step's index in the schedule (every device of one program pauses at the same).
    pub(crate) step: usize,
    pub(crate) at: Meeting,
}

/// What a paused run waits for.
#[derive(Clone, Debug)]
pub(crate) enum Meeting {
    /// A collective, with its operand's and result's buffers. The caller computes the result
    /// into `output` (the devices' operands, in group order, give every member's result), then
    /// advances again.
    Collective {
        op: Arc<CollectiveOp>,
        input: *const u8,
        input_type: TensorType,
        output: *mut u8,
        output_type: TensorType,
    },
    /// A GEMM the threaded run offers to the transport's shared products: `part` stacked with
    /// the group's others as `stacking` says (`tessera_transport::stacked`). The caller
    /// multiplies the stacked product and hands this run its result (`settle_product`), or
    /// `None` when the parts do not stack, then advances again.
    Product {
        stacking: Stacking,
        group: Group,
        part: PartAddr,
    },
}

// SAFETY: the addresses are of buffers a paused run keeps bound (`Executable::advance`); a
// pause only travels from the thread that advanced the run to the one that computes the
// collective's result or the shared product while the run stays paused, and only that thread
// dereferences them.
unsafe impl Send for Pause {}

/// Whether `op` exchanges values with other devices (`axis_index` does not).
fn meets(op: &CollectiveOp) -> bool {
    match op {
        CollectiveOp::AllReduce { .. }
        | CollectiveOp::AllGather { .. }
        | CollectiveOp::ReduceScatter { .. }
        | CollectiveOp::AllToAll { .. }
        | CollectiveOp::CollectivePermute { .. } => true,
        CollectiveOp::AxisIndex { .. } => false,
    }
}

/// Whether a step of `schedule`, or of a region body inside `regions`, meets other devices.
fn body_meets(e: &Executable) -> bool {
    (0..e.schedule.steps.len()).any(|i| e.pauses_at(i)) || e.meets_in_regions
}

/// A step profile (`TESSERA_PROFILE=1`): for each step, the time spent in it over every run.
/// A measurement aid for kernel and schedule work; off, a run reads one `None`.
#[derive(Clone, Default)]
struct Profile {
    runs: u64,
    steps: Vec<std::time::Duration>,
}

/// Whether `TESSERA_PROFILE` asks for step profiles (set, and not `0`), read once.
fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TESSERA_PROFILE").is_some_and(|v| v != "0"))
}

impl Drop for Executable {
    fn drop(&mut self) {
        if let Some(report) = self.profile_report() {
            eprint!("{report}");
        }
    }
}

/// GEMMs of at least this many multiply-adds use both cores when the executable runs alone on
/// the machine (a one-device program, or devices run in turn on one thread).
const PARALLEL_GEMM_FROM: usize = 64 * 64 * 64;

/// Elementwise kernels of at least this many elements are split over both cores, likewise.
pub(crate) const PARALLEL_KERNEL_FROM: usize = 1 << 16;

/// GEMMs of at least this many multiply-adds with a replicated right operand are done once for
/// all devices (`Executable::single_threaded`): below it the meeting costs more than packing
/// the operand again.
const SHARED_GEMM_FROM: usize = 1 << 22;

/// The elements written by the kernels of `schedule`'s steps, but for those `skipped` marks
/// (none when it is empty).
fn count_kernel_elements(schedule: &Schedule, skipped: &[bool]) -> usize {
    schedule
        .steps
        .iter()
        .enumerate()
        .filter(|&(i, _)| !skipped.get(i).copied().unwrap_or(false))
        .map(|(_, s)| match &s.kind {
            StepKind::Kernel(k) => k.out_dims.iter().product::<usize>(),
            StepKind::Gemm(_)
            | StepKind::Collective(_)
            | StepKind::Region(_)
            | StepKind::Window(_)
            | StepKind::Native(_) => 0,
        })
        .fold(0, usize::saturating_add)
}

/// For each step, when it is a GEMM whose result is read only by a sum `all_reduce` that comes
/// next: the all-reduce's step.
fn reduced_by(schedule: &Schedule) -> Vec<Option<usize>> {
    let steps = &schedule.steps;
    (0..steps.len())
        .map(|i| {
            let out = steps[i].output;
            let next = steps.get(i + 1)?;
            // Scans every step: evaluated last, for the rare GEMM followed by an all-reduce
            // (a program of many steps would otherwise take quadratic time here).
            let only_reader = || {
                steps
                    .iter()
                    .enumerate()
                    .all(|(j, s)| j == i + 1 || !s.inputs.contains(&out))
            };
            let fits = matches!(steps[i].kind, StepKind::Gemm(_))
                && matches!(
                    next.kind,
                    StepKind::Collective(Op::Collective(CollectiveOp::AllReduce {
                        kind: tessera_ir::ReduceKind::Sum,
                        ..
                    }))
                )
                && next.inputs == [out]
                && !schedule.outputs.contains(&out)
                && only_reader();
            fits.then_some(i + 1)
        })
        .collect()
}

/// A shared product's one multiply, on every core (`par` `Rayon(0)`) or on the calling thread
/// (`None`, one side of a pair of products, `together.rs`): the threaded transport's elected
/// member (`run_gemm`) and devices run in turn on one thread (`together`) both call it, so
/// the two give the same bits (the same sums in the same order on one thread or several,
/// `pairs.rs`).
///
/// # Safety
/// As `gemm_view`.
pub(crate) unsafe fn multiply_shared(dtype: DType, c: &GemmCall, par: gemm::Parallelism) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm_view(
            dtype,
            (c.m, c.n, c.k),
            (c.lhs, c.lhs_strides),
            (c.rhs, c.rhs_strides),
            (c.out, c.out_strides),
            par,
        )
    }
}

/// `out = lhs x rhs` over `(m, n, k)` views: each operand's address and (row, column) strides
/// in elements. `k == 0` writes zeros. A large column-major `rhs` is copied row-major first,
/// and a narrow row-major result of a column-major `lhs` is computed column-major and copied
/// out (`transpose.rs`: the library's slow layouts).
///
/// # Safety
/// The views must lie inside live buffers of `dtype` (a float type), distinct elements of
/// `out` at distinct addresses (its parts are written by several threads), `out` not
/// overlapping the operands.
pub(crate) unsafe fn gemm_view(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const u8, [isize; 2]),
    (r, rs): (*const u8, [isize; 2]),
    (o, os): (*mut u8, [isize; 2]),
    par: gemm::Parallelism,
) {
    // Tessera's own f32 kernels, where they take the product (`sgemm.rs` on AVX2 hosts,
    // `thin.rs` on AVX-512 ones: never both), with the same signature.
    type F32Product = unsafe fn(
        (usize, usize, usize),
        (*const f32, [isize; 2]),
        (*const f32, [isize; 2]),
        (*mut f32, [isize; 2]),
        bool,
    );
    let own: Option<F32Product> = match dtype == DType::F32 {
        true if crate::sgemm::plan((m, n, k)) => Some(crate::sgemm::run),
        true if crate::thin::plan((m, n, k), ls, rs, os) => Some(crate::thin::run),
        _ => None,
    };
    if let Some(run) = own {
        let parallel = !matches!(par, gemm::Parallelism::None);
        // SAFETY: the caller's views, of f32, `out` apart from the operands and its elements
        // at distinct addresses; the kernel's `plan` holds.
        unsafe {
            run(
                (m, n, k),
                (l as *const f32, ls),
                (r as *const f32, rs),
                (o as *mut f32, os),
                parallel,
            )
        }
    } else if crate::transpose::narrow_column_result((m, n, k), ls, os) {
        // Below this many multiply-adds the library's split over the cores was slower than
        // one core on the column-major result (1024 x 10 x 512: 134 against 118 us; 1024 x
        // 16 x 1024: 275 against 469 us, Xeon, docs/PERFORMANCE.md).
        let par = match m.saturating_mul(n).saturating_mul(k) >= 1 << 23 {
            true => par,
            false => gemm::Parallelism::None,
        };
        let column = [1, m as isize];
        // SAFETY: the caller's views; the product writes the scratch, an `m x n`
        // column-major buffer of the same type alive during the call, apart from the
        // operands, and the copy reads it back into the caller's `out` view.
        unsafe {
            let product =
                |c: *mut u8| gemm_dense(dtype, (m, n, k), (l, ls), (r, rs), (c, column), par);
            match dtype {
                DType::F32 => {
                    crate::transpose::with_column_major_out(o as *mut f32, os, (m, n), |c| {
                        product(c as *mut u8)
                    })
                }
                DType::F64 => {
                    crate::transpose::with_column_major_out(o as *mut f64, os, (m, n), |c| {
                        product(c as *mut u8)
                    })
                }
                _ => unreachable!("fusion sends only float dots to GEMM"),
            }
        }
    } else if crate::transpose::worth_copying((m, n, k), rs, os)
        && crate::transpose::in_chunks(
            m,
            n,
            dtype.byte_width(),
            !matches!(par, gemm::Parallelism::None),
        )
    {
        let parallel = !matches!(par, gemm::Parallelism::None);
        let stride = rs[1] as usize;
        let size = dtype.byte_width() as isize;
        let views = RowViews { l, r, o };
        // SAFETY: as the whole copy's below; chunk `n0..n0 + nn` of the copy is columns
        // `n0..n0 + nn` of `rhs`, and its product writes columns `n0..n0 + nn` of `out`
        // (offset by whole columns inside the caller's view), disjoint between chunks; each
        // chunk's product runs on one thread (`Parallelism::None`), never reentering rayon.
        unsafe {
            let product = |n0: usize, nn: usize, c: *const u8, ld: usize| {
                let (l, _, o) = views.get();
                gemm_dense(
                    dtype,
                    (m, nn, k),
                    (l, ls),
                    (c, [ld as isize, 1]),
                    (o.offset(n0 as isize * os[1] * size), os),
                    gemm::Parallelism::None,
                )
            };
            match dtype {
                DType::F32 => crate::transpose::with_row_major_chunks(
                    r as *const f32,
                    stride,
                    (k, n),
                    parallel,
                    |n0, nn, c, ld| product(n0, nn, c as *const u8, ld),
                ),
                DType::F64 => crate::transpose::with_row_major_chunks(
                    r as *const f64,
                    stride,
                    (k, n),
                    parallel,
                    |n0, nn, c, ld| product(n0, nn, c as *const u8, ld),
                ),
                _ => unreachable!("fusion sends only float dots to GEMM"),
            }
        }
    } else if crate::transpose::worth_copying((m, n, k), rs, os) {
        let parallel = !matches!(par, gemm::Parallelism::None);
        let stride = rs[1] as usize;
        // SAFETY: the caller's view of `rhs` is every `(kk, nn)` at `nn * stride + kk` (unit
        // stride along k, `stride >= k`: `worth_copying`), read-only here, of the arm's type
        // (f32 or f64); the product reads the copy, a row-major `k x n` buffer of the same
        // type with row stride `ld >= n` (`k * ld` values), alive during the call.
        unsafe {
            let product = |c: *const u8, ld: usize| {
                gemm_dense(
                    dtype,
                    (m, n, k),
                    (l, ls),
                    (c, [ld as isize, 1]),
                    (o, os),
                    par,
                )
            };
            match dtype {
                DType::F32 => crate::transpose::with_row_major(
                    r as *const f32,
                    stride,
                    (k, n),
                    parallel,
                    |c, ld| product(c as *const u8, ld),
                ),
                DType::F64 => crate::transpose::with_row_major(
                    r as *const f64,
                    stride,
                    (k, n),
                    parallel,
                    |c, ld| product(c as *const u8, ld),
                ),
                _ => unreachable!("fusion sends only float dots to GEMM"),
            }
        }
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { gemm_dense(dtype, (m, n, k), (l, ls), (r, rs), (o, os), par) }
    }
}

/// A thin product's views, shared by its row parts (`gemm_dense`).
#[derive(Clone, Copy)]
struct RowViews {
    l: *const u8,
    r: *const u8,
    o: *mut u8,
}

// SAFETY: the parts only read `l` and `r` and write disjoint rows (`gemm_dense`) or columns
// (`gemm_view`'s chunks) of `o`, or (`run_pair`) the two products of a pair write their own
// outputs, apart from everything the other reads or writes; all inside the views their
// caller vouches for, and the caller returns only once every part is done.
unsafe impl Send for RowViews {}
// SAFETY: as above.
unsafe impl Sync for RowViews {}

impl RowViews {
    /// The views (a method, so that a closure captures the wrapper, not its fields).
    fn get(self) -> (*const u8, *const u8, *mut u8) {
        (self.l, self.r, self.o)
    }
}

/// How many parts by rows, one thread each, a product to be run on every core goes in: the
/// gemm library's own split of a product with a short contraction (at most 16) is slower than
/// one thread. Measured alone on the Xeon of docs/PERFORMANCE.md, both cores: the big MLP's
/// `g @ w^T`, 512 x 1024 x 10, 134-143 us split by the library, 99 on one thread, 49-52 in
/// two parts. The left operand must be row-major and each part at least 64 rows. Such a
/// contraction is one block of the library's (no partial sums carried between blocks), and
/// every element is then the same sum in the same order either way (`tests`); a narrow
/// product with a long contraction (`h @ w`, 512 x 10 x 1024, 166 against 122-147 us) is not
/// split: at 129 x 16 x 700, two parts changed some elements' last bits.
///
/// A long contraction too, from `LONG_PARTS_FROM` multiply-adds, more than 64 columns and 64
/// rows a part (`part_rows`), any layout: here the library computes every f64 product and the f32 ones
/// `sgemm.rs` does not take (all of them on AVX-512 hosts), and its split of the big MLP's
/// products over two cores ran at 1.6x its one core (240-250 against 150 GFLOP/s, an AVX-512
/// Xeon, docs/PERFORMANCE.md, "twenty-seventh pass") where two row parts of one thread each
/// ran at 277-300: each part packs the whole right operand, but the parts never wait for each
/// other. Both parts and the whole take the library's general path there, whose sums are
/// chains over contraction blocks of a length set by `k` and the caches alone, so the bits
/// are the one thread's (`tests`). With more than 64 columns no part is a small product of
/// the library's (at most 64 by 64), whose blocks are `min(k, 512)` long instead: 128 x 17 x
/// 8000 in two parts of 64 rows changed elements' bits.
fn row_parts((m, n, k): (usize, usize, usize), ls: [isize; 2], par: gemm::Parallelism) -> usize {
    if matches!(par, gemm::Parallelism::None) {
        return 1;
    }
    let long = m.saturating_mul(n).saturating_mul(k) >= LONG_PARTS_FROM && n > 64;
    if (k > 16 || ls[1] != 1) && !long {
        return 1;
    }
    rayon::current_num_threads().min(m / 64).max(1)
}

/// Rows `m0..m1` of part `p` of `parts` (`row_parts`) over `m` rows: `floor(p m / parts)` on,
/// so every part has at least `floor(m / parts)` rows, 64 or more for `row_parts`'s counts (a
/// few rows of a part would take the library's matrix-vector or horizontal paths, other sums
/// than the whole's; a helper's review of 5f70699: 64 parts of 65 rows and one of 1 at 65
/// threads).
fn part_rows(m: usize, parts: usize, p: usize) -> (usize, usize) {
    // `p * m / parts` without overflow: `m = q parts + r`, `r < parts`.
    let bound = |p: usize| m / parts * p + m % parts * p / parts;
    (bound(p), bound(p + 1))
}

/// The fewest multiply-adds of a long-contraction product split in row parts (`row_parts`):
/// about 0.1 ms on one core, where joining the other costs a few microseconds.
const LONG_PARTS_FROM: usize = 1 << 24;

/// `gemm_dense`, for the tests of `gemm_view`'s layouts (`transpose.rs`).
///
/// # Safety
/// As `gemm_view`'s.
#[cfg(test)]
pub(crate) unsafe fn gemm_dense_for_tests(
    dtype: DType,
    mnk: (usize, usize, usize),
    l: (*const u8, [isize; 2]),
    r: (*const u8, [isize; 2]),
    o: (*mut u8, [isize; 2]),
    par: gemm::Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe { gemm_dense(dtype, mnk, l, r, o, par) }
}

/// `gemm_view`'s product itself, on the views as given: in row parts on every core when
/// `row_parts` says so.
///
/// # Safety
/// As `gemm_view`'s.
unsafe fn gemm_dense(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    (l, ls): (*const u8, [isize; 2]),
    (r, rs): (*const u8, [isize; 2]),
    (o, os): (*mut u8, [isize; 2]),
    par: gemm::Parallelism,
) {
    let parts = row_parts((m, n, k), ls, par);
    if parts >= 2 {
        let size = dtype.byte_width() as isize;
        let views = RowViews { l, r, o };
        // Part `p`: rows `part_rows(m, parts, p)` of the product, on one thread.
        let part = |p: usize| {
            let (l, r, o) = views.get();
            let (m0, m1) = part_rows(m, parts, p);
            if m0 < m1 {
                let at = m0 as isize;
                // SAFETY: rows `m0..m1` of the caller's views: the same strides, offset by
                // whole rows inside them; the parts write disjoint rows of `o`.
                unsafe {
                    gemm_dense(
                        dtype,
                        (m1 - m0, n, k),
                        (l.offset(at * ls[0] * size), ls),
                        (r, rs),
                        (o.offset(at * os[0] * size), os),
                        gemm::Parallelism::None,
                    )
                }
            }
        };
        if parts == 2 && crate::team::threads() == 2 {
            crate::team::join(|| part(0), || part(1));
        } else {
            use rayon::prelude::*;
            (0..parts).into_par_iter().for_each(part);
        }
        return;
    }
    // The library spreads a product over the rayon pool itself: the team's helper parks.
    let _quiet = matches!(par, gemm::Parallelism::Rayon(_)).then(crate::team::Quiet::new);
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 if k == 0 => zero_view(o as *mut f32, m, n, os),
            DType::F64 if k == 0 => zero_view(o as *mut f64, m, n, os),
            DType::F32 => gemm::gemm(
                m,
                n,
                k,
                o as *mut f32,
                os[1],
                os[0],
                false,
                l as *const f32,
                ls[1],
                ls[0],
                r as *const f32,
                rs[1],
                rs[0],
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                par,
            ),
            DType::F64 => gemm::gemm(
                m,
                n,
                k,
                o as *mut f64,
                os[1],
                os[0],
                false,
                l as *const f64,
                ls[1],
                ls[0],
                r as *const f64,
                rs[1],
                rs[0],
                0.0f64,
                1.0f64,
                false,
                false,
                false,
                par,
            ),
            _ => unreachable!("fusion sends only float dots to GEMM"),
        }
    }
}

/// The kernel argument array, shared by the two halves of a split kernel.
#[derive(Clone, Copy)]
struct SendArgs(*const *mut u8);

impl SendArgs {
    fn get(self) -> *const *mut u8 {
        self.0
    }
}

// SAFETY: the array outlives both halves (`rayon::join` returns after both), and the buffers
// it points to are read by both and written at disjoint indices.
unsafe impl Send for SendArgs {}
unsafe impl Sync for SendArgs {}

/// An arena of `words` zeroed words, or `None` when the allocator has no room. Allocated
/// zeroed (`calloc`), not zeroed by writing: a large block comes as fresh pages the kernel
/// zeroes on first touch, so pages a run never touches (a device that skips the replicated
/// updates another computes) are never faulted in. Writing the zeros was 40 ms of the first
/// step of the big MLP over 8 devices on one thread.
fn zeroed_words(words: usize) -> Option<Vec<u64>> {
    if words == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u64>(words).ok()?;
    // SAFETY: the layout has a non-zero size (`words > 0`).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u64;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `words` u64s (the
    // one `Vec<u64>` with capacity `words` uses), and zeroed memory is `words` valid u64s.
    Some(unsafe { Vec::from_raw_parts(p, words, words) })
}

/// Room for a result of type `ty`, or an error naming the size when the allocator has none.
fn out_data(ty: &TensorType) -> Result<Data, InterpError> {
    Data::try_with_capacity(ty.dtype, ty.numel()).map_err(|_| InterpError::Op {
        op: "allocate".into(),
        message: format!(
            "cannot allocate {} bytes for a result of type {ty}",
            ty.numel().saturating_mul(ty.dtype.byte_width())
        ),
    })
}

/// The vectors of one run, kept between runs so a run allocates none of them: every buffer's
/// address (`Executable::bind`), a kernel's argument table, and the program outputs the run
/// allocates (buffer, vector; taken by `collect`).
#[derive(Default)]
struct Scratch {
    ptrs: Vec<*mut u8>,
    args: Vec<*mut u8>,
    outs: Vec<(usize, Option<Data>)>,
}

// SAFETY: every run clears and refills `ptrs` and `args` (`bind`, `run_kernel`) before any of
// their pointers is dereferenced, and `run_partial` empties them when it returns, as
// `together::run_together` does (`finish` or `abandon`, on every path, unwinding included) for
// the paused runs it holds within one call: between runs they hold no pointer a thread could
// use, and moving the executable moves plain capacity.
// Within one call of `run_together`, a paused run's executable is also lent to another
// thread for a phase (`together::advance_all`, the two sides of a `rayon::join`) while its
// `ptrs` point into the caller's inputs, the call's stacked operands and products
// (`together::products`), the arenas and the first program's group region: sound because
// during a phase no step writes any of those but the run's own arena, its own copies in the
// group region (`GroupPlace`: disjoint from every other run's, so the two sides of the join
// write different bytes) and its outputs (the inputs and the stacked blocks are only read),
// and every one of them outlives the join, which returns before the call goes on.
// The `Data` in `outs` is `Send` on its own.
unsafe impl Send for Scratch {}

impl Executable {
    pub(crate) fn new(
        schedule: Schedule,
        code: Compiled,
        (kernel_steps, tails): (Vec<Option<usize>>, Vec<Option<crate::vmath::Tail>>),
        mesh: Option<Mesh>,
        regions: Vec<Vec<Executable>>,
    ) -> Executable {
        let kernels = kernel_steps
            .iter()
            .map(|k| k.map(|i| code.functions[i]))
            .collect();
        let plan = Plan::new(&schedule);
        let reduced_by = reduced_by(&schedule);
        let multiply_adds = Executable::count_multiply_adds(&schedule, &regions);
        let kernel_elements = count_kernel_elements(&schedule, &[]);
        let splits = schedule
            .steps
            .iter()
            .map(|step| match &step.kind {
                StepKind::Kernel(k) => crate::lower::splits_outer(k).then(|| {
                    k.out_dims.len() == 1
                        && crate::lower::form(k) == crate::lower::Form::Loops { vector: true }
                }),
                _ => None,
            })
            .collect();
        let pool = Pool::new(schedule.outputs.iter().map(|&b| &schedule.bufs[b].ty));
        let mut output_index = vec![None; schedule.bufs.len()];
        for (k, &b) in schedule.outputs.iter().enumerate().rev() {
            output_index[b] = Some(k);
        }
        let collective_ops = schedule
            .steps
            .iter()
            .map(|step| {
                if let StepKind::Collective(Op::Collective(op)) = &step.kind {
                    Some(Arc::new(op.clone()))
                } else {
                    None
                }
            })
            .collect();
        Executable {
            collective_ops,
            reduced_by,
            skipped: vec![false; schedule.steps.len()],
            dropped: vec![false; schedule.bufs.len()],
            // Allocated by the first run (`run_partial`), where a failure is an error.
            arena: RefCell::new(Vec::new()),
            pool: RefCell::new(pool),
            output_index,
            scratch: RefCell::new(Scratch::default()),
            groups: RefCell::default(),
            schedule,
            kernels,
            tails,
            splits,
            quick_functions: code.quick,
            _code: Arc::new(code),
            upgrade: None,
            plan,
            mesh,
            parallel_gemm_from: PARALLEL_GEMM_FROM,
            parallel_kernel_from: PARALLEL_KERNEL_FROM,
            shared_gemm_from: usize::MAX,
            meets_in_regions: regions.iter().flatten().any(body_meets),
            multiply_adds,
            kernel_elements,
            unshared_multiply_adds: multiply_adds,
            grouped: Vec::new(),
            grouped_bytes: 0,
            group_region: RefCell::new(Vec::new()),
            group_base: std::cell::Cell::new((0, 0)),
            regions,
            profile: profiling().then(RefCell::default),
            cursor: std::cell::Cell::new(0),
            awaiting: std::cell::Cell::new(false),
            fused_pending: std::cell::Cell::new(None),
            unsettled: std::cell::Cell::new(false),
            alone: std::cell::Cell::new(false),
        }
    }

    /// `self` with the optimized code of its quick kernels to come: `start` is given each
    /// step's kernel as first compiled and starts compiling (`tier::start`).
    pub(crate) fn tiered(
        mut self,
        start: impl FnOnce(Vec<Option<KernelFn>>) -> Arc<crate::tier::Upgrade>,
    ) -> Executable {
        self.upgrade = Some(start(self.kernels.clone()));
        self
    }

    /// Each step's kernel as called now: the optimized module's once the background compile
    /// is done (`tier.rs`), else the first (a call of quick code is counted: the first past
    /// one run's requests the optimized code).
    fn current_kernels(&self) -> &[Option<KernelFn>] {
        match self.upgrade.as_deref() {
            Some(u) => match u.get() {
                Some(optimized) => &optimized.kernels,
                None => {
                    u.called();
                    &self.kernels
                }
            },
            None => &self.kernels,
        }
    }

    /// Whether the optimized code has been requested (`None`: nothing is quick).
    #[cfg(test)]
    pub(crate) fn upgrade_requested(&self) -> Option<bool> {
        self.upgrade.as_ref().map(|u| u.requested())
    }

    /// Each step's kernel address as called now, and as first compiled.
    #[cfg(test)]
    pub(crate) fn kernel_tables(&self) -> (Vec<Option<usize>>, Vec<Option<usize>>) {
        let addresses = |t: &[Option<KernelFn>]| t.iter().map(|f| f.map(|f| f as usize)).collect();
        (addresses(self.current_kernels()), addresses(&self.kernels))
    }

    /// How many kernel functions of this executable and its region bodies were compiled at
    /// the quick tier (first, by `compile_tiered`; for good, by `compile_quick`); none by
    /// `compile`.
    pub fn quick_functions(&self) -> usize {
        self.quick_functions
            + self
                .regions
                .iter()
                .flatten()
                .map(Executable::quick_functions)
                .sum::<usize>()
    }

    /// Requests the optimized code of every quick kernel (region bodies included; a run
    /// requests it from the second run on) and waits at most `timeout` (and at most a day)
    /// for it; true when they have (at once when none was quick), false when the
    /// time ran out or the optimized compile failed (the quick code stays, with the same values).
    pub fn wait_optimized(&self, timeout: std::time::Duration) -> bool {
        // At most a day: a longer `Duration` (`Duration::MAX`) may not fit an `Instant`.
        let timeout = timeout.min(std::time::Duration::from_secs(24 * 3600));
        let deadline = std::time::Instant::now() + timeout;
        self.upgrade.as_ref().is_none_or(|u| u.wait(deadline))
            && self.regions.iter().flatten().all(|body| {
                body.wait_optimized(deadline.saturating_duration_since(std::time::Instant::now()))
            })
    }

    /// Times every step of every run from now on (what `TESSERA_PROFILE=1` turns on for every
    /// executable); `profile_report` reads the times.
    pub fn profiled(mut self) -> Executable {
        self.profile.get_or_insert_with(RefCell::default);
        self
    }

    /// The step profile so far: runs, then each step's mean time a run, its share, and its
    /// `describe` line. `None` when the executable is not profiled or has not run. A profiled
    /// executable prints it to stderr when dropped.
    pub fn profile_report(&self) -> Option<String> {
        let p = self.profile.as_ref()?.borrow();
        if p.runs == 0 {
            return None;
        }
        let total: std::time::Duration = p.steps.iter().sum();
        let mut out = format!(
            "TESSERA_PROFILE: {} runs, {:.1} us a run in its steps\n   us/run      %  step\n",
            p.runs,
            total.as_secs_f64() * 1e6 / p.runs as f64
        );
        for (line, t) in self.describe().lines().zip(&p.steps) {
            let us = t.as_secs_f64() * 1e6 / p.runs as f64;
            let pct = 100.0 * t.as_secs_f64() / total.as_secs_f64().max(f64::MIN_POSITIVE);
            writeln!(out, "{us:9.1} {pct:6.1}  {line}").unwrap();
        }
        Some(out)
    }

    /// The same program with an arena of its own, sharing the compiled code: an executable
    /// for another device without compiling again.
    pub fn fork(&self) -> Executable {
        if let Some(upgrade) = &self.upgrade {
            upgrade.shared_by_another();
        }
        Executable {
            schedule: self.schedule.clone(),
            kernels: self.kernels.clone(),
            tails: self.tails.clone(),
            splits: self.splits.clone(),
            _code: self._code.clone(),
            upgrade: self.upgrade.clone(),
            quick_functions: self.quick_functions,
            plan: self.plan.clone(),
            mesh: self.mesh.clone(),
            arena: RefCell::new(Vec::new()),
            pool: RefCell::new(self.pool.borrow().emptied()),
            output_index: self.output_index.clone(),
            collective_ops: self.collective_ops.clone(),
            scratch: RefCell::new(Scratch::default()),
            groups: RefCell::default(),
            parallel_gemm_from: self.parallel_gemm_from,
            parallel_kernel_from: self.parallel_kernel_from,
            shared_gemm_from: self.shared_gemm_from,
            reduced_by: self.reduced_by.clone(),
            skipped: self.skipped.clone(),
            dropped: self.dropped.clone(),
            regions: self
                .regions
                .iter()
                .map(|bodies| bodies.iter().map(Executable::fork).collect())
                .collect(),
            profile: profiling().then(RefCell::default),
            cursor: std::cell::Cell::new(0),
            awaiting: std::cell::Cell::new(false),
            fused_pending: std::cell::Cell::new(None),
            unsettled: std::cell::Cell::new(false),
            alone: std::cell::Cell::new(false),
            meets_in_regions: self.meets_in_regions,
            multiply_adds: self.multiply_adds,
            kernel_elements: self.kernel_elements,
            unshared_multiply_adds: self.unshared_multiply_adds,
            grouped: self.grouped.clone(),
            grouped_bytes: self.grouped_bytes,
            group_region: RefCell::new(Vec::new()),
            group_base: std::cell::Cell::new((0, 0)),
        }
    }

    /// Never split a GEMM or a kernel over threads (each device thread of the sharded runtime
    /// runs its own executable), except in a run that has the machine to itself (`start`:
    /// devices run in turn on one thread).
    ///
    /// Large GEMMs with a right operand from the program's inputs are offered to the
    /// transport: when every device passes the same buffer (a replicated weight), one thread
    /// multiplies all the devices' rows at once on both cores (`SharedProducts::gemm_shared_rhs`).
    pub fn single_threaded(mut self) -> Executable {
        self.parallel_gemm_from = usize::MAX;
        self.parallel_kernel_from = usize::MAX;
        self.shared_gemm_from = SHARED_GEMM_FROM;
        self.regions = std::mem::take(&mut self.regions)
            .into_iter()
            .map(|bodies| {
                bodies
                    .into_iter()
                    .map(Executable::single_threaded)
                    .collect()
            })
            .collect();
        // A body's large GEMMs now meet the other devices too (shared products).
        self.meets_in_regions = self.regions.iter().flatten().any(body_meets);
        self.unshared_multiply_adds = self.count_unshared_multiply_adds();
        (self.grouped, self.grouped_bytes) = self.group_slots();
        self
    }

    /// The `grouped` buffers and their bytes: every temporary (not an output, not another
    /// shared product's result) that is an operand of a shared product, whose size is a whole
    /// number of 64-byte lines (so every run's copy starts on a line, as the arena's buffers
    /// do, and no two runs' copies share one).
    fn group_slots(&self) -> (Vec<Option<usize>>, usize) {
        let bufs = &self.schedule.bufs;
        let steps = &self.schedule.steps;
        let shared = |i: usize| matches!(steps[i].kind, StepKind::Gemm(_)) && self.meets_others(i);
        // A shared product's result is read where the product put it (`place`): its own
        // buffer is not used.
        let mut placed = vec![false; bufs.len()];
        for i in (0..steps.len()).filter(|&i| shared(i)) {
            placed[steps[i].output] = true;
            if let Some(next) = self.reduced_by[i] {
                placed[steps[next].output] = true;
            }
        }
        let mut slots = vec![None; bufs.len()];
        let mut total = 0usize;
        for (i, step) in steps.iter().enumerate() {
            if !shared(i) {
                continue;
            }
            for &b in step.inputs.iter().take(2) {
                let bytes = bufs[b].ty.byte_size();
                if matches!(bufs[b].kind, BufKind::Temp)
                    && !placed[b]
                    && !self.schedule.outputs.contains(&b)
                    && slots[b].is_none()
                    && bytes > 0
                    && bytes.is_multiple_of(64)
                {
                    slots[b] = Some(total);
                    total = total.saturating_add(bytes);
                }
            }
        }
        (slots, total)
    }

    /// The group region for `devices` runs of this program started together (`GroupPlace`),
    /// sized and kept by this executable, or `None` when it has nothing to group or the
    /// region cannot be allocated (the runs then copy their parts, as before).
    pub(crate) fn group_region(&self, devices: usize) -> Option<usize> {
        let bytes = self.grouped_bytes.checked_mul(devices)?;
        if bytes == 0 || devices < 2 {
            return None;
        }
        let mut region = self.group_region.try_borrow_mut().ok()?;
        let words = bytes.div_ceil(8);
        if region.len() != words {
            *region = zeroed_words(words)?;
        }
        Some(region.as_mut_ptr() as usize)
    }

    /// Whether `other` lays out its grouped buffers as this executable does: forks of one
    /// compilation, made single-threaded alike.
    pub(crate) fn groups_as(&self, other: &Executable) -> bool {
        Arc::ptr_eq(&self._code, &other._code)
            && self.grouped_bytes == other.grouped_bytes
            && self.grouped == other.grouped
    }

    /// Whether a paused run (`advance`) stops at step `i`: a collective that meets other
    /// devices, or a GEMM the threaded run offers to the transport's shared products.
    fn pauses_at(&self, i: usize) -> bool {
        match &self.schedule.steps[i].kind {
            StepKind::Collective(Op::Collective(c)) => meets(c),
            StepKind::Gemm(_) => self.meets_others(i),
            StepKind::Kernel(_)
            | StepKind::Collective(_)
            | StepKind::Region(_)
            | StepKind::Window(_)
            | StepKind::Native(_) => false,
        }
    }

    /// Whether step `i` waits for the other devices: a collective, or a GEMM offered to the
    /// transport (`run_partial`).
    fn meets_others(&self, i: usize) -> bool {
        let step = &self.schedule.steps[i];
        match &step.kind {
            StepKind::Collective(_) => true,
            StepKind::Gemm(g) => {
                self.mesh.is_some()
                    && g.batch.is_empty()
                    && g.m * g.n * g.k >= self.shared_gemm_from
                    && (self.reduced_by[i].is_some()
                        || matches!(self.schedule.bufs[step.inputs[1]].kind, BufKind::Input(_)))
            }
            StepKind::Kernel(_) | StepKind::Window(_) | StepKind::Native(_) => false,
            // Conservatively: a body may hold collectives, and every device runs it.
            StepKind::Region(_) => true,
        }
    }

    /// Does not compute the outputs marked in `drop` (indices into the program's outputs), nor
    /// the steps only they need: a device whose replicated outputs another device returns
    /// skips them. Collectives and the GEMMs that meet other devices still run: the others
    /// wait for them. Such an output comes back as `None` from `run_partial`.
    pub fn dropping_outputs(mut self, drop: &[bool]) -> Executable {
        let steps = &self.schedule.steps;
        let outputs = &self.schedule.outputs;
        let mut live = vec![false; self.schedule.bufs.len()];
        for (i, &b) in outputs.iter().enumerate() {
            if !drop.get(i).copied().unwrap_or(false) {
                live[b] = true;
            }
        }
        let mut skipped = vec![true; steps.len()];
        for i in (0..steps.len()).rev() {
            if self.meets_others(i) || steps[i].writes().iter().any(|&b| live[b]) {
                skipped[i] = false;
                for &b in &steps[i].inputs {
                    live[b] = true;
                }
            }
        }
        let mut dropped = vec![false; self.schedule.bufs.len()];
        for (i, s) in steps.iter().enumerate() {
            if skipped[i] {
                for b in s.writes() {
                    dropped[b] = true;
                }
            }
        }
        self.kernel_elements = count_kernel_elements(&self.schedule, &skipped);
        self.skipped = skipped;
        self.dropped = dropped;
        self
    }

    /// The steps, one per line: for dumps and tests.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (i, step) in self.schedule.steps.iter().enumerate() {
            let what = match &step.kind {
                StepKind::Kernel(k) => format!("kernel {}", k.summary()),
                StepKind::Gemm(g) => format!(
                    "gemm {} m={} n={} k={} batch={}",
                    g.dtype,
                    g.m,
                    g.n,
                    g.k,
                    g.batch.len()
                ),
                StepKind::Collective(op) => format!("collective {}", op.name()),
                StepKind::Native(op) => format!("native {}", op.name()),
                StepKind::Region(r) => format!("region {} -> {:?}", r.op.name(), r.results),
                StepKind::Window(w) => w.summary(),
            };
            let with = match self.plan.pairs[i] {
                true => format!(" with {}", i + 1),
                false => String::new(),
            };
            writeln!(
                s,
                "{i:3}: buf{} <- {what} (reads {:?}){with}",
                step.output, step.inputs
            )
            .unwrap();
        }
        writeln!(s, "arena: {} bytes", self.plan.arena_bytes).unwrap();
        s
    }

    /// The most bytes of temporaries the executable holds at once: its arena, and while a
    /// region step runs, that region's bodies' (their own peaks; a body's arena is given back
    /// when its region step ends) and its carries' two scratch buffers. Program inputs and
    /// outputs are not counted (the caller holds them).
    pub fn peak_bytes(&self) -> usize {
        let bufs = &self.schedule.bufs;
        let mut during = 0usize;
        for (i, step) in self.schedule.steps.iter().enumerate() {
            let StepKind::Region(r) = &step.kind else {
                continue;
            };
            let bodies: usize = self.regions[i].iter().map(Executable::peak_bytes).sum();
            let carries = r.op.carries(step.inputs.len());
            let scratch: usize = r.results[..carries]
                .iter()
                .map(|&b| 2 * bufs[b].ty.byte_size().next_multiple_of(8))
                .sum();
            during = during.max(bodies.saturating_add(scratch));
        }
        self.plan.arena_bytes.saturating_add(during)
    }

    /// Gives back the arena (and the bodies' arenas): the next run allocates it again.
    fn release(&self) {
        *self.arena.borrow_mut() = Vec::new();
        if let Ok(mut region) = self.group_region.try_borrow_mut() {
            *region = Vec::new();
        }
        for bodies in &self.regions {
            for b in bodies {
                b.release();
            }
        }
    }

    /// The number of fused kernels.
    pub fn kernel_count(&self) -> usize {
        self.kernels.iter().flatten().count()
    }

    /// Runs the program on `inputs`, its collectives through `collectives`.
    pub fn run(
        &self,
        inputs: &[&Literal],
        collectives: &dyn Collectives,
    ) -> Result<Vec<Literal>, InterpError> {
        let mut out = Vec::with_capacity(self.schedule.outputs.len());
        self.run_into(inputs, collectives, &mut out)?;
        Ok(out)
    }

    /// `run` that appends the outputs to `out`: a caller that keeps `out` between runs
    /// allocates no vector for them.
    pub fn run_into(
        &self,
        inputs: &[&Literal],
        collectives: &dyn Collectives,
        out: &mut Vec<Literal>,
    ) -> Result<(), InterpError> {
        self.run_with(inputs, collectives, |o| {
            out.push(o.expect("no output dropped (see dropping_outputs)"))
        })
    }

    /// Like `run`, with `None` for the outputs `dropping_outputs` dropped: binds the buffers,
    /// runs each step that is not skipped, and collects the outputs.
    pub fn run_partial(
        &self,
        inputs: &[&Literal],
        collectives: &dyn Collectives,
    ) -> Result<Vec<Option<Literal>>, InterpError> {
        let mut out = Vec::with_capacity(self.schedule.outputs.len());
        self.run_partial_into(inputs, collectives, &mut out)?;
        Ok(out)
    }

    /// `run_partial` that appends the outputs to `out`.
    pub fn run_partial_into(
        &self,
        inputs: &[&Literal],
        collectives: &dyn Collectives,
        out: &mut Vec<Option<Literal>>,
    ) -> Result<(), InterpError> {
        self.run_with(inputs, collectives, |o| out.push(o))
    }

    /// Binds the buffers, runs each step that is not skipped, and hands `each` the outputs in
    /// order (`None` for one `dropping_outputs` dropped).
    fn run_with(
        &self,
        inputs: &[&Literal],
        collectives: &dyn Collectives,
        each: impl FnMut(Option<Literal>),
    ) -> Result<(), InterpError> {
        // A run entered again on its own thread while it waits (a rayon task its split
        // kernels or GEMMs stole that calls the same function, or a collective that does) is
        // an error, not a panic: runs of one executable do not nest.
        let (Ok(mut arena), Ok(mut scratch)) =
            (self.arena.try_borrow_mut(), self.scratch.try_borrow_mut())
        else {
            return Err(InterpError::Op {
                op: "run".into(),
                message: "this program is already running on this thread (called again while \
                          its run waited, from a task or a collective that run started): \
                          runs of one compiled program do not nest"
                    .into(),
            });
        };
        let Scratch { ptrs, args, outs } = &mut *scratch;
        let result = self
            .bind(&mut arena, inputs, ptrs, outs, None)
            .and_then(|()| self.run_steps(ptrs, args, collectives))
            .map(|()| self.collect(ptrs, outs, each));
        ptrs.clear();
        args.clear();
        outs.clear();
        result
    }

    /// Runs every step that is not skipped on the bound buffers `ptrs`.
    fn run_steps(
        &self,
        ptrs: &mut [*mut u8],
        args: &mut Vec<*mut u8>,
        collectives: &dyn Collectives,
    ) -> Result<(), InterpError> {
        if let Some(p) = &self.profile {
            let mut p = p.borrow_mut();
            p.runs += 1;
            p.steps
                .resize(self.schedule.steps.len(), Default::default());
        }
        self.steps_from((0, false), None, ptrs, args, collectives)
            .map(|_| ())
    }

    /// The smallest GEMM (`m n k`) run on both cores: `parallel_gemm_from`, or a one-device
    /// program's threshold while the run has the machine to itself (`alone`); none inside a
    /// team job (a device's run in one half of a phase, `together::advance_all`), which runs on
    /// its thread alone and never enters rayon.
    fn gemm_threads_from(&self) -> usize {
        if crate::team::in_job() {
            usize::MAX
        } else if self.alone.get() {
            PARALLEL_GEMM_FROM.min(self.parallel_gemm_from)
        } else {
            self.parallel_gemm_from
        }
    }

    /// The smallest kernel (elements) split over both cores, likewise.
    fn kernel_threads_from(&self) -> usize {
        if crate::team::in_job() {
            usize::MAX
        } else if self.alone.get() {
            PARALLEL_KERNEL_FROM.min(self.parallel_kernel_from)
        } else {
            self.parallel_kernel_from
        }
    }

    /// Runs the steps from `from` on: all of them, or (`pause`) up to the first step that
    /// meets other devices (`pauses_at`), whose index it returns. `fused` is an all-reduce
    /// step already done with the shared product before it.
    fn steps_from(
        &self,
        (from, pause): (usize, bool),
        mut fused: Option<usize>,
        ptrs: &mut [*mut u8],
        args: &mut Vec<*mut u8>,
        collectives: &dyn Collectives,
    ) -> Result<Option<usize>, InterpError> {
        // `fused`: the all-reduce step a shared product did along with its GEMM; `partner`:
        // a step that ran together with the one before it.
        let mut partner = None;
        // A run that splits its ops over threads (a one-device program's, or one with the
        // machine to itself) splits them over the team (`team.rs`), when it can have it.
        let _team = (self.kernel_threads_from() < usize::MAX)
            .then(crate::team::lead)
            .flatten();
        for (i, step) in self.schedule.steps.iter().enumerate().skip(from) {
            if fused == Some(i) || partner == Some(i) || self.skipped[i] {
                continue;
            }
            if pause && self.pauses_at(i) {
                return Ok(Some(i));
            }
            let start = self.profile.as_ref().map(|_| std::time::Instant::now());
            if self.runs_together(i) {
                // SAFETY: both are GEMM steps whose views lie inside their buffers (fusion.rs);
                // the second does not read the first's output (`pairs::paired`, `Plan::pairs`); each writes
                // only its own output, a temporary the plan places before freeing either
                // step's inputs (plan.rs) or a program output's own vector (`bind`), and
                // inputs and constants are only read: neither writes what the other reads or
                // writes.
                unsafe { self.run_pair(i, ptrs) };
                partner = Some(i + 1);
                if let (Some(p), Some(start)) = (&self.profile, start) {
                    p.borrow_mut().steps[i] += start.elapsed();
                }
                continue;
            }
            match &step.kind {
                StepKind::Kernel(k) => self.run_kernel(i, k, ptrs, args),
                StepKind::Gemm(g) => fused = self.run_gemm(i, g, ptrs, collectives)?,
                StepKind::Collective(op) => self.run_collective(step, op, ptrs, collectives)?,
                StepKind::Region(r) => self.run_region(i, r, ptrs, collectives)?,
                StepKind::Window(w) => {
                    // A conv's two operands or a reduce_window's one, in place (no vector
                    // per run).
                    let mut inputs = [std::ptr::null::<u8>(); 2];
                    assert!(
                        step.inputs.len() <= inputs.len(),
                        "a windowed op's operands"
                    );
                    for (slot, &b) in inputs.iter_mut().zip(&step.inputs) {
                        *slot = ptrs[b] as *const u8;
                    }
                    let inputs = &inputs[..step.inputs.len()];
                    // SAFETY: each input buffer holds a value of its operand's type (its step
                    // ran, or it is an input or constant), and the output is this step's own
                    // temporary of the result's type, which no input overlaps (plan.rs).
                    unsafe {
                        crate::window::run(w, inputs, ptrs[step.output], self.gemm_threads_from())
                    }?
                }
                StepKind::Native(op) => self.run_native(step, op, ptrs)?,
            }
            if let (Some(p), Some(start)) = (&self.profile, start) {
                p.borrow_mut().steps[i] += start.elapsed();
            }
        }
        Ok(None)
    }

    /// The elements the program's kernels write (outside region bodies), but for the steps
    /// it skips (`dropping_outputs`): a measure of its elementwise work.
    pub fn kernel_elements(&self) -> usize {
        self.kernel_elements
    }

    /// The work of a paused run's next `advance`, up to the next step that meets the other
    /// devices: the elements its kernels write plus a tenth of its own GEMMs' multiply-adds
    /// (a kernel element costs about ten: the big MLP over 8 devices on one thread, a 1 M
    /// element weight update 650 us, a 1024 x 10 x 64 product 65 us). Windows, regions and
    /// native steps count nothing (an estimate for balancing, not a bound).
    /// `together::advance_all` balances its threads by it.
    pub(crate) fn phase_work(&self) -> usize {
        let fused = self.fused_pending.get();
        let mut work = 0usize;
        for (i, step) in self
            .schedule
            .steps
            .iter()
            .enumerate()
            .skip(self.cursor.get())
        {
            if fused == Some(i) || self.skipped[i] {
                continue;
            }
            if self.pauses_at(i) {
                break;
            }
            let w = match &step.kind {
                StepKind::Kernel(k) => k.out_dims.iter().product::<usize>(),
                StepKind::Gemm(g) => {
                    let batch = g.batch.iter().map(|(e, _)| *e).product::<usize>();
                    batch.saturating_mul(g.m.saturating_mul(g.n).saturating_mul(g.k)) / 10
                }
                StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => 0,
            };
            work = work.saturating_add(w);
        }
        work
    }

    /// The multiply-adds of the program's GEMMs (`m n k`, times their batch), region bodies
    /// counted once: a measure of how much arithmetic a run does.
    pub fn multiply_adds(&self) -> usize {
        self.multiply_adds
    }

    /// `multiply_adds` less the shared products' (the GEMMs offered to the transport,
    /// `meets_others`): the arithmetic each device does on its own.
    pub fn unshared_multiply_adds(&self) -> usize {
        self.unshared_multiply_adds
    }

    fn count_unshared_multiply_adds(&self) -> usize {
        let shared: usize = (0..self.schedule.steps.len())
            .filter(|&i| self.meets_others(i))
            .map(|i| match &self.schedule.steps[i].kind {
                StepKind::Gemm(g) => g.m.saturating_mul(g.n).saturating_mul(g.k),
                StepKind::Kernel(_)
                | StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => 0,
            })
            .fold(0, usize::saturating_add);
        self.multiply_adds.saturating_sub(shared)
    }

    fn count_multiply_adds(schedule: &Schedule, regions: &[Vec<Executable>]) -> usize {
        let own: usize = schedule
            .steps
            .iter()
            .map(|s| match &s.kind {
                StepKind::Gemm(g) => {
                    let batch: usize = g.batch.iter().map(|(e, _)| e).product();
                    g.m.saturating_mul(g.n)
                        .saturating_mul(g.k)
                        .saturating_mul(batch)
                }
                StepKind::Kernel(_)
                | StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => 0,
            })
            .fold(0, usize::saturating_add);
        regions
            .iter()
            .flatten()
            .map(Executable::multiply_adds)
            .fold(own, usize::saturating_add)
    }

    /// The mesh the program's collectives are over (`None`: a program without collectives).
    pub fn mesh(&self) -> Option<&Mesh> {
        self.mesh.as_ref()
    }

    /// Whether a run can pause at every step that meets other devices (`start`): a collective
    /// or a shared product. False when a region body meets them (it runs inside its region's
    /// step).
    pub fn pauses_at_collectives(&self) -> bool {
        !self.meets_in_regions
    }

    /// Starts a run that pauses where it meets other devices, so that one thread can run
    /// several devices' programs in turn: binds `inputs` and the outputs as `run_partial`
    /// does, then `advance` runs up to each collective that meets other devices or shared
    /// product, and `finish` collects the outputs. Until `finish` (or `abandon`), the
    /// executable holds the run's buffers and pointers into `inputs`, so the caller keeps the
    /// inputs alive and unchanged and runs nothing else on it, and gives every pause its
    /// result (a collective's written into its output buffer, a product's by
    /// `settle_product`) before advancing again: crate-private, `together::run_together` is the
    /// one caller and keeps that contract. The run uses both cores (`alone`).
    ///
    /// # Safety
    /// `group`, when given, must be this run's place among runs of programs that lay out
    /// their buffers as this one (`groups_as`) in the region `group_region(devices)` of one of
    /// them, which stays allocated and is not sized again until every such run is finished
    /// or abandoned, with `index < devices` and no two of the runs at one index (`bind`).
    pub(crate) unsafe fn start<L: std::ops::Deref<Target = Literal>>(
        &self,
        inputs: &[L],
        group: Option<GroupPlace>,
    ) -> Result<(), InterpError> {
        debug_assert!(group.is_none_or(|g| g.index < g.devices));
        if !self.pauses_at_collectives() {
            return Err(InterpError::Op {
                op: "start".into(),
                message: "a region body of this program meets other devices".into(),
            });
        }
        let mut arena = self.arena.borrow_mut();
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { ptrs, outs, .. } = &mut *scratch;
        let bound = self.bind(&mut arena, inputs, ptrs, outs, group);
        self.group_base.set(match (&bound, group) {
            (Ok(()), Some(g)) => (g.base, g.devices.saturating_mul(self.grouped_bytes)),
            _ => (0, 0),
        });
        if bound.is_err() {
            drop(scratch);
            self.abandon();
        }
        self.cursor.set(0);
        self.awaiting.set(false);
        self.fused_pending.set(None);
        self.unsettled.set(false);
        self.alone.set(bound.is_ok());
        if let Some(p) = &self.profile {
            let mut p = p.borrow_mut();
            p.runs += 1;
            p.steps
                .resize(self.schedule.steps.len(), Default::default());
        }
        bound
    }

    /// Runs the started run's steps up to its next step that meets other devices (a
    /// collective or a shared product), and returns it (`None`: the run is complete). `local`
    /// serves what needs no other device (a one-member group, `axis_index` at its position).
    /// Call again once the pause has its result: a collective's in its output buffer, a
    /// product's given by `settle_product` (else this refuses).
    pub(crate) fn advance(&self, local: &dyn Collectives) -> Result<Option<Pause>, InterpError> {
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { ptrs, args, .. } = &mut *scratch;
        // The pause before this one (if any) has its result written: the caller advances only
        // then.
        if self.unsettled.get() {
            return Err(InterpError::Op {
                op: "dot_general".into(),
                message: "advanced past a shared product with no result (settle_product)".into(),
            });
        }
        self.awaiting.set(false);
        let fused = self.fused_pending.take();
        let at = self.steps_from((self.cursor.get(), true), fused, ptrs, args, local)?;
        let Some(i) = at else {
            self.cursor.set(self.schedule.steps.len());
            return Ok(None);
        };
        self.cursor.set(i + 1);
        self.awaiting.set(true);
        let step = &self.schedule.steps[i];
        let bufs = &self.schedule.bufs;
        let at = match &step.kind {
            StepKind::Collective(Op::Collective(op)) => {
                let input = step.inputs.first().ok_or_else(|| InterpError::Op {
                    op: op.name().into(),
                    message: "a collective without an operand".into(),
                })?;
                Meeting::Collective {
                    op: self.collective_ops[i]
                        .clone()
                        .unwrap_or_else(|| Arc::new(op.clone())),
                    input: ptrs[*input] as *const u8,
                    input_type: bufs[*input].ty.clone(),
                    output: ptrs[step.output],
                    output_type: bufs[step.output].ty.clone(),
                }
            }
            StepKind::Gemm(g) => {
                let at = self.product_meeting(i, g, ptrs, local.position())?;
                self.unsettled.set(true);
                at
            }
            StepKind::Kernel(_)
            | StepKind::Collective(_)
            | StepKind::Region(_)
            | StepKind::Window(_)
            | StepKind::Native(_) => unreachable!("a run pauses at steps that meet others only"),
        };
        Ok(Some(Pause { step: i, at }))
    }

    /// The meeting of shared product step `i`, the GEMM `g`, over the run's bound buffers.
    fn product_meeting(
        &self,
        i: usize,
        g: &GemmSpec,
        ptrs: &[*mut u8],
        position: usize,
    ) -> Result<Meeting, InterpError> {
        let step = &self.schedule.steps[i];
        let (stacking, group) = self.product_group(i, position)?;
        let part = GemmPart {
            dtype: g.dtype,
            m: g.m,
            n: g.n,
            k: g.k,
            lhs: ptrs[step.inputs[0]],
            lhs_strides: g.lhs,
            rhs: ptrs[step.inputs[1]],
            rhs_strides: g.rhs,
            out: ptrs[step.output],
            out_strides: g.out,
        };
        // An operand bound in the group region (`bind`) lies in that one allocation, with the
        // other runs' copies of it: its address says so (a buffer may be placed elsewhere
        // since, `place`).
        let (base, len) = self.group_base.get();
        let region = |b: usize| {
            let at = ptrs[b] as usize;
            match base != 0 && at >= base && at - base < len {
                true => base,
                false => 0,
            }
        };
        let mut part = PartAddr::of(&part);
        part.regions = [region(step.inputs[0]), region(step.inputs[1])];
        Ok(Meeting::Product {
            stacking,
            group,
            part,
        })
    }

    /// For a run paused at a shared product (`advance` returned it, not yet settled) that is
    /// the first of a pair (`pairs.rs`) whose second is a shared product too: the second's
    /// pause, as the next `advance` returns it once the first is settled (no step runs between
    /// them). Devices run in turn on one thread multiply the two stacked products at once,
    /// then settle the first, advance to the second and settle it (`together.rs`). The second
    /// reads nothing the first writes, so its operands are ready now; `None` otherwise.
    pub(crate) fn partner_pause(&self, position: usize) -> Result<Option<Pause>, InterpError> {
        let Some(i) = self.cursor.get().checked_sub(1) else {
            return Ok(None);
        };
        let j = i + 1;
        if !self.unsettled.get() || !self.plan.pairs[i] || self.skipped[j] || !self.meets_others(j)
        {
            return Ok(None);
        }
        let StepKind::Gemm(g) = &self.schedule.steps[j].kind else {
            return Ok(None);
        };
        // The first of a pair feeds no collective (`pairs::paired`): settling it leaves no
        // all-reduce to skip (`fused_pending`), so the next `advance` pauses at `j` at once.
        debug_assert!(self.reduced_by[i].is_none());
        let scratch = self.scratch.borrow();
        let at = self.product_meeting(j, g, &scratch.ptrs, position)?;
        Ok(Some(Pause { step: j, at }))
    }

    /// How shared product step `i` (a GEMM that `meets_others`) stacks, and with which group
    /// at mesh position `position`: along the contraction with the group of the sum all-reduce
    /// it is fused with (`reduced_by`), else by rows with every device.
    fn product_group(&self, i: usize, position: usize) -> Result<(Stacking, Group), InterpError> {
        let mesh = self.mesh.as_ref().ok_or_else(|| InterpError::Op {
            op: "dot_general".into(),
            message: "a shared product in a program without a mesh".into(),
        })?;
        Ok(match self.reduced_by[i] {
            Some(next) => {
                let StepKind::Collective(Op::Collective(CollectiveOp::AllReduce { axes, .. })) =
                    &self.schedule.steps[next].kind
                else {
                    unreachable!("reduced_by names an all_reduce step")
                };
                (Stacking::Depth, Group::of(mesh, axes, position))
            }
            None => (Stacking::Rows, Group::whole(mesh, position)),
        })
    }

    /// Completes the shared product a started run is paused at (`Meeting::Product`): `block`
    /// is its result in the group's stacked product, or `None` when the group's parts did not
    /// stack (the run then multiplies its own, as the threaded run does). The next `advance`
    /// goes on after it.
    ///
    /// # Safety
    /// The run must be paused at a product (`advance` returned `Meeting::Product`), and a
    /// `block` must be that product's result as `Stacking::result` gives it: a dense row-major
    /// `m x n` block that stays readable and unchanged until the run is finished or
    /// abandoned.
    pub(crate) unsafe fn settle_product(
        &self,
        block: Option<*const u8>,
    ) -> Result<(), InterpError> {
        let not_paused = || InterpError::Op {
            op: "dot_general".into(),
            message: "the run is not paused at a shared product".into(),
        };
        // `unsettled`: `advance` returned the product at the step before the cursor.
        let i = self.cursor.get().checked_sub(1).ok_or_else(not_paused)?;
        let step = &self.schedule.steps[i];
        let (StepKind::Gemm(g), true) = (&step.kind, self.unsettled.get()) else {
            return Err(not_paused());
        };
        self.unsettled.set(false);
        let mut scratch = self.scratch.borrow_mut();
        let ptrs = &mut scratch.ptrs;
        match block {
            Some(block) => {
                let (b, fused) = match self.reduced_by[i] {
                    Some(next) => (self.schedule.steps[next].output, Some(next)),
                    None => (step.output, None),
                };
                // SAFETY: the caller's contract: `block` is the product, dense row-major
                // `m x n`, alive until the run ends; buffer `b` has the product's type, laid
                // out as `g.out` says.
                unsafe { self.place(ptrs, b, block, g) };
                self.fused_pending.set(fused);
            }
            None => {
                let (l, r, o) = (
                    ptrs[step.inputs[0]],
                    ptrs[step.inputs[1]],
                    ptrs[step.output],
                );
                // SAFETY: the spec's extents and strides describe views inside the bound
                // operand and result buffers (fusion.rs builds them from the buffer shapes).
                unsafe { self.gemm(g, l, r, o) };
            }
        }
        Ok(())
    }

    /// The outputs of a started run that `advance` completed, appended to `out` as
    /// `run_partial` returns them;
    /// an error (and the run dropped) if it has not completed, as its outputs are not written.
    pub(crate) fn finish(&self, out: &mut Vec<Option<Literal>>) -> Result<(), InterpError> {
        if self.cursor.get() != self.schedule.steps.len() || self.awaiting.get() {
            self.abandon();
            return Err(InterpError::Op {
                op: "finish".into(),
                message: "the run has not completed".into(),
            });
        }
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { ptrs, args, outs } = &mut *scratch;
        self.collect(ptrs, outs, |o| out.push(o));
        ptrs.clear();
        args.clear();
        outs.clear();
        self.alone.set(false);
        self.group_base.set((0, 0));
        Ok(())
    }

    /// Drops a started run (a device failed): its buffers are freed, nothing is returned.
    pub(crate) fn abandon(&self) {
        self.cursor.set(0);
        self.awaiting.set(false);
        self.fused_pending.set(None);
        self.unsettled.set(false);
        self.alone.set(false);
        self.group_base.set((0, 0));
        let mut scratch = self.scratch.borrow_mut();
        scratch.ptrs.clear();
        scratch.args.clear();
        scratch.outs.clear();
    }

    /// Runs the program with its inputs read from, and its outputs written to, the given
    /// addresses (no literal is made): how a region runs its compiled body once per iteration.
    /// An output buffer of the program is the caller's memory itself; an output that is an
    /// input, a constant, or returned twice is copied there at the end.
    ///
    /// # Safety
    /// `inputs[k]` must point to a value of input `k`'s type that stays readable and unchanged
    /// until this returns; `outputs[k]` to room for a value of output `k`'s type, writable, and
    /// overlapping no input and no other output.
    unsafe fn run_at(
        &self,
        inputs: &[*const u8],
        outputs: &[*mut u8],
        collectives: &dyn Collectives,
    ) -> Result<(), InterpError> {
        let mut arena = self.arena.borrow_mut();
        let words = self.plan.arena_bytes.div_ceil(8);
        if arena.len() < words {
            *arena = zeroed_words(words).ok_or_else(|| InterpError::Op {
                op: "allocate".into(),
                message: format!(
                    "cannot allocate the {} bytes of temporaries a region body needs",
                    self.plan.arena_bytes
                ),
            })?;
        }
        let base = arena.as_mut_ptr() as *mut u8;
        let bufs = &self.schedule.bufs;
        let outs = &self.schedule.outputs;
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(bufs.len());
        for (i, b) in bufs.iter().enumerate() {
            ptrs.push(match &b.kind {
                // Kernels only read input buffers, so handing out `*mut` is sound.
                BufKind::Input(k) => inputs[*k] as *mut u8,
                BufKind::Constant(lit) => data_ptr(&lit.data) as *mut u8,
                BufKind::Temp => match self.output_index[i] {
                    Some(k) => outputs[k],
                    // SAFETY: the plan places every temporary inside the arena, which holds
                    // `arena_bytes` bytes.
                    None => unsafe { base.add(self.plan.offsets[i]) },
                },
            });
        }
        self.run_steps(&mut ptrs, &mut Vec::new(), collectives)?;
        for (k, &b) in outs.iter().enumerate() {
            let n = bufs[b].ty.byte_size();
            if ptrs[b] != outputs[k] && n > 0 {
                // SAFETY: buffer `b` holds a value of output `k`'s type (its step ran, or it is
                // an input or constant), and `outputs[k]` has room for one that overlaps no
                // input (the caller's contract) and no other output.
                unsafe { std::ptr::copy_nonoverlapping(ptrs[b], outputs[k], n) };
            }
        }
        Ok(())
    }

    /// Gives `data` (a buffer no one else holds: an argument the caller gave up) to the next
    /// runs: an output of its dtype and element count is written into it instead of a new
    /// vector. It is kept only if the largest outputs of its dtype it can hold fit it
    /// (`pool::fits`), and at most one buffer per such output; the others are freed (a large
    /// argument no output fits is not held for the executable's lifetime).
    pub fn recycle(&self, data: Data) {
        self.pool.borrow_mut().give(data);
    }

    /// Sizes the arena and gives every buffer its address: an input's or constant's own
    /// elements, a fresh vector for a program output, a place in the arena for a temporary
    /// (none for one no step that runs touches), or, in a run started with others in a
    /// group region (`group`), this run's copy in it for a `grouped` one.
    ///
    /// `group` must describe a region of `devices * grouped_bytes` writable bytes from `base`
    /// (8-aligned) that only the group's runs use while this run is bound, `index <
    /// devices`, each run with its own index.
    fn bind<L: std::ops::Deref<Target = Literal>>(
        &self,
        arena: &mut Vec<u64>,
        inputs: &[L],
        ptrs: &mut Vec<*mut u8>,
        outs: &mut Vec<(usize, Option<Data>)>,
        group: Option<GroupPlace>,
    ) -> Result<(), InterpError> {
        ptrs.clear();
        outs.clear();
        let words = self.plan.arena_bytes.div_ceil(8);
        if arena.len() < words {
            *arena = zeroed_words(words).ok_or_else(|| InterpError::Op {
                op: "allocate".into(),
                message: format!(
                    "cannot allocate the {} bytes of temporaries this program needs",
                    self.plan.arena_bytes
                ),
            })?;
        }
        let base = arena.as_mut_ptr() as *mut u8;
        let bufs = &self.schedule.bufs;
        ptrs.reserve(bufs.len());
        for (i, b) in bufs.iter().enumerate() {
            let p = match &b.kind {
                BufKind::Input(k) => {
                    let lit = inputs.get(*k).ok_or(InterpError::InputCount {
                        expected: k + 1,
                        got: inputs.len(),
                    })?;
                    if lit.ty != b.ty {
                        return Err(InterpError::InputType {
                            index: *k,
                            expected: b.ty.clone(),
                            got: lit.ty.clone(),
                        });
                    }
                    // Kernels only read input buffers, so handing out `*mut` is sound.
                    data_ptr(&lit.data) as *mut u8
                }
                BufKind::Constant(lit) => data_ptr(&lit.data) as *mut u8,
                // Never written, never read: no step that touches it runs.
                BufKind::Temp if self.dropped[i] => std::ptr::null_mut(),
                BufKind::Temp if let Some(k) = self.output_index[i] => {
                    let pooled = self.pool.borrow_mut().take(k);
                    let mut v = match pooled {
                        Some(v) => v,
                        None => out_data(&b.ty)?,
                    };
                    let p = v.as_mut_ptr();
                    outs.push((i, Some(v)));
                    p
                }
                BufKind::Temp => match (group, self.grouped.get(i).copied().flatten()) {
                    // The run's copy: `index * bytes` into the buffer's block of `devices *
                    // bytes` at `devices * offset`, where `offset + bytes <= grouped_bytes`
                    // (`group_slots`), so it ends by `devices * grouped_bytes`, inside the
                    // region (`bind`'s contract), and overlaps no other run's copy or buffer.
                    (Some(g), Some(offset)) => {
                        let at = g.devices * offset + g.index * b.ty.byte_size();
                        (g.base + at) as *mut u8
                    }
                    // SAFETY: the plan places every temporary inside the arena, which holds
                    // `arena_bytes` bytes.
                    _ => unsafe { base.add(self.plan.offsets[i]) },
                },
            };
            ptrs.push(p);
        }
        Ok(())
    }

    /// Runs step `i`, the fused kernel `k`, on the bound buffers: split in two halves of its
    /// outermost index over two threads when it is large (its elements times the elements
    /// each one reduces) and its function computes the range it is given
    /// (`lower::splits_outer`: a reduction too, each element summed in the same order).
    fn run_kernel(&self, i: usize, k: &Kernel, ptrs: &[*mut u8], args: &mut Vec<*mut u8>) {
        let step = &self.schedule.steps[i];
        args.clear();
        args.extend(step.inputs.iter().map(|&b| ptrs[b]));
        args.push(ptrs[step.output]);
        let f = self.current_kernels()[i].expect("a kernel step has a compiled kernel");
        let (tail, out_at) = (self.tails[i], step.inputs.len());
        debug_assert_eq!(k.n_inputs, out_at, "the output follows the inputs");
        let outer = k.out_dims.first().copied().unwrap_or(1) as i64;
        let reduced: usize = k.reduce.as_ref().map_or(1, |(_, d)| d.iter().product());
        let work = k.out_dims.iter().product::<usize>().saturating_mul(reduced);
        let split = self.splits[i]
            .filter(|_| work >= self.kernel_threads_from() && outer >= 2)
            .map(|rank1_vector| {
                // A rank-1 vector loop splits on a multiple of 8 so both halves keep whole
                // vector iterations; a loop of single elements (a reduction of rows) anywhere.
                if rank1_vector {
                    (outer / 2) & !7
                } else {
                    outer / 2
                }
            })
            // Fewer than 16 rows of a vector loop: one half would be empty.
            .filter(|&mid| mid > 0);
        if let Some(mid) = split {
            let a = SendArgs(args.as_ptr());
            #[cfg(test)]
            SPLITS.with(|c| c.set(c.get() + 1));
            // SAFETY: as below; the halves write disjoint parts of the output and only read
            // the inputs (a reduction's half sets and accumulates its own part of the result
            // alone: `lower::splits_outer`), and each applies the tail to its own rows.
            crate::team::join(
                || unsafe {
                    f(a.get(), 0, mid);
                    apply_tail(tail, k, a.get().add(out_at), 0..mid);
                },
                || unsafe {
                    f(a.get(), mid, outer);
                    apply_tail(tail, k, a.get().add(out_at), mid..outer);
                },
            );
        } else {
            // SAFETY: the function was compiled for a kernel of `k`'s code (`same_code`: its
            // body, inputs and dtypes; a flat kernel's length aside), which addresses its
            // buffers, inputs in this order then the output, each sized by its type, only as
            // `k`'s nest does over the range passed: `0..outer` is `k`'s own (its length for a
            // flat kernel), so it accesses nothing outside them (see lower.rs); the tail is
            // applied to the rows it wrote.
            unsafe {
                f(args.as_ptr(), 0, outer);
                apply_tail(tail, k, args.as_ptr().add(out_at), 0..outer);
            }
        }
    }

    /// Runs step `i`, the GEMM `g`. One that meets the other devices (`meets_others`) is
    /// offered to the transport's shared products, when it has them: the product then lands
    /// in this step's result, or, fused, in the result of the sum all-reduce that follows,
    /// whose step is returned (to be skipped). Otherwise it multiplies locally.
    fn run_gemm(
        &self,
        i: usize,
        g: &GemmSpec,
        ptrs: &mut [*mut u8],
        collectives: &dyn Collectives,
    ) -> Result<Option<usize>, InterpError> {
        let step = &self.schedule.steps[i];
        let (l, r, o) = (
            ptrs[step.inputs[0]],
            ptrs[step.inputs[1]],
            ptrs[step.output],
        );
        if let (true, Some(mesh), Some(shared)) = (
            self.meets_others(i),
            &self.mesh,
            collectives.shared_products(),
        ) {
            // SAFETY: the transport passes views inside live buffers: stacked copies, or the
            // devices' own, alive while they wait in the call.
            let whole =
                |c: &GemmCall| unsafe { multiply_shared(g.dtype, c, gemm::Parallelism::Rayon(0)) };
            let part = GemmPart {
                dtype: g.dtype,
                m: g.m,
                n: g.n,
                k: g.k,
                lhs: l,
                lhs_strides: g.lhs,
                rhs: r,
                rhs_strides: g.rhs,
                out: o,
                out_strides: g.out,
            };
            let position = collectives.position();
            let (done, b, fused) = match self.reduced_by[i] {
                Some(next) => {
                    let reduce = &self.schedule.steps[next];
                    let StepKind::Collective(Op::Collective(CollectiveOp::AllReduce {
                        axes, ..
                    })) = &reduce.kind
                    else {
                        unreachable!("reduced_by names an all_reduce step")
                    };
                    let group = Group::of(mesh, axes, position);
                    // SAFETY: the views lie inside this step's buffers (fusion.rs), which
                    // live until `run` returns; this thread is blocked in the call.
                    let done = unsafe { shared.gemm_all_reduce(&group, &part, &whole)? };
                    (done, reduce.output, Some(next))
                }
                // The right operand is a program input (`meets_others`).
                None => {
                    let group = Group::whole(mesh, position);
                    // SAFETY: as above.
                    let done = unsafe { shared.gemm_shared_rhs(&group, &part, &whole)? };
                    (done, step.output, None)
                }
            };
            if let Some(block) = done {
                // SAFETY: `block` is a dense row-major `m x n` product that stays until the
                // launch ends, after `run` returns; buffer `b` has the product's type, laid
                // out as `g.out` says.
                unsafe { self.place(ptrs, b, block, g) };
                return Ok(fused);
            }
        }
        // SAFETY: the spec's extents and strides describe views inside the operand and result
        // buffers (fusion.rs builds them from the buffer shapes).
        unsafe { self.gemm(g, l, r, o) };
        Ok(None)
    }

    /// The group over `axes` of `position` for the collective step whose output is buffer
    /// `output`: made at its first run at that position, kept after.
    fn group_of(
        &self,
        output: usize,
        mesh: &Mesh,
        axes: &[String],
        position: usize,
    ) -> std::cell::Ref<'_, Group> {
        let found = |gs: &[(usize, usize, Group)]| {
            gs.iter()
                .position(|(o, p, g)| *o == output && *p == position && g.axes == axes)
        };
        let at = found(&self.groups.borrow());
        let at = at.unwrap_or_else(|| {
            let mut gs = self.groups.borrow_mut();
            gs.retain(|(o, _, _)| *o != output);
            gs.push((output, position, Group::of(mesh, axes, position)));
            gs.len() - 1
        });
        std::cell::Ref::map(self.groups.borrow(), |gs| &gs[at].2)
    }

    /// Runs `step`, the collective `op`, through the transport: an all-reduce on the buffers
    /// themselves (`Collectives::all_reduce_buffers`), any other through a copy of its operand.
    fn run_collective(
        &self,
        step: &Step,
        op: &Op,
        ptrs: &[*mut u8],
        collectives: &dyn Collectives,
    ) -> Result<(), InterpError> {
        let bufs = &self.schedule.bufs;
        let Op::Collective(op) = op else {
            return Err(InterpError::Op {
                op: op.name().into(),
                message: "a collective step of another op".into(),
            });
        };
        let mesh = self.mesh.as_ref().ok_or_else(|| InterpError::Op {
            op: op.name().into(),
            message: "collective in a program without a mesh".into(),
        })?;
        if let (CollectiveOp::AllReduce { kind, axes }, Some(&b)) = (op, step.inputs.first()) {
            let group = self.group_of(step.output, mesh, axes, collectives.position());
            // SAFETY: buffer `b` holds a value of its type (written by an earlier step, or
            // bound at launch) and the output buffer has room for one; both live until `run`
            // returns, and this thread is blocked in the call.
            unsafe {
                collectives.all_reduce_buffers(
                    &group,
                    *kind,
                    &bufs[step.output].ty,
                    ptrs[b],
                    ptrs[step.output],
                )?
            };
            return Ok(());
        }
        // SAFETY: the input buffer holds a value of its type (written by an earlier step, or
        // bound at launch).
        let input = step
            .inputs
            .first()
            .map(|&b| unsafe { literal_from_raw(&bufs[b].ty, ptrs[b]) });
        let out_ty = &bufs[step.output].ty;
        let r = tessera_transport::run(collectives, op, mesh, input.as_ref(), out_ty)?;
        let n = out_ty.byte_size();
        // SAFETY: the result has the output's type (`run` checks), so `n` bytes fit the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data_ptr(&r.data), ptrs[step.output], n) };
        Ok(())
    }

    /// Runs a native step (`native.rs`): reads its operand buffers, writes its output.
    fn run_native(&self, step: &Step, op: &Op, ptrs: &[*mut u8]) -> Result<(), InterpError> {
        let bufs = &self.schedule.bufs;
        let out_ty = &bufs[step.output].ty;
        if out_ty.numel() == 0 {
            return Ok(());
        }
        if let Op::Concatenate { .. } = op {
            // Fusion makes a native step of a concatenate whose operands are whole blocks of
            // the result, in order (`fusion.rs`): one copy each.
            let mut at = 0usize;
            for &b in &step.inputs {
                let n = bufs[b].ty.byte_size();
                if n > 0 {
                    // SAFETY: input `b` holds `n` bytes of its value (its step ran, or it is
                    // bound); the operands' sizes add up to the output's (the type rule), so
                    // `at + n` is within the output buffer, which no input overlaps (the plan
                    // gives a step's output its own room).
                    unsafe { std::ptr::copy_nonoverlapping(ptrs[b], ptrs[step.output].add(at), n) };
                }
                at += n;
            }
            return Ok(());
        }
        // SAFETY: every input buffer holds a value of its type (written by an earlier step, or
        // bound at launch), alive until `run` returns.
        let args: Vec<Literal> = step
            .inputs
            .iter()
            .map(|&b| unsafe { literal_from_raw(&bufs[b].ty, ptrs[b]) })
            .collect();
        let data = crate::native::run(op, &args, out_ty).map_err(|message| InterpError::Op {
            op: op.name().into(),
            message,
        })?;
        // SAFETY: `run` checked that the result has the output's type, so its bytes fit the
        // output buffer, which no input overlaps (the plan gives a step's output its own room).
        unsafe {
            std::ptr::copy_nonoverlapping(data_ptr(&data), ptrs[step.output], out_ty.byte_size())
        };
        Ok(())
    }

    /// Runs step `i`, the region `r`: its control flow over its compiled bodies, each run in
    /// place on the step's buffers (`run_at`). A loop's carries alternate between two scratch
    /// buffers, so a body never writes what it reads; a scan's bodies read their slice of each
    /// scanned operand and write their slice of each stacked result where they lie.
    fn run_region(
        &self,
        i: usize,
        r: &RegionStep,
        ptrs: &[*mut u8],
        collectives: &dyn Collectives,
    ) -> Result<(), InterpError> {
        let step = &self.schedule.steps[i];
        let bufs = &self.schedule.bufs;
        let ins: Vec<*const u8> = step.inputs.iter().map(|&b| ptrs[b] as *const u8).collect();
        let outs: Vec<*mut u8> = r.results.iter().map(|&b| ptrs[b]).collect();
        let in_bytes = |k: usize| bufs[step.inputs[k]].ty.byte_size();
        let out_bytes = |k: usize| bufs[r.results[k]].ty.byte_size();
        let bodies = &self.regions[i];
        // Two scratch buffers for each carry of `bytes[k]` bytes.
        let scratch = |bytes: &[usize]| -> Result<Vec<[Vec<u64>; 2]>, InterpError> {
            bytes
                .iter()
                .map(|&n| {
                    let words = n.div_ceil(8);
                    let mut a = Vec::new();
                    let mut b = Vec::new();
                    a.try_reserve_exact(words)
                        .and_then(|()| b.try_reserve_exact(words))
                        .map_err(|_| InterpError::Op {
                            op: r.op.name().into(),
                            message: format!("cannot allocate a carry of {n} bytes"),
                        })?;
                    a.resize(words, 0);
                    b.resize(words, 0);
                    Ok([a, b])
                })
                .collect()
        };
        // Copies each final carry into its result buffer.
        let finish = |cur: &[*const u8], first: usize| {
            for (k, &c) in cur.iter().enumerate() {
                let n = out_bytes(first + k);
                if n > 0 {
                    // SAFETY: `c` holds a value of the carry's type (an operand, or a body's
                    // output in scratch), the result buffer has room for one, and they are
                    // different memory (an operand buffer is never a result of the same step).
                    unsafe { std::ptr::copy_nonoverlapping(c, outs[first + k], n) };
                }
            }
        };
        match &r.op {
            RegionOp::Scan {
                length,
                reverse,
                consts,
                carries,
                ..
            } => {
                let (length, nc, nk) = (*length, *consts, *carries);
                let nx = ins.len() - nc - nk;
                let ny = outs.len() - nk;
                let carry_bytes: Vec<usize> = (0..nk).map(out_bytes).collect();
                let mut scratch = scratch(&carry_bytes)?;
                let x_step: Vec<usize> = (0..nx)
                    .map(|j| in_bytes(nc + nk + j).checked_div(length).unwrap_or(0))
                    .collect();
                let y_step: Vec<usize> = (0..ny)
                    .map(|y| out_bytes(nk + y).checked_div(length).unwrap_or(0))
                    .collect();
                let mut cur: Vec<*const u8> = ins[nc..nc + nk].to_vec();
                let mut args: Vec<*const u8> = Vec::with_capacity(ins.len());
                let mut dst: Vec<*mut u8> = Vec::with_capacity(outs.len());
                for s in 0..length {
                    let t = if *reverse { length - 1 - s } else { s };
                    args.clear();
                    args.extend_from_slice(&ins[..nc]);
                    args.extend_from_slice(&cur);
                    // SAFETY: slice `t < length` of a scanned operand of `length` slices.
                    args.extend((0..nx).map(|j| unsafe { ins[nc + nk + j].add(t * x_step[j]) }));
                    dst.clear();
                    dst.extend(
                        scratch
                            .iter_mut()
                            .map(|pair| pair[s % 2].as_mut_ptr() as *mut u8),
                    );
                    // SAFETY: slice `t` of a stacked result of `length` slices.
                    dst.extend((0..ny).map(|y| unsafe { outs[nk + y].add(t * y_step[y]) }));
                    // SAFETY: each argument points to a value of the body's parameter type
                    // (a whole operand, the carry of the step before, one slice of a scanned
                    // operand), alive until the step ends; each destination to room for a value
                    // of the body's output type: this step's scratch half (never the half the
                    // carry is read from) or one slice of a result buffer, which overlaps no
                    // operand and no other slice.
                    unsafe { bodies[0].run_at(&args, &dst, collectives)? };
                    cur = dst[..nk].iter().map(|&p| p as *const u8).collect();
                }
                finish(&cur, 0);
            }
            RegionOp::While { consts, .. } => {
                let nc = *consts;
                let nk = ins.len() - nc;
                let carry_bytes: Vec<usize> = (0..nk).map(out_bytes).collect();
                let mut scratch = scratch(&carry_bytes)?;
                let mut cur: Vec<*const u8> = ins[nc..].to_vec();
                let mut flag = [0u8; 1];
                let mut args: Vec<*const u8> = Vec::with_capacity(ins.len());
                for s in 0usize.. {
                    args.clear();
                    args.extend_from_slice(&ins[..nc]);
                    args.extend_from_slice(&cur);
                    // SAFETY: the arguments as in the scan; the condition's one output is a
                    // bool scalar, one byte, into `flag`.
                    unsafe { bodies[0].run_at(&args, &[flag.as_mut_ptr()], collectives)? };
                    if flag[0] == 0 {
                        break;
                    }
                    let dst: Vec<*mut u8> = scratch
                        .iter_mut()
                        .map(|pair| pair[s % 2].as_mut_ptr() as *mut u8)
                        .collect();
                    // SAFETY: as in the scan: the body writes this iteration's scratch half,
                    // and reads the other (or the operands).
                    unsafe { bodies[1].run_at(&args, &dst, collectives)? };
                    cur = dst.iter().map(|&p| p as *const u8).collect();
                }
                finish(&cur, 0);
            }
            RegionOp::Case { branches } => {
                // SAFETY: operand 0 is the index, an i32 scalar (the type rule).
                let index = unsafe { std::ptr::read_unaligned(ins[0] as *const i32) };
                let k = (index as i64).clamp(0, branches.len() as i64 - 1) as usize;
                // SAFETY: the operands have the branches' parameter types and the results their
                // output types; results overlap no operand (the plan).
                unsafe { bodies[k].run_at(&ins[1..], &outs, collectives)? };
            }
            RegionOp::Checkpoint { .. } | RegionOp::CustomVjp { .. } => {
                // SAFETY: as for a case's branch.
                unsafe { bodies[0].run_at(&ins, &outs, collectives)? };
            }
        }
        // A body's temporaries live only while its region runs (what `checkpoint` saves).
        for b in bodies {
            b.release();
        }
        Ok(())
    }

    /// The program's outputs after a run: the vectors `bind` allocated, or copies of the
    /// buffers (an input or constant returned as is, an output returned twice); `None` for a
    /// dropped one.
    fn collect(
        &self,
        ptrs: &[*mut u8],
        owned: &mut [(usize, Option<Data>)],
        mut each: impl FnMut(Option<Literal>),
    ) {
        let bufs = &self.schedule.bufs;
        for (b, v) in owned.iter_mut() {
            if let Some(v) = v {
                // SAFETY: `v` has room for `numel` elements (`out_data` or the pool), and the
                // step that writes the output buffer ran and wrote every one (bools as 0 or 1).
                unsafe { v.set_len(bufs[*b].ty.numel()) };
            }
        }
        for &b in &self.schedule.outputs {
            if self.dropped[b] {
                each(None);
                continue;
            }
            each(Some(
                // `bind` pushed the owned buffers in ascending order.
                match owned
                    .binary_search_by_key(&b, |&(o, _)| o)
                    .ok()
                    .and_then(|at| owned[at].1.take())
                {
                    Some(data) => Literal {
                        ty: bufs[b].ty.clone(),
                        data,
                    },
                    // SAFETY: the buffer holds a value of its type.
                    None => unsafe { literal_from_raw(&bufs[b].ty, ptrs[b]) },
                },
            ));
        }
    }

    /// Makes buffer `b` hold the product `block` (dense row-major `g.m x g.n`, read-only,
    /// alive until the launch ends): later steps read it in place when `b` is an intermediate
    /// laid out row-major (one step writes each buffer, and that step is this one); otherwise
    /// it is copied into `b` (a program output, which the caller owns, or another layout).
    ///
    /// # Safety
    /// As stated, and `ptrs[b]` must point to room for a value of `b`'s type laid out as
    /// `g.out` says.
    unsafe fn place(&self, ptrs: &mut [*mut u8], b: usize, block: *const u8, g: &GemmSpec) {
        let size = g.dtype.byte_width();
        if g.out == [g.n as isize, 1] {
            if self.output_index[b].is_none() {
                ptrs[b] = block as *mut u8;
            } else {
                // SAFETY: both hold `m x n` dense elements (the caller's contract).
                unsafe { std::ptr::copy_nonoverlapping(block, ptrs[b], g.m * g.n * size) };
            }
            return;
        }
        for i in 0..g.m {
            for j in 0..g.n {
                let at = (i as isize * g.out[0] + j as isize * g.out[1]) * size as isize;
                // SAFETY: element (i, j) of both views (the caller's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        block.add((i * g.n + j) * size),
                        ptrs[b].offset(at),
                        size,
                    )
                };
            }
        }
    }

    /// # Safety
    /// `l`, `r` and `o` must hold the views `g` describes.
    unsafe fn gemm(&self, g: &GemmSpec, l: *mut u8, r: *mut u8, o: *mut u8) {
        let par = if g.m * g.n * g.k >= self.gemm_threads_from() {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: the caller's contract.
        unsafe { gemm_spec(g, (l, r, o), par) }
    }

    /// Whether step `i` runs together with step `i + 1` in this run: a pair (`pairs.rs`) of
    /// products that would each have used every core, neither met by other devices nor
    /// skipped, on a pool of exactly two threads (one a side; on more, a side on one core
    /// would leave the others idle).
    fn runs_together(&self, i: usize) -> bool {
        if !self.plan.pairs[i] || self.skipped[i + 1] || rayon::current_num_threads() != 2 {
            return false;
        }
        let from = self.gemm_threads_from();
        [i, i + 1]
            .iter()
            .all(|&j| match &self.schedule.steps[j].kind {
                StepKind::Gemm(g) => {
                    g.m.saturating_mul(g.n).saturating_mul(g.k) >= from && !self.meets_others(j)
                }
                StepKind::Kernel(_)
                | StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => false,
            })
    }

    /// Runs the GEMM steps `i` and `i + 1` at once, one thread each (`rayon::join`).
    ///
    /// # Safety
    /// Both steps' views lie inside their bound buffers, and neither output overlaps anything
    /// the other step reads or writes (`plan.rs` places a pair as one step).
    unsafe fn run_pair(&self, i: usize, ptrs: &[*mut u8]) {
        let steps = &self.schedule.steps;
        let (StepKind::Gemm(ga), StepKind::Gemm(gb)) = (&steps[i].kind, &steps[i + 1].kind) else {
            unreachable!("runs_together pairs GEMM steps")
        };
        let views = |s: &Step| RowViews {
            l: ptrs[s.inputs[0]],
            r: ptrs[s.inputs[1]],
            o: ptrs[s.output],
        };
        let (va, vb) = (views(&steps[i]), views(&steps[i + 1]));
        let one = gemm::Parallelism::None;
        #[cfg(test)]
        PAIRS.with(|p| p.set(p.get() + 1));
        // SAFETY: the caller's contract; each side only reads its operands and writes its own
        // output, and both return before `join` does. A product on one thread never enters
        // rayon, so neither side can take the other's task while it holds its scratch.
        crate::team::join(
            || unsafe {
                let (l, r, o) = va.get();
                gemm_spec(ga, (l as *mut u8, r as *mut u8, o), one)
            },
            || unsafe {
                let (l, r, o) = vb.get();
                gemm_spec(gb, (l as *mut u8, r as *mut u8, o), one)
            },
        );
    }
}

#[cfg(test)]
thread_local! {
    /// How many pairs `run_pair` ran on this thread (for the test that a pair runs).
    static PAIRS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// How many kernels `run_kernel` split over two threads on this thread.
    static SPLITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `g`'s product, every batch element, on `par`'s threads.
///
/// # Safety
/// The spec's extents and strides describe views inside the operand and result buffers, the
/// result not overlapping the operands.
unsafe fn gemm_spec(g: &GemmSpec, (l, r, o): (*mut u8, *mut u8, *mut u8), par: gemm::Parallelism) {
    let size = g.dtype.byte_width() as isize;
    let nbatch: usize = g.batch.iter().map(|(e, _)| e).product();
    for bi in 0..nbatch {
        let (mut lo, mut ro, mut oo) = (0isize, 0isize, 0isize);
        let mut rest = bi;
        for (extent, [ls, rs, os]) in g.batch.iter().rev() {
            let i = (rest % extent) as isize;
            rest /= extent;
            lo += i * ls;
            ro += i * rs;
            oo += i * os;
        }
        // SAFETY: offsets stay inside the buffers (the caller's contract).
        unsafe {
            gemm_view(
                g.dtype,
                (g.m, g.n, g.k),
                (l.offset(lo * size), g.lhs),
                (r.offset(ro * size), g.rhs),
                (o.offset(oo * size), g.out),
                par,
            )
        };
    }
}

/// # Safety
/// `o` must hold an `m x n` view with strides `s`.
unsafe fn zero_view<T: Default>(o: *mut T, m: usize, n: usize, s: [isize; 2]) {
    for i in 0..m as isize {
        for j in 0..n as isize {
            // SAFETY: inside the view (the caller's contract).
            unsafe { *o.offset(i * s[0] + j * s[1]) = T::default() };
        }
    }
}

/// Applies a kernel step's tail, if it has one, to rows `rows` of kernel `k`'s output, the
/// buffer `*out` points to.
///
/// # Safety
/// `*out` is the output buffer `run_kernel` bound for `k`, the kernel has just written those
/// rows, and no other thread touches them during the call.
unsafe fn apply_tail(
    tail: Option<crate::vmath::Tail>,
    k: &Kernel,
    out: *const *mut u8,
    rows: Range<i64>,
) {
    let Some(t) = tail else { return };
    // A tail is split off only an elementwise f32 kernel (`split_tail`), whose output is
    // its `out_dims` in row-major order, dense: row `r` of the outermost dim is elements
    // `r * inner..(r + 1) * inner`.
    let n: usize = k.out_dims.iter().product();
    let inner = k.out_dims.iter().skip(1).product::<usize>();
    let (lo, hi) = (
        rows.start as usize * inner,
        (rows.end as usize * inner).min(n),
    );
    if lo >= hi {
        return;
    }
    // SAFETY: the output holds the kernel's `n` f32 values (`lo < hi <= n`), of which these
    // rows are this caller's alone (the contract).
    let out = unsafe {
        let base = *out as *mut f32;
        std::slice::from_raw_parts_mut(base.add(lo), hi - lo)
    };
    t.apply(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large reductions whose elements each reduce a row (`lower::splits_outer`) run in two
    /// halves of their result's outermost dim on two threads, with the bits of one thread and
    /// of the interpreter: sums and maxima of rows, an argmax; a column sum (in memory or in
    /// registers) and a sum to one value run whole.
    /// A run inside a team job (a device's run in one half of a phase,
    /// `together::advance_all`) splits nothing, neither its kernels nor its products, and
    /// computes the same bits; outside one, the same run splits both.
    #[test]
    fn a_run_inside_a_team_job_splits_nothing() {
        let g = tessera_ir::parse(
            "func @f(%0: f32[512,256], %1: f32[256,256]) {
  %2 = tanh %0 : f32[512,256]
  %3 = dot_general %2, %1 contracting=[1]x[0] : f32[512,256]
  %4 = reduce_sum %3 axes=[1] : f32[512]
  return %3, %4
}",
        )
        .unwrap();
        let lit = |rows: usize, seed: usize| {
            let v = (0..rows * 256)
                .map(|i| ((i * 7919 + seed) % 1013) as f32 * 0.01 - 5.0)
                .collect();
            Literal::new(vec![rows, 256], Data::F32(v)).unwrap()
        };
        let (x, w) = (lit(512, 13), lit(256, 101));
        let exe = crate::compile(&g).unwrap();
        let run = || {
            let splits = SPLITS.with(|c| c.get());
            let out = exe
                .run(&[&x, &w], &tessera_transport::SingleDevice)
                .unwrap();
            (out, SPLITS.with(|c| c.get()) - splits)
        };
        let (alone, splits) = run();
        assert_eq!(splits, 2, "the tanh and the row sum split");
        assert!(exe.gemm_threads_from() <= 512 * 256 * 256);
        let (in_job, splits) = crate::team::as_a_job(run);
        assert_eq!(splits, 0);
        assert_eq!(
            crate::team::as_a_job(|| exe.gemm_threads_from()),
            usize::MAX
        );
        for (a, b) in alone.iter().zip(&in_job) {
            assert!(a.data.bits_eq(&b.data));
        }
    }

    #[test]
    fn large_row_reductions_split_over_two_threads_with_the_bits_of_one() {
        let cases: [(&str, &[usize], bool); 10] = [
            ("reduce_sum %0 axes=[1] : f32[512]", &[512, 256], true),
            // Into memory and into registers, by rows of a result of two dims.
            ("reduce_max %0 axes=[1] : f32[64,200]", &[64, 40, 200], true),
            ("reduce_sum %0 axes=[1] : f32[64,16]", &[64, 512, 16], true),
            ("reduce_sum %0 axes=[1] : f32[12]", &[12, 8000], true),
            ("reduce_max %0 axes=[1] : f32[700]", &[700, 97], true),
            (
                "reduce_sum %0 axes=[2,3] : f32[64,5]",
                &[64, 5, 16, 16],
                true,
            ),
            ("argmax %0 axis=1 : i32[64,100]", &[64, 40, 100], true),
            ("reduce_sum %0 axes=[0] : f32[1000]", &[300, 1000], false),
            ("reduce_sum %0 axes=[0] : f32[32]", &[2048, 32], false),
            ("reduce_sum %0 axes=[0,1] : f32[]", &[512, 256], false),
        ];
        for (op, dims, splits) in cases {
            let ty = dims
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let g = tessera_ir::parse(&format!(
                "func @f(%0: f32[{ty}]) {{\n  %1 = {op}\n  return %1\n}}\n"
            ))
            .unwrap();
            let n: usize = dims.iter().product();
            let v = (0..n)
                .map(|i| ((i * 7919 + 13) % 1013) as f32 * 0.37 - 150.0)
                .collect();
            let x = Literal::new(dims.to_vec(), Data::F32(v)).unwrap();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            let (split, splits_run) = pool.install(|| {
                let exe = crate::compile(&g).unwrap();
                let before = SPLITS.with(|c| c.get());
                let out = exe.run(&[&x], &tessera_transport::SingleDevice).unwrap();
                (out, SPLITS.with(|c| c.get()) - before)
            });
            let whole = crate::compile(&g)
                .unwrap()
                .single_threaded()
                .run(&[&x], &tessera_transport::SingleDevice)
                .unwrap();
            assert_eq!(splits_run, usize::from(splits), "{op}");
            assert!(split[0].data.bits_eq(&whole[0].data), "{op}");
            // Each element combines its inputs in the order of the reduced indices, as the
            // interpreter does.
            let reference = tessera_interp::run(&g, std::slice::from_ref(&x)).unwrap();
            assert!(split[0].data.bits_eq(&reference[0].data), "{op}");
        }
    }

    /// A one-device program run from a thread outside the rayon pool splits its large kernels
    /// over the team (`team.rs`) when the pool is two threads wide, as the machines of
    /// docs/PERFORMANCE.md are, with the bits of one thread; never from a pool's worker, nor
    /// with a wider pool (rayon's halves then).
    #[test]
    fn one_device_runs_split_over_the_team_with_the_bits_of_one_thread() {
        let g = tessera_ir::parse(
            "func @f(%0: f32[512,256], %1: f32[512,256]) {\n  %2 = tanh %0 : f32[512,256]\n  \
             %3 = mul %2, %1 : f32[512,256]\n  %4 = reduce_sum %3 axes=[1] : f32[512]\n  \
             return %3, %4\n}\n",
        )
        .unwrap();
        let lit = |seed: usize| {
            let v = (0..512 * 256)
                .map(|i| ((i * 7919 + seed) % 1013) as f32 * 0.01 - 5.0)
                .collect();
            Literal::new(vec![512, 256], Data::F32(v)).unwrap()
        };
        let (x, y) = (lit(13), lit(101));
        let whole = crate::compile(&g)
            .unwrap()
            .single_threaded()
            .run(&[&x, &y], &tessera_transport::SingleDevice)
            .unwrap();
        let exe = crate::compile(&g).unwrap();
        let (posts, team) = crate::team::posts_once_the_team_is_free(|| {
            let out = exe
                .run(&[&x, &y], &tessera_transport::SingleDevice)
                .unwrap();
            for (a, b) in out.iter().zip(&whole) {
                assert!(a.data.bits_eq(&b.data));
            }
        });
        // Both kernels split (the tanh-mul and the row sum), on the team when there is one.
        assert_eq!(
            posts,
            if team { 2 } else { 0 },
            "{} threads",
            rayon::current_num_threads()
        );
        // From a worker of a two-thread pool: rayon's halves, not the team.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (posts, splits) = pool.install(|| {
            let exe = crate::compile(&g).unwrap();
            let (p, s) = (
                crate::team::POSTS.with(|p| p.get()),
                SPLITS.with(|c| c.get()),
            );
            exe.run(&[&x, &y], &tessera_transport::SingleDevice)
                .unwrap();
            (
                crate::team::POSTS.with(|c| c.get()) - p,
                SPLITS.with(|c| c.get()) - s,
            )
        });
        assert_eq!((posts, splits), (0, 2));
    }

    /// A kernel ending in an f32 tanh gets the host's full-width tail when it has one (the
    /// AVX-512 and AVX2 hosts), and the result is the bits of the kernel's own tanh (the
    /// interpreter's tanh is glibc's, so the reference is the tail's own test: here, that the
    /// compiled program uses it); a tanh inside an expression keeps its place.
    #[test]
    fn a_final_tanh_runs_as_the_kernels_tail() {
        use tessera_ir::{Graph, Op, TensorType, UnaryOp};
        let program = |last: bool| {
            let mut g = Graph::new("t");
            let x = g.add_param(TensorType::new(DType::F32, vec![64, 128]));
            let b = g.add_param(TensorType::new(DType::F32, vec![64, 128]));
            let s = g
                .add(Op::Binary(tessera_ir::BinaryOp::Add), &[x, b])
                .unwrap();
            let mut y = g.add(Op::Unary(UnaryOp::Tanh), &[s]).unwrap();
            if !last {
                y = g
                    .add(Op::Binary(tessera_ir::BinaryOp::Mul), &[y, b])
                    .unwrap();
            }
            g.set_outputs(vec![y]);
            crate::compile(&g).unwrap()
        };
        let tails = |e: &Executable| e.tails.iter().flatten().copied().collect::<Vec<_>>();
        let expected: Vec<_> = crate::vmath::Tail::tanh().into_iter().collect();
        assert_eq!(tails(&program(true)), expected);
        assert!(tails(&program(false)).is_empty());
    }

    /// A given-up buffer is kept only if an output fits it (its dtype, room for its elements,
    /// at most twice as many), and at most one per output: a large argument no output takes
    /// is freed, not held for the executable's lifetime.
    #[test]
    fn the_pool_keeps_only_buffers_an_output_fits() {
        use tessera_ir::{Graph, Op, TensorType, UnaryOp};
        let mut g = Graph::new("p");
        let x = g.add_param(TensorType::new(DType::F32, vec![8]));
        let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let exe = crate::compile(&g).unwrap();
        let pooled = || exe.pool.borrow().len();
        exe.recycle(Data::F32(Vec::with_capacity(1 << 20)));
        exe.recycle(Data::F32(Vec::with_capacity(4)));
        exe.recycle(Data::I32(Vec::with_capacity(8)));
        assert_eq!(pooled(), 0, "too large, too small, another dtype");
        exe.recycle(Data::F32(Vec::with_capacity(16)));
        assert_eq!(pooled(), 1);
        exe.recycle(Data::F32(Vec::with_capacity(8)));
        assert_eq!(pooled(), 1, "one per output");
        // The next run's output is written into the pooled buffer.
        let lit = Literal::new([8], Data::F32(vec![1.0; 8])).unwrap();
        let out = exe.run(&[&lit], &tessera_transport::SingleDevice).unwrap();
        let Data::F32(got) = &out[0].data else {
            panic!("an f32 result")
        };
        assert_eq!(got, &vec![-1.0; 8]);
        assert_eq!(pooled(), 0);
    }

    /// Two independent large products run as a pair, one core each, and give the bits of
    /// the same program with every product on one thread in turn. The first product reads a
    /// temporary that dies with it (`%3`), where a plan unaware of the pair would put the
    /// second's output (a race that would likely change the bits; `plan.rs`'s test shows the
    /// placement). Removing the pairing fails the count.
    #[test]
    fn independent_products_run_as_a_pair_with_one_thread_bits() {
        let g = tessera_ir::parse(
            "func @f(%0: f32[512,1024], %1: f32[1024,256]) {\n  \
               %3 = tanh %0 : f32[512,1024]\n  \
               %4 = dot_general %3, %1 contracting=[1]x[0] : f32[512,256]\n  \
               %5 = mul %4, %4 : f32[512,256]\n  \
               %6 = dot_general %0, %1 contracting=[1]x[0] : f32[512,256]\n  \
               %7 = add %5, %6 : f32[512,256]\n  \
               return %7\n}\n",
        )
        .unwrap();
        let lit = |shape: [usize; 2], seed: usize| {
            let v = (0..shape[0] * shape[1])
                .map(|i| ((i * 7919 + seed) % 1013) as f32 * 0.001 - 0.5)
                .collect();
            Literal::new(shape, Data::F32(v)).unwrap()
        };
        let (x, w) = (lit([512, 1024], 1), lit([1024, 256], 2));
        let inputs = [&x, &w];
        // A pool of two threads whatever the machine (a pair needs two), the executable
        // made and run on it (it is not `Sync`).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (paired, count) = pool.install(|| {
            let exe = crate::compile(&g).unwrap();
            assert!(exe.describe().contains(" with "), "{}", exe.describe());
            let before = PAIRS.with(|p| p.get());
            let out = exe.run(&inputs, &tessera_transport::SingleDevice).unwrap();
            (out, PAIRS.with(|p| p.get()) - before)
        });
        assert_eq!(count, 1, "the pair ran once");
        let one = crate::compile(&g).unwrap().single_threaded();
        let alone = one.run(&inputs, &tessera_transport::SingleDevice).unwrap();
        for (a, b) in paired.iter().zip(&alone) {
            assert!(a.data.bits_eq(&b.data));
        }
    }

    /// A product split by rows over the cores gives the bits of the same product on one
    /// thread (the threaded devices multiply on one thread, devices run together on every
    /// core: both must agree), at the big MLP's shapes (its short contractions, and its long
    /// ones in f64, which the library computes on every host, and in f32 where `sgemm.rs`
    /// leaves them to it) and at row counts that end parts mid-tile.
    #[test]
    fn products_in_row_parts_have_one_thread_bits() {
        for (m, n, k) in [
            (512, 1024, 10),
            (64, 1024, 10),
            (129, 1000, 16),
            (300, 77, 7),
            (130, 33, 3),
            (128, 3, 1),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.001 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104729) % 1009) as f32 * 0.001 - 0.5)
                .collect();
            let run = |par| {
                let mut c = vec![f32::NAN; m * n];
                // SAFETY: dense row-major views of the three vectors, `c` apart from both.
                unsafe {
                    gemm_view(
                        DType::F32,
                        (m, n, k),
                        (a.as_ptr() as *const u8, [k as isize, 1]),
                        (b.as_ptr() as *const u8, [n as isize, 1]),
                        (c.as_mut_ptr() as *mut u8, [n as isize, 1]),
                        par,
                    )
                };
                c
            };
            let parts = row_parts((m, n, k), [k as isize, 1], gemm::Parallelism::Rayon(0));
            assert_eq!(
                parts,
                rayon::current_num_threads().min(m / 64).max(1),
                "{m}x{n}x{k}"
            );
            let one = run(gemm::Parallelism::None);
            let split = run(gemm::Parallelism::Rayon(0));
            assert!(one.iter().all(|v| v.is_finite()), "{m}x{n}x{k}");
            let same = one
                .iter()
                .zip(&split)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{m}x{n}x{k} in {parts} parts");
        }
        // Long contractions, the left operand row-major and transposed (column-major).
        assert!(
            rayon::current_num_threads() < 2
                || row_parts((512, 1024, 784), [1, 512], gemm::Parallelism::Rayon(0)) >= 2
        );
        // At most 64 columns, a part of at most 64 rows would take the library's blocks for
        // small products (a block of `min(k, 512)`, not the even blocks of the whole: 128 x 17
        // x 8000 in two parts changed elements' bits).
        for (m, n, k) in [(512, 16, 4096), (128, 17, 8000), (4096, 64, 4096)] {
            let parts = row_parts((m, n, k), [k as isize, 1], gemm::Parallelism::Rayon(0));
            assert_eq!(parts, 1, "{m}x{n}x{k}");
        }
        assert!(
            rayon::current_num_threads() < 2
                || row_parts((128, 65, 2100), [2100, 1], gemm::Parallelism::Rayon(0)) == 2
        );
        assert_eq!(
            row_parts((256, 256, 255), [255, 1], gemm::Parallelism::Rayon(0)),
            1,
            "short of LONG_PARTS_FROM"
        );
        for (m, n, k) in [
            (512, 1024, 784),
            (784, 1024, 512),
            (257, 300, 700),
            (130, 17, 8000),
            (128, 17, 8000),
            (128, 64, 2900),
            (128, 65, 2100),
        ] {
            long_product_parts::<f32>((m, n, k), DType::F32);
            long_product_parts::<f64>((m, n, k), DType::F64);
        }
    }

    /// Row parts cover the rows once, in order, each at least `m / parts` rows: 64 or more for
    /// every count `row_parts` gives (`min(threads, m / 64)`), at any number of threads.
    #[test]
    fn row_parts_have_at_least_64_rows_each() {
        for m in (64..1200).chain([4097, 4161, 1 << 20, usize::MAX / 4]) {
            for threads in [2, 3, 8, 63, 64, 65, 200] {
                let parts = threads.min(m / 64).max(1);
                let mut next = 0;
                for p in 0..parts {
                    let (m0, m1) = part_rows(m, parts, p);
                    assert_eq!(m0, next, "m={m} parts={parts} part {p}");
                    assert!(m1 - m0 >= 64, "m={m} parts={parts} part {p}: {m0}..{m1}");
                    next = m1;
                }
                assert_eq!(next, m, "m={m} parts={parts}");
            }
        }
    }

    /// `products_in_row_parts_have_one_thread_bits` for one long product of `T` (`dtype`):
    /// split and whole the same bits, and within the error bound of an f64 reference at a few
    /// elements, for a row-major and a column-major left operand.
    fn long_product_parts<T: Copy + Into<f64> + From<f32>>(
        (m, n, k): (usize, usize, usize),
        dtype: DType,
    ) {
        let a: Vec<T> = (0..m * k)
            .map(|i| T::from(((i * 7919) % 1013) as f32 * 0.001 - 0.5))
            .collect();
        let b: Vec<T> = (0..k * n)
            .map(|i| T::from(((i * 104729) % 1009) as f32 * 0.001 - 0.5))
            .collect();
        let size = std::mem::size_of::<T>();
        for ls in [[k as isize, 1], [1, m as isize]] {
            let at = |i: usize, kk: usize| a[(i as isize * ls[0] + kk as isize * ls[1]) as usize];
            let run = |par| {
                let mut c = vec![0u8; m * n * size];
                // SAFETY: dense views of the three vectors (the left one `m x k` in either
                // layout), of `dtype`'s type `T`, `c` apart from both.
                unsafe {
                    gemm_view(
                        dtype,
                        (m, n, k),
                        (a.as_ptr() as *const u8, ls),
                        (b.as_ptr() as *const u8, [n as isize, 1]),
                        (c.as_mut_ptr(), [n as isize, 1]),
                        par,
                    )
                };
                c
            };
            let one = run(gemm::Parallelism::None);
            let split = run(gemm::Parallelism::Rayon(0));
            assert!(one == split, "{m}x{n}x{k} {dtype:?} left strides {ls:?}");
            for (i, j) in [(0, 0), (m - 1, n - 1), (m / 2, n / 3)] {
                let (mut exact, mut bound) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let t = at(i, kk).into() * b[kk * n + j].into();
                    exact += t;
                    bound += t.abs();
                }
                let got = &one[(i * n + j) * size..][..size];
                let got = match size {
                    4 => f32::from_ne_bytes(got.try_into().unwrap()) as f64,
                    _ => f64::from_ne_bytes(got.try_into().unwrap()),
                };
                assert!(
                    (got - exact).abs() <= k as f64 * f32::EPSILON as f64 * bound,
                    "{m}x{n}x{k} ({i}, {j})"
                );
            }
        }
    }
}
