//! Identifiers, resource shapes and the values that cross the core's boundary.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A point in time or a duration, in milliseconds. The core never reads a clock:
/// the caller passes `now` with every event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Millis(pub u64);

impl Millis {
    /// `self + d`, saturating at the far future.
    pub fn after(self, d: Millis) -> Millis {
        Millis(self.0.saturating_add(d.0))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// The content ID of a job: a digest of its commands, environment, inputs and
/// dependency IDs, computed outside the core. The output of a job is fully
/// determined by its ID, so the ID also names the job's artifact.
///
/// Serialized as its 32 numbers in a human-readable format (JSON), and as
/// 32 bytes in a binary one (a snapshot's CBOR: a third of the size).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub [u8; 32]);

impl Serialize for JobId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { self.0.serialize(s) } else { s.serialize_bytes(&self.0) }
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = JobId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("32 bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<JobId, E> {
                v.try_into().map(JobId).map_err(|_| E::invalid_length(v.len(), &self))
            }
        }
        if d.is_human_readable() { <[u8; 32]>::deserialize(d).map(JobId) } else { d.deserialize_bytes(Bytes) }
    }
}

impl JobId {
    /// A readable ID for tests and tools: the name's bytes, zero-padded (names
    /// longer than 32 bytes are truncated).
    pub fn named(name: &str) -> JobId {
        let mut bytes = [0u8; 32];
        let n = name.len().min(32);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        JobId(bytes)
    }

    /// Full lowercase hex form.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            s.push(char::from_digit(u32::from(b & 15), 16).unwrap_or('0'));
        }
        s
    }
}

impl fmt::Display for JobId {
    /// IDs made by [`JobId::named`] print as their name; digests print as the
    /// first 12 hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(32);
        let printable = end > 0
            && self.0[end..].iter().all(|&b| b == 0)
            && self.0[..end].iter().all(|b| b.is_ascii_graphic());
        if printable {
            f.write_str(std::str::from_utf8(&self.0[..end]).unwrap_or("?"))
        } else {
            f.write_str(&self.to_hex()[..12])
        }
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

/// A worker, as numbered by the shell (stable across restarts: it is persisted
/// with the events that mention it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerId(pub u64);

/// Someone waiting for a job's completion (a build's use of the job). One job
/// may have many waiters; it is cancelled only when the last one cancels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WaiterId(pub u64);

/// One attempt of a job on a worker. Every assignment gets a fresh run ID, so
/// late reports about an earlier attempt can never be mistaken for the current
/// one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(pub u64);

/// What a worker offers. CPU is in millicores, memory in bytes; `tokens` are
/// named counted resources such as `network = 2` or `gpu = 1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// How many jobs may run at once.
    pub slots: u32,
    /// Millicores.
    pub cpu: u64,
    /// Bytes.
    pub memory: u64,
    /// Named counted resources.
    pub tokens: BTreeMap<String, u64>,
}

/// What a job asks for. `slots` is normally 1.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Request {
    /// Slots taken while the job runs (at least 1).
    pub slots: u32,
    /// Millicores.
    pub cpu: u64,
    /// Bytes.
    pub memory: u64,
    /// Named counted resources.
    pub tokens: BTreeMap<String, u64>,
}

impl Default for Request {
    fn default() -> Self {
        Request { slots: 1, cpu: 0, memory: 0, tokens: BTreeMap::new() }
    }
}

/// Everything the core needs to know about a job. The commands themselves never
/// enter the core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Content ID (also the ID of the job's artifact).
    pub id: JobId,
    /// The tenant (repository or team) the job is run for.
    pub tenant: String,
    /// IDs of the jobs whose artifacts this job reads. The caller schedules a
    /// job once its dependencies have succeeded; the core uses the list for
    /// locality only.
    pub deps: Vec<JobId>,
    /// Resources taken while it runs.
    pub request: Request,
    /// Named tokens taken exclusively on the worker: no other job may use them
    /// there at the same time. Each must be offered by the worker.
    pub exclusive: Vec<String>,
    /// Worker labels the job requires (`os = linux`).
    pub labels: BTreeMap<String, String>,
    /// Higher runs first within its tenant.
    pub priority: i32,
    /// Expected work left on the longest path from this job to the end of
    /// its build, the job itself included (any unit; the solver uses
    /// milliseconds). Among a tenant's jobs of equal priority, the longest
    /// path goes first: critical path first.
    #[serde(default)]
    pub path: u64,
    /// Attempts allowed when workers are lost under it (at least 1).
    pub max_attempts: u32,
    /// The leaf queue it goes to; when unset, its tenant's queue
    /// ([`Config::tenant_queues`]), else the `default` queue.
    #[serde(default)]
    pub queue: Option<String>,
    /// The gang it belongs to: it starts only together with enough of the
    /// gang's other jobs.
    #[serde(default)]
    pub gang: Option<GangSpec>,
}

/// Membership of a gang: jobs that start all at once or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangSpec {
    /// Names the gang; unique per gang instance (the caller makes it so,
    /// e.g. with the build's ID). Every member gives the same `min_available`.
    pub id: String,
    /// The gang starts once this many of its jobs can start at the same
    /// moment (at least 1).
    pub min_available: u32,
}

impl JobSpec {
    /// A spec with default resources, no labels and no dependencies.
    pub fn new(id: JobId, tenant: &str) -> JobSpec {
        JobSpec {
            id,
            tenant: tenant.to_owned(),
            deps: Vec::new(),
            request: Request::default(),
            exclusive: Vec::new(),
            labels: BTreeMap::new(),
            priority: 0,
            path: 0,
            max_attempts: 3,
            queue: None,
            gang: None,
        }
    }
}

/// How a run ended, as the worker reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobResult {
    /// The job succeeded: its artifact is now on the worker.
    pub success: bool,
    /// The exit code of the failing command (or 0), if a command ran.
    pub exit_code: Option<i32>,
    /// The result was found in the worker's cache; nothing executed.
    pub cached: bool,
    /// Free-form detail for people (the tail of stderr, an error message).
    pub detail: String,
}

impl JobResult {
    /// A successful run with exit code 0.
    pub fn ok() -> JobResult {
        JobResult { success: true, exit_code: Some(0), cached: false, detail: String::new() }
    }

    /// A failed run with the given exit code.
    pub fn failed(exit_code: i32) -> JobResult {
        JobResult { success: false, exit_code: Some(exit_code), cached: false, detail: String::new() }
    }
}

/// An input to the core. The shell persists every accepted event, in order,
/// with the `now` it was handled at; replaying them rebuilds the same state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A worker registers (or re-registers) with its capacity, labels and the
    /// artifacts already in its cache. Its lease starts now.
    WorkerJoined {
        /// The shell's number for the worker.
        worker: WorkerId,
        /// For people and reasons.
        name: String,
        /// What it offers.
        capacity: Capacity,
        /// Its labels.
        labels: BTreeMap<String, String>,
        /// Artifacts in its cache.
        artifacts: Vec<JobId>,
    },
    /// The worker renews its lease.
    Heartbeat {
        /// Who.
        worker: WorkerId,
    },
    /// The worker leaves (or the shell gives up on it): same as a missed lease.
    WorkerLeft {
        /// Who.
        worker: WorkerId,
    },
    /// The shell found the worker gone (its address refuses connections)
    /// before its lease ran out: it is lost at once, as if its lease had.
    WorkerUnreachable {
        /// Who.
        worker: WorkerId,
    },
    /// The worker is shutting down once its runs end: it keeps its lease,
    /// runs and artifacts, but is assigned nothing new (and holds no
    /// reservation) until it registers again.
    WorkerDraining {
        /// Who.
        worker: WorkerId,
    },
    /// Artifacts appeared in the worker's cache (any job's, scheduled or not).
    ArtifactsAdded {
        /// Where.
        worker: WorkerId,
        /// Which.
        artifacts: Vec<JobId>,
    },
    /// Artifacts left the worker's cache.
    ArtifactsEvicted {
        /// Where.
        worker: WorkerId,
        /// Which.
        artifacts: Vec<JobId>,
    },
    /// Run a job for a waiter. A job already pending or running gains a waiter
    /// instead of a second copy.
    Schedule {
        /// The job.
        spec: JobSpec,
        /// Who waits for it.
        waiter: WaiterId,
    },
    /// Wait for a job already pending or running: what `Schedule` does for
    /// a known job, without building its spec again. `UnknownJob` if there
    /// is none (the caller then schedules it).
    Join {
        /// The job.
        job: JobId,
        /// Who waits for it.
        waiter: WaiterId,
    },
    /// The job now belongs to `tenant` (and the queue it names, if any),
    /// as if that tenant had scheduled it: the shell says so when the
    /// waiter whose tenant it had leaves and another still waits. A queued
    /// job moves to that tenant's queue (and is checked against its
    /// capability there); a job already assigned or running keeps its run,
    /// charged where it started. Nothing changes for a job that belongs
    /// there already.
    Rehome {
        /// The job.
        job: JobId,
        /// Its new tenant.
        tenant: String,
        /// The queue that tenant named for it, if any.
        queue: Option<String>,
    },
    /// The waiter no longer needs the job.
    Cancel {
        /// The job.
        job: JobId,
        /// Who gives up on it.
        waiter: WaiterId,
    },
    /// The worker started an assigned run.
    JobStarted {
        /// The run.
        run: RunId,
    },
    /// A run ended (including runs that were stopped or dropped).
    JobExited {
        /// The run.
        run: RunId,
        /// How it ended.
        result: JobResult,
    },
    /// The run's worker no longer has it (it restarted, or lost track of it),
    /// or failed it for a fault of its own (its disk):
    /// the job is requeued as if the worker had been lost under it.
    RunLost {
        /// The run.
        run: RunId,
    },
    /// The shell was down and is back: time stood still for the cluster
    /// meanwhile, so every pending deadline (leases, locality waits) moves
    /// later by the time passed since the last event, and none fires for it.
    Resumed,
    /// Nothing but the passage of time: fires due timers.
    Tick,
}

/// Why a job was given up without a result from a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailReason {
    /// No registered worker could ever run it (labels, resources or tokens).
    Unplaceable(String),
    /// Workers were lost under it as many times as it allows.
    TooManyAttempts {
        /// Attempts made.
        attempts: u32,
        /// The last worker lost, by name.
        last_worker: String,
    },
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::Unplaceable(why) => write!(f, "no worker can run this job: {why}"),
            FailReason::TooManyAttempts { attempts, last_worker } => {
                write!(f, "gave up after {attempts} attempt(s): lost worker {last_worker} while running it")
            }
        }
    }
}

/// The end of a job, delivered to all its waiters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Completion {
    /// A worker reported a result (success or failure).
    Ran(JobResult),
    /// The core gave up on it.
    GaveUp(FailReason),
}

/// The stage a job was in when it was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelStage {
    /// In the queues: removed, nothing to tell a worker.
    Queued,
    /// Sent to a worker that has not reported it started: the worker drops it.
    Assigned,
    /// Running: the worker stops it.
    Running,
}

/// An output of the core, for the shell to act on after persisting the events
/// that caused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Start `job` on `worker` as `run`.
    Assign {
        /// Where.
        worker: WorkerId,
        /// What.
        job: JobId,
        /// The new run's ID; the worker reports with it.
        run: RunId,
        /// 1 for the first attempt.
        attempt: u32,
    },
    /// The worker must not start this assigned run (it was cancelled first).
    Drop {
        /// Where.
        worker: WorkerId,
        /// Which run.
        run: RunId,
    },
    /// The worker must stop this running run.
    Stop {
        /// Where.
        worker: WorkerId,
        /// Which run.
        run: RunId,
    },
    /// The job ended; every waiter gets the completion.
    Finished {
        /// The job.
        job: JobId,
        /// Everyone waiting for it, in the order they arrived.
        waiters: Vec<WaiterId>,
        /// How it ended.
        completion: Completion,
    },
    /// The job's last waiter cancelled it.
    Cancelled {
        /// The job.
        job: JobId,
        /// Where it was.
        stage: CancelStage,
    },
    /// A worker was lost; its runs were requeued or given up.
    WorkerLost {
        /// Who.
        worker: WorkerId,
    },
    /// Eviction by suspension ([`Evict::Suspend`]): the worker must stop
    /// this running run's processes (SIGSTOP). The run keeps its memory,
    /// tokens and files on the worker; its slot and CPU go to the job that
    /// evicted it.
    Suspend {
        /// Where.
        worker: WorkerId,
        /// Which run.
        run: RunId,
        /// The job it was evicted for.
        by: JobId,
    },
    /// The worker again has room for a run suspended by an eviction: it
    /// must continue it (SIGCONT).
    Resume {
        /// Where.
        worker: WorkerId,
        /// Which run.
        run: RunId,
    },
    /// A run was lost with its worker (or evicted); the job is queued
    /// again.
    Requeued {
        /// The job.
        job: JobId,
        /// Attempts made so far.
        attempts: u32,
        /// Why, for people: "worker w2 missed its lease (nothing heard for
        /// 10s)", "worker w2 left", "evicted …".
        reason: String,
    },
}

/// Why an event was refused. A refused event changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The worker never registered, or was lost.
    #[error("unknown or lost worker {0:?}")]
    UnknownWorker(WorkerId),
    /// No such run is in flight.
    #[error("unknown run {0:?}")]
    UnknownRun(RunId),
    /// The job is not pending or running.
    #[error("job {0} is not pending or running")]
    UnknownJob(JobId),
    /// The waiter is not waiting for that job.
    #[error("{waiter:?} is not waiting for job {job}")]
    NotWaiting {
        /// The job.
        job: JobId,
        /// The waiter.
        waiter: WaiterId,
    },
    /// The waiter already waits for that job.
    #[error("{waiter:?} already waits for job {job}")]
    AlreadyWaiting {
        /// The job.
        job: JobId,
        /// The waiter.
        waiter: WaiterId,
    },
    /// The job spec is malformed.
    #[error("invalid job {job}: {why}")]
    InvalidSpec {
        /// The job.
        job: JobId,
        /// What is wrong.
        why: String,
    },
    /// A re-registration would leave the worker over-committed.
    #[error("worker {0:?} cannot shrink below what it is running")]
    CapacityBelowUsage(WorkerId),
    /// The run was already reported as started.
    #[error("run {0:?} already started")]
    AlreadyStarted(RunId),
    /// New queues, tenant mapping or tiers while jobs are queued or runs
    /// in flight (see [`crate::Scheduler::reconfigure`]).
    #[error(
        "{changed} changed, and those cannot change while jobs are queued or running (now: {jobs} queued or running, {runs} runs in flight)"
    )]
    Busy {
        /// What changed: "the queues", "the tenants' queues", "the tiers"
        /// (joined with "and").
        changed: String,
        /// Jobs the core holds.
        jobs: u64,
        /// Runs in flight.
        runs: u64,
    },
}

/// The core's settings. Changing them changes decisions, so a replay must use
/// the settings the events were recorded with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// How long a job whose result is cached somewhere waits for those workers
    /// before it is offered to the holders of its dependencies.
    pub cache_timeout: Millis,
    /// How long a job waits for the holders of its dependencies before every
    /// worker may take it.
    pub deps_timeout: Millis,
    /// A worker that sends nothing for this long is lost.
    pub lease_timeout: Millis,
    /// How long a job no registered worker can run waits for one to register
    /// before it fails (0: fail at once).
    pub unplaceable_grace: Millis,
    /// How long after a worker is lost (or leaves) the jobs that only it
    /// could run wait for it, or another capable worker, to register before
    /// they fail: a worker restarting or a pool rolling over is not a job no
    /// worker could ever run (0: no wait; stored settings that predate it
    /// read as 0).
    #[serde(default)]
    pub lost_worker_grace: Millis,
    /// How long a job waits while no worker is registered at all (workers
    /// starting with the coordinator, or all of them restarting) before it
    /// fails: an empty cluster says nothing of what could run it (0: no
    /// wait; stored settings that predate it read as 0, so that a log
    /// replays as it was recorded).
    #[serde(default)]
    pub no_worker_grace: Millis,
    /// Seed of the draw among a worker's queues.
    pub seed: u64,
    /// Queues with weights and quotas (none: one `default` queue for all).
    #[serde(default)]
    pub queues: Vec<QueueConfig>,
    /// Tenant → the leaf queue its jobs go to when they name none.
    #[serde(default)]
    pub tenant_queues: BTreeMap<String, String>,
    /// A starving job may evict lower-priority running jobs of its own
    /// queue (off by default).
    #[serde(default)]
    pub preempt: bool,
    /// A queue below its deserved share may evict running jobs of
    /// reclaimable queues above theirs (off by default).
    #[serde(default)]
    pub reclaim: bool,
    /// How preemption and reclaim evict a victim: kill it and requeue its
    /// job (the default), or suspend it on its worker where its memory
    /// allows (see [`Evict`]).
    #[serde(default)]
    pub evict: Evict,
    /// A run this young is not evicted by preemption or reclaim: it keeps
    /// its worker for at least this long, so that changing demand cannot
    /// start and evict the same jobs in turn (Slurm's `PreemptExemptTime`).
    /// 0 (the default): any run may be evicted at once.
    #[serde(default)]
    pub eviction_exempt: Millis,
    /// Weight of binpack in the order idle workers draw in (fill the
    /// busiest workers first). 0 with `spread` 0: registration order. The
    /// older spelling of listing `binpack` with this weight in [`Self::tiers`]
    /// (setting both is an error).
    #[serde(default)]
    pub binpack: u32,
    /// Weight of spread in that order (the least busy workers first); the
    /// older spelling of `spread` in [`Self::tiers`].
    #[serde(default)]
    pub spread: u32,
    /// The policies in force, as ordered tiers of named plugins (Volcano's
    /// tiers): order rules are applied in the order the plugins are listed,
    /// first decisive answer wins; placement scores are summed; preemption
    /// and reclaim victims come from the first tier whose plugins agree on
    /// any. [`Config::default_tiers`] reproduces drover's fixed policies;
    /// a plugin left out switches its rule off. See `README.md`, "Plugin
    /// tiers", for each plugin.
    #[serde(default = "Config::default_tiers")]
    pub tiers: Vec<Tier>,
}

/// How an eviction (preemption or reclaim) treats its victims
/// ([`Config::evict`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Evict {
    /// Stop (or drop) the victim's run and requeue its job: its work is
    /// lost.
    #[default]
    Kill,
    /// Suspend the victim's run on its worker ([`Decision::Suspend`]): it
    /// gives back its slot and CPU but keeps its memory, and is resumed
    /// ([`Decision::Resume`]) once its worker has room for its slot and CPU
    /// again. Only when every victim of the eviction has started, holds no
    /// named or exclusive tokens, and the worker's memory holds the
    /// suspended victims and the preemptor together; otherwise the victims
    /// are killed as with [`Evict::Kill`].
    Suspend,
}

/// One tier of [`Config::tiers`]: plugins in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tier {
    /// The plugins of the tier, in order.
    pub plugins: Vec<PluginConfig>,
}

impl Tier {
    /// A tier of plugins given by name, with no arguments.
    pub fn of(names: &[&str]) -> Tier {
        Tier { plugins: names.iter().map(|n| PluginConfig::named(n)).collect() }
    }
}

/// One plugin of a [`Tier`]: its name and arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginConfig {
    /// One of `priority`, `gang`, `drf`, `proportion`, `fairness`,
    /// `critical-path`, `binpack`, `spread`, `predicates`.
    pub name: String,
    /// Weight of a scoring plugin (`binpack`, `spread`; 1 when unset).
    #[serde(default)]
    pub weight: Option<u32>,
    /// `drf` only: also choose preemption victims (Volcano's
    /// `enablePreemptable`, off by default as in Volcano's Helm config).
    #[serde(default)]
    pub preemptable: bool,
}

impl PluginConfig {
    /// A plugin with no arguments.
    pub fn named(name: &str) -> PluginConfig {
        PluginConfig { name: name.to_owned(), ..PluginConfig::default() }
    }
}

impl Config {
    /// Checks the queue settings (unique names, known parents, no cycles,
    /// weights of at least 1, guarantees within capabilities, tenants mapped
    /// to leaf queues), that eviction by suspension has something to
    /// evict for, and the tiers (known plugins, each listed once,
    /// arguments only where they mean something). Every problem is listed.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        let mut names = BTreeMap::new();
        for q in &self.queues {
            if q.name.is_empty() {
                errors.push("a queue has an empty name".to_owned());
            }
            if names.insert(q.name.as_str(), q).is_some() {
                errors.push(format!("queue {} is declared twice", q.name));
            }
            if q.weight == 0 {
                errors.push(format!("queue {}: weight must be at least 1", q.name));
            }
            let over = |g: Option<u64>, c: Option<u64>| matches!((g, c), (Some(g), Some(c)) if g > c);
            if over(q.guarantee.slots.map(u64::from), q.capability.slots.map(u64::from))
                || over(q.guarantee.cpu, q.capability.cpu)
                || over(q.guarantee.memory, q.capability.memory)
            {
                errors.push(format!("queue {}: guarantee exceeds capability", q.name));
            }
        }
        for q in &self.queues {
            let Some(parent) = &q.parent else { continue };
            if !names.contains_key(parent.as_str()) {
                errors.push(format!("queue {}: no parent queue named {parent}", q.name));
                continue;
            }
            // Walk up: a cycle comes back to this queue.
            let mut seen = vec![q.name.as_str()];
            let mut up = Some(parent.as_str());
            while let Some(name) = up {
                if seen.contains(&name) {
                    errors.push(format!("queue {}: its parents form a cycle", q.name));
                    break;
                }
                seen.push(name);
                up = names.get(name).and_then(|p| p.parent.as_deref());
            }
        }
        let has_children = |name: &str| self.queues.iter().any(|q| q.parent.as_deref() == Some(name));
        for (tenant, queue) in &self.tenant_queues {
            if !names.contains_key(queue.as_str()) && queue != crate::quota::DEFAULT_QUEUE {
                errors.push(format!("tenant {tenant}: no queue named {queue}"));
            } else if has_children(queue) {
                errors
                    .push(format!("tenant {tenant}: queue {queue} has child queues; map tenants to leaves"));
            }
        }
        if self.evict == Evict::Suspend && !self.preempt && !self.reclaim {
            errors.push("evict = \"suspend\" needs preempt or reclaim".to_owned());
        }
        errors.extend(crate::policy::check_tiers(self));
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// The tiers that reproduce drover's fixed policies: `priority` and
    /// `gang`, then `drf`, `proportion`, `fairness`, `critical-path` and
    /// `predicates`.
    pub fn default_tiers() -> Vec<Tier> {
        vec![
            Tier::of(&["priority", "gang"]),
            Tier::of(&["drf", "proportion", "fairness", "critical-path", "predicates"]),
        ]
    }
}

/// One queue of [`Config::queues`] (Volcano's queue).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    /// Unique name.
    pub name: String,
    /// The queue whose share this one splits with its siblings (none: the
    /// cluster's). Only leaf queues hold jobs.
    #[serde(default)]
    pub parent: Option<String>,
    /// Relative entitlement among siblings (at least 1).
    pub weight: u32,
    /// Hard maximum held at once; unset dimensions are unlimited.
    #[serde(default)]
    pub capability: QueueLimits,
    /// Reserved minimum: the deserved share never falls below it.
    #[serde(default)]
    pub guarantee: QueueLimits,
    /// May other queues reclaim what this one holds above its share.
    #[serde(default = "yes")]
    pub reclaimable: bool,
    /// Higher-priority queues are offered work first.
    #[serde(default)]
    pub priority: i32,
}

fn yes() -> bool {
    true
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            name: String::new(),
            parent: None,
            weight: 1,
            capability: QueueLimits::default(),
            guarantee: QueueLimits::default(),
            reclaimable: true,
            priority: 0,
        }
    }
}

/// Amounts of a queue's capability or guarantee; unset means unlimited
/// (capability) or zero (guarantee).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// Job slots.
    #[serde(default)]
    pub slots: Option<u32>,
    /// CPU in millicores.
    #[serde(default)]
    pub cpu: Option<u64>,
    /// Memory in bytes.
    #[serde(default)]
    pub memory: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache_timeout: Millis(10),
            deps_timeout: Millis(100),
            lease_timeout: Millis(10_000),
            unplaceable_grace: Millis(0),
            lost_worker_grace: Millis(300_000),
            no_worker_grace: Millis(300_000),
            seed: 0x5eed,
            queues: Vec::new(),
            tenant_queues: BTreeMap::new(),
            preempt: false,
            reclaim: false,
            evict: Evict::Kill,
            eviction_exempt: Millis(0),
            binpack: 0,
            spread: 0,
            tiers: Config::default_tiers(),
        }
    }
}

/// A pending timer, as listed by [`crate::Scheduler::timers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    /// When it fires.
    pub at: Millis,
    /// What it does.
    pub kind: TimerKind,
}

/// What a timer does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKind {
    /// The job's CacheTimeout ends: it enters its dependency stage.
    Cache(JobId),
    /// The job's DepsTimeout ends: it enters the global queue.
    Deps(JobId),
    /// The job's wait for a capable worker ends: it fails.
    Unplaceable(JobId),
    /// The worker's lease ends: it is lost.
    Lease(WorkerId),
    /// A run that a starving job could evict ends its exemption
    /// ([`Config::eviction_exempt`]): the job's evictions are tried again.
    Eviction,
}
