//! Proves that the compiler-checked list of places in `docs/add-an-op.md` is complete and exact.
//!
//! The test copies the workspace sources to `target/add-an-op/ws`, adds a variant `Dummy` to
//! `Op` (then, in a fresh copy, to `UnaryOp`) and runs `cargo check --workspace --all-targets`
//! there. Every `E0004` (non-exhaustive patterns) error is one place a new op must reach. A
//! crate that does not compile stops its dependents from being checked, so each reported match
//! is then given a first arm `_ => unreachable!()` in the copy and the check runs again, until
//! the whole workspace compiles: the places found are then all of them. Their files and
//! enclosing functions must equal the list between `<!-- places:begin -->` and
//! `<!-- places:end -->` (`<!-- unary-places:begin -->` ... for `UnaryOp`) of the doc.
//!
//! The check shares `target/tidy-clippy` with the tidy test, so dependencies are checked once.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The sources the copy needs to check every target of the workspace.
const COPIED: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "rust-toolchain.toml",
    "crates",
    "src",
    "tests",
    "examples",
    "benches",
    // The patched gemm-common of `[patch.crates-io]`.
    "vendor",
];

/// How many rounds of check-and-patch before giving up (the crate graph is about five deep).
const MAX_ROUNDS: usize = 12;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
        let entries =
            fs::read_dir(from).unwrap_or_else(|e| panic!("read dir {}: {e}", from.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("read dir {}: {e}", from.display()));
            let name = entry.file_name();
            if name == "target" {
                continue;
            }
            copy_tree(&entry.path(), &to.join(name));
        }
    } else {
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        }
        fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

/// A fresh copy of the workspace sources at `ws`.
fn copy_workspace(ws: &Path) {
    if ws.exists() {
        fs::remove_dir_all(ws).unwrap_or_else(|e| panic!("remove {}: {e}", ws.display()));
    }
    for item in COPIED {
        let from = repo().join(item);
        if from.exists() {
            copy_tree(&from, &ws.join(item));
        }
    }
}

/// Adds `Dummy,` as the first variant of `pub enum <name>` in the copy of `op.rs`.
fn add_variant(ws: &Path, name: &str) {
    let path = ws.join("crates/tessera-ir/src/op.rs");
    let text = fs::read_to_string(&path).unwrap();
    let decl = format!("pub enum {name} {{\n");
    let at = text
        .find(&decl)
        .unwrap_or_else(|| panic!("no `pub enum {name} {{` in crates/tessera-ir/src/op.rs"));
    let mut patched = text.clone();
    patched.insert_str(at + decl.len(), "    Dummy,\n");
    fs::write(&path, patched).unwrap();
}

/// One `E0004` error: the file (relative to the workspace), line and column (1-based).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
    col: usize,
}

/// The `E0004` sites in `cargo check --message-format=short` output.
fn e0004_sites(stderr: &str) -> Vec<Site> {
    let mut sites = Vec::new();
    for line in stderr.lines() {
        let Some(at) = line.find(": error[E0004]") else {
            continue;
        };
        let mut parts = line[..at].rsplitn(3, ':');
        let col = parts.next().and_then(|c| c.parse().ok());
        let row = parts.next().and_then(|r| r.parse().ok());
        let file = parts.next();
        match (file, row, col) {
            (Some(file), Some(line), Some(col)) => sites.push(Site {
                file: file.to_string(),
                line,
                col,
            }),
            _ => panic!("cannot read the location of: {line}"),
        }
    }
    sites.sort();
    sites.dedup();
    sites
}

/// The name of the function whose body holds line `line` (1-based) of `text`: the nearest
/// `fn name` at or above it.
fn enclosing_fn(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    for l in lines[..line.min(lines.len())].iter().rev() {
        let t = l.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let mut rest = t;
        while let Some(at) = rest.find("fn ") {
            let before_ok = at == 0 || rest[..at].ends_with(' ');
            let after = &rest[at + 3..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let next = after[name.len()..].chars().next();
            if before_ok && !name.is_empty() && matches!(next, Some('(') | Some('<')) {
                return Some(name);
            }
            rest = &rest[at + 3..];
        }
    }
    None
}

/// Gives the match whose scrutinee starts at `site` a first arm `_ => unreachable!()`, so that
/// the crate compiles and its dependents get checked. The line count does not change.
fn patch(ws: &Path, sites: &[Site]) {
    // Right to left within a line, so earlier columns stay valid.
    let mut sites = sites.to_vec();
    sites.sort_by(|a, b| (&a.file, a.line, b.col).cmp(&(&b.file, b.line, a.col)));
    for site in &sites {
        let path = ws.join(&site.file);
        let text = fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
        let mut found = false;
        for (i, l) in lines.iter_mut().enumerate().skip(site.line - 1).take(8) {
            let from = if i == site.line - 1 {
                l.char_indices()
                    .nth(site.col - 1)
                    .map_or(l.len(), |(b, _)| b)
            } else {
                0
            };
            if let Some(b) = l[from..].find('{') {
                l.insert_str(from + b + 1, " _ => unreachable!(\"add_an_op\"),");
                found = true;
                break;
            }
        }
        assert!(found, "no `{{` after the match at {site:?}");
        fs::write(&path, lines.join("\n")).unwrap();
    }
}

/// The `file: fn` lines between the two markers of `docs/add-an-op.md`.
fn documented(section: &str) -> BTreeSet<String> {
    let doc = fs::read_to_string(repo().join("docs/add-an-op.md")).unwrap();
    let begin = format!("<!-- {section}:begin -->");
    let end = format!("<!-- {section}:end -->");
    let from = doc
        .find(&begin)
        .unwrap_or_else(|| panic!("docs/add-an-op.md has no `{begin}`"));
    let to = doc
        .find(&end)
        .unwrap_or_else(|| panic!("docs/add-an-op.md has no `{end}`"));
    doc[from + begin.len()..to]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("```"))
        .map(|l| l.trim_start_matches("- ").trim_matches('`').trim())
        .map(str::to_string)
        .collect()
}

/// Adds `Dummy` to `enum_name`, checks the copy until it compiles, and returns every place as
/// `file: fn` with the `file:line` that found it.
fn places(enum_name: &str) -> Vec<(String, String)> {
    let ws = repo().join("target/add-an-op/ws");
    copy_workspace(&ws);
    add_variant(&ws, enum_name);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = repo().join("target/tidy-clippy");
    let mut found = Vec::new();
    for round in 0..MAX_ROUNDS {
        let out = Command::new(&cargo)
            .current_dir(&ws)
            .env("CARGO_TARGET_DIR", &target)
            .args([
                "check",
                "--offline",
                "--workspace",
                "--all-targets",
                "--keep-going",
                "--message-format=short",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return found;
        }
        let sites = e0004_sites(&stderr);
        assert!(
            !sites.is_empty(),
            "round {round}: the check of the copy with {enum_name}::Dummy fails without \
             a non-exhaustive match:\n{stderr}"
        );
        for s in &sites {
            let original = fs::read_to_string(repo().join(&s.file)).unwrap();
            let f = enclosing_fn(&original, s.line)
                .unwrap_or_else(|| panic!("no fn encloses {}:{}", s.file, s.line));
            found.push((format!("{}: {f}", s.file), format!("{}:{}", s.file, s.line)));
        }
        patch(&ws, &sites);
    }
    panic!("{enum_name}::Dummy: still failing after {MAX_ROUNDS} rounds of patching")
}

fn check_section(enum_name: &str, section: &str) {
    let start = Instant::now();
    let found = places(enum_name);
    eprintln!(
        "{enum_name}::Dummy: {} places found in {:.1} s",
        found.len(),
        start.elapsed().as_secs_f64()
    );
    let have: BTreeSet<String> = found.iter().map(|(p, _)| p.clone()).collect();
    let want = documented(section);
    let missing: Vec<String> = found
        .iter()
        .filter(|(p, _)| !want.contains(p))
        .map(|(p, at)| format!("  {p}   (found at {at})"))
        .collect();
    let extra: Vec<&String> = want.difference(&have).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/add-an-op.md's `{section}` list is not the set of matches a new \
         {enum_name} variant must reach.\nMissing from the doc:\n{}\nListed but not a \
         place (the compiler did not ask for it):\n{}",
        missing.join("\n"),
        extra
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn enclosing_fn_finds_the_nearest_fn() {
    let text = "impl X {\n    pub fn outer(&self) -> u8 {\n        // fn not_this(\n        \
                match self {\n    }\n}\nfn other<T>() {}\n";
    assert_eq!(enclosing_fn(text, 4).as_deref(), Some("outer"));
    assert_eq!(enclosing_fn(text, 7).as_deref(), Some("other"));
    assert_eq!(enclosing_fn(text, 1), None);
}

#[test]
fn e0004_sites_reads_short_messages() {
    let stderr = "crates/a/src/b.rs:12:15: error[E0004]: non-exhaustive patterns: `Op::Dummy` \
                  not covered\ncrates/a/src/b.rs:3:1: error[E0308]: mismatched types\n";
    assert_eq!(
        e0004_sites(stderr),
        vec![Site {
            file: "crates/a/src/b.rs".into(),
            line: 12,
            col: 15
        }]
    );
}

/// Both enums in one test, one after the other: they share the copy's directory, and so the
/// checked dependencies of the copy's crates.
#[test]
fn add_an_op_lists_every_place() {
    check_section("Op", "places");
    check_section("UnaryOp", "unary-places");
}
