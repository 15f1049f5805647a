//! Several devices' programs on one thread: each device's run pauses at its collectives
//! (`Executable::start`, `advance`), and the thread computes every member's result from the
//! gathered operands before they all go on. With more devices than cores (8 host devices on 2
//! cores), the threaded launch spent most of a small step switching between device threads
//! (`perf`: a quarter of the samples in the scheduler's task switch, a tenth in `sched_yield`);
//! here nothing waits and nothing switches.
//!
//! The runs also pause at the GEMMs the threaded launch offers to the transport's shared
//! products (a replicated weight's product, a weight gradient with its all-reduce): the
//! thread stacks every member's part as the transport does (`tessera_transport::stacked`),
//! multiplies once on every core, and hands each member its result; the two products of a
//! pair (`pairs.rs`: a layer's `g @ W^T` and its weight gradient with the all-reduce), each
//! one group's stacked product, are multiplied at once, one core each, on a pool of two
//! threads (`product_pair`). Between meetings a run has the machine
//! to itself, so its own large GEMMs and kernels use every core too.
//!
//! Results are the threaded run's bits: each collective's result is computed by the functions
//! the shared-memory transport uses (`tessera_transport::values`), over the members' operands
//! in group order, and each shared product by the same stacking and the same multiply.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_interp::InterpError;

use tessera_ir::{CollectiveOp, Literal, Mesh, ReduceKind, TensorType};
use tessera_transport::rendezvous::uninit_words;
use tessera_transport::values::{self, data_ptr, literal_from_raw};
use tessera_transport::{Collectives, Group, TransportError};

use crate::Executable;
use crate::exec::{GroupPlace, Meeting, Pause};

/// One device's view of a collective whose members' operands were all gathered: `operands`
/// is indexed by mesh position (empty while the devices run their steps, when only
/// `axis_index` can be asked).
struct Gathered<'a> {
    position: usize,
    operands: &'a [Option<Literal>],
}

impl Gathered<'_> {
    /// The members' operands in group order.
    fn members(&self, op: &'static str, group: &Group) -> Result<Vec<&Literal>, TransportError> {
        group
            .members
            .iter()
            .map(|&p| {
                self.operands
                    .get(p)
                    .and_then(Option::as_ref)
                    .ok_or_else(|| TransportError::Invalid {
                        op,
                        message: format!("no operand of mesh position {p} was gathered"),
                    })
            })
            .collect()
    }
}

impl Collectives for Gathered<'_> {
    fn position(&self) -> usize {
        self.position
    }

    fn all_reduce(
        &self,
        group: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        if group.len() == 1 {
            return Ok(x.clone());
        }
        let members = self.members("all_reduce", group)?;
        Ok(Literal {
            ty: x.ty.clone(),
            data: values::reduce_widened(kind, &members, 0..x.data.len())?,
        })
    }

    fn all_gather(
        &self,
        group: &Group,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        if group.len() == 1 {
            return values::concat("all_gather", &[x], dim);
        }
        values::concat("all_gather", &self.members("all_gather", group)?, dim)
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let members = if group.len() == 1 {
            vec![x]
        } else {
            self.members("reduce_scatter", group)?
        };
        let sum = values::reduce(kind, &members)?;
        values::chunk("reduce_scatter", &sum, dim, group.me, group.len())
    }

    fn all_to_all(
        &self,
        group: &Group,
        split_dim: usize,
        concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let members = if group.len() == 1 {
            vec![x]
        } else {
            self.members("all_to_all", group)?
        };
        values::all_to_all(&members, split_dim, concat_dim, group.me)
    }

    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        let members = if group.len() == 1 {
            vec![x]
        } else {
            self.members("collective_permute", group)?
        };
        Ok(values::permute(&members, pairs, group.me))
    }
}

/// Writes `r` into a paused run's output buffer.
///
/// # Safety
/// `r` must have type `ty` (`tessera_transport::run` checks it returns the output's type) and
/// `out` must be the output buffer of a run paused at that collective (bound until `finish` or
/// `abandon`, room for `ty`). `r` is its own allocation (the operands were copied into
/// `operands`), so an output sharing its operand's buffer is fine.
unsafe fn write_result(r: &Literal, out: *mut u8, ty: &tessera_ir::TensorType) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(data_ptr(&r.data), out, ty.byte_size()) };
}

/// A panic's message (its `String` or `&str` payload), for a device failure's report.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Why a run together failed, and on which device (its index in `programs`).
#[derive(Debug)]
pub enum Failed {
    /// The device's program returned an error.
    Error { device: usize, error: InterpError },
    /// The device's program panicked (the message, when the panic carried one).
    Panicked { device: usize, message: String },
}

/// Runs `programs[k]` (the same program compiled for every device: forks of one executable)
/// on `inputs[k]` at mesh position `positions[k]` of the programs' mesh, and returns each
/// device's outputs as `run_partial` does, all on the calling thread. Every mesh position a
/// collective's or a shared product's group names must be among `positions` (one process
/// holds them all; a shared product's group stacking by rows is the whole mesh). Each
/// program must `pauses_at_collectives`. On an error or a panic every started run is dropped
/// (`abandon`) before this returns, so the programs hold no pointer into `inputs` and are fit
/// for the next call.
pub fn run_together(
    programs: &mut [&mut Executable],
    inputs: &[Vec<&Literal>],
    positions: &[usize],
) -> Result<Vec<Vec<Option<Literal>>>, Failed> {
    let mut out = Vec::new();
    run_together_in(
        programs,
        inputs,
        positions,
        &mut Together::default(),
        &mut out,
    )?;
    Ok(out)
}

/// What `run_together_in` keeps from one call to the next, so devices run in turn allocate
/// nothing of their own in steady state (the seed step over 8 devices allocated 115 times a
/// step, docs/PERFORMANCE.md, twenty-third pass): the mesh, the pauses of a phase, the
/// gathered operands, an in-place all-reduce's groups and addresses.
#[derive(Default)]
pub struct Together {
    mesh: Option<Mesh>,
    pauses: Vec<Option<Pause>>,
    paused: Vec<Pause>,
    operands: Vec<Option<Literal>>,
    reduce: InPlace,
}

/// `all_reduce_in_place`'s vectors.
#[derive(Default)]
struct InPlace {
    /// Each device's operand and result buffer.
    bufs: Vec<(*const u8, *mut u8)>,
    /// Whether a device's group is known.
    covered: Vec<bool>,
    /// The groups' devices, one group after another, and where each group ends.
    members: Vec<usize>,
    ends: Vec<usize>,
    /// One group's mesh positions (`Group::members_into`), and its scratch.
    group: Vec<usize>,
    coords: Vec<usize>,
    /// One group's operands.
    srcs: Vec<*const u8>,
}

impl Together {
    /// Empties every vector that holds an address or a buffer of the last run (their capacity
    /// kept).
    fn clear(&mut self) {
        self.pauses.clear();
        self.paused.clear();
        self.operands.clear();
        let r = &mut self.reduce;
        r.bufs.clear();
        r.srcs.clear();
    }
}

// SAFETY: the addresses `Together` holds (in the pauses and `InPlace`) point into the buffers
// of the runs of one `run_together_in` call, and every one is emptied before that call returns
// (`Together::clear`, on every path: the call's work runs inside `catch_unwind`): between calls
// the vectors hold plain capacity, which any thread may free or refill.
unsafe impl Send for Together {}

/// [`run_together`] on kept vectors: each device's outputs in `out[k]` (`out` resized to the
/// devices, each list emptied first, their capacity kept), the phases' vectors in `kept`.
pub fn run_together_in<L: std::ops::Deref<Target = Literal>>(
    programs: &mut [&mut Executable],
    inputs: &[Vec<L>],
    positions: &[usize],
    kept: &mut Together,
    out: &mut Vec<Vec<Option<Literal>>>,
) -> Result<(), Failed> {
    out.truncate(programs.len());
    out.resize_with(programs.len(), Vec::new);
    out.iter_mut().for_each(Vec::clear);
    if programs.len() != inputs.len() || programs.len() != positions.len() {
        return Err(Failed::Error {
            device: 0,
            error: InterpError::Op {
                op: "run_together".into(),
                message: format!(
                    "{} programs, {} input lists and {} positions",
                    programs.len(),
                    inputs.len(),
                    positions.len()
                ),
            },
        });
    }
    if programs.is_empty() {
        return Ok(());
    }
    // The run's splits (its large kernels and products, and each phase's two halves of the
    // devices, `advance_all`) go to the team (`team.rs`) when this thread can lead it: its
    // helper spins between them, where handing a half to a sleeping rayon worker and waiting
    // for it on this thread cost about 96 us a phase (the big MLP over 8 devices, 6 phases a
    // step: docs/PERFORMANCE.md, twenty-eighth pass).
    let _team = crate::team::lead();
    // The device whose program runs, for a panic's report.
    let current = std::cell::Cell::new(0);
    // The results of the run's shared products: the runs read them in place until they
    // finish or are abandoned (`settle_product`), so they are dropped last.
    let mut stacks: Vec<Vec<MaybeUninit<u64>>> = Vec::new();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_phases(
            programs,
            inputs,
            positions,
            &mut stacks,
            &current,
            kept,
            out,
        )
    }));
    kept.clear();
    let result = match run {
        Ok(r) => r,
        Err(payload) => Err(Failed::Panicked {
            device: current.get(),
            message: panic_message(payload.as_ref()),
        }),
    };
    if result.is_err() {
        for p in programs.iter() {
            p.abandon();
        }
        out.iter_mut().for_each(Vec::clear);
    }
    drop(stacks);
    result
}

/// Each device's `advance` up to its next meeting: in turn on this thread, or, when the
/// devices' own work between meetings is large (`PHASES_ON_TWO_THREADS_FROM`), the two halves
/// of the devices on two threads at once (a run only touches its own buffers, its own copies
/// in the group region and the inputs, which both halves only read): this thread and the
/// team's helper when this thread leads the team (`run_together_in`), each run then on its
/// own thread alone (a team job splits nothing: `Executable::kernel_threads_from`); otherwise
/// the two sides of a `rayon::join` (on the pool's threads when this thread is not one of
/// them), each run still splitting its own large kernels and GEMMs over the pool (`alone`),
/// whose work stealing balances the two. A device that fails or panics is named. (Two threads for small programs measured slower on the seed step over 8 devices:
/// 77-104 us against 51-54 us, the workers' wake-ups costing more than a phase's few
/// microseconds of work.)
fn advance_all(
    programs: &mut [&mut Executable],
    positions: &[usize],
    current: &std::cell::Cell<usize>,
    pauses: &mut Vec<Option<Pause>>,
) -> Result<(), Failed> {
    pauses.clear();
    let local = |position| Gathered {
        position,
        operands: &[],
    };
    let work: usize = programs.iter().map(|p| p.kernel_elements()).sum();
    // A phase without kernel work (two meetings back to back, or nothing after the last)
    // runs in turn: a join would only hand over nothing.
    if programs.len() >= 2
        && work >= PHASES_ON_TWO_THREADS_FROM
        && programs.iter().any(|p| p.phase_work() > 0)
    {
        // Each device's panic caught on its own thread, to name it.
        let advance = |k: usize, p: &Executable| {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                p.advance(&local(positions[k]))
            }));
            match run {
                Ok(r) => r.map_err(|error| Failed::Error { device: k, error }),
                Err(payload) => Err(Failed::Panicked {
                    device: k,
                    message: panic_message(payload.as_ref()),
                }),
            }
        };
        let mut results: Vec<Option<Result<Option<Pause>, Failed>>> =
            programs.iter().map(|_| None).collect();
        let mut devices: Vec<(usize, &mut Executable)> =
            programs.iter_mut().map(|p| &mut **p).enumerate().collect();
        // A device with more than half of this phase's work (the first, computing the
        // replicated outputs for all, `dropping_outputs`, in the phase of the big MLP's
        // weight updates) goes first, alone: its large kernels and GEMMs then have both cores
        // (`alone`), where on one side of the join they had one, the other thread busy with
        // the other devices.
        let loads: Vec<usize> = devices.iter().map(|(_, p)| p.phase_work()).collect();
        let (heavy, mid) = phase_plan(&loads);
        if let Some(h) = heavy {
            let (k, p) = devices.remove(h);
            results[k] = Some(advance(k, p));
        }
        let (first, second) = devices.split_at_mut(mid);
        let half = |devices: &mut [(usize, &mut Executable)]| {
            devices
                .iter()
                .map(|(k, p)| (*k, advance(*k, p)))
                .collect::<Vec<_>>()
        };
        let (a, b) = if second.is_empty() {
            // One device left beside the heavy one (two devices): it runs here, outside a job,
            // still splitting its own work over the team.
            (half(first), Vec::new())
        } else if crate::team::leads() {
            // The helper's half, taken by whichever thread runs it (once).
            let second = std::sync::Mutex::new(Some(second));
            TEAM_PHASES.with(|c| c.set(c.get() + 1));
            crate::team::join(
                || half(first),
                || {
                    let taken = second.lock().unwrap_or_else(|e| e.into_inner()).take();
                    taken.map_or_else(Vec::new, &half)
                },
            )
        } else {
            rayon::join(|| half(first), || half(second))
        };
        for (k, r) in a.into_iter().chain(b) {
            results[k] = Some(r);
        }
        TWO_THREAD_PHASES.fetch_add(1, Ordering::Relaxed);
        for r in results {
            pauses.push(r.expect("every device advanced")?);
        }
        return Ok(());
    }
    for (k, (p, &position)) in programs.iter().zip(positions).enumerate() {
        current.set(k);
        let pause = p
            .advance(&local(position))
            .map_err(|error| Failed::Error { device: k, error })?;
        pauses.push(pause);
    }
    Ok(())
}

/// How a phase's devices of these loads (`Executable::phase_work`) advance: the device with
/// more than half the work, if any, first and alone; then the others (that one taken out)
/// split at the returned place into the two threads' runs (`even_split`).
fn phase_plan(loads: &[usize]) -> (Option<usize>, usize) {
    let total = loads.iter().fold(0usize, |a, &l| a.saturating_add(l));
    match (0..loads.len()).find(|&k| loads[k] > total / 2) {
        Some(h) => {
            let mut rest = loads.to_vec();
            rest.remove(h);
            (Some(h), even_split(&rest))
        }
        None => (None, even_split(loads)),
    }
}

/// Where to split devices of these loads into two runs of consecutive devices for the two
/// threads (`advance_all`): the split whose heavier side is lightest, each side keeping at
/// least one device. The first device computes the replicated outputs for all (a program's
/// `dropping_outputs`): with the big MLP's weight updates (784 x 1024 and 1024 x 1024
/// elements) it carries most of the work, and halving by count left it, with three others, on
/// one thread while the other thread idled.
fn even_split(loads: &[usize]) -> usize {
    let sum = |l: &[usize]| l.iter().fold(0usize, |a, &b| a.saturating_add(b));
    let total = sum(loads);
    // The halves by count, unless a split is strictly better.
    let half = loads.len().div_ceil(2);
    let first = sum(&loads[..half.min(loads.len())]);
    let mut best = (first.max(total - first), half);
    let mut before = 0usize;
    for (mid, &load) in loads.iter().enumerate().take(loads.len().saturating_sub(1)) {
        before = before.saturating_add(load);
        let heavier = before.max(total - before);
        if heavier < best.0 {
            best = (heavier, mid + 1);
        }
    }
    best.1
}

/// The elements the devices' kernels write, summed over the devices, from which their runs
/// between meetings go on two threads (`advance_all`): the big MLP over 8 devices (about
/// 2.6 M), not the seed step (about 60 K), whose phases are shorter than a wake-up.
const PHASES_ON_TWO_THREADS_FROM: usize = 1 << 20;

/// How many times devices run together have advanced on two threads (`advance_all`), since
/// the process started: for tests.
pub fn phases_on_two_threads() -> usize {
    TWO_THREAD_PHASES.load(Ordering::Relaxed)
}

static TWO_THREAD_PHASES: AtomicUsize = AtomicUsize::new(0);

/// How many of those phases this thread ran with the team's helper (`advance_all`), for the
/// tests.
pub fn phases_on_the_team() -> usize {
    TEAM_PHASES.with(std::cell::Cell::get)
}

/// How many pairs of stacked products this thread multiplied with the team's helper, one
/// each (`product_pair`), for the tests.
pub fn pairs_on_the_team() -> usize {
    TEAM_PAIRS.with(std::cell::Cell::get)
}

thread_local! {
    static TEAM_PHASES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static TEAM_PAIRS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn run_phases<L: std::ops::Deref<Target = Literal>>(
    programs: &mut [&mut Executable],
    inputs: &[Vec<L>],
    positions: &[usize],
    stacks: &mut Vec<Vec<MaybeUninit<u64>>>,
    current: &std::cell::Cell<usize>,
    kept: &mut Together,
    out: &mut [Vec<Option<Literal>>],
) -> Result<(), Failed> {
    let fail = |device: usize, error: InterpError| Failed::Error { device, error };
    // The programs' mesh (none: a program without collectives), cloned only when it is not
    // the last call's.
    let theirs = programs.first().and_then(|p| p.mesh());
    if kept.mesh.as_ref() != theirs {
        kept.mesh = theirs.cloned();
    }
    let Together {
        mesh,
        pauses,
        paused,
        operands,
        reduce,
    } = kept;
    let no_mesh;
    let mesh = match mesh {
        Some(mesh) => &*mesh,
        None => {
            no_mesh = Mesh::new("", Vec::new());
            &no_mesh
        }
    };
    // Each device at a mesh position of its own (a collective's group is found by position).
    for (k, &p) in positions.iter().enumerate() {
        let off_mesh = !mesh.axes.is_empty() && p >= mesh.device_count();
        if off_mesh || positions[..k].contains(&p) {
            let message = match off_mesh {
                true => format!(
                    "device {k} at mesh position {p}, off a mesh of {}",
                    mesh.device_count()
                ),
                false => format!("two devices at mesh position {p}"),
            };
            let op = "run_together".into();
            return Err(fail(k, InterpError::Op { op, message }));
        }
    }
    // The shared products' operands laid out in one group region kept by the first program,
    // each device's copy of an operand at its mesh position's place, so a product's parts
    // stacked by rows (every device) are the stacked operand already
    // (`tessera_transport::stacked::Stacking::in_place`): when every program is a fork of the
    // first and the devices are the whole mesh, each at a position of its own (checked above).
    let devices = programs.len();
    let grouped =
        devices == mesh.device_count() && programs.iter().all(|p| p.groups_as(&*programs[0]));
    let base = if grouped {
        programs[0].group_region(devices)
    } else {
        None
    };
    for (k, p) in programs.iter().enumerate() {
        current.set(k);
        // The region holds `devices` shares; the positions are distinct and below
        // `devices`, the mesh's device count: each run's index its own.
        let group = base.map(|base| GroupPlace {
            base,
            devices,
            index: positions[k],
        });
        // SAFETY: every program groups as the first (`groups_as`), whose region this is,
        // sized for `devices` runs and not sized again before this call returns, when every
        // run is finished or abandoned (`run_together`); the indices, the devices' mesh
        // positions, are distinct and below `devices`.
        unsafe { p.start(&inputs[k], group) }.map_err(|e| fail(k, e))?;
    }
    loop {
        advance_all(programs, positions, current, pauses)?;
        let Some(first) = pauses[0].as_ref().map(|p| p.step) else {
            if let Some(k) = pauses.iter().position(Option::is_some) {
                let e = InterpError::Op {
                    op: "run_together".into(),
                    message: "the devices' programs stopped at different steps".into(),
                };
                return Err(fail(k, e));
            }
            break;
        };
        paused.clear();
        for (k, q) in pauses.drain(..).enumerate() {
            match q {
                Some(q) if q.step == first => paused.push(q),
                _ => {
                    let e = InterpError::Op {
                        op: "run_together".into(),
                        message: "the devices' programs paused at different steps".into(),
                    };
                    return Err(fail(k, e));
                }
            }
        }
        match paused[0].at {
            Meeting::Collective { .. } => {
                collectives(paused, positions, mesh, operands, reduce, current)?
            }
            Meeting::Product { .. } => {
                // The first of a pair of shared products: every run's pause at the second.
                let partner: Vec<Pause> = programs
                    .iter()
                    .zip(positions)
                    .enumerate()
                    .map(|(k, (p, &position))| {
                        p.partner_pause(position)
                            .map_err(|error| Failed::Error { device: k, error })
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .flatten()
                    .collect();
                let pair = !partner.is_empty()
                    && partner.len() == paused.len()
                    && product_pair(programs, (paused, &partner), positions, stacks, current)?;
                if !pair {
                    products(programs, paused, positions, stacks, current)?
                }
            }
        }
    }
    for (k, (p, out)) in programs.iter().zip(out).enumerate() {
        current.set(k);
        p.finish(out).map_err(|e| fail(k, e))?;
    }
    Ok(())
}

/// A collective's operand, result buffer and types, from a run paused at it.
type AtCollective<'a> = (
    &'a CollectiveOp,
    *const u8,
    &'a TensorType,
    *mut u8,
    &'a TensorType,
);

fn at_collective(k: usize, q: &Pause) -> Result<AtCollective<'_>, Failed> {
    match &q.at {
        Meeting::Collective {
            op,
            input,
            input_type,
            output,
            output_type,
        } => Ok((&**op, *input, input_type, *output, output_type)),
        Meeting::Product { .. } => Err(Failed::Error {
            device: k,
            error: InterpError::Op {
                op: "run_together".into(),
                message: "the devices' programs paused at different kinds of step".into(),
            },
        }),
    }
}

/// Every device's result of the collective they are paused at, written into its run.
fn collectives(
    paused: &[Pause],
    positions: &[usize],
    mesh: &Mesh,
    operands: &mut Vec<Option<Literal>>,
    in_place: &mut InPlace,
    current: &std::cell::Cell<usize>,
) -> Result<(), Failed> {
    let fail = |device: usize, error: InterpError| Failed::Error { device, error };
    if all_reduce_in_place(paused, positions, mesh, in_place)? {
        return Ok(());
    }
    // Every member's operand, by mesh position (`None` where no device runs: a group naming
    // one is an error, never a read).
    let slots = positions.iter().max().map_or(0, |&m| m + 1);
    operands.clear();
    operands.resize(slots, None);
    for (k, q) in paused.iter().enumerate() {
        let (_, input, input_type, _, _) = at_collective(k, q)?;
        // SAFETY: the paused run keeps its buffers bound until `finish` or `abandon`, and the
        // operand buffer holds a value of its type (the steps before it ran).
        operands[positions[k]] = Some(unsafe { literal_from_raw(input_type, input) });
    }
    // An all-reduce's result is the same for every member of a group: computed once.
    let mut reduced: Vec<(Vec<usize>, Literal)> = Vec::new();
    for (k, q) in paused.iter().enumerate() {
        let (op, _, _, output, output_type) = at_collective(k, q)?;
        current.set(k);
        let device = Gathered {
            position: positions[k],
            operands,
        };
        let x = operands[positions[k]].as_ref();
        let shared = match op {
            CollectiveOp::AllReduce { axes, .. } => {
                Some(Group::of(mesh, axes, positions[k]).members)
            }
            CollectiveOp::AllGather { .. }
            | CollectiveOp::ReduceScatter { .. }
            | CollectiveOp::AllToAll { .. }
            | CollectiveOp::CollectivePermute { .. }
            | CollectiveOp::AxisIndex { .. } => None,
        };
        let known = shared
            .as_ref()
            .and_then(|m| reduced.iter().position(|(members, _)| members == m));
        let r = match known {
            Some(i) => &reduced[i].1,
            None => {
                let r = tessera_transport::run(&device, op, mesh, x, output_type)
                    .map_err(|e| fail(k, e.into()))?;
                // Only an all-reduce's is looked up again (`shared`: never empty).
                reduced.push((shared.unwrap_or_default(), r));
                &reduced[reduced.len() - 1].1
            }
        };
        // SAFETY: as `write_result` asks: `run` checked the type, the run is paused.
        unsafe { write_result(r, output, output_type) };
    }
    Ok(())
}

/// An all-reduce the devices are paused at, reduced from their operand buffers straight into
/// their result buffers (`values::reduce_raw`, in member order: the bits of `reduce_widened`,
/// which the threaded transport uses), with no operand copied and no result allocated (the
/// pmap step's gradients). `false`, touching nothing, when it is not that simple (another
/// collective, types that differ, a group naming a position no device runs, a device in no
/// group, bool): the general path then computes it, or names the error.
fn all_reduce_in_place(
    paused: &[Pause],
    positions: &[usize],
    mesh: &Mesh,
    kept: &mut InPlace,
) -> Result<bool, Failed> {
    let Some(Pause {
        at: Meeting::Collective {
            op, input_type: ty, ..
        },
        ..
    }) = paused.first()
    else {
        return Ok(false);
    };
    let CollectiveOp::AllReduce { kind, axes } = &**op else {
        return Ok(false);
    };
    let InPlace {
        bufs,
        covered,
        members,
        ends,
        group,
        coords,
        srcs,
    } = kept;
    // Every device's operand and result buffer, if all are of one type.
    bufs.clear();
    for (k, q) in paused.iter().enumerate() {
        let (op, input, input_type, output, output_type) = at_collective(k, q)?;
        let same = matches!(op, CollectiveOp::AllReduce { kind: k2, axes: a2 } if k2 == kind && a2 == axes);
        if !same || input_type != ty || output_type != ty || ty.dtype == tessera_ir::DType::Bool {
            return Ok(false);
        }
        bufs.push((input, output));
    }
    let device_at = |p: usize| positions.iter().position(|&q| q == p);
    members.clear();
    ends.clear();
    covered.clear();
    covered.resize(paused.len(), false);
    for k in 0..paused.len() {
        if covered[k] {
            continue;
        }
        Group::members_into(mesh, axes, positions[k], coords, group);
        for &p in group.iter() {
            let Some(d) = device_at(p) else {
                return Ok(false);
            };
            covered[d] = true;
            members.push(d);
        }
        ends.push(members.len());
    }
    // Every device in a group (`run_phases` checked each has a position of its own), or its
    // result would never be written.
    if covered.contains(&false) {
        return Ok(false);
    }
    let n = ty.numel();
    let size = ty.byte_size();
    let mut start = 0;
    for &end in ends.iter() {
        let members = &members[start..end];
        start = end;
        if let [d] = members {
            // A group of one: its operand itself, as `Gathered::all_reduce` gives it.
            // SAFETY: as below; `copy` allows the two buffers to be the same.
            unsafe { std::ptr::copy(bufs[*d].0, bufs[*d].1, size) };
            continue;
        }
        srcs.clear();
        srcs.extend(members.iter().map(|&d| bufs[d].0));
        let first = bufs[members[0]].1;
        // SAFETY: every paused run keeps its buffers bound until `finish` or `abandon`; each
        // operand holds `n` elements of `ty.dtype` (the steps before it ran, one type checked
        // above), each result buffer has room for as many, and `reduce_raw` reads every
        // operand's chunk before it writes that chunk of `first` (which may be its own
        // device's operand); the devices' buffers are distinct, so `first` aliases no other
        // member's. Not bool (checked), so it reduces.
        unsafe { values::reduce_raw(*kind, ty.dtype, srcs, first, n) };
        for &d in &members[1..] {
            // SAFETY: `first` holds the group's result (`size` bytes); `d`'s result buffer has
            // room for it and is its own device's (the operand it may share was read above).
            unsafe { std::ptr::copy_nonoverlapping(first, bufs[d].1, size) };
        }
    }
    Ok(true)
}

/// How many shared products devices run on one thread have multiplied once for their group,
/// since the process started: for tests and benchmarks.
pub fn products_together() -> usize {
    PRODUCTS.load(Ordering::Relaxed)
}

static PRODUCTS: AtomicUsize = AtomicUsize::new(0);

/// Stacked operands of at least this many bytes are filled on every core (the big MLP's are
/// 2-4 MB: 170-430 us on one).
const PARALLEL_FILL_FROM: usize = 1 << 18;

/// How many pairs of shared products (`pairs.rs`) devices run on one thread have multiplied
/// at once, one core each, since the process started: for tests.
pub fn product_pairs_together() -> usize {
    PAIRS.load(Ordering::Relaxed)
}

static PAIRS: AtomicUsize = AtomicUsize::new(0);

/// Every group's shared product the devices are paused at, stacked and multiplied once as the
/// threaded transport does (`tessera_transport::stacked`, `exec::multiply_shared`: the same
/// bits), each member handed its result; a group whose parts do not stack (or of one member)
/// has every member multiply its own.
fn products(
    programs: &[&mut Executable],
    paused: &[Pause],
    positions: &[usize],
    stacks: &mut Vec<Vec<MaybeUninit<u64>>>,
    current: &std::cell::Cell<usize>,
) -> Result<(), Failed> {
    // One group at a time: its stacked operands are dropped before the next is filled.
    for group in groups(paused, positions)? {
        let mut group = group.stack(stacks);
        current.set(group.members[0]);
        group.multiply(gemm::Parallelism::Rayon(0));
        group.settle(programs, current)?;
    }
    Ok(())
}

/// The devices paused at the first of a pair of shared products (`pairs.rs`; `partner` holds
/// each run's pause at the second, `Executable::partner_pause`), when each of the two is one
/// group's product whose parts stack and the pool has exactly two threads (what `exec.rs`'s
/// `runs_together` asks of a run's own pair): both stacked, multiplied at once, one core each
/// (`rayon::join`); then the first is settled, every run advanced to the second (no step runs
/// between them) and the second settled. The bits are `products`'s, one product after the
/// other (each the same multiply, on one thread instead of every core). Returns `false`,
/// touching nothing, otherwise: the first is then `products`'s, and the second meets at the
/// next `advance` as any shared product (one stacked product alive at a time).
fn product_pair(
    programs: &[&mut Executable],
    (paused, partner): (&[Pause], &[Pause]),
    positions: &[usize],
    stacks: &mut Vec<Vec<MaybeUninit<u64>>>,
    current: &std::cell::Cell<usize>,
) -> Result<bool, Failed> {
    if rayon::current_num_threads() != 2 {
        return Ok(false);
    }
    let (Ok([a]), Ok([b])) = (
        <[SharedProduct; 1]>::try_from(groups(paused, positions)?),
        <[SharedProduct; 1]>::try_from(groups(partner, positions)?),
    ) else {
        return Ok(false);
    };
    if !a.stacks() || !b.stacks() {
        return Ok(false);
    }
    let (mut a, mut b) = (a.stack(stacks), b.stack(stacks));
    // Each side's panic names a device of its own group.
    let side = |g: &mut SharedProduct| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            g.multiply(gemm::Parallelism::None)
        }))
        .map_err(|payload| Failed::Panicked {
            device: g.members[0],
            message: panic_message(payload.as_ref()),
        })
    };
    let (ra, rb) = if crate::team::leads() {
        TEAM_PAIRS.with(|c| c.set(c.get() + 1));
        // Taken by whichever thread runs the second side (once).
        let second = std::sync::Mutex::new(&mut b);
        crate::team::join(
            || side(&mut a),
            || side(&mut second.lock().unwrap_or_else(|e| e.into_inner())),
        )
    } else {
        rayon::join(|| side(&mut a), || side(&mut b))
    };
    ra?;
    rb?;
    PAIRS.fetch_add(1, Ordering::Relaxed);
    a.settle(programs, current)?;
    let step = partner.first().map(|q| q.step);
    for (k, p) in programs.iter().enumerate() {
        current.set(k);
        let local = Gathered {
            position: positions[k],
            operands: &[],
        };
        let q = p
            .advance(&local)
            .map_err(|error| Failed::Error { device: k, error })?;
        // The second product's pause, as `partner_pause` gave it before the first settled.
        let same = match (&q, &partner[k].at) {
            (
                Some(Pause {
                    step: at,
                    at: Meeting::Product { part, .. },
                }),
                Meeting::Product { part: want, .. },
            ) => Some(*at) == step && part == want,
            _ => false,
        };
        if !same {
            return Err(Failed::Error {
                device: k,
                error: InterpError::Op {
                    op: "dot_general".into(),
                    message: "a run did not pause at the second product of its pair".into(),
                },
            });
        }
    }
    b.settle(programs, current)?;
    Ok(true)
}

/// One group's shared product: its members (device indices, in group order) and their parts,
/// and, when the parts stack, the stacked operands (filled) and result.
struct SharedProduct {
    members: Vec<usize>,
    parts: Vec<tessera_transport::stacked::PartAddr>,
    stacking: tessera_transport::stacked::Stacking,
    /// The stacked left and right operands (empty for one in place), dropped once multiplied,
    /// and the addresses of both and of the result (in `stacks`); `None` when the parts do
    /// not stack or are not stacked yet (`stack`).
    stacked: Option<(Operands, [usize; 3])>,
    /// Whether `multiply` has written the stacked result (`settle` hands it out only then).
    multiplied: bool,
}

/// A stacked product's left and right operands (each empty when it is read in place).
type Operands = [Vec<MaybeUninit<u64>>; 2];

impl SharedProduct {
    /// Whether the parts stack (`stack` will fill them): a group of at least two whose parts
    /// have a stacked layout.
    fn stacks(&self) -> bool {
        self.members.len() >= 2 && self.stacking.layout(&self.parts).is_some()
    }

    /// When the parts stack: the stacked operands filled and the result's buffer kept in
    /// `stacks`.
    fn stack(mut self, stacks: &mut Vec<Vec<MaybeUninit<u64>>>) -> SharedProduct {
        let layout = match self.members.len() >= 2 {
            true => self.stacking.layout(&self.parts),
            false => None,
        };
        let Some(bytes) = layout else {
            return self;
        };
        // The stacked operands, dropped after the product; its result, kept in `stacks`. (An
        // operand in place needs no stack: `layout` gives it no bytes.)
        let [mut lhs, mut rhs, out] = bytes.map(|b| match b {
            0 => Vec::new(),
            _ => uninit_words(b),
        });
        stacks.push(out);
        let out = stacks.last_mut().map_or(0, |o| o.as_mut_ptr() as usize);
        let at = [lhs.as_mut_ptr() as usize, rhs.as_mut_ptr() as usize, out];
        let (stacking, parts) = (self.stacking, &self.parts);
        // SAFETY: the members' views are inside their paused runs' bound buffers, which
        // nothing writes meanwhile (this thread runs them, and waits for the fills); `at`
        // holds buffers of `layout`'s sizes, and each member's blocks are written by its own
        // fill alone, so the fills may run at once.
        let fill = |me: usize| unsafe { stacking.fill(parts, me, at) };
        let members = self.members.len();
        if bytes[0] + bytes[1] >= PARALLEL_FILL_FROM && crate::team::leads() {
            let half = members / 2;
            crate::team::join(
                || (0..half).for_each(fill),
                || (half..members).for_each(fill),
            );
        } else if bytes[0] + bytes[1] >= PARALLEL_FILL_FROM {
            use rayon::prelude::*;
            (0..members).into_par_iter().for_each(fill);
        } else {
            (0..self.members.len()).for_each(fill);
        }
        self.stacked = Some(([lhs, rhs], at));
        self
    }

    /// Multiplies the stacked product on `par` (nothing when the parts do not stack), and
    /// drops the stacked operands.
    fn multiply(&mut self, par: gemm::Parallelism) {
        let Some((operands, at)) = &mut self.stacked else {
            return;
        };
        let call = self.stacking.call(&self.parts, *at);
        // SAFETY: the call's views lie inside the filled stacks, or, for an operand in place
        // (`Stacking::in_place`), inside the one allocation every member's view is in (the
        // group region, where the paused runs keep them), and (`Rows`) the members' shared
        // right operand, a bound input of every paused run; the result is its own stacked
        // buffer, which no other group's product touches.
        unsafe { crate::exec::multiply_shared(self.parts[0].dtype, &call, par) };
        *operands = [Vec::new(), Vec::new()];
        self.multiplied = true;
        PRODUCTS.fetch_add(1, Ordering::Relaxed);
    }

    /// Hands each member its result (`multiply` has run), or, when the parts do not stack,
    /// has each multiply its own.
    fn settle(
        &self,
        programs: &[&mut Executable],
        current: &std::cell::Cell<usize>,
    ) -> Result<(), Failed> {
        assert!(
            self.stacked.is_none() || self.multiplied,
            "a stacked product is settled once multiplied"
        );
        for (me, &d) in self.members.iter().enumerate() {
            current.set(d);
            let block = self
                .stacked
                .as_ref()
                .map(|(_, at)| self.stacking.result(&self.parts, me, *at));
            // SAFETY: paused at this product; a `block` is its result in `stacks`, which
            // `run_together` keeps until every run has finished or is abandoned.
            unsafe { programs[d].settle_product(block) }.map_err(|e| Failed::Error {
                device: d,
                error: e,
            })?;
        }
        Ok(())
    }
}

/// The groups of the shared products `paused` holds (one pause a device), not yet stacked.
fn groups(paused: &[Pause], positions: &[usize]) -> Result<Vec<SharedProduct>, Failed> {
    let fail = |device: usize, message: String| Failed::Error {
        device,
        error: InterpError::Op {
            op: "dot_general".into(),
            message,
        },
    };
    let mut grouped = vec![false; paused.len()];
    let mut groups = Vec::new();
    for k in 0..paused.len() {
        if grouped[k] {
            continue;
        }
        let Meeting::Product {
            stacking, group, ..
        } = &paused[k].at
        else {
            return Err(fail(
                k,
                "the devices paused at different kinds of step".into(),
            ));
        };
        // The members' device indices and parts, in group order.
        let mut members = Vec::with_capacity(group.members.len());
        let mut parts = Vec::with_capacity(group.members.len());
        for &p in &group.members {
            let d = positions
                .iter()
                .position(|&q| q == p)
                .ok_or_else(|| fail(k, format!("mesh position {p} of the group does not run")))?;
            match &paused[d].at {
                Meeting::Product {
                    stacking: s, part, ..
                } if s == stacking && !grouped[d] => parts.push(*part),
                _ => return Err(fail(d, "the group's members paused differently".into())),
            }
            grouped[d] = true;
            members.push(d);
        }
        groups.push(SharedProduct {
            members,
            parts,
            stacking: *stacking,
            stacked: None,
            multiplied: false,
        });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{Data, parse};
    use tessera_transport::SingleDevice;

    /// The two threads' runs of devices split where the heavier side is lightest: a first
    /// device carrying the replicated outputs' work gets a thread to itself.
    #[test]
    fn devices_split_where_the_work_evens_out() {
        assert_eq!(even_split(&[1, 1, 1, 1]), 2);
        assert_eq!(even_split(&[2100, 300, 300, 300, 300, 300, 300, 300]), 1);
        assert_eq!(even_split(&[5, 5, 5, 1, 1, 1, 1, 1]), 2);
        assert_eq!(even_split(&[0, 0, 0]), 2, "no work: the halves by count");
        assert_eq!(even_split(&[7, 9]), 1);
    }

    /// A device with more than half of a phase's work advances first and alone (the first
    /// device's weight updates in the big MLP over 8 devices); the others split evenly.
    #[test]
    fn the_device_with_most_of_a_phase_goes_alone() {
        assert_eq!(
            phase_plan(&[1070, 66, 66, 66, 66, 66, 66, 66]),
            (Some(0), 4)
        );
        assert_eq!(phase_plan(&[66, 66, 1070, 66]), (Some(2), 2));
        assert_eq!(phase_plan(&[5, 5, 5, 5]), (None, 2));
        assert_eq!(phase_plan(&[500, 400, 100]), (None, 1));
        assert_eq!(phase_plan(&[0, 0]), (None, 1));
    }

    /// A paused run's next phase counts its kernels up to its next meeting, and none of the
    /// steps it skips.
    #[test]
    fn a_phase_counts_its_kernels_up_to_the_next_meeting() {
        let g = parse(
            r#"mesh @mesh = <"dp"=2>
func @f(%0: f32[64,256], %1: f32[64]) {
  %2 = exp %0 : f32[64,256]
  %3 = all_reduce %2 sum axes=["dp"] : f32[64,256]
  %4 = neg %3 : f32[64,256]
  %5 = tanh %1 : f32[64]
  return %4, %5
}"#,
        )
        .unwrap();
        let x = Literal::new([64, 256], Data::F32(vec![0.5; 64 * 256])).unwrap();
        let y = Literal::new([64], Data::F32(vec![0.5; 64])).unwrap();
        for (drop, second) in [([false, false], 64 * 256 + 64), ([false, true], 64 * 256)] {
            let exe = crate::compile(&g)
                .unwrap()
                .single_threaded()
                .dropping_outputs(&drop);
            // SAFETY: no group.
            unsafe { exe.start(&[&x, &y], None) }.unwrap();
            assert_eq!(exe.phase_work(), 64 * 256, "{drop:?}: up to the all-reduce");
            let pause = exe.advance(&SingleDevice).unwrap();
            assert!(pause.is_some());
            assert_eq!(exe.phase_work(), second, "{drop:?}: after it");
            exe.abandon();
        }
    }

    /// Two devices, the first computing a large output the second drops: the first goes alone
    /// (`phase_plan`), and the one left runs on this thread outside a team job, free to split
    /// its own work, not as one half of a join with an empty other half; and the phase after
    /// the last meeting, with no kernel work, runs in turn (no join at all).
    #[test]
    fn one_device_beside_the_heavy_one_runs_outside_a_job() {
        let g = parse(
            r#"mesh @mesh = <"dp"=2>
func @f(%0: f32[1024,1024], %1: f32[512,512]) {
  %2 = exp %0 : f32[1024,1024]
  %3 = tanh %1 : f32[512,512]
  %4 = all_reduce %3 sum axes=["dp"] : f32[512,512]
  return %2, %4
}"#,
        )
        .unwrap();
        let x = Literal::new([1024, 1024], Data::F32(vec![0.5; 1024 * 1024])).unwrap();
        let y = Literal::new([512, 512], Data::F32(vec![0.25; 512 * 512])).unwrap();
        let exe = crate::compile(&g).unwrap().single_threaded();
        let mut first = exe.fork();
        let mut second = exe.fork().dropping_outputs(&[true, false]);
        let (phases, on_team) = (phases_on_two_threads(), phases_on_the_team());
        let (_, team) = crate::team::posts_once_the_team_is_free(|| {
            let mut programs = [&mut first, &mut second];
            let out = run_together(&mut programs, &[vec![&x, &y], vec![&x, &y]], &[0, 1]).unwrap();
            let sum = out[1][1].as_ref().unwrap().data.get_f64(0);
            assert_eq!(sum, 2.0 * 0.25f64.tanh() as f32 as f64);
            assert!(out[1][0].is_none());
        });
        assert!(phases_on_two_threads() > phases, "the phase was large");
        assert_eq!(
            phases_on_the_team(),
            on_team,
            "no join with an empty half (team {team})"
        );
    }

    /// A device that skips the steps of outputs another device returns counts only the work
    /// it does.
    #[test]
    fn a_device_dropping_outputs_counts_only_its_own_kernels() {
        let g = parse(
            r#"func @f(%0: f32[64,256]) {
  %1 = exp %0 : f32[64,256]
  %2 = neg %0 : f32[64,256]
  return %1, %2
}"#,
        )
        .unwrap();
        let exe = crate::compile(&g).unwrap();
        assert_eq!(exe.kernel_elements(), 2 * 64 * 256);
        let fork = exe.fork().dropping_outputs(&[true, false]);
        assert_eq!(fork.kernel_elements(), 64 * 256);
    }

    /// A run paused at a shared product goes on only once the product has a result, and only
    /// a run paused at one takes a result.
    #[test]
    fn a_paused_product_must_be_settled_once() {
        let g = parse(
            r#"mesh @mesh = <"dp"=2>
func @f(%0: f32[64,256], %1: f32[256,256]) {
  %2 = dot_general %0, %1 contracting=[1]x[0] : f32[64,256]
  return %2
}"#,
        )
        .unwrap();
        let exe = crate::compile(&g).unwrap().single_threaded();
        let x = Literal::new([64, 256], Data::F32(vec![0.5; 64 * 256])).unwrap();
        let w = Literal::new([256, 256], Data::F32(vec![0.25; 256 * 256])).unwrap();
        // SAFETY: no group.
        unsafe { exe.start(&[&x, &w], None) }.unwrap();
        // SAFETY: no block.
        assert!(
            unsafe { exe.settle_product(None) }.is_err(),
            "not paused yet"
        );
        let pause = exe.advance(&SingleDevice).unwrap().unwrap();
        assert!(matches!(pause.at, Meeting::Product { .. }), "{pause:?}");
        assert!(exe.advance(&SingleDevice).is_err(), "no result yet");
        // SAFETY: paused at the product; no block (it multiplies its own).
        unsafe { exe.settle_product(None) }.unwrap();
        // SAFETY: as above.
        assert!(
            unsafe { exe.settle_product(None) }.is_err(),
            "settled already"
        );
        assert!(exe.advance(&SingleDevice).unwrap().is_none());
        let mut out = Vec::new();
        exe.finish(&mut out).unwrap();
        let out = out[0].as_ref().unwrap();
        assert_eq!(out.data.get_f64(0), 256.0 * 0.125);
    }
}
