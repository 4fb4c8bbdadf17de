//! A start from a snapshot, at the edges: a snapshot this drover cannot
//! read (another format, a missing or damaged file) stops the start,
//! saying why, and leaves the log and the files as they were; settings the
//! state cannot take stop it too and record nothing; files of snapshots the
//! log does not name are deleted, and records left behind a snapshot are
//! dropped. (The cluster tests in `crates/drover` restart real coordinators
//! from the snapshots they wrote.)

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use drover_proto::{BuildSpec, Hash32, JobDef, OnError, RegisterRequest, SubmitRequest, WorkerCapacity};
use drover_solver::{Input, SNAPSHOT_FORMAT, Solver};

/// Writes `solver` as the coordinator writes a snapshot: CBOR, then the
/// BLAKE3 digest of it.
fn snapshot_file(path: &Path, solver: &Solver) {
    let mut body = Vec::new();
    ciborium::into_writer(solver, &mut body).expect("encode");
    let digest = blake3::hash(&body);
    body.extend_from_slice(digest.as_bytes());
    std::fs::write(path, body).expect("snapshot file");
}

/// A log of three ticks, the first two in a snapshot `snapshot-2.cbor`
/// (format `format`) holding `solver`'s state, if given.
fn log_with_snapshot(dir: &Path, format: &str, solver: Option<&Solver>) {
    let mut store = drover_store::Store::open(&dir.join("state.db")).expect("store");
    let tick = serde_json::to_vec(&Input::Tick).expect("json");
    store.append((0..3).map(|at| (1_000 + at, &tick[..]))).expect("append");
    if let Some(solver) = solver {
        snapshot_file(&dir.join("snapshot-2.cbor"), solver);
    }
    store.snapshot(2, format, "snapshot-2.cbor").expect("snapshot");
}

fn records(dir: &Path) -> Vec<u64> {
    let store = drover_store::Store::open(&dir.join("state.db")).expect("store");
    let mut seqs = Vec::new();
    store.replay(0, |r| seqs.push(r.seq)).expect("replay");
    seqs
}

#[tokio::test]
async fn a_snapshot_of_another_format_is_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    log_with_snapshot(dir.path(), "drover-solver-0", Some(&Solver::new(config.core.clone())));
    let refused = drover_coordinator::start(config).await.expect_err("unreadable");
    let message = refused.to_string();
    assert!(
        message.contains("\"drover-solver-0\"") && message.contains("another version of drover"),
        "{message}"
    );
    assert_eq!(records(dir.path()), [1, 2, 3], "nothing was recorded or dropped");
    assert!(dir.path().join("snapshot-2.cbor").exists());
}

/// A missing file, one that is not CBOR, and one whose digest does not
/// match are each named; a snapshot file the log does not name is kept
/// meanwhile (it may be all there is, if the log lost its latest entries).
#[tokio::test]
async fn a_missing_or_damaged_snapshot_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    log_with_snapshot(dir.path(), SNAPSHOT_FORMAT, None);
    let other = dir.path().join("snapshot-9.cbor");
    snapshot_file(&other, &Solver::new(config.core.clone()));
    let missing = drover_coordinator::start(config.clone()).await.expect_err("missing");
    assert!(missing.to_string().contains("snapshot-2.cbor"), "{missing}");
    assert!(other.exists(), "an unnamed snapshot file was deleted before the named one was read");

    let path = dir.path().join("snapshot-2.cbor");
    std::fs::write(&path, b"\xff\x00 not CBOR").expect("damaged");
    let damaged = drover_coordinator::start(config.clone()).await.expect_err("damaged");
    assert!(damaged.to_string().contains("cannot read the snapshot"), "{damaged}");

    snapshot_file(&path, &Solver::new(config.core.clone()));
    let mut bytes = std::fs::read(&path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).expect("flip a bit");
    let flipped = drover_coordinator::start(config).await.expect_err("a bit flipped");
    assert!(flipped.to_string().contains("checksum does not match"), "{flipped}");
    assert_eq!(records(dir.path()), [1, 2, 3]);
}

/// A snapshot whose core holds a job cannot take new queues: the start is
/// refused, naming why, and records nothing (not even the restart).
#[tokio::test]
async fn settings_the_state_cannot_take_record_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    let mut solver = Solver::new(config.core.clone());
    let worker = RegisterRequest {
        name: "w".into(),
        url: "http://w.invalid".into(),
        capacity: WorkerCapacity { slots: 1, cpu_millis: 4_000, memory: 1 << 30, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running: Vec::new(),
    };
    solver.handle(drover_core::Millis(1_000), Input::Register(worker)).expect("register");
    let job = JobDef { commands: vec!["true".into()], ..JobDef::new("a", Hash32([3; 32])) };
    let build = BuildSpec { name: "b".into(), sources: Vec::new(), jobs: vec![job] };
    let submit = SubmitRequest {
        build: build.into(),
        tenant: "t".into(),
        no_cache: false,
        on_error: OnError::Quit,
        max_parallel: None,
        queue: None,
    };
    solver.handle(drover_core::Millis(1_000), Input::Submit(submit)).expect("submit");
    log_with_snapshot(dir.path(), SNAPSHOT_FORMAT, Some(&solver));
    let mut changed = config;
    changed.core.queues = vec![drover_core::QueueConfig { name: "ci".into(), ..Default::default() }];
    let refused = drover_coordinator::start(changed).await.expect_err("a job is in the core");
    let message = refused.to_string();
    assert!(message.contains("now: 1 queued or running") && message.contains("drover status"), "{message}");
    assert_eq!(records(dir.path()), [1, 2, 3], "a refused start records nothing");
}

/// Snapshot files a crash left unrecorded (finished or cut short) are
/// deleted at the start; other files are not, whatever their names.
#[tokio::test]
async fn unrecorded_snapshot_files_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["snapshot-5.cbor.tmp", "snapshot-6.cbor", "snapshot-backup.tar"] {
        std::fs::write(dir.path().join(name), b"partial").expect("file");
    }
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    drop(coordinator);
    for name in ["snapshot-5.cbor.tmp", "snapshot-6.cbor"] {
        assert!(!dir.path().join(name).exists(), "{name} is left");
    }
    assert!(dir.path().join("snapshot-backup.tar").exists(), "not a snapshot file");
}

/// Records a snapshot holds that a crash left in the log (they are dropped a
/// few thousand a turn) are dropped after the start, and the records after
/// the snapshot stay.
#[tokio::test]
async fn records_left_behind_a_snapshot_are_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    log_with_snapshot(dir.path(), SNAPSHOT_FORMAT, Some(&Solver::new(config.core.clone())));
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let seqs = loop {
        let seqs = records(dir.path());
        if seqs.first().is_some_and(|&s| s > 2) {
            break seqs;
        }
        assert!(std::time::Instant::now() < deadline, "records 1 and 2 are still there: {seqs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(seqs[0], 3, "the record after the snapshot stays: {seqs:?}");
    drop(coordinator);
}
