//! Zero-size tensors work in every op on both backends: every corpus sample with a 0 put in
//! each dim in turn (where the op allows one) runs on the interpreter and as native code with
//! bit-identical results; and zero-size programs through the user API give the values NumPy
//! gives (a dot over an empty contracting dim is zeros, a reduction over an empty dim is the
//! identity, a concatenate skips its empty operands, a pad of an empty input is all padding).

use tessera::ir::corpus::{Lcg, covered_op_names, op_samples, random_inputs};
use tessera::ir::{ALL_OP_NAMES, Data, Graph, Literal, Op, REGION_OP_NAMES, TensorType};
use tessera::{Backend, DType, DotDims, Tensor, jit};
use tessera_interp::{SingleDevice, run};

/// `op`'s attributes adjusted to operands whose dim `d` of operand `p` (and, for the listed
/// partner dims, of the others) became 0, where the attributes name sizes.
fn adapt(op: &Op, p: usize, d: usize) -> Op {
    match op {
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let (mut start, mut limit) = (start.clone(), limit.clone());
            start[d] = 0;
            limit[d] = 0;
            Op::Slice {
                start,
                limit,
                stride: stride.clone(),
            }
        }
        Op::BroadcastInDim { shape, dims } => {
            let mut shape = shape.clone();
            shape.0[dims[d]] = 0;
            Op::BroadcastInDim {
                shape,
                dims: dims.clone(),
            }
        }
        Op::Reshape(shape) => {
            let mut shape = shape.clone();
            shape.0[if p == 0 { 0 } else { d }] = 0;
            Op::Reshape(shape)
        }
        // tidy: allow-wildcard(a test helper: only ops whose attributes name sizes change)
        other => other.clone(),
    }
}

/// The sample's op rebuilt over parameters of the given types, if its type rule accepts them.
fn rebuild(sample: &Graph, op: Op, params: &[TensorType]) -> Option<Graph> {
    let mut g = Graph::new("zero");
    g.mesh = sample.mesh.clone();
    let ps: Vec<_> = params.iter().map(|t| g.add_param(t.clone())).collect();
    let n = g.add(op, &ps).ok()?;
    g.set_outputs(vec![n]);
    Some(g)
}

fn with_zero(t: &TensorType, d: usize) -> TensorType {
    let mut dims = t.dims().to_vec();
    dims[d] = 0;
    TensorType::new(t.dtype, dims)
}

/// Zero-size variants of one single-op sample: for each parameter dim, that dim alone set to
/// 0, else the same dim of every parameter of that rank (elementwise ops, concatenate's other
/// dims), else the dims a dot pairs with it; for ops without operands (iota, constant), each
/// result dim in turn.
fn zero_variants(g: &Graph) -> Vec<(String, Graph)> {
    let out = g.outputs()[0];
    let op = g.op(out).clone();
    let types: Vec<TensorType> = g.params().iter().map(|&p| g.ty(p).clone()).collect();
    let mut variants = Vec::new();
    for (p, t) in types.iter().enumerate() {
        for d in 0..t.rank() {
            let adapted = adapt(&op, p, d);
            let alone: Vec<TensorType> = types
                .iter()
                .enumerate()
                .map(|(q, u)| if q == p { with_zero(u, d) } else { u.clone() })
                .collect();
            let same_rank: Vec<TensorType> = types
                .iter()
                .map(|u| {
                    if u.rank() == t.rank() {
                        with_zero(u, d)
                    } else {
                        u.clone()
                    }
                })
                .collect();
            let paired = match &op {
                Op::DotGeneral(dd) => {
                    let (mine, theirs) = if p == 0 {
                        (&dd.lhs_batch, &dd.rhs_batch)
                    } else {
                        (&dd.rhs_batch, &dd.lhs_batch)
                    };
                    let (mine_c, theirs_c) = if p == 0 {
                        (&dd.lhs_contract, &dd.rhs_contract)
                    } else {
                        (&dd.rhs_contract, &dd.lhs_contract)
                    };
                    let partner = mine
                        .iter()
                        .position(|&x| x == d)
                        .map(|i| theirs[i])
                        .or_else(|| mine_c.iter().position(|&x| x == d).map(|i| theirs_c[i]));
                    partner.map(|e| {
                        let mut v = alone.clone();
                        v[1 - p] = with_zero(&types[1 - p], e);
                        v
                    })
                }
                // tidy: allow-wildcard(a test helper: only dots pair dims of two operands)
                _ => None,
            };
            let candidates = [Some(alone), Some(same_rank), paired];
            if let Some(graph) = candidates
                .into_iter()
                .flatten()
                .find_map(|ps| rebuild(g, adapted.clone(), &ps))
            {
                variants.push((format!("operand {p} dim {d}"), graph));
            }
        }
    }
    let ty = g.ty(out).clone();
    for d in 0..ty.rank() {
        let zero = with_zero(&ty, d);
        let op = match &op {
            Op::Iota { dim, .. } => Op::Iota {
                dim: *dim,
                ty: zero,
            },
            Op::Constant(_) => Op::Constant(Literal::zeros(&zero)),
            // tidy: allow-wildcard(a test helper: only nullary ops with a type attribute get a zero-size variant)
            _ => continue,
        };
        if let Some(graph) = rebuild(g, op, &[]) {
            variants.push((format!("result dim {d}"), graph));
        }
    }
    variants
}

#[test]
fn every_corpus_op_with_a_zero_dim_runs_on_both_backends_bit_for_bit() {
    let samples = op_samples();
    let mut covered = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    let mut count = 0;
    let mut nonempty_results = 0;
    let mut rng = Lcg(5);
    for s in &samples {
        for (what, g) in zero_variants(&s.graph) {
            let name = format!("{} ({what})", s.name);
            count += 1;
            covered.extend(covered_op_names(std::slice::from_ref(
                &tessera::ir::corpus::Sample {
                    name: name.clone(),
                    graph: g.clone(),
                },
            )));
            tessera::ir::verify(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sample = tessera::ir::corpus::Sample {
                name: name.clone(),
                graph: g,
            };
            let inputs = random_inputs(&sample, &mut rng);
            let g = &sample.graph;
            let want = match run(g, &inputs) {
                Ok(w) => w,
                Err(e) => {
                    failures.push(format!("{name}: interpreter: {e}"));
                    continue;
                }
            };
            if want[0].ty.numel() > 0 {
                nonempty_results += 1;
            }
            let exe = match tessera_codegen::compile(g) {
                Ok(e) => e,
                Err(e) => {
                    failures.push(format!("{name}: compile: {e}"));
                    continue;
                }
            };
            let refs: Vec<&Literal> = inputs.iter().collect();
            match exe.run(&refs, &SingleDevice) {
                Ok(got) if got == want => {}
                Ok(got) => failures.push(format!(
                    "{name}: compiled {:?}, interpreted {:?}",
                    got[0].to_f64_vec(),
                    want[0].to_f64_vec()
                )),
                Err(e) => failures.push(format!("{name}: run: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} zero-size variants fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every op has a zero-size variant (argmax only over a non-reduced dim), but axis_index,
    // whose result is always a scalar, and the region ops, which have no one-op sample: their
    // zero-size carries, xs and results are in `tessera-codegen/tests/regions.rs`.
    let missing: Vec<_> = ALL_OP_NAMES
        .iter()
        .filter(|n| !covered.contains(*n) && **n != "axis_index" && !REGION_OP_NAMES.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a zero-size variant: {missing:?}"
    );
    assert!(
        nonempty_results > 50,
        "only {nonempty_results} of {count} variants have a non-empty result"
    );
    eprintln!("{count} zero-size variants, {nonempty_results} with a non-empty result");
}

fn both_backends(check: impl Fn(Backend)) {
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        check(backend);
    }
}

#[test]
fn concatenate_with_a_zero_size_operand() {
    both_backends(|b| {
        let f = jit(|(x, e, y): (Tensor, Tensor, Tensor)| Tensor::concatenate(&[&x, &e, &y], 1))
            .backend(b);
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        let e = Tensor::zeros([2, 0]);
        let y = Tensor::from_vec(vec![5.0f32, 6.0], [2, 1]);
        let r = f.call((x.clone(), e.clone(), y.clone())).unwrap();
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(
            r.to_vec::<f32>(),
            vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0],
            "{b:?}"
        );
        // The empty operand first and last, and alone with another empty one.
        let f = jit(|(e, x): (Tensor, Tensor)| {
            (
                Tensor::concatenate(&[&e, &x], 1),
                Tensor::concatenate(&[&x, &e], 1),
                Tensor::concatenate(&[&e, &e], 1),
            )
        })
        .backend(b);
        let (a, c, d) = f.call((e, x)).unwrap();
        assert_eq!(a.to_vec::<f32>(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.to_vec::<f32>(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(d.shape(), &[2, 0]);
    });
}

#[test]
fn pad_of_a_zero_size_input_is_all_padding() {
    both_backends(|b| {
        let f = jit(|(x, v): (Tensor, Tensor)| x.pad(&v, &[1, 2], &[2, -1], &[3, 1])).backend(b);
        let r = f
            .call((Tensor::zeros([0, 3]), Tensor::scalar(7.5f32)))
            .unwrap();
        // dim 0: 1 + 0 + 2; dim 1: 2 + 3 + 2 interior - 1.
        assert_eq!(r.shape(), &[3, 6], "{b:?}");
        assert_eq!(r.to_vec::<f32>(), vec![7.5; 18], "{b:?}");
        let f = jit(|(x, v): (Tensor, Tensor)| x.pad(&v, &[2], &[1], &[0])).backend(b);
        let r = f
            .call((
                Tensor::from_vec(Vec::<i32>::new(), [0]),
                Tensor::scalar(-3i32),
            ))
            .unwrap();
        assert_eq!(r.to_vec::<i32>(), vec![-3, -3, -3], "{b:?}");
    });
}

#[test]
fn dot_over_an_empty_contracting_dim_is_zeros() {
    both_backends(|b| {
        let f = jit(|(x, y): (Tensor, Tensor)| x.matmul(&y)).backend(b);
        for (m, n) in [(3, 4), (1, 1), (16, 16), (0, 5)] {
            let r = f
                .call((Tensor::zeros([m, 0]), Tensor::zeros([0, n])))
                .unwrap();
            assert_eq!(r.shape(), &[m, n]);
            assert!(r.to_vec::<f32>().iter().all(|&v| v.to_bits() == 0), "{b:?}");
        }
        let f = jit(|(x, y): (Tensor, Tensor)| {
            x.dot_general(
                &y,
                DotDims {
                    lhs_batch: vec![0],
                    rhs_batch: vec![0],
                    lhs_contract: vec![2],
                    rhs_contract: vec![1],
                },
            )
        })
        .backend(b);
        let x = Tensor::from_vec(Vec::<i32>::new(), [2, 3, 0]);
        let y = Tensor::from_vec(Vec::<i32>::new(), [2, 0, 4]);
        let r = f.call((x, y)).unwrap();
        assert_eq!(r.shape(), &[2, 3, 4]);
        assert_eq!(r.to_vec::<i32>(), vec![0; 24], "{b:?}");
    });
}

#[test]
fn reduction_over_an_empty_dim_is_the_identity() {
    both_backends(|b| {
        let f = jit(|x: Tensor| (x.sum_axes([1]), x.max_axes([1]), x.min_axes([1]))).backend(b);
        let (s, mx, mn) = f.call(Tensor::zeros([3, 0])).unwrap();
        assert_eq!(s.to_vec::<f32>(), vec![0.0; 3], "{b:?}");
        assert!(s.to_vec::<f32>().iter().all(|v| v.to_bits() == 0));
        assert_eq!(mx.to_vec::<f32>(), vec![f32::NEG_INFINITY; 3], "{b:?}");
        assert_eq!(mn.to_vec::<f32>(), vec![f32::INFINITY; 3], "{b:?}");
        let f = jit(|x: Tensor| (x.sum(), x.max(), x.min())).backend(b);
        let (s, mx, mn) = f.call(Tensor::from_vec(Vec::<i32>::new(), [0, 4])).unwrap();
        assert_eq!(
            (s.item::<i32>(), mx.item::<i32>(), mn.item::<i32>()),
            (0, i32::MIN, i32::MAX),
            "{b:?}"
        );
        let f = jit(|x: Tensor| x.sum()).backend(b);
        let r = f
            .call(Tensor::full_dtype([5, 0, 2], 1.0, DType::U32))
            .unwrap();
        assert_eq!(r.item::<u32>(), 0);
    });
}

#[test]
fn broadcast_to_zero_and_slice_to_empty() {
    both_backends(|b| {
        let f = jit(|x: Tensor| {
            let y = x.broadcast_to(&[0, 3]);
            let s = x.slice(&[1], &[1]);
            let z = x
                .slice_strided(&[0], &[3], &[2])
                .reshape([1, 2])
                .broadcast_to(&[0, 2]);
            (y.exp() + 1.0, s * 2.0, z.sum_axes([0]))
        })
        .backend(b);
        let (y, s, z) = f
            .call(Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]))
            .unwrap();
        assert_eq!(y.shape(), &[0, 3]);
        assert_eq!(y.to_vec::<f32>(), Vec::<f32>::new());
        assert_eq!(s.shape(), &[0]);
        assert_eq!(z.to_vec::<f32>(), vec![0.0, 0.0], "{b:?}");
        // Elementwise chains, transposes and reshapes of empty values.
        let f = jit(|(x, y): (Tensor, Tensor)| {
            (
                (&x * &y).transpose(&[1, 0]).reshape([0, 4, 3]).tanh(),
                x.sum() + y.sum(),
            )
        })
        .backend(b);
        let (r, t) = f
            .call((Tensor::zeros([12, 0]), Tensor::ones([12, 0])))
            .unwrap();
        assert_eq!(r.shape(), &[0, 4, 3]);
        assert_eq!(t.item::<f32>(), 0.0);
    });
}

#[test]
fn zero_size_values_eagerly_and_printed() {
    let x = Tensor::zeros([2, 0]);
    let c = Tensor::concatenate(&[&x, &Tensor::ones([2, 1])], 1);
    assert_eq!(c.to_vec::<f32>(), vec![1.0, 1.0]);
    assert_eq!(x.sum_axes([1]).to_vec::<f32>(), vec![0.0, 0.0]);
    assert_eq!(format!("{x}"), "f32[2,0] [[], []]");
    let lit = Literal::new([0, 3], Data::Bool(vec![])).unwrap();
    assert_eq!(Tensor::from_literal(lit).numel(), 0);
}

#[test]
fn gradients_of_zero_size_values() {
    both_backends(|b| {
        let f = jit(|(x, w): (Tensor, Tensor)| {
            tessera::grad(|p: &(Tensor, Tensor)| (p.0.matmul(&p.1).tanh() + 1.0).sum())(&(x, w))
        })
        .backend(b);
        let (gx, gw) = f
            .call((Tensor::zeros([0, 3]), Tensor::ones([3, 2])))
            .unwrap();
        assert_eq!(gx.shape(), &[0, 3]);
        assert_eq!(gw.to_vec::<f32>(), vec![0.0; 6], "{b:?}");
        // Through concatenate and pad with empty operands (their VJPs slice and pad).
        let f = jit(|(x, e): (Tensor, Tensor)| {
            tessera::grad(|p: &(Tensor, Tensor)| {
                let v = Tensor::scalar(2.0f32);
                let c = Tensor::concatenate(&[&p.1, &p.0, &p.1], 0);
                (c.square().sum() + p.1.pad(&v, &[1], &[1], &[0]).sum()) * 1.0
            })(&(x, e))
        })
        .backend(b);
        let (gx, ge) = f
            .call((
                Tensor::from_vec(vec![1.0f32, -3.0], [2]),
                Tensor::zeros([0]),
            ))
            .unwrap();
        assert_eq!(gx.to_vec::<f32>(), vec![2.0, -6.0], "{b:?}");
        assert_eq!(ge.shape(), &[0]);
    });
}
