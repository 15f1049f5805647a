//! Shared by the accuracy and speed tests of the elementwise functions: one op compiled over
//! f32 vectors.

use tessera_interp::SingleDevice;
use tessera_ir::{DType, Data, Graph, Literal, Op, TensorType};

/// `op` compiled over parameters of `n` f32 elements each, and the inputs as literals.
pub fn build(op: Op, inputs: &[Vec<f32>]) -> (tessera_codegen::Executable, Vec<Literal>) {
    let n = inputs[0].len();
    let mut g = Graph::new("elementwise");
    let ps: Vec<_> = inputs
        .iter()
        .map(|_| g.add_param(TensorType::new(DType::F32, vec![n])))
        .collect();
    let y = g.add(op, &ps).unwrap();
    g.set_outputs(vec![y]);
    let exe = tessera_codegen::compile(&g).unwrap();
    let lits: Vec<Literal> = inputs
        .iter()
        .map(|v| Literal::new([n], Data::F32(v.clone())).unwrap())
        .collect();
    (exe, lits)
}

/// Runs `op` compiled, elementwise over the inputs.
#[allow(dead_code)] // not every including test runs it
pub fn compiled(op: Op, inputs: &[Vec<f32>]) -> Vec<f32> {
    let (exe, lits) = build(op, inputs);
    let refs: Vec<&Literal> = lits.iter().collect();
    match &exe.run(&refs, &SingleDevice).unwrap()[0].data {
        Data::F32(v) => v.clone(),
        other => panic!("f32 result expected, got {other:?}"),
    }
}
