//! Sorting, top_k, cumulative ops and flip against JAX 0.10.2 (`fixtures/sort/sort.json`, made
//! by `fixtures/sort/make.py`; f32 compared bit for bit where the op is exact), on both
//! backends, with gradients; plus zero-size shapes, vmap, jvp and the errors of bad input.

use serde_json::Value;

// Only `fixture::shape` here: this file's arrays carry exact bits, not `values`.
#[allow(dead_code)]
#[path = "support/fixture.rs"]
mod fixture;
use tessera::ir::{CumulativeKind, Data, Literal, TensorType};
use tessera::{Backend, DType, Tensor, grad, jit, jvp, vmap};

fn decode(v: &Value) -> Tensor {
    let shape = fixture::shape(v);
    let ints = |k: &str| -> Vec<i64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let data = match v["dtype"].as_str().unwrap() {
        "f32" => Data::F32(
            ints("bits")
                .into_iter()
                .map(|b| f32::from_bits(b as u32))
                .collect(),
        ),
        "i32" => Data::I32(ints("ints").into_iter().map(|b| b as i32).collect()),
        "u32" => Data::U32(ints("ints").into_iter().map(|b| b as u32).collect()),
        d => panic!("dtype {d}"),
    };
    let dtype = data.dtype();
    Tensor::from_literal(Literal {
        ty: TensorType::new(dtype, shape),
        data,
    })
}

/// Bit patterns, with every NaN made one (JAX canonicalizes the NaNs it sorts).
fn bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .iter()
            .map(|x| {
                if x.is_nan() {
                    u32::MAX as u64
                } else {
                    x.to_bits() as u64
                }
            })
            .collect(),
        DType::I32 => t.to_vec::<i32>().iter().map(|&x| x as u32 as u64).collect(),
        DType::U32 => t.to_vec::<u32>().iter().map(|&x| x as u64).collect(),
        d => panic!("dtype {d}"),
    }
}

fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>(), want.to_vec::<f32>());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let tol = 2e-6 * b.abs().max(1.0);
        assert!(
            (a - b).abs() <= tol,
            "{what}: element {i}: got {a}, JAX {b}\n{g:?}\n{w:?}"
        );
    }
}

fn kind_of(op: &str) -> Option<CumulativeKind> {
    CumulativeKind::ALL.into_iter().find(|k| k.name() == op)
}

/// Runs one fixture case under `jit` on `backend`; returns the results.
fn run(case: &Value, backend: Backend) -> Vec<Tensor> {
    let op = case["op"].as_str().unwrap().to_string();
    let attrs = case["attrs"].clone();
    let inputs: Vec<Tensor> = case["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(decode)
        .collect();
    let axis = attrs["axis"].as_i64().unwrap_or(0);
    let f = jit(move |xs: Vec<Tensor>| -> Vec<Tensor> {
        match op.as_str() {
            "sort" => vec![xs[0].sort(axis)],
            "argsort" => vec![xs[0].argsort(axis)],
            "sort_multiple" => {
                let refs: Vec<&Tensor> = xs.iter().collect();
                Tensor::sort_multiple(&refs, axis, attrs["num_keys"].as_u64().unwrap() as usize)
            }
            "sort_key_val" => {
                let (k, v) = Tensor::sort_key_val(&xs[0], &xs[1], axis);
                vec![k, v]
            }
            "top_k" => {
                let (v, i) = xs[0].top_k(attrs["k"].as_u64().unwrap() as usize);
                vec![v, i]
            }
            "flip" => {
                let axes: Vec<i64> = attrs["axes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_i64().unwrap())
                    .collect();
                vec![xs[0].flip(axes)]
            }
            "sort_grad" => {
                let w = xs[1].clone();
                let g = grad(move |x: &Tensor| (x.sort(0) * &w).sum())(&xs[0]);
                vec![xs[0].sort(0), g]
            }
            name => {
                let kind = kind_of(name).unwrap_or_else(|| panic!("op {name}"));
                let reverse = attrs["reverse"].as_bool().unwrap();
                let w = xs[1].clone();
                let g =
                    grad(move |x: &Tensor| (x.cumulative(kind, axis, reverse) * &w).sum())(&xs[0]);
                vec![xs[0].cumulative(kind, axis, reverse), g]
            }
        }
    })
    .backend(backend);
    f.call(inputs).unwrap()
}

#[test]
fn jax_fixtures_on_both_backends() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/sort/sort.json")).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let got = run(case, backend);
            let want: Vec<Tensor> = case["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(decode)
                .collect();
            assert_eq!(got.len(), want.len(), "{name}");
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{name} result {j} on {backend:?}");
                assert_eq!(g.ty(), w.ty(), "{what}");
                // Values of sort/top_k/flip/cummax/cummin are exact; sums and products and
                // every gradient are compared within rounding.
                let exact = j == 0 && !matches!(case["op"].as_str().unwrap(), "cumsum" | "cumprod")
                    || g.dtype() != DType::F32;
                if exact {
                    assert_eq!(bits(g), bits(w), "{what}: {:?} vs {:?}", g, w);
                } else {
                    close(g, w, &what);
                }
            }
        }
    }
}

/// Forward mode agrees with JAX's reverse mode on every cumulative case (ties of any
/// multiplicity included): `<w, jvp(e_k)>` is JAX's gradient at `k`.
#[test]
fn cumulative_jvp_transposes_to_jaxs_gradient() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/sort/sort.json")).unwrap();
    let mut checked = 0;
    for case in fx["cases"].as_array().unwrap() {
        let Some(kind) = kind_of(case["op"].as_str().unwrap()) else {
            continue;
        };
        let name = case["name"].as_str().unwrap();
        let reverse = case["attrs"]["reverse"].as_bool().unwrap();
        let axis = case["attrs"]["axis"].as_i64().unwrap();
        let (x, w) = (decode(&case["inputs"][0]), decode(&case["inputs"][1]));
        let want = decode(&case["outputs"][1]).to_vec::<f32>();
        let wv = w.to_vec::<f32>();
        let n = x.numel();
        let mut got = Vec::with_capacity(n);
        for k in 0..n {
            let mut e = vec![0.0f32; n];
            e[k] = 1.0;
            let t = Tensor::from_vec(e, x.shape().to_vec());
            let (_, tan) = jvp(|x: &Tensor| x.cumulative(kind, axis, reverse), &x, &t);
            let tv = tan.to_vec::<f32>();
            got.push(tv.iter().zip(&wv).map(|(a, b)| a * b).sum::<f32>());
        }
        let shape = x.shape().to_vec();
        close(
            &Tensor::from_vec(got, shape.clone()),
            &Tensor::from_vec(want, shape),
            &format!("jvp of {name}"),
        );
        checked += 1;
    }
    assert!(checked >= 24, "{checked} cumulative cases");
}

#[test]
fn compiled_equals_interpreted_bit_for_bit() {
    let x = Tensor::from_vec(
        (0..300)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
            .collect::<Vec<f32>>(),
        [3, 20, 5],
    );
    for axis in [0i64, 1, 2, -1] {
        let f = |backend| {
            jit(move |x: Tensor| {
                vec![
                    x.sort(axis),
                    x.argsort(axis).astype(DType::F32),
                    x.cumsum(axis),
                    x.cumprod(axis),
                    x.cummax(axis),
                    x.cumulative(CumulativeKind::Min, axis, true),
                    x.flip([axis]),
                ]
            })
            .backend(backend)
            .call(x.clone())
            .unwrap()
        };
        let (c, i) = (f(Backend::Cranelift), f(Backend::Interpreter));
        for (a, b) in c.iter().zip(&i) {
            assert_eq!(bits(a), bits(b), "axis {axis}");
        }
    }
}

#[test]
fn zero_size_shapes() {
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        for shape in [vec![0usize], vec![3, 0], vec![0, 4], vec![2, 0, 3]] {
            let x = Tensor::zeros(shape.clone());
            let axis = shape.len() as i64 - 1;
            let out = jit(move |x: Tensor| {
                vec![
                    x.sort(axis),
                    x.argsort(axis).astype(DType::F32),
                    x.cumsum(axis),
                    x.cummax(0),
                    x.flip([0]),
                ]
            })
            .backend(backend)
            .call(x)
            .unwrap();
            for o in out {
                assert_eq!(o.shape(), &shape[..]);
            }
        }
    }
}

#[test]
fn vmap_and_jvp() {
    let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0, -1.0, 5.0, 0.5], [2, 3]);
    let rows = vmap(|r: &Tensor| (r.sort(0), r.cumsum(0), r.flip([0]))).call(&x);
    assert_eq!(rows.0.to_vec::<f32>(), vec![1.0, 2.0, 3.0, -1.0, 0.5, 5.0]);
    assert_eq!(rows.1.to_vec::<f32>(), vec![3.0, 4.0, 6.0, -1.0, 4.0, 4.5]);
    assert_eq!(rows.2.to_vec::<f32>(), vec![2.0, 1.0, 3.0, 0.5, 5.0, -1.0]);
    let t = Tensor::from_vec(vec![1.0f32, 10.0, 100.0, 1.0, 10.0, 100.0], [2, 3]);
    let (_, ts) = jvp(|x: &Tensor| x.sort(1), &x, &t);
    assert_eq!(ts.to_vec::<f32>(), vec![10.0, 100.0, 1.0, 1.0, 100.0, 10.0]);
    // cumprod through a zero: d/dx of [a, a*b, a*b*c] at (2, 0, 3) along (1, 1, 1).
    let z = Tensor::from_vec(vec![2.0f32, 0.0, 3.0], [3]);
    let one = Tensor::from_vec(vec![1.0f32, 1.0, 1.0], [3]);
    let (_, tp) = jvp(|x: &Tensor| x.cumprod(0), &z, &one);
    assert_eq!(tp.to_vec::<f32>(), vec![1.0, 2.0, 6.0]);
}

#[test]
fn bad_input_names_the_op_and_the_caller() {
    let err = std::panic::catch_unwind(|| Tensor::zeros([2, 3]).sort(2)).unwrap_err();
    let msg = err
        .downcast_ref::<tessera::Error>()
        .map(|e| e.to_string())
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("sort") && msg.contains(file!()), "{msg}");
    let err = std::panic::catch_unwind(|| Tensor::zeros([2, 3]).top_k(4)).unwrap_err();
    let msg = err
        .downcast_ref::<tessera::Error>()
        .map(|e| e.to_string())
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(
        msg.contains("top_k") && msg.contains("f32[2,3]") && msg.contains(file!()),
        "{msg}"
    );
}
