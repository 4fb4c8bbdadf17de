//! The server side of the command: `drover serve` (a coordinator),
//! `drover worker`, and `drover run`, which starts both in this process
//! (an embedded cluster on loopback) and builds on it as a client would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use drover_coordinator::CoordinatorConfig;
use drover_exec::Supervisor;
use drover_proto::WorkerCapacity;
use drover_worker::WorkerConfig;
use serde::Deserialize;

use crate::Failure;
use crate::cli::{RunArgs, ServeArgs, WorkerArgs};
use crate::{client, units};

/// The hidden first argument that makes this binary a worker's zygote,
/// which forks the jobs' supervisors.
pub(crate) const ZYGOTE_ARG: &str = "__zygote";

/// How workers started by this binary run their jobs (one zygote each).
/// The zygote and the supervisors it forks (one per slot) keep little
/// memory, read none of it cold, and would each take whole 2 MiB huge
/// pages: mimalloc's transparent huge pages (see `main.rs`) are off there.
fn supervisor() -> anyhow::Result<Supervisor> {
    let exe = std::env::current_exe().context("cannot find the drover executable to run jobs with")?;
    Ok(Supervisor::with_env(exe, vec![ZYGOTE_ARG.into()], vec![("MIMALLOC_ALLOW_THP".into(), "0".into())]))
}

/// `drover serve --config FILE`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    scheduler: SchedulerSection,
    #[serde(default)]
    store: StoreSection,
    /// `[[queues]]` tables.
    #[serde(default)]
    queues: Vec<QueueSection>,
    /// `[tenants]`: tenant = "leaf queue".
    #[serde(default)]
    tenants: std::collections::BTreeMap<String, String>,
    /// `[[tiers]]` tables: the plugin tiers (none: the default tiers).
    #[serde(default)]
    tiers: Option<Vec<TierSection>>,
    #[serde(default)]
    cache: CacheSection,
    #[serde(default)]
    history: HistorySection,
}

/// The `[history]` table: what the coordinator keeps of finished builds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistorySection {
    /// How many finished builds it keeps, their status and events (default
    /// 1,000; 0 keeps every one, and memory grows with the history).
    keep_finished_builds: Option<u64>,
}

/// The `[cache]` table: the shared cache of outputs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheSection {
    /// Size bound (`"10Gi"`).
    size: Option<String>,
    /// Size bound of the uploaded sources (`"20Gi"`).
    sources: Option<String>,
    /// Room kept free on the filesystem (`"5Gi"`, `"2%"`, `"0"`).
    keep_free: Option<String>,
}

/// One `[[queues]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueSection {
    name: String,
    parent: Option<String>,
    #[serde(default = "one")]
    weight: u32,
    #[serde(default)]
    capability: LimitsSection,
    #[serde(default)]
    guarantee: LimitsSection,
    #[serde(default = "yes")]
    reclaimable: bool,
    #[serde(default)]
    priority: i32,
}

/// One `[[tiers]]` table: `plugins = ["priority", { name = "binpack",
/// weight = 2 }]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TierSection {
    plugins: Vec<PluginEntry>,
}

/// A plugin of a tier: its name, or a table with its arguments.
#[derive(Debug)]
enum PluginEntry {
    Name(String),
    Table(PluginTable),
}

// By hand rather than `untagged`, so that a mistake in a table says what
// it is (`unknown field "wieght"`), not only that no form matched.
impl<'de> Deserialize<'de> for PluginEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = PluginEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a plugin's name, or a table such as { name = \"binpack\", weight = 2 }")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<PluginEntry, E> {
                Ok(PluginEntry::Name(name.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<PluginEntry, A::Error> {
                PluginTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(PluginEntry::Table)
            }
        }
        d.deserialize_any(Entry)
    }
}

/// `{ name = "binpack", weight = 2 }`, `{ name = "drf", preemptable = true }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginTable {
    name: String,
    weight: Option<u32>,
    #[serde(default)]
    preemptable: bool,
}

/// The core's tiers for `[[tiers]]` tables (checked by
/// `drover_core::Config::validate`).
fn tiers(sections: &[TierSection]) -> Vec<drover_core::Tier> {
    let plugin = |entry: &PluginEntry| match entry {
        PluginEntry::Name(name) => drover_core::PluginConfig::named(name),
        PluginEntry::Table(t) => {
            drover_core::PluginConfig { name: t.name.clone(), weight: t.weight, preemptable: t.preemptable }
        }
    };
    sections.iter().map(|t| drover_core::Tier { plugins: t.plugins.iter().map(plugin).collect() }).collect()
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// `{ slots = 4, cpu = "8", memory = "16Gi" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    slots: Option<u32>,
    cpu: Option<String>,
    memory: Option<String>,
}

impl LimitsSection {
    fn limits(&self, queue: &str) -> anyhow::Result<drover_core::QueueLimits> {
        Ok(drover_core::QueueLimits {
            slots: self.slots,
            cpu: self
                .cpu
                .as_deref()
                .map(|c| units::cpu("cpu", c))
                .transpose()
                .with_context(|| format!("queue {queue}"))?,
            memory: self
                .memory
                .as_deref()
                .map(|m| units::size("memory", m))
                .transpose()
                .with_context(|| format!("queue {queue}"))?,
        })
    }
}

/// The `[store]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    /// `"process-crash"` (default) or `"power-loss"`: what a recorded
    /// input survives.
    durability: Option<String>,
    /// A size (`"64Mi"`, the default) or `"off"`: how much is recorded
    /// before the state is written down and the log behind it dropped.
    snapshot_after: Option<String>,
}

/// The `[scheduler]` table: durations as text (`"2s"`, `"150ms"`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerSection {
    cache_timeout: Option<String>,
    deps_timeout: Option<String>,
    lease_timeout: Option<String>,
    unplaceable_grace: Option<String>,
    lost_worker_grace: Option<String>,
    no_worker_grace: Option<String>,
    seed: Option<u64>,
    /// A starving job may evict lower-priority jobs of its queue.
    #[serde(default)]
    preempt: bool,
    /// A queue below its share may evict jobs of queues above theirs.
    #[serde(default)]
    reclaim: bool,
    /// How evictions treat their victims: `"kill"` (default) or
    /// `"suspend"` where the victim's memory allows.
    #[serde(default)]
    evict: drover_core::Evict,
    /// How long a run is spared from eviction after it starts (default 0).
    eviction_exempt: Option<String>,
    /// Placement: weight of filling the busiest workers first.
    #[serde(default)]
    binpack: u32,
    /// Placement: weight of using the least busy workers first.
    #[serde(default)]
    spread: u32,
}

/// A setting's duration, read by `parse` (`units::wait` for the waits that
/// zero turns off).
fn millis(
    what: &str,
    text: &Option<String>,
    default: drover_core::Millis,
    parse: fn(&str, &str) -> anyhow::Result<Duration>,
) -> anyhow::Result<drover_core::Millis> {
    match text {
        None => Ok(default),
        Some(text) => Ok(drover_core::Millis(parse(what, text)?.as_millis() as u64)),
    }
}

fn coordinator_config(args: &ServeArgs) -> anyhow::Result<CoordinatorConfig> {
    let mut config = CoordinatorConfig::new(args.data.clone());
    config.listen = args.listen;
    config.token = nonempty_token("--token ($DROVER_TOKEN)", args.token.clone())?;
    config.worker_token = nonempty_token("--worker-token ($DROVER_WORKER_TOKEN)", args.worker_token.clone())?;
    if config.worker_token.is_some() && config.token.is_none() {
        anyhow::bail!(
            "--worker-token needs --token too: it keeps clients from acting as workers, which only means \
             something when clients need a token of their own"
        );
    }
    if config.worker_token.is_some() && config.worker_token == config.token {
        anyhow::bail!(
            "--worker-token is the same as --token: give workers a token of their own, or leave \
             --worker-token out to use one token for both"
        );
    }
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let file: ConfigFile =
            toml::from_str(&text).with_context(|| format!("{}: invalid config", path.display()))?;
        apply_config_file(&mut config, &file).with_context(|| format!("{}", path.display()))?;
    }
    Ok(config)
}

/// The settings of a `--config` file, on top of the defaults and flags.
fn apply_config_file(config: &mut CoordinatorConfig, file: &ConfigFile) -> anyhow::Result<()> {
    let s = &file.scheduler;
    let core = &mut config.core;
    core.cache_timeout = millis("cache_timeout", &s.cache_timeout, core.cache_timeout, units::wait)?;
    core.deps_timeout = millis("deps_timeout", &s.deps_timeout, core.deps_timeout, units::wait)?;
    core.lease_timeout = millis("lease_timeout", &s.lease_timeout, core.lease_timeout, units::duration)?;
    core.unplaceable_grace =
        millis("unplaceable_grace", &s.unplaceable_grace, core.unplaceable_grace, units::wait)?;
    core.lost_worker_grace =
        millis("lost_worker_grace", &s.lost_worker_grace, core.lost_worker_grace, units::wait)?;
    core.no_worker_grace = millis("no_worker_grace", &s.no_worker_grace, core.no_worker_grace, units::wait)?;
    core.seed = s.seed.unwrap_or(core.seed);
    core.preempt = s.preempt;
    core.reclaim = s.reclaim;
    core.evict = s.evict;
    core.eviction_exempt = millis("eviction_exempt", &s.eviction_exempt, core.eviction_exempt, units::wait)?;
    core.binpack = s.binpack;
    core.spread = s.spread;
    for q in &file.queues {
        core.queues.push(drover_core::QueueConfig {
            name: q.name.clone(),
            parent: q.parent.clone(),
            weight: q.weight,
            capability: q.capability.limits(&q.name)?,
            guarantee: q.guarantee.limits(&q.name)?,
            reclaimable: q.reclaimable,
            priority: q.priority,
        });
    }
    core.tenant_queues = file.tenants.clone();
    if let Some(sections) = &file.tiers {
        core.tiers = tiers(sections);
    }
    if let Some(size) = &file.cache.size {
        config.artifact_cache_bytes = units::size("[cache] size", size)?;
        anyhow::ensure!(
            config.artifact_cache_bytes > 0,
            "[cache] size cannot be 0: the shared cache would keep nothing (leave it out for the default)"
        );
    }
    if let Some(size) = &file.cache.sources {
        config.source_cache_bytes = units::size("[cache] sources", size)?;
        anyhow::ensure!(
            config.source_cache_bytes > 0,
            "[cache] sources cannot be 0: no build's sources could be kept (leave it out for the default)"
        );
    }
    if let Some(keep) = &file.cache.keep_free {
        config.cache_keep_free = units::reserve("[cache] keep_free", keep)?;
    }
    if let Some(keep) = file.history.keep_finished_builds {
        config.keep_finished_builds = (keep > 0).then_some(keep);
    }
    if let Err(errors) = core.validate() {
        anyhow::bail!("invalid scheduler, queues or tiers:\n  {}", errors.join("\n  "));
    }
    config.durability = match file.store.durability.as_deref() {
        None | Some("process-crash") => drover_coordinator::Durability::ProcessCrash,
        Some("power-loss") => drover_coordinator::Durability::PowerLoss,
        Some(other) => {
            anyhow::bail!("[store] durability must be \"process-crash\" or \"power-loss\", not {other:?}")
        }
    };
    config.snapshot_after = match file.store.snapshot_after.as_deref() {
        None => Some(drover_coordinator::SNAPSHOT_AFTER),
        Some("off") => None,
        Some(size) => Some(units::size("[store] snapshot_after", size)?.max(1)),
    };
    Ok(())
}

/// `drover serve`.
pub(crate) async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let config = coordinator_config(&args).map_err(Failure::Usage)?;
    let coordinator = drover_coordinator::start(config).await.map_err(|e| match e {
        // The configured settings cannot apply to the jobs it holds: the
        // config file is the input to change (or the jobs to let end).
        drover_coordinator::CoordinatorError::Settings(_) => Failure::Usage(e.into()),
        e => Failure::Runtime(e.into()),
    })?;
    warn_if_open(args.listen, args.token.is_some(), "clients and workers");
    eprintln!("drover coordinator listening on {}", coordinator.url());
    tokio::select! {
        stopped = coordinator.wait() => stopped.map_err(|e| Failure::Runtime(e.into())),
        () = shutdown_signal() => {
            // Its state is on disk as each input is: builds go on when it
            // starts again, and workers wait for it meanwhile.
            eprintln!("drover coordinator: stopping; builds and workers carry on when it starts again");
            Ok(())
        }
    }
}

/// Warns when a server listens beyond this machine without a token: then
/// anyone who reaches the port may run commands on the workers (submit a
/// build) or read what they hold.
fn warn_if_open(listen: std::net::SocketAddr, token: bool, who: &str) {
    if !token && !listen.ip().is_loopback() {
        eprintln!(
            "drover: WARNING: listening on {listen} without a token: anyone who can reach it can run commands \
             on the workers; set --token (or DROVER_TOKEN) for {who} too"
        );
    }
}

/// The token a worker presents: `--token`, else `$DROVER_WORKER_TOKEN`
/// (so that a machine that also runs clients, with `$DROVER_TOKEN` set for
/// them, gives its worker the workers' token), else `$DROVER_TOKEN`.
fn worker_token(args: &WorkerArgs) -> anyhow::Result<Option<String>> {
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var("DROVER_WORKER_TOKEN").ok())
        .or_else(|| std::env::var("DROVER_TOKEN").ok());
    nonempty_token("the worker's token (--token, $DROVER_WORKER_TOKEN or $DROVER_TOKEN)", token)
}

/// A token, refused when empty: an empty token would be required of
/// everyone and presented by no one (an unset variable's `VAR=`).
fn nonempty_token(what: &str, token: Option<String>) -> anyhow::Result<Option<String>> {
    match token {
        Some(t) if t.is_empty() => anyhow::bail!("{what} is empty: give a token, or none"),
        token => Ok(token),
    }
}

/// `drover worker`.
pub(crate) async fn worker(args: WorkerArgs) -> Result<(), Failure> {
    let config = worker_config(&args).map_err(Failure::Usage)?;
    let config_has_token = config.token.is_some();
    let drain_timeout = args
        .drain_timeout
        .as_deref()
        .map(|text| units::duration("--drain-timeout", text))
        .transpose()
        .map_err(Failure::Usage)?;
    // Stop requests are caught from here on, by one listener for the
    // whole life of the worker: one that came between two listeners would
    // be lost.
    let mut stops = Interrupts::new().context("cannot catch SIGINT and SIGTERM").map_err(Failure::Runtime)?;
    let mut worker = drover_worker::start(config).await.map_err(|e| Failure::Runtime(e.into()))?;
    warn_if_open(args.listen, config_has_token, "peers and the coordinator");
    if args.advertise.is_none() && args.listen.ip().is_unspecified() {
        eprintln!(
            "drover: WARNING: this worker tells the cluster it is at {}, which no other machine can reach: \
             set --advertise to an address peers and the coordinator can reach",
            worker.url()
        );
    }
    eprintln!("drover worker serving on {}; joining the coordinator at {}", worker.url(), args.coordinator);
    let mut said = false;
    let joined = worker.joined();
    tokio::pin!(joined);
    loop {
        tokio::select! {
            done = worker.wait() => return done.map_err(|e| Failure::Usage(e.into())),
            () = stops.next() => break,
            id = &mut joined, if !said => {
                said = true;
                eprintln!("drover worker: joined the cluster (worker {id})");
            }
        }
    }
    if !worker.has_joined() {
        // Nothing was ever given to it: there is nothing to drain.
        eprintln!("drover worker: stopped before it joined the cluster");
        return Ok(());
    }
    // A first stop request drains: the running jobs finish and are
    // reported, nothing new starts. A second one stops them now. Either
    // way the worker then leaves, so whatever it still ran goes back to the
    // queues at once, not when its lease runs out.
    eprintln!(
        "drover worker: draining: running jobs finish, nothing new starts (stop it again to stop them now)"
    );
    let timeout = async {
        match drain_timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = worker.drain() => eprintln!("drover worker: drained; leaving the cluster"),
        () = stops.next() => eprintln!("drover worker: stopping its jobs and leaving the cluster"),
        () = timeout => eprintln!("drover worker: --drain-timeout passed; stopping its jobs and leaving the cluster"),
    }
    worker.leave().await;
    Ok(())
}

fn worker_config(args: &WorkerArgs) -> anyhow::Result<WorkerConfig> {
    let cpus = units::cpus();
    let slots = args.slots.unwrap_or(cpus);
    let builders = args.builders.unwrap_or(slots);
    anyhow::ensure!(
        builders <= slots,
        "--builders ({builders}) cannot exceed --slots ({slots}): a worker never holds more jobs than slots"
    );
    let capacity = WorkerCapacity {
        slots,
        cpu_millis: match &args.cpu {
            Some(text) => units::cpu("--cpu", text)?,
            // A core per builder at least, as `drover run`'s workers have
            // one per slot: `--slots` jobs of one core each (the default
            // request) run at once even on fewer CPUs. The coordinator
            // counts the CPU of every run the worker holds, fetching ahead
            // or building; only the builders use it.
            None => u64::from(cpus.max(builders)) * 1000 * u64::from(slots) / u64::from(builders),
        },
        memory: match &args.memory {
            Some(text) => units::size("--memory", text)?,
            None => units::memory(),
        },
        tokens: units::tokens(&args.tokens)?,
    };
    Ok(WorkerConfig {
        coordinator: args.coordinator.clone(),
        coordinator_router: None,
        listen: args.listen,
        advertise: args.advertise.clone(),
        name: args.name.clone(),
        capacity,
        labels: labels(units::pairs("--labels", &args.labels)?),
        dir: args.cache.clone(),
        cache_bytes: units::size("--cache-size", &args.cache_size)?,
        cache_keep_free: units::reserve("--cache-keep-free", &args.cache_keep_free)?,
        durability: match args.durability {
            crate::cli::DurabilityArg::ProcessCrash => drover_cas::Durability::ProcessCrash,
            crate::cli::DurabilityArg::PowerLoss => drover_cas::Durability::PowerLoss,
        },
        token: worker_token(args)?,
        supervisor: supervisor()?,
        kill_grace: units::duration("--kill-grace", &args.kill_grace)?,
        keep_runs: 1000,
        log_limit: units::limit("--log-limit", &args.log_limit)?,
        push: !args.no_push,
        fetchers: args.fetchers as usize,
        builders: builders as usize,
        pushers: args.pushers as usize,
    })
}

/// `os` and `arch` of this machine, unless given, plus the given labels.
fn labels(
    mut given: std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    given.entry("os".into()).or_insert_with(|| std::env::consts::OS.into());
    given.entry("arch".into()).or_insert_with(|| std::env::consts::ARCH.into());
    given
}

/// Resolves on SIGINT or SIGTERM. Jobs' supervisors notice the worker's
/// exit and stop their jobs.
pub(crate) async fn shutdown_signal() {
    match Interrupts::new() {
        Ok(mut interrupts) => interrupts.next().await,
        Err(_) => std::future::pending().await,
    }
}

/// SIGINT and SIGTERM, caught from the moment this is made (a future of
/// [`shutdown_signal`] catches them from its first poll).
pub(crate) struct Interrupts(tokio::signal::unix::Signal, tokio::signal::unix::Signal);

impl Interrupts {
    pub(crate) fn new() -> std::io::Result<Interrupts> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Interrupts(signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
    }

    /// The next interrupt.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.0.recv() => {}
            _ = self.1.recv() => {}
        }
    }
}

/// A coordinator and local workers in this process. The coordinator and
/// the workers also listen on loopback (workers fetch each other's outputs
/// there, and other clients may connect), but the workers' requests to the
/// coordinator and this process's own (`Embedded::http`) go to its router
/// directly.
#[derive(Debug)]
pub(crate) struct Embedded {
    /// The coordinator's URL.
    pub(crate) url: String,
    // Kept for their lifetime: the servers run on the runtime's tasks.
    coordinator: drover_coordinator::Coordinator,
    _workers: Vec<drover_worker::Worker>,
}

impl Embedded {
    /// Starts a coordinator with its state in `state/coordinator` and
    /// `workers` workers with `slots` each (caches in `state/worker-N`), and
    /// waits until every worker has registered.
    pub(crate) async fn start(state: &Path, workers: u32, slots: u32) -> Result<Embedded, Failure> {
        Embedded::start_with(state, workers, slots, &Offer::default(), |_| {}).await
    }

    /// [`Embedded::start`], with workers that also offer `offer`, and the
    /// core's settings adjusted by `tune` (queues, say).
    pub(crate) async fn start_with(
        state: &Path,
        workers: u32,
        slots: u32,
        offer: &Offer,
        tune: impl FnOnce(&mut drover_core::Config),
    ) -> Result<Embedded, Failure> {
        let coordinator = embedded_coordinator(state, tune).await.map_err(|e| {
            // Another drover holds the directory: a usage error, and nothing
            // was submitted (exit code 2).
            if matches!(e.downcast_ref(), Some(drover_coordinator::CoordinatorError::Busy(_))) {
                Failure::Usage(e)
            } else {
                Failure::Runtime(e)
            }
        })?;
        let mut embedded = Embedded { url: coordinator.url(), coordinator, _workers: Vec::new() };
        let http = embedded.http();
        // The workers of an earlier run on this state died with its
        // process, but the state recovered says they hold their leases
        // (time stood still while nothing ran): they leave now, so that
        // their names are free for this run's workers and no job goes to
        // them.
        client::forget_workers(&http, &embedded.url).await?;
        for i in 1..=workers {
            let config =
                embedded_worker(state, i, slots, offer, &embedded.coordinator).map_err(Failure::Runtime)?;
            embedded
                ._workers
                .push(drover_worker::start(config).await.map_err(|e| Failure::Runtime(e.into()))?);
        }
        client::wait_for_workers(&http, &embedded.url, workers as usize).await?;
        Ok(embedded)
    }

    /// A client for it, in this process.
    pub(crate) fn http(&self) -> drover_http::Http {
        client::connect(&crate::cli::Remote { coordinator: self.url.clone(), token: None })
            .with_local(&self.url, self.coordinator.router())
    }
}

/// `drover run`: an embedded coordinator and workers on loopback, then the
/// build as `submit --wait` would run it.
pub(crate) async fn run(args: RunArgs) -> Result<(), Failure> {
    // Check the build file before starting anything.
    let loaded = client::load_excluding(&args.build.file, args.build.out.as_deref())?;
    let slots = args.slots.unwrap_or_else(|| units::cpus().div_ceil(args.workers).max(1));
    let offer = Offer {
        labels: units::pairs("--labels", &args.labels).map_err(Failure::Usage)?,
        tokens: units::tokens(&args.tokens).map_err(Failure::Usage)?,
    };
    if let Some(given) = offer.labels.get("worker") {
        return Err(Failure::Usage(anyhow::anyhow!(
            "--labels worker={given}: `worker` is drover run's own label, local-1 to local-{} (one per local \
             worker, so a job can be pinned to one); give your label another name",
            args.workers
        )));
    }
    let cluster = Embedded::start_with(&args.state, args.workers, slots, &offer, |_| {}).await?;
    let http = cluster.http();
    let work = client::build_and_wait(&http, &cluster.url, loaded, &args.build, &args.state);
    tokio::select! {
        result = work => result,
        () = shutdown_signal() => {
            eprintln!("drover: interrupted; running jobs are stopped");
            Err(Failure::Build)
        }
    }
}

async fn embedded_coordinator(
    state: &Path,
    tune: impl FnOnce(&mut drover_core::Config),
) -> anyhow::Result<drover_coordinator::Coordinator> {
    // Not `coordinator/`: that is where `drover serve` keeps its state by
    // default (`.drover/coordinator`), and a run in the same directory must
    // neither take up a served coordinator's builds and workers nor hand
    // its own history to one.
    let mut config = CoordinatorConfig::new(state.join("embedded"));
    config.listen = ([127, 0, 0, 1], 0).into();
    // Local workers answer at once; a lost one is noticed quickly.
    config.core.lease_timeout = drover_core::Millis(5_000);
    // Every worker is on this machine: an artifact is as close to one as to
    // another, so locality is worth only a short wait, about what fetching
    // a small output from a sibling costs (10 ms made the makespan
    // benchmark's first builds about 1.3% slower: BENCHMARKS.md).
    config.core.deps_timeout = drover_core::Millis(2);
    // Its workers die with the process: those of an earlier run that this
    // one does not start again never come back, and no job waits for them.
    config.core.lost_worker_grace = drover_core::Millis(0);
    config.core.no_worker_grace = drover_core::Millis(0);
    tune(&mut config.core);
    let context = || format!("cannot start the embedded coordinator in {}", state.display());
    match drover_coordinator::start(config.clone()).await {
        // Another version's state (after an upgrade of drover, say), or
        // leftover jobs of a run under other settings: an embedded
        // cluster's state is only its history, so it is put aside (once:
        // the previous one aside is replaced) and the run starts afresh.
        // The workers keep their caches, and the new state learns what
        // they hold when they register.
        Err(e) if e.is_foreign_state() => {
            let aside = state.join("embedded.old");
            if aside.exists() {
                drover_cas::remove_tree(&aside)
                    .with_context(|| format!("cannot remove {}", aside.display()))?;
            }
            std::fs::rename(&config.data_dir, &aside)
                .with_context(|| format!("cannot move {} aside", config.data_dir.display()))?;
            eprintln!(
                "drover: {e}\ndrover: moved that state to {} and starting afresh (the workers keep their caches)",
                aside.display()
            );
            drover_coordinator::start(config).await.with_context(context)
        }
        started => started.with_context(context),
    }
}

/// Labels and tokens every embedded worker offers besides its own
/// (`drover run --labels --tokens`).
#[derive(Debug, Default)]
pub(crate) struct Offer {
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    pub(crate) tokens: std::collections::BTreeMap<String, u64>,
}

fn embedded_worker(
    state: &Path,
    i: u32,
    slots: u32,
    offer: &Offer,
    coordinator: &drover_coordinator::Coordinator,
) -> anyhow::Result<WorkerConfig> {
    let mut own = offer.labels.clone();
    own.insert("worker".to_owned(), format!("local-{i}"));
    let cpus = units::cpus();
    Ok(WorkerConfig {
        coordinator: coordinator.url(),
        // In this process: the workers' requests skip the socket.
        coordinator_router: Some(coordinator.router()),
        listen: ([127, 0, 0, 1], 0).into(),
        advertise: None,
        name: Some(format!("local-{i}")),
        capacity: WorkerCapacity {
            slots,
            cpu_millis: u64::from(cpus.max(slots)) * 1000,
            memory: units::memory(),
            tokens: offer.tokens.clone(),
        },
        // `worker=local-N` lets a build file pin a job to one of them.
        labels: labels(own),
        dir: PathBuf::from(state).join(format!("worker-{i}")),
        cache_bytes: 10 << 30,
        cache_keep_free: drover_cas::DEFAULT_KEEP_FREE,
        // Like the embedded coordinator's input log (`[store] durability`
        // at its default), the caches are made to survive a crash of this
        // process, not power loss: the workers re-list their caches when
        // they register again, so an output lost to power loss is simply
        // built again.
        durability: drover_cas::Durability::ProcessCrash,
        token: None,
        supervisor: supervisor()?,
        kill_grace: Duration::from_secs(2),
        keep_runs: 1000,
        log_limit: Some(drover_worker::DEFAULT_LOG_LIMIT),
        // The embedded workers' caches persist in the state directory and
        // die with the process: a shared copy would only cost time.
        push: false,
        fetchers: 10,
        builders: slots as usize,
        pushers: 4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The core config of a config file's `[scheduler]` and `[[tiers]]`.
    fn core(text: &str) -> drover_core::Config {
        let file: ConfigFile = toml::from_str(text).expect("config parses");
        let mut core = drover_core::Config { binpack: file.scheduler.binpack, ..Default::default() };
        if let Some(sections) = &file.tiers {
            core.tiers = tiers(sections);
        }
        core
    }

    /// `drover serve --config` of a file holding `text`, under `dir`.
    fn config_of(dir: &Path, text: &str) -> anyhow::Result<CoordinatorConfig> {
        let path = dir.join("config.toml");
        std::fs::write(&path, text).expect("config");
        let args = ServeArgs {
            listen: ([127, 0, 0, 1], 0).into(),
            data: dir.join("data"),
            config: Some(path),
            token: None,
            worker_token: None,
        };
        coordinator_config(&args)
    }

    /// `[scheduler] eviction_exempt` reaches the core; absent, it is 0.
    #[test]
    fn the_eviction_exemption_reaches_the_core() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exempt = |text: &str| config_of(dir.path(), text).expect("config reads").core.eviction_exempt;
        assert_eq!(exempt(""), drover_core::Millis(0));
        assert_eq!(exempt("[scheduler]\neviction_exempt = \"90s\"\n"), drover_core::Millis(90_000));
        assert!(config_of(dir.path(), "[scheduler]\neviction_exempt = \"soon\"\n").is_err());
    }

    /// `[history] keep_finished_builds`: absent keeps the default, 0 keeps
    /// every finished build.
    #[test]
    fn the_history_setting_reaches_the_coordinator() {
        let dir = tempfile::tempdir().expect("tempdir");
        let keep = |text: &str| config_of(dir.path(), text).expect("config reads").keep_finished_builds;
        assert_eq!(keep(""), Some(drover_coordinator::KEEP_FINISHED_BUILDS));
        assert_eq!(keep("[history]\nkeep_finished_builds = 5\n"), Some(5));
        assert_eq!(keep("[history]\nkeep_finished_builds = 0\n"), None);
    }

    /// The README's sample `serve --config` file is accepted as written,
    /// and its values are the defaults it claims.
    #[test]
    fn the_readme_config_sample_reads_as_the_defaults() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("`drover serve --config FILE` takes TOML:").expect("the sample's heading");
        let block = &readme[start..];
        let block = &block[block.find("```toml\n").expect("its block") + 8..];
        let sample = &block[..block.find("```").expect("the block's end")];
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_of(dir.path(), sample).expect("the README's sample reads");
        // `drover serve`'s defaults, which are the core's but for a longer
        // lease.
        let fresh = CoordinatorConfig::new(dir.path().join("data"));
        assert_eq!(config.source_cache_bytes, fresh.source_cache_bytes);
        assert_eq!(config.artifact_cache_bytes, fresh.artifact_cache_bytes);
        let defaults = fresh.core;
        assert_eq!(config.core.unplaceable_grace, defaults.unplaceable_grace);
        assert_eq!(config.core.lost_worker_grace, defaults.lost_worker_grace);
        assert_eq!(config.core.no_worker_grace, defaults.no_worker_grace);
        assert_eq!(config.core.lease_timeout, defaults.lease_timeout);
        assert_eq!(config.core.eviction_exempt, defaults.eviction_exempt);
        assert_eq!(config.core.deps_timeout, defaults.deps_timeout);
    }

    #[test]
    fn tiers_map_to_the_core_and_default_when_absent() {
        assert_eq!(core("").tiers, drover_core::Config::default_tiers());
        let custom = core(
            r#"
            [[tiers]]
            plugins = ["priority", "gang"]
            [[tiers]]
            plugins = [{ name = "drf", preemptable = true }, "proportion", { name = "binpack", weight = 2 }]
            "#,
        );
        let drf = drover_core::PluginConfig { preemptable: true, ..drover_core::PluginConfig::named("drf") };
        let binpack =
            drover_core::PluginConfig { weight: Some(2), ..drover_core::PluginConfig::named("binpack") };
        assert_eq!(
            custom.tiers,
            [
                drover_core::Tier::of(&["priority", "gang"]),
                drover_core::Tier {
                    plugins: vec![drf, drover_core::PluginConfig::named("proportion"), binpack]
                },
            ]
        );
        assert_eq!(custom.validate(), Ok(()));
    }

    #[test]
    fn bad_tiers_list_every_problem() {
        let bad = core(
            r#"
            [scheduler]
            binpack = 1
            [[tiers]]
            plugins = ["priority", "nodeorder", { name = "binpack", weight = 3 }]
            [[tiers]]
            plugins = ["priority", { name = "gang", weight = 1 }]
            "#,
        );
        let errors = bad.validate().unwrap_err();
        for problem in [
            "tier 1: unknown plugin \"nodeorder\"",
            "plugin priority is listed in tier 1 and again in tier 2",
            "plugin gang: only binpack and spread take a weight",
            "binpack is both listed in a tier and given as a weight (binpack = 1): keep one",
        ] {
            assert!(errors.iter().any(|e| e.starts_with(problem)), "missing {problem:?} in {errors:?}");
        }
        assert_eq!(errors.len(), 4, "{errors:?}");
        // A mistake in a plugin's table says what it is, and where.
        let unknown_key = "[[tiers]]\nplugins = [{ name = \"drf\", preempt = true }]\n";
        let error = toml::from_str::<ConfigFile>(unknown_key).expect_err("an unknown key").to_string();
        assert!(error.contains("unknown field `preempt`") && error.contains("line 2"), "{error}");
        let not_a_plugin = "[[tiers]]\nplugins = [3]\n";
        let error = toml::from_str::<ConfigFile>(not_a_plugin).expect_err("a number").to_string();
        assert!(error.contains("a plugin's name, or a table"), "{error}");
    }

    /// Sizes and amounts in the file are named as the file names them, not
    /// as a command-line flag; a shared cache of no size is refused.
    #[test]
    fn bad_amounts_in_the_file_name_their_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = |text: &str| format!("{:#}", config_of(dir.path(), text).expect_err("refused"));
        let cpu = error("[[queues]]\nname = \"a\"\ncapability = { cpu = \"16x\" }\n");
        assert!(cpu.contains("queue a: bad cpu \"16x\"") && !cpu.contains("--cpu"), "{cpu}");
        assert!(error("[cache]\nsize = \"0\"\n").contains("[cache] size cannot be 0"));
        assert!(error("[cache]\nsources = \"0\"\n").contains("[cache] sources cannot be 0"));
        let dir = tempfile::tempdir().expect("tempdir");
        let sources =
            config_of(dir.path(), "[cache]\nsources = \"3Gi\"\n").expect("reads").source_cache_bytes;
        assert_eq!(sources, 3 << 30);
    }

    #[test]
    fn evict_is_kill_or_suspend_and_suspend_needs_an_eviction() {
        let parse = |text: &str| toml::from_str::<ConfigFile>(text).map(|f| f.scheduler.evict);
        assert_eq!(parse("").expect("default"), drover_core::Evict::Kill);
        assert_eq!(
            parse("[scheduler]\nevict = \"suspend\"\n").expect("suspend"),
            drover_core::Evict::Suspend
        );
        assert!(parse("[scheduler]\nevict = \"pause\"\n").is_err());
        let lonely = drover_core::Config { evict: drover_core::Evict::Suspend, ..Default::default() };
        assert_eq!(lonely.validate(), Err(vec!["evict = \"suspend\" needs preempt or reclaim".to_owned()]));
        let preempting = drover_core::Config { preempt: true, ..lonely };
        assert_eq!(preempting.validate(), Ok(()));
    }
}
