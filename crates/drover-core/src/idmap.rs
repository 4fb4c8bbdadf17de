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
//! (a fifth of the memory, so more of it stays in cache). A lookup compares
//! the stored bits first and reads the job's ID from the slab only when they
//! match. A job leaves the index lazily: its slab slot forgets the bits it
//! was filed under (one store into a small array, where taking the entry
//! out of the table was a probe of two cold lines on every job's end), and
//! the entries left behind are dropped together in one pass over the table
//! once there are enough of them (see [`JobIndex::remove`]).
//!
//! The core must never let hash order reach a decision (see ARCHITECTURE.md,
//! "Architecture invariants"). [`IdMap`], [`IdSet`] and [`JobIndex`]
//! therefore offer lookups, insertion and removal only; the rare callers
//! that must visit every entry get them sorted. The one pass in hash order,
//! `JobIndex::drop_stale`, only erases, and decides each entry from that
//! entry alone. This module is the only place in the core that names a
//! hash-ordered container; `crates/drover/tests/purity.rs` checks that.

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct IdHash;

impl BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher::default()
    }
}

/// A map from job ID (or another ID, `K`) to `V`: lookups, insertion and
/// removal; no iteration except in ID order ([`IdMap::sorted`]).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(bound(serialize = "K: serde::Serialize + Eq + Hash, V: serde::Serialize"))]
#[serde(bound(deserialize = "K: serde::Deserialize<'de> + Eq + Hash, V: serde::Deserialize<'de>"))]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
///
/// The table may hold *stale* entries, of jobs that left: an entry
/// `(bits, slot)` is live exactly when `slots[slot] == bits`. A job's
/// removal only marks its slot [`VACANT`]; a job filed under the same bits
/// in the same slot later takes its stale entry back, so no two entries are
/// ever alike, and the stale ones are swept out together (see
/// [`JobIndex::remove`]).
#[derive(Clone, Default)]
pub(crate) struct JobIndex {
    map: HashTable<(u32, JobIdx)>,
    /// Per slab slot: the bits its job is filed under, or [`VACANT`].
    slots: Slots,
    /// Entries in `map` whose slot no longer holds their job.
    stale: usize,
}

/// Slots per chunk of [`Slots`] (16 KiB).
const CHUNK: usize = 4_096;

/// A `u32` per slab slot, in fixed chunks: growing never moves what is
/// there. (A single vector, doubled as the slab grows, left its outgrown
/// buffers resident: 40 to 60 bytes more per queued job at 100,000.)
#[derive(Clone, Default)]
struct Slots(Vec<Box<[u32; CHUNK]>>);

impl Slots {
    /// Slot `j`'s value ([`VACANT`] if never set).
    fn get(&self, j: JobIdx) -> u32 {
        let j = j as usize;
        self.0.get(j / CHUNK).map_or(VACANT, |chunk| chunk[j % CHUNK])
    }

    /// Slot `j`, if its chunk exists.
    fn get_mut(&mut self, j: JobIdx) -> Option<&mut u32> {
        let j = j as usize;
        self.0.get_mut(j / CHUNK).map(|chunk| &mut chunk[j % CHUNK])
    }

    /// Slot `j`, its chunk (and those before it) made if need be.
    fn make(&mut self, j: JobIdx) -> &mut u32 {
        let j = j as usize;
        while self.0.len() <= j / CHUNK {
            self.0.push(Box::new([VACANT; CHUNK]));
        }
        &mut self.0[j / CHUNK][j % CHUNK]
    }
}

/// A slot whose job is not filed (no fingerprint takes this value).
const VACANT: u32 = u32::MAX;

/// Stale entries the index always tolerates before a sweep, however few
/// jobs are live.
const STALE_SLACK: usize = 64;

/// 32 bits of `id`'s hash, stored with its job (never [`VACANT`]).
fn fingerprint(id: &JobId) -> u32 {
    (IdHash.hash_one(id) as u32).min(VACANT - 1)
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
        f.debug_struct("JobIndex").field("jobs", &self.len()).field("stale", &self.stale).finish()
    }
}

impl PartialEq for JobIndex {
    /// Equal live entries: where stale ones linger is not part of the state.
    fn eq(&self, other: &Self) -> bool {
        self.sorted() == other.sorted()
    }
}

impl Eq for JobIndex {}

impl JobIndex {
    /// The job with ID `id`; `id_of` gives a live job's ID from its index.
    pub(crate) fn get<'a>(&self, id: &JobId, id_of: impl Fn(JobIdx) -> &'a JobId) -> Option<JobIdx> {
        let f = fingerprint(id);
        self.map.find(spread(f), |&(g, j)| g == f && self.is_live(g, j) && id_of(j) == id).map(|&(_, j)| j)
    }

    /// Files job `j` under `id`, which no live job has; slot `j` holds no
    /// filed job.
    pub(crate) fn insert(&mut self, id: &JobId, j: JobIdx) {
        let f = fingerprint(id);
        let slot = self.slots.make(j);
        debug_assert_eq!(*slot, VACANT, "slot {j} already holds a filed job");
        *slot = f;
        // A stale entry of this slot under the same bits comes back to life.
        if self.stale > 0 && self.map.find(spread(f), |&(g, k)| g == f && k == j).is_some() {
            self.stale -= 1;
        } else {
            self.map.insert_unique(spread(f), (f, j), |&(g, _)| spread(g));
        }
    }

    /// Takes job `j` out; true if it was filed. Its entry stays in the table,
    /// stale, until more than [`Self::stale_limit`] are: then one pass over
    /// the table drops them all (it reads the table and the slots' array,
    /// not the slab). So a removal costs a store and, amortised, the test of
    /// a few buckets.
    pub(crate) fn remove(&mut self, j: JobIdx) -> bool {
        let Some(slot) = self.slots.get_mut(j).filter(|f| **f != VACANT) else {
            return false;
        };
        *slot = VACANT;
        self.stale += 1;
        if self.stale > self.stale_limit() {
            self.drop_stale();
        }
        true
    }

    /// Stale entries tolerated: half the live ones, or an eighth of what the
    /// table holds without growing (after most jobs left, a sweep walks the
    /// whole table, which keeps its size: sweeping every 64 removals would
    /// cost more than the removals spared), or [`STALE_SLACK`], whichever is
    /// most. The table thus holds at most half again its live entries, or
    /// stale ones in room it has anyway.
    fn stale_limit(&self) -> usize {
        STALE_SLACK.max(self.len() / 2).max(self.map.capacity() / 8)
    }

    /// Drops every stale entry. The pass goes in the table's order, but
    /// whether an entry stays depends on that entry and its slot alone, so
    /// the order shows nowhere (the purity test allows this one pass).
    fn drop_stale(&mut self) {
        let slots = &self.slots;
        self.map.retain(|&mut (f, j)| slots.get(j) == f);
        self.stale = 0;
    }

    /// Live jobs filed.
    pub(crate) fn len(&self) -> usize {
        self.map.len() - self.stale
    }

    fn is_live(&self, f: u32, j: JobIdx) -> bool {
        self.slots.get(j) == f
    }

    /// Every live entry, sorted (costs a sort: for comparisons in tests).
    fn sorted(&self) -> Vec<(u32, JobIdx)> {
        let mut all: Vec<(u32, JobIdx)> =
            self.map.iter().copied().filter(|&(f, j)| self.is_live(f, j)).collect();
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

    /// `n` IDs, each filed under its position as slab index.
    fn filed(n: usize) -> (Vec<JobId>, JobIndex) {
        let ids: Vec<JobId> = (0..n).map(|i| JobId::named(&format!("job {i}"))).collect();
        let mut index = JobIndex::default();
        for (j, id) in ids.iter().enumerate() {
            index.insert(id, j as JobIdx);
        }
        (ids, index)
    }

    #[test]
    fn the_job_index_finds_jobs_by_id_through_the_slab() {
        let (ids, mut index) = filed(2_000);
        let id_of = |j: JobIdx| &ids[j as usize];
        assert_eq!(index.len(), 2_000);
        assert!(ids.iter().enumerate().all(|(j, id)| index.get(id, id_of) == Some(j as JobIdx)));
        assert_eq!(index.get(&JobId::named("never filed"), id_of), None);
        // Removal takes that job only.
        assert!(index.remove(7));
        assert!(!index.remove(7), "already gone");
        assert!(!index.remove(5_000), "a slot that never held a job");
        assert_eq!(index.get(&ids[7], id_of), None);
        assert_eq!(index.get(&ids[8], id_of), Some(8));
        assert_eq!(index.len(), 1_999);
        // Equal contents compare equal, whatever the insertion order.
        let mut other = JobIndex::default();
        for (j, id) in ids.iter().enumerate().rev().filter(|(j, _)| *j != 7) {
            other.insert(id, j as JobIdx);
        }
        assert_eq!(index, other);
        other.remove(8);
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
        assert!(index.remove(0));
        assert_eq!((index.get(&a, id_of), index.get(&b, id_of)), (None, Some(1)));
        // `b` moves to slot 0, whose stale entry (of `a`) has its bits: it
        // takes that entry, and the one it leaves in slot 1 goes stale.
        assert!(index.remove(1));
        index.insert(&b, 0);
        let moved = [b, a];
        let id_of = |j: JobIdx| &moved[j as usize];
        assert_eq!((index.get(&a, id_of), index.get(&b, id_of)), (None, Some(0)));
        assert_eq!((index.len(), index.map.len(), index.stale), (1, 2, 1));
    }

    #[test]
    fn stale_entries_are_taken_back_and_swept() {
        let (ids, mut index) = filed(1_000);
        // The same job back in the same slot takes its stale entry again.
        assert!(index.remove(3));
        assert_eq!((index.len(), index.map.len(), index.stale), (999, 1_000, 1));
        index.insert(&ids[3], 3);
        assert_eq!((index.len(), index.map.len(), index.stale), (1_000, 1_000, 0));
        // Another job in a freed slot gets an entry of its own.
        assert!(index.remove(4));
        let other = JobId::named("another");
        index.insert(&other, 4);
        assert_eq!((index.len(), index.map.len(), index.stale), (1_000, 1_001, 1));
        let id_of = |j: JobIdx| if j == 4 { &other } else { &ids[j as usize] };
        assert_eq!(index.get(&ids[4], id_of), None, "the stale entry does not answer for its job");
        assert_eq!(index.get(&other, id_of), Some(4));
        // A slot in a later chunk.
        let far = JobId::named("far");
        index.insert(&far, 5_000);
        let id_of = |j: JobIdx| match j {
            4 => &other,
            5_000 => &far,
            j => &ids[j as usize],
        };
        assert_eq!(index.get(&far, id_of), Some(5_000));
        assert!(index.remove(5_000) && !index.remove(5_000));
        // Stale entries past the limit are swept out in one pass.
        for j in 500..1_000 {
            assert!(index.remove(j));
            assert!(index.stale <= index.stale_limit(), "swept in time");
        }
        assert_eq!(index.len(), 500);
        assert!(index.map.len() < 1_002, "a sweep dropped stale entries");
        assert!((0..500).all(|j| index.get(id_of(j), id_of) == Some(j)));
        assert!((500..1_000).all(|j| index.get(id_of(j), id_of).is_none()));
        // Drained from a peak, the table keeps its room, and stale entries
        // may fill an eighth of it before a sweep: not a sweep of the whole
        // table every 64 removals.
        let (mut sweeps, mut before) = (0, index.stale);
        for j in 64..500 {
            assert!(index.remove(j));
            sweeps += usize::from(index.stale < before);
            before = index.stale;
            assert!(index.stale <= index.stale_limit());
        }
        assert!(sweeps <= 436 / (index.map.capacity() / 8) + 1, "{sweeps} sweeps");
        assert!(index.map.capacity() / 8 > STALE_SLACK, "the test needs a table roomier than the slack");
        assert!((0..64).all(|j| index.get(id_of(j), id_of) == Some(j)));
        assert!((64..1_000).all(|j| index.get(id_of(j), id_of).is_none()));
        assert_eq!(index.len(), 64);
    }

    proptest::proptest! {
        /// Against a map of live IDs, with slots reused last freed first as
        /// the scheduler's slab does: lookups, sizes and equality agree
        /// whatever is stale or swept.
        #[test]
        fn the_job_index_agrees_with_a_map_of_live_jobs(
            ops in proptest::collection::vec((0u8..3, 0u16..300), 1..1_500)
        ) {
            let mut index = JobIndex::default();
            let mut slab: Vec<Option<JobId>> = Vec::new();
            let mut free: Vec<JobIdx> = Vec::new();
            let mut live: std::collections::BTreeMap<JobId, JobIdx> = std::collections::BTreeMap::new();
            for (op, n) in ops {
                let id = JobId::named(&format!("job {n}"));
                match op {
                    0 if !live.contains_key(&id) => {
                        let j = free.pop().unwrap_or_else(|| {
                            slab.push(None);
                            (slab.len() - 1) as JobIdx
                        });
                        slab[j as usize] = Some(id);
                        index.insert(&id, j);
                        live.insert(id, j);
                    }
                    1 => {
                        if let Some(j) = live.remove(&id) {
                            slab[j as usize] = None;
                            free.push(j);
                            proptest::prop_assert!(index.remove(j));
                        }
                    }
                    _ => {}
                }
                let id_of = |j: JobIdx| slab[j as usize].as_ref().expect("a live entry's slot holds its job");
                proptest::prop_assert_eq!(index.get(&id, id_of), live.get(&id).copied());
                proptest::prop_assert_eq!(index.len(), live.len());
                proptest::prop_assert!(index.stale <= index.stale_limit());
            }
            let id_of = |j: JobIdx| slab[j as usize].as_ref().expect("a live entry's slot holds its job");
            for (id, &j) in &live {
                proptest::prop_assert_eq!(index.get(id, id_of), Some(j));
            }
            let mut fresh = JobIndex::default();
            for (id, &j) in &live {
                fresh.insert(id, j);
            }
            proptest::prop_assert_eq!(&index, &fresh);
        }
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
