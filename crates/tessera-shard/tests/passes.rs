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
        // The pipeline's form, on a graph it gives up: the same program.
        let owned = tessera_shard::propagate::propagate_owned(g.clone(), &mesh, &specs)
            .unwrap_or_else(|e| panic!("{name}: propagate_owned: {e}"));
        assert_eq!(print(&owned), print(&propagated), "{name}: propagate_owned");
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

/// The case's text with every axis of its mesh of size 1.
fn on_one_device_text(input: &str) -> String {
    input
        .lines()
        .map(|l| {
            if !l.starts_with("mesh @") {
                return l.to_string();
            }
            let mut out = String::new();
            let mut rest = l;
            while let Some(at) = rest.find("\"=") {
                out.push_str(&rest[..at + 2]);
                rest = rest[at + 2..].trim_start_matches(|c: char| c.is_ascii_digit());
                out.push('1');
            }
            out.push_str(rest);
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Deterministic inputs of `g`'s parameter types: small integers, signs alternating.
fn inputs(g: &Graph) -> Vec<tessera_ir::Literal> {
    g.params()
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let ty = g.ty(p);
            let values: Vec<f64> = (0..ty.numel())
                .map(|i| ((i * 7 + k * 3) % 11) as f64 / 4.0 - 1.25)
                .collect();
            let data = tessera_interp::convert(&tessera_ir::Data::from_vec(values), ty.dtype);
            tessera_ir::Literal::new(ty.dims().to_vec(), data).expect("a literal of the type")
        })
        .collect()
}

/// On a mesh of one device, `on_one_device` of insert_collectives' output is the program
/// `per_device` and `combine` make, value for value: every case of the partition suite with
/// its mesh shrunk to one device (and a conflict whose propagated sharding loses), both
/// programs run by the interpreter on the same inputs, the outputs equal bit for bit and in
/// the same shardings.
#[test]
fn one_device_is_what_the_passes_make_on_one_device() {
    let mut checked = 0;
    let conflict = "mesh @m = <\"dp\"=2>
func @f(%0: f32[8,8] <@m, [{\"dp\"}, {}]>, %1: f32[8,8], %2: f32[8,8] <@m, [{}, {\"dp\"}]>) {
  %3 = dot_general %0, %1 contracting=[1]x[0] : f32[8,8]
  %4 = add %3, %2 : f32[8,8]
  return %4, %3
}
";
    let mut all = cases();
    all.push((
        "a product's propagated sharding loses".into(),
        conflict.into(),
    ));
    for (name, input) in all {
        let g = parse(&on_one_device_text(&input)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mesh = g.mesh.clone().expect("a partition case declares a mesh");
        assert_eq!(mesh.device_count(), 1, "{name}");
        let specs = param_specs(&g);
        let (Ok(mut full), Ok(propagated)) =
            (partition(&g, &mesh, &specs), propagate(&g, &mesh, &specs))
        else {
            continue;
        };
        tessera_shard::combine::drop_single_device_collectives(&mut full.local).unwrap();
        tessera_shard::combine_all_reduces(&mut full.local).unwrap();
        let explicit = insert_collectives(&reparse(&propagated))
            .unwrap_or_else(|e| panic!("{name}: insert_collectives: {e}"));
        let (lean, out_specs) = tessera_shard::on_one_device(reparse(&explicit))
            .unwrap_or_else(|e| panic!("{name}: on_one_device: {e}"));
        tessera_ir::verify(&lean).unwrap_or_else(|e| panic!("{name}: {e}\n{}", print(&lean)));
        assert!(
            lean.node_ids().all(|id| lean.node(id).sharding.is_none()
                && !lean.op(id).is_collective()
                && !matches!(lean.op(id), tessera_ir::Op::ShardingConstraint(_))),
            "{name}: an annotation, collective or reshard left\n{}",
            print(&lean)
        );
        let args = inputs(&g);
        let a = tessera_interp::run(&full.local, &args).unwrap_or_else(|e| panic!("{name}: {e}"));
        let b = tessera_interp::run(&lean, &args).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(a.len(), b.len(), "{name}");
        for (j, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.shape(), y.shape(), "{name}: output {j}");
            assert!(
                x.data.bits_eq(&y.data),
                "{name}: output {j}: {x:?} against {y:?}"
            );
        }
        assert_eq!(out_specs, full.out_specs, "{name}: output shardings");
        checked += 1;
    }
    assert!(checked >= 18, "only {checked} cases compared");
    // The conflict's settled sharding is not propagation's.
    let g = parse(&on_one_device_text(conflict)).unwrap();
    let mesh = g.mesh.clone().unwrap();
    let propagated = propagate(&g, &mesh, &param_specs(&g)).unwrap();
    let wanted = propagated
        .node(propagated.outputs()[1])
        .sharding
        .as_ref()
        .unwrap()
        .spec();
    let explicit = insert_collectives(&propagated).unwrap();
    let (_, settled) = tessera_shard::on_one_device(explicit).unwrap();
    assert_ne!(wanted, settled[1]);
    assert_eq!(settled[1], vec![vec!["dp".to_string()], vec![]]);
}
