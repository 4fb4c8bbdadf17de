//! Every kind of diagnostic, each at its exact line and with its job, and
//! several problems reported together in line order.

use std::path::Path;

use drover_graph::{Diagnostic, GraphError, MAX_FILE_BYTES, MAX_JOBS, load, parse_str};

use crate::common::{Dir, at, errors_of, only};

#[test]
fn unknown_keys_suggest_the_closest_key() {
    let dir = Dir::new();
    let yaml = "\
nmae: x
jobs:
  - name: a
    rn: x
    run: x
    resources: {cpus: 2}
    frobnicate: 1
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(1, None, "unknown key \"nmae\" (did you mean \"name\"?)"),
            at(4, Some("a"), "unknown key \"rn\" in job (did you mean \"run\"?)"),
            at(6, Some("a"), "unknown key \"cpus\" in resources (did you mean \"cpu\"?)"),
            at(
                7,
                Some("a"),
                "unknown key \"frobnicate\" in job (expected one of: name, run, env, needs, inputs, \
                 resources, exclusive, labels, priority, timeout, retries, retry_on_failure, cache, gang)"
            ),
        ]
    );
}

#[test]
fn wrong_types() {
    let dir = Dir::new();
    let yaml = "\
sources: src/**
max_parallel: many
jobs:
  - name: a
    run: 5
    env: [A]
    needs: b
    priority: high
    retries: 1.5
    labels: {os: [linux]}
  - name: b
    run: [x, 7, true]
    cache: \"no\"
  - 42
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(1, None, "\"sources\" must be a list of strings, found a string"),
            at(2, None, "\"max_parallel\" must be an integer, found a string"),
            at(
                5,
                Some("a"),
                "\"run\" must be a string or a list of strings, found an integer (quote it to mean text: \"5\")"
            ),
            at(6, Some("a"), "\"env\" must be a mapping, found a list"),
            at(7, Some("a"), "\"needs\" must be a list of strings, found a string"),
            at(8, Some("a"), "\"priority\" must be an integer, found a string"),
            at(9, Some("a"), "\"retries\" must be an integer, found a number"),
            at(10, Some("a"), "\"labels.os\" must be a string, number or boolean, found a list"),
            at(
                12,
                Some("b"),
                "\"run entry\" must be a string, found an integer (quote it to mean text: \"7\")"
            ),
            at(
                12,
                Some("b"),
                "\"run entry\" must be a string, found a boolean (quote it to mean text: \"true\")"
            ),
            at(13, Some("b"), "\"cache\" must be true or false, found a string"),
            at(14, None, "a job must be a mapping, found an integer"),
        ]
    );
}

#[test]
fn out_of_range_numbers() {
    let dir = Dir::new();
    let yaml = "\
max_parallel: 0
queue: ' '
jobs:
  - name: a
    run: x
    priority: 3000000000
    retries: -1
    resources: {tokens: {net: -2}}
  - name: b
    run: x
    priority: 18446744073709551616
    retries: -9223372036854775809
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(1, None, "\"max_parallel\" must be an integer from 1 to 4294967295, got 0"),
            at(2, None, "\"queue\" must not be empty"),
            at(
                6,
                Some("a"),
                "\"priority\" must be an integer from -2147483648 to 2147483647, got 3000000000"
            ),
            at(7, Some("a"), "\"retries\" must be an integer from 0 to 4294967295, got -1"),
            at(
                8,
                Some("a"),
                "\"resources.tokens.net\" must be an integer from 0 to 18446744073709551615, got -2"
            ),
            // Beyond 64 bits (which YAML reads as a float), the same message.
            at(
                11,
                Some("b"),
                "\"priority\" must be an integer from -2147483648 to 2147483647, got 18446744073709551616"
            ),
            at(
                12,
                Some("b"),
                "\"retries\" must be an integer from 0 to 4294967295, got -9223372036854775809"
            ),
        ]
    );
}

#[test]
fn missing_name_and_run() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - run: x
  - name: b
  - name: c
    run: []
  - name: d
    run: ['  ']
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(2, None, "job has no \"name\""),
            at(3, Some("b"), "job has no \"run\""),
            at(5, Some("c"), "\"run\" must list at least one command"),
            at(7, Some("d"), "empty command in \"run\""),
        ]
    );
}

/// A command or `env` entry longer than Linux passes in one string is
/// refused when the file is checked, not when the job runs (`E2BIG`).
#[test]
fn commands_and_env_entries_past_the_argument_limit() {
    let dir = Dir::new();
    let long = "x".repeat(130 * 1024);
    let fits = "x".repeat(120 * 1024);
    let yaml = format!(
        "jobs:\n  - name: a\n    run: ['echo {long}']\n  - name: b\n    run: ['echo {fits}']\n    env:\n      BIG: '{long}'\n"
    );
    assert_eq!(
        dir.errors(&yaml),
        [
            at(
                3,
                Some("a"),
                "command is 131 KiB long: at most 126 KiB can be run (Linux's limit for one argument is \
                 128 KiB); put it in a script among the sources and run that"
            ),
            at(7, Some("b"), "env \"BIG\" is too long: at most 126 KiB can be passed to a job"),
        ]
    );
}

/// Entries that fit one by one but not together: refused at the first.
#[test]
fn env_past_the_environment_limit_in_all() {
    let dir = Dir::new();
    let entry = "x".repeat(120 * 1024);
    let env = |n: usize| (0..n).map(|i| format!("      E{i}: '{entry}'\n")).collect::<String>();
    let yaml = format!(
        "jobs:\n  - name: a\n    run: [env]\n    env:\n{}  - name: b\n    run: [env]\n    env:\n{}",
        env(8),
        env(9)
    );
    assert_eq!(
        dir.errors(&yaml),
        [at(
            16,
            Some("b"),
            "env is 1081 KiB in all: at most 1 MiB of environment can be passed to a job (Linux limits a \
             command's arguments and environment together to 2 MiB)"
        )]
    );
}

#[test]
fn invalid_job_names() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: 'a b'\n    run: x\n  - name: '..'\n    run: x\n";
    assert_eq!(
        dir.errors(yaml),
        [
            at(
                2,
                Some("a b"),
                "invalid job name \"a b\": ' ' is not allowed (use letters, digits, '.', '_' and '-')"
            ),
            at(4, Some(".."), "invalid job name \"..\""),
        ]
    );
}

#[test]
fn duplicate_job_names_point_at_the_second() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
  - name: b
    run: x
  - name: a
    run: y
";
    assert_eq!(
        only(dir.errors(yaml)),
        at(6, Some("a"), "duplicate job name \"a\" (first defined at line 2)")
    );
}

#[test]
fn duplicate_keys() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    run: x\n    env: {A: 1, A: 2}\n    run: y\n";
    assert_eq!(
        dir.errors(yaml),
        [
            at(4, Some("a"), "duplicate key \"A\" (first at line 4)"),
            at(5, Some("a"), "duplicate key \"run\" (first at line 3)"),
        ]
    );
}

#[test]
fn unknown_needs_suggest_a_job() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: compile-a
    run: x
  - name: app
    needs: [compil-a, zzz, apps]
    run: x
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(5, Some("app"), "unknown dependency \"compil-a\" (did you mean \"compile-a\"?)"),
            at(5, Some("app"), "unknown dependency \"zzz\""),
            // Not "did you mean app": a job cannot need itself.
            at(5, Some("app"), "unknown dependency \"apps\""),
        ]
    );
}

#[test]
fn needs_listed_twice() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    run: x\n  - name: b\n    needs:\n      - a\n      - a\n    run: x\n";
    assert_eq!(only(dir.errors(yaml)), at(7, Some("b"), "\"a\" is listed twice in needs"));
}

#[test]
fn self_dependency() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    needs:\n      - a\n    run: x\n";
    assert_eq!(only(dir.errors(yaml)), at(4, Some("a"), "job depends on itself"));
}

#[test]
fn dependency_cycles_are_named() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: ok
    run: x
  - name: a
    needs: [b]
    run: x
  - name: b
    needs: [ok, c]
    run: x
  - name: c
    needs: [a]
    run: x
  - name: x
    needs: [y]
    run: x
  - name: y
    needs: [x]
    run: x
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(4, Some("a"), "dependency cycle: a -> b -> c -> a"),
            at(13, Some("x"), "dependency cycle: x -> y -> x"),
        ]
    );
}

#[test]
fn bad_resources_and_durations() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
    resources:
      cpu: lots
      memory: 12Qi
    timeout: 30
  - name: b
    run: x
    resources: {cpu: 0.0001, memory: -1}
    timeout: 1h30x
  - name: c
    run: x
    resources: {cpu: 0x10, memory: 0x10}
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(
                5,
                Some("a"),
                "invalid cpu \"lots\": expected a number of cores (1, 0.5) or millicores (\"500m\")"
            ),
            at(6, Some("a"), "invalid size \"12Qi\": expected a size like 1024, 512Mi, 1Gi, 100M or 2G"),
            at(
                7,
                Some("a"),
                "invalid timeout \"30\": missing unit (expected a duration like 500ms, 30s, 10m, 1h or 1h30m)"
            ),
            at(10, Some("b"), "invalid cpu 0.0001: not a whole number of millicores"),
            at(10, Some("b"), "invalid size \"-1\": must be a non-negative number of bytes"),
            at(
                11,
                Some("b"),
                "invalid timeout \"1h30x\": unknown unit \"x\" (expected a duration like 500ms, 30s, 10m, 1h or 1h30m)"
            ),
            at(
                14,
                Some("c"),
                "invalid cpu 0x10: expected a number of cores (1, 0.5) or millicores (\"500m\")"
            ),
            at(14, Some("c"), "invalid size \"0x10\": expected a size like 1024, 512Mi, 1Gi, 100M or 2G"),
        ]
    );
}

#[test]
fn resource_spellings() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
    resources: {cpu: '500m', memory: 100M}
    timeout: 1h30m
  - name: b
    run: x
    resources: {cpu: 0.25, memory: 1024}
    timeout: 500ms
";
    let build = dir.parse(yaml);
    assert_eq!((build.jobs[0].cpu_millis, build.jobs[0].memory), (500, 100_000_000));
    assert_eq!(build.jobs[0].timeout_ms, Some(5_400_000));
    assert_eq!((build.jobs[1].cpu_millis, build.jobs[1].memory), (250, 1024));
    assert_eq!(build.jobs[1].timeout_ms, Some(500));
}

#[test]
fn exclusive_tokens_must_be_requested() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
    resources: {tokens: {gpu: 1}}
    exclusive: [gpu, network]
";
    assert_eq!(
        only(dir.errors(yaml)),
        at(
            5,
            Some("a"),
            "exclusive token \"network\" is not in resources.tokens (add `tokens: {network: 1}`)"
        )
    );
}

#[test]
fn bad_placeholders() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: lib
    run: x
  - name: app
    needs: [lib]
    run:
      - cc {{dep:lib}}/a.o -o {{out}}/app
      - echo {{source}}
      - cp {{dep:other}} {{out}}
      - echo {{src
    env:
      OUT: '{{dep:}}'
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(
                8,
                Some("app"),
                "unknown placeholder \"{{source}}\" (expected {{src}}, {{out}} or {{dep:NAME}})"
            ),
            at(9, Some("app"), "placeholder \"{{dep:other}}\" names \"other\", which is not in needs"),
            at(10, Some("app"), "unterminated placeholder: \"{{\" without a closing \"}}\""),
            at(12, Some("app"), "env \"OUT\": placeholder \"{{dep:}}\" names no job"),
        ]
    );
}

#[test]
fn sources_glob_matching_nothing() {
    let dir = Dir::with(&[("src/a.c", "a"), ("lib/x.c", "x")]);
    let yaml = "\
sources:
  - src/*.c
  - docs/**
  - lib
jobs:
  - name: a
    run: x
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(3, None, "source pattern \"docs/**\" matches no file"),
            at(4, None, "source pattern \"lib\" matches no file (it is a directory: use \"lib/**\")"),
        ]
    );
}

#[test]
fn inputs_glob_matching_no_source() {
    // `other.c` exists on disk but is not a source of the build.
    let dir = Dir::with(&[("src/a.c", "a"), ("other.c", "o")]);
    let yaml = "\
sources: [src/**]
jobs:
  - name: a
    run: x
    inputs:
      - src/a.c
      - other.c
";
    assert_eq!(
        only(dir.errors(yaml)),
        at(
            7,
            Some("a"),
            "inputs pattern \"other.c\" matches no source (the file exists, but no `sources` pattern takes it in)"
        )
    );
    // A pattern for a file that is nowhere gets no such hint.
    let yaml = "sources: [src/**]\njobs:\n  - name: a\n    run: x\n    inputs: [gone.c]\n";
    assert_eq!(only(dir.errors(yaml)), at(5, Some("a"), "inputs pattern \"gone.c\" matches no source"));
    // Without `sources`, a job sees no file at all.
    let yaml = "jobs:\n  - name: a\n    run: x\n    inputs: [\"src/**\"]\n";
    assert_eq!(
        only(dir.errors(yaml)),
        at(
            4,
            Some("a"),
            "inputs pattern \"src/**\" matches no source (the build file's `sources` names no file: `inputs` picks among those it names)"
        )
    );
}

#[test]
fn paths_escaping_the_build_directory() {
    let outer = Dir::with(&[("secret", "s"), ("project/src/a.c", "a")]);
    let root = outer.path().join("project");
    let yaml = "\
sources:
  - src/**
  - ../secret
  - /etc/passwd
  - src/../../secret
jobs:
  - name: a
    run: x
    inputs: [../secret]
";
    let errors = errors_of(parse_str(Path::new("drover.yaml"), yaml, &root));
    assert_eq!(
        errors,
        [
            at(3, None, "source pattern \"../secret\" contains \"..\" and would escape the build directory"),
            at(
                4,
                None,
                "source pattern \"/etc/passwd\" is an absolute path; it must be relative to the build directory"
            ),
            at(
                5,
                None,
                "source pattern \"src/../../secret\" contains \"..\" and would escape the build directory"
            ),
            at(
                9,
                Some("a"),
                "inputs pattern \"../secret\" contains \"..\" and would escape the build directory"
            ),
        ]
    );
}

#[cfg(unix)]
#[test]
fn symbolic_links_leading_outside_are_refused() {
    let outer = Dir::with(&[("secret", "s"), ("project/src/a.c", "a")]);
    let root = outer.path().join("project");
    std::os::unix::fs::symlink(outer.path().join("secret"), root.join("src/leak")).expect("symlink");
    std::os::unix::fs::symlink(root.join("nowhere"), root.join("src/dangling")).expect("symlink");
    let errors =
        errors_of(parse_str(Path::new("drover.yaml"), "sources: [src/**]\njobs: [{name: a, run: x}]", &root));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(errors[0], at(1, None, "source \"src/dangling\" is a dangling symbolic link"));
    let (line, job, message) = &errors[1];
    assert_eq!((*line, job), (Some(1), &None));
    assert!(message.starts_with("source \"src/leak\" is a symbolic link to "), "{message}");
    assert!(message.ends_with(", outside the build directory"), "{message}");
}

/// A loop of links is a diagnostic of its source, reported with the
/// file's other mistakes (it used to end the load with a bare I/O error);
/// a link to a directory that holds it is passed over, as a pattern walks
/// it (it would lead back without end); a pattern naming a link to a
/// directory outside says that those are not followed.
#[cfg(unix)]
#[test]
fn link_loops_and_links_to_directories_are_explained() {
    let dir = Dir::with(&[("real/a.c", "a"), ("src/b.c", "b")]);
    let root = dir.path();
    let outside = Dir::with(&[("x.c", "x")]);
    std::os::unix::fs::symlink(root.join("src/loop"), root.join("src/loop")).expect("symlink");
    std::os::unix::fs::symlink(root.join("src"), root.join("src/self")).expect("symlink");
    std::os::unix::fs::symlink(outside.path(), root.join("linked")).expect("symlink");
    let yaml = "sources: [src/**, linked]\njobs: [{name: a, run: \"{{nope}}\"}]\n";
    let errors = errors_of(parse_str(Path::new("drover.yaml"), yaml, root));
    let messages: Vec<&str> = errors.iter().map(|e| e.2.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("source \"src/loop\" is a symbolic link that cannot be followed")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("\"linked\" matches no file (it is a symbolic link to a directory outside")),
        "{messages:#?}"
    );
    assert!(!messages.iter().any(|m| m.contains("src/self")), "{messages:#?}");
    assert!(messages.iter().any(|m| m.contains("nope")), "the other mistakes too: {messages:#?}");
}

#[test]
fn yaml_syntax_error_has_the_parser_line() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    run: [x,\n";
    let (line, job, message) = only(dir.errors(yaml));
    assert_eq!((line, job), (Some(3), None));
    assert!(message.starts_with("YAML syntax error: "), "{message}");
}

/// A bracket left open is reported on its own line, not on the later line
/// where the parser gave up.
#[test]
fn yaml_bracket_left_open_is_reported_where_it_was_opened() {
    let dir = Dir::new();
    let yaml = "jobs:\n  - name: a\n    run: [\"echo hi\"\n  - name: b\n    run: [x]\n";
    let (line, job, message) = only(dir.errors(yaml));
    assert_eq!((line, job), (Some(3), None));
    assert!(
        message.starts_with("YAML syntax error: this \"[\" is never closed (the parser stopped at line 4: "),
        "{message}"
    );
    let yaml = "jobs:\n  - name: a\n    run: [x]\n    env: {A: \"1\"\n  - name: b\n    run: [x]\n";
    let (line, _, message) = only(dir.errors(yaml));
    assert_eq!(line, Some(4), "{message}");
    assert!(message.contains("this \"{\" is never closed"), "{message}");
}

#[test]
fn toml_syntax_error_has_the_parser_line() {
    let dir = Dir::new();
    let toml = "[[jobs]]\nname = \"a\"\nrun = = \"x\"\n";
    let (line, job, message) = only(errors_of(dir.parse_as("drover.toml", toml)));
    assert_eq!((line, job), (Some(3), None));
    assert!(message.starts_with("TOML syntax error: "), "{message}");
}

#[test]
fn toml_diagnostics_have_lines_and_jobs() {
    let dir = Dir::new();
    let toml = "\
[[jobs]]
name = \"a\"
run = \"x\"
needs = [\"b\"]

[[jobs]]
name = \"b\"
run = \"y\"
needs = [\"a\"]
[jobs.resources]
memory = \"lots\"
";
    assert_eq!(
        errors_of(dir.parse_as("drover.toml", toml)),
        [
            at(1, Some("a"), "dependency cycle: a -> b -> a"),
            at(11, Some("b"), "invalid size \"lots\": expected a size like 1024, 512Mi, 1Gi, 100M or 2G"),
        ]
    );
}

#[test]
fn empty_and_missing_jobs() {
    let dir = Dir::new();
    assert_eq!(only(dir.errors("name: x\njobs: []\n")), at(2, None, "\"jobs\" is empty"));
    assert_eq!(only(dir.errors("name: x\n")), at(1, None, "missing \"jobs\""));
    assert_eq!(only(dir.errors("")), at(1, None, "build file is empty"));
    assert_eq!(
        only(dir.errors("- a\n")),
        at(
            1,
            None,
            "build file must be a mapping (of `jobs:` and the like), found a list; a file named *.toml is read as \
             TOML, any other as YAML"
        )
    );
}

#[test]
fn oversized_build_files_are_refused() {
    let dir = Dir::new();
    let limit = usize::try_from(MAX_FILE_BYTES).expect("fits");
    // A valid file padded with a comment to one byte over the limit.
    let mut text = String::from("jobs: [{name: a, run: x}]\n#");
    text.push_str(&"x".repeat(limit + 1 - text.len()));
    let refused = (None, None, "build file is larger than 16 MiB; refusing to read it".to_owned());
    assert_eq!(only(errors_of(dir.parse_as("drover.yaml", &text))), refused);
    let path = dir.write("drover.yaml", &text);
    assert_eq!(only(errors_of(load(&path))), refused);
    // At the limit exactly, it is read.
    text.pop();
    assert_eq!(text.len(), limit);
    assert!(dir.parse_as("drover.yaml", &text).is_ok());
}

#[test]
fn too_many_jobs_are_refused() {
    let dir = Dir::new();
    let mut yaml = String::from("name: many\njobs:\n");
    let mut toml = String::from("name = \"many\"\n");
    for i in 0..MAX_JOBS {
        yaml.push_str(&format!("- {{name: j{i}, run: x}}\n"));
        toml.push_str(&format!("[[jobs]]\nname = \"j{i}\"\nrun = \"x\"\n"));
    }
    // At the limit, the build is accepted, in YAML too (whose parser has a
    // node budget of its own that must leave room for this many jobs).
    let build = dir.parse(&yaml);
    assert_eq!(build.jobs.len(), MAX_JOBS);
    // One more is refused. (The check runs on the document tree, the same for
    // both formats; TOML is used here because it parses faster.)
    toml.push_str("[[jobs]]\nname = \"one-more\"\nrun = \"x\"\n");
    let refused = at(2, None, "too many jobs: 100001 (at most 100000 are allowed)");
    assert_eq!(only(errors_of(dir.parse_as("drover.toml", &toml))), refused);
}

#[test]
fn not_utf8() {
    let dir = Dir::new();
    let path = dir.path().join("drover.yaml");
    std::fs::write(&path, b"jobs:\n  - name: \xff\n").expect("write");
    assert_eq!(only(errors_of(load(&path))), at(2, None, "build file is not valid UTF-8"));
    // Lines ended by a lone CR (old Mac files) count as the parser counts them.
    std::fs::write(&path, b"jobs:\r  - name: a\r    run: x\r  - name: b\r    run: \xff\r").expect("write");
    assert_eq!(only(errors_of(load(&path))), at(5, None, "build file is not valid UTF-8"));
    std::fs::write(&path, b"jobs:\r\n  - name: \xff\r\n").expect("write");
    assert_eq!(only(errors_of(load(&path))), at(2, None, "build file is not valid UTF-8"));
}

#[test]
fn every_problem_at_once_in_line_order() {
    let dir = Dir::with(&[("src/a.c", "a")]);
    let yaml = "\
sources: [src/**, nothing/*]
jobs:
  - name: app
    needs: [lib]
    run: ['cc {{dep:lib}} {{dep:compile}} -o {{out}}/app']
    resources: {memory: 5 apples}
  - name: lib
    run: x
    timeout: soon
    colour: red
  - name: app
    run: x
";
    let result = dir.parse_as("drover.yaml", yaml);
    let Err(GraphError::Invalid(diagnostics)) = &result else { panic!("expected diagnostics: {result:?}") };
    let shown: Vec<String> = diagnostics.iter().map(Diagnostic::to_string).collect();
    assert_eq!(
        shown,
        [
            "drover.yaml:1: source pattern \"nothing/*\" matches no file",
            "drover.yaml:5: job \"app\": placeholder \"{{dep:compile}}\" names \"compile\", which is not in needs",
            "drover.yaml:6: job \"app\": invalid size \"5 apples\": expected a size like 1024, 512Mi, 1Gi, 100M or 2G",
            "drover.yaml:9: job \"lib\": invalid timeout \"soon\": expected a duration like 500ms, 30s, 10m, 1h or 1h30m",
            "drover.yaml:10: job \"lib\": unknown key \"colour\" in job (expected one of: name, run, env, needs, \
             inputs, resources, exclusive, labels, priority, timeout, retries, retry_on_failure, cache, gang)",
            "drover.yaml:11: job \"app\": duplicate job name \"app\" (first defined at line 3)",
        ]
    );
    // The error's own display is every diagnostic, one per line.
    let whole = result.expect_err("invalid").to_string();
    assert_eq!(whole, shown.join("\n"));
}

#[test]
fn unreadable_build_file_is_an_io_error() {
    let dir = Dir::new();
    let missing = dir.path().join("missing.yaml");
    match load(&missing) {
        Err(GraphError::Io { path, source }) => {
            assert_eq!(path, missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

/// `/proc/self/mem` is a regular file that fails to read from offset 0 (the
/// address is not mapped), even for root: a real unreadable source.
#[cfg(target_os = "linux")]
#[test]
fn unreadable_source_is_an_io_error_with_its_path() {
    let root = Path::new("/proc/self");
    match parse_str(Path::new("drover.yaml"), "sources: [mem]\njobs: [{name: a, run: x}]", root) {
        Err(GraphError::Io { path, .. }) => assert_eq!(path, root.join("mem")),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn unreadable_source_directory_is_an_io_error() {
    // The root is a file, so it cannot be listed.
    let dir = Dir::with(&[("file", "x")]);
    let root = dir.path().join("file");
    match parse_str(Path::new("drover.yaml"), "sources: ['*']\njobs: [{name: a, run: x}]", &root) {
        Err(GraphError::Io { path, .. }) => assert_eq!(path, root),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn gang_rules() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
    gang: {name: shards, min_available: 3}
  - name: b
    run: x
    needs: [c]
    gang: {name: shards, min_available: 3}
  - name: c
    run: x
    needs: [a]
  - name: d
    run: x
    gang: {name: pair, min_available: 1, on_failure: restart}
  - name: e
    run: x
    gang: {name: pair, min_available: 2, on_failure: sometimes}
  - name: f
    run: x
    gang: {min_available: 1}
  - name: g
    run: x
    retry_on_failure: 2
    gang: {name: solo}
  - name: h
    run: x
    retry_on_failure: 11
";
    assert_eq!(
        dir.errors(yaml),
        [
            at(4, Some("a"), "gang \"shards\": min_available is 3 but it has 2 job(s)"),
            at(
                4,
                Some("a"),
                "gang \"shards\": another job of the gang needs this one (its jobs start together)"
            ),
            at(17, Some("e"), "gang.on_failure must be \"fail\" or \"restart\", not \"sometimes\""),
            at(
                17,
                Some("e"),
                "gang \"pair\": min_available and on_failure differ from job \"d\" (line 14); every member of a \
                 gang says the same"
            ),
            at(20, Some("f"), "\"gang\" needs a \"name\""),
            at(
                24,
                Some("g"),
                "a gang member has no \"retry_on_failure\": its gang's \"on_failure: restart\" runs the whole gang again"
            ),
            at(27, Some("h"), "\"retry_on_failure\" must be an integer from 0 to 10, got 11"),
        ]
    );
}

/// Two gangs that need each other (a job of each needs, maybe through
/// other jobs, a job of the other) never start: each is reported at its
/// first member, naming the other. One way round only is fine.
#[test]
fn gangs_that_need_each_other_are_refused() {
    let dir = Dir::new();
    let yaml = "\
jobs:
  - name: a
    run: x
    gang: {name: x}
  - name: b
    run: x
    gang: {name: y}
  - name: link
    run: x
    needs: [a]
  - name: c
    run: x
    needs: [link]
    gang: {name: y}
  - name: d
    run: x
    needs: [b]
    gang: {name: x}
";
    let why = |gang: &str, other: &str| {
        format!(
            "gang \"{gang}\" can never start: its jobs need, directly or not, jobs of gang \"{other}\", which \
             never starts either: gangs that need each other wait forever (a gang's jobs start together, once \
             all their needs are done)"
        )
    };
    assert_eq!(dir.errors(yaml), [at(4, Some("a"), &why("x", "y")), at(7, Some("b"), &why("y", "x"))]);
    let one_way = yaml.replace("    needs: [b]\n", "");
    dir.parse(&one_way);
}

/// A gang one of whose jobs needs another is reported, also behind the
/// many gangs it holds up (each of which waits too); and a long chain of
/// one-job gangs, each needing the one before, is fine. Both are checked
/// in time linear in the file (the chain took seconds per thousand gangs
/// when each gang searched all its ancestors).
#[test]
fn a_gang_needing_itself_is_found_behind_the_gangs_it_holds_up() {
    let dir = Dir::new();
    let mut yaml = String::from(
        "jobs:\n  - {name: z1, run: x, gang: {name: z}}\n  - {name: z2, run: x, needs: [z1], gang: {name: z}}\n",
    );
    for i in 0..50 {
        let need = if i == 0 { "z2".to_owned() } else { format!("a{}", i - 1) };
        yaml.push_str(&format!("  - {{name: a{i}, run: x, needs: [{need}], gang: {{name: a{i:02}}}}}\n"));
    }
    assert_eq!(
        dir.errors(&yaml),
        [at(2, Some("z1"), "gang \"z\": another job of the gang needs this one (its jobs start together)")]
    );
    let mut chain = String::from("jobs:\n");
    for i in 0..5_000 {
        let needs = if i == 0 { String::new() } else { format!(", needs: [g{}]", i - 1) };
        chain.push_str(&format!("  - {{name: g{i}, run: x{needs}, gang: {{name: g{i}}}}}\n"));
    }
    assert_eq!(dir.parse(&chain).jobs.len(), 5_000);
}

/// A name of thousands of characters is shown cut short in a message (and
/// gets no suggestion: the comparison would cost the square of its length).
#[test]
fn long_names_are_cut_short_in_messages() {
    let dir = Dir::new();
    let long = "c".repeat(5_000);
    let yaml = format!(
        "jobs:\n  - name: {}\n    run: x\n  - name: b\n    run: x\n    needs: [{long}]\n",
        &long[1..]
    );
    let (line, job, message) = only(dir.errors(&yaml));
    assert_eq!((line, job.as_deref()), (Some(6), Some("b")));
    assert!(message.starts_with("unknown dependency \"cccc") && message.ends_with("…\""), "{message}");
    assert!(message.len() < 200, "{} bytes", message.len());
}

#[test]
fn a_gang_defaults_to_all_its_jobs_and_changes_their_ids() {
    let dir = Dir::new();
    let plain = dir.parse("jobs:\n  - name: a\n    run: x\n  - name: b\n    run: y\n");
    let ganged = dir.parse(
        "jobs:\n  - name: a\n    run: x\n    gang: {name: g}\n  - name: b\n    run: y\n    gang: {name: g, on_failure: fail}\n",
    );
    let gang = ganged.jobs[0].gang.clone().expect("in a gang");
    assert_eq!((gang.name.as_str(), gang.min_available, gang.restart), ("g", 2, false));
    assert_eq!(ganged.jobs[1].gang, Some(gang));
    assert_ne!(plain.jobs[0].id, ganged.jobs[0].id, "a gang member is not the same job as a plain one");
    assert_eq!(plain.jobs[0].gang, None);
}
