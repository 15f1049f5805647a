//! Tensors cross threads (issue 16, item 1): a concrete tensor is `Send + Sync` and unwind
//! safe, so a loader thread can build batches and `catch_unwind` needs no wrapper; a tracer
//! used on another thread than its trace's is a clear error there, not undefined behaviour.

use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::mpsc;

use tessera::prelude::*;

fn assert_thread_safe<T: Send + Sync + UnwindSafe + RefUnwindSafe>() {}

#[test]
fn tensors_and_keys_are_send_sync_and_unwind_safe() {
    assert_thread_safe::<Tensor>();
    assert_thread_safe::<Key>();
    assert_thread_safe::<(Tensor, Vec<Tensor>)>();
}

/// A loader thread builds batches and sends them; the main thread trains on them with a jitted
/// step. The result is the same as building the batches on the main thread.
#[test]
fn a_loader_thread_feeds_a_jitted_step() {
    let (tx, rx) = mpsc::sync_channel::<(Tensor, Tensor)>(2);
    let loader = std::thread::spawn(move || {
        for i in 0..4i64 {
            let x = random::normal(&Key::new(10 + i), [8, 3]);
            let y = x.sum_axes(keepdims(1)) * 0.5;
            tx.send((x, y)).unwrap();
        }
    });
    let step = jit(|(w, x, y): (Tensor, Tensor, Tensor)| {
        let g = grad(|w: &Tensor| (x.matmul(w) - &y).square().mean())(&w);
        w - g * 0.1
    });
    let mut w = Tensor::zeros([3, 1]);
    for (x, y) in rx {
        w = step.call((w, x, y)).unwrap();
    }
    loader.join().unwrap();

    let mut here = Tensor::zeros([3, 1]);
    for i in 0..4i64 {
        let x = random::normal(&Key::new(10 + i), [8, 3]);
        let y = x.sum_axes(keepdims(1)) * 0.5;
        here = step.call((here, x, y)).unwrap();
    }
    assert_eq!(w.to_vec::<f32>(), here.to_vec::<f32>());
    assert!(w.to_vec::<f32>().iter().all(|v| *v > 0.0), "it learned");
}

/// Results computed on a worker thread come back whole, and a tensor shared by reference
/// between scoped threads is read by all of them.
#[test]
fn a_tensor_is_shared_between_scoped_threads() {
    let x = Tensor::from_vec((0..6).map(|i| i as f32).collect::<Vec<_>>(), [2, 3]);
    let x = &x;
    let sums: Vec<f32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|k| s.spawn(move || (x * (k as f32)).sum().item::<f32>()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![0.0, 15.0, 30.0]);
}

/// A tracer sent to another thread while its trace runs is dead there: using it is an error
/// that says so (a panic on that thread, since no trace of its own is running), and the trace
/// on the first thread goes on.
#[test]
fn a_tracer_used_on_another_thread_is_a_clear_error() {
    let f = jit(|x: Tensor| {
        let err = std::thread::scope(|s| s.spawn(|| &x + 1.0).join()).unwrap_err();
        let msg = err
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| format!("{:?}", err.type_id()));
        assert!(
            msg.contains("used on another thread than the one tracing it"),
            "{msg}"
        );
        assert!(msg.contains("f32[2]"), "{msg}");
        &x * 2.0
    });
    let y = f.call(Tensor::from_vec(vec![1.0f32, 2.0], [2])).unwrap();
    assert_eq!(y.to_vec::<f32>(), vec![2.0, 4.0]);
}

/// A panic inside a jitted closure caught with plain `catch_unwind` (no `AssertUnwindSafe`)
/// leaves the captured tensors usable.
#[test]
fn catch_unwind_needs_no_wrapper() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let r = std::panic::catch_unwind(|| {
        let _ = x.exp();
        panic!("user panic");
    });
    assert!(r.is_err());
    assert_eq!(x.sum().item::<f32>(), 6.0);
}
