//! Tessera's graph IR: element types and shapes, the primitive ops with their type rules, the
//! program graph, the verifier, and the text format (printer and parser) used by dumps, tests
//! and error messages.
//!
//! Architecture invariant: this crate depends on no other Tessera crate, and on no egg, no
//! Cranelift and no threads. Meshes and shardings appear here as plain data only.

pub mod conv;
pub mod corpus;
pub mod dot;
pub mod gather;
pub mod graph;
pub mod literal;
pub mod op;
pub mod parse;
pub mod print;
pub mod region;
pub mod sharding;
pub mod sorting;
pub mod types;
pub mod verify;

pub use conv::{ConvDims, WindowDims};
pub use gather::{GatherDims, IndexMode, ScatterDims, ScatterKind};
pub use graph::{Graph, Node, NodeId};
pub use literal::{Data, DataElement, DataError, Literal, bf16, f16};
pub use op::{
    ALL_OP_NAMES, BinaryOp, CollectiveOp, CompareOp, DotDims, Op, OpClass, ReduceKind, TypeError,
    UnaryOp,
};
pub use parse::{ParseError, parse};
pub use print::{attrs_text, print};
pub use region::{MAX_REGION_DEPTH, REGION_OP_NAMES, RegionOp};
pub use sharding::{AxisType, DimSharding, Mesh, Sharding};
pub use sorting::CumulativeKind;
pub use types::{DType, MAX_TENSOR_BYTES, Shape, TensorType};
pub use verify::{VerifyError, verify};
