//! Readers of an artifact: the queued jobs in their dependency stage (or
//! later) that read it, for the scheduler's `dependents` index. Late cache
//! news consults it: a new holder of the artifact gains these jobs in its
//! second queue, and a holder that evicts it may lose them.
//!
//! **Left lazily, like the local queues** (see `queue.rs`, "Leaving the
//! local queues lazily"). A job that leaves the queues would otherwise be
//! taken out of the reader list of each of its dependencies: a search in
//! each, on every assignment. Instead each entry carries its job slot's era
//! when the job entered its dependency stage, and the job's departure (which
//! bumps the era) only counts one more dead entry in each list. A list
//! whose dead entries pass half its live ones is swept in one pass
//! ([`Readers::compact`]), and a list whose entries are all dead is dropped
//! with its artifact's index entry, so the dead never take more than half
//! again the room of the live ones (beyond a few per list) and an artifact
//! no job reads any more leaves the index. Nothing outside this module sees
//! a dead entry: every reader passes a liveness test.

use crate::queue::{Era, JobIdx};

/// Dead entries a list tolerates before it is swept, whatever its size.
const SWEEP_AFTER: u32 = 8;

/// The readers of one artifact, in the order they entered their dependency
/// stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Readers {
    /// Each reader with its slot's era when it entered its dependency stage.
    entries: Vec<(JobIdx, Era)>,
    /// Dead entries (see the module doc).
    dead: u32,
}

impl Readers {
    /// Adds `job`, of era `era`, which has just entered its dependency stage.
    pub(crate) fn push(&mut self, job: JobIdx, era: Era) {
        self.entries.push((job, era));
    }

    /// One of the readers left the queues: its entry died. True when it is
    /// time to [`Readers::compact`] (always once every entry is dead).
    pub(crate) fn left(&mut self) -> bool {
        self.dead += 1;
        let len = self.entries.len() as u32;
        self.dead == len || (self.dead >= SWEEP_AFTER && self.dead * 3 > len)
    }

    /// Drops every dead entry.
    pub(crate) fn compact(&mut self, live: impl Fn(JobIdx, Era) -> bool) {
        if self.dead as usize == self.entries.len() {
            self.entries = Vec::new();
        } else {
            self.entries.retain(|&(j, era)| live(j, era));
        }
        self.dead = 0;
    }

    /// No entries at all (the artifact's index entry can go).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The live readers, in the order they entered their dependency stage.
    pub(crate) fn live(&self, live: impl Fn(JobIdx, Era) -> bool) -> impl Iterator<Item = JobIdx> {
        self.entries.iter().filter(move |&&(j, era)| live(j, era)).map(|&(j, _)| j)
    }

    /// Whether the count of dead entries is right and within its bound, and
    /// some entry is live (for the invariant checks).
    pub(crate) fn dead_agree(&self, live: impl Fn(JobIdx, Era) -> bool) -> bool {
        let dead = self.entries.iter().filter(|&&(j, era)| !live(j, era)).count() as u32;
        let len = self.entries.len() as u32;
        dead == self.dead && dead < len && (dead < SWEEP_AFTER || dead * 3 <= len)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn live(dead: &BTreeSet<JobIdx>) -> impl Fn(JobIdx, Era) -> bool + '_ {
        move |j, _| !dead.contains(&j)
    }

    #[test]
    fn dead_readers_are_invisible_then_swept() {
        let mut r = Readers::default();
        for j in 0..30 {
            r.push(j, 0);
        }
        let mut dead = BTreeSet::new();
        let mut sweeps = 0;
        for j in 0..20 {
            dead.insert(j);
            if r.left() {
                r.compact(live(&dead));
                sweeps += 1;
            }
            assert!(r.dead_agree(live(&dead)), "after {j} left");
            assert_eq!(r.live(live(&dead)).collect::<Vec<_>>(), (j + 1..30).collect::<Vec<_>>());
        }
        assert!(sweeps >= 2, "swept {sweeps} times");
        assert!(r.entries.len() < 30 && !r.is_empty());
    }

    #[test]
    fn a_list_whose_readers_all_left_empties() {
        let mut r = Readers::default();
        r.push(1, 0);
        r.push(2, 5);
        assert!(!r.left(), "one of two left");
        assert!(r.left(), "both left");
        r.compact(|_, _| false);
        assert!(r.is_empty());
        assert_eq!(r, Readers::default());
    }
}
