//! drover's worker: a thin async shell that runs what the coordinator assigns.
//!
//! [`start`] opens the artifact cache, serves the worker's own HTTP API
//! ([`server`]: artifacts for peers, logs for clients) and runs the session
//! ([`session`]): register with capacity, labels, cached artifacts and the
//! runs still going; then long-poll (the poll is also the heartbeat that
//! renews the lease, and says when mail waits) and report what happened
//! ([`report`]): the answers to the reports carry the assignments.
//! Each assignment runs in its own task ([`job`]) through the stages pull,
//! fetch, build and push, each under its own tokens ([`tokens`]): fetch
//! inputs, run the commands under a supervisor process, commit the output as
//! an artifact.
//!
//! The worker survives a coordinator restart: runs go on, reports are kept
//! (in memory) until they are delivered, and the session registers again
//! with the runs it still has. A worker told to stop waits for its reports
//! [`REPORT_GRACE`] at most once its runs have ended ([`Worker::drain`]).

mod job;
mod report;
mod server;
mod session;
mod tokens;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_cas::{Cas, Key};
use drover_exec::Supervisor;
use drover_http::Http;
use drover_proto::WorkerCapacity;
use tokio_util::sync::CancellationToken;

/// Bytes each of a run's logs keeps at most by default: a job that writes
/// without end cannot fill the worker's disk (GitLab's runners keep 4 MiB).
pub const DEFAULT_LOG_LIMIT: u64 = 16 << 20;

/// How long a draining worker whose runs have all ended keeps trying to
/// report their ends before it leaves anyway ([`Worker::drain`]): a
/// coordinator that is down must not keep a stopped worker from exiting.
/// About fifteen tries of the report task (which waits at most 2 s between
/// tries): room for a coordinator that restarts to come back and take them.
pub const REPORT_GRACE: Duration = Duration::from_secs(30);

/// How to run a worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The coordinator's base URL.
    pub coordinator: String,
    /// The coordinator's API in this process, if it runs here (an embedded
    /// cluster): requests for `coordinator` go to it without a socket.
    pub coordinator_router: Option<axum::Router>,
    /// Where to serve artifacts and logs (port 0: any free port).
    pub listen: SocketAddr,
    /// The URL peers and the coordinator reach this worker at (default: the
    /// listening address).
    pub advertise: Option<String>,
    /// The worker's name (default: derived from the advertised URL).
    pub name: Option<String>,
    /// What it offers.
    pub capacity: WorkerCapacity,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Where the artifact cache, run directories and logs live.
    pub dir: PathBuf,
    /// Size bound of the artifact cache (least recently used artifacts are
    /// evicted beyond it).
    pub cache_bytes: u64,
    /// Room the cache keeps free on its filesystem, evicting beyond
    /// `cache_bytes` if it must (see [`drover_cas::Cas::keep_free`]).
    pub cache_keep_free: drover_cas::Reserve,
    /// What a committed output survives before the run is reported (see
    /// [`drover_cas::Durability`]).
    pub durability: drover_cas::Durability,
    /// Presented to the coordinator and required from peers, if set.
    pub token: Option<String>,
    /// How jobs are run.
    pub supervisor: Supervisor,
    /// Between SIGTERM and SIGKILL when a job is stopped.
    pub kill_grace: Duration,
    /// Logs of this many most recent runs are kept (also across a restart
    /// on the same `dir`).
    pub keep_runs: usize,
    /// Bytes each of a run's logs keeps at most (`None`: all); see
    /// [`drover_exec::JobSpec::log_limit`].
    pub log_limit: Option<u64>,
    /// Push each new output to the coordinator's shared cache.
    pub push: bool,
    /// Jobs fetching their inputs at once (BuildStream's default: 10).
    pub fetchers: usize,
    /// Jobs running their commands at once (at most the slots; fewer lets
    /// the worker fetch ahead).
    pub builders: usize,
    /// Outputs pushed to the shared cache at once (default 4).
    pub pushers: usize,
}

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The cache or work directory is unusable.
    #[error("{path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another worker uses the directory.
    #[error("{0} is in use by another worker (one worker per cache directory)")]
    Busy(String),
    /// The artifact cache failed to open.
    #[error("artifact cache: {0}")]
    Cas(#[from] drover_cas::CasError),
    /// The address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The coordinator refused the worker's first registration for a reason
    /// that retrying cannot fix (a wrong token, an invalid capacity or
    /// label, an address that is not a drover coordinator).
    #[error("the coordinator refused this worker: {0}")]
    Refused(String),
}

/// State shared by the worker's tasks.
#[derive(Debug)]
struct Shared {
    config: WorkerConfig,
    /// This worker's URL, as advertised.
    url: String,
    name: String,
    cas: Arc<Cas>,
    /// Client for the coordinator (and peers), with the token.
    http: Http,
    /// Runs in progress, by run ID.
    runs: Mutex<BTreeMap<u64, RunControl>>,
    /// Reports not yet delivered.
    outbox: report::Outbox,
    /// Run directories kept for their logs, oldest first.
    kept: Mutex<VecDeque<u64>>,
    /// Their list on disk (see `job::KeptFile`).
    kept_file: Mutex<job::KeptFile>,
    /// The newest lines of the pull, fetch and push stages' logs of running
    /// and kept runs, by run and stage (see `job::StageLog`).
    notes: Mutex<BTreeMap<(u64, &'static str), Vec<u8>>>,
    /// Artifacts being fetched from peers, so one fetch serves every job.
    fetching: Mutex<BTreeSet<Key>>,
    fetched: tokio::sync::Notify,
    /// The stages' tokens.
    tokens: Arc<tokens::Arbiter>,
    /// Shutting down once its runs end ([`Worker::drain`]): said to the
    /// coordinator again after every registration.
    draining: std::sync::atomic::AtomicBool,
    /// Outputs on their way to the shared cache ([`job::Pushing`]): a drain
    /// waits for them, within its grace.
    pushing: std::sync::atomic::AtomicUsize,
    /// Empty working directories for runs without sources, each used by
    /// one run at a time (see `job::DirPool`).
    empty_dirs: job::DirPool,
    /// The runs' temporary directories, each lent to one run at a time.
    tmp_dirs: job::DirPool,
    /// Why the session ended, when the coordinator refused the worker's
    /// first registration (see `session::run`).
    refused: Mutex<Option<String>>,
    /// The worker's ID in its latest session, once it has registered.
    joined: tokio::sync::watch::Sender<Option<u64>>,
    /// The digest of the clients' token, when the cluster gives workers a
    /// token of their own: learnt at each registration, so that clients
    /// may fetch outputs and logs here (see `server::require_token`).
    readers: Mutex<Option<drover_proto::Hash32>>,
}

/// How the session reaches a run in progress: cancelling the token stops
/// it; suspend and resume reach its processes once its supervisor runs (a
/// suspend that comes earlier is applied as soon as it starts).
///
/// A suspended run gives its build stage's tokens back (its `process`
/// token above all: a run the core suspended for a preemptor must not keep
/// the preemptor from building) and takes them again before its processes
/// continue.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunControl {
    pub(crate) cancel: CancellationToken,
    job: Arc<Mutex<Held>>,
}

/// What a [`RunControl`] holds of its run.
#[derive(Debug, Default)]
struct Held {
    /// The job's handle once started.
    handle: Option<drover_exec::JobHandle>,
    /// Whether it should be suspended.
    suspended: bool,
    /// During the build stage: its tokens' request, and their grant unless
    /// given back while suspended.
    build: Option<(tokens::Request, Option<tokens::Grant>)>,
    /// Dependencies whose outputs it could get from nowhere
    /// (`RunResult::lost_inputs`).
    lost_inputs: Vec<drover_proto::Hash32>,
    /// Its commands could not be started, or their logs not written: the
    /// worker's doing, maybe (see `job::disk_fault`).
    spawn_failed: bool,
    /// The worker failed the run, not the job: its supervisor was killed
    /// before it reported, or an input does not fit in its cache.
    worker_failed: bool,
}

impl RunControl {
    /// Notes that the worker failed the run, not the job.
    pub(crate) fn worker_failed(&self) {
        self.job.lock().expect("run control").worker_failed = true;
    }

    /// Whether [`RunControl::worker_failed`] was noted.
    pub(crate) fn failed_by_worker(&self) -> bool {
        self.job.lock().expect("run control").worker_failed
    }

    /// Notes that the run's commands could not be started, or their logs
    /// not written.
    pub(crate) fn spawn_failed(&self) {
        self.job.lock().expect("run control").spawn_failed = true;
    }

    /// Whether [`RunControl::spawn_failed`] was noted.
    pub(crate) fn failed_to_spawn(&self) -> bool {
        self.job.lock().expect("run control").spawn_failed
    }

    /// Notes that dependency `job`'s output could be had from nowhere.
    pub(crate) fn lost_input(&self, job: drover_proto::Hash32) {
        self.job.lock().expect("run control").lost_inputs.push(job);
    }

    /// The dependencies whose outputs could be had from nowhere.
    pub(crate) fn take_lost_inputs(&self) -> Vec<drover_proto::Hash32> {
        std::mem::take(&mut self.job.lock().expect("run control").lost_inputs)
    }

    /// Suspends (`true`) or resumes the run's processes. A resumed run
    /// that gave its build tokens back continues once it has them again.
    pub(crate) fn suspend(&self, on: bool, tokens: &Arc<tokens::Arbiter>) {
        let mut held = self.job.lock().expect("run control");
        held.suspended = on;
        if on {
            if let Some(handle) = &held.handle {
                if let Err(e) = handle.suspend() {
                    tracing::warn!("cannot suspend a run: {e}");
                }
                // Stopped: its tokens go back (dropping the grant).
                if let Some((_, grant)) = &mut held.build {
                    grant.take();
                }
            }
            return;
        }
        match &held.build {
            Some((request, None)) => {
                let (request, control, tokens) = (request.clone(), self.clone(), tokens.clone());
                tokio::spawn(async move {
                    let grant = tokio::select! {
                        grant = tokens.acquire(request, || {}) => grant,
                        () = control.cancel.cancelled() => return,
                    };
                    let Ok(grant) = grant else { return };
                    let mut held = control.job.lock().expect("run control");
                    // Suspended again meanwhile, or already continued by
                    // an earlier resume: the grant goes back.
                    if !held.suspended
                        && let Some((_, slot @ None)) = &mut held.build
                    {
                        *slot = Some(grant);
                        if let Some(handle) = &held.handle
                            && let Err(e) = handle.resume()
                        {
                            tracing::warn!("cannot resume a run: {e}");
                        }
                    }
                });
            }
            _ => {
                if let Some(handle) = &held.handle
                    && let Err(e) = handle.resume()
                {
                    tracing::warn!("cannot resume a run: {e}");
                }
            }
        }
    }

    /// The build stage got its tokens.
    pub(crate) fn building(&self, request: tokens::Request, grant: tokens::Grant) {
        self.job.lock().expect("run control").build = Some((request, Some(grant)));
    }

    /// The build stage ended: its tokens go back.
    pub(crate) fn built(&self) {
        let build = self.job.lock().expect("run control").build.take();
        drop(build);
    }

    /// The run's supervisor started.
    pub(crate) fn started(&self, handle: drover_exec::JobHandle) {
        let mut held = self.job.lock().expect("run control");
        if held.suspended {
            if let Err(e) = handle.suspend() {
                tracing::warn!("cannot suspend a run: {e}");
            }
            if let Some((_, grant)) = &mut held.build {
                grant.take();
            }
        }
        held.handle = Some(handle);
    }
}

impl Shared {
    fn runs_dir(&self) -> PathBuf {
        self.config.dir.join("runs")
    }

    /// Whether the run is running here, or ended here and its logs are kept.
    fn knows_run(&self, run: u64) -> bool {
        self.runs.lock().expect("runs").contains_key(&run) || self.kept.lock().expect("kept").contains(&run)
    }

    fn coordinator(&self, path: &str) -> String {
        format!("{}{path}", self.config.coordinator.trim_end_matches('/'))
    }
}

/// A running worker.
#[derive(Debug)]
pub struct Worker {
    url: String,
    shared: Arc<Shared>,
    tasks: tokio::task::JoinSet<()>,
    /// Held while the worker lives: one worker per directory.
    _lock: std::fs::File,
}

impl Worker {
    /// The URL it serves artifacts and logs at.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its ID once the coordinator has taken its registration (waiting
    /// for that: the coordinator may be down, or not there yet).
    pub fn joined(&self) -> impl std::future::Future<Output = u64> + Send + 'static {
        let mut joined = self.shared.joined.subscribe();
        async move {
            let id = joined.wait_for(Option::is_some).await.map(|id| *id);
            // The sender lives as long as the worker.
            id.ok().flatten().unwrap_or_default()
        }
    }

    /// Whether the coordinator has taken its registration yet.
    pub fn has_joined(&self) -> bool {
        self.shared.joined.borrow().is_some()
    }

    /// Runs until the worker's tasks end. They end on their own only when
    /// the coordinator refuses the worker's first registration for a reason
    /// that retrying cannot fix, which this returns.
    pub async fn wait(&mut self) -> Result<(), WorkerError> {
        while self.tasks.join_next().await.is_some() {
            if let Some(why) = self.shared.refused.lock().expect("refused").take() {
                return Err(WorkerError::Refused(why));
            }
        }
        Ok(())
    }

    /// Lets the runs in progress finish and takes nothing new: tells the
    /// coordinator the worker drains (in the background, retried, and again
    /// after any new registration), and returns once no run is left, every
    /// end has been reported and every new output pushed to the shared
    /// cache, or [`REPORT_GRACE`] after the last run ended if that has not
    /// happened by then (the coordinator may be down): a warning says how
    /// many ends were not reported and how many outputs not pushed. Then
    /// [`Worker::leave`] (which a second stop request may also call sooner,
    /// dropping this future).
    pub async fn drain(&self) {
        let (unreported, unpushed) = self.drain_with_grace(REPORT_GRACE).await;
        if unreported > 0 {
            tracing::warn!(
                "leaving with {unreported} finished run(s) not reported: the coordinator took no report for {}s. \
                 It will count those runs as lost with this worker and queue their jobs again (reports are kept \
                 in memory only; the outputs stay in this worker's cache)",
                REPORT_GRACE.as_secs()
            );
        }
        if unpushed > 0 {
            tracing::warn!(
                "leaving with {unpushed} output(s) not pushed to the shared cache within {}s: they stay in this \
                 worker's cache, for when it comes back",
                REPORT_GRACE.as_secs()
            );
        }
    }

    /// [`Worker::drain`], giving the reports and pushes `grace` once the
    /// runs have ended; returns how many run ends were still undelivered
    /// and how many outputs were still being pushed then (0 and 0: all
    /// done).
    async fn drain_with_grace(&self, grace: Duration) -> (usize, usize) {
        // The flag first: a registration that sets its session after this
        // reads it and says so itself (see `session::run`).
        self.shared.draining.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(id) = *self.shared.outbox.session.borrow() {
            let shared = self.shared.clone();
            tokio::spawn(async move { session::drain(&shared, id).await });
        }
        // However long the runs take (`--drain-timeout` or a second stop
        // request drops this sooner). A run's end is in the outbox before
        // the run leaves `runs` (`job::run`).
        let idle = || self.shared.runs.lock().expect("runs").is_empty();
        loop {
            while !idle() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A run may still come (a coordinator that restarted assigns
            // before it hears again that the worker drains): it is waited
            // for too, and the grace starts again after it.
            let deadline = tokio::time::Instant::now() + grace;
            while idle() {
                let unreported = self.shared.outbox.undelivered_runs().len();
                let unpushed = self.shared.pushing.load(std::sync::atomic::Ordering::SeqCst);
                if (unreported == 0 && unpushed == 0) || tokio::time::Instant::now() >= deadline {
                    return (unreported, unpushed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Shuts the worker down and tells the coordinator, so that its runs go
    /// back to the queues now rather than when its lease runs out. It stops
    /// polling, reporting and serving, cancels its runs (their processes
    /// get SIGTERM, then SIGKILL after the kill grace) and waits for them to
    /// end, a little longer than the grace at most, so that no process of
    /// a run is left when another worker starts it; then it leaves. Best
    /// effort: if the coordinator cannot be reached, it finds out from the
    /// lease, as for a worker that died.
    pub async fn leave(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let runs = {
            let runs = self.shared.runs.lock().expect("runs");
            runs.values().for_each(|control| control.cancel.cancel());
            runs.len()
        };
        let deadline = tokio::time::Instant::now() + self.shared.config.kill_grace + Duration::from_secs(2);
        while !self.shared.runs.lock().expect("runs").is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The worker started again on this directory serves them.
        job::save_logs(&self.shared);
        let Some(id) = *self.shared.outbox.session.borrow() else { return };
        let url = self.shared.coordinator(&format!("/v1/workers/{id}/leave"));
        match tokio::time::timeout(Duration::from_secs(5), self.shared.http.post(&url)).await {
            Ok(Ok(())) => tracing::info!(worker = id, runs, "left the cluster"),
            Ok(Err(e)) => tracing::warn!("could not tell the coordinator this worker leaves: {e}"),
            Err(_) => tracing::warn!("the coordinator did not answer this worker's leaving in time"),
        }
    }
}

/// Takes the directory's lock file: a second worker on the same cache would
/// delete the first one's run directories (their working directories).
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, WorkerError> {
    match drover_cas::try_lock_dir(dir) {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(WorkerError::Busy(dir.display().to_string())),
        Err(source) => Err(WorkerError::Dir { path: dir.join("LOCK").display().to_string(), source }),
    }
}

/// The token pools of a worker's stages: its fetchers, builders, pushers
/// and named tokens.
fn pools(config: &WorkerConfig) -> tokens::Pools {
    use tokens::Token;
    // `cache` stays unlimited here: every stage uses the cache, and the
    // count a worker advertises for it only limits jobs in the core.
    let mut limits: BTreeMap<Token, u64> = config
        .capacity
        .tokens
        .iter()
        .filter(|(name, _)| name.as_str() != tokens::CACHE)
        .map(|(name, n)| (Token::Named(name.clone()), *n))
        .collect();
    let builders = config.builders.clamp(1, config.capacity.slots.max(1) as usize);
    limits.insert(Token::Download, config.fetchers.max(1) as u64);
    limits.insert(Token::Process, builders as u64);
    limits.insert(Token::Upload, config.pushers.max(1) as u64);
    tokens::Pools::new(limits)
}

/// Opens the cache, starts serving and joins the cluster.
pub async fn start(mut config: WorkerConfig) -> Result<Worker, WorkerError> {
    let dir_err = |path: &PathBuf| {
        let path = path.display().to_string();
        move |source| WorkerError::Dir { path, source }
    };
    // Paths handed to jobs must not depend on their working directory.
    config.dir = std::path::absolute(&config.dir).map_err(dir_err(&config.dir))?;
    std::fs::create_dir_all(&config.dir).map_err(dir_err(&config.dir))?;
    let lock = lock_dir(&config.dir)?;
    let runs = config.dir.join("runs");
    std::fs::create_dir_all(&runs).map_err(dir_err(&runs))?;
    // The logs of an earlier life's runs stay (under their run IDs, which
    // the coordinator never gives twice); what those runs left going goes.
    let kept = job::earlier_runs(&runs, config.keep_runs).map_err(dir_err(&runs))?;
    let cas = Arc::new(Cas::open_with(&config.dir.join("cache"), config.cache_bytes, config.durability)?);
    cas.make_fan_outs()?;
    cas.keep_free(config.cache_keep_free);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| WorkerError::Listen { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| WorkerError::Listen { addr: config.listen, source })?;
    let url = config.advertise.clone().unwrap_or_else(|| format!("http://{addr}"));
    let name = config.name.clone().unwrap_or_else(|| default_name(addr.port()));
    let shared = Arc::new(Shared {
        http: match &config.coordinator_router {
            Some(router) => Http::new(config.token.clone(), Duration::from_secs(30))
                .with_local(&config.coordinator, router.clone()),
            None => Http::new(config.token.clone(), Duration::from_secs(30)),
        },
        url: url.clone(),
        name,
        cas,
        runs: Mutex::new(BTreeMap::new()),
        outbox: report::Outbox::default(),
        kept_file: Mutex::new(job::KeptFile::open(&runs, &kept)),
        kept: Mutex::new(kept),
        notes: Mutex::new(BTreeMap::new()),
        fetching: Mutex::new(BTreeSet::new()),
        fetched: tokio::sync::Notify::new(),
        tokens: tokens::Arbiter::new(pools(&config)),
        draining: std::sync::atomic::AtomicBool::new(false),
        pushing: std::sync::atomic::AtomicUsize::new(0),
        empty_dirs: job::DirPool::empty(),
        tmp_dirs: job::DirPool::tmp(),
        refused: Mutex::new(None),
        readers: Mutex::new(None),
        joined: tokio::sync::watch::Sender::new(None),
        config,
    });
    let mut tasks = tokio::task::JoinSet::new();
    let router = server::router(shared.clone());
    tasks.spawn(async move {
        drover_http::serve(listener, router, drover_http::HEADER_TIMEOUT).await;
    });
    tasks.spawn(session::run(shared.clone()));
    tasks.spawn(report::run(shared.clone()));
    tracing::info!(%url, "worker listening");
    Ok(Worker { url, shared, tasks, _lock: lock })
}

/// A worker's name when none is given: `worker-HOST-PORT`, so that workers
/// on different machines listening on the same port do not share one
/// (`worker-PORT` without a host name to read).
fn default_name(port: u16) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String =
        host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || "-._".contains(*c)).collect();
    if host.is_empty() { format!("worker-{port}") } else { format!("worker-{host}-{port}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker whose coordinator is not there (nothing listens at its
    /// address), its cache in `dir`.
    fn orphan(dir: &std::path::Path) -> WorkerConfig {
        // Taken and given back: connecting to it is refused at once.
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        WorkerConfig {
            coordinator: format!("http://127.0.0.1:{port}"),
            coordinator_router: None,
            listen: ([127, 0, 0, 1], 0).into(),
            advertise: None,
            name: Some("orphan".into()),
            capacity: WorkerCapacity { slots: 1, cpu_millis: 1000, memory: 1 << 30, tokens: BTreeMap::new() },
            labels: BTreeMap::new(),
            dir: dir.to_owned(),
            cache_bytes: 1 << 20,
            cache_keep_free: drover_cas::Reserve::Nothing,
            durability: drover_cas::Durability::ProcessCrash,
            token: None,
            // Never started: no run comes.
            supervisor: Supervisor::new("/nonexistent".into(), Vec::new()),
            kill_grace: Duration::from_secs(1),
            keep_runs: 10,
            log_limit: None,
            push: false,
            fetchers: 1,
            builders: 1,
            pushers: 1,
        }
    }

    /// A worker that leaves and starts again on its directory knows the
    /// runs whose logs it kept, also those that wrote no file (their stage
    /// logs were in memory, or they wrote nothing), and serves the same
    /// logs; a new run under a known ID (a coordinator that lost its state
    /// numbers runs from 1 again) starts with logs of its own.
    #[tokio::test]
    async fn a_worker_started_again_keeps_the_logs_of_its_earlier_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let worker = start(orphan(dir.path())).await.expect("start");
        fn push(shared: &Shared, run: u64) -> job::StageLog<'_> {
            job::StageLog { shared, run, stage: tokens::Stage::Push }
        }
        {
            let shared = &worker.shared;
            // As if runs 4 (silent) and 5 (pushed its output) had ended.
            shared.kept.lock().expect("kept").extend([4, 5]);
            push(shared, 5).line("pushed 5 to the shared cache");
        }
        let stdout = dir.path().join("runs/5/stdout.log");
        std::fs::create_dir_all(stdout.parent().expect("run directory")).expect("mkdir");
        std::fs::write(&stdout, "five\n").expect("log");
        worker.leave().await;

        let worker = start(orphan(dir.path())).await.expect("start again");
        let shared = &worker.shared;
        assert!(shared.knows_run(4) && shared.knows_run(5) && !shared.knows_run(6));
        assert_eq!(push(shared, 5).read(0, usize::MAX).expect("read"), b"pushed 5 to the shared cache\n");
        assert_eq!(std::fs::read_to_string(&stdout).expect("log"), "five\n");
        job::forget_logs(shared, 5);
        assert!(!shared.knows_run(5) && !stdout.exists(), "a new run 5's logs start empty");
        assert_eq!(push(shared, 5).read(0, usize::MAX).expect("read"), b"");
        worker.leave().await;
    }

    /// A drain whose runs have ended but whose coordinator never takes
    /// their ends gives up after its grace, and says how many it could not
    /// report.
    #[tokio::test]
    async fn a_drain_gives_up_on_reports_the_coordinator_never_takes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let worker = start(orphan(dir.path())).await.expect("start");
        // As if a session had begun and a run had ended since the
        // coordinator went away.
        worker.shared.outbox.set_session(Some(1));
        worker.shared.outbox.finished(report::ended(7));
        assert_eq!(worker.drain_with_grace(Duration::from_millis(300)).await, (1, 0));
        assert_eq!(
            worker.shared.outbox.undelivered_runs(),
            [7],
            "kept, not dropped, until the worker leaves"
        );
        worker.leave().await;
    }

    /// A drain waits for the outputs on their way to the shared cache, and
    /// past its grace says how many did not get there.
    #[tokio::test]
    async fn a_drain_waits_for_outputs_being_pushed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let worker = start(orphan(dir.path())).await.expect("start");
        assert_eq!(worker.drain_with_grace(Duration::from_secs(60)).await, (0, 0), "nothing to wait for");
        let pushing = job::Pushing::new(&worker.shared);
        assert_eq!(worker.drain_with_grace(Duration::from_millis(300)).await, (0, 1));
        drop(pushing);
        assert_eq!(worker.drain_with_grace(Duration::from_secs(60)).await, (0, 0));
        worker.leave().await;
    }
}
