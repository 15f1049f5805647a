//! The windowed ops: `conv_general_dilated` (as `lax.conv_general_dilated`) and `reduce_window`
//! (as `lax.reduce_window` with a sum, max or min): their attributes, type rules and text.
//!
//! Both slide a window over the spatial dims of an operand that is first dilated (`lhs_dilation`
//! / `base_dilation`: `d - 1` holes between elements) and then padded (`lo`, `hi`; negative
//! crops). The window itself may be dilated (`rhs_dilation` / `window_dilation`). Along one
//! dim of size `n`, window `k`, stride `s`, padding `(lo, hi)`, dilations `(ld, wd)`:
//! `padded = dilate(n, ld) + lo + hi`, `window = dilate(k, wd)`, and the result has
//! `(padded - window) / s + 1` positions, or 0 when the window does not fit
//! (`dilate(n, d) = (n - 1) * d + 1`, 0 for `n = 0`).

use std::fmt::Write;

use crate::op::ReduceKind;
use crate::types::{DType, Shape, TensorType};

/// Dimension numbers and window attributes of `conv_general_dilated`.
///
/// `lhs_spec` lists the lhs dims as `[batch, feature, spatial...]`, `rhs_spec` the kernel's as
/// `[out_feature, in_feature, spatial...]`, `out_spec` the result's as `[batch, feature,
/// spatial...]` (JAX's `ConvDimensionNumbers`). The window attributes have one entry per
/// spatial dim, in spec order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvDims {
    pub lhs_spec: Vec<usize>,
    pub rhs_spec: Vec<usize>,
    pub out_spec: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<usize>,
    pub rhs_dilation: Vec<usize>,
    pub feature_group_count: usize,
    pub batch_group_count: usize,
    /// The kernel's spatial dims are read reversed (StableHLO's `window_reversal`, on every
    /// spatial dim): what the lhs gradient of a conv needs.
    pub window_reversal: bool,
}

impl ConvDims {
    /// `lax.conv`'s layout (NCHW lhs, OIHW kernel, NCHW result) with `spatial` spatial dims,
    /// unit strides and dilations, no padding, no groups.
    pub fn nchw(spatial: usize) -> ConvDims {
        let spec: Vec<usize> = (0..spatial + 2).collect();
        ConvDims {
            lhs_spec: spec.clone(),
            rhs_spec: spec.clone(),
            out_spec: spec,
            strides: vec![1; spatial],
            padding: vec![(0, 0); spatial],
            lhs_dilation: vec![1; spatial],
            rhs_dilation: vec![1; spatial],
            feature_group_count: 1,
            batch_group_count: 1,
            window_reversal: false,
        }
    }

    /// The number of spatial dims.
    pub fn spatial(&self) -> usize {
        self.strides.len()
    }
}

/// Window attributes of `reduce_window`, one entry per operand dim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WindowDims {
    pub window: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
    pub base_dilation: Vec<usize>,
    pub window_dilation: Vec<usize>,
}

impl WindowDims {
    /// A window of `window` with the given strides, no padding and no dilation.
    pub fn new(window: Vec<usize>, strides: Vec<usize>) -> WindowDims {
        let n = window.len();
        WindowDims {
            window,
            strides,
            padding: vec![(0, 0); n],
            base_dilation: vec![1; n],
            window_dilation: vec![1; n],
        }
    }
}

/// `(n - 1) * d + 1`, 0 for `n = 0`, in i128 (no overflow for usize inputs).
pub fn dilate(n: usize, d: usize) -> i128 {
    if n == 0 {
        0
    } else {
        (n as i128 - 1) * d as i128 + 1
    }
}

/// The number of window positions along one dim (see the module doc), or an error naming
/// the dim when the padding crops more than the dilated dim holds.
#[allow(clippy::too_many_arguments)]
pub fn window_positions(
    what: &str,
    dim: usize,
    n: usize,
    k: usize,
    stride: usize,
    (lo, hi): (i64, i64),
    base_dilation: usize,
    window_dilation: usize,
) -> Result<usize, String> {
    let padded = dilate(n, base_dilation) + lo as i128 + hi as i128;
    if padded < 0 {
        return Err(format!(
            "{what} dim {dim}: padding ({lo}, {hi}) crops more than its {n} elements \
             (dilated by {base_dilation})"
        ));
    }
    let w = dilate(k, window_dilation);
    if padded < w {
        return Ok(0);
    }
    let p = (padded - w) / stride as i128 + 1;
    usize::try_from(p).map_err(|_| format!("{what} dim {dim}: {p} window positions overflow"))
}

fn check_positive(what: &str, v: &[usize], n: usize) -> Result<(), String> {
    if v.len() != n {
        return Err(format!("{what} has {} entries for {n} dims", v.len()));
    }
    if let Some(i) = v.iter().position(|&x| x == 0) {
        return Err(format!("{what}[{i}] is 0 (must be at least 1)"));
    }
    Ok(())
}

fn check_perm(what: &str, spec: &[usize], rank: usize) -> Result<(), String> {
    if spec.len() != rank {
        return Err(format!(
            "{what} {spec:?} has {} entries for rank {rank}",
            spec.len()
        ));
    }
    let mut seen = vec![false; rank];
    for &d in spec {
        if d >= rank || std::mem::replace(&mut seen[d], true) {
            return Err(format!("{what} {spec:?} is not a permutation of 0..{rank}"));
        }
    }
    Ok(())
}

/// The type rule of `conv_general_dilated` (as XLA's `ShapeInference::InferConvolveShape`).
pub fn conv_type(cd: &ConvDims, l: &TensorType, r: &TensorType) -> Result<TensorType, String> {
    if l.dtype != r.dtype {
        return Err("lhs and rhs dtypes differ".into());
    }
    if !matches!(l.dtype, DType::F32 | DType::F64) {
        return Err(format!("conv of {} (f32 and f64 only)", l.dtype));
    }
    let s = cd.spatial();
    let rank = s + 2;
    if l.rank() != rank || r.rank() != rank {
        return Err(format!(
            "{s} spatial dims need lhs and rhs of rank {rank}, got {} and {}",
            l.rank(),
            r.rank()
        ));
    }
    check_perm("lhs_spec", &cd.lhs_spec, rank)?;
    check_perm("rhs_spec", &cd.rhs_spec, rank)?;
    check_perm("out_spec", &cd.out_spec, rank)?;
    check_positive("strides", &cd.strides, s)?;
    check_positive("lhs_dilation", &cd.lhs_dilation, s)?;
    check_positive("rhs_dilation", &cd.rhs_dilation, s)?;
    if cd.padding.len() != s {
        return Err(format!(
            "padding has {} entries for {s} spatial dims",
            cd.padding.len()
        ));
    }
    let (fg, bg) = (cd.feature_group_count, cd.batch_group_count);
    if fg == 0 || bg == 0 {
        return Err("feature_group_count and batch_group_count must be at least 1".into());
    }
    if fg > 1 && bg > 1 {
        return Err(format!(
            "feature_group_count {fg} and batch_group_count {bg} are both above 1"
        ));
    }
    let (ld, rd) = (l.dims(), r.dims());
    let (n, c) = (ld[cd.lhs_spec[0]], ld[cd.lhs_spec[1]]);
    let (o, i) = (rd[cd.rhs_spec[0]], rd[cd.rhs_spec[1]]);
    if c % fg != 0 || c / fg != i {
        return Err(format!(
            "lhs feature dim {c} is not feature_group_count {fg} times the rhs input feature \
             dim {i}"
        ));
    }
    if o % fg != 0 {
        return Err(format!(
            "rhs output feature dim {o} is not a multiple of feature_group_count {fg}"
        ));
    }
    if n % bg != 0 || o % bg != 0 {
        return Err(format!(
            "lhs batch dim {n} and rhs output feature dim {o} must be multiples of \
             batch_group_count {bg}"
        ));
    }
    let mut out = vec![0usize; rank];
    out[cd.out_spec[0]] = n / bg;
    out[cd.out_spec[1]] = o;
    for j in 0..s {
        let k = rd[cd.rhs_spec[2 + j]];
        if k == 0 {
            return Err(format!(
                "rhs spatial dim {j} (dim {}) is 0",
                cd.rhs_spec[2 + j]
            ));
        }
        out[cd.out_spec[2 + j]] = window_positions(
            "spatial",
            j,
            ld[cd.lhs_spec[2 + j]],
            k,
            cd.strides[j],
            cd.padding[j],
            cd.lhs_dilation[j],
            cd.rhs_dilation[j],
        )?;
    }
    Ok(TensorType::new(l.dtype, Shape::new(out)))
}

/// The type rule of `reduce_window`.
pub fn reduce_window_type(wd: &WindowDims, x: &TensorType) -> Result<TensorType, String> {
    if x.dtype == DType::Bool {
        return Err("reduce_window of bool".into());
    }
    let n = x.rank();
    check_positive("window", &wd.window, n)?;
    check_positive("strides", &wd.strides, n)?;
    check_positive("base_dilation", &wd.base_dilation, n)?;
    check_positive("window_dilation", &wd.window_dilation, n)?;
    if wd.padding.len() != n {
        return Err(format!(
            "padding has {} entries for rank {n}",
            wd.padding.len()
        ));
    }
    let mut out = Vec::with_capacity(n);
    for d in 0..n {
        out.push(window_positions(
            "operand",
            d,
            x.dims()[d],
            wd.window[d],
            wd.strides[d],
            wd.padding[d],
            wd.base_dilation[d],
            wd.window_dilation[d],
        )?);
    }
    Ok(TensorType::new(x.dtype, Shape::new(out)))
}

fn list(v: &[usize]) -> String {
    let s: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", s.join(","))
}

fn pads(p: &[(i64, i64)]) -> String {
    let s: Vec<String> = p.iter().map(|(l, h)| format!("[{l},{h}]")).collect();
    format!("[{}]", s.join(","))
}

/// `conv_general_dilated`'s attributes in the text format (see `docs/ir.md`): the specs, and
/// every window attribute that is not the default.
pub fn conv_attrs(cd: &ConvDims) -> String {
    let s = cd.spatial();
    let mut t = format!(
        "lhs_spec={} rhs_spec={} out_spec={} strides={} padding={}",
        list(&cd.lhs_spec),
        list(&cd.rhs_spec),
        list(&cd.out_spec),
        list(&cd.strides),
        pads(&cd.padding)
    );
    if cd.lhs_dilation != vec![1; s] {
        write!(t, " lhs_dilation={}", list(&cd.lhs_dilation)).unwrap();
    }
    if cd.rhs_dilation != vec![1; s] {
        write!(t, " rhs_dilation={}", list(&cd.rhs_dilation)).unwrap();
    }
    if cd.feature_group_count != 1 {
        write!(t, " feature_group_count={}", cd.feature_group_count).unwrap();
    }
    if cd.batch_group_count != 1 {
        write!(t, " batch_group_count={}", cd.batch_group_count).unwrap();
    }
    if cd.window_reversal {
        t.push_str(" window_reversal=1");
    }
    t
}

/// `reduce_window`'s attributes in the text format.
pub fn window_attrs(wd: &WindowDims) -> String {
    let n = wd.window.len();
    let mut t = format!("window={} strides={}", list(&wd.window), list(&wd.strides));
    if wd.padding != vec![(0, 0); n] {
        write!(t, " padding={}", pads(&wd.padding)).unwrap();
    }
    if wd.base_dilation != vec![1; n] {
        write!(t, " base_dilation={}", list(&wd.base_dilation)).unwrap();
    }
    if wd.window_dilation != vec![1; n] {
        write!(t, " window_dilation={}", list(&wd.window_dilation)).unwrap();
    }
    t
}

/// The mnemonic of `reduce_window` with `kind`.
pub fn reduce_window_name(kind: ReduceKind) -> &'static str {
    match kind {
        ReduceKind::Sum => "reduce_window_sum",
        ReduceKind::Max => "reduce_window_max",
        ReduceKind::Min => "reduce_window_min",
    }
}
