//! Threads sharing one cache: inserts of the same artifact racing each other
//! (commits and unpacks), and pins racing eviction.

use std::sync::{Arc, Barrier};
use std::thread;

use drover_cas::{ArtifactInfo, Cas, CasError};

use crate::util::{build, cas, key, listing, sample_tree, tmp_is_empty, write};

/// A `Cas` is shared through `Arc` by tokio tasks and blocking threads.
#[test]
fn cas_and_its_guards_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Cas>();
    assert_send_sync::<drover_cas::ArtifactGuard>();
    assert_send_sync::<drover_cas::ArtifactWriter>();
    assert_send_sync::<CasError>();
}

/// Runs `f(thread index)` on `n` threads released together; returns results
/// in thread order.
fn race<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let barrier = Arc::new(Barrier::new(n));
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, f) = (barrier.clone(), f.clone());
            thread::spawn(move || {
                barrier.wait();
                f(i)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("thread panicked")).collect()
}

#[test]
fn two_threads_committing_the_same_artifact_both_succeed_once() {
    for round in 0..10u8 {
        let (_root, cas) = cas(1 << 20);
        let id = key(round);
        let shared = cas.clone();
        // The same job output written twice (a retried job, say).
        let infos: Vec<ArtifactInfo> = race(2, move |_| build(&shared, &id, sample_tree));
        assert_eq!(infos[0], infos[1]);
        assert_eq!(cas.artifacts(), vec![id]);
        assert_eq!(cas.used_bytes(), infos[0].size);
        assert!(tmp_is_empty(&cas), "the loser's tree is discarded");
        assert!(cas.verify_artifact(&id).unwrap());
    }
}

#[test]
fn racing_commits_of_different_trees_agree_on_the_winner() {
    for round in 0..10u8 {
        let (_root, cas) = cas(1 << 20);
        let id = key(round);
        let shared = cas.clone();
        let infos = race(2, move |i| {
            build(&shared, &id, |d| write(&d.join("f"), format!("writer {i}").as_bytes(), false))
        });
        assert_eq!(infos[0], infos[1], "both callers are told what is stored");
        let guard = cas.artifact(&id).unwrap();
        assert_eq!(*guard.info(), infos[0]);
        let content = std::fs::read_to_string(guard.join("f")).unwrap();
        assert!(content == "writer 0" || content == "writer 1", "{content}");
        assert_eq!(cas.used_bytes(), 8);
        drop(guard);
        assert!(tmp_is_empty(&cas));
    }
}

#[test]
fn racing_unpacks_of_the_same_pack() {
    let (_a_root, a) = cas(1 << 20);
    let id = key(1);
    let info = build(&a, &id, sample_tree);
    let mut stream = Vec::new();
    a.pack(&id, &mut stream).unwrap();
    let stream = Arc::new(stream);
    for _ in 0..5 {
        let (_root, b) = cas(1 << 20);
        let (shared, stream) = (b.clone(), stream.clone());
        let results = race(3, move |_| shared.unpack(&id, Some(&info.tree), &mut stream.as_slice()));
        for result in results {
            assert_eq!(result.unwrap(), info);
        }
        assert_eq!(b.artifacts(), vec![id]);
        assert_eq!(listing(&b.artifact(&id).unwrap()), listing(&a.artifact(&id).unwrap()));
        assert_eq!(b.used_bytes(), info.size);
        assert!(tmp_is_empty(&b));
    }
}

#[test]
fn pinned_artifacts_survive_concurrent_eviction_pressure() {
    // Room for two 100-byte artifacts; one stays pinned while other threads
    // keep adding artifacts.
    let (_root, cas) = cas(200);
    build(&cas, &key(0), |d| write(&d.join("f"), &[0u8; 100], false));
    let pinned = cas.artifact(&key(0)).unwrap();
    let shared = cas.clone();
    race(2, move |i| {
        for n in 0..10u8 {
            let id = key(1 + n * 2 + i as u8);
            build(&shared, &id, |d| write(&d.join("f"), &[n; 100], false));
        }
    });
    assert!(pinned.join("f").exists());
    assert!(cas.artifacts().contains(&key(0)));
    let evicted = cas.take_evicted();
    assert!(!evicted.contains(&key(0)));
    assert_eq!(evicted.len() + cas.artifacts().len(), 21, "every artifact is either kept or reported");
    drop(pinned);
    assert!(cas.used_bytes() <= 200);
    assert!(tmp_is_empty(&cas));
}
