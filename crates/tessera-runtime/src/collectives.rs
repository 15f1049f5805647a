//! Collectives over shared memory between the device threads of one process.
//!
//! Every device of a group deposits its value in a slot keyed by (launch, sequence number,
//! group); each waits (parked on a condition variable, never spinning) until the group is
//! complete, then computes its own result from all the values, in group order, so every device
//! gets bit-identical sums. A device that does not arrive within the timeout turns into an
//! error naming the collective and the missing devices.
//!
//! This is the one transport behind the `Collectives` interface today; a process-spanning one
//! (MPI) would implement the same trait.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tessera_interp::{Collectives, InterpError, eval_op};
use tessera_ir::{BinaryOp, Literal, Mesh, Op, ReduceKind, TensorType};

type Key = (u64, u64, Vec<usize>);

struct Slot {
    values: Vec<Option<Literal>>,
    taken: usize,
}

/// The meeting point of one launch's devices.
pub struct Rendezvous {
    slots: Mutex<HashMap<Key, Slot>>,
    arrived: Condvar,
    timeout: Duration,
}

impl Default for Rendezvous {
    fn default() -> Self {
        let secs = std::env::var("TESSERA_COLLECTIVE_TIMEOUT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(60.0);
        Rendezvous {
            slots: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            timeout: Duration::from_secs_f64(secs),
        }
    }
}

/// One device's view of the collectives of a launch.
pub struct SharedCollectives<'a> {
    pub rendezvous: &'a Rendezvous,
    pub launch: u64,
    /// This device's position in the mesh (row-major over the mesh axes).
    pub position: usize,
    /// Device ids of the mesh positions, for error messages.
    pub device_ids: &'a [usize],
    seq: Cell<u64>,
}

impl<'a> SharedCollectives<'a> {
    pub fn new(
        rendezvous: &'a Rendezvous,
        launch: u64,
        position: usize,
        device_ids: &'a [usize],
    ) -> Self {
        SharedCollectives {
            rendezvous,
            launch,
            position,
            device_ids,
            seq: Cell::new(0),
        }
    }
}

/// The mesh positions in this position's group over `axes` (ordered by the coordinates on
/// `axes`, major first), and this position's index in it.
pub fn group(mesh: &Mesh, axes: &[String], position: usize) -> (Vec<usize>, usize) {
    let sizes: Vec<usize> = mesh.axes.iter().map(|(_, s)| *s).collect();
    let mut coords = vec![0; sizes.len()];
    let mut rest = position;
    for i in (0..sizes.len()).rev() {
        coords[i] = rest % sizes[i];
        rest /= sizes[i];
    }
    let axis_pos: Vec<usize> = axes
        .iter()
        .filter_map(|a| mesh.axes.iter().position(|(n, _)| n == a))
        .collect();
    let n: usize = axis_pos.iter().map(|&i| sizes[i]).product();
    let mut members = Vec::with_capacity(n);
    let mut me = 0;
    for k in 0..n {
        let mut c = coords.clone();
        let mut r = k;
        for &i in axis_pos.iter().rev() {
            c[i] = r % sizes[i];
            r /= sizes[i];
        }
        let lin = c.iter().zip(&sizes).fold(0, |acc, (x, s)| acc * s + x);
        if lin == position {
            me = k;
        }
        members.push(lin);
    }
    (members, me)
}

fn apply(op: Op, args: &[&Literal], ty: &TensorType) -> Result<Literal, InterpError> {
    eval_op(&op, args, ty)
}

fn combine(kind: ReduceKind, values: &[Literal]) -> Result<Literal, InterpError> {
    let op = Op::Binary(match kind {
        ReduceKind::Sum => BinaryOp::Add,
        ReduceKind::Max => BinaryOp::Max,
        ReduceKind::Min => BinaryOp::Min,
    });
    let mut acc = values[0].clone();
    for v in &values[1..] {
        acc = apply(op.clone(), &[&acc, v], &v.ty)?;
    }
    Ok(acc)
}

/// Chunk `k` of `n` along `dim`.
fn chunk(x: &Literal, dim: usize, k: usize, n: usize) -> Result<Literal, InterpError> {
    let size = x.ty.dims()[dim] / n;
    let mut start = vec![0; x.ty.rank()];
    let mut limit = x.ty.dims().to_vec();
    start[dim] = k * size;
    limit[dim] = (k + 1) * size;
    let mut dims = x.ty.dims().to_vec();
    dims[dim] = size;
    apply(
        Op::Slice {
            start,
            limit,
            stride: vec![1; x.ty.rank()],
        },
        &[x],
        &TensorType::new(x.ty.dtype, dims),
    )
}

fn concat(parts: &[Literal], dim: usize) -> Result<Literal, InterpError> {
    let refs: Vec<&Literal> = parts.iter().collect();
    let mut dims = parts[0].ty.dims().to_vec();
    dims[dim] = parts.iter().map(|p| p.ty.dims()[dim]).sum();
    apply(
        Op::Concatenate { dim },
        &refs,
        &TensorType::new(parts[0].ty.dtype, dims),
    )
}

impl Collectives for SharedCollectives<'_> {
    fn run(
        &self,
        op: &Op,
        mesh: &Mesh,
        input: Option<&Literal>,
        out: &TensorType,
    ) -> Result<Literal, InterpError> {
        let (members, me) = group(mesh, op.mesh_axes(), self.position);
        let n = members.len();
        if let Op::AxisIndex { .. } = op {
            return Ok(Literal {
                ty: out.clone(),
                data: tessera_ir::Data::I32(vec![me as i32]),
            });
        }
        let input = input.ok_or_else(|| InterpError::Op {
            op: op.name().into(),
            message: "missing operand".into(),
        })?;
        let values = if n == 1 {
            vec![input.clone()]
        } else {
            self.exchange(op, &members, me, input)?
        };
        let r = match op {
            Op::AllReduce { kind, .. } => combine(*kind, &values)?,
            Op::AllGather { dim, .. } => concat(&values, *dim)?,
            Op::ReduceScatter { kind, dim, .. } => chunk(&combine(*kind, &values)?, *dim, me, n)?,
            Op::AllToAll {
                split_dim,
                concat_dim,
                ..
            } => {
                let parts: Vec<Literal> = values
                    .iter()
                    .map(|v| chunk(v, *split_dim, me, n))
                    .collect::<Result<_, _>>()?;
                concat(&parts, *concat_dim)?
            }
            Op::CollectivePermute { pairs, .. } => match pairs.iter().find(|(_, d)| *d == me) {
                Some(&(s, _)) => values[s].clone(),
                None => Literal::zeros(out),
            },
            other => {
                return Err(InterpError::Op {
                    op: other.name().into(),
                    message: "not a collective".into(),
                });
            }
        };
        Ok(Literal {
            ty: out.clone(),
            data: r.data,
        })
    }
}

impl SharedCollectives<'_> {
    /// Deposits `input` and waits for the whole group; returns every member's value in order.
    fn exchange(
        &self,
        op: &Op,
        members: &[usize],
        me: usize,
        input: &Literal,
    ) -> Result<Vec<Literal>, InterpError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let key: Key = (self.launch, seq, members.to_vec());
        let r = self.rendezvous;
        let mut slots = r.slots.lock().expect("rendezvous lock");
        let slot = slots.entry(key.clone()).or_insert_with(|| Slot {
            values: vec![None; members.len()],
            taken: 0,
        });
        slot.values[me] = Some(input.clone());
        r.arrived.notify_all();
        let start = Instant::now();
        loop {
            let slot = slots.get(&key).expect("slot stays until all took");
            if slot.values.iter().all(|v| v.is_some()) {
                break;
            }
            let waited = start.elapsed();
            if waited >= r.timeout {
                let missing: Vec<usize> = slot
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_none())
                    .map(|(k, _)| {
                        self.device_ids
                            .get(members[k])
                            .copied()
                            .unwrap_or(members[k])
                    })
                    .collect();
                return Err(InterpError::Op {
                    op: op.name().into(),
                    message: format!(
                        "over {:?}: devices {missing:?} did not arrive within {:.0} s",
                        op.mesh_axes(),
                        r.timeout.as_secs_f64()
                    ),
                });
            }
            slots = r
                .arrived
                .wait_timeout(slots, r.timeout - waited)
                .expect("rendezvous lock")
                .0;
        }
        let slot = slots.get_mut(&key).expect("slot present");
        let values: Vec<Literal> = slot
            .values
            .iter()
            .map(|v| v.clone().expect("complete"))
            .collect();
        slot.taken += 1;
        if slot.taken == members.len() {
            slots.remove(&key);
        }
        Ok(values)
    }
}
