//! The parser never panics: random text, and valid text mutated by deleting, duplicating or
//! replacing characters, always gives `Ok` or a located `Err`.

use proptest::prelude::*;
use tessera_ir::corpus::op_samples;
use tessera_ir::{parse, print};

fn corpus_texts() -> Vec<String> {
    let mut texts: Vec<String> = op_samples().iter().map(|s| print(&s.graph)).collect();
    texts.push(
        "mesh @m = <\"dp\"=4>\nfunc @f(%0: f32[8,2] <@m, [{\"dp\", ?}, {}], replicated={}>) {\n  %1 = all_reduce %0 sum axes=[\"dp\"] : f32[8,2]  # x.rs:1\n  return %1\n}\n".into(),
    );
    texts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_text_never_panics(s in "[ -~\n]{0,200}") {
        let _ = parse(&s);
    }

    #[test]
    fn random_tokens_never_panic(tokens in prop::collection::vec(prop::sample::select(vec![
        "func", "@f", "(", ")", "{", "}", "%0", "%1", ":", "f32[2]", "f32[", "]", "=", "exp", "add",
        ",", "return", "constant", "[1.0]", "mesh", "<", ">", "\"dp\"", "axes=", "dims=[0]", "#", "\n",
        "contracting=[1]x[0]", "?", "-1", "99999999999999999999", "sharding=",
    ]), 0..40)) {
        let _ = parse(&tokens.join(" "));
    }

    /// Hostile pieces (deep brackets, huge and overflowing dims, huge constants) among valid
    /// ones: an error, never a panic, an abort or a stack overflow.
    #[test]
    fn hostile_tokens_never_panic(tokens in prop::collection::vec(prop::sample::select(vec![
        "func @f(", "%0: ", "f32[4294967296,4294967296]", "f32[0,4294967296,4294967296]",
        "bool[9223372036854775807]", "f32[100000000000]", "f32[3]", "f32[]", ") {", "}",
        "%1 = constant", "1.0", ":", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "]]]]", "[1.0,2.0]",
        "%1 = pad %0, %0 low=[", "9223372036854775807", "-9223372036854775808", "]", ",",
        "high=[0]", "interior=[", "return %1", "\n", "mesh @m = <\"a\"=4294967296, \"b\"=4294967296>",
        "%1 = all_gather %0 dim=0 axes=[\"a\",\"b\"]", "%1 = broadcast_in_dim %0 dims=[]",
    ]), 0..60)) {
        let text = tokens.join(" ");
        let r = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || parse(&text).map(|_| ()))
            .unwrap()
            .join();
        prop_assert!(r.is_ok(), "the parser panicked");
    }

    #[test]
    fn mutated_text_never_panics(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::char::range(' ', '~')), 1..6),
    ) {
        let texts = corpus_texts();
        let mut chars: Vec<char> = which.get(&texts).chars().collect();
        for (at, kind, c) in edits {
            if chars.is_empty() { break; }
            let i = at.index(chars.len());
            match kind {
                0 => { chars.remove(i); }
                1 => { let d = chars[i]; chars.insert(i, d); }
                _ => chars[i] = c,
            }
        }
        let text: String = chars.into_iter().collect();
        if let Err(e) = parse(&text) {
            prop_assert!(e.line >= 1 && e.col >= 1);
        }
    }
}
