//! A run of an executable entered again on its own thread while it waits (a rayon task that
//! its split kernels or GEMMs stole and that calls the same function, or here, a collective
//! that does) is an error the inner call returns, not a panic; the outer run goes on and
//! returns its own results.

use std::cell::RefCell;

use tessera_codegen::compile;
use tessera_interp::InterpError;
use tessera_ir::{Literal, ReduceKind, parse};
use tessera_transport::{Collectives, Group, SingleDevice, TransportError};

/// One device alone, whose all-reduce first runs `exe` again on `input`.
struct Reentering<'a> {
    exe: &'a tessera_codegen::Executable,
    input: &'a Literal,
    inner: RefCell<Option<Result<Vec<Literal>, InterpError>>>,
}

impl Collectives for Reentering<'_> {
    fn position(&self) -> usize {
        0
    }

    fn all_reduce(
        &self,
        g: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        *self.inner.borrow_mut() = Some(self.exe.run(&[self.input], &SingleDevice));
        SingleDevice.all_reduce(g, kind, x)
    }

    fn all_gather(&self, g: &Group, dim: usize, x: &Literal) -> Result<Literal, TransportError> {
        SingleDevice.all_gather(g, dim, x)
    }

    fn reduce_scatter(
        &self,
        g: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        SingleDevice.reduce_scatter(g, kind, dim, x)
    }

    fn all_to_all(
        &self,
        g: &Group,
        split: usize,
        concat: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        SingleDevice.all_to_all(g, split, concat, x)
    }

    fn collective_permute(
        &self,
        g: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        SingleDevice.collective_permute(g, pairs, x)
    }

    fn axis_index(&self, g: &Group) -> Result<usize, TransportError> {
        SingleDevice.axis_index(g)
    }
}

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
    let reentering = Reentering {
        exe: &exe,
        input: &x,
        inner: RefCell::new(None),
    };
    let out = exe
        .run(&[&x], &reentering)
        .expect("the outer run completes");
    let inner = reentering.inner.into_inner().expect("the collective ran");
    let err = inner.expect_err("the inner run is refused").to_string();
    assert!(err.contains("already running on this thread"), "{err}");
    assert_eq!(out, want);
    // The executable is fit for the next run.
    assert_eq!(exe.run(&[&x], &SingleDevice).unwrap(), want);
}
