//! Shared helpers: temporary caches, sample trees, tree listings, and a
//! hand-written encoder of the documented pack format for crafted streams.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use drover_cas::{ArtifactInfo, Cas, Key};
use tempfile::TempDir;

/// A fresh cache in its own temporary directory (at `root/cas`).
pub(crate) fn cas(max_bytes: u64) -> (TempDir, Cas) {
    let root = tempfile::tempdir().unwrap();
    let cas = Cas::open(&root.path().join("cas"), max_bytes).unwrap();
    (root, cas)
}

pub(crate) fn key(n: u8) -> Key {
    Key([n; 32])
}

/// Commits an artifact written by `fill`.
pub(crate) fn build(cas: &Cas, id: &Key, fill: impl FnOnce(&Path)) -> ArtifactInfo {
    let writer = cas.begin_artifact(id).unwrap();
    fill(writer.dir());
    writer.commit().unwrap()
}

/// Writes a file, with the executable bit or not.
pub(crate) fn write(path: &Path, content: &[u8], exec: bool) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, content).unwrap();
    let mode = if exec { 0o755 } else { 0o644 };
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Makes a committed (sealed, read-only) tree's `path` and its directory
/// writable, as a job that means to change it would, so that a test can
/// damage it whatever user it runs as.
pub(crate) fn unseal(path: &Path) {
    for p in [path.parent().unwrap(), path] {
        if let Ok(meta) = fs::symlink_metadata(p) {
            let mode = meta.permissions().mode() | 0o200;
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// Files, nested directories, an empty directory, an executable and
/// symlinks inside the tree.
pub(crate) fn sample_tree(dir: &Path) {
    write(&dir.join("README"), b"hello\n", false);
    write(&dir.join("bin/tool"), b"#!/bin/sh\necho hi\n", true);
    write(&dir.join("lib/deep/nested/data.bin"), &(0..=255u8).collect::<Vec<_>>(), false);
    write(&dir.join("lib/empty-file"), b"", false);
    fs::create_dir_all(dir.join("empty/dir")).unwrap();
    symlink("../README", dir.join("bin/readme-link")).unwrap();
    symlink("lib/deep", dir.join("deep-link")).unwrap();
}

/// One node of a listed tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir,
    File { exec: bool, content: Vec<u8> },
    Link(String),
}

/// Every entry under `root`, sorted by path, without following symlinks.
pub(crate) fn listing(root: &Path) -> Vec<(String, Node)> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<(String, Node)>) {
        let dir = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
        let mut names: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        for name in names {
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let full = root.join(&path);
            let meta = fs::symlink_metadata(&full).unwrap();
            if meta.is_dir() {
                out.push((path.clone(), Node::Dir));
                walk(root, &path, out);
            } else if meta.is_symlink() {
                let target = fs::read_link(&full).unwrap().into_os_string().into_string().unwrap();
                out.push((path, Node::Link(target)));
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.push((path, Node::File { exec, content: fs::read(&full).unwrap() }));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out);
    out
}

/// Whether the cache's tmp/ is empty (no leftovers).
pub(crate) fn tmp_is_empty(cas: &Cas) -> bool {
    fs::read_dir(cas.dir().join("tmp")).unwrap().next().is_none()
}

/// Every path (relative to `root`) whose file name is `name`.
pub(crate) fn find_named(root: &Path, name: &str) -> Vec<String> {
    listing(root).into_iter().map(|(p, _)| p).filter(|p| p.rsplit('/').next() == Some(name)).collect()
}

/// Builds pack streams by hand, following the format documented in
/// `drover_cas::pack`, and computes the tree digest as documented in
/// `drover_cas::manifest`.
pub(crate) struct Craft {
    pub(crate) bytes: Vec<u8>,
    tree: blake3::Hasher,
    entries: u64,
    size: u64,
}

impl Craft {
    pub(crate) fn new() -> Craft {
        let mut bytes = b"DRVPACK\0".to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        let mut tree = blake3::Hasher::new();
        tree.update(b"drover-tree-v1\n");
        Craft { bytes, tree, entries: 0, size: 0 }
    }

    fn head(&mut self, tag: u8, path: &str) {
        for sink in [&mut self.bytes as &mut dyn FnMutBytes, &mut self.tree] {
            sink.put(&[tag]);
            sink.put(&(path.len() as u32).to_le_bytes());
            sink.put(path.as_bytes());
        }
        self.entries += 1;
    }

    pub(crate) fn dir(mut self, path: &str) -> Craft {
        self.head(2, path);
        self
    }

    pub(crate) fn symlink(mut self, path: &str, target: &str) -> Craft {
        self.head(3, path);
        for sink in [&mut self.bytes as &mut dyn FnMutBytes, &mut self.tree] {
            sink.put(&(target.len() as u32).to_le_bytes());
            sink.put(target.as_bytes());
        }
        self
    }

    pub(crate) fn file(self, path: &str, exec: bool, content: &[u8]) -> Craft {
        let digest = Key::digest(content);
        self.file_claiming(path, exec, content, digest)
    }

    /// A file whose trailing digest is `digest`, whatever the content.
    pub(crate) fn file_claiming(mut self, path: &str, exec: bool, content: &[u8], digest: Key) -> Craft {
        self.head(1, path);
        self.bytes.push(u8::from(exec));
        self.bytes.extend_from_slice(&(content.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(content);
        self.bytes.extend_from_slice(digest.as_bytes());
        self.tree.update(&[u8::from(exec)]);
        self.tree.update(&(content.len() as u64).to_le_bytes());
        self.tree.update(digest.as_bytes());
        self.size += content.len() as u64;
        self
    }

    /// The tree digest of the entries so far.
    pub(crate) fn tree(&self) -> Key {
        Key(*self.tree.finalize().as_bytes())
    }

    /// Ends the stream with a correct trailer.
    pub(crate) fn finish(self) -> Vec<u8> {
        let tree = self.tree();
        let (entries, size) = (self.entries, self.size);
        self.finish_with(entries, size, tree)
    }

    /// Ends the stream with the given trailer.
    pub(crate) fn finish_with(mut self, entries: u64, size: u64, tree: Key) -> Vec<u8> {
        self.bytes.push(0);
        self.bytes.extend_from_slice(&entries.to_le_bytes());
        self.bytes.extend_from_slice(&size.to_le_bytes());
        self.bytes.extend_from_slice(tree.as_bytes());
        self.bytes
    }
}

/// Something bytes can be fed to: the stream or the tree hasher.
trait FnMutBytes {
    fn put(&mut self, bytes: &[u8]);
}

impl FnMutBytes for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl FnMutBytes for blake3::Hasher {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}
