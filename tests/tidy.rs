//! The tidy check (issue 11 item 7): rules of the source tree that the compiler does not enforce.
//!
//! - every `.rs` file under `crates/`, `tests/`, `examples/`, `benches/` and `src/` starts with
//!   a `//!` module doc;
//! - no wildcard arm in a per-op table: a `match` with an arm naming a variant of one of
//!   [`OP_ENUMS`] has no `_ =>` or catch-all binding arm, so an op added later is flagged by the
//!   compiler at every place that decides something per op. `// tidy: allow-wildcard(<reason>)`
//!   on the line before such an arm (or in the comment block right above it) lets it stand;
//!   the reason is mandatory, and an allow comment that excuses nothing is itself reported;
//! - a line budget per crate ([`BUDGETS`]), so growth is a decision;
//! - `cargo doc -p tessera` with warnings denied (missing docs, broken links);
//! - `cargo fmt --all --check` and `cargo clippy --workspace --all-targets -- -D warnings`
//!   (the latter in its own target directory, `target/tidy-clippy`, so it does not wait on the
//!   build lock held by the `cargo test` that runs this file).
//!
//! The rules are documented in `docs/tidy.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// The enums whose variants make a `match` a per-op table.
const OP_ENUMS: &[&str] = &[
    "Op",
    "UnaryOp",
    "BinaryOp",
    "CompareOp",
    "ReduceKind",
    "CollectiveOp",
    "OpClass",
    "RegionOp",
];

/// The escape hatch, up to its reason and closing parenthesis.
const ALLOW: &str = "// tidy: allow-wildcard(";

/// The directories whose `.rs` files are checked, relative to the workspace root.
const SOURCE_DIRS: &[&str] = &["crates", "tests", "examples", "benches", "src"];

/// Lines of Rust (every line of every `.rs` file, tests included) each crate may have: the count
/// on 2026-12-01 (branch `tidy`, at d2fd84d) plus about 10%, rounded up to 100 (10 for the
/// derive crate); this file's own lines are added to the root package's without headroom.
/// Raising a budget is a decision: say why in the commit that raises it. `tessera-examples` is
/// the root package (`src/`, `tests/`, `examples/`, `benches/`).
const BUDGETS: &[(&str, usize)] = &[
    ("tessera", 31300), // issue 14 (twenty-sixth pass): +100 spmd.rs's kept launcher and its device slots (inputs, outputs, given-back buffers: a threaded pmap step allocates only its outputs on the calling thread, 28 -> 15) and the every-thread count of that step; issue 14 (twenty-fifth pass): +60 pmap.rs's call on kept vectors (the leaves against the last structure, specs resolved once a program, host values and output tensors kept; a pmap step 36 -> 15 allocations, its outputs only) and the new test of a compiled pmap refused in a trace; issue 14 (twenty-third pass): +50 pmap.rs PmapScratch (a call's per-device lists kept); +130 a multi-device call's kept vectors and give_shards_up (moved-in arguments' shards to the devices' output pools) and their arrays as shells of the outputs, the 8-device step's allocation count and its values against one device; issue 14 (twentieth pass): +60 the allocation count of a step split over the team, on every thread (it found the split decisions allocating); issue 14 (eighteenth pass): +40 the tiling pool gradient under vmap and differentiated again; +70 the tiling pool gradient test (first extreme of each window, bit for bit on both backends), the huge tiling window's zero gradient; issue 14 (seventeenth pass): +53 the test that a last call evicted while its arguments flatten is not served; issue 14 (sixteenth pass): +330 checked mode's Leeway (outputs past a sum that overflows may differ; f16 and loops narrower) and its unit and soundness tests, the cache's shared tick; issue 14 (fifteenth pass): +70 TESSERA_TIERED (a checked switch) and tests/tiers.rs (jit tiers by default, not with 0, an error otherwise); issue 14 (fourteenth pass): +40 the runtime test of the schedules hoist.rs reorders (tests/fuzz.rs); issue 14 (thirteenth pass): +40 the one_device stage (a mesh of one device skips collectives, partitioned, combined) and its pass-list test; issue 14 (eighth pass): +210 set_compilation_cache_dir/compilation_cache_stats and tests/compilation_cache.rs; probe fixes: +140 (and a shard_map on host inputs) a jit of host inputs compiled for the mesh its constraints or out_shardings name, and its test; tests/rayon_callers.rs; issue 14 (third pass): +500 Tree::flatten_if on every container and the derive, the jit call's kept vectors and donated shells, tests/allocations.rs's exact counts; issue 15: +420 distributed.rs (initialize, process-local data, process_allgather, the program check); issue 14: +250 donation, the cache's last-call fast path, tests/allocations.rs (a counting allocator); issue 16: +900 optim.rs (optax's transformations, schedules, aliases) and tests/optim.rs with optax fixtures; +300 tree: Static, map_n/map3/reduce, tests/tree.rs; +250 testing.rs (allclose), interop.rs (ndarray); +400 tests/threads.rs, observability.rs, svg.rs, the dump-name check; +350 checkpoint.rs; issue 17: +1000 shard_map.rs, trees of shardings, visualize's JAX layout and their tests; +700 Explicit axes (sharding.rs: out_sharding, reshard; trace-time typing; tests/explicit.rs with JAX fixtures) and room for shard_map; issue 13: +470 the f16/bf16/i64 distributions (random/dtypes.rs, tests/random_dtypes.rs with JAX fixtures); +190 NumPy's full s![] (newaxis, ellipsis, negative steps, several integer tensors); +180 scatter min/max/mul gradient tests; +340 s![] indexing (slicing.rs, tests/slicing.rs with JAX fixtures); +500 i64/f16/bf16 (promotion lattice, checked-mode narrow bounds, tests/dtypes.rs with JAX fixtures); +360 tests/conv.rs (JAX fixtures), take_along_axis and its tests, the hostile-window soundness test; +390 elementwise primitives front ends (math.rs, nn.rs, tests/elementwise.rs); +40 Key::new_x64 and its JAX test; +axis/einsum/manip, promotion, indexing, conv front ends, sorting, random distributions and their JAX-fixture tests; +700 promotion (promote.rs, tests/promotion.rs); +900 random distributions (random/dists.rs, random/shuffle.rs, tests/random_dists.rs); +466 sorting (sorting.rs, tests/sorting.rs); 8246; 10199 with control flow; +1351 forward mode (jvp branch: fwd.rs, tests/forward.rs); +1335 vmap (vmap.rs, pmap's axes, tests/vmap.rs)
    ("tessera-autodiff", 6130), // issue 14 (eighteenth pass): +30 a pool with one window along a dim tiles whatever its stride (global pools), overlapping gradients bounded by their work (an error past 2^28 elements, not an OOM kill); +80 a tiling pool's gradient over the operand's elements (tiled_vjp: a reduce_min of the first hit, one select) in place of a slice and a concatenate per window position; issue 13: +260 scatter min/max/mul VJP/JVP rules, cummax's scan-tree rule, the tiling pool gradient; conv, gather and sorting rules; +337 sorting rules (sorting.rs); 703; 806 with vjp_rule split per family; 1238 with region.rs; +1374 forward mode (jvp.rs, tests/jvp.rs); +1758 batching (batch.rs, tests/batch.rs)
    ("tessera-codegen", 22500), // issue 14 (twenty-ninth pass): +50 the test that a pinned thread asking first, in a fresh process, leaves the process wide (the review's defect, caught in a child process); +80 a thread's CPUs with one sched_getaffinity (may_post read the cgroup's files: 0.1 ms of the first call) and the test that a thread pinned to one CPU never leads, quick-tier kernels without the unrolled vector pair (the seed step's first call 2.06 -> 1.87 ms median with the affinity read, 40 alternating pairs) and the test counting both forms' copies; issue 14 (twenty-eighth pass): +45 a phase without kernel work runs in turn, and the test of one device beside the heavy one; +220 devices run in turn lead the team (a phase's halves, the pair of stacked products and the fills on the spinning helper: the big MLP over 8 devices 6% faster, geomean of 8 alternating pairs), a compile's kernels taken by this thread and the helper from one counter (map_all: the caller never sleeps), team::in_job and start, and their tests (a run in a job splits nothing, phases and pairs on the team, the compile's posts); issue 14 (twenty-seventh pass): +150 long-contraction products (more than 64 columns and at least 64 rows a part: no part a small, matrix-vector or horizontal product of the library's) in row parts (each at least 64 rows, exec::part_rows, and its test) on hosts where the library computes them (a one-device big MLP step 15% faster on an AVX-512 Xeon, geomean of 8 alternating pairs) and their bits test in f32, f64 and both left layouts; issue 14 (twenty-sixth pass): +25 an executable keeps each all-reduce step's group (group_of: four allocations a device and all-reduce each step); issue 14 (twenty-fifth pass): +60 sgemm row tasks shared out evenly in whole panels, a multiple of the threads (row_tasks, rows_of_task) and their test; +75 sgemm packing through 8 x 8 register transposes and row-wise copies (packing 11 -> 9.6% of the kernel's samples, perf, Zen 3); issue 14 (twenty-fourth pass): +1050 sgemm.rs (f32 products on AVX2 hosts without AVX-512: packed panels, a 6 x 16 FMA kernel, tasks shared by both cores through a counter; any layout; a Zen 3 big MLP step 14% faster, geomean of 16 alternating pairs) and its model-of-the-sums, layout (negative strides, two column blocks), specials and dispatch tests; issue 14 (twenty-third pass): +230 pool.rs (the output pool by class: O(log n) a buffer where scans made a run O(n^2) in its outputs) and its tests, output_index, together::Together (devices run in turn on kept vectors) and finish into a kept list; issue 14 (twenty-first pass): +290 fusion::Refinement (a reshape that only merges dims of a single-use elementwise result, read by elementwise ops, iterated in the operand's finer dims: a pool gradient's routing and activation gradient in one kernel) and its bits, chain-depth and filetests; issue 14 (twentieth pass): +270 convs whose lhs features are outermost (kernel gradients) summed over two halves of the features, one per core (window.rs conv_halves), each split kernel's split decided once (Executable::splits), and the halves' bits, non-finite and team tests; issue 14 (nineteenth pass): +530 team.rs (a one-device run's splits on a spinning helper thread, each half on the same core every time: no futex wake per split; panics with their payloads, no rayon worker leads, the helper parked for rayon work) and its two tests, conv chunks of 2^j near-equal parts; issue 14 (eighteenth pass): +30 a window far larger than its operand walks what it covers (no tables by the window position: 6.3 GB for 2^28);  +30 the review's fixes (chunks of a fixed size whatever the threads, shared out whole; a one-chunk conv splits its product) and the bits-of-one-thread test; +310 convs in batch parts on every core with their work memory in per-thread scratch (no allocation per run), NHWC results written in place, the lhs repacked by tiled transposes, and their test; +240 reduce_window as a reduction kernel (fusion::reduce_window_kernel, window_as_kernel) and its bits test over every kind, dtype and window shape, f32 iotas splat on vectors; issue 14 (seventeenth pass): +30 the review's fixes (split at the middle, no empty half, no needless remainder) and their tests; +200 row reductions four result elements at once (elements_jammed, jams) and their bits test; +140 large row reductions split over both cores (lower::form, the one dispatch of a kernel's form; lower::splits_outer) and their range and bits tests; issue 14 (sixteenth pass): +12 prepare starts the rayon pool with the caller's count of cores; issue 14 (fifteenth pass): +700 tiered compilation (tier.rs: small kernels at Cranelift's quick settings first, optimized on a background thread from the second run and swapped in, the tier plan and its tests; lower.rs's per-kernel ISA, the compile on one thread; the quick tier checked bit for bit on the corpus and region tests); issue 14 (fourteenth pass): +140 hoist.rs (small and output-only results moved up next to their operands; the big MLP's arena 16 -> 12 MiB), +60 a group's temporaries placed largest first (12 -> 10 MiB) and its test; issue 14 (thirteenth pass): +130 flat kernels (elementwise nests as one loop over their elements, one function for every length) and their sharing test; issue 14 (twelfth pass): +300 index arithmetic folded as kernels are built (per-block constants and sums, constants carried to load/store displacements) and f32 callees imported on first use (approx::Callees), their CLIF tests; issue 14 (eleventh pass): +300 pairs of shared products when devices run together (pairs.rs moving a weight gradient with its all-reduce, partner_pause, together.rs product_pair and its stack/multiply/settle stages), their bits-and-sums test; issue 14 (tenth pass): +330 pairs.rs (independent large products moved side by side and run at once, one core each), the plan placing a pair as one step, run_pair, their plan/bits/count tests; issue 14 (ninth pass): +50 thin.rs's review fixes (strides in plan, padded views and the 64-row boundary tested); +70 tests that catch the fast paths' removal (tails in compiled programs, thin and chunked paths taken by gemm_view); +290 thin.rs (f32 products of at most 16 columns in AVX-512 registers, with the library's bits, and their bits test), +400 vmath.rs (tanh at the full vector width, AVX-512F and AVX2, as a kernel's tail; its bits test against the generated code), +170 the transposed operand copied and multiplied chunk by chunk on the thread that copied it (with_row_major_chunks) and its coverage and bits tests; issue 14 (eighth pass): +530 the persistent compilation cache (cache.rs: the directory store, its entry format, verification; build.rs: the dependency salt; their unit tests), +80 the padded copy of a transposed operand and its f64 and parallel tests; issue 14 (seventh pass): +110 narrow products of a transposed left operand through a column-major result (with_column_major_out) and their bits test; +140 a group region for the shared products' temporaries when devices run together (GroupPlace, group_slots) and its test; issue 14 (sixth pass): +80 the transposed-weight copy in 4 x 4 register transposes (band_4x4); +120 short-contraction products in row parts (row_parts) and their bits test; +90 phases of devices run together balanced by their work (phase_work, phase_plan) and their tests; review fixes: +110 a run entered again on its thread is an error (tests/reentry.rs, a re-entering collective); issue 14 (fifth pass): +130 column products (fusion::column_product, the specials test), +60 two-thread phases and their test; +360 shared products paused at and multiplied once by devices run in turn on one thread (Meeting::Product, settle_product, together::products, their test), zeroed arenas, +100 all-reduces in place when run together, +90 inner loops of known bounds (vector_loop_of) and their CLIF-counting test; issue 14 (fourth pass): +280 transpose.rs (a large column-major GEMM operand copied row-major, with its tests), +40 prepare() and the process-wide host ISA, +100 build_and_compile (kernels built on every core, Decls), +150 reductions in registers and their tests; issue 14 (third pass): +150 block concatenates as native copies and their test, run_into/run_partial_into, tanh's exp form in Estrin's scheme; issue 14: +800 Cranelift on every core (compile_all), step profiles (TESSERA_PROFILE), runs that pause at their collectives (start/advance/finish) and together.rs (a process's devices on one thread), with tests/profile.rs and tests/together.rs; +140 legalize.rs (wide concatenates split before fusion) and its tests, +60 the output pool (recycle); +170 window plans built once per executable, batch-folded conv GEMMs, the lhs repack; +300 gather and scatter lowered by Cranelift (Expr::Gather, ScatterPhase); +250 i64/f16/bf16 (narrow.rs, 64-bit and 16-bit lowering, conversion calls); +70 fallible window work tables and the non-finite-kernel conv loops; +200 compile-time policies (kernel sharing, outlined functions) and their unit tests in lower.rs; +270 native sort/cumulative steps (native.rs); 5741; 6465 with the launch-level fault tests moved here from the runtime; 7615 with region steps (run_region, run_at, peak_bytes) and tests/regions.rs
    ("tessera-derive", 300), // issue 14: +40 flatten_if (a structure compared without building it); issue 16: enums, tuple/unit/generic structs, #[tree(static)] fields (205); 65
    ("tessera-interp", 3150), // issue 13: +210 i64/f16/bf16 (computed in f32 per op, exact i64 comparisons, op_table references); +75 libm elementwise kernels (elem.rs); conv, gather, sorting kernels; +218 sorting kernels and their op_table references; 1765
    ("tessera-ir", 8500), // issue 14 (twenty-sixth pass): +40 Data::bits_eq_any_nan (the tests' shared comparison of exact results, any NaN for a NaN) and its test; issue 14 (eleventh pass): +40 operands placed by position, indegrees in a vector, the verifier's positions by bit mask, and their unit test; +60 Data::strided and its test (eager broadcasts and transposes a row at a time); issue 17: +90 axis types, unreduced annotations; +60 i64/f16/bf16 (dtypes, data, text format, corpus samples); issue 13: conv.rs, gather.rs, sorting.rs; +286 sorting.rs (sort, cumulative, rev); 4209; 5011 with the Data API and its tests, infer_type's family helpers, the Spec vocabulary; 6003 with region.rs, regions in the text format and verifier, tests/regions.rs
    ("tessera-opt", 1450), // issue 14 (seventeenth pass): +44 the test that NaN-filled gathers order as they compare; issue 14 (sixteenth pass): +90 e-node keys without formatting (Key, hash_attrs) and the tests that ops with other attributes stay apart and hash apart; 1123
    ("tessera-mpi", 450), // issue 15: the MPI link (rsmpi): two-phase exchanges, point-to-point for subsets, 403
    ("tessera-mpirun", 800), // issue 15: the mpirun probes, the scaling bench and tests/mpirun.rs (12 tests), 714
    ("tessera-runtime", 3300), // issue 14 (twenty-sixth pass): +200 the kept Launcher (a launch reusing its state and device slots, its review fixes) and tests/launcher.rs, the staged small all-reduce with its operand check and their tests; 2793
    ("tessera-transport", 3100), // issue 14 (twenty-sixth pass): +125 ended meetings' slots kept for the next (State::slot, Board::reset), launch buffers given back during a launch (give_back, kept_buffers) and its test, Items/Positions on the stack, the lazy group label, the oracle test's NaN comparison; issue 14 (eighth pass): +20 the spare launch buffers released on request and its test; issue 14 (seventh pass): +50 launch buffers kept for the next launch (SPARE) and their test; +180 parts already stacked read in place (Stacking::in_place, PartAddr::regions) and their tests; issue 14 (fifth pass): +200 stacked.rs (how a shared product stacks, moved from the runtime so both runners follow it); issue 15: +80 process.rs (the link between processes), values in bytes; 2110 (the collective interface, rendezvous, value kernels)
    ("tessera-shard", 4350), // issue 14 (thirteenth pass): +140 on_one_device (the program a mesh of one device runs) and its test against the three passes on every partition case; issue 17: +640 explicit.rs (the Explicit-mode rules and the typed pass), room for shard_map; issue 13: conv, gather factor rules; 1426; 1933 with three passes (shard branch); 2799 with sharding through region bodies (region.rs slots, recursive passes: shardreg)
    ("tessera-examples", 4200), // issue 14 (twenty-second pass): +100 side_by_side's meshes and paths (two programs in turn in one process) and their shared in_turn; issue 14: +135 examples/side_by_side.rs (the JAX side-by-side runner's Tessera side); issue 16: +100 data_loader.rs, +80 common/progress.rs (bar, --plot), +60 tests/interop.rs, +100 example tests; issue 17: +200 data_parallel_shard_map.rs, mesh_2d on Explicit axes; +70 benches/cnn.rs and the narrow filetest pass; issue 13: attention_digits, common/digits.rs; 1055 + 695 (this file); 2032 with golden.rs (189) and the autodiff/schedule filetest arms (56) (pipeline branch); 2348 with the golden stages and the add-an-op proof
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted, skipping `target` and hidden directories.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("tidy: cannot read directory {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("tidy: in {}: {e}", dir.display()));
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry
                .file_type()
                .unwrap_or_else(|e| panic!("tidy: {}: {e}", path.display()));
            if kind.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    if dir.is_dir() {
        walk(dir, &mut out);
    }
    out.sort();
    out
}

/// Every checked source file as (path relative to the root, contents).
fn workspace_sources() -> Vec<(String, String)> {
    let root = root();
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        for path in rust_files(&root.join(dir)) {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("tidy: cannot read {}: {e}", path.display()));
            let rel = path.strip_prefix(&root).unwrap_or(&path);
            files.push((rel.display().to_string(), text));
        }
    }
    assert!(
        files.len() > 50,
        "tidy: found only {} source files under {}; is the walk broken?",
        files.len(),
        root.display()
    );
    files
}

// ---- 1. module headers ----------------------------------------------------------------------

fn has_module_header(src: &str) -> bool {
    src.starts_with("//!")
}

#[test]
fn header_rule_accepts_a_module_doc_and_nothing_else() {
    assert!(has_module_header("//! A module.\nfn f() {}\n"));
    assert!(!has_module_header("fn f() {}\n"));
    assert!(!has_module_header("\n//! Too late.\n"));
    assert!(!has_module_header("// A plain comment.\n"));
    assert!(!has_module_header("/// An item doc.\nfn f() {}\n"));
    assert!(!has_module_header(
        "#![allow(dead_code)]\n//! After an attribute.\n"
    ));
}

#[test]
fn every_source_file_starts_with_a_module_doc() {
    let missing: Vec<String> = workspace_sources()
        .into_iter()
        .filter(|(_, text)| !has_module_header(text))
        .map(|(path, text)| {
            let first = text.lines().next().unwrap_or("");
            format!("{path}:1: starts with {first:?}, not a `//!` module doc")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "tidy: {} file(s) lack a `//!` header (one line saying what the file is for):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

// ---- 2. wildcard arms in per-op matches ---------------------------------------------------------

/// Finds the wildcard arms of per-op matches in one file.
struct WildcardFinder<'a> {
    path: &'a str,
    lines: Vec<&'a str>,
    /// The last path segment of the self type of each enclosing `impl`, innermost last (`Self::X`
    /// in `impl Op` names a variant of `Op`).
    self_types: Vec<String>,
    /// Lines (1-based) of allow comments that excused an arm.
    used_allows: Vec<usize>,
    violations: Vec<String>,
}

impl WildcardFinder<'_> {
    /// Whether `path` names a variant of one of [`OP_ENUMS`]: `Op::Add`, `tessera_ir::Op::Add`,
    /// or `Self::Add` inside `impl Op`.
    fn names_op_variant(&self, path: &syn::Path) -> bool {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let Some(owner) = segs.len().checked_sub(2).map(|i| segs[i].as_str()) else {
            return false;
        };
        let owner = if owner == "Self" {
            match self.self_types.last() {
                Some(ty) => ty.as_str(),
                None => return false,
            }
        } else {
            owner
        };
        OP_ENUMS.contains(&owner)
    }

    fn pattern_names_op_variant(&self, pat: &syn::Pat) -> bool {
        struct Paths<'f, 'a> {
            finder: &'f WildcardFinder<'a>,
            found: bool,
        }
        impl<'ast> Visit<'ast> for Paths<'_, '_> {
            fn visit_path(&mut self, path: &'ast syn::Path) {
                self.found |= self.finder.names_op_variant(path);
                visit::visit_path(self, path);
            }
        }
        let mut paths = Paths {
            finder: self,
            found: false,
        };
        paths.visit_pat(pat);
        paths.found
    }

    /// The allow comment that excuses the arm starting at `line` (1-based): the line before, or
    /// any line of the contiguous `//` comment block right above the arm.
    fn allow_above(&mut self, line: usize) -> Option<Result<(), String>> {
        let mut at = line.checked_sub(1)?;
        while at >= 1 {
            let text = self.lines[at - 1].trim_start();
            if !text.starts_with("//") {
                return None;
            }
            if let Some(verdict) = parse_allow(text) {
                self.used_allows.push(at);
                return Some(verdict);
            }
            at -= 1;
        }
        None
    }

    fn check_match(&mut self, m: &syn::ExprMatch) {
        let Some(first) = m
            .arms
            .iter()
            .find(|a| self.pattern_names_op_variant(&a.pat))
        else {
            return;
        };
        let first_line = first.pat.span().start().line;
        for arm in &m.arms {
            if !is_catch_all(&arm.pat) {
                continue;
            }
            let line = arm
                .attrs
                .first()
                .map_or_else(|| arm.pat.span().start().line, |a| a.span().start().line);
            let path = self.path;
            let text: &str = self.lines.get(line - 1).copied().unwrap_or("").trim();
            match self.allow_above(line) {
                Some(Ok(())) => {}
                Some(Err(why)) => self.violations.push(format!("{path}:{}: {why}", line - 1)),
                None => self.violations.push(format!(
                    "{path}:{line}: wildcard arm `{text}` in a per-op match (variant arm at line \
                     {first_line}): list the variants, match on `op.class()`, or put \
                     `{ALLOW}<reason>)` on the line before"
                )),
            }
        }
    }
}

impl<'ast> Visit<'ast> for WildcardFinder<'_> {
    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let ty = match &*item.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(String::new, |s| s.ident.to_string()),
            _other => String::new(),
        };
        self.self_types.push(ty);
        visit::visit_item_impl(self, item);
        self.self_types.pop();
    }

    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        self.check_match(m);
        visit::visit_expr_match(self, m);
    }

    /// Macro bodies are opaque to syn; those that parse as comma-separated expressions
    /// (`assert!`, `format!`, `vec![a, b]`, ...) or as statements are checked too.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        use syn::parse::Parser;
        use syn::punctuated::Punctuated;
        let exprs = Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(exprs) = exprs.parse2(mac.tokens.clone()) {
            for e in &exprs {
                self.visit_expr(e);
            }
        } else if let Ok(stmts) = syn::Block::parse_within.parse2(mac.tokens.clone()) {
            for s in &stmts {
                self.visit_stmt(s);
            }
        }
        visit::visit_macro(self, mac);
    }
}

/// `Some(Ok)` for a well-formed allow comment, `Some(Err)` for a malformed one, `None` if
/// `comment` is not an allow comment.
fn parse_allow(comment: &str) -> Option<Result<(), String>> {
    let rest = comment
        .trim_start()
        .strip_prefix("// tidy: allow-wildcard")?;
    let reason = rest
        .strip_prefix('(')
        .and_then(|r| r.rfind(')').map(|end| r[..end].trim()));
    Some(match reason {
        Some(reason) if !reason.is_empty() => Ok(()),
        Some(_) => Err(format!(
            "`{}`: the reason is mandatory, `{ALLOW}<reason>)`",
            comment.trim()
        )),
        None => Err(format!(
            "`{}`: malformed, write `{ALLOW}<reason>)`",
            comment.trim()
        )),
    })
}

/// Whether every value reaches this pattern: `_`, a binding (`other`, `ref x`), `x @ <catch-all>`,
/// a tuple of catch-alls, or an or-pattern with a catch-all alternative. A capitalised
/// identifier (`None`, a constant) is not a binding.
fn is_catch_all(pat: &syn::Pat) -> bool {
    match pat {
        syn::Pat::Wild(_) | syn::Pat::Rest(_) => true,
        syn::Pat::Ident(p) => match &p.subpat {
            Some((_, sub)) => is_catch_all(sub),
            None => {
                let name = p.ident.to_string();
                let name = name.strip_prefix("r#").unwrap_or(&name);
                name.starts_with(|c: char| c == '_' || c.is_lowercase())
            }
        },
        syn::Pat::Tuple(t) => t.elems.iter().all(is_catch_all),
        syn::Pat::Paren(p) => is_catch_all(&p.pat),
        syn::Pat::Reference(r) => is_catch_all(&r.pat),
        syn::Pat::Type(t) => is_catch_all(&t.pat),
        syn::Pat::Or(o) => o.cases.iter().any(is_catch_all),
        syn::Pat::Const(_)
        | syn::Pat::Lit(_)
        | syn::Pat::Macro(_)
        | syn::Pat::Path(_)
        | syn::Pat::Range(_)
        | syn::Pat::Slice(_)
        | syn::Pat::Struct(_)
        | syn::Pat::TupleStruct(_)
        | syn::Pat::Verbatim(_) => false,
        // `syn::Pat` is non-exhaustive: a pattern kind added to syn is not a catch-all.
        _unknown => false,
    }
}

/// Every violation of the wildcard rule in one file, as `path:line: message`.
fn wildcard_violations(path: &str, src: &str) -> Vec<String> {
    let file = match syn::parse_file(src) {
        Ok(file) => file,
        Err(e) => {
            let at = e.span().start();
            return vec![format!(
                "{path}:{}:{}: tidy cannot parse the file: {e}",
                at.line,
                at.column + 1
            )];
        }
    };
    let mut finder = WildcardFinder {
        path,
        lines: src.lines().collect(),
        self_types: Vec::new(),
        used_allows: Vec::new(),
        violations: Vec::new(),
    };
    finder.visit_file(&file);
    let mut violations = finder.violations;
    for (i, line) in src.lines().enumerate() {
        let line_no = i + 1;
        if parse_allow(line).is_some() && !finder.used_allows.contains(&line_no) {
            violations.push(format!(
                "{path}:{line_no}: `{}` excuses no wildcard arm of a per-op match; remove it",
                line.trim()
            ));
        }
    }
    violations
}

/// A per-op match written four ways: `{arm}` is replaced by the last arm.
const PLANTED: &str = "//! Snippet.
fn cost(op: &Op) -> u32 {
    match op {
        Op::Unary(UnaryOp::Exp) => 10,
        Op::Binary(_) => 1,
{arm}
    }
}
";

fn planted(arm: &str) -> String {
    PLANTED.replace("{arm}", arm)
}

#[test]
fn a_planted_wildcard_arm_is_flagged_with_its_line() {
    let v = wildcard_violations("x.rs", &planted("        _ => 0,"));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("x.rs:6: wildcard arm `_ => 0,`"), "{v:?}");
    // A catch-all binding, a guarded one and a tuple of wildcards fall through the same way.
    for arm in [
        "        other => other.n(),",
        "        _ if true => 0,",
        "        x @ _ => x.n(),",
        "        Op::Select | _ => 0,",
    ] {
        let v = wildcard_violations("x.rs", &planted(arm));
        assert_eq!(v.len(), 1, "{arm}: {v:?}");
        assert!(v[0].starts_with("x.rs:6: wildcard arm"), "{v:?}");
    }
    let pair = "//! Snippet.\nfn f(a: &Op, b: &Op) -> bool {\n    match (a, b) {\n        \
                (Op::Select, Op::Select) => true,\n        (_, _) => false,\n    }\n}\n";
    assert_eq!(wildcard_violations("p.rs", pair).len(), 1);
}

#[test]
fn an_exhaustive_list_is_not_flagged() {
    for arm in [
        "        Op::Unary(_) | Op::Select => 0,",
        "        Op::Reduce { kind: ReduceKind::Sum, .. } => 1,",
        "        None => 0,",
    ] {
        assert_eq!(
            wildcard_violations("x.rs", &planted(arm)),
            Vec::<String>::new()
        );
    }
    // A match on anything else may end in `_`.
    let other = "//! Snippet.\nfn f(d: DType) -> u8 {\n    match d {\n        DType::F32 => 4,\n        \
                 _ => 8,\n    }\n}\n";
    assert_eq!(wildcard_violations("o.rs", other), Vec::<String>::new());
}

#[test]
fn self_variants_inside_impl_op_count_as_op_variants() {
    let src = "//! Snippet.\nimpl Op {\n    fn f(&self) -> u8 {\n        match self {\n            \
               Self::Select => 1,\n            _ => 0,\n        }\n    }\n}\nimpl Other {\n    fn \
               g(&self) -> u8 {\n        match self {\n            Self::Select => 1,\n            \
               _ => 0,\n        }\n    }\n}\n";
    let v = wildcard_violations("s.rs", src);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("s.rs:6:"), "{v:?}");
}

#[test]
fn matches_inside_macro_arguments_and_nested_matches_are_checked() {
    let src = "//! Snippet.\nfn f(op: &Op, t: u8) {\n    assert!(match op {\n        Op::Select => \
               true,\n        _ => false,\n    });\n    match t {\n        0 => match op {\n            \
               Op::Select => {}\n            other => drop(other),\n        },\n        _ => {}\n    \
               }\n}\n";
    let v = wildcard_violations("m.rs", src);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].starts_with("m.rs:5:") && v[1].starts_with("m.rs:10:"),
        "{v:?}"
    );
}

#[test]
fn the_allow_comment_excuses_an_arm_and_needs_a_reason() {
    let allowed = planted(&format!(
        "        {ALLOW}only the cost of exp matters here)\n        _ => 0,"
    ));
    assert_eq!(wildcard_violations("x.rs", &allowed), Vec::<String>::new());
    // The allow may sit anywhere in the comment block right above the arm.
    let block = planted(&format!(
        "        {ALLOW}a reason)\n        // More words.\n        _ => 0,"
    ));
    assert_eq!(wildcard_violations("x.rs", &block), Vec::<String>::new());
    // Not separated from the arm by code.
    let far = planted(&format!(
        "        {ALLOW}a reason)\n        Op::Select => 2,\n        _ => 0,"
    ));
    let v = wildcard_violations("x.rs", &far);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].starts_with("x.rs:8: wildcard arm"), "{v:?}");
    assert!(
        v[1].starts_with("x.rs:6: ") && v[1].contains("excuses no"),
        "{v:?}"
    );

    let no_reason = planted(&format!("        {ALLOW} )\n        _ => 0,"));
    let v = wildcard_violations("x.rs", &no_reason);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("x.rs:6: ") && v[0].contains("reason is mandatory"),
        "{v:?}"
    );
    let malformed = planted("        // tidy: allow-wildcard because\n        _ => 0,");
    let v = wildcard_violations("x.rs", &malformed);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("malformed"), "{v:?}");
}

#[test]
fn an_unparsable_file_is_reported_with_its_position() {
    let v = wildcard_violations("bad.rs", "//! Snippet.\nfn f( {\n");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("bad.rs:"), "{v:?}");
    assert!(v[0].contains("cannot parse"), "{v:?}");
}

#[test]
fn no_wildcard_arm_in_any_per_op_match() {
    let violations: Vec<String> = workspace_sources()
        .iter()
        .flat_map(|(path, text)| wildcard_violations(path, text))
        .collect();
    assert!(
        violations.is_empty(),
        "tidy: {} wildcard arm(s) in per-op matches (a new op would fall into them silently):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

// ---- 3. line budgets ------------------------------------------------------------------------

/// Lines of `.rs` per crate: `crates/<name>` by directory name, the root package as
/// `tessera-examples`.
fn line_counts() -> BTreeMap<String, usize> {
    let root = root();
    let lines = |files: Vec<PathBuf>| -> usize {
        files
            .iter()
            .map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_else(|e| panic!("tidy: cannot read {}: {e}", f.display()))
                    .lines()
                    .count()
            })
            .sum()
    };
    let mut counts = BTreeMap::new();
    let crates = std::fs::read_dir(root.join("crates")).expect("tidy: cannot read crates/");
    for entry in crates {
        let entry = entry.expect("tidy: cannot read an entry of crates/");
        if entry.path().join("Cargo.toml").is_file() {
            let name = entry.file_name().to_string_lossy().into_owned();
            counts.insert(name, lines(rust_files(&entry.path())));
        }
    }
    let root_package = ["src", "tests", "examples", "benches"]
        .iter()
        .map(|d| lines(rust_files(&root.join(d))))
        .sum();
    counts.insert("tessera-examples".to_string(), root_package);
    counts
}

fn budget_violations(counts: &BTreeMap<String, usize>, budgets: &[(&str, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, &count) in counts {
        match budgets.iter().find(|(b, _)| b == name) {
            Some(&(_, budget)) if count > budget => out.push(format!(
                "crate {name}: {count} lines, budget {budget}: split or shrink it, or raise its \
                 budget in tests/tidy.rs (BUDGETS) and say why in the commit"
            )),
            Some(_) => {}
            None => out.push(format!(
                "crate {name}: {count} lines and no budget: add a row to BUDGETS in tests/tidy.rs"
            )),
        }
    }
    for (name, _) in budgets {
        if !counts.contains_key(*name) {
            out.push(format!(
                "crate {name} has a budget in tests/tidy.rs but no longer exists: remove its row"
            ));
        }
    }
    out
}

#[test]
fn budget_failures_name_the_crate_its_count_and_its_budget() {
    let counts = BTreeMap::from([("a".to_string(), 120), ("b".to_string(), 5)]);
    assert_eq!(
        budget_violations(&counts, &[("a", 120), ("b", 10)]),
        Vec::<String>::new()
    );
    let v = budget_violations(&counts, &[("a", 100), ("c", 10)]);
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(v[0].starts_with("crate a: 120 lines, budget 100"), "{v:?}");
    assert!(v[1].starts_with("crate b: 5 lines and no budget"), "{v:?}");
    assert!(v[2].starts_with("crate c has a budget"), "{v:?}");
}

#[test]
fn every_crate_is_within_its_line_budget() {
    let counts = line_counts();
    let v = budget_violations(&counts, BUDGETS);
    assert!(v.is_empty(), "tidy: line budgets:\n{}", v.join("\n"));
}

// ---- 4. rustfmt and clippy ------------------------------------------------------------------

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// The toolchain channel pinned by `rust-toolchain.toml`.
fn channel() -> String {
    let path = root().join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("tidy: cannot read {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
        .next()
        .unwrap_or_else(|| panic!("tidy: no `channel = ...` in {}", path.display()))
}

/// `Ok` if `cargo <subcommand>` runs, otherwise the `rustup component add` line that installs it.
fn require_component(subcommand: &str, component: &str) -> Result<(), String> {
    let cargo = cargo();
    let out = Command::new(&cargo)
        .args([subcommand, "--version"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("tidy: cannot run `{cargo} {subcommand} --version`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "tidy: `cargo {subcommand}` is not available:\n{}\ninstall it with:\n    rustup component \
         add {component} --toolchain {}",
        String::from_utf8_lossy(&out.stderr).trim(),
        channel()
    ))
}

/// Runs `cargo <args>` at the root with `envs`; `Err` carries the command and its output.
fn run_cargo(args: &[&str], envs: &[(&str, PathBuf)]) -> Result<(), String> {
    let cargo = cargo();
    let mut cmd = Command::new(&cargo);
    cmd.args(args).current_dir(root());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("tidy: cannot run `cargo {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        return Ok(());
    }
    let mut msg = format!(
        "tidy: `cargo {}` failed ({}):\n",
        args.join(" "),
        out.status
    );
    let _ = write!(
        msg,
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Err(msg)
}

#[test]
fn a_missing_component_names_the_rustup_line() {
    let err = require_component("tidy-no-such-subcommand", "tidy-no-such-component")
        .expect_err("a subcommand that does not exist cannot run");
    let line = format!(
        "rustup component add tidy-no-such-component --toolchain {}",
        channel()
    );
    assert!(err.contains(&line), "{err}");
}

#[test]
fn rustfmt_is_clean() {
    require_component("fmt", "rustfmt").unwrap_or_else(|e| panic!("{e}"));
    run_cargo(&["fmt", "--all", "--check"], &[]).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn clippy_is_clean() {
    require_component("clippy", "clippy").unwrap_or_else(|e| panic!("{e}"));
    let target = root().join("target").join("tidy-clippy");
    run_cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[("CARGO_TARGET_DIR", target)],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `cargo doc -p tessera --no-deps` with warnings denied: every public item is documented
/// (`#![deny(missing_docs)]` in `lib.rs` makes a missing doc a build error everywhere) and no
/// intra-doc link is broken. The doctests themselves, the README's example among them, run
/// with the suite's `cargo test`. Shares the clippy target directory (check-mode metadata).
#[test]
fn rustdoc_is_clean() {
    let target = root().join("target").join("tidy-clippy");
    run_cargo(
        &["doc", "-p", "tessera", "--no-deps"],
        &[
            ("CARGO_TARGET_DIR", target),
            ("RUSTDOCFLAGS", PathBuf::from("-D warnings")),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
