//! `TESSERA_DUMP=dir` writes the IR of every pass as numbered `.ir` files that parse back, and
//! the native schedule beside them.
//! (Its own test binary: it sets an environment variable for the whole process.)

use tessera::prelude::*;

#[test]
fn dump_writes_parseable_numbered_ir() {
    let dir = std::env::temp_dir().join(format!("tessera-dump-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: this binary's only test sets the variable before any other thread reads the
    // environment.
    unsafe { std::env::set_var("TESSERA_DUMP", &dir) };
    let f = jit(|x: Tensor| x.tanh().sum()).named("dumped");
    f.call(Tensor::ones([4])).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "dumped-1.00-trace.ir",
            "dumped-1.01-simplified.ir",
            "dumped-1.02-schedule.txt"
        ]
    );
    let simplified = std::fs::read_to_string(dir.join(&names[1])).unwrap();
    assert!(simplified.starts_with("// simplify:"), "{simplified}");
    tessera::ir::parse(&simplified).unwrap();
    let schedule = std::fs::read_to_string(dir.join(&names[2])).unwrap();
    assert!(schedule.contains("kernel"), "{schedule}");
    let text = std::fs::read_to_string(dir.join(&names[0])).unwrap();
    let g = tessera::ir::parse(&text).unwrap();
    assert_eq!(g.name, "dumped");
    std::fs::remove_dir_all(&dir).unwrap();
}
