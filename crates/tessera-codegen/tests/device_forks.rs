//! `Executable::dropping_outputs`: a device whose replicated outputs another device returns
//! skips the steps only they need, but still meets the others at its collectives; and
//! `Executable::fork`: one compilation serving several devices.

use std::cell::Cell;

use tessera_ir::{Literal, parse};
use tessera_transport::SingleDevice;

#[path = "support/hooked.rs"]
mod support;
use support::Hooked;

#[test]
fn dropped_outputs_skip_their_steps_but_not_the_collectives() {
    let g = parse(
        "mesh @mesh = <\"dp\"=1>\n\
         func @f(%0: f32[4]) {\n  \
           %1 = exp %0 : f32[4]\n  \
           %2 = all_reduce %1 sum axes=[\"dp\"] : f32[4]\n  \
           %3 = neg %2 : f32[4]\n  \
           %4 = tanh %0 : f32[4]\n  \
           return %3, %4\n}\n",
    )
    .unwrap();
    let x = Literal::new([4], tessera_ir::Data::F32(vec![0.0, 1.0, -1.0, 2.0])).unwrap();
    let full = tessera_codegen::compile(&g).unwrap().single_threaded();
    let all = full.run(&[&x], &SingleDevice).unwrap();
    for drop in [[true, false], [false, true], [true, true]] {
        let exe = tessera_codegen::compile(&g)
            .unwrap()
            .single_threaded()
            .dropping_outputs(&drop);
        let count = Cell::new(0);
        let met = Hooked(|| count.set(count.get() + 1));
        let outs = exe.run_partial(&[&x], &met).unwrap();
        // The all-reduce runs whatever is dropped: the other devices wait for it.
        assert_eq!(count.get(), 1, "{drop:?}");
        for (i, o) in outs.iter().enumerate() {
            match (drop[i], o) {
                (true, None) => {}
                (false, Some(l)) => assert_eq!(l, &all[i], "{drop:?}: output {i}"),
                _ => panic!("{drop:?}: output {i} is {o:?}"),
            }
        }
    }
}

/// Forks share the compiled code and own their arenas: four threads run four forks of one
/// compilation at once and all get the original's results.
#[test]
fn forks_share_code_and_run_at_once() {
    let g = parse(
        "func @f(%0: f32[64,64]) {\n  \
           %1 = tanh %0 : f32[64,64]\n  \
           %2 = dot_general %1, %0 contracting=[1]x[0] : f32[64,64]\n  \
           %3 = exp %2 : f32[64,64]\n  \
           return %3\n}\n",
    )
    .unwrap();
    let x = Literal::new(
        [64, 64],
        tessera_ir::Data::F32((0..4096).map(|i| (i % 13) as f32 / 40.0).collect()),
    )
    .unwrap();
    let exe = tessera_codegen::compile(&g).unwrap().single_threaded();
    let want = exe.run(&[&x], &SingleDevice).unwrap();
    let forks: Vec<_> = (0..4).map(|_| exe.fork()).collect();
    drop(exe);
    std::thread::scope(|s| {
        for f in forks {
            let (x, want) = (&x, &want);
            s.spawn(move || {
                for _ in 0..20 {
                    assert_eq!(&f.run(&[x], &SingleDevice).unwrap(), want);
                }
            });
        }
    });
}
