//! The compilation pipeline, one pass per line, and the dump of each pass's output.
//!
//! Consumes a traced global graph; produces an `Executable`. `TESSERA_DUMP=dir` writes the IR
//! after every pass as `dir/<function>-<trace>.<NN>-<pass>.ir`, in the filetest syntax.

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

    fn write(&self, index: usize, pass: &str, g: &Graph) -> Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join(format!("{}.{index:02}-{pass}.ir", self.prefix));
        std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&path, print(g)))
            .map_err(|e| {
                Error::Io(format!(
                    "TESSERA_DUMP: cannot write {}: {e}",
                    path.display()
                ))
            })
    }
}

/// A compiled program, ready to run on input buffers.
pub(crate) enum Executable {
    /// The reference interpreter runs the graph.
    Interpreted(Graph),
}

impl Executable {
    pub(crate) fn run(&self, inputs: &[&Literal]) -> Result<Vec<Literal>> {
        match self {
            Executable::Interpreted(g) => Ok(tessera_interp::run_with(
                g,
                inputs,
                &tessera_interp::SingleDevice,
            )?),
        }
    }
}

/// Runs the passes in order on a traced graph.
pub(crate) fn compile(graph: Graph, dump: &Dump) -> Result<Executable> {
    // 00: the program as traced.
    dump.write(0, "trace", &graph)?;
    verify(&graph)?;
    Ok(Executable::Interpreted(graph))
}
