//! Explicit-mode sharding: a value's split over the mesh's `Explicit` axes is part of its type,
//! and each op's result type follows from its operands' by a fixed rule, as JAX's
//! `sharding_rule`s (`jax/_src/lax/lax.py`) give it. Nothing is guessed: where JAX's rule is
//! ambiguous or the operands conflict, the op is an error naming what to write instead
//! (`out_sharding`, `reshard`).
//!
//! [`rule`] is the one table (an exhaustive match on `Op`, one helper per op family). The tracer
//! calls it on every op it records, so a traced value knows its sharding (`x.sharding()`) and a
//! conflict is reported at the user's line; the pass [`type_graph`] calls it again on the
//! simplified program, whose nodes the simplifier rebuilt, and annotates every value closed, so
//! `insert_collectives` inserts exactly the communication the types imply and decides nothing.
//!
//! The one state beyond a spec is `unreduced`: a dot whose contracting dims are split over
//! axes leaves each device a partial sum over them (JAX's rule calls it ambiguous). Such a value
//! may only be consumed by a `sharding_constraint` (`out_sharding`, `reshard`), which fixes the
//! sharding the sum is completed into; through a `transpose` it stays unreduced. The user-facing
//! `dot_general`/`matmul`/`einsum` reject it at the user's line unless given `out_sharding`,
//! with JAX's message; the reverse-mode rule of a dot gives its products the sharding of the
//! primal operand, as JAX's transpose rule passes `out_sharding`.

use tessera_ir::{AxisType, Graph, Mesh, NodeId, Op, RegionOp, Sharding, TensorType};

use crate::spec::{ShardError, Spec, check_spec};

/// A value's Explicit-mode type on the mesh: how it is split, and the axes over which each
/// device holds a partial sum.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Typed {
    pub spec: Spec,
    pub unreduced: Vec<String>,
}

impl Typed {
    /// Whole on every device.
    pub fn replicated(rank: usize) -> Typed {
        Typed {
            spec: vec![Vec::new(); rank],
            unreduced: Vec::new(),
        }
    }

    pub fn of(spec: Spec) -> Typed {
        Typed {
            spec,
            unreduced: Vec::new(),
        }
    }

    /// The closed annotation of this type on `mesh`.
    pub fn sharding(&self, mesh: &Mesh) -> Sharding {
        let mut s = Sharding::closed(mesh, &self.spec);
        s.unreduced = self.unreduced.clone();
        s
    }

    /// The type an annotation states.
    pub fn from_sharding(s: &Sharding) -> Typed {
        Typed {
            spec: s.spec(),
            unreduced: s.unreduced.clone(),
        }
    }
}

/// The part of a spec over the mesh's Explicit axes: what a type holds on a mesh that mixes
/// Explicit and Auto axes (the Auto axes are propagation's to choose).
pub fn explicit_only(mesh: &Mesh, spec: &Spec) -> Spec {
    spec.iter()
        .map(|axes| {
            axes.iter()
                .filter(|a| mesh.axis_type(a) == AxisType::Explicit)
                .cloned()
                .collect()
        })
        .collect()
}

/// JAX's `P(...)` text of a spec, `P('dp', None)`.
pub fn p_text(spec: &Spec) -> String {
    let parts: Vec<String> = spec
        .iter()
        .map(|axes| match axes.len() {
            0 => "None".to_string(),
            1 => format!("'{}'", axes[0]),
            _ => format!(
                "({})",
                axes.iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
        .collect();
    format!("P({})", parts.join(", "))
}

/// A type as JAX prints it in its errors: `f32[8@dp,4]`.
pub fn type_text(ty: &TensorType, t: &Typed) -> String {
    let dims: Vec<String> = ty
        .dims()
        .iter()
        .zip(&t.spec)
        .map(|(d, axes)| {
            if axes.is_empty() {
                d.to_string()
            } else {
                format!("{d}@{}", axes.join("+"))
            }
        })
        .collect();
    let u = if t.unreduced.is_empty() {
        String::new()
    } else {
        format!("{{U:{}}}", t.unreduced.join(","))
    };
    format!("{}[{}]{u}", ty.dtype, dims.join(","))
}

/// The result type of `op` on operands of the given types, or the error JAX's rule raises.
/// `result` is the op's result type (from the type rules).
pub fn rule(
    mesh: &Mesh,
    op: &Op,
    operands: &[(&TensorType, &Typed)],
    result: &TensorType,
) -> Result<Typed, String> {
    // Only a sharding constraint, a transpose and a reshape may see a partial sum (the last two
    // keep it partial, as JAX's unreduced rules).
    if !matches!(
        op,
        Op::ShardingConstraint(_) | Op::Transpose(_) | Op::Reshape(_)
    ) && let Some((ty, t)) = operands.iter().find(|(_, t)| !t.unreduced.is_empty())
    {
        return Err(format!(
            "{} cannot take an operand that is unreduced over {:?} ({}): a dot whose \
             contracting dims are sharded needs `out_sharding` (or a `reshard` right after it)",
            op.name(),
            t.unreduced,
            type_text(ty, t)
        ));
    }
    let rank = result.rank();
    let first = || operands[0].1.spec.clone();
    let out = match op {
        Op::Parameter(_) | Op::Constant(_) | Op::Iota { .. } => Typed::replicated(rank),
        Op::Unary(_) | Op::Convert(_) | Op::Bitcast(_) | Op::StopGradient => Typed::of(first()),
        Op::Binary(_) | Op::Compare(_) => broadcasting(op, operands)?,
        Op::Select => {
            // JAX's `_select_sharding_rule`: the cases alike, the predicate too unless scalar.
            let (p, a, b) = (operands[0], operands[1], operands[2]);
            if a.1.spec != b.1.spec || (p.0.rank() > 0 && p.1.spec != a.1.spec) {
                return Err(format!(
                    "select cases must have the same shardings, got [{}, {}] and the predicate {}",
                    p_text(&a.1.spec),
                    p_text(&b.1.spec),
                    p_text(&p.1.spec)
                ));
            }
            Typed::of(a.1.spec.clone())
        }
        Op::BroadcastInDim { dims, .. } => {
            let (from, t) = operands[0];
            let mut spec = vec![Vec::new(); rank];
            for (i, &d) in dims.iter().enumerate() {
                if from.dims()[i] == result.dims()[d] {
                    spec[d] = t.spec[i].clone();
                }
            }
            Typed::of(spec)
        }
        Op::Reshape(_) => {
            let (ty, t) = operands[0];
            let whole = Typed::of(t.spec.clone());
            Typed {
                spec: reshape(mesh, (ty, &whole), result)?.spec,
                unreduced: t.unreduced.clone(),
            }
        }
        Op::Transpose(perm) => {
            let t = operands[0].1;
            Typed {
                spec: perm.iter().map(|&p| t.spec[p].clone()).collect(),
                unreduced: t.unreduced.clone(),
            }
        }
        Op::Slice { .. } | Op::Pad { .. } | Op::ReduceWindow { .. } => {
            varying_shape(mesh, op, operands[0], result)?
        }
        Op::Rev { .. } | Op::Sort { .. } => Typed::of(first()),
        Op::Cumulative { axis, .. } => {
            let (ty, t) = operands[0];
            if !t.spec[*axis].is_empty() {
                return Err(format!(
                    "Input should be unsharded over the axis being reduced. Got input type={} \
                     and axis={axis}",
                    type_text(ty, t)
                ));
            }
            Typed::of(first())
        }
        Op::Concatenate { .. } => {
            let t = operands[0].1;
            if let Some((_, other)) = operands.iter().find(|(_, o)| o.spec != t.spec) {
                return Err(format!(
                    "All operands should have the same sharding. Got shardings {} and {}",
                    p_text(&t.spec),
                    p_text(&other.spec)
                ));
            }
            Typed::of(first())
        }
        Op::Reduce { axes, .. } => Typed::of(drop_dims(&first(), axes)),
        Op::ArgMax { axis } => Typed::of(drop_dims(&first(), &[*axis])),
        Op::DotGeneral(dd) => dot_general(dd, operands[0], operands[1])?,
        Op::Conv(cd) => {
            let ((lty, lt), (_, rt)) = (operands[0], operands[1]);
            let rhs_whole = rt.spec.iter().all(|a| a.is_empty());
            if !rhs_whole || !lt.spec[cd.lhs_spec[1]].is_empty() {
                return Err(
                    "the result's sharding does not follow from the operands' (JAX asks for \
                     `out_sharding` on `conv_general_dilated`): reshard the kernel to P() and \
                     keep the input's feature dim whole"
                        .to_string(),
                );
            }
            let mut spec = vec![Vec::new(); rank];
            spec[cd.out_spec[0]] = lt.spec[cd.lhs_spec[0]].clone();
            for (&ld, &od) in cd.lhs_spec[2..].iter().zip(&cd.out_spec[2..]) {
                let axes = &lt.spec[ld];
                let (from, to) = (lty.dims()[ld], result.dims()[od]);
                if !axes.is_empty() && from != to && !to.is_multiple_of(mesh.group_size(axes)) {
                    return Err(format!(
                        "conv_general_dilated on sharded dims where out dim ({to}) is not \
                         divisible by mesh axes ({}) with spec ({})",
                        mesh.group_size(axes),
                        axes.join(", ")
                    ));
                }
                spec[od] = axes.clone();
            }
            Typed::of(spec)
        }
        Op::Gather(_) | Op::Scatter(_) => {
            if operands
                .iter()
                .any(|(_, t)| t.spec.iter().any(|a| !a.is_empty()))
            {
                return Err(format!(
                    "{} of sharded operands on an Explicit mesh: the result's sharding is not \
                     determined by its operands'; `reshard` them to P() first (JAX: \
                     `.at[...].get(out_sharding=)`)",
                    op.name()
                ));
            }
            Typed::replicated(rank)
        }
        Op::ShardingConstraint(s) => Typed::of(explicit_only(mesh, &s.spec())),
        Op::Collective(c) => {
            return Err(format!(
                "{} inside a program on an Explicit mesh: collectives by axis name belong in \
                 pmap or shard_map",
                Op::Collective(c.clone()).name()
            ));
        }
        Op::Region(_) | Op::GetResult { .. } => {
            return Err(format!(
                "{}: control flow on an Explicit mesh is typed by `type_graph`",
                op.name()
            ));
        }
    };
    check_spec(mesh, result, &out.spec).map_err(|e| {
        let ins: Vec<String> = operands.iter().map(|(ty, t)| type_text(ty, t)).collect();
        format!(
            "{} operation with inputs: {} produces an illegally sharded result: {} ({e})",
            op.name(),
            ins.join(", "),
            type_text(result, &out)
        )
    })?;
    Ok(out)
}

/// The spec without the dims in `axes` (a reduction's result).
fn drop_dims(spec: &Spec, axes: &[usize]) -> Spec {
    spec.iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, a)| a.clone())
        .collect()
}

/// JAX's `broadcasting_sharding_rule`: per dim, the operands' axes where they agree; an
/// unsharded dim of size 1 defers to the others, a replicated dim to a split one; two
/// different splits are an error. Scalars do not take part.
fn broadcasting(op: &Op, operands: &[(&TensorType, &Typed)]) -> Result<Typed, String> {
    let shaped: Vec<&(&TensorType, &Typed)> =
        operands.iter().filter(|(ty, _)| ty.rank() > 0).collect();
    let Some(&&(ty0, _)) = shaped.first() else {
        return Ok(Typed::replicated(0));
    };
    let mut spec = vec![Vec::new(); ty0.rank()];
    for (d, out) in spec.iter_mut().enumerate() {
        for (_, t) in &shaped {
            let axes = &t.spec[d];
            if axes.is_empty() {
                continue;
            }
            if out.is_empty() {
                *out = axes.clone();
            } else if out != axes {
                let all: Vec<String> = shaped.iter().map(|(_, t)| p_text(&t.spec)).collect();
                return Err(format!(
                    "{} got incompatible shardings for broadcasting: {}.",
                    op.name(),
                    all.join(", ")
                ));
            }
        }
    }
    Ok(Typed::of(spec))
}

/// JAX's `_get_sharding_for_varying_out_shape` (slice, pad, reduce_window): the operand's
/// sharding, where every dim that changes size stays divisible by its axes.
fn varying_shape(
    mesh: &Mesh,
    op: &Op,
    (ty, t): (&TensorType, &Typed),
    result: &TensorType,
) -> Result<Typed, String> {
    for ((&from, &to), axes) in ty.dims().iter().zip(result.dims()).zip(&t.spec) {
        let n = mesh.group_size(axes);
        if from != to && !axes.is_empty() && !to.is_multiple_of(n) {
            return Err(format!(
                "{} on sharded dims where out dim ({to}) is not divisible by mesh axes ({n}) \
                 with spec ({}) is not implemented. Got input type={} and output shape={:?}",
                op.name(),
                axes.join(", "),
                type_text(ty, t),
                result.dims()
            ));
        }
    }
    Ok(t.clone())
}

/// JAX's `_dot_general_sharding_rule`, with a sharded contraction typed unreduced (the
/// user-facing dots turn that into JAX's error unless given `out_sharding`).
fn dot_general(
    dd: &tessera_ir::DotDims,
    (lty, l): (&TensorType, &Typed),
    (rty, r): (&TensorType, &Typed),
) -> Result<Typed, String> {
    let pick = |t: &Typed, dims: &[usize]| -> Vec<Vec<String>> {
        dims.iter().map(|&d| t.spec[d].clone()).collect()
    };
    let tuple = |s: &[Vec<String>]| -> String {
        let parts: Vec<String> = s
            .iter()
            .map(|a| match a.len() {
                0 => "None".to_string(),
                1 => format!("'{}'", a[0]),
                _ => format!("({})", a.join(", ")),
            })
            .collect();
        if parts.len() == 1 {
            format!("({},)", parts[0])
        } else {
            format!("({})", parts.join(", "))
        }
    };
    let (lb, rb) = (pick(l, &dd.lhs_batch), pick(r, &dd.rhs_batch));
    let (lc, rc) = (pick(l, &dd.lhs_contract), pick(r, &dd.rhs_contract));
    let clash = |a: &[Vec<String>], b: &[Vec<String>]| {
        a.iter()
            .zip(b)
            .any(|(x, y)| !x.is_empty() && !y.is_empty() && x != y)
    };
    if clash(&lb, &rb) {
        return Err(format!(
            "dot_general requires lhs batch dimensions and rhs batch dimensions to have the \
             consistent sharding, got {} and {}.",
            tuple(&lb),
            tuple(&rb)
        ));
    }
    if clash(&lc, &rc) {
        return Err(format!(
            "dot_general requires contracting dimensions to have consistent sharding, got {} \
             and {}.",
            tuple(&lc),
            tuple(&rc)
        ));
    }
    let mut unreduced = Vec::new();
    for (x, y) in lc.iter().zip(&rc) {
        if !x.is_empty() && !y.is_empty() {
            unreduced.extend(x.iter().cloned());
        }
    }
    let mut spec = lb;
    spec.extend(pick(l, &dd.lhs_free(lty.rank())));
    spec.extend(pick(r, &dd.rhs_free(rty.rank())));
    Ok(Typed { spec, unreduced })
}

/// The message JAX gives a dot whose contracting dims are sharded on both sides.
pub fn ambiguous_dot(lhs: &Typed, rhs: &Typed, dd: &tessera_ir::DotDims) -> String {
    let pick = |t: &Typed, dims: &[usize]| -> String {
        let parts: Vec<String> = dims
            .iter()
            .map(|&d| match t.spec[d].len() {
                0 => "None".to_string(),
                1 => format!("'{}'", t.spec[d][0]),
                _ => format!("({})", t.spec[d].join(", ")),
            })
            .collect();
        if parts.len() == 1 {
            format!("({},)", parts[0])
        } else {
            format!("({})", parts.join(", "))
        }
    };
    format!(
        "Contracting dimensions are sharded and it is ambiguous how the output should be \
         sharded. Please specify the output sharding via the `out_sharding` parameter. Got \
         lhs_contracting_spec={} and rhs_contracting_spec={}",
        pick(lhs, &dd.lhs_contract),
        pick(rhs, &dd.rhs_contract)
    )
}

/// JAX's `_reshape_sharding_rule`: dims that only gain or lose 1s keep their axes; a dim split
/// into several gives its axes to the new dims major first, each new dim taking axes while they
/// divide it; dims merged into one keep their axes if only the major ones are split. Anything
/// else needs `out_sharding`.
fn reshape(
    mesh: &Mesh,
    (ty, t): (&TensorType, &Typed),
    result: &TensorType,
) -> Result<Typed, String> {
    let rank = result.rank();
    if t.spec.iter().all(|a| a.is_empty()) {
        return Ok(Typed::replicated(rank));
    }
    let fail = || {
        format!(
            "This reshape is not supported. Please specify the sharding of the output via the \
             `out_sharding` argument of reshape. Got operand type: {}, new sizes: {:?}",
            type_text(ty, t),
            result.dims()
        )
    };
    // Size-1 dims hold no split: group the others, then put the 1s back whole.
    let src: Vec<(usize, &Vec<String>)> = ty
        .dims()
        .iter()
        .zip(&t.spec)
        .filter(|(s, _)| **s != 1)
        .map(|(s, a)| (*s, a))
        .collect();
    let dst: Vec<usize> = result.dims().iter().copied().filter(|&s| s != 1).collect();
    let mut spec: Vec<Vec<String>> = Vec::with_capacity(dst.len());
    let (mut i, mut j) = (0, 0);
    while i < src.len() && j < dst.len() {
        // The shortest runs of dims on both sides with equal products.
        let (i0, j0) = (i, j);
        let (mut pa, mut pb) = (src[i].0, dst[j]);
        i += 1;
        j += 1;
        while pa != pb {
            if pa < pb && i < src.len() {
                pa = pa.saturating_mul(src[i].0);
                i += 1;
            } else if j < dst.len() {
                pb = pb.saturating_mul(dst[j]);
                j += 1;
            } else {
                return Err(fail());
            }
        }
        let group = &src[i0..i];
        let axes: Vec<String> = match group {
            [(_, a)] => (*a).clone(),
            _ if j - j0 > 1 => {
                // Several dims to several: only unsplit ones.
                if group.iter().any(|(_, a)| !a.is_empty()) {
                    return Err(fail());
                }
                Vec::new()
            }
            _ => {
                // A merge: the axes major first, whole dims only after the split ones.
                let mut specs: Vec<&Vec<String>> = group.iter().map(|(_, a)| *a).collect();
                while specs.last().is_some_and(|a| a.is_empty()) {
                    specs.pop();
                }
                if specs.iter().any(|a| a.is_empty()) {
                    return Err(fail());
                }
                specs.into_iter().flatten().cloned().collect()
            }
        };
        // The group's axes to its result dims, major first, each while it divides.
        let mut rest = axes.into_iter().peekable();
        for &size in &dst[j0..j] {
            let mut o = size;
            let mut taken = Vec::new();
            while o > 1 {
                let Some(a) = rest.peek() else { break };
                let n = mesh.axis_size(a).unwrap_or(1);
                if !o.is_multiple_of(n) {
                    return Err(fail());
                }
                o /= n;
                taken.push(rest.next().expect("peeked"));
            }
            spec.push(taken);
        }
        if rest.next().is_some() {
            return Err(fail());
        }
    }
    let mut kept = spec.into_iter();
    let spec = result
        .dims()
        .iter()
        .map(|&s| {
            if s == 1 {
                Vec::new()
            } else {
                kept.next().unwrap_or_default()
            }
        })
        .collect();
    Ok(Typed::of(spec))
}

/// The pass: every value of `g` (a global program on an Explicit mesh, parameters split as
/// `in_specs`) annotated with its type, closed, and why (`Node::why`). A value that is
/// unreduced is annotated with the sharding its first consumer (a `sharding_constraint`,
/// through transposes) completes it into, so `insert_collectives` completes the sum there (a
/// `reduce_scatter` where that splits a dim). Region bodies are typed as functions of their
/// own, their parameters in their slots. The trace typed the user's ops strictly; an op the
/// simplifier made that has no rule (two reshapes folded into one) is typed replicated, which
/// its value is right in, and its `why` says so.
pub fn type_graph(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Graph, ShardError> {
    let mut out = g.clone();
    out.set_mesh(Some(mesh.clone()));
    annotate(&mut out, g, mesh, in_specs)?;
    Ok(out)
}

/// Types `g` and writes the annotations into `out`, a copy of `g`, bodies included.
fn annotate(out: &mut Graph, g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<(), ShardError> {
    let (types, lenient) = type_body(g, mesh, in_specs)?;
    for (id, t) in &types {
        out.node_mut(*id).sharding = Some(t.sharding(mesh));
        let op = g.op(*id);
        let why = if let Some(m) = lenient.get(id) {
            format!(
                "replicated: the simplified program's {} has no Explicit rule ({m})",
                op.name()
            )
        } else if let Op::Parameter(_) = op {
            "the input's type".to_string()
        } else if let Op::ShardingConstraint(_) = op {
            "the user's reshard (out_sharding)".to_string()
        } else if !t.unreduced.is_empty() {
            format!(
                "Explicit rule of {}: a partial sum over {:?}, completed into the sharding of \
                 the reshard that uses it",
                op.name(),
                t.unreduced
            )
        } else {
            format!("Explicit rule of {} from its operands' types", op.name())
        };
        out.node_mut(*id).why = Some(why);
    }
    // An unreduced value's annotation: the sharding it is completed into.
    let order = g.topo_order();
    for &id in &order {
        let Some(t) = types.get(&id).filter(|t| !t.unreduced.is_empty()) else {
            continue;
        };
        let mut spec = t.spec.clone();
        let mut at = id;
        let mut perm: Vec<usize> = (0..spec.len()).collect();
        loop {
            let users = g.users(at);
            let Some(&u) = users.first() else { break };
            match g.op(u) {
                Op::Transpose(p) => {
                    perm = p.iter().map(|&q| perm[q]).collect();
                    at = u;
                }
                Op::ShardingConstraint(s) => {
                    let want = s.spec();
                    let mut back = vec![Vec::new(); spec.len()];
                    for (i, &q) in perm.iter().enumerate() {
                        back[q] = want[i].clone();
                    }
                    spec = back;
                    break;
                }
                // tidy: allow-wildcard(only transposes and constraints continue the chain)
                _ => break,
            }
        }
        if let Op::Transpose(p) = g.op(id) {
            // A transpose of a partial sum: where its operand is annotated, permuted.
            if let Some(s) = out.node(g.operands(id)[0]).sharding.clone() {
                let from = s.spec();
                spec = p.iter().map(|&q| from[q].clone()).collect();
            }
        }
        out.node_mut(id).sharding = Some(Sharding::closed(mesh, &spec));
    }
    // Each region's bodies, their parameters in their slots.
    for &id in &order {
        let Op::Region(r) = g.op(id) else { continue };
        let operands: Vec<Typed> = g.operands(id).iter().map(|o| types[o].clone()).collect();
        let params = body_params(r, &operands);
        let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
        if let Op::Region(ro) = &mut out.node_mut(id).op {
            for ((ob, b), ps) in ro.regions_mut().into_iter().zip(bodies).zip(&params) {
                annotate(ob, b, mesh, ps)?;
            }
        }
    }
    Ok(())
}

/// The type of every node of `g` (a token region node excluded), parameters split as
/// `in_specs`, and the nodes typed replicated for want of a rule, with the rule's message.
type Typing = (
    std::collections::HashMap<NodeId, Typed>,
    std::collections::HashMap<NodeId, String>,
);

fn type_body(g: &Graph, mesh: &Mesh, in_specs: &[Spec]) -> Result<Typing, ShardError> {
    use std::collections::HashMap;
    let mut types: HashMap<NodeId, Typed> = HashMap::new();
    let mut lenient: HashMap<NodeId, String> = HashMap::new();
    for (k, &p) in g.params().iter().enumerate() {
        let spec = in_specs
            .get(k)
            .map(|s| explicit_only(mesh, s))
            .unwrap_or_else(|| vec![Vec::new(); g.ty(p).rank()]);
        types.insert(p, Typed::of(spec));
    }
    for id in g.topo_order() {
        if types.contains_key(&id) {
            continue;
        }
        let op = g.op(id);
        let t = match op {
            Op::Region(_) => continue,
            Op::GetResult { index, .. } => {
                let region = g.operands(id)[0];
                let Op::Region(r) = g.op(region) else {
                    return Err(ShardError::Invalid(format!(
                        "{}: the operand is not a region",
                        op.name()
                    )));
                };
                let operands: Vec<Typed> = g
                    .operands(region)
                    .iter()
                    .map(|o| types[o].clone())
                    .collect();
                let mut results =
                    region_typing(mesh, r, &operands, false).map_err(ShardError::Invalid)?;
                results.swap_remove(*index)
            }
            // tidy: allow-wildcard(every other op goes to `rule`, the exhaustive table)
            _ => {
                let operands: Vec<(&TensorType, &Typed)> = g
                    .operands(id)
                    .iter()
                    .map(|o| (g.ty(*o), &types[o]))
                    .collect();
                match rule(mesh, op, &operands, g.ty(id)) {
                    Ok(t) => t,
                    Err(m) => {
                        lenient.insert(id, m);
                        Typed::replicated(g.ty(id).rank())
                    }
                }
            }
        };
        types.insert(id, t);
    }
    Ok((types, lenient))
}

/// Each body's parameter specs: the slots' (`region.rs`), from the region's operands' types.
fn body_params(r: &RegionOp, operands: &[Typed]) -> Vec<Vec<Spec>> {
    let slots = crate::region::slots(r, operands.len());
    let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
    let mut params: Vec<Vec<Spec>> = bodies
        .iter()
        .map(|b| {
            b.params()
                .iter()
                .map(|&q| vec![Vec::new(); b.ty(q).rank()])
                .collect()
        })
        .collect();
    for s in &slots {
        if let Some(k) = s.operand {
            let spec = crate::region::unstack(s, &operands[k].spec);
            for &(b, q) in &s.params {
                params[b][q] = spec.clone();
            }
        }
    }
    params
}

/// The types of a region's results from its operands' types: each body typed with its
/// parameters in their slots; a carried value must leave the body as it came in (the error
/// the tracer reports at the user's line).
pub fn region_results(mesh: &Mesh, r: &RegionOp, operands: &[Typed]) -> Result<Vec<Typed>, String> {
    region_typing(mesh, r, operands, true)
}

/// `region_results`; when not `strict` (the pass on the simplified program), a carried value
/// that leaves otherwise keeps its slot's type (`insert_collectives` moves it there).
fn region_typing(
    mesh: &Mesh,
    r: &RegionOp,
    operands: &[Typed],
    strict: bool,
) -> Result<Vec<Typed>, String> {
    let slots = crate::region::slots(r, operands.len());
    let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
    let params = body_params(r, operands);
    let mut outs: Vec<Vec<Spec>> = Vec::new();
    for (b, body) in bodies.iter().enumerate() {
        let (types, _) = type_body(body, mesh, &params[b]).map_err(|e| e.to_string())?;
        outs.push(
            body.outputs()
                .iter()
                .map(|o| types[o].spec.clone())
                .collect(),
        );
    }
    let n = slots
        .iter()
        .filter_map(|s| s.result)
        .max()
        .map_or(0, |m| m + 1);
    let mut results = vec![Typed::default(); n];
    for s in &slots {
        let Some(i) = s.result else { continue };
        let mut spec: Option<Spec> = s
            .operand
            .map(|k| crate::region::unstack(s, &operands[k].spec));
        for &(b, j) in &s.outputs {
            let got = &outs[b][j];
            match &spec {
                None => spec = Some(got.clone()),
                Some(want) if want != got && strict => {
                    return Err(format!(
                        "a {} body's value leaves as {} but must be {} (a carried value keeps \
                         its sharding, branches agree): reshard it in the body",
                        r.name(),
                        p_text(got),
                        p_text(want)
                    ));
                }
                Some(_) => {}
            }
        }
        let spec = spec.unwrap_or_default();
        results[i] = Typed::of(crate::region::stack(s, &spec));
    }
    Ok(results)
}

/// Where each output must leave: its type (the program's outputs keep their types).
pub fn output_specs(g: &Graph) -> Vec<Spec> {
    g.outputs()
        .iter()
        .map(|&o| {
            g.node(o)
                .sharding
                .as_ref()
                .map(|s| s.spec())
                .unwrap_or_else(|| vec![Vec::new(); g.ty(o).rank()])
        })
        .collect()
}
