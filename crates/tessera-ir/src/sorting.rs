//! The sorting family's attributes and type rules: `sort` (as `lax.sort`), the cumulative ops
//! (`cumsum`, `cumprod`, `cummax`, `cummin`, as `lax.cumsum` etc.) and `rev` (`lax.rev`).
//!
//! `sort` is single-result: `Op::Sort { dim, num_keys, output }` sorts all its operands (the
//! same shape) together along `dim`, stably and lexicographically over the first `num_keys`,
//! and its value is operand `output` permuted. A multi-result sort (`sort_key_val`, argsort
//! with an iota operand) is several `sort` nodes over the same operands that differ only in
//! `output`; a single-result op keeps every pass's table simple (no token type, no
//! `get_result`), and the permutation is recomputed per output (a sort is cheap next to the
//! passes the region machinery would need). The order on floats is JAX's
//! (`_canonicalize_float_for_sort` then a total order): -inf < ... < -0 = +0 < ... < inf < NaN,
//! with every NaN equal to every other; on integers and bool the usual order.

use std::cmp::Ordering;

use crate::types::{DType, TensorType};

/// The combining function of a cumulative op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CumulativeKind {
    Sum,
    Prod,
    Max,
    Min,
}

impl CumulativeKind {
    pub const ALL: [CumulativeKind; 4] = [
        CumulativeKind::Sum,
        CumulativeKind::Prod,
        CumulativeKind::Max,
        CumulativeKind::Min,
    ];

    /// The op's mnemonic in the text format.
    pub fn name(self) -> &'static str {
        match self {
            CumulativeKind::Sum => "cumsum",
            CumulativeKind::Prod => "cumprod",
            CumulativeKind::Max => "cummax",
            CumulativeKind::Min => "cummin",
        }
    }

    pub fn from_name(s: &str) -> Option<CumulativeKind> {
        CumulativeKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// JAX's sort order on one float key (see the module doc).
pub fn float_sort_cmp(a: f64, b: f64) -> Ordering {
    let canon = |x: f64| {
        if x.is_nan() {
            f64::NAN
        } else if x == 0.0 {
            0.0
        } else {
            x
        }
    };
    canon(a).total_cmp(&canon(b))
}

/// The type rule of `sort`: every operand has the first's shape; `num_keys` in
/// `1..=operands`, `output < operands`, `dim < rank`.
pub fn sort_type(
    operands: &[&TensorType],
    dim: usize,
    num_keys: usize,
    output: usize,
) -> Result<TensorType, String> {
    let first = operands[0];
    if dim >= first.rank() {
        return Err(format!(
            "dimension {dim} is out of range for rank {}",
            first.rank()
        ));
    }
    if num_keys == 0 || num_keys > operands.len() {
        return Err(format!(
            "num_keys {num_keys} must be in 1..={} (the operand count)",
            operands.len()
        ));
    }
    if output >= operands.len() {
        return Err(format!(
            "output {output} is out of range for {} operands",
            operands.len()
        ));
    }
    if let Some(t) = operands.iter().find(|t| t.shape != first.shape) {
        return Err(format!(
            "operands differ in shape ({} and {})",
            first.shape, t.shape
        ));
    }
    Ok(operands[output].clone())
}

/// The type rule of the cumulative ops: the operand's type; every dtype but bool.
pub fn cumulative_type(
    t: &TensorType,
    kind: CumulativeKind,
    axis: usize,
) -> Result<TensorType, String> {
    if axis >= t.rank() {
        return Err(format!("axis {axis} is out of range for rank {}", t.rank()));
    }
    if t.dtype == DType::Bool {
        return Err(format!("{} of bool", kind.name()));
    }
    Ok(t.clone())
}

/// The type rule of `rev`: distinct dims in range.
pub fn rev_type(t: &TensorType, dims: &[usize]) -> Result<TensorType, String> {
    for (i, &d) in dims.iter().enumerate() {
        if d >= t.rank() {
            return Err(format!("dim {d} is out of range for rank {}", t.rank()));
        }
        if dims[..i].contains(&d) {
            return Err(format!("dim {d} is named twice in {dims:?}"));
        }
    }
    Ok(t.clone())
}

/// The corpus samples of the family for numeric dtype `d` (`corpus.rs` calls it).
pub(crate) mod corpus {
    use super::CumulativeKind;
    use crate::corpus::Sample;
    use crate::graph::Graph;
    use crate::op::Op;
    use crate::types::{DType, TensorType};

    fn sample(name: String, op: Op, params: &[TensorType]) -> Sample {
        let mut g = Graph::new("sample");
        let ps: Vec<_> = params.iter().map(|t| g.add_param(t.clone())).collect();
        let n = g
            .add(op, &ps)
            .unwrap_or_else(|e| panic!("corpus sample {name} is ill-typed: {e}"));
        g.set_outputs(vec![n]);
        Sample { name, graph: g }
    }

    pub(crate) fn samples(d: DType) -> Vec<Sample> {
        let t = |dims: &[usize]| TensorType::new(d, dims.to_vec());
        let mut out = vec![
            sample(
                format!("sort.{d}"),
                Op::Sort {
                    dim: 1,
                    num_keys: 1,
                    output: 0,
                },
                &[t(&[3, 6, 2])],
            ),
            // The values of a key-value sort (the second operand permuted by the first).
            sample(
                format!("sort_kv.{d}"),
                Op::Sort {
                    dim: 0,
                    num_keys: 1,
                    output: 1,
                },
                &[t(&[5, 3]), TensorType::new(DType::F32, vec![5, 3])],
            ),
            sample(
                format!("sort_2keys.{d}"),
                Op::Sort {
                    dim: 1,
                    num_keys: 2,
                    output: 0,
                },
                &[t(&[2, 7]), t(&[2, 7])],
            ),
            sample(
                format!("rev.{d}"),
                Op::Rev { dims: vec![0, 2] },
                &[t(&[3, 4, 2])],
            ),
        ];
        for kind in CumulativeKind::ALL {
            for reverse in [false, true] {
                out.push(sample(
                    format!("{}{}.{d}", kind.name(), if reverse { "_rev" } else { "" }),
                    Op::Cumulative {
                        kind,
                        axis: 1,
                        reverse,
                    },
                    &[t(&[3, 5])],
                ));
            }
        }
        out
    }
}
