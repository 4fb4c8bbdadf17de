//! The in-memory index: what the cache holds, how big it is, and the
//! least-recently-used order for eviction.
//!
//! Every use bumps a logical clock and files the entry under the new value in
//! an ordered set (one for blobs, one for artifacts: an eviction for the
//! room kept free takes artifacts only), whose first elements are the next
//! eviction victims. Pinned artifacts are taken out of their set while
//! pinned, so eviction never sees them. A corrupt artifact found while pinned is *doomed*: hidden from every
//! lookup at once, and removed when its last pin goes.
//!
//! The index does no I/O; [`crate::Cas`] keeps the disk in step with it under
//! the same lock.

use std::collections::{BTreeMap, BTreeSet};

use crate::{ArtifactInfo, Key};

/// An entry of the cache, as filed in the LRU order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Slot {
    Blob(Key),
    Artifact(Key),
}

#[derive(Debug)]
struct BlobEntry {
    size: u64,
    last_use: u64,
}

#[derive(Debug)]
pub(crate) struct ArtEntry {
    pub(crate) info: ArtifactInfo,
    last_use: u64,
    pub(crate) pins: u32,
    pub(crate) doomed: bool,
}

/// What happened when a pin was released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unpinned {
    /// Still pinned by someone else, or back in the LRU order.
    Kept,
    /// It was doomed and is now out of the index: remove it from disk.
    Removed,
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    blobs: BTreeMap<Key, BlobEntry>,
    artifacts: BTreeMap<Key, ArtEntry>,
    /// Unpinned blobs and artifacts by last use, apart, so that an
    /// eviction of artifacts alone (for the reserve) does not pass over
    /// every blob first.
    lru_blobs: BTreeSet<(u64, Key)>,
    lru_artifacts: BTreeSet<(u64, Key)>,
    clock: u64,
    used: u64,
}

impl Index {
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    pub(crate) fn has_blob(&self, key: &Key) -> bool {
        self.blobs.contains_key(key)
    }

    pub(crate) fn blob_size(&self, key: &Key) -> Option<u64> {
        self.blobs.get(key).map(|e| e.size)
    }

    /// A live (not doomed) artifact.
    pub(crate) fn artifact(&self, key: &Key) -> Option<&ArtEntry> {
        self.artifacts.get(key).filter(|e| !e.doomed)
    }

    /// Any artifact entry, doomed ones included.
    pub(crate) fn artifact_entry(&self, key: &Key) -> Option<&ArtEntry> {
        self.artifacts.get(key)
    }

    pub(crate) fn artifact_keys(&self) -> Vec<Key> {
        self.artifacts.iter().filter(|(_, e)| !e.doomed).map(|(k, _)| *k).collect()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds a blob, as used now (or at `last_use` when rebuilding).
    pub(crate) fn insert_blob(&mut self, key: Key, size: u64, last_use: Option<u64>) {
        let last_use = last_use.unwrap_or_else(|| self.tick());
        self.clock = self.clock.max(last_use);
        if let Some(old) = self.blobs.insert(key, BlobEntry { size, last_use }) {
            self.lru_blobs.remove(&(old.last_use, key));
            self.used -= old.size;
        }
        self.lru_blobs.insert((last_use, key));
        self.used += size;
    }

    /// Adds an artifact, as used now (or at `last_use` when rebuilding).
    pub(crate) fn insert_artifact(&mut self, key: Key, info: ArtifactInfo, last_use: Option<u64>) {
        let last_use = last_use.unwrap_or_else(|| self.tick());
        self.clock = self.clock.max(last_use);
        let entry = ArtEntry { info, last_use, pins: 0, doomed: false };
        if let Some(old) = self.artifacts.insert(key, entry) {
            self.lru_artifacts.remove(&(old.last_use, key));
            self.used -= old.info.size;
        }
        self.lru_artifacts.insert((last_use, key));
        self.used += info.size;
    }

    /// Marks a blob as used now; false if absent.
    pub(crate) fn touch_blob(&mut self, key: &Key) -> bool {
        let now = self.clock + 1;
        let Some(entry) = self.blobs.get_mut(key) else { return false };
        self.clock = now;
        self.lru_blobs.remove(&(entry.last_use, *key));
        entry.last_use = now;
        self.lru_blobs.insert((now, *key));
        true
    }

    /// Marks a live artifact as used now; its info, or `None` if absent.
    pub(crate) fn touch_artifact(&mut self, key: &Key) -> Option<ArtifactInfo> {
        let now = self.clock + 1;
        let entry = self.artifacts.get_mut(key).filter(|e| !e.doomed)?;
        self.clock = now;
        if entry.pins == 0 {
            self.lru_artifacts.remove(&(entry.last_use, *key));
            self.lru_artifacts.insert((now, *key));
        }
        entry.last_use = now;
        Some(entry.info)
    }

    /// Pins a live artifact (optionally marking it used); its info, or `None`.
    pub(crate) fn pin(&mut self, key: &Key, used: bool) -> Option<ArtifactInfo> {
        let now = self.clock + 1;
        let entry = self.artifacts.get_mut(key).filter(|e| !e.doomed)?;
        if entry.pins == 0 {
            self.lru_artifacts.remove(&(entry.last_use, *key));
        }
        entry.pins += 1;
        if used {
            self.clock = now;
            entry.last_use = now;
        }
        Some(entry.info)
    }

    /// Releases one pin. The last pin of a live artifact files it back in the
    /// LRU order; the last pin of a doomed one removes it from the index.
    pub(crate) fn unpin(&mut self, key: &Key) -> Unpinned {
        let Some(entry) = self.artifacts.get_mut(key) else { return Unpinned::Kept };
        entry.pins = entry.pins.saturating_sub(1);
        if entry.pins > 0 {
            return Unpinned::Kept;
        }
        if entry.doomed {
            self.remove(Slot::Artifact(*key));
            return Unpinned::Removed;
        }
        self.lru_artifacts.insert((entry.last_use, *key));
        Unpinned::Kept
    }

    /// Dooms a pinned artifact: hidden now, removed at its last unpin.
    pub(crate) fn doom(&mut self, key: &Key) {
        if let Some(entry) = self.artifacts.get_mut(key) {
            entry.doomed = true;
        }
    }

    /// Removes an entry (pinned or not); whether it was there.
    pub(crate) fn remove(&mut self, slot: Slot) -> bool {
        match slot {
            Slot::Blob(key) => match self.blobs.remove(&key) {
                Some(e) => {
                    self.lru_blobs.remove(&(e.last_use, key));
                    self.used -= e.size;
                    true
                }
                None => false,
            },
            Slot::Artifact(key) => match self.artifacts.remove(&key) {
                Some(e) => {
                    self.lru_artifacts.remove(&(e.last_use, key));
                    self.used -= e.info.size;
                    true
                }
                None => false,
            },
        }
    }

    /// The least recently used unpinned entry other than `protect`: an
    /// artifact, or a blob too if `blobs`.
    pub(crate) fn victim(&self, protect: Option<Slot>, blobs: bool) -> Option<Slot> {
        // The first of each order but `protect` (at most one step past it).
        let artifact = self
            .lru_artifacts
            .iter()
            .map(|&(t, k)| (t, Slot::Artifact(k)))
            .find(|(_, slot)| Some(*slot) != protect);
        let blob = match blobs {
            true => self
                .lru_blobs
                .iter()
                .map(|&(t, k)| (t, Slot::Blob(k)))
                .find(|(_, slot)| Some(*slot) != protect),
            false => None,
        };
        match (artifact, blob) {
            (Some(a), Some(b)) => Some(a.min(b).1),
            (a, b) => a.or(b).map(|(_, slot)| slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u8) -> Key {
        Key([n; 32])
    }

    fn info(size: u64) -> ArtifactInfo {
        ArtifactInfo { tree: Key::default(), size, files: 1 }
    }

    #[test]
    fn lru_order_pins_and_doom() {
        let mut idx = Index::default();
        idx.insert_artifact(k(1), info(10), None);
        idx.insert_blob(k(2), 5, None);
        idx.insert_artifact(k(3), info(7), None);
        assert_eq!(idx.used(), 22);
        assert_eq!(idx.victim(None, true), Some(Slot::Artifact(k(1))));
        idx.touch_artifact(&k(1));
        assert_eq!(idx.victim(None, true), Some(Slot::Blob(k(2))));
        assert_eq!(idx.victim(Some(Slot::Blob(k(2))), true), Some(Slot::Artifact(k(3))));
        assert_eq!(idx.victim(None, false), Some(Slot::Artifact(k(3))), "outputs only");
        idx.touch_blob(&k(2));
        assert_eq!(idx.pin(&k(3), true), Some(info(7)));
        assert_eq!(idx.victim(None, true), Some(Slot::Artifact(k(1))));
        idx.pin(&k(1), false);
        assert_eq!(idx.victim(None, true), Some(Slot::Blob(k(2))));
        idx.remove(Slot::Blob(k(2)));
        assert_eq!(idx.victim(None, true), None);
        assert_eq!(idx.unpin(&k(1)), Unpinned::Kept);
        assert_eq!(idx.victim(None, true), Some(Slot::Artifact(k(1))));
        idx.pin(&k(3), true);
        idx.doom(&k(3));
        assert!(idx.artifact(&k(3)).is_none());
        assert_eq!(idx.artifact_keys(), vec![k(1)]);
        assert_eq!(idx.unpin(&k(3)), Unpinned::Kept);
        assert_eq!(idx.unpin(&k(3)), Unpinned::Removed);
        assert!(idx.artifact_entry(&k(3)).is_none());
        assert_eq!(idx.used(), 10);
    }
}
