//! Hashed indexes by [`JobId`] (and [`RunId`]) that cannot be iterated in
//! hash order.
//!
//! The scheduler looks jobs and artifacts up by their 32-byte content ID on
//! every event (dedup, artifact holders, readers of a dependency), and runs
//! by their ID on every report from a worker. In an ordered map each such
//! lookup is a descent through a handful of nodes, most of them cache
//! misses (and, for job IDs, each a run of 32-byte comparisons); a hash
//! table answers with one or two. A job ID is already a digest, so hashing
//! it is a few multiplications; a run ID is one word.
//!
//! The core must never let hash order reach a decision (see ARCHITECTURE.md,
//! "Architecture invariants"). [`IdMap`] and [`IdSet`] therefore offer
//! lookups, insertion and removal only; the rare callers that must visit
//! every entry get them sorted by ID. This module is the only place in the
//! core that names a hash-ordered container; `crates/drover/tests/purity.rs`
//! checks that.

#![allow(clippy::disallowed_types)]

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hash, Hasher};

use crate::types::JobId;
#[cfg(doc)]
use crate::types::RunId;

/// Hashes a [`JobId`]: all 32 bytes folded, 8 at a time, with a multiply per
/// word. Fixed, so the table's layout (never observed) is reproducible too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IdHasher {
    state: u64,
}

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.state = (self.state.rotate_left(23) ^ word).wrapping_mul(MIX);
        }
        for &b in chunks.remainder() {
            self.state = (self.state.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.state = (self.state.rotate_left(23) ^ n).wrapping_mul(MIX);
    }

    fn write_usize(&mut self, n: usize) {
        self.state = (self.state ^ n as u64).wrapping_mul(MIX);
    }

    fn finish(&self) -> u64 {
        // The table takes its bucket from the low bits and its tag from the
        // top 7: fold the well-mixed high half down.
        self.state ^ (self.state >> 29)
    }
}

/// Builds [`IdHasher`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IdHash;

impl BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher::default()
    }
}

/// A map from job ID (or another ID, `K`) to `V`: lookups, insertion and
/// removal; no iteration except in ID order ([`IdMap::sorted`]).
#[derive(Clone, Debug)]
pub(crate) struct IdMap<V, K = JobId> {
    map: HashMap<K, V, IdHash>,
}

impl<V: PartialEq, K: Eq + Hash> PartialEq for IdMap<V, K> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<V: Eq, K: Eq + Hash> Eq for IdMap<V, K> {}

impl<V, K> Default for IdMap<V, K> {
    fn default() -> Self {
        IdMap { map: HashMap::default() }
    }
}

impl<V, K: Copy + Ord + Hash> IdMap<V, K> {
    pub(crate) fn get(&self, id: &K) -> Option<&V> {
        self.map.get(id)
    }

    pub(crate) fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        self.map.get_mut(id)
    }

    pub(crate) fn contains(&self, id: &K) -> bool {
        self.map.contains_key(id)
    }

    pub(crate) fn insert(&mut self, id: K, value: V) -> Option<V> {
        self.map.insert(id, value)
    }

    pub(crate) fn remove(&mut self, id: &K) -> Option<V> {
        self.map.remove(id)
    }

    /// The value under `id`, inserted as `V::default()` if absent.
    pub(crate) fn entry_or_default(&mut self, id: K) -> &mut V
    where
        V: Default,
    {
        match self.map.entry(id) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(V::default()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Every entry, in ID order (costs a sort: not for hot paths).
    pub(crate) fn sorted(&self) -> Vec<(&K, &V)> {
        let mut all: Vec<(&K, &V)> = self.map.iter().collect();
        all.sort_unstable_by_key(|(id, _)| **id);
        all
    }
}

/// A set of job IDs: membership and insertion; no iteration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IdSet {
    set: IdMap<()>,
}

impl IdSet {
    /// Adds `id`; true if it was not there.
    pub(crate) fn insert(&mut self, id: JobId) -> bool {
        self.set.insert(id, ()).is_none()
    }

    pub(crate) fn contains(&self, id: &JobId) -> bool {
        self.set.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_sorted_iteration() {
        let mut m: IdMap<u32> = IdMap::default();
        for (i, name) in ["c", "a", "b"].iter().enumerate() {
            assert_eq!(m.insert(JobId::named(name), i as u32), None);
        }
        assert_eq!(m.get(&JobId::named("a")), Some(&1));
        *m.entry_or_default(JobId::named("d")) += 7;
        *m.get_mut(&JobId::named("d")).expect("there") += 1;
        assert_eq!(m.remove(&JobId::named("c")), Some(0));
        assert!(!m.contains(&JobId::named("c")));
        let names: Vec<(JobId, u32)> = m.sorted().into_iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            names,
            vec![(JobId::named("a"), 1), (JobId::named("b"), 2), (JobId::named("d"), 8)],
            "sorted by ID whatever the insertion order"
        );

        let mut s = IdSet::default();
        assert!(s.insert(JobId::named("y")) && s.insert(JobId::named("x")));
        assert!(!s.insert(JobId::named("x")), "already there");
        assert!(s.contains(&JobId::named("y")) && !s.contains(&JobId::named("z")));
    }

    #[test]
    fn ids_differing_in_any_word_hash_apart() {
        let hash = |id: JobId| IdHash.hash_one(id);
        let base = JobId::named("job");
        let mut seen = vec![hash(base)];
        for byte in 0..32 {
            let mut id = base;
            id.0[byte] ^= 1;
            seen.push(hash(id));
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 33, "a one-bit change anywhere changes the hash");
    }
}
