//! The coordinator's state machine: builds on top of the scheduling core.
//!
//! The core schedules *jobs*; the solver tracks *builds*: which jobs of a build
//! are waiting for their dependencies, which are queued, running or done, what
//! a failure skips, and the ordered event stream of every build. Like the
//! core, it is pure and deterministic: [`Input`]s and `now` go in, [`Effect`]s
//! come out, and replaying the recorded inputs rebuilds an equal state. The
//! coordinator records every input before acting on its effects; that is all
//! its durability needs.
//!
//! Jobs shared by several builds (the same content ID) run once: each build
//! that needs the job is a separate waiter on the core's single job.

mod build;
mod snapshot;

use std::collections::BTreeMap;

use drover_core::{
    Capacity, Completion, Config, Decision, Event, FailReason, JobId, JobResult, JobStatus, Millis, RunId,
    Scheduler, WaiterId, WorkerId,
};
use drover_proto::{
    Assignment, BuildEvent, BuildSpec, BuildState, BuildStatus, DepInput, Hash32, JobDef, JobState, OnError,
    RegisterReply, RegisterRequest, Report, SubmitRequest, WorkerCapacity, WorkerStatus,
};
use serde::{Deserialize, Serialize};

use build::{Build, Plan};
pub use snapshot::SNAPSHOT_FORMAT;
use std::sync::Arc;

/// How many of the latest builds a new build's spec is compared with (by
/// pointer) for a plan to share: builds of one spec come together.
const PLAN_LOOKBACK: usize = 64;

/// How long a finished build is kept at least, whatever the history
/// setting: its followers and clients read its end (and a client its
/// status and outputs) first.
const FORGET_AFTER: Millis = Millis(60_000);

/// The fewest output trees known at which [`Solver::sweep_outputs`] looks
/// for those of outputs held nowhere.
const SWEEP_OUTPUTS_AT: usize = 4096;

/// What a job's output is made from but its dependencies' IDs: its own
/// content (`JobDef::own`) and, by name, the trees of its dependencies'
/// outputs (see [`Solver::input_key`]).
type InputKey = (Hash32, Vec<(String, Hash32)>);

/// The detail of a job cached by early cutoff.
const CUTOFF_DETAIL: &str =
    "its dependencies' outputs are what an earlier run read: that run's output is used (early cutoff)";

/// An input to the solver. The coordinator records each one, with the time it
/// was handled, before acting on what it caused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// A worker registers (or re-registers after either side restarted).
    Register(RegisterRequest),
    /// A worker polls for work: its lease is renewed.
    Poll {
        /// The worker.
        worker: u64,
    },
    /// A worker is shutting down: it is lost now, not when its lease runs
    /// out, so its runs go back to the queues at once.
    Leave {
        /// The worker.
        worker: u64,
    },
    /// Nothing listens at a live worker's address: a connection to it was
    /// refused at `since` (milliseconds, the coordinator's clock). It is
    /// lost now, as after a missed lease, unless it registered since (it
    /// came back at the same address).
    Unreachable {
        /// The worker.
        worker: u64,
        /// When the refused connection was tried.
        since: u64,
    },
    /// A worker will shut down once its runs end: it is assigned nothing
    /// new until it registers again.
    Drain {
        /// The worker.
        worker: u64,
    },
    /// A worker reports progress.
    Report {
        /// The worker.
        worker: u64,
        /// What happened.
        report: Report,
    },
    /// A client submits a build.
    Submit(SubmitRequest),
    /// A client submits a build with the very spec of an earlier build (as
    /// the coordinator records a spec it has seen before: by reference, not
    /// whole).
    SubmitLike {
        /// The earlier build, whose spec this build has.
        like: u64,
        /// Whose build.
        tenant: String,
        /// Re-run jobs even when a cached result exists.
        no_cache: bool,
        /// What the rest of the build does when a job fails.
        on_error: OnError,
        /// At most this many of the build's jobs queued or running at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_parallel: Option<u32>,
        /// The leaf queue the build's jobs go to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
    },
    /// A client cancels a build.
    Cancel {
        /// The build.
        build: u64,
    },
    /// A client re-runs a finished build's failed jobs and what they
    /// skipped or what was cancelled.
    Retry {
        /// The build.
        build: u64,
    },
    /// A client suspends (or resumes) a build's running jobs, or one of
    /// them.
    Suspend {
        /// The build.
        build: u64,
        /// One job, by name (default: every running job of the build).
        job: Option<String>,
        /// Resume instead.
        resume: bool,
    },
    /// The coordinator's shared cache stored a job's output.
    Cached {
        /// The job.
        job: Hash32,
        /// Digest of its packed tree.
        tree: Hash32,
    },
    /// The shared cache dropped these outputs (least recently used).
    Uncached {
        /// The jobs.
        jobs: Vec<Hash32>,
    },
    /// How many finished builds to keep (`None`: all). Past that, those
    /// that finished longest ago (and over a minute ago) are forgotten (see
    /// [`Solver::forgotten`]); the coordinator records this when its
    /// setting differs from the log's.
    KeepFinished {
        /// Finished builds to keep.
        builds: Option<u64>,
    },
    /// New settings for the core (see `drover_core::Scheduler::reconfigure`:
    /// new queues or tiers only while it holds no job). The coordinator
    /// records this when it starts from a snapshot taken under other
    /// settings; a log without a snapshot is replayed under the settings of
    /// the day instead.
    Configure {
        /// The settings.
        core: Box<Config>,
    },
    /// Time passes: due timers fire.
    Tick,
    /// The coordinator restarted, or a turn held it up for a while (a tenth
    /// of a lease): time stood still for the cluster while it was down or
    /// busy, so leases and waits resume where they were.
    Restarted,
}

/// The answer to an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A worker registered.
    Registered(RegisterReply),
    /// A build was accepted.
    Submitted(u64),
    /// Done.
    Done,
    /// The worker is unknown (or was lost): it must register again.
    Reregister,
}

/// Why an input was refused. A refused input changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SolverError {
    /// No build with that ID.
    #[error("no build {0}")]
    UnknownBuild(u64),
    /// The build is malformed.
    #[error("invalid build: {0}")]
    InvalidBuild(String),
    /// The build cannot be retried now.
    #[error("{0}")]
    CannotRetry(String),
    /// The job cannot be suspended or resumed now.
    #[error("{0}")]
    NotRunning(String),
    /// No live worker with that ID (it left, or was lost).
    #[error("no worker {0} in the cluster")]
    UnknownWorker(u64),
    /// The core cannot take these settings now.
    #[error("{0}")]
    Settings(drover_core::Rejected),
    /// The build has no job of that name.
    #[error("build {build} has no job {job:?}")]
    UnknownJob {
        /// The build.
        build: u64,
        /// The name asked for.
        job: String,
    },
}

/// Something for the coordinator's shell to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send this assignment to the worker.
    Assign {
        /// The worker.
        worker: u64,
        /// The work.
        assignment: Box<Assignment>,
    },
    /// Tell the worker not to start this run.
    Drop {
        /// The worker.
        worker: u64,
        /// The run.
        run: u64,
    },
    /// Tell the worker to stop this run.
    Stop {
        /// The worker.
        worker: u64,
        /// The run.
        run: u64,
    },
    /// Tell the worker to suspend (or resume) this run.
    Suspend {
        /// The worker.
        worker: u64,
        /// The run.
        run: u64,
        /// Resume instead.
        resume: bool,
    },
    /// The worker registered (again): a new session begins. Assignments
    /// not yet delivered to it are void (registration requeued the runs it
    /// did not list); what follows is for the new session.
    Registered {
        /// The worker.
        worker: u64,
    },
    /// The worker was declared lost: close its session.
    WorkerLost {
        /// The worker.
        worker: u64,
    },
    /// A worker lost long ago was forgotten (see [`KEEP_LOST_WORKERS`]):
    /// nothing more will be said of it, and its ID is unknown from now on.
    WorkerForgotten {
        /// The worker.
        worker: u64,
    },
    /// A build's event stream grew.
    BuildChanged {
        /// The build.
        build: u64,
    },
}

/// Lost workers kept listed (`drover workers`, `/metrics`) at most: past
/// that, the one lost longest ago is forgotten, so that a fleet whose
/// machines come and go under new names does not grow the coordinator's
/// state. A forgotten worker that comes back registers as a new one.
pub const KEEP_LOST_WORKERS: usize = 1000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct WorkerInfo {
    /// Shared with the records of the jobs that ran on it.
    name: Arc<str>,
    url: String,
    capacity: WorkerCapacity,
    labels: BTreeMap<String, String>,
    /// When it was lost, in the order of losses (`None` while alive).
    lost: Option<u64>,
    /// It left on its own ([`Input::Leave`]: drained, or stopped) rather
    /// than missing its lease.
    #[serde(default)]
    left: bool,
    /// When it last registered.
    #[serde(default)]
    registered: u64,
}

/// Where a build stands, in brief ([`Solver::build_outcome`]).
#[derive(Debug)]
pub struct BuildOutcome<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its state.
    pub state: BuildState,
    /// When it ended, if it has.
    pub finished_at: Option<Millis>,
}

/// How a run ended, as [`Metrics::runs_ended`] counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RunEnd {
    /// Its commands succeeded.
    Succeeded,
    /// The worker found the result in a cache: nothing ran.
    Cached,
    /// Its commands failed, or it timed out.
    Failed,
    /// The scheduler gave up on the job (lost too often, or no worker
    /// could ever run it).
    GaveUp,
}

impl RunEnd {
    /// Every kind, in order.
    pub const ALL: [RunEnd; 4] = [RunEnd::Succeeded, RunEnd::Cached, RunEnd::Failed, RunEnd::GaveUp];

    /// Its name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            RunEnd::Succeeded => "succeeded",
            RunEnd::Cached => "cached",
            RunEnd::Failed => "failed",
            RunEnd::GaveUp => "gave_up",
        }
    }
}

/// The counts the coordinator serves on `/metrics` ([`Solver::metrics`]):
/// read from the builds, workers and queues, never job by job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Builds by state, every state listed (forgotten builds in the final
    /// state they had).
    pub builds: Vec<(BuildState, u64)>,
    /// Builds accepted since the log began.
    pub builds_submitted: u64,
    /// Ends of build jobs by state (succeeded, cached, failed, cancelled,
    /// skipped), every state listed: each build counts its own, so a job
    /// that twenty builds share counts twenty times here and once in
    /// `runs_ended`.
    pub build_jobs_ended: Vec<(JobState, u64)>,
    /// Runs that ended, by how, every kind listed.
    pub runs_ended: Vec<(RunEnd, u64)>,
    /// Registered workers holding their lease, draining ones included.
    pub workers_up: u64,
    /// Of those, the ones draining (nothing new goes to them).
    pub workers_draining: u64,
    /// Registered workers that lost their lease, as listed: at most
    /// [`KEEP_LOST_WORKERS`] with those that left.
    pub workers_lost: u64,
    /// Registered workers that left on their own (drained or stopped), as
    /// listed.
    pub workers_left: u64,
    /// Workers the scheduling core holds: the live ones, and lost ones
    /// whose place no new worker has taken yet.
    pub core_workers: u64,
    /// Slots of the live workers.
    pub slots: u64,
    /// Runs in flight on live workers (a stopping run included).
    pub runs_in_flight: u64,
    /// Distinct jobs the scheduler holds, queued or running (a job that
    /// several builds share counts once).
    pub jobs_scheduled: u64,
    /// Per queue: its name, its queued jobs and its runs holding resources.
    pub queues: Vec<(String, u64, u64)>,
}

/// The coordinator's state. See the crate documentation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self")]
pub struct Solver {
    core: Scheduler,
    /// Each build behind an `Arc`, so a copy of the state (for a
    /// snapshot written in the background) shares the builds until one
    /// changes: finished builds, most of them, never do.
    builds: BTreeMap<u64, Arc<Build>>,
    next_build: u64,
    /// Which build job each core waiter stands for.
    waiters: BTreeMap<WaiterId, (u64, u32)>,
    next_waiter: u64,
    workers: BTreeMap<u64, WorkerInfo>,
    worker_ids: BTreeMap<String, u64>,
    /// The last worker ID given (IDs of forgotten workers are not reused).
    last_worker: u64,
    /// Workers lost so far: the order of losses.
    losses: u64,
    /// Output trees of jobs that succeeded, for verifying fetched copies:
    /// those of outputs no longer held anywhere are swept out now and then
    /// (see [`Solver::sweep_outputs`]).
    outputs: BTreeMap<JobId, Hash32>,
    /// How many output trees the last sweep kept.
    outputs_swept: usize,
    /// Early cutoff: the key of a job's inputs ([`Solver::input_key`]: its
    /// own content and its dependencies' output trees) → a job whose
    /// successful run read those inputs. Swept with the outputs.
    #[serde(default)]
    cutoffs: BTreeMap<InputKey, JobId>,
    /// Jobs whose output is another job's, by early cutoff → that job.
    /// Dropped when the job's own output turns up, when the other's is
    /// gone, or once no kept build has the job ([`Solver::sweep_aliases`]).
    #[serde(default)]
    aliases: BTreeMap<JobId, JobId>,
    /// How many aliases the last sweep of them kept ([`Solver::sweep_aliases`]).
    #[serde(default)]
    aliases_swept: usize,
    /// Runs in flight → the input key of what they were given to read (the
    /// dependencies' trees in their assignment): a run that succeeds is
    /// filed under the inputs it read, not under what its dependencies hold
    /// by the time it ends (another run of one may have written something
    /// else meanwhile). Runs the core drops with their worker leave it when
    /// the worker is lost or registers again.
    #[serde(default)]
    run_keys: BTreeMap<u64, InputKey>,
    /// Jobs whose latest run a worker failed itself (`worker_fault`) →
    /// what it said, for the job's detail if the core gives it up (its
    /// reason names only the worker).
    #[serde(default)]
    worker_faults: BTreeMap<JobId, String>,
    /// Jobs that failed and run again (`retry_on_failure`) → how many of
    /// their runs failed so far, and the attempts they made before the
    /// core took the job again (which counts its attempts from 1). Left
    /// once the job ends or is cancelled.
    #[serde(default)]
    failed_runs: BTreeMap<JobId, Reruns>,
    /// Outputs the coordinator's shared cache holds.
    remote: std::collections::BTreeSet<JobId>,
    /// Build jobs whose result is known and held: they finish as cached.
    cache_hits: Vec<(u64, u32)>,
    /// Builds with a gang held back while jobs of another instance of it
    /// are in the core (see [`Solver::release_gangs`]): tried again after
    /// every input.
    stalled: std::collections::BTreeSet<u64>,
    /// How long the last run of each job name took (milliseconds), for
    /// critical-path order. Kept for every name ever run: forgetting some
    /// would change the order of jobs in a replay of a log recorded
    /// without forgetting them.
    durations: BTreeMap<String, u64>,
    /// Runs that ended (or were given up), by [`RunEnd`], since the log
    /// began (a replay counts them again).
    runs_ended: BTreeMap<RunEnd, u64>,
    /// How many finished builds to keep (`None`: all).
    keep_finished: Option<u64>,
    /// Builds forgotten, by final state, and their jobs' ends: the metrics
    /// count them still.
    forgotten_builds: BTreeMap<BuildState, u64>,
    forgotten_ends: BTreeMap<JobState, u64>,
    /// Taken by the coordinator after every input (a snapshot has none).
    #[serde(skip)]
    effects: Vec<Effect>,
    /// Jobs whose run just failed for want of its inputs, not by its own
    /// doing: not run again for `retry_on_failure` (their inputs are built
    /// again instead, see [`Solver::rewind_lost`]). Emptied once the input
    /// that said so is applied.
    #[serde(skip)]
    lost_input_failures: Vec<JobId>,
    now: Millis,
}

impl Solver {
    /// An empty coordinator state with the core's settings.
    pub fn new(config: Config) -> Solver {
        Solver {
            core: Scheduler::new(config),
            builds: BTreeMap::new(),
            next_build: 1,
            waiters: BTreeMap::new(),
            next_waiter: 1,
            workers: BTreeMap::new(),
            worker_ids: BTreeMap::new(),
            last_worker: 0,
            losses: 0,
            outputs: BTreeMap::new(),
            outputs_swept: 0,
            cutoffs: BTreeMap::new(),
            aliases: BTreeMap::new(),
            worker_faults: BTreeMap::new(),
            aliases_swept: 0,
            run_keys: BTreeMap::new(),
            failed_runs: BTreeMap::new(),
            remote: std::collections::BTreeSet::new(),
            cache_hits: Vec::new(),
            runs_ended: BTreeMap::new(),
            stalled: std::collections::BTreeSet::new(),
            durations: BTreeMap::new(),
            keep_finished: None,
            forgotten_builds: BTreeMap::new(),
            forgotten_ends: BTreeMap::new(),
            effects: Vec::new(),
            lost_input_failures: Vec::new(),
            now: Millis(0),
        }
    }

    /// How many finished builds it keeps (`None`: all).
    pub fn keep_finished(&self) -> Option<u64> {
        self.keep_finished
    }

    /// Was build `id` accepted, then forgotten (it had finished, and newer
    /// finished builds took its place)?
    pub fn forgotten(&self, id: u64) -> bool {
        id >= 1 && id < self.next_build && !self.builds.contains_key(&id)
    }

    /// Forgets the builds that finished longest ago once more than `slack`
    /// beyond what it keeps are held, down to what it keeps; a build not
    /// over, or over for less than [`FORGET_AFTER`], is never forgotten (its
    /// followers and clients read its end first). Their counts stay in the
    /// metrics.
    fn forget_finished(&mut self, slack: u64) {
        let Some(keep) = self.keep_finished else { return };
        if (self.builds.len() as u64) <= keep.saturating_add(slack) {
            return;
        }
        let mut finished: Vec<(Millis, u64)> = self
            .builds
            .iter()
            .filter(|(_, b)| b.state.is_final())
            .filter_map(|(&id, b)| Some((b.finished_at?, id)))
            .collect();
        finished.sort_unstable();
        let excess = (finished.len() as u64).saturating_sub(keep) as usize;
        let settled = |at: Millis| at.0.saturating_add(FORGET_AFTER.0) <= self.now.0;
        let gone: Vec<u64> =
            finished.into_iter().take(excess).take_while(|&(at, _)| settled(at)).map(|(_, id)| id).collect();
        if gone.is_empty() {
            return;
        }
        for id in gone {
            let Some(build) = self.builds.remove(&id) else { continue };
            *self.forgotten_builds.entry(build.state).or_default() += 1;
            for (&state, &n) in &build.ended {
                *self.forgotten_ends.entry(state).or_default() += n;
            }
            self.stalled.remove(&id);
            self.effects.push(Effect::BuildChanged { build: id });
        }
    }

    /// Forgets the output trees of jobs whose output no live worker and
    /// not the shared cache holds (evicted, or lost with their workers):
    /// nothing can fetch them, and a worker that has one again reports its
    /// tree with it. One pass once the trees have doubled since the last
    /// one kept (at least [`SWEEP_OUTPUTS_AT`]), so the trees known stay
    /// within twice those of outputs held, at a constant cost per tree.
    fn sweep_outputs(&mut self) {
        if self.outputs.len() < self.outputs_swept.saturating_mul(2).max(SWEEP_OUTPUTS_AT) {
            return;
        }
        let (core, remote) = (&self.core, &self.remote);
        self.outputs.retain(|job, _| remote.contains(job) || core.locate_artifact(job).is_some());
        self.outputs_swept = self.outputs.len();
        let outputs = &self.outputs;
        self.cutoffs.retain(|_, job| outputs.contains_key(job));
        self.aliases.retain(|_, job| outputs.contains_key(job));
    }

    /// The job whose artifact holds `job`'s output: `job`, or the job its
    /// early cutoff took the output of.
    fn artifact_of(&self, job: JobId) -> JobId {
        self.aliases.get(&job).copied().unwrap_or(job)
    }

    /// The key of build job `i`'s inputs for the early cutoff: its own
    /// content (`JobDef::own`) and, by name, the output trees of its
    /// dependencies. `None` when the job has no `own` or a dependency's
    /// tree is unknown.
    fn input_key(&self, b: u64, i: u32) -> Option<InputKey> {
        let build = &self.builds[&b];
        let def = build.def(i);
        let own = def.own?;
        let mut needs = Vec::with_capacity(def.needs.len());
        for (name, &d) in def.needs.iter().zip(build.needs_of(i)) {
            let dep = self.artifact_of(JobId::from(build.def(d).id));
            needs.push((name.clone(), *self.outputs.get(&dep)?));
        }
        needs.sort_unstable();
        Some((own, needs))
    }

    /// Job `job` succeeded with an output of its own, in a run given the
    /// inputs `key` (if known): it is nobody's alias any more, and the key
    /// leads to it.
    fn learn_cutoff(&mut self, job: JobId, key: Option<InputKey>) {
        self.aliases.remove(&job);
        if let Some(key) = key {
            self.cutoffs.insert(key, job);
        }
    }

    /// The core's settings.
    pub fn config(&self) -> &Config {
        self.core.config()
    }

    /// Handles one input at time `now`. An input refused with an error
    /// changed nothing (so the coordinator leaves it out of its log).
    pub fn handle(&mut self, now: Millis, input: Input) -> Result<Reply, SolverError> {
        let before = self.now;
        self.now = self.now.max(now);
        let reply = match input {
            Input::Register(req) => Ok(self.register(req)),
            Input::Poll { worker } => Ok(self.core_event(Event::Heartbeat { worker: WorkerId(worker) })),
            Input::Leave { worker } | Input::Drain { worker }
                if !self.core.worker_alive(WorkerId(worker)) =>
            {
                Err(SolverError::UnknownWorker(worker))
            }
            Input::Leave { worker } => {
                let reply = self.core_event(Event::WorkerLeft { worker: WorkerId(worker) });
                if let Some(info) = self.workers.get_mut(&worker) {
                    info.left = true;
                }
                Ok(reply)
            }
            Input::Unreachable { worker, since } => match self.workers.get(&worker) {
                Some(info) if info.registered < since => {
                    Ok(self.core_event(Event::WorkerUnreachable { worker: WorkerId(worker) }))
                }
                Some(_) => Ok(Reply::Done),
                None => Err(SolverError::UnknownWorker(worker)),
            },
            Input::Drain { worker } => {
                Ok(self.core_event(Event::WorkerDraining { worker: WorkerId(worker) }))
            }
            Input::Report { worker, report } => Ok(self.report(worker, report)),
            Input::Submit(req) => self.submit(req, None),
            Input::SubmitLike { like, tenant, no_cache, on_error, max_parallel, queue } => {
                match self.builds.get(&like).map(|b| b.plan().clone()) {
                    Some(plan) => {
                        let build = plan.spec().clone();
                        let req = SubmitRequest { build, tenant, no_cache, on_error, max_parallel, queue };
                        self.submit(req, Some(plan))
                    }
                    None => Err(SolverError::UnknownBuild(like)),
                }
            }
            Input::Cancel { build } => self.cancel(build),
            Input::Suspend { build, job, resume } => self.suspend(build, job.as_deref(), resume),
            Input::Cached { job, tree } => {
                self.outputs.entry(job.into()).or_insert(tree);
                self.remote.insert(job.into());
                Ok(Reply::Done)
            }
            Input::Uncached { jobs } => {
                for job in jobs {
                    self.remote.remove(&job.into());
                }
                Ok(Reply::Done)
            }
            Input::Retry { build } => self.retry(build),
            Input::Tick => Ok(self.core_event(Event::Tick)),
            Input::Restarted => Ok(self.core_event(Event::Resumed)),
            Input::Configure { core } => {
                self.core.reconfigure(*core).map(|()| Reply::Done).map_err(SolverError::Settings)
            }
            Input::KeepFinished { builds } => {
                self.keep_finished = builds;
                self.forget_finished(0);
                Ok(Reply::Done)
            }
        };
        self.drain();
        // Gangs held back may go now that the input moved jobs out of the
        // core; each is tried once per input.
        for build in std::mem::take(&mut self.stalled) {
            if self.builds.contains_key(&build) {
                self.release_gangs(build);
            }
        }
        self.drain();
        if reply.is_err() {
            self.now = before;
        }
        if reply.is_ok() {
            self.sweep_outputs();
        }
        if let (Ok(Reply::Submitted(_)), Some(keep)) = (&reply, self.keep_finished) {
            // A pass over the builds once a quarter more than it keeps
            // (at least 16) came in, not one per submission.
            self.forget_finished((keep / 4).max(16));
        }
        reply
    }

    /// The next time the coordinator must send [`Input::Tick`].
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.core.poll_timeout()
    }

    /// Marks a worker lost, and forgets the one lost longest ago if more
    /// than [`KEEP_LOST_WORKERS`] are.
    fn worker_lost(&mut self, id: u64) {
        let core = &self.core;
        self.run_keys.retain(|&run, _| core.run_info(RunId(run)).is_some());
        let Some(info) = self.workers.get_mut(&id) else { return };
        self.losses += 1;
        info.lost = Some(self.losses);
        let lost = self.workers.values().filter(|w| w.lost.is_some()).count();
        if lost <= KEEP_LOST_WORKERS {
            return;
        }
        let oldest = self.workers.iter().filter_map(|(&id, w)| Some((w.lost?, id))).min();
        if let Some((_, old)) = oldest
            && let Some(info) = self.workers.remove(&old)
        {
            self.worker_ids.remove(&*info.name);
            self.effects.push(Effect::WorkerForgotten { worker: old });
        }
    }

    /// Takes the effects caused since the last call.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    // ------------------------------------------------------------------
    // Queries (read-only; not recorded)
    // ------------------------------------------------------------------

    /// A build's status.
    pub fn build_status(&self, id: u64) -> Option<BuildStatus> {
        let b = self.builds.get(&id)?;
        let mut status = b.status();
        let (tenant, named) = b.owner();
        if let Some(queue) = self.core.queue_of(named, tenant) {
            queue.clone_into(&mut status.queue);
        }
        // Queued jobs the core holds say why they wait.
        for job in &mut status.jobs {
            if job.state == JobState::Queued
                && job.detail.is_empty()
                && let Some(why) = self.core.waiting_reason(&JobId::from(job.id))
            {
                job.detail = why;
            }
        }
        Some(status)
    }

    /// A build's name, state and when it ended (if it has): for the
    /// coordinator's own log, cheap enough to ask after every change of the
    /// build.
    pub fn build_outcome(&self, id: u64) -> Option<BuildOutcome<'_>> {
        let b = self.builds.get(&id)?;
        Some(BuildOutcome { name: &b.plan().spec().name, state: b.state, finished_at: b.finished_at })
    }

    /// How many of a build's jobs are in each state now (a walk over its
    /// jobs: ask once a build has ended, not after every change).
    pub fn build_job_states(&self, id: u64) -> Option<BTreeMap<JobState, u64>> {
        self.builds.get(&id).map(|b| b.job_states())
    }

    /// A worker's name and URL, live or lost, and whether it left (rather
    /// than missing its lease) if it is gone.
    pub fn worker_name(&self, id: u64) -> Option<(&str, &str, bool)> {
        self.workers.get(&id).map(|w| (&*w.name, w.url.as_str(), w.left))
    }

    /// Every build kept, oldest first, without its jobs' details.
    pub fn build_summaries(&self) -> Vec<drover_proto::BuildSummary> {
        self.builds.values().map(|b| b.summary()).collect()
    }

    /// The statuses of the builds kept after build `after`, oldest first,
    /// as many as hold `max_jobs` jobs together (at least one build): a page
    /// of a listing, whose cost stays bounded however much is kept.
    pub fn builds_page(&self, after: u64, max_jobs: usize) -> Vec<BuildStatus> {
        let mut page = Vec::new();
        let mut jobs = 0;
        for (&id, _) in self.builds.range(after.saturating_add(1)..) {
            if !page.is_empty() && jobs >= max_jobs {
                break;
            }
            if let Some(status) = self.build_status(id) {
                jobs += status.jobs.len();
                page.push(status);
            }
        }
        page
    }

    /// Every build kept, oldest first.
    pub fn build_ids(&self) -> Vec<u64> {
        self.builds.keys().copied().collect()
    }

    /// A recent build made from this very spec (the same `Arc`), if any: a
    /// submission with it may then be recorded as [`Input::SubmitLike`].
    pub fn build_with_spec(&self, spec: &Arc<BuildSpec>) -> Option<u64> {
        self.builds.iter().rev().take(PLAN_LOOKBACK).find(|(_, b)| b.plan().is_of(spec)).map(|(&id, _)| id)
    }

    /// Does build `build` hold this very spec (the same `Arc`)?
    pub fn build_holds_spec(&self, build: u64, spec: &Arc<BuildSpec>) -> bool {
        self.builds.get(&build).is_some_and(|b| b.plan().is_of(spec))
    }

    /// The distinct specs of the latest builds (those [`build_with_spec`]
    /// looks at), newest first, each with the latest build holding it:
    /// after a restart, the coordinator files them so that a submission of
    /// one of them is recorded by reference.
    ///
    /// [`build_with_spec`]: Solver::build_with_spec
    pub fn recent_specs(&self) -> Vec<(u64, Arc<BuildSpec>)> {
        let mut specs: Vec<(u64, Arc<BuildSpec>)> = Vec::new();
        for (&id, b) in self.builds.iter().rev().take(PLAN_LOOKBACK) {
            let spec = b.plan().spec();
            if !specs.iter().any(|(_, s)| Arc::ptr_eq(s, spec)) {
                specs.push((id, spec.clone()));
            }
        }
        specs
    }

    /// A build's events from `from` on, and whether the build is over.
    pub fn events(&self, id: u64, from: u64) -> Option<(Vec<BuildEvent>, bool)> {
        let b = self.builds.get(&id)?;
        let events = b.events.iter().skip(from as usize).cloned().collect();
        Some((events, b.state.is_final()))
    }

    /// At most `limit` of a build's events from `from` on (`None` for an
    /// unknown build).
    pub fn events_page(&self, id: u64, from: u64, limit: usize) -> Option<Vec<BuildEvent>> {
        let b = self.builds.get(&id)?;
        Some(b.events.iter().skip(from as usize).take(limit).cloned().collect())
    }

    /// How many events a build's stream has.
    pub fn event_count(&self, id: u64) -> Option<u64> {
        Some(self.builds.get(&id)?.events.len() as u64)
    }

    /// Every queue with its share (see [`Scheduler::queue_views`]).
    pub fn queues(&self) -> Vec<drover_core::QueueView> {
        self.core.queue_views()
    }

    /// The counts for the coordinator's `/metrics`: a pass over the builds,
    /// the workers and the queues, none over their jobs.
    pub fn metrics(&self) -> Metrics {
        const BUILD_STATES: [BuildState; 5] = [
            BuildState::Queued,
            BuildState::Running,
            BuildState::Succeeded,
            BuildState::Failed,
            BuildState::Cancelled,
        ];
        const ENDS: [JobState; 5] =
            [JobState::Succeeded, JobState::Cached, JobState::Failed, JobState::Cancelled, JobState::Skipped];
        let mut m = Metrics {
            builds: BUILD_STATES.iter().map(|&s| (s, 0)).collect(),
            builds_submitted: self.next_build - 1,
            build_jobs_ended: ENDS.iter().map(|&s| (s, 0)).collect(),
            runs_ended: RunEnd::ALL
                .iter()
                .map(|&e| (e, self.runs_ended.get(&e).copied().unwrap_or(0)))
                .collect(),
            jobs_scheduled: self.core.job_count() as u64,
            ..Metrics::default()
        };
        for build in self.builds.values() {
            if let Some(count) = m.builds.iter_mut().find(|(s, _)| *s == build.state) {
                count.1 += 1;
            }
            for (state, count) in &mut m.build_jobs_ended {
                *count += build.ended.get(state).copied().unwrap_or(0);
            }
        }
        for (state, count) in &mut m.builds {
            *count += self.forgotten_builds.get(state).copied().unwrap_or(0);
        }
        for (state, count) in &mut m.build_jobs_ended {
            *count += self.forgotten_ends.get(state).copied().unwrap_or(0);
        }
        for (&id, info) in &self.workers {
            if self.core.worker_alive(WorkerId(id)) {
                m.workers_up += 1;
                m.workers_draining += u64::from(self.core.worker_draining(WorkerId(id)));
                m.slots += u64::from(info.capacity.slots);
                m.runs_in_flight += self.core.worker_runs(WorkerId(id)).len() as u64;
            } else if info.left {
                m.workers_left += 1;
            } else {
                m.workers_lost += 1;
            }
        }
        m.core_workers = self.core.worker_count() as u64;
        m.queues = self.core.queue_views().into_iter().map(|q| (q.name, q.queued_jobs, q.running)).collect();
        m
    }

    /// The URL of the live worker of that name, if one is alive.
    pub fn live_worker_url(&self, name: &str) -> Option<&str> {
        let id = *self.worker_ids.get(name)?;
        if !self.core.worker_alive(WorkerId(id)) {
            return None;
        }
        self.workers.get(&id).map(|w| w.url.as_str())
    }

    /// The live worker at `url`, if one is there.
    pub fn live_worker_at(&self, url: &str) -> Option<u64> {
        self.workers
            .iter()
            .find(|(id, w)| w.url == url && self.core.worker_alive(WorkerId(**id)))
            .map(|(&id, _)| id)
    }

    /// Every registered worker.
    pub fn workers(&self) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .map(|(&id, w)| WorkerStatus {
                id,
                name: w.name.to_string(),
                url: w.url.clone(),
                alive: self.core.worker_alive(WorkerId(id)),
                left: w.left && !self.core.worker_alive(WorkerId(id)),
                draining: self.core.worker_draining(WorkerId(id)),
                capacity: w.capacity.clone(),
                labels: w.labels.clone(),
                running: self.core.worker_runs(WorkerId(id)).len(),
            })
            .collect()
    }

    /// Where a build job's latest attempt ran: the worker's URL and the run.
    /// A worker forgotten since (see [`KEEP_LOST_WORKERS`]) is looked for
    /// under its name: it may have come back, with a new ID.
    pub fn run_location(&self, build: u64, job: &str) -> Option<(String, u64)> {
        let (run, worker, name) = self.builds.get(&build)?.latest_run(job)?;
        self.locate(run, worker, name)
    }

    /// Where attempt `attempt` of job `job` of build `build` ran, if its
    /// worker is known: its URL and the run. `Err` lists the attempts
    /// that may be had.
    pub fn attempt_location(
        &self,
        build: u64,
        job: &str,
        attempt: u32,
    ) -> Result<Option<(String, u64)>, Vec<u32>> {
        let Some(b) = self.builds.get(&build) else { return Ok(None) };
        match b.run_of_attempt(job, attempt) {
            Some((run, worker, name)) => Ok(self.locate(run, worker, name)),
            None => Err(b.attempts_of(job)),
        }
    }

    /// For job `job` of build `build`, whose result came from the cache:
    /// the newest other build still kept in which a job with the same ID
    /// ran and succeeded, and that job's name there (its log is that
    /// run's).
    pub fn ran_in(&self, build: u64, job: &str) -> Option<(u64, String)> {
        let id = self.builds.get(&build)?.job_id(job)?;
        self.builds
            .iter()
            .rev()
            .filter(|(other, _)| **other != build)
            .find_map(|(&other, b)| Some((other, b.succeeded_as(id)?.to_owned())))
    }

    fn locate(&self, run: u64, worker: u64, name: &str) -> Option<(String, u64)> {
        let info = self.workers.get(&worker).or_else(|| self.workers.get(self.worker_ids.get(name)?))?;
        Some((info.url.clone(), run))
    }

    /// Base URLs of live workers holding a job's output.
    pub fn artifact_holders(&self, job: Hash32) -> Vec<String> {
        self.core
            .artifact_holders(&self.artifact_of(job.into()))
            .into_iter()
            .filter_map(|w| self.workers.get(&w.0).map(|i| i.url.clone()))
            .collect()
    }

    /// The output tree digest of a job that succeeded, if known.
    /// The job run `run` (in flight) was assigned.
    pub fn run_job(&self, run: u64) -> Option<Hash32> {
        self.core.run_info(RunId(run)).map(|(_, job, _)| Hash32::from(job))
    }

    pub fn output_tree(&self, job: Hash32) -> Option<Hash32> {
        self.outputs.get(&self.artifact_of(job.into())).copied()
    }

    /// The job whose artifact holds `job`'s output, when that is another
    /// job's (early cutoff).
    pub fn artifact_alias(&self, job: Hash32) -> Option<Hash32> {
        self.aliases.get(&JobId::from(job)).map(|&other| Hash32::from(other))
    }

    /// Is this worker registered and holding its lease?
    pub fn worker_alive(&self, worker: u64) -> bool {
        self.core.worker_alive(WorkerId(worker))
    }

    // ------------------------------------------------------------------
    // Inputs
    // ------------------------------------------------------------------

    fn core_event(&mut self, event: Event) -> Reply {
        match self.core.handle(self.now, event) {
            Err(drover_core::Rejected::UnknownWorker(_)) => Reply::Reregister,
            // Other refusals are stale reports (a run that was already lost or
            // cancelled); the core changed nothing.
            Err(_) | Ok(()) => Reply::Done,
        }
    }

    fn register(&mut self, req: RegisterRequest) -> Reply {
        let id = match self.worker_ids.get(&req.name) {
            Some(&id) => id,
            None => {
                self.last_worker += 1;
                self.worker_ids.insert(req.name.clone(), self.last_worker);
                self.last_worker
            }
        };
        for a in &req.artifacts {
            self.outputs.entry(a.job.into()).or_insert(a.tree);
        }
        let capacity = Capacity {
            slots: req.capacity.slots,
            cpu: req.capacity.cpu_millis,
            memory: req.capacity.memory,
            tokens: req.capacity.tokens.clone(),
        };
        let event = Event::WorkerJoined {
            worker: WorkerId(id),
            name: req.name.clone(),
            capacity,
            labels: req.labels.clone(),
            artifacts: req.artifacts.iter().map(|a| a.job.into()).collect(),
        };
        self.workers.insert(
            id,
            WorkerInfo {
                name: req.name.into(),
                url: req.url,
                capacity: req.capacity,
                labels: req.labels,
                lost: None,
                left: false,
                registered: self.now.0,
            },
        );
        self.effects.push(Effect::Registered { worker: id });
        // What the core had given this worker before it registered: the
        // registration itself may give it more (the join dispatches queued
        // work), and those runs are new to it, not lost.
        let known = self.core.worker_runs(WorkerId(id));
        let refused = self.core.handle(self.now, event).is_err();
        // Runs the core gave this worker that it no longer has are lost; runs
        // it has that the core does not know (or gave elsewhere) must stop.
        for run in &known {
            if !req.running.contains(&run.0) {
                let _stale = self.core.handle(self.now, Event::RunLost { run: *run });
            }
        }
        let stop: Vec<u64> =
            req.running.iter().copied().filter(|r| !known.iter().any(|k| k.0 == *r)).collect();
        if refused {
            // Shrinking below what it runs: treat as a fresh start.
            let _ = self.core.handle(self.now, Event::WorkerLeft { worker: WorkerId(id) });
        }
        // The runs it no longer has will never report.
        let core = &self.core;
        self.run_keys.retain(|&run, _| core.run_info(RunId(run)).is_some());
        Reply::Registered(RegisterReply {
            worker: id,
            lease_ms: self.core.config().lease_timeout.0,
            stop,
            readers: None,
        })
    }

    fn report(&mut self, worker: u64, report: Report) -> Reply {
        if !self.core.worker_alive(WorkerId(worker)) {
            return Reply::Reregister;
        }
        // A worker speaks only for its own runs: a run the core assigned to
        // another worker is left alone, whatever this one says of it (a
        // confused or hostile worker cannot end, or start, someone else's).
        let theirs = |core: &Scheduler, run: u64| {
            core.run_info(RunId(run)).is_some_and(|(owner, _, _)| owner != WorkerId(worker))
        };
        for run in report.started {
            if theirs(&self.core, run) {
                continue;
            }
            if self.core.handle(self.now, Event::JobStarted { run: RunId(run) }).is_err()
                && self.core.run_info(RunId(run)).is_none()
            {
                // A run the core no longer knows: its worker must stop it.
                self.effects.push(Effect::Stop { worker, run });
            }
        }
        for r in report.finished {
            if theirs(&self.core, r.run) {
                continue;
            }
            // Its worker failed the run, not the job (its disk, or the
            // run's supervisor killed): it goes back to the queue as if the
            // worker had been lost under it (a worker whose disk stays
            // broken drains first, so it goes elsewhere).
            if r.worker_fault {
                if let Some((_, job, _)) = self.core.run_info(RunId(r.run)) {
                    self.worker_faults.insert(job, r.detail.clone());
                }
                self.run_keys.remove(&r.run);
                let _stale = self.core.handle(self.now, Event::RunLost { run: RunId(r.run) });
                continue;
            }
            if !r.stages.is_empty()
                && let Some((_, job, _)) = self.core.run_info(RunId(r.run))
            {
                for (b, i) in self.job_waiters(&job) {
                    self.builds
                        .get_mut(&b)
                        .map(Arc::make_mut)
                        .expect("build exists")
                        .ran_stages(i, &r.stages);
                }
            }
            if r.success
                && !r.cached
                && let Some((_, job, _)) = self.core.run_info(RunId(r.run))
            {
                let took = r.duration_ms.max(1);
                let mut last: Option<&str> = None;
                for (b, i) in self.job_waiters(&job) {
                    // Builds sharing a job mostly share its name too: the
                    // name is copied only the first time it is seen, and
                    // looked up once for waiters in a row that share it.
                    let name = &self.builds[&b].def(i).name;
                    if last == Some(name.as_str()) {
                        continue;
                    }
                    last = Some(name);
                    match self.durations.get_mut(name) {
                        Some(known) => *known = took,
                        None => _ = self.durations.insert(name.clone(), took),
                    }
                }
            }
            let key = self.run_keys.remove(&r.run);
            if let Some(out) = &r.output {
                self.outputs.insert(out.job.into(), out.tree);
                if r.success {
                    self.learn_cutoff(out.job.into(), key);
                }
            }
            let again = if !r.success && !r.lost_inputs.is_empty() {
                if let Some((_, job, _)) = self.core.run_info(RunId(r.run)) {
                    self.lost_input_failures.push(job);
                }
                self.rewind_lost(r.run, &r.lost_inputs)
            } else {
                Vec::new()
            };
            let result =
                JobResult { success: r.success, exit_code: r.exit_code, cached: r.cached, detail: r.detail };
            let _stale = self.core.handle(self.now, Event::JobExited { run: RunId(r.run), result });
            // Jobs that left the run for another build's lost input go
            // again, now that the run is over for the core.
            for (b, i) in again {
                self.schedule(b, i);
            }
        }
        if !report.added.is_empty() {
            for a in &report.added {
                self.outputs.entry(a.job.into()).or_insert(a.tree);
            }
            let artifacts = report.added.iter().map(|a| a.job.into()).collect();
            self.core_event(Event::ArtifactsAdded { worker: WorkerId(worker), artifacts });
        }
        if !report.evicted.is_empty() {
            let artifacts = report.evicted.iter().map(|h| (*h).into()).collect();
            self.core_event(Event::ArtifactsEvicted { worker: WorkerId(worker), artifacts });
        }
        Reply::Done
    }

    /// Accepts a build; `known`: the plan of a build with the same spec,
    /// if the caller knows it (else a recent build's is looked for).
    fn submit(&mut self, req: SubmitRequest, known: Option<Arc<Plan>>) -> Result<Reply, SolverError> {
        let id = self.next_build;
        self.core.queue_for(req.queue.as_deref(), &req.tenant).map_err(SolverError::InvalidBuild)?;
        // A build submitted with the spec of a recent one (the coordinator
        // hands identical specs over as one `Arc`) shares its plan.
        let known = known.or_else(|| {
            self.builds
                .values()
                .rev()
                .take(PLAN_LOOKBACK)
                .map(|b| b.plan())
                .find(|p| p.is_of(&req.build))
                .cloned()
        });
        let build = Build::new(id, req, self.now, &self.durations, known.as_ref())
            .map_err(SolverError::InvalidBuild)?;
        self.next_build += 1;
        self.builds.insert(id, Arc::new(build));
        self.effects.push(Effect::BuildChanged { build: id });
        let ready = self.builds[&id].ready_roots();
        for i in ready {
            self.schedule(id, i);
        }
        self.finish_if_done(id);
        Ok(Reply::Submitted(id))
    }

    fn suspend(&mut self, id: u64, job: Option<&str>, resume: bool) -> Result<Reply, SolverError> {
        let build = self.builds.get_mut(&id).map(Arc::make_mut).ok_or(SolverError::UnknownBuild(id))?;
        if let Some(name) = job
            && !build.plan().has_job(name)
        {
            return Err(SolverError::UnknownJob { build: id, job: name.to_owned() });
        }
        let runs = build.suspend(job, resume, self.now).map_err(SolverError::NotRunning)?;
        self.effects.push(Effect::BuildChanged { build: id });
        for (worker, run, tell) in runs {
            if tell {
                self.effects.push(Effect::Suspend { worker, run, resume });
            }
            // The run is shared: every build waiting for it sees it held
            // (or let go), and any of them may resume it, whether or not
            // the build that suspended it is still there.
            let Some((_, job, _)) = self.core.run_info(RunId(run)) else { continue };
            for (b, i) in self.job_waiters(&job) {
                if b == id {
                    continue;
                }
                let other = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
                if other.shared_suspension(i, run, !resume, self.now) {
                    self.effects.push(Effect::BuildChanged { build: b });
                }
            }
        }
        Ok(Reply::Done)
    }

    /// A run that could not get some of its inputs: their outputs were lost
    /// with their workers. Each build waiting for its job builds them again
    /// and runs the job after them (`Build::rewind`), its waiter leaving the
    /// core; a build where that cannot be keeps waiting and gets the
    /// failure, as the run's end then tells the core. A waiter whose own
    /// needs were not lost (the run read another build's copy of a need:
    /// the same work under other limits) leaves the run and is returned, to
    /// be scheduled again once the run's end is in.
    fn rewind_lost(&mut self, run: u64, lost: &[Hash32]) -> Vec<(u64, u32)> {
        let Some((_, job, _)) = self.core.run_info(RunId(run)) else { return Vec::new() };
        let lost: Vec<JobId> = lost.iter().map(|h| JobId::from(*h)).collect();
        let mut again = Vec::new();
        let waiters = self.job_waiters(&job);
        // An input that no waiter needs is no loss of another build's copy:
        // that failure stands for all.
        let read = waiters.iter().any(|&(b, i)| self.builds[&b].lost_a_need(i, &lost));
        for (b, i) in waiters {
            let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
            if read && let Some(cancel) = build.leave_foreign_loss(i, &lost, self.now) {
                self.effects.push(Effect::BuildChanged { build: b });
                self.withdraw(vec![cancel]);
                again.push((b, i));
                continue;
            }
            let available = availability(&self.core, &self.outputs, &self.remote, &self.aliases);
            let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
            let Some((cancel, ready)) = build.rewind(i, &lost, available, self.now) else { continue };
            self.effects.push(Effect::BuildChanged { build: b });
            self.withdraw(cancel);
            for d in ready {
                self.schedule(b, d);
            }
            // The job, and gang members sent again, left the core: that
            // makes room for jobs `max_parallel` held back, which may be
            // the very needs built again.
            self.release_held(b);
        }
        again
    }

    /// Builds give up waiting: each waiter leaves the core's job (which
    /// stops once its last waiter is gone).
    fn withdraw(&mut self, waiters: Vec<(JobId, WaiterId)>) {
        for (job, waiter) in waiters {
            self.waiters.remove(&waiter);
            let _ = self.core.handle(self.now, Event::Cancel { job, waiter });
            // A job other builds still wait for belongs to the first of
            // them from now on: it leaves the queue (and the quota) of a
            // build that no longer wants it (the core moves it only if it
            // is queued and belonged elsewhere).
            if let Some(&(b, _)) = self.job_waiters(&job).first() {
                let (tenant, queue) = self.builds[&b].owner();
                let rehome =
                    Event::Rehome { job, tenant: tenant.to_owned(), queue: queue.map(str::to_owned) };
                let _ = self.core.handle(self.now, rehome);
            }
        }
    }

    fn retry(&mut self, id: u64) -> Result<Reply, SolverError> {
        let build = self.builds.get_mut(&id).map(Arc::make_mut).ok_or(SolverError::UnknownBuild(id))?;
        // A succeeded job's output is gone once no live worker and not the
        // shared cache holds it: a retried job that needs it runs it again.
        let available = availability(&self.core, &self.outputs, &self.remote, &self.aliases);
        let ready = build.retry(self.now, available).map_err(SolverError::CannotRetry)?;
        self.effects.push(Effect::BuildChanged { build: id });
        for i in ready {
            self.schedule(id, i);
        }
        self.finish_if_done(id);
        Ok(Reply::Done)
    }

    fn cancel(&mut self, id: u64) -> Result<Reply, SolverError> {
        let build = self.builds.get_mut(&id).map(Arc::make_mut).ok_or(SolverError::UnknownBuild(id))?;
        if build.state.is_final() {
            return Ok(Reply::Done);
        }
        let waiters = build.cancel_all(self.now);
        self.withdraw(waiters);
        self.effects.push(Effect::BuildChanged { build: id });
        self.finish_if_done(id);
        Ok(Reply::Done)
    }

    // ------------------------------------------------------------------
    // Reacting to the core
    // ------------------------------------------------------------------

    /// Hands a build job whose dependencies are done to the core, unless its
    /// result is already known and held by a live worker: then it is cached
    /// (unless the build asked for no cache).
    fn schedule(&mut self, build: u64, job: u32) {
        let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
        if b.in_gang(job) {
            // A gang member waits for the rest of its gang (see
            // `release_gangs`).
            b.gang_ready(job);
            self.release_gangs(build);
            return;
        }
        if self.cache_hit(build, job) || self.cutoff_hit(build, job) {
            self.cache_hits.push((build, job));
            return;
        }
        let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
        if !b.has_room() {
            b.hold(job);
            return;
        }
        self.hand_to_core(build, job);
    }

    /// Is job `job`'s result known and held by a live worker (and may the
    /// build use it)?
    fn cache_hit(&self, build: u64, job: u32) -> bool {
        let b = &self.builds[&build];
        let id = JobId::from(b.def(job).id);
        // The core's hashed lookup first: most jobs scheduled are not held
        // anywhere yet.
        !b.must_run(job) && self.core.locate_artifact(&id).is_some() && self.outputs.contains_key(&id)
    }

    /// Early cutoff: do build job `job`'s inputs (its own content and its
    /// dependencies' outputs) match those of an earlier successful run of
    /// another job whose output can still be had? Then that output is its
    /// own (an alias), and it is cached: a dependency that ran again and
    /// wrote what it wrote before runs none of its dependents again.
    fn cutoff_hit(&mut self, build: u64, job: u32) -> bool {
        let b = &self.builds[&build];
        if b.must_run(job) {
            return false;
        }
        let id = JobId::from(b.def(job).id);
        let Some(earlier) = self.input_key(build, job).and_then(|key| self.cutoffs.get(&key).copied()) else {
            return false;
        };
        let held = self.remote.contains(&earlier) || self.core.locate_artifact(&earlier).is_some();
        if earlier == id || !held || !self.outputs.contains_key(&earlier) {
            return false;
        }
        self.aliases.insert(id, earlier);
        self.sweep_aliases();
        true
    }

    /// Forgets the aliases no kept build has a job of (or whose output is
    /// gone): a cut-off job's alias serves its build's dependents and
    /// `--out`, and a build submitted again makes it anew. One pass once
    /// the aliases have doubled since the last one kept (at least
    /// [`SWEEP_OUTPUTS_AT`]), so they stay within twice what the kept
    /// builds use, at a constant cost per alias.
    fn sweep_aliases(&mut self) {
        if self.aliases.len() < self.aliases_swept.saturating_mul(2).max(SWEEP_OUTPUTS_AT) {
            return;
        }
        let kept: std::collections::BTreeSet<JobId> = self
            .builds
            .values()
            .flat_map(|b| b.plan().spec().jobs.iter().map(|j| JobId::from(j.id)))
            .collect();
        let outputs = &self.outputs;
        self.aliases.retain(|job, other| kept.contains(job) && outputs.contains_key(other));
        self.aliases_swept = self.aliases.len();
    }

    /// Gangs whose members are all ready or over go on together: members
    /// whose result is cached finish from the cache, the others go to the
    /// core as one gang whose `min_available` counts the members that
    /// already succeeded. If too few members can still run to reach
    /// `min_available` (others failed or were skipped), the rest fail.
    /// Gang members do not count against `max_parallel`.
    ///
    /// The core knows a job by its content, so a member whose job is in the
    /// core already joins it, in whatever gang instance it is there: that
    /// of another build that shares the gang, or an older one (a partner of
    /// a member that failed, still running for another build). Joining
    /// would split this instance, whose other members would then wait for
    /// partners that never come: unless the open members are exactly one
    /// gang instance in the core, the gang is held back until those jobs
    /// leave the core.
    fn release_gangs(&mut self, build: u64) {
        let released =
            self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists").take_ready_gangs();
        for gang in released {
            let b = &self.builds[&build];
            // Members cancelled or skipped while the gang was held back.
            let members = gang.members.iter().copied().filter(|&m| !b.called_off(m));
            let (hits, open): (Vec<u32>, Vec<u32>) = members.partition(|&m| self.cache_hit(build, m));
            let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
            let (need, done) = b.gang_needs(&gang.name);
            let done = done + hits.len() as u32;
            self.cache_hits.extend(hits.iter().map(|&m| (build, m)));
            if open.is_empty() {
                continue;
            }
            if open.len() as u32 + done < need {
                let detail = format!(
                    "gang {} cannot start: {} of its jobs can still run or have run, it needs {need}",
                    gang.name,
                    open.len() as u32 + done
                );
                for m in open {
                    let result =
                        JobResult { success: false, exit_code: None, cached: false, detail: detail.clone() };
                    self.finished(build, m, &Completion::Ran(result));
                }
                continue;
            }
            if self.splits_a_core_gang(build, &open) {
                let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
                b.hold_gang(&gang.name, &open);
                self.stalled.insert(build);
                continue;
            }
            let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
            let min = need.saturating_sub(done).clamp(1, open.len() as u32);
            b.set_core_min(&gang.name, min);
            for m in open {
                self.hand_to_core(build, m);
            }
        }
    }

    /// Whether handing a gang's `open` members to the core would join some
    /// of them to jobs there that are not, all of them and nothing else,
    /// one gang instance.
    fn splits_a_core_gang(&self, build: u64, open: &[u32]) -> bool {
        let b = &self.builds[&build];
        let ids: Vec<JobId> = open.iter().map(|&m| JobId::from(b.def(m).id)).collect();
        let live = ids.iter().filter(|id| self.core.has_job(id)).count();
        if live == 0 {
            return false;
        }
        let first = self.core.job_gang(&ids[0]);
        let whole = live == ids.len()
            && first.is_some_and(|(_, members)| members as usize == ids.len())
            && ids.iter().all(|id| self.core.job_gang(id).map(|g| g.0) == first.map(|g| g.0));
        !whole
    }

    /// A run of job `job` failed: if the job may run again
    /// (`retry_on_failure`, counted in [`Solver::failed_runs`]), each of
    /// `waiters` whose build goes on queues it again, and the waiters left
    /// (those of builds that stop, or all once the reruns are used up) are
    /// returned to take the failure, with whether the job runs again.
    fn rerun_failed(
        &mut self,
        job: JobId,
        waiters: Vec<WaiterId>,
        result: &JobResult,
    ) -> (Vec<WaiterId>, bool) {
        let of = |solver: &Solver, w: &WaiterId| solver.waiters.get(w).copied();
        let Some((b, i)) = waiters.first().and_then(|w| of(self, w)) else { return (waiters, false) };
        if self.lost_input_failures.contains(&job) {
            return (waiters, false);
        }
        let allowed = self.builds[&b].def(i).retry_on_failure;
        let failed = self.failed_runs.get(&job).map_or(0, |r| r.failed) + 1;
        if failed > allowed {
            return (waiters, false);
        }
        // The attempt that just failed: the next counts on from it.
        let attempts = self.builds[&b].attempts(i);
        let (again, left): (Vec<WaiterId>, Vec<WaiterId>) =
            waiters.into_iter().partition(|w| of(self, w).is_some_and(|(b, i)| self.builds[&b].may_rerun(i)));
        if again.is_empty() {
            return (left, false);
        }
        self.failed_runs.insert(job, Reruns { failed, attempts });
        let reason = format!("run {failed} failed ({})", failure_summary(result));
        let reason = format!("{reason}; running it again ({failed} of {allowed} reruns on failure)");
        for w in again {
            let (b, i) = self.waiters.remove(&w).expect("a waiter of a rerun job");
            let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
            build.failed_run(i, attempts, &reason, self.now);
            self.hand_to_core(b, i);
        }
        (left, true)
    }

    /// Hands job `job` to the core.
    fn hand_to_core(&mut self, build: u64, job: u32) {
        let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
        let waiter = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        self.waiters.insert(waiter, (build, job));
        let id = JobId::from(b.def(job).id);
        b.queued(job, waiter, self.now);
        self.effects.push(Effect::BuildChanged { build });
        // A job another build already brought to the core only gains a
        // waiter; its spec is built for the first one alone.
        let joined = self.core.has_job(&id);
        let event = if joined {
            Event::Join { job: id, waiter }
        } else {
            let mut spec = self.builds[&build].core_spec(job);
            // Locality: a dependency's output may be another job's artifact.
            for dep in &mut spec.deps {
                *dep = self.artifact_of(*dep);
            }
            Event::Schedule { spec, waiter }
        };
        let _ = self.core.handle(self.now, event);
        // Joined to a run already under way for another build: this build
        // sees it run too (its worker, its log), as if it had started it.
        if let Some(view) = self.core.job_view(&id).filter(|_| joined)
            && let JobStatus::Assigned { worker, run } | JobStatus::Running { worker, run } = view.status
        {
            let name = self.workers.get(&worker.0).map(|w| w.name.clone()).unwrap_or_default();
            // Suspended for another job by an eviction: so it shows, and
            // `drover resume` leaves it to the core.
            let evicted_by = self.core.evicted_by(&id).map(|by| self.job_label(&by));
            let attempt = view.attempts + self.failed_runs.get(&id).map_or(0, |r| r.attempts);
            // Held by `drover suspend` from a build that shares it.
            let held = self
                .job_waiters(&id)
                .into_iter()
                .any(|(b, i)| b != build && self.builds[&b].holds_suspended(i, run.0));
            let b = self.builds.get_mut(&build).map(Arc::make_mut).expect("build exists");
            b.started(job, worker.0, run.0, attempt, name, self.now);
            if held {
                b.shared_suspension(job, run.0, true, self.now);
            }
            if let Some(by) = evicted_by {
                b.evicted(job, by, self.now);
            }
        }
    }

    /// Applies the core's decisions until it has none left (completions may
    /// schedule dependents, which may decide more).
    fn drain(&mut self) {
        loop {
            // Cache hits finish here, in a loop rather than recursively: a long
            // chain of cached jobs must not grow the stack.
            while let Some((b, i)) = self.cache_hits.pop() {
                let id = JobId::from(self.builds[&b].def(i).id);
                let detail = match self.aliases.get(&id) {
                    Some(_) => CUTOFF_DETAIL.to_owned(),
                    None => String::new(),
                };
                let cached = JobResult { success: true, exit_code: Some(0), cached: true, detail };
                self.finished(b, i, &Completion::Ran(cached));
            }
            let decisions = self.core.take_decisions();
            if decisions.is_empty() && self.cache_hits.is_empty() {
                self.lost_input_failures.clear();
                return;
            }
            for d in decisions {
                self.apply(d);
            }
        }
    }

    fn job_waiters(&self, job: &JobId) -> Vec<(u64, u32)> {
        self.core
            .job_view(job)
            .map(|v| v.waiters.iter().filter_map(|w| self.waiters.get(w).copied()).collect())
            .unwrap_or_default()
    }

    /// A job for people: "NAME (build B)" of its first waiting build, or
    /// its ID.
    fn job_label(&self, job: &JobId) -> String {
        match self.job_waiters(job).first() {
            Some(&(b, i)) => format!("{} (build {b})", self.builds[&b].def(i).name),
            None => job.to_string(),
        }
    }

    fn apply(&mut self, d: Decision) {
        match d {
            // Cancelled since the core decided it (a gang restarted while
            // the decisions of its step were applied): nothing to start.
            Decision::Assign { run, .. } if self.core.run_info(run).is_none() => {}
            Decision::Assign { worker, job, run, attempt } => {
                // A rerun after failed runs counts on from them.
                let attempt = attempt + self.failed_runs.get(&job).map_or(0, |r| r.attempts);
                let waiters = self.job_waiters(&job);
                let worker_name = self.workers.get(&worker.0).map(|w| w.name.clone()).unwrap_or_default();
                for &(b, i) in &waiters {
                    let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
                    build.started(i, worker.0, run.0, attempt, worker_name.clone(), self.now);
                    self.effects.push(Effect::BuildChanged { build: b });
                }
                if let Some(&(b, i)) = waiters.first() {
                    // Taken with the trees the assignment names.
                    if let Some(key) = self.input_key(b, i) {
                        self.run_keys.insert(run.0, key);
                    }
                    let mut assignment = self.assignment(b, i, run.0, attempt);
                    assignment.no_cache = waiters.iter().any(|&(b, i)| self.builds[&b].must_run(i));
                    self.effects.push(Effect::Assign { worker: worker.0, assignment: Box::new(assignment) });
                }
            }
            Decision::Drop { worker, run } => {
                self.effects.push(Effect::Drop { worker: worker.0, run: run.0 })
            }
            Decision::Stop { worker, run } => {
                self.effects.push(Effect::Stop { worker: worker.0, run: run.0 })
            }
            Decision::Suspend { worker, run, by } => {
                // Each build that waits for the job records the eviction;
                // the worker stops the run's processes once.
                let by = self.job_label(&by);
                let Some((_, job, _)) = self.core.run_info(run) else { return };
                for (b, i) in self.job_waiters(&job) {
                    self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists").evicted(
                        i,
                        by.clone(),
                        self.now,
                    );
                    self.effects.push(Effect::BuildChanged { build: b });
                }
                self.effects.push(Effect::Suspend { worker: worker.0, run: run.0, resume: false });
            }
            Decision::Resume { worker, run } => {
                let Some((_, job, _)) = self.core.run_info(run) else { return };
                let mut go = true;
                for (b, i) in self.job_waiters(&job) {
                    go &= self
                        .builds
                        .get_mut(&b)
                        .map(Arc::make_mut)
                        .expect("build exists")
                        .evict_resumed(i, self.now);
                    self.effects.push(Effect::BuildChanged { build: b });
                }
                // A run `drover suspend` also holds stays stopped.
                if go {
                    self.effects.push(Effect::Suspend { worker: worker.0, run: run.0, resume: true });
                }
            }
            Decision::WorkerLost { worker } => {
                self.effects.push(Effect::WorkerLost { worker: worker.0 });
                self.worker_lost(worker.0);
            }
            Decision::Requeued { job, attempts, reason } => {
                let waiters = self.job_waiters(&job);
                for &(b, i) in &waiters {
                    self.builds
                        .get_mut(&b)
                        .map(Arc::make_mut)
                        .expect("build exists")
                        .requeued(i, attempts, &reason, self.now);
                    self.effects.push(Effect::BuildChanged { build: b });
                }
                // A member of a gang that restarts on failure lost its run
                // (its worker was lost, or lost the run) while others of
                // the gang still run: they need it beside them, so the
                // whole gang runs again, as after a failure. Not for an
                // eviction (the `gang` plugin keeps members from being
                // victims; without it, members are placed one by one), nor
                // when the core requeued the whole gang at once (one
                // worker held it all): it starts again together anyway.
                if reason.starts_with("evicted") {
                    return;
                }
                for (b, i) in waiters {
                    // The partners' own runs, as the build saw them start:
                    // the core may have placed a requeued partner anew in
                    // the same step, which is no partner still running.
                    let partners = self.builds[&b].restarting_partner_runs(i);
                    if !partners.iter().any(|&r| self.core.run_info(RunId(r)).is_some()) {
                        continue;
                    }
                    let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
                    if let Some((cancel, again)) = build.restart_gang(i, "lost its run", self.now) {
                        self.withdraw(cancel);
                        for m in again {
                            self.schedule(b, m);
                        }
                        self.release_gangs(b);
                    }
                }
            }
            Decision::Cancelled { job, .. } => {
                self.failed_runs.remove(&job);
                self.worker_faults.remove(&job);
            }
            Decision::Finished { job, waiters, completion } => {
                let end = match &completion {
                    Completion::Ran(r) if r.success && r.cached => RunEnd::Cached,
                    Completion::Ran(r) if r.success => RunEnd::Succeeded,
                    Completion::Ran(_) => RunEnd::Failed,
                    Completion::GaveUp(_) => RunEnd::GaveUp,
                };
                *self.runs_ended.entry(end).or_default() += 1;
                let (waiters, rerun) = match &completion {
                    Completion::Ran(r) if !r.success => self.rerun_failed(job, waiters, r),
                    _ => (waiters, false),
                };
                // The count goes with the job, unless it runs again for
                // some of its builds.
                if !rerun {
                    self.failed_runs.remove(&job);
                }
                // Given up after its worker failed its run: the worker's
                // words say more than the worker's name.
                let fault = self.worker_faults.remove(&job);
                let completion = match (completion, fault) {
                    (Completion::GaveUp(reason @ FailReason::TooManyAttempts { .. }), Some(said)) => {
                        Completion::Ran(JobResult {
                            success: false,
                            exit_code: None,
                            cached: false,
                            detail: format!("{reason}; the worker said: {said}"),
                        })
                    }
                    (completion, _) => completion,
                };
                for waiter in waiters {
                    let Some((b, i)) = self.waiters.remove(&waiter) else { continue };
                    self.finished(b, i, &completion);
                }
            }
        }
    }

    fn finished(&mut self, b: u64, i: u32, completion: &Completion) {
        let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
        let (state, exit_code, detail) = match completion {
            // A cached job may say where its output came from.
            Completion::Ran(r) if r.success && r.cached => (JobState::Cached, r.exit_code, r.detail.clone()),
            Completion::Ran(r) if r.success => (JobState::Succeeded, r.exit_code, String::new()),
            Completion::Ran(r) => (JobState::Failed, r.exit_code, r.detail.clone()),
            Completion::GaveUp(reason) => (JobState::Failed, None, reason.to_string()),
        };
        build.finished(i, state, exit_code, detail, self.now);
        self.effects.push(Effect::BuildChanged { build: b });
        if state.is_success() {
            for d in build.unblocked_by(i) {
                self.schedule(b, d);
            }
        } else if !matches!(completion, Completion::GaveUp(FailReason::Unplaceable(_)))
            && let Some((cancel, again)) = build.restart_gang(i, "failed", self.now)
        {
            // (A member that can never be placed would fail the same way
            // again: its gang does not restart for it.)
            // A gang that restarts on failure runs again, whole.
            self.withdraw(cancel);
            for m in again {
                self.schedule(b, m);
            }
        } else {
            // The build's on-error policy decides what else stops.
            let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
            let cancel = build.stop_after_failure(i, self.now);
            self.withdraw(cancel);
        }
        self.release_held(b);
        // A job that ended (or was skipped) may complete a gang.
        self.release_gangs(b);
        self.finish_if_done(b);
    }

    /// Jobs left build `b`'s share of the core: jobs held back by
    /// `max_parallel` may go, as far as there is room.
    fn release_held(&mut self, b: u64) {
        while let Some(j) = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists").next_held() {
            self.schedule(b, j);
        }
    }

    fn finish_if_done(&mut self, b: u64) {
        let build = self.builds.get_mut(&b).map(Arc::make_mut).expect("build exists");
        if build.finish_if_done(self.now) {
            self.effects.push(Effect::BuildChanged { build: b });
        }
    }

    fn assignment(&self, b: u64, i: u32, run: u64, attempt: u32) -> Assignment {
        let build = &self.builds[&b];
        let def = build.def(i);
        let deps = def
            .needs
            .iter()
            .zip(build.needs_of(i))
            .map(|(name, &d)| {
                let dep = build.def(d);
                DepInput {
                    name: name.clone(),
                    job: dep.id,
                    tree: self.output_tree(dep.id),
                    holders: self.artifact_holders(dep.id),
                    artifact: self.artifact_alias(dep.id),
                }
            })
            .collect();
        Assignment {
            run,
            attempt,
            job: def.id,
            name: def.name.clone(),
            commands: def.commands.clone(),
            env: def.env.clone(),
            timeout_ms: def.timeout_ms,
            sources: build.sources_of(i),
            deps,
            no_cache: false,
            pull: !build.must_run(i) && self.remote.contains(&JobId::from(def.id)),
            tokens: def.tokens.clone(),
            exclusive: def.exclusive.clone(),
        }
    }
}

/// Whether a succeeded job's output can still be had: the shared cache holds
/// it, or a live worker does (and its tree is known).
fn availability<'a>(
    core: &'a Scheduler,
    outputs: &'a BTreeMap<JobId, Hash32>,
    remote: &'a std::collections::BTreeSet<JobId>,
    aliases: &'a BTreeMap<JobId, JobId>,
) -> impl Fn(&JobDef) -> bool + 'a {
    move |def| {
        let id = JobId::from(def.id);
        let id = aliases.get(&id).copied().unwrap_or(id);
        remote.contains(&id) || (outputs.contains_key(&id) && core.locate_artifact(&id).is_some())
    }
}

/// A job's reruns on failure so far (see `Solver::failed_runs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Reruns {
    /// Its runs that failed.
    failed: u32,
    /// The attempts made before the core took it again.
    attempts: u32,
}

/// A failed run's result in a few words: how it ended (the first line of
/// its detail, as the worker writes it: `exit code 5; stderr:`, then the
/// tail) and the last line of the tail it reported, both clipped.
fn failure_summary(result: &JobResult) -> String {
    let (head, tail) = result.detail.split_once('\n').unwrap_or((&result.detail, ""));
    let head =
        head.strip_suffix("; stderr:").or_else(|| head.strip_suffix("; stdout:")).unwrap_or(head).trim();
    let head = match (head, result.exit_code) {
        ("", Some(code)) => format!("exit code {code}"),
        ("", None) => "no exit code".to_owned(),
        (head, _) => clip(head, 120),
    };
    match tail.lines().rev().map(str::trim).find(|l| !l.is_empty()) {
        Some(last) => format!("{head}: {}", clip(last, 160)),
        None => head,
    }
}

/// `text`, cut to at most `max` bytes (on a character boundary) with an
/// ellipsis when it was longer.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    format!("{}…", &text[..text.floor_char_boundary(max)])
}

#[cfg(test)]
mod tests;
