//! Region ops in the text format: print/parse round trips, and the verifier's and type rules'
//! errors for ill-formed regions.

use tessera_ir::{MAX_REGION_DEPTH, parse, print, verify};

/// A scan (carry + per-step output), a while, a case, a checkpoint and a custom_vjp.
const REGIONS: &str = r#"func @regions(%0: f32[4], %1: f32[3,4], %2: i32[]) {
  %3 = scan %0, %1 length=3 consts=0 carries=1 : (f32[4], f32[3,4])
    body(%0: f32[4], %1: f32[4]) {
      %2 = add %0, %1 : f32[4]
      %3 = tanh %2 : f32[4]
      return %3, %2
    }
  %4 = get_result %3 index=0 : f32[4]
  %5 = get_result %3 index=1 : f32[3,4]
  %6 = while %4 consts=0 : (f32[4])
    cond(%0: f32[4]) {
      %1 = reduce_sum %0 axes=[0] : f32[]
      %2 = constant 10.0 : f32[]
      %3 = lt %1, %2 : bool[]
      return %3
    }
    body(%0: f32[4]) {
      %1 = add %0, %0 : f32[4]
      return %1
    }
  %7 = get_result %6 index=0 : f32[4]
  %8 = case %2, %7 : (f32[4])
    branch(%0: f32[4]) {
      %1 = neg %0 : f32[4]
      return %1
    }
    branch(%0: f32[4]) {
      return %0
    }
  %9 = get_result %8 index=0 : f32[4]
  %10 = checkpoint %9 : (f32[4])
    body(%0: f32[4]) {
      %1 = sin %0 : f32[4]
      return %1
    }
  %11 = get_result %10 index=0 : f32[4]
  %12 = custom_vjp %11 primals=1 : (f32[4], f32[4])
    fwd(%0: f32[4]) {
      %1 = exp %0 : f32[4]
      return %1, %1
    }
    bwd(%0: f32[4], %1: f32[4]) {
      %2 = mul %0, %1 : f32[4]
      return %2
    }
  %13 = get_result %12 index=0 : f32[4]
  %14 = stop_gradient %13 : f32[4]
  return %14, %5
}
"#;

#[test]
fn regions_print_as_they_parse() {
    let g = parse(REGIONS).unwrap();
    verify(&g).unwrap();
    assert_eq!(print(&g), REGIONS);
    let again = parse(&print(&g)).unwrap();
    assert!(again.structurally_eq(&g));
}

fn error_of(text: &str) -> String {
    match parse(text) {
        Ok(g) => match verify(&g) {
            Ok(()) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_carried_value_that_changes_type_is_an_error() {
    let e = error_of(
        "func @f(%0: f32[4]) {
  %1 = while %0 consts=0 : (f32[4])
    cond(%0: f32[4]) {
      %1 = constant true : bool[]
      return %1
    }
    body(%0: f32[4]) {
      %1 = convert %0 : f64[4]
      return %1
    }
  return %1
}",
    );
    assert!(e.contains("a carried value must keep its type"), "{e}");
    assert!(e.contains("(f64[4])") && e.contains("(f32[4])"), "{e}");
}

#[test]
fn a_non_scalar_predicate_is_an_error() {
    let e = error_of(
        "func @f(%0: f32[4]) {
  %1 = while %0 consts=0 : (f32[4])
    cond(%0: f32[4]) {
      %1 = constant 0.0 : f32[4]
      %2 = lt %0, %1 : bool[4]
      return %2
    }
    body(%0: f32[4]) {
      return %0
    }
  return %1
}",
    );
    assert!(e.contains("the predicate must be a scalar bool"), "{e}");
}

#[test]
fn branches_of_different_types_are_an_error() {
    let e = error_of(
        "func @f(%0: i32[], %1: f32[4]) {
  %2 = case %0, %1 : (f32[4])
    branch(%0: f32[4]) {
      return %0
    }
    branch(%0: f32[4]) {
      %1 = reduce_sum %0 axes=[0] : f32[]
      return %1
    }
  return %2
}",
    );
    assert!(e.contains("every branch must return the same types"), "{e}");
}

#[test]
fn a_scan_over_the_wrong_length_is_an_error() {
    let e = error_of(
        "func @f(%0: f32[5,4]) {
  %1 = scan %0 length=3 consts=0 carries=0 : (f32[3,4])
    body(%0: f32[4]) {
      return %0
    }
  return %1
}",
    );
    assert!(e.contains("not a leading dim of the length 3"), "{e}");
}

#[test]
fn a_get_result_of_the_wrong_type_or_index_is_an_error() {
    let base = "func @f(%0: f32[4]) {
  %1 = checkpoint %0 : (f32[4])
    body(%0: f32[4]) {
      return %0
    }
  %2 = get_result %1 index=INDEX : TYPE
  return %2
}";
    let e = error_of(&base.replace("INDEX", "0").replace("TYPE", "f64[4]"));
    assert!(e.contains("region's result 0 is f32[4]"), "{e}");
    let e = error_of(&base.replace("INDEX", "1").replace("TYPE", "f32[4]"));
    assert!(
        e.contains("reads result 1 of a region with 1 results"),
        "{e}"
    );
    let e = error_of(
        "func @f(%0: bool[0]) {
  %1 = get_result %0 index=0 : f32[4]
  return %1
}",
    );
    assert!(e.contains("get_result"), "{e}");
}

#[test]
fn results_written_with_the_wrong_types_are_an_error() {
    let e = error_of(
        "func @f(%0: f32[4]) {
  %1 = checkpoint %0 : (f32[5])
    body(%0: f32[4]) {
      return %0
    }
  return
}",
    );
    assert!(
        e.contains("the results are written (f32[5]) but the regions give (f32[4])"),
        "{e}"
    );
}

/// Regions nested past the limit are a parse error, not a stack overflow (the parser and the
/// verifier recurse once per level).
#[test]
fn regions_nested_too_deeply_are_an_error() {
    let depth = MAX_REGION_DEPTH + 1;
    let mut text = String::from("func @f(%0: f32[]) {\n");
    for _ in 0..depth {
        text.push_str("  %1 = checkpoint %0 : (f32[])\n    body(%0: f32[]) {\n");
    }
    text.push_str("      return %0\n");
    for _ in 0..depth {
        text.push_str("    }\n  %2 = get_result %1 index=0 : f32[]\n  return %2\n}\n");
    }
    let e = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || error_of(&text))
        .unwrap()
        .join()
        .unwrap();
    assert!(e.contains("regions nest deeper than 64 levels"), "{e}");
}
