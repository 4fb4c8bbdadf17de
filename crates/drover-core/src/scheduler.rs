//! The scheduler: the whole cluster state and every rule that changes it.
//!
//! Each call to [`Scheduler::handle`] first fires the timers that are due at
//! `now`, then applies the event, then lets every worker with a free slot draw
//! work (`dispatch`). Decisions accumulate until the shell takes them with
//! [`Scheduler::take_decisions`].
//!
//! Where a job can go (locality, distbuild's rules) is expressed by the queues
//! it sits in; whose job goes next (fairness) by the tenant order inside every
//! queue; whether it fits (resources, labels, exclusive tokens) by the job's
//! class. ARCHITECTURE.md walks through how a draw combines the three.

mod invariants;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::held::HeldList;
use crate::idmap::{IdMap, IdSet, JobIndex};
use crate::order::Order;
use crate::policy::{Policy, QueueKey, TenantKey, VictimTier};
use crate::queue::{
    ClassIdx, Era, GlobalQueue, JobIdx, JobKey, Queue, QueueCounts, SHARED_BIT, TenantIdx, class_bit,
};
use crate::quota::{Amounts, QueueIdx, Queues};
use crate::readers::Readers;
use crate::resources::{ClassKey, TokenIdx, WorkerResources};
use crate::rng::SplitMix64;
use crate::small::SmallList;
use crate::types::{
    CancelStage, Capacity, Completion, Config, Decision, Event, Evict, FailReason, JobId, JobResult, JobSpec,
    Millis, Rejected, RunId, Timer, TimerKind, WaiterId, WorkerId,
};

/// Index of a worker in `Scheduler::workers`: stable while the worker lives.
/// A lost worker's index may go to a new worker (see `worker_joined`); one
/// that comes back gets its old index if it is still free.
type WorkerIdx = u32;

/// The workers holding one artifact, in index order.
type Holders = SmallList<WorkerIdx, 3>;

/// Where a queued job is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Place {
    /// A worker's first local queue: it holds the job's result.
    First(WorkerIdx),
    /// A worker's second local queue: it holds one of the job's dependencies.
    Second(WorkerIdx),
    /// The global queue: any worker may take it.
    Global,
}

/// The locality stage of a queued job (distbuild's life of a pending job).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Stage {
    /// Waiting CacheTimeout for the holders of its result.
    Cache,
    /// Waiting DepsTimeout for the holders of its dependencies.
    Deps,
    /// In the global queue.
    Global,
    /// A gang member: in no queue; placed together with its gang.
    Gang,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum JobState {
    Queued(Stage),
    /// No live worker could ever run it; waiting for one to register.
    Unplaceable,
    Assigned(RunId),
    Running(RunId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum TimerSlot {
    Cache(JobIdx),
    Deps(JobIdx),
    Unplaceable(JobIdx),
    Lease(WorkerIdx),
    /// See [`Scheduler::eviction_timer`].
    Eviction,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Job {
    id: JobId,
    tenant: TenantIdx,
    class: ClassIdx,
    key: JobKey,
    priority: i32,
    deps: Box<[JobId]>,
    waiters: Vec<WaiterId>,
    attempts: u32,
    max_attempts: u32,
    state: JobState,
    places: Vec<Place>,
    timer: Option<(Millis, TimerSlot)>,
    /// Registered in `dependents` under each dependency.
    indexed: bool,
    /// Counted in its queue's pending request and its tenant's priorities.
    counted: bool,
    /// The gang it belongs to.
    gang: Option<GangIdx>,
    /// The worker holding a reservation for this job.
    reserved_on: Option<WorkerIdx>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Run {
    worker: WorkerIdx,
    tenant: TenantIdx,
    class: ClassIdx,
    job_id: JobId,
    /// `None` once the job was cancelled: the run is being dropped or stopped
    /// and only holds its resources until the worker reports its exit.
    job: Option<JobIdx>,
    started: bool,
    /// Suspended by an eviction for this job ([`Evict::Suspend`]): it
    /// holds its memory and tokens on the worker but not its slots and CPU.
    suspended: Option<JobId>,
    /// When it was assigned (for [`Config::eviction_exempt`]).
    #[serde(default)]
    at: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Worker {
    id: WorkerId,
    name: String,
    alive: bool,
    res: WorkerResources,
    /// `capable[class]`: could this worker ever run the class?
    capable: Vec<bool>,
    lease: Millis,
    first: Queue,
    second: Queue,
    /// With queues: per tenant, the classes of its entries in `first` and
    /// `second`, or more (bits come with entries and are trimmed to the two
    /// queues' masks when a draw reads the tenant's fronts here), so a
    /// draw's check of a tenant costs one cold load here, not one per
    /// queue. (Without queues a draw checks tenants only once one gave
    /// nothing, rarely: the upkeep would cost more than it saves.)
    local_masks: Vec<u64>,
    /// The artifacts it holds, for walks over its cache (see `held.rs`;
    /// whether it holds one is `Scheduler::holds`).
    held: HeldList,
    /// Its runs in flight, in ID order (a new run has the highest ID yet, so
    /// it goes last).
    runs: Vec<RunId>,
    /// A job this worker is draining resources for.
    reserved: Option<JobIdx>,
    /// Shutting down once its runs end ([`Event::WorkerDraining`]): never
    /// hungry, so nothing new is assigned to it; cleared when it registers.
    draining: bool,
}

/// A worker lost lately (see `Scheduler::lost`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Lost {
    name: String,
    /// Its capacity and labels (nothing in use).
    res: WorkerResources,
    at: Millis,
    /// It left ([`Event::WorkerLeft`]: stopped, drained) rather than
    /// missing its lease.
    #[serde(default)]
    left: bool,
}

/// How a worker went away.
#[derive(Clone, Copy, Debug)]
enum Gone {
    /// It missed its lease.
    Lease,
    /// It left ([`Event::WorkerLeft`]).
    Left,
    /// Its address refused connections ([`Event::WorkerUnreachable`]).
    Unreachable,
}

/// The most lost workers the core remembers at once (the oldest go first):
/// a bound on what a churn of short-lived workers can make it keep.
const MAX_LOST: usize = 1024;

/// Most workers a waiting reason names; the rest are counted.
const MAX_NAMED: usize = 5;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Tenant {
    name: String,
    /// Value of the serve clock when this tenant last had a job assigned
    /// (0: never).
    served: u64,
    /// The leaf queue of this tenant's jobs (a tenant whose jobs go to two
    /// queues is two tenants here, one per queue).
    queue: QueueIdx,
    /// Entries of this tenant's jobs in all queues; filed in its queue's
    /// order while not zero.
    placed: u32,
    /// Queued jobs by priority (for the tenant's top priority).
    priorities: BTreeMap<i32, u32>,
    /// Queued jobs by class: a draw passes over a tenant with none of a
    /// class the worker could take without looking into any queue.
    classes: Vec<u32>,
    /// The same at a glance, in the tenant's own cache line: bit `c` for
    /// each class `c < 63` with queued jobs, bit 63 if any later class has
    /// some (see [`class_bit`]).
    class_mask: u64,
    /// Held by this tenant's runs (for its dominant share).
    allocated: Amounts,
    /// The key it is filed under in `Scheduler::orders[queue]`.
    filed: Option<TenantKey>,
}

/// Counts one queued job of `class` in or out of `counts` (queued jobs by
/// class) and keeps `mask` (see [`class_bit`]) in step: a tenant's, or a
/// queue's.
fn count_class(counts: &mut Vec<u32>, mask: &mut u64, class: usize, add: bool) {
    if counts.len() <= class {
        counts.resize(class + 1, 0);
    }
    if add {
        counts[class] += 1;
        *mask |= class_bit(class as ClassIdx);
    } else {
        counts[class] -= 1;
        if counts[class] == 0 {
            let shared = SHARED_BIT as usize;
            *mask &= !class_bit(class as ClassIdx);
            if class >= shared && counts[shared..].iter().any(|&n| n > 0) {
                *mask |= class_bit(SHARED_BIT);
            }
        }
    }
}

/// Index of a gang in `Scheduler::gangs`.
type GangIdx = u32;

/// Jobs that start together: none runs before `min` of them can start at
/// the same moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Gang {
    id: String,
    min: u32,
    /// Once `min` members started together, the rest start as they fit.
    started: bool,
    /// Live member jobs.
    members: u32,
    /// Members waiting to be placed, in job order.
    queued: BTreeSet<(JobKey, JobIdx)>,
}

impl Gang {
    /// If a dispatch should try to place this gang: how many of its
    /// members must go at once (`min` before it started, then 1).
    fn waits(&self) -> Option<u32> {
        let ready = !self.queued.is_empty() && (self.started || self.queued.len() as u32 >= self.min);
        ready.then_some(if self.started { 1 } else { self.min })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Class {
    key: ClassKey,
    /// What a run of the class holds, for queue quotas and shares.
    amounts: Amounts,
    /// Live workers that could ever run this class.
    capable: u32,
}

/// One queue of the quota tree, as [`Scheduler::queue_views`] shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueView {
    /// Its name.
    pub name: String,
    /// Its parent queue, if any.
    pub parent: Option<String>,
    /// Relative entitlement among its siblings.
    pub weight: u64,
    /// Higher-priority queues are offered work first.
    pub priority: i32,
    /// May other queues reclaim what it holds above its share.
    pub reclaimable: bool,
    /// Hard maximum, if any.
    pub capability: Option<QueueAmounts>,
    /// Reserved minimum.
    pub guarantee: QueueAmounts,
    /// What it deserves now (proportion of the live workers' capacity).
    pub deserved: QueueAmounts,
    /// Held by its running jobs.
    pub allocated: QueueAmounts,
    /// Asked for by its queued jobs.
    pub pending: QueueAmounts,
    /// Its queued jobs (its subtree's, for a parent).
    pub queued_jobs: u64,
    /// Its runs holding resources.
    pub running: u64,
}

/// Amounts of a queue view. In a capability, a dimension without a limit
/// is `u64::MAX`, which JSON writes as `null` (a number that large is not
/// one a JSON reader can be trusted to keep).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueAmounts {
    /// Job slots, in thousandths.
    #[serde(serialize_with = "unlimited_as_null", deserialize_with = "null_as_unlimited")]
    pub slots_milli: u64,
    /// CPU in millicores.
    #[serde(serialize_with = "unlimited_as_null", deserialize_with = "null_as_unlimited")]
    pub cpu: u64,
    /// Memory in bytes.
    #[serde(serialize_with = "unlimited_as_null", deserialize_with = "null_as_unlimited")]
    pub memory: u64,
}

fn unlimited_as_null<S: serde::Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
    match *value {
        u64::MAX => s.serialize_none(),
        n => s.serialize_some(&n),
    }
}

fn null_as_unlimited<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(<Option<u64> as Deserialize>::deserialize(d)?.unwrap_or(u64::MAX))
}

/// A queue as named in views: where a queued job is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QueueName {
    /// The worker's first local queue (it holds the job's result).
    First(WorkerId),
    /// The worker's second local queue (it holds a dependency).
    Second(WorkerId),
    /// The global queue.
    Global,
}

/// Where a job stands, as seen from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Queued, visible in these queues.
    Queued {
        /// The queues it sits in.
        queues: Vec<QueueName>,
        /// A worker draining resources so it can start there.
        reserved_on: Option<WorkerId>,
    },
    /// No live worker could run it; waiting for one to register.
    WaitingForWorker(String),
    /// Sent to a worker that has not reported it started.
    Assigned {
        /// Where.
        worker: WorkerId,
        /// The run.
        run: RunId,
    },
    /// Running on a worker.
    Running {
        /// Where.
        worker: WorkerId,
        /// The run.
        run: RunId,
    },
}

/// A job's state as seen from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    /// Where it stands.
    pub status: JobStatus,
    /// Who waits for it.
    pub waiters: Vec<WaiterId>,
    /// Attempts started so far.
    pub attempts: u32,
}

/// The scheduling core. See the crate documentation.
///
/// It serializes whole (a snapshot of the coordinator's state), but for
/// its index of jobs by ID, which reading it back rebuilds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Scheduler {
    config: Config,
    /// `config.tiers`, resolved.
    policy: Policy,
    now: Millis,
    rng: SplitMix64,
    serve_clock: u64,
    next_seq: u64,
    next_run: u64,

    tenants: Vec<Tenant>,
    tenant_index: BTreeMap<(String, QueueIdx), TenantIdx>,
    tokens: Vec<String>,
    token_index: BTreeMap<String, TokenIdx>,
    classes: Vec<Class>,
    class_index: BTreeMap<ClassKey, ClassIdx>,

    workers: Vec<Worker>,
    /// The counts of each worker's two local queues (`first`, `second`),
    /// apart from the queues (see [`QueueCounts`]).
    queue_counts: Vec<[QueueCounts; 2]>,
    worker_index: BTreeMap<WorkerId, WorkerIdx>,

    jobs: Vec<Option<Job>>,
    /// Each job slot's queue era: a queue entry is live while it carries its
    /// slot's era (see `queue.rs`, "Leaving the local queues lazily"). Bumped
    /// when the slot's job leaves the queues and when the slot is freed, so
    /// an entry never outlives its job's stay in the queues or names the
    /// slot's next job. Kept apart from the jobs so that a sweep's liveness
    /// test reads eight bytes per entry, not a job.
    eras: Vec<Era>,
    free_jobs: Vec<JobIdx>,
    /// Rebuilt from `jobs` when a snapshot is read (see [`Scheduler::from_snapshot`]).
    #[serde(skip)]
    job_index: JobIndex,
    /// Hashed: nothing visits the runs in order (the invariant checks sort
    /// them).
    runs: IdMap<Run, RunId>,
    /// Runs suspended by an eviction that wait to be resumed, oldest run
    /// first (a cancelled one leaves: it is only being stopped).
    suspended: BTreeSet<RunId>,

    global: GlobalQueue,
    /// The queue tree with quotas and deserved shares.
    quotas: Queues,
    /// Capacity of the live workers.
    total: Amounts,
    /// `total` changed: every tenant's dominant share did too.
    total_changed: bool,
    /// Per leaf queue: its tenants with queued jobs, in the order a draw
    /// walks them (empty for parent queues).
    orders: Vec<Order<TenantKey>>,
    /// Leaf queues with a non-empty order, sorted by key (a vector: there
    /// are tens of them, and a recomputation of the deserved amounts moves
    /// most of them at once).
    queue_order: Vec<QueueKey>,
    /// Each leaf queue's key in `queue_order` while it has queued jobs.
    queue_filed: Vec<Option<QueueKey>>,
    /// Per queue: its tenants' queued jobs by class, summed, and the mask of
    /// those classes (as [`Tenant::class_mask`]): a draw passes over a
    /// queue with none of a class the worker could take without reading
    /// its order or its tenants.
    queue_classes: Vec<Vec<u32>>,
    queue_masks: Vec<u64>,
    /// Live gangs, oldest first.
    gangs: BTreeMap<GangIdx, Gang>,
    gang_index: BTreeMap<String, GangIdx>,
    /// The gangs a dispatch tries to place (see [`Gang::waits`]), by how
    /// many members a placement must place at once: a dispatch passes over
    /// every gang that needs more than the idle workers have room for,
    /// without a look at it.
    waiting_gangs: BTreeSet<(u32, GangIdx)>,
    next_gang: GangIdx,
    /// Artifact → live workers holding it, in index order (most artifacts
    /// have one to three holders: a sorted list, inline up to three).
    holders: IdMap<Holders>,
    /// Artifact → queued jobs in their dependency stage (or later) that read
    /// it; left lazily (see `readers.rs`).
    dependents: IdMap<Readers>,
    /// Jobs waiting for a capable worker.
    unplaceable: BTreeSet<JobIdx>,
    /// Workers lost (or gone) within `config.lost_worker_grace`, oldest
    /// first, at most one per name and [`MAX_LOST`] in all: what they could
    /// run keeps the jobs only they could run waiting for them.
    #[serde(default)]
    lost: Vec<Lost>,

    /// Armed timers, soonest first. Clearing or moving a job's timer leaves
    /// its old entry behind, dead: an entry is live while its owner's current
    /// timer (a job's `timer`, a live worker's `lease`) is that entry. Dead
    /// entries are dropped when they reach the front, which every step leaves
    /// live, so a job leaving the queues costs no search here. (A lease's old
    /// entry goes at once: leases are renewed by every report.) A job sets
    /// at most three timers in its life, so the dead entries are at most a
    /// few times the jobs that entered a stage within the longest timeout.
    timers: BTreeSet<(Millis, TimerSlot)>,
    /// When the first of the runs spared from eviction for their youth
    /// ([`Config::eviction_exempt`]) that a starving job could have evicted
    /// stops being spared: the evictions are tried again then, even if
    /// nothing else happens.
    #[serde(default)]
    eviction_timer: Option<Millis>,
    /// Live workers with a free slot.
    hungry: BTreeSet<WorkerIdx>,
    /// The hungry workers whose last draw passed over a queue or a job for
    /// a capability (see [`Self::allocate`]).
    capped_out: BTreeSet<WorkerIdx>,
    /// Workers that should draw before this step ends.
    dirty: BTreeSet<WorkerIdx>,
    /// The global queue gained jobs: every hungry worker should draw.
    global_dirty: bool,
    /// With placement weights: dirty workers taken out of `dirty`, best
    /// score last (empty between steps).
    ranked: Vec<WorkerIdx>,
    /// A draw's working lists (empty between draws).
    #[serde(skip)]
    draw_buffers: DrawBuffers,

    decisions: Vec<Decision>,
}

impl Serialize for Scheduler {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Scheduler::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Scheduler {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut core = Scheduler::deserialize(deserializer)?;
        for (j, job) in core.jobs.iter().enumerate() {
            if let Some(job) = job {
                core.job_index.insert(&job.id, j as JobIdx);
            }
        }
        Ok(core)
    }
}

/// A tenant's best fitting job in one of a worker's queues.
type Offer = (Place, JobKey, JobIdx);

/// A tenant's first job of one class in one of a worker's queues.
type Front = (Place, ClassIdx, JobKey, JobIdx);

/// Volcano's two eviction actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// A starving job evicts jobs of its own queue.
    Preempt,
    /// A queue below its deserved share evicts jobs of other queues.
    Reclaim,
}

/// A running job that may be evicted.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    /// Eviction order (priority, or 0 without `priority`; newest first),
    /// with the run.
    order: (i32, Reverse<RunId>),
    priority: i32,
    class: ClassIdx,
    tenant: TenantIdx,
    queue: QueueIdx,
}

/// What victim functions know of the job they evict for.
#[derive(Clone, Copy, Debug)]
struct Preemptor {
    priority: i32,
    /// Its tenant's dominant share with the job, in millionths.
    share: u64,
}

/// A draw's working lists, kept between draws so that a draw allocates
/// nothing (empty between draws).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct DrawBuffers {
    /// Per class: could the worker take it (or reserve room for it) now?
    usable: Vec<bool>,
    /// The active leaf queues, in queue order.
    leaves: Vec<QueueKey>,
    /// The current tenant's first job of each class in each worker queue.
    fronts: Vec<Front>,
    /// The current tenant's best fitting job in each worker queue.
    fitting: Vec<Offer>,
    /// Tenants the first quota phase found nothing for this worker at all
    /// (every front of a class it cannot run, or too big and not
    /// reservable): the second phase, which only admits more, skips them
    /// instead of reading their fronts again.
    barren: Vec<TenantIdx>,
    /// The draw passed over a queue or a job for a capability.
    capped: bool,
}

impl DrawBuffers {
    fn clear(&mut self) {
        self.usable.clear();
        self.leaves.clear();
        self.fronts.clear();
        self.fitting.clear();
        self.barren.clear();
        self.capped = false;
    }
}

/// What a worker's draw came up with.
enum Pick {
    Run(JobIdx),
    Reserve(JobIdx),
}

impl Scheduler {
    /// An empty cluster.
    pub fn new(config: Config) -> Scheduler {
        let quotas = Queues::new(&config.queues, &config.tenant_queues);
        Scheduler {
            rng: SplitMix64::new(config.seed),
            policy: Policy::new(&config),
            orders: vec![Order::default(); quotas.nodes.len()],
            total: Amounts::default(),
            total_changed: false,
            gangs: BTreeMap::new(),
            gang_index: BTreeMap::new(),
            waiting_gangs: BTreeSet::new(),
            next_gang: 0,
            queue_order: Vec::new(),
            queue_filed: vec![None; quotas.nodes.len()],
            queue_classes: vec![Vec::new(); quotas.nodes.len()],
            queue_masks: vec![0; quotas.nodes.len()],
            quotas,
            config,
            now: Millis(0),
            serve_clock: 0,
            next_seq: 0,
            next_run: 1,
            tenants: Vec::new(),
            tenant_index: BTreeMap::new(),
            tokens: Vec::new(),
            token_index: BTreeMap::new(),
            classes: Vec::new(),
            class_index: BTreeMap::new(),
            workers: Vec::new(),
            queue_counts: Vec::new(),
            worker_index: BTreeMap::new(),
            jobs: Vec::new(),
            eras: Vec::new(),
            free_jobs: Vec::new(),
            job_index: JobIndex::default(),
            runs: IdMap::default(),
            suspended: BTreeSet::new(),
            global: GlobalQueue::default(),
            holders: IdMap::default(),
            dependents: IdMap::default(),
            unplaceable: BTreeSet::new(),
            lost: Vec::new(),
            timers: BTreeSet::new(),
            eviction_timer: None,
            hungry: BTreeSet::new(),
            capped_out: BTreeSet::new(),
            dirty: BTreeSet::new(),
            global_dirty: false,
            ranked: Vec::new(),
            draw_buffers: DrawBuffers::default(),
            decisions: Vec::new(),
        }
    }

    /// Rebuilds the state by replaying recorded `(now, event)` pairs. Refused
    /// events are refused again, exactly as they were.
    pub fn replay(config: Config, log: impl IntoIterator<Item = (Millis, Event)>) -> Scheduler {
        let mut s = Scheduler::new(config);
        for (now, event) in log {
            // A refusal during replay repeats the original refusal.
            let _refused = s.handle(now, event);
        }
        s.decisions.clear();
        s
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Takes new settings. Those that shape the queues and the order in
    /// them (`queues`, `tenant_queues`, `tiers`) change only while the
    /// core holds no job and no run ([`Rejected::Busy`] otherwise): it then
    /// starts afresh, keeping its clock, its counters (runs, job order,
    /// service), its random state and nothing else, so workers register
    /// again. The others take effect from now on (waits and leases already
    /// running keep their deadlines). The seed is not read again: the
    /// random sequence goes on.
    pub fn reconfigure(&mut self, config: Config) -> Result<(), Rejected> {
        let old = &self.config;
        if config.queues == old.queues
            && config.tenant_queues == old.tenant_queues
            && config.tiers == old.tiers
        {
            self.policy = Policy::new(&config);
            self.config = config;
            return Ok(());
        }
        let jobs = self.job_index.len() as u64;
        let runs = self.runs.len() as u64;
        if jobs > 0 || runs > 0 {
            let changed: Vec<&str> = [
                (config.queues != old.queues, "the queues (their names, weights, limits or parents)"),
                (config.tenant_queues != old.tenant_queues, "the tenants' queues"),
                (config.tiers != old.tiers, "the tiers"),
            ]
            .into_iter()
            .filter_map(|(differs, what)| differs.then_some(what))
            .collect();
            let changed = match changed.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
                _ => changed.join(""),
            };
            return Err(Rejected::Busy { changed, jobs, runs });
        }
        let mut fresh = Scheduler::new(config);
        fresh.now = self.now;
        fresh.rng = self.rng.clone();
        fresh.serve_clock = self.serve_clock;
        fresh.next_seq = self.next_seq;
        fresh.next_run = self.next_run;
        fresh.next_gang = self.next_gang;
        *self = fresh;
        Ok(())
    }

    /// The latest `now` seen.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Handles one event at time `now` (earlier times than already seen count
    /// as the latest). Due timers fire first, even when the event is refused,
    /// so the shell must record every event it hands in, refused or not.
    /// Timers the event itself makes due (a zero timeout) fire before this
    /// returns.
    pub fn handle(&mut self, now: Millis, event: Event) -> Result<(), Rejected> {
        if event == Event::Resumed {
            self.shift_deadlines(now);
        }
        self.advance(now);
        let result = self.apply(event);
        self.advance(now);
        self.dispatch();
        self.first_live_timer();
        result
    }

    /// The next time a timer is due, if any: call `handle(at, Event::Tick)`
    /// then.
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Takes the decisions made since the last call, in the order they were
    /// made.
    pub fn take_decisions(&mut self) -> Vec<Decision> {
        std::mem::take(&mut self.decisions)
    }

    /// Every pending timer, soonest first.
    pub fn timers(&self) -> Vec<Timer> {
        self.timers
            .iter()
            .filter(|&&(at, slot)| self.timer_live(at, slot))
            .map(|&(at, slot)| {
                let kind = match slot {
                    TimerSlot::Cache(j) => TimerKind::Cache(self.job(j).id),
                    TimerSlot::Deps(j) => TimerKind::Deps(self.job(j).id),
                    TimerSlot::Unplaceable(j) => TimerKind::Unplaceable(self.job(j).id),
                    TimerSlot::Lease(w) => TimerKind::Lease(self.workers[w as usize].id),
                    TimerSlot::Eviction => TimerKind::Eviction,
                };
                Timer { at, kind }
            })
            .collect()
    }

    /// A live worker holding the artifact, if any (the lowest-numbered one).
    pub fn locate_artifact(&self, artifact: &JobId) -> Option<WorkerId> {
        let &w = self.holders.get(artifact)?.iter().next()?;
        Some(self.workers[w as usize].id)
    }

    /// Every live worker holding the artifact, for fallback on failure.
    pub fn artifact_holders(&self, artifact: &JobId) -> Vec<WorkerId> {
        self.holders
            .get(artifact)
            .map(|ws| ws.iter().map(|&w| self.workers[w as usize].id).collect())
            .unwrap_or_default()
    }

    /// The gang a pending or running job belongs to: the gang's ID and how
    /// many of its member jobs are pending or running. `None` for a job
    /// that is not, or is in no gang.
    pub fn job_gang(&self, id: &JobId) -> Option<(&str, u32)> {
        let j = self.lookup(id)?;
        let gang = &self.gangs[&self.job(j).gang?];
        Some((gang.id.as_str(), gang.members))
    }

    /// Whether the job is pending or running (so `Join` can wait for it).
    pub fn has_job(&self, id: &JobId) -> bool {
        self.lookup(id).is_some()
    }

    /// A pending or running job's state.
    pub fn job_view(&self, id: &JobId) -> Option<JobView> {
        let j = self.lookup(id)?;
        let job = self.job(j);
        let wid = |w: WorkerIdx| self.workers[w as usize].id;
        let status = match job.state {
            JobState::Queued(_) => {
                let mut queues: Vec<QueueName> = job
                    .places
                    .iter()
                    .map(|p| match *p {
                        Place::First(w) => QueueName::First(wid(w)),
                        Place::Second(w) => QueueName::Second(wid(w)),
                        Place::Global => QueueName::Global,
                    })
                    .collect();
                queues.sort();
                JobStatus::Queued { queues, reserved_on: job.reserved_on.map(wid) }
            }
            JobState::Unplaceable => JobStatus::WaitingForWorker(self.waiting_for_worker(j)),
            JobState::Assigned(run) => JobStatus::Assigned { worker: wid(self.run(run).worker), run },
            JobState::Running(run) => JobStatus::Running { worker: wid(self.run(run).worker), run },
        };
        Some(JobView { status, waiters: job.waiters.clone(), attempts: job.attempts })
    }

    /// The job a running job's run was suspended for by an eviction, while
    /// it waits to be resumed ([`Evict::Suspend`]).
    pub fn evicted_by(&self, id: &JobId) -> Option<JobId> {
        let job = self.job(self.lookup(id)?);
        match job.state {
            JobState::Running(run) => self.runs.get(&run)?.suspended,
            _ => None,
        }
    }

    /// Why a queued job is not running yet, for people: its gang is
    /// incomplete, its queue is at its capability, it waits for the workers
    /// holding its inputs, no worker has room for it now, or it waits its
    /// turn. `None` for a job that is not queued.
    pub fn waiting_reason(&self, id: &JobId) -> Option<String> {
        let j = self.lookup(id)?;
        let job = self.job(j);
        let class = &self.classes[job.class as usize];
        let queue = self.tenants[job.tenant as usize].queue;
        let queue_name = &self.quotas.nodes[queue as usize].name;
        let stage = match job.state {
            JobState::Queued(stage) => stage,
            JobState::Unplaceable => return Some(self.waiting_for_worker(j)),
            JobState::Assigned(_) | JobState::Running(_) => return None,
        };
        if let Some(g) = job.gang {
            let gang = &self.gangs[&g];
            if !gang.started {
                // How many jobs like this one the live workers could hold
                // at once, were they idle: fewer than the gang needs means
                // it starts only once more workers join.
                let at_most: u64 = self
                    .workers
                    .iter()
                    .filter(|w| w.alive && w.capable.get(job.class as usize).copied().unwrap_or(false))
                    .map(|w| w.res.holds_at_most(&class.key))
                    .fold(0, u64::saturating_add);
                let never = if at_most < u64::from(gang.min) {
                    format!(
                        " (the live workers could hold at most {at_most} jobs like this one at once, even idle: it \
                         starts once more workers join)"
                    )
                } else {
                    String::new()
                };
                return Some(format!(
                    "its gang needs {} of its jobs to start at once; {} ready, waiting for room for them{never}",
                    gang.min,
                    gang.queued.len()
                ));
            }
        }
        if self.quotas.active() && !self.quotas.admits(queue, class.amounts, false) {
            return Some(format!("queue {queue_name} is at its capability"));
        }
        let holders = |ids: &mut dyn Iterator<Item = &JobId>| -> Vec<String> {
            let mut names: Vec<String> = ids
                .filter_map(|a| self.holders.get(a))
                .flatten()
                .map(|&w| self.workers[w as usize].name.clone())
                .collect();
            names.sort();
            names.dedup();
            names
        };
        match stage {
            Stage::Cache => {
                let on = holders(&mut std::iter::once(&job.id));
                return Some(format!("waiting briefly for {} (it holds the result)", on.join(", ")));
            }
            Stage::Deps => {
                let on = holders(&mut job.deps.iter());
                if !on.is_empty() {
                    return Some(format!(
                        "waiting briefly for the workers holding its inputs ({}) before any worker may take it",
                        on.join(", ")
                    ));
                }
            }
            Stage::Global | Stage::Gang => {}
        }
        if let Some(w) = job.reserved_on {
            return Some(format!("worker {} is making room for it", self.workers[w as usize].name));
        }
        let room = self.workers.iter().any(|w| {
            w.alive
                && !w.draining
                && w.capable.get(job.class as usize).copied().unwrap_or(false)
                && w.res.fits(&class.key, None)
        });
        // Only draining workers could run it: room there is no help.
        let undrained = self
            .workers
            .iter()
            .any(|w| w.alive && !w.draining && w.capable.get(job.class as usize).copied().unwrap_or(false));
        if !undrained {
            let mut draining: Vec<&str> = self
                .workers
                .iter()
                .filter(|w| w.alive && w.capable.get(job.class as usize).copied().unwrap_or(false))
                .map(|w| w.name.as_str())
                .collect();
            draining.sort_unstable();
            return Some(format!(
                "the only workers that could run it are draining ({}): it waits for one that is not",
                draining.join(", ")
            ));
        }
        if !room {
            let mut needs = vec![match class.key.slots {
                1 => "a slot".to_owned(),
                n => format!("{n} slots"),
            }];
            if class.key.cpu > 0 {
                needs.push(cpu(class.key.cpu));
            }
            if class.key.memory > 0 {
                needs.push(format!("{} of memory", bytes(class.key.memory)));
            }
            for &(t, n) in &class.key.tokens {
                let name = &self.tokens[t as usize];
                needs.push(match (class.key.exclusive.contains(&t), n) {
                    (true, _) => format!("token {name} to itself"),
                    (false, 1) => format!("1 {name} token"),
                    (false, n) => format!("{n} {name} tokens"),
                });
            }
            let needs = match needs.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
                _ => needs.join(""),
            };
            // The workers that could run it at all (labels, tokens and
            // size), all busy: so that an idle worker left out says why.
            let mut able: Vec<&str> = self
                .workers
                .iter()
                .filter(|w| {
                    w.alive && !w.draining && w.capable.get(job.class as usize).copied().unwrap_or(false)
                })
                .map(|w| w.name.as_str())
                .collect();
            able.sort_unstable();
            let more = able.len().saturating_sub(MAX_NAMED);
            able.truncate(MAX_NAMED);
            let able = match more {
                0 => able.join(", "),
                n => format!("{} and {n} more", able.join(", ")),
            };
            return Some(format!(
                "no worker has room for it now (it needs {needs}; the workers that can run it: {able})"
            ));
        }
        Some(format!("waiting for its turn in queue {queue_name}"))
    }

    /// The leaf queue a job naming `named` (or none) for `tenant` goes to,
    /// or why there is none.
    pub fn queue_for(&self, named: Option<&str>, tenant: &str) -> Result<String, String> {
        let q = self.quotas.resolve(named, tenant)?;
        Ok(self.quotas.nodes[q as usize].name.clone())
    }

    /// The leaf queue a job of `tenant` goes to when it names `named` (or
    /// none): the named one, else the tenant's, else the default; `None` if
    /// `named` is no leaf queue.
    pub fn queue_of(&self, named: Option<&str>, tenant: &str) -> Option<&str> {
        let q = self.quotas.resolve(named, tenant).ok()?;
        Some(&self.quotas.nodes[q as usize].name)
    }

    /// Every queue, in configuration order (the implicit `default` queue
    /// last), with its deserved share for the cluster as it is now.
    pub fn queue_views(&self) -> Vec<QueueView> {
        let mut quotas = self.quotas.clone();
        quotas.deserve(self.total);
        let amounts = |a: Amounts| QueueAmounts { slots_milli: a.0[0], cpu: a.0[1], memory: a.0[2] };
        let limit = |a: Amounts| (a != Amounts([u64::MAX; 3])).then(|| amounts(a));
        quotas
            .nodes
            .iter()
            .map(|n| QueueView {
                name: n.name.clone(),
                parent: n.parent.map(|p| quotas.nodes[p as usize].name.clone()),
                weight: n.weight,
                priority: n.priority,
                reclaimable: n.reclaimable,
                capability: limit(n.capability),
                guarantee: amounts(n.guarantee),
                deserved: amounts(n.deserved),
                allocated: amounts(n.allocated),
                pending: amounts(n.pending),
                queued_jobs: n.queued_jobs,
                running: n.running,
            })
            .collect()
    }

    /// Jobs pending or running (not counting cancelled runs still stopping).
    pub fn job_count(&self) -> usize {
        self.job_index.len()
    }

    /// Runs in flight on workers, including cancelled ones still stopping.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Workers the core holds: the live ones, and lost ones that no new
    /// worker has taken the place of yet.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Is the worker registered and not lost?
    pub fn worker_alive(&self, worker: WorkerId) -> bool {
        self.worker_index.get(&worker).is_some_and(|&w| self.workers[w as usize].alive)
    }

    /// Is the worker alive and draining ([`Event::WorkerDraining`])?
    pub fn worker_draining(&self, worker: WorkerId) -> bool {
        self.worker_index.get(&worker).is_some_and(|&w| {
            let worker = &self.workers[w as usize];
            worker.alive && worker.draining
        })
    }

    /// The runs in flight on a worker (including cancelled ones still
    /// stopping).
    pub fn worker_runs(&self, worker: WorkerId) -> Vec<RunId> {
        match self.worker_index.get(&worker) {
            Some(&w) => self.workers[w as usize].runs.to_vec(),
            None => Vec::new(),
        }
    }

    /// The job and worker of a run in flight (the job is `None` once it was
    /// cancelled and is only being stopped).
    pub fn run_info(&self, run: RunId) -> Option<(WorkerId, JobId, bool)> {
        let r = self.runs.get(&run)?;
        Some((self.workers[r.worker as usize].id, r.job_id, r.job.is_some()))
    }

    // ------------------------------------------------------------------
    // Time
    // ------------------------------------------------------------------

    fn advance(&mut self, now: Millis) {
        let target = self.now.max(now);
        while let Some((at, slot)) = self.first_live_timer() {
            if at > target {
                break;
            }
            // Each timer fires at its own instant, so what it starts (a new
            // timer, a lease) is timed as if the shell had woken up exactly.
            self.now = self.now.max(at);
            self.timers.remove(&(at, slot));
            match slot {
                TimerSlot::Cache(j) => {
                    self.job_mut(j).timer = None;
                    self.enter_deps_stage(j, at);
                }
                TimerSlot::Deps(j) => {
                    self.job_mut(j).timer = None;
                    self.enter_global(j);
                }
                TimerSlot::Unplaceable(j) => {
                    self.job_mut(j).timer = None;
                    let why = self.unplaceable_reason(self.job(j).class);
                    self.give_up(j, FailReason::Unplaceable(why));
                }
                TimerSlot::Lease(w) => self.lose_worker(w, Gone::Lease),
                // The dispatch below tries the evictions again.
                TimerSlot::Eviction => self.eviction_timer = None,
            }
            // Timers due at the same instant all fire before workers draw,
            // so that what they release is picked in queue order.
            if self.first_live_timer().is_none_or(|(next, _)| next != at) {
                self.dispatch();
            }
        }
        self.now = target;
    }

    /// Whether the timer entry is its owner's current timer.
    fn timer_live(&self, at: Millis, slot: TimerSlot) -> bool {
        match slot {
            TimerSlot::Lease(w) => {
                let worker = &self.workers[w as usize];
                worker.alive && worker.lease == at
            }
            TimerSlot::Cache(j) | TimerSlot::Deps(j) | TimerSlot::Unplaceable(j) => {
                self.jobs[j as usize].as_ref().is_some_and(|job| job.timer == Some((at, slot)))
            }
            TimerSlot::Eviction => self.eviction_timer == Some(at),
        }
    }

    /// Drops the dead entries at the front of the timers and returns the
    /// first live one.
    fn first_live_timer(&mut self) -> Option<(Millis, TimerSlot)> {
        while let Some(&(at, slot)) = self.timers.first() {
            if self.timer_live(at, slot) {
                return Some((at, slot));
            }
            self.timers.pop_first();
        }
        None
    }

    /// Moves every deadline later by the time between the last event and
    /// `now` (see [`Event::Resumed`]).
    fn shift_deadlines(&mut self, now: Millis) {
        let delta = now.0.saturating_sub(self.now.0);
        if delta == 0 {
            return;
        }
        let timers = std::mem::take(&mut self.timers);
        for (at, slot) in timers {
            if !self.timer_live(at, slot) {
                continue;
            }
            let at = Millis(at.0.saturating_add(delta));
            self.timers.insert((at, slot));
            match slot {
                TimerSlot::Cache(j) | TimerSlot::Deps(j) | TimerSlot::Unplaceable(j) => {
                    self.job_mut(j).timer = Some((at, slot));
                }
                TimerSlot::Lease(w) => self.workers[w as usize].lease = at,
                TimerSlot::Eviction => self.eviction_timer = Some(at),
            }
        }
        // A lost worker's grace stood still too, and so did the runs' ages
        // (their exemption from eviction).
        for lost in &mut self.lost {
            lost.at = Millis(lost.at.0.saturating_add(delta));
        }
        let Scheduler { workers, runs, .. } = self;
        for run in workers.iter().flat_map(|w| &w.runs) {
            if let Some(r) = runs.get_mut(run) {
                r.at = Millis(r.at.0.saturating_add(delta));
            }
        }
        self.now = now;
    }

    /// Arms the job's timer (its previous one, if any, is left dead).
    fn set_timer(&mut self, j: JobIdx, at: Millis, slot: TimerSlot) {
        self.timers.insert((at, slot));
        self.job_mut(j).timer = Some((at, slot));
    }

    /// Disarms the job's timer: its entry is left dead (see `timers`).
    fn clear_timer(&mut self, j: JobIdx) {
        self.job_mut(j).timer = None;
    }

    // ------------------------------------------------------------------
    // Events
    // ------------------------------------------------------------------

    fn apply(&mut self, event: Event) -> Result<(), Rejected> {
        match event {
            Event::WorkerJoined { worker, name, capacity, labels, artifacts } => {
                self.worker_joined(worker, name, capacity, labels, artifacts)
            }
            Event::Heartbeat { worker } => {
                let w = self.live_worker(worker)?;
                self.renew_lease(w);
                Ok(())
            }
            Event::WorkerLeft { worker } => {
                let w = self.live_worker(worker)?;
                self.lose_worker(w, Gone::Left);
                Ok(())
            }
            Event::WorkerUnreachable { worker } => {
                let w = self.live_worker(worker)?;
                self.lose_worker(w, Gone::Unreachable);
                Ok(())
            }
            Event::WorkerDraining { worker } => {
                let w = self.live_worker(worker)?;
                self.renew_lease(w);
                self.drain_worker(w);
                Ok(())
            }
            Event::ArtifactsAdded { worker, artifacts } => {
                let w = self.live_worker(worker)?;
                self.renew_lease(w);
                for a in artifacts {
                    self.artifact_added(w, a);
                }
                Ok(())
            }
            Event::ArtifactsEvicted { worker, artifacts } => {
                let w = self.live_worker(worker)?;
                self.renew_lease(w);
                for a in artifacts {
                    self.artifact_evicted(w, a);
                }
                Ok(())
            }
            Event::Schedule { spec, waiter } => self.schedule(spec, waiter),
            Event::Join { job, waiter } => {
                let j = self.lookup(&job).ok_or(Rejected::UnknownJob(job))?;
                self.add_waiter(j, job, waiter)
            }
            Event::Rehome { job, tenant, queue } => self.rehome(job, &tenant, queue.as_deref()),
            Event::Cancel { job, waiter } => self.cancel(job, waiter),
            Event::JobStarted { run } => self.job_started(run),
            Event::JobExited { run, result } => self.job_exited(run, result),
            Event::RunLost { run } => {
                let r = self.runs.remove(&run).ok_or(Rejected::UnknownRun(run))?;
                let w = r.worker;
                self.release_run(run, &r);
                let name = self.workers[w as usize].name.clone();
                self.update_hungry(w);
                self.dirty.insert(w);
                let why = format!(
                    "its run on worker {name} was lost (the worker restarted, lost track of it, or failed \
                     it itself: its disk, a killed supervisor, an input too large for its cache)"
                );
                self.requeue_lost_run(r, &name, &why);
                Ok(())
            }
            Event::Tick | Event::Resumed => Ok(()),
        }
    }

    fn live_worker(&self, worker: WorkerId) -> Result<WorkerIdx, Rejected> {
        match self.worker_index.get(&worker) {
            Some(&w) if self.workers[w as usize].alive => Ok(w),
            _ => Err(Rejected::UnknownWorker(worker)),
        }
    }

    /// Renews a live worker's lease on a report from it.
    fn renew_lease(&mut self, w: WorkerIdx) {
        let lease = self.now.after(self.config.lease_timeout);
        // A report in the same millisecond as the last renewal moves nothing
        // (at a high event rate, most reports).
        if self.workers[w as usize].lease != lease {
            self.arm_lease(w, lease);
        }
    }

    /// Sets the worker's lease to end at `lease`, armed in the timers.
    fn arm_lease(&mut self, w: WorkerIdx, lease: Millis) {
        // Leases are renewed often (every report): their old entries go at
        // once rather than pile up dead for a whole lease.
        let worker = &mut self.workers[w as usize];
        self.timers.remove(&(worker.lease, TimerSlot::Lease(w)));
        worker.lease = lease;
        self.timers.insert((worker.lease, TimerSlot::Lease(w)));
    }

    fn worker_joined(
        &mut self,
        id: WorkerId,
        name: String,
        capacity: Capacity,
        labels: BTreeMap<String, String>,
        artifacts: Vec<JobId>,
    ) -> Result<(), Rejected> {
        let mut res = WorkerResources {
            slots: capacity.slots,
            cpu: capacity.cpu,
            memory: capacity.memory,
            labels,
            ..WorkerResources::default()
        };
        // Token names new to the core are interned only once the event is
        // accepted: a refused event changes nothing. No job uses them yet,
        // so they cannot matter to the over-commit check.
        let mut new_tokens = Vec::new();
        for (token, amount) in capacity.tokens {
            if amount > 0 {
                match self.token_index.get(&token) {
                    Some(&t) => {
                        res.tokens.insert(t, amount);
                    }
                    None => new_tokens.push((token, amount)),
                }
            }
        }
        let mut withdrawn = Vec::new();
        let w = match self.worker_index.get(&id) {
            Some(&w) if self.workers[w as usize].alive => {
                // Re-registration of a live worker: new capacity and labels,
                // as long as what it runs still fits.
                let old = &self.workers[w as usize].res;
                res.used_slots = old.used_slots;
                res.used_cpu = old.used_cpu;
                res.used_memory = old.used_memory;
                res.used_tokens = old.used_tokens.clone();
                res.exclusive_held = old.exclusive_held.clone();
                if res.over_committed() {
                    return Err(Rejected::CapacityBelowUsage(id));
                }
                withdrawn = self.set_capabilities(w, false);
                let worker = &mut self.workers[w as usize];
                worker.name = name;
                worker.res = res;
                w
            }
            Some(&w) => {
                let worker = &mut self.workers[w as usize];
                worker.name = name;
                worker.res = res;
                worker.alive = true;
                w
            }
            None => {
                let fresh = Worker {
                    id,
                    name,
                    alive: true,
                    res,
                    capable: Vec::new(),
                    lease: Millis(0),
                    first: Queue::default(),
                    second: Queue::default(),
                    local_masks: Vec::new(),
                    held: HeldList::default(),
                    runs: Vec::new(),
                    reserved: None,
                    draining: false,
                };
                // A new worker takes the place of one that was lost, if any:
                // the core then holds no more workers than were ever alive
                // at once, however many come and go under new names (a
                // fleet of short-lived machines). A lost worker holds
                // nothing any more (no runs, queue entries, artifacts,
                // reservation or lease), so nothing of it passes on; its ID
                // becomes unknown, and it registers again as a new worker.
                let w = match self.workers.iter().position(|w| !w.alive) {
                    Some(w) => {
                        let lost = std::mem::replace(&mut self.workers[w], fresh);
                        self.worker_index.remove(&lost.id);
                        self.queue_counts[w] = Default::default();
                        w as WorkerIdx
                    }
                    None => {
                        self.workers.push(fresh);
                        self.queue_counts.push(Default::default());
                        (self.workers.len() - 1) as WorkerIdx
                    }
                };
                self.worker_index.insert(id, w);
                w
            }
        };
        for (token, amount) in new_tokens {
            let t = self.intern_token(&token);
            self.workers[w as usize].res.tokens.insert(t, amount);
        }
        self.set_capabilities(w, true);
        self.workers[w as usize].draining = false;
        withdrawn.retain(|&c| self.classes[c as usize].capable == 0);
        // Armed whatever the old value: a worker that comes back after being
        // lost has no timer entry left.
        self.arm_lease(w, self.now.after(self.config.lease_timeout));
        self.update_hungry(w);
        self.dirty.insert(w);
        // The list is the worker's whole cache: what it held before and no
        // longer lists is gone (lost to a crash, or evicted while the
        // coordinator was not listening), exactly as if it had reported the
        // eviction. A first registration holds nothing yet.
        let mut listed = IdSet::default();
        for a in &artifacts {
            listed.insert(*a);
        }
        for a in self.held_by(w) {
            if !listed.contains(&a) {
                self.artifact_evicted(w, a);
            }
        }
        for a in artifacts {
            self.artifact_added(w, a);
        }
        // A lost worker that registers again is back: jobs it could run wait
        // for it no longer (those it can still run are queued just below).
        let name = self.workers[w as usize].name.clone();
        self.forget_lost(Some(&name));
        // A re-registration may have taken away the last capable worker of a
        // class; a registration may bring the first one.
        self.handle_uncapable_classes(&withdrawn);
        let waiting: Vec<JobIdx> = self
            .unplaceable
            .iter()
            .copied()
            .filter(|&j| self.classes[self.job(j).class as usize].capable > 0)
            .collect();
        for j in waiting {
            self.unplaceable.remove(&j);
            self.clear_timer(j);
            self.enqueue(j);
        }
        Ok(())
    }

    /// Recomputes (`add`) or withdraws (`!add`) the worker's contribution to
    /// every class's count of capable workers. A withdrawal returns the
    /// classes it left with no capable worker.
    fn set_capabilities(&mut self, w: WorkerIdx, add: bool) -> Vec<ClassIdx> {
        let mut dropped = Vec::new();
        let worker = &mut self.workers[w as usize];
        let capacity = Amounts::new(worker.res.slots, worker.res.cpu, worker.res.memory);
        // Called with `add` when a worker (re-)registers, without when its
        // registration is withdrawn (re-registration, loss): always in pairs.
        if add {
            self.total.add(capacity);
        } else {
            self.total.sub(capacity);
        }
        self.quotas.dirty = true;
        self.total_changed = true;
        if add {
            worker.capable = self.classes.iter().map(|c| worker.res.capable(&c.key)).collect();
            for (c, &ok) in worker.capable.iter().enumerate() {
                if ok {
                    self.classes[c].capable += 1;
                }
            }
        } else {
            for (c, ok) in worker.capable.iter_mut().enumerate() {
                if std::mem::replace(ok, false) {
                    self.classes[c].capable -= 1;
                    if self.classes[c].capable == 0 {
                        dropped.push(c as ClassIdx);
                    }
                }
            }
        }
        dropped
    }

    fn schedule(&mut self, spec: JobSpec, waiter: WaiterId) -> Result<(), Rejected> {
        if let Some(j) = self.lookup(&spec.id) {
            return self.add_waiter(j, spec.id, waiter);
        }
        let invalid = |why: &str| Err(Rejected::InvalidSpec { job: spec.id, why: why.to_owned() });
        if spec.request.slots == 0 {
            return invalid("a job takes at least one slot");
        }
        if spec.max_attempts == 0 {
            return invalid("max_attempts must be at least 1");
        }
        if spec.deps.contains(&spec.id) {
            return invalid("a job cannot depend on itself");
        }
        let queue = match self.quotas.resolve(spec.queue.as_deref(), &spec.tenant) {
            Ok(q) => q,
            Err(why) => return invalid(&why),
        };
        if let Some(gang) = &spec.gang
            && (gang.min_available == 0 || gang.id.is_empty())
        {
            return invalid("a gang needs an ID and a min_available of at least 1");
        }
        let tenant = self.intern_tenant(&spec.tenant, queue);
        let class = self.intern_class(&spec);
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut deps = spec.deps;
        deps.sort();
        deps.dedup();
        let job = Job {
            id: spec.id,
            tenant,
            class,
            key: self.policy.job_key(spec.priority, spec.path, seq),
            priority: spec.priority,
            deps: deps.into_boxed_slice(),
            waiters: vec![waiter],
            attempts: 0,
            max_attempts: spec.max_attempts,
            state: JobState::Queued(Stage::Cache),
            places: Vec::new(),
            timer: None,
            indexed: false,
            counted: false,
            gang: None,
            reserved_on: None,
        };
        let j = match self.free_jobs.pop() {
            Some(j) => {
                self.jobs[j as usize] = Some(job);
                j
            }
            None => {
                self.jobs.push(Some(job));
                self.eras.push(0);
                (self.jobs.len() - 1) as JobIdx
            }
        };
        self.job_index.insert(&spec.id, j);
        if let Some(spec) = spec.gang {
            let g = match self.gang_index.get(&spec.id) {
                Some(&g) => g,
                None => {
                    let g = self.next_gang;
                    self.next_gang += 1;
                    self.gang_index.insert(spec.id.clone(), g);
                    let gang = Gang {
                        id: spec.id,
                        min: spec.min_available,
                        // Without the gang plugin, members start one by one.
                        started: !self.policy.gang,
                        members: 0,
                        queued: BTreeSet::new(),
                    };
                    self.gangs.insert(g, gang);
                    g
                }
            };
            self.change_gang(g, |gang| {
                gang.members += 1;
                // A later member may lower the bar (the caller's other
                // members finished without running, from the cache, say).
                gang.min = gang.min.min(spec.min_available);
            });
            self.job_mut(j).gang = Some(g);
        }
        self.enqueue(j);
        Ok(())
    }

    /// Job `id` moves to `tenant` (see [`Event::Rehome`]): out of every
    /// queue, and back in as that tenant's, its locality stages anew.
    fn rehome(&mut self, id: JobId, tenant: &str, queue: Option<&str>) -> Result<(), Rejected> {
        let j = self.lookup(&id).ok_or(Rejected::UnknownJob(id))?;
        let q = self.quotas.resolve(queue, tenant).map_err(|why| Rejected::InvalidSpec { job: id, why })?;
        let t = self.intern_tenant(tenant, q);
        if self.job(j).tenant == t || !matches!(self.job(j).state, JobState::Queued(_)) {
            return Ok(());
        }
        self.unqueue(j);
        self.job_mut(j).tenant = t;
        self.enqueue(j);
        Ok(())
    }

    /// A known job (`j`, `id`) gains a waiter.
    fn add_waiter(&mut self, j: JobIdx, id: JobId, waiter: WaiterId) -> Result<(), Rejected> {
        let job = self.job_mut(j);
        if job.waiters.contains(&waiter) {
            return Err(Rejected::AlreadyWaiting { job: id, waiter });
        }
        job.waiters.push(waiter);
        Ok(())
    }

    fn cancel(&mut self, id: JobId, waiter: WaiterId) -> Result<(), Rejected> {
        let j = self.lookup(&id).ok_or(Rejected::UnknownJob(id))?;
        let job = self.job_mut(j);
        let pos =
            job.waiters.iter().position(|w| *w == waiter).ok_or(Rejected::NotWaiting { job: id, waiter })?;
        job.waiters.remove(pos);
        if !job.waiters.is_empty() {
            return Ok(());
        }
        let stage = match job.state {
            JobState::Queued(_) | JobState::Unplaceable => {
                self.unqueue(j);
                self.unplaceable.remove(&j);
                CancelStage::Queued
            }
            JobState::Assigned(run) => {
                self.orphan_run(run);
                let worker = self.workers[self.run(run).worker as usize].id;
                self.decisions.push(Decision::Drop { worker, run });
                CancelStage::Assigned
            }
            JobState::Running(run) => {
                self.orphan_run(run);
                let worker = self.workers[self.run(run).worker as usize].id;
                self.decisions.push(Decision::Stop { worker, run });
                CancelStage::Running
            }
        };
        self.remove_job(j);
        self.decisions.push(Decision::Cancelled { job: id, stage });
        Ok(())
    }

    fn orphan_run(&mut self, run: RunId) {
        if let Some(r) = self.runs.get_mut(&run) {
            r.job = None;
        }
        // A suspended run that is being stopped is never resumed (the
        // worker continues its processes so they see the stop).
        self.suspended.remove(&run);
    }

    /// Gives back everything run `run` (already out of `runs`) holds on
    /// its worker and in its queue's and tenant's accounts.
    fn release_run(&mut self, run: RunId, r: &Run) {
        let key = &self.classes[r.class as usize].key;
        let worker = &mut self.workers[r.worker as usize];
        if let Some(pos) = worker.runs.iter().position(|&x| x == run) {
            worker.runs.remove(pos);
        }
        if r.suspended.is_some() {
            worker.res.resume(key);
        }
        worker.res.release(key);
        if r.suspended.is_some() {
            self.suspended.remove(&run);
            self.charge_suspension(r.tenant, r.class, false);
        }
        self.charge_run(r.tenant, r.class, false);
    }

    fn job_started(&mut self, run: RunId) -> Result<(), Rejected> {
        let r = self.runs.get_mut(&run).ok_or(Rejected::UnknownRun(run))?;
        if r.started {
            return Err(Rejected::AlreadyStarted(run));
        }
        r.started = true;
        let w = r.worker;
        if let Some(j) = r.job {
            self.job_mut(j).state = JobState::Running(run);
        }
        self.renew_lease(w);
        Ok(())
    }

    fn job_exited(&mut self, run: RunId, result: JobResult) -> Result<(), Rejected> {
        let r = self.runs.remove(&run).ok_or(Rejected::UnknownRun(run))?;
        let w = r.worker;
        self.release_run(run, &r);
        self.update_hungry(w);
        self.dirty.insert(w);
        self.renew_lease(w);
        if let Some(j) = r.job {
            let waiters = std::mem::take(&mut self.job_mut(j).waiters);
            self.remove_job(j);
            let success = result.success;
            self.decisions.push(Decision::Finished {
                job: r.job_id,
                waiters,
                completion: Completion::Ran(result),
            });
            if success {
                // Its job just left: no live job has this ID.
                self.artifact_arrived(w, r.job_id, false);
            }
        } else if result.success {
            // A stopped run that finished anyway still left its artifact.
            self.artifact_added(w, r.job_id);
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Locality: artifacts and the stages of a queued job
    // ------------------------------------------------------------------

    fn artifact_added(&mut self, w: WorkerIdx, a: JobId) {
        self.artifact_arrived(w, a, true);
    }

    /// Worker `w` now holds artifact `a`. `maybe_live`: whether a live job
    /// may have ID `a` (false when the caller just removed the job that made
    /// it, which spares a lookup whose table lines are cold).
    fn artifact_arrived(&mut self, w: WorkerIdx, a: JobId, maybe_live: bool) {
        let ws = self.holders.entry_or_default(a);
        let Err(pos) = ws.binary_search(&w) else { return };
        ws.insert(pos, w);
        self.workers[w as usize].held.push(a);
        // Rule 1: a pending job is in the first queue of every holder of its
        // result, whatever its stage.
        if maybe_live
            && let Some(j) = self.lookup(&a)
            && matches!(self.job(j).state, JobState::Queued(stage) if stage != Stage::Gang)
        {
            self.add_place(j, Place::First(w));
        }
        // Rule 2, live: jobs already in their dependency stage (or later) gain
        // the new holder of one of their dependencies.
        if let Some(readers) = self.dependents.get(&a) {
            let readers: Vec<JobIdx> = readers.live(live_entry(&self.eras)).collect();
            for j in readers {
                self.add_place(j, Place::Second(w));
            }
        }
    }

    fn artifact_evicted(&mut self, w: WorkerIdx, a: JobId) {
        if !self.forget_holder(w, a) {
            return;
        }
        if self.workers[w as usize].held.evicted() {
            let Scheduler { workers, holders, .. } = self;
            workers[w as usize].held.compact(|a| holds(holders, w, a));
        }
        if let Some(j) = self.lookup(&a)
            && matches!(self.job(j).state, JobState::Queued(_))
        {
            self.remove_place(j, Place::First(w));
            self.leave_cache_stage_if_uncached(j);
        }
        if let Some(readers) = self.dependents.get(&a) {
            let readers: Vec<JobIdx> = readers.live(live_entry(&self.eras)).collect();
            for j in readers {
                if !self.job(j).deps.iter().any(|d| self.holds(w, d)) {
                    self.remove_place(j, Place::Second(w));
                }
            }
        }
    }

    /// Takes `w` off the holders of `a`; true if it was one.
    fn forget_holder(&mut self, w: WorkerIdx, a: JobId) -> bool {
        let Some(ws) = self.holders.get_mut(&a) else { return false };
        let Ok(pos) = ws.binary_search(&w) else { return false };
        ws.remove(pos);
        if ws.is_empty() {
            self.holders.remove(&a);
        }
        true
    }

    /// Whether worker `w` holds artifact `a`.
    fn holds(&self, w: WorkerIdx, a: &JobId) -> bool {
        holds(&self.holders, w, a)
    }

    /// The artifacts worker `w` holds, in ID order (a walk: not for hot
    /// paths).
    fn held_by(&self, w: WorkerIdx) -> Vec<JobId> {
        self.workers[w as usize].held.sorted(|a| self.holds(w, a))
    }

    /// A job waiting for the holders of its result when the last holder is
    /// gone has nothing left to wait for: it moves on to its dependency stage,
    /// as it would have if it had been uncached from the start.
    fn leave_cache_stage_if_uncached(&mut self, j: JobIdx) {
        let job = self.job(j);
        if job.state == JobState::Queued(Stage::Cache)
            && !job.places.iter().any(|p| matches!(p, Place::First(_)))
        {
            self.clear_timer(j);
            self.enter_deps_stage(j, self.now);
        }
    }

    /// Puts a new or requeued job into the queues.
    fn enqueue(&mut self, j: JobIdx) {
        let (class, id) = (self.job(j).class, self.job(j).id);
        self.job_mut(j).state = JobState::Queued(Stage::Cache);
        self.queued_changed(j, true);
        let queue = self.tenants[self.job(j).tenant as usize].queue;
        if let Some(why) =
            self.quotas.beyond_capability(queue, self.classes[class as usize].amounts, "the job")
        {
            self.give_up(j, FailReason::Unplaceable(why));
            return;
        }
        if self.classes[class as usize].capable == 0 {
            self.make_unplaceable(j);
            return;
        }
        if let Some(g) = self.job(j).gang {
            // Gang members wait together, outside the locality queues.
            let key = self.job(j).key;
            self.job_mut(j).state = JobState::Queued(Stage::Gang);
            self.change_gang(g, |gang| gang.queued.insert((key, j)));
            self.give_up_gang_beyond_capability(g, queue);
            return;
        }
        let holders = self.holders.get(&id).cloned().unwrap_or_default();
        for &w in &holders {
            self.add_place(j, Place::First(w));
        }
        if holders.is_empty() {
            // Rule 2a: uncached at schedule time: straight to the dependency
            // stage, with no CacheTimeout timer.
            self.enter_deps_stage(j, self.now);
        } else {
            let at = self.now.after(self.config.cache_timeout);
            self.set_timer(j, at, TimerSlot::Cache(j));
        }
    }

    fn enter_deps_stage(&mut self, j: JobIdx, since: Millis) {
        let job = self.job_mut(j);
        job.state = JobState::Queued(Stage::Deps);
        job.indexed = true;
        let deps = std::mem::take(&mut job.deps);
        let mut holders = BTreeSet::new();
        let era = self.eras[j as usize];
        for d in deps.iter() {
            self.dependents.entry_or_default(*d).push(j, era);
            if let Some(ws) = self.holders.get(d) {
                holders.extend(ws.iter().copied());
            }
        }
        self.job_mut(j).deps = deps;
        for w in holders {
            self.add_place(j, Place::Second(w));
        }
        if self.job(j).deps.is_empty() {
            // A job that reads no dependency has no holder to wait for: the
            // dependency stage would only delay it by DepsTimeout.
            self.enter_global(j);
        } else {
            // Rule 3: the DepsTimeout clock starts with the dependency stage.
            let at = since.after(self.config.deps_timeout);
            self.set_timer(j, at, TimerSlot::Deps(j));
        }
    }

    fn enter_global(&mut self, j: JobIdx) {
        self.job_mut(j).state = JobState::Queued(Stage::Global);
        self.add_place(j, Place::Global);
    }

    fn add_place(&mut self, j: JobIdx, place: Place) {
        let job = self.jobs[j as usize].as_mut().expect("live job");
        if job.places.contains(&place) {
            return;
        }
        job.places.push(place);
        let (class, tenant, key, era) = (job.class, job.tenant, job.key, self.eras[j as usize]);
        let known = self.tenants.len();
        match place {
            Place::Global => self.global.insert(class, tenant, key, j, era),
            Place::First(w) | Place::Second(w) => {
                let (queue, counts) =
                    local_queue(&mut self.workers, &mut self.queue_counts, place).expect("a local place");
                queue.room_for(known);
                queue.insert(counts, class, tenant, key, j, era);
                if self.quotas.active() {
                    let worker = &mut self.workers[w as usize];
                    let t = tenant as usize;
                    if worker.local_masks.len() <= t {
                        // All known tenants at once (see `Queue::room_for`).
                        worker.local_masks.resize(known, 0);
                    }
                    worker.local_masks[t] |= class_bit(class);
                }
            }
        }
        self.placed(tenant, true);
        match place {
            Place::Global => self.global_dirty = true,
            Place::First(w) | Place::Second(w) => {
                if self.hungry.contains(&w) {
                    self.dirty.insert(w);
                }
            }
        }
    }

    /// Counts one more (`add`) or one fewer queue entry of `tenant`'s jobs:
    /// a tenant is in its queue's order while it has entries.
    fn placed(&mut self, t: TenantIdx, add: bool) {
        let tenant = &mut self.tenants[t as usize];
        if add {
            tenant.placed += 1;
            if tenant.placed == 1 {
                self.refile(t);
            }
        } else {
            tenant.placed -= 1;
            if tenant.placed == 0 {
                self.refile(t);
            }
        }
    }

    /// The key tenant `t` belongs under in its queue's order: its highest
    /// queued priority, dominant share and last service, as the tiers order
    /// them.
    fn tenant_key(&self, t: TenantIdx) -> TenantKey {
        let tenant = &self.tenants[t as usize];
        let top = tenant.priorities.last_key_value().map_or(i32::MIN, |(p, _)| *p);
        self.policy.tenant_key(top, tenant.allocated.share_of(&self.total), tenant.served, t)
    }

    /// Files the tenant in its queue's order under its current key (or takes
    /// it out, when it has no queue entries).
    fn refile(&mut self, t: TenantIdx) {
        let key = (self.tenants[t as usize].placed > 0).then(|| self.tenant_key(t));
        let tenant = &self.tenants[t as usize];
        if key == tenant.filed {
            return;
        }
        let q = tenant.queue as usize;
        let old = std::mem::replace(&mut self.tenants[t as usize].filed, key);
        self.orders[q].replace(old, key);
        self.refile_queue(q as QueueIdx);
    }

    /// Files leaf queue `q` in the queue order under its current key (its
    /// priority and share, as the tiers order them), or takes it out when
    /// none of its tenants has queued jobs. Called whenever its allocation,
    /// its deserved amount or its set of tenants changes, so a draw reads
    /// the order instead of computing and sorting every queue's share.
    fn refile_queue(&mut self, q: QueueIdx) {
        let key = (!self.orders[q as usize].is_empty())
            .then(|| self.policy.queue_key(self.quotas.nodes[q as usize].priority, self.quotas.share(q), q));
        let filed = &mut self.queue_filed[q as usize];
        if key == *filed {
            return;
        }
        if let Some(old) = filed.take()
            && let Ok(i) = self.queue_order.binary_search(&old)
        {
            self.queue_order.remove(i);
        }
        if let Some(key) = key
            && let Err(i) = self.queue_order.binary_search(&key)
        {
            self.queue_order.insert(i, key);
        }
        self.queue_filed[q as usize] = key;
    }

    /// Files every leaf queue anew, after a recomputation of the deserved
    /// amounts (which moves the share of most of them): one sort instead of
    /// a removal and an insertion per queue.
    fn refile_all_queues(&mut self) {
        // The order lists exactly the queues with tenants filed (kept so by
        // `refile_queue`); each gets its new key where it stands. Shares
        // move a little at a time, so the list is still nearly sorted, and
        // a sort that finds runs puts it right in about one pass.
        let mut order = std::mem::take(&mut self.queue_order);
        for slot in &mut order {
            let q = slot.1;
            *slot = self.policy.queue_key(self.quotas.nodes[q as usize].priority, self.quotas.share(q), q);
            self.queue_filed[q as usize] = Some(*slot);
        }
        order.sort();
        self.queue_order = order;
    }

    /// A job became queued (`add`) or stopped being queued: its tenant's
    /// priorities and its queue's pending request follow.
    fn queued_changed(&mut self, j: JobIdx, add: bool) {
        let job = self.jobs[j as usize].as_mut().expect("live job");
        job.counted = add;
        let (t, priority, class) = (job.tenant, job.priority, job.class as usize);
        let amounts = self.classes[class].amounts;
        let tenant = &mut self.tenants[t as usize];
        let q = tenant.queue;
        count_class(&mut tenant.classes, &mut tenant.class_mask, class, add);
        count_class(&mut self.queue_classes[q as usize], &mut self.queue_masks[q as usize], class, add);
        if add {
            *tenant.priorities.entry(priority).or_insert(0) += 1;
        } else if let Some(n) = tenant.priorities.get_mut(&priority) {
            *n -= 1;
            if *n == 0 {
                tenant.priorities.remove(&priority);
            }
        }
        self.quotas.charge(q, |node| {
            if add {
                node.pending.add(amounts);
                node.queued_jobs += 1;
            } else {
                node.pending.sub(amounts);
                node.queued_jobs -= 1;
            }
        });
        self.refile(t);
    }

    /// A run took (`add`) or gave back its resources: its queue's and its
    /// tenant's allocation follow.
    fn charge_run(&mut self, t: TenantIdx, class: ClassIdx, add: bool) {
        let amounts = self.classes[class as usize].amounts;
        self.allocate(t, amounts, add, true);
    }

    /// A run was suspended (`suspend`) or resumed: its queue and tenant
    /// give back (or take again) its slots and CPU; its memory stays
    /// counted.
    fn charge_suspension(&mut self, t: TenantIdx, class: ClassIdx, suspend: bool) {
        let key = &self.classes[class as usize].key;
        let amounts = Amounts::new(key.slots, key.cpu, 0);
        self.allocate(t, amounts, !suspend, false);
    }

    /// Adds (`add`) or takes back `amounts` in the tenant's and its queues'
    /// allocation, counting a run in or out with them if `run`.
    fn allocate(&mut self, t: TenantIdx, amounts: Amounts, add: bool, run: bool) {
        let tenant = &mut self.tenants[t as usize];
        if add {
            tenant.allocated.add(amounts);
        } else {
            tenant.allocated.sub(amounts);
            if self.quotas.active() && self.quotas.capped(tenant.queue) {
                // Room under a capability: an idle worker may now take a
                // job its queue held back. (Only a capability on this
                // queue's way up can have held anything back that this
                // frees, and only from a worker whose last draw met a
                // capability: what else an idle worker found no room for
                // is as it was. Those that met none would draw for
                // nothing, as often as runs of capped queues end.)
                self.dirty.extend(self.capped_out.iter().copied());
            }
        }
        self.quotas.charge(tenant.queue, |node| {
            if add {
                node.allocated.add(amounts);
                node.running += u64::from(run);
            } else {
                node.allocated.sub(amounts);
                node.running -= u64::from(run);
            }
        });
        self.refile_queue(self.tenants[t as usize].queue);
        self.refile(t);
    }

    fn remove_place(&mut self, j: JobIdx, place: Place) {
        let job = self.jobs[j as usize].as_mut().expect("live job");
        let Some(pos) = job.places.iter().position(|p| *p == place) else { return };
        job.places.swap_remove(pos);
        let (class, tenant, key) = (job.class, job.tenant, job.key);
        // A worker holding back for this job may no longer see it: its next
        // draw drops the reservation if so (see `draw_all`).
        if let Place::First(w) | Place::Second(w) = place
            && job.reserved_on == Some(w)
        {
            self.dirty.insert(w);
        }
        let removed = match local_queue(&mut self.workers, &mut self.queue_counts, place) {
            Some((queue, counts)) => queue.remove(counts, class, tenant, key),
            None => self.global.remove(class, tenant, key, live_entry(&self.eras)),
        };
        if removed {
            self.placed(tenant, false);
        }
    }

    /// Takes a queued job out of every queue, index, timer and reservation.
    fn unqueue(&mut self, j: JobIdx) {
        if self.job(j).counted {
            self.queued_changed(j, false);
        }
        if let (Some(g), JobState::Queued(Stage::Gang)) = (self.job(j).gang, self.job(j).state) {
            let key = self.job(j).key;
            self.change_gang(g, |gang| gang.queued.remove(&(key, j)));
        }
        // The job's entries in the queues stay behind, dead (see
        // `queue.rs`, "Leaving the queues lazily"): a new era disowns them.
        let job = self.jobs[j as usize].as_mut().expect("live job");
        let places = std::mem::take(&mut job.places);
        self.eras[j as usize] = self.eras[j as usize].wrapping_add(1);
        let (class, tenant, key) = (job.class, job.tenant, job.key);
        for place in places {
            let Scheduler { global, workers, queue_counts, eras, .. } = self;
            match local_queue(workers, queue_counts, place) {
                Some((queue, counts)) => {
                    if counts.left() {
                        queue.compact(counts, live_entry(eras));
                    }
                }
                None => global.left(class, tenant, key, live_entry(eras)),
            }
            self.placed(tenant, false);
        }
        self.clear_timer(j);
        let job = self.jobs[j as usize].as_mut().expect("live job");
        if std::mem::take(&mut job.indexed) {
            // Its entries among the readers of its dependencies died with
            // the era (see `readers.rs`): only counted here.
            let Scheduler { jobs, dependents, eras, .. } = self;
            for d in jobs[j as usize].as_ref().expect("live job").deps.iter() {
                let readers = dependents.get_mut(d).expect("a reader is indexed under each dependency");
                if readers.left() {
                    readers.compact(live_entry(eras));
                    if readers.is_empty() {
                        dependents.remove(d);
                    }
                }
            }
        }
        if let Some(w) = self.job_mut(j).reserved_on.take() {
            self.workers[w as usize].reserved = None;
            self.dirty.insert(w);
        }
    }

    fn remove_job(&mut self, j: JobIdx) {
        // Dropped where it lies: moving the whole job out first cost a copy
        // of its three lines.
        let gang = self.job(j).gang;
        self.jobs[j as usize] = None;
        self.job_index.remove(j);
        self.eras[j as usize] = self.eras[j as usize].wrapping_add(1);
        self.free_jobs.push(j);
        if let Some(g) = gang
            && self.change_gang(g, |gang| {
                gang.members -= 1;
                gang.members == 0
            })
        {
            let gang = self.gangs.remove(&g).expect("live gang");
            if let Some(n) = gang.waits() {
                self.waiting_gangs.remove(&(n, g));
            }
            self.gang_index.remove(&gang.id);
        }
    }

    // ------------------------------------------------------------------
    // Unplaceable jobs and worker loss
    // ------------------------------------------------------------------

    /// No live worker can run job `j`: it waits for one until the later of
    /// its `unplaceable_grace` and the `lost_worker_grace` of the last lost
    /// worker that could have run it, or fails at once when neither applies.
    fn make_unplaceable(&mut self, j: JobIdx) {
        self.unqueue(j);
        self.forget_lost(None);
        let class = self.job(j).class;
        let grace = (self.config.unplaceable_grace > Millis(0))
            .then(|| self.now.after(self.config.unplaceable_grace));
        // No worker at all: they are starting with the coordinator, or all
        // restarting.
        let empty_grace = self.config.no_worker_grace;
        let empty = (empty_grace > Millis(0) && !self.workers.iter().any(|w| w.alive))
            .then(|| self.now.after(empty_grace));
        let Some(at) = grace.max(self.lost_wait(class)).max(empty) else {
            let why = self.unplaceable_reason(class);
            self.give_up(j, FailReason::Unplaceable(why));
            return;
        };
        self.job_mut(j).state = JobState::Unplaceable;
        self.unplaceable.insert(j);
        self.set_timer(j, at, TimerSlot::Unplaceable(j));
    }

    /// Until when jobs of `class` wait for a lost worker that could run them
    /// to come back, if one was lost lately enough.
    fn lost_wait(&self, class: ClassIdx) -> Option<Millis> {
        let key = &self.classes[class as usize].key;
        self.lost
            .iter()
            .filter(|l| l.res.capable(key))
            .map(|l| l.at.after(self.config.lost_worker_grace))
            .filter(|&until| until > self.now)
            .max()
    }

    /// Drops the lost workers whose grace has passed, and the one named
    /// `back` (it registered again).
    fn forget_lost(&mut self, back: Option<&str>) {
        let (now, grace) = (self.now, self.config.lost_worker_grace);
        self.lost.retain(|l| l.at.after(grace) >= now && Some(l.name.as_str()) != back);
    }

    fn give_up(&mut self, j: JobIdx, reason: FailReason) {
        self.unqueue(j);
        self.unplaceable.remove(&j);
        let job = self.jobs[j as usize].as_mut().expect("live job");
        let waiters = std::mem::take(&mut job.waiters);
        let id = job.id;
        self.remove_job(j);
        self.decisions.push(Decision::Finished { job: id, waiters, completion: Completion::GaveUp(reason) });
    }

    /// A gang that has not started, whose `min` members (the least of them
    /// in each of slots, CPU and memory) ask together for more than its
    /// queue's capability, can never start: its queued members fail, saying
    /// why, instead of waiting for ever.
    fn give_up_gang_beyond_capability(&mut self, g: GangIdx, queue: QueueIdx) {
        let gang = &self.gangs[&g];
        if gang.started || (gang.queued.len() as u32) < gang.min || !self.quotas.active() {
            return;
        }
        let amounts: Vec<Amounts> =
            gang.queued.iter().map(|&(_, j)| self.classes[self.job(j).class as usize].amounts).collect();
        let mut least = Amounts::default();
        for d in 0..3 {
            let mut values: Vec<u64> = amounts.iter().map(|a| a.0[d]).collect();
            values.sort_unstable();
            least.0[d] = values.iter().take(gang.min as usize).fold(0u64, |sum, &v| sum.saturating_add(v));
        }
        // The shell's gang IDs may carry more than the name people gave
        // (`BUILD/NAME#INSTANCE`): the name is shown.
        let name = gang.id.split_once('/').map_or(gang.id.as_str(), |(_, rest)| rest);
        let name = name.rsplit_once('#').map_or(name, |(name, _)| name);
        let who = format!("its gang {name} ({} of its jobs at once)", gang.min);
        let Some(why) = self.quotas.beyond_capability(queue, least, &who) else { return };
        let members: Vec<JobIdx> = gang.queued.iter().map(|&(_, j)| j).collect();
        for j in members {
            self.give_up(j, FailReason::Unplaceable(why.clone()));
        }
    }

    /// Jobs of classes that lost their last capable worker cannot wait in the
    /// queues for nobody: they fail (or wait for a worker, per the grace).
    fn handle_uncapable_classes(&mut self, classes: &[ClassIdx]) {
        if classes.is_empty() {
            return;
        }
        let stuck: Vec<JobIdx> = self
            .jobs
            .iter()
            .enumerate()
            .filter_map(|(j, job)| {
                let job = job.as_ref()?;
                (matches!(job.state, JobState::Queued(_)) && classes.contains(&job.class))
                    .then_some(j as JobIdx)
            })
            .collect();
        for j in stuck {
            self.make_unplaceable(j);
        }
    }

    /// Worker `w` is gone (`gone` says how, for the reasons of what it
    /// leaves behind): its runs are requeued, its queues, reservation and
    /// artifacts forgotten, and what it could run remembered for a while.
    fn lose_worker(&mut self, w: WorkerIdx, gone: Gone) {
        let how = match gone {
            Gone::Lease => {
                format!("missed its lease (nothing heard for {})", duration(self.config.lease_timeout.0))
            }
            Gone::Left => "left".to_owned(),
            Gone::Unreachable => "was lost (its address refused connections)".to_owned(),
        };
        let worker = &mut self.workers[w as usize];
        if !worker.alive {
            return;
        }
        worker.alive = false;
        let id = worker.id;
        let name = worker.name.clone();
        self.timers.remove(&(worker.lease, TimerSlot::Lease(w)));
        self.hungry.remove(&w);
        self.capped_out.remove(&w);
        self.dirty.remove(&w);
        self.decisions.push(Decision::WorkerLost { worker: id });

        let worker = &mut self.workers[w as usize];
        let runs = std::mem::take(&mut worker.runs);
        let [first_counts, second_counts] = &mut self.queue_counts[w as usize];
        let first = worker.first.take_all(first_counts, live_entry(&self.eras));
        let second = worker.second.take_all(second_counts, live_entry(&self.eras));
        let held = worker.held.take();
        let reserved = worker.reserved.take();
        worker.res.used_slots = 0;
        worker.res.used_cpu = 0;
        worker.res.used_memory = 0;
        worker.res.used_tokens.clear();
        worker.res.exclusive_held.clear();
        if let Some(j) = reserved {
            self.job_mut(j).reserved_on = None;
        }
        for &(t, j) in &first {
            self.job_mut(j).places.retain(|p| *p != Place::First(w));
            self.placed(t, false);
        }
        for (t, j) in second {
            self.job_mut(j).places.retain(|p| *p != Place::Second(w));
            self.placed(t, false);
        }
        // Stale and repeated entries are no holders: forgetting them does
        // nothing.
        for a in held {
            self.forget_holder(w, a);
        }
        let dropped = self.set_capabilities(w, false);
        if self.config.lost_worker_grace > Millis(0) {
            self.forget_lost(Some(&name));
            if self.lost.len() == MAX_LOST {
                self.lost.remove(0);
            }
            let res = self.workers[w as usize].res.clone();
            self.lost.push(Lost { name: name.clone(), res, at: self.now, left: matches!(gone, Gone::Left) });
        }
        for (_, j) in first {
            if self.jobs[j as usize].is_some() {
                self.leave_cache_stage_if_uncached(j);
            }
        }
        for run in runs {
            let r = self.runs.remove(&run).expect("worker's run is in flight");
            if r.suspended.is_some() {
                self.suspended.remove(&run);
                self.charge_suspension(r.tenant, r.class, false);
            }
            self.charge_run(r.tenant, r.class, false);
            self.requeue_lost_run(r, &name, &format!("worker {name} {how}"));
        }
        self.handle_uncapable_classes(&dropped);
    }

    /// A run lost with its worker (`why`): its job goes back to the queues,
    /// or fails once it has used all its attempts. (Resources were released
    /// by the caller.)
    fn requeue_lost_run(&mut self, r: Run, worker_name: &str, why: &str) {
        let Some(j) = r.job else { return };
        let job = self.job_mut(j);
        if job.attempts >= job.max_attempts {
            let attempts = job.attempts;
            let last_worker = worker_name.to_owned();
            self.give_up(j, FailReason::TooManyAttempts { attempts, last_worker });
        } else {
            let (job_id, attempts) = (job.id, job.attempts);
            self.decisions.push(Decision::Requeued { job: job_id, attempts, reason: why.to_owned() });
            self.enqueue(j);
        }
    }

    /// Why no live worker can run the class, for people.
    fn unplaceable_reason(&self, class: ClassIdx) -> String {
        let key = &self.classes[class as usize].key;
        let live: Vec<&WorkerResources> = self.workers.iter().filter(|w| w.alive).map(|w| &w.res).collect();
        if live.is_empty() {
            return format!("no worker is registered{}", self.lost_reason(class));
        }
        let mut unmet = Vec::new();
        for (k, v) in &key.labels {
            if !live.iter().any(|w| w.labels.get(k) == Some(v)) {
                unmet.push(format!("no worker has label {k}={v}"));
            }
        }
        let max = |f: &dyn Fn(&WorkerResources) -> u64| live.iter().map(|w| f(w)).max().unwrap_or(0);
        if u64::from(key.slots) > max(&|w| u64::from(w.slots)) {
            unmet.push(format!(
                "needs {} slots, the largest worker has {}",
                key.slots,
                max(&|w| u64::from(w.slots))
            ));
        }
        if key.cpu > max(&|w| w.cpu) {
            unmet.push(format!("needs {}, the largest worker has {}", cpu(key.cpu), cpu(max(&|w| w.cpu))));
        }
        if key.memory > max(&|w| w.memory) {
            unmet.push(format!(
                "needs {} of memory, the largest worker has {}",
                bytes(key.memory),
                bytes(max(&|w| w.memory))
            ));
        }
        for &(t, amount) in &key.tokens {
            let most = max(&|w| w.tokens.get(&t).copied().unwrap_or(0));
            let name = &self.tokens[t as usize];
            if most == 0 {
                unmet.push(format!("no worker offers token {name}"));
            } else if amount > most {
                unmet.push(format!("needs {name}={amount}, the most any worker offers is {most}"));
            }
        }
        let mut why = if unmet.is_empty() {
            "no single worker meets all of its label and resource requirements".to_owned()
        } else {
            unmet.join("; ")
        };
        why.push_str(&self.lost_reason(class));
        why
    }

    /// The last lost worker that could run the class, for people (empty
    /// when none could).
    fn lost_reason(&self, class: ClassIdx) -> String {
        let key = &self.classes[class as usize].key;
        let Some(last) = self.lost.iter().rev().find(|l| l.res.capable(key)) else { return String::new() };
        let ago = duration(self.now.0.saturating_sub(last.at.0));
        let gone = if last.left { "left" } else { "was lost" };
        match self.lost_wait(class) {
            Some(_) => format!("; worker {} could run it and {gone} {ago} ago", last.name),
            None => format!("; worker {} could run it, {gone} {ago} ago and has not come back", last.name),
        }
    }

    /// Why job `j`, waiting for a capable worker, waits, and how much
    /// longer it will, for people.
    fn waiting_for_worker(&self, j: JobIdx) -> String {
        let job = self.job(j);
        let mut why = self.unplaceable_reason(job.class);
        if let Some((at, TimerSlot::Unplaceable(_))) = job.timer {
            let left = duration(at.0.saturating_sub(self.now.0));
            why.push_str(&format!(
                "; it waits up to {left} more for a capable worker to register, then fails"
            ));
        }
        why
    }

    // ------------------------------------------------------------------
    // Dispatch: workers with free slots draw work
    // ------------------------------------------------------------------

    /// Worker `w` takes nothing new from now on: it leaves the hungry set,
    /// and the job it was making room for (if any) loses its reservation
    /// and may go anywhere again.
    fn drain_worker(&mut self, w: WorkerIdx) {
        self.workers[w as usize].draining = true;
        if let Some(j) = self.workers[w as usize].reserved.take() {
            self.job_mut(j).reserved_on = None;
            self.global_dirty = true;
        }
        self.update_hungry(w);
        self.dirty.remove(&w);
    }

    fn update_hungry(&mut self, w: WorkerIdx) {
        let worker = &self.workers[w as usize];
        if worker.alive && !worker.draining && worker.res.free_slot() {
            if self.hungry.insert(w) {
                self.dirty.insert(w);
            }
        } else {
            self.hungry.remove(&w);
            self.capped_out.remove(&w);
        }
    }

    fn dispatch(&mut self) {
        if std::mem::take(&mut self.total_changed) {
            for t in 0..self.tenants.len() as TenantIdx {
                self.refile(t);
            }
        }
        if !self.suspended.is_empty() {
            self.resume_suspended();
        }
        if self.quotas.active() && self.quotas.settle(self.total) {
            self.refile_all_queues();
        }
        if !self.gangs.is_empty() {
            self.place_gangs();
        }
        self.draw_all();
        if self.config.preempt || self.config.reclaim {
            // At most one eviction statement per step; its reservation then
            // holds the freed room for the starving job.
            if self.evict_for_starving() {
                self.draw_all();
            }
        }
    }

    /// The dirty worker to draw next. Locality has already decided which
    /// workers see which jobs; among workers that see the same job (the
    /// global queue), the first to draw takes it, so the order is the
    /// placement score: `binpack × used + spread × (100 − used)`, where
    /// `used` is the worker's busiest share (slots, CPU, memory) in percent,
    /// highest first, ties by registration order.
    fn next_dirty(&mut self) -> Option<WorkerIdx> {
        let (binpack, spread) = (u64::from(self.policy.binpack), u64::from(self.policy.spread));
        if binpack == 0 && spread == 0 {
            return self.dirty.pop_first();
        }
        let score = |w: &WorkerIdx| {
            let res = &self.workers[*w as usize].res;
            let pct = |used: u64, cap: u64| {
                (u128::from(used.min(cap)) * 100).checked_div(u128::from(cap)).unwrap_or(0) as u64
            };
            let used = pct(res.used_slots.into(), res.slots.into())
                .max(pct(res.used_cpu, res.cpu))
                .max(pct(res.used_memory, res.memory));
            binpack * used + spread * (100 - used)
        };
        // Score the dirty workers once per round rather than once per pick
        // (a round can hold every hungry worker of the cluster).
        if self.ranked.is_empty() {
            let mut round: Vec<(u64, Reverse<WorkerIdx>)> =
                std::mem::take(&mut self.dirty).into_iter().map(|w| (score(&w), Reverse(w))).collect();
            round.sort_unstable();
            self.ranked = round.into_iter().map(|(_, Reverse(w))| w).collect();
        }
        self.ranked.pop()
    }

    /// Every dirty worker draws until it is full or finds nothing.
    fn draw_all(&mut self) {
        if std::mem::take(&mut self.global_dirty) && self.global.len() > 0 {
            self.dirty.extend(self.hungry.iter().copied());
        }
        while let Some(w) = self.next_dirty() {
            loop {
                let worker = &self.workers[w as usize];
                if !worker.alive || worker.draining || !worker.res.free_slot() {
                    break;
                }
                // Whether this round met a capability (the reservation's
                // queue or the draw's): see `capped_out`.
                let mut capped = false;
                if let Some(j) = worker.reserved {
                    let job = self.job(j);
                    // The worker or the job may have changed since the
                    // reservation was made (labels, capacity, evicted
                    // artifacts): a reservation only holds while the worker
                    // could run the job and still sees it in its queues. It
                    // starts the job only once its queue's capability has
                    // room too (evicted runs of that queue may still be
                    // ending).
                    let capable = worker.capable.get(job.class as usize).copied().unwrap_or(false);
                    let visible = job.places.iter().any(|p| match p {
                        Place::First(x) | Place::Second(x) => *x == w,
                        Place::Global => true,
                    });
                    let tenant = &self.tenants[job.tenant as usize];
                    let admitted = !self.quotas.active()
                        || self.quotas.admits(tenant.queue, self.classes[job.class as usize].amounts, false);
                    capped = !admitted;
                    if !capable || !visible {
                        self.workers[w as usize].reserved = None;
                        self.job_mut(j).reserved_on = None;
                        // Workers that held back for the reservation may take the job.
                        self.dirty.extend(self.hungry.iter().copied());
                        continue;
                    }
                    let key = &self.classes[job.class as usize].key;
                    if admitted && worker.res.fits(key, None) {
                        self.assign(w, j);
                        continue;
                    }
                }
                let (pick, capped_draw) = self.draw(w);
                match pick {
                    Some(Pick::Run(j)) => self.assign(w, j),
                    Some(Pick::Reserve(j)) => {
                        self.workers[w as usize].reserved = Some(j);
                        self.job_mut(j).reserved_on = Some(w);
                    }
                    None => {
                        if capped || capped_draw {
                            self.capped_out.insert(w);
                        } else {
                            self.capped_out.remove(&w);
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Preemption and reclaim (Volcano's preempt and reclaim actions), both
    /// off unless configured. Looks, in queue order, at each queue's first
    /// job that is waiting in the global queue with no worker making room
    /// for it; for the first that can be helped, evicts a set of running
    /// jobs on one worker so that it fits there, and reserves that worker
    /// for it. The victims are chosen on a copy of the worker's resources
    /// and applied only if the job then fits (a statement: all or nothing).
    ///
    /// Victims, lowest priority first (then the most recently assigned),
    /// as the tiers choose them ([`Self::tier_victims`]); with the default
    /// tiers:
    /// - preempt: jobs of the same queue with a lower priority;
    /// - reclaim (for a queue that stays within its deserved share with the
    ///   job): jobs of other, reclaimable queues that stay at or above their
    ///   deserved share without the victim.
    ///
    /// Gang members are never victims while `gang` is listed. Since a
    /// reclaimer never goes above
    /// its share and a victim's queue never below its own, neither can then
    /// reclaim from the other: no eviction loops. An evicted job is
    /// requeued (`Requeued`; the evicted run does not count as one of its
    /// attempts) and its run stopped (`Stop`, or
    /// `Drop` if it had not started); its resources are freed when the
    /// worker reports the run's end.
    fn evict_for_starving(&mut self) -> bool {
        // The soonest a run spared for its youth could be evicted.
        let mut spared_until: Option<Millis> = None;
        for (_, q) in self.leaf_order() {
            let Some(j) = self.starving_job(q) else { continue };
            if let Some((w, victims)) = self.victims_for(j, q, &mut spared_until) {
                let suspend = self.config.evict == Evict::Suspend && self.can_suspend(w, j, q, &victims);
                let by = self.job(j).id;
                for run in victims {
                    if suspend {
                        self.suspend_run(run, by);
                    } else {
                        self.evict(run, j);
                    }
                }
                if let Some(old) = self.workers[w as usize].reserved.replace(j) {
                    self.job_mut(old).reserved_on = None;
                }
                self.job_mut(j).reserved_on = Some(w);
                self.dirty.insert(w);
                return true;
            }
        }
        // Nothing evicted, but a spared run could be later: try again then.
        if let Some(at) = spared_until
            && self.eviction_timer.is_none_or(|t| t > at || t <= self.now)
        {
            self.eviction_timer = Some(at);
            self.timers.insert((at, TimerSlot::Eviction));
        }
        false
    }

    /// The best job of queue `q`'s first tenant that waits in the global
    /// queue with no reservation.
    fn starving_job(&self, q: QueueIdx) -> Option<JobIdx> {
        let (_, tenant) = self.orders[q as usize].first()?;
        self.global
            .fronts(tenant)
            .filter(|&(_, _, j)| self.job(j).reserved_on.is_none() && self.job(j).gang.is_none())
            .min_by_key(|&(_, key, _)| key)
            .map(|(_, _, j)| j)
    }

    /// A worker and the runs to evict there so that job `j` of queue `q`
    /// fits, if any. On each worker the candidates of each action (preempt:
    /// runs of the same queue; reclaim: runs of other reclaimable queues, if
    /// `q` stays within its deserved share with the job) are narrowed by
    /// the tiers ([`Self::tier_victims`]); the victims are then taken, in
    /// eviction order, until the job fits.
    fn victims_for(
        &self,
        j: JobIdx,
        q: QueueIdx,
        spared_until: &mut Option<Millis>,
    ) -> Option<(WorkerIdx, Vec<RunId>)> {
        let job = self.job(j);
        let class = &self.classes[job.class as usize];
        let node = &self.quotas.nodes[q as usize];
        let mut with_job = node.allocated;
        with_job.add(class.amounts);
        let may_reclaim = self.config.reclaim && self.quotas.active() && with_job.within(&node.deserved);
        let usable = |worker: &Worker| {
            worker.alive
                && !worker.draining
                && worker.reserved.is_none()
                && worker.capable.get(job.class as usize).copied().unwrap_or(false)
        };
        // Evict nothing if the job fits somewhere already.
        if self.workers.iter().any(|worker| usable(worker) && worker.res.fits(&class.key, None)) {
            return None;
        }
        // The preemptor's tenant's dominant share with the job (for drf).
        let mut mine = self.tenants[job.tenant as usize].allocated;
        mine.add(class.amounts);
        let preemptor = Preemptor { priority: job.priority, share: mine.share_of(&self.total) };
        let (mut preempt, mut reclaim) = (Vec::new(), Vec::new());
        for (w, worker) in self.workers.iter().enumerate() {
            let w = w as WorkerIdx;
            if !usable(worker) {
                continue;
            }
            preempt.clear();
            reclaim.clear();
            for &run in &worker.runs {
                let r = self.run(run);
                // A suspended run holds no slot or CPU to give.
                let Some(v) = r.job.filter(|_| r.suspended.is_none()) else { continue };
                let victim = self.job(v);
                // The gang guard: while `gang` is listed, never a member.
                if self.policy.gang && victim.gang.is_some() {
                    continue;
                }
                let queue = self.tenants[r.tenant as usize].queue;
                // Eviction order: lowest priority first (if `priority` is
                // listed), then the most recently assigned.
                let order = (if self.policy.priority { victim.priority } else { 0 }, Reverse(run));
                let c =
                    Candidate { order, priority: victim.priority, class: r.class, tenant: r.tenant, queue };
                let own = self.config.preempt && queue == q;
                let other =
                    !own && may_reclaim && queue != q && self.quotas.nodes[queue as usize].reclaimable;
                if !own && !other {
                    continue;
                }
                // Too young to evict: spared until its exemption ends.
                let spared = Millis(r.at.0.saturating_add(self.config.eviction_exempt.0));
                if spared > self.now {
                    *spared_until = Some(spared_until.map_or(spared, |t| t.min(spared)));
                    continue;
                }
                if own {
                    preempt.push(c);
                } else {
                    reclaim.push(c);
                }
            }
            preempt.sort_unstable_by_key(|c| c.order);
            reclaim.sort_unstable_by_key(|c| c.order);
            let mut victims = self.tier_victims(Action::Preempt, &preempt, preemptor);
            victims.extend(self.tier_victims(Action::Reclaim, &reclaim, preemptor));
            victims.sort_unstable_by_key(|c| c.order);
            let mut res = worker.res.clone();
            let mut freed = Amounts::default();
            let mut taken = Vec::new();
            for c in victims {
                if res.fits(&class.key, None) {
                    break;
                }
                if c.queue == q {
                    freed.add(self.classes[c.class as usize].amounts);
                }
                res.release(&self.classes[c.class as usize].key);
                taken.push(c.order.1.0);
            }
            // The job's queue must admit it once its own victims are gone.
            let admitted = !self.quotas.active() || self.quotas.admits_freeing(q, freed, class.amounts);
            if !taken.is_empty() && admitted && res.fits(&class.key, None) {
                return Some((w, taken));
            }
        }
        None
    }

    /// The victims among one worker's `candidates` for `action` (in
    /// eviction order), with Volcano's tier semantics: in each tier that
    /// has a victim function for the action, a candidate is a victim if
    /// every such function of the tier accepts it; the first tier that
    /// finds any victim decides; a tier that finds none passes to the next.
    ///
    /// - `priority` (preempt): a lower priority than the preemptor's;
    /// - `drf` with `preemptable` (preempt): its tenant, without it and the
    ///   victims of that tenant before it, keeps a dominant share above the
    ///   preemptor's tenant's with the job; while `priority` is listed, never
    ///   a higher priority than the preemptor's (fairness does not override
    ///   priority, so the two rules cannot evict each other's jobs in turn);
    /// - `proportion` (reclaim): its queue, without it and the victims of
    ///   that queue before it, stays at or above its deserved share.
    ///
    /// The stateless rule (`priority`) is checked first, so the running
    /// totals of `drf` and `proportion` count only real victims: the result
    /// is the intersection, whatever the order within the tier.
    fn tier_victims(&self, action: Action, candidates: &[Candidate], preemptor: Preemptor) -> Vec<Candidate> {
        if candidates.is_empty() {
            return Vec::new();
        }
        for tier in &self.policy.victims {
            let applies = match action {
                Action::Preempt => tier.priority || tier.drf,
                Action::Reclaim => tier.proportion,
            };
            if !applies {
                continue;
            }
            let victims = self.tier_accepts(tier, action, candidates, preemptor);
            if !victims.is_empty() {
                return victims;
            }
        }
        Vec::new()
    }

    /// The candidates every victim function of `tier` for `action` accepts.
    fn tier_accepts(
        &self,
        tier: &VictimTier,
        action: Action,
        candidates: &[Candidate],
        preemptor: Preemptor,
    ) -> Vec<Candidate> {
        // What the victims chosen so far take from each tenant (drf) or
        // queue (proportion).
        let mut removed: BTreeMap<u32, Amounts> = BTreeMap::new();
        let mut victims = Vec::new();
        for c in candidates {
            let amounts = self.classes[c.class as usize].amounts;
            let (holder, held, at_least) = match action {
                Action::Preempt => {
                    if tier.priority && c.priority >= preemptor.priority {
                        continue;
                    }
                    if !tier.drf {
                        victims.push(*c);
                        continue;
                    }
                    if self.policy.priority && c.priority > preemptor.priority {
                        continue;
                    }
                    (c.tenant, self.tenants[c.tenant as usize].allocated, None)
                }
                Action::Reclaim => {
                    let node = &self.quotas.nodes[c.queue as usize];
                    (c.queue, node.allocated, Some(node.deserved))
                }
            };
            let mut after = held;
            after.sub(removed.get(&holder).copied().unwrap_or_default());
            after.sub(amounts);
            let keeps = match at_least {
                Some(deserved) => deserved.within(&after),
                None => after.share_of(&self.total) > preemptor.share,
            };
            if keeps {
                removed.entry(holder).or_default().add(amounts);
                victims.push(*c);
            }
        }
        victims
    }

    /// May the `victims` on worker `w` be suspended for job `j` of queue
    /// `q` rather than killed? Only if each has started and holds no named
    /// or exclusive tokens (a suspended run keeps its tokens, and a token
    /// it holds exclusively would block the preemptor or outlive the
    /// eviction indefinitely), and the job fits with the victims' slots and
    /// CPU given back while their memory stays taken (and its queue admits
    /// it with only that given back).
    fn can_suspend(&self, w: WorkerIdx, j: JobIdx, q: QueueIdx, victims: &[RunId]) -> bool {
        let mut res = self.workers[w as usize].res.clone();
        let mut freed = Amounts::default();
        for run in victims {
            let r = self.run(*run);
            let key = &self.classes[r.class as usize].key;
            if !r.started || !key.tokens.is_empty() {
                return false;
            }
            res.suspend(key);
            if self.tenants[r.tenant as usize].queue == q {
                freed.add(Amounts::new(key.slots, key.cpu, 0));
            }
        }
        let class = &self.classes[self.job(j).class as usize];
        res.fits(&class.key, None)
            && (!self.quotas.active() || self.quotas.admits_freeing(q, freed, class.amounts))
    }

    /// Evicts a run by suspension, for job `by`: the worker stops its
    /// processes, its slots and CPU go back to the worker (and its queue
    /// and tenant) at once, its memory and tokens stay taken, and its job
    /// stays running (its attempts unchanged) until the run is resumed.
    fn suspend_run(&mut self, run: RunId, by: JobId) {
        let r = self.runs.get_mut(&run).expect("victim in flight");
        r.suspended = Some(by);
        let (w, tenant, class) = (r.worker, r.tenant, r.class);
        self.workers[w as usize].res.suspend(&self.classes[class as usize].key);
        self.charge_suspension(tenant, class, true);
        self.suspended.insert(run);
        self.update_hungry(w);
        self.dirty.insert(w);
        self.decisions.push(Decision::Suspend { worker: self.workers[w as usize].id, run, by });
    }

    /// Resumes suspended runs, oldest run first, on workers that have room
    /// again for their slots and CPU (beside any job the worker is
    /// reserved for) and whose queues admit them. Called before the draws
    /// of a step, so a suspended run goes ahead of queued jobs: it cannot
    /// starve behind new work, and it never takes the room of the job it
    /// was evicted for, which holds it as long as it runs.
    fn resume_suspended(&mut self) {
        let waiting: Vec<RunId> = self.suspended.iter().copied().collect();
        for run in waiting {
            let r = self.run(run);
            let (w, tenant, class) = (r.worker, r.tenant, r.class);
            let worker = &self.workers[w as usize];
            let key = &self.classes[class as usize].key;
            let reserved_key = worker.reserved.map(|j| &self.classes[self.job(j).class as usize].key);
            if !worker.res.fits_resumed(key, reserved_key) {
                continue;
            }
            let queue = self.tenants[tenant as usize].queue;
            if self.quotas.active() && !self.quotas.admits(queue, Amounts::new(key.slots, key.cpu, 0), false)
            {
                continue;
            }
            self.workers[w as usize].res.resume(&self.classes[class as usize].key);
            self.charge_suspension(tenant, class, false);
            self.suspended.remove(&run);
            self.runs.get_mut(&run).expect("suspended run in flight").suspended = None;
            self.update_hungry(w);
            self.decisions.push(Decision::Resume { worker: self.workers[w as usize].id, run });
        }
    }

    /// Evicts a run for job `by`: its job goes back to the queues with its
    /// attempts, and the worker is told to stop (or drop) the run.
    fn evict(&mut self, run: RunId, by: JobIdx) {
        let theirs = self.tenants[self.job(by).tenant as usize].queue;
        let r = self.runs.get_mut(&run).expect("victim in flight");
        let Some(j) = r.job.take() else { return };
        let mine = self.tenants[r.tenant as usize].queue;
        let (worker, started) = (self.workers[r.worker as usize].id, r.started);
        self.decisions.push(if started {
            Decision::Stop { worker, run }
        } else {
            Decision::Drop { worker, run }
        });
        let reason = if mine == theirs {
            "evicted (preempted) for another job of its queue".to_owned()
        } else {
            let queue = &self.quotas.nodes[theirs as usize].name;
            format!("evicted (reclaimed) for a job of queue {queue}, below its share")
        };
        // The evicted run does not count against the job's attempts.
        let job = self.job_mut(j);
        job.attempts = job.attempts.saturating_sub(1);
        let requeued = Decision::Requeued { job: job.id, attempts: job.attempts, reason };
        self.decisions.push(requeued);
        self.enqueue(j);
    }

    /// Places waiting gangs, oldest first. A gang that has not started is a
    /// statement: each member is tentatively given a worker where it fits
    /// now (taking that worker's resources and its queue's quota, so the
    /// next member sees them taken); then, if at least `min` members found
    /// one, every tentative placement becomes an assignment, else every one
    /// is undone in reverse and nothing changed. A partial gang therefore
    /// never holds resources, and two gangs cannot deadlock each other. The
    /// members of a started gang are placed one by one as they fit.
    fn place_gangs(&mut self) {
        let Some(&(least, _)) = self.waiting_gangs.first() else { return };
        // Each member placed takes a slot of an idle worker, beside its
        // reservation if it has one: a gang that needs more at once than
        // there are such slots cannot start now, and is not tried (in a
        // busy cluster, that is every gang that needs more than one, on
        // every step). Oldest gang first, as always.
        let mut room = self.gang_room();
        if room < least {
            return;
        }
        let mut ready: Vec<GangIdx> = self.waiting_gangs.range(..(room + 1, 0)).map(|&(_, g)| g).collect();
        ready.sort_unstable();
        for g in ready {
            let gang = &self.gangs[&g];
            let need = if gang.started { 1 } else { gang.min };
            // What earlier gangs of this step took is gone.
            if need > room {
                continue;
            }
            let members: Vec<JobIdx> = gang.queued.iter().map(|&(_, j)| j).collect();
            let mut statement: Vec<(WorkerIdx, JobIdx)> = Vec::new();
            // The tentative charges cancel out: they move no deserved amount.
            let requests_changed = self.quotas.dirty;
            for j in members {
                if let Some(w) = self.tentative_slot(j) {
                    statement.push((w, j));
                }
            }
            for &(w, j) in statement.iter().rev() {
                self.undo_tentative(w, j);
            }
            self.quotas.dirty = requests_changed;
            if statement.len() as u32 >= need {
                room = room.saturating_sub(statement.len() as u32);
                self.change_gang(g, |gang| gang.started = true);
                for (w, j) in statement {
                    self.assign(w, j);
                }
            }
        }
    }

    /// At most how many gang members could be placed at once now: the free
    /// slots of the idle workers beside their reservations, counting only
    /// workers with room there for the smallest request of any class.
    fn gang_room(&self) -> u32 {
        let Some(least) = ClassKey::least(self.classes.iter().map(|c| &c.key)) else { return 0 };
        self.hungry
            .iter()
            .map(|&w| {
                let worker = &self.workers[w as usize];
                let reserved = worker.reserved.map(|r| &self.classes[self.job(r).class as usize].key);
                if worker.res.fits(&least, reserved) { worker.res.free_slots_beside(reserved) } else { 0 }
            })
            .sum()
    }

    /// Changes gang `g` with `f`, keeping [`Self::waiting_gangs`] in step.
    fn change_gang<R>(&mut self, g: GangIdx, f: impl FnOnce(&mut Gang) -> R) -> R {
        let gang = self.gangs.get_mut(&g).expect("live gang");
        let before = gang.waits();
        let result = f(gang);
        let after = gang.waits();
        if before != after {
            if let Some(n) = before {
                self.waiting_gangs.remove(&(n, g));
            }
            if let Some(n) = after {
                self.waiting_gangs.insert((n, g));
            }
        }
        result
    }

    /// A worker where job `j` fits now, with its resources and its queue's
    /// quota tentatively taken (see [`Self::undo_tentative`]).
    fn tentative_slot(&mut self, j: JobIdx) -> Option<WorkerIdx> {
        let job = self.job(j);
        let (class, queue) = (job.class as usize, self.tenants[job.tenant as usize].queue);
        let amounts = self.classes[class].amounts;
        if self.quotas.active() && !self.quotas.admits(queue, amounts, false) {
            return None;
        }
        let w = self.hungry.iter().copied().find(|&w| {
            let worker = &self.workers[w as usize];
            let reserved_key = worker.reserved.map(|r| &self.classes[self.job(r).class as usize].key);
            worker.capable.get(class).copied().unwrap_or(false)
                && worker.res.fits(&self.classes[class].key, reserved_key)
        })?;
        self.workers[w as usize].res.take(&self.classes[class].key);
        self.quotas.charge(queue, |node| node.allocated.add(amounts));
        Some(w)
    }

    /// Gives back what [`Self::tentative_slot`] took.
    fn undo_tentative(&mut self, w: WorkerIdx, j: JobIdx) {
        let job = self.job(j);
        let (class, queue) = (job.class as usize, self.tenants[job.tenant as usize].queue);
        let amounts = self.classes[class].amounts;
        self.workers[w as usize].res.release(&self.classes[class].key);
        self.quotas.charge(queue, |node| node.allocated.sub(amounts));
    }

    /// The active leaf queues in queue order (the tiers' queue rules, then
    /// the queue's index).
    fn leaf_order(&self) -> Vec<QueueKey> {
        self.queue_order.clone()
    }

    /// Chooses the next job for worker `w`: the queue order picks the queue,
    /// the job order inside it the tenant, locality the local or global
    /// queue, and resources filter the classes. See ARCHITECTURE.md.
    ///
    /// Each queue's tenants are walked in order and the walk stops at the
    /// first that has a job this worker can take (or reserve room for). In a
    /// busy cluster that is the first or second tenant, since the global
    /// queue offers every tenant's jobs. Each step costs one lookup per
    /// worker queue.
    ///
    /// Also says whether the draw passed over a queue or a job for a
    /// capability (queues without a capability never do).
    fn draw(&mut self, w: WorkerIdx) -> (Option<Pick>, bool) {
        let mut buffers = std::mem::take(&mut self.draw_buffers);
        let pick = self.draw_with(w, &mut buffers);
        let capped = buffers.capped;
        buffers.clear();
        self.draw_buffers = buffers;
        (pick, capped)
    }

    /// [`Self::draw`], with its working lists in `buffers`.
    fn draw_with(&mut self, w: WorkerIdx, buffers: &mut DrawBuffers) -> Option<Pick> {
        let DrawBuffers { usable, leaves, fronts, fitting, barren, capped } = buffers;
        let worker = &self.workers[w as usize];
        let reserved_key = worker.reserved.map(|j| &self.classes[self.job(j).class as usize].key);
        // The classes this worker could take, or reserve room for, now: those
        // it can run, and with a reservation only those that fit beside it.
        usable.extend(self.classes.iter().enumerate().map(|(c, class)| {
            worker.capable.get(c).copied().unwrap_or(false)
                && (reserved_key.is_none() || worker.res.fits(&class.key, reserved_key))
        }));
        // If no usable class has a job in any of the worker's three queues,
        // no tenant has anything for it, and the walk below would visit
        // every tenant to find that out. (A worker holding a reservation, or
        // with little room left, draws often for nothing.)
        let queued =
            |c: ClassIdx| worker.first.has_class(c) || worker.second.has_class(c) || self.global.has_class(c);
        if !usable.iter().enumerate().any(|(c, &ok)| ok && queued(c as ClassIdx)) {
            return None;
        }
        let usable_mask = usable
            .iter()
            .enumerate()
            .filter(|(_, ok)| **ok)
            .fold(0, |m, (c, _)| m | class_bit(c as ClassIdx));
        let quotas = self.quotas.active();
        let mut read_any = false;
        leaves.extend(self.queue_order.iter().copied());
        // With quotas (and proportion), first only what keeps every queue
        // within its deserved share; then, so that no slot idles, what stays
        // within capabilities.
        let phases: &[bool] = if quotas && self.policy.proportion { &[true, false] } else { &[false] };
        for &within_deserved in phases {
            for &(_, q) in leaves.iter() {
                // Nothing queued in this queue is of a class the worker
                // could take. (Classes past the 63rd share a bit: such a
                // queue is walked.)
                if self.queue_masks[q as usize] & usable_mask == 0 {
                    continue;
                }
                // Every job takes a slot: a queue without room for one more
                // has nothing to offer in this phase.
                if quotas && !self.quotas.admits(q, Amounts::new(1, 0, 0), within_deserved) {
                    *capped |= !within_deserved;
                    continue;
                }
                let mut after: Option<TenantKey> = None;
                loop {
                    let order = &self.orders[q as usize];
                    let next = match after {
                        None => order.first(),
                        Some(key) => order.after(&key),
                    };
                    let Some(key) = next else { break };
                    after = Some(key);
                    if !within_deserved && barren.contains(&key.1) {
                        continue;
                    }
                    // A tenant with no queued job of a usable class has no
                    // front worth reading. (Classes past the 63rd share the
                    // mask's last bit: those are counted one by one, as a
                    // workload with many classes meets them on every draw.)
                    let tenant = &self.tenants[key.1 as usize];
                    let common = tenant.class_mask & usable_mask;
                    let shared = SHARED_BIT as usize;
                    if common == 0
                        || (common == class_bit(SHARED_BIT)
                            && !tenant.classes[shared..]
                                .iter()
                                .zip(&usable[shared..])
                                .any(|(&n, &ok)| n > 0 && ok))
                    {
                        continue;
                    }
                    // Once one tenant's fronts gave nothing, the walk may
                    // pass many more such (queues below their share whose
                    // jobs this worker cannot run): the classes each has in
                    // this worker's three queues (the global queue's mask,
                    // and the local queues' together: see `local_masks`)
                    // spare a read of its fronts. Without queues the first tenant
                    // usually gives a job, and its fronts are read without
                    // the check; with queues the first is the one furthest
                    // below its share, often for want of a worker that can
                    // run its jobs, and is checked too.
                    let worker = &self.workers[w as usize];
                    let local = |t: TenantIdx| {
                        if quotas {
                            worker.local_masks.get(t as usize).copied().unwrap_or(0)
                        } else {
                            worker.first.class_mask(t) | worker.second.class_mask(t)
                        }
                    };
                    if (read_any || quotas)
                        && (self.global.class_mask(key.1) | local(key.1)) & usable_mask == 0
                    {
                        continue;
                    }
                    read_any = true;
                    fronts.clear();
                    self.live_fronts(w, key.1, fronts);
                    let worker = &self.workers[w as usize];
                    let reserved_key = worker.reserved.map(|j| &self.classes[self.job(j).class as usize].key);
                    fitting.clear();
                    let mut reserve = None;
                    let mut promising = false;
                    // The tenant's own turn: its best job by the job order
                    // among those this worker could run, and whether it
                    // fits here now.
                    let mut turn: Option<(JobKey, JobIdx, bool)> = None;
                    for &(place, class, key, j) in fronts.iter() {
                        if !worker.capable.get(class as usize).copied().unwrap_or(false) {
                            continue;
                        }
                        let class = &self.classes[class as usize];
                        let fits = worker.res.fits(&class.key, reserved_key);
                        promising |= fits || (worker.reserved.is_none() && self.job(j).reserved_on.is_none());
                        if quotas && !self.quotas.admits(q, class.amounts, within_deserved) {
                            *capped |= !within_deserved;
                            continue;
                        }
                        if turn.is_none_or(|(best, _, _)| key < best) {
                            turn = Some((key, j, fits));
                        }
                        if fits {
                            match fitting.last_mut() {
                                Some(best) if best.0 == place => *best = (*best).min((place, key, j)),
                                _ => fitting.push((place, key, j)),
                            }
                        } else if worker.reserved.is_none()
                            && reserve.is_none()
                            && self.job(j).reserved_on.is_none()
                        {
                            reserve = Some(j);
                        }
                    }
                    // Within the tenant too, the job whose turn it is
                    // comes first: if it does not fit here now, this worker
                    // reserves room for it (unless it or the job already
                    // holds a reservation), rather than giving the room to
                    // jobs behind it, which would pass over a larger job
                    // for as long as smaller ones keep coming. With
                    // preemption on, a turn job of a higher priority than
                    // every fitting one is left unreserved instead: it is
                    // then a starving job, which evicts lower-priority runs
                    // for its room (a reserved job evicts nothing).
                    if let Some((key, j, false)) = turn
                        && worker.reserved.is_none()
                        && self.job(j).reserved_on.is_none()
                        && !(self.config.preempt
                            && fitting.iter().map(|f| f.1.order[0]).min().is_some_and(|p| key.order[0] < p))
                    {
                        return Some(Pick::Reserve(j));
                    }
                    // Locality: a uniform draw among the worker queues
                    // offering this tenant a fitting job that is best by the
                    // first job rule (its highest priority, by default):
                    // distbuild's random choice among the three queues;
                    // within the queue, the tenant's best job. (Comparing
                    // the remaining path across queues too made first
                    // builds slower: see BENCHMARKS.md, "Makespan".)
                    if let Some(p) = fitting.iter().map(|f| f.1.order[0]).min() {
                        fitting.retain(|f| f.1.order[0] == p);
                        let pick = match fitting.len() {
                            1 => fitting[0].2,
                            n => fitting[self.rng.below(n)].2,
                        };
                        return Some(Pick::Run(pick));
                    }
                    // Fairness first: if the tenant whose turn it is has
                    // nothing that fits here now, this worker reserves room
                    // for its job (one reservation per worker), unless
                    // another worker already does.
                    if let Some(j) = reserve {
                        return Some(Pick::Reserve(j));
                    }
                    if within_deserved && !promising {
                        barren.push(key.1);
                    }
                }
            }
        }
        None
    }

    /// The first live job of each class `tenant` has in each of worker
    /// `w`'s three queues, into `out`; dead entries met there are dropped.
    fn live_fronts(&mut self, w: WorkerIdx, tenant: TenantIdx, out: &mut Vec<Front>) {
        let Scheduler { global, workers, queue_counts, eras, .. } = self;
        let worker = &mut workers[w as usize];
        let [first, second] = &mut queue_counts[w as usize];
        for (place, queue, counts) in
            [(Place::First(w), &mut worker.first, first), (Place::Second(w), &mut worker.second, second)]
        {
            queue.fronts(counts, tenant, live_entry(eras), |class, key, j| out.push((place, class, key, j)));
        }
        // Both queues' masks for the tenant are at hand: trim its bits.
        if let Some(mask) = worker.local_masks.get_mut(tenant as usize) {
            *mask = worker.first.class_mask(tenant) | worker.second.class_mask(tenant);
        }
        out.extend(global.fronts(tenant).map(|(class, key, j)| (Place::Global, class, key, j)));
    }

    fn assign(&mut self, w: WorkerIdx, j: JobIdx) {
        // Moving a job from queued to running leaves every queue's request
        // (held plus queued) as it was: deserved shares need no update.
        let requests_changed = self.quotas.dirty;
        self.unqueue(j);
        let run = RunId(self.next_run);
        self.next_run += 1;
        self.serve_clock += 1;
        let serve_clock = self.serve_clock;
        let job = self.jobs[j as usize].as_mut().expect("live job");
        job.attempts += 1;
        job.state = JobState::Assigned(run);
        let (class, tenant, id, attempt) = (job.class, job.tenant, job.id, job.attempts);
        self.tenants[tenant as usize].served = serve_clock;
        self.charge_run(tenant, class, true);
        self.quotas.dirty = requests_changed;
        let worker = &mut self.workers[w as usize];
        worker.res.take(&self.classes[class as usize].key);
        worker.runs.push(run);
        let worker_id = worker.id;
        self.runs.insert(
            run,
            Run {
                worker: w,
                tenant,
                class,
                job_id: id,
                job: Some(j),
                started: false,
                suspended: None,
                at: self.now,
            },
        );
        self.update_hungry(w);
        self.decisions.push(Decision::Assign { worker: worker_id, job: id, run, attempt });
    }

    // ------------------------------------------------------------------
    // Interning and access
    // ------------------------------------------------------------------

    fn intern_tenant(&mut self, name: &str, queue: QueueIdx) -> TenantIdx {
        if let Some(&t) = self.tenant_index.get(&(name.to_owned(), queue)) {
            return t;
        }
        let t = self.tenants.len() as TenantIdx;
        self.tenants.push(Tenant {
            name: name.to_owned(),
            served: 0,
            queue,
            placed: 0,
            priorities: BTreeMap::new(),
            classes: Vec::new(),
            class_mask: 0,
            allocated: Amounts::default(),
            filed: None,
        });
        self.tenant_index.insert((name.to_owned(), queue), t);
        t
    }

    fn intern_token(&mut self, name: &str) -> TokenIdx {
        if let Some(&t) = self.token_index.get(name) {
            return t;
        }
        let t = self.tokens.len() as TokenIdx;
        self.tokens.push(name.to_owned());
        self.token_index.insert(name.to_owned(), t);
        t
    }

    fn intern_class(&mut self, spec: &JobSpec) -> ClassIdx {
        let mut tokens: BTreeMap<TokenIdx, u64> = BTreeMap::new();
        for (name, &amount) in &spec.request.tokens {
            if amount > 0 {
                let t = self.intern_token(name);
                tokens.insert(t, amount);
            }
        }
        let mut exclusive = Vec::new();
        for name in &spec.exclusive {
            let t = self.intern_token(name);
            // Holding a token exclusively takes at least one of it.
            let amount = tokens.entry(t).or_insert(1);
            *amount = (*amount).max(1);
            exclusive.push(t);
        }
        exclusive.sort();
        exclusive.dedup();
        let key = ClassKey {
            slots: spec.request.slots,
            cpu: spec.request.cpu,
            memory: spec.request.memory,
            tokens: tokens.into_iter().collect(),
            exclusive,
            labels: spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        if let Some(&c) = self.class_index.get(&key) {
            return c;
        }
        let c = self.classes.len() as ClassIdx;
        let mut capable = 0;
        for worker in &mut self.workers {
            let ok = worker.alive && worker.res.capable(&key);
            worker.capable.push(ok);
            capable += u32::from(ok);
        }
        let amounts = Amounts::new(key.slots, key.cpu, key.memory);
        self.classes.push(Class { key: key.clone(), amounts, capable });
        self.class_index.insert(key, c);
        c
    }

    fn run(&self, run: RunId) -> &Run {
        self.runs.get(&run).expect("run in flight")
    }

    /// The live job with ID `id`.
    fn lookup(&self, id: &JobId) -> Option<JobIdx> {
        self.job_index.get(id, |j| &self.job(j).id)
    }

    fn job(&self, j: JobIdx) -> &Job {
        self.jobs[j as usize].as_ref().expect("live job")
    }

    fn job_mut(&mut self, j: JobIdx) -> &mut Job {
        self.jobs[j as usize].as_mut().expect("live job")
    }
}

/// The local queue at `place`, with its counts (see [`QueueCounts`]);
/// `None` for the global queue.
fn local_queue<'a>(
    workers: &'a mut [Worker],
    counts: &'a mut [[QueueCounts; 2]],
    place: Place,
) -> Option<(&'a mut Queue, &'a mut QueueCounts)> {
    let (w, second) = match place {
        Place::First(w) => (w, false),
        Place::Second(w) => (w, true),
        Place::Global => return None,
    };
    let worker = &mut workers[w as usize];
    let [first_counts, second_counts] = &mut counts[w as usize];
    Some(if second { (&mut worker.second, second_counts) } else { (&mut worker.first, first_counts) })
}

/// Whether `holders` lists worker `w` as a holder of artifact `a`.
fn holds(holders: &IdMap<Holders>, w: WorkerIdx, a: &JobId) -> bool {
    holders.get(a).is_some_and(|ws| ws.binary_search(&w).is_ok())
}

/// The liveness test of a queue entry (see `queue.rs`, "Leaving the local
/// queues lazily"): its slot's job has not left the queues, nor the slot
/// been freed, since the entry was filed (same era).
fn live_entry(eras: &[Era]) -> impl Fn(JobIdx, Era) -> bool + '_ {
    move |j, era| eras[j as usize] == era
}

/// A duration for people: `45s`, `4m30s`, `2h5m`, `850ms`.
fn duration(millis: u64) -> String {
    let s = millis / 1000;
    match s {
        0 => format!("{millis}ms"),
        1..60 => format!("{s}s"),
        60..3600 if s.is_multiple_of(60) => format!("{}m", s / 60),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// CPU for people to read: whole cores as such (`4 CPUs`), else
/// millicores (`500m CPU`).
pub(crate) fn cpu(millis: u64) -> String {
    match millis {
        1000 => "1 CPU".to_owned(),
        m if m.is_multiple_of(1000) => format!("{} CPUs", m / 1000),
        m => format!("{m}m CPU"),
    }
}

/// A size for people to read, in binary units to a tenth: `1.5 GiB`,
/// `512 B`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && n >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    let tenths = u128::from(n) * 10 / (1u128 << (10 * unit));
    if tenths.is_multiple_of(10) || unit == 0 {
        format!("{} {}", tenths / 10, UNITS[unit])
    } else {
        format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::{bytes, cpu};

    #[test]
    fn amounts_are_written_for_people() {
        assert_eq!([cpu(0), cpu(1000), cpu(2000), cpu(500)], ["0 CPUs", "1 CPU", "2 CPUs", "500m CPU"]);
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(25_276_510_208), "23.5 GiB");
        assert_eq!(bytes(989_560_464_998_400), "900 TiB");
        assert_eq!(bytes(u64::MAX), "16383.9 PiB", "rounded down");
    }
}
