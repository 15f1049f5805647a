//! The compilation pipeline, one pass per line, and the dump of each pass's output.
//!
//! Consumes a traced global graph; produces an `Executable`. `TESSERA_DUMP=dir` writes the IR
//! after every pass as `dir/<function>-<trace>.<NN>-<pass>.ir`, in the filetest syntax, and the
//! native schedule as `.txt` beside them.

use std::path::PathBuf;

use tessera_ir::{Graph, Literal, print, verify};

use crate::error::{Error, Result};

/// Where (and whether) to dump the IR after each pass.
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

    /// No dumps (for `lower`, which shows the stages instead of writing them).
    pub(crate) fn disabled() -> Dump {
        Dump {
            dir: None,
            prefix: String::new(),
        }
    }

    pub(crate) fn write(&self, index: usize, pass: &str, g: &Graph) -> Result<()> {
        if self.dir.is_some() {
            self.write_file(&format!("{index:02}-{pass}.ir"), &print(g))?;
        }
        Ok(())
    }

    pub(crate) fn enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// Writes IR text that carries a comment header (the parser skips `//` lines).
    pub(crate) fn write_text_ir(&self, index: usize, pass: &str, text: &str) -> Result<()> {
        if self.dir.is_some() {
            self.write_file(&format!("{index:02}-{pass}.ir"), text)?;
        }
        Ok(())
    }

    /// Writes a non-IR artifact (the native schedule) beside the IR dumps.
    pub(crate) fn write_text(&self, index: usize, what: &str, text: &str) -> Result<()> {
        if self.dir.is_some() {
            self.write_file(&format!("{index:02}-{what}.txt"), text)?;
        }
        Ok(())
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

/// A compiled program, ready to run on input buffers.
pub(crate) enum Executable {
    /// The reference interpreter runs the graph.
    Interpreted(Graph),
    /// Native kernels, GEMM calls and collectives over one arena.
    Native(Box<tessera_codegen::Executable>),
}

impl Executable {
    pub(crate) fn run(&self, inputs: &[&Literal]) -> Result<Vec<Literal>> {
        self.run_with(inputs, &tessera_interp::SingleDevice)
    }

    /// Runs with the given transport for the program's collectives.
    pub(crate) fn run_with(
        &self,
        inputs: &[&Literal],
        collectives: &dyn tessera_interp::Collectives,
    ) -> Result<Vec<Literal>> {
        match self {
            Executable::Interpreted(g) => Ok(tessera_interp::run_with(g, inputs, collectives)?),
            Executable::Native(e) => Ok(e.run(inputs, collectives)?),
        }
    }

    /// Like `run_with`, with `None` for the outputs a native device program was compiled not
    /// to compute (`compile_device_programs`' `first_only`).
    pub(crate) fn run_partial(
        &self,
        inputs: &[&Literal],
        collectives: &dyn tessera_interp::Collectives,
    ) -> Result<Vec<Option<Literal>>> {
        match self {
            Executable::Interpreted(g) => Ok(tessera_interp::run_with(g, inputs, collectives)?
                .into_iter()
                .map(Some)
                .collect()),
            Executable::Native(e) => Ok(e.run_partial(inputs, collectives)?),
        }
    }
}

/// Compiles a per-device program (already partitioned) for `devices` devices: the same
/// backends, with no kernel split over threads (every core runs a device). Native code is
/// compiled once and shared; each device gets its own arena. The schedule is dumped as
/// `dump_index`.
///
/// Outputs marked in `first_only` are computed by the first device only with the native
/// backend (the others return `None` for them); the interpreter computes everything.
pub(crate) fn compile_device_programs(
    graph: &Graph,
    backend: Backend,
    devices: usize,
    (dump, dump_index): (&Dump, usize),
    first_only: &[bool],
) -> Result<Vec<Executable>> {
    verify(graph)?;
    Ok(match backend {
        Backend::Interpreter => (0..devices)
            .map(|_| Executable::Interpreted(graph.clone()))
            .collect(),
        Backend::Cranelift => {
            let exe = tessera_codegen::compile(graph)
                .map_err(|e| Error::Codegen(e.to_string()))?
                .single_threaded();
            dump.write_text(dump_index, "schedule", &exe.describe())?;
            (0..devices)
                .map(|i| {
                    let exe = if i == 0 {
                        exe.fork()
                    } else {
                        exe.fork().dropping_outputs(first_only)
                    };
                    Executable::Native(Box::new(exe))
                })
                .collect()
        }
    })
}

/// Whether checked mode is on by default: `TESSERA_CHECK=1` (unset, empty or `0`: off).
pub(crate) fn check_from_env() -> Result<bool> {
    match std::env::var("TESSERA_CHECK") {
        Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(v) if v.is_empty() || v == "0" => Ok(false),
        Ok(v) if v == "1" => Ok(true),
        Ok(v) => Err(Error::Config(format!(
            "TESSERA_CHECK={v:?}: expected 1 (check every jitted call against the interpreter) \
             or 0"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Config(format!(
            "TESSERA_CHECK={v:?}: expected 1 or 0"
        ))),
    }
}

/// Whether the simplification pass runs: on unless `TESSERA_SIMPLIFY=0`.
pub(crate) fn simplify_enabled() -> bool {
    std::env::var("TESSERA_SIMPLIFY").map_or(true, |v| v != "0")
}

/// Algebraic simplification, CSE and DCE (tessera-opt), dumped with its report as `index`.
pub(crate) fn simplify(graph: Graph, enabled: bool, dump: &Dump, index: usize) -> Result<Graph> {
    verify(&graph)?;
    if !enabled {
        return Ok(graph);
    }
    let (g, report) = tessera_opt::simplify(&graph, tessera_opt::Limits::default())
        .map_err(|m| Error::Io(format!("simplification: {m}")))?;
    if dump.enabled() {
        dump.write_text_ir(index, "simplified", &format!("// {report}\n{}", print(&g)))?;
    }
    Ok(g)
}

/// Runs the passes in order on a traced graph, then hands it to the backend.
pub(crate) fn compile(graph: Graph, backend: Backend, dump: &Dump) -> Result<Executable> {
    verify(&graph)?;
    Ok(match backend {
        Backend::Interpreter => Executable::Interpreted(graph),
        Backend::Cranelift => {
            // Fusion, buffer planning and Cranelift lowering (tessera-codegen).
            let exe =
                tessera_codegen::compile(&graph).map_err(|e| Error::Codegen(e.to_string()))?;
            dump.write_text(2, "schedule", &exe.describe())?;
            Executable::Native(Box::new(exe))
        }
    })
}
