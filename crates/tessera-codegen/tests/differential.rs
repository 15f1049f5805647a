//! Compiled against interpreted: every corpus sample (every op and dtype), on random inputs.
//! f32 agrees to 1e-5 relative (plus the absolute bound of the approximations in `approx.rs`),
//! f64 to 1e-12, integers, bools, f16 and bf16 exactly. The quick tier's code (`tier.rs`)
//! agrees with the optimized code bit for bit.

use tessera_interp::{SingleDevice, run};
use tessera_ir::corpus::{Lcg, covered_op_names, op_samples, random_inputs};
use tessera_ir::{ALL_OP_NAMES, Data, Literal, REGION_OP_NAMES};

pub fn agree(got: &Literal, want: &Literal) -> Result<(), String> {
    if got.ty != want.ty {
        return Err(format!("type {} vs {}", got.ty, want.ty));
    }
    let close = |a: f64, b: f64, rel: f64, abs: f64| {
        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= rel * b.abs() + abs
    };
    for i in 0..got.data.len() {
        let (a, b) = (got.data.get_f64(i), want.data.get_f64(i));
        let ok = match &got.data {
            Data::F32(_) => close(a, b, 1e-5, 1e-6),
            Data::F64(_) => close(a, b, 1e-12, 1e-300),
            // f16 and bf16 run the f32 kernels of both backends, rounded by the same calls:
            // equal bit for bit, NaNs included.
            Data::F16(g) => {
                want.data
                    .as_slice::<tessera_ir::f16>()
                    .map(|w| w[i].to_bits())
                    == Some(g[i].to_bits())
            }
            Data::BF16(g) => {
                want.data
                    .as_slice::<tessera_ir::bf16>()
                    .map(|w| w[i].to_bits())
                    == Some(g[i].to_bits())
            }
            Data::I32(_) | Data::U32(_) | Data::Bool(_) => a == b,
            Data::I64(g) => want.data.as_i64().map(|w| w[i]) == Some(g[i]),
        };
        if !ok {
            return Err(format!("element {i}: compiled {a}, interpreted {b}"));
        }
    }
    Ok(())
}

#[test]
fn every_op_and_dtype_compiled_matches_the_interpreter() {
    let samples = op_samples();
    let covered = covered_op_names(&samples);
    // The region ops have no one-op sample: `tests/regions.rs` runs each compiled against
    // interpreted, and the fuzzer (`tessera/tests/fuzz.rs`) draws random ones.
    assert!(
        ALL_OP_NAMES
            .iter()
            .all(|n| covered.contains(n) || REGION_OP_NAMES.contains(n))
    );
    let mut rng = Lcg(11);
    let mut failures = Vec::new();
    for s in &samples {
        let inputs = random_inputs(s, &mut rng);
        let want = run(&s.graph, &inputs).expect("interpreter runs the corpus");
        let exe = match tessera_codegen::compile(&s.graph) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("{}: compile: {e}", s.name));
                continue;
            }
        };
        let refs: Vec<&Literal> = inputs.iter().collect();
        match exe.run(&refs, &SingleDevice) {
            Ok(got) => {
                if let Err(e) = agree(&got[0], &want[0]) {
                    failures.push(format!("{}: {e}", s.name));
                }
                // The quick tier (what `jit` runs first) computes the optimized code's bits.
                let quick = tessera_codegen::compile_quick(&s.graph)
                    .map_err(|e| e.to_string())
                    .and_then(|q| q.run(&refs, &SingleDevice).map_err(|e| e.to_string()));
                match quick {
                    Ok(fast) if fast[0].data.bits_eq(&got[0].data) => {}
                    Ok(fast) => failures.push(format!(
                        "{}: quick tier {:?} vs optimized {:?}",
                        s.name, fast[0].data, got[0].data
                    )),
                    Err(e) => failures.push(format!("{}: quick tier: {e}", s.name)),
                }
            }
            Err(e) => failures.push(format!("{}: run: {e}", s.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} samples differ:\n{}",
        failures.len(),
        samples.len(),
        failures.join("\n")
    );
}
