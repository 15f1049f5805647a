//! JAX's type promotion: the lattice of `jax/_src/dtypes.py` restricted to Tessera's dtypes,
//! with weak types, and the Rust numbers that take part in it.
//!
//! A weakly typed value (a Rust number written in an op, `Tensor::scalar(2.0)`, the result of an
//! op on weak values only) takes the type of the strongly typed operand it meets, as a Python
//! scalar does in JAX: `i32 tensor + 2` is i32, `f32 tensor * 0.5` is f32, `i32 tensor * 0.5` is
//! f32 (a weak float over an integer type is the default float).
//!
//! The lattice (each type below the ones it promotes to; `i*` and `f*` are the weak int and the
//! weak float):
//!
//! ```text
//! bool -> i* -> {u32, i32};  u32 -> i32 (i64 with x64);  i32 -> i64 -> f*;
//! f* -> {bf16, f16} -> f32 -> f64
//! ```
//!
//! The result of promoting a set of operands is their least upper bound on the lattice. JAX's
//! x64 flag is decided per op: it is on when an operand is 64-bit (f64, i64), off otherwise, so a
//! weak int alone is i32 and a weak float alone f32 (JAX's defaults with x64 disabled), while an
//! explicit f64 tensor keeps 64 bits (as with x64 enabled). `docs/types.md` has the whole table,
//! rendered from [`result_type`] by `tests/promotion.rs`.

use std::panic::Location;

use tessera_ir::{BinaryOp, DType, Data, Literal, Shape, TensorType, bf16, f16};

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;

/// A node of the promotion lattice: a dtype, or a weak kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Bool,
    WeakInt,
    U32,
    I32,
    I64,
    WeakFloat,
    BF16,
    F16,
    F32,
    F64,
}

const NODES: [Node; 10] = [
    Node::Bool,
    Node::WeakInt,
    Node::U32,
    Node::I32,
    Node::I64,
    Node::WeakFloat,
    Node::BF16,
    Node::F16,
    Node::F32,
    Node::F64,
];

impl Node {
    fn of(dtype: DType, weak: bool) -> Node {
        match (dtype, weak) {
            (DType::Bool, _) => Node::Bool,
            (DType::I32 | DType::U32 | DType::I64, true) => Node::WeakInt,
            (DType::F32 | DType::F64 | DType::F16 | DType::BF16, true) => Node::WeakFloat,
            (DType::U32, false) => Node::U32,
            (DType::I32, false) => Node::I32,
            (DType::I64, false) => Node::I64,
            (DType::F32, false) => Node::F32,
            (DType::F64, false) => Node::F64,
            (DType::F16, false) => Node::F16,
            (DType::BF16, false) => Node::BF16,
        }
    }

    /// The types immediately above this one (JAX's `_type_promotion_lattice`, standard mode;
    /// the 8- and 16-bit types and u64, which Tessera lacks, are skipped over).
    fn above(self, x64: bool) -> &'static [Node] {
        match self {
            Node::Bool => &[Node::WeakInt],
            Node::WeakInt => &[Node::U32, Node::I32],
            // With x64, u32 and i32 meet at i64; without, i64 is i32 (JAX's x32 mode).
            Node::U32 => {
                if x64 {
                    &[Node::I64]
                } else {
                    &[Node::I32]
                }
            }
            Node::I32 => &[Node::I64],
            Node::I64 => &[Node::WeakFloat],
            Node::WeakFloat => &[Node::BF16, Node::F16],
            Node::BF16 | Node::F16 => &[Node::F32],
            Node::F32 => &[Node::F64],
            Node::F64 => &[],
        }
    }

    /// Every type at or above this one.
    fn upper_bounds(self, x64: bool) -> Vec<Node> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            for &n in out[i].above(x64) {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
            i += 1;
        }
        out
    }

    fn is_weak(self) -> bool {
        matches!(self, Node::WeakInt | Node::WeakFloat)
    }

    /// The dtype of a strong node; a weak node's is decided by `default_dtype`.
    fn dtype(self) -> DType {
        match self {
            Node::Bool => DType::Bool,
            Node::U32 => DType::U32,
            Node::I32 | Node::WeakInt => DType::I32,
            Node::I64 => DType::I64,
            Node::F32 | Node::WeakFloat => DType::F32,
            Node::F16 => DType::F16,
            Node::BF16 => DType::BF16,
            Node::F64 => DType::F64,
        }
    }
}

/// The least upper bound of `nodes` on the lattice.
fn least_upper_bound(nodes: &[Node], x64: bool) -> Node {
    let common: Vec<Node> = NODES
        .into_iter()
        .filter(|c| nodes.iter().all(|n| n.upper_bounds(x64).contains(c)))
        .collect();
    // The lattice has a top (f64), so `common` is never empty, and its least element is the
    // one every other common bound is above.
    common
        .iter()
        .copied()
        .find(|c| {
            let ub = c.upper_bounds(x64);
            common.iter().all(|d| ub.contains(d))
        })
        .expect("the promotion lattice is a lattice: every set of nodes has a least upper bound")
}

/// The default dtype of a kind (JAX's `default_types`): i32/f32, or i64/f64 with x64.
fn default_dtype(dtype: DType, x64: bool) -> DType {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            if x64 {
                DType::F64
            } else {
                DType::F32
            }
        }
        DType::I32 | DType::I64 => {
            if x64 {
                DType::I64
            } else {
                DType::I32
            }
        }
        DType::U32 => DType::U32,
        DType::Bool => DType::Bool,
    }
}

/// The promoted type of operands `(dtype, weak)`, and whether it is weak: JAX's
/// `dtypes.result_type(..., return_weak_type_flag=True)` with x64 on exactly when an operand
/// is 64-bit. A weak bool is a bool (JAX has no weak bool). Panics on no operands.
pub fn result_type(operands: &[(DType, bool)]) -> (DType, bool) {
    assert!(!operands.is_empty(), "result_type of no operands");
    let x64 = operands.iter().any(|(d, _)| d.bit_width() == 64);
    let first = operands[0].0;
    let (dtype, weak) = if operands.len() == 1 {
        operands[0]
    } else if operands.iter().all(|(d, _)| *d == first) && !operands.iter().all(|(_, w)| *w) {
        (first, false)
    } else if operands.iter().all(|(_, w)| *w) {
        // All weak: the bound of their strong counterparts, weak.
        let nodes: Vec<Node> = operands.iter().map(|&(d, _)| Node::of(d, false)).collect();
        (least_upper_bound(&nodes, x64).dtype(), true)
    } else {
        let nodes: Vec<Node> = operands.iter().map(|&(d, w)| Node::of(d, w)).collect();
        let n = least_upper_bound(&nodes, x64);
        (n.dtype(), n.is_weak())
    };
    let weak = weak && dtype != DType::Bool;
    if weak {
        (default_dtype(dtype, x64), true)
    } else {
        (dtype, false)
    }
}

/// The op JAX applies for `op` on bools: `+` and `maximum` are logical or, `*` and `minimum`
/// logical and (as `jnp.add`, `jnp.multiply` on bool arrays); the others are unchanged (and
/// rejected by the IR's type rule when they do not apply to bool: `-`, `/`, `%`).
pub(crate) fn bool_op(op: BinaryOp, dtype: DType) -> BinaryOp {
    if dtype != DType::Bool {
        return op;
    }
    match op {
        BinaryOp::Add | BinaryOp::Max => BinaryOp::Or,
        BinaryOp::Mul | BinaryOp::Min => BinaryOp::And,
        BinaryOp::Sub
        | BinaryOp::Div
        | BinaryOp::Rem
        | BinaryOp::Pow
        | BinaryOp::Atan2
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => op,
    }
}

/// A Rust number as it enters an op: an integer, a float or a bool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// Any Rust integer (`i8` to `u64`, `isize`, `usize`), exactly.
    Int(i128),
    /// An `f32` or `f64`, widened to f64.
    Float(f64),
    /// A `bool`.
    Bool(bool),
}

impl Number {
    /// The (dtype, weak) it promotes as: an integer is a weak int and a float a weak float (as
    /// Python's in JAX); a bool is a strong bool.
    pub fn promotes_as(self) -> (DType, bool) {
        match self {
            Number::Int(_) => (DType::I32, true),
            Number::Float(_) => (DType::F32, true),
            Number::Bool(_) => (DType::Bool, false),
        }
    }

    /// This number as one element of `dtype`, or a message when it does not fit: an integer
    /// outside the range of an integer dtype (never a silent wrap), a float as an integer or
    /// bool, an integer as a bool (even 0 or 1: only a bool makes a bool). A float dtype takes
    /// any number, rounded to nearest.
    pub fn to_data(self, dtype: DType) -> Result<Data, String> {
        let unfit = || format!("the Rust number {self} does not fit {dtype}");
        Ok(match (dtype, self) {
            (DType::F32, Number::Int(i)) => Data::F32(vec![i as f32]),
            (DType::F32, Number::Float(x)) => Data::F32(vec![x as f32]),
            (DType::F32, Number::Bool(b)) => Data::F32(vec![b as u8 as f32]),
            (DType::F64, Number::Int(i)) => Data::F64(vec![i as f64]),
            (DType::F64, Number::Float(x)) => Data::F64(vec![x]),
            (DType::F64, Number::Bool(b)) => Data::F64(vec![b as u8 as f64]),
            (DType::I32, Number::Int(i)) => Data::I32(vec![i32::try_from(i).map_err(|_| unfit())?]),
            (DType::I32, Number::Bool(b)) => Data::I32(vec![b as i32]),
            (DType::U32, Number::Int(i)) => Data::U32(vec![u32::try_from(i).map_err(|_| unfit())?]),
            (DType::U32, Number::Bool(b)) => Data::U32(vec![b as u32]),
            (DType::Bool, Number::Bool(b)) => Data::Bool(vec![b]),
            (DType::I64, Number::Int(i)) => Data::I64(vec![i64::try_from(i).map_err(|_| unfit())?]),
            (DType::I64, Number::Bool(b)) => Data::I64(vec![b as i64]),
            // Integers through f32, as `convert` takes them to a narrow float.
            (DType::F16, Number::Int(i)) => Data::F16(vec![f16::from_f32(i as f32)]),
            (DType::F16, Number::Float(x)) => Data::F16(vec![f16::from_f64(x)]),
            (DType::F16, Number::Bool(b)) => Data::F16(vec![f16::from_f32(b as u8 as f32)]),
            (DType::BF16, Number::Int(i)) => Data::BF16(vec![bf16::from_f32(i as f32)]),
            (DType::BF16, Number::Float(x)) => Data::BF16(vec![bf16::from_f64(x)]),
            (DType::BF16, Number::Bool(b)) => Data::BF16(vec![bf16::from_f32(b as u8 as f32)]),
            (DType::I32 | DType::U32 | DType::I64 | DType::Bool, Number::Float(_))
            | (DType::Bool, Number::Int(_)) => return Err(unfit()),
        })
    }
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => write!(f, "{x:?}"),
            Number::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A Rust scalar type usable as an operand of `Tensor`'s operators and as `Tensor::scalar_of`.
pub trait Scalar: Copy {
    /// This value as a [`Number`].
    fn number(self) -> Number;
}

macro_rules! scalar_ints {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            fn number(self) -> Number {
                Number::Int(self as i128)
            }
        }
    )*};
}
scalar_ints!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl Scalar for f32 {
    fn number(self) -> Number {
        Number::Float(self as f64)
    }
}

impl Scalar for f16 {
    fn number(self) -> Number {
        Number::Float(self.to_f64())
    }
}

impl Scalar for bf16 {
    fn number(self) -> Number {
        Number::Float(self.to_f64())
    }
}

impl Scalar for f64 {
    fn number(self) -> Number {
        Number::Float(self)
    }
}

impl Scalar for bool {
    fn number(self) -> Number {
        Number::Bool(self)
    }
}

impl Tensor {
    /// Whether this tensor is weakly typed (it takes the type of a strongly typed operand it
    /// meets in an op, as a Python scalar does in JAX).
    pub fn is_weak(&self) -> bool {
        self.weak
    }

    /// This tensor with the weak flag set or cleared (same values and dtype).
    pub fn with_weak(&self, weak: bool) -> Tensor {
        let mut t = self.clone();
        t.weak = weak;
        t
    }

    /// A strongly typed scalar of `dtype` holding `x` (`jnp.asarray(x, dtype)`); an error
    /// naming the caller when `x` does not fit `dtype` (an integer out of range, a float as an
    /// integer).
    #[track_caller]
    pub fn scalar_of(x: impl Scalar, dtype: DType) -> Tensor {
        Tensor::number_of("scalar_of", x.number(), dtype, false)
    }

    /// `n` as a scalar of `dtype`, weak or not; raises naming `op` and the caller's line.
    #[track_caller]
    pub(crate) fn number_of(op: &str, n: Number, dtype: DType, weak: bool) -> Tensor {
        match n.to_data(dtype) {
            Ok(data) => Tensor::from_literal(Literal {
                ty: TensorType::new(dtype, Shape::scalar()),
                data,
            })
            .with_weak(weak),
            Err(message) => raise(Error::Op {
                op: op.into(),
                message,
                location: loc_text(Location::caller()),
            }),
        }
    }

    /// The Rust number `x` as an operand of `op` with this tensor: a scalar of the type the two
    /// promote to, weak as the number is. An integer that does not fit that type (`-1` with a
    /// u32 tensor, `1 << 40` with an i32 one) is an error, never a silent wrap.
    #[track_caller]
    pub(crate) fn number_operand(&self, op: &str, x: Number) -> Tensor {
        let (dtype, _) = result_type(&[(self.dtype(), self.weak), x.promotes_as()]);
        match x.to_data(dtype) {
            Ok(data) => Tensor::from_literal(Literal {
                ty: TensorType::new(dtype, Shape::scalar()),
                data,
            })
            .with_weak(x.promotes_as().1),
            Err(message) => raise(Error::Op {
                op: op.into(),
                message: format!(
                    "{message}, the type it promotes to with the operand of type {}{}: convert \
                     the tensor first, e.g. `.astype(DType::F32)`",
                    self.ty(),
                    if self.weak { " (weak)" } else { "" }
                ),
                location: loc_text(Location::caller()),
            }),
        }
    }

    /// The operands converted to their promoted type (`result_type`), and whether the result
    /// of an op on them is weak.
    #[track_caller]
    pub(crate) fn promote(operands: &[&Tensor]) -> (Vec<Tensor>, DType, bool) {
        let types: Vec<(DType, bool)> = operands.iter().map(|t| (t.dtype(), t.weak)).collect();
        let (dtype, weak) = result_type(&types);
        let out = operands.iter().map(|t| t.astype(dtype)).collect();
        (out, dtype, weak)
    }
}
