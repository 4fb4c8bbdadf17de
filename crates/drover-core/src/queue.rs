//! Fair queues: the global queue and each worker's two local queues.
//!
//! A [`Queue`] is split into lanes, one per job class (a class is a distinct
//! combination of resource request, exclusive tokens and required labels), so
//! a worker can skip every job it cannot fit with one check per class instead
//! of one per job. Inside a lane, each tenant has its own ordered jobs
//! (priority first, then arrival), and the tenants are ordered by when they
//! were last served: least recently served first (Spindle's heap).
//!
//! Serving a tenant changes its key in every lane it appears in. Rather than
//! touching all of them, each lane remembers the key it filed the tenant under
//! and corrects it lazily when the tenant reaches the front: keys only grow, so
//! a stale key is always too small and is seen (and fixed) before it matters.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// Index of an interned job class.
pub(crate) type ClassIdx = u32;
/// Index of an interned tenant.
pub(crate) type TenantIdx = u32;
/// Index of a live job in the scheduler's slab.
pub(crate) type JobIdx = u32;

/// Order of a tenant's jobs: higher priority first, then the longest
/// remaining path (critical path first), then first scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct JobKey {
    pub(crate) priority: Reverse<i32>,
    pub(crate) path: Reverse<u64>,
    pub(crate) seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct TenantJobs {
    /// The last-served value this tenant is filed under in `Lane::order`.
    filed: u64,
    jobs: BTreeMap<JobKey, JobIdx>,
}

/// The jobs of one class in one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lane {
    tenants: BTreeMap<TenantIdx, TenantJobs>,
    /// (last served, tenant) for every tenant with jobs here.
    order: BTreeSet<(u64, TenantIdx)>,
}

impl Lane {
    fn insert(&mut self, tenant: TenantIdx, served: u64, key: JobKey, job: JobIdx) {
        let entry = self.tenants.entry(tenant).or_insert_with(|| {
            self.order.insert((served, tenant));
            TenantJobs { filed: served, jobs: BTreeMap::new() }
        });
        entry.jobs.insert(key, job);
    }

    /// Removes one job; true if it was there.
    fn remove(&mut self, tenant: TenantIdx, key: JobKey) -> bool {
        let Some(entry) = self.tenants.get_mut(&tenant) else { return false };
        if entry.jobs.remove(&key).is_none() {
            return false;
        }
        if entry.jobs.is_empty() {
            self.order.remove(&(entry.filed, tenant));
            self.tenants.remove(&tenant);
        }
        true
    }

    /// The least recently served tenant with jobs here, with its current
    /// last-served value. `served` gives a tenant's current value.
    fn front(&mut self, served: impl Fn(TenantIdx) -> u64) -> Option<(u64, TenantIdx)> {
        loop {
            let &(filed, tenant) = self.order.first()?;
            let current = served(tenant);
            if current == filed {
                return Some((filed, tenant));
            }
            self.order.remove(&(filed, tenant));
            self.order.insert((current, tenant));
            if let Some(entry) = self.tenants.get_mut(&tenant) {
                entry.filed = current;
            }
        }
    }

    /// The first job of a tenant here.
    fn first_of(&self, tenant: TenantIdx) -> Option<(JobKey, JobIdx)> {
        let entry = self.tenants.get(&tenant)?;
        entry.jobs.first_key_value().map(|(k, j)| (*k, *j))
    }

    fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    fn jobs(&self) -> impl Iterator<Item = JobIdx> + '_ {
        self.tenants.values().flat_map(|t| t.jobs.values().copied())
    }
}

/// One queue: the global queue, or one of a worker's two local queues.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Queue {
    lanes: BTreeMap<ClassIdx, Lane>,
    len: usize,
}

impl Queue {
    pub(crate) fn insert(
        &mut self,
        class: ClassIdx,
        tenant: TenantIdx,
        served: u64,
        key: JobKey,
        job: JobIdx,
    ) {
        self.lanes.entry(class).or_default().insert(tenant, served, key, job);
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey) {
        if let Some(lane) = self.lanes.get_mut(&class)
            && lane.remove(tenant, key)
        {
            self.len -= 1;
            if lane.is_empty() {
                self.lanes.remove(&class);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The classes with jobs here.
    pub(crate) fn classes(&self) -> impl Iterator<Item = ClassIdx> + '_ {
        self.lanes.keys().copied()
    }

    /// The least recently served tenant among the jobs of `class`.
    pub(crate) fn front(
        &mut self,
        class: ClassIdx,
        served: impl Fn(TenantIdx) -> u64,
    ) -> Option<(u64, TenantIdx)> {
        self.lanes.get_mut(&class)?.front(served)
    }

    /// The first job of `tenant` among the jobs of `class`.
    pub(crate) fn first_of(&self, class: ClassIdx, tenant: TenantIdx) -> Option<(JobKey, JobIdx)> {
        self.lanes.get(&class)?.first_of(tenant)
    }

    /// Every job here, in class, tenant and job order.
    pub(crate) fn jobs(&self) -> impl Iterator<Item = JobIdx> + '_ {
        self.lanes.values().flat_map(Lane::jobs)
    }

    /// Empties the queue, returning its jobs.
    pub(crate) fn take_all(&mut self) -> Vec<JobIdx> {
        let jobs = self.jobs().collect();
        *self = Queue::default();
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seq: u64) -> JobKey {
        JobKey { priority: Reverse(0), path: Reverse(0), seq }
    }

    #[test]
    fn least_recently_served_tenant_comes_first_and_stale_keys_are_fixed() {
        let mut q = Queue::default();
        q.insert(0, 1, 0, key(1), 10);
        q.insert(0, 2, 0, key(2), 20);
        // Tenant 1 was served after being filed: its key is stale.
        let served = |t: TenantIdx| if t == 1 { 5 } else { 0 };
        assert_eq!(q.front(0, served), Some((0, 2)));
        q.remove(0, 2, key(2));
        assert_eq!(q.front(0, served), Some((5, 1)));
        q.remove(0, 1, key(1));
        assert_eq!(q.len(), 0);
        assert_eq!(q.classes().count(), 0);
    }

    #[test]
    fn priority_then_arrival_within_a_tenant() {
        let mut q = Queue::default();
        q.insert(0, 1, 0, JobKey { priority: Reverse(0), path: Reverse(0), seq: 1 }, 1);
        q.insert(0, 1, 0, JobKey { priority: Reverse(5), path: Reverse(0), seq: 2 }, 2);
        q.insert(0, 1, 0, JobKey { priority: Reverse(5), path: Reverse(0), seq: 3 }, 3);
        assert_eq!(q.first_of(0, 1).map(|(_, j)| j), Some(2));
        assert_eq!(q.take_all(), vec![2, 3, 1]);
    }
}
