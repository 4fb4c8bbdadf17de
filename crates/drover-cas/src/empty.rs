//! The empty artifact's compact form: every artifact whose tree is empty (the
//! output of a job that wrote nothing, the commonest output there is) is one
//! directory entry, a hard link to a shared, fsynced file, instead of a
//! directory of its own with a manifest, an info file and an empty tree.
//!
//! ```text
//! dir/empty/tree/               the tree every empty artifact shares (empty)
//! dir/empty/info-N.json         the empty artifact's info (JSON); N counts up
//! dir/artifacts/ab/abcdef…      a hard link to the newest info-N.json
//! ```
//!
//! Committing one is a single `link(2)` (plus the fsync of its fan-out
//! directory that every commit makes): no inode is allocated and no file
//! written, and the link appears atomically with content that has been on
//! disk since the cache first made it. A file system caps an inode's links
//! (65,000 on ext4): when `link` says so (`EMLINK`), a fresh `info-N.json`
//! is made and used from then on. [`EmptyStore::open`] picks the newest
//! valid `info-N.json` (making one if none is) and removes the others that
//! no artifact links to any more.
//!
//! Their last use is not persisted (every link shares the file's
//! modification time, and touching it would touch them all). They hold no
//! bytes, so evicting one never frees room: on open they count as just
//! used, behind every entry that does hold bytes.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::ArtifactInfo;
use crate::error::{CasError, IoContext};
use crate::fsutil::remove_path;
use crate::manifest::{Manifest, sync_dir};

/// The directory of the shared files, under the cache's directory.
const EMPTY_DIR: &str = "empty";

/// The empty artifact's shared tree and info files.
#[derive(Debug)]
pub(crate) struct EmptyStore {
    dir: PathBuf,
    tree: PathBuf,
    /// Scratch space for making a new info file (the cache's `tmp/`).
    tmp: PathBuf,
    /// The empty artifact's info, and its JSON (the content of every
    /// `info-N.json`).
    info: ArtifactInfo,
    json: Vec<u8>,
    /// The N of the `info-N.json` new artifacts link to.
    current: Mutex<u64>,
}

impl EmptyStore {
    /// Opens (making what is missing) the shared files under `cache_dir`.
    /// `tmp` must exist and be the cache's scratch directory.
    pub(crate) fn open(cache_dir: &Path, tmp: &Path) -> Result<EmptyStore, CasError> {
        let dir = cache_dir.join(EMPTY_DIR);
        let tree = dir.join("tree");
        let info = Manifest::default().info();
        let json = serde_json::to_vec(&info).map_err(|e| CasError::Io {
            context: "encode the empty artifact's info".into(),
            source: std::io::Error::other(e),
        })?;
        fs::create_dir_all(&dir).ctx(|| format!("create {}", dir.display()))?;
        let store = EmptyStore { dir, tree, tmp: tmp.to_path_buf(), info, json, current: Mutex::new(0) };
        store.open_tree()?;
        let mut valid = Vec::new();
        for entry in fs::read_dir(&store.dir).ctx(|| format!("read {}", store.dir.display()))? {
            let entry = entry.ctx(|| format!("read {}", store.dir.display()))?;
            let name = entry.file_name();
            let Some(n) = name.to_str().and_then(parse_name) else { continue };
            let path = entry.path();
            if store.holds_info(&path) {
                valid.push((n, path));
            } else {
                remove_path(&path).ctx(|| format!("remove {}", path.display()))?;
            }
        }
        valid.sort();
        let current = match valid.pop() {
            Some((n, _)) => n,
            None => {
                store.make(0)?;
                0
            }
        };
        // Older files no artifact links to any more.
        for (_, path) in valid {
            if fs::symlink_metadata(&path).is_ok_and(|m| m.nlink() <= 1) {
                remove_path(&path).ctx(|| format!("remove {}", path.display()))?;
            }
        }
        *store.current.lock().unwrap_or_else(PoisonError::into_inner) = current;
        Ok(store)
    }

    /// The empty artifact's info.
    pub(crate) fn info(&self) -> ArtifactInfo {
        self.info
    }

    /// The tree every empty artifact shares.
    pub(crate) fn tree(&self) -> &Path {
        &self.tree
    }

    /// Whether `path` (a file, or a link to one) holds the empty artifact's
    /// info.
    pub(crate) fn holds_info(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
            && fs::read(path).is_ok_and(|bytes| bytes == self.json)
    }

    /// Makes `dest` (which must not exist) an empty artifact: a hard link
    /// to the current info file, or to a fresh one if that has as many
    /// links as the file system allows. Not durable until the caller
    /// fsyncs `dest`'s directory.
    pub(crate) fn link(&self, dest: &Path) -> Result<(), CasError> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let source = self.path(*current);
        match fs::hard_link(&source, dest) {
            Err(e) if e.raw_os_error() == Some(nix::libc::EMLINK) => {
                self.make(*current + 1)?;
                *current += 1;
                fs::hard_link(self.path(*current), dest)
            }
            // Removed by hand since the cache was opened: make it again.
            Err(e) if e.kind() == ErrorKind::NotFound && !source.exists() => {
                self.make(*current)?;
                fs::hard_link(&source, dest)
            }
            other => other,
        }
        .ctx(|| format!("link an empty artifact at {}", dest.display()))
    }

    fn path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("info-{n}.json"))
    }

    /// Writes `info-N.json` durably: in `tmp/`, fsynced, renamed into
    /// place, its directory fsynced.
    fn make(&self, n: u64) -> Result<(), CasError> {
        let staged = self.tmp.join(format!("empty-info-{n}.json"));
        let mut file = File::create(&staged).ctx(|| format!("create {}", staged.display()))?;
        file.write_all(&self.json).ctx(|| format!("write {}", staged.display()))?;
        file.sync_all().ctx(|| format!("fsync {}", staged.display()))?;
        drop(file);
        let path = self.path(n);
        fs::rename(&staged, &path).ctx(|| format!("rename {} to {}", staged.display(), path.display()))?;
        sync_dir(&self.dir)
    }

    /// Makes the shared tree an empty, sealed directory again (after a job
    /// running as root wrote into it).
    pub(crate) fn reset_tree(&self) -> Result<(), CasError> {
        // One reset at a time; the directory itself stays, for the runs
        // that have it as a dependency now.
        let _one = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let tree = &self.tree;
        fs::set_permissions(tree, fs::Permissions::from_mode(0o755))
            .ctx(|| format!("open {}", tree.display()))?;
        for entry in fs::read_dir(tree).ctx(|| format!("read {}", tree.display()))? {
            let path = entry.ctx(|| format!("read {}", tree.display()))?.path();
            remove_path(&path).ctx(|| format!("remove {}", path.display()))?;
        }
        crate::seal::seal(tree).ctx(|| format!("seal {}", tree.display()))
    }

    /// Makes sure the shared tree is an empty directory, sealed (a job
    /// given it as a dependency's output cannot write into it, unless it
    /// runs as root, and a change shows: see the `seal` module).
    fn open_tree(&self) -> Result<(), CasError> {
        let fine = match fs::read_dir(&self.tree).map(|mut entries| entries.next().is_none()) {
            Ok(true) => true,
            Ok(false) => {
                remove_path(&self.tree).ctx(|| format!("empty {}", self.tree.display()))?;
                false
            }
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(_) => {
                remove_path(&self.tree).ctx(|| format!("replace {}", self.tree.display()))?;
                false
            }
        };
        if !fine {
            fs::create_dir(&self.tree).ctx(|| format!("create {}", self.tree.display()))?;
            sync_dir(&self.dir)?;
        }
        crate::seal::seal(&self.tree).ctx(|| format!("seal {}", self.tree.display()))
    }
}

/// N from `info-N.json`.
fn parse_name(name: &str) -> Option<u64> {
    name.strip_prefix("info-")?.strip_suffix(".json")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(parse_name("info-0.json"), Some(0));
        assert_eq!(parse_name("info-12.json"), Some(12));
        assert_eq!(parse_name("info-.json"), None);
        assert_eq!(parse_name("info-1.json.tmp"), None);
        assert_eq!(parse_name("tree"), None);
    }

    #[test]
    fn reopening_keeps_the_newest_file_and_drops_unlinked_older_ones() {
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("tmp");
        fs::create_dir(&tmp).unwrap();
        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        let a = root.path().join("a");
        store.link(&a).unwrap();
        // As after an EMLINK: a newer file, which a second artifact uses.
        store.make(1).unwrap();
        *store.current.lock().unwrap() = 1;
        let b = root.path().join("b");
        store.link(&b).unwrap();
        assert!(store.holds_info(&a) && store.holds_info(&b));
        drop(store);

        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        assert_eq!(*store.current.lock().unwrap(), 1);
        assert!(store.path(0).exists(), "still linked from a");
        fs::remove_file(&a).unwrap();
        drop(store);
        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        assert!(!store.path(0).exists(), "no artifact links to it any more");
        assert!(store.path(1).exists());
    }

    #[test]
    fn a_damaged_tree_or_info_file_is_replaced() {
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("tmp");
        fs::create_dir(&tmp).unwrap();
        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        fs::write(store.tree().join("intruder"), b"x").unwrap();
        fs::write(store.path(0), b"{}").unwrap();
        drop(store);
        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        assert_eq!(fs::read_dir(store.tree()).unwrap().count(), 0);
        assert!(store.holds_info(&store.path(0)));
    }

    #[test]
    fn a_removed_info_file_is_made_again_on_the_next_link() {
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("tmp");
        fs::create_dir(&tmp).unwrap();
        let store = EmptyStore::open(root.path(), &tmp).unwrap();
        fs::remove_file(store.path(0)).unwrap();
        let a = root.path().join("a");
        store.link(&a).unwrap();
        assert!(store.holds_info(&a));
    }
}
