//! Derivatives of `tan`, the inverse and hyperbolic functions, `exp2` and `atan2`, shared by
//! the reverse (`vjp_rule`) and forward (`jvp_rule`) rules: each returns `dy/dx` at `x`
//! (result `y`), JAX's formulas (`jax/_src/lax/lax.py`'s `defjvp`s), so values and gradients
//! match JAX's, including the domain edges (`asin'(1) = inf`, `atanh'(1) = inf`).

use tessera_ir::{BinaryOp, NodeId, UnaryOp};

use super::{Builder, Result};

/// `1 + tan(x)^2`, from the result.
pub(crate) fn tan(b: &mut Builder, y: NodeId) -> Result<NodeId> {
    let one = b.full_like(y, 1.0)?;
    let y2 = b.mul(y, y)?;
    b.bin(BinaryOp::Add, one, y2)
}

/// `rsqrt(1 - x^2)`, negated for `acos`; `1 - x^2` is formed as `(1 - x) * (1 + x)`
/// (JAX writes `1 - square(x)`, which XLA's CPU backend contracts to an FMA): in f32
/// `1 - x*x` loses ~40 ulp to cancellation near `|x| = 1`, the factored form is within a
/// few ulp everywhere (`1 - x` is exact there).
pub(crate) fn asin(b: &mut Builder, x: NodeId, acos: bool) -> Result<NodeId> {
    let one = b.full_like(x, 1.0)?;
    let m = b.bin(BinaryOp::Sub, one, x)?;
    let p = b.bin(BinaryOp::Add, one, x)?;
    let d = b.mul(m, p)?;
    let r = b.un(UnaryOp::Rsqrt, d)?;
    if acos { b.un(UnaryOp::Neg, r) } else { Ok(r) }
}

/// `1 / (1 + x^2)`.
pub(crate) fn atan(b: &mut Builder, x: NodeId) -> Result<NodeId> {
    let one = b.full_like(x, 1.0)?;
    let x2 = b.mul(x, x)?;
    let d = b.bin(BinaryOp::Add, one, x2)?;
    b.bin(BinaryOp::Div, one, d)
}

/// `sinh' = cosh`, `cosh' = sinh`.
pub(crate) fn sinh_cosh(b: &mut Builder, x: NodeId, of_cosh: bool) -> Result<NodeId> {
    b.un(
        if of_cosh {
            UnaryOp::Sinh
        } else {
            UnaryOp::Cosh
        },
        x,
    )
}

/// `rsqrt(x^2 + 1)` (`asinh`) or `rsqrt(x^2 - 1)` (`acosh`), the latter formed as
/// `(x - 1) * (x + 1)`: JAX writes `square(x) - 1` (contracted to an FMA by XLA's CPU
/// backend); in f32 without the FMA it loses ~200 ulp near `x = 1`, where `x - 1` is exact.
pub(crate) fn asinh_acosh(b: &mut Builder, x: NodeId, acosh: bool) -> Result<NodeId> {
    let one = b.full_like(x, 1.0)?;
    let d = if acosh {
        let m = b.bin(BinaryOp::Sub, x, one)?;
        let p = b.bin(BinaryOp::Add, x, one)?;
        b.mul(m, p)?
    } else {
        let x2 = b.mul(x, x)?;
        b.bin(BinaryOp::Add, x2, one)?
    };
    b.un(UnaryOp::Rsqrt, d)
}

/// `(1 / (1 + x)) / (1 - x)`.
pub(crate) fn atanh(b: &mut Builder, x: NodeId) -> Result<NodeId> {
    let one = b.full_like(x, 1.0)?;
    let p = b.bin(BinaryOp::Add, one, x)?;
    let m = b.bin(BinaryOp::Sub, one, x)?;
    let r = b.bin(BinaryOp::Div, one, p)?;
    b.bin(BinaryOp::Div, r, m)
}

/// `ln 2 * 2^x`, from the result.
pub(crate) fn exp2(b: &mut Builder, y: NodeId) -> Result<NodeId> {
    let c = b.full_like(y, std::f64::consts::LN_2)?;
    b.mul(c, y)
}

/// The partial derivatives of `atan2(x, z)`: `z / (x^2 + z^2)` by `x` (`of_x`), else
/// `-x / (x^2 + z^2)`.
pub(crate) fn atan2(b: &mut Builder, x: NodeId, z: NodeId, of_x: bool) -> Result<NodeId> {
    let x2 = b.mul(x, x)?;
    let z2 = b.mul(z, z)?;
    let d = b.bin(BinaryOp::Add, x2, z2)?;
    let n = if of_x { z } else { b.un(UnaryOp::Neg, x)? };
    b.bin(BinaryOp::Div, n, d)
}
