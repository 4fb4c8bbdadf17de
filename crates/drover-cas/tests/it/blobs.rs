//! Blobs: put and get with digest verification, concurrent puts, local files.

use std::fs;
use std::sync::Arc;

use drover_cas::{CasError, Key};

use crate::util::{cas, tmp_is_empty};

#[test]
fn put_then_get_verifies_the_digest() {
    let (_root, cas) = cas(1 << 20);
    let content = b"some source file".to_vec();
    let digest = Key::digest(&content);
    assert!(!cas.has_blob(&digest));
    assert_eq!(cas.blob_path(&digest), None);
    let path = cas.put_blob(&mut content.as_slice(), &digest).unwrap();
    assert!(cas.has_blob(&digest));
    assert_eq!(fs::read(&path).unwrap(), content);
    assert_eq!(cas.blob_path(&digest), Some(path.clone()));
    let hex = digest.to_string();
    assert_eq!(path, cas.dir().join("blobs").join(&hex[..2]).join(&hex));
    assert_eq!(cas.used_bytes(), content.len() as u64);
    // A second put is a no-op.
    assert_eq!(cas.put_blob(&mut content.as_slice(), &digest).unwrap(), path);
    assert_eq!(cas.used_bytes(), content.len() as u64);
    assert!(tmp_is_empty(&cas));
}

#[test]
fn digest_mismatch_stores_nothing() {
    let (_root, cas) = cas(1 << 20);
    let claimed = Key::digest(b"what was announced");
    let err = cas.put_blob(&mut &b"what was sent"[..], &claimed).unwrap_err();
    match err {
        CasError::DigestMismatch { expected, actual } => {
            assert_eq!(expected, claimed);
            assert_eq!(actual, Key::digest(b"what was sent"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!cas.has_blob(&claimed));
    assert!(!cas.has_blob(&Key::digest(b"what was sent")));
    assert_eq!(cas.used_bytes(), 0);
    assert!(tmp_is_empty(&cas));
    assert!(fs::read_dir(cas.dir().join("blobs")).unwrap().next().is_none());
}

#[test]
fn concurrent_puts_of_one_blob_all_succeed() {
    let (_root, cas) = cas(64 << 20);
    let content: Arc<Vec<u8>> = Arc::new((0..4_000_000u32).map(|i| (i % 251) as u8).collect());
    let digest = Key::digest(&content);
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (cas, content, barrier) = (cas.clone(), content.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                cas.put_blob(&mut content.as_slice(), &digest)
            })
        })
        .collect();
    let paths: Vec<_> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(fs::read(&paths[0]).unwrap(), *content);
    assert_eq!(cas.used_bytes(), content.len() as u64);
    assert!(tmp_is_empty(&cas));
}

#[test]
fn put_blob_file_hashes_and_copies() {
    let (root, cas) = cas(1 << 20);
    let src = root.path().join("input.txt");
    fs::write(&src, b"local file").unwrap();
    let digest = cas.put_blob_file(&src).unwrap();
    assert_eq!(digest, Key::digest(b"local file"));
    assert_eq!(fs::read(cas.blob_path(&digest).unwrap()).unwrap(), b"local file");
    assert_eq!(cas.put_blob_file(&src).unwrap(), digest);
    assert!(matches!(cas.put_blob_file(&root.path().join("missing")), Err(CasError::Io { .. })));
}

#[test]
fn a_blob_larger_than_the_cache_is_refused() {
    let (_root, cas) = cas(10);
    let content = vec![7u8; 11];
    let err = cas.put_blob(&mut content.as_slice(), &Key::digest(&content)).unwrap_err();
    assert!(matches!(err, CasError::TooLarge { size: 11, max: 10, .. }), "{err:?}");
    assert!(tmp_is_empty(&cas));
    assert_eq!(cas.used_bytes(), 0);
}

#[test]
fn blobs_survive_a_reopen() {
    let (root, cas) = cas(1 << 20);
    let digest = Key::digest(b"kept");
    cas.put_blob(&mut &b"kept"[..], &digest).unwrap();
    drop(cas);
    let cas = drover_cas::Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert!(cas.has_blob(&digest));
    assert_eq!(cas.used_bytes(), 4);
}
