//! The core's architecture rules, enforced: it depends only on an allowed set
//! of pure crates (no tokio, no I/O, no database, no randomness crate), and its
//! source uses no clock, no hash-ordered container, no I/O and no threads.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every crate drover-core may depend on, directly or not (normal
/// dependencies only; dev-dependencies are for tests and benchmarks). Adding
/// one is an architecture decision: update ARCHITECTURE.md with it.
const ALLOWED: &[&str] = &[
    "drover-core",
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
fn core_depends_only_on_allowed_pure_crates() {
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
    assert!(crates.contains(&"serde"), "the tree output was not parsed: {tree}");
    let foreign: Vec<&&str> = crates.iter().filter(|c| !ALLOWED.contains(c)).collect();
    assert!(foreign.is_empty(), "drover-core must stay pure, but depends on {foreign:?}");
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Forbidden in the core's source, with the reason.
const FORBIDDEN: &[(&str, &str)] = &[
    ("Instant", "the core reads no clock: `now` is an input"),
    ("SystemTime", "the core reads no clock: `now` is an input"),
    ("HashMap", "hash order would make decisions nondeterministic"),
    ("HashSet", "hash order would make decisions nondeterministic"),
    ("std::fs", "the core does no I/O"),
    ("std::net", "the core does no I/O"),
    ("std::io", "the core does no I/O"),
    ("std::process", "the core does no I/O"),
    ("std::thread", "the core is single-threaded and never blocks"),
    ("std::env", "the core's settings come in its Config"),
    ("tokio", "the core never depends on an async runtime"),
];

#[test]
fn core_source_uses_no_clock_io_threads_or_hash_order() {
    let mut files = Vec::new();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() >= 5, "found only {files:?}");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (word, why) in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("{}:{}: `{word}`: {why}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
