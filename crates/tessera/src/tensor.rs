//! `Tensor`, the one value type: concrete (an `Array`, ops run at once) or a tracer (ops are
//! recorded into the trace that made it). Constructors and read-back live here; the ops are in
//! `ops.rs`.

use std::fmt;
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;

use tessera_ir::{DType, Data, Literal, NodeId, Op, Shape, TensorType};
use tessera_runtime::Array;

use crate::error::{Error, Result, loc_text, raise};
use crate::trace::{TraceState, apply};

/// A tensor value, concrete or traced. Cloning is cheap (buffers and traces are shared).
#[derive(Clone)]
pub struct Tensor {
    pub(crate) repr: Repr,
    /// Weakly typed (a Rust number, `Tensor::scalar`, an op on weak operands only): it takes
    /// the type of a strongly typed operand it meets (`promote.rs`).
    pub(crate) weak: bool,
}

#[derive(Clone)]
pub(crate) enum Repr {
    Concrete(Array),
    Traced(Tracer),
}

/// A tracer names its trace by id and by the thread recording it; the trace's state lives in
/// that thread's stack of live traces (`trace.rs`). Holding no `Rc` keeps `Tensor` `Send +
/// Sync`: a tracer moved to another thread is found dead there and reported as such.
#[derive(Clone)]
pub(crate) struct Tracer {
    pub(crate) trace: u64,
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) node: NodeId,
    pub(crate) ty: TensorType,
}

/// Rust element types a tensor can be built from and read back into: the element types of
/// [`Data`] ([`tessera_ir::DataElement`]).
pub trait Element: Copy + fmt::Debug + 'static {
    /// The tensor dtype of this element type (`f32` is [`DType::F32`]).
    const DTYPE: DType;
    /// Row-major elements as the IR's untyped buffer.
    fn into_data(v: Vec<Self>) -> Data;
    /// The elements of `d`, or `None` when it holds another element type.
    fn from_data(d: &Data) -> Option<Vec<Self>>;
}

impl<T: tessera_ir::DataElement> Element for T {
    const DTYPE: DType = <T as tessera_ir::DataElement>::DTYPE;
    fn into_data(v: Vec<Self>) -> Data {
        Data::from_vec(v)
    }
    fn from_data(d: &Data) -> Option<Vec<Self>> {
        d.to_vec()
    }
}

impl Tensor {
    pub(crate) fn traced(trace: Rc<TraceState>, node: NodeId, ty: TensorType) -> Tensor {
        Tensor {
            repr: Repr::Traced(Tracer {
                trace: trace.id,
                thread: trace.thread,
                node,
                ty,
            }),
            weak: false,
        }
    }

    /// A concrete tensor holding a runtime array (its placement on a mesh, if any, is kept).
    pub fn from_array(a: Array) -> Tensor {
        Tensor {
            repr: Repr::Concrete(a),
            weak: false,
        }
    }

    /// A tensor holding `lit`. Panics (or fails the enclosing trace) when the data is not what
    /// the type declares: another element type, another element count, or a type over the
    /// size limit of one tensor (`TensorType::check_size`); `try_from_literal` returns that
    /// error instead.
    #[track_caller]
    pub fn from_literal(lit: Literal) -> Tensor {
        Tensor::try_from_literal(lit).unwrap_or_else(|e| raise(e))
    }

    /// `from_literal` that returns the error instead of panicking.
    #[track_caller]
    pub fn try_from_literal(lit: Literal) -> Result<Tensor> {
        match lit.check() {
            Ok(()) => Ok(Tensor::from_array(Array::new(lit))),
            Err(message) => Err(Error::Op {
                op: "from_literal".into(),
                message,
                location: loc_text(Location::caller()),
            }),
        }
    }

    /// A tensor of the given shape from row-major elements (`jnp.asarray(data).reshape(shape)`);
    /// the dtype is `T`'s. Panics when the element count does not match the shape (or the shape
    /// is over the size limit); `try_from_vec` returns that error instead.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    /// assert_eq!((x.shape(), x.dtype()), (&[2, 3][..], DType::F32));
    /// let s = Tensor::from_vec(vec![7i32], []); // a scalar: shape `[]`
    /// assert_eq!(s.item::<i32>(), 7);
    /// assert!(Tensor::try_from_vec(vec![1.0f32; 5], [2, 3]).is_err());
    /// ```
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Tensor {
        Tensor::try_from_vec(data, shape).unwrap_or_else(|e| raise(e))
    }

    /// A tensor from borrowed row-major elements: one copy into the tensor's own buffer
    /// (`from_vec` takes a `Vec` without copying; a standard-layout `ndarray` array converts
    /// without copying too). Panics as `from_vec` does; the shape is checked before copying.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let data = [1.0f32, 2.0, 3.0, 4.0];
    /// let x = Tensor::from_slice(&data[1..], [3]);
    /// assert_eq!(x.to_vec::<f32>(), [2.0, 3.0, 4.0]);
    /// ```
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Tensor {
        let shape = shape.into();
        let ty = TensorType::new(T::DTYPE, shape.clone());
        if let Err(message) = ty.check_size() {
            raise(Error::Op {
                op: "from_slice".into(),
                message,
                location: loc_text(Location::caller()),
            });
        }
        if ty.shape.numel() != data.len() {
            raise(Error::Op {
                op: "from_slice".into(),
                message: format!("{} elements cannot fill shape {}", data.len(), ty.shape),
                location: loc_text(Location::caller()),
            });
        }
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// `from_vec` that returns the error instead of panicking.
    #[track_caller]
    pub fn try_from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let ty = TensorType::new(T::DTYPE, shape);
        let location = loc_text(Location::caller());
        let fail = |message: String| Error::Op {
            op: "from_vec".into(),
            message,
            location: location.clone(),
        };
        ty.check_size().map_err(fail)?;
        let n = data.len();
        match Literal::new(ty.shape.clone(), T::into_data(data)) {
            Some(lit) => Ok(Tensor::from_array(Array::new(lit))),
            None => Err(fail(format!("{n} elements cannot fill shape {}", ty.shape))),
        }
    }

    /// A scalar holding `x`, weakly typed as `jnp.asarray(2.0)` is when `x` is a float or a
    /// signed integer (it takes the type of a strong operand it meets: `Tensor::scalar(2.0) *
    /// &bf16_tensor` stays bf16); a u32 or a bool scalar is strongly typed (JAX has no weak
    /// unsigned or bool Python scalar). `Tensor::scalar_of(x, dtype)` makes a strong scalar.
    pub fn scalar<T: Element>(x: T) -> Tensor {
        let weak = T::DTYPE.is_float() || T::DTYPE.is_signed();
        Tensor::from_array(Array::new(Literal {
            ty: TensorType::scalar(T::DTYPE),
            data: T::into_data(vec![x]),
        }))
        .with_weak(weak)
    }

    /// An f32 tensor of zeros. Like every host constructor (`ones`, `full`, `full_dtype`) it
    /// panics, naming the caller's line, when the shape is over the size limit of one tensor
    /// or the memory cannot be allocated (instead of aborting the process); `try_zeros` and
    /// `try_full_dtype` return that error.
    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>) -> Tensor {
        Tensor::host_full("zeros", shape.into(), 0.0, DType::F32).unwrap_or_else(|e| raise(e))
    }

    /// `zeros` that returns the error instead of panicking.
    #[track_caller]
    pub fn try_zeros(shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::host_full("zeros", shape.into(), 0.0, DType::F32)
    }

    /// An f32 tensor of ones.
    #[track_caller]
    pub fn ones(shape: impl Into<Shape>) -> Tensor {
        Tensor::host_full("ones", shape.into(), 1.0, DType::F32).unwrap_or_else(|e| raise(e))
    }

    /// An f32 tensor filled with `x`.
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, x: f32) -> Tensor {
        Tensor::host_full("full", shape.into(), x as f64, DType::F32).unwrap_or_else(|e| raise(e))
    }

    /// A tensor of any dtype filled with `x` converted to it.
    #[track_caller]
    pub fn full_dtype(shape: impl Into<Shape>, x: f64, dtype: DType) -> Tensor {
        Tensor::host_full("full", shape.into(), x, dtype).unwrap_or_else(|e| raise(e))
    }

    /// `full_dtype` that returns the error instead of panicking.
    #[track_caller]
    pub fn try_full_dtype(shape: impl Into<Shape>, x: f64, dtype: DType) -> Result<Tensor> {
        Tensor::host_full("full", shape.into(), x, dtype)
    }

    #[track_caller]
    fn host_full(op: &str, shape: Shape, x: f64, dtype: DType) -> Result<Tensor> {
        match Literal::try_splat(&TensorType::new(dtype, shape), x) {
            Ok(lit) => Ok(Tensor::from_array(Array::new(lit))),
            Err(message) => Err(Error::Op {
                op: op.into(),
                message,
                location: loc_text(Location::caller()),
            }),
        }
    }

    /// Zeros of this tensor's shape and dtype (`jnp.zeros_like`).
    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        Tensor::full_dtype(self.shape().to_vec(), 0.0, self.dtype())
    }

    /// `0, 1, ..., n-1` as i32, like `jnp.arange(n)`.
    #[track_caller]
    pub fn arange(n: usize) -> Tensor {
        Tensor::iota(DType::I32, [n], 0)
    }

    /// Counts along `dim` of a tensor of the given type (the `iota` primitive).
    #[track_caller]
    pub fn iota(dtype: DType, shape: impl Into<Shape>, dim: usize) -> Tensor {
        apply(
            Op::Iota {
                dim,
                ty: TensorType::new(dtype, shape),
            },
            &[],
        )
    }

    /// The dtype and shape, as the IR types a value.
    pub fn ty(&self) -> &TensorType {
        match &self.repr {
            Repr::Concrete(a) => a.ty(),
            Repr::Traced(t) => &t.ty,
        }
    }

    /// The dims (`x.shape`; `[]` for a scalar).
    pub fn shape(&self) -> &[usize] {
        self.ty().dims()
    }

    /// The number of dims (`x.ndim`).
    pub fn rank(&self) -> usize {
        self.ty().rank()
    }

    /// The element type (`x.dtype`).
    pub fn dtype(&self) -> DType {
        self.ty().dtype
    }

    /// The number of elements, the product of the dims (`x.size`; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.ty().numel()
    }

    /// The array's allocations and elements apart, when this tensor is the only holder of an
    /// unplaced buffer (what a call recycles, [`Array::into_shell`]); `None` for a shared,
    /// placed or traced tensor.
    pub(crate) fn into_shell(self) -> Option<(tessera_runtime::Shell, tessera_ir::Data)> {
        match self.repr {
            Repr::Concrete(a) => a.into_shell(),
            Repr::Traced(_) => None,
        }
    }

    /// [`Tensor::into_shell`] for a tensor placed on one device ([`Array::into_placed_shell`]).
    pub(crate) fn into_placed_shell(
        self,
    ) -> Option<(tessera_runtime::PlacedShell, tessera_ir::Data)> {
        match self.repr {
            Repr::Concrete(a) => a.into_placed_shell(),
            Repr::Traced(_) => None,
        }
    }

    /// [`Tensor::into_placed_shell`] for a tensor placed on several devices
    /// ([`Array::into_shards_shell`]: each shard's elements to `give(k, data)`).
    pub(crate) fn into_shards_shell(
        self,
        give: impl FnMut(usize, tessera_ir::Data),
    ) -> Option<tessera_runtime::ShardsShell> {
        match self.repr {
            Repr::Concrete(a) => a.into_shards_shell(give),
            Repr::Traced(_) => None,
        }
    }

    /// Whether the placement is `spec`, without cloning it.
    /// Whether this is laid out as `spec` (the same allocation, or an equal one).
    pub(crate) fn placed_as(&self, spec: Option<&Arc<tessera_runtime::ShardSpec>>) -> bool {
        match (&self.repr, spec) {
            (Repr::Concrete(a), Some(spec)) => a
                .layout()
                .is_some_and(|l| Arc::ptr_eq(l, spec) || **l == **spec),
            (Repr::Concrete(a), None) => a.layout().is_none(),
            (Repr::Traced(_), spec) => spec.is_none(),
        }
    }

    pub(crate) fn placement(&self) -> Option<Arc<tessera_runtime::ShardSpec>> {
        match &self.repr {
            Repr::Concrete(a) => a.layout().cloned(),
            Repr::Traced(_) => None,
        }
    }

    /// Whether this is a tracer (an abstract value inside `jit`, `grad`, `vmap`, ...) rather
    /// than a concrete array; a tracer's value cannot be read.
    pub fn is_tracer(&self) -> bool {
        matches!(self.repr, Repr::Traced(_))
    }

    /// The concrete array, or an error naming the caller when this is a tracer.
    #[track_caller]
    pub fn try_array(&self) -> Result<&Array> {
        match &self.repr {
            Repr::Concrete(a) => Ok(a),
            Repr::Traced(t) => Err(Error::Op {
                op: "read".into(),
                message: format!(
                    "the value of a tracer ({}) is not known while tracing; return it from the \
                     jitted function instead (trace {})",
                    t.ty,
                    t.trace_id()
                ),
                location: loc_text(Location::caller()),
            }),
        }
    }

    /// The host value; panics (or fails the trace) when called on a tracer.
    #[track_caller]
    pub fn to_literal(&self) -> Literal {
        match self.try_array() {
            Ok(a) => a.literal().clone(),
            Err(e) => raise(e),
        }
    }

    /// The elements, row-major; fails when `T` is not the tensor's dtype or on a tracer.
    #[track_caller]
    pub fn try_to_vec<T: Element>(&self) -> Result<Vec<T>> {
        // Read before the closure below: a closure does not inherit `#[track_caller]`.
        let location = loc_text(Location::caller());
        let a = self.try_array()?;
        let literal = a.try_literal().map_err(|message| Error::Op {
            op: "to_vec".into(),
            message,
            location: location.clone(),
        })?;
        T::from_data(&literal.data).ok_or_else(|| Error::Op {
            op: "to_vec".into(),
            message: format!("the tensor holds {}, not {}", a.ty().dtype, T::DTYPE),
            location,
        })
    }

    /// The elements, row-major (`np.asarray(x).ravel().tolist()`). Panics on a dtype mismatch
    /// (no conversion happens: `astype` first) or a tracer; `try_to_vec` returns the error.
    ///
    /// ```
    /// use tessera::prelude::*;
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    /// assert_eq!(x.t().to_vec::<f32>(), vec![1.0, 3.0, 2.0, 4.0]);
    /// assert!(x.try_to_vec::<i32>().is_err());
    /// assert_eq!(x.astype(DType::I32).to_vec::<i32>(), vec![1, 2, 3, 4]);
    /// ```
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.try_to_vec().unwrap_or_else(|e| raise(e))
    }

    /// The single element of a one-element tensor.
    #[track_caller]
    pub fn item<T: Element>(&self) -> T {
        let v = self.to_vec::<T>();
        if v.len() != 1 {
            raise(Error::Op {
                op: "item".into(),
                message: format!(
                    "a tensor of type {} has {} elements, not one",
                    self.ty(),
                    v.len()
                ),
                location: loc_text(Location::caller()),
            });
        }
        v[0]
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Prints like NumPy: nested brackets, at most 6 items per dimension.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Traced(t) => write!(f, "Traced<{}>", t.ty),
            Repr::Concrete(a) => {
                let lit = a.literal();
                fn rec(
                    f: &mut fmt::Formatter<'_>,
                    lit: &Literal,
                    dims: &[usize],
                    base: usize,
                    stride: usize,
                ) -> fmt::Result {
                    if dims.is_empty() {
                        return f.write_str(&lit.data.element_text(base));
                    }
                    let inner = stride / dims[0].max(1);
                    write!(f, "[")?;
                    for i in 0..dims[0] {
                        if dims[0] > 6 && i == 3 {
                            write!(f, ", ...")?;
                        }
                        if dims[0] > 6 && (3..dims[0] - 3).contains(&i) {
                            continue;
                        }
                        if i > 0 {
                            write!(f, ", ")?;
                        }
                        rec(f, lit, &dims[1..], base + i * inner, inner)?;
                    }
                    write!(f, "]")
                }
                write!(f, "{} ", lit.ty)?;
                rec(f, lit, lit.ty.dims(), 0, lit.ty.numel())
            }
        }
    }
}
