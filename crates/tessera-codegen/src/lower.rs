//! Cranelift lowering: one native function per kernel.
//!
//! Consumes `Kernel`s; produces finalized functions `extern "C" fn(*const *mut u8)` taking the
//! array of buffer pointers (inputs, then the output). The innermost loop of an elementwise f32
//! kernel runs on f32x4 vectors with a scalar tail when every load is contiguous or constant
//! along it; everything else runs scalar. Transcendental f32 functions are inline polynomial
//! approximations (`approx.rs`), except f32 `pow` and the large-argument path of `sin`/`cos`,
//! which call Rust functions per lane (`tessera_pow_f32`, `tessera_sin_f32`,
//! `tessera_cos_f32`); f64 ones call Rust's libm through registered symbols, the same functions
//! the interpreter uses, so f64 results agree bit for bit.
//!
//! Safety of generated code: every load and store is inside its buffer. Loop bounds are the
//! buffer shapes, guarded coordinates (pad, concatenate) are clamped into range before the
//! address is formed, integer division never traps (division by zero and `MIN / -1` are
//! handled before the divide), and shifts by the width or more are selected to zero.

use cranelift_codegen::Context;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{self, F32, F32X4, F64, I8, I16, I32, I32X4, I64};
use cranelift_codegen::ir::{
    AbiParam, Block, FuncRef, Function, InstBuilder, InstructionData, MemFlagsData, Opcode,
    Signature, Type, UserFuncName, Value,
};
use cranelift_codegen::isa::{CallConv, TargetIsa};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, ModuleReloc, default_libcall_names};
use tessera_ir::{BinaryOp, CompareOp, DType, ScatterKind, UnaryOp};

use crate::approx::{self, Fx};
use crate::elem;
use crate::kernel::{Combine, Cond, Coord, Expr, Kernel, Lin, Scalar, Scan, ScatterPhase, Start};
use tessera_interp::elem::Libm;

/// A compiled kernel: takes the pointer array of its buffers, and the range `lo..hi` of its
/// outermost result index to compute (`splits_outer`: what honors it; the others compute all),
/// with `0 <= lo <= hi <=` that dim's extent (a flat kernel's: its length).
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, i64, i64);

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("cranelift: {0}")]
    Cranelift(String),
    /// The graph breaks an IR invariant: compiling it could index out of bounds.
    #[error("the graph to compile is malformed: {0}")]
    Malformed(#[from] tessera_ir::VerifyError),
    /// Rewriting f16/bf16 arithmetic to f32 built an ill-typed op (a bug of `narrow.rs`).
    #[error("computing f16/bf16 in f32: {0}")]
    Narrow(String),
    /// Splitting a wide op before fusion built an ill-typed op (a bug of `legalize.rs`).
    #[error("legalizing for codegen: {0}")]
    Legalize(String),
}

fn cl<E: std::fmt::Display>(e: E) -> LowerError {
    LowerError::Cranelift(e.to_string())
}

/// Rust implementations of the f64 functions that have no inline approximation, called per
/// element (f64 is not a hot path here).
macro_rules! libcalls {
    ($($name:ident: $f:expr),* $(,)?) => {
        $(
            extern "C" fn $name(x: f64) -> f64 {
                let f: fn(f64) -> f64 = $f;
                f(x)
            }
        )*
        const UNARY_LIBCALLS: &[(&str, extern "C" fn(f64) -> f64)] = &[$((stringify!($name), $name)),*];
    };
}

libcalls! {
    tessera_exp_f64: f64::exp,
    tessera_log_f64: f64::ln,
    tessera_log1p_f64: f64::ln_1p,
    tessera_expm1_f64: f64::exp_m1,
    tessera_tanh_f64: f64::tanh,
    tessera_sin_f64: f64::sin,
    tessera_cos_f64: f64::cos,
    tessera_erf_f64: libm::erf,
    tessera_erf_inv_f64: tessera_interp::scalar::erf_inv_f64,
    tessera_logistic_f64: tessera_interp::scalar::logistic_f64,
}

extern "C" fn tessera_pow_f64(x: f64, y: f64) -> f64 {
    x.powf(y)
}
extern "C" fn tessera_fmod_f64(x: f64, y: f64) -> f64 {
    x % y
}
extern "C" fn tessera_fmod_f32(x: f32, y: f32) -> f32 {
    x % y
}

/// A module holding compiled kernels. Dropping it frees their code.
pub struct Compiled {
    module: Option<JITModule>,
    pub functions: Vec<KernelFn>,
    /// How many outlined functions (one per function and width) the module holds.
    pub outlined: usize,
    /// How many kernel functions were compiled at `Tier::Quick`.
    pub quick: usize,
}

// SAFETY: after compilation nothing mutates the module until `drop` frees it, and `drop` runs
// once, when the last owner is gone: an executable and its forks (`Executable::fork`) share the
// first module, and the optimized one (`tier::Upgraded`, whose table may also point into the
// first) is shared by the same executables, each of which holds the first too; the kernels are
// plain machine code that any number of threads may call at once on their own buffers.
unsafe impl Sync for Compiled {}

impl Drop for Compiled {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: every table of these function pointers (`self.functions`, an
            // executable's `kernels`, an `Upgraded`'s) is owned by something that keeps this
            // module alive (see `Sync` above), so none is called after this.
            unsafe { m.free_memory() };
        }
    }
}

/// Whether the host has AVX and FMA, so that `fma` is one instruction (else it is emitted as a
/// multiply and an add). `TESSERA_NO_FMA=1` forces the second form, to test it on any host.
pub fn host_has_fma() -> bool {
    std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("avx")
        && std::env::var_os("TESSERA_NO_FMA").is_none()
}

/// Compiles every kernel into one module.
pub fn compile(kernels: &[Kernel]) -> Result<Compiled, LowerError> {
    compile_with(kernels, false)
}

/// How a kernel is compiled. The two tiers emit the same CLIF but for a quick kernel's vector
/// loops, which run one vector an iteration where an optimized one runs an unrolled pair
/// first (`build`: the same operations on the same elements, in the same order), and compute
/// the same values; only a NaN's sign and payload may differ, as between the interpreter and
/// compiled code (Cranelift's optimizer rewrites `(-x) * (-y)` to `x * y`, and may swap the
/// operands of a commutative operation, which decides the NaN an operation on two NaNs
/// returns). Checked on every corpus sample (`tests/differential.rs`, bit for bit), the region
/// tests and every fuzzed program (`check_program`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tier {
    /// Cranelift's cheap settings, `opt_level=none` and the single-pass register allocator,
    /// and vector loops without the unrolled pair: about a third less compile time at the
    /// settings alone, half again for an elementwise body without the pair; code up to three
    /// times slower (`tier.rs`).
    Quick,
    /// `opt_level=speed` and the backtracking allocator.
    Optimized,
}

/// Compiles every kernel into one module at its tier (`tiers`, one per kernel), without the
/// persistent cache, on every core or (`parallel` false) on the calling thread alone.
pub(crate) fn compile_tiers(
    kernels: &[Kernel],
    tiers: &[Tier],
    parallel: bool,
) -> Result<Compiled, LowerError> {
    compile_in(kernels, outlines_all(kernels), None, tiers, parallel)
}

/// `compile`; with `outline_all`, every kernel calls its transcendental functions out of line
/// (as long bodies do), so a test can hold both forms of one kernel side by side.
fn compile_with(kernels: &[Kernel], outline_all: bool) -> Result<Compiled, LowerError> {
    // The persistent cache's entries, one directory for the whole compile (`cache.rs`).
    let cache = crate::cache::dir().map(|d| crate::cache::entries_dir(&d));
    let tiers = vec![Tier::Optimized; kernels.len()];
    compile_in(kernels, outline_all, cache.as_deref(), &tiers, true)
}

/// `compile_with`, through the persistent cache's entries in `cache` if given, each kernel at
/// its tier, on every core or on the calling thread.
fn compile_in(
    kernels: &[Kernel],
    outline_all: bool,
    cache: Option<&std::path::Path>,
    tiers: &[Tier],
    parallel: bool,
) -> Result<Compiled, LowerError> {
    let outline_all = outline_all || outlines_all(kernels);
    let mut builder = JITBuilder::with_isa(host_isa()?, default_libcall_names());
    for (name, f) in UNARY_LIBCALLS {
        builder.symbol(*name, *f as *const u8);
    }
    builder.symbol("tessera_pow_f64", tessera_pow_f64 as *const u8);
    builder.symbol("tessera_fmod_f64", tessera_fmod_f64 as *const u8);
    builder.symbol("tessera_fmod_f32", tessera_fmod_f32 as *const u8);
    builder.symbol("tessera_sin_f32", approx::tessera_sin_f32 as *const u8);
    builder.symbol("tessera_cos_f32", approx::tessera_cos_f32 as *const u8);
    builder.symbol("tessera_pow_f32", approx::tessera_pow_f32 as *const u8);
    for (name, f) in elem::SYMBOLS.iter().chain(elem::NARROW_SYMBOLS) {
        builder.symbol(*name, *f);
    }
    let mut module = JITModule::new(builder);
    let ptr = module.target_config().pointer_type();
    let mut ids = Vec::new();
    // Kernels that are the same code over other buffers (the repeated layers of a deep
    // program) share one function: by `Kernel::code_hash`, then `Kernel::same_code`, at one
    // tier (`tier::plan` gives kernels of the same code the same tier).
    let mut by_hash: std::collections::HashMap<u64, Vec<usize>> = Default::default();
    let mut unique = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let same = by_hash.entry(k.code_hash()).or_default();
        if let Some(&j) = same
            .iter()
            .find(|&&j| kernels[j].same_code(k) && tiers[j] == tiers[i])
        {
            ids.push(ids[j]);
            continue;
        }
        same.push(i);
        let mut sig = Signature::new(CallConv::SystemV);
        sig.params.push(AbiParam::new(ptr));
        sig.params.push(AbiParam::new(I64));
        sig.params.push(AbiParam::new(I64));
        let id = module
            .declare_function(&format!("k{i}_{}", k.name), Linkage::Local, &sig)
            .map_err(cl)?;
        unique.push((i, id, sig));
        ids.push(id);
    }
    let quick_functions = unique.iter().filter(|u| tiers[u.0] == Tier::Quick).count();
    let disasm = std::env::var_os("TESSERA_DISASM").is_some();
    let isa = host_isa()?;
    let quick = tiers.contains(&Tier::Quick).then(quick_isa).transpose()?;
    let isas = Isas {
        optimized: &*isa,
        quick: quick.as_deref(),
    };
    // Each kernel is built and compiled by one task, on every core (`build_and_compile`);
    // the module's declarations are behind `Decls`'s lock.
    let decls = Decls {
        config: module.target_config(),
        shared: std::sync::Mutex::new((module, Vec::new())),
    };
    let how = How {
        outline_all,
        disasm,
        cache,
        parallel,
    };
    let mut codes = build_and_compile(&decls, isas, (kernels, tiers), unique, how)?;
    let (mut module, outlined) = decls.shared.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut fctx = FunctionBuilderContext::new();
    let built = outlined
        .iter()
        .map(|&(u, lanes, id)| Built {
            id,
            func: build_outlined(&mut module, &mut fctx, u, lanes, id),
            kernel: None,
        })
        .collect();
    codes.extend(compile_all(&*isa, built, how)?);
    for code in codes {
        if let Some(vcode) = &code.vcode {
            // A debugging aid for kernel performance work: the machine code of every kernel.
            let what = code
                .kernel
                .map_or("an outlined function".into(), |i| kernels[i].summary());
            eprintln!("; kernel {what}\n{vcode}");
        }
        module
            .define_function_bytes(code.id, code.align, &code.bytes, &code.relocs)
            .map_err(cl)?;
    }
    module.finalize_definitions().map_err(cl)?;
    let functions = ids
        .iter()
        .map(|&id| {
            let p = module.get_finalized_function(id);
            // SAFETY: `p` is the finalized code of a function declared with the signature
            // `fn(ptr, i64, i64)` and the SystemV convention, which is `KernelFn`'s.
            unsafe { std::mem::transmute::<*const u8, KernelFn>(p) }
        })
        .collect();
    Ok(Compiled {
        module: Some(module),
        functions,
        outlined: outlined.len(),
        quick: quick_functions,
    })
}

/// The host's ISA with the kernels' flags, built once per process (detecting the CPU's
/// features and building the flags was 90 us of every compile). The flags are
/// `JITBuilder::with_flags`'s (no colocated libcalls, not PIC) and ours: `opt_level=speed`,
/// the backtracking register allocator,
/// and Cranelift's IR verifier, which costs 15-35% of compile time (CRANELIFT.md), on in
/// builds with debug assertions (the test suite), where it checks every kernel lowering makes.
pub(crate) fn host_isa() -> Result<cranelift_codegen::isa::OwnedTargetIsa, LowerError> {
    static ISA: IsaCell = std::sync::OnceLock::new();
    isa_once(
        &ISA,
        [
            ("opt_level", "speed"),
            ("regalloc_algorithm", "backtracking"),
        ],
    )
}

/// The host's ISA for `Tier::Quick`: `host_isa`'s flags but `opt_level=none` and the
/// single-pass register allocator.
pub(crate) fn quick_isa() -> Result<cranelift_codegen::isa::OwnedTargetIsa, LowerError> {
    static ISA: IsaCell = std::sync::OnceLock::new();
    isa_once(
        &ISA,
        [("opt_level", "none"), ("regalloc_algorithm", "single_pass")],
    )
}

type IsaCell = std::sync::OnceLock<Result<cranelift_codegen::isa::OwnedTargetIsa, String>>;

/// The host's ISA with the kernels' common flags and `tier`'s, built once into `cell`.
fn isa_once(
    cell: &IsaCell,
    tier: [(&str, &str); 2],
) -> Result<cranelift_codegen::isa::OwnedTargetIsa, LowerError> {
    cell.get_or_init(|| {
        use cranelift_codegen::settings::{self, Configurable};
        let verify = if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        };
        let mut flags = settings::builder();
        for (name, value) in [
            ("enable_verifier", verify),
            ("use_colocated_libcalls", "false"),
            ("is_pic", "false"),
        ]
        .into_iter()
        .chain(tier)
        {
            flags
                .set(name, value)
                .map_err(|e| format!("{name}={value}: {e}"))?;
        }
        cranelift_native::builder()
            .map_err(|e| format!("this host is not supported: {e}"))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(LowerError::Cranelift)
}

/// The ISAs of one compile: the optimized one, and the quick one if a kernel is quick.
#[derive(Clone, Copy)]
struct Isas<'a> {
    optimized: &'a dyn TargetIsa,
    quick: Option<&'a dyn TargetIsa>,
}

impl Isas<'_> {
    fn of(&self, tier: Tier) -> &dyn TargetIsa {
        match tier {
            Tier::Quick => self
                .quick
                .expect("a compile with quick kernels has the quick ISA"),
            Tier::Optimized => self.optimized,
        }
    }
}

/// How one compile's functions are made: outlined transcendental calls for every kernel,
/// machine code kept for `TESSERA_DISASM`, the persistent cache's entries, every core.
#[derive(Clone, Copy)]
struct How<'a> {
    outline_all: bool,
    disasm: bool,
    cache: Option<&'a std::path::Path>,
    parallel: bool,
}

/// `items` mapped by `f` in order, on every core (one item a task) when `parallel`, else on
/// the calling thread; an error if any item's is (which one, when several fail on several
/// cores, is not fixed).
///
/// On two cores, when this thread can lead the team (`team.rs`: a program's compile on the
/// caller's thread), this thread and the team's helper take the items one at a time from a
/// shared counter: this thread starts at once and never sleeps, and the helper takes what is
/// left when it comes. Handed to the rayon pool, the calling thread slept while the workers
/// woke, and the seed step's first compile started its first kernel 43-625 us after asking,
/// often on one worker alone (docs/PERFORMANCE.md, twenty-eighth pass).
fn map_all<T: Send, R: Send>(
    items: Vec<T>,
    parallel: bool,
    f: impl Fn(T) -> Result<R, LowerError> + Sync + Send,
) -> Result<Vec<R>, LowerError> {
    use rayon::prelude::*;
    if !parallel || items.len() < 2 {
        return items.into_iter().map(f).collect();
    }
    let Some(_team) = crate::team::lead() else {
        return items.into_par_iter().with_max_len(1).map(f).collect();
    };
    let n = items.len();
    let items: Vec<std::sync::Mutex<Option<T>>> = items
        .into_iter()
        .map(|t| std::sync::Mutex::new(Some(t)))
        .collect();
    let results: Vec<std::sync::Mutex<Option<Result<R, LowerError>>>> =
        (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Each item is claimed once (the counter), by whichever side gets there first; a side
    // that finds none left returns. Neither waits for the other (`team::join`'s contract):
    // a lock here is an item's own, or the module's (`Decls`), held only to declare a callee.
    let work = || {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= n {
                break;
            }
            let item = items[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(item) = item {
                let r = f(item);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            }
        }
    };
    crate::team::join(work, work);
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("both sides ran to the end: every item was claimed and mapped")
        })
        .collect()
}

/// Lanes: 1 (scalar) or 4 (f32x4).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Lanes {
    One,
    Four,
}

/// The f32 functions emitted once per module and called from long kernel bodies: which
/// function, at which width, and its id in the module.
type Outlined = Vec<(UnaryOp, Lanes, FuncId)>;

/// The module and the outlined functions declared in it so far (defined after the kernels),
/// while the kernels are built on several threads at once (`build_and_compile`): a build takes
/// the lock only to declare what its function calls.
struct Decls {
    shared: std::sync::Mutex<(JITModule, Outlined)>,
    config: cranelift_codegen::isa::TargetFrontendConfig,
}

impl Decls {
    fn lock(&self) -> std::sync::MutexGuard<'_, (JITModule, Outlined)> {
        // A build that panicked left the declarations whole (each is one call).
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Lower<'a, 'b> {
    b: FunctionBuilder<'b>,
    decls: &'a Decls,
    /// The outlined functions declared in this function.
    outlined_refs: Vec<(UnaryOp, Lanes, FuncRef)>,
    bufs: Vec<Value>,
    vars: Vec<Variable>,
    fma: bool,
    /// In vector mode, the loop variable the lanes run along.
    lane_var: Option<usize>,
    /// The `lo..hi` parameters: the range of the outermost result index.
    range: (Value, Value),
    /// The f32 functions generated code calls, imported on first use (`KernelCallees`).
    callees: Vec<(approx::Callee, FuncRef)>,
    /// The i64 constants made in each block so far (`iconst`): one instruction per value and
    /// block, where each use made its own for Cranelift's e-graph to merge.
    consts: std::collections::HashMap<(Block, i64), Value>,
    /// The i64 sums and products made in each block so far (`add_i64`, `mul_i64`), by
    /// operands: the unrolled copies of a body compute the same addresses.
    index_ops: std::collections::HashMap<(Block, Opcode, Value, Value), Value>,
    /// Whether vector loops run two vectors an iteration (a third copy of the body): bodies up
    /// to `UNROLL_MAX_WEIGHT` (`unrolls`) at the optimized tier.
    unroll: bool,
    /// Whether f32 transcendental functions are calls of their outlined copies: in bodies
    /// over `UNROLL_MAX_WEIGHT` (at either tier), or in every kernel of a module past
    /// `outlines_all`'s weight.
    outline: bool,
}

/// The largest kernel body (`Kernel::code_weight`) whose vector loop is unrolled twice.
/// Compile time is linear in the code emitted, and an unrolled vector loop emits the body four
/// times (two f32x4 copies, one f32x4 remainder, one scalar remainder): a long fused chain of
/// transcendental functions (a 100,000-op program cut at the fusion depth cap) spent most of
/// its compile time in those copies (`tests/deep.rs`, 381 s -> 167 s without them). Such
/// bodies get one vector copy and the scalar remainder; what that costs their run time is not
/// measured. A kernel with up to 16 inline functions (a GELU, a softmax, a tanh layer) is
/// still unrolled.
///
/// The same bodies call their f32 transcendental functions (`fusion::is_transcendental`) out
/// of line: each (function, width) is emitted once per module (`build_outlined`) and every
/// use is a call, so the code emitted is linear in the body's node count, not 100 instructions
/// per `tanh`. The function is the same `approx` code, so the results are the same bits.
const UNROLL_MAX_WEIGHT: usize = 16 * crate::kernel::INLINE_FUNCTION_WEIGHT;

/// The largest module (the sum of its kernels' `Kernel::code_weight`) whose short kernels
/// keep their transcendental functions inline: 256 inline functions' worth. A program of
/// tens of thousands of small kernels (the gradient of a 100,000-op tanh chain materializes
/// every forward `tanh`, 50,000 four-node kernels, `tests/deep.rs`) spent its compile time
/// emitting the same ~100-instruction `tanh` four times in each; past this size every kernel
/// calls the module's one copy. A training step of the examples' size stays under it. What
/// the calls cost such programs at run time is not measured.
const MODULE_INLINE_MAX_WEIGHT: usize = 256 * crate::kernel::INLINE_FUNCTION_WEIGHT;

/// Whether every kernel of the module calls its transcendental functions out of line.
pub(crate) fn outlines_all(kernels: &[Kernel]) -> bool {
    kernels.iter().map(Kernel::code_weight).sum::<usize>() > MODULE_INLINE_MAX_WEIGHT
}

/// The widest innermost result dimension a vectorized reduction keeps in registers
/// (`Lower::accumulate_in_registers`): 8 f32x4 accumulators, half of x86's vector registers.
pub(crate) const REGISTER_LANES: usize = 32;

/// Whether reduction kernel `k` accumulates in registers: a result row of at most
/// `REGISTER_LANES`, and no more code than an unrolled vector loop may emit (its body is
/// emitted once per accumulator: up to 11 times for a row of 31, where an unrolled loop emits
/// 4 copies of a body up to `UNROLL_MAX_WEIGHT`).
pub(crate) fn in_registers(k: &Kernel) -> bool {
    k.out_dims.last().is_some_and(|&w| {
        w <= REGISTER_LANES && (w / 4 + w % 4) * k.code_weight() <= 4 * UNROLL_MAX_WEIGHT
    })
}

/// How a kernel without a scatter or a scan computes its result (`Lowering::kernel`).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Form {
    /// Loops over the result (`loops`), the outermost over the range the function is called
    /// with, each element whole (a reduction's inner loop included); the innermost one
    /// vectorized when `vector`.
    Loops { vector: bool },
    /// A reduction into the result in memory (`accumulate`): the rows of the outermost result
    /// dim in the range the function is called with when the result has two dims or more,
    /// else every element.
    Accumulate,
    /// A reduction into registers (`accumulate_in_registers`), the rows likewise.
    InRegisters,
}

/// `k`'s form. A flat kernel's loop is vectorized whatever its length (a vector loop over a
/// range of under four runs its scalar loop alone), so its code serves every length
/// (`Kernel::same_code`).
pub(crate) fn form(k: &Kernel) -> Form {
    let nout = k.out_dims.len();
    let vector = nout > 0
        && (k.out_dims[nout - 1] >= 4 || k.is_flat())
        && k.out_dtype == DType::F32
        && vectorizable(&k.body, nout - 1);
    match &k.reduce {
        Some((how, _)) if vector && *how != Combine::ArgMax => {
            if in_registers(k) {
                Form::InRegisters
            } else {
                Form::Accumulate
            }
        }
        Some(_) => Form::Loops { vector: false },
        None => Form::Loops { vector },
    }
}

/// Whether `k`'s function computes the part of its result in the range of its outermost
/// result dim that it is called with, and writes nothing else: then disjoint ranges on two
/// threads compute the whole result, each element combining its inputs in the same order as
/// one call over everything (the same bits). Loops over the result do (a reduction whose
/// elements each reduce a row, an argmax), but not over a result of no dims, a scatter (its
/// updates in order) or a scan along the outermost dim; a reduction into memory or registers
/// does when its result has two dims or more (a pool's windows), and one of a one-dim result
/// (a column sum) sets and adds into its whole result whatever the range. (Split by columns,
/// a column sum of [512, 1024] measured slower: 166 -> 306 us, two threads, `/tmp` probe.)
pub(crate) fn splits_outer(k: &Kernel) -> bool {
    !k.out_dims.is_empty()
        && k.scatter.is_none()
        && k.scan.is_none_or(|s| s.axis != 0)
        && match form(k) {
            Form::Loops { .. } => true,
            // Rows of a reduction whose vector lane is not the outermost dim: a max-pool's
            // windows (`[n, h, w, c]` over `[2, 2]`), each row's elements combined in the same
            // order over the reduced indices whatever the range.
            Form::Accumulate | Form::InRegisters => k.out_dims.len() >= 2,
        }
}

/// How many result elements of a reduction `elements_jammed` computes at once.
const JAM: usize = 4;

/// Whether `k`, a kernel of loops over its result (`Form::Loops`), computes `JAM` result
/// elements of its innermost dim at once (`elements_jammed`): a sum, maximum or minimum whose
/// result's innermost dim has at least `JAM` elements and whose body is short enough to copy
/// `JAM` times (`unrolls`). Not an argmax (its index), not a sum to one value (accumulated in
/// f64).
fn jams(k: &Kernel) -> bool {
    matches!(&k.reduce, Some((how, _)) if *how != Combine::ArgMax)
        && k.out_dims.last().is_some_and(|&d| d >= JAM)
        && k.scatter.is_none()
        && k.scan.is_none()
        && matches!(form(k), Form::Loops { .. })
        && unrolls(k)
}

/// Whether `k`'s vector loop runs two f32x4 copies of its body an iteration at the optimized
/// tier (the quick tier runs one: `build`). Whatever the tier, it also decides whether a row
/// reduction is jammed (`jams`) and whether the body's transcendental functions are inline.
pub(crate) fn unrolls(k: &Kernel) -> bool {
    k.code_weight() <= UNROLL_MAX_WEIGHT
}

fn clif_type(d: DType) -> Type {
    match d {
        DType::F32 => F32,
        DType::F64 => F64,
        DType::I32 | DType::U32 => I32,
        DType::I64 => I64,
        // The 16 bits; `narrow.rs` leaves them only loads, stores and conversions.
        DType::F16 | DType::BF16 => I16,
        DType::Bool => I8,
    }
}

/// The lowest and highest value of integer type `d` (max's and min's identities).
pub(crate) fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::U32 => (0, u32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::I32 | DType::F32 | DType::F64 | DType::Bool | DType::F16 | DType::BF16 => {
            (i32::MIN as i64, i32::MAX as i64)
        }
    }
}

fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// The signature of an outlined function at `lanes`: one f32 or f32x4 in, one out.
fn outlined_signature(lanes: Lanes) -> Signature {
    let ty = if lanes == Lanes::Four { F32X4 } else { F32 };
    let mut sig = Signature::new(CallConv::SystemV);
    sig.params.push(AbiParam::new(ty));
    sig.returns.push(AbiParam::new(ty));
    sig
}

/// Defines the outlined `u` at `lanes` (declared by `Lower::call_outlined`): the inline code
/// `approx::unary_f32` emits, as a function of its own.
fn build_outlined(
    module: &mut JITModule,
    fctx: &mut FunctionBuilderContext,
    u: UnaryOp,
    lanes: Lanes,
    id: FuncId,
) -> Function {
    let sig = outlined_signature(lanes);
    let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
    let mut b = FunctionBuilder::new(&mut func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let x = b.block_params(entry)[0];
    let fx = Fx {
        ty: if lanes == Lanes::Four { F32X4 } else { F32 },
        fma: host_has_fma(),
    };
    let mut callees = ModuleCallees {
        module: &mut *module,
        refs: Vec::new(),
    };
    let y = approx::unary_f32(&mut b, fx, u, x, &mut callees);
    b.ins().return_(&[y]);
    b.finalize(module.target_config());
    func
}

/// A function built and waiting for Cranelift, and the kernel it lowers (`None`: an
/// outlined function).
struct Built {
    id: FuncId,
    func: Function,
    kernel: Option<usize>,
}

/// A function's machine code, ready for `define_function_bytes`.
struct MachineCode {
    id: FuncId,
    kernel: Option<usize>,
    align: u64,
    bytes: Vec<u8>,
    relocs: Vec<ModuleReloc>,
    vcode: Option<String>,
}

thread_local! {
    /// Each compiling thread's Cranelift context, reused: its register allocator's and
    /// analyses' buffers stay allocated between functions (a fresh one per function cost
    /// 35 us of a 15-instruction kernel's 37).
    static CONTEXT: std::cell::RefCell<Context> = std::cell::RefCell::new(Context::new());
}

/// `machine_code` in this thread's `Context` (a fresh one if Cranelift itself ran another
/// task of the pool on this thread, which holds it).
fn machine_code_here(
    isa: &dyn TargetIsa,
    id: FuncId,
    func: Function,
    kernel: Option<usize>,
    how: How,
) -> Result<MachineCode, LowerError> {
    let (disasm, cache) = (how.disasm, how.cache);
    CONTEXT.with(|c| match c.try_borrow_mut() {
        Ok(mut ctx) => machine_code(&mut ctx, isa, id, func, kernel, disasm, cache),
        Err(_) => machine_code(&mut Context::new(), isa, id, func, kernel, disasm, cache),
    })
}

/// `func`'s machine code, compiled in `ctx` (cleared first) with `isa`, through the persistent
/// cache's entries in `cache` if given, keeping the disassembly if `disasm`.
fn machine_code(
    ctx: &mut Context,
    isa: &dyn TargetIsa,
    id: FuncId,
    func: Function,
    kernel: Option<usize>,
    disasm: bool,
    cache: Option<&std::path::Path>,
) -> Result<MachineCode, LowerError> {
    ctx.clear();
    ctx.func = func;
    ctx.set_disasm(disasm);
    match cache.filter(|_| !disasm) {
        // A hit has no disassembly: `TESSERA_DISASM` compiles.
        Some(dir) => cached_compile(ctx, isa, dir)?,
        None => {
            ctx.compile(isa, &mut ControlPlane::default())
                .map_err(|e| cl(format!("{:?}", e.inner)))?;
        }
    }
    let code = ctx
        .compiled_code()
        .ok_or_else(|| cl("compiled without code"))?;
    let relocs = code
        .buffer
        .relocs()
        .iter()
        .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id))
        .collect();
    Ok(MachineCode {
        id,
        kernel,
        align: u64::from(code.buffer.alignment),
        bytes: code.code_buffer().to_vec(),
        relocs,
        vcode: code.vcode.clone().filter(|_| disasm),
    })
}

/// Compiles `ctx.func` through the persistent cache's entries in `dir` (`cache.rs`), leaving
/// the code in `ctx` as `Context::compile` does: Cranelift's incremental cache looks the
/// function up by its key and stores it on a miss. An entry found but not usable (written by
/// another Cranelift) is counted rejected. When verifying (`cache::verifying`), a hit is
/// compiled again and, if the code differs, the entry is removed and the fresh code kept.
fn cached_compile(
    ctx: &mut Context,
    isa: &dyn TargetIsa,
    dir: &std::path::Path,
) -> Result<(), LowerError> {
    use crate::cache::{self, DirStore, Outcome};
    let mut store = DirStore::new(dir);
    let (code, hit) = ctx
        .compile_with_cache(isa, &mut store, &mut ControlPlane::default())
        .map_err(|e| cl(format!("{:?}", e.inner)))?;
    if !hit {
        if store.found() {
            cache::count_rejected();
        }
        cache::count(Outcome::Miss);
        return Ok(());
    }
    if !cache::verifying() {
        cache::count(Outcome::Hit);
        return Ok(());
    }
    let entry = code.clone();
    let fresh = ctx
        .compile(isa, &mut ControlPlane::default())
        .map_err(|e| cl(format!("{:?}", e.inner)))?;
    if *fresh == entry {
        cache::count(Outcome::Hit);
    } else {
        store.remove_found();
        cache::count(Outcome::Mismatch);
    }
    Ok(())
}

/// Compiles `built` with `isa`, on the rayon pool (every core) when `how.parallel`: each
/// function is independent (a `Context` of its own; the ISA is `Sync`), and the result keeps
/// `built`'s order, so the module's layout does not depend on the scheduling. Cranelift's
/// `define_function` does the same steps on one thread: compile, then the relocations named by
/// the function's imports.
fn compile_all(
    isa: &dyn TargetIsa,
    built: Vec<Built>,
    how: How,
) -> Result<Vec<MachineCode>, LowerError> {
    // Largest first, one function a task: the longest (a tanh body is a third of the seed
    // step's compile) starts at once and the small ones fill in around it.
    let mut order: Vec<(usize, Built)> = built.into_iter().enumerate().collect();
    order.sort_by_key(|(i, b)| (std::cmp::Reverse(b.func.dfg.num_insts()), *i));
    let mut compiled = map_all(order, how.parallel, |(i, Built { id, func, kernel })| {
        Ok((i, machine_code_here(isa, id, func, kernel, how)?))
    })?;
    compiled.sort_by_key(|(i, _)| *i);
    Ok(compiled.into_iter().map(|(_, c)| c).collect())
}

thread_local! {
    /// Each building thread's `FunctionBuilderContext`, reused between functions.
    static BUILDER: std::cell::Cell<FunctionBuilderContext> =
        std::cell::Cell::new(FunctionBuilderContext::new());
}

/// Builds and compiles each of the `unique` kernels (index, declared id, signature) on the
/// rayon pool (every core), one task a kernel, the heaviest first (`Kernel::code_weight`):
/// the longest (a tanh body is a third of the seed step's compile) starts at once and the
/// small ones fill in around it. Building was a quarter of the seed step's compile on the
/// calling thread alone before the compiles started. The result keeps `unique`'s order, so
/// the kernels' place in the module does not depend on the scheduling; the declarations a
/// build makes (its calls) go through `decls` in whatever order the tasks run, so the outlined
/// functions' ids and places may differ from run to run (their code does not).
fn build_and_compile(
    decls: &Decls,
    isas: Isas,
    (kernels, tiers): (&[Kernel], &[Tier]),
    unique: Vec<(usize, FuncId, Signature)>,
    how: How,
) -> Result<Vec<MachineCode>, LowerError> {
    let mut order: Vec<(usize, (usize, FuncId, Signature))> =
        unique.into_iter().enumerate().collect();
    order.sort_by_key(|(at, (i, _, _))| (std::cmp::Reverse(kernels[*i].code_weight()), *at));
    let mut compiled = map_all(order, how.parallel, |(at, (i, id, sig))| {
        let mut func = Function::with_name_signature(UserFuncName::user(0, id.as_u32()), sig);
        // Taken out for the build and put back after it: a build that panicked leaves a
        // fresh context, never one half used (`FunctionBuilder` does not clear it).
        let mut fctx = BUILDER.with(std::cell::Cell::take);
        build(
            decls,
            &mut func,
            &mut fctx,
            &kernels[i],
            how.outline_all,
            tiers[i],
        );
        BUILDER.with(|c| c.set(fctx));
        Ok((
            at,
            machine_code_here(isas.of(tiers[i]), id, func, Some(i), how)?,
        ))
    })?;
    compiled.sort_by_key(|(at, _)| *at);
    Ok(compiled.into_iter().map(|(_, c)| c).collect())
}

/// `c` from the function's callees `refs`, or `declare`d (and kept there) on its first use.
fn callee(
    refs: &mut Vec<(approx::Callee, FuncRef)>,
    c: approx::Callee,
    declare: impl FnOnce() -> FuncRef,
) -> FuncRef {
    if let Some(&(_, r)) = refs.iter().find(|(d, _)| *d == c) {
        return r;
    }
    let r = declare();
    refs.push((c, r));
    r
}

/// A kernel's callees while it is built on one of several threads: the module's lock is
/// taken only to declare a callee the kernel has not used yet.
struct KernelCallees<'a> {
    decls: &'a Decls,
    refs: &'a mut Vec<(approx::Callee, FuncRef)>,
}

impl approx::Callees for KernelCallees<'_> {
    fn get(&mut self, func: &mut Function, c: approx::Callee) -> FuncRef {
        callee(self.refs, c, || {
            let (name, arity) = c.symbol();
            import(&mut self.decls.lock().0, func, name, F32, arity)
        })
    }
}

/// An outlined function's callees, declared in the module it is built beside.
struct ModuleCallees<'a> {
    module: &'a mut JITModule,
    refs: Vec<(approx::Callee, FuncRef)>,
}

impl approx::Callees for ModuleCallees<'_> {
    fn get(&mut self, func: &mut Function, c: approx::Callee) -> FuncRef {
        callee(&mut self.refs, c, || {
            let (name, arity) = c.symbol();
            import(self.module, func, name, F32, arity)
        })
    }
}

/// Declares the Rust function `name` (`arity` arguments of `ty`, one result) in `func`.
fn import(
    module: &mut JITModule,
    func: &mut Function,
    name: &str,
    ty: Type,
    arity: usize,
) -> FuncRef {
    let mut sig = module.make_signature();
    for _ in 0..arity {
        sig.params.push(AbiParam::new(ty));
    }
    sig.returns.push(AbiParam::new(ty));
    let id: FuncId = module
        .declare_function(name, Linkage::Import, &sig)
        .expect("libcall signatures are consistent");
    module.declare_func_in_func(id, func)
}

/// A call of the imported `name` with the given parameter and result types.
fn import_sig(
    module: &mut JITModule,
    func: &mut Function,
    name: &str,
    params: &[Type],
    ret: Type,
) -> FuncRef {
    let mut sig = module.make_signature();
    sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
    sig.returns.push(AbiParam::new(ret));
    let id: FuncId = module
        .declare_function(name, Linkage::Import, &sig)
        .expect("libcall signatures are consistent");
    module.declare_func_in_func(id, func)
}

/// Builds the CLIF of kernel `k` into `func`, for `tier`: a quick kernel's vector loops run
/// one vector an iteration (`Lower::unroll` off), which halves the code of an elementwise
/// body (four copies to two) and so its compile time, the first call's largest part (the seed
/// step's longest kernel, 79 instructions, took 0.23-0.36 ms at the quick tier, Xeon VM).
/// Unrolling only repeats the body in the same order over the same elements, so both forms
/// compute the same bits; what decides a reduction's order (`jams`, `in_registers`) does not
/// depend on the tier.
fn build(
    decls: &Decls,
    func: &mut Function,
    fctx: &mut FunctionBuilderContext,
    k: &Kernel,
    outline_all: bool,
    tier: Tier,
) {
    let mut b = FunctionBuilder::new(func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let args = b.block_params(entry)[0];
    let range = (b.block_params(entry)[1], b.block_params(entry)[2]);
    let bufs: Vec<Value> = (0..=k.n_inputs)
        .map(|i| {
            b.ins()
                .load(I64, mem().with_aligned(), args, (8 * i) as i32)
        })
        .collect();
    let vars: Vec<Variable> = (0..k.nvars()).map(|_| b.declare_var(I64)).collect();
    let mut l = Lower {
        b,
        decls,
        outlined_refs: Vec::new(),
        bufs,
        vars,
        fma: host_has_fma(),
        lane_var: None,
        range,
        callees: Vec::new(),
        consts: Default::default(),
        index_ops: Default::default(),
        unroll: unrolls(k) && tier == Tier::Optimized,
        outline: outline_all || !unrolls(k),
    };
    l.kernel(k);
    l.b.ins().return_(&[]);
    l.b.finalize(decls.config);
}

impl Lower<'_, '_> {
    /// `for var in start..end step step { body }`.
    fn for_loop(
        &mut self,
        var: usize,
        start: Value,
        end: Value,
        step: i64,
        body: &mut dyn FnMut(&mut Self),
    ) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.def_var(self.vars[var], start);
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let v = self.b.use_var(self.vars[var]);
        // Runs while a whole step fits: `v + step <= end`, which is `v < end` for step 1.
        let ok = if step == 1 {
            self.b.ins().icmp(IntCC::SignedLessThan, v, end)
        } else {
            let step = self.iconst(step);
            let next = self.add_i64(v, step);
            self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, end)
        };
        self.b.ins().brif(ok, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        body(self);
        let v = self.b.use_var(self.vars[var]);
        let step = self.iconst(step);
        let next = self.add_i64(v, step);
        self.b.def_var(self.vars[var], next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// The i64 constant `v`, made once per block: a value made earlier in the current block
    /// dominates every later use in it.
    fn iconst(&mut self, v: i64) -> Value {
        let Some(block) = self.b.current_block() else {
            return self.b.ins().iconst(I64, v);
        };
        if let Some(&c) = self.consts.get(&(block, v)) {
            return c;
        }
        let c = self.b.ins().iconst(I64, v);
        self.consts.insert((block, v), c);
        c
    }

    /// The value of `v` when an i64 `iconst` made it.
    fn known(&self, v: Value) -> Option<i64> {
        let dfg = &self.b.func.dfg;
        let inst = dfg.value_def(v).inst()?;
        match dfg.insts[inst] {
            InstructionData::UnaryImm {
                opcode: Opcode::Iconst,
                imm,
            } if dfg.value_type(v) == I64 => Some(imm.bits()),
            _ => None,
        }
    }

    /// `v` as a value and a constant added to it (`None`: `v` is the constant): the form
    /// `add_i64` and `mul_i64` keep, the constant outermost.
    fn split_i64(&self, v: Value) -> (Option<Value>, i64) {
        if let Some(k) = self.known(v) {
            return (None, k);
        }
        let dfg = &self.b.func.dfg;
        if let Some(inst) = dfg.value_def(v).inst()
            && let InstructionData::Binary {
                opcode: Opcode::Iadd,
                args: [x, y],
            } = dfg.insts[inst]
            && let Some(k) = self.known(y)
        {
            return (Some(x), k);
        }
        (Some(v), 0)
    }

    /// `op` (`iadd` or `imul`) of `a` and `b`, made once per block.
    fn index_op(&mut self, op: Opcode, a: Value, b: Value) -> Value {
        let Some(block) = self.b.current_block() else {
            return self.index_inst(op, a, b);
        };
        if let Some(&v) = self.index_ops.get(&(block, op, a, b)) {
            return v;
        }
        let v = self.index_inst(op, a, b);
        self.index_ops.insert((block, op, a, b), v);
        v
    }

    fn index_inst(&mut self, op: Opcode, a: Value, b: Value) -> Value {
        if op == Opcode::Imul {
            self.b.ins().imul(a, b)
        } else {
            self.b.ins().iadd(a, b)
        }
    }

    /// `x + k`, the constant last (`split_i64` finds it there).
    fn with_const(&mut self, x: Option<Value>, k: i64) -> Value {
        match x {
            None => self.iconst(k),
            Some(x) if k == 0 => x,
            Some(x) => {
                let c = self.iconst(k);
                self.index_op(Opcode::Iadd, x, c)
            }
        }
    }

    /// `a + b` on i64 index arithmetic: the wrapping sum `iadd` computes, with the constants
    /// of both sides folded into one added last. Index arithmetic is exact modulo 2^64, so
    /// folding and reassociating give the same bits; the address of a load was a dozen adds
    /// and multiplies of constants, half a kernel's instructions for Cranelift to simplify.
    fn add_i64(&mut self, a: Value, b: Value) -> Value {
        let (xa, ka) = self.split_i64(a);
        let (xb, kb) = self.split_i64(b);
        let x = match (xa, xb) {
            (Some(p), Some(q)) => Some(self.index_op(Opcode::Iadd, p, q)),
            (p, q) => p.or(q),
        };
        self.with_const(x, ka.wrapping_add(kb))
    }

    /// `v * c` on i64 index arithmetic (`imul`'s wrapping product), its constant distributed
    /// as in `add_i64`.
    fn mul_i64(&mut self, v: Value, c: i64) -> Value {
        if c == 1 {
            return v;
        }
        let (x, k) = self.split_i64(v);
        let x = match x {
            Some(x) if c != 0 => {
                let c = self.iconst(c);
                Some(self.index_op(Opcode::Imul, x, c))
            }
            _ => None,
        };
        self.with_const(x, k.wrapping_mul(c))
    }

    fn kernel(&mut self, k: &Kernel) {
        if let Some(sc) = &k.scatter {
            self.scatter(k, sc);
            return;
        }
        if let Some(scan) = k.scan {
            if !k.out_dims.contains(&0) {
                self.scan_loops(k, scan, 0);
            }
            return;
        }
        let nout = k.out_dims.len();
        let out_strides: Vec<i64> = {
            let mut s = vec![1i64; nout];
            for i in (0..nout.saturating_sub(1)).rev() {
                s[i] = s[i + 1] * k.out_dims[i + 1] as i64;
            }
            s
        };
        // (A flat kernel runs over the range it is called with, empty for no elements: the
        // function may serve a longer kernel of the same code.)
        if k.out_dims.contains(&0) && !k.is_flat() {
            return;
        }
        match (form(k), &k.reduce) {
            (Form::Loops { vector }, _) => self.loops(k, 0, &out_strides, vector),
            (Form::Accumulate, Some((how, dims))) => self.accumulate(k, *how, dims, &out_strides),
            (Form::InRegisters, Some((how, dims))) => {
                self.accumulate_in_registers(k, *how, dims, &out_strides)
            }
            (Form::Accumulate | Form::InRegisters, None) => {
                unreachable!("`form` gives an accumulating form to reductions only")
            }
        }
    }

    /// A scatter kernel (`ScatterPhase`): the operand copied into the output, then each
    /// update combined into its element, in row-major order of the updates on one thread.
    /// Bounds: the copy writes `0..numel` of the output; an update's element is `coords +
    /// starts` with every start clamped into `0..=hi` (`hi` = dim - window) and every window
    /// coordinate below the window, so it is inside the output (the type rule bounds windows
    /// by the operand's dims). A start with `hi < 0` (a window wider than an empty dim) lands
    /// nowhere: then no update runs, as the interpreter drops them all.
    fn scatter(&mut self, k: &Kernel, sc: &ScatterPhase) {
        let n: usize = sc.dims.iter().product();
        let copy = k.nvars() - 1;
        let (zero, end) = (self.iconst(0), self.iconst(n as i64));
        let width = k.out_dtype.byte_width() as i64;
        let t = clif_type(k.out_dtype);
        self.for_loop(copy, zero, end, 1, &mut |s| {
            let i = s.b.use_var(s.vars[copy]);
            let bytes = s.b.ins().imul_imm_s(i, width);
            let from = s.b.ins().iadd(s.bufs[sc.operand], bytes);
            let to = s.b.ins().iadd(*s.bufs.last().expect("the output"), bytes);
            let v = s.b.ins().load(t, mem(), from, 0);
            s.b.ins().store(mem(), v, to, 0);
        });
        // No update lands when there are none, when the operand is empty (an inserted dim of
        // size 0 that no index names would otherwise address a 0-byte buffer) or when a
        // window is wider than its dim.
        if k.out_dims.contains(&0) || sc.dims.contains(&0) || sc.starts.iter().any(|st| st.hi < 0) {
            return;
        }
        self.scatter_loops(k, sc, 0);
    }

    fn scatter_loops(&mut self, k: &Kernel, sc: &ScatterPhase, level: usize) {
        if level == k.out_dims.len() {
            self.scatter_element(k, sc);
            return;
        }
        let (start, end) = if level == 0 {
            self.range
        } else {
            (self.iconst(0), self.iconst(k.out_dims[level] as i64))
        };
        self.for_loop(level, start, end, 1, &mut |s| {
            s.scatter_loops(k, sc, level + 1)
        });
    }

    fn scatter_element(&mut self, k: &Kernel, sc: &ScatterPhase) {
        let d = k.out_dtype;
        let u = self.expr(&k.body, Lanes::One);
        let strides = row_major_strides(&sc.dims);
        let mut off = self.iconst(0);
        for (s, c) in strides.iter().zip(&sc.coords) {
            let v = self.coord(c);
            let t = self.mul_i64(v, *s);
            off = self.add_i64(off, t);
        }
        let mut ok = self.b.ins().iconst(I8, 1);
        for st in &sc.starts {
            let v = self.start_value(st);
            if sc.drop {
                let inside = self.start_in_range(v, st.hi);
                ok = self.b.ins().band(ok, inside);
            }
            let c = self.clamp_start(v, st.hi);
            let t = self.mul_i64(c, strides[st.dim]);
            off = self.add_i64(off, t);
        }
        let apply = self.b.create_block();
        let done = self.b.create_block();
        self.b.ins().brif(ok, apply, &[], done, &[]);
        self.b.switch_to_block(apply);
        self.b.seal_block(apply);
        let out = self.bufs.len() - 1;
        let addr = self.address(out, off, d);
        let op = match (sc.kind, d) {
            (ScatterKind::Set, _) => None,
            (ScatterKind::Add, _) => Some(BinaryOp::Add),
            (ScatterKind::Mul, _) => Some(BinaryOp::Mul),
            // On bool, min is `and` and max is `or` (as the interpreter combines them).
            (ScatterKind::Min, DType::Bool) => Some(BinaryOp::And),
            (ScatterKind::Max, DType::Bool) => Some(BinaryOp::Or),
            (ScatterKind::Min, _) => Some(BinaryOp::Min),
            (ScatterKind::Max, _) => Some(BinaryOp::Max),
        };
        let v = match op {
            None => u,
            Some(op) => {
                let old = self.b.ins().load(clif_type(d), mem(), addr, 0);
                self.binary(op, d, old, u)
            }
        };
        self.b.ins().store(mem(), v, addr, 0);
        self.b.ins().jump(done, &[]);
        self.b.switch_to_block(done);
        self.b.seal_block(done);
    }

    /// The loops of a scan kernel (`Scan`) over every result dim but the scanned one, from
    /// `level` inward; then the scan along it.
    fn scan_loops(&mut self, k: &Kernel, scan: Scan, level: usize) {
        let nout = k.out_dims.len();
        if level == nout {
            self.scan_lane(k, scan);
            return;
        }
        if level == scan.axis {
            return self.scan_loops(k, scan, level + 1);
        }
        let (start, end) = if level == 0 {
            self.range
        } else {
            (self.iconst(0), self.iconst(k.out_dims[level] as i64))
        };
        self.for_loop(level, start, end, 1, &mut |s| {
            s.scan_loops(k, scan, level + 1)
        });
    }

    /// One lane of a scan: element `i` (counted from the end with `reverse`) is the running
    /// combination of the body's values at `0..=i`, stored as it goes. Every index is inside
    /// the result: the lane variable runs over `0..n` of a non-empty dim.
    fn scan_lane(&mut self, k: &Kernel, scan: Scan) {
        let n = k.out_dims[scan.axis] as i64;
        let counter = k.nvars() - 1;
        let out_strides = row_major_strides(&k.out_dims);
        let lane = self.vars[scan.axis];
        let at = |s: &mut Self, step: Value| {
            let idx = if scan.reverse {
                let last = s.iconst(n - 1);
                s.b.ins().isub(last, step)
            } else {
                step
            };
            s.b.def_var(lane, idx);
        };
        let acc = self.b.declare_var(clif_type(k.out_dtype));
        let zero = self.iconst(0);
        at(self, zero);
        let first = self.expr(&k.body, Lanes::One);
        self.b.def_var(acc, first);
        let off = self.out_offset(&out_strides);
        self.store(k.out_dtype, first, off, Lanes::One);
        let (one, end) = (self.iconst(1), self.iconst(n));
        self.for_loop(counter, one, end, 1, &mut |s| {
            let step = s.b.use_var(s.vars[counter]);
            at(s, step);
            let x = s.expr(&k.body, Lanes::One);
            let a = s.b.use_var(acc);
            let v = s.binary(scan.op, k.out_dtype, a, x);
            s.b.def_var(acc, v);
            let off = s.out_offset(&out_strides);
            s.store(k.out_dtype, v, off, Lanes::One);
        });
    }

    /// A start index of a gather or scatter, as an i64 (u32 indices zero-extended).
    fn start_value(&mut self, st: &Start) -> Value {
        let raw = self.expr(&st.index, Lanes::One);
        match st.index.dtype() {
            DType::I64 => raw,
            DType::U32 => self.b.ins().uextend(I64, raw),
            DType::I32 => self.b.ins().sextend(I64, raw),
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => {
                unreachable!("gather and scatter indices are i32, u32 or i64 (the type rule)")
            }
        }
    }

    /// Whether start `v` is in `0..=hi`.
    fn start_in_range(&mut self, v: Value, hi: i64) -> Value {
        let lo = self
            .b
            .ins()
            .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, v, 0);
        let up = self.b.ins().icmp_imm_s(IntCC::SignedLessThanOrEqual, v, hi);
        self.b.ins().band(lo, up)
    }

    /// Start `v` clamped into `0..=hi`.
    fn clamp_start(&mut self, v: Value, hi: i64) -> Value {
        let zero = self.iconst(0);
        let hi = self.iconst(hi);
        let c = self.b.ins().smax(v, zero);
        self.b.ins().smin(c, hi)
    }

    /// The loops over the result's variables from `level` inward.
    fn loops(&mut self, k: &Kernel, level: usize, out_strides: &[i64], vector: bool) {
        let nout = k.out_dims.len();
        if level == nout {
            self.element(k, out_strides);
            return;
        }
        let extent = k.out_dims[level] as i64;
        let (start, end) = if level == 0 {
            self.range
        } else {
            (self.iconst(0), self.iconst(extent))
        };
        if level == nout - 1 && vector {
            self.vector_loop(level, start, end, &mut |s, lanes| {
                let v = s.expr(&k.body, lanes);
                let off = s.out_offset(out_strides);
                s.store(k.out_dtype, v, off, lanes);
            });
            return;
        }
        if level == nout - 1 && jams(k) {
            self.for_loop(level, start, end, JAM as i64, &mut |s| {
                s.elements_jammed(k, out_strides)
            });
            // The remainder, unless the extent is known to have none (an inner dim).
            let whole = matches!(
                (self.known_int(start), self.known_int(end)),
                (Some(lo), Some(hi)) if (hi - lo) % JAM as i64 == 0
            );
            if !whole {
                let at = self.b.use_var(self.vars[level]);
                self.for_loop(level, at, end, 1, &mut |s| s.element(k, out_strides));
            }
            return;
        }
        self.for_loop(level, start, end, 1, &mut |s| {
            s.loops(k, level + 1, out_strides, vector)
        });
    }

    /// `JAM` consecutive result elements of a reduction along the innermost result dim, from
    /// the one its variable holds (restored after): each reduced index adds into all their
    /// accumulators, so `JAM` chains of additions are in flight where `element` has one (a
    /// row sum was one add at a time, its latency: 0.8 ns an element). Each element still
    /// combines its inputs in the order of the reduced indices: `element`'s bits.
    fn elements_jammed(&mut self, k: &Kernel, out_strides: &[i64]) {
        let Some((how, dims)) = &k.reduce else {
            unreachable!("`jams` accepts reductions only")
        };
        let nout = k.out_dims.len();
        let var = nout - 1;
        let body_ty = k.body.dtype();
        let first = self.b.use_var(self.vars[var]);
        // As sums `first + q` (`add_i64`), so each element's addresses are the first one's
        // plus a displacement (`address_at`).
        let at: Vec<Value> = (0..JAM as i64)
            .map(|q| {
                let q = self.iconst(q);
                self.add_i64(first, q)
            })
            .collect();
        let accs: Vec<Variable> = (0..JAM)
            .map(|_| {
                let acc = self.b.declare_var(clif_type(k.out_dtype));
                let init = self.identity(*how, body_ty);
                self.b.def_var(acc, init);
                acc
            })
            .collect();
        self.reduce_loops(k, nout, dims, &mut |s| {
            for (&e, &acc) in at.iter().zip(&accs) {
                s.b.def_var(s.vars[var], e);
                let v = s.expr(&k.body, Lanes::One);
                let a = s.b.use_var(acc);
                let next = s.combine(*how, body_ty, a, v);
                s.b.def_var(acc, next);
            }
        });
        for (&e, &acc) in at.iter().zip(&accs) {
            self.b.def_var(self.vars[var], e);
            let off = self.out_offset(out_strides);
            let v = self.b.use_var(acc);
            self.store(k.out_dtype, v, off, Lanes::One);
        }
        self.b.def_var(self.vars[var], first);
    }

    /// `for var in start..end` with `body` on f32x4 vectors: two vectors per iteration while
    /// eight fit (when `self.unroll`), then one while four fit, then scalars.
    fn vector_loop(
        &mut self,
        var: usize,
        start: Value,
        end: Value,
        body: &mut dyn FnMut(&mut Self, Lanes),
    ) {
        if let (Some(lo), Some(hi)) = (self.known_int(start), self.known_int(end)) {
            return self.vector_loop_of(var, (lo, hi), body);
        }
        let start = if self.unroll {
            self.unrolled_vector_loop(var, start, end, body)
        } else {
            start
        };
        self.for_loop(var, start, end, 4, &mut |s| {
            s.lane_var = Some(var);
            body(s, Lanes::Four);
            s.lane_var = None;
        });
        let at = self.b.use_var(self.vars[var]);
        self.for_loop(var, at, end, 1, &mut |s| body(s, Lanes::One));
    }

    /// `vector_loop` over bounds known when the kernel is built (an inner dimension): only the
    /// loops that run are emitted, so a row of 32 gets the unrolled loop alone, not the body
    /// four times (compile time is linear in the code: the seed step's tanh kernel was the
    /// longest compile of its first call). The same iterations run in the same order.
    fn vector_loop_of(
        &mut self,
        var: usize,
        (lo, hi): (i64, i64),
        body: &mut dyn FnMut(&mut Self, Lanes),
    ) {
        let end = self.iconst(hi);
        let mut at = lo;
        if self.unroll && hi - at >= 8 {
            let start = self.iconst(at);
            self.unrolled_vector_loop(var, start, end, body);
            at += (hi - at) / 8 * 8;
        }
        if hi - at >= 4 {
            let start = self.iconst(at);
            self.for_loop(var, start, end, 4, &mut |s| {
                s.lane_var = Some(var);
                body(s, Lanes::Four);
                s.lane_var = None;
            });
            at += (hi - at) / 4 * 4;
        }
        if hi > at {
            let start = self.iconst(at);
            self.for_loop(var, start, end, 1, &mut |s| body(s, Lanes::One));
        }
    }

    /// The value of `v` when it is an integer constant of the function being built.
    fn known_int(&self, v: Value) -> Option<i64> {
        let inst = self.b.func.dfg.value_def(v).inst()?;
        match self.b.func.dfg.insts[inst] {
            InstructionData::UnaryImm {
                opcode: Opcode::Iconst,
                imm,
            } => Some(imm.bits()),
            _ => None,
        }
    }

    /// `for var in start..end step 8` with two f32x4 copies of `body`; returns where it stopped.
    fn unrolled_vector_loop(
        &mut self,
        var: usize,
        start: Value,
        end: Value,
        body: &mut dyn FnMut(&mut Self, Lanes),
    ) -> Value {
        self.for_loop(var, start, end, 8, &mut |s| {
            s.lane_var = Some(var);
            let v = s.b.use_var(s.vars[var]);
            body(s, Lanes::Four);
            let four = s.iconst(4);
            let v4 = s.add_i64(v, four);
            s.b.def_var(s.vars[var], v4);
            body(s, Lanes::Four);
            s.b.def_var(s.vars[var], v);
            s.lane_var = None;
        });
        self.b.use_var(self.vars[var])
    }

    /// A reduction whose innermost result dimension is contiguous: the result is set to the
    /// identity, then every reduced index adds into it, the innermost result dimension
    /// innermost and vectorized. Each result element still combines its inputs in the order of
    /// the reduced indices, as the interpreter does.
    fn accumulate(&mut self, k: &Kernel, how: Combine, dims: &[usize], out_strides: &[i64]) {
        let nout = k.out_dims.len();
        let total: i64 = k.out_dims.iter().product::<usize>() as i64;
        let identity = match how {
            Combine::Sum => 0.0,
            Combine::Max | Combine::ArgMax => f64::NEG_INFINITY,
            Combine::Min => f64::INFINITY,
        };
        // Fill the result with the identity, through the first result variable as a flat index:
        // the called rows (`ranged_nest`), or all of a one-dim result.
        let (zero, end) = if nout >= 2 {
            let row = self.iconst(out_strides[0]);
            let (from, to) = self.range;
            (self.b.ins().imul(from, row), self.b.ins().imul(to, row))
        } else {
            (self.iconst(0), self.iconst(total))
        };
        self.for_loop(0, zero, end, 1, &mut |s| {
            let v = s.b.ins().f32const(identity as f32);
            let flat = s.b.use_var(s.vars[0]);
            s.store(DType::F32, v, flat, Lanes::One);
        });
        let mut order: Vec<(usize, i64)> =
            (0..nout - 1).map(|j| (j, k.out_dims[j] as i64)).collect();
        order.extend(dims.iter().enumerate().map(|(j, &d)| (nout + j, d as i64)));
        let lane = nout - 1;
        self.ranged_nest(&order, &mut |s| {
            let zero = s.iconst(0);
            let end = s.iconst(k.out_dims[lane] as i64);
            s.vector_loop(lane, zero, end, &mut |s, lanes| {
                let v = s.expr(&k.body, lanes);
                let off = s.out_offset(out_strides);
                let out = s.bufs.len() - 1;
                let (addr, disp) = s.address_at(out, off, DType::F32);
                let ty = if lanes == Lanes::Four { F32X4 } else { F32 };
                let cur = s.b.ins().load(ty, mem(), addr, disp);
                let next = match how {
                    Combine::Sum => s.b.ins().fadd(cur, v),
                    Combine::Max | Combine::ArgMax => s.b.ins().fmax(cur, v),
                    Combine::Min => s.b.ins().fmin(cur, v),
                };
                s.b.ins().store(mem(), next, addr, disp);
            });
        });
    }

    /// `accumulate` for a result whose innermost dimension fits in registers (`in_registers`):
    /// each 4 (then each 1) of its elements is an f32x4 (f32) variable across the reduced
    /// indices, stored once after them, where `accumulate` loads and stores the result at every
    /// reduced index (a store-to-load round trip on the result each time: the seed step's
    /// bias gradient, a sum over 256 rows of [256, 32]). Each element combines its inputs in
    /// the same order, so the bits are `accumulate`'s.
    fn accumulate_in_registers(
        &mut self,
        k: &Kernel,
        how: Combine,
        dims: &[usize],
        out_strides: &[i64],
    ) {
        let nout = k.out_dims.len();
        let lane = nout - 1;
        let width = k.out_dims[lane];
        let identity = match how {
            Combine::Sum => 0.0,
            Combine::Max | Combine::ArgMax => f32::NEG_INFINITY,
            Combine::Min => f32::INFINITY,
        };
        // (first element, lanes) of each accumulator.
        let parts: Vec<(i64, Lanes)> = (0..width / 4)
            .map(|q| (4 * q as i64, Lanes::Four))
            .chain((4 * (width / 4)..width).map(|e| (e as i64, Lanes::One)))
            .collect();
        let outer: Vec<(usize, i64)> = (0..lane).map(|j| (j, k.out_dims[j] as i64)).collect();
        let reduced: Vec<(usize, i64)> = dims
            .iter()
            .enumerate()
            .map(|(j, &d)| (nout + j, d as i64))
            .collect();
        self.ranged_nest(&outer, &mut |s| {
            let accs: Vec<Variable> = parts
                .iter()
                .map(|&(_, lanes)| {
                    let c = s.b.ins().f32const(identity);
                    let (acc, c) = match lanes {
                        Lanes::Four => (s.b.declare_var(F32X4), s.b.ins().splat(F32X4, c)),
                        Lanes::One => (s.b.declare_var(F32), c),
                    };
                    s.b.def_var(acc, c);
                    acc
                })
                .collect();
            s.nest(&reduced, &mut |s| {
                for (&(at, lanes), &acc) in parts.iter().zip(&accs) {
                    let at = s.iconst(at);
                    s.b.def_var(s.vars[lane], at);
                    s.lane_var = (lanes == Lanes::Four).then_some(lane);
                    let v = s.expr(&k.body, lanes);
                    s.lane_var = None;
                    let cur = s.b.use_var(acc);
                    let next = match how {
                        Combine::Sum => s.b.ins().fadd(cur, v),
                        Combine::Max | Combine::ArgMax => s.b.ins().fmax(cur, v),
                        Combine::Min => s.b.ins().fmin(cur, v),
                    };
                    s.b.def_var(acc, next);
                }
            });
            for (&(at, _), &acc) in parts.iter().zip(&accs) {
                let at = s.iconst(at);
                s.b.def_var(s.vars[lane], at);
                let off = s.out_offset(out_strides);
                let out = s.bufs.len() - 1;
                let (addr, disp) = s.address_at(out, off, DType::F32);
                let v = s.b.use_var(acc);
                s.b.ins().store(mem(), v, addr, disp);
            }
        });
    }

    /// `nest`, the loop of result variable 0 (when it comes first) over the range the function
    /// is called with rather than its whole extent.
    fn ranged_nest(&mut self, order: &[(usize, i64)], body: &mut dyn FnMut(&mut Self)) {
        match order.split_first() {
            Some((&(0, _), rest)) => {
                let (from, to) = self.range;
                self.for_loop(0, from, to, 1, &mut |s| s.nest(rest, body));
            }
            _ => self.nest(order, body),
        }
    }

    /// Nested loops over `(var, extent)` pairs, outermost first, around `body`.
    fn nest(&mut self, order: &[(usize, i64)], body: &mut dyn FnMut(&mut Self)) {
        match order.split_first() {
            None => body(self),
            Some((&(var, extent), rest)) => {
                let zero = self.iconst(0);
                let end = self.iconst(extent);
                self.for_loop(var, zero, end, 1, &mut |s| s.nest(rest, body));
            }
        }
    }

    fn out_offset(&mut self, out_strides: &[i64]) -> Value {
        let lin = Lin {
            coef: out_strides.to_vec(),
            c: 0,
        };
        self.lin(&lin)
    }

    /// One result element: the body, or the reduction of the body over the reduced variables.
    fn element(&mut self, k: &Kernel, out_strides: &[i64]) {
        let nout = k.out_dims.len();
        let value = match &k.reduce {
            None => self.expr(&k.body, Lanes::One),
            Some((how, dims)) => {
                let body_ty = k.body.dtype();
                // An f32 sum down to one value (a loss) accumulates in f64 and rounds once, as
                // the interpreter does.
                let wide = *how == Combine::Sum && nout == 0 && body_ty == DType::F32;
                let acc = self.b.declare_var(clif_type(if *how == Combine::ArgMax {
                    body_ty
                } else if wide {
                    DType::F64
                } else {
                    k.out_dtype
                }));
                let idx = self.b.declare_var(I64);
                let init = match how {
                    Combine::Sum if wide => self.b.ins().f64const(0.0),
                    _ => self.identity(*how, body_ty),
                };
                self.b.def_var(acc, init);
                let z = self.iconst(0);
                self.b.def_var(idx, z);
                // The flat index of the reduced variables, for argmax.
                let flat = self.b.declare_var(I64);
                self.b.def_var(flat, z);
                self.reduce_loops(k, nout, dims, &mut |s| {
                    let v = s.expr(&k.body, Lanes::One);
                    let a = s.b.use_var(acc);
                    let f = s.b.use_var(flat);
                    let next = match how {
                        Combine::Sum if wide => {
                            let w = s.b.ins().fpromote(F64, v);
                            s.b.ins().fadd(a, w)
                        }
                        Combine::Sum | Combine::Max | Combine::Min => {
                            s.combine(*how, body_ty, a, v)
                        }
                        Combine::ArgMax => {
                            let take = s.argmax_take(body_ty, a, v, f);
                            let i = s.b.use_var(idx);
                            let ni = s.b.ins().select(take, f, i);
                            s.b.def_var(idx, ni);
                            s.b.ins().select(take, v, a)
                        }
                    };
                    s.b.def_var(acc, next);
                    let f1 = s.b.ins().iadd_imm_s(f, 1);
                    s.b.def_var(flat, f1);
                });
                if *how == Combine::ArgMax {
                    let i = self.b.use_var(idx);
                    self.b.ins().ireduce(I32, i)
                } else if wide {
                    let a = self.b.use_var(acc);
                    self.b.ins().fdemote(F32, a)
                } else {
                    self.b.use_var(acc)
                }
            }
        };
        let off = self.out_offset(out_strides);
        self.store(k.out_dtype, value, off, Lanes::One);
    }

    /// The value a reduction's accumulator of type `ty` starts from (an argmax's: the
    /// maximum's).
    fn identity(&mut self, how: Combine, ty: DType) -> Value {
        match how {
            Combine::Sum => self.const_of(ty, Scalar::F(0.0), Scalar::I(0)),
            Combine::Max | Combine::ArgMax => {
                self.const_of(ty, Scalar::F(f64::NEG_INFINITY), Scalar::I(int_range(ty).0))
            }
            Combine::Min => self.const_of(ty, Scalar::F(f64::INFINITY), Scalar::I(int_range(ty).1)),
        }
    }

    /// `a` combined with the next value `v` (of type `ty`) by a sum, maximum or minimum.
    fn combine(&mut self, how: Combine, ty: DType, a: Value, v: Value) -> Value {
        match how {
            Combine::Sum => self.binary(BinaryOp::Add, ty, a, v),
            Combine::Max => self.binary(BinaryOp::Max, ty, a, v),
            Combine::Min => self.binary(BinaryOp::Min, ty, a, v),
            Combine::ArgMax => unreachable!("an argmax also keeps its index (`element`)"),
        }
    }

    /// Whether `v` replaces the best `a` so far: at the first index, when `a` is not NaN and
    /// `v` is NaN or larger.
    fn argmax_take(&mut self, d: DType, a: Value, v: Value, flat: Value) -> Value {
        let first = self.b.ins().icmp_imm_s(IntCC::Equal, flat, 0);
        let better = match d {
            DType::F32 | DType::F64 => {
                let a_ok = self.b.ins().fcmp(FloatCC::Ordered, a, a);
                let v_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
                let gt = self.b.ins().fcmp(FloatCC::GreaterThan, v, a);
                let up = self.b.ins().bor(v_nan, gt);
                self.b.ins().band(a_ok, up)
            }
            DType::U32 => self.b.ins().icmp(IntCC::UnsignedGreaterThan, v, a),
            _ => self.b.ins().icmp(IntCC::SignedGreaterThan, v, a),
        };
        self.b.ins().bor(first, better)
    }

    fn reduce_loops(
        &mut self,
        k: &Kernel,
        level: usize,
        dims: &[usize],
        body: &mut dyn FnMut(&mut Self),
    ) {
        let nout = k.out_dims.len();
        if level == nout + dims.len() {
            body(self);
            return;
        }
        let zero = self.iconst(0);
        let end = self.iconst(dims[level - nout] as i64);
        self.for_loop(level, zero, end, 1, &mut |s| {
            s.reduce_loops(k, level + 1, dims, body)
        });
    }

    fn const_of(&mut self, d: DType, f: Scalar, i: Scalar) -> Value {
        match (d, f, i) {
            (DType::F32, Scalar::F(x), _) => self.b.ins().f32const(x as f32),
            (DType::F64, Scalar::F(x), _) => self.b.ins().f64const(x),
            (DType::I32 | DType::U32, _, Scalar::I(x)) => self.b.ins().iconst(I32, x as i32 as i64),
            (DType::I64, _, Scalar::I(x)) => self.b.ins().iconst(I64, x),
            (DType::F16, Scalar::F(x), _) => {
                let bits = half::f16::from_f64(x).to_bits();
                self.b.ins().iconst(I16, bits as i64)
            }
            (DType::BF16, Scalar::F(x), _) => {
                let bits = half::bf16::from_f64(x).to_bits();
                self.b.ins().iconst(I16, bits as i64)
            }
            _ => self.b.ins().iconst(I8, 0),
        }
    }

    /// The value of a linear form of the loop variables, as i64.
    fn lin(&mut self, l: &Lin) -> Value {
        let mut acc = self.iconst(l.c);
        for (j, &c) in l.coef.iter().enumerate() {
            if c != 0 {
                let v = self.b.use_var(self.vars[j]);
                let t = self.mul_i64(v, c);
                acc = self.add_i64(acc, t);
            }
        }
        acc
    }

    /// `lin / div`, clamped into `0..clamp` when asked (the division rounds toward zero; a
    /// negative coordinate clamps to 0 anyway).
    fn coord(&mut self, c: &Coord) -> Value {
        let mut v = self.lin(&c.lin);
        if c.div != 1 {
            // Folded only where `sdiv` would not trap: the quotient rounds toward zero as
            // Rust's `/` does.
            v = match self.known(v).and_then(|x| x.checked_div(c.div)) {
                Some(q) => self.iconst(q),
                None => self.b.ins().sdiv_imm_s(v, c.div),
            };
        }
        if let (Some(ext), Some(x)) = (c.clamp, self.known(v)) {
            return self.iconst(x.max(0).min(ext - 1));
        }
        if let Some(ext) = c.clamp {
            let zero = self.iconst(0);
            let hi = self.iconst(ext - 1);
            v = self.b.ins().smax(v, zero);
            v = self.b.ins().smin(v, hi);
        }
        v
    }

    fn cond(&mut self, c: &Cond) -> Value {
        let v = self.lin(&c.lin);
        let nonneg = self
            .b
            .ins()
            .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, v, 0);
        let q = if c.div != 1 {
            self.b.ins().sdiv_imm_s(v, c.div)
        } else {
            v
        };
        let in_range = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, q, c.extent);
        let mut ok = self.b.ins().band(nonneg, in_range);
        if c.div != 1 {
            let r = self.b.ins().srem_imm_s(v, c.div);
            let exact = self.b.ins().icmp_imm_s(IntCC::Equal, r, 0);
            ok = self.b.ins().band(ok, exact);
        }
        ok
    }

    fn address(&mut self, buf: usize, offset: Value, d: DType) -> Value {
        let bytes = self.mul_i64(offset, d.byte_width() as i64);
        self.add_i64(self.bufs[buf], bytes)
    }

    /// `address` as an address and the displacement a load or store adds to it: the offset's
    /// constant part when its bytes fit in 32 bits, so the unrolled copies of a body load from
    /// one address at several displacements.
    fn address_at(&mut self, buf: usize, offset: Value, d: DType) -> (Value, i32) {
        let (x, k) = self.split_i64(offset);
        let w = d.byte_width() as i64;
        match k.checked_mul(w).and_then(|b| i32::try_from(b).ok()) {
            Some(disp) => {
                let base = self.bufs[buf];
                let addr = match x {
                    Some(x) => {
                        let bytes = self.mul_i64(x, w);
                        self.add_i64(base, bytes)
                    }
                    None => base,
                };
                (addr, disp)
            }
            None => (self.address(buf, offset, d), 0),
        }
    }

    fn store(&mut self, d: DType, v: Value, offset: Value, lanes: Lanes) {
        let out = self.bufs.len() - 1;
        let (addr, disp) = self.address_at(out, offset, d);
        let _ = lanes;
        self.b.ins().store(mem(), v, addr, disp);
    }

    /// `sum(strides[i] * coords[i])`: the element offset of a load at affine coordinates.
    fn affine_offset(&mut self, strides: &[i64], coords: &[Coord]) -> Value {
        let mut off = self.iconst(0);
        for (s, c) in strides.iter().zip(coords) {
            let v = self.coord(c);
            let t = self.mul_i64(v, *s);
            off = self.add_i64(off, t);
        }
        off
    }

    fn expr(&mut self, e: &Expr, lanes: Lanes) -> Value {
        match e {
            Expr::Load {
                buf,
                dtype,
                strides,
                coords,
            } => {
                let off = self.affine_offset(strides, coords);
                let (addr, disp) = self.address_at(*buf, off, *dtype);
                if lanes == Lanes::Four {
                    // Contiguous along the lanes: one vector load; constant: a splat.
                    if self.inner_stride(strides, coords) == 1 {
                        return self.b.ins().load(F32X4, mem(), addr, disp);
                    }
                    let s = self.b.ins().load(F32, mem(), addr, disp);
                    return self.b.ins().splat(F32X4, s);
                }
                self.b.ins().load(clif_type(*dtype), mem(), addr, disp)
            }
            Expr::Gather {
                buf,
                dtype,
                strides,
                coords,
                starts,
                fill,
            } => {
                // Scalar only (`vectorizable` refuses a gather).
                let mut off = self.affine_offset(strides, coords);
                let mut ok = self.b.ins().iconst(I8, 1);
                for st in starts {
                    let v = self.start_value(st);
                    if fill.is_some() {
                        let inside = self.start_in_range(v, st.hi);
                        ok = self.b.ins().band(ok, inside);
                    }
                    // Clamped in either mode: the load stays inside the buffer (`coord + start
                    // < dim` since every window coordinate is below `dim - hi`).
                    let c = self.clamp_start(v, st.hi);
                    let t = self.mul_i64(c, strides[st.dim]);
                    off = self.add_i64(off, t);
                }
                let addr = self.address(*buf, off, *dtype);
                let x = self.b.ins().load(clif_type(*dtype), mem(), addr, 0);
                match fill {
                    Some(f) => {
                        let f = self.expr(f, Lanes::One);
                        self.b.ins().select(ok, x, f)
                    }
                    None => x,
                }
            }
            Expr::Const(d, s) => {
                let v = match (d, s) {
                    (DType::F32, Scalar::F(x)) => self.b.ins().f32const(*x as f32),
                    (DType::F64, Scalar::F(x)) => self.b.ins().f64const(*x),
                    (DType::I32 | DType::U32, Scalar::I(x)) => {
                        self.b.ins().iconst(I32, *x as i32 as i64)
                    }
                    (DType::Bool, Scalar::B(x)) => self.b.ins().iconst(I8, *x as i64),
                    (DType::I64, Scalar::I(x)) => self.b.ins().iconst(I64, *x),
                    // A narrow constant's value is exact in its type (it came from its data).
                    (DType::F16, Scalar::F(x)) => {
                        let bits = half::f16::from_f64(*x).to_bits();
                        self.b.ins().iconst(I16, bits as i64)
                    }
                    (DType::BF16, Scalar::F(x)) => {
                        let bits = half::bf16::from_f64(*x).to_bits();
                        self.b.ins().iconst(I16, bits as i64)
                    }
                    (_, _) => self.b.ins().iconst(I8, 0),
                };
                if lanes == Lanes::Four {
                    return match d {
                        DType::Bool => {
                            let m = self
                                .b
                                .ins()
                                .iconst(I32, if matches!(s, Scalar::B(true)) { -1 } else { 0 });
                            self.b.ins().splat(I32X4, m)
                        }
                        _ => self.b.ins().splat(F32X4, v),
                    };
                }
                v
            }
            Expr::Index(d, l) => {
                let v = self.lin(l);
                match d {
                    // `vectorizable`: the same index in every lane.
                    DType::F32 if lanes == Lanes::Four => {
                        let x = self.b.ins().fcvt_from_sint(F32, v);
                        self.b.ins().splat(F32X4, x)
                    }
                    DType::F32 => self.b.ins().fcvt_from_sint(F32, v),
                    DType::F64 => self.b.ins().fcvt_from_sint(F64, v),
                    DType::I64 => v,
                    DType::I32 | DType::U32 => self.b.ins().ireduce(I32, v),
                    DType::Bool | DType::F16 | DType::BF16 => {
                        unreachable!(
                            "iota of {d}: the type rule refuses bool, narrow.rs widens f16"
                        )
                    }
                }
            }
            Expr::Unary(u, d, x) => {
                let x = self.expr(x, lanes);
                self.unary(*u, *d, x, lanes)
            }
            Expr::Binary(op, d, x, y) => {
                let x = self.expr(x, lanes);
                let y = self.expr(y, lanes);
                if lanes == Lanes::Four {
                    return self.binary_vec(*op, x, y);
                }
                self.binary(*op, *d, x, y)
            }
            Expr::Compare(c, d, x, y) => {
                let x = self.expr(x, lanes);
                let y = self.expr(y, lanes);
                self.compare(*c, *d, x, y)
            }
            Expr::Select(_, p, t, f) => {
                let p = self.expr(p, lanes);
                let t = self.expr(t, lanes);
                let f = self.expr(f, lanes);
                if lanes == Lanes::Four {
                    let m = self.b.ins().bitcast(
                        F32X4,
                        MemFlagsData::new()
                            .with_endianness(cranelift_codegen::ir::Endianness::Little),
                        p,
                    );
                    return self.b.ins().bitselect(m, t, f);
                }
                self.b.ins().select(p, t, f)
            }
            Expr::Convert { from, to, x } => {
                let x = self.expr(x, lanes);
                self.convert(*from, *to, x)
            }
            Expr::Bitcast { from, to, x } => {
                let x = self.expr(x, lanes);
                if clif_type(*from) == clif_type(*to) {
                    x
                } else {
                    self.b.ins().bitcast(clif_type(*to), MemFlagsData::new(), x)
                }
            }
            Expr::Guard {
                conds,
                then,
                otherwise,
                ..
            } => {
                let mut ok = self.b.ins().iconst(I8, 1);
                for c in conds {
                    let v = self.cond(c);
                    ok = self.b.ins().band(ok, v);
                }
                let t = self.expr(then, lanes);
                let f = self.expr(otherwise, lanes);
                self.b.ins().select(ok, t, f)
            }
        }
    }

    /// The stride of a load along the lane variable, in elements.
    fn inner_stride(&self, strides: &[i64], coords: &[Coord]) -> i64 {
        let j = self.lane_var.expect("vector mode has a lane variable");
        strides
            .iter()
            .zip(coords)
            .map(|(s, c)| s * c.lin.coef[j])
            .sum()
    }

    fn fx(&mut self, lanes: Lanes) -> Fx {
        Fx {
            ty: if lanes == Lanes::Four { F32X4 } else { F32 },
            fma: self.fma,
        }
    }

    fn import(&mut self, name: &str, ty: Type, arity: usize) -> FuncRef {
        import(&mut self.decls.lock().0, self.b.func, name, ty, arity)
    }

    /// A call of the outlined `u` at `lanes`, declared in the module on first use.
    fn call_outlined(&mut self, u: UnaryOp, lanes: Lanes, x: Value) -> Value {
        let declared = self.outlined_refs.iter().find(|r| r.0 == u && r.1 == lanes);
        let fref = match declared {
            Some(&(_, _, fref)) => fref,
            None => {
                let mut shared = self.decls.lock();
                let (module, outlined) = &mut *shared;
                let known = outlined.iter().find(|r| r.0 == u && r.1 == lanes);
                let id = match known {
                    Some(&(_, _, id)) => id,
                    None => {
                        let name = format!("tessera_outlined_{u:?}_{lanes:?}");
                        let sig = outlined_signature(lanes);
                        let id = module
                            .declare_function(&name, Linkage::Local, &sig)
                            .expect("each outlined function is declared once");
                        outlined.push((u, lanes, id));
                        id
                    }
                };
                let fref = module.declare_func_in_func(id, self.b.func);
                self.outlined_refs.push((u, lanes, fref));
                fref
            }
        };
        let call = self.b.ins().call(fref, &[x]);
        self.b.inst_results(call)[0]
    }

    fn call_libcall(&mut self, name: &str, ty: Type, args: &[Value]) -> Value {
        let fref = self.import(name, ty, args.len());
        let call = self.b.ins().call(fref, args);
        self.b.inst_results(call)[0]
    }

    fn unary(&mut self, u: UnaryOp, d: DType, x: Value, lanes: Lanes) -> Value {
        match d {
            DType::F32 => {
                if self.outline && crate::fusion::is_transcendental(&tessera_ir::Op::Unary(u)) {
                    return self.call_outlined(u, lanes, x);
                }
                let fx = self.fx(lanes);
                let mut calls = KernelCallees {
                    decls: self.decls,
                    refs: &mut self.callees,
                };
                approx::unary_f32(&mut self.b, fx, u, x, &mut calls)
            }
            DType::F64 => {
                let f = match u {
                    UnaryOp::Neg => return self.b.ins().fneg(x),
                    UnaryOp::Abs => return self.b.ins().fabs(x),
                    UnaryOp::Sqrt => return self.b.ins().sqrt(x),
                    UnaryOp::Rsqrt => {
                        let s = self.b.ins().sqrt(x);
                        let one = self.b.ins().f64const(1.0);
                        return self.b.ins().fdiv(one, s);
                    }
                    UnaryOp::Floor => return self.b.ins().floor(x),
                    UnaryOp::Ceil => return self.b.ins().ceil(x),
                    UnaryOp::Round | UnaryOp::Sign => {
                        let fx = Fx {
                            ty: F64,
                            fma: self.fma,
                        };
                        return if u == UnaryOp::Round {
                            approx::round_exact(&mut self.b, fx, x)
                        } else {
                            approx::sign_exact(&mut self.b, fx, x)
                        };
                    }
                    UnaryOp::Logistic => "tessera_logistic_f64",
                    UnaryOp::Exp => "tessera_exp_f64",
                    UnaryOp::Log => "tessera_log_f64",
                    UnaryOp::Log1p => "tessera_log1p_f64",
                    UnaryOp::Expm1 => "tessera_expm1_f64",
                    UnaryOp::Tanh => "tessera_tanh_f64",
                    UnaryOp::Sin => "tessera_sin_f64",
                    UnaryOp::Cos => "tessera_cos_f64",
                    UnaryOp::Erf => "tessera_erf_f64",
                    UnaryOp::ErfInv => "tessera_erf_inv_f64",
                    UnaryOp::Not => return x,
                    UnaryOp::Tan => elem::symbols(Libm::Tan).1,
                    UnaryOp::Asin => elem::symbols(Libm::Asin).1,
                    UnaryOp::Acos => elem::symbols(Libm::Acos).1,
                    UnaryOp::Atan => elem::symbols(Libm::Atan).1,
                    UnaryOp::Sinh => elem::symbols(Libm::Sinh).1,
                    UnaryOp::Cosh => elem::symbols(Libm::Cosh).1,
                    UnaryOp::Asinh => elem::symbols(Libm::Asinh).1,
                    UnaryOp::Acosh => elem::symbols(Libm::Acosh).1,
                    UnaryOp::Atanh => elem::symbols(Libm::Atanh).1,
                    UnaryOp::Exp2 => elem::symbols(Libm::Exp2).1,
                };
                self.call_libcall(f, F64, &[x])
            }
            DType::F16 | DType::BF16 => {
                unreachable!("{u:?} on {d}: narrow.rs computes it in f32")
            }
            DType::I32 | DType::U32 | DType::I64 => match u {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs if d != DType::U32 => {
                    let n = self.b.ins().ineg(x);
                    self.b.ins().smax(x, n)
                }
                UnaryOp::Abs => x,
                UnaryOp::Sign if d != DType::U32 => {
                    let t = clif_type(d);
                    let pos = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                    let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                    let p = self.b.ins().uextend(t, pos);
                    let n = self.b.ins().uextend(t, neg);
                    self.b.ins().isub(p, n)
                }
                UnaryOp::Sign => {
                    let pos = self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0);
                    self.b.ins().uextend(I32, pos)
                }
                UnaryOp::Not => self.b.ins().bnot(x),
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Expm1
                | UnaryOp::Tanh
                | UnaryOp::Logistic
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Erf
                | UnaryOp::ErfInv
                | UnaryOp::Tan
                | UnaryOp::Asin
                | UnaryOp::Acos
                | UnaryOp::Atan
                | UnaryOp::Sinh
                | UnaryOp::Cosh
                | UnaryOp::Asinh
                | UnaryOp::Acosh
                | UnaryOp::Atanh
                | UnaryOp::Exp2 => {
                    unreachable!(
                        "the verifier's type rule (UnaryOp::accepts) admits {u:?} on floats only"
                    )
                }
            },
            DType::Bool => {
                // not: 1 - x on 0/1 bytes.
                self.b.ins().bxor_imm_s(x, 1)
            }
        }
    }

    fn binary_vec(&mut self, op: BinaryOp, x: Value, y: Value) -> Value {
        let fx = self.fx(Lanes::Four);
        let mut calls = KernelCallees {
            decls: self.decls,
            refs: &mut self.callees,
        };
        approx::binary_f32(&mut self.b, fx, op, x, y, &mut calls)
    }

    fn binary(&mut self, op: BinaryOp, d: DType, x: Value, y: Value) -> Value {
        match d {
            DType::F32 if op == BinaryOp::Rem => {
                self.call_libcall("tessera_fmod_f32", F32, &[x, y])
            }
            DType::F32 => {
                let fx = self.fx(Lanes::One);
                let mut calls = KernelCallees {
                    decls: self.decls,
                    refs: &mut self.callees,
                };
                approx::binary_f32(&mut self.b, fx, op, x, y, &mut calls)
            }
            DType::F64 => match op {
                BinaryOp::Add => self.b.ins().fadd(x, y),
                BinaryOp::Sub => self.b.ins().fsub(x, y),
                BinaryOp::Mul => self.b.ins().fmul(x, y),
                BinaryOp::Div => self.b.ins().fdiv(x, y),
                BinaryOp::Max => self.b.ins().fmax(x, y),
                BinaryOp::Min => self.b.ins().fmin(x, y),
                BinaryOp::Pow => self.call_libcall("tessera_pow_f64", F64, &[x, y]),
                BinaryOp::Rem => self.call_libcall("tessera_fmod_f64", F64, &[x, y]),
                BinaryOp::Atan2 => self.call_libcall("tessera_atan2_f64", F64, &[x, y]),
                BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRightLogical => {
                    unreachable!(
                        "the verifier's type rule (BinaryOp::accepts) admits {op:?} on integers and bool only"
                    )
                }
            },
            DType::I32 | DType::U32 | DType::I64 => self.int_binary(op, d != DType::U32, x, y),
            DType::F16 | DType::BF16 => {
                unreachable!("{op:?} on {d}: narrow.rs computes it in f32")
            }
            DType::Bool => match op {
                BinaryOp::And => self.b.ins().band(x, y),
                BinaryOp::Or => self.b.ins().bor(x, y),
                BinaryOp::Xor => self.b.ins().bxor(x, y),
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Rem
                | BinaryOp::Max
                | BinaryOp::Min
                | BinaryOp::Pow
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRightLogical
                | BinaryOp::Atan2 => {
                    unreachable!(
                        "the verifier's type rule (BinaryOp::accepts) admits only and/or/xor on bool, not {op:?}"
                    )
                }
            },
        }
    }

    /// Integer arithmetic with XLA's total semantics: no op traps.
    fn int_binary(&mut self, op: BinaryOp, signed: bool, x: Value, y: Value) -> Value {
        let i = &mut self.b;
        let t = i.func.dfg.value_type(x);
        match op {
            BinaryOp::Add => i.ins().iadd(x, y),
            BinaryOp::Sub => i.ins().isub(x, y),
            BinaryOp::Mul => i.ins().imul(x, y),
            BinaryOp::Div | BinaryOp::Rem => {
                let zero = i.ins().icmp_imm_s(IntCC::Equal, y, 0);
                // A divisor of 0 (and, signed, of -1) is replaced by 1 so the divide cannot trap;
                // the true result is selected afterwards.
                let minus1 = i.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let unsafe_div = if signed {
                    i.ins().bor(zero, minus1)
                } else {
                    zero
                };
                let one = i.ins().iconst(t, 1);
                let safe_y = i.ins().select(unsafe_div, one, y);
                let q = if signed {
                    i.ins().sdiv(x, safe_y)
                } else {
                    i.ins().udiv(x, safe_y)
                };
                if op == BinaryOp::Div {
                    let all_ones = i.ins().iconst(t, -1);
                    let neg_x = i.ins().ineg(x);
                    let r = if signed {
                        i.ins().select(minus1, neg_x, q)
                    } else {
                        q
                    };
                    i.ins().select(zero, all_ones, r)
                } else {
                    let prod = i.ins().imul(q, safe_y);
                    let r = i.ins().isub(x, prod);
                    let zero_v = i.ins().iconst(t, 0);
                    let r = if signed {
                        i.ins().select(minus1, zero_v, r)
                    } else {
                        r
                    };
                    i.ins().select(zero, x, r)
                }
            }
            BinaryOp::Max => {
                if signed {
                    i.ins().smax(x, y)
                } else {
                    i.ins().umax(x, y)
                }
            }
            BinaryOp::Min => {
                if signed {
                    i.ins().smin(x, y)
                } else {
                    i.ins().umin(x, y)
                }
            }
            BinaryOp::And => i.ins().band(x, y),
            BinaryOp::Or => i.ins().bor(x, y),
            BinaryOp::Xor => i.ins().bxor(x, y),
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => {
                let width = i64::from(t.bits());
                let big = i
                    .ins()
                    .icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, y, width);
                let s = if op == BinaryOp::ShiftLeft {
                    i.ins().ishl(x, y)
                } else {
                    i.ins().ushr(x, y)
                };
                let zero = i.ins().iconst(t, 0);
                i.ins().select(big, zero, s)
            }
            BinaryOp::Pow | BinaryOp::Atan2 => x,
        }
    }

    fn compare(&mut self, c: CompareOp, d: DType, x: Value, y: Value) -> Value {
        assert!(
            !d.is_narrow_float(),
            "compare on {d}: narrow.rs computes it in f32"
        );
        if d.is_float() {
            let cc = match c {
                CompareOp::Eq => FloatCC::Equal,
                CompareOp::Ne => FloatCC::NotEqual,
                CompareOp::Lt => FloatCC::LessThan,
                CompareOp::Le => FloatCC::LessThanOrEqual,
                CompareOp::Gt => FloatCC::GreaterThan,
                CompareOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            return self.b.ins().fcmp(cc, x, y);
        }
        let signed = matches!(d, DType::I32 | DType::I64);
        let cc = match (c, signed) {
            (CompareOp::Eq, _) => IntCC::Equal,
            (CompareOp::Ne, _) => IntCC::NotEqual,
            (CompareOp::Lt, true) => IntCC::SignedLessThan,
            (CompareOp::Le, true) => IntCC::SignedLessThanOrEqual,
            (CompareOp::Gt, true) => IntCC::SignedGreaterThan,
            (CompareOp::Ge, true) => IntCC::SignedGreaterThanOrEqual,
            (CompareOp::Lt, false) => IntCC::UnsignedLessThan,
            (CompareOp::Le, false) => IntCC::UnsignedLessThanOrEqual,
            (CompareOp::Gt, false) => IntCC::UnsignedGreaterThan,
            (CompareOp::Ge, false) => IntCC::UnsignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, x, y)
    }

    fn convert(&mut self, from: DType, to: DType, x: Value) -> Value {
        use DType::{BF16, Bool, F16, F32, F64, I32, I64, U32};
        // f16 and bf16 go through f32 except from f32 and f64, which round directly (the
        // interpreter's `convert`); the conversions themselves are half's, called.
        let narrow_call = |s: &mut Self, name: &str, x: Value, ret: Type| {
            let arg = s.b.func.dfg.value_type(x);
            let fref = import_sig(&mut s.decls.lock().0, s.b.func, name, &[arg], ret);
            let call = s.b.ins().call(fref, &[x]);
            s.b.inst_results(call)[0]
        };
        match (from, to) {
            (a, b) if a == b => return x,
            (F16 | BF16, _) => {
                let bits = self.b.ins().uextend(types::I32, x);
                let name = if from == F16 {
                    "tessera_f16_to_f32"
                } else {
                    "tessera_bf16_to_f32"
                };
                let w = narrow_call(self, name, bits, types::F32);
                return self.convert(F32, to, w);
            }
            (F32 | F64, F16 | BF16) => {
                let name = match (from, to) {
                    (F32, F16) => "tessera_f32_to_f16",
                    (F32, _) => "tessera_f32_to_bf16",
                    (_, F16) => "tessera_f64_to_f16",
                    (_, _) => "tessera_f64_to_bf16",
                };
                let bits = narrow_call(self, name, x, types::I32);
                return self.b.ins().ireduce(types::I16, bits);
            }
            (I32 | U32 | I64 | Bool, F16 | BF16) => {
                let w = self.convert(from, F32, x);
                return self.convert(F32, to, w);
            }
            _ => {}
        }
        let i = &mut self.b;
        match (from, to) {
            (F32, F64) => i.ins().fpromote(types::F64, x),
            (F64, F32) => i.ins().fdemote(types::F32, x),
            (F32 | F64, I32) => i.ins().fcvt_to_sint_sat(types::I32, x),
            (F32 | F64, U32) => i.ins().fcvt_to_uint_sat(types::I32, x),
            (F32 | F64, I64) => i.ins().fcvt_to_sint_sat(types::I64, x),
            (I32 | I64, F32 | F64) => i.ins().fcvt_from_sint(clif_type(to), x),
            (U32, F32 | F64) => {
                let w = i.ins().uextend(types::I64, x);
                i.ins().fcvt_from_sint(clif_type(to), w)
            }
            (I32, U32) | (U32, I32) => x,
            (I32, I64) => i.ins().sextend(types::I64, x),
            (U32, I64) => i.ins().uextend(types::I64, x),
            (I64, I32 | U32) => i.ins().ireduce(types::I32, x),
            (F32, Bool) => {
                let z = i.ins().f32const(0.0);
                i.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (F64, Bool) => {
                let z = i.ins().f64const(0.0);
                i.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (I32 | U32 | I64, Bool) => i.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            (Bool, I32 | U32 | I64) => i.ins().uextend(clif_type(to), x),
            (Bool, F32 | F64) => {
                let w = i.ins().uextend(types::I32, x);
                i.ins().fcvt_from_sint(clif_type(to), w)
            }
            (F32, F32)
            | (F64, F64)
            | (I32, I32)
            | (U32, U32)
            | (I64, I64)
            | (Bool, Bool)
            | (F16 | BF16, _)
            | (_, F16 | BF16) => unreachable!("handled above"),
        }
    }
}

/// Row-major strides (in elements) of `dims`.
fn row_major_strides(dims: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as i64;
    }
    s
}

/// Whether the innermost result loop (variable `lane`) can run on f32x4: an f32 kernel whose
/// loads are contiguous or constant along it, with no guards, conversions or index values
/// other than f32 ones constant along it.
fn vectorizable(body: &Expr, lane: usize) -> bool {
    let mut ok = body.dtype() == DType::F32;
    body.walk(&mut |e| match e {
        Expr::Load {
            dtype,
            strides,
            coords,
            ..
        } => {
            let s: i64 = strides
                .iter()
                .zip(coords)
                .map(|(s, c)| s * c.lin.coef[lane])
                .sum();
            let plain = coords.iter().all(|c| c.div == 1 && c.clamp.is_none());
            ok &= *dtype == DType::F32 && (s == 0 || s == 1) && plain;
        }
        Expr::Const(d, _) => ok &= matches!(d, DType::F32 | DType::Bool),
        Expr::Unary(_, d, _) => ok &= *d == DType::F32,
        Expr::Binary(op, d, _, _) => ok &= *d == DType::F32 && *op != BinaryOp::Rem,
        Expr::Compare(_, d, _, _) => ok &= *d == DType::F32,
        Expr::Select(d, ..) => ok &= *d == DType::F32,
        // An f32 index the same along the vector (a window position's): one value splat.
        Expr::Index(d, l) => ok &= *d == DType::F32 && l.coef[lane] == 0,
        Expr::Gather { .. } | Expr::Guard { .. } | Expr::Convert { .. } | Expr::Bitcast { .. } => {
            ok = false
        }
    });
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compile of several kernels on a thread that can lead the team (two CPUs, a pool of
    /// two threads) takes them from one counter on this thread and the team's helper
    /// (`map_all`); the code is the same either way (every other test compiles both ways).
    #[test]
    fn kernels_compile_on_this_thread_and_the_teams_helper() {
        let g = tessera_ir::parse(
            "func @f(%0: f32[64,32], %1: f32[32]) {
  %2 = tanh %0 : f32[64,32]
  %3 = reduce_sum %0 axes=[0] : f32[32]
  %4 = mul %3, %1 : f32[32]
  %5 = exp %4 : f32[32]
  %6 = reduce_max %2 axes=[1] : f32[64]
  return %2, %5, %6
}",
        )
        .unwrap();
        let (posts, team) = crate::team::posts_once_the_team_is_free(|| {
            crate::compile(&g).unwrap();
        });
        assert_eq!(posts > 0, team, "{posts} posts");
    }
    use crate::fusion::{StepKind, fuse, is_transcendental};
    use tessera_ir::{Graph, Op, TensorType};

    /// The kernels `g` fuses into.
    fn kernels_of(g: &Graph) -> Vec<Kernel> {
        let schedule = fuse(g);
        let mut ks = Vec::new();
        for st in schedule.steps {
            match st.kind {
                StepKind::Kernel(k) => ks.push(k),
                StepKind::Gemm(_)
                | StepKind::Collective(_)
                | StepKind::Region(_)
                | StepKind::Window(_)
                | StepKind::Native(_) => {}
            }
        }
        ks
    }

    /// How many instructions of kernel `k`'s CLIF have opcode `op`.
    fn clif_count(k: &Kernel, op: Opcode) -> usize {
        clif_count_at(k, op, Tier::Optimized)
    }

    /// `clif_count` of `k` built for `tier`.
    fn clif_count_at(k: &Kernel, op: Opcode, tier: Tier) -> usize {
        let func = built_at(k, tier);
        func.layout
            .blocks()
            .flat_map(|b| func.layout.block_insts(b))
            .filter(|&i| func.dfg.insts[i].opcode() == op)
            .count()
    }

    /// A loop over an inner dimension (bounds known when the kernel is built) emits only the
    /// copies of its body that run: tanh's one division per copy counts them. A row of 32 is
    /// four unrolled iterations (2 copies); 36 adds one f32x4 step (3); 30 also a scalar
    /// remainder (4); the outer range of a rank-1 kernel is the caller's (all 4), as is that of
    /// rows shorter than 8, one loop over their elements (`Kernel::flattened`).
    #[test]
    fn inner_loops_emit_only_the_copies_that_run() {
        let tanh_of = |dims: Vec<usize>| {
            let mut g = Graph::new("t");
            let x = g.add_param(TensorType::new(tessera_ir::DType::F32, dims));
            let y = g.add(Op::Unary(tessera_ir::UnaryOp::Tanh), &[x]).unwrap();
            g.set_outputs(vec![y]);
            let k = kernels_of(&g).pop().expect("the tanh kernel");
            clif_count(&k, Opcode::Fdiv)
        };
        assert_eq!(tanh_of(vec![256, 32]), 2);
        assert_eq!(tanh_of(vec![256, 36]), 3);
        assert_eq!(tanh_of(vec![256, 30]), 4);
        assert_eq!(tanh_of(vec![8192]), 4);
        // Flat kernels emit their loops whatever their length (their function may serve a
        // longer kernel): none of length 0, one scalar loop of length 2, before.
        assert_eq!(tanh_of(vec![0]), 4);
        assert_eq!(tanh_of(vec![2]), 4);
        assert_eq!(
            tanh_of(vec![256, 3]),
            4,
            "rows of 3: one loop over the 768 elements"
        );
    }

    /// A quick kernel's vector loops run one vector an iteration: tanh's one division per copy
    /// counts the copies, half the optimized kernel's (an unrolled pair, one vector, one
    /// scalar: 4, against one vector and one scalar: 2); over a row of 32, the unrolled pair
    /// (2) against one vector loop (1). A row reduction's jammed form is the same at both
    /// tiers (its `JAM` copies of the combine and one for the remainder); a column sum's vector
    /// loop over the result row is not (2 copies against 1). The two forms compute the same
    /// bits: `tests/differential.rs` runs every corpus sample at both tiers.
    #[test]
    fn quick_kernels_run_one_vector_an_iteration() {
        let copies = |op: Op, dims: Vec<usize>, count: Opcode| {
            let mut g = Graph::new("t");
            let x = g.add_param(TensorType::new(DType::F32, dims));
            let y = g.add(op, &[x]).unwrap();
            g.set_outputs(vec![y]);
            let k = kernels_of(&g).pop().expect("the kernel");
            (
                clif_count_at(&k, count, Tier::Quick),
                clif_count_at(&k, count, Tier::Optimized),
            )
        };
        let tanh = || Op::Unary(tessera_ir::UnaryOp::Tanh);
        assert_eq!(copies(tanh(), vec![8192], Opcode::Fdiv), (2, 4));
        assert_eq!(copies(tanh(), vec![256, 32], Opcode::Fdiv), (1, 2));
        let rows = Op::Reduce {
            kind: tessera_ir::ReduceKind::Sum,
            axes: vec![1],
        };
        assert_eq!(
            copies(rows, vec![64, 100], Opcode::Fadd),
            (JAM + 1, JAM + 1)
        );
        let columns = Op::Reduce {
            kind: tessera_ir::ReduceKind::Sum,
            axes: vec![0],
        };
        assert_eq!(copies(columns, vec![100, 64], Opcode::Fadd), (1, 2));
    }

    /// Reductions of rows compute `JAM` result elements at once (`elements_jammed`), with the
    /// interpreter's bits (NaNs aside): every combine and dtype, results of 4 to 9 along the
    /// innermost dim (remainders of 0 to 3; a result of 1 runs one element at a time), NaNs,
    /// signed zeros and infinities among the inputs, an i32 sum that wraps. The kernel's code
    /// holds `JAM` copies of the combine and one for the remainder.
    #[test]
    fn row_reductions_run_four_elements_at_once_with_the_interpreters_bits() {
        use tessera_ir::{Data, Literal};
        let specials = [
            f64::NAN,
            -0.0,
            0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e30,
            -1e30,
            3.5,
        ];
        for (op, dtype) in [
            ("reduce_sum", DType::F32),
            ("reduce_max", DType::F32),
            ("reduce_min", DType::F32),
            ("reduce_sum", DType::F64),
            ("reduce_max", DType::F64),
            ("reduce_sum", DType::I32),
            ("reduce_min", DType::I32),
        ] {
            for (dims, axes, out) in [
                (vec![9, 13], "[1]", vec![9]),
                (vec![5, 7, 3], "[2]", vec![5, 7]),
                (vec![2, 3, 4, 6], "[1,3]", vec![2, 4]),
                (vec![1, 40], "[1]", vec![1]),
                (vec![8, 2], "[1]", vec![8]),
            ] {
                let show = |d: &[usize]| {
                    d.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let name = format!("{op} {dtype} {dims:?} axes={axes}");
                let g = tessera_ir::parse(&format!(
                    "func @f(%0: {dtype}[{}]) {{\n  %1 = {op} %0 axes={axes} : {dtype}[{}]\n  \
                     return %1\n}}\n",
                    show(&dims),
                    show(&out)
                ))
                .unwrap();
                let n: usize = dims.iter().product();
                let data = match dtype {
                    DType::F32 => Data::F32(
                        (0..n)
                            .map(|i| match (i + 5) % 23 {
                                0 => specials[((i + 5) / 23 + 2) % 8] as f32,
                                _ => ((i * 7919) % 1013) as f32 * 0.37 - 150.0,
                            })
                            .collect(),
                    ),
                    DType::F64 => Data::F64(
                        (0..n)
                            .map(|i| match (i + 5) % 23 {
                                0 => specials[((i + 5) / 23 + 2) % 8],
                                _ => ((i * 7919) % 1013) as f64 * 0.37 - 150.0,
                            })
                            .collect(),
                    ),
                    _ => Data::I32(
                        (0..n)
                            .map(|i| (i as i32).wrapping_mul(0x3000_0001))
                            .collect(),
                    ),
                };
                let x = Literal::new(dims.clone(), data).unwrap();
                let k = kernels_of(&g).pop().expect("the reduction's kernel");
                assert_eq!(jams(&k), out[out.len() - 1] >= JAM, "{name}");
                let got = crate::compile(&g)
                    .unwrap()
                    .run(&[&x], &tessera_transport::SingleDevice)
                    .unwrap();
                let want = tessera_interp::run(&g, std::slice::from_ref(&x)).unwrap();
                // NaNs aside (their sign and payload), as everywhere between the two.
                let (got, want) = (got[0].to_f64_vec(), want[0].to_f64_vec());
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()),
                    "{name}: {got:?} against {want:?}"
                );
                assert!(want.iter().any(|v| !v.is_nan()), "{name}");
            }
        }
        let row_sum = |dims: Vec<usize>| {
            kernel_of(
                Op::Reduce {
                    kind: tessera_ir::ReduceKind::Sum,
                    axes: vec![1],
                },
                &[dims],
            )
        };
        assert_eq!(clif_count(&row_sum(vec![64, 100]), Opcode::Fadd), JAM + 1);
        // An inner result dim of a multiple of four needs no remainder.
        let inner = |dims: Vec<usize>| {
            kernel_of(
                Op::Reduce {
                    kind: tessera_ir::ReduceKind::Sum,
                    axes: vec![2],
                },
                &[dims],
            )
        };
        assert_eq!(clif_count(&inner(vec![3, 8, 50]), Opcode::Fadd), JAM);
        assert_eq!(clif_count(&inner(vec![3, 9, 50]), Opcode::Fadd), JAM + 1);
        // A sum to one value runs as one element (in f64), a column sum is not a loop form.
        let total = kernel_of(
            Op::Reduce {
                kind: tessera_ir::ReduceKind::Sum,
                axes: vec![0, 1],
            },
            &[vec![64, 100]],
        );
        assert!(!jams(&total));
        assert!(!jams(&kernel_of(
            Op::Reduce {
                kind: tessera_ir::ReduceKind::Sum,
                axes: vec![0],
            },
            &[vec![64, 100]],
        )));
    }

    /// The bias gradient of a dense layer (a sum over the batch of [256, 32]) accumulates in
    /// registers; a row of 33 and a body too long to unroll do not.
    #[test]
    fn narrow_reductions_accumulate_in_registers() {
        let reduce = |dims: Vec<usize>, chain: usize| {
            let mut g = Graph::new("r");
            let mut x = g.add_param(TensorType::new(tessera_ir::DType::F32, dims));
            for _ in 0..chain {
                x = g.add(Op::Unary(tessera_ir::UnaryOp::Tanh), &[x]).unwrap();
            }
            let y = g
                .add(
                    Op::Reduce {
                        kind: tessera_ir::ReduceKind::Sum,
                        axes: vec![0],
                    },
                    &[x],
                )
                .unwrap();
            g.set_outputs(vec![y]);
            kernels_of(&g).pop().expect("the reduction's kernel")
        };
        assert!(in_registers(&reduce(vec![256, 32], 0)));
        assert!(!in_registers(&reduce(vec![256, 33], 0)));
        assert!(!in_registers(&reduce(vec![256, 32], 40)));
    }

    /// A kernel's function computes the rows of its result's outermost dim in the range it is
    /// called with and writes nothing else, in every case `splits_outer` accepts (so
    /// `Executable::run_kernel` may give the halves to two threads): after a call over
    /// `0..mid` the other rows still hold what was there, and the two calls give the bits of
    /// one over everything: reductions into memory and registers with a result of two dims or
    /// more too. It refuses those of a one-dim result and a sum to one value.
    #[test]
    fn split_kernels_compute_only_the_rows_they_are_called_for() {
        use tessera_ir::{ReduceKind, UnaryOp};
        let reduce = |kind, axes: Vec<usize>| Op::Reduce { kind, axes };
        let cases = [
            (reduce(ReduceKind::Sum, vec![1]), vec![37, 100]),
            (reduce(ReduceKind::Max, vec![2]), vec![9, 5, 40]),
            (reduce(ReduceKind::Sum, vec![2, 3]), vec![9, 5, 7, 12]),
            (Op::ArgMax { axis: 1 }, vec![9, 40, 100]),
            (Op::Unary(UnaryOp::Exp), vec![21, 13]),
            // Reductions into memory and into registers, by rows of their outermost dim.
            (reduce(ReduceKind::Sum, vec![1]), vec![9, 40, 200]),
            (reduce(ReduceKind::Max, vec![1, 2]), vec![9, 6, 4, 16]),
            (reduce(ReduceKind::Min, vec![1]), vec![7, 50, 3, 9]),
        ];
        for (op, dims) in cases {
            let name = format!("{op:?} over {dims:?}");
            let k = kernel_of(op, std::slice::from_ref(&dims));
            assert!(splits_outer(&k), "{name}");
            let code = compile(std::slice::from_ref(&k)).unwrap();
            let n: usize = dims.iter().product();
            let mut x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 + 13) % 1013) as f32 * 0.037 - 15.0)
                .collect();
            let outer = k.out_dims[0];
            let row: usize = k.out_dims[1..].iter().product();
            const UNSET: u32 = 0x7fc0_1234;
            let call = |out: &mut Vec<u32>, x: &mut Vec<f32>, range: (usize, usize)| {
                let args = [x.as_mut_ptr().cast::<u8>(), out.as_mut_ptr().cast::<u8>()];
                // SAFETY: the kernel reads its one input, `dims` of f32 (`x`), and writes its
                // result, `out_dims` of 4-byte elements (`out`), both alive for the call, over
                // a range inside `0..outer`.
                unsafe { (code.functions[0])(args.as_ptr(), range.0 as i64, range.1 as i64) };
            };
            let mut whole = vec![UNSET; outer * row];
            call(&mut whole, &mut x, (0, outer));
            for mid in [1, 3, outer / 2, outer - 1] {
                let mut out = vec![UNSET; outer * row];
                call(&mut out, &mut x, (0, mid));
                assert!(
                    out[mid * row..].iter().all(|&b| b == UNSET),
                    "{name}: a call over 0..{mid} wrote past its rows"
                );
                assert!(out[..mid * row].iter().all(|&b| b != UNSET), "{name}");
                call(&mut out, &mut x, (mid, outer));
                assert_eq!(out, whole, "{name}, halves at {mid}");
            }
        }
        let forms = [
            (vec![1], vec![9, 40, 200], Form::Accumulate),
            (vec![1, 2], vec![9, 6, 4, 16], Form::InRegisters),
            (vec![1], vec![7, 50, 3, 9], Form::InRegisters),
        ];
        for (axes, dims, f) in forms {
            assert_eq!(form(&kernel_of(reduce(ReduceKind::Sum, axes), &[dims])), f);
        }
        // A one-dim result's reduction sets and adds into every element.
        let columns = kernel_of(reduce(ReduceKind::Sum, vec![0]), &[vec![64, 200]]);
        assert_eq!(form(&columns), Form::Accumulate);
        let narrow = kernel_of(reduce(ReduceKind::Sum, vec![0]), &[vec![64, 32]]);
        assert_eq!(form(&narrow), Form::InRegisters);
        let total = kernel_of(reduce(ReduceKind::Sum, vec![0, 1]), &[vec![64, 32]]);
        for k in [columns, narrow, total] {
            assert!(!splits_outer(&k), "{:?}", k.out_dims);
        }
    }

    /// Kernel `k`'s CLIF as lowering builds it, before Cranelift sees it.
    fn built(k: &Kernel) -> Function {
        built_at(k, Tier::Optimized)
    }

    /// `built` for `tier`.
    fn built_at(k: &Kernel, tier: Tier) -> Function {
        let module = JITModule::new(JITBuilder::with_isa(
            host_isa().unwrap(),
            default_libcall_names(),
        ));
        let mut sig = Signature::new(CallConv::SystemV);
        sig.params
            .push(AbiParam::new(module.target_config().pointer_type()));
        sig.params.push(AbiParam::new(I64));
        sig.params.push(AbiParam::new(I64));
        let decls = Decls {
            config: module.target_config(),
            shared: std::sync::Mutex::new((module, Vec::new())),
        };
        let mut func = Function::with_name_signature(UserFuncName::user(0, 0), sig);
        build(
            &decls,
            &mut func,
            &mut FunctionBuilderContext::new(),
            k,
            false,
            tier,
        );
        func
    }

    /// The only kernel of `op` over parameters of `dims`.
    fn kernel_of(op: Op, params: &[Vec<usize>]) -> Kernel {
        let mut g = Graph::new("k");
        let xs: Vec<_> = params
            .iter()
            .map(|d| g.add_param(TensorType::new(DType::F32, d.clone())))
            .collect();
        let y = g.add(op, &xs).unwrap();
        g.set_outputs(vec![y]);
        let mut ks = kernels_of(&g);
        assert_eq!(ks.len(), 1);
        ks.pop().unwrap()
    }

    /// Index arithmetic is folded as it is built: no block makes an i64 constant twice, no
    /// `iadd` adds a zero and no `imul` multiplies by one, and the eight f32x4 loads of one
    /// iteration of a register-accumulated sum over [256, 32] (the seed step's bias gradient)
    /// read from one address at displacements 0 to 112. Before, that kernel was 348
    /// instructions (and the seed step's twelve kernels 514 value-defining instructions
    /// against 1,481).
    #[test]
    fn index_arithmetic_is_folded_as_it_is_built() {
        let sum = kernel_of(
            Op::Reduce {
                kind: tessera_ir::ReduceKind::Sum,
                axes: vec![0],
            },
            &[vec![256, 32]],
        );
        assert!(in_registers(&sum));
        let add = kernel_of(Op::Binary(BinaryOp::Add), &[vec![7, 33], vec![7, 33]]);
        for k in [&sum, &add] {
            let f = built(k);
            let dfg = &f.dfg;
            let konst = |v: Value| match dfg.value_def(v).inst().map(|i| dfg.insts[i]) {
                Some(InstructionData::UnaryImm {
                    opcode: Opcode::Iconst,
                    imm,
                }) => Some(imm.bits()),
                _ => None,
            };
            for b in f.layout.blocks() {
                let mut made = std::collections::HashSet::new();
                for i in f.layout.block_insts(b) {
                    let data = dfg.insts[i];
                    let r = dfg.inst_results(i).first().copied();
                    match data.opcode() {
                        Opcode::Iconst if dfg.value_type(r.unwrap()) == I64 => {
                            let v = konst(r.unwrap()).unwrap();
                            assert!(made.insert(v), "{}: {v} made twice in {b}", k.name);
                        }
                        Opcode::Iadd => {
                            let [x, y] = dfg.inst_args(i) else { panic!() };
                            assert!(konst(*x) != Some(0) && konst(*y) != Some(0), "{}", k.name);
                        }
                        Opcode::Imul => {
                            let [x, y] = dfg.inst_args(i) else { panic!() };
                            assert!(konst(*x) != Some(1) && konst(*y) != Some(1), "{}", k.name);
                        }
                        _ => {}
                    }
                }
            }
        }
        let f = built(&sum);
        let mut vector_loads = std::collections::HashMap::<Value, Vec<i32>>::new();
        for b in f.layout.blocks() {
            for i in f.layout.block_insts(b) {
                if let InstructionData::Load {
                    opcode: Opcode::Load,
                    arg,
                    offset,
                    ..
                } = f.dfg.insts[i]
                    && f.dfg.value_type(f.dfg.inst_results(i)[0]) == F32X4
                {
                    vector_loads.entry(arg).or_default().push(offset.into());
                }
            }
        }
        let (_, mut disps) = vector_loads
            .into_iter()
            .max_by_key(|(_, d)| d.len())
            .expect("vector loads");
        disps.sort();
        assert_eq!(disps, (0..8).map(|j| 16 * j).collect::<Vec<i32>>());
    }

    /// A kernel imports the functions it calls and no others, each once: an f32 add none, a
    /// `sin` its slow path (two of them in one kernel still one), `sin` and `cos` one each,
    /// `pow` and `atan2` one each (all fourteen were imported into every f32 kernel).
    #[test]
    fn a_kernel_imports_only_what_it_calls() {
        let imports = |ops: &[UnaryOp], binary: Option<BinaryOp>| {
            let mut g = Graph::new("k");
            let ty = TensorType::new(DType::F32, vec![5, 3]);
            let (x, y) = (g.add_param(ty.clone()), g.add_param(ty));
            let mut acc = match binary {
                Some(op) => g.add(Op::Binary(op), &[x, y]).unwrap(),
                None => x,
            };
            for (i, &u) in ops.iter().enumerate() {
                let v = g
                    .add(Op::Unary(u), &[if i % 2 == 0 { x } else { y }])
                    .unwrap();
                acc = g.add(Op::Binary(BinaryOp::Add), &[acc, v]).unwrap();
            }
            g.set_outputs(vec![acc]);
            let ks = kernels_of(&g);
            assert_eq!(ks.len(), 1);
            built(&ks[0]).dfg.ext_funcs.len()
        };
        assert_eq!(imports(&[], Some(BinaryOp::Add)), 0);
        assert_eq!(imports(&[UnaryOp::Sin, UnaryOp::Sin], None), 1);
        assert_eq!(imports(&[UnaryOp::Sin, UnaryOp::Cos], None), 2);
        assert_eq!(imports(&[], Some(BinaryOp::Pow)), 1);
        assert_eq!(imports(&[], Some(BinaryOp::Atan2)), 1);
        assert_eq!(imports(&[UnaryOp::Tan], None), 1);
    }

    /// `u` over `xs` by `k` (a one-op kernel: one input, one output, `xs.len()` long).
    fn run(code: &Compiled, xs: &[f32]) -> Vec<u32> {
        let mut input = xs.to_vec();
        let mut out = vec![0f32; xs.len()];
        let args = [
            input.as_mut_ptr().cast::<u8>(),
            out.as_mut_ptr().cast::<u8>(),
        ];
        // SAFETY: the kernel reads `xs.len()` f32 through `args[0]` and writes as many through
        // `args[1]`, both that long and alive for the call, over the whole range `0..len`.
        unsafe { (code.functions[0])(args.as_ptr(), 0, xs.len() as i64) };
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Each outlined function gives the bits its inline code gives, at both widths (a length
    /// of 4k + 3 runs the f32x4 copy and the scalar remainder), on the specials and a sample
    /// of every binade of both signs, `sin`/`cos` past their fast range included.
    #[test]
    fn outlined_functions_give_the_inline_bits() {
        let mut xs = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            -1.0,
        ];
        xs.extend([
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            f32::MAX,
            f32::MIN,
            0.5,
            -0.5,
            0.999,
        ]);
        for e in -149..128 {
            let v = 2f32.powi(e) * 1.337;
            xs.extend([v, -v]);
        }
        while xs.len() % 4 != 3 {
            xs.push(0.25);
        }
        let mut checked = 0;
        for u in UnaryOp::ALL {
            if !is_transcendental(&Op::Unary(u)) {
                continue;
            }
            let mut g = Graph::new("one");
            let x = g.add_param(TensorType::new(DType::F32, vec![xs.len()]));
            let y = g.add(Op::Unary(u), &[x]).unwrap();
            g.set_outputs(vec![y]);
            let ks = kernels_of(&g);
            assert_eq!(ks.len(), 1, "{u:?}");
            let inline = compile_with(&ks, false).unwrap();
            let outlined = compile_with(&ks, true).unwrap();
            assert_eq!((inline.outlined, outlined.outlined), (0, 2), "{u:?}");
            let (want, got) = (run(&inline, &xs), run(&outlined, &xs));
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    w,
                    g,
                    "{u:?}({}): inline {} outlined {}",
                    xs[i],
                    f32::from_bits(*w),
                    f32::from_bits(*g)
                );
            }
            checked += 1;
        }
        assert!(checked >= 10, "{checked} functions");
    }

    /// The persistent cache: a second compile of a kernel takes its entry and runs the same
    /// bits; an entry that is another kernel's code under this one's key (a valid checksum, so
    /// only verification can tell) is caught when verifying, removed, and the fresh code used.
    #[test]
    fn cache_entries_are_used_and_a_wrong_one_is_caught_when_verifying() {
        let dir = std::env::temp_dir().join(format!("tessera-cache-lower-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let xs: Vec<f32> = (0..11).map(|i| i as f32 * 0.37 - 2.0).collect();
        let one = |u: UnaryOp| {
            let mut g = Graph::new("one");
            let x = g.add_param(TensorType::new(DType::F32, vec![xs.len()]));
            let y = g.add(Op::Unary(u), &[x]).unwrap();
            g.set_outputs(vec![y]);
            kernels_of(&g)
        };
        let (tanh, exp) = (one(UnaryOp::Tanh), one(UnaryOp::Exp));
        let want = run(
            &compile_in(&tanh, false, None, &[Tier::Optimized], true).unwrap(),
            &xs,
        );
        let before = crate::cache::stats();
        compile_in(&tanh, false, Some(&dir), &[Tier::Optimized], true).unwrap();
        let tanh_entries = crate::cache::entries(&dir);
        assert_eq!(tanh_entries.len(), 1);
        let hit = compile_in(&tanh, false, Some(&dir), &[Tier::Optimized], true).unwrap();
        assert!(crate::cache::stats().hits > before.hits);
        assert_eq!(
            run(&hit, &xs),
            want,
            "the entry's code computes the same bits"
        );
        compile_in(&exp, false, Some(&dir), &[Tier::Optimized], true).unwrap();
        let all = crate::cache::entries(&dir);
        let exp_payload = &all.iter().find(|e| **e != tanh_entries[0]).unwrap().1;
        crate::cache::plant(&dir, &tanh_entries[0].0, exp_payload);
        crate::cache::set_verify(true);
        let mismatched = crate::cache::stats().mismatched;
        let verified = compile_in(&tanh, false, Some(&dir), &[Tier::Optimized], true);
        crate::cache::reset_verify();
        assert!(crate::cache::stats().mismatched > mismatched);
        assert_eq!(run(&verified.unwrap(), &xs), want);
        // Removed: only exp's entry is left, until tanh is compiled again.
        assert_eq!(crate::cache::entries(&dir).len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Elementwise kernels run as one loop over their elements (`Kernel::flattened`), and flat
    /// kernels of one body share a function whatever their length: the SGD update
    /// `p - g * 0.01` of parameters [0, 2] (first: its function, compiled for no elements,
    /// serves the others), [32], [32, 1], [1], [10, 32], [8, 3] and [3, 5] (8 + 4 + 3: every
    /// loop runs) is one function; a tanh over rows of 32 keeps its nest, a row broadcast is
    /// not flattened. Every result has the interpreter's bits.
    #[test]
    fn flat_kernels_share_one_function_whatever_their_length() {
        let shapes: [&[usize]; 7] = [&[0, 2], &[32], &[32, 1], &[1], &[10, 32], &[8, 3], &[3, 5]];
        let mut g = Graph::new("sgd");
        let lit = tessera_ir::Literal::new(vec![], tessera_ir::Data::splat(DType::F32, 0.01, 1));
        let lr = g.add(Op::Constant(lit.unwrap()), &[]).unwrap();
        let mut outs = Vec::new();
        for dims in shapes {
            let ty = TensorType::new(DType::F32, dims.to_vec());
            let (p, d) = (g.add_param(ty.clone()), g.add_param(ty));
            let lr = g
                .add(
                    Op::BroadcastInDim {
                        shape: dims.to_vec().into(),
                        dims: vec![],
                    },
                    &[lr],
                )
                .unwrap();
            let step = g.add(Op::Binary(BinaryOp::Mul), &[d, lr]).unwrap();
            outs.push(g.add(Op::Binary(BinaryOp::Sub), &[p, step]).unwrap());
        }
        // A bias row added to each row of [6, 3]: its load is not the result's element.
        let x = g.add_param(TensorType::new(DType::F32, vec![6, 3]));
        let b = g.add_param(TensorType::new(DType::F32, vec![3]));
        let rows = g
            .add(
                Op::BroadcastInDim {
                    shape: vec![6, 3].into(),
                    dims: vec![1],
                },
                &[b],
            )
            .unwrap();
        outs.push(g.add(Op::Binary(BinaryOp::Add), &[x, rows]).unwrap());
        let t = g.add_param(TensorType::new(DType::F32, vec![4, 32]));
        outs.push(g.add(Op::Unary(UnaryOp::Tanh), &[t]).unwrap());
        g.set_outputs(outs);
        let ks = kernels_of(&g);
        let flat: Vec<bool> = ks.iter().map(Kernel::is_flat).collect();
        assert_eq!(
            flat,
            [true, true, true, true, true, true, true, false, false]
        );
        assert_eq!(ks[2].out_dims, [32], "[32, 1] as one loop");
        let code = compile(&ks).unwrap();
        let at = |i: usize| code.functions[i] as *const ();
        for i in 1..7 {
            assert_eq!(
                at(i),
                at(0),
                "kernel {i} shares the [0, 2] update's function"
            );
        }
        assert_eq!(ks[8].out_dims, [4, 32], "the tanh keeps its nest");
        let inputs: Vec<tessera_ir::Literal> = g
            .params()
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let ty = g.ty(p);
                let data = (0..ty.numel())
                    .map(|i| ((i * 7 + k) % 13) as f32 - 6.5)
                    .collect();
                tessera_ir::Literal::new(ty.dims().to_vec(), tessera_ir::Data::F32(data)).unwrap()
            })
            .collect();
        let want = tessera_interp::run(&g, &inputs).unwrap();
        let exe = crate::compile(&g).unwrap();
        let refs: Vec<&tessera_ir::Literal> = inputs.iter().collect();
        let got = exe.run(&refs, &tessera_interp::SingleDevice).unwrap();
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.ty, b.ty, "output {j}");
            assert!(a.data.bits_eq(&b.data), "output {j}");
        }
    }

    /// Kernels that are the same code share a function; a constant of other bits (`-0.0` for
    /// `0.0`: `-0.0 + -0.0` is `-0.0`, `-0.0 + 0.0` is `0.0`) is other code.
    #[test]
    fn identical_kernels_share_one_function() {
        let ty = TensorType::new(DType::F32, vec![5]);
        let mut g = Graph::new("adds");
        let x = g.add_param(ty);
        let mut outs = Vec::new();
        for c in [0.0f32, 0.0, -0.0] {
            let lit =
                tessera_ir::Literal::new(vec![5], tessera_ir::Data::splat(DType::F32, c as f64, 5));
            let c = g.add(Op::Constant(lit.unwrap()), &[]).unwrap();
            outs.push(g.add(Op::Binary(BinaryOp::Add), &[x, c]).unwrap());
        }
        g.set_outputs(outs);
        let ks = kernels_of(&g);
        assert_eq!(ks.len(), 3);
        let code = compile(&ks).unwrap();
        let at = |i: usize| code.functions[i] as *const ();
        assert_eq!(at(0), at(1), "x + 0.0 twice");
        assert_ne!(at(0), at(2), "x + 0.0 and x + -0.0");
        assert_eq!(run(&code, &[-0.0; 5])[0], 0f32.to_bits());
    }
}
