//! Conversions between tensors and `ndarray` arrays (the `ndarray` feature): a
//! standard-layout owned array moves into a tensor without copying its elements; any other
//! layout (a transposed or sliced view) is copied once in row-major order. `to_ndarray` copies
//! the tensor's elements out (a tensor's buffer is shared and immutable, an array owns its).

use std::panic::Location;

use ndarray::{ArrayBase, ArrayD, Data as NdData, Dimension, IxDyn, OwnedRepr};

use crate::error::{Error, Result, loc_text};
use crate::tensor::{Element, Tensor};

impl<T: Element, D: Dimension> From<ArrayBase<OwnedRepr<T>, D>> for Tensor {
    /// Moves the elements when the array is in standard (row-major, contiguous) layout.
    #[track_caller]
    fn from(a: ArrayBase<OwnedRepr<T>, D>) -> Tensor {
        let shape = a.shape().to_vec();
        let n = a.len();
        let data = if a.is_standard_layout() {
            let (mut v, offset) = a.into_raw_vec_and_offset();
            let offset = offset.unwrap_or(0);
            if offset == 0 && v.len() == n {
                v
            } else {
                v.drain(offset..offset + n).collect()
            }
        } else {
            a.iter().copied().collect()
        };
        Tensor::from_vec(data, shape)
    }
}

impl Tensor {
    /// A tensor from any array or view, copying its elements in row-major order.
    #[track_caller]
    pub fn from_ndarray<T: Element, S: NdData<Elem = T>, D: Dimension>(
        a: &ArrayBase<S, D>,
    ) -> Tensor {
        Tensor::from_vec(a.iter().copied().collect(), a.shape().to_vec())
    }

    /// The elements as an `ndarray` array of the tensor's shape. Errors when `T` is not the
    /// tensor's element type, or on a tracer.
    #[track_caller]
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let location = loc_text(Location::caller());
        let fail = |message: String| Error::Op {
            op: "to_ndarray".into(),
            message,
            location: location.clone(),
        };
        let a = self.try_array().map_err(|e| fail(e.to_string()))?;
        let v = T::from_data(&a.try_literal().map_err(fail)?.data)
            .ok_or_else(|| fail(format!("the tensor is {}, not {}", self.ty(), T::DTYPE)))?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), v).map_err(|e| fail(e.to_string()))
    }
}
