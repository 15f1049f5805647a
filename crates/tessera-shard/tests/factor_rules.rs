//! The factor rule of every op, as a golden table (`factor_rules.txt` beside this file):
//! one line per distinct rule over the op corpus, plus reshapes that merge, split and cannot be
//! factored. `UPDATE_EXPECT=1 cargo test -p tessera-shard --test factor_rules` rewrites it.

use std::collections::BTreeSet;

use tessera_ir::{DType, Op, Shape, TensorType, attrs_text, corpus};
use tessera_shard::factors::rule;

fn line(op: &Op, operands: &[&TensorType], result: &TensorType) -> String {
    let attrs = attrs_text(op);
    let types: Vec<String> = operands.iter().map(|t| t.to_string()).collect();
    format!(
        "{}{}{} ({}) -> {result}\n    {}\n",
        op.name(),
        if attrs.is_empty() { "" } else { " " },
        attrs,
        types.join(", "),
        rule(op, operands, result)
    )
}

#[test]
fn every_op_has_a_factor_rule_matching_the_golden_table() {
    let mut seen = BTreeSet::new();
    let mut table = String::new();
    let mut names = BTreeSet::new();
    for s in corpus::op_samples() {
        let g = &s.graph;
        let id = g.outputs()[0];
        let op = g.op(id);
        let operands: Vec<&TensorType> = g.operands(id).iter().map(|&o| g.ty(o)).collect();
        let r = rule(op, &operands, g.ty(id));
        // Every tensor's dims are made of factors whose sizes multiply to the dim's size.
        for (k, dims) in r.operands.iter().enumerate() {
            for (d, fs) in dims.iter().enumerate() {
                let size: usize = fs.iter().map(|&f| r.sizes[f]).product();
                assert_eq!(
                    size,
                    operands[k].dims()[d],
                    "{}: operand {k} dim {d}",
                    s.name
                );
            }
        }
        for (d, fs) in r.result.iter().enumerate() {
            let size: usize = fs.iter().map(|&f| r.sizes[f]).product();
            assert_eq!(size, g.ty(id).dims()[d], "{}: result dim {d}", s.name);
        }
        names.insert(op.name());
        // One line per op and rule, whatever the dtype.
        if seen.insert((op.name(), r.to_string())) {
            table.push_str(&line(op, &operands, g.ty(id)));
        }
    }
    assert!(names.contains("dot_general") && names.contains("reshape"));
    let f32 = |dims: &[usize]| TensorType::new(DType::F32, dims.to_vec());
    for (from, to) in [
        (&[4, 6][..], &[24][..]),
        (&[24][..], &[2, 3, 4][..]),
        (&[6, 4][..], &[4, 6][..]),
        (&[2, 1, 3][..], &[3, 2][..]),
    ] {
        let op = Op::Reshape(Shape::new(to.to_vec()));
        table.push_str(&line(&op, &[&f32(from)], &f32(to)));
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/factor_rules.txt");
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, &table).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        golden == table,
        "factor rules differ from {path} (UPDATE_EXPECT=1 rewrites it):\n{table}"
    );
}
