//! `gather` and `scatter`: XLA's dimension numbers (StableHLO's `GatherDimensionNumbers` and
//! `ScatterDimensionNumbers`, with the batching dims), their type rules, and the index maps
//! both backends evaluate them with.
//!
//! Out-of-bounds start indices follow JAX's modes (`lax.GatherScatterMode`): `clip` clamps each
//! start index into `0..=dim - slice_size`; `fill` (JAX's `FILL_OR_DROP`) makes a gather slice
//! whose start is out of bounds all `fill`, and drops a scatter update window whose start is out
//! of bounds. Indices are signed (`i32`) or unsigned (`u32`); every index value is handled in
//! `i64`, so `i32::MIN`, `i32::MAX` and `u32::MAX` are just out of bounds.
//!
//! Scatter applies the update elements in row-major order of `updates`, each combined into the
//! current operand element: with `set`, the last write in that order wins (XLA on CPU, what JAX
//! gives there); repeated indices combine with `add`, `mul`, `min` and `max`.

use crate::types::{DType, TensorType};

/// What an out-of-bounds start index does (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexMode {
    Clip,
    /// Gather: fill the slice; scatter: drop the window.
    Fill,
}

impl IndexMode {
    pub fn name(self, scatter: bool) -> &'static str {
        match (self, scatter) {
            (IndexMode::Clip, _) => "clip",
            (IndexMode::Fill, false) => "fill",
            (IndexMode::Fill, true) => "drop",
        }
    }
}

/// How a scatter combines an update with the operand element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterKind {
    Set,
    Add,
    Mul,
    Min,
    Max,
}

impl ScatterKind {
    pub const ALL: [ScatterKind; 5] = [
        ScatterKind::Set,
        ScatterKind::Add,
        ScatterKind::Mul,
        ScatterKind::Min,
        ScatterKind::Max,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScatterKind::Set => "set",
            ScatterKind::Add => "add",
            ScatterKind::Mul => "mul",
            ScatterKind::Min => "min",
            ScatterKind::Max => "max",
        }
    }

    pub fn from_name(s: &str) -> Option<ScatterKind> {
        ScatterKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// `gather operand, indices`: StableHLO's gather dimension numbers, the slice sizes and the
/// out-of-bounds mode. `fill` is the value of a filled slice (mode `fill`), as a `f64` the
/// operand's dtype converts exactly (JAX's default: NaN, the least signed or the largest
/// unsigned integer, `true`).
#[derive(Clone, Debug)]
pub struct GatherDims {
    pub offset_dims: Vec<usize>,
    pub collapsed_slice_dims: Vec<usize>,
    pub start_index_map: Vec<usize>,
    pub operand_batching_dims: Vec<usize>,
    pub start_indices_batching_dims: Vec<usize>,
    pub index_vector_dim: usize,
    pub slice_sizes: Vec<usize>,
    pub mode: IndexMode,
    pub fill: f64,
}

/// Equal dims with the same fill bits (so a NaN fill equals itself).
impl PartialEq for GatherDims {
    fn eq(&self, o: &GatherDims) -> bool {
        self.offset_dims == o.offset_dims
            && self.collapsed_slice_dims == o.collapsed_slice_dims
            && self.start_index_map == o.start_index_map
            && self.operand_batching_dims == o.operand_batching_dims
            && self.start_indices_batching_dims == o.start_indices_batching_dims
            && self.index_vector_dim == o.index_vector_dim
            && self.slice_sizes == o.slice_sizes
            && self.mode == o.mode
            && self.fill.to_bits() == o.fill.to_bits()
    }
}

/// `scatter operand, indices, updates`: StableHLO's scatter dimension numbers, the combiner
/// and the out-of-bounds mode (`Fill` drops).
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterDims {
    pub kind: ScatterKind,
    pub update_window_dims: Vec<usize>,
    pub inserted_window_dims: Vec<usize>,
    pub scatter_dims_to_operand_dims: Vec<usize>,
    pub input_batching_dims: Vec<usize>,
    pub scatter_indices_batching_dims: Vec<usize>,
    pub index_vector_dim: usize,
    pub mode: IndexMode,
}

/// JAX's default fill of a `fill`-mode gather of `dtype`.
pub fn default_fill(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::NAN,
        DType::I32 => f64::from(i32::MIN),
        DType::I64 => i64::MIN as f64,
        DType::U32 => f64::from(u32::MAX),
        DType::Bool => 1.0,
    }
}

fn check_dims(list: &[usize], rank: usize, what: &str) -> Result<(), String> {
    for (i, &d) in list.iter().enumerate() {
        if d >= rank {
            return Err(format!(
                "{what} {list:?}: {d} is out of range for rank {rank}"
            ));
        }
        if list[..i].contains(&d) {
            return Err(format!("{what} {list:?} names {d} twice"));
        }
    }
    Ok(())
}

fn check_sorted(list: &[usize], what: &str) -> Result<(), String> {
    if list.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("{what} {list:?} must be strictly increasing"));
    }
    Ok(())
}

fn check_disjoint(a: &[usize], b: &[usize], what: &str) -> Result<(), String> {
    match a.iter().find(|d| b.contains(d)) {
        Some(d) => Err(format!("{what}: dim {d} is in both")),
        None => Ok(()),
    }
}

/// The checks common to gather and scatter on the indices side: returns the length of the index
/// vector and the batch dims of `indices` (every dim but `index_vector_dim`).
fn index_side(
    indices: &TensorType,
    index_vector_dim: usize,
    to_operand: &[usize],
    operand: &TensorType,
    operand_batching: &[usize],
    indices_batching: &[usize],
) -> Result<Vec<usize>, String> {
    if !indices.dtype.is_int() {
        return Err(format!(
            "indices must be i32, u32 or i64, got {}",
            indices.dtype
        ));
    }
    let r = indices.rank();
    if index_vector_dim > r {
        return Err(format!(
            "index_vector_dim {index_vector_dim} is out of range for indices of rank {r}"
        ));
    }
    let nvec = if index_vector_dim == r {
        1
    } else {
        indices.dims()[index_vector_dim]
    };
    if nvec != to_operand.len() {
        return Err(format!(
            "the index vector has {nvec} entries but {} operand dims are indexed",
            to_operand.len()
        ));
    }
    check_dims(to_operand, operand.rank(), "the indexed operand dims")?;
    check_dims(
        operand_batching,
        operand.rank(),
        "the operand batching dims",
    )?;
    check_dims(indices_batching, r, "the indices batching dims")?;
    check_disjoint(
        to_operand,
        operand_batching,
        "indexed and batching operand dims",
    )?;
    if indices_batching.contains(&index_vector_dim) {
        return Err("index_vector_dim cannot be a batching dim".into());
    }
    if operand_batching.len() != indices_batching.len() {
        return Err(format!(
            "{} operand batching dims but {} indices batching dims",
            operand_batching.len(),
            indices_batching.len()
        ));
    }
    for (&o, &i) in operand_batching.iter().zip(indices_batching) {
        if operand.dims()[o] != indices.dims()[i] {
            return Err(format!(
                "batching dim {o} of the operand (size {}) and {i} of the indices (size {}) differ",
                operand.dims()[o],
                indices.dims()[i]
            ));
        }
    }
    Ok((0..r).filter(|&d| d != index_vector_dim).collect())
}

impl GatherDims {
    /// The type rule.
    pub fn infer(&self, operand: &TensorType, indices: &TensorType) -> Result<TensorType, String> {
        let rank = operand.rank();
        let batch = index_side(
            indices,
            self.index_vector_dim,
            &self.start_index_map,
            operand,
            &self.operand_batching_dims,
            &self.start_indices_batching_dims,
        )?;
        if self.slice_sizes.len() != rank {
            return Err(format!(
                "slice_sizes {:?} needs {rank} entries",
                self.slice_sizes
            ));
        }
        for (d, (&s, &n)) in self.slice_sizes.iter().zip(operand.dims()).enumerate() {
            if s > n {
                return Err(format!(
                    "slice size {s} of dim {d} is larger than the dim ({n})"
                ));
            }
        }
        check_dims(&self.collapsed_slice_dims, rank, "collapsed_slice_dims")?;
        check_disjoint(
            &self.collapsed_slice_dims,
            &self.operand_batching_dims,
            "collapsed and batching dims",
        )?;
        for &d in self
            .collapsed_slice_dims
            .iter()
            .chain(&self.operand_batching_dims)
        {
            let want = if self.collapsed_slice_dims.contains(&d) {
                1..=1
            } else {
                0..=1
            };
            if !want.contains(&self.slice_sizes[d]) {
                return Err(format!(
                    "collapsed dim {d} needs a slice size of 1 and a batching dim one of at \
                     most 1, got {}",
                    self.slice_sizes[d]
                ));
            }
        }
        let window: Vec<usize> = (0..rank)
            .filter(|d| {
                !self.collapsed_slice_dims.contains(d) && !self.operand_batching_dims.contains(d)
            })
            .collect();
        let out_rank = batch.len() + self.offset_dims.len();
        check_dims(&self.offset_dims, out_rank, "offset_dims")?;
        check_sorted(&self.offset_dims, "offset_dims")?;
        if self.offset_dims.len() != window.len() {
            return Err(format!(
                "offset_dims {:?} needs one entry per operand dim that is neither collapsed nor \
                 batching ({})",
                self.offset_dims,
                window.len()
            ));
        }
        let (mut b, mut w) = (batch.iter(), window.iter());
        let dims: Vec<usize> = (0..out_rank)
            .map(|i| {
                if self.offset_dims.contains(&i) {
                    self.slice_sizes[*w.next().expect("one window dim per offset dim")]
                } else {
                    indices.dims()[*b.next().expect("one batch dim per other dim")]
                }
            })
            .collect();
        if !self.fill.is_nan() && !operand.dtype.is_float() {
            let ok = match operand.dtype {
                DType::I32 => {
                    self.fill == self.fill.trunc() && i32::try_from(self.fill as i64).is_ok()
                }
                DType::U32 => {
                    self.fill == self.fill.trunc() && u32::try_from(self.fill as i64).is_ok()
                }
                // Exactly -2^63 ..= 2^63 - 1024: the f64 values an i64 holds.
                DType::I64 => {
                    self.fill == self.fill.trunc()
                        && self.fill >= i64::MIN as f64
                        && self.fill < -(i64::MIN as f64)
                }
                DType::Bool => self.fill == 0.0 || self.fill == 1.0,
                DType::F32 | DType::F64 | DType::F16 | DType::BF16 => true,
            };
            if !ok {
                return Err(format!(
                    "fill {} is not a {} value",
                    self.fill, operand.dtype
                ));
            }
        } else if self.fill.is_nan() && !operand.dtype.is_float() {
            return Err(format!("fill NaN is not a {} value", operand.dtype));
        }
        Ok(TensorType::new(operand.dtype, dims))
    }

    /// The operand index that result element `out` reads, or `None` where it is the fill.
    /// `index(flat)` reads element `flat` (row-major) of the indices as an `i64`.
    pub fn source(
        &self,
        operand_dims: &[usize],
        indices_dims: &[usize],
        index: &dyn Fn(usize) -> i64,
        out: &[usize],
    ) -> Option<Vec<usize>> {
        let ir = indices_dims.len();
        // The batch coordinates, in the order of the indices' dims (without index_vector_dim).
        let batch: Vec<usize> = (0..out.len())
            .filter(|i| !self.offset_dims.contains(i))
            .map(|i| out[i])
            .collect();
        let mut at = vec![0usize; ir];
        let mut k = 0;
        for (d, slot) in at.iter_mut().enumerate() {
            if d != self.index_vector_dim {
                *slot = batch[k];
                k += 1;
            }
        }
        let strides = row_major(indices_dims);
        let mut src = vec![0usize; operand_dims.len()];
        for (j, &d) in self.start_index_map.iter().enumerate() {
            if self.index_vector_dim < ir {
                at[self.index_vector_dim] = j;
            }
            let flat: usize = at.iter().zip(&strides).map(|(a, s)| a * s).sum();
            let start = index(flat);
            // Negative only for a scatter window wider than its operand dim (an inserted dim of
            // size 0): nothing lands anywhere then.
            let hi = operand_dims[d] as i64 - self.slice_sizes[d] as i64;
            if hi < 0 {
                return None;
            }
            src[d] = match self.mode {
                IndexMode::Clip => start.clamp(0, hi) as usize,
                IndexMode::Fill if (0..=hi).contains(&start) => start as usize,
                IndexMode::Fill => return None,
            };
        }
        for (&o, &i) in self
            .operand_batching_dims
            .iter()
            .zip(&self.start_indices_batching_dims)
        {
            src[o] = at[i];
        }
        let mut w = self.offset_dims.iter();
        for (d, s) in src.iter_mut().enumerate() {
            if !self.collapsed_slice_dims.contains(&d) && !self.operand_batching_dims.contains(&d) {
                *s += out[*w.next().expect("one offset dim per window dim")];
            }
        }
        Some(src)
    }
}

impl ScatterDims {
    /// The type rule: the result has the operand's type.
    pub fn infer(
        &self,
        operand: &TensorType,
        indices: &TensorType,
        updates: &TensorType,
    ) -> Result<TensorType, String> {
        let rank = operand.rank();
        let batch = index_side(
            indices,
            self.index_vector_dim,
            &self.scatter_dims_to_operand_dims,
            operand,
            &self.input_batching_dims,
            &self.scatter_indices_batching_dims,
        )?;
        if updates.dtype != operand.dtype {
            return Err(format!(
                "updates are {} but the operand is {}",
                updates.dtype, operand.dtype
            ));
        }
        if operand.dtype == DType::Bool && matches!(self.kind, ScatterKind::Add | ScatterKind::Mul)
        {
            return Err(format!("scatter {} of bool", self.kind.name()));
        }
        check_dims(&self.inserted_window_dims, rank, "inserted_window_dims")?;
        check_disjoint(
            &self.inserted_window_dims,
            &self.input_batching_dims,
            "inserted and batching dims",
        )?;
        let window: Vec<usize> = (0..rank)
            .filter(|d| {
                !self.inserted_window_dims.contains(d) && !self.input_batching_dims.contains(d)
            })
            .collect();
        let urank = batch.len() + self.update_window_dims.len();
        if updates.rank() != urank {
            return Err(format!(
                "updates need rank {urank} ({} scatter dims and {} window dims), got {}",
                batch.len(),
                self.update_window_dims.len(),
                updates.rank()
            ));
        }
        check_dims(&self.update_window_dims, urank, "update_window_dims")?;
        check_sorted(&self.update_window_dims, "update_window_dims")?;
        if self.update_window_dims.len() != window.len() {
            return Err(format!(
                "update_window_dims {:?} needs one entry per operand dim that is neither \
                 inserted nor batching ({})",
                self.update_window_dims,
                window.len()
            ));
        }
        let (mut b, mut w) = (batch.iter(), window.iter());
        for i in 0..urank {
            let n = updates.dims()[i];
            if self.update_window_dims.contains(&i) {
                let d = *w.next().expect("one window dim per update window dim");
                if n > operand.dims()[d] {
                    return Err(format!(
                        "update window dim {i} (size {n}) is larger than operand dim {d} ({})",
                        operand.dims()[d]
                    ));
                }
            } else {
                let d = *b.next().expect("one batch dim per scatter dim");
                if n != indices.dims()[d] {
                    return Err(format!(
                        "update scatter dim {i} (size {n}) differs from indices dim {d} ({})",
                        indices.dims()[d]
                    ));
                }
            }
        }
        Ok(operand.clone())
    }

    /// The window size along each operand dim, for updates of dims `updates_dims`.
    pub fn window_sizes(&self, operand_rank: usize, updates_dims: &[usize]) -> Vec<usize> {
        let mut w = self.update_window_dims.iter();
        (0..operand_rank)
            .map(|d| {
                if self.inserted_window_dims.contains(&d) || self.input_batching_dims.contains(&d) {
                    1
                } else {
                    updates_dims[*w.next().expect("one update window dim per window dim")]
                }
            })
            .collect()
    }

    /// The operand index update element `upd` lands on, or `None` where it is dropped.
    /// `window` is [`ScatterDims::window_sizes`].
    pub fn target(
        &self,
        operand_dims: &[usize],
        indices_dims: &[usize],
        window: &[usize],
        index: &dyn Fn(usize) -> i64,
        upd: &[usize],
    ) -> Option<Vec<usize>> {
        // A window wider than its operand dim (an inserted dim of size 0 no index names) lands
        // nowhere, as XLA skips an out-of-bounds window.
        if window.iter().zip(operand_dims).any(|(w, n)| w > n) {
            return None;
        }
        // The same map as a gather whose result is the updates.
        let g = GatherDims {
            offset_dims: self.update_window_dims.clone(),
            collapsed_slice_dims: self.inserted_window_dims.clone(),
            start_index_map: self.scatter_dims_to_operand_dims.clone(),
            operand_batching_dims: self.input_batching_dims.clone(),
            start_indices_batching_dims: self.scatter_indices_batching_dims.clone(),
            index_vector_dim: self.index_vector_dim,
            slice_sizes: window.to_vec(),
            mode: self.mode,
            fill: 0.0,
        };
        g.source(operand_dims, indices_dims, index, upd)
    }

    /// The gather that reads, for every update element, the operand element it lands on (the
    /// updates' cotangent of a scatter; `fill` 0 where the scatter drops).
    pub fn as_gather(&self, operand_rank: usize, updates_dims: &[usize]) -> GatherDims {
        GatherDims {
            offset_dims: self.update_window_dims.clone(),
            collapsed_slice_dims: self.inserted_window_dims.clone(),
            start_index_map: self.scatter_dims_to_operand_dims.clone(),
            operand_batching_dims: self.input_batching_dims.clone(),
            start_indices_batching_dims: self.scatter_indices_batching_dims.clone(),
            index_vector_dim: self.index_vector_dim,
            slice_sizes: self.window_sizes(operand_rank, updates_dims),
            mode: self.mode,
            fill: 0.0,
        }
    }
}

impl GatherDims {
    /// The scatter that adds, for every result element, into the operand element it reads (a
    /// gather's transpose; a filled slice's elements are dropped).
    pub fn as_scatter(&self, kind: ScatterKind) -> ScatterDims {
        ScatterDims {
            kind,
            update_window_dims: self.offset_dims.clone(),
            inserted_window_dims: self.collapsed_slice_dims.clone(),
            scatter_dims_to_operand_dims: self.start_index_map.clone(),
            input_batching_dims: self.operand_batching_dims.clone(),
            scatter_indices_batching_dims: self.start_indices_batching_dims.clone(),
            index_vector_dim: self.index_vector_dim,
            mode: self.mode,
        }
    }
}

fn row_major(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The attributes of `gather` in the text format (`docs/ir.md`).
pub const GATHER_ATTRS: &[&str] = &[
    "offset_dims",
    "collapsed",
    "start_index_map",
    "batching",
    "index_vector_dim",
    "slice_sizes",
    "mode",
    "fill",
];

/// The attributes of `scatter` in the text format (`docs/ir.md`).
pub const SCATTER_ATTRS: &[&str] = &[
    "window_dims",
    "inserted",
    "to_operand",
    "batching",
    "index_vector_dim",
    "mode",
];

fn list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// `gather`'s attributes as printed.
pub fn gather_attrs_text(d: &GatherDims) -> String {
    let mut s = format!(
        "offset_dims={} collapsed={} start_index_map={} ",
        list(&d.offset_dims),
        list(&d.collapsed_slice_dims),
        list(&d.start_index_map)
    );
    if !d.operand_batching_dims.is_empty() {
        s += &format!(
            "batching={}x{} ",
            list(&d.operand_batching_dims),
            list(&d.start_indices_batching_dims)
        );
    }
    s += &format!(
        "index_vector_dim={} slice_sizes={} mode={}",
        d.index_vector_dim,
        list(&d.slice_sizes),
        d.mode.name(false)
    );
    if d.mode == IndexMode::Fill {
        s += &format!(" fill={}", d.fill);
    }
    s
}

/// `scatter`'s attributes as printed: the combiner word first.
pub fn scatter_attrs_text(d: &ScatterDims) -> String {
    let mut s = format!(
        "{} window_dims={} inserted={} to_operand={} ",
        d.kind.name(),
        list(&d.update_window_dims),
        list(&d.inserted_window_dims),
        list(&d.scatter_dims_to_operand_dims)
    );
    if !d.input_batching_dims.is_empty() {
        s += &format!(
            "batching={}x{} ",
            list(&d.input_batching_dims),
            list(&d.scatter_indices_batching_dims)
        );
    }
    s += &format!(
        "index_vector_dim={} mode={}",
        d.index_vector_dim,
        d.mode.name(true)
    );
    s
}

/// The corpus samples of `gather` and `scatter` (`corpus.rs`): the op and its parameter types.
pub fn corpus_samples() -> Vec<(String, crate::op::Op, Vec<TensorType>)> {
    use crate::op::Op;
    let t = |d: DType, dims: &[usize]| TensorType::new(d, dims.to_vec());
    let rows = |mode: IndexMode, fill: f64| GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        index_vector_dim: 1,
        slice_sizes: vec![1, 4],
        mode,
        fill,
    };
    let mut out = Vec::new();
    for d in DType::ALL {
        out.push((
            format!("gather.{d}"),
            Op::Gather(Box::new(rows(IndexMode::Clip, 0.0))),
            vec![t(d, &[5, 4]), t(DType::I32, &[3, 1])],
        ));
        out.push((
            format!("gather_fill.{d}"),
            Op::Gather(Box::new(rows(IndexMode::Fill, default_fill(d)))),
            vec![t(d, &[5, 4]), t(DType::U32, &[3, 1])],
        ));
        for kind in ScatterKind::ALL {
            if d == DType::Bool && matches!(kind, ScatterKind::Add | ScatterKind::Mul) {
                continue;
            }
            for (mode, it) in [(IndexMode::Fill, DType::I32), (IndexMode::Clip, DType::U32)] {
                out.push((
                    format!("scatter_{}_{}.{d}", kind.name(), mode.name(true)),
                    Op::Scatter(Box::new(rows(mode, 0.0).as_scatter(kind))),
                    vec![t(d, &[5, 4]), t(it, &[6, 1]), t(d, &[6, 4])],
                ));
            }
        }
    }
    // A point gather with a two-entry index vector in dim 0, and a partial window.
    out.push((
        "gather_points.f32".into(),
        Op::Gather(Box::new(GatherDims {
            offset_dims: vec![1],
            collapsed_slice_dims: vec![0],
            start_index_map: vec![0, 1],
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            index_vector_dim: 0,
            slice_sizes: vec![1, 2],
            mode: IndexMode::Clip,
            fill: 0.0,
        })),
        vec![t(DType::F32, &[4, 5]), t(DType::I32, &[2, 3])],
    ));
    // Batching dims: one row of each batch member (what vmap of a gather makes).
    let batched = GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![1],
        start_index_map: vec![1],
        operand_batching_dims: vec![0],
        start_indices_batching_dims: vec![0],
        index_vector_dim: 2,
        slice_sizes: vec![1, 1, 3],
        mode: IndexMode::Fill,
        fill: f64::NAN,
    };
    out.push((
        "scatter_batched.f32".into(),
        Op::Scatter(Box::new(batched.as_scatter(ScatterKind::Add))),
        vec![
            t(DType::F32, &[2, 5, 3]),
            t(DType::I32, &[2, 4, 1]),
            t(DType::F32, &[2, 4, 3]),
        ],
    ));
    out.push((
        "gather_batched.f32".into(),
        Op::Gather(Box::new(batched)),
        vec![t(DType::F32, &[2, 5, 3]), t(DType::I32, &[2, 4, 1])],
    ));
    // i64 indices (the corpus draws some near i64::MAX): the compiled gather clamps or fills
    // them in 64 bits, as the interpreter does.
    for (mode, fill) in [(IndexMode::Clip, 0.0), (IndexMode::Fill, f64::NAN)] {
        out.push((
            format!("gather_i64_{}.f32", mode.name(false)),
            Op::Gather(Box::new(rows(mode, fill))),
            vec![t(DType::F32, &[5, 4]), t(DType::I64, &[3, 1])],
        ));
    }
    // Zero-size index sets and operands.
    out.push((
        "gather_no_indices.f32".into(),
        Op::Gather(Box::new(rows(IndexMode::Clip, 0.0))),
        vec![t(DType::F32, &[5, 4]), t(DType::I32, &[0, 1])],
    ));
    let mut empty_rows = rows(IndexMode::Fill, f64::NAN);
    empty_rows.slice_sizes = vec![1, 0];
    out.push((
        "gather_empty_rows.f32".into(),
        Op::Gather(Box::new(empty_rows)),
        vec![t(DType::F32, &[3, 0]), t(DType::I32, &[2, 1])],
    ));
    out.push((
        "scatter_no_updates.f32".into(),
        Op::Scatter(Box::new(
            rows(IndexMode::Fill, 0.0).as_scatter(ScatterKind::Add),
        )),
        vec![
            t(DType::F32, &[5, 4]),
            t(DType::I32, &[0, 1]),
            t(DType::F32, &[0, 4]),
        ],
    ));
    // An inserted dim of size 0 that no index names: every window is out of bounds, so the
    // result is the (empty) operand; compiled code must not touch the 0-byte buffer.
    out.push((
        "scatter_unnamed_empty_dim.f32".into(),
        Op::Scatter(Box::new(ScatterDims {
            kind: ScatterKind::Add,
            update_window_dims: vec![1],
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![],
            input_batching_dims: vec![],
            scatter_indices_batching_dims: vec![],
            index_vector_dim: 1,
            mode: IndexMode::Fill,
        })),
        vec![
            t(DType::F32, &[0, 4]),
            t(DType::I32, &[3, 0]),
            t(DType::F32, &[3, 4]),
        ],
    ));
    out.push((
        "scatter_into_empty.f32".into(),
        Op::Scatter(Box::new(
            rows(IndexMode::Clip, 0.0).as_scatter(ScatterKind::Set),
        )),
        vec![
            t(DType::F32, &[0, 4]),
            t(DType::I32, &[2, 1]),
            t(DType::F32, &[2, 4]),
        ],
    ));
    out
}
