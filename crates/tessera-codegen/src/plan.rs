//! Buffer planning: liveness over the schedule, temporaries packed into one arena.
//!
//! Consumes a `Schedule`; produces each temporary buffer's byte offset in the arena and the
//! arena's size. A temporary lives from the step that writes it (a region step writes several)
//! to its last reader (outputs to the end); a freed range is reused first-fit, a step's (or a
//! pair's) temporaries the largest first. A step's output never shares memory with that step's
//! inputs, since it is placed before they are freed; a pair of steps that run together
//! (`pairs.rs`) is placed as one step. The program's outputs are not in
//! the arena: each run writes them into fresh vectors that become the result literals, so no
//! output is copied.
//!
//! Each buffer is within the size limit of one tensor (`TensorType::check_size`), but many of
//! them together may not be: the arena's end saturates at `usize::MAX` instead of wrapping, so
//! an arena too large for the address space can never be planned as a small one (allocating
//! it then fails instead of kernels writing past it).

use crate::fusion::{BufKind, Schedule, Step};

/// Every offset is a multiple of this, so vector accesses stay within cache lines.
const ALIGN: usize = 64;

#[derive(Clone)]
pub struct Plan {
    /// Byte offset of each buffer in the arena (meaningful for temporaries only).
    pub offsets: Vec<usize>,
    pub arena_bytes: usize,
    /// Whether each step runs together with the next one (`pairs::paired`): placed as one
    /// step here, run at once by `exec.rs` (`runs_together`) and, for shared products of
    /// devices run in turn on one thread, by `together.rs` (`partner_pause`), so placement and
    /// run agree by construction.
    pub pairs: Vec<bool>,
}

impl Plan {
    pub fn new(s: &Schedule) -> Plan {
        let n = s.bufs.len();
        let mut last_use = vec![0usize; n];
        for (i, step) in s.steps.iter().enumerate() {
            for &b in &step.inputs {
                last_use[b] = i;
            }
            for b in step.writes() {
                last_use[b] = last_use[b].max(i);
            }
        }
        for &o in &s.outputs {
            last_use[o] = usize::MAX;
        }
        let mut offsets = vec![0usize; n];
        // Free ranges (offset, size), and the end of the used arena.
        let mut free: Vec<(usize, usize)> = Vec::new();
        let mut end = 0usize;
        // A step and the step it runs together with (`pairs::paired`) are placed as one: both
        // outputs before either's inputs are freed, so neither writes what the other uses.
        let pairs = crate::pairs::paired(s);
        let mut i = 0;
        while i < s.steps.len() {
            let group = i..if pairs[i] { i + 2 } else { i + 1 };
            // The group's temporaries, the largest first: a large one takes the first hole it
            // fits before a smaller one splits that hole (the big MLP's pair of backward
            // products: 12 MiB of arena placed in step order, 10 MiB largest first).
            let mut placing: Vec<(usize, usize)> = s.steps[group.clone()]
                .iter()
                .flat_map(Step::writes)
                .filter(|&b| matches!(s.bufs[b].kind, BufKind::Temp) && !s.outputs.contains(&b))
                .map(|b| (b, s.bufs[b].ty.byte_size().max(1).next_multiple_of(ALIGN)))
                .collect();
            placing.sort_by_key(|&(b, size)| (std::cmp::Reverse(size), b));
            for (b, size) in placing {
                match free.iter().position(|&(_, sz)| sz >= size) {
                    Some(k) => {
                        let (off, sz) = free[k];
                        offsets[b] = off;
                        if sz == size {
                            free.remove(k);
                        } else {
                            free[k] = (off + size, sz - size);
                        }
                    }
                    None => {
                        offsets[b] = end;
                        end = end.saturating_add(size);
                    }
                }
            }
            let mut dead: Vec<usize> = Vec::new();
            for step in &s.steps[group.clone()] {
                dead.extend(&step.inputs);
                dead.extend(step.writes());
            }
            dead.sort_unstable();
            dead.dedup();
            for d in dead {
                if group.contains(&last_use[d])
                    && matches!(s.bufs[d].kind, BufKind::Temp)
                    && !s.outputs.contains(&d)
                {
                    let size = s.bufs[d].ty.byte_size().max(1).next_multiple_of(ALIGN);
                    free.push((offsets[d], size));
                }
            }
            free.sort_unstable();
            // Merge neighbours so large buffers can reuse the space of several small ones.
            let mut merged: Vec<(usize, usize)> = Vec::new();
            for (off, sz) in free.drain(..) {
                match merged.last_mut() {
                    Some((o, s2)) if o.saturating_add(*s2) == off => *s2 = s2.saturating_add(sz),
                    _ => merged.push((off, sz)),
                }
            }
            free = merged;
            i = group.end;
        }
        Plan {
            offsets,
            arena_bytes: end,
            pairs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::{Buf, Step, StepKind};
    use tessera_ir::{CollectiveOp, DType, Op, ReduceKind, TensorType};

    /// A 512 x 512 x 512 product of `inputs` into `output`: large enough to pair (`pairs.rs`).
    fn gemm(inputs: Vec<usize>, output: usize) -> Step {
        Step {
            kind: StepKind::Gemm(crate::fusion::GemmSpec {
                dtype: DType::F32,
                batch: Vec::new(),
                m: 512,
                n: 512,
                k: 512,
                lhs: [512, 1],
                rhs: [512, 1],
                out: [512, 1],
            }),
            inputs,
            output,
        }
    }

    /// A pair of products that run together (`pairs.rs`) is placed as one step: the second's
    /// output does not take the space of the first's operand, freed by the pair, which the
    /// first still reads while the second writes.
    #[test]
    fn a_pairs_outputs_do_not_reuse_its_operands() {
        let small = TensorType::new(DType::F32, vec![16]);
        let buf = |kind| Buf {
            ty: small.clone(),
            kind,
        };
        // 0: t2 <- in0 x in1; 1: t3 <- t2 x in1 (last read of t2) with 2: t4 <- in0 x in1;
        // 3: t5 <- t3 x t4.
        let s = Schedule {
            bufs: vec![
                buf(BufKind::Input(0)),
                buf(BufKind::Input(1)),
                buf(BufKind::Temp),
                buf(BufKind::Temp),
                buf(BufKind::Temp),
                buf(BufKind::Temp),
            ],
            steps: vec![
                gemm(vec![0, 1], 2),
                gemm(vec![2, 1], 3),
                gemm(vec![0, 1], 4),
                gemm(vec![3, 4], 5),
            ],
            outputs: vec![5],
        };
        let plan = Plan::new(&s);
        assert_eq!(plan.pairs, [false, true, false, false]);
        let o = &plan.offsets;
        assert!(o[2] != o[3] && o[2] != o[4] && o[3] != o[4], "{o:?}");
    }

    /// A group's temporaries are placed the largest first: the pair's larger output takes the
    /// hole its operands' producer left, where in step order the smaller one would split it
    /// and the larger go to the arena's end.
    #[test]
    fn a_groups_largest_temporary_is_placed_first() {
        let ty = |n: usize| TensorType::new(DType::F32, vec![n]);
        // Units of 64 bytes: 0: a (2) <- in0 x in1; 1: b (1) <- a x in1 (last read of a: a
        // hole of 2 at 0); 2: c (1) <- b x in1 with 3: d (2) <- in0 x in1; 4: out <- c x d.
        let buf = |n, kind| Buf { ty: ty(n), kind };
        let s = Schedule {
            bufs: vec![
                buf(16, BufKind::Input(0)),
                buf(16, BufKind::Input(1)),
                buf(32, BufKind::Temp),
                buf(16, BufKind::Temp),
                buf(16, BufKind::Temp),
                buf(32, BufKind::Temp),
                buf(16, BufKind::Temp),
            ],
            steps: vec![
                gemm(vec![0, 1], 2),
                gemm(vec![2, 1], 3),
                gemm(vec![3, 1], 4),
                gemm(vec![0, 1], 5),
                gemm(vec![4, 5], 6),
            ],
            outputs: vec![6],
        };
        let plan = Plan::new(&s);
        assert_eq!(plan.pairs, [false, false, true, false, false]);
        assert_eq!((plan.offsets[5], plan.offsets[4]), (0, 3 * 64));
        assert_eq!(plan.arena_bytes, 4 * 64);
    }

    /// Two live temporaries of almost `isize::MAX` bytes each: their sum overflows `usize`.
    /// The plan must not wrap the arena's end around to a small size.
    #[test]
    fn an_arena_larger_than_the_address_space_saturates() {
        let huge = TensorType::new(DType::Bool, vec![isize::MAX as usize]);
        let buf = |kind| Buf {
            ty: huge.clone(),
            kind,
        };
        let step = |inputs: Vec<usize>, output| Step {
            kind: StepKind::Collective(Op::Collective(CollectiveOp::AllReduce {
                kind: ReduceKind::Sum,
                axes: vec!["x".into()],
            })),
            inputs,
            output,
        };
        let s = Schedule {
            bufs: vec![
                buf(BufKind::Input(0)),
                buf(BufKind::Temp),
                buf(BufKind::Temp),
                buf(BufKind::Temp),
            ],
            steps: vec![step(vec![0], 1), step(vec![1], 2), step(vec![1, 2], 3)],
            outputs: vec![3],
        };
        let plan = Plan::new(&s);
        let size = huge.byte_size().next_multiple_of(ALIGN);
        assert_eq!(plan.offsets[1], 0);
        assert_eq!(
            plan.offsets[2], size,
            "the two live temporaries must not overlap"
        );
        assert_eq!(plan.arena_bytes, usize::MAX);
    }
}
