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
