//! Scalar semantics of the elementwise ops, one function per op and element kind. Integer ops
//! never trap: division by zero gives -1 (all ones) and remainder by zero gives the dividend,
//! as XLA defines them; shifts by the width or more give 0.

use tessera_ir::{BinaryOp, CompareOp, UnaryOp};

/// The float operations the kernels need, for f32 and f64.
pub trait Float:
    Copy + PartialOrd + std::ops::Neg<Output = Self> + std::ops::Add<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    fn is_sign_negative(self) -> bool;
    fn unary(op: UnaryOp, x: Self) -> Self;
    fn binary(op: BinaryOp, x: Self, y: Self) -> Self;
    fn is_nan(self) -> bool;
}

/// `sign`: -1, 0 or 1, keeping the sign of zero and NaN.
fn sign<T: Float>(x: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        -T::ONE
    } else {
        x
    }
}

/// Maximum that propagates NaN, as `lax.max`, with -0 below +0 (`max(-0, +0) = +0` in either
/// order, as XLA on CPU and Cranelift's `fmax`).
pub fn fmax<T: Float>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        x + y
    } else if y > x || (y == x && !y.is_sign_negative()) {
        y
    } else {
        x
    }
}

/// Minimum that propagates NaN, as `lax.min`, with -0 below +0 (`min(-0, +0) = -0`).
pub fn fmin<T: Float>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        x + y
    } else if y < x || (y == x && y.is_sign_negative()) {
        y
    } else {
        x
    }
}

/// `logistic(x)`: with `e = exp(-abs(x))`, `1 / (1 + e)` for `x >= 0` and `e / (1 + e)`
/// below, so that large negative `x` gives `exp(x)` (down into the subnormals), not `1 / inf`.
fn logistic<T: Float>(x: T) -> T {
    let e = T::unary(UnaryOp::Exp, -T::unary(UnaryOp::Abs, x));
    let num = if x >= T::ZERO { T::ONE } else { e };
    T::binary(BinaryOp::Div, num, T::ONE + e)
}

/// f64 `logistic`, for the compiled code's calls.
pub fn logistic_f64(x: f64) -> f64 {
    logistic(x)
}

/// f32 `pow`: f64 `pow` rounded once. It has every C99 Annex F special case (`pow(x, +-0) =
/// 1` even for NaN `x`, `pow(1, y) = 1`, `pow(-1, +-inf) = 1`, `pow(-0, -3) = -inf`,
/// `pow(-inf, 0.5) = +inf`, negative `x` to a non-integer = NaN), keeps subnormals, and is
/// within 0.5 ulp plus f64 `pow`'s own (sub-ulp) error: `pow(f32::MAX, 1) = f32::MAX`.
pub fn pow_f32(x: f32, y: f32) -> f32 {
    (x as f64).powf(y as f64) as f32
}

/// Giles (2010)'s f32 `erf_inv` coefficients for `w < 5`, highest power first, exactly as XLA
/// (and StableHLO's CHLO decomposition) write them.
#[allow(clippy::excessive_precision)]
pub const GILES_LT_5: [f32; 9] = [
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
];

/// Giles (2010)'s coefficients for `w >= 5`.
#[allow(clippy::excessive_precision)]
pub const GILES_GE_5: [f32; 9] = [
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
];

/// Giles (2010) single-precision inverse error function, the approximation XLA uses for f32
/// `erf_inv`, with its Horner steps as fused multiply-adds: it reproduces JAX's f32 values.
pub fn erf_inv_f32(x: f32) -> f32 {
    let (lt_5, ge_5) = (&GILES_LT_5, &GILES_GE_5);
    if x.abs() == 1.0 {
        return x * f32::INFINITY;
    }
    let w = -libm::log1pf(x * -x);
    let (mut w, c) = if w < 5.0 {
        (w - 2.5, lt_5)
    } else {
        (w.sqrt() - 3.0, ge_5)
    };
    if w.is_nan() {
        w = f32::NAN;
    }
    let mut p = c[0];
    for &ci in &c[1..] {
        p = p.mul_add(w, ci);
    }
    p * x
}

/// Inverse error function in f64: Newton's method on `erf`, started from the f32 estimate.
pub fn erf_inv_f64(y: f64) -> f64 {
    if y.is_nan() || y.abs() > 1.0 {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return y * f64::INFINITY;
    }
    let mut x = erf_inv_f32(y as f32) as f64;
    if !x.is_finite() {
        x = y.signum() * 5.9;
    }
    let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
    for _ in 0..4 {
        let err = libm::erf(x) - y;
        let d = two_over_sqrt_pi * (-x * x).exp();
        if d == 0.0 {
            break;
        }
        x -= err / d;
    }
    x
}

macro_rules! impl_float {
    ($t:ty, $erf:path, $erf_inv:path, $pow:path) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn is_sign_negative(self) -> bool {
                <$t>::is_sign_negative(self)
            }
            fn unary(op: UnaryOp, x: Self) -> Self {
                match op {
                    UnaryOp::Neg => -x,
                    UnaryOp::Abs => x.abs(),
                    UnaryOp::Sign => sign(x),
                    UnaryOp::Exp => x.exp(),
                    UnaryOp::Log => x.ln(),
                    UnaryOp::Log1p => x.ln_1p(),
                    UnaryOp::Expm1 => x.exp_m1(),
                    UnaryOp::Tanh => x.tanh(),
                    UnaryOp::Logistic => logistic(x),
                    UnaryOp::Sin => x.sin(),
                    UnaryOp::Cos => x.cos(),
                    UnaryOp::Sqrt => x.sqrt(),
                    UnaryOp::Rsqrt => 1.0 / x.sqrt(),
                    UnaryOp::Floor => x.floor(),
                    UnaryOp::Ceil => x.ceil(),
                    UnaryOp::Round => x.round(),
                    UnaryOp::Erf => $erf(x),
                    UnaryOp::ErfInv => $erf_inv(x),
                    // The type rule admits `not` for integers and bool only.
                    UnaryOp::Not => <$t>::NAN,
                }
            }
            fn binary(op: BinaryOp, x: Self, y: Self) -> Self {
                match op {
                    BinaryOp::Add => x + y,
                    BinaryOp::Sub => x - y,
                    BinaryOp::Mul => x * y,
                    BinaryOp::Div => x / y,
                    BinaryOp::Rem => x % y,
                    BinaryOp::Max => fmax(x, y),
                    BinaryOp::Min => fmin(x, y),
                    BinaryOp::Pow => $pow(x, y),
                    // The type rule admits bit and shift ops for integers and bool only.
                    BinaryOp::And
                    | BinaryOp::Or
                    | BinaryOp::Xor
                    | BinaryOp::ShiftLeft
                    | BinaryOp::ShiftRightLogical => <$t>::NAN,
                }
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

impl_float!(f32, libm::erff, erf_inv_f32, pow_f32);
impl_float!(f64, libm::erf, erf_inv_f64, f64::powf);

/// Integer semantics, for i32 and u32 (shift amounts are read as unsigned).
pub trait Int: Copy + Ord {
    fn unary(op: UnaryOp, x: Self) -> Self;
    fn binary(op: BinaryOp, x: Self, y: Self) -> Self;
}

impl Int for i32 {
    fn unary(op: UnaryOp, x: i32) -> i32 {
        match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Abs => x.wrapping_abs(),
            UnaryOp::Sign => x.signum(),
            UnaryOp::Not => !x,
            // Float-only ops are rejected by the type rule.
            _ => 0,
        }
    }
    fn binary(op: BinaryOp, x: i32, y: i32) -> i32 {
        match op {
            BinaryOp::Add => x.wrapping_add(y),
            BinaryOp::Sub => x.wrapping_sub(y),
            BinaryOp::Mul => x.wrapping_mul(y),
            BinaryOp::Div => {
                if y == 0 {
                    -1
                } else {
                    x.wrapping_div(y)
                }
            }
            BinaryOp::Rem => {
                if y == 0 {
                    x
                } else {
                    x.wrapping_rem(y)
                }
            }
            BinaryOp::Max => x.max(y),
            BinaryOp::Min => x.min(y),
            BinaryOp::And => x & y,
            BinaryOp::Or => x | y,
            BinaryOp::Xor => x ^ y,
            BinaryOp::ShiftLeft => (x as u32).checked_shl(y as u32).unwrap_or(0) as i32,
            BinaryOp::ShiftRightLogical => (x as u32).checked_shr(y as u32).unwrap_or(0) as i32,
            BinaryOp::Pow => 0,
        }
    }
}

impl Int for u32 {
    fn unary(op: UnaryOp, x: u32) -> u32 {
        match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Abs => x,
            UnaryOp::Sign => (x > 0) as u32,
            UnaryOp::Not => !x,
            _ => 0,
        }
    }
    fn binary(op: BinaryOp, x: u32, y: u32) -> u32 {
        match op {
            BinaryOp::Add => x.wrapping_add(y),
            BinaryOp::Sub => x.wrapping_sub(y),
            BinaryOp::Mul => x.wrapping_mul(y),
            BinaryOp::Div => x.checked_div(y).unwrap_or(u32::MAX),
            BinaryOp::Rem => x.checked_rem(y).unwrap_or(x),
            BinaryOp::Max => x.max(y),
            BinaryOp::Min => x.min(y),
            BinaryOp::And => x & y,
            BinaryOp::Or => x | y,
            BinaryOp::Xor => x ^ y,
            BinaryOp::ShiftLeft => x.checked_shl(y).unwrap_or(0),
            BinaryOp::ShiftRightLogical => x.checked_shr(y).unwrap_or(0),
            BinaryOp::Pow => 0,
        }
    }
}

pub fn bool_unary(op: UnaryOp, x: bool) -> bool {
    match op {
        UnaryOp::Not => !x,
        _ => x,
    }
}

pub fn bool_binary(op: BinaryOp, x: bool, y: bool) -> bool {
    match op {
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        _ => false,
    }
}

pub fn compare<T: PartialOrd>(op: CompareOp, x: T, y: T) -> bool {
    match op {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    }
}
