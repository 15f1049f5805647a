//! JAX's default PRNG, bit for bit: threefry2x32 (20 rounds) with `jax_threefry_partitionable`
//! on, its default since JAX 0.5. Everything is built from u32 tensor ops, so random numbers are
//! ordinary traced ops inside `jit` and run eagerly outside.
//!
//! With the partitionable variant, element `i` of a draw of any shape comes from the counter
//! pair `(hi(i), lo(i))` of its flat index, so a row of a larger draw equals the same row of a
//! smaller one.

use tessera_ir::{DType, Shape};

use crate::tensor::Tensor;
use crate::tree::{Tree, TreeDef};

mod dists;
mod dtypes;
mod shuffle;
pub use dists::{
    bernoulli, categorical, dropout, exponential, gumbel, laplace, logistic, randint,
    truncated_normal, xla_log, xla_log1p,
};
pub use dtypes::{
    exponential_dtype, gumbel_dtype, laplace_dtype, logistic_dtype, normal_dtype,
    truncated_normal_dtype, uniform_dtype,
};
pub use shuffle::{choice, permutation, permutation_of, shuffle};

/// A PRNG key: a `u32[2]` tensor, like `jax.random.PRNGKey`. The same key always gives the
/// same numbers; [`split`](Key::split) or [`fold_in`](Key::fold_in) for fresh ones.
///
/// ```
/// use tessera::prelude::*;
///
/// let key = Key::new(0);
/// assert_eq!(key.data().to_vec::<u32>(), vec![0, 0]);
/// let [k1, k2] = key.split();
/// let a = random::uniform(&k1, [3], 0.0, 1.0).to_vec::<f32>();
/// assert_eq!(a, random::uniform(&k1, [3], 0.0, 1.0).to_vec::<f32>());
/// assert_ne!(a, random::uniform(&k2, [3], 0.0, 1.0).to_vec::<f32>());
/// ```
#[derive(Clone, Debug)]
pub struct Key(pub Tensor);

impl Key {
    /// `jax.random.PRNGKey(seed)` in JAX's default mode (`jax_enable_x64` off): JAX makes the
    /// seed an int32 first, so the words are `[0, seed mod 2^32]` and seeds 2^32 apart give one
    /// key, as there. `new_x64` is the x64 mode's key. (`tests/prng.rs`, against JAX's words
    /// for seeds up to `i64::MAX` and down to `i64::MIN`.)
    pub fn new(seed: i64) -> Key {
        Key::from_words(0, seed as u32)
    }

    /// `jax.random.PRNGKey(seed)` with `jax_enable_x64` on: the words `[seed >> 32, seed mod
    /// 2^32]` (the high word of a negative seed is its sign-extended high half).
    pub fn new_x64(seed: i64) -> Key {
        Key::from_words((seed >> 32) as u32, seed as u32)
    }

    /// A key from its two words.
    pub fn from_words(k0: u32, k1: u32) -> Key {
        Key(Tensor::from_vec(vec![k0, k1], [2]))
    }

    /// The key's `u32[2]` data, like `jax.random.key_data`.
    pub fn data(&self) -> &Tensor {
        &self.0
    }

    fn words(&self) -> (Tensor, Tensor) {
        let k = &self.0;
        (
            k.slice(&[0], &[1]).reshape([]),
            k.slice(&[1], &[2]).reshape([]),
        )
    }

    /// `jax.random.split(key)` into two keys.
    #[track_caller]
    pub fn split(&self) -> [Key; 2] {
        let mut v = self.split_n(2);
        let b = v.pop().expect("two keys");
        let a = v.pop().expect("two keys");
        [a, b]
    }

    /// `jax.random.split(key, n)`.
    #[track_caller]
    pub fn split_n(&self, n: usize) -> Vec<Key> {
        let (b1, b2) = threefry_counts(self, n);
        let pairs = Tensor::concatenate(&[&b1.reshape([n, 1]), &b2.reshape([n, 1])], 1);
        (0..n)
            .map(|i| Key(pairs.slice(&[i, 0], &[i + 1, 2]).reshape([2])))
            .collect()
    }

    /// `jax.random.fold_in(key, data)`.
    #[track_caller]
    pub fn fold_in(&self, data: u32) -> Key {
        let (k0, k1) = self.words();
        let (y0, y1) = threefry2x32(
            &k0,
            &k1,
            &Tensor::from_vec(vec![0u32], [1]),
            &Tensor::from_vec(vec![data], [1]),
        );
        Key(Tensor::concatenate(&[&y0, &y1], 0))
    }
}

impl Tree for Key {
    fn flatten_into(&self, leaves: &mut Vec<Tensor>) -> TreeDef {
        leaves.push(self.0.clone());
        TreeDef::node("key", vec![], vec![TreeDef::Leaf])
    }
    fn flatten_if(&self, def: &TreeDef, leaves: &mut Vec<Tensor>) -> bool {
        leaves.push(self.0.clone());
        matches!(crate::tree::unkeyed_node(def, "key"), Some([TreeDef::Leaf]))
    }
    fn unflatten_from(def: &TreeDef, leaves: &mut crate::tree::Leaves<'_>) -> crate::Result<Self> {
        let c = def.children_of("key")?;
        Ok(Key(Tensor::unflatten_from(
            c.first().unwrap_or(&TreeDef::Leaf),
            leaves,
        )?))
    }
}

#[track_caller]
fn u32s(x: u32) -> Tensor {
    Tensor::scalar(x)
}

#[track_caller]
fn rotl(x: &Tensor, r: u32) -> Tensor {
    x.shift_left(&u32s(r))
        .bitor(&x.shift_right_logical(&u32s(32 - r)))
}

/// Threefry-2x32 with 20 rounds (Random123's rotation constants) on counter words `x0`, `x1`.
#[track_caller]
fn threefry2x32(k0: &Tensor, k1: &Tensor, x0: &Tensor, x1: &Tensor) -> (Tensor, Tensor) {
    let ks = [
        k0.clone(),
        k1.clone(),
        k0.bitxor(k1).bitxor(&u32s(0x1BD1_1BDA)),
    ];
    const ROT: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let mut x0 = x0.add(&ks[0]);
    let mut x1 = x1.add(&ks[1]);
    for i in 0..5 {
        for &r in &ROT[i % 2] {
            x0 = x0.add(&x1);
            x1 = rotl(&x1, r);
            x1 = x0.bitxor(&x1);
        }
        x0 = x0.add(&ks[(i + 1) % 3]);
        x1 = x1.add(&ks[(i + 2) % 3]).add(&u32s(i as u32 + 1));
    }
    (x0, x1)
}

/// The two threefry output words for the counters `0..n` (flat indices, high word zero).
#[track_caller]
fn threefry_counts(key: &Key, n: usize) -> (Tensor, Tensor) {
    let (k0, k1) = key.words();
    let lo = Tensor::iota(DType::U32, [n], 0);
    let hi = Tensor::full_dtype([n], 0.0, DType::U32);
    threefry2x32(&k0, &k1, &hi, &lo)
}

/// `jax.random.bits(key, shape)`: uniformly random u32 words.
#[track_caller]
pub fn bits(key: &Key, shape: impl Into<Shape>) -> Tensor {
    let shape = shape.into();
    let (b1, b2) = threefry_counts(key, shape.numel());
    b1.bitxor(&b2).reshape(shape)
}

/// `jax.random.uniform(key, shape, minval, maxval)`, f32 in `[minval, maxval)`.
///
/// JAX computes `max(minval, f * (maxval - minval) + minval)` with `f` in `[0, 1)` and
/// `maxval - minval` rounded to f32; XLA:CPU contracts the multiply and the add into one fused
/// multiply-add, so the result is `f * (maxval - minval) + minval` rounded once (`fma_f32`).
#[track_caller]
pub fn uniform(key: &Key, shape: impl Into<Shape>, minval: f32, maxval: f32) -> Tensor {
    let b = bits(key, shape);
    // 23 random mantissa bits under the exponent of 1.0 give a float in [1, 2).
    let fbits = b
        .shift_right_logical(&u32s(32 - 23))
        .bitor(&u32s(1.0f32.to_bits()));
    let floats = fbits.bitcast(DType::F32) - 1.0;
    let scaled = fused_scale(&floats, maxval - minval, minval);
    scaled.maximum(&Tensor::scalar(minval))
}

/// `f * d + c` rounded once (XLA's fused multiply-add) for `f` from `uniform`, a multiple of
/// `2^-23` in `[0, 1)`, with the cheapest ops that give that rounding for these `d` and `c`,
/// decided at trace time. Every exact result is a multiple of `2^low`, `low` the lowest set bit
/// of `d 2^-23` and of `c`, and smaller than `|d| + |c|` in magnitude. When `low >= -126` no
/// result is subnormal (nothing to flush), and then:
/// - `d` a power of two: `f * d` is exact in f32, so the f32 add is the only rounding;
/// - results within 53 bits (`|d| + |c| <= 2^(low + 53)`): the f64 sum is exact, so rounding it
///   to f32 is the only rounding;
/// - otherwise (and when `low < -126`) the general `fma_f32`.
#[track_caller]
fn fused_scale(f: &Tensor, d: f32, c: f32) -> Tensor {
    /// The exponent of the lowest set bit of a finite nonzero f32.
    fn lowest_bit(v: f32) -> Option<i32> {
        if v == 0.0 || !v.is_finite() {
            return None;
        }
        let bits = v.to_bits() & 0x7fff_ffff;
        let (exp, mant) = (bits >> 23, bits & 0x007f_ffff);
        let (e, m) = if exp == 0 {
            (-149, mant)
        } else {
            (exp as i32 - 150, mant | 0x0080_0000)
        };
        Some(e + m.trailing_zeros() as i32)
    }
    if !d.is_finite() || !c.is_finite() {
        return fma_f32(f, d, c);
    }
    let low = match (lowest_bit(d).map(|l| l - 23), lowest_bit(c)) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return fma_f32(f, d, c),
    };
    if low < -126 {
        return fma_f32(f, d, c);
    }
    let power_of_two = d.is_normal() && d.to_bits() & 0x007f_ffff == 0;
    if power_of_two {
        return f * d + c;
    }
    let span = d.abs() as f64 + c.abs() as f64;
    if span <= 2f64.powi(low + 53) {
        let sum = f.astype(DType::F64) * &Tensor::scalar(d as f64) + &Tensor::scalar(c as f64);
        return sum.astype(DType::F32);
    }
    fma_f32(f, d, c)
}

/// `a * b + c` for an f32 tensor `a` and f32 numbers `b`, `c`, rounded once to f32, as a fused
/// multiply-add does; built from f64 ops (the IR has no fused multiply-add).
///
/// `p = a * b` is exact in f64 (24-bit by 24-bit significands). `s = p + c` in f64 and its error
/// `e` (Knuth's TwoSum, exact) give the exact sum `p + c = s + e`. Rounding `s` to f32 rounds
/// `s + e` correctly except when `s` is exactly halfway between two f32 values and `e != 0`:
/// every f32 midpoint is an f64, so any other `s` lies strictly inside the same half-interval
/// as `s + e`. In that case the result is the neighbour on the side of `e`. The neighbour
/// opposite `rd = f32(s)` across `s` is `n = s + (s - rd)`, and `s` is a midpoint exactly when
/// `n` differs from `s` and is an f32 (or is `2^128`, the first value past `f32::MAX`, where a
/// midpoint rounds to infinity). A subnormal result is flushed to a zero of its sign, as XLA:CPU
/// (which runs with flush-to-zero) does; subnormal `b` or `c` are not treated as zero, as
/// XLA's denormals-are-zero would.
#[track_caller]
fn fma_f32(a: &Tensor, b: f32, c: f32) -> Tensor {
    dists::fma(a, &Tensor::scalar(b), &Tensor::scalar(c))
}

/// `jax.random.normal(key, shape)`: f32 standard normal, `sqrt(2) * erf_inv(u)` with `u`
/// uniform in `(-1, 1)`, as JAX computes it. `normal_dtype` draws other float dtypes.
///
/// ```
/// use tessera::prelude::*;
///
/// let x = random::normal(&Key::new(42), [1000]);
/// assert_eq!((x.shape(), x.dtype()), (&[1000][..], DType::F32));
/// assert!(x.mean().item::<f32>().abs() < 0.1);
/// let y = (random::normal(&Key::new(42), [1000]) * 2.0 + 1.0).to_vec::<f32>(); // N(1, 4)
/// assert_eq!(y[0], x.to_vec::<f32>()[0] * 2.0 + 1.0);
/// ```
#[track_caller]
pub fn normal(key: &Key, shape: impl Into<Shape>) -> Tensor {
    let lo = f32::from_bits((-1.0f32).to_bits() - 1);
    let u = uniform(key, shape, lo, 1.0);
    u.erf_inv() * std::f32::consts::SQRT_2
}
