//! A log that begins with a snapshot this drover cannot read stops the
//! start, saying why, and leaves the log as it was; files of snapshots the
//! log does not name are deleted. (The cluster tests in `crates/drover`
//! restart real coordinators from their snapshots.)

mod common;

use std::path::Path;

/// A log of one input, then a snapshot of it in `file` (format `format`)
/// holding `body`, if given.
fn log_with_snapshot(dir: &Path, format: &str, body: Option<&[u8]>) {
    let mut store = drover_store::Store::open(&dir.join("state.db")).expect("store");
    store.append([(1_000, &b"{\"Tick\":null}"[..])]).expect("append");
    if let Some(body) = body {
        std::fs::write(dir.join("snapshot-1.cbor"), body).expect("snapshot file");
    }
    store.snapshot(1, format, "snapshot-1.cbor").expect("snapshot");
}

#[tokio::test]
async fn a_snapshot_of_another_format_is_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    log_with_snapshot(dir.path(), "drover-solver-0", Some(b"old"));
    let refused = drover_coordinator::start(common::loopback(dir.path())).await.expect_err("unreadable");
    let message = refused.to_string();
    assert!(
        message.contains("\"drover-solver-0\"") && message.contains("another version of drover"),
        "{message}"
    );
    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    assert_eq!(store.len(), 1, "nothing was recorded");
    assert_eq!(std::fs::read(dir.path().join("snapshot-1.cbor")).expect("kept"), b"old");
}

#[tokio::test]
async fn a_missing_or_damaged_snapshot_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    log_with_snapshot(dir.path(), drover_solver::SNAPSHOT_FORMAT, None);
    let missing = drover_coordinator::start(common::loopback(dir.path())).await.expect_err("missing");
    assert!(missing.to_string().contains("snapshot-1.cbor"), "{missing}");
    std::fs::write(dir.path().join("snapshot-1.cbor"), b"\xff\x00 not CBOR").expect("damaged");
    let damaged = drover_coordinator::start(common::loopback(dir.path())).await.expect_err("damaged");
    assert!(damaged.to_string().contains("cannot read the snapshot"), "{damaged}");
}

/// A snapshot a crash cut short (its `.tmp` file) or one never recorded is
/// deleted at the start.
#[tokio::test]
async fn unrecorded_snapshot_files_are_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["snapshot-5.cbor.tmp", "snapshot-6.cbor"] {
        std::fs::write(dir.path().join(name), b"partial").expect("file");
    }
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    drop(coordinator);
    for name in ["snapshot-5.cbor.tmp", "snapshot-6.cbor"] {
        assert!(!dir.path().join(name).exists(), "{name} is left");
    }
}

/// Records a snapshot holds that a crash left in the log (they are dropped a
/// few thousand a turn) are dropped after the start, and the records after
/// the snapshot stay.
#[tokio::test]
async fn records_left_behind_a_snapshot_are_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    let mut store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let tick = serde_json::to_vec(&drover_solver::Input::Tick).expect("json");
    store.append((0..3).map(|at| (1_000 + at, &tick[..]))).expect("append");
    let mut body = Vec::new();
    ciborium::into_writer(&drover_solver::Solver::new(config.core.clone()), &mut body).expect("encode");
    std::fs::write(dir.path().join("snapshot-2.cbor"), body).expect("snapshot file");
    store.snapshot(2, drover_solver::SNAPSHOT_FORMAT, "snapshot-2.cbor").expect("snapshot");
    drop(store);
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let seqs = loop {
        let mut seqs = Vec::new();
        store.replay(0, |r| seqs.push(r.seq)).expect("replay");
        if seqs.first().is_some_and(|&s| s > 2) {
            break seqs;
        }
        assert!(std::time::Instant::now() < deadline, "records 1 and 2 are still there: {seqs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(seqs[0], 3, "the record after the snapshot stays: {seqs:?}");
    drop(coordinator);
}
