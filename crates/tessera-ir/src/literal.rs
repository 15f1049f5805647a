//! Host tensor values: the payload of `constant` ops, the interpreter's values and the
//! runtime's buffers. Row-major, one `Vec` per element type.

use crate::types::{DType, Shape, TensorType};
pub use half::{bf16, f16};

/// Elements of a tensor, row-major.
#[derive(Clone, Debug)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    Bool(Vec<bool>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Data {
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I32(_) => DType::I32,
            Data::U32(_) => DType::U32,
            Data::Bool(_) => DType::Bool,
            Data::I64(_) => DType::I64,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` copies of zero (false for bool).
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::U32 => Data::U32(vec![0; n]),
            DType::Bool => Data::Bool(vec![false; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::F16 => Data::F16(vec![f16::ZERO; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
        }
    }

    /// `n` copies of zero, or an error naming the size when the allocation fails (instead of
    /// aborting the process). The memory is written, so it is really there.
    pub fn try_zeros(dtype: DType, n: usize) -> Result<Data, String> {
        Data::try_splat(dtype, 0.0, n)
    }

    /// `n` copies of `x` converted to `dtype`, or an error naming the size when the
    /// allocation fails.
    pub fn try_splat(dtype: DType, x: f64, n: usize) -> Result<Data, String> {
        fn fill<T: Clone>(x: T, n: usize, width: usize) -> Result<Vec<T>, String> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                format!(
                    "cannot allocate {} bytes ({n} elements of {width} bytes)",
                    n.saturating_mul(width)
                )
            })?;
            v.resize(n, x);
            Ok(v)
        }
        let w = dtype.byte_width();
        Ok(match dtype {
            DType::F32 => Data::F32(fill(x as f32, n, w)?),
            DType::F64 => Data::F64(fill(x, n, w)?),
            DType::I32 => Data::I32(fill(x as i32, n, w)?),
            DType::U32 => Data::U32(fill(x as u32, n, w)?),
            DType::Bool => Data::Bool(fill(x != 0.0, n, w)?),
            DType::I64 => Data::I64(fill(x as i64, n, w)?),
            DType::F16 => Data::F16(fill(f16::from_f64(x), n, w)?),
            DType::BF16 => Data::BF16(fill(bf16::from_f64(x), n, w)?),
        })
    }

    /// Element `i` as f64 (bool as 0 or 1): for printing and tests, not for kernels.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
            Data::I32(v) => v[i] as f64,
            Data::U32(v) => v[i] as f64,
            Data::Bool(v) => v[i] as u8 as f64,
            Data::I64(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
        }
    }

    /// `n` copies of `x` converted to `dtype` the way `convert` does.
    pub fn splat(dtype: DType, x: f64, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![x as f32; n]),
            DType::F64 => Data::F64(vec![x; n]),
            DType::I32 => Data::I32(vec![x as i32; n]),
            DType::U32 => Data::U32(vec![x as u32; n]),
            DType::Bool => Data::Bool(vec![x != 0.0; n]),
            DType::I64 => Data::I64(vec![x as i64; n]),
            DType::F16 => Data::F16(vec![f16::from_f64(x); n]),
            DType::BF16 => Data::BF16(vec![bf16::from_f64(x); n]),
        }
    }

    /// Bitwise equality, so that NaN constants compare equal to themselves.
    pub fn bits_eq(&self, other: &Data) -> bool {
        match (self, other) {
            (Data::F32(a), Data::F32(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Data::F64(a), Data::F64(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Data::I32(a), Data::I32(b)) => a == b,
            (Data::U32(a), Data::U32(b)) => a == b,
            (Data::Bool(a), Data::Bool(b)) => a == b,
            (Data::I64(a), Data::I64(b)) => a == b,
            (Data::F16(a), Data::F16(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Data::BF16(a), Data::BF16(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => false,
        }
    }

    /// `bits_eq`, but any NaN equals any NaN: neither Rust nor LLVM fixes a NaN result's sign
    /// or payload (an optimized build may commute an `fadd`; x86 keeps the first operand's
    /// NaN), so two exact evaluations may differ there and nowhere else. Signed zeros count.
    pub fn bits_eq_any_nan(&self, other: &Data) -> bool {
        fn same<T: Copy>(
            a: &[T],
            b: &[T],
            bits: impl Fn(T) -> u64,
            nan: impl Fn(T) -> bool,
        ) -> bool {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(&x, &y)| bits(x) == bits(y) || (nan(x) && nan(y)))
        }
        match (self, other) {
            (Data::F32(a), Data::F32(b)) => same(a, b, |x| u64::from(x.to_bits()), f32::is_nan),
            (Data::F64(a), Data::F64(b)) => same(a, b, f64::to_bits, f64::is_nan),
            (Data::F16(a), Data::F16(b)) => same(a, b, |x| u64::from(x.to_bits()), |x| x.is_nan()),
            (Data::BF16(a), Data::BF16(b)) => {
                same(a, b, |x| u64::from(x.to_bits()), |x| x.is_nan())
            }
            (a, b) => a.bits_eq(b),
        }
    }

    /// True when every element equals the first (bitwise).
    pub fn is_splat(&self) -> bool {
        match self {
            Data::F32(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::F64(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::I32(v) => v.iter().all(|x| *x == v[0]),
            Data::U32(v) => v.iter().all(|x| *x == v[0]),
            Data::Bool(v) => v.iter().all(|x| *x == v[0]),
            Data::I64(v) => v.iter().all(|x| *x == v[0]),
            Data::F16(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::BF16(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
        }
    }

    /// Element `i` in the IR text syntax; floats print the shortest text that parses back to the
    /// same bits (non-finite values print as `nan`, `inf`, `-inf`).
    pub fn element_text(&self, i: usize) -> String {
        fn float(x: f64, text: String) -> String {
            if x.is_nan() {
                "nan".into()
            } else if x.is_infinite() {
                if x > 0.0 { "inf".into() } else { "-inf".into() }
            } else {
                text
            }
        }
        match self {
            Data::F32(v) => float(v[i] as f64, format!("{:?}", v[i])),
            Data::F64(v) => float(v[i], format!("{:?}", v[i])),
            Data::I32(v) => v[i].to_string(),
            Data::U32(v) => v[i].to_string(),
            Data::Bool(v) => v[i].to_string(),
            Data::I64(v) => v[i].to_string(),
            // The f32 value's shortest text: exact, so it parses back to the same bits.
            Data::F16(v) => float(v[i].to_f64(), format!("{:?}", v[i].to_f32())),
            Data::BF16(v) => float(v[i].to_f64(), format!("{:?}", v[i].to_f32())),
        }
    }
}

/// A Rust type that is the element type of one `Data` variant: the typed views and copies of
/// [`Data`] are generic over it, so that code moving elements needs no per-dtype `match`.
pub trait DataElement: Copy + std::fmt::Debug + Send + Sync + 'static {
    /// The element type it stands for.
    const DTYPE: DType;
    /// The elements of `d` when `d` holds this type.
    fn view(d: &Data) -> Option<&[Self]>;
    fn view_mut(d: &mut Data) -> Option<&mut Vec<Self>>;
    /// The variant holding `v`.
    fn wrap(v: Vec<Self>) -> Data;
}

macro_rules! data_element {
    ($t:ty, $variant:ident) => {
        impl DataElement for $t {
            const DTYPE: DType = DType::$variant;
            fn view(d: &Data) -> Option<&[$t]> {
                match d {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn view_mut(d: &mut Data) -> Option<&mut Vec<$t>> {
                match d {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<$t>) -> Data {
                Data::$variant(v)
            }
        }
    };
}
data_element!(f32, F32);
data_element!(f64, F64);
data_element!(i32, I32);
data_element!(u32, U32);
data_element!(bool, Bool);
data_element!(i64, I64);
data_element!(f16, F16);
data_element!(bf16, BF16);

/// Runs `$body` with `$v` bound to the elements of `$data` (a `&Data`) as a typed slice, and
/// `$t` to their type.
macro_rules! with_slice {
    ($data:expr, $v:ident: $t:ident => $body:expr) => {
        match $data {
            Data::F32($v) => {
                type $t = f32;
                $body
            }
            Data::F64($v) => {
                type $t = f64;
                $body
            }
            Data::I32($v) => {
                type $t = i32;
                $body
            }
            Data::U32($v) => {
                type $t = u32;
                $body
            }
            Data::Bool($v) => {
                type $t = bool;
                $body
            }
            Data::I64($v) => {
                type $t = i64;
                $body
            }
            Data::F16($v) => {
                type $t = $crate::literal::f16;
                $body
            }
            Data::BF16($v) => {
                type $t = $crate::literal::bf16;
                $body
            }
        }
    };
}

/// A copy between two `Data` that cannot be done: different element types or an index out
/// of range. The message names both sides.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DataError(pub String);

impl Data {
    /// The elements as a slice of `T`, `None` when the data holds another element type.
    pub fn as_slice<T: DataElement>(&self) -> Option<&[T]> {
        T::view(self)
    }

    /// The element vector of type `T`, for writing in place; `None` for another element type.
    pub fn as_vec_mut<T: DataElement>(&mut self) -> Option<&mut Vec<T>> {
        T::view_mut(self)
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        self.as_slice()
    }

    pub fn as_f64(&self) -> Option<&[f64]> {
        self.as_slice()
    }

    pub fn as_i32(&self) -> Option<&[i32]> {
        self.as_slice()
    }

    pub fn as_u32(&self) -> Option<&[u32]> {
        self.as_slice()
    }

    pub fn as_bool(&self) -> Option<&[bool]> {
        self.as_slice()
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        self.as_slice()
    }

    /// The data holding `v`.
    pub fn from_vec<T: DataElement>(v: Vec<T>) -> Data {
        T::wrap(v)
    }

    /// A copy of the elements as a `Vec<T>`, `None` when the data holds another element type.
    pub fn to_vec<T: DataElement>(&self) -> Option<Vec<T>> {
        self.as_slice().map(<[T]>::to_vec)
    }

    /// The element vector, or the data back when it holds another element type.
    pub fn into_vec<T: DataElement>(mut self) -> Result<Vec<T>, Data> {
        match T::view_mut(&mut self) {
            Some(v) => Ok(std::mem::take(v)),
            None => Err(self),
        }
    }

    /// The elements in `range`, as new data of the same element type.
    #[track_caller]
    pub fn slice(&self, range: std::ops::Range<usize>) -> Data {
        let n = self.len();
        assert!(
            range.start <= range.end && range.end <= n,
            "Data::slice: range {range:?} outside {n} {} elements",
            self.dtype()
        );
        with_slice!(self, v: T => Data::from_vec::<T>(v[range].to_vec()))
    }

    /// Appends the elements of `other`, which must have the same element type.
    pub fn extend(&mut self, other: &Data) -> Result<(), DataError> {
        let (dt, odt) = (self.dtype(), other.dtype());
        with_slice!(other, v: T => match self.as_vec_mut::<T>() {
            Some(d) => {
                d.extend_from_slice(v);
                Ok(())
            }
            None => Err(DataError(format!("cannot append {odt} elements to {dt} data"))),
        })
    }

    /// Copies `src[src_range]` to `self[dst_start..]`; both must have the same element type
    /// and the ranges must be in bounds.
    pub fn copy_block(
        &mut self,
        dst_start: usize,
        src: &Data,
        src_range: std::ops::Range<usize>,
    ) -> Result<(), DataError> {
        let (dt, sdt, dn, sn) = (self.dtype(), src.dtype(), self.len(), src.len());
        let count = src_range.end.saturating_sub(src_range.start);
        let in_bounds = src_range.start <= src_range.end
            && src_range.end <= sn
            && dst_start.checked_add(count).is_some_and(|end| end <= dn);
        if !in_bounds {
            return Err(DataError(format!(
                "cannot copy elements {src_range:?} of {sn} {sdt} elements to {dst_start}.. of \
                 {dn} {dt} elements"
            )));
        }
        with_slice!(src, s: T => match self.as_vec_mut::<T>() {
            Some(d) => {
                d[dst_start..dst_start + count].copy_from_slice(&s[src_range]);
                Ok(())
            }
            None => Err(DataError(format!("cannot copy {sdt} elements into {dt} data"))),
        })
    }

    /// Copies element `i` of `src` to element `j` of `self` (same element type, in bounds).
    pub fn copy_element(&mut self, j: usize, src: &Data, i: usize) -> Result<(), DataError> {
        self.copy_block(j, src, i..i.saturating_add(1))
    }

    /// New data whose element `k` is `self[sources[k]]`, or the first element of `fill` where
    /// `sources[k]` is `None` (`fill` must then be given, non-empty and of the same type).
    pub fn gather(
        &self,
        sources: &[Option<usize>],
        fill: Option<&Data>,
    ) -> Result<Data, DataError> {
        let (dt, n) = (self.dtype(), self.len());
        with_slice!(self, v: T => {
            let pad: Option<T> = fill.and_then(|f| f.as_slice::<T>()).and_then(|f| f.first().copied());
            let mut out: Vec<T> = Vec::with_capacity(sources.len());
            for s in sources {
                out.push(match *s {
                    Some(i) if i < n => v[i],
                    Some(i) => {
                        return Err(DataError(format!(
                            "gather: index {i} outside {n} {dt} elements"
                        )));
                    }
                    None => pad.ok_or_else(|| {
                        DataError(format!(
                            "gather: a padded element needs a {dt} fill value, got {}",
                            fill.map_or("none".to_string(), |f| format!(
                                "{} {} elements",
                                f.len(),
                                f.dtype()
                            ))
                        ))
                    })?,
                });
            }
            Ok(Data::from_vec::<T>(out))
        })
    }

    /// The elements of a strided view of these: element `idx` (row-major over `dims`) of the
    /// result is `self[sum(idx[d] * strides[d])]` (a stride of 0 repeats an element: a
    /// broadcast; permuted strides: a transpose). Copied a row at a time, no index vector per
    /// element; an error when the view reaches past the elements or its size overflows.
    pub fn strided(&self, dims: &[usize], strides: &[usize]) -> Result<Data, DataError> {
        let (dt, len) = (self.dtype(), self.len());
        let fail = || {
            DataError(format!(
                "strided view {dims:?} by {strides:?} of {len} {dt} elements"
            ))
        };
        if dims.len() != strides.len() {
            return Err(fail());
        }
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(fail)?;
        if n > 0 {
            let last = dims.iter().zip(strides).try_fold(0usize, |a, (&d, &s)| {
                (d - 1).checked_mul(s).and_then(|x| a.checked_add(x))
            });
            if last.is_none_or(|l| l >= len) {
                return Err(fail());
            }
        }
        let rank = dims.len();
        let (inner, inner_stride) = match rank {
            0 => (1, 0),
            _ => (dims[rank - 1], strides[rank - 1]),
        };
        let rows = n.checked_div(inner).unwrap_or(0);
        with_slice!(self, v: T => {
            let mut out: Vec<T> = Vec::new();
            out.try_reserve_exact(n).map_err(|_| fail())?;
            let outer = rank.saturating_sub(1);
            let mut at = vec![0usize; outer];
            let mut off = 0usize;
            for _ in 0..rows {
                match inner_stride {
                    0 => out.extend(std::iter::repeat_n(v[off], inner)),
                    1 => out.extend_from_slice(&v[off..off + inner]),
                    s => out.extend((0..inner).map(|j| v[off + j * s])),
                }
                // Modular steps: a dim of extent 1 may carry any stride, so `off` may pass
                // through values past the view before it is reset; every offset read is in it.
                for d in (0..outer).rev() {
                    at[d] += 1;
                    off = off.wrapping_add(strides[d]);
                    if at[d] < dims[d] {
                        break;
                    }
                    off = off.wrapping_sub(strides[d].wrapping_mul(dims[d]));
                    at[d] = 0;
                }
            }
            Ok(Data::from_vec::<T>(out))
        })
    }

    /// The elements' bytes in memory (native endianness; a bool is one byte, 0 or 1).
    pub fn as_bytes(&self) -> &[u8] {
        with_slice!(self, v: T => {
            // SAFETY: `T` is one of f32, f64, i32, u32, bool, i64, and half's f16 and bf16
            // (`repr(transparent)` over u16): each has no padding and every
            // byte of a valid value is initialized, so the `size_of_val(v)` bytes at `v`'s
            // start are initialized `u8`s, borrowed for as long as `self`.
            unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val::<[T]>(v))
            }
        })
    }

    /// A pointer to the first element, for handing the buffer to native code that reads it.
    pub fn as_ptr(&self) -> *const u8 {
        self.as_bytes().as_ptr()
    }

    /// How many elements the data has room for without reallocating.
    pub fn capacity(&self) -> usize {
        match self {
            Data::F32(v) => v.capacity(),
            Data::F64(v) => v.capacity(),
            Data::I32(v) => v.capacity(),
            Data::U32(v) => v.capacity(),
            Data::Bool(v) => v.capacity(),
            Data::I64(v) => v.capacity(),
            Data::F16(v) => v.capacity(),
            Data::BF16(v) => v.capacity(),
        }
    }

    /// Removes every element, keeping the allocation (to be filled again, as a recycled
    /// output buffer).
    pub fn clear(&mut self) {
        match self {
            Data::F32(v) => v.clear(),
            Data::F64(v) => v.clear(),
            Data::I32(v) => v.clear(),
            Data::U32(v) => v.clear(),
            Data::Bool(v) => v.clear(),
            Data::I64(v) => v.clear(),
            Data::F16(v) => v.clear(),
            Data::BF16(v) => v.clear(),
        }
    }

    /// Empty data of `dtype` with room for `n` elements, for native code to fill through
    /// [`Data::as_mut_ptr`] before [`Data::set_len`]; an error naming the size when the
    /// allocator has no room.
    pub fn try_with_capacity(dtype: DType, n: usize) -> Result<Data, DataError> {
        fn room<T: DataElement>(n: usize) -> Result<Data, DataError> {
            let mut v: Vec<T> = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                DataError(format!(
                    "cannot allocate {} bytes ({n} elements of {})",
                    n.saturating_mul(std::mem::size_of::<T>()),
                    T::DTYPE
                ))
            })?;
            Ok(Data::from_vec(v))
        }
        match dtype {
            DType::F32 => room::<f32>(n),
            DType::F64 => room::<f64>(n),
            DType::I32 => room::<i32>(n),
            DType::U32 => room::<u32>(n),
            DType::Bool => room::<bool>(n),
            DType::I64 => room::<i64>(n),
            DType::F16 => room::<f16>(n),
            DType::BF16 => room::<bf16>(n),
        }
    }

    /// Sets the element count, as `Vec::set_len`.
    ///
    /// # Safety
    /// `n` must be at most the capacity, and the first `n` elements must have been written
    /// (bools as bytes 0 or 1).
    pub unsafe fn set_len(&mut self, n: usize) {
        // SAFETY: forwarded from the caller: `n` is within the capacity and initialized.
        unsafe {
            match self {
                Data::F32(v) => v.set_len(n),
                Data::F64(v) => v.set_len(n),
                Data::I32(v) => v.set_len(n),
                Data::U32(v) => v.set_len(n),
                Data::Bool(v) => v.set_len(n),
                Data::I64(v) => v.set_len(n),
                Data::F16(v) => v.set_len(n),
                Data::BF16(v) => v.set_len(n),
            }
        }
    }

    /// A pointer to the first element (of the capacity, not only the length), for native code
    /// that writes it. Writing a byte other than 0 or 1 into bool data is undefined
    /// behaviour; the caller keeps to that.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Data::F32(v) => v.as_mut_ptr() as *mut u8,
            Data::F64(v) => v.as_mut_ptr() as *mut u8,
            Data::I32(v) => v.as_mut_ptr() as *mut u8,
            Data::U32(v) => v.as_mut_ptr() as *mut u8,
            Data::Bool(v) => v.as_mut_ptr() as *mut u8,
            Data::I64(v) => v.as_mut_ptr() as *mut u8,
            Data::F16(v) => v.as_mut_ptr() as *mut u8,
            Data::BF16(v) => v.as_mut_ptr() as *mut u8,
        }
    }
}

/// A host tensor: a type and its row-major elements.
#[derive(Clone, Debug)]
pub struct Literal {
    pub ty: TensorType,
    pub data: Data,
}

impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        self.ty == other.ty && self.data.bits_eq(&other.data)
    }
}

impl Literal {
    /// A literal from its elements; `None` when the count does not match the shape or the
    /// shape is over the size limit ([`TensorType::check_size`]).
    pub fn new(shape: impl Into<Shape>, data: Data) -> Option<Literal> {
        let lit = Literal {
            ty: TensorType::new(data.dtype(), shape.into()),
            data,
        };
        lit.check().is_ok().then_some(lit)
    }

    /// Checks that the data is what the type declares: the type is within the size limit, the
    /// data has the declared element type and exactly as many elements as the shape.
    pub fn check(&self) -> Result<(), String> {
        self.ty.check_size()?;
        if self.data.dtype() != self.ty.dtype {
            return Err(format!(
                "a literal declared {} holds {} data",
                self.ty,
                self.data.dtype()
            ));
        }
        if self.data.len() != self.ty.numel() {
            return Err(format!(
                "a literal declared {} ({} elements) holds {} elements",
                self.ty,
                self.ty.numel(),
                self.data.len()
            ));
        }
        Ok(())
    }

    /// Zeros of type `ty`, or an error when `ty` is over the size limit or the memory cannot
    /// be allocated.
    pub fn try_zeros(ty: &TensorType) -> Result<Literal, String> {
        Literal::try_splat(ty, 0.0)
    }

    /// `x` converted to `ty`'s dtype at every element, or an error when `ty` is over the size
    /// limit or the memory cannot be allocated.
    pub fn try_splat(ty: &TensorType, x: f64) -> Result<Literal, String> {
        ty.check_size()?;
        let data = Data::try_splat(ty.dtype, x, ty.numel()).map_err(|e| format!("{ty}: {e}"))?;
        Ok(Literal {
            ty: ty.clone(),
            data,
        })
    }

    pub fn zeros(ty: &TensorType) -> Literal {
        Literal {
            ty: ty.clone(),
            data: Data::zeros(ty.dtype, ty.numel()),
        }
    }

    pub fn splat(ty: &TensorType, x: f64) -> Literal {
        Literal {
            ty: ty.clone(),
            data: Data::splat(ty.dtype, x, ty.numel()),
        }
    }

    pub fn scalar_f32(x: f32) -> Literal {
        Literal {
            ty: TensorType::scalar(DType::F32),
            data: Data::F32(vec![x]),
        }
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    /// Every element as f64, for tests and printing.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.data.len()).map(|i| self.data.get_f64(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_nan_equals_any_nan_and_nothing_else_is_loosened() {
        let neg_nan = f32::from_bits(0xffc0_0000);
        let f = |v: Vec<f32>| Data::F32(v);
        assert!(f(vec![f32::NAN, 1.0]).bits_eq_any_nan(&f(vec![neg_nan, 1.0])));
        assert!(!f(vec![f32::NAN]).bits_eq(&f(vec![neg_nan])));
        assert!(
            !f(vec![0.0]).bits_eq_any_nan(&f(vec![-0.0])),
            "signed zeros count"
        );
        assert!(!f(vec![f32::NAN]).bits_eq_any_nan(&f(vec![1.0])));
        assert!(!f(vec![1.0]).bits_eq_any_nan(&f(vec![1.0, 1.0])), "lengths");
        let h = |x: f64| half::f16::from_f64(x);
        assert!(Data::F16(vec![h(f64::NAN)]).bits_eq_any_nan(&Data::F16(vec![-h(f64::NAN)])));
        assert!(Data::F64(vec![f64::NAN]).bits_eq_any_nan(&Data::F64(vec![-f64::NAN])));
        assert!(!Data::I32(vec![1]).bits_eq_any_nan(&Data::I32(vec![2])));
        assert!(
            !Data::I32(vec![1]).bits_eq_any_nan(&Data::F32(vec![1.0])),
            "dtypes"
        );
    }

    fn samples() -> Vec<Data> {
        vec![
            Data::F32(vec![1.5, -0.0, f32::NAN]),
            Data::F64(vec![2.5, -1.0, 1e300]),
            Data::I32(vec![-7, 0, 9]),
            Data::U32(vec![7, 0, u32::MAX]),
            Data::Bool(vec![true, false, true]),
            Data::I64(vec![-(1 << 40), 0, i64::MAX]),
            Data::F16(vec![f16::from_f32(1.5), f16::NEG_ZERO, f16::INFINITY]),
            Data::BF16(vec![bf16::from_f32(-2.5), bf16::MIN_POSITIVE, bf16::NAN]),
        ]
    }

    /// `strided` against the per-element definition (each index unravelled, its offset
    /// summed), for broadcasts (zero strides), transposes, every inner stride kind, rank 0 and
    /// zero-size views; views past the elements or overflowing are errors.
    #[test]
    fn strided_views_are_the_per_element_gathers() {
        let src = Data::from_vec((0..24u32).collect::<Vec<_>>());
        let cases: [(&[usize], &[usize]); 9] = [
            (&[2, 3, 4], &[12, 4, 1]),
            (&[4, 3, 2], &[1, 4, 12]),
            (&[3, 5], &[4, 0]),
            (&[5, 3], &[0, 4]),
            (&[2, 2, 3], &[0, 12, 1]),
            (&[7], &[0]),
            (&[], &[]),
            (&[3, 0, 2], &[8, 1, 1]),
            (&[0], &[5]),
        ];
        for (dims, strides) in cases {
            let got = src.strided(dims, strides).unwrap();
            let n: usize = dims.iter().product();
            let want: Vec<u32> = (0..n)
                .map(|mut f| {
                    let mut off = 0;
                    for d in (0..dims.len()).rev() {
                        off += (f % dims[d]) * strides[d];
                        f /= dims[d];
                    }
                    off as u32
                })
                .collect();
            assert_eq!(got.as_u32(), Some(&want[..]), "{dims:?} by {strides:?}");
        }
        assert!(src.strided(&[2, 13], &[12, 1]).is_err());
        assert!(src.strided(&[2], &[24]).is_err());
        assert!(src.strided(&[usize::MAX, 2], &[0, 0]).is_err());
        assert!(src.strided(&[2, 2], &[usize::MAX, 1]).is_err());
        assert!(src.strided(&[2], &[1, 1]).is_err());
        // Extent-1 dims with any stride; a view too large to allocate is an error.
        let one = src.strided(&[2, 1, 3], &[1, usize::MAX, 2]).unwrap();
        assert_eq!(one.as_u32(), Some(&[0, 2, 4, 1, 3, 5][..]));
        assert!(src.strided(&[1 << 62], &[0]).is_err());
        let f = Data::F32(vec![1.5, -0.0, f32::NAN]);
        let bits = |d: &Data| {
            d.as_f32()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        let back = f.strided(&[2, 3], &[0, 1]).unwrap();
        assert_eq!(bits(&back)[3..], bits(&f)[..]);
    }

    #[test]
    fn typed_views_see_only_their_own_type() {
        let d = samples();
        assert_eq!(d[0].as_f32().map(|v| v[0]), Some(1.5));
        assert_eq!(d[1].as_f64(), Some(&[2.5, -1.0, 1e300][..]));
        assert_eq!(d[2].as_i32(), Some(&[-7, 0, 9][..]));
        assert_eq!(d[3].as_u32(), Some(&[7, 0, u32::MAX][..]));
        assert_eq!(d[4].as_bool(), Some(&[true, false, true][..]));
        for (i, x) in d.iter().enumerate() {
            assert_eq!(x.as_f32().is_some(), i == 0);
            assert_eq!(x.as_f64().is_some(), i == 1);
            assert_eq!(x.as_i32().is_some(), i == 2);
            assert_eq!(x.as_u32().is_some(), i == 3);
            assert_eq!(x.as_bool().is_some(), i == 4);
        }
    }

    #[test]
    fn from_vec_to_vec_and_into_vec_round_trip() {
        let d = Data::from_vec(vec![3u32, 4]);
        assert_eq!(d.dtype(), DType::U32);
        assert_eq!(d.to_vec::<u32>(), Some(vec![3, 4]));
        assert_eq!(d.to_vec::<i32>(), None);
        let back = d
            .clone()
            .into_vec::<i32>()
            .expect_err("u32 data is not i32");
        assert!(back.bits_eq(&d));
        assert_eq!(d.into_vec::<u32>().ok(), Some(vec![3, 4]));
        let mut m = Data::from_vec(vec![1.0f64]);
        m.as_vec_mut::<f64>().unwrap().push(2.0);
        assert_eq!(m.as_f64(), Some(&[1.0, 2.0][..]));
        assert!(m.as_vec_mut::<f32>().is_none());
    }

    #[test]
    fn slice_copies_a_range_of_every_type() {
        for d in samples() {
            let s = d.slice(1..3);
            assert_eq!(s.dtype(), d.dtype());
            assert_eq!(s.len(), 2);
            for k in 0..2 {
                assert_eq!(s.element_text(k), d.element_text(k + 1));
            }
            assert!(d.slice(2..2).is_empty());
        }
    }

    #[test]
    #[should_panic(expected = "Data::slice: range 2..4 outside 3 i32 elements")]
    fn slice_out_of_range_names_the_range() {
        let _ = Data::I32(vec![1, 2, 3]).slice(2..4);
    }

    #[test]
    fn extend_appends_same_type_and_rejects_another() {
        for d in samples() {
            let mut a = d.clone();
            a.extend(&d).unwrap();
            assert_eq!(a.len(), 6);
            assert!(a.slice(3..6).bits_eq(&d));
        }
        let mut a = Data::F32(vec![1.0]);
        let e = a.extend(&Data::F64(vec![1.0])).unwrap_err();
        assert_eq!(e.0, "cannot append f64 elements to f32 data");
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn copy_block_and_copy_element_write_in_place() {
        for d in samples() {
            let mut z = Data::zeros(d.dtype(), 4);
            z.copy_block(1, &d, 0..3).unwrap();
            assert!(z.slice(1..4).bits_eq(&d));
            assert_eq!(z.get_f64(0), 0.0);
            let mut w = Data::zeros(d.dtype(), 3);
            w.copy_element(0, &d, 2).unwrap();
            assert_eq!(w.element_text(0), d.element_text(2));
            assert_eq!(w.get_f64(1), 0.0);
        }
        let mut z = Data::zeros(DType::I32, 2);
        let src = Data::I32(vec![1, 2, 3]);
        let e = z.copy_block(0, &src, 0..3).unwrap_err();
        assert_eq!(
            e.0,
            "cannot copy elements 0..3 of 3 i32 elements to 0.. of 2 i32 elements"
        );
        assert!(z.copy_element(1, &src, 3).is_err());
        let e = z.copy_element(0, &Data::U32(vec![1]), 0).unwrap_err();
        assert_eq!(e.0, "cannot copy u32 elements into i32 data");
        assert_eq!(z.as_i32(), Some(&[0, 0][..]));
    }

    #[test]
    fn gather_reads_sources_and_pads() {
        let d = Data::I32(vec![10, 20, 30]);
        let fill = Data::I32(vec![-1]);
        let g = d
            .gather(&[Some(2), None, Some(0), Some(2)], Some(&fill))
            .unwrap();
        assert_eq!(g.as_i32(), Some(&[30, -1, 10, 30][..]));
        for s in samples() {
            let g = s.gather(&[Some(1), Some(0)], None).unwrap();
            assert_eq!(g.dtype(), s.dtype());
            assert_eq!(g.element_text(0), s.element_text(1));
        }
        let e = d.gather(&[Some(3)], None).unwrap_err();
        assert_eq!(e.0, "gather: index 3 outside 3 i32 elements");
        let e = d.gather(&[None], None).unwrap_err();
        assert_eq!(
            e.0,
            "gather: a padded element needs a i32 fill value, got none"
        );
        let e = d.gather(&[None], Some(&Data::F32(vec![0.0]))).unwrap_err();
        assert_eq!(
            e.0,
            "gather: a padded element needs a i32 fill value, got 1 f32 elements"
        );
    }

    #[test]
    fn byte_views_are_the_elements_in_memory() {
        let d = Data::U32(vec![0x0403_0201, 0x0807_0605]);
        let want: Vec<u8> = [0x0403_0201u32, 0x0807_0605]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(d.as_bytes(), &want[..]);
        assert_eq!(Data::Bool(vec![true, false]).as_bytes(), &[1, 0]);
        assert_eq!(Data::F64(vec![1.0]).as_bytes(), &1.0f64.to_ne_bytes());
        for s in samples() {
            assert_eq!(s.as_bytes().len(), s.len() * s.dtype().byte_width());
            assert_eq!(s.as_ptr(), s.as_bytes().as_ptr());
        }
        let mut m = Data::F32(vec![0.0; 2]);
        let p = m.as_mut_ptr();
        // SAFETY: `p` points at the first of two f32s owned by `m`, not otherwise borrowed
        // while this write happens; 4-byte alignment holds since it came from a Vec<f32>.
        unsafe { (p as *mut f32).add(1).write(2.5) };
        assert_eq!(m.as_f32(), Some(&[0.0, 2.5][..]));
    }

    #[test]
    fn with_capacity_then_set_len_adopts_written_elements() {
        for dtype in DType::ALL {
            let mut d = Data::try_with_capacity(dtype, 3).unwrap();
            assert_eq!((d.dtype(), d.len()), (dtype, 0));
            let one = Data::splat(dtype, 1.0, 3);
            let p = d.as_mut_ptr();
            // SAFETY: `d` has room for 3 elements of `dtype` (3 * width bytes at `p`), `one`
            // holds 3 valid ones (bools are bytes 0 or 1), and the two do not overlap; after
            // the copy the 3 elements are initialized, so `set_len(3)` is sound.
            unsafe {
                std::ptr::copy_nonoverlapping(one.as_ptr(), p, 3 * dtype.byte_width());
                d.set_len(3);
            }
            assert!(d.bits_eq(&one));
        }
        let e = Data::try_with_capacity(DType::F64, usize::MAX / 4).unwrap_err();
        assert!(e.0.starts_with("cannot allocate "), "{}", e.0);
        assert!(e.0.ends_with(" elements of f64)"), "{}", e.0);
    }
}
