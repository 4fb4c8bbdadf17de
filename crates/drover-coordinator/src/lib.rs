//! drover's coordinator: the thin async shell around the solver.
//!
//! [`start`] recovers the state from the input log in the data directory,
//! starts the state thread ([`state`]) and serves the HTTP API ([`api`]) on
//! one port. Everything listens on loopback unless told otherwise; with a
//! token configured, every request must present it (workers may have a
//! token of their own: see [`api::Tokens`]).

mod api;
mod checks;
mod journal;
mod metrics;
mod snapshots;
mod specs;
mod state;
mod watchdog;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use checks::with_content_ids;
use drover_cas::Cas;
use drover_http::Http;
use drover_solver::{Input, Solver};
pub use drover_store::Durability;
use drover_store::Store;
pub use snapshots::SNAPSHOT_AFTER;

/// How to run a coordinator.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// Where the state log and uploaded sources live.
    pub data_dir: PathBuf,
    /// Required from every client, if set; from every worker too unless
    /// `worker_token` is set.
    pub token: Option<String>,
    /// Required from workers instead of `token`, if set: clients then
    /// cannot act as workers (register, take runs, report results, push
    /// outputs to the shared cache).
    pub worker_token: Option<String>,
    /// The scheduling core's settings.
    pub core: drover_core::Config,
    /// Size bound of the uploaded-source store (least recently used files are
    /// dropped beyond it).
    pub source_cache_bytes: u64,
    /// Largest single uploaded file.
    pub max_blob: u64,
    /// Size bound of the shared artifact cache that workers push outputs
    /// to and pull them from (least recently used outputs are dropped).
    pub artifact_cache_bytes: u64,
    /// Room the source and shared caches keep free on their filesystem
    /// (see [`drover_cas::Cas::keep_free`]).
    pub cache_keep_free: drover_cas::Reserve,
    /// What a recorded input survives (default: a crash of the process).
    pub durability: Durability,
    /// How many finished builds the coordinator keeps, their status and
    /// events (default [`KEEP_FINISHED_BUILDS`]; `None`: all, and memory
    /// grows with the history). Older finished builds are forgotten.
    pub keep_finished_builds: Option<u64>,
    /// How long a client may take to send a request's headers before its
    /// connection is closed (default [`drover_http::HEADER_TIMEOUT`]).
    pub header_timeout: std::time::Duration,
    /// How long an upload (a source, a pushed output) may go without a byte
    /// before it is refused (default [`UPLOAD_IDLE`]).
    pub upload_idle: std::time::Duration,
    /// Bytes of recorded inputs after which the state is written down and
    /// the log behind it dropped (default [`SNAPSHOT_AFTER`]; at least the
    /// size of the last snapshot; `None`: never, and the log grows with
    /// every input).
    pub snapshot_after: Option<u64>,
}

/// The default of [`CoordinatorConfig::upload_idle`].
pub const UPLOAD_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The default of [`CoordinatorConfig::keep_finished_builds`].
pub const KEEP_FINISHED_BUILDS: u64 = 1_000;

impl CoordinatorConfig {
    /// Defaults: loopback port 7700, data in `./.drover/coordinator`.
    pub fn new(data_dir: PathBuf) -> CoordinatorConfig {
        CoordinatorConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            data_dir,
            token: None,
            worker_token: None,
            core: drover_core::Config { lease_timeout: drover_core::Millis(15_000), ..Default::default() },
            source_cache_bytes: 20 << 30,
            max_blob: 4 << 30,
            artifact_cache_bytes: 10 << 30,
            cache_keep_free: drover_cas::DEFAULT_KEEP_FREE,
            durability: Durability::default(),
            keep_finished_builds: Some(KEEP_FINISHED_BUILDS),
            header_timeout: drover_http::HEADER_TIMEOUT,
            upload_idle: UPLOAD_IDLE,
            snapshot_after: Some(SNAPSHOT_AFTER),
        }
    }
}

/// Why the coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The data directory is unusable.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another coordinator uses the data directory.
    #[error("data directory {0} is in use by another coordinator (one coordinator per directory)")]
    Busy(String),
    /// The state log failed.
    #[error(transparent)]
    Store(#[from] drover_store::StoreError),
    /// The coordinator stopped while serving.
    #[error("the coordinator stopped: it {0}")]
    Stopped(String),
    /// The snapshot the log begins with cannot be read.
    #[error(
        "cannot read the snapshot of the state (the log's first {seq} inputs) in the data directory: {why}. Start the drover that wrote it, or start this one on a new data directory"
    )]
    Snapshot {
        /// The last input it holds.
        seq: u64,
        /// Why.
        why: String,
    },
    /// The configured settings cannot apply to the recovered state.
    #[error(
        "the scheduler's settings changed since the state was written down, and {0}: start the coordinator with the settings it had, wait until those jobs are over (`drover status`), then start it with the new ones"
    )]
    Settings(String),
    /// The store of sources or the shared cache of outputs failed to open.
    #[error("store: {0}")]
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
}

impl CoordinatorError {
    /// Whether the data directory holds a state that this coordinator
    /// cannot take up as it is configured, though the directory itself is
    /// fine: a snapshot or database written by another version of drover,
    /// or recovered jobs that the configured settings cannot apply to. The
    /// same coordinator starts on a new data directory.
    pub fn is_foreign_state(&self) -> bool {
        matches!(
            self,
            CoordinatorError::Snapshot { .. }
                | CoordinatorError::Settings(_)
                | CoordinatorError::Store(drover_store::StoreError::TooNew { .. })
        )
    }
}

/// A running coordinator.
#[derive(Debug)]
pub struct Coordinator {
    addr: SocketAddr,
    /// The API, also served in process (see [`Coordinator::router`]).
    router: axum::Router,
    server: tokio::task::JoinHandle<()>,
    /// Why its state thread stopped for good, once it did.
    failed: tokio::sync::watch::Receiver<Option<String>>,
    /// Held while the coordinator lives: one coordinator per data directory.
    _lock: std::fs::File,
}

/// Dropping the coordinator stops its server: an embedded cluster that ends
/// leaves no listener behind it. (Its state thread stays, idle.)
impl Drop for Coordinator {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Coordinator {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its API as a router, for clients in the same process (see
    /// `drover_http::Http::with_local`): the same handlers as over the
    /// socket.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves until the server stops (it does not stop on its own), or
    /// until the coordinator cannot go on: it can no longer record its
    /// state (a full disk), and every request would be refused. The process
    /// should then end, for a supervisor to start it again once the cause
    /// is gone (the state recorded so far is whole).
    pub async fn wait(mut self) -> Result<(), CoordinatorError> {
        tokio::select! {
            _ = &mut self.server => Ok(()),
            failed = self.failed.wait_for(Option::is_some) => match failed {
                Ok(why) => Err(CoordinatorError::Stopped(why.clone().unwrap_or_default())),
                Err(_) => std::future::pending().await,
            },
        }
    }
}

/// Takes the data directory's lock file, so that two coordinators never
/// append to the same log.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, CoordinatorError> {
    match drover_cas::try_lock_dir(dir) {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(CoordinatorError::Busy(dir.display().to_string())),
        Err(source) => {
            Err(CoordinatorError::DataDir { path: dir.join("LOCK").display().to_string(), source })
        }
    }
}

/// Recovers the state and starts serving.
pub async fn start(config: CoordinatorConfig) -> Result<Coordinator, CoordinatorError> {
    let dir_err = |source| CoordinatorError::DataDir { path: config.data_dir.display().to_string(), source };
    std::fs::create_dir_all(&config.data_dir).map_err(dir_err)?;
    let lock = lock_dir(&config.data_dir)?;
    let store = Store::open_with(&config.data_dir.join("state.db"), config.durability)?;
    let blobs = Arc::new(Cas::open(&config.data_dir.join("sources"), config.source_cache_bytes)?);
    let cache = Arc::new(Cas::open(&config.data_dir.join("cache"), config.artifact_cache_bytes)?);
    blobs.keep_free(config.cache_keep_free);
    cache.keep_free(config.cache_keep_free);
    let snapshots = snapshots::Snapshots::new(config.data_dir.clone(), config.snapshot_after);
    let shared = state::start(store, Solver::new(config.core.clone()), snapshots)?;
    tokio::spawn(watchdog::run(Arc::downgrade(&shared)));
    // The setting is an input: a replay forgets the same builds at the same
    // points, whatever the setting is now.
    let keep = config.keep_finished_builds;
    if shared.query(Solver::keep_finished).await.is_ok_and(|kept| kept != keep) {
        let _ = shared.input(Input::KeepFinished { builds: keep }).await;
    }
    // The specs of the latest builds (replayed), so that a build submitted
    // again after a restart, as every `drover run` is, is still recorded
    // by reference (at most about 64 MiB of JSON to encode, off the async
    // threads).
    let specs = Arc::new(specs::SpecCache::default());
    let recent = shared.query(Solver::recent_specs).await.unwrap_or_default();
    let seeding = specs.clone();
    let _ = tokio::task::spawn_blocking(move || seeding.seed(recent)).await;
    let failed = shared.failed.subscribe();
    let app = api::App {
        shared,
        blobs,
        cache,
        // The coordinator asks workers for logs as a worker would.
        http: Http::new(config.worker_token.clone().or(config.token.clone()), Duration::from_secs(30)),
        tokens: api::Tokens::new(config.token.clone(), config.worker_token.clone()),
        max_blob: config.max_blob,
        specs,
        renew_every: Duration::from_millis((config.core.lease_timeout.0 / 10).max(50)),
        uploads: Arc::new(tokio::sync::Semaphore::new(api::MAX_UPLOADS)),
        json_room: Arc::new(tokio::sync::Semaphore::new(api::JSON_IN_FLIGHT_MIB)),
        upload_idle: config.upload_idle,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| CoordinatorError::Listen { addr: config.listen, source })?;
    let addr =
        listener.local_addr().map_err(|source| CoordinatorError::Listen { addr: config.listen, source })?;
    let router = api::router(app);
    let served = router.clone();
    let server = tokio::spawn(async move {
        drover_http::serve(listener, served, config.header_timeout).await;
    });
    tracing::info!(%addr, "coordinator listening");
    Ok(Coordinator { addr, router, server, failed, _lock: lock })
}
