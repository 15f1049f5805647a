//! Element types, shapes and tensor types: the static type of every IR value.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    I32,
    U32,
    Bool,
    /// 64-bit signed integers.
    I64,
    /// IEEE binary16. Stored in 16 bits; every op but `convert` computes in f32 and rounds its
    /// result back (as XLA:CPU does), see `docs/types.md`.
    F16,
    /// bfloat16 (f32's exponent, 8 significant bits), stored and computed as f16 is.
    BF16,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::U32,
        DType::Bool,
        DType::I64,
        DType::F16,
        DType::BF16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// f16 and bf16: stored narrow, computed in f32 ([`DType::compute_type`]).
    pub fn is_narrow_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The type an op on this type computes in: f32 for f16 and bf16, the type itself
    /// otherwise.
    pub fn compute_type(self) -> DType {
        if self.is_narrow_float() {
            DType::F32
        } else {
            self
        }
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32 | DType::I64)
    }

    pub fn is_signed(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::F16 | DType::BF16
        )
    }

    /// Numbers that arithmetic applies to: every type but bool.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// Width in bits of one element as stored in memory (bool is one byte).
    pub fn bit_width(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F64 | DType::I64 => 64,
            DType::F16 | DType::BF16 => 16,
            DType::Bool => 8,
        }
    }

    pub fn byte_width(self) -> usize {
        self.bit_width() / 8
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dimensions of a shape: up to rank 4 inline, so cloning a type allocates nothing.
pub type Dims = smallvec::SmallVec<[usize; 4]>;

/// The dimensions of a tensor, outermost first. A scalar has no dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Shape(pub Dims);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(Dims::from_slice(&dims.into()))
    }

    pub fn scalar() -> Shape {
        Shape(Dims::new())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of elements; 1 for a scalar. Saturates at `usize::MAX` when the product
    /// overflows (which a checked type never does: see [`TensorType::check_size`]), so an
    /// overflowing shape can never pass for a small one; a shape with a 0 dim has 0 elements.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, `None` when the product overflows `usize` (a shape with a 0 dim
    /// has 0 elements whatever its other dims).
    pub fn checked_numel(&self) -> Option<usize> {
        if self.0.contains(&0) {
            return Some(0);
        }
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.rank()];
        for i in (0..self.rank().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Shape {
        Shape(Dims::from_slice(&v))
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Shape {
        Shape(Dims::from_slice(v))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Shape {
        Shape(Dims::from_slice(&v))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// The static type of an IR value: element type and shape, printed `f32[256,10]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    /// The type of a region op's own node: a zero-size `bool[0]` that holds no data; the
    /// region's results are read by `get_result` nodes.
    pub fn token() -> TensorType {
        TensorType::new(DType::Bool, vec![0])
    }

    /// Whether this is [`TensorType::token`]'s type.
    pub fn is_token(&self) -> bool {
        self.dtype == DType::Bool && self.shape.dims() == [0]
    }

    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, Shape::scalar())
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType::new(dtype, self.shape.clone())
    }

    /// Bytes of one row-major buffer of this type (saturating, like [`Shape::numel`]).
    pub fn byte_size(&self) -> usize {
        self.checked_byte_size().unwrap_or(usize::MAX)
    }

    /// Bytes of one row-major buffer, `None` when the count overflows `usize`.
    pub fn checked_byte_size(&self) -> Option<usize> {
        self.shape
            .checked_numel()?
            .checked_mul(self.dtype.byte_width())
    }

    /// Checks the size limit of one tensor: its byte size (so also its element count) is at
    /// most [`MAX_TENSOR_BYTES`]. Every place that builds a type from user input (the tensor
    /// API, the type rules, the parser, the verifier) calls this, so element counts, linear
    /// indices and byte offsets of a checked type never overflow `i64`/`isize`.
    ///
    /// A 0 dim counts as 1 here, so `f32[0,1<<62,1<<62]` is rejected too: the strides of a
    /// checked type never overflow, whatever its element count.
    pub fn check_size(&self) -> Result<(), String> {
        let spanned = self
            .dims()
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d.max(1)))
            .and_then(|n| n.checked_mul(self.dtype.byte_width()));
        match spanned {
            Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
            Some(b) if self.numel() > 0 => Err(format!(
                "{self} needs {b} bytes, more than the limit of {MAX_TENSOR_BYTES} bytes for one \
                 tensor"
            )),
            Some(_) | None => Err(format!(
                "the dims of {self} overflow: their product (0 counted as 1) in bytes is over \
                 the limit of {MAX_TENSOR_BYTES} bytes for one tensor"
            )),
        }
    }
}

/// The largest byte size of one tensor: `isize::MAX`, Rust's limit for one allocation. Element
/// counts are therefore below it too, and fit `i64` and `isize`.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize;

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
