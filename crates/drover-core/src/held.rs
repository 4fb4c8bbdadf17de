//! What one worker holds, listed for the rare walks over a worker's cache:
//! the reconciliation of a re-registration and the worker's loss.
//!
//! Whether a worker holds an artifact is answered by the scheduler's
//! holders index (artifact → sorted workers), which every placement rule
//! reads anyway. A per-worker hash set answering the same question cost a
//! cold insertion, and now and then a rehash of the whole set, on every
//! finished job. This list is append-only instead: an artifact is pushed
//! when the worker comes to hold it, and an eviction only counts one more
//! stale entry (the holders index is the truth). The list is compacted once
//! the stale entries pass half of it, so it never takes more than about
//! twice the room of what the worker holds. An artifact evicted and held
//! again is listed twice until then: every reader filters by the holders
//! index and drops duplicates.

use crate::types::JobId;

/// Stale entries a list tolerates before it is compacted, whatever its size.
const COMPACT_AFTER: usize = 16;

/// One worker's artifacts, stale and repeated entries included (see the
/// module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HeldList {
    ids: Vec<JobId>,
    /// Evictions since the last compaction.
    stale: usize,
}

impl HeldList {
    /// The worker has just come to hold `a` (it did not before).
    pub(crate) fn push(&mut self, a: JobId) {
        self.ids.push(a);
    }

    /// One of the listed artifacts was evicted. True when it is time to
    /// [`HeldList::compact`].
    pub(crate) fn evicted(&mut self) -> bool {
        self.stale += 1;
        self.stale >= COMPACT_AFTER && self.stale * 2 > self.ids.len()
    }

    /// Keeps one entry per artifact that `holds` accepts.
    pub(crate) fn compact(&mut self, holds: impl Fn(&JobId) -> bool) {
        self.ids.sort_unstable();
        self.ids.dedup();
        self.ids.retain(|a| holds(a));
        self.stale = 0;
    }

    /// The artifacts `holds` accepts, each once, in ID order (costs a sort:
    /// not for hot paths).
    pub(crate) fn sorted(&self, holds: impl Fn(&JobId) -> bool) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self.ids.iter().filter(|a| holds(a)).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Empties the list, returning its entries (stale ones included).
    pub(crate) fn take(&mut self) -> Vec<JobId> {
        self.stale = 0;
        std::mem::take(&mut self.ids)
    }

    /// No entries at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Entries, stale and repeated ones included (for the invariant checks).
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn evicted_entries_are_filtered_then_compacted_away() {
        let mut list = HeldList::default();
        let mut held = BTreeSet::new();
        let id = |i: u32| JobId::named(&i.to_string());
        for i in 0..40 {
            list.push(id(i));
            held.insert(id(i));
        }
        let mut compactions = 0;
        for i in 0..30 {
            held.remove(&id(i));
            if list.evicted() {
                list.compact(|a| held.contains(a));
                compactions += 1;
            }
            assert!(list.len() <= 2 * held.len().max(COMPACT_AFTER), "bounded after {i}");
        }
        assert!(compactions >= 1);
        // Held again after its eviction: listed twice until a compaction.
        list.push(id(35));
        assert_eq!(list.sorted(|a| held.contains(a)), held.iter().copied().collect::<Vec<_>>());
        list.compact(|a| held.contains(a));
        assert_eq!(list.len(), held.len());
        assert_eq!(list.take().len(), 10);
        assert!(list.is_empty());
    }
}
