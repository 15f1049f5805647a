//! The kept launch (`Launcher`): a launch after a good one reuses its state and allocates
//! nothing on the calling thread (counted by a global allocator); a device's failure leaves the
//! launcher fit for the next launch; a launch whose device did not answer in time is not
//! reused while that device's job still runs, and the launch after it gets every result.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_runtime::{LaunchError, Launcher, SharedCollectives};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with layout `l` (every allocation goes there).
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Two devices whatever the host (read once per process, before any device thread starts).
fn two_devices() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: called first by every test, under `ONCE`, before any device thread
        // starts; no other thread of this test reads the environment meanwhile.
        unsafe { std::env::set_var("TESSERA_DEVICES", "2") };
    });
    assert_eq!(tessera_runtime::device_count(), 2);
}

/// One launch at a time in this file (the devices are shared).
static ALONE: Mutex<()> = Mutex::new(());

/// What the caller leaves for a device, and what its run leaves.
#[derive(Default)]
struct Slot {
    input: i64,
    output: i64,
}

/// A launcher on devices 0 and 1 whose run writes `input * 10 + executable + position`,
/// fails on input -1, sleeps 400 ms on input -2 (then writes -2), panics on -3.
fn launcher(timeout: Duration) -> Launcher<i64, Slot, String> {
    let executables = Arc::new(vec![Mutex::new(100), Mutex::new(200)]);
    let run = |x: &i64, s: &mut Slot, _c: &SharedCollectives<'_>, p: usize| match s.input {
        -1 => Err(format!("device at {p} refused")),
        -2 => {
            std::thread::sleep(Duration::from_millis(400));
            s.output = -2;
            Ok(())
        }
        -3 => panic!("position {p} panicked"),
        i => {
            s.output = i * 10 + x + p as i64;
            Ok(())
        }
    };
    Launcher::new(&[0, 1], &[0, 1], executables, timeout, Arc::new(run)).unwrap()
}

fn launch(l: &mut Launcher<i64, Slot, String>, inputs: [i64; 2]) -> Result<[i64; 2], String> {
    for (k, i) in inputs.into_iter().enumerate() {
        l.slot(k).input = i;
    }
    l.launch().map_err(|e| e.to_string())?;
    Ok([l.slot(0).output, l.slot(1).output])
}

#[test]
fn a_kept_launch_allocates_nothing_on_the_calling_thread() {
    two_devices();
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut l = launcher(Duration::from_secs(10));
    for i in 0..3 {
        assert_eq!(
            launch(&mut l, [i, i + 1]),
            Ok([i * 10 + 100, (i + 1) * 10 + 201])
        );
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    ON.with(|c| c.set(true));
    for i in 0..20 {
        for (k, input) in [i, 2 * i].into_iter().enumerate() {
            l.slot(k).input = input;
        }
        l.launch().unwrap();
        assert_eq!(l.slot(1).output, 2 * i * 10 + 201);
    }
    ON.with(|c| c.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(allocs, 0, "{allocs} allocations in 20 launches");
}

#[test]
fn a_failed_or_panicking_device_leaves_the_launcher_fit_for_the_next_launch() {
    two_devices();
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut l = launcher(Duration::from_secs(10));
    assert_eq!(launch(&mut l, [1, 2]), Ok([110, 221]));
    assert_eq!(
        launch(&mut l, [5, -1]),
        Err("device 1: device at 1 refused".to_string())
    );
    assert_eq!(launch(&mut l, [3, 4]), Ok([130, 241]));
    assert_eq!(
        launch(&mut l, [-3, 0]),
        Err("device 0 panicked: position 0 panicked".to_string())
    );
    assert_eq!(launch(&mut l, [6, 7]), Ok([160, 271]));
}

#[test]
fn a_launch_after_one_that_timed_out_gets_every_result() {
    two_devices();
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut l = launcher(Duration::from_millis(100));
    assert_eq!(launch(&mut l, [1, 2]), Ok([110, 221]));
    // Device 1 sleeps past the timeout: no answer.
    for (k, i) in [0, -2].into_iter().enumerate() {
        l.slot(k).input = i;
    }
    match l.launch() {
        Err(LaunchError::NoAnswer { devices, .. }) => assert_eq!(devices, vec![1]),
        other => panic!("{:?}", other.map_err(|e| e.to_string())),
    }
    // Its job still runs on the state of that launch; this one gets a fresh state (empty
    // slots) whose job on device 1 waits behind it.
    assert_eq!(l.slot(1).input, 0, "a fresh slot");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(launch(&mut l, [8, 9]), Ok([180, 291]));
}
