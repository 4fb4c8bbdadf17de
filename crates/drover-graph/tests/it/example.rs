//! The full example build file from the format description, in YAML and in
//! TOML: every field lands where it should, both formats give equal builds,
//! and `load` picks the format from the extension.

use std::collections::BTreeMap;
use std::path::Path;

use drover_graph::{Build, digest_bytes, load};

use crate::common::{Dir, job};

pub(crate) const YAML: &str = r#"name: hello
sources: ["src/**", "include/*.h"]
max_parallel: 4
queue: nightly
jobs:
  - name: compile-a
    run: ["cc -c {{src}}/src/a.c -o {{out}}/a.o"]
    env: {CFLAGS: "-O2"}
    inputs: ["src/a.c", "include/*.h"]
  - name: app
    needs: [compile-a]
    run: ["cc {{dep:compile-a}}/a.o -o {{out}}/app"]
    resources: {cpu: 1, memory: 512Mi, tokens: {network: 1}}
    exclusive: [network]
    labels: {os: linux}
    priority: 0
    timeout: 10m
    retries: 1
"#;

pub(crate) const TOML: &str = r#"name = "hello"
sources = ["src/**", "include/*.h"]
max_parallel = 4
queue = "nightly"

[[jobs]]
name = "compile-a"
run = ["cc -c {{src}}/src/a.c -o {{out}}/a.o"]
env = { CFLAGS = "-O2" }
inputs = ["src/a.c", "include/*.h"]

[[jobs]]
name = "app"
needs = ["compile-a"]
run = ["cc {{dep:compile-a}}/a.o -o {{out}}/app"]
resources = { cpu = 1, memory = "512Mi", tokens = { network = 1 } }
exclusive = ["network"]
labels = { os = "linux" }
priority = 0
timeout = "10m"
retries = 1
"#;

/// The example's source tree, plus files the globs must not pick up.
pub(crate) fn example_dir() -> Dir {
    Dir::with(&[
        ("src/a.c", "int a;\n"),
        ("src/b.c", "int b;\n"),
        ("src/nested/deep/c.c", "int c;\n"),
        ("include/a.h", "#define A\n"),
        ("include/sub/skipped.h", "nested: not matched by include/*.h\n"),
        ("README.md", "not a source\n"),
        ("src/.cache/x", "hidden: not matched by src/**\n"),
        (".drover/state", "drover's own directory\n"),
    ])
}

/// The build with every job's line set to 0, to compare files whose layout
/// differs.
fn without_lines(mut build: Build) -> Build {
    for job in &mut build.jobs {
        job.line = 0;
    }
    build
}

#[test]
fn yaml_example_has_every_field() {
    let dir = example_dir();
    let build = dir.parse(YAML);

    assert_eq!(build.name, "hello");
    assert_eq!(build.root, dir.path());
    assert_eq!(build.max_parallel, Some(4));
    assert_eq!(build.queue.as_deref(), Some("nightly"));
    let paths: Vec<&str> = build.sources.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["include/a.h", "src/a.c", "src/b.c", "src/nested/deep/c.c"]);
    let a = &build.sources[1];
    assert_eq!(a.digest, digest_bytes(b"int a;\n"));
    assert_eq!(a.size, 7);
    assert!(!a.executable);

    let names: Vec<&str> = build.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["compile-a", "app"]);

    let compile = job(&build, "compile-a");
    assert_eq!(compile.line, 6);
    assert_eq!(compile.commands, ["cc -c {{src}}/src/a.c -o {{out}}/a.o"]);
    assert_eq!(compile.env, BTreeMap::from([("CFLAGS".to_owned(), "-O2".to_owned())]));
    assert!(compile.needs.is_empty());
    assert_eq!(compile.inputs, Some(vec!["include/a.h".to_owned(), "src/a.c".to_owned()]));
    assert_eq!(compile.cpu_millis, 1000, "default: one core");
    assert_eq!(compile.memory, 0);
    assert!(compile.tokens.is_empty() && compile.exclusive.is_empty() && compile.labels.is_empty());
    assert_eq!((compile.priority, compile.timeout_ms, compile.retries), (0, None, 1));

    let app = job(&build, "app");
    assert_eq!(app.line, 10);
    assert_eq!(app.needs, ["compile-a"]);
    assert_eq!(app.commands, ["cc {{dep:compile-a}}/a.o -o {{out}}/app"]);
    assert_eq!(app.inputs, None);
    assert_eq!(app.cpu_millis, 1000);
    assert_eq!(app.memory, 512 * 1024 * 1024);
    assert_eq!(app.tokens, BTreeMap::from([("network".to_owned(), 1)]));
    assert_eq!(app.exclusive, ["network"]);
    assert_eq!(app.labels, BTreeMap::from([("os".to_owned(), "linux".to_owned())]));
    assert_eq!(app.timeout_ms, Some(600_000));
    assert_eq!(app.retries, 1);
    assert_ne!(app.id, compile.id);
}

#[test]
fn toml_example_equals_yaml_example() {
    let dir = example_dir();
    let yaml = dir.parse(YAML);
    let toml = dir.parse_as("drover.toml", TOML).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(job(&toml, "compile-a").line, 6);
    assert_eq!(job(&toml, "app").line, 12);
    assert_eq!(without_lines(toml), without_lines(yaml));
}

#[test]
fn load_picks_the_format_from_the_extension() {
    let dir = example_dir();
    let from_yaml = load(&dir.write("drover.yaml", YAML)).unwrap_or_else(|e| panic!("{e}"));
    let from_yml = load(&dir.write("build.yml", YAML)).unwrap_or_else(|e| panic!("{e}"));
    let from_other = load(&dir.write("build.conf", YAML)).unwrap_or_else(|e| panic!("{e}"));
    let from_toml = load(&dir.write("drover.toml", TOML)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_yaml, from_yml);
    assert_eq!(from_yaml, from_other);
    // A build file inside the source directory matched by no glob is not a source.
    assert_eq!(from_yaml.sources.len(), 4);
    assert!(from_yaml.root.is_absolute());
    assert_eq!(from_yaml.root, dir.path());
    assert_eq!(without_lines(from_toml), without_lines(from_yaml));
}

#[test]
fn name_defaults_to_the_directory_name() {
    let dir = Dir::new();
    let project = dir.path().join("my-project");
    std::fs::create_dir(&project).expect("mkdir");
    let file = project.join("drover.yaml");
    std::fs::write(&file, "jobs:\n  - name: a\n    run: 'true'\n").expect("write");
    assert_eq!(load(&file).expect("valid").name, "my-project");
    let build = drover_graph::parse_str(Path::new("drover.yaml"), "jobs: [{name: a, run: x}]", &project)
        .expect("valid");
    assert_eq!(build.name, "my-project");
}

#[test]
fn repository_example_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-c/drover.yaml");
    let build = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(build.name, "hello-c");
    let names: Vec<&str> = build.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["compile-greet", "compile-answer", "compile-main", "link", "test"]);
    assert!(build.sources.iter().any(|s| s.path == "src/main.c"));
    assert!(build.sources.iter().any(|s| s.path == "include/greet.h"));
}

#[test]
fn scalars_become_text_in_env_and_labels() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    run: x\n    env: {N: 3, F: 1.50, B: true, S: '0755', O: 0755}\n    labels: {gpu: no}\n";
    let build = dir.parse(yaml);
    let env = &build.jobs[0].env;
    assert_eq!(env["N"], "3");
    assert_eq!(env["F"], "1.50");
    assert_eq!(env["B"], "true");
    assert_eq!(env["S"], "0755");
    assert_eq!(env["O"], "0755");
    assert_eq!(build.jobs[0].labels["gpu"], "no");
}

#[test]
fn builds_round_trip_through_serde() {
    let dir = example_dir();
    let build = dir.parse(YAML);
    let json = serde_json::to_string(&build).expect("serialize");
    let back: Build = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, build);
}

#[test]
fn yaml_anchors_and_merge_keys() {
    let yaml = "\
jobs:
  - &base
    name: a
    run: ['make {{out}}/x']
    env: {MODE: fast}
  - <<: *base
    name: b
    env: {MODE: slow}
";
    let build = Dir::new().parse(yaml);
    let (a, b) = (job(&build, "a"), job(&build, "b"));
    assert_eq!(b.commands, a.commands);
    assert_eq!(b.env["MODE"], "slow");
    assert_eq!(b.line, 6);
}
