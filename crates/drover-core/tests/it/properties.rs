//! Property tests: random event sequences against the scheduling core, and
//! scenario-style properties with large queues.
//!
//! [`case`] generates a config, eight job specs (`j0`..`j7`: three tenants,
//! slots, CPU, memory, two tokens that may be wanted exclusively, an `os`
//! label, dependencies on each other's artifacts) and a program over four
//! workers and four waiters: registrations, heartbeats, departures, cache
//! news, schedules, cancels, starts, exits, lost runs (`RunLost`), the clock
//! moving (`Tick`) and the shell coming back after downtime (`Resumed`).
//! [`Harness`] turns each operation into an event against the live state (a
//! cancel picks a real waiter, an exit a run in flight), hands it to the
//! scheduler and follows the decisions with a small model built only from
//! what went in and came out: live workers (capacity, lease, cache), runs in
//! flight, pending jobs (waiters, attempts, live run). Time moves only in
//! `Tick` and `Resumed` steps, so in every other step the decisions follow
//! from the event alone.
//!
//! After every step the harness runs `check_invariants` and its own checks,
//! filing each broken rule under its property; each test fails on its own
//! property (or the invariant checker) with the shrunk event log. Issue 2's
//! properties:
//!
//! - (a) `resources_are_never_over_committed`
//! - (b) `exclusive_tokens_are_never_shared`,
//!   `an_exclusive_job_is_not_starved_by_a_stream_of_shared_users`
//! - (c) `replaying_the_log_rebuilds_the_same_state_and_decisions`
//! - (d) `one_live_copy_per_job_and_every_waiter_gets_the_completion`
//! - (e) `queues_follow_the_locality_rules`
//! - (f) `a_flood_delays_another_tenants_job_by_at_most_one_free_slot`
//! - (g) `a_cancelled_job_is_never_assigned_afterwards`
//! - (h) `a_lost_worker_requeues_or_fails_its_runs_and_forgets_its_artifacts`
//!
//! and `every_job_ends_once_workers_keep_working` (no starvation, no
//! deadlock); `the_generator_reaches_what_the_properties_are_about` keeps them
//! from holding vacuously. Failure persistence is off, so a failure writes no
//! regressions file into the source tree: turn it into a scenario instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use drover_core::{
    CancelStage, Capacity, Completion, Config, Decision, Event, Evict, FailReason, JobId, JobResult, JobSpec,
    JobStatus, Millis, PluginConfig, QueueConfig, QueueName, Rejected, Request, RunId, Scheduler, Tier,
    Timer, TimerKind, WaiterId, WorkerId,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

const WORKERS: u64 = 4;
const JOBS: usize = 8;
const TENANTS: [&str; 3] = ["ada", "bob", "cy"];
const TOKENS: [&str; 2] = ["net", "gpu"];

fn job_id(k: usize) -> JobId {
    JobId::named(&format!("j{k}"))
}

/// What a job takes: slots, CPU, memory, `net`, `gpu` (holding a token
/// exclusively takes at least one).
fn takes(spec: &JobSpec) -> [u64; 5] {
    let wants = |t: &str| spec.exclusive.iter().any(|e| e == t);
    let token = |t: &str| spec.request.tokens.get(t).copied().unwrap_or(0).max(u64::from(wants(t)));
    [spec.request.slots.into(), spec.request.cpu, spec.request.memory, token("net"), token("gpu")]
}

/// Few cases (tests build unoptimized), no regressions file, and the XorShift
/// generator (ChaCha costs more than the cases in a debug build).
fn cases(n: u32) -> ProptestConfig {
    let rng_algorithm = RngAlgorithm::XorShift;
    ProptestConfig { failure_persistence: None, rng_algorithm, ..ProptestConfig::with_cases(n) }
}

// ---------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------

/// One step of a program: an event, or an operation on the live state that
/// [`Harness::op`] turns into one.
#[derive(Clone, Debug)]
enum Op {
    Send(Event),
    /// Schedule job `.0` for waiter `.1`.
    Schedule(usize, u64),
    /// Join job `.0` for waiter `.1` (refused unless it is pending).
    Join(usize, u64),
    /// Cancel for one of the waiters of a pending job.
    Cancel(Index),
    /// A pending job moves to tenant `.1`.
    Rehome(Index, usize),
    /// Start a run that has not started.
    Start(Index),
    /// A run in flight exits (successfully or not).
    Exit(Index, bool),
    /// A run in flight is lost by its worker.
    LoseRun(Index),
    /// This many ms later: `Tick` (the clock moves) or `Resumed` (the shell
    /// was down meanwhile).
    Later(u64, Event),
}

#[derive(Clone, Debug)]
struct Case {
    config: Config,
    specs: Vec<JobSpec>,
    ops: Vec<Op>,
}

fn tokens(amounts: [u64; 2]) -> BTreeMap<String, u64> {
    TOKENS.iter().zip(amounts).filter(|(_, n)| *n > 0).map(|(t, n)| ((*t).to_owned(), n)).collect()
}

fn os_label(os: Option<bool>) -> BTreeMap<String, String> {
    os.map(|mac| ("os".to_owned(), if mac { "mac" } else { "linux" }.to_owned())).into_iter().collect()
}

fn artifacts(n: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<JobId>> {
    prop::collection::vec((0..JOBS).prop_map(job_id), n)
}

fn join() -> impl Strategy<Value = Op> {
    let token = prop_oneof![1 => Just(0u64), 3 => 1..=2u64];
    (
        0..WORKERS,
        1..=4u32,
        2..=8u64,
        2..=8u64,
        [token.clone(), token],
        any::<Option<bool>>(),
        artifacts(0..=3),
    )
        .prop_map(|(w, slots, cpu, gib, amounts, os, artifacts)| {
            let capacity = Capacity { slots, cpu: cpu * 1000, memory: gib << 30, tokens: tokens(amounts) };
            let (worker, name, labels) = (WorkerId(w), format!("w{w}"), os_label(os));
            Op::Send(Event::WorkerJoined { worker, name, capacity, labels, artifacts })
        })
}

fn job_spec(k: usize) -> impl Strategy<Value = JobSpec> {
    let token = prop::bool::weighted(0.3).prop_map(u64::from);
    let exclusive = prop::bool::weighted(0.15);
    let shape = (prop_oneof![4 => Just(1u32), 1 => Just(2)], 0..=3u64, 0..=3u64, [token.clone(), token]);
    let rest = (0..TENANTS.len(), [exclusive, exclusive], prop::option::weighted(0.25, any::<bool>()));
    let order = (-1..=1i32, 1..=3u32, prop::collection::btree_set(0..JOBS, 0..=2));
    (shape, rest, order).prop_map(
        move |((slots, cpu, gib, amounts), (tenant, exclusive, os), (priority, max_attempts, deps))| {
            let mut spec = JobSpec::new(job_id(k), TENANTS[tenant]);
            spec.request = Request { slots, cpu: cpu * 1000, memory: gib << 30, tokens: tokens(amounts) };
            spec.exclusive = TOKENS.iter().zip(exclusive).filter(|e| e.1).map(|e| e.0.to_string()).collect();
            (spec.labels, spec.priority, spec.max_attempts) = (os_label(os), priority, max_attempts);
            spec.deps = deps.into_iter().filter(|&d| d != k).map(job_id).collect();
            spec
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    let worker = (0..WORKERS).prop_map(WorkerId);
    let news = || (worker.clone(), artifacts(1..=3));
    prop_oneof![
        2 => join(),
        3 => worker.clone().prop_map(|worker| Op::Send(Event::Heartbeat { worker })),
        1 => worker.clone().prop_map(|worker| Op::Send(Event::WorkerLeft { worker })),
        1 => worker.clone().prop_map(|worker| Op::Send(Event::WorkerUnreachable { worker })),
        1 => worker.clone().prop_map(|worker| Op::Send(Event::WorkerDraining { worker })),
        1 => news().prop_map(|(worker, artifacts)| Op::Send(Event::ArtifactsAdded { worker, artifacts })),
        1 => news().prop_map(|(worker, artifacts)| Op::Send(Event::ArtifactsEvicted { worker, artifacts })),
        6 => (0..JOBS, 0..4u64).prop_map(|(job, waiter)| Op::Schedule(job, waiter)),
        2 => (0..JOBS, 0..4u64).prop_map(|(job, waiter)| Op::Join(job, waiter)),
        3 => any::<Index>().prop_map(Op::Cancel),
        1 => (any::<Index>(), 0..TENANTS.len()).prop_map(|(i, t)| Op::Rehome(i, t)),
        4 => any::<Index>().prop_map(Op::Start),
        4 => (any::<Index>(), prop::bool::weighted(0.8)).prop_map(|(i, ok)| Op::Exit(i, ok)),
        1 => any::<Index>().prop_map(Op::LoseRun),
        3 => (1..=120u64).prop_map(|ms| Op::Later(ms, Event::Tick)),
        1 => (1..=2000u64).prop_map(|ms| Op::Later(ms, Event::Resumed)),
    ]
}

/// No queues (one implicit queue) in a third of the cases; otherwise two
/// weighted queues, the second capped in slots and sometimes split in two
/// children, with the tenants spread over the leaves.
fn queues() -> impl Strategy<Value = (Vec<QueueConfig>, BTreeMap<String, String>)> {
    let some = (1..=3u32, 1..=3u32, 1..=3u32, any::<bool>(), [0..3usize, 0..3usize, 0..3usize]);
    prop_oneof![
        1 => Just((Vec::new(), BTreeMap::new())),
        2 => some.prop_map(|(wa, wb, cap, nested, map)| {
            let queue = |name: &str, weight: u32, parent: Option<&str>| QueueConfig {
                name: name.to_owned(),
                weight,
                parent: parent.map(str::to_owned),
                ..QueueConfig::default()
            };
            let mut queues = vec![queue("a", wa, None), queue("b", wb, None)];
            queues[1].capability.slots = Some(cap);
            let leaves: Vec<&str> = if nested {
                queues.push(queue("b1", 1, Some("b")));
                queues.push(queue("b2", 2, Some("b")));
                vec!["a", "b1", "b2"]
            } else {
                vec!["a", "b", "default"]
            };
            let tenants = TENANTS.iter().zip(map).map(|(t, i)| (t.to_string(), leaves[i].to_owned())).collect();
            (queues, tenants)
        }),
    ]
}

/// The plugins the tiers may list.
const PLUGINS: [&str; 9] =
    ["priority", "gang", "drf", "proportion", "fairness", "critical-path", "binpack", "spread", "predicates"];

/// The default tiers in half the cases (`None`); otherwise a random subset
/// of the plugins in a random order, cut into one to three tiers, `drf`
/// sometimes choosing preemption victims, `binpack` and `spread` with
/// random weights.
fn tiers() -> impl Strategy<Value = Option<Vec<Tier>>> {
    let shape = (Just(PLUGINS.to_vec()).prop_shuffle(), any::<[bool; 9]>(), [1..=8usize, 1..=8usize]);
    let custom = (shape, any::<bool>(), 1..=3u32, 1..=3u32).prop_map(
        |((names, keep, cuts), drf_preempts, binpack, spread)| {
            let mut tiers = vec![Tier::default()];
            for (i, name) in names.into_iter().enumerate() {
                if cuts.contains(&i) && !tiers.last().expect("a tier").plugins.is_empty() {
                    tiers.push(Tier::default());
                }
                if keep[i] {
                    let mut plugin = PluginConfig::named(name);
                    plugin.preemptable = name == "drf" && drf_preempts;
                    plugin.weight = match name {
                        "binpack" => Some(binpack),
                        "spread" => Some(spread),
                        _ => None,
                    };
                    tiers.last_mut().expect("a tier").plugins.push(plugin);
                }
            }
            tiers.retain(|t| !t.plugins.is_empty());
            Some(tiers)
        },
    );
    prop_oneof![1 => Just(None), 1 => custom]
}

/// May the core evict runs under `config`? Preempt needs `priority` or a
/// preemptable `drf` in the tiers, reclaim needs `proportion`.
fn evicts(config: &Config) -> bool {
    let listed = |f: &dyn Fn(&PluginConfig) -> bool| config.tiers.iter().flat_map(|t| &t.plugins).any(f);
    let preempt = listed(&|p| p.name == "priority" || (p.name == "drf" && p.preemptable));
    (config.preempt && preempt) || (config.reclaim && listed(&|p| p.name == "proportion"))
}

/// Two or three registrations first, so that most jobs find a worker.
fn case() -> impl Strategy<Value = Case> {
    let timing = (0..=30u64, 0..=60u64, 150..=400u64, prop_oneof![Just(0u64), Just(80)], any::<u64>());
    let config = (timing, queues(), any::<(bool, bool, bool)>(), 0..3u32, tiers()).prop_map(
        |(
            (cache, deps, lease, grace, seed),
            (queues, tenant_queues),
            (preempt, reclaim, suspend),
            placement,
            tiers,
        )| {
            // Custom tiers carry their own placement weights.
            let placement = if tiers.is_some() { 0 } else { placement };
            let config = Config {
                cache_timeout: Millis(cache),
                deps_timeout: Millis(deps),
                lease_timeout: Millis(lease),
                unplaceable_grace: Millis(grace),
                // On or off by the seed's top bit (a draw of its own would
                // shift every later draw of the fixed-seed cases).
                lost_worker_grace: Millis(if seed >> 63 == 1 { 80 } else { 0 }),
                // The next bit, for the wait of jobs while no worker is alive.
                no_worker_grace: Millis(if (seed >> 62) & 1 == 1 { 60 } else { 0 }),
                seed,
                queues,
                tenant_queues,
                preempt,
                reclaim,
                // Eviction by suspension in half the cases that evict.
                evict: if suspend && (preempt || reclaim) { Evict::Suspend } else { Evict::Kill },
                // An exemption from eviction by the seed's third bit.
                eviction_exempt: Millis(if (seed >> 61) & 1 == 1 { 50 } else { 0 }),
                binpack: u32::from(placement == 1),
                spread: u32::from(placement == 2),
                tiers: tiers.unwrap_or_else(Config::default_tiers),
            };
            assert_eq!(config.validate(), Ok(()), "generated config");
            config
        },
    );
    let specs: Vec<_> = (0..JOBS).map(job_spec).collect();
    let program = (prop::collection::vec(join(), 2..=3), prop::collection::vec(op(), 20..80));
    (config, specs, program).prop_map(|(config, specs, (mut ops, rest))| {
        ops.extend(rest);
        Case { config, specs, ops }
    })
}

/// [`case`] with preemption on and evictions by suspension, under the
/// default tiers (so `priority` picks victims), workers of one or two
/// slots, and one-slot jobs of at most 1 GiB, most without labels or
/// tokens, with
/// spread-out priorities, so that evictions are
/// common and most victims may be suspended: the model then checks every
/// `Suspend` and `Resume` besides everything else.
fn suspend_case() -> impl Strategy<Value = Case> {
    case().prop_map(|mut case| {
        case.config.preempt = true;
        case.config.evict = Evict::Suspend;
        case.config.tiers = Config::default_tiers();
        // Small workers: jobs compete for slots; runs start more often (a
        // run that has not started is dropped, not suspended).
        let mut cancels = 0;
        for op in &mut case.ops {
            match op {
                Op::Send(Event::WorkerJoined { capacity, .. }) => capacity.slots = capacity.slots.min(2),
                Op::Cancel(i) => {
                    cancels += 1;
                    if cancels % 3 != 0 {
                        *op = Op::Start(*i);
                    }
                }
                _ => {}
            }
        }
        for (k, spec) in case.specs.iter_mut().enumerate() {
            spec.priority = k as i32 % 4;
            spec.request.slots = 1;
            spec.request.memory = spec.request.memory.min(1 << 30);
            spec.labels.clear();
            if k % 4 != 0 {
                spec.request.tokens.clear();
                spec.exclusive.clear();
            }
        }
        case
    })
}

// ---------------------------------------------------------------------------
// The harness and its model
// ---------------------------------------------------------------------------

/// The property a broken rule belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prop {
    /// `check_invariants`; a refused event decides nothing.
    Invariants,
    Capacity,
    Exclusive,
    Dedup,
    Queues,
    Cancellation,
    WorkerLoss,
    Liveness,
}

/// Files a broken rule unless the condition holds.
macro_rules! check {
    ($h:expr, $cond:expr, $prop:ident, $($msg:tt)+) => {
        if !$cond {
            let msg = format!($($msg)+);
            $h.fail(Prop::$prop, msg);
        }
    };
}

/// One event handed to the core, with what came back.
#[derive(Clone, Debug, PartialEq)]
struct Step {
    now: Millis,
    event: Event,
    result: Result<(), Rejected>,
    decisions: Vec<Decision>,
}

#[derive(Clone, Debug)]
struct LiveWorker {
    capacity: Capacity,
    lease: Millis,
    held: BTreeSet<JobId>,
    /// Its registration's name and labels, for coming back after draining.
    name: String,
    labels: BTreeMap<String, String>,
    /// Shutting down once its runs end: nothing new may go to it.
    draining: bool,
}

/// A run in flight; `live` is false once its job was cancelled (the run is
/// being dropped or stopped, and keeps its resources until it exits);
/// `suspended` while an eviction holds it suspended (it keeps its memory
/// and tokens, not its slots and CPU).
#[derive(Debug)]
struct OpenRun {
    worker: WorkerId,
    job: JobId,
    live: bool,
    started: bool,
    suspended: bool,
}

#[derive(Clone, Debug, Default)]
struct Pending {
    waiters: Vec<WaiterId>,
    attempts: u32,
    run: Option<RunId>,
}

/// What the current step's decisions must contain because of its event.
#[derive(Debug, Default)]
struct Expect {
    /// `WorkerLeft`: a `WorkerLost`.
    lost: Option<WorkerId>,
    /// The last waiter cancelled: `Cancelled` at this stage, after a `Drop`
    /// or `Stop` of the run if it has one.
    cancel: Option<(JobId, CancelStage, Option<RunId>)>,
    /// A live run exited: `Finished` with its result.
    finish: Option<(JobId, JobResult)>,
    /// Live runs lost: each job `Requeued`, or given up after its attempts.
    requeue: BTreeSet<JobId>,
}

/// Drives a scheduler with a program and follows it with the model.
struct Harness {
    sched: Scheduler,
    config: Config,
    specs: BTreeMap<JobId, JobSpec>,
    now: Millis,
    workers: BTreeMap<WorkerId, LiveWorker>,
    runs: BTreeMap<RunId, OpenRun>,
    pending: BTreeMap<JobId, Pending>,
    /// Jobs whose last incarnation was cancelled (and not scheduled since).
    cancelled: BTreeSet<JobId>,
    last_run: u64,
    log: Vec<Step>,
    /// Broken rules: property, step, what.
    violations: Vec<(Prop, usize, String)>,
    /// How often states worth testing came up (for the coverage test).
    seen: BTreeMap<&'static str, u32>,
    /// The most workers alive at once so far.
    most_alive: usize,
    /// The workers the core held after the last step.
    held_workers: usize,
}

impl Harness {
    fn run(case: &Case) -> Harness {
        let mut h = Harness {
            sched: Scheduler::new(case.config.clone()),
            config: case.config.clone(),
            specs: case.specs.iter().map(|s| (s.id, s.clone())).collect(),
            now: Millis(0),
            workers: BTreeMap::new(),
            runs: BTreeMap::new(),
            pending: BTreeMap::new(),
            cancelled: BTreeSet::new(),
            last_run: 0,
            log: Vec::new(),
            violations: Vec::new(),
            seen: BTreeMap::new(),
            most_alive: 0,
            held_workers: 0,
        };
        for op in &case.ops {
            h.op(op);
        }
        h
    }

    fn fail(&mut self, prop: Prop, msg: String) {
        self.violations.push((prop, self.log.len().saturating_sub(1), msg));
    }

    fn saw(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    /// The live workers holding an artifact, as the events say.
    fn holders(&self, a: &JobId) -> BTreeSet<WorkerId> {
        self.workers.iter().filter(|w| w.1.held.contains(a)).map(|w| *w.0).collect()
    }

    fn op(&mut self, op: &Op) {
        let pick = |i: &Index, runs: Vec<RunId>| runs.get(i.index(runs.len().max(1))).copied();
        let all_runs = self.runs.keys().copied().collect();
        let event = match op {
            Op::Send(event) => event.clone(),
            Op::Schedule(k, w) => {
                Event::Schedule { spec: self.specs[&job_id(*k)].clone(), waiter: WaiterId(*w) }
            }
            Op::Join(k, w) => Event::Join { job: job_id(*k), waiter: WaiterId(*w) },
            Op::Cancel(i) => {
                let pairs: Vec<(JobId, WaiterId)> =
                    self.pending.iter().flat_map(|(j, p)| p.waiters.iter().map(|w| (*j, *w))).collect();
                let (job, waiter) =
                    pairs.get(i.index(pairs.len().max(1))).copied().unwrap_or((job_id(0), WaiterId(0)));
                Event::Cancel { job, waiter }
            }
            Op::Rehome(i, t) => {
                let pending: Vec<JobId> = self.pending.keys().copied().collect();
                let job = pending.get(i.index(pending.len().max(1))).copied().unwrap_or(job_id(0));
                Event::Rehome { job, tenant: TENANTS[*t].to_owned(), queue: None }
            }
            Op::Start(i) => {
                let unstarted = self.runs.iter().filter(|r| !r.1.started).map(|r| *r.0).collect();
                Event::JobStarted { run: pick(i, unstarted).unwrap_or(RunId(0)) }
            }
            Op::Exit(i, ok) => Event::JobExited {
                run: pick(i, all_runs).unwrap_or(RunId(0)),
                result: if *ok { JobResult::ok() } else { JobResult::failed(1) },
            },
            Op::LoseRun(i) => Event::RunLost { run: pick(i, all_runs).unwrap_or(RunId(0)) },
            Op::Later(ms, event) => {
                self.now = self.now.after(Millis(*ms));
                event.clone()
            }
        };
        self.send(event);
    }

    /// Hands one event to the core and checks the step.
    fn send(&mut self, event: Event) {
        let before = self.sched.clone();
        let result = self.sched.handle(self.now, event.clone());
        let decisions = self.sched.take_decisions();
        let (now, ds) = (self.now, decisions.clone());
        self.log.push(Step { now, event: event.clone(), result: result.clone(), decisions: ds });
        let mut ex = Expect::default();
        if let Event::Join { job, waiter } = &event {
            // Join is Schedule for a pending job, and refused for any other.
            let known = self.pending.get(job).is_some_and(|p| !p.waiters.contains(waiter));
            check!(self, result.is_ok() == known, Dedup, "join {job} for {waiter:?}: {result:?}");
        }
        if result.is_ok() {
            self.apply(&event, before.now(), &mut ex);
        } else {
            // A refused event does what a tick at its time would: the timers
            // due by then fire (see `Scheduler::handle`), nothing else. (Not
            // compared as whole states: a refused re-registration still
            // interns its new token names, which changes no decision.)
            let mut ticked = before.clone();
            ticked.handle(self.now, Event::Tick).expect("a tick is never refused");
            let unchanged = decisions == ticked.take_decisions() && self.sched.timers() == ticked.timers();
            check!(self, unchanged, Invariants, "refused event did more than a tick: {decisions:?}");
        }
        if event == Event::Resumed {
            // A timer already due before the outage (a zero wait armed by
            // the last step's dispatch, at that step's time) fires now, as
            // a tick then would have fired it; every other deadline moves
            // by the outage and none of them fires.
            let delta = self.now.0 - before.now().0;
            let mut settled = before.clone();
            settled.handle(before.now(), Event::Tick).expect("a tick is never refused");
            let due = settled.take_decisions();
            let shift = |t: Timer| Timer { at: Millis(t.at.0 + delta), kind: t.kind };
            let shifted: Vec<Timer> = settled.timers().into_iter().map(shift).collect();
            let ok = self.sched.timers() == shifted && decisions == due;
            check!(
                self,
                ok,
                WorkerLoss,
                "Resumed must shift every deadline by {delta} and fire only those due before"
            );
        }
        for d in &decisions {
            self.decided(d, &mut ex);
        }
        check!(self, ex.lost.is_none(), WorkerLoss, "{:?} left but was not lost", ex.lost);
        check!(self, ex.cancel.is_none(), Cancellation, "no Cancelled for the last waiter: {:?}", ex.cancel);
        check!(self, ex.finish.is_none(), Dedup, "a live run exited, no Finished: {:?}", ex.finish);
        check!(self, ex.requeue.is_empty(), WorkerLoss, "lost runs neither requeued nor given up: {ex:?}");
        self.check_state();
    }

    fn renew(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.lease = self.now.after(self.config.lease_timeout);
        }
    }

    /// The model's side of an accepted event.
    fn apply(&mut self, event: &Event, before: Millis, ex: &mut Expect) {
        match event {
            Event::WorkerJoined { worker, name, capacity, labels, artifacts } => {
                // The list is the worker's whole cache: what it held before
                // and does not list is gone.
                let known = self.workers.contains_key(worker);
                if !known && self.sched.worker_count() == self.held_workers {
                    self.saw("a new worker takes a lost one's place");
                }
                let before = self.workers.remove(worker).map(|w| w.held).unwrap_or_default();
                let held: BTreeSet<JobId> = artifacts.iter().copied().collect();
                if before.iter().any(|a| !held.contains(a)) {
                    self.saw("re-registration drops an artifact it no longer lists");
                }
                let lease = self.now.after(self.config.lease_timeout);
                let (name, labels, capacity) = (name.clone(), labels.clone(), capacity.clone());
                self.workers
                    .insert(*worker, LiveWorker { capacity, lease, held, name, labels, draining: false });
            }
            Event::Heartbeat { worker } => self.renew(*worker),
            Event::WorkerLeft { worker } | Event::WorkerUnreachable { worker } => ex.lost = Some(*worker),
            Event::WorkerDraining { worker } => {
                self.renew(*worker);
                self.workers.get_mut(worker).expect("accepted: live").draining = true;
                self.saw("a worker drains");
            }
            Event::ArtifactsAdded { worker, artifacts } => {
                self.renew(*worker);
                self.workers.get_mut(worker).expect("accepted: live").held.extend(artifacts);
            }
            Event::ArtifactsEvicted { worker, artifacts } => {
                self.renew(*worker);
                self.workers.get_mut(worker).expect("accepted: live").held.retain(|a| !artifacts.contains(a));
            }
            Event::Schedule { spec, waiter } => {
                if self.pending.contains_key(&spec.id) {
                    self.saw("schedule joins a pending job");
                }
                self.cancelled.remove(&spec.id);
                self.pending.entry(spec.id).or_default().waiters.push(*waiter);
            }
            Event::Join { job, waiter } => {
                self.saw("join a pending job");
                self.pending.get_mut(job).expect("accepted: pending").waiters.push(*waiter);
            }
            Event::Rehome { .. } => self.saw("a pending job moves to another tenant"),
            Event::Cancel { job, waiter } => {
                let p = self.pending.get_mut(job).expect("accepted: pending");
                p.waiters.retain(|w| w != waiter);
                if !p.waiters.is_empty() {
                    return self.saw("cancel by one of several waiters");
                }
                let stage = match p.run.map(|r| self.runs[&r].started) {
                    None => CancelStage::Queued,
                    Some(false) => CancelStage::Assigned,
                    Some(true) => CancelStage::Running,
                };
                ex.cancel = Some((*job, stage, p.run));
            }
            Event::JobStarted { run } => {
                self.runs.get_mut(run).expect("accepted: in flight").started = true;
                self.renew(self.runs[run].worker);
            }
            Event::JobExited { run, result } => {
                let r = self.runs.remove(run).expect("accepted: in flight");
                self.renew(r.worker);
                if result.success {
                    self.workers.get_mut(&r.worker).expect("runs are on live workers").held.insert(r.job);
                }
                if r.live {
                    self.pending.get_mut(&r.job).expect("live run: pending job").run = None;
                    ex.finish = Some((r.job, result.clone()));
                } else {
                    self.saw("exit of a cancelled run");
                }
            }
            Event::RunLost { run } => {
                let r = self.runs.remove(run).expect("accepted: in flight");
                if r.live {
                    self.pending.get_mut(&r.job).expect("live run: pending job").run = None;
                    ex.requeue.insert(r.job);
                }
            }
            Event::Resumed => {
                for w in self.workers.values_mut() {
                    w.lease = Millis(w.lease.0 + (self.now.0 - before.0));
                }
            }
            Event::Tick => {}
        }
    }

    /// The model's side of a decision, and the rules it must follow.
    fn decided(&mut self, d: &Decision, ex: &mut Expect) {
        match d {
            Decision::Assign { worker, job, run, attempt } => {
                check!(self, run.0 > self.last_run, Dedup, "{run:?} reused");
                check!(self, self.workers.contains_key(worker), WorkerLoss, "{job} on lost {worker:?}");
                check!(
                    self,
                    self.workers.get(worker).is_none_or(|w| !w.draining),
                    WorkerLoss,
                    "{job} on draining {worker:?}"
                );
                self.last_run = run.0;
                let (was_cancelled, p) = (self.cancelled.contains(job), self.pending.get_mut(job));
                let (pending, live) = (p.is_some(), p.as_ref().and_then(|p| p.run));
                let attempts = p.map(|p| {
                    (p.run, p.attempts) = (Some(*run), p.attempts + 1);
                    p.attempts
                });
                check!(self, pending || !was_cancelled, Cancellation, "cancelled {job} assigned");
                check!(self, pending || was_cancelled, Dedup, "{job} assigned but not pending");
                check!(self, live.is_none(), Dedup, "{job} assigned as {run:?} while {live:?} is live");
                check!(self, attempts.is_none_or(|a| a == *attempt), WorkerLoss, "{job}: attempt {attempt}");
                if self.runs.values().any(|r| r.worker == *worker) {
                    self.saw("assign next to another run");
                }
                if !self.specs[job].exclusive.is_empty() {
                    self.saw("assign with an exclusive token");
                }
                let open =
                    OpenRun { worker: *worker, job: *job, live: true, started: false, suspended: false };
                self.runs.insert(*run, open);
                self.check_worker_use(*worker);
            }
            Decision::Drop { worker, run } | Decision::Stop { worker, run } => {
                let stop = matches!(d, Decision::Stop { .. });
                let expected = matches!(ex.cancel, Some((_, _, Some(r))) if r == *run);
                if !expected && evicts(&self.config) {
                    // An eviction: the job is requeued in the same step, and
                    // the evicted run does not count as an attempt. (Only
                    // with a victim function in the tiers for an action
                    // that is on: anything else is an unexpected stop.)
                    let victim =
                        self.runs.get_mut(run).filter(|r| r.worker == *worker && r.started == stop && r.live);
                    let job = victim.map(|r| {
                        r.live = false;
                        r.job
                    });
                    check!(self, job.is_some(), Cancellation, "unexpected {d:?}");
                    if let Some(job) = job {
                        let p = self.pending.get_mut(&job).expect("live run: pending job");
                        (p.run, p.attempts) = (None, p.attempts - 1);
                        ex.requeue.insert(job);
                    }
                    return;
                }
                let r = self.runs.get_mut(run).filter(|r| r.worker == *worker && r.started == stop);
                let found = expected && r.map(|r| r.live = false).is_some();
                check!(self, found, Cancellation, "unexpected {d:?} (cancelling {:?})", ex.cancel);
            }
            Decision::Suspend { worker, run, by } => {
                // Only an eviction that suspends (evict = suspend), of a
                // started, live run holding no tokens, for a pending job;
                // the job keeps its run and attempts.
                let eligible = self.config.evict == Evict::Suspend && evicts(&self.config);
                let by_pending = self.pending.get(by).is_some_and(|p| p.run.is_none());
                let victim = self
                    .runs
                    .get_mut(run)
                    .filter(|r| r.worker == *worker && r.started && r.live && !r.suspended && r.job != *by);
                let ok = victim.map(|r| {
                    r.suspended = true;
                    r.job
                });
                let tokenless = ok.is_some_and(|j| takes(&self.specs[&j])[3..] == [0, 0]);
                check!(self, eligible && by_pending && tokenless, Invariants, "unexpected {d:?}");
                self.saw("suspend");
            }
            Decision::Resume { worker, run } => {
                let r = self.runs.get_mut(run).filter(|r| r.worker == *worker && r.suspended && r.live);
                let found = r.map(|r| r.suspended = false).is_some();
                check!(self, found, Invariants, "unexpected {d:?}");
                self.saw("resume");
                self.check_worker_use(*worker);
            }
            Decision::Cancelled { job, stage } => {
                let expected = matches!(ex.cancel.take(), Some((j, s, _)) if j == *job && s == *stage);
                check!(self, expected, Cancellation, "unexpected {d:?}");
                self.pending.remove(job);
                self.cancelled.insert(*job);
            }
            Decision::Finished { job, waiters, completion } => {
                let p = self.pending.remove(job);
                let ok = p.as_ref().is_some_and(|p| p.waiters == *waiters && p.run.is_none());
                check!(self, ok, Dedup, "{job} finished for {waiters:?}, pending: {p:?}");
                let (p, max) = (p.unwrap_or_default(), self.specs[job].max_attempts);
                match completion {
                    Completion::Ran(result) => {
                        let ran = ex.finish.take() == Some((*job, result.clone()));
                        check!(self, ran, Dedup, "{job} finished with a result no live run gave");
                    }
                    Completion::GaveUp(FailReason::TooManyAttempts { attempts, .. }) => {
                        let ok = ex.requeue.remove(job) && *attempts == p.attempts && p.attempts == max;
                        check!(self, ok, WorkerLoss, "{job} gave up after {attempts} attempts: {p:?}");
                    }
                    Completion::GaveUp(FailReason::Unplaceable(_)) => {}
                }
            }
            Decision::WorkerLost { worker } => {
                let Some(w) = self.workers.remove(worker) else {
                    return self.fail(Prop::WorkerLoss, format!("{worker:?} lost but not live"));
                };
                let left = ex.lost.take_if(|l| l == worker).is_some();
                check!(self, left || w.lease <= self.now, WorkerLoss, "{worker:?} lost before {}", w.lease);
                let runs: Vec<RunId> =
                    self.runs.iter().filter(|r| r.1.worker == *worker).map(|r| *r.0).collect();
                for r in runs.iter().filter_map(|run| self.runs.remove(run)).filter(|r| r.live) {
                    self.pending.get_mut(&r.job).expect("live run: pending job").run = None;
                    ex.requeue.insert(r.job);
                }
            }
            Decision::Requeued { job, attempts, reason } => {
                let max = self.specs[job].max_attempts;
                check!(self, !reason.is_empty(), WorkerLoss, "a requeue without a reason: {d:?}");
                let ok = self.pending.get(job).is_some_and(|p| p.attempts == *attempts && *attempts < max);
                check!(self, ex.requeue.remove(job) && ok, WorkerLoss, "unexpected {d:?}");
            }
        }
    }

    /// (a) and (b): what the open runs on a worker take (cancelled runs still
    /// stopping included) fits the capacity it last registered, and a token
    /// held exclusively has no other user there.
    fn check_worker_use(&mut self, worker: WorkerId) {
        let Some(cap) = self.workers.get(&worker).map(|w| &w.capacity) else { return };
        let token = |t: &str| cap.tokens.get(t).copied().unwrap_or(0);
        let offers = [cap.slots.into(), cap.cpu, cap.memory, token("net"), token("gpu")];
        let open: Vec<&OpenRun> = self.runs.values().filter(|r| r.worker == worker).collect();
        let runs: Vec<&JobSpec> = open.iter().map(|r| &self.specs[&r.job]).collect();
        // A suspended run holds all but its slots and CPU.
        let held =
            |r: &OpenRun, i: usize| if r.suspended && i < 2 { 0 } else { takes(&self.specs[&r.job])[i] };
        let used: Vec<u64> = (0..5).map(|i| open.iter().map(|r| held(r, i)).sum()).collect();
        let fits = used.iter().zip(offers).all(|(u, o)| *u <= o);
        let shared = TOKENS.iter().enumerate().find(|(i, t)| {
            let users = runs.iter().filter(|s| takes(s)[3 + i] > 0).count();
            users > 1 && runs.iter().any(|s| s.exclusive.iter().any(|e| e == *t))
        });
        check!(self, fits, Capacity, "{worker:?} uses {used:?} of {offers:?} (slots, CPU, memory, net, gpu)");
        check!(self, shared.is_none(), Exclusive, "{worker:?} shares {shared:?}, held exclusively");
    }

    /// The state after a step against the model: views, queues, workers,
    /// leases, artifact locations.
    fn check_state(&mut self) {
        if let Err(e) = self.sched.check_invariants() {
            self.fail(Prop::Invariants, e);
        }
        for w in self.workers.keys().copied().collect::<Vec<_>>() {
            self.check_worker_use(w);
        }
        let timers = self.sched.timers();
        let has_timer = |kind: TimerKind| timers.iter().any(|t| t.kind == kind);
        for id in (0..JOBS).map(job_id) {
            let (view, p) = (self.sched.job_view(&id), self.pending.get(&id).cloned());
            check!(self, self.sched.has_job(&id) == p.is_some(), Dedup, "{id}: has_job disagrees: {p:?}");
            let (Some(view), Some(p)) = (&view, &p) else {
                check!(self, view.is_none() && p.is_none(), Dedup, "{id}: {view:?}, decisions: {p:?}");
                continue;
            };
            let agree = (&view.waiters, view.attempts) == (&p.waiters, p.attempts);
            check!(self, agree, Dedup, "{view:?}, decisions: {p:?}");
            match (&view.status, p.run) {
                (JobStatus::Queued { queues, reserved_on }, None) => {
                    if reserved_on.is_some() {
                        self.saw("reservation");
                    }
                    self.check_queued(id, queues, &timers);
                }
                (JobStatus::WaitingForWorker(_), None) => {
                    self.saw("waiting for a worker");
                    let grace = has_timer(TimerKind::Unplaceable(id));
                    check!(self, grace, Queues, "{id} waits with no deadline");
                }
                (JobStatus::Assigned { worker, run } | JobStatus::Running { worker, run }, Some(r)) => {
                    let running = matches!(view.status, JobStatus::Running { .. });
                    let ok = *run == r && self.runs[&r].worker == *worker && self.runs[&r].started == running;
                    check!(self, ok, Dedup, "{id} is {:?}, decisions say {r:?}", view.status);
                    // Picked: it keeps no locality or grace timer.
                    let timer = [TimerKind::Cache(id), TimerKind::Deps(id), TimerKind::Unplaceable(id)];
                    check!(self, !timer.into_iter().any(has_timer), Queues, "picked {id} keeps a timer");
                }
                (status, run) => self.fail(Prop::Dedup, format!("{id} is {status:?}, decisions say {run:?}")),
            }
        }
        // (h) Lost workers keep nothing; live ones have the lease and hold
        // the artifacts the events imply. The core holds no more workers
        // than were ever alive at once: new ones take lost ones' places.
        self.most_alive = self.most_alive.max(self.workers.len());
        let held = self.sched.worker_count();
        self.held_workers = held;
        check!(
            self,
            held <= self.most_alive,
            WorkerLoss,
            "{held} workers held, at most {} alive",
            self.most_alive
        );
        for id in (0..WORKERS).map(WorkerId) {
            let lease = self.workers.get(&id).map(|w| w.lease);
            let core_lease = timers.iter().find(|t| t.kind == TimerKind::Lease(id)).map(|t| t.at);
            let alive = self.sched.worker_alive(id);
            check!(self, core_lease == lease && alive == lease.is_some(), WorkerLoss, "{id:?} lease");
            check!(self, lease.is_none_or(|at| at > self.now), WorkerLoss, "{id:?} outlived its lease");
            check!(self, alive || self.sched.worker_runs(id).is_empty(), WorkerLoss, "lost {id:?} has runs");
        }
        for a in (0..JOBS).map(job_id) {
            let (held, located) = (self.holders(&a), self.sched.locate_artifact(&a));
            let holders: BTreeSet<WorkerId> = self.sched.artifact_holders(&a).into_iter().collect();
            let ok = holders == held && located.map_or(held.is_empty(), |w| held.contains(&w));
            check!(self, ok, WorkerLoss, "{a} located on {holders:?} ({located:?}), held by {held:?}");
        }
    }

    /// (e) A queued job is in the first queue of every holder of its result,
    /// in no queue its cache state does not justify, and not stuck.
    fn check_queued(&mut self, id: JobId, queues: &[QueueName], timers: &[Timer]) {
        let deps = &self.specs[&id].deps;
        let justified = |q: &&QueueName| match q {
            QueueName::First(w) => self.workers.get(w).is_some_and(|l| l.held.contains(&id)),
            QueueName::Second(w) => {
                self.workers.get(w).is_some_and(|l| deps.iter().any(|d| l.held.contains(d)))
            }
            QueueName::Global => true,
        };
        let unjustified: Vec<&QueueName> = queues.iter().filter(|q| !justified(q)).collect();
        let first = |w: &WorkerId| queues.contains(&QueueName::First(*w));
        let missing: Vec<WorkerId> = self.holders(&id).into_iter().filter(|w| !first(w)).collect();
        let waits = timers.iter().any(|t| t.kind == TimerKind::Cache(id) || t.kind == TimerKind::Deps(id));
        let global = queues.contains(&QueueName::Global);
        check!(self, unjustified.is_empty(), Queues, "{id} is in {unjustified:?}, which nothing justifies");
        check!(self, missing.is_empty(), Queues, "{id} is not in the first queue of holders {missing:?}");
        check!(self, global || waits, Queues, "{id} is neither global nor waiting for a timer");
        for q in queues {
            self.saw(match q {
                QueueName::First(_) => "in a first queue",
                QueueName::Second(_) => "in a second queue",
                QueueName::Global => "in the global queue",
            });
        }
    }

    /// Workers keep working: every live worker heartbeats and every run
    /// starts and succeeds, round after round of 50 ms. Every job must end.
    fn drain(&mut self) {
        for _ in 0..60 {
            if self.pending.is_empty() {
                return;
            }
            for worker in self.workers.keys().copied().collect::<Vec<_>>() {
                self.send(Event::Heartbeat { worker });
            }
            // A drained worker (its runs over) starts again, as one shut
            // down for an upgrade would, and registers what it holds.
            let drained: Vec<(WorkerId, LiveWorker)> = self
                .workers
                .iter()
                .filter(|(w, lw)| lw.draining && !self.runs.values().any(|r| r.worker == **w))
                .map(|(w, lw)| (*w, lw.clone()))
                .collect();
            for (worker, lw) in drained {
                let artifacts = lw.held.iter().copied().collect();
                let (name, capacity, labels) = (lw.name, lw.capacity, lw.labels);
                self.send(Event::WorkerJoined { worker, name, capacity, labels, artifacts });
            }
            for (run, started) in self.runs.iter().map(|(id, r)| (*id, r.started)).collect::<Vec<_>>() {
                if !started {
                    self.send(Event::JobStarted { run });
                }
                self.send(Event::JobExited { run, result: JobResult::ok() });
            }
            self.now = self.now.after(Millis(50));
            self.send(Event::Tick);
        }
        let stuck = format!("jobs never end: {:?}", self.pending);
        self.fail(Prop::Liveness, stuck);
    }

    /// Fails on the first violation of `prop` or of the invariant checker,
    /// with the log up to it.
    fn verify(&self, prop: Prop) -> Result<(), TestCaseError> {
        let broken = self.violations.iter().find(|v| v.0 == prop || v.0 == Prop::Invariants);
        let Some((prop, step, msg)) = broken else { return Ok(()) };
        let mut log = String::new();
        for (i, s) in self.log.iter().enumerate().take(step + 1) {
            let _ = writeln!(log, "#{i} at {}: {:?} -> {:?}", s.now, s.event, s.result);
            for d in &s.decisions {
                let _ = writeln!(log, "      {d:?}");
            }
        }
        Err(TestCaseError::fail(format!("{prop:?} broken at step #{step}: {msg}\n{log}")))
    }
}

// ---------------------------------------------------------------------------
// Random event sequences
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(128))]

    /// (a) No worker ever runs more than it offers: slots, CPU, memory and
    /// tokens, counting runs being dropped or stopped until they exit, and
    /// across re-registrations.
    #[test]
    fn resources_are_never_over_committed(case in case()) {
        Harness::run(&case).verify(Prop::Capacity)?;
    }

    /// (b) A token held exclusively by a run has no other user on its worker
    /// (a cancelled run still stopping included).
    #[test]
    fn exclusive_tokens_are_never_shared(case in case()) {
        Harness::run(&case).verify(Prop::Exclusive)?;
    }

    /// (c) Replaying the recorded log (refused events and `Resumed`
    /// included) rebuilds a state equal to the live one, whole or cut
    /// anywhere; a replayed prefix, written down and read back as a
    /// snapshot, is equal too, and fed the rest answers and decides exactly
    /// as the live core did; the same program run again (same seed) gives
    /// the same steps.
    #[test]
    fn replaying_the_log_rebuilds_the_same_state_and_decisions(case in case(), cut in any::<Index>()) {
        let h = Harness::run(&case);
        h.verify(Prop::Invariants)?;
        let log: Vec<(Millis, Event)> = h.log.iter().map(|s| (s.now, s.event.clone())).collect();
        prop_assert!(Scheduler::replay(case.config.clone(), log.clone()) == h.sched, "full replay differs");
        // The live state after the first `cut` operations (one event each).
        let cut = cut.index(case.ops.len() + 1);
        let prefix = Harness::run(&Case { ops: case.ops[..cut].to_vec(), ..case.clone() });
        let replayed = Scheduler::replay(case.config.clone(), log[..cut].iter().cloned());
        prop_assert!(replayed == prefix.sched, "replay of {} events differs", cut);
        // Written down and read back (as the coordinator's snapshots are),
        // it is the same state and carries on alike.
        let mut bytes = Vec::new();
        ciborium::into_writer(&replayed, &mut bytes).expect("encode");
        let mut replayed: Scheduler = ciborium::from_reader(&bytes[..]).expect("decode");
        prop_assert!(replayed == prefix.sched, "the snapshot after {} events differs", cut);
        for (i, step) in h.log.iter().enumerate().skip(cut) {
            let result = replayed.handle(step.now, step.event.clone());
            prop_assert_eq!(&result, &step.result, "step #{}", i);
            prop_assert_eq!(&replayed.take_decisions(), &step.decisions, "step #{}", i);
        }
        prop_assert!(replayed == h.sched, "continued replay differs");
        prop_assert_eq!(&Harness::run(&case).log, &h.log, "same events, different decisions");
    }

    /// (d) Dedup: a job ID has at most one live run (a cancelled run still
    /// stopping is not live: its job is gone); `Finished` reaches exactly the
    /// waiters that scheduled it and did not cancel, in arrival order, with
    /// the result of its live run; `job_view` agrees with the decisions.
    #[test]
    fn one_live_copy_per_job_and_every_waiter_gets_the_completion(case in case()) {
        Harness::run(&case).verify(Prop::Dedup)?;
    }

    /// (e) A queued job is in the first local queue of every live worker
    /// holding its result, in no queue its cache state does not justify,
    /// and either global or waiting for its CacheTimeout or DepsTimeout; a
    /// picked job keeps no queue timer (`check_invariants` checks that it
    /// left every queue).
    #[test]
    fn queues_follow_the_locality_rules(case in case()) {
        Harness::run(&case).verify(Prop::Queues)?;
    }

    /// (g) The last waiter's cancel ends the job at its stage (`Drop` for an
    /// assigned run, `Stop` for a running one, nothing for anyone else);
    /// another waiter's cancel ends nothing; a cancelled job is never
    /// assigned afterwards (unless scheduled again).
    #[test]
    fn a_cancelled_job_is_never_assigned_afterwards(case in case()) {
        Harness::run(&case).verify(Prop::Cancellation)?;
    }

    /// (h) A worker is lost only when it leaves or its lease (renewed by its
    /// messages, shifted by `Resumed`) ends; each live run it had (like a
    /// `RunLost` run) is requeued with its attempt count or given up at
    /// `max_attempts`; a lost worker keeps no runs, lease or queues, and no
    /// longer holds any artifact (`artifact_holders`, `locate_artifact`).
    /// `Resumed` fires nothing and moves every deadline by the downtime.
    #[test]
    fn a_lost_worker_requeues_or_fails_its_runs_and_forgets_its_artifacts(case in case()) {
        Harness::run(&case).verify(Prop::WorkerLoss)?;
    }

    /// Liveness: after any program, if the live workers keep working, every
    /// job ends (no starvation, no exclusive-token deadlock, no job stuck in
    /// a local queue), and every rule above keeps holding meanwhile.
    #[test]
    fn every_job_ends_once_workers_keep_working(case in case()) {
        let mut h = Harness::run(&case);
        h.drain();
        let all = [Prop::Capacity, Prop::Exclusive, Prop::Dedup, Prop::Queues, Prop::Cancellation, Prop::WorkerLoss];
        for prop in all.into_iter().chain([Prop::Liveness]) {
            h.verify(prop)?;
        }
    }
}

/// The generator reaches what the properties are about: over 200 fixed-seed
/// cases, each situation (in the log, or seen by the harness) comes up at
/// least ten times.
#[test]
fn the_generator_reaches_what_the_properties_are_about() {
    let mut runner = TestRunner::new_with_rng(cases(0), TestRng::deterministic_rng(RngAlgorithm::XorShift));
    let in_log = "Assign, Drop, Stop, stage: Queued, stage: Assigned, stage: Running, Ran(, TooManyAttempts, \
        Unplaceable(, Requeued, RunLost, Resumed, WorkerLeft, WorkerLost, CapacityBelowUsage";
    let by_harness = "schedule joins a pending job, join a pending job, cancel by one of several waiters, exit of a cancelled run, \
        assign next to another run, assign with an exclusive token, reservation, waiting for a worker, \
        in a first queue, in a second queue, in the global queue, re-registration drops an artifact it no longer lists, \
        a worker drains, a new worker takes a lost one's place";
    let mut seen: BTreeMap<&str, u32> = by_harness.split(", ").map(|k| (k, 0)).collect();
    for _ in 0..200 {
        let mut h = Harness::run(&case().new_tree(&mut runner).expect("case").current());
        h.drain();
        let log = format!("{:?}", h.log);
        for what in in_log.split(", ") {
            *seen.entry(what).or_default() += log.matches(what).count() as u32;
        }
        for (what, n) in h.seen {
            *seen.entry(what).or_default() += n;
        }
    }
    let rare: Vec<(&str, u32)> = seen.into_iter().filter(|(_, n)| *n < 10).collect();
    assert!(rare.is_empty(), "rare or never seen: {rare:?}");
}

// ---------------------------------------------------------------------------
// Large queues
// ---------------------------------------------------------------------------

/// Jobs reach the global queue at once; leases never end.
fn global_config(seed: u64) -> Config {
    let (cache_timeout, deps_timeout, unplaceable_grace) = (Millis(0), Millis(0), Millis(0));
    Config {
        cache_timeout,
        deps_timeout,
        lease_timeout: Millis(1 << 40),
        unplaceable_grace,
        seed,
        ..Config::default()
    }
}

fn plain_worker(worker: u64, slots: u32, tokens: BTreeMap<String, u64>) -> Event {
    let capacity = Capacity { slots, cpu: 64_000, memory: 64 << 30, tokens };
    let (labels, artifacts) = (BTreeMap::new(), Vec::new());
    Event::WorkerJoined { worker: WorkerId(worker), name: format!("w{worker}"), capacity, labels, artifacts }
}

fn schedule(name: &str, tenant: &str, priority: i32, net: u64) -> Event {
    let mut spec = JobSpec::new(JobId::named(name), tenant);
    spec.priority = priority;
    if net > 0 {
        spec.request.tokens.insert("net".to_owned(), net);
    }
    Event::Schedule { spec, waiter: WaiterId(1) }
}

fn exit(run: RunId) -> Event {
    Event::JobExited { run, result: JobResult::ok() }
}

/// Handles an event that must be accepted; returns the runs assigned.
fn step(s: &mut Scheduler, event: Event) -> BTreeMap<RunId, JobId> {
    s.handle(Millis(0), event).expect("accepted");
    let assigned = s.take_decisions().into_iter().filter_map(|d| match d {
        Decision::Assign { job, run, .. } => Some((run, job)),
        _ => None,
    });
    assigned.collect()
}

proptest! {
    #![proptest_config(cases(8))]

    /// (f) Fairness: every slot is busy with the 10,000 queued jobs of one
    /// to three tenants (all served already); another tenant's single job of
    /// the same priority takes the very next slot that frees, whichever it
    /// is: it waits for at most one free slot. (Priority comes before
    /// fairness: a higher-priority flood would go first, by design.)
    #[test]
    fn a_flood_delays_another_tenants_job_by_at_most_one_free_slot(
        workers in 1..=4u64,
        slots in 1..=3u32,
        flooders in 1..=3u32,
        exits in prop::collection::vec(any::<Index>(), 0..40),
        freed in any::<Index>(),
        seed in any::<u64>(),
    ) {
        let mut s = Scheduler::new(global_config(seed));
        let mut open = BTreeMap::new();
        for w in 0..workers {
            open.extend(step(&mut s, plain_worker(w, slots, BTreeMap::new())));
        }
        // Every flooding tenant gets a slot before the lone job comes.
        let flooders = flooders.min(workers as u32 * slots);
        for i in 0..10_000 {
            open.extend(step(&mut s, schedule(&format!("flood{i}"), &format!("f{}", i % flooders), 0, 0)));
        }
        let pick = |open: &BTreeMap<RunId, JobId>, i: &Index| *open.keys().nth(i.index(open.len())).expect("run");
        for e in &exits {
            let run = pick(&open, e);
            open.remove(&run);
            open.extend(step(&mut s, exit(run)));
        }
        prop_assert!(step(&mut s, schedule("lone", "quiet", 0, 0)).is_empty(), "no slot is free");
        let next = step(&mut s, exit(pick(&open, &freed)));
        prop_assert!(next.values().eq([&JobId::named("lone")]), "the freed slot went to {:?}", next);
        prop_assert_eq!(s.check_invariants(), Ok(()));
    }

    /// (b) No starvation: one worker, a steady stream of jobs sharing its
    /// `net` tokens, and a job wanting `net` exclusively. Later users of
    /// `net` are held back, so it starts once the users running when it came
    /// have ended, plus at most one: the job the worker may already have
    /// reserved room for (a worker holds one reservation).
    #[test]
    fn an_exclusive_job_is_not_starved_by_a_stream_of_shared_users(
        slots in 2..=4u32,
        net in 1..=3u64,
        warmup in 0..6usize,
    ) {
        let mut s = Scheduler::new(global_config(7));
        step(&mut s, plain_worker(0, slots, BTreeMap::from([("net".to_owned(), net)])));
        let mut open = BTreeMap::new();
        for i in 0..40 + warmup {
            open.extend(step(&mut s, schedule(&format!("n{i}"), "shared", 0, 1)));
            if i >= 40 {
                let (oldest, _) = open.pop_first().expect("a run");
                open.extend(step(&mut s, exit(oldest)));
            }
        }
        let x = JobId::named("x");
        let mut spec = JobSpec::new(x, "excl");
        spec.exclusive = vec!["net".to_owned()];
        step(&mut s, Event::Schedule { spec, waiter: WaiterId(2) });
        let bound = open.len() + 1;
        for exits in 0.. {
            if matches!(s.job_view(&x).map(|v| v.status), Some(JobStatus::Assigned { .. })) {
                break;
            }
            prop_assert!(exits < bound, "x still waits after {} exits: {:?}", exits, s.job_view(&x));
            let (oldest, _) = open.pop_first().expect("a run");
            open.extend(step(&mut s, exit(oldest)));
            open.extend(step(&mut s, schedule(&format!("m{exits}"), "shared", 0, 1)));
        }
        prop_assert_eq!(s.check_invariants(), Ok(()));
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// Victims follow the tiers, whatever they are: a full worker runs jobs
    /// of three tenants at random priorities, then a job that fits nowhere
    /// arrives. Nothing is evicted unless a tier has a victim function for
    /// preemption (`priority`, or `drf` with `preemptable`); while
    /// `priority` is listed, no victim has a higher priority than the
    /// starving job (`priority` picks lower ones, `drf` never overrides
    /// it), and a lower one only if `priority` picks victims without `drf`
    /// in its tier and no earlier tier has victim functions; the job starts
    /// once its victims' runs end; every invariant holds; and replaying the
    /// events rebuilds the same state.
    #[test]
    fn preemption_victims_follow_the_tiers(
        tiers in tiers(),
        slots in 2..=4u32,
        running in prop::collection::vec((0..3usize, -1..=1i32), 4),
        starving in (0..3usize, -1..=2i32),
        seed in any::<u64>(),
    ) {
        let tiers = tiers.unwrap_or_else(Config::default_tiers);
        let config = Config { preempt: true, tiers: tiers.clone(), ..global_config(seed) };
        let mut s = Scheduler::new(config.clone());
        let mut log = vec![plain_worker(0, slots, BTreeMap::new())];
        let mut priorities = BTreeMap::new();
        for (i, &(tenant, priority)) in running.iter().take(slots as usize).enumerate() {
            let name = format!("r{i}");
            priorities.insert(JobId::named(&name), priority);
            log.push(schedule(&name, TENANTS[tenant], priority, 0));
        }
        log.push(schedule("starving", TENANTS[starving.0], starving.1, 0));
        let mut decisions = Vec::new();
        for event in &log {
            s.handle(Millis(0), event.clone()).expect("accepted");
            decisions.extend(s.take_decisions());
            prop_assert_eq!(s.check_invariants(), Ok(()));
        }
        let victims: Vec<JobId> = decisions.iter().filter_map(|d| match d {
            Decision::Requeued { job, .. } => Some(*job),
            _ => None,
        }).collect();
        let plugins: Vec<&PluginConfig> = tiers.iter().flat_map(|t| &t.plugins).collect();
        let priority_listed = plugins.iter().any(|p| p.name == "priority");
        let drf_preempts = plugins.iter().any(|p| p.name == "drf" && p.preemptable);
        if !priority_listed && !drf_preempts {
            prop_assert!(victims.is_empty(), "evicted {:?} with no victim function", victims);
        }
        for v in &victims {
            if priority_listed {
                prop_assert!(priorities[v] <= starving.1, "{} outranks the starving job", v);
            }
            if priority_listed && !drf_preempts {
                prop_assert!(priorities[v] < starving.1, "{} is not of a lower priority", v);
            }
        }
        // The victims' runs end: the starving job starts in their room.
        let runs: BTreeMap<JobId, RunId> = decisions.iter().filter_map(|d| match d {
            Decision::Assign { job, run, .. } => Some((*job, *run)),
            _ => None,
        }).collect();
        for v in &victims {
            let event = exit(runs[v]);
            s.handle(Millis(0), event.clone()).expect("accepted");
            log.push(event);
            decisions.extend(s.take_decisions());
            prop_assert_eq!(s.check_invariants(), Ok(()));
        }
        let started = decisions.iter().any(|d| matches!(d, Decision::Assign { job, .. } if *job == JobId::named("starving")));
        prop_assert_eq!(started, !victims.is_empty(), "victims {:?}", victims);
        let replayed = Scheduler::replay(config, log.into_iter().map(|e| (Millis(0), e)));
        prop_assert!(replayed == s, "replay differs");
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// Evictions by suspension (`evict = suspend`, random programs with
    /// preemption on, and `case`'s random preempt/reclaim picks it half the
    /// time too): only started, token-free, live runs are suspended, for a
    /// queued job; a suspended run holds its memory and tokens but not its
    /// slots and CPU (nothing over-committed either way); only suspended
    /// live runs are resumed; every other rule and invariant holds; and
    /// replaying the log rebuilds the same state and decisions.
    #[test]
    fn evicting_by_suspension_keeps_every_rule(case in suspend_case()) {
        let h = Harness::run(&case);
        for prop in [Prop::Invariants, Prop::Capacity, Prop::Exclusive, Prop::Dedup, Prop::Cancellation, Prop::WorkerLoss] {
            h.verify(prop)?;
        }
        let log: Vec<(Millis, Event)> = h.log.iter().map(|s| (s.now, s.event.clone())).collect();
        prop_assert!(Scheduler::replay(case.config.clone(), log) == h.sched, "replay differs");
        prop_assert_eq!(&Harness::run(&case).log, &h.log, "same events, different decisions");
    }
}

/// The suspension property is not vacuous: its programs suspend and resume
/// runs.
#[test]
fn the_suspend_generator_reaches_suspensions() {
    let mut runner = TestRunner::new_with_rng(cases(0), TestRng::deterministic_rng(RngAlgorithm::XorShift));
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for _ in 0..600 {
        let h = Harness::run(&suspend_case().new_tree(&mut runner).expect("case").current());
        for (what, n) in h.seen {
            *seen.entry(what).or_default() += n;
        }
    }
    let (suspended, resumed) = (seen.get("suspend").copied(), seen.get("resume").copied());
    assert!(suspended >= Some(10) && resumed >= Some(10), "suspend {suspended:?}, resume {resumed:?}");
}

/// The eviction property is not vacuous: over fixed-seed cases, custom
/// tiers evict (through `priority` and through `drf`) and keep from
/// evicting.
#[test]
fn the_tier_generator_reaches_evictions() {
    let mut runner = TestRunner::new_with_rng(cases(0), TestRng::deterministic_rng(RngAlgorithm::XorShift));
    let (mut by_priority, mut by_drf_only, mut none) = (0, 0, 0);
    for _ in 0..300 {
        let Some(tiers) = tiers().new_tree(&mut runner).expect("tiers").current() else { continue };
        let config = Config { preempt: true, tiers: tiers.clone(), ..global_config(1) };
        let mut s = Scheduler::new(config);
        let mut evicted = false;
        for event in [
            plain_worker(0, 3, BTreeMap::new()),
            schedule("a1", "ada", -1, 0),
            schedule("a2", "ada", 0, 0),
            schedule("a3", "ada", 0, 0),
            schedule("b1", "bob", 0, 0),
        ] {
            s.handle(Millis(0), event).expect("accepted");
            evicted |= s.take_decisions().iter().any(|d| matches!(d, Decision::Requeued { .. }));
        }
        let listed = |name: &str| tiers.iter().flat_map(|t| &t.plugins).any(|p| p.name == name);
        match (evicted, listed("priority")) {
            (true, true) => by_priority += 1,
            (true, false) => by_drf_only += 1,
            (false, _) => none += 1,
        }
    }
    assert!(by_priority >= 10 && by_drf_only >= 10 && none >= 10, "{by_priority} {by_drf_only} {none}");
}
