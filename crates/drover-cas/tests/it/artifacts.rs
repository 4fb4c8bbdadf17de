//! Artifacts: commit, reopen, pins, removal, verification, crash leftovers,
//! refused trees and export.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};

use drover_cas::{Cas, CasError, Durability};

use crate::util::{build, cas, key, listing, sample_tree, tmp_is_empty, unseal, write};

#[test]
fn commit_then_reopen_rebuilds_the_index() {
    let (root, cas) = cas(1 << 20);
    let id = key(1);
    let info = build(&cas, &id, sample_tree);
    assert_eq!(info.files, 4);
    assert_eq!(info.size, 6 + 18 + 256);
    assert_eq!(cas.artifacts(), vec![id]);
    assert_eq!(cas.artifact_info(&id), Some(info));
    assert_eq!(cas.used_bytes(), info.size);
    assert!(tmp_is_empty(&cas));
    let expected = {
        let scratch = tempfile::tempdir().unwrap();
        sample_tree(scratch.path());
        listing(scratch.path())
    };
    {
        let guard = cas.artifact(&id).unwrap();
        assert_eq!(*guard.info(), info);
        assert_eq!(listing(&guard), expected);
        assert!(guard.join("bin/tool").is_file());
    }
    drop(cas);

    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert_eq!(cas.artifacts(), vec![id]);
    assert_eq!(cas.artifact_info(&id), Some(info));
    assert_eq!(cas.used_bytes(), info.size);
    assert_eq!(listing(&cas.artifact(&id).unwrap()), expected);
    assert!(cas.verify_artifact(&id).unwrap());
}

/// Fan-out directories made ahead of time take every commit, full or
/// empty, and making them again (after a reopen, with entries in them)
/// changes nothing.
#[test]
fn fan_outs_made_ahead_take_commits_and_are_made_once() {
    let (root, cas) = cas(1 << 20);
    cas.make_fan_outs().unwrap();
    let artifacts = root.path().join("cas/artifacts");
    let fan_outs = |dir: &std::path::Path| {
        fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir()).count()
    };
    assert_eq!(fan_outs(&artifacts), 256);
    let full = build(&cas, &key(1), sample_tree);
    let empty = cas.commit_empty_artifact(&key(2)).unwrap();
    drop(cas);
    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    cas.make_fan_outs().unwrap();
    assert_eq!(fan_outs(&artifacts), 256);
    assert_eq!(cas.artifacts(), vec![key(1), key(2)]);
    assert_eq!(cas.artifact_info(&key(1)), Some(full));
    assert_eq!(cas.artifact_info(&key(2)), Some(empty));
    assert!(cas.verify_artifact(&key(1)).unwrap());
}

/// A cache that commits for process crashes only keeps and finds the same
/// entries as one that commits for power loss, across reopening either way.
#[test]
fn a_process_crash_cache_commits_the_same_entries() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cas");
    let cas = Cas::open_with(&dir, 1 << 20, Durability::ProcessCrash).unwrap();
    let full = build(&cas, &key(1), sample_tree);
    let empty = cas.commit_empty_artifact(&key(2)).unwrap();
    assert_eq!(cas.artifacts(), vec![key(1), key(2)]);
    assert!(tmp_is_empty(&cas));
    drop(cas);
    let cas = Cas::open(&dir, 1 << 20).unwrap();
    assert_eq!(cas.artifacts(), vec![key(1), key(2)]);
    assert_eq!(cas.artifact_info(&key(1)), Some(full));
    assert_eq!(cas.artifact_info(&key(2)), Some(empty));
    assert!(cas.verify_artifact(&key(1)).unwrap());
    assert!(cas.verify_artifact(&key(2)).unwrap());
}

#[test]
fn the_same_tree_has_the_same_digest_under_any_id() {
    let (_root, cas) = cas(1 << 20);
    let a = build(&cas, &key(1), sample_tree);
    let b = build(&cas, &key(2), sample_tree);
    assert_eq!(a, b);
    let c = build(&cas, &key(3), |d| {
        sample_tree(d);
        fs::set_permissions(d.join("README"), fs::Permissions::from_mode(0o755)).unwrap();
    });
    assert_ne!(a.tree, c.tree, "the exec bit is part of the tree digest");
    let d = build(&cas, &key(4), |d| {
        sample_tree(d);
        fs::create_dir(d.join("another-empty-dir")).unwrap();
    });
    assert_ne!(a.tree, d.tree, "empty directories are part of the tree digest");
}

#[test]
fn the_first_commit_wins() {
    let (_root, cas) = cas(1 << 20);
    let first = build(&cas, &key(1), |d| write(&d.join("f"), b"one", false));
    let second = build(&cas, &key(1), |d| write(&d.join("f"), b"two!", false));
    assert_eq!(first, second);
    assert_eq!(fs::read(cas.artifact(&key(1)).unwrap().join("f")).unwrap(), b"one");
    assert!(tmp_is_empty(&cas));
    assert_eq!(cas.used_bytes(), 3);
}

#[test]
fn dropping_a_writer_aborts() {
    let (_root, cas) = cas(1 << 20);
    let writer = cas.begin_artifact(&key(1)).unwrap();
    write(&writer.dir().join("a/b"), b"partial", false);
    // A job may leave read-only directories behind.
    fs::set_permissions(writer.dir().join("a"), fs::Permissions::from_mode(0o555)).unwrap();
    drop(writer);
    assert!(tmp_is_empty(&cas));
    assert!(cas.artifacts().is_empty());
}

#[test]
fn pinned_artifacts_cannot_be_removed() {
    let (_root, cas) = cas(1 << 20);
    build(&cas, &key(1), sample_tree);
    let guard = cas.artifact(&key(1)).unwrap();
    assert!(matches!(cas.remove_artifact(&key(1)), Err(CasError::Pinned(k)) if k == key(1)));
    drop(guard);
    assert!(cas.remove_artifact(&key(1)).unwrap());
    assert!(!cas.remove_artifact(&key(1)).unwrap());
    assert!(cas.artifact(&key(1)).is_none());
    assert_eq!(cas.used_bytes(), 0);
    assert!(tmp_is_empty(&cas));
    assert!(matches!(cas.verify_artifact(&key(1)), Err(CasError::NotFound(_))));
}

#[test]
fn verify_detects_a_modified_file_and_removes_the_artifact() {
    let (_root, cas) = cas(1 << 20);
    build(&cas, &key(1), sample_tree);
    build(&cas, &key(2), sample_tree);
    build(&cas, &key(3), sample_tree);
    assert!(cas.verify_artifact(&key(1)).unwrap());
    let path = cas.artifact(&key(1)).unwrap().join("README");
    unseal(&path);
    fs::write(&path, b"HELLO\n").unwrap();
    assert!(!cas.verify_artifact(&key(1)).unwrap());
    assert_eq!(cas.artifacts(), vec![key(2), key(3)]);
    assert!(!path.exists());

    // An added file counts as corruption too.
    let extra = cas.artifact(&key(2)).unwrap().join("extra");
    unseal(&extra);
    fs::write(&extra, b"").unwrap();
    assert!(!cas.verify_artifact(&key(2)).unwrap());

    // Found corrupt while pinned: hidden at once, deleted when released.
    let guard = cas.artifact(&key(3)).unwrap();
    unseal(&guard.join("lib/empty-file"));
    fs::remove_file(guard.join("lib/empty-file")).unwrap();
    assert!(!cas.verify_artifact(&key(3)).unwrap());
    assert!(cas.artifact(&key(3)).is_none());
    assert!(cas.artifacts().is_empty());
    assert!(guard.join("README").exists());
    let dir = guard.to_path_buf();
    drop(guard);
    assert!(!dir.exists());
    assert_eq!(cas.used_bytes(), 0);
    assert!(tmp_is_empty(&cas));
}

#[test]
fn crash_leftovers_are_wiped_on_open() {
    let (root, cas) = cas(1 << 20);
    build(&cas, &key(1), sample_tree);
    let dir = cas.dir().to_path_buf();
    drop(cas);
    // What a crash leaves behind: a writer's directory, a partial blob, a
    // read-only directory written by a job.
    write(&dir.join("tmp/art-crashed/tree/x/y"), b"half", false);
    write(&dir.join("tmp/blob-123"), b"partial blob", false);
    fs::create_dir_all(dir.join("tmp/art-locked/tree/ro")).unwrap();
    fs::set_permissions(dir.join("tmp/art-locked/tree/ro"), fs::Permissions::from_mode(0o500)).unwrap();
    // An artifact directory without its info file is not a committed entry.
    let torn = dir.join("artifacts").join("05").join(key(5).to_string());
    fs::create_dir_all(torn.join("tree")).unwrap();
    assert!(fs::read_dir(dir.join("tmp")).unwrap().count() >= 2);

    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert!(tmp_is_empty(&cas));
    assert!(!torn.exists());
    assert_eq!(cas.artifacts(), vec![key(1)]);
}

#[test]
fn a_cache_directory_is_opened_once() {
    let (root, cas) = cas(1 << 20);
    let err = Cas::open(&root.path().join("cas"), 1 << 20).unwrap_err();
    assert!(matches!(err, CasError::Io { .. }), "{err:?}");
    drop(cas);
    Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
}

#[test]
fn commit_refuses_symlinks_out_of_the_tree() {
    let (_root, cas) = cas(1 << 20);
    for (link, target) in
        [("abs", "/etc/passwd"), ("up", "../x"), ("d/up", "../../x"), ("d/up2", "e/../../../x")]
    {
        let writer = cas.begin_artifact(&key(1)).unwrap();
        let path = writer.dir().join(link);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, &path).unwrap();
        let err = writer.commit().unwrap_err();
        assert!(matches!(err, CasError::UnsafePath(_)), "{link} -> {target}: {err:?}");
    }
    // A chain: each link alone stays inside, together they climb out.
    let writer = cas.begin_artifact(&key(1)).unwrap();
    symlink(".", writer.dir().join("s")).unwrap();
    symlink("s/..", writer.dir().join("x")).unwrap();
    assert!(matches!(writer.commit(), Err(CasError::UnsafePath(_))));
    // Special files are refused.
    let writer = cas.begin_artifact(&key(1)).unwrap();
    let sock = std::os::unix::net::UnixListener::bind(writer.dir().join("sock")).unwrap();
    assert!(matches!(writer.commit(), Err(CasError::UnsafePath(_))));
    drop(sock);
    assert!(cas.artifacts().is_empty());
    assert!(tmp_is_empty(&cas));
}

/// A tree whose root a job swapped for a link (or a file) is refused, and
/// the directory the link points to is neither read as the output nor
/// sealed: it keeps its files' modes and times.
#[test]
fn commit_refuses_a_root_replaced_by_a_link_and_leaves_its_target_alone() {
    let (root, cas) = cas(1 << 20);
    let victim = root.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(victim.join("notes.txt"), "mine").unwrap();
    fs::set_permissions(victim.join("notes.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    let before = fs::metadata(victim.join("notes.txt")).unwrap().modified().unwrap();
    let writer = cas.begin_artifact(&key(1)).unwrap();
    fs::remove_dir(writer.dir()).unwrap();
    symlink(&victim, writer.dir()).unwrap();
    let err = writer.commit().unwrap_err();
    assert!(matches!(&err, CasError::UnsafePath(m) if m.contains("symbolic link")), "{err:?}");
    let after = fs::metadata(victim.join("notes.txt")).unwrap();
    assert_eq!((after.permissions().mode() & 0o777, after.modified().unwrap()), (0o644, before));
    assert_eq!(fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o755);
    let writer = cas.begin_artifact(&key(1)).unwrap();
    fs::remove_dir(writer.dir()).unwrap();
    fs::write(writer.dir(), "a file").unwrap();
    let err = writer.commit().unwrap_err();
    assert!(matches!(&err, CasError::UnsafePath(m) if m.contains("not a directory")), "{err:?}");
    assert!(cas.artifacts().is_empty());
    assert!(tmp_is_empty(&cas));
}

#[test]
fn an_artifact_larger_than_the_cache_is_refused() {
    let (_root, cas) = cas(100);
    let writer = cas.begin_artifact(&key(1)).unwrap();
    write(&writer.dir().join("big"), &[1u8; 101], false);
    assert!(matches!(writer.commit(), Err(CasError::TooLarge { .. })));
    assert!(cas.artifacts().is_empty());
    assert!(tmp_is_empty(&cas));
}

/// An export unpacks a pack straight into a new directory, verified: a
/// wrong tree digest leaves nothing, and an existing directory is not
/// written into.
#[test]
fn unpack_to_dir_writes_the_tree_verified() {
    let (root, cas) = cas(1 << 20);
    let info = build(&cas, &key(1), sample_tree);
    let mut pack = Vec::new();
    cas.pack(&key(1), &mut pack).unwrap();
    let dest = root.path().join("out");
    assert_eq!(drover_cas::unpack_to_dir(&mut pack.as_slice(), &dest, Some(&info.tree)).unwrap(), info);
    assert_eq!(listing(&dest), listing(&cas.artifact(&key(1)).unwrap()));
    let err = drover_cas::unpack_to_dir(&mut pack.as_slice(), &dest, None).unwrap_err();
    assert!(matches!(err, CasError::Io { .. }), "{err:?}");
    let other = root.path().join("other");
    let err = drover_cas::unpack_to_dir(&mut pack.as_slice(), &other, Some(&key(7))).unwrap_err();
    assert!(matches!(err, CasError::DigestMismatch { .. }), "{err:?}");
    assert!(!other.exists(), "nothing is left of a refused pack");
}

#[test]
fn an_empty_artifact_commits_like_an_untouched_writer_and_travels() {
    let (root, cas) = cas(1 << 20);
    let (a, b) = (key(1), key(2));
    let written = build(&cas, &a, |_| {});
    let empty = cas.commit_empty_artifact(&b).unwrap();
    assert_eq!(empty, written, "the same fixed tree digest, size and file count");
    assert_eq!((empty.files, empty.size), (0, 0));
    assert!(tmp_is_empty(&cas));
    assert_eq!(cas.commit_empty_artifact(&b).unwrap(), empty, "committing again is harmless");
    {
        let guard = cas.artifact(&b).unwrap();
        assert!(guard.is_dir());
        assert!(listing(&guard).is_empty());
    }
    assert!(cas.verify_artifact(&b).unwrap());

    // Fetchable: packed here, unpacked (and verified) elsewhere.
    let mut pack = Vec::new();
    assert_eq!(cas.pack(&b, &mut pack).unwrap(), empty);
    let (_peer_root, peer) = crate::util::cas(1 << 20);
    assert_eq!(peer.unpack(&b, Some(&empty.tree), &mut pack.as_slice()).unwrap(), empty);
    assert!(listing(&peer.artifact(&b).unwrap()).is_empty());

    // And durable: it survives a reopen.
    drop(cas);
    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert_eq!(cas.artifact_info(&b), Some(empty));
    assert!(cas.verify_artifact(&b).unwrap());
}

/// Where an artifact lives on disk.
fn entry_path(cas: &Cas, id: &drover_cas::Key) -> std::path::PathBuf {
    let hex = id.to_hex();
    cas.dir().join("artifacts").join(&hex[..2]).join(hex)
}

#[test]
fn every_empty_artifact_is_one_hard_link_to_a_shared_file() {
    use std::os::unix::fs::MetadataExt;
    let (root, cas) = cas(1 << 20);
    let (a, b, c) = (key(1), key(2), key(3));
    build(&cas, &a, |_| {});
    cas.commit_empty_artifact(&b).unwrap();
    // Unpacked from a peer: the same compact form.
    let mut pack = Vec::new();
    cas.pack(&a, &mut pack).unwrap();
    let (_peer_root, peer) = crate::util::cas(1 << 20);
    peer.unpack(&c, None, &mut pack.as_slice()).unwrap();
    let mut pack = Vec::new();
    peer.pack(&c, &mut pack).unwrap();
    cas.unpack(&c, None, &mut pack.as_slice()).unwrap();

    let inode = |path: &std::path::Path| fs::symlink_metadata(path).unwrap();
    let first = inode(&entry_path(&cas, &a));
    assert!(first.is_file(), "a file, not a directory of its own");
    for id in [b, c] {
        let m = inode(&entry_path(&cas, &id));
        assert_eq!((m.dev(), m.ino()), (first.dev(), first.ino()), "no inode of its own");
    }
    assert!(first.nlink() >= 4, "the shared file and three artifacts");
    // The guards share one empty tree, which nothing can be written into.
    let (ga, gb) = (cas.artifact(&a).unwrap(), cas.artifact(&b).unwrap());
    assert_eq!(ga.path(), gb.path());
    assert!(listing(&ga).is_empty());
    assert_eq!(fs::metadata(ga.path()).unwrap().permissions().mode() & 0o777, 0o555);
    drop((ga, gb));
    assert!(tmp_is_empty(&cas));

    // Removing one leaves the others.
    assert!(cas.remove_artifact(&b).unwrap());
    assert!(!entry_path(&cas, &b).exists());
    assert!(cas.verify_artifact(&a).unwrap());
    let mut out = Vec::new();
    cas.pack(&c, &mut out).unwrap();
    drover_cas::unpack_to_dir(&mut out.as_slice(), &root.path().join("out"), None).unwrap();
    assert!(fs::read_dir(root.path().join("out")).unwrap().next().is_none());

    // Reopened: both still there, as empty artifacts.
    drop(cas);
    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    let mut held = cas.artifacts();
    held.sort();
    assert_eq!(held, vec![a, c]);
    assert!(cas.verify_artifact(&a).unwrap() && cas.verify_artifact(&c).unwrap());
}

#[test]
fn empty_artifacts_are_evicted_after_the_entries_that_hold_bytes_on_reopen() {
    let (root, cas) = cas(1000);
    cas.commit_empty_artifact(&key(2)).unwrap();
    build(&cas, &key(1), |d| write(&d.join("f"), &[7; 600], false));
    drop(cas);
    let cas = Cas::open(&root.path().join("cas"), 1000).unwrap();
    build(&cas, &key(3), |d| write(&d.join("f"), &[8; 600], false));
    assert_eq!(cas.take_evicted(), vec![key(1)], "evicting the empty one would free nothing");
    assert!(cas.artifact_info(&key(2)).is_some());
}

#[test]
fn an_empty_artifact_in_the_old_directory_form_is_moved_to_the_compact_form_on_open() {
    let (root, cas) = cas(1 << 20);
    let id = key(4);
    cas.commit_empty_artifact(&id).unwrap();
    let path = entry_path(&cas, &id);
    drop(cas);
    // The layout older versions wrote: a directory with the manifest, the
    // info and an empty tree.
    let info = fs::read(&path).unwrap();
    fs::remove_file(&path).unwrap();
    fs::create_dir_all(path.join("tree")).unwrap();
    fs::write(path.join("manifest.json"), br#"{"entries":[]}"#).unwrap();
    fs::write(path.join("info.json"), &info).unwrap();

    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert!(fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(cas.artifacts(), vec![id]);
    assert!(cas.verify_artifact(&id).unwrap());
}

#[test]
fn a_file_in_place_of_an_artifact_that_is_not_the_empty_one_is_dropped_on_open() {
    let (root, cas) = cas(1 << 20);
    cas.commit_empty_artifact(&key(5)).unwrap();
    let torn = entry_path(&cas, &key(6));
    drop(cas);
    // What a torn or foreign write could leave: a file with other content.
    fs::create_dir_all(torn.parent().unwrap()).unwrap();
    fs::write(&torn, b"").unwrap();
    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert_eq!(cas.artifacts(), vec![key(5)]);
    assert!(!torn.exists());
}

#[test]
fn damage_to_the_shared_empty_parts_is_repaired_on_open() {
    let (root, cas) = cas(1 << 20);
    cas.commit_empty_artifact(&key(7)).unwrap();
    let shared = cas.dir().join("empty");
    drop(cas);
    // The shared info file rewritten: every link to it holds the damage, so
    // the artifacts are dropped (never served wrong); the shared tree given
    // a file: emptied again.
    for entry in fs::read_dir(&shared).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            fs::write(&path, b"{}").unwrap();
        }
    }
    fs::set_permissions(shared.join("tree"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(shared.join("tree/intruder"), b"x").unwrap();
    let cas = Cas::open(&root.path().join("cas"), 1 << 20).unwrap();
    assert!(cas.artifacts().is_empty());
    cas.commit_empty_artifact(&key(8)).unwrap();
    let guard = cas.artifact(&key(8)).unwrap();
    assert!(listing(&guard).is_empty());
    assert!(cas.verify_artifact(&key(8)).unwrap());
}

fn mode(path: &std::path::Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

/// A committed tree is sealed (read-only); a job that writes into it anyway,
/// as one running as root may, is found out by `changed`, which drops the
/// artifact and reports it; the tree every empty artifact shares is
/// emptied again.
#[test]
fn a_tree_changed_after_its_commit_is_found_and_dropped() {
    let (_root, cas) = cas(1 << 20);
    build(&cas, &key(1), sample_tree);
    let guard = cas.artifact(&key(1)).unwrap();
    let readme = guard.join("README");
    assert_eq!((mode(&readme), mode(&guard)), (0o444, 0o555));
    assert_eq!(cas.changed(&key(1), &guard), None);
    // Written to as root writes (read-only again after, so only the
    // time shows the change).
    fs::set_permissions(&readme, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&readme, b"changed by a dependent job").unwrap();
    fs::set_permissions(&readme, fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(cas.changed(&key(1), &guard).as_deref(), Some("README"));
    assert_eq!(cas.changed(&key(1), &guard).as_deref(), Some("README"), "every holder hears of it");
    drop(guard);
    assert!(cas.artifacts().is_empty());
    assert_eq!(cas.take_evicted(), vec![key(1)]);

    cas.commit_empty_artifact(&key(2)).unwrap();
    let shared = cas.artifact(&key(2)).unwrap();
    unseal(&shared.join("intruder"));
    fs::write(shared.join("intruder"), b"x").unwrap();
    assert_eq!(cas.changed(&key(2), &shared).as_deref(), Some("."));
    // Emptied in place: the empty artifacts stay, and the tree is whole.
    assert!(listing(&shared).is_empty());
    assert_eq!(cas.changed(&key(2), &shared), None);
    drop(shared);
    assert!(cas.artifact(&key(2)).is_some());
}

/// A cache that an older drover wrote (trees neither read-only nor
/// stamped) has its trees sealed once, when it is opened.
#[test]
fn the_trees_of_an_older_cache_are_sealed_when_it_opens() {
    let (root, cas) = cas(1 << 20);
    build(&cas, &key(1), sample_tree);
    let tree = cas.artifact(&key(1)).unwrap().to_path_buf();
    drop(cas);
    let dir = root.path().join("cas");
    fs::remove_file(dir.join("sealed")).unwrap();
    fs::set_permissions(&tree, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(tree.join("README"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(tree.join("README"), b"hello\n").unwrap();
    let cas = Cas::open(&dir, 1 << 20).unwrap();
    assert_eq!((mode(&tree.join("README")), mode(&tree)), (0o444, 0o555));
    assert_eq!(cas.changed(&key(1), &tree), None);
    assert!(dir.join("sealed").exists());
}
