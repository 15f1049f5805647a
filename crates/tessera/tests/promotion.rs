//! JAX's type promotion in the front end, against JAX 0.10.2 (`fixtures/promotion/promotion.json`,
//! made by `fixtures/promotion/make.py`): `result_type` over every pair of (dtype, weak), the
//! same through a real op (`select`), the op-level cases, the Rust-scalar operators on both
//! sides, and the table in `docs/types.md` (re-rendered from `result_type`; `UPDATE_EXPECT=1`
//! rewrites it).

use std::panic::{AssertUnwindSafe, catch_unwind};

use serde_json::Value;
use tessera::prelude::*;
use tessera::{DType, result_type};

fn fixture() -> Value {
    let text = include_str!("fixtures/promotion/promotion.json");
    serde_json::from_str(text).expect("promotion.json parses")
}

fn operand(v: &Value) -> Option<(DType, bool)> {
    Some((
        DType::from_name(v[0].as_str()?)?,
        v[1].as_bool().expect("weak flag"),
    ))
}

fn panic_text(f: impl FnOnce()) -> String {
    let e = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// JAX reports a weak bool sometimes (`i32 < 0.5`); a bool is never weak in promotion (JAX's
/// lattice maps a weak bool to bool), so weak is compared for non-bool results only.
fn expected(row: &Value) -> (DType, bool) {
    let dtype = DType::from_name(row["dtype"].as_str().unwrap()).unwrap();
    (
        dtype,
        row["weak"].as_bool().unwrap() && dtype != DType::Bool,
    )
}

#[test]
fn result_type_matches_jax_for_every_pair() {
    let fx = fixture();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for row in fx["table"].as_array().unwrap() {
        let (Some(a), Some(b)) = (operand(&row["a"]), operand(&row["b"])) else {
            continue; // a dtype Tessera does not have yet
        };
        let want = expected(row);
        let got = result_type(&[a, b]);
        if got != want {
            wrong.push(format!("{a:?} + {b:?}: got {got:?}, JAX {want:?}"));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every (dtype, weak) pair of Tessera's dtypes is in the fixture.
    assert_eq!(checked, (2 * DType::ALL.len()).pow(2));
}

#[test]
fn select_promotes_its_branches_as_jax() {
    let fx = fixture();
    let pred = Tensor::from_vec(vec![true, false], [2]);
    for row in fx["table"].as_array().unwrap() {
        let (Some((da, wa)), Some((db, wb))) = (operand(&row["a"]), operand(&row["b"])) else {
            continue;
        };
        let a = Tensor::full_dtype([2], 1.0, da).with_weak(wa);
        let b = Tensor::full_dtype([2], 0.0, db).with_weak(wb);
        let (dtype, weak) = expected(row);
        let r = Tensor::select(&pred, &a, &b);
        assert_eq!(
            (r.dtype(), r.is_weak()),
            (dtype, weak),
            "select of {da}{} and {db}{}",
            if wa { " (weak)" } else { "" },
            if wb { " (weak)" } else { "" }
        );
        assert_eq!(r.astype(DType::F64).to_vec::<f64>(), vec![1.0, 0.0]);
    }
}

fn tensor_of(dtype: &str, values: &[Value]) -> Tensor {
    let dtype = DType::from_name(dtype).unwrap();
    let f: Vec<f64> = values
        .iter()
        .map(|v| {
            v.as_f64()
                .or_else(|| v.as_bool().map(|b| b as u8 as f64))
                .unwrap()
        })
        .collect();
    Tensor::from_vec(f.clone(), [f.len()]).astype(dtype)
}

fn op_case<'a>(fx: &'a Value, name: &str) -> &'a Value {
    fx["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

fn check(fx: &Value, name: &str, r: &Tensor) {
    let jax = &op_case(fx, name)["jax"];
    let dtype = DType::from_name(jax["dtype"].as_str().unwrap()).unwrap();
    assert_eq!(r.dtype(), dtype, "{name}");
    if dtype != DType::Bool {
        assert_eq!(r.is_weak(), jax["weak"].as_bool().unwrap(), "{name}: weak");
    }
    let want: Vec<f64> = jax["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(r.astype(DType::F64).to_vec::<f64>(), want, "{name}");
}

fn input(fx: &Value, name: &str, i: usize) -> Tensor {
    let inp = &op_case(fx, name)["inputs"][i];
    tensor_of(inp[0].as_str().unwrap(), inp[1].as_array().unwrap())
}

#[test]
fn op_cases_match_jax() {
    let fx = fixture();
    check(&fx, "arange4_mul_half", &(Tensor::arange(4) * 0.5));
    check(
        &fx,
        "i32_true_divide",
        &(input(&fx, "i32_true_divide", 0) / input(&fx, "i32_true_divide", 1)),
    );
    check(
        &fx,
        "bool_plus_bool",
        &(input(&fx, "bool_plus_bool", 0) + input(&fx, "bool_plus_bool", 1)),
    );
    check(
        &fx,
        "i32_plus_u32",
        &(input(&fx, "i32_plus_u32", 0) + input(&fx, "i32_plus_u32", 1)),
    );
    check(
        &fx,
        "bool_times_weak_float",
        &(input(&fx, "bool_times_weak_float", 0) * 2.5),
    );
    check(
        &fx,
        "i32_lt_half",
        &input(&fx, "i32_lt_half", 0).lt(&Tensor::scalar(0.5f32)),
    );
    check(
        &fx,
        "f32_plus_weak_int",
        &(input(&fx, "f32_plus_weak_int", 0) + 3),
    );

    // `u32 + -1`: JAX wraps -1 to 2^32 - 1 (the fixture records it); Tessera refuses to wrap.
    let jax = &op_case(&fx, "u32_plus_minus_one")["jax"];
    assert_eq!(jax["dtype"], "u32");
    assert_eq!(jax["values"][0].as_f64(), Some(0.0));
    let u = input(&fx, "u32_plus_minus_one", 0);
    let text = panic_text(|| {
        let _ = &u + -1;
    });
    assert!(
        text.contains("-1") && text.contains("does not fit u32") && text.contains("promotion.rs"),
        "{text}"
    );
}

#[test]
fn promotion_inside_jit() {
    let f = jit(|x: Tensor| (&x * 0.25, &x / &x, x.lt(&Tensor::scalar(1.5f32))));
    let (a, b, c): (Tensor, Tensor, Tensor) = f.call(Tensor::arange(3)).unwrap();
    assert_eq!(a.dtype(), DType::F32);
    assert_eq!(a.to_vec::<f32>(), vec![0.0, 0.25, 0.5]);
    assert_eq!(b.dtype(), DType::F32);
    assert!(b.to_vec::<f32>()[0].is_nan());
    assert_eq!(c.to_vec::<bool>(), vec![true, true, false]);
    // An f64 input keeps 64 bits with a weak float; f32 meets f64 at f64.
    let g = jit(|x: Tensor| &x * 0.1 + Tensor::from_vec(vec![1.0f32, 2.0], [2]));
    let r = g.call(Tensor::from_vec(vec![1.0f64, 2.0], [2])).unwrap();
    assert_eq!(r.dtype(), DType::F64);
    assert_eq!(r.to_vec::<f64>(), vec![1.0 + 0.1, 2.0 + 0.2]);
}

#[test]
fn every_rust_scalar_on_both_sides() {
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    let v = |t: Tensor| t.astype(DType::F64).to_vec::<f64>();
    macro_rules! both_sides {
        ($($x:expr),*) => {$(
            assert_eq!(v(&i + $x), vec![3.0, 4.0], "{}", stringify!($x));
            assert_eq!(v($x * &i), vec![2.0, 4.0], "{}", stringify!($x));
            assert_eq!(v($x - i.clone()), vec![1.0, 0.0], "{}", stringify!($x));
            assert_eq!(v(i.clone() % $x), vec![1.0, 0.0], "{}", stringify!($x));
            assert_eq!((&i + $x).dtype(), DType::I32);
        )*};
    }
    both_sides!(2i8, 2i16, 2i32, 2i64, 2isize, 2u8, 2u16, 2u32, 2u64, 2usize);
    for r in [&i + 2.0f32, &i + 2.0f64, 2.0f32 + &i, 2.0 + i.clone()] {
        assert_eq!((r.dtype(), r.to_vec::<f32>()), (DType::F32, vec![3.0, 4.0]));
    }
    let q: Tensor = 4 / &i;
    assert_eq!(q.to_vec::<f32>(), vec![4.0, 2.0]);
    assert_eq!((&i * 2).sum().to_vec::<i32>(), vec![6]);
    // Bitwise with ints and bools.
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert_eq!((&b & true).to_vec::<bool>(), vec![true, false]);
    assert_eq!((true ^ &b).to_vec::<bool>(), vec![false, true]);
    assert_eq!((!&b).to_vec::<bool>(), vec![false, true]);
    assert_eq!((&i | 4u8).to_vec::<i32>(), vec![5, 6]);
    assert_eq!((3usize & i.clone()).to_vec::<i32>(), vec![1, 2]);
    assert_eq!((&i ^ &i).to_vec::<i32>(), vec![0, 0]);
    assert_eq!((!&i).to_vec::<i32>(), vec![-2, -3]);
    // Compound assignment, promoting as JAX's `x = x + ...` does.
    let mut x = i.clone();
    x += 1;
    x *= 3u8;
    x -= 2i64;
    x %= 5;
    assert_eq!((x.dtype(), x.to_vec::<i32>()), (DType::I32, vec![4, 2]));
    x /= 2;
    assert_eq!((x.dtype(), x.to_vec::<f32>()), (DType::F32, vec![2.0, 1.0]));
    x += &Tensor::from_vec(vec![0.5f64, 0.25], [2]);
    assert_eq!(
        (x.dtype(), x.to_vec::<f64>()),
        (DType::F64, vec![2.5, 1.25])
    );
    let mut y = i.clone();
    y |= 8;
    y &= 9u16;
    y ^= 1;
    assert_eq!(y.to_vec::<i32>(), vec![8, 9]);
    // Numbers that do not fit the promoted type are errors, never a wrap.
    let text = panic_text(|| {
        let _ = &i + (1i64 << 40);
    });
    assert!(
        text.contains("1099511627776") && text.contains("i32"),
        "{text}"
    );
    let text = panic_text(|| {
        let _ = u64::MAX * &i;
    });
    assert!(text.contains("does not fit i32"), "{text}");
    let u = i.astype(DType::U32);
    let text = panic_text(|| {
        let _ = -1i8 + &u;
    });
    assert!(text.contains("does not fit u32"), "{text}");
    assert_eq!((&u + 3u64).to_vec::<u32>(), vec![4, 5]);
}

#[test]
fn weak_scalars_take_the_strong_type() {
    let f = Tensor::from_vec(vec![1.0f64, 2.0], [2]);
    assert!(Tensor::scalar(2.0f32).is_weak() && Tensor::scalar(2i32).is_weak());
    assert!(!Tensor::scalar(2u32).is_weak() && !Tensor::scalar(true).is_weak());
    assert_eq!((&f * &Tensor::scalar(2.0f32)).dtype(), DType::F64);
    assert_eq!(
        (&f * &Tensor::scalar(2.0f32)).to_vec::<f64>(),
        vec![2.0, 4.0]
    );
    // Strong scalars promote as tensors: f32 with i32 is f32, and is not weak.
    let s = Tensor::scalar_of(3, DType::F32);
    assert!(!s.is_weak());
    let r = Tensor::arange(2) + &s;
    assert_eq!((r.dtype(), r.is_weak()), (DType::F32, false));
    // Only-weak operands give a weak result, which then meets a strong one.
    let w = Tensor::scalar(2i32) * 3;
    assert!(w.is_weak());
    assert_eq!(
        (&w + &Tensor::arange(2).astype(DType::U32)).dtype(),
        DType::U32
    );
    assert!((-&w).is_weak());
    let text = panic_text(|| {
        let _ = Tensor::scalar_of(0.5, DType::I32);
    });
    assert!(
        text.contains("scalar_of") && text.contains("does not fit i32"),
        "{text}"
    );
}

#[test]
fn floor_divide_rounds_down_and_rem_truncates() {
    let a = Tensor::from_vec(vec![-7i32, 7, -7, 7, 6], [5]);
    let b = Tensor::from_vec(vec![2i32, 2, -2, -2, 3], [5]);
    assert_eq!(a.floor_divide(&b).to_vec::<i32>(), vec![-4, 3, 3, -4, 2]);
    assert_eq!(a.rem(&b).to_vec::<i32>(), vec![-1, 1, -1, 1, 0]);
    let f = a.astype(DType::F32).floor_divide(&b);
    assert_eq!(f.to_vec::<f32>(), vec![-4.0, 3.0, 3.0, -4.0, 2.0]);
    let u = Tensor::from_vec(vec![7u32, 9], [2]);
    assert_eq!(
        u.floor_divide(&Tensor::scalar_of(2u32, DType::U32))
            .to_vec::<u32>(),
        vec![3, 4]
    );
    // Traced too.
    let g = jit(|(a, b): (Tensor, Tensor)| a.floor_divide(&b));
    assert_eq!(
        g.call((a, b)).unwrap().to_vec::<i32>(),
        vec![-4, 3, 3, -4, 2]
    );
}

/// The table of `docs/types.md`, rendered from `result_type`.
fn render_table() -> String {
    let mut cols: Vec<(DType, bool)> = Vec::new();
    for d in DType::ALL {
        cols.push((d, false));
        if d != DType::Bool {
            cols.push((d, true));
        }
    }
    let name = |(d, w): (DType, bool)| if w { format!("{d}*") } else { d.to_string() };
    let mut out = String::from("|      |");
    for &c in &cols {
        out += &format!(" {:>5} |", name(c));
    }
    out += "\n|------|";
    out += &"------:|".repeat(cols.len());
    out += "\n";
    for &r in &cols {
        out += &format!("| {:<4} |", name(r));
        for &c in &cols {
            out += &format!(" {:>5} |", name(result_type(&[r, c])));
        }
        out += "\n";
    }
    out
}

#[test]
fn docs_types_md_table_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/types.md");
    let doc = std::fs::read_to_string(path).expect("docs/types.md");
    let (begin, end) = ("<!-- table:begin -->\n", "<!-- table:end -->");
    let i = doc.find(begin).expect("table:begin marker") + begin.len();
    let j = doc.find(end).expect("table:end marker");
    let table = render_table();
    if std::env::var("UPDATE_EXPECT").is_ok() {
        std::fs::write(path, format!("{}{table}{}", &doc[..i], &doc[j..])).unwrap();
        return;
    }
    assert_eq!(
        &doc[i..j],
        table,
        "docs/types.md is stale: rerun with UPDATE_EXPECT=1"
    );
}
