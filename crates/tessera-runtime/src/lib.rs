//! Tessera's runtime: the `Array` type that concrete tensors hold, and (with the sharding work)
//! devices as threads, collectives and executable launch.
//!
//! Architecture invariant: the runtime sees executables and buffers, never graphs.

use std::sync::Arc;

use tessera_ir::{Literal, TensorType};

/// A global array: its type, and the buffer that holds its elements. Buffers are shared and
/// immutable, so cloning an `Array` is cheap and no kernel ever writes into an input.
#[derive(Clone, Debug)]
pub struct Array {
    buffer: Arc<Literal>,
}

impl Array {
    pub fn new(literal: Literal) -> Array {
        Array {
            buffer: Arc::new(literal),
        }
    }

    pub fn ty(&self) -> &TensorType {
        &self.buffer.ty
    }

    /// The whole array's elements on the host.
    pub fn literal(&self) -> &Literal {
        &self.buffer
    }

    /// A stable identity of the buffer, for de-duplicating captured constants.
    pub fn buffer_id(&self) -> usize {
        Arc::as_ptr(&self.buffer) as usize
    }
}

impl From<Literal> for Array {
    fn from(literal: Literal) -> Array {
        Array::new(literal)
    }
}
