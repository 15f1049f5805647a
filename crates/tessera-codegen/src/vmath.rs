//! f32 `tanh` over whole rows at the host's full vector width, for the kernels whose last
//! operation it is (a dense layer's `tanh(x @ w + b)`): Cranelift emits 128-bit vectors only
//! (`CRANELIFT.md`), where tanh's exp form is compute-bound, so such a kernel computes its
//! argument into its output and `Executable::run_kernel` applies `tanh_in_place` to the rows
//! each thread just wrote, still in that core's cache (`split_tail`).
//!
//! The functions here are `approx::tanh` instruction for instruction (the same constants, the
//! same multiply-adds, the same compares and selects), on 16 lanes (AVX-512F) or 8 (AVX2 and
//! FMA) instead of 4: every lane is computed alone, so each result has the bits the generated
//! code gives it (`tests` compare them over every binade, the specials and the branch edges).
//! They are used only where the generated code's `fma` is one rounding too
//! (`lower::host_has_fma`); elsewhere the kernel keeps its tanh.

use tessera_ir::{DType, UnaryOp};

use crate::kernel::{Expr, Kernel};

/// A function applied in place to a kernel's output rows after the kernel ran on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// f32 `tanh` at 16 lanes (AVX-512F).
    Tanh16,
    /// f32 `tanh` at 8 lanes (AVX2 and FMA).
    Tanh8,
}

impl Tail {
    /// The widest form the host runs, if the generated code's `fma` is fused there (so the
    /// bits agree), and `TESSERA_NO_VMATH` is unset (to measure the kernels' own tanh).
    pub(crate) fn tanh() -> Option<Tail> {
        #[cfg(target_arch = "x86_64")]
        {
            if !crate::lower::host_has_fma() || std::env::var_os("TESSERA_NO_VMATH").is_some() {
                return None;
            }
            if std::is_x86_feature_detected!("avx512f") {
                return Some(Tail::Tanh16);
            }
            if std::is_x86_feature_detected!("avx2") {
                return Some(Tail::Tanh8);
            }
        }
        None
    }

    /// Applies the function to `x` in place.
    pub(crate) fn apply(self, x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        match self {
            // SAFETY: `Tail::tanh` returns `Tanh16` only where AVX-512F is detected, and
            // `Tanh8` only where AVX2 and FMA are (`host_has_fma`); the functions stay inside
            // `x`.
            Tail::Tanh16 => unsafe { x86::tanh_in_place_16(x) },
            // SAFETY: as above.
            Tail::Tanh8 => unsafe { x86::tanh_in_place_8(x) },
        }
        #[cfg(not(target_arch = "x86_64"))]
        match self {
            Tail::Tanh16 | Tail::Tanh8 => unreachable!("`Tail::tanh` is None off x86_64"),
        }
    }
}

/// `k` without its last operation and that operation as a tail, when it is an f32 `tanh` of
/// an elementwise kernel (no reduction, scatter or scan: the output is written once, densely,
/// row by row) and the host has a tail for it; else `k` as it is.
pub(crate) fn split_tail(k: &Kernel, tail: Option<Tail>) -> (Kernel, Option<Tail>) {
    let plain = k.reduce.is_none() && k.scatter.is_none() && k.scan.is_none();
    match (&k.body, tail) {
        (Expr::Unary(UnaryOp::Tanh, DType::F32, x), Some(t))
            if plain && k.out_dtype == DType::F32 =>
        {
            let mut inner = k.clone();
            inner.body = (**x).clone();
            (inner, Some(t))
        }
        // tidy: allow-wildcard(one op has a tail: every other body keeps its kernel as it is)
        _ => (k.clone(), None),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::approx::{EXP_TANH_G, LN2_HI, LN2_LO, TANH_G};

    /// The constants of `approx::tanh`, rounded to f32 as `Fx::c` rounds them.
    struct K {
        two_log2e: f32,
        magic: f32,
        ln2_hi: f32,
        ln2_lo: f32,
        /// `EXP_TANH_G` scaled by 2, 4, 8, 16, 32.
        e: [f32; 5],
        /// `TANH_G`, from the highest power down.
        g: [f32; 5],
    }

    const C: K = K {
        two_log2e: (2.0 * std::f64::consts::LOG2_E) as f32,
        magic: (12_582_912.0 + 128.0) as f32,
        ln2_hi: (-LN2_HI / 2.0) as f32,
        ln2_lo: (-LN2_LO / 2.0) as f32,
        e: [
            (2.0 * EXP_TANH_G[0]) as f32,
            (4.0 * EXP_TANH_G[1]) as f32,
            (8.0 * EXP_TANH_G[2]) as f32,
            (16.0 * EXP_TANH_G[3]) as f32,
            (32.0 * EXP_TANH_G[4]) as f32,
        ],
        g: [
            TANH_G[0] as f32,
            TANH_G[1] as f32,
            TANH_G[2] as f32,
            TANH_G[3] as f32,
            TANH_G[4] as f32,
        ],
    };

    /// One body for both widths: `$v` the vector type, and its operations.
    macro_rules! tanh_body {
        ($x:expr, $set1:ident, $fma:ident, $mul:ident, $sub:ident, $div:ident,
         $abs:expr, $small_mask:expr, $all:expr, $lt:expr, $blend:expr, $shl23:expr,
         $or_sign:expr) => {{
            let x = $x;
            let c = |v: f32| $set1(v);
            let x2 = $mul(x, x);
            let [g4, g3, g2, g1, g0] = C.g;
            let p01 = $fma(c(g1), x2, c(g0));
            let p23 = $fma(c(g3), x2, c(g2));
            let x4 = $mul(x2, x2);
            let p24 = $fma(c(g4), x4, p23);
            let g = $fma(p24, x4, p01);
            let x3 = $mul(x2, x);
            let small = $fma(x3, g, x);
            let is_small = $small_mask(x2, c(0.390_625));
            let r = if $all(is_small) {
                small
            } else {
                let a = $abs(x);
                let nine = c(9.1);
                let below = $lt(a, nine);
                let ac = $blend(below, a, nine);
                // exp(2 ac) + 1 (`approx::exp_tanh_plus_one`).
                let magic = c(C.magic);
                let s = $fma(ac, c(C.two_log2e), magic);
                let n = $sub(s, magic);
                let h = $fma(n, c(C.ln2_hi), ac);
                let h = $fma(n, c(C.ln2_lo), h);
                let [c0, c1, c2, c3, c4] = C.e;
                let h2 = $mul(h, h);
                let lo = $fma(c(c1), h, c(c0));
                let hi = $fma(c(c3), h, c(c2));
                let hi = $fma(c(c4), h2, hi);
                let g2 = $fma(hi, h2, lo);
                let q = $fma(g2, h2, h);
                let scale = $shl23(s);
                let k = $fma(scale, c(0.5), c(1.0));
                let den = $fma(q, scale, k);
                let t = $div(c(2.0), den);
                let large = $sub(c(1.0), t);
                $blend(is_small, small, large)
            };
            $or_sign(r, x)
        }};
    }

    /// `approx::tanh` on 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn tanh16(x: __m512) -> __m512 {
        let bits = _mm512_castps_si512;
        let float = _mm512_castsi512_ps;
        tanh_body!(
            x,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_mul_ps,
            _mm512_sub_ps,
            _mm512_div_ps,
            |v: __m512| float(_mm512_and_si512(bits(v), _mm512_set1_epi32(i32::MAX))),
            // Unordered or less than (Cranelift's `UnorderedOrLessThan`): not >=.
            |a, b| _mm512_cmp_ps_mask::<_CMP_NGE_UQ>(a, b),
            |m: __mmask16| m == u16::MAX,
            |a, b| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b),
            // `m ? a : o`.
            |m, a, o| _mm512_mask_blend_ps(m, o, a),
            |s: __m512| float(_mm512_slli_epi32::<23>(bits(s))),
            |r: __m512, x: __m512| float(_mm512_or_si512(
                bits(r),
                _mm512_and_si512(bits(x), _mm512_set1_epi32(i32::MIN))
            ))
        )
    }

    /// `approx::tanh` on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn tanh8(x: __m256) -> __m256 {
        let bits = _mm256_castps_si256;
        let float = _mm256_castsi256_ps;
        tanh_body!(
            x,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_mul_ps,
            _mm256_sub_ps,
            _mm256_div_ps,
            |v: __m256| float(_mm256_and_si256(bits(v), _mm256_set1_epi32(i32::MAX))),
            |a, b| _mm256_cmp_ps::<_CMP_NGE_UQ>(a, b),
            |m: __m256| _mm256_movemask_ps(m) == 0xff,
            |a, b| _mm256_cmp_ps::<_CMP_LT_OQ>(a, b),
            // `m ? a : o`: a whole-lane mask, so blendv's sign-bit test is the lane's.
            |m, a, o| _mm256_blendv_ps(o, a, m),
            |s: __m256| float(_mm256_slli_epi32::<23>(bits(s))),
            |r: __m256, x: __m256| float(_mm256_or_si256(
                bits(r),
                _mm256_and_si256(bits(x), _mm256_set1_epi32(i32::MIN))
            ))
        )
    }

    /// `tanh` of every element of `x`, in place, 16 at a time (the last few under a mask).
    ///
    /// # Safety
    /// The host has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tanh_in_place_16(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: 16 values of `c`, read and written unaligned.
            unsafe {
                let v = _mm512_loadu_ps(c.as_ptr());
                _mm512_storeu_ps(c.as_mut_ptr(), tanh16(v));
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let m: __mmask16 = ((1u32 << rest.len()) - 1) as u16;
            // SAFETY: the masked lanes are the `rest.len() < 16` values of `rest`; the others
            // are neither read nor written.
            unsafe {
                let v = _mm512_maskz_loadu_ps(m, rest.as_ptr());
                _mm512_mask_storeu_ps(rest.as_mut_ptr(), m, tanh16(v));
            }
        }
    }

    /// `tanh` of every element of `x`, in place, 8 at a time (the last few through a copy).
    ///
    /// # Safety
    /// The host has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tanh_in_place_8(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: 8 values of `c`, read and written unaligned.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(c.as_mut_ptr(), tanh8(v));
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut lanes = [0f32; 8];
            lanes[..rest.len()].copy_from_slice(rest);
            // SAFETY: `lanes` holds 8 values.
            unsafe {
                let v = _mm256_loadu_ps(lanes.as_ptr());
                _mm256_storeu_ps(lanes.as_mut_ptr(), tanh8(v));
            }
            let n = rest.len();
            rest.copy_from_slice(&lanes[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::StepKind;
    use tessera_ir::{Graph, Op, TensorType};

    /// The kernel of `tanh(x)` over `n` f32 values, as fusion makes it.
    fn tanh_kernel(n: usize) -> Kernel {
        let mut g = Graph::new("tanh");
        let x = g.add_param(TensorType::new(DType::F32, vec![n]));
        let y = g.add(Op::Unary(UnaryOp::Tanh), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let mut kernels = crate::fusion::fuse(&g).steps.into_iter().map(|s| s.kind);
        match kernels.next() {
            Some(StepKind::Kernel(k)) => k,
            _ => panic!("tanh(x) is one kernel"),
        }
    }

    /// Inputs at every binade of both signs, around the branch edges (0.625, 9.1) and the
    /// specials, NaNs with payloads included.
    fn inputs() -> Vec<f32> {
        let mut xs = Vec::new();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for sign in [0u32, 1] {
            for e in 0..=255u32 {
                for _ in 0..40 {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let m = (s >> 41) as u32 & 0x007f_ffff;
                    xs.push(f32::from_bits((sign << 31) | (e << 23) | m));
                }
            }
        }
        for edge in [0.625f32, 9.1, 2f32.powi(-12)] {
            let b = edge.to_bits();
            for d in 0..64u32 {
                for v in [b - 32 + d, b + d] {
                    xs.push(f32::from_bits(v));
                    xs.push(-f32::from_bits(v));
                }
            }
        }
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ]);
        xs.push(f32::from_bits(0x7fc0_1234));
        xs
    }

    /// Every tail the host runs gives each input the bits the generated kernel's own tanh
    /// gives it, at lengths that leave every remainder; compiled programs get the widest
    /// (the CI hosts, Zen 3 AVX2, AVX-512 Zen 4/5 and Xeons, all have one).
    #[test]
    fn the_tails_give_the_generated_codes_bits() {
        let tails: Vec<Tail> = [Tail::Tanh16, Tail::Tanh8]
            .into_iter()
            .filter(|t| match t {
                Tail::Tanh16 => std::is_x86_feature_detected!("avx512f"),
                Tail::Tanh8 => std::is_x86_feature_detected!("avx2"),
            })
            .filter(|_| crate::lower::host_has_fma())
            .collect();
        // The tail compiled programs get is the widest the host runs (none without fused
        // multiply-adds in the generated code, or with `TESSERA_NO_VMATH`).
        let off = std::env::var_os("TESSERA_NO_VMATH").is_some();
        assert_eq!(Tail::tanh(), tails.first().copied().filter(|_| !off));
        let xs = inputs();
        let n = xs.len();
        let code = crate::lower::compile(&[tanh_kernel(n)]).unwrap();
        let mut want = vec![0f32; n];
        let args = [xs.as_ptr() as *mut u8, want.as_mut_ptr() as *mut u8];
        // SAFETY: the kernel reads `n` f32 from its input and writes `n` to its output,
        // both live vectors of that length.
        unsafe { (code.functions[0])(args.as_ptr(), 0, n as i64) };
        for t in tails {
            for len in (n - 16..=n).chain([3, 0]) {
                let mut got = xs[..len].to_vec();
                t.apply(&mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{t:?} tanh({:e}) [{i}]", xs[i]);
                }
            }
        }
    }

    /// Only a plain f32 tanh at the root becomes a tail.
    #[test]
    fn only_a_root_f32_tanh_is_split() {
        let k = tanh_kernel(8);
        let (inner, tail) = split_tail(&k, Some(Tail::Tanh8));
        assert_eq!(tail, Some(Tail::Tanh8));
        assert!(matches!(inner.body, Expr::Load { .. }));
        assert_eq!(split_tail(&k, None).1, None);
        let mut reduced = k.clone();
        reduced.reduce = Some((crate::kernel::Combine::Sum, vec![2]));
        assert_eq!(split_tail(&reduced, Some(Tail::Tanh8)).1, None);
        let mut exp = k.clone();
        let Expr::Unary(_, _, x) = &k.body else {
            unreachable!()
        };
        exp.body = Expr::Unary(UnaryOp::Exp, DType::F32, x.clone());
        assert_eq!(split_tail(&exp, Some(Tail::Tanh8)).1, None);
    }
}
