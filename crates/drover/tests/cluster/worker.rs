//! The `drover worker` process itself: what it offers by default, what it
//! writes to a log file, how the cluster waits for it across a restart.

use std::process::{Child, Command, Stdio};

use crate::harness::{Cluster, drover, eventually, free_port, job};

/// A child process killed (and reaped) when dropped, so a failed test
/// leaves none behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker whose standard error goes to a file writes its log lines there
/// without ANSI colour codes: only a terminal gets them.
#[test]
fn a_workers_log_in_a_file_has_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("worker.log");
    // Nothing listens at the coordinator's address: the worker warns that
    // it cannot register, and keeps trying.
    let coordinator = format!("http://127.0.0.1:{}", free_port());
    let _worker = Killed(
        drover()
            .args(["worker", "-v", "--coordinator", &coordinator, "--slots", "1"])
            .arg("--cache")
            .arg(dir.path().join("cache"))
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start drover worker"),
    );
    let text = eventually("the worker to log that it cannot register", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("cannot register with the coordinator").then_some(text)
    });
    assert!(text.contains("WARN") && text.contains("INFO"), "log lines at both levels: {text}");
    assert!(!text.contains('\x1b'), "no escape codes in a log file: {text:?}");
}

/// A worker given more slots than the machine has CPUs (and no `--cpu`)
/// runs that many jobs of one CPU each at once: each job waits until all
/// have started (and fails after a minute, so a worker that holds one back
/// fails the build rather than the test's wait).
#[test]
fn a_worker_with_more_slots_than_cpus_runs_that_many_jobs_at_once() {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let slots = cpus + 1;
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", u32::try_from(slots).expect("slots"), &[]);
    let started = cluster.scratch("started");
    std::fs::create_dir(&started).expect("mkdir");
    let jobs: String = (0..slots)
        .map(|i| {
            format!(
                "  - name: j{i}\n    run: [\"touch {started}/{i}; n=0; while [ $(ls {started} | wc -l) -lt {slots} ]; \
                 do n=$((n+1)); [ $n -lt 1200 ] || exit 1; sleep 0.05; done\"]\n"
            )
        })
        .collect();
    let id = cluster.submit(&cluster.project("wide", &format!("jobs:\n{jobs}"), &[]));
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{slots} jobs of one CPU at once on {cpus} CPUs: {status}");
}

/// The only worker that can run a job is restarted: a job submitted while
/// it is away waits for it (the coordinator's `lost_worker_grace`), says
/// which worker it waits for, and runs once the worker registers again,
/// instead of failing as a job no worker could ever run.
#[test]
fn a_job_waits_for_its_only_capable_worker_to_come_back() {
    let mut cluster = Cluster::new();
    cluster.add_worker("plain", 1, &[]);
    cluster.add_worker("gpu", 1, &["--labels", "gpu=yes"]);
    cluster.kill_worker("gpu");
    eventually("worker gpu to be lost", || {
        let workers = cluster.workers_json();
        let alive = workers.as_array()?.iter().any(|w| w["name"] == "gpu" && w["alive"] == true);
        (!alive).then_some(())
    });
    let id = cluster.submit(&cluster.project(
        "restart",
        "jobs:\n  - name: train\n    labels: {gpu: \"yes\"}\n    run: [\"echo done > {{out}}/model\"]\n",
        &[],
    ));
    let status = cluster.status(id);
    let train = job(&status, "train");
    assert_eq!(train["state"], "queued", "{status}");
    let detail = train["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("no worker has label gpu=yes") && detail.contains("worker gpu could run it"),
        "{status}"
    );

    cluster.add_worker("gpu", 1, &["--labels", "gpu=yes"]);
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "train")["worker"], "gpu", "{status}");
}

/// A coordinator paused (stopped, a frozen VM) for longer than the lease
/// does not take its workers as lost when it goes on: it heard nothing
/// because it was not running, so time stood still for the cluster. The
/// running job finishes in its first run.
#[test]
fn a_paused_coordinator_loses_no_worker() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let started = cluster.scratch("started");
    let build = format!("jobs:\n  - name: long\n    run: \"touch {started}; sleep 5\"\n");
    let file = cluster.project("paused", &build, &[]);
    let id = cluster.submit(&file);
    eventually("the job to start", || std::path::Path::new(&started).exists().then_some(()));
    cluster.signal_coordinator("STOP");
    // The pause itself, twice the tests' 1.5 s lease: nothing to wait for.
    std::thread::sleep(std::time::Duration::from_secs(3));
    cluster.signal_coordinator("CONT");
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "long")["attempts"], 1, "{status}");
    let workers = cluster.workers_json();
    assert_eq!(workers[0]["alive"], true, "{workers}");
    assert!(
        cluster.coordinator_log().iter().any(|l| l.contains("the process paused")),
        "{:?}",
        cluster.coordinator_log()
    );
}

/// The children of process `pid` whose command line has `arg`.
fn children_with(pid: u32, arg: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let status = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
        let parent = status.lines().find_map(|l| l.strip_prefix("PPid:")).map(str::trim);
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if parent == Some(pid.to_string().as_str())
            && cmdline.split(|&b| b == 0).any(|part| part == arg.as_bytes())
        {
            found.push(child);
        }
    }
    found
}

/// A run whose supervisor is killed under it (its zygote SIGKILLed, as the
/// OOM killer would) goes back to the queue, as for a lost worker: the
/// worker failed it, not the job. It runs again and the build succeeds.
#[test]
fn a_run_whose_supervisor_is_killed_runs_again() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let runs = cluster.scratch("runs");
    let build = format!(
        "jobs:\n  - name: j\n    run: \"echo x >> {runs}; if [ $(wc -l < {runs}) -eq 1 ]; then sleep 60; fi; echo done \
         > {{{{out}}}}/f\"\n"
    );
    let file = cluster.project("zygote", &build, &[]);
    let id = cluster.submit(&file);
    eventually("the first run to start", || std::path::Path::new(&runs).exists().then_some(()));
    let zygotes = children_with(cluster.worker_pid("w1"), "__zygote");
    assert_eq!(zygotes.len(), 1, "one zygote: {zygotes:?}");
    let killed = Command::new("kill").args(["-KILL", &zygotes[0].to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = cluster.final_status(id);
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!(job(&status, "j")["attempts"], 2, "{status}");
}

/// `drover workers --drain NAME` drains a live worker (nothing new goes to
/// it) and lists the workers; an unknown name is an error.
#[test]
fn workers_drain_drains_a_worker_by_name() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &["--labels", "pin=w1"]);
    cluster.add_worker("w2", 1, &[]);
    let out = cluster.run(&["workers", "--drain", "w1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let workers: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let draining = |name: &str| {
        workers.as_array().expect("list").iter().find(|w| w["name"] == name).expect(name)["draining"].clone()
    };
    assert_eq!((draining("w1"), draining("w2")), (true.into(), serde_json::Value::Null), "{workers}");
    // Nothing new goes to it: by the time a job any worker may run is
    // done, the one only it may run still waits.
    let build =
        "jobs:\n  - name: a\n    labels: {pin: w1}\n    run: \"true\"\n  - name: b\n    run: \"true\"\n";
    let file = cluster.project("after", build, &[]);
    let id = cluster.submit(&file);
    let status = eventually("b to succeed", || {
        let status = cluster.status(id);
        (job(&status, "b")["state"] == "succeeded").then_some(status)
    });
    assert_eq!(job(&status, "a")["state"], "queued", "{status}");
    let out = cluster.run(&["workers", "--drain", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no live worker is named \"nope\""));
}

/// A build submitted as the coordinator comes back waits for the workers
/// to register again: a run handed to a worker before that would wait in a
/// mailbox the worker no longer polls, and be found lost (an attempt spent
/// for nothing) when it registered.
#[test]
fn a_build_submitted_as_the_coordinator_restarts_spends_no_attempt() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let file = cluster.project("restart", "jobs:\n  - name: a\n    run: \"echo a > {{out}}/a\"\n", &[]);
    let (code, status) = crate::harness::wait_json(&cluster, &file, &["--no-cache"]);
    assert_eq!(code, Some(0), "{status}");
    cluster.kill_coordinator();
    cluster.start_coordinator();
    let (code, status) = crate::harness::wait_json(&cluster, &file, &["--no-cache"]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(job(&status, "a")["attempts"], 1, "{status}");
}
