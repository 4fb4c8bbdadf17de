//! What a worker keeps in its cache directory, and what its log says: the
//! logs of its runs across a restart (a rolling upgrade stops each worker
//! with SIGTERM and starts it again on the same `--cache`), its new outputs
//! until they are pushed, however small the cache (and that the cache is
//! too small), and a failed run's detail on one line of its log.

use std::path::PathBuf;
use std::process::{Child, Stdio};

use crate::harness::{Cluster, drover, eventually, job, wait_json};

/// A worker drained with SIGTERM and started again on the same cache
/// serves the logs of the runs it had: what a job wrote, a job that wrote
/// nothing (an empty log, not an unknown run), and a stage log the worker
/// held in memory.
#[test]
fn a_worker_started_again_on_its_cache_serves_the_logs_of_its_earlier_runs() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 2, &[]);
    let file = cluster.project(
        "logs",
        "name: logs\njobs:\n\
         \x20 - name: loud\n    run: [\"echo to stdout; echo to stderr >&2\"]\n\
         \x20 - name: quiet\n    run: [\"true\"]\n\
         \x20 - name: pushed\n    run: [\"echo out > {{out}}/f\"]\n",
        &[],
    );
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    let id = status["id"].to_string();
    let logs = |cluster: &Cluster, args: &[&str]| {
        let mut all = vec!["logs", &id];
        all.extend_from_slice(args);
        let out = cluster.run(&all);
        assert!(out.status.success(), "logs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The push runs in the background: wait for its line.
    eventually("the output to be pushed", || {
        logs(&cluster, &["pushed", "--stage", "push"]).contains("pushed").then_some(())
    });

    cluster.signal_worker("w1", "TERM");
    assert!(cluster.worker_exit("w1").success(), "the worker drains and exits");
    cluster.add_worker("w1", 2, &[]);

    assert_eq!(logs(&cluster, &["loud"]), "to stdout\n");
    assert_eq!(logs(&cluster, &["loud", "--stderr"]), "to stderr\n");
    assert_eq!(logs(&cluster, &["quiet"]), "", "a run that wrote nothing has an empty log");
    assert!(logs(&cluster, &["pushed", "--stage", "push"]).contains("to the shared cache"));
}

/// A worker killed with SIGKILL (it never says which runs it keeps) and
/// started again on its cache and address still knows a run that wrote
/// nothing: its log is empty, not unknown.
#[test]
fn a_killed_worker_started_again_knows_its_silent_runs() {
    let mut cluster = Cluster::new();
    let listen = format!("127.0.0.1:{}", crate::harness::free_port());
    cluster.add_worker("w1", 2, &["--listen", &listen]);
    let file = cluster.project(
        "silent",
        "jobs:\n  - name: quiet\n    run: [\"true\"]\n  - name: loud\n    run: [\"echo hello\"]\n",
        &[],
    );
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    let id = status["id"].to_string();
    cluster.kill_worker("w1");
    cluster.add_worker("w1", 2, &["--listen", &listen]);
    for (job, expected) in [("quiet", ""), ("loud", "hello\n")] {
        let out = cluster.run(&["logs", &id, job]);
        assert!(out.status.success(), "logs {job}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }
}

/// An output finished while the coordinator is down is pushed to the
/// shared cache once it is back: the push is tried again, not given up at
/// the first refused connection. (The output is larger than the pipe the
/// pack goes through, so the pack, too, fails when the request does: the
/// request's failure is the one that counts.)
#[test]
fn an_output_finished_while_the_coordinator_is_down_is_pushed_once_it_is_back() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let gate = cluster.scratch("gate");
    let file = cluster.project(
        "push-later",
        &format!(
            "jobs:\n  - name: made\n    run: [\"while [ ! -e {gate} ]; do sleep 0.05; done; \
             head -c 1048576 /dev/zero > {{{{out}}}}/f\"]\n"
        ),
        &[],
    );
    let build = cluster.submit(&file);
    eventually("the job to start", || (cluster.status(build)["state"] == "running").then_some(()));
    let id = job(&cluster.status(build), "made")["id"].as_str().expect("the job's ID").to_owned();
    cluster.kill_coordinator();
    std::fs::write(&gate, "").expect("open the gate");
    // The output is committed, and its push (right after) is refused
    // while the coordinator is down; then the coordinator comes back.
    let committed = cluster.dir.path().join("w1/cache/artifacts").join(&id[..2]).join(&id);
    eventually("the output to be committed", || committed.exists().then_some(()));
    cluster.start_coordinator();
    assert_eq!(cluster.final_status(build)["state"], "succeeded");
    eventually("the output to reach the shared cache", || {
        let (status, _) = crate::harness::http(&cluster.url, "GET", &format!("/v1/cache/{id}"), b"");
        (status == 200).then_some(())
    });
}

/// A worker whose cache holds about one output (150 KiB for outputs of
/// 100 kB), running three jobs at once with one pusher: each new output
/// would evict the one before it while it waits to be pushed, and its push
/// would fail (the coordinator said "pack stream truncated"). An output
/// stays in the cache until it is pushed, so every push succeeds, and the
/// worker's log says that its cache is too small.
#[test]
fn a_small_cache_keeps_each_new_output_until_it_is_pushed() {
    let cluster = Cluster::new();
    let worker = LoggedWorker::start(&cluster, "w1", &["--cache-size", "150Ki", "--pushers", "1"]);
    let jobs: String = (1..=6)
        .map(|i| {
            format!(
                "  - name: gen{i}\n    run: [\"head -c 100000 /dev/urandom > {{{{out}}}}/data; echo {i}\"]\n"
            )
        })
        .collect();
    let file = cluster.project("small", &format!("name: small\njobs:\n{jobs}"), &[]);
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    let id = status["id"].to_string();
    for i in 1..=6 {
        let name = format!("gen{i}");
        let log = eventually(&format!("{name}'s push to end"), || {
            let out = cluster.run(&["logs", &id, &name, "--stage", "push"]);
            let log = String::from_utf8_lossy(&out.stdout).into_owned();
            (!log.is_empty()).then_some(log)
        });
        assert!(log.starts_with("pushed "), "{name}: {log}");
    }
    let log = worker.log();
    assert!(log.contains("the cache is too small"), "{log}");
}

/// The worker logs a failed run's detail, with the last lines of the job's
/// standard error, on one line: every line of its log is an event of its
/// own. The build's status keeps the lines.
#[test]
fn a_failed_runs_detail_is_one_line_of_the_workers_log() {
    let cluster = Cluster::new();
    let worker = LoggedWorker::start(&cluster, "w1", &[]);
    let file = cluster.project(
        "broken",
        "name: broken\njobs:\n  - name: broken\n    \
         run: [\"echo first line >&2; echo second line >&2; exit 3\"]\n",
        &[],
    );
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(1), "{status}");
    assert_eq!(job(&status, "broken")["detail"], "exit code 3; stderr:\nfirst line\nsecond line");
    let log = eventually("the worker to log the failure", || {
        let log = worker.log();
        log.contains("run failed").then_some(log)
    });
    let line = log.lines().find(|line| line.contains("run failed")).expect("the failure's line");
    assert!(line.contains("first line ⏎ second line"), "{line}");
    assert!(!log.lines().any(|line| line.starts_with("second line")), "{log}");
}

/// A `drover worker -v` process with its log (standard error) in a file,
/// registered with the cluster; killed (and reaped) when dropped.
struct LoggedWorker {
    child: Child,
    log: PathBuf,
}

impl LoggedWorker {
    fn start(cluster: &Cluster, name: &str, extra: &[&str]) -> LoggedWorker {
        let log = cluster.dir.path().join(format!("{name}.log"));
        let child = drover()
            .args(["worker", "-v", "--coordinator", &cluster.url, "--name", name, "--slots", "3"])
            .arg("--cache")
            .arg(cluster.dir.path().join(name))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start drover worker");
        let worker = LoggedWorker { child, log };
        eventually(&format!("worker {name} to register"), || {
            let workers = cluster.workers_json();
            workers.as_array()?.iter().any(|w| w["name"] == name && w["alive"] == true).then_some(())
        });
        worker
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).expect("the worker's log")
    }
}

impl Drop for LoggedWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
