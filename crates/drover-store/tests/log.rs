//! The log survives reopening, keeps order and batches, begins with its
//! latest snapshot, and refuses a newer schema.

use drover_store::{Record, Store, StoreError};

fn all(store: &Store) -> Vec<Record> {
    let mut out = Vec::new();
    store.replay(0, |r| out.push(r)).expect("replay");
    out
}

#[test]
fn batches_survive_reopening_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let mut store = Store::open(&path).expect("open");
        assert!(store.is_empty());
        assert_eq!(store.append([(5, &b"a"[..]), (6, &b"b"[..])]).expect("append"), 2);
        assert_eq!(store.append([(7, &b"c"[..])]).expect("append"), 3);
        store.set_meta("node", "x").expect("meta");
    }
    let mut store = Store::open(&path).expect("reopen");
    assert_eq!(store.len(), 3);
    let records = all(&store);
    let bodies: Vec<(u64, u64, &[u8])> = records.iter().map(|r| (r.seq, r.at, &r.body[..])).collect();
    assert_eq!(bodies, vec![(1, 5, &b"a"[..]), (2, 6, &b"b"[..]), (3, 7, &b"c"[..])]);
    assert_eq!(store.meta("node").expect("meta").as_deref(), Some("x"));
    assert_eq!(store.append([(8, &b"d"[..])]).expect("append"), 4, "numbering continues");
}

#[test]
fn an_empty_batch_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(&dir.path().join("state.db")).expect("open");
    store.append(std::iter::empty()).expect("append");
    assert!(store.is_empty());
    assert!(all(&store).is_empty());
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    Store::open(&path).expect("open").set_meta("schema_version", "99").expect("meta");
    match Store::open(&path) {
        Err(StoreError::TooNew { found: 99, .. }) => {}
        other => panic!("expected TooNew, got {other:?}"),
    }
}

/// A version 1 log (before records could name an earlier build's spec or
/// set the history kept) is read as it is, and marked current so that an
/// older drover refuses it from then on.
#[test]
fn an_older_schema_is_read_and_marked_current() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let mut store = Store::open(&path).expect("open");
    store.append([(5, &b"{\"Tick\":null}"[..])]).expect("append");
    store.set_meta("schema_version", "1").expect("meta");
    drop(store);
    let store = Store::open(&path).expect("a version 1 log opens");
    assert_eq!(store.meta("schema_version").expect("meta").as_deref(), Some("4"));
    assert_eq!(all(&store).len(), 1, "its records are all there");
}

/// A snapshot holds the records up to its own: a replay reads the records
/// after it, those it holds are dropped a few at a time, numbering goes on
/// after the last record (also after reopening, when they are all
/// dropped), and a later snapshot replaces an earlier one.
#[test]
fn a_snapshot_takes_the_records_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let mut store = Store::open(&path).expect("open");
    assert_eq!(store.latest_snapshot().expect("read"), None);
    store.append([(5, &b"a"[..]), (6, &b"b"[..]), (7, &b"c"[..])]).expect("append");
    store.snapshot(2, "f1", "after-b").expect("snapshot");
    let snapshot = store.latest_snapshot().expect("read").expect("a snapshot");
    assert_eq!((snapshot.seq, snapshot.format.as_str(), snapshot.file.as_str()), (2, "f1", "after-b"));
    assert_eq!(all(&store).len(), 3, "the records it holds stay until dropped");
    assert_eq!(store.drop_taken(1).expect("drop"), 1, "a few at a time");
    assert_eq!(store.drop_taken(10).expect("drop"), 1);
    assert_eq!(store.drop_taken(10).expect("drop"), 0, "none left");
    let after: Vec<u64> = all(&store).iter().map(|r| r.seq).collect();
    assert_eq!(after, [3], "the records it took are gone");
    let mut later = Vec::new();
    store.replay(snapshot.seq, |r| later.push(r.body)).expect("replay");
    assert_eq!(later, [b"c".to_vec()]);
    store.snapshot(3, "f1", "after-c").expect("snapshot");
    assert_eq!(store.drop_taken(10).expect("drop"), 1);
    drop(store);
    let mut store = Store::open(&path).expect("reopen");
    assert!(all(&store).is_empty());
    assert_eq!(store.len(), 3, "numbering goes on after the records a snapshot took");
    assert_eq!(store.latest_snapshot().expect("read").map(|s| s.file).as_deref(), Some("after-c"));
    assert_eq!(store.append([(8, &b"d"[..])]).expect("append"), 4);
    let count: i64 = rusqlite::Connection::open(&path)
        .and_then(|c| c.query_row("SELECT COUNT(*) FROM snapshots", [], |r| r.get(0)))
        .expect("count");
    assert_eq!(count, 1, "the older snapshot went");
}
