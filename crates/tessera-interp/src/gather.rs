//! The kernels of `gather` and `scatter`, element by element from the index maps of
//! `tessera_ir::gather` (modes and the order of scatter updates are stated there).

use tessera_ir::{Data, GatherDims, Literal, ScatterDims, ScatterKind, TensorType};

use crate::scalar::{fmax, fmin};
use crate::{ravel, unravel};

/// Reads element `i` of integer indices as an `i64` (every i32, u32 and i64 value is exact).
fn index_reader(indices: &Literal) -> impl Fn(usize) -> i64 + '_ {
    move |i| match &indices.data {
        Data::I32(v) => i64::from(v[i]),
        Data::U32(v) => i64::from(v[i]),
        Data::I64(v) => v[i],
        // The type rule admits integer indices only.
        Data::F32(_) | Data::F64(_) | Data::Bool(_) | Data::F16(_) | Data::BF16(_) => 0,
    }
}

pub(crate) fn gather(
    d: &GatherDims,
    operand: &Literal,
    indices: &Literal,
    ty: &TensorType,
) -> Data {
    let index = index_reader(indices);
    let strides = operand.ty.shape.strides();
    let n = ty.numel();
    let fill = Data::splat(ty.dtype, d.fill, 1);
    let mut out = Data::zeros(ty.dtype, n);
    for f in 0..n {
        let at = unravel(f, ty.dims());
        let copied = match d.source(operand.ty.dims(), indices.ty.dims(), &index, &at) {
            Some(src) => out.copy_element(f, &operand.data, ravel(&src, &strides)),
            None => out.copy_element(f, &fill, 0),
        };
        copied.expect("gather's result has the operand's dtype");
    }
    out
}

fn combine<T: Copy>(v: &mut [T], upd: &[T], pairs: &[(usize, usize)], f: impl Fn(T, T) -> T) {
    for &(t, u) in pairs {
        v[t] = f(v[t], upd[u]);
    }
}

pub(crate) fn scatter(
    d: &ScatterDims,
    operand: &Literal,
    indices: &Literal,
    updates: &Literal,
) -> Data {
    let index = index_reader(indices);
    let strides = operand.ty.shape.strides();
    let window = d.window_sizes(operand.ty.rank(), updates.ty.dims());
    // (operand element, update element) in row-major order of the updates: the order updates
    // apply in.
    let pairs: Vec<(usize, usize)> = (0..updates.ty.numel())
        .filter_map(|u| {
            let at = unravel(u, updates.ty.dims());
            d.target(operand.ty.dims(), indices.ty.dims(), &window, &index, &at)
                .map(|t| (ravel(&t, &strides), u))
        })
        .collect();
    let mut out = operand.data.clone();
    macro_rules! num {
        ($v:expr, $u:expr, $add:expr, $mul:expr, $min:expr, $max:expr) => {
            match d.kind {
                ScatterKind::Set => combine($v, $u, &pairs, |_, b| b),
                ScatterKind::Add => combine($v, $u, &pairs, $add),
                ScatterKind::Mul => combine($v, $u, &pairs, $mul),
                ScatterKind::Min => combine($v, $u, &pairs, $min),
                ScatterKind::Max => combine($v, $u, &pairs, $max),
            }
        };
    }
    match (&mut out, &updates.data) {
        (Data::F32(v), Data::F32(u)) => {
            num!(v, u, |a, b| a + b, |a, b| a * b, fmin, fmax)
        }
        (Data::F64(v), Data::F64(u)) => {
            num!(v, u, |a, b| a + b, |a, b| a * b, fmin, fmax)
        }
        (Data::I32(v), Data::I32(u)) => num!(
            v,
            u,
            i32::wrapping_add,
            i32::wrapping_mul,
            |a: i32, b| a.min(b),
            |a: i32, b| a.max(b)
        ),
        (Data::U32(v), Data::U32(u)) => num!(
            v,
            u,
            u32::wrapping_add,
            u32::wrapping_mul,
            |a: u32, b| a.min(b),
            |a: u32, b| a.max(b)
        ),
        // Add and mul of bool are type errors; min is `and`, max is `or`.
        (Data::Bool(v), Data::Bool(u)) => num!(
            v,
            u,
            |a: bool, b| a | b,
            |a: bool, b| a & b,
            |a: bool, b| a & b,
            |a: bool, b| a | b
        ),
        (Data::I64(v), Data::I64(u)) => num!(
            v,
            u,
            i64::wrapping_add,
            i64::wrapping_mul,
            |a: i64, b| a.min(b),
            |a: i64, b| a.max(b)
        ),
        // f16 and bf16 compute in f32 (`in_f32`); the type rule makes the updates' dtype the
        // operand's, so the other pairs do not occur.
        (Data::F16(_) | Data::BF16(_), _)
        | (Data::F32(_), _)
        | (Data::F64(_), _)
        | (Data::I32(_), _)
        | (Data::U32(_), _)
        | (Data::Bool(_), _)
        | (Data::I64(_), _) => {}
    }
    out
}
