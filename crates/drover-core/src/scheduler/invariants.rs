//! Self-checks of the scheduler's state, used by tests after every step.
//!
//! They restate the invariants listed in ARCHITECTURE.md in executable form:
//! nothing over-committed, one live run per job, queues and indexes in step
//! with the jobs, reservations symmetric, timers matching job stages,
//! suspended runs holding their memory and tokens but not their slots and
//! CPU.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    DrawBuffers, GangIdx, JobState, MAX_LOST, Place, Scheduler, Stage, TimerSlot, WorkerIdx, live_entry,
};
use crate::queue::{ClassIdx, TenantIdx, class_bit};
use crate::quota::Amounts;
use crate::resources::WorkerResources;
use crate::types::JobId;

impl Scheduler {
    /// Checks every internal invariant; the error names the first one broken.
    /// Cost is linear in the state: for tests and debugging, not the hot path.
    pub fn check_invariants(&self) -> Result<(), String> {
        // Each worker's ID leads to its own index, and no index has two IDs
        // (lost workers' indexes go to new workers).
        if self.worker_index.len() != self.workers.len() {
            return Err(format!("{} worker IDs for {} workers", self.worker_index.len(), self.workers.len()));
        }
        for (id, &w) in &self.worker_index {
            if self.workers.get(w as usize).is_none_or(|worker| worker.id != *id) {
                return Err(format!("{id:?} leads to index {w}, which holds another worker"));
            }
        }
        // The lost workers: oldest first, one per name, bounded.
        if self.lost.len() > MAX_LOST || !self.lost.is_sorted_by_key(|l| l.at) {
            return Err(format!("{} lost workers, or out of order", self.lost.len()));
        }
        let names: BTreeSet<&str> = self.lost.iter().map(|l| l.name.as_str()).collect();
        if names.len() != self.lost.len() {
            return Err("a lost worker is remembered twice".to_owned());
        }
        let mut used: BTreeMap<u32, WorkerResources> = BTreeMap::new();
        let runs = self.runs.sorted();
        let mut per_worker: BTreeMap<u32, usize> = BTreeMap::new();
        for &(run_id, run) in &runs {
            *per_worker.entry(run.worker).or_default() += 1;
            let worker = &self.workers[run.worker as usize];
            if !worker.alive {
                return Err(format!("run {run_id:?} is on lost worker {:?}", worker.id));
            }
            if !worker.runs.contains(run_id) {
                return Err(format!("run {run_id:?} missing from its worker's list"));
            }
            let key = &self.classes[run.class as usize].key;
            let used = used.entry(run.worker).or_default();
            used.take(key);
            if run.suspended.is_some() {
                // Suspended: memory and tokens held, slots and CPU given back.
                used.suspend(key);
                if !run.started {
                    return Err(format!("run {run_id:?} was suspended before it started"));
                }
                if run.job.is_some() != self.suspended.contains(run_id) {
                    return Err(format!(
                        "suspended run {run_id:?} is not listed to resume (or is cancelled)"
                    ));
                }
            }
            if let Some(j) = run.job {
                let job = self.jobs[j as usize].as_ref().ok_or("run points at a freed job")?;
                match job.state {
                    JobState::Assigned(r) | JobState::Running(r) if r == *run_id => {}
                    other => return Err(format!("job {} in state {other:?} owns run {run_id:?}", job.id)),
                }
                if (job.state == JobState::Running(*run_id)) != run.started {
                    return Err(format!("job {} start flag disagrees with its state", job.id));
                }
            }
        }
        for run in &self.suspended {
            if self.runs.get(run).is_none_or(|r| r.suspended.is_none()) {
                return Err(format!("run {run:?} waits to resume but is not suspended"));
            }
        }
        for (w, worker) in self.workers.iter().enumerate() {
            let w = w as u32;
            let res = &worker.res;
            if res.over_committed() {
                return Err(format!("worker {:?} over-committed: {res:?}", worker.id));
            }
            let expect = used.remove(&w).unwrap_or_default();
            if (res.used_slots, res.used_cpu, res.used_memory, &res.used_tokens, &res.exclusive_held)
                != (
                    expect.used_slots,
                    expect.used_cpu,
                    expect.used_memory,
                    &expect.used_tokens,
                    &expect.exclusive_held,
                )
            {
                return Err(format!("worker {:?} usage does not match its runs", worker.id));
            }
            if worker.runs.len() != per_worker.get(&w).copied().unwrap_or(0) {
                return Err(format!("worker {:?} lists runs that are not in flight", worker.id));
            }
            if self.hungry.contains(&w) != (worker.alive && !worker.draining && res.free_slot()) {
                return Err(format!("worker {:?} hungry flag is stale", worker.id));
            }
            if worker.draining && worker.reserved.is_some() {
                return Err(format!("draining worker {:?} holds a reservation", worker.id));
            }
            let [first, second] = self.queue_counts[w as usize];
            if !worker.alive && (first.len() + second.len() > 0 || !worker.held.is_empty()) {
                return Err(format!("lost worker {:?} still has queues or artifacts", worker.id));
            }
            if let Some(j) = worker.reserved {
                let job = self.jobs[j as usize].as_ref().ok_or("reservation of a freed job")?;
                if job.reserved_on != Some(w) || !matches!(job.state, JobState::Queued(_)) {
                    return Err(format!("worker {:?} reservation is not mirrored", worker.id));
                }
            }
            let held = self.held_by(w);
            if worker.held.len() > 2 * held.len().max(16) {
                return Err(format!("the artifact list of {:?} is more than twice what it holds", worker.id));
            }
            for (queue, first) in [(&worker.first, true), (&worker.second, false)] {
                for j in queue.jobs(live_entry(&self.eras)) {
                    let place = if first { Place::First(w) } else { Place::Second(w) };
                    let job = self.jobs[j as usize].as_ref().ok_or("queue holds a freed job")?;
                    if !job.places.contains(&place) {
                        return Err(format!("job {} is in a queue it does not list", job.id));
                    }
                }
            }
        }
        if self.job_index.len() != self.jobs.iter().flatten().count() {
            return Err(format!(
                "the job index holds {} entries, not one per live job",
                self.job_index.len()
            ));
        }
        let mut queued_places = 0;
        let mut placed: BTreeMap<u32, u32> = BTreeMap::new();
        for (j, job) in self.jobs.iter().enumerate() {
            let Some(job) = job else { continue };
            let j = j as u32;
            if self.lookup(&job.id) != Some(j) {
                return Err(format!("job {} is not indexed by its ID", job.id));
            }
            let timer = job.timer.map(|(_, slot)| slot);
            let expected_timer = match job.state {
                JobState::Queued(Stage::Cache) => Some(TimerSlot::Cache(j)),
                JobState::Queued(Stage::Deps) => Some(TimerSlot::Deps(j)),
                JobState::Unplaceable => Some(TimerSlot::Unplaceable(j)),
                _ => None,
            };
            if timer != expected_timer {
                return Err(format!("job {} in {:?} has timer {timer:?}", job.id, job.state));
            }
            if let Some(t) = job.timer
                && !self.timers.contains(&t)
            {
                return Err(format!("job {} timer is not armed", job.id));
            }
            let queued = matches!(job.state, JobState::Queued(_));
            if !queued && (!job.places.is_empty() || job.reserved_on.is_some() || job.indexed) {
                return Err(format!("job {} in {:?} is still queued somewhere", job.id, job.state));
            }
            if job.state == JobState::Queued(Stage::Global) && !job.places.contains(&Place::Global) {
                return Err(format!("job {} in the global stage is not in the global queue", job.id));
            }
            for place in &job.places {
                match *place {
                    Place::First(w) => {
                        if !self.holds(w, &job.id) {
                            return Err(format!("job {} in the first queue of a non-holder", job.id));
                        }
                    }
                    Place::Second(w) => {
                        if !job.deps.iter().any(|d| self.holds(w, d)) {
                            return Err(format!(
                                "job {} in the second queue of a worker without its deps",
                                job.id
                            ));
                        }
                    }
                    Place::Global => {}
                }
            }
            if queued {
                queued_places += job.places.len();
                *placed.entry(job.tenant).or_default() += job.places.len() as u32;
                // Rule 1: the first queue of every live holder of its result
                // (gang members wait outside the locality queues).
                let holders =
                    if job.state == JobState::Queued(Stage::Gang) { None } else { self.holders.get(&job.id) };
                for &w in holders.into_iter().flatten() {
                    if !job.places.contains(&Place::First(w)) {
                        return Err(format!("job {} is missing from a holder's first queue", job.id));
                    }
                }
            }
            if let Some(w) = job.reserved_on
                && self.workers[w as usize].reserved != Some(j)
            {
                return Err(format!("job {} reservation is not mirrored", job.id));
            }
            if job.waiters.is_empty() {
                return Err(format!("job {} has no waiter", job.id));
            }
        }
        // Holders: sorted lists of live workers that hold the artifact.
        let listed: Vec<BTreeSet<JobId>> =
            (0..self.workers.len()).map(|w| self.held_by(w as WorkerIdx).into_iter().collect()).collect();
        for (a, ws) in self.holders.sorted() {
            if ws.is_empty() || !ws.windows(2).all(|p| p[0] < p[1]) {
                return Err(format!("the holders of artifact {a} are not a sorted list: {ws:?}"));
            }
            if ws.iter().any(|&w| !listed[w as usize].contains(a)) {
                return Err(format!("artifact {a} lists a holder whose artifact list lacks it"));
            }
        }
        // Readers (see `readers.rs`): each live entry is a queued job in its
        // dependency stage (or later) that reads the artifact, listed once;
        // every such job is listed under each dependency; dead entries are
        // counted and bounded.
        let mut readers = BTreeSet::new();
        for (a, list) in self.dependents.sorted() {
            if !list.dead_agree(live_entry(&self.eras)) {
                return Err(format!("the readers of artifact {a} count their dead entries wrong"));
            }
            for j in list.live(live_entry(&self.eras)) {
                let job = self.jobs[j as usize].as_ref().ok_or("a live reader is a freed job")?;
                if !job.indexed || !job.deps.contains(a) || !readers.insert((j, *a)) {
                    return Err(format!("job {} is listed wrongly among the readers of {a}", job.id));
                }
            }
        }
        let indexed: usize =
            self.jobs.iter().flatten().filter(|job| job.indexed).map(|job| job.deps.len()).sum();
        if indexed != readers.len() {
            return Err(format!("{indexed} dependencies of indexed jobs, {} live readers", readers.len()));
        }
        // Dead entries in the queues (see `queue.rs`, "Leaving the queues
        // lazily") are counted as such.
        if self.queue_counts.len() != self.workers.len() {
            return Err("the queue counts are not one pair per worker".to_owned());
        }
        let queues = self.workers.iter().zip(&self.queue_counts);
        for (queue, counts) in queues.flat_map(|(w, c)| [(&w.first, &c[0]), (&w.second, &c[1])]) {
            let live = queue.jobs(live_entry(&self.eras)).count();
            if live != counts.len() {
                return Err(format!(
                    "a queue counts {} live entries of {}, but {live} are",
                    counts.len(),
                    counts.entries()
                ));
            }
            if !queue.classes_agree(counts) {
                return Err("a queue's entries per class are counted wrong".to_owned());
            }
        }
        if !self.global.agrees(live_entry(&self.eras)) {
            return Err(format!(
                "the global queue's counts, masks or dead entries are wrong ({} entries, {} live)",
                self.global.entries(),
                self.global.len()
            ));
        }
        for j in self.global.jobs(live_entry(&self.eras)) {
            let job = self.jobs[j as usize].as_ref().ok_or("the global queue holds a freed job")?;
            if !job.places.contains(&Place::Global) {
                return Err(format!("job {} is in the global queue but does not list it", job.id));
            }
        }
        let in_queues: usize =
            self.global.len() + self.queue_counts.iter().map(|[f, s]| f.len() + s.len()).sum::<usize>();
        if in_queues != queued_places {
            return Err(format!("queues hold {in_queues} entries, jobs list {queued_places}"));
        }
        // Gangs: members counted, waiting members listed, nothing else.
        let mut members: BTreeMap<u32, (u32, usize)> = BTreeMap::new();
        for (j, job) in self.jobs.iter().enumerate() {
            let Some(job) = job else { continue };
            let waiting = job.state == JobState::Queued(Stage::Gang);
            match job.gang {
                Some(g) => {
                    let gang = self.gangs.get(&g).ok_or("a job names a gang that is gone")?;
                    let entry = members.entry(g).or_default();
                    entry.0 += 1;
                    if waiting {
                        entry.1 += 1;
                        if !gang.queued.contains(&(job.key, j as u32)) || !job.places.is_empty() {
                            return Err(format!("gang member {} waits outside its gang", job.id));
                        }
                    }
                }
                None if waiting => return Err(format!("job {} waits for a gang it is not in", job.id)),
                None => {}
            }
        }
        for (g, gang) in &self.gangs {
            let (live, waiting) = members.get(g).copied().unwrap_or_default();
            if gang.members != live
                || gang.queued.len() != waiting
                || self.gang_index.get(&gang.id) != Some(g)
            {
                return Err(format!("gang {} does not match its jobs", gang.id));
            }
        }
        let waiting: BTreeSet<(u32, GangIdx)> =
            self.gangs.iter().filter_map(|(&g, gang)| gang.waits().map(|n| (n, g))).collect();
        if waiting != self.waiting_gangs {
            return Err(format!("waiting gangs {:?}, expected {waiting:?}", self.waiting_gangs));
        }
        // Each queue's order holds exactly its tenants with queued entries,
        // each under its current key.
        placed.retain(|_, n| *n > 0);
        for (t, tenant) in self.tenants.iter().enumerate() {
            let t = t as u32;
            let expect = placed.get(&t).copied().unwrap_or(0);
            let key = self.tenant_key(t);
            let filed = self.orders[tenant.queue as usize].contains(&key);
            if tenant.placed != expect || filed != (expect > 0) || tenant.filed != filed.then_some(key) {
                return Err(format!("tenant {} is not filed under its current key", tenant.name));
            }
        }
        let filed: usize = self.orders.iter().map(|o| o.len()).sum();
        if filed != placed.len() {
            return Err("a queue order lists tenants without queued jobs".to_owned());
        }
        for (q, order) in self.orders.iter().enumerate() {
            let key = (!order.is_empty()).then(|| {
                self.policy.queue_key(self.quotas.nodes[q].priority, self.quotas.share(q as u32), q as u32)
            });
            if self.queue_filed[q] != key || key.is_some_and(|k| self.queue_order.binary_search(&k).is_err())
            {
                return Err(format!(
                    "queue {q} is filed as {:?} in the queue order, not {key:?}",
                    self.queue_filed[q]
                ));
            }
        }
        if self.queue_order.len() != self.queue_filed.iter().flatten().count()
            || !self.queue_order.is_sorted_by(|a, b| a < b)
        {
            return Err("the queue order lists a queue twice or one without queued jobs".to_owned());
        }
        // Deserved amounts are recomputed whenever a request change could
        // move them (see `Queues::charge`): recomputing now changes nothing.
        if !self.quotas.dirty && self.quotas.active() {
            let mut fresh = self.quotas.clone();
            fresh.deserve(self.total);
            if let Some(q) =
                (0..fresh.nodes.len()).find(|&q| fresh.nodes[q].deserved != self.quotas.nodes[q].deserved)
            {
                return Err(format!("queue {q}'s deserved amount is stale"));
            }
        }
        // Queue totals match the jobs and runs.
        let mut pending = vec![Amounts::default(); self.quotas.nodes.len()];
        let mut allocated = pending.clone();
        let up = |totals: &mut Vec<Amounts>, leaf: u32, a: Amounts| {
            let mut q = Some(leaf);
            while let Some(i) = q {
                totals[i as usize].add(a);
                q = self.quotas.nodes[i as usize].parent;
            }
        };
        let mut by_class = vec![Vec::<u32>::new(); self.tenants.len()];
        for job in self.jobs.iter().flatten() {
            if matches!(job.state, JobState::Queued(_)) {
                let leaf = self.tenants[job.tenant as usize].queue;
                up(&mut pending, leaf, self.classes[job.class as usize].amounts);
                let counts = &mut by_class[job.tenant as usize];
                if counts.len() <= job.class as usize {
                    counts.resize(job.class as usize + 1, 0);
                }
                counts[job.class as usize] += 1;
            }
        }
        for (t, tenant) in self.tenants.iter().enumerate() {
            let counted = &tenant.classes;
            let expected = &by_class[t];
            if (0..counted.len().max(expected.len()))
                .any(|c| counted.get(c).copied().unwrap_or(0) != expected.get(c).copied().unwrap_or(0))
            {
                return Err(format!("tenant {} counts its queued jobs by class wrong", tenant.name));
            }
            let mask = counted
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .fold(0, |m, (c, _)| m | class_bit(c as ClassIdx));
            if tenant.class_mask != mask {
                return Err(format!(
                    "tenant {}'s class mask is {:#x}, not {mask:#x}",
                    tenant.name, tenant.class_mask
                ));
            }
        }
        // Each queue's counts by class are its tenants' summed, its mask
        // their masks together.
        let mut queue_counts = vec![Vec::<u32>::new(); self.queue_classes.len()];
        let mut queue_masks = vec![0u64; self.queue_masks.len()];
        for tenant in &self.tenants {
            let q = tenant.queue as usize;
            let sums = &mut queue_counts[q];
            if sums.len() < tenant.classes.len() {
                sums.resize(tenant.classes.len(), 0);
            }
            for (sum, n) in sums.iter_mut().zip(&tenant.classes) {
                *sum += n;
            }
            queue_masks[q] |= tenant.class_mask;
        }
        for (q, (expected, counted)) in queue_counts.iter().zip(&self.queue_classes).enumerate() {
            let len = expected.len().max(counted.len());
            if (0..len).any(|c| expected.get(c).copied().unwrap_or(0) != counted.get(c).copied().unwrap_or(0))
            {
                return Err(format!("queue {q} counts its queued jobs by class wrong"));
            }
            if queue_masks[q] != self.queue_masks[q] {
                return Err(format!(
                    "queue {q}'s class mask is {:#x}, not {:#x}",
                    self.queue_masks[q], queue_masks[q]
                ));
            }
        }
        let mut tenants = vec![Amounts::default(); self.tenants.len()];
        for &(_, run) in &runs {
            let leaf = self.tenants[run.tenant as usize].queue;
            let mut held = self.classes[run.class as usize].amounts;
            if run.suspended.is_some() {
                let key = &self.classes[run.class as usize].key;
                held.sub(Amounts::new(key.slots, key.cpu, 0));
            }
            up(&mut allocated, leaf, held);
            tenants[run.tenant as usize].add(held);
        }
        for (t, tenant) in self.tenants.iter().enumerate() {
            if tenant.allocated != tenants[t] {
                return Err(format!("tenant {} allocation does not match its runs", tenant.name));
            }
        }
        for (q, node) in self.quotas.nodes.iter().enumerate() {
            if node.pending != pending[q] || node.allocated != allocated[q] {
                return Err(format!("queue {} totals do not match its jobs and runs", node.name));
            }
            if !node.allocated.within(&node.capability) {
                return Err(format!("queue {} holds more than its capability", node.name));
            }
        }
        // Dead job timer entries may sit behind live ones, never in front (so
        // `poll_timeout` is exact); a lease entry is always its worker's
        // current one, and every live worker's lease is armed.
        if let Some(&(at, slot)) = self.timers.first()
            && !self.timer_live(at, slot)
        {
            return Err(format!("dead timer {slot:?} at {at} in front"));
        }
        for &(at, slot) in &self.timers {
            if matches!(slot, TimerSlot::Lease(_)) && !self.timer_live(at, slot) {
                return Err(format!("stale lease timer {slot:?} at {at}"));
            }
        }
        for (w, worker) in self.workers.iter().enumerate() {
            if worker.alive && !self.timers.contains(&(worker.lease, TimerSlot::Lease(w as WorkerIdx))) {
                return Err(format!("worker {:?} has no lease timer", worker.id));
            }
            // With queues, its combined local masks cover what its two
            // queues hold.
            for t in (0..self.tenants.len() as TenantIdx).filter(|_| self.quotas.active()) {
                let held = worker.first.class_mask(t) | worker.second.class_mask(t);
                let combined = worker.local_masks.get(t as usize).copied().unwrap_or(0);
                if held & !combined != 0 {
                    return Err(format!(
                        "worker {:?}'s local mask for tenant {t} is {combined:#x}, short of {held:#x}",
                        worker.id
                    ));
                }
            }
        }
        if self.draw_buffers != DrawBuffers::default() {
            return Err("a draw left its working lists behind".to_owned());
        }
        self.check_no_idle_worker_could_work()
    }

    /// Work conservation: once a step is done, no worker with a free slot
    /// could take a queued job (a draw on a copy of the state assigns
    /// nothing), so no event that frees room forgot to wake a worker.
    fn check_no_idle_worker_could_work(&self) -> Result<(), String> {
        if self.hungry.is_empty() {
            return Ok(());
        }
        let mut copy = self.clone();
        copy.decisions.clear();
        copy.dirty.extend(self.hungry.iter().copied());
        copy.draw_all();
        match copy.decisions.iter().find(|d| matches!(d, super::Decision::Assign { .. })) {
            Some(d) => Err(format!("a worker idles while it could run a job: {d:?}")),
            None => Ok(()),
        }
    }
}
