//! The reference interpreter of Tessera IR, global or per-device: plainly written, one kernel per
//! op, every index computed from first principles. It is the oracle of every numeric test and the
//! baseline of the compiled-vs-interpreted benchmarks.
//!
//! Consumes a verified `Graph` and input `Literal`s; produces the output `Literal`s. Collectives
//! are delegated to a transport (`tessera_transport::Collectives`): `SingleDevice` (every group
//! has one member), or the runtime's shared-memory transport for sharded programs.

pub mod conv;
pub mod elem;
mod gather;
pub mod scalar;
mod sorting;

use std::collections::HashMap;

use tessera_ir::{
    BinaryOp, CompareOp, DType, Data, DotDims, Graph, Literal, NodeId, Op, ReduceKind, RegionOp,
    Shape, TensorType, UnaryOp, bf16, f16,
};

use scalar::{Float, Int, bool_binary, bool_unary, compare, fmax, fmin};

/// The transport the interpreter runs collectives through; `run_with` takes any.
pub use tessera_transport::{Collectives, SingleDevice, TransportError};

/// Why an interpretation failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("input {index}: expected {expected}, got {got}")]
    InputType {
        index: usize,
        expected: TensorType,
        got: TensorType,
    },
    #[error("expected {expected} inputs, got {got}")]
    InputCount { expected: usize, got: usize },
    #[error("{op}: {message}")]
    Op { op: String, message: String },
    #[error("the graph to run is malformed: {0}")]
    Malformed(#[from] tessera_ir::VerifyError),
    /// A collective failed (`tessera_transport`).
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Runs `g` on one device.
pub fn run(g: &Graph, inputs: &[Literal]) -> Result<Vec<Literal>, InterpError> {
    let refs: Vec<&Literal> = inputs.iter().collect();
    run_with(g, &refs, &SingleDevice)
}

/// Runs `g` with the given transport for its collectives. Values are dropped after their last
/// use, so memory follows the live set.
pub fn run_with(
    g: &Graph,
    inputs: &[&Literal],
    collectives: &dyn Collectives,
) -> Result<Vec<Literal>, InterpError> {
    tessera_ir::verify(g)?;
    run_verified(g, inputs, collectives)
}

/// `run_with` on a graph already verified (a region's body, run once per iteration).
fn run_verified(
    g: &Graph,
    inputs: &[&Literal],
    collectives: &dyn Collectives,
) -> Result<Vec<Literal>, InterpError> {
    if inputs.len() != g.params().len() {
        return Err(InterpError::InputCount {
            expected: g.params().len(),
            got: inputs.len(),
        });
    }
    for (index, (&p, x)) in g.params().iter().zip(inputs).enumerate() {
        if g.ty(p) != &x.ty {
            return Err(InterpError::InputType {
                index,
                expected: g.ty(p).clone(),
                got: x.ty.clone(),
            });
        }
    }
    let order = g.try_topo_order().ok_or_else(|| InterpError::Op {
        op: "graph".into(),
        message: "the graph has a cycle".into(),
    })?;
    let mut remaining: HashMap<NodeId, usize> = HashMap::new();
    for &id in &order {
        for o in g.operands(id) {
            *remaining.entry(o).or_default() += 1;
        }
    }
    let mut values: HashMap<NodeId, Literal> = HashMap::new();
    // The results of each region node, read by its `get_result`s.
    let mut results: HashMap<NodeId, Vec<Literal>> = HashMap::new();
    for &id in &order {
        let node = g.node(id);
        let operands = g.operands(id);
        let value = if let Op::Parameter(i) = &node.op {
            inputs[*i].clone()
        } else if let Op::Region(r) = &node.op {
            let args: Vec<&Literal> = operands.iter().map(|o| &values[o]).collect();
            results.insert(id, region_verified(r, &args, collectives)?);
            Literal::zeros(&node.ty)
        } else if let Op::GetResult { index, .. } = &node.op {
            let region = operands[0];
            results
                .get(&region)
                .and_then(|r| r.get(*index))
                .cloned()
                .ok_or_else(|| op_error(&node.op, "reads a region that has not run"))?
        } else if let Op::Collective(op) = &node.op {
            let mesh = g.mesh.as_ref().ok_or_else(|| InterpError::Op {
                op: op.name().into(),
                message: "collective in a graph without a mesh".into(),
            })?;
            let input = operands.first().map(|o| &values[o]);
            tessera_transport::run(collectives, op, mesh, input, &node.ty)?
        } else {
            let args: Vec<&Literal> = operands.iter().map(|o| &values[o]).collect();
            eval_op(&node.op, &args, &node.ty)?
        };
        for o in operands {
            let r = remaining.get_mut(&o).expect("operand counted");
            *r -= 1;
            if *r == 0 && !g.outputs().contains(&o) {
                values.remove(&o);
            }
        }
        values.insert(id, value);
    }
    Ok(g.outputs().iter().map(|o| values[o].clone()).collect())
}

/// Runs a region op on its operand values (the layouts are in `tessera_ir::region`); returns
/// its results. Bodies run through `run_with`, so collectives inside a loop body meet on every
/// device once per iteration.
pub fn run_region(
    r: &RegionOp,
    args: &[&Literal],
    collectives: &dyn Collectives,
) -> Result<Vec<Literal>, InterpError> {
    for (_, body) in r.regions() {
        tessera_ir::verify(body)?;
    }
    let types: Vec<&TensorType> = args.iter().map(|a| &a.ty).collect();
    let mesh = r.regions().first().and_then(|(_, b)| b.mesh.clone());
    r.result_types(&types, mesh.as_ref())
        .map_err(|message| InterpError::Op {
            op: r.name().into(),
            message,
        })?;
    region_verified(r, args, collectives)
}

/// Runs region `k` of a region op on one set of inputs (`run_region_with`).
pub type RunBody<'a> = dyn FnMut(usize, &[&Literal]) -> Result<Vec<Literal>, InterpError> + 'a;

/// `run_region` on a region whose bodies are verified and fit its operands.
fn region_verified(
    r: &RegionOp,
    args: &[&Literal],
    collectives: &dyn Collectives,
) -> Result<Vec<Literal>, InterpError> {
    let bodies: Vec<&Graph> = r.regions().into_iter().map(|(_, b)| b).collect();
    run_region_with(r, args, &mut |k, inputs| {
        run_verified(bodies[k], inputs, collectives)
    })
}

/// The control flow of region op `r` on its operand values, with `body(k, inputs)` running
/// region `k` (in the order of `RegionOp::regions`) on one set of inputs (the interpreter runs
/// bodies with itself; the native backend has its own, in-place loop in `exec.rs`). `args`
/// must fit the region (`RegionOp::result_types`).
pub fn run_region_with(
    r: &RegionOp,
    args: &[&Literal],
    body: &mut RunBody<'_>,
) -> Result<Vec<Literal>, InterpError> {
    let fail = |message: String| InterpError::Op {
        op: r.name().into(),
        message,
    };
    match r {
        RegionOp::Scan {
            length,
            reverse,
            consts,
            carries,
            body: scan_body,
        } => {
            let fixed = consts + carries;
            let mut carry: Vec<Literal> = args[*consts..fixed].iter().map(|&l| l.clone()).collect();
            let xs = &args[fixed..];
            let out_types = tessera_ir::region::output_types(scan_body);
            let mut ys: Vec<Literal> = Vec::new();
            for t in &out_types[*carries..] {
                let mut dims = vec![*length];
                dims.extend_from_slice(t.dims());
                let ty = TensorType::new(t.dtype, dims);
                ys.push(Literal::try_zeros(&ty).map_err(fail)?);
            }
            for step in 0..*length {
                let i = if *reverse { length - 1 - step } else { step };
                let slices: Vec<Literal> = xs
                    .iter()
                    .map(|x| {
                        let ty = TensorType::new(x.ty.dtype, x.ty.dims()[1..].to_vec());
                        let n = ty.numel();
                        Literal {
                            data: x.data.slice(i * n..(i + 1) * n),
                            ty,
                        }
                    })
                    .collect();
                let mut params: Vec<&Literal> = args[..*consts].to_vec();
                params.extend(carry.iter());
                params.extend(slices.iter());
                let mut outs = body(0, &params)?;
                let per_step = outs.split_off(*carries);
                carry = outs;
                for (y, v) in ys.iter_mut().zip(&per_step) {
                    let n = v.ty.numel();
                    y.data
                        .copy_block(i * n, &v.data, 0..n)
                        .map_err(|e| fail(e.0))?;
                }
            }
            carry.extend(ys);
            Ok(carry)
        }
        RegionOp::While { consts, .. } => {
            let mut carry: Vec<Literal> = args[*consts..].iter().map(|&l| l.clone()).collect();
            loop {
                let mut params: Vec<&Literal> = args[..*consts].to_vec();
                params.extend(carry.iter());
                let go = body(0, &params)?;
                if !matches!(go[0].data.as_bool(), Some([true])) {
                    return Ok(carry);
                }
                carry = body(1, &params)?;
            }
        }
        RegionOp::Case { branches } => {
            let index = args[0]
                .data
                .as_i32()
                .and_then(|v| v.first().copied())
                .ok_or_else(|| fail("the index is not an i32 scalar".into()))?;
            let last = branches.len() as i64 - 1;
            let k = (index as i64).clamp(0, last) as usize;
            body(k, &args[1..])
        }
        RegionOp::Checkpoint { .. } | RegionOp::CustomVjp { .. } => body(0, args),
    }
}

fn op_error(op: &Op, message: impl Into<String>) -> InterpError {
    InterpError::Op {
        op: op.name().into(),
        message: message.into(),
    }
}

/// Applies `$body` to the vector inside any `Data` variant, rebuilding the same variant.
macro_rules! each {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => Data::F32($body),
            Data::F64($v) => Data::F64($body),
            Data::I32($v) => Data::I32($body),
            Data::U32($v) => Data::U32($body),
            Data::Bool($v) => Data::Bool($body),
            Data::I64($v) => Data::I64($body),
            Data::F16($v) => Data::F16($body),
            Data::BF16($v) => Data::BF16($body),
        }
    };
}

/// Fails with the size when the allocator cannot give room for a result of type `ty` (a
/// result too large for the machine would otherwise abort the process). The room is asked
/// for and given back: Linux refuses at once what exceeds memory and swap, which is the case
/// this catches; a result that fits but is not available when touched is the kernel's to
/// refuse, as for any program.
fn reserve_probe(op: &Op, ty: &TensorType) -> Result<(), InterpError> {
    let bytes = ty.numel().saturating_mul(ty.dtype.byte_width());
    if bytes < 1 << 30 {
        return Ok(());
    }
    Vec::<u8>::new().try_reserve_exact(bytes).map_err(|_| {
        op_error(
            op,
            format!("cannot allocate {bytes} bytes for a result of type {ty}"),
        )
    })
}

/// Evaluates one non-collective op on its operand values; `ty` is the node's result type.
/// This is also the eager mode's kernel.
pub fn eval_op(op: &Op, args: &[&Literal], ty: &TensorType) -> Result<Literal, InterpError> {
    reserve_probe(op, ty)?;
    if let Some(wide) = computes_in_f32(op, args, ty) {
        return in_f32(&wide, args, ty);
    }
    let data = match op {
        Op::Parameter(_) => return Err(op_error(op, "parameters have no kernel")),
        Op::Constant(lit) => lit.data.clone(),
        Op::Iota { dim, .. } => {
            let n = ty.numel();
            let mut idx: Vec<usize> = Vec::with_capacity(n);
            for_each_index(ty.dims(), |at| idx.push(at[*dim]));
            match ty.dtype {
                DType::F32 => Data::F32(idx.iter().map(|&i| i as f32).collect()),
                DType::F64 => Data::F64(idx.iter().map(|&i| i as f64).collect()),
                DType::I32 => Data::I32(idx.iter().map(|&i| i as i32).collect()),
                DType::U32 => Data::U32(idx.iter().map(|&i| i as u32).collect()),
                DType::I64 => Data::I64(idx.iter().map(|&i| i as i64).collect()),
                DType::Bool | DType::F16 | DType::BF16 => {
                    return Err(op_error(op, format!("iota of {}", ty.dtype)));
                }
            }
        }
        Op::Unary(u) => unary(*u, &args[0].data),
        Op::Binary(b) => binary(op, *b, &args[0].data, &args[1].data)?,
        Op::Compare(c) => Data::Bool(compare_data(op, *c, &args[0].data, &args[1].data)?),
        Op::Select => {
            let Data::Bool(p) = &args[0].data else {
                return Err(op_error(op, "predicate is not bool"));
            };
            zip_same(
                op,
                &args[1].data,
                &args[2].data,
                |t, f| each!(t, a => a.iter().zip(f.as_slice().unwrap_or(&[])).zip(p).map(|((x, y), &c)| if c { *x } else { *y }).collect()),
            )?
        }
        Op::Convert(to) => convert(&args[0].data, *to),
        Op::Bitcast(to) => bitcast(op, &args[0].data, *to)?,
        Op::BroadcastInDim { dims, .. } => {
            let from = args[0].ty.dims();
            let strides = args[0].ty.shape.strides();
            // Each result dim's stride in the operand: 0 where it is broadcast.
            let mut by = vec![0; ty.rank()];
            for (i, &d) in dims.iter().enumerate() {
                if from[i] != 1 {
                    by[d] = strides[i];
                }
            }
            args[0]
                .data
                .strided(ty.dims(), &by)
                .map_err(|e| op_error(op, e.0))?
        }
        Op::Reshape(_) | Op::ShardingConstraint(_) | Op::StopGradient => args[0].data.clone(),
        Op::Transpose(perm) => {
            let strides = args[0].ty.shape.strides();
            let by: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
            args[0]
                .data
                .strided(ty.dims(), &by)
                .map_err(|e| op_error(op, e.0))?
        }
        Op::Slice { start, stride, .. } => {
            let strides = args[0].ty.shape.strides();
            let map = |out: &[usize]| {
                Some(
                    (0..out.len())
                        .map(|i| (start[i] + out[i] * stride[i]) * strides[i])
                        .sum(),
                )
            };
            gather_data(op, &args[0].data, &ty.shape, map, None)?
        }
        Op::Pad { low, interior, .. } => {
            let from = args[0].ty.dims();
            let strides = args[0].ty.shape.strides();
            let map = |out: &[usize]| {
                let mut flat = 0;
                for i in 0..out.len() {
                    let q = out[i] as i64 - low[i];
                    let step = interior[i] as i64 + 1;
                    if q < 0 || q % step != 0 || q / step >= from[i] as i64 {
                        return None;
                    }
                    flat += (q / step) as usize * strides[i];
                }
                Some(flat)
            };
            gather_data(op, &args[0].data, &ty.shape, map, Some(&args[1].data))?
        }
        Op::Concatenate { dim } => {
            let mut offsets = Vec::new();
            let mut acc = 0;
            for a in args {
                offsets.push(acc);
                acc += a.ty.dims()[*dim];
            }
            let n = ty.numel();
            let mut out = Data::zeros(ty.dtype, n);
            for f in 0..n {
                let mut idx = unravel(f, ty.dims());
                let k = (0..args.len())
                    .rev()
                    .find(|&j| {
                        offsets[j] <= idx[*dim] && idx[*dim] < offsets[j] + args[j].ty.dims()[*dim]
                    })
                    .ok_or_else(|| op_error(op, "index outside every operand"))?;
                idx[*dim] -= offsets[k];
                let src = ravel(&idx, &args[k].ty.shape.strides());
                out.copy_element(f, &args[k].data, src)
                    .map_err(|e| op_error(op, e.0))?;
            }
            out
        }
        Op::Reduce { kind, axes } => reduce(*kind, axes, args[0], ty),
        Op::ArgMax { axis } => argmax(*axis, args[0], ty),
        Op::DotGeneral(dd) => dot_general(op, dd, args[0], args[1], ty)?,
        Op::Collective(_) => {
            return Err(op_error(
                op,
                "collectives run through a Collectives transport",
            ));
        }
        Op::Region(_) | Op::GetResult { .. } => {
            return Err(op_error(
                op,
                "region ops have several results: run them with run_region",
            ));
        }
        Op::Conv(cd) => conv::conv(op, cd, args[0], args[1], ty)?,
        Op::ReduceWindow { kind, win } => conv::reduce_window(op, *kind, win, args[0], ty)?,
        Op::Gather(d) => gather::gather(d, args[0], args[1], ty),
        Op::Scatter(d) => gather::scatter(d, args[0], args[1], args[2]),
        Op::Sort {
            dim,
            num_keys,
            output,
        } => sorting::sort(args, *dim, *num_keys, *output),
        Op::Cumulative {
            kind,
            axis,
            reverse,
        } => sorting::cumulative(*kind, *axis, *reverse, args[0]),
        Op::Rev { dims } => sorting::rev(dims, args[0], ty),
    };
    if data.len() != ty.numel() || data.dtype() != ty.dtype {
        return Err(op_error(
            op,
            format!(
                "kernel produced {} {} values for {ty}",
                data.len(),
                data.dtype()
            ),
        ));
    }
    Ok(Literal {
        ty: ty.clone(),
        data,
    })
}

/// The f32 op that `op` computes in when an operand or the result is f16 or bf16
/// (`Op::keeps_narrow` says which ops do not); `None` when `op` runs as it is.
fn computes_in_f32(op: &Op, args: &[&Literal], ty: &TensorType) -> Option<Op> {
    let narrow = ty.dtype.is_narrow_float() || args.iter().any(|a| a.ty.dtype.is_narrow_float());
    (narrow && !op.keeps_narrow()).then(|| op.widened())
}

/// f16 and bf16 semantics (XLA:CPU's): the narrow operands widen to f32 (exactly), the op runs
/// in f32, and a narrow result rounds to nearest even once. Ops that only move elements get
/// the same bits back.
fn in_f32(wide_op: &Op, args: &[&Literal], ty: &TensorType) -> Result<Literal, InterpError> {
    let wide: Vec<Literal> = args
        .iter()
        .map(|a| match a.ty.dtype.is_narrow_float() {
            true => Literal {
                ty: a.ty.with_dtype(DType::F32),
                data: convert(&a.data, DType::F32),
            },
            false => (*a).clone(),
        })
        .collect();
    let refs: Vec<&Literal> = wide.iter().collect();
    let out = eval_op(wide_op, &refs, &ty.with_dtype(ty.dtype.compute_type()))?;
    let data = match ty.dtype.is_narrow_float() {
        true => convert(&out.data, ty.dtype),
        false => out.data,
    };
    Ok(Literal {
        ty: ty.clone(),
        data,
    })
}

/// Element `i` of integer or bool data, exactly (`get_f64` rounds an i64 past 2^53).
pub(crate) fn int_at(d: &Data, i: usize) -> i64 {
    match d {
        Data::I64(v) => v[i],
        Data::I32(v) => i64::from(v[i]),
        Data::U32(v) => i64::from(v[i]),
        Data::Bool(v) => i64::from(v[i]),
        Data::F32(_) | Data::F64(_) | Data::F16(_) | Data::BF16(_) => d.get_f64(i) as i64,
    }
}

/// Row-major multi-index of flat index `f` in `dims`.
pub fn unravel(mut f: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        if dims[i] > 0 {
            idx[i] = f % dims[i];
            f /= dims[i];
        }
    }
    idx
}

pub fn ravel(idx: &[usize], strides: &[usize]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum()
}

/// Runs `f` after checking that two operands hold the same element type and count.
fn zip_same(
    op: &Op,
    a: &Data,
    b: &Data,
    f: impl FnOnce(&Data, &Data) -> Data,
) -> Result<Data, InterpError> {
    if a.dtype() != b.dtype() || a.len() != b.len() {
        return Err(op_error(op, "operands differ in type"));
    }
    Ok(f(a, b))
}

/// Builds a result of `shape` whose element at each index is the source element `map` names,
/// or the padding value where it names none.
fn gather_data(
    op: &Op,
    src: &Data,
    shape: &Shape,
    map: impl Fn(&[usize]) -> Option<usize>,
    fill: Option<&Data>,
) -> Result<Data, InterpError> {
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(shape.numel());
    for_each_index(shape.dims(), |at| sources.push(map(at)));
    src.gather(&sources, fill).map_err(|e| op_error(op, e.0))
}

/// `u32::binary` over two slices, with a loop of its own (one the compiler vectorizes) for
/// each op of the PRNG (threefry's adds, rotations and xors: eager `random::bits` ran each
/// element through the op's match, 60% of its time); the same function of each pair.
fn u32_binary(op: BinaryOp, a: &[u32], b: &[u32]) -> Vec<u32> {
    fn each(a: &[u32], b: &[u32], f: impl Fn(u32, u32) -> u32) -> Vec<u32> {
        a.iter().zip(b).map(|(&p, &q)| f(p, q)).collect()
    }
    let f = |x, y| u32::binary(op, x, y);
    if op == BinaryOp::Add {
        each(a, b, u32::wrapping_add)
    } else if op == BinaryOp::Xor {
        each(a, b, |x, y| x ^ y)
    } else if op == BinaryOp::Or {
        each(a, b, |x, y| x | y)
    } else if op == BinaryOp::ShiftLeft {
        each(a, b, |x, y| if y < 32 { x << y } else { 0 })
    } else if op == BinaryOp::ShiftRightLogical {
        each(a, b, |x, y| if y < 32 { x >> y } else { 0 })
    } else {
        each(a, b, f)
    }
}

/// Calls `f` with every index of `dims` in row-major order (`unravel` of `0..numel`), counting
/// like an odometer in one vector: nothing allocated per element (an eager broadcast of a
/// scalar to 400 K elements took 22 ms unravelling each index into a new vector, 54 ns an
/// element, most of `random::normal`'s time).
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = dims.iter().product();
    let mut at = vec![0; dims.len()];
    for _ in 0..n {
        f(&at);
        for d in (0..dims.len()).rev() {
            at[d] += 1;
            if at[d] < dims[d] {
                break;
            }
            at[d] = 0;
        }
    }
}

fn unary(op: UnaryOp, x: &Data) -> Data {
    match x {
        Data::F32(v) => Data::F32(v.iter().map(|&a| f32::unary(op, a)).collect()),
        Data::F64(v) => Data::F64(v.iter().map(|&a| f64::unary(op, a)).collect()),
        Data::I32(v) => Data::I32(v.iter().map(|&a| i32::unary(op, a)).collect()),
        Data::U32(v) => Data::U32(v.iter().map(|&a| u32::unary(op, a)).collect()),
        Data::Bool(v) => Data::Bool(v.iter().map(|&a| bool_unary(op, a)).collect()),
        Data::I64(v) => Data::I64(v.iter().map(|&a| i64::unary(op, a)).collect()),
        // Computed in f32 (`in_f32`) before this is reached.
        Data::F16(_) | Data::BF16(_) => x.clone(),
    }
}

fn binary(o: &Op, op: BinaryOp, x: &Data, y: &Data) -> Result<Data, InterpError> {
    zip_same(o, x, y, |x, y| match (x, y) {
        (Data::F32(a), Data::F32(b)) => Data::F32(
            a.iter()
                .zip(b)
                .map(|(&p, &q)| f32::binary(op, p, q))
                .collect(),
        ),
        (Data::F64(a), Data::F64(b)) => Data::F64(
            a.iter()
                .zip(b)
                .map(|(&p, &q)| f64::binary(op, p, q))
                .collect(),
        ),
        (Data::I32(a), Data::I32(b)) => Data::I32(
            a.iter()
                .zip(b)
                .map(|(&p, &q)| i32::binary(op, p, q))
                .collect(),
        ),
        (Data::U32(a), Data::U32(b)) => Data::U32(u32_binary(op, a, b)),
        (Data::Bool(a), Data::Bool(b)) => Data::Bool(
            a.iter()
                .zip(b)
                .map(|(&p, &q)| bool_binary(op, p, q))
                .collect(),
        ),
        (Data::I64(a), Data::I64(b)) => Data::I64(
            a.iter()
                .zip(b)
                .map(|(&p, &q)| i64::binary(op, p, q))
                .collect(),
        ),
        _ => Data::Bool(vec![]),
    })
}

fn compare_data(o: &Op, op: CompareOp, x: &Data, y: &Data) -> Result<Vec<bool>, InterpError> {
    fn cmp<T: PartialOrd + Copy>(op: CompareOp, a: &[T], b: &[T]) -> Vec<bool> {
        a.iter().zip(b).map(|(&p, &q)| compare(op, p, q)).collect()
    }
    if x.dtype() != y.dtype() || x.len() != y.len() {
        return Err(op_error(o, "operands differ in type"));
    }
    Ok(match (x, y) {
        (Data::F32(a), Data::F32(b)) => cmp(op, a, b),
        (Data::F64(a), Data::F64(b)) => cmp(op, a, b),
        (Data::I32(a), Data::I32(b)) => cmp(op, a, b),
        (Data::U32(a), Data::U32(b)) => cmp(op, a, b),
        (Data::Bool(a), Data::Bool(b)) => cmp(op, a, b),
        (Data::I64(a), Data::I64(b)) => cmp(op, a, b),
        _ => vec![],
    })
}

/// Value conversion. Float to integer truncates toward zero and saturates (NaN gives 0); any
/// value to bool is `x != 0`; integers wrap to a narrower integer. f16 and bf16 widen to f32
/// exactly first; f32 and f64 round to them directly (to nearest even), every other type
/// through f32 (as XLA converts integers to bf16).
pub fn convert(x: &Data, to: DType) -> Data {
    macro_rules! conv {
        ($v:expr) => {
            match to {
                DType::F32 => Data::F32($v.iter().map(|&a| a as f32).collect()),
                DType::F64 => Data::F64($v.iter().map(|&a| a as f64).collect()),
                DType::I32 => Data::I32($v.iter().map(|&a| a as i32).collect()),
                DType::U32 => Data::U32($v.iter().map(|&a| a as u32).collect()),
                DType::I64 => Data::I64($v.iter().map(|&a| a as i64).collect()),
                DType::Bool => Data::Bool($v.iter().map(|&a| a as f64 != 0.0).collect()),
                DType::F16 => Data::F16($v.iter().map(|&a| f16::from_f32(a as f32)).collect()),
                DType::BF16 => Data::BF16($v.iter().map(|&a| bf16::from_f32(a as f32)).collect()),
            }
        };
    }
    match (x, to) {
        (Data::F64(v), DType::F16) => Data::F16(v.iter().map(|&a| f16::from_f64(a)).collect()),
        (Data::F64(v), DType::BF16) => Data::BF16(v.iter().map(|&a| bf16::from_f64(a)).collect()),
        (Data::F32(v), _) => conv!(v),
        (Data::F64(v), _) => conv!(v),
        (Data::I32(v), _) => conv!(v),
        (Data::U32(v), _) => conv!(v),
        (Data::I64(v), _) => conv!(v),
        (Data::Bool(v), _) => {
            let u: Vec<u8> = v.iter().map(|&b| b as u8).collect();
            conv!(u)
        }
        (Data::F16(v), _) => {
            let w: Vec<f32> = v.iter().map(|a| a.to_f32()).collect();
            conv!(w)
        }
        (Data::BF16(v), _) => {
            let w: Vec<f32> = v.iter().map(|a| a.to_f32()).collect();
            conv!(w)
        }
    }
}

fn bitcast(op: &Op, x: &Data, to: DType) -> Result<Data, InterpError> {
    let from = x.dtype();
    if from.bit_width() != to.bit_width() || (from == DType::Bool) != (to == DType::Bool) {
        return Err(op_error(op, format!("cannot reinterpret {from} as {to}")));
    }
    let n = x.len();
    let mut out = Data::try_with_capacity(to, n).map_err(|e| op_error(op, e.0))?;
    // SAFETY: `out` has room for `n` elements of `to`, as wide as `from`'s, so the
    // `n * width` bytes of `x` fit; the two are distinct allocations. Every bit pattern is a
    // valid value of each non-bool type (bool only reinterprets as bool, checked above), so
    // the `n` elements are initialized and valid for `set_len`.
    unsafe {
        std::ptr::copy_nonoverlapping(x.as_ptr(), out.as_mut_ptr(), n * from.byte_width());
        out.set_len(n);
    }
    Ok(out)
}

/// Reduction over `axes`, visiting the input in row-major order. An f32 sum down to one value
/// (a loss) accumulates in f64 and rounds once: the number a user reads is then the correctly
/// rounded sum of its terms (the Cranelift backend does the same).
fn reduce(kind: ReduceKind, axes: &[usize], x: &Literal, ty: &TensorType) -> Data {
    if let (ReduceKind::Sum, 0, Data::F32(v)) = (kind, ty.rank(), &x.data) {
        // From +0 (std's `Sum` for floats starts at -0): an empty sum is +0, as XLA's.
        let total = v.iter().fold(0.0f64, |t, &a| t + a as f64);
        return Data::F32(vec![total as f32]);
    }
    let in_dims = x.ty.dims();
    let kept: Vec<usize> = (0..in_dims.len()).filter(|d| !axes.contains(d)).collect();
    let out_strides = ty.shape.strides();
    // Each input element's place in the result, found in one odometer pass.
    let mut targets: Vec<usize> = Vec::with_capacity(x.ty.numel());
    for_each_index(in_dims, |idx| {
        targets.push(
            kept.iter()
                .enumerate()
                .map(|(j, &d)| idx[d] * out_strides[j])
                .sum(),
        )
    });
    let target = |f: usize| -> usize { targets[f] };
    let n_out = ty.numel();
    fn fold<T: Copy>(
        v: &[T],
        n_out: usize,
        init: T,
        target: &dyn Fn(usize) -> usize,
        f: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        let mut out = vec![init; n_out];
        for (i, &x) in v.iter().enumerate() {
            let t = target(i);
            out[t] = f(out[t], x);
        }
        out
    }
    macro_rules! float {
        ($v:expr, $t:ty) => {
            match kind {
                ReduceKind::Sum => fold($v, n_out, 0.0 as $t, &target, |a, b| a + b),
                ReduceKind::Max => fold($v, n_out, <$t>::NEG_INFINITY, &target, fmax),
                ReduceKind::Min => fold($v, n_out, <$t>::INFINITY, &target, fmin),
            }
        };
    }
    macro_rules! int {
        ($v:expr, $t:ty) => {
            match kind {
                ReduceKind::Sum => fold($v, n_out, 0, &target, |a: $t, b| a.wrapping_add(b)),
                ReduceKind::Max => fold($v, n_out, <$t>::MIN, &target, |a: $t, b| a.max(b)),
                ReduceKind::Min => fold($v, n_out, <$t>::MAX, &target, |a: $t, b| a.min(b)),
            }
        };
    }
    match &x.data {
        Data::F32(v) => Data::F32(float!(v, f32)),
        Data::F64(v) => Data::F64(float!(v, f64)),
        Data::I32(v) => Data::I32(int!(v, i32)),
        Data::U32(v) => Data::U32(int!(v, u32)),
        Data::I64(v) => Data::I64(int!(v, i64)),
        Data::Bool(_) => Data::Bool(vec![false; n_out]),
        // Computed in f32 (`in_f32`) before this is reached.
        Data::F16(_) | Data::BF16(_) => Data::zeros(x.ty.dtype, 0),
    }
}

/// Index of the first maximum along `axis`; a NaN is the maximum.
fn argmax(axis: usize, x: &Literal, ty: &TensorType) -> Data {
    let dims = x.ty.dims();
    let strides = x.ty.shape.strides();
    let n = dims[axis];
    let out: Vec<i32> = (0..ty.numel())
        .map(|f| {
            let oidx = unravel(f, ty.dims());
            let mut idx: Vec<usize> = oidx.clone();
            idx.insert(axis, 0);
            let base = ravel(&idx, &strides);
            let at = |k: usize| base + k * strides[axis];
            let mut best = 0;
            for k in 1..n {
                if !x.ty.dtype.is_float() {
                    if int_at(&x.data, at(k)) > int_at(&x.data, at(best)) {
                        best = k;
                    }
                    continue;
                }
                let (b, c) = (x.data.get_f64(at(best)), x.data.get_f64(at(k)));
                if b.is_nan() {
                    break;
                }
                if c.is_nan() || c > b {
                    best = k;
                }
            }
            best as i32
        })
        .collect();
    Data::I32(out)
}

/// `dot_general` by its definition: each result element sums the products over every
/// contracting index, in row-major order of the contracting dims, accumulating in the operand
/// type.
fn dot_general(
    op: &Op,
    dd: &DotDims,
    l: &Literal,
    r: &Literal,
    ty: &TensorType,
) -> Result<Data, InterpError> {
    let (ld, rd) = (l.ty.dims(), r.ty.dims());
    let (ls, rs) = (l.ty.shape.strides(), r.ty.shape.strides());
    let lfree = dd.lhs_free(ld.len());
    let rfree = dd.rhs_free(rd.len());
    let csizes: Vec<usize> = dd.lhs_contract.iter().map(|&d| ld[d]).collect();
    let ncontract: usize = csizes.iter().product();
    let nb = dd.lhs_batch.len();
    // Flat offsets of every result element into lhs and rhs (before contraction), and of every
    // contracting index.
    let bases: Vec<(usize, usize)> = (0..ty.numel())
        .map(|f| {
            let o = unravel(f, ty.dims());
            let mut lo = 0;
            let mut ro = 0;
            for (j, (&a, &b)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
                lo += o[j] * ls[a];
                ro += o[j] * rs[b];
            }
            for (j, &a) in lfree.iter().enumerate() {
                lo += o[nb + j] * ls[a];
            }
            for (j, &b) in rfree.iter().enumerate() {
                ro += o[nb + lfree.len() + j] * rs[b];
            }
            (lo, ro)
        })
        .collect();
    let contract: Vec<(usize, usize)> = (0..ncontract)
        .map(|f| {
            let c = unravel(f, &csizes);
            let lo = dd
                .lhs_contract
                .iter()
                .zip(&c)
                .map(|(&d, &i)| i * ls[d])
                .sum();
            let ro = dd
                .rhs_contract
                .iter()
                .zip(&c)
                .map(|(&d, &i)| i * rs[d])
                .sum();
            (lo, ro)
        })
        .collect();
    macro_rules! dot {
        ($a:expr, $b:expr, $zero:expr, $mul:expr, $add:expr) => {
            bases
                .iter()
                .map(|&(lo, ro)| {
                    contract.iter().fold($zero, |acc, &(cl, cr)| {
                        $add(acc, $mul($a[lo + cl], $b[ro + cr]))
                    })
                })
                .collect()
        };
    }
    Ok(match (&l.data, &r.data) {
        (Data::F32(a), Data::F32(b)) => Data::F32(dot!(a, b, 0.0f32, |x, y| x * y, |s, p| s + p)),
        (Data::F64(a), Data::F64(b)) => Data::F64(dot!(a, b, 0.0f64, |x, y| x * y, |s, p| s + p)),
        (Data::I32(a), Data::I32(b)) => Data::I32(dot!(
            a,
            b,
            0i32,
            |x: i32, y| x.wrapping_mul(y),
            |s: i32, p| s.wrapping_add(p)
        )),
        (Data::U32(a), Data::U32(b)) => Data::U32(dot!(
            a,
            b,
            0u32,
            |x: u32, y| x.wrapping_mul(y),
            |s: u32, p| s.wrapping_add(p)
        )),
        (Data::I64(a), Data::I64(b)) => Data::I64(dot!(
            a,
            b,
            0i64,
            |x: i64, y| x.wrapping_mul(y),
            |s: i64, p| s.wrapping_add(p)
        )),
        _ => return Err(op_error(op, "operands differ in type")),
    })
}
