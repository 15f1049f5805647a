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
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_interp::{Collectives, InterpError, eval_op};
use tessera_ir::{BinaryOp, Data, Literal, Mesh, Op, ReduceKind, TensorType};

type Key = (u64, u64, Vec<usize>);

struct Slot {
    values: Vec<Option<Arc<Literal>>>,
    /// For an all-reduce: each member's reduced chunk of the result.
    chunks: Vec<Option<Literal>>,
    taken: usize,
}

/// The meeting point of one launch's devices.
pub struct Rendezvous {
    slots: Mutex<HashMap<Key, Slot>>,
    arrived: Condvar,
    timeout: Duration,
}

impl Default for Rendezvous {
    /// Waits give up after `TESSERA_COLLECTIVE_TIMEOUT` seconds (60 by default; read once).
    fn default() -> Self {
        static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
        let timeout = *TIMEOUT.get_or_init(|| {
            let secs = std::env::var("TESSERA_COLLECTIVE_TIMEOUT")
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .unwrap_or(60.0);
            Duration::from_secs_f64(secs)
        });
        Rendezvous {
            slots: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            timeout,
        }
    }
}

impl Rendezvous {
    /// A rendezvous whose waits give up after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Rendezvous {
        Rendezvous {
            timeout,
            ..Rendezvous::default()
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
        if let (Op::AllReduce { kind, .. }, true) = (op, n > 1) {
            return self.all_reduce(op, *kind, &members, me, input, out);
        }
        let values: Vec<Literal> = if n == 1 {
            vec![input.clone()]
        } else {
            let mut slots = self.deposit(op, &members, me, input)?;
            let vals = slots.1.iter().map(|v| (**v).clone()).collect();
            self.leave(&mut slots.0, &slots.2, members.len());
            vals
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

/// How many times a waiting device yields its core before it parks.
const YIELDS_BEFORE_PARKING: usize = 256;

/// Below this many elements an all-reduce takes one meeting instead of two.
const SMALL_ALL_REDUCE: usize = 1 << 14;

/// The element range of chunk `k` of `n` over `len` elements.
fn chunk_range(len: usize, k: usize, n: usize) -> std::ops::Range<usize> {
    let per = len.div_ceil(n);
    (k * per).min(len)..((k + 1) * per).min(len)
}

/// Reduces elements `range` of every value, in member order, into a literal of that length.
fn reduce_range(kind: ReduceKind, values: &[Arc<Literal>], range: std::ops::Range<usize>) -> Data {
    macro_rules! fold {
        ($variant:ident, $add:expr, $max:expr, $min:expr) => {{
            let first = match &values[0].data {
                Data::$variant(v) => v[range.clone()].to_vec(),
                _ => unreachable!("all-reduce operands share a type"),
            };
            let mut acc = first;
            for v in &values[1..] {
                let Data::$variant(v) = &v.data else {
                    unreachable!("all-reduce operands share a type")
                };
                for (a, &b) in acc.iter_mut().zip(&v[range.clone()]) {
                    *a = match kind {
                        ReduceKind::Sum => $add(*a, b),
                        ReduceKind::Max => $max(*a, b),
                        ReduceKind::Min => $min(*a, b),
                    };
                }
            }
            Data::$variant(acc)
        }};
    }
    use tessera_interp::scalar::{fmax, fmin};
    // f32 sums accumulate in f64 and round once, as a sum to one value does in the kernels: the
    // devices' partial losses add up to the correctly rounded total.
    if let (ReduceKind::Sum, Data::F32(_)) = (kind, &values[0].data) {
        let mut acc = vec![0f64; range.len()];
        for v in values {
            let Data::F32(v) = &v.data else {
                unreachable!("all-reduce operands share a type")
            };
            for (a, &b) in acc.iter_mut().zip(&v[range.clone()]) {
                *a += b as f64;
            }
        }
        return Data::F32(acc.into_iter().map(|a| a as f32).collect());
    }
    match &values[0].data {
        Data::F32(_) => fold!(F32, |a: f32, b| a + b, fmax, fmin),
        Data::F64(_) => fold!(F64, |a: f64, b| a + b, fmax, fmin),
        Data::I32(_) => fold!(
            I32,
            |a: i32, b| a.wrapping_add(b),
            |a: i32, b| a.max(b),
            |a: i32, b| a.min(b)
        ),
        Data::U32(_) => fold!(
            U32,
            |a: u32, b| a.wrapping_add(b),
            |a: u32, b| a.max(b),
            |a: u32, b| a.min(b)
        ),
        Data::Bool(v) => Data::Bool(v[range].to_vec()),
    }
}

type Held<'a> = (MutexGuard<'a, HashMap<Key, Slot>>, Vec<Arc<Literal>>, Key);

impl<'r> SharedCollectives<'r> {
    /// An all-reduce in two phases: every member reduces its own chunk of the elements over all
    /// the values (in member order, so every device gets the same bits), then every member
    /// assembles the chunks. Each device does 1/n of the arithmetic and no value is copied
    /// before it is needed.
    fn all_reduce(
        &self,
        op: &Op,
        kind: ReduceKind,
        members: &[usize],
        me: usize,
        input: &Literal,
        out: &TensorType,
    ) -> Result<Literal, InterpError> {
        let n = members.len();
        let (mut guard, values, key) = self.deposit(op, members, me, input)?;
        let len = input.data.len();
        // A small value: every member reduces all of it (the same order on each, so the same
        // bits), which saves the second meeting; that costs more than the arithmetic here.
        if len < SMALL_ALL_REDUCE {
            self.leave(&mut guard, &key, n);
            drop(guard);
            return Ok(Literal {
                ty: out.clone(),
                data: reduce_range(kind, &values, 0..len),
            });
        }
        drop(guard);
        let mine = reduce_range(kind, &values, chunk_range(len, me, n));
        let r = self.rendezvous;
        let mut slots = r.slots.lock().expect("rendezvous lock");
        slots
            .get_mut(&key)
            .expect("slot stays until all took")
            .chunks[me] = Some(Literal {
            ty: TensorType::new(input.ty.dtype, vec![mine.len()]),
            data: mine,
        });
        r.arrived.notify_all();
        slots = self.wait_for(op, slots, &key, members, |s| {
            s.chunks.iter().all(|c| c.is_some())
        })?;
        let slot = slots.get(&key).expect("slot present");
        let mut data = Data::zeros(input.ty.dtype, 0);
        for c in &slot.chunks {
            let c = c.as_ref().expect("complete");
            match (&mut data, &c.data) {
                (Data::F32(d), Data::F32(v)) => d.extend_from_slice(v),
                (Data::F64(d), Data::F64(v)) => d.extend_from_slice(v),
                (Data::I32(d), Data::I32(v)) => d.extend_from_slice(v),
                (Data::U32(d), Data::U32(v)) => d.extend_from_slice(v),
                (Data::Bool(d), Data::Bool(v)) => d.extend_from_slice(v),
                _ => {}
            }
        }
        self.leave(&mut slots, &key, n);
        Ok(Literal {
            ty: out.clone(),
            data,
        })
    }

    /// Waits (parked) until `done` holds for the slot, or the timeout names who is missing.
    fn wait_for(
        &self,
        op: &Op,
        mut slots: MutexGuard<'r, HashMap<Key, Slot>>,
        key: &Key,
        members: &[usize],
        done: impl Fn(&Slot) -> bool,
    ) -> Result<MutexGuard<'r, HashMap<Key, Slot>>, InterpError> {
        let r = self.rendezvous;
        let start = Instant::now();
        // With more devices than cores the others need this core to arrive: offer it a few
        // times (cheaper than a futex sleep and wake-up) before parking on the condition
        // variable.
        for _ in 0..YIELDS_BEFORE_PARKING {
            if done(slots.get(key).expect("slot stays until all took")) {
                return Ok(slots);
            }
            drop(slots);
            std::thread::yield_now();
            slots = r.slots.lock().expect("rendezvous lock");
        }
        loop {
            let slot = slots.get(key).expect("slot stays until all took");
            if done(slot) {
                return Ok(slots);
            }
            let waited = start.elapsed();
            if waited >= r.timeout {
                let missing: Vec<usize> = slot
                    .values
                    .iter()
                    .zip(&slot.chunks)
                    .enumerate()
                    .filter(|(_, (v, c))| {
                        v.is_none() || (slot.values.iter().all(|v| v.is_some()) && c.is_none())
                    })
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
    }

    /// Deposits `input` and waits for the whole group; returns the lock, every member's value
    /// in order, and the slot's key.
    fn deposit(
        &self,
        op: &Op,
        members: &[usize],
        me: usize,
        input: &Literal,
    ) -> Result<Held<'_>, InterpError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let key: Key = (self.launch, seq, members.to_vec());
        let r = self.rendezvous;
        let mut slots = r.slots.lock().expect("rendezvous lock");
        let slot = slots.entry(key.clone()).or_insert_with(|| Slot {
            values: vec![None; members.len()],
            chunks: vec![None; members.len()],
            taken: 0,
        });
        slot.values[me] = Some(Arc::new(input.clone()));
        r.arrived.notify_all();
        let slots = self.wait_for(op, slots, &key, members, |s| {
            s.values.iter().all(|v| v.is_some())
        })?;
        let values = slots[&key]
            .values
            .iter()
            .map(|v| v.clone().expect("complete"))
            .collect();
        Ok((slots, values, key))
    }

    /// Marks this member done with the slot; the last one removes it.
    fn leave(&self, slots: &mut MutexGuard<'_, HashMap<Key, Slot>>, key: &Key, n: usize) {
        let slot = slots.get_mut(key).expect("slot present");
        slot.taken += 1;
        if slot.taken == n {
            slots.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh::new("m", vec![("x".into(), 2), ("y".into(), 2)])
    }

    #[test]
    fn groups_follow_the_axes() {
        let m = mesh();
        assert_eq!(group(&m, &["x".into()], 3), (vec![1, 3], 1));
        assert_eq!(group(&m, &["y".into()], 2), (vec![2, 3], 0));
        assert_eq!(
            group(&m, &["x".into(), "y".into()], 2),
            (vec![0, 1, 2, 3], 2)
        );
        assert_eq!(
            group(&m, &["y".into(), "x".into()], 1),
            (vec![0, 2, 1, 3], 2)
        );
    }

    #[test]
    fn a_device_that_never_arrives_is_an_error_naming_it() {
        let r = Rendezvous::with_timeout(Duration::from_millis(50));
        let ids = [10, 11, 12, 13];
        let c = SharedCollectives::new(&r, 0, 0, &ids);
        let op = Op::AllReduce {
            kind: ReduceKind::Sum,
            axes: vec!["x".into()],
        };
        let x = Literal::scalar_f32(1.0);
        let err = c
            .run(&op, &mesh(), Some(&x), &x.ty)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("all_reduce") && err.contains("[12]") && err.contains("did not arrive"),
            "{err}"
        );
    }

    /// Small values (one meeting) and large ones (reduced chunk-wise in two meetings).
    #[test]
    fn all_reduce_between_threads() {
        for len in [3, SMALL_ALL_REDUCE + 5] {
            let r = Rendezvous::default();
            let ids = [0, 1, 2, 3];
            let op = Op::AllReduce {
                kind: ReduceKind::Sum,
                axes: vec!["x".into(), "y".into()],
            };
            let results: Vec<Literal> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|p| {
                        let (r, ids, op) = (&r, &ids, &op);
                        s.spawn(move || {
                            let c = SharedCollectives::new(r, 7, p, ids);
                            let v: Vec<f32> = (0..len).map(|i| (i % 7) as f32 + p as f32).collect();
                            let x = Literal::new([len], Data::F32(v)).unwrap();
                            c.run(op, &mesh(), Some(&x), &x.ty).unwrap()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for l in results {
                for i in [0, 1, len / 2, len - 1] {
                    assert_eq!(
                        l.data.get_f64(i),
                        4.0 * (i % 7) as f64 + 6.0,
                        "len {len} element {i}"
                    );
                }
            }
        }
    }
}
