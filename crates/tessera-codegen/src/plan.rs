//! Buffer planning: liveness over the schedule, temporaries packed into one arena.
//!
//! Consumes a `Schedule`; produces each temporary buffer's byte offset in the arena and the
//! arena's size. A temporary lives from the step that writes it (a region step writes several) to its last reader (outputs to
//! the end); a freed range is reused first-fit. A step's output never shares memory with that
//! step's inputs, since it is placed before they are freed. The program's outputs are not in
//! the arena: each run writes them into fresh vectors that become the result literals, so no
//! output is copied.
//!
//! Each buffer is within the size limit of one tensor (`TensorType::check_size`), but many of
//! them together may not be: the arena's end saturates at `usize::MAX` instead of wrapping, so
//! an arena too large for the address space can never be planned as a small one (allocating
//! it then fails instead of kernels writing past it).

use crate::fusion::{BufKind, Schedule};

/// Every offset is a multiple of this, so vector accesses stay within cache lines.
const ALIGN: usize = 64;

#[derive(Clone)]
pub struct Plan {
    /// Byte offset of each buffer in the arena (meaningful for temporaries only).
    pub offsets: Vec<usize>,
    pub arena_bytes: usize,
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
        for (i, step) in s.steps.iter().enumerate() {
            let writes = step.writes();
            for &b in &writes {
                if !matches!(s.bufs[b].kind, BufKind::Temp) || s.outputs.contains(&b) {
                    continue;
                }
                let size = s.bufs[b].ty.byte_size().max(1).next_multiple_of(ALIGN);
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
            let mut dead: Vec<usize> = step.inputs.clone();
            dead.extend(writes);
            dead.sort_unstable();
            dead.dedup();
            for d in dead {
                if last_use[d] == i
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
        }
        Plan {
            offsets,
            arena_bytes: end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::{Buf, Step, StepKind};
    use tessera_ir::{CollectiveOp, DType, Op, ReduceKind, TensorType};

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
