//! Tiered compilation: a kernel with little work is compiled first at Cranelift's cheap
//! settings (`Tier::Quick`: `opt_level=none`, the single-pass register allocator; its vector
//! loops without the unrolled pair, `lower::build`), and again at
//! `opt_level=speed` on a background thread once the program runs a second time (a kernel
//! call past one run's, a run being one of every executable sharing the upgrade, the devices'
//! forks: a program run once is never compiled again, a loop body as its second iteration
//! starts); the executable calls the optimized code from the first kernel call after it is
//! ready.
//!
//! Why: on the seed step (9 functions of 64-336 bytes) Cranelift is about half of a first
//! call, and the quick settings compile in about two thirds of the time, while their code runs
//! up to three times slower (the seed step 12.7 -> 18.8 us with every kernel quick; measured
//! in the fifteenth pass of docs/PERFORMANCE.md, before the quick kernels lost their unrolled
//! pair, which halved an elementwise body's instructions again: twenty-ninth pass). A kernel
//! over fewer than `QUICK_BELOW` elements runs in microseconds at either tier, so the first
//! call saves more than the slower code costs; larger kernels are optimized at once (the big
//! MLP's first step would lose more in its kernels than the compile saves). A module past
//! `lower::outlines_all`'s weight (tens of thousands of kernels: `tests/deep.rs`) is not
//! tiered: the background core would compile its every kernel a second time (not timed).
//!
//! Both tiers compute the same values, NaNs aside (`lower::Tier`): `tests/differential.rs`
//! checks every corpus sample bit for bit, and `tessera::check::check_program` both tiers of
//! every fuzzed program.
//!
//! Tiering is on in `crate::compile_tiered` (what `jit` uses unless `TESSERA_TIERED=0`)
//! unless the persistent cache is on (its hits are cheaper than either tier) or
//! `TESSERA_DISASM` asks for the optimized code.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::kernel::Kernel;
use crate::lower::{Compiled, KernelFn, Tier};

/// Kernels over fewer elements than this (the result's, times the reduced ones) are compiled
/// quick first: below it a kernel runs in a few microseconds even at the quick tier. The size
/// from which a kernel is worth two cores.
pub(crate) const QUICK_BELOW: usize = crate::exec::PARALLEL_KERNEL_FROM;

/// How long the background thread waits for a job before it ends (the next job starts it
/// again).
const IDLE: Duration = Duration::from_secs(5);

/// Whether `compile_tiered` tiers: no persistent cache and no `TESSERA_DISASM`.
pub(crate) fn enabled() -> bool {
    static DISASM: OnceLock<bool> = OnceLock::new();
    !*DISASM.get_or_init(|| std::env::var_os("TESSERA_DISASM").is_some())
        && crate::cache::dir().is_none()
}

/// How many upgrades have been set in this process (`crate::optimized_in_background`).
pub(crate) static UPGRADED: AtomicUsize = AtomicUsize::new(0);

/// The tier each of `kernels` is compiled at first when tiering (`first`), kernels of the same
/// code at one tier (optimized if any of them is: one function serves them all); `None` when
/// the module is too large to tier.
pub(crate) fn plan(kernels: &[Kernel]) -> Option<Vec<Tier>> {
    if crate::lower::outlines_all(kernels) {
        return None;
    }
    let mut tiers: Vec<Tier> = kernels.iter().map(first).collect();
    let mut groups: std::collections::HashMap<u64, Vec<Vec<usize>>> = Default::default();
    for (i, k) in kernels.iter().enumerate() {
        let same = groups.entry(k.code_hash()).or_default();
        match same.iter_mut().find(|g| kernels[g[0]].same_code(k)) {
            Some(group) => group.push(i),
            None => same.push(vec![i]),
        }
    }
    for group in groups.values().flatten() {
        if group.iter().any(|&i| tiers[i] == Tier::Optimized) {
            for &i in group {
                tiers[i] = Tier::Optimized;
            }
        }
    }
    Some(tiers)
}

/// The tier kernel `k` is compiled at first when tiering: quick when it has little work. A
/// scatter's `out_dims` are its updates', not the operand it copies first, so it is optimized.
fn first(k: &Kernel) -> Tier {
    let reduced = k.reduce.as_ref().map_or(1, |(_, dims)| {
        dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    });
    let work = k.out_dims.iter().fold(reduced, |a, &d| a.saturating_mul(d));
    if work < QUICK_BELOW && k.scatter.is_none() {
        Tier::Quick
    } else {
        Tier::Optimized
    }
}

/// An executable's optimized code, once the background thread has compiled it: shared by the
/// executable and its forks, read at every kernel call (one atomic load).
pub(crate) struct Upgrade {
    done: OnceLock<Upgraded>,
    /// Set when the optimized code will not come (its compile failed or panicked, or the
    /// background thread could not start): waiting ends.
    failed: AtomicBool,
    /// The optimized compile, until it is handed to the background thread (`request`).
    job: Mutex<Option<Job>>,
    /// Whether `request` has run.
    requested: AtomicBool,
    /// The quick code's kernel calls so far, counted until `requested`.
    calls: AtomicUsize,
    /// The kernel calls of one run of every executable sharing the upgrade (the devices'
    /// forks run the program once each in one step): the call after them requests the
    /// optimized code.
    one_run: AtomicUsize,
    /// One executable's kernel calls in a run.
    per_executable: usize,
}

/// The optimized module and each step's kernel in it (the quick kernels replaced, the others
/// the first module's, which the executable keeps alive).
pub(crate) struct Upgraded {
    _code: Compiled,
    pub(crate) kernels: Vec<Option<KernelFn>>,
}

impl Upgrade {
    /// Each step's optimized kernel, once compiled.
    pub(crate) fn get(&self) -> Option<&Upgraded> {
        self.done.get()
    }

    /// Counts a kernel call of the quick code; the first past one run's requests the
    /// optimized code.
    pub(crate) fn called(&self) {
        if !self.requested.load(Ordering::Relaxed)
            && self.calls.fetch_add(1, Ordering::Relaxed) >= self.one_run.load(Ordering::Relaxed)
        {
            self.request();
        }
    }

    /// One more executable shares the upgrade (`Executable::fork`): a run of the program is
    /// one more executable's calls. Without this, a first step on two device threads counted
    /// as a second run and started the optimized compile on the cores the devices ran on (the
    /// seed step's first call on 2 devices 5.4-5.8 ms, 3.5-4.8 with tiering off).
    pub(crate) fn shared_by_another(&self) {
        self.one_run
            .fetch_add(self.per_executable, Ordering::Relaxed);
    }

    /// Hands the optimized compile to the background thread, once.
    pub(crate) fn request(&self) {
        if self.requested.swap(true, Ordering::AcqRel) {
            return;
        }
        let job = self.job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            submit(job);
        }
    }

    /// Whether the optimized compile has been requested.
    #[cfg(test)]
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Requests the optimized code and waits until it is there (true), it failed to compile
    /// (false: the quick code stays) or `deadline` passes (false).
    pub(crate) fn wait(&self, deadline: Instant) -> bool {
        self.request();
        loop {
            if self.done.get().is_some() {
                return true;
            }
            if self.failed.load(Ordering::Acquire) || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The upgrade of an executable whose `quick` kernels (each one's index among the
/// executable's kernels, in increasing order, and the kernel) are to be compiled at the
/// optimized tier on the background thread when requested (`Upgrade::called`, `wait`).
/// `steps` maps each step to its kernel's index and `first` is each step's kernel as first
/// compiled. The job holds the upgrade weakly: an executable dropped before its turn is not
/// compiled again.
pub(crate) fn start(
    quick: Vec<(usize, Kernel)>,
    steps: Vec<Option<usize>>,
    first: Vec<Option<KernelFn>>,
) -> Arc<Upgrade> {
    let upgrade = Arc::new(Upgrade {
        done: OnceLock::new(),
        failed: AtomicBool::new(false),
        job: Mutex::new(None),
        requested: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        one_run: AtomicUsize::new(first.iter().flatten().count()),
        per_executable: first.iter().flatten().count(),
    });
    let weak: Weak<Upgrade> = Arc::downgrade(&upgrade);
    // Marks the upgrade failed unless the job set it, however the job ends (an error, a
    // panic, or never run: dropped when the background thread could not start).
    let failing = Failing(weak.clone());
    let job: Job = Box::new(move || {
        let _failing = failing;
        if weak.strong_count() == 0 {
            return;
        }
        let (index, kernels): (Vec<usize>, Vec<Kernel>) = quick.into_iter().unzip();
        debug_assert!(index.is_sorted());
        let tiers = vec![Tier::Optimized; kernels.len()];
        let Ok(code) = crate::lower::compile_tiers(&kernels, &tiers, false) else {
            return;
        };
        let Some(upgrade) = weak.upgrade() else {
            return;
        };
        let kernels = steps
            .iter()
            .zip(first)
            .map(
                |(k, f)| match k.and_then(|i| index.binary_search(&i).ok()) {
                    Some(j) => Some(code.functions[j]),
                    None => f,
                },
            )
            .collect();
        // Set once: this job is the only writer.
        let _ = upgrade.done.set(Upgraded {
            _code: code,
            kernels,
        });
        UPGRADED.fetch_add(1, Ordering::Relaxed);
    });
    *upgrade.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
    upgrade
}

/// Marks its upgrade failed when dropped before the optimized code is set.
struct Failing(Weak<Upgrade>);

impl Drop for Failing {
    fn drop(&mut self) {
        if let Some(upgrade) = self.0.upgrade()
            && upgrade.done.get().is_none()
        {
            upgrade.failed.store(true, Ordering::Release);
        }
    }
}

/// Starts the background thread if it is not running (`crate::prepare` does, while the first
/// program traces, so that its compile does not wait for a thread to start: 30-70 us).
pub(crate) fn start_thread() {
    submit(Box::new(|| {}));
}

type Job = Box<dyn FnOnce() + Send>;

/// The background thread's queue, while it runs.
static QUEUE: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

/// Runs `job` on the background thread, starting it if it is not running. If the thread
/// cannot be started the job is dropped (its executable keeps the quick code).
fn submit(job: Job) {
    let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    let job = match queue.as_ref() {
        Some(tx) => match tx.send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel::<Job>();
    let started = std::thread::Builder::new()
        .name("tessera-tier-up".into())
        .spawn(move || serve(rx));
    if started.is_ok() && tx.send(job).is_ok() {
        *queue = Some(tx);
    }
}

/// The background thread: runs jobs in turn, and ends after `IDLE` without one. It ends
/// holding the queue's lock, having found the channel empty, so no job is left behind.
fn serve(rx: mpsc::Receiver<Job>) {
    loop {
        match rx.recv_timeout(IDLE) {
            Ok(job) => run(job),
            Err(RecvTimeoutError::Timeout) => {
                let mut queue = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
                match rx.try_recv() {
                    Ok(job) => {
                        drop(queue);
                        run(job);
                    }
                    Err(_) => {
                        *queue = None;
                        return;
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// One job; a panic stays in it (the job marks its upgrade failed).
fn run(job: Job) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{Data, Literal};

    /// The seed step's shape of work: a product, a tanh of its sum with a bias, the column
    /// sums and a scalar loss, all kernels small.
    const SMALL: &str = "func @f(%0: f32[64,10], %1: f32[10,32], %2: f32[32]) {\n  \
        %3 = dot_general %0, %1 contracting=[1]x[0] : f32[64,32]\n  \
        %4 = broadcast_in_dim %2 dims=[1] : f32[64,32]\n  \
        %5 = add %3, %4 : f32[64,32]\n  \
        %6 = tanh %5 : f32[64,32]\n  \
        %7 = mul %6, %6 : f32[64,32]\n  \
        %8 = reduce_sum %7 axes=[0] : f32[32]\n  \
        %9 = exp %8 : f32[32]\n  \
        %10 = reduce_sum %9 axes=[0] : f32[]\n  \
        return %6, %8, %10\n}\n";

    fn inputs(g: &tessera_ir::Graph) -> Vec<Literal> {
        g.params()
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let ty = g.ty(p);
                let v = (0..ty.numel())
                    .map(|i| ((i * 7919 + k * 31) % 1013) as f32 * 0.002 - 1.0)
                    .collect();
                Literal::new(ty.shape.clone(), Data::F32(v)).unwrap()
            })
            .collect()
    }

    /// A tiered executable starts with quick kernels, asks for its optimized code at its
    /// second run, gets it from the background thread, calls it from then on (each step's kernel is the optimized
    /// module's), and computes the optimized compile's bits before and after.
    #[test]
    fn small_kernels_start_quick_and_are_optimized_in_the_background() {
        let g = tessera_ir::parse(SMALL).unwrap();
        let xs = inputs(&g);
        let refs: Vec<&Literal> = xs.iter().collect();
        let optimized = crate::compile(&g).unwrap();
        assert_eq!(optimized.quick_functions(), 0);
        let quick = crate::compile_quick(&g).unwrap();
        assert!(quick.quick_functions() >= 3, "{}", quick.quick_functions());
        let want = optimized
            .run(&refs, &tessera_transport::SingleDevice)
            .unwrap();
        let tiered = crate::compile_graph(&g, crate::Tiers::Tiered).unwrap();
        assert!(
            tiered.quick_functions() >= 3,
            "{}",
            tiered.quick_functions()
        );
        let first = tiered.run(&refs, &tessera_transport::SingleDevice).unwrap();
        // One run does not ask for the optimized code; the second run's first kernel does.
        assert_eq!(tiered.upgrade_requested(), Some(false));
        let second = tiered.run(&refs, &tessera_transport::SingleDevice).unwrap();
        assert_eq!(tiered.upgrade_requested(), Some(true));
        assert!(tiered.wait_optimized(Duration::from_secs(60)));
        // A wait with no practical end returns at once when the code is there (an `Instant`
        // cannot hold `Duration::MAX` past now).
        assert!(tiered.wait_optimized(Duration::MAX));
        let (now, quick) = tiered.kernel_tables();
        let swapped = now.iter().zip(&quick).filter(|(a, b)| a != b).count();
        assert_eq!(
            swapped,
            now.iter().flatten().count(),
            "every kernel swapped"
        );
        let then = tiered.run(&refs, &tessera_transport::SingleDevice).unwrap();
        for (((a, b), c), d) in want.iter().zip(&first).zip(&second).zip(&then) {
            assert!(a.data.bits_eq(&b.data) && a.data.bits_eq(&c.data));
            assert!(a.data.bits_eq(&d.data));
        }
        // A fork shares the upgrade.
        assert_eq!(tiered.fork().kernel_tables().0, now);
    }

    /// Two devices' executables (one and its fork) running the program once each are one run:
    /// the optimized code is asked for when they run it a second time, not during the first.
    #[test]
    fn a_fork_running_the_same_step_is_not_a_second_run() {
        let g = tessera_ir::parse(SMALL).unwrap();
        let xs = inputs(&g);
        let refs: Vec<&Literal> = xs.iter().collect();
        let tiered = crate::compile_graph(&g, crate::Tiers::Tiered).unwrap();
        assert!(tiered.quick_functions() >= 3);
        let fork = tiered.fork();
        for exe in [&tiered, &fork] {
            exe.run(&refs, &tessera_transport::SingleDevice).unwrap();
        }
        assert_eq!(tiered.upgrade_requested(), Some(false), "one step");
        tiered.run(&refs, &tessera_transport::SingleDevice).unwrap();
        assert_eq!(fork.upgrade_requested(), Some(true), "the second step");
    }

    /// The kernels of `text`'s schedule.
    fn kernels_of(text: &str) -> Vec<Kernel> {
        let g = tessera_ir::parse(text).unwrap();
        crate::fusion::fuse(&g)
            .steps
            .into_iter()
            .filter_map(|s| match s.kind {
                crate::fusion::StepKind::Kernel(k) => Some(k),
                crate::fusion::StepKind::Gemm(_)
                | crate::fusion::StepKind::Collective(_)
                | crate::fusion::StepKind::Region(_)
                | crate::fusion::StepKind::Window(_)
                | crate::fusion::StepKind::Native(_) => None,
            })
            .collect()
    }

    /// The policy: a kernel over fewer than `QUICK_BELOW` elements (its result's times the
    /// reduced ones) starts quick; a larger one, counting its reduction, is optimized at once;
    /// kernels of one code share the optimized tier if one of them has it; a module past
    /// `outlines_all`'s weight is not tiered.
    #[test]
    fn kernels_with_more_work_are_optimized_at_once() {
        let tier_of = |text: &str| {
            let kernels = kernels_of(text);
            assert_eq!(kernels.len(), 1, "{text}");
            plan(&kernels).unwrap()[0]
        };
        let exp = |n: usize| {
            format!("func @f(%0: f32[{n},256]) {{\n  %1 = exp %0 : f32[{n},256]\n  return %1\n}}\n")
        };
        assert_eq!(tier_of(&exp(255)), Tier::Quick);
        assert_eq!(tier_of(&exp(256)), Tier::Optimized);
        let sum = |n: usize| {
            format!(
                "func @f(%0: f32[{n},64]) {{\n  %1 = reduce_sum %0 axes=[0] : f32[64]\n  \
                 return %1\n}}\n"
            )
        };
        assert_eq!(tier_of(&sum(1023)), Tier::Quick);
        assert_eq!(tier_of(&sum(1024)), Tier::Optimized);
        // Two flat `exp` kernels, one function: the large one's tier.
        let shared = kernels_of(
            "func @f(%0: f32[16], %1: f32[70000]) {\n  %2 = exp %0 : f32[16]\n  \
             %3 = exp %1 : f32[70000]\n  return %2, %3\n}\n",
        );
        assert!(shared[0].same_code(&shared[1]));
        assert_eq!(first(&shared[0]), Tier::Quick);
        assert_eq!(plan(&shared).unwrap(), [Tier::Optimized; 2]);
        // 300 small tanh kernels weigh more than a module that inlines its functions.
        let outputs: Vec<String> = (1..=300).map(|i| format!("%{i}")).collect();
        let body: String = (1..=300)
            .map(|i| format!("  %{i} = tanh %0 : f32[8]\n"))
            .collect();
        let many = kernels_of(&format!(
            "func @f(%0: f32[8]) {{\n{body}  return {}\n}}\n",
            outputs.join(", ")
        ));
        assert_eq!(many.len(), 300);
        assert_eq!(first(&many[0]), Tier::Quick);
        assert_eq!(plan(&many), None);
    }
}
