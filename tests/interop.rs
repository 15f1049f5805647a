//! NumPy-style interop (issue 16, item 5): `ndarray` arrays convert to tensors and back with
//! shape and element type checked, a standard-layout array moves in without a copy, and the
//! `testing` comparisons work on the results.

use ndarray::{Array2, ArrayD, IxDyn, array, s};
use tessera::prelude::*;
use tessera::testing::{Tol, assert_allclose};

fn data_ptr(t: &Tensor) -> *const u8 {
    t.try_array().unwrap().literal().data.as_ptr()
}

#[test]
fn a_standard_layout_array_moves_in_without_a_copy() {
    let a: Array2<f32> = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let p = a.as_ptr() as *const u8;
    let t = Tensor::from(a);
    assert_eq!(t.shape(), [2, 3]);
    assert_eq!(t.to_vec::<f32>(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(data_ptr(&t), p, "the elements were moved, not copied");
}

#[test]
fn other_layouts_copy_in_row_major_order() {
    let a: Array2<i32> = array![[1, 2, 3], [4, 5, 6]];
    let t = Tensor::from(a.t().to_owned());
    assert_eq!(t.shape(), [3, 2]);
    assert_eq!(t.to_vec::<i32>(), [1, 4, 2, 5, 3, 6]);
    let v = Tensor::from_ndarray(&a.slice(s![.., 1..]));
    assert_eq!(v.to_vec::<i32>(), [2, 3, 5, 6]);
    let reversed = Tensor::from_ndarray(&a.slice(s![..;-1, ..]));
    assert_eq!(reversed.to_vec::<i32>(), [4, 5, 6, 1, 2, 3]);
    // A sliced owned array in standard layout but not starting at its buffer's start.
    let mut owned = array![[0.0f64, 1.0], [2.0, 3.0], [4.0, 5.0]];
    owned.slice_collapse(s![1.., ..]);
    assert!(owned.is_standard_layout());
    assert_eq!(Tensor::from(owned).to_vec::<f64>(), [2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn round_trip_through_a_jitted_function() {
    let x = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![0.5f32, -1.0, 2.0, 0.0]).unwrap();
    let f = jit(|x: Tensor| x.exp() * 2.0);
    let y = f
        .call(Tensor::from(x.clone()))
        .unwrap()
        .to_ndarray::<f32>()
        .unwrap();
    assert_eq!(y.shape(), [2, 2]);
    let want = x.mapv(|v| v.exp() * 2.0);
    assert_allclose(&Tensor::from(y), &Tensor::from(want), Tol::new(2e-7, 0.0));
    let zero = ArrayD::<f32>::zeros(IxDyn(&[0, 3]));
    assert_eq!(Tensor::from(zero).shape(), [0, 3]);
}

#[test]
fn reading_back_the_wrong_type_or_a_tracer_is_an_error() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let msg = t.to_ndarray::<i32>().unwrap_err().to_string();
    assert!(
        msg.contains("to_ndarray") && msg.contains("f32[2]") && msg.contains("i32"),
        "{msg}"
    );
    assert!(msg.contains("interop.rs:"), "{msg}");
    let f = jit(|x: Tensor| {
        let e = x.to_ndarray::<f32>().unwrap_err().to_string();
        assert!(e.contains("tracer"), "{e}");
        x
    });
    f.call(t).unwrap();
}
