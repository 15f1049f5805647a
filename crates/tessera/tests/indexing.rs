//! The indexing front ends (`indexing.rs`, over gather and scatter) against jax 0.10.2
//! (`fixtures/gather/gather.json`, made by `fixtures/gather/make.py`): values on both
//! backends (the interpreter and compiled code) and gradients, with repeated, negative and
//! out-of-range indices.

use serde_json::Value;
use tessera::{Backend, DType, Tensor, grad, jit, jvp};

#[path = "support/errors.rs"]
mod errors;
use errors::err_of;

fn fx() -> Value {
    serde_json::from_str(&include_str!("fixtures/gather/gather.json").replace("NaN", "null"))
        .unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
        .collect()
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap() as i32)
        .collect()
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0) || (g.is_nan() && w.is_nan()),
            "{what}: element {k}: got {g}, jax {w}"
        );
    }
}

#[test]
fn values_match_jax_on_both_backends() {
    let f = fx();
    let x = Tensor::from_vec(floats(&f["x"]), vec![5, 4]);
    let v = Tensor::from_vec(floats(&f["v"]), vec![6, 4]);
    let idx = Tensor::from_vec(ints(&f["idx"]), vec![6]);
    let c = &f["cases"];
    let idx2 = Tensor::from_vec(vec![0i32, 3, -1, 9], vec![2, 2]);
    let starts: Vec<(i32, i32)> = f["starts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_i64().unwrap() as i32, p[1].as_i64().unwrap() as i32))
        .collect();
    type Case = (String, Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> Tensor>);
    let mut cases: Vec<Case> = vec![
        ("take_axis0".into(), Box::new(|x, i, _| x.take(i, 0))),
        ("get".into(), Box::new(|x, i, _| x.at(i).get())),
        ("at_set".into(), Box::new(|x, i, v| x.at(i).set(v))),
        ("at_add".into(), Box::new(|x, i, v| x.at(i).add(v))),
        ("at_min".into(), Box::new(|x, i, v| x.at(i).min(v))),
        ("at_max".into(), Box::new(|x, i, v| x.at(i).max(v))),
        ("at_mul".into(), Box::new(|x, i, v| x.at(i).mul(v))),
    ];
    let tal: Vec<i32> = f["tal"].as_array().unwrap().iter().flat_map(ints).collect();
    let tal = Tensor::from_vec(tal, vec![5, 3]);
    cases.push((
        "tal_axis1".into(),
        Box::new(move |x, _, _| x.take_along_axis(&tal, 1)),
    ));
    cases.push((
        "tal_axis0_bcast".into(),
        Box::new(|x, _, _| x.take_along_axis(&Tensor::from_vec(vec![4i32, -1], vec![2, 1]), 0)),
    ));
    cases.push((
        "tal_operand_bcast".into(),
        Box::new(|x, _, _| {
            let i = Tensor::from_vec(vec![3i32, 0, 1, -1, 2, 2], vec![3, 2]);
            x.slice(&[0, 0], &[1, 4]).take_along_axis(&i, -1)
        }),
    ));
    let i2 = idx2.clone();
    cases.push((
        "take_axis1".into(),
        Box::new(move |x, _, _| x.take(&i2, -1)),
    ));
    for (k, &(a, b)) in starts.iter().enumerate() {
        let s = [Tensor::scalar(a), Tensor::scalar(b)];
        let s2 = s.clone();
        cases.push((
            format!("dynamic_slice_{k}"),
            Box::new(move |x, _, _| x.dynamic_slice(&s, &[2, 3])),
        ));
        cases.push((
            format!("dynamic_update_slice_{k}"),
            Box::new(move |x, _, _| x.dynamic_update_slice(&Tensor::full(vec![2, 3], 9.0), &s2)),
        ));
    }
    for (name, f) in &cases {
        let want = floats(&c[name.as_str()]["value"]);
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let j = jit(|(x, i, v): (Tensor, Tensor, Tensor)| f(&x, &i, &v)).backend(backend);
            let got = j.call((x.clone(), idx.clone(), v.clone())).unwrap();
            close(
                &got.to_vec::<f32>(),
                &want,
                &format!("{name} ({backend:?})"),
            );
        }
        // Eagerly, too.
        close(&f(&x, &idx, &v).to_vec::<f32>(), &want, name);
    }
    let labels = Tensor::from_vec(ints(&f["labels"]), vec![5]);
    close(
        &labels.one_hot(4).to_vec::<f32>(),
        &floats(&c["one_hot"]["value"]),
        "one_hot",
    );
    assert_eq!(labels.one_hot(4).dtype(), DType::F32);
}

#[test]
fn gradients_match_jax() {
    let f = fx();
    let x = Tensor::from_vec(floats(&f["x"]), vec![5, 4]);
    let v = Tensor::from_vec(floats(&f["v"]), vec![6, 4]);
    let w = Tensor::from_vec(floats(&f["w"]), vec![6, 4]);
    let wx = Tensor::from_vec(floats(&f["wx"]), vec![5, 4]);
    let idx = Tensor::from_vec(ints(&f["idx"]), vec![6]);
    let c = &f["cases"];
    let g = grad(|x: &Tensor| x.take(&idx, 0).mul(&w).sum())(&x);
    close(
        &g.to_vec::<f32>(),
        &floats(&c["grad_take_axis0"]["grads"][0]),
        "grad take",
    );
    for (name, set) in [("grad_at_add", false), ("grad_at_set", true)] {
        let g = grad(|p: &(Tensor, Tensor)| {
            let at = p.0.at(&idx);
            let y = if set { at.set(&p.1) } else { at.add(&p.1) };
            y.mul(&wx).sum()
        })(&(x.clone(), v.clone()));
        close(&g.0.to_vec::<f32>(), &floats(&c[name]["grads"][0]), name);
        close(&g.1.to_vec::<f32>(), &floats(&c[name]["grads"][1]), name);
    }
    let tal: Vec<i32> = f["tal"].as_array().unwrap().iter().flat_map(ints).collect();
    let tal = Tensor::from_vec(tal, vec![5, 3]);
    let w3 = Tensor::from_vec(
        (0..15).map(|k| -2.0 + 3.0 * k as f32 / 14.0).collect(),
        vec![5, 3],
    );
    let g = grad(|x: &Tensor| x.take_along_axis(&tal, 1).mul(&w3).sum())(&x);
    close(
        &g.to_vec::<f32>(),
        &floats(&c["grad_tal_axis1"]["grads"][0]),
        "grad take_along_axis",
    );
    let wd = Tensor::from_vec((0..6).map(|k| k as f32).collect(), vec![2, 3]);
    let s = [Tensor::scalar(4i32), Tensor::scalar(3i32)];
    let g = grad(|x: &Tensor| x.dynamic_slice(&s, &[2, 3]).mul(&wd).sum())(&x);
    close(
        &g.to_vec::<f32>(),
        &floats(&c["grad_dynamic_slice"]["grads"][0]),
        "grad dynamic_slice",
    );
}

/// `x.at(idx).min/max/mul(v)`: the combiner named `op`.
fn combine(op: &str, x: &Tensor, idx: &Tensor, v: &Tensor) -> Tensor {
    let at = x.at(idx);
    match op {
        "min" => at.min(v),
        "max" => at.max(v),
        "mul" => at.mul(v),
        other => panic!("combiner {other}"),
    }
}

/// Scatter min/max gradients (ties among repeated updates and with the operand, dropped
/// updates) and scatter mul's (the operand's with repeated indices, both with unique ones)
/// against JAX, eagerly and under `jit` on both backends; the JVPs transpose to the same.
#[test]
fn scatter_min_max_mul_gradients_match_jax() {
    let f = fx();
    let t = |k: &str, shape: Vec<usize>| Tensor::from_vec(floats(&f[k]), shape);
    let (x, v, vt, vu, wx) = (
        t("x", vec![5, 4]),
        t("v", vec![6, 4]),
        t("vt", vec![6, 4]),
        t("vu", vec![4, 4]),
        t("wx", vec![5, 4]),
    );
    let idx = Tensor::from_vec(ints(&f["idx"]), vec![6]);
    let uidx = Tensor::from_vec(ints(&f["uidx"]), vec![4]);
    let c = &f["cases"];
    let cases = [
        ("grad_at_min", "min", &idx, &v),
        ("grad_at_min_ties", "min", &idx, &vt),
        ("grad_at_max", "max", &idx, &v),
        ("grad_at_max_ties", "max", &idx, &vt),
        ("grad_at_mul_unique", "mul", &uidx, &vu),
    ];
    for (name, op, idx, v) in cases {
        let loss = |p: &(Tensor, Tensor)| combine(op, &p.0, idx, &p.1).mul(&wx).sum();
        let (gx, gv) = grad(loss)(&(x.clone(), v.clone()));
        let (wgx, wgv) = (floats(&c[name]["grads"][0]), floats(&c[name]["grads"][1]));
        close(&gx.to_vec::<f32>(), &wgx, &format!("{name} operand"));
        close(&gv.to_vec::<f32>(), &wgv, &format!("{name} updates"));
        for backend in [Backend::Cranelift, Backend::Interpreter] {
            let (idx, wx) = (idx.clone(), wx.clone());
            let op = op.to_string();
            let got = jit(move |p: (Tensor, Tensor)| {
                let (gx, gv) =
                    grad(|p: &(Tensor, Tensor)| combine(&op, &p.0, &idx, &p.1).mul(&wx).sum())(&p);
                vec![gx, gv]
            })
            .backend(backend)
            .call((x.clone(), v.clone()))
            .unwrap();
            close(
                &got[0].to_vec::<f32>(),
                &wgx,
                &format!("{name} on {backend:?}"),
            );
            close(
                &got[1].to_vec::<f32>(),
                &wgv,
                &format!("{name} on {backend:?}"),
            );
        }
        // Forward mode, one basis tangent at a time: <wx, jvp(e_k)> is the gradient at k.
        let wv = wx.to_vec::<f32>();
        let dot =
            |t: &Tensor| -> f32 { t.to_vec::<f32>().iter().zip(&wv).map(|(a, b)| a * b).sum() };
        for k in 0..v.numel() {
            let mut e = vec![0.0f32; v.numel()];
            e[k] = 1.0;
            let e = Tensor::from_vec(e, v.shape().to_vec());
            let (_, tan) = jvp(|u: &Tensor| combine(op, &x, idx, u), v, &e);
            close(
                &[dot(&tan)],
                &wgv[k..=k],
                &format!("{name} jvp of update {k}"),
            );
        }
        for k in 0..x.numel() {
            let mut e = vec![0.0f32; x.numel()];
            e[k] = 1.0;
            let e = Tensor::from_vec(e, x.shape().to_vec());
            let (_, tan) = jvp(|x: &Tensor| combine(op, x, idx, v), &x, &e);
            close(
                &[dot(&tan)],
                &wgx[k..=k],
                &format!("{name} jvp of operand {k}"),
            );
        }
    }
    // A NaN operand element that no update lands on passes its gradient through.
    let xn = Tensor::from_vec(vec![f32::NAN, 1.0, 5.0], [3]);
    let wn = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let one = Tensor::from_vec(vec![1i32], [1]);
    let (gx, gv) = grad(|p: &(Tensor, Tensor)| p.0.at(&one).max(&p.1).mul(&wn).sum())(&(
        xn,
        Tensor::from_vec(vec![2.0f32], [1]),
    ));
    close(
        &gx.to_vec::<f32>(),
        &floats(&c["grad_at_max_nan"]["grads"][0]),
        "max nan x",
    );
    close(
        &gv.to_vec::<f32>(),
        &floats(&c["grad_at_max_nan"]["grads"][1]),
        "max nan v",
    );
    let g = grad(|x: &Tensor| x.at(&idx).mul(&v).mul(&wx).sum())(&x);
    close(
        &g.to_vec::<f32>(),
        &floats(&c["grad_at_mul_x"]["grads"][0]),
        "grad_at_mul_x",
    );
}

/// Scatter mul's updates gradient with repeated indices (which JAX does not differentiate),
/// zeros among the updates (one and two at a target) and dropped updates, against central
/// differences in f64: the loss is linear in each update, so the difference is exact up to
/// rounding.
#[test]
fn scatter_mul_gradient_with_repeated_indices_against_finite_differences() {
    let x = Tensor::from_vec(
        (0..12).map(|k| 0.5 + k as f64 * 0.25).collect::<Vec<f64>>(),
        [4, 3],
    );
    let idx = Tensor::from_vec(vec![1i32, 1, 2, 2, 2, 0, 3, 3, 9, -1], [10]);
    let mut vals: Vec<f64> = (0..30).map(|k| 0.75 + (k % 7) as f64 * 0.5).collect();
    // Row 2 gets one zero in column 0 and two zeros in column 1; row 3 a zero in column 2.
    vals[6] = 0.0;
    vals[7] = 0.0;
    vals[10] = 0.0;
    vals[20] = 0.0;
    let v = Tensor::from_vec(vals.clone(), [10, 3]);
    let w = Tensor::from_vec(
        (0..12)
            .map(|k| 1.0 - k as f64 * 0.125)
            .collect::<Vec<f64>>(),
        [4, 3],
    );
    let loss = |v: &Tensor| x.at(&idx).mul(v).mul(&w).sum();
    let g = grad(loss)(&v).to_vec::<f64>();
    for k in 0..vals.len() {
        let at = |d: f64| {
            let mut p = vals.clone();
            p[k] += d;
            loss(&Tensor::from_vec(p, [10, 3])).to_vec::<f64>()[0]
        };
        let fd = (at(0.5) - at(-0.5)) / 1.0;
        assert!(
            (g[k] - fd).abs() <= 1e-12 * fd.abs().max(1.0),
            "update {k}: grad {} vs central difference {fd}",
            g[k]
        );
    }
    // An update alone at its target gets `g * x` exactly, even an infinite one (the others'
    // product is the empty product, not `inf / inf`).
    let lone = Tensor::from_vec(vec![f64::INFINITY, 2.0, 3.0], [1, 3]);
    let one = Tensor::from_vec(vec![2i32], [1]);
    let gl = grad(|v: &Tensor| x.at(&one).mul(v).mul(&w).sum())(&lone).to_vec::<f64>();
    let (xv, wv) = (x.to_vec::<f64>(), w.to_vec::<f64>());
    assert_eq!(gl, (6..9).map(|k| xv[k] * wv[k]).collect::<Vec<f64>>());
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let (x, idx, w) = (x.clone(), idx.clone(), w.clone());
        let got = jit(move |v: Tensor| grad(|v: &Tensor| x.at(&idx).mul(v).mul(&w).sum())(&v))
            .backend(backend)
            .call(v.clone())
            .unwrap()
            .to_vec::<f64>();
        assert_eq!(got, g, "{backend:?}");
    }
}

/// `take_along_axis`'s bad input names the op, both types and the caller's line; a zero-size
/// result of an empty axis is no error.
#[test]
fn take_along_axis_errors_and_empty_shapes() {
    let x = Tensor::zeros([2, 3]);
    let e = err_of(|| {
        Tensor::zeros([2, 3]).take_along_axis(&Tensor::full_dtype([2], 0.0, DType::I32), 1)
    });
    assert!(
        e.contains("take_along_axis") && e.contains("i32[2]") && e.contains("f32[2,3]"),
        "{e}"
    );
    assert!(e.contains("indexing.rs:"), "{e}");
    let e = err_of(|| {
        Tensor::zeros([2, 3]).take_along_axis(&Tensor::full_dtype([4, 1], 0.0, DType::I32), 1)
    });
    assert!(e.contains("dim 0") && e.contains("cannot broadcast"), "{e}");
    let e = err_of(|| {
        Tensor::zeros([2, 3]).take_along_axis(&Tensor::full_dtype([2, 1], 0.0, DType::F32), 1)
    });
    assert!(e.contains("indices must be i32 or u32"), "{e}");
    let e = err_of(|| {
        Tensor::zeros([2, 0]).take_along_axis(&Tensor::full_dtype([2, 1], 0.0, DType::I32), 1)
    });
    assert!(e.contains("empty axis 1"), "{e}");
    // No index from an empty axis: the empty result (before, the gather's type rule refused
    // the slice of an empty dim with an internal message).
    let none = Tensor::full_dtype([0], 0.0, DType::I32);
    assert_eq!(Tensor::zeros([0, 3]).take(&none, 0).shape(), &[0, 3]);
    assert_eq!(Tensor::zeros([0, 3]).at(&none).get().shape(), &[0, 3]);
    let none2 = Tensor::full_dtype([3, 0], 0.0, DType::I32);
    assert_eq!(Tensor::zeros([2, 0]).take(&none2, 1).shape(), &[2, 3, 0]);
    let empty = x.take_along_axis(&Tensor::full_dtype([2, 0], 0.0, DType::I32), 1);
    assert_eq!(empty.shape(), &[2, 0]);
    let empty =
        Tensor::zeros([0, 3]).take_along_axis(&Tensor::full_dtype([0, 2], 0.0, DType::I32), 1);
    assert_eq!(empty.shape(), &[0, 2]);
}

/// Errors raised inside the front ends' helpers name the caller's line, not the library's
/// (they were closures, which report their own); one_hot's size error names one_hot; i64
/// starts and labels are accepted.
#[test]
fn helper_errors_name_the_callers_line() {
    let here = format!("{}:", file!());
    let e = err_of(|| Tensor::zeros([4]).dynamic_slice(&[Tensor::scalar(1.5f32)], &[2]));
    assert!(e.contains("dynamic_slice") && e.contains(&here), "{e}");
    let e = err_of(|| {
        let w = Tensor::zeros([1, 1, 2]);
        Tensor::zeros([1, 1, 4])
            .conv_general_dilated(&w, tessera::prelude::ConvOptions::new().strides(vec![1, 1]))
    });
    assert!(e.contains("strides") && e.contains(&here), "{e}");
    let e = err_of(|| Tensor::full_dtype([1 << 20], 0.0, DType::I32).one_hot(1 << 50));
    assert!(e.starts_with("one_hot") || e.contains("one_hot:"), "{e}");
    assert!(!e.contains("iota") && e.contains(&here), "{e}");
    let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0], [4]);
    let s = x.dynamic_slice(&[Tensor::scalar(-3i64)], &[2]);
    assert_eq!(s.to_vec::<f32>(), [1.0, 2.0]);
    let oh = Tensor::from_vec(vec![2i64, 0], [2]).one_hot(3);
    assert_eq!(oh.to_vec::<f32>(), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
}
