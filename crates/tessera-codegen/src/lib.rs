//! Tessera's native backend: from a per-device IR program to an executable.
//!
//! Consumes a verified graph; produces an `Executable`: a schedule of steps over one arena of
//! buffers. The passes, in order:
//! 0. `narrow`: f16 and bf16 arithmetic rewritten to f32 between converts;
//! 1. `fusion`: group nodes into loop-nest kernels, GEMM calls and collective calls;
//! 2. `pairs`: independent large products moved side by side, to run at once;
//! 3. `hoist`: steps with small or output-only results moved up next to their operands;
//! 4. `plan`: liveness and arena offsets for the temporaries;
//! 5. `lower`: each kernel to a Cranelift function (f32x4 where it pays, inline approximations
//!    of the transcendental functions from `approx`).
//!
//! Architecture invariant: the executable sees buffers and steps, never the graph; it computes
//! what `tessera-interp` computes, within the approximation bounds stated in `approx.rs`.

pub mod approx;
pub mod cache;
pub mod elem;
pub mod exec;
pub mod fusion;
pub mod hoist;
pub mod kernel;
pub mod legalize;
pub mod lower;
pub mod narrow;
mod native;
pub mod pairs;
pub mod plan;
mod pool;
mod sgemm;
mod team;
mod thin;
mod tier;
pub mod together;
mod transpose;
mod vmath;
pub mod window;

pub use exec::Executable;
pub use lower::LowerError;

use tessera_ir::Graph;

use crate::fusion::StepKind;
use crate::lower::Tier;

static PREPARED: std::sync::Once = std::sync::Once::new();

/// Whether `prepare` has run in this process.
pub fn prepared() -> bool {
    PREPARED.is_completed()
}

/// Starts, once per process and in the background, one-time work the first executable would
/// otherwise wait for: the gemm crate's query of the CPU's caches (its first product reads
/// the cache sizes from sysfs, 1 ms on the seed step's first call, a quarter of it: perf on
/// AMD EPYC Zen 4), Cranelift's host ISAs (`lower::host_isa`, `lower::quick_isa`), the
/// background thread that optimizes quick kernels (`tier.rs`: starting it was 30-70 us of the
/// first compile) and, with the task, the rayon pool that compiles the kernels; and, as a task
/// of its own that a worker takes first, the caller's `also` (`tessera`'s: the simplifier's
/// rules, which the first pass after tracing needs). `tessera` calls it when a program is
/// wrapped (`jit`, `pmap`) and again when one starts lowering (whichever comes first starts
/// it), so the work overlaps what the caller does before the first call, then the tracing and
/// the IR passes on the calling thread; a product that comes first waits for the query
/// (a `OnceCell`), a pass for its rules (a `OnceLock`). `tiered`: whether the caller compiles
/// with `compile_tiered` (the quick ISA and the background thread are started only then).
/// `threads`: the number of cores, as the caller has already read it. The rayon pool is started
/// with that many threads (unless `RAYON_NUM_THREADS` or `RAYON_RS_NUM_CPUS` is set or the
/// pool has started), so
/// rayon does not read the cgroup files again on the caller's thread (`cores` reads them: a
/// third of starting the pool, perf of the seed step's first call).
pub fn prepare(also: fn(), tiered: bool, threads: usize) {
    PREPARED.call_once(|| {
        team::set_cores(threads);
        // Rayon's own variables (and the deprecated one it still reads) keep their say.
        if ["RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS"]
            .iter()
            .all(|v| std::env::var_os(v).is_none())
        {
            // An error: the pool has started already (the program's own, or a product's).
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(threads.max(1))
                .build_global();
        }
        // A panic in `also` stays in its task (a panicking rayon task aborts the process):
        // the first pass that needs its work does it again on the caller's thread, where a
        // panic is that call's (`OnceLock` keeps nothing from a panicked initialization).
        rayon::spawn(move || {
            let _ = std::panic::catch_unwind(also);
        });
        // The ISAs first, in a task of their own: the first compile waits for them, and
        // building the host ISA runs CPUID (each a trap to the hypervisor in a VM), which
        // also fills std's cache of CPU features that fusion reads (`vmath::Tail::tanh`).
        rayon::spawn(move || {
            // An error here is the first compile's to report.
            let _ = lower::host_isa();
            if tiered && tier::enabled() {
                let _ = lower::quick_isa();
                tier::start_thread();
            }
            // The team's helper, which takes half of the first compile's kernels (`map_all`).
            team::start();
        });
        // Only the first run's first product needs the caches' sizes; reading them takes a
        // worker 0.6 ms (sysfs, perf of the seed step's first call on a Xeon VM).
        rayon::spawn(move || {
            let _ = *gemm_common::cache::CACHE_INFO;
        })
    });
}

/// Compiles a graph to native code, every kernel optimized.
pub fn compile(g: &Graph) -> Result<Executable, LowerError> {
    compile_graph(g, Tiers::Optimized)
}

/// `compile`, with tiered compilation (`tier.rs`): kernels with little work are compiled at
/// Cranelift's cheap settings first, and optimized on a background thread; the executable
/// switches to the optimized code when it is ready (`Executable::wait_optimized`). Both
/// tiers compute the same values (NaNs aside: `lower::Tier`). `jit` compiles this way unless
/// `TESSERA_TIERED=0`. Without tiering (the persistent cache on, or `TESSERA_DISASM`) it is
/// `compile`.
pub fn compile_tiered(g: &Graph) -> Result<Executable, LowerError> {
    let tiers = if tier::enabled() {
        Tiers::Tiered
    } else {
        Tiers::Optimized
    };
    compile_graph(g, tiers)
}

/// `compile` with every kernel at the quick tier and no optimized code to follow: the code a
/// `compile_tiered` executable runs until its optimized code is ready, for the tests that
/// compare the tiers (`tessera::check::check_program`).
pub fn compile_quick(g: &Graph) -> Result<Executable, LowerError> {
    compile_graph(g, Tiers::Quick)
}

/// How many executables have had their quick kernels replaced by optimized code in this
/// process (`compile_tiered`).
pub fn optimized_in_background() -> usize {
    tier::UPGRADED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The tiers a compile uses (`tier.rs`).
#[derive(Clone, Copy)]
enum Tiers {
    Optimized,
    /// Each kernel's `tier::first`, the quick ones optimized in the background.
    Tiered,
    /// Every kernel quick, for good.
    Quick,
}

fn compile_graph(g: &Graph, tiers: Tiers) -> Result<Executable, LowerError> {
    tessera_ir::verify(g)?;
    let widened = narrow::widen(g).map_err(|e| LowerError::Narrow(e.to_string()))?;
    let g = widened.as_ref().unwrap_or(g);
    let split = legalize::split_wide_concats(g).map_err(|e| LowerError::Legalize(e.to_string()))?;
    let g = split.as_ref().unwrap_or(g);
    let mut schedule = fusion::fuse(g);
    pairs::pair_products(&mut schedule);
    hoist::hoist_small_results(&mut schedule);
    let mut kernels = Vec::new();
    let mut kernel_steps = Vec::new();
    let mut tails = Vec::new();
    let mut regions = Vec::new();
    // A kernel ending in an f32 tanh computes its argument, and the run applies the tanh at
    // the host's full vector width (`vmath.rs`).
    let tanh = vmath::Tail::tanh();
    for step in &schedule.steps {
        let mut bodies = Vec::new();
        let mut tail = None;
        match &step.kind {
            StepKind::Kernel(k) => {
                kernel_steps.push(Some(kernels.len()));
                let (k, t) = vmath::split_tail(k, tanh);
                kernels.push(k);
                tail = t;
            }
            StepKind::Gemm(_)
            | StepKind::Collective(_)
            | StepKind::Window(_)
            | StepKind::Native(_) => kernel_steps.push(None),
            // Each body is a program of its own, compiled once (never per iteration); the
            // verifier bounds how deeply this recursion goes (`MAX_REGION_DEPTH`).
            StepKind::Region(r) => {
                kernel_steps.push(None);
                for (_, body) in r.op.regions() {
                    bodies.push(compile_graph(body, tiers)?);
                }
            }
        }
        regions.push(bodies);
        tails.push(tail);
    }
    let optimized = || vec![Tier::Optimized; kernels.len()];
    let (tiers, upgrade) = match tiers {
        Tiers::Optimized => (optimized(), false),
        Tiers::Tiered => (tier::plan(&kernels).unwrap_or_else(optimized), true),
        Tiers::Quick => (vec![Tier::Quick; kernels.len()], false),
    };
    let quick_first = tiers.contains(&Tier::Quick);
    let code = if quick_first {
        lower::compile_tiers(&kernels, &tiers, true)?
    } else {
        // Through the persistent cache when it is on.
        lower::compile(&kernels)?
    };
    // Kept for the optimized code's table, only when there will be one.
    let steps = (quick_first && upgrade).then(|| kernel_steps.clone());
    let exe = Executable::new(
        schedule,
        code,
        (kernel_steps, tails),
        g.mesh.clone(),
        regions,
    );
    let Some(steps) = steps else {
        return Ok(exe);
    };
    let quick = kernels
        .into_iter()
        .enumerate()
        .filter(|&(i, _)| tiers[i] == Tier::Quick)
        .collect();
    Ok(exe.tiered(|first| tier::start(quick, steps, first)))
}
