//! Distributions over [`Key`], bit for bit JAX 0.10.2's on CPU for the same key, shape and
//! dtype: each follows `jax/_src/random/core.py` step for step, and where XLA:CPU's own
//! floating-point expansions matter (`log`, `log1p`, `erf`) they are rebuilt from exact tensor
//! ops (`xla_log`, `xla_log1p`) or computed at trace time (`xla_erf`), since the IR's `log`
//! and `log1p` are accurate to an ulp but not XLA's bits.

use std::panic::Location;

use tessera_ir::{DType, Shape};

use super::{Key, bits, u32s, uniform};
use crate::axis::Axis;
use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;

#[track_caller]
pub(super) fn fail(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

#[track_caller]
fn check_f32(op: &str, what: &str, t: &Tensor) {
    if t.dtype() != DType::F32 {
        fail(
            op,
            format!(
                "{what} must be f32, got {}{:?}",
                t.dtype().name(),
                t.shape()
            ),
        );
    }
}

/// Refuses a `t` that is not f32, f16 or bf16 (the dtypes the uniform draws come in).
#[track_caller]
fn check_float(op: &str, what: &str, t: &Tensor) {
    if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        fail(
            op,
            format!(
                "{what} must be f32, f16 or bf16, got {}{:?}",
                t.dtype().name(),
                t.shape()
            ),
        );
    }
}

/// `jax.random.bernoulli(key, p, shape)` (mode "low", the default): `uniform(key, shape) < p`
/// with the uniform in `p`'s dtype, a bool tensor. `p` is an f32, f16 or bf16 tensor
/// broadcastable to `shape`.
#[track_caller]
pub fn bernoulli(key: &Key, p: &Tensor, shape: impl Into<Shape>) -> Tensor {
    let shape = shape.into();
    check_float("bernoulli", "p", p);
    check_broadcastable("bernoulli", &shape, p.shape(), "p");
    super::uniform_dtype(key, shape, p.dtype(), 0.0, 1.0).lt(p)
}

/// JAX's `_check_shape`: `param` must broadcast to `shape` without enlarging it.
#[track_caller]
fn check_broadcastable(op: &str, shape: &Shape, param: &[usize], what: &str) {
    let dims = shape.dims();
    let ok = param.len() <= dims.len()
        && param
            .iter()
            .rev()
            .zip(dims.iter().rev())
            .all(|(&p, &d)| p == d || p == 1);
    if !ok {
        fail(
            op,
            format!("{what} of shape {param:?} does not broadcast to the draw shape {dims:?}"),
        );
    }
}

/// `jax.random.randint(key, shape, minval, maxval, dtype)` for i32, u32 and i64 (x64 mode's,
/// in `dtypes.rs`): JAX's two-draw
/// `_randint`. `minval`/`maxval` are clipped to the dtype's range (a `maxval` past the top
/// makes the span one larger, so the dtype's maximum is reachable); `maxval <= minval` gives
/// `minval`. Two independent words `hi`, `lo` per element (from `split(key)`) are combined as
/// `((hi % span) * (2^32 % span) + lo % span) % span` in wrapping u32 arithmetic, as JAX does
/// (biased when `span` is not a power of two, like JAX).
#[track_caller]
pub fn randint(
    key: &Key,
    shape: impl Into<Shape>,
    minval: i64,
    maxval: i64,
    dtype: DType,
) -> Tensor {
    let shape = shape.into();
    let (dmin, dmax) = match dtype {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        DType::I64 => return super::dtypes::randint_i64(key, shape, minval, maxval),
        other => fail(
            "randint",
            format!(
                "dtype must be i32, u32 or i64, got {} (shape {:?})",
                other.name(),
                shape.dims()
            ),
        ),
    };
    let out_of_range = maxval > dmax;
    let lo = minval.clamp(dmin, dmax);
    let hi = maxval.clamp(dmin, dmax);
    // `maxval - minval` in the dtype, reinterpreted as u32: the low 32 bits of the difference.
    let mut span = hi.wrapping_sub(lo) as u32;
    if hi <= lo {
        span = 1;
    }
    if out_of_range && hi > lo {
        span = span.wrapping_add(1);
    }
    let [k1, k2] = key.split();
    let higher = bits(&k1, shape.clone());
    let lower = bits(&k2, shape);
    let offset = if span == 0 {
        // A span of 2^32 (wrapped to 0): XLA's `x % 0 = x` makes the multiplier `2^32 % 0`
        // wrap to 0, leaving the low word.
        lower
    } else {
        let m = (1u32 << 16) % span;
        let multiplier = m.wrapping_mul(m) % span;
        let s = u32s(span);
        higher
            .rem(&s)
            .mul(&u32s(multiplier))
            .add(&lower.rem(&s))
            .rem(&s)
    };
    match dtype {
        DType::I32 => offset.bitcast(DType::I32).add(&Tensor::scalar(lo as i32)),
        _ => offset.add(&u32s(lo as u32)),
    }
}

/// XLA:CPU's f32 `erf` (Eigen's rational approximation, Horner steps fused, `copysign(1, x)`
/// past `3.8325`), for the trace-time bounds of `truncated_normal`.
pub(super) fn xla_erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x2 = x * x;
    let mut p = x2.mul_add(0.000_229_050_66, 0.003_408_291);
    // XLA's constant (1.128379143519084f), kept as written rather than `FRAC_2_SQRT_PI`.
    #[allow(clippy::approx_constant)]
    for c in [0.050_955_695, 0.185_208_32, 1.128_379_1] {
        p = x2.mul_add(p, c);
    }
    let p = x * p;
    let mut q = x2.mul_add(-1.179_160_3e-7, 0.000_023_547_966);
    for c in [
        0.001_017_962_5,
        0.014_070_47,
        0.110_985_05,
        0.497_469_25,
        1.0,
    ] {
        q = x2.mul_add(q, c);
    }
    if x.abs() <= 3.832_507 {
        p / q
    } else {
        1.0f32.copysign(x)
    }
}

/// The next f32 after `x` toward `+inf` (`up`) or `-inf`, as `lax.nextafter`.
fn next_after(x: f32, up: bool) -> f32 {
    if x.is_nan() || (x.is_infinite() && (x > 0.0) == up) {
        return x;
    }
    if x == 0.0 {
        let tiny = f32::from_bits(1);
        return if up { tiny } else { -tiny };
    }
    let b = x.to_bits();
    f32::from_bits(if (x > 0.0) == up { b + 1 } else { b - 1 })
}

/// `jax.random.truncated_normal(key, lower, upper, shape)`: f32 normal samples in the open
/// interval `(lower, upper)`, as JAX: `u = uniform(key, shape, erf(lower/sqrt2),
/// erf(upper/sqrt2))` (the division done as XLA does it, times `f32(1/sqrt2)`), `sqrt2 * erf_inv(u)`, clipped to `(nextafter(lower, inf),
/// nextafter(upper, -inf))`. The bounds' `erf` is XLA:CPU's runtime one (JAX's eager value;
/// under an outer `jax.jit` with constant bounds XLA's constant folder may differ by an ulp).
#[track_caller]
pub fn truncated_normal(key: &Key, lower: f32, upper: f32, shape: impl Into<Shape>) -> Tensor {
    let shape = shape.into();
    if lower.is_nan() || upper.is_nan() {
        fail(
            "truncated_normal",
            format!(
                "bounds must not be NaN, got lower {lower}, upper {upper} (shape {:?})",
                shape.dims()
            ),
        );
    }
    let sqrt2 = std::f32::consts::SQRT_2;
    // XLA's simplifier turns the division by the constant `sqrt2` into a multiplication by
    // its f32 reciprocal; the bits follow that.
    let inv_sqrt2 = 1.0f32 / sqrt2;
    let a = xla_erf(lower * inv_sqrt2);
    let b = xla_erf(upper * inv_sqrt2);
    let u = uniform(key, shape, a, b);
    let out = u.erf_inv() * sqrt2;
    out.maximum(&Tensor::scalar(next_after(lower, true)))
        .minimum(&Tensor::scalar(next_after(upper, false)))
}

/// `a * b + c` on f32 tensors rounded once (a fused multiply-add), from f64 ops: `a * b` is
/// exact in f64, and the f64 sum's rounding to f32 is corrected where it lands exactly on an
/// f32 midpoint (the argument at `super::fma_f32`). A subnormal result is flushed to a zero
/// of its sign, as XLA:CPU does.
#[track_caller]
pub(super) fn fma(a: &Tensor, b: &Tensor, c: &Tensor) -> Tensor {
    let f64s = |x: f64| Tensor::scalar(x);
    let c64 = c.astype(DType::F64);
    let p = a.astype(DType::F64) * &b.astype(DType::F64);
    let s = &p + &c64;
    let bb = &s - &p;
    let e = (&p - (&s - &bb)) + (&c64 - &bb);
    let r = s.astype(DType::F32);
    let max = f32::MAX as f64;
    let rd = r
        .astype(DType::F64)
        .maximum(&f64s(-max))
        .minimum(&f64s(max));
    let h = &s - &rd;
    let n = &s + &h;
    let n_is_f32 = n
        .astype(DType::F32)
        .astype(DType::F64)
        .eq(&n)
        .bitor(&n.abs().eq(&f64s(2f64.powi(128))));
    let zero = f64s(0.0);
    let midpoint = h
        .ne(&zero)
        .bitand(&n_is_f32)
        .bitand(&s.abs().lt(&f64s(f64::INFINITY)))
        .bitand(&e.ne(&zero));
    let toward_e = Tensor::select(&e.gt(&zero), &rd.maximum(&n), &rd.minimum(&n));
    let r = Tensor::select(&midpoint, &toward_e.astype(DType::F32), &r);
    let tiny = r.abs().lt(&Tensor::scalar(f32::MIN_POSITIVE));
    Tensor::select(&tiny, &(&r * 0.0), &r)
}

#[track_caller]
fn h(bits: u32) -> Tensor {
    Tensor::scalar(f32::from_bits(bits))
}

/// XLA:CPU's f32 `log` (Cephes' `logf`, as `tessera_interp::scalar::xla_log`), from exact
/// ops: `x = m 2^e`, `m` in `[sqrt(1/2), sqrt(2))`, `e ln2 + r - r^2/2 + r^3 poly(r)` with
/// `r = m - 1`, Horner steps fused. `log(+inf) = inf`, `log(0) = -inf`, NaN (all ones) for
/// negatives and NaN; subnormals are read as zero (XLA:CPU's denormals-are-zero).
#[track_caller]
pub fn xla_log(x: &Tensor) -> Tensor {
    let v = x.maximum(&Tensor::scalar(f32::MIN_POSITIVE));
    let b = v.bitcast(DType::U32);
    let m = b
        .bitand(&u32s(0x807f_ffff))
        .bitor(&u32s(0x3f00_0000))
        .bitcast(DType::F32);
    let e = b
        .shift_right_logical(&u32s(23))
        .bitcast(DType::I32)
        .astype(DType::F32)
        - 127.0;
    let below = m.lt(&h(0x3f35_04f3));
    let zero = Tensor::scalar(0.0f32);
    let r = (&m - 1.0) + Tensor::select(&below, &m, &zero);
    let e = (e + 1.0) - Tensor::select(&below, &Tensor::scalar(1.0f32), &zero);
    let r2 = &r * &r;
    let r3 = &r2 * &r;
    let pair = |c0: u32, c1: u32, c2: u32| fma(&fma(&r, &h(c0), &h(c1)), &r, &h(c2));
    let a = pair(0x3d90_21bb, 0xbdeb_d1b8, 0x3def_251a);
    let bq = pair(0xbdfe_5d4f, 0x3e11_e9bf, 0xbe2a_ae50);
    let c = pair(0x3e4c_ceac, 0xbe7f_fffc, 0x3eaa_aaaa);
    let poly = fma(&fma(&a, &r3, &bq), &r3, &c);
    let tail = fma(&poly, &r3, &(&e * &h(0xb95e_8083)));
    // `r2 * -0.5` and `e * ln2_hi` (an integer `e` times a 12-bit constant) are exact, so
    // these two fused steps round only in their add.
    let sum = (&r2 * -0.5) + &r + &tail;
    let out = (&e * &h(0x3f31_8000)) + &sum;
    let out = Tensor::select(&x.eq(&Tensor::scalar(f32::INFINITY)), x, &out);
    let bad = x.lt(&zero).bitor(&x.ne(x));
    let out = Tensor::select(&bad, &h(0xffff_ffff), &out);
    // Denormals are zero on XLA:CPU: zeros and subnormals of either sign give -inf.
    Tensor::select(
        &x.abs().lt(&Tensor::scalar(f32::MIN_POSITIVE)),
        &Tensor::scalar(f32::NEG_INFINITY),
        &out,
    )
}

/// XLA:CPU's f32 `log1p`: Cephes' `x - x^2/2 + x^3 P(x)/Q(x)` for `|x| < sqrt(2) - 1`, else
/// [`xla_log`]`(1 + x)` (as `tessera_interp::scalar::xla_log1p`).
#[track_caller]
pub fn xla_log1p(x: &Tensor) -> Tensor {
    const P: [u32; 7] = [
        0x383d_e04b,
        0x3eff_40c5,
        0x40d2_84fa,
        0x41ef_4b9c,
        0x4273_cc76,
        0x4264_73ad,
        0x41a0_5101,
    ];
    const Q: [u32; 7] = [
        0x3f80_0000,
        0x4171_01ad,
        0x42a6_185b,
        0x435d_c32d,
        0x439a_8ca3,
        0x4358_6d8a,
        0x4270_7982,
    ];
    let horner = |c: &[u32; 7]| {
        c[1..]
            .iter()
            .fold(h(c[0]).broadcast_to(x.shape()), |p, &ci| fma(&p, x, &h(ci)))
    };
    let ratio = horner(&P) / horner(&Q);
    let x2 = x * x;
    let t = (x * &x2) * &ratio;
    let small = x + &((&x2 * -0.5) + &t);
    let large = xla_log(&(x + 1.0));
    Tensor::select(&x.abs().lt(&h(0x3ed4_13cd)), &small, &large)
}

/// `jax.random.gumbel(key, shape)` (mode "low", the default): `-log(-log(u))`, `u` uniform in
/// `[tiny, 1)`.
#[track_caller]
pub fn gumbel(key: &Key, shape: impl Into<Shape>) -> Tensor {
    let u = uniform(key, shape, f32::MIN_POSITIVE, 1.0);
    -xla_log(&-xla_log(&u))
}

/// `jax.random.exponential(key, shape)`: `-log1p(-u)`, `u` uniform in `[0, 1)`.
#[track_caller]
pub fn exponential(key: &Key, shape: impl Into<Shape>) -> Tensor {
    -xla_log1p(&-uniform(key, shape, 0.0, 1.0))
}

/// `jax.random.laplace(key, shape)`: `sign(u) log1p(-|u|)`, `u` uniform in
/// `[-1 + 2^-24, 1)`.
#[track_caller]
pub fn laplace(key: &Key, shape: impl Into<Shape>) -> Tensor {
    let u = uniform(key, shape, -1.0 + f32::EPSILON / 2.0, 1.0);
    u.sign() * xla_log1p(&-u.abs())
}

/// `jax.random.logistic(key, shape)`: `log(u) - log1p(-u)`, `u` uniform in `[tiny, 1)`.
#[track_caller]
pub fn logistic(key: &Key, shape: impl Into<Shape>) -> Tensor {
    let u = uniform(key, shape, f32::MIN_POSITIVE, 1.0);
    xla_log(&u) - xla_log1p(&-&u)
}

/// `jax.random.categorical(key, logits, axis, shape)` (with replacement, the default): the
/// index of the largest `gumbel + logits` along `axis` (the gumbel in the logits' dtype: f32,
/// f16 or bf16), i32. Without `shape` the result has
/// `logits`' shape without `axis`; a `shape` must end in that batch shape (dims of 1 in it
/// broadcast), its leading dims are independent draws.
#[track_caller]
pub fn categorical(
    key: &Key,
    logits: &Tensor,
    axis: impl Into<Axis>,
    shape: Option<Shape>,
) -> Tensor {
    check_float("categorical", "logits", logits);
    let rank = logits.rank();
    if rank == 0 {
        fail(
            "categorical",
            "logits must have at least one dim, got a scalar".into(),
        );
    }
    let axis = logits.resolve_axis("categorical", axis);
    let mut batch: Vec<usize> = logits.shape().to_vec();
    let n = batch.remove(axis);
    let shape = shape.map_or(batch.clone(), |s| s.dims().to_vec());
    check_broadcastable(
        "categorical",
        &Shape::new(shape.clone()),
        &batch,
        "the batch shape",
    );
    if shape.len() < batch.len() || (n == 0 && shape.iter().product::<usize>() != 0) {
        fail(
            "categorical",
            format!(
                "cannot draw shape {shape:?} from logits {:?} along axis {axis}",
                logits.shape()
            ),
        );
    }
    let prefix = shape.len() - batch.len();
    let mut full = shape.clone();
    full.insert(prefix + axis, n);
    let mut expanded = vec![1; prefix];
    expanded.extend_from_slice(logits.shape());
    let g = super::gumbel_dtype(key, full, logits.dtype()) + logits.reshape(expanded);
    g.argmax(prefix + axis)
}

/// A dropout mask applied as `flax.linen.Dropout` does: `keep = 1 - rate` (rounded to f32),
/// `mask = bernoulli(key, keep, x.shape)`, `x / keep` where kept and 0 elsewhere; `x` itself
/// at rate 0 and zeros at rate 1. `rate` must be in `[0, 1]`.
#[track_caller]
pub fn dropout(key: &Key, rate: f64, x: &Tensor) -> Tensor {
    check_f32("dropout", "x", x);
    if !(0.0..=1.0).contains(&rate) {
        fail(
            "dropout",
            format!("rate must be in [0, 1], got {rate} (x {:?})", x.shape()),
        );
    }
    if rate == 0.0 {
        return x.clone();
    }
    if rate == 1.0 {
        return x.zeros_like();
    }
    let keep = (1.0 - rate) as f32;
    let mask = bernoulli(key, &Tensor::scalar(keep), x.shape());
    Tensor::select(&mask, &(x / keep), &x.zeros_like())
}
