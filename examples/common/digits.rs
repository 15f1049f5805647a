//! The UCI optical-recognition handwritten digits (1,797 8x8 images, pixel values 0..16,
//! labels 0..9; the copy scikit-learn ships as `load_digits`), from the `smartcore` crate's
//! embedded dataset (`smartcore::dataset::digits`, feature `datasets`), and a fixed split:
//! the first 1,536 images train, the other 261 test.
#![allow(dead_code)]

use std::time::Instant;

#[path = "progress.rs"]
pub mod progress;

use tessera::optim::{self, GradientTransformation};
use tessera::prelude::*;

pub const TRAIN: usize = 1536;

/// Images scaled to [0, 1] as `[n, 8, 8]` f32, and labels as `[n]` i32.
pub struct Digits {
    pub images: Vec<f32>,
    pub labels: Vec<i32>,
    pub n: usize,
}

pub fn load() -> Digits {
    let d = smartcore::dataset::digits::load_dataset();
    assert_eq!((d.num_samples, d.num_features), (1797, 64));
    Digits {
        images: d.data.iter().map(|p| p / 16.0).collect(),
        labels: d.target.iter().map(|&y| y as i32).collect(),
        n: d.num_samples,
    }
}

impl Digits {
    /// Images `lo..hi` as a `[hi - lo, 8, 8]` tensor and their labels as `[hi - lo]` i32.
    pub fn batch(&self, lo: usize, hi: usize) -> (Tensor, Tensor) {
        (
            Tensor::from_vec(self.images[lo * 64..hi * 64].to_vec(), [hi - lo, 8, 8]),
            Tensor::from_vec(self.labels[lo..hi].to_vec(), [hi - lo]),
        )
    }
}

/// Adam's state (`tessera::optim`: the moments, the step count).
pub type Adam<P> = optim::AdamOptState<P>;

/// Adam's state before the first step.
pub fn adam_init<P: Tree>(p: &P) -> Adam<P> {
    optim::adam(1e-3).init(p)
}

/// One Adam step (optax's defaults, learning rate `lr`) on parameters `p` with gradient `g`.
pub fn adam_update<P: Tree>(p: &P, g: &P, s: &Adam<P>, lr: f64) -> (P, Adam<P>) {
    let (u, s) = optim::adam(lr).update(tree::map(g, Tensor::clone), s, p);
    (optim::apply_updates(p, &u), s)
}

/// Softmax cross-entropy of `logits [b, 10]` against integer `labels [b]`: each row's
/// log-probability of its label, by `take_along_axis` (`optax.softmax_cross_entropy_with_
/// integer_labels`).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Tensor {
    let b = logits.shape()[0];
    let picked = logits
        .log_softmax(-1)
        .take_along_axis(&labels.reshape([b, 1]), 1);
    -picked.sum() / b as f32
}

/// The fraction of `logits`' argmaxes equal to `labels`.
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> f32 {
    let pred = logits.argmax(-1).to_vec::<i32>();
    let want = labels.to_vec::<i32>();
    pred.iter().zip(&want).filter(|(a, b)| a == b).count() as f32 / want.len() as f32
}

/// A model's training state: its parameters and Adam's.
pub type State<P> = (P, Adam<P>);

/// Trains `epochs` passes over the training images in batches of `batch` on `backend`, the
/// batch split over a mesh axis `dp` of every device and the state replicated, starting from
/// `p` with `step` jitted as `name`; returns each epoch's mean loss and the final parameters.
pub fn train<P: Tree + Clone>(
    data: &Digits,
    (epochs, batch): (usize, usize),
    backend: Backend,
    (name, p): (&str, P),
    step: impl Fn(State<P>, Tensor, Tensor) -> (State<P>, Tensor),
) -> Result<(Vec<f32>, P)> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let mut state = device_put((p.clone(), adam_init(&p)), NamedSharding::new(&mesh, P![]));
    let f = jit(|(s, x, y): (State<P>, Tensor, Tensor)| step(s, x, y))
        .named(name)
        .backend(backend);
    let mut epoch_losses = Vec::with_capacity(epochs);
    let batches = TRAIN / batch;
    let bar = progress::bar(epochs * batches, name);
    for _ in 0..epochs {
        let mut total = 0.0;
        for i in 0..batches {
            let (x, y) = data.batch(i * batch, (i + 1) * batch);
            let (s, l) = f.call((state, device_put(x, &split), device_put(y, &split)))?;
            state = s;
            let l = l.item::<f32>();
            total += l;
            bar.set_message(format!("loss {l:.4}"));
            bar.inc(1);
        }
        epoch_losses.push(total / batches as f32);
    }
    bar.finish_and_clear();
    Ok((epoch_losses, state.0))
}

/// Mean time of one training step (batch `batch`, split as in `train`) on `backend`, in ms,
/// over `steps` steps after a first (compiling) call.
pub fn time_per_step<P: Tree + Clone>(
    data: &Digits,
    (batch, steps): (usize, usize),
    backend: Backend,
    p: P,
    step: impl Fn(State<P>, Tensor, Tensor) -> (State<P>, Tensor),
) -> Result<f64> {
    let mesh = Mesh::new([device_count()], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let mut state = device_put((p.clone(), adam_init(&p)), NamedSharding::new(&mesh, P![]));
    let (x, y) = data.batch(0, batch);
    let (x, y) = (device_put(x, &split), device_put(y, &split));
    let f = jit(|(s, x, y): (State<P>, Tensor, Tensor)| step(s, x, y)).backend(backend);
    state = f.call((state, x.clone(), y.clone()))?.0;
    let t = Instant::now();
    for _ in 0..steps {
        state = f.call((state, x.clone(), y.clone()))?.0;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

/// What an example's `main` prints: the devices and split, every `every`-th epoch's loss of
/// `epochs` (from `train`), the test accuracy of the trained parameters, and the compiled
/// against the interpreted step time (`timed` steps each, from `time`).
pub fn report<P>(
    data: &Digits,
    (epochs, every): (usize, usize),
    train: impl Fn(&Digits, usize, Backend) -> Result<(Vec<f32>, P)>,
    forward: impl Fn(&P, &Tensor) -> Tensor,
    time: impl Fn(&Digits, Backend, usize) -> Result<f64>,
    (compiled_steps, interpreted_steps): (usize, usize),
) -> Result<()> {
    println!(
        "devices: {}; digits: {} train, {} test",
        device_count(),
        TRAIN,
        data.n - TRAIN
    );
    let plot = progress::plot_arg()?;
    let (losses, p) = train(data, epochs, Backend::Cranelift)?;
    for (e, l) in losses.iter().enumerate().step_by(every) {
        println!("Epoch {e}: Loss = {l:.6}");
    }
    if let Some(path) = plot {
        progress::plot_losses(&path, "training loss", "epoch", &losses)?;
        println!("wrote the loss curve to {}", path.display());
    }
    let (x, y) = data.batch(TRAIN, data.n);
    println!("test accuracy: {:.3}", accuracy(&forward(&p, &x), &y));
    let compiled = time(data, Backend::Cranelift, compiled_steps)?;
    let interpreted = time(data, Backend::Interpreter, interpreted_steps)?;
    println!(
        "Time per step: compiled {compiled:.3} ms, interpreted {interpreted:.3} ms ({:.0}x)",
        interpreted / compiled
    );
    Ok(())
}
