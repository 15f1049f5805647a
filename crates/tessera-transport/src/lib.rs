//! The transport seam: how a program, interpreted or compiled, reaches the other devices of
//! its mesh.
//!
//! - `Collectives`: the interface the program calls, one method per collective over a device
//!   `Group`, on this device's values (`Literal`s), with errors of its own (`TransportError`:
//!   timeouts naming the late devices, devices that gave up). An implementation sees values,
//!   never another device's memory: the shared-memory transport of the runtime is one, a
//!   process-spanning one (MPI) fits beside it (`docs/ARCHITECTURE.md`, "The transport seam").
//! - Optional capabilities with a fallback: `Collectives::all_reduce_buffers` (an all-reduce
//!   on this device's own buffers; the default copies through `all_reduce`) and
//!   `Collectives::shared_products` (products done once for a group whose devices share
//!   memory; `None` by default, and the caller multiplies locally).
//! - `run`: the one dispatch from a collective `Op` to the interface.
//! - `rendezvous`: the typed meeting point (publish, barrier, abandon, leave) the shared-memory
//!   collectives and shared products are built on, with the protocol's safety argument.
//! - `values`: the copying collectives' arithmetic on host values (in member order, so every
//!   device gets the same bits), shared by every implementation.
//!
//! Architecture invariant: `tessera-transport` depends on `tessera-ir` only.

pub mod process;
pub mod rendezvous;
pub mod stacked;
pub mod values;

use std::time::Duration;

use tessera_ir::{CollectiveOp, DType, Literal, Mesh, ReduceKind, TensorType};

/// How many times a thread that waits for another (at a meeting, or for its next job) yields
/// its core before it parks: with more devices than cores the others need this core to
/// arrive, and a yield is cheaper than a futex sleep and wake-up.
pub const YIELDS_BEFORE_PARKING: usize = 256;

/// Why a collective failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TransportError {
    /// Some members of the group did not reach a stage of the collective in time; this device
    /// (`me`) gave up on the launch.
    #[error(
        "{op}: {group}: devices {late:?} {what} within {} (device {me} gave up)",
        show(*timeout)
    )]
    Timeout {
        op: &'static str,
        group: String,
        late: Vec<usize>,
        what: &'static str,
        timeout: Duration,
        me: usize,
    },
    /// Devices of the launch gave up (they failed, panicked or timed out), so this one (`me`)
    /// cannot finish the collective.
    #[error("{op}: {group}: {}, so device {me} cannot go on", who(devices))]
    GaveUp {
        op: &'static str,
        group: String,
        devices: Vec<usize>,
        me: usize,
    },
    /// A group larger than this transport reaches.
    #[error("{op}: a group of {size} devices over {axes:?} needs the sharded runtime")]
    Unreachable {
        op: &'static str,
        size: usize,
        axes: Vec<String>,
    },
    /// The members of a meeting disagree on what they meet for (their programs differ).
    #[error(
        "{op}: {group}: device {me} met devices that run another collective (step {seq} of the launch)"
    )]
    Mismatch {
        op: &'static str,
        group: String,
        me: usize,
        seq: u64,
    },
    /// The operands do not fit the collective (a malformed program), or its result cannot be
    /// allocated.
    #[error("{op}: {message}")]
    Invalid { op: &'static str, message: String },
}

fn who(devices: &[usize]) -> String {
    match devices {
        [d] => format!("device {d} gave up"),
        _ => format!("devices {devices:?} gave up"),
    }
}

/// A duration as the messages print it: whole seconds, or milliseconds.
pub fn show(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    }
}

/// The devices a collective runs over: this device's group along some mesh axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The mesh axes (for messages).
    pub axes: Vec<String>,
    /// The mesh positions of the members, ordered by their coordinates on `axes` (major first).
    pub members: Vec<usize>,
    /// This device's index in `members`.
    pub me: usize,
    /// The group as messages name it (`over [axes]`), made at its first meeting and kept
    /// (`label`): a kept group's meetings name it without allocating, and a group made for its
    /// members alone never makes it.
    pub name: std::sync::OnceLock<std::sync::Arc<str>>,
}

impl Group {
    /// The group over `axes` of mesh position `position` (axes not in the mesh are ignored).
    pub fn of(mesh: &Mesh, axes: &[String], position: usize) -> Group {
        let mut members = Vec::new();
        let me = Group::members_into(mesh, axes, position, &mut Vec::new(), &mut members);
        Group {
            name: std::sync::OnceLock::new(),
            axes: axes.to_vec(),
            members,
            me,
        }
    }

    /// The members of [`Group::of`] written into `members` (emptied first), returning this
    /// position's index among them; `coords` is scratch. Allocates nothing once the two
    /// vectors have room (devices run in turn do this at every all-reduce of every step).
    pub fn members_into(
        mesh: &Mesh,
        axes: &[String],
        position: usize,
        coords: &mut Vec<usize>,
        members: &mut Vec<usize>,
    ) -> usize {
        let size = |i: usize| mesh.axes[i].1;
        let axis_pos = || {
            axes.iter()
                .filter_map(|a| mesh.axes.iter().position(|(n, _)| n == a))
        };
        members.clear();
        coords.clear();
        coords.resize(mesh.axes.len(), 0);
        let mut rest = position;
        for i in (0..mesh.axes.len()).rev() {
            coords[i] = rest % size(i);
            rest /= size(i);
        }
        // A member's coordinates: this position's, with those along `axes` counted over.
        let n: usize = axis_pos().map(size).product();
        let mut me = 0;
        for k in 0..n {
            let mut r = k;
            for i in axis_pos().rev() {
                coords[i] = r % size(i);
                r /= size(i);
            }
            let lin = (0..mesh.axes.len()).fold(0, |acc, i| acc * size(i) + coords[i]);
            if lin == position {
                me = k;
            }
            members.push(lin);
        }
        me
    }

    /// The group of every device of the mesh.
    pub fn whole(mesh: &Mesh, position: usize) -> Group {
        let axes: Vec<String> = mesh.axes.iter().map(|(a, _)| a.clone()).collect();
        Group::of(mesh, &axes, position)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true for a group built by `of` (a device is in its own group).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The group as messages name it (made once, `name`).
    pub fn label(&self) -> std::sync::Arc<str> {
        let name = || format!("over {:?}", self.axes).into();
        self.name.get_or_init(name).clone()
    }

    /// `label` as a `String`.
    pub fn describe(&self) -> String {
        self.label().to_string()
    }
}

/// How a program reaches the other devices of its mesh. Every method is called by every
/// member of `group` with the same arguments but `x`, in the same order on every device.
/// Results are this device's; `x` is its operand. Errors name the op and the devices.
pub trait Collectives {
    /// This device's position in the mesh (row-major over the mesh axes).
    fn position(&self) -> usize;

    /// The elementwise `kind` over the members' values, the same bits on every member.
    fn all_reduce(
        &self,
        group: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError>;

    /// The members' values concatenated along `dim`, in group order.
    fn all_gather(&self, group: &Group, dim: usize, x: &Literal)
    -> Result<Literal, TransportError>;

    /// Chunk `group.me` along `dim` of `all_reduce(kind)` (reduced in the dtype's own
    /// arithmetic, in member order).
    fn reduce_scatter(
        &self,
        group: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError>;

    /// Chunk `group.me` along `split_dim` of every member's value, concatenated along
    /// `concat_dim` in group order.
    fn all_to_all(
        &self,
        group: &Group,
        split_dim: usize,
        concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError>;

    /// The value of the member `s` with `(s, group.me)` in `pairs` (indices in the group), or
    /// zeros when there is none.
    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError>;

    /// This device's index in `group`. Nobody is met.
    fn axis_index(&self, group: &Group) -> Result<usize, TransportError> {
        Ok(group.me)
    }

    /// `all_reduce` between this device's own buffers: the operand at `input`, the result
    /// written to `out` (which may equal `input`). A transport that can reduce in place (a
    /// shared-memory one, reading the members' buffers; MPI's `MPI_IN_PLACE`) overrides it;
    /// the default copies the operand into a value and back.
    ///
    /// # Safety
    /// `input` must point to an initialized value of type `ty` (bools as bytes 0 or 1) and
    /// `out` to room for one; both stay valid, and nothing else accesses them, until the call
    /// returns.
    unsafe fn all_reduce_buffers(
        &self,
        group: &Group,
        kind: ReduceKind,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), TransportError> {
        // SAFETY: forwarded from the caller.
        unsafe { all_reduce_by_copy(self, group, kind, ty, input, out) }
    }

    /// The shared products, for a transport whose devices share memory (`None`: multiply
    /// locally, then run the all-reduce).
    fn shared_products(&self) -> Option<&dyn SharedProducts> {
        None
    }
}

/// Products done once for a group of devices that share memory. A transport offers them
/// through `Collectives::shared_products`; every member of the group calls the same method at
/// the same step. `gemm` multiplies the views it is given (on all cores), on whichever thread
/// the transport picks (the shared-memory one calls it on a pool of its own, not on the
/// member's thread: hence `Sync`). `Ok(None)`: not done here (the members do not agree on one
/// product): multiply locally.
pub trait SharedProducts {
    /// A product whose right operand is the same buffer on every member (a replicated
    /// weight): the members' left operands are stacked and multiplied once. Returns this
    /// member's rows of the product, a dense row-major `m x n` block, readable (never
    /// writable) until the launch ends; `part.out` is not used.
    ///
    /// # Safety
    /// `part` must describe views inside live buffers of its dtype that nothing writes until
    /// the call returns.
    unsafe fn gemm_shared_rhs(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError>;

    /// A product whose result goes straight into a sum all-reduce over `group` (the weight
    /// gradient of a data-parallel step): the group's operands are stacked along the
    /// contraction and multiplied once. Returns the sum, a dense row-major `m x n` block,
    /// readable (never writable) until the launch ends; `part.out` is not used.
    ///
    /// # Safety
    /// As `gemm_shared_rhs`.
    unsafe fn gemm_all_reduce(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError>;
}

/// A matrix product over views: `out (m x n) = lhs (m x k) x rhs (k x n)`; element `(i, j)` of
/// a view is at element offset `i * strides[0] + j * strides[1]` from its address.
pub struct GemmCall {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lhs: *const u8,
    pub lhs_strides: [isize; 2],
    pub rhs: *const u8,
    pub rhs_strides: [isize; 2],
    pub out: *mut u8,
    pub out_strides: [isize; 2],
}

/// One device's part of a shared product (`SharedProducts`): element `(i, p)` of the left
/// operand is at element offset `i * lhs_strides[0] + p * lhs_strides[1]` from `lhs`, and
/// likewise for the right operand and `out`.
pub struct GemmPart {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lhs: *const u8,
    pub lhs_strides: [isize; 2],
    /// The right operand's address: the devices share it or they do not.
    pub rhs: *const u8,
    pub rhs_strides: [isize; 2],
    pub out: *mut u8,
    pub out_strides: [isize; 2],
}

/// `Collectives::all_reduce_buffers` by copying: the operand into a value, `all_reduce`, the
/// result back. (The default, and the fallback of a transport that reduces in place only
/// sometimes.)
///
/// # Safety
/// As `Collectives::all_reduce_buffers`.
pub unsafe fn all_reduce_by_copy<C: Collectives + ?Sized>(
    c: &C,
    group: &Group,
    kind: ReduceKind,
    ty: &TensorType,
    input: *const u8,
    out: *mut u8,
) -> Result<(), TransportError> {
    // SAFETY: the caller's contract.
    let x = unsafe { values::literal_from_raw(ty, input) };
    let r = c.all_reduce(group, kind, &x)?;
    check_result("all_reduce", &r, ty)?;
    // SAFETY: `r` has type `ty`, so its bytes fit `out`, which does not overlap `r`.
    unsafe {
        std::ptr::copy_nonoverlapping(values::data_ptr(&r.data), out, ty.byte_size());
    }
    Ok(())
}

fn check_result(op: &'static str, r: &Literal, out: &TensorType) -> Result<(), TransportError> {
    if r.ty.dtype != out.dtype || r.data.len() != out.numel() {
        return Err(TransportError::Invalid {
            op,
            message: format!("the transport returned a {} for a {out}", r.ty),
        });
    }
    Ok(())
}

/// Runs the collective `op` through `c` on this device's `input` (`None` for `axis_index`),
/// returning this device's result of type `out`.
pub fn run(
    c: &dyn Collectives,
    op: &CollectiveOp,
    mesh: &Mesh,
    input: Option<&Literal>,
    out: &TensorType,
) -> Result<Literal, TransportError> {
    let name = op.name();
    let group = Group::of(mesh, op.axes(), c.position());
    let x = || {
        input.ok_or_else(|| TransportError::Invalid {
            op: name,
            message: "missing operand".into(),
        })
    };
    let r = match op {
        CollectiveOp::AllReduce { kind, .. } => c.all_reduce(&group, *kind, x()?)?,
        CollectiveOp::AllGather { dim, .. } => c.all_gather(&group, *dim, x()?)?,
        CollectiveOp::ReduceScatter { kind, dim, .. } => {
            c.reduce_scatter(&group, *kind, *dim, x()?)?
        }
        CollectiveOp::AllToAll {
            split_dim,
            concat_dim,
            ..
        } => c.all_to_all(&group, *split_dim, *concat_dim, x()?)?,
        CollectiveOp::CollectivePermute { pairs, .. } => {
            c.collective_permute(&group, pairs, x()?)?
        }
        CollectiveOp::AxisIndex { .. } => {
            let me = c.axis_index(&group)?;
            Literal {
                ty: out.clone(),
                data: tessera_ir::Data::I32(vec![me as i32]),
            }
        }
    };
    check_result(name, &r, out)?;
    Ok(Literal {
        ty: out.clone(),
        data: r.data,
    })
}

/// One device alone: correct for every collective whose group has one member (a mesh whose
/// named axes all have size 1), `TransportError::Unreachable` otherwise.
pub struct SingleDevice;

impl SingleDevice {
    fn alone(&self, op: &'static str, group: &Group) -> Result<(), TransportError> {
        if group.len() == 1 {
            return Ok(());
        }
        Err(TransportError::Unreachable {
            op,
            size: group.len(),
            axes: group.axes.clone(),
        })
    }
}

impl Collectives for SingleDevice {
    fn position(&self) -> usize {
        0
    }

    fn all_reduce(
        &self,
        group: &Group,
        _kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.alone("all_reduce", group)?;
        Ok(x.clone())
    }

    fn all_gather(
        &self,
        group: &Group,
        _dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.alone("all_gather", group)?;
        Ok(x.clone())
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        _kind: ReduceKind,
        _dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.alone("reduce_scatter", group)?;
        Ok(x.clone())
    }

    fn all_to_all(
        &self,
        group: &Group,
        _split_dim: usize,
        _concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.alone("all_to_all", group)?;
        Ok(x.clone())
    }

    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.alone("collective_permute", group)?;
        Ok(if pairs.is_empty() {
            Literal::zeros(&x.ty)
        } else {
            x.clone()
        })
    }

    fn axis_index(&self, group: &Group) -> Result<usize, TransportError> {
        self.alone("axis_index", group)?;
        Ok(0)
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
        let g = |axes: &[&str], p| {
            let axes: Vec<String> = axes.iter().map(|a| a.to_string()).collect();
            let g = Group::of(&m, &axes, p);
            (g.members, g.me)
        };
        assert_eq!(g(&["x"], 3), (vec![1, 3], 1));
        assert_eq!(g(&["y"], 2), (vec![2, 3], 0));
        assert_eq!(g(&["x", "y"], 2), (vec![0, 1, 2, 3], 2));
        assert_eq!(g(&["y", "x"], 1), (vec![0, 2, 1, 3], 2));
        assert_eq!(Group::whole(&m, 1).members, vec![0, 1, 2, 3]);
    }

    /// Before the seam `SingleDevice` checked the group size from the op's axes itself; it
    /// now goes through `run`'s group, with the same message.
    #[test]
    fn a_single_device_refuses_a_larger_group_naming_it() {
        let op = CollectiveOp::AllGather {
            dim: 0,
            axes: vec!["x".into()],
        };
        let x = Literal::scalar_f32(1.0);
        let x = Literal {
            ty: TensorType::new(DType::F32, vec![1]),
            data: x.data,
        };
        let out = TensorType::new(DType::F32, vec![2]);
        let e = run(&SingleDevice, &op, &mesh(), Some(&x), &out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "all_gather: a group of 2 devices over [\"x\"] needs the sharded runtime"
        );
        let one = Mesh::new("m", vec![("x".into(), 1)]);
        let permute = CollectiveOp::CollectivePermute {
            axes: vec!["x".into()],
            pairs: vec![],
        };
        assert_eq!(
            run(&SingleDevice, &permute, &one, Some(&x), &x.ty).unwrap(),
            Literal::zeros(&x.ty)
        );
        let index = CollectiveOp::AxisIndex {
            axes: vec!["x".into()],
        };
        let i32_scalar = TensorType::scalar(DType::I32);
        assert_eq!(
            run(&SingleDevice, &index, &one, None, &i32_scalar).unwrap(),
            Literal::zeros(&i32_scalar)
        );
    }

    #[test]
    fn durations_print_in_seconds_or_milliseconds() {
        assert_eq!(show(Duration::from_millis(100)), "100 ms");
        assert_eq!(show(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(show(Duration::from_secs(60)), "60 s");
    }
}
