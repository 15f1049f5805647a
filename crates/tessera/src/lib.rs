//! Tessera: a tracing JIT compiler for tensor programs written as plain Rust closures, in the
//! spirit of JAX.
//!
//! ```
//! use tessera::prelude::*;
//!
//! let f = jit(|(x, w): (Tensor, Tensor)| x.matmul(&w).tanh().sum());
//! let x = Tensor::ones([2, 3]);
//! let w = Tensor::full([3, 4], 0.1);
//! let y = f.call((x.clone(), w.clone())).unwrap();
//! assert!((y.item::<f32>() - 8.0 * 0.3f32.tanh()).abs() < 1e-6);
//! println!("{}", f.lower(&(x, w)).unwrap().ir());
//! ```
#![deny(missing_docs)]

// Lets `#[derive(Tree)]`'s `::tessera::...` paths resolve inside this crate's own tests.
extern crate self as tessera;

pub mod axis;
mod cache;
pub mod check;
pub mod checkpoint;
pub mod control;
pub mod conv;
pub mod distributed;
pub mod einsum;
pub mod error;
pub mod fwd;
pub mod grad;
pub mod indexing;
#[cfg(feature = "ndarray")]
mod interop;
pub mod jit;
pub mod manip;
pub mod math;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod pipeline;
pub mod pmap;
pub mod promote;
pub mod random;
pub mod shard_map;
pub mod sharding;
pub mod slicing;
pub mod sorting;
mod spmd;
pub mod tensor;
pub mod testing;
mod trace;
pub mod tree;
pub mod vmap;

pub use axis::{Axis, AxisList, keepdims};
pub use cache::DEFAULT_CAPACITY as DEFAULT_CACHE_CAPACITY;
pub use control::{
    checkpoint, cond, custom_vjp, fori_loop, scan, stop_gradient, switch, while_loop,
};
pub use distributed::{device_count, local_device_count};
pub use einsum::einsum;
pub use error::{Error, Result};
pub use fwd::{Linearized, hessian, jacfwd, jacrev, jvp, linearize};
pub use grad::{Vjp, grad, value_and_grad, value_and_grad_argnums, value_and_grad_with_aux, vjp};
pub use jit::{Jitted, Lowered, eval_graph, jit, make_ir};
pub use pipeline::Backend;
pub use pmap::{
    Pmapped, all_gather, all_to_all, axis_index, pmap, pmax, pmean, pmin, ppermute, psum,
    psum_scatter,
};
pub use promote::{Number, Scalar, result_type};
pub use shard_map::{ShardMapped, Specs, shard_map};
pub use sharding::{
    AxisType, Mesh, NamedSharding, PartitionSpec, Shardings, device_get, device_put, einsum_out,
    reshard, visualize_array_sharding,
};
pub use slicing::{Index, stride};
pub use tensor::{Element, Tensor};
pub use tessera_derive::Tree;
pub use tessera_ir as ir;
pub use tessera_ir::{DType, DotDims};
pub use vmap::{Axes, Vmapped, vmap};

/// How many matrix products were done once for a group of devices (a replicated weight's
/// product stacked by rows, or a weight gradient with its all-reduce stacked along the
/// contraction) since the process started, whether the devices ran on threads of their own
/// (`tessera_runtime::shared_gemm_count`) or in turn on one thread
/// (`tessera_codegen::together::products_together`): for tests and benchmarks.
pub fn shared_gemm_count() -> usize {
    tessera_runtime::shared_gemm_count() + tessera_codegen::together::products_together()
}

/// Keeps every compiled kernel's machine code in `dir` and reuses it in later processes, as
/// JAX's `jax_compilation_cache_dir` does (`None` turns the cache off). Without a call, the
/// directory is `TESSERA_CACHE_DIR` if that is set and not empty, else there is no cache.
/// An entry is keyed by the kernel's Cranelift IR and the CPU's features, under a
/// subdirectory of the compiler's exact dependency versions, so it is found only where the
/// same code would be compiled; a damaged entry is a miss. `TESSERA_CACHE_VERIFY=1` compiles
/// every hit again and compares. The directory must be as trusted as the program's binary:
/// its entries are code this process runs. See `tessera_codegen::cache`.
///
/// ```standalone_crate
/// // (A process of its own: the directory is the process's, not the other examples'.)
/// // A directory this process creates (`create_dir` fails on one already there).
/// let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
/// let name = format!("tessera-doc-cache-{}-{}", std::process::id(), nanos.as_nanos());
/// let dir = std::env::temp_dir().join(name);
/// std::fs::create_dir(&dir).unwrap();
/// tessera::set_compilation_cache_dir(Some(dir.clone()));
/// let f = tessera::jit(|x: tessera::Tensor| (x * 2.0).tanh());
/// let y = f.call(tessera::Tensor::ones([8])).unwrap();
/// let s = tessera::compilation_cache_stats();
/// assert!(s.hits + s.misses > 0);
/// tessera::set_compilation_cache_dir(None);
/// std::fs::remove_dir_all(&dir).unwrap();
/// # let _ = y;
/// ```
pub fn set_compilation_cache_dir(dir: Option<std::path::PathBuf>) {
    tessera_codegen::cache::set_dir(dir);
}

/// Gives back to the allocator the buffers that ended launches of devices on threads of
/// their own keep for the next launch (the shared products' operands and results, up to
/// 256 MB for the process); returns their bytes. The next such launch allocates them again.
/// For a program that is done with its multi-device work and wants the memory back.
///
/// ```standalone_crate
/// // (A process of its own: no other example's launch ends in between.)
/// tessera::release_launch_buffers();
/// // Nothing is left to release until another launch ends.
/// assert_eq!(tessera::release_launch_buffers(), 0);
/// ```
pub fn release_launch_buffers() -> usize {
    tessera_runtime::release_spare_launch_buffers()
}

/// What the persistent compilation cache did in this process: kernels whose code it held,
/// kernels compiled, entries rejected (damaged, another compiler's), hits that failed
/// verification, stores that failed.
pub fn compilation_cache_stats() -> tessera_codegen::cache::Stats {
    tessera_codegen::cache::stats()
}

/// What a user program imports: `use tessera::prelude::*;`.
pub mod prelude {
    pub use crate::axis::{Axis, AxisList, keepdims};
    pub use crate::conv::{ConvOptions, Padding};
    pub use crate::einsum::einsum;
    pub use crate::fwd::{Linearized, hessian, jacfwd, jacrev, jvp, linearize};
    pub use crate::pmap::{
        Pmapped, all_gather, all_to_all, axis_index, pmap, pmax, pmean, pmin, ppermute, psum,
        psum_scatter,
    };
    pub use crate::random::{self, Key};
    pub use crate::s;
    pub use crate::shard_map::{ShardMapped, Specs, shard_map};
    pub use crate::sharding::{
        AxisType, Mesh, NamedSharding, PartitionSpec, Shardings, device_get, device_put,
        einsum_out, reshard, sharding_table, visualize_array_sharding, with_sharding_constraint,
    };
    pub use crate::slicing::{Index, stride};
    pub use crate::tree::{self, Tree};
    pub use crate::{
        Backend, DType, DotDims, Error, Jitted, Lowered, Result, Tensor, checkpoint, cond,
        custom_vjp, eval_graph, fori_loop, grad, jit, make_ir, scan, stop_gradient, switch,
        value_and_grad, value_and_grad_argnums, value_and_grad_with_aux, vjp, while_loop,
    };
    pub use crate::{P, device_count, specs};
    pub use crate::{
        axes,
        vmap::{Axes, Vmapped, vmap},
    };
    pub use tessera_derive::Tree;
}

/// The README's example, compiled and run as a doctest so it cannot drift from the API.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
