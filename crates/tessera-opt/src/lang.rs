//! The e-graph language: one node per IR op (with its attributes), and the e-class analysis
//! that knows each class's type, its value when it is a small constant, and its value when
//! every element is the same (a splat).

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use egg::{DidMerge, EGraph, FromOp, Id, Language};
use tessera_interp::eval_op;
use tessera_ir::{BinaryOp, CompareOp, Data, Literal, Mesh, Op, TensorType, UnaryOp};

/// An IR op applied to e-classes. Equality, order and hash use the op with all its attributes
/// and, for parameters, their type. The op and its key are shared: egg clones nodes into its
/// memo, its classes and every lookup (a clone that copied them was a third of adding the
/// seed step's nodes, perf).
#[derive(Clone, Debug)]
pub struct Node {
    pub op: Arc<Op>,
    key: Key,
    pub children: Vec<Id>,
    /// A parameter's type (other nodes' types come from the type rules).
    pub param_ty: Option<TensorType>,
}

/// A node's identity apart from its children. An op without attributes is its mnemonic; an op
/// whose attributes hold no float (integers, types, axis names) is its mnemonic and the op
/// itself, compared with `==` and hashed by its attributes (`hash_attrs`; formatting it was
/// most of building a node: perf of the seed step's first call); a constant, a gather (its
/// fill value), a parameter (with its type) and a region are a text of the op with all its
/// attributes (a float attribute compared as text: a NaN constant equals itself).
/// Every attribute counts, including those the text format leaves to the result type (a
/// broadcast's shape): two broadcasts of one value to different shapes differ.
#[derive(Clone, Debug)]
enum Key {
    Name(&'static str),
    Attrs(&'static str),
    Text(Arc<str>),
}

impl Key {
    /// The variant's rank and its text: equal keys have equal parts, and `Attrs` also equal ops.
    fn parts(&self) -> (u8, &str) {
        match self {
            Key::Name(n) => (0, n),
            Key::Attrs(n) => (1, n),
            Key::Text(t) => (2, t),
        }
    }
}

impl Node {
    pub fn new(op: Op, children: Vec<Id>, param_ty: Option<TensorType>) -> Node {
        // Constants are keyed by type and value: a splat by its one element, a small array by
        // its elements, a large one by identity (never merged; printing it would cost more
        // than merging could save).
        let text = |key: String| Key::Text(key.into());
        let key = match &op {
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::StopGradient => {
                Key::Name(op.name())
            }
            Op::Iota { .. }
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::BroadcastInDim { .. }
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::DotGeneral(_)
            | Op::Collective(_)
            | Op::ShardingConstraint(_)
            | Op::GetResult { .. }
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => Key::Attrs(op.name()),
            Op::Constant(l) if l.data.is_splat() && !l.data.is_empty() => text(format!(
                "constant {} splat {}",
                l.ty,
                l.data.element_text(0)
            )),
            Op::Constant(l) if l.data.len() > 64 => {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                text(format!(
                    "constant {} #{}",
                    l.ty,
                    NEXT.fetch_add(1, AtomicOrdering::Relaxed)
                ))
            }
            Op::Parameter(_) | Op::Constant(_) | Op::Region(_) | Op::Gather(_) => match &param_ty {
                Some(t) => text(format!("{op:?} : {t}")),
                None => text(format!("{op:?}")),
            },
        };
        Node {
            op: Arc::new(op),
            key,
            children,
            param_ty,
        }
    }

    /// Whether the ops are equal where the keys alone do not tell (`Key::Attrs`).
    fn same_attrs(&self, o: &Node) -> bool {
        !matches!(self.key, Key::Attrs(_)) || Arc::ptr_eq(&self.op, &o.op) || self.op == o.op
    }
}

impl PartialEq for Node {
    fn eq(&self, o: &Node) -> bool {
        self.key.parts() == o.key.parts() && self.children == o.children && self.same_attrs(o)
    }
}
impl Eq for Node {}
impl Hash for Node {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key.parts().hash(h);
        self.children.hash(h);
        if let Key::Attrs(_) = self.key {
            hash_attrs(&self.op, h);
        }
    }
}

/// The attributes of an op keyed `Key::Attrs`, hashed (equal ops hash alike): without them,
/// every slice or reshape of one value would share a hash, and a program of many (an unrolled
/// loop's slices) would compare them all pairwise. A collective and a scatter are hashed by
/// name alone (their attribute types have no `Hash`; a program holds few).
fn hash_attrs<H: Hasher>(op: &Op, h: &mut H) {
    match op {
        Op::Iota { dim, ty } => (dim, ty).hash(h),
        Op::Convert(d) | Op::Bitcast(d) => d.hash(h),
        Op::BroadcastInDim { shape, dims } => (shape, dims).hash(h),
        Op::Reshape(shape) => shape.hash(h),
        Op::Transpose(perm) => perm.hash(h),
        Op::Slice {
            start,
            limit,
            stride,
        } => (start, limit, stride).hash(h),
        Op::Concatenate { dim } => dim.hash(h),
        Op::Pad {
            low,
            high,
            interior,
        } => (low, high, interior).hash(h),
        Op::Reduce { kind, axes } => (kind, axes).hash(h),
        Op::ArgMax { axis } => axis.hash(h),
        Op::DotGeneral(dims) => dims.hash(h),
        Op::ShardingConstraint(s) => s.hash(h),
        Op::GetResult { index, ty } => (index, ty).hash(h),
        Op::Conv(dims) => dims.hash(h),
        Op::ReduceWindow { kind, win } => (kind, win).hash(h),
        Op::Sort {
            dim,
            num_keys,
            output,
        } => (dim, num_keys, output).hash(h),
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => (kind, axis, reverse).hash(h),
        Op::Rev { dims } => dims.hash(h),
        Op::Collective(_) | Op::Scatter(_) => {}
        // Not keyed `Attrs`: their keys say everything.
        Op::Parameter(_)
        | Op::Constant(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::StopGradient
        | Op::Region(_)
        | Op::Gather(_) => {}
    }
}
impl PartialOrd for Node {
    fn partial_cmp(&self, o: &Node) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Node {
    fn cmp(&self, o: &Node) -> Ordering {
        (self.key.parts(), &self.children)
            .cmp(&(o.key.parts(), &o.children))
            .then_with(|| match self.same_attrs(o) {
                true => Ordering::Equal,
                // Ops of one mnemonic with other attributes: their texts differ (no float in
                // them, so no NaN prints alike for different bits).
                false => format!("{:?}", self.op).cmp(&format!("{:?}", o.op)),
            })
    }
}

impl Language for Node {
    type Discriminant = &'static str;
    fn discriminant(&self) -> &'static str {
        self.op.name()
    }
    /// Patterns match by mnemonic: a rule's condition or applier reads the attributes.
    fn matches(&self, other: &Node) -> bool {
        self.op.name() == other.op.name() && self.children.len() == other.children.len()
    }
    fn children(&self) -> &[Id] {
        &self.children
    }
    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.op.name())
    }
}

/// Rule patterns name attribute-free ops by mnemonic.
impl FromOp for Node {
    type Error = String;
    fn from_op(op: &str, children: Vec<Id>) -> Result<Node, String> {
        let o = if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == op) {
            Op::Unary(u)
        } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == op) {
            Op::Binary(b)
        } else if let Some(c) = CompareOp::ALL.into_iter().find(|c| c.name() == op) {
            Op::Compare(c)
        } else {
            match op {
                "select" => Op::Select,
                // Matched by mnemonic only; attributes come from the e-graph.
                "transpose" => Op::Transpose(vec![]),
                "reshape" => Op::Reshape(Default::default()),
                "broadcast_in_dim" => Op::BroadcastInDim {
                    shape: Default::default(),
                    dims: vec![],
                },
                "reduce_sum" => Op::Reduce {
                    kind: tessera_ir::ReduceKind::Sum,
                    axes: vec![],
                },
                "dot_general" => Op::DotGeneral(Default::default()),
                other => return Err(format!("no pattern op '{other}'")),
            }
        };
        Ok(Node::new(o, children, None))
    }
}

/// What the analysis knows of a class.
#[derive(Clone, Debug, Default)]
pub struct ClassData {
    pub ty: Option<TensorType>,
    /// The class's value, when it is a constant of at most one element.
    pub constant: Option<Literal>,
    /// The value of every element, when they are all equal and known.
    pub splat: Option<f64>,
}

/// The analysis: types from the type rules, constant folding of scalar subgraphs.
pub struct TensorAnalysis {
    mesh: Option<Mesh>,
}

impl TensorAnalysis {
    pub fn new(mesh: Option<Mesh>) -> Self {
        TensorAnalysis { mesh }
    }
}

impl egg::Analysis<Node> for TensorAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut EGraph<Node, Self>, enode: &Node, _id: Id) -> ClassData {
        let kids: Vec<&ClassData> = enode.children.iter().map(|&c| &egraph[c].data).collect();
        let ty = if let Op::Parameter(_) = &*enode.op {
            enode.param_ty.clone()
        } else {
            let types: Option<Vec<&TensorType>> = kids.iter().map(|k| k.ty.as_ref()).collect();
            types.and_then(|t| enode.op.infer_type(&t, egraph.analysis.mesh.as_ref()).ok())
        };
        // Scalar constant folding: every operand a known one-element constant.
        let constant = if let Op::Constant(l) = &*enode.op {
            (l.ty.numel() <= 1).then(|| l.clone())
        } else if let Some(t) = &ty
            && t.numel() == 1
            && !enode.children.is_empty()
            && !enode.op.is_collective()
        {
            let args: Option<Vec<&Literal>> = kids.iter().map(|k| k.constant.as_ref()).collect();
            args.and_then(|a| eval_op(&enode.op, &a, t).ok())
        } else {
            None
        };
        let splat = match &*enode.op {
            Op::Constant(l) if l.data.is_splat() && !l.data.is_empty() => Some(l.data.get_f64(0)),
            // Moving a splat's elements leaves a splat.
            Op::BroadcastInDim { .. } | Op::Reshape(_) | Op::Transpose(_) => {
                kids.first().and_then(|k| k.splat)
            }
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert(_)
            | Op::Bitcast(_)
            | Op::Slice { .. }
            | Op::Concatenate { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::DotGeneral(_)
            | Op::Collective(_)
            | Op::ShardingConstraint(_)
            | Op::StopGradient
            | Op::Region(_)
            | Op::GetResult { .. }
            | Op::Conv(_)
            | Op::ReduceWindow { .. }
            | Op::Gather(_)
            | Op::Scatter(_)
            | Op::Sort { .. }
            | Op::Cumulative { .. }
            | Op::Rev { .. } => constant
                .as_ref()
                .filter(|l| l.data.len() == 1)
                .map(|l| l.data.get_f64(0)),
        };
        ClassData {
            ty,
            constant,
            splat,
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        if a.ty.is_none() && b.ty.is_some() {
            a.ty = b.ty.clone();
            changed_a = true;
        }
        if a.constant.is_none() && b.constant.is_some() {
            a.constant = b.constant.clone();
            changed_a = true;
        }
        if a.splat.is_none() && b.splat.is_some() {
            a.splat = b.splat;
            changed_a = true;
        }
        DidMerge(changed_a, true)
    }

    /// A class with a known scalar value gets that constant as a member, which extraction
    /// prefers to any computation of it.
    fn modify(egraph: &mut EGraph<Node, Self>, id: Id) {
        let Some(c) = egraph[id].data.constant.clone() else {
            return;
        };
        let has_constant = egraph[id]
            .nodes
            .iter()
            .any(|n| matches!(*n.op, Op::Constant(_)));
        if !has_constant {
            let k = egraph.add(Node::new(Op::Constant(c), vec![], None));
            egraph.union(id, k);
        }
    }
}

/// A constant of `ty` with every element `v`.
pub fn splat_literal(ty: &TensorType, v: f64) -> Literal {
    Literal {
        ty: ty.clone(),
        data: Data::splat(ty.dtype, v, ty.numel()),
    }
}
