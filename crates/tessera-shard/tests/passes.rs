//! The three sharding passes compose to `partition`, and each pass's contract is carried by the
//! IR text alone: the output of `propagate` and of `insert_collectives`, printed and parsed
//! back, gives the next pass the same result. Run over every case of the `partition` filetest
//! suite (`tests/filetests/partition/*.ir` at the workspace root).

use std::fs;
use std::path::Path;

use tessera_ir::{Graph, parse, print};
use tessera_shard::{Spec, insert_collectives, partition, per_device, propagate};

/// The input of every case of the partition suite, with its name.
fn cases() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/filetests/partition");
    let mut out = Vec::new();
    let mut paths: Vec<_> = fs::read_dir(&dir)
        .expect("the partition filetest suite")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ir"))
        .collect();
    paths.sort();
    for path in paths {
        let text = fs::read_to_string(&path).expect("readable");
        for case in text.split("// case:").skip(1) {
            let (name, rest) = case.split_once('\n').expect("a case header line");
            let input = rest.split("// expect:").next().expect("an input");
            out.push((name.trim().to_string(), input.to_string()));
        }
    }
    assert!(
        out.len() >= 19,
        "found {} cases in {}",
        out.len(),
        dir.display()
    );
    out
}

fn param_specs(g: &Graph) -> Vec<Spec> {
    g.params()
        .iter()
        .map(|&p| match &g.node(p).sharding {
            Some(s) => s.spec(),
            None => vec![Vec::new(); g.ty(p).rank()],
        })
        .collect()
}

/// Printed, then parsed back.
fn reparse(g: &Graph) -> Graph {
    let text = print(g);
    parse(&text).unwrap_or_else(|e| panic!("printed pass output does not parse: {e}\n{text}"))
}

#[test]
fn passes_compose_to_partition_through_their_text() {
    let mut checked = 0;
    for (name, input) in cases() {
        let g = parse(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mesh = g.mesh.clone().expect("a partition case declares a mesh");
        let specs = param_specs(&g);
        let composed = partition(&g, &mesh, &specs);
        let propagated = propagate(&g, &mesh, &specs);
        let (composed, propagated) = match (composed, propagated) {
            (Ok(c), Ok(p)) => (c, p),
            (Err(a), Err(b)) => {
                assert_eq!(a, b, "{name}: partition and propagate fail alike");
                continue;
            }
            (c, p) => panic!(
                "{name}: partition {:?} but propagate {:?}",
                c.err(),
                p.err()
            ),
        };
        let explicit = insert_collectives(&reparse(&propagated))
            .unwrap_or_else(|e| panic!("{name}: insert_collectives: {e}"));
        assert_eq!(
            print(&explicit),
            print(&composed.explicit),
            "{name}: insert_collectives on propagate's text"
        );
        let local =
            per_device(&reparse(&explicit)).unwrap_or_else(|e| panic!("{name}: per_device: {e}"));
        assert_eq!(
            print(&local),
            print(&composed.local),
            "{name}: per_device on insert_collectives' text"
        );
        // The explicit program still has the global types of the input, output for output.
        let types = |g: &Graph| -> Vec<String> {
            g.outputs().iter().map(|&o| g.ty(o).to_string()).collect()
        };
        assert_eq!(types(&explicit), types(&g), "{name}: global output types");
        checked += 1;
    }
    assert!(checked >= 17, "only {checked} cases partitioned");
}

/// Propagation skips an op's turn when none of its tensors changed since its last one: along
/// a chain of elementwise ops with a sharded input, each op takes its turn once forward (which
/// splits its result) and once backward (its result changed), and never again: two turns an
/// op. Taking every turn of every sweep, as the walk did, was six.
#[test]
fn propagation_takes_two_turns_an_op_along_a_chain() {
    let n = 200;
    let mut text =
        String::from("mesh @m = <\"x\"=4>\nfunc @chain(%0: f32[8,16] <@m, [{\"x\"}, {}]>) {\n");
    for i in 1..=n {
        text.push_str(&format!("  %{i} = tanh %{} : f32[8,16]\n", i - 1));
    }
    text.push_str(&format!("  return %{n}\n}}\n"));
    let g = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mesh = g.mesh.clone().unwrap();
    let before = tessera_shard::propagate::turns_taken();
    let out = propagate(&g, &mesh, &param_specs(&g)).unwrap();
    let turns = tessera_shard::propagate::turns_taken() - before;
    assert_eq!(turns, 2 * n as u64);
    // Every value split like the input.
    let last = out.outputs()[0];
    assert_eq!(out.node(last).sharding.as_ref().unwrap().spec()[0], ["x"]);
}
