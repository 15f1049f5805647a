//! Independent large products side by side: two GEMMs of similar size that do not depend on
//! each other run at once, one core each, instead of one after the other on both cores (as
//! XLA:CPU's runtime runs independent thunks concurrently).
//!
//! Consumes a `Schedule` (`fusion::fuse`); `pair_products` moves, for a large product, the
//! next large product that needs nothing written since right after it, and `paired` names the
//! steps that run together with the step after them. `plan.rs` allocates a pair's outputs
//! before freeing either step's inputs, so the two never write memory the other reads or
//! writes; `exec.rs` runs a pair with `rayon::join` when both products would have used every
//! core (a run with the machine to itself) and the pool has exactly two threads (what was
//! measured; on more cores one core a side would leave the others idle). A product whose
//! result feeds a collective is paired only as the second of a pair, and only when that
//! collective is a sum all-reduce right after it and its only reader (`exec.rs`'s
//! `reduced_by`, the weight gradient of a data-parallel step): the all-reduce moves up with
//! it. A product offered to the other devices (`exec.rs`'s `meets_others`, decided at run
//! time) runs alone in a threaded run; devices run in turn on one thread (`together.rs`)
//! multiply a pair of offered products at once, each stacked product on one core.
//!
//! Why: the library's split of one product over two cores synchronizes the cores at every
//! block, and a product on one core runs closer to the core's peak (the Xeon of
//! docs/PERFORMANCE.md: a 512 x 1024 x 1024 product 155-160 GFLOP/s on one core, 298-305 on
//! two). Each element of a product is the same sum in the same order on one thread or on
//! several (the library splits by result blocks, never by the contraction), so the bits do
//! not change (`tests`).

use crate::fusion::{Schedule, Step, StepKind};
use tessera_ir::{CollectiveOp, Op, ReduceKind};

/// The smallest product (`m n k`, batches included) that is paired: about 0.9 ms of one core
/// at the library's rate (155 GFLOP/s on the Xeon), so the join's few microseconds are
/// nothing beside it.
pub const PAIR_FROM: usize = 1 << 26;

/// The multiply-adds of a GEMM step large enough to pair, or `None`.
fn large(step: &Step) -> Option<usize> {
    let StepKind::Gemm(g) = &step.kind else {
        return None;
    };
    let batch = g
        .batch
        .iter()
        .fold(1usize, |a, (e, _)| a.saturating_mul(*e));
    let size = batch
        .saturating_mul(g.m)
        .saturating_mul(g.n)
        .saturating_mul(g.k);
    (size >= PAIR_FROM).then_some(size)
}

/// Whether `step` is a product large enough to pair (`hoist.rs` leaves such products where
/// they are).
pub(crate) fn is_large(step: &Step) -> bool {
    large(step).is_some()
}

/// Whether two products are close enough in size that neither core waits long for the other
/// (the smaller at least three quarters of the larger).
fn balanced(a: usize, b: usize) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    lo >= hi / 4 * 3
}

/// For each buffer, how many steps read it, and whether a collective is among them.
fn readers(s: &Schedule) -> (Vec<usize>, Vec<bool>) {
    let mut count = vec![0usize; s.bufs.len()];
    let mut collective = vec![false; s.bufs.len()];
    for t in &s.steps {
        for &b in &t.inputs {
            count[b] += 1;
            collective[b] |= matches!(t.kind, StepKind::Collective(_));
        }
    }
    (count, collective)
}

/// Whether step `j + 1` is a sum all-reduce of step `j`'s result, its only reader (the product
/// and its all-reduce that `exec.rs`'s `reduced_by` fuses): the two move as one.
fn reduced_after(s: &Schedule, j: usize, count: &[usize]) -> bool {
    let out = s.steps[j].output;
    s.steps.get(j + 1).is_some_and(|next| {
        matches!(
            next.kind,
            StepKind::Collective(Op::Collective(CollectiveOp::AllReduce {
                kind: ReduceKind::Sum,
                ..
            }))
        ) && next.inputs == [out]
            && count[out] == 1
            && !s.outputs.contains(&out)
    })
}

/// How many steps after a large product its partner is looked for: a bound on the compile's
/// work (linear in the program) and on how much longer the moved product's result lives.
const WINDOW: usize = 16;

/// Moves, for each large product `i` (in order) that feeds no collective, the first large
/// product of a balanced size among the `WINDOW` steps after it whose inputs no step from `i`
/// on writes (so it could have run before `i`) right after `i`: one that feeds no collective,
/// or one whose result only its sum all-reduce right after it reads (`reduced_after`), which
/// moves up with it; a product feeding any other collective is passed over. Steps between
/// keep their order; a moved product (and its all-reduce) is still written before its readers,
/// which all come after it.
pub fn pair_products(s: &mut Schedule) {
    let (count, to_collective) = readers(s);
    let mut written = Vec::new();
    let mut i = 0;
    while i + 1 < s.steps.len() {
        let Some(a) = large(&s.steps[i]).filter(|_| !to_collective[s.steps[i].output]) else {
            i += 1;
            continue;
        };
        written.clear();
        let mut partner = None;
        for j in i..s.steps.len().min(i + 1 + WINDOW) {
            let step = &s.steps[j];
            if j > i
                && large(step).is_some_and(|b| balanced(a, b))
                && !step.inputs.iter().any(|b| written.contains(b))
            {
                // A partner feeding a collective moves up with its all-reduce, or not at all.
                if !to_collective[step.output] {
                    partner = Some((j, 1));
                    break;
                }
                if reduced_after(s, j, &count) {
                    partner = Some((j, 2));
                    break;
                }
            }
            written.extend(step.writes());
        }
        match partner {
            Some((j, moved)) => {
                s.steps[i + 1..j + moved].rotate_right(moved);
                i += 1 + moved;
            }
            None => i += 1,
        }
    }
}

/// For each step, whether it runs together with the next one: both large products of balanced
/// sizes, the second not reading what the first writes, the first feeding no collective and
/// the second none but its own all-reduce right after it (`reduced_after`); each step in at
/// most one pair (the first of two overlapping candidates wins).
pub fn paired(s: &Schedule) -> Vec<bool> {
    let (count, to_collective) = readers(s);
    let mut pairs = vec![false; s.steps.len()];
    let mut i = 0;
    while i + 1 < s.steps.len() {
        let (first, second) = (&s.steps[i], &s.steps[i + 1]);
        let together = match (large(first), large(second)) {
            (Some(a), Some(b)) => {
                balanced(a, b)
                    && !second.inputs.contains(&first.output)
                    && !to_collective[first.output]
                    && (!to_collective[second.output] || reduced_after(s, i + 1, &count))
            }
            _ => false,
        };
        pairs[i] = together;
        i += if together { 2 } else { 1 };
    }
    pairs
}
