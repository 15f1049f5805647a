//! The compilation pipeline: one list of named passes that `jit`, `pmap` and `lower` all run.
//!
//! ```text
//! stage        pass                                                    runs when
//! trace        the closure on tracers -> a graph (a `grad` inside it   always
//!              runs tessera_autodiff::vjp while tracing, as JAX does)
//! simplified   egg rewrites, CSE, DCE (tessera_opt)                    unless simplify(false)
//! typed        every value's Explicit-mode type (explicit::type_graph) a mesh with Explicit axes
//! propagated   every value annotated where it is wanted (propagate)    inputs placed on a mesh,
//!              (from the types, on a mesh mixing axis types)           unless all axes Explicit
//! sharded      (made by `collectives`) the annotated global program,   inputs placed on a mesh
//!              conflicts and reshards noted
//! collectives  reshards and all-reduces explicit (insert_collectives)  inputs placed on a mesh
//! partitioned  the per-device program, local shapes (per_device)       a mesh of more than one
//! one_device   the program the device runs: the explicit one without   a mesh of one device
//!              annotations, reshards, collectives (on_one_device)
//! combined     collectives over one device dropped, independent        on devices (a mesh of
//!              all-reduces merged into one (combine)                   more than one, or pmap)
//! schedule     fusion, buffer plan, Cranelift (or the interpreter)     when compiling, not lowering
//! ```
//!
//! Every pass is `Graph -> Result<Graph>` (`PASSES`); the verifier runs on every stage's graph
//! (the trace's and each pass's), in every build. `TESSERA_DUMP=dir` writes each stage as
//! `dir/<function>-<trace>.<NN>-<stage>.ir` in the filetest syntax, `NN` its place in the run,
//! and the native schedule as `.txt` after them. `TESSERA_TIMING=1` prints a table per
//! compilation to stderr: each pass's time, the verifier's, and the node counts before and
//! after.
//!
//! The same steps are `tracing` spans (target `tessera::pipeline`, level INFO): `compile`
//! around a cache miss (`cache.rs`), `trace`, one `pass` per stage with its node counts,
//! `schedule` (code generation); each call's run is a `launch` span (DEBUG, `jit.rs`,
//! `pmap.rs`). With `tracing-subscriber`, `RUST_LOG=tessera=debug` and span close events show
//! each one's duration.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera_ir::{Graph, Literal, Mesh, TensorType, print, verify};
use tessera_runtime::ShardSpec;
use tessera_shard::Spec;

use crate::error::{Error, Result};
use crate::tree::TreeDef;

/// What the program is compiled for.
pub(crate) enum Target {
    /// One device: the program runs on the calling thread.
    Single,
    /// A global program whose inputs are placed on `mesh`, each with per-dim axes `specs`.
    Sharded { mesh: ShardSpec, specs: Vec<Spec> },
    /// A per-device program traced directly (`pmap`), its collectives written by the user.
    PerDevice { mesh: Mesh },
}

/// The options a pipeline runs with (`Jitted`/`Pmapped`'s builder settings).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) name: String,
    pub(crate) backend: Backend,
    pub(crate) simplify: bool,
}

/// One pass: the name of the stage it produces, when it runs, and the pass itself.
pub(crate) struct Pass {
    pub(crate) name: &'static str,
    when: fn(&Ctx<'_>) -> bool,
    run: fn(&mut Ctx<'_>, Graph) -> Result<Graph>,
}

/// The pipeline between the trace and code generation, in order.
pub(crate) const PASSES: [Pass; 7] = [
    Pass {
        name: "simplified",
        when: |c| c.simplify,
        run: simplify,
    },
    Pass {
        name: "typed",
        when: |c| explicit(c.target),
        run: type_graph,
    },
    Pass {
        name: "propagated",
        when: |c| matches!(c.target, Target::Sharded { .. }) && !all_explicit(c.target),
        run: propagate,
    },
    Pass {
        name: "collectives",
        when: |c| matches!(c.target, Target::Sharded { .. }),
        run: insert_collectives,
    },
    Pass {
        name: "partitioned",
        when: |c| matches!(c.target, Target::Sharded { .. }) && !one_device(c.target),
        run: partition,
    },
    Pass {
        name: "one_device",
        when: |c| one_device(c.target),
        run: on_one_device,
    },
    Pass {
        name: "combined",
        when: |c| match c.target {
            Target::Single => false,
            Target::Sharded { .. } => !one_device(c.target),
            Target::PerDevice { .. } => true,
        },
        run: combine,
    },
];

/// What a pass sees besides its input graph, and what it leaves for the rest of the run.
pub(crate) struct Ctx<'a> {
    target: &'a Target,
    simplify: bool,
    /// The function's name and the caller's `file:line`, for errors.
    name: &'a str,
    location: &'a str,
    /// Left by a pass that makes more than one graph (`insert_collectives`): stages shown
    /// before the pass's own result, in order. The one named `sharded` is the global program.
    side: Vec<(&'static str, Graph)>,
    /// Each output's sharding (set by `partition` or `on_one_device`; replicated otherwise).
    out_specs: Option<Vec<Spec>>,
    /// A comment heading the pass's dump (simplify's report).
    comment: Option<String>,
}

/// simplified: consumes a verified graph; produces an equivalent graph (egg rewrites, CSE,
/// DCE), with the run's report as the dump's comment.
fn simplify(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let (g, report) = tessera_opt::simplify(&graph, tessera_opt::Limits::default())
        .map_err(|m| Error::Simplify(format!("{}: {m}", ctx.name)))?;
    ctx.comment = Some(report.to_string());
    Ok(g)
}

/// propagated: consumes the global program (inputs placed by `Target::Sharded`); produces it
/// with every value annotated where propagation wants it (`tessera_shard::propagate`).
fn propagate(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let Target::Sharded { mesh, specs } = ctx.target else {
        unreachable!("`PASSES` runs propagate for sharded targets only")
    };
    tessera_shard::propagate::propagate_owned(graph, &mesh.mesh, specs)
        .map_err(|e| shard_error(ctx, e))
}

/// Whether the program's mesh has Explicit axes: shardings are then types, fixed by each op's
/// rule (`typed`), not propagated.
fn explicit(target: &Target) -> bool {
    matches!(target, Target::Sharded { mesh, .. } if mesh.mesh.is_explicit())
}

/// Whether every axis of the program's mesh is Explicit: nothing is left to propagate. A mesh
/// that mixes Explicit and Auto axes is typed over the Explicit ones, then propagated over the
/// Auto ones from those types (`propagate` starts from them).
fn all_explicit(target: &Target) -> bool {
    matches!(target, Target::Sharded { mesh, .. }
        if mesh.mesh.types.iter().all(|t| *t == tessera_ir::AxisType::Explicit))
}

/// typed: consumes the global program on an Explicit mesh; produces it with every value
/// annotated with its type's sharding, closed (`tessera_shard::explicit::type_graph`): the
/// trace typed each op already (and reported a conflict at the user's line); this types the
/// simplified program again, whose nodes the simplifier rebuilt.
fn type_graph(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let Target::Sharded { mesh, specs } = ctx.target else {
        unreachable!("`PASSES` runs type_graph for sharded targets only")
    };
    tessera_shard::explicit::type_graph(&graph, &mesh.mesh, specs).map_err(|e| shard_error(ctx, e))
}

/// collectives: consumes propagate's output; produces the global program with every value
/// annotated where it is and its communication explicit (reshards, all-reduces:
/// `tessera_shard::insert_collectives`), leaving the annotated global program with its
/// conflicts and reshards noted (the stage `sharded`, shown before this one).
fn insert_collectives(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let inserted = if all_explicit(ctx.target) {
        // Outputs leave with their types.
        tessera_shard::insert_collectives::insert_keeping_outputs(&graph)
    } else {
        tessera_shard::insert_annotated(&graph)
    }
    .map_err(|e| shard_error(ctx, e))?;
    ctx.side = vec![("sharded", inserted.annotated)];
    Ok(inserted.explicit)
}

/// partitioned: consumes insert_collectives' output; produces the program every device runs
/// (local shapes, reshards lowered to collectives: `tessera_shard::per_device`), leaving each
/// output's sharding.
fn partition(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let out_specs = graph
        .outputs()
        .iter()
        .map(|&o| match &graph.node(o).sharding {
            Some(s) => Ok(s.spec()),
            None => Err(shard_error(
                ctx,
                tessera_shard::ShardError::Invalid(format!(
                    "per_device: output {} : {} has no sharding",
                    graph.op(o).name(),
                    graph.ty(o)
                )),
            )),
        })
        .collect::<Result<Vec<Spec>>>()?;
    let local = tessera_shard::per_device(&graph).map_err(|e| shard_error(ctx, e))?;
    ctx.out_specs = Some(out_specs);
    Ok(local)
}

/// Whether the program's inputs are placed on a mesh of one device: every value is then whole
/// on it, and `one_device` makes the program it runs in place of `partitioned` and `combined`
/// (which reach the same program: no collective survives `combine` on one device).
fn one_device(target: &Target) -> bool {
    matches!(target, Target::Sharded { mesh, .. } if mesh.mesh.device_count() == 1)
}

/// one_device: consumes insert_collectives' output on a mesh of one device; produces the
/// program that device runs, the explicit one without its annotations, reshards and
/// collectives (`tessera_shard::on_one_device`), leaving each output's sharding.
fn on_one_device(ctx: &mut Ctx<'_>, graph: Graph) -> Result<Graph> {
    let (local, out_specs) =
        tessera_shard::on_one_device(graph).map_err(|e| shard_error(ctx, e))?;
    ctx.out_specs = Some(out_specs);
    Ok(local)
}

/// combined: consumes a per-device program; produces it without the collectives over one
/// device (the identity), and with the all-reduces that can wait for each other merged into
/// one (one rendezvous per step for the gradients and the loss).
fn combine(ctx: &mut Ctx<'_>, mut graph: Graph) -> Result<Graph> {
    tessera_shard::combine::drop_single_device_collectives(&mut graph)
        .map_err(|e| shard_error(ctx, e))?;
    tessera_shard::combine_all_reduces(&mut graph).map_err(|e| shard_error(ctx, e))?;
    Ok(graph)
}

fn shard_error(ctx: &Ctx<'_>, e: tessera_shard::ShardError) -> Error {
    Error::Op {
        op: "sharding".into(),
        message: format!("in {}: {e}", ctx.name),
        location: ctx.location.into(),
    }
}

/// The program after every pass, as `lower` returns it and code generation consumes it.
pub struct Lowered {
    /// Every stage's graph, in order (only when lowering; a compilation keeps none).
    stages: Vec<(&'static str, Graph)>,
    /// The global program (with every value's sharding when inputs are placed).
    global: Graph,
    /// The program every device runs, for a program on devices.
    local: Option<Graph>,
    pub(crate) out_def: TreeDef,
    pub(crate) out_specs: Option<Vec<Spec>>,
}

impl Lowered {
    /// A traced program with no pass run (`make_ir`).
    pub(crate) fn traced(graph: Graph, out_def: TreeDef) -> Lowered {
        Lowered {
            stages: vec![("trace", graph.clone())],
            global: graph,
            local: None,
            out_def,
            out_specs: None,
        }
    }

    /// The program in the IR text format: the global program (with each value's sharding when
    /// inputs are placed). From `lower` it is the program after simplification, as it runs.
    pub fn ir(&self) -> String {
        print(&self.global)
    }

    /// The program as traced, before any pass.
    pub fn traced_ir(&self) -> String {
        print(self.stages.first().map_or(&self.global, |(_, g)| g))
    }

    /// Every stage's graph in the order the pipeline made them, named as in `TESSERA_DUMP`:
    /// `trace`, `simplified`, then `sharded`, `collectives`, `partitioned`, `combined` for a program on
    /// devices. The last one is the program code generation compiles.
    pub fn stages(&self) -> &[(&'static str, Graph)] {
        &self.stages
    }

    /// After partitioning: the program every device runs, with local shapes and collectives
    /// (the global program itself when no input is placed on a mesh).
    pub fn per_device_ir(&self) -> String {
        print(self.program())
    }

    /// The per-device program as a graph (what [`per_device_ir`](Lowered::per_device_ir)
    /// prints); `None` when no input is placed on a mesh.
    pub fn per_device_graph(&self) -> Option<&Graph> {
        self.local.as_ref()
    }

    /// The program code generation compiles (the last stage).
    pub fn program(&self) -> &Graph {
        self.local.as_ref().unwrap_or(&self.global)
    }

    /// The global program as a graph (what [`ir`](Lowered::ir) prints).
    pub fn graph(&self) -> &Graph {
        &self.global
    }

    /// The structure of the function's result.
    pub fn out_tree(&self) -> &TreeDef {
        &self.out_def
    }

    /// The global program's output types.
    pub(crate) fn out_types(&self) -> Vec<TensorType> {
        self.global
            .outputs()
            .iter()
            .map(|&o| self.global.ty(o).clone())
            .collect()
    }

    /// The graph in Graphviz's DOT language.
    pub fn dot(&self) -> String {
        tessera_ir::dot::to_dot(&self.global)
    }

    /// The graph rendered to SVG by Graphviz (`dot -Tsvg`, run with a timeout). Errors with
    /// the install line when Graphviz is missing.
    pub fn svg(&self) -> Result<String> {
        tessera_ir::dot::to_svg(&self.global).map_err(Error::Io)
    }
}

impl std::fmt::Display for Lowered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.ir())
    }
}

/// One row of the `TESSERA_TIMING` table.
struct Timing {
    stage: &'static str,
    time: Duration,
    verify: Duration,
    before: usize,
    after: Option<usize>,
}

/// One run of the pipeline for one signature: the passes, the dumps and the timings.
pub(crate) struct Pipeline<'a> {
    target: Target,
    options: &'a Options,
    location: &'a str,
    rec: Recorder,
}

/// Where the stages go: verified, dumped, timed, and kept for `lower`.
struct Recorder {
    dump: Dump,
    /// The next stage's number in the dump.
    index: usize,
    timings: Vec<Timing>,
    /// Every stage's graph, when lowering.
    stages: Option<Vec<(&'static str, Graph)>>,
}

impl<'a> Pipeline<'a> {
    pub(crate) fn new(
        target: Target,
        options: &'a Options,
        location: &'a str,
        dump: Dump,
    ) -> Pipeline<'a> {
        Pipeline {
            target,
            options,
            location,
            rec: Recorder {
                dump,
                index: 0,
                timings: Vec::new(),
                stages: None,
            },
        }
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// Traces with `trace`, then runs `PASSES`. Keeps every stage's graph when `keep_stages`
    /// (for `lower`).
    pub(crate) fn lower(
        &mut self,
        trace: impl FnOnce() -> Result<(Graph, TreeDef)>,
        keep_stages: bool,
    ) -> Result<Lowered> {
        let name = self.options.name.as_str();
        self.rec.stages = keep_stages.then(Vec::new);
        if self.options.backend == Backend::Cranelift {
            tessera_codegen::prepare(
                tessera_opt::prepare,
                tiered_from_env()?,
                tessera_runtime::cores(),
            );
        }
        let start = Instant::now();
        let (mut graph, out_def) = {
            let _span = tracing::info_span!("trace", function = name).entered();
            trace()?
        };
        self.rec
            .record(name, "trace", start.elapsed(), 0, &graph, None)?;
        let mut ctx = Ctx {
            target: &self.target,
            simplify: self.options.simplify,
            name,
            location: self.location,
            side: Vec::new(),
            out_specs: None,
            comment: None,
        };
        let mut global = None;
        for pass in &PASSES {
            if !(pass.when)(&ctx) {
                continue;
            }
            let (start, before) = (Instant::now(), graph.node_count());
            let span = tracing::info_span!(
                "pass",
                stage = pass.name,
                nodes_before = before,
                nodes_after = tracing::field::Empty
            )
            .entered();
            graph = (pass.run)(&mut ctx, graph)?;
            span.record("nodes_after", graph.node_count());
            drop(span);
            let time = start.elapsed();
            for (stage, side) in std::mem::take(&mut ctx.side) {
                // Made by the same pass, whose row counts the time.
                self.rec
                    .record(name, stage, Duration::ZERO, before, &side, None)?;
                if stage == "sharded" {
                    global = Some(side);
                }
            }
            let comment = ctx.comment.take();
            self.rec
                .record(name, pass.name, time, before, &graph, comment)?;
        }
        let out_specs = ctx.out_specs.take();
        let stages = self.rec.stages.take().unwrap_or_default();
        Ok(match self.target {
            Target::Single => Lowered {
                stages,
                global: graph,
                local: None,
                out_def,
                out_specs,
            },
            Target::Sharded { .. } => Lowered {
                stages,
                global: global.expect("`insert_collectives` leaves the annotated global program"),
                local: Some(graph),
                out_def,
                out_specs,
            },
            Target::PerDevice { .. } => Lowered {
                stages,
                global: graph.clone(),
                local: Some(graph),
                out_def,
                out_specs,
            },
        })
    }

    /// `schedule` for this process's positions of a mesh over the global `devices`
    /// (`tessera_runtime::local_positions`), after checking that every process holding
    /// devices of it compiled the same program (`distributed::check_same_program`).
    pub(crate) fn schedule_on(
        &mut self,
        lowered: &Lowered,
        devices: &[usize],
        first_only: &[bool],
        location: &str,
    ) -> Result<Vec<BackendProgram>> {
        crate::distributed::check_same_program(
            &self.options.name,
            lowered.program(),
            devices,
            location,
        )?;
        let local = tessera_runtime::local_positions(devices).len();
        self.schedule(lowered, local, first_only)
    }

    /// schedule: consumes the last stage's graph; produces a program for each of `devices`
    /// devices (one for a single-device target). Native code is compiled once: a program on
    /// devices gets no kernel split over threads (every core runs a device) unless its devices
    /// run in turn on one thread, and each device its own arena. Outputs marked in `first_only` are computed by the first device only
    /// with the native backend (the others return `None` for them); the interpreter computes
    /// everything.
    pub(crate) fn schedule(
        &mut self,
        lowered: &Lowered,
        devices: usize,
        first_only: &[bool],
    ) -> Result<Vec<BackendProgram>> {
        let graph = lowered.program();
        let start = Instant::now();
        let _span = tracing::info_span!(
            "schedule",
            backend = ?self.options.backend,
            nodes = graph.node_count(),
            devices
        )
        .entered();
        let programs = match self.options.backend {
            Backend::Interpreter => (0..devices)
                .map(|_| BackendProgram::Interpreted(Box::new(graph.clone())))
                .collect(),
            Backend::Cranelift => {
                // Kernels with little work quick first, optimized in the background.
                let exe = if tiered_from_env()? {
                    tessera_codegen::compile_tiered(graph)
                } else {
                    tessera_codegen::compile(graph)
                }
                .map_err(|e| Error::Codegen(e.to_string()))?;
                // The schedule's text only for a dump: describing every step is work a
                // compile does not otherwise need.
                if self.rec.dump.enabled() {
                    self.rec
                        .dump
                        .write_text(self.rec.index, "schedule", &exe.describe())?;
                }
                match self.target {
                    Target::Single => vec![BackendProgram::Native(Box::new(exe))],
                    Target::Sharded { .. } | Target::PerDevice { .. } => {
                        // Every core runs a device; one device runs on the calling thread
                        // (`spmd.rs`) and keeps the split GEMMs and kernels.
                        let exe = if devices == 1 {
                            exe
                        } else {
                            exe.single_threaded()
                        };
                        // The first device runs the compiled executable itself, the others
                        // forks of it (a fork copies the schedule: on one device it was 2% of
                        // the seed step's first call, perf).
                        let forks = (1..devices).map(|_| {
                            BackendProgram::Native(Box::new(
                                exe.fork().dropping_outputs(first_only),
                            ))
                        });
                        let forks: Vec<BackendProgram> = forks.collect();
                        (devices > 0)
                            .then(|| BackendProgram::Native(Box::new(exe)))
                            .into_iter()
                            .chain(forks)
                            .collect()
                    }
                }
            }
        };
        self.rec.index += 1;
        self.rec.timings.push(Timing {
            stage: "schedule",
            time: start.elapsed(),
            verify: Duration::ZERO,
            before: graph.node_count(),
            after: None,
        });
        Ok(programs)
    }

    /// Prints the `TESSERA_TIMING` table to stderr when it is on.
    pub(crate) fn report_timing(&self) -> Result<()> {
        if timing_from_env()? {
            eprint!("{}", self.timing_table());
        }
        Ok(())
    }

    fn timing_table(&self) -> String {
        use std::fmt::Write;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut s = format!(
            "TESSERA_TIMING {} ({})\n{:<12} {:>10} {:>10} {:>8} {:>8}\n",
            self.options.name, self.rec.dump.prefix, "stage", "ms", "verify ms", "before", "after"
        );
        for t in &self.rec.timings {
            let after = t.after.map_or("-".to_string(), |n| n.to_string());
            writeln!(
                s,
                "{:<12} {:>10.3} {:>10.3} {:>8} {:>8}",
                t.stage,
                ms(t.time),
                ms(t.verify),
                t.before,
                after
            )
            .expect("writing to a String");
        }
        let total: Duration = self.rec.timings.iter().map(|t| t.time + t.verify).sum();
        writeln!(s, "{:<12} {:>10.3}", "total", ms(total)).expect("writing to a String");
        if let Some(dir) = tessera_codegen::cache::dir() {
            let c = tessera_codegen::cache::stats();
            writeln!(
                s,
                "compilation cache {}: {} hits, {} misses, {} rejected, {} mismatched, {} write \
                 errors (process)",
                dir.display(),
                c.hits,
                c.misses,
                c.rejected,
                c.mismatched,
                c.write_errors
            )
            .expect("writing to a String");
        }
        s
    }
}

impl Recorder {
    /// Verifies a stage's graph, dumps it (under `comment`), keeps it when lowering, and
    /// times it (`time` it took to make; `before` is its input's node count).
    fn record(
        &mut self,
        function: &str,
        stage: &'static str,
        time: Duration,
        before: usize,
        graph: &Graph,
        comment: Option<String>,
    ) -> Result<()> {
        let checked = Instant::now();
        verify(graph).map_err(|error| Error::Stage {
            stage,
            function: function.to_string(),
            error,
        })?;
        let verify_time = checked.elapsed();
        if self.dump.enabled() {
            let text = match comment {
                Some(c) => format!("// {c}\n{}", print(graph)),
                None => print(graph),
            };
            self.dump.write_ir(self.index, stage, &text)?;
        }
        self.index += 1;
        if let Some(stages) = &mut self.stages {
            stages.push((stage, graph.clone()));
        }
        self.timings.push(Timing {
            stage,
            time,
            verify: verify_time,
            before,
            after: Some(graph.node_count()),
        });
        Ok(())
    }
}

/// Where (and whether) to dump the IR after each pass.
#[derive(Clone)]
pub(crate) struct Dump {
    dir: Option<PathBuf>,
    prefix: String,
}

impl Dump {
    pub(crate) fn from_env(function: &str, trace: usize) -> Dump {
        Dump {
            dir: std::env::var_os("TESSERA_DUMP").map(PathBuf::from),
            prefix: format!("{function}-{trace}"),
        }
    }

    /// No dumps (for `lower`, which returns the stages instead of writing them).
    pub(crate) fn disabled(function: &str) -> Dump {
        Dump {
            dir: None,
            prefix: format!("{function}-lower"),
        }
    }

    fn enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// Writes IR text (a comment header is fine: the parser skips `//` lines).
    fn write_ir(&self, index: usize, stage: &str, text: &str) -> Result<()> {
        self.write_file(&format!("{index:02}-{stage}.ir"), text)
    }

    /// Writes a non-IR artifact (the native schedule) beside the IR dumps.
    fn write_text(&self, index: usize, what: &str, text: &str) -> Result<()> {
        self.write_file(&format!("{index:02}-{what}.txt"), text)
    }

    fn write_file(&self, name: &str, text: &str) -> Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join(format!("{}.{name}", self.prefix));
        std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&path, text))
            .map_err(|e| {
                Error::Io(format!(
                    "TESSERA_DUMP: cannot write {}: {e}",
                    path.display()
                ))
            })
    }
}

/// Which backend runs a jitted function. Both run the same IR through the same entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// Native code from Cranelift (the default).
    #[default]
    Cranelift,
    /// The reference interpreter.
    Interpreter,
}

/// A program in its backend's form, ready to run on input buffers.
pub(crate) enum BackendProgram {
    /// The reference interpreter runs the graph.
    Interpreted(Box<Graph>),
    /// Native kernels, GEMM calls and collectives over one arena.
    Native(Box<tessera_codegen::Executable>),
}

impl BackendProgram {
    /// Gives a given-up input's buffer to the native program's output pool (the interpreter
    /// allocates its own values: dropped).
    pub(crate) fn recycle(&self, data: tessera_ir::Data) {
        match self {
            BackendProgram::Interpreted(_) => {}
            BackendProgram::Native(e) => e.recycle(data),
        }
    }

    /// `run` that appends the outputs to `out` (the native program allocates no vector for
    /// them).
    pub(crate) fn run_into(&self, inputs: &[&Literal], out: &mut Vec<Literal>) -> Result<()> {
        match self {
            BackendProgram::Interpreted(g) => {
                out.extend(tessera_interp::run_with(
                    g,
                    inputs,
                    &tessera_interp::SingleDevice,
                )?);
                Ok(())
            }
            BackendProgram::Native(e) => {
                Ok(e.run_into(inputs, &tessera_interp::SingleDevice, out)?)
            }
        }
    }

    /// Runs with the given transport for the program's collectives, appending the outputs to
    /// `out` (the native program allocates no vector for them), with `None` for the outputs a
    /// native device program was compiled not to compute (`schedule`'s `first_only`).
    pub(crate) fn run_partial_into(
        &self,
        inputs: &[&Literal],
        collectives: &dyn tessera_interp::Collectives,
        out: &mut Vec<Option<Literal>>,
    ) -> Result<()> {
        match self {
            BackendProgram::Interpreted(g) => {
                out.extend(
                    tessera_interp::run_with(g, inputs, collectives)?
                        .into_iter()
                        .map(Some),
                );
                Ok(())
            }
            BackendProgram::Native(e) => Ok(e.run_partial_into(inputs, collectives, out)?),
        }
    }
}

/// Reads an on/off switch: unset, empty or `0` is off, `1` on, anything else an error saying
/// what `on` does.
fn switch_from_env(var: &str, on: &str) -> Result<bool> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(v) if v.is_empty() || v == "0" => Ok(false),
        Ok(v) if v == "1" => Ok(true),
        Ok(v) => Err(Error::Config(format!(
            "{var}={v:?}: expected 1 ({on}) or 0"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::Config(format!("{var}={v:?}: expected 1 or 0")))
        }
    }
}

/// Whether checked mode is on by default: `TESSERA_CHECK=1` (unset, empty or `0`: off).
pub(crate) fn check_from_env() -> Result<bool> {
    switch_from_env(
        "TESSERA_CHECK",
        "check every jitted call against the interpreter",
    )
}

/// Whether each compilation prints its pass timings: `TESSERA_TIMING=1`.
fn timing_from_env() -> Result<bool> {
    switch_from_env(
        "TESSERA_TIMING",
        "print each compilation's pass timings to stderr",
    )
}

/// Whether `jit` compiles kernels with little work quick first and optimizes them in the
/// background (`tessera_codegen::compile_tiered`): on unless `TESSERA_TIERED=0`.
fn tiered_from_env() -> Result<bool> {
    match std::env::var("TESSERA_TIERED") {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(v) if v.is_empty() || v == "1" => Ok(true),
        Ok(v) if v == "0" => Ok(false),
        Ok(v) => Err(Error::Config(format!(
            "TESSERA_TIERED={v:?}: expected 1 (compile small kernels quick first, optimized \
             in the background; the default) or 0"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Config(format!(
            "TESSERA_TIERED={v:?}: expected 1 or 0"
        ))),
    }
}

/// Starts the compiler's one-time work in the background (`tessera_codegen::prepare`) when a
/// program is wrapped (`jit`, `pmap`), before its first call: a program's first call then finds
/// the threads started and the ISAs built. (The first lowering starts it too, whatever came
/// first; a bad `TESSERA_TIERED` is that lowering's error to report.)
pub(crate) fn prepare_compiler() {
    tessera_codegen::prepare(
        tessera_opt::prepare,
        tiered_from_env().unwrap_or(false),
        tessera_runtime::cores(),
    );
}

/// Whether the simplification pass runs: on unless `TESSERA_SIMPLIFY=0`.
pub(crate) fn simplify_enabled() -> bool {
    std::env::var("TESSERA_SIMPLIFY").map_or(true, |v| v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::DType;

    /// `tanh` of an f32[3] declared as f32[4]: the verifier's invariant 3 is broken.
    fn malformed() -> Graph {
        let mut g =
            tessera_ir::parse("func @bad(%0: f32[3]) {\n  %1 = tanh %0 : f32[3]\n  return %1\n}\n")
                .unwrap();
        let out = g.outputs()[0];
        g.node_mut(out).ty = TensorType::new(DType::F32, vec![4]);
        g
    }

    fn ctx<'a>(target: &'a Target) -> Ctx<'a> {
        Ctx {
            target,
            simplify: true,
            name: "bad",
            location: "here.rs:1",
            side: Vec::new(),
            out_specs: None,
            comment: None,
        }
    }

    #[test]
    fn a_simplifier_failure_is_a_simplify_error() {
        let target = Target::Single;
        let err = simplify(&mut ctx(&target), malformed()).err().unwrap();
        assert!(
            matches!(&err, Error::Simplify(m) if m.starts_with("bad: ")),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("simplification of bad: "),
            "{err}"
        );
    }

    #[test]
    fn the_verifier_rejects_a_malformed_stage_naming_it() {
        let mut rec = Recorder {
            dump: Dump::disabled("bad"),
            index: 0,
            timings: Vec::new(),
            stages: Some(Vec::new()),
        };
        let g = malformed();
        let err = rec
            .record("bad", "combined", Duration::ZERO, 2, &g, None)
            .err()
            .unwrap();
        assert!(
            matches!(&err, Error::Stage { stage: "combined", function, .. } if function == "bad"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("IR verifier, after the combined stage of bad: %1 (tanh)"),
            "{err}"
        );
        // A well-formed stage is kept, numbered and timed.
        let good = tessera_ir::parse("func @ok(%0: f32[3]) {\n  return %0\n}\n").unwrap();
        rec.record("ok", "trace", Duration::ZERO, 0, &good, None)
            .unwrap();
        assert_eq!(rec.index, 1);
        assert_eq!(rec.stages.as_ref().unwrap().len(), 1);
        assert_eq!(rec.timings[0].after, Some(1));
    }

    #[test]
    fn the_pass_list_runs_by_target_and_options() {
        let single = Target::Single;
        let pmap = Target::PerDevice {
            mesh: Mesh::new("pmap", vec![("i".into(), 2)]),
        };
        let names = |c: &Ctx<'_>| -> Vec<&str> {
            PASSES
                .iter()
                .filter(|p| (p.when)(c))
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(names(&ctx(&single)), ["simplified"]);
        assert_eq!(names(&ctx(&pmap)), ["simplified", "combined"]);
        let mut off = ctx(&pmap);
        off.simplify = false;
        assert_eq!(names(&off), ["combined"]);
        let on = |devices: usize| Target::Sharded {
            mesh: ShardSpec {
                mesh: Mesh::new("m", vec![("dp".into(), devices)]),
                devices: (0..devices).collect(),
                dims: vec![Vec::new()],
            },
            specs: vec![vec![vec!["dp".to_string()]]],
        };
        assert_eq!(
            names(&ctx(&on(2))),
            [
                "simplified",
                "propagated",
                "collectives",
                "partitioned",
                "combined"
            ]
        );
        // One device: the explicit program is the one it runs, annotations dropped.
        assert_eq!(
            names(&ctx(&on(1))),
            ["simplified", "propagated", "collectives", "one_device"]
        );
    }
}
