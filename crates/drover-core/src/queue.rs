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
//! is one descent per class. The global queue, which holds most of the
//! backlog, also keeps the first job of each (tenant, class) in a small map
//! of its own ([`Queue::with_heads`]): a draw then reads a tenant's fronts
//! there with one descent into a map that stays in cache, instead of one
//! descent per class into the big one.

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
    /// With [`Queue::with_heads`]: the first job of each (tenant, class).
    heads: Option<BTreeMap<(TenantIdx, ClassIdx), (JobKey, JobIdx)>>,
}

impl Queue {
    /// A queue that also indexes the first job of each (tenant, class): for
    /// a big queue, where that saves a descent per class on every draw.
    pub(crate) fn with_heads() -> Queue {
        Queue { jobs: BTreeMap::new(), heads: Some(BTreeMap::new()) }
    }

    pub(crate) fn insert(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey, job: JobIdx) {
        self.jobs.insert((tenant, class, key), job);
        if let Some(heads) = &mut self.heads {
            let head = heads.entry((tenant, class)).or_insert((key, job));
            if key < head.0 {
                *head = (key, job);
            }
        }
    }

    /// Removes one job; true if it was there.
    pub(crate) fn remove(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey) -> bool {
        if self.jobs.remove(&(tenant, class, key)).is_none() {
            return false;
        }
        if let Some(heads) = &mut self.heads
            && heads.get(&(tenant, class)).is_some_and(|head| head.0 == key)
        {
            // The next job of the class, if any, heads it now.
            match self.jobs.range((tenant, class, key)..).next() {
                Some((&(t, c, next), &j)) if (t, c) == (tenant, class) => {
                    heads.insert((tenant, class), (next, j));
                }
                _ => {
                    heads.remove(&(tenant, class));
                }
            }
        }
        true
    }

    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// The first job of each class `tenant` has here, in class order: one
    /// descent per class.
    pub(crate) fn fronts(&self, tenant: TenantIdx) -> impl Iterator<Item = (ClassIdx, JobKey, JobIdx)> + '_ {
        let heads = self.heads.as_ref().map(|heads| {
            heads.range((tenant, 0)..=(tenant, ClassIdx::MAX)).map(|(&(_, c), &(key, j))| (c, key, j))
        });
        let mut from = heads.is_none().then_some(0);
        let mut heads = heads.into_iter().flatten();
        std::iter::from_fn(move || {
            let Some(class) = from else { return heads.next() };
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
        if let Some(heads) = &mut self.heads {
            heads.clear();
        }
        std::mem::take(&mut self.jobs).into_iter().map(|((t, _, _), j)| (t, j)).collect()
    }

    /// Whether the heads index (if kept) names exactly each (tenant,
    /// class)'s first job (for the invariant checks).
    pub(crate) fn heads_agree(&self) -> bool {
        let Some(heads) = &self.heads else { return true };
        let mut firsts: BTreeMap<(TenantIdx, ClassIdx), (JobKey, JobIdx)> = BTreeMap::new();
        for (&(t, c, key), &j) in &self.jobs {
            firsts.entry((t, c)).or_insert((key, j));
        }
        firsts == *heads
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
    fn a_queue_with_heads_gives_the_same_fronts() {
        let (mut plain, mut headed) = (Queue::default(), Queue::with_heads());
        let ops: [(bool, ClassIdx, TenantIdx, JobKey, JobIdx); 9] = [
            (true, 2, 1, key(0, 1), 10),
            (true, 0, 1, key(0, 2), 20),
            (true, 0, 1, key(5, 3), 30),
            (true, 0, 2, key(0, 4), 40),
            (false, 0, 1, key(5, 3), 30),
            (true, 0, 1, key(9, 5), 50),
            (false, 2, 1, key(0, 1), 10),
            (false, 0, 1, key(0, 2), 20),
            (false, 0, 1, key(9, 5), 50),
        ];
        for (add, class, tenant, k, j) in ops {
            for q in [&mut plain, &mut headed] {
                if add {
                    q.insert(class, tenant, k, j);
                } else {
                    assert!(q.remove(class, tenant, k));
                }
            }
            assert!(headed.heads_agree(), "after {add} {class} {tenant} {j}");
            for t in [1, 2, 3] {
                assert_eq!(plain.fronts(t).collect::<Vec<_>>(), headed.fronts(t).collect::<Vec<_>>());
            }
        }
        assert_eq!(headed.fronts(2).map(|(_, _, j)| j).collect::<Vec<_>>(), vec![40]);
        assert_eq!(headed.fronts(1).count(), 0);
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
