//! Queues: the global queue and each worker's two local queues.
//!
//! A [`Queue`] files its jobs by tenant, then by job class (a class is a
//! distinct combination of resource request, exclusive tokens and required
//! labels), then in the tenant's job order. Which tenant goes next is not the
//! queue's business: the scheduler keeps one order of all tenants with queued
//! jobs, least recently served first (Spindle's heap), and a worker's draw
//! walks that order asking each of its three queues "what does this tenant
//! have here?". Serving a tenant therefore moves one entry in one index,
//! however many queues hold its jobs; and a worker looks at each class of a
//! tenant with one resource check, not at every job.
//!
//! A queue is one ordered map keyed by (tenant, class, job order), so adding
//! or removing a job is one descent, and a tenant's first job of each class
//! is one descent per class.

use std::collections::BTreeMap;

/// Index of an interned job class.
pub(crate) type ClassIdx = u32;
/// Index of an interned tenant.
pub(crate) type TenantIdx = u32;
/// Index of a live job in the scheduler's slab.
pub(crate) type JobIdx = u32;

/// Order of a tenant's jobs: the components of the configured job rules
/// (by default higher priority first, then the longest remaining path:
/// critical path first; see `policy.rs`), then first scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct JobKey {
    pub(crate) order: [u64; 2],
    pub(crate) seq: u64,
}

/// Where a job is filed in a queue: its tenant, its class, then its order
/// among that tenant's jobs of the class.
type Slot = (TenantIdx, ClassIdx, JobKey);

const FIRST_KEY: JobKey = JobKey { order: [0; 2], seq: 0 };

/// One queue: the global queue, or one of a worker's two local queues. One
/// ordered map, so adding or removing a job is a single descent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Queue {
    jobs: BTreeMap<Slot, JobIdx>,
}

impl Queue {
    pub(crate) fn insert(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey, job: JobIdx) {
        self.jobs.insert((tenant, class, key), job);
    }

    /// Removes one job; true if it was there.
    pub(crate) fn remove(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey) -> bool {
        self.jobs.remove(&(tenant, class, key)).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// The first job of each class `tenant` has here, in class order: one
    /// descent per class.
    pub(crate) fn fronts(&self, tenant: TenantIdx) -> impl Iterator<Item = (ClassIdx, JobKey, JobIdx)> + '_ {
        let mut from = Some(0);
        std::iter::from_fn(move || {
            let class = from?;
            let (&(t, c, key), &j) = self.jobs.range((tenant, class, FIRST_KEY)..).next()?;
            if t != tenant {
                from = None;
                return None;
            }
            from = c.checked_add(1);
            Some((c, key, j))
        })
    }

    /// Every job here, in tenant, class and job order.
    pub(crate) fn jobs(&self) -> impl Iterator<Item = JobIdx> + '_ {
        self.jobs.values().copied()
    }

    /// Empties the queue, returning its jobs with their tenants.
    pub(crate) fn take_all(&mut self) -> Vec<(TenantIdx, JobIdx)> {
        std::mem::take(&mut self.jobs).into_iter().map(|((t, _, _), j)| (t, j)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(priority: i32, seq: u64) -> JobKey {
        JobKey { order: [(i64::from(i32::MAX) - i64::from(priority)) as u64, 0], seq }
    }

    #[test]
    fn fronts_give_each_class_its_first_job() {
        let mut q = Queue::default();
        q.insert(2, 1, key(0, 1), 10);
        q.insert(0, 1, key(0, 2), 20);
        q.insert(0, 1, key(5, 3), 30);
        q.insert(0, 2, key(0, 4), 40);
        assert_eq!(q.len(), 4);
        let fronts: Vec<_> = q.fronts(1).map(|(c, _, j)| (c, j)).collect();
        assert_eq!(fronts, vec![(0, 30), (2, 10)]);
        assert_eq!(q.fronts(3).count(), 0);
        assert!(q.remove(2, 1, key(0, 1)));
        assert!(!q.remove(2, 1, key(0, 1)), "already gone");
        assert_eq!(q.fronts(1).map(|(c, _, j)| (c, j)).collect::<Vec<_>>(), vec![(0, 30)]);
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn priority_then_arrival_within_a_tenant_and_empty_tenants_leave() {
        let mut q = Queue::default();
        q.insert(0, 1, key(0, 1), 1);
        q.insert(0, 1, key(5, 2), 2);
        q.insert(0, 1, key(5, 3), 3);
        assert_eq!(q.jobs().collect::<Vec<_>>(), vec![2, 3, 1]);
        for (k, _) in [(key(0, 1), 1), (key(5, 2), 2), (key(5, 3), 3)] {
            assert!(q.remove(0, 1, k));
        }
        assert_eq!(q.len(), 0);
        q.insert(0, 4, key(0, 9), 9);
        assert_eq!(q.take_all(), vec![(4, 9)]);
        assert_eq!(q, Queue::default());
    }
}
