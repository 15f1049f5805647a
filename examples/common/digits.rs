//! The UCI optical-recognition handwritten digits (1,797 8x8 images, pixel values 0..16,
//! labels 0..9; the copy scikit-learn ships as `load_digits`), from the `smartcore` crate's
//! embedded dataset (`smartcore::dataset::digits`, feature `datasets`), and a fixed split:
//! the first 1,536 images train, the other 261 test.
#![allow(dead_code)]

use std::time::Instant;

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

/// Adam's state (optax's `ScaleByAdamState`): first and second moments and the step count.
pub type Adam<P> = (P, P, Tensor);

/// Adam (Kingma and Ba; optax's defaults b1 = 0.9, b2 = 0.999, eps = 1e-8) over any tree.
pub fn adam_init<P: Tree>(p: &P) -> Adam<P> {
    (
        tree::map(p, |x| x.zeros_like()),
        tree::map(p, |x| x.zeros_like()),
        Tensor::scalar(0.0f32),
    )
}

/// One Adam step with learning rate `lr`: the new parameters and state.
pub fn adam_update<P: Tree>(p: &P, g: &P, (m, v, t): &Adam<P>, lr: f32) -> (P, Adam<P>) {
    let t = t + 1.0;
    let m = tree::map2(m, g, |m, g| m * 0.9 + g * 0.1);
    let v = tree::map2(v, g, |v, g| v * 0.999 + g.square() * 0.001);
    // Bias corrections 1 - b^t, as tensors so the step count can be traced.
    let c1 = 1.0 - (&t * 0.9f32.ln()).exp();
    let c2 = 1.0 - (&t * 0.999f32.ln()).exp();
    let (pl, def) = tree::flatten(p);
    let (ml, vl) = (tree::leaves(&m), tree::leaves(&v));
    let new: Vec<Tensor> = pl
        .iter()
        .zip(ml.iter().zip(&vl))
        .map(|(p, (m, v))| p - (m / &c1) / ((v / &c2).sqrt() + 1e-8) * lr)
        .collect();
    (tree::unflatten(&def, new).expect("same tree"), (m, v, t))
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
    for _ in 0..epochs {
        let mut total = 0.0;
        for i in 0..batches {
            let (x, y) = data.batch(i * batch, (i + 1) * batch);
            let (s, l) = f.call((state, device_put(x, &split), device_put(y, &split)))?;
            state = s;
            total += l.item::<f32>();
        }
        epoch_losses.push(total / batches as f32);
    }
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
    let (losses, p) = train(data, epochs, Backend::Cranelift)?;
    for (e, l) in losses.iter().enumerate().step_by(every) {
        println!("Epoch {e}: Loss = {l:.6}");
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
