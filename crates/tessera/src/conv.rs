//! Convolution and pooling on `Tensor`: `conv` (NCHW/OIHW, as `lax.conv`),
//! `conv_general_dilated` with a [`ConvOptions`] builder (any layout, strides, SAME/VALID/
//! explicit padding, dilations, groups), `reduce_window`, and the pools `max_pool`,
//! `sum_pool`, `avg_pool` over the spatial dims of an `(N, spatial..., C)` tensor (flax's
//! layout).
//!
//! Padding: `Padding::Same` pads so that each spatial dim has `ceil(n / stride)` positions, the
//! odd element of padding going to the high side; `Padding::Valid` pads nothing (JAX's
//! `padtype_to_pads`, with the dilated window). `max_pool` pads with -inf, `sum_pool` with 0,
//! and `avg_pool` divides each window's sum by the number of operand elements it covers
//! (padding not counted, as `jax.example_libraries.stax.AvgPool`).

use std::panic::Location;

use tessera_ir::{ConvDims, Op, ReduceKind, WindowDims};

use crate::error::{Error, loc_text, raise};
use crate::tensor::Tensor;
use crate::trace::apply;

#[track_caller]
fn fail(op: &str, message: String) -> ! {
    raise(Error::Op {
        op: op.into(),
        message,
        location: loc_text(Location::caller()),
    })
}

/// How a windowed op pads its operand's spatial dims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Padding {
    /// `ceil(n / stride)` positions per dim; an odd total pad puts the extra on the high side.
    Same,
    /// No padding.
    Valid,
    /// `(lo, hi)` per spatial dim; negative crops.
    Explicit(Vec<(i64, i64)>),
}

impl From<&str> for Padding {
    /// `"SAME"` or `"VALID"` (any case); anything else panics with the accepted values.
    #[track_caller]
    fn from(s: &str) -> Padding {
        match s.to_ascii_uppercase().as_str() {
            "SAME" => Padding::Same,
            "VALID" => Padding::Valid,
            _ => fail(
                "padding",
                format!("unknown padding \"{s}\": expected \"SAME\", \"VALID\" or explicit pairs"),
            ),
        }
    }
}

impl From<Vec<(i64, i64)>> for Padding {
    fn from(p: Vec<(i64, i64)>) -> Padding {
        Padding::Explicit(p)
    }
}

impl Padding {
    /// The explicit `(lo, hi)` pairs for operand dims `in_shape`, (dilated) windows `window`
    /// and `strides` (JAX's `padtype_to_pads`).
    pub fn pads(&self, in_shape: &[usize], window: &[usize], strides: &[usize]) -> Vec<(i64, i64)> {
        match self {
            Padding::Valid => vec![(0, 0); in_shape.len()],
            Padding::Explicit(p) => p.clone(),
            Padding::Same => in_shape
                .iter()
                .zip(window)
                .zip(strides)
                .map(|((&n, &w), &s)| {
                    let s = s.max(1) as i128;
                    let out = (n as i128 + s - 1) / s;
                    let total = ((out - 1).max(0) * s + w as i128 - n as i128).max(0);
                    let total = i64::try_from(total).unwrap_or(i64::MAX);
                    (total / 2, total - total / 2)
                })
                .collect(),
        }
    }
}

/// The options of [`Tensor::conv_general_dilated`]; the default is `lax.conv`'s: NCHW lhs,
/// OIHW kernel, NCHW result, unit strides and dilations, VALID padding, no groups.
///
/// ```
/// use tessera::prelude::*;
///
/// let x = Tensor::ones([1, 4, 4, 2]); // NHWC
/// let w = Tensor::ones([3, 3, 1, 4]); // HWIO, 2 feature groups of 1 input channel
/// let y = x.conv_general_dilated(&w, ConvOptions::new().layout("NHWC", "HWIO", "NHWC")
///     .strides([2, 2]).padding("SAME").feature_groups(2));
/// assert_eq!(y.shape(), &[1, 2, 2, 4]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConvOptions {
    /// Window strides, one per spatial dim (`None`: all 1).
    pub strides: Option<Vec<usize>>,
    /// The spatial padding (`None`: [`Padding::Valid`]).
    pub padding: Option<Padding>,
    /// Dilation of the lhs, one per spatial dim (`None`: all 1); above 1 it is a transposed
    /// convolution's input dilation.
    pub lhs_dilation: Option<Vec<usize>>,
    /// Dilation of the kernel, one per spatial dim (`None`: all 1; atrous convolution).
    pub rhs_dilation: Option<Vec<usize>>,
    /// `(lhs, rhs, out)` layout strings as JAX's (`"NCHW"`, `"OIHW"`, `"NHWC"`, `"HWIO"`,
    /// any letters for the spatial dims).
    pub layout: Option<(String, String, String)>,
    /// `feature_group_count` (0 is taken as 1): the lhs's channels split into this many
    /// groups, each convolved with its share of the kernel's output features.
    pub feature_group_count: usize,
    /// `batch_group_count` (0 is taken as 1): the lhs's batch split into this many groups.
    pub batch_group_count: usize,
}

impl ConvOptions {
    /// The defaults (as [`Default`]): `lax.conv`'s NCHW/OIHW layout, VALID, unit strides.
    pub fn new() -> ConvOptions {
        ConvOptions::default()
    }
    /// Sets the window strides, one per spatial dim.
    pub fn strides(mut self, s: impl Into<Vec<usize>>) -> Self {
        self.strides = Some(s.into());
        self
    }
    /// Sets the padding: `"SAME"`, `"VALID"` or explicit `(lo, hi)` pairs.
    pub fn padding(mut self, p: impl Into<Padding>) -> Self {
        self.padding = Some(p.into());
        self
    }
    /// Sets the lhs (input) dilation, one per spatial dim.
    pub fn lhs_dilation(mut self, d: impl Into<Vec<usize>>) -> Self {
        self.lhs_dilation = Some(d.into());
        self
    }
    /// Sets the kernel dilation, one per spatial dim.
    pub fn rhs_dilation(mut self, d: impl Into<Vec<usize>>) -> Self {
        self.rhs_dilation = Some(d.into());
        self
    }
    /// Sets the `(lhs, rhs, out)` layouts, JAX's `dimension_numbers` strings such as
    /// `("NHWC", "HWIO", "NHWC")`; a string of the wrong length or without its `N`/`C` (`O`/`I`
    /// for the kernel) letters makes the convolution panic.
    pub fn layout(mut self, lhs: &str, rhs: &str, out: &str) -> Self {
        self.layout = Some((lhs.into(), rhs.into(), out.into()));
        self
    }
    /// Sets `feature_group_count` (grouped and depthwise convolutions).
    pub fn feature_groups(mut self, n: usize) -> Self {
        self.feature_group_count = n;
        self
    }
    /// Sets `batch_group_count`.
    pub fn batch_groups(mut self, n: usize) -> Self {
        self.batch_group_count = n;
        self
    }
}

/// A layout string's dim spec: the positions of `first`, `second`, then the other letters in
/// order (JAX's `conv_general_permutations`).
#[track_caller]
fn spec(what: &str, s: &str, first: char, second: char, spatial_order: Option<&str>) -> Vec<usize> {
    let chars: Vec<char> = s.chars().collect();
    let pos = |c: char| chars.iter().position(|&x| x == c);
    let (Some(a), Some(b)) = (pos(first), pos(second)) else {
        fail(
            "conv_general_dilated",
            format!("{what} layout \"{s}\" must name '{first}' and '{second}'"),
        )
    };
    let mut v = vec![a, b];
    match spatial_order {
        // The kernel's and the result's spatial dims follow the lhs's letters.
        Some(order) => {
            for c in order.chars() {
                match pos(c) {
                    Some(p) => v.push(p),
                    None => fail(
                        "conv_general_dilated",
                        format!("{what} layout \"{s}\" has no spatial dim '{c}'"),
                    ),
                }
            }
        }
        None => v.extend((0..chars.len()).filter(|&i| i != a && i != b)),
    }
    v
}

impl Tensor {
    /// `lax.conv`: an NCHW lhs and an OIHW kernel give an NCHW result.
    #[track_caller]
    pub fn conv(&self, rhs: &Tensor, strides: &[usize], padding: impl Into<Padding>) -> Tensor {
        self.conv_general_dilated(
            rhs,
            ConvOptions::new()
                .strides(strides.to_vec())
                .padding(padding),
        )
    }

    /// `lax.conv_general_dilated` with the given options (see [`ConvOptions`]).
    #[track_caller]
    pub fn conv_general_dilated(&self, rhs: &Tensor, opts: ConvOptions) -> Tensor {
        let op = "conv_general_dilated";
        if self.rank() < 2 || self.rank() != rhs.rank() {
            fail(
                op,
                format!(
                    "lhs {:?} and rhs {:?} must have the same rank, at least 2",
                    self.shape(),
                    rhs.shape()
                ),
            );
        }
        let s = self.rank() - 2;
        let mut cd = ConvDims::nchw(s);
        if let Some((l, r, o)) = &opts.layout {
            if l.len() != s + 2 || r.len() != s + 2 || o.len() != s + 2 {
                fail(
                    op,
                    format!(
                        "layouts (\"{l}\", \"{r}\", \"{o}\") must have {} letters",
                        s + 2
                    ),
                );
            }
            cd.lhs_spec = spec("lhs", l, 'N', 'C', None);
            let spatial: String = cd.lhs_spec[2..]
                .iter()
                .map(|&i| l.chars().nth(i).unwrap_or('?'))
                .collect();
            cd.rhs_spec = spec("rhs", r, 'O', 'I', Some(&spatial));
            cd.out_spec = spec("out", o, 'N', 'C', Some(&spatial));
        }
        // A function, not a closure: a closure would report its own line, not the caller's.
        #[track_caller]
        fn defaulted(op: &str, s: usize, v: &Option<Vec<usize>>, what: &str) -> Vec<usize> {
            match v {
                Some(v) if v.len() != s => fail(
                    op,
                    format!("{what} {v:?} has {} entries for {s} spatial dims", v.len()),
                ),
                Some(v) => v.clone(),
                None => vec![1; s],
            }
        }
        cd.strides = defaulted(op, s, &opts.strides, "strides");
        cd.lhs_dilation = defaulted(op, s, &opts.lhs_dilation, "lhs_dilation");
        cd.rhs_dilation = defaulted(op, s, &opts.rhs_dilation, "rhs_dilation");
        cd.feature_group_count = opts.feature_group_count.max(1);
        cd.batch_group_count = opts.batch_group_count.max(1);
        let in_sp: Vec<usize> = (0..s).map(|j| self.shape()[cd.lhs_spec[2 + j]]).collect();
        let win: Vec<usize> = (0..s)
            .map(|j| {
                let k = rhs.shape()[cd.rhs_spec[2 + j]];
                if k == 0 {
                    0
                } else {
                    // Saturated: the type rule then reports the window as larger than any input.
                    (k - 1).saturating_mul(cd.rhs_dilation[j]).saturating_add(1)
                }
            })
            .collect();
        cd.padding = opts
            .padding
            .clone()
            .unwrap_or(Padding::Valid)
            .pads(&in_sp, &win, &cd.strides);
        apply(Op::Conv(Box::new(cd)), &[self, rhs])
    }

    /// `lax.reduce_window` with a sum, max or min: `window` and `strides` have one entry per
    /// dim; the padding holds the reduction's identity.
    #[track_caller]
    pub fn reduce_window(
        &self,
        kind: ReduceKind,
        window: &[usize],
        strides: &[usize],
        padding: impl Into<Padding>,
    ) -> Tensor {
        let padding = padding.into();
        if window.len() != self.rank() || strides.len() != self.rank() {
            fail(
                "reduce_window",
                format!(
                    "window {window:?} and strides {strides:?} need one entry per dim of {:?}",
                    self.shape()
                ),
            );
        }
        let mut win = WindowDims::new(window.to_vec(), strides.to_vec());
        win.padding = padding.pads(self.shape(), window, strides);
        apply(
            Op::ReduceWindow {
                kind,
                win: Box::new(win),
            },
            &[self],
        )
    }

    /// The window over the spatial dims of an `(N, spatial..., C)` tensor (flax's pools).
    #[track_caller]
    fn pool(
        &self,
        what: &str,
        kind: ReduceKind,
        window: &[usize],
        strides: &[usize],
        padding: Padding,
    ) -> Tensor {
        let s = self.rank().saturating_sub(2);
        if self.rank() < 2 || window.len() != s || strides.len() != s {
            fail(
                what,
                format!(
                    "window {window:?} and strides {strides:?} need one entry per spatial dim \
                     of the (N, spatial..., C) operand {:?}",
                    self.shape()
                ),
            );
        }
        let full = |v: &[usize]| -> Vec<usize> {
            let mut f = vec![1];
            f.extend_from_slice(v);
            f.push(1);
            f
        };
        let padding = match padding {
            Padding::Explicit(p) => {
                let mut f = vec![(0, 0)];
                f.extend(p);
                f.push((0, 0));
                Padding::Explicit(f)
            }
            other => other,
        };
        self.reduce_window(kind, &full(window), &full(strides), padding)
    }

    /// Max pooling over the spatial dims of an `(N, spatial..., C)` tensor; padding is -inf.
    #[track_caller]
    pub fn max_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: impl Into<Padding>,
    ) -> Tensor {
        self.pool("max_pool", ReduceKind::Max, window, strides, padding.into())
    }

    /// Sum pooling over the spatial dims of an `(N, spatial..., C)` tensor; padding is 0.
    #[track_caller]
    pub fn sum_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: impl Into<Padding>,
    ) -> Tensor {
        self.pool("sum_pool", ReduceKind::Sum, window, strides, padding.into())
    }

    /// Average pooling: each window's sum over the number of operand elements in it (padding
    /// not counted, as stax's `AvgPool`).
    #[track_caller]
    pub fn avg_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: impl Into<Padding>,
    ) -> Tensor {
        let padding = padding.into();
        let sums = self.sum_pool(window, strides, padding.clone());
        let ones = self.scalar_like(1.0).broadcast_to(self.shape());
        let counts = ones.sum_pool(window, strides, padding);
        sums.div(&counts)
    }
}
