//! Comparing tensors in users' tests: [`allclose`] and [`assert_allclose`], NumPy's
//! `np.allclose` and `np.testing.assert_allclose` (`|actual - desired| <= atol + rtol *
//! |desired|` elementwise, shapes equal, NaN equal to NaN only with `equal_nan`, infinities
//! equal only to themselves). Values are compared in f64, whatever the dtypes.

use std::panic::Location;

use crate::error::{Error, Result, loc_text};
use crate::tensor::Tensor;

/// Tolerances of a comparison: NumPy's defaults for `np.allclose` (`rtol = 1e-5`, `atol =
/// 1e-8`, NaNs unequal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// The tolerance relative to `|desired|`.
    pub rtol: f64,
    /// The absolute tolerance.
    pub atol: f64,
    /// Whether a NaN equals a NaN.
    pub equal_nan: bool,
}

impl Default for Tol {
    fn default() -> Tol {
        Tol {
            rtol: 1e-5,
            atol: 1e-8,
            equal_nan: false,
        }
    }
}

impl Tol {
    /// Relative tolerance `rtol`, absolute tolerance `atol`, NaNs unequal.
    pub fn new(rtol: f64, atol: f64) -> Tol {
        Tol {
            rtol,
            atol,
            equal_nan: false,
        }
    }

    /// The same tolerances with NaN equal to NaN.
    pub fn equal_nan(self) -> Tol {
        Tol {
            equal_nan: true,
            ..self
        }
    }
}

fn close(a: f64, d: f64, tol: Tol) -> bool {
    if a.is_nan() || d.is_nan() {
        return tol.equal_nan && a.is_nan() && d.is_nan();
    }
    if a.is_infinite() || d.is_infinite() {
        return a == d;
    }
    (a - d).abs() <= tol.atol + tol.rtol * d.abs()
}

/// The values of a concrete tensor as f64, or an error naming the caller for a tracer.
fn values(t: &Tensor, location: &str) -> Result<Vec<f64>> {
    let a = t.try_array().map_err(|_| Error::Op {
        op: "allclose".into(),
        message: format!("{} is a tracer: compare concrete values", t.ty()),
        location: location.to_string(),
    })?;
    let lit = a.literal();
    Ok((0..lit.data.len()).map(|i| lit.data.get_f64(i)).collect())
}

/// Why `actual` is not close to `desired`, or `None` when it is.
fn mismatch(actual: &Tensor, desired: &Tensor, tol: Tol, location: &str) -> Result<Option<String>> {
    if actual.shape() != desired.shape() {
        return Ok(Some(format!(
            "shapes differ: {} vs {}",
            actual.ty(),
            desired.ty()
        )));
    }
    let (a, d) = (values(actual, location)?, values(desired, location)?);
    let bad: Vec<usize> = (0..a.len()).filter(|&i| !close(a[i], d[i], tol)).collect();
    let Some(&first) = bad.first() else {
        return Ok(None);
    };
    let finite = |i: &&usize| a[**i].is_finite() && d[**i].is_finite();
    let max_abs = bad
        .iter()
        .filter(finite)
        .map(|&i| (a[i] - d[i]).abs())
        .fold(0.0, f64::max);
    let max_rel = bad
        .iter()
        .filter(finite)
        .map(|&i| (a[i] - d[i]).abs() / d[i].abs())
        .fold(0.0, f64::max);
    let index = unravel(first, actual.shape());
    Ok(Some(format!(
        "{} of {} elements differ (rtol {}, atol {}); first at {index:?}: {} vs {}; max abs \
         difference {max_abs:e}, max relative difference {max_rel:e}",
        bad.len(),
        a.len(),
        tol.rtol,
        tol.atol,
        a[first],
        d[first]
    )))
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (k, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[k] = i % n;
            i /= n;
        }
    }
    idx
}

/// Whether two concrete tensors have one shape and close values (`np.allclose`). Errors on a
/// tracer.
#[track_caller]
pub fn allclose(actual: &Tensor, desired: &Tensor, tol: Tol) -> Result<bool> {
    let location = loc_text(Location::caller());
    Ok(mismatch(actual, desired, tol, &location)?.is_none())
}

/// Panics with the count of differing elements, the first one's index and values and the
/// largest absolute and relative differences when `actual` is not close to `desired`
/// (`np.testing.assert_allclose`, whose defaults are `rtol = 1e-7`, `atol = 0`).
///
/// ```
/// use tessera::prelude::*;
/// use tessera::testing::{Tol, assert_allclose};
///
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
/// assert_allclose(&(&x * 3.0), &Tensor::from_vec(vec![3.0f32, 6.0], [2]), Tol::new(1e-7, 0.0));
/// ```
#[track_caller]
pub fn assert_allclose(actual: &Tensor, desired: &Tensor, tol: Tol) {
    let location = loc_text(Location::caller());
    match mismatch(actual, desired, tol, &location) {
        Ok(None) => {}
        Ok(Some(why)) => panic!("assert_allclose at {location}: {why}"),
        Err(e) => panic!("{e}"),
    }
}

impl Tensor {
    /// `np.allclose(self, other, rtol, atol)`: one shape and close values; see
    /// [`testing::allclose`](crate::testing::allclose). Panics on a tracer.
    #[track_caller]
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64) -> bool {
        allclose(self, other, Tol::new(rtol, atol)).unwrap_or_else(|e| crate::error::raise(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_vec(v.to_vec(), [v.len()])
    }

    #[test]
    fn tolerances_follow_numpy() {
        let tol = Tol::new(1e-3, 0.0);
        assert!(allclose(&t(&[1000.0]), &t(&[1000.9]), tol).unwrap());
        assert!(!allclose(&t(&[1000.0]), &t(&[1001.1]), tol).unwrap());
        // atol carries values near zero.
        assert!(allclose(&t(&[1e-9]), &t(&[0.0]), Tol::default()).unwrap());
        assert!(!allclose(&t(&[1e-7]), &t(&[0.0]), Tol::default()).unwrap());
        // NaN equal to NaN only when asked; infinities only to themselves.
        assert!(!allclose(&t(&[f32::NAN]), &t(&[f32::NAN]), tol).unwrap());
        assert!(allclose(&t(&[f32::NAN]), &t(&[f32::NAN]), tol.equal_nan()).unwrap());
        assert!(allclose(&t(&[f32::INFINITY]), &t(&[f32::INFINITY]), tol).unwrap());
        assert!(!allclose(&t(&[f32::INFINITY]), &t(&[f32::NEG_INFINITY]), tol).unwrap());
        assert!(!allclose(&t(&[f32::INFINITY]), &t(&[1e30]), Tol::new(1.0, 1e38)).unwrap());
        // Other shapes are never close; other dtypes compare by value.
        assert!(!allclose(&t(&[1.0, 1.0]), &t(&[1.0]), tol).unwrap());
        let i = Tensor::from_vec(vec![1i32, 2], [2]);
        assert!(allclose(&i, &t(&[1.0, 2.0]), tol).unwrap());
        assert!(t(&[1.0, 2.0]).allclose(&t(&[1.0, 2.0001]), 1e-3, 0.0));
    }

    #[test]
    fn the_failure_message_says_where_and_by_how_much() {
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        let d = Tensor::from_vec(vec![1.0f32, 2.0, 3.5, 4.0], [2, 2]);
        let err =
            std::panic::catch_unwind(|| assert_allclose(&a, &d, Tol::new(1e-7, 0.0))).unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("1 of 4 elements differ"), "{msg}");
        assert!(msg.contains("first at [1, 0]: 3 vs 3.5"), "{msg}");
        assert!(msg.contains("max abs difference 5e-1"), "{msg}");
        assert!(msg.contains("testing.rs:"), "{msg}");
        assert_allclose(&a, &a, Tol::new(0.0, 0.0));
    }
}
