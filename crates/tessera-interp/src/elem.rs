//! The elementwise functions evaluated through libm (musl's, the `libm` crate) in f64: `tan`,
//! the inverse and hyperbolic functions, `exp2` and `atan2`, the ones JAX has as lax primitives
//! that XLA:CPU expands and Tessera computes with one call per element.
//!
//! f64 is libm's f64 function (musl: within 1 ulp). f32 is that f64 function rounded once to
//! f32, so it is within 0.5 ulp of the true value plus the f64 error scaled down by 2^-29
//! (about 0.5000001 ulp), keeps every C99 Annex F special (NaN, +-0, +-inf, `asin(+-1) =
//! +-pi/2`, `acosh(1) = 0`, `atanh(+-1) = +-inf`, `asin` outside [-1, 1] = NaN, `sinh`/`cosh`/
//! `exp2` overflowing to inf exactly where the rounded true value does) and the subnormals.
//! The compiled code calls the same functions (`tessera-codegen/src/elem.rs`), so both
//! backends agree bit for bit.

/// The libm-computed unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Libm {
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Exp2,
}

impl Libm {
    pub const ALL: [Libm; 10] = [
        Libm::Tan,
        Libm::Asin,
        Libm::Acos,
        Libm::Atan,
        Libm::Sinh,
        Libm::Cosh,
        Libm::Asinh,
        Libm::Acosh,
        Libm::Atanh,
        Libm::Exp2,
    ];

    /// The f64 function.
    pub fn f64(self, x: f64) -> f64 {
        match self {
            Libm::Tan => libm::tan(x),
            Libm::Asin => libm::asin(x),
            Libm::Acos => libm::acos(x),
            Libm::Atan => libm::atan(x),
            Libm::Sinh => libm::sinh(x),
            Libm::Cosh => libm::cosh(x),
            Libm::Asinh => libm::asinh(x),
            // The `libm` crate's `acosh` returns a number for x <= -1 (it computes
            // `log(2|x|)`-like branches on the magnitude); below 1 it is NaN (C99 F.10.2.1).
            Libm::Acosh if x < 1.0 => f64::NAN,
            Libm::Acosh => libm::acosh(x),
            Libm::Atanh => libm::atanh(x),
            Libm::Exp2 => libm::exp2(x),
        }
    }

    /// The f32 function: the f64 one rounded once.
    pub fn f32(self, x: f32) -> f32 {
        self.f64(x as f64) as f32
    }
}

/// f64 `atan2(x, y)` (lax's operand order: `x` is the ordinate), libm's.
pub fn atan2_f64(x: f64, y: f64) -> f64 {
    libm::atan2(x, y)
}

/// f32 `atan2`: the f64 one rounded once.
pub fn atan2_f32(x: f32, y: f32) -> f32 {
    libm::atan2(x as f64, y as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_edges_and_specials() {
        use std::f64::consts::FRAC_PI_2;
        assert_eq!(Libm::Asin.f64(1.0), FRAC_PI_2);
        assert_eq!(Libm::Asin.f64(-1.0), -FRAC_PI_2);
        assert!(Libm::Asin.f64(1.0 + f64::EPSILON).is_nan());
        assert_eq!(Libm::Acos.f64(1.0), 0.0);
        assert_eq!(Libm::Acosh.f64(1.0), 0.0);
        assert!(Libm::Acosh.f64(0.5).is_nan());
        for x in [-0.5, -1.0, -2.0, -1e300, f64::NEG_INFINITY] {
            assert!(Libm::Acosh.f64(x).is_nan(), "acosh({x})");
        }
        assert_eq!(Libm::Atanh.f64(1.0), f64::INFINITY);
        assert_eq!(Libm::Atanh.f64(-1.0), f64::NEG_INFINITY);
        assert_eq!(Libm::Sinh.f32(100.0), f32::INFINITY);
        assert_eq!(Libm::Cosh.f32(-100.0), f32::INFINITY);
        assert_eq!(Libm::Exp2.f32(128.0), f32::INFINITY);
        assert_eq!(Libm::Exp2.f32(-149.0), f32::from_bits(1));
        assert_eq!(Libm::Tan.f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(atan2_f32(0.0, -1.0), std::f32::consts::PI);
        assert_eq!(atan2_f32(-0.0, -1.0), -std::f32::consts::PI);
        for l in Libm::ALL {
            assert!(l.f32(f32::NAN).is_nan(), "{l:?}");
        }
    }
}
