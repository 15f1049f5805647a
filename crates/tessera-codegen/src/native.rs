//! Native steps: ops the schedule runs as Rust kernels over whole buffers instead of generated
//! loop nests, as it runs GEMMs through a library: `sort` (a stable bottom-up merge sort of each
//! lane's permutation, insertion sort for runs of up to 8) and the cumulative ops (one pass per
//! lane). Each reads its operand buffers at their strides along the lane, so every shape is
//! handled, zero-size ones included (no lane, nothing written).

use std::cmp::Ordering;

use tessera_interp::scalar::{fmax, fmin};
use tessera_ir::sorting::float_sort_cmp;
use tessera_ir::{CumulativeKind, Data, Literal, Op, TensorType};

/// The lanes along `dim` of `dims`: the flat offset of each lane's first element, and the
/// stride between its elements.
fn lanes(dims: &[usize], dim: usize) -> (Vec<usize>, usize) {
    let stride: usize = dims[dim + 1..].iter().product();
    let n = dims[dim];
    let outer: usize = dims[..dim].iter().product();
    let mut bases = Vec::new();
    if n == 0 || stride == 0 {
        return (bases, stride);
    }
    for o in 0..outer {
        for inner in 0..stride {
            bases.push(o * n * stride + inner);
        }
    }
    (bases, stride)
}

/// Element `i` against element `j` of one key, in the sort order of `tessera_ir::sorting`.
fn key_cmp(d: &Data, i: usize, j: usize) -> Ordering {
    match d {
        Data::F32(v) => float_sort_cmp(v[i] as f64, v[j] as f64),
        Data::F64(v) => float_sort_cmp(v[i], v[j]),
        Data::I32(v) => v[i].cmp(&v[j]),
        Data::U32(v) => v[i].cmp(&v[j]),
        Data::Bool(v) => v[i].cmp(&v[j]),
        Data::I64(v) => v[i].cmp(&v[j]),
        Data::F16(v) => float_sort_cmp(v[i].to_f64(), v[j].to_f64()),
        Data::BF16(v) => float_sort_cmp(v[i].to_f64(), v[j].to_f64()),
    }
}

/// Sorts `perm` (positions in a lane) stably by `less_eq`-free comparator `cmp`: insertion
/// sort of runs of 8, then bottom-up merges through `tmp`.
fn merge_sort(perm: &mut Vec<usize>, tmp: &mut Vec<usize>, cmp: &dyn Fn(usize, usize) -> Ordering) {
    let n = perm.len();
    const RUN: usize = 8;
    for start in (0..n).step_by(RUN) {
        let end = (start + RUN).min(n);
        for i in start + 1..end {
            let mut j = i;
            // Moves left only past strictly greater elements: stable.
            while j > start && cmp(perm[j - 1], perm[j]) == Ordering::Greater {
                perm.swap(j - 1, j);
                j -= 1;
            }
        }
    }
    tmp.clear();
    tmp.resize(n, 0);
    let mut width = RUN;
    while width < n {
        let mut lo = 0;
        while lo < n {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut a, mut b, mut k) = (lo, mid, lo);
            while a < mid && b < hi {
                // Ties take the left run first: stable.
                if cmp(perm[b], perm[a]) == Ordering::Less {
                    tmp[k] = perm[b];
                    b += 1;
                } else {
                    tmp[k] = perm[a];
                    a += 1;
                }
                k += 1;
            }
            tmp[k..k + (mid - a)].copy_from_slice(&perm[a..mid]);
            k += mid - a;
            tmp[k..k + (hi - b)].copy_from_slice(&perm[b..hi]);
            lo = hi;
        }
        std::mem::swap(perm, tmp);
        width *= 2;
    }
}

fn sort(args: &[Literal], dim: usize, num_keys: usize, output: usize) -> Data {
    let dims = args[0].ty.dims();
    let n = dims[dim];
    let (bases, stride) = lanes(dims, dim);
    let src = &args[output].data;
    let mut sources: Vec<Option<usize>> = (0..src.len()).map(Some).collect();
    let (mut perm, mut tmp) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for base in bases {
        perm.clear();
        perm.extend(0..n);
        let cmp = |a: usize, b: usize| {
            let (i, j) = (base + a * stride, base + b * stride);
            args[..num_keys]
                .iter()
                .map(|k| key_cmp(&k.data, i, j))
                .find(|o| *o != Ordering::Equal)
                .unwrap_or(Ordering::Equal)
        };
        merge_sort(&mut perm, &mut tmp, &cmp);
        for (i, &p) in perm.iter().enumerate() {
            sources[base + i * stride] = Some(base + p * stride);
        }
    }
    src.gather(&sources, None)
        .expect("a permutation of a lane stays in the buffer")
}

fn scan_lanes<T: Copy>(
    v: &mut [T],
    dims: &[usize],
    axis: usize,
    reverse: bool,
    f: impl Fn(T, T) -> T,
) {
    let n = dims[axis];
    let (bases, stride) = lanes(dims, axis);
    for base in bases {
        let at = |k: usize| base + stride * if reverse { n - 1 - k } else { k };
        let mut acc = v[at(0)];
        for k in 1..n {
            acc = f(acc, v[at(k)]);
            v[at(k)] = acc;
        }
    }
}

fn cumulative(kind: CumulativeKind, axis: usize, reverse: bool, x: &Literal) -> Data {
    use CumulativeKind::*;
    let dims = x.ty.dims();
    let mut data = x.data.clone();
    match &mut data {
        Data::F32(v) => scan_lanes(v, dims, axis, reverse, |a, b| match kind {
            Sum => a + b,
            Prod => a * b,
            Max => fmax(a, b),
            Min => fmin(a, b),
        }),
        Data::F64(v) => scan_lanes(v, dims, axis, reverse, |a, b| match kind {
            Sum => a + b,
            Prod => a * b,
            Max => fmax(a, b),
            Min => fmin(a, b),
        }),
        Data::I32(v) => scan_lanes(v, dims, axis, reverse, |a: i32, b| match kind {
            Sum => a.wrapping_add(b),
            Prod => a.wrapping_mul(b),
            Max => a.max(b),
            Min => a.min(b),
        }),
        Data::U32(v) => scan_lanes(v, dims, axis, reverse, |a: u32, b| match kind {
            Sum => a.wrapping_add(b),
            Prod => a.wrapping_mul(b),
            Max => a.max(b),
            Min => a.min(b),
        }),
        Data::I64(v) => scan_lanes(v, dims, axis, reverse, |a: i64, b| match kind {
            Sum => a.wrapping_add(b),
            Prod => a.wrapping_mul(b),
            Max => a.max(b),
            Min => a.min(b),
        }),
        // The type rule rejects bool; narrow.rs computes f16 and bf16 in f32.
        Data::Bool(_) | Data::F16(_) | Data::BF16(_) => {}
    }
    data
}

/// Runs native op `op` on its operand values; the result has type `out`.
pub(crate) fn run(op: &Op, args: &[Literal], out: &TensorType) -> Result<Data, String> {
    let data = match op {
        Op::Sort {
            dim,
            num_keys,
            output,
        } => sort(args, *dim, *num_keys, *output),
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => cumulative(*kind, *axis, *reverse, &args[0]),
        // tidy: allow-wildcard(fusion makes native steps of sort and cumulative only; any other op here is a planner bug reported as an error)
        other => return Err(format!("{} is not a native step", other.name())),
    };
    if data.len() != out.numel() || data.dtype() != out.dtype {
        return Err(format!(
            "{}: native kernel produced the wrong type",
            op.name()
        ));
    }
    Ok(data)
}
