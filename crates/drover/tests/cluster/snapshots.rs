//! A coordinator that writes its state down: its log stays short, a
//! coordinator killed with SIGKILL recovers from the snapshot and the
//! records after it, and scheduler settings changed meanwhile apply, or
//! the start says why they cannot yet.

use std::path::Path;
use std::process::Stdio;

use serde_json::Value;

use crate::harness::{Cluster, drover, eventually, http, wait_json};

/// Test settings, a state written down after every turn, and `extra`.
fn config(extra: &str) -> String {
    format!("[scheduler]\nlease_timeout = \"1500ms\"\n[store]\nsnapshot_after = \"1\"\n{extra}")
}

const QUEUES: &str = "[[queues]]\nname = \"ci\"\nweight = 1\n";

/// The records the log holds behind its snapshot, and the last input the
/// snapshot holds.
fn log(cluster: &Cluster) -> (u64, u64) {
    let store =
        drover_store::Store::open(&cluster.dir.path().join("coordinator").join("state.db")).expect("store");
    let after = store.latest_snapshot().expect("snapshot").map_or(0, |s| s.seq);
    let mut records = 0;
    store.replay(0, |_| records += 1).expect("replay");
    (records, after)
}

fn build(cluster: &Cluster, name: &str, command: &str) -> std::path::PathBuf {
    cluster.project(name, &format!("jobs:\n  - name: {name}\n    run: [\"{command}\"]\n"), &[])
}

#[test]
fn a_coordinator_recovers_from_its_snapshot_after_sigkill() {
    let mut cluster = Cluster::with_config(None, &config(""));
    cluster.add_worker("w1", 2, &[]);
    let mut ended = Vec::new();
    for n in 0..12 {
        let file = build(&cluster, &format!("b{n}"), &format!("echo {n} > {{{{out}}}}/n"));
        let (code, status) = wait_json(&cluster, &file, &[]);
        assert_eq!(code, Some(0), "{status}");
        ended.push(status);
    }
    // Written down in the background, then the records it holds dropped a
    // few thousand a turn.
    eventually("most of the log to go into a snapshot", || {
        let (records, after) = log(&cluster);
        (after > 0 && records < after).then_some(())
    });
    // `/metrics` shows the snapshots written and the last one's size.
    let (code, body) = http(&cluster.url, "GET", "/metrics", b"");
    assert_eq!(code, 200);
    let page = String::from_utf8(body).expect("utf-8");
    let value = |name: &str| -> u64 {
        let line =
            page.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{page}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
    };
    assert!(value("drover_snapshots_total{result=\"written\"}") >= 1, "{page}");
    assert_eq!(value("drover_snapshots_total{result=\"failed\"}"), 0, "{page}");
    assert!(value("drover_snapshot_bytes") > 0, "{page}");
    cluster.kill_coordinator();
    cluster.start_coordinator();
    for status in &ended {
        let id = status["id"].as_u64().expect("id");
        assert_eq!(&cluster.status(id), status, "build {id} is as it was");
    }
    // The worker registers again, and the cluster builds on.
    let file = build(&cluster, "after", "echo after > {{out}}/n");
    let (code, status) = wait_json(&cluster, &file, &[]);
    assert_eq!((code, status["id"].as_u64()), (Some(0), Some(13)), "{status}");
}

/// `drover serve` on the cluster's data with `config`: its exit code and
/// standard error, once it has either failed or started (then it is
/// killed).
fn serve_once(cluster: &Cluster, config: &str) -> (Option<i32>, String) {
    let path = cluster.dir.path().join("other.toml");
    std::fs::write(&path, config).expect("config");
    let mut child = drover()
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(cluster.dir.path().join("coordinator"))
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut stderr = String::new();
    use std::io::Read;
    let mut pipe = child.stderr.take().expect("stderr");
    let mut chunk = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut chunk) {
        if n == 0 {
            break;
        }
        stderr.push_str(&String::from_utf8_lossy(&chunk[..n]));
        if stderr.contains("listening on") {
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().expect("wait");
    (status.code(), stderr)
}

fn write_config(dir: &Path, config: &str) {
    std::fs::write(dir.join("config.toml"), config).expect("config");
}

#[test]
fn new_queues_wait_until_no_job_is_in_the_scheduler() {
    let mut cluster = Cluster::with_config(None, &config(""));
    cluster.add_worker("w1", 1, &[]);
    let go = cluster.scratch("go");
    let file = build(&cluster, "slow", &format!("while [ ! -e {go} ]; do sleep 0.02; done"));
    let id = cluster.submit(&file);
    eventually("the job to run", || (cluster.status(id)["state"] == "running").then_some(()));
    cluster.kill_coordinator();

    let (code, stderr) = serve_once(&cluster, &config(QUEUES));
    assert_eq!(code, Some(2), "the config is the input to change: {stderr}");
    assert!(
        stderr.contains("now: 1 queued or running") && stderr.contains("until those jobs are over"),
        "{stderr}"
    );
    // The settings the state has still start, and the build ends.
    cluster.start_coordinator();
    std::fs::write(&go, "").expect("go");
    assert_eq!(cluster.final_status(id)["state"], "succeeded");
    cluster.kill_coordinator();

    write_config(cluster.dir.path(), &config(QUEUES));
    cluster.start_coordinator();
    let out = cluster.run(&["queues", "--json"]);
    let queues: Value = serde_json::from_slice(&out.stdout).expect("queues JSON");
    assert!(queues.to_string().contains("\"ci\""), "{queues}");
    assert_eq!(cluster.status(id)["state"], "succeeded", "the history is kept");
}

/// A log with no snapshot, replayed at a start under new queue settings,
/// is replayed under the settings it was recorded under: the past does not
/// change (three jobs that ran at once stay run once each, on the same
/// runs), and the new settings apply from then on.
#[test]
fn new_settings_do_not_rewrite_a_replayed_past() {
    let capped = "[[queues]]\nname = \"capped\"\ncapability = { slots = 1 }\n[tenants]\nci = \"capped\"\n";
    let mut cluster = Cluster::configured(None, "");
    cluster.add_worker("w1", 3, &[]);
    let started = cluster.scratch("started");
    std::fs::create_dir(&started).expect("mkdir");
    // Each job waits until all three have started: they ran at once.
    let jobs: String = (0..3)
        .map(|i| {
            format!(
                "  - name: j{i}\n    run: [\"touch {started}/{i}; while [ $(ls {started} | wc -l) -lt 3 ]; do sleep 0.02; done\"]\n"
            )
        })
        .collect();
    let file = cluster.project("together", &format!("jobs:\n{jobs}"), &[]);
    let (code, before) = wait_json(&cluster, &file, &["--tenant", "ci"]);
    assert_eq!(code, Some(0), "{before}");
    cluster.kill_coordinator();
    let (records, snapshot) = log(&cluster);
    assert!(records > 0 && snapshot == 0, "a log with no snapshot: {records} records, snapshot {snapshot}");

    write_config(cluster.dir.path(), &format!("[scheduler]\nlease_timeout = \"1500ms\"\n{capped}"));
    cluster.start_coordinator();
    let id = before["id"].as_u64().expect("build ID");
    let after = cluster.status(id);
    assert_eq!(after["state"], "succeeded", "{after}");
    assert_eq!(after["jobs"], before["jobs"], "the same jobs, runs and workers after the restart");
    let out = cluster.run(&["queues", "--json"]);
    let queues: Value = serde_json::from_slice(&out.stdout).expect("queues JSON");
    assert!(queues.to_string().contains("\"capped\""), "the new settings apply: {queues}");
}
