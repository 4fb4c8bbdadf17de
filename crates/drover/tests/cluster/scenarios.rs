//! The scenarios a user meets: builds that succeed, share artifacts, hit the
//! cache, fail, are cancelled, and survive a worker or the coordinator being
//! killed.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::harness::{
    Cluster, CutOnce, drover, eventually, free_port, http_with, job, process_gone, wait_json, wait_output,
};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn one_command_build_succeeds_and_exports_its_output() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let file =
        cluster.project("one", "jobs:\n  - name: hello\n    run: \"echo hello > {{out}}/greeting\"\n", &[]);
    let out_dir = cluster.dir.path().join("exported");
    let (code, status) = wait_json(&cluster, &file, &["--out", out_dir.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(status["state"], "succeeded");
    assert_eq!(job(&status, "hello")["state"], "succeeded");
    assert_eq!(job(&status, "hello")["worker"], "w1");
    assert_eq!(std::fs::read_to_string(out_dir.join("hello/greeting")).expect("exported"), "hello\n");
}

/// `drover status` without a build lists the builds kept, each with how
/// many of its jobs are over (read from the coordinator's summaries, not
/// from every job of every build).
#[test]
fn status_lists_the_builds_with_their_counts() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let empty = cluster.run(&["status"]);
    assert!(empty.status.success(), "{}", stderr(&empty));
    assert_eq!((empty.stdout.as_slice(), stderr(&empty).trim()), (&b""[..], "no builds yet"));
    let file =
        cluster.project("two", "jobs:\n  - {name: a, run: \"true\"}\n  - {name: b, run: \"true\"}\n", &[]);
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    let id = status["id"].as_u64().expect("id");
    let out = cluster.run(&["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["BUILD", "STATE", "DONE/JOBS", "TENANT", "NAME"], "{table}");
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .expect("the build's row")
        .split_whitespace()
        .collect();
    assert_eq!(row, [id.to_string().as_str(), "succeeded", "2/2", "default", "two"], "{table}");
    assert_eq!(status["tenant"], "default", "{status}");
    // Filtered by tenant and state.
    let none = cluster.run(&["status", "--tenant", "nobody"]);
    assert!(
        none.stdout.is_empty() && stderr(&none).contains("no build matches (1 in all)"),
        "{}",
        stderr(&none)
    );
    let active = cluster.run(&["status", "--state", "active"]);
    assert!(active.stdout.is_empty(), "{}", String::from_utf8_lossy(&active.stdout));
    let done = cluster.run(&["status", "--state", "succeeded", "--tenant", "default", "--json"]);
    let done: Value = serde_json::from_slice(&done.stdout).expect("JSON");
    assert_eq!(done.as_array().map(Vec::len), Some(1), "{done}");
    // Built again, all from the cache: no log, and `logs` says why.
    let (code, again) = wait_json(&cluster, &file, &[]);
    assert_eq!((code, &job(&again, "a")["state"]), (Some(0), &Value::from("cached")), "{again}");
    let log = cluster.run(&["logs", &again["id"].to_string(), "a"]);
    assert_eq!(log.status.code(), Some(2), "{}", stderr(&log));
    assert!(stderr(&log).contains("has not run: its result came from the cache"), "{}", stderr(&log));
    // It names the run that made the result (a's, or b's: the two are one
    // job by content), whose log `logs` then shows.
    let said = stderr(&log);
    let (ran, name) = said
        .split_once("`drover logs ")
        .and_then(|(_, rest)| rest.split_once('`'))
        .and_then(|(args, _)| args.split_once(' '))
        .unwrap_or_else(|| panic!("no command in {said}"));
    assert_eq!((ran, ["a", "b"].contains(&name)), (id.to_string().as_str(), true), "{said}");
    let there = cluster.run(&["logs", ran, name]);
    assert!(there.status.success(), "{}", stderr(&there));
}

#[test]
fn sources_in_subdirectories_are_visible_and_read_only() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project(
        "nested",
        "sources: [\"src/**\"]\njobs:\n  - name: cat\n    run:\n      - \"cat src/a/b/deep.txt src/top.txt > {{out}}/all\"\n      - \"test -f {{src}}/src/a/b/deep.txt\"\n",
        &[("src/a/b/deep.txt", "deep\n"), ("src/top.txt", "top\n"), ("unlisted.txt", "no\n")],
    );
    let out_dir = cluster.dir.path().join("exported");
    let (code, status) = wait_json(&cluster, &file, &["--out", out_dir.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(std::fs::read_to_string(out_dir.join("cat/all")).expect("exported"), "deep\ntop\n");
}

#[test]
fn an_artifact_moves_between_workers() {
    let mut cluster = Cluster::new();
    cluster.add_worker("wa", 1, &["--labels", "role=a"]);
    cluster.add_worker("wb", 1, &["--labels", "role=b"]);
    let file = cluster.project(
        "pass",
        "jobs:\n  - name: make\n    labels: {role: a}\n    run: [\"mkdir {{out}}/d && echo payload > {{out}}/d/file && chmod +x {{out}}/d/file\"]\n  - name: use\n    needs: [make]\n    labels: {role: b}\n    run: [\"cat {{dep:make}}/d/file > {{out}}/copy\", \"test -x {{dep:make}}/d/file\"]\n",
        &[],
    );
    let out_dir = cluster.dir.path().join("exported");
    let (code, status) = wait_json(&cluster, &file, &["--out", out_dir.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(job(&status, "make")["worker"], "wa");
    assert_eq!(job(&status, "use")["worker"], "wb");
    assert_eq!(std::fs::read_to_string(out_dir.join("use/copy")).expect("exported"), "payload\n");
}

#[test]
fn an_identical_second_build_runs_nothing() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let counter = cluster.scratch("executions");
    let build = format!(
        "jobs:\n  - name: a\n    run: [\"echo a >> {counter}; echo a > {{{{out}}}}/a\"]\n  - name: b\n    needs: [a]\n    run: [\"echo b >> {counter}; cat {{{{dep:a}}}}/a > {{{{out}}}}/b\"]\n"
    );
    let file = cluster.project("twice", &build, &[]);
    let (code, first) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{first}");
    let (code, second) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{second}");
    assert_eq!(job(&second, "a")["state"], "cached");
    assert_eq!(job(&second, "b")["state"], "cached");
    assert_eq!(std::fs::read_to_string(&counter).expect("counter"), "a\nb\n", "a job ran again");
}

/// A job with `cache: false` (a publish step) runs in every build; the
/// rest of the build is cached, and its dependent too when it wrote what
/// it wrote before (early cutoff on its output).
#[test]
fn a_job_that_is_never_cached_runs_in_every_build() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let counter = cluster.scratch("executions");
    let build = format!(
        "jobs:\n  - name: a\n    run: [\"echo a >> {counter}; echo a > {{{{out}}}}/a\"]\n  - name: publish\n    needs: [a]\n    cache: false\n    run: [\"echo publish >> {counter}; cp {{{{dep:a}}}}/a {{{{out}}}}/receipt\"]\n  - name: after\n    needs: [publish]\n    run: [\"echo after >> {counter}; cat {{{{dep:publish}}}}/receipt > {{{{out}}}}/b\"]\n"
    );
    let file = cluster.project("publish", &build, &[]);
    let (code, first) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{first}");
    let (code, second) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{second}");
    assert_eq!(job(&second, "a")["state"], "cached");
    assert_eq!(job(&second, "publish")["state"], "succeeded");
    assert_eq!(job(&second, "after")["state"], "cached", "{second}");
    assert_eq!(std::fs::read_to_string(&counter).expect("counter"), "a\npublish\nafter\npublish\n");
}

#[test]
fn a_failing_job_skips_its_dependents_and_fails_the_build() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let file = cluster.project(
        "fail",
        "jobs:\n  - name: broken\n    run: [\"echo about to fail >&2; exit 3\"]\n  - name: after\n    needs: [broken]\n    run: [\"true\"]\n",
        &[],
    );
    let (out, status) = wait_output(&cluster, &file, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(status["state"], "failed");
    assert_eq!(job(&status, "broken")["state"], "failed");
    assert_eq!(job(&status, "broken")["exit_code"], 3);
    assert_eq!(job(&status, "after")["state"], "skipped");
    assert!(stderr(&out).contains("about to fail"), "the stderr tail is shown: {}", stderr(&out));
    let log = cluster.run(&["logs", &status["id"].to_string(), "broken", "--stderr"]);
    assert!(log.status.success(), "{}", stderr(&log));
    assert_eq!(String::from_utf8_lossy(&log.stdout), "about to fail\n");
    // A job that never ran, and one the build does not have, are told apart.
    let log = cluster.run(&["logs", &status["id"].to_string(), "after"]);
    assert_eq!(log.status.code(), Some(2));
    assert!(stderr(&log).contains("job after of build"), "{}", stderr(&log));
    assert!(stderr(&log).contains("has not run"), "{}", stderr(&log));
    // Followed, the same job says how it ended, with the job's result.
    let log = cluster.run(&["logs", &status["id"].to_string(), "after", "--follow"]);
    assert_eq!(log.status.code(), Some(1), "{}", stderr(&log));
    assert!(stderr(&log).contains("it ended skipped without running"), "{}", stderr(&log));
    let log = cluster.run(&["logs", &status["id"].to_string(), "aftr"]);
    assert_eq!(log.status.code(), Some(2));
    assert!(stderr(&log).contains("has no job \"aftr\""), "{}", stderr(&log));
    assert!(
        !stderr(&log).contains("/v1/"),
        "the coordinator's words, not the request's URL: {}",
        stderr(&log)
    );
}

/// A job that fails reading a dependency that wrote nothing (it forgot
/// `{{out}}`) is told so: the failure notes the empty output by name.
#[test]
fn a_failure_reading_an_empty_dependency_names_it() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project(
        "empty-need",
        "jobs:\n  - name: forgot\n    run: [\"echo data\"]\n  - name: reader\n    needs: [forgot]\n    run: [\"cat {{dep:forgot}}/x\"]\n",
        &[],
    );
    let (out, status) = wait_output(&cluster, &file, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(job(&status, "forgot")["state"], "succeeded");
    let note = "note: the output of forgot, which it reads, is empty: forgot wrote nothing to {{out}}";
    assert!(stderr(&out).contains(note), "{}", stderr(&out));
}

/// A flaky job (`retry_on_failure`) that fails its first run passes on
/// its second: the build succeeds, the progress says why the job ran
/// again, its log is the passing run's, and the failed run's log is read
/// by its attempt.
#[test]
fn a_flaky_job_runs_again_after_failing() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let marker = cluster.scratch("ran-once");
    let file = cluster.project(
        "flaky",
        &format!(
            "jobs:\n  - name: flaky\n    retry_on_failure: 2\n    run: [\"if [ -e {marker} ]; then echo passed; else touch {marker}; echo flaked >&2; exit 5; fi\"]\n  - name: after\n    needs: [flaky]\n    run: [\"true\"]\n"
        ),
        &[],
    );
    let (out, status) = wait_output(&cluster, &file, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(status["state"], "succeeded");
    assert_eq!(job(&status, "flaky")["state"], "succeeded");
    assert_eq!(job(&status, "flaky")["attempts"], 2);
    assert_eq!(job(&status, "after")["state"], "succeeded");
    assert!(
        stderr(&out).contains(
            "flaky: run 1 failed (exit code 5: flaked); running it again (1 of 2 reruns on failure)"
        ),
        "{}",
        stderr(&out)
    );
    let id = status["id"].to_string();
    let log = cluster.run(&["logs", &id, "flaky"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "passed\n");
    // The failed run's log is still there, by its attempt.
    let log = cluster.run(&["logs", &id, "flaky", "--attempt", "1", "--stderr"]);
    assert!(log.status.success(), "{}", stderr(&log));
    assert_eq!(String::from_utf8_lossy(&log.stdout), "flaked\n");
    let log = cluster.run(&["logs", &id, "flaky", "--attempt", "2"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "passed\n");
    let log = cluster.run(&["logs", &id, "flaky", "--attempt", "3"]);
    assert_eq!(log.status.code(), Some(2));
    assert!(stderr(&log).contains("has no attempt 3; the attempts with logs are 1, 2"), "{}", stderr(&log));
}

#[test]
fn cancelling_a_build_leaves_no_process_behind() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let pids = cluster.scratch("pids");
    let build = format!(
        "jobs:\n  - name: long\n    run: [\"sleep 1000 & echo $! >> {pids}; sleep 1000 & echo $! >> {pids}; echo $$ >> {pids}; wait\"]\n"
    );
    let file = cluster.project("cancel", &build, &[]);
    let mut waiter = cluster
        .client(&["submit", file.to_str().expect("utf-8"), "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("submit");
    let pids: Vec<u32> = eventually("the job to start its processes", || {
        let text = std::fs::read_to_string(&pids).ok()?;
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (pids.len() == 3).then_some(pids)
    });
    let out = cluster.run(&["status", "--json"]);
    let builds: Value = serde_json::from_slice(&out.stdout).expect("builds");
    let id = builds[0]["id"].as_u64().expect("id");
    let out = cluster.run(&["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let code = waiter.wait().expect("submit --wait ends");
    assert_eq!(code.code(), Some(1));
    eventually("every process of the job to be gone", || pids.iter().all(|&p| process_gone(p)).then_some(()));
    let status = cluster.status(id);
    assert_eq!(status["state"], "cancelled");
    // Nothing is left to cancel, and it says so.
    let out = cluster.run(&["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("build {id} had already ended (cancelled)")), "{}", stderr(&out));
}

/// `submit --wait` interrupted (Ctrl-C, or a CI runner stopping the step)
/// cancels the build it submitted.
#[test]
fn interrupting_submit_wait_cancels_its_build() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let started = cluster.scratch("started");
    let build = format!("jobs:\n  - name: long\n    run: [\"touch {started}; sleep 1000\"]\n");
    let file = cluster.project("interrupt", &build, &[]);
    let waiter = cluster
        .client(&["submit", file.to_str().expect("utf-8"), "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit");
    eventually("the job to start", || std::path::Path::new(&started).exists().then_some(()));
    let status = Command::new("kill").args(["-INT", &waiter.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let out = waiter.wait_with_output().expect("submit --wait ends");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the build ID");
    assert!(stderr(&out).contains(&format!("interrupted; cancelling build {id}")), "{}", stderr(&out));
    assert_eq!(cluster.final_status(id)["state"], "cancelled");
}

/// Interrupted while its coordinator is down (restarting), `submit --wait`
/// tries the cancel again until the coordinator is back, so the build does
/// not run on unseen; it says what it is doing meanwhile.
#[test]
fn interrupting_submit_wait_while_the_coordinator_is_down_cancels_once_it_is_back() {
    use std::io::{BufRead, BufReader};
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let started = cluster.scratch("started");
    let build = format!("jobs:\n  - name: long\n    run: [\"touch {started}; sleep 1000\"]\n");
    let file = cluster.project("interrupt-down", &build, &[]);
    let mut waiter = cluster
        .client(&["submit", file.to_str().expect("utf-8"), "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit");
    eventually("the job to start", || std::path::Path::new(&started).exists().then_some(()));
    cluster.kill_coordinator();
    let status = Command::new("kill").args(["-INT", &waiter.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let mut err = BufReader::new(waiter.stderr.take().expect("stderr"));
    let mut said = String::new();
    while !said.contains("trying again") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).expect("read") > 0, "submit ended early: {said}");
        said.push_str(&line);
    }
    cluster.start_coordinator();
    let out = waiter.wait_with_output().expect("submit --wait ends");
    assert_eq!(out.status.code(), Some(1), "{said}");
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the build ID");
    assert_eq!(cluster.final_status(id)["state"], "cancelled");
}

/// Interrupted before the coordinator has answered the submission,
/// `submit --wait` does not just vanish (the build might be accepted
/// anyway, and then run with nobody to cancel it): it says it will cancel
/// the build once submitted; a second interrupt quits at once. The
/// "coordinator" here takes the first request and never answers.
#[test]
fn interrupting_submit_wait_before_the_build_is_submitted() {
    use std::io::{BufRead, Read};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("drover.yaml"), "jobs:\n  - {name: a, run: \"true\"}\n").expect("write");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let mut waiter = drover()
        .args(["submit", "drover.yaml", "--wait", "--coordinator", &url])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit");
    let (mut request, _) = silent.accept().expect("the first request");
    let mut first = [0u8; 1];
    request.read_exact(&mut first).expect("its first byte");
    let interrupt = |pid: u32| {
        assert!(Command::new("kill").args(["-INT", &pid.to_string()]).status().expect("kill").success());
    };
    interrupt(waiter.id());
    let mut err = std::io::BufReader::new(waiter.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("a line");
    assert!(
        line.contains("interrupted while submitting; the build is cancelled once it is submitted"),
        "{line}"
    );
    interrupt(waiter.id());
    let status = waiter.wait().expect("submit ends");
    assert_eq!(status.code(), Some(1));
    drop(request);
}

/// Submits a job `slow` whose first attempt writes its shell's pid and
/// hangs (later attempts finish at once); returns the build and that pid
/// once the first attempt runs.
fn submit_stuck_first_attempt(cluster: &Cluster, project: &str) -> (u64, u32) {
    let mark = cluster.scratch("first-attempt");
    let pid_file = cluster.scratch("pid");
    let build = format!(
        "jobs:\n  - name: slow\n    run: [\"if [ ! -e {mark} ]; then touch {mark}; echo $$ > {pid_file}; sleep 1000; fi; echo done > {{{{out}}}}/r\"]\n"
    );
    let id = cluster.submit(&cluster.project(project, &build, &[]));
    let pid = eventually("the first attempt to start", || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    (id, pid)
}

/// Worker `name`'s entry in `drover workers --json`.
fn worker_entry(cluster: &Cluster, name: &str) -> Option<Value> {
    cluster.workers_json().as_array()?.iter().find(|w| w["name"] == name).cloned()
}

/// Waits until the coordinator lists worker `name` as draining.
fn wait_draining(cluster: &Cluster, name: &str) {
    eventually(&format!("the coordinator to see {name} draining"), || {
        (worker_entry(cluster, name)?["draining"] == true).then_some(())
    });
}

/// A worker whose disk no longer takes a write (here its cache directory
/// was removed under it) does not fail the jobs it is given: the run goes
/// back to the queue, the worker drains (it takes nothing new), and the
/// job runs on a healthy worker.
#[test]
fn a_worker_that_cannot_write_its_disk_hands_its_job_back_and_drains() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w2", 1, &[]);
    let cache = cluster.dir.path().join("w2");
    let _ = Command::new("chmod").arg("-R").arg("u+w").arg(&cache).status();
    std::fs::remove_dir_all(&cache).expect("remove w2's cache");
    let file = cluster.project("disk", "jobs:\n  - name: a\n    run: [\"echo made > {{out}}/a\"]\n", &[]);
    let build = cluster.submit(&file);
    wait_draining(&cluster, "w2");
    // Back in the queue (its report may come a moment after the drain),
    // never failed.
    eventually("the job to go back to the queue", || {
        let status = cluster.status(build);
        assert_ne!(job(&status, "a")["state"], "failed", "{status}");
        (job(&status, "a")["state"] == "queued").then_some(())
    });
    cluster.add_worker("w1", 1, &[]);
    let status = cluster.final_status(build);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "a")["worker"], "w1");
    assert_eq!(job(&status, "a")["attempts"], 2);
}

#[test]
fn a_job_on_a_killed_worker_finishes_elsewhere() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    cluster.add_worker("w2", 1, &[]);
    let (id, pid) = submit_stuck_first_attempt(&cluster, "loss");
    let status = cluster.status(id);
    let first = job(&status, "slow")["worker"].as_str().expect("worker").to_owned();
    cluster.kill_worker(&first);
    eventually("the orphaned job to be killed with its worker", || process_gone(pid).then_some(()));
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    let slow = job(&status, "slow");
    assert_ne!(slow["worker"].as_str(), Some(first.as_str()));
    assert_eq!(slow["attempts"], 2);
}

/// A worker told to stop (SIGTERM) drains: its running job finishes there
/// and is reported, nothing new goes to it (the job that needs that output
/// runs on the other worker), and then it leaves and exits.
#[test]
fn a_worker_stopped_with_sigterm_finishes_its_job_takes_nothing_new_and_leaves() {
    let mut cluster = Cluster::with_config(None, "[scheduler]\nlease_timeout = \"10m\"\n");
    cluster.add_worker("w1", 1, &[]);
    let (go, started) = (cluster.scratch("go"), cluster.scratch("started"));
    let build = format!(
        "jobs:\n  - name: slow\n    run: [\"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo s > {{{{out}}}}/s\"]\n  - name: next\n    needs: [slow]\n    run: [\"cat {{{{dep:slow}}}}/s > {{{{out}}}}/n\"]\n"
    );
    let file = cluster.project("drain", &build, &[]);
    let id = cluster.submit(&file);
    eventually("slow to start", || std::path::Path::new(&started).exists().then_some(()));
    cluster.add_worker("w2", 1, &["--tokens", "gpu=1,net=2"]);
    cluster.signal_worker("w1", "TERM");
    wait_draining(&cluster, "w1");
    std::fs::write(&go, "").expect("go");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    let (slow, next) = (job(&status, "slow"), job(&status, "next"));
    assert_eq!((slow["worker"].as_str(), &slow["attempts"]), (Some("w1"), &serde_json::json!(1)), "{status}");
    assert_eq!(next["worker"].as_str(), Some("w2"), "nothing new went to the draining worker: {status}");
    assert!(cluster.worker_exit("w1").success(), "the worker exits cleanly once drained");
    let w1 = worker_entry(&cluster, "w1").expect("w1 listed");
    assert_eq!((&w1["alive"], &w1["left"]), (&Value::Bool(false), &Value::Bool(true)), "it left: {w1}");
    let out = cluster.run(&["workers"]);
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATE", "URL", "RUNNING", "CPU", "MEMORY", "TOKENS", "LABELS"], "{table}");
    let row: Vec<&str> =
        table.lines().find(|l| l.starts_with("w1 ")).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.get(1..4).map(|r| [r[0], r[2]]), Some(["left", "0/1"]), "{table}");
    let w2: Vec<&str> =
        table.lines().find(|l| l.starts_with("w2 ")).unwrap_or_default().split_whitespace().collect();
    assert_eq!(w2.get(6), Some(&"gpu=1,net=2"), "the tokens column: {table}");
}

/// A second stop request stops the running job now, and the worker leaves:
/// the run goes back to the queue at once. The lease here is ten minutes,
/// longer than `final_status` waits, so the build could not finish by the
/// lease.
#[test]
fn a_second_sigterm_stops_the_job_and_hands_it_back_at_once() {
    let mut cluster = Cluster::with_config(None, "[scheduler]\nlease_timeout = \"10m\"\n");
    cluster.add_worker("w1", 1, &[]);
    let (id, pid) = submit_stuck_first_attempt(&cluster, "leave");
    cluster.add_worker("w2", 1, &[]);
    cluster.signal_worker("w1", "TERM");
    wait_draining(&cluster, "w1");
    cluster.signal_worker("w1", "TERM");
    assert!(cluster.worker_exit("w1").success(), "the worker exits cleanly after leaving");
    assert!(process_gone(pid), "the first attempt's processes died before the worker left");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    let slow = job(&status, "slow");
    assert_eq!((slow["worker"].as_str(), &slow["attempts"]), (Some("w2"), &serde_json::json!(2)));
}

/// With `--drain-timeout`, a draining worker whose job does not end stops
/// it and leaves on its own once the time is up; the job runs elsewhere.
#[test]
fn a_drain_timeout_stops_a_stuck_job_and_leaves() {
    let mut cluster = Cluster::with_config(None, "[scheduler]\nlease_timeout = \"10m\"\n");
    cluster.add_worker("w1", 1, &["--drain-timeout", "300ms"]);
    let (id, pid) = submit_stuck_first_attempt(&cluster, "timeout");
    cluster.add_worker("w2", 1, &[]);
    cluster.signal_worker("w1", "TERM");
    assert!(cluster.worker_exit("w1").success(), "the worker leaves on its own once the drain times out");
    assert!(process_gone(pid), "the stuck attempt's processes died before the worker left");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    let slow = job(&status, "slow");
    assert_eq!((slow["worker"].as_str(), &slow["attempts"]), (Some("w2"), &serde_json::json!(2)));
}

/// An empty output needs no transfer: a job whose dependency's output is
/// empty runs even though the only worker that built it is gone (and never
/// pushed it to the shared cache).
#[test]
fn an_empty_dependency_output_needs_no_transfer() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &["--labels", "box=one", "--no-push"]);
    cluster.add_worker("w2", 1, &["--labels", "box=two"]);
    let go = cluster.scratch("go");
    let build = format!(
        "jobs:\n  - name: empty\n    labels: {{box: one}}\n    run: [\"true\"]\n  - name: gate\n    labels: {{box: two}}\n    run: [\"while [ ! -e {go} ]; do sleep 0.02; done\"]\n  - name: after\n    needs: [empty, gate]\n    labels: {{box: two}}\n    run: [\"ls {{{{dep:empty}}}} > {{{{out}}}}/listing\"]\n"
    );
    let file = cluster.project("empty-dep", &build, &[]);
    let id = cluster.submit(&file);
    eventually("the empty job to succeed", || {
        (job(&cluster.status(id), "empty")["state"] == "succeeded").then_some(())
    });
    cluster.kill_worker("w1");
    std::fs::write(&go, "").expect("open the gate");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "after")["worker"], "w2");
}

/// Builds `made` (counting its runs in `made-runs`), a `gate` that waits
/// for a file, and the jobs of `rest` (YAML job entries) on w1 alone,
/// without pushes. Once `made` succeeded there,
/// w2 joins, w1 is killed (the only holder of `made`'s output) and the gate
/// opens. Returns the build's final status and how often `made` ran.
fn lose_made_with_w1(cluster: &mut Cluster, project: &str, rest: &str) -> (serde_json::Value, usize) {
    cluster.add_worker("w1", 2, &["--no-push"]);
    let (go, runs) = (cluster.scratch("go"), cluster.scratch("made-runs"));
    let build = format!(
        "jobs:\n  - name: made\n    run: [\"echo run >> {runs}; echo hello > {{{{out}}}}/r\"]\n  - name: gate\n    run: [\"while [ ! -e {go} ]; do sleep 0.02; done\"]\n{}",
        rest
    );
    let file = cluster.project(project, &build, &[]);
    let id = cluster.submit(&file);
    eventually("made to succeed on w1", || {
        (job(&cluster.status(id), "made")["state"] == "succeeded").then_some(())
    });
    cluster.add_worker("w2", 2, &["--no-push"]);
    cluster.kill_worker("w1");
    std::fs::write(&go, "").expect("open the gate");
    let status = cluster.final_status(id);
    let made_runs = std::fs::read_to_string(&runs).expect("made ran").lines().count();
    (status, made_runs)
}

/// A dependency's output lost with the only worker that held it (never
/// pushed to the shared cache) is built again on a live worker, and the job
/// that needs it runs after it: the build succeeds without a retry.
#[test]
fn an_output_lost_with_its_worker_is_built_again_for_its_dependent() {
    let mut cluster = Cluster::new();
    let after =
        "  - name: after\n    needs: [made, gate]\n    run: [\"cat {{dep:made}}/r > {{out}}/copy\"]\n";
    let (status, made_runs) = lose_made_with_w1(&mut cluster, "lost-output", after);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "after")["worker"], "w2");
    assert_eq!(job(&status, "made")["worker"], "w2", "built again where it was needed");
    assert_eq!(made_runs, 2, "made ran once on w1, once more on w2");
}

/// Five outputs lost with the only worker that held them are all built
/// again in one round: the dependent's run tries every input (a holder
/// found unreachable is not tried again) and the coordinator sends back
/// every need whose output is gone. Found one at a time, the dependent
/// went back once per input and failed past its bound of rewinds.
#[test]
fn many_outputs_lost_with_their_worker_are_built_again_together() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &["--no-push"]);
    let go = cluster.scratch("go");
    let mut build =
        format!("jobs:\n  - name: gate\n    run: [\"while [ ! -e {go} ]; do sleep 0.02; done\"]\n");
    let (mut needs, mut reads) = (String::new(), String::new());
    for n in 1..=5 {
        let runs = cluster.scratch(&format!("m{n}-runs"));
        build.push_str(&format!(
            "  - name: m{n}\n    run: [\"echo run >> {runs}; echo {n} > {{{{out}}}}/r\"]\n"
        ));
        needs.push_str(&format!("m{n}, "));
        reads.push_str(&format!(" {{{{dep:m{n}}}}}/r"));
    }
    build.push_str(&format!(
        "  - name: after\n    needs: [{needs}gate]\n    run: [\"cat{reads} > {{{{out}}}}/all\"]\n"
    ));
    let id = cluster.submit(&cluster.project("lost-outputs", &build, &[]));
    eventually("m1 to m5 to succeed on w1", || {
        let status = cluster.status(id);
        (1..=5).all(|n| job(&status, &format!("m{n}"))["state"] == "succeeded").then_some(())
    });
    cluster.add_worker("w2", 2, &["--no-push"]);
    cluster.kill_worker("w1");
    std::fs::write(&go, "").expect("open the gate");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    for n in 1..=5 {
        let runs = std::fs::read_to_string(cluster.scratch(&format!("m{n}-runs"))).expect("ran");
        assert_eq!(runs.lines().count(), 2, "m{n} ran once on w1, once more on w2: {status}");
    }
    assert_eq!(job(&status, "after")["worker"], "w2");
}

/// A gang whose member finds a dependency's output lost with its worker
/// goes back whole: the output is built again on the live worker, then the
/// gang starts together again there, and the build succeeds.
#[test]
fn a_gang_that_lost_an_input_runs_whole_again_after_it() {
    let mut cluster = Cluster::new();
    let g2_runs = cluster.scratch("g2-runs");
    let gang = format!(
        "  - name: g1\n    needs: [made, gate]\n    gang: {{name: pair, min_available: 2}}\n    run: [\"cat {{{{dep:made}}}}/r > {{{{out}}}}/copy\"]\n  - name: g2\n    needs: [gate]\n    gang: {{name: pair, min_available: 2}}\n    run: [\"echo run >> {g2_runs}; sleep 0.3\"]\n"
    );
    let (status, made_runs) = lose_made_with_w1(&mut cluster, "lost-gang-input", &gang);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "made")["worker"], "w2", "built again on the live worker");
    assert_eq!(made_runs, 2, "made ran on w1, then once more on w2");
    let g2 = std::fs::read_to_string(&g2_runs).map(|t| t.lines().count()).unwrap_or(0);
    assert_eq!(g2, 2, "g2 started with the gang, then again with the whole gang");
}

/// A holder whose first answer fails for a reason that may pass (the
/// connection is cut) is tried again after a pause: the dependency's output
/// is fetched from it, not built again.
#[test]
fn a_holder_that_fails_once_is_tried_again_instead_of_building_again() {
    let mut cluster = Cluster::new();
    let port = free_port();
    let relay = CutOnce::start(port);
    let (listen, advertise) = (format!("127.0.0.1:{port}"), format!("http://127.0.0.1:{}", relay.port));
    let w1 = ["--no-push", "--labels", "side=a", "--listen", &listen, "--advertise", &advertise];
    cluster.add_worker("w1", 2, &w1);
    cluster.add_worker("w2", 2, &["--no-push", "--labels", "side=b"]);
    let runs = cluster.scratch("made-runs");
    let build = format!(
        "jobs:\n  - name: made\n    labels: {{side: a}}\n    run: [\"echo run >> {runs}; echo hello > {{{{out}}}}/r\"]\n  - name: after\n    needs: [made]\n    labels: {{side: b}}\n    run: [\"cat {{{{dep:made}}}}/r > {{{{out}}}}/copy\"]\n"
    );
    let file = cluster.project("flaky-holder", &build, &[]);
    let id = cluster.submit(&file);
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    let made_runs = std::fs::read_to_string(&runs).expect("made ran").lines().count();
    assert_eq!(made_runs, 1, "fetched on the second try, not built again");
    assert_eq!(relay.cut(), 1);
    let out = cluster.run(&["logs", &id.to_string(), "after", "--stage", "fetch"]);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("failed") && log.contains(&format!("dependency made from {advertise}: ")), "{log}");
}

#[test]
fn a_build_survives_a_coordinator_crash() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let go = cluster.scratch("go");
    let started = cluster.scratch("started");
    let build = format!(
        "sources: [\"in.txt\"]\njobs:\n  - name: first\n    run: [\"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; tr a-z A-Z < in.txt > {{{{out}}}}/up\"]\n  - name: second\n    needs: [first]\n    run: [\"cat {{{{dep:first}}}}/up {{{{dep:first}}}}/up > {{{{out}}}}/twice\"]\n"
    );
    let file = cluster.project("crash", &build, &[("in.txt", "abc\n")]);
    let out_dir = cluster.dir.path().join("exported");
    let waiter = cluster
        .client(&[
            "submit",
            file.to_str().expect("utf-8"),
            "--wait",
            "--json",
            "--out",
            out_dir.to_str().expect("utf-8"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit");
    eventually("the first job to start", || Path::new(&started).exists().then_some(()));
    cluster.kill_coordinator();
    cluster.start_coordinator();
    std::fs::write(&go, "").expect("go");
    let out = waiter.wait_with_output().expect("submit --wait ends");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "succeeded");
    assert_eq!(std::fs::read_to_string(out_dir.join("second/twice")).expect("exported"), "ABC\nABC\n");
}

#[test]
fn a_malformed_build_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("drover.yaml");
    std::fs::write(
        &file,
        "jobs:\n  - name: a\n    run: [\"true\"]\n  - name: b\n    needs: [nope]\n    run: [\"true\"]\n",
    )
    .expect("write");
    // No coordinator runs: nothing may be contacted before the file is valid.
    let out = drover()
        .args(["submit", file.to_str().expect("utf-8"), "--coordinator", "http://127.0.0.1:9"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("drover.yaml:5"), "names the line: {err}");
    assert!(err.contains("\"b\""), "names the job: {err}");
    assert!(out.stdout.is_empty(), "no build ID is printed");
}

/// `--coordinator` (or `DROVER_COORDINATOR`) must be an http(s) URL with a
/// host; a bare `HOST:PORT` means `http://HOST:PORT`.
#[test]
fn a_coordinator_url_is_checked_and_a_bare_address_means_http() {
    for url in ["ftp://x", "http://", "http:// /", "https://coordinator:7700"] {
        let out = drover().args(["status", "--coordinator", url]).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{url}: {}", stderr(&out));
        assert!(stderr(&out).contains("--coordinator"), "{url}: {}", stderr(&out));
    }
    let out = drover().args(["workers"]).env("DROVER_COORDINATOR", "127.0.0.1:9").output().expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot reach http://127.0.0.1:9/"), "{}", stderr(&out));
}

/// A coordinator that can no longer record its state (here its files may
/// not grow past 100 KiB, as on a full disk) exits non-zero, saying why,
/// instead of refusing every request forever while it holds its port; a
/// source it cannot store is answered 507, not blamed on the file.
#[test]
fn a_coordinator_that_cannot_record_its_state_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let port = crate::harness::free_port();
    let script = format!(
        "trap '' XFSZ; ulimit -f 200; exec {} serve --listen 127.0.0.1:{port} --data {}",
        env!("CARGO_BIN_EXE_drover"),
        data.display()
    );
    /// Killed if the test fails before it exits.
    struct Serve(std::process::Child);
    impl Drop for Serve {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut serve = Serve(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .env_remove("DROVER_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sh"),
    );
    let url = format!("http://127.0.0.1:{port}");
    eventually("the coordinator to listen", || {
        drover().args(["workers", "--coordinator", &url]).output().ok().filter(|o| o.status.success())
    });
    // A source the coordinator cannot store is its own trouble, not the
    // file's: 507, without the hint that the file changed.
    let project = dir.path().join("project");
    std::fs::create_dir(&project).expect("mkdir");
    std::fs::write(project.join("big.txt"), "y".repeat(150 << 10)).expect("write");
    let small = project.join("drover.yaml");
    std::fs::write(&small, "sources: [big.txt]\njobs:\n  - name: a\n    run: [\"true\"]\n").expect("write");
    let out = drover()
        .args(["submit", small.to_str().expect("utf-8"), "--coordinator", &url])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("507"), "{}", stderr(&out));
    assert!(stderr(&out).contains("the coordinator cannot store blob"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("did it change"), "{}", stderr(&out));
    // A submission larger than the log may grow.
    let file = dir.path().join("drover.yaml");
    let long = "x".repeat(120 << 10);
    std::fs::write(&file, format!("jobs:\n  - name: big\n    run: [\"echo {long}\"]\n")).expect("write");
    let out = drover()
        .args(["submit", file.to_str().expect("utf-8"), "--coordinator", &url])
        .output()
        .expect("run");
    assert!(!out.status.success(), "the submission is not recorded: {}", stderr(&out));
    let status = eventually("the coordinator to exit", || serve.0.try_wait().expect("wait"));
    assert!(!status.success(), "{status}");
    let mut log = String::new();
    std::io::Read::read_to_string(&mut serve.0.stderr.take().expect("stderr"), &mut log).expect("read");
    assert!(log.contains("the coordinator stopped: it cannot record its state"), "{log}");
}

/// A worker says when it has joined the cluster; one stopped before it
/// could join (no coordinator there yet) says that, not that it drained.
#[test]
fn a_worker_says_when_it_joined_and_one_that_never_did_stops_plainly() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |coordinator: &str, cache: &str| {
        drover()
            .args(["worker", "--coordinator", coordinator, "--name", "w", "--cache"])
            .arg(dir.path().join(cache))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start drover worker")
    };
    let stop = |mut worker: std::process::Child| {
        let status = Command::new("kill").args(["-TERM", &worker.id().to_string()]).status().expect("kill");
        assert!(status.success());
        let mut lines = Vec::new();
        for line in BufReader::new(worker.stderr.take().expect("stderr")).lines() {
            lines.push(line.expect("read"));
        }
        (worker.wait().expect("wait"), lines.join("\n"))
    };
    let first_line = |worker: &mut std::process::Child, want: &str| {
        let mut err = BufReader::new(worker.stderr.as_mut().expect("stderr"));
        let mut line = String::new();
        while !line.contains(want) {
            line.clear();
            assert!(err.read_line(&mut line).expect("read") > 0, "the worker ended before saying {want:?}");
        }
    };
    // Nothing listens there.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let mut lonely = start(&nowhere, "lonely");
    first_line(&mut lonely, "serving on");
    let (status, said) = stop(lonely);
    assert!(status.success(), "{said}");
    assert!(said.contains("stopped before it joined the cluster"), "{said}");
    assert!(!said.contains("drained"), "{said}");

    let cluster = Cluster::new();
    let mut joined = start(&cluster.url, "joined");
    first_line(&mut joined, "joined the cluster (worker ");
    let (status, said) = stop(joined);
    assert!(status.success(), "{said}");
    assert!(said.contains("drained; leaving the cluster"), "{said}");
}

/// A client given a worker's address for the coordinator's is told so.
#[test]
fn a_workers_address_given_for_the_coordinators_is_named() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let workers = cluster.workers_json();
    let url = workers[0]["url"].as_str().expect("the worker's URL");
    let out = drover().args(["status", "--coordinator", url]).output().expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("this is drover worker \"w1\", not a coordinator"), "{}", stderr(&out));
    // A coordinator's address with a path the API is not under.
    let wrong = format!("{}/drover", cluster.url);
    let out = drover().args(["status", "--coordinator", &wrong]).output().expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("is {wrong} the address of a drover coordinator?")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn what_acts_on_the_builds_end_needs_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("drover.yaml");
    std::fs::write(&file, "jobs:\n  - name: a\n    run: [\"true\"]\n").expect("write");
    for flag in ["--out=x", "--json", "--logs"] {
        let out = drover()
            .args(["submit", file.to_str().expect("utf-8"), flag, "--coordinator", "http://127.0.0.1:9"])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert!(stderr(&out).contains("needs --wait"), "{flag}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "nothing was submitted");
    }
    // Nor is a build retried for a `--json` that would never print.
    let out =
        drover().args(["retry", "1", "--json", "--coordinator", "http://127.0.0.1:9"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--json needs --wait"), "{}", stderr(&out));
}

#[test]
fn a_token_is_required_when_configured() {
    let mut cluster = Cluster::with_token(Some("s3cret"));
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project("token", "jobs:\n  - name: a\n    run: [\"true\"]\n", &[]);
    let denied = cluster
        .client(&["submit", file.to_str().expect("utf-8")])
        .env("DROVER_TOKEN", "wrong")
        .output()
        .expect("run");
    assert_eq!(denied.status.code(), Some(2), "{}", stderr(&denied));
    let said = format!(
        "the coordinator at {} refused the request: a valid token is required (--token or DROVER_TOKEN)",
        cluster.url
    );
    assert!(stderr(&denied).contains(&said), "{}", stderr(&denied));
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    // A worker with the wrong token never joined: it stops at once with
    // the reason, instead of retrying for ever.
    let mut worker = drover()
        .args(["worker", "--coordinator", &cluster.url, "--name", "intruder", "--cache"])
        .arg(cluster.dir.path().join("intruder"))
        .env("DROVER_TOKEN", "wrong")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start drover worker");
    // Waited for with a deadline, and killed past it, so a worker that
    // keeps retrying fails the test instead of hanging it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let exited = loop {
        if let Some(status) = worker.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            worker.kill().expect("kill drover worker");
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    };
    let refused = worker.wait_with_output().expect("reap drover worker");
    let exited = exited.unwrap_or_else(|| panic!("the refused worker kept running: {}", stderr(&refused)));
    assert_eq!(exited.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("refused this worker") && stderr(&refused).contains("401"),
        "{}",
        stderr(&refused)
    );
}

/// With a token of their own for workers (`--worker-token`), the clients'
/// token cannot act as a worker: registering, reporting and pushing to the
/// shared cache are refused with it, and clients' routes with the workers'
/// token. Builds still run, and a client still reads outputs and logs from
/// the workers with its own token.
#[test]
fn workers_may_have_a_token_of_their_own() {
    let mut cluster = Cluster::with_tokens("client-s3cret", "worker-s3cret");
    cluster.add_worker("w1", 1, &[]);
    let build = "jobs:\n  - name: a\n    run: [\"echo a > {{out}}/a\", \"echo said-a\"]\n";
    let file = cluster.project("roles", build, &[]);
    let out = cluster.dir.path().join("out");
    let (code, status) = wait_json(&cluster, &file, &["--out", out.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(std::fs::read_to_string(out.join("a/a")).expect("exported"), "a\n");
    let logs = cluster.run(&["logs", "1", "a"]);
    assert!(String::from_utf8_lossy(&logs.stdout).contains("said-a"), "{}", stderr(&logs));
    // The worker serves its outputs to either token, and to no other.
    let id = job(&status, "a")["id"].as_str().expect("an ID").to_owned();
    let workers = cluster.workers_json();
    let worker = workers[0]["url"].as_str().expect("the worker's URL").to_owned();
    let artifact = format!("/v1/artifacts/{id}");
    for (token, expected) in [("client-s3cret", 200), ("worker-s3cret", 200), ("wrong", 401)] {
        let auth = format!("Authorization: Bearer {token}\r\n");
        let ((code, _), _) = http_with(&worker, "GET", &artifact, &auth, b"");
        assert_eq!(code, expected, "the worker's artifact with {token}");
    }
    // Each role's routes take only its token.
    let client = "Authorization: Bearer client-s3cret\r\n";
    let register = br#"{"name":"fake","url":"http://127.0.0.1:9","capacity":{"slots":1},"labels":{},"artifacts":[],"running":[]}"#;
    let ((code, body), _) = http_with(&cluster.url, "POST", "/v1/workers/register", client, register);
    assert_eq!(code, 401, "{}", String::from_utf8_lossy(&body));
    assert!(
        String::from_utf8_lossy(&body).contains("needs the workers' token"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let ((code, _), _) = http_with(&cluster.url, "PUT", &format!("/v1/cache/{id}?run=1"), client, b"bytes");
    assert_eq!(code, 401, "a push with the clients' token");
    let ((code, _), _) = http_with(&cluster.url, "GET", &format!("/v1/cache/{id}"), client, b"");
    assert_ne!(code, 401, "reading the shared cache with the clients' token");
    let ((code, _), _) =
        http_with(&cluster.url, "GET", "/v1/builds", "Authorization: Bearer worker-s3cret\r\n", b"");
    assert_eq!(code, 401, "a client's route with the workers' token");
    // Mistakes in the tokens are said before anything starts: one token
    // given twice, a workers' token alone, and an empty token (one nobody
    // could present).
    let refused = [
        (&["--token", "x", "--worker-token", "x"][..], "--worker-token is the same as --token"),
        (&["--worker-token", "x"][..], "--worker-token needs --token too"),
        (&["--token", ""][..], "--token ($DROVER_TOKEN) is empty"),
    ];
    for (i, (tokens, said)) in refused.into_iter().enumerate() {
        let serve = drover()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(tokens)
            .arg("--data")
            .arg(cluster.dir.path().join(format!("refused-{i}")))
            .output()
            .expect("run drover serve");
        assert_eq!(serve.status.code(), Some(2), "{tokens:?}: {}", stderr(&serve));
        assert!(stderr(&serve).contains(said), "{tokens:?}: {}", stderr(&serve));
    }
    // A worker on a machine whose environment has both tokens presents
    // the workers'.
    let mut both = drover()
        .args(["worker", "--coordinator", &cluster.url, "--name", "both", "--cache"])
        .arg(cluster.dir.path().join("both"))
        .env("DROVER_TOKEN", "client-s3cret")
        .env("DROVER_WORKER_TOKEN", "worker-s3cret")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start drover worker");
    eventually("the worker with both tokens to join", || {
        let workers = cluster.workers_json();
        workers.as_array()?.iter().any(|w| w["name"] == "both" && w["alive"] == true).then_some(())
    });
    both.kill().expect("kill");
    both.wait().expect("reap");
    // A client cannot make a worker leave (its runs would be lost).
    let ((code, _), _) = http_with(&cluster.url, "POST", "/v1/workers/1/leave", client, b"");
    assert_eq!(code, 401, "a leave with the clients' token");
}

/// The shared cache takes an output only from the cluster's own runs: a
/// push under a job ID no run was assigned (a client filing its own bytes
/// under another job's ID, for every build to take) is refused, while the
/// workers' pushes go through.
#[test]
fn the_shared_cache_takes_only_outputs_the_cluster_built() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project("pushed", "jobs:\n  - name: a\n    run: [\"echo a > {{out}}/a\"]\n", &[]);
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    let id = job(&status, "a")["id"].as_str().expect("an ID").to_owned();
    eventually("the worker's push", || {
        let (code, _) = crate::harness::http(&cluster.url, "GET", &format!("/v1/cache/{id}"), b"");
        (code == 200).then_some(())
    });
    let future = "ab".repeat(32);
    for (path, run) in
        [(format!("/v1/cache/{future}"), ""), (format!("/v1/cache/{future}?run=1"), "with a run")]
    {
        let ((code, body), _) = http_with(&cluster.url, "PUT", &path, "", b"not a pack");
        assert_eq!(code, 409, "{run}: {}", String::from_utf8_lossy(&body));
        assert!(String::from_utf8_lossy(&body).contains("only an output the cluster built is taken"));
    }
}

/// A coordinator listening beyond loopback without a token says, loudly,
/// that anyone who reaches it can run commands; with a token it does not.
#[test]
fn listening_beyond_loopback_without_a_token_is_warned_of() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    for token in [None, Some("s3cret")] {
        let mut serve = drover();
        serve.args(["serve", "--listen", "0.0.0.0:0", "--data"]).arg(dir.path().join("c"));
        serve.env_remove("DROVER_TOKEN").stderr(Stdio::piped()).stdout(Stdio::null());
        if let Some(token) = token {
            serve.env("DROVER_TOKEN", token);
        }
        let mut serve = serve.spawn().expect("drover serve");
        // The warning comes before the line that says it listens.
        let before: Vec<String> = BufReader::new(serve.stderr.take().expect("stderr"))
            .lines()
            .map_while(Result::ok)
            .take_while(|l| !l.contains("drover coordinator listening on"))
            .collect();
        serve.kill().expect("kill");
        serve.wait().expect("reap");
        let warned = before
            .iter()
            .any(|l| l.contains("WARNING: listening on 0.0.0.0:") && l.contains("without a token"));
        assert_eq!(warned, token.is_none(), "token {token:?}: {before:?}");
    }
}

#[test]
fn metrics_count_builds_jobs_runs_and_workers_for_a_scraper() {
    let mut cluster = Cluster::with_token(Some("s3cret"));
    cluster.add_worker("w1", 2, &[]);
    let file = cluster.project(
        "metrics",
        "jobs:\n  - name: a\n    run: [\"true\"]\n  - name: b\n    needs: [a]\n    run: [\"false\"]\n  - name: c\n    needs: [b]\n    run: [\"true\"]\n",
        &[],
    );
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(1), "{status}");
    let ((denied, _), _) = http_with(&cluster.url, "GET", "/metrics", "", b"");
    assert_eq!(denied, 401, "the token guards /metrics like every route");
    let ((code, body), head) =
        http_with(&cluster.url, "GET", "/metrics", "Authorization: Bearer s3cret\r\n", b"");
    assert_eq!(code, 200);
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    let page = String::from_utf8(body).expect("utf-8");
    for line in [
        "drover_builds{state=\"failed\"} 1",
        "drover_builds{state=\"running\"} 0",
        "drover_builds_submitted_total 1",
        "drover_build_jobs_ended_total{state=\"succeeded\"} 1",
        "drover_build_jobs_ended_total{state=\"failed\"} 1",
        "drover_build_jobs_ended_total{state=\"skipped\"} 1",
        "drover_runs_ended_total{result=\"succeeded\"} 1",
        "drover_runs_ended_total{result=\"failed\"} 1",
        "drover_workers{state=\"up\"} 1",
        "drover_slots 2",
        "drover_runs_in_flight 0",
        "drover_jobs_scheduled 0",
    ] {
        assert!(page.lines().any(|l| l == line), "no line {line:?} in:\n{page}");
    }
}

#[test]
fn run_builds_the_c_example_on_an_embedded_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-c/drover.yaml");
    // The state goes to ./.drover, a relative path, as in the quick start.
    let out_dir = dir.path().join("out");
    let out = drover()
        .arg("run")
        .arg(&example)
        .arg("--out")
        .arg(&out_dir)
        .arg("--json")
        .arg("--logs")
        .current_dir(dir.path())
        .output()
        .expect("drover run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "succeeded");
    // `--logs`: what the test printed, under its name; the compile jobs
    // printed nothing and are left out.
    let err = stderr(&out);
    assert!(err.contains("--- test (succeeded) ---\nhello from drover: the answer is 42\n"), "{err}");
    assert!(!err.contains("--- compile-main"), "{err}");
    // `test` is the only job nothing depends on: its output is exported.
    let output = std::fs::read_to_string(out_dir.join("test/output.txt")).expect("exported");
    assert!(output.contains("the answer is 42"), "{output}");
    // A second run finds everything cached.
    let again =
        drover().arg("run").arg(&example).arg("--json").current_dir(dir.path()).output().expect("drover run");
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let status: Value = serde_json::from_slice(&again.stdout).expect("status JSON");
    assert!(status["jobs"].as_array().expect("jobs").iter().all(|j| j["state"] == "cached"), "{status}");
}

/// `drover run` on a state that another version of drover wrote (here, a
/// snapshot in a format this one does not read): the state is put aside
/// and the run starts afresh, and the workers' caches still serve it.
#[test]
fn run_starts_afresh_on_another_versions_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-c/drover.yaml");
    let run = || {
        let out = drover().arg("run").arg(&example).arg("--json").current_dir(dir.path()).output();
        let out = out.expect("drover run");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        (serde_json::from_slice::<Value>(&out.stdout).expect("status JSON"), stderr(&out))
    };
    let (first, err) = run();
    assert_eq!(first["state"], "succeeded", "{first}");
    assert!(!err.contains("starting afresh"), "{err}");
    let state = dir.path().join(".drover");
    let mut store = drover_store::Store::open(&state.join("embedded/state.db")).expect("store");
    store.snapshot(1, "drover-solver-0", "snapshot-1.cbor").expect("record a foreign snapshot");
    drop(store);
    let (again, err) = run();
    assert!(err.contains("another version of drover") && err.contains("starting afresh"), "{err}");
    assert!(state.join("embedded.old/state.db").exists(), "the old state is kept aside");
    assert!(again["jobs"].as_array().expect("jobs").iter().all(|j| j["state"] == "cached"), "{again}");
}

/// `drover run` where a `drover serve` keeps its state (both default to
/// `.drover/`): the run keeps its own, and takes up neither the served
/// coordinator's queued build nor hands it its local workers.
#[test]
fn a_run_leaves_a_served_coordinators_state_alone() {
    let mut cluster = Cluster::new();
    let file = cluster.project("p", "jobs:\n  - name: one\n    run: [\"true\"]\n", &[]);
    // No worker: it stays queued.
    let served = cluster.submit(&file);
    cluster.kill_coordinator();
    let out = drover()
        .arg("run")
        .arg(&file)
        .arg("--json")
        .arg("--state")
        .arg(cluster.dir.path())
        .output()
        .expect("drover run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ran: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(ran["id"], 1, "the run numbers its own builds: {ran}");
    cluster.start_coordinator();
    let status = cluster.status(served);
    assert_eq!(status["state"], "queued", "the served build waits for its own workers: {status}");
    assert_eq!(
        cluster.workers_json(),
        serde_json::json!([]),
        "no local worker joined the served coordinator"
    );
}

/// A job cannot change its dependency's output for later readers: the
/// cache's trees are read-only, and one running as root that writes anyway
/// fails with what it did, and the changed output leaves the cache.
#[test]
fn a_job_that_writes_into_a_dependency_fails_and_later_readers_see_the_original() {
    let dir = tempfile::tempdir().expect("tempdir");
    let producer = "  - name: producer\n    run: [\"echo pristine > {{out}}/data.txt\"]\n";
    let write = |name: &str, jobs: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, format!("jobs:\n{producer}{jobs}")).expect("write");
        file
    };
    let evil = write(
        "evil.yaml",
        "  - name: evil\n    needs: [producer]\n    run: [\"echo tampered >> {{dep:producer}}/data.txt\"]\n",
    );
    let honest = write(
        "honest.yaml",
        "  - name: honest\n    needs: [producer]\n    run: [\"cat {{dep:producer}}/data.txt\"]\n",
    );
    let run = |file: &Path| {
        drover().arg("run").arg(file).args(["--workers", "1", "--logs"]).current_dir(dir.path()).output()
    };
    let out = run(&evil).expect("drover run");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    // As root the write goes through and is found after the job; as anyone
    // else the read-only file refuses it.
    assert!(
        err.contains(
            "the output of its dependency producer changed while the job ran (data.txt in {{dep:producer}})"
        ) || err.contains("Permission denied"),
        "{err}"
    );
    let out = run(&honest).expect("drover run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("--- honest (succeeded) ---\npristine\n"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("tampered"), "{}", stderr(&out));
}

/// A job without sources works in an empty, read-only directory no other
/// run is in at the time; one that a job wrote into anyway (as root) is not
/// given to another job.
#[test]
fn what_a_job_writes_into_its_empty_directory_does_not_reach_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One worker runs both, the reader after the writer.
    let file = dir.path().join("drover.yaml");
    std::fs::write(
        &file,
        "jobs:\n  - name: writer\n    run: [\"echo poison > poison.txt; mkdir -p .cache; true\"]\n  \
         - name: reader\n    needs: [writer]\n    run: [\"ls -A; test -z \\\"$(ls -A)\\\"\"]\n",
    )
    .expect("write");
    let out =
        drover().arg("run").arg(&file).args(["--workers", "1", "--logs"]).current_dir(dir.path()).output();
    let out = out.expect("drover run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Every run has a `TMPDIR` of its own, empty when it starts: two jobs
/// running at once that write one scratch file name each read back their
/// own (they used to share `/tmp`, and one cached the other's), and a
/// later job finds nothing an earlier one left there.
#[test]
fn jobs_running_at_once_have_temporary_directories_of_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meet = dir.path().join("meet");
    std::fs::create_dir(&meet).expect("mkdir");
    let meet = meet.to_str().expect("utf-8");
    // Each writes its scratch file, then waits until the other has written
    // its own before reading it back.
    let job = |me: &str, other: &str| {
        format!(
            "  - name: {me}\n    run: [\"echo {me} > $TMPDIR/scratch; touch {meet}/{me}; \
             while [ ! -e {meet}/{other} ]; do sleep 0.01; done; cp $TMPDIR/scratch {{{{out}}}}/r\"]\n"
        )
    };
    let check = "test \\\"$(cat {{dep:a}}/r)$(cat {{dep:b}}/r)\\\" = ab; \
                 test \\\"$TMPDIR\\\" != /tmp; test -z \\\"$(ls -A $TMPDIR)\\\"";
    let yaml = format!(
        "jobs:\n{}{}  - name: later\n    needs: [a, b]\n    run: [\"{check}\"]\n",
        job("a", "b"),
        job("b", "a"),
    );
    std::fs::write(dir.path().join("drover.yaml"), yaml).expect("write");
    let out = drover()
        .args(["run", "drover.yaml", "--workers", "1", "--slots", "2"])
        .current_dir(dir.path())
        .output()
        .expect("drover run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `drover run --labels --tokens` gives the embedded workers what a
/// pipeline written for a real cluster asks of its workers; without them
/// such a job fails at once, saying what no worker has.
#[test]
fn run_offers_labels_and_tokens_to_its_local_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = "jobs:\n  - name: lint\n    labels: {py: \"3\"}\n    resources: {tokens: {network: 1}}\n    exclusive: [network]\n    run: [\"true\"]\n";
    std::fs::write(dir.path().join("drover.yaml"), yaml).expect("write");
    let run = |extra: &[&str]| {
        drover()
            .args(["run", "drover.yaml", "--workers", "1"])
            .args(extra)
            .current_dir(dir.path())
            .output()
            .expect("run")
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no worker has label py=3"), "{}", stderr(&out));
    let out = run(&["--labels", "py=3", "--tokens", "network=1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&["--tokens", "network=lots"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // `worker` is the local workers' own label: not silently overridden.
    let out = run(&["--labels", "worker=w1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`worker` is drover run's own label"), "{}", stderr(&out));
}

/// `--out` inside the project is never read for sources, even by `**`:
/// exporting does not change the next build's sources. A `--out` that
/// cannot be a directory is refused before anything runs.
#[test]
fn the_out_directory_is_not_a_source_and_a_bad_one_is_refused_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.txt"), "a\n").expect("write");
    std::fs::write(
        dir.path().join("drover.yaml"),
        "sources: [\"**\"]\njobs:\n  - name: list\n    run: [\"find . -type f | sort > {{out}}/files\"]\n",
    )
    .expect("write");
    let run = |out: &str| {
        drover()
            .args(["run", "drover.yaml", "--json", "--out", out])
            .current_dir(dir.path())
            .output()
            .expect("run")
    };
    for round in 0..2 {
        let out = run("out");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        let expected = if round == 0 { "succeeded" } else { "cached" };
        assert_eq!(job(&status, "list")["state"], expected, "round {round}: {status}");
    }
    let files = std::fs::read_to_string(dir.path().join("out/list/files")).expect("exported");
    assert_eq!(files, "./a.txt\n./drover.yaml\n");
    std::fs::write(dir.path().join("plain"), "").expect("write");
    let out = run("plain/sub");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--out plain/sub: cannot make that directory"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

/// An export removes what the previous export made for a job that is no
/// longer exported (something now needs it), and nothing else.
#[test]
fn an_export_removes_the_earlier_exports_of_jobs_it_no_longer_exports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |yaml: &str| {
        std::fs::write(dir.path().join("drover.yaml"), yaml).expect("write");
        drover().args(["run", "drover.yaml", "--out", "out"]).current_dir(dir.path()).output().expect("run")
    };
    let out = run("jobs:\n  - name: test\n    run: [\"echo ok > {{out}}/r\"]\n");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("out/test/r").exists());
    std::fs::create_dir(dir.path().join("out/mine")).expect("a directory of the user's own");
    let out = run(
        "jobs:\n  - name: test\n    run: [\"echo ok > {{out}}/r\"]\n  - name: dist\n    needs: [test]\n    run: [\"cp {{dep:test}}/r {{out}}/\"]\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("out/dist/r").exists());
    assert!(!dir.path().join("out/test").exists(), "the stale export is gone: {}", stderr(&out));
    assert!(stderr(&out).contains("test: removed"), "{}", stderr(&out));
    assert!(dir.path().join("out/mine").exists(), "what drover did not export stays");
    // Another build file exporting into the same directory leaves this
    // one's exports alone.
    std::fs::write(dir.path().join("other.yaml"), "jobs:\n  - name: x\n    run: [\"echo x > {{out}}/x\"]\n")
        .expect("write");
    let other = drover()
        .args(["run", "other.yaml", "--out", "out"])
        .current_dir(dir.path())
        .output()
        .expect("run other");
    assert_eq!(other.status.code(), Some(0), "{}", stderr(&other));
    let out = run("jobs:\n  - name: test\n    run: [\"echo ok > {{out}}/r\"]\n");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("out/x/x").exists(), "the other build file's export stays");
    assert!(!dir.path().join("out/dist").exists(), "{}", stderr(&out));
    // A listed name whose directory holds sources is never removed (here
    // the export goes into the project itself).
    let sources = dir.path().join("src");
    std::fs::create_dir(&sources).expect("mkdir");
    std::fs::write(sources.join("main.c"), "int main;\n").expect("write");
    let yaml = "sources: [\"src/*\"]\njobs:\n  - name: test\n    run: [\"echo ok > {{out}}/r\"]\n";
    std::fs::write(dir.path().join("drover.yaml"), yaml).expect("write");
    let here =
        || drover().args(["run", "drover.yaml", "--out", "."]).current_dir(dir.path()).output().expect("run");
    let out = here();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list = dir.path().join(".drover-exports");
    let text = std::fs::read_to_string(&list).expect("the export list");
    std::fs::write(&list, format!("{text}src\n")).expect("write");
    let out = here();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(sources.join("main.c").exists(), "a directory holding sources stays: {}", stderr(&out));
    // Nor one that is the state directory of the run.
    let text = std::fs::read_to_string(&list).expect("the export list");
    std::fs::write(&list, format!("{text}state\n")).expect("write");
    let out = drover()
        .args(["run", "drover.yaml", "--out", ".", "--state", "state"])
        .current_dir(dir.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("state/embedded").exists(), "the state directory stays: {}", stderr(&out));
    // A job cannot be exported under the list's own name.
    std::fs::write(dir.path().join("list.yaml"), "jobs:\n  - name: .drover-exports\n    run: [\"true\"]\n")
        .expect("write");
    let out =
        drover().args(["run", "list.yaml", "--out", "out"]).current_dir(dir.path()).output().expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("job .drover-exports cannot be exported"), "{}", stderr(&out));
}

/// An export replaces `out/<job>`: a job whose name is that of the
/// sources' directory or of the state directory, exported into the
/// project, is refused before it runs, and deletes nothing. A failed build
/// says that it exported nothing.
#[test]
fn an_export_that_would_replace_the_sources_or_the_state_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("src")).expect("mkdir");
    std::fs::write(dir.path().join("src/main.c"), "int main;\n").expect("write");
    let run = |job: &str, command: &str| {
        let build = format!("sources: [\"src/**\"]\njobs:\n  - name: {job}\n    run: [\"{command}\"]\n");
        std::fs::write(dir.path().join("drover.yaml"), build).expect("write");
        drover().args(["run", "drover.yaml", "--out", "."]).current_dir(dir.path()).output().expect("run")
    };
    let out = run("src", "touch {{out}}/x");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("exporting job src would replace"), "{}", stderr(&out));
    assert!(stderr(&out).contains("a source of the build"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(dir.path().join("src/main.c")).expect("kept"), "int main;\n");
    let out = run(".drover", "touch {{out}}/x");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("drover's state directory"), "{}", stderr(&out));
    assert!(dir.path().join(".drover").is_dir());
    // Into the state directory itself: its entries are the live cluster's.
    let inside = drover()
        .args(["run", "drover.yaml", "--out", ".drover/exports"])
        .current_dir(dir.path())
        .output()
        .expect("run");
    assert_eq!(inside.status.code(), Some(2), "{}", stderr(&inside));
    assert!(stderr(&inside).contains("inside drover's state directory"), "{}", stderr(&inside));
    let out = run("app", "exit 3");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing exported to .: the build failed"), "{}", stderr(&out));
    let out = run("app", "touch {{out}}/x");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("app/x").is_file());
}

/// Progress lines give each event's time in the build, also when the build
/// is followed after it ended (`status --watch`): not all at `0.00s`.
#[test]
fn progress_lines_give_each_events_time_in_the_build() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project("times", "jobs:\n  - name: nap\n    run: [\"sleep 0.3\"]\n", &[]);
    let id = cluster.submit(&file);
    assert_eq!(cluster.final_status(id)["state"], "succeeded");
    let out = cluster.run(&["status", &id.to_string(), "--watch"]);
    let err = stderr(&out);
    let line = err.lines().find(|l| l.ends_with("succeeded nap")).expect("the job's end");
    let secs: f64 =
        line.trim_start_matches('[').split('s').next().expect("time").trim().parse().expect("seconds");
    // The job slept 0.3 s between its start and its end.
    assert!(secs >= 0.3, "{err}");
}

/// `drover run` again on the same state, after a source changed: the
/// workers of the earlier run died with it, so this run's workers take
/// their names at once (no refused registration) and the changed job runs
/// on them (none waits for a dead worker's lease).
#[test]
fn run_again_after_a_change_uses_its_own_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/hello-c");
    let copy = dir.path().join("hello-c");
    for sub in ["src", "include"] {
        std::fs::create_dir_all(copy.join(sub)).expect("mkdir");
        for entry in std::fs::read_dir(example.join(sub)).expect("read example") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), copy.join(sub).join(entry.file_name())).expect("copy");
        }
    }
    std::fs::copy(example.join("drover.yaml"), copy.join("drover.yaml")).expect("copy");
    let run = || {
        let out =
            drover().arg("run").arg(copy.join("drover.yaml")).arg("--json").current_dir(dir.path()).output();
        let out = out.expect("drover run");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(!stderr(&out).contains("cannot register"), "{}", stderr(&out));
        serde_json::from_slice::<Value>(&out.stdout).expect("status JSON")
    };
    run();
    let greet = copy.join("src/greet.c");
    let mut text = std::fs::read_to_string(&greet).expect("read");
    text.push_str("/* changed */\n");
    std::fs::write(&greet, text).expect("write");
    let again = run();
    assert_eq!(again["state"], "succeeded");
    assert_eq!(job(&again, "compile-greet")["state"], "succeeded", "{again}");
    assert_eq!(job(&again, "compile-main")["state"], "cached", "{again}");
}

#[test]
fn a_second_coordinator_or_worker_on_the_same_directory_is_refused() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let data = cluster.dir.path().join("coordinator");
    let out =
        drover().args(["serve", "--listen", "127.0.0.1:0"]).arg("--data").arg(&data).output().expect("serve");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("in use by another coordinator"), "{}", stderr(&out));
    let cache = cluster.dir.path().join("w1");
    let out = drover()
        .args(["worker", "--coordinator", &cluster.url])
        .arg("--cache")
        .arg(&cache)
        .output()
        .expect("worker");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("in use by another worker"), "{}", stderr(&out));
    // `drover run` on a state directory another drover holds (here a
    // coordinator started on its `embedded/`): nothing is submitted, so
    // exit code 2.
    let state = cluster.dir.path().join("held");
    let mut holder = drover()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--data")
        .arg(state.join("embedded"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut said = std::io::BufReader::new(holder.stderr.take().expect("stderr"));
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut said, &mut line).expect("read") > 0 && !line.contains("listening")
    {
        line.clear();
    }
    let file = cluster.project("busy", "jobs:\n  - name: a\n    run: [\"true\"]\n", &[]);
    let out = drover().arg("run").arg(&file).arg("--state").arg(&state).output().expect("run");
    holder.kill().expect("kill serve");
    holder.wait().expect("reap serve");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("in use by another coordinator"), "{}", stderr(&out));
    // The first worker still works.
    let file = cluster.project("after", "jobs:\n  - name: a\n    run: [\"true\"]\n", &[]);
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
}

#[test]
fn on_error_continue_then_retry_finishes_the_build() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let mark = cluster.scratch("flaky-ran");
    let build = format!(
        "jobs:\n  - name: flaky\n    run: [\"if [ ! -e {mark} ]; then touch {mark}; exit 7; fi; echo ok > {{{{out}}}}/r\"]\n  - name: after\n    needs: [flaky]\n    run: [\"cat {{{{dep:flaky}}}}/r > {{{{out}}}}/r\"]\n  - name: independent\n    run: [\"sleep 0.2; echo i > {{{{out}}}}/i\"]\n"
    );
    let file = cluster.project("retry", &build, &[]);
    let (code, status) = wait_json(&cluster, &file, &["--on-error", "continue"]);
    assert_eq!(code, Some(1), "{status}");
    assert_eq!(job(&status, "flaky")["state"], "failed");
    assert_eq!(job(&status, "after")["state"], "skipped");
    assert_eq!(job(&status, "independent")["state"], "succeeded", "continue runs the independent branch");
    let id = status["id"].to_string();
    let out = cluster.run(&["retry", &id, "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["state"], "succeeded");
    assert_eq!(job(&status, "flaky")["state"], "succeeded");
    assert_eq!(job(&status, "after")["state"], "succeeded");
    assert_eq!(job(&status, "independent")["state"], "succeeded");
    let again = cluster.run(&["retry", &id]);
    assert_eq!(again.status.code(), Some(2), "nothing to retry: {}", stderr(&again));
}

/// The raw event history of a build, as NDJSON lines.
fn history(cluster: &Cluster, id: u64) -> Vec<Value> {
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("{}/v1/builds/{id}/events", cluster.url)])
        .output()
        .expect("curl");
    assert!(out.status.success(), "events: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("event JSON"))
        .collect()
}

#[test]
fn concurrent_builds_share_a_job_and_the_history_survives_a_restart() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 4, &[]);
    let counter = cluster.scratch("shared-runs");
    let go = cluster.scratch("go");
    let shared =
        format!("echo x >> {counter}; while [ ! -e {go} ]; do sleep 0.02; done; echo s > {{{{out}}}}/s");
    let mut waiters = Vec::new();
    let mut files = Vec::new();
    // Three build files sharing a job, and the first one submitted again
    // (its spec then recorded by reference: the restart replays that too).
    for n in [0, 1, 2, 0] {
        let build = format!(
            "jobs:\n  - name: shared-{n}\n    run: [\"{shared}\"]\n  - name: own-{n}\n    needs: [shared-{n}]\n    run: [\"cat {{{{dep:shared-{n}}}}}/s > {{{{out}}}}/o; echo {n} >> {{{{out}}}}/o\"]\n"
        );
        let file = match files.get(n) {
            Some(file) => std::path::PathBuf::clone(file),
            None => cluster.project(&format!("share{n}"), &build, &[]),
        };
        files.push(file.clone());
        waiters.push(
            cluster
                .client(&["submit", file.to_str().expect("utf-8"), "--wait", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("submit"),
        );
    }
    eventually("the shared job to start", || {
        std::fs::read_to_string(&counter).ok().filter(|t| !t.is_empty())
    });
    eventually("all four builds to be queued", || {
        let out = cluster.run(&["status", "--json"]);
        let builds: Value = serde_json::from_slice(&out.stdout).ok()?;
        (builds.as_array()?.len() == 4).then_some(())
    });
    std::fs::write(&go, "").expect("go");
    for waiter in waiters {
        let out = waiter.wait_with_output().expect("submit --wait ends");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(&counter).expect("counter"), "x\n", "four builds, one execution");
    let before: Vec<Vec<Value>> = (1..=4).map(|id| history(&cluster, id)).collect();
    assert!(before.iter().all(|h| h.last().is_some_and(|e| e["event"] == "build_finished")), "{before:?}");
    cluster.kill_coordinator();
    // Two of the builds have one spec: the later one's log record names
    // the earlier build instead of repeating it (the record is JSON, in the
    // database or its write-ahead log).
    let log: Vec<u8> = ["state.db", "state.db-wal"]
        .iter()
        .flat_map(|f| std::fs::read(cluster.dir.path().join("coordinator").join(f)).unwrap_or_default())
        .collect();
    let like = b"{\"SubmitLike\":{\"like\":";
    // (The write-ahead log may hold a page in several versions: a record
    // can be there more than once.)
    assert!(log.windows(like.len()).any(|w| w == like), "a submission recorded by reference");
    cluster.start_coordinator();
    let after: Vec<Vec<Value>> = (1..=4).map(|id| history(&cluster, id)).collect();
    assert_eq!(before, after, "the event history is the same after a restart");
}

/// `submit --wait` started while the coordinator is down (restarting)
/// waits for it, saying so, and the build goes through once it is back.
#[test]
fn submit_wait_rides_out_a_coordinator_that_is_not_up_yet() {
    use std::io::{BufRead, BufReader};
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project("later", "jobs:\n  - name: a\n    run: \"true\"\n", &[]);
    cluster.kill_coordinator();
    let mut client = cluster
        .client(&["submit", file.to_str().expect("utf-8"), "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start drover submit");
    let mut lines = BufReader::new(client.stderr.take().expect("stderr")).lines();
    let said = lines.next().expect("a line").expect("read");
    assert!(said.contains("trying again for up to 60s"), "{said}");
    cluster.start_coordinator();
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    let status = client.wait().expect("wait for drover submit");
    let rest = rest.join().expect("stderr");
    assert!(status.success(), "{rest}");
    assert!(rest.contains("succeeded"), "{rest}");
}

/// An interrupt during `submit --wait --out`'s export stops it: the
/// client exits 1 at once, saying so, and the next export replaces what
/// was left half done.
#[test]
fn interrupting_an_export_stops_it() {
    use std::io::{BufRead, BufReader};
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let build =
        "jobs:\n  - name: many\n    run: \"mkdir {{out}}/d && cd {{out}}/d && seq 1 50000 | xargs touch\"\n";
    let file = cluster.project("interrupted", build, &[]);
    let out = cluster.dir.path().join("out");
    let mut client = cluster
        .client(&["submit", file.to_str().expect("utf-8"), "--wait", "--out", out.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start drover submit");
    eventually("the export to begin", || out.join(".drover-part+many").exists().then_some(()));
    assert!(Command::new("kill").args(["-INT", &client.id().to_string()]).status().expect("kill").success());
    let lines = BufReader::new(client.stderr.take().expect("stderr"));
    let said: Vec<String> = lines.lines().map_while(Result::ok).collect();
    let status = client.wait().expect("wait for drover submit");
    let said = said.join("\n");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("drover: interrupted; build"), "{said}");
    let (code, status) = wait_json(&cluster, &file, &["--out", out.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(std::fs::read_dir(out.join("many/d")).expect("exported").count(), 50000);
    assert!(!out.join(".drover-part+many").exists(), "the half-done export is gone");
}
