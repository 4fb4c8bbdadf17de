//! The solver's architecture rules, enforced like the core's: it depends only
//! on pure crates and its source uses no clock, no hash-ordered container, no
//! I/O and no threads, so the coordinator's replay of its inputs rebuilds the
//! same state.

use std::path::Path;
use std::process::Command;

/// Every crate drover-solver may depend on, directly or not (normal
/// dependencies only). Adding one is an architecture decision.
const ALLOWED: &[&str] = &[
    "drover-solver",
    "drover-core",
    "drover-proto",
    "serde",
    "serde_core",
    "serde_derive",
    "thiserror",
    "thiserror-impl",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
];

#[test]
fn solver_depends_only_on_allowed_pure_crates() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-e", "normal", "--prefix", "none", "--target", "all", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"drover-core"), "the tree output was not parsed: {tree}");
    let foreign: Vec<&&str> = crates.iter().filter(|c| !ALLOWED.contains(c)).collect();
    assert!(foreign.is_empty(), "drover-solver must stay pure, but depends on {foreign:?}");
}

/// Forbidden in the solver's source, with the reason.
const FORBIDDEN: &[(&str, &str)] = &[
    ("Instant", "the solver reads no clock: `now` is an input"),
    ("SystemTime", "the solver reads no clock: `now` is an input"),
    ("HashMap", "hash order would make replay nondeterministic"),
    ("HashSet", "hash order would make replay nondeterministic"),
    ("std::fs", "the solver does no I/O"),
    ("std::net", "the solver does no I/O"),
    ("std::io", "the solver does no I/O"),
    ("std::process", "the solver does no I/O"),
    ("std::thread", "the solver is single-threaded"),
    ("std::env", "the solver's settings come in its Config"),
    ("tokio", "the solver never depends on an async runtime"),
];

#[test]
fn solver_source_uses_no_clock_io_threads_or_hash_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&src).expect("read src") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (word, why) in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("{}:{}: `{word}`: {why}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(files >= 2, "found only {files} source files in {}", src.display());
    assert!(found.is_empty(), "{}", found.join("\n"));
}
