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
//! Fences, which stay where they are with nothing moved across them (`fence`): collectives,
//! region steps, and products whose result a collective reads (`exec.rs`'s `reduced_by` fuses
//! such a product with its all-reduce right after it). Products that may be shared with the
//! other devices (`exec.rs`'s `meets_others`) and large ones stay, but other steps may move
//! across them: a local step computes the same before or after the devices meet. Every pair
//! (`pairs::paired`) is two large products, so nothing lands inside one; a step moved out
//! from between two large products could make them a pair, or break another, so when the new
//! order pairs other products the program's order is kept. A step looks back at most
//! `WINDOW` steps, so the pass is linear in the schedule.

use crate::fusion::{BufKind, Schedule, Step, StepKind};

/// A result of at most this many bytes counts as small: moving its step up keeps it alive
/// longer, at most this much a step.
const SMALL: usize = 64 << 10;

/// How many steps back a step may move: a bound on the pass's work.
const WINDOW: usize = 32;

/// Moves every movable step (small or output-only results, at least one operand written by a
/// step) up to just after the last step, among the `WINDOW` before it, that writes one of its
/// operands or may not be crossed (`fence`), behind the movable steps already there; steps
/// keep their relative order otherwise. If the new order would pair other products
/// (`pairs::paired`), the program's order is kept.
pub fn hoist_small_results(s: &mut Schedule) {
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
    let before = crate::pairs::paired(s);
    let steps = std::mem::take(&mut s.steps);
    // The new order, and for each of its steps what `place` needs and where it was.
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let mut marks: Vec<Marks> = Vec::with_capacity(steps.len());
    for (was, step) in steps.into_iter().enumerate() {
        let fence = fence(&step, &read_by_collective);
        let movable = !fence && movable(s, &step, &is_output);
        let at = match movable {
            true => place(&out, &marks, &step),
            false => out.len(),
        };
        out.insert(at, step);
        marks.insert(
            at,
            Marks {
                fence,
                movable,
                together: before[was],
                was,
            },
        );
    }
    s.steps = out;
    // The pairs, as the positions in the program's order of their first steps.
    let firsts = |pairs: Vec<bool>, was: &dyn Fn(usize) -> usize| -> Vec<usize> {
        let mut f: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i]).map(was).collect();
        f.sort_unstable();
        f
    };
    let after = crate::pairs::paired(s);
    if firsts(after, &|i| marks[i].was) != firsts(before, &|i| i) {
        // Back in the program's order (`was` is a permutation of the positions).
        let mut steps: Vec<(usize, Step)> =
            marks.iter().map(|m| m.was).zip(s.steps.drain(..)).collect();
        steps.sort_unstable_by_key(|(was, _)| *was);
        s.steps = steps.into_iter().map(|(_, step)| step).collect();
    }
}

/// What `place` needs of a step already placed, and where it was in the program's order.
#[derive(Clone, Copy)]
struct Marks {
    /// No step moves across it (`fence`).
    fence: bool,
    /// It was movable: a later step moved up to the same place goes after it, so movable
    /// steps keep the program's order among themselves.
    movable: bool,
    /// It runs together with the next step (`pairs::paired` on the program's order).
    together: bool,
    /// Its position in the program's order.
    was: usize,
}

/// Where `step` goes in `out` (the steps placed so far): just after the last step that writes
/// one of its operands or is a fence, at most `WINDOW` back, never between the two steps of a
/// pair, then after the movable steps already there (the program's order among them).
fn place(out: &[Step], marks: &[Marks], step: &Step) -> usize {
    let floor = out.len().saturating_sub(WINDOW);
    let mut at = out.len();
    // A step that is not a fence writes only its `output` (region steps are fences).
    while at > floor && !marks[at - 1].fence && !step.inputs.contains(&out[at - 1].output) {
        at -= 1;
    }
    // Not between a pair's two steps: after the second instead.
    while at > 0 && at < out.len() && marks[at - 1].together {
        at += 1;
    }
    // None of these writes an operand of `step`: the scan passed them.
    while at < out.len() && marks[at].movable {
        at += 1;
    }
    at
}

/// Whether `step` stays where it is and no step moves across it: where the devices meet (a
/// collective, a region step), and a product whose result a collective reads (it and its
/// all-reduce right after it run fused when devices share the product: `exec.rs`'s
/// `reduced_by`).
fn fence(step: &Step, read_by_collective: &[bool]) -> bool {
    match &step.kind {
        StepKind::Collective(_) | StepKind::Region(_) => true,
        StepKind::Gemm(_) => read_by_collective[step.output],
        StepKind::Kernel(_) | StepKind::Window(_) | StepKind::Native(_) => false,
    }
}

/// Whether a step that is not a fence moves up: not a product that may be shared with the
/// other devices (a right operand that is a program input: `exec.rs`'s `meets_others`) or a
/// large one (`pairs::PAIR_FROM`), its results small or all program outputs, and an operand
/// written by a step (one that reads only inputs and constants gains nothing).
fn movable(s: &Schedule, step: &Step, is_output: &[bool]) -> bool {
    let product_stays = matches!(step.kind, StepKind::Gemm(_))
        && (crate::pairs::is_large(step)
            || step
                .inputs
                .get(1)
                .is_some_and(|&r| matches!(s.bufs[r].kind, BufKind::Input(_))));
    !product_stays
        && step
            .inputs
            .iter()
            .any(|&b| matches!(s.bufs[b].kind, BufKind::Temp))
        && step
            .writes()
            .iter()
            .all(|&b| is_output[b] || s.bufs[b].ty.byte_size() <= SMALL)
}
