//! Observability (issue 16, item 7): the compile steps and each launch are `tracing` spans a
//! user sees with `tracing-subscriber` (their names, fields and, with span close events, their
//! durations); the jit cache is bounded and evicts the least recently used program.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tessera::prelude::*;
use tracing_subscriber::fmt::format::FmtSpan;

/// A writer into a shared buffer, for the fmt subscriber.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a fmt subscriber at `level`, with span close events, prints while `f` runs.
fn captured(level: tracing::Level, f: impl FnOnce()) -> String {
    let buf = Buf::default();
    let sink = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_span_events(FmtSpan::CLOSE)
        .with_max_level(level)
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn compile_steps_and_launches_are_spans_with_durations() {
    let out = captured(tracing::Level::DEBUG, || {
        let f = jit(|x: Tensor| (x.tanh() * 1.0).sum()).named("spanned");
        f.call(Tensor::ones([4])).unwrap();
        f.call(Tensor::ones([4])).unwrap();
    });
    // A close event is printed with the span's parents: `compile{..}:trace{..}: target:
    // close time.busy=..`; the span that closed is the last of the chain.
    let closes = |name: &str| {
        out.lines()
            .filter(|l| l.contains("close time.busy="))
            .filter_map(|l| l.split(": tessera::").next())
            .filter(|line| {
                // Past the timestamp and the level: the chain of spans.
                let chain: Vec<&str> = line.split_whitespace().skip(2).collect();
                let chain = chain.join(" ");
                let last = chain.rsplit("}:").next().unwrap_or("");
                last.starts_with(&format!("{name}{{"))
            })
            .count()
    };
    assert_eq!(closes("compile"), 1, "one compilation:\n{out}");
    assert_eq!(closes("trace"), 1, "{out}");
    assert_eq!(closes("schedule"), 1, "{out}");
    assert_eq!(closes("launch"), 2, "one launch per call:\n{out}");
    assert!(
        out.contains("compile{function=\"spanned\" trace=1}"),
        "{out}"
    );
    let pass = out
        .lines()
        .find(|l| l.contains("pass{stage=\"simplified\""))
        .unwrap_or_else(|| panic!("a span per pass:\n{out}"));
    assert!(
        pass.contains("nodes_before=") && pass.contains("nodes_after="),
        "{pass}"
    );
}

/// With the default filter level (INFO), launches (DEBUG) are not reported.
#[test]
fn launch_spans_are_debug_level() {
    let out = captured(tracing::Level::INFO, || {
        jit(|x: Tensor| x.exp()).call(Tensor::ones([2])).unwrap();
    });
    assert!(out.contains("compile{"), "{out}");
    assert!(!out.contains("launch{"), "{out}");
}

/// The cache keeps at most its capacity, dropping the least recently used program: a
/// signature used again stays, the oldest goes and is traced again when it comes back.
#[test]
fn the_jit_cache_is_bounded_and_least_recently_used() {
    let f = jit(|x: Tensor| x * 2.0).cache_capacity(2);
    let x = |n: usize| Tensor::ones([n]);
    f.call(x(1)).unwrap();
    f.call(x(2)).unwrap();
    f.call(x(1)).unwrap(); // 1 is now the most recent
    assert_eq!((f.trace_count(), f.cache_len()), (2, 2));
    f.call(x(3)).unwrap(); // evicts 2
    assert_eq!((f.trace_count(), f.cache_len()), (3, 2));
    f.call(x(1)).unwrap();
    assert_eq!(f.trace_count(), 3, "1 was kept");
    f.call(x(2)).unwrap();
    assert_eq!(f.trace_count(), 4, "2 was dropped and is traced again");
    assert_eq!(f.call(x(2)).unwrap().to_vec::<f32>(), [2.0, 2.0]);
    // A smaller capacity drops the least recent (1), never the last call's (2).
    let f = f.cache_capacity(1);
    assert_eq!(f.cache_len(), 1);
    f.call(x(2)).unwrap();
    assert_eq!(f.trace_count(), 4, "2 was the last call's and kept");
    f.call(x(1)).unwrap();
    assert_eq!((f.trace_count(), f.cache_len()), (5, 1));
    f.call(x(2)).unwrap();
    assert_eq!(f.trace_count(), 6, "2 was dropped for 1");

    // The default bound holds over many shapes.
    let g = jit(|x: Tensor| x + 1.0);
    for n in 0..(tessera::DEFAULT_CACHE_CAPACITY + 10) {
        g.call(x(n)).unwrap();
    }
    assert_eq!(g.cache_len(), tessera::DEFAULT_CACHE_CAPACITY);

    let p = pmap("i", |x: Tensor| x * 3.0).cache_capacity(1);
    p.call(Tensor::ones([1, 2])).unwrap();
    p.call(Tensor::ones([1, 3])).unwrap();
    assert_eq!(p.cache_len(), 1);
}

/// The fast path that reuses the last call's program checks the structure, every type and
/// every placement: a call that differs in any of them is not served the last program.
#[test]
fn the_last_call_fast_path_checks_types_structure_and_placement() {
    let f = jit(|(x, n): (Tensor, usize)| &x * (n as f32));
    let x = Tensor::ones([4]);
    assert_eq!(f.call((x.clone(), 2)).unwrap().to_vec::<f32>(), [2.0; 4]);
    assert_eq!(
        f.call((x.clone(), 3)).unwrap().to_vec::<f32>(),
        [3.0; 4],
        "static value"
    );
    assert_eq!(f.trace_count(), 2);
    let xi = Tensor::from_vec(vec![1i32; 4], [4]);
    assert_eq!(f.call((xi, 3)).unwrap().dtype(), DType::F32);
    assert_eq!(f.trace_count(), 3, "another dtype");
    let mesh = Mesh::new([device_count()], ["dp"]);
    let placed = device_put(x.clone(), NamedSharding::new(&mesh, P![]));
    let y = f.call((placed, 3)).unwrap();
    assert_eq!(f.trace_count(), 4, "another placement");
    assert!(y.sharding().is_some(), "the placed program ran");
    f.call((x, 3)).unwrap();
    assert_eq!(f.trace_count(), 4, "the unplaced program is still cached");
}
