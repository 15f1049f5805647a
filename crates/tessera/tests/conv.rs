//! Convolution and pooling against JAX 0.10.2 (`fixtures/conv/conv.json`, made by
//! `fixtures/conv/make.py`): strides, explicit and negative padding, lhs and rhs dilation,
//! feature and batch groups, another layout, a window larger than its input, and max/sum/min
//! `reduce_window` with ties and padding. Each case checks the value eagerly, under `jit` on
//! the interpreter and on Cranelift, and the gradient of `sum(out * w)` for every input.

use serde_json::Value;
use tessera::Backend;
use tessera::ir::ReduceKind;
use tessera::prelude::*;

#[path = "support/fixture.rs"]
mod fixture;
use fixture::tensor;

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn pads(v: &Value) -> Vec<(i64, i64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_i64().unwrap(), p[1].as_i64().unwrap()))
        .collect()
}

/// Within f32 rounding of sums of a few dozen terms, relative to the output's scale (JAX's
/// CPU kernels sum in another order).
fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>(), want.to_vec::<f32>());
    let scale = w.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 2e-6 * scale * 16.0,
            "{what}: element {k}: got {a}, jax {b}"
        );
    }
}

type CaseOp = Box<dyn Fn(&[Tensor]) -> Tensor>;

/// The case's op as a function of its inputs.
fn op_of(c: &Value) -> CaseOp {
    let p = c["params"].clone();
    if p.get("kind").is_some() {
        let kind = match p["kind"].as_str().unwrap() {
            "max" => ReduceKind::Max,
            "sum" => ReduceKind::Sum,
            _ => ReduceKind::Min,
        };
        return Box::new(move |x: &[Tensor]| {
            x[0].reduce_window(
                kind,
                &usizes(&p["window"]),
                &usizes(&p["strides"]),
                Padding::Explicit(pads(&p["padding"])),
            )
        });
    }
    Box::new(move |x: &[Tensor]| {
        let l = |i: usize| p["layout"][i].as_str().unwrap().to_string();
        let opts = ConvOptions::new()
            .strides(usizes(&p["strides"]))
            .padding(pads(&p["padding"]))
            .lhs_dilation(usizes(&p["lhs_dilation"]))
            .rhs_dilation(usizes(&p["rhs_dilation"]))
            .layout(&l(0), &l(1), &l(2))
            .feature_groups(p["feature_groups"].as_u64().unwrap() as usize)
            .batch_groups(p["batch_groups"].as_u64().unwrap() as usize);
        x[0].conv_general_dilated(&x[1], opts)
    })
}

#[test]
fn convolutions_and_pools_match_jax() {
    let all: Value =
        serde_json::from_str(include_str!("fixtures/conv/conv.json")).expect("valid JSON");
    let cases = all["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 15);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let inputs: Vec<Tensor> = c["inputs"].as_array().unwrap().iter().map(tensor).collect();
        let want = tensor(&c["out"]);
        let f = op_of(c);
        close(&f(&inputs), &want, &format!("{name} eager"));
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let j = jit(|x: Vec<Tensor>| f(&x)).backend(backend);
            let got = j.call(inputs.clone()).unwrap();
            close(&got, &want, &format!("{name} {backend:?}"));
        }
        let w = {
            let n = want.ty().numel();
            let v: Vec<f32> = (0..n)
                .map(|i| -1.0 + 2.0 * i as f32 / (n.max(2) - 1) as f32)
                .collect();
            Tensor::from_vec(v, want.shape().to_vec())
        };
        let g = grad(|x: &Vec<Tensor>| f(x).mul(&w).sum())(&inputs);
        for (i, gw) in c["grads"].as_array().unwrap().iter().enumerate() {
            close(&g[i], &tensor(gw), &format!("{name} grad {i}"));
        }
    }
}

/// A kernel holding inf and NaN next to the padding: the padded taps add nothing (no
/// `0 * inf`), on every backend, bit for bit. (XLA:CPU itself depends on the shape here: with
/// one output feature it gives these values; with two it gives NaN at padded positions.)
#[test]
fn a_nonfinite_kernel_next_to_padding_skips_the_padding() {
    let x = Tensor::from_vec(vec![1f32, 2.0, 3.0], vec![1, 1, 3]);
    let k = Tensor::from_vec(vec![f32::INFINITY, 1.0, f32::NAN, -1.0], vec![2, 1, 2]);
    let f = |x: &Tensor, k: &Tensor| x.conv(k, &[1], vec![(1, 1)]);
    let bits = |t: &Tensor| -> Vec<u32> { t.to_vec::<f32>().iter().map(|v| v.to_bits()).collect() };
    let eager = f(&x, &k);
    let inf = f32::INFINITY;
    // Feature 0: [pad, 1] . [inf, 1] = 1, then inf * 1 + 2, inf * 2 + 3, inf * 3 + pad * 1.
    let want0 = [1.0, inf, inf, inf];
    assert_eq!(&eager.to_vec::<f32>()[..4], &want0);
    // Feature 1: -1 at the first position (the NaN tap is padding), NaN after.
    assert_eq!(eager.to_vec::<f32>()[4], -1.0);
    assert!(eager.to_vec::<f32>()[5..].iter().all(|v| v.is_nan()));
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let j = jit(|(x, k): (Tensor, Tensor)| f(&x, &k)).backend(backend);
        let got = j.call((x.clone(), k.clone())).unwrap();
        assert_eq!(bits(&got), bits(&eager), "{backend:?}");
    }
}

/// A dilation so large the dilated window overflows usize gives the empty result of a window
/// larger than its input, as a large finite one does (before, an arithmetic overflow panicked
/// inside the front end).
#[test]
fn an_overflowing_dilated_window_gives_an_empty_result() {
    let x = Tensor::zeros([1, 1, 4]);
    let w = Tensor::zeros([1, 1, 2]);
    for d in [usize::MAX, 1 << 63, 4] {
        let y = x.conv_general_dilated(&w, ConvOptions::new().rhs_dilation(vec![d]));
        assert_eq!(y.shape(), &[1, 1, 0], "rhs_dilation {d}");
    }
}

/// A tiling pool's gradient (`tessera_autodiff::conv::tiled_vjp`): a max's (min's) cotangent
/// goes to the first position of each window, in row-major window order, whose element equals
/// the result (-0 equals +0; a NaN result passes none), a sum's to every position, and the
/// rows and columns no window reaches get zero. Checked bit for bit against that rule written
/// as loops, eagerly and under `jit` on both backends, with ties in every window.
#[test]
fn tiling_pool_gradients_go_to_the_first_extreme_of_each_window() {
    let dims = [2usize, 5, 7, 3];
    let (window, strides) = ([1usize, 2, 3, 1], [1usize, 2, 3, 1]);
    let n: usize = dims.iter().product();
    let pick = [
        2.0f32,
        -1.0,
        0.0,
        -0.0,
        2.0,
        f32::NAN,
        -1.0,
        f32::INFINITY,
        0.0,
    ];
    let xs: Vec<f32> = (0..n).map(|i| pick[(i * 7 + i / 5) % pick.len()]).collect();
    let x = Tensor::from_vec(xs.clone(), dims.to_vec());
    let out = [2usize, 2, 2, 3];
    let m: usize = out.iter().product();
    let ws: Vec<f32> = (0..m).map(|i| 1.0 + i as f32).collect();
    let w = Tensor::from_vec(ws.clone(), out.to_vec());
    let at = |d: [usize; 4], shape: [usize; 4]| {
        ((d[0] * shape[1] + d[1]) * shape[2] + d[2]) * shape[3] + d[3]
    };
    for kind in [ReduceKind::Max, ReduceKind::Min, ReduceKind::Sum] {
        let pool = move |x: &Tensor| x.reduce_window(kind, &window, &strides, "VALID");
        let y = pool(&x).to_vec::<f32>();
        let mut want = vec![0f32; n];
        for o in 0..m {
            let od = [o / 12, o / 6 % 2, o / 3 % 2, o % 3];
            let mut first = true;
            for p in 0..2 {
                for q in 0..3 {
                    let i = at([od[0], od[1] * 2 + p, od[2] * 3 + q, od[3]], dims);
                    let hit = match kind {
                        ReduceKind::Sum => true,
                        ReduceKind::Max | ReduceKind::Min => first && xs[i] == y[o],
                    };
                    if hit {
                        want[i] = ws[o];
                        first = kind == ReduceKind::Sum;
                    }
                }
            }
        }
        // Some windows tie, and some hold a NaN (no gradient there).
        assert!(y.iter().any(|v| v.is_nan()) || kind == ReduceKind::Sum);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let loss = move |x: &Tensor, w: &Tensor| pool(x).mul(w).sum();
        let eager = grad(|x: &Tensor| loss(x, &w))(&x);
        assert_eq!(bits(&eager.to_vec::<f32>()), bits(&want), "{kind:?} eager");
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let j = jit(move |(x, w): (Tensor, Tensor)| grad(|x: &Tensor| loss(x, &w))(&x))
                .backend(backend);
            let got = j.call((x.clone(), w.clone())).unwrap();
            assert_eq!(
                bits(&got.to_vec::<f32>()),
                bits(&want),
                "{kind:?} {backend:?}"
            );
        }
    }
}

/// The tiling pool's gradient composes with the other transformations: under `vmap` it is
/// each example's gradient, and differentiated again it is zero (the pool's gradient is
/// piecewise constant in the operand), on both backends.
#[test]
fn tiling_pool_gradients_compose_with_vmap_and_grad() {
    let n = 3 * 4 * 6;
    let xs: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let x = Tensor::from_vec(xs, vec![3, 4, 6]);
    let w = Tensor::from_vec((1..=4).map(|v| v as f32).collect(), vec![2, 2]);
    let pool = |x: &Tensor| x.reduce_window(ReduceKind::Max, &[2, 3], &[2, 3], "VALID");
    let g = |x: &Tensor, w: &Tensor| grad(|x: &Tensor| pool(x).mul(w).sum())(x);
    let batched = vmap(|x: &Tensor| g(x, &w)).call(&x);
    let bits = |t: &Tensor| {
        t.to_vec::<f32>()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    for i in 0..3 {
        let one = g(&x.slice(&[i, 0, 0], &[i + 1, 4, 6]).reshape([4, 6]), &w);
        let row = batched.slice(&[i, 0, 0], &[i + 1, 4, 6]).reshape([4, 6]);
        assert_eq!(bits(&row), bits(&one), "example {i}");
        // Each window's cotangent lands once.
        assert_eq!(one.sum().to_vec::<f32>(), vec![10.0]);
    }
    let x0 = x.slice(&[1, 0, 0], &[2, 4, 6]).reshape([4, 6]);
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let second = jit(|(x, w): (Tensor, Tensor)| grad(|x: &Tensor| g(x, &w).mul(x).sum())(&x))
            .backend(backend)
            .call((x0.clone(), w.clone()))
            .unwrap();
        // d/dx sum(g(x) * x) = g(x) + (dg/dx)^T x = g(x): the second term is zero.
        assert_eq!(bits(&second), bits(&g(&x0, &w)), "{backend:?}");
    }
}
