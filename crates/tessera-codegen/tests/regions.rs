//! Region ops compiled against interpreted: every region op (scan forward and reverse, while,
//! case, checkpoint, custom_vjp, and get_result), written as IR text, run by
//! `tessera_interp::run` and by `tessera_codegen::compile(..).run(..)` (and at the quick tier,
//! `compile_quick`, bit for bit against the optimized code). Bodies of exact ops
//! agree bit for bit (any NaN equals any NaN); bodies with f32 transcendental functions within
//! the sum of the two backends' ulp bounds (f64 functions are Rust's libm on both, so exact).
//!
//! Both backends share the control flow (`tessera_interp::run_region_with`), so each loop and
//! branch is also checked against values computed here by hand: a bug there would be the
//! same on both sides.

use tessera_interp::{SingleDevice, run};
use tessera_ir::corpus::Lcg;
use tessera_ir::{DType, Data, Graph, Literal, TensorType, parse, print, verify};

/// Deterministic inputs for `g`'s parameters: floats in [-2, 2], integers in [-10, 10].
fn inputs_for(g: &Graph, seed: u64) -> Vec<Literal> {
    let mut rng = Lcg(seed);
    g.params()
        .iter()
        .map(|&p| {
            let ty = g.ty(p);
            let n = ty.numel();
            let data = match ty.dtype {
                DType::F32 => Data::F32((0..n).map(|_| rng.range(-2.0, 2.0) as f32).collect()),
                DType::F64 => Data::F64((0..n).map(|_| rng.range(-2.0, 2.0)).collect()),
                DType::I32 => Data::I32((0..n).map(|_| rng.range(-10.0, 10.0) as i32).collect()),
                DType::U32 => Data::U32((0..n).map(|_| rng.range(0.0, 20.0) as u32).collect()),
                DType::Bool => Data::Bool((0..n).map(|_| rng.next_f64() < 0.5).collect()),
                DType::I64 => Data::I64((0..n).map(|_| rng.range(-10.0, 10.0) as i64).collect()),
                DType::F16 => Data::F16(
                    (0..n)
                        .map(|_| tessera_ir::f16::from_f64(rng.range(-2.0, 2.0)))
                        .collect(),
                ),
                DType::BF16 => Data::BF16(
                    (0..n)
                        .map(|_| tessera_ir::bf16::from_f64(rng.range(-2.0, 2.0)))
                        .collect(),
                ),
            };
            Literal::new(ty.shape.clone(), data).expect("sized")
        })
        .collect()
}

fn lit<T: tessera_ir::DataElement>(dims: &[usize], v: Vec<T>) -> Literal {
    Literal::new(dims.to_vec(), Data::from_vec(v)).expect("sized")
}

/// Runs `text` on both backends (the compiled program twice, so a second run over the same
/// arena is checked too); returns (compiled, interpreted).
fn both(text: &str, inputs: &[Literal]) -> (Vec<Literal>, Vec<Literal>) {
    let g = parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let want = run(&g, inputs).unwrap_or_else(|e| panic!("interpreter: {e}\n{text}"));
    let exe = tessera_codegen::compile(&g).unwrap_or_else(|e| panic!("compile: {e}\n{text}"));
    let refs: Vec<&Literal> = inputs.iter().collect();
    let got = exe
        .run(&refs, &SingleDevice)
        .unwrap_or_else(|e| panic!("compiled: {e}\n{text}\n{}", exe.describe()));
    let again = exe
        .run(&refs, &SingleDevice)
        .unwrap_or_else(|e| panic!("compiled, second run: {e}\n{text}"));
    assert_eq!(got.len(), g.outputs().len(), "{text}");
    assert_eq!(want.len(), g.outputs().len(), "{text}");
    for (a, b) in got.iter().zip(&again) {
        assert!(
            a.ty == b.ty && a.data.bits_eq(&b.data),
            "a second run differs\n{text}"
        );
    }
    // The bodies' kernels at the quick tier (`tier.rs`) compute the same bits.
    let quick = tessera_codegen::compile_quick(&g).unwrap_or_else(|e| panic!("quick: {e}"));
    let fast = quick
        .run(&refs, &SingleDevice)
        .unwrap_or_else(|e| panic!("quick tier: {e}\n{text}"));
    for (a, b) in fast.iter().zip(&got) {
        assert!(
            a.ty == b.ty && a.data.bits_eq(&b.data),
            "the quick tier differs\n{text}"
        );
    }
    (got, want)
}

/// Bitwise equality, any NaN equal to any NaN.
fn same_bits(a: &Literal, b: &Literal) -> bool {
    a.ty == b.ty && a.data.bits_eq_any_nan(&b.data)
}

/// Compiled equals interpreted bit for bit; returns the values.
fn exact(text: &str, inputs: &[Literal]) -> Vec<Literal> {
    let (got, want) = both(text, inputs);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            same_bits(a, b),
            "output {i}: compiled {} {:?}, interpreted {} {:?}\n{text}",
            a.ty,
            a.data,
            b.ty,
            b.data
        );
    }
    want
}

/// The distance in f32 ulps (on the ordered integer line of f32 bits).
fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i64::from(i32::MIN) - i64::from(i)
        } else {
            i64::from(i)
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// Compiled within `bound` f32 ulps of interpreted (other dtypes exact).
fn within_ulps(text: &str, inputs: &[Literal], bound: u64) -> Vec<Literal> {
    let (got, want) = both(text, inputs);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.ty, b.ty, "output {i}\n{text}");
        if let (Some(x), Some(y)) = (a.data.as_f32(), b.data.as_f32()) {
            for (k, (p, q)) in x.iter().zip(y).enumerate() {
                assert!(
                    (p.is_nan() && q.is_nan()) || ulps(*p, *q) <= bound,
                    "output {i}[{k}]: compiled {p}, interpreted {q} ({} ulps > {bound})\n{text}",
                    ulps(*p, *q)
                );
            }
        } else {
            assert!(same_bits(a, b), "output {i}\n{text}");
        }
    }
    want
}

fn f32s(l: &Literal) -> Vec<f32> {
    l.data.as_f32().expect("f32").to_vec()
}

fn i32s(l: &Literal) -> Vec<i32> {
    l.data.as_i32().expect("i32").to_vec()
}

/// consts=1, carries=2 (f32 and i32), xs=2, ys=2: `h = h * w + x`, `n = n + k`; ys are `h * w`
/// and the running `n`.
const SCAN: &str = r#"func @scan(%0: f32[3], %1: f32[3], %2: i32[], %3: f32[5,3], %4: i32[5]) {
  %5 = scan %0, %1, %2, %3, %4 DIRlength=5 consts=1 carries=2 : (f32[3], i32[], f32[5,3], i32[5])
    body(%0: f32[3], %1: f32[3], %2: i32[], %3: f32[3], %4: i32[]) {
      %5 = mul %1, %0 : f32[3]
      %6 = add %5, %3 : f32[3]
      %7 = add %2, %4 : i32[]
      return %6, %7, %5, %7
    }
  %6 = get_result %5 index=0 : f32[3]
  %7 = get_result %5 index=1 : i32[]
  %8 = get_result %5 index=2 : f32[5,3]
  %9 = get_result %5 index=3 : i32[5]
  return %6, %7, %8, %9
}
"#;

/// The scan above by hand, in the order `order` visits the steps.
fn scan_by_hand(inputs: &[Literal], order: &[usize]) -> (Vec<f32>, i32, Vec<f32>, Vec<i32>) {
    let w = f32s(&inputs[0]);
    let mut h = f32s(&inputs[1]);
    let mut n = i32s(&inputs[2])[0];
    let (xs, ks) = (f32s(&inputs[3]), i32s(&inputs[4]));
    let (mut ys, mut ns) = (vec![0.0f32; 15], vec![0i32; 5]);
    for &t in order {
        for j in 0..3 {
            let y = h[j] * w[j];
            ys[t * 3 + j] = y;
            h[j] = y + xs[t * 3 + j];
        }
        n = n.wrapping_add(ks[t]);
        ns[t] = n;
    }
    (h, n, ys, ns)
}

#[test]
fn scan_forward_with_consts_several_carries_xs_and_ys() {
    let text = SCAN.replace("DIR", "");
    let g = parse(&text).unwrap();
    let inputs = inputs_for(&g, 1);
    let out = exact(&text, &inputs);
    let (h, n, ys, ns) = scan_by_hand(&inputs, &[0, 1, 2, 3, 4]);
    assert_eq!(f32s(&out[0]), h);
    assert_eq!(i32s(&out[1]), vec![n]);
    assert_eq!(f32s(&out[2]), ys);
    assert_eq!(i32s(&out[3]), ns);
}

#[test]
fn scan_reverse_reads_and_writes_the_slices_from_the_end() {
    let text = SCAN.replace("DIR", "reverse ");
    let g = parse(&text).unwrap();
    assert_eq!(print(&g), text, "the reverse scan prints as written");
    let inputs = inputs_for(&g, 2);
    let out = exact(&text, &inputs);
    let (h, n, ys, ns) = scan_by_hand(&inputs, &[4, 3, 2, 1, 0]);
    assert_eq!(f32s(&out[0]), h);
    assert_eq!(i32s(&out[1]), vec![n]);
    assert_eq!(f32s(&out[2]), ys);
    assert_eq!(i32s(&out[3]), ns);
    // The running count is a suffix sum in reverse.
    let ks = i32s(&inputs[4]);
    let n0 = i32s(&inputs[2])[0];
    for (t, &v) in ns.iter().enumerate() {
        assert_eq!(v, n0 + ks[t..].iter().sum::<i32>());
    }
}

/// A scan of length 0 returns its carries unchanged and empty ys; of length 1, one step.
#[test]
fn scan_of_length_zero_and_one() {
    let base = r#"func @scan(%0: f32[2], %1: f32[L,2]) {
  %2 = scan %0, %1 length=L consts=0 carries=1 : (f32[2], f32[L,2])
    body(%0: f32[2], %1: f32[2]) {
      %2 = add %0, %1 : f32[2]
      %3 = neg %2 : f32[2]
      return %2, %3
    }
  %3 = get_result %2 index=0 : f32[2]
  %4 = get_result %2 index=1 : f32[L,2]
  return %3, %4
}
"#;
    let zero = base.replace('L', "0");
    let out = exact(
        &zero,
        &[
            lit(&[2], vec![1.5f32, -0.0]),
            lit(&[0, 2], Vec::<f32>::new()),
        ],
    );
    assert_eq!(
        out[0]
            .data
            .as_f32()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        vec![1.5f32.to_bits(), (-0.0f32).to_bits()],
        "the carry passes through a scan of length 0 untouched (even -0)"
    );
    assert_eq!(out[1].ty, TensorType::new(DType::F32, vec![0, 2]));
    let one = base.replace('L', "1");
    let out = exact(
        &one,
        &[
            lit(&[2], vec![1.5f32, 2.0]),
            lit(&[1, 2], vec![0.25f32, -4.0]),
        ],
    );
    assert_eq!(f32s(&out[0]), vec![1.75, -2.0]);
    assert_eq!(f32s(&out[1]), vec![-1.75, 2.0]);
}

/// Zero-size carries, xs and ys beside non-empty ones.
#[test]
fn scan_with_zero_size_carries_xs_and_ys() {
    let text = r#"func @scan(%0: f32[0], %1: f32[2], %2: f32[4,2,0], %3: f32[4,2]) {
  %4 = scan %0, %1, %2, %3 length=4 consts=0 carries=2 : (f32[0], f32[2], f32[4,0], f32[4,2,0], f32[4,2])
    body(%0: f32[0], %1: f32[2], %2: f32[2,0], %3: f32[2]) {
      %4 = exp %0 : f32[0]
      %5 = add %1, %3 : f32[2]
      %6 = reduce_sum %2 axes=[1] : f32[2]
      %7 = add %5, %6 : f32[2]
      return %4, %7, %4, %2, %7
    }
  %5 = get_result %4 index=0 : f32[0]
  %6 = get_result %4 index=1 : f32[2]
  %7 = get_result %4 index=2 : f32[4,0]
  %8 = get_result %4 index=3 : f32[4,2,0]
  %9 = get_result %4 index=4 : f32[4,2]
  return %5, %6, %7, %8, %9
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 3);
    let out = exact(text, &inputs);
    let (c, xs) = (f32s(&inputs[1]), f32s(&inputs[3]));
    let mut h = c.clone();
    for t in 0..4 {
        for j in 0..2 {
            h[j] += xs[t * 2 + j];
        }
    }
    assert_eq!(f32s(&out[1]), h);
    assert_eq!(out[3].ty, TensorType::new(DType::F32, vec![4, 2, 0]));
}

/// `while n < limit: (n, x) = (n + 1, x * 0.5 + c)`: with limit <= n it runs 0 times (the
/// carries come back as they went in), with a large limit many times.
const WHILE: &str = r#"func @while(%0: i32[], %1: f32[3], %2: i32[], %3: f32[3]) {
  %4 = while %0, %1, %2, %3 consts=2 : (i32[], f32[3])
    cond(%0: i32[], %1: f32[3], %2: i32[], %3: f32[3]) {
      %4 = lt %2, %0 : bool[]
      return %4
    }
    body(%0: i32[], %1: f32[3], %2: i32[], %3: f32[3]) {
      %4 = constant 1 : i32[]
      %5 = add %2, %4 : i32[]
      %6 = constant 0.5 : f32[]
      %7 = broadcast_in_dim %6 dims=[] : f32[3]
      %8 = mul %3, %7 : f32[3]
      %9 = add %8, %1 : f32[3]
      return %5, %9
    }
  %5 = get_result %4 index=0 : i32[]
  %6 = get_result %4 index=1 : f32[3]
  return %5, %6
}
"#;

fn while_by_hand(limit: i32, c: &[f32], n: i32, x: &[f32]) -> (i32, Vec<f32>) {
    let (mut n, mut x) = (n, x.to_vec());
    while n < limit {
        n += 1;
        for (v, c) in x.iter_mut().zip(c) {
            *v = *v * 0.5 + c;
        }
    }
    (n, x)
}

#[test]
fn while_that_runs_zero_times() {
    let c = vec![1.0f32, -2.0, 0.5];
    let x = vec![3.0f32, -0.0, 7.25];
    for (limit, n) in [(0, 0), (-5, 3), (i32::MIN, i32::MAX)] {
        let inputs = [
            lit(&[], vec![limit]),
            lit(&[3], c.clone()),
            lit(&[], vec![n]),
            lit(&[3], x.clone()),
        ];
        let out = exact(WHILE, &inputs);
        assert_eq!(i32s(&out[0]), vec![n]);
        assert!(
            out[1].data.bits_eq(&inputs[3].data),
            "x comes back untouched"
        );
    }
}

#[test]
fn while_that_runs_many_times() {
    let c = vec![1.0f32, -2.0, 0.5];
    let x = vec![3.0f32, -0.0, 7.25];
    for (limit, n) in [(1, 0), (2, 0), (1000, 0), (5000, -17)] {
        let inputs = [
            lit(&[], vec![limit]),
            lit(&[3], c.clone()),
            lit(&[], vec![n]),
            lit(&[3], x.clone()),
        ];
        let out = exact(WHILE, &inputs);
        let (hn, hx) = while_by_hand(limit, &c, n, &x);
        assert_eq!(i32s(&out[0]), vec![hn]);
        assert_eq!(f32s(&out[1]), hx);
    }
}

/// Three branches of different ops; the index selects one, clamped to `0..3` both ways.
const CASE: &str = r#"func @case(%0: i32[], %1: f32[4], %2: f32[4]) {
  %3 = case %0, %1, %2 : (f32[4], f32[4])
    branch(%0: f32[4], %1: f32[4]) {
      %2 = add %0, %1 : f32[4]
      return %2, %0
    }
    branch(%0: f32[4], %1: f32[4]) {
      %2 = mul %0, %1 : f32[4]
      %3 = neg %1 : f32[4]
      return %2, %3
    }
    branch(%0: f32[4], %1: f32[4]) {
      %2 = max %0, %1 : f32[4]
      %3 = sub %0, %1 : f32[4]
      return %3, %2
    }
  %4 = get_result %3 index=0 : f32[4]
  %5 = get_result %3 index=1 : f32[4]
  return %4, %5
}
"#;

#[test]
fn case_takes_each_branch_and_clamps_the_index_both_ways() {
    let a = vec![1.0f32, -2.0, 3.5, -0.0];
    let b = vec![0.5f32, 4.0, -1.0, 0.0];
    let branch = |k: usize| -> (Vec<f32>, Vec<f32>) {
        let zip = |f: fn(f32, f32) -> f32| a.iter().zip(&b).map(|(x, y)| f(*x, *y)).collect();
        match k {
            0 => (zip(|x, y| x + y), a.clone()),
            1 => (zip(|x, y| x * y), b.iter().map(|y| -y).collect()),
            _ => (zip(|x, y| x - y), zip(|x, y| x.max(y))),
        }
    };
    for (index, taken) in [
        (0, 0),
        (1, 1),
        (2, 2),
        (-1, 0),
        (i32::MIN, 0),
        (3, 2),
        (i32::MAX, 2),
    ] {
        let inputs = [
            lit(&[], vec![index]),
            lit(&[4], a.clone()),
            lit(&[4], b.clone()),
        ];
        let out = exact(CASE, &inputs);
        let (r0, r1) = branch(taken);
        assert_eq!(f32s(&out[0]), r0, "index {index}");
        assert_eq!(f32s(&out[1]), r1, "index {index}");
    }
}

/// A checkpoint of exact ops is bit for bit; of f64 libm functions too; of f32 transcendental
/// functions within their bounds (tanh: 1.5 ulps compiled + 2.05 interpreted).
#[test]
fn checkpoint_computes_its_body() {
    let text = r#"func @ckpt(%0: f64[5], %1: f32[2,3]) {
  %2 = checkpoint %0, %1 : (f64[5], f32[2,3], f32[3])
    body(%0: f64[5], %1: f32[2,3]) {
      %2 = exp %0 : f64[5]
      %3 = sin %2 : f64[5]
      %4 = mul %1, %1 : f32[2,3]
      %5 = reduce_max %1 axes=[0] : f32[3]
      return %3, %4, %5
    }
  %3 = get_result %2 index=0 : f64[5]
  %4 = get_result %2 index=1 : f32[2,3]
  %5 = get_result %2 index=2 : f32[3]
  return %3, %4, %5
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 4);
    let out = exact(text, &inputs);
    let x = inputs[0].data.as_f64().unwrap();
    let want: Vec<f64> = x.iter().map(|v| v.exp().sin()).collect();
    assert_eq!(out[0].data.as_f64().unwrap(), &want[..]);
    let tanh = r#"func @ckpt(%0: f32[64]) {
  %1 = checkpoint %0 : (f32[64])
    body(%0: f32[64]) {
      %1 = tanh %0 : f32[64]
      return %1
    }
  %2 = get_result %1 index=0 : f32[64]
  return %2
}
"#;
    let g = parse(tanh).unwrap();
    let inputs = inputs_for(&g, 5);
    within_ulps(tanh, &inputs, 4);
}

/// custom_vjp computes `fwd`: its primal outputs and its residuals are the op's results; `bwd`
/// does not run forward.
#[test]
fn custom_vjp_computes_fwd() {
    let text = r#"func @cvjp(%0: f64[4], %1: f32[4]) {
  %2 = custom_vjp %0, %1 primals=1 : (f64[4], f64[4], f32[4])
    fwd(%0: f64[4], %1: f32[4]) {
      %2 = exp %0 : f64[4]
      %3 = log1p %2 : f64[4]
      %4 = abs %1 : f32[4]
      return %3, %2, %4
    }
    bwd(%0: f64[4], %1: f32[4], %2: f64[4]) {
      %3 = constant 1.0 : f64[]
      %4 = broadcast_in_dim %3 dims=[] : f64[4]
      %5 = add %0, %4 : f64[4]
      %6 = div %0, %5 : f64[4]
      %7 = mul %2, %6 : f64[4]
      %8 = neg %1 : f32[4]
      return %7, %8
    }
  %3 = get_result %2 index=0 : f64[4]
  %4 = get_result %2 index=1 : f64[4]
  %5 = get_result %2 index=2 : f32[4]
  return %3, %4, %5
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 6);
    let out = exact(text, &inputs);
    let x = inputs[0].data.as_f64().unwrap();
    let sp: Vec<f64> = x.iter().map(|v| v.exp().ln_1p()).collect();
    assert_eq!(out[0].data.as_f64().unwrap(), &sp[..]);
    let abs: Vec<f32> = f32s(&inputs[1]).iter().map(|v| v.abs()).collect();
    assert_eq!(f32s(&out[2]), abs);
}

/// A scan inside a while inside a case: branch 1 runs `while n < 3: x = cumsum-scan(x)`,
/// branch 0 returns its arguments.
const NESTED: &str = r#"func @nested(%0: i32[], %1: i32[], %2: f32[4]) {
  %3 = case %0, %1, %2 : (i32[], f32[4])
    branch(%0: i32[], %1: f32[4]) {
      return %0, %1
    }
    branch(%0: i32[], %1: f32[4]) {
      %2 = while %0, %1 consts=0 : (i32[], f32[4])
        cond(%0: i32[], %1: f32[4]) {
          %2 = constant 3 : i32[]
          %3 = lt %0, %2 : bool[]
          return %3
        }
        body(%0: i32[], %1: f32[4]) {
          %2 = constant 0.0 : f32[]
          %3 = scan %2, %1 length=4 consts=0 carries=1 : (f32[], f32[4])
            body(%0: f32[], %1: f32[]) {
              %2 = add %0, %1 : f32[]
              return %2, %2
            }
          %4 = get_result %3 index=1 : f32[4]
          %5 = constant 1 : i32[]
          %6 = add %0, %5 : i32[]
          return %6, %4
        }
      %3 = get_result %2 index=0 : i32[]
      %4 = get_result %2 index=1 : f32[4]
      return %3, %4
    }
  %4 = get_result %3 index=0 : i32[]
  %5 = get_result %3 index=1 : f32[4]
  return %4, %5
}
"#;

#[test]
fn nested_regions_a_scan_in_a_while_in_a_case() {
    let x = vec![1.0f32, 2.0, -0.5, 0.25];
    for (index, n) in [(1, 0), (1, 2), (1, 7), (0, 0), (-3, 1)] {
        let inputs = [
            lit(&[], vec![index]),
            lit(&[], vec![n]),
            lit(&[4], x.clone()),
        ];
        let out = exact(NESTED, &inputs);
        let (mut hn, mut hx) = (n, x.clone());
        if index >= 1 {
            while hn < 3 {
                hn += 1;
                let mut acc = 0.0f32;
                for v in hx.iter_mut() {
                    acc += *v;
                    *v = acc;
                }
            }
        }
        assert_eq!(i32s(&out[0]), vec![hn], "index {index} n {n}");
        assert_eq!(f32s(&out[1]), hx, "index {index} n {n}");
    }
}

/// Region results returned directly, one of them twice, one a carry the body passes through,
/// one a region result that is also an operand of a later region.
#[test]
fn a_program_returning_region_results_directly_and_twice() {
    let text = r#"func @direct(%0: f32[3], %1: f32[2,3]) {
  %2 = scan %0, %1 length=2 consts=0 carries=1 : (f32[3], f32[2,3])
    body(%0: f32[3], %1: f32[3]) {
      %2 = mul %0, %1 : f32[3]
      return %2, %0
    }
  %3 = get_result %2 index=0 : f32[3]
  %4 = get_result %2 index=1 : f32[2,3]
  %5 = checkpoint %3, %0 : (f32[3], f32[3])
    body(%0: f32[3], %1: f32[3]) {
      return %1, %0
    }
  %6 = get_result %5 index=0 : f32[3]
  %7 = get_result %5 index=1 : f32[3]
  return %3, %3, %4, %6, %7, %4
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 7);
    let out = exact(text, &inputs);
    assert!(same_bits(&out[0], &out[1]));
    assert!(same_bits(&out[2], &out[5]));
    assert!(
        same_bits(&out[3], &inputs[0]),
        "checkpoint passes %0 through"
    );
    assert!(same_bits(&out[4], &out[0]));
    let (h, xs) = (f32s(&inputs[0]), f32s(&inputs[1]));
    let want: Vec<f32> = (0..3).map(|j| h[j] * xs[j] * xs[3 + j]).collect();
    assert_eq!(f32s(&out[0]), want);
}

/// Regions whose results are unused, in part or entirely (no `get_result` at all), and a
/// region whose only use is a fused elementwise op after it.
#[test]
fn regions_whose_results_are_unused() {
    let text = r#"func @unused(%0: f32[3], %1: f32[4,3], %2: i32[]) {
  %3 = scan %0, %1 length=4 consts=0 carries=1 : (f32[3], f32[4,3])
    body(%0: f32[3], %1: f32[3]) {
      %2 = add %0, %1 : f32[3]
      %3 = sub %0, %1 : f32[3]
      return %2, %3
    }
  %4 = get_result %3 index=0 : f32[3]
  %5 = case %2, %0 : (f32[3])
    branch(%0: f32[3]) {
      %1 = neg %0 : f32[3]
      return %1
    }
    branch(%0: f32[3]) {
      return %0
    }
  %6 = checkpoint %4 : (f32[3])
    body(%0: f32[3]) {
      %1 = abs %0 : f32[3]
      return %1
    }
  %7 = get_result %6 index=0 : f32[3]
  %8 = mul %7, %7 : f32[3]
  %9 = add %8, %0 : f32[3]
  return %9
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 8);
    let out = exact(text, &inputs);
    let (h, xs) = (f32s(&inputs[0]), f32s(&inputs[1]));
    let want: Vec<f32> = (0..3)
        .map(|j| {
            let s = (0..4).fold(h[j], |a, t| a + xs[t * 3 + j]).abs();
            s * s + h[j]
        })
        .collect();
    assert_eq!(f32s(&out[0]), want);
}

/// Operands that are fused expressions, constants, the same value twice, and a zero-size
/// region result as an output.
#[test]
fn region_operands_that_are_expressions_constants_and_repeats() {
    let text = r#"func @operands(%0: f32[2,2]) {
  %1 = add %0, %0 : f32[2,2]
  %2 = constant 3.0 : f32[]
  %3 = broadcast_in_dim %2 dims=[] : f32[2,2]
  %4 = transpose %0 perm=[1,0] : f32[2,2]
  %5 = reduce_sum %1 axes=[1] : f32[2]
  %6 = scan %3, %5, %4, %4 length=2 consts=1 carries=1 : (f32[2], f32[2,2], f32[2,0])
    body(%0: f32[2,2], %1: f32[2], %2: f32[2], %3: f32[2]) {
      %4 = reduce_sum %0 axes=[1] : f32[2]
      %5 = dot_general %0, %1 contracting=[1]x[0] : f32[2]
      %6 = add %4, %5 : f32[2]
      %7 = mul %2, %3 : f32[2]
      %8 = add %6, %7 : f32[2]
      %9 = slice %2 start=[0] limit=[0] : f32[0]
      return %8, %7, %9
    }
  %7 = get_result %6 index=0 : f32[2]
  %8 = get_result %6 index=1 : f32[2,2]
  %9 = get_result %6 index=2 : f32[2,0]
  return %7, %8, %9
}
"#;
    let g = parse(text).unwrap();
    let inputs = inputs_for(&g, 9);
    let out = exact(text, &inputs);
    let x = f32s(&inputs[0]);
    // ys[t] = xt[t]^2 elementwise, xt the transpose: ys[t][j] = x[j][t]^2.
    let want: Vec<f32> = (0..2)
        .flat_map(|t| (0..2).map(move |j| (t, j)))
        .map(|(t, j)| x[j * 2 + t] * x[j * 2 + t])
        .collect();
    assert_eq!(f32s(&out[1]), want);
}
