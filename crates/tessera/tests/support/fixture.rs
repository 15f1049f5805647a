//! Reading the JAX fixtures (`tests/fixtures/*/`): an array is `{"shape": [..], "values": [..]}`.

use serde_json::Value;
use tessera::Tensor;

/// An array's `shape`.
pub fn shape(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

/// An f32 array: `shape` and row-major `values` (JSON numbers, rounded to f32).
pub fn tensor(v: &Value) -> Tensor {
    let data: Vec<f32> = v["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect();
    Tensor::from_vec(data, shape(v))
}
