//! The array-language front end against JAX 0.10.2 (`fixtures/einsum/einsum.json`, made by
//! `fixtures/einsum/make.py`): `einsum` (pairs, chains with a chosen contraction order,
//! ellipsis, implicit output, diagonals), NumPy-broadcasting `matmul` of every rank pair, the
//! manipulation functions (stack, split, squeeze, expand_dims, moveaxis, swapaxes, roll, tile,
//! repeat, eye, tril, triu) and reductions with signed axes and `keepdims`. Each case checks the
//! value and the gradient of `sum(out * cot)` for every input, eagerly, under `jit` on the
//! interpreter and under `jit` on Cranelift.

use serde_json::Value;
use tessera::prelude::*;

#[path = "support/fixture.rs"]
mod fixture;
use fixture::tensor;

#[path = "support/errors.rs"]
mod errors;
use errors::err_of;

/// Within float32 rounding of a sum of a few dozen terms, relative to the output's scale
/// (JAX's CPU kernels add in another order).
fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec::<f32>(), want.to_vec::<f32>());
    let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 4e-6 * scale * 8.0,
            "{what}: element {i}: got {a}, JAX {b}"
        );
    }
}

fn int(c: &Value, k: &str) -> i64 {
    c[k].as_i64().unwrap_or_else(|| panic!("{k} in {c}"))
}

fn ints(c: &Value, k: &str) -> Vec<i64> {
    c[k].as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The Rust side of one fixture case.
fn apply(c: &Value, xs: &[Tensor]) -> Tensor {
    let name = c["name"].as_str().unwrap();
    let ax = |k: &str| int(c, k);
    match name {
        "einsum" => {
            let refs: Vec<&Tensor> = xs.iter().collect();
            einsum(c["spec"].as_str().unwrap(), &refs)
        }
        "matmul" => xs[0].matmul(&xs[1]),
        "stack0" | "stack-1" => Tensor::stack(&[&xs[0], &xs[1]], ax("axis")),
        "split3" => xs[0].split(ax("sections") as usize, ax("axis"))[ax("part") as usize].clone(),
        "split_idx" => {
            let ix: Vec<usize> = ints(c, "indices").iter().map(|&i| i as usize).collect();
            xs[0].split(ix, ax("axis"))[ax("part") as usize].clone()
        }
        "squeeze" => xs[0].squeeze(ints(c, "axes")),
        "expand_dims" => xs[0].expand_dims(ax("axis")),
        "moveaxis" => xs[0].moveaxis(ax("source"), ax("destination")),
        "swapaxes" => xs[0].swapaxes(ax("a"), ax("b")),
        "roll" | "roll_neg" => xs[0].roll(ax("shift"), ax("axis")),
        "tile" => {
            let r: Vec<usize> = ints(c, "reps").iter().map(|&i| i as usize).collect();
            xs[0].tile(&r)
        }
        "repeat" => xs[0].repeat(ax("repeats") as usize, ax("axis")),
        "tril" | "tril_k" => xs[0].tril(ax("k")),
        "triu_k" => xs[0].triu(ax("k")),
        "sum_keep" | "mean_keep" | "max_neg" | "min_keep" => {
            let axes = ints(c, "axes");
            let list = if c["keepdims"].as_bool().unwrap() {
                keepdims(axes)
            } else {
                axes.into()
            };
            match c["kind"].as_str().unwrap() {
                "sum" => xs[0].sum_axes(list),
                "mean" => xs[0].mean_axes(list),
                "max" => xs[0].max_axes(list),
                "min" => xs[0].min_axes(list),
                k => panic!("kind {k}"),
            }
        }
        "softmax_neg" => xs[0].softmax(ax("axis")),
        "layernorm" => {
            let x = &xs[0];
            let mu = x.mean_axes(keepdims(-1));
            let d = x - &mu;
            let var = d.square().mean_axes(keepdims(-1));
            &d * (var + 1e-5).rsqrt()
        }
        other => panic!("no Rust side for fixture case {other}"),
    }
}

#[test]
fn jax_fixtures_values_and_grads_on_every_backend() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/einsum/einsum.json")).unwrap();
    assert_eq!(fx["jax"], "0.10.2");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for c in cases {
        let what = format!("{} {}", c["name"], c["spec"]);
        let xs: Vec<Tensor> = c["inputs"].as_array().unwrap().iter().map(tensor).collect();
        let cot = tensor(&c["cot"]);
        let want = tensor(&c["out"]);
        close(&apply(c, &xs), &want, &format!("{what} eager"));
        for backend in [Backend::Interpreter, Backend::Cranelift] {
            let f = jit(|xs: Vec<Tensor>| apply(c, &xs)).backend(backend);
            close(
                &f.call(xs.clone()).unwrap(),
                &want,
                &format!("{what} jit {backend:?}"),
            );
            let cot2 = cot.clone();
            let g = jit(move |xs: Vec<Tensor>| {
                grad(|xs: &Vec<Tensor>| (apply(c, xs) * &cot2).sum())(&xs)
            })
            .backend(backend);
            let gs = g.call(xs.clone()).unwrap();
            for (i, (got, w)) in gs.iter().zip(c["grads"].as_array().unwrap()).enumerate() {
                close(got, &tensor(w), &format!("{what} grad {i} {backend:?}"));
            }
        }
    }
}

#[test]
fn eye_matches_jax() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/einsum/einsum.json")).unwrap();
    for e in fx["eye"].as_array().unwrap() {
        let (n, m, k) = (int(e, "n") as usize, int(e, "m") as usize, int(e, "k"));
        let got = Tensor::eye(n, m, k, DType::F32);
        close(&got, &tensor(&e["out"]), &format!("eye({n}, {m}, {k})"));
    }
}

/// A 3-D by 2-D matmul is one GEMM over the folded rows, not a broadcast of the weights.
#[test]
fn matmul_of_a_batch_by_a_matrix_folds_the_batch_into_rows() {
    let x = Tensor::zeros([4, 16, 32]);
    let w = Tensor::zeros([32, 8]);
    let ir = make_ir(|(x, w): (Tensor, Tensor)| x.matmul(&w))(&(x, w))
        .unwrap()
        .traced_ir();
    assert!(!ir.contains("broadcast_in_dim"), "{ir}");
    assert!(ir.contains("f32[64,32]"), "{ir}");
    assert_eq!(ir.matches("dot_general").count(), 1, "{ir}");
}

/// A chain is contracted in the cheap order: `(2x30)(30x3)` first, then `(2x3)(3x40)`, never
/// the `30x3x40` product a left-to-right order of `a,b,c,d` with `b,c` first would build.
#[test]
fn einsum_chain_contracts_the_smallest_intermediate_first() {
    let a = Tensor::zeros([2, 30]);
    let b = Tensor::zeros([30, 3]);
    let c = Tensor::zeros([3, 40]);
    let d = Tensor::zeros([40, 2]);
    let ir =
        make_ir(|v: Vec<Tensor>| einsum("ab,bc,cd,de->ae", &[&v[0], &v[1], &v[2], &v[3]]))(&vec![
            a, b, c, d,
        ])
        .unwrap()
        .traced_ir();
    assert!(!ir.contains("f32[30,40]"), "{ir}");
    assert_eq!(ir.matches("dot_general").count(), 3, "{ir}");
}

#[test]
fn bad_axes_and_specs_name_the_op_the_shapes_and_the_line() {
    let x = Tensor::zeros([2, 3]);
    let e = err_of(|| Tensor::zeros([2, 3]).sum_axes(2));
    assert!(
        e.contains("reduce_sum") && e.contains("axis 2 is out of range for rank 2"),
        "{e}"
    );
    assert!(e.contains("array_api.rs:"), "{e}");
    let e = err_of(|| Tensor::zeros([2, 3]).sum_axes([1, -1]));
    assert!(e.contains("axis 1 is repeated"), "{e}");
    let e = err_of(|| Tensor::zeros([2, 3]).matmul(&Tensor::zeros([4, 5])));
    assert!(
        e.contains("matmul") && e.contains("3 and 4") && e.contains("f32[4,5]"),
        "{e}"
    );
    let e = err_of(|| Tensor::zeros([2, 3, 4]).matmul(&Tensor::zeros([3, 4, 5])));
    assert!(e.contains("batch dims [2] and [3] cannot broadcast"), "{e}");
    let e = err_of(|| {
        einsum(
            "ij,jk->ik",
            &[&Tensor::zeros([2, 3]), &Tensor::zeros([4, 5])],
        )
    });
    assert!(e.contains("index 'j' has size 3 and 4"), "{e}");
    let e = err_of(|| einsum("ij->ik", &[&Tensor::zeros([2, 3])]));
    assert!(e.contains("output index 'k' appears in no operand"), "{e}");
    let e = err_of(|| einsum("ijk", &[&Tensor::zeros([2, 3])]));
    assert!(
        e.contains("names 3 indices for an operand of rank 2"),
        "{e}"
    );
    // The diagonal offset's error names the op, even at offsets whose magnitude overflows.
    for (k, op) in [(1i64 << 40, "tril"), (i64::MIN, "tril"), (i64::MAX, "eye")] {
        let e = if op == "eye" {
            err_of(move || Tensor::eye(2, 3, k, DType::F32))
        } else {
            err_of(move || Tensor::zeros([2, 3]).tril(k))
        };
        assert!(
            e.contains(op) && e.contains(&format!("offset {k} exceed")),
            "{e}"
        );
    }
    let e = err_of(|| Tensor::zeros([2, 3]).triu(-(1i64 << 40)));
    assert!(e.contains("triu") && !e.contains("eye"), "{e}");
    let e = err_of(|| Tensor::zeros([2, 3]).squeeze(0));
    assert!(
        e.contains("squeeze") && e.contains("dim 0 has size 2"),
        "{e}"
    );
    let e = err_of(|| Tensor::zeros([2, 5]).split(2usize, -1)[0].clone());
    assert!(e.contains("does not divide into 2"), "{e}");
    let e = err_of(|| Tensor::stack(&[&Tensor::zeros([2]), &Tensor::zeros([3])], 0));
    assert!(e.contains("equal shapes"), "{e}");
    drop(x);
}

/// Zero-size operands: every function gives the right empty shape on both backends.
#[test]
fn zero_size_operands() {
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let f = jit(|(a, b): (Tensor, Tensor)| {
            (
                a.matmul(&b),
                einsum("bij,jk->bk", &[&a, &b]),
                a.sum_axes(keepdims(-1)),
                Tensor::stack(&[&a, &a], -1),
                a.roll(3, 1).tril(0),
                a.tile(&[2, 1, 1]).repeat(2, 0),
            )
        })
        .backend(backend);
        let (p, q, s, st, r, t) = f
            .call((Tensor::zeros([0, 3, 4]), Tensor::zeros([4, 0])))
            .unwrap();
        assert_eq!(p.shape(), [0, 3, 0]);
        assert_eq!(q.shape(), [0, 0]);
        assert_eq!(s.shape(), [0, 3, 1]);
        assert_eq!(st.shape(), [0, 3, 4, 2]);
        assert_eq!(r.shape(), [0, 3, 4]);
        assert_eq!(t.shape(), [0, 3, 4]);
    }
    let e = Tensor::eye(0, 0, 0, DType::F32);
    assert_eq!(e.shape(), [0, 0]);
}
