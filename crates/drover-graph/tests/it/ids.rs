//! Job IDs as cache keys: what changes an ID and what must not.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use drover_graph::Digest;

use crate::common::{Dir, ids, job};

const BASE: &str = "\
name: base
sources: [src/**, include/*.h]
jobs:
  - name: lib
    run: ['cc -c {{src}}/src/lib.c -o {{out}}/lib.o']
    env: {CFLAGS: -O2, LANG: C}
    inputs: [src/lib.c, include/*.h]
  - name: app
    needs: [lib]
    run: ['cc {{dep:lib}}/lib.o -o {{out}}/app']
    resources: {cpu: 2, memory: 1Gi, tokens: {net: 1}}
    exclusive: [net]
    labels: {os: linux}
  - name: test
    needs: [app]
    run: ['{{dep:app}}/app --self-test']
";

fn sources() -> Dir {
    Dir::with(&[
        ("src/lib.c", "int lib;\n"),
        ("src/main.c", "int main;\n"),
        ("include/lib.h", "#pragma once\n"),
    ])
}

/// IDs of `yaml` over a fresh copy of the sources.
fn ids_of(yaml: &str) -> BTreeMap<String, Digest> {
    ids(&sources().parse(yaml))
}

/// IDs of [`BASE`] with `from` replaced by `to` (which must occur).
fn ids_with(from: &str, to: &str) -> BTreeMap<String, Digest> {
    assert!(BASE.contains(from), "{from:?} is not in the base file");
    ids_of(&BASE.replacen(from, to, 1))
}

/// Asserts which jobs' IDs differ from the base's.
fn assert_changed(changed: &BTreeMap<String, Digest>, expected: &[&str]) {
    let base = ids_of(BASE);
    let differing: Vec<&str> = base
        .iter()
        .filter(|(name, id)| changed.get(*name) != Some(id))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(differing, expected);
}

#[test]
fn ids_are_stable_and_distinct() {
    let first = ids_of(BASE);
    assert_eq!(first, ids_of(BASE));
    let distinct: BTreeSet<&Digest> = first.values().collect();
    assert_eq!(distinct.len(), 3);
}

/// A job's timeout, retries and reruns on failure are its own: builds that disagree on them
/// do not share its run (one build's shorter timeout would fail the
/// other's), but its dependents keep their IDs, and the defaults written
/// out change nothing.
#[test]
fn limits_change_the_job_not_its_dependents() {
    let with =
        |limits: &str| ids_with("labels: {os: linux}", &format!("labels: {{os: linux}}\n    {limits}"));
    assert_changed(&with("timeout: 5m"), &["app"]);
    assert_changed(&with("retries: 3"), &["app"]);
    assert_changed(&with("retries: 1"), &[]);
    let (five, ten) = (with("timeout: 5m"), with("timeout: 10m"));
    assert_ne!(five["app"], ten["app"]);
    assert_ne!(with("retries: 0")["app"], with("retries: 3")["app"]);
    assert_eq!(with("timeout: 300s")["app"], five["app"], "the same limit, written another way");
    // Reruns on failure: hashed when asked for, on top of the other limits.
    assert_changed(&with("retry_on_failure: 2"), &["app"]);
    assert_changed(&with("retry_on_failure: 0"), &[]);
    assert_ne!(with("retry_on_failure: 1")["app"], with("retry_on_failure: 2")["app"]);
    let both = with("timeout: 5m\n    retry_on_failure: 2");
    assert_ne!(both["app"], five["app"]);
    assert_ne!(both["app"], with("retry_on_failure: 2")["app"]);
    assert_eq!(both["test"], five["test"], "dependents hash the ID without limits");
}

#[test]
fn name_priority_and_layout_are_not_hashed() {
    assert_changed(&ids_with("name: base", "name: other-build"), &[]);
    assert_changed(
        &ids_with("'{{dep:app}}/app --self-test']", "'{{dep:app}}/app --self-test']\n    priority: 9"),
        &[],
    );
    // Jobs and keys in another order, on other lines.
    let reordered = "\
jobs:
  - name: test
    run: ['{{dep:app}}/app --self-test']
    needs: [app]

  - needs: [lib]
    name: app
    exclusive: [net]
    labels: {os: linux}
    run: ['cc {{dep:lib}}/lib.o -o {{out}}/app']
    resources: {memory: 1Gi, tokens: {net: 1}, cpu: '2000m'}
  - name: lib
    env: {LANG: C, CFLAGS: -O2}
    inputs: [include/*.h, src/lib.c]
    run: ['cc -c {{src}}/src/lib.c -o {{out}}/lib.o']
sources: [include/*.h, src/**]
name: base
";
    assert_eq!(ids_of(reordered), ids_of(BASE));
}

#[test]
fn renaming_a_job_keeps_its_id() {
    let renamed = ids_with("- name: test", "- name: check");
    assert_eq!(renamed["check"], ids_of(BASE)["test"]);
}

#[test]
fn renaming_a_dependency_changes_its_dependents_only() {
    let renamed = ids_of(
        &BASE
            .replace("lib]", "library]")
            .replace("- name: lib", "- name: library")
            .replace("{{dep:lib}}", "{{dep:library}}"),
    );
    let base = ids_of(BASE);
    assert_eq!(renamed["library"], base["lib"]);
    assert_ne!(renamed["app"], base["app"]);
    assert_ne!(renamed["test"], base["test"]);
}

#[test]
fn the_same_job_in_another_build_file_has_the_same_id() {
    let one = sources().parse(BASE);
    let other_dir = sources();
    other_dir.write("unrelated.txt", "not a source");
    let other = other_dir.parse_as("ci/other.yml", "name: elsewhere\nsources: [src/*.c, include/**]\njobs:\n  - name: compile\n    run: ['cc -c {{src}}/src/lib.c -o {{out}}/lib.o']\n    env: {LANG: C, CFLAGS: -O2}\n    inputs: [include/lib.h, src/lib.c]\n").expect("valid");
    assert_eq!(job(&other, "compile").id, job(&one, "lib").id);
}

#[test]
fn commands_change_the_id_and_propagate_to_dependents() {
    assert_changed(&ids_with("-o {{out}}/lib.o", "-o {{out}}/lib2.o"), &["app", "lib", "test"]);
    assert_changed(&ids_with("--self-test", "--self-test -v"), &["test"]);
    // Splitting one command into two is a different job.
    assert_changed(
        &ids_with("['{{dep:app}}/app --self-test']", "['{{dep:app}}/app', '--self-test']"),
        &["test"],
    );
}

#[test]
fn env_changes_the_id() {
    assert_changed(&ids_with("CFLAGS: -O2", "CFLAGS: -O3"), &["app", "lib", "test"]);
    assert_changed(&ids_with("LANG: C}", "LANG: C, TZ: UTC}"), &["app", "lib", "test"]);
}

#[test]
fn resource_class_changes_the_id() {
    for (from, to) in [
        ("cpu: 2,", "cpu: 3,"),
        ("memory: 1Gi", "memory: 2Gi"),
        ("tokens: {net: 1}", "tokens: {net: 2}"),
        ("labels: {os: linux}", "labels: {os: macos}"),
    ] {
        assert_changed(&ids_with(from, to), &["app", "test"]);
    }
    let without_exclusive = BASE.replace("    exclusive: [net]\n", "");
    let base = ids_of(BASE);
    assert_ne!(ids_of(&without_exclusive)["app"], base["app"]);
}

#[test]
fn source_contents_change_the_ids_of_jobs_that_see_them() {
    let base = ids_of(BASE);

    // src/lib.c is in lib's inputs; everyone else sees all sources.
    let dir = sources();
    dir.write("src/lib.c", "int lib = 1;\n");
    let changed = ids(&dir.parse(BASE));
    assert!(base.iter().all(|(name, id)| changed[name] != *id), "{base:?} vs {changed:?}");

    // src/main.c is not in lib's inputs: lib keeps its ID.
    let dir = sources();
    dir.write("src/main.c", "int main(void) { return 0; }\n");
    let changed = ids(&dir.parse(BASE));
    assert_eq!(changed["lib"], base["lib"]);
    assert_ne!(changed["app"], base["app"]);

    // A new source file outside lib's inputs: lib keeps its ID again.
    let dir = sources();
    dir.write("src/extra/new.c", "int extra;\n");
    let changed = ids(&dir.parse(BASE));
    assert_eq!(changed["lib"], base["lib"]);
    assert_ne!(changed["app"], base["app"]);

    // A new header matched by lib's `include/*.h` input: lib changes.
    let dir = sources();
    dir.write("include/new.h", "#define NEW\n");
    let changed = ids(&dir.parse(BASE));
    assert_ne!(changed["lib"], base["lib"]);
}

#[cfg(unix)]
#[test]
fn the_executable_bit_changes_the_id() {
    use std::os::unix::fs::PermissionsExt;

    let dir = sources();
    let path = dir.path().join("src/lib.c");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let build = dir.parse(BASE);
    assert!(build.sources.iter().find(|s| s.path == "src/lib.c").expect("source").executable);
    assert_ne!(ids(&build)["lib"], ids_of(BASE)["lib"]);
}

/// A random build: up to six jobs, each with a command from a small alphabet
/// and dependencies on earlier jobs.
fn graph() -> impl Strategy<Value = Vec<(String, Vec<usize>)>> {
    prop::collection::vec(
        ("[a-c][a-c ]{0,4}", prop::collection::vec(any::<prop::sample::Index>(), 0..3)),
        1..7,
    )
    .prop_map(|jobs| {
        jobs.into_iter()
            .enumerate()
            .map(|(i, (command, picks))| {
                let mut needs: Vec<usize> =
                    if i == 0 { Vec::new() } else { picks.iter().map(|p| p.index(i)).collect() };
                needs.sort_unstable();
                needs.dedup();
                (command, needs)
            })
            .collect()
    })
}

/// The build file (JSON, which is YAML) for `jobs`, with job `i` named
/// `names[i]`, listed in the order `order`.
fn build_file(jobs: &[(String, Vec<usize>)], names: &[String], order: &[usize]) -> String {
    let jobs: Vec<serde_json::Value> = order
        .iter()
        .map(|&i| {
            let (command, needs) = &jobs[i];
            let needs: Vec<&str> = needs.iter().map(|&n| names[n].as_str()).collect();
            serde_json::json!({"name": names[i], "run": [command], "needs": needs})
        })
        .collect();
    serde_json::json!({ "jobs": jobs }).to_string()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Parsing twice, or listing the jobs in reverse, gives the same IDs.
    #[test]
    fn ids_are_deterministic(jobs in graph()) {
        let dir = Dir::new();
        let names: Vec<String> = (0..jobs.len()).map(|i| format!("j{i}")).collect();
        let forward: Vec<usize> = (0..jobs.len()).collect();
        let backward: Vec<usize> = forward.iter().rev().copied().collect();
        let first = ids(&dir.parse(&build_file(&jobs, &names, &forward)));
        let again = ids(&dir.parse(&build_file(&jobs, &names, &forward)));
        let reversed = ids(&dir.parse(&build_file(&jobs, &names, &backward)));
        prop_assert_eq!(&first, &again);
        prop_assert_eq!(&first, &reversed);
    }

    /// Jobs with distinct commands have distinct IDs, whatever the graph.
    #[test]
    fn distinct_commands_give_distinct_ids(jobs in graph()) {
        let dir = Dir::new();
        // Make every command unique.
        let jobs: Vec<(String, Vec<usize>)> =
            jobs.into_iter().enumerate().map(|(i, (command, needs))| (format!("{command}#{i}"), needs)).collect();
        let names: Vec<String> = (0..jobs.len()).map(|i| format!("j{i}")).collect();
        let order: Vec<usize> = (0..jobs.len()).collect();
        let build = dir.parse(&build_file(&jobs, &names, &order));
        let distinct: BTreeSet<Digest> = build.jobs.iter().map(|job| job.id).collect();
        prop_assert_eq!(distinct.len(), jobs.len());
    }

    /// Renaming every job (and every reference to it) keeps the IDs of the
    /// jobs without dependencies. (The others change: a dependency's name is
    /// part of the key, as commands refer to it by `{{dep:NAME}}`.)
    #[test]
    fn renaming_keeps_ids_of_jobs_without_dependencies(jobs in graph()) {
        let dir = Dir::new();
        let names: Vec<String> = (0..jobs.len()).map(|i| format!("j{i}")).collect();
        let renamed: Vec<String> = (0..jobs.len()).map(|i| format!("renamed-{i}")).collect();
        let order: Vec<usize> = (0..jobs.len()).collect();
        let before = ids(&dir.parse(&build_file(&jobs, &names, &order)));
        let after = ids(&dir.parse(&build_file(&jobs, &renamed, &order)));
        for (i, (_, needs)) in jobs.iter().enumerate() {
            prop_assert_eq!(before[&names[i]] == after[&renamed[i]], needs.is_empty(), "job {}", i);
        }
    }

    /// Changing one job's command changes its ID and those of every job
    /// that depends on it, directly or not, and no other.
    #[test]
    fn a_command_change_reaches_exactly_the_dependents(jobs in graph(), pick in any::<prop::sample::Index>()) {
        let dir = Dir::new();
        let jobs: Vec<(String, Vec<usize>)> =
            jobs.into_iter().enumerate().map(|(i, (command, needs))| (format!("{command}#{i}"), needs)).collect();
        let names: Vec<String> = (0..jobs.len()).map(|i| format!("j{i}")).collect();
        let order: Vec<usize> = (0..jobs.len()).collect();
        let changed_job = pick.index(jobs.len());
        let mut changed = jobs.clone();
        changed[changed_job].0.push_str(" changed");
        // Jobs are listed after their dependencies, so one pass finds every
        // job reaching the changed one.
        let mut affected = vec![false; jobs.len()];
        for (i, (_, needs)) in jobs.iter().enumerate() {
            affected[i] = i == changed_job || needs.iter().any(|&n| affected[n]);
        }
        let before = ids(&dir.parse(&build_file(&jobs, &names, &order)));
        let after = ids(&dir.parse(&build_file(&changed, &names, &order)));
        for (i, name) in names.iter().enumerate() {
            prop_assert_eq!(before[name] != after[name], affected[i], "job {}", name);
        }
    }
}

/// The members of a gang are distinct jobs even with the same command (the
/// ranks of one program); jobs outside a gang with the same command are one
/// job, shared.
#[test]
fn gang_members_with_the_same_command_are_distinct_jobs() {
    let ranks = "\
jobs:
  - name: rank0
    run: ['mpirun-stub']
    gang: {name: mpi}
  - name: rank1
    run: ['mpirun-stub']
    gang: {name: mpi}
  - name: solo0
    run: ['mpirun-stub']
  - name: solo1
    run: ['mpirun-stub']
";
    let ids = ids_of(ranks);
    assert_ne!(ids["rank0"], ids["rank1"]);
    assert_eq!(ids["solo0"], ids["solo1"]);
    assert_ne!(ids["rank0"], ids["solo0"]);
    assert_eq!(ids, ids_of(ranks), "still the same in another build");
}

/// The early cutoff's half of a key (`own`) changes with the job's own
/// content, not with its dependencies': a change to `lib` changes the IDs of
/// `lib`, `app` and `test`, and the `own` of `lib` alone.
#[test]
fn own_changes_with_the_job_not_its_dependencies() {
    let owns = |yaml: &str| -> BTreeMap<String, Option<Digest>> {
        sources().parse(yaml).jobs.into_iter().map(|j| (j.name, j.own)).collect()
    };
    let base = owns(BASE);
    assert!(base.values().all(Option::is_some), "{base:?}");
    let changed = owns(&BASE.replacen("-o {{out}}/lib.o", "-o {{out}}/lib2.o", 1));
    let differing: Vec<&str> =
        base.iter().filter(|(name, own)| changed.get(*name) != Some(own)).map(|(n, _)| n.as_str()).collect();
    assert_eq!(differing, ["lib"]);
    let ids = ids_of(BASE);
    assert!(base.iter().all(|(name, own)| *own != Some(ids[name])), "own is not the ID");
}

/// `cache: false` gives the job an ID no other load of the file gives it,
/// and so every job downstream of it too; jobs beside it keep theirs. The
/// job has no early-cutoff key, so it cannot be taken from an earlier run;
/// its dependents keep theirs, so one whose inputs came out the same is.
#[test]
fn a_job_that_is_never_cached_has_a_new_id_in_every_load() {
    let yaml = BASE.replacen(
        "    inputs: [src/lib.c, include/*.h]\n",
        "    inputs: [src/lib.c, include/*.h]\n    cache: false\n",
        1,
    );
    let dir = sources();
    let (first, second) = (dir.parse(&yaml), dir.parse(&yaml));
    let (a, b) = (ids(&first), ids(&second));
    for name in ["lib", "app", "test"] {
        assert_ne!(a[name], b[name], "{name}: lib and what needs it are new in each load");
    }
    assert_changed(&a, &["app", "lib", "test"]);
    let own = |build: &drover_graph::Build, name: &str| {
        build.jobs.iter().find(|j| j.name == name).expect("job").own
    };
    assert_eq!(own(&first, "lib"), None, "no early cutoff for the job itself");
    assert_eq!(own(&first, "app"), own(&second, "app"), "its dependents keep their cutoff keys");
    assert!(own(&first, "app").is_some());
    // `cache: true` is the default.
    assert_eq!(
        ids_with(
            "    inputs: [src/lib.c, include/*.h]\n",
            "    inputs: [src/lib.c, include/*.h]\n    cache: true\n"
        ),
        ids_of(BASE)
    );
}

/// `drover_graph::ids`, given a build as a submission states it (what a
/// coordinator checks), refuses jobs stated out of order and inputs that
/// are not sources of the build.
#[test]
fn stated_ids_refuse_needs_out_of_order_and_unknown_inputs() {
    let build = sources().parse(BASE);
    let mut stated: Vec<drover_graph::StatedJob<'_>> = build.jobs.iter().map(Into::into).collect();
    let made = drover_graph::ids(&build.sources, &stated).expect("ids");
    assert_eq!(made, build.jobs.iter().map(|j| (j.id, j.own)).collect::<Vec<(Digest, Option<Digest>)>>());
    stated.swap(0, 1);
    let error = drover_graph::ids(&build.sources, &stated).expect_err("out of order");
    assert!(matches!(error, drover_graph::StatedError::NeedNotEarlier { .. }), "{error}");
    stated.swap(0, 1);
    let gone = ["gone.c".to_owned()];
    stated[0].inputs = Some(&gone);
    let error = drover_graph::ids(&build.sources, &stated).expect_err("no such source");
    assert!(matches!(error, drover_graph::StatedError::UnknownInput { .. }), "{error}");
    let twice = ["src/lib.c".to_owned(), "src/lib.c".to_owned()];
    stated[0].inputs = Some(&twice);
    let error = drover_graph::ids(&build.sources, &stated).expect_err("an input twice");
    assert!(matches!(error, drover_graph::StatedError::DuplicateInput { .. }), "{error}");
}
