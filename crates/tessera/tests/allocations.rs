//! Allocations per step in steady state (issue 14), counted by a global allocator on the
//! test's own thread: a count, not a time, so it is stable in CI. A one-device call allocates
//! its outputs and nothing else, the `gemm` crate's products included (their packing is kept
//! on each thread: `vendor/gemm-common/PATCHED.md`); with donation, only the outputs that were
//! not donated (`the_seed_step_allocates_only_its_outputs`,
//! `donated_parameters_are_reused_for_the_outputs`). A pmap step allocates no slice or output
//! per device (`the_pmap_step_allocates_no_slice_or_output_per_device`). A one-device step
//! split over the team allocates nothing on the helper either
//! (`a_step_split_over_the_team_allocates_only_its_outputs`), nor does one whose products
//! the `gemm` crate packs and splits over the rayon pool
//! (`a_step_of_packed_products_allocates_only_its_outputs`), both counted on every thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tessera::prelude::*;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Counting on this thread (the test's; other threads of the harness are not counted).
    static ON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Counting on every thread (`per_step_everywhere`: the team's helper too).
static EVERYWHERE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn note(bytes: usize) {
    if EVERYWHERE.load(Ordering::Relaxed) || ON.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with layout `l` (every allocation goes there).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        // SAFETY: as `dealloc` for `p` and `l`; `n` is the caller's new size.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Tree, Clone)]
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

/// The seed model's loss and gradients.
fn value_and_grads(p: &Mlp, x: &Tensor, y: &Tensor) -> (Tensor, Mlp) {
    value_and_grad(|p: &Mlp| {
        ((x.matmul(&p.w1) + &p.b1).tanh().matmul(&p.w2) + &p.b2 - y)
            .square()
            .mean()
    })(p)
}

fn step(p: Mlp, x: Tensor, y: Tensor) -> (Mlp, Tensor) {
    let (l, g) = value_and_grads(&p, &x, &y);
    (tree::map2(&p, &g, |p, g| p - g * 0.01), l)
}

/// Three steps of `call` with the parameters chained, then two windows of 10 steps: the
/// allocations per step of each window and the bytes per step of the first.
fn steady(
    p: &mut Mlp,
    x: &Tensor,
    y: &Tensor,
    call: impl Fn(Mlp, Tensor, Tensor) -> Mlp,
) -> (usize, usize, usize) {
    for _ in 0..3 {
        let q = std::mem::replace(p, placeholder(x));
        *p = call(q, x.clone(), y.clone());
    }
    let mut run = || {
        let q = std::mem::replace(p, placeholder(x));
        *p = call(q, x.clone(), y.clone());
    };
    let (a, bytes) = per_step(10, &mut run);
    let (again, _) = per_step(10, &mut run);
    (a, again, bytes)
}

/// The seed model's parameters.
fn init() -> Mlp {
    Mlp {
        w1: random::normal(&Key::new(0), [10, 32]) * 0.1,
        b1: Tensor::zeros([32]),
        w2: random::normal(&Key::new(3), [32, 1]) * 0.1,
        b2: Tensor::zeros([1]),
    }
}

/// Four placeholders to swap in while the parameters are moved into a call.
fn placeholder(x: &Tensor) -> Mlp {
    Mlp {
        w1: x.clone(),
        b1: x.clone(),
        w2: x.clone(),
        b2: x.clone(),
    }
}

/// Held by every test from its start: the tests of this file run one at a time, since work
/// another test puts on the shared rayon pool (Cranelift compiles, GEMMs) changes what this
/// one's thread allocates (rayon's global job queue allocates its blocks on the thread that
/// pushes a job).
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    let guard = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    // Eight devices, more than a 2-core machine's cores: the pmap step's devices run in turn
    // on the calling thread, where what they allocate is counted. (The other tests run on
    // one device either way.)
    static DEVICES: std::sync::Once = std::sync::Once::new();
    // Two rayon threads whatever the host, so a one-device run leads the team (`team.rs`
    // takes pools of two threads only); no tiered compilation, whose background compiles would
    // allocate inside the windows counted on every thread.
    DEVICES.call_once(|| {
        // SAFETY: every test calls this first, holding `ALONE`, before any device or pool
        // thread starts; no other thread of this process reads the environment meanwhile.
        unsafe {
            std::env::set_var("TESSERA_DEVICES", "8");
            std::env::set_var("RAYON_NUM_THREADS", "2");
            std::env::set_var("TESSERA_TIERED", "0");
        }
    });
    guard
}

/// Allocations and bytes per call of `f` on the same arguments, over `n` calls.
fn per_step(n: usize, mut f: impl FnMut()) -> (usize, usize) {
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    ON.with(|c| c.set(true));
    for _ in 0..n {
        f();
    }
    ON.with(|c| c.set(false));
    let (a1, b1) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    ((a1 - a0) / n, (b1 - b0) / n)
}

/// The allocations of one output tensor the user keeps: its elements, the shared cell and
/// the literal's `Arc` (its shape is inline).
const PER_OUTPUT: usize = 3;

/// The seed training step, params chained, after warm-up: a call allocates its loss and
/// nothing else of ours, the four parameter outputs written into the buffers and allocations
/// of the parameters moved into it (`jit.rs::take_given_up`; 15 while every output was
/// allocated and the old parameters freed, 42 before the jit kept its per-call vectors,
/// compared the structure without building it, and shapes went inline; 66 at the start of
/// issue 14).
#[test]
fn the_seed_step_allocates_only_its_outputs() {
    let _alone = alone();
    let mut p = init();
    let x = random::normal(&Key::new(1), [256, 10]);
    let y = random::normal(&Key::new(2), [256, 1]);
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let (a, again, bytes) = steady(&mut p, &x, &y, |p, x, y| f.call((p, x, y)).unwrap().0);
    println!("per step: {a} allocations, {bytes} bytes");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, PER_OUTPUT, "{a} allocations per step");
    // The bytes are the loss's (4 bytes) plus its cell and allocations, not the parameters'
    // 1.5 KB.
    assert!(bytes < 512, "{bytes} bytes per step");
    assert_eq!(f.trace_count(), 1);
}

/// Cloning a tensor (a leaf flattened into a call, a handle kept by the user) allocates
/// nothing: shapes up to rank 4 are inline.
#[test]
fn cloning_a_tensor_allocates_nothing() {
    let _alone = alone();
    let x = Tensor::zeros([2, 3, 4, 5]);
    let (a, _) = per_step(10, || drop(std::hint::black_box(x.clone())));
    assert_eq!(a, 0);
}

/// Parameters moved into the call, donated (`donate`, JAX's API) or not: the next step's
/// parameter outputs are written into their buffers and wrapped in their own cells, so a
/// step allocates nothing of ours but the loss it returns, and both give the same values, bit
/// for bit. An argument another tensor still shares is not reused, and that tensor keeps its
/// value.
#[test]
fn given_up_parameters_are_reused_for_the_outputs() {
    let _alone = alone();
    let x = random::normal(&Key::new(1), [256, 10]);
    let y = random::normal(&Key::new(2), [256, 1]);
    let plain = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let donating = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y)).donate(&[0]);
    let (mut p, mut q) = (init(), init());
    for _ in 0..3 {
        p = plain.call((p, x.clone(), y.clone())).unwrap().0;
        q = donating.call((q, x.clone(), y.clone())).unwrap().0;
    }
    let (a_plain, b_plain) = per_step(10, || {
        let old = std::mem::replace(&mut p, placeholder(&x));
        p = plain.call((old, x.clone(), y.clone())).unwrap().0;
    });
    let (a_don, b_don) = per_step(10, || {
        let old = std::mem::replace(&mut q, placeholder(&x));
        q = donating.call((old, x.clone(), y.clone())).unwrap().0;
    });
    println!(
        "plain {a_plain} allocations {b_plain} bytes; donated {a_don} allocations {b_don} bytes"
    );
    assert_eq!(a_don, PER_OUTPUT, "only the loss is allocated");
    assert_eq!(a_plain, PER_OUTPUT, "only the loss is allocated");
    assert_eq!(b_plain, b_don);
    for (a, b) in tree::leaves(&p).iter().zip(tree::leaves(&q).iter()) {
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>());
    }
    // A shared argument is not reused: the clone keeps its value, through the next calls
    // too (whose outputs would be written into its buffer if it were pooled).
    let keeps = |call: &dyn Fn(Mlp) -> Mlp, q: Mlp| {
        let kept = q.clone();
        let before = tree::leaves(&kept)
            .iter()
            .map(|t| t.to_vec::<f32>())
            .collect::<Vec<_>>();
        let mut r = call(q);
        for _ in 0..3 {
            r = call(r);
        }
        let after = tree::leaves(&kept)
            .iter()
            .map(|t| t.to_vec::<f32>())
            .collect::<Vec<_>>();
        assert_eq!(before, after);
        assert_ne!(tree::leaves(&r)[0].to_vec::<f32>(), before[0]);
    };
    keeps(&|q| plain.call((q, x.clone(), y.clone())).unwrap().0, p);
    keeps(&|q| donating.call((q, x.clone(), y.clone())).unwrap().0, q);
}

/// The same step on a 1-device mesh (data `P!["dp"]`, params replicated: the README's
/// program) allocates its loss and nothing else of ours either, as the host step: its
/// elements, its cell and its one shard's `Arc` (no list: `Shards::One`); the parameters'
/// shards and allocations hold the next parameters. It was 15 while every output was
/// allocated, 202 when every output cloned its mesh, devices and spec, 69 before the
/// one-device call ran on the jit's kept vectors (`DeviceProgram::run_one_into`) and placed
/// arrays shared their shard lists, 22 while a one-shard array held a list of one.
#[test]
fn the_seed_step_on_a_one_device_mesh_allocates_only_its_outputs() {
    let _alone = alone();
    let mesh = Mesh::new([1], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let mut p = device_put(init(), NamedSharding::new(&mesh, P![]));
    let x = device_put(random::normal(&Key::new(1), [256, 10]), &data);
    let y = device_put(random::normal(&Key::new(2), [256, 1]), &data);
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let (a, again, _) = steady(&mut p, &x, &y, |p, x, y| f.call((p, x, y)).unwrap().0);
    println!("per step on a 1-device mesh: {a} allocations");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, PER_OUTPUT, "{a} allocations per step");
    assert_eq!(f.trace_count(), 1);
}

/// The same step over 8 devices (the README's program: data `P!["dp"]`, parameters
/// replicated), the devices in turn on the calling thread (more of them than a 2-core
/// machine's cores). The parameters moved into the call hold the next parameters: their
/// elements go to the first device's output pool (it computes the replicated outputs) and
/// their arrays' allocations (the cell, the list of 8 shards, the shard's `Arc`) hold the new
/// arrays (`jit.rs::give_shards_up`, `Array::into_shards_shell`); the devices' runs keep their
/// vectors (`together::Together`). So a step allocates the loss (its elements, its shard's
/// `Arc`, its list and its cell), and nothing else: the lists of the devices' locked programs
/// and of their executables are on the stack (`spmd.rs`'s `LOCAL_DEVICES`). It was 115 (15.5
/// KB) before issue 14's twenty-third pass; 34 with the pools and kept vectors while a pause
/// cloned its collective's axis names; 18 with each output's array allocated; 4 + 2 while
/// those two lists were vectors.
#[test]
fn the_seed_step_over_8_devices_allocates_only_its_outputs() {
    let _alone = alone();
    let mesh = Mesh::new([8], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let mut p = device_put(init(), NamedSharding::new(&mesh, P![]));
    let x = device_put(random::normal(&Key::new(1), [256, 10]), &data);
    let y = device_put(random::normal(&Key::new(2), [256, 1]), &data);
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let before = p.w1.to_vec::<f32>();
    let (a, again, bytes) = steady(&mut p, &x, &y, |p, x, y| f.call((p, x, y)).unwrap().0);
    println!("per step over 8 devices: {a} allocations, {bytes} bytes");
    assert_eq!(a, again, "the count is the same in every window");
    // The loss: `PER_OUTPUT`, and its list of (one) shard.
    assert_eq!(a, PER_OUTPUT + 1, "{a} allocations per step");
    assert!(bytes < 1024, "{bytes} bytes per step");
    assert_eq!(f.trace_count(), 1);
    // The same 23 steps on one device, from the same parameters: the values agree.
    let mut q = init();
    let (x1, y1) = (
        Tensor::from_vec(x.to_vec::<f32>(), [256, 10]),
        Tensor::from_vec(y.to_vec::<f32>(), [256, 1]),
    );
    assert_eq!(q.w1.to_vec::<f32>(), before);
    let g = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    for _ in 0..23 {
        q = g.call((q, x1.clone(), y1.clone())).unwrap().0;
    }
    for (a, b) in tree::leaves(&p).iter().zip(tree::leaves(&q)) {
        let (a, b) = (a.to_vec::<f32>(), b.to_vec::<f32>());
        let far = a
            .iter()
            .zip(&b)
            .map(|(u, v)| (u - v).abs())
            .fold(0f32, f32::max);
        assert!(far < 1e-5, "8 devices and one differ by {far}");
    }
}

/// Donation on a one-device mesh: the parameters' shards and their allocations hold the
/// next parameters, so a step allocates only the loss, with the
/// undonated step's values, bit for bit; a donated parameter whose value the user read (its
/// host value assembled) is still reused, and one the user still holds is not.
#[test]
fn donated_parameters_on_a_one_device_mesh_are_reused() {
    let _alone = alone();
    let mesh = Mesh::new([1], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let replicated = NamedSharding::new(&mesh, P![]);
    let x = device_put(random::normal(&Key::new(1), [256, 10]), &data);
    let y = device_put(random::normal(&Key::new(2), [256, 1]), &data);
    let plain = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    let donating = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y)).donate(&[0]);
    let (mut p, mut q) = (
        device_put(init(), &replicated),
        device_put(init(), &replicated),
    );
    for _ in 0..3 {
        p = plain.call((p, x.clone(), y.clone())).unwrap().0;
        q = donating.call((q, x.clone(), y.clone())).unwrap().0;
    }
    let (a_don, _) = per_step(10, || {
        let old = std::mem::replace(&mut q, placeholder(&x));
        q = donating.call((old, x.clone(), y.clone())).unwrap().0;
    });
    println!("donated on a 1-device mesh: {a_don} allocations");
    assert_eq!(a_don, PER_OUTPUT, "only the loss is allocated");
    for _ in 0..10 {
        p = plain.call((p, x.clone(), y.clone())).unwrap().0;
    }
    for (a, b) in tree::leaves(&p).iter().zip(tree::leaves(&q).iter()) {
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>());
        assert_eq!(b.sharding().map(|s| s.spec.clone()), Some(P![]));
    }
    // The values were read above (host values assembled): still reused.
    let (again, _) = per_step(1, || {
        let old = std::mem::replace(&mut q, placeholder(&x));
        q = donating.call((old, x.clone(), y.clone())).unwrap().0;
    });
    assert_eq!(again, a_don);
    // A parameter the user still holds keeps its value.
    let kept = q.w1.clone();
    let before = kept.to_vec::<f32>();
    let r = donating.call((q, x.clone(), y.clone())).unwrap().0;
    assert_eq!(kept.to_vec::<f32>(), before);
    assert_ne!(r.w1.to_vec::<f32>(), before);
}

/// The seed pmap step over 8 devices, params chained: each device's slices of the mapped
/// inputs are the last call's refilled, and its outputs, once stacked, go back to its
/// program's pool. A step allocated 328 times before (41 a device), 135 while the `gemm`
/// crate allocated its packing on every product (2 a device), 119 while the devices' runs
/// in turn allocated their pauses and lists (`together::Together`), 70 while the call made
/// its per-device lists anew (`pmap.rs::PmapScratch`), 38 while the argument tree was
/// flattened into a new `TreeDef` and list, the input and output specs resolved, the host
/// values and output tensors collected, each stacked output's shape and the list of the
/// devices' locked programs made anew and the processes listed: now only the outputs, the
/// four parameters and the loss, stacked (each of rank at most 4: its shape inline). Slicing anew would add 96 (an element vector and an
/// `Arc` per device and input), outputs not recycled 40.
#[test]
fn the_pmap_step_allocates_only_its_outputs() {
    let _alone = alone();
    let n = device_count();
    assert_eq!(n, 8);
    let (a, again, bytes) = pmap_steady(n);
    println!("pmap over {n} devices: {a} allocations, {bytes} bytes per step");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, 5 * PER_OUTPUT, "{a} allocations per step");
}

/// The README's step on a 2-device mesh, a device a core (the default on a 2-core machine):
/// a launch on the device threads, which allocates the loss and nothing else, counted on
/// every thread (its elements on the device that holds them, its array and shard list here).
#[test]
fn the_seed_step_on_device_threads_allocates_only_its_outputs() {
    let _alone = alone();
    let mesh = Mesh::new([2], ["dp"]);
    let data = NamedSharding::new(&mesh, P!["dp"]);
    let mut p = device_put(init(), NamedSharding::new(&mesh, P![]));
    let x = device_put(random::normal(&Key::new(1), [256, 10]), &data);
    let y = device_put(random::normal(&Key::new(2), [256, 1]), &data);
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    EVERYWHERE.store(true, Ordering::Relaxed);
    let (a, again, bytes) = steady(&mut p, &x, &y, |p, x, y| f.call((p, x, y)).unwrap().0);
    EVERYWHERE.store(false, Ordering::Relaxed);
    println!("per step over 2 device threads: {a} allocations, {bytes} bytes");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, PER_OUTPUT + 1, "{a} allocations per step");
    assert_eq!(f.trace_count(), 1);
}

/// The seed pmap step over 2 devices, no more than a 2-core machine's cores: the devices run
/// on their threads (a launch), and a step allocates its outputs and nothing else, counted on
/// every thread:
/// - the launch is kept (`tessera_runtime::Launcher`: its rendezvous, answers and each
///   device's slot of inputs, outputs and given-back buffers), and its jobs go to the device
///   threads as a shared reference and an index;
/// - the device threads' outputs come from their programs' pools (the stacked-away ones given
///   back through the slots);
/// - the all-reduce meets once over copies in launch buffers, in a slot the rendezvous keeps,
///   its group kept by the executable and its lists on the stack.
///
/// 28 on the calling thread before the launch was kept (13 of them its rendezvous, answer
/// channel, a boxed job a device and its lists), 60 on the Xeon of docs/PERFORMANCE.md; 82 on
/// every thread, 50 with the launch kept.
#[test]
fn the_pmap_step_on_device_threads_allocates_only_its_outputs() {
    let _alone = alone();
    let (a, again, bytes) = pmap_steady(2);
    println!("pmap over 2 devices: {a} allocations, {bytes} bytes per step");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, 5 * PER_OUTPUT, "{a} allocations per step");
    EVERYWHERE.store(true, Ordering::Relaxed);
    let (all, all_again, _) = pmap_steady(2);
    EVERYWHERE.store(false, Ordering::Relaxed);
    println!("pmap over 2 devices, every thread: {all} then {all_again} allocations per step");
    assert_eq!(all, all_again, "the count is the same in every window");
    assert_eq!(
        all,
        5 * PER_OUTPUT,
        "{all} allocations per step on every thread"
    );
}

/// The seed pmap step over `n` devices in its steady state (`steady`).
fn pmap_steady(n: usize) -> (usize, usize, usize) {
    let stack = |a: &Tensor| {
        let mut dims = vec![n];
        dims.extend_from_slice(a.shape());
        let lead: Vec<usize> = (1..=a.rank()).collect();
        a.broadcast_in_dim(dims, &lead)
    };
    let mut p = tree::map(&init(), stack);
    let x = random::normal(&Key::new(1), [n * 32, 10]).reshape([n, 32, 10]);
    let y = random::normal(&Key::new(2), [n * 32, 1]).reshape([n, 32, 1]);
    let f = pmap("i", |(p, x, y): (Mlp, Tensor, Tensor)| {
        let (l, g) = value_and_grads(&p, &x, &y);
        let g = tree::map(&g, |g| pmean(g, "i"));
        (tree::map2(&p, &g, |p, g| p - g * 0.01), pmean(&l, "i"))
    });
    steady(&mut p, &x, &y, |p, x, y| f.call((p, x, y)).unwrap().0)
}

/// A conv and its gradients (im2col + GEMM, the lhs repacked for the kernel's gradient) take
/// their work memory from the thread's scratch: after warm-up a call allocates its outputs
/// and nothing else (20 allocations before: each conv allocated its patch matrix, kernel
/// matrix, product and strides on every call, and the run a vector of its operands; 2 more
/// while the `gemm` crate allocated the packing of one of the three products on every call).
#[test]
fn a_conv_and_its_gradients_allocate_only_their_outputs() {
    let _alone = alone();
    let x = random::normal(&Key::new(1), [4, 1, 6, 6]);
    let w = random::normal(&Key::new(2), [3, 1, 3, 3]);
    let f = jit(|(x, w): (Tensor, Tensor)| {
        let (l, g) =
            value_and_grad(|xw: &(Tensor, Tensor)| xw.0.conv(&xw.1, &[1, 1], "SAME").sum())(&(
                x, w,
            ));
        (l, g.0, g.1)
    });
    for _ in 0..3 {
        f.call((x.clone(), w.clone())).unwrap();
    }
    let (a, _) = per_step(10, || drop(f.call((x.clone(), w.clone())).unwrap()));
    println!("conv value and gradients: {a} allocations per call");
    assert_eq!(a, 3 * PER_OUTPUT, "{a} allocations per call");
}

/// A one-device step large enough to split its ops over the team (`team.rs`: this thread and
/// the helper each run a half of the NHWC conv, its kernel gradient's halves of the
/// features, and the tanh and its gradient): after warm-up, counted on every thread of the
/// process, a call allocates its loss and nothing else (the new kernel goes into the one
/// moved in): not the jobs the helper
/// takes, nor the halves' work memory, nor the split decisions (16 a step while each split
/// kernel decided by walking its expression on an allocated stack). On an AVX-512F host the
/// step's products are all `thin.rs`'s (at most 16 columns); elsewhere the `gemm` crate
/// computes them, packing into the buffers each thread keeps (`vendor/gemm-common`).
#[test]
fn a_step_split_over_the_team_allocates_only_its_outputs() {
    let _alone = alone();
    let x = random::normal(&Key::new(1), [64, 8, 8, 8]);
    let k = random::normal(&Key::new(2), [3, 3, 8, 16]) * 0.1;
    let f = jit(|(k, x): (Tensor, Tensor)| {
        let (l, g) = value_and_grad(|k: &Tensor| {
            let opts = ConvOptions::new()
                .padding("SAME")
                .layout("NHWC", "HWIO", "NHWC");
            x.conv_general_dilated(k, opts).tanh().square().mean()
        })(&k);
        (k - g * 0.01, l)
    });
    let mut k = k;
    for _ in 0..3 {
        k = f.call((k, x.clone())).unwrap().0;
    }
    #[cfg(target_os = "linux")]
    {
        let helpers = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "tessera-team")
            .count();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(helpers, usize::from(cpus >= 2), "the team's helper runs");
    }
    let mut run = || {
        let old = std::mem::replace(&mut k, x.clone());
        k = f.call((old, x.clone())).unwrap().0;
    };
    EVERYWHERE.store(true, Ordering::Relaxed);
    let (a, bytes) = per_step(10, &mut run);
    let (again, _) = per_step(10, &mut run);
    EVERYWHERE.store(false, Ordering::Relaxed);
    println!("split over the team: {a} then {again} allocations, {bytes} bytes per step");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, PER_OUTPUT, "{a} allocations per step");
}

/// A step of the `gemm` crate's products (a 784-256-10 MLP, batch 256: the big MLP's layers,
/// narrower): `x @ w1` and `x^T @ g1` split over the rayon pool (their parts on the workers
/// take tables of packed blocks), `x^T @ g1` and `h^T @ g2` pack their rhs, and `g2 @ w2^T`'s
/// two row parts prepack their lhs. After warm-up, counted on every thread, a call allocates
/// its loss and nothing else (the parameters go into those moved in). Before
/// `vendor/gemm-common` kept each thread's packing buffer and table of packed blocks, those
/// products allocated 12 times a step (27 in all, 15 after it while every output was
/// allocated).
#[test]
fn a_step_of_packed_products_allocates_only_its_outputs() {
    let _alone = alone();
    let mut p = Mlp {
        w1: random::normal(&Key::new(0), [784, 256]) * 0.03,
        b1: Tensor::zeros([256]),
        w2: random::normal(&Key::new(3), [256, 10]) * 0.06,
        b2: Tensor::zeros([10]),
    };
    let x = random::normal(&Key::new(1), [256, 784]);
    let y = random::normal(&Key::new(2), [256, 10]);
    let f = jit(|(p, x, y): (Mlp, Tensor, Tensor)| step(p, x, y));
    for _ in 0..3 {
        let q = std::mem::replace(&mut p, placeholder(&x));
        p = f.call((q, x.clone(), y.clone())).unwrap().0;
    }
    let mut run = || {
        let q = std::mem::replace(&mut p, placeholder(&x));
        p = f.call((q, x.clone(), y.clone())).unwrap().0;
    };
    EVERYWHERE.store(true, Ordering::Relaxed);
    let (a, bytes) = per_step(10, &mut run);
    let (again, _) = per_step(10, &mut run);
    EVERYWHERE.store(false, Ordering::Relaxed);
    println!("packed products: {a} then {again} allocations, {bytes} bytes per step");
    assert_eq!(a, again, "the count is the same in every window");
    assert_eq!(a, PER_OUTPUT, "{a} allocations per step");
}
