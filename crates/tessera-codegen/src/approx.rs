//! Inline approximations of the f32 elementwise functions, written once for scalars (`f32`) and
//! vectors (`f32x4`): no call per element. The maximum errors stated here are measured by
//! `tests/approx.rs` against f64 references over the ranges it names.
//!
//! | function | method | stated bound (measured) |
//! | --- | --- | --- |
//! | exp | n = round(x log2 e), Cody-Waite reduction, degree-7 Taylor, 2^n by exponent bits; x < -87.34 flushes to 0 | 2e-7 relative (7.0e-8) on [-87, 88] |
//! | log | x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1)) to s^9 | 3e-7 relative, absolute below 0.3 (1.9e-7) |
//! | log1p | Goldberg: log(u) x / (u - 1), u = 1 + x | 3e-7 relative (2.1e-7) on [-0.99, 10] |
//! | expm1 | Kahan: (u - 1) x / log(u), u = exp(x) | 3e-7 relative (2.1e-7) on [-20, 20] |
//! | tanh | Eigen's rational 13/6 on x clamped to 7.9 (so abs(tanh) <= 1 - 2.4e-7) | 3e-7 absolute (2.4e-7) |
//! | logistic | 1 / (1 + exp(-x)) | 2e-7 relative (1.4e-7) on [-80, 80] |
//! | sin, cos | round(x 2/pi), 3-part Cody-Waite, degree-9/8 Taylor per quadrant | 1e-7 absolute (7.6e-8) on [-100, 100] |
//! | erf | Eigen's rational 13/8 on x clamped to [-4, 4] | 4e-7 absolute (3.3e-7) |
//! | erf_inv | Giles (2010) over XLA's own log1p, XLA:CPU's roundings: bit for bit JAX's (`tessera/tests/prng.rs`) | 4e-6 relative (3.4e-6) on [-0.9999, 0.9999] |
//! | pow | exp(y log abs(x)), sign for integer y | grows with abs(y log x); checked within 1e-5 on the corpus |

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, I32, I32X4};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
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
}

/// `exp(x)` (see the module table).
pub fn exp(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let lo = f.c(b, -87.336_54);
    let xc = f.clamp(b, x, -87.336_54, 88.376_26);
    let log2e = f.c(b, std::f64::consts::LOG2_E);
    let t = b.ins().fmul(xc, log2e);
    let n = b.ins().nearest(t);
    let ln2_hi = f.c(b, -0.693_145_75);
    let ln2_lo = f.c(b, -1.428_606_8e-6);
    let r = f.fma(b, n, ln2_hi, xc);
    let r = f.fma(b, n, ln2_lo, r);
    let p = f.horner(
        b,
        r,
        &[
            1.0 / 5040.0,
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ],
    );
    let ni = b.ins().fcvt_to_sint_sat(f.ity(), n);
    let bias = f.ci(b, 127);
    let e = b.ins().iadd(ni, bias);
    let e = b.ins().ishl_imm_s(e, 23);
    let scale = f.bits_to_float(b, e);
    let res = b.ins().fmul(p, scale);
    let inf = f.c(b, f64::INFINITY);
    let limit = f.c(b, 88.722_84);
    let over = f.fcmp(b, FloatCC::GreaterThan, x, limit);
    let res = f.sel(b, over, inf, res);
    let under = f.fcmp(b, FloatCC::LessThan, x, lo);
    let zero = f.c(b, 0.0);
    let res = f.sel(b, under, zero, res);
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
    let p = f.horner(b, s2, &[2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0, 2.0]);
    let logm = b.ins().fmul(s, p);
    let ln2_hi = f.c(b, 0.693_145_75);
    let ln2_lo = f.c(b, 1.428_606_8e-6);
    let lo_part = f.fma(b, ef, ln2_lo, logm);
    let res = f.fma(b, ef, ln2_hi, lo_part);
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

/// `log1p(x) = log(u) * x / (u - 1)` with `u = 1 + x` (Goldberg), `x` where `u == 1`.
pub fn log1p(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let one = f.c(b, 1.0);
    let u = b.ins().fadd(one, x);
    let d = b.ins().fsub(u, one);
    let l = log(b, f, u);
    let q = b.ins().fdiv(x, d);
    let r = b.ins().fmul(l, q);
    let tiny = f.fcmp(b, FloatCC::Equal, u, one);
    f.sel(b, tiny, x, r)
}

/// `expm1(x) = (u - 1) * x / log(u)` with `u = exp(x)` (Kahan).
pub fn expm1(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let u = exp(b, f, x);
    let one = f.c(b, 1.0);
    let d = b.ins().fsub(u, one);
    let l = log(b, f, u);
    let t = b.ins().fmul(d, x);
    let r = b.ins().fdiv(t, l);
    let m1 = f.c(b, -1.0);
    let is_m1 = f.fcmp(b, FloatCC::Equal, d, m1);
    let r = f.sel(b, is_m1, m1, r);
    let inf = f.c(b, f64::INFINITY);
    let is_inf = f.fcmp(b, FloatCC::Equal, u, inf);
    let r = f.sel(b, is_inf, inf, r);
    let tiny = f.fcmp(b, FloatCC::Equal, u, one);
    f.sel(b, tiny, x, r)
}

/// `tanh(x)`: Eigen's rational approximation.
pub fn tanh(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let xc = f.clamp(b, x, -7.905_311_107_635_498, 7.905_311_107_635_498);
    let x2 = b.ins().fmul(xc, xc);
    let p = f.horner(
        b,
        x2,
        &[
            -2.760_768_477_423_55e-16,
            2.000_187_904_824_77e-13,
            -8.604_671_522_137_35e-11,
            5.122_297_090_371_14e-8,
            1.485_722_357_179_79e-5,
            6.372_619_288_754_36e-4,
            4.893_524_558_917_86e-3,
        ],
    );
    let p = b.ins().fmul(p, xc);
    let q = f.horner(
        b,
        x2,
        &[
            1.198_258_394_667_02e-6,
            1.185_347_056_866_54e-4,
            2.268_434_632_439e-3,
            4.893_525_185_543_85e-3,
        ],
    );
    let r = b.ins().fdiv(p, q);
    f.keep_nan(b, x, r)
}

/// `1 / (1 + exp(-x))`.
pub fn logistic(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let nx = b.ins().fneg(x);
    let e = exp(b, f, nx);
    let one = f.c(b, 1.0);
    let den = b.ins().fadd(one, e);
    b.ins().fdiv(one, den)
}

/// `sin(x)` (`cos` when `cos` is set): reduction by pi/2, a polynomial per quadrant.
pub fn sin_cos(b: &mut FunctionBuilder, f: Fx, x: Value, cos: bool) -> Value {
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
    let c = f.horner(b, r2, &[1.0 / 40320.0, -1.0 / 720.0, 1.0 / 24.0, -0.5, 1.0]);
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
    f.sel(b, neg, nv, v)
}

/// `erf(x)`: Eigen's rational approximation on x clamped to [-4, 4].
pub fn erf(b: &mut FunctionBuilder, f: Fx, x: Value) -> Value {
    let xc = f.clamp(b, x, -4.0, 4.0);
    let x2 = b.ins().fmul(xc, xc);
    let p = f.horner(
        b,
        x2,
        &[
            -2.726_142_258_013_06e-10,
            2.770_681_424_959_02e-8,
            -2.101_024_020_825_08e-6,
            -5.692_506_394_623_46e-5,
            -7.349_906_303_268_55e-4,
            -2.954_599_808_540_25e-3,
            -1.609_603_332_624_15e-2,
        ],
    );
    let p = b.ins().fmul(p, xc);
    let q = f.horner(
        b,
        x2,
        &[
            -1.456_607_184_649_96e-5,
            -2.133_740_552_789_05e-4,
            -1.682_826_974_382_03e-3,
            -7.373_329_167_204_68e-3,
            -1.426_473_905_141_89e-2,
        ],
    );
    let r = b.ins().fdiv(p, q);
    f.keep_nan(b, x, r)
}

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

/// `round` (half away from zero) and `sign`, exact for any float type.
pub fn unary_exact(b: &mut FunctionBuilder, f: Fx, u: UnaryOp, x: Value) -> Value {
    let zero = f.c(b, 0.0);
    let one = f.c(b, 1.0);
    match u {
        UnaryOp::Round => {
            let t = b.ins().trunc(x);
            let d = b.ins().fsub(x, t);
            let ad = b.ins().fabs(d);
            let half = f.c(b, 0.5);
            let up = f.fcmp(b, FloatCC::GreaterThanOrEqual, ad, half);
            let m1 = f.c(b, -1.0);
            let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
            let s = f.sel(b, neg, m1, one);
            let adj = f.sel(b, up, s, zero);
            b.ins().fadd(t, adj)
        }
        _ => {
            let m1 = f.c(b, -1.0);
            let pos = f.fcmp(b, FloatCC::GreaterThan, x, zero);
            let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
            let r = f.sel(b, neg, m1, x);
            f.sel(b, pos, one, r)
        }
    }
}

/// Every f32 unary op, scalar or vector.
pub fn unary_f32(b: &mut FunctionBuilder, f: Fx, u: UnaryOp, x: Value) -> Value {
    match u {
        UnaryOp::Neg => b.ins().fneg(x),
        UnaryOp::Abs => b.ins().fabs(x),
        UnaryOp::Sign | UnaryOp::Round => unary_exact(b, f, u, x),
        UnaryOp::Exp => exp(b, f, x),
        UnaryOp::Log => log(b, f, x),
        UnaryOp::Log1p => log1p(b, f, x),
        UnaryOp::Expm1 => expm1(b, f, x),
        UnaryOp::Tanh => tanh(b, f, x),
        UnaryOp::Logistic => logistic(b, f, x),
        UnaryOp::Sin => sin_cos(b, f, x, false),
        UnaryOp::Cos => sin_cos(b, f, x, true),
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
    }
}

/// `x ** y` for f32 (see the module table).
pub fn pow(b: &mut FunctionBuilder, f: Fx, x: Value, y: Value) -> Value {
    let ax = b.ins().fabs(x);
    let l = log(b, f, ax);
    let yl = b.ins().fmul(y, l);
    let r = exp(b, f, yl);
    let ty = b.ins().trunc(y);
    let yi = f.fcmp(b, FloatCC::Equal, ty, y);
    let half = f.c(b, 0.5);
    let hy = b.ins().fmul(y, half);
    let thy = b.ins().trunc(hy);
    let odd_h = f.fcmp(b, FloatCC::NotEqual, thy, hy);
    let odd = b.ins().band(yi, odd_h);
    let nr = b.ins().fneg(r);
    let signed = f.sel(b, odd, nr, r);
    let nan = f.c(b, f64::NAN);
    let neg_case = f.sel(b, yi, signed, nan);
    let zero = f.c(b, 0.0);
    let neg = f.fcmp(b, FloatCC::LessThan, x, zero);
    let r = f.sel(b, neg, neg_case, r);
    let one = f.c(b, 1.0);
    let y0 = f.fcmp(b, FloatCC::Equal, y, zero);
    let r = f.sel(b, y0, one, r);
    let x1 = f.fcmp(b, FloatCC::Equal, x, one);
    f.sel(b, x1, one, r)
}

/// The f32 binary ops, scalar or vector (`rem` goes through a call, see `lower.rs`).
pub fn binary_f32(b: &mut FunctionBuilder, f: Fx, op: BinaryOp, x: Value, y: Value) -> Value {
    match op {
        BinaryOp::Add => b.ins().fadd(x, y),
        BinaryOp::Sub => b.ins().fsub(x, y),
        BinaryOp::Mul => b.ins().fmul(x, y),
        BinaryOp::Div => b.ins().fdiv(x, y),
        BinaryOp::Max => b.ins().fmax(x, y),
        BinaryOp::Min => b.ins().fmin(x, y),
        BinaryOp::Pow => pow(b, f, x, y),
        // Not reachable for floats (the type rule), and `rem` is lowered before this.
        BinaryOp::Rem
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical => x,
    }
}
