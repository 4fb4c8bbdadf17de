//! [`ArtifactWriter`] (an artifact being written, in a temporary directory)
//! and [`ArtifactGuard`] (a pinned, committed artifact).

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CasError, IoContext};
use crate::fsutil::remove_path;
use crate::manifest::{self, Manifest};
use crate::{ArtifactInfo, Inner, Key, TREE_DIR};

/// An artifact being written: fill [`ArtifactWriter::dir`] (files,
/// directories, relative symlinks), then [`ArtifactWriter::commit`].
/// Dropping it without committing removes everything written.
pub struct ArtifactWriter {
    inner: Arc<Inner>,
    id: Key,
    /// `tmp/art-…`: receives `tree/`, then the manifest and info files, and
    /// is renamed into place as a whole.
    wrapper: PathBuf,
    tree: PathBuf,
    /// Set once `wrapper` was renamed into place.
    installed: bool,
}

impl fmt::Debug for ArtifactWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactWriter").field("id", &self.id).field("dir", &self.tree).finish()
    }
}

impl ArtifactWriter {
    pub(crate) fn new(inner: Arc<Inner>, id: Key) -> Result<ArtifactWriter, CasError> {
        let wrapper = tempfile::Builder::new()
            .prefix("art-")
            .tempdir_in(inner.tmp())
            .ctx(|| format!("create a temporary directory in {}", inner.tmp().display()))?
            .keep();
        let tree = wrapper.join(TREE_DIR);
        let writer = ArtifactWriter { inner, id, wrapper, tree, installed: false };
        std::fs::create_dir(&writer.tree).ctx(|| format!("create {}", writer.tree.display()))?;
        Ok(writer)
    }

    /// The artifact's ID.
    pub fn id(&self) -> &Key {
        &self.id
    }

    /// The (initially empty) directory to write the artifact's tree into.
    pub fn dir(&self) -> &Path {
        &self.tree
    }

    /// Computes the manifest (fsyncing every file and directory) and tree
    /// digest, then moves the artifact into place atomically and evicts if
    /// the cache is over its limit. If the artifact is already present, the
    /// new tree is discarded and the present artifact's info returned
    /// (the first commit wins). Fails with [`CasError::UnsafePath`] on
    /// special files, non-UTF-8 names and absolute or escaping symlinks, and
    /// [`CasError::TooLarge`] past `max_bytes`.
    pub fn commit(self) -> Result<ArtifactInfo, CasError> {
        let manifest = manifest::scan_tree(&self.tree, true, self.inner.max_bytes)?;
        let info = manifest.info();
        self.commit_prepared(&manifest, info)
    }

    /// [`commit`](Self::commit), returning the artifact pinned, for a
    /// caller that still has to read it (to push it elsewhere, say): the
    /// pin is taken in the same step as the artifact is put in place, so no
    /// eviction (another commit's) can come in between. The artifact is
    /// the most recently used entry then, but in a small cache whose other
    /// entries are pinned it would be the next to go. (An artifact already
    /// present is pinned likewise.)
    pub fn commit_pinned(mut self) -> Result<ArtifactGuard, CasError> {
        let manifest = manifest::scan_tree(&self.tree, true, self.inner.max_bytes)?;
        let installed =
            self.inner.install_artifact(&self.id, &self.wrapper, &manifest, manifest.info(), true)?;
        self.installed = installed.placed;
        installed.guard.ok_or(CasError::NotFound(self.id))
    }

    /// Commits a tree whose manifest is already known (written by `unpack`).
    pub(crate) fn commit_prepared(
        mut self,
        manifest: &Manifest,
        info: ArtifactInfo,
    ) -> Result<ArtifactInfo, CasError> {
        let installed = self.inner.install_artifact(&self.id, &self.wrapper, manifest, info, false)?;
        self.installed = installed.placed;
        Ok(installed.info)
    }
}

impl Drop for ArtifactWriter {
    fn drop(&mut self) {
        if !self.installed {
            let _ = remove_path(&self.wrapper);
        }
    }
}

/// A committed artifact, pinned: while any guard for it lives, it is never
/// evicted or removed. Derefs to the artifact's directory (read it, do not
/// modify it).
pub struct ArtifactGuard {
    inner: Arc<Inner>,
    id: Key,
    path: PathBuf,
    info: ArtifactInfo,
}

impl fmt::Debug for ArtifactGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactGuard")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("info", &self.info)
            .finish()
    }
}

impl ArtifactGuard {
    pub(crate) fn new(inner: Arc<Inner>, id: Key, path: PathBuf, info: ArtifactInfo) -> ArtifactGuard {
        ArtifactGuard { inner, id, path, info }
    }

    /// The artifact's ID.
    pub fn key(&self) -> &Key {
        &self.id
    }

    /// The artifact's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The artifact's tree digest, size and file count.
    pub fn info(&self) -> &ArtifactInfo {
        &self.info
    }
}

impl Deref for ArtifactGuard {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ArtifactGuard {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for ArtifactGuard {
    fn drop(&mut self) {
        self.inner.unpin(&self.id);
    }
}
