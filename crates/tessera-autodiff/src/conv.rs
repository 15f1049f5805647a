//! Derivatives of the windowed ops.
//!
//! `conv_general_dilated` is bilinear. Its VJP w.r.t. the lhs is a conv of the cotangent with
//! the spatially reversed kernel (in and out features swapped, groups moved into the kernel's
//! output features), and w.r.t. the rhs a conv of the lhs with the cotangent (feature groups
//! become batch groups and back): JAX's `_conv_general_dilated_transpose_lhs` / `_rhs`, with
//! the reversal written as the conv's `window_reversal`. Its JVP is `conv(tl, r) + conv(l, tr)`.
//!
//! `reduce_window` is written through its window positions: with `P` the dilated, padded
//! operand, window position `k` sees the strided slice `P[k * wd :: stride]` (result-shaped).
//! A sum's VJP scatters the cotangent back through every such slice (a pad with interior
//! padding, the slice's transpose) and un-pads the total. A max's (min's) VJP gives each
//! result's cotangent to the first window position, in row-major window order, whose element
//! equals the result (XLA's `select_and_scatter` with `ge` picks the same one); a NaN result
//! passes no gradient. The JVPs read the tangent through the same slices and masks.

use tessera_ir::{
    BinaryOp, CompareOp, ConvDims, NodeId, Op, ReduceKind, Shape, UnaryOp, WindowDims,
};

use super::{At, AutodiffError, Builder, Result};

/// `lax._reshape_axis_into`: dim `src` merged into dim `dst` (numbered without `src`) as its
/// major part.
fn axis_into(b: &mut Builder, src: usize, dst: usize, x: NodeId) -> Result<NodeId> {
    let ty = b.ty(x);
    let mut perm: Vec<usize> = (0..ty.rank()).filter(|&d| d != src).collect();
    perm.insert(dst, src);
    let t = b.transpose(x, perm)?;
    let mut dims: Vec<usize> = ty.dims().to_vec();
    let s = dims.remove(src);
    dims[dst] *= s;
    b.reshape(t, &Shape::new(dims))
}

/// `lax._reshape_axis_out_of`: dim `src` split into `[size1, rest]`.
fn axis_out_of(b: &mut Builder, src: usize, size1: usize, x: NodeId) -> Result<NodeId> {
    let mut dims = b.ty(x).dims().to_vec();
    let rest = dims[src] / size1.max(1);
    dims[src] = rest;
    dims.insert(src, size1);
    b.reshape(x, &Shape::new(dims))
}

fn conv(b: &mut Builder, cd: ConvDims, l: NodeId, r: NodeId) -> Result<NodeId> {
    b.add(Op::Conv(Box::new(cd)), &[l, r])
}

fn swap01(spec: &[usize]) -> Vec<usize> {
    let mut s = spec.to_vec();
    s.swap(0, 1);
    s
}

/// A dilated size, exactly (sizes and factors up to `usize::MAX` do not overflow `i128`).
fn dil(n: usize, d: usize) -> i128 {
    tessera_ir::conv::dilate(n, d)
}

/// A padding of a transposed conv or pad, or an error when it does not fit the IR's `i64`
/// (windows, strides or dilations near 2^63: no gradient program can hold them).
fn fit(op: &str, x: i128) -> Result<i64> {
    i64::try_from(x).map_err(|_| AutodiffError::NotDifferentiable {
        op: op.into(),
        why: format!(": its gradient needs a padding of {x}, past the IR's 64-bit range"),
    })
}

/// The VJP of `y = conv(l, r)`.
pub(super) fn conv_vjp(b: &mut Builder, cd: &ConvDims, at: &At) -> Result<Vec<Option<NodeId>>> {
    let (l, r, g) = (at.xs[0], at.xs[1], at.g);
    let (lt, rt, gt) = (b.ty(l), b.ty(r), b.ty(g));
    let s = cd.spatial();
    let lsp: Vec<usize> = (0..s).map(|j| lt.dims()[cd.lhs_spec[2 + j]]).collect();
    let rsp: Vec<usize> = (0..s).map(|j| rt.dims()[cd.rhs_spec[2 + j]]).collect();
    let gsp: Vec<usize> = (0..s).map(|j| gt.dims()[cd.out_spec[2 + j]]).collect();
    let (fg, bg) = (cd.feature_group_count, cd.batch_group_count);
    let ct_l = at.want(b, 0, |b| {
        let mut w = r;
        let mut groups = fg;
        if fg > 1 || bg > 1 {
            let n = fg.max(bg);
            w = axis_out_of(b, cd.rhs_spec[0], n, w)?;
            w = axis_into(b, cd.rhs_spec[0], cd.rhs_spec[1], w)?;
            groups = n;
        }
        let padding = (0..s)
            .map(|j| {
                let ld = dil(lsp[j], cd.lhs_dilation[j]);
                let rd = dil(rsp[j], cd.rhs_dilation[j]);
                let od = dil(gsp[j], cd.strides[j]);
                let before = rd - cd.padding[j].0 as i128 - 1;
                Ok((
                    fit("conv", before)?,
                    fit("conv", ld + rd - 1 - od - before)?,
                ))
            })
            .collect::<Result<_>>()?;
        let t = ConvDims {
            lhs_spec: cd.out_spec.clone(),
            rhs_spec: swap01(&cd.rhs_spec),
            out_spec: cd.lhs_spec.clone(),
            strides: cd.lhs_dilation.clone(),
            padding,
            lhs_dilation: cd.strides.clone(),
            rhs_dilation: cd.rhs_dilation.clone(),
            feature_group_count: groups,
            batch_group_count: 1,
            window_reversal: !cd.window_reversal,
        };
        let mut out = conv(b, t, g, w)?;
        if bg > 1 {
            out = axis_out_of(b, cd.lhs_spec[1], bg, out)?;
            out = axis_into(b, cd.lhs_spec[1], cd.lhs_spec[0], out)?;
        }
        Ok(out)
    })?;
    let ct_r = at.want(b, 1, |b| {
        if gt.numel() == 0 {
            return b.full_like(r, 0.0);
        }
        let (nfg, nbg) = if bg > 1 { (bg, 1) } else { (1, fg) };
        let padding = (0..s)
            .map(|j| {
                let ld = dil(lsp[j], cd.lhs_dilation[j]);
                let rd = dil(rsp[j], cd.rhs_dilation[j]);
                let od = dil(gsp[j], cd.strides[j]);
                let lo = cd.padding[j].0;
                Ok((lo, fit("conv", od - ld + rd - lo as i128 - 1)?))
            })
            .collect::<Result<_>>()?;
        let t = ConvDims {
            lhs_spec: swap01(&cd.lhs_spec),
            rhs_spec: swap01(&cd.out_spec),
            out_spec: swap01(&cd.rhs_spec),
            strides: cd.rhs_dilation.clone(),
            padding,
            lhs_dilation: cd.lhs_dilation.clone(),
            rhs_dilation: cd.strides.clone(),
            feature_group_count: nfg,
            batch_group_count: nbg,
            window_reversal: false,
        };
        let out = conv(b, t, l, g)?;
        if cd.window_reversal {
            reverse_spatial(b, out, &cd.rhs_spec[2..])
        } else {
            Ok(out)
        }
    })?;
    Ok(vec![ct_l, ct_r])
}

/// `x` reversed along `dims`, as a conv-free gather of slices: a reversal is a
/// concatenation of the dim's elements in reverse order.
fn reverse_spatial(b: &mut Builder, mut x: NodeId, dims: &[usize]) -> Result<NodeId> {
    for &d in dims {
        let ty = b.ty(x);
        let n = ty.dims()[d];
        if n <= 1 {
            continue;
        }
        let parts = (0..n)
            .rev()
            .map(|i| {
                let mut start = vec![0; ty.rank()];
                let mut limit = ty.dims().to_vec();
                start[d] = i;
                limit[d] = i + 1;
                b.add(
                    Op::Slice {
                        start,
                        limit,
                        stride: vec![1; ty.rank()],
                    },
                    &[x],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        x = b.add(Op::Concatenate { dim: d }, &parts)?;
    }
    Ok(x)
}

/// The JVP of `y = conv(l, r)`: `conv(tl, r) + conv(l, tr)`.
pub(super) fn conv_jvp(
    b: &mut Builder,
    cd: &ConvDims,
    xs: &[NodeId],
    ts: &[Option<NodeId>],
) -> Result<Option<NodeId>> {
    let op = Op::Conv(Box::new(cd.clone()));
    let a = ts[0].map(|t| b.add(op.clone(), &[t, xs[1]])).transpose()?;
    let c = ts[1].map(|t| b.add(op.clone(), &[xs[0], t])).transpose()?;
    Ok(match (a, c) {
        (Some(a), Some(c)) => Some(b.bin(BinaryOp::Add, a, c)?),
        (a, None) => a,
        (None, c) => c,
    })
}

/// One window position's view of `P`: a strided slice.
struct Patch {
    start: Vec<usize>,
    limit: Vec<usize>,
    stride: Vec<usize>,
}

/// The dims of `P` (the dilated, padded operand) for an operand of `dims`.
fn padded_dims(win: &WindowDims, dims: &[usize]) -> Result<Vec<usize>> {
    (0..dims.len())
        .map(|d| {
            let n = dil(dims[d], win.base_dilation[d])
                + win.padding[d].0 as i128
                + win.padding[d].1 as i128;
            usize::try_from(n.max(0)).map_err(|_| AutodiffError::NotDifferentiable {
                op: "reduce_window".into(),
                why: format!(": its gradient needs a padded operand of {n} elements along a dim"),
            })
        })
        .collect()
}

/// The most window positions a reduce_window gradient unrolls (a 1024x1024 global pool).
const MAX_WINDOW_POSITIONS: usize = 1 << 20;

/// Every window position's slice of `P`, in row-major window order; an error past
/// `MAX_WINDOW_POSITIONS`.
fn patches(win: &WindowDims, out: &[usize]) -> Result<Vec<Patch>> {
    let nk = win
        .window
        .iter()
        .try_fold(1usize, |n, &w| n.checked_mul(w))
        .filter(|&n| n <= MAX_WINDOW_POSITIONS)
        .ok_or_else(|| AutodiffError::NotDifferentiable {
            op: "reduce_window".into(),
            why: format!(
                ": its gradient takes one slice per window position, and a window of {:?} has \
                 more than {MAX_WINDOW_POSITIONS}",
                win.window
            ),
        })?;
    Ok((0..nk)
        .map(|kf| {
            let k = tessera_interp_free_unravel(kf, &win.window);
            // Saturated past usize::MAX: the slice's type rule then refuses the bounds.
            let start: Vec<usize> = (0..out.len())
                .map(|d| k[d].saturating_mul(win.window_dilation[d]))
                .collect();
            let limit: Vec<usize> = (0..out.len())
                .map(|d| {
                    if out[d] == 0 {
                        start[d]
                    } else {
                        start[d]
                            .saturating_add((out[d] - 1).saturating_mul(win.strides[d]))
                            .saturating_add(1)
                    }
                })
                .collect();
            Patch {
                start,
                limit,
                stride: win.strides.clone(),
            }
        })
        .collect())
}

fn tessera_interp_free_unravel(mut f: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        if dims[d] > 0 {
            idx[d] = f % dims[d];
            f /= dims[d];
        }
    }
    idx
}

/// Whether `padded` and `unpad` are the identity: no padding and no base dilation.
fn unpadded(win: &WindowDims) -> bool {
    win.padding.iter().all(|&(lo, hi)| lo == 0 && hi == 0)
        && win.base_dilation.iter().all(|&d| d == 1)
}

/// `P`: `x` dilated and padded with `value` (`x` itself when that is the identity).
fn padded(b: &mut Builder, win: &WindowDims, x: NodeId, value: f64) -> Result<NodeId> {
    if unpadded(win) {
        return Ok(x);
    }
    let dtype = b.ty(x).dtype;
    let v = b.add(
        Op::Constant(tessera_ir::Literal::splat(
            &tessera_ir::TensorType::scalar(dtype),
            value,
        )),
        &[],
    )?;
    b.add(
        Op::Pad {
            low: win.padding.iter().map(|p| p.0).collect(),
            high: win.padding.iter().map(|p| p.1).collect(),
            interior: win.base_dilation.iter().map(|d| d - 1).collect(),
        },
        &[x, v],
    )
}

fn slice(b: &mut Builder, p: &Patch, x: NodeId) -> Result<NodeId> {
    b.add(
        Op::Slice {
            start: p.start.clone(),
            limit: p.limit.clone(),
            stride: p.stride.clone(),
        },
        &[x],
    )
}

/// The transpose of `slice(p, .)` into `P`'s dims: `g` placed at the slice's elements.
fn unslice(b: &mut Builder, p: &Patch, pdims: &[usize], g: NodeId) -> Result<NodeId> {
    let gt = b.ty(g);
    let zero = b.zero_scalar(gt.dtype)?;
    let high = (0..pdims.len())
        .map(|d| {
            let n = gt.dims()[d] as i128;
            let high = pdims[d] as i128
                - p.start[d] as i128
                - (n + (n - 1).max(0) * (p.stride[d] as i128 - 1));
            fit("reduce_window", high)
        })
        .collect::<Result<_>>()?;
    b.add(
        Op::Pad {
            low: p
                .start
                .iter()
                .map(|&s| fit("reduce_window", s as i128))
                .collect::<Result<_>>()?,
            high,
            interior: p.stride.iter().map(|s| s - 1).collect(),
        },
        &[g, zero],
    )
}

/// The transpose of `padded`: the operand's elements of a `P`-shaped cotangent.
fn unpad(b: &mut Builder, win: &WindowDims, x_dims: &[usize], gp: NodeId) -> Result<NodeId> {
    if unpadded(win) {
        return Ok(gp);
    }
    let dtype = b.ty(gp).dtype;
    let zero = b.zero_scalar(dtype)?;
    let r = x_dims.len();
    let u = b.add(
        Op::Pad {
            low: win.padding.iter().map(|p| -p.0).collect(),
            high: win.padding.iter().map(|p| -p.1).collect(),
            interior: vec![0; r],
        },
        &[gp, zero],
    )?;
    let ut = b.ty(u);
    b.add(
        Op::Slice {
            start: vec![0; r],
            limit: ut.dims().to_vec(),
            stride: win.base_dilation.clone(),
        },
        &[u],
    )
}

/// For a max or min: each window position's slice and whether it is the first in its window
/// to equal the result.
fn first_hits(
    b: &mut Builder,
    kind: ReduceKind,
    win: &WindowDims,
    x: NodeId,
    y: NodeId,
) -> Result<Vec<(Patch, NodeId)>> {
    let init = match kind {
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
        ReduceKind::Sum => 0.0,
    };
    let p = padded(b, win, x, init)?;
    let out = b.ty(y).dims().to_vec();
    let mut seen: Option<NodeId> = None;
    let mut hits = Vec::new();
    for patch in patches(win, &out)? {
        let xk = slice(b, &patch, p)?;
        let eq = b.cmp(CompareOp::Eq, xk, y)?;
        let first = match seen {
            None => eq,
            Some(s) => {
                let not_seen = b.un(UnaryOp::Not, s)?;
                b.bin(BinaryOp::And, eq, not_seen)?
            }
        };
        seen = Some(match seen {
            None => eq,
            Some(s) => b.bin(BinaryOp::Or, s, eq)?,
        });
        hits.push((patch, first));
    }
    Ok(hits)
}

/// The VJP of `y = reduce_window(x)`.
pub(super) fn reduce_window_vjp(
    b: &mut Builder,
    kind: ReduceKind,
    win: &WindowDims,
    at: &At,
) -> Result<Vec<Option<NodeId>>> {
    let (x, y, g) = (at.xs[0], at.y, at.g);
    let xt = b.ty(x);
    if !xt.dtype.is_float() {
        return Ok(vec![]);
    }
    let out = b.ty(y).dims().to_vec();
    if tiles(win, &out) {
        return Ok(vec![Some(tiled_vjp(b, kind, win, x, y, g)?)]);
    }
    let pdims = padded_dims(win, xt.dims())?;
    // Each window position's share is a pad of the whole padded operand: past
    // `MAX_VJP_ELEMENTS` in all, an error naming the op, not memory the machine lacks (a
    // window of 100,000 over 3 elements wanted 7.8 GB).
    let positions = win.window.iter().try_fold(1usize, |n, &w| n.checked_mul(w));
    let padded = pdims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let work = positions.zip(padded).and_then(|(a, b)| a.checked_mul(b));
    if work.is_none_or(|w| w > MAX_VJP_ELEMENTS) {
        return Err(AutodiffError::NotDifferentiable {
            op: "reduce_window".into(),
            why: format!(
                ": its gradient over overlapping windows takes one pass over the padded \
                 operand {pdims:?} per window position ({:?}), more than {MAX_VJP_ELEMENTS} \
                 elements in all",
                win.window
            ),
        });
    }
    let mut total: Option<NodeId> = None;
    let parts: Vec<(Patch, NodeId)> = match kind {
        ReduceKind::Sum => patches(win, &out)?.into_iter().map(|p| (p, g)).collect(),
        ReduceKind::Max | ReduceKind::Min => {
            let zeros = b.full_like(g, 0.0)?;
            first_hits(b, kind, win, x, y)?
                .into_iter()
                .map(|(p, hit)| Ok((p, b.select(hit, g, zeros)?)))
                .collect::<Result<_>>()?
        }
    };
    for (p, gk) in parts {
        let s = unslice(b, &p, &pdims, gk)?;
        total = Some(match total {
            None => s,
            Some(t) => b.bin(BinaryOp::Add, t, s)?,
        });
    }
    let gp = match total {
        Some(t) => t,
        None => {
            let z = b.zero_scalar(xt.dtype)?;
            b.add(
                Op::BroadcastInDim {
                    shape: Shape::new(pdims.clone()),
                    dims: vec![],
                },
                &[z],
            )?
        }
    };
    Ok(vec![Some(unpad(b, win, xt.dims(), gp)?)])
}

/// Whether the windows tile the operand: no padding or dilation, and along each dim the
/// stride equal to the window or one window only (a global pool with any stride), so every
/// operand element is in at most one window. `out`: the result's dims.
fn tiles(win: &WindowDims, out: &[usize]) -> bool {
    unpadded(win)
        && win.window_dilation.iter().all(|&d| d == 1)
        && (0..out.len()).all(|d| win.strides[d] == win.window[d] || out[d] <= 1)
}

/// The most elements the gradient of an overlapping `reduce_window` builds (window positions
/// times the padded operand's elements): 2^28, a GiB of f32.
const MAX_VJP_ELEMENTS: usize = 1 << 28;

/// The VJP of a tiling `reduce_window` (`tiles`; a dim of one window may have any stride),
/// written over the operand's elements in
/// one pass each, whatever the window: with `o` the result's dims and `w` the window's, the
/// covered part of `x` is viewed as `E = [o0, w0, o1, w1, ..]` (a dim's `w` only when it is
/// longer than 1), where each element is one window position of one window.
/// - A sum's cotangent is `g` broadcast over `E`.
/// - A max's (min's) is `g` where the position `k` (row-major in the window) is the first
///   whose element equals the result, 0 elsewhere: the first is the minimum over the window
///   of `k` where the element equals the result, else the window's size (a NaN result, or
///   none equal), a reduction. This selects what `first_hits` does, position by position,
///   but in two kernels over the operand's elements where that takes a pass per window
///   position and a copy to assemble them.
///
/// The result is reshaped to the covered dims and zero-padded at the high end of each dim
/// the windows do not reach.
fn tiled_vjp(
    b: &mut Builder,
    kind: ReduceKind,
    win: &WindowDims,
    x: NodeId,
    y: NodeId,
    g: NodeId,
) -> Result<NodeId> {
    let xt = b.ty(x);
    let out = b.ty(y).dims().to_vec();
    let r = out.len();
    if out.contains(&0) {
        // No window fits (a window may then be as long as the type allows).
        return b.full_like(x, 0.0);
    }
    // At most the operand's dims: a window fits in each.
    let covered: Vec<usize> = (0..r).map(|d| out[d] * win.window[d]).collect();
    // E's dims, where each result dim lands in it, and the window dims in it with the size
    // of a step of each (row-major over the window).
    let (mut e, mut at_out, mut at_win) = (Vec::new(), Vec::new(), Vec::new());
    let mut step = 1usize;
    for d in (0..r).rev() {
        if win.window[d] > 1 {
            at_win.push((d, step));
            step = step.saturating_mul(win.window[d]);
        }
    }
    let positions = step;
    for (&o, &w) in out.iter().zip(&win.window) {
        at_out.push(e.len());
        e.push(o);
        if w > 1 {
            e.push(w);
        }
    }
    let e = Shape::new(e);
    let ge = b.broadcast(g, &e, at_out.clone())?;
    let gp = match kind {
        ReduceKind::Sum => ge,
        ReduceKind::Max | ReduceKind::Min => {
            // Positions as f32 while exact there (a window of up to 2^24), so the reduction
            // and the selection run on vectors; else as i64.
            let it = if positions <= 1 << 24 {
                tessera_ir::DType::F32
            } else {
                tessera_ir::DType::I64
            };
            let ity = tessera_ir::TensorType::new(it, e.dims().to_vec());
            let mut k: Option<NodeId> = None;
            for &(d, size) in &at_win {
                let dim = at_out[d] + 1;
                let i = b.add(
                    Op::Iota {
                        dim,
                        ty: ity.clone(),
                    },
                    &[],
                )?;
                let term = if size == 1 {
                    i
                } else {
                    let s = full_count(b, i, size)?;
                    b.mul(i, s)?
                };
                k = Some(match k {
                    None => term,
                    Some(k) => b.bin(BinaryOp::Add, k, term)?,
                });
            }
            let Some(k) = k else {
                // No window dim longer than 1: each result is its one element.
                let zeros = b.full_like(g, 0.0)?;
                let eq = b.cmp(CompareOp::Eq, x, y)?;
                let gp = b.select(eq, g, zeros)?;
                return pad_high(b, gp, xt.dims());
            };
            let xc = if covered == xt.dims() {
                x
            } else {
                b.add(
                    Op::Slice {
                        start: vec![0; r],
                        limit: covered.clone(),
                        stride: vec![1; r],
                    },
                    &[x],
                )?
            };
            let xe = b.reshape(xc, &e)?;
            let ye = b.broadcast(y, &e, at_out.clone())?;
            let eq = b.cmp(CompareOp::Eq, xe, ye)?;
            let none = full_count(b, k, positions)?;
            let hit_at = b.select(eq, k, none)?;
            let mut axes: Vec<usize> = at_win.iter().map(|&(d, _)| at_out[d] + 1).collect();
            axes.sort_unstable();
            let first = b.add(
                Op::Reduce {
                    kind: ReduceKind::Min,
                    axes,
                },
                &[hit_at],
            )?;
            let first = b.broadcast(first, &e, at_out.clone())?;
            let hit = b.cmp(CompareOp::Eq, k, first)?;
            let zeros = b.full_like(ge, 0.0)?;
            b.select(hit, ge, zeros)?
        }
    };
    let flat = b.reshape(gp, &Shape::new(covered))?;
    pad_high(b, flat, xt.dims())
}

/// A tensor shaped like `like` (f32 holding counts up to 2^24, or i64) filled with the count
/// `v`, exactly (an i64 constant is built from its integer, not through f64).
fn full_count(b: &mut Builder, like: NodeId, v: usize) -> Result<NodeId> {
    let ty = b.ty(like);
    if ty.dtype != tessera_ir::DType::I64 {
        return b.full_like(like, v as f64);
    }
    let v = i64::try_from(v).unwrap_or(i64::MAX);
    let lit = tessera_ir::Literal::new(Vec::<usize>::new(), tessera_ir::Data::I64(vec![v]))
        .ok_or_else(|| AutodiffError::Malformed("an i64 scalar literal".into()))?;
    let c = b.add(Op::Constant(lit), &[])?;
    b.broadcast(c, &ty.shape, vec![])
}

/// `v` zero-padded at the high end of each dim to `dims`.
fn pad_high(b: &mut Builder, v: NodeId, dims: &[usize]) -> Result<NodeId> {
    let have = b.ty(v).dims().to_vec();
    if have == dims {
        return Ok(v);
    }
    let zero = b.zero_scalar(b.ty(v).dtype)?;
    let high = (0..dims.len())
        .map(|d| fit("reduce_window", dims[d] as i128 - have[d] as i128))
        .collect::<Result<_>>()?;
    b.add(
        Op::Pad {
            low: vec![0; dims.len()],
            high,
            interior: vec![0; dims.len()],
        },
        &[v, zero],
    )
}

/// The JVP of `y = reduce_window(x)` with tangent `t`.
pub(super) fn reduce_window_jvp(
    b: &mut Builder,
    kind: ReduceKind,
    win: &WindowDims,
    x: NodeId,
    y: NodeId,
    t: NodeId,
) -> Result<Option<NodeId>> {
    if !b.ty(x).dtype.is_float() {
        return Ok(None);
    }
    match kind {
        ReduceKind::Sum => Ok(Some(b.add(
            Op::ReduceWindow {
                kind,
                win: Box::new(win.clone()),
            },
            &[t],
        )?)),
        ReduceKind::Max | ReduceKind::Min => {
            let tp = padded(b, win, t, 0.0)?;
            let zeros = b.full_like(y, 0.0)?;
            let mut total: Option<NodeId> = None;
            for (p, hit) in first_hits(b, kind, win, x, y)? {
                let tk = slice(b, &p, tp)?;
                let part = b.select(hit, tk, zeros)?;
                total = Some(match total {
                    None => part,
                    Some(a) => b.bin(BinaryOp::Add, a, part)?,
                });
            }
            Ok(Some(match total {
                Some(a) => a,
                None => zeros,
            }))
        }
    }
}
