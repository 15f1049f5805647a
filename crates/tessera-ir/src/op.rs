//! The primitive ops (like `jax.lax`) and their type rules.
//!
//! Every op is defined here once, with the rule that gives its result type from its operand
//! types. Passes keep their own table per op (kernel in `tessera-interp`, VJP in autodiff, factor
//! rule in sharding, lowering in codegen), each a `match` with no wildcard arm, so adding a
//! variant makes the compiler list every place the new op must reach (`docs/add-an-op.md`).

use std::fmt;

use crate::conv::{ConvDims, WindowDims};
pub use crate::gather::{GatherDims, IndexMode, ScatterDims, ScatterKind};
use crate::literal::Literal;
use crate::region::RegionOp;
use crate::sharding::{Mesh, Sharding};
use crate::sorting::CumulativeKind;
use crate::types::{DType, Shape, TensorType};

/// Elementwise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sign,
    Exp,
    Log,
    Log1p,
    Expm1,
    Tanh,
    Logistic,
    Sin,
    Cos,
    Sqrt,
    Rsqrt,
    Floor,
    Ceil,
    /// Rounds half away from zero, as `lax.round`'s default.
    Round,
    Erf,
    ErfInv,
    /// Bitwise not on integers, logical not on bool.
    Not,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Exp2,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 29] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Erf,
        UnaryOp::ErfInv,
        UnaryOp::Not,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
        UnaryOp::Exp2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Erf => "erf",
            UnaryOp::ErfInv => "erf_inv",
            UnaryOp::Not => "not",
            UnaryOp::Tan => "tan",
            UnaryOp::Asin => "asin",
            UnaryOp::Acos => "acos",
            UnaryOp::Atan => "atan",
            UnaryOp::Sinh => "sinh",
            UnaryOp::Cosh => "cosh",
            UnaryOp::Asinh => "asinh",
            UnaryOp::Acosh => "acosh",
            UnaryOp::Atanh => "atanh",
            UnaryOp::Exp2 => "exp2",
        }
    }

    /// Which element types the op accepts.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => dtype.is_numeric(),
            UnaryOp::Not => dtype.is_int() || dtype == DType::Bool,
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
            | UnaryOp::Exp2 => dtype.is_float(),
        }
    }
}

/// Elementwise ops of two operands of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Remainder with the sign of the dividend (C's `fmod`, `lax.rem`).
    Rem,
    Max,
    Min,
    Pow,
    And,
    Or,
    Xor,
    ShiftLeft,
    ShiftRightLogical,
    /// `atan2(x, y)`: the angle of the point `(y, x)`, in `[-pi, pi]` (`lax.atan2`).
    Atan2,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 14] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::ShiftLeft,
        BinaryOp::ShiftRightLogical,
        BinaryOp::Atan2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::ShiftLeft => "shift_left",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
            BinaryOp::Atan2 => "atan2",
        }
    }

    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Rem
            | BinaryOp::Max
            | BinaryOp::Min => dtype.is_numeric(),
            BinaryOp::Pow | BinaryOp::Atan2 => dtype.is_float(),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => dtype.is_int() || dtype == DType::Bool,
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical => dtype.is_int(),
        }
    }
}

/// Comparison directions; every comparison yields bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub const ALL: [CompareOp; 6] = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// The combining function of a reduction or reducing collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 3] = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min];

    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
        }
    }

    pub fn from_name(s: &str) -> Option<ReduceKind> {
        ReduceKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Dimension numbers of `dot_general`: the result is batch dims, then the lhs free dims, then
/// the rhs free dims, each in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// `[m,k] x [k,n] -> [m,n]`.
    pub fn matmul() -> DotDims {
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            ..DotDims::default()
        }
    }

    /// Dims of the lhs that are neither batch nor contracting, in order.
    pub fn lhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank)
            .filter(|d| !self.lhs_batch.contains(d) && !self.lhs_contract.contains(d))
            .collect()
    }

    pub fn rhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank)
            .filter(|d| !self.rhs_batch.contains(d) && !self.rhs_contract.contains(d))
            .collect()
    }
}

/// The ops that run over a group of devices (the mesh axes `axes`). Their value on one device
/// depends on the other devices of the group; every other op is computed from its operands alone.
#[derive(Clone, Debug, PartialEq)]
pub enum CollectiveOp {
    /// Combines the values of every device in the group of mesh axes `axes`.
    AllReduce { kind: ReduceKind, axes: Vec<String> },
    /// Concatenates along `dim` the values of every device of the group, in group order.
    AllGather { dim: usize, axes: Vec<String> },
    /// All-reduce, then each device keeps its chunk of `dim`.
    ReduceScatter {
        kind: ReduceKind,
        dim: usize,
        axes: Vec<String>,
    },
    /// Splits `split_dim` into group-size chunks, sends chunk `j` to device `j`, concatenates the
    /// received chunks along `concat_dim`.
    AllToAll {
        split_dim: usize,
        concat_dim: usize,
        axes: Vec<String>,
    },
    /// Device `src` sends its value to device `dst` for each pair (indices within the group);
    /// a device that receives nothing gets zeros.
    CollectivePermute {
        axes: Vec<String>,
        pairs: Vec<(usize, usize)>,
    },
    /// This device's index (i32 scalar) within the group of `axes`.
    AxisIndex { axes: Vec<String> },
}

impl CollectiveOp {
    /// The op's mnemonic in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            CollectiveOp::AllReduce { .. } => "all_reduce",
            CollectiveOp::AllGather { .. } => "all_gather",
            CollectiveOp::ReduceScatter { .. } => "reduce_scatter",
            CollectiveOp::AllToAll { .. } => "all_to_all",
            CollectiveOp::CollectivePermute { .. } => "collective_permute",
            CollectiveOp::AxisIndex { .. } => "axis_index",
        }
    }

    /// The mesh axes whose device group the op runs over.
    pub fn axes(&self) -> &[String] {
        match self {
            CollectiveOp::AllReduce { axes, .. }
            | CollectiveOp::AllGather { axes, .. }
            | CollectiveOp::ReduceScatter { axes, .. }
            | CollectiveOp::AllToAll { axes, .. }
            | CollectiveOp::CollectivePermute { axes, .. }
            | CollectiveOp::AxisIndex { axes } => axes,
        }
    }

    /// The number of operands.
    pub fn arity(&self) -> usize {
        match self {
            CollectiveOp::AxisIndex { .. } => 0,
            CollectiveOp::AllReduce { .. }
            | CollectiveOp::AllGather { .. }
            | CollectiveOp::ReduceScatter { .. }
            | CollectiveOp::AllToAll { .. }
            | CollectiveOp::CollectivePermute { .. } => 1,
        }
    }
}

/// What kind of computation an op is. Policy that is the same for every op of a class (fusion,
/// cost, sharding priority) matches on this instead of listing ops, so that a new op is placed
/// once, here, and the compiler flags every table that must decide about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// A function input.
    Parameter,
    /// A value from attributes alone: `constant`, `iota`.
    Constant,
    /// One operand, one scalar function per element: unary ops, `convert`, `bitcast`.
    ElementwiseUnary,
    /// Two same-shaped operands, one scalar function per element: binary ops and comparisons.
    ElementwiseBinary,
    /// `select`: three same-shaped operands.
    Select,
    /// Moves or copies elements without arithmetic: broadcast, reshape, transpose, slice,
    /// concatenate, pad.
    Movement,
    /// Combines elements along axes: `reduce_*`, `argmax`, `reduce_window_*`.
    Reduction,
    /// `dot_general`, `conv_general_dilated`.
    Dot,
    /// Runs over a group of devices ([`CollectiveOp`]).
    Collective,
    /// The identity on values, carrying a hint for a pass: `sharding_constraint`,
    /// `stop_gradient`.
    Annotation,
    /// An op that owns sub-graphs (`scan`, `while`, `case`, `checkpoint`, `custom_vjp`) and
    /// `get_result`, which reads one of its results.
    Region,
}

/// One primitive op with its attributes. The result type of a node is stored on the node; the
/// attributes here are what the type rule needs to compute it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The `i`-th input of the function. Its type is the node's type.
    Parameter(usize),
    Constant(Literal),
    /// Counts 0, 1, 2, ... along `dim` of `ty`.
    Iota {
        dim: usize,
        ty: TensorType,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `select pred, on_true, on_false`, elementwise.
    Select,
    /// Value conversion to another element type (float to int truncates toward zero).
    Convert(DType),
    /// Reinterprets the bits as another element type of the same width.
    Bitcast(DType),
    /// Operand dim `i` becomes result dim `dims[i]`; operand dims are 1 or equal to the result's.
    BroadcastInDim {
        shape: Shape,
        dims: Vec<usize>,
    },
    Reshape(Shape),
    /// Result dim `i` is operand dim `perm[i]`.
    Transpose(Vec<usize>),
    Slice {
        start: Vec<usize>,
        limit: Vec<usize>,
        stride: Vec<usize>,
    },
    Concatenate {
        dim: usize,
    },
    /// `pad operand, padding_value`: negative low/high padding crops.
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<usize>,
    },
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
    },
    /// Index (i32) of the first maximal element along `axis`; NaN counts as the maximum.
    ArgMax {
        axis: usize,
    },
    DotGeneral(DotDims),
    /// An op whose value depends on the device group: the communicating collectives and
    /// `axis_index`. Each runs over the group of mesh axes it names.
    Collective(CollectiveOp),
    /// A user hint that sharding propagation must respect; the identity on values.
    ShardingConstraint(Sharding),
    /// The identity on values whose derivative is zero (`lax.stop_gradient`).
    StopGradient,
    /// An op that owns sub-graphs: loops, branches, checkpointed and custom-gradient calls
    /// ([`RegionOp`], layouts in `region.rs`). Its node has the [`TensorType::token`] type;
    /// [`Op::GetResult`] nodes read its results.
    Region(Box<RegionOp>),
    /// Result `index` of the region node that is its operand; `ty` is that result's type
    /// (checked by the verifier against the region).
    GetResult {
        index: usize,
        ty: TensorType,
    },
    /// `conv_general_dilated lhs, rhs` (`lax.conv_general_dilated`; see `conv.rs`).
    Conv(Box<ConvDims>),
    /// A sum, max or min over a sliding window (`lax.reduce_window`; see `conv.rs`); the
    /// padding holds the reduction's identity (0, -inf / the lowest int, +inf / the highest).
    ReduceWindow {
        kind: ReduceKind,
        win: Box<WindowDims>,
    },
    /// `gather operand, indices`: slices of the operand at start indices read from `indices`
    /// (XLA's gather; dimension numbers and out-of-bounds modes in `gather.rs`).
    Gather(Box<GatherDims>),
    /// `scatter operand, indices, updates`: the operand with update windows combined in at
    /// start indices read from `indices` (XLA's scatter; `gather.rs`).
    Scatter(Box<ScatterDims>),
    /// `lax.sort` of same-shaped operands along `dim`, stable, lexicographic over the first
    /// `num_keys`; the value is operand `output` permuted (see `sorting.rs`).
    Sort {
        dim: usize,
        num_keys: usize,
        output: usize,
    },
    /// `lax.cumsum`/`cumprod`/`cummax`/`cummin` along `axis` (from the end when `reverse`).
    Cumulative {
        kind: CumulativeKind,
        axis: usize,
        reverse: bool,
    },
    /// `lax.rev`: reverses the order of elements along each of `dims`.
    Rev {
        dims: Vec<usize>,
    },
}

/// Every op mnemonic of the text format, in one list: table tests iterate over it, so an op
/// added here without a test case fails them.
pub const ALL_OP_NAMES: &[&str] = &[
    "parameter",
    "constant",
    "iota",
    "neg",
    "abs",
    "sign",
    "exp",
    "log",
    "log1p",
    "expm1",
    "tanh",
    "logistic",
    "sin",
    "cos",
    "sqrt",
    "rsqrt",
    "floor",
    "ceil",
    "round",
    "erf",
    "erf_inv",
    "not",
    "add",
    "sub",
    "mul",
    "div",
    "rem",
    "max",
    "min",
    "pow",
    "and",
    "or",
    "xor",
    "shift_left",
    "shift_right_logical",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "select",
    "convert",
    "bitcast",
    "broadcast_in_dim",
    "reshape",
    "transpose",
    "slice",
    "concatenate",
    "pad",
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "argmax",
    "dot_general",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "axis_index",
    "sharding_constraint",
    "stop_gradient",
    "scan",
    "while",
    "case",
    "checkpoint",
    "custom_vjp",
    "get_result",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "exp2",
    "atan2",
    "conv_general_dilated",
    "reduce_window_sum",
    "reduce_window_max",
    "reduce_window_min",
    "gather",
    "scatter",
    "sort",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "rev",
];

/// A type rule rejected an op's operands or attributes.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{op}: {reason} (operands: {})", fmt_types(.operands))]
pub struct TypeError {
    pub op: String,
    pub operands: Vec<TensorType>,
    pub reason: String,
}

fn fmt_types(types: &[TensorType]) -> String {
    if types.is_empty() {
        return "none".into();
    }
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Op {
    /// The op's mnemonic in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter(_) => "parameter",
            Op::Constant(_) => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Convert(_) => "convert",
            Op::Bitcast(_) => "bitcast",
            Op::BroadcastInDim { .. } => "broadcast_in_dim",
            Op::Reshape(_) => "reshape",
            Op::Transpose(_) => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concatenate { .. } => "concatenate",
            Op::Pad { .. } => "pad",
            Op::Reduce { kind, .. } => match kind {
                ReduceKind::Sum => "reduce_sum",
                ReduceKind::Max => "reduce_max",
                ReduceKind::Min => "reduce_min",
            },
            Op::ArgMax { .. } => "argmax",
            Op::DotGeneral(_) => "dot_general",
            Op::Collective(c) => c.name(),
            Op::ShardingConstraint(_) => "sharding_constraint",
            Op::StopGradient => "stop_gradient",
            Op::Region(r) => r.name(),
            Op::GetResult { .. } => "get_result",
            Op::Conv(_) => "conv_general_dilated",
            Op::ReduceWindow { kind, .. } => crate::conv::reduce_window_name(*kind),
            Op::Gather(_) => "gather",
            Op::Scatter(_) => "scatter",
            Op::Sort { .. } => "sort",
            Op::Cumulative { kind, .. } => kind.name(),
            Op::Rev { .. } => "rev",
        }
    }

    /// Ops that apply one scalar function at every index of same-shaped operands.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self.class(),
            OpClass::ElementwiseUnary | OpClass::ElementwiseBinary | OpClass::Select
        )
    }

    /// Ops whose value depends on the device group (collectives and `axis_index`).
    pub fn is_collective(&self) -> bool {
        self.class() == OpClass::Collective
    }

    /// The mesh axes a collective runs over (empty for other ops).
    pub fn mesh_axes(&self) -> &[String] {
        match self {
            Op::Collective(c) => c.axes(),
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::DotGeneral(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Region(_)
            | Op::GetResult { .. }
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => &[],
        }
    }

    /// Whether the op keeps f16/bf16 operands and results as they are: it is about the narrow
    /// type itself (`convert`, `bitcast`), holds or moves whole buffers (parameters, constants,
    /// regions, `get_result`, collectives, whose transport rounds as f32's op would). Every
    /// other op computes f16 and bf16 in f32 ([`Op::widened`]) and rounds its result once: the
    /// interpreter's `eval_op` and the compiler's `narrow` pass both follow this table.
    pub fn keeps_narrow(&self) -> bool {
        match self {
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::Region(_)
            | Op::GetResult { .. }
            | Op::Collective(_) => true,
            Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::DotGeneral(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => false,
        }
    }

    /// The op computing in f32 what this one computes in f16 or bf16: the same op, with an
    /// `iota`'s result type widened (the one attribute that names a narrow type).
    pub fn widened(&self) -> Op {
        match self {
            Op::Iota { dim, ty } => Op::Iota {
                dim: *dim,
                ty: ty.with_dtype(ty.dtype.compute_type()),
            },
            // tidy: allow-wildcard(only iota names its result dtype; `keeps_narrow` is the per-op table)
            other => other.clone(),
        }
    }

    /// The op's class: the one exhaustive table that per-op policy elsewhere may match on
    /// instead of listing ops (see `docs/add-an-op.md`).
    pub fn class(&self) -> OpClass {
        match self {
            Op::Parameter(_) => OpClass::Parameter,
            Op::Constant(_) | Op::Iota { .. } => OpClass::Constant,
            Op::Unary(_) | Op::Convert(_) | Op::Bitcast(_) => OpClass::ElementwiseUnary,
            Op::Binary(_) | Op::Compare(_) => OpClass::ElementwiseBinary,
            Op::Select => OpClass::Select,
            Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. } => OpClass::Movement,
            Op::Reduce { .. } | Op::ArgMax { .. } => OpClass::Reduction,
            Op::DotGeneral(_) => OpClass::Dot,
            Op::Collective(_) => OpClass::Collective,
            Op::ShardingConstraint(_) | Op::StopGradient => OpClass::Annotation,
            Op::Region(_) | Op::GetResult { .. } => OpClass::Region,
            Op::Conv(_) => OpClass::Dot,
            Op::ReduceWindow { .. } => OpClass::Reduction,
            Op::Gather(_) => OpClass::Movement,
            Op::Scatter(_) => OpClass::Reduction,
            Op::Sort { .. } | Op::Cumulative { .. } => OpClass::Reduction,
            Op::Rev { .. } => OpClass::Movement,
        }
    }

    /// The number of operands, `None` for variadic ops.
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => 0,
            Op::Collective(c) => c.arity(),
            Op::Unary(_)
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::GetResult { .. } => 1,
            Op::Binary(_) | Op::Compare(_) | Op::DotGeneral(_) | Op::Pad { .. } => 2,
            Op::ReduceWindow { .. } => 1,
            Op::Conv(_) => 2,
            Op::Select => 3,
            Op::Gather(_) => 2,
            Op::Scatter(_) => 3,
            Op::Concatenate { .. } | Op::Region(_) => return None,
            Op::Sort { .. } => return None,
            Op::Cumulative { .. } | Op::Rev { .. } => 1,
        })
    }

    /// The type rule: the result type of this op applied to operands of the given types.
    /// Collectives check their axes against `mesh`. Sizes are computed with checked
    /// arithmetic, and a result over the size limit of one tensor
    /// ([`TensorType::check_size`]) is an error.
    ///
    /// The rules are grouped by family, as JAX groups its primitives (`rules::elementwise`,
    /// `rules::movement`, `rules::reduction`, `rules::dot`, `rules::collective`, ...); this
    /// `match` only checks the arity and dispatches.
    pub fn infer_type(
        &self,
        operands: &[&TensorType],
        mesh: Option<&Mesh>,
    ) -> Result<TensorType, TypeError> {
        let cx = rules::Cx {
            op: self,
            operands,
            mesh,
        };
        match self.arity() {
            Some(n) if n != operands.len() => {
                return Err(cx.fail(format!(
                    "takes {n} operand{}, got {}",
                    if n == 1 { "" } else { "s" },
                    operands.len()
                )));
            }
            None if operands.is_empty() && !matches!(self, Op::Region(_)) => {
                return Err(cx.fail("takes at least one operand".into()));
            }
            _ => {}
        }
        let ty = match self {
            Op::Parameter(_) => Err(cx.fail("parameters carry their own type".into())),
            Op::Constant(lit) => rules::source::constant(&cx, lit),
            Op::Iota { dim, ty } => rules::source::iota(&cx, *dim, ty),
            Op::Unary(u) => rules::elementwise::unary(&cx, *u),
            Op::Binary(b) => rules::elementwise::binary(&cx, *b),
            Op::Compare(_) => rules::elementwise::compare(&cx),
            Op::Select => rules::elementwise::select(&cx),
            Op::Convert(to) => rules::elementwise::convert(&cx, *to),
            Op::Bitcast(to) => rules::elementwise::bitcast(&cx, *to),
            Op::BroadcastInDim { shape, dims } => {
                rules::movement::broadcast_in_dim(&cx, shape, dims)
            }
            Op::Reshape(shape) => rules::movement::reshape(&cx, shape),
            Op::Transpose(perm) => rules::movement::transpose(&cx, perm),
            Op::Slice {
                start,
                limit,
                stride,
            } => rules::movement::slice(&cx, start, limit, stride),
            Op::Concatenate { dim } => rules::movement::concatenate(&cx, *dim),
            Op::Pad {
                low,
                high,
                interior,
            } => rules::movement::pad(&cx, low, high, interior),
            Op::Reduce { axes, .. } => rules::reduction::reduce(&cx, axes),
            Op::ArgMax { axis } => rules::reduction::argmax(&cx, *axis),
            Op::DotGeneral(dd) => rules::dot::dot_general(&cx, dd),
            Op::Collective(c) => rules::collective::collective(&cx, c),
            Op::ShardingConstraint(s) => rules::annotation::sharding_constraint(&cx, s),
            Op::StopGradient => Ok(cx.operands[0].clone()),
            Op::Region(r) => rules::region::region(&cx, r),
            Op::GetResult { ty, .. } => rules::region::get_result(&cx, ty),
            Op::Conv(cd) => {
                crate::conv::conv_type(cd, operands[0], operands[1]).map_err(|e| cx.fail(e))
            }
            Op::ReduceWindow { win, .. } => {
                crate::conv::reduce_window_type(win, operands[0]).map_err(|e| cx.fail(e))
            }
            Op::Gather(d) => d.infer(operands[0], operands[1]).map_err(|e| cx.fail(e)),
            Op::Scatter(d) => d
                .infer(operands[0], operands[1], operands[2])
                .map_err(|e| cx.fail(e)),
            Op::Sort {
                dim,
                num_keys,
                output,
            } => crate::sorting::sort_type(operands, *dim, *num_keys, *output)
                .map_err(|e| cx.fail(e)),
            Op::Cumulative { kind, axis, .. } => {
                crate::sorting::cumulative_type(operands[0], *kind, *axis).map_err(|e| cx.fail(e))
            }
            Op::Rev { dims } => crate::sorting::rev_type(operands[0], dims).map_err(|e| cx.fail(e)),
        }?;
        ty.check_size().map_err(|e| cx.fail(e))?;
        Ok(ty)
    }
}

/// The type rules of `Op::infer_type`, one module per op family. Each rule gets the operand
/// types (their count already checked against the arity) through [`rules::Cx`].
mod rules {
    use super::{Mesh, Op, TensorType, TypeError};

    /// What one type rule sees: the op (named in errors), its operand types and the mesh.
    pub(super) struct Cx<'a> {
        pub(super) op: &'a Op,
        pub(super) operands: &'a [&'a TensorType],
        pub(super) mesh: Option<&'a Mesh>,
    }

    type Rule = Result<TensorType, TypeError>;

    impl Cx<'_> {
        /// Operand `i`'s type.
        fn t(&self, i: usize) -> &TensorType {
            self.operands[i]
        }

        pub(super) fn fail(&self, reason: String) -> TypeError {
            TypeError {
                op: self.op.name().to_string(),
                operands: self.operands.iter().map(|t| (*t).clone()).collect(),
                reason,
            }
        }

        fn check_dim(&self, dim: usize, rank: usize, what: &str) -> Result<(), TypeError> {
            if dim >= rank {
                Err(self.fail(format!("{what} {dim} is out of range for rank {rank}")))
            } else {
                Ok(())
            }
        }

        /// The size of the device group of mesh axes `axes`.
        fn check_axes(&self, axes: &[String]) -> Result<usize, TypeError> {
            let mesh = self.mesh.ok_or_else(|| {
                self.fail(format!(
                    "collective over {axes:?} outside of any mesh (the graph declares none)"
                ))
            })?;
            if axes.is_empty() {
                return Err(self.fail("needs at least one mesh axis".into()));
            }
            let mut size = 1;
            for (i, a) in axes.iter().enumerate() {
                if axes[..i].contains(a) {
                    return Err(self.fail(format!("mesh axis \"{a}\" is named twice")));
                }
                let n = mesh.axis_size(a).ok_or_else(|| {
                    self.fail(format!(
                        "unknown mesh axis \"{a}\" (mesh @{} has {:?})",
                        mesh.name,
                        mesh.axes.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    ))
                })?;
                size = usize::checked_mul(size, n)
                    .ok_or_else(|| self.fail(format!("the group size of {axes:?} overflows")))?;
            }
            Ok(size)
        }
    }

    /// Values from attributes alone.
    pub(super) mod source {
        use super::{Cx, Rule};
        use crate::literal::Literal;
        use crate::types::{DType, TensorType};

        pub(in crate::op) fn constant(cx: &Cx, lit: &Literal) -> Rule {
            lit.check().map_err(|e| cx.fail(e))?;
            Ok(lit.ty.clone())
        }

        pub(in crate::op) fn iota(cx: &Cx, dim: usize, ty: &TensorType) -> Rule {
            cx.check_dim(dim, ty.rank(), "dimension")?;
            if ty.dtype == DType::Bool {
                return Err(cx.fail("iota of bool".into()));
            }
            Ok(ty.clone())
        }
    }

    /// One scalar function per element: the result has the operands' shape.
    pub(super) mod elementwise {
        use super::{Cx, Rule};
        use crate::op::{BinaryOp, UnaryOp};
        use crate::types::DType;

        pub(in crate::op) fn unary(cx: &Cx, u: UnaryOp) -> Rule {
            let t = cx.t(0);
            if !u.accepts(t.dtype) {
                return Err(cx.fail(format!("not defined for {}", t.dtype)));
            }
            Ok(t.clone())
        }

        pub(in crate::op) fn binary(cx: &Cx, b: BinaryOp) -> Rule {
            let (a, c) = (cx.t(0), cx.t(1));
            if a != c {
                return Err(cx.fail("operand types differ".into()));
            }
            if !b.accepts(a.dtype) {
                return Err(cx.fail(format!("not defined for {}", a.dtype)));
            }
            Ok(a.clone())
        }

        pub(in crate::op) fn compare(cx: &Cx) -> Rule {
            let (a, c) = (cx.t(0), cx.t(1));
            if a != c {
                return Err(cx.fail("operand types differ".into()));
            }
            Ok(a.with_dtype(DType::Bool))
        }

        pub(in crate::op) fn select(cx: &Cx) -> Rule {
            let (p, t, f) = (cx.t(0), cx.t(1), cx.t(2));
            if p.dtype != DType::Bool {
                return Err(cx.fail("predicate must be bool".into()));
            }
            if t != f {
                return Err(cx.fail("the two branches have different types".into()));
            }
            if p.shape != t.shape {
                return Err(cx.fail("predicate shape differs from the branches'".into()));
            }
            Ok(t.clone())
        }

        pub(in crate::op) fn convert(cx: &Cx, to: DType) -> Rule {
            Ok(cx.t(0).with_dtype(to))
        }

        pub(in crate::op) fn bitcast(cx: &Cx, to: DType) -> Rule {
            let from = cx.t(0).dtype;
            if from == DType::Bool || to == DType::Bool || from.bit_width() != to.bit_width() {
                return Err(cx.fail(format!("cannot reinterpret {from} as {to}")));
            }
            Ok(cx.t(0).with_dtype(to))
        }
    }

    /// Moves or copies elements: the result's dtype is the (first) operand's.
    pub(super) mod movement {
        use super::{Cx, Rule};
        use crate::types::{Shape, TensorType};

        pub(in crate::op) fn broadcast_in_dim(cx: &Cx, shape: &Shape, dims: &[usize]) -> Rule {
            let t = cx.t(0);
            if dims.len() != t.rank() {
                return Err(cx.fail(format!(
                    "dims {dims:?} must name one result dim per operand dim (rank {})",
                    t.rank()
                )));
            }
            for (i, &d) in dims.iter().enumerate() {
                cx.check_dim(d, shape.rank(), "result dim")?;
                if i > 0 && dims[i - 1] >= d {
                    return Err(cx.fail(format!("dims {dims:?} must be strictly increasing")));
                }
                let (from, to) = (t.dims()[i], shape.dims()[d]);
                if from != 1 && from != to {
                    return Err(cx.fail(format!(
                        "operand dim {i} of size {from} cannot broadcast to size {to}"
                    )));
                }
            }
            Ok(TensorType::new(t.dtype, shape.clone()))
        }

        pub(in crate::op) fn reshape(cx: &Cx, shape: &Shape) -> Rule {
            let t = cx.t(0);
            if shape.numel() != t.numel() {
                return Err(cx.fail(format!(
                    "cannot reshape {} elements into {shape}",
                    t.numel()
                )));
            }
            Ok(TensorType::new(t.dtype, shape.clone()))
        }

        pub(in crate::op) fn transpose(cx: &Cx, perm: &[usize]) -> Rule {
            let t = cx.t(0);
            let mut seen = vec![false; t.rank()];
            if perm.len() != t.rank()
                || perm
                    .iter()
                    .any(|&p| p >= t.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(cx.fail(format!(
                    "{perm:?} is not a permutation of rank {}",
                    t.rank()
                )));
            }
            let dims: Vec<usize> = perm.iter().map(|&p| t.dims()[p]).collect();
            Ok(TensorType::new(t.dtype, dims))
        }

        pub(in crate::op) fn slice(
            cx: &Cx,
            start: &[usize],
            limit: &[usize],
            stride: &[usize],
        ) -> Rule {
            let t = cx.t(0);
            if start.len() != t.rank() || limit.len() != t.rank() || stride.len() != t.rank() {
                return Err(cx.fail(format!(
                    "start, limit and stride need {} entries each",
                    t.rank()
                )));
            }
            let mut dims = Vec::with_capacity(t.rank());
            for i in 0..t.rank() {
                if start[i] > limit[i] || limit[i] > t.dims()[i] || stride[i] == 0 {
                    return Err(cx.fail(format!(
                        "dim {i}: need start <= limit <= {} and stride >= 1, got {}:{}:{}",
                        t.dims()[i],
                        start[i],
                        limit[i],
                        stride[i]
                    )));
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            Ok(TensorType::new(t.dtype, dims))
        }

        pub(in crate::op) fn concatenate(cx: &Cx, dim: usize) -> Rule {
            let first = cx.t(0);
            cx.check_dim(dim, first.rank(), "dimension")?;
            let mut size = 0;
            for t in cx.operands {
                if t.dtype != first.dtype || t.rank() != first.rank() {
                    return Err(cx.fail("operands differ in dtype or rank".into()));
                }
                for d in 0..t.rank() {
                    if d != dim && t.dims()[d] != first.dims()[d] {
                        return Err(cx.fail(format!("operands differ in dim {d}")));
                    }
                }
                size = usize::checked_add(size, t.dims()[dim]).ok_or_else(|| {
                    cx.fail(format!("the size of dim {dim} of the result overflows"))
                })?;
            }
            let mut dims = first.dims().to_vec();
            dims[dim] = size;
            Ok(TensorType::new(first.dtype, dims))
        }

        pub(in crate::op) fn pad(cx: &Cx, low: &[i64], high: &[i64], interior: &[usize]) -> Rule {
            let (t, v) = (cx.t(0), cx.t(1));
            if v.rank() != 0 || v.dtype != t.dtype {
                return Err(cx.fail(format!("padding value must be a {} scalar", t.dtype)));
            }
            if low.len() != t.rank() || high.len() != t.rank() || interior.len() != t.rank() {
                return Err(cx.fail(format!(
                    "low, high and interior need {} entries each",
                    t.rank()
                )));
            }
            let mut dims = Vec::with_capacity(t.rank());
            for i in 0..t.rank() {
                // In i128, where every term fits; the interior product and the sum are checked.
                let d = t.dims()[i] as i128;
                let n = (d - 1)
                    .max(0)
                    .checked_mul(interior[i] as i128)
                    .and_then(|inner| inner.checked_add(low[i] as i128 + high[i] as i128 + d));
                let overflow = || cx.fail(format!("the size of dim {i} overflows"));
                match n {
                    Some(n) if n < 0 => {
                        return Err(cx.fail(format!("dim {i} would have negative size {n}")));
                    }
                    Some(n) => dims.push(usize::try_from(n).map_err(|_| overflow())?),
                    None => return Err(overflow()),
                }
                // Past 2^62 no padding makes a dim that fits in memory, and the kernels'
                // index arithmetic (`q = out - low`, `interior + 1`) stays inside i64. (A dim
                // of size 1 gets no interior padding, so its interior can be huge above.)
                const MAX_PAD: u64 = 1 << 62;
                if low[i].unsigned_abs() > MAX_PAD
                    || high[i].unsigned_abs() > MAX_PAD
                    || interior[i] as u64 > MAX_PAD
                {
                    return Err(cx.fail(format!(
                        "the padding of dim {i} (low {}, high {}, interior {}) is past 2^62",
                        low[i], high[i], interior[i]
                    )));
                }
            }
            Ok(TensorType::new(t.dtype, dims))
        }
    }

    /// Combines elements along axes, which the result drops.
    pub(super) mod reduction {
        use super::{Cx, Rule};
        use crate::types::{DType, TensorType};

        pub(in crate::op) fn reduce(cx: &Cx, axes: &[usize]) -> Rule {
            let t = cx.t(0);
            if t.dtype == DType::Bool {
                return Err(cx.fail("reduction of bool".into()));
            }
            for (i, &a) in axes.iter().enumerate() {
                cx.check_dim(a, t.rank(), "axis")?;
                if axes[..i].contains(&a) {
                    return Err(cx.fail(format!("axis {a} is named twice")));
                }
            }
            let dims: Vec<usize> = (0..t.rank())
                .filter(|d| !axes.contains(d))
                .map(|d| t.dims()[d])
                .collect();
            Ok(TensorType::new(t.dtype, dims))
        }

        pub(in crate::op) fn argmax(cx: &Cx, axis: usize) -> Rule {
            let t = cx.t(0);
            cx.check_dim(axis, t.rank(), "axis")?;
            if t.dtype == DType::Bool {
                return Err(cx.fail("argmax of bool".into()));
            }
            if t.dims()[axis] == 0 {
                return Err(cx.fail(format!("axis {axis} is empty")));
            }
            let dims: Vec<usize> = (0..t.rank())
                .filter(|&d| d != axis)
                .map(|d| t.dims()[d])
                .collect();
            Ok(TensorType::new(DType::I32, dims))
        }
    }

    pub(super) mod dot {
        use super::{Cx, Rule};
        use crate::op::DotDims;
        use crate::types::TensorType;

        pub(in crate::op) fn dot_general(cx: &Cx, dd: &DotDims) -> Rule {
            let (l, r) = (cx.t(0), cx.t(1));
            if l.dtype != r.dtype {
                return Err(cx.fail("operand dtypes differ".into()));
            }
            if !l.dtype.is_numeric() {
                return Err(cx.fail("dot of bool".into()));
            }
            if dd.lhs_batch.len() != dd.rhs_batch.len()
                || dd.lhs_contract.len() != dd.rhs_contract.len()
            {
                return Err(cx.fail(
                    "lhs and rhs name different numbers of batch or contracting dims".into(),
                ));
            }
            let mut used_l = vec![false; l.rank()];
            let mut used_r = vec![false; r.rank()];
            let pairs = dd
                .lhs_batch
                .iter()
                .zip(&dd.rhs_batch)
                .chain(dd.lhs_contract.iter().zip(&dd.rhs_contract));
            for (&a, &b) in pairs {
                cx.check_dim(a, l.rank(), "lhs dim")?;
                cx.check_dim(b, r.rank(), "rhs dim")?;
                if std::mem::replace(&mut used_l[a], true)
                    || std::mem::replace(&mut used_r[b], true)
                {
                    return Err(cx.fail("a dim is named twice in the dimension numbers".into()));
                }
                if l.dims()[a] != r.dims()[b] {
                    return Err(cx.fail(format!(
                        "lhs dim {a} (size {}) does not match rhs dim {b} (size {})",
                        l.dims()[a],
                        r.dims()[b]
                    )));
                }
            }
            let mut dims: Vec<usize> = dd.lhs_batch.iter().map(|&d| l.dims()[d]).collect();
            dims.extend(dd.lhs_free(l.rank()).iter().map(|&d| l.dims()[d]));
            dims.extend(dd.rhs_free(r.rank()).iter().map(|&d| r.dims()[d]));
            Ok(TensorType::new(l.dtype, dims))
        }
    }

    /// Ops over a device group: each checks its axes against the mesh first.
    pub(super) mod collective {
        use super::{Cx, Rule};
        use crate::op::CollectiveOp;
        use crate::types::{DType, TensorType};

        pub(in crate::op) fn collective(cx: &Cx, c: &CollectiveOp) -> Rule {
            let n = cx.check_axes(c.axes())?;
            match c {
                CollectiveOp::AllReduce { .. } => {
                    if cx.t(0).dtype == DType::Bool {
                        return Err(cx.fail("reduction of bool".into()));
                    }
                    Ok(cx.t(0).clone())
                }
                CollectiveOp::AllGather { dim, .. } => {
                    let t = cx.t(0);
                    cx.check_dim(*dim, t.rank(), "dimension")?;
                    let mut dims = t.dims().to_vec();
                    dims[*dim] = dims[*dim]
                        .checked_mul(n)
                        .ok_or_else(|| cx.fail(format!("the size of dim {dim} overflows")))?;
                    Ok(TensorType::new(t.dtype, dims))
                }
                CollectiveOp::ReduceScatter { dim, .. } => {
                    let t = cx.t(0);
                    cx.check_dim(*dim, t.rank(), "dimension")?;
                    if t.dtype == DType::Bool {
                        return Err(cx.fail("reduction of bool".into()));
                    }
                    if !t.dims()[*dim].is_multiple_of(n) {
                        return Err(cx.fail(format!(
                            "dim {dim} of size {} is not divisible by the group size {n}",
                            t.dims()[*dim]
                        )));
                    }
                    let mut dims = t.dims().to_vec();
                    dims[*dim] /= n;
                    Ok(TensorType::new(t.dtype, dims))
                }
                CollectiveOp::AllToAll {
                    split_dim,
                    concat_dim,
                    ..
                } => {
                    let t = cx.t(0);
                    cx.check_dim(*split_dim, t.rank(), "split dim")?;
                    cx.check_dim(*concat_dim, t.rank(), "concat dim")?;
                    if !t.dims()[*split_dim].is_multiple_of(n) {
                        return Err(cx.fail(format!(
                            "split dim {split_dim} of size {} is not divisible by the group \
                             size {n}",
                            t.dims()[*split_dim]
                        )));
                    }
                    let mut dims = t.dims().to_vec();
                    dims[*split_dim] /= n;
                    dims[*concat_dim] = dims[*concat_dim].checked_mul(n).ok_or_else(|| {
                        cx.fail(format!("the size of concat dim {concat_dim} overflows"))
                    })?;
                    Ok(TensorType::new(t.dtype, dims))
                }
                CollectiveOp::CollectivePermute { pairs, .. } => {
                    for (i, &(s, d)) in pairs.iter().enumerate() {
                        if s >= n || d >= n {
                            return Err(
                                cx.fail(format!("pair ({s}, {d}) is outside the group of {n}"))
                            );
                        }
                        if pairs[..i].iter().any(|&(s2, d2)| s2 == s || d2 == d) {
                            return Err(
                                cx.fail(format!("pair ({s}, {d}) repeats a source or a target"))
                            );
                        }
                    }
                    Ok(cx.t(0).clone())
                }
                CollectiveOp::AxisIndex { .. } => Ok(TensorType::scalar(DType::I32)),
            }
        }
    }

    /// Hints for passes: the identity on types.
    pub(super) mod annotation {
        use super::{Cx, Rule};
        use crate::sharding::Sharding;

        pub(in crate::op) fn sharding_constraint(cx: &Cx, s: &Sharding) -> Rule {
            let t = cx.t(0);
            if s.dims.len() != t.rank() {
                return Err(cx.fail(format!(
                    "sharding {s} has {} dims for a tensor of rank {}",
                    s.dims.len(),
                    t.rank()
                )));
            }
            if let Some(mesh) = cx.mesh {
                for a in s.axes() {
                    if mesh.axis_size(a).is_none() {
                        return Err(cx.fail(format!("unknown mesh axis \"{a}\"")));
                    }
                }
            }
            Ok(t.clone())
        }
    }

    /// Ops that own sub-graphs: the region checks its operands against its bodies.
    pub(super) mod region {
        use super::{Cx, Rule};
        use crate::region::RegionOp;
        use crate::types::TensorType;

        pub(in crate::op) fn region(cx: &Cx, r: &RegionOp) -> Rule {
            r.result_types(cx.operands, cx.mesh)
                .map_err(|e| cx.fail(e))?;
            Ok(TensorType::token())
        }

        pub(in crate::op) fn get_result(cx: &Cx, ty: &TensorType) -> Rule {
            if !cx.t(0).is_token() {
                return Err(cx.fail("reads a result of a region op only".into()));
            }
            Ok(ty.clone())
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
