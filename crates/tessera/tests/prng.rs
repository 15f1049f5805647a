//! `tessera::random` against JAX 0.10.2's own values (`fixtures/prng_reference.json`, made by
//! `fixtures/prng_reference.py` with `pip install jax==0.10.2`): bits and uniform bit for bit,
//! normal within one ulp of f32; eagerly and under `jit`.

use serde_json::Value;
use tessera::prelude::*;

fn reference() -> Value {
    let text = include_str!("fixtures/prng_reference.json");
    let all: Value = serde_json::from_str(text).expect("valid JSON");
    all["variants"]["threefry_partitionable=True (default)"].clone()
}

fn u32s(v: &Value) -> Vec<u32> {
    fn walk(v: &Value, out: &mut Vec<u32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Number(n) => out.push(n.as_u64().expect("u32") as u32),
            _ => panic!("not a number: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(&v["uint32"], &mut out);
    out
}

fn f32_bits(v: &Value) -> Vec<u32> {
    fn walk(v: &Value, out: &mut Vec<u32>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::String(s) => {
                out.push(u32::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex"))
            }
            _ => panic!("not hex: {v}"),
        }
    }
    let mut out = Vec::new();
    walk(&v["bits_hex"], &mut out);
    out
}

fn bits_of(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().iter().map(|x| x.to_bits()).collect()
}

/// Distance in units in the last place between two finite f32 of the same sign.
fn ulps(a: u32, b: u32) -> u32 {
    a.abs_diff(b)
}

#[test]
fn keys_split_and_fold_in() {
    let r = reference();
    assert_eq!(
        Key::new(0).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(0))"])
    );
    assert_eq!(
        Key::new(1).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(1))"])
    );
    assert_eq!(
        Key::new(2).data().to_vec::<u32>(),
        u32s(&r["key_data(PRNGKey(2))"])
    );
    let [a, b] = Key::new(0).split();
    let want = u32s(&r["split(PRNGKey(0))"]);
    assert_eq!(
        [a.data().to_vec::<u32>(), b.data().to_vec::<u32>()].concat(),
        want
    );
    let three: Vec<u32> = Key::new(0)
        .split_n(3)
        .iter()
        .flat_map(|k| k.data().to_vec::<u32>())
        .collect();
    assert_eq!(three, u32s(&r["split(PRNGKey(0), 3)"]));
    assert_eq!(
        Key::new(0).fold_in(1).data().to_vec::<u32>(),
        u32s(&r["fold_in(PRNGKey(0), 1)"])
    );
    let m = &r["seed_model"];
    assert_eq!(a.data().to_vec::<u32>(), u32s(&m["k1"]));
    assert_eq!(b.data().to_vec::<u32>(), u32s(&m["k2"]));
}

#[test]
fn bits_and_uniform_are_bit_exact() {
    let r = reference();
    let k = Key::new(0);
    assert_eq!(
        random::bits(&k, [6]).to_vec::<u32>(),
        u32s(&r["bits(PRNGKey(0), (6,), uint32)"])
    );
    assert_eq!(
        random::bits(&k, [4, 3]).to_vec::<u32>(),
        u32s(&r["bits(PRNGKey(0), (4,3), uint32)"])
    );
    assert_eq!(
        bits_of(&random::uniform(&k, [6], 0.0, 1.0)),
        f32_bits(&r["uniform(PRNGKey(0), (6,))"])
    );
    let lo = f32::from_bits((-1.0f32).to_bits() - 1);
    let u = random::uniform(&k, [4, 3], lo, 1.0);
    assert_eq!(
        bits_of(&u),
        f32_bits(
            &r["uniform(PRNGKey(0), (4,3), minval=nextafter(-1,0), maxval=1)  [the u inside normal]"]
        )
    );
}

fn assert_within_one_ulp(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            ulps(g, w) <= 1,
            "{what}[{i}]: {} vs JAX {}",
            f32::from_bits(g),
            f32::from_bits(w)
        );
    }
}

#[test]
fn normal_is_within_one_ulp() {
    let r = reference();
    let n = random::normal(&Key::new(0), [4, 3]);
    assert_within_one_ulp(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(0), (4,3))"]),
        "normal(0)",
    );
    let n = random::normal(&Key::new(1), [3, 2]);
    assert_within_one_ulp(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(1), (3,2))"]),
        "normal(1)",
    );
}

#[test]
fn the_seed_models_parameters_and_data() {
    let m = &reference()["seed_model"];
    let [k1, k2] = Key::new(0).split();
    let w1 = random::normal(&k1, [10, 32]) * 0.1;
    let w2 = random::normal(&k2, [32, 1]) * 0.1;
    assert_within_one_ulp(
        &bits_of(&w1.slice(&[0, 0], &[1, 32])),
        &f32_bits(&m["w1[0,:]"]),
        "w1 row 0",
    );
    assert_within_one_ulp(
        &bits_of(&w1.slice(&[0, 0], &[10, 1])),
        &f32_bits(&m["w1[:,0] (first column, 10)"]),
        "w1 col 0",
    );
    assert_within_one_ulp(&bits_of(&w2), &f32_bits(&m["w2[:,0] (all 32)"]), "w2");
    for n in [256, 512, 64] {
        let x = random::normal(&Key::new(1), [n, 10]);
        let key = format!("X=normal(PRNGKey(1),({n},10)) row 0");
        assert_within_one_ulp(
            &bits_of(&x.slice(&[0, 0], &[1, 10])),
            &f32_bits(&m[&key]),
            &key,
        );
    }
    let y = random::normal(&Key::new(2), [256, 1]);
    assert_within_one_ulp(
        &bits_of(&y.slice(&[0, 0], &[5, 1])),
        &f32_bits(&m["y=normal(PRNGKey(2),(256,1))[:5,0]"]),
        "y",
    );
}

#[test]
fn random_numbers_are_traced_ops_under_jit() {
    let r = reference();
    let f = jit(|k: Key| random::normal(&k, [4, 3]));
    let n = f.call(Key::new(0)).unwrap();
    assert_within_one_ulp(
        &bits_of(&n),
        &f32_bits(&r["normal(PRNGKey(0), (4,3))"]),
        "jit normal",
    );
    let ir = f.lower(&Key::new(0)).unwrap().ir();
    for op in ["shift_left", "xor", "bitcast", "erf_inv"] {
        assert!(ir.contains(op), "{op} missing from\n{ir}");
    }
    let eager = random::normal(&Key::new(0), [4, 3]);
    assert_eq!(
        bits_of(&n),
        bits_of(&eager),
        "jit and eager draw the same numbers"
    );
}
