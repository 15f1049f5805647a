//! The compiled elementwise functions computed by one call per element (`tan`, the inverse and
//! hyperbolic functions, `exp2`, `atan2`): the interpreter's own kernels
//! (`tessera_interp::elem`: libm in f64, rounded once for f32), so compiled equals interpreted
//! bit for bit and the f32 bound is 0.5 ulp plus libm's f64 error (asserted over every binade
//! in `tests/ulp.rs`). A vector is done lane by lane (`approx::per_lane`).

use tessera_interp::elem::{Libm, atan2_f32, atan2_f64};

macro_rules! libm_calls {
    ($($l:ident: $f32:ident, $f64:ident;)*) => {
        $(
            extern "C" fn $f32(x: f32) -> f32 {
                Libm::$l.f32(x)
            }
            extern "C" fn $f64(x: f64) -> f64 {
                Libm::$l.f64(x)
            }
        )*
        /// The symbol names of a function's f32 and f64 kernels.
        pub fn symbols(l: Libm) -> (&'static str, &'static str) {
            match l {
                $(Libm::$l => (stringify!($f32), stringify!($f64)),)*
            }
        }
        /// Every kernel, for the JIT's symbol table.
        pub const SYMBOLS: &[(&str, *const u8)] = &[
            $((stringify!($f32), $f32 as *const u8), (stringify!($f64), $f64 as *const u8),)*
            ("tessera_atan2_f32", tessera_atan2_f32 as *const u8),
            ("tessera_atan2_f64", tessera_atan2_f64 as *const u8),
        ];
    };
}

libm_calls! {
    Tan: tessera_tan_f32, tessera_tan_f64;
    Asin: tessera_asin_f32, tessera_asin_f64;
    Acos: tessera_acos_f32, tessera_acos_f64;
    Atan: tessera_atan_f32, tessera_atan_f64;
    Sinh: tessera_sinh_f32, tessera_sinh_f64;
    Cosh: tessera_cosh_f32, tessera_cosh_f64;
    Asinh: tessera_asinh_f32, tessera_asinh_f64;
    Acosh: tessera_acosh_f32, tessera_acosh_f64;
    Atanh: tessera_atanh_f32, tessera_atanh_f64;
    Exp2: tessera_exp2_f32, tessera_exp2_f64;
}

extern "C" fn tessera_atan2_f32(x: f32, y: f32) -> f32 {
    atan2_f32(x, y)
}

extern "C" fn tessera_atan2_f64(x: f64, y: f64) -> f64 {
    atan2_f64(x, y)
}

/// The f16 and bf16 conversions a kernel calls per element (half's, as the interpreter's
/// `convert` uses, so both round to nearest even the same way and keep the same NaNs). A
/// narrow value travels as its 16 bits in the low half of a u32.
macro_rules! narrow_calls {
    ($($name:ident($x:ident: $from:ty) -> $to:ty $body:block)*) => {
        $(
            extern "C" fn $name($x: $from) -> $to $body
        )*
        /// The conversion calls, for the JIT's symbol table.
        pub const NARROW_SYMBOLS: &[(&str, *const u8)] =
            &[$((stringify!($name), $name as *const u8),)*];
    };
}

narrow_calls! {
    tessera_f16_to_f32(bits: u32) -> f32 { half::f16::from_bits(bits as u16).to_f32() }
    tessera_bf16_to_f32(bits: u32) -> f32 { half::bf16::from_bits(bits as u16).to_f32() }
    tessera_f32_to_f16(x: f32) -> u32 { half::f16::from_f32(x).to_bits() as u32 }
    tessera_f32_to_bf16(x: f32) -> u32 { half::bf16::from_f32(x).to_bits() as u32 }
    tessera_f64_to_f16(x: f64) -> u32 { half::f16::from_f64(x).to_bits() as u32 }
    tessera_f64_to_bf16(x: f64) -> u32 { half::bf16::from_f64(x).to_bits() as u32 }
}
