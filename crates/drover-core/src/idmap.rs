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
//! The index of live jobs, the largest of these tables (an entry per queued
//! job), is a [`JobIndex`]: it holds only each job's slab index and 32 bits
//! of its ID's hash, 8 bytes a job instead of the 40 of an ID and an index
//! (a fifth of the memory, so more of it stays in cache), and a job's
//! removal finds its entry without reading IDs. A lookup compares the stored bits first and reads the
//! job's ID from the slab only when they match.
//!
//! The core must never let hash order reach a decision (see ARCHITECTURE.md,
//! "Architecture invariants"). [`IdMap`], [`IdSet`] and [`JobIndex`]
//! therefore offer lookups, insertion and removal only; the rare callers
//! that must visit every entry get them sorted. This module is the only
//! place in the core that names a hash-ordered container;
//! `crates/drover/tests/purity.rs` checks that.

#![allow(clippy::disallowed_types)]

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::HashTable;

use crate::queue::JobIdx;
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

/// Live jobs by ID: for each, its slab index and 32 bits of its ID's hash
/// (see the module documentation). The caller passes the slab's view of a
/// job's ID to lookups.
#[derive(Clone, Default)]
pub(crate) struct JobIndex {
    map: HashTable<(u32, JobIdx)>,
}

/// 32 bits of `id`'s hash, stored with its job.
fn fingerprint(id: &JobId) -> u32 {
    IdHash.hash_one(id) as u32
}

/// The table's hash of a stored fingerprint: the table takes its bucket from
/// the low bits and its tag from the top 7, so the 32 bits are spread over
/// all 64.
fn spread(fingerprint: u32) -> u64 {
    let x = u64::from(fingerprint).wrapping_mul(MIX);
    x ^ (x >> 32)
}

impl std::fmt::Debug for JobIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobIndex").field("jobs", &self.map.len()).finish()
    }
}

impl PartialEq for JobIndex {
    fn eq(&self, other: &Self) -> bool {
        self.sorted() == other.sorted()
    }
}

impl Eq for JobIndex {}

impl JobIndex {
    /// The job with ID `id`; `id_of` gives a live job's ID from its index.
    pub(crate) fn get<'a>(&self, id: &JobId, id_of: impl Fn(JobIdx) -> &'a JobId) -> Option<JobIdx> {
        let f = fingerprint(id);
        self.map.find(spread(f), |&(g, j)| g == f && id_of(j) == id).map(|&(_, j)| j)
    }

    /// Files job `j` under `id`, which no live job has.
    pub(crate) fn insert(&mut self, id: &JobId, j: JobIdx) {
        let f = fingerprint(id);
        self.map.insert_unique(spread(f), (f, j), |&(g, _)| spread(g));
    }

    /// Takes job `j`, filed under `id`, out; true if it was there.
    pub(crate) fn remove(&mut self, id: &JobId, j: JobIdx) -> bool {
        let f = fingerprint(id);
        self.map.find_entry(spread(f), |&(g, k)| g == f && k == j).map(|e| e.remove()).is_ok()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Every entry, sorted (costs a sort: for comparisons in tests).
    fn sorted(&self) -> Vec<(u32, JobIdx)> {
        let mut all: Vec<(u32, JobIdx)> = self.map.iter().copied().collect();
        all.sort_unstable();
        all
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
    fn the_job_index_finds_jobs_by_id_through_the_slab() {
        let ids: Vec<JobId> = (0..2_000).map(|i| JobId::named(&format!("job {i}"))).collect();
        let mut index = JobIndex::default();
        for (j, id) in ids.iter().enumerate() {
            index.insert(id, j as JobIdx);
        }
        let id_of = |j: JobIdx| &ids[j as usize];
        assert_eq!(index.len(), 2_000);
        assert!(ids.iter().enumerate().all(|(j, id)| index.get(id, id_of) == Some(j as JobIdx)));
        assert_eq!(index.get(&JobId::named("never filed"), id_of), None);
        // Removal takes the entry of that job only.
        assert!(index.remove(&ids[7], 7));
        assert!(!index.remove(&ids[7], 7), "already gone");
        assert!(!index.remove(&ids[8], 9), "filed under another job");
        assert_eq!(index.get(&ids[7], id_of), None);
        assert_eq!(index.get(&ids[8], id_of), Some(8));
        // Equal contents compare equal, whatever the insertion order.
        let mut other = JobIndex::default();
        for (j, id) in ids.iter().enumerate().rev().filter(|(j, _)| *j != 7) {
            other.insert(id, j as JobIdx);
        }
        assert_eq!(index, other);
        other.remove(&ids[8], 8);
        assert_ne!(index, other);
    }

    #[test]
    fn jobs_whose_ids_share_a_fingerprint_are_told_apart_by_id() {
        // Two IDs whose hashes agree in the 32 bits the index stores.
        let (a, b) = (JobId::named("job 23816"), JobId::named("job 61287"));
        assert_eq!(fingerprint(&a), fingerprint(&b), "the test needs a collision");
        let ids = [a, b];
        let id_of = |j: JobIdx| &ids[j as usize];
        let mut index = JobIndex::default();
        index.insert(&a, 0);
        assert_eq!(index.get(&b, id_of), None, "same fingerprint, other ID");
        index.insert(&b, 1);
        assert_eq!((index.get(&a, id_of), index.get(&b, id_of)), (Some(0), Some(1)));
        assert!(index.remove(&a, 0));
        assert_eq!((index.get(&a, id_of), index.get(&b, id_of)), (None, Some(1)));
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
