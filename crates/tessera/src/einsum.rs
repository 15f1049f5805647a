//! `einsum` and NumPy's broadcasting `matmul`, lowered to `dot_general` plus reductions,
//! reshapes and transposes (as `jnp.einsum` lowers to `lax.dot_general`).
//!
//! An einsum of several operands is contracted pairwise; the pair contracted next is the one
//! whose result is smallest (ties: fewest multiply-adds), the greedy order `opt_einsum` uses by
//! default. An index that appears in one operand only and not in the output is summed out of
//! that operand first; an index repeated inside one operand (`ii->i`) takes the diagonal.

use std::panic::Location;

use tessera_ir::DotDims;

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::join;

#[track_caller]
fn fail(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// One operand during contraction: its value and the index letter of each of its dims.
#[derive(Clone)]
struct Term {
    t: Tensor,
    ix: Vec<char>,
}

impl Term {
    fn size(&self) -> u128 {
        self.t.shape().iter().map(|&d| d as u128).product()
    }
}

/// Parses one side of a spec into index letters, expanding `...` to `rank - letters` fresh
/// letters (upper-case Greek-free private range, shared by every operand, right-aligned as
/// NumPy broadcasts them).
#[track_caller]
fn parse_term(spec: &str, rank: usize, ellipsis: &[char], whole: &str) -> Vec<char> {
    let (before, after, has) = match spec.find("...") {
        Some(p) => (&spec[..p], &spec[p + 3..], true),
        None => (spec, "", false),
    };
    let letters = |s: &str| -> Vec<char> {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .inspect(|c| {
                if !c.is_ascii_alphabetic() {
                    fail(
                        "einsum",
                        format!("{whole:?}: index {c:?} is not a letter (a-z, A-Z, or `...`)"),
                    )
                }
            })
            .collect()
    };
    let (b, a) = (letters(before), letters(after));
    if !has {
        if b.len() != rank {
            fail(
                "einsum",
                format!(
                    "{whole:?}: term {spec:?} names {} indices for an operand of rank {rank}",
                    b.len()
                ),
            );
        }
        return b;
    }
    let named = b.len() + a.len();
    if named > rank {
        fail(
            "einsum",
            format!("{whole:?}: term {spec:?} names {named} indices for an operand of rank {rank}"),
        );
    }
    let n = rank - named;
    let mut out = b;
    out.extend_from_slice(&ellipsis[ellipsis.len() - n..]);
    out.extend(a);
    out
}

/// `jnp.einsum(spec, *operands)`: explicit (`"ij,jk->ik"`) or implicit (`"ij,jk"`: the output
/// is every index that appears once, in alphabetical order) form, with `...` broadcasting.
/// A malformed spec or mismatched sizes panic (or fail the enclosing trace).
///
/// ```
/// use tessera::prelude::*;
///
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
/// let b = Tensor::ones([2, 3]);
/// assert_eq!(einsum("ij,jk->ik", &[&a, &b]).shape(), &[2, 3]);
/// assert_eq!(einsum("ij->j", &[&a]).to_vec::<f32>(), vec![4.0, 6.0]);
/// assert_eq!(einsum("ij,ij", &[&a, &a]).item::<f32>(), 30.0); // implicit: a scalar
/// ```
#[track_caller]
pub fn einsum(spec: &str, operands: &[&Tensor]) -> Tensor {
    if operands.is_empty() {
        fail("einsum", format!("{spec:?}: needs at least one operand"));
    }
    let (lhs, out_spec) = match spec.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (spec, None),
    };
    let terms_spec: Vec<&str> = lhs.split(',').map(str::trim).collect();
    if terms_spec.len() != operands.len() {
        fail(
            "einsum",
            format!(
                "{spec:?} has {} operand terms but {} operands were given (shapes {})",
                terms_spec.len(),
                operands.len(),
                shapes(operands)
            ),
        );
    }
    // Letters for `...` dims: private code points no user letter can be.
    let max_rank = operands.iter().map(|t| t.rank()).max().unwrap_or(0);
    let ellipsis: Vec<char> = (0..max_rank as u32)
        .map(|i| char::from_u32(0xE000 + i).expect("private-use code point"))
        .collect();
    let joined = join(operands);
    let mut terms: Vec<Term> = terms_spec
        .iter()
        .zip(&joined)
        .map(|(s, t)| Term {
            ix: parse_term(s, t.rank(), &ellipsis, spec),
            t: t.clone(),
        })
        .collect();
    // The size of every index, checked consistent (1 broadcasts, as NumPy's `...`).
    let mut sizes: Vec<(char, usize)> = Vec::new();
    for term in &terms {
        for (&c, &d) in term.ix.iter().zip(term.t.shape()) {
            match sizes.iter_mut().find(|(k, _)| *k == c) {
                Some((_, s)) if *s == d || d == 1 => {}
                Some((_, s)) if *s == 1 => *s = d,
                Some((_, s)) => fail(
                    "einsum",
                    format!(
                        "{spec:?}: index {} has size {s} and {d} (operand shapes {})",
                        show(c),
                        shapes(operands)
                    ),
                ),
                None => sizes.push((c, d)),
            }
        }
    }
    let out: Vec<char> = match out_spec {
        Some(o) => {
            let ell_rank = terms
                .iter()
                .map(|t| t.ix.iter().filter(|c| ellipsis.contains(c)).count())
                .max()
                .unwrap_or(0);
            let o_ix = parse_term(
                o.trim(),
                o.trim()
                    .replace("...", "")
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .count()
                    + if o.contains("...") { ell_rank } else { 0 },
                &ellipsis,
                spec,
            );
            for (i, c) in o_ix.iter().enumerate() {
                if !sizes.iter().any(|(k, _)| k == c) {
                    fail(
                        "einsum",
                        format!("{spec:?}: output index {} appears in no operand", show(*c)),
                    );
                }
                if o_ix[..i].contains(c) {
                    fail(
                        "einsum",
                        format!("{spec:?}: output index {} is repeated", show(*c)),
                    );
                }
            }
            o_ix
        }
        None => {
            let mut once: Vec<char> = sizes
                .iter()
                .map(|(c, _)| *c)
                .filter(|c| {
                    !ellipsis.contains(c)
                        && terms
                            .iter()
                            .map(|t| t.ix.iter().filter(|x| *x == c).count())
                            .sum::<usize>()
                            == 1
                })
                .collect();
            once.sort_unstable();
            let mut o: Vec<char> = ellipsis
                .iter()
                .copied()
                .filter(|c| sizes.iter().any(|(k, _)| k == c))
                .collect();
            o.extend(once);
            o
        }
    };
    let size_of = |c: char| sizes.iter().find(|(k, _)| *k == c).map_or(1, |(_, s)| *s);
    // Broadcast size-1 dims of each operand to the index size, take diagonals, and sum out
    // indices no one else needs.
    for i in 0..terms.len() {
        let target: Vec<usize> = terms[i].ix.iter().map(|&c| size_of(c)).collect();
        if target != terms[i].t.shape() {
            terms[i].t = terms[i].t.broadcast_to(&target);
        }
        terms[i] = diagonals(terms[i].clone());
        let others: Vec<char> = terms
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .flat_map(|(_, t)| t.ix.clone())
            .chain(out.iter().copied())
            .collect();
        terms[i] = sum_out(terms[i].clone(), |c| others.contains(&c));
    }
    while terms.len() > 1 {
        let (a, b) = cheapest_pair(&terms, &out, size_of);
        let tb = terms.remove(b);
        let ta = terms.remove(a);
        let keep: Vec<char> = terms
            .iter()
            .flat_map(|t| t.ix.clone())
            .chain(out.iter().copied())
            .collect();
        terms.push(contract(ta, tb, &keep));
    }
    let last = terms.pop().expect("one term remains");
    let last = sum_out(last, |c| out.contains(&c));
    let perm: Vec<usize> = out
        .iter()
        .map(|c| {
            last.ix
                .iter()
                .position(|x| x == c)
                .expect("output index present")
        })
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        last.t
    } else {
        last.t.transpose(&perm)
    }
}

fn show(c: char) -> String {
    if ('\u{E000}'..='\u{E0FF}').contains(&c) {
        "`...`".into()
    } else {
        format!("{c:?}")
    }
}

fn shapes(ts: &[&Tensor]) -> String {
    ts.iter()
        .map(|t| t.ty().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Takes the diagonal of every index repeated within the term (`ii` -> `i`): a mask of the
/// equal positions, multiplied in, then one of the two dims summed out.
#[track_caller]
fn diagonals(mut term: Term) -> Term {
    loop {
        let Some((i, j)) = (0..term.ix.len()).find_map(|i| {
            (i + 1..term.ix.len())
                .find(|&j| term.ix[j] == term.ix[i])
                .map(|j| (i, j))
        }) else {
            return term;
        };
        let shape = term.t.shape().to_vec();
        let a = Tensor::iota(tessera_ir::DType::I32, shape.clone(), i);
        let b = Tensor::iota(tessera_ir::DType::I32, shape, j);
        let zero = term.t.zeros_like();
        let masked = Tensor::select(&a.eq(&b), &term.t, &zero);
        term.t = masked.sum_axes([j]);
        term.ix.remove(j);
    }
}

/// Sums out every index `needed` says no one else uses.
#[track_caller]
fn sum_out(term: Term, needed: impl Fn(char) -> bool) -> Term {
    let drop: Vec<usize> = (0..term.ix.len())
        .filter(|&d| !needed(term.ix[d]))
        .collect();
    if drop.is_empty() {
        return term;
    }
    Term {
        t: term.t.sum_axes(&drop),
        ix: term
            .ix
            .iter()
            .enumerate()
            .filter(|(d, _)| !drop.contains(d))
            .map(|(_, &c)| c)
            .collect(),
    }
}

/// The pair whose contraction result is smallest (then: fewest multiply-adds).
fn cheapest_pair(terms: &[Term], out: &[char], size_of: impl Fn(char) -> usize) -> (usize, usize) {
    let mut best = (0, 1);
    let mut best_cost = (u128::MAX, u128::MAX);
    for a in 0..terms.len() {
        for b in a + 1..terms.len() {
            let keep: Vec<char> = terms
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != a && k != b)
                .flat_map(|(_, t)| t.ix.clone())
                .chain(out.iter().copied())
                .collect();
            let mut all: Vec<char> = terms[a].ix.clone();
            all.extend(terms[b].ix.iter().filter(|c| !terms[a].ix.contains(c)));
            let result: u128 = all
                .iter()
                .filter(|c| keep.contains(c))
                .map(|&c| size_of(c) as u128)
                .product();
            let flops: u128 = all.iter().map(|&c| size_of(c) as u128).product();
            let cost = (result, flops.max(terms[a].size().max(terms[b].size())));
            if cost < best_cost {
                best_cost = cost;
                best = (a, b);
            }
        }
    }
    best
}

/// One pairwise contraction as a `dot_general`: shared indices that are still needed are
/// batch dims, shared ones that are not are contracted, the rest are free.
#[track_caller]
fn contract(a: Term, b: Term, keep: &[char]) -> Term {
    let shared: Vec<char> = a.ix.iter().copied().filter(|c| b.ix.contains(c)).collect();
    let (batch, contracted): (Vec<char>, Vec<char>) = shared.iter().partition(|c| keep.contains(c));
    let pos = |t: &Term, c: &char| t.ix.iter().position(|x| x == c).expect("index present");
    let dims = DotDims {
        lhs_batch: batch.iter().map(|c| pos(&a, c)).collect(),
        rhs_batch: batch.iter().map(|c| pos(&b, c)).collect(),
        lhs_contract: contracted.iter().map(|c| pos(&a, c)).collect(),
        rhs_contract: contracted.iter().map(|c| pos(&b, c)).collect(),
    };
    let mut ix = batch.clone();
    ix.extend(a.ix.iter().filter(|c| !shared.contains(c)));
    ix.extend(b.ix.iter().filter(|c| !shared.contains(c)));
    Term {
        t: a.t.dot_general(&b.t, dims),
        ix,
    }
}

impl Tensor {
    /// NumPy's `matmul` (`jnp.matmul`, `@`): rank-1 operands are promoted to a matrix and the
    /// added dim removed after; the leading (batch) dims broadcast against each other. An
    /// operand with no batch dims is not broadcast: the other's batch dims fold into its rows,
    /// so `[b, t, d] @ [d, e]` is one `[b*t, d] x [d, e]` product.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        let (l, r) = (self.rank(), rhs.rank());
        if l == 0 || r == 0 {
            fail(
                "matmul",
                format!(
                    "operands must have rank at least 1 (operands: {}, {}); use `*` to scale",
                    self.ty(),
                    rhs.ty()
                ),
            );
        }
        let joined = join(&[self, rhs]);
        let (a, b) = (&joined[0], &joined[1]);
        let (ka, kb) = (a.shape()[l - 1], b.shape()[if r == 1 { 0 } else { r - 2 }]);
        if ka != kb {
            fail(
                "matmul",
                format!(
                    "contracting dims differ: {ka} and {kb} (operands: {}, {})",
                    self.ty(),
                    rhs.ty()
                ),
            );
        }
        if l <= 2 && r <= 2 {
            // The plain cases are one dot_general, with no reshapes.
            return a.dot_general(
                b,
                DotDims {
                    lhs_contract: vec![l - 1],
                    rhs_contract: vec![0],
                    ..DotDims::default()
                },
            );
        }
        // Rank-1 operands: [k] as [1, k] on the left, [k] as [k, 1] on the right.
        let a2 = if l == 1 {
            a.reshape([1, a.shape()[0]])
        } else {
            a.clone()
        };
        let b2 = if r == 1 {
            b.reshape([b.shape()[0], 1])
        } else {
            b.clone()
        };
        let (la, lb) = (a2.rank(), b2.rank());
        let (m, k) = (a2.shape()[la - 2], a2.shape()[la - 1]);
        let n = b2.shape()[lb - 1];
        let a_batch = &a2.shape()[..la - 2];
        let b_batch = &b2.shape()[..lb - 2];
        let product = if b_batch.is_empty() {
            // Fold the lhs batch dims into its rows: one GEMM.
            let rows: usize = a_batch.iter().product::<usize>() * m;
            let flat = a2.reshape([rows, k]);
            let p = flat.dot_general(&b2, DotDims::matmul());
            let mut shape = a_batch.to_vec();
            shape.extend([m, n]);
            p.reshape(shape)
        } else {
            // Broadcast the batch dims to their common shape, then a batched dot_general.
            let nb = a_batch.len().max(b_batch.len());
            let dim = |s: &[usize], i: usize| {
                if i + s.len() >= nb {
                    s[i + s.len() - nb]
                } else {
                    1
                }
            };
            let mut batch = Vec::with_capacity(nb);
            for i in 0..nb {
                let (p, q) = (dim(a_batch, i), dim(b_batch, i));
                batch.push(match (p, q) {
                    (p, q) if p == q || q == 1 => p,
                    (1, q) => q,
                    _ => fail(
                        "matmul",
                        format!(
                            "batch dims {:?} and {:?} cannot broadcast together (operands: {}, {})",
                            a_batch,
                            b_batch,
                            self.ty(),
                            rhs.ty()
                        ),
                    ),
                });
            }
            let mut sa = batch.clone();
            sa.extend([m, k]);
            let mut sb = batch.clone();
            sb.extend([k, n]);
            let (ab, bb) = (a2.broadcast_to(&sa), b2.broadcast_to(&sb));
            ab.dot_general(
                &bb,
                DotDims {
                    lhs_batch: (0..nb).collect(),
                    rhs_batch: (0..nb).collect(),
                    lhs_contract: vec![nb + 1],
                    rhs_contract: vec![nb],
                },
            )
        };
        // Remove the dims added for rank-1 operands.
        let mut shape = product.shape().to_vec();
        let pr = shape.len();
        if r == 1 {
            shape.remove(pr - 1);
        }
        if l == 1 {
            shape.remove(pr - 2);
        }
        if shape.len() == product.rank() {
            product
        } else {
            product.reshape(shape)
        }
    }
}
