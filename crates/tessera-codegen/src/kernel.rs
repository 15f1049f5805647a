//! The kernel IR: one loop nest computing one tensor. Fusion (`fusion.rs`) builds it from graph
//! nodes; lowering (`lower.rs`) turns it into a Cranelift function.
//!
//! A kernel iterates over its loop variables: first the result's dimensions, then (for a
//! reduction) the reduced ones. Its body is a scalar expression tree over the loop variables.
//! Every index a body computes is linear in the loop variables, except the division of a padded
//! coordinate and the starts of a `gather` (`Expr::Gather`: a coordinate read from data, clamped
//! into range), so the innermost loop can be vectorized when every load is an affine one,
//! contiguous or constant along it.

use std::fmt::Write;

use tessera_ir::{BinaryOp, CompareOp, DType, Op, ScatterKind, UnaryOp};

/// `sum_j coef[j] * var[j] + c` over the kernel's loop variables.
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct Lin {
    pub coef: Vec<i64>,
    pub c: i64,
}

impl Lin {
    pub fn zero(nvars: usize) -> Lin {
        Lin {
            coef: vec![0; nvars],
            c: 0,
        }
    }

    pub fn var(nvars: usize, j: usize) -> Lin {
        let mut l = Lin::zero(nvars);
        l.coef[j] = 1;
        l
    }

    pub fn scale(&self, k: i64) -> Lin {
        Lin {
            coef: self.coef.iter().map(|c| c * k).collect(),
            c: self.c * k,
        }
    }

    pub fn offset(&self, k: i64) -> Lin {
        Lin {
            coef: self.coef.clone(),
            c: self.c + k,
        }
    }

    pub fn add(&self, o: &Lin) -> Lin {
        Lin {
            coef: self.coef.iter().zip(&o.coef).map(|(a, b)| a + b).collect(),
            c: self.c + o.c,
        }
    }

    pub fn is_const(&self) -> bool {
        self.coef.iter().all(|&c| c == 0)
    }
}

/// One coordinate of a load: `lin / div`. With `extent`, the load is guarded: the coordinate is
/// clamped into `0..extent` so the access stays inside the buffer whatever the guard decides.
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct Coord {
    pub lin: Lin,
    pub div: i64,
    pub clamp: Option<i64>,
}

/// A data-dependent coordinate of a `Gather` expression: `index` (an integer expression, i32,
/// u32 or i64) is a start position along operand dim `dim`, valid in `0..=hi`.
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct Start {
    pub dim: usize,
    pub index: Box<Expr>,
    pub hi: i64,
}

/// A condition on the loop variables: `lin >= 0 && lin % div == 0 && lin / div < extent`.
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct Cond {
    pub lin: Lin,
    pub div: i64,
    pub extent: i64,
}

/// A scalar constant of some dtype.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    F(f64),
    I(i64),
    B(bool),
}

/// The same constant: floats by their bits, so `-0.0` is not `0.0` and a NaN is itself (kernels
/// that compare equal compute the same bits, and `lower::compile` shares their code).
impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        match (self, other) {
            (Scalar::F(a), Scalar::F(b)) => a.to_bits() == b.to_bits(),
            (Scalar::I(a), Scalar::I(b)) => a == b,
            (Scalar::B(a), Scalar::B(b)) => a == b,
            (Scalar::F(_) | Scalar::I(_) | Scalar::B(_), _) => false,
        }
    }
}

/// Hashed as compared: floats by their bits.
impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self {
            Scalar::F(x) => (0u8, x.to_bits()).hash(h),
            Scalar::I(x) => (1u8, x).hash(h),
            Scalar::B(x) => (2u8, x).hash(h),
        }
    }
}

/// A scalar expression of the loop variables.
#[derive(Clone, Debug, PartialEq, Hash)]
pub enum Expr {
    /// Element `sum_d strides[d] * coord_d` of buffer `buf`.
    Load {
        buf: usize,
        dtype: DType,
        strides: Vec<i64>,
        coords: Vec<Coord>,
    },
    Const(DType, Scalar),
    /// The value of a linear index (`iota`), converted to `dtype`.
    Index(DType, Lin),
    Unary(UnaryOp, DType, Box<Expr>),
    Binary(BinaryOp, DType, Box<Expr>, Box<Expr>),
    /// Compares two values of the given dtype; the result is bool.
    Compare(CompareOp, DType, Box<Expr>, Box<Expr>),
    Select(DType, Box<Expr>, Box<Expr>, Box<Expr>),
    Convert {
        from: DType,
        to: DType,
        x: Box<Expr>,
    },
    Bitcast {
        from: DType,
        to: DType,
        x: Box<Expr>,
    },
    /// Gather's load: element `sum_d strides[d] * (coord_d + start_d)` of buffer `buf`, where
    /// `start_d` is the value of the `Start` naming dim `d` (0 for dims no start names). Each
    /// start is clamped into `0..=hi`, so the address stays inside the buffer whatever the index
    /// holds; with `fill`, an element whose start was out of range is `fill` instead.
    Gather {
        buf: usize,
        dtype: DType,
        strides: Vec<i64>,
        coords: Vec<Coord>,
        starts: Vec<Start>,
        fill: Option<Box<Expr>>,
    },
    /// `then` where every condition holds, else `otherwise` (pad and concatenate).
    Guard {
        dtype: DType,
        conds: Vec<Cond>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
    },
}

impl Expr {
    pub fn dtype(&self) -> DType {
        match self {
            Expr::Load { dtype, .. }
            | Expr::Gather { dtype, .. }
            | Expr::Const(dtype, _)
            | Expr::Index(dtype, _)
            | Expr::Unary(_, dtype, _)
            | Expr::Binary(_, dtype, _, _)
            | Expr::Select(dtype, ..)
            | Expr::Guard { dtype, .. } => *dtype,
            Expr::Compare(..) => DType::Bool,
            Expr::Convert { to, .. } | Expr::Bitcast { to, .. } => *to,
        }
    }

    /// Visits this expression and every subexpression, parents before children and operands
    /// left to right. An explicit stack, not recursion: a tree of any depth is walked on a
    /// small stack (fusion bounds kernel depth, `fusion::MAX_FUSED_DEPTH`, but the kernel IR
    /// does not rely on it here).
    pub fn walk(&self, f: &mut impl FnMut(&Expr)) {
        let mut stack: Vec<&Expr> = vec![self];
        while let Some(e) = stack.pop() {
            f(e);
            // Children pushed last first, so the first operand is visited next.
            match e {
                Expr::Load { .. } | Expr::Const(..) | Expr::Index(..) => {}
                Expr::Unary(_, _, x) | Expr::Convert { x, .. } | Expr::Bitcast { x, .. } => {
                    stack.push(x)
                }
                Expr::Binary(_, _, a, b) | Expr::Compare(_, _, a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
                Expr::Select(_, p, a, b) => {
                    stack.push(b);
                    stack.push(a);
                    stack.push(p);
                }
                Expr::Guard {
                    then, otherwise, ..
                } => {
                    stack.push(otherwise);
                    stack.push(then);
                }
                Expr::Gather { starts, fill, .. } => {
                    if let Some(f) = fill {
                        stack.push(f);
                    }
                    for s in starts.iter().rev() {
                        stack.push(&s.index);
                    }
                }
            }
        }
    }

    /// The number of nodes on the longest path from this expression to a leaf.
    pub fn depth(&self) -> usize {
        let mut deepest = 0;
        let mut stack: Vec<(&Expr, usize)> = vec![(self, 1)];
        while let Some((e, d)) = stack.pop() {
            deepest = deepest.max(d);
            match e {
                Expr::Load { .. } | Expr::Const(..) | Expr::Index(..) => {}
                Expr::Unary(_, _, x) | Expr::Convert { x, .. } | Expr::Bitcast { x, .. } => {
                    stack.push((x, d + 1))
                }
                Expr::Binary(_, _, a, b) | Expr::Compare(_, _, a, b) => {
                    stack.push((a, d + 1));
                    stack.push((b, d + 1));
                }
                Expr::Select(_, p, a, b) => {
                    stack.push((p, d + 1));
                    stack.push((a, d + 1));
                    stack.push((b, d + 1));
                }
                Expr::Guard {
                    then, otherwise, ..
                } => {
                    stack.push((then, d + 1));
                    stack.push((otherwise, d + 1));
                }
                Expr::Gather { starts, fill, .. } => {
                    for s in starts {
                        stack.push((&s.index, d + 1));
                    }
                    if let Some(f) = fill {
                        stack.push((f, d + 1));
                    }
                }
            }
        }
        deepest
    }
}

/// How a kernel combines the values of its reduced loop variables.
#[derive(Clone, Copy, Debug, PartialEq, Hash)]
pub enum Combine {
    Sum,
    Max,
    Min,
    /// Index (i32) of the first maximum over the single reduced variable; NaN is the maximum.
    ArgMax,
}

/// What makes a kernel a `scatter`'s (`Kernel::scatter`): the output is first a copy of input
/// slot `operand` (of dims `dims`), then the loop nest runs over the updates, in row-major
/// order (so repeated indices combine in the interpreter's order), and combines each update
/// (the body) into the output element at `coords + starts`, the gather map of the updates
/// (`ScatterDims::target`). Each start is clamped into `0..=hi`, so every write is inside the
/// output; with `drop`, an update whose start is out of range is skipped instead of clamped.
#[derive(Clone, Debug, PartialEq, Hash)]
pub struct ScatterPhase {
    pub kind: ScatterKind,
    pub dims: Vec<usize>,
    pub operand: usize,
    pub coords: Vec<Coord>,
    pub starts: Vec<Start>,
    pub drop: bool,
}

/// What makes a kernel a cumulative op's (`Kernel::scan`): the loop over result dim `axis`
/// runs in order (from the end with `reverse`), and each element is the running `op` of the
/// body's values along it, combined one after another as the interpreter does.
#[derive(Clone, Copy, Debug, PartialEq, Hash)]
pub struct Scan {
    pub op: BinaryOp,
    pub axis: usize,
    pub reverse: bool,
}

/// One loop nest writing buffer `n_inputs` (the output) from buffers `0..n_inputs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub out_dtype: DType,
    /// Extents of the result's loop variables (row-major: the last is innermost).
    pub out_dims: Vec<usize>,
    /// Extents of the reduced loop variables, and how they combine.
    pub reduce: Option<(Combine, Vec<usize>)>,
    pub body: Expr,
    pub n_inputs: usize,
    /// A scatter kernel: `out_dims` are the updates' dims and `body` an update's value.
    pub scatter: Option<Box<ScatterPhase>>,
    pub scan: Option<Scan>,
}

/// What an inline polynomial function weighs in `Kernel::code_weight` (tanh is ~100
/// instructions on f32x4).
pub const INLINE_FUNCTION_WEIGHT: usize = 16;

impl Kernel {
    /// Whether `self` and `other` are the same loop nest over their buffers (the names aside,
    /// and a flat kernel's length, the range it is called with): one compiled function serves
    /// both.
    pub fn same_code(&self, other: &Kernel) -> bool {
        let Kernel {
            name: _,
            out_dtype,
            out_dims,
            reduce,
            body,
            n_inputs,
            scatter,
            scan,
        } = self;
        *out_dtype == other.out_dtype
            // A flat kernel's length is the range it is called with, not part of its code.
            && (if self.is_flat() {
                other.is_flat()
            } else {
                *out_dims == other.out_dims
            })
            && *reduce == other.reduce
            && *n_inputs == other.n_inputs
            && *body == other.body
            && *scatter == other.scatter
            && *scan == other.scan
    }

    /// Whether `self` is one elementwise loop (a result of rank 1, no reduction, scatter or
    /// scan): its only loop runs over the range the call passes (`lower.rs`), so its code does
    /// not depend on the result's length, and `same_code` leaves the length out.
    pub fn is_flat(&self) -> bool {
        self.out_dims.len() == 1
            && self.reduce.is_none()
            && self.scatter.is_none()
            && self.scan.is_none()
    }

    /// `self` as one loop over its result's elements (`is_flat`), when it is elementwise and
    /// reads each buffer at the result's own row-major element (plus a constant) or at one
    /// constant element: the nest over `out_dims` then visits the same elements and addresses,
    /// in the same order, as one loop over their count. Lowered, that loop runs on f32x4 over
    /// the whole range where the body vectorizes (`lower::vectorizable`), where the nest ran
    /// each row apart (a `[256, 1]` result was 256 scalar iterations), and its code serves
    /// every length: the seed step's four parameter updates, of four shapes, are one
    /// function. A body heavier than an inline function (`INLINE_FUNCTION_WEIGHT`) over rows
    /// of 8 or more keeps its nest, whose inner loop of known length emits only the steps
    /// that run (`Lower::vector_loop_of`: the one loop emits all three, twice the code for
    /// rows of 32). `None` otherwise: a rank below 2, a reduction, scatter or scan, a load
    /// along some dims only (a broadcast, a transpose), a coordinate divided or clamped, a
    /// guard, a gather, an index that overflows i64.
    pub fn flattened(&self) -> Option<Kernel> {
        if self.out_dims.len() < 2
            || (self.out_dims.last().is_some_and(|&w| w >= 8)
                && self.code_weight() > INLINE_FUNCTION_WEIGHT)
            || self.reduce.is_some()
            || self.scatter.is_some()
            || self.scan.is_some()
        {
            return None;
        }
        let mut row_major = vec![1i64; self.out_dims.len()];
        for i in (0..self.out_dims.len().saturating_sub(1)).rev() {
            row_major[i] =
                row_major[i + 1].checked_mul(i64::try_from(self.out_dims[i + 1]).ok()?)?;
        }
        let numel = self
            .out_dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))?;
        Some(Kernel {
            out_dims: vec![numel],
            body: flat_expr(&self.body, &row_major)?,
            ..self.clone()
        })
    }

    /// A hash of what `same_code` compares (kernels that are the same code hash the same;
    /// a flat kernel's length left out). Every field's `Hash` agrees with its `PartialEq`
    /// (constants by their bits). It was the fields' `Debug` text, 3% of the seed step's
    /// compile.
    pub fn code_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let dims: &[usize] = if self.is_flat() { &[] } else { &self.out_dims };
        (
            self.out_dtype,
            self.is_flat(),
            dims,
            &self.reduce,
            self.n_inputs,
            &self.body,
            &self.scatter,
            &self.scan,
        )
            .hash(&mut h);
        h.finish()
    }

    /// The loop variables: the result's (a scatter's: the updates'), the reduced ones, and a
    /// scatter's copy index or a scan's step counter.
    pub fn nvars(&self) -> usize {
        self.out_dims.len()
            + self.reduce.as_ref().map_or(0, |(_, d)| d.len())
            + usize::from(self.scatter.is_some() || self.scan.is_some())
    }

    /// A one-line summary for dumps: name, loop extents, reduction.
    pub fn summary(&self) -> String {
        let mut s = format!("{} {}{:?}", self.name, self.out_dtype, self.out_dims);
        if let Some((c, dims)) = &self.reduce {
            write!(s, " reduce {c:?} over {dims:?}").unwrap();
        }
        if let Some(sc) = &self.scatter {
            let mode = if sc.drop { "drop" } else { "clip" };
            write!(s, " scatter {} {mode} into {:?}", sc.kind.name(), sc.dims).unwrap();
        }
        if let Some(sc) = &self.scan {
            let dir = if sc.reverse { " reverse" } else { "" };
            write!(s, " scan {:?} along {}{dir}", sc.op, sc.axis).unwrap();
        }
        let ops = self.expr_nodes();
        write!(s, " ({ops} expression nodes, {} inputs)", self.n_inputs).unwrap();
        s
    }

    /// The nodes of the body.
    pub fn expr_nodes(&self) -> usize {
        let mut ops = 0;
        self.body.walk(&mut |_| ops += 1);
        ops
    }

    /// A rough size of one copy of the lowered body: a node is 1, a unary op with long
    /// inline code (fusion's `is_transcendental`: exp, log, tanh, erf, sin, sqrt, ...) is
    /// `INLINE_FUNCTION_WEIGHT`, about its instructions relative to an add's.
    pub fn code_weight(&self) -> usize {
        let mut w = 0;
        self.body.walk(&mut |e| {
            w += match e {
                Expr::Unary(u, ..) if crate::fusion::is_transcendental(&Op::Unary(*u)) => {
                    INLINE_FUNCTION_WEIGHT
                }
                Expr::Unary(..) => 1,
                Expr::Load { .. }
                | Expr::Gather { .. }
                | Expr::Const(..)
                | Expr::Index(..)
                | Expr::Binary(..)
                | Expr::Compare(..)
                | Expr::Select(..)
                | Expr::Convert { .. }
                | Expr::Bitcast { .. }
                | Expr::Guard { .. } => 1,
            }
        });
        w
    }
}

/// The index `lin` of a result nest with row-major strides `row_major` as an index of one
/// loop over the result's elements: the row-major element plus a constant, or a constant.
fn flat_lin(lin: &Lin, row_major: &[i64]) -> Option<Lin> {
    if lin.is_const() {
        Some(Lin {
            coef: vec![0],
            c: lin.c,
        })
    } else if lin.coef == row_major {
        Some(Lin {
            coef: vec![1],
            c: lin.c,
        })
    } else {
        None
    }
}

/// `e` over one loop variable (`Kernel::flattened`), or `None` where an index is not the
/// result's row-major element or a constant, or the expression is a guard or a gather.
fn flat_expr(e: &Expr, row_major: &[i64]) -> Option<Expr> {
    let flat = |x: &Expr| flat_expr(x, row_major).map(Box::new);
    Some(match e {
        Expr::Load {
            buf,
            dtype,
            strides,
            coords,
        } => {
            // The element read: sum_d strides[d] * coords[d], each coordinate unguarded.
            let mut at = Lin::zero(row_major.len());
            for (&stride, c) in strides.iter().zip(coords) {
                if c.div != 1 || c.clamp.is_some() {
                    return None;
                }
                let term = Lin {
                    coef: c
                        .lin
                        .coef
                        .iter()
                        .map(|&k| k.checked_mul(stride))
                        .collect::<Option<_>>()?,
                    c: c.lin.c.checked_mul(stride)?,
                };
                at = Lin {
                    coef: at
                        .coef
                        .iter()
                        .zip(&term.coef)
                        .map(|(a, b)| a.checked_add(*b))
                        .collect::<Option<_>>()?,
                    c: at.c.checked_add(term.c)?,
                };
            }
            Expr::Load {
                buf: *buf,
                dtype: *dtype,
                strides: vec![1],
                coords: vec![Coord {
                    lin: flat_lin(&at, row_major)?,
                    div: 1,
                    clamp: None,
                }],
            }
        }
        Expr::Const(d, v) => Expr::Const(*d, *v),
        Expr::Index(d, lin) => Expr::Index(*d, flat_lin(lin, row_major)?),
        Expr::Unary(u, d, x) => Expr::Unary(*u, *d, flat(x)?),
        Expr::Binary(b, d, x, y) => Expr::Binary(*b, *d, flat(x)?, flat(y)?),
        Expr::Compare(c, d, x, y) => Expr::Compare(*c, *d, flat(x)?, flat(y)?),
        Expr::Select(d, p, x, y) => Expr::Select(*d, flat(p)?, flat(x)?, flat(y)?),
        Expr::Convert { from, to, x } => Expr::Convert {
            from: *from,
            to: *to,
            x: flat(x)?,
        },
        Expr::Bitcast { from, to, x } => Expr::Bitcast {
            from: *from,
            to: *to,
            x: flat(x)?,
        },
        Expr::Gather { .. } | Expr::Guard { .. } => return None,
    })
}
