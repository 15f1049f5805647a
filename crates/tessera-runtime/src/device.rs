//! Host devices: `TESSERA_DEVICES=N` worker threads (default: the number of cores), each owning
//! what runs on it. Work is handed to a device as a closure; a launch waits for all of them.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

struct Devices {
    senders: Vec<Mutex<Sender<Job>>>,
}

fn devices() -> &'static Devices {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let n = device_count();
        let senders = (0..n)
            .map(|d| {
                let (tx, rx) = channel::<Job>();
                std::thread::Builder::new()
                    .name(format!("tessera-device-{d}"))
                    .spawn(move || {
                        // Between launches: yield a while (steps come back to back), then park.
                        while let Some(job) = receive(&rx) {
                            job();
                        }
                    })
                    .expect("spawn a device thread");
                Mutex::new(tx)
            })
            .collect();
        Devices { senders }
    })
}

/// How many times a waiting thread yields its core before it parks.
const YIELDS_BEFORE_PARKING: usize = 256;

/// The next message: polled while yielding the core a bounded number of times, then waited for
/// parked. `None` when the sender is gone.
fn receive<T>(rx: &std::sync::mpsc::Receiver<T>) -> Option<T> {
    for _ in 0..YIELDS_BEFORE_PARKING {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

/// The number of host devices: `TESSERA_DEVICES`, or the number of cores.
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::env::var("TESSERA_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Runs `f(i)` for every `i` in `0..devices.len()` on device `devices[i]`'s thread, all at
/// once, and returns the results in order. Blocks until every device is done. A panic on a
/// device becomes an `Err` with its message; the device thread lives on.
pub fn run_on_devices<T: Send + 'static>(
    devices_used: &[usize],
    f: Arc<dyn Fn(usize) -> T + Send + Sync>,
) -> Result<Vec<T>, String> {
    let d = devices();
    // One launch at a time: two launches whose jobs queue on the devices in different orders
    // would each hold a device the other waits for in a collective (the deadlock XLA's CPU
    // client runs into with many steps in flight). The lock is held until every device of
    // this launch is done.
    static LAUNCH: Mutex<()> = Mutex::new(());
    let _launch = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    let (tx, rx) = channel::<(usize, Result<T, String>)>();
    for (i, &dev) in devices_used.iter().enumerate() {
        let f = f.clone();
        let tx = tx.clone();
        let job: Job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a device panicked".into())
            });
            let _ = tx.send((i, r));
        });
        d.senders[dev]
            .lock()
            .expect("device queue lock")
            .send(job)
            .expect("device thread alive");
    }
    drop(tx);
    let mut out: Vec<Option<Result<T, String>>> = (0..devices_used.len()).map(|_| None).collect();
    while let Some((i, r)) = receive(&rx) {
        out[i] = Some(r);
    }
    out.into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| Err(format!("device {} did not answer", devices_used[i])))
        })
        .collect()
}
