//! `gather` and `scatter` steps: data-dependent addressing, which the kernel IR (affine loads,
//! `kernel.rs`) does not express. Such a step reads its operand buffers whole and runs the
//! interpreter's kernel of the op (`tessera_interp::eval_op`) on them, as a collective step runs
//! through its transport, so both backends agree bit for bit by construction. Every index is
//! range-checked there (clamped, filled or dropped as the op's mode says): no index value
//! (`i32::MIN`, `u32::MAX`, ...) reaches memory unchecked.

use tessera_interp::InterpError;
use tessera_ir::{Literal, Op};
use tessera_transport::values::{data_ptr, literal_from_raw};

use crate::fusion::{Buf, Step};

/// Runs the step `step` of op `op` on the bound buffers `ptrs`.
pub(crate) fn run(step: &Step, op: &Op, bufs: &[Buf], ptrs: &[*mut u8]) -> Result<(), InterpError> {
    let args: Vec<Literal> = step
        .inputs
        .iter()
        .map(|&b| {
            let ty = &bufs[b].ty;
            if ty.numel() == 0 {
                Literal::zeros(ty)
            } else {
                // SAFETY: buffer `b` holds a value of its type (written by an earlier step, or
                // bound at launch) and lives until the program's run returns.
                unsafe { literal_from_raw(ty, ptrs[b]) }
            }
        })
        .collect();
    let refs: Vec<&Literal> = args.iter().collect();
    let out_ty = &bufs[step.output].ty;
    let r = tessera_interp::eval_op(op, &refs, out_ty)?;
    let n = out_ty.byte_size();
    if n > 0 {
        // SAFETY: the result has the output buffer's type (the op's type rule, checked when the
        // graph was verified), so its `n` bytes fit the buffer, which no input aliases.
        unsafe { std::ptr::copy_nonoverlapping(data_ptr(&r.data), ptrs[step.output], n) };
    }
    Ok(())
}
