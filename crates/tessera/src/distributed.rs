//! Several processes as one program, as `jax.distributed`: under `mpirun` (with the `mpi`
//! feature) every process contributes `TESSERA_DEVICES` devices to one global device list,
//! ordered by (process, local device) as `jax.devices()` is, and `jit` and `pmap` run SPMD:
//! every process traces the same program and runs its own devices' shards, the collectives
//! meeting over shared memory inside a process and through MPI between processes
//! (`tessera_runtime::spanning`; `docs/DISTRIBUTED.md`).
//!
//! - `initialize()` joins the processes; a `Mesh`, `pmap` or `device_count()` under `mpirun`
//!   does it on first use, so the seed programs run unchanged. Without `mpirun` it is one
//!   process (index 0 of 1): the same program runs alone.
//! - Each process holds only its own devices' shards of an array (`Array::shards`); a
//!   replicated value reads on every process, a split one through `process_allgather` (every
//!   process calls it) or its local shards. `make_array_from_process_local_data` builds a
//!   global array from each process's part (JAX's function of that name).
//! - Compiling a program over several processes compares a hash of it between them: a
//!   program that differs by rank is an error naming the first differing line of its IR, on
//!   every process, instead of collectives that never match.

use std::panic::Location;
use std::sync::OnceLock;

use tessera_ir::{Graph, Literal, TensorType};
use tessera_runtime::process::{link, processes_of};
use tessera_runtime::{Array, ShardSpec, collective_timeout, try_local_device_count};

use crate::error::{Error, Result, loc_text};
use crate::sharding::NamedSharding;
use crate::tensor::Tensor;

/// How the processes were started: `Ok` once (joined, or one process alone).
static STARTED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// The number of processes a launcher started (Open MPI's `mpirun`, or one that sets PMI's
/// `PMI_SIZE`), when it says so.
fn launched_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// How a process starts: alone, joined to the others through MPI, or refused.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    Alone,
    Join,
    Refuse(String),
}

/// `launched`: the launcher's process count; `mpi`: whether the `mpi` feature is built in.
/// One process (no launcher, or `mpirun -np 1`) runs alone either way.
fn plan(launched: Option<usize>, mpi: bool) -> Start {
    match launched {
        Some(n) if n > 1 && mpi => Start::Join,
        Some(n) if n > 1 => Start::Refuse(format!(
            "this process is one of {n} a launcher (mpirun) started, but tessera was built \
             without its `mpi` feature, so each would run alone: build with --features mpi"
        )),
        _ => Start::Alone,
    }
}

fn start() -> std::result::Result<(), String> {
    match plan(launched_size(), cfg!(feature = "mpi")) {
        Start::Alone => Ok(()),
        Start::Refuse(why) => Err(why),
        Start::Join => join(),
    }
}

#[cfg(feature = "mpi")]
fn join() -> std::result::Result<(), String> {
    let local = try_local_device_count()?;
    let timeout = collective_timeout()?;
    let link = tessera_mpi::initialize(local, timeout)?;
    tessera_runtime::process::join(Box::new(link))
}

#[cfg(not(feature = "mpi"))]
fn join() -> std::result::Result<(), String> {
    Err("tessera was built without its `mpi` feature".into())
}

/// `jax.distributed.initialize()`: joins this process to the others `mpirun` started (rank
/// and size from MPI; every process must have the same `TESSERA_DEVICES`). Without `mpirun`
/// the program is one process, index 0 of 1. Call it before any `Mesh`, `pmap` or
/// `device_count()` (they initialize on first use when it was not called); a second call, or
/// one after them, is an error naming the caller.
#[track_caller]
pub fn initialize() -> Result<()> {
    let location = loc_text(Location::caller());
    let mut first = false;
    let started = STARTED.get_or_init(|| {
        first = true;
        start()
    });
    let fail = |message: String| Error::Op {
        op: "distributed::initialize".into(),
        message,
        location: location.clone(),
    };
    if !first {
        return Err(fail(
            "called twice (or after a Mesh, pmap or device_count() initialized the processes)"
                .into(),
        ));
    }
    started.clone().map_err(fail)
}

/// Initializes on first use (a `Mesh`, `pmap`, `device_count()`), as `initialize` does.
pub(crate) fn auto() -> std::result::Result<(), String> {
    STARTED.get_or_init(start).clone()
}

/// This process's index, `jax.process_index()` (0 in a one-process run). Initializes on
/// first use, as a `Mesh` does (a failure to join shows in the next `Mesh` or `initialize`).
pub fn process_index() -> usize {
    let _ = auto();
    tessera_runtime::process_index()
}

/// The number of processes, `jax.process_count()`. Initializes on first use, as
/// `process_index` does.
pub fn process_count() -> usize {
    let _ = auto();
    tessera_runtime::process_count()
}

/// The number of devices over all processes, `jax.device_count()`.
///
/// # Panics
/// When `TESSERA_DEVICES` is not a positive integer, or joining the processes fails, with the
/// reason and the caller's line.
#[track_caller]
pub fn device_count() -> usize {
    match auto().and_then(|()| tessera_runtime::try_device_count()) {
        Ok(n) => n,
        Err(e) => panic!("{e}, at {}", Location::caller()),
    }
}

/// This process's devices, `jax.local_device_count()`.
///
/// # Panics
/// As `device_count`.
#[track_caller]
pub fn local_device_count() -> usize {
    match auto().and_then(|()| try_local_device_count()) {
        Ok(n) => n,
        Err(e) => panic!("{e}, at {}", Location::caller()),
    }
}

/// A 64-bit FNV-1a hash.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Every process of `processes`'s `mine`, through the link, in process order.
fn gather(processes: &[usize], mine: &[u8], what: &str) -> std::result::Result<Vec<u8>, String> {
    let link = link().ok_or("no link between processes")?;
    let timeout = collective_timeout()?;
    link.all_gather(processes, mine.to_vec(), timeout)
        .map_err(|e| format!("{what}: {e}"))
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Checks that every process holding devices of a mesh over `devices` compiles the same
/// per-device program `graph` (`name`'s): a hash of its IR text is compared, and when they
/// differ, the texts, naming the first differing line. Every process gets the same error.
pub(crate) fn check_same_program(
    name: &str,
    graph: &Graph,
    devices: &[usize],
    location: &str,
) -> Result<()> {
    let processes = processes_of(devices);
    if link().is_none() || processes.len() < 2 || !processes.contains(&process_index()) {
        return Ok(());
    }
    let fail = |message: String| Error::Op {
        op: name.to_string(),
        message,
        location: location.to_string(),
    };
    let text = tessera_ir::print::print(graph);
    let mine = bytes_of(&[
        0x5445_5353_4552_4131,
        fnv(text.as_bytes()),
        text.len() as u64,
    ]);
    let all =
        words(&gather(&processes, &mine, "comparing the program between processes").map_err(fail)?);
    let rows: Vec<&[u64]> = all.chunks_exact(3).collect();
    if rows.iter().all(|r| r == &rows[0]) {
        return Ok(());
    }
    let longest = rows.iter().map(|r| r[2]).max().unwrap_or(0) as usize;
    let mut padded = text.into_bytes();
    padded.resize(longest, 0);
    let texts = gather(
        &processes,
        &padded,
        "comparing the program between processes",
    )
    .map_err(fail)?;
    let texts: Vec<String> = texts
        .chunks_exact(longest.max(1))
        .zip(&rows)
        .map(|(t, r)| String::from_utf8_lossy(&t[..(r[2] as usize).min(t.len())]).into_owned())
        .collect();
    let k = rows
        .iter()
        .position(|r| r != &rows[0])
        .expect("two rows differ");
    let (a, b) = (
        texts[0].lines().collect::<Vec<_>>(),
        texts[k].lines().collect::<Vec<_>>(),
    );
    let line = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(0);
    let show = |l: Option<&&str>| l.map_or("(the end)".to_string(), |l| format!("`{}`", l.trim()));
    Err(fail(format!(
        "the program differs between processes {} and {} (each must trace the same program): \
         first at line {} of its IR, process {} has {} where process {} has {}",
        processes[0],
        processes[k],
        line + 1,
        processes[0],
        show(a.get(line)),
        processes[k],
        show(b.get(line)),
    )))
}

/// Every mesh position's outputs from each process's (`local[k]`: the outputs of its `k`-th
/// local position), the same on every process: `pmap` returns host values, as on one process.
pub(crate) fn gather_positions(
    devices: &[usize],
    local: Vec<Vec<Option<Literal>>>,
) -> Result<Vec<Vec<Option<Literal>>>> {
    let fail = |message: String| Error::Device(format!("pmap: gathering the outputs: {message}"));
    if local.is_empty() {
        return Err(fail(format!(
            "this process (index {}) holds none of the {} devices the pmap maps over: map \
             over devices of every process (device_count())",
            process_index(),
            devices.len()
        )));
    }
    // One process: nothing to gather, and nothing allocated (a pmap step's count,
    // tests/allocations.rs).
    if link().is_none() {
        return Ok(local);
    }
    let processes = processes_of(devices);
    if processes.len() < 2 {
        return Ok(local);
    }
    let types: Vec<TensorType> = local
        .first()
        .ok_or_else(|| fail("this process runs none of the devices".into()))?
        .iter()
        .map(|o| o.as_ref().map(|l| l.ty.clone()))
        .collect::<Option<_>>()
        .ok_or_else(|| fail("an output was not computed".into()))?;
    let per_position: usize = types.iter().map(TensorType::byte_size).sum();
    let owner = |p: usize| tessera_runtime::process::process_of(devices[p]);
    let most = processes
        .iter()
        .map(|&q| (0..devices.len()).filter(|&p| owner(p) == q).count())
        .max()
        .unwrap_or(0);
    let mut mine = bytes_of(&[0x5445_5353_4552_4132, per_position as u64]);
    for outs in &local {
        for o in outs {
            let o = o
                .as_ref()
                .ok_or_else(|| fail("an output was not computed".into()))?;
            tessera_runtime::append_bytes(o, &mut mine);
        }
    }
    let block = 16 + most * per_position;
    mine.resize(block, 0);
    let all = gather(&processes, &mine, "pmap's outputs").map_err(fail)?;
    let mut out: Vec<Vec<Option<Literal>>> = vec![Vec::new(); devices.len()];
    for (theirs, &q) in all.chunks_exact(block).zip(&processes) {
        if theirs[..16] != mine[..16] {
            return Err(fail(format!("process {q} returned other outputs")));
        }
        let mut at = 16;
        for p in (0..devices.len()).filter(|&p| owner(p) == q) {
            for ty in &types {
                let v = tessera_runtime::from_bytes(ty, &theirs[at..at + ty.byte_size()])
                    .ok_or_else(|| fail(format!("a {ty} of the wrong size")))?;
                at += ty.byte_size();
                out[p].push(Some(v));
            }
        }
    }
    Ok(out)
}

/// The array of `sharding` whose process-local part is `local` on every process, as JAX's
/// `make_array_from_process_local_data`: along each dim split over devices of several
/// processes, the global size is the local size times the number of shards over the local
/// size's (the process's batch, concatenated with the others' in process order). Every
/// process must pass the same local shape; a local size that the process's shards do not
/// divide is an error on every process.
#[track_caller]
pub fn make_array_from_process_local_data(
    sharding: &NamedSharding,
    local: &Tensor,
) -> Result<Tensor> {
    let location = loc_text(Location::caller());
    let fail = |message: String| Error::Op {
        op: "make_array_from_process_local_data".into(),
        message,
        location: location.clone(),
    };
    auto().map_err(fail)?;
    let array = local.try_array()?;
    let value = array.try_literal().map_err(fail)?;
    let ty = value.ty.clone();
    let dims = sharding.dims(ty.rank()).map_err(fail)?;
    let mesh = &sharding.mesh;
    let devices = mesh.devices().to_vec();
    let positions = tessera_runtime::local_positions(&devices);
    // The shard index of each position along each dim, from a mesh of unit shards.
    let n_shards: Vec<usize> = dims
        .iter()
        .map(|axes| {
            axes.iter()
                .map(|a| mesh.ir.axis_size(a).unwrap_or(1))
                .product::<usize>()
        })
        .collect();
    let unit: Vec<usize> = n_shards.clone();
    let index_of = |p: usize| -> Vec<usize> {
        mesh.ir
            .shard_range(&unit, &dims, p)
            .iter()
            .map(|&(o, _)| o)
            .collect()
    };
    if positions.is_empty() {
        return Err(fail(format!(
            "this process (index {}) holds none of the sharding's devices",
            process_index()
        )));
    }
    // The shards of each dim this process holds (their indices along it), and whether they
    // are contiguous (the local part is then one block of the global value).
    let held: Vec<Vec<usize>> = (0..ty.rank())
        .map(|d| {
            let mut mine: Vec<usize> = positions.iter().map(|&p| index_of(p)[d]).collect();
            mine.sort_unstable();
            mine.dedup();
            mine
        })
        .collect();
    let contiguous = held.iter().all(|h| h.windows(2).all(|w| w[1] == w[0] + 1));
    // What every process checks, alike: the local type, the shard counts, contiguity. The
    // rows are compared between the processes first, so a mismatch is an error on every one.
    let mut row = vec![ty.dtype as u64, ty.rank() as u64, u64::from(contiguous)];
    row.extend(ty.dims().iter().map(|&d| d as u64));
    row.extend(held.iter().map(|h| h.len() as u64));
    let processes = processes_of(&devices);
    if link().is_some() && processes.len() > 1 {
        let all =
            words(&gather(&processes, &bytes_of(&row), "comparing the local parts").map_err(fail)?);
        if let Some(k) = all
            .chunks_exact(row.len())
            .position(|r| r != row.as_slice())
        {
            return Err(fail(format!(
                "process {} passes a {ty} holding {:?} shards where process {} passes another \
                 shape or holds other shards (every process must pass the same local shape)",
                process_index(),
                held.iter().map(Vec::len).collect::<Vec<_>>(),
                processes[k]
            )));
        }
    }
    if !contiguous {
        return Err(fail(format!(
            "this process's devices hold the shards {held:?} of the dims, not one block: \
             order the mesh's devices so that each process's are adjacent"
        )));
    }
    let mut global = Vec::with_capacity(ty.rank());
    for (d, ((&size, &shards), h)) in ty.dims().iter().zip(&n_shards).zip(&held).enumerate() {
        let c = h.len().max(1);
        if size % c != 0 {
            return Err(fail(format!(
                "dim {d} of the local {ty} holds {c} shards of this process's devices, and \
                 {size} does not divide into {c}"
            )));
        }
        global.push(size / c * shards);
    }
    let global_ty = TensorType::new(ty.dtype, global);
    tessera_shard::check_spec(&mesh.ir, &global_ty, &dims)
        .map_err(|e| fail(format!("{global_ty} on {sharding}: {e}")))?;
    let spec = ShardSpec {
        mesh: mesh.ir.clone(),
        devices,
        dims: dims.clone(),
    };
    let shard_ty = spec.local_type(&global_ty);
    let shards = positions
        .iter()
        .map(|&p| {
            let at: Vec<(usize, usize)> = index_of(p)
                .iter()
                .enumerate()
                .map(|(d, &i)| {
                    let j = held[d].binary_search(&i).expect("a held shard");
                    (j * shard_ty.dims()[d], shard_ty.dims()[d])
                })
                .collect();
            Array::copy_block(value, &at).map(std::sync::Arc::new)
        })
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(fail)?;
    Ok(Tensor::from_array(Array::from_shards(
        global_ty, spec, shards,
    )))
}

/// The whole value of `x` on every process, its shards gathered from the processes that hold
/// them (`jax.experimental.multihost_utils.process_allgather` with `tiled=True`). Every
/// process must call it at the same point. A value this process can read already is returned
/// as it is, with no exchange.
#[track_caller]
pub fn process_allgather(x: &Tensor) -> Result<Tensor> {
    let location = loc_text(Location::caller());
    let fail = |message: String| Error::Op {
        op: "process_allgather".into(),
        message,
        location: location.clone(),
    };
    let array = x.try_array()?;
    let Some(spec) = array.spec() else {
        return Ok(x.clone());
    };
    let processes = processes_of(&spec.devices);
    if link().is_none()
        || processes.len() < 2
        || (array.is_fully_addressable() && spec.is_replicated())
    {
        return Ok(Tensor::from_literal(
            array.try_literal().map_err(fail)?.clone(),
        ));
    }
    if !processes.contains(&process_index()) {
        return Err(fail(format!(
            "this process (index {}) holds none of the value's devices: the processes \
             {processes:?} that do gather it",
            process_index()
        )));
    }
    let shard_ty = spec.local_type(array.ty());
    let size = shard_ty.byte_size();
    let owner = |p: usize| tessera_runtime::process::process_of(spec.devices[p]);
    let most = processes
        .iter()
        .map(|&q| (0..spec.devices.len()).filter(|&p| owner(p) == q).count())
        .max()
        .unwrap_or(0);
    let mut mine = bytes_of(&[0x5445_5353_4552_4133, size as u64]);
    for s in array.shards().unwrap_or(&[]) {
        tessera_runtime::append_bytes(s, &mut mine);
    }
    let block = 16 + most * size;
    mine.resize(block, 0);
    let all = gather(&processes, &mine, "process_allgather").map_err(fail)?;
    let mut shards = vec![None; spec.devices.len()];
    for (theirs, &q) in all.chunks_exact(block).zip(&processes) {
        if theirs[..16] != mine[..16] {
            return Err(fail(format!("process {q} gathers another value")));
        }
        for (j, p) in (0..spec.devices.len())
            .filter(|&p| owner(p) == q)
            .enumerate()
        {
            let at = 16 + j * size;
            shards[p] = tessera_runtime::from_bytes(&shard_ty, &theirs[at..at + size])
                .map(std::sync::Arc::new);
        }
    }
    let shards: Vec<_> = shards
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| fail("a shard is missing".into()))?;
    let whole = Array::assemble(array.ty(), spec, &shards);
    Ok(Tensor::from_literal(whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start-up decision for every launcher and build: one process runs alone with or
    /// without the feature; several join with it and are refused without it.
    #[test]
    fn processes_join_only_when_several_run_with_the_mpi_feature() {
        assert_eq!(plan(None, false), Start::Alone);
        assert_eq!(plan(None, true), Start::Alone);
        assert_eq!(plan(Some(1), false), Start::Alone);
        assert_eq!(plan(Some(1), true), Start::Alone);
        assert_eq!(plan(Some(2), true), Start::Join);
        match plan(Some(4), false) {
            Start::Refuse(m) => assert!(
                m.contains("one of 4") && m.contains("--features mpi"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
