//! Several devices' programs on one thread: each device's run pauses at its collectives
//! (`Executable::start`, `advance`), and the thread computes every member's result from the
//! gathered operands before they all go on. With more devices than cores (8 host devices on 2
//! cores), the threaded launch spent most of a small step switching between device threads
//! (`perf`: a quarter of the samples in the scheduler's task switch, a tenth in `sched_yield`);
//! here nothing waits and nothing switches.
//!
//! Results are the threaded run's bits: each collective's result is computed by the functions
//! the shared-memory transport uses (`tessera_transport::values`), over the members' operands
//! in group order.

use tessera_interp::InterpError;
use tessera_ir::{CollectiveOp, Literal, Mesh, ReduceKind};
use tessera_transport::values::{self, data_ptr, literal_from_raw};
use tessera_transport::{Collectives, Group, TransportError};

use crate::Executable;
use crate::exec::Pause;

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
/// collective's group names must be among `positions` (one process holds them all). Each
/// program must `pauses_at_collectives`. On an error or a panic every started run is dropped
/// (`abandon`) before this returns, so the programs hold no pointer into `inputs` and are fit
/// for the next call.
pub fn run_together(
    programs: &mut [&mut Executable],
    inputs: &[Vec<&Literal>],
    positions: &[usize],
) -> Result<Vec<Vec<Option<Literal>>>, Failed> {
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
        return Ok(Vec::new());
    }
    // The device whose program runs, for a panic's report.
    let current = std::cell::Cell::new(0);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_phases(programs, inputs, positions, &current)
    }));
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
    }
    result
}

/// Each device's `advance`, in turn. (Two threads sharing the devices between collectives,
/// with `rayon::join` from this thread or from inside the pool, measured slower on the seed
/// step over 8 devices: 77-104 us against 51-54 us, the workers' wake-ups costing more than a
/// phase's few microseconds of work.)
fn advance_all(
    programs: &mut [&mut Executable],
    positions: &[usize],
    current: &std::cell::Cell<usize>,
) -> Vec<Result<Option<Pause>, InterpError>> {
    programs
        .iter()
        .zip(positions)
        .enumerate()
        .map(|(k, (p, &position))| {
            current.set(k);
            p.advance(&Gathered {
                position,
                operands: &[],
            })
        })
        .collect()
}

fn run_phases(
    programs: &mut [&mut Executable],
    inputs: &[Vec<&Literal>],
    positions: &[usize],
    current: &std::cell::Cell<usize>,
) -> Result<Vec<Vec<Option<Literal>>>, Failed> {
    let fail = |device: usize, error: InterpError| Failed::Error { device, error };
    for (k, p) in programs.iter().enumerate() {
        current.set(k);
        p.start(&inputs[k]).map_err(|e| fail(k, e))?;
    }
    let no_mesh = Mesh::new("", Vec::new());
    let mesh = programs
        .first()
        .and_then(|p| p.mesh())
        .cloned()
        .unwrap_or(no_mesh);
    // Indexed by mesh position.
    let slots = positions.iter().max().map_or(0, |&m| m + 1);
    let mut operands: Vec<Option<Literal>> = Vec::new();
    loop {
        let mut pauses = Vec::with_capacity(programs.len());
        for (k, r) in advance_all(programs, positions, current)
            .into_iter()
            .enumerate()
        {
            pauses.push(r.map_err(|e| fail(k, e))?);
        }
        let Some(first) = pauses[0].clone() else {
            if let Some(k) = pauses.iter().position(Option::is_some) {
                let e = InterpError::Op {
                    op: "run_together".into(),
                    message: "the devices' programs stopped at different steps".into(),
                };
                return Err(fail(k, e));
            }
            break;
        };
        if let Some(k) = pauses
            .iter()
            .position(|q| q.as_ref().is_none_or(|q| q.step != first.step))
        {
            let e = InterpError::Op {
                op: first.op.name().into(),
                message: "the devices' programs paused at different steps".into(),
            };
            return Err(fail(k, e));
        }
        // Every member's operand, by mesh position (`None` where no device runs: a group
        // naming one is an error, never a read).
        operands.clear();
        operands.resize(slots, None);
        for (k, q) in pauses.iter().enumerate() {
            let q = q.as_ref().expect("checked above");
            // SAFETY: the paused run keeps its buffers bound until `finish` or `abandon`, and
            // the operand buffer holds a value of its type (the steps before it ran).
            operands[positions[k]] = Some(unsafe { literal_from_raw(&q.input_type, q.input) });
        }
        // An all-reduce's result is the same for every member of a group: computed once.
        let mut reduced: Vec<(Vec<usize>, Literal)> = Vec::new();
        for (k, q) in pauses.iter().enumerate() {
            let q = q.as_ref().expect("checked above");
            current.set(k);
            let device = Gathered {
                position: positions[k],
                operands: &operands,
            };
            let x = operands[positions[k]].as_ref();
            let shared = match &q.op {
                CollectiveOp::AllReduce { axes, .. } => {
                    Some(Group::of(&mesh, axes, positions[k]).members)
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
                    let r = tessera_transport::run(&device, &q.op, &mesh, x, &q.output_type)
                        .map_err(|e| fail(k, e.into()))?;
                    // Only an all-reduce's is looked up again (`shared`: never empty).
                    reduced.push((shared.unwrap_or_default(), r));
                    &reduced[reduced.len() - 1].1
                }
            };
            // SAFETY: as `write_result` asks: `run` checked the type, the run is paused.
            unsafe { write_result(r, q.output, &q.output_type) };
        }
    }
    programs
        .iter()
        .enumerate()
        .map(|(k, p)| {
            current.set(k);
            p.finish().map_err(|e| fail(k, e))
        })
        .collect()
}
