//! Explicit axes (sharding in types) on a 4x2 mesh, against JAX 0.10.2
//! (`fixtures/explicit/make.py`): each op's result sharding as `jax.typeof` gives it or JAX's
//! error, the values against the unsharded program, the Megatron MLP (rejected without
//! `out_sharding`, JAX's losses and XLA's two all-reduces with it, the same on an Auto mesh),
//! gradients' shardings, `reshard`, and `x.sharding()` inside a trace.

use std::cell::RefCell;

use serde_json::Value;
use tessera::prelude::*;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/explicit/explicit.json")).expect("fixture")
}

fn spec_of(v: &Value) -> Vec<Vec<String>> {
    v.as_array()
        .expect("spec")
        .iter()
        .map(|axes| {
            axes.as_array()
                .expect("axes")
                .iter()
                .map(|a| a.as_str().expect("axis").to_string())
                .collect()
        })
        .collect()
}

/// The fixture's input: `arange(n) / 7` in `shape`.
fn input(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| i as f32 / 7.0).collect();
    Tensor::from_vec(data, shape.to_vec())
}

/// The expression of each fixture case, as the script writes it.
fn expr(name: &str, xs: &[Tensor]) -> Tensor {
    let (a, b) = (&xs[0], xs.get(1));
    let b = || b.expect("a second operand");
    match name {
        "add_same" | "add_merge" | "add_conflict" | "add_bias" => a + b(),
        "mul_scalar" => a * 2.0,
        "tanh" => a.tanh(),
        "dot_lhs_free"
        | "dot_rhs_free"
        | "dot_both_free"
        | "dot_contracting"
        | "dot_contracting_one_side"
        | "dot_contracting_mismatch"
        | "dot_axis_twice" => a.matmul(b()),
        "dot_contracting_out" => a.matmul_out(b(), P!["dp", None]),
        "dot_batch" | "dot_batch_mismatch" => einsum("bij,bjk->bik", &[a, b()]),
        "einsum_out" => einsum_out("ij,jk->ik", &[a, b()], P![None, "mp"]),
        "sum_sharded" => a.sum_axes(0),
        "sum_other" => a.sum_axes(1),
        "max_all" => a.max(),
        "mean_keepdims" => a.mean_axes(keepdims(0)),
        "argmax_sharded" => a.argmax(1),
        "reshape_split" => a.reshape([4, 2, 4]),
        "reshape_split_minor" => a.reshape([8, 2, 2]),
        "reshape_split_too_small" => a.reshape([2, 4, 4]),
        "reshape_merge" | "reshape_merge_minor" | "reshape_merge_both" => a.reshape([32]),
        "reshape_singleton" => a.reshape([8, 1, 4]),
        "reshape_out" => a.reshape_out([32], P!["dp"]),
        "reshape_replicated" => a.reshape([2, 16]),
        "transpose" => a.t(),
        "transpose3" => a.transpose(&[2, 0, 1]),
        "broadcast" => a.broadcast_to(&[3, 8, 4]),
        "reshard" if !a.is_tracer() && a.sharding().is_none() => a.clone(),
        "reshard" => reshard(a, P![None, "dp"]),
        "concat_free" => Tensor::concatenate(&[a, b()], 1),
        other => panic!("no expression for fixture case {other}"),
    }
}

fn place(mesh: &Mesh, t: Tensor, spec: Vec<Vec<String>>) -> Tensor {
    device_put(t, NamedSharding::new(mesh, PartitionSpec(spec)))
}

#[test]
fn each_ops_result_sharding_and_error_are_jaxs() {
    eight_devices();
    let fx = fixture();
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let mut checked = 0;
    for case in fx["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let hosts: Vec<Tensor> = case["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .map(|i| input(&tessera_shape(&i["shape"])))
            .collect();
        let placed: Vec<Tensor> = case["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .zip(&hosts)
            .map(|(i, h)| place(&mesh, h.clone(), spec_of(&i["spec"])))
            .collect();
        let seen = RefCell::new(None);
        let f = jit(|xs: Vec<Tensor>| {
            let y = expr(name, &xs);
            *seen.borrow_mut() = Some(y.sharding().expect("a typed tracer").spec);
            y
        });
        let got = f.call(placed.clone());
        match (&case["spec"], &case["error"]) {
            (Value::Array(_), _) => {
                let y = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                let want = spec_of(&case["spec"]);
                let typed = seen.borrow().clone().expect("traced");
                assert_eq!(
                    PartitionSpec::of(&typed.0),
                    PartitionSpec::of(&want),
                    "{name}: the type inside the trace"
                );
                let placed_spec = y.sharding().expect("placed").spec;
                assert_eq!(
                    placed_spec,
                    PartitionSpec::of(&want),
                    "{name}: the result's placement"
                );
                // The values are the unsharded program's.
                let host = expr(name, &hosts);
                let f = |t: &Tensor| t.astype(DType::F32).to_vec::<f32>();
                let (a, b) = (f(&y), f(&host));
                assert_eq!(a.len(), b.len(), "{name}");
                for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (p - q).abs() <= 1e-5 * q.abs().max(1.0),
                        "{name}[{i}]: {p} vs {q}"
                    );
                }
            }
            (_, Value::String(jax)) => {
                let e = got
                    .err()
                    .unwrap_or_else(|| panic!("{name}: JAX rejects it: {jax}"));
                let text = e.to_string();
                let jax = jax.split_once(": ").map_or(jax.as_str(), |(_, m)| m);
                let key: String = jax.chars().take(40).collect();
                assert!(text.contains(&key), "{name}: `{text}` lacks JAX's `{key}`");
                assert!(
                    text.contains("tests/explicit.rs:"),
                    "{name}: `{text}` names no line"
                );
            }
            _ => panic!("{name}: a fixture case has a spec or an error"),
        }
        checked += 1;
    }
    assert_eq!(checked, 36);
}

fn tessera_shape(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("values")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[derive(Tree, Clone)]
struct Megatron {
    w1: Tensor,
    w2: Tensor,
}

/// The 12 -> 32 tanh -> 6 MLP; `out` is the second product's out_sharding.
fn megatron_loss(w: &Megatron, x: &Tensor, y: &Tensor, out: Option<PartitionSpec>) -> Tensor {
    let h = x.matmul(&w.w1).tanh();
    let o = match out {
        Some(spec) => h.matmul_out(&w.w2, spec),
        None => h.matmul(&w.w2),
    };
    (o - y).square().mean()
}

fn megatron_step(
    w: Megatron,
    x: Tensor,
    y: Tensor,
    out: Option<PartitionSpec>,
) -> (Megatron, Tensor) {
    let (l, g) = value_and_grad(|w: &Megatron| megatron_loss(w, &x, &y, out.clone()))(&w);
    (tree::map2(&w, &g, |p, g| p - g * 0.1), l)
}

/// The 20 losses and the per-device program of the step on `mesh` (or one device).
fn megatron_run(mesh: Option<&Mesh>, out: Option<PartitionSpec>) -> Result<(Vec<f32>, String)> {
    let m = &fixture()["megatron"];
    let t = |k: &str, shape: [usize; 2]| Tensor::from_vec(f32s(&m[k]), shape);
    let (x, y) = (t("x", [64, 12]), t("y", [64, 6]));
    let mut w = Megatron {
        w1: t("w1", [12, 32]),
        w2: t("w2", [32, 6]),
    };
    let (x, y) = match mesh {
        Some(mesh) => {
            w = Megatron {
                w1: place(mesh, w.w1, P![None, "mp"].0),
                w2: place(mesh, w.w2, P!["mp", None].0),
            };
            (
                place(mesh, x, P!["dp", None].0),
                place(mesh, y, P!["dp", None].0),
            )
        }
        None => (x, y),
    };
    let step =
        jit(move |(w, x, y): (Megatron, Tensor, Tensor)| megatron_step(w, x, y, out.clone()))
            .named("megatron");
    let ir = step.lower(&(w.clone(), x.clone(), y.clone()))?;
    let program = if mesh.is_some() {
        ir.per_device_ir()
    } else {
        ir.ir()
    };
    let mut losses = Vec::new();
    for _ in 0..20 {
        let (nw, l) = step.call((w, x.clone(), y.clone()))?;
        if mesh.is_some() {
            assert_eq!(nw.w1.sharding().expect("placed").spec, P![None, "mp"]);
            assert_eq!(nw.w2.sharding().expect("placed").spec, P!["mp"]);
        }
        w = nw;
        losses.push(l.item::<f32>());
    }
    Ok((losses, program))
}

fn all_reduces(program: &str) -> usize {
    program.matches("= all_reduce ").count()
}

#[test]
fn the_megatron_mlp_needs_out_sharding_and_then_trains_as_jax_with_xlas_collectives() {
    eight_devices();
    let fx = fixture();
    let m = &fx["megatron"];
    let explicit = Mesh::explicit([4, 2], ["dp", "mp"]);
    // Without out_sharding: rejected at the dot, naming this file's line.
    let err = megatron_run(Some(&explicit), None)
        .expect_err("ambiguous")
        .to_string();
    let jax = m["error"].as_str().expect("JAX rejects it");
    assert!(jax.contains("Contracting dimensions are sharded"), "{jax}");
    assert!(
        err.contains("Contracting dimensions are sharded and it is ambiguous")
            && err.contains("dot_general")
            && err.contains("tests/explicit.rs:"),
        "{err}"
    );
    let (single, _) = megatron_run(None, None).expect("one device");
    let (losses, program) =
        megatron_run(Some(&explicit), Some(P!["dp", None])).expect("with out_sharding");
    let want = f32s(&m["losses"]);
    for (i, ((&l, &s), &j)) in losses.iter().zip(&single).zip(&want).enumerate() {
        let ulps = (l.to_bits() as i64 - s.to_bits() as i64).abs();
        assert!(ulps <= 8, "step {i}: {l} vs one device {s} ({ulps} ulp)");
        assert!((l - j).abs() <= 1e-5 * j.abs(), "step {i}: {l} vs JAX {j}");
    }
    // XLA's program has two all-reduces: the forward's over mp, and one over dp for the
    // gradients and the loss.
    assert_eq!(m["all_reduces"].as_u64(), Some(2));
    assert_eq!(all_reduces(&program), 2, "{program}");
    assert!(program.contains(r#"all_reduce %"#), "{program}");
    let over = |axes: &str| {
        program
            .lines()
            .filter(|l| l.contains("= all_reduce ") && l.contains(axes))
            .count()
    };
    assert_eq!(over(r#"axes=["mp"]"#), 1, "{program}");
    assert_eq!(over(r#"axes=["dp"]"#), 1, "{program}");
    // dp Explicit, mp Auto: the types hold dp only, so the dot is not ambiguous and needs no
    // out_sharding; propagation splits over mp as on an Auto mesh.
    let mixed =
        Mesh::new([4, 2], ["dp", "mp"]).with_axis_types([AxisType::Explicit, AxisType::Auto]);
    let (mixed_losses, mixed_program) = megatron_run(Some(&mixed), None).expect("mixed");
    assert_eq!(all_reduces(&mixed_program), 2, "{mixed_program}");
    for (a, e) in mixed_losses.iter().zip(&losses) {
        let ulps = (a.to_bits() as i64 - e.to_bits() as i64).abs();
        assert!(ulps <= 8, "mixed {a} vs {e}");
    }
    // On an Auto mesh the same program compiles to the same collectives and losses.
    let auto = Mesh::new([4, 2], ["dp", "mp"]);
    let (auto_losses, auto_program) =
        megatron_run(Some(&auto), Some(P!["dp", None])).expect("auto");
    assert_eq!(all_reduces(&auto_program), 2, "{auto_program}");
    for (a, e) in auto_losses.iter().zip(&losses) {
        let ulps = (a.to_bits() as i64 - e.to_bits() as i64).abs();
        assert!(ulps <= 8, "{a} vs {e}");
    }
}

#[test]
fn inside_a_trace_a_value_knows_its_sharding_and_gradients_keep_the_primals() {
    eight_devices();
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let x = place(&mesh, input(&[8, 6]), P!["dp", None].0);
    let w = place(&mesh, input(&[6, 4]), P![None, "mp"].0);
    let seen = RefCell::new(Vec::new());
    let f = jit(|(x, w): (Tensor, Tensor)| {
        let h = x.matmul(&w);
        seen.borrow_mut().push(h.sharding().expect("typed").spec);
        let g = grad(|w: &Tensor| x.matmul(w).tanh().sum())(&w);
        seen.borrow_mut().push(g.sharding().expect("typed").spec);
        let r = reshard(&h, P![None, None]);
        seen.borrow_mut().push(r.sharding().expect("typed").spec);
        (h, g, r)
    });
    let (h, g, r) = f.call((x.clone(), w.clone())).expect("runs");
    assert_eq!(
        *seen.borrow(),
        vec![P!["dp", "mp"], P![None, "mp"], P![]],
        "the matmul's type, the gradient's (the primal's), the reshard's"
    );
    assert_eq!(g.sharding().expect("placed").spec, P![None, "mp"]);
    assert_eq!(r.sharding().expect("placed").spec, P![]);
    // Values: the host program's.
    let (xh, wh) = (input(&[8, 6]), input(&[6, 4]));
    let gh = grad(|w: &Tensor| xh.matmul(w).tanh().sum())(&wh);
    for (a, b) in g.to_vec::<f32>().iter().zip(gh.to_vec::<f32>()) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    assert_eq!(h.to_vec::<f32>(), r.to_vec::<f32>());
    // Outside a trace, reshard moves a placed array; a host value is an error.
    let moved = reshard(&x, P![None, "mp"]);
    assert_eq!(moved.sharding().expect("placed").spec, P![None, "mp"]);
    assert_eq!(moved.to_vec::<f32>(), x.to_vec::<f32>());
    let e = std::panic::catch_unwind(|| reshard(&input(&[2]), P!["dp"])).expect_err("host");
    let text = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<Error>().map(|e| e.to_string()))
        .unwrap_or_default();
    assert!(text.contains("device_put"), "{text}");
}

#[test]
fn the_mesh_prints_its_axis_types_and_the_ir_its_types() {
    eight_devices();
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    assert_eq!(
        mesh.to_string(),
        "Mesh('dp': 4, 'mp': 2, axis_types=(Explicit, Explicit))"
    );
    assert_eq!(Mesh::new([8], ["d"]).axis_types(), vec![AxisType::Auto]);
    let x = place(&mesh, input(&[8, 6]), P!["dp", "mp"].0);
    let w = place(&mesh, input(&[6, 4]), P!["mp", None].0);
    let ir = jit(|(x, w): (Tensor, Tensor)| x.matmul_out(&w, P!["dp", None]))
        .lower(&(x, w))
        .expect("lowers");
    let trace = ir.traced_ir();
    assert!(
        trace.contains(r#"mesh @mesh = <"dp"=4 explicit, "mp"=2 explicit>"#),
        "{trace}"
    );
    // The product is a partial sum over mp until its out_sharding completes it.
    assert!(trace.contains(r#"unreduced={"mp"}"#), "{trace}");
    let stages: Vec<&str> = ir.stages().iter().map(|(s, _)| *s).collect();
    assert!(
        stages.contains(&"typed") && !stages.contains(&"propagated"),
        "{stages:?}"
    );
    assert_eq!(
        all_reduces(&ir.per_device_ir()),
        1,
        "{}",
        ir.per_device_ir()
    );
}

#[derive(Tree, Clone)]
struct Pair {
    a: Tensor,
    b: Tensor,
}

#[test]
fn jit_in_and_out_shardings_device_get_from_devices_and_tree_constraints() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let x = input(&[8, 4]);
    let w = input(&[4, 6]);
    // in_shardings places host values; out_shardings constrains the outputs.
    let f = jit(|(x, w): (Tensor, Tensor)| (x.matmul(&w), x.sum()))
        .in_shardings((&mesh, specs![P!["dp", None], P![None, "mp"]]))
        .out_shardings((&mesh, specs![P![None, "mp"], P![]]));
    let (y, s) = f.call((x.clone(), w.clone())).expect("runs");
    assert_eq!(y.sharding().expect("placed").spec, P![None, "mp"]);
    assert_eq!(s.sharding().expect("placed").spec, P![]);
    for (a, b) in y.to_vec::<f32>().iter().zip(x.matmul(&w).to_vec::<f32>()) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    // A placed argument elsewhere is rejected, naming it.
    let wrong = place(&mesh, x.clone(), P![None, "mp"].0);
    let e = f
        .call((wrong, w.clone()))
        .expect_err("misplaced")
        .to_string();
    assert!(
        e.contains("in_shardings") && e.contains("tests/explicit.rs:"),
        "{e}"
    );
    // device_get: a host copy of a tree.
    let host = device_get(&(y.clone(), s.clone()));
    assert!(host.0.sharding().is_none() && host.1.sharding().is_none());
    assert_eq!(host.0.to_vec::<f32>(), y.to_vec::<f32>());
    // A mesh over an explicit device order: position i is device devices[i].
    let rev: Vec<usize> = (0..8).rev().collect();
    let m = Mesh::from_devices(&rev, &[8], &["d"]).expect("a mesh");
    assert_eq!(m.devices(), &rev[..]);
    let placed = device_put(input(&[8]), NamedSharding::new(&m, P!["d"]));
    let table = sharding_table(&placed);
    assert!(
        table.contains("CPU 7") && table.find("CPU 7") < table.find("CPU 0"),
        "{table}"
    );
    let doubled = jit(|x: Tensor| x * 2.0).call(placed.clone()).expect("runs");
    assert_eq!(doubled.sharding().expect("placed").mesh.devices(), &rev[..]);
    assert_eq!(
        doubled.to_vec::<f32>(),
        input(&[8])
            .to_vec::<f32>()
            .iter()
            .map(|v| v * 2.0)
            .collect::<Vec<_>>()
    );
    assert!(Mesh::from_devices(&[0, 0], &[2], &["d"]).is_err());
    assert!(Mesh::from_devices(&[0, 9], &[2], &["d"]).is_err());
    assert!(Mesh::from_devices(&[0], &[2], &["d"]).is_err());
    // with_sharding_constraint and device_put on trees of specs.
    let p = device_put(
        Pair {
            a: input(&[8, 4]),
            b: input(&[4]),
        },
        (&mesh, specs![P!["dp"], P!["mp"]]),
    );
    assert_eq!(p.a.sharding().expect("placed").spec, P!["dp"]);
    assert_eq!(p.b.sharding().expect("placed").spec, P!["mp"]);
    let g = jit(|p: Pair| with_sharding_constraint(&p, (&mesh, specs![P![None, "mp"], P![]])));
    let q = g.call(p).expect("runs");
    assert_eq!(q.a.sharding().expect("placed").spec, P![None, "mp"]);
    assert_eq!(q.b.sharding().expect("placed").spec, P![]);
}

#[test]
fn the_dump_says_why_every_value_is_sharded_as_it_is() {
    eight_devices();
    // Auto: the propagation step that split each value, and the reshard it led to.
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let x = place(&mesh, input(&[8, 4]), P!["dp", None].0);
    let w = place(&mesh, input(&[4, 6]), P![None, "mp"].0);
    let f = jit(|(x, w): (Tensor, Tensor)| {
        let y = x.matmul(&w).tanh();
        with_sharding_constraint(&y, NamedSharding::new(&mesh, P![None, "mp"]))
    });
    let ir = f.lower(&(x.clone(), w.clone())).expect("lowers").ir();
    for line in ir
        .lines()
        .filter(|l| l.contains(" = ") && l.contains("{\""))
    {
        assert!(line.contains("[sharding: "), "no reason on: {line}\n{ir}");
    }
    assert!(ir.contains("the input's placement"), "{ir}");
    assert!(ir.contains("the user's sharding_constraint"), "{ir}");
    assert!(ir.contains("forward from operand 0"), "{ir}");
    assert!(ir.contains("resharded"), "the reshard's note: {ir}");
    // Explicit: the op rule of each value.
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let x = place(&mesh, input(&[8, 6]), P!["dp", "mp"].0);
    let w = place(&mesh, input(&[6, 4]), P!["mp", None].0);
    let lowered = jit(|(x, w): (Tensor, Tensor)| x.matmul_out(&w, P!["dp", None]).tanh())
        .lower(&(x, w))
        .expect("lowers");
    let typed = lowered
        .stages()
        .iter()
        .find(|(s, _)| *s == "typed")
        .map(|(_, g)| tessera::ir::print(g))
        .expect("a typed stage");
    assert!(typed.contains("Explicit rule of tanh"), "{typed}");
    assert!(typed.contains("a partial sum over [\"mp\"]"), "{typed}");
    assert!(typed.contains("the user's reshard"), "{typed}");
}

#[test]
fn explicit_mode_through_loops_folded_reshapes_fsdp_gradients_and_reshards() {
    eight_devices();
    let mesh = Mesh::explicit([4, 2], ["dp", "mp"]);
    let x = place(&mesh, input(&[8, 6]), P!["dp", None].0);
    // A scan whose carry keeps its type.
    let f = jit(|x: Tensor| fori_loop(0, 3, |_, c: &Tensor| (c * 0.5).tanh(), &x));
    let y = f.call(x.clone()).expect("a loop on Explicit axes");
    assert_eq!(y.sharding().expect("placed").spec, P!["dp"]);
    let mut h = input(&[8, 6]);
    for _ in 0..3 {
        h = (h * 0.5).tanh();
    }
    for (a, b) in y.to_vec::<f32>().iter().zip(h.to_vec::<f32>()) {
        assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
    }
    // Two reshapes the simplifier folds into one the rule has no answer for.
    let x3 = place(&mesh, input(&[8, 3]), P!["dp", None].0);
    let r = jit(|x: Tensor| x.reshape([4, 2, 3]).reshape([4, 6]) * 2.0)
        .call(x3.clone())
        .expect("folded reshapes");
    let want: Vec<f32> = input(&[8, 3])
        .to_vec::<f32>()
        .iter()
        .map(|v| v * 2.0)
        .collect();
    assert_eq!(r.to_vec::<f32>(), want);
    // FSDP: the weight split over dp along its input dim; its gradient keeps that type.
    let w = place(&mesh, input(&[8, 4]) * 0.1, P!["dp", None].0);
    let xb = place(&mesh, input(&[8, 8]) * 0.1, P!["dp", None].0);
    let loss = |w: &Tensor, x: &Tensor| x.matmul(w).square().sum();
    // Both gradients: x's is a product of two dp-split operands (no Explicit rule for the raw
    // product; JAX's transpose rule gives it x's sharding).
    let (g, gx) =
        jit(|(w, x): (Tensor, Tensor)| grad(|(w, x): &(Tensor, Tensor)| loss(w, x))(&(w, x)))
            .call((w.clone(), xb.clone()))
            .expect("FSDP gradient");
    assert_eq!(g.sharding().expect("placed").spec, P!["dp"]);
    let (gh, gxh) =
        grad(|(w, x): &(Tensor, Tensor)| loss(w, x))(&(input(&[8, 4]) * 0.1, input(&[8, 8]) * 0.1));
    for (a, b) in g
        .to_vec::<f32>()
        .iter()
        .chain(&gx.to_vec::<f32>())
        .zip(gh.to_vec::<f32>().iter().chain(&gxh.to_vec::<f32>()))
    {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    // A reshard's cotangent goes back to the operand's type.
    let m2 = Mesh::explicit([2], ["x"]);
    let xs = place(&m2, input(&[4, 4]), P!["x", None].0);
    let gs =
        jit(|x: Tensor| grad(|x: &Tensor| reshard(&x.sin(), P![None, "x"]).square().sum())(&x))
            .call(xs)
            .expect("through a reshard");
    assert_eq!(
        gs.sharding().expect("placed").spec,
        P!["x"],
        "the operand's type"
    );
    let want: Vec<f32> = input(&[4, 4])
        .to_vec::<f32>()
        .iter()
        .map(|v| 2.0 * v.sin() * v.cos())
        .collect();
    for (a, b) in gs.to_vec::<f32>().iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    // grad with respect to a host value inside the jit: typed replicated.
    let gh2 = jit(|x: Tensor| grad(|w: &Tensor| x.matmul(w).sum())(&(Tensor::zeros([6, 4]))))
        .call(place(&mesh, input(&[8, 6]), P!["dp", "mp"].0))
        .expect("a host weight");
    let colsum: Vec<f32> = input(&[8, 6]).sum_axes(0).to_vec::<f32>();
    for (i, a) in gh2.to_vec::<f32>().iter().enumerate() {
        let b = colsum[i / 4];
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    // A closed-over placed array keeps its placement as its type.
    let wc = place(&mesh, input(&[6, 4]), P![None, "mp"].0);
    let seen = std::cell::RefCell::new(None);
    jit(|x: Tensor| {
        let y = x.matmul(&wc);
        *seen.borrow_mut() = y.sharding().map(|s| s.spec);
        y
    })
    .call(x.clone())
    .expect("runs");
    assert_eq!(*seen.borrow(), Some(P!["dp", "mp"]));
    // select: the cases must have one sharding (JAX's rule).
    let a = place(&mesh, input(&[8, 4]), P!["dp", None].0);
    let b = place(&mesh, input(&[8, 4]), P![None, "mp"].0);
    let e = jit(|(a, b): (Tensor, Tensor)| Tensor::select(&a.gt(&(a.clone() * 0.0)), &a, &b))
        .call((a, b))
        .expect_err("cases differ")
        .to_string();
    assert!(
        e.contains("select cases must have the same shardings"),
        "{e}"
    );
}
