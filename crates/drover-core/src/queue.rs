//! Queues: the global queue and each worker's two local queues.
//!
//! A queue files its jobs by tenant, then by job class (a class is a
//! distinct combination of resource request, exclusive tokens and required
//! labels), then in the tenant's job order. Which tenant goes next is not the
//! queue's business: the scheduler keeps one order of all tenants with queued
//! jobs, least recently served first (Spindle's heap), and a worker's draw
//! walks that order asking each of its three queues "what does this tenant
//! have here?". Serving a tenant therefore moves one entry in one index,
//! however many queues hold its jobs; and a worker looks at each class of a
//! tenant with one resource check, not at every job.
//!
//! A local queue ([`Queue`]) keeps a list per tenant, its entries in class
//! then job order: a sorted vector while they are few (a worker's local
//! queue holds a few of most tenants' jobs), an ordered map of their own
//! once they are many (so that filing one stays a descent). A dense array
//! of slots by tenant index (32 bytes per tenant known to the scheduler:
//! the class mask and the list's own header) gives each tenant's class mask
//! and its list, so a draw reads a tenant's fronts with a load of its slot
//! and a walk along its entries in a cache line or two (an ordered map of
//! tenants took a descent through two or three cold nodes first; a boxed
//! list, one more cold load).
//!
//! The global queue ([`GlobalQueue`]), which holds most of the backlog, is
//! one small ordered map of (tenant, class) groups, each with its first job
//! at hand and its jobs in an ordered map of their own: a draw reads a
//! tenant's fronts with one descent into the small map, which stays in
//! cache.
//!
//! **Class masks.** Each queue also keeps, per tenant, a bit mask of the
//! classes of its entries ([`class_bit`]; dead local entries included), so a
//! draw can tell that a tenant has nothing a worker could take in that
//! worker's queues with a load per queue, without a descent.
//!
//! **Leaving the queues lazily.** A queued job sits in several queues
//! at once (the first queues of the holders of its result, the second
//! queues of the holders of its dependencies, the global queue), and when a
//! worker takes it, it leaves all of them. Taking each entry out at once
//! costs a cold descent into a queue nobody is looking at (in the global
//! queue, into its group's map, since a worker usually takes a job from
//! its own local queues). Instead those entries stay behind, *dead*: each entry
//! carries its job slot's era (a counter bumped whenever the slot's job
//! leaves the queues, and when the slot is freed for another job), and an
//! entry whose era is behind its slot's no longer counts. The
//! worker's own draw drops a dead entry when it meets it at a front (the
//! path is then in cache), and a queue whose dead entries pass half its
//! live ones is swept in one pass ([`Queue::compact`]), so they never take
//! more than half again the room of the live ones. The global queue does
//! the same per (tenant, class) group, but for the group's first job: that
//! one leaves at once, with the dead entries right behind it, so a group's
//! first entry is always live and a draw reads it with no liveness test; a
//! group whose dead entries pass half its live ones (or, in a small group,
//! all of them are dead) is swept ([`GlobalQueue::left`]). Nothing outside
//! this module sees a dead entry: every reader passes a liveness test.

use std::collections::BTreeMap;
use std::collections::btree_map;

/// Index of an interned job class.
pub(crate) type ClassIdx = u32;
/// Index of an interned tenant.
pub(crate) type TenantIdx = u32;
/// Index of a live job in the scheduler's slab.
pub(crate) type JobIdx = u32;
/// A job slot's queue era: bumped each time its job leaves the queues (and
/// when the slot is freed), so the entries left behind are known to be dead.
/// 64 bits: one busy slot may see billions of jobs in a coordinator's life,
/// and a wrapped era would bring a dead entry back to life.
pub(crate) type Era = u64;

/// Order of a tenant's jobs: the components of the configured job rules
/// (by default higher priority first, then the longest remaining path:
/// critical path first; see `policy.rs`), then first scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct JobKey {
    pub(crate) order: [u64; 2],
    pub(crate) seq: u64,
}

const FIRST_KEY: JobKey = JobKey { order: [0; 2], seq: 0 };

/// Dead entries a queue tolerates before it is swept, whatever its size.
const SWEEP_AFTER: u32 = 32;

/// Tenants a local queue makes slots for ahead of need (see
/// [`Queue::room_for`]): 32 KiB of slots at most.
const ROOM_AHEAD: usize = 1_024;

/// Most entries a tenant keeps in a sorted vector in one local queue; beyond
/// that, an ordered map (so that filing one stays a descent, not a shift of
/// the whole vector).
const FEW: usize = 32;

/// Entries of a class [`Queue::fronts`] walks past in a tenant's ordered
/// map after the class's first live job before it descends again to the
/// next class instead.
const PASS_OVER: u32 = 8;

/// The bit of class `c` in a class mask: its own for the first 63 classes,
/// one shared bit for all later ones. A draw compares the classes a tenant
/// has in a queue with those a worker could take in one AND.
pub(crate) fn class_bit(c: ClassIdx) -> u64 {
    1 << c.min(SHARED_BIT)
}

/// The class-mask bit that classes from this one on share.
pub(crate) const SHARED_BIT: ClassIdx = 63;

/// One entry of a local queue: a job of the tenant, with its slot's era.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Entry {
    class: ClassIdx,
    job: JobIdx,
    key: JobKey,
    era: Era,
}

/// A tenant's entries in one local queue, in class then job order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Entries {
    /// At most [`FEW`]: a draw reads them in a cache line or two.
    Few(Vec<Entry>),
    /// Boxed, so that the enum is no larger than the vector (24 bytes, not
    /// 32): it sits in every tenant's slot of every local queue.
    #[allow(clippy::box_collection)]
    Many(Box<BTreeMap<(ClassIdx, JobKey), (JobIdx, Era)>>),
}

impl Entries {
    /// Files an entry; false if it was there already (a dead entry of the
    /// same job, which comes back to life).
    fn insert(&mut self, e: Entry) -> bool {
        match self {
            Entries::Few(v) => match v.binary_search_by(|x| (x.class, x.key).cmp(&(e.class, e.key))) {
                Ok(i) => {
                    v[i] = e;
                    false
                }
                Err(i) => {
                    v.insert(i, e);
                    if v.len() > FEW {
                        let map = v.iter().map(|x| ((x.class, x.key), (x.job, x.era))).collect();
                        *self = Entries::Many(Box::new(map));
                    }
                    true
                }
            },
            Entries::Many(m) => m.insert((e.class, e.key), (e.job, e.era)).is_none(),
        }
    }

    /// Takes an entry out; true if it was there.
    fn remove(&mut self, class: ClassIdx, key: JobKey) -> bool {
        match self {
            Entries::Few(v) => match v.binary_search_by(|x| (x.class, x.key).cmp(&(class, key))) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            Entries::Many(m) => m.remove(&(class, key)).is_some(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Entries::Few(v) => v.is_empty(),
            Entries::Many(m) => m.is_empty(),
        }
    }

    /// The class mask of these entries (see [`class_bit`]). For many
    /// entries, one descent per class present rather than a walk.
    fn mask(&self) -> u64 {
        match self {
            Entries::Few(v) => v.iter().fold(0, |m, e| m | class_bit(e.class)),
            Entries::Many(m) => {
                let (mut mask, mut from) = (0, 0);
                while let Some((&(class, _), _)) = m.range((from, FIRST_KEY)..).next() {
                    mask |= class_bit(class);
                    if class >= SHARED_BIT {
                        break;
                    }
                    from = class + 1;
                }
                mask
            }
        }
    }

    /// Every entry, in class then job order.
    fn iter(&self) -> Box<dyn Iterator<Item = Entry> + '_> {
        match self {
            Entries::Few(v) => Box::new(v.iter().copied()),
            Entries::Many(m) => {
                Box::new(m.iter().map(|(&(class, key), &(job, era))| Entry { class, job, key, era }))
            }
        }
    }

    /// Keeps the entries `keep` accepts.
    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        match self {
            Entries::Few(v) => v.retain(|e| keep(e)),
            Entries::Many(m) => {
                m.retain(|&(class, key), &mut (job, era)| keep(&Entry { class, job, key, era }));
            }
        }
    }

    /// The first live entry of each class, into `out`; the dead entries in
    /// front of one are dropped, each passed to `dropped`.
    fn fronts(
        &mut self,
        live: impl Fn(JobIdx, Era) -> bool,
        mut out: impl FnMut(ClassIdx, JobKey, JobIdx),
        mut dropped: impl FnMut(ClassIdx),
    ) {
        match self {
            Entries::Few(v) => {
                let mut i = 0;
                while i < v.len() {
                    let e = v[i];
                    if !live(e.job, e.era) {
                        v.remove(i);
                        dropped(e.class);
                        continue;
                    }
                    out(e.class, e.key, e.job);
                    // On to the next class.
                    i += v[i..].partition_point(|x| x.class == e.class);
                }
            }
            Entries::Many(m) => {
                let mut dead = Vec::new();
                let mut from = Some((0, FIRST_KEY));
                'descend: while let Some(start) = from.take() {
                    // The class whose first live job was given, and how many
                    // of its later entries were passed over since.
                    let (mut given, mut passed) = (None, 0);
                    for (&slot, &(j, era)) in m.range(start..) {
                        let (class, key) = slot;
                        if given == Some(class) {
                            passed += 1;
                            if passed == PASS_OVER {
                                from = class.checked_add(1).map(|next| (next, FIRST_KEY));
                                continue 'descend;
                            }
                            continue;
                        }
                        if !live(j, era) {
                            dead.push(slot);
                            continue;
                        }
                        out(class, key, j);
                        (given, passed) = (Some(class), 0);
                    }
                }
                for slot in dead {
                    m.remove(&slot);
                    dropped(slot.0);
                }
            }
        }
    }
}

/// How many entries one local queue holds, dead ones included, and how
/// many of those are dead. Kept apart from the queue, in one dense array
/// over all workers' queues (`Scheduler::queue_counts`): a job's departure
/// counts one more dead entry in each of the four or so local queues it
/// was in, queues nobody is looking at, and these counts are all it reads
/// of them until a sweep is due, a few kilobytes that stay in cache
/// instead of a cold line of each worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct QueueCounts {
    entries: u32,
    stale: u32,
}

impl QueueCounts {
    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        (self.entries - self.stale) as usize
    }

    /// Entries, dead ones included (for the invariant checks).
    pub(crate) fn entries(&self) -> usize {
        self.entries as usize
    }

    /// One of the queue's entries died: its job left the queues. True when
    /// it is time to [`Queue::compact`].
    pub(crate) fn left(&mut self) -> bool {
        self.stale += 1;
        self.stale >= SWEEP_AFTER && self.stale * 3 > self.entries
    }
}

/// One of a worker's two local queues. Its counts are kept apart
/// ([`QueueCounts`]) and passed to every method that moves them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Queue {
    /// Per tenant (by index), its class mask and entries here.
    slots: Vec<Slot>,
    /// Entries (dead ones included) per class: a draw skips the walk when
    /// no class it could take has any.
    classes: Vec<u32>,
}

/// A tenant's place in one local queue: its class mask and its entries,
/// side by side in 32 bytes, so that a draw reaches the tenant's first
/// entries from its slot in one step (an ordered map of tenants took a
/// descent through two or three cold nodes).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Slot {
    /// The class mask of the tenant's entries here, dead ones included: a
    /// draw passes over a tenant with nothing it could take here without
    /// reading its entries (see [`Queue::class_mask`]).
    mask: u64,
    /// Its entries (none: an empty vector, which holds no memory).
    entries: Entries,
}

impl Default for Slot {
    fn default() -> Self {
        Slot { mask: 0, entries: Entries::Few(Vec::new()) }
    }
}

impl Slot {
    /// After a change to the entries: the mask follows them, and entries
    /// that emptied give their memory back.
    fn settle(&mut self) {
        if self.entries.is_empty() {
            *self = Slot::default();
        } else {
            self.mask = self.entries.mask();
        }
    }
}

impl Queue {
    /// Makes room for a slot per tenant known (`tenants`), up to
    /// [`ROOM_AHEAD`], at once: growing the array a tenant at a time, as new
    /// tenant indices appear, would leave a trail of freed smaller arrays
    /// behind in every queue. Past that, it grows with the highest tenant
    /// index filed (see [`Queue::insert`]).
    pub(crate) fn room_for(&mut self, tenants: usize) {
        let room = tenants.min(ROOM_AHEAD);
        if self.slots.len() < room {
            self.slots.reserve_exact(room - self.slots.len());
            self.slots.resize_with(room, Slot::default);
        }
    }

    /// Files `job`, of era `era`. A dead entry the job left at the same slot
    /// comes back to life.
    pub(crate) fn insert(
        &mut self,
        counts: &mut QueueCounts,
        class: ClassIdx,
        tenant: TenantIdx,
        key: JobKey,
        job: JobIdx,
        era: Era,
    ) {
        let t = tenant as usize;
        if self.slots.len() <= t {
            self.slots.resize_with(t + 1, Slot::default);
        }
        let slot = &mut self.slots[t];
        slot.mask |= class_bit(class);
        if !slot.entries.insert(Entry { class, job, key, era }) {
            counts.stale -= 1;
        } else {
            counts.entries += 1;
            let c = class as usize;
            if self.classes.len() <= c {
                self.classes.resize(c + 1, 0);
            }
            self.classes[c] += 1;
        }
    }

    /// Removes one live job's entry; true if it was there.
    pub(crate) fn remove(
        &mut self,
        counts: &mut QueueCounts,
        class: ClassIdx,
        tenant: TenantIdx,
        key: JobKey,
    ) -> bool {
        let Some(slot) = self.slots.get_mut(tenant as usize) else { return false };
        if !slot.entries.remove(class, key) {
            return false;
        }
        slot.settle();
        counts.entries -= 1;
        self.classes[class as usize] -= 1;
        true
    }

    /// Drops every dead entry.
    pub(crate) fn compact(&mut self, counts: &mut QueueCounts, live: impl Fn(JobIdx, Era) -> bool) {
        let (classes, removed) = (&mut self.classes, &mut 0u32);
        for slot in &mut self.slots {
            if slot.mask == 0 {
                continue;
            }
            slot.entries.retain(|e| {
                let keep = live(e.job, e.era);
                if !keep {
                    classes[e.class as usize] -= 1;
                    *removed += 1;
                }
                keep
            });
            slot.settle();
        }
        counts.entries -= *removed;
        counts.stale = 0;
    }

    /// Whether any entry (live or dead) is of this class.
    pub(crate) fn has_class(&self, class: ClassIdx) -> bool {
        self.classes.get(class as usize).is_some_and(|&n| n > 0)
    }

    /// The class mask of `tenant`'s entries here, dead ones included (see
    /// [`class_bit`]): no bit in common with the classes a worker could
    /// take means [`Queue::fronts`] has nothing for it.
    pub(crate) fn class_mask(&self, tenant: TenantIdx) -> u64 {
        self.slots.get(tenant as usize).map_or(0, |s| s.mask)
    }

    /// The first live job of each class `tenant` has here, in class order,
    /// into `out`; dead entries met on the way are dropped. One load of the
    /// tenant's slot, then a walk along its few entries (or, for a tenant
    /// with many, a descent into its own map and a walk that passes over the
    /// rest of a class once it gave its first live job, descending again
    /// after a few).
    pub(crate) fn fronts(
        &mut self,
        counts: &mut QueueCounts,
        tenant: TenantIdx,
        live: impl Fn(JobIdx, Era) -> bool,
        out: impl FnMut(ClassIdx, JobKey, JobIdx),
    ) {
        let Some(slot) = self.slots.get_mut(tenant as usize) else { return };
        let (classes, dropped) = (&mut self.classes, &mut 0u32);
        slot.entries.fronts(live, out, |class| {
            classes[class as usize] -= 1;
            *dropped += 1;
        });
        if *dropped > 0 {
            slot.settle();
        }
        counts.entries -= *dropped;
        counts.stale -= *dropped;
    }

    /// Every entry with its tenant, in tenant, class and job order.
    fn all(&self) -> impl Iterator<Item = (TenantIdx, Entry)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.mask != 0)
            .flat_map(|(t, slot)| slot.entries.iter().map(move |e| (t as TenantIdx, e)))
    }

    /// Every live job here, in tenant, class and job order.
    pub(crate) fn jobs(&self, live: impl Fn(JobIdx, Era) -> bool) -> impl Iterator<Item = JobIdx> {
        self.all().filter(move |(_, e)| live(e.job, e.era)).map(|(_, e)| e.job)
    }

    /// Empties the queue, returning its live jobs with their tenants.
    pub(crate) fn take_all(
        &mut self,
        counts: &mut QueueCounts,
        live: impl Fn(JobIdx, Era) -> bool,
    ) -> Vec<(TenantIdx, JobIdx)> {
        *counts = QueueCounts::default();
        let all = self.all().filter(|(_, e)| live(e.job, e.era)).map(|(t, e)| (t, e.job)).collect();
        *self = Queue::default();
        all
    }

    /// Whether the counts of entries, in all and per class, match the
    /// entries, each tenant's mask matches its entries, no tenant keeps
    /// empty entries or their memory, and each tenant's few entries are a
    /// sorted vector of at most [`FEW`] (for the invariant checks).
    pub(crate) fn classes_agree(&self, queue_counts: &QueueCounts) -> bool {
        let mut counts = vec![0u32; self.classes.len()];
        let mut total = 0;
        for slot in &self.slots {
            let entries = &slot.entries;
            if entries.is_empty() {
                // Equal to the default, and no memory kept (a vector's
                // equality ignores its capacity).
                if slot.mask != 0 || !matches!(entries, Entries::Few(v) if v.capacity() == 0) {
                    return false;
                }
                continue;
            }
            let expected = entries.iter().fold(0, |m, e| m | class_bit(e.class));
            if slot.mask != expected {
                return false;
            }
            if let Entries::Few(v) = entries
                && (v.len() > FEW || !v.windows(2).all(|p| (p[0].class, p[0].key) < (p[1].class, p[1].key)))
            {
                return false;
            }
            for e in entries.iter() {
                match counts.get_mut(e.class as usize) {
                    Some(n) => *n += 1,
                    None => return false,
                }
                total += 1;
            }
        }
        counts == self.classes && total == queue_counts.entries()
    }
}

/// The jobs of one (tenant, class) in the global queue, dead entries
/// included (never first), each with its slot's era.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Group {
    /// The first entry of `jobs`, always live, at hand for a draw: reading
    /// the group's front leaves `jobs` untouched.
    first: (JobKey, JobIdx, Era),
    jobs: BTreeMap<JobKey, (JobIdx, Era)>,
    /// Dead entries among `jobs`.
    dead: u32,
}

impl Group {
    /// Brings `first` up to date with `jobs` (which is not empty).
    fn refirst(&mut self) {
        let (&key, &(j, era)) = self.jobs.first_key_value().expect("a group has jobs");
        self.first = (key, j, era);
    }
}

/// Dead entries a group of the global queue tolerates before it is swept,
/// whatever its size.
const GROUP_SWEEP_AFTER: u32 = 8;

/// The global queue: jobs any worker may take. Its jobs leave it lazily
/// but for each group's first (see the module doc, which also gives its
/// layout).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct GlobalQueue {
    groups: BTreeMap<(TenantIdx, ClassIdx), Group>,
    /// Entries in all groups, dead ones included.
    entries: usize,
    /// Dead entries in all groups.
    stale: usize,
    /// Entries (dead ones included) per class: a draw skips the walk when
    /// no class it could take has any.
    classes: Vec<u32>,
    /// Per tenant, the class mask of its groups (see [`class_bit`]; dead
    /// entries included).
    masks: Vec<u64>,
}

impl GlobalQueue {
    /// Files `job`, of era `era`. A dead entry the job left comes back to
    /// life.
    pub(crate) fn insert(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey, job: JobIdx, era: Era) {
        match self.groups.entry((tenant, class)) {
            btree_map::Entry::Vacant(e) => {
                e.insert(Group {
                    first: (key, job, era),
                    jobs: BTreeMap::from([(key, (job, era))]),
                    dead: 0,
                });
                let t = tenant as usize;
                if self.masks.len() <= t {
                    self.masks.resize(t + 1, 0);
                }
                self.masks[t] |= class_bit(class);
            }
            btree_map::Entry::Occupied(mut e) => {
                let group = e.get_mut();
                let old = group.jobs.insert(key, (job, era));
                if key <= group.first.0 {
                    group.first = (key, job, era);
                }
                match old {
                    // Already there, alive.
                    Some((_, old)) if old == era => return,
                    // Its dead entry (a key is one job's), alive again.
                    Some(_) => {
                        group.dead -= 1;
                        self.stale -= 1;
                        return;
                    }
                    None => {}
                }
            }
        }
        self.entries += 1;
        let c = class as usize;
        if self.classes.len() <= c {
            self.classes.resize(c + 1, 0);
        }
        self.classes[c] += 1;
    }

    /// Job `key` of group (`tenant`, `class`) left the queues: its entry
    /// is dead (its era moved on). The group's first job leaves at once,
    /// with the dead entries right behind it, so that a group's first entry
    /// is always live and a draw reads it without a liveness test. Any
    /// other entry stays, dead, and only two counts move (the group's map
    /// stays cold) until the group's dead entries pass half its live ones
    /// and it is swept.
    pub(crate) fn left(
        &mut self,
        class: ClassIdx,
        tenant: TenantIdx,
        key: JobKey,
        live: impl Fn(JobIdx, Era) -> bool,
    ) {
        self.take_out(class, tenant, key, live, false);
    }

    /// Takes a queued job's entry out at once (the job stays queued
    /// elsewhere, with the same era); true if it was there.
    pub(crate) fn remove(
        &mut self,
        class: ClassIdx,
        tenant: TenantIdx,
        key: JobKey,
        live: impl Fn(JobIdx, Era) -> bool,
    ) -> bool {
        self.take_out(class, tenant, key, live, true)
    }

    /// [`Self::left`] (`at_once` false: the entry is dead) or
    /// [`Self::remove`] (`at_once`: the entry goes now, dead or not).
    fn take_out(
        &mut self,
        class: ClassIdx,
        tenant: TenantIdx,
        key: JobKey,
        live: impl Fn(JobIdx, Era) -> bool,
        at_once: bool,
    ) -> bool {
        let Some(group) = self.groups.get_mut(&(tenant, class)) else { return false };
        let mut removed = 0;
        let first = group.first.0 == key;
        if first {
            // The first entry is the map's first: no search for it.
            let popped = group.jobs.pop_first();
            debug_assert!(popped.is_some_and(|(k, _)| k == key), "a group's first entry is its map's first");
        } else if at_once && group.jobs.remove(&key).is_none() {
            return false;
        }
        if first || at_once {
            removed += 1;
            while let Some(first) = group.jobs.first_entry() {
                let &(j, era) = first.get();
                if live(j, era) {
                    break;
                }
                first.remove();
                group.dead -= 1;
                self.stale -= 1;
                removed += 1;
            }
        } else {
            group.dead += 1;
            self.stale += 1;
        }
        let len = group.jobs.len() as u32;
        if group.dead >= GROUP_SWEEP_AFTER.min(len) && group.dead * 3 > len {
            group.jobs.retain(|_, &mut (j, era)| live(j, era));
            self.stale -= group.dead as usize;
            removed += group.dead as usize;
            group.dead = 0;
        }
        if !group.jobs.is_empty() {
            group.refirst();
        }
        self.dropped(class, tenant, removed);
        true
    }

    /// Counts `n` entries of group (`tenant`, `class`) out, and the group
    /// with them if it has none left.
    fn dropped(&mut self, class: ClassIdx, tenant: TenantIdx, n: usize) {
        self.entries -= n;
        self.classes[class as usize] -= n as u32;
        if self.groups.get(&(tenant, class)).is_some_and(|g| g.jobs.is_empty()) {
            self.groups.remove(&(tenant, class));
            let shared = class >= SHARED_BIT
                && self.groups.range((tenant, SHARED_BIT)..=(tenant, ClassIdx::MAX)).next().is_some();
            if !shared {
                self.masks[tenant as usize] &= !class_bit(class);
            }
        }
    }

    /// Live jobs queued here.
    pub(crate) fn len(&self) -> usize {
        self.entries - self.stale
    }

    /// Entries, dead ones included (for the invariant checks).
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// Whether any entry (live or dead) is of this class.
    pub(crate) fn has_class(&self, class: ClassIdx) -> bool {
        self.classes.get(class as usize).is_some_and(|&n| n > 0)
    }

    /// The class mask of `tenant`'s entries here (see [`class_bit`]; dead
    /// ones included).
    pub(crate) fn class_mask(&self, tenant: TenantIdx) -> u64 {
        self.masks.get(tenant as usize).copied().unwrap_or(0)
    }

    /// The first job of each class `tenant` has here, in class order: one
    /// descent into the small map of groups (a group's first entry is
    /// always live).
    pub(crate) fn fronts(&self, tenant: TenantIdx) -> impl Iterator<Item = (ClassIdx, JobKey, JobIdx)> {
        let groups = self.groups.range((tenant, 0)..=(tenant, ClassIdx::MAX));
        groups.map(|(&(_, class), group)| (class, group.first.0, group.first.1))
    }

    /// Every live job here, in tenant, class and job order.
    pub(crate) fn jobs(&self, live: impl Fn(JobIdx, Era) -> bool) -> impl Iterator<Item = JobIdx> {
        self.groups
            .values()
            .flat_map(|group| group.jobs.values().copied())
            .filter(move |&(j, era)| live(j, era))
            .map(|(j, _)| j)
    }

    /// Whether the counts (all entries, dead ones, entries per class), the
    /// masks, each group's first entry (which is live) and its count of dead
    /// entries match the entries, the dead stay within their bound, and no
    /// group is empty (for the invariant checks).
    pub(crate) fn agrees(&self, live: impl Fn(JobIdx, Era) -> bool) -> bool {
        let mut counts = vec![0u32; self.classes.len()];
        let mut masks = vec![0u64; self.masks.len()];
        for &(t, class) in self.groups.keys() {
            match masks.get_mut(t as usize) {
                Some(m) => *m |= class_bit(class),
                None => return false,
            }
        }
        if masks != self.masks {
            return false;
        }
        let mut stale = 0;
        for (&(_, class), group) in &self.groups {
            let Some(n) = counts.get_mut(class as usize) else { return false };
            let len = group.jobs.len() as u32;
            *n += len;
            let dead = group.jobs.values().filter(|&&(j, era)| !live(j, era)).count() as u32;
            if len == 0 || dead != group.dead || !(dead < GROUP_SWEEP_AFTER.min(len) || dead * 3 <= len) {
                return false;
            }
            let first = group.jobs.first_key_value().map(|(&key, &(j, era))| (key, j, era));
            if first != Some(group.first) || !live(group.first.1, group.first.2) {
                return false;
            }
            stale += dead as usize;
        }
        counts == self.classes
            && stale == self.stale
            && self.groups.values().map(|g| g.jobs.len()).sum::<usize>() == self.entries
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_slot_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 32, "mask and the list's header, side by side");
    }

    /// A local queue with its counts, as the scheduler keeps them apart.
    #[derive(Debug, Default, PartialEq)]
    struct Q {
        q: Queue,
        c: QueueCounts,
    }

    impl Q {
        fn insert(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey, job: JobIdx, era: Era) {
            self.q.insert(&mut self.c, class, tenant, key, job, era);
        }
        fn remove(&mut self, class: ClassIdx, tenant: TenantIdx, key: JobKey) -> bool {
            self.q.remove(&mut self.c, class, tenant, key)
        }
        fn left(&mut self) -> bool {
            self.c.left()
        }
        fn compact(&mut self, live: impl Fn(JobIdx, Era) -> bool) {
            self.q.compact(&mut self.c, live);
        }
        fn len(&self) -> usize {
            self.c.len()
        }
        fn entries(&self) -> usize {
            self.c.entries()
        }
        fn take_all(&mut self, live: impl Fn(JobIdx, Era) -> bool) -> Vec<(TenantIdx, JobIdx)> {
            self.q.take_all(&mut self.c, live)
        }
        fn jobs(&self, live: impl Fn(JobIdx, Era) -> bool) -> impl Iterator<Item = JobIdx> {
            self.q.jobs(live)
        }
        fn classes_agree(&self) -> bool {
            self.q.classes_agree(&self.c)
        }
        fn class_mask(&self, tenant: TenantIdx) -> u64 {
            self.q.class_mask(tenant)
        }
    }

    fn key(priority: i32, seq: u64) -> JobKey {
        JobKey { order: [(i64::from(i32::MAX) - i64::from(priority)) as u64, 0], seq }
    }

    /// Liveness as the scheduler sees it, for a test: the jobs in `dead`
    /// have left the queues.
    fn live(dead: &BTreeSet<JobIdx>) -> impl Fn(JobIdx, Era) -> bool + '_ {
        move |j, _| !dead.contains(&j)
    }

    fn fronts(q: &mut Q, tenant: TenantIdx, dead: &BTreeSet<JobIdx>) -> Vec<(ClassIdx, JobIdx)> {
        let mut out = Vec::new();
        q.q.fronts(&mut q.c, tenant, live(dead), |c, _, j| out.push((c, j)));
        out
    }

    #[test]
    fn fronts_give_each_class_its_first_job() {
        let none = BTreeSet::new();
        let mut q = Q::default();
        q.insert(2, 1, key(0, 1), 10, 0);
        q.insert(0, 1, key(0, 2), 20, 0);
        q.insert(0, 1, key(5, 3), 30, 0);
        q.insert(0, 2, key(0, 4), 40, 0);
        assert_eq!(q.len(), 4);
        assert_eq!(fronts(&mut q, 1, &none), vec![(0, 30), (2, 10)]);
        assert_eq!(fronts(&mut q, 3, &none), vec![]);
        assert!(q.remove(2, 1, key(0, 1)));
        assert!(!q.remove(2, 1, key(0, 1)), "already gone");
        assert_eq!(fronts(&mut q, 1, &none), vec![(0, 30)]);
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn the_global_queue_gives_the_same_fronts() {
        let none = BTreeSet::new();
        let (mut local, mut global) = (Q::default(), GlobalQueue::default());
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
        let global_fronts = |q: &mut GlobalQueue, t| q.fronts(t).map(|(c, _, j)| (c, j)).collect::<Vec<_>>();
        for (add, class, tenant, k, j) in ops {
            if add {
                local.insert(class, tenant, k, j, 0);
                global.insert(class, tenant, k, j, 0);
            } else {
                assert!(local.remove(class, tenant, k) && global.remove(class, tenant, k, live(&none)));
                assert!(!global.remove(class, tenant, k, live(&none)), "already gone");
            }
            assert!(global.agrees(live(&none)), "after {add} {class} {tenant} {j}");
            assert_eq!(global.len(), local.len());
            assert_eq!(
                global.jobs(live(&none)).collect::<Vec<_>>(),
                local.jobs(live(&none)).collect::<Vec<_>>()
            );
            for t in [1, 2, 3] {
                assert_eq!(fronts(&mut local, t, &none), global_fronts(&mut global, t));
            }
        }
        assert_eq!(global_fronts(&mut global, 2), vec![(0, 40)]);
        assert_eq!(global_fronts(&mut global, 1), vec![]);
        assert!(!global.has_class(2) && global.has_class(0));
    }

    #[test]
    fn few_or_many_entries_give_the_same_fronts() {
        // A tenant with few entries keeps them in a vector, one with more
        // than `FEW` in a map (and a class with many is passed over with a
        // new descent): the fronts and the dead entries dropped are the same.
        for n in [20, FEW as u64 + 10] {
            let mut q = Q::default();
            for seq in 0..n {
                q.insert(0, 1, key(0, seq), seq as JobIdx, 0);
            }
            q.insert(1, 1, key(0, 100), 100, 0);
            q.insert(3, 1, key(0, 101), 101, 0);
            q.insert(3, 1, key(0, 102), 102, 0);
            q.insert(0, 2, key(0, 103), 103, 0);
            let many = matches!(q.q.slots[1].entries, Entries::Many(_));
            assert_eq!(many, n > FEW as u64, "{n} entries");
            let dead = BTreeSet::from([0, 1, 101]);
            assert!(!q.left() && !q.left() && !q.left());
            assert_eq!(fronts(&mut q, 1, &dead), vec![(0, 2), (1, 100), (3, 102)]);
            assert_eq!(q.entries() as u64, n + 1, "the dead entries at the fronts went, the rest stay");
            assert!(q.classes_agree() && q.len() == q.entries());
            for seq in 2..n {
                assert!(q.remove(0, 1, key(0, seq)));
            }
            assert!(q.remove(1, 1, key(0, 100)) && q.remove(3, 1, key(0, 102)));
            assert_eq!(q.q.slots[1], Slot::default(), "a tenant without entries keeps none");
            assert!(
                matches!(&q.q.slots[1].entries, Entries::Few(v) if v.capacity() == 0),
                "nor their memory"
            );
            assert_eq!(fronts(&mut q, 2, &dead), vec![(0, 103)]);
        }
    }

    #[test]
    fn a_tenant_whose_entries_all_die_keeps_no_slot_contents() {
        let none = BTreeSet::new();
        for by_sweep in [false, true] {
            let mut q = Q::default();
            for seq in 0..3 {
                q.insert(seq as ClassIdx, 4, key(0, seq), seq as JobIdx, 0);
            }
            q.insert(0, 5, key(0, 9), 9, 0);
            let dead = BTreeSet::from([0, 1, 2]);
            for _ in 0..3 {
                q.left();
            }
            if by_sweep {
                q.compact(live(&dead));
            } else {
                assert_eq!(fronts(&mut q, 4, &dead), vec![], "every front is dead");
            }
            assert_eq!(q.q.slots[4], Slot::default(), "mask and entries gone (sweep: {by_sweep})");
            assert!(
                matches!(&q.q.slots[4].entries, Entries::Few(v) if v.capacity() == 0),
                "and their memory"
            );
            assert_ne!(q.q.slots[5], Slot::default(), "the other tenant keeps its entry");
            assert_eq!(fronts(&mut q, 5, &none), vec![(0, 9)]);
            assert!(q.classes_agree());
        }
    }

    #[test]
    fn class_masks_follow_the_entries() {
        let mut dead = BTreeSet::new();
        let (mut q, mut g) = (Q::default(), GlobalQueue::default());
        q.insert(2, 1, key(0, 1), 10, 0);
        q.insert(70, 1, key(0, 2), 20, 0);
        q.insert(64, 1, key(0, 3), 30, 0);
        g.insert(2, 1, key(0, 1), 10, 0);
        g.insert(70, 1, key(0, 2), 20, 0);
        g.insert(64, 1, key(0, 3), 30, 0);
        let both = class_bit(2) | class_bit(SHARED_BIT);
        assert_eq!((q.class_mask(1), g.class_mask(1), q.class_mask(9)), (both, both, 0));
        // One of the two classes past the 63rd goes: the shared bit stays.
        assert!(q.remove(70, 1, key(0, 2)) && g.remove(70, 1, key(0, 2), live(&dead)));
        assert_eq!((q.class_mask(1), g.class_mask(1)), (both, both));
        assert!(g.remove(64, 1, key(0, 3), live(&dead)));
        assert_eq!(g.class_mask(1), class_bit(2));
        // A dead entry counts until it is dropped, at a front or in a sweep.
        dead.insert(30);
        assert!(!q.left());
        assert_eq!(q.class_mask(1), both);
        assert_eq!(fronts(&mut q, 1, &dead), vec![(2, 10)]);
        assert_eq!(q.class_mask(1), class_bit(2));
        assert!(q.classes_agree() && g.agrees(live(&dead)));
    }

    #[test]
    fn priority_then_arrival_within_a_tenant_and_empty_tenants_leave() {
        let none = BTreeSet::new();
        let mut q = Q::default();
        q.insert(0, 1, key(0, 1), 1, 0);
        q.insert(0, 1, key(5, 2), 2, 0);
        q.insert(0, 1, key(5, 3), 3, 0);
        assert_eq!(q.jobs(live(&none)).collect::<Vec<_>>(), vec![2, 3, 1]);
        for k in [key(0, 1), key(5, 2), key(5, 3)] {
            assert!(q.remove(0, 1, k));
        }
        assert_eq!(q.len(), 0);
        q.insert(0, 4, key(0, 9), 9, 0);
        assert_eq!(q.take_all(live(&none)), vec![(4, 9)]);
        assert_eq!(q, Q::default());
    }

    #[test]
    fn dead_entries_are_invisible_and_dropped_where_met() {
        let mut q = Q::default();
        q.insert(0, 1, key(9, 1), 1, 0);
        q.insert(0, 1, key(0, 2), 2, 0);
        q.insert(1, 1, key(0, 3), 3, 0);
        let dead = BTreeSet::from([1, 3]);
        assert!(!q.left() && !q.left(), "two dead entries are no reason to sweep");
        assert_eq!(q.len(), 1);
        assert_eq!(q.jobs(live(&dead)).collect::<Vec<_>>(), vec![2]);
        assert_eq!(q.entries(), 3, "counting drops nothing");
        assert_eq!(
            fronts(&mut q, 1, &dead),
            vec![(0, 2)],
            "job 1 stood before job 2; class 1 had only job 3"
        );
        assert_eq!((q.entries(), q.len()), (1, 1), "both dead entries met at the fronts were dropped");
        // A job that comes back to a queue it left revives its entry.
        q.insert(0, 1, key(0, 4), 4, 0);
        assert!(!q.left());
        q.insert(0, 1, key(0, 4), 4, 1);
        assert_eq!((q.entries(), q.len()), (2, 2));
        assert_eq!(q.take_all(live(&dead)), vec![(1, 2), (1, 4)]);
    }

    #[test]
    fn a_queue_is_swept_once_dead_entries_pass_half_the_live_ones() {
        let mut q = Q::default();
        for j in 0..300 {
            q.insert(0, 1, key(0, u64::from(j)), j, 0);
        }
        let mut dead = BTreeSet::new();
        let mut sweeps = 0;
        for j in 0..200 {
            dead.insert(j);
            if q.left() {
                q.compact(live(&dead));
                sweeps += 1;
                assert_eq!(q.entries(), q.len(), "a sweep leaves no dead entry");
            }
            assert!(
                q.entries() - q.len() <= (q.len() / 2).max(SWEEP_AFTER as usize),
                "dead entries stay bounded"
            );
        }
        assert!(sweeps >= 2, "swept {sweeps} times");
        assert_eq!(q.len(), 100);
        assert_eq!(q.jobs(live(&dead)).count(), 100);
    }

    #[test]
    fn the_global_queue_leaves_lazily_but_keeps_each_first_job_live() {
        let mut g = GlobalQueue::default();
        for j in 0..30 {
            g.insert(0, 1, key(0, u64::from(j)), j, 0);
        }
        g.insert(1, 1, key(0, 100), 100, 0);
        let mut dead = BTreeSet::new();
        let fronts = |g: &GlobalQueue| g.fronts(1).map(|(c, _, j)| (c, j)).collect::<Vec<_>>();
        // Jobs leave from the middle of the group: they stay, dead.
        for j in [2, 3, 5] {
            dead.insert(j);
            g.left(0, 1, key(0, u64::from(j)), live(&dead));
        }
        assert_eq!((g.entries(), g.len()), (31, 28));
        assert!(g.agrees(live(&dead)));
        assert!(!g.jobs(live(&dead)).any(|j| dead.contains(&j)), "dead entries are invisible");
        // The first job leaves at once, and the second: the dead entries
        // right behind them go too, so the group's front is live.
        dead.insert(0);
        g.left(0, 1, key(0, 0), live(&dead));
        assert_eq!(fronts(&g), vec![(0, 1), (1, 100)]);
        dead.insert(1);
        g.left(0, 1, key(0, 1), live(&dead));
        assert_eq!(fronts(&g), vec![(0, 4), (1, 100)]);
        assert_eq!((g.entries(), g.len()), (27, 26));
        assert!(g.agrees(live(&dead)));
        // A job that comes back revives its dead entry.
        g.insert(0, 1, key(0, 5), 5, 1);
        dead.remove(&5);
        assert_eq!((g.entries(), g.len()), (27, 27));
        assert!(g.agrees(live(&dead)));
        // Once the dead pass half the live ones, the group is swept.
        let mut swept = false;
        for j in 10..22 {
            dead.insert(j);
            let before = g.entries();
            g.left(0, 1, key(0, u64::from(j)), live(&dead));
            swept |= g.entries() < before;
            assert!(g.agrees(live(&dead)), "after {j} left");
        }
        assert!(swept);
        // A job taken out at once (it stays queued elsewhere) that was its
        // group's first takes the dead entries behind it along.
        let front = fronts(&g)[0].1;
        assert!(!dead.contains(&(front + 1)));
        dead.insert(front + 1);
        g.left(0, 1, key(0, u64::from(front + 1)), live(&dead));
        assert!(g.remove(0, 1, key(0, u64::from(front)), live(&dead)));
        assert!(!g.remove(0, 1, key(0, u64::from(front)), live(&dead)), "already gone");
        assert!(g.agrees(live(&dead)), "the new front is live");
        // A group whose last job leaves goes, with its mask bit.
        dead.insert(100);
        g.left(1, 1, key(0, 100), live(&dead));
        assert_eq!(g.class_mask(1), class_bit(0));
        assert!(!g.has_class(1));
        assert!(g.agrees(live(&dead)));
        assert_eq!(g.jobs(live(&dead)).count(), g.len());
    }
}
