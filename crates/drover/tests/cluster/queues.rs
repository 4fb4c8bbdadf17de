//! Queues and quotas through the real processes: the coordinator's config
//! declares them, builds name them, `drover queues` shows them.

use serde_json::Value;

use crate::harness::{Cluster, drover, eventually};

const QUEUES: &str = r#"
[[queues]]
name = "capped"
capability = { slots = 1 }

[[queues]]
name = "open"
weight = 3

[tenants]
ci = "capped"
"#;

fn queue<'a>(queues: &'a Value, name: &str) -> &'a Value {
    queues.as_array().expect("queues").iter().find(|q| q["name"] == name).expect("queue listed")
}

#[test]
fn a_capped_queue_runs_one_job_at_a_time_and_drover_queues_shows_it() {
    let mut cluster = Cluster::configured(None, QUEUES);
    cluster.add_worker("w1", 3, &[]);
    let gate = cluster.scratch("gate");
    // Three independent jobs that hold their slot until the gate opens.
    let wait = format!("while [ ! -e {gate} ]; do sleep 0.05; done; echo done > {{{{out}}}}/x");
    let jobs: String =
        (1..=3).map(|i| format!("  - name: j{i}\n    run: \"{wait}\"\n    env: {{N: \"{i}\"}}\n")).collect();
    let file = cluster.project("capped", &format!("jobs:\n{jobs}"), &[]);
    let submit = cluster.run(&["submit", file.to_str().expect("utf-8"), "--tenant", "ci"]);
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    let id = String::from_utf8_lossy(&submit.stdout).trim().to_owned();

    // The tenant maps to `capped`: one job runs, two wait, on a worker with
    // three free slots.
    let queues = eventually("one capped job running", || {
        let out = cluster.run(&["queues", "--json"]);
        let queues: Value = serde_json::from_slice(&out.stdout).ok()?;
        (queue(&queues, "capped")["running"] == 1).then_some(queues)
    });
    let capped = queue(&queues, "capped");
    assert_eq!(capped["queued_jobs"], 2, "{queues}");
    assert_eq!(capped["capability"]["slots_milli"], 1000);
    // No limit on CPU or memory: `null`, not a number past what JSON
    // readers keep exactly.
    assert_eq!(capped["capability"]["cpu"], Value::Null, "{queues}");
    assert_eq!(capped["capability"]["memory"], Value::Null, "{queues}");
    assert_eq!(queue(&queues, "open")["weight"], 3);
    let table = cluster.run(&["queues"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.lines().any(|l| l.starts_with("capped") && l.contains(" 1 ")), "{table}");

    // The waiting jobs say why.
    let status = cluster.status(id.parse().expect("build ID"));
    let waiting: Vec<&str> = status["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter(|j| j["state"] == "queued")
        .filter_map(|j| j["detail"].as_str())
        .collect();
    assert_eq!(waiting, ["queue capped is at its capability"; 2], "{status}");

    std::fs::write(&gate, "").expect("open the gate");
    let finished = eventually("the build to finish", || {
        let out = cluster.run(&["status", &id, "--json"]);
        let status: Value = serde_json::from_slice(&out.stdout).ok()?;
        (status["state"] == "succeeded").then_some(status)
    });
    assert_eq!(finished["jobs"].as_array().map(Vec::len), Some(3));
}

#[test]
fn an_unknown_queue_is_refused_before_anything_runs() {
    let mut cluster = Cluster::configured(None, QUEUES);
    cluster.add_worker("w1", 1, &[]);
    let marker = cluster.scratch("ran");
    let file = cluster.project("q", &format!("jobs:\n  - name: a\n    run: \"touch {marker}\"\n"), &[]);
    let out = cluster.run(&["submit", file.to_str().expect("utf-8"), "--queue", "nowhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no queue named nowhere"), "{out:?}");
    let builds = cluster.run(&["status", "--json"]);
    assert!(String::from_utf8_lossy(&builds.stdout).trim().trim_matches(['[', ']']).trim().is_empty());
    assert!(!std::path::Path::new(&marker).exists());
}

#[test]
fn a_bad_queue_config_stops_the_coordinator_with_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[[queues]]\nname = \"a\"\nweight = 0\n\n[[queues]]\nname = \"b\"\nparent = \"missing\"\n\n[tenants]\nci = \"nope\"\n",
    )
    .expect("config");
    let out = drover()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data")
        .arg(dir.path().join("data"))
        .output()
        .expect("run drover serve");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for problem in [
        "queue a: weight must be at least 1",
        "queue b: no parent queue named missing",
        "tenant ci: no queue named nope",
    ] {
        assert!(err.contains(problem), "missing {problem:?} in {err}");
    }
}

#[test]
fn a_gang_waits_for_room_for_all_its_jobs_then_starts_them_together() {
    let mut cluster = Cluster::new();
    // A job takes one CPU by default: give the worker enough for all four.
    cluster.add_worker("w1", 3, &["--cpu", "8"]);
    let gate = cluster.scratch("gate");
    let blocker = cluster.project(
        "blocker",
        &format!("jobs:\n  - name: hold\n    run: \"while [ ! -e {gate} ]; do sleep 0.05; done\"\n"),
        &[],
    );
    let blocker = cluster.submit(&blocker);
    eventually("the blocker running", || (cluster.status(blocker)["state"] == "running").then_some(()));
    // Three jobs that each wait until all three have started: they finish
    // only if they run at the same time.
    let marks = cluster.scratch("marks");
    std::fs::create_dir_all(&marks).expect("marks dir");
    let job = |i: u32| {
        format!(
            "  - name: shard{i}\n    run: \"touch {marks}/{i}; until [ -e {marks}/1 ] && [ -e {marks}/2 ] && [ -e {marks}/3 ]; do sleep 0.05; done\"\n    gang: {{name: shards, min_available: 3}}\n"
        )
    };
    let gang = cluster.project("gang", &format!("jobs:\n{}{}{}", job(1), job(2), job(3)), &[]);
    let gang = cluster.submit(&gang);
    // Two slots are free beside the blocker, not three: nothing of the gang
    // starts (the decision is made when the build is submitted).
    let status = cluster.status(gang);
    for i in 1..=3 {
        let shard = crate::harness::job(&status, &format!("shard{i}"));
        assert_eq!(shard["state"], "queued", "{status}");
        let why = shard["detail"].as_str().unwrap_or_default();
        assert!(why.contains("its gang needs 3 of its jobs to start at once"), "{status}");
    }
    std::fs::write(&gate, "").expect("open the gate");
    let done = eventually("the gang build to finish", || {
        let status = cluster.status(gang);
        matches!(status["state"].as_str(), Some("succeeded" | "failed")).then_some(status)
    });
    assert_eq!(done["state"], "succeeded", "{done}");
}
