//! The transport under faults, with compiled programs on the runtime's devices: a device that
//! arrives late, one that panics, a timeout at every kind of wait. (Here rather than in
//! `tessera-runtime`, which depends on neither codegen nor the interpreter.) Scenarios that could crash the process (a use-after-free) run in a
//! child process, so a crash is reported as this test failing instead of taking the harness
//! down with it.

use std::process::Command;
use std::time::Duration;

use tessera_ir::{Data, Literal, TensorType, parse};
use tessera_runtime::{Rendezvous, SharedCollectives};

const CHILD: &str = "TESSERA_FAULTS_CHILD";

/// Runs test `name` of this binary again in a child process with `CHILD` set; returns its
/// exit status and output.
fn in_child(name: &str) -> (std::process::ExitStatus, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn all_reduce_f64(len: usize) -> tessera_codegen::Executable {
    let g = parse(&format!(
        "mesh @mesh = <\"dp\"=2>\n\
         func @f(%0: f64[{len}]) {{\n  \
           %1 = all_reduce %0 sum axes=[\"dp\"] : f64[{len}]\n  \
           return %1\n}}\n"
    ))
    .unwrap();
    tessera_codegen::compile(&g).unwrap().single_threaded()
}

/// Issue 10, item 1: two forks of a compiled `all_reduce` on `f64[1<<20]` (the in-place path),
/// a 100 ms timeout, device 1 arriving 400 ms late. Device 0 gives up and frees its buffers;
/// device 1 must then fail too, without reading them (before the fix it found the slot
/// "complete" with device 0's stale addresses and crashed with SIGSEGV).
fn late_member_scenario() {
    let len = 1 << 20;
    let exe = all_reduce_f64(len);
    let forks = [exe.fork(), exe.fork()];
    drop(exe);
    let r = Rendezvous::with_timeout(Duration::from_millis(100));
    let ids = [0, 1];
    let results: Vec<Result<Vec<Literal>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = forks
            .into_iter()
            .enumerate()
            .map(|(p, f)| {
                let (r, ids) = (&r, &ids);
                s.spawn(move || {
                    if p == 1 {
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    let x = Literal::new([len], Data::F64(vec![p as f64 + 1.0; len])).unwrap();
                    let c = SharedCollectives::new(r, 0, p, ids);
                    let out = f.run(&[&x], &c).map_err(|e| e.to_string());
                    // Device 0's operand and result are freed here, long before device 1
                    // arrives.
                    drop(x);
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e0 = results[0].as_ref().unwrap_err();
    assert!(
        e0.contains("all_reduce") && e0.contains("[1]") && e0.contains("within 100 ms"),
        "{e0}"
    );
    let e1 = results[1].as_ref().unwrap_err();
    assert!(
        e1.contains("all_reduce") && e1.contains("device 0 gave up"),
        "{e1}"
    );
    println!("late member: both failed cleanly");
}

#[test]
fn a_late_member_never_reads_the_buffers_of_one_that_gave_up() {
    let _serial = two_devices();
    if std::env::var_os(CHILD).is_some() {
        late_member_scenario();
        return;
    }
    let (status, out) = in_child("a_late_member_never_reads_the_buffers_of_one_that_gave_up");
    assert!(
        status.success() && out.contains("late member: both failed cleanly"),
        "the scenario failed or crashed ({status}):\n{out}"
    );
}

// ---- Launches under faults: `tessera_runtime::launch`, the path sharded `jit` and `pmap`
// take, with a transport that injects a fault on one device for one call.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera_codegen::Executable;
use tessera_ir::ReduceKind;
use tessera_runtime::{LaunchError, launch_with_timeout};
use tessera_transport::{Collectives, GemmCall, GemmPart, Group, SharedProducts, TransportError};

/// What the faulty transport does on the faulty device.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// Panics on entering the all-reduce.
    PanicInAllReduce,
    /// Sleeps this long before the all-reduce: arrives late.
    LateToAllReduce(Duration),
    /// The shared product (done by whichever member copies in last) takes this long.
    SlowProduct(Duration),
    /// The shared product panics.
    PanicInProduct,
}

/// `SharedCollectives` with `fault` injected.
struct Faulty<'a, 'r> {
    inner: &'a SharedCollectives<'r>,
    fault: Fault,
}

impl Faulty<'_, '_> {
    fn product<'g>(&self, gemm: &'g (dyn Fn(&GemmCall) + Sync)) -> impl Fn(&GemmCall) + Sync + 'g {
        let fault = self.fault;
        move |c: &GemmCall| {
            match fault {
                Fault::SlowProduct(d) => std::thread::sleep(d),
                Fault::PanicInProduct => panic!("injected panic in the product"),
                Fault::None | Fault::PanicInAllReduce | Fault::LateToAllReduce(_) => {}
            }
            gemm(c)
        }
    }

    fn before_all_reduce(&self) {
        match self.fault {
            Fault::PanicInAllReduce => panic!("injected panic in the all-reduce"),
            Fault::LateToAllReduce(d) => std::thread::sleep(d),
            Fault::None | Fault::SlowProduct(_) | Fault::PanicInProduct => {}
        }
    }
}

impl Collectives for Faulty<'_, '_> {
    fn position(&self) -> usize {
        self.inner.position()
    }

    fn all_reduce(
        &self,
        group: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.before_all_reduce();
        self.inner.all_reduce(group, kind, x)
    }

    fn all_gather(
        &self,
        group: &Group,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.inner.all_gather(group, dim, x)
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.inner.reduce_scatter(group, kind, dim, x)
    }

    fn all_to_all(
        &self,
        group: &Group,
        split_dim: usize,
        concat_dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.inner.all_to_all(group, split_dim, concat_dim, x)
    }

    fn collective_permute(
        &self,
        group: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.inner.collective_permute(group, pairs, x)
    }

    unsafe fn all_reduce_buffers(
        &self,
        group: &Group,
        kind: ReduceKind,
        ty: &TensorType,
        input: *const u8,
        out: *mut u8,
    ) -> Result<(), TransportError> {
        self.before_all_reduce();
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.all_reduce_buffers(group, kind, ty, input, out) }
    }

    fn shared_products(&self) -> Option<&dyn SharedProducts> {
        Some(self)
    }
}

impl SharedProducts for Faulty<'_, '_> {
    unsafe fn gemm_shared_rhs(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        let g = self.product(gemm);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.gemm_shared_rhs(group, part, &g) }
    }

    unsafe fn gemm_all_reduce(
        &self,
        group: &Group,
        part: &GemmPart,
        gemm: &(dyn Fn(&GemmCall) + Sync),
    ) -> Result<Option<*const u8>, TransportError> {
        let g = self.product(gemm);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.gemm_all_reduce(group, part, &g) }
    }
}

/// Sets up two devices; the guard runs this binary's launch tests one at a time (a device left
/// busy by one test's straggler would make another test's short timeouts fire).
fn two_devices() -> std::sync::MutexGuard<'static, ()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    // SAFETY: before any device thread starts and before any other test of this binary reads
    // the environment (every test calls this first).
    ONCE.call_once(|| unsafe { std::env::set_var("TESSERA_DEVICES", "2") });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `exes` on devices 0 and 1 with `inputs[p]`, injecting `fault` on position `faulty`
/// (on both when `faulty` is 2).
fn run_with(
    exes: &Arc<Vec<Mutex<Executable>>>,
    inputs: &Arc<Vec<Vec<Arc<Literal>>>>,
    timeout: Duration,
    faulty: usize,
    fault: Fault,
) -> Result<Vec<Vec<Literal>>, LaunchError<String>> {
    let inputs = inputs.clone();
    launch_with_timeout(
        &[0, 1],
        exes.clone(),
        timeout,
        Arc::new(move |exe: &Executable, coll: &SharedCollectives<'_>, pos| {
            let f = Faulty {
                inner: coll,
                fault: if pos == faulty || faulty == 2 {
                    fault
                } else {
                    Fault::None
                },
            };
            let refs: Vec<&Literal> = inputs[pos].iter().map(|l| l.as_ref()).collect();
            exe.run(&refs, &f).map_err(|e| e.to_string())
        }),
    )
}

fn forks(exe: Executable) -> Arc<Vec<Mutex<Executable>>> {
    Arc::new(vec![Mutex::new(exe.fork()), Mutex::new(exe)])
}

/// The in-place all-reduce of `f32[LEN]` on two devices; the inputs, and the sum.
const LEN: usize = 1 << 15;

/// One executable per position, and each position's inputs.
type Exes = Arc<Vec<Mutex<Executable>>>;
type Inputs = Arc<Vec<Vec<Arc<Literal>>>>;

fn all_reduce_setup() -> (Exes, Inputs, Vec<f32>) {
    let g = parse(&format!(
        "mesh @mesh = <\"dp\"=2>\n\
         func @f(%0: f32[{LEN}]) {{\n  \
           %1 = all_reduce %0 sum axes=[\"dp\"] : f32[{LEN}]\n  \
           return %1\n}}\n"
    ))
    .unwrap();
    let exe = tessera_codegen::compile(&g).unwrap().single_threaded();
    let value = |p: usize, i: usize| ((i * 7 + p * 3) % 11) as f32 - 5.0;
    let inputs: Vec<Vec<Arc<Literal>>> = (0..2)
        .map(|p| {
            let v = (0..LEN).map(|i| value(p, i)).collect();
            vec![Arc::new(Literal::new([LEN], Data::F32(v)).unwrap())]
        })
        .collect();
    let want = (0..LEN).map(|i| value(0, i) + value(1, i)).collect();
    (forks(exe), Arc::new(inputs), want)
}

fn check_sums(got: &[Vec<Literal>], want: &[f32]) {
    for (p, outs) in got.iter().enumerate() {
        assert_eq!(
            outs[0],
            Literal::new([LEN], Data::F32(want.to_vec())).unwrap(),
            "position {p}"
        );
    }
}

/// Issue 10, items 2 and 3: a device that panics inside a collective makes the launch fail at
/// once with its panic (not after the other device's timeout), and the executables stay
/// usable: the next call on them returns the right sums (before, the panic poisoned the
/// device's executable and every later call failed with `PoisonError`).
#[test]
fn a_panic_in_a_collective_fails_the_launch_at_once_and_the_next_call_works() {
    let _serial = two_devices();
    let (exes, inputs, want) = all_reduce_setup();
    check_sums(
        &run_with(&exes, &inputs, Duration::from_secs(5), 1, Fault::None).unwrap(),
        &want,
    );
    let start = Instant::now();
    let err = run_with(
        &exes,
        &inputs,
        Duration::from_secs(5),
        1,
        Fault::PanicInAllReduce,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("device 1 panicked") && err.contains("injected panic in the all-reduce"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the other device waited {:?} for the one that panicked",
        start.elapsed()
    );
    for _ in 0..3 {
        check_sums(
            &run_with(&exes, &inputs, Duration::from_secs(5), 1, Fault::None).unwrap(),
            &want,
        );
    }
}

/// A device that arrives after the timeout: the launch's error is the timeout of the device
/// that waited (naming the late one, in ms); the launch waits for the late device, which
/// then fails at once, and the next call works.
#[test]
fn a_timed_out_call_is_an_error_and_the_next_call_works() {
    let _serial = two_devices();
    let (exes, inputs, want) = all_reduce_setup();
    let err = run_with(
        &exes,
        &inputs,
        Duration::from_millis(200),
        1,
        Fault::LateToAllReduce(Duration::from_millis(260)),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("device 0:")
            && err.contains("devices [1] did not arrive within 200 ms")
            && err.contains("all_reduce"),
        "{err}"
    );
    check_sums(
        &run_with(&exes, &inputs, Duration::from_millis(200), 1, Fault::None).unwrap(),
        &want,
    );
}

/// A product shared by two devices (`gemm_shared_rhs`: a replicated weight): `f32[128,256]`
/// rows per device times one `f32[256,128]` weight, integer-valued so the product is exact.
fn shared_product_setup() -> (Exes, Inputs, Vec<Literal>) {
    let text = "mesh @mesh = <\"dp\"=2>\n\
         func @f(%0: f32[128,256], %1: f32[256,128]) {\n  \
           %2 = dot_general %0, %1 contracting=[1]x[0] : f32[128,128]\n  \
           return %2\n}\n";
    let g = parse(text).unwrap();
    let exe = tessera_codegen::compile(&g).unwrap().single_threaded();
    let w = Arc::new(
        Literal::new(
            [256, 128],
            Data::F32((0..256 * 128).map(|i| (i % 5) as f32 - 2.0).collect()),
        )
        .unwrap(),
    );
    let inputs: Vec<Vec<Arc<Literal>>> = (0..2)
        .map(|p| {
            let x = (0..128 * 256).map(|i| ((i + p) % 3) as f32 - 1.0).collect();
            vec![
                Arc::new(Literal::new([128, 256], Data::F32(x)).unwrap()),
                w.clone(),
            ]
        })
        .collect();
    let want = inputs
        .iter()
        .map(|ins| {
            let refs: Vec<&Literal> = ins.iter().map(|l| l.as_ref()).collect();
            let owned: Vec<Literal> = refs.iter().map(|l| (*l).clone()).collect();
            tessera_interp::run(&g, &owned).unwrap().remove(0)
        })
        .collect();
    (forks(exe), Arc::new(inputs), want)
}

/// The wait for a shared product times out (before, it parked with no timeout), after the
/// multiplier has stopped reading the members' shared weight; a panic in the product fails
/// the launch at once; after both, the next call is right and shares its product again.
#[test]
fn the_wait_for_a_shared_product_times_out_and_a_panic_in_it_is_caught() {
    let _serial = two_devices();
    let (exes, inputs, want) = shared_product_setup();
    let shared = tessera_runtime::shared_gemm_count();
    let got = run_with(&exes, &inputs, Duration::from_secs(5), 0, Fault::None).unwrap();
    assert_eq!(got.iter().map(|o| o[0].clone()).collect::<Vec<_>>(), want);
    assert!(
        tessera_runtime::shared_gemm_count() > shared,
        "the product was not shared"
    );
    // Both positions slow: whichever multiplies makes the other wait past the timeout.
    let start = Instant::now();
    let slow = Fault::SlowProduct(Duration::from_millis(600));
    let err = run_with(&exes, &inputs, Duration::from_millis(150), 2, slow)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("did not finish the group's product within 150 ms"),
        "{err}"
    );
    // The member that gave up waited for the multiplier to stop reading before it returned.
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "{:?}",
        start.elapsed()
    );
    // Both positions panic in the product: whichever multiplies does.
    let start = Instant::now();
    let err = run_with(
        &exes,
        &inputs,
        Duration::from_secs(5),
        2,
        Fault::PanicInProduct,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("panicked: injected panic in the product"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let got = run_with(&exes, &inputs, Duration::from_secs(5), 0, Fault::None).unwrap();
    assert_eq!(got.iter().map(|o| o[0].clone()).collect::<Vec<_>>(), want);
}

/// The launch waits at most the timeout for the others once a device has answered: a device
/// still busy after that is named (`NoAnswer`), and the launch's memory stays valid for it
/// (its job owns what it reads); once it is done the next call works.
#[test]
fn a_device_that_does_not_answer_in_time_is_named() {
    let _serial = two_devices();
    let g = parse(
        "mesh @mesh = <\"dp\"=2>\n\
         func @f(%0: f32[4]) {\n  \
           %1 = exp %0 : f32[4]\n  \
           return %1\n}\n",
    )
    .unwrap();
    let exes = forks(tessera_codegen::compile(&g).unwrap().single_threaded());
    let x = Arc::new(Literal::new([4], Data::F32(vec![0.0, 1.0, 2.0, 3.0])).unwrap());
    let want = tessera_interp::run(&g, &[(*x).clone()]).unwrap();
    let inputs: Inputs = Arc::new(vec![vec![x.clone()], vec![x]]);
    let call = |busy: Duration| {
        let inputs = inputs.clone();
        launch_with_timeout(
            &[0, 1],
            exes.clone(),
            Duration::from_millis(100),
            Arc::new(move |exe: &Executable, coll: &SharedCollectives<'_>, pos| {
                if pos == 1 {
                    std::thread::sleep(busy);
                }
                let refs: Vec<&Literal> = inputs[pos].iter().map(|l| l.as_ref()).collect();
                exe.run(&refs, coll).map_err(|e| e.to_string())
            }),
        )
    };
    let err = call(Duration::from_millis(500)).unwrap_err().to_string();
    assert!(
        err.contains("devices [1] did not finish within 100 ms of the others"),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(600));
    for outs in call(Duration::ZERO).unwrap() {
        assert_eq!(outs, want);
    }
}
