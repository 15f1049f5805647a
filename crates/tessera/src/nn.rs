//! Activation functions, as `jax.nn` defines them (`jax/_src/nn/functions.py`): the same
//! formulas over the same primitives, so values and gradients match JAX's
//! (`tests/elementwise.rs` checks both against JAX 0.10.2 fixtures). Float operands only; a
//! constant takes the operand's dtype.

use crate::tensor::Tensor;

/// SELU's `alpha` (`jax.nn.selu`): the negative branch is `scale * alpha * (exp(x) - 1)`.
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
/// SELU's `scale` (`jax.nn.selu`), multiplying both branches.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

impl Tensor {
    /// `where_(cond, x, y)`: `x` where `cond` is true, else `y`, with NumPy broadcasting of
    /// all three (`jnp.where`; `x` and `y` of one dtype: there is no type promotion).
    #[track_caller]
    pub fn where_(cond: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
        Tensor::select(cond, x, y)
    }

    /// `minimum(maximum(x, lo), hi)`, as `jnp.clip(x, lo, hi)`.
    #[track_caller]
    pub fn clip(&self, lo: f64, hi: f64) -> Tensor {
        self.maximum(&self.scalar_like(lo))
            .minimum(&self.scalar_like(hi))
    }

    /// GELU. `approximate`: `x * 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`; else the
    /// exact `0.5 x erfc(-x / sqrt 2)`, here `0.5 x (1 + erf(x / sqrt 2))` (no `erfc`
    /// primitive yet: for `x < -3` the result, below 2e-3 in magnitude, has an absolute error
    /// up to `|x| 2^-25` instead of a relative one).
    #[track_caller]
    pub fn gelu(&self, approximate: bool) -> Tensor {
        let c = |v: f64| self.scalar_like(v);
        if approximate {
            let x3 = self.mul(self).mul(self);
            let inner = self.add(&c(0.044_715).mul(&x3));
            let t = c((2.0 / std::f64::consts::PI).sqrt()).mul(&inner).tanh();
            let cdf = c(0.5).mul(&c(1.0).add(&t));
            self.mul(&cdf)
        } else {
            let e = self.mul(&c(std::f64::consts::FRAC_1_SQRT_2)).erf();
            c(0.5).mul(self).mul(&c(1.0).add(&e))
        }
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Tensor {
        self.mul(&self.logistic())
    }

    /// [`Tensor::silu`].
    #[track_caller]
    pub fn swish(&self) -> Tensor {
        self.silu()
    }

    /// `log(exp(x) + exp(y))` computed stably, as `jnp.logaddexp`: `max(x, y) +
    /// log1p(exp(-abs(x - y)))`, and `x + y` where `x - y` is NaN (a NaN, or infinities of
    /// one sign).
    #[track_caller]
    pub fn logaddexp(&self, other: &Tensor) -> Tensor {
        let amax = self.maximum(other);
        let delta = self.sub(other);
        let body = amax.add(&delta.abs().neg().exp().log1p());
        Tensor::select(&delta.ne(&delta), &self.add(other), &body)
    }

    /// Softplus: `logaddexp(x, 0)`, as `jax.nn.softplus`.
    #[track_caller]
    pub fn softplus(&self) -> Tensor {
        self.logaddexp(&self.scalar_like(0.0))
    }

    /// `-softplus(-x)`, as `jax.nn.log_sigmoid`.
    #[track_caller]
    pub fn log_sigmoid(&self) -> Tensor {
        self.neg().softplus().neg()
    }

    /// ELU: `x` for `x > 0`, else `alpha * expm1(x)` (`expm1` of a safe 0 where `x > 0`, so
    /// the unused branch's gradient is finite).
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Tensor {
        let pos = self.gt(&self.scalar_like(0.0));
        let safe = Tensor::select(&pos, &self.scalar_like(0.0), self);
        let neg = self.scalar_like(alpha).mul(&safe.expm1());
        Tensor::select(&pos, self, &neg)
    }

    /// Leaky ReLU: `x` for `x >= 0`, else `negative_slope * x`.
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Tensor {
        let keep = self.ge(&self.scalar_like(0.0));
        Tensor::select(&keep, self, &self.scalar_like(negative_slope).mul(self))
    }

    /// ReLU6: `minimum(maximum(x, 0), 6)`.
    #[track_caller]
    pub fn relu6(&self) -> Tensor {
        self.clip(0.0, 6.0)
    }

    /// Hard tanh: 1 above 1, -1 below -1, else `x`.
    #[track_caller]
    pub fn hard_tanh(&self) -> Tensor {
        let one = self.scalar_like(1.0);
        let m1 = self.scalar_like(-1.0);
        let inner = Tensor::select(&self.lt(&m1), &m1, self);
        Tensor::select(&self.gt(&one), &one, &inner)
    }

    /// CELU: `maximum(x, 0) + alpha * expm1(minimum(x, 0) / alpha)`.
    #[track_caller]
    pub fn celu(&self, alpha: f64) -> Tensor {
        let zero = self.scalar_like(0.0);
        let a = self.scalar_like(alpha);
        self.maximum(&zero)
            .add(&a.mul(&self.minimum(&zero).div(&a).expm1()))
    }

    /// SELU: `scale * elu(x, alpha)` with JAX's constants.
    #[track_caller]
    pub fn selu(&self) -> Tensor {
        self.scalar_like(SELU_SCALE).mul(&self.elu(SELU_ALPHA))
    }
}
