//! Job control through the real processes: `drover suspend` and `drover
//! resume` stop and continue a running job's processes, and so does
//! preemption with `evict = "suspend"`.

use crate::harness::{Cluster, eventually, follow_log, job, next_line};

/// The state letter of a process (`T` when stopped), from /proc.
fn proc_state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Whether the shell is stopped: state `T`, or `D` while it waits in
/// `vfork` for a child that was stopped before it could `exec` (it then
/// runs nothing, and takes the stop once the child goes on).
fn stopped(pid: &str) -> bool {
    match proc_state(pid) {
        Some('T') => true,
        Some('D') => std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let mut fields = stat.rsplit(')').next().unwrap_or_default().split_whitespace();
            fields.next() == Some("T") && fields.next() == Some(pid)
        }),
        _ => false,
    }
}

/// Submits a build of `yaml` (project `name`) and, once it runs, follows
/// the log of its job `job` (see [`follow_log`]).
fn follow_running(
    cluster: &Cluster,
    name: &str,
    yaml: &str,
    job: &str,
) -> (u64, std::process::Child, std::sync::mpsc::Receiver<String>) {
    let build = cluster.submit(&cluster.project(name, yaml, &[]));
    eventually("the job to start", || (cluster.status(build)["state"] == "running").then_some(()));
    let (follow, lines) = follow_log(cluster, build, job);
    (build, follow, lines)
}

#[test]
fn suspend_stops_a_running_job_and_resume_continues_it() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let (pidfile, gate) = (cluster.scratch("pid"), cluster.scratch("gate"));
    let file = cluster.project(
        "ctl",
        &format!("jobs:\n  - name: long\n    run: \"echo $$ > {pidfile}; while [ ! -e {gate} ]; do sleep 0.05; done\"\n"),
        &[],
    );
    let build = cluster.submit(&file);
    let pid = eventually("the job to start", || {
        let pid = std::fs::read_to_string(&pidfile).ok()?;
        let pid = pid.trim().to_owned();
        (!pid.is_empty()).then_some(pid)
    });
    assert!(!stopped(&pid));

    let out = cluster.run(&["suspend", &build.to_string(), "long"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually("the job's shell stopped", || stopped(&pid).then_some(()));
    let status = cluster.status(build);
    assert_eq!(job(&status, "long")["state"], "running");
    assert_eq!(job(&status, "long")["detail"], "suspended");
    // Resuming a job that is not suspended, or a job that is not there, is
    // refused with a clear error.
    let again = cluster.run(&["suspend", &build.to_string(), "nope"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("no job \"nope\""), "{again:?}");
    // Suspending the whole build again says its job is suspended already.
    let again = cluster.run(&["suspend", &build.to_string()]);
    assert_eq!(again.status.code(), Some(2));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("its 1 running job(s) are suspended already"), "{err}");

    let out = cluster.run(&["resume", &build.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually("the job's shell running again", || (!stopped(&pid)).then_some(()));
    let out = cluster.run(&["resume", &build.to_string(), "long"]);
    assert_eq!(out.status.code(), Some(2), "not suspended any more");

    std::fs::write(&gate, "").expect("open the gate");
    let done = eventually("the build to finish", || {
        let status = cluster.status(build);
        (status["state"] == "succeeded").then_some(status)
    });
    assert_eq!(job(&done, "long")["state"], "succeeded");
    let events = cluster.run(&["status", &build.to_string(), "--events"]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("\"job_suspended\"") && events.contains("\"job_resumed\""), "{events}");
}

#[test]
fn logs_follow_streams_a_running_job_until_it_ends() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let gate = cluster.scratch("gate");
    let (build, mut follow, lines) = follow_running(
        &cluster,
        "follow",
        &format!(
            "jobs:\n  - name: talk\n    run: \"echo one; while [ ! -e {gate} ]; do sleep 0.05; done; echo two\"\n  \
                 - name: after\n    needs: [talk]\n    run: \"echo three\"\n"
        ),
        "talk",
    );
    let next = || next_line(&lines);
    assert_eq!(next().as_deref(), Some("one"), "printed while the job runs");
    // A job that has not started yet is waited for.
    let mut later = cluster
        .client(&["logs", &build.to_string(), "after", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("drover logs --follow");
    let mut later_err = BufReader::new(later.stderr.take().expect("stderr"));
    let mut waiting = String::new();
    later_err.read_line(&mut waiting).expect("read");
    assert!(waiting.contains("job after of build") && waiting.contains("has not started yet"), "{waiting}");
    std::fs::write(&gate, "").expect("open the gate");
    assert_eq!(next().as_deref(), Some("two"));
    assert_eq!(next(), None, "the stream ends with the job");
    assert!(follow.wait().expect("wait").success());
    let later = later.wait_with_output().expect("wait");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut later_err, &mut rest).expect("read");
    assert!(later.status.success(), "{rest}");
    assert_eq!(String::from_utf8_lossy(&later.stdout), "three\n");
    // Once the stream ends, it says how the job ended.
    assert!(rest.contains("the run ended; job after ended succeeded"), "{rest}");
}

/// A follow of a job that fails and runs again (`retry_on_failure`) goes
/// on into the rerun's log, and exits with the job's result: 0 for the
/// rerun that passed, 1 for a job that failed.
#[test]
fn logs_follow_goes_on_into_a_rerun_and_exits_with_the_jobs_result() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let (gate, marker) = (cluster.scratch("gate"), cluster.scratch("ran-once"));
    let (build, mut follow, lines) = follow_running(
        &cluster,
        "follow-rerun",
        &format!(
            "jobs:\n  - name: flaky\n    retry_on_failure: 1\n    run: \"if [ -e {marker} ]; then echo second; else touch {marker}; echo first; while [ ! -e {gate} ]; do sleep 0.05; done; exit 5; fi\"\n  \
                 - name: broken\n    needs: [flaky]\n    run: \"echo last words; exit 3\"\n"
        ),
        "flaky",
    );
    assert_eq!(next_line(&lines).as_deref(), Some("first"));
    std::fs::write(&gate, "").expect("open the gate");
    assert_eq!(next_line(&lines).as_deref(), Some("second"), "the rerun's log follows");
    assert_eq!(next_line(&lines), None, "the stream ends with the job");
    assert!(follow.wait().expect("wait").success(), "the job passed on its rerun");
    let broken = cluster.run(&["logs", &build.to_string(), "broken", "--follow"]);
    assert_eq!(String::from_utf8_lossy(&broken.stdout), "last words\n");
    let said = String::from_utf8_lossy(&broken.stderr);
    assert_eq!(broken.status.code(), Some(1), "{said}");
    assert!(said.contains("the run ended; job broken ended failed (exit code 3)"), "{said}");
}

/// A follow of a job whose worker is killed goes on into the job's next
/// run on another worker, and exits with its result.
#[test]
fn logs_follow_goes_on_into_the_run_after_a_lost_worker() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    cluster.add_worker("w2", 1, &[]);
    let marker = cluster.scratch("ran-once");
    let (build, mut follow, lines) = follow_running(
        &cluster,
        "follow-lost",
        &format!(
            "jobs:\n  - name: long\n    run: \"if [ -e {marker} ]; then echo second; else touch {marker}; echo first; sleep 600; fi\"\n"
        ),
        "long",
    );
    assert_eq!(next_line(&lines).as_deref(), Some("first"));
    let worker = job(&cluster.status(build), "long")["worker"].as_str().expect("its worker").to_owned();
    cluster.kill_worker(&worker);
    assert_eq!(next_line(&lines).as_deref(), Some("second"), "the next run's log follows");
    assert_eq!(next_line(&lines), None, "the stream ends with the job");
    assert!(follow.wait().expect("wait").success(), "the job passed on its next run");
}

/// A follow whose coordinator restarts takes up where it was: every line
/// the job writes comes once, in order, and it ends with the job.
#[test]
fn logs_follow_rides_through_a_coordinator_restart() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let gate = cluster.scratch("gate");
    let (_, mut follow, lines) = follow_running(
        &cluster,
        "follow-restart",
        &format!(
            "jobs:\n  - name: talk\n    run: \"echo one; while [ ! -e {gate} ]; do sleep 0.05; done; echo two\"\n"
        ),
        "talk",
    );
    let next = || next_line(&lines);
    assert_eq!(next().as_deref(), Some("one"));
    cluster.kill_coordinator();
    cluster.start_coordinator();
    std::fs::write(&gate, "").expect("open the gate");
    assert_eq!(next().as_deref(), Some("two"), "the follow went on after the restart");
    assert_eq!(next(), None, "and ended with the job, nothing twice");
    assert!(follow.wait().expect("wait").success());
}

#[test]
fn a_bad_kill_grace_is_refused_before_the_worker_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = crate::harness::drover()
        .args(["worker", "--coordinator", "http://127.0.0.1:9", "--kill-grace", "soon", "--cache"])
        .arg(dir.path())
        .output()
        .expect("run drover worker");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kill-grace"), "{out:?}");
}

/// With `preempt = true` and `evict = "suspend"`, a high-priority job that
/// finds the only slot taken suspends the low-priority job running there
/// (its shell stops, state `T`) and runs; once it ends, the low-priority
/// job continues and succeeds in its first attempt.
#[test]
fn preemption_suspends_the_victim_and_resumes_it_after_the_preemptor() {
    let mut cluster = Cluster::configured(None, "preempt = true\nevict = \"suspend\"\n");
    cluster.add_worker("w1", 1, &[]);
    let job_file = |name: &str, priority: i32, pidfile: &str, gate: &str| {
        format!(
            "jobs:\n  - name: {name}\n    priority: {priority}\n    run: \"echo $$ > {pidfile}; while [ ! -e {gate} ]; do sleep 0.05; done\"\n"
        )
    };
    let (low_pid, low_gate) = (cluster.scratch("low-pid"), cluster.scratch("low-gate"));
    let (high_pid, high_gate) = (cluster.scratch("high-pid"), cluster.scratch("high-gate"));
    let pid_in = |file: &str| {
        let pid = std::fs::read_to_string(file).ok()?;
        let pid = pid.trim().to_owned();
        (!pid.is_empty()).then_some(pid)
    };
    let low_file = cluster.project("low", &job_file("low", 0, &low_pid, &low_gate), &[]);
    let low = cluster.submit(&low_file);
    let pid = eventually("the low-priority job to start", || pid_in(&low_pid));
    assert!(!stopped(&pid));

    let high_file = cluster.project("high", &job_file("high", 5, &high_pid, &high_gate), &[]);
    let high = cluster.submit(&high_file);
    // The preemptor runs on the worker's only slot (and its only builder)
    // while the victim's processes are stopped, not killed.
    eventually("the high-priority job to start", || pid_in(&high_pid));
    eventually("the low-priority job's shell stopped", || stopped(&pid).then_some(()));
    let status = cluster.status(low);
    assert_eq!(job(&status, "low")["state"], "running", "{status}");
    let detail = job(&status, "low")["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.starts_with("suspended (evicted by high"), "{status}");

    std::fs::write(&high_gate, "").expect("open the high gate");
    eventually("the high-priority build to finish", || {
        (cluster.status(high)["state"] == "succeeded").then_some(())
    });
    eventually("the low-priority job's shell running again", || (!stopped(&pid)).then_some(()));
    std::fs::write(&low_gate, "").expect("open the low gate");
    let done = eventually("the low-priority build to finish", || {
        let status = cluster.status(low);
        (status["state"] == "succeeded").then_some(status)
    });
    assert_eq!(job(&done, "low")["state"], "succeeded", "{done}");
    assert_eq!(job(&done, "low")["attempts"], 1, "{done}");
    let events = cluster.run(&["status", &low.to_string(), "--events"]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("\"evicted_by\"") && events.contains("\"job_resumed\""), "{events}");
    assert!(!events.contains("\"job_requeued\""), "{events}");
}

/// Output into a pipe nobody reads any more (`drover workers | head -1`
/// once `head` is done) ends the command quietly with 141, as SIGPIPE
/// would, instead of a panic and its backtrace: lines (`workers`) and a
/// streamed log (`logs`) alike.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let id =
        cluster.submit(&cluster.project("talk", "jobs:\n  - name: talk\n    run: [\"seq 100000\"]\n", &[]));
    assert_eq!(cluster.final_status(id)["state"], "succeeded");
    let id = id.to_string();
    for args in [&["workers"][..], &["logs", &id, "talk"]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = cluster
            .client(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run drover");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// `drover serve` says what its cluster does, without `-v`: a worker that
/// registers, a build accepted and how it ended, a worker lost.
#[test]
fn the_coordinator_logs_builds_and_workers() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let id = cluster.submit(&cluster.project(
        "told",
        "name: told\njobs:\n  - name: a\n    run: [\"true\"]\n",
        &[],
    ));
    assert_eq!(cluster.final_status(id)["state"], "succeeded");
    cluster.kill_worker("w1");
    let has = |lines: &[String], words: &[&str]| lines.iter().any(|l| words.iter().all(|w| l.contains(w)));
    let log = eventually("the coordinator to log the worker's loss", || {
        let log = cluster.coordinator_log();
        has(&log, &["worker lost (it missed its lease)", "w1"]).then_some(log)
    });
    assert!(has(&log, &["worker registered", "w1"]), "{log:#?}");
    assert!(has(&log, &["build accepted", &format!("build={id}"), "jobs=1"]), "{log:#?}");
    assert!(has(&log, &["build ended", &format!("build={id}"), "succeeded", "1 succeeded"]), "{log:#?}");
}
