//! The distributions in dtypes other than f32, bit for bit JAX 0.10.2's on CPU: `uniform`,
//! `normal`, `truncated_normal`, `gumbel`, `exponential`, `laplace` and `logistic` in f16 and
//! bf16, `randint` in i64 (JAX's x64 mode). Each follows
//! `jax/_src/random/core.py` (`_uniform`, `_normal_real`, `_randint`) with the rounding XLA:CPU
//! applies, read off JAX: an f16 `f * d + c` is one f32 fused multiply-add rounded to f16 (the
//! product of two f16 values is exact in f32); a bf16 one rounds after the product and after
//! the sum; f16/bf16 `erf_inv`, `erf`, `log` and `log1p` are XLA:CPU's f32 ones rounded (so
//! `xla_log`/`xla_log1p` here too). Where JAX's `uniform` is called with `minval = tiny` and
//! `maxval = 1` (gumbel, logistic), XLA folds `f - 1 + tiny` to `f - 1` in f16, leaving
//! `max(tiny, f)`; these follow that. Conversions here are explicit, so the rounding does not
//! depend on which ops the compiler keeps narrow.

use tessera_ir::{DType, Shape};

use super::dists::{fail, xla_erf, xla_log, xla_log1p};
use super::{Key, threefry_counts, u32s, uniform};
use crate::tensor::Tensor;

/// `(nmant, rng_bits)` of a float dtype: its stored mantissa bits, and the random bits JAX
/// draws per element (its width, and at least 8 above the mantissa's top bit).
fn float_layout(op: &str, dtype: DType, shape: &Shape) -> (u32, u32) {
    match dtype {
        DType::F16 => (10, 16),
        DType::BF16 => (7, 8),
        other => fail(
            op,
            format!(
                "dtype must be f32, f16 or bf16, got {} (shape {:?})",
                other.name(),
                shape.dims()
            ),
        ),
    }
}

/// `x` (an f32 tensor of values of `dtype`) rounded to `dtype` and back to f32.
#[track_caller]
fn round_to(x: &Tensor, dtype: DType) -> Tensor {
    x.astype(dtype).astype(DType::F32)
}

/// `v` rounded to `dtype` (JAX converts a Python float bound to the draw's dtype), as an f32.
#[track_caller]
fn bound(v: f64, dtype: DType) -> Tensor {
    Tensor::scalar(v).astype(dtype).astype(DType::F32)
}

/// The float JAX's `uniform` makes from its random bits, in `[0, 1)`: a value of `dtype`, as
/// f32 (exact), shaped `[numel]`.
#[track_caller]
fn unit(key: &Key, shape: &Shape, dtype: DType) -> Tensor {
    let (nmant, rng_bits) = float_layout("uniform", dtype, shape);
    let (b1, b2) = threefry_counts(key, shape.numel());
    let mask = u32s(((1u64 << rng_bits) - 1) as u32);
    b1.bitxor(&b2)
        .bitand(&mask)
        .shift_right_logical(&u32s(rng_bits - nmant))
        .astype(DType::F32)
        * (1.0 / f64::from(1u32 << nmant)) as f32
}

/// `jax.random.uniform(key, shape, dtype, minval, maxval)` for f32, f16 and bf16: `rng_bits`
/// random bits per element (the low ones of threefry's `b1 ^ b2`), their top mantissa bits a
/// float `f` in `[0, 1)`, then `max(minval, f * (maxval - minval) + minval)` in the dtype.
#[track_caller]
pub fn uniform_dtype(
    key: &Key,
    shape: impl Into<Shape>,
    dtype: DType,
    minval: f64,
    maxval: f64,
) -> Tensor {
    let shape = shape.into();
    if dtype == DType::F32 {
        return uniform(key, shape, minval as f32, maxval as f32);
    }
    // The float JAX makes from the bits: (top nmant bits) * 2^-nmant, exact in every dtype.
    let f = unit(key, &shape, dtype);
    let (lo, hi) = (bound(minval, dtype), bound(maxval, dtype));
    let d = round_to(&(&hi - &lo), dtype);
    let y = match dtype {
        // One fused multiply-add in f32 (the product is exact), rounded once to f16.
        DType::F16 => round_to(&(&(&f * &d) + &lo), DType::F16),
        // Rounded to bf16 after the product and after the sum.
        _ => round_to(&(&round_to(&(&f * &d), dtype) + &lo), dtype),
    };
    y.maximum(&lo).astype(dtype).reshape(shape)
}

/// `jax.random.normal(key, shape, dtype)` for f32, f16 and bf16: `sqrt(2) * erf_inv(u)` with
/// `u` uniform in `(-1, 1)` of the dtype (`minval` the dtype's next value above -1), the
/// `erf_inv` rounded to the dtype and the product rounded again.
#[track_caller]
pub fn normal_dtype(key: &Key, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let shape = shape.into();
    if dtype == DType::F32 {
        return super::normal(key, shape);
    }
    let (nmant, _) = float_layout("normal", dtype, &shape);
    // The next value above -1: 1 - 2^-(nmant + 1) below it in magnitude.
    let lo = -1.0 + 2f64.powi(-(nmant as i32) - 1);
    let u = uniform_dtype(key, shape, dtype, lo, 1.0).astype(DType::F32);
    let e = round_to(&u.erf_inv(), dtype);
    let sqrt2 = bound(std::f64::consts::SQRT_2, dtype);
    (&e * &sqrt2).astype(dtype)
}

/// `log` in `dtype` of an f32 tensor of `dtype` values: XLA:CPU's f32 log, rounded.
#[track_caller]
fn log_in(x: &Tensor, dtype: DType) -> Tensor {
    round_to(&xla_log(x), dtype)
}

/// `log1p` in `dtype`, as `log_in`.
#[track_caller]
fn log1p_in(x: &Tensor, dtype: DType) -> Tensor {
    round_to(&xla_log1p(x), dtype)
}

/// Checks a float draw's dtype; `true` for f32 (the caller takes the f32 path).
#[track_caller]
fn is_f32(op: &str, dtype: DType, shape: &Shape) -> bool {
    if dtype == DType::F32 {
        return true;
    }
    float_layout(op, dtype, shape);
    false
}

/// `max(tiny, f)`: JAX's `uniform(key, shape, dtype, tiny, 1)` as XLA folds it (module doc).
#[track_caller]
fn from_tiny(key: &Key, shape: &Shape, dtype: DType) -> Tensor {
    let tiny = match dtype {
        DType::F16 => 2f32.powi(-14),
        _ => f32::MIN_POSITIVE,
    };
    unit(key, shape, dtype).maximum(&Tensor::scalar(tiny))
}

/// `jax.random.gumbel(key, shape, dtype)` for f32, f16 and bf16: `-log(-log(u))`.
#[track_caller]
pub fn gumbel_dtype(key: &Key, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let shape = shape.into();
    if is_f32("gumbel", dtype, &shape) {
        return super::gumbel(key, shape);
    }
    let u = from_tiny(key, &shape, dtype);
    (-log_in(&-log_in(&u, dtype), dtype))
        .astype(dtype)
        .reshape(shape)
}

/// `jax.random.exponential(key, shape, dtype)` for f32, f16 and bf16: `-log1p(-u)`.
#[track_caller]
pub fn exponential_dtype(key: &Key, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let shape = shape.into();
    if is_f32("exponential", dtype, &shape) {
        return super::exponential(key, shape);
    }
    let u = unit(key, &shape, dtype);
    (-log1p_in(&-u, dtype)).astype(dtype).reshape(shape)
}

/// `jax.random.logistic(key, shape, dtype)` for f32, f16 and bf16: `log(u) - log1p(-u)`.
#[track_caller]
pub fn logistic_dtype(key: &Key, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let shape = shape.into();
    if is_f32("logistic", dtype, &shape) {
        return super::logistic(key, shape);
    }
    let u = from_tiny(key, &shape, dtype);
    let d = &log_in(&u, dtype) - &log1p_in(&-&u, dtype);
    round_to(&d, dtype).astype(dtype).reshape(shape)
}

/// `jax.random.laplace(key, shape, dtype)` for f32, f16 and bf16: `sign(u) log1p(-|u|)`, `u`
/// uniform from the dtype's next value above -1.
#[track_caller]
pub fn laplace_dtype(key: &Key, shape: impl Into<Shape>, dtype: DType) -> Tensor {
    let shape = shape.into();
    if is_f32("laplace", dtype, &shape) {
        return super::laplace(key, shape);
    }
    let (nmant, _) = float_layout("laplace", dtype, &shape);
    let lo = -1.0 + 2f64.powi(-(nmant as i32) - 1);
    let u = uniform_dtype(key, shape.clone(), dtype, lo, 1.0).astype(DType::F32);
    let l = log1p_in(&-u.abs(), dtype);
    (&u.sign() * &l).astype(dtype)
}

/// The f32 value of `v` rounded to `dtype`, at trace time.
fn round_value(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => tessera_ir::f16::from_f32(v).to_f32(),
        DType::BF16 => tessera_ir::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The next `dtype` value after `v` (a `dtype` value) toward `+inf` (`up`) or `-inf`, as
/// `lax.nextafter` in the dtype.
fn next_in(v: f32, up: bool, dtype: DType) -> f32 {
    if v.is_nan() || (v.is_infinite() && (v > 0.0) == up) {
        return v;
    }
    // On the bits of a sign-magnitude float: away from zero is +1, toward it -1; from a zero,
    // the smallest subnormal of the direction's sign.
    let step = |bits: u16, sign: u16| -> u16 {
        if bits & 0x7fff == 0 {
            if up { 1 } else { sign | 1 }
        } else if (bits & sign == 0) == up {
            bits + 1
        } else {
            bits - 1
        }
    };
    match dtype {
        DType::F16 => {
            let b = tessera_ir::f16::from_f32(v).to_bits();
            tessera_ir::f16::from_bits(step(b, 0x8000)).to_f32()
        }
        _ => {
            let b = tessera_ir::bf16::from_f32(v).to_bits();
            tessera_ir::bf16::from_bits(step(b, 0x8000)).to_f32()
        }
    }
}

/// `jax.random.truncated_normal(key, lower, upper, shape, dtype)` for f32, f16 and bf16: the
/// bounds rounded to the dtype, `erf(bound / sqrt2)` in the dtype (as XLA computes the
/// quotient), `u` uniform between,
/// `sqrt2 * erf_inv(u)` clipped to the open interval, each step rounded to the dtype.
#[track_caller]
pub fn truncated_normal_dtype(
    key: &Key,
    lower: f32,
    upper: f32,
    shape: impl Into<Shape>,
    dtype: DType,
) -> Tensor {
    let shape = shape.into();
    if is_f32("truncated_normal", dtype, &shape) {
        return super::truncated_normal(key, lower, upper, shape);
    }
    if lower.is_nan() || upper.is_nan() {
        fail(
            "truncated_normal",
            format!(
                "bounds must not be NaN, got lower {lower}, upper {upper} (shape {:?})",
                shape.dims()
            ),
        );
    }
    let r = |v: f32| round_value(v, dtype);
    let sqrt2 = r(std::f32::consts::SQRT_2);
    let inv = r(1.0 / sqrt2);
    let (lo, hi) = (r(lower), r(upper));
    // XLA turns the division by the constant into a multiplication by its reciprocal in f16
    // and keeps the division in bf16.
    let scaled = |v: f32| match dtype {
        DType::F16 => r(v * inv),
        _ => r(v / sqrt2),
    };
    let a = r(xla_erf(scaled(lo)));
    let b = r(xla_erf(scaled(hi)));
    let u = uniform_dtype(key, shape, dtype, f64::from(a), f64::from(b)).astype(DType::F32);
    let e = round_to(&u.erf_inv(), dtype);
    let out = round_to(&(&e * sqrt2), dtype);
    out.maximum(&Tensor::scalar(next_in(lo, true, dtype)))
        .minimum(&Tensor::scalar(next_in(hi, false, dtype)))
        .astype(dtype)
}

/// `u64(x) % m` for an i64 tensor `x` read as unsigned and a constant `m >= 1`, in signed i64
/// ops (`x >> 1` is nonnegative, so its signed remainder is the unsigned one; doubling it back
/// and adding the low bit leaves a value below `2m`, reduced by one unsigned comparison).
#[track_caller]
fn urem(x: &Tensor, m: u64) -> Tensor {
    let i64s = |v: u64| Tensor::scalar(v as i64);
    // Unsigned `a < m` as signed after flipping the sign bits.
    let below_m = |a: &Tensor| a.bitxor(&i64s(1 << 63)).lt(&i64s(m ^ (1 << 63)));
    let reduce_once = |a: &Tensor| Tensor::select(&below_m(a), a, &a.sub(&i64s(m)));
    if m >= 1 << 63 {
        return reduce_once(x);
    }
    let half = x.shift_right_logical(&i64s(1)).rem(&i64s(m));
    let twice = half.add(&half).add(&x.bitand(&i64s(1)));
    reduce_once(&twice)
}

/// The 64 random bits JAX's partitionable threefry gives each element: `(b1 << 32) | b2`.
#[track_caller]
fn bits64(key: &Key, shape: &Shape) -> Tensor {
    let (b1, b2) = threefry_counts(key, shape.numel());
    let hi = b1.astype(DType::I64).shift_left(&Tensor::scalar(32i64));
    hi.bitor(&b2.astype(DType::I64)).reshape(shape.clone())
}

/// `jax.random.randint(key, shape, minval, maxval, jnp.int64)` (x64 mode): two 64-bit draws
/// `hi`, `lo` (from `split(key)`) combined as `((hi % span) * multiplier + lo % span) % span`
/// in wrapping u64 arithmetic, as JAX's `_randint`; `maxval <= minval` gives `minval`.
#[track_caller]
pub(super) fn randint_i64(key: &Key, shape: Shape, minval: i64, maxval: i64) -> Tensor {
    let span = if maxval <= minval {
        1
    } else {
        maxval.wrapping_sub(minval) as u64
    };
    let [k1, k2] = key.split();
    let (higher, lower) = (bits64(&k1, &shape), bits64(&k2, &shape));
    // JAX's multiplier, `((2^32 % span) * (2^32 % span)) % span` in u64: the product wraps
    // to 0 for a span past 2^32 (so the high draw then contributes nothing), as there.
    let m = (1u64 << 32) % span;
    let multiplier = m.wrapping_mul(m) % span;
    let offset = urem(
        &urem(&higher, span)
            .mul(&Tensor::scalar(multiplier as i64))
            .add(&urem(&lower, span)),
        span,
    );
    offset.add(&Tensor::scalar(minval))
}
