//! `together::run_together`: several devices' programs on one thread, paused at their
//! collectives, give the bits of the same programs on threads of their own meeting through the
//! shared-memory transport, for every kind of collective; and a failure leaves the programs fit
//! for the next run.

use std::time::Duration;

use tessera_codegen::together::{Failed, run_together};
use tessera_ir::{Data, Literal, parse};
use tessera_runtime::{Rendezvous, SharedCollectives};

/// Every collective on a 2x2 mesh, each result an output; a small (one-meeting) and a large
/// (in-place) all-reduce; an `axis_index` (no meeting) and a region-free program.
const PROGRAM: &str = r#"mesh @mesh = <"a"=2, "b"=2>
func @f(%0: f32[4,8], %1: f32[20000]) {
  %2 = tanh %0 : f32[4,8]
  %3 = all_reduce %2 sum axes=["a", "b"] : f32[4,8]
  %4 = all_gather %2 dim=0 axes=["b"] : f32[8,8]
  %5 = reduce_scatter %2 sum dim=1 axes=["a"] : f32[4,4]
  %6 = all_to_all %2 split_dim=0 concat_dim=1 axes=["a", "b"] : f32[1,32]
  %7 = collective_permute %2 axes=["a", "b"] pairs=[[0,1],[1,2],[2,3],[3,0]] : f32[4,8]
  %8 = axis_index axes=["a", "b"] : i32[]
  %9 = all_reduce %1 max axes=["a"] : f32[20000]
  %10 = exp %3 : f32[4,8]
  return %3, %4, %5, %6, %7, %8, %9, %10
}"#;

fn inputs(p: usize) -> Vec<Literal> {
    let x: Vec<f32> = (0..32)
        .map(|i| ((i * 7 + p * 13) % 17) as f32 * 0.1 - 0.8)
        .collect();
    let y: Vec<f32> = (0..20000)
        .map(|i| ((i + p * 101) % 977) as f32 * 1e-3)
        .collect();
    vec![
        Literal::new([4, 8], Data::F32(x)).unwrap(),
        Literal::new([20000], Data::F32(y)).unwrap(),
    ]
}

fn bits(outs: &[Option<Literal>]) -> Vec<Vec<u64>> {
    outs.iter()
        .map(|o| {
            let o = o.as_ref().expect("every output computed");
            (0..o.data.len())
                .map(|i| o.data.get_f64(i).to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn one_thread_gives_the_bits_of_a_thread_per_device() {
    let exe = tessera_codegen::compile(&parse(PROGRAM).unwrap())
        .unwrap()
        .single_threaded();
    assert!(exe.pauses_at_collectives());
    let forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let ins: Vec<Vec<Literal>> = (0..4).map(inputs).collect();
    // Threads meeting through the rendezvous.
    let r = Rendezvous::with_timeout(Duration::from_secs(10));
    let ids = [0, 1, 2, 3];
    let (forks, threaded): (Vec<_>, Vec<Vec<Option<Literal>>>) = std::thread::scope(|s| {
        let hs: Vec<_> = forks
            .into_iter()
            .enumerate()
            .map(|(p, f)| {
                let (r, ids, ins) = (&r, &ids, &ins);
                s.spawn(move || {
                    let c = SharedCollectives::new(r, 0, p, ids);
                    let refs: Vec<&Literal> = ins[p].iter().collect();
                    let out = f.run_partial(&refs, &c).unwrap();
                    (f, out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).unzip()
    });
    let mut forks = forks;
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    let refs: Vec<Vec<&Literal>> = ins.iter().map(|i| i.iter().collect()).collect();
    for round in 0..2 {
        let together = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
        for p in 0..4 {
            assert_eq!(
                bits(&together[p]),
                bits(&threaded[p]),
                "device {p}, round {round}"
            );
        }
    }
    // The axis index is each device's own.
    let together = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
    for (p, outs) in together.iter().enumerate() {
        assert_eq!(outs[5].as_ref().unwrap().data.get_f64(0), p as f64);
    }
}

#[test]
fn a_failure_names_the_device_and_the_programs_run_again() {
    let exe = tessera_codegen::compile(&parse(PROGRAM).unwrap())
        .unwrap()
        .single_threaded();
    let mut forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    let ins: Vec<Vec<Literal>> = (0..4).map(inputs).collect();
    let mut refs: Vec<Vec<&Literal>> = ins.iter().map(|i| i.iter().collect()).collect();
    // Device 2 given an input of the wrong type: its start fails, the others' runs are dropped.
    let wrong = Literal::new([3], Data::F32(vec![0.0; 3])).unwrap();
    refs[2][0] = &wrong;
    let failed = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap_err();
    assert!(
        matches!(failed, Failed::Error { device: 2, .. }),
        "{failed:?}"
    );
    // A group naming a position no program runs is an error, not a read.
    refs[2][0] = &ins[2][0];
    let missing = run_together(&mut programs[..3], &refs[..3], &[0, 1, 2]).unwrap_err();
    assert!(
        matches!(&missing, Failed::Error { error, .. } if error.to_string().contains("mesh position 3")),
        "{missing:?}"
    );
    // Two devices at one position, or one off the mesh, are errors (an in-place all-reduce
    // would otherwise leave a device out of every group, its result never written).
    let twice = run_together(&mut programs, &refs, &[0, 1, 0, 1]).unwrap_err();
    assert!(
        matches!(&twice, Failed::Error { device: 2, error } if error.to_string().contains("two devices at mesh position 0")),
        "{twice:?}"
    );
    let off = run_together(&mut programs, &refs, &[0, 1, 2, 4]).unwrap_err();
    assert!(
        matches!(&off, Failed::Error { device: 3, error } if error.to_string().contains("off a mesh of 4")),
        "{off:?}"
    );
    // Mismatched lists and no devices at all are answers, not panics.
    assert!(run_together(&mut programs[..2], &refs[..3], &[0, 1]).is_err());
    assert!(run_together(&mut [], &[], &[]).unwrap().is_empty());
    // And every program runs again.
    let ok = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
    assert_eq!(ok.len(), 4);
}

/// A replicated weight times each device's rows (stacked by rows), and a weight gradient
/// summed over the devices (stacked along the contraction), both large enough to be offered
/// to the transport's shared products (`Executable::single_threaded`); and a GEMM and a
/// kernel of each device's own, large enough for both cores when the devices run in turn
/// (64 x 64 x 256 multiply-adds; 65,536 elements).
const PRODUCTS: &str = r#"mesh @mesh = <"dp"=4>
func @f(%0: f32[64,256], %1: f32[256,256]) {
  %2 = dot_general %0, %1 contracting=[1]x[0] : f32[64,256]
  %3 = tanh %2 : f32[64,256]
  %4 = dot_general %0, %3 contracting=[0]x[0] : f32[256,256]
  %5 = all_reduce %4 sum axes=["dp"] : f32[256,256]
  %6 = tanh %5 : f32[256,256]
  %7 = dot_general %3, %3 contracting=[1]x[1] : f32[64,64]
  return %3, %6, %7
}"#;

fn matrix(rows: usize, cols: usize, seed: usize) -> Literal {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 31 + seed * 17) % 101) as f32 * 0.01 - 0.5)
        .collect();
    Literal::new([rows, cols], Data::F32(v)).unwrap()
}

/// Runs `exe`'s forks on threads meeting through the shared-memory transport; `refs[p]` are
/// device `p`'s inputs.
fn threaded(
    exe: &tessera_codegen::Executable,
    refs: &[Vec<&Literal>],
) -> Vec<Vec<Option<Literal>>> {
    let r = Rendezvous::with_timeout(Duration::from_secs(10));
    let ids = [0, 1, 2, 3];
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|p| {
                let (r, ids, f) = (&r, &ids, exe.fork());
                let ins = &refs[p];
                s.spawn(move || {
                    let c = SharedCollectives::new(r, 0, p, ids);
                    f.run_partial(ins, &c).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The tests that count products (process-wide counters) one at a time.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn shared_products_on_one_thread_give_the_bits_of_the_threaded_transport() {
    let _one = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let exe = tessera_codegen::compile(&parse(PRODUCTS).unwrap())
        .unwrap()
        .single_threaded();
    assert_eq!(
        exe.unshared_multiply_adds(),
        64 * 64 * 256,
        "both large products are shared, the third is each device's"
    );
    let xs: Vec<Literal> = (0..4).map(|p| matrix(64, 256, p)).collect();
    let w = matrix(256, 256, 9);
    // One weight buffer for every device (a replicated parameter): both products stack.
    let refs: Vec<Vec<&Literal>> = xs.iter().map(|x| vec![x, &w]).collect();
    let before = tessera_runtime::shared_gemm_count();
    let want = threaded(&exe, &refs);
    assert!(tessera_runtime::shared_gemm_count() >= before + 2);
    let mut forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    for round in 0..2 {
        let before = tessera_codegen::together::products_together();
        let got = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
        assert_eq!(
            tessera_codegen::together::products_together(),
            before + 2,
            "one product per group, not per device"
        );
        for p in 0..4 {
            assert_eq!(bits(&got[p]), bits(&want[p]), "device {p}, round {round}");
        }
    }
    // Every device its own copy of the weight: the row-stacked product is declined (each
    // multiplies its own), the summed one still stacks; the same bits as threads again.
    let ws: Vec<Literal> = (0..4).map(|_| matrix(256, 256, 9)).collect();
    let refs: Vec<Vec<&Literal>> = xs.iter().zip(&ws).map(|(x, w)| vec![x, w]).collect();
    let want = threaded(&exe, &refs);
    let before = tessera_codegen::together::products_together();
    let got = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
    assert_eq!(tessera_codegen::together::products_together(), before + 1);
    for p in 0..4 {
        assert_eq!(bits(&got[p]), bits(&want[p]), "own weights, device {p}");
    }
    // And the sum is the devices' products summed (to f32 rounding), each `x_p^T tanh(x_p w)`.
    let tanh_sum = got[0][1].as_ref().unwrap();
    let mut want00 = 0f64;
    for (p, x) in xs.iter().enumerate() {
        let t = got[p][0].as_ref().unwrap();
        want00 += (0..64)
            .map(|i| x.data.get_f64(i * 256) * t.data.get_f64(i * 256))
            .sum::<f64>();
    }
    let got00 = tanh_sum.data.get_f64(0);
    assert!(
        (got00 - want00.tanh()).abs() < 1e-5,
        "{got00} {}",
        want00.tanh()
    );
}

/// Devices whose own work between meetings is large (here 4 x 2 x 262,144 kernel elements)
/// advance on two threads, half the devices each, with the bits of a thread per device: this
/// thread and the team's helper when the pool is two threads wide on two CPUs (retried while
/// another test holds the team), else rayon's.
#[test]
fn large_phases_on_two_threads_give_the_bits_of_a_thread_per_device() {
    let program = r#"mesh @mesh = <"dp"=4>
func @f(%0: f32[512,512]) {
  %1 = tanh %0 : f32[512,512]
  %2 = all_reduce %1 sum axes=["dp"] : f32[512,512]
  %3 = exp %2 : f32[512,512]
  return %3
}"#;
    let exe = tessera_codegen::compile(&parse(program).unwrap())
        .unwrap()
        .single_threaded();
    let xs: Vec<Literal> = (0..4).map(|p| matrix(512, 512, p)).collect();
    let refs: Vec<Vec<&Literal>> = xs.iter().map(|x| vec![x]).collect();
    let want = threaded(&exe, &refs);
    let mut forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    let team = rayon::current_num_threads() == 2
        && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let start = std::time::Instant::now();
    loop {
        let before = tessera_codegen::together::phases_on_two_threads();
        let on_team = tessera_codegen::together::phases_on_the_team();
        let got = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
        assert!(tessera_codegen::together::phases_on_two_threads() > before);
        for p in 0..4 {
            assert_eq!(bits(&got[p]), bits(&want[p]), "device {p}");
        }
        let on_team = tessera_codegen::together::phases_on_the_team() - on_team;
        if !team {
            assert_eq!(on_team, 0, "no team on this pool");
            break;
        }
        if on_team > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no run got the team"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Shared products whose operands are temporaries (a `tanh` of the input, a `tanh` of the
/// product): run together, each device's copy lies in the first program's group region at its
/// mesh position's place, so the parts are read in place, not copied (`stacked_in_place`),
/// with the threaded transport's bits, whichever device runs at which position.
const IN_PLACE: &str = r#"mesh @mesh = <"dp"=4>
func @f(%0: f32[64,256], %1: f32[256,256]) {
  %2 = tanh %0 : f32[64,256]
  %3 = dot_general %2, %1 contracting=[1]x[0] : f32[64,256]
  %4 = tanh %3 : f32[64,256]
  %5 = dot_general %2, %4 contracting=[0]x[0] : f32[256,256]
  %6 = all_reduce %5 sum axes=["dp"] : f32[256,256]
  %7 = exp %4 : f32[64,256]
  return %6, %7
}"#;

#[test]
fn temporaries_of_shared_products_are_stacked_where_they_lie() {
    let _one = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let exe = tessera_codegen::compile(&parse(IN_PLACE).unwrap())
        .unwrap()
        .single_threaded();
    let xs: Vec<Literal> = (0..4).map(|p| matrix(64, 256, p)).collect();
    let w = matrix(256, 256, 9);
    let refs: Vec<Vec<&Literal>> = xs.iter().map(|x| vec![x, &w]).collect();
    let want = threaded(&exe, &refs);
    let mut forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    for positions in [[0, 1, 2, 3], [2, 0, 3, 1]] {
        let ins: Vec<Vec<&Literal>> = positions.iter().map(|&p| refs[p].clone()).collect();
        let before = tessera_transport::stacked::stacked_in_place();
        let got = run_together(&mut programs, &ins, &positions).unwrap();
        // The row-stacked left operand, and both operands of the contraction.
        assert_eq!(
            tessera_transport::stacked::stacked_in_place(),
            before + 3,
            "positions {positions:?}"
        );
        for (k, &p) in positions.iter().enumerate() {
            assert_eq!(bits(&got[k]), bits(&want[p]), "position {p}");
        }
    }
}

/// A pair of shared products (`pairs.rs`): a replicated weight's product (`g @ w^T`, stacked
/// by rows) and a weight gradient with its all-reduce (`h^T @ g`, stacked along the
/// contraction), each 64 x 1024 x 1024 multiply-adds a device (the pairs' threshold), `g` a
/// temporary (each device's in the group region, read in place). Devices run in turn on one
/// thread multiply the two stacked products at once, one core each, with the bits of the
/// threaded transport, which multiplies them one after the other on every core.
const PAIR: &str = r#"mesh @mesh = <"dp"=4>
func @f(%0: f32[64,1024], %1: f32[1024,1024], %2: f32[64,1024]) {
  %3 = tanh %0 : f32[64,1024]
  %4 = dot_general %3, %1 contracting=[1]x[1] : f32[64,1024]
  %5 = mul %4, %2 : f32[64,1024]
  %6 = dot_general %2, %3 contracting=[0]x[0] : f32[1024,1024]
  %7 = all_reduce %6 sum axes=["dp"] : f32[1024,1024]
  return %5, %7
}"#;

#[test]
fn a_pair_of_shared_products_runs_at_once_with_the_threaded_bits() {
    let _one = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let exe = tessera_codegen::compile(&parse(PAIR).unwrap())
        .unwrap()
        .single_threaded();
    let schedule = exe.describe();
    assert!(
        schedule.contains("(reads [3, 1]) with 2"),
        "the products are paired, the all-reduce after both:\n{schedule}"
    );
    let gs: Vec<Literal> = (0..4).map(|p| matrix(64, 1024, p)).collect();
    let hs: Vec<Literal> = (0..4).map(|p| matrix(64, 1024, p + 5)).collect();
    let w = matrix(1024, 1024, 9);
    let refs: Vec<Vec<&Literal>> = gs.iter().zip(&hs).map(|(g, h)| vec![g, &w, h]).collect();
    let want = threaded(&exe, &refs);
    let mut forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    let mut programs: Vec<&mut tessera_codegen::Executable> = forks.iter_mut().collect();
    // The pair runs one core a side on a pool of exactly two threads.
    let pool = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    };
    let two = pool(2);
    for round in 0..2 {
        let (pairs, products) = (
            tessera_codegen::together::product_pairs_together(),
            tessera_codegen::together::products_together(),
        );
        let got = two.install(|| run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap());
        assert_eq!(
            tessera_codegen::together::product_pairs_together(),
            pairs + 1,
            "round {round}"
        );
        assert_eq!(tessera_codegen::together::products_together(), products + 2);
        for p in 0..4 {
            assert_eq!(bits(&got[p]), bits(&want[p]), "device {p}, round {round}");
        }
        // Against the sums themselves (f64): `(tanh(g) w^T)[0, 0] h[0, 0]` on device 1, and
        // the summed gradient's `[0, 0]` and `[3, 7]`, `sum_p sum_i h_p[i, a] tanh(g_p[i, b])`.
        let f = |l: &Literal, i: usize| l.data.get_f64(i);
        let got_a = f(got[1][0].as_ref().unwrap(), 0);
        let want_a = (0..1024)
            .map(|j| f(&gs[1], j).tanh() * f(&w, j))
            .sum::<f64>()
            * f(&hs[1], 0);
        assert!(
            (got_a - want_a).abs() < 1e-4 * want_a.abs().max(1.0),
            "{got_a} {want_a}"
        );
        for (a, b) in [(0, 0), (3, 7)] {
            let got_b = f(got[2][1].as_ref().unwrap(), a * 1024 + b);
            let want_b: f64 = (0..4)
                .flat_map(|p| (0..64).map(move |i| (p, i)))
                .map(|(p, i)| f(&hs[p], i * 1024 + a) * f(&gs[p], i * 1024 + b).tanh())
                .sum();
            assert!(
                (got_b - want_b).abs() < 1e-4 * want_b.abs().max(1.0),
                "{got_b} {want_b}"
            );
        }
    }
    // From this thread on the global pool (two threads on two CPUs), the two sides are this
    // thread and the team's helper (`team.rs`), retried while another test holds the team.
    if rayon::current_num_threads() == 2
        && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
    {
        let start = std::time::Instant::now();
        loop {
            let on_team = tessera_codegen::together::pairs_on_the_team();
            let got = run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap();
            for p in 0..4 {
                assert_eq!(bits(&got[p]), bits(&want[p]), "on the team, device {p}");
            }
            if tessera_codegen::together::pairs_on_the_team() > on_team {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no run got the team"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // On a pool of three threads the two run one after the other, on every core: the same bits.
    let pairs = tessera_codegen::together::product_pairs_together();
    let got = pool(3).install(|| run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap());
    assert_eq!(tessera_codegen::together::product_pairs_together(), pairs);
    for p in 0..4 {
        assert_eq!(bits(&got[p]), bits(&want[p]), "three threads, device {p}");
    }
    // Every device its own copy of the weight: the first product does not stack (each device
    // multiplies its own), the second still does, and the two run one after the other with
    // the threaded bits.
    let ws: Vec<Literal> = (0..4).map(|_| matrix(1024, 1024, 9)).collect();
    let refs: Vec<Vec<&Literal>> = (0..4).map(|p| vec![&gs[p], &ws[p], &hs[p]]).collect();
    let want = threaded(&exe, &refs);
    let got = two.install(|| run_together(&mut programs, &refs, &[0, 1, 2, 3]).unwrap());
    assert_eq!(tessera_codegen::together::product_pairs_together(), pairs);
    for p in 0..4 {
        assert_eq!(bits(&got[p]), bits(&want[p]), "own weights, device {p}");
    }
}
