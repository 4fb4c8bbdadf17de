//! Source globs against a real directory tree, and `inputs` globs against
//! the build's sources.

use crate::common::Dir;

fn tree() -> Dir {
    Dir::with(&[
        ("src/a.c", "a"),
        ("src/b.h", "b"),
        ("src/nested/c.c", "c"),
        ("src/nested/deeper/d.c", "d"),
        ("src/.hidden/e.c", "e"),
        ("src/.f.c", "f"),
        ("include/x.h", "x"),
        ("include/y.h", "y"),
        ("include/sub/z.h", "z"),
        ("top.h", "t"),
        ("README", "r"),
        (".env", "secret"),
        (".drover/cache", "cache"),
        (".git/config", "git"),
    ])
}

fn sources(patterns: &str) -> Vec<String> {
    sources_in(&tree(), patterns)
}

fn sources_in(dir: &Dir, patterns: &str) -> Vec<String> {
    let yaml = format!("sources: {patterns}\njobs: [{{name: a, run: x}}]\n");
    dir.parse(&yaml).sources.into_iter().map(|source| source.path).collect()
}

#[test]
fn double_star_matches_nested_files() {
    assert_eq!(sources("[src/**]"), ["src/a.c", "src/b.h", "src/nested/c.c", "src/nested/deeper/d.c"]);
    assert_eq!(sources("['**/*.c']"), ["src/a.c", "src/nested/c.c", "src/nested/deeper/d.c"]);
    assert_eq!(sources("[src/**/deeper/*]"), ["src/nested/deeper/d.c"]);
}

#[test]
fn single_star_does_not_cross_a_slash() {
    assert_eq!(sources("['*.h']"), ["top.h"]);
    assert_eq!(sources("[include/*.h]"), ["include/x.h", "include/y.h"]);
    assert_eq!(sources("['*/*.h']"), ["include/x.h", "include/y.h", "src/b.h"]);
    assert_eq!(sources("['include/?.h']"), ["include/x.h", "include/y.h"]);
}

#[test]
fn hidden_files_and_the_drover_directory_need_naming() {
    let everything = sources("['**']");
    assert_eq!(
        everything,
        [
            "README",
            "include/sub/z.h",
            "include/x.h",
            "include/y.h",
            "src/a.c",
            "src/b.h",
            "src/nested/c.c",
            "src/nested/deeper/d.c",
            "top.h",
        ]
    );
    assert_eq!(sources("[.env, .drover/cache, 'src/.*']"), [".drover/cache", ".env", "src/.f.c"]);
    assert_eq!(sources("['.drover/**', 'src/.hidden/*']"), [".drover/cache", "src/.hidden/e.c"]);
}

#[test]
fn patterns_are_merged_sorted_and_deduplicated() {
    assert_eq!(
        sources("[top.h, 'src/*.c', 'src/**', ./top.h]"),
        ["src/a.c", "src/b.h", "src/nested/c.c", "src/nested/deeper/d.c", "top.h",]
    );
}

#[test]
fn sources_have_digests_and_sizes() {
    let build = tree().parse("sources: [README]\njobs: [{name: a, run: x}]\n");
    assert_eq!(build.sources.len(), 1);
    assert_eq!(build.sources[0].digest, drover_graph::digest_bytes(b"r"));
    assert_eq!(build.sources[0].size, 1);
    let on_disk = drover_graph::digest_file(tree().path().join("README")).expect("readable");
    assert_eq!(on_disk, build.sources[0].digest);
}

#[test]
fn no_sources_is_fine() {
    assert!(tree().parse("jobs: [{name: a, run: x}]\n").sources.is_empty());
}

#[cfg(unix)]
#[test]
fn symbolic_links_inside_the_root() {
    let dir = tree();
    std::os::unix::fs::symlink(dir.path().join("top.h"), dir.path().join("src/link.h")).expect("symlink");
    // A linked directory inside the root is walked at the link's path, as
    // a compiler given `-Isrc/inc` reads it.
    std::os::unix::fs::symlink(dir.path().join("include"), dir.path().join("src/inc")).expect("symlink");
    // One outside the root is passed over.
    let outside = tempfile::tempdir().expect("tempdir");
    std::fs::write(outside.path().join("secret.h"), "s").expect("write");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("src/ext")).expect("symlink");
    assert_eq!(
        sources_in(&dir, "[src/**]"),
        [
            "src/a.c",
            "src/b.h",
            "src/inc/sub/z.h",
            "src/inc/x.h",
            "src/inc/y.h",
            "src/link.h",
            "src/nested/c.c",
            "src/nested/deeper/d.c",
        ]
    );
    assert_eq!(sources_in(&dir, "['src/inc/*.h']"), ["src/inc/x.h", "src/inc/y.h"]);
}

/// The directory outputs are exported to is not read for sources through
/// a link into it either.
#[cfg(unix)]
#[test]
fn a_link_into_the_excluded_directory_is_not_followed() {
    let dir = Dir::with(&[
        ("src/a.c", "a"),
        ("build/out/app/bin", "b"),
        ("build/log.txt", "l"),
        ("drover.yaml", "sources: ['**']\njobs: [{name: a, run: x}]\n"),
    ]);
    // A link to it, and a link to the directory that holds it.
    std::os::unix::fs::symlink(dir.path().join("build/out"), dir.path().join("src/exported"))
        .expect("symlink");
    std::os::unix::fs::symlink(dir.path().join("build"), dir.path().join("src/b")).expect("symlink");
    let out = dir.path().join("build/out");
    let build = drover_graph::load_excluding(&dir.path().join("drover.yaml"), Some(&out)).expect("load");
    let paths: Vec<String> = build.sources.into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["build/log.txt", "drover.yaml", "src/a.c", "src/b/log.txt"]);
}

#[test]
fn inputs_select_among_sources() {
    let yaml = "\
sources: [src/**, include/*.h]
jobs:
  - name: a
    run: x
    inputs: ['src/*.c', 'include/**', src/a.c]
  - name: b
    run: x
    inputs: []
  - name: c
    run: x
";
    let build = tree().parse(yaml);
    assert_eq!(
        build.jobs[0].inputs,
        Some(vec!["include/x.h".into(), "include/y.h".into(), "src/a.c".into()])
    );
    assert_eq!(build.jobs[1].inputs, Some(vec![]));
    assert_eq!(build.jobs[2].inputs, None);
}
