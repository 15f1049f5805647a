//! IR filetests: each `.ir` file under `tests/filetests/<suite>/` names a pass in its first line
//! (`// test: print`), then holds cases: `// case: <name>`, the input IR, `// expect:`, and the
//! expected output text. `UPDATE_EXPECT=1 cargo test --test filetests` rewrites the expectations
//! from the actual outputs instead of comparing.
//!
//! Every input that parses also goes through the round trip `parse(print(g)) == g`.

use std::fs;
use std::path::{Path, PathBuf};

use tessera_ir::{parse, print, verify};

/// The pass a filetest names, applied to one case's input text.
fn run_pass(pass: &str, input: &str) -> Result<String, String> {
    match pass {
        // Parse, then print: the canonical text, or the parse error with its line and column.
        "print" => Ok(match parse(input) {
            Ok(g) => print(&g),
            Err(e) => format!("error: {e}"),
        }),
        // Parse, then verify: `ok`, or the first broken invariant.
        "verify" => Ok(match parse(input) {
            Ok(g) => match verify(&g) {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("parse error: {e}"),
        }),
        // Sharding, the three passes, `drop_single_device_collectives` and
        // `combine_all_reduces`: parameters' annotations are the input shardings; prints every
        // value's sharding, then the per-device program after the combine stage.
        "partition" => Ok(match parse(input) {
            Ok(g) => {
                let Some(mesh) = g.mesh.clone() else {
                    return Ok("error: a partition test needs a mesh".into());
                };
                match tessera_shard::partition(&g, &mesh, &param_specs(&g)) {
                    Ok(mut p) => {
                        let combined =
                            tessera_shard::combine::drop_single_device_collectives(&mut p.local)
                                .and_then(|_| tessera_shard::combine_all_reduces(&mut p.local));
                        match (combined, verify(&p.local)) {
                            (Ok(_), Ok(())) => format!(
                                "{}// per device:\n{}",
                                print(&p.annotated),
                                print(&p.local)
                            ),
                            (Err(e), _) => format!("error: {e}"),
                            (_, Err(e)) => format!("error: per-device program: {e}"),
                        }
                    }
                    Err(e) => format!("error: {e}"),
                }
            }
            Err(e) => format!("error: {e}"),
        }),
        // Sharding propagation alone: parameters' annotations are the input shardings; prints
        // where propagation wants every value.
        "propagate" => Ok(match parse(input) {
            Ok(g) => match &g.mesh {
                Some(mesh) => shard_pass(tessera_shard::propagate(&g, mesh, &param_specs(&g))),
                None => "error: a propagate test needs a mesh".into(),
            },
            Err(e) => format!("error: {e}"),
        }),
        // Explicit-mode typing (an Explicit mesh): parameters' annotations are the input types;
        // prints every value's type, then the program with its collectives (the outputs kept
        // at their types) and the per-device program.
        "typed" => Ok(match parse(input) {
            Ok(g) => match &g.mesh {
                Some(mesh) => {
                    match tessera_shard::explicit::type_graph(&g, mesh, &param_specs(&g)) {
                        Ok(t) => {
                            let x = tessera_shard::insert_collectives::insert_keeping_outputs(&t)
                                .and_then(|i| tessera_shard::per_device(&i.explicit));
                            match x {
                                Ok(local) => {
                                    format!("{}// per device:\n{}", print(&t), print(&local))
                                }
                                Err(e) => format!("{}error: {e}", print(&t)),
                            }
                        }
                        Err(e) => format!("error: {e}"),
                    }
                }
                None => "error: a typed test needs a mesh".into(),
            },
            Err(e) => format!("error: {e}"),
        }),
        // Collective insertion: an annotated global program (propagate's output) in, the
        // program with its reshards and all-reduces explicit out.
        "insert_collectives" => Ok(match parse(input) {
            Ok(g) => shard_pass(tessera_shard::insert_collectives(&g)),
            Err(e) => format!("error: {e}"),
        }),
        // The per-device program of an explicit global program (insert_collectives' output).
        "per_device" => Ok(match parse(input) {
            Ok(g) => shard_pass(tessera_shard::per_device(&g)),
            Err(e) => format!("error: {e}"),
        }),
        // The program a mesh of one device runs, from the annotated global program
        // (propagate's output): the per-device program, then each output's sharding.
        "one_device" => Ok(match parse(input) {
            Ok(g) => match tessera_shard::on_one_device(g) {
                Ok((local, specs)) => {
                    let specs: Vec<String> = specs.iter().map(|s| format!("{s:?}")).collect();
                    format!(
                        "{}// output shardings: {}",
                        shard_pass(Ok(local)),
                        specs.join(", ")
                    )
                }
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        }),
        // Simplification (egg rules, CSE, DCE): the simplified program.
        "simplify" => Ok(match parse(input) {
            Ok(g) => match tessera_opt::simplify(&g, tessera_opt::Limits::default()) {
                Ok((s, _)) => print(&s),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        }),
        // Reverse mode (tessera_autodiff::vjp): the outputs are differentiated with respect to
        // every float parameter, with a new parameter as each float output's cotangent (as
        // `grad` does); prints the graph with the gradients as its outputs.
        "autodiff" => Ok(match parse(input) {
            Ok(g) => gradient_ir(g),
            Err(e) => format!("error: {e}"),
        }),
        // f16/bf16 arithmetic rewritten to f32 between converts (codegen's first pass).
        "narrow" => Ok(match parse(input) {
            Ok(g) => match tessera_codegen::narrow::widen(&g) {
                Ok(Some(w)) => print(&w),
                Ok(None) => "// no f16 or bf16 value: unchanged".into(),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        }),
        // Code generation: the native schedule (`TESSERA_DUMP`'s `schedule.txt`).
        "schedule" => Ok(match parse(input) {
            Ok(g) => match tessera_codegen::compile(&g) {
                Ok(exe) => exe.describe(),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        }),
        other => Err(format!("unknown pass '{other}'")),
    }
}

/// The `autodiff` filetest pass: the gradient of `g`'s float outputs with respect to its float
/// parameters, as IR text (a `// no gradient` line for a parameter the outputs do not use).
fn gradient_ir(mut g: tessera_ir::Graph) -> String {
    let outputs: Vec<_> = g
        .outputs()
        .iter()
        .copied()
        .filter(|&o| g.ty(o).dtype.is_float())
        .collect();
    let wrt: Vec<_> = g
        .params()
        .iter()
        .copied()
        .filter(|&p| g.ty(p).dtype.is_float())
        .collect();
    let cotangents: Vec<_> = outputs
        .iter()
        .map(|&o| {
            let ty = g.ty(o).clone();
            g.add_param(ty)
        })
        .collect();
    match tessera_autodiff::vjp(&mut g, &outputs, &cotangents, &wrt) {
        Ok(grads) => {
            let mut missing = String::new();
            for (p, grad) in wrt.iter().zip(&grads) {
                if grad.is_none() {
                    let i = g.params().iter().position(|q| q == p).expect("a parameter");
                    missing.push_str(&format!("// no gradient for parameter %{i}\n"));
                }
            }
            g.set_outputs(grads.into_iter().flatten().collect());
            match verify(&g) {
                Ok(()) => format!("{missing}{}", print(&g)),
                Err(e) => format!("error: the gradient graph is malformed: {e}"),
            }
        }
        Err(e) => format!("error: {e}"),
    }
}

/// The input shardings of a sharding filetest: each parameter's annotation, whole if none.
fn param_specs(g: &tessera_ir::Graph) -> Vec<tessera_shard::Spec> {
    g.params()
        .iter()
        .map(|&p| match &g.node(p).sharding {
            Some(s) => s.spec(),
            None => vec![Vec::new(); g.ty(p).rank()],
        })
        .collect()
}

/// A sharding pass's output: the verified graph's text, or the error.
fn shard_pass(out: Result<tessera_ir::Graph, tessera_shard::ShardError>) -> String {
    match out {
        Ok(g) => match verify(&g) {
            Ok(()) => print(&g),
            Err(e) => format!("error: the pass's output: {e}"),
        },
        Err(e) => format!("error: {e}"),
    }
}

struct Case {
    name: String,
    input: String,
    expected: String,
}

struct FileTest {
    pass: String,
    preamble: String,
    cases: Vec<Case>,
}

fn parse_filetest(path: &Path, text: &str) -> FileTest {
    let mut lines = text.lines().peekable();
    let first = lines.next().unwrap_or_default();
    let pass = first
        .strip_prefix("// test:")
        .unwrap_or_else(|| panic!("{}: first line must be `// test: <pass>`", path.display()))
        .trim()
        .to_string();
    let mut preamble = String::new();
    while let Some(l) = lines.peek() {
        if l.starts_with("// case:") {
            break;
        }
        preamble.push_str(l);
        preamble.push('\n');
        lines.next();
    }
    let mut cases = Vec::new();
    while let Some(l) = lines.next() {
        let name = l
            .strip_prefix("// case:")
            .expect("a case header")
            .trim()
            .to_string();
        let (mut input, mut expected, mut in_expect) = (String::new(), String::new(), false);
        while let Some(l) = lines.peek() {
            if l.starts_with("// case:") {
                break;
            }
            let l = lines.next().unwrap_or_default();
            if l.trim() == "// expect:" {
                in_expect = true;
            } else if in_expect {
                expected.push_str(l);
                expected.push('\n');
            } else {
                input.push_str(l);
                input.push('\n');
            }
        }
        assert!(
            in_expect,
            "{}: case '{name}' has no `// expect:` line",
            path.display()
        );
        cases.push(Case {
            name,
            input,
            expected: expected.trim_end().to_string(),
        });
    }
    FileTest {
        pass,
        preamble,
        cases,
    }
}

fn render(ft: &FileTest, outputs: &[String]) -> String {
    let mut s = format!("// test: {}\n{}", ft.pass, ft.preamble);
    for (c, out) in ft.cases.iter().zip(outputs) {
        s.push_str(&format!(
            "// case: {}\n{}// expect:\n{}\n\n",
            c.name,
            c.input.trim_end().to_string() + "\n",
            out.trim_end()
        ));
    }
    s.trim_end().to_string() + "\n"
}

fn filetest_paths() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut paths = Vec::new();
    for suite in fs::read_dir(&root).expect("tests/filetests exists") {
        let suite = suite.expect("readable").path();
        if suite.is_dir() {
            for f in fs::read_dir(&suite).expect("readable") {
                let f = f.expect("readable").path();
                if f.extension().is_some_and(|e| e == "ir") {
                    paths.push(f);
                }
            }
        }
    }
    paths.sort();
    paths
}

#[test]
fn filetests() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut failures = Vec::new();
    let mut count = 0;
    for path in filetest_paths() {
        let text = fs::read_to_string(&path).expect("readable filetest");
        let ft = parse_filetest(&path, &text);
        let mut outputs = Vec::new();
        for case in &ft.cases {
            count += 1;
            let actual = run_pass(&ft.pass, &case.input)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if actual.trim_end() != case.expected {
                failures.push(format!(
                    "{} case '{}':\n--- expected\n{}\n--- actual\n{}\n",
                    path.display(),
                    case.name,
                    case.expected,
                    actual.trim_end()
                ));
            }
            outputs.push(actual);
        }
        if update {
            fs::write(&path, render(&ft, &outputs)).expect("writable filetest");
        }
    }
    assert!(count > 0, "no filetest cases found");
    if !update {
        assert!(
            failures.is_empty(),
            "{} filetest case(s) failed (re-bless with UPDATE_EXPECT=1):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// Every filetest input that parses prints to text that parses back to the same graph, and
/// printing is a fixed point.
#[test]
fn filetest_inputs_round_trip() {
    let mut checked = 0;
    for path in filetest_paths() {
        let text = fs::read_to_string(&path).expect("readable filetest");
        for case in parse_filetest(&path, &text).cases {
            let Ok(g) = parse(&case.input) else { continue };
            let printed = print(&g);
            let again = parse(&printed).unwrap_or_else(|e| {
                panic!(
                    "{} '{}': printed text does not parse: {e}\n{printed}",
                    path.display(),
                    case.name
                )
            });
            assert!(
                again.structurally_eq(&g),
                "{} '{}': round trip changed the graph",
                path.display(),
                case.name
            );
            assert_eq!(print(&again), printed);
            checked += 1;
        }
    }
    assert!(checked > 0);
}
