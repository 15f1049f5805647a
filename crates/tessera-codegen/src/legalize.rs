//! Rewrites before fusion that keep every kernel small: a concatenate of more than
//! [`MAX_CONCAT_OPERANDS`] operands becomes a tree of concatenates of at most that many.
//!
//! A concatenate is one kernel reading all its operands (`fusion.rs::concatenate_expr`), so
//! its Cranelift function grows with the operand count, and register allocation grows faster
//! than that: a concatenate of 4,000 operands spent 3.7 s in `regalloc2` for one function.
//! Split into a tree, each kernel reads at most 32 operands; the copies are `log32(n)` deep
//! (a concatenate only moves values, so the result is the same bits).

use std::collections::HashMap;

use tessera_ir::{Graph, NodeId, Op, TypeError};

/// The most operands one concatenate kernel reads.
pub const MAX_CONCAT_OPERANDS: usize = 32;

/// `g` with its wide concatenates split, or `None` when it has none.
pub fn split_wide_concats(g: &Graph) -> Result<Option<Graph>, TypeError> {
    let order = g.topo_order();
    let wide = |id: NodeId| {
        matches!(g.node(id).op, Op::Concatenate { .. })
            && g.operands(id).len() > MAX_CONCAT_OPERANDS
    };
    if !order.iter().any(|&id| wide(id)) {
        return Ok(None);
    }
    let mut out = Graph::new(g.name.clone());
    out.set_mesh(g.mesh.clone());
    let mut new: HashMap<NodeId, NodeId> = HashMap::new();
    for &p in g.params() {
        let q = out.add_param(g.ty(p).clone());
        out.node_mut(q).sharding = g.node(p).sharding.clone();
        out.node_mut(q).loc = g.node(p).loc.clone();
        new.insert(p, q);
    }
    for id in order {
        if new.contains_key(&id) {
            continue;
        }
        let node = g.node(id);
        let mut args: Vec<NodeId> = g.operands(id).iter().map(|o| new[o]).collect();
        if wide(id) {
            // Chunks of at most MAX_CONCAT_OPERANDS, level by level, until one concatenate
            // of the last level's parts remains (the original node, with its annotations).
            while args.len() > MAX_CONCAT_OPERANDS {
                let mut level = Vec::with_capacity(args.len().div_ceil(MAX_CONCAT_OPERANDS));
                for chunk in args.chunks(MAX_CONCAT_OPERANDS) {
                    if let [one] = chunk {
                        level.push(*one);
                        continue;
                    }
                    let c = out.add(node.op.clone(), chunk)?;
                    out.node_mut(c).loc = node.loc.clone();
                    level.push(c);
                }
                args = level;
            }
        }
        let n = out.add(node.op.clone(), &args)?;
        out.node_mut(n).sharding = node.sharding.clone();
        out.node_mut(n).loc = node.loc.clone();
        new.insert(id, n);
    }
    out.set_outputs(g.outputs().iter().map(|o| new[o]).collect());
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_ir::{DType, Literal, TensorType};

    /// A concatenate of `n` parameters along dim 0.
    fn concat_of(n: usize) -> Graph {
        concat_along(n, vec![2], 0)
    }

    /// A concatenate of `n` parameters of dims `dims` along `dim`.
    fn concat_along(n: usize, dims: Vec<usize>, dim: usize) -> Graph {
        let mut g = Graph::new("wide");
        let ty = TensorType::new(DType::F32, dims);
        let ps: Vec<NodeId> = (0..n).map(|_| g.add_param(ty.clone())).collect();
        let c = g.add(Op::Concatenate { dim }, &ps).unwrap();
        g.set_outputs(vec![c]);
        g
    }

    /// A concatenate whose operands are whole blocks of the result (along its outermost dim
    /// that is not 1) is one native step of block copies, with the interpreter's values; one
    /// along an inner dim stays a kernel.
    #[test]
    fn a_concatenate_of_blocks_is_copied_not_a_kernel() {
        for (dims, dim, native) in [
            (vec![2], 0, true),
            (vec![1, 3], 1, true),
            (vec![2, 0], 0, true),
            (vec![2, 3], 1, false),
        ] {
            let g = concat_along(5, dims.clone(), dim);
            let exe = crate::compile(&g).unwrap();
            let text = exe.describe();
            assert_eq!(text.contains("native concatenate"), native, "{text}");
            let inputs: Vec<Literal> = (0..5)
                .map(|i| {
                    let n: usize = dims.iter().product();
                    let v: Vec<f32> = (0..n).map(|j| (10 * i + j) as f32).collect();
                    Literal::new(dims.clone(), tessera_ir::Data::from_vec(v)).unwrap()
                })
                .collect();
            let refs: Vec<&Literal> = inputs.iter().collect();
            let want = tessera_interp::run(&g, &inputs).unwrap();
            let got = exe.run(&refs, &tessera_interp::SingleDevice).unwrap();
            assert!(want[0].data.bits_eq(&got[0].data), "{dims:?} along {dim}");
        }
    }

    #[test]
    fn wide_concatenates_become_trees_of_narrow_ones_with_the_same_values() {
        assert!(
            split_wide_concats(&concat_of(MAX_CONCAT_OPERANDS))
                .unwrap()
                .is_none()
        );
        for n in [MAX_CONCAT_OPERANDS + 1, 1000, 5000] {
            let g = concat_of(n);
            let s = split_wide_concats(&g).unwrap().expect("split");
            tessera_ir::verify(&s).unwrap();
            let widest = s
                .topo_order()
                .into_iter()
                .filter(|&id| matches!(s.node(id).op, Op::Concatenate { .. }))
                .map(|id| s.operands(id).len())
                .max()
                .unwrap();
            assert!(widest <= MAX_CONCAT_OPERANDS, "{n}: {widest}");
            assert_eq!(s.ty(s.outputs()[0]), g.ty(g.outputs()[0]));
            let inputs: Vec<Literal> = (0..n)
                .map(|i| {
                    Literal::new(
                        vec![2],
                        tessera_ir::Data::from_vec(vec![i as f32, -(i as f32)]),
                    )
                    .unwrap()
                })
                .collect();
            let a = tessera_interp::run(&g, &inputs).unwrap();
            let b = tessera_interp::run(&s, &inputs).unwrap();
            assert!(a[0].data.bits_eq(&b[0].data), "{n}");
        }
    }

    /// The scaling check of compile time, through `compile` itself: however many operands,
    /// every kernel of the executable reads at most `MAX_CONCAT_OPERANDS` buffers, so each
    /// Cranelift function stays the same size and the compile is linear in the operand count.
    #[test]
    fn no_kernel_of_a_wide_concatenate_reads_more_than_the_bound() {
        for n in [100, 4000] {
            // Along an inner dim: a kernel (a block concatenate is copies, no kernel at all).
            let text = crate::compile(&concat_along(n, vec![2, 1], 1))
                .unwrap()
                .describe();
            let widest = text
                .lines()
                .filter(|l| l.contains("<- kernel"))
                .filter_map(|l| {
                    l.split(" inputs)")
                        .next()?
                        .rsplit(", ")
                        .next()?
                        .parse::<usize>()
                        .ok()
                })
                .max()
                .unwrap_or_else(|| panic!("kernels in:\n{text}"));
            assert!(
                widest <= MAX_CONCAT_OPERANDS,
                "{n}: a kernel reads {widest}:\n{text}"
            );
        }
    }
}
