//! The user-facing error type, and how an op inside a trace reports one.

use std::panic::Location;

use tessera_interp::InterpError;
use tessera_ir::{ParseError, TypeError, VerifyError};

/// Everything that can go wrong between a user's closure and its results. Its `Debug` form is
/// its message, so `fn main() -> tessera::Result<()>` prints `Error: <the message>` (Rust
/// prints a returned error with `Debug`), not the variant's fields.
#[derive(Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op's type rule rejected its operands; `location` is the user's `file:line`.
    #[error("{error}, at {location}")]
    Type {
        /// The type rule's complaint.
        error: TypeError,
        /// The caller's `file:line`.
        location: String,
    },
    /// An op could not be applied for another reason (a tracer used outside its trace, a value
    /// read from a tracer, an op that needs a mesh).
    #[error("{op}: {message}, at {location}")]
    Op {
        /// The op (or entry point) that failed, e.g. `"eval_graph"`.
        op: String,
        /// What went wrong.
        message: String,
        /// The caller's `file:line`.
        location: String,
    },
    /// Two trees that had to share a structure did not.
    #[error("tree structure mismatch: {message}, at {location}")]
    Tree {
        /// Which part of the structure differed.
        message: String,
        /// The caller's `file:line`.
        location: String,
    },
    /// IR text that [`ir::parse`](fn@crate::ir::parse) could not read.
    #[error("IR parse error: {0}")]
    Parse(#[from] ParseError),
    /// The verifier rejected a graph handed in by the user (e.g. to
    /// [`eval_graph`](crate::eval_graph)).
    #[error("IR verifier: {0}")]
    Verify(#[from] VerifyError),
    /// The verifier rejected the graph a stage of the pipeline produced (a compiler bug, not
    /// the user's).
    #[error("IR verifier, after the {stage} stage of {function}: {error}")]
    Stage {
        /// The pipeline stage after which the graph was checked.
        stage: &'static str,
        /// The name of the graph (the traced function).
        function: String,
        /// The verifier's complaint.
        error: VerifyError,
    },
    /// The simplifier (tessera-opt) failed.
    #[error("simplification of {0}")]
    Simplify(String),
    /// Running a program failed (in the interpreter or in compiled code).
    #[error("execution: {0}")]
    Interp(#[from] InterpError),
    /// The native backend could not compile a graph.
    #[error("native code generation: {0}")]
    Codegen(String),
    /// Checked mode (`TESSERA_CHECK=1`) found compiled code that disagrees with the
    /// interpreter beyond the op's stated bound.
    #[error("checked mode: {0}")]
    Check(String),
    /// A `TESSERA_*` environment variable holds a value that means nothing.
    #[error("configuration: {0}")]
    Config(String),
    /// A device failed or did not answer (its panic, a collective's timeout).
    #[error("device: {0}")]
    Device(String),
    /// A file could not be read or written (`TESSERA_DUMP`).
    #[error("{0}")]
    Io(String),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// `std::result::Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn loc_text(loc: &Location<'_>) -> String {
    format!("{}:{}", loc.file(), loc.line())
}

/// Reports an error from inside an op. Inside a trace it unwinds (without running the panic
/// hook, so nothing is printed) to the `jit`/`grad` entry point, which returns it as `Err`;
/// eagerly it is a panic with the same message.
pub(crate) fn raise(err: Error) -> ! {
    if crate::trace::any_active() || RETURNING.with(|r| r.get() > 0) {
        std::panic::resume_unwind(Box::new(err))
    } else {
        panic!("{err}")
    }
}

thread_local! {
    /// How many `catch_eager` calls are running on this thread: while one is, an eager op's
    /// error unwinds to it like a traced one instead of panicking.
    static RETURNING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Like `catch`, and eager ops inside `f` report errors as `Err` too (for entry points that
/// return `Result`, such as `eval_graph`, whose ops may run eagerly).
pub(crate) fn catch_eager<T>(f: impl FnOnce() -> T) -> Result<T> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            RETURNING.with(|r| r.set(r.get() - 1));
        }
    }
    RETURNING.with(|r| r.set(r.get() + 1));
    let _leave = Leave;
    catch(f)
}

/// Runs `f`, turning an error raised by `raise` inside it into `Err`; other panics go on.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Ok(v),
        Err(payload) => match payload.downcast::<Error>() {
            Ok(err) => Err(*err),
            Err(other) => std::panic::resume_unwind(other),
        },
    }
}
