//! Benchmarks of the scheduling core alone, at cluster scale: how fast it
//! takes events and makes decisions, with no I/O around it.
//!
//! The cluster: 1,000 workers (4 slots each, CPU and memory; a tenth offer
//! two `network` tokens, a twentieth are in `pool=big`) holding 10,000
//! dependency artifacts between them (each on 1 to 3 workers). The backlog:
//! 100,000 or 1,000,000 queued jobs from 100 tenants, each reading 1 to 3 of
//! those artifacts, with a mix of resource shapes, labels, counted and
//! exclusive tokens and priorities; 1% have their own result cached on a
//! worker. Every policy is on: most queued jobs sit in the second local
//! queues of their dependencies' holders and in the global queue, the most
//! recent tenth in the local queues only; the slots are busy (but for a
//! handful that reservations hold free).
//!
//! Each benchmark times one event handed to `Scheduler::handle` plus
//! `take_decisions` (what the shell does per event), with anything needed to
//! keep the state steady done untimed between events:
//!
//! - `submit`: `Schedule` of a new job (its spec is built beforehand); the
//!   jobs are cancelled again, untimed, so the backlog stays at its size.
//! - `cancel_queued`: the reverse: `Cancel` of a queued job's only waiter.
//! - `exit_and_assign`: a run exits successfully and its worker asks for work:
//!   the core finishes the job, records the artifact and draws the worker's
//!   next job (fairness, locality and resources over the whole backlog). The
//!   backlog is topped up and the clock moves on (untimed) every 5,000.
//!   Each worker's cache is bounded: it keeps the results of its last 32
//!   runs, and reports the older ones evicted at each top-up (untimed), so
//!   the artifact index stays at a steady size instead of gaining an entry
//!   per exit for the whole run.
//! - `complete_with_waiters/W`: the same exit, for a job that `W` waiters
//!   share through dedup (they join it untimed beforehand).
//! - `dedup_join/10000`: `Schedule` of a job that already has 10,000 waiters.
//! - `worker_loss`: `WorkerLeft` of a busy worker: its 4 runs are requeued,
//!   its queues, reservation and artifact locations dropped. It rejoins,
//!   untimed.
//! - `worker_join`: the rejoin: registration with its cached artifacts
//!   (rebuilding its local queues from the backlog) and 4 draws.
//!
//! Besides criterion's estimates, the harness records every timed event and
//! prints latency percentiles per benchmark at the end, and a child process
//! per size reports the resident memory per queued job. An `anchor` group
//! times a binary-heap pop and push at the largest size, the floor measured
//! in `/work/shared/reference/anchors.md`.
//!
//! Run with `cargo bench -p drover-core`. `DROVER_BENCH_PENDING=100000`
//! (comma-separated sizes) overrides the backlog sizes; `DROVER_BENCH_QUEUES=50`
//! spreads the tenants over 50 weighted queues (a fifth of them capped), and
//! puts the last 4 of every 100 jobs in a gang of their own (all or
//! nothing), as issue 5's benchmark asks: queues, gangs and DRF. `cargo test
//! --benches` runs every benchmark once on a 20,000-job backlog.
//! `DROVER_BENCH_EVENTS=N` skips criterion and runs exactly N
//! `exit_and_assign` events per size, the same ones on every run: for
//! counting tools (`valgrind --tool=callgrind --cache-sim=yes
//! --toggle-collect='*Cluster::timed*'`), whose counts do not move with the
//! machine's load as times do.

// The core's clippy.toml bans clocks so that the core stays a pure function of
// its inputs; this harness sits outside the core and times it.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

/// The allocator the `drover` binary, and so the coordinator around the
/// core, runs on (see its `main.rs`): the core's cost per event is mostly
/// cache and TLB misses, which the allocator's layout and page size move.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use drover_core::{
    Capacity, Config, Decision, Event, GangSpec, JobId, JobResult, JobSpec, Millis, QueueConfig, QueueLimits,
    Request, RunId, Scheduler, WaiterId, WorkerId,
};

const WORKERS: u64 = 1_000;
const SLOTS: u32 = 4;
const TENANTS: u64 = 100;
const DEP_ARTIFACTS: u64 = 10_000;
/// Share of the backlog scheduled after the DepsTimeout tick (local queues
/// only), per thousand.
const TAIL_PER_MILLE: u64 = 100;
/// Results of its own runs each worker's cache keeps. A worker's cache is
/// bounded: past this many, it evicts the oldest result (reported, untimed,
/// at the next top-up), so the artifact index stays the size of a steady
/// state instead of growing by an entry per exit. The dependency artifacts
/// the backlog reads stay.
const RESULTS_KEPT: usize = 32;
/// Most events timed between two untimed top-ups.
const CHUNK: u64 = 5_000;
/// Simulated time between chunks (half a DepsTimeout).
const STEP: Millis = Millis(50);
const GIB: u64 = 1 << 30;
const MEM_ENV: &str = "DROVER_BENCH_MEMORY_CHILD";
const SIZES_ENV: &str = "DROVER_BENCH_PENDING";
/// Number of weighted queues the tenants are spread over (0: none).
const QUEUES_ENV: &str = "DROVER_BENCH_QUEUES";
/// A fixed number of `exit_and_assign` events to run instead of criterion.
const EVENTS_ENV: &str = "DROVER_BENCH_EVENTS";

/// splitmix64: a tiny seeded generator, so every run builds the same cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Members of each gang (see [`job_spec`]).
const GANG: u64 = 4;

/// Whether the backlog has gangs: with queues (issue 5's benchmark).
fn gangs_on() -> bool {
    queue_count() > 0
}

fn queue_count() -> u64 {
    std::env::var(QUEUES_ENV).map_or(0, |v| v.parse().expect("queue count"))
}

fn config() -> Config {
    let queues = queue_count();
    Config {
        cache_timeout: Millis(10),
        deps_timeout: Millis(100),
        // Long enough that the benchmark never needs heartbeats.
        lease_timeout: Millis(24 * 3600 * 1000),
        unplaceable_grace: Millis(0),
        lost_worker_grace: Millis(300_000),
        seed: 0x5eed,
        // Weights 1 to 4, every fifth queue capped at a tenth of the slots.
        queues: (0..queues)
            .map(|q| QueueConfig {
                name: format!("q{q:02}"),
                weight: 1 + (q % 4) as u32,
                capability: QueueLimits {
                    slots: (q % 5 == 0).then_some((WORKERS * u64::from(SLOTS) / 10) as u32),
                    ..QueueLimits::default()
                },
                ..QueueConfig::default()
            })
            .collect(),
        tenant_queues: (0..TENANTS)
            .filter(|_| queues > 0)
            .map(|t| (format!("tenant-{t:02}"), format!("q{:02}", t % queues.max(1))))
            .collect(),
        ..Config::default()
    }
}

/// Job `i`'s ID: its index, little-endian.
fn job_id(i: u64) -> JobId {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&i.to_le_bytes());
    JobId(bytes)
}

fn job_index(id: &JobId) -> u64 {
    u64::from_le_bytes(id.0[..8].try_into().expect("8 bytes"))
}

/// Dependency artifact `d` (marked so it never collides with a job's ID).
fn dep_id(d: u64) -> JobId {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&d.to_le_bytes());
    bytes[31] = 0xde;
    JobId(bytes)
}

/// 1% of the initial jobs have their result cached on one worker already.
fn cached_on(i: u64) -> Option<u64> {
    (i % 100 == 7).then(|| Rng(i ^ 0xcac4e).next() % WORKERS)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// Job `i`, drawn from a generator seeded by its index.
fn job_spec(i: u64) -> JobSpec {
    let mut rng = Rng(i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x10b5);
    let tenant = rng.below(TENANTS);
    // With queues, the last GANG of every hundred jobs form a gang (all
    // or nothing), of the tenant of the hundred's first job.
    let gang = gangs_on() && i % 100 >= 100 - GANG;
    let tenant = if gang {
        Rng((i - i % 100).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x10b5).below(TENANTS)
    } else {
        tenant
    };
    let mut spec = JobSpec::new(job_id(i), &format!("tenant-{tenant:02}"));
    if gang {
        spec.gang = Some(GangSpec { id: format!("g{}", i / 100), min_available: GANG as u32 });
    }
    spec.deps = (0..1 + rng.below(3)).map(|_| dep_id(rng.below(DEP_ARTIFACTS))).collect();
    let shape = rng.below(1000);
    let (cpu, memory) = match shape {
        800..900 => (2_000, 4 * GIB),
        950..990 => (8_000, 16 * GIB),
        990.. => (2_000, 2 * GIB),
        _ => (1_000, GIB),
    };
    spec.request = Request { slots: 1, cpu, memory, tokens: BTreeMap::new() };
    match shape {
        // Most jobs need Linux; big ones run in the big pool.
        0..800 => spec.labels = labels(&[("os", "linux")]),
        950..990 => spec.labels = labels(&[("os", "linux"), ("pool", "big")]),
        // Some need the network (two per worker that offers it); a few want
        // it to themselves.
        900..950 => _ = spec.request.tokens.insert("network".to_owned(), 1),
        990.. => spec.exclusive = vec!["network".to_owned()],
        _ => {}
    }
    spec.priority = i32::from(rng.below(10) == 0);
    spec
}

/// The 1,000 workers' registrations, with the artifacts they hold: each
/// dependency on 1 to 3 workers, and the results of the cached jobs among
/// the first `pending`.
fn registrations(pending: u64) -> Vec<Event> {
    let mut rng = Rng(0xd15b);
    let mut held: Vec<Vec<JobId>> = vec![Vec::new(); WORKERS as usize];
    for d in 0..DEP_ARTIFACTS {
        for _ in 0..1 + rng.below(3) {
            held[rng.below(WORKERS) as usize].push(dep_id(d));
        }
    }
    for i in 0..pending {
        if let Some(w) = cached_on(i) {
            held[w as usize].push(job_id(i));
        }
    }
    let registration = |(w, artifacts): (usize, Vec<JobId>)| {
        let big = w % 20 == 0;
        let tokens = if w % 10 == 3 { BTreeMap::from([("network".to_owned(), 2)]) } else { BTreeMap::new() };
        let (cpu, memory) = if big { (64_000, 128 * GIB) } else { (16_000, 32 * GIB) };
        let labels =
            if big { labels(&[("os", "linux"), ("pool", "big")]) } else { labels(&[("os", "linux")]) };
        let capacity = Capacity { slots: SLOTS, cpu, memory, tokens };
        Event::WorkerJoined { worker: WorkerId(w as u64), name: format!("w{w}"), capacity, labels, artifacts }
    };
    held.into_iter().enumerate().map(registration).collect()
}

/// The core under load, and the harness's view of it.
struct Cluster {
    sched: Scheduler,
    now: Millis,
    registrations: Vec<Event>,
    /// Runs in flight (the harness never reports starts).
    inflight: Vec<RunId>,
    next_job: u64,
    next_waiter: u64,
    /// Backlog size to keep.
    target: usize,
    rng: Rng,
    /// Per worker, the results of its runs its cache holds, oldest first.
    results: Vec<VecDeque<JobId>>,
    /// Per worker, results its cache dropped, not yet reported.
    evicted: BTreeMap<u64, Vec<JobId>>,
    /// Every timed event, per benchmark: nanoseconds, and the decisions
    /// the timed events made, by kind.
    latencies: BTreeMap<String, Timed>,
}

/// What the timed events of one benchmark took and decided.
#[derive(Default)]
struct Timed {
    nanos: Vec<u64>,
    decisions: BTreeMap<&'static str, u64>,
}

impl Timed {
    /// Decisions of every kind, over all the events.
    fn decisions(&self) -> u64 {
        self.decisions.values().sum()
    }

    /// `kind: per event` for each kind of decision made.
    fn per_event(&self) -> String {
        let events = self.nanos.len().max(1) as f64;
        let kinds: Vec<String> =
            self.decisions.iter().map(|(kind, n)| format!("{kind} {:.2}", *n as f64 / events)).collect();
        if kinds.is_empty() { "none".to_owned() } else { kinds.join(", ") }
    }
}

/// The kind of a decision, for the counts.
fn kind(d: &Decision) -> &'static str {
    match d {
        Decision::Assign { .. } => "assign",
        Decision::Drop { .. } => "drop",
        Decision::Stop { .. } => "stop",
        Decision::Finished { .. } => "finished",
        Decision::Cancelled { .. } => "cancelled",
        Decision::WorkerLost { .. } => "worker_lost",
        Decision::Suspend { .. } => "suspend",
        Decision::Resume { .. } => "resume",
        Decision::Requeued { .. } => "requeued",
    }
}

impl Cluster {
    /// Registers the workers and builds the backlog: most of it, then a tick
    /// past DepsTimeout (those jobs enter the global queue too), then the
    /// tail (local queues only). Every slot is busy afterwards.
    fn new(pending: u64) -> Cluster {
        let mut c = Cluster::registered(pending);
        c.fill();
        c
    }

    /// The workers registered with their artifacts; nothing scheduled yet.
    fn registered(pending: u64) -> Cluster {
        let mut c = Cluster {
            sched: Scheduler::new(config()),
            now: Millis(0),
            registrations: registrations(pending),
            inflight: Vec::new(),
            next_job: 0,
            next_waiter: 1 << 40,
            target: pending as usize,
            rng: Rng(0xbe4c),
            results: vec![VecDeque::new(); WORKERS as usize],
            evicted: BTreeMap::new(),
            latencies: BTreeMap::new(),
        };
        for event in c.registrations.clone() {
            c.handle(event);
        }
        c
    }

    /// Builds the backlog on a registered cluster.
    fn fill(&mut self) {
        let c = self;
        let pending = c.target as u64;
        let tail = pending * TAIL_PER_MILLE / 1000;
        c.schedule(pending - tail + u64::from(SLOTS) * WORKERS);
        c.now = c.now.after(Millis(config().deps_timeout.0 * 10));
        c.handle(Event::Tick);
        c.top_up();
        assert_eq!(c.queued(), c.target, "backlog built");
    }

    /// Untimed: hands in an event and follows the runs it starts.
    fn handle(&mut self, event: Event) {
        self.sched.handle(self.now, event).expect("event accepted");
        let decisions = self.sched.take_decisions();
        self.absorb(decisions);
    }

    fn absorb(&mut self, decisions: Vec<Decision>) {
        for d in decisions {
            if let Decision::Assign { run, .. } = d {
                self.inflight.push(run);
            }
        }
    }

    /// Timed: one event and its decisions. Records the latency under `name`.
    fn timed(&mut self, name: &str, event: Event) -> Duration {
        let start = Instant::now();
        let result = self.sched.handle(self.now, event);
        let decisions = self.sched.take_decisions();
        let took = start.elapsed();
        result.expect("event accepted");
        if !self.latencies.contains_key(name) {
            self.latencies.insert(name.to_owned(), Timed::default());
        }
        let timed = self.latencies.get_mut(name).expect("just inserted");
        timed.nanos.push(took.as_nanos() as u64);
        for d in &decisions {
            *timed.decisions.entry(kind(d)).or_default() += 1;
        }
        self.absorb(decisions);
        took
    }

    fn schedule(&mut self, count: u64) {
        for _ in 0..count {
            let i = self.next_job;
            self.next_job += 1;
            self.handle(Event::Schedule { spec: job_spec(i), waiter: WaiterId(i) });
        }
    }

    /// Jobs queued (not running).
    fn queued(&self) -> usize {
        self.sched.job_count() - self.sched.run_count()
    }

    /// Untimed: refills the backlog and lets time pass, so that earlier
    /// top-ups reach the global queue.
    fn top_up(&mut self) {
        for (w, artifacts) in std::mem::take(&mut self.evicted) {
            self.handle(Event::ArtifactsEvicted { worker: WorkerId(w), artifacts });
        }
        self.schedule(self.target.saturating_sub(self.queued()) as u64);
        self.now = self.now.after(STEP);
        self.handle(Event::Tick);
    }

    /// `n` timed events made by `one`, in chunks between top-ups.
    fn chunked(&mut self, n: u64, mut one: impl FnMut(&mut Cluster, u64) -> Duration) -> Duration {
        let (mut timed, mut done) = (Duration::ZERO, 0);
        while done < n {
            self.top_up();
            let k = (n - done).min(CHUNK);
            timed += one(self, k);
            done += k;
        }
        timed
    }

    /// `Schedule` of `k` new jobs, then their `Cancel`; one of the two timed.
    fn submit_and_cancel(&mut self, k: u64, time_submit: bool) -> Duration {
        let specs: Vec<JobSpec> = (self.next_job..self.next_job + k).map(job_spec).collect();
        self.next_job += k;
        let mut timed = Duration::ZERO;
        for spec in specs.iter().cloned() {
            let event = Event::Schedule { waiter: WaiterId(job_index(&spec.id)), spec };
            if time_submit { timed += self.timed("submit", event) } else { self.handle(event) }
        }
        for spec in &specs {
            let event = Event::Cancel { job: spec.id, waiter: WaiterId(job_index(&spec.id)) };
            if time_submit { self.handle(event) } else { timed += self.timed("cancel_queued", event) }
        }
        timed
    }

    fn random_run(&mut self) -> RunId {
        let i = self.rng.below(self.inflight.len() as u64) as usize;
        self.inflight.swap_remove(i)
    }

    /// Timed: `run` exits, and its worker draws its next job. Its result
    /// joins the worker's cache, which evicts the oldest past
    /// [`RESULTS_KEPT`].
    fn exit(&mut self, name: &str, run: RunId) -> Duration {
        let (worker, job, _) = self.sched.run_info(run).expect("run in flight");
        let took = self.timed(name, Event::JobExited { run, result: JobResult::ok() });
        let cache = &mut self.results[worker.0 as usize];
        cache.push_back(job);
        if cache.len() > RESULTS_KEPT {
            let oldest = cache.pop_front().expect("over the bound");
            self.evicted.entry(worker.0).or_default().push(oldest);
        }
        took
    }

    /// `k` runs exit; each worker draws its next job.
    fn exits(&mut self, k: u64) -> Duration {
        (0..k)
            .map(|_| {
                let run = self.random_run();
                self.exit("exit_and_assign", run)
            })
            .sum()
    }

    /// Adds `n` waiters to the job of `run` (untimed).
    fn add_waiters(&mut self, run: RunId, n: u64) -> JobId {
        let (_, job, _) = self.sched.run_info(run).expect("run in flight");
        let spec = job_spec(job_index(&job));
        for _ in 0..n {
            self.next_waiter += 1;
            self.handle(Event::Schedule { spec: spec.clone(), waiter: WaiterId(self.next_waiter) });
        }
        job
    }

    /// `k` exits of jobs shared by `waiters` waiters each.
    fn shared_exits(&mut self, k: u64, waiters: u64) -> Duration {
        let name = format!("complete_with_waiters/{waiters}");
        let mut timed = Duration::ZERO;
        for _ in 0..k {
            let run = self.random_run();
            self.add_waiters(run, waiters - 1);
            timed += self.exit(&name, run);
        }
        timed
    }

    /// `k` waiters join `job` (timed) and leave again (untimed).
    fn joins(&mut self, job: JobId, k: u64) -> Duration {
        let spec = job_spec(job_index(&job));
        let mut timed = Duration::ZERO;
        for _ in 0..k {
            self.next_waiter += 1;
            let waiter = WaiterId(self.next_waiter);
            timed += self.timed("dedup_join/10000", Event::Schedule { spec: spec.clone(), waiter });
            self.handle(Event::Cancel { job, waiter });
        }
        timed
    }

    /// `k` times: a random worker leaves and registers again; one of the two
    /// timed.
    fn losses(&mut self, k: u64, time_leave: bool) -> Duration {
        let mut timed = Duration::ZERO;
        for _ in 0..k {
            let w = self.rng.below(WORKERS);
            let runs = self.sched.worker_runs(WorkerId(w));
            self.inflight.retain(|r| !runs.contains(r));
            let leave = Event::WorkerLeft { worker: WorkerId(w) };
            // It registers again with the artifacts it started with.
            self.results[w as usize].clear();
            self.evicted.remove(&w);
            let join = self.registrations[w as usize].clone();
            if time_leave {
                timed += self.timed("worker_loss", leave);
                self.handle(join);
            } else {
                self.handle(leave);
                timed += self.timed("worker_join", join);
            }
        }
        timed
    }
}

/// The anchor: one pop and one push on a binary heap of `size` entries.
fn anchor(criterion: &mut Criterion, size: u64) {
    let mut rng = Rng(0x4ea9);
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> =
        (0..size).map(|i| Reverse((rng.next(), i as u32))).collect();
    let mut group = criterion.benchmark_group("anchor");
    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("binary_heap_pop_push/{size}"), |b| {
        b.iter(|| {
            let Reverse((key, job)) = heap.pop().expect("heap is full");
            heap.push(Reverse((key.wrapping_add(rng.next() >> 8), job)));
            black_box(job)
        })
    });
    group.finish();
}

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("VmRSS value") * 1024
}

/// In a fresh child process (so that no memory freed earlier is reused):
/// registers the workers, then builds the backlog; returns (resident bytes
/// per queued job: the growth while the backlog is built, over its size;
/// resident bytes of the registered cluster alone; build time).
fn memory(pending: u64) -> (f64, f64, f64) {
    if let Ok(n) = std::env::var(MEM_ENV) {
        let before = rss();
        let mut cluster = Cluster::registered(n.parse().expect("backlog size"));
        let registered = rss();
        let start = Instant::now();
        cluster.fill();
        let secs = start.elapsed().as_secs_f64();
        let per_job = (rss() - registered) as f64 / cluster.target as f64;
        println!("{per_job} {} {secs}", registered - before);
        std::process::exit(0);
    }
    let exe = std::env::current_exe().expect("bench executable");
    let out = std::process::Command::new(exe).env(MEM_ENV, pending.to_string()).output().expect("child runs");
    assert!(out.status.success(), "memory child failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text.split_whitespace().map(|f| f.parse().expect("number")).collect();
    (f[0], f[1], f[2])
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn main() {
    if std::env::var(MEM_ENV).is_ok() {
        memory(0);
    }
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") {
        return;
    }
    let test_mode = !has("--bench") || has("--test");
    let sizes: Vec<u64> = match std::env::var(SIZES_ENV) {
        Ok(list) => list.split(',').map(|s| s.trim().parse().expect("backlog size")).collect(),
        Err(_) if test_mode => vec![20_000],
        Err(_) => vec![100_000, 1_000_000],
    };
    if let Ok(n) = std::env::var(EVENTS_ENV) {
        let n: u64 = n.parse().expect("event count");
        for &pending in &sizes {
            let mut c = Cluster::new(pending);
            let took = c.chunked(n, Cluster::exits);
            let timed = &c.latencies["exit_and_assign"];
            eprintln!(
                "{pending} queued: {n} exit_and_assign events, {:.2} µs each, {:.0} decisions/s ({}); {:.0} MB \
                 resident after",
                took.as_secs_f64() * 1e6 / n as f64,
                timed.decisions() as f64 / took.as_secs_f64(),
                timed.per_event(),
                rss() as f64 / 1e6
            );
        }
        return;
    }
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut latencies = BTreeMap::new();
    for &pending in &sizes {
        if !test_mode {
            let (bytes, cluster, secs) = memory(pending);
            eprintln!(
                "\n{pending} queued: built in {secs:.1} s ({:.0} schedules/s including the workers' first \
                 draws); {bytes:.0} resident bytes per queued job (the registered cluster alone: {:.0} MB)\n",
                pending as f64 / secs,
                cluster / 1e6
            );
        }
        let mut c = Cluster::new(pending);
        let mut group = criterion.benchmark_group(format!("core/{pending}_queued"));
        group.sampling_mode(SamplingMode::Flat).throughput(Throughput::Elements(1));
        group.bench_function("submit", |b| {
            b.iter_custom(|n| c.chunked(n, |c, k| c.submit_and_cancel(k, true)))
        });
        group.bench_function("cancel_queued", |b| {
            b.iter_custom(|n| c.chunked(n, |c, k| c.submit_and_cancel(k, false)))
        });
        group.bench_function("exit_and_assign", |b| b.iter_custom(|n| c.chunked(n, Cluster::exits)));
        for waiters in [1_000, 10_000] {
            group.bench_function(format!("complete_with_waiters/{waiters}"), |b| {
                b.iter_custom(|n| c.chunked(n, |c, k| c.shared_exits(k, waiters)))
            });
        }
        let run = c.inflight[0];
        let shared = c.add_waiters(run, 9_999);
        group.bench_function("dedup_join/10000", |b| b.iter_custom(|n| c.joins(shared, n)));
        group.bench_function("worker_loss", |b| b.iter_custom(|n| c.chunked(n, |c, k| c.losses(k, true))));
        group.bench_function("worker_join", |b| b.iter_custom(|n| c.chunked(n, |c, k| c.losses(k, false))));
        group.finish();
        for (name, v) in std::mem::take(&mut c.latencies) {
            latencies.insert(format!("{pending} queued: {name}"), v);
        }
    }
    anchor(&mut criterion, sizes.iter().copied().max().unwrap_or(1_000_000));
    criterion.final_summary();

    eprintln!("\nevery timed event, warm-up included (µs), and the decisions the timed events made:");
    eprintln!(
        "{:<48} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "", "events", "mean", "p50", "p99", "max", "events/s", "decisions/s"
    );
    for (name, mut timed) in latencies {
        let v = &mut timed.nanos;
        v.sort_unstable();
        let total = v.iter().sum::<u64>() as f64;
        let mean = total / v.len() as f64 / 1000.0;
        let (p50, p99, max) = (percentile(v, 0.5), percentile(v, 0.99), percentile(v, 1.0));
        eprintln!(
            "{name:<48} {:>9} {mean:>9.2} {p50:>9.2} {p99:>9.2} {max:>9.1} {:>12.0} {:>12.0}",
            v.len(),
            1e6 / mean,
            timed.decisions() as f64 / total * 1e9
        );
        eprintln!("{:<48} decisions per event: {}", "", timed.per_event());
    }
}
