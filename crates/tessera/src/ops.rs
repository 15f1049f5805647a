//! The ops of `Tensor`: one method per primitive, NumPy-style broadcasting lowered to explicit
//! `broadcast_in_dim` (as `jax.numpy` does over `lax`), composites built from primitives
//! (`matmul`, `mean`, `softmax`, ...), and the arithmetic operators.
//!
//! Every method is `#[track_caller]`, so the location recorded in the IR and named in errors is
//! the user's line.

use std::ops::{
    Add, AddAssign, BitAnd, BitAndAssign, BitOr, BitOrAssign, BitXor, BitXorAssign, Div, DivAssign,
    Mul, MulAssign, Neg, Not, Rem, RemAssign, Sub, SubAssign,
};
use std::panic::Location;

use tessera_ir::{
    BinaryOp, CompareOp, DType, DotDims, Literal, Op, ReduceKind, Shape, TensorType, UnaryOp,
};

use crate::axis::{Axis, AxisList};
use crate::error::{Error, loc_text, raise};
use crate::promote::Scalar;
use crate::tensor::Tensor;
use crate::trace::{apply, join};

#[track_caller]
fn shape_error(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// NumPy's broadcasting of two shapes: aligned at the right, each pair equal or one of them 1.
#[track_caller]
pub fn broadcast_shapes(op: &str, a: &Tensor, b: &Tensor) -> Vec<usize> {
    let (x, y) = (a.shape(), b.shape());
    let n = x.len().max(y.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    // A loop, not an iterator: the error must be raised from this `#[track_caller]` frame so
    // that it names the user's line (a closure would name this file).
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(match (dim(x, i), dim(y, i)) {
            (p, q) if p == q || q == 1 => p,
            (1, q) => q,
            _ => shape_error(
                op,
                format!(
                    "shapes {} and {} cannot broadcast together (operands: {}, {})",
                    Shape::new(x.to_vec()),
                    Shape::new(y.to_vec()),
                    a.ty(),
                    b.ty()
                ),
            ),
        });
    }
    out
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` (the `", stringify!($op), "` primitive).")]
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    apply(Op::Unary(UnaryOp::$op), &[self])
                }
            )*
        }
    };
}

unary_methods! {
    abs => Abs, sign => Sign, exp => Exp, log => Log, log1p => Log1p, expm1 => Expm1,
    tanh => Tanh, logistic => Logistic, sin => Sin, cos => Cos, sqrt => Sqrt, rsqrt => Rsqrt,
    floor => Floor, ceil => Ceil, round => Round, erf => Erf, erf_inv => ErfInv,
}

macro_rules! binary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` with JAX's type promotion and NumPy broadcasting (the `", stringify!($op), "` primitive).")]
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Tensor {
                    self.binary(BinaryOp::$op, other)
                }
            )*
        }
    };
}

binary_methods! {
    add => Add, sub => Sub, mul => Mul, rem => Rem, maximum => Max, minimum => Min,
    pow => Pow, bitand => And, bitor => Or, bitxor => Xor, shift_left => ShiftLeft,
    shift_right_logical => ShiftRightLogical,
}

macro_rules! compare_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise comparison `", stringify!($name), "` with type promotion and broadcasting, giving bool.")]
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Tensor {
                    let (p, _, _) = Tensor::promote(&[self, other]);
                    let (a, b) = p[0].broadcast_pair(CompareOp::$op.name(), &p[1]);
                    apply(Op::Compare(CompareOp::$op), &[&a, &b])
                }
            )*
        }
    };
}

compare_methods! { eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge }

impl Tensor {
    /// Both operands joined into one trace and broadcast to their common shape.
    #[track_caller]
    fn broadcast_pair(&self, op: &str, other: &Tensor) -> (Tensor, Tensor) {
        let shape = broadcast_shapes(op, self, other);
        let joined = join(&[self, other]);
        (
            joined[0].broadcast_to(&shape),
            joined[1].broadcast_to(&shape),
        )
    }

    /// `op` on both operands promoted to their common type (`promote::result_type`) and
    /// broadcast; the result is weak when both operands are.
    #[track_caller]
    fn binary(&self, op: BinaryOp, other: &Tensor) -> Tensor {
        let (p, dtype, weak) = Tensor::promote(&[self, other]);
        let op = crate::promote::bool_op(op, dtype);
        let (a, b) = p[0].broadcast_pair(op.name(), &p[1]);
        apply(Op::Binary(op), &[&a, &b]).with_weak(weak)
    }

    /// True division, as `jnp.true_divide`: the operands are promoted, and integer or bool ones
    /// are divided as floats (`i32 / i32` is f32; an f64 operand makes it f64). `floor_divide`
    /// and `rem` are the integer divisions.
    #[track_caller]
    pub fn div(&self, other: &Tensor) -> Tensor {
        let (p, dtype, weak) = Tensor::promote(&[self, other]);
        let float = if dtype.is_float() {
            dtype
        } else if dtype.bit_width() == 64 {
            DType::F64
        } else {
            DType::F32
        };
        let (a, b) = p[0]
            .astype(float)
            .broadcast_pair("div", &p[1].astype(float));
        apply(Op::Binary(BinaryOp::Div), &[&a, &b]).with_weak(weak)
    }

    /// `floor(x / y)` as `jnp.floor_divide`: for integers the quotient rounded toward negative
    /// infinity (`-7 // 2 == -4`; division by zero gives what the `div` primitive gives), for
    /// floats `floor` of the true quotient. Operands are promoted first.
    #[track_caller]
    pub fn floor_divide(&self, other: &Tensor) -> Tensor {
        let (p, dtype, weak) = Tensor::promote(&[self, other]);
        let (a, b) = p[0].broadcast_pair("floor_divide", &p[1]);
        let q = apply(Op::Binary(BinaryOp::Div), &[&a, &b]);
        let out = if dtype.is_float() {
            q.floor()
        } else if dtype.is_signed() {
            // Truncation rounds toward zero; step down when the remainder is non-zero and its
            // sign differs from the divisor's.
            let zero = a.scalar_like(0.0);
            let r = apply(Op::Binary(BinaryOp::Rem), &[&a, &b]);
            let fix = r.ne(&zero).bitand(&r.lt(&zero).ne(&b.lt(&zero)));
            Tensor::select(&fix, &Tensor::sub(&q, &q.scalar_like(1.0)), &q)
        } else {
            q
        };
        out.with_weak(weak)
    }

    /// A scalar of this tensor's dtype, weakly typed (as JAX treats a Python number). For an
    /// integer or bool tensor, a number the dtype cannot hold exactly (0.5, -1 for u32) is an
    /// error, never a silent truncation or wrap (the operators promote instead: `&i32s * 0.5`
    /// is f32).
    #[track_caller]
    pub fn scalar_like(&self, x: f64) -> Tensor {
        let dtype = self.dtype();
        let held = Literal::splat(&TensorType::new(dtype, Shape::scalar()), x);
        if !dtype.is_float() && held.data.get_f64(0) != x {
            raise(Error::Op {
                op: "scalar".into(),
                message: format!(
                    "the Rust number {x} used with a tensor of type {} is not a {dtype} value: \
                     convert the tensor first, e.g. `.astype(DType::F32)` (Tessera does not \
                     truncate silently)",
                    self.ty()
                ),
                location: loc_text(Location::caller()),
            });
        }
        Tensor::from_literal(held).with_weak(true)
    }

    /// `-x`; weak stays weak.
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        apply(Op::Unary(UnaryOp::Neg), &[self]).with_weak(self.weak)
    }

    /// Bitwise not (logical not for bool); weak stays weak.
    #[track_caller]
    pub fn not(&self) -> Tensor {
        apply(Op::Unary(UnaryOp::Not), &[self]).with_weak(self.weak)
    }

    /// `select(pred, on_true, on_false)` (`jnp.where`) with `on_true` and `on_false` promoted
    /// to their common type and all three broadcast.
    #[track_caller]
    pub fn select(pred: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Tensor {
        let (p, _, weak) = Tensor::promote(&[on_true, on_false]);
        let (on_true, on_false) = (&p[0], &p[1]);
        let s1 = broadcast_shapes("select", on_true, on_false);
        let shape = broadcast_shapes(
            "select",
            pred,
            &Tensor::full_dtype(s1.clone(), 0.0, DType::Bool),
        );
        let j = join(&[pred, on_true, on_false]);
        let (p, t, f) = (
            j[0].broadcast_to(&shape),
            j[1].broadcast_to(&shape),
            j[2].broadcast_to(&shape),
        );
        apply(Op::Select, &[&p, &t, &f]).with_weak(weak)
    }

    /// Converts the values to another dtype (the `convert` primitive).
    #[track_caller]
    pub fn astype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        apply(Op::Convert(dtype), &[self])
    }

    /// Reinterprets the bits as another dtype of the same width.
    #[track_caller]
    pub fn bitcast(&self, dtype: DType) -> Tensor {
        apply(Op::Bitcast(dtype), &[self])
    }

    /// The `broadcast_in_dim` primitive: operand dim `i` becomes result dim `dims[i]`.
    #[track_caller]
    pub fn broadcast_in_dim(&self, shape: impl Into<Shape>, dims: &[usize]) -> Tensor {
        apply(
            Op::BroadcastInDim {
                shape: shape.into(),
                dims: dims.to_vec(),
            },
            &[self],
        )
    }

    /// NumPy broadcasting to `shape`; no op when the shape already matches.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Tensor {
        if self.shape() == shape {
            return self.clone();
        }
        if self.rank() > shape.len() {
            shape_error(
                "broadcast_in_dim",
                format!(
                    "cannot broadcast {} to fewer dims {}",
                    self.ty(),
                    Shape::new(shape.to_vec())
                ),
            );
        }
        let offset = shape.len() - self.rank();
        let dims: Vec<usize> = (offset..shape.len()).collect();
        self.broadcast_in_dim(shape.to_vec(), &dims)
    }

    /// Reshape; one dimension may be `usize::MAX` (NumPy's `-1`) to be inferred.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Tensor {
        let mut shape = shape.into();
        if let Some(i) = shape.0.iter().position(|&d| d == usize::MAX) {
            let known = shape
                .0
                .iter()
                .filter(|&&d| d != usize::MAX)
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .unwrap_or(0);
            if known == 0 || !self.numel().is_multiple_of(known) {
                shape_error(
                    "reshape",
                    format!("cannot infer a dim of {shape:?} for {}", self.ty()),
                );
            }
            shape.0[i] = self.numel() / known;
        }
        if shape.dims() == self.shape() {
            return self.clone();
        }
        apply(Op::Reshape(shape), &[self])
    }

    /// Result dim `i` is operand dim `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        apply(Op::Transpose(perm.to_vec()), &[self])
    }

    /// Reverses the dimensions (a matrix transpose for rank 2).
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let perm: Vec<usize> = (0..self.rank()).rev().collect();
        self.transpose(&perm)
    }

    /// `start..limit` in every dim, unit stride.
    #[track_caller]
    pub fn slice(&self, start: &[usize], limit: &[usize]) -> Tensor {
        self.slice_strided(start, limit, &vec![1; start.len()])
    }

    /// `start..limit` in every dim, taking every `stride`-th element (`lax.slice` with
    /// strides; one entry per dim in each). Out-of-range bounds fail the op's type rule.
    #[track_caller]
    pub fn slice_strided(&self, start: &[usize], limit: &[usize], stride: &[usize]) -> Tensor {
        apply(
            Op::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
                stride: stride.to_vec(),
            },
            &[self],
        )
    }

    /// Joins tensors along `dim`.
    #[track_caller]
    pub fn concatenate(tensors: &[&Tensor], dim: usize) -> Tensor {
        let joined = join(tensors);
        let refs: Vec<&Tensor> = joined.iter().collect();
        apply(Op::Concatenate { dim }, &refs)
    }

    /// Pads with the scalar `value`; negative `low`/`high` crop, `interior` inserts between.
    #[track_caller]
    pub fn pad(&self, value: &Tensor, low: &[i64], high: &[i64], interior: &[usize]) -> Tensor {
        apply(
            Op::Pad {
                low: low.to_vec(),
                high: high.to_vec(),
                interior: interior.to_vec(),
            },
            &[self, value],
        )
    }

    /// `reduce_<kind>` over resolved `axes`, then, with `keep`, those axes back as size-1 dims.
    #[track_caller]
    fn reduce(&self, kind: ReduceKind, op: &str, axes: impl Into<AxisList>) -> Tensor {
        let (axes, keep) = self.resolve_axes(op, axes);
        let r = apply(
            Op::Reduce {
                kind,
                axes: axes.clone(),
            },
            &[self],
        );
        if keep { self.keep_axes(&r, &axes) } else { r }
    }

    /// `reduced` (this tensor reduced over `axes`) reshaped with those axes as size-1 dims.
    #[track_caller]
    pub(crate) fn keep_axes(&self, reduced: &Tensor, axes: &[usize]) -> Tensor {
        let shape: Vec<usize> = (0..self.rank())
            .map(|d| {
                if axes.contains(&d) {
                    1
                } else {
                    self.shape()[d]
                }
            })
            .collect();
        reduced.reshape(shape)
    }

    /// Sum over `axes` (the `reduce_sum` primitive): `-1`, `[0, 2]`, `keepdims(-1)`.
    #[track_caller]
    pub fn sum_axes(&self, axes: impl Into<AxisList>) -> Tensor {
        self.reduce(ReduceKind::Sum, "reduce_sum", axes)
    }

    /// Maximum over `axes` (`reduce_max`).
    #[track_caller]
    pub fn max_axes(&self, axes: impl Into<AxisList>) -> Tensor {
        self.reduce(ReduceKind::Max, "reduce_max", axes)
    }

    /// Minimum over `axes` (`reduce_min`).
    #[track_caller]
    pub fn min_axes(&self, axes: impl Into<AxisList>) -> Tensor {
        self.reduce(ReduceKind::Min, "reduce_min", axes)
    }

    /// Sum of every element.
    #[track_caller]
    pub fn sum(&self) -> Tensor {
        self.sum_axes(AxisList::all())
    }

    /// Maximum of every element.
    #[track_caller]
    pub fn max(&self) -> Tensor {
        self.max_axes(AxisList::all())
    }

    /// Minimum of every element.
    #[track_caller]
    pub fn min(&self) -> Tensor {
        self.min_axes(AxisList::all())
    }

    /// Mean over `axes`: the sum divided by the count, as `jnp.mean`.
    #[track_caller]
    pub fn mean_axes(&self, axes: impl Into<AxisList>) -> Tensor {
        // JAX: the mean of an integer or bool tensor is f32 (not a truncated integer).
        if !self.dtype().is_float() {
            return self.astype(DType::F32).mean_axes(axes);
        }
        let list = axes.into();
        let (resolved, _) = self.resolve_axes("mean", list.clone());
        let count: usize = resolved.iter().map(|&a| self.shape()[a]).product();
        let s = self.sum_axes(list);
        let n = s.scalar_like(count as f64);
        s.div(&n)
    }

    /// Mean of every element.
    #[track_caller]
    pub fn mean(&self) -> Tensor {
        self.mean_axes(AxisList::all())
    }

    /// Index of the first maximum along `axis`, as i32.
    #[track_caller]
    pub fn argmax(&self, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("argmax", axis);
        apply(Op::ArgMax { axis }, &[self])
    }

    /// The `dot_general` primitive.
    #[track_caller]
    pub fn dot_general(&self, rhs: &Tensor, dims: DotDims) -> Tensor {
        let out = apply(Op::DotGeneral(dims.clone()), &[self, rhs]);
        crate::sharding::check_reduced(&out, self, rhs, &dims);
        out
    }

    /// `x * x`.
    #[track_caller]
    pub fn square(&self) -> Tensor {
        self.mul(self)
    }

    /// `max(x, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        self.maximum(&self.scalar_like(0.0))
    }

    /// The logistic function `1 / (1 + exp(-x))`.
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        self.logistic()
    }

    /// `reduced` (this tensor reduced over `axis`) broadcast back to this tensor's shape.
    #[track_caller]
    fn keep_dims(&self, reduced: &Tensor, axis: usize) -> Tensor {
        let dims: Vec<usize> = (0..self.rank()).filter(|&d| d != axis).collect();
        reduced.broadcast_in_dim(self.shape().to_vec(), &dims)
    }

    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    #[track_caller]
    pub fn softmax(&self, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("softmax", axis);
        let shifted = self.sub(&self.keep_dims(&self.max_axes(axis), axis));
        let e = shifted.exp();
        Tensor::div(&e, &self.keep_dims(&e.sum_axes(axis), axis))
    }

    /// `log(sum(exp(x)))` along `axis`, computed stably.
    #[track_caller]
    pub fn logsumexp(&self, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("logsumexp", axis);
        let m = self.max_axes(axis);
        let s = self.sub(&self.keep_dims(&m, axis)).exp().sum_axes(axis);
        m.add(&s.log())
    }

    /// `x - logsumexp(x)` along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, axis: impl Into<Axis>) -> Tensor {
        let axis = self.resolve_axis("log_softmax", axis);
        self.sub(&self.keep_dims(&self.logsumexp(axis), axis))
    }
}

/// The operators of `Tensor`/`&Tensor` with each other, with any Rust scalar on the right and
/// the scalars `$s` on the left (weakly typed, promoted with the tensor as `promote.rs` says),
/// and the compound assignment `$assign` (`x += 1` makes `x` the promoted result). A number on
/// the left is one of several impls, so `(2 * &x).sum()` needs a typed literal (`2i32`);
/// `let y: Tensor = 2 * &x;` does not.
macro_rules! operator {
    ($trait:ident, $method:ident, $assign_trait:ident, $assign:ident, [$($s:ty),*]) => {
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
        impl $assign_trait<Tensor> for Tensor {
            #[track_caller]
            fn $assign(&mut self, rhs: Tensor) {
                *self = Tensor::$method(self, &rhs);
            }
        }
        impl $assign_trait<&Tensor> for Tensor {
            #[track_caller]
            fn $assign(&mut self, rhs: &Tensor) {
                *self = Tensor::$method(self, rhs);
            }
        }
        // One generic impl per receiver for a scalar on the right, so that `(&x * 2).sum()`
        // type-checks (an integer literal is inferred, i32 by default, after the call).
        impl<S: Scalar> $trait<S> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: S) -> Tensor {
                let n = self.number_operand(stringify!($method), rhs.number());
                Tensor::$method(&self, &n)
            }
        }
        impl<S: Scalar> $trait<S> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: S) -> Tensor {
                Tensor::$method(self, &self.number_operand(stringify!($method), rhs.number()))
            }
        }
        impl<S: Scalar> $assign_trait<S> for Tensor {
            #[track_caller]
            fn $assign(&mut self, rhs: S) {
                let n = self.number_operand(stringify!($method), rhs.number());
                *self = Tensor::$method(self, &n);
            }
        }
        $(
            impl $trait<Tensor> for $s {
                type Output = Tensor;
                #[track_caller]
                fn $method(self, rhs: Tensor) -> Tensor {
                    Tensor::$method(&rhs.number_operand(stringify!($method), self.number()), &rhs)
                }
            }
            impl $trait<&Tensor> for $s {
                type Output = Tensor;
                #[track_caller]
                fn $method(self, rhs: &Tensor) -> Tensor {
                    Tensor::$method(&rhs.number_operand(stringify!($method), self.number()), rhs)
                }
            }
        )*
    };
}

macro_rules! arithmetic {
    ($($trait:ident, $method:ident, $assign_trait:ident, $assign:ident);*) => {$(
        operator!($trait, $method, $assign_trait, $assign,
            [f32, f64, i8, i16, i32, i64, isize, u8, u16, u32, u64, usize]);
    )*};
}

arithmetic! {
    Add, add, AddAssign, add_assign;
    Sub, sub, SubAssign, sub_assign;
    Mul, mul, MulAssign, mul_assign;
    Div, div, DivAssign, div_assign;
    Rem, rem, RemAssign, rem_assign
}

macro_rules! bitwise {
    ($($trait:ident, $method:ident, $assign_trait:ident, $assign:ident);*) => {$(
        operator!($trait, $method, $assign_trait, $assign,
            [bool, i8, i16, i32, i64, isize, u8, u16, u32, u64, usize]);
    )*};
}

bitwise! {
    BitAnd, bitand, BitAndAssign, bitand_assign;
    BitOr, bitor, BitOrAssign, bitor_assign;
    BitXor, bitxor, BitXorAssign, bitxor_assign
}

impl Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        Tensor::not(&self)
    }
}

impl Not for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        Tensor::not(self)
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}
