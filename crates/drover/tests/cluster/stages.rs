//! A worker's stages under scarce tokens, with real processes: a build
//! slot is never held by a fetch, fetches wait in their own queue, a job
//! that takes the cache exclusively waits for its users to drain, and each
//! stage keeps its own log.

use serde_json::Value;

use crate::harness::{Cluster, eventually, job};

/// Locality waits off (the holder of the inputs can never run the jobs
/// that need them here), and a lease long enough that a stopped worker is
/// not declared lost during the test.
const CONFIG: &str =
    "[scheduler]\ncache_timeout = \"1ms\"\ndeps_timeout = \"1ms\"\nlease_timeout = \"60s\"\n";

/// The job's state, stage and whether it waits for its stage's tokens.
fn where_is(status: &Value, name: &str) -> (String, Option<String>, bool) {
    let j = job(status, name);
    (
        j["state"].as_str().unwrap_or_default().to_owned(),
        j["stage"].as_str().map(str::to_owned),
        j["stage_waiting"].as_bool().unwrap_or(false),
    )
}

fn running(stage: &str, waiting: bool) -> (String, Option<String>, bool) {
    ("running".to_owned(), Some(stage.to_owned()), waiting)
}

#[test]
fn fetches_wait_in_their_own_queue_without_idling_the_builder() {
    let mut cluster = Cluster::with_config(None, CONFIG);
    // `holder` builds the input; `b` fetches with one fetcher and builds
    // with one builder, but holds four jobs at once.
    cluster.add_worker("holder", 1, &["--labels", "role=holder", "--no-push"]);
    cluster.add_worker(
        "b",
        4,
        &["--labels", "role=b", "--builders", "1", "--fetchers", "1", "--tokens", "cache=1", "--no-push"],
    );
    let dep = "  - name: dep\n    labels: {role: holder}\n    run: [\"echo input > {{out}}/data\"]\n";
    let first = cluster.project("first", &format!("jobs:\n{dep}"), &[]);
    let (code, _) = crate::harness::wait_json(&cluster, &first, &[]);
    assert_eq!(code, Some(0));
    // From now on nothing can be fetched from the holder: its process is
    // stopped, so a fetch from it hangs (the coordinator still sees it alive).
    cluster.signal_worker("holder", "STOP");
    let users = cluster.project(
        "users",
        &format!(
            "jobs:\n{dep}  - name: use1\n    needs: [dep]\n    labels: {{role: b}}\n    run: [\"cat {{{{dep:dep}}}}/data\"]\n  - name: use2\n    needs: [dep]\n    labels: {{role: b}}\n    run: [\"cat {{{{dep:dep}}}}/data > {{{{out}}}}/copy\"]\n"
        ),
        &[],
    );
    let users = cluster.submit(&users);
    // One run fetches (and hangs), the other waits for the only fetcher.
    eventually("one fetch under way and one queued", || {
        let status = cluster.status(users);
        let mut seen = [where_is(&status, "use1"), where_is(&status, "use2")];
        seen.sort();
        (seen == [running("fetch", false), running("fetch", true)]).then_some(())
    });
    // A job with everything at hand builds meanwhile on the one builder.
    let quick = cluster.project(
        "quick",
        "jobs:\n  - name: quick\n    labels: {role: b}\n    run: [\"echo quick > {{out}}/q\"]\n",
        &[],
    );
    let (code, status) = crate::harness::wait_json(&cluster, &quick, &[]);
    assert_eq!(code, Some(0), "the builder was free: {status}");
    assert_eq!(job(&status, "quick")["state"], "succeeded");
    // A job that needs the whole cache waits for the runs using it to drain.
    let cleanup = cluster.project(
        "cleanup",
        "jobs:\n  - name: cleanup\n    labels: {role: b}\n    resources: {tokens: {cache: 1}}\n    exclusive: [cache]\n    run: [\"true\"]\n",
        &[],
    );
    let cleanup = cluster.submit(&cleanup);
    eventually("the exclusive job to wait for its tokens", || {
        (where_is(&cluster.status(cleanup), "cleanup") == running("build", true)).then_some(())
    });
    let status = cluster.status(users);
    assert_eq!(where_is(&status, "use1").0, "running", "still fetching: {status}");
    assert_eq!(where_is(&status, "use2").0, "running", "still fetching: {status}");

    // The holder answers again: the fetches finish, then the users build,
    // then the exclusive job runs.
    cluster.signal_worker("holder", "CONT");
    let status = cluster.final_status(users);
    assert_eq!(status["state"], "succeeded", "{status}");
    let waited: Vec<bool> =
        ["use1", "use2"].iter().map(|n| job(&status, n)["stages"]["wait"].as_u64().is_some()).collect();
    assert!(waited.contains(&true), "the queued fetch reports its wait: {status}");
    assert_eq!(cluster.final_status(cleanup)["state"], "succeeded");

    // The fetch stage's log says what came from where.
    let fetched: Vec<String> = ["use1", "use2"]
        .iter()
        .map(|name| {
            let out = cluster.run(&["logs", &users.to_string(), name, "--stage", "fetch"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    assert!(
        fetched.iter().any(|log| log.contains("dependency dep from http://")),
        "a fetch log names the holder: {fetched:?}"
    );
    // The build stage's log is what the commands printed.
    let out = cluster.run(&["logs", &users.to_string(), "use1"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "input\n");
    let out = cluster.run(&["logs", &users.to_string(), "use1", "--stage", "fetch", "--stderr"]);
    assert_eq!(out.status.code(), Some(2), "--stderr is for the build stage only");
}
