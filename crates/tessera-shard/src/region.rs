//! Region ops as the sharding passes see them: each operand, result, body parameter and body
//! output of a region belongs to a *slot*, a value that keeps one sharding wherever it appears,
//! in the manner of Shardy's data-flow edges for `while`. A scan's carry is one slot (its
//! initial value, the body's parameter, the body's output and the region's result); a const is
//! another (the operand and the body's parameter); a case's result is the outputs of every
//! branch and the region's result.
//!
//! A slot's sharding is of the value the body sees. A scan's xs and ys (`stacked` slots) have
//! one more dim outside, the scan's leading dim, which stays whole: the outer sharding is the
//! slot's with an unsharded dim in front.
//!
//! Operands and body outputs in no slot (a case's index, a while's predicate) are scalars,
//! whole.

use tessera_ir::{Graph, Mesh, RegionOp, TensorType};

use crate::spec::Spec;

/// One value that keeps one sharding across a region's boundary (see the module doc).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Slot {
    /// The outer value has an extra leading dim (a scan's xs or ys), always whole.
    pub stacked: bool,
    /// The region's operand that holds it.
    pub operand: Option<usize>,
    /// The region's result that holds it.
    pub result: Option<usize>,
    /// The body parameters that hold it: (body, parameter), bodies in `RegionOp::regions` order.
    pub params: Vec<(usize, usize)>,
    /// The body outputs that hold it: (body, output).
    pub outputs: Vec<(usize, usize)>,
}

/// The slots of region `r` applied to `n_operands` operands (layouts in `tessera_ir::region`).
pub(crate) fn slots(r: &RegionOp, n_operands: usize) -> Vec<Slot> {
    let outs = |g: &Graph| g.outputs().len();
    let mut s = Vec::new();
    match r {
        RegionOp::Scan {
            consts,
            carries,
            body,
            ..
        } => {
            for k in 0..*consts {
                s.push(Slot {
                    operand: Some(k),
                    params: vec![(0, k)],
                    ..Slot::default()
                });
            }
            for i in 0..*carries {
                s.push(Slot {
                    operand: Some(consts + i),
                    result: Some(i),
                    params: vec![(0, consts + i)],
                    outputs: vec![(0, i)],
                    ..Slot::default()
                });
            }
            for k in consts + carries..n_operands {
                s.push(Slot {
                    stacked: true,
                    operand: Some(k),
                    params: vec![(0, k)],
                    ..Slot::default()
                });
            }
            for j in *carries..outs(body) {
                s.push(Slot {
                    stacked: true,
                    result: Some(j),
                    outputs: vec![(0, j)],
                    ..Slot::default()
                });
            }
        }
        RegionOp::While { consts, .. } => {
            // Bodies: 0 is `cond` (its one output, the predicate, is in no slot), 1 is `body`.
            for k in 0..*consts {
                s.push(Slot {
                    operand: Some(k),
                    params: vec![(0, k), (1, k)],
                    ..Slot::default()
                });
            }
            for k in *consts..n_operands {
                s.push(Slot {
                    operand: Some(k),
                    result: Some(k - consts),
                    params: vec![(0, k), (1, k)],
                    outputs: vec![(1, k - consts)],
                    ..Slot::default()
                });
            }
        }
        RegionOp::Case { branches } => {
            // Operand 0, the index, is in no slot.
            for k in 1..n_operands {
                s.push(Slot {
                    operand: Some(k),
                    params: (0..branches.len()).map(|b| (b, k - 1)).collect(),
                    ..Slot::default()
                });
            }
            for j in 0..branches.first().map_or(0, outs) {
                s.push(Slot {
                    result: Some(j),
                    outputs: (0..branches.len()).map(|b| (b, j)).collect(),
                    ..Slot::default()
                });
            }
        }
        RegionOp::Checkpoint { body } => {
            for k in 0..n_operands {
                s.push(Slot {
                    operand: Some(k),
                    params: vec![(0, k)],
                    ..Slot::default()
                });
            }
            for j in 0..outs(body) {
                s.push(Slot {
                    result: Some(j),
                    outputs: vec![(0, j)],
                    ..Slot::default()
                });
            }
        }
        RegionOp::CustomVjp { primals, fwd, .. } => {
            // Bodies: 0 is `fwd`, 1 is `bwd` (parameters: the residuals, then one cotangent
            // per primal output; outputs: one cotangent per argument, sharded as it).
            for k in 0..n_operands {
                s.push(Slot {
                    operand: Some(k),
                    params: vec![(0, k)],
                    outputs: vec![(1, k)],
                    ..Slot::default()
                });
            }
            let n = outs(fwd);
            let residuals = n.saturating_sub(*primals);
            for j in 0..n {
                let bwd_param = if j < *primals {
                    residuals + j
                } else {
                    j - primals
                };
                s.push(Slot {
                    result: Some(j),
                    params: vec![(1, bwd_param)],
                    outputs: vec![(0, j)],
                    ..Slot::default()
                });
            }
        }
    }
    s
}

/// The type of a slot's value, as its first body parameter or output has it.
pub(crate) fn slot_type<'g>(bodies: &[&'g Graph], slot: &Slot) -> &'g TensorType {
    match (slot.params.first(), slot.outputs.first()) {
        (Some(&(b, p)), _) => bodies[b].ty(bodies[b].params()[p]),
        (None, Some(&(b, j))) => bodies[b].ty(bodies[b].outputs()[j]),
        (None, None) => unreachable!("every slot has a parameter or an output (region::slots)"),
    }
}

/// The outer sharding of a slot sharded `spec`.
pub(crate) fn stack(slot: &Slot, spec: &Spec) -> Spec {
    if slot.stacked {
        std::iter::once(Vec::new())
            .chain(spec.iter().cloned())
            .collect()
    } else {
        spec.clone()
    }
}

/// The slot's sharding that an outer value sharded `spec` proposes (a stacked value's leading
/// dim dropped: it stays whole).
pub(crate) fn unstack(slot: &Slot, spec: &Spec) -> Spec {
    if slot.stacked {
        spec.iter().skip(1).cloned().collect()
    } else {
        spec.clone()
    }
}

/// A slot's sharding while it is being settled, and which of its dims disagreement has fixed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settling {
    pub spec: Spec,
    /// A dim two members wanted split differently: it keeps the axes they share (their meet)
    /// and takes no more.
    pub frozen: Vec<bool>,
}

impl Settling {
    pub fn whole(rank: usize) -> Settling {
        Settling {
            spec: vec![Vec::new(); rank],
            frozen: vec![false; rank],
        }
    }

    /// Takes a member's sharding `new` into the slot's: a whole dim takes the member's axes
    /// (if no other dim uses them and the dim is not frozen); a dim split differently keeps the
    /// axes both share, major first, and freezes. A member whole where the slot is split
    /// changes nothing (it is resharded into the slot, a local slice). Returns whether the slot
    /// changed. Each dim grows once and then only shrinks, so repeating this ends.
    pub fn merge(&mut self, mesh: &Mesh, new: &Spec) -> bool {
        let mut changed = false;
        for (d, n) in new.iter().enumerate().take(self.spec.len()) {
            let cur = &self.spec[d];
            if cur == n || n.is_empty() {
                continue;
            }
            if cur.is_empty() {
                let in_use = n.iter().any(|a| self.spec.iter().flatten().any(|b| b == a));
                let known = n.iter().all(|a| mesh.axis_size(a).is_some());
                if !self.frozen[d] && !in_use && known {
                    self.spec[d] = n.clone();
                    changed = true;
                }
            } else {
                let shared = cur.iter().zip(n).take_while(|(a, b)| a == b).count();
                self.spec[d].truncate(shared);
                self.frozen[d] = true;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_slot_grows_once_then_keeps_the_meet_and_freezes() {
        let mesh = Mesh::new("mesh", vec![("dp".into(), 2), ("mp".into(), 2)]);
        let mut s = Settling::whole(2);
        // A whole dim takes a member's axes.
        assert!(s.merge(&mesh, &vec![axes(&["dp", "mp"]), vec![]]));
        assert_eq!(s.spec, vec![axes(&["dp", "mp"]), vec![]]);
        // A member whole where the slot is split changes nothing.
        assert!(!s.merge(&mesh, &vec![vec![], vec![]]));
        // An axis in use on another dim is not taken twice.
        assert!(!s.merge(&mesh, &vec![axes(&["dp", "mp"]), axes(&["mp"])]));
        // Split differently: the shared major axes stay, and the dim freezes.
        assert!(s.merge(&mesh, &vec![axes(&["dp"]), vec![]]));
        assert_eq!(s.spec, vec![axes(&["dp"]), vec![]]);
        assert!(s.merge(&mesh, &vec![axes(&["mp"]), vec![]]));
        assert_eq!(s.spec[0], Vec::<String>::new());
        assert!(s.frozen[0]);
        // A frozen dim takes nothing more; the other dim still can.
        assert!(!s.merge(&mesh, &vec![axes(&["mp"]), vec![]]));
        assert!(s.merge(&mesh, &vec![vec![], axes(&["mp"])]));
        assert_eq!(s.spec, vec![vec![], axes(&["mp"])]);
    }

    #[test]
    fn stacked_slots_add_and_drop_the_whole_leading_dim() {
        let slot = Slot {
            stacked: true,
            ..Slot::default()
        };
        let inner = vec![axes(&["dp"]), vec![]];
        let outer = stack(&slot, &inner);
        assert_eq!(outer, vec![vec![], axes(&["dp"]), vec![]]);
        assert_eq!(unstack(&slot, &outer), inner);
        // A split leading dim proposes nothing for the body.
        assert_eq!(
            unstack(&slot, &vec![axes(&["mp"]), axes(&["dp"]), vec![]]),
            inner
        );
    }
}
