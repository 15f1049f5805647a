//! Native steps: ops the schedule runs as Rust kernels over whole buffers instead of generated
//! loop nests, as it runs GEMMs through a library and as XLA:CPU calls a runtime sort: `sort`
//! (a stable bottom-up merge sort of each lane's permutation, insertion sort for runs of up to
//! 8). It reads its operand buffers at their strides along the lane, so every shape is handled,
//! zero-size ones included (no lane, nothing written). (The cumulative ops are loop nests:
//! `kernel::Scan`. A concatenate of whole blocks is a native step too, which
//! `Executable::run_native` copies without coming here.)

use std::cmp::Ordering;

use tessera_ir::sorting::float_sort_cmp;
use tessera_ir::{Data, Literal, Op, TensorType};

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

/// Runs native op `op` on its operand values; the result has type `out`.
pub(crate) fn run(op: &Op, args: &[Literal], out: &TensorType) -> Result<Data, String> {
    let data = match op {
        Op::Sort {
            dim,
            num_keys,
            output,
        } => sort(args, *dim, *num_keys, *output),
        // tidy: allow-wildcard(fusion makes native steps of sort and of block concatenates, which exec.rs copies itself; any other op here is a planner bug reported as an error)
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
