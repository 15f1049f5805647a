//! Region ops: ops that own sub-graphs (loops, branches, and calls that autodiff treats
//! specially), in the manner of StableHLO's `while`/`case` regions.
//!
//! A region is a whole [`Graph`]: its own parameters, nodes and outputs, and the mesh of the
//! graph it sits in. Regions are isolated from above: a body sees only its parameters, so every
//! value it needs from outside is an explicit operand of the region op (the tracer turns a
//! closure's captures into such operands, the `consts` of a loop). Passes therefore treat a
//! region op like any other node of the outer graph, and recurse into its bodies as into a
//! function of their own.
//!
//! A region op has several results. Its node has the zero-size [`TensorType::token`] type and
//! each result is read by a [`Op::GetResult`](crate::Op::GetResult) node that states the
//! result's type (the verifier checks it against the region's result types). This keeps one
//! type per node, so passes that only look at types (CSE, buffer planning) need no case for
//! tuples.
//!
//! Operand and result layouts (checked by [`RegionOp::result_types`]):
//!
//! | op | operands | body parameters | body outputs | results |
//! |----|----------|-----------------|--------------|---------|
//! | `scan` | consts, carries, xs (leading dim `length`) | consts, carries, one slice of each xs | carries, one slice of each ys | carries, ys (stacked along a new leading dim) |
//! | `while` | consts, carries | `cond` and `body`: consts, carries | `cond`: one `bool[]`; `body`: carries | carries |
//! | `case` | index (`i32[]`), args | each branch: args | each branch: the same types | the branch's outputs |
//! | `checkpoint` | args | args | results | results |
//! | `custom_vjp` | args | `fwd`: args; `bwd`: residuals, then one cotangent per primal output | `fwd`: `primals` outputs, then residuals; `bwd`: one cotangent per arg | `fwd`'s outputs |
//!
//! A `scan` step `t` reads slice `t` of each xs (slice `length - 1 - t` when `reverse`) and
//! writes slice `t` of each ys (likewise). A `case` index outside `0..branches` is clamped to
//! the nearest branch (JAX's `switch`). `checkpoint` computes its body; the difference is in
//! reverse mode, which recomputes the body in the backward pass instead of saving its
//! intermediates. `custom_vjp` computes `fwd`; reverse mode runs `bwd` for its cotangents.

use crate::graph::Graph;
use crate::sharding::Mesh;
use crate::types::{DType, Shape, TensorType};

/// How deeply regions may nest (a region inside a region inside ...). The parser, the verifier
/// and the passes recurse once per level; the limit keeps hostile text from exhausting the
/// stack.
pub const MAX_REGION_DEPTH: usize = 64;

/// The mnemonics of the region ops and of `get_result`. The one-op table tests over the corpus
/// (`corpus.rs`) cannot hold them (a region's sample is a graph with bodies); they are tested
/// by `crates/tessera-ir/tests/regions.rs`, `crates/tessera/tests/control_flow.rs` and the
/// region filetests of each pass.
pub const REGION_OP_NAMES: &[&str] = &[
    "scan",
    "while",
    "case",
    "checkpoint",
    "custom_vjp",
    "get_result",
];

/// An op that owns sub-graphs; see the module doc for the layouts.
#[derive(Clone, Debug, PartialEq)]
pub enum RegionOp {
    /// A loop with a static trip count over the leading dim of its `xs` (`lax.scan`).
    Scan {
        length: usize,
        reverse: bool,
        consts: usize,
        carries: usize,
        body: Graph,
    },
    /// A loop that runs `body` while `cond` holds (`lax.while_loop`).
    While {
        consts: usize,
        cond: Graph,
        body: Graph,
    },
    /// Runs the branch the index selects (`lax.switch`; `lax.cond` is a two-branch case).
    Case { branches: Vec<Graph> },
    /// Runs `body`; reverse mode recomputes it instead of saving residuals (`jax.checkpoint`).
    Checkpoint { body: Graph },
    /// Runs `fwd`; reverse mode uses `bwd` (`jax.custom_vjp`).
    CustomVjp {
        primals: usize,
        fwd: Graph,
        bwd: Graph,
    },
}

impl RegionOp {
    /// The op's mnemonic in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            RegionOp::Scan { .. } => "scan",
            RegionOp::While { .. } => "while",
            RegionOp::Case { .. } => "case",
            RegionOp::Checkpoint { .. } => "checkpoint",
            RegionOp::CustomVjp { .. } => "custom_vjp",
        }
    }

    /// The regions with the label each prints under, in order.
    pub fn regions(&self) -> Vec<(&'static str, &Graph)> {
        match self {
            RegionOp::Scan { body, .. } | RegionOp::Checkpoint { body } => vec![("body", body)],
            RegionOp::While { cond, body, .. } => vec![("cond", cond), ("body", body)],
            RegionOp::Case { branches } => branches.iter().map(|b| ("branch", b)).collect(),
            RegionOp::CustomVjp { fwd, bwd, .. } => vec![("fwd", fwd), ("bwd", bwd)],
        }
    }

    /// The regions, mutably, in the order of [`RegionOp::regions`].
    pub fn regions_mut(&mut self) -> Vec<&mut Graph> {
        match self {
            RegionOp::Scan { body, .. } | RegionOp::Checkpoint { body } => vec![body],
            RegionOp::While { cond, body, .. } => vec![cond, body],
            RegionOp::Case { branches } => branches.iter_mut().collect(),
            RegionOp::CustomVjp { fwd, bwd, .. } => vec![fwd, bwd],
        }
    }

    /// The op's integer attributes as the text format writes them (`reverse` is a word).
    pub fn attrs_text(&self) -> String {
        match self {
            RegionOp::Scan {
                length,
                reverse,
                consts,
                carries,
                ..
            } => format!(
                "{}length={length} consts={consts} carries={carries}",
                if *reverse { "reverse " } else { "" }
            ),
            RegionOp::While { consts, .. } => format!("consts={consts}"),
            RegionOp::Case { .. } | RegionOp::Checkpoint { .. } => String::new(),
            RegionOp::CustomVjp { primals, .. } => format!("primals={primals}"),
        }
    }

    /// The number of values carried from one iteration to the next (loops only).
    pub fn carries(&self, operands: usize) -> usize {
        match self {
            RegionOp::Scan { carries, .. } => *carries,
            RegionOp::While { consts, .. } => operands.saturating_sub(*consts),
            RegionOp::Case { .. } | RegionOp::Checkpoint { .. } | RegionOp::CustomVjp { .. } => 0,
        }
    }

    /// Checks the operand types against the regions and returns the result types. `mesh` is
    /// the enclosing graph's: every region must declare the same one.
    pub fn result_types(
        &self,
        operands: &[&TensorType],
        mesh: Option<&Mesh>,
    ) -> Result<Vec<TensorType>, String> {
        for (label, g) in self.regions() {
            if g.mesh.as_ref() != mesh {
                return Err(format!(
                    "region {label} declares mesh {:?}, the enclosing graph {:?}",
                    g.mesh.as_ref().map(|m| &m.name),
                    mesh.map(|m| &m.name)
                ));
            }
        }
        let owned = |ts: &[&TensorType]| ts.iter().map(|t| (*t).clone()).collect::<Vec<_>>();
        match self {
            RegionOp::Scan {
                length,
                consts,
                carries,
                body,
                ..
            } => {
                let fixed = consts
                    .checked_add(*carries)
                    .filter(|&n| n <= operands.len())
                    .ok_or_else(|| {
                        format!(
                            "{consts} consts and {carries} carries but {} operands",
                            operands.len()
                        )
                    })?;
                let mut params = owned(&operands[..fixed]);
                for (i, x) in operands[fixed..].iter().enumerate() {
                    match x.dims().first() {
                        Some(&n) if n == *length => {
                            params.push(TensorType::new(x.dtype, x.dims()[1..].to_vec()))
                        }
                        _ => {
                            return Err(format!(
                                "scanned operand {i} has type {x}, not a leading dim of the \
                                 length {length}"
                            ));
                        }
                    }
                }
                check_params("body", body, &params)?;
                let outs = output_types(body);
                if outs.len() < *carries || outs[..*carries] != params[*consts..fixed] {
                    return Err(format!(
                        "the body returns {} but the carries are {} (a carried value must keep \
                         its type)",
                        list(&outs[..outs.len().min(*carries)]),
                        list(&params[*consts..fixed])
                    ));
                }
                let mut results = outs[..*carries].to_vec();
                for y in &outs[*carries..] {
                    let mut dims = vec![*length];
                    dims.extend_from_slice(y.dims());
                    let t = TensorType::new(y.dtype, dims);
                    t.check_size()?;
                    results.push(t);
                }
                Ok(results)
            }
            RegionOp::While { consts, cond, body } => {
                if *consts > operands.len() {
                    return Err(format!("{consts} consts but {} operands", operands.len()));
                }
                let params = owned(operands);
                check_params("cond", cond, &params)?;
                check_params("body", body, &params)?;
                let c = output_types(cond);
                if c != [TensorType::new(DType::Bool, Shape::scalar())] {
                    return Err(format!(
                        "the condition returns {}, not one bool[] (the predicate must be a \
                         scalar bool)",
                        list(&c)
                    ));
                }
                let outs = output_types(body);
                if outs != params[*consts..] {
                    return Err(format!(
                        "the body returns {} but the carries are {} (a carried value must keep \
                         its type)",
                        list(&outs),
                        list(&params[*consts..])
                    ));
                }
                Ok(outs)
            }
            RegionOp::Case { branches } => {
                let Some((index, args)) = operands.split_first() else {
                    return Err("takes an index operand".into());
                };
                if **index != TensorType::new(DType::I32, Shape::scalar()) {
                    return Err(format!("the index has type {index}, not i32[]"));
                }
                let Some(first) = branches.first() else {
                    return Err("has no branch".into());
                };
                let params = owned(args);
                let outs = output_types(first);
                for (i, b) in branches.iter().enumerate() {
                    check_params(&format!("branch {i}"), b, &params)?;
                    let o = output_types(b);
                    if o != outs {
                        return Err(format!(
                            "branch {i} returns {} but branch 0 returns {} (every branch must \
                             return the same types)",
                            list(&o),
                            list(&outs)
                        ));
                    }
                }
                Ok(outs)
            }
            RegionOp::Checkpoint { body } => {
                check_params("body", body, &owned(operands))?;
                Ok(output_types(body))
            }
            RegionOp::CustomVjp { primals, fwd, bwd } => {
                let params = owned(operands);
                check_params("fwd", fwd, &params)?;
                let outs = output_types(fwd);
                if *primals > outs.len() {
                    return Err(format!(
                        "{primals} primal outputs but fwd returns {}",
                        outs.len()
                    ));
                }
                let mut bwd_params = outs[*primals..].to_vec();
                bwd_params.extend_from_slice(&outs[..*primals]);
                check_params("bwd", bwd, &bwd_params)?;
                let grads = output_types(bwd);
                if grads != params {
                    return Err(format!(
                        "bwd returns {} but the arguments are {} (one cotangent per argument)",
                        list(&grads),
                        list(&params)
                    ));
                }
                Ok(outs)
            }
        }
    }
}

/// The types of a graph's outputs.
pub fn output_types(g: &Graph) -> Vec<TensorType> {
    g.outputs()
        .iter()
        .filter(|&&o| g.contains(o))
        .map(|&o| g.ty(o).clone())
        .collect()
}

fn check_params(label: &str, g: &Graph, want: &[TensorType]) -> Result<(), String> {
    let have: Vec<TensorType> = g.params().iter().map(|&p| g.ty(p).clone()).collect();
    if have != want {
        return Err(format!(
            "region {label} takes {} but is given {}",
            list(&have),
            list(want)
        ));
    }
    Ok(())
}

fn list(ts: &[TensorType]) -> String {
    let items: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
    format!("({})", items.join(", "))
}
