//! LRU eviction: the size bound, the order, pins, reporting, persistence of
//! the order across a reopen, and the room kept free on the filesystem.

use std::time::Duration;

use drover_cas::{Cas, Key, Reserve};

use crate::util::{build, cas, key, tmp_is_empty, write};

/// An artifact of exactly `size` bytes (one file).
fn sized(cas: &Cas, id: u8, size: usize) {
    build(cas, &key(id), |d| write(&d.join("f"), &vec![id; size], false));
}

#[test]
fn evicts_least_recently_used_first_within_max_bytes() {
    let (_root, cas) = cas(300);
    sized(&cas, 1, 100);
    sized(&cas, 2, 100);
    sized(&cas, 3, 100);
    assert_eq!(cas.used_bytes(), 300);
    assert!(cas.take_evicted().is_empty());
    // Using 1 makes 2 the least recently used.
    drop(cas.artifact(&key(1)).unwrap());
    sized(&cas, 4, 100);
    assert_eq!(cas.take_evicted(), vec![key(2)]);
    assert!(cas.take_evicted().is_empty(), "drained");
    assert_eq!(cas.artifacts(), vec![key(1), key(3), key(4)]);
    assert_eq!(cas.used_bytes(), 300);
    // A big one pushes out several, oldest first.
    sized(&cas, 5, 250);
    assert_eq!(cas.take_evicted(), vec![key(3), key(1), key(4)]);
    assert_eq!(cas.artifacts(), vec![key(5)]);
    assert!(cas.used_bytes() <= 300);
    assert!(tmp_is_empty(&cas));
}

#[test]
fn pinned_artifacts_are_never_evicted() {
    let (_root, cas) = cas(250);
    sized(&cas, 1, 100);
    let pinned = cas.artifact(&key(1)).unwrap();
    sized(&cas, 2, 100);
    sized(&cas, 3, 100);
    // 1 is the oldest use but pinned: 2 goes.
    assert_eq!(cas.take_evicted(), vec![key(2)]);
    sized(&cas, 4, 100);
    assert_eq!(cas.take_evicted(), vec![key(3)]);
    // Pins may hold the cache above its bound; the newest entry stays too.
    let pinned4 = cas.artifact(&key(4)).unwrap();
    sized(&cas, 5, 100);
    assert!(cas.take_evicted().is_empty());
    assert_eq!(cas.used_bytes(), 300);
    // An explicit evict takes the only unpinned entry.
    assert_eq!(cas.evict(), vec![key(5)]);
    assert!(cas.take_evicted().is_empty(), "explicit evictions are returned, not queued");
    assert_eq!(cas.used_bytes(), 200);
    assert!(pinned.join("f").exists());
    drop(pinned);
    drop(pinned4);
    // Once released they are ordinary: 1 was used longest ago.
    sized(&cas, 6, 100);
    assert_eq!(cas.take_evicted(), vec![key(1)]);
    assert_eq!(cas.artifacts(), vec![key(4), key(6)]);
    assert_eq!(cas.used_bytes(), 200);
}

/// In a small cache whose other entries are pinned (a running job's
/// inputs), the artifact just committed is the only one eviction may take,
/// and the next commit takes it: a caller that still has to read it (to
/// push it) commits it pinned, and it stays until the guard goes.
#[test]
fn an_artifact_committed_pinned_stays_until_its_guard_goes() {
    let (_root, cas) = cas(250);
    sized(&cas, 1, 100);
    let input = cas.artifact(&key(1)).unwrap();
    // Committed unpinned, the new output goes with the next commit.
    sized(&cas, 2, 100);
    sized(&cas, 3, 100);
    assert_eq!(cas.take_evicted(), vec![key(2)], "the output just committed is the first to go");
    // Committed pinned, it stays, whatever the next commits need.
    let writer = cas.begin_artifact(&key(4)).unwrap();
    write(&writer.dir().join("f"), &[4; 100], false);
    let output = writer.commit_pinned().unwrap();
    assert_eq!((*output.key(), output.info().size), (key(4), 100));
    assert!(output.join("f").exists());
    sized(&cas, 5, 100);
    assert_eq!(cas.take_evicted(), vec![key(3)]);
    sized(&cas, 6, 100);
    assert_eq!(cas.take_evicted(), vec![key(5)], "not 4, pinned as 1 is");
    assert_eq!(cas.used_bytes(), 300, "pins hold the cache above its bound");
    let mut pack = Vec::new();
    assert_eq!(cas.pack(&key(4), &mut pack).unwrap().size, 100);
    // Without its guard it is an ordinary entry again.
    drop(output);
    drop(input);
    sized(&cas, 7, 100);
    assert_eq!(cas.take_evicted(), vec![key(1), key(6)]);
    // Pinning what is present already pins it too.
    let writer = cas.begin_artifact(&key(7)).unwrap();
    write(&writer.dir().join("f"), &[7; 100], false);
    let again = writer.commit_pinned().unwrap();
    assert_eq!(again.info().size, 100);
    sized(&cas, 8, 100);
    sized(&cas, 9, 100);
    assert!(cas.artifacts().contains(&key(7)) && !cas.artifacts().contains(&key(8)));
    drop(again);
    assert!(tmp_is_empty(&cas));
}

/// An empty output committed pinned is not evicted either (an empty
/// artifact frees nothing, but an eviction pass takes it all the same).
#[test]
fn an_empty_artifact_committed_pinned_stays_until_its_guard_goes() {
    let (_root, cas) = cas(150);
    sized(&cas, 1, 100);
    let input = cas.artifact(&key(1)).unwrap();
    let output = cas.commit_empty_artifact_pinned(&key(2)).unwrap();
    assert_eq!(*output.info(), cas.empty_info());
    cas.commit_empty_artifact(&key(3)).unwrap();
    sized(&cas, 4, 100);
    assert_eq!(cas.take_evicted(), vec![key(3)], "the unpinned empty artifact goes, not 2");
    assert_eq!(cas.artifacts(), vec![key(1), key(2), key(4)]);
    drop(output);
    drop(input);
}

#[test]
fn blobs_and_artifacts_share_one_order() {
    let (_root, cas) = cas(250);
    let blob = vec![9u8; 100];
    let digest = Key::digest(&blob);
    cas.put_blob(&mut blob.as_slice(), &digest).unwrap();
    sized(&cas, 1, 100);
    assert!(cas.blob_path(&digest).is_some());
    sized(&cas, 2, 100);
    // The artifact was used longer ago than the blob.
    assert_eq!(cas.take_evicted(), vec![key(1)]);
    assert!(cas.has_blob(&digest));
    sized(&cas, 3, 100);
    assert!(!cas.has_blob(&digest), "the blob is now the oldest");
    assert!(cas.take_evicted().is_empty(), "blobs are not reported");
    assert_eq!(cas.artifacts(), vec![key(2), key(3)]);
}

#[test]
fn last_use_survives_a_reopen() {
    let (root, cas) = cas(1 << 20);
    for id in 1..=3 {
        sized(&cas, id, 100);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(cas.artifact(&key(1)).unwrap());
    drop(cas);
    // Reopened with a smaller bound: the least recently used go first.
    let cas = Cas::open(&root.path().join("cas"), 200).unwrap();
    assert_eq!(cas.take_evicted(), vec![key(2)]);
    assert_eq!(cas.artifacts(), vec![key(1), key(3)]);
    assert_eq!(cas.used_bytes(), 200);
}

#[test]
fn a_reserve_the_filesystem_lacks_evicts_every_entry_it_may() {
    let (_root, cas) = cas(1 << 20);
    for id in 1..=3 {
        sized(&cas, id, 100);
    }
    // Room the filesystem has: nothing to evict.
    cas.keep_free(Reserve::Percent(0));
    cas.keep_free(Reserve::Bytes(0));
    assert!(cas.take_evicted().is_empty());
    assert_eq!(cas.artifacts(), vec![key(1), key(2), key(3)]);
    // All of it and more: everything unpinned goes at once.
    let pinned = cas.artifact(&key(2)).unwrap();
    cas.keep_free(Reserve::Percent(100));
    assert_eq!(cas.take_evicted(), vec![key(1), key(3)]);
    assert_eq!(cas.artifacts(), vec![key(2)]);
    // The next commit is kept (it was just added); the pin still holds.
    sized(&cas, 4, 100);
    assert!(cas.take_evicted().is_empty());
    drop(pinned);
    cas.keep_free(Reserve::Bytes(u64::MAX));
    sized(&cas, 5, 100);
    assert_eq!(cas.take_evicted(), vec![key(2), key(4)]);
    assert_eq!(cas.artifacts(), vec![key(5)]);
    assert!(tmp_is_empty(&cas), "the evicted files are gone");
    // Without a reserve, the size bound alone applies again.
    cas.keep_free(Reserve::Nothing);
    sized(&cas, 6, 100);
    assert!(cas.take_evicted().is_empty());
    assert_eq!(cas.artifacts(), vec![key(5), key(6)]);
}

/// A reserve the filesystem lacks for good evicts outputs, never blobs:
/// the sources of a run that is starting, fetched one after another, all
/// stay (each new blob used to evict the one before it, so a job that sees
/// two sources never started). The size limit still evicts blobs.
#[test]
fn a_reserve_evicts_outputs_but_not_the_sources_just_fetched() {
    let (_root, cas) = cas(1_000);
    cas.keep_free(Reserve::Bytes(u64::MAX));
    sized(&cas, 1, 100);
    let blobs: Vec<Vec<u8>> = (0..5u8).map(|n| vec![n; 100]).collect();
    for blob in &blobs {
        cas.put_blob(&mut blob.as_slice(), &Key::digest(blob)).unwrap();
    }
    for blob in &blobs {
        assert!(cas.has_blob(&Key::digest(blob)), "every source of the run is still there");
    }
    assert_eq!(cas.take_evicted(), vec![key(1)], "the output went for the reserve");
    // Past the size limit, the oldest blobs go as before.
    sized(&cas, 2, 600);
    assert!(!cas.has_blob(&Key::digest(&blobs[0])));
    assert!(cas.has_blob(&Key::digest(&blobs[4])));
    assert!(cas.used_bytes() <= 1_000);
}
