//! The examples print what they promise: each example file is compiled here as a module and its
//! entry point checked against the reference numbers (JAX 0.10.2's, from
//! `shared/anchors/jax/seed_outputs.txt`). This binary sets `TESSERA_DEVICES=8` before any
//! device starts, so the data-parallel programs run on 8 devices as the anchors did.
// Every example includes the shared `examples/common/mlp.rs`.
#![allow(clippy::duplicate_mod)]

#[allow(dead_code)]
#[path = "../examples/train_single.rs"]
mod train_single;

#[allow(dead_code)]
#[path = "../examples/data_parallel_sharding.rs"]
mod data_parallel_sharding;

#[allow(dead_code)]
#[path = "../examples/data_parallel_pmap.rs"]
mod data_parallel_pmap;

#[allow(dead_code)]
#[path = "../examples/mesh_2d.rs"]
mod mesh_2d;

#[allow(dead_code)]
#[path = "../examples/data_parallel_shard_map.rs"]
mod data_parallel_shard_map;

#[allow(dead_code)]
#[path = "../examples/rnn_scan.rs"]
mod rnn_scan;

#[allow(dead_code)]
#[path = "../examples/attention_digits.rs"]
mod attention_digits;

#[allow(dead_code)]
#[path = "../examples/cnn_digits.rs"]
mod cnn_digits;

#[allow(dead_code)]
#[path = "../examples/data_loader.rs"]
mod data_loader;

use tessera::Backend;

/// The f32 bits of the losses JAX prints at steps 0, 10, 20, 30, 40.
const JAX_SEED: [u32; 5] = [0x3f891040, 0x3f866787, 0x3f847412, 0x3f82fd49, 0x3f81df00];
const JAX_PMAP_8: [u32; 5] = [0x3f857d6e, 0x3f83e605, 0x3f82bd3d, 0x3f81e0c7, 0x3f813a4a];
const JAX_PMAP_1: [u32; 5] = [0x3f8fa1dd, 0x3f8b15ea, 0x3f87aa57, 0x3f84f84d, 0x3f82c504];

/// Each loss is JAX's to within 1e-6 relative, a few units in the last place of f32: a
/// different summation order or tanh polynomial moves the last bits, and where JAX's value sits
/// that close to a rounding boundary, the sixth printed decimal can differ by one.
fn check(losses: &[f32], jax: [u32; 5], what: &str) {
    // Every printed loss is there: a short run must not pass by zipping fewer values.
    assert_eq!(
        losses.len(),
        41,
        "{what}: 41 steps, losses printed at 0, 10, .., 40"
    );
    assert_eq!(losses.iter().step_by(10).count(), jax.len(), "{what}");
    for (i, (l, j)) in losses.iter().step_by(10).zip(jax).enumerate() {
        let j = f32::from_bits(j);
        assert!(
            (l - j).abs() <= 1e-6 * j.abs(),
            "{what}: step {}: {l} vs JAX's {j}",
            i * 10
        );
    }
}

fn eight_devices() {
    // SAFETY: set before the device pool starts (every test calls this first) and before any
    // other thread reads the environment; the value is the same for every test.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(tessera::device_count(), 8);
}

#[test]
fn train_single_prints_jax_losses_on_both_backends() {
    eight_devices();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let losses = train_single::train(41, backend).unwrap();
        check(&losses, JAX_SEED, &format!("{backend:?}"));
    }
    // The compiled single-device program prints exactly JAX's six decimals.
    let printed: Vec<String> = train_single::train(41, Backend::Cranelift)
        .unwrap()
        .iter()
        .step_by(10)
        .map(|l| format!("{l:.6}"))
        .collect();
    assert_eq!(
        printed,
        ["1.070808", "1.050034", "1.034792", "1.023355", "1.014618"]
    );
}

#[test]
fn data_parallel_sharding_prints_jax_losses_on_8_devices() {
    eight_devices();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let (losses, params, loss) = data_parallel_sharding::train(41, backend).unwrap();
        check(&losses, JAX_SEED, &format!("sharded {backend:?}"));
        assert_eq!(
            loss.sharding().unwrap().to_string(),
            "NamedSharding(mesh=Mesh('dp': 8), spec=P())"
        );
        assert_eq!(
            params.w1.sharding().unwrap().spec.0.len(),
            0,
            "parameters stay replicated"
        );
    }
}

#[test]
fn both_seeds_written_with_shard_map_print_jax_losses_on_8_devices() {
    eight_devices();
    let (pmap, params, _) = data_parallel_shard_map::train_pmap_seed(41).unwrap();
    check(&pmap, JAX_PMAP_8, "shard_map pmap seed");
    assert_eq!(params.w1.sharding().unwrap().spec.0.len(), 0, "replicated");
    let (sharding, _, per_device) = data_parallel_shard_map::train_sharding_seed(41).unwrap();
    check(&sharding, JAX_SEED, "shard_map sharding seed");
    // The per-device step averages the gradients and the loss in one all-reduce over dp.
    assert_eq!(
        per_device.matches("= all_reduce ").count(),
        1,
        "{per_device}"
    );
}

#[test]
fn data_parallel_pmap_prints_jax_losses_on_8_and_1_devices() {
    eight_devices();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let l8 = data_parallel_pmap::train(8, 41, backend).unwrap();
        check(&l8, JAX_PMAP_8, &format!("pmap {backend:?} on 8"));
        let l1 = data_parallel_pmap::train(1, 41, backend).unwrap();
        check(&l1, JAX_PMAP_1, &format!("pmap {backend:?} on 1"));
    }
}

#[test]
fn mesh_2d_matches_the_single_device_run() {
    eight_devices();
    let (losses, per_device, x, w1) = mesh_2d::train(41).unwrap();
    let single = train_single::train(41, Backend::Cranelift).unwrap();
    // Explicit axes: rejected without out_sharding, naming the dot; with it, the same losses
    // and the same two all-reduces.
    let (explicit, explicit_ir, ambiguous) = mesh_2d::train_explicit(41).unwrap();
    assert!(
        ambiguous.contains("Contracting dimensions are sharded") && ambiguous.contains("mlp.rs:"),
        "{ambiguous}"
    );
    for (i, (a, b)) in explicit.iter().zip(&losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "explicit step {i}: {a} vs {b}"
        );
    }
    assert_eq!(
        explicit_ir.matches("= all_reduce ").count(),
        2,
        "{explicit_ir}"
    );
    assert_eq!((losses.len(), single.len()), (41, 41), "every step's loss");
    for (i, (a, b)) in losses.iter().zip(&single).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {i}: {a} vs {b}");
    }
    // The second layer's partial sums complete over mp; the gradients over dp, combined.
    assert!(
        per_device.contains(r#"all_reduce"#) && per_device.contains(r#"axes=["mp"]"#),
        "{per_device}"
    );
    assert!(per_device.contains("all-reduces combined"), "{per_device}");
    assert!(
        per_device.contains("f32[10,16]") && per_device.contains("f32[64,10]"),
        "local shapes:\n{per_device}"
    );
    assert_eq!(
        x.sharding().unwrap().to_string(),
        "NamedSharding(mesh=Mesh('dp': 4, 'mp': 2), spec=P('dp'))"
    );
    assert_eq!(
        w1.sharding().unwrap().spec.0,
        vec![vec![], vec!["mp".to_string()]]
    );
}

/// The scan RNN learns (its loss falls by 10x in 40 steps), on both backends, and trains like
/// the same RNN unrolled by a Rust loop (on shorter sequences, where the unrolled program
/// compiles quickly).
#[test]
fn rnn_scan_learns_and_matches_the_unrolled_rnn() {
    eight_devices();
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        let losses = rnn_scan::train(41, 60, rnn_scan::loss_scan, backend).unwrap();
        assert!(losses[40] < 0.1 * losses[0], "{backend:?}: {losses:?}");
        let unrolled = rnn_scan::train(41, 60, rnn_scan::loss_unrolled, backend).unwrap();
        for (i, (a, b)) in losses.iter().zip(&unrolled).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "{backend:?} step {i}: {a} vs {b}"
            );
        }
    }
}

/// The attention block learns the digits over 8 devices: the epoch loss falls from ln(10) by
/// more than half in 4 epochs and the test accuracy is far above chance; a step on the
/// interpreter gives the compiled step's loss.
#[test]
fn attention_digits_learns_on_eight_devices() {
    eight_devices();
    let data = attention_digits::digits::load();
    let (losses, p) = attention_digits::train(&data, 4, Backend::Cranelift).unwrap();
    assert!((losses[0] - 10f32.ln()).abs() < 0.5, "{losses:?}");
    assert!(losses[3] < 0.5 * losses[0], "{losses:?}");
    let (x, y) = data.batch(attention_digits::digits::TRAIN, data.n);
    let acc = attention_digits::digits::accuracy(&attention_digits::forward(&p, &x), &y);
    assert!(acc > 0.6, "test accuracy {acc}");
    let (_, ip) = attention_digits::train(&data, 1, Backend::Interpreter).unwrap();
    let (_, cp) = attention_digits::train(&data, 1, Backend::Cranelift).unwrap();
    let (a, b) = (ip.head.to_vec::<f32>(), cp.head.to_vec::<f32>());
    for (i, (u, v)) in a.iter().zip(&b).enumerate() {
        assert!(
            (u - v).abs() <= 1e-3 * (1.0 + v.abs()),
            "head[{i}]: interpreted {u}, compiled {v}"
        );
    }
}

/// The CNN (two SAME convs with relu and max-pool, a dense layer) learns the digits over 8
/// devices: the loss falls by more than half in 3 epochs and the test accuracy is far above
/// chance; one step on the interpreter gives the compiled step's loss and parameters.
#[test]
fn cnn_digits_learns_on_eight_devices() {
    use tessera::prelude::*;
    eight_devices();
    let data = cnn_digits::digits::load();
    let (losses, p) = cnn_digits::train(&data, 3, Backend::Cranelift).unwrap();
    assert!(losses[0] < 10f32.ln() + 0.1, "{losses:?}");
    assert!(losses[2] < 0.5 * losses[0], "{losses:?}");
    let (x, y) = data.batch(cnn_digits::digits::TRAIN, data.n);
    let acc = cnn_digits::digits::accuracy(&cnn_digits::forward(&p, &x), &y);
    assert!(acc > 0.6, "test accuracy {acc}");
    let mesh = Mesh::new([8], ["dp"]);
    let split = NamedSharding::new(&mesh, P!["dp"]);
    let p0 = cnn_digits::init(Key::new(0));
    let (x, y) = data.batch(0, cnn_digits::BATCH);
    let mut results = Vec::new();
    for backend in [Backend::Interpreter, Backend::Cranelift] {
        let state = device_put(
            (p0.clone(), cnn_digits::digits::adam_init(&p0)),
            NamedSharding::new(&mesh, P![]),
        );
        let f = jit(|(s, x, y): (_, Tensor, Tensor)| cnn_digits::step(s, x, y)).backend(backend);
        let ((p, _), l) = f
            .call((
                state,
                device_put(x.clone(), &split),
                device_put(y.clone(), &split),
            ))
            .unwrap();
        results.push((l.item::<f32>(), p.k1.to_vec::<f32>()));
    }
    let ((li, ki), (lc, kc)) = (&results[0], &results[1]);
    assert!(
        (li - lc).abs() <= 1e-5 * lc.abs(),
        "loss: interpreted {li}, compiled {lc}"
    );
    for (i, (u, v)) in ki.iter().zip(kc).enumerate() {
        assert!(
            (u - v).abs() <= 1e-5 * (1.0 + v.abs()),
            "k1[{i}]: interpreted {u}, compiled {v}"
        );
    }
}

/// The data-loader example: batches built on a loader thread give exactly the losses of the
/// same batches built inline, and Adam drives the loss down by more than 20x in 300 steps.
#[test]
fn data_loader_trains_on_batches_from_a_thread() {
    let threaded = data_loader::train(300, true).unwrap();
    let inline = data_loader::train(300, false).unwrap();
    assert_eq!(
        threaded, inline,
        "the thread changes where batches are built, not what"
    );
    let first = threaded[0];
    let last: f32 = threaded[280..].iter().sum::<f32>() / 20.0;
    assert!(last < first / 20.0, "loss {first} -> {last}");
}

/// `--plot loss.svg` writes the loss curve: an SVG with the title and one polyline through
/// every loss; without `--plot` nothing is written; `--plot` without a name is an error. The
/// progress bar draws only on a terminal (hidden under the test harness).
#[test]
fn examples_plot_the_loss_curve_and_hide_the_bar_off_a_terminal() {
    use data_loader::progress::{bar, plot_arg_from, plot_losses};
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        plot_arg_from(args(&["--plot", "a.svg"])).unwrap(),
        Some("a.svg".into())
    );
    assert_eq!(
        plot_arg_from(args(&["x", "--plot=b.svg"])).unwrap(),
        Some("b.svg".into())
    );
    assert_eq!(plot_arg_from(args(&["x"])).unwrap(), None);
    let err = plot_arg_from(args(&["--plot"])).unwrap_err().to_string();
    assert!(err.contains("--plot needs a file name"), "{err}");

    let path = std::env::temp_dir().join(format!("tessera-loss-{}.svg", std::process::id()));
    let losses: Vec<f32> = (0..50).map(|i| 1.0 / (1.0 + i as f32)).collect();
    plot_losses(&path, "the title", "step", &losses).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("the title"),
        "{svg}"
    );
    let line = svg
        .lines()
        .find(|l| l.starts_with("<polyline") && l.contains("#0000FF"))
        .unwrap_or_else(|| panic!("a polyline:\n{svg}"));
    let points = line
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert_eq!(points.split_whitespace().count(), losses.len(), "{line}");
    assert!(plot_losses(&path, "t", "step", &[]).is_err());
    // A diverged run: all non-finite is an error; a NaN among finite losses is left out.
    let err = plot_losses(&path, "t", "step", &[f32::NAN, f32::INFINITY]).unwrap_err();
    assert!(
        err.to_string().contains("every loss is NaN or infinite"),
        "{err}"
    );
    plot_losses(&path, "t", "step", &[1.0, f32::NAN, 0.5]).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let line = svg
        .lines()
        .find(|l| l.starts_with("<polyline") && l.contains("#0000FF"))
        .unwrap();
    assert!(!line.contains("NaN"), "{line}");

    assert!(bar(10, "test").is_hidden(), "no terminal under the harness");
}
