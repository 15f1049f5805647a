//! `TESSERA_DUMP=dir` writes the IR of every stage as numbered `.ir` files that parse back, and
//! the native schedule beside them; they are the stages `lower` returns, and the last one is
//! the program the executable is built from. `TESSERA_TIMING=1` prints a table per
//! compilation.
//! (Its own test binary: it sets environment variables for the whole process.)

use std::path::Path;
use std::process::Command;

use tessera::prelude::*;

/// The dump files of one trace of `function`, sorted (their numbers order them).
fn dumped(dir: &Path, function: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{function}-1.")))
        .collect();
    names.sort();
    names
}

/// A dump's IR without its comment lines (the simplifier's report).
fn without_comments(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The dumps of `function` are `lowered`'s stages, numbered in order, then the schedule,
/// which is the one code generation makes from the last stage.
fn dumps_are_the_lowered_stages(dir: &Path, function: &str, lowered: &Lowered) {
    let names = dumped(dir, function);
    let stages = lowered.stages();
    let want: Vec<String> = stages
        .iter()
        .enumerate()
        .map(|(i, (stage, _))| format!("{function}-1.{i:02}-{stage}.ir"))
        .chain([format!("{function}-1.{:02}-schedule.txt", stages.len())])
        .collect();
    assert_eq!(names, want);
    for ((stage, g), name) in stages.iter().zip(&names) {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(
            without_comments(&text),
            tessera::ir::print(g),
            "{function}: the dump of {stage} is the lowered stage"
        );
        tessera::ir::parse(&text).unwrap();
    }
    let (_, last) = stages.last().unwrap();
    assert_eq!(tessera::ir::print(last), lowered.per_device_ir());
    assert!(lowered.program().structurally_eq(last));
    let schedule = std::fs::read_to_string(dir.join(names.last().unwrap())).unwrap();
    let rebuilt = tessera_codegen::compile(last).unwrap().describe();
    assert_eq!(
        schedule, rebuilt,
        "{function}: the executable was built from the last stage"
    );
}

const TIMING_CHILD: &str = "timing_child";

/// Run in a child process by the test below, with `TESSERA_TIMING` set.
#[test]
#[ignore = "run by dump_writes_the_lowered_stages, in a process with TESSERA_TIMING set"]
fn timing_child() {
    let f = jit(|x: Tensor| (x.tanh() * 1.0).sum()).named("timed");
    match f.call(Tensor::ones([4])) {
        Ok(_) => println!("call ok"),
        Err(e) => println!("call failed: {e}"),
    }
}

fn timing_child_output(value: &str) -> (String, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([TIMING_CHILD, "--exact", "--ignored", "--nocapture"])
        .env("TESSERA_TIMING", value)
        .env_remove("TESSERA_CACHE_DIR")
        .env_remove("TESSERA_DUMP")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn dump_writes_the_lowered_stages() {
    // TESSERA_TIMING first, in children, before this process changes its environment.
    let (stdout, table) = timing_child_output("1");
    assert!(stdout.contains("call ok"), "{stdout}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip_while(|l| !l.starts_with("TESSERA_TIMING timed"))
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let stages: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(
        stages,
        ["trace", "simplified", "schedule", "total"],
        "{table}"
    );
    // trace: 0 nodes before; simplified: `* 1.0` goes, so fewer nodes after than before.
    assert_eq!(rows[0][3], "0", "{table}");
    let (before, after): (usize, usize) =
        (rows[1][3].parse().unwrap(), rows[1][4].parse().unwrap());
    assert!(after < before, "{table}");
    assert_eq!(rows[0][4], rows[1][3], "{table}");
    let (stdout, stderr) = timing_child_output("yes");
    assert!(
        stdout.contains("call failed: configuration: TESSERA_TIMING=\"yes\": expected 1"),
        "{stdout}"
    );
    assert!(!stderr.contains("TESSERA_TIMING timed"), "{stderr}");
    let (_, quiet) = timing_child_output("0");
    assert!(!quiet.contains("TESSERA_TIMING"), "{quiet}");

    let dir = std::env::temp_dir().join(format!("tessera-dump-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this binary's only test (the other runs in a child process) sets the variables
    // before any other thread reads the environment (the device pool starts below).
    unsafe {
        std::env::set_var("TESSERA_DUMP", &dir);
        std::env::set_var("TESSERA_DEVICES", "2");
    }

    // One device: trace, simplified, schedule.
    let f = jit(|x: Tensor| x.tanh().sum()).named("dumped");
    f.call(Tensor::ones([4])).unwrap();
    let names = dumped(&dir, "dumped");
    assert_eq!(
        names,
        [
            "dumped-1.00-trace.ir",
            "dumped-1.01-simplified.ir",
            "dumped-1.02-schedule.txt"
        ]
    );
    let simplified = std::fs::read_to_string(dir.join(&names[1])).unwrap();
    assert!(simplified.starts_with("// simplify:"), "{simplified}");
    let schedule = std::fs::read_to_string(dir.join(&names[2])).unwrap();
    assert!(schedule.contains("kernel"), "{schedule}");
    let g = tessera::ir::parse(&std::fs::read_to_string(dir.join(&names[0])).unwrap()).unwrap();
    assert_eq!(g.name, "dumped");
    dumps_are_the_lowered_stages(&dir, "dumped", &f.lower(&Tensor::ones([4])).unwrap());

    // Inputs on a mesh: the sharded and per-device stages, then the combined all-reduces.
    let mesh = Mesh::new([2], ["dp"]);
    let sharded = jit(|(w, x): (Tensor, Tensor)| {
        let (l, g) = value_and_grad(|w: &Tensor| x.matmul(w).tanh().sum())(&w);
        (l, g)
    })
    .named("sharded");
    let args = (
        device_put(Tensor::full([3, 2], 0.5), NamedSharding::new(&mesh, P![])),
        device_put(Tensor::ones([4, 3]), NamedSharding::new(&mesh, P!["dp"])),
    );
    sharded.call(args.clone()).unwrap();
    let lowered = sharded.lower(&args).unwrap();
    let stages: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(
        stages,
        [
            "trace",
            "simplified",
            "propagated",
            "sharded",
            "collectives",
            "partitioned",
            "combined"
        ]
    );
    assert_eq!(lowered.ir(), tessera::ir::print(&lowered.stages()[3].1));
    dumps_are_the_lowered_stages(&dir, "sharded", &lowered);

    // pmap: the per-device program as traced, simplified and combined.
    let p = pmap("i", |x: Tensor| pmean(&x.tanh().sum(), "i")).named("mapped");
    let x = Tensor::ones([2, 3]);
    p.call(x.clone()).unwrap();
    let lowered = p.lower(&x).unwrap();
    let stages: Vec<&str> = lowered.stages().iter().map(|(s, _)| *s).collect();
    assert_eq!(stages, ["trace", "simplified", "combined"]);
    assert!(lowered.per_device_ir().contains("all_reduce"));
    dumps_are_the_lowered_stages(&dir, "mapped", &lowered);
    assert_eq!(p.trace_count(), 1, "lower does not trace for the cache");

    // Two unnamed jits in one function: the first dumps as the function's name, the second as
    // `name~2`, so neither overwrites the other.
    let first = jit(|x: Tensor| x.exp());
    let second = jit(|x: Tensor| x.sin());
    first.call(Tensor::ones([2])).unwrap();
    second.call(Tensor::ones([2])).unwrap();
    let fname = "dump_writes_the_lowered_stages";
    let text = |f: &str| std::fs::read_to_string(dir.join(format!("{f}-1.00-trace.ir"))).unwrap();
    assert!(text(fname).contains("exp"), "{}", text(fname));
    assert!(
        text(&format!("{fname}~2")).contains("sin"),
        "{}",
        text(&format!("{fname}~2"))
    );
    assert!(!text(fname).contains("sin"));

    // Renamed after a first compilation, a jit is numbered again among the jits of its new
    // name: it does not overwrite the dumps of another jit of that name.
    let renamed = jit(|x: Tensor| x.cos());
    renamed.call(Tensor::ones([2])).unwrap();
    let renamed = renamed.named("renamed");
    let other = jit(|x: Tensor| x.sin()).named("renamed");
    other.call(Tensor::ones([2])).unwrap();
    other.call(Tensor::ones([3])).unwrap();
    renamed.call(Tensor::ones([3])).unwrap();
    let ir = |f: &str| std::fs::read_to_string(dir.join(format!("{f}.00-trace.ir"))).unwrap();
    assert!(ir("renamed-2").contains("sin"), "{}", ir("renamed-2"));
    assert!(ir("renamed~2-2").contains("cos"), "{}", ir("renamed~2-2"));

    std::fs::remove_dir_all(&dir).unwrap();
}
