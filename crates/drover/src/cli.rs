//! Command-line arguments (clap). The interface is a contract: commands and
//! options may be added, never renamed.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `--cache-keep-free`'s default (`drover_cas::DEFAULT_KEEP_FREE`).
pub(crate) const DEFAULT_KEEP_FREE: &str = "1Gi";
/// `--log-limit`'s default (`drover_worker::DEFAULT_LOG_LIMIT`).
pub(crate) const DEFAULT_LOG_LIMIT: &str = "16Mi";

/// drover: a distributed scheduler for build and CI work.
///
/// Builds are graphs of jobs (shell commands with sources, dependencies and
/// outputs) read from a build file. `drover run` builds on an embedded
/// cluster in this process; `drover serve` and `drover worker` start a real
/// one, and `drover submit` sends builds to it.
#[derive(Debug, Parser)]
#[command(version, about, long_about, propagate_version = true)]
pub(crate) struct Cli {
    /// More log output on standard error (-v: info, -vv: debug). DROVER_LOG
    /// takes a tracing filter and overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a build on an embedded cluster (a coordinator and local workers in
    /// this process; state under ./.drover/).
    Run(RunArgs),
    /// Start a coordinator.
    Serve(ServeArgs),
    /// Start a worker that joins a coordinator.
    Worker(Box<WorkerArgs>),
    /// Submit a build to a coordinator and print its ID.
    Submit(SubmitArgs),
    /// Show a build's state and jobs (without BUILD: every build).
    Status(StatusArgs),
    /// Cancel a build: work no other build needs is stopped.
    Cancel(CancelArgs),
    /// Re-run a finished build's failed jobs and what they skipped.
    Retry(RetryArgs),
    /// Suspend a build's running jobs (or one of them): their processes are
    /// stopped (SIGSTOP) and their timeout clocks pause; they keep their
    /// slots.
    Suspend(SuspendArgs),
    /// Resume suspended jobs (SIGCONT).
    Resume(SuspendArgs),
    /// List the workers.
    Workers(WorkersArgs),
    /// List the coordinator's queues: weight, deserved share, what each
    /// holds, queues and runs.
    Queues(QueuesArgs),
    /// Print a job's output log.
    Logs(LogsArgs),
    /// Measure an embedded cluster: throughput, dependency latency, no-op
    /// rebuilds, shared builds, makespan, weighted queues, transfers and
    /// pulls (results as a Markdown table, next to their targets).
    Bench(BenchArgs),
}

/// A tenant's or queue's name: not empty.
fn name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() { Err("the name is empty".to_owned()) } else { Ok(text.to_owned()) }
}

/// A coordinator's URL: `http://` and a host, or a bare `HOST:PORT`, read
/// as `http://HOST:PORT` (as curl does). (The client has no TLS.)
fn coordinator_url(text: &str) -> Result<String, String> {
    let url = if text.contains("://") { text.to_owned() } else { format!("http://{text}") };
    if url.starts_with("https://") {
        return Err(format!(
            "{text:?}: drover speaks plain http only (put a TLS-terminating proxy in front of the coordinator \
             and give its http address here, or use an SSH tunnel)"
        ));
    }
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{text:?} is not an http:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{text:?} names no host (expected http://HOST:PORT)"));
    }
    Ok(url)
}

/// Where the coordinator is and how to talk to it.
#[derive(Debug, Clone, Args)]
pub(crate) struct Remote {
    /// The coordinator's URL (`HOST:PORT` alone means `http://HOST:PORT`).
    #[arg(long, env = "DROVER_COORDINATOR", default_value = "http://127.0.0.1:7700", value_parser = coordinator_url)]
    pub(crate) coordinator: String,
    /// The cluster's token, if it has one.
    #[arg(long, env = "DROVER_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
}

/// Options shared by `run` and `submit`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BuildArgs {
    /// The build file (YAML, or TOML with a .toml name).
    pub(crate) file: PathBuf,
    /// Export the outputs of the jobs nothing depends on into DIR/<job>/.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Re-run every job instead of using cached results.
    #[arg(long)]
    pub(crate) no_cache: bool,
    /// Print the final status as JSON on standard output.
    #[arg(long)]
    pub(crate) json: bool,
    /// Once the build ends, print on standard error what each job that ran
    /// in it wrote (its standard output, then its standard error), in the
    /// build file's order; jobs that wrote nothing are left out.
    #[arg(long)]
    pub(crate) logs: bool,
    /// The tenant (team or repository) the build is scheduled for.
    #[arg(long, default_value = "default", value_parser = name)]
    pub(crate) tenant: String,
    /// When a job fails: quit (start nothing new, let running jobs
    /// finish), continue (run everything that does not depend on the
    /// failure) or terminate (also stop the running jobs).
    #[arg(long, value_enum, default_value_t = OnErrorArg::Quit)]
    pub(crate) on_error: OnErrorArg,
    /// At most N of this build's jobs queued or running at once (overrides
    /// the build file's max_parallel).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_parallel: Option<u32>,
    /// The coordinator queue for the build's jobs (overrides the build
    /// file's queue; default: the tenant's queue in the coordinator's
    /// config, else `default`). See `drover queues`.
    #[arg(long, value_name = "QUEUE", value_parser = name)]
    pub(crate) queue: Option<String>,
}

/// `--on-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnErrorArg {
    /// Start nothing new; running jobs finish.
    Quit,
    /// Run every job that does not depend on a failure.
    Continue,
    /// Stop the build's running jobs too.
    Terminate,
}

impl From<OnErrorArg> for drover_proto::OnError {
    fn from(arg: OnErrorArg) -> Self {
        match arg {
            OnErrorArg::Quit => drover_proto::OnError::Quit,
            OnErrorArg::Continue => drover_proto::OnError::Continue,
            OnErrorArg::Terminate => drover_proto::OnError::Terminate,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) build: BuildArgs,
    /// Local workers to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) workers: u32,
    /// Job slots per worker (default: the CPUs divided among the workers,
    /// at least 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) slots: Option<u32>,
    /// Where the embedded cluster keeps its state and caches.
    #[arg(long, default_value = ".drover", value_name = "DIR")]
    pub(crate) state: PathBuf,
    /// Labels every local worker has, as KEY=VALUE,... (besides os, arch
    /// and worker=local-N), for jobs that require them.
    #[arg(long, default_value = "")]
    pub(crate) labels: String,
    /// Named tokens every local worker offers, as NAME=N,... (e.g.
    /// network=1), for jobs that ask for them.
    #[arg(long, default_value = "")]
    pub(crate) tokens: String,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub(crate) listen: SocketAddr,
    /// Where the state log and uploaded sources live.
    #[arg(long, default_value = ".drover/coordinator", value_name = "DIR")]
    pub(crate) data: PathBuf,
    /// A TOML file with scheduler settings (see the README).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Require this token from every client, and from every worker unless
    /// --worker-token is given.
    #[arg(long, env = "DROVER_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Require this token from workers instead, so that a client's token
    /// cannot register a worker, take its runs, report results or push
    /// outputs to the shared cache. Workers then serve outputs and logs to
    /// requests with either token.
    #[arg(long, env = "DROVER_WORKER_TOKEN", hide_env_values = true)]
    pub(crate) worker_token: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The coordinator's URL (`HOST:PORT` alone means `http://HOST:PORT`).
    #[arg(long, env = "DROVER_COORDINATOR", default_value = "http://127.0.0.1:7700", value_parser = coordinator_url)]
    pub(crate) coordinator: String,
    /// Address to serve artifacts and logs on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub(crate) listen: SocketAddr,
    /// The URL peers reach this worker at (default: http://LISTEN).
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// The worker's name, unique in the cluster (default: worker-HOST-PORT). A live worker's name is refused to another worker at another URL.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Jobs at once (default: the number of CPUs). Without --cpu the
    /// worker offers at least a CPU per slot, so that this many jobs of one
    /// CPU each (a job's default request) run at once.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) slots: Option<u32>,
    /// CPU to offer, in cores ("2", "0.5") or millicores ("500m"); kept as
    /// given, even below the CPU the slots' jobs ask for. Default: the
    /// number of CPUs or the builders (by default the slots), whichever is
    /// more, times slots / builders (runs fetching ahead hold CPU in the
    /// coordinator's count without using it).
    #[arg(long)]
    pub(crate) cpu: Option<String>,
    /// Memory to offer ("8Gi", "512Mi"); default: the machine's memory.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Named tokens to offer, as NAME=N,... (e.g. network=2,gpu=1).
    #[arg(long, default_value = "")]
    pub(crate) tokens: String,
    /// Labels, as KEY=VALUE,... (e.g. os=linux,pool=big).
    #[arg(long, default_value = "")]
    pub(crate) labels: String,
    /// Where the artifact cache and run directories live.
    #[arg(long, default_value = ".drover/worker", value_name = "DIR")]
    pub(crate) cache: PathBuf,
    /// Size bound of the artifact cache.
    #[arg(long, default_value = "10Gi")]
    pub(crate) cache_size: String,
    /// Room the cache keeps free on its filesystem, as a size (`5Gi`) or a
    /// share of the filesystem (`2%`); when other files take the disk, the
    /// cache evicts its least recently used entries below --cache-size to
    /// keep it (all of them, if that is not enough). `0` turns it off.
    #[arg(long, default_value = DEFAULT_KEEP_FREE, value_name = "SIZE|PERCENT")]
    pub(crate) cache_keep_free: String,
    /// What a job's output survives once the worker reports it: a crash of
    /// this process, or also a power loss or kernel crash (one more
    /// synchronous disk write per job). An output lost to power loss is
    /// dropped from the cluster's knowledge when the worker registers
    /// again, as if it had been evicted.
    #[arg(long, value_enum, default_value_t = DurabilityArg::PowerLoss)]
    pub(crate) durability: DurabilityArg,
    /// How long a stopped job (cancel, timeout, eviction) gets after
    /// SIGTERM before its processes are killed with SIGKILL.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub(crate) kill_grace: String,
    /// Bytes each of a job's logs (standard output, standard error) keeps
    /// at most, or "off". Past it the log keeps its first bytes and its
    /// last ones (up to 1 MiB), with a line saying how much was dropped
    /// between them.
    #[arg(long, default_value = DEFAULT_LOG_LIMIT, value_name = "SIZE")]
    pub(crate) log_limit: String,
    /// On SIGTERM or Ctrl-C the worker drains: its running jobs finish,
    /// nothing new comes, then it leaves the cluster. After this long it
    /// stops what still runs and leaves anyway, as on a second signal
    /// (default: wait for the jobs). Set it below a pod's termination
    /// grace period so the worker leaves before it is killed.
    #[arg(long, value_name = "DURATION")]
    pub(crate) drain_timeout: Option<String>,
    /// Do not push new outputs to the coordinator's shared cache.
    #[arg(long)]
    pub(crate) no_push: bool,
    /// Jobs fetching their sources and dependencies, or pulling results
    /// from the shared cache, at once (the pull and fetch stages' tokens).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) fetchers: u32,
    /// Jobs running their commands at once (the build stage's tokens;
    /// default: the slots). Fewer builders than slots lets the worker fetch
    /// the inputs of its next jobs while others build.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) builders: Option<u32>,
    /// Outputs pushed to the shared cache at once (the push stage's tokens).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) pushers: u32,
    /// The token to present: the coordinator's --worker-token if it has
    /// one, else its --token. Default: $DROVER_WORKER_TOKEN, else
    /// $DROVER_TOKEN.
    #[arg(long)]
    pub(crate) token: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    pub(crate) build: BuildArgs,
    #[command(flatten)]
    pub(crate) remote: Remote,
    /// Follow the build's progress and exit with its result.
    #[arg(long)]
    pub(crate) wait: bool,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The build's ID.
    pub(crate) build: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Follow the build's events until it ends.
    #[arg(long, requires = "build")]
    pub(crate) watch: bool,
    /// Print the build's events as JSON lines (its whole history, then live
    /// events until it ends) instead of its status.
    #[arg(long, requires = "build", conflicts_with_all = ["watch", "json"])]
    pub(crate) events: bool,
    /// Without BUILD: only this tenant's builds.
    #[arg(long, conflicts_with = "build")]
    pub(crate) tenant: Option<String>,
    /// Without BUILD: only builds in this state (queued, running,
    /// succeeded, failed, cancelled; `active` for queued or running).
    #[arg(long, conflicts_with = "build", value_parser = ["queued", "running", "succeeded", "failed", "cancelled", "active"])]
    pub(crate) state: Option<String>,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// The build's ID.
    pub(crate) build: u64,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct SuspendArgs {
    /// The build's ID.
    pub(crate) build: u64,
    /// One job of the build, by name (default: every job of the build that
    /// is running, to suspend, or suspended, to resume).
    pub(crate) job: Option<String>,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    /// The build's ID.
    pub(crate) build: u64,
    /// Follow the build's progress and exit with its result.
    #[arg(long)]
    pub(crate) wait: bool,
    /// With --wait: print the final status as JSON on standard output.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct WorkersArgs {
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Drain the live worker of this name first (may be given again):
    /// nothing new goes to it, its running jobs finish. It stays draining
    /// until it registers again; stop it (SIGTERM) once it is idle.
    #[arg(long, value_name = "NAME")]
    pub(crate) drain: Vec<String>,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct QueuesArgs {
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The build's ID.
    pub(crate) build: u64,
    /// The job's name.
    pub(crate) job: String,
    /// Which stage's log: `build` (what the commands print), or what the
    /// worker did to `pull` the result from the shared cache, `fetch` the
    /// inputs, or `push` the output.
    #[arg(long, value_enum, default_value_t = LogStage::Build)]
    pub(crate) stage: LogStage,
    /// Print standard error instead of standard output (build stage).
    #[arg(long)]
    pub(crate) stderr: bool,
    /// Keep printing what the job writes until its run ends, and on into
    /// its next run if it runs again; exits 1 if the job failed or was
    /// cancelled.
    #[arg(long, short)]
    pub(crate) follow: bool,
    /// The log of this attempt (the `started ... (attempt N)` lines; an
    /// earlier run's, say one that failed before a rerun). Default: the
    /// latest run's.
    #[arg(long)]
    pub(crate) attempt: Option<u32>,
    #[command(flatten)]
    pub(crate) remote: Remote,
}

/// What a worker's committed outputs survive, for `drover worker
/// --durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DurabilityArg {
    /// A crash of the worker process.
    ProcessCrash,
    /// Also power loss and kernel crashes.
    PowerLoss,
}

/// A stage of a run on its worker, for `drover logs --stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogStage {
    /// The result from the shared cache.
    Pull,
    /// Sources and dependencies.
    Fetch,
    /// The commands (their standard output or error).
    Build,
    /// The output to the shared cache.
    Push,
}

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// Every one below.
    All,
    /// Independent `true` jobs against the process-spawn floor.
    Throughput,
    /// A chain of dependent jobs: scheduling overhead per link.
    Chain,
    /// A fully cached rebuild.
    Noop,
    /// 20 concurrent builds of the same graph: executions and wall time.
    Share,
    /// Random DAGs of short `sleep` jobs: makespan against its lower bound.
    Makespan,
    /// Three busy queues weighted 1:2:3: delivered slot-seconds against the
    /// weights (Jain's index).
    Queues,
    /// One large output fetched by the other worker: transfer rate and
    /// memory.
    Transfer,
    /// A build pulled from the shared cache by a fresh worker, against
    /// building it.
    Pull,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Which benchmark.
    #[arg(default_value = "all")]
    pub(crate) scenario: Scenario,
    /// Jobs in the throughput benchmark.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) jobs: usize,
    /// Length of the chain.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) chain: usize,
    /// Jobs in the no-op rebuild.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) noop: usize,
    /// Seconds the queues benchmark measures over (after 2 s of warm-up).
    #[arg(long, default_value_t = 60)]
    pub(crate) seconds: u64,
    /// Size of the output in the transfer benchmark.
    #[arg(long, default_value = "1Gi")]
    pub(crate) size: String,
    /// Jobs in the pull benchmark.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) pull: usize,
}
