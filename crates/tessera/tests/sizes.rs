//! Hostile sizes through the user API: element counts that overflow, tensors over the size
//! limit, host allocations that cannot succeed and literals whose data does not match their
//! type are errors naming the op, the size and the caller's line; eagerly they are panics with
//! the same text, inside `jit` they are `Err`.

use tessera::ir::{Data, Literal, TensorType};
use tessera::{Backend, DType, Tensor, jit};

const BIG: usize = 1 << 32;

/// The panic message of `f`, which must panic.
fn panic_text(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let payload = std::panic::catch_unwind(f).expect_err("expected a panic");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn here(line: u32) -> String {
    format!("{}:{line}", file!())
}

#[test]
fn overflowing_shapes_are_rejected_by_the_constructors() {
    let line = line!() + 1;
    let msg = panic_text(|| drop(Tensor::zeros([BIG, BIG])));
    assert!(
        msg.contains("zeros") && msg.contains("overflow") && msg.contains(&here(line)),
        "{msg}"
    );
    let line = line!() + 1;
    let err = Tensor::try_zeros([BIG, BIG]).unwrap_err().to_string();
    assert!(
        err.contains("f32[4294967296,4294967296]") && err.contains(&here(line)),
        "{err}"
    );
    // `from_vec` used to accept [(1<<63)+1, 2] (whose element count wraps to 2).
    let line = line!() + 1;
    let err = Tensor::try_from_vec(vec![1.0f32, 2.0], [(1usize << 63) + 1, 2])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("from_vec") && err.contains(&here(line)),
        "{err}"
    );
    let msg = panic_text(|| drop(Tensor::from_vec(vec![1.0f32, 2.0], [(1usize << 63) + 1, 2])));
    assert!(
        msg.contains("from_vec") && msg.contains("overflow"),
        "{msg}"
    );
    let msg = panic_text(|| drop(Tensor::full_dtype([1usize << 62], 1.0, DType::F64)));
    assert!(msg.contains("full") && msg.contains("bytes"), "{msg}");
    // The good cases still work, zero-size ones too.
    assert_eq!(Tensor::zeros([2, 0, BIG]).numel(), 0);
    assert_eq!(
        Tensor::try_from_vec(Vec::<i32>::new(), [0, 7])
            .unwrap()
            .shape(),
        &[0, 7]
    );
    // Eager ops check their result's size too.
    let line = line!() + 1;
    let msg = panic_text(|| drop(Tensor::scalar(1.0f32).broadcast_to(&[BIG, BIG])));
    assert!(
        msg.contains("broadcast_in_dim") && msg.contains("overflow") && msg.contains(&here(line)),
        "{msg}"
    );
    let msg = panic_text(|| drop(Tensor::zeros([4]).reshape([BIG, BIG, usize::MAX])));
    assert!(msg.contains("reshape"), "{msg}");
}

#[test]
fn overflowing_shapes_in_jit_are_errors() {
    for backend in [Backend::Cranelift, Backend::Interpreter] {
        // Broadcast then reshape used to segfault, broadcast then sum ran for minutes.
        let line = line!() + 1;
        let f = jit(|x: Tensor| x.broadcast_to(&[BIG, BIG]).reshape([0])).backend(backend);
        let err = f.call(Tensor::scalar(1.0f32)).unwrap_err().to_string();
        assert!(
            err.contains("broadcast_in_dim")
                && err.contains("overflow")
                && err.contains(&here(line)),
            "{err}"
        );
        let f = jit(|x: Tensor| x.broadcast_to(&[BIG, BIG]).sum()).backend(backend);
        assert!(f.call(Tensor::scalar(1.0f32)).is_err());
        // A host constructor inside the traced function fails the trace the same way.
        let line = line!() + 1;
        let f = jit(|x: Tensor| &x + &Tensor::zeros([BIG, BIG])).backend(backend);
        let err = f.call(Tensor::scalar(1.0f32)).unwrap_err().to_string();
        assert!(err.contains("zeros") && err.contains(&here(line)), "{err}");
        let f = jit(|x: Tensor| x.pad(&Tensor::scalar(0.0f32), &[0], &[0], &[usize::MAX]))
            .backend(backend);
        let err = f.call(Tensor::zeros([3])).unwrap_err().to_string();
        assert!(err.contains("pad") && err.contains("overflows"), "{err}");
    }
}

#[test]
fn from_literal_checks_the_data_against_the_type() {
    // A declared f32[1000000] holding one value used to segfault under jit.
    let short = Literal {
        ty: TensorType::new(DType::F32, vec![1_000_000]),
        data: Data::F32(vec![1.0]),
    };
    let line = line!() + 1;
    let err = Tensor::try_from_literal(short.clone())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("from_literal")
            && err.contains("holds 1 elements")
            && err.contains(&here(line)),
        "{err}"
    );
    let msg = panic_text(|| drop(Tensor::from_literal(short)));
    assert!(msg.contains("from_literal"), "{msg}");
    // f64[4] over f32 data used to read past the buffer.
    let wrong_dtype = Literal {
        ty: TensorType::new(DType::F64, vec![4]),
        data: Data::F32(vec![1.0; 4]),
    };
    let err = Tensor::try_from_literal(wrong_dtype)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds f32 data"), "{err}");
    // Inside jit a bad literal fails the trace.
    let f = jit(|x: Tensor| {
        &x + &Tensor::from_literal(Literal {
            ty: TensorType::new(DType::F32, vec![3]),
            data: Data::F32(vec![1.0]),
        })
    });
    assert!(
        f.call(Tensor::zeros([3]))
            .unwrap_err()
            .to_string()
            .contains("from_literal")
    );
    let ok = Literal::new([2], Data::F64(vec![1.0, 2.0])).unwrap();
    assert_eq!(Tensor::from_literal(ok).to_vec::<f64>(), vec![1.0, 2.0]);
}

#[test]
fn a_host_tensor_too_large_to_allocate_is_an_error_naming_its_size() {
    // 2^50 bytes: within the size limit but over the 47-bit address space, so the allocator
    // refuses it whatever the overcommit policy.
    let line = line!() + 1;
    let err = Tensor::try_zeros([1 << 24, 1 << 24])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("zeros")
            && err.contains("cannot allocate 1125899906842624 bytes")
            && err.contains(&here(line)),
        "{err}"
    );
    let msg = panic_text(|| drop(Tensor::ones([1 << 24, 1 << 24])));
    assert!(
        msg.contains("ones") && msg.contains("cannot allocate"),
        "{msg}"
    );
    // The case: 40 GB of f32. Under Linux's default heuristic overcommit (mode 0) or
    // strict accounting (2) a request above RAM plus swap is refused at once; with mode 1
    // ("always overcommit") the kernel grants it and filling it would summon the OOM killer,
    // so the case is only run where the kernel can refuse.
    let policy = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    let ram = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> u64 {
        ram.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX / 2048)
    };
    let total = kib("MemTotal:") + kib("SwapTotal:");
    if policy.trim() != "1" && total * 1024 < 40_000_000_000 {
        let err = Tensor::try_zeros([100_000, 100_000])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot allocate 40000000000 bytes"), "{err}");
    } else {
        eprintln!("skipping the 40 GB case: overcommit policy {policy:?}, {total} KiB");
    }
}
