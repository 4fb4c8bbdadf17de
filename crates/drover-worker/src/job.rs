//! One assignment, from receipt to report, in stages (each under its
//! tokens, see [`crate::tokens`]): answer from the local cache if the output
//! is already here; **pull** it from the shared cache if the coordinator
//! says it holds it; otherwise **fetch** (the job's sources from the
//! coordinator, its dependencies' artifacts from a peer that holds them),
//! **build** (run the commands under a supervisor and commit `{{out}}` as
//! the job's artifact), and in the background **push** the new output to
//! the shared cache.
//!
//! A run directory is `runs/<run>/` with `src/` (the job's read-only view of
//! the sources, also its working directory), `stdout.log` and `stderr.log`
//! (the build stage's log), and `pull.log`, `fetch.log`, `push.log` (what
//! the worker did in those stages: what moved, from where, how fast, what
//! failed). Each part exists only if needed: `src/` for a job with sources
//! (a job without takes a read-only `runs/empty-N/` no other run is in, see
//! [`DirPool`]), `TMPDIR` (a `runs/tmp-N/` of its own while it runs, unless
//! its environment sets one), each command log once the job writes to it (the
//! supervisor creates it, and the directory, on the first byte), each stage
//! log once its lines pass 4 KiB (the worker holds fewer in memory, see
//! [`StageLog`]), so a job that has no source and prints nothing touches no
//! directory, even when its output is pushed. `src/` is removed when the
//! run ends; the logs stay for the most recent runs, also across a restart
//! of the worker (see [`earlier_runs`]). Likewise a job whose commands never mention `{{out}}`
//! gets no output directory: its output is the empty tree, committed
//! without one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_cas::{ArtifactGuard, Key};
use drover_exec::{JobSpec, Outcome};
use drover_http::HttpError;
use drover_proto::{Assignment, DepInput, Hash32, HeldArtifact, RunResult, SourceFile};
use futures::StreamExt;

use crate::tokens::{Grant, Request, Stage};
use crate::{RunControl, Shared};

/// How much of a failed job's standard error (or output) goes into its report.
const LOG_TAIL: usize = 2048;

/// How long a fetch waits before trying again the holders whose failure
/// may pass (see `worth_retrying`).
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Runs one assignment and reports it.
pub(crate) async fn run(shared: Arc<Shared>, assignment: Assignment, control: RunControl) {
    let run = assignment.run;
    forget_logs(&shared, run);
    shared.outbox.started(run);
    tracing::info!(run, job = %assignment.name, attempt = assignment.attempt, "run started");
    let start = Instant::now();
    let cancel = &control.cancel;
    let result = execute(&shared, &assignment, &control).await;
    let duration_ms = start.elapsed().as_millis() as u64;
    // Failed before its commands ran, or could not start them: perhaps
    // for a fault of the worker's own (below).
    let before_commands = result.is_err() || control.failed_to_spawn();
    let (mut result, output) = match result {
        Ok((mut result, output)) => {
            result.duration_ms = duration_ms;
            (result, output)
        }
        Err(detail) => (
            RunResult {
                run,
                success: false,
                exit_code: None,
                cached: false,
                detail: if cancel.is_cancelled() { "cancelled".into() } else { detail },
                output: None,
                duration_ms,
                stages: Default::default(),
                lost_inputs: control.take_lost_inputs(),
                worker_fault: false,
            },
            None,
        ),
    };
    // Its supervisor killed under it (the OOM killer, an operator), or an
    // input too large for this worker's cache: the run goes back to the
    // queue, as for a lost worker, to run again (elsewhere, if it must).
    if control.failed_by_worker() && !cancel.is_cancelled() {
        tracing::warn!(
            run,
            job = %assignment.name,
            detail = %one_line(&result.detail),
            "this worker failed the run, not the job: it goes back to the queue"
        );
        result.worker_fault = true;
    }
    // A failure may be the worker's own: a disk that no longer takes a
    // write (full, or the cache directory removed under it) fails every
    // job it is given, and a worker that fails jobs fastest takes the most.
    // Such a run goes back to the queue, and the worker takes nothing new.
    if before_commands && !cancel.is_cancelled() {
        let probe = shared.clone();
        let disk = tokio::task::spawn_blocking(move || disk_fault(&probe)).await.unwrap_or(Disk::Fine);
        if let Disk::Freed(fault) = &disk {
            tracing::warn!(
                run,
                job = %assignment.name,
                "this worker's disk was full ({fault}) and takes writes again (its cache made what room it \
                 could): the run goes back to the queue"
            );
            result.worker_fault = true;
            result.detail = format!("the worker's disk was full ({fault}); {}", result.detail);
        }
        if let Disk::Broken(fault) = &disk {
            tracing::error!(
                run,
                job = %assignment.name,
                "this worker cannot write its own disk ({fault}): the run goes back to the queue, and the \
                 worker takes no new job (it drains); free the disk, then restart the worker"
            );
            result.worker_fault = true;
            result.detail = format!("the worker cannot write its own disk ({fault}); {}", result.detail);
            // Draining before the run's end is reported, so that the
            // coordinator does not hand the job straight back to this worker
            // (a coordinator that does not answer in time hears it later).
            let session = *shared.outbox.session.borrow();
            if !shared.draining.swap(true, std::sync::atomic::Ordering::SeqCst)
                && let Some(id) = session
            {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), crate::session::drain(&shared, id)).await;
            }
        }
    }
    if result.success {
        tracing::info!(run, job = %assignment.name, cached = result.cached, ms = result.duration_ms, "run succeeded");
        // Push stage: a new output goes to the coordinator's shared cache in
        // the background, so a slow push never holds a slot. It stays
        // pinned until it is pushed: in a busy or small cache, the next
        // commit would evict it first (the others are pinned, or older).
        if let Some(output) = output
            && shared.config.push
        {
            let pushing = Pushing::new(&shared);
            let shared = shared.clone();
            tokio::spawn(async move {
                push(shared, output, run).await;
                drop(pushing);
            });
        }
    } else {
        tracing::info!(run, job = %assignment.name, detail = %one_line(&result.detail), "run failed");
    }
    // Kept before it stops running, so its logs are never unknown.
    let old = keep_logs(&shared, run);
    // In the outbox before it stops running, so that a drain never sees it
    // in neither (`Worker::drain`).
    shared.outbox.finished(result);
    shared.runs.lock().expect("runs").remove(&run);
    for run in old {
        let mut notes = shared.notes.lock().expect("notes");
        for stage in [Stage::Pull, Stage::Fetch, Stage::Push] {
            notes.remove(&(run, stage.name()));
        }
        drop(notes);
        let _ = remove_tree(&shared.runs_dir().join(run.to_string()));
    }
}

/// What [`disk_fault`] found.
enum Disk {
    /// Writes go through.
    Fine,
    /// A write failed (for this reason), and went through once the cache
    /// made room (evicting outputs for the room it keeps free).
    Freed(String),
    /// Writes fail, room or not (for this reason).
    Broken(String),
}

/// Whether the worker's own disk refuses a write, and why: a small file
/// written and removed where runs and the cache write (`runs/`, the
/// cache's temporary directory); if that fails, again once the cache made
/// what room it can and a second passed (a disk another run filled for a
/// moment, and whose files are being removed, is no fault of the
/// worker's).
fn disk_fault(shared: &Shared) -> Disk {
    let probe = || {
        for dir in [shared.runs_dir(), shared.cas.dir().join("tmp")] {
            let file = dir.join(format!(".probe-{}", std::process::id()));
            let written = std::fs::write(&file, [0u8; 4096]);
            let _ = std::fs::remove_file(&file);
            if let Err(e) = written {
                let full = matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded);
                return Some((format!("{}: {e}", dir.display()), full));
            }
        }
        None
    };
    let Some((fault, full)) = probe() else { return Disk::Fine };
    // A full disk: the cache may make room (the outputs it holds for the
    // room it keeps free, which only commits evicted so far).
    if full {
        shared.cas.make_room();
    }
    std::thread::sleep(Duration::from_secs(1));
    match probe() {
        None if full => Disk::Freed(fault),
        None => Disk::Fine,
        Some((fault, _)) => Disk::Broken(fault),
    }
}

/// Bytes of a stage's log held in memory before they go to its file.
const NOTES_IN_MEMORY: usize = 4096;

/// A stage's log (pull, fetch or push): its lines are held in memory (see
/// `Shared::notes`) until they pass [`NOTES_IN_MEMORY`] bytes, then
/// appended to `runs/<run>/<stage>.log`, so the log is the file followed by
/// what memory holds. A stage that says a line or two (a push's "pushed
/// …") creates no directory or file: on some file systems those cost more
/// than a trivial job. Lines of a run whose logs are no longer kept are
/// dropped.
pub(crate) struct StageLog<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) run: u64,
    pub(crate) stage: Stage,
}

impl StageLog<'_> {
    pub(crate) fn line(&self, text: impl std::fmt::Display) {
        if !self.shared.knows_run(self.run) {
            return;
        }
        let mut notes = self.shared.notes.lock().expect("notes");
        let held = notes.entry((self.run, self.stage.name())).or_default();
        hold(held, &self.path(), format_args!("{text}"));
    }

    fn path(&self) -> PathBuf {
        self.shared.runs_dir().join(self.run.to_string()).join(format!("{}.log", self.stage.name()))
    }

    /// The log from byte `from` on, at most `max` bytes (read under the
    /// lock that moves lines from memory to the file, so nothing is seen
    /// twice or missed).
    pub(crate) fn read(&self, from: u64, max: usize) -> io::Result<Vec<u8>> {
        let notes = self.shared.notes.lock().expect("notes");
        let held = notes.get(&(self.run, self.stage.name())).map_or(&[][..], Vec::as_slice);
        read_held(&self.path(), held, from, max)
    }
}

/// Adds a line to a stage log's bytes in memory; past [`NOTES_IN_MEMORY`]
/// they are appended to its file at `path` (made with its directory if
/// need be). A line that cannot be written is dropped with a warning.
fn hold(held: &mut Vec<u8>, path: &Path, text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(held, "{text}");
    if held.len() > NOTES_IN_MEMORY {
        spill(held, path);
    }
}

/// Appends a stage log's bytes in memory to its file at `path` (made with
/// its directory if need be) and empties them; bytes that cannot be
/// written are dropped with a warning.
fn spill(held: &mut Vec<u8>, path: &Path) {
    use std::io::Write;
    let written = std::fs::create_dir_all(path.parent().unwrap_or(path))
        .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(held));
    if let Err(e) = written {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
    held.clear();
}

/// Bytes `from` on (at most `max`) of a stage log: its file at `path` (if
/// any), then `held`.
fn read_held(path: &Path, held: &[u8], from: u64, max: usize) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let mut out = Vec::new();
    let mut in_file = 0;
    match std::fs::File::open(path) {
        Ok(mut file) => {
            in_file = file.metadata()?.len();
            if from < in_file {
                file.seek(io::SeekFrom::Start(from))?;
                file.take(max as u64).read_to_end(&mut out)?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let start = usize::try_from(from.saturating_sub(in_file)).unwrap_or(usize::MAX).min(held.len());
    let end = held.len().min(start.saturating_add(max - out.len()));
    out.extend_from_slice(&held[start..end]);
    Ok(out)
}

/// Milliseconds since `since`.
fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// "12.3 MB in 45 ms (273 MB/s)".
fn rate(bytes: u64, since: Instant) -> String {
    let secs = since.elapsed().as_secs_f64().max(1e-6);
    format!("{bytes} bytes in {} ms ({:.1} MB/s)", ms(since), bytes as f64 / secs / 1e6)
}

/// Enters a stage: waits for its tokens (telling the coordinator while it
/// waits), unless the run is cancelled first. Returns the grant and the
/// milliseconds it waited.
async fn enter(
    shared: &Shared,
    run: u64,
    control: &RunControl,
    request: Request,
) -> Result<(Grant, u64), String> {
    let stage = request.stage.name();
    let asked = Instant::now();
    let acquired = tokio::select! {
        grant = shared.tokens.acquire(request, || shared.outbox.stage(run, stage, true)) => grant,
        () = control.cancel.cancelled() => return Err("cancelled".into()),
    };
    let grant = acquired.map_err(|e| format!("cannot run the {stage} stage on this worker: {e}"))?;
    shared.outbox.stage(run, stage, false);
    Ok((grant, ms(asked)))
}

/// An output on its way to the shared cache, counted in `Shared::pushing`
/// from before its push is spawned until it ends (or is dropped).
pub(crate) struct Pushing(Arc<Shared>);

impl Pushing {
    pub(crate) fn new(shared: &Arc<Shared>) -> Pushing {
        shared.pushing.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Pushing(shared.clone())
    }
}

impl Drop for Pushing {
    fn drop(&mut self) {
        self.0.pushing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Push stage: sends an output to the coordinator's shared cache (`PUT
/// /v1/cache/{job}`, the pack format, streamed), holding its pin until it
/// is sent. A push that fails for a reason that may pass (the coordinator
/// restarting or unreachable, a broken connection, a 5xx answer) is tried
/// again, after pauses doubling from a second to a minute, for up to
/// [`PUSH_RETRIES_FOR`]: an output that never reached the shared cache is
/// built again once its worker is gone. Other failures are logged.
async fn push(shared: Arc<Shared>, output: ArtifactGuard, run: u64) {
    let log = StageLog { shared: &shared, run, stage: Stage::Push };
    let job = Hash32(output.key().0);
    let until = Instant::now() + PUSH_RETRIES_FOR;
    let mut pause = Duration::from_secs(1);
    loop {
        let Ok(grant) = shared.tokens.acquire(Request::stage(Stage::Push), || {}).await else { return };
        let started = Instant::now();
        let (failed, again) = match push_once(&shared, &output, job, run).await {
            Ok(info) => {
                tracing::debug!(%job, "output pushed to the shared cache");
                log.line(format_args!("pushed {job} to the shared cache: {}", rate(info.size, started)));
                return;
            }
            Err(failure) => failure,
        };
        drop(grant);
        if !again || Instant::now() + pause > until {
            tracing::warn!(%job, "{}", one_line(&failed));
            log.line(failed);
            return;
        }
        tracing::info!(%job, "{}; trying again in {}", one_line(&failed), seconds(pause));
        log.line(format_args!("{failed}; trying again in {}", seconds(pause)));
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

/// How long a push that fails for a reason that may pass is tried again.
const PUSH_RETRIES_FOR: Duration = Duration::from_secs(600);

/// One try of [`push`]: the output's info once sent, or why not and
/// whether trying again may help.
async fn push_once(
    shared: &Arc<Shared>,
    output: &ArtifactGuard,
    job: Hash32,
    run: u64,
) -> Result<drover_cas::ArtifactInfo, (String, bool)> {
    let (reader, writer) = tokio::io::duplex(256 * 1024);
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = PackReader { inner: reader, failed: failed.clone() };
    let cas = shared.cas.clone();
    // Pinned by `output`, which outlives the packing.
    let key = *output.key();
    let packing = tokio::task::spawn_blocking(move || {
        let mut sync = tokio_util::io::SyncIoBridge::new(writer);
        let packed = cas.pack(&key, &mut sync);
        // Before the stream ends (`sync` is dropped on return).
        failed.store(packed.is_err(), std::sync::atomic::Ordering::SeqCst);
        packed
    });
    // The run that made it: the coordinator takes an output only from the
    // run it assigned the job to, or as a successful run reported it.
    let url = shared.coordinator(&format!("/v1/cache/{job}?run={run}"));
    let sent = shared.http.put_reader(&url, reader).await;
    let packed = packing.await;
    let may_pass = |e: &HttpError| match e {
        HttpError::Status { status, .. } => *status >= 500 || matches!(status, 408 | 429),
        HttpError::Connect { .. } | HttpError::Timeout { .. } => true,
        _ => false,
    };
    // The request gone, the pack fails writing to it: the request's error
    // is the cause.
    let receiver_gone = |e: &drover_cas::CasError| matches!(e, drover_cas::CasError::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe);
    let unsent = |e: HttpError| (format!("cannot push the output to the shared cache: {e}"), may_pass(&e));
    // Otherwise a failed pack breaks the request off: its error is the
    // cause.
    match (packed, sent) {
        (Ok(Ok(info)), Ok(())) => Ok(info),
        (Ok(Err(e)), Err(sent)) if receiver_gone(&e) => Err(unsent(sent)),
        (Ok(Err(e)), _) => Err((format!("cannot pack the output for the shared cache: {e}"), false)),
        (Err(e), _) => Err((format!("cannot pack the output for the shared cache: {e}"), false)),
        (Ok(Ok(_)), Err(e)) => Err(unsent(e)),
    }
}

/// The reading end of a pack that another task writes: where the writer
/// failed, the stream ends in an error rather than simply ending, so the
/// request carrying it breaks off instead of delivering a truncated pack.
struct PackReader {
    inner: tokio::io::DuplexStream,
    /// Set by the writer, before its end of the stream closes, if it failed.
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for PackReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let ended = buf.filled().len() == before && buf.remaining() > 0;
        if ended && self.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Ready(Err(io::Error::other("the output could not be packed")));
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// Fetches an artifact (pack format) from `url` into this worker's cache.
async fn get_artifact(
    shared: &Shared,
    url: &str,
    job: &Hash32,
    tree: Option<Hash32>,
) -> Result<drover_cas::ArtifactInfo, HttpError> {
    let tree = tree.map(|t| Key(t.0));
    shared.http.get_artifact(url, &shared.cas, Key(job.0), tree).await
}

/// Whether a failed fetch from a holder may succeed if tried again: the
/// holder could not be reached, the connection broke (also mid-stream, or
/// storing what came failed on this side), it timed out, or it had trouble
/// of its own (a 5xx answer). Not when it answered that it does not have
/// the artifact (or refused the request), sent bad or truncated data, the
/// artifact is too large for this cache, or storing it here panicked.
fn worth_retrying(e: &HttpError) -> bool {
    match e {
        HttpError::Connect { .. } | HttpError::Timeout { .. } => true,
        HttpError::Decode { .. } => false,
        HttpError::Status { status, .. } => *status >= 500,
        HttpError::Artifact { source, .. } => {
            !source.is_corruption() && !matches!(source, drover_cas::CasError::TooLarge { .. })
        }
        HttpError::File { .. } | HttpError::Url { .. } => false,
    }
}

fn held(job: &Hash32, info: &drover_cas::ArtifactInfo) -> HeldArtifact {
    HeldArtifact { job: *job, tree: Hash32(info.tree.0), size: info.size }
}

/// A successful result: `cached` if nothing ran (exit code 0 all the same,
/// as for a job the coordinator found cached itself).
fn succeeded(a: &Assignment, info: &drover_cas::ArtifactInfo, cached: bool) -> RunResult {
    RunResult {
        run: a.run,
        success: true,
        exit_code: Some(0),
        cached,
        detail: String::new(),
        output: Some(held(&a.job, info)),
        duration_ms: 0,
        stages: Default::default(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    }
}

/// The result of a run, with its new output (pinned) if it made one.
type Ran = (RunResult, Option<ArtifactGuard>);

/// Does the work of a run; `Err` is a failure before the commands ran.
async fn execute(shared: &Arc<Shared>, a: &Assignment, control: &RunControl) -> Result<Ran, String> {
    let key = Key(a.job.0);
    if !a.no_cache
        && let Some(guard) = shared.cas.artifact(&key)
    {
        return Ok((succeeded(a, guard.info(), true), None));
    }
    let mut stages = BTreeMap::new();
    let mut waited = 0;
    if a.pull && !a.no_cache {
        let (grant, wait) = enter(shared, a.run, control, Request::stage(Stage::Pull)).await?;
        waited += wait;
        let log = StageLog { shared, run: a.run, stage: Stage::Pull };
        let started = Instant::now();
        let url = shared.coordinator(&format!("/v1/cache/{}", a.job));
        let pulled = get_artifact(shared, &url, &a.job, None).await;
        drop(grant);
        stages.insert("pull".to_owned(), ms(started));
        match pulled {
            Ok(info) => {
                log.line(format_args!(
                    "pulled {} from the shared cache: {}",
                    a.job,
                    rate(info.size, started)
                ));
                let mut result = succeeded(a, &info, true);
                result.stages = stages;
                return Ok((result, None));
            }
            // Gone from the shared cache meanwhile, or damaged: run it.
            Err(e) => {
                let why = e.to_string();
                let why = one_line(&why);
                tracing::info!(job = %a.name, "cannot pull from the shared cache, running it: {why}");
                log.line(format_args!("cannot pull {} from the shared cache, running it: {e}", a.job));
            }
        }
    }
    let dir = shared.runs_dir().join(a.run.to_string());
    // A run without sources takes an empty directory no other run is in
    // (see `DirPool`).
    let own_src = !a.sources.is_empty();
    let src = if own_src { dir.join("src") } else { shared.empty_dirs.take(&shared.runs_dir())? };
    let result = async {
        // Fetch stage: sources and dependencies. Its tokens are taken only
        // if something must cross the network; otherwise it is skipped.
        let fetch_started = Instant::now();
        let deps = fetch(shared, a, control, &src, &mut waited).await?;
        stages.insert("fetch".to_owned(), ms(fetch_started));
        // Build stage: the commands and storing the output.
        let request = Request::build(&a.tokens, &a.exclusive);
        let (grant, wait) = enter(shared, a.run, control, request.clone()).await?;
        control.building(request, grant);
        waited += wait;
        let build_started = Instant::now();
        let result = run_commands(shared, a, &dir, &src, &deps, control).await;
        // Its tokens go back whether or not the commands succeeded.
        control.built();
        let (mut result, output) = result?;
        stages.insert("build".to_owned(), ms(build_started));
        if waited > 0 {
            stages.insert("wait".to_owned(), waited);
        }
        result.stages = stages;
        Ok((result, output))
    }
    .await;
    if own_src {
        let _ = tokio::task::spawn_blocking(move || remove_tree(&src)).await;
    } else {
        shared.empty_dirs.give_back(src);
    }
    result
}

/// Directories lent to one run at a time, kept sealed between runs so that
/// a run gives one back with one `stat` instead of a directory made and
/// removed (about 15% of a trivial job's time here): the empty, read-only
/// working directories of runs without sources (`runs/empty-N/`,
/// [`DirPool::empty`]) and the private, writable `TMPDIR` of every run
/// (`runs/tmp-N/`, [`DirPool::tmp`]). A sealed directory has its mode and
/// its modification time at [`SEALED_MTIME`]; a job that adds or removes
/// an entry (in an empty directory: as root, or after making it writable)
/// moves that time, and such a directory is removed instead of lent again;
/// so nothing a job left reaches another job.
#[derive(Debug)]
pub(crate) struct DirPool {
    /// Names are `<prefix>-N`.
    prefix: &'static str,
    /// The mode of a sealed directory.
    mode: u32,
    free: std::sync::Mutex<Vec<PathBuf>>,
    made: std::sync::atomic::AtomicU64,
}

/// The modification time of a sealed directory, in seconds after the
/// epoch.
const SEALED_MTIME: u64 = 1;

impl DirPool {
    /// Read-only working directories of runs without sources.
    pub(crate) fn empty() -> DirPool {
        DirPool::new("empty", 0o555)
    }

    /// Runs' temporary directories: writable by the job alone.
    pub(crate) fn tmp() -> DirPool {
        DirPool::new("tmp", 0o700)
    }

    fn new(prefix: &'static str, mode: u32) -> DirPool {
        DirPool { prefix, mode, free: Default::default(), made: Default::default() }
    }

    /// A free directory, or a new one under `runs`.
    fn take(&self, runs: &Path) -> Result<PathBuf, String> {
        if let Some(dir) = self.free.lock().expect("dir pool").pop() {
            return Ok(dir);
        }
        let n = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = runs.join(format!("{}-{n}", self.prefix));
        let seal = || -> io::Result<()> {
            std::fs::create_dir(&dir)?;
            let file = std::fs::File::open(&dir)?;
            file.set_permissions(std::fs::Permissions::from_mode(self.mode))?;
            file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(SEALED_MTIME))
        };
        seal().map_err(|e| format!("cannot make the directory {}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// Takes a directory back after its run: kept if nothing was added to
    /// it or removed from it (still sealed, with its mode), removed
    /// otherwise.
    fn give_back(&self, dir: PathBuf) {
        let untouched = std::fs::symlink_metadata(&dir).is_ok_and(|m| {
            m.is_dir()
                && m.permissions().mode() & 0o777 == self.mode
                && m.modified().ok() == Some(std::time::UNIX_EPOCH + Duration::from_secs(SEALED_MTIME))
        });
        if untouched {
            self.free.lock().expect("dir pool").push(dir);
        } else {
            // Writing into a read-only directory is worth a line.
            if self.mode & 0o200 == 0 {
                tracing::info!(dir = %dir.display(), "a job wrote into its empty working directory: removed");
            }
            drop(tokio::task::spawn_blocking(move || remove_tree(&dir)));
        }
    }
}

/// The fetch stage: materialises the sources and dependencies; returns the
/// guards that keep the dependencies' artifacts from eviction, by
/// dependency name. Adds the time it waited for tokens to `waited`.
async fn fetch(
    shared: &Arc<Shared>,
    a: &Assignment,
    control: &RunControl,
    src: &Path,
    waited: &mut u64,
) -> Result<BTreeMap<String, ArtifactGuard>, String> {
    if a.sources.is_empty() && a.deps.is_empty() {
        return Ok(BTreeMap::new());
    }
    let remote = a.sources.iter().any(|f| !shared.cas.has_blob(&Key(f.digest.0)))
        || a.deps.iter().any(|d| shared.cas.artifact_info(&Key(d.artifact().0)).is_none());
    // Everything is here: only the cache is used.
    let request = if remote { Request::stage(Stage::Fetch) } else { Request::local(Stage::Fetch) };
    let (_grant, wait) = enter(shared, a.run, control, request).await?;
    *waited += wait;
    let log = StageLog { shared, run: a.run, stage: Stage::Fetch };
    let fetched = async {
        if !a.sources.is_empty() {
            tokio::fs::create_dir_all(src)
                .await
                .map_err(|e| format!("cannot create {}: {e}", src.display()))?;
        }
        fetch_sources(shared, &a.sources, &control.cancel, &log).await?;
        let files = a.sources.clone();
        let cas = shared.cas.clone();
        let root = src.to_owned();
        tokio::task::spawn_blocking(move || lay_out_sources(&cas, &root, &files))
            .await
            .map_err(|e| e.to_string())??;
        let mut deps = BTreeMap::new();
        // The first input to be had from nowhere, and how many more.
        let mut lost: Option<(String, usize)> = None;
        let mut unreachable = BTreeSet::new();
        for dep in &a.deps {
            match ensure_artifact(shared, dep, &log, &mut unreachable).await {
                Ok(guard) => {
                    deps.insert(dep.name.clone(), guard);
                }
                // The run fails, but the other inputs are tried all the
                // same (a holder found unreachable is not tried again): a
                // worker lost with several of them is found out in one run,
                // not in one run (and one rebuild round) per input.
                Err(Missing::Nowhere(e)) => {
                    control.lost_input(dep.job);
                    lost.get_or_insert((e, 0)).1 += 1;
                }
                Err(Missing::Failed(e)) => return Err(e),
                Err(Missing::TooLargeHere(e)) => {
                    control.worker_failed();
                    return Err(e);
                }
            }
        }
        match lost {
            None => Ok(deps),
            Some((e, 1)) => Err(e),
            Some((e, n)) => Err(format!("{e}; and {} more inputs could not be had", n - 1)),
        }
    };
    let result = tokio::select! {
        fetched = fetched => fetched,
        () = control.cancel.cancelled() => Err("cancelled".into()),
    };
    if let Err(e) = &result {
        log.line(format_args!("failed: {e}"));
    }
    result
}

/// Source files fetched from the coordinator at once: a tree of many small
/// files costs round trips and syncs per file, which overlap.
const FETCHES_AT_ONCE: usize = 8;

/// A source file at least this large gets a line of its own in the fetch
/// stage's log; the others are summed up in one.
const LOGGED_ALONE: u64 = 1 << 20;

/// Gets the source files the cache lacks from the coordinator, several at
/// once.
async fn fetch_sources(
    shared: &Arc<Shared>,
    sources: &[SourceFile],
    cancel: &tokio_util::sync::CancellationToken,
    log: &StageLog<'_>,
) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let missing: Vec<SourceFile> = sources
        .iter()
        .filter(|f| !shared.cas.has_blob(&Key(f.digest.0)) && seen.insert(f.digest))
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let (count, bytes) = (missing.len(), missing.iter().fold(0u64, |n, f| n.saturating_add(f.size)));
    let started = Instant::now();
    // Each fetch owns what it uses (the futures of a stream that borrow
    // are not `Send` for every lifetime, as a spawned task must be).
    let mut fetches = futures::stream::iter(missing)
        .map(|file| ensure_blob(shared.clone(), file, cancel.clone()))
        .buffer_unordered(FETCHES_AT_ONCE);
    while let Some(fetched) = fetches.next().await {
        if let Some(line) = fetched? {
            log.line(format_args!("{line}"));
        }
    }
    log.line(format_args!("{count} source files from the coordinator: {}", rate(bytes, started)));
    Ok(())
}

/// Gets a source file from the coordinator unless the cache has it; for a
/// large one, returns a line for the stage's log. The copy into the cache
/// runs on a thread of its own, which a dropped future does not stop: it
/// stops at its next read once the run is cancelled.
async fn ensure_blob(
    shared: Arc<Shared>,
    file: SourceFile,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<Option<String>, String> {
    let key = Key(file.digest.0);
    if shared.cas.has_blob(&key) {
        return Ok(None);
    }
    let started = Instant::now();
    let url = shared.coordinator(&format!("/v1/blobs/{}", file.digest));
    let reader = shared.http.get_reader(&url).await.map_err(|e| format!("source {}: {e}", file.path))?;
    let cas = shared.cas.clone();
    let mut sync = Cancellable { inner: tokio_util::io::SyncIoBridge::new(reader), cancel };
    tokio::task::spawn_blocking(move || cas.put_blob(&mut sync, &key))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("source {}: {e}", file.path))?;
    Ok((file.size >= LOGGED_ALONE)
        .then(|| format!("source {} from the coordinator: {}", file.path, rate(file.size, started))))
}

/// A reader that fails once its run is cancelled.
struct Cancellable<R> {
    inner: R,
    cancel: tokio_util::sync::CancellationToken,
}

impl<R: io::Read> io::Read for Cancellable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.is_cancelled() {
            return Err(io::Error::other("cancelled"));
        }
        self.inner.read(buf)
    }
}

/// Copies the job's sources into `root`, read-only (executable where the
/// file was), and makes the directories read-only too.
fn lay_out_sources(cas: &drover_cas::Cas, root: &Path, files: &[SourceFile]) -> Result<(), String> {
    // The root too, even when every file is in a subdirectory.
    let mut dirs = vec![root.to_owned()];
    for file in files {
        let key = Key(file.digest.0);
        let blob = cas.blob_path(&key).ok_or_else(|| format!("source {} left the cache", file.path))?;
        let dest = root.join(&file.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
            dirs.push(parent.to_owned());
        }
        std::fs::copy(&blob, &dest).map_err(|e| format!("source {}: {e}", file.path))?;
        let mode = if file.executable { 0o555 } else { 0o444 };
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("source {}: {e}", file.path))?;
    }
    dirs.sort();
    dirs.dedup();
    for dir in dirs.iter().rev() {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555));
    }
    Ok(())
}

/// Removes a directory tree, making read-only directories writable first.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            std::fs::remove_dir_all(path)
        }
    }
}

fn make_writable(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.is_dir()
    {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755));
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                make_writable(&entry.path());
            }
        }
    }
}

/// Why a dependency's output could not be had.
enum Missing {
    /// No holder the coordinator knew of and not its shared cache could
    /// give it: it must be built again.
    Nowhere(String),
    /// Storing it here failed.
    Failed(String),
    /// It is larger than this worker's whole cache.
    TooLargeHere(String),
}

/// Gets a dependency's artifact: from the cache, or from a peer that holds
/// it (each holder in turn, then whoever the coordinator knows of now).
async fn ensure_artifact(
    shared: &Arc<Shared>,
    dep: &DepInput,
    log: &StageLog<'_>,
    unreachable: &mut BTreeSet<String>,
) -> Result<ArtifactGuard, Missing> {
    let key = Key(dep.artifact().0);
    loop {
        if let Some(guard) = shared.cas.artifact(&key) {
            return Ok(guard);
        }
        // One fetch per artifact: later jobs wait for the first one's.
        let first = shared.fetching.lock().expect("fetching").insert(key);
        if !first {
            let notified = shared.fetched.notified();
            if shared.fetching.lock().expect("fetching").contains(&key) {
                log.line(format_args!("dependency {}: waiting for another run's fetch of it", dep.name));
                notified.await;
            }
            continue;
        }
        let result = fetch_artifact(shared, dep, log, unreachable).await;
        shared.fetching.lock().expect("fetching").remove(&key);
        shared.fetched.notify_waiters();
        result?;
    }
}

/// Fetches a dependency's artifact from a peer holding it, or failing
/// that from the shared cache: first the holders the assignment names,
/// then, after asking the coordinator who holds it now, the new ones and,
/// after a short pause, once more those whose failure may pass (see
/// `worth_retrying`), so a holder's passing trouble does not cost a
/// rebuild of the output. A holder in `unreachable` (it could not be
/// reached for another input of the run) is passed over; one that cannot
/// be reached now joins it.
async fn fetch_artifact(
    shared: &Arc<Shared>,
    dep: &DepInput,
    log: &StageLog<'_>,
    unreachable: &mut BTreeSet<String>,
) -> Result<(), Missing> {
    // The artifact that holds the output: the dependency's own, or another
    // job's whose output it is (early cutoff), kept here under that key.
    let artifact = dep.artifact();
    // An output known to be empty (its tree digest says so) is made here:
    // there is nothing to transfer.
    let empty = shared.cas.empty_info();
    if dep.tree == Some(Hash32(empty.tree.0)) {
        let (cas, key) = (shared.cas.clone(), Key(artifact.0));
        let info = tokio::task::spawn_blocking(move || cas.commit_empty_artifact(&key))
            .await
            .map_err(|e| Missing::Failed(e.to_string()))?
            .map_err(|e| Missing::Failed(format!("cannot store the empty output of {}: {e}", dep.name)))?;
        shared.outbox.added(held(&artifact, &info));
        return Ok(());
    }
    // Holders tried, and whether each may be tried once more (see
    // `worth_retrying`).
    let mut tried: Vec<(String, bool)> = Vec::new();
    let mut errors = Vec::new();
    let mut too_large: Option<String> = None;
    let mut holders = dep.holders.clone();
    let mut tree = dep.tree;
    let name = &dep.name;
    for round in 0..2 {
        if round == 1 {
            // The holders we were told of failed: ask who holds it now, and
            // give those whose failure may pass a moment first (rebuilding
            // the output costs more than a pause).
            if tried.iter().any(|(_, again)| *again) {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            let url = shared.coordinator(&format!("/v1/artifacts/{}", artifact));
            match shared.http.get_json::<drover_proto::ArtifactLocation>(&url).await {
                Ok(location) => {
                    holders = location.holders;
                    tree = tree.or(location.tree);
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        for holder in &holders {
            if *holder == shared.url {
                continue;
            }
            // A holder is tried once, and once more in the second round if
            // its first failure may pass; a name listed twice is not tried
            // twice for it.
            let first = match tried.iter().position(|(h, _)| h == holder) {
                Some(i) if round == 1 && tried[i].1 => {
                    tried[i].1 = false;
                    None
                }
                Some(_) => continue,
                None if unreachable.contains(holder) => {
                    errors.push(format!("{holder}: could not be reached for another input"));
                    continue;
                }
                None => {
                    tried.push((holder.clone(), false));
                    Some(tried.len() - 1)
                }
            };
            let started = Instant::now();
            let url = format!("{}/v1/artifacts/{}", holder.trim_end_matches('/'), artifact);
            match get_artifact(shared, &url, &artifact, tree).await {
                Ok(info) => {
                    log.line(format_args!("dependency {name} from {holder}: {}", rate(info.size, started)));
                    shared.outbox.added(held(&artifact, &info));
                    return Ok(());
                }
                Err(e) => {
                    let why = e.to_string();
                    tracing::warn!(dep = %name, %holder, "artifact fetch failed: {}", one_line(&why));
                    log.line(format_args!("dependency {name} from {holder} failed: {e}"));
                    // The output may not fit here (or this holder lies
                    // about its size): said if no other source gives it.
                    too_large = too_large.or_else(|| larger_than_cache(name, &e));
                    // A holder that refuses connections is gone: the
                    // coordinator, told, checks and forgets it at once, so
                    // the next round (and a rebuild) does not wait for its
                    // lease to run out.
                    if matches!(e, HttpError::Connect { .. })
                        && shared
                            .http
                            .report_unreachable(&shared.coordinator("/v1/workers/unreachable"), holder)
                            .await
                    {
                        log.line(format_args!("{holder} is gone: the coordinator took it as lost"));
                        unreachable.insert(holder.clone());
                        continue;
                    }
                    errors.push(format!("{holder}: {e}"));
                    // Unreachable twice, a pause apart: not tried again for
                    // the run's other inputs.
                    if round == 1
                        && first.is_none()
                        && matches!(e, HttpError::Connect { .. } | HttpError::Timeout { .. })
                    {
                        unreachable.insert(holder.clone());
                    }
                    if let Some(i) = first
                        && round == 0
                        && worth_retrying(&e)
                    {
                        tried[i].1 = true;
                    }
                }
            }
        }
    }
    // Last, the coordinator's shared cache (the workers that built it may be
    // gone).
    let started = Instant::now();
    let url = shared.coordinator(&format!("/v1/cache/{}", artifact));
    match get_artifact(shared, &url, &artifact, tree).await {
        Ok(info) => {
            log.line(format_args!("dependency {name} from the shared cache: {}", rate(info.size, started)));
            shared.outbox.added(held(&artifact, &info));
            return Ok(());
        }
        Err(e) => {
            too_large = too_large.or_else(|| larger_than_cache(name, &e));
            errors.push(format!("shared cache: {e}"))
        }
    }
    // No source gave it, and one was refused for being larger than this
    // whole cache: building it again would not help, another worker may.
    if let Some(message) = too_large {
        return Err(Missing::TooLargeHere(message));
    }
    Err(Missing::Nowhere(format!(
        "cannot get the output of {name} ({}): {} (the coordinator builds it again)",
        dep.job,
        errors.join("; ")
    )))
}

/// Runs the commands and commits the output (returned pinned).
async fn run_commands(
    shared: &Arc<Shared>,
    a: &Assignment,
    dir: &Path,
    src: &Path,
    deps: &BTreeMap<String, ArtifactGuard>,
    control: &RunControl,
) -> Result<Ran, String> {
    let cancel = &control.cancel;
    let dep_paths: BTreeMap<String, PathBuf> =
        deps.iter().map(|(n, g)| (n.clone(), g.path().to_owned())).collect();
    let render = |out: &Path| render_job(&a.commands, &a.env, src, out, &dep_paths);
    let (writer, (commands, env)) = if uses_out(&a.commands, &a.env, src, &dep_paths)? {
        let writer = shared.cas.begin_artifact(&Key(a.job.0)).map_err(|e| e.to_string())?;
        let rendered = render(writer.dir())?;
        (Some(writer), rendered)
    } else {
        (None, render(Path::new("/nonexistent"))?)
    };
    // A temporary directory of its own, unless the job names one: jobs
    // running at once must not meet in `/tmp` (two writing one scratch
    // file, each reading the other's, and caching that as its output).
    let mut env = env;
    let tmp = match env.contains_key("TMPDIR") {
        true => None,
        false => {
            let tmp = shared.tmp_dirs.take(&shared.runs_dir())?;
            env.insert("TMPDIR".to_owned(), tmp.to_string_lossy().into_owned());
            Some(tmp)
        }
    };
    let give_back = |tmp: Option<PathBuf>| {
        if let Some(tmp) = tmp {
            shared.tmp_dirs.give_back(tmp);
        }
    };
    let spec = JobSpec {
        commands,
        cwd: src.to_owned(),
        env,
        stdout: dir.join("stdout.log"),
        stderr: dir.join("stderr.log"),
        timeout: a.timeout_ms.map(Duration::from_millis),
        kill_grace: shared.config.kill_grace,
        log_limit: shared.config.log_limit,
    };
    let mut running = match shared.config.supervisor.start(&spec).await {
        Ok(running) => running,
        Err(e) => {
            give_back(tmp);
            return Err(e.to_string());
        }
    };
    let handle = running.handle();
    control.started(handle.clone());
    let outcome = {
        let wait = running.wait();
        tokio::pin!(wait);
        tokio::select! {
            outcome = &mut wait => outcome,
            () = cancel.cancelled() => {
                handle.terminate();
                wait.await
            }
        }
    };
    // Nothing of the job is left to write there.
    give_back(tmp);
    // The dependencies' outputs are the cache's own trees, sealed
    // read-only; a job that wrote into one anyway (as root, say) changed
    // it for every later reader. The changed output leaves the cache (the
    // coordinator hears of it with the next report, and builds it again
    // when something needs it), and the job fails saying what it did.
    // (A cancelled run is checked too, so that what it changed leaves the
    // cache now instead of failing the next reader.)
    let changed = changed_dependency(shared, deps).await.filter(|_| !matches!(outcome, Outcome::Cancelled));
    let failed = |exit_code, detail: String| {
        let result = RunResult {
            run: a.run,
            success: false,
            exit_code,
            cached: false,
            detail,
            output: None,
            duration_ms: 0,
            stages: Default::default(),
            lost_inputs: Vec::new(),
            worker_fault: false,
        };
        Ok((result, None))
    };
    if let Some((name, path)) = changed {
        return failed(
            None,
            format!(
                "the output of its dependency {name} changed while the job ran ({path} in {{{{dep:{name}}}}}): \
                 the job, or another one reading it on the same worker, wrote into it; a dependency's output \
                 is read-only: copy what is to change into {{{{out}}}} (`cp -r --no-preserve=mode`) and \
                 change the copy"
            ),
        );
    }
    match outcome {
        Outcome::Succeeded => {
            let cas = shared.cas.clone();
            let key = Key(a.job.0);
            let output = tokio::task::spawn_blocking(move || match writer {
                Some(writer) => writer.commit_pinned(),
                None => cas.commit_empty_artifact_pinned(&key),
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| cannot_store(&e))?;
            Ok((succeeded(a, output.info(), false), Some(output)))
        }
        Outcome::Failed { exit_code } => {
            let detail = with_tail(format!("exit code {exit_code}"), &spec.stderr, &spec.stdout);
            failed(Some(exit_code), detail + &empty_needs(shared, deps))
        }
        Outcome::Signaled { signal } => {
            let detail = with_tail(format!("killed by signal {signal}"), &spec.stderr, &spec.stdout);
            failed(None, detail + &empty_needs(shared, deps))
        }
        Outcome::TimedOut => failed(None, timed_out(spec.timeout.unwrap_or_default(), running.report())),
        Outcome::Cancelled => failed(None, "cancelled".into()),
        // The message says what failed: starting a command, writing a log
        // (say a full disk, after the commands ran), or the supervisor.
        Outcome::SpawnFailed(message) => {
            control.spawn_failed();
            failed(None, message)
        }
        Outcome::SupervisorLost(message) => {
            control.worker_failed();
            failed(None, message)
        }
    }
}

/// A note for a failed run's detail naming the dependencies it read whose
/// outputs are empty (a job that forgot `{{out}}` succeeds with nothing,
/// and the job reading it fails on a missing file), or nothing.
fn empty_needs(shared: &Shared, deps: &BTreeMap<String, ArtifactGuard>) -> String {
    let empty = shared.cas.empty_info().tree;
    let names: Vec<&str> =
        deps.iter().filter(|(_, g)| g.info().tree == empty).map(|(n, _)| n.as_str()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => format!(
            "\nnote: the output of {one}, which it reads, is empty: {one} wrote nothing to {{{{out}}}}"
        ),
        many => format!(
            "\nnote: the outputs of {}, which it reads, are empty: they wrote nothing to {{{{out}}}}",
            many.join(", ")
        ),
    }
}

/// When a dependency's output failed to arrive for being larger than this
/// worker's whole cache: why, in words. Building it again would not help.
fn larger_than_cache(name: &str, e: &HttpError) -> Option<String> {
    match e {
        HttpError::Artifact { source: drover_cas::CasError::TooLarge { what, size, max }, .. }
            if what == "pack" =>
        {
            Some(format!(
                "cannot fetch the output of its dependency {name}: it is larger than this worker's whole cache \
                 (at least {size} bytes, --cache-size is {max} bytes): give the worker a larger cache, or run the \
                 job on a worker with one"
            ))
        }
        _ => None,
    }
}

/// Why a job's output could not be stored: in words about the cache's
/// size when it is larger than the whole cache.
fn cannot_store(e: &drover_cas::CasError) -> String {
    match e {
        drover_cas::CasError::TooLarge { what, size, max } if what == "artifact" => format!(
            "cannot store the output: it is larger than this worker's whole cache (at least {size} bytes, \
             --cache-size is {max} bytes): give the worker a larger cache"
        ),
        e => format!("cannot store the output: {e}"),
    }
}

/// The first dependency whose output the job changed, with the changed
/// path in it (see `drover_cas::Cas::changed`, which also drops it).
async fn changed_dependency(
    shared: &Arc<Shared>,
    deps: &BTreeMap<String, ArtifactGuard>,
) -> Option<(String, String)> {
    if deps.is_empty() {
        return None;
    }
    // The guards stay with the caller, who awaits the check: the trees
    // stay in place while it reads them.
    let trees: Vec<(String, Key, PathBuf)> =
        deps.iter().map(|(name, guard)| (name.clone(), *guard.key(), guard.path().to_owned())).collect();
    let cas = shared.cas.clone();
    tokio::task::spawn_blocking(move || {
        trees.into_iter().find_map(|(name, key, tree)| cas.changed(&key, &tree).map(|path| (name, path)))
    })
    .await
    .unwrap_or_default()
}

/// A job's commands and environment, placeholders filled in.
type Rendered = (Vec<String>, BTreeMap<String, String>);

/// Renders the commands and environment with `out` as `{{out}}`.
fn render_job(
    commands: &[String],
    env: &BTreeMap<String, String>,
    src: &Path,
    out: &Path,
    deps: &BTreeMap<String, PathBuf>,
) -> Result<Rendered, String> {
    let render = |text: &str| drover_graph::render(text, src, out, deps).map_err(|e| e.to_string());
    let commands = commands.iter().map(|c| render(c)).collect::<Result<Vec<_>, _>>()?;
    let env = env.iter().map(|(k, v)| Ok((k.clone(), render(v)?))).collect::<Result<_, String>>()?;
    Ok((commands, env))
}

/// Whether the job can reach its output directory, which only `{{out}}`
/// names (the directory's path is unpredictable): whether rendering with
/// two different paths gives different commands or environments. A job
/// that cannot reach it needs no directory: its output is the empty tree.
fn uses_out(
    commands: &[String],
    env: &BTreeMap<String, String>,
    src: &Path,
    deps: &BTreeMap<String, PathBuf>,
) -> Result<bool, String> {
    Ok(render_job(commands, env, src, Path::new("/0"), deps)?
        != render_job(commands, env, src, Path::new("/1"), deps)?)
}

fn humane(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

/// Why a job that ran past its `timeout` failed, and what it took to stop
/// it: a job that ignored SIGTERM held its slot a kill grace longer.
fn timed_out(timeout: Duration, report: Option<&drover_exec::JobReport>) -> String {
    match report.and_then(|report| report.killed_after_ms) {
        Some(after) => format!(
            "timed out after {} (it ignored SIGTERM and was killed {} later)",
            humane(timeout),
            seconds(Duration::from_millis(after))
        ),
        None => format!("timed out after {}", humane(timeout)),
    }
}

/// A measured duration for people: "850ms", "10s", "12.3s".
fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let text = format!("{:.1}", d.as_secs_f64());
    format!("{}s", text.strip_suffix(".0").unwrap_or(&text))
}

/// `summary`, then the last lines of the job's standard error, or of its
/// standard output when it wrote nothing to standard error (test runners
/// such as pytest report their failures there).
fn with_tail(summary: String, stderr: &Path, stdout: &Path) -> String {
    for (name, path) in [("stderr", stderr), ("stdout", stdout)] {
        if let Some(tail) = log_tail(path) {
            return format!("{summary}; {name}:\n{tail}");
        }
    }
    summary
}

/// `text` on one line, for the worker's own log, which has a line per
/// event: a line break becomes ` ⏎ ` and other control characters are
/// escaped (`\u{1b}`), so that what a job (the tail of its standard error
/// in a failure's detail) or a peer wrote starts no line of its own. What
/// goes to the coordinator keeps its lines.
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(char::is_control) {
        return text.into();
    }
    let mut line = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => line.push_str(" ⏎ "),
            // A Windows line end is one break.
            '\r' if chars.peek() == Some(&'\n') => {}
            '\t' => line.push(c),
            c if c.is_control() => line.extend(c.escape_default()),
            c => line.push(c),
        }
    }
    line.into()
}

/// The last whole lines of a log, at most [`LOG_TAIL`] bytes of them
/// (a line longer than that is cut at its start); `None` if the log is
/// missing or blank.
fn log_tail(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    // Only the end is read: a log may be as large as its limit, or larger.
    let read_end = || -> io::Result<(Vec<u8>, bool)> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        let start = len.saturating_sub(LOG_TAIL as u64);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::with_capacity(LOG_TAIL);
        file.take(LOG_TAIL as u64).read_to_end(&mut bytes)?;
        Ok((bytes, start > 0))
    };
    let (bytes, cut) = read_end().ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut tail = text.trim_end();
    // Cut inside a line: start at the next whole one, if there is one.
    if cut && let Some((_, rest)) = tail.split_once('\n') {
        tail = rest;
    }
    (!tail.trim().is_empty()).then(|| tail.to_owned())
}

/// Keeps the run's logs; returns the oldest runs beyond the limit, whose
/// directories are to be removed.
fn keep_logs(shared: &Shared, run: u64) -> Vec<u64> {
    let mut kept = shared.kept.lock().expect("kept");
    kept.push_back(run);
    let excess = kept.len().saturating_sub(shared.config.keep_runs);
    let old = kept.drain(..excess).collect();
    shared.kept_file.lock().expect("kept file").add(run, &kept);
    old
}

/// The list of kept runs on disk ([`KEPT_LIST`]), a line per run appended
/// as each run ends, so that a worker killed without leaving still knows
/// the runs that wrote no log when it starts again (their logs read as
/// empty, not as unknown). Written whole again, from the runs kept, when
/// it opens and whenever the appended lines pass twice what is kept.
#[derive(Debug)]
pub(crate) struct KeptFile {
    path: PathBuf,
    /// Open for appending; `None` after a failure (logged once).
    file: Option<std::fs::File>,
    lines: usize,
}

impl KeptFile {
    /// Writes the list of `kept` under `runs` and opens it for appending.
    pub(crate) fn open(runs: &Path, kept: &VecDeque<u64>) -> KeptFile {
        let mut list = KeptFile { path: runs.join(KEPT_LIST), file: None, lines: 0 };
        list.rewrite(kept);
        list
    }

    fn rewrite(&mut self, kept: &VecDeque<u64>) {
        let text: String = kept.iter().map(|run| format!("{run}\n")).collect();
        let new = self.path.with_extension("new");
        let written = std::fs::write(&new, text)
            .and_then(|()| std::fs::rename(&new, &self.path))
            .and_then(|()| std::fs::OpenOptions::new().append(true).open(&self.path));
        match written {
            Ok(file) => {
                self.file = Some(file);
                self.lines = kept.len();
            }
            Err(e) => self.failed(&e),
        }
    }

    /// Run `run` is kept (`kept` holds it, and what else is kept).
    fn add(&mut self, run: u64, kept: &VecDeque<u64>) {
        if self.lines >= 2 * kept.len().max(64) {
            return self.rewrite(kept);
        }
        let Some(file) = &mut self.file else { return };
        match io::Write::write_all(file, format!("{run}\n").as_bytes()) {
            Ok(()) => self.lines += 1,
            Err(e) => self.failed(&e),
        }
    }

    fn failed(&mut self, e: &io::Error) {
        if self.file.take().is_some() || self.lines == 0 {
            tracing::warn!(
                "cannot write {}: {e} (the logs of runs that wrote none are forgotten if the worker stops)",
                self.path.display()
            );
        }
        self.lines = usize::MAX / 2;
    }
}

/// Forgets the logs kept under run ID `run` and removes them, if any: a
/// new run under a known ID means that the coordinator lost its state
/// and counts its runs from 1 again, so those logs are another run's, and
/// the new run's logs (appended to) must not start with them.
pub(crate) fn forget_logs(shared: &Shared, run: u64) {
    let known = {
        let mut kept = shared.kept.lock().expect("kept");
        kept.iter().position(|r| *r == run).and_then(|i| kept.remove(i)).is_some()
    };
    if !known {
        return;
    }
    let mut notes = shared.notes.lock().expect("notes");
    for stage in [Stage::Pull, Stage::Fetch, Stage::Push] {
        notes.remove(&(run, stage.name()));
    }
    drop(notes);
    if let Err(e) = remove_tree(&shared.runs_dir().join(run.to_string())) {
        tracing::warn!(run, "cannot remove the logs of an earlier run under the same ID: {e}");
    }
}

/// The file under `runs/` that lists the runs whose logs a worker keeps
/// ([`KeptFile`]): a run that wrote no log has no directory, and is known
/// again after a restart only through it.
const KEPT_LIST: &str = "kept";

/// The runs of an earlier life of the worker on this directory whose logs
/// it keeps, oldest first (by run ID: the coordinator numbers runs in the
/// order it assigns them, never twice), at most `keep` of them: those
/// [`save_logs`] listed and those with a directory under `runs`. What
/// else is under `runs` goes: the working directories of runs that were
/// going when the worker stopped (`<run>/src/`: their runs are over), the
/// empty working and temporary directories (`empty-N/`, `tmp-N/`, made
/// again as needed), the
/// oldest logs beyond `keep`, and anything that is not a run's.
pub(crate) fn earlier_runs(runs: &Path, keep: usize) -> io::Result<VecDeque<u64>> {
    let mut found = BTreeSet::new();
    match std::fs::read_to_string(runs.join(KEPT_LIST)) {
        Ok(list) => found.extend(list.lines().filter_map(|line| line.parse::<u64>().ok())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for entry in std::fs::read_dir(runs)? {
        let entry = entry?;
        let path = entry.path();
        let is_dir = entry.file_type()?.is_dir();
        let name = entry.file_name();
        let run =
            name.to_str().and_then(|name| name.parse::<u64>().ok().filter(|run| run.to_string() == name));
        match run {
            Some(run) if is_dir => {
                remove_tree(&path.join("src"))?;
                found.insert(run);
            }
            // The list too: it is written again as the worker starts.
            _ if is_dir => remove_tree(&path)?,
            _ => std::fs::remove_file(&path)?,
        }
    }
    let excess = found.len().saturating_sub(keep);
    for run in found.iter().take(excess) {
        remove_tree(&runs.join(run.to_string()))?;
    }
    Ok(found.into_iter().skip(excess).collect())
}

/// Makes the kept runs' logs outlast the worker (see [`earlier_runs`]):
/// writes the lines of their stage logs still in memory to their files,
/// and the list of kept runs, compacted. A failure is logged: the logs it concerns
/// are lost with the worker, as they were before.
pub(crate) fn save_logs(shared: &Shared) {
    let runs = shared.runs_dir();
    for ((run, stage), held) in shared.notes.lock().expect("notes").iter_mut() {
        if !held.is_empty() {
            spill(held, &runs.join(run.to_string()).join(format!("{stage}.log")));
        }
    }
    let kept = shared.kept.lock().expect("kept");
    shared.kept_file.lock().expect("kept file").rewrite(&kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(commands: &[&str], env: &[(&str, &str)]) -> bool {
        let commands: Vec<String> = commands.iter().map(|c| (*c).to_owned()).collect();
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let deps = BTreeMap::from([("lib".to_owned(), PathBuf::from("/cache/lib"))]);
        uses_out(&commands, &env, Path::new("/runs/1/src"), &deps).unwrap()
    }

    /// A failure's summary ends with the last whole lines of standard
    /// error, or of standard output when standard error is blank.
    #[test]
    fn a_failure_shows_the_tail_of_stderr_or_else_of_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let (err, out) = (dir.path().join("stderr.log"), dir.path().join("stdout.log"));
        assert_eq!(with_tail("exit code 1".into(), &err, &out), "exit code 1", "no logs");
        std::fs::write(&err, "\n  \n").unwrap();
        std::fs::write(&out, "collected 3 items\nFAILED test_x.py::test_y\n").unwrap();
        assert_eq!(
            with_tail("exit code 1".into(), &err, &out),
            "exit code 1; stdout:\ncollected 3 items\nFAILED test_x.py::test_y"
        );
        let long: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&err, &long).unwrap();
        let summary = with_tail("exit code 2".into(), &err, &out);
        let tail = summary.strip_prefix("exit code 2; stderr:\n").unwrap();
        assert!(tail.len() <= LOG_TAIL && tail.ends_with("line 999"), "{tail}");
        assert!(long.contains(&format!("\n{tail}")), "the tail starts at a whole line: {tail:.40}");
    }

    /// A stage log's lines stay in memory until they pass the limit, then
    /// go to its file; reading from any offset sees the file, then memory,
    /// with nothing twice or missing.
    #[test]
    fn a_stage_log_is_its_file_then_what_memory_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs/7/fetch.log");
        let mut held = Vec::new();
        let mut all = Vec::new();
        for i in 0..200 {
            let line = format!("line {i}: fetched something from somewhere");
            hold(&mut held, &path, format_args!("{line}"));
            all.extend_from_slice(format!("{line}\n").as_bytes());
            if i == 0 {
                assert!(!path.exists(), "one line makes no file");
            }
        }
        assert!(path.exists() && !held.is_empty() && held.len() <= NOTES_IN_MEMORY);
        assert_eq!(read_held(&path, &held, 0, usize::MAX).unwrap(), all);
        let in_file = std::fs::metadata(&path).unwrap().len() as usize;
        for from in [0, 5, in_file - 1, in_file, in_file + 3, all.len(), all.len() + 10] {
            for max in [1, 100, usize::MAX] {
                let want = &all[from.min(all.len())..];
                let want = &want[..want.len().min(max)];
                assert_eq!(
                    read_held(&path, &held, from as u64, max).unwrap(),
                    want,
                    "from {from}, max {max}"
                );
            }
        }
        assert_eq!(read_held(&dir.path().join("none.log"), b"x\n", 0, 10).unwrap(), b"x\n");
    }

    /// What a worker finds under `runs/` when it starts: the logs of its
    /// earlier runs stay (the newest `keep`, those listed without a
    /// directory too); what those runs left going, and anything else, goes.
    #[test]
    fn a_worker_starting_again_keeps_the_logs_of_its_earlier_runs_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path();
        let file = |path: &str, text: &str| {
            let path = runs.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        file("3/stdout.log", "oldest\n");
        file("5/stdout.log", "five\n");
        file("5/fetch.log", "fetched\n");
        // Run 7 was going when the worker stopped: its sources, read-only.
        file("7/stderr.log", "seven\n");
        file("7/src/a/b.c", "int x;\n");
        for path in ["7/src/a/b.c", "7/src/a", "7/src"] {
            std::fs::set_permissions(runs.join(path), std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        // Run 9 wrote no log: only the list knows it; 0012 is no run's name.
        file(KEPT_LIST, "3\n5\n7\n9\n");
        file("0012/stdout.log", "x\n");
        file("stray", "x");
        DirPool::empty().take(runs).unwrap();
        DirPool::tmp().take(runs).unwrap();
        let kept = earlier_runs(runs, 3).unwrap();
        assert_eq!(kept, [5, 7, 9], "the newest three, oldest first");
        let mut left: Vec<String> = walk(runs);
        left.sort();
        assert_eq!(left, ["5", "5/fetch.log", "5/stdout.log", "7", "7/stderr.log"]);
        assert_eq!(
            earlier_runs(runs, 3).unwrap(),
            [5, 7],
            "the list is read once: it is written again on leaving"
        );
        assert!(earlier_runs(runs, 0).unwrap().is_empty());
        assert!(walk(runs).is_empty());
    }

    /// The list of kept runs grows a line per run and is written whole
    /// again past twice what is kept, so it stays bounded; read back, it
    /// gives the runs kept, whether or not the worker left.
    #[test]
    fn the_list_of_kept_runs_is_appended_to_and_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path();
        let keep = 100;
        let mut kept: VecDeque<u64> = [1, 2].into();
        let mut list = KeptFile::open(runs, &kept);
        for run in 3..=1_000 {
            kept.push_back(run);
            let excess = kept.len().saturating_sub(keep);
            kept.drain(..excess);
            list.add(run, &kept);
            let lines = std::fs::read_to_string(runs.join(KEPT_LIST)).unwrap().lines().count();
            assert!(lines <= 2 * keep + 1, "{lines} lines after run {run}");
        }
        drop(list);
        assert_eq!(earlier_runs(runs, keep).unwrap(), kept);
    }

    /// A temporary directory comes back to the pool only as it was lent:
    /// empty, with its mode and sealed time; one a job added to (or took
    /// a file from, or made a directory in, or chmodded) is removed, and
    /// the next run gets a fresh one.
    #[tokio::test]
    async fn a_temporary_directory_is_lent_again_only_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path();
        let pool = DirPool::tmp();
        let first = pool.take(runs).unwrap();
        assert_eq!(std::fs::metadata(&first).unwrap().permissions().mode() & 0o777, 0o700);
        pool.give_back(first.clone());
        assert_eq!(pool.take(runs).unwrap(), first, "an untouched one is lent again");
        let touch: [&dyn Fn(&Path); 3] = [
            &|d| std::fs::write(d.join("left"), "x").unwrap(),
            &|d| std::fs::create_dir(d.join("sub")).unwrap(),
            &|d| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap(),
        ];
        let mut lent = first;
        for change in touch {
            change(&lent);
            pool.give_back(lent.clone());
            let next = pool.take(runs).unwrap();
            assert_ne!(next, lent, "a changed directory is not lent again");
            assert_eq!(std::fs::read_dir(&next).unwrap().count(), 0);
            lent = next;
        }
    }

    /// Every path under `root`, relative to it.
    fn walk(root: &Path) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(root).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
            if path.is_dir() {
                found.extend(walk(&path).into_iter().map(|p| format!("{name}/{p}")));
            }
            found.push(name);
        }
        found
    }

    /// The worker's log gets a failure's detail on one line; what the
    /// coordinator gets keeps its lines.
    #[test]
    fn a_detail_is_logged_on_one_line() {
        assert_eq!(one_line("exit code 1"), "exit code 1");
        assert_eq!(
            one_line("exit code 1; stderr:\nerror: x\r\n\tat y\n\x1b[31mred\x1b[0m"),
            "exit code 1; stderr: ⏎ error: x ⏎ \tat y ⏎ \\u{1b}[31mred\\u{1b}[0m"
        );
        assert!(!one_line("a\rb\u{85}c\u{2028}d").contains(['\r', '\u{85}']));
    }

    /// A timed-out job's detail says when it was killed if SIGTERM did not
    /// stop it.
    #[test]
    fn a_timeout_says_whether_the_job_had_to_be_killed() {
        let report = |killed_after_ms| drover_exec::JobReport { killed_after_ms, ..Default::default() };
        assert_eq!(timed_out(Duration::from_secs(2), None), "timed out after 2s");
        assert_eq!(timed_out(Duration::from_millis(1500), Some(&report(None))), "timed out after 1500ms");
        assert_eq!(
            timed_out(Duration::from_secs(2), Some(&report(Some(10_004)))),
            "timed out after 2s (it ignored SIGTERM and was killed 10s later)"
        );
        assert_eq!(seconds(Duration::from_millis(250)), "250ms");
        assert_eq!(seconds(Duration::from_millis(12_340)), "12.3s");
    }

    /// A holder is tried again only for a failure that may pass.
    #[test]
    fn only_a_failure_that_may_pass_is_worth_a_retry() {
        let url = || "http://w1/v1/artifacts/x".to_owned();
        let status = |status| HttpError::Status { url: url(), status, message: String::new() };
        let artifact = |source| HttpError::Artifact { url: url(), source };
        let retried = [
            HttpError::Connect { url: url(), message: "connection refused".into() },
            HttpError::Timeout { url: url(), secs: 30 },
            status(503),
            artifact(drover_cas::CasError::Io {
                context: "read the pack".into(),
                source: io::Error::other("the stream broke"),
            }),
        ];
        let final_ = [
            HttpError::Decode { url: url(), message: "the unpacking task panicked".into() },
            status(404),
            status(401),
            artifact(drover_cas::CasError::Corrupt("a truncated pack".into())),
            artifact(drover_cas::CasError::UnsafePath("../x".into())),
            artifact(drover_cas::CasError::TooLarge { what: "artifact".into(), size: 2, max: 1 }),
        ];
        for e in &retried {
            assert!(worth_retrying(e), "{e}");
        }
        for e in &final_ {
            assert!(!worth_retrying(e), "{e}");
        }
    }

    #[test]
    fn only_a_job_that_names_its_output_gets_an_output_directory() {
        assert!(!uses(&["true", "cat {{src}}/a {{dep:lib}}/b"], &[("X", "{{src}}")]));
        assert!(uses(&["true", "echo hi > {{out}}/x"], &[]));
        assert!(uses(&["true"], &[("OUT", "{{ out }}")]));
    }

    #[test]
    fn a_bad_placeholder_is_an_error_either_way() {
        let deps = BTreeMap::new();
        assert!(
            uses_out(&["cat {{dep:missing}}".to_owned()], &BTreeMap::new(), Path::new("/s"), &deps).is_err()
        );
    }
}
