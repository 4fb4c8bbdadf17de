//! Workspace tidiness, enforced as a test: every Rust file starts with a `//!`
//! module doc, no test is ignored or expected to panic, and no line has
//! trailing whitespace.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_is_documented_and_tidy() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    assert!(files.len() > 10, "walked too few files: {files:?}");
    let ignore_attr = ["#[", "ignore]"].concat();
    let panic_attr = ["#[", "should_panic"].concat();
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        if !first.starts_with("//!") {
            problems.push(format!("{}: no `//!` module doc at the top", file.display()));
        }
        for (n, line) in text.lines().enumerate() {
            if line.ends_with(' ') || line.ends_with('\t') {
                problems.push(format!("{}:{}: trailing whitespace", file.display(), n + 1));
            }
            if line.contains(&ignore_attr) || line.contains(&panic_attr) {
                problems.push(format!("{}:{}: ignored or should-panic test", file.display(), n + 1));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
