//! The pure crates' architecture rules, enforced: `drover-core` and
//! `drover-solver` depend only on an allowed set of pure crates (no tokio, no
//! I/O, no database, no randomness crate), and their sources use no clock, no
//! hash-ordered container, no I/O and no threads, so replaying the recorded
//! inputs rebuilds the same state. Adding a dependency to a list is an
//! architecture decision: update ARCHITECTURE.md with it.
//!
//! One exception: the core's `idmap.rs` wraps hash tables for lookups by job
//! ID, and its only way to visit the entries sorts them first (checked here).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Crates every pure crate may depend on (normal dependencies, directly or
/// not; dev-dependencies are for tests and benchmarks).
const PURE: &[&str] = &[
    // For the core's index of live jobs (`idmap.rs`): a hash table of slab
    // indices, its hashes given by the caller.
    "hashbrown",
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

/// Forbidden in a pure crate's source, with the reason.
const FORBIDDEN: &[(&str, &str)] = &[
    ("Instant", "no clock reads: `now` is an input"),
    ("SystemTime", "no clock reads: `now` is an input"),
    ("HashMap", "hash order would make decisions nondeterministic"),
    ("HashSet", "hash order would make decisions nondeterministic"),
    ("HashTable", "hash order would make decisions nondeterministic"),
    ("hashbrown", "hash order would make decisions nondeterministic"),
    ("std::fs", "no I/O"),
    ("std::net", "no I/O"),
    ("std::io", "no I/O"),
    ("std::process", "no I/O"),
    ("std::thread", "single-threaded, never blocks"),
    ("std::env", "settings come in the crate's Config"),
    ("tokio", "never depends on an async runtime"),
];

fn crate_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// Fails unless every normal dependency of `name` is in `PURE` or `extra`.
fn depends_only_on_pure_crates(name: &str, extra: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-e", "normal", "--prefix", "none", "--target", "all", "--manifest-path"])
        .arg(crate_dir(name).join("Cargo.toml"))
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"serde"), "the tree output was not parsed: {tree}");
    let foreign: Vec<&&str> =
        crates.iter().filter(|c| **c != name && !PURE.contains(c) && !extra.contains(c)).collect();
    assert!(foreign.is_empty(), "{name} must stay pure, but depends on {foreign:?}");
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

/// The one file of a pure crate allowed to name a hash table: lookups only.
const HASHED_LOOKUPS: &str = "idmap.rs";

/// Fails if `name`'s source (at least `min_files` files) uses a forbidden API.
fn source_is_pure(name: &str, min_files: usize) {
    let mut files = Vec::new();
    sources(&crate_dir(name).join("src"), &mut files);
    assert!(files.len() >= min_files, "found only {files:?}");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let hashed_lookups = file.file_name().is_some_and(|f| f == HASHED_LOOKUPS);
            for (word, why) in FORBIDDEN {
                if hashed_lookups && (word.starts_with("Hash") || *word == "hashbrown") {
                    continue;
                }
                if code.contains(word) {
                    found.push(format!("{}:{}: `{word}`: {why}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn core_depends_only_on_pure_crates() {
    depends_only_on_pure_crates("drover-core", &[]);
}

#[test]
fn core_source_uses_no_clock_io_threads_or_hash_order() {
    source_is_pure("drover-core", 5);
}

/// The core's hashed index visits its entries only to sort them, or to
/// drop the job index's stale entries (a pass whose every step depends on
/// one entry alone): every function of `idmap.rs` that iterates the table
/// is named `sorted` or `drop_stale`.
#[test]
fn core_hash_table_is_never_iterated_in_hash_order() {
    let path = crate_dir("drover-core").join("src").join(HASHED_LOOKUPS);
    let text = std::fs::read_to_string(&path).expect("read idmap.rs");
    let mut function = String::new();
    let mut iterating = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if let Some(rest) = code.strip_prefix("pub(crate) fn ").or_else(|| code.strip_prefix("fn ")) {
            function = rest.split(['(', '<']).next().unwrap_or("").to_owned();
        }
        let visits = [
            ".iter()",
            ".iter_mut()",
            ".iter_hash(",
            ".keys()",
            ".values()",
            ".drain(",
            ".extract_if(",
            ".into_iter()",
            ".retain(",
        ]
        .iter()
        .any(|m| code.contains(&format!("map{m}")));
        if visits {
            iterating.push(function.clone());
        }
    }
    assert!(!iterating.is_empty(), "the scan found no iteration at all in {}", path.display());
    assert!(
        iterating.iter().all(|f| f == "sorted" || f == "drop_stale"),
        "{} iterates its hash table outside `sorted` and `drop_stale`: {iterating:?}",
        path.display()
    );
}

#[test]
fn solver_depends_only_on_pure_crates_and_the_core() {
    depends_only_on_pure_crates("drover-solver", &["drover-core", "drover-proto"]);
}

#[test]
fn solver_source_uses_no_clock_io_threads_or_hash_order() {
    source_is_pure("drover-solver", 2);
}
