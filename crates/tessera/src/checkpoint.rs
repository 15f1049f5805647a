//! Checkpoints: any tree of tensors saved and loaded in the safetensors format (the one
//! candle, burn and Hugging Face use), through the `safetensors` crate.
//!
//! Each leaf is stored under its path in the tree (`w1`, `layers.0.b`; a bare tensor is
//! `arg`), little-endian, with its dtype and shape. A placed array is gathered on save. `load`
//! reads the file against a tree of the same structure (`like`): every name must be there with
//! the leaf's dtype and shape, and no other tensor may be, or the error names the leaf, what it
//! expected and what the file holds; each loaded leaf is placed as `like`'s is
//! (`load_placed` gives the shardings instead). The file is read whole into memory.
//!
//! Check a file from Python: `python3 -c "from safetensors.numpy import load_file;
//! print({k: (v.dtype, v.shape) for k, v in load_file('params.safetensors').items()})"`.

use std::collections::HashMap;
use std::panic::Location;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tessera_ir::{DType, Data, Literal, TensorType, bf16, f16};

use crate::error::{Error, Result, loc_text};
use crate::sharding::{NamedSharding, Shardings, device_put};
use crate::tensor::Tensor;
use crate::tree::{self, Tree};

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// The little-endian bytes of a tensor's elements.
fn le_bytes(data: &Data) -> Vec<u8> {
    fn each<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    match data {
        Data::F32(v) => each(v, f32::to_le_bytes),
        Data::F64(v) => each(v, f64::to_le_bytes),
        Data::I32(v) => each(v, i32::to_le_bytes),
        Data::U32(v) => each(v, u32::to_le_bytes),
        Data::I64(v) => each(v, i64::to_le_bytes),
        Data::F16(v) => each(v, |x: f16| x.to_bits().to_le_bytes()),
        Data::BF16(v) => each(v, |x: bf16| x.to_bits().to_le_bytes()),
        Data::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    }
}

/// A tensor's elements from little-endian bytes (their count checked by the caller); a bool
/// byte other than 0 or 1 is an error.
fn from_le_bytes(dtype: DType, b: &[u8]) -> std::result::Result<Data, String> {
    fn each<T, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N")))
            .collect()
    }
    Ok(match dtype {
        DType::F32 => Data::F32(each(b, f32::from_le_bytes)),
        DType::F64 => Data::F64(each(b, f64::from_le_bytes)),
        DType::I32 => Data::I32(each(b, i32::from_le_bytes)),
        DType::U32 => Data::U32(each(b, u32::from_le_bytes)),
        DType::I64 => Data::I64(each(b, i64::from_le_bytes)),
        DType::F16 => Data::F16(each(b, |c| f16::from_bits(u16::from_le_bytes(c)))),
        DType::BF16 => Data::BF16(each(b, |c| bf16::from_bits(u16::from_le_bytes(c)))),
        DType::Bool => Data::Bool(
            b.iter()
                .map(|&x| match x {
                    0 => Ok(false),
                    1 => Ok(true),
                    other => Err(format!("a bool element is the byte {other}, not 0 or 1")),
                })
                .collect::<std::result::Result<_, _>>()?,
        ),
    })
}

/// Saves every leaf of `tree` to `path` (see the module doc). A tracer cannot be saved; an
/// unwritable path is [`Error::Io`].
///
/// ```
/// use tessera::prelude::*;
///
/// let path = std::env::temp_dir().join("tessera_doc_save.safetensors");
/// let params = (Tensor::ones([2, 3]), vec![Tensor::arange(4)]);
/// tessera::checkpoint::save(&params, &path).unwrap();
/// let back = tessera::checkpoint::load(&path, &params).unwrap();
/// assert_eq!(back.1[0].to_vec::<i32>(), vec![0, 1, 2, 3]);
/// # std::fs::remove_file(&path).ok();
/// ```
#[track_caller]
pub fn save<T: Tree>(tree: &T, path: impl AsRef<Path>) -> Result<()> {
    let location = loc_text(Location::caller());
    let fail = |message: String| Error::Op {
        op: "checkpoint::save".into(),
        message,
        location: location.clone(),
    };
    let (leaves, def) = tree::flatten(tree);
    let names = def.leaf_paths();
    let mut buffers = Vec::with_capacity(leaves.len());
    for (t, name) in leaves.iter().zip(&names) {
        let a = t
            .try_array()
            .map_err(|_| fail(format!("{name} is a tracer: save concrete values")))?;
        let lit = a.try_literal().map_err(|m| fail(format!("{name}: {m}")))?;
        buffers.push((name.clone(), lit.ty.clone(), le_bytes(&lit.data)));
    }
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(name, ty, bytes)| {
            TensorView::new(st_dtype(ty.dtype), ty.dims().to_vec(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| fail(format!("{name} ({ty}): {e}")))
        })
        .collect::<Result<_>>()?;
    let path = path.as_ref();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| Error::Io(format!("checkpoint::save {}: {e}", path.display())))
}

/// Loads a tree shaped like `like` from `path`, each leaf placed as `like`'s leaf is (a host
/// value where it is one). See the module doc for what is checked.
///
/// ```
/// use tessera::prelude::*;
///
/// let path = std::env::temp_dir().join("tessera_doc_load.safetensors");
/// tessera::checkpoint::save(&Tensor::from_vec(vec![1.0f32, 2.0], [2]), &path).unwrap();
/// let w = tessera::checkpoint::load(&path, &Tensor::zeros([2])).unwrap();
/// assert_eq!(w.to_vec::<f32>(), vec![1.0, 2.0]);
/// // `like` of another shape: an error naming the leaf, what it expected and what the file holds.
/// let err = tessera::checkpoint::load(&path, &Tensor::zeros([3])).unwrap_err();
/// assert!(err.to_string().contains("arg"), "{err}");
/// # std::fs::remove_file(&path).ok();
/// ```
#[track_caller]
pub fn load<T: Tree>(path: impl AsRef<Path>, like: &T) -> Result<T> {
    let location = loc_text(Location::caller());
    let (leaves, _) = tree::flatten(like);
    let placements: Vec<Option<NamedSharding>> = leaves.iter().map(Tensor::sharding).collect();
    load_with(path.as_ref(), like, &placements, location)
}

/// `load`, each leaf placed as `sharding` says (one for all, or `(&mesh, specs)`).
#[track_caller]
pub fn load_placed<T: Tree>(
    path: impl AsRef<Path>,
    like: &T,
    sharding: impl Into<Shardings>,
) -> Result<T> {
    let location = loc_text(Location::caller());
    let (_, def) = tree::flatten(like);
    let placements = sharding
        .into()
        .resolve(&def)
        .map_err(|message| Error::Op {
            op: "checkpoint::load".into(),
            message,
            location: location.clone(),
        })?
        .into_iter()
        .map(Some)
        .collect::<Vec<_>>();
    load_with(path.as_ref(), like, &placements, location)
}

fn load_with<T: Tree>(
    path: &Path,
    like: &T,
    placements: &[Option<NamedSharding>],
    location: String,
) -> Result<T> {
    let fail = |message: String| Error::Op {
        op: "checkpoint::load".into(),
        message: format!("{}: {message}", path.display()),
        location: location.clone(),
    };
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Io(format!("checkpoint::load {}: {e}", path.display())))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| fail(format!("not a safetensors file: {e}")))?;
    let (leaves, def) = tree::flatten(like);
    let names = def.leaf_paths();
    let mut stored: HashMap<String, TensorView<'_>> = file.tensors().into_iter().collect();
    let mut out = Vec::with_capacity(leaves.len());
    for ((t, name), placement) in leaves.iter().zip(&names).zip(placements) {
        let view = stored
            .remove(name)
            .ok_or_else(|| fail(format!("no tensor \"{name}\" (the tree wants {})", t.ty())))?;
        let want = st_dtype(t.dtype());
        if view.dtype() != want || view.shape() != t.shape() {
            return Err(fail(format!(
                "\"{name}\" is {:?}{:?} in the file, the tree wants {}",
                view.dtype(),
                view.shape(),
                t.ty()
            )));
        }
        let data =
            from_le_bytes(t.dtype(), view.data()).map_err(|m| fail(format!("\"{name}\": {m}")))?;
        let lit = Literal {
            ty: TensorType::new(t.dtype(), t.shape().to_vec()),
            data,
        };
        lit.check().map_err(|m| fail(format!("\"{name}\": {m}")))?;
        let host = Tensor::from_literal(lit);
        out.push(match placement {
            Some(s) => crate::error::catch_eager(|| device_put(host.clone(), s))?,
            None => host,
        });
    }
    if !stored.is_empty() {
        let mut extra: Vec<&String> = stored.keys().collect();
        extra.sort();
        return Err(fail(format!(
            "tensors the tree has no leaf for: {extra:?} (the tree's leaves: {names:?})"
        )));
    }
    tree::unflatten(&def, out)
}
