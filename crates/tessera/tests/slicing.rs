//! `x.index(s![..])` against JAX 0.10.2's `x[...]` (`fixtures/index/make.py`): slices with
//! negative and clamped bounds, strides, integers, an integer-tensor index beside or apart from
//! integers (NumPy's rule for where its dims go); eager, under jit on both backends, and the
//! gradient (a scatter-add of ones where elements were read).

// `1..-1` is a Python slice here, not an empty Rust range.
#![allow(clippy::reversed_empty_ranges)]

use serde_json::Value;
use tessera::prelude::*;

#[path = "support/errors.rs"]
mod errors;
use errors::err_of;

fn x() -> Tensor {
    Tensor::from_vec((0..60).map(|v| v as f32).collect(), [3, 4, 5])
}

fn ints(v: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec())
}

fn case(name: &str, x: &Tensor) -> Tensor {
    let idx = Tensor::from_vec(vec![3i32, 0, -1, 1], [4]);
    match name {
        "full" => x.index(s![..]),
        "range" => x.index(s![.., 1..3]),
        "negative_range" => x.index(s![.., 1..-1, -3..]),
        "inclusive" => x.index(s![0..=0, .., 2..=3]),
        "strided" => x.index(s![.., stride(.., 2), stride(1.., 3)]),
        "int" => x.index(s![1]),
        "int_neg" => x.index(s![-1, 2]),
        "int_mid" => x.index(s![.., 2]),
        "array" => x.index(s![.., &idx]),
        "array_int_adjacent" => x.index(s![1, &idx]),
        "array_int_after" => x.index(s![.., &idx, 0]),
        "array_int_apart" => x.index(s![0, .., &idx]),
        "array_last" => x.index(s![.., .., &idx]),
        "clamped" => x.index(s![.., 2..100, -100..2]),
        "empty" => x.index(s![.., 3..1]),
        "newaxis" => x.index(s![None, .., None, 1]),
        "newaxis_last" => x.index(s![..., None]),
        "ellipsis_mid" => x.index(s![1, ..., 2]),
        "reverse" => x.index(s![stride(.., -1)]),
        "reverse_strided" => x.index(s![.., stride(3..0, -2), stride(.., -3)]),
        "reverse_bounds" => x.index(s![.., stride(-1..-10, -1), stride(4..-100, -2)]),
        "reverse_empty" => x.index(s![.., stride(0..3, -1)]),
        "arrays_adjacent" => x.index(s![.., &idx, &ints(&[0, 4, -2, 9], &[4])]),
        "arrays_broadcast" => x.index(s![&ints(&[0, 2], &[2, 1]), .., &ints(&[1, -1, 3], &[3])]),
        "arrays_apart_newaxis" => x.index(s![&ints(&[3, 0], &[2]), None, &ints(&[1, 2], &[2])]),
        "array_int_mixed" => x.index(s![2, &ints(&[1, 0, 3, 7], &[2, 2]), stride(.., -2)]),
        "array_clamped" => x.index(s![.., &ints(&[-9, 4, 100], &[3])]),
        "array_with_reverse" => x.index(s![stride(.., -1), &idx, 1..]),
        "ellipsis_separates" => x.index(s![.., &idx, ..., &ints(&[0, 1, 2, 3], &[4])]),
        "reverse_inclusive" => x.index(s![.., stride(3..=1, -1), stride(4..=0, -2)]),
        other => panic!("no case {other}"),
    }
}

#[test]
fn index_matches_jax() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/index/index.json")).expect("JSON");
    let cases = fx.as_object().expect("cases");
    assert_eq!(cases.len(), 30);
    for (name, want) in cases {
        let shape: Vec<usize> = want["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let values: Vec<f32> = want["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_f64().expect("value") as f32)
            .collect();
        let eager = case(name, &x());
        assert_eq!(eager.shape(), &shape[..], "{name}");
        assert_eq!(eager.to_vec::<f32>(), values, "{name}");
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let n = name.clone();
            let got = jit(move |x: Tensor| case(&n, &x))
                .backend(backend)
                .call(x())
                .expect("runs");
            assert_eq!(got.to_vec::<f32>(), values, "{name} {backend:?}");
        }
    }
}

/// The gradient of a sum of `x[idx]` counts how often each element was read.
#[test]
fn index_gradient_counts_reads() {
    let idx = Tensor::from_vec(vec![1i32, 1, -1], [3]);
    let g = grad(|x: &Tensor| x.index(s![0, &idx]).sum())(&x());
    let g = g.to_vec::<f32>();
    let mut want = vec![0f32; 60];
    want[5] = 2.0; // x[0, 1, :] read twice
    want[15] = 1.0; // x[0, 3, :] once (-1)
    for j in 0..5 {
        assert_eq!(g[5 + j], want[5], "{j}");
        assert_eq!(g[15 + j], want[15], "{j}");
    }
    assert_eq!(g.iter().sum::<f32>(), 15.0);
}

#[test]
fn bad_indices_name_index_the_shape_and_the_line() {
    let here = format!("{}:", file!());
    let e = err_of(|| x().index(s![3]));
    assert!(
        e.contains("index") && e.contains("out of bounds") && e.contains("[3, 4, 5]"),
        "{e}"
    );
    assert!(e.contains(&here), "{e}");
    // A usize past i64::MAX is past the end, not -1 (the last element).
    let e = err_of(|| x().index(s![usize::MAX]));
    assert!(e.contains("out of bounds"), "{e}");
    assert_eq!(x().index(s![1..usize::MAX]).shape(), [2, 4, 5]);
    let e = err_of(|| x().index(s![0, 0, 0, 0]));
    assert!(e.contains("4 entries") && e.contains(&here), "{e}");
    let e = err_of(|| x().index(s![stride(.., 0)]));
    assert!(e.contains("step 0"), "{e}");
    let e = err_of(|| {
        let (i, j) = (ints(&[0, 1], &[2]), ints(&[0, 1, 2], &[3]));
        x().index(s![&i, &j])
    });
    assert!(
        e.contains("cannot broadcast") && e.contains("[[2], [3]]") && e.contains(&here),
        "{e}"
    );
    let e = err_of(|| x().index(s![..., 0, ...]));
    assert!(e.contains("single ellipsis") && e.contains(&here), "{e}");
    let e = err_of(|| x().index(s![None, 0, 0, 0, 0]));
    assert!(e.contains("4 entries"), "{e}");
    let e = err_of(|| x().index(s![.., &Tensor::from_vec(vec![0.5f32], [1])]));
    assert!(
        e.contains("indices must be integers") && e.contains("f32"),
        "{e}"
    );
    // An empty dim indexed by no positions is empty; by some, an error.
    let empty = || Tensor::zeros([2, 0]);
    assert_eq!(empty().index(s![.., &ints(&[], &[0])]).shape(), [2, 0]);
    let e = err_of(|| empty().index(s![.., &ints(&[0], &[1])]));
    assert!(e.contains("empty dim"), "{e}");
}

/// The gradient through negative steps, new axes and two integer tensors (clamped indices
/// read the clamped element): each element's count of reads.
#[test]
fn gradient_through_reverse_newaxis_and_several_arrays() {
    let i = ints(&[0, 2, 2, 9], &[4]);
    let j = ints(&[1, -1, -1, 0], &[4]);
    let g = grad(|x: &Tensor| {
        x.index(s![stride(.., -1), None, &i, &j])
            .mul(&Tensor::scalar(2.0f32))
            .sum()
    })(&x())
    .to_vec::<f32>();
    let mut want = vec![0f32; 60];
    for (a, b) in [(0usize, 1usize), (2, 4), (2, 4), (3, 0)] {
        for r in 0..3 {
            want[r * 20 + a * 5 + b] += 2.0;
        }
    }
    assert_eq!(g, want);
}
