//! Hostile sizes: the parser, the type rules and the verifier reject element counts that
//! overflow or exceed the size limit, oversized constants, mismatched constant data and deep
//! nesting, with an error (never a panic, an abort or an allocation that kills the process).

use std::time::{Duration, Instant};

use tessera_ir::{
    DType, Data, Graph, Literal, MAX_TENSOR_BYTES, Op, Shape, TensorType, parse, verify,
};

/// Runs `f` on a thread with a 2 MiB stack (the default for spawned threads, smaller than the
/// main thread's), so that unbounded recursion would overflow it.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .expect("spawn")
        .join()
        .expect("the parser panicked or overflowed its stack")
}

/// Parses `text` on a small stack; expects an `Err` whose message contains `want`, quickly.
fn rejects(what: &str, text: String, want: &str) {
    let len = text.len();
    let t0 = Instant::now();
    let r = small_stack(move || parse(&text).map(|_| ()));
    let took = t0.elapsed();
    match r {
        Ok(()) => panic!("{what}: {len} bytes of hostile text parsed"),
        Err(e) => {
            assert!(e.line >= 1 && e.col >= 1, "{what}: {e}");
            assert!(
                e.message.contains(want),
                "{what}: expected an error containing {want:?}, got {e}"
            );
        }
    }
    assert!(
        took < Duration::from_secs(20),
        "{what}: parsing {len} bytes took {took:?}"
    );
}

fn func(body: &str) -> String {
    format!("func @f() {{\n{body}\n}}\n")
}

#[test]
fn the_issues_inputs_are_errors() {
    // 60 bytes that used to allocate 400 GB.
    rejects(
        "huge splat constant",
        func("  %0 = constant 1.0 : f32[100000000000]\n  return %0"),
        "a constant may hold",
    );
    // 100,000 nested `[` used to overflow the stack.
    let deep = "[".repeat(100_000);
    rejects(
        "nested [ in a constant",
        func(&format!("  %0 = constant {deep} : f32[1]\n  return %0")),
        "nest deeper",
    );
    rejects(
        "nested [ in an attribute",
        format!(
            "func @f(%0: f32[1]) {{\n  %1 = transpose %0 perm={deep} : f32[1]\n  return %1\n}}"
        ),
        "nest deeper",
    );
    rejects(
        "nested [ in dot dims",
        format!(
            "func @f(%0: f32[1]) {{\n  %1 = dot_general %0, %0 contracting=[0]x{deep} : f32[]\n  return %1\n}}"
        ),
        "nest deeper",
    );
    rejects("nested [ alone", deep, "");
}

#[test]
fn huge_and_overflowing_dims_are_errors() {
    let big = 1usize << 32;
    for (what, ty) in [
        ("dims whose product overflows", format!("f32[{big},{big}]")),
        ("bool product overflow", format!("bool[{big},{big},{big}]")),
        ("byte size overflows", format!("f64[{}]", usize::MAX / 4)),
        ("over isize::MAX bytes", format!("f32[{}]", 1usize << 62)),
        (
            "zero-size with overflowing strides",
            format!("f32[0,{big},{big}]"),
        ),
        ("zero-size, zero last", format!("f32[{big},{big},0]")),
    ] {
        rejects(
            what,
            format!("func @f(%0: {ty}) {{\n  return %0\n}}"),
            "overflow",
        );
        rejects(
            what,
            func(&format!("  %0 = iota dim=0 : {ty}\n  return %0")),
            "",
        );
    }
    rejects(
        "a dim beyond i64",
        "func @f(%0: f32[99999999999999999999]) {\n  return %0\n}".into(),
        "integer",
    );
    // The type rules' arithmetic: broadcast, reshape, pad, concatenate, collectives.
    rejects(
        "broadcast to an overflowing shape",
        format!(
            "func @f(%0: f32[]) {{\n  %1 = broadcast_in_dim %0 dims=[] : f32[{big},{big}]\n  return %1\n}}"
        ),
        "overflow",
    );
    rejects(
        "pad with a huge interior",
        format!(
            "func @f(%0: f32[3], %1: f32[]) {{\n  %2 = pad %0, %1 low=[0] high=[0] interior=[{}] : f32[1]\n  return %2\n}}",
            i64::MAX
        ),
        "overflow",
    );
    rejects(
        "pad with huge low and high",
        format!(
            "func @f(%0: f32[3], %1: f32[]) {{\n  %2 = pad %0, %1 low=[{m}] high=[{m}] : f32[1]\n  return %2\n}}",
            m = i64::MAX
        ),
        "overflow",
    );
    let half = 1usize << 62;
    rejects(
        "concatenate over the limit",
        format!(
            "func @f(%0: bool[{half}], %1: bool[{half}]) {{\n  %2 = concatenate %0, %1 dim=0 : bool[1]\n  return %2\n}}"
        ),
        "bytes",
    );
    rejects(
        "all_gather group overflow",
        format!(
            "mesh @m = <\"a\"={big}, \"b\"={big}>\nfunc @f(%0: f32[2]) {{\n  %1 = all_gather %0 dim=0 axes=[\"a\",\"b\"] : f32[2]\n  return %1\n}}"
        ),
        "overflow",
    );
    rejects(
        "all_gather result over the limit",
        format!(
            "mesh @m = <\"a\"={big}>\nfunc @f(%0: f32[{big}]) {{\n  %1 = all_gather %0 dim=0 axes=[\"a\"] : f32[2]\n  return %1\n}}"
        ),
        "",
    );
}

#[test]
fn constants_are_checked() {
    rejects(
        "too few elements",
        func("  %0 = constant [1.0] : f32[1000000]\n  return %0"),
        "elements written",
    );
    // At the limit a splat is fine, one more is not.
    let ok = func(&format!(
        "  %0 = constant 1.0 : f32[{}]\n  return %0",
        tessera_ir::parse::MAX_CONSTANT_ELEMENTS
    ));
    parse(&ok).expect("a splat of the largest allowed size parses");
    rejects(
        "one element over the limit",
        func(&format!(
            "  %0 = constant 1.0 : u32[{}]\n  return %0",
            tessera_ir::parse::MAX_CONSTANT_ELEMENTS + 1
        )),
        "a constant may hold",
    );
}

#[test]
fn very_long_lines_are_errors_in_linear_time() {
    let n = 1_000_000;
    rejects(
        "a long name",
        func(&format!("  %{} = constant 1.0 : f32[]", "a".repeat(n))),
        "",
    );
    rejects(
        "a long list",
        func(&format!(
            "  %0 = constant [{}] : f32[2]\n  return %0",
            "1.0,".repeat(n)
        )),
        "",
    );
    rejects(
        "a long number",
        format!("func @f(%0: f32[{}]) {{\n  return %0\n}}", "9".repeat(n)),
        "integer",
    );
    rejects(
        "a long location comment, unterminated function",
        format!(
            "func @f(%0: f32[1]) {{\n  %1 = exp %0 : f32[1] # {}",
            "#".repeat(n)
        ),
        "",
    );
    rejects("only hashes", "#".repeat(n), "");
    rejects("only blanks", " ".repeat(n), "");
    rejects(
        "many operands",
        format!(
            "func @f(%0: f32[1]) {{\n  %1 = add {}%0 : f32[1]\n  return %1\n}}",
            "%0,".repeat(n)
        ),
        "",
    );
    rejects(
        "a long dims list",
        format!("func @f(%0: f32[{}1]) {{\n  return %0\n}}", "1,".repeat(n)),
        "rank",
    );
}

#[test]
fn type_rules_use_checked_arithmetic() {
    let big = 1usize << 32;
    let f32_ = |d: &[usize]| TensorType::new(DType::F32, d.to_vec());
    let reject = |op: Op, operands: &[TensorType], want: &str| {
        let refs: Vec<&TensorType> = operands.iter().collect();
        let e = op
            .infer_type(&refs, None)
            .expect_err("an oversized result is rejected");
        let text = e.to_string();
        assert!(
            text.starts_with(op.name()) && text.contains(want),
            "{op}: {text}"
        );
    };
    // A reshape into a shape whose element count wraps to 0 used to be accepted.
    reject(
        Op::Reshape(Shape::new([big, big])),
        &[f32_(&[0])],
        "cannot reshape",
    );
    reject(
        Op::BroadcastInDim {
            shape: Shape::new([big, big]),
            dims: vec![],
        },
        &[f32_(&[])],
        "overflow",
    );
    reject(
        Op::Iota {
            dim: 0,
            ty: f32_(&[big, big]),
        },
        &[],
        "overflow",
    );
    reject(
        Op::Pad {
            low: vec![0],
            high: vec![0],
            interior: vec![usize::MAX],
        },
        &[f32_(&[3]), f32_(&[])],
        "overflows",
    );
    reject(
        Op::Pad {
            low: vec![i64::MIN],
            high: vec![0],
            interior: vec![0],
        },
        &[f32_(&[3]), f32_(&[])],
        "negative size",
    );
    reject(
        Op::Concatenate { dim: 0 },
        &[
            TensorType::new(DType::Bool, vec![usize::MAX]),
            TensorType::new(DType::Bool, vec![usize::MAX]),
        ],
        "overflows",
    );
    let dot = tessera_ir::DotDims::default();
    reject(
        Op::DotGeneral(dot),
        &[f32_(&[big]), f32_(&[big])],
        "overflow",
    );
    // Numel saturates instead of wrapping.
    assert_eq!(Shape::new([big, big]).numel(), usize::MAX);
    assert_eq!(Shape::new([big, big, 0]).numel(), 0);
    assert!(f32_(&[MAX_TENSOR_BYTES / 4]).check_size().is_ok());
    assert!(f32_(&[MAX_TENSOR_BYTES / 4 + 1]).check_size().is_err());
}

#[test]
fn verifier_checks_constant_data_and_sizes() {
    // A declared f32[1000000] holding one value, and f64[4] over f32 data.
    for (lit, want) in [
        (
            Literal {
                ty: TensorType::new(DType::F32, vec![1_000_000]),
                data: Data::F32(vec![1.0]),
            },
            "holds 1 elements",
        ),
        (
            Literal {
                ty: TensorType::new(DType::F64, vec![4]),
                data: Data::F32(vec![1.0; 4]),
            },
            "holds f32 data",
        ),
    ] {
        assert!(lit.check().unwrap_err().contains(want));
        // The type rule rejects the constant, so `Graph::add` does ...
        let mut g = Graph::new("f");
        assert!(g.add(Op::Constant(lit.clone()), &[]).is_err());
        // ... and a graph built around the rule (a node's op swapped) fails to verify.
        let mut g2 = Graph::new("f");
        let ok = Literal::zeros(&lit.ty);
        let n = g2.add(Op::Constant(ok), &[]).unwrap();
        g2.node_mut(n).op = Op::Constant(lit);
        g2.set_outputs(vec![n]);
        let e = verify(&g2).expect_err("mismatched constant data");
        assert!(e.to_string().contains(want), "{e}");
    }
    // A parameter of an overflowing type.
    let mut g = Graph::new("f");
    let p = g.add_param(TensorType::new(DType::F32, vec![1 << 32, 1 << 32]));
    g.set_outputs(vec![p]);
    let e = verify(&g).expect_err("an overflowing parameter type");
    assert!(e.to_string().contains("overflow"), "{e}");
    // Literal::new rejects the from_vec case of the issue.
    assert!(Literal::new([(1usize << 63) + 1, 2], Data::F32(vec![])).is_none());
    assert!(Literal::new([(1usize << 63) + 1, 0], Data::F32(vec![])).is_none());
    assert!(Literal::new([0usize, 5], Data::F32(vec![])).is_some());
}

#[test]
fn host_allocation_failure_is_an_error_naming_the_size() {
    // 2^50 bytes is over the 47-bit address space: the allocator refuses whatever the
    // overcommit policy.
    let ty = TensorType::new(DType::F32, vec![1 << 24, 1 << 24]);
    let e = Literal::try_zeros(&ty).expect_err("a petabyte cannot be allocated");
    assert!(e.contains("cannot allocate 1125899906842624 bytes"), "{e}");
    let e = Literal::try_zeros(&TensorType::new(DType::F32, vec![1 << 32, 1 << 32])).unwrap_err();
    assert!(e.contains("overflow"), "{e}");
    let z = Literal::try_splat(&TensorType::new(DType::I32, vec![2, 0, 3]), 7.0).unwrap();
    assert_eq!(z.data.len(), 0);
}

#[test]
fn a_sharding_over_axes_whose_product_overflows_fails_to_verify() {
    let text = "mesh @m = <\"a\"=4294967296, \"b\"=4294967296>\nfunc @f(%0: f32[8] <@m, [{\"a\", \"b\"}]>) {\n  return %0\n}\n";
    let g = small_stack(move || parse(text)).expect("the text is well formed");
    let e = small_stack(move || verify(&g)).expect_err("the group size overflows");
    assert!(e.to_string().contains("overflows"), "{e}");
}
