//! The user surface: eager and jitted execution agree, jit caches per signature, trees
//! flatten and rebuild, and bad input gives errors that name the op, the types and the line.

use std::collections::BTreeMap;

use tessera::prelude::*;

#[derive(Tree, Clone, Debug)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

fn forward(p: &Mlp, x: &Tensor) -> Tensor {
    (x.matmul(&p.w1) + &p.b1).tanh().matmul(&p.w2) + &p.b2
}

fn loss(p: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    (forward(p, x) - y).square().mean()
}

fn filled(shape: [usize; 2], seed: usize, scale: f32) -> Tensor {
    let n = shape[0] * shape[1];
    Tensor::from_vec(
        (0..n)
            .map(|i| (((i + seed) * 7919 % 101) as f32 / 50.0 - 1.0) * scale)
            .collect(),
        shape,
    )
}

fn seed_model() -> (Mlp, Tensor, Tensor) {
    let p = Mlp {
        w1: filled([10, 32], 1, 0.1),
        b1: filled([1, 32], 2, 0.1).reshape([32]),
        w2: filled([32, 1], 3, 0.1),
        b2: Tensor::full([1], 0.05),
    };
    (p, filled([256, 10], 4, 1.0), filled([256, 1], 5, 1.0))
}

fn assert_close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.shape(), b.shape());
    for (x, y) in a.to_vec::<f32>().iter().zip(b.to_vec::<f32>()) {
        assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{x} vs {y}");
    }
}

#[test]
fn eager_and_jit_agree_on_the_seed_forward_and_loss() {
    let (p, x, y) = seed_model();
    let fwd = jit(|(p, x): (Mlp, Tensor)| forward(&p, &x));
    assert_close(&fwd.call((p.clone(), x.clone())).unwrap(), &forward(&p, &x));
    let l = jit(|(p, x, y): (Mlp, Tensor, Tensor)| loss(&p, &x, &y));
    let (a, b) = (
        l.call((p.clone(), x.clone(), y.clone())).unwrap(),
        loss(&p, &x, &y),
    );
    assert_eq!(a.shape(), &[] as &[usize]);
    assert_close(&a, &b);
    // The eager loss against a hand-written loop.
    let (xs, w1, b1, w2, b2, ys) = (
        x.to_vec::<f32>(),
        p.w1.to_vec::<f32>(),
        p.b1.to_vec::<f32>(),
        p.w2.to_vec::<f32>(),
        p.b2.to_vec::<f32>(),
        y.to_vec::<f32>(),
    );
    let mut total = 0.0f64;
    for r in 0..256 {
        let mut out = b2[0] as f64;
        for j in 0..32 {
            let mut h = b1[j] as f64;
            for k in 0..10 {
                h += xs[r * 10 + k] as f64 * w1[k * 32 + j] as f64;
            }
            out += h.tanh() * w2[j] as f64;
        }
        total += (out - ys[r] as f64).powi(2);
    }
    assert!((b.item::<f32>() as f64 - total / 256.0).abs() < 1e-5);
}

#[test]
fn jit_traces_once_per_signature() {
    let f = jit(|(a, b): (Tensor, Tensor)| (&a * &b).sum());
    let (a, b) = (Tensor::ones([3]), Tensor::full([3], 2.0));
    assert_eq!(f.call((a.clone(), b.clone())).unwrap().item::<f32>(), 6.0);
    assert_eq!(f.call((b.clone(), a.clone())).unwrap().item::<f32>(), 6.0);
    assert_eq!(f.trace_count(), 1, "same signature, no retrace");
    f.call((Tensor::ones([4]), Tensor::ones([4]))).unwrap();
    assert_eq!(f.trace_count(), 2, "new shape retraces");
    f.call((Tensor::ones([4]), Tensor::ones([4]))).unwrap();
    assert_eq!(f.trace_count(), 2);
    let g = jit(|v: Vec<Tensor>| v.iter().fold(Tensor::zeros([2]), |acc, t| acc + t));
    g.call(vec![Tensor::ones([2])]).unwrap();
    g.call(vec![Tensor::ones([2]), Tensor::ones([2])]).unwrap();
    assert_eq!(g.trace_count(), 2, "new tree structure retraces");
}

#[test]
fn captured_concrete_tensors_become_constants() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let f = jit(|x: Tensor| &x * &w + 1.0);
    let out = f.call(Tensor::ones([3])).unwrap();
    assert_eq!(out.to_vec::<f32>(), vec![2.0, 3.0, 4.0]);
    let ir = f.lower(&Tensor::ones([3])).unwrap().ir();
    assert!(ir.contains("constant [1.0, 2.0, 3.0] : f32[3]"), "{ir}");
}

#[test]
fn jit_inside_jit_is_inlined() {
    let inner = jit(|x: Tensor| x.exp());
    let outer = jit(|x: Tensor| inner.call(x).unwrap() * 2.0);
    let y = outer.call(Tensor::zeros([2])).unwrap();
    assert_eq!(y.to_vec::<f32>(), vec![2.0, 2.0]);
    assert_eq!(inner.trace_count(), 0);
    let ir = outer.lower(&Tensor::zeros([2])).unwrap().ir();
    assert!(ir.contains("exp"), "{ir}");
}

#[test]
fn make_ir_prints_the_program() {
    let ir = make_ir(|(x, y): (Tensor, Tensor)| x.matmul(&y).tanh().sum_axes([1]))(&(
        Tensor::zeros([4, 3]),
        Tensor::zeros([3, 2]),
    ))
    .unwrap()
    .to_string();
    for op in ["dot_general", "tanh", "reduce_sum"] {
        assert!(ir.contains(op), "{ir}");
    }
    let g = tessera::ir::parse(&ir).unwrap();
    assert_eq!(tessera::ir::print(&g), ir);
}

#[test]
fn trees_flatten_and_rebuild() {
    let (p, _, _) = seed_model();
    let leaves = tree::leaves(&p);
    assert_eq!(leaves.len(), 4);
    assert_eq!(leaves[2].shape(), &[32, 1]);
    let doubled = tree::map(&p, |t| t * 2.0);
    assert_close(&doubled.w1, &(&p.w1 * 2.0));
    let diff = tree::map2(&doubled, &p, |a, b| a - b);
    assert_close(&diff.b1, &p.b1);

    let mut m = BTreeMap::new();
    m.insert("b".to_string(), Tensor::ones([1]));
    m.insert("a".to_string(), Tensor::zeros([2]));
    let v: (
        Vec<Tensor>,
        Option<Tensor>,
        [Tensor; 2],
        BTreeMap<String, Tensor>,
    ) = (
        vec![Tensor::ones([3])],
        None,
        [Tensor::ones([1]), Tensor::ones([5])],
        m,
    );
    let (leaves, def) = tree::flatten(&v);
    assert_eq!(leaves.len(), 5);
    assert_eq!(leaves[3].shape(), &[2], "map leaves follow key order");
    let back: (
        Vec<Tensor>,
        Option<Tensor>,
        [Tensor; 2],
        BTreeMap<String, Tensor>,
    ) = tree::unflatten(&def, leaves).unwrap();
    assert_eq!(back.2[1].shape(), &[5]);
    assert!(back.1.is_none());
    let err = tree::unflatten::<(Tensor, Tensor)>(&def, vec![]).unwrap_err();
    assert!(err.to_string().contains("leaves"), "{err}");
}

#[test]
fn a_shape_error_in_a_trace_is_an_err_naming_op_types_and_line() {
    let line = line!() + 1;
    let f = jit(|(a, b): (Tensor, Tensor)| a.matmul(&b));
    let err = f
        .call((Tensor::zeros([2, 3]), Tensor::zeros([4, 5])))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("matmul: contracting dims differ: 3 and 4"),
        "{msg}"
    );
    assert!(
        msg.contains("f32[2,3]") && msg.contains("f32[4,5]"),
        "{msg}"
    );
    assert!(msg.contains(&format!("{}:{line}", file!())), "{msg}");
}

#[test]
fn a_dtype_error_in_a_trace_is_an_err() {
    // f32 + i32 promotes (as in JAX); `pow` of integers is a dtype error of the IR.
    let f = jit(|(a, b): (Tensor, Tensor)| a.pow(&b));
    let err = f.call((Tensor::arange(2), Tensor::arange(2))).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("pow") && msg.contains("i32[2]"), "{msg}");
    assert!(msg.contains(file!()), "{msg}");
    // The failed signature is not cached; a good call afterwards works.
    assert!(f.call((Tensor::zeros([2]), Tensor::ones([2]))).is_ok());
}

#[test]
fn broadcasting_errors_name_the_op_and_shapes() {
    let f = jit(|(a, b): (Tensor, Tensor)| &a * &b);
    let err = f
        .call((Tensor::zeros([3]), Tensor::zeros([4])))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mul") && err.contains("[3]") && err.contains("[4]"),
        "{err}"
    );
}

#[test]
fn eager_errors_panic_with_the_same_message() {
    let caught = std::panic::catch_unwind(|| Tensor::zeros([2, 3]).matmul(&Tensor::zeros([4, 5])));
    let payload = caught.unwrap_err();
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        msg.contains("matmul") && msg.contains("f32[2,3]") && msg.contains(file!()),
        "{msg}"
    );
}

#[test]
fn reading_a_tracer_is_an_error() {
    let f = jit(|x: Tensor| {
        let v = x.to_vec::<f32>();
        Tensor::full([1], v[0])
    });
    let err = f.call(Tensor::ones([1])).unwrap_err().to_string();
    assert!(err.contains("tracer") && err.contains(file!()), "{err}");
}

#[test]
fn an_escaped_tracer_is_an_error() {
    let leaked = std::cell::RefCell::new(None);
    let f = jit(|x: Tensor| {
        *leaked.borrow_mut() = Some(x.clone());
        x
    });
    f.call(Tensor::ones([2])).unwrap();
    let stale = leaked.borrow().clone().unwrap();
    let g = jit(|x: Tensor| &x + &stale);
    let err = g.call(Tensor::ones([2])).unwrap_err().to_string();
    assert!(err.contains("escaped"), "{err}");
}

#[test]
fn tree_structure_mismatch_is_an_error() {
    let f = jit(|(a, b): (Vec<Tensor>, Vec<Tensor>)| tree::map2(&a, &b, |x, y| x + y));
    let err = f
        .call((
            vec![Tensor::ones([1])],
            vec![Tensor::ones([1]), Tensor::ones([1])],
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tree structure mismatch"), "{err}");
}

#[test]
fn constructors_and_read_back() {
    let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]);
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.dtype(), DType::I32);
    assert_eq!(t.sum().item::<i32>(), 21);
    assert_eq!(Tensor::arange(4).to_vec::<i32>(), vec![0, 1, 2, 3]);
    assert_eq!(Tensor::full([2], 3.5).to_vec::<f32>(), vec![3.5, 3.5]);
    assert!(Tensor::ones([2]).try_to_vec::<i32>().is_err());
    assert_eq!(format!("{}", Tensor::arange(3)), "i32[3] [0, 1, 2]");
}

#[test]
fn composites_match_their_definitions() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, -1.0, 0.0, 4.0], [2, 3]);
    let s = x.softmax(1).to_vec::<f32>();
    let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let z: f32 = e.iter().sum();
    assert!((s[0] - e[0] / z).abs() < 1e-6);
    let lse = x.logsumexp(1).to_vec::<f32>();
    assert!((lse[0] - z.ln()).abs() < 1e-6);
    assert_eq!(x.relu().to_vec::<f32>(), vec![1.0, 2.0, 3.0, 0.0, 0.0, 4.0]);
    assert_eq!(x.max_axes([1]).to_vec::<f32>(), vec![3.0, 4.0]);
    assert_eq!(x.mean_axes([0]).to_vec::<f32>(), vec![0.0, 1.0, 3.5]);
    assert!((x.sigmoid().to_vec::<f32>()[0] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
    assert_eq!(x.argmax(1).to_vec::<i32>(), vec![2, 2]);
    assert_eq!((2.0f32 - &x).to_vec::<f32>()[0], 1.0);
    assert_eq!((-&x).to_vec::<f32>()[3], 1.0);
    let m = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2]);
    assert_eq!(x.matmul(&m).to_vec::<f32>(), vec![4.0, 5.0, 3.0, 4.0]);
    let sel = Tensor::select(&x.gt(&Tensor::scalar(1.5f32)), &x, &Tensor::scalar(0.0f32));
    assert_eq!(sel.to_vec::<f32>(), vec![0.0, 2.0, 3.0, 0.0, 0.0, 4.0]);
}

#[test]
fn lower_returns_every_stage_and_the_last_is_the_program() {
    let f = jit(|x: Tensor| (x.exp() * 1.0).sum()).named("staged");
    let x = Tensor::ones([3]);
    let lowered = f.lower(&x).unwrap();
    let names: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(names, ["trace", "simplified"]);
    let (_, last) = lowered.stages().last().unwrap();
    assert!(last.structurally_eq(lowered.program()));
    assert_eq!(lowered.ir(), tessera::ir::print(last));
    assert!(
        lowered.traced_ir().contains("mul"),
        "{}",
        lowered.traced_ir()
    );
    assert!(!lowered.ir().contains("mul"), "{}", lowered.ir());
    assert_eq!(f.trace_count(), 0, "lower compiles nothing for the cache");
    // Without simplification the trace is the program.
    let raw = jit(|x: Tensor| (x.exp() * 1.0).sum()).simplify(false);
    let lowered = raw.lower(&x).unwrap();
    let names: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(names, ["trace"]);
    assert!(lowered.ir().contains("mul"), "{}", lowered.ir());
}

/// On a mesh of one device the explicit program is the one the device runs (the `one_device`
/// stage in place of partitioned and combined): the same values as on host inputs, bit for
/// bit, and the outputs in the shardings they have on a larger mesh (an elementwise result of
/// the batch split like it, a sum replicated; a result whose propagated sharding loses a
/// conflict where it is settled: a product of the batch added to a value split by columns is
/// split by rows, as JAX's is).
#[test]
fn a_one_device_mesh_runs_the_explicit_program() {
    let f = |(w, x): (Tensor, Tensor)| {
        let h = (x.matmul(&w) * 2.0).tanh();
        let s = h.sum();
        (h, s)
    };
    let w = Tensor::from_vec((0..12).map(|i| i as f32 / 7.0 - 0.5).collect(), [3, 4]);
    let x = Tensor::from_vec((0..24).map(|i| (i % 5) as f32 / 3.0).collect(), [8, 3]);
    let host = jit(f).call((w.clone(), x.clone())).unwrap();
    let mesh = Mesh::new([1], ["dp"]);
    let on = (
        device_put(w.clone(), NamedSharding::new(&mesh, P![])),
        device_put(x.clone(), NamedSharding::new(&mesh, P!["dp"])),
    );
    let g = jit(f).named("one_device_api");
    let lowered = g.lower(&on).unwrap();
    let names: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(
        names,
        [
            "trace",
            "simplified",
            "propagated",
            "sharded",
            "collectives",
            "one_device"
        ]
    );
    assert!(lowered.ir().contains("{\"dp\"}"), "{}", lowered.ir());
    assert!(
        !lowered.per_device_ir().contains("<@"),
        "{}",
        lowered.per_device_ir()
    );
    let (h, s) = g.call(on.clone()).unwrap();
    assert_eq!(h.to_vec::<f32>(), host.0.to_vec::<f32>());
    assert_eq!(s.to_vec::<f32>(), host.1.to_vec::<f32>());
    let spec = |t: &Tensor| t.sharding().unwrap().spec;
    assert_eq!(spec(&h), P!["dp"]);
    assert_eq!(spec(&s), P![]);
    // A conflict: the add wants the product split by columns, the product's rows win.
    let c = |(x, w, y): (Tensor, Tensor, Tensor)| x.matmul(&w) + &y;
    let square = Tensor::from_vec((0..64).map(|i| (i % 9) as f32 - 4.0).collect(), [8, 8]);
    let placed = |mesh: &Mesh| {
        (
            device_put(square.clone(), NamedSharding::new(mesh, P!["dp"])),
            device_put(square.clone(), NamedSharding::new(mesh, P![])),
            device_put(square.clone(), NamedSharding::new(mesh, P![None, "dp"])),
        )
    };
    let settled = jit(c).call(placed(&mesh)).unwrap();
    assert_eq!(spec(&settled), P!["dp"]);
    // Two devices, when there are: the same shardings, through the three passes.
    if device_count() >= 2 {
        let two = Mesh::new([2], ["dp"]);
        let (h2, s2) = jit(f)
            .call((
                device_put(w, NamedSharding::new(&two, P![])),
                device_put(x, NamedSharding::new(&two, P!["dp"])),
            ))
            .unwrap();
        assert_eq!((spec(&h2), spec(&s2)), (spec(&h), spec(&s)));
        assert_eq!(spec(&jit(c).call(placed(&two)).unwrap()), spec(&settled));
    }
}

#[test]
fn pmap_lowers_like_it_runs_and_shares_jits_builder() {
    let n = device_count().min(2);
    let p = pmap("i", |x: Tensor| psum(&(x * 1.0).tanh(), "i")).named("mapped_api");
    let x = Tensor::ones([n, 3]);
    let lowered = p.lower(&x).unwrap();
    let names: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(names, ["trace", "simplified", "combined"]);
    let program = lowered.per_device_ir();
    assert!(
        program.contains("func @mapped_api(\n    %0: f32[3],"),
        "{program}"
    );
    assert!(!program.contains("mul"), "simplified:\n{program}");
    assert_eq!(p.trace_count(), 0);
    let y = p.call(x.clone()).unwrap();
    assert_eq!(p.trace_count(), 1);
    p.call(x.clone()).unwrap();
    assert_eq!(p.trace_count(), 1, "same signature, no retrace");
    let want = (n as f32) * 1f32.tanh();
    assert!(
        y.to_vec::<f32>().iter().all(|v| (v - want).abs() < 1e-6),
        "{:?}",
        y.to_vec::<f32>()
    );
    // Off, the multiplication stays; the interpreter runs the very same program.
    let raw = pmap("i", |x: Tensor| psum(&(x * 1.0).tanh(), "i"))
        .simplify(false)
        .backend(Backend::Interpreter);
    assert!(raw.lower(&x).unwrap().per_device_ir().contains("mul"));
    assert_eq!(raw.call(x).unwrap().to_vec::<f32>(), y.to_vec::<f32>());
    // Bad input to lower is the same error as to call, naming this line.
    let err = p.lower(&Tensor::ones([])).err().unwrap().to_string();
    assert!(
        err.contains("pmap: input 0 (f32[]) has no leading axis to map") && err.contains("api.rs"),
        "{err}"
    );
}

/// A returned error prints as its message: `fn main() -> tessera::Result<()>` shows
/// `Error: matmul: contracting dims differ ..., at tests/api.rs:N`, not the variant's fields.
#[test]
fn an_error_debug_prints_as_its_message() {
    let e = tessera::jit(|(a, b): (Tensor, Tensor)| a.matmul(&b))
        .call((Tensor::zeros([2, 3]), Tensor::zeros([4, 5])))
        .expect_err("contracting dims differ");
    let shown = format!("{e:?}");
    assert_eq!(shown, e.to_string());
    assert!(
        shown.starts_with("matmul: contracting dims differ"),
        "{shown}"
    );
    assert!(
        !shown.contains("Op {") && !shown.contains("message:"),
        "{shown}"
    );
}

/// Non-tensor leaves are static (JAX's `static_argnums`): part of the cache key, so a jit
/// traces once per value and reuses the program for a value it has seen; `grad` and
/// `tree::map` pass them through.
#[test]
fn static_arguments_retrace_once_per_value() {
    let f = tessera::jit(|(x, n, scale, relu): (Tensor, usize, f32, bool)| {
        let mut y = x.clone();
        for _ in 0..n {
            y = &y * scale;
        }
        if relu { y.relu() } else { y }
    });
    let x = Tensor::from_vec(vec![-1.0f32, 2.0], [2]);
    let run = |n: usize, s: f32, r: bool| f.call((x.clone(), n, s, r)).unwrap().to_vec::<f32>();
    assert_eq!(run(2, 3.0, false), vec![-9.0, 18.0]);
    assert_eq!(run(2, 3.0, false), vec![-9.0, 18.0]);
    assert_eq!(
        f.trace_count(),
        1,
        "the same static values reuse the program"
    );
    assert_eq!(run(3, 3.0, false), vec![-27.0, 54.0]);
    assert_eq!(run(3, 3.0, true), vec![0.0, 54.0]);
    assert_eq!(run(3, -0.0, false), vec![0.0, -0.0]);
    assert_eq!(run(3, 0.0, false), vec![-0.0, 0.0]);
    assert_eq!(
        f.trace_count(),
        5,
        "one trace per new static value, -0.0 and 0.0 apart"
    );
    // Through grad and tree::map the static leaves pass unchanged.
    let (v, n) = tessera::tree::map(&(x.clone(), 4usize), |t| t * 2.0);
    assert_eq!((v.to_vec::<f32>(), n), (vec![-2.0, 4.0], 4));
    let g = tessera::grad(|(x, k): &(Tensor, i64)| (x * (*k as f32)).sum())(&(x.clone(), 5));
    assert_eq!((g.0.to_vec::<f32>(), g.1), (vec![5.0, 5.0], 5));
    let s: (String, char) = tessera::tree::unflatten(
        &tessera::tree::flatten(&("name".to_string(), 'q')).1,
        vec![],
    )
    .unwrap();
    assert_eq!(s, ("name".to_string(), 'q'));
}
