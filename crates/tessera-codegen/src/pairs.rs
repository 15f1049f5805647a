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
//! measured; on more cores one core a side would leave the others idle). A pair never
//! includes a product whose result feeds a collective; a product offered to the other devices
//! (`exec.rs`'s `meets_others`, decided at run time) runs alone.
//!
//! Why: the library's split of one product over two cores synchronizes the cores at every
//! block, and a product on one core runs closer to the core's peak (the Xeon of
//! docs/PERFORMANCE.md: a 512 x 1024 x 1024 product 155-160 GFLOP/s on one core, 298-305 on
//! two). Each element of a product is the same sum in the same order on one thread or on
//! several (the library splits by result blocks, never by the contraction), so the bits do
//! not change (`tests`).

use crate::fusion::{Schedule, Step, StepKind};

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

/// Whether two products are close enough in size that neither core waits long for the other
/// (the smaller at least three quarters of the larger).
fn balanced(a: usize, b: usize) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    lo >= hi / 4 * 3
}

/// For each buffer, whether a collective reads it. A product whose result feeds a collective
/// stays where it is (an all-reduce right after its product is done with it, `exec.rs`'s
/// `reduced_by`), and it may be offered to the other devices, which a pair never is.
fn read_by_collectives(s: &Schedule) -> Vec<bool> {
    let mut read = vec![false; s.bufs.len()];
    for t in &s.steps {
        if matches!(t.kind, StepKind::Collective(_)) {
            for &b in &t.inputs {
                read[b] = true;
            }
        }
    }
    read
}

/// How many steps after a large product its partner is looked for: a bound on the compile's
/// work (linear in the program) and on how much longer the moved product's result lives.
const WINDOW: usize = 16;

/// Moves, for each large product `i` (in order), the first large product of a balanced size
/// among the `WINDOW` steps after it whose inputs no step from `i` on writes (so it could have
/// run before `i`) right after `i`. Steps between keep their order; a moved product is still
/// written before its readers, which all come after it.
pub fn pair_products(s: &mut Schedule) {
    let to_collective = read_by_collectives(s);
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
                && !to_collective[step.output]
            {
                partner = Some(j);
                break;
            }
            written.extend(step.writes());
        }
        match partner {
            Some(j) => {
                s.steps[i + 1..=j].rotate_right(1);
                i += 2;
            }
            None => i += 1,
        }
    }
}

/// For each step, whether it runs together with the next one: both large products of balanced
/// sizes, the second not reading what the first writes, neither feeding a collective; each
/// step in at most one pair (the first of two overlapping candidates wins).
pub fn paired(s: &Schedule) -> Vec<bool> {
    let to_collective = read_by_collectives(s);
    let mut pairs = vec![false; s.steps.len()];
    let mut i = 0;
    while i + 1 < s.steps.len() {
        let (first, second) = (&s.steps[i], &s.steps[i + 1]);
        let together = match (large(first), large(second)) {
            (Some(a), Some(b)) => {
                balanced(a, b)
                    && !second.inputs.contains(&first.output)
                    && !to_collective[first.output]
                    && !to_collective[second.output]
            }
            _ => false,
        };
        pairs[i] = together;
        i += if together { 2 } else { 1 };
    }
    pairs
}
