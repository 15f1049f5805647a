//! Small results next to their operands: a step whose results are small (a bias gradient's
//! column sums, a thin product's 10 columns) or are all program outputs (a parameter update)
//! moves up to just after the last step that writes one of its operands. Its operands are then
//! read while the step that wrote them has them in cache, and a large temporary it is the last
//! reader of (a weight gradient, read only by its update) is freed at once, so later steps
//! reuse its memory: the big MLP's arena goes from 16 to 12 MiB, which the first run faults
//! in page by page.
//!
//! Consumes a `Schedule` after `pairs.rs`; `plan.rs` places the buffers in the new order.
//! A moved step still comes after every step that writes what it reads and before every step
//! that reads what it writes (each buffer has one writer, and its readers all come after the
//! writer in the schedule), so every step computes the same values, bit for bit; only the
//! arena's layout and the order of independent steps change.
//!
//! What stays where it is: collectives and region steps (nothing moves across them either:
//! the devices meet there), large products (`pairs::PAIR_FROM`: moving one could make or break
//! a pair) and products that may meet the other devices (a right operand that is a program
//! input, or a result a collective reads: `exec.rs`'s `meets_others`). A step never lands
//! inside a pair that runs together (`pairs::paired`), and looks back at most `WINDOW` steps,
//! so the pass is linear in the schedule.

use crate::fusion::{BufKind, Schedule, Step, StepKind};

/// A result of at most this many bytes counts as small: moving its step up keeps it alive
/// longer, at most this much a step.
const SMALL: usize = 64 << 10;

/// How many steps back a step may move: a bound on the pass's work.
const WINDOW: usize = 32;

/// Moves every movable step (small or output-only results) up to just after the last step,
/// among the `WINDOW` before it, that writes one of its operands, behind the movable steps
/// already there; steps keep their relative order otherwise.
pub fn hoist_small_results(s: &mut Schedule) {
    let pairs = crate::pairs::paired(s);
    let mut is_output = vec![false; s.bufs.len()];
    for &o in &s.outputs {
        is_output[o] = true;
    }
    let mut read_by_collective = vec![false; s.bufs.len()];
    for t in &s.steps {
        if matches!(t.kind, StepKind::Collective(_)) {
            for &b in &t.inputs {
                read_by_collective[b] = true;
            }
        }
    }
    let steps = std::mem::take(&mut s.steps);
    // The new order; for each of its steps, whether it runs together with the next, and
    // whether it may move (movable steps keep their order among themselves).
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let mut marks: Vec<Marks> = Vec::with_capacity(steps.len());
    for (i, step) in steps.into_iter().enumerate() {
        let in_pair = pairs[i] || (i > 0 && pairs[i - 1]);
        let movable = !in_pair && movable(s, &step, &is_output, &read_by_collective);
        let at = if movable {
            place(&out, &marks, &step)
        } else {
            out.len()
        };
        out.insert(at, step);
        let together = pairs[i];
        marks.insert(at, Marks { together, movable });
    }
    s.steps = out;
}

/// What `place` needs of a step already placed.
#[derive(Clone, Copy)]
struct Marks {
    /// It runs together with the next step (`pairs::paired`).
    together: bool,
    /// It was movable: a later step moved up to the same place goes after it, so movable
    /// steps keep the program's order among themselves.
    movable: bool,
}

/// Where `step` goes in `out` (the steps placed so far): just after the last step that writes
/// one of its operands or may not be crossed, at most `WINDOW` back, then after the movable
/// steps already there (program order among them), never between the two steps of a pair.
fn place(out: &[Step], marks: &[Marks], step: &Step) -> usize {
    let floor = out.len().saturating_sub(WINDOW);
    let mut at = out.len();
    while at > floor {
        // A step that may be crossed writes only its `output` (region steps write more).
        let before = &out[at - 1];
        if crossing_forbidden(before) || step.inputs.contains(&before.output) {
            break;
        }
        at -= 1;
    }
    // None of these writes an operand of `step`: the scan passed them.
    while at < out.len() && marks[at].movable {
        at += 1;
    }
    // Not between a pair's two steps: after the second instead.
    while at > 0 && at < out.len() && marks[at - 1].together {
        at += 1;
    }
    at
}

/// Whether no step moves across `step`: where the devices meet.
fn crossing_forbidden(step: &Step) -> bool {
    match step.kind {
        StepKind::Collective(_) | StepKind::Region(_) => true,
        StepKind::Kernel(_) | StepKind::Gemm(_) | StepKind::Window(_) | StepKind::Native(_) => {
            false
        }
    }
}

/// Whether `step` may move up: results small or all program outputs, and not a step that
/// stays (see the module doc).
fn movable(s: &Schedule, step: &Step, is_output: &[bool], read_by_collective: &[bool]) -> bool {
    let stays = match &step.kind {
        StepKind::Collective(_) | StepKind::Region(_) => true,
        StepKind::Gemm(_) => {
            crate::pairs::is_large(step)
                || step
                    .inputs
                    .get(1)
                    .is_some_and(|&r| matches!(s.bufs[r].kind, BufKind::Input(_)))
                || read_by_collective[step.output]
        }
        StepKind::Kernel(_) | StepKind::Window(_) | StepKind::Native(_) => false,
    };
    !stays
        && step
            .writes()
            .iter()
            .all(|&b| is_output[b] || small_buf(s, b))
}

/// Whether buffer `b` is small (`SMALL`).
fn small_buf(s: &Schedule, b: usize) -> bool {
    s.bufs[b].ty.byte_size() <= SMALL
}
