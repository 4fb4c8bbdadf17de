//! Scenario scripts: readable, exact tests of the core's rules.
//!
//! Each file in `tests/scenarios/` is a script of commands. After every
//! command, the lines starting with `> ` must be exactly what the core
//! decided (or what the command printed); a command followed by no `> ` line
//! must produce nothing. The state's invariants are checked after every
//! command. Run with `UPDATE_SCENARIOS=1` to rewrite the expectations from
//! the actual output (then read the diff before committing it).
//!
//! Commands (times in milliseconds, sizes accept Ki/Mi/Gi suffixes):
//!
//! ```text
//! config cache=10 deps=100 lease=10000 grace=0 lost=300000 seed=1 preempt=1 reclaim=1 evict=suspend exempt=0
//! queue q1 weight=1 parent=p priority=0 tenants=a,b cap=slots:2,cpu:4000,mem:8Gi
//!          guarantee=slots:1        (before any other command but config)
//! tier priority,gang drf:preemptable binpack:2
//!          one tier of plugins (before any other command but config and
//!          queues); the first `tier` line replaces the default tiers
//! worker w1 slots=2 cpu=4000 mem=8Gi tokens=network:2 labels=os:linux artifacts=d1,d2
//! rejoin w1 ...            same keys: re-registration of a live worker
//! at 50                    move the clock to 50 (fires due timers)
//! resume 50               the shell was down until 50: deadlines shift
//! schedule j1 tenant=a waiter=1 deps=d1 cpu=1000 mem=1Gi tokens=network:1
//!          exclusive=network labels=os:linux priority=5 attempts=2 queue=q1
//!          path=3000                (remaining critical path, ms)
//!          gang=shards:4            (gang ID and min_available)
//! rehome j1 tenant=t [queue=q]  the job now belongs to tenant t
//! cancel j1 waiter=1
//! start j1 | exit j1 ok|fail=CODE|cached   (the job's latest run)
//! heartbeat w1 | leave w1 | unreachable w1 | add w1 a,b | evict w1 a,b | lose-run j1
//! timers | job j1 | locate a | queues      (print state)
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use drover_core::{
    Capacity, Completion, Config, Decision, Event, Evict, GangSpec, JobId, JobResult, JobSpec, JobStatus,
    Millis, PluginConfig, QueueAmounts, QueueConfig, QueueLimits, QueueName, RunId, Scheduler, Tier,
    TimerKind, WaiterId, WorkerId,
};

/// Maps names in scripts to IDs and back.
#[derive(Default)]
struct Names {
    workers: BTreeMap<String, WorkerId>,
    runs: BTreeMap<String, RunId>,
}

impl Names {
    fn worker(&mut self, name: &str) -> WorkerId {
        let next = WorkerId(self.workers.len() as u64 + 1);
        *self.workers.entry(name.to_owned()).or_insert(next)
    }

    fn worker_name(&self, id: WorkerId) -> String {
        self.workers.iter().find(|(_, w)| **w == id).map_or_else(|| format!("{id:?}"), |(n, _)| n.clone())
    }
}

fn size(v: &str) -> u64 {
    let (num, mult) = if let Some(n) = v.strip_suffix("Gi") {
        (n, 1 << 30)
    } else if let Some(n) = v.strip_suffix("Mi") {
        (n, 1 << 20)
    } else if let Some(n) = v.strip_suffix("Ki") {
        (n, 1 << 10)
    } else {
        (v, 1)
    };
    num.parse::<u64>().unwrap_or_else(|_| panic!("bad number {v:?}")) * mult
}

fn pairs(v: &str) -> BTreeMap<String, String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once(':').unwrap_or_else(|| panic!("expected k:v, got {kv:?}"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn ids(v: &str) -> Vec<JobId> {
    v.split(',').filter(|s| !s.is_empty()).map(JobId::named).collect()
}

/// `key=value` arguments after the positional ones.
fn args(words: &[&str]) -> BTreeMap<String, String> {
    words
        .iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (w.to_string(), String::new()),
        })
        .collect()
}

struct Runner {
    core: Scheduler,
    names: Names,
    now: Millis,
}

impl Runner {
    fn new(config: Config) -> Runner {
        Runner { core: Scheduler::new(config), names: Names::default(), now: Millis(0) }
    }

    fn event(&mut self, event: Event, out: &mut Vec<String>) {
        if let Err(e) = self.core.handle(self.now, event) {
            out.push(format!("rejected: {e}"));
        }
    }

    fn run(&mut self, line: &str) -> Vec<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut out = Vec::new();
        match words[0] {
            "worker" | "rejoin" => {
                let a = args(&words[2..]);
                let get = |k: &str| a.get(k).map(String::as_str);
                let capacity = Capacity {
                    slots: get("slots").map_or(1, |v| v.parse().expect("slots")),
                    cpu: get("cpu").map_or(8000, size),
                    memory: get("mem").map_or(16 << 30, size),
                    tokens: pairs(get("tokens").unwrap_or(""))
                        .into_iter()
                        .map(|(k, v)| (k, size(&v)))
                        .collect(),
                };
                let worker = self.names.worker(words[1]);
                let event = Event::WorkerJoined {
                    worker,
                    name: words[1].to_owned(),
                    capacity,
                    labels: pairs(get("labels").unwrap_or("")),
                    artifacts: ids(get("artifacts").unwrap_or("")),
                };
                self.event(event, &mut out);
            }
            "at" => {
                self.now = Millis(words[1].parse().expect("time"));
                self.event(Event::Tick, &mut out);
            }
            "schedule" => {
                let a = args(&words[2..]);
                let get = |k: &str| a.get(k).map(String::as_str);
                let mut spec = JobSpec::new(JobId::named(words[1]), get("tenant").unwrap_or("t"));
                spec.deps = ids(get("deps").unwrap_or(""));
                spec.request.slots = get("slots").map_or(1, |v| v.parse().expect("slots"));
                spec.request.cpu = get("cpu").map_or(0, size);
                spec.request.memory = get("mem").map_or(0, size);
                spec.request.tokens =
                    pairs(get("tokens").unwrap_or("")).into_iter().map(|(k, v)| (k, size(&v))).collect();
                spec.exclusive =
                    get("exclusive").map_or_else(Vec::new, |v| v.split(',').map(str::to_owned).collect());
                spec.labels = pairs(get("labels").unwrap_or(""));
                spec.priority = get("priority").map_or(0, |v| v.parse().expect("priority"));
                spec.path = get("path").map_or(0, |v| v.parse().expect("path"));
                spec.max_attempts = get("attempts").map_or(3, |v| v.parse().expect("attempts"));
                spec.queue = get("queue").map(str::to_owned);
                spec.gang = get("gang").map(|g| {
                    let (id, min) = g.split_once(':').expect("gang=ID:MIN");
                    GangSpec { id: id.to_owned(), min_available: min.parse().expect("min_available") }
                });
                let waiter = WaiterId(get("waiter").map_or(1, |v| v.parse().expect("waiter")));
                self.event(Event::Schedule { spec, waiter }, &mut out);
            }
            "rehome" => {
                let a = args(&words[2..]);
                let tenant = a.get("tenant").expect("rehome needs tenant=").to_string();
                let queue = a.get("queue").map(|q| q.to_string());
                self.event(Event::Rehome { job: JobId::named(words[1]), tenant, queue }, &mut out);
            }
            "cancel" => {
                let a = args(&words[2..]);
                let waiter = WaiterId(a.get("waiter").map_or(1, |v| v.parse().expect("waiter")));
                self.event(Event::Cancel { job: JobId::named(words[1]), waiter }, &mut out);
            }
            "start" => {
                let run = self.run_of(words[1]);
                self.event(Event::JobStarted { run }, &mut out);
            }
            "exit" => {
                let run = self.run_of(words[1]);
                let result = match words[2] {
                    "ok" => JobResult::ok(),
                    "cached" => JobResult { cached: true, ..JobResult::ok() },
                    other => {
                        let code = other.strip_prefix("fail=").expect("ok, cached or fail=CODE");
                        JobResult::failed(code.parse().expect("exit code"))
                    }
                };
                self.event(Event::JobExited { run, result }, &mut out);
            }
            "resume" => {
                self.now = Millis(words[1].parse().expect("time"));
                self.event(Event::Resumed, &mut out);
            }
            "lose-run" => {
                let run = self.run_of(words[1]);
                self.event(Event::RunLost { run }, &mut out);
            }
            "heartbeat" => {
                let worker = self.names.worker(words[1]);
                self.event(Event::Heartbeat { worker }, &mut out);
            }
            "leave" => {
                let worker = self.names.worker(words[1]);
                self.event(Event::WorkerLeft { worker }, &mut out);
            }
            "unreachable" => {
                let worker = self.names.worker(words[1]);
                self.event(Event::WorkerUnreachable { worker }, &mut out);
            }
            "add" | "evict" => {
                let worker = self.names.worker(words[1]);
                let artifacts = ids(words[2]);
                let event = if words[0] == "add" {
                    Event::ArtifactsAdded { worker, artifacts }
                } else {
                    Event::ArtifactsEvicted { worker, artifacts }
                };
                self.event(event, &mut out);
            }
            "timers" => {
                for t in self.core.timers() {
                    let what = match t.kind {
                        TimerKind::Cache(j) => format!("cache-timeout {j}"),
                        TimerKind::Deps(j) => format!("deps-timeout {j}"),
                        TimerKind::Unplaceable(j) => format!("unplaceable {j}"),
                        TimerKind::Lease(w) => format!("lease {}", self.names.worker_name(w)),
                        TimerKind::Eviction => "eviction".to_owned(),
                    };
                    out.push(format!("timer {} {what}", t.at.0));
                }
                if out.is_empty() {
                    out.push("no timers".to_owned());
                }
            }
            "job" => {
                let id = JobId::named(words[1]);
                let view = self.core.job_view(&id);
                out.push(match view {
                    None => format!("{} is not pending", words[1]),
                    Some(v) => {
                        let mut line = format!("{} {}", words[1], self.status(&v.status));
                        if let Some(by) = self.core.evicted_by(&id) {
                            write!(line, ", suspended for {by} after {} attempt(s)", v.attempts)
                                .expect("string");
                        }
                        line
                    }
                });
            }
            "locate" => {
                let holders = self.core.artifact_holders(&JobId::named(words[1]));
                let names: Vec<String> = holders.iter().map(|w| self.names.worker_name(*w)).collect();
                out.push(if names.is_empty() {
                    format!("{} is nowhere", words[1])
                } else {
                    format!("{} is on {}", words[1], names.join(","))
                });
            }
            "queues" => {
                let slots = |a: QueueAmounts| format!("{}", a.slots_milli as f64 / 1000.0);
                for q in self.core.queue_views() {
                    out.push(format!(
                        "queue {}: deserved {} slots, allocated {}, pending {}; {} queued, {} running",
                        q.name,
                        slots(q.deserved),
                        slots(q.allocated),
                        slots(q.pending),
                        q.queued_jobs,
                        q.running
                    ));
                }
            }
            other => panic!("unknown command {other:?}"),
        }
        for d in self.core.take_decisions() {
            out.push(self.describe(&d));
        }
        self.core.check_invariants().unwrap_or_else(|e| panic!("after `{line}`: invariant broken: {e}"));
        out
    }

    fn run_of(&self, job: &str) -> RunId {
        *self.names.runs.get(job).unwrap_or_else(|| panic!("{job} was never assigned"))
    }

    fn status(&self, status: &JobStatus) -> String {
        let w = |id: WorkerId| self.names.worker_name(id);
        match status {
            JobStatus::Queued { queues, reserved_on } => {
                let qs: Vec<String> = queues
                    .iter()
                    .map(|q| match q {
                        QueueName::First(id) => format!("first:{}", w(*id)),
                        QueueName::Second(id) => format!("second:{}", w(*id)),
                        QueueName::Global => "global".to_owned(),
                    })
                    .collect();
                let mut s = format!("queued in [{}]", qs.join(" "));
                if let Some(r) = reserved_on {
                    write!(s, ", reserved on {}", w(*r)).expect("string");
                }
                s
            }
            JobStatus::WaitingForWorker(why) => format!("waiting for a worker: {why}"),
            JobStatus::Assigned { worker, run } => format!("assigned to {} as run {}", w(*worker), run.0),
            JobStatus::Running { worker, run } => format!("running on {} as run {}", w(*worker), run.0),
        }
    }

    fn describe(&mut self, d: &Decision) -> String {
        let waiters = |ws: &[WaiterId]| ws.iter().map(|w| w.0.to_string()).collect::<Vec<_>>().join(",");
        match d {
            Decision::Assign { worker, job, run, attempt } => {
                self.names.runs.insert(job.to_string(), *run);
                let attempt = if *attempt > 1 { format!(" attempt {attempt}") } else { String::new() };
                format!("assign {job} to {}{attempt}", self.names.worker_name(*worker))
            }
            Decision::Drop { worker, run } => {
                format!("drop run {} on {}", run.0, self.names.worker_name(*worker))
            }
            Decision::Stop { worker, run } => {
                format!("stop run {} on {}", run.0, self.names.worker_name(*worker))
            }
            Decision::Suspend { worker, run, by } => {
                format!("suspend run {} on {} for {by}", run.0, self.names.worker_name(*worker))
            }
            Decision::Resume { worker, run } => {
                format!("resume run {} on {}", run.0, self.names.worker_name(*worker))
            }
            Decision::Finished { job, waiters: ws, completion } => {
                let how = match completion {
                    Completion::Ran(r) if r.success && r.cached => "cached".to_owned(),
                    Completion::Ran(r) if r.success => "succeeded".to_owned(),
                    Completion::Ran(r) => format!("failed with exit code {}", r.exit_code.unwrap_or(-1)),
                    Completion::GaveUp(why) => format!("failed: {why}"),
                };
                format!("finished {job} for waiters {}: {how}", waiters(ws))
            }
            Decision::Cancelled { job, stage } => format!("cancelled {job} ({stage:?})"),
            Decision::WorkerLost { worker } => format!("lost {}", self.names.worker_name(*worker)),
            Decision::Requeued { job, attempts, reason } => {
                format!("requeued {job} after {attempts} attempt(s): {reason}")
            }
        }
    }
}

/// `slots:2,cpu:4000,mem:8Gi`.
fn limits(v: &str) -> QueueLimits {
    let mut l = QueueLimits::default();
    for (k, v) in pairs(v) {
        match k.as_str() {
            "slots" => l.slots = Some(v.parse().expect("slots")),
            "cpu" => l.cpu = Some(size(&v)),
            "mem" => l.memory = Some(size(&v)),
            other => panic!("unknown limit {other}"),
        }
    }
    l
}

/// A `queue` line: adds the queue (and its tenants) to the configuration.
fn parse_queue(line: &str, config: &mut Config) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut q = QueueConfig { name: words[1].to_owned(), ..QueueConfig::default() };
    for (k, v) in args(&words[2..]) {
        match k.as_str() {
            "weight" => q.weight = v.parse().expect("weight"),
            "parent" => q.parent = Some(v),
            "priority" => q.priority = v.parse().expect("priority"),
            "reclaimable" => q.reclaimable = v == "yes",
            "cap" => q.capability = limits(&v),
            "guarantee" => q.guarantee = limits(&v),
            "tenants" => {
                for t in v.split(',') {
                    config.tenant_queues.insert(t.to_owned(), q.name.clone());
                }
            }
            other => panic!("unknown queue key {other}"),
        }
    }
    config.queues.push(q);
}

/// A `tier` line: appends a tier of plugins (`name`, `name:preemptable`,
/// `name:WEIGHT`, separated by commas or spaces).
fn parse_tier(line: &str, config: &mut Config) {
    let mut tier = Tier::default();
    for word in line.split([' ', ',']).skip(1).filter(|w| !w.is_empty()) {
        let (name, arg) = word.split_once(':').unwrap_or((word, ""));
        let mut plugin = PluginConfig::named(name);
        match arg {
            "" => {}
            "preemptable" => plugin.preemptable = true,
            weight => plugin.weight = Some(weight.parse().expect("plugin weight")),
        }
        tier.plugins.push(plugin);
    }
    config.tiers.push(tier);
}

fn parse_config(line: &str) -> Config {
    let mut config = Config::default();
    let words: Vec<&str> = line.split_whitespace().collect();
    for (k, v) in args(&words[1..]) {
        if k == "evict" {
            config.evict = match v.as_str() {
                "kill" => Evict::Kill,
                "suspend" => Evict::Suspend,
                other => panic!("evict=kill|suspend, not {other}"),
            };
            continue;
        }
        let n: u64 = v.parse().expect("number");
        match k.as_str() {
            "cache" => config.cache_timeout = Millis(n),
            "deps" => config.deps_timeout = Millis(n),
            "lease" => config.lease_timeout = Millis(n),
            "grace" => config.unplaceable_grace = Millis(n),
            "lost" => config.lost_worker_grace = Millis(n),
            "empty" => config.no_worker_grace = Millis(n),
            "seed" => config.seed = n,
            "preempt" => config.preempt = n != 0,
            "reclaim" => config.reclaim = n != 0,
            "exempt" => config.eviction_exempt = Millis(n),
            "binpack" => config.binpack = n as u32,
            "spread" => config.spread = n as u32,
            other => panic!("unknown config key {other}"),
        }
    }
    config
}

/// Runs a script; returns the script as it should read given the actual
/// output.
fn execute(script: &str) -> String {
    let mut runner: Option<Runner> = None;
    let mut config: Option<Config> = None;
    let mut tiers_given = false;
    let mut actual = String::new();
    for line in script.lines() {
        if line.starts_with("> ") || line == ">" {
            continue;
        }
        actual.push_str(line);
        actual.push('\n');
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if trimmed.starts_with("config") {
            assert!(runner.is_none() && config.is_none(), "config must come first");
            config = Some(parse_config(trimmed));
            continue;
        }
        if trimmed.starts_with("queue ") {
            assert!(runner.is_none(), "queues come before other commands");
            parse_queue(trimmed, config.get_or_insert_with(Config::default));
            continue;
        }
        if trimmed.starts_with("tier ") {
            assert!(runner.is_none(), "tiers come before other commands");
            let config = config.get_or_insert_with(Config::default);
            if !std::mem::replace(&mut tiers_given, true) {
                config.tiers.clear();
            }
            parse_tier(trimmed, config);
            continue;
        }
        let r = runner.get_or_insert_with(|| {
            let config = config.take().unwrap_or_default();
            assert_eq!(config.validate(), Ok(()), "queue and tier configuration");
            Runner::new(config)
        });
        for out in r.run(trimmed) {
            actual.push_str("> ");
            actual.push_str(&out);
            actual.push('\n');
        }
    }
    actual
}

fn check(name: &str) {
    let path: PathBuf =
        [env!("CARGO_MANIFEST_DIR"), "tests", "scenarios", &format!("{name}.scn")].iter().collect();
    let script = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let actual = execute(&script);
    if actual == script {
        return;
    }
    if std::env::var_os("UPDATE_SCENARIOS").is_some() {
        std::fs::write(&path, &actual).expect("write scenario");
        return;
    }
    let mut diff = String::new();
    for (i, (want, got)) in script.lines().zip(actual.lines()).enumerate() {
        if want != got {
            writeln!(diff, "line {}:\n  expected: {want}\n  actual:   {got}", i + 1).expect("string");
            break;
        }
    }
    panic!("scenario {name} differs from its expectations\n{diff}\n--- actual transcript ---\n{actual}");
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

scenarios!(
    dedup,
    artifacts,
    locality_timers,
    locality_late_news,
    locality_draw,
    fairness,
    resources,
    reserve_larger,
    reserve_preempt,
    exclusive,
    labels,
    labels_wait,
    labels_lost,
    cancellation,
    worker_loss,
    queue_weights,
    queue_capability,
    queue_guarantee,
    queue_hierarchy,
    job_order,
    gangs,
    gangs_competing,
    preempt,
    preempt_capped,
    preempt_exempt,
    preempt_suspend,
    preempt_suspend_kill,
    preempt_suspend_end,
    reclaim,
    placement,
    placement_spread,
    tiers_default,
    tiers_fairness_first,
    tiers_plain,
    tiers_drf_first,
    tiers_victims,
    tiers_victims_intersection,
    tiers_no_gang,
    tiers_no_proportion,
);

/// The default tiers, as README.md writes them out, reproduce every scenario
/// written before tiers existed (which run under `Config::default()`): each
/// script, with the tiers inserted after its `config` line, reads as it is.
#[test]
fn default_tiers_written_out_change_no_scenario() {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "scenarios"].iter().collect();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios") {
        let path = entry.expect("entry").path();
        let script = std::fs::read_to_string(&path).expect("scenario");
        if path.extension().is_none_or(|e| e != "scn") || script.lines().any(|l| l.starts_with("tier ")) {
            continue;
        }
        let tiers = "tier priority,gang\ntier drf,proportion,fairness,critical-path,predicates\n";
        let with_tiers = match script.find("\nconfig ").or(script.starts_with("config ").then_some(0)) {
            Some(at) => {
                let end = at + script[at + 1..].find('\n').expect("config line ends") + 2;
                format!("{}{tiers}{}", &script[..end], &script[end..])
            }
            None => format!("{tiers}{script}"),
        };
        let actual = execute(&with_tiers);
        assert_eq!(actual, with_tiers, "{} under the default tiers written out", path.display());
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} scenarios");
}

/// Draws of one worker between its second queue and the global queue: returns
/// `true` for each pick that came from the local jobs.
fn draw_sequence(seed: u64, draws: usize) -> Vec<bool> {
    let config = Config { deps_timeout: Millis(100), seed, ..Config::default() };
    let mut core = Scheduler::new(config);
    let w1 = WorkerId(1);
    let capacity = Capacity { slots: 1, cpu: 1000, memory: 1 << 30, ..Capacity::default() };
    let joined = Event::WorkerJoined {
        worker: w1,
        name: "w1".into(),
        capacity,
        labels: BTreeMap::new(),
        artifacts: vec![JobId::named("d1")],
    };
    core.handle(Millis(0), joined).expect("join");
    core.handle(
        Millis(0),
        Event::Schedule { spec: JobSpec::new(JobId::named("busy"), "t"), waiter: WaiterId(1) },
    )
    .expect("schedule");
    for i in 0..draws {
        let spec = JobSpec::new(JobId::named(&format!("g{i}")), "t");
        core.handle(Millis(0), Event::Schedule { spec, waiter: WaiterId(1) }).expect("schedule");
    }
    // The global jobs reach the global queue at 100; the local ones, scheduled
    // then, stay in w1's second queue until 200.
    core.handle(Millis(100), Event::Tick).expect("tick");
    for i in 0..draws {
        let mut spec = JobSpec::new(JobId::named(&format!("l{i}")), "t");
        spec.deps = vec![JobId::named("d1")];
        core.handle(Millis(100), Event::Schedule { spec, waiter: WaiterId(1) }).expect("schedule");
    }
    let mut run = None;
    for d in core.take_decisions() {
        if let Decision::Assign { run: r, .. } = d {
            run = Some(r);
        }
    }
    let mut picks = Vec::new();
    for _ in 0..draws {
        let result = JobResult::ok();
        core.handle(Millis(100), Event::JobExited { run: run.expect("a run"), result }).expect("exit");
        for d in core.take_decisions() {
            if let Decision::Assign { job, run: r, .. } = d {
                picks.push(job.to_string().starts_with('l'));
                run = Some(r);
            }
        }
    }
    assert_eq!(picks.len(), draws, "every exit is followed by a draw");
    picks
}

/// distbuild's draw: uniform among the queues that offer a job, so with two
/// offering queues each wins about half the draws; the seed fixes the
/// sequence.
#[test]
fn draw_is_uniform_among_offering_queues_and_seeded() {
    let picks = draw_sequence(7, 200);
    let local = picks.iter().filter(|&&l| l).count();
    // Binomial(200, 1/2): mean 100, standard deviation about 7.
    assert!((65..=135).contains(&local), "{local} of 200 draws were local");
    assert_eq!(picks, draw_sequence(7, 200), "same seed, same draws");
    assert_ne!(picks, draw_sequence(8, 200), "another seed, other draws");
}
