//! Probes of the distributed API under `mpirun`, one per argument, each printing what the
//! tests check (`tests/mpirun.rs`):
//! - `interpreted`: the seed sharding program's losses on the interpreter backend;
//! - `local-data`: the same program fed by `make_array_from_process_local_data`, each process
//!   passing only its own rows;
//! - `gather`: a split array read through `process_allgather` and its local shards, and the
//!   error a direct read gets;
//! - `diverge`: process 1 traces another program; every process gets the error;
//! - `kill`: process 1 aborts after a step, the others go on stepping;
//! - `fail`: process 1 returns an error after a step, the others go on stepping;
//! - `bad`: a mesh larger than the global device count, a second `initialize`, a local batch
//!   that does not divide;
//! - `subset`: the seed program and a pmap on a mesh of half the devices (the processes that
//!   hold none of them get an error when they read the result);
//! - `order`: process 1 makes an exchange the others do not make first.
#![allow(clippy::duplicate_mod)]

use tessera::distributed::{
    self, make_array_from_process_local_data, process_allgather, process_count, process_index,
};
use tessera::prelude::*;

#[allow(dead_code)]
#[path = "../../../../examples/data_parallel_sharding.rs"]
mod sharding;

#[path = "../../../../examples/common/mlp.rs"]
mod mlp;
use mlp::{Mlp, init, seed_data, sgd_step};

/// The seed parameters replicated over `mesh` and the seed data split over its `dp` axis.
fn placed(mesh: &Mesh) -> (Mlp, Tensor, Tensor) {
    let params = device_put(init(Key::new(0), 10, 32, 1), NamedSharding::new(mesh, P![]));
    let (x, y) = seed_data(256);
    let data = NamedSharding::new(mesh, P!["dp"]);
    (params, device_put(x, &data), device_put(y, &data))
}

fn print_losses(losses: &[f32]) {
    for (i, l) in losses.iter().enumerate().step_by(10) {
        println!("Step {i}: Loss = {l:.6}");
    }
}

fn local_data() -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let (x, y) = seed_data(256);
    // This process's rows: the global batch is every process's, in process order.
    let rows = 256 / process_count();
    let mine = |t: &Tensor| t.index(s![process_index() * rows..(process_index() + 1) * rows]);
    let (lx, ly) = (mine(&x), mine(&y));
    let gx = make_array_from_process_local_data(&data, &lx)?;
    let gy = make_array_from_process_local_data(&data, &ly)?;
    println!(
        "global x: {:?} {}",
        gx.shape(),
        gx.sharding().expect("placed")
    );
    let mut params = device_put(
        init(Key::new(0), 10, 32, 1),
        NamedSharding::new(&mesh, P![]),
    );
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("probe_step");
    let mut losses = Vec::new();
    for _ in 0..41 {
        let (p, l) = step.call((params, gx.clone(), gy.clone()))?;
        params = p;
        losses.push(l.item::<f32>());
    }
    print_losses(&losses);
    Ok(())
}

fn gather() -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let (x, _) = seed_data(256);
    let placed = device_put(x.clone(), NamedSharding::new(&mesh, P!["dp"]));
    let whole = process_allgather(&placed)?;
    println!(
        "allgather equal: {}",
        whole.to_vec::<f32>() == x.to_vec::<f32>()
    );
    let doubled = jit(|x: Tensor| x * 2.0).call(placed.clone())?;
    let whole = process_allgather(&doubled)?;
    let want: Vec<f32> = x.to_vec::<f32>().iter().map(|v| v * 2.0).collect();
    println!(
        "allgather of a jit output equal: {}",
        whole.to_vec::<f32>() == want
    );
    let shards = placed.try_array()?.shards().map_or(0, |s| s.len());
    println!("local shards: {shards}");
    let path = std::env::temp_dir().join(format!("probe-{}.safetensors", process_index()));
    match tessera::checkpoint::save(&doubled, &path) {
        Ok(()) => println!("save: ok"),
        Err(e) => println!("save: ERROR {e}"),
    }
    // A jit output has no host value: its other shards are on the other processes.
    match doubled.try_to_vec::<f32>() {
        Ok(_) => println!("direct read: ok"),
        Err(e) => println!("direct read: ERROR {e}"),
    }
    Ok(())
}

fn diverge() -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let x = device_put(
        Tensor::ones([8 * 4, 3]),
        NamedSharding::new(&mesh, P!["dp"]),
    );
    let r = if process_index() == 1 {
        jit(|x: Tensor| (x * 3.0).sum()).named("diverging").call(x)
    } else {
        jit(|x: Tensor| x.sum()).named("diverging").call(x)
    };
    match r {
        Ok(v) => println!("diverge: no error ({})", v.item::<f32>()),
        Err(e) => println!("diverge: ERROR {e}"),
    }
    Ok(())
}

/// Process 1 stops after one step (`abort` or an error); the others step on until the
/// failure reaches them.
fn stop(abort: bool) -> Result<()> {
    let (mut params, x, y) = placed(&Mesh::new([device_count()], ["dp"]));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("probe_step");
    for i in 0..1000 {
        if i == 1 && process_index() == 1 {
            if abort {
                std::process::abort();
            }
            return Err(Error::Config("process 1 gives up".into()));
        }
        match step.call((params, x.clone(), y.clone())) {
            Ok((p, _)) => params = p,
            Err(e) => {
                println!("step {i}: ERROR {e}");
                return Err(e);
            }
        }
    }
    println!("no error in 1000 steps");
    Ok(())
}

fn bad() -> Result<()> {
    let n = device_count();
    match Mesh::try_new(&[n + 1], &["dp"]) {
        Ok(_) => println!("mesh: no error"),
        Err(e) => println!("mesh: ERROR {e}"),
    }
    match distributed::initialize() {
        Ok(()) => println!("initialize: no error"),
        Err(e) => println!("initialize: ERROR {e}"),
    }
    let mesh = Mesh::new([n], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    // Every process's devices hold n / processes shards of the batch; 3 rows do not divide.
    match make_array_from_process_local_data(&data, &Tensor::ones([3, 2])) {
        Ok(t) => println!("local data: no error ({:?})", t.shape()),
        Err(e) => println!("local data: ERROR {e}"),
    }
    // Process 1 passes a batch that does not divide, the others one that does: the parts
    // are compared first, so every process gets the same error (none waits for the others).
    let rows = if process_index() == 1 {
        3
    } else {
        4 * tessera::local_device_count()
    };
    match make_array_from_process_local_data(&data, &Tensor::ones([rows, 2])) {
        Ok(t) => println!("uneven: no error ({:?})", t.shape()),
        Err(e) => println!("uneven: ERROR {e}"),
    }
    // Process 1 passes another shape.
    let rows = if process_index() == 1 { 8 } else { 4 } * tessera::local_device_count();
    match make_array_from_process_local_data(&data, &Tensor::ones([rows, 2])) {
        Ok(t) => println!("shapes: no error ({:?})", t.shape()),
        Err(e) => println!("shapes: ERROR {e}"),
    }
    Ok(())
}

fn subset() -> Result<()> {
    let half = device_count() / 2;
    let (mut params, x, y) = placed(&Mesh::new([half], ["dp"]));
    let step = jit(|(p, x, y): (Mlp, Tensor, Tensor)| sgd_step(p, x, y)).named("subset_step");
    let mut losses = Vec::new();
    for _ in 0..41 {
        let (p, l) = step.call((params, x.clone(), y.clone()))?;
        params = p;
        match l.try_to_vec::<f32>() {
            Ok(v) => losses.push(v[0]),
            Err(e) => {
                println!("subset: ERROR {e}");
                break;
            }
        }
    }
    print_losses(&losses);
    // The split value gathered: between the processes that hold it (point to point); an
    // error, without an exchange, on the others.
    let whole =
        process_allgather(&x).map(|w| w.to_vec::<f32>() == seed_data(256).0.to_vec::<f32>());
    match whole {
        Ok(same) => println!("allgather: equal {same}"),
        Err(e) => println!("allgather: ERROR {e}"),
    }
    let doubled = pmap("i", |x: Tensor| x * 2.0).call(Tensor::ones([half, 3]));
    match doubled {
        Ok(t) => println!("pmap: {:?}", t.to_vec::<f32>().len()),
        Err(e) => println!("pmap: ERROR {e}"),
    }
    Ok(())
}

fn order() -> Result<()> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let x = device_put(
        Tensor::ones([device_count(), 3]),
        NamedSharding::new(&mesh, P!["dp"]),
    );
    if process_index() == 1
        && let Err(e) = process_allgather(&x.clone())
    {
        println!("order: ERROR {e}");
    }
    match jit(|x: Tensor| x.sum()).call(x) {
        Ok(v) => println!("order: no error ({})", v.item::<f32>()),
        Err(e) => println!("order: ERROR {e}"),
    }
    Ok(())
}

fn main() -> Result<()> {
    let what = std::env::args().nth(1).unwrap_or_default();
    if what != "bad" {
        distributed::initialize()?;
    }
    println!(
        "process {} of {}, devices {} ({} local)",
        process_index(),
        process_count(),
        device_count(),
        tessera::local_device_count()
    );
    match what.as_str() {
        "interpreted" => {
            let (losses, _, _) = sharding::train(41, Backend::Interpreter)?;
            print_losses(&losses);
            Ok(())
        }
        "local-data" => local_data(),
        "gather" => gather(),
        "diverge" => diverge(),
        "kill" => stop(true),
        "fail" => stop(false),
        "bad" => bad(),
        "subset" => subset(),
        "order" => order(),
        other => Err(Error::Config(format!("probe: unknown probe {other:?}"))),
    }
}
