//! A run of an executable entered again on its own thread while it waits (a rayon task that
//! its split kernels or GEMMs stole and that calls the same function, or here, a collective
//! that does) is an error the inner call returns, not a panic; the outer run goes on and
//! returns its own results.

use std::cell::RefCell;

use tessera_codegen::compile;
use tessera_ir::{Literal, parse};
use tessera_transport::SingleDevice;

#[path = "support/hooked.rs"]
mod support;
use support::Hooked;

#[test]
fn a_run_entered_again_on_its_thread_is_an_error_and_the_first_run_goes_on() {
    let g = parse(
        "mesh @mesh = <\"dp\"=1>\n\
         func @f(%0: f32[4]) {\n  \
           %1 = exp %0 : f32[4]\n  \
           %2 = all_reduce %1 sum axes=[\"dp\"] : f32[4]\n  \
           %3 = neg %2 : f32[4]\n  \
           return %3\n\
         }\n",
    )
    .unwrap();
    let exe = compile(&g).unwrap();
    let x = Literal::new([4], tessera_ir::Data::F32(vec![0.0, 1.0, -1.0, 2.0])).unwrap();
    let want = exe.run(&[&x], &SingleDevice).unwrap();
    // The all-reduce (its one collective) first runs the executable again, on this thread.
    let inner = RefCell::new(None);
    let reentering = Hooked(|| *inner.borrow_mut() = Some(exe.run(&[&x], &SingleDevice)));
    let out = exe
        .run(&[&x], &reentering)
        .expect("the outer run completes");
    let inner = inner.into_inner().expect("the collective ran");
    let err = inner.expect_err("the inner run is refused").to_string();
    assert!(err.contains("already running on this thread"), "{err}");
    assert_eq!(out, want);
    // The executable is fit for the next run.
    assert_eq!(exe.run(&[&x], &SingleDevice).unwrap(), want);
}
