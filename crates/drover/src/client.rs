//! The client side of the command: load a build file, upload the sources the
//! coordinator lacks, submit, follow the event stream (reconnecting across a
//! coordinator restart), print the result and export outputs; and the small
//! commands `status`, `cancel`, `workers` and `logs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use drover_http::{Http, HttpError};
use drover_proto::{
    ArtifactLocation, BuildEvent, BuildSpec, BuildState, BuildStatus, EventKind, GangDef, Hash32, JobDef,
    JobState, MissingReply, MissingRequest, OnError, QueueAmounts, QueueView, SourceFile, SubmitReply,
    SubmitRequestRef, WorkerStatus,
};
use futures::{StreamExt, TryStreamExt};

use crate::Failure;
use crate::cli::{
    BuildArgs, CancelArgs, LogStage, LogsArgs, QueuesArgs, Remote, RetryArgs, StatusArgs, SubmitArgs,
    SuspendArgs, WorkersArgs,
};
use crate::progress::{Progress, printable};
use crate::units;

/// A build file, checked and turned into what the coordinator takes.
#[derive(Debug)]
pub(crate) struct Loaded {
    root: std::path::PathBuf,
    spec: BuildSpec,
    max_parallel: Option<u32>,
    queue: Option<String>,
}

impl Loaded {
    /// The jobs some job depends on: `--out` exports the others.
    fn needed(&self) -> BTreeSet<&str> {
        self.spec.jobs.iter().flat_map(|j| j.needs.iter().map(String::as_str)).collect()
    }
}

/// Loads and checks a build file; every problem is reported, as bad input.
pub(crate) fn load(file: &Path) -> Result<Loaded, Failure> {
    load_excluding(file, None)
}

/// [`load`], never reading `out` (where outputs are exported) for sources.
pub(crate) fn load_excluding(file: &Path, out: Option<&Path>) -> Result<Loaded, Failure> {
    let build = drover_graph::load_excluding(file, out).map_err(|e| Failure::Usage(anyhow!("{e}")))?;
    let hash = |d: drover_graph::Digest| Hash32(d.0);
    let spec = BuildSpec {
        name: build.name.clone(),
        sources: build
            .sources
            .iter()
            .map(|s| SourceFile {
                path: s.path.clone(),
                digest: hash(s.digest),
                size: s.size,
                executable: s.executable,
            })
            .collect(),
        jobs: build
            .jobs
            .iter()
            .map(|j| JobDef {
                name: j.name.clone(),
                id: hash(j.id),
                own: j.own.map(hash),
                commands: j.commands.clone(),
                env: j.env.clone(),
                needs: j.needs.clone(),
                cpu_millis: j.cpu_millis,
                memory: j.memory,
                tokens: j.tokens.clone(),
                exclusive: j.exclusive.clone(),
                labels: j.labels.clone(),
                priority: j.priority,
                timeout_ms: j.timeout_ms,
                retries: j.retries,
                retry_on_failure: j.retry_on_failure,
                inputs: j.inputs.clone(),
                gang: j.gang.as_ref().map(|g| GangDef {
                    name: g.name.clone(),
                    min_available: g.min_available,
                    restart: g.restart,
                }),
                nonce: j.nonce.map(hash),
            })
            .collect(),
    };
    Ok(Loaded { root: build.root, spec, max_parallel: build.max_parallel, queue: build.queue })
}

/// An HTTP client for the coordinator.
pub(crate) fn connect(remote: &Remote) -> Http {
    Http::new(remote.token.clone(), Duration::from_secs(60))
}

pub(crate) fn api(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

/// Waits until `n` workers are alive (the embedded cluster's start).
pub(crate) async fn wait_for_workers(http: &Http, base: &str, n: usize) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers: Vec<WorkerStatus> =
            http.get_json(&api(base, "/v1/workers")).await.map_err(anyhow::Error::from)?;
        if workers.iter().filter(|w| w.alive).count() >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure::Runtime(anyhow!("the local workers did not register within 30s")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tells the coordinator that every worker it holds alive has left (see
/// `Embedded::start_with`).
pub(crate) async fn forget_workers(http: &Http, base: &str) -> Result<(), Failure> {
    let workers: Vec<WorkerStatus> = http.get_json(&api(base, "/v1/workers")).await.map_err(reach(base))?;
    for w in workers.iter().filter(|w| w.alive) {
        match http.post(&api(base, &format!("/v1/workers/{}/leave", w.id))).await {
            // Lost meanwhile (its lease ran out): gone either way.
            Err(e) if e.status() == Some(404) => {}
            result => result.map_err(reach(base))?,
        }
    }
    Ok(())
}

/// Uploads the sources the coordinator does not have.
async fn upload(http: &Http, base: &str, loaded: &Loaded, patient: bool) -> Result<(), Failure> {
    let digests: BTreeSet<Hash32> = loaded.spec.sources.iter().map(|s| s.digest).collect();
    let request = MissingRequest { digests: digests.into_iter().collect() };
    // The submission's first request, and one that may be sent again: a
    // patient client waits here for a coordinator that refuses connections
    // as it restarts (a connection refused never reached it).
    let url = api(base, "/v1/blobs/missing");
    let deadline = Instant::now() + RECONNECT_PAUSE * RECONNECTS;
    let mut said = false;
    let reply: MissingReply = loop {
        match http.post_json(&url, &request, None).await {
            Err(e @ HttpError::Connect { .. }) if patient && Instant::now() < deadline => {
                if !said {
                    eprintln!(
                        "drover: {e}; trying again for up to {}s (is the coordinator restarting?)",
                        (RECONNECT_PAUSE * RECONNECTS).as_secs()
                    );
                    said = true;
                }
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            reply => break reply.map_err(reach(base))?,
        }
    };
    let missing: BTreeSet<Hash32> = reply.missing.into_iter().collect();
    let mut seen = BTreeSet::new();
    // Owned (path, digest) pairs: the upload futures then borrow nothing
    // per file, and a client may run on a task of its own.
    let files: Vec<(std::path::PathBuf, Hash32)> = loaded
        .spec
        .sources
        .iter()
        .filter(|s| missing.contains(&s.digest) && seen.insert(s.digest))
        .map(|s| (loaded.root.join(&s.path), s.digest))
        .collect();
    futures::stream::iter(files)
        .map(|(path, digest)| async move {
            http.put_file(&api(base, &format!("/v1/blobs/{digest}")), &path).await.map_err(|e| {
                // Refused as sent (400): most likely the file changed since
                // it was hashed; otherwise the coordinator says why (a disk
                // of its own that is full answers 507).
                let hint = if e.status() == Some(400) { " (did it change since it was read?)" } else { "" };
                anyhow!("uploading {}{hint}: {e}", path.display())
            })
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .map_err(Failure::Usage)?;
    Ok(())
}

/// Turns an error reaching the coordinator into a usage failure (nothing
/// was submitted) with a hint.
fn reach(base: &str) -> impl Fn(HttpError) -> Failure + '_ {
    move |e| match e {
        HttpError::Connect { .. } | HttpError::Timeout { .. } => Failure::Usage(anyhow!(
            "{e}\nis a coordinator running at {base}? (start one with `drover serve`, or set --coordinator / DROVER_COORDINATOR)"
        )),
        HttpError::Status { status: 401, ref message, .. } => {
            Failure::Usage(anyhow!("the coordinator at {base} refused the request: {message}"))
        }
        HttpError::Status { status: 404, ref message, .. } if message.eq_ignore_ascii_case("not found") => {
            Failure::Usage(anyhow!(
                "{e}\nis {base} the address of a drover coordinator? (set --coordinator / DROVER_COORDINATOR)"
            ))
        }
        other => Failure::Usage(other.into()),
    }
}

/// A request the coordinator refused for a reason of its own (no such
/// build or job, a build that cannot be retried): its words alone, without
/// the request's URL.
fn refused(e: HttpError) -> Failure {
    match e {
        HttpError::Status { ref message, .. } if message.eq_ignore_ascii_case("not found") => {
            Failure::Usage(anyhow!(
                "{e}\nis that the address of a drover coordinator? (set --coordinator / DROVER_COORDINATOR)"
            ))
        }
        HttpError::Status { message, .. } => Failure::Usage(anyhow!("{message}")),
        other => Failure::Usage(other.into()),
    }
}

/// How a build is submitted, besides its file.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) tenant: String,
    pub(crate) no_cache: bool,
    pub(crate) on_error: OnError,
    /// Overrides the build file's `max_parallel`.
    pub(crate) max_parallel: Option<u32>,
    /// Overrides the build file's `queue`.
    pub(crate) queue: Option<String>,
    /// A coordinator that refuses connections at first (restarting) is
    /// waited for, up to a minute (`submit --wait`).
    pub(crate) patient: bool,
}

impl Options {
    pub(crate) fn from_args(args: &BuildArgs) -> Options {
        Options {
            tenant: args.tenant.clone(),
            no_cache: args.no_cache,
            on_error: args.on_error.into(),
            max_parallel: args.max_parallel,
            queue: args.queue.clone(),
            patient: false,
        }
    }
}

/// Uploads and submits; returns the build's ID.
pub(crate) async fn submit_loaded(
    http: &Http,
    base: &str,
    loaded: &Loaded,
    options: &Options,
) -> Result<u64, Failure> {
    upload(http, base, loaded, options.patient).await?;
    let request = SubmitRequestRef {
        build: &loaded.spec,
        tenant: &options.tenant,
        no_cache: options.no_cache,
        on_error: options.on_error,
        max_parallel: options.max_parallel.or(loaded.max_parallel),
        queue: options.queue.as_deref().or(loaded.queue.as_deref()),
    };
    let reply: SubmitReply =
        http.post_json(&api(base, "/v1/builds"), &request, None).await.map_err(reach(base))?;
    Ok(reply.id)
}

/// Submits, follows to the end, prints the result and exports outputs.
pub(crate) async fn build_and_wait(
    http: &Http,
    base: &str,
    loaded: Loaded,
    args: &BuildArgs,
    state: &Path,
) -> Result<(), Failure> {
    let started = Instant::now();
    prepare_out(args, &loaded, Some(state))?;
    let id = submit_loaded(http, base, &loaded, &Options::from_args(args)).await?;
    let ended = follow(http, base, id, 0, loaded.spec.jobs.len()).await?;
    finish(http, base, id, (&loaded, Some(state)), args, &ended, started).await
}

/// Prints the outcome, exports outputs and maps the state to the result.
/// The build's whole status is asked for only when it is needed (outputs
/// to export, logs, `--json`): the closing line comes from its last event.
async fn finish(
    http: &Http,
    base: &str,
    id: u64,
    (loaded, state): (&Loaded, Option<&Path>),
    args: &BuildArgs,
    ended: &Ended,
    started: Instant,
) -> Result<(), Failure> {
    let export_to = args.out.as_ref().filter(|_| ended.state == BuildState::Succeeded);
    if let Some(out) = args.out.as_ref().filter(|_| export_to.is_none()) {
        eprintln!("nothing exported to {}: the build {}", out.display(), ended.state);
    }
    // An export that fails still leaves the logs and the status printed.
    let mut exported = Ok(());
    if export_to.is_some() || args.logs || args.json {
        let status = build_status(http, base, id).await?;
        if let Some(out) = export_to {
            exported = export(http, base, (&args.file, loaded, state), &status, out).await;
        }
        if args.logs {
            print_logs(http, base, &status).await;
        }
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&status).map_err(anyhow::Error::from)?);
        }
    }
    eprintln!(
        "build {id} {} in {:.1}s: {}",
        ended.state,
        started.elapsed().as_secs_f64(),
        summary(&ended.counts)
    );
    exported?;
    if ended.state == BuildState::Succeeded { Ok(()) } else { Err(Failure::Build) }
}

/// "12 jobs: 9 succeeded, 2 cached, 1 failed": how the jobs ended, each state
/// that some job is in, in the order a build goes.
fn summary(counts: &BTreeMap<JobState, usize>) -> String {
    use JobState as S;
    let states = [
        (S::Succeeded, "succeeded"),
        (S::Cached, "cached"),
        (S::Failed, "failed"),
        (S::Skipped, "skipped"),
        (S::Cancelled, "cancelled"),
        (S::Running, "running"),
        (S::Queued, "queued"),
    ];
    let words: Vec<String> = states
        .iter()
        .filter_map(|&(state, word)| {
            let n = counts.get(&state).copied().unwrap_or(0);
            (n > 0).then(|| format!("{n} {word}"))
        })
        .collect();
    let total: usize = counts.values().sum();
    let jobs = if total == 1 { "1 job".to_owned() } else { format!("{total} jobs") };
    if words.is_empty() { jobs } else { format!("{jobs}: {}", words.join(", ")) }
}

/// `--logs`: what each job that ran in the build wrote, on standard error.
/// A log that cannot be had (its worker is gone, or no longer keeps it) is
/// said so, and changes nothing else.
async fn print_logs(http: &Http, base: &str, status: &BuildStatus) {
    use drover_proto::JobState;
    let ran = |j: &&drover_proto::JobStatus| {
        matches!(j.state, JobState::Succeeded | JobState::Failed)
            || (j.state == JobState::Cancelled && j.attempts > 0)
    };
    for job in status.jobs.iter().filter(ran) {
        let mut text = Vec::new();
        for stream in ["stdout", "stderr"] {
            let url = api(base, &format!("/v1/builds/{}/jobs/{}/log?stream={stream}", status.id, job.name));
            if let Err(e) = read_log(http, &url, &mut text).await {
                eprintln!(
                    "--- {} ({}): its log is not available: {} ---",
                    printable(&job.name),
                    job.state,
                    printable(&e.to_string())
                );
                text.clear();
                break;
            }
        }
        if !text.is_empty() {
            if !text.ends_with(b"\n") {
                text.push(b'\n');
            }
            eprint!("--- {} ({}) ---\n{}", printable(&job.name), job.state, String::from_utf8_lossy(&text));
        }
    }
}

/// Appends the log at `url` to `text`.
async fn read_log(http: &Http, url: &str, text: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut body = http.get_stream(url).await?;
    while let Some(chunk) = body.next().await {
        text.extend_from_slice(&chunk.context("the log stream broke")?);
    }
    Ok(())
}

/// Follows a build's events until it ends, showing progress.
async fn follow(http: &Http, base: &str, id: u64, from: u64, total: usize) -> Result<Ended, Failure> {
    let mut progress = Progress::new(id, total);
    let result = follow_events(http, base, id, from, |event| progress.event(event)).await;
    progress.clear();
    result
}

/// How a followed build ended: what its last `build_finished` event says.
pub(crate) struct Ended {
    /// The build's final state.
    pub(crate) state: BuildState,
    /// How many of its jobs ended in each state.
    pub(crate) counts: BTreeMap<JobState, usize>,
}

/// `GET /v1/builds/{id}`.
pub(crate) async fn build_status(http: &Http, base: &str, id: u64) -> Result<BuildStatus, Failure> {
    http.get_json(&api(base, &format!("/v1/builds/{id}"))).await.map_err(|e| match e.status() {
        Some(404) => no_build(&e, id, ""),
        _ => reach(base)(e),
    })
}

/// A 404 for build `id`: the coordinator's reason when it gives one (a
/// finished build it no longer keeps, see `[history]`), else "no build
/// ID" and `at`.
fn no_build(e: &HttpError, id: u64, at: &str) -> Failure {
    match e {
        HttpError::Status { message, .. } if message.contains("no longer kept") => {
            Failure::Usage(anyhow!("{message}"))
        }
        // No route there at all: not a drover coordinator's address.
        HttpError::Status { message, .. } if message.eq_ignore_ascii_case("not found") => {
            Failure::Usage(anyhow!(
                "{e}\nis that the address of a drover coordinator? (set --coordinator / DROVER_COORDINATOR)"
            ))
        }
        _ => Failure::Usage(anyhow!("no build {id}{at}")),
    }
}

/// How often following a build tries to reach its coordinator again, and
/// how long it waits between tries: about a minute in all.
const RECONNECTS: u32 = 120;
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// Follows a build's events from `from` until it ends, handing each to
/// `on_event`; reconnects (from the last event seen) when the stream
/// breaks. The coordinator closes the stream once the build is over, after
/// its `build_finished` event (a retried build has several: the last one
/// counts).
pub(crate) async fn follow_events(
    http: &Http,
    base: &str,
    id: u64,
    from: u64,
    mut on_event: impl FnMut(&BuildEvent),
) -> Result<Ended, Failure> {
    let mut next = from;
    let mut ended = None;
    let mut failures = 0u32;
    'outer: loop {
        let url = api(base, &format!("/v1/builds/{id}/events?from={next}"));
        let mut stream = match http.get_stream(&url).await {
            Ok(stream) => stream,
            Err(e) if e.status() == Some(404) => return Err(no_build(&e, id, &format!(" at {base}"))),
            Err(e) => {
                failures += 1;
                if failures > RECONNECTS {
                    return Err(Failure::Runtime(anyhow!(
                        "lost the coordinator while following build {id}: {e}; the build goes on \
                         without this client (`drover status {id} --watch` follows it again)"
                    )));
                }
                // Said once the first retry failed too: a restart of the
                // coordinator takes a moment.
                if failures == 2 {
                    eprintln!(
                        "drover: lost contact with the coordinator at {base} ({e}); retrying for up to a minute"
                    );
                }
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        if failures >= 2 {
            eprintln!("drover: reconnected to the coordinator; following build {id} again");
        }
        failures = 0;
        // Newline-delimited JSON: the lines of each chunk are read where
        // they lie, and only a partial last line is kept for the next.
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { continue 'outer };
            buf.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(len) = buf[start..].iter().position(|&b| b == b'\n') {
                let line = &buf[start..start + len];
                start += len + 1;
                let event: BuildEvent = serde_json::from_slice(line)
                    .with_context(|| format!("bad event from {url}"))
                    .map_err(Failure::Runtime)?;
                if event.seq < next {
                    continue;
                }
                next = event.seq + 1;
                on_event(&event);
                ended = match event.kind {
                    EventKind::BuildFinished { state, counts } => Some(Ended { state, counts }),
                    _ => None,
                };
            }
            buf.drain(..start);
        }
        if let Some(ended) = ended {
            return Ok(ended);
        }
        // The stream ended without the build's end: the coordinator went away.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Makes the `--out` directory before anything is submitted, so that a
/// path that cannot be one fails at once (exit code 2), not after the
/// build. An export replaces `out/<job>` for every job nothing depends on:
/// one of those that holds the build file, a source or `state` (the
/// embedded cluster's) is refused now, before it could be deleted.
fn prepare_out(args: &BuildArgs, loaded: &Loaded, state: Option<&Path>) -> Result<(), Failure> {
    let Some(out) = &args.out else { return Ok(()) };
    let usage = |what: String| Failure::Usage(anyhow!("--out {}: {what}", out.display()));
    std::fs::create_dir_all(out).map_err(|e| usage(format!("cannot make that directory: {e}")))?;
    let out = out.canonicalize().map_err(|e| usage(format!("{e}")))?;
    // What must survive an export, by the entry of `out` it is under.
    let mut kept: BTreeMap<std::ffi::OsString, String> = BTreeMap::new();
    let mut keep = |path: &Path, what: &str| {
        if let Some(std::path::Component::Normal(entry)) =
            path.strip_prefix(&out).ok().and_then(|rest| rest.components().next())
        {
            kept.entry(entry.to_owned()).or_insert_with(|| format!("{what} ({})", path.display()));
        }
    };
    let file = args.file.canonicalize().map_err(|e| usage(format!("{}: {e}", args.file.display())))?;
    keep(&file, "the build file");
    if let Some(state) = state.and_then(|s| s.canonicalize().ok()) {
        if out.starts_with(&state) {
            return Err(usage(format!(
                "that is inside drover's state directory ({}); choose another --out directory",
                state.display()
            )));
        }
        keep(&state, "drover's state directory");
    }
    if let Ok(root) = loaded.root.canonicalize() {
        for source in &loaded.spec.sources {
            keep(&root.join(&source.path), "a source of the build");
        }
    }
    let needed = loaded.needed();
    for job in loaded.spec.jobs.iter().filter(|j| !needed.contains(j.name.as_str())) {
        if job.name == EXPORTS {
            return Err(usage(format!(
                "job {EXPORTS} cannot be exported: drover keeps its list of exports under that name; rename the job"
            )));
        }
        if let Some(what) = kept.get(std::ffi::OsStr::new(&job.name)) {
            return Err(usage(format!(
                "exporting job {} would replace {}, which holds {what}; choose another --out directory",
                job.name,
                out.join(&job.name).display()
            )));
        }
    }
    Ok(())
}

/// A temporary directory for a cache of its own: removed on drop even when
/// it holds sealed, read-only artifacts, as `TempDir` alone would not for a
/// user other than root.
pub(crate) struct Scratch(tempfile::TempDir);

impl Scratch {
    pub(crate) fn new() -> Result<Scratch, Failure> {
        Ok(Scratch(tempfile::tempdir().context("a scratch directory")?))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = drover_cas::remove_tree(self.0.path());
    }
}

/// Copies the outputs of the jobs nothing depends on into `out/<job>/`.
/// The jobs, their names and IDs are the build file's, checked when it was
/// loaded, not what the coordinator says (a name like `../x` from a
/// coordinator, or from anything between it and us, must never choose
/// what is replaced on this disk), and every output is verified against
/// the digest of its tree.
async fn export(
    http: &Http,
    base: &str,
    (file, loaded, state): (&Path, &Loaded, Option<&Path>),
    status: &BuildStatus,
    out: &Path,
) -> Result<(), Failure> {
    let needed = loaded.needed();
    let known: BTreeSet<(&str, Hash32)> = status.jobs.iter().map(|j| (j.name.as_str(), j.id)).collect();
    for job in loaded.spec.jobs.iter().filter(|j| !needed.contains(j.name.as_str())) {
        if !known.contains(&(job.name.as_str(), job.id)) {
            return Err(Failure::Runtime(anyhow!(
                "cannot export the output of {}: the coordinator's build {} has no such job (was the build file \
                 changed since it was submitted?)",
                job.name,
                status.id
            )));
        }
        let location: ArtifactLocation = http
            .get_json(&api(base, &format!("/v1/artifacts/{}", job.id)))
            .await
            .map_err(anyhow::Error::from)?;
        if location.tree.is_none() {
            return Err(Failure::Runtime(anyhow!(
                "cannot export the output of {}: the coordinator knows of no copy of it (with the digest to \
                 verify it with)",
                job.name
            )));
        }
        let mut errors = Vec::new();
        let mut done = false;
        // The workers holding it, then the coordinator's shared cache (under
        // another job's key if its output is that job's, by early cutoff).
        let key = location.artifact.unwrap_or(job.id);
        let mut sources: Vec<(String, String)> =
            location.holders.iter().map(|h| (h.clone(), api(h, &format!("/v1/artifacts/{key}")))).collect();
        sources.push(("the shared cache".into(), api(base, &format!("/v1/cache/{key}"))));
        // Unpacked beside its place, then moved there whole: an export
        // cut short leaves the previous one (and this part, removed by the
        // next export). A job name has no `+`.
        let part = out.join(format!(".drover-part+{}", job.name));
        drover_cas::remove_tree(&part).with_context(|| format!("cannot remove {}", part.display()))?;
        let tree = location.tree.map(|t| drover_cas::Key(t.0));
        // Holders found gone (nothing listens at their address).
        let mut gone = Vec::new();
        for (i, (from, url)) in sources.iter().enumerate() {
            match http.get_artifact_into(url, part.clone(), tree).await {
                Ok(_) => {
                    done = true;
                    break;
                }
                Err(e) => {
                    let refused = matches!(e, HttpError::Connect { .. });
                    errors.push(format!("{from}: {:#}", anyhow::Error::from(e)));
                    if i < location.holders.len()
                        && refused
                        && http.report_unreachable(&api(base, "/v1/workers/unreachable"), from).await
                    {
                        gone.push(from.as_str());
                    }
                }
            }
        }
        if !done {
            let mut why =
                if errors.is_empty() { "no live worker holds it".into() } else { errors.join("; ") };
            if !gone.is_empty() {
                why.push_str(&format!(
                    ". The output was lost with its worker ({} no longer runs; the coordinator now knows): \
                     run the build again to build it again",
                    gone.join(", ")
                ));
            }
            return Err(Failure::Runtime(anyhow!("cannot export the output of {}: {why}", job.name)));
        }
        let dest = out.join(&job.name);
        if dest.exists() {
            std::fs::remove_dir_all(&dest).with_context(|| format!("cannot replace {}", dest.display()))?;
        }
        std::fs::rename(&part, &dest).with_context(|| format!("exporting to {}", dest.display()))?;
        eprintln!("{}: output in {}", job.name, dest.display());
    }
    let exported = loaded.spec.jobs.iter().map(|j| j.name.as_str()).filter(|name| !needed.contains(name));
    forget_stale_exports(out, &exported.collect(), (file, loaded, state))
}

/// The lists, in an `--out` directory, of the jobs drover exported there
/// last, one per build file: a line naming the build file (`# build file:
/// PATH`), then one job name per line.
const EXPORTS: &str = ".drover-exports";

/// Removes `out/<job>` for each job the previous export of the same build
/// file made there that this one did not (a job that something now
/// depends on, or that left the build file), then lists this export's
/// jobs: an export leaves no stale output beside the fresh ones. Only what
/// drover listed for this build file is removed (other build files'
/// exports into the same directory are left alone), and never a directory
/// that holds the build file, one of its sources or the state directory.
fn forget_stale_exports(
    out: &Path,
    exported: &BTreeSet<&str>,
    (file, loaded, state): (&Path, &Loaded, Option<&Path>),
) -> Result<(), Failure> {
    let state = state.and_then(|s| s.canonicalize().ok());
    let list = out.join(EXPORTS);
    let file = file.canonicalize().unwrap_or_else(|_| file.to_owned());
    let header = format!("# build file: {}", file.display());
    let text = std::fs::read_to_string(&list).unwrap_or_default();
    // Each build file's section, in the order they came.
    let mut sections: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        match (line.starts_with("# build file: "), sections.last_mut()) {
            (true, _) => sections.push((line, Vec::new())),
            (false, Some((_, names))) => names.push(line),
            (false, None) => {}
        }
    }
    let earlier = sections.iter().position(|(h, _)| *h == header).map(|i| sections.remove(i).1);
    let root = loaded.root.canonicalize().ok();
    let sources: Vec<std::path::PathBuf> = match &root {
        Some(root) => loaded.spec.sources.iter().map(|s| root.join(&s.path)).collect(),
        None => Vec::new(),
    };
    for name in earlier.unwrap_or_default() {
        let plain = !name.is_empty() && !name.starts_with('.') && !name.contains('/');
        if !plain || exported.contains(name) {
            continue;
        }
        let dir = out.join(name);
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let Ok(dir) = dir.canonicalize() else { continue };
        let holds_the_build = file.starts_with(&dir)
            || root.as_ref().is_some_and(|r| r.starts_with(&dir))
            || state.as_ref().is_some_and(|s| s.starts_with(&dir))
            || sources.iter().any(|s| s.starts_with(&dir));
        if holds_the_build {
            continue;
        }
        drover_cas::remove_tree(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
        eprintln!(
            "{name}: removed {}, an earlier export (the job's output is no longer exported)",
            dir.display()
        );
    }
    sections.push((&header, exported.iter().copied().collect()));
    let mut written = String::new();
    for (header, names) in sections {
        written.push_str(header);
        written.push('\n');
        for name in names {
            written.push_str(name);
            written.push('\n');
        }
    }
    std::fs::write(&list, written).with_context(|| format!("cannot write {}", list.display()))?;
    Ok(())
}

/// `drover submit`.
pub(crate) async fn submit(args: SubmitArgs) -> Result<(), Failure> {
    if !args.wait {
        let after_the_end =
            [("--out", args.build.out.is_some()), ("--json", args.build.json), ("--logs", args.build.logs)];
        if let Some((flag, _)) = after_the_end.iter().find(|(_, given)| *given) {
            return Err(Failure::Usage(anyhow!("{flag} needs --wait: it acts once the build has ended")));
        }
    }
    let loaded = load_excluding(&args.build.file, args.build.out.as_deref())?;
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let started = Instant::now();
    prepare_out(&args.build, &loaded, None)?;
    let options = Options { patient: args.wait, ..Options::from_args(&args.build) };
    let submitting = submit_loaded(&http, base, &loaded, &options);
    // With --wait, interrupts are caught from before the first request.
    let mut interrupts = if args.wait {
        Some(crate::cluster::Interrupts::new().context("cannot catch signals")?)
    } else {
        None
    };
    let id = if let Some(interrupts) = interrupts.as_mut() {
        // Interrupted before the build's ID is known, it still cancels
        // the build once the coordinator has it; a second interrupt quits
        // at once.
        tokio::pin!(submitting);
        tokio::select! {
            id = &mut submitting => id?,
            () = interrupts.next() => {
                eprintln!(
                    "drover: interrupted while submitting; the build is cancelled once it is submitted \
                     (interrupt again to quit now)"
                );
                let id = tokio::select! {
                    id = &mut submitting => id?,
                    () = interrupts.next() => return Err(Failure::Build),
                };
                eprintln!("drover: cancelling build {id}");
                cancel_build(&http, base, id).await?;
                return Err(Failure::Build);
            }
        }
    } else {
        submitting.await?
    };
    if !(args.wait && args.build.json) {
        outln!("{id}");
    }
    let Some(interrupts) = interrupts.as_mut() else { return Ok(()) };
    // Interrupted while it waits (Ctrl-C, or a CI runner stopping the
    // step), it cancels the build it started: what its jobs share with
    // other builds goes on for them.
    let ended = tokio::select! {
        ended = follow(&http, base, id, 0, loaded.spec.jobs.len()) => ended?,
        () = interrupts.next() => {
            eprintln!("drover: interrupted; cancelling build {id} (jobs it shares with other builds go on for them)");
            cancel_on_interrupt(&http, base, id, interrupts).await?;
            return Err(Failure::Build);
        }
    };
    // The build is over; an interrupt now stops what is left (an export,
    // the logs) and leaves the build as it ended.
    tokio::select! {
        done = finish(&http, base, id, (&loaded, None), &args.build, &ended, started) => done,
        () = interrupts.next() => {
            eprintln!("drover: interrupted; build {id} {} (what was left of its export or logs is stopped)", ended.state);
            Err(Failure::Build)
        }
    }
}

/// `drover status`.
pub(crate) async fn status(args: StatusArgs) -> Result<(), Failure> {
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let Some(id) = args.build else {
        // The filters of the listing.
        let wanted = |tenant: &str, state: BuildState| {
            args.tenant.as_deref().is_none_or(|t| t == tenant)
                && args.state.as_deref().is_none_or(|s| match s {
                    "active" => !state.is_final(),
                    s => state.to_string() == s,
                })
        };
        if args.json {
            // A page at a time (each a short query of the coordinator).
            let mut builds: Vec<BuildStatus> = Vec::new();
            loop {
                let after = builds.last().map_or(0, |b| b.id);
                let page: Vec<BuildStatus> = http
                    .get_json(&api(base, &format!("/v1/builds?after={after}")))
                    .await
                    .map_err(reach(base))?;
                if page.is_empty() {
                    break;
                }
                builds.extend(page);
            }
            builds.retain(|b| wanted(&b.tenant, b.state));
            outln!("{}", serde_json::to_string_pretty(&builds).map_err(anyhow::Error::from)?);
        } else {
            // The table needs counts, not every job of every build.
            let mut builds: Vec<drover_proto::BuildSummary> =
                http.get_json(&api(base, "/v1/builds?summary=true")).await.map_err(reach(base))?;
            let all = builds.len();
            builds.retain(|b| wanted(&b.tenant, b.state));
            if all == 0 {
                eprintln!("no builds yet");
            } else if builds.is_empty() {
                eprintln!("no build matches ({all} in all)");
            } else {
                outln!(
                    "{:>6}  {:<10} {:>5}/{:<5} {:<16} {}",
                    "BUILD",
                    "STATE",
                    "DONE",
                    "JOBS",
                    "TENANT",
                    "NAME"
                );
            }
            for b in &builds {
                outln!(
                    "{:>6}  {:<10} {:>5}/{:<5} {:<16} {}",
                    b.id,
                    b.state,
                    b.done,
                    b.jobs,
                    printable(&b.tenant),
                    printable(&b.name)
                );
            }
        }
        return Ok(());
    };
    let mut status = build_status(&http, base, id).await?;
    if args.events {
        let mut failed = None;
        let ended = follow_events(&http, base, id, 0, |event| match serde_json::to_string(event) {
            Ok(line) => outln!("{line}"),
            Err(e) => failed = Some(e),
        })
        .await?;
        if let Some(e) = failed {
            return Err(Failure::Runtime(e.into()));
        }
        return if ended.state == BuildState::Succeeded { Ok(()) } else { Err(Failure::Build) };
    }
    if args.watch {
        follow(&http, base, id, 0, status.jobs.len()).await?;
        status = build_status(&http, base, id).await?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&status).map_err(anyhow::Error::from)?);
    } else {
        // An older coordinator sends no queue.
        let queue = match status.queue.as_str() {
            "" => String::new(),
            queue => format!(", queue {}", printable(queue)),
        };
        outln!(
            "build {} ({}): {} (tenant {}{queue})",
            status.id,
            printable(&status.name),
            status.state,
            printable(&status.tenant)
        );
        for j in &status.jobs {
            for line in job_lines(j) {
                outln!("{line}");
            }
        }
    }
    if args.watch && status.state != BuildState::Succeeded {
        return Err(Failure::Build);
    }
    Ok(())
}

/// A job's lines in `drover status BUILD`: its state, worker, attempts and
/// exit code, then why it failed or waits, its live stage and the time it
/// spent in each.
fn job_lines(j: &drover_proto::JobStatus) -> Vec<String> {
    let worker = printable(j.worker.as_deref().unwrap_or("-"));
    let code = j.exit_code.map_or_else(|| "-".into(), |c| c.to_string());
    let mut lines = vec![format!(
        "  {:<24} {:<10} worker {:<12} attempts {} exit {}",
        printable(&j.name),
        j.state,
        worker,
        j.attempts,
        code
    )];
    lines.extend(j.detail.lines().map(|line| format!("      {}", printable(line))));
    if let Some(stage) = &j.stage {
        let waiting = if j.stage_waiting { ", waiting for its tokens" } else { "" };
        lines.push(format!("      stage {}{waiting}", printable(stage)));
    }
    if !j.stages.is_empty() {
        let stages: Vec<String> = ["pull", "fetch", "build", "wait"]
            .iter()
            .filter_map(|s| j.stages.get(*s).map(|ms| format!("{s} {ms} ms")))
            .collect();
        lines.push(format!("      {}", stages.join(", ")));
    }
    lines
}

/// `drover cancel`.
pub(crate) async fn cancel(args: CancelArgs) -> Result<(), Failure> {
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    // A build that has ended has nothing left to cancel: say how it ended
    // rather than claim a cancellation.
    let before = build_status(&http, base, args.build).await?;
    if before.state.is_final() {
        eprintln!("build {} had already ended ({}): nothing to cancel", args.build, before.state);
        return Ok(());
    }
    cancel_build(&http, base, args.build).await?;
    eprintln!("build {} cancelled", args.build);
    Ok(())
}

/// Cancels build `id` for an interrupted `submit --wait`: a coordinator
/// that cannot be reached (restarting, say) is tried again for about half
/// a minute, or until a second interrupt; a build left running says so,
/// and how to cancel it, rather than leaving it to hold its slots unseen.
async fn cancel_on_interrupt(
    http: &Http,
    base: &str,
    id: u64,
    interrupts: &mut crate::cluster::Interrupts,
) -> Result<(), Failure> {
    let url = api(base, &format!("/v1/builds/{id}/cancel"));
    let mut said = false;
    for _ in 0..CANCEL_TRIES {
        match http.post(&url).await {
            Ok(()) => return Ok(()),
            Err(e) if e.status() == Some(404) => return Err(no_build(&e, id, "")),
            // Refused for a reason a retry cannot mend (a token, say).
            Err(e) if e.status().is_some_and(|s| (400..500).contains(&s)) => return Err(reach(base)(e)),
            Err(e) => {
                if !std::mem::replace(&mut said, true) {
                    eprintln!(
                        "drover: cannot reach the coordinator to cancel build {id} ({e}); trying again for \
                         half a minute (interrupt again to stop)"
                    );
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_PAUSE) => {}
            () = interrupts.next() => break,
        }
    }
    Err(Failure::Runtime(anyhow!(
        "build {id} was NOT cancelled: it goes on once its coordinator is back; cancel it then with \
         `drover cancel {id} --coordinator {base}`"
    )))
}

/// Tries of [`cancel_on_interrupt`], [`RECONNECT_PAUSE`] apart.
const CANCEL_TRIES: u32 = 60;

/// Cancels build `id`.
async fn cancel_build(http: &Http, base: &str, id: u64) -> Result<(), Failure> {
    http.post(&api(base, &format!("/v1/builds/{id}/cancel"))).await.map_err(|e| match e.status() {
        Some(404) => no_build(&e, id, ""),
        _ => reach(base)(e),
    })
}

/// `drover suspend` and `drover resume`.
pub(crate) async fn suspend(args: SuspendArgs, resume: bool) -> Result<(), Failure> {
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let verb = if resume { "resume" } else { "suspend" };
    let mut path = format!("/v1/builds/{}/{verb}", args.build);
    if let Some(job) = &args.job {
        path.push_str(&format!("?job={}", url_escape(job)));
    }
    http.post(&api(base, &path)).await.map_err(|e| match e.status() {
        Some(404 | 409) => refused(e),
        _ => reach(base)(e),
    })?;
    let what = args.job.as_deref().map_or_else(|| format!("build {}", args.build), |j| format!("job {j}"));
    eprintln!("{what}: {}", if resume { "resumed" } else { "suspended" });
    Ok(())
}

/// Percent-encodes a query value.
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `drover retry`.
pub(crate) async fn retry(args: RetryArgs) -> Result<(), Failure> {
    if args.json && !args.wait {
        return Err(Failure::Usage(anyhow!("--json needs --wait: it acts once the build has ended")));
    }
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    // Follow from the end of the history as it is now.
    let before = build_status(&http, base, args.build).await?;
    let history = count_events(&http, base, args.build).await?;
    http.post(&api(base, &format!("/v1/builds/{}/retry", args.build))).await.map_err(|e| {
        match e.status() {
            Some(404 | 409) => refused(e),
            _ => reach(base)(e),
        }
    })?;
    eprintln!("build {} retried", args.build);
    if !args.wait {
        return Ok(());
    }
    let started = Instant::now();
    let ended = follow(&http, base, args.build, history, before.jobs.len()).await?;
    if args.json {
        let status = build_status(&http, base, args.build).await?;
        outln!("{}", serde_json::to_string_pretty(&status).map_err(anyhow::Error::from)?);
    }
    eprintln!(
        "build {} {} in {:.1}s: {}",
        args.build,
        ended.state,
        started.elapsed().as_secs_f64(),
        summary(&ended.counts)
    );
    if ended.state == BuildState::Succeeded { Ok(()) } else { Err(Failure::Build) }
}

/// How many events a finished build's history holds.
async fn count_events(http: &Http, base: &str, id: u64) -> Result<u64, Failure> {
    let mut count = 0;
    follow_events(http, base, id, 0, |_| count += 1).await?;
    Ok(count)
}

/// `drover workers`.
pub(crate) async fn workers(args: WorkersArgs) -> Result<(), Failure> {
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let mut workers: Vec<WorkerStatus> =
        http.get_json(&api(base, "/v1/workers")).await.map_err(reach(base))?;
    if !args.drain.is_empty() {
        // Every name found before any worker drains.
        let drained = args
            .drain
            .iter()
            .map(|name| {
                workers.iter().find(|w| w.alive && &w.name == name).ok_or_else(|| {
                    Failure::Usage(anyhow!("no live worker is named {name:?} (`drover workers` lists them)"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for w in drained {
            http.post(&api(base, &format!("/v1/workers/{}/drain", w.id))).await.map_err(reach(base))?;
            eprintln!(
                "worker {} drains: nothing new goes to it, its {} running job(s) finish; stop it once idle",
                w.name, w.running
            );
        }
        workers = http.get_json(&api(base, "/v1/workers")).await.map_err(reach(base))?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&workers).map_err(anyhow::Error::from)?);
        return Ok(());
    }
    if workers.is_empty() {
        eprintln!("no workers have registered");
        return Ok(());
    }
    let header = ["NAME", "STATE", "URL", "RUNNING", "CPU", "MEMORY", "TOKENS", "LABELS"].map(str::to_owned);
    let rows: Vec<[String; 8]> = std::iter::once(header).chain(workers.iter().map(worker_row)).collect();
    // Each column as wide as its widest cell (the last one is not padded).
    let mut widths = [0; 8];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{cell:<0$}  ", widths[i]));
            } else {
                line.push_str(cell);
            }
        }
        outln!("{line}");
    }
    Ok(())
}

/// A worker's row in `drover workers`, one word per cell (for `awk`).
fn worker_row(w: &WorkerStatus) -> [String; 8] {
    let labels: Vec<String> =
        w.labels.iter().map(|(k, v)| format!("{}={}", printable(k), printable(v))).collect();
    let tokens: Vec<String> =
        w.capacity.tokens.iter().map(|(k, n)| format!("{}={n}", printable(k))).collect();
    let state = if w.draining {
        "draining"
    } else if w.alive {
        "up"
    } else if w.left {
        "left"
    } else {
        "lost"
    };
    [
        printable(&w.name).into_owned(),
        state.to_owned(),
        printable(&w.url).into_owned(),
        format!("{}/{}", w.running, w.capacity.slots),
        format!("{}m", w.capacity.cpu_millis),
        // "23.5GiB", not "23.5 GiB".
        units::bytes(w.capacity.memory).replace(' ', ""),
        if tokens.is_empty() { "-".to_owned() } else { tokens.join(",") },
        if labels.is_empty() { "-".to_owned() } else { labels.join(",") },
    ]
}

/// `drover queues`.
pub(crate) async fn queues(args: QueuesArgs) -> Result<(), Failure> {
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let queues: Vec<QueueView> = http.get_json(&api(base, "/v1/queues")).await.map_err(reach(base))?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&queues).map_err(anyhow::Error::from)?);
        return Ok(());
    }
    let slots = |a: &QueueAmounts| {
        let s = format!("{:.2}", a.slots_milli as f64 / 1000.0);
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    outln!(
        "{:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "QUEUE",
        "WEIGHT",
        "CAP",
        "DESERVED",
        "HELD",
        "ASKED",
        "QUEUED",
        "RUNNING"
    );
    for (q, depth) in tree_order(&queues) {
        let name = format!("{}{}", "  ".repeat(depth), printable(&q.name));
        outln!(
            "{name:<20} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            q.weight,
            q.capability.as_ref().map_or("-".to_owned(), slots),
            slots(&q.deserved),
            slots(&q.allocated),
            slots(&q.pending),
            q.queued_jobs,
            q.running
        );
    }
    outln!("(slots; HELD by running jobs, ASKED by queued jobs)");
    Ok(())
}

/// The queues as a tree, depth first (each parent followed by its children,
/// siblings in the coordinator's order), with each one's depth. A queue
/// whose parent is not listed is taken as a root.
fn tree_order(queues: &[QueueView]) -> Vec<(&QueueView, usize)> {
    fn visit<'a>(
        queues: &'a [QueueView],
        q: &'a QueueView,
        depth: usize,
        out: &mut Vec<(&'a QueueView, usize)>,
    ) {
        out.push((q, depth));
        for child in queues.iter().filter(|c| c.parent.as_deref() == Some(q.name.as_str())) {
            // A cycle cannot come from a coordinator, which refuses one;
            // the depth bound keeps a bad answer from looping.
            if depth < queues.len() {
                visit(queues, child, depth + 1, out);
            }
        }
    }
    let mut out = Vec::with_capacity(queues.len());
    for root in
        queues.iter().filter(|q| q.parent.as_ref().is_none_or(|p| !queues.iter().any(|x| &x.name == p)))
    {
        visit(queues, root, 0, &mut out);
    }
    out
}

/// `drover logs`.
pub(crate) async fn logs(args: LogsArgs) -> Result<(), Failure> {
    use tokio::io::AsyncWriteExt;
    let http = connect(&args.remote);
    let base = &args.remote.coordinator;
    let stream = match (args.stage, args.stderr) {
        (LogStage::Build, false) => "stdout",
        (LogStage::Build, true) => "stderr",
        (_, true) => return Err(Failure::Usage(anyhow!("--stderr is for the build stage's log only"))),
        (LogStage::Pull, false) => "pull",
        (LogStage::Fetch, false) => "fetch",
        (LogStage::Push, false) => "push",
    };
    let follow = if args.follow { "&follow=true" } else { "" };
    let path = format!("/v1/builds/{}/jobs/{}/log?stream={stream}{follow}", args.build, args.job);
    let failed = |e: HttpError| match e.status() {
        Some(404) => refused(e),
        _ => reach(base)(e),
    };
    let mut stdout = tokio::io::stdout();
    // The attempt to read: the one asked for, or with --follow the rerun
    // that came after the run followed.
    let mut pinned = args.attempt;
    loop {
        let url = match pinned {
            Some(n) => api(base, &format!("{path}&attempt={n}")),
            None => api(base, &path),
        };
        let url = url.as_str();
        // With --follow, a job that has not started yet is waited for
        // (`submit` then `logs --follow` at once is the usual order), until
        // it starts or ends without running (skipped, cached, cancelled).
        let mut said = false;
        let mut body = loop {
            let e = match http.get_stream(url).await {
                Ok(body) => break body,
                Err(e) if args.follow && e.status() == Some(404) && e.to_string().contains("has not run") => {
                    e
                }
                Err(e) => return Err(failed(e)),
            };
            let status = build_status(&http, base, args.build).await?;
            let state = status.jobs.iter().find(|j| j.name == args.job).map(|j| j.state);
            if state.is_some_and(JobState::is_final) {
                // It may have run and ended since the first answer.
                match http.get_stream(url).await {
                    Ok(body) => break body,
                    Err(_) => {
                        let said = match e {
                            HttpError::Status { message, .. } => message,
                            other => other.to_string(),
                        };
                        let ended = state.map_or_else(String::new, |s| s.to_string());
                        let said = format!("{said}: it ended {ended} without running");
                        // A follow waited for the job and says how it
                        // ended, as when it ran: its exit code is the job's
                        // result, not a usage error.
                        if !args.follow {
                            return Err(Failure::Usage(anyhow!("{said}")));
                        }
                        eprintln!("drover: {said}");
                        return match state.is_some_and(JobState::is_success) {
                            true => Ok(()),
                            false => Err(Failure::Build),
                        };
                    }
                }
            }
            if !std::mem::replace(&mut said, true) {
                eprintln!(
                    "drover: job {} of build {} has not started yet; waiting for it",
                    args.job, args.build
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        // The attempt followed, to tell its end from the next one's, and to
        // take up that run's log, not a later one's, after a broken
        // connection.
        let followed = match args.follow {
            true => match pinned {
                Some(attempt) => Some(attempt),
                None => build_status(&http, base, args.build)
                    .await
                    .ok()
                    .and_then(|s| s.jobs.into_iter().find(|j| j.name == args.job))
                    .map(|j| j.attempts),
            },
            false => None,
        };
        let pin = pinned.is_none().then_some(followed).flatten();
        copy_log(&http, &args, url, &mut body, &mut stdout, (pin, followed)).await?;
        stdout.flush().await.map_err(crate::stdout_error)?;
        let Some(attempt) = followed else { return Ok(()) };
        // Followed to its end: say how the job stands, on standard error,
        // once the coordinator has the run's end (its report comes a
        // moment after the log ends); a job that runs again (a rerun on
        // failure, a lost worker's run) is followed into its next run.
        match run_ended(&http, base, &args, attempt).await {
            RunEnd::Again(next) => pinned = Some(next),
            RunEnd::Ended(state) if state.is_success() => return Ok(()),
            RunEnd::Ended(_) => return Err(Failure::Build),
            RunEnd::Unknown => return Ok(()),
        }
    }
}

/// How a followed run's job stands after the run.
enum RunEnd {
    /// The job ended in this state.
    Ended(JobState),
    /// The job runs again, as this attempt.
    Again(u32),
    /// The coordinator could not say.
    Unknown,
}

/// Waits for the coordinator to have the end of job `args.job`'s run
/// `attempt` (for up to a minute) and says on standard error how the job
/// stands: ended (in what state), or running again (then for as long as
/// it waits to, until that run has started).
async fn run_ended(http: &Http, base: &str, args: &LogsArgs, attempt: u32) -> RunEnd {
    let note = |text: String| {
        // Standard error may be closed by now: no panic for a note.
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("drover: {text}\n"));
    };
    let name = printable(&args.job);
    let mut again_said = false;
    // Polls while the coordinator still has the run going (its end comes a
    // moment after its log's).
    let mut running = 0;
    while running < 600 {
        let Ok(status) = build_status(http, base, args.build).await else { return RunEnd::Unknown };
        let Some(job) = status.jobs.into_iter().find(|j| j.name == args.job) else { return RunEnd::Unknown };
        // A later run started, and may have ended already.
        if job.attempts > attempt && (job.state == JobState::Running || job.state.is_final()) {
            if !again_said {
                note(format!("the run ended; job {name} ran again"));
            }
            note(format!("following job {name}'s attempt {}", job.attempts));
            return RunEnd::Again(job.attempts);
        }
        if job.state.is_final() {
            let code = job.exit_code.filter(|_| job.state == JobState::Failed);
            let code = code.map_or_else(String::new, |c| format!(" (exit code {c})"));
            match again_said {
                false => note(format!("the run ended; job {name} ended {}{code}", job.state)),
                true => note(format!("job {name} ended {}{code} without running again", job.state)),
            }
            return RunEnd::Ended(job.state);
        }
        if job.state == JobState::Running {
            running += 1;
        } else if !std::mem::replace(&mut again_said, true) {
            note(format!("the run ended; job {name} is {} again", job.state));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    RunEnd::Unknown
}

/// How often a follow tries to take up the log of a run whose job has
/// ended before it gives the rest up (its worker may be gone): about five
/// seconds, for a worker that re-registers after a restart.
const FINAL_RECONNECTS: u32 = 10;

/// Copies one run's log to `stdout` until it ends. With `--follow`, a
/// stream that breaks (the coordinator restarting) is taken up where it
/// was, for about a minute, pinned to `pin` when the URL is not; unless
/// the run followed (attempt `followed`) is over meanwhile (its worker
/// lost, the job running again elsewhere), which ends the copy.
async fn copy_log(
    http: &Http,
    args: &LogsArgs,
    url: &str,
    body: &mut drover_http::ByteStream,
    stdout: &mut tokio::io::Stdout,
    (pin, followed): (Option<u32>, Option<u32>),
) -> Result<(), Failure> {
    use tokio::io::AsyncWriteExt;
    // What was written so far: a follow whose connection breaks (the
    // coordinator restarting) takes up from there, for about a minute.
    let mut written = 0u64;
    let mut failures = 0u32;
    loop {
        let broke = loop {
            match body.next().await {
                None => break None,
                Some(Ok(chunk)) => {
                    failures = 0;
                    stdout.write_all(&chunk).await.map_err(crate::stdout_error)?;
                    written += chunk.len() as u64;
                }
                Some(Err(e)) => break Some(e.to_string()),
            }
        };
        let Some(mut why) = broke else { return Ok(()) };
        if !args.follow {
            return Err(Failure::Runtime(anyhow!(
                "the log stream broke off: its worker or the coordinator stopped answering \
                 (`drover status {}` says how the job stands): {why}",
                args.build
            )));
        }
        stdout.flush().await.map_err(crate::stdout_error)?;
        *body = loop {
            failures += 1;
            if failures > RECONNECTS {
                return Err(Failure::Runtime(anyhow!(
                    "the log stream broke off and could not be taken up again for a minute \
                     (`drover status {}` says how the job stands): {why}",
                    args.build
                )));
            }
            if failures == 2 {
                eprintln!("drover: the log stream broke off ({why}); trying again for up to a minute");
            }
            tokio::time::sleep(RECONNECT_PAUSE).await;
            let attempt = pin.map_or_else(String::new, |a| format!("&attempt={a}"));
            match http.get_stream(&format!("{url}{attempt}&from={written}")).await {
                Ok(body) => break body,
                Err(e) if e.status() == Some(404) => return Err(refused(e)),
                Err(e) => why = e.to_string(),
            }
            // The rest of the log cannot be had: the run may be over for
            // good, its worker lost, the job running again elsewhere, or
            // ended (then after a few more tries). A job queued again is
            // not yet that: a coordinator that restarted may show it so.
            if let Some(followed) = followed
                && let Ok(status) = build_status(http, &args.remote.coordinator, args.build).await
                && let Some(job) = status.jobs.iter().find(|j| j.name == args.job)
                // (An earlier attempt asked for by `--attempt` is
                // followed to its end, as long as its log can be had.)
                && ((args.attempt.is_none() && job.attempts > followed)
                    || (job.state.is_final() && failures >= FINAL_RECONNECTS))
            {
                eprintln!(
                    "drover: the rest of attempt {followed}'s log could not be had (its worker is gone): {why}"
                );
                return Ok(());
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `drover queues` draws the tree: each parent followed by its own
    /// children, whatever order the coordinator lists them in.
    #[test]
    fn queues_are_listed_as_a_tree() {
        let amounts = serde_json::json!({"slots_milli": 0, "cpu": 0, "memory": 0});
        let queue = |name: &str, parent: Option<&str>| -> QueueView {
            serde_json::from_value(serde_json::json!({
                "name": name, "parent": parent, "weight": 1, "priority": 0, "reclaimable": true,
                "capability": null, "guarantee": amounts, "deserved": amounts, "allocated": amounts,
                "pending": amounts, "queued_jobs": 0, "running": 0,
            }))
            .expect("queue view")
        };
        let queues = [
            queue("prod", None),
            queue("research", None),
            queue("prod-web", Some("prod")),
            queue("prod-batch", Some("prod")),
            queue("nightly", Some("prod-batch")),
        ];
        let drawn: Vec<(&str, usize)> =
            tree_order(&queues).into_iter().map(|(q, d)| (q.name.as_str(), d)).collect();
        assert_eq!(
            drawn,
            [("prod", 0), ("prod-web", 1), ("prod-batch", 1), ("nightly", 2), ("research", 0)],
            "children right under their parent"
        );
    }

    fn counts(states: &[JobState]) -> BTreeMap<JobState, usize> {
        let mut counts = BTreeMap::new();
        for &state in states {
            *counts.entry(state).or_insert(0) += 1;
        }
        counts
    }

    /// The closing line counts each state some job is in; a job that ran and
    /// failed is counted as failed only.
    #[test]
    fn the_summary_counts_the_states_jobs_are_in() {
        use JobState::*;
        let s = counts(&[Succeeded, Cached, Failed, Skipped, Succeeded, Cancelled]);
        assert_eq!(summary(&s), "6 jobs: 2 succeeded, 1 cached, 1 failed, 1 skipped, 1 cancelled");
        assert_eq!(summary(&counts(&[Cached])), "1 job: 1 cached");
        assert_eq!(summary(&counts(&[])), "0 jobs");
    }

    /// `drover status BUILD` shows a failed job's standard error line by
    /// line, and names line by line, with no control character of theirs
    /// reaching the terminal (a title-setting escape, a screen clear).
    #[test]
    fn status_lines_show_control_characters_escaped() {
        let job = drover_proto::JobStatus {
            name: "cc\u{1b}[2J".into(),
            id: Hash32([7; 32]),
            state: JobState::Failed,
            worker: Some("w1\n  fake  succeeded".into()),
            attempts: 1,
            exit_code: Some(1),
            detail: "exit code 1; stderr:\n\u{1b}]0;owned\u{7}main.c:3: error\r\n".into(),
            stages: BTreeMap::new(),
            stage: None,
            stage_waiting: false,
        };
        assert_eq!(
            job_lines(&job),
            [
                "  cc\\x1b[2J                failed     worker w1\\n  fake  succeeded attempts 1 exit 1",
                "      exit code 1; stderr:",
                "      \\x1b]0;owned\\x07main.c:3: error",
            ]
        );
    }

    /// `drover workers` shows a worker's name, URL, labels and tokens on
    /// its row, escaped.
    #[test]
    fn a_workers_row_shows_control_characters_escaped() {
        let worker = WorkerStatus {
            id: 1,
            name: "w\u{1b}]2;x\u{7}".into(),
            url: "http://h:1".into(),
            alive: true,
            left: false,
            draining: false,
            capacity: drover_proto::WorkerCapacity {
                slots: 2,
                cpu_millis: 2000,
                memory: 1 << 30,
                tokens: [("gpu\r".to_owned(), 1)].into(),
            },
            labels: [("pool".to_owned(), "big\u{1b}[2J".to_owned())].into(),
            running: 0,
        };
        let row = worker_row(&worker);
        assert!(row.iter().all(|cell| !cell.contains(|c: char| c.is_control())), "{row:?}");
        assert_eq!(row[0], "w\\x1b]2;x\\x07", "{row:?}");
        assert_eq!(row[6], "gpu\\r=1", "{row:?}");
        assert_eq!(row[7], "pool=big\\x1b[2J", "{row:?}");
    }
}
