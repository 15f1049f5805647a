//! Checkpoints in safetensors: a sharded parameter tree on 8 devices saved and loaded bit for
//! bit and placed again (as it was, or as given), every dtype, the file's layout as the format
//! defines it, and the errors a wrong file gets (missing, extra, wrong dtype or shape, corrupt,
//! a bool byte other than 0 or 1).

use tessera::checkpoint::{load, load_placed, save};
use tessera::prelude::*;

fn eight_devices() {
    // SAFETY: every test calls this first, before the device pool starts and before any other
    // thread reads the environment; the value is always the same.
    unsafe { std::env::set_var("TESSERA_DEVICES", "8") };
    assert_eq!(device_count(), 8);
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir.join(name)
}

#[derive(Tree, Clone, Debug)]
struct Layer {
    w: Tensor,
    b: Tensor,
}

#[derive(Tree, Clone, Debug)]
struct Model {
    layers: Vec<Layer>,
    step: Tensor,
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_sharded_tree_round_trips_bit_for_bit_and_is_placed_again() {
    eight_devices();
    let mesh = Mesh::new([4, 2], ["dp", "mp"]);
    let put = |t: Tensor, s: PartitionSpec| device_put(t, NamedSharding::new(&mesh, s));
    let model = Model {
        layers: vec![
            Layer {
                w: put(random::normal(&Key::new(1), [8, 6]), P!["dp", "mp"]),
                b: put(
                    random::normal(&Key::new(2), [6]) * f32::MIN_POSITIVE,
                    P!["mp"],
                ),
            },
            Layer {
                w: put(random::normal(&Key::new(3), [6, 4]), P![None, "mp"]),
                b: put(
                    Tensor::from_vec(vec![f32::NAN, -0.0, f32::INFINITY, 1e-45], [4]),
                    P![],
                ),
            },
        ],
        step: Tensor::from_vec(vec![7i32], Vec::<usize>::new()),
    };
    let path = tmp("model.safetensors");
    save(&model, &path).expect("saves");
    let back: Model = load(&path, &model).expect("loads");
    for (a, b) in model.layers.iter().zip(&back.layers) {
        assert_eq!(bits(&a.w), bits(&b.w));
        assert_eq!(bits(&a.b), bits(&b.b));
        assert_eq!(a.w.sharding(), b.w.sharding(), "placed as it was");
        assert_eq!(a.b.sharding(), b.b.sharding());
    }
    assert_eq!(back.step.to_vec::<i32>(), vec![7]);
    assert!(back.step.sharding().is_none(), "a host value stays one");
    // Placed as given instead.
    let all = NamedSharding::new(&mesh, P![]);
    let re: Model = load_placed(&path, &model, &all).expect("loads");
    assert_eq!(re.layers[0].w.sharding().expect("placed").spec, P![]);
    assert_eq!(bits(&re.layers[0].w), bits(&model.layers[0].w));
    // The file is the format's: an 8-byte header length, a JSON header naming each leaf by its
    // path with its dtype, shape and offsets, then the little-endian data.
    let raw = std::fs::read(&path).expect("readable");
    let n = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&raw[8..8 + n]).expect("a JSON header");
    for key in [
        r#""layers.0.w":{"dtype":"F32","shape":[8,6]"#,
        r#""layers.1.b":{"dtype":"F32","shape":[4]"#,
        r#""step":{"dtype":"I32","shape":[]"#,
    ] {
        assert!(header.contains(key), "{key} in {header}");
    }
    assert_eq!(raw.len(), 8 + n + 4 * (48 + 6 + 24 + 4) + 4);
}

#[test]
fn every_dtype_round_trips() {
    eight_devices();
    let tree = (
        Tensor::from_vec(vec![1.5f64, -2.25], [2]),
        Tensor::from_vec(vec![3u32, u32::MAX], [2]),
        Tensor::from_vec(vec![i64::MIN, 5], [2]),
        Tensor::from_vec(vec![true, false, true], [3]),
        Tensor::from_vec(vec![0.5f32, 65504.0], [2]).astype(DType::F16),
        Tensor::from_vec(vec![0.5f32, -3.0e38], [2]).astype(DType::BF16),
        Tensor::zeros([0, 3]),
    );
    let path = tmp("dtypes.safetensors");
    save(&tree, &path).expect("saves");
    let back = load(&path, &tree).expect("loads");
    let f = |t: &Tensor| t.astype(DType::F64).to_vec::<f64>();
    assert_eq!(f(&back.0), f(&tree.0));
    assert_eq!(back.1.to_vec::<u32>(), tree.1.to_vec::<u32>());
    assert_eq!(back.2.to_vec::<i64>(), tree.2.to_vec::<i64>());
    assert_eq!(back.3.to_vec::<bool>(), tree.3.to_vec::<bool>());
    assert_eq!((back.4.dtype(), f(&back.4)), (DType::F16, f(&tree.4)));
    assert_eq!((back.5.dtype(), f(&back.5)), (DType::BF16, f(&tree.5)));
    assert_eq!(back.6.shape(), &[0, 3]);
}

#[test]
fn a_wrong_file_is_an_error_naming_the_leaf() {
    eight_devices();
    let model = Layer {
        w: Tensor::zeros([2, 3]),
        b: Tensor::zeros([3]),
    };
    let path = tmp("layer.safetensors");
    save(&model, &path).expect("saves");
    let here = "tests/checkpoint.rs:";
    // Another structure: a missing name, then extra tensors.
    let e = load(&path, &(Tensor::zeros([2, 3]),))
        .expect_err("no such leaf")
        .to_string();
    assert!(e.contains("no tensor \"0\"") && e.contains(here), "{e}");
    let e = load(
        &path,
        &Layer {
            w: Tensor::zeros([2, 3]),
            b: Tensor::zeros([3]),
        }
        .w,
    )
    .expect_err("arg")
    .to_string();
    assert!(e.contains("no tensor \"arg\""), "{e}");
    // The same names with another dtype or shape.
    let wrong = Layer {
        w: Tensor::zeros([3, 2]),
        b: Tensor::zeros([3]),
    };
    let e = load(&path, &wrong).expect_err("shape").to_string();
    assert!(
        e.contains("\"w\" is F32[2, 3]") && e.contains("f32[3,2]"),
        "{e}"
    );
    let wrong = Layer {
        w: Tensor::zeros([2, 3]),
        b: Tensor::zeros([3]).astype(DType::F64),
    };
    let e = load(&path, &wrong).expect_err("dtype").to_string();
    assert!(e.contains("\"b\" is F32[3]") && e.contains("f64[3]"), "{e}");
    // A file with more tensors than the tree has leaves.
    let bigger = (model.clone(), Tensor::zeros([1]));
    let big = tmp("bigger.safetensors");
    save(&bigger, &big).expect("saves");
    let e = load(
        &big,
        &(model.clone(), Tensor::zeros([1]), Tensor::zeros([1])),
    )
    .expect_err("one leaf too many in the tree")
    .to_string();
    assert!(e.contains("no tensor \"2\""), "{e}");
    let e = load(&big, &(model.clone(),))
        .expect_err("extra")
        .to_string();
    assert!(e.contains("no leaf for"), "{e}");
    // Not a safetensors file, a truncated one, a missing one.
    let junk = tmp("junk.safetensors");
    std::fs::write(&junk, b"not a checkpoint").expect("writable");
    let e = load(&junk, &model).expect_err("junk").to_string();
    assert!(
        e.contains("not a safetensors file") && e.contains(here),
        "{e}"
    );
    let raw = std::fs::read(&path).expect("readable");
    std::fs::write(&junk, &raw[..raw.len() - 5]).expect("writable");
    assert!(load(&junk, &model).is_err(), "truncated");
    let e = load(tmp("absent.safetensors"), &model)
        .expect_err("absent")
        .to_string();
    assert!(e.contains("absent.safetensors"), "{e}");
    // A bool byte other than 0 or 1.
    let flags = (Tensor::from_vec(vec![true, false], [2]),);
    let fpath = tmp("flags.safetensors");
    save(&flags, &fpath).expect("saves");
    let mut raw = std::fs::read(&fpath).expect("readable");
    let last = raw.len() - 1;
    raw[last] = 7;
    std::fs::write(&fpath, &raw).expect("writable");
    let e = load(&fpath, &flags).expect_err("bad bool").to_string();
    assert!(e.contains("the byte 7"), "{e}");
    // A tracer cannot be saved.
    let e = jit(|x: Tensor| {
        let r = save(&x, tmp("tracer.safetensors"));
        assert!(r.is_err_and(|e| e.to_string().contains("tracer")));
        x
    })
    .call(Tensor::zeros([1]));
    assert!(e.is_ok());
}
