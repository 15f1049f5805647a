//! `visualize_array_sharding` draws JAX 0.10.2's tables (`fixtures/visualize/make.py`): 1-D
//! arrays as a row of cells, 2-D arrays as a grid, cells sized and labels placed as JAX's
//! rich layout does, on 1-D and 2-D meshes, split, replicated and partly replicated; other
//! ranks are JAX's error.

use serde_json::Value;
use tessera::prelude::*;

#[test]
fn tables_are_jaxs_and_other_ranks_are_an_error() {
    // SAFETY: set before the device pool starts, before any other thread reads the
    // environment; the only test of this binary.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    let fx: Value =
        serde_json::from_str(include_str!("fixtures/visualize/visualize.json")).expect("fixture");
    let meshes = [
        ("d", Mesh::new([8], ["d"])),
        ("dp,mp", Mesh::new([4, 2], ["dp", "mp"])),
        ("a,b", Mesh::new([2, 4], ["a", "b"])),
    ];
    let mut drawn = 0;
    for case in fx["cases"].as_array().expect("cases") {
        let mesh = &meshes
            .iter()
            .find(|(n, _)| *n == case["mesh"].as_str().expect("mesh"))
            .expect("a known mesh")
            .1;
        let shape: Vec<usize> = case["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let spec: Vec<Vec<String>> = case["spec"]
            .as_array()
            .expect("spec")
            .iter()
            .map(|e| {
                e.as_array()
                    .expect("axes")
                    .iter()
                    .map(|a| a.as_str().expect("axis").to_string())
                    .collect()
            })
            .collect();
        let x = device_put(
            Tensor::zeros(shape.clone()),
            NamedSharding::new(mesh, PartitionSpec(spec.clone())),
        );
        match (&case["text"], &case["error"]) {
            (Value::String(want), _) => {
                let got = sharding_table(&x);
                // JAX prints a blank line after the table.
                assert_eq!(got, want.trim_end(), "{shape:?} {spec:?}:\n{got}\n{want}");
                drawn += 1;
            }
            (_, Value::String(jax)) => {
                let e =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sharding_table(&x)))
                        .expect_err("JAX refuses");
                let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
                let key = jax.trim_end_matches('.');
                assert!(text.contains(key), "{text} lacks {key}");
                assert!(text.contains("visualize.rs:"), "{text}");
            }
            _ => panic!("a case has a text or an error"),
        }
    }
    assert_eq!(drawn, 14);
    // A host value: one cell, device 0.
    assert!(sharding_table(&Tensor::zeros([4])).contains("CPU 0"));
}
