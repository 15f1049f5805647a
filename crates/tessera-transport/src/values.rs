//! The arithmetic of the copying collectives on host values, and the raw-buffer helpers the
//! in-place ones use. Every reduction goes over the members in group order, so every device
//! gets the same bits; the results match the interpreter's ops bit for bit
//! (`tests/oracle.rs`): `reduce` is a chain of `add`/`max`/`min` in the dtype,
//! `reduce_widened` the all-reduce's (f32 accumulated in f64, rounded once), `chunk` a
//! `slice`, `concat` a `concatenate`.

use std::ops::Range;

use tessera_ir::{DType, Data, Literal, ReduceKind, TensorType};

use crate::TransportError;

/// Runs `$body` with `$v` bound to the element vector of `$data`, for every element type.
macro_rules! each {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => $body,
            Data::F64($v) => $body,
            Data::I32($v) => $body,
            Data::U32($v) => $body,
            Data::Bool($v) => $body,
            Data::I64($v) => $body,
            Data::F16($v) => $body,
            Data::BF16($v) => $body,
        }
    };
}

/// Maximum that propagates NaN, as `lax.max`, with +0 above -0 (the interpreter's `fmax`).
fn fmax<T: FloatElem>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        x + y
    } else if y > x || (y == x && !y.is_sign_negative()) {
        y
    } else {
        x
    }
}

/// Minimum that propagates NaN, as `lax.min`, with -0 below +0 (the interpreter's `fmin`).
fn fmin<T: FloatElem>(x: T, y: T) -> T {
    if x.is_nan() || y.is_nan() {
        x + y
    } else if y < x || (y == x && y.is_sign_negative()) {
        y
    } else {
        x
    }
}

trait FloatElem: Copy + PartialOrd + std::ops::Add<Output = Self> {
    fn is_nan(self) -> bool;
    fn is_sign_negative(self) -> bool;
}

impl FloatElem for f32 {
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn is_sign_negative(self) -> bool {
        f32::is_sign_negative(self)
    }
}

impl FloatElem for f64 {
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn is_sign_negative(self) -> bool {
        f64::is_sign_negative(self)
    }
}

/// An element type the collectives add, max and min. `fold` is the dtype's own arithmetic
/// (the interpreter's binary ops); `Acc` is what an all-reduce accumulates in.
pub trait Elem: Copy {
    type Acc: Copy + Default;
    fn widen(self) -> Self::Acc;
    fn narrow(a: Self::Acc) -> Self;
    fn fold_wide(kind: ReduceKind, a: Self::Acc, b: Self) -> Self::Acc;
    fn fold(kind: ReduceKind, a: Self, b: Self) -> Self;
}

/// f32 accumulates in f64 and rounds once, as a sum to one value does in the kernels: the
/// devices' partial losses add up to the correctly rounded total. (Max and min are exact
/// either way.)
impl Elem for f32 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self as f64
    }
    fn narrow(a: f64) -> f32 {
        a as f32
    }
    fn fold_wide(kind: ReduceKind, a: f64, b: f32) -> f64 {
        f64::fold(kind, a, b as f64)
    }
    fn fold(kind: ReduceKind, a: f32, b: f32) -> f32 {
        match kind {
            ReduceKind::Sum => a + b,
            ReduceKind::Max => fmax(a, b),
            ReduceKind::Min => fmin(a, b),
        }
    }
}

impl Elem for f64 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self
    }
    fn narrow(a: f64) -> f64 {
        a
    }
    fn fold_wide(kind: ReduceKind, a: f64, b: f64) -> f64 {
        f64::fold(kind, a, b)
    }
    fn fold(kind: ReduceKind, a: f64, b: f64) -> f64 {
        match kind {
            ReduceKind::Sum => a + b,
            ReduceKind::Max => fmax(a, b),
            ReduceKind::Min => fmin(a, b),
        }
    }
}

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn narrow(a: $t) -> $t {
                a
            }
            fn fold_wide(kind: ReduceKind, a: $t, b: $t) -> $t {
                <$t as Elem>::fold(kind, a, b)
            }
            fn fold(kind: ReduceKind, a: $t, b: $t) -> $t {
                match kind {
                    ReduceKind::Sum => a.wrapping_add(b),
                    ReduceKind::Max => a.max(b),
                    ReduceKind::Min => a.min(b),
                }
            }
        }
    };
}
int_elem!(i32);
int_elem!(u32);
int_elem!(i64);

/// f16 and bf16 compute in f32 and round each result back, as every op on them does: a fold
/// is f32's rounded to the narrow type, and an all-reduce accumulates as f32's does (in f64)
/// and rounds to f32, then to the narrow type (the f32 all-reduce between two converts).
macro_rules! narrow_elem {
    ($t:ty) => {
        impl Elem for $t {
            type Acc = f64;
            fn widen(self) -> f64 {
                self.to_f64()
            }
            fn narrow(a: f64) -> $t {
                <$t>::from_f32(a as f32)
            }
            fn fold_wide(kind: ReduceKind, a: f64, b: $t) -> f64 {
                f64::fold(kind, a, b.to_f64())
            }
            fn fold(kind: ReduceKind, a: $t, b: $t) -> $t {
                <$t>::from_f32(f32::fold(kind, a.to_f32(), b.to_f32()))
            }
        }
    };
}
narrow_elem!(tessera_ir::f16);
narrow_elem!(tessera_ir::bf16);

/// Elements reduced at a time: the f64 accumulator stays in L1.
const BLOCK: usize = 1024;

/// Reduces `n` elements from each of `srcs`, in member order, into `dst`, a block at a time,
/// accumulating in `T::Acc`.
///
/// # Safety
/// Every `srcs[i]` must be the aligned address of `n` readable `T`s and `dst` writable for `n`; no one
/// writes them meanwhile except this call. `dst` may equal one of `srcs` (each block is read
/// whole before it is written).
unsafe fn reduce_into<T: Elem>(kind: ReduceKind, srcs: &[*const u8], dst: *mut T, n: usize) {
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        // SAFETY: `start + len <= n`, so every access is in bounds (see the contract).
        unsafe {
            let first = std::slice::from_raw_parts((srcs[0] as *const T).add(start), len);
            for (a, &b) in acc.iter_mut().zip(first) {
                *a = b.widen();
            }
            for &s in &srcs[1..] {
                let src = std::slice::from_raw_parts((s as *const T).add(start), len);
                for (a, &b) in acc.iter_mut().zip(src) {
                    *a = T::fold_wide(kind, *a, b);
                }
            }
            // The source slices are dead: writing `dst` (perhaps one of them) aliases nothing.
            let out = std::slice::from_raw_parts_mut(dst.add(start), len);
            for (o, &a) in out.iter_mut().zip(&acc[..len]) {
                *o = T::narrow(a);
            }
        }
        start += len;
    }
}

/// `reduce_into` for the element type `dtype`, on untyped addresses; `false` for bool, which
/// has no reduction.
///
/// # Safety
/// As `reduce_into`, with the addresses aligned for `dtype`.
pub unsafe fn reduce_raw(
    kind: ReduceKind,
    dtype: DType,
    srcs: &[*const u8],
    dst: *mut u8,
    n: usize,
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => reduce_into::<f32>(kind, srcs, dst as *mut f32, n),
            DType::F64 => reduce_into::<f64>(kind, srcs, dst as *mut f64, n),
            DType::I32 => reduce_into::<i32>(kind, srcs, dst as *mut i32, n),
            DType::U32 => reduce_into::<u32>(kind, srcs, dst as *mut u32, n),
            DType::I64 => reduce_into::<i64>(kind, srcs, dst as *mut i64, n),
            DType::F16 => {
                reduce_into::<tessera_ir::f16>(kind, srcs, dst as *mut tessera_ir::f16, n)
            }
            DType::BF16 => {
                reduce_into::<tessera_ir::bf16>(kind, srcs, dst as *mut tessera_ir::bf16, n)
            }
            DType::Bool => return false,
        }
    }
    true
}

fn no_bool(op: &'static str, dtype: DType) -> Result<(), TransportError> {
    if dtype == DType::Bool {
        return Err(TransportError::Invalid {
            op,
            message: "reduction of bool".into(),
        });
    }
    Ok(())
}

fn same_types(op: &'static str, values: &[&Literal]) -> Result<(), TransportError> {
    let first = &values[0].ty;
    match values.iter().find(|v| &v.ty != first) {
        Some(v) => Err(TransportError::Invalid {
            op,
            message: format!("the members' operands differ: {first} and {}", v.ty),
        }),
        None => Ok(()),
    }
}

/// Elements `range` of the all-reduce of `values` (all of one type): f32 accumulated in f64
/// and rounded once, in member order.
pub fn reduce_widened(
    kind: ReduceKind,
    values: &[&Literal],
    range: Range<usize>,
) -> Result<Data, TransportError> {
    same_types("all_reduce", values)?;
    let dtype = values[0].ty.dtype;
    no_bool("all_reduce", dtype)?;
    if range.end > values[0].data.len() || range.start > range.end {
        return Err(TransportError::Invalid {
            op: "all_reduce",
            message: format!("elements {range:?} of a {}", values[0].ty),
        });
    }
    let mut out = Data::zeros(dtype, range.len());
    if range.is_empty() {
        return Ok(out);
    }
    let srcs: Vec<*const u8> = values
        .iter()
        // SAFETY: `range.start <= len` (checked above), so the offset stays in the buffer.
        .map(|v| unsafe { data_ptr(&v.data).add(range.start * dtype.byte_width()) })
        .collect();
    let dst = data_ptr_mut(&mut out);
    // SAFETY: every value holds at least `range.end` elements of `dtype` (one type, checked
    // above), `out` holds `range.len()`, and they are distinct allocations.
    let reduced = unsafe { reduce_raw(kind, dtype, &srcs, dst, range.len()) };
    debug_assert!(reduced, "bool was refused above");
    Ok(out)
}

/// The elementwise `kind` of `values` in the dtype's own arithmetic, folded left to right (as
/// a chain of the interpreter's `add`, `max` or `min`).
pub fn reduce(kind: ReduceKind, values: &[&Literal]) -> Result<Literal, TransportError> {
    same_types("reduce_scatter", values)?;
    no_bool("reduce_scatter", values[0].ty.dtype)?;
    fn fold<T: Elem>(kind: ReduceKind, acc: &mut [T], v: &[T]) {
        for (a, &b) in acc.iter_mut().zip(v) {
            *a = T::fold(kind, *a, b);
        }
    }
    let mut acc = values[0].clone();
    for v in &values[1..] {
        match (&mut acc.data, &v.data) {
            (Data::F32(a), Data::F32(b)) => fold(kind, a, b),
            (Data::F64(a), Data::F64(b)) => fold(kind, a, b),
            (Data::I32(a), Data::I32(b)) => fold(kind, a, b),
            (Data::U32(a), Data::U32(b)) => fold(kind, a, b),
            (Data::I64(a), Data::I64(b)) => fold(kind, a, b),
            (Data::F16(a), Data::F16(b)) => fold(kind, a, b),
            (Data::BF16(a), Data::BF16(b)) => fold(kind, a, b),
            (Data::Bool(_), _)
            | (Data::F32(_), _)
            | (Data::F64(_), _)
            | (Data::I32(_), _)
            | (Data::U32(_), _)
            | (Data::I64(_), _)
            | (Data::F16(_), _)
            | (Data::BF16(_), _) => unreachable!("one numeric type (checked above)"),
        }
    }
    Ok(acc)
}

/// The sizes of the dims before `dim`, of `dim`, and after it.
fn split_at(ty: &TensorType, dim: usize) -> (usize, usize, usize) {
    let dims = ty.dims();
    (
        dims[..dim].iter().product(),
        dims[dim],
        dims[dim + 1..].iter().product(),
    )
}

fn check_dim(op: &'static str, ty: &TensorType, dim: usize) -> Result<(), TransportError> {
    if dim >= ty.rank() {
        return Err(TransportError::Invalid {
            op,
            message: format!("dim {dim} of a {ty}"),
        });
    }
    Ok(())
}

/// Chunk `k` of `n` along `dim` (as `slice`).
pub fn chunk(
    op: &'static str,
    x: &Literal,
    dim: usize,
    k: usize,
    n: usize,
) -> Result<Literal, TransportError> {
    check_dim(op, &x.ty, dim)?;
    let (outer, d, inner) = split_at(&x.ty, dim);
    if n == 0 || !d.is_multiple_of(n) || k >= n {
        return Err(TransportError::Invalid {
            op,
            message: format!("chunk {k} of {n} along dim {dim} of a {}", x.ty),
        });
    }
    let size = d / n;
    let mut dims = x.ty.dims().to_vec();
    dims[dim] = size;
    let run = size * inner;
    let data = each!(&x.data, v => {
        let mut out = Vec::with_capacity(outer * run);
        for o in 0..outer {
            let at = o * d * inner + k * run;
            out.extend_from_slice(&v[at..at + run]);
        }
        Owned::from(out).0
    });
    Ok(Literal {
        ty: TensorType::new(x.ty.dtype, dims),
        data,
    })
}

/// `parts` (one dtype, equal dims but `dim`) concatenated along `dim` (as `concatenate`).
pub fn concat(op: &'static str, parts: &[&Literal], dim: usize) -> Result<Literal, TransportError> {
    let first = &parts[0].ty;
    check_dim(op, first, dim)?;
    let fits = |t: &TensorType| {
        t.dtype == first.dtype
            && t.rank() == first.rank()
            && (0..t.rank()).all(|i| i == dim || t.dims()[i] == first.dims()[i])
    };
    if let Some(p) = parts.iter().find(|p| !fits(&p.ty)) {
        return Err(TransportError::Invalid {
            op,
            message: format!("cannot concatenate a {first} and a {} along {dim}", p.ty),
        });
    }
    let (outer, _, inner) = split_at(first, dim);
    let mut dims = first.dims().to_vec();
    dims[dim] = parts.iter().map(|p| p.ty.dims()[dim]).sum();
    let total: usize = parts.iter().map(|p| p.data.len()).sum();
    let mut data = Data::zeros(first.dtype, 0);
    each!(&mut data, out => {
        out.reserve_exact(total);
        for o in 0..outer {
            for p in parts {
                let run = p.ty.dims()[dim] * inner;
                let from = typed(&p.data);
                out.extend_from_slice(&from[o * run..(o + 1) * run]);
            }
        }
    });
    Ok(Literal {
        ty: TensorType::new(first.dtype, dims),
        data,
    })
}

/// The element vector of `data` as the type of the `each!` arm it is used in.
trait Typed<T> {
    fn typed(&self) -> &[T];
}

macro_rules! typed_impl {
    ($t:ty, $variant:ident) => {
        impl Typed<$t> for Data {
            fn typed(&self) -> &[$t] {
                match self {
                    Data::$variant(v) => v,
                    _ => unreachable!("one dtype (checked by the caller)"),
                }
            }
        }
        impl From<Vec<$t>> for Owned {
            fn from(v: Vec<$t>) -> Owned {
                Owned(Data::$variant(v))
            }
        }
    };
}

/// A `Data` built by an `each!` arm.
struct Owned(Data);

typed_impl!(f32, F32);
typed_impl!(f64, F64);
typed_impl!(i32, I32);
typed_impl!(u32, U32);
typed_impl!(bool, Bool);
typed_impl!(i64, I64);
typed_impl!(tessera_ir::f16, F16);
typed_impl!(tessera_ir::bf16, BF16);

fn typed<T>(d: &Data) -> &[T]
where
    Data: Typed<T>,
{
    d.typed()
}

/// Elements `range` of `data`.
pub fn chunk_elements(data: &Data, range: Range<usize>) -> Data {
    each!(data, v => Owned::from(v[range].to_vec()).0)
}

/// Member `me`'s all-to-all result from every member's value: chunk `me` of `n` along
/// `split_dim` of each, concatenated along `concat_dim`.
pub fn all_to_all(
    values: &[&Literal],
    split_dim: usize,
    concat_dim: usize,
    me: usize,
) -> Result<Literal, TransportError> {
    let n = values.len();
    let parts: Vec<Literal> = values
        .iter()
        .map(|v| chunk("all_to_all", v, split_dim, me, n))
        .collect::<Result<_, _>>()?;
    let refs: Vec<&Literal> = parts.iter().collect();
    concat("all_to_all", &refs, concat_dim)
}

/// Member `me`'s collective-permute result: the value of the member that sends to it, or
/// zeros.
pub fn permute(values: &[&Literal], pairs: &[(usize, usize)], me: usize) -> Literal {
    match pairs.iter().find(|(_, d)| *d == me) {
        Some(&(s, _)) => values[s].clone(),
        None => Literal::zeros(&values[me].ty),
    }
}

/// The address of the first element of `data`.
pub fn data_ptr(data: &Data) -> *const u8 {
    each!(data, v => v.as_ptr() as *const u8)
}

/// The address of the first element of `data`, for writing.
pub fn data_ptr_mut(data: &mut Data) -> *mut u8 {
    each!(data, v => v.as_mut_ptr() as *mut u8)
}

/// Copies `ty.numel()` elements of type `ty.dtype` from `p` into a new literal.
///
/// # Safety
/// `p` must point to that many initialized elements of that type (bools as bytes 0 or 1).
pub unsafe fn literal_from_raw(ty: &TensorType, p: *const u8) -> Literal {
    let n = ty.numel();
    // SAFETY: the caller guarantees `n` valid elements at `p`; each slice is copied at once.
    let data = unsafe {
        match ty.dtype {
            DType::F32 => Data::F32(std::slice::from_raw_parts(p as *const f32, n).to_vec()),
            DType::F64 => Data::F64(std::slice::from_raw_parts(p as *const f64, n).to_vec()),
            DType::I32 => Data::I32(std::slice::from_raw_parts(p as *const i32, n).to_vec()),
            DType::U32 => Data::U32(std::slice::from_raw_parts(p as *const u32, n).to_vec()),
            DType::Bool => Data::Bool(std::slice::from_raw_parts(p as *const bool, n).to_vec()),
            DType::I64 => Data::I64(std::slice::from_raw_parts(p as *const i64, n).to_vec()),
            DType::F16 => {
                Data::F16(std::slice::from_raw_parts(p as *const tessera_ir::f16, n).to_vec())
            }
            DType::BF16 => {
                Data::BF16(std::slice::from_raw_parts(p as *const tessera_ir::bf16, n).to_vec())
            }
        }
    };
    Literal {
        ty: ty.clone(),
        data,
    }
}

/// Copies a `rows x cols` strided view at `src` (element strides `s`) into the view at `dst`
/// (strides `d`): whole rows or whole columns when both sides are contiguous that way, else
/// element by element.
///
/// # Safety
/// Both views must be valid for `size`-byte elements and not overlap.
pub unsafe fn copy_view(
    (src, s): (*const u8, [isize; 2]),
    (dst, d): (*mut u8, [isize; 2]),
    (rows, cols, size): (usize, usize, usize),
) {
    let z = size as isize;
    // SAFETY: every address is inside one of the two views (the caller's contract).
    unsafe {
        if s[1] == 1 && d[1] == 1 {
            for r in 0..rows as isize {
                std::ptr::copy_nonoverlapping(
                    src.offset(r * s[0] * z),
                    dst.offset(r * d[0] * z),
                    cols * size,
                );
            }
        } else if s[0] == 1 && d[0] == 1 {
            for c in 0..cols as isize {
                std::ptr::copy_nonoverlapping(
                    src.offset(c * s[1] * z),
                    dst.offset(c * d[1] * z),
                    rows * size,
                );
            }
        } else {
            for r in 0..rows as isize {
                for c in 0..cols as isize {
                    let (from, to) = (
                        src.offset((r * s[0] + c * s[1]) * z),
                        dst.offset((r * d[0] + c * d[1]) * z),
                    );
                    std::ptr::copy_nonoverlapping(from, to, size);
                }
            }
        }
    }
}

/// Appends `x`'s elements to `out` as bytes, in memory order (bools as 0 or 1): the form a
/// value crosses between processes in (`process`).
pub fn append_bytes(x: &Literal, out: &mut Vec<u8>) {
    let n = x.ty.dtype.byte_width() * x.data.len();
    // SAFETY: `data_ptr` points to `x.data.len()` initialized elements of the dtype, `n`
    // bytes, and every element type has no padding (bools are one byte, 0 or 1).
    out.extend_from_slice(unsafe { std::slice::from_raw_parts(data_ptr(&x.data), n) });
}

/// A value of type `ty` from the bytes `append_bytes` wrote (`None` when their length is not
/// the type's size). Any bytes give a valid value: a bool is `true` for any nonzero byte.
pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Option<Literal> {
    let n = ty.numel();
    if bytes.len() != n.checked_mul(ty.dtype.byte_width())? {
        return None;
    }
    let data = if ty.dtype == DType::Bool {
        Data::Bool(bytes.iter().map(|&b| b != 0).collect())
    } else {
        let mut data = Data::zeros(ty.dtype, n);
        // SAFETY: `data` holds `n` elements of the dtype, `bytes.len()` bytes (checked above),
        // in a separate allocation; every bit pattern is a valid number of these types.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), data_ptr_mut(&mut data), bytes.len())
        };
        data
    };
    Some(Literal {
        ty: ty.clone(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A column-major 3x2 view copied into a row-major one, and a strided one element-wise.
    #[test]
    fn views_copy_by_lines_or_elements() {
        let src: Vec<f32> = (0..6).map(|i| i as f32).collect(); // column-major 3x2
        let mut dst = vec![0f32; 6];
        // SAFETY: both vectors hold the 3x2 views of 4-byte elements described.
        unsafe {
            copy_view(
                (src.as_ptr() as *const u8, [1, 3]),
                (dst.as_mut_ptr() as *mut u8, [2, 1]),
                (3, 2, 4),
            )
        };
        assert_eq!(dst, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let mut back = vec![0f32; 6];
        // SAFETY: as above.
        unsafe {
            copy_view(
                (dst.as_ptr() as *const u8, [2, 1]),
                (back.as_mut_ptr() as *mut u8, [1, 3]),
                (3, 2, 4),
            )
        };
        assert_eq!(back, src);
    }

    #[test]
    fn bad_operands_are_errors() {
        let x = Literal::new([4], Data::F32(vec![1.0; 4])).unwrap();
        let e = chunk("all_to_all", &x, 0, 0, 3).unwrap_err().to_string();
        assert!(
            e.contains("all_to_all") && e.contains("chunk 0 of 3"),
            "{e}"
        );
        let b = Literal::new([2], Data::Bool(vec![true, false])).unwrap();
        let e = reduce(ReduceKind::Sum, &[&b, &b]).unwrap_err().to_string();
        assert_eq!(e, "reduce_scatter: reduction of bool");
        let y = Literal::new([2], Data::F32(vec![1.0; 2])).unwrap();
        let e = reduce_widened(ReduceKind::Sum, &[&x, &y], 0..2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("operands differ"), "{e}");
    }

    #[test]
    fn values_cross_as_bytes_and_back() {
        let x = Literal::new([3], Data::F32(vec![1.5, -0.0, f32::NAN])).unwrap();
        let mut bytes = vec![7];
        append_bytes(&x, &mut bytes);
        assert_eq!(bytes.len(), 13);
        let back = from_bytes(&x.ty, &bytes[1..]).unwrap();
        assert!(back.data.bits_eq(&x.data));
        assert!(
            from_bytes(&x.ty, &bytes).is_none(),
            "a wrong length is refused"
        );
        let b = TensorType::new(DType::Bool, vec![3]);
        let bools = from_bytes(&b, &[0, 1, 9]).unwrap();
        assert!(bools.data.bits_eq(&Data::Bool(vec![false, true, true])));
    }
}
