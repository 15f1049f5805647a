//! The factor rules of `gather` and `scatter` (as Shardy's): the batch dims of the indices
//! pass through to the result's (and to the operand's batching dims), and an operand dim the
//! slice takes whole passes through to its result dim; the index vector, the indexed and
//! collapsed operand dims and partial windows need replication. A scatter's operand and result
//! share their pass-through dims; its update scatter dims need replication (a split would need
//! a combine across devices).

use tessera_ir::{GatherDims, ScatterDims, TensorType};

use crate::factors::{FactorKind, FactorRule};

pub(crate) fn gather_rule(
    d: &GatherDims,
    operand: &[usize],
    indices: &[usize],
    rdims: &[usize],
) -> FactorRule {
    let mut r = FactorRule::new(2);
    let mut idx_f = Vec::with_capacity(indices.len());
    for (k, &size) in indices.iter().enumerate() {
        let kind = if k == d.index_vector_dim {
            FactorKind::NeedReplication
        } else {
            FactorKind::PassThrough
        };
        idx_f.push(r.factor(size, kind));
    }
    let batch: Vec<usize> = (0..indices.len())
        .filter(|&k| k != d.index_vector_dim)
        .collect();
    let window: Vec<usize> = (0..operand.len())
        .filter(|o| !d.collapsed_slice_dims.contains(o) && !d.operand_batching_dims.contains(o))
        .collect();
    let mut op_f = vec![None; operand.len()];
    for (&o, &i) in d
        .operand_batching_dims
        .iter()
        .zip(&d.start_indices_batching_dims)
    {
        op_f[o] = Some(idx_f[i]);
    }
    let (mut b, mut w) = (batch.iter(), window.iter());
    for (i, &size) in rdims.iter().enumerate() {
        let f = if d.offset_dims.contains(&i) {
            let o = *w.next().expect("one window dim per offset dim");
            if d.slice_sizes[o] == operand[o] && !d.start_index_map.contains(&o) {
                let f = r.factor(size, FactorKind::PassThrough);
                op_f[o] = Some(f);
                f
            } else {
                r.factor(size, FactorKind::NeedReplication)
            }
        } else {
            idx_f[*b.next().expect("one batch dim per other dim")]
        };
        r.result.push(vec![f]);
    }
    for (o, f) in op_f.into_iter().enumerate() {
        let f = f.unwrap_or_else(|| r.factor(operand[o], FactorKind::NeedReplication));
        r.operands[0].push(vec![f]);
    }
    for f in idx_f {
        r.operands[1].push(vec![f]);
    }
    r
}

pub(crate) fn scatter_rule(d: &ScatterDims, operands: &[&TensorType]) -> FactorRule {
    let (operand, indices, updates) = (operands[0].dims(), operands[1].dims(), operands[2].dims());
    let mut r = FactorRule::new(3);
    let mut idx_f: Vec<usize> = indices
        .iter()
        .map(|&size| r.factor(size, FactorKind::NeedReplication))
        .collect();
    let mut op_f: Vec<Option<usize>> = vec![None; operand.len()];
    for (&o, &i) in d
        .input_batching_dims
        .iter()
        .zip(&d.scatter_indices_batching_dims)
    {
        let f = r.factor(operand[o], FactorKind::PassThrough);
        op_f[o] = Some(f);
        idx_f[i] = f;
    }
    let batch: Vec<usize> = (0..indices.len())
        .filter(|&k| k != d.index_vector_dim)
        .collect();
    let window: Vec<usize> = (0..operand.len())
        .filter(|o| !d.inserted_window_dims.contains(o) && !d.input_batching_dims.contains(o))
        .collect();
    let (mut b, mut w) = (batch.iter(), window.iter());
    let mut upd_f = Vec::with_capacity(updates.len());
    for (i, &size) in updates.iter().enumerate() {
        let f = if d.update_window_dims.contains(&i) {
            let o = *w.next().expect("one window dim per update window dim");
            if size == operand[o] && !d.scatter_dims_to_operand_dims.contains(&o) {
                let f = r.factor(size, FactorKind::PassThrough);
                op_f[o] = Some(f);
                f
            } else {
                r.factor(size, FactorKind::NeedReplication)
            }
        } else {
            idx_f[*b.next().expect("one batch dim per scatter dim")]
        };
        upd_f.push(f);
    }
    let op_f: Vec<usize> = op_f
        .into_iter()
        .enumerate()
        .map(|(o, f)| f.unwrap_or_else(|| r.factor(operand[o], FactorKind::NeedReplication)))
        .collect();
    for &f in &op_f {
        r.operands[0].push(vec![f]);
        r.result.push(vec![f]);
    }
    for f in idx_f {
        r.operands[1].push(vec![f]);
    }
    for f in upd_f {
        r.operands[2].push(vec![f]);
    }
    r
}
