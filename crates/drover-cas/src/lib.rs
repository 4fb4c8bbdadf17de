//! drover's on-disk content-addressed cache.
//!
//! Workers (and the coordinator) keep job outputs (**artifacts**: directory
//! trees, keyed by the job's content ID) and source files (**blobs**: keyed by
//! the blake3 digest of their content) in a [`Cas`], bounded by a size limit
//! with least-recently-used eviction, and move artifacts between machines in
//! the streaming [`pack`] format ([`Cas::pack`], [`Cas::unpack`]).
//!
//! The API is synchronous (`std::io::Read`/`Write`); async callers use
//! `spawn_blocking`. A [`Cas`] is `Send + Sync` and cheap to clone (clones
//! share one cache).
//!
//! # Layout on disk
//!
//! ```text
//! dir/lock                             held (flock) while a Cas is open
//! dir/blobs/ab/abcdef…                 blob content (name: hex digest)
//! dir/artifacts/ab/abcdef…/info.json   ArtifactInfo (tree digest, size, files)
//! dir/artifacts/ab/abcdef…/manifest.json   the entries (see `manifest`)
//! dir/artifacts/ab/abcdef…/tree/       the artifact's files
//! dir/artifacts/ab/abcdef…             an artifact with an empty tree: a
//!                                      hard link to dir/empty/info-N.json
//! dir/empty/                           what every empty artifact shares
//!                                      (see below)
//! dir/tmp/                             temporary files, wiped on open
//! dir/sealed                           every artifact tree is sealed (see
//!                                      the `seal` module)
//! ```
//!
//! Committed entries are immutable (artifact trees sealed read-only: see
//! the `seal` module). Everything is first written under
//! `tmp/` and fsynced, then renamed into place in one step (a whole artifact
//! directory, with its manifest, is one rename), so a crash leaves either
//! nothing or a complete entry, plus leftovers in `tmp/` that the next
//! [`Cas::open`] wipes. Renames into and out of `blobs/` and `artifacts/`
//! happen under the index lock, so the index and the disk always agree.
//! Removed entries are first renamed into `tmp/` and deleted outside the
//! lock. Once in place, an entry's fan-out directory is fsynced before the
//! put or commit returns (and, the first time the cache puts an artifact
//! there, the `artifacts/` directory holding it), so a returned entry
//! survives power loss; a cache
//! opened with [`Durability::ProcessCrash`] skips that last fsync for
//! artifacts: an artifact's files are still on disk before it appears (so it
//! is never torn), but power loss may take the new entry away again, as if
//! it had been evicted. (A worker tells the coordinator its whole cache when
//! it registers again, so nothing keeps pointing at such an artifact.)
//!
//! # The empty artifact
//!
//! An artifact whose tree is empty, however it arrives (a commit, an
//! unpack, [`Cas::commit_empty_artifact`]), is stored in a compact form:
//! one hard link, at its place under `artifacts/`, to a shared file holding
//! its info, with a shared empty tree (`dir/empty/`, see the private
//! `empty` module). A commit is then one `link(2)` and one fsync, where a
//! directory of its own took four inodes and five fsyncs. Readers see no
//! difference: its guard's path is the shared tree, its manifest is empty.
//!
//! # Size and eviction
//!
//! `used_bytes` counts blob sizes plus artifact file sizes (not manifests or
//! directories). After every put and commit the cache evicts the least
//! recently used entries, blobs and artifacts alike, until it is back within
//! `max_bytes`, never touching a pinned artifact (one with a live
//! [`ArtifactGuard`]) or the entry just added; so the cache can stay above
//! `max_bytes` while pins hold the space. An artifact committed with
//! [`ArtifactWriter::commit_pinned`] is pinned in the same step, for a
//! caller that still has to read it: the next commit cannot take it first.
//! A single blob or artifact larger than `max_bytes` is refused
//! ([`CasError::TooLarge`]).
//!
//! A cache can also keep room on its filesystem ([`Cas::keep_free`]): the
//! same eviction then goes on until what it frees covers the filesystem's
//! shortfall, so a disk that other files fill does not leave the next jobs
//! without room (or until nothing is left to evict: the reserve may cost
//! the whole cache). The free space is measured before each pass, outside
//! the index lock; what earlier passes evicted but nobody has deleted yet
//! counts as free. Sizes are the files' lengths, not the blocks they take.
//! Pins and the entry just added are spared here too, and so are blobs:
//! they are the sources of builds in flight (uploaded for a submission,
//! fetched for a run that is starting), small beside the outputs, and on a
//! disk short of its reserve for good (a small volume, a reserve larger
//! than the disk) every new blob evicted the one fetched before it, so a
//! job that sees two sources never started. Blobs leave for the size
//! limit only.
//!
//! Blobs are never pinned: a path from [`Cas::blob_path`] stays valid until
//! the blob is evicted. Callers needing it longer copy or hard-link it.
//!
//! # Last use across restarts
//!
//! The LRU order lives in memory as a logical clock. It is persisted
//! approximately through file modification times: every use touches the
//! blob's file or the artifact's `info.json` (a cheap `futimens`), and
//! [`Cas::open`] rebuilds the order by sorting entries by those times. No
//! index file is written, so there is nothing to corrupt or replay.

mod artifact;
mod empty;
mod error;
mod fsutil;
mod index;
mod key;
pub mod manifest;
pub mod pack;
mod seal;

use std::fmt;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

pub use artifact::{ArtifactGuard, ArtifactWriter};
pub use error::CasError;
pub use fsutil::try_lock_dir;

/// Removes a directory tree that may hold a cache's sealed, read-only
/// artifacts (which `std::fs::remove_dir_all` cannot delete unless run as
/// root); a missing path is fine.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    fsutil::remove_path(path)
}
pub use key::{Key, ParseKeyError};
pub use manifest::ArtifactInfo;

use empty::EmptyStore;
use error::IoContext;
use fsutil::{copy_hashing, remove_path, touch};
use index::{Index, Slot, Unpinned};
use manifest::Manifest;

const INFO_FILE: &str = "info.json";
const MANIFEST_FILE: &str = "manifest.json";
const TREE_DIR: &str = "tree";
/// In the cache's directory once every artifact tree in it is sealed.
const SEALED_MARK: &str = "sealed";

/// The content-addressed cache. See the crate documentation.
#[derive(Clone)]
pub struct Cas {
    inner: Arc<Inner>,
}

impl fmt::Debug for Cas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cas")
            .field("dir", &self.inner.dir)
            .field("max_bytes", &self.inner.max_bytes)
            .field("used_bytes", &self.used_bytes())
            .finish()
    }
}

/// What a committed artifact survives once the commit returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// A crash of the process: its files are on disk before it appears, but
    /// the directory entry that makes it appear is not fsynced, so power
    /// loss or a kernel crash may take it away (whole: never torn). Saves
    /// one synchronous directory write per commit.
    ProcessCrash,
    /// Also power loss: the directory entry is fsynced before the commit
    /// returns.
    #[default]
    PowerLoss,
}

/// Room a cache keeps free on its filesystem ([`Cas::keep_free`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reserve {
    /// None: only `max_bytes` bounds the cache.
    #[default]
    Nothing,
    /// This many bytes.
    Bytes(u64),
    /// This share of the filesystem's size, in percent (at most 100).
    Percent(u8),
}

/// The room drover's caches keep free unless configured otherwise: 1 GiB
/// (a share of the filesystem would be hundreds of gigabytes on a big one).
pub const DEFAULT_KEEP_FREE: Reserve = Reserve::Bytes(1 << 30);

pub(crate) struct Inner {
    dir: PathBuf,
    durability: Durability,
    blobs: PathBuf,
    artifacts: PathBuf,
    tmp: PathBuf,
    /// The shared parts of every empty artifact.
    empty: EmptyStore,
    max_bytes: u64,
    /// Room kept free on the filesystem. Read before the state lock is
    /// taken (measuring the filesystem may block), never while it is held.
    reserve: Mutex<Reserve>,
    /// How the filesystem is measured (`statvfs`; a test may count instead).
    measure: fn(&Path) -> Option<Space>,
    state: Mutex<State>,
    /// Holds the directory's lock for as long as the cache is open.
    _lock: File,
}

/// The index plus bookkeeping, under one lock.
#[derive(Debug, Default)]
struct State {
    index: Index,
    /// Artifacts evicted (or found corrupt by `pack`) since the last
    /// `take_evicted`.
    evicted: Vec<Key>,
    /// Paths under tmp/ to delete once the lock is released.
    trash: Trash,
    /// The fan-out directories under `artifacts/` made (or found) since the
    /// cache was opened, one bit per first byte of a key: a commit into one
    /// of them skips the `mkdir` that would fail with "exists".
    fan_outs: [u64; 4],
    trash_seq: u64,
    /// Bytes evicted whose files are not deleted yet (in some trash): the
    /// filesystem does not count them free, an eviction pass does.
    pending_free: u64,
    /// The last eviction pass ran out of entries to evict while the
    /// filesystem was still short of the reserve.
    reserve_unmet: bool,
    /// `reserve_unmet` changed since the last [`Cas::reserve_news`].
    reserve_news: Option<bool>,
}

/// Entries moved out of the cache, to delete once the lock is released.
#[derive(Debug, Default)]
struct Trash {
    paths: Vec<PathBuf>,
    /// Of which evicted bytes (counted in `State::pending_free` until the
    /// files are deleted).
    evicted: u64,
}

/// What putting an artifact in place did.
pub(crate) struct Installed {
    /// The committed artifact's info (the present artifact's, if it was
    /// there).
    pub(crate) info: ArtifactInfo,
    /// Whether the new entry was put in place (not if the artifact was
    /// present already).
    pub(crate) placed: bool,
    /// The artifact, pinned, if a pin was asked for.
    pub(crate) guard: Option<ArtifactGuard>,
}

/// A filesystem's size and the room left on it, in bytes.
#[derive(Debug, Clone, Copy)]
struct Space {
    total: u64,
    available: u64,
}

/// The filesystem holding `dir`, by `statvfs` (`None` if it cannot be
/// measured, or says it has no size).
fn statvfs_space(dir: &Path) -> Option<Space> {
    let fs = nix::sys::statvfs::statvfs(dir).ok()?;
    let unit = fs.fragment_size();
    let total = fs.blocks().saturating_mul(unit);
    (total > 0).then(|| Space { total, available: fs.blocks_available().saturating_mul(unit) })
}

impl Cas {
    /// Opens (creating if needed) the cache in `dir`, bounded by `max_bytes`.
    /// Wipes `dir/tmp` (crash leftovers), drops incomplete artifact entries,
    /// rebuilds the index from what is on disk (last-use order from file
    /// modification times), and evicts down to `max_bytes` if needed (see
    /// [`Cas::take_evicted`]). Fails if another `Cas` has `dir` open.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Cas, CasError> {
        Cas::open_with(dir, max_bytes, Durability::PowerLoss)
    }

    /// [`Cas::open`], with what a committed artifact survives (blobs are
    /// always made to survive power loss).
    pub fn open_with(dir: &Path, max_bytes: u64, durability: Durability) -> Result<Cas, CasError> {
        let blobs = dir.join("blobs");
        let artifacts = dir.join("artifacts");
        let tmp = dir.join("tmp");
        for d in [dir, &blobs, &artifacts] {
            fs::create_dir_all(d).ctx(|| format!("create {}", d.display()))?;
        }
        let lock_path = dir.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .ctx(|| format!("open {}", lock_path.display()))?;
        lock.try_lock().map_err(|e| CasError::Io {
            context: format!("lock {}", lock_path.display()),
            source: match e {
                fs::TryLockError::Error(e) => e,
                fs::TryLockError::WouldBlock => {
                    std::io::Error::new(ErrorKind::WouldBlock, "the cache is open elsewhere")
                }
            },
        })?;
        remove_path(&tmp).ctx(|| format!("wipe {}", tmp.display()))?;
        fs::create_dir(&tmp).ctx(|| format!("create {}", tmp.display()))?;
        let empty = EmptyStore::open(dir, &tmp)?;
        let inner = Inner {
            dir: dir.to_path_buf(),
            durability,
            blobs,
            artifacts,
            tmp,
            empty,
            max_bytes,
            reserve: Mutex::new(Reserve::Nothing),
            measure: statvfs_space,
            state: Mutex::new(State::default()),
            _lock: lock,
        };
        inner.rebuild()?;
        inner.seal_older_trees()?;
        let cas = Cas { inner: Arc::new(inner) };
        cas.inner.evict_to_limits();
        Ok(cas)
    }

    /// Makes every fan-out directory of `artifacts/` (`00` to `ff`) that
    /// is missing, so that no commit makes one: on a fresh cache, each of the
    /// first 256 commits would otherwise allocate a directory's inode on the
    /// way to reporting its job's end (hundreds of microseconds each on a
    /// file system busy with deletions). For a long-lived cache such as a
    /// worker's; a one-off cache has no use for it. Under
    /// [`Durability::PowerLoss`], `artifacts/` is then fsynced once, as a
    /// commit into a fan-out directory would have done (one made by an
    /// earlier process that crashed before its fsync is covered too).
    pub fn make_fan_outs(&self) -> Result<(), CasError> {
        let inner = &self.inner;
        for byte in 0..=255u8 {
            let dir = inner.artifacts.join(format!("{byte:02x}"));
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(source) => {
                    return Err(CasError::Io { context: format!("create {}", dir.display()), source });
                }
            }
        }
        if inner.durability == Durability::PowerLoss {
            manifest::sync_dir(&inner.artifacts)?;
        }
        inner.lock().fan_outs = [u64::MAX; 4];
        Ok(())
    }

    /// Whether the room kept free ([`Cas::keep_free`]) went missing since
    /// the last call: `Some(true)` if an eviction pass found the filesystem
    /// still short of it with nothing left to evict (everything left is in
    /// use, or the cache is empty), `Some(false)` if a later pass found the
    /// room back, `None` if neither changed. For a warning, once per change.
    pub fn reserve_news(&self) -> Option<bool> {
        self.inner.lock().reserve_news.take()
    }

    /// Keeps `reserve` free on the cache's filesystem from now on (see the
    /// crate doc, "Size and eviction"), evicting at once if it is short
    /// (reported by [`Cas::take_evicted`]).
    pub fn keep_free(&self, reserve: Reserve) {
        *self.inner.reserve.lock().unwrap_or_else(PoisonError::into_inner) = reserve;
        self.inner.evict_to_limits();
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The size limit.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// Bytes held: blob sizes plus artifact file sizes.
    pub fn used_bytes(&self) -> u64 {
        self.inner.lock().index.used()
    }

    // ---- blobs ----

    /// Whether the blob is in the cache (does not mark it used).
    pub fn has_blob(&self, digest: &Key) -> bool {
        self.inner.lock().index.has_blob(digest)
    }

    /// The size of the blob, if the store has it.
    pub fn blob_size(&self, digest: &Key) -> Option<u64> {
        self.inner.lock().index.blob_size(digest)
    }

    /// The path of the blob's file, marking it used; `None` if absent.
    pub fn blob_path(&self, digest: &Key) -> Option<PathBuf> {
        if !self.inner.lock().index.touch_blob(digest) {
            return None;
        }
        let path = self.inner.blob_file(digest);
        touch(&path);
        Some(path)
    }

    /// Stores the content read from `reader` as the blob `digest` and returns
    /// its path. The content streams to a temporary file, is fsynced and
    /// verified (a mismatch is [`CasError::DigestMismatch`] and stores
    /// nothing), then renamed into place. If the blob is already present the
    /// reader is not read. Concurrent puts of one blob all succeed.
    pub fn put_blob(&self, reader: &mut dyn Read, digest: &Key) -> Result<PathBuf, CasError> {
        if let Some(path) = self.blob_path(digest) {
            return Ok(path);
        }
        let inner = &self.inner;
        let mut tmp = tempfile::Builder::new()
            .prefix("blob-")
            .tempfile_in(&inner.tmp)
            .ctx(|| format!("create a temporary file in {}", inner.tmp.display()))?;
        let tmp_path = tmp.path().to_path_buf();
        let (actual, size) = copy_hashing(reader, tmp.as_file_mut(), inner.max_bytes, "blob", &tmp_path)?;
        if actual != *digest {
            return Err(CasError::DigestMismatch { expected: *digest, actual });
        }
        tmp.as_file().sync_all().ctx(|| format!("fsync {}", tmp_path.display()))?;
        let path = inner.blob_file(digest);
        let parent = path.parent().unwrap_or(&inner.blobs).to_path_buf();
        let short = inner.shortfall();
        let trash = {
            let mut st = inner.lock();
            if st.index.touch_blob(digest) {
                drop(st);
                touch(&path);
                return Ok(path);
            }
            fs::create_dir_all(&parent).ctx(|| format!("create {}", parent.display()))?;
            tmp.persist(&path).map_err(|e| CasError::Io {
                context: format!("rename a blob into {}", path.display()),
                source: e.error,
            })?;
            st.index.insert_blob(*digest, size, None);
            let evicted = inner.evict_locked(&mut st, Some(Slot::Blob(*digest)), short);
            st.evicted.extend(evicted);
            std::mem::take(&mut st.trash)
        };
        inner.drain(trash);
        manifest::sync_dir(&parent)?;
        Ok(path)
    }

    /// Hashes the local file at `path` and stores it as a blob (a no-op if
    /// that blob is present); returns its digest.
    pub fn put_blob_file(&self, path: &Path) -> Result<Key, CasError> {
        let mut file = File::open(path).ctx(|| format!("open {}", path.display()))?;
        let (digest, _) = copy_hashing(&mut file, &mut std::io::sink(), u64::MAX, "file", path)
            .map_err(|e| relabel_read(e, path))?;
        if self.blob_path(&digest).is_some() {
            return Ok(digest);
        }
        let mut file = File::open(path).ctx(|| format!("open {}", path.display()))?;
        self.put_blob(&mut file, &digest).map_err(|e| relabel_read(e, path))?;
        Ok(digest)
    }

    // ---- artifacts ----

    /// Starts writing the artifact `id`: fill [`ArtifactWriter::dir`], then
    /// [`ArtifactWriter::commit`]. Dropping the writer aborts.
    pub fn begin_artifact(&self, id: &Key) -> Result<ArtifactWriter, CasError> {
        ArtifactWriter::new(self.inner.clone(), *id)
    }

    /// Commits `id` as an artifact with an empty tree (the output of a job
    /// that wrote nothing), the same as committing an untouched
    /// [`ArtifactWriter`] but without creating and scanning a tree to find
    /// it empty: one hard link and one fsync (see "The empty artifact"
    /// above). Same atomicity and durability, and same answer if the
    /// artifact is already present.
    pub fn commit_empty_artifact(&self, id: &Key) -> Result<ArtifactInfo, CasError> {
        self.inner.install_empty(id, false).map(|installed| installed.info)
    }

    /// [`Cas::commit_empty_artifact`], returning the artifact pinned (see
    /// [`ArtifactWriter::commit_pinned`]).
    pub fn commit_empty_artifact_pinned(&self, id: &Key) -> Result<ArtifactGuard, CasError> {
        let installed = self.inner.install_empty(id, true)?;
        installed.guard.ok_or(CasError::NotFound(*id))
    }

    /// The info of every empty artifact (its `tree` is the empty tree's
    /// digest): an output known to be empty needs no transfer.
    pub fn empty_info(&self) -> ArtifactInfo {
        self.inner.empty.info()
    }

    /// The committed artifact `id`, pinned (never evicted or removed while
    /// the guard lives) and marked used; `None` if absent.
    pub fn artifact(&self, id: &Key) -> Option<ArtifactGuard> {
        self.inner.pin(id, true)
    }

    /// The artifact's info (does not mark it used); `None` if absent.
    pub fn artifact_info(&self, id: &Key) -> Option<ArtifactInfo> {
        self.inner.lock().index.artifact(id).map(|e| e.info)
    }

    /// The committed artifacts.
    pub fn artifacts(&self) -> Vec<Key> {
        self.inner.lock().index.artifact_keys()
    }

    /// Removes the artifact: `Ok(false)` if absent, [`CasError::Pinned`] if
    /// a guard holds it.
    pub fn remove_artifact(&self, id: &Key) -> Result<bool, CasError> {
        let trash = {
            let mut st = self.inner.lock();
            match st.index.artifact_entry(id) {
                None => return Ok(false),
                Some(e) if e.pins > 0 || e.doomed => return Err(CasError::Pinned(*id)),
                Some(_) => {}
            }
            self.inner.remove_locked(&mut st, Slot::Artifact(*id));
            std::mem::take(&mut st.trash)
        };
        self.inner.drain(trash);
        Ok(true)
    }

    /// Re-hashes the artifact's files against its manifest (and checks no
    /// entry was added, removed or changed kind). On corruption the artifact
    /// is removed (at once, or when its last guard drops if pinned) and the
    /// answer is `Ok(false)`. [`CasError::NotFound`] if absent; other I/O
    /// failures are errors and remove nothing.
    pub fn verify_artifact(&self, id: &Key) -> Result<bool, CasError> {
        let guard = self.inner.pin(id, false).ok_or(CasError::NotFound(*id))?;
        let outcome = self.inner.check_artifact(&guard);
        drop(guard);
        match outcome {
            Ok(()) => Ok(true),
            Err(e) if is_damage(&e) => {
                self.inner.discard(id, false);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The first path in artifact `id`'s tree at `tree` (the path of a
    /// guard the caller holds; relative to it, `.` for the tree itself)
    /// that changed since the artifact was put in place, if any (see the
    /// `seal` module): a job that was given the tree wrote into it, or made
    /// part of it unreadable (said as such). The tree is checked even if
    /// the artifact was already found changed by another holder, so every
    /// run that held it hears of it. A changed artifact is removed (at
    /// once, or when its last guard drops) and reported by
    /// [`Cas::take_evicted`]; the tree every empty artifact shares is
    /// emptied in place instead, and the empty artifacts stay.
    pub fn changed(&self, id: &Key, tree: &Path) -> Option<String> {
        let changed = match seal::first_change(tree) {
            Ok(changed) => changed,
            Err(e) => Some(format!(". (it cannot be read: {e})")),
        };
        if changed.is_some() {
            if tree == self.inner.empty.tree() {
                if let Err(e) = self.inner.empty.reset_tree() {
                    // Every later empty dependency will be found changed.
                    return Some(format!(
                        "{} (and it cannot be emptied again: {e})",
                        changed.unwrap_or_default()
                    ));
                }
            } else {
                self.inner.discard(id, true);
            }
        }
        changed
    }

    /// Evicts least recently used entries (unpinned artifacts and blobs)
    /// until `used_bytes() <= max_bytes`; returns the evicted artifacts. Keys
    /// returned here are not also reported by [`Cas::take_evicted`].
    pub fn evict(&self) -> Vec<Key> {
        let short = self.inner.shortfall();
        let (evicted, trash) = {
            let mut st = self.inner.lock();
            let evicted = self.inner.evict_locked(&mut st, None, short);
            (evicted, std::mem::take(&mut st.trash))
        };
        self.inner.drain(trash);
        evicted
    }

    /// Evicts as a commit does (to the size limit, and the room kept free
    /// on the disk), reported by [`Cas::take_evicted`]: for a caller that
    /// found the disk full between commits (a job's files filled it).
    pub fn make_room(&self) {
        self.inner.evict_to_limits();
    }

    /// Drains the artifacts that left the cache on their own since the last
    /// call: evicted automatically (on open, put, commit, unpack), or found
    /// corrupt while being packed. Artifacts removed through
    /// [`Cas::remove_artifact`], [`Cas::verify_artifact`] or returned by
    /// [`Cas::evict`] are not included.
    pub fn take_evicted(&self) -> Vec<Key> {
        std::mem::take(&mut self.inner.lock().evicted)
    }

    // ---- transfer ----

    /// Writes the artifact to `out` in the [`pack`] format, streaming file
    /// contents in chunks. The artifact is pinned meanwhile. If a stored file
    /// no longer matches its manifest the stream stops short (so the reader
    /// rejects it), the artifact is removed (reported by `take_evicted`) and
    /// the error is [`CasError::Corrupt`].
    pub fn pack(&self, id: &Key, out: &mut dyn Write) -> Result<ArtifactInfo, CasError> {
        let guard = self.inner.pin(id, true).ok_or(CasError::NotFound(*id))?;
        let info = *guard.info();
        let result = self
            .inner
            .load_manifest(&guard)
            .and_then(|manifest| pack::write_pack(guard.path(), &manifest, &info, out));
        drop(guard);
        match result {
            Ok(()) => Ok(info),
            Err(e) if is_damage(&e) => {
                self.inner.discard(id, true);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads a pack from `input` and commits it as the artifact `id`. Every
    /// file's digest and the tree digest are verified (against the pack's
    /// trailer and `expected_tree` if given), unsafe paths are refused, and
    /// the total size may not exceed `max_bytes`; see [`pack`]. On any
    /// failure nothing is left behind. Reads nothing past the pack's
    /// trailer. If the artifact is already present the pack is still read
    /// and verified, then discarded, and the present artifact's info is
    /// returned.
    pub fn unpack(
        &self,
        id: &Key,
        expected_tree: Option<&Key>,
        input: &mut dyn Read,
    ) -> Result<ArtifactInfo, CasError> {
        // The pack's header and first entry tag: an end tag there makes an
        // empty pack, which is read and verified like any other but needs
        // no directory to unpack into (the empty artifact is a link, see
        // "The empty artifact" above).
        let mut head = [0u8; pack::HEAD_LEN + 1];
        let got = read_up_to(input, &mut head)?;
        let mut input = std::io::Cursor::new(&head[..got]).chain(input);
        if got == head.len() && pack::is_end_tag(head[pack::HEAD_LEN]) {
            pack::read_pack(&mut input, Path::new(""), self.inner.max_bytes, expected_tree, false)?;
            return self.inner.install_empty(id, false).map(|installed| installed.info);
        }
        let writer = self.begin_artifact(id)?;
        let (manifest, info) =
            pack::read_pack(&mut input, writer.dir(), self.inner.max_bytes, expected_tree, true)?;
        writer.commit_prepared(&manifest, info)
    }
}

/// Reads a pack from `input` into a new directory `dir` (outside any
/// cache: an export), verified as [`Cas::unpack`] verifies it, files
/// `0644` or `0755`. Nothing is fsynced. On failure `dir` is removed.
pub fn unpack_to_dir(
    input: &mut dyn Read,
    dir: &Path,
    expected_tree: Option<&Key>,
) -> Result<ArtifactInfo, CasError> {
    fs::create_dir(dir).ctx(|| format!("create {}", dir.display()))?;
    match pack::read_pack(input, dir, u64::MAX, expected_tree, false) {
        Ok((_, info)) => Ok(info),
        Err(e) => {
            let _ = fsutil::remove_path(dir);
            Err(e)
        }
    }
}

/// Reads from `input` until `buf` is full or the input ends; returns how
/// many bytes it read.
fn read_up_to(input: &mut dyn Read, buf: &mut [u8]) -> Result<usize, CasError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).ctx(|| "read pack stream".into()),
        }
    }
    Ok(got)
}

/// Whether an error says a stored artifact is damaged.
fn is_damage(e: &CasError) -> bool {
    e.is_corruption()
}

/// Errors reading a local file given to `put_blob_file` name that file.
fn relabel_read(e: CasError, path: &Path) -> CasError {
    match e {
        CasError::Io { context, source } if context.starts_with("read ") => {
            CasError::Io { context: format!("read {}", path.display()), source }
        }
        other => other,
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn blob_file(&self, key: &Key) -> PathBuf {
        let hex = key.to_hex();
        self.blobs.join(&hex[..2]).join(hex)
    }

    fn artifact_dir(&self, key: &Key) -> PathBuf {
        let hex = key.to_hex();
        self.artifacts.join(&hex[..2]).join(hex)
    }

    fn slot_path(&self, slot: Slot) -> PathBuf {
        match slot {
            Slot::Blob(k) => self.blob_file(&k),
            Slot::Artifact(k) => self.artifact_dir(&k),
        }
    }

    /// Deletes trash, outside the lock.
    fn drain(&self, trash: Trash) {
        for path in trash.paths {
            let _ = remove_path(&path);
        }
        if trash.evicted > 0 {
            let mut st = self.lock();
            st.pending_free = st.pending_free.saturating_sub(trash.evicted);
        }
    }

    /// Takes an entry out of the index and moves its files to the trash.
    fn remove_locked(&self, st: &mut State, slot: Slot) {
        if !st.index.remove(slot) {
            return;
        }
        let from = self.slot_path(slot);
        st.trash_seq += 1;
        let to = self.tmp.join(format!("trash-{}", st.trash_seq));
        match fs::rename(&from, &to) {
            Ok(()) => st.trash.paths.push(to),
            // Renaming failed (say tmp/ is unwritable): delete in place,
            // under the lock, so no later commit collides with it.
            Err(_) => {
                let _ = remove_path(&from);
            }
        }
    }

    /// Evicts until within the limits (the size bound, the reserve), for
    /// [`Cas::take_evicted`] to report.
    fn evict_to_limits(&self) {
        let short = self.shortfall();
        let trash = {
            let mut st = self.lock();
            let evicted = self.evict_locked(&mut st, None, short);
            st.evicted.extend(evicted);
            std::mem::take(&mut st.trash)
        };
        self.drain(trash);
    }

    /// Evicts LRU entries (except `protect`) until within `max_bytes` and
    /// until what they free covers `short`, the filesystem's shortfall
    /// measured before the lock was taken (less what earlier passes evicted
    /// and nobody deleted yet); returns the evicted artifacts.
    fn evict_locked(&self, st: &mut State, protect: Option<Slot>, short: u64) -> Vec<Key> {
        let mut evicted = Vec::new();
        let mut short = short.saturating_sub(st.pending_free);
        while st.index.used() > self.max_bytes || short > 0 {
            // For the reserve alone, outputs only (see the crate doc).
            let blobs = st.index.used() > self.max_bytes;
            let Some(slot) = st.index.victim(protect, blobs) else { break };
            let used = st.index.used();
            self.remove_locked(st, slot);
            let freed = used - st.index.used();
            short = short.saturating_sub(freed);
            st.pending_free += freed;
            st.trash.evicted += freed;
            if let Slot::Artifact(k) = slot {
                evicted.push(k);
            }
        }
        // Still short: nothing unpinned is left to evict.
        let unmet = short > 0;
        if unmet != st.reserve_unmet {
            st.reserve_unmet = unmet;
            st.reserve_news = Some(unmet);
        }
        evicted
    }

    /// How many bytes the filesystem lacks to keep the reserve free (0 if
    /// none is kept, or the filesystem cannot be measured). Called without
    /// the state lock.
    fn shortfall(&self) -> u64 {
        let reserve = *self.reserve.lock().unwrap_or_else(PoisonError::into_inner);
        if reserve == Reserve::Nothing {
            return 0;
        }
        let Some(space) = (self.measure)(&self.dir) else { return 0 };
        let keep = match reserve {
            Reserve::Nothing => 0,
            Reserve::Bytes(bytes) => bytes,
            Reserve::Percent(percent) => space.total / 100 * u64::from(percent.min(100)),
        };
        keep.saturating_sub(space.available)
    }

    fn pin(self: &Arc<Self>, id: &Key, used: bool) -> Option<ArtifactGuard> {
        let info = self.lock().index.pin(id, used)?;
        if used && info != self.empty.info() {
            // (An empty artifact's last use is not persisted: see the
            // `empty` module.)
            touch(&self.artifact_dir(id).join(INFO_FILE));
        }
        Some(self.guard(id, info))
    }

    /// Pins a live artifact, with the state lock held (not marking it used).
    fn pin_locked(self: &Arc<Self>, st: &mut State, id: &Key) -> Option<ArtifactGuard> {
        let info = st.index.pin(id, false)?;
        Some(self.guard(id, info))
    }

    /// The guard of a pin just taken on artifact `id`.
    fn guard(self: &Arc<Self>, id: &Key, info: ArtifactInfo) -> ArtifactGuard {
        let tree = if info == self.empty.info() {
            self.empty.tree().to_path_buf()
        } else {
            self.artifact_dir(id).join(TREE_DIR)
        };
        ArtifactGuard::new(self.clone(), *id, tree, info)
    }

    pub(crate) fn unpin(&self, id: &Key) {
        let trash = {
            let mut st = self.lock();
            if st.index.unpin(id) == Unpinned::Removed {
                // Already out of the index: move its files to the trash.
                st.trash_seq += 1;
                let to = self.tmp.join(format!("trash-{}", st.trash_seq));
                let from = self.artifact_dir(id);
                match fs::rename(&from, &to) {
                    Ok(()) => st.trash.paths.push(to),
                    Err(_) => {
                        let _ = remove_path(&from);
                    }
                }
            }
            std::mem::take(&mut st.trash)
        };
        self.drain(trash);
    }

    /// Removes a damaged artifact, or dooms it if pinned. With `report`, it
    /// is added to the evicted list.
    fn discard(&self, id: &Key, report: bool) {
        let trash = {
            let mut st = self.lock();
            let Some(entry) = st.index.artifact_entry(id) else { return };
            if entry.doomed {
                return;
            }
            if entry.pins > 0 {
                st.index.doom(id);
            } else {
                self.remove_locked(&mut st, Slot::Artifact(*id));
            }
            if report {
                st.evicted.push(*id);
            }
            std::mem::take(&mut st.trash)
        };
        self.drain(trash);
    }

    /// Reads an artifact's manifest and checks it against its info.
    fn load_manifest(&self, guard: &ArtifactGuard) -> Result<Manifest, CasError> {
        if *guard.info() == self.empty.info() {
            return Ok(Manifest::default());
        }
        let path = self.artifact_dir(guard.key()).join(MANIFEST_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(CasError::Corrupt(format!("{} is missing", path.display())));
            }
            Err(e) => return Err(e).ctx(|| format!("read {}", path.display())),
        };
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| CasError::Corrupt(format!("{}: {e}", path.display())))?;
        if manifest.info() != *guard.info() {
            return Err(CasError::Corrupt(format!("{} does not match the artifact's info", path.display())));
        }
        Ok(manifest)
    }

    /// Checks the files on disk against the manifest.
    fn check_artifact(&self, guard: &ArtifactGuard) -> Result<(), CasError> {
        let manifest = self.load_manifest(guard)?;
        let scanned = match manifest::scan_tree(guard.path(), false, u64::MAX) {
            Ok(m) => m,
            Err(CasError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                return Err(CasError::Corrupt(format!("{} lost files", guard.path().display())));
            }
            Err(CasError::TooLarge { what, .. }) => {
                return Err(CasError::Corrupt(format!("{what} grew past the limits")));
            }
            Err(e) => return Err(e),
        };
        if scanned == manifest {
            return Ok(());
        }
        let first_difference = scanned
            .entries
            .iter()
            .zip(&manifest.entries)
            .find(|(a, b)| a != b)
            .map(|(a, _)| a.path().to_string())
            .unwrap_or_else(|| "entry count".to_string());
        Err(CasError::Corrupt(format!(
            "artifact {} differs from its manifest at {first_difference:?}",
            guard.key()
        )))
    }

    /// Moves a complete artifact directory (`wrapper`, holding the tree and
    /// whose manifest and info files are written here) into place, pinned
    /// if `pin` (see [`Installed`]). If the artifact was already present,
    /// `wrapper` was not moved: the caller removes it.
    pub(crate) fn install_artifact(
        self: &Arc<Self>,
        id: &Key,
        wrapper: &Path,
        manifest: &Manifest,
        info: ArtifactInfo,
        pin: bool,
    ) -> Result<Installed, CasError> {
        if info.size > self.max_bytes {
            return Err(CasError::TooLarge { what: "artifact".into(), size: info.size, max: self.max_bytes });
        }
        if manifest.entries.is_empty() {
            // The compact form: `wrapper` is not used (the caller removes it).
            return self.install_empty(id, pin).map(|installed| Installed { placed: false, ..installed });
        }
        if let Some(present) = self.present_artifact(id, pin)? {
            return Ok(present);
        }
        let tree = wrapper.join(TREE_DIR);
        seal::seal(&tree).ctx(|| format!("seal {}", tree.display()))?;
        write_json(&wrapper.join(MANIFEST_FILE), manifest)?;
        write_json(&wrapper.join(INFO_FILE), &info)?;
        manifest::sync_dir(wrapper)?;
        self.install(id, info, pin, |dest| {
            fs::rename(wrapper, dest).ctx(|| format!("rename an artifact into {}", dest.display()))
        })
    }

    /// Adds `id` as an empty artifact: one hard link to the shared info
    /// file (the present artifact stays, if it was there); pinned if `pin`.
    fn install_empty(self: &Arc<Self>, id: &Key, pin: bool) -> Result<Installed, CasError> {
        self.install(id, self.empty.info(), pin, |dest| self.empty.link(dest))
    }

    /// Puts artifact `id` in place with `place` (given its path), under the
    /// index lock, and records it as `info`, pinned if `pin` (under the same
    /// lock: no eviction can come between); then fsyncs its directory
    /// (unless the cache's durability is [`Durability::ProcessCrash`]).
    /// An artifact already present is only marked used (and pinned if
    /// `pin`), and `place` does not run; `Pinned` if it is doomed.
    fn install(
        self: &Arc<Self>,
        id: &Key,
        info: ArtifactInfo,
        pin: bool,
        place: impl FnOnce(&Path) -> Result<(), CasError>,
    ) -> Result<Installed, CasError> {
        let dest = self.artifact_dir(id);
        let parent = dest.parent().unwrap_or(&self.artifacts).to_path_buf();
        let short = self.shortfall();
        let (trash, guard) = {
            let mut st = self.lock();
            if let Some(e) = st.index.artifact_entry(id) {
                if e.doomed {
                    return Err(CasError::Pinned(*id));
                }
                let present = e.info;
                st.index.touch_artifact(id);
                let guard = pin.then(|| self.pin_locked(&mut st, id)).flatten();
                return Ok(Installed { info: present, placed: false, guard });
            }
            let byte = usize::from(id.0[0]);
            let bit = 1u64 << (byte % 64);
            if st.fan_outs[byte / 64] & bit == 0 {
                fs::create_dir_all(&parent).ctx(|| format!("create {}", parent.display()))?;
                if self.durability == Durability::PowerLoss {
                    // The fan-out directory's own entry, once per opening.
                    manifest::sync_dir(&self.artifacts)?;
                }
                st.fan_outs[byte / 64] |= bit;
            }
            place(&dest)?;
            st.index.insert_artifact(*id, info, None);
            let evicted = self.evict_locked(&mut st, Some(Slot::Artifact(*id)), short);
            st.evicted.extend(evicted);
            let guard = pin.then(|| self.pin_locked(&mut st, id)).flatten();
            (std::mem::take(&mut st.trash), guard)
        };
        self.drain(trash);
        if self.durability == Durability::PowerLoss {
            manifest::sync_dir(&parent)?;
        }
        Ok(Installed { info, placed: true, guard })
    }

    /// A present artifact (marked used, and pinned if `pin`), `Pinned` if
    /// it is doomed, `None` if absent.
    fn present_artifact(self: &Arc<Self>, id: &Key, pin: bool) -> Result<Option<Installed>, CasError> {
        let mut st = self.lock();
        match st.index.artifact_entry(id) {
            Some(e) if e.doomed => Err(CasError::Pinned(*id)),
            Some(_) => {
                let info = st.index.touch_artifact(id);
                let guard = pin.then(|| self.pin_locked(&mut st, id)).flatten();
                Ok(info.map(|info| Installed { info, placed: false, guard }))
            }
            None => Ok(None),
        }
    }

    pub(crate) fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// Seals the trees of a cache that older versions of drover wrote
    /// (without seals: see the `seal` module), once: a file in the cache's
    /// directory says it is done. A tree that cannot be sealed is dropped.
    fn seal_older_trees(&self) -> Result<(), CasError> {
        let marker = self.dir.join(SEALED_MARK);
        if marker.exists() {
            return Ok(());
        }
        let keys = self.lock().index.artifact_keys();
        for key in keys {
            let tree = self.artifact_dir(&key).join(TREE_DIR);
            if self.empty.holds_info(&self.artifact_dir(&key)) {
                continue;
            }
            if seal::seal(&tree).is_err() {
                self.discard(&key, true);
            }
        }
        File::create(&marker).ctx(|| format!("create {}", marker.display()))?;
        Ok(())
    }

    /// Rebuilds the index from the disk (called once, from `open`).
    fn rebuild(&self) -> Result<(), CasError> {
        let mut found: Vec<(SystemTime, Slot, u64, Option<ArtifactInfo>)> = Vec::new();
        for (name, path) in hex_dir_entries(&self.blobs)? {
            let Ok(key) = name.parse::<Key>() else { continue };
            let Ok(meta) = fs::symlink_metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, Slot::Blob(key), meta.len(), None));
        }
        // Empty artifacts count as used after everything else (see the
        // `empty` module).
        let mut empty = Vec::new();
        for (name, path) in hex_dir_entries(&self.artifacts)? {
            let Ok(key) = name.parse::<Key>() else { continue };
            if self.empty.holds_info(&path) {
                empty.push(key);
                continue;
            }
            match read_info(&path) {
                // An empty artifact stored as a directory (by an older
                // version): moved to the compact form (dropped, like any
                // entry the cache cannot use, if that fails).
                Some((info, _)) if info == self.empty.info() => {
                    remove_path(&path).ctx(|| format!("remove {}", path.display()))?;
                    if self.empty.link(&path).is_ok() {
                        manifest::sync_dir(path.parent().unwrap_or(&self.artifacts))?;
                        empty.push(key);
                    }
                }
                Some((info, mtime)) => found.push((mtime, Slot::Artifact(key), info.size, Some(info))),
                // Not a complete artifact (tampered with, or torn by a crash
                // on a file system without atomic renames): drop it.
                None => remove_path(&path).ctx(|| format!("remove {}", path.display()))?,
            }
        }
        found.sort_by_key(|a| (a.0, a.1));
        found.extend(
            empty
                .into_iter()
                .map(|key| (SystemTime::UNIX_EPOCH, Slot::Artifact(key), 0, Some(self.empty.info()))),
        );
        let mut st = self.lock();
        for (n, (_, slot, size, info)) in found.into_iter().enumerate() {
            let last_use = Some(n as u64 + 1);
            match (slot, info) {
                (Slot::Blob(k), _) => st.index.insert_blob(k, size, last_use),
                (Slot::Artifact(k), Some(info)) => st.index.insert_artifact(k, info, last_use),
                (Slot::Artifact(_), None) => {}
            }
        }
        Ok(())
    }
}

/// The `(name, path)` of every entry two levels down (`xx/<name>`) whose
/// fan-out directory is a two-digit hex prefix of the name.
fn hex_dir_entries(root: &Path) -> Result<Vec<(String, PathBuf)>, CasError> {
    let mut out = Vec::new();
    for fan in fs::read_dir(root).ctx(|| format!("read {}", root.display()))? {
        let fan = fan.ctx(|| format!("read {}", root.display()))?;
        let Ok(prefix) = fan.file_name().into_string() else { continue };
        if prefix.len() != 2 || !fan.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let fan_path = fan.path();
        for entry in fs::read_dir(&fan_path).ctx(|| format!("read {}", fan_path.display()))? {
            let entry = entry.ctx(|| format!("read {}", fan_path.display()))?;
            let Ok(name) = entry.file_name().into_string() else { continue };
            if name.len() == 64 && name.starts_with(&prefix) {
                out.push((name, entry.path()));
            }
        }
    }
    Ok(out)
}

/// A committed artifact's info and last-use time, if it looks complete.
fn read_info(dir: &Path) -> Option<(ArtifactInfo, SystemTime)> {
    let info_path = dir.join(INFO_FILE);
    let meta = fs::metadata(&info_path).ok()?;
    let info: ArtifactInfo = serde_json::from_slice(&fs::read(&info_path).ok()?).ok()?;
    let tree_ok = fs::symlink_metadata(dir.join(TREE_DIR)).is_ok_and(|m| m.is_dir());
    let manifest_ok = fs::symlink_metadata(dir.join(MANIFEST_FILE)).is_ok_and(|m| m.is_file());
    (tree_ok && manifest_ok).then(|| (info, meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), CasError> {
    let bytes = serde_json::to_vec(value).map_err(|e| CasError::Io {
        context: format!("encode {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    let mut file = File::create(path).ctx(|| format!("create {}", path.display()))?;
    file.write_all(&bytes).ctx(|| format!("write {}", path.display()))?;
    file.sync_all().ctx(|| format!("fsync {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// The free bytes of the counted filesystem below (of 1,000).
    static AVAILABLE: AtomicU64 = AtomicU64::new(1_000);

    fn counted(_: &Path) -> Option<Space> {
        Some(Space { total: 1_000, available: AVAILABLE.load(Ordering::SeqCst) })
    }

    fn sized(cas: &Cas, id: u8) {
        let writer = cas.begin_artifact(&Key([id; 32])).expect("begin");
        fs::write(writer.dir().join("f"), [id; 100]).expect("write");
        writer.commit().expect("commit");
    }

    #[test]
    fn a_reserve_evicts_what_covers_the_shortfall_in_lru_order_and_spares_pins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cas = Cas::open(dir.path(), 1 << 20).expect("open");
        Arc::get_mut(&mut cas.inner).expect("the only handle").measure = counted;
        for id in 1..=5 {
            sized(&cas, id);
        }
        let pinned = cas.artifact(&Key([2; 32])).expect("held");
        // 100 bytes free, 350 wanted: 250 short, so the three least recently
        // used unpinned artifacts go (300 bytes), not 2 (pinned) nor 5.
        AVAILABLE.store(100, Ordering::SeqCst);
        cas.keep_free(Reserve::Bytes(350));
        let gone: Vec<Key> = [1, 3, 4].map(|id| Key([id; 32])).to_vec();
        assert_eq!(cas.take_evicted(), gone);
        assert_eq!(cas.artifacts(), vec![Key([2; 32]), Key([5; 32])]);
        assert_eq!(cas.inner.lock().pending_free, 0, "deleted, so no longer pending");
        // The room is back: a commit evicts nothing.
        AVAILABLE.store(400, Ordering::SeqCst);
        sized(&cas, 6);
        assert!(cas.take_evicted().is_empty());
        // A share of the filesystem: 50% of 1,000 with 400 free is 100
        // short: the least recently used unpinned artifact goes.
        cas.keep_free(Reserve::Percent(50));
        assert_eq!(cas.take_evicted(), vec![Key([5; 32])]);
        assert_eq!(cas.reserve_news(), None, "the reserve was met every time");
        // Nothing free, 900 wanted: 6 goes, 2 is pinned, and 800 are still
        // missing. Said once.
        AVAILABLE.store(0, Ordering::SeqCst);
        cas.keep_free(Reserve::Bytes(900));
        assert_eq!(cas.take_evicted(), vec![Key([6; 32])]);
        assert_eq!(cas.reserve_news(), Some(true));
        cas.keep_free(Reserve::Bytes(900));
        assert_eq!(cas.reserve_news(), None, "still short: no news");
        AVAILABLE.store(1_000, Ordering::SeqCst);
        cas.keep_free(Reserve::Bytes(900));
        assert_eq!(cas.reserve_news(), Some(false), "the room is back");
        drop(pinned);
    }

    #[test]
    fn evicted_bytes_not_yet_deleted_count_as_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cas = Cas::open(dir.path(), 1 << 20).expect("open");
        for id in 1..=3 {
            sized(&cas, id);
        }
        let mut st = cas.inner.lock();
        st.pending_free = 150;
        // 200 short, of which 150 are being deleted: one artifact covers it.
        assert_eq!(cas.inner.evict_locked(&mut st, None, 200), vec![Key([1; 32])]);
        assert_eq!((st.pending_free, st.trash.evicted), (250, 100));
    }
}
