//! Calls from the workers of rayon's global pool. Tessera uses that pool itself (GEMMs and
//! kernels split over the cores), so a call made by a worker must not wait on work it queued
//! there: with every worker in a call, nothing would run it. A device thread's shared product
//! (one GEMM for all the devices, `tessera_runtime::shared_gemm`) once did: the caller held the
//! launch and waited for the device threads, the other workers waited for the launch, and the
//! elected device thread waited for the pool to multiply, forever.

use std::sync::mpsc;
use std::time::Duration;

use rayon::prelude::*;
use tessera::prelude::*;

/// Every worker of the global pool runs a sharded product over 2 devices (not more than the
/// cores of a 2-core machine, so a launch on the device threads) with a replicated weight
/// large enough to be multiplied once for both devices. Each result is the one-device product.
#[test]
fn every_pool_worker_runs_a_sharded_product_at_once() {
    // SAFETY: the first thing this test binary does (it has no other test), before any
    // device or pool thread starts.
    unsafe { std::env::set_var("TESSERA_DEVICES", "2") };
    let shared_before = tessera_runtime::shared_gemm_count();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let workers = rayon::current_num_threads();
        let results: Vec<Result<(Vec<f32>, Vec<f32>)>> = (0..workers.max(2))
            .into_par_iter()
            .map(|s| {
                let mesh = Mesh::new([2], ["dp"]);
                let x = random::normal(&Key::new(s as i64), [512, 256]);
                let w = random::normal(&Key::new(9), [256, 256]);
                let want = x.matmul(&w).to_vec::<f32>();
                let xs = device_put(x, NamedSharding::new(&mesh, P!["dp"]));
                let ws = device_put(w, NamedSharding::new(&mesh, P![]));
                let got = jit(|(x, w): (Tensor, Tensor)| x.matmul(&w)).call((xs, ws))?;
                Ok((got.to_vec::<f32>(), want))
            })
            .collect();
        let _ = tx.send(results);
    });
    let results = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the calls from the pool's workers finished within 120 s");
    // With a core per device the devices ran on their threads and shared the products: the
    // path the fix is on. (With one core they run in turn on the caller's thread instead,
    // `spmd::one_thread_pays`, and the shared-memory products are not used.)
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let shared = tessera_runtime::shared_gemm_count() - shared_before;
    if cores >= 2 {
        assert!(shared >= 2, "{shared} shared products on {cores} cores");
    } else {
        eprintln!("one core: the devices ran on the calling thread, {shared} shared products");
    }
    for r in results {
        let (got, want) = r.expect("each call succeeds");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "{g} against {w}");
        }
    }
}
