//! Collectives over a mesh whose devices live in several processes: hierarchical, the
//! process's own devices meeting over shared memory and one call between the processes
//! (`ProcessLink::all_gather`) per collective.
//!
//! A step whose groups all stay inside processes (decided from the mesh and the op's axes, so
//! every device of every process decides alike) is the shared-memory collective, untouched.
//! A step with a group that spans processes goes in three stages, every device of the mesh
//! taking part:
//! 1. this process's devices of the mesh meet (`SharedCollectives::seat` over all of them)
//!    and publish their operands;
//! 2. the last to arrive is elected and makes the one call between processes: a block per
//!    process, a header (the collective, its step and its type) and the process's operands in
//!    mesh-position order; the others' headers must equal this one's (else `Mismatch`, on
//!    every process);
//! 3. everyone reads every position's operand and computes its own result from its group's,
//!    in member order, with the shared-memory transport's arithmetic (`values`): the bits are
//!    those of a one-process run.
//!
//! The shared products (one GEMM for a group) stay within a process: a group that spans
//! processes multiplies locally (`Ok(None)`), and the result goes through the all-reduce.

use std::cell::RefCell;
use std::sync::Arc;

use tessera_ir::{Literal, Mesh, ReduceKind, TensorType};
use tessera_transport::process::ProcessLink;
use tessera_transport::rendezvous::Barrier;
use tessera_transport::{
    Collectives, GemmCall, GemmPart, Group, SharedProducts, TransportError, values,
};

use crate::collectives::SharedCollectives;
use crate::process::process_of;

/// One device's collectives in a launch over several processes.
pub struct Spanning<'a> {
    pub(crate) local: &'a SharedCollectives<'a>,
    pub(crate) mesh: &'a Mesh,
    /// The global device of each mesh position.
    pub(crate) devices: &'a [usize],
    /// The mesh positions this process runs, ascending.
    pub(crate) positions: &'a [usize],
    pub(crate) link: &'a dyn ProcessLink,
    /// Steps already classified: (axes, whether a group of them spans processes).
    spans: RefCell<Vec<(Vec<String>, bool)>>,
}

/// What a member publishes at the process's meeting: its operand, then (the elected one)
/// every position's.
#[derive(Clone)]
enum Item {
    Operand(Arc<Literal>),
    Everyone(Result<Arc<Exchange>, TransportError>),
}

/// What the elected member publishes: every position's operand and, for an all-reduce whose
/// group is the same for all of this process's devices, the reduction, done once.
struct Exchange {
    operands: Vec<Arc<Literal>>,
    reduced: Option<(Vec<usize>, Arc<Literal>)>,
}

/// The collectives' codes in the blocks' headers.
fn code(op: &str) -> u64 {
    match op {
        "all_reduce" => 1,
        "all_gather" => 2,
        "reduce_scatter" => 3,
        "all_to_all" => 4,
        "collective_permute" => 5,
        _ => 0,
    }
}

const HEADER: usize = 4 * 8;

impl<'a> Spanning<'a> {
    pub(crate) fn new(
        local: &'a SharedCollectives<'a>,
        mesh: &'a Mesh,
        devices: &'a [usize],
        positions: &'a [usize],
        link: &'a dyn ProcessLink,
    ) -> Self {
        Spanning {
            local,
            mesh,
            devices,
            positions,
            link,
            spans: RefCell::new(Vec::new()),
        }
    }

    /// Whether some group over `axes` has members in two processes: some position and its
    /// neighbour along one of the axes are on different processes.
    fn spans(&self, axes: &[String]) -> bool {
        if let Some((_, s)) = self.spans.borrow().iter().find(|(a, _)| a == axes) {
            return *s;
        }
        let sizes: Vec<usize> = self.mesh.axes.iter().map(|(_, s)| *s).collect();
        let strides: Vec<usize> = (0..sizes.len())
            .map(|i| sizes[i + 1..].iter().product())
            .collect();
        let spans = axes.iter().any(|a| {
            let Some(i) = self.mesh.axes.iter().position(|(n, _)| n == a) else {
                return false;
            };
            (0..self.devices.len()).any(|p| {
                let coord = (p / strides[i]) % sizes[i];
                coord + 1 < sizes[i]
                    && process_of(self.devices[p]) != process_of(self.devices[p + strides[i]])
            })
        });
        self.spans.borrow_mut().push((axes.to_vec(), spans));
        spans
    }

    /// Every mesh position's operand (stages 1-3 of the module doc); with `reduce`, an
    /// all-reduce of `group`, which the elected member computes once when every device of this
    /// process is in that group (the others would each compute the same).
    fn everyone(
        &self,
        op: &'static str,
        x: Arc<Literal>,
        reduce: Option<(ReduceKind, &Group)>,
    ) -> Result<Arc<Exchange>, TransportError> {
        let me = self
            .positions
            .iter()
            .position(|&p| p == self.local.position)
            .expect("a launch runs its own positions");
        let group = Group {
            axes: Vec::new(),
            members: self.positions.to_vec(),
            me,
            name: std::sync::OnceLock::from(Arc::<str>::from("between processes")),
        };
        let mut seat = self.local.seat::<Item, ()>(&group, op, group.label());
        let (operands, ()) = seat.arrive(Item::Operand(x.clone()), |_| (), false)?;
        if seat.advance_and_elect(2, false) {
            let seq = self.local.seq() - 1;
            let result = self.cross(op, seq, &x.ty, &operands).and_then(|operands| {
                let reduced = match reduce {
                    Some((kind, group)) if self.one_group(group) => {
                        let v: Vec<&Literal> = group
                            .members
                            .iter()
                            .map(|&p| operands[p].as_ref())
                            .collect();
                        let data = values::reduce_widened(kind, &v, 0..x.data.len())?;
                        let sum = Literal {
                            ty: x.ty.clone(),
                            data,
                        };
                        Some((group.members.clone(), Arc::new(sum)))
                    }
                    _ => None,
                };
                Ok(Arc::new(Exchange { operands, reduced }))
            });
            seat.advance(3, Some(Item::Everyone(result)));
        }
        let items = seat.wait(Barrier::elected(
            3,
            "did not finish the exchange between processes",
        ))?;
        seat.leave();
        match items.into_iter().next() {
            Some(Item::Everyone(r)) => r,
            _ => Err(TransportError::Invalid {
                op,
                message: "the exchange between processes published no result".into(),
            }),
        }
    }

    /// Whether every position of this process has `group` as its group over `group.axes`.
    fn one_group(&self, group: &Group) -> bool {
        self.positions
            .iter()
            .all(|&p| Group::of(self.mesh, &group.axes, p).members == group.members)
    }

    /// The call between processes: this process's operands out, every position's in (this
    /// process's own as they are, the others' decoded from their blocks).
    fn cross(
        &self,
        op: &'static str,
        seq: u64,
        ty: &TensorType,
        operands: &[Item],
    ) -> Result<Vec<Arc<Literal>>, TransportError> {
        let invalid = |message: String| TransportError::Invalid { op, message };
        let processes = crate::process::processes_of(self.devices);
        let per_process: Vec<Vec<usize>> = processes
            .iter()
            .map(|&q| {
                (0..self.devices.len())
                    .filter(|&p| process_of(self.devices[p]) == q)
                    .collect()
            })
            .collect();
        let most = per_process.iter().map(Vec::len).max().unwrap_or(0);
        let value_bytes = ty.byte_size();
        let block = most
            .checked_mul(value_bytes)
            .and_then(|b| b.checked_add(HEADER))
            .ok_or_else(|| invalid(format!("{most} values of {ty} overflow a block")))?;
        let header = [code(op), seq, ty.dtype as u64, ty.numel() as u64];
        let mut mine = Vec::with_capacity(block);
        for h in header {
            mine.extend_from_slice(&h.to_le_bytes());
        }
        for item in operands {
            match item {
                Item::Operand(v) => values::append_bytes(v, &mut mine),
                Item::Everyone(_) => return Err(invalid("an operand is missing".into())),
            }
        }
        mine.resize(block, 0);
        // Short of the meeting's own timeout, so that the process's other devices, waiting
        // for this one, hear why (the others did not answer) rather than time out on it.
        let timeout = self.local.rendezvous.timeout().mul_f64(0.9);
        let header: Vec<u8> = mine[..HEADER].to_vec();
        let all = self
            .link
            .all_gather(&processes, mine, timeout)
            .map_err(|e| invalid(format!("between processes: {e}")))?;
        if all.len() != block * processes.len() {
            return Err(invalid(format!(
                "between processes: {} bytes for {} blocks of {block}",
                all.len(),
                processes.len()
            )));
        }
        let mut out: Vec<Option<Arc<Literal>>> = vec![None; self.devices.len()];
        let me = crate::process::process_index();
        for (k, (theirs, positions)) in all.chunks(block).zip(&per_process).enumerate() {
            if theirs[..HEADER] != header[..] {
                let q = processes[k];
                return Err(TransportError::Mismatch {
                    op,
                    group: format!("between processes (process {q} is at another collective)"),
                    me: self.devices[self.local.position],
                    seq,
                });
            }
            if processes[k] == me {
                for (&p, item) in positions.iter().zip(operands) {
                    if let Item::Operand(v) = item {
                        out[p] = Some(v.clone());
                    }
                }
                continue;
            }
            for (j, &p) in positions.iter().enumerate() {
                let at = HEADER + j * value_bytes;
                let v = values::from_bytes(ty, &theirs[at..at + value_bytes])
                    .ok_or_else(|| invalid(format!("a {ty} of the wrong size")))?;
                out[p] = Some(Arc::new(v));
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(p, v)| v.ok_or_else(|| invalid(format!("no operand for mesh position {p}"))))
            .collect()
    }

    /// The all-reduce of `group` over processes: the process's sum when the elected member
    /// computed it for this group (`everyone`), else this member's own, in member order.
    fn sum(
        &self,
        x: Arc<Literal>,
        kind: ReduceKind,
        group: &Group,
    ) -> Result<Arc<Literal>, TransportError> {
        let ty = x.ty.clone();
        let all = self.everyone("all_reduce", x, Some((kind, group)))?;
        if let Some((members, sum)) = &all.reduced
            && *members == group.members
        {
            return Ok(sum.clone());
        }
        let v: Vec<&Literal> = group
            .members
            .iter()
            .map(|&p| all.operands[p].as_ref())
            .collect();
        let data = values::reduce_widened(kind, &v, 0..ty.numel())?;
        Ok(Arc::new(Literal { ty, data }))
    }

    /// The operands of `group`'s members, in member order, when its step spans processes;
    /// `None` when the shared-memory collective serves it.
    fn members(
        &self,
        op: &'static str,
        group: &Group,
        x: &Literal,
    ) -> Result<Option<Vec<Arc<Literal>>>, TransportError> {
        if !self.spans(&group.axes) {
            return Ok(None);
        }
        let all = self.everyone(op, Arc::new(x.clone()), None)?;
        Ok(Some(
            group
                .members
                .iter()
                .map(|&p| all.operands[p].clone())
                .collect(),
        ))
    }
}

fn refs(values: &[Arc<Literal>]) -> Vec<&Literal> {
    values.iter().map(|v| v.as_ref()).collect()
}

impl Collectives for Spanning<'_> {
    fn position(&self) -> usize {
        self.local.position
    }

    fn all_reduce(
        &self,
        group: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        if !self.spans(&group.axes) {
            return self.local.all_reduce(group, kind, x);
        }
        let sum = self.sum(Arc::new(x.clone()), kind, group)?;
        Ok(Arc::try_unwrap(sum).unwrap_or_else(|sum| sum.as_ref().clone()))
    }

    fn all_gather(
        &self,
        group: &Group,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        match self.members("all_gather", group, x)? {
            None => self.local.all_gather(group, dim, x),
            Some(v) => values::concat("all_gather", &refs(&v), dim),
        }
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        match self.members("reduce_scatter", group, x)? {
            None => self.local.reduce_scatter(group, kind, dim, x),
            Some(v) => {
                let sum = values::reduce(kind, &refs(&v))?;
                values::chunk("reduce_scatter", &sum, dim, group.me, group.len())
            }
        }
    }

    fn all_to_all(
        &self,
        group: &Group,
        split_dim: usize,
        concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        match self.members("all_to_all", group, x)? {
            None => self.local.all_to_all(group, split_dim, concat_dim, x),
            Some(v) => values::all_to_all(&refs(&v), split_dim, concat_dim, group.me),
        }
    }

    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        match self.members("collective_permute", group, x)? {
            None => self.local.collective_permute(group, pairs, x),
            Some(v) => Ok(values::permute(&refs(&v), pairs, group.me)),
        }
    }

    /// In place over shared memory when the step stays inside processes; otherwise the
    /// operand is copied out once and the sum (computed once for the process when its devices
    /// share the group) copied into `out`.
    unsafe fn all_reduce_buffers(
        &self,
        group: &Group,
        kind: ReduceKind,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), TransportError> {
        if self.spans(&group.axes) {
            // SAFETY: the caller's contract: `input` holds an initialized value of type `ty`.
            let x = Arc::new(unsafe { values::literal_from_raw(ty, input) });
            let sum = self.sum(x, kind, group)?;
            if sum.ty.dtype != ty.dtype || sum.data.len() != ty.numel() {
                return Err(TransportError::Invalid {
                    op: "all_reduce",
                    message: format!("a {} for a {ty}", sum.ty),
                });
            }
            // SAFETY: `sum` holds `ty.numel()` elements of `ty.dtype` (checked above), the
            // `ty.byte_size()` bytes `out` has room for (the caller's contract); `sum` is a
            // host value of this launch's exchange (or this call's own), never a device
            // buffer, so it does not overlap `out`.
            unsafe {
                std::ptr::copy_nonoverlapping(values::data_ptr(&sum.data), out, ty.byte_size())
            };
            Ok(())
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { self.local.all_reduce_buffers(group, kind, ty, input, out) }
        }
    }

    fn shared_products(&self) -> Option<&dyn SharedProducts> {
        Some(self)
    }
}

impl SharedProducts for Spanning<'_> {
    unsafe fn gemm_shared_rhs(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        if self.spans(&group.axes) {
            return Ok(None);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.local.gemm_shared_rhs(group, part, gemm) }
    }

    unsafe fn gemm_all_reduce(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        if self.spans(&group.axes) {
            return Ok(None);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.local.gemm_all_reduce(group, part, gemm) }
    }
}
