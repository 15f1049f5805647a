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

/// Giles (2010) single-precision inverse error function, exactly as XLA:CPU computes f32
/// `erf_inv` for JAX 0.10.2 on an x86-64 machine with FMA: the sequence of roundings of the
/// machine code XLA emits (`XLA_FLAGS=--xla_dump_to=...` on `jax.random.normal`), every
/// multiply-add the compiler contracted as one fused multiply-add and every other operation
/// rounded on its own, so the result equals JAX's bit for bit.
///
/// `w = -log1p(-x * x)`; `w < 5`: `p = poly_lt5(w - 2.5)`, else `p = poly_ge5(sqrt(w) - 3)`,
/// Horner steps fused; the result is `x * p`, `x * inf` at `|x| == 1`, and a subnormal result
/// is flushed to a zero of its sign, as XLA:CPU's flush-to-zero mode does. `log1p` is XLA's own
/// f32 expansion (`xla_log1p`), not a correctly rounded one.
pub fn erf_inv_f32(x: f32) -> f32 {
    let xx = x * -x;
    let l = xla_log1p(xx);
    let lt_5 = l > -5.0;
    let (w, c) = if lt_5 {
        (-2.5 - l, &GILES_LT_5)
    } else {
        ((-l).sqrt() - 3.0, &GILES_GE_5)
    };
    let mut p = c[0];
    for &ci in &c[1..] {
        p = p.mul_add(w, ci);
    }
    let r = x * if x.abs() == 1.0 { f32::INFINITY } else { p };
    // XLA:CPU runs with denormals flushed to zero: a subnormal result (from a subnormal or
    // tiny `x`) comes out as a zero of its sign.
    if r.is_subnormal() {
        0.0f32.copysign(r)
    } else {
        r
    }
}

/// XLA:CPU's f32 `log1p` (as inlined into `erf_inv`): Cephes' rational approximation
/// `x - x^2/2 + x^3 P(x)/Q(x)` for `|x| < sqrt(2) - 1`, else XLA's f32 `log(1 + x)`
/// (`xla_log`). Constants as the f32 bit patterns in XLA's code.
fn xla_log1p(x: f32) -> f32 {
    const P: [u32; 7] = [
        0x383d_e04b, // 4.527e-5
        0x3eff_40c5,
        0x40d2_84fa,
        0x41ef_4b9c,
        0x4273_cc76,
        0x4264_73ad,
        0x41a0_5101,
    ];
    const Q: [u32; 7] = [
        0x3f80_0000, // 1
        0x4171_01ad,
        0x42a6_185b,
        0x435d_c32d,
        0x439a_8ca3,
        0x4358_6d8a,
        0x4270_7982,
    ];
    if x.abs() < f32::from_bits(0x3ed4_13cd) {
        let horner = |c: &[u32; 7]| {
            c[1..].iter().fold(f32::from_bits(c[0]), |p, &ci| {
                p.mul_add(x, f32::from_bits(ci))
            })
        };
        let ratio = horner(&P) / horner(&Q);
        let x2 = x * x;
        let t = (x * x2) * ratio;
        x + x2.mul_add(-0.5, t)
    } else {
        xla_log(1.0 + x)
    }
}

/// XLA:CPU's f32 `log` (Cephes' `logf`): `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2))`,
/// `log(x) = e ln2 + r - r^2/2 + r^3 poly(r)` with `r = m - 1`, `ln2` split in two parts.
/// `+inf` for `+inf`, `-inf` for 0, the all-ones NaN for negatives and NaN.
fn xla_log(x: f32) -> f32 {
    let h = f32::from_bits;
    if x == f32::INFINITY {
        return x;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x.is_nan() || x < 0.0 {
        return h(0xffff_ffff);
    }
    let v = if x > f32::MIN_POSITIVE {
        x
    } else {
        f32::MIN_POSITIVE
    };
    let bits = v.to_bits();
    let m = h((bits & 0x807f_ffff) | 0x3f00_0000);
    let e = ((bits >> 23) as i32 - 127) as f32;
    let below = m < h(0x3f35_04f3);
    let r = (m - 1.0) + if below { m } else { 0.0 };
    let e = (e + 1.0) - if below { 1.0 } else { 0.0 };
    let r2 = r * r;
    let r3 = r2 * r;
    let a = r
        .mul_add(h(0x3d90_21bb), h(0xbdeb_d1b8))
        .mul_add(r, h(0x3def_251a));
    let b = r
        .mul_add(h(0xbdfe_5d4f), h(0x3e11_e9bf))
        .mul_add(r, h(0xbe2a_ae50));
    let c = r
        .mul_add(h(0x3e4c_ceac), h(0xbe7f_fffc))
        .mul_add(r, h(0x3eaa_aaaa));
    let poly = a.mul_add(r3, b).mul_add(r3, c);
    let tail = poly.mul_add(r3, e * h(0xb95e_8083));
    let sum = r2.mul_add(-0.5, r) + tail;
    e.mul_add(h(0x3f31_8000), sum)
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
    ($t:ty, $erf:path, $erf_inv:path, $pow:path, $libm:path, $atan2:path) => {
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
                    UnaryOp::Tan => $libm(crate::elem::Libm::Tan, x),
                    UnaryOp::Asin => $libm(crate::elem::Libm::Asin, x),
                    UnaryOp::Acos => $libm(crate::elem::Libm::Acos, x),
                    UnaryOp::Atan => $libm(crate::elem::Libm::Atan, x),
                    UnaryOp::Sinh => $libm(crate::elem::Libm::Sinh, x),
                    UnaryOp::Cosh => $libm(crate::elem::Libm::Cosh, x),
                    UnaryOp::Asinh => $libm(crate::elem::Libm::Asinh, x),
                    UnaryOp::Acosh => $libm(crate::elem::Libm::Acosh, x),
                    UnaryOp::Atanh => $libm(crate::elem::Libm::Atanh, x),
                    UnaryOp::Exp2 => $libm(crate::elem::Libm::Exp2, x),
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
                    BinaryOp::Atan2 => $atan2(x, y),
                }
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

impl_float!(
    f32,
    libm::erff,
    erf_inv_f32,
    pow_f32,
    crate::elem::Libm::f32,
    crate::elem::atan2_f32
);
impl_float!(
    f64,
    libm::erf,
    erf_inv_f64,
    f64::powf,
    crate::elem::Libm::f64,
    crate::elem::atan2_f64
);

/// Integer semantics, for i32, i64 and u32 (shift amounts are read as unsigned).
pub trait Int: Copy + Ord {
    fn unary(op: UnaryOp, x: Self) -> Self;
    fn binary(op: BinaryOp, x: Self, y: Self) -> Self;
}

macro_rules! signed_int {
    ($t:ty, $u:ty) => {
        impl Int for $t {
            fn unary(op: UnaryOp, x: $t) -> $t {
                match op {
                    UnaryOp::Neg => x.wrapping_neg(),
                    UnaryOp::Abs => x.wrapping_abs(),
                    UnaryOp::Sign => x.signum(),
                    UnaryOp::Not => !x,
                    // Float-only ops, rejected by the type rule.
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
                    | UnaryOp::Exp2 => 0,
                }
            }
            fn binary(op: BinaryOp, x: $t, y: $t) -> $t {
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
                    // An amount past the width (or negative, read as unsigned) shifts everything out.
                    BinaryOp::ShiftLeft => (x as $u)
                        .checked_shl(u32::try_from(y as $u).unwrap_or(u32::MAX))
                        .unwrap_or(0) as $t,
                    BinaryOp::ShiftRightLogical => (x as $u)
                        .checked_shr(u32::try_from(y as $u).unwrap_or(u32::MAX))
                        .unwrap_or(0) as $t,
                    BinaryOp::Pow | BinaryOp::Atan2 => 0,
                }
            }
        }
    };
}
signed_int!(i32, u32);
signed_int!(i64, u64);

impl Int for u32 {
    fn unary(op: UnaryOp, x: u32) -> u32 {
        match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Abs => x,
            UnaryOp::Sign => (x > 0) as u32,
            UnaryOp::Not => !x,
            // Float-only ops, rejected by the type rule.
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
            | UnaryOp::Exp2 => 0,
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
            BinaryOp::Pow | BinaryOp::Atan2 => 0,
        }
    }
}

pub fn bool_unary(op: UnaryOp, x: bool) -> bool {
    match op {
        UnaryOp::Not => !x,
        // Rejected for bool by the type rule.
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Exp
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
        | UnaryOp::Exp2 => x,
    }
}

pub fn bool_binary(op: BinaryOp, x: bool, y: bool) -> bool {
    match op {
        BinaryOp::And => x & y,
        BinaryOp::Or => x | y,
        BinaryOp::Xor => x ^ y,
        // Rejected for bool by the type rule.
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Rem
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::Pow
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical
        | BinaryOp::Atan2 => false,
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
