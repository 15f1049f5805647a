//! `Array`: a global value, held on the host or split into one shard per device of a mesh.

use std::sync::{Arc, OnceLock};

use tessera_ir::sharding::{Spec, is_replicated};
use tessera_ir::{Data, Literal, Mesh, TensorType};

/// How an array is laid over a mesh: its split (`Spec`, the vocabulary shared with the compiler
/// and the user API, `tessera_ir::sharding`), and which device holds each mesh position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardSpec {
    pub mesh: Mesh,
    pub devices: Vec<usize>,
    pub dims: Spec,
}

impl ShardSpec {
    /// The shard of mesh position `pos`: for each dim, (offset, size) in the global array.
    pub fn shard_range(&self, ty: &TensorType, pos: usize) -> Vec<(usize, usize)> {
        self.mesh.shard_range(ty.dims(), &self.dims, pos)
    }

    /// The type of one shard.
    pub fn local_type(&self, ty: &TensorType) -> TensorType {
        TensorType::new(
            ty.dtype,
            self.shard_range(ty, 0)
                .iter()
                .map(|&(_, s)| s)
                .collect::<Vec<_>>(),
        )
    }

    pub fn is_replicated(&self) -> bool {
        is_replicated(&self.dims)
    }

    /// The mesh positions this process holds shards of (`process::local_positions`): all of
    /// them in a one-process run.
    pub fn local_positions(&self) -> Vec<usize> {
        crate::process::local_positions(&self.devices)
    }
}

/// An array's shards, one per local mesh position: shared like the layout, so cloning a
/// placed array allocates nothing. A single shard (a mesh of one device) is held without a
/// list: a one-device program's output is then as cheap to make and drop as a host array.
#[derive(Clone, Debug)]
enum Shards {
    One(Arc<Literal>),
    Many(Arc<[Arc<Literal>]>),
}

impl Shards {
    fn as_slice(&self) -> &[Arc<Literal>] {
        match self {
            Shards::One(s) => std::slice::from_ref(s),
            Shards::Many(list) => list,
        }
    }
}

impl FromIterator<Arc<Literal>> for Shards {
    fn from_iter<I: IntoIterator<Item = Arc<Literal>>>(iter: I) -> Shards {
        let mut iter = iter.into_iter();
        match (iter.next(), iter.next()) {
            (Some(one), None) => Shards::One(one),
            (first, second) => Shards::Many(first.into_iter().chain(second).chain(iter).collect()),
        }
    }
}

/// A global array: its type, and its elements on the host or as one shard per device of this
/// process (every device in a one-process run; in a run over several processes, each holds
/// only the shards of its own devices). Buffers are shared and immutable, so cloning is cheap.
#[derive(Clone, Debug)]
pub struct Array {
    ty: TensorType,
    host: Arc<OnceLock<Arc<Literal>>>,
    /// The layout is shared: a jitted program's outputs all point at the program's own.
    shards: Option<(Arc<ShardSpec>, Shards)>,
}

/// The allocations of an array no one else holds, its elements taken out
/// ([`Array::into_shell`]): [`Shell::fill`] makes them an array again around a new value. Its
/// cell is set and both of its `Arc`s are unique (no clone or weak reference of them exists,
/// as the field is private).
#[derive(Debug)]
pub struct Shell(Arc<OnceLock<Arc<Literal>>>);

impl Shell {
    /// An array of `literal`, in these allocations.
    pub fn fill(mut self, literal: Literal) -> Array {
        let ty = literal.ty.clone();
        let held = Arc::get_mut(&mut self.0)
            .and_then(OnceLock::get_mut)
            .and_then(Arc::get_mut)
            .expect("a shell's cell is set and its Arcs unique (into_shell)");
        *held = literal;
        Array {
            ty,
            host: self.0,
            shards: None,
        }
    }
}

/// The allocations of a one-shard array no one else holds, its shard's elements taken out
/// ([`Array::into_placed_shell`]): [`PlacedShell::fill`] makes them a placed array again around
/// a new shard. Its cell is empty, it holds one shard, and its `Arc`s are unique.
#[derive(Debug)]
pub struct PlacedShell {
    host: Arc<OnceLock<Arc<Literal>>>,
    shards: Shards,
}

impl PlacedShell {
    /// An array of type `ty` laid out as `spec` on one device, whose shard is `shard`, in these
    /// allocations.
    pub fn fill(mut self, ty: TensorType, spec: Arc<ShardSpec>, shard: Literal) -> Array {
        let held = match &mut self.shards {
            Shards::One(one) => Arc::get_mut(one),
            Shards::Many(list) => Arc::get_mut(list)
                .and_then(|list| list.first_mut())
                .and_then(Arc::get_mut),
        }
        .expect("a placed shell's shard is unique (into_placed_shell)");
        *held = shard;
        Array {
            ty,
            host: self.host,
            shards: Some((spec, self.shards)),
        }
    }
}

/// The allocations of a placed array of several shards no one else holds, its shards'
/// elements taken out ([`Array::into_shards_shell`]): its cell, its list of shards and the
/// shards' `Arc`s, which [`ShardsShell::fill`] makes an array of the same layout again around
/// new shards. A replicated array's shards are one value: its shell keeps that value's `Arc`
/// first in the list and a shared empty placeholder in the other places until filled. Its
/// cell is empty, its list unique, and each of its own shards' `Arc`s unique.
#[derive(Debug)]
pub struct ShardsShell {
    host: Arc<OnceLock<Arc<Literal>>>,
    list: Arc<[Arc<Literal>]>,
    replicated: bool,
}

/// What a replicated shell holds in all but the first place of its list: an empty value
/// shared by every shell of the process (made once).
fn placeholder() -> Arc<Literal> {
    static EMPTY: OnceLock<Arc<Literal>> = OnceLock::new();
    EMPTY
        .get_or_init(|| {
            Arc::new(Literal {
                ty: TensorType::new(tessera_ir::DType::F32, vec![0]),
                data: Data::F32(Vec::new()),
            })
        })
        .clone()
}

impl ShardsShell {
    /// How many shards the shell holds, and whether they are one replicated value.
    pub fn layout(&self) -> (usize, bool) {
        (self.list.len(), self.replicated)
    }

    /// An array of type `ty` laid out as `spec` in these allocations: its shards `shard(k)`
    /// for each place `k` of the list, or, for a replicated shell, `shard(0)` in every place
    /// (`shard` is called once). `spec` must have as many local positions as the shell has
    /// shards (the caller matches them with `layout`; checked in debug builds).
    pub fn fill(
        mut self,
        ty: TensorType,
        spec: Arc<ShardSpec>,
        mut shard: impl FnMut(usize) -> Literal,
    ) -> Array {
        debug_assert_eq!(
            (spec.devices.iter())
                .filter(|&&d| crate::process::local_index(d).is_some())
                .count(),
            self.list.len(),
            "a shell of as many shards as the layout's local positions"
        );
        let slots = Arc::get_mut(&mut self.list).expect("a shell's list is unique");
        let n = slots.len();
        for k in 0..n {
            if self.replicated && k > 0 {
                slots[k] = slots[0].clone();
                continue;
            }
            *Arc::get_mut(&mut slots[k]).expect("a shell's own shards are unique") = shard(k);
        }
        Array {
            ty,
            host: self.host,
            shards: Some((spec, Shards::Many(self.list))),
        }
    }
}

/// Copies the elements of a shard between it and the global array: from `src` (the global
/// array, or with `to_global` the shard) into `dst` (the shard, or the global array of dims
/// `dst_dims`); `offsets` are the shard's (offset, size) per dim.
fn copy_shard(
    src: &Literal,
    dst: &mut Data,
    dst_dims: &[usize],
    offsets: &[(usize, usize)],
    to_global: bool,
) {
    let n = if to_global { src.ty.numel() } else { dst.len() };
    let local_dims: Vec<usize> = offsets.iter().map(|&(_, s)| s).collect();
    for f in 0..n {
        let idx = unravel(f, &local_dims);
        let g: usize = idx
            .iter()
            .zip(offsets)
            .zip(global_strides(if to_global {
                dst_dims
            } else {
                src.ty.dims()
            }))
            .map(|((i, (o, _)), s)| (i + o) * s)
            .sum();
        let (from, to) = if to_global { (f, g) } else { (g, f) };
        dst.copy_element(to, &src.data, from)
            .expect("a shard has its array's element type and lies inside it");
    }
}

/// The row-major index of element `f` of an array of `dims`.
fn unravel(mut f: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        if dims[i] > 0 {
            idx[i] = f % dims[i];
            f /= dims[i];
        }
    }
    idx
}

fn global_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

impl Array {
    pub fn new(literal: Literal) -> Array {
        let cell = OnceLock::new();
        let ty = literal.ty.clone();
        let _ = cell.set(Arc::new(literal));
        Array {
            ty,
            host: Arc::new(cell),
            shards: None,
        }
    }

    /// An array from its shards (one per mesh position, each of the spec's local type).
    pub fn from_shards(
        ty: TensorType,
        spec: impl Into<Arc<ShardSpec>>,
        shards: impl IntoIterator<Item = Arc<Literal>>,
    ) -> Array {
        let spec = spec.into();
        Array {
            ty,
            host: Arc::new(OnceLock::new()),
            shards: Some((spec, shards.into_iter().collect())),
        }
    }

    /// Splits this array's value over the mesh as `spec` says.
    pub fn shard(&self, spec: ShardSpec) -> Array {
        let spec = Arc::new(spec);
        // A replicated array is one buffer that every device reads (buffers are immutable):
        // no copies, and devices running at once share it in the caches.
        let positions = spec.local_positions();
        if spec.is_replicated() {
            let shards = std::iter::repeat_n(self.literal_arc(), positions.len()).collect();
            return Array {
                ty: self.ty.clone(),
                host: self.host.clone(),
                shards: Some((spec, shards)),
            };
        }
        let global = self.literal();
        let local = spec.local_type(&self.ty);
        let shards = positions
            .into_iter()
            .map(|pos| {
                let mut data = Data::zeros(local.dtype, local.numel());
                copy_shard(
                    global,
                    &mut data,
                    self.ty.dims(),
                    &spec.shard_range(&self.ty, pos),
                    false,
                );
                Arc::new(Literal {
                    ty: local.clone(),
                    data,
                })
            })
            .collect();
        Array {
            ty: self.ty.clone(),
            host: self.host.clone(),
            shards: Some((spec, shards)),
        }
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The sharding, when the array lives on a mesh.
    pub fn spec(&self) -> Option<&ShardSpec> {
        self.shards.as_ref().map(|(s, _)| s.as_ref())
    }

    /// [`Array::spec`] as the shared allocation it is: arrays laid out alike by one program
    /// (its outputs) or one `shard` share it, and can be compared by pointer.
    pub fn layout(&self) -> Option<&Arc<ShardSpec>> {
        self.shards.as_ref().map(|(s, _)| s)
    }

    /// The shard of each of this process's mesh positions (`ShardSpec::local_positions`,
    /// every position in a one-process run), in position order.
    pub fn shards(&self) -> Option<&[Arc<Literal>]> {
        self.shards.as_ref().map(|(_, v)| v.as_slice())
    }

    /// Whether this process can read the whole value: it is on the host, replicated with a
    /// shard here, or every shard is here (always, in a one-process run).
    pub fn is_fully_addressable(&self) -> bool {
        match &self.shards {
            None => true,
            Some((spec, shards)) => {
                let shards = shards.as_slice();
                self.host.get().is_some()
                    || shards.len() == spec.devices.len()
                    || (spec.is_replicated() && !shards.is_empty())
            }
        }
    }

    /// `literal`, or why this process cannot read the value (its shards are on other
    /// processes: `tessera::distributed::process_allgather` gathers them).
    pub fn try_literal(&self) -> Result<&Literal, String> {
        if self.is_fully_addressable() {
            return Ok(self.literal());
        }
        let spec = self.spec().expect("a host value is addressable");
        Err(format!(
            "a {} split as {:?} over {} devices of which this process holds {}: it is not \
             fully addressable here (gather it with distributed::process_allgather, or read \
             its local shards)",
            self.ty,
            spec.dims,
            spec.devices.len(),
            self.shards().map_or(0, |s| s.len())
        ))
    }

    /// The whole array's elements on the host, assembled from the shards on first use.
    ///
    /// # Panics
    /// When this process does not hold every shard (`try_literal` says why).
    pub fn literal(&self) -> &Literal {
        self.host.get_or_init(|| {
            let (spec, shards) = self
                .shards
                .as_ref()
                .expect("an array has a host value or shards");
            let shards = shards.as_slice();
            if spec.is_replicated() && !shards.is_empty() {
                return shards[0].clone();
            }
            if shards.len() != spec.devices.len() {
                panic!("{}", self.try_literal().unwrap_err());
            }
            Arc::new(Array::assemble(&self.ty, spec, shards))
        })
    }

    /// The host value, shared.
    pub fn literal_arc(&self) -> Arc<Literal> {
        self.literal();
        self.host.get().expect("assembled above").clone()
    }

    /// This array's allocations and its elements, apart, when it is their only owner (no
    /// clone of it, no device shards, no other holder of the host value; `None` otherwise, and
    /// the array is dropped, its clones keeping the value): a donated argument's buffer goes
    /// to the program's output pool and its [`Shell`] holds the next output (no allocation
    /// for either).
    pub fn into_shell(self) -> Option<(Shell, Data)> {
        if self.shards.is_some() {
            return None;
        }
        let mut host = self.host;
        let lit = Arc::get_mut(Arc::get_mut(&mut host)?.get_mut()?)?;
        let data = std::mem::replace(&mut lit.data, Data::F32(Vec::new()));
        Some((Shell(host), data))
    }

    /// [`Array::into_shell`] for an array placed on one device: its allocations and its
    /// shard's elements, apart, when it is their only owner (a host value read from it is
    /// dropped with it).
    pub fn into_placed_shell(self) -> Option<(PlacedShell, Data)> {
        let (_, mut shards) = self.shards?;
        let mut host = self.host;
        Arc::get_mut(&mut host)?.take();
        let lit = match &mut shards {
            Shards::One(one) => Arc::get_mut(one)?,
            Shards::Many(list) => {
                let [one] = Arc::get_mut(list)? else {
                    return None;
                };
                Arc::get_mut(one)?
            }
        };
        let data = std::mem::replace(&mut lit.data, Data::F32(Vec::new()));
        Some((PlacedShell { host, shards }, data))
    }

    /// [`Array::into_placed_shell`] for an array of several shards: when this is the only
    /// owner of its allocations (no clone, no other holder of a shard), each shard's elements
    /// go to `give(k, data)` (`k` its place in the list; a replicated array's one value once,
    /// at place 0) and the allocations come back as a [`ShardsShell`]; `None` otherwise (and
    /// nothing is given: the array is dropped, its clones keeping the value).
    pub fn into_shards_shell(self, mut give: impl FnMut(usize, Data)) -> Option<ShardsShell> {
        let (_, Shards::Many(mut list)) = self.shards? else {
            return None;
        };
        let mut host = self.host;
        // A host value read from it (a replicated array's is its first shard) is dropped.
        Arc::get_mut(&mut host)?.take();
        let slots = Arc::get_mut(&mut list)?;
        let n = slots.len();
        let replicated = n > 1 && slots[1..].iter().all(|s| Arc::ptr_eq(s, &slots[0]));
        if replicated {
            // Held by the list alone: as many references as places, none weak.
            if Arc::strong_count(&slots[0]) != n || Arc::weak_count(&slots[0]) != 0 {
                return None;
            }
            let empty = placeholder();
            for s in &mut slots[1..] {
                *s = empty.clone();
            }
            let lit = Arc::get_mut(&mut slots[0])?;
            give(0, std::mem::replace(&mut lit.data, Data::F32(Vec::new())));
        } else {
            if !slots.iter_mut().all(|s| Arc::get_mut(s).is_some()) {
                return None;
            }
            for (k, s) in slots.iter_mut().enumerate() {
                let lit = Arc::get_mut(s)?;
                give(k, std::mem::replace(&mut lit.data, Data::F32(Vec::new())));
            }
        }
        Some(ShardsShell {
            host,
            list,
            replicated,
        })
    }

    /// The block of `global` at `at` ((offset, size) per dim, inside it) as a value of its
    /// own: a process's part of a value, or a shard.
    pub fn copy_block(global: &Literal, at: &[(usize, usize)]) -> Result<Literal, String> {
        let dims = global.ty.dims();
        if at.len() != dims.len()
            || at
                .iter()
                .zip(dims)
                .any(|(&(o, s), &d)| o.checked_add(s).is_none_or(|end| end > d))
        {
            return Err(format!(
                "the block {at:?} does not lie inside a {}",
                global.ty
            ));
        }
        let ty = TensorType::new(
            global.ty.dtype,
            at.iter().map(|&(_, s)| s).collect::<Vec<_>>(),
        );
        let mut data = Data::zeros(ty.dtype, ty.numel());
        copy_shard(global, &mut data, &[], at, false);
        Ok(Literal { ty, data })
    }

    /// The global value of type `ty` from the shards of every position of `spec`.
    pub fn assemble(ty: &TensorType, spec: &ShardSpec, shards: &[Arc<Literal>]) -> Literal {
        let mut data = Data::zeros(ty.dtype, ty.numel());
        for (pos, s) in shards.iter().enumerate() {
            copy_shard(s, &mut data, ty.dims(), &spec.shard_range(ty, pos), true);
        }
        Literal {
            ty: ty.clone(),
            data,
        }
    }

    /// A stable identity of the value, for de-duplicating captured constants.
    pub fn buffer_id(&self) -> usize {
        Arc::as_ptr(&self.host) as usize
    }
}

impl From<Literal> for Array {
    fn from(literal: Literal) -> Array {
        Array::new(literal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block past the value, or whose end overflows, is an error, not a wrapped copy.
    #[test]
    fn blocks_outside_the_value_are_errors() {
        let v = Literal::new([2, 3], Data::F32(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0])).unwrap();
        let b = Array::copy_block(&v, &[(1, 1), (1, 2)]).unwrap();
        assert!(b.data.bits_eq(&Data::F32(vec![4.0, 5.0])));
        assert!(Array::copy_block(&v, &[(1, 2), (0, 3)]).is_err());
        assert!(Array::copy_block(&v, &[(usize::MAX, 2), (0, 3)]).is_err());
        assert!(
            Array::copy_block(&v, &[(0, 2)]).is_err(),
            "one range per dim"
        );
    }

    fn spec(split: bool) -> Arc<ShardSpec> {
        let dims = match split {
            true => vec![vec!["d".to_string()]],
            false => vec![vec![]],
        };
        // Every position on device 0: this process's on any machine (`fill` checks in debug
        // builds that the layout has as many local positions as the shell has shards).
        Arc::new(ShardSpec {
            mesh: Mesh::new("m", vec![("d".to_string(), 4)]),
            devices: vec![0; 4],
            dims,
        })
    }

    fn f32s(v: &[f32]) -> Literal {
        Literal::new([v.len()], Data::F32(v.to_vec())).unwrap()
    }

    /// A replicated array held alone gives its one value once, at place 0, and its shell
    /// holds the next value in every place; a split one gives each shard at its place. An
    /// array another holder shares (a clone, or one shard's `Arc`) gives nothing.
    #[test]
    fn arrays_of_several_shards_come_apart_only_when_held_alone() {
        let ty = TensorType::new(tessera_ir::DType::F32, vec![2]);
        let one = Arc::new(f32s(&[1.0, 2.0]));
        let replicated = Array::from_shards(ty.clone(), spec(false), vec![one; 4]);
        assert_eq!(
            replicated.literal().data.get_f64(1),
            2.0,
            "a host value read"
        );
        let mut given = Vec::new();
        let shell = replicated
            .into_shards_shell(|k, d| given.push((k, d.len())))
            .expect("held alone");
        assert_eq!(given, [(0, 2)]);
        assert_eq!(shell.layout(), (4, true));
        let filled = shell.fill(ty.clone(), spec(false), |_| f32s(&[3.0, 4.0]));
        let shards = filled.shards().unwrap();
        assert!(shards.iter().all(|s| Arc::ptr_eq(s, &shards[0])));
        assert_eq!(filled.literal().data.get_f64(0), 3.0);

        let wide = TensorType::new(tessera_ir::DType::F32, vec![8]);
        let parts = (0..4).map(|k| Arc::new(f32s(&[k as f32, 10.0 + k as f32])));
        let split = Array::from_shards(wide.clone(), spec(true), parts);
        let mut given = Vec::new();
        let shell = split
            .into_shards_shell(|k, d| given.push((k, d.len())))
            .expect("held alone");
        assert_eq!(given, [(0, 2), (1, 2), (2, 2), (3, 2)]);
        assert_eq!(shell.layout(), (4, false));
        let filled = shell.fill(wide.clone(), spec(true), |k| f32s(&[-(k as f32), 1.0]));
        assert_eq!(filled.literal().data.get_f64(4), -2.0);

        // Shared: by a clone of the array, or by one shard's `Arc`.
        let clone = filled.clone();
        let mut nothing = true;
        assert!(filled.into_shards_shell(|_, _| nothing = false).is_none());
        let shard = clone.shards().unwrap()[3].clone();
        assert!(clone.into_shards_shell(|_, _| nothing = false).is_none());
        assert!(nothing, "nothing given from a shared array");
        assert_eq!(shard.data.get_f64(0), -3.0, "the shard keeps its value");
    }
}
