//! Optimizers in the style of optax: gradient transformations whose state is a tree, so a
//! training step with its optimizer jits, shards and checkpoints like any other tree.
//!
//! A [`GradientTransformation`] has `init(&params) -> state` and `update(grads, &state,
//! &params) -> (updates, state)`; [`apply_updates`] adds the updates to the parameters.
//! Transformations compose with [`chain`] / [`GradientTransformation::then`]
//! (`clip_by_global_norm(1.0).then(adam(1e-3))`), and a learning rate is a number or a
//! [`Schedule`].
//!
//! ```
//! use tessera::prelude::*;
//! use tessera::optim::{self, GradientTransformation};
//!
//! let opt = optim::clip_by_global_norm(1.0).then(optim::adam(1e-2));
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], [2]);
//! let mut state = opt.init(&w);
//! let step = jit(|(w, s): (Tensor, _)| {
//!     let g = grad(|w: &Tensor| w.square().sum())(&w);
//!     let (u, s) = opt.update(g, &s, &w);
//!     (optim::apply_updates(&w, &u), s)
//! });
//! let mut w = w;
//! for _ in 0..3 {
//!     (w, state) = step.call((w, state)).unwrap();
//! }
//! assert!(w.to_vec::<f32>()[0] < 1.0);
//! ```
//!
//! The arithmetic is optax 0.2.8's, op by op (`tests/fixtures/optim/SPEC.md`): a
//! hyperparameter is an f64 and anything derived from it (`1 - b1`, `-lr`) is computed in f64
//! and rounded once to the parameter's dtype, as Python floats are; `b1 ** count` is a `pow`
//! of the f32 count; counts are int32 and saturate at `i32::MAX`. `tests/optim.rs` checks each
//! optimizer against optax's parameters over 20 steps.

use std::fmt;
use std::sync::Arc;

use tessera_ir::DType;

use crate::tensor::Tensor;
use crate::tree;
use crate::tree::Tree;
use tessera_derive::Tree;

/// A gradient transformation (optax's `GradientTransformation`): its state for parameters of
/// type `P` is a tree of the same leaves (moments) and scalar counts.
pub trait GradientTransformation {
    /// The state for parameters of type `P`.
    type State<P: Tree>: Tree;

    /// The state before the first step.
    fn init<P: Tree>(&self, params: &P) -> Self::State<P>;

    /// Transforms `updates` (the gradients, or the output of the previous transformation of a
    /// chain) given the state and the parameters before this step.
    fn update<P: Tree>(
        &self,
        updates: P,
        state: &Self::State<P>,
        params: &P,
    ) -> (P, Self::State<P>);

    /// This transformation, then `next` on its output (optax's `chain(self, next)`).
    fn then<B: GradientTransformation>(self, next: B) -> Chain<Self, B>
    where
        Self: Sized,
    {
        Chain(self, next)
    }
}

/// `params + updates`, leaf by leaf (optax's `apply_updates`).
#[track_caller]
pub fn apply_updates<P: Tree>(params: &P, updates: &P) -> P {
    tree::map2(params, updates, |p, u| p + u)
}

/// The L2 norm of all the leaves together, as f32: each leaf's sum of squares, added in leaf
/// order from zero, then the square root (optax's `tree.norm`).
#[track_caller]
pub fn global_norm<P: Tree>(t: &P) -> Tensor {
    let zero = Tensor::from_vec(vec![0.0f32], []);
    tree::reduce(t, zero, |acc, x| acc + x.square().sum().astype(DType::F32)).sqrt()
}

/// An int32 scalar.
fn count(n: i32) -> Tensor {
    Tensor::from_vec(vec![n], [])
}

/// `c + 1`, staying at `i32::MAX` instead of wrapping (optax's `safe_increment`).
#[track_caller]
fn safe_increment(c: &Tensor) -> Tensor {
    let max = c.scalar_like(f64::from(i32::MAX));
    Tensor::select(&c.lt(&max), &c.add(&c.scalar_like(1.0)), &max)
}

/// An f32 scalar holding `x` rounded once.
fn f32s(x: f64) -> Tensor {
    Tensor::from_vec(vec![x as f32], [])
}

/// `x ** n` for a whole `n >= 0` by JAX's `integer_pow`: binary exponentiation with the same
/// products in the same order (`x ** 2` is `x * x`).
#[track_caller]
fn integer_pow(x: &Tensor, mut n: u32) -> Tensor {
    let mut base = x.clone();
    let mut acc: Option<Tensor> = None;
    if n == 0 {
        return x.scalar_like(1.0).broadcast_to(x.shape());
    }
    while n > 0 {
        if n & 1 == 1 {
            acc = Some(match acc {
                None => base.clone(),
                Some(a) => &a * &base,
            });
        }
        n >>= 1;
        if n > 0 {
            base = &base * &base;
        }
    }
    acc.expect("n > 0 sets it")
}

// ---------------------------------------------------------------------------------------
// Schedules

/// A learning-rate (or any hyperparameter) schedule: the value at a step count, an int32
/// scalar, as an f32 scalar. Schedules are traced with the step: `value` runs on tracers.
pub trait Schedule: Send + Sync {
    /// The value at `count` (an int32 scalar tensor, concrete or traced).
    fn value(&self, count: &Tensor) -> Tensor;

    /// The value at step `n`, computed now.
    fn at(&self, n: i32) -> f32 {
        self.value(&count(n)).item::<f32>()
    }
}

impl Schedule for Arc<dyn Schedule> {
    fn value(&self, count: &Tensor) -> Tensor {
        (**self).value(count)
    }
}

/// A schedule from a closure of the count.
pub struct ScheduleFn<F>(pub F);

impl<F: Fn(&Tensor) -> Tensor + Send + Sync> Schedule for ScheduleFn<F> {
    fn value(&self, count: &Tensor) -> Tensor {
        (self.0)(count)
    }
}

/// Always `value`.
#[derive(Clone, Copy, Debug)]
pub struct Constant {
    /// The value at every step.
    pub value: f64,
}

/// `constant_schedule(value)`.
pub fn constant_schedule(value: f64) -> Constant {
    Constant { value }
}

impl Schedule for Constant {
    fn value(&self, _: &Tensor) -> Tensor {
        f32s(self.value)
    }
}

/// From `init` to `end` along `(1 - k / steps) ** power`, `k` the steps since `begin`,
/// clamped to `[0, steps]`; `init` throughout when `steps <= 0`.
#[derive(Clone, Copy, Debug)]
pub struct Polynomial {
    /// The value up to `begin`.
    pub init: f64,
    /// The value from `begin + steps` on.
    pub end: f64,
    /// A whole power is JAX's `integer_pow` (products); any other is `pow`.
    pub power: f64,
    /// The length of the transition (`transition_steps`).
    pub steps: i32,
    /// The step the transition starts at (`transition_begin`; negative counts as 0).
    pub begin: i32,
}

/// `polynomial_schedule(init, end, power, transition_steps, transition_begin=0)`.
pub fn polynomial_schedule(init: f64, end: f64, power: f64, steps: i32) -> Polynomial {
    Polynomial {
        init,
        end,
        power,
        steps,
        begin: 0,
    }
}

/// `linear_schedule(init, end, transition_steps, transition_begin)`: the polynomial of power 1.
pub fn linear_schedule(init: f64, end: f64, steps: i32, begin: i32) -> Polynomial {
    Polynomial {
        init,
        end,
        power: 1.0,
        steps,
        begin,
    }
}

impl Polynomial {
    /// Starts the transition at step `begin` (negative counts as 0).
    pub fn begin(self, begin: i32) -> Polynomial {
        Polynomial { begin, ..self }
    }
}

impl Schedule for Polynomial {
    fn value(&self, c: &Tensor) -> Tensor {
        if self.steps <= 0 {
            return f32s(self.init);
        }
        let begin = self.begin.max(0);
        let k = (c - &count(begin))
            .maximum(&count(0))
            .minimum(&count(self.steps));
        let frac = f32s(1.0) - k.astype(DType::F32) / f32s(f64::from(self.steps));
        let pw = if self.power.fract() == 0.0 && (0.0..=64.0).contains(&self.power) {
            integer_pow(&frac, self.power as u32)
        } else {
            frac.pow(&f32s(self.power))
        };
        pw * f32s(self.init - self.end) + f32s(self.end)
    }
}

/// `init * rate ** ((count - begin) / steps)` (the exponent floored with `staircase`), `init`
/// until `begin`, bounded by `end` when given.
#[derive(Clone, Copy, Debug)]
pub struct ExponentialDecay {
    /// The value up to `begin` (`init_value`).
    pub init: f64,
    /// The steps over which the value is multiplied by `rate` once (`transition_steps`);
    /// `init` throughout when `<= 0`.
    pub steps: i32,
    /// The factor per `steps` steps (`decay_rate`); `init` throughout when 0.
    pub rate: f64,
    /// The step decay starts at (`transition_begin`; negative counts as 0).
    pub begin: i32,
    /// Whether the exponent is floored, decaying in whole steps of `steps`.
    pub staircase: bool,
    /// The bound (`end_value`): a floor when `rate < 1`, a ceiling otherwise.
    pub end: Option<f64>,
}

/// `exponential_decay(init_value, transition_steps, decay_rate)`; set the rest with the
/// builder methods.
pub fn exponential_decay(init: f64, steps: i32, rate: f64) -> ExponentialDecay {
    ExponentialDecay {
        init,
        steps,
        rate,
        begin: 0,
        staircase: false,
        end: None,
    }
}

impl ExponentialDecay {
    /// Decays in whole steps of `transition_steps`.
    pub fn staircase(self, on: bool) -> Self {
        ExponentialDecay {
            staircase: on,
            ..self
        }
    }
    /// Starts decaying at step `begin` (negative counts as 0).
    pub fn begin(self, begin: i32) -> Self {
        ExponentialDecay { begin, ..self }
    }
    /// Never below `end` (above it, for a growing rate).
    pub fn end(self, end: f64) -> Self {
        ExponentialDecay {
            end: Some(end),
            ..self
        }
    }
}

impl Schedule for ExponentialDecay {
    fn value(&self, c: &Tensor) -> Tensor {
        if self.steps <= 0 || self.rate == 0.0 {
            return f32s(self.init);
        }
        let d = c - &count(self.begin.max(0));
        let mut p = d.astype(DType::F32) / f32s(f64::from(self.steps));
        if self.staircase {
            p = p.floor();
        }
        let decayed = f32s(self.init) * f32s(self.rate).pow(&p);
        let v = Tensor::select(&d.le(&count(0)), &f32s(self.init), &decayed);
        match self.end {
            None => v,
            Some(e) if self.rate < 1.0 => v.maximum(&f32s(e)),
            Some(e) => v.minimum(&f32s(e)),
        }
    }
}

/// `init * ((1 - alpha) * cd + alpha)` with `cd = (0.5 (1 + cos(pi min(count, steps) /
/// steps))) ** exponent`.
#[derive(Clone, Copy, Debug)]
pub struct CosineDecay {
    /// The value at step 0 (`init_value`).
    pub init: f64,
    /// The steps to decay over (`decay_steps`); the value stays at `init * alpha` after.
    pub steps: i32,
    /// The final value as a fraction of `init`.
    pub alpha: f64,
    /// The power of the cosine term (1 by default).
    pub exponent: f64,
}

/// `cosine_decay_schedule(init_value, decay_steps, alpha)`. Panics when `decay_steps <= 0`,
/// as optax raises.
#[track_caller]
pub fn cosine_decay_schedule(init: f64, steps: i32, alpha: f64) -> CosineDecay {
    assert!(
        steps > 0,
        "cosine_decay_schedule: decay_steps must be positive, got {steps}"
    );
    CosineDecay {
        init,
        steps,
        alpha,
        exponent: 1.0,
    }
}

impl CosineDecay {
    /// The exponent of the cosine term (1 by default).
    pub fn exponent(self, exponent: f64) -> Self {
        CosineDecay { exponent, ..self }
    }
}

impl Schedule for CosineDecay {
    fn value(&self, c: &Tensor) -> Tensor {
        let steps = f32s(f64::from(self.steps));
        let t = c.astype(DType::F32).minimum(&steps);
        let x = (f32s(std::f64::consts::PI) * t) / steps;
        let mut cd = f32s(0.5) * (f32s(1.0) + x.cos());
        // pow(x, 1) is x exactly.
        if self.exponent != 1.0 {
            cd = cd.pow(&f32s(self.exponent));
        }
        f32s(self.init) * (f32s(1.0 - self.alpha) * cd + f32s(self.alpha))
    }
}

/// Each schedule from its boundary on, counting from zero there (optax's `join_schedules`).
pub struct Join {
    schedules: Vec<Arc<dyn Schedule>>,
    boundaries: Vec<i32>,
}

/// `join_schedules(schedules, boundaries)`: schedule `i + 1` takes over at `boundaries[i]`.
/// Panics unless there is one boundary fewer than schedules.
#[track_caller]
pub fn join_schedules(schedules: Vec<Arc<dyn Schedule>>, boundaries: Vec<i32>) -> Join {
    assert!(
        !schedules.is_empty() && boundaries.len() + 1 == schedules.len(),
        "join_schedules: {} schedules need {} boundaries, got {}",
        schedules.len(),
        schedules.len().saturating_sub(1),
        boundaries.len()
    );
    Join {
        schedules,
        boundaries,
    }
}

impl Schedule for Join {
    fn value(&self, c: &Tensor) -> Tensor {
        let mut out = self.schedules[0].value(c);
        for (b, s) in self.boundaries.iter().zip(&self.schedules[1..]) {
            let b = count(*b);
            out = Tensor::select(&c.lt(&b), &out, &s.value(&(c - &b)));
        }
        out
    }
}

/// `warmup_cosine_decay_schedule(init, peak, warmup_steps, decay_steps, end)`: linear from
/// `init` to `peak` over `warmup` steps, then a cosine decay to `end` at `decay_steps`.
#[track_caller]
pub fn warmup_cosine_decay_schedule(
    init: f64,
    peak: f64,
    warmup: i32,
    decay_steps: i32,
    end: f64,
) -> Join {
    let alpha = if peak == 0.0 { 0.0 } else { end / peak };
    join_schedules(
        vec![
            Arc::new(linear_schedule(init, peak, warmup, 0)),
            Arc::new(cosine_decay_schedule(peak, decay_steps - warmup, alpha)),
        ],
        vec![warmup],
    )
}

/// `init`, scaled by each `scale` once the count reaches its boundary.
#[derive(Clone, Debug)]
pub struct PiecewiseConstant {
    init: f64,
    boundaries_and_scales: Vec<(i32, f64)>,
}

/// `piecewise_constant_schedule(init, {boundary: scale})`. Panics on a negative scale, as
/// optax raises.
#[track_caller]
pub fn piecewise_constant_schedule(
    init: f64,
    boundaries_and_scales: &[(i32, f64)],
) -> PiecewiseConstant {
    let mut b = boundaries_and_scales.to_vec();
    assert!(
        b.iter().all(|&(_, s)| s >= 0.0),
        "piecewise_constant_schedule: scales must be non-negative: {b:?}"
    );
    b.sort_by_key(|&(t, _)| t);
    PiecewiseConstant {
        init,
        boundaries_and_scales: b,
    }
}

impl Schedule for PiecewiseConstant {
    fn value(&self, c: &Tensor) -> Tensor {
        let mut v = f32s(self.init);
        for &(t, s) in &self.boundaries_and_scales {
            let scaled = &v * &f32s(s);
            v = Tensor::select(&c.ge(&count(t)), &scaled, &v);
        }
        v
    }
}

/// A learning rate: a number or a schedule of the step count.
#[derive(Clone)]
pub enum LearningRate {
    /// The same rate at every step.
    Constant(f64),
    /// The schedule's value at the step count.
    Scheduled(Arc<dyn Schedule>),
}

impl fmt::Debug for LearningRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LearningRate::Constant(x) => write!(f, "{x}"),
            LearningRate::Scheduled(_) => write!(f, "<schedule>"),
        }
    }
}

impl From<f64> for LearningRate {
    fn from(x: f64) -> LearningRate {
        LearningRate::Constant(x)
    }
}

impl From<f32> for LearningRate {
    fn from(x: f32) -> LearningRate {
        LearningRate::Constant(f64::from(x))
    }
}

impl<S: Schedule + 'static> From<S> for LearningRate {
    fn from(s: S) -> LearningRate {
        LearningRate::Scheduled(Arc::new(s))
    }
}

// ---------------------------------------------------------------------------------------
// Transformations

/// Leaves `updates` as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity;

/// `identity()`.
pub fn identity() -> Identity {
    Identity
}

impl GradientTransformation for Identity {
    type State<P: Tree> = ();
    fn init<P: Tree>(&self, _: &P) {}
    fn update<P: Tree>(&self, u: P, _: &(), _: &P) -> (P, ()) {
        (u, ())
    }
}

/// Two transformations, one after the other; its state is the pair of theirs.
#[derive(Clone, Copy, Debug)]
pub struct Chain<A, B>(pub A, pub B);

/// `chain(a, b)`: `a`, then `b` on its output. Chain more with `.then(c)`.
pub fn chain<A: GradientTransformation, B: GradientTransformation>(a: A, b: B) -> Chain<A, B> {
    Chain(a, b)
}

impl<A: GradientTransformation, B: GradientTransformation> GradientTransformation for Chain<A, B> {
    type State<P: Tree> = (A::State<P>, B::State<P>);
    fn init<P: Tree>(&self, params: &P) -> Self::State<P> {
        (self.0.init(params), self.1.init(params))
    }
    fn update<P: Tree>(&self, u: P, (sa, sb): &Self::State<P>, params: &P) -> (P, Self::State<P>) {
        let (u, sa) = self.0.update(u, sa, params);
        let (u, sb) = self.1.update(u, sb, params);
        (u, (sa, sb))
    }
}

/// Multiplies the updates by `step_size`.
#[derive(Clone, Copy, Debug)]
pub struct Scale(pub f64);

/// `scale(step_size)`.
pub fn scale(step_size: f64) -> Scale {
    Scale(step_size)
}

impl GradientTransformation for Scale {
    type State<P: Tree> = ();
    fn init<P: Tree>(&self, _: &P) {}
    fn update<P: Tree>(&self, u: P, _: &(), _: &P) -> (P, ()) {
        (tree::map(&u, |g| g.scalar_like(self.0) * g), ())
    }
}

/// The step count of a transformation that needs one (a schedule's).
#[derive(Tree, Clone)]
pub struct CountState {
    /// The steps taken, an int32 scalar (saturating at `i32::MAX`).
    pub count: Tensor,
}

/// Multiplies the updates by `-lr` (optax's `scale_by_learning_rate`): by the number, or by
/// the schedule's value at the step count (the count before this step, then incremented).
#[derive(Clone, Debug)]
pub struct ScaleByLearningRate {
    /// The learning rate (positive: the updates are scaled by its negation).
    pub lr: LearningRate,
}

/// `scale_by_learning_rate(lr)`.
pub fn scale_by_learning_rate(lr: impl Into<LearningRate>) -> ScaleByLearningRate {
    ScaleByLearningRate { lr: lr.into() }
}

/// `scale_by_schedule(s)`: the updates times the schedule's value (no sign flip).
pub fn scale_by_schedule<S: Schedule + 'static>(s: S) -> ScaleBySchedule {
    ScaleBySchedule(Arc::new(s))
}

/// Multiplies the updates by a schedule's value at the step count.
#[derive(Clone)]
pub struct ScaleBySchedule(pub Arc<dyn Schedule>);

fn scheduled<P: Tree>(u: P, s: &dyn Schedule, c: &Tensor, sign: f64) -> (P, CountState) {
    let step = f32s(sign) * s.value(c);
    let u = tree::map(&u, |g| step.astype(g.dtype()) * g);
    (
        u,
        CountState {
            count: safe_increment(c),
        },
    )
}

impl GradientTransformation for ScaleBySchedule {
    type State<P: Tree> = CountState;
    fn init<P: Tree>(&self, _: &P) -> CountState {
        CountState { count: count(0) }
    }
    fn update<P: Tree>(&self, u: P, s: &CountState, _: &P) -> (P, CountState) {
        scheduled(u, &*self.0, &s.count, 1.0)
    }
}

impl GradientTransformation for ScaleByLearningRate {
    type State<P: Tree> = CountState;
    fn init<P: Tree>(&self, _: &P) -> CountState {
        CountState { count: count(0) }
    }
    fn update<P: Tree>(&self, u: P, s: &CountState, _: &P) -> (P, CountState) {
        match &self.lr {
            LearningRate::Constant(lr) => {
                let u = tree::map(&u, |g| g.scalar_like(-lr) * g);
                (u, s.clone())
            }
            LearningRate::Scheduled(sched) => scheduled(u, &**sched, &s.count, -1.0),
        }
    }
}

/// The state of [`ScaleByAdam`]: the step count and the two moments.
#[derive(Tree, Clone)]
pub struct AdamState<P> {
    /// The steps taken, an int32 scalar (saturating at `i32::MAX`).
    pub count: Tensor,
    /// The first moment (running mean of the gradients), shaped like the parameters.
    pub mu: P,
    /// The second moment (running mean of the squared gradients), shaped like the parameters.
    pub nu: P,
}

/// Adam's rescaling (optax's `scale_by_adam`): bias-corrected first moment over the square
/// root of the bias-corrected second moment plus `eps`.
#[derive(Clone, Copy, Debug)]
pub struct ScaleByAdam {
    /// The first moment's decay.
    pub b1: f64,
    /// The second moment's decay.
    pub b2: f64,
    /// Added to the denominator, outside the square root.
    pub eps: f64,
    /// Added to the second moment, inside the square root.
    pub eps_root: f64,
    /// Nesterov momentum in the first moment (NAdam).
    pub nesterov: bool,
}

/// `scale_by_adam()` with optax's defaults (`b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`).
pub fn scale_by_adam() -> ScaleByAdam {
    ScaleByAdam {
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
        eps_root: 0.0,
        nesterov: false,
    }
}

/// `1 - decay ** count`, the bias correction.
fn correction(decay: f64, count_f: &Tensor) -> Tensor {
    f32s(1.0) - f32s(decay).pow(count_f)
}

impl GradientTransformation for ScaleByAdam {
    type State<P: Tree> = AdamState<P>;
    fn init<P: Tree>(&self, params: &P) -> AdamState<P> {
        AdamState {
            count: count(0),
            mu: tree::map(params, |p| p.zeros_like()),
            nu: tree::map(params, |p| p.zeros_like()),
        }
    }
    fn update<P: Tree>(&self, g: P, s: &AdamState<P>, _: &P) -> (P, AdamState<P>) {
        let (b1, b2) = (self.b1, self.b2);
        let mu = tree::map2(&g, &s.mu, |g, m| {
            g.scalar_like(1.0 - b1) * g + m.scalar_like(b1) * m
        });
        let nu = tree::map2(&g, &s.nu, |g, v| {
            g.scalar_like(1.0 - b2) * (g * g) + v.scalar_like(b2) * v
        });
        let count = safe_increment(&s.count);
        let cf = count.astype(DType::F32);
        let bc1 = correction(b1, &cf);
        let bc2 = correction(b2, &cf);
        let mu_hat = if self.nesterov {
            let bc1_next = correction(b1, &safe_increment(&count).astype(DType::F32));
            tree::map2(&mu, &g, |m, g| {
                m.scalar_like(b1) * (m / bc1_next.astype(m.dtype()))
                    + g.scalar_like(1.0 - b1) * (g / bc1.astype(g.dtype()))
            })
        } else {
            tree::map(&mu, |m| m / bc1.astype(m.dtype()))
        };
        let (eps, eps_root) = (self.eps, self.eps_root);
        let u = tree::map2(&mu_hat, &nu, |m, v| {
            let v_hat = v / bc2.astype(v.dtype());
            m / ((v_hat + v.scalar_like(eps_root)).sqrt() + v.scalar_like(eps))
        });
        (u, AdamState { count, mu, nu })
    }
}

/// The state of [`Trace`]: the momentum buffer.
#[derive(Tree, Clone)]
pub struct TraceState<P> {
    /// The momentum buffer, shaped like the parameters.
    pub trace: P,
}

/// Momentum (optax's `trace`): `t = g + decay * t`; the update is `t`, or with Nesterov
/// `g + decay * t`.
#[derive(Clone, Copy, Debug)]
pub struct Trace {
    /// The momentum's decay.
    pub decay: f64,
    /// Whether the update is Nesterov's `g + decay * t` rather than `t`.
    pub nesterov: bool,
}

/// `trace(decay, nesterov)`.
pub fn trace(decay: f64, nesterov: bool) -> Trace {
    Trace { decay, nesterov }
}

impl GradientTransformation for Trace {
    type State<P: Tree> = TraceState<P>;
    fn init<P: Tree>(&self, params: &P) -> TraceState<P> {
        TraceState {
            trace: tree::map(params, |p| p.zeros_like()),
        }
    }
    fn update<P: Tree>(&self, g: P, s: &TraceState<P>, _: &P) -> (P, TraceState<P>) {
        let d = self.decay;
        let t = tree::map2(&g, &s.trace, |g, t| g + t.scalar_like(d) * t);
        let u = if self.nesterov {
            tree::map2(&g, &t, |g, t| g + t.scalar_like(d) * t)
        } else {
            tree::map(&t, Tensor::clone)
        };
        (u, TraceState { trace: t })
    }
}

/// Which leaves (by path, as `TreeDef::leaf_paths` names them) a weight decay applies to.
pub type Mask = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Adds `weight_decay * params` to the updates (optax's `add_decayed_weights`), on the leaves
/// the mask selects (all by default).
#[derive(Clone)]
pub struct AddDecayedWeights {
    /// The factor of the parameters added to the updates; 0 leaves them as they are.
    pub weight_decay: f64,
    /// The leaves to decay (`None`: all).
    pub mask: Option<Mask>,
}

impl fmt::Debug for AddDecayedWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AddDecayedWeights({})", self.weight_decay)
    }
}

/// `add_decayed_weights(weight_decay)`.
pub fn add_decayed_weights(weight_decay: f64) -> AddDecayedWeights {
    AddDecayedWeights {
        weight_decay,
        mask: None,
    }
}

impl AddDecayedWeights {
    /// Decays only the leaves whose path `mask` accepts. Paths are `TreeDef::leaf_paths`'s:
    /// field names joined by `.` (`"b"` for a top-level field, `"layers.0.b"` inside a
    /// `Vec`), `"arg"` for a lone tensor; `|p| p != "b" && !p.ends_with(".b")` spares biases
    /// named `b`.
    pub fn mask(self, mask: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        AddDecayedWeights {
            mask: Some(Arc::new(mask)),
            ..self
        }
    }
}

impl GradientTransformation for AddDecayedWeights {
    type State<P: Tree> = ();
    fn init<P: Tree>(&self, _: &P) {}
    #[track_caller]
    fn update<P: Tree>(&self, u: P, _: &(), params: &P) -> (P, ()) {
        if self.weight_decay == 0.0 {
            return (u, ());
        }
        let (ul, def) = tree::flatten(&u);
        let paths = def.leaf_paths();
        let pl = tree::leaves(params);
        let wd = self.weight_decay;
        let out = ul
            .iter()
            .zip(&pl)
            .zip(&paths)
            .map(|((g, p), path)| match &self.mask {
                Some(m) if !m(path) => g.clone(),
                _ => g + p.scalar_like(wd) * p,
            })
            .collect();
        let u = tree::unflatten(&def, out).unwrap_or_else(|e| crate::error::raise(e));
        (u, ())
    }
}

/// Rescales the updates so their global norm is at most `max_norm` (optax's
/// `clip_by_global_norm`): unchanged when the norm is below it.
#[derive(Clone, Copy, Debug)]
pub struct ClipByGlobalNorm(pub f64);

/// `clip_by_global_norm(max_norm)`.
pub fn clip_by_global_norm(max_norm: f64) -> ClipByGlobalNorm {
    ClipByGlobalNorm(max_norm)
}

impl GradientTransformation for ClipByGlobalNorm {
    type State<P: Tree> = ();
    fn init<P: Tree>(&self, _: &P) {}
    fn update<P: Tree>(&self, u: P, _: &(), _: &P) -> (P, ()) {
        let norm = global_norm(&u);
        let max = f32s(self.0);
        let keep = norm.lt(&max);
        // XLA computes `t / norm` as `t * (1 / norm)`; so does this, for optax's bits.
        let inv = f32s(1.0) / &norm;
        let u = tree::map(&u, |t| {
            let clipped = (t * inv.astype(t.dtype())) * max.astype(t.dtype());
            Tensor::select(&keep, t, &clipped)
        });
        (u, ())
    }
}

/// Clips each update element to `[-max_delta, max_delta]` (optax's `clip`).
#[derive(Clone, Copy, Debug)]
pub struct Clip(pub f64);

/// `clip(max_delta)`.
pub fn clip(max_delta: f64) -> Clip {
    Clip(max_delta)
}

impl GradientTransformation for Clip {
    type State<P: Tree> = ();
    fn init<P: Tree>(&self, _: &P) {}
    fn update<P: Tree>(&self, u: P, _: &(), _: &P) -> (P, ()) {
        (tree::map(&u, |t| t.clip(-self.0, self.0)), ())
    }
}

/// The state of [`ScaleByRms`]: the running mean of squared gradients.
#[derive(Tree, Clone)]
pub struct RmsState<P> {
    /// The running mean of squared gradients, shaped like the parameters.
    pub nu: P,
}

/// RMSProp's rescaling (optax's `scale_by_rms`): `g / sqrt(nu + eps)` with `nu` the running
/// mean of `g * g`.
#[derive(Clone, Copy, Debug)]
pub struct ScaleByRms {
    /// The running mean's decay.
    pub decay: f64,
    /// Added to `nu` inside the square root.
    pub eps: f64,
    /// The value `nu` starts at.
    pub initial_scale: f64,
}

impl GradientTransformation for ScaleByRms {
    type State<P: Tree> = RmsState<P>;
    fn init<P: Tree>(&self, params: &P) -> RmsState<P> {
        let s = self.initial_scale;
        RmsState {
            nu: tree::map(params, |p| p.zeros_like() + p.scalar_like(s)),
        }
    }
    fn update<P: Tree>(&self, g: P, s: &RmsState<P>, _: &P) -> (P, RmsState<P>) {
        let d = self.decay;
        let nu = tree::map2(&g, &s.nu, |g, v| {
            g.scalar_like(1.0 - d) * (g * g) + v.scalar_like(d) * v
        });
        let eps = self.eps;
        let u = tree::map2(&nu, &g, |v, g| (v + v.scalar_like(eps)).rsqrt() * g);
        (u, RmsState { nu })
    }
}

// ---------------------------------------------------------------------------------------
// The optimizers (optax's aliases)

/// Stochastic gradient descent, with optional (Nesterov) momentum: `sgd(lr)`,
/// `sgd(lr).momentum(0.9)`, `sgd(lr).momentum(0.9).nesterov(true)`.
#[derive(Clone, Debug)]
pub struct Sgd {
    lr: ScaleByLearningRate,
    momentum: Option<f64>,
    nesterov: bool,
}

/// `optax.sgd(learning_rate)`.
pub fn sgd(lr: impl Into<LearningRate>) -> Sgd {
    Sgd {
        lr: scale_by_learning_rate(lr),
        momentum: None,
        nesterov: false,
    }
}

impl Sgd {
    /// Heavy-ball momentum with decay `m`.
    pub fn momentum(self, m: f64) -> Sgd {
        Sgd {
            momentum: Some(m),
            ..self
        }
    }
    /// Nesterov momentum; it applies once `momentum` is set (in either order), as optax's
    /// `nesterov` needs a `momentum`.
    pub fn nesterov(self, on: bool) -> Sgd {
        Sgd {
            nesterov: on,
            ..self
        }
    }

    fn trace(&self) -> Option<Trace> {
        self.momentum.map(|m| trace(m, self.nesterov))
    }
}

/// The state of [`Sgd`]: the momentum buffer when there is momentum, and the step count.
#[derive(Tree, Clone)]
pub struct SgdState<P> {
    /// The momentum buffer (`None` without momentum).
    pub trace: Option<TraceState<P>>,
    /// The learning rate's step count (only advanced for a scheduled rate).
    pub lr: CountState,
}

impl GradientTransformation for Sgd {
    type State<P: Tree> = SgdState<P>;
    fn init<P: Tree>(&self, params: &P) -> SgdState<P> {
        SgdState {
            trace: self.trace().map(|t| t.init(params)),
            lr: self.lr.init(params),
        }
    }
    fn update<P: Tree>(&self, g: P, s: &SgdState<P>, params: &P) -> (P, SgdState<P>) {
        let (g, trace) = match (&self.trace(), &s.trace) {
            (Some(t), Some(st)) => {
                let (g, st) = t.update(g, st, params);
                (g, Some(st))
            }
            _ => (g, None),
        };
        let (u, lr) = self.lr.update(g, &s.lr, params);
        (u, SgdState { trace, lr })
    }
}

/// Adam (and AdamW with a weight decay): `adam(lr)`, `.b1(..)`, `.b2(..)`, `.eps(..)`.
#[derive(Clone, Debug)]
pub struct Adam {
    scale: ScaleByAdam,
    decay: Option<AddDecayedWeights>,
    lr: ScaleByLearningRate,
}

/// `optax.adam(learning_rate)` with `b1 = 0.9`, `b2 = 0.999`, `eps = 1e-8`.
pub fn adam(lr: impl Into<LearningRate>) -> Adam {
    Adam {
        scale: scale_by_adam(),
        decay: None,
        lr: scale_by_learning_rate(lr),
    }
}

/// `optax.adamw(learning_rate)`: Adam with decoupled weight decay (1e-4 unless set with
/// `.weight_decay`), added to Adam's direction before the learning rate scales it.
pub fn adamw(lr: impl Into<LearningRate>) -> Adam {
    Adam {
        decay: Some(add_decayed_weights(1e-4)),
        ..adam(lr)
    }
}

impl Adam {
    /// The first moment's decay (0.9 by default).
    pub fn b1(mut self, b1: f64) -> Adam {
        self.scale.b1 = b1;
        self
    }
    /// The second moment's decay (0.999 by default).
    pub fn b2(mut self, b2: f64) -> Adam {
        self.scale.b2 = b2;
        self
    }
    /// The denominator's `eps`, outside the square root (1e-8 by default).
    pub fn eps(mut self, eps: f64) -> Adam {
        self.scale.eps = eps;
        self
    }
    /// The `eps_root` inside the square root (0 by default).
    pub fn eps_root(mut self, eps_root: f64) -> Adam {
        self.scale.eps_root = eps_root;
        self
    }
    /// NAdam: Nesterov momentum in the first moment.
    pub fn nesterov(mut self, on: bool) -> Adam {
        self.scale.nesterov = on;
        self
    }
    /// The decoupled weight decay (AdamW's); 0 turns it off.
    pub fn weight_decay(mut self, wd: f64) -> Adam {
        let mask = self.decay.and_then(|d| d.mask);
        self.decay = Some(AddDecayedWeights {
            weight_decay: wd,
            mask,
        });
        self
    }
    /// Decays only the leaves whose path `mask` accepts. On a plain `adam` it keeps a decay of
    /// 0 (no decay) until `weight_decay` sets one.
    pub fn decay_mask(mut self, mask: impl Fn(&str) -> bool + Send + Sync + 'static) -> Adam {
        let wd = self.decay.as_ref().map_or(0.0, |d| d.weight_decay);
        self.decay = Some(add_decayed_weights(wd).mask(mask));
        self
    }
}

/// The state of [`Adam`]: the moments and count, and the learning rate's step count.
#[derive(Tree, Clone)]
pub struct AdamOptState<P> {
    /// The moments and their step count.
    pub adam: AdamState<P>,
    /// The learning rate's step count (only advanced for a scheduled rate).
    pub lr: CountState,
}

impl GradientTransformation for Adam {
    type State<P: Tree> = AdamOptState<P>;
    fn init<P: Tree>(&self, params: &P) -> AdamOptState<P> {
        AdamOptState {
            adam: self.scale.init(params),
            lr: self.lr.init(params),
        }
    }
    fn update<P: Tree>(&self, g: P, s: &AdamOptState<P>, params: &P) -> (P, AdamOptState<P>) {
        let (u, adam) = self.scale.update(g, &s.adam, params);
        let u = match &self.decay {
            Some(d) => d.update(u, &(), params).0,
            None => u,
        };
        let (u, lr) = self.lr.update(u, &s.lr, params);
        (u, AdamOptState { adam, lr })
    }
}

/// `optax.rmsprop(learning_rate)` (decay 0.9, eps 1e-8, initial scale 0).
pub fn rmsprop(lr: impl Into<LearningRate>) -> Chain<ScaleByRms, ScaleByLearningRate> {
    chain(
        ScaleByRms {
            decay: 0.9,
            eps: 1e-8,
            initial_scale: 0.0,
        },
        scale_by_learning_rate(lr),
    )
}
