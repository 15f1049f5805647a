//! Inline approximations of the f32 elementwise functions, written once for scalars (`f32`) and
//! vectors (`f32x4`), and the few Rust functions generated code calls for f32 (`sin`/`cos` of
//! large arguments, `pow`).
//!
//! Semantics: IEEE with gradual underflow. Subnormal inputs are used as they are and results
//! whose true value is subnormal are produced (rounded once), never flushed; the specials
//! follow C99 Annex F (NaN in gives NaN out, `exp(-inf) = 0`, `log(0) = -inf`, `log(-1) =
//! NaN`, `log1p(inf) = inf`, `expm1(-inf) = -1`, `tanh(+-inf) = +-1`, `sin(-0) = -0`,
//! `sin(inf) = NaN`, overflow gives inf only where the rounded true value does).
//!
//! Bounds are in ulps of the correctly rounded result (the f64 reference rounded to f32), over
//! the WHOLE f32 range: `tests/ulp.rs` sweeps every binade of both signs (2000 random
//! mantissas each, subnormals included) plus the specials and asserts the stated bound; the
//! measured maximum is in parentheses (sweep with FMA / without), then over all 2^32 inputs
//! on the FMA host (`every_f32_within_the_stated_bound`, ignored: about 100 s a function). No function here has an absolute-only bound: the
//! reductions keep relative accuracy where the result goes to 0 (`sin` near multiples of pi,
//! `log` near 1).
//!
//! | function | method | stated bound, FMA / no FMA (measured) |
//! | --- | --- | --- |
//! | exp | n = round(x log2 e), Cody-Waite ln 2, degree-8 Taylor, 2^n as two normal factors (exact, then one rounding: right up to `f32::MAX` and into the subnormals) | 1 / 1.5 ulp (0.82 / 1.08; every f32: 0.870) |
//! | log | x = m 2^e (subnormals scaled by 2^23 first), m in [sqrt(1/2), sqrt(2)), fdlibm's f - hfsq + s (hfsq + R) | 1 / 1 ulp (0.74 / 0.74; every f32: 0.854) |
//! | log1p | log(u) + c / u, u = 1 + x rounded, c its exact rounding error (fdlibm); inf at inf | 2 / 2 ulp (1.44 / 1.44; every f32: 1.437) |
//! | expm1 | fdlibm: x = k ln 2 + r, Taylor expm1(r) to r^9, 2^k (expm1(r) + 1 - 2^-k) or 2^k expm1(r) + (2^k - 1); exp(x) past 20 | 2 / 2 ulp (1.39 / 1.29; every f32: 1.439) |
//! | tanh | x + x^3 g(x^2) on x itself (degree-4 minimax g, Estrin's scheme) where x^2 < 0.625^2 or NaN (x itself below 2^-12, by rounding); on abs(x) 1 - 2 / (exp(2x) + 1), computed only for a vector with a lane past 0.625, its exp with one scale factor, no clamp, a degree-6 polynomial in Estrin's scheme and the 2s folded into the constants (`exp_tanh_plus_one`, whose last rounding is one multiply-add); 1 past 9.1; the sign of x or-ed in last | 1.5 / 1.5 ulp (1.08 / 1.08; every f32: 1.198) |
//! | logistic | e = exp(-abs x): 1 / (1 + e) for x >= 0, e / (1 + e) below, one correction step for the roundings of 1 + e and the division | 2 / 2.5 ulp (1.24 / 1.89; every f32: 1.480) |
//! | sin, cos | abs(x) <= 8192 (FMA hosts; pi/4 without): round(x 2/pi), 3-part Cody-Waite by FMA, Taylor 9/10 per quadrant; else (any lane) a call: Payne-Hanek with 192 bits of 2/pi, f64 | 1.5 / 1.5 ulp (1.38 / 1.04; every f32 up to 16384: 1.486) |
//! | erf | x + x P(x^2) (degree-6 Chebyshev P) below 0.84375; 1 - exp(-x^2) h(x), h = erfc exp(x^2) a degree-12 Chebyshev fit, below 3.92; +-1 beyond | 1.5 / 1.5 ulp (1.05 / 1.03; every f32: 1.211) |
//! | erf_inv | Giles (2010) over XLA's own log1p, XLA:CPU's roundings: bit for bit JAX's (`tessera/tests/prng.rs`) | 4e-6 relative (3.4e-6) on [-0.9999, 0.9999] |
//! | pow | a call per element: f64 `pow` rounded once (C99 Annex F specials, subnormals) | 0.5 ulp + f64 error, bit for bit with the interpreter |
//! | sqrt | `sqrt` instruction | 0.5 ulp (correctly rounded) |
//! | rsqrt | 1 / sqrt(x), two roundings, as the interpreter | 1.5 ulp (1.47) |
//!
//! FMA: with a native FMA (`Fx::fma`) products like `j pi/2` are exact and Horner steps round
//! once; without (or with `TESSERA_NO_FMA=1`, how the second column is measured) they round
//! twice. The interpreter's own f32 functions (Rust std, i.e. glibc, and `libm::erff`) are
//! measured the same way in `tests/ulp.rs`: within 1 ulp except glibc's `tanhf` (2.05) and
//! the composite `logistic` (2.22) and `rsqrt` (1.47).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, I32, I32X4};
use cranelift_codegen::ir::{
    BlockArg, Endianness, FuncRef, Function, InstBuilder, MemFlagsData, Type, Value,
};
use cranelift_frontend::FunctionBuilder;
use tessera_interp::elem::Libm;
use tessera_ir::{BinaryOp, UnaryOp};

/// The float type being computed in (`f32`, `f32x4`, or `f64` for the exact functions), and
/// whether `fma` is a native instruction.
#[derive(Clone, Copy)]
pub struct Fx {
    pub ty: Type,
    pub fma: bool,
}

fn le() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

impl Fx {
    fn vector(self) -> bool {
        self.ty == F32X4
    }

    fn ity(self) -> Type {
        if self.vector() { I32X4 } else { I32 }
    }

    fn c(self, b: &mut FunctionBuilder, v: f64) -> Value {
        match self.ty {
            F64 => b.ins().f64const(v),
            F32 => b.ins().f32const(v as f32),
            _ => {
                let s = b.ins().f32const(v as f32);
                b.ins().splat(F32X4, s)
            }
        }
    }

    fn ci(self, b: &mut FunctionBuilder, v: i32) -> Value {
        let s = b.ins().iconst(I32, v as i64);
        if self.vector() {
            b.ins().splat(I32X4, s)
        } else {
            s
        }
    }

    /// `a * x + c`, one rounding when FMA is native.
    fn fma(self, b: &mut FunctionBuilder, a: Value, x: Value, c: Value) -> Value {
        if self.fma {
            b.ins().fma(a, x, c)
        } else {
            let p = b.ins().fmul(a, x);
            b.ins().fadd(p, c)
        }
    }

    /// `mask ? a : o`, lane by lane.
    fn sel(self, b: &mut FunctionBuilder, mask: Value, a: Value, o: Value) -> Value {
        if self.vector() {
            let m = if b.func.dfg.value_type(mask) == F32X4 {
                mask
            } else {
                b.ins().bitcast(F32X4, le(), mask)
            };
            b.ins().bitselect(m, a, o)
        } else {
            b.ins().select(mask, a, o)
        }
    }

    fn to_bits(self, b: &mut FunctionBuilder, x: Value) -> Value {
        let flags = if self.vector() {
            le()
        } else {
            MemFlagsData::new()
        };
        b.ins().bitcast(self.ity(), flags, x)
    }

    fn bits_to_float(self, b: &mut FunctionBuilder, x: Value) -> Value {
        let flags = if self.vector() {
            le()
        } else {
            MemFlagsData::new()
        };
        b.ins().bitcast(self.ty, flags, x)
    }

    /// Horner's scheme, coefficients from the highest power down.
    fn horner(self, b: &mut FunctionBuilder, x: Value, coeffs: &[f64]) -> Value {
        let mut p = self.c(b, coeffs[0]);
        for &c in &coeffs[1..] {
            let cv = self.c(b, c);
            p = self.fma(b, p, x, cv);
        }
        p
    }

    fn fcmp(self, b: &mut FunctionBuilder, cc: FloatCC, x: Value, y: Value) -> Value {
        b.ins().fcmp(cc, x, y)
    }

    /// `x` limited to `[lo, hi]` with compare-and-select, which x86 does in one `minps` and
    /// one `maxps` (Cranelift's `fmin`/`fmax` are NaN-correct sequences several times longer).
    /// A NaN `x` comes out as `hi`: callers restore NaN with `keep_nan`.
    fn clamp(self, b: &mut FunctionBuilder, x: Value, lo: f64, hi: f64) -> Value {
        let hi = self.c(b, hi);
        let lo = self.c(b, lo);
        let below = self.fcmp(b, FloatCC::LessThan, x, hi);
        let x = self.sel(b, below, x, hi);
        let above = self.fcmp(b, FloatCC::GreaterThan, x, lo);
        self.sel(b, above, x, lo)
    }

    /// `r`, or `x` itself where `x` is NaN.
    fn keep_nan(self, b: &mut FunctionBuilder, x: Value, r: Value) -> Value {
        let nan = self.fcmp(b, FloatCC::Unordered, x, x);
        self.sel(b, nan, x, r)
    }

    /// `2^n` for an integer `n` (`i32` or `i32x4`) in `[-126, 127]`, from exponent bits.
    fn pow2i(self, b: &mut FunctionBuilder, n: Value) -> Value {
        let bias = self.ci(b, 127);
        let e = b.ins().iadd(n, bias);
        let e = b.ins().ishl_imm_s(e, 23);
        self.bits_to_float(b, e)
    }

    /// `abs(x)` with the sign bit of `s`.
    fn copysign(self, b: &mut FunctionBuilder, x: Value, s: Value) -> Value {
        let sign = self.ci(b, i32::MIN);
        let mag = self.ci(b, i32::MAX);
        let xb = self.to_bits(b, x);
        let sb = self.to_bits(b, s);
        let xb = b.ins().band(xb, mag);
        let sb = b.ins().band(sb, sign);
        let r = b.ins().bor(xb, sb);
        self.bits_to_float(b, r)
    }
}

/// `ln 2` in two parts, for exp's reduction and log's reconstruction (the high one with
/// trailing zero bits, so `n ln2_hi` is exact for the `n` of an f32 argument).
pub(crate) const LN2_HI: f64 = 0.693_145_75;
pub(crate) const LN2_LO: f64 = 1.428_606_8e-6;

/// exp's polynomial on the reduced argument: Taylor to degree 8, highest power first.
const EXP_TAYLOR: [f64; 9] = [
    1.0 / 40320.0,
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `exp(x)` (see the module table). `2^n` is applied as two factors `2^(n >> 1)` and
/// `2^(n - (n >> 1))`, each a normal float for every `n` in `[-150, 128]`: the first product is
/// exact and the second rounds once, so results near `f32::MAX` are right and results in the
/// subnormal range underflow gradually (one rounding, as IEEE says).
pub fn exp(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let xc = f.clamp(b, x, -104.0, 88.75);
    let log2e = f.c(b, std::f64::consts::LOG2_E);
    let t = b.ins().fmul(xc, log2e);
    let n = b.ins().nearest(t);
    let ln2_hi = f.c(b, -LN2_HI);
    let ln2_lo = f.c(b, -LN2_LO);
    let r = f.fma(b, n, ln2_hi, xc);
    let r = f.fma(b, n, ln2_lo, r);
    let p = f.horner(b, r, &EXP_TAYLOR);
    let ni = b.ins().fcvt_to_sint_sat(f.ity(), n);
    let n1 = b.ins().sshr_imm_s(ni, 1);
    let n2 = b.ins().isub(ni, n1);
    let s1 = f.pow2i(b, n1);
    let s2 = f.pow2i(b, n2);
    let res = b.ins().fmul(p, s1);
    let res = b.ins().fmul(res, s2);
    f.keep_nan(b, x, res)
}

/// `log(x)` (see the module table).
pub fn log(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let min_normal = f.c(b, f32::MIN_POSITIVE as f64);
    let small = f.fcmp(b, FloatCC::LessThan, x, min_normal);
    let two23 = f.c(b, 8_388_608.0);
    let scaled = b.ins().fmul(x, two23);
    let xs = f.sel(b, small, scaled, x);
    let bits = f.to_bits(b, xs);
    let e = b.ins().ushr_imm_s(bits, 23);
    let bias = f.ci(b, 127);
    let e = b.ins().isub(e, bias);
    let mant_mask = f.ci(b, 0x007f_ffff);
    let one_bits = f.ci(b, 0x3f80_0000);
    let mb = b.ins().band(bits, mant_mask);
    let mb = b.ins().bor(mb, one_bits);
    let m = f.bits_to_float(b, mb);
    let sqrt2 = f.c(b, std::f64::consts::SQRT_2);
    let big = f.fcmp(b, FloatCC::GreaterThan, m, sqrt2);
    let half = f.c(b, 0.5);
    let mh = b.ins().fmul(m, half);
    let m = f.sel(b, big, mh, m);
    let one_i = f.ci(b, 1);
    let zero_i = f.ci(b, 0);
    let big_i = if f.vector() {
        let bm = b.ins().bitcast(I32X4, le(), big);
        b.ins().band(bm, one_i)
    } else {
        b.ins().select(big, one_i, zero_i)
    };
    let e = b.ins().iadd(e, big_i);
    let ef = b.ins().fcvt_from_sint(f.ty, e);
    let adj = f.c(b, -23.0);
    let zero = f.c(b, 0.0);
    let adj = f.sel(b, small, adj, zero);
    let ef = b.ins().fadd(ef, adj);
    let one = f.c(b, 1.0);
    let two = f.c(b, 2.0);
    let fm = b.ins().fsub(m, one);
    let den = b.ins().fadd(fm, two);
    let s = b.ins().fdiv(fm, den);
    let s2 = b.ins().fmul(s, s);
    // log m = f - hfsq + s (hfsq + R) with f = m - 1 (exact), hfsq = f^2 / 2 and
    // R = 2 s^2 / 3 + 2 s^4 / 5 + ... (fdlibm's arrangement: the large terms are exact or
    // nearly, the rounding errors land on the small correction).
    let r = f.horner(b, s2, &[2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0]);
    let r = b.ins().fmul(r, s2);
    let hf = b.ins().fmul(fm, half);
    let hfsq = b.ins().fmul(hf, fm);
    let t = b.ins().fadd(hfsq, r);
    let ln2_hi = f.c(b, LN2_HI);
    let ln2_lo = f.c(b, LN2_LO);
    let elo = b.ins().fmul(ef, ln2_lo);
    let corr = f.fma(b, s, t, elo);
    let d = b.ins().fsub(hfsq, corr);
    let logm = b.ins().fsub(d, fm);
    let ehi = b.ins().fmul(ef, ln2_hi);
    let res = b.ins().fsub(ehi, logm);
    // Special values: +inf, 0, negatives, NaN.
    let inf = f.c(b, f64::INFINITY);
    let ninf = f.c(b, f64::NEG_INFINITY);
    let nan = f.c(b, f64::NAN);
    let is_inf = f.fcmp(b, FloatCC::Equal, x, inf);
    let res = f.sel(b, is_inf, inf, res);
    let is_zero = f.fcmp(b, FloatCC::Equal, x, zero);
    let res = f.sel(b, is_zero, ninf, res);
    let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
    let res = f.sel(b, neg, nan, res);
    let is_nan = f.fcmp(b, FloatCC::Unordered, x, x);
    f.sel(b, is_nan, x, res)
}

/// `log1p(x) = log(u) + c / u` with `u = 1 + x` rounded and `c` its rounding error, exact:
/// `x - (u - 1)` up to `u = 2`, `1 - (u - x)` beyond (fdlibm's correction); `x` where
/// `u == 1`, `-inf` at -1, `+inf` at `+inf`.
pub fn log1p(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let one = f.c(b, 1.0);
    let u = b.ins().fadd(one, x);
    let l = log(b, f, u);
    let d = b.ins().fsub(u, one);
    let c_lo = b.ins().fsub(x, d);
    let ux = b.ins().fsub(u, x);
    let c_hi = b.ins().fsub(one, ux);
    let two = f.c(b, 2.0);
    let above = f.fcmp(b, FloatCC::GreaterThan, u, two);
    let c = f.sel(b, above, c_hi, c_lo);
    let cu = b.ins().fdiv(c, u);
    let r = b.ins().fadd(l, cu);
    let tiny = f.fcmp(b, FloatCC::Equal, u, one);
    let r = f.sel(b, tiny, x, r);
    // At u = 0 (x = -1) the correction is 0 / 0; at x = +inf it is inf - inf.
    let zero = f.c(b, 0.0);
    let ninf = f.c(b, f64::NEG_INFINITY);
    let at_m1 = f.fcmp(b, FloatCC::Equal, u, zero);
    let r = f.sel(b, at_m1, ninf, r);
    let inf = f.c(b, f64::INFINITY);
    let is_inf = f.fcmp(b, FloatCC::Equal, x, inf);
    f.sel(b, is_inf, x, r)
}

/// `expm1(x)` (fdlibm's method): `x = k ln 2 + r` with `abs(r) <= ln 2 / 2`, `expm1(r)` by
/// its Taylor series to r^9 (the next term is under 1e-10 relative), then
/// `2^k (expm1(r) + (1 - 2^-k))` for `k >= 0` and `2^k expm1(r) + (2^k - 1)` below (the
/// constants are exact for `abs(k) <= 24`; beyond, the result rounds to -1 or is `exp(x)`);
/// `exp(x)` itself past 20, -1 below -18, `x` at +-0.
pub fn expm1(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let xc = f.clamp(b, x, -18.0, 21.0);
    let log2e = f.c(b, std::f64::consts::LOG2_E);
    let t = b.ins().fmul(xc, log2e);
    let n = b.ins().nearest(t);
    let ln2_hi = f.c(b, -LN2_HI);
    let ln2_lo = f.c(b, -LN2_LO);
    let r = f.fma(b, n, ln2_hi, xc);
    let r = f.fma(b, n, ln2_lo, r);
    let p = f.horner(
        b,
        r,
        &[
            1.0 / 362_880.0,
            1.0 / 40320.0,
            1.0 / 5040.0,
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
        ],
    );
    let r2 = b.ins().fmul(r, r);
    let em = f.fma(b, r2, p, r);
    let ni = b.ins().fcvt_to_sint_sat(f.ity(), n);
    let s = f.pow2i(b, ni);
    let nni = b.ins().ineg(ni);
    let inv_s = f.pow2i(b, nni);
    let one = f.c(b, 1.0);
    // k >= 0: 2^k (em + (1 - 2^-k)).
    let c_pos = b.ins().fsub(one, inv_s);
    let a = b.ins().fadd(em, c_pos);
    let pos = b.ins().fmul(a, s);
    // k < 0: 2^k em + (2^k - 1).
    let c_neg = b.ins().fsub(s, one);
    let neg = f.fma(b, em, s, c_neg);
    let zero = f.c(b, 0.0);
    let k_pos = f.fcmp(b, FloatCC::GreaterThanOrEqual, n, zero);
    let res = f.sel(b, k_pos, pos, neg);
    let twenty = f.c(b, 20.0);
    let big = f.fcmp(b, FloatCC::GreaterThan, x, twenty);
    let e = exp(b, f, x);
    let res = f.sel(b, big, e, res);
    let is_zero = f.fcmp(b, FloatCC::Equal, x, zero);
    let res = f.sel(b, is_zero, x, res);
    f.keep_nan(b, x, res)
}

/// `g(r) = (e^r - 1 - r) / r^2` on `|r| <= ln2/2`, lowest degree first: a least-squares fit
/// reweighted toward equal ripple (Lawson's iteration), 3.7e-9 relative in `e^r` with the
/// coefficients rounded to f32.
pub(crate) const EXP_TANH_G: [f64; 5] = [
    0.499_999_934_617_598_23,
    0.166_665_206_189_729_77,
    0.041_668_385_000_311_205,
    0.008_368_718_050_159_941,
    0.001_381_475_837_428_408_6,
];

/// `exp(2 a) + 1` for `a` in `[0, 9.1]`, tanh's exp form: `exp`'s reduction and polynomial,
/// but no clamp or NaN check (the caller clamps, and restores NaN) and the scale one normal
/// factor (`n` at most 26), built with `n` from one rounding: `2 a log2(e) + (1.5 2^23 + 128)`,
/// in `[2^23, 2^24)` where the float's unit is 1, is an integer whose low mantissa bits are
/// `n + 128`; shifted by 23 they are `2^(n+1)`'s exponent field, and subtracting the constant
/// back gives `n` exactly.
///
/// Its polynomial is `e^r = 1 + r + r^2 g(r)` with `g` the degree-4 fit `EXP_TANH_G` (3.7e-9
/// relative on `|r| <= ln2/2`, a sixteenth of an ulp: tanh needs less than `exp`'s degree-8
/// Taylor polynomial), evaluated in Estrin's scheme: a chain of four multiply-adds from `r`
/// instead of Horner's eight, the exp form being latency-bound.
///
/// The factors of 2 are in the constants: the reduction works on `h = r / 2` (`a - n ln2/2`),
/// the polynomial's coefficients are scaled so that it yields `(e^r) / 2` from `h`, and the
/// scale is `2^(n+1)` (the constant's bias 128), so `2 a`, `r` and `e^r` are never formed and
/// `e^r 2^n + 1` is one multiply-add. Every scaling is by a power of two, exact in this range,
/// so each rounding is the one the unscaled form would make, on a value half or twice as large;
/// the last step, `(1/2 + q) 2^(n+1) + 1`, is one multiply-add of `q` onto `2^n + 1` (exact up
/// to `n = 23`; above, `2 / (exp(2a) + 1)` is under 2^-23 and the result rounds to 1 or its
/// neighbour either way).
fn exp_tanh_plus_one(b: &mut FunctionBuilder, f: Fx, a: Value) -> Value {
    let two_log2e = f.c(b, 2.0 * std::f64::consts::LOG2_E);
    let magic = f.c(b, 12_582_912.0 + 128.0);
    let s = f.fma(b, a, two_log2e, magic);
    let n = b.ins().fsub(s, magic);
    let ln2_hi = f.c(b, -LN2_HI / 2.0);
    let ln2_lo = f.c(b, -LN2_LO / 2.0);
    let h = f.fma(b, n, ln2_hi, a);
    let h = f.fma(b, n, ln2_lo, h);
    // With r = 2h: g = lo + r^2 hi, lo = c0 + c1 r, hi = c2 + c3 r + c4 r^2; and
    // e^r / 2 = 1/2 + h + h^2 (2 g), 2 g = (2 c0 + 4 c1 h) + h^2 (8 c2 + 16 c3 h + 32 c4 h^2).
    let [c0, c1, c2, c3, c4] = EXP_TANH_G;
    let [c0, c1, c2, c3, c4] =
        [2.0 * c0, 4.0 * c1, 8.0 * c2, 16.0 * c3, 32.0 * c4].map(|c| f.c(b, c));
    let h2 = b.ins().fmul(h, h);
    let lo = f.fma(b, c1, h, c0);
    let hi = f.fma(b, c3, h, c2);
    let hi = f.fma(b, c4, h2, hi);
    let g2 = f.fma(b, hi, h2, lo);
    let q = f.fma(b, g2, h2, h);
    let bits = f.to_bits(b, s);
    let scale = b.ins().ishl_imm_s(bits, 23);
    let scale = f.bits_to_float(b, scale);
    // (1/2 + q) 2^(n+1) + 1 = q 2^(n+1) + (2^n + 1): the constant term is ready long before
    // `q`, and the sum is one rounding where `1/2 + q` would add a second.
    let half = f.c(b, 0.5);
    let one = f.c(b, 1.0);
    let k = f.fma(b, scale, half, one);
    f.fma(b, q, scale, k)
}

/// `tanh`'s `g`, from the highest power down: f32 values, fitted one at a time (each rounded
/// to f32 before the rest were fitted again), 4.5e-9 relative in tanh on the range.
pub(crate) const TANH_G: [f64; 5] = [
    -0.005_692_296_661_436_558,
    0.020_628_167_316_317_56,
    -0.053_736_515_343_189_24,
    0.133_314_058_184_623_72,
    -0.333_332_806_825_637_8,
];

/// `tanh(x)`: `x + x^3 g(x^2)` where `x^2` is below `0.625^2` (`g` a degree-4 minimax fit,
/// 4.5e-9 relative, in Estrin's scheme), `1 - 2 / (exp(2a) + 1)` on `a = abs(x)` above (no
/// cancellation: the subtracted term is at most 0.45), exactly 1 past 9.1; the sign of `x`
/// or-ed in last.
///
/// The polynomial runs on `x` itself: round-to-nearest is symmetric, so its value for `-x` is
/// the negation of its value for `x` bit for bit, and a vector of small lanes (most of them,
/// on a layer's pre-activations) needs no `abs` and no NaN check: `x^2 < 0.390625`
/// (exactly `0.625^2`, and true for `abs(x) < 0.625` exactly: the largest float below 0.625
/// squares to below it) is taken unordered, so a NaN lane takes the polynomial, which carries
/// the NaN. The one value the polynomial gets wrong is `-0` (`-0 + (+0)` is `+0`), which the
/// or-ed sign puts right. Below 2^-12 it rounds to `x` itself (its cubic term is under a
/// third of a half ulp), subnormals included.
pub fn tanh(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let x2 = b.ins().fmul(x, x);
    let [g4, g3, g2, g1, g0] = TANH_G.map(|c| f.c(b, c));
    let p01 = f.fma(b, g1, x2, g0);
    let p23 = f.fma(b, g3, x2, g2);
    let x4 = b.ins().fmul(x2, x2);
    let p24 = f.fma(b, g4, x4, p23);
    let g = f.fma(b, p24, x4, p01);
    let x3 = b.ins().fmul(x2, x);
    let small = f.fma(b, x3, g, x);
    let edge = f.c(b, 0.390_625);
    let is_small = f.fcmp(b, FloatCC::UnorderedOrLessThan, x2, edge);
    // The exp form (an exp and a division, most of the cost) runs only when some lane needs
    // it; each lane's value is its own branch's either way.
    let all_small = if f.vector() {
        b.ins().vall_true(is_small)
    } else {
        is_small
    };
    let large_block = b.create_block();
    let merge = b.create_block();
    b.append_block_param(merge, f.ty);
    b.ins().brif(
        all_small,
        merge,
        &[BlockArg::Value(small)],
        large_block,
        &[],
    );
    b.switch_to_block(large_block);
    b.seal_block(large_block);
    // Past 9.1 the exp form rounds to 1 exactly (2 / (exp(18.2) + 1) is under half an ulp
    // of 1), so clamping there saturates (a NaN lane, clamped or not, is not selected).
    let a = b.ins().fabs(x);
    let nine = f.c(b, 9.1);
    let below = f.fcmp(b, FloatCC::LessThan, a, nine);
    let ac = f.sel(b, below, a, nine);
    let den = exp_tanh_plus_one(b, f, ac);
    let two = f.c(b, 2.0);
    let t = b.ins().fdiv(two, den);
    let one = f.c(b, 1.0);
    let large = b.ins().fsub(one, t);
    let mixed = f.sel(b, is_small, small, large);
    b.ins().jump(merge, &[BlockArg::Value(mixed)]);
    b.switch_to_block(merge);
    b.seal_block(merge);
    // The exp form is non-negative and the polynomial has the sign of `x` but at `-0`: the
    // sign of `x` is or-ed in.
    let r = b.block_params(merge)[0];
    let rb = f.to_bits(b, r);
    let xb = f.to_bits(b, x);
    let sign = f.ci(b, i32::MIN);
    let sb = b.ins().band(xb, sign);
    let r = b.ins().bor(rb, sb);
    f.bits_to_float(b, r)
}

/// `logistic(x)`: with `e = exp(-abs(x))`, `1 / (1 + e)` for `x >= 0` and `e / (1 + e)`
/// below, so that large negative `x` gives `exp(x)` (down into the subnormals) instead of
/// `1 / inf`; the quotient corrected once for the roundings of `1 + e` and of the division.
pub fn logistic(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let ax = b.ins().fabs(x);
    let nx = b.ins().fneg(ax);
    let e = exp(b, f, nx);
    let one = f.c(b, 1.0);
    let den = b.ins().fadd(one, e);
    let zero = f.c(b, 0.0);
    let pos = f.fcmp(b, FloatCC::GreaterThanOrEqual, x, zero);
    let num = f.sel(b, pos, one, e);
    let q = b.ins().fdiv(num, den);
    // One correction step for the roundings of `1 + e` (its error `err` is exact, e <= 1)
    // and of the quotient (its residual is exact by FMA): num / (den + err) =
    // q + (num - q den - q err) / (den + err).
    let d1 = b.ins().fsub(den, one);
    let err = b.ins().fsub(e, d1);
    let nq = b.ins().fneg(q);
    let res = f.fma(b, nq, den, num);
    let qe = b.ins().fmul(q, err);
    let c = b.ins().fsub(res, qe);
    let c = b.ins().fdiv(c, den);
    let r = b.ins().fadd(q, c);
    f.keep_nan(b, x, r)
}

/// Inputs with `abs(x)` at most this take the inline path of `sin`/`cos`; a vector with any
/// lane above (or infinite) calls `tessera_sin_f32`/`tessera_cos_f32` for its lanes. Without
/// a native FMA the products `j pi/2` of the reduction would round, so there every input
/// past pi/4 takes the call.
pub const SIN_COS_INLINE_LIMIT: f32 = 8192.0;

/// `f(args)` lane by lane: one call for a scalar, four for an `f32x4`.
fn per_lane(b: &mut FunctionBuilder, f: Fx, func: FuncRef, args: &[Value]) -> Value {
    if !f.vector() {
        let call = b.ins().call(func, args);
        return b.inst_results(call)[0];
    }
    let mut out = args[0];
    for lane in 0..4u8 {
        let a: Vec<Value> = args.iter().map(|&v| b.ins().extractlane(v, lane)).collect();
        let call = b.ins().call(func, &a);
        let r = b.inst_results(call)[0];
        out = b.ins().insertlane(out, r, lane);
    }
    out
}

/// `sin(x)` (`cos` when `cos` is set). Inline for `abs(x) <= SIN_COS_INLINE_LIMIT`: j =
/// round(x 2/pi), `x - j pi/2` with pi/2 in three parts by fused multiply-adds (the first
/// product is exact, the remainder keeps its relative accuracy), Taylor polynomials of degree
/// 9 (sin) and 10 (cos) per quadrant. Larger or infinite inputs take `slow` (exact Payne-Hanek
/// reduction, `tessera_sin_f32`/`tessera_cos_f32`): per lane, for the whole vector.
pub fn sin_cos(b: &mut FunctionBuilder, f: Fx, x: Value, cos: bool, slow: FuncRef) -> Value {
    let two_over_pi = f.c(b, std::f64::consts::FRAC_2_PI);
    let t = b.ins().fmul(x, two_over_pi);
    let j = b.ins().nearest(t);
    let p1 = f.c(b, -1.570_796_370_506_286_6);
    let p2 = f.c(b, 4.371_139_000_186_24e-8);
    let p3 = f.c(b, 1.715_124_5e-15);
    let r = f.fma(b, j, p1, x);
    let r = f.fma(b, j, p2, r);
    let r = f.fma(b, j, p3, r);
    let r2 = b.ins().fmul(r, r);
    let sp = f.horner(
        b,
        r2,
        &[1.0 / 362_880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0],
    );
    let r3 = b.ins().fmul(r, r2);
    let s = f.fma(b, r3, sp, r);
    let c = f.horner(
        b,
        r2,
        &[
            -1.0 / 3_628_800.0,
            1.0 / 40320.0,
            -1.0 / 720.0,
            1.0 / 24.0,
            -0.5,
            1.0,
        ],
    );
    let q = b.ins().fcvt_to_sint_sat(f.ity(), j);
    let q = if cos {
        let one = f.ci(b, 1);
        b.ins().iadd(q, one)
    } else {
        q
    };
    let one = f.ci(b, 1);
    let two = f.ci(b, 2);
    let zero = f.ci(b, 0);
    let q1 = b.ins().band(q, one);
    let q2 = b.ins().band(q, two);
    let swap = b.ins().icmp(IntCC::NotEqual, q1, zero);
    let neg = b.ins().icmp(IntCC::NotEqual, q2, zero);
    let v = f.sel(b, swap, c, s);
    let nv = b.ins().fneg(v);
    let fast = f.sel(b, neg, nv, v);
    let fast = if cos {
        fast
    } else {
        // sin(-0) = -0 (the reduction computes 0 * p1 + -0 = +0).
        let fzero = f.c(b, 0.0);
        let z = f.fcmp(b, FloatCC::Equal, x, fzero);
        f.sel(b, z, x, fast)
    };
    let ax = b.ins().fabs(x);
    let limit = if f.fma {
        SIN_COS_INLINE_LIMIT as f64
    } else {
        std::f64::consts::FRAC_PI_4
    };
    let limit = f.c(b, limit);
    let big = f.fcmp(b, FloatCC::GreaterThan, ax, limit);
    let any_big = if f.vector() {
        b.ins().vany_true(big)
    } else {
        big
    };
    let slow_block = b.create_block();
    let merge = b.create_block();
    b.append_block_param(merge, f.ty);
    b.ins()
        .brif(any_big, slow_block, &[], merge, &[BlockArg::Value(fast)]);
    b.switch_to_block(slow_block);
    b.seal_block(slow_block);
    let v = per_lane(b, f, slow, &[x]);
    // Only the large lanes take the call's value: each element's result depends on it alone,
    // not on which other elements share its vector (so it is the same fused or alone).
    let v = f.sel(b, big, v, fast);
    b.ins().jump(merge, &[BlockArg::Value(v)]);
    b.switch_to_block(merge);
    b.seal_block(merge);
    b.block_params(merge)[0]
}

/// Bits 1..384 of the binary expansion of 2/pi, most significant first (2/pi =
/// 0.A2F9836E...; computed with 600-bit arithmetic).
const TWO_OVER_PI: [u64; 6] = [
    0xa2f9_836e_4e44_1529,
    0xfc27_57d1_f534_ddc0,
    0xdb62_9599_3c43_9041,
    0xfe51_63ab_debb_c561,
    0xb724_6e3a_424d_d2e0,
    0x0649_2eea_09d1_921c,
];

/// Bits `lo..lo + 128` of the 256-bit number `(hi, lo_word)` (`lo + 128 <= 256`).
fn bits128(hi: u128, low: u128, lo: u32) -> u128 {
    match lo {
        0 => low,
        128 => hi,
        1..=127 => (low >> lo) | (hi << (128 - lo)),
        _ => hi >> (lo - 128),
    }
}

/// Payne-Hanek reduction of a finite `x` with `abs(x) > pi/4`: `(q, r)` with
/// `abs(x) = (4k + q) pi/2 + r`, `q` in `0..4`, `abs(r) <= pi/4`, `r` to f64 accuracy.
///
/// `abs(x) = m 2^e` with `m` a 24-bit integer. Of `2/pi = sum b_i 2^-i`, the bits with
/// `i <= e - 2` only add multiples of 4 to `abs(x) 2/pi`, so the product is formed with the
/// 192 bits after them: `m * W` (216 bits, exact), whose bits above `F` are the quadrant and
/// whose next 128 bits are the fraction of a quarter turn. The 192-bit window leaves more than
/// 100 bits below the point, enough since no f32 comes closer than 2^-32 to a multiple of pi/2.
pub fn rem_pio2_f32(x: f32) -> (u32, f64) {
    let bits = x.abs().to_bits();
    let m = ((bits & 0x007f_ffff) | 0x0080_0000) as u64;
    let e = (bits >> 23) as i32 - 150;
    let skip = (e - 2).max(0) as usize;
    let (word, off) = (skip / 64, (skip % 64) as u32);
    let w: Vec<u64> = (0..3)
        .map(|i| {
            let a = TWO_OVER_PI[word + i];
            if off == 0 {
                a
            } else {
                (a << off) | (TWO_OVER_PI[word + i + 1] >> (64 - off))
            }
        })
        .collect();
    // P = m * (w0 w1 w2), limbs least significant first.
    let t = m as u128 * w[2] as u128;
    let l0 = t as u64;
    let t = m as u128 * w[1] as u128 + (t >> 64);
    let l1 = t as u64;
    let t = m as u128 * w[0] as u128 + (t >> 64);
    let low = ((l1 as u128) << 64) | l0 as u128;
    let hi = t;
    // abs(x) 2/pi mod 4 = P 2^(e - skip - 192): F fraction bits, 190 <= F <= 216.
    let frac_bits = (192 - (e - skip as i32)) as u32;
    let q = (bits128(hi, low, frac_bits) & 3) as u32;
    let frac = bits128(hi, low, frac_bits - 128);
    // A fraction of at least one half is read as (frac - 1), the next quadrant.
    let (q, f) = if frac >> 127 == 1 {
        ((q + 1) & 3, frac as i128)
    } else {
        (q, frac as i128)
    };
    let r = f as f64 * 2f64.powi(-128) * std::f64::consts::FRAC_PI_2;
    (q, r)
}

/// `sin` or `cos` of an f32 through exact reduction, in f64, rounded once.
fn sin_cos_exact(x: f32, cos: bool) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    let ax = x.abs();
    let (q, r) = if (ax as f64) <= std::f64::consts::FRAC_PI_4 {
        (0, ax as f64)
    } else {
        rem_pio2_f32(ax)
    };
    let q = (q + cos as u32) & 3;
    let v = match q {
        0 => r.sin(),
        1 => r.cos(),
        2 => -r.sin(),
        _ => -r.cos(),
    };
    let v = if x.is_sign_negative() && !cos { -v } else { v };
    v as f32
}

/// The slow path of compiled `sin`: called from generated code.
pub extern "C" fn tessera_sin_f32(x: f32) -> f32 {
    sin_cos_exact(x, false)
}

/// The slow path of compiled `cos`: called from generated code.
pub extern "C" fn tessera_cos_f32(x: f32) -> f32 {
    sin_cos_exact(x, true)
}

/// Compiled f32 `pow`: the interpreter's `pow` (in f64, rounded once), called per element.
pub extern "C" fn tessera_pow_f32(x: f32, y: f32) -> f32 {
    tessera_interp::scalar::pow_f32(x, y)
}

/// `erf(x)`: `x + x P(x^2)` below 0.84375 (`P` a degree-6 Chebyshev fit of erf(x)/x - 1,
/// 1.3e-10; tiny and subnormal `x` round once in `x P`, then the sum), the `erfc` form beyond.
pub fn erf(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let xc = f.clamp(b, x, -ERF_TAIL, ERF_TAIL);
    let z = b.ins().fmul(xc, xc);
    let p = f.horner(
        b,
        z,
        &[
            8.889_625_671_492_797e-5,
            -0.000_825_512_093_508_511_6,
            0.005_210_120_412_519_779,
            -0.026_862_768_421_686_375,
            0.112_837_516_396_649_17,
            -0.376_126_371_294_875_97,
            0.128_379_166_966_769_63,
        ],
    );
    let r = f.fma(b, xc, p, xc);
    let ax = b.ins().fabs(x);
    // From 0.84375 on (erf >= 0.77), 1 - exp(-x^2) h(abs(x)) with h = erfc(x) exp(x^2) as a
    // degree-12 Chebyshev fit in x - 2.381875 on [0.84375, 3.92] (3.8e-9); exp(-x^2)
    // corrected for the rounding of x^2 (exact by FMA); exactly +-1 past 3.92, where
    // erfc < 2^-25.
    let axc = f.clamp(b, ax, ERF_TAIL, 3.92);
    let m = f.c(b, ERF_MID);
    let t = b.ins().fsub(axc, m);
    let h = f.horner(b, t, &ERFC_FIT);
    let x2 = b.ins().fmul(axc, axc);
    let nx2 = b.ins().fneg(x2);
    let err = f.fma(b, axc, axc, nx2);
    let e = exp(b, f, nx2);
    let ee = b.ins().fmul(e, err);
    let e = b.ins().fsub(e, ee);
    let one = f.c(b, 1.0);
    let tail = b.ins().fmul(e, h);
    let big = b.ins().fsub(one, tail);
    let limit = f.c(b, 3.92);
    let sat = f.fcmp(b, FloatCC::GreaterThan, ax, limit);
    let big = f.sel(b, sat, one, big);
    let big = f.copysign(b, big, x);
    let start = f.c(b, ERF_TAIL);
    let in_tail = f.fcmp(b, FloatCC::GreaterThanOrEqual, ax, start);
    let r = f.sel(b, in_tail, big, r);
    f.keep_nan(b, x, r)
}

/// Where `erf` switches to its `erfc` form.
const ERF_TAIL: f64 = 0.84375;
/// The centre of the `erfc` fit (an f32).
const ERF_MID: f64 = 2.381_875_038_146_972_7;
/// `erfc(x) exp(x^2)` on [0.84375, 3.92], in powers of `x - ERF_MID`, highest first.
const ERFC_FIT: [f64; 13] = [
    1.560_676_374_090_245_3e-7,
    -6.340_173_928_610_99e-7,
    1.322_239_506_782_194e-6,
    -4.940_775_142_721_088e-6,
    2.148_211_071_520_090_8e-5,
    -7.747_332_047_760_051e-5,
    0.000_266_368_878_578_650_7,
    -0.000_901_159_455_063_438_4,
    0.002_948_165_760_777_556_4,
    -0.009_277_231_453_196_986,
    0.027_992_827_696_589_385,
    -0.080_590_885_277_303_28,
    0.219_950_300_515_622_8,
];

/// `erf_inv(x)`: XLA:CPU's f32 `erf_inv` with the same roundings, so it equals JAX's (and the
/// interpreter's `tessera_interp::scalar::erf_inv_f32`) bit for bit: Giles (2010) with XLA's
/// constants over XLA's own `log1p` and `log`, every multiply-add XLA's compiler contracts as
/// one `fma` (a separate multiply and add where FMA is not native, as LLVM does there), both
/// branches computed and selected, a subnormal result flushed to a zero of its sign (XLA:CPU
/// runs with flush-to-zero).
pub fn erf_inv(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    use tessera_interp::scalar::{GILES_GE_5 as GE_5, GILES_LT_5 as LT_5};
    /// An f32 constant from its bits.
    fn h(b: &mut FunctionBuilder, f: Fx, bits: u32) -> Value {
        f.c(b, f32::from_bits(bits) as f64)
    }
    /// Horner's scheme from the highest power down, `p * x + c` fused, f32 constants as bits.
    fn horner_bits(b: &mut FunctionBuilder, f: Fx, x: Value, c: &[u32]) -> Value {
        let mut p = h(b, f, c[0]);
        for &ci in &c[1..] {
            let cv = h(b, f, ci);
            p = f.fma(b, p, x, cv);
        }
        p
    }
    /// XLA's f32 `log(u)` (Cephes' `logf`), as `scalar::xla_log`.
    fn xla_log(b: &mut FunctionBuilder, f: Fx, u: Value) -> Value {
        let min_normal = h(b, f, 0x0080_0000);
        let normal = f.fcmp(b, FloatCC::GreaterThan, u, min_normal);
        let v = f.sel(b, normal, u, min_normal);
        let bits = f.to_bits(b, v);
        let mant_mask = f.ci(b, 0x807f_ffff_u32 as i32);
        let half_bits = f.ci(b, 0x3f00_0000);
        let mb = b.ins().band(bits, mant_mask);
        let mb = b.ins().bor(mb, half_bits);
        let m = f.bits_to_float(b, mb);
        let ebits = b.ins().ushr_imm_s(bits, 23);
        let bias = f.ci(b, 127);
        let ei = b.ins().isub(ebits, bias);
        let e = b.ins().fcvt_from_sint(f.ty, ei);
        let sqrt_half = h(b, f, 0x3f35_04f3);
        let below = f.fcmp(b, FloatCC::LessThan, m, sqrt_half);
        let one = f.c(b, 1.0);
        let zero = f.c(b, 0.0);
        let m1 = b.ins().fsub(m, one);
        let m_or_0 = f.sel(b, below, m, zero);
        let r = b.ins().fadd(m1, m_or_0);
        let e1 = b.ins().fadd(e, one);
        let one_or_0 = f.sel(b, below, one, zero);
        let e = b.ins().fsub(e1, one_or_0);
        let r2 = b.ins().fmul(r, r);
        let r3 = b.ins().fmul(r2, r);
        let a = horner_bits(b, f, r, &[0x3d90_21bb, 0xbdeb_d1b8, 0x3def_251a]);
        let bb = horner_bits(b, f, r, &[0xbdfe_5d4f, 0x3e11_e9bf, 0xbe2a_ae50]);
        let c = horner_bits(b, f, r, &[0x3e4c_ceac, 0xbe7f_fffc, 0x3eaa_aaaa]);
        let poly = f.fma(b, a, r3, bb);
        let poly = f.fma(b, poly, r3, c);
        let ln2_lo = h(b, f, 0xb95e_8083);
        let elo = b.ins().fmul(e, ln2_lo);
        let tail = f.fma(b, poly, r3, elo);
        let neg_half = f.c(b, -0.5);
        let head = f.fma(b, r2, neg_half, r);
        let sum = b.ins().fadd(head, tail);
        let ln2_hi = h(b, f, 0x3f31_8000);
        let res = f.fma(b, e, ln2_hi, sum);
        // +inf for +inf, -inf for 0, the all-ones NaN below 0 and for NaN.
        let nan = h(b, f, 0xffff_ffff);
        let positive = f.fcmp(b, FloatCC::GreaterThan, u, zero);
        let res = f.sel(b, positive, res, nan);
        let ninf = f.c(b, f64::NEG_INFINITY);
        let is_zero = f.fcmp(b, FloatCC::Equal, u, zero);
        let res = f.sel(b, is_zero, ninf, res);
        let inf = f.c(b, f64::INFINITY);
        let is_inf = f.fcmp(b, FloatCC::Equal, u, inf);
        f.sel(b, is_inf, inf, res)
    }
    /// XLA's f32 `log1p(x)`, as `scalar::xla_log1p`.
    fn xla_log1p(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
        let num = horner_bits(
            b,
            f,
            x,
            &[
                0x383d_e04b,
                0x3eff_40c5,
                0x40d2_84fa,
                0x41ef_4b9c,
                0x4273_cc76,
                0x4264_73ad,
                0x41a0_5101,
            ],
        );
        let den = horner_bits(
            b,
            f,
            x,
            &[
                0x3f80_0000,
                0x4171_01ad,
                0x42a6_185b,
                0x435d_c32d,
                0x439a_8ca3,
                0x4358_6d8a,
                0x4270_7982,
            ],
        );
        let ratio = b.ins().fdiv(num, den);
        let x2 = b.ins().fmul(x, x);
        let x3 = b.ins().fmul(x, x2);
        let t = b.ins().fmul(x3, ratio);
        let neg_half = f.c(b, -0.5);
        let s = f.fma(b, x2, neg_half, t);
        let small = b.ins().fadd(x, s);
        let one = f.c(b, 1.0);
        let u = b.ins().fadd(one, x);
        let large = xla_log(b, f, u);
        let ax = b.ins().fabs(x);
        let limit = h(b, f, 0x3ed4_13cd);
        let is_small = f.fcmp(b, FloatCC::LessThan, ax, limit);
        f.sel(b, is_small, small, large)
    }
    let nx = b.ins().fneg(x);
    let xx = b.ins().fmul(x, nx);
    let l = xla_log1p(b, f, xx);
    let minus_five = f.c(b, -5.0);
    let lt = f.fcmp(b, FloatCC::GreaterThan, l, minus_five);
    let minus_two5 = f.c(b, -2.5);
    let three = f.c(b, 3.0);
    let w1 = b.ins().fsub(minus_two5, l);
    let w = b.ins().fneg(l);
    let sw = b.ins().sqrt(w);
    let w2 = b.ins().fsub(sw, three);
    let wv = f.sel(b, lt, w1, w2);
    let c0a = f.c(b, LT_5[0] as f64);
    let c0b = f.c(b, GE_5[0] as f64);
    let mut p = f.sel(b, lt, c0a, c0b);
    for i in 1..9 {
        let ca = f.c(b, LT_5[i] as f64);
        let cb = f.c(b, GE_5[i] as f64);
        let c = f.sel(b, lt, ca, cb);
        p = f.fma(b, p, wv, c);
    }
    let ax = b.ins().fabs(x);
    let one = f.c(b, 1.0);
    let edge = f.fcmp(b, FloatCC::Equal, ax, one);
    let inf = f.c(b, f64::INFINITY);
    let p = f.sel(b, edge, inf, p);
    let r = b.ins().fmul(x, p);
    // XLA:CPU flushes subnormal results to zero (keeping the sign).
    let ar = b.ins().fabs(r);
    let min_normal = h(b, f, 0x0080_0000);
    let tiny = f.fcmp(b, FloatCC::LessThan, ar, min_normal);
    let zero = f.c(b, 0.0);
    let signed_zero = b.ins().fmul(r, zero);
    f.sel(b, tiny, signed_zero, r)
}

/// `round` (half away from zero), exact for any float type.
pub fn round_exact(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let zero = f.c(b, 0.0);
    let one = f.c(b, 1.0);
    let t = b.ins().trunc(x);
    let d = b.ins().fsub(x, t);
    let ad = b.ins().fabs(d);
    let half = f.c(b, 0.5);
    let up = f.fcmp(b, FloatCC::GreaterThanOrEqual, ad, half);
    let m1 = f.c(b, -1.0);
    let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
    let s = f.sel(b, neg, m1, one);
    // `t` itself unless rounding away: round(-0.4) = -0 (`-0 + 0` would be +0).
    let away = b.ins().fadd(t, s);
    f.sel(b, up, away, t)
}

/// `sign`: -1, +1, or `x` itself for +-0 and NaN, exact for any float type.
pub fn sign_exact(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let zero = f.c(b, 0.0);
    let one = f.c(b, 1.0);
    let m1 = f.c(b, -1.0);
    let pos = f.fcmp(b, FloatCC::GreaterThan, x, zero);
    let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
    let r = f.sel(b, neg, m1, x);
    f.sel(b, pos, one, r)
}

/// Every f32 unary op, scalar or vector.
pub fn unary_f32(
    b: &mut FunctionBuilder,
    f: Fx,
    u: UnaryOp,
    x: Value,
    calls: &mut dyn Callees,
) -> Value {
    match u {
        UnaryOp::Neg => b.ins().fneg(x),
        UnaryOp::Abs => b.ins().fabs(x),
        UnaryOp::Sign => sign_exact(b, f, x),
        UnaryOp::Round => round_exact(b, f, x),
        UnaryOp::Exp => exp(b, f, x),
        UnaryOp::Log => log(b, f, x),
        UnaryOp::Log1p => log1p(b, f, x),
        UnaryOp::Expm1 => expm1(b, f, x),
        UnaryOp::Tanh => tanh(b, f, x),
        UnaryOp::Logistic => logistic(b, f, x),
        UnaryOp::Sin => {
            let sin = calls.get(b.func, Callee::Sin);
            sin_cos(b, f, x, false, sin)
        }
        UnaryOp::Cos => {
            let cos = calls.get(b.func, Callee::Cos);
            sin_cos(b, f, x, true, cos)
        }
        UnaryOp::Sqrt => b.ins().sqrt(x),
        UnaryOp::Rsqrt => {
            let s = b.ins().sqrt(x);
            let one = f.c(b, 1.0);
            b.ins().fdiv(one, s)
        }
        UnaryOp::Floor => b.ins().floor(x),
        UnaryOp::Ceil => b.ins().ceil(x),
        UnaryOp::Erf => erf(b, f, x),
        UnaryOp::ErfInv => erf_inv(b, f, x),
        // The type rule admits `not` for integers and bool only.
        UnaryOp::Not => x,
        UnaryOp::Tan => libm(b, f, calls, Libm::Tan, x),
        UnaryOp::Asin => libm(b, f, calls, Libm::Asin, x),
        UnaryOp::Acos => libm(b, f, calls, Libm::Acos, x),
        UnaryOp::Atan => libm(b, f, calls, Libm::Atan, x),
        UnaryOp::Sinh => libm(b, f, calls, Libm::Sinh, x),
        UnaryOp::Cosh => libm(b, f, calls, Libm::Cosh, x),
        UnaryOp::Asinh => libm(b, f, calls, Libm::Asinh, x),
        UnaryOp::Acosh => libm(b, f, calls, Libm::Acosh, x),
        UnaryOp::Atanh => libm(b, f, calls, Libm::Atanh, x),
        UnaryOp::Exp2 => libm(b, f, calls, Libm::Exp2, x),
    }
}

/// A function generated f32 code calls: a slow path of `sin`/`cos`, `pow`, `atan2`, or a
/// libm-computed function (`elem.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Callee {
    Sin,
    Cos,
    Pow,
    Atan2,
    Libm(Libm),
}

impl Callee {
    /// The symbol `lower.rs` registers for it, and its arity (f32 arguments, one f32 result).
    pub fn symbol(self) -> (&'static str, usize) {
        match self {
            Callee::Sin => ("tessera_sin_f32", 1),
            Callee::Cos => ("tessera_cos_f32", 1),
            Callee::Pow => ("tessera_pow_f32", 2),
            Callee::Atan2 => ("tessera_atan2_f32", 2),
            Callee::Libm(l) => (crate::elem::symbols(l).0, 1),
        }
    }
}

/// The functions one function being built may call, each imported into it the first time
/// the lowering asks for it (`lower.rs`): a kernel that calls nothing declares nothing, where
/// importing every callee up front gave each f32 kernel fourteen signatures for Cranelift to
/// lay out.
pub trait Callees {
    /// `c`, imported into `func` (once: a second request returns the same reference).
    fn get(&mut self, func: &mut Function, c: Callee) -> FuncRef;
}

/// `l` per lane, through its libm-computed function.
fn libm(b: &mut FunctionBuilder, f: Fx, calls: &mut dyn Callees, l: Libm, x: Value) -> Value {
    let func = calls.get(b.func, Callee::Libm(l));
    per_lane(b, f, func, &[x])
}

/// `x ** y` for f32: `tessera_pow_f32` per element (f64 `pow` rounded once: every C99 Annex F
/// special case, subnormals kept, within 0.5 ulp plus the f64 error).
pub fn pow(b: &mut FunctionBuilder, f: Fx, x: Value, y: Value, func: FuncRef) -> Value {
    per_lane(b, f, func, &[x, y])
}

/// The f32 binary ops, scalar or vector (`rem` goes through a call, see `lower.rs`).
pub fn binary_f32(
    b: &mut FunctionBuilder,
    f: Fx,
    op: BinaryOp,
    x: Value,
    y: Value,
    calls: &mut dyn Callees,
) -> Value {
    match op {
        BinaryOp::Add => b.ins().fadd(x, y),
        BinaryOp::Sub => b.ins().fsub(x, y),
        BinaryOp::Mul => b.ins().fmul(x, y),
        BinaryOp::Div => b.ins().fdiv(x, y),
        BinaryOp::Max => b.ins().fmax(x, y),
        BinaryOp::Min => b.ins().fmin(x, y),
        BinaryOp::Pow => {
            let func = calls.get(b.func, Callee::Pow);
            pow(b, f, x, y, func)
        }
        BinaryOp::Atan2 => {
            let func = calls.get(b.func, Callee::Atan2);
            per_lane(b, f, func, &[x, y])
        }
        // Not reachable for floats (the type rule), and `rem` is lowered before this.
        BinaryOp::Rem
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => x,
    }
}
