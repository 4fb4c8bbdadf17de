//! The coordinator's HTTP API (JSON, one port): routes for clients and
//! workers, the bearer-token checks by role, size limits, and error bodies.
//!
//! Handlers are thin: they decode a request, hand an input or a query to the
//! state thread, and encode the answer. A malformed or hostile request gets a
//! 4xx with `{"error": ...}` and never reaches the state.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use drover_cas::{Cas, Key};
use drover_http::Http;
use drover_proto::{
    ArtifactLocation, BuildStatus, ErrorBody, Hash32, JobState, MissingReply, MissingRequest, PollReply,
    PollRequest, RegisterRequest, Report, SubmitReply, SubmitRequest, WorkerStatus,
};
use drover_solver::{Input, Reply, SolverError};
use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::specs::{Cached, SpecCache};
use crate::state::{Delivery, Follow, Live, Shared, Stopped, Update};

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub(crate) struct App {
    pub(crate) shared: Arc<Shared>,
    pub(crate) blobs: Arc<Cas>,
    /// The shared artifact cache.
    pub(crate) cache: Arc<Cas>,
    pub(crate) http: Http,
    pub(crate) tokens: Tokens,
    pub(crate) max_blob: u64,
    /// Decoded build specs, by content (see `specs.rs`).
    pub(crate) specs: Arc<SpecCache>,
    /// How often a polling worker's lease is renewed (a tenth of the lease).
    pub(crate) renew_every: Duration,
    /// Uploads (sources, pushed outputs) being written at once, each on a
    /// blocking thread: see [`MAX_UPLOADS`].
    pub(crate) uploads: Arc<tokio::sync::Semaphore>,
    /// How long an upload may go without a byte before it is dropped.
    pub(crate) upload_idle: Duration,
    /// MiB of JSON request bodies that may be read and decoded at once
    /// ([`JSON_IN_FLIGHT_MIB`]).
    pub(crate) json_room: Arc<tokio::sync::Semaphore>,
}

/// MiB of JSON request bodies read and decoded at once, all requests
/// together: a few clients sending the largest bodies at the same time
/// (each up to [`MAX_JSON`]) wait their turn instead of taking gigabytes.
/// A body without a declared length counts as the largest.
pub(crate) const JSON_IN_FLIGHT_MIB: usize = 512;

/// A JSON body below this many bytes takes no room among those in flight.
const SMALL_JSON: u64 = 64 << 10;

/// How long a JSON request waits for room among those in flight before it
/// is answered 503.
const JSON_ROOM_WAIT: Duration = Duration::from_secs(60);

/// Uploads written at once; more wait, holding no thread. Each reads its
/// body on a thread of the runtime's blocking pool, which also serves every
/// other file operation: slow uploads beyond this many cannot take it all.
pub(crate) const MAX_UPLOADS: usize = 32;

/// An upload's body as a reader for blocking code: at most `max` bytes, and
/// an error if `idle` passes without data (so that a stalled client does
/// not hold its thread for ever).
fn upload(body: Body, max: u64, idle: Duration) -> impl tokio::io::AsyncRead + Send + Unpin + 'static {
    let data = Box::pin(futures::TryStreamExt::map_err(body.into_data_stream(), std::io::Error::other));
    let chunks = futures::stream::unfold(
        (drover_http::idle_limited(data, idle), 0u64),
        move |(mut chunks, seen)| async move {
            let chunk = chunks.next().await?;
            let seen = seen + chunk.as_ref().map_or(0, |c| c.len() as u64);
            let chunk = match chunk {
                Ok(_) if seen > max => {
                    Err(std::io::Error::other(format!("larger than the limit of {max} bytes")))
                }
                other => other,
            };
            Some((chunk, (chunks, seen)))
        },
    );
    tokio_util::io::StreamReader::new(Box::pin(chunks))
}

/// A failed request.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

impl From<Stopped> for ApiError {
    fn from(_: Stopped) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, "the coordinator is stopping".into())
    }
}

impl From<SolverError> for ApiError {
    fn from(e: SolverError) -> Self {
        let status = match e {
            SolverError::UnknownBuild(_) | SolverError::UnknownWorker(_) | SolverError::UnknownJob { .. } => {
                StatusCode::NOT_FOUND
            }
            SolverError::InvalidBuild(_) => StatusCode::BAD_REQUEST,
            SolverError::CannotRetry(_) | SolverError::NotRunning(_) | SolverError::Settings(_) => {
                StatusCode::CONFLICT
            }
        };
        ApiError(status, e.to_string())
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

type ApiResult<T> = Result<T, ApiError>;

/// The largest JSON request (a build with many jobs and sources).
const MAX_JSON: usize = 256 << 20;

pub(crate) fn router(app: App) -> Router {
    // Each role's routes check the token first, then the request's size
    // (a request without the token learns nothing and takes no room).
    let guarded = |routes: Router<App>, role: Role| {
        routes
            .layer(DefaultBodyLimit::max(MAX_JSON))
            .layer(middleware::from_fn_with_state(app.clone(), declared_size))
            .layer(middleware::from_fn_with_state((app.clone(), role), require_token))
    };
    let for_clients = Router::new()
        .route("/v1/builds", post(submit).get(list_builds))
        .route("/v1/builds/{id}", get(build_status))
        .route("/v1/builds/{id}/events", get(build_events))
        .route("/v1/builds/{id}/cancel", post(cancel))
        .route("/v1/builds/{id}/retry", post(retry))
        .route("/v1/builds/{id}/suspend", post(suspend))
        .route("/v1/builds/{id}/resume", post(resume))
        .route("/v1/builds/{id}/jobs/{name}/log", get(job_log))
        .route("/v1/blobs/missing", post(missing))
        .route("/v1/blobs/{digest}", put(put_blob))
        .route("/v1/workers", get(workers))
        .route("/v1/queues", get(queues))
        .route("/metrics", get(metrics));
    // Leaving loses the worker's runs: only a worker (or the embedded
    // cluster, which has one token) may say it leaves.
    let for_workers = Router::new()
        .route("/v1/workers/register", post(register))
        .route("/v1/workers/{id}/poll", post(poll))
        .route("/v1/workers/{id}/report", post(report))
        .route("/v1/workers/{id}/leave", post(leave))
        .route("/v1/cache/{job}", put(put_cached));
    // Reading content by its digest or ID, a worker's draining (asked by
    // the worker itself or by an operator), and a worker found unreachable.
    let for_both = Router::new()
        .route("/v1/blobs/{digest}", get(get_blob))
        .route("/v1/artifacts/{job}", get(artifact_location))
        .route("/v1/cache/{job}", get(get_cached))
        .route("/v1/workers/{id}/drain", post(drain))
        .route("/v1/workers/unreachable", post(unreachable));
    let api = guarded(for_clients, Role::Client)
        .merge(guarded(for_workers, Role::Worker))
        .merge(guarded(for_both, Role::Either));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(api)
        .layer(middleware::from_fn(drover_http::json_errors))
        .with_state(app)
}

/// The `Content-Length` a request declares, if it declares one.
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// A JSON request (every `POST`) that declares a body over the limit is
/// refused at once (413), before its body is read or a `100 Continue` sent;
/// one within it waits for room among the JSON bodies in flight
/// ([`JSON_IN_FLIGHT_MIB`]), and holds it until it is answered.
async fn declared_size(State(app): State<App>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    // A request made in this process (the embedded cluster's) declares no
    // length, but its body knows its size.
    let declared =
        declared_length(req.headers()).or_else(|| axum::body::HttpBody::size_hint(req.body()).exact());
    if declared.is_some_and(|n| n > MAX_JSON as u64) {
        return ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a request body is at most {} MiB", MAX_JSON >> 20),
        )
        .into_response();
    }
    // Small bodies (a worker's poll or report, a cancel) cost little even
    // all at once, and a long poll holds its request for a while: only
    // larger ones take room.
    if declared.is_some_and(|n| n < SMALL_JSON) {
        return next.run(req).await;
    }
    let mib = declared.unwrap_or(MAX_JSON as u64).div_ceil(1 << 20).max(1) as u32;
    let room = tokio::time::timeout(JSON_ROOM_WAIT, app.json_room.clone().acquire_many_owned(mib)).await;
    let Ok(Ok(_room)) = room else {
        return ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is reading as many large requests as it takes at once; try again".into(),
        )
        .into_response();
    };
    next.run(req).await
}

/// The tokens the coordinator takes. Without a worker token, the one token
/// (if any) serves every role; with one, workers present it and clients
/// the other, and neither is taken for the other's routes.
#[derive(Clone, Debug)]
pub(crate) struct Tokens {
    clients: Option<String>,
    workers: Option<String>,
    /// Whether workers have a token of their own.
    separate: bool,
}

/// Who a route is for.
#[derive(Clone, Copy, Debug)]
enum Role {
    Client,
    Worker,
    Either,
}

impl Tokens {
    pub(crate) fn new(clients: Option<String>, workers: Option<String>) -> Tokens {
        let separate = workers.is_some();
        Tokens { workers: workers.or_else(|| clients.clone()), clients, separate }
    }

    /// What a worker checks the clients' token by when it does not hold it
    /// (see [`drover_proto::RegisterReply::readers`]).
    fn readers(&self) -> Option<Hash32> {
        self.clients.as_deref().filter(|_| self.separate).map(drover_http::token_digest)
    }

    fn authorized(&self, headers: &axum::http::HeaderMap, role: Role) -> bool {
        let client = || drover_http::authorized(headers, self.clients.as_deref());
        let worker = || drover_http::authorized(headers, self.workers.as_deref());
        match role {
            Role::Client => client(),
            Role::Worker => worker(),
            Role::Either => client() || worker(),
        }
    }
}

async fn require_token(State((app, role)): State<(App, Role)>, req: Request, next: Next) -> Response {
    if !app.tokens.authorized(req.headers(), role) {
        let message = match role {
            Role::Worker if app.tokens.separate => {
                "this is a worker's request: it needs the workers' token (`drover worker --token`, or \
                 DROVER_TOKEN in the worker's environment, set to the coordinator's --worker-token)"
            }
            _ => drover_http::TOKEN_REQUIRED,
        };
        return ApiError(StatusCode::UNAUTHORIZED, message.into()).into_response();
    }
    next.run(req).await
}

/// A JSON request body, taken as axum's `Json` takes it (the same checks and
/// the same rejections), but decoded without tracking where in the value the
/// decoder is unless the body is rejected: that tracking only serves the
/// error message, and slowed the decoding of every submission and report.
struct JsonBody<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = JsonRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, JsonRejection> {
        // Other content types (with parameters, `+json`, or not JSON) go
        // through `Json` whole.
        if req.headers().get(header::CONTENT_TYPE).is_none_or(|t| t != "application/json") {
            return Json::from_request(req, state).await.map(|Json(value)| JsonBody(value));
        }
        let bytes = Bytes::from_request(req, state).await?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Ok(JsonBody(value)),
            Err(_) => Json::from_bytes(&bytes).map(|Json(value)| JsonBody(value)),
        }
    }
}

fn parse_hash(s: &str) -> ApiResult<Hash32> {
    s.parse().map_err(|e: drover_proto::BadHash| bad(e.to_string()))
}

/// `POST /v1/builds`. A JSON body is read through the spec cache (see
/// `specs.rs`); anything else, or a body the cache cannot read, is decoded
/// (or refused) as every other body is.
async fn submit(State(app): State<App>, req: Request) -> Response {
    match read_submission(&app.specs, req).await {
        Ok((req, cached)) => accept(app, req, cached).await.into_response(),
        Err(rejection) => rejection,
    }
}

/// The request, and what the spec cache found out if it read it (`None`:
/// decoded the ordinary way, a spec no build holds).
async fn read_submission(
    specs: &SpecCache,
    req: Request,
) -> Result<(SubmitRequest, Option<Cached>), Response> {
    if req.headers().get(header::CONTENT_TYPE).is_none_or(|t| t != "application/json") {
        let JsonBody(req) = JsonBody::from_request(req, &()).await.map_err(IntoResponse::into_response)?;
        return Ok((req, None));
    }
    let body = Bytes::from_request(req, &()).await.map_err(IntoResponse::into_response)?;
    match specs.decode(&body) {
        Some((req, cached)) => Ok((req, Some(cached))),
        None => {
            let Json(req) = Json::from_bytes(&body).map_err(IntoResponse::into_response)?;
            Ok((req, None))
        }
    }
}

async fn accept(app: App, req: SubmitRequest, cached: Option<Cached>) -> ApiResult<Json<SubmitReply>> {
    crate::checks::submission(&req).map_err(bad)?;
    let mut missing = 0;
    for source in &req.build.sources {
        match app.blobs.blob_size(&Key(source.digest.0)) {
            None => missing += 1,
            // The size is shown to users and sums what workers fetch: it
            // must be the content's.
            Some(size) if size != source.size => {
                return Err(bad(format!(
                    "source {}: declared {} bytes, but its content (digest {}) has {size}",
                    source.path, source.size, source.digest
                )));
            }
            Some(_) => {}
        }
    }
    if missing > 0 {
        return Err(bad(format!("{missing} source file(s) were not uploaded; upload them first")));
    }
    // Job IDs are cache keys shared by every tenant: each is made again
    // from its job's content, once per spec (a spec already accepted, byte
    // for byte, was checked then).
    if cached.as_ref().is_none_or(|c| c.holder.is_none()) {
        let spec = req.build.clone();
        tokio::task::spawn_blocking(move || crate::checks::job_ids(&spec))
            .await
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
            .map_err(bad)?;
    }
    let spec = req.build.clone();
    // A spec no build can hold yet will be recorded whole: its record is
    // encoded here, off the state thread.
    let fresh = cached.as_ref().is_none_or(|c| c.fresh);
    let holder = cached.as_ref().and_then(|c| c.holder);
    match app.shared.submit(req, fresh, holder).await?? {
        Reply::Submitted(id) => {
            if let Some(cached) = cached {
                app.specs.accepted(&cached.digest, &spec, id);
            }
            Ok(Json(SubmitReply { id }))
        }
        other => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("unexpected reply {other:?}"))),
    }
}

/// `GET /metrics`: counts for a Prometheus scraper (see `metrics.rs`);
/// behind the token like every other route when one is configured.
async fn metrics(State(app): State<App>) -> ApiResult<Response> {
    let m = app.shared.query(|s| s.metrics()).await?;
    let page = crate::metrics::render(&m, &app.shared.log);
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], page).into_response())
}

/// `?summary=true`: each build without its jobs (see `BuildSummary`);
/// otherwise `?after=ID`: a page of whole statuses, those of the builds
/// after build `ID` (0: from the first) holding about [`PAGE_JOBS`] jobs.
#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    summary: bool,
    #[serde(default)]
    after: u64,
}

/// About how many jobs a page of whole build statuses holds: each page is
/// one short query of the state thread, however many builds are kept.
pub(crate) const PAGE_JOBS: usize = 20_000;

async fn list_builds(State(app): State<App>, Query(q): Query<ListQuery>) -> ApiResult<Response> {
    if q.summary {
        return Ok(Json(app.shared.query(|s| s.build_summaries()).await?).into_response());
    }
    let builds = app.shared.query(move |s| s.builds_page(q.after, PAGE_JOBS)).await?;
    Ok(Json(builds).into_response())
}

async fn build_status(State(app): State<App>, Path(id): Path<u64>) -> ApiResult<Json<BuildStatus>> {
    let stages = app.shared.stages();
    let status = app
        .shared
        .query(move |s| {
            let mut status = s.build_status(id)?;
            // Where each running job stands on its worker, if it said.
            for job in &mut status.jobs {
                if job.state == drover_proto::JobState::Running
                    && let Some((_, run)) = s.run_location(id, &job.name)
                    && let Some(note) = stages.get(&run)
                {
                    job.stage = Some(note.stage.clone());
                    job.stage_waiting = note.waiting;
                }
            }
            Some(status)
        })
        .await?;
    match status {
        Some(status) => Ok(Json(status)),
        None => Err(no_build(&app, id).await),
    }
}

/// 404 for a build it does not have: never accepted, or forgotten (it had
/// finished, and newer finished builds took its place).
async fn no_build(app: &App, id: u64) -> ApiError {
    let forgotten = app.shared.query(move |s| s.forgotten(id).then(|| s.keep_finished())).await;
    let why = match forgotten {
        Ok(Some(Some(keep))) => format!(
            "build {id} is no longer kept: the coordinator keeps the latest {keep} finished builds ([history] \
             keep_finished_builds)"
        ),
        _ => format!("no build {id}"),
    };
    ApiError(StatusCode::NOT_FOUND, why)
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default)]
    from: u64,
}

/// Shortest time between two chunks of a build's live events (a chunk with
/// the build's end goes out at once).
const EVENT_BATCH: Duration = Duration::from_millis(5);

/// Events per page of a long history: a stream that starts far behind
/// reads the build's history a page at a time, as its client takes them,
/// so that followers of a huge build's history (tens of megabytes of
/// events) do not each hold a copy of all of it, encoded, at once.
const HISTORY_PAGE: usize = 4_096;

/// The build's events as newline-delimited JSON: the history from `from`,
/// then live events until the build ends. Live events come from the state
/// thread as they happen (see `state::Followers`), at most one chunk per
/// [`EVENT_BATCH`].
async fn build_events(
    State(app): State<App>,
    Path(id): Path<u64>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Response> {
    if app.shared.query(move |s| s.event_count(id)).await?.is_none() {
        return Err(no_build(&app, id).await);
    }
    let start = EventStream { app, id, next: q.from, paging: true, follow: None, live: None, sent: None };
    let stream = futures::stream::try_unfold(start, |mut s| async move {
        Ok::<_, std::io::Error>(s.chunk().await?.map(|chunk| (chunk, s)))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response())
}

/// Where a client's event stream stands.
struct EventStream {
    app: App,
    id: u64,
    /// The next event the client needs.
    next: u64,
    /// A long history is still being sent a page at a time, each page read
    /// once the client took the one before (see [`HISTORY_PAGE`]).
    paging: bool,
    /// History not yet sent (at the start, and after following again).
    follow: Option<Follow>,
    live: Option<Live>,
    /// When the last chunk went out.
    sent: Option<Instant>,
}

impl EventStream {
    /// The next chunk of events; `None` once the build is over (after its
    /// last events) or the coordinator is stopping.
    async fn chunk(&mut self) -> Result<Option<Bytes>, std::io::Error> {
        loop {
            let (updates, finished) = if self.paging {
                let (id, from) = (self.id, self.next);
                let page = match self.app.shared.query(move |s| s.events_page(id, from, HISTORY_PAGE)).await {
                    Ok(Some(page)) => page,
                    Ok(None) | Err(Stopped) => return Ok(None),
                };
                if page.len() < HISTORY_PAGE {
                    // Near the end: the rest comes with the following.
                    self.paging = false;
                    match self.app.shared.follow(self.id, self.next).await {
                        Ok(Some(follow)) => self.follow = Some(follow),
                        Ok(None) | Err(Stopped) => return Ok(None),
                    }
                    continue;
                }
                (vec![Arc::new(Update { events: page, finished: false })], false)
            } else if let Some(follow) = self.follow.take() {
                self.live = follow.live;
                let history = Update { events: follow.history, finished: follow.finished };
                (vec![Arc::new(history)], follow.finished)
            } else if let Some(live) = &mut self.live {
                match live.recv().await {
                    Some(first) => {
                        let deadline = self.sent.map_or_else(Instant::now, |t| t + EVENT_BATCH);
                        gather(live, first, deadline).await
                    }
                    None => {
                        // Dropped for falling behind, or the state thread
                        // stopped: follow again from here.
                        match self.app.shared.follow(self.id, self.next).await {
                            Ok(Some(follow)) => self.follow = Some(follow),
                            Ok(None) | Err(Stopped) => return Ok(None),
                        }
                        continue;
                    }
                }
            } else {
                return Ok(None);
            };
            let count: usize = updates.iter().map(|u| u.events.len()).sum();
            let mut chunk = Vec::with_capacity(count * 128);
            for e in updates.iter().flat_map(|u| &u.events) {
                if e.seq < self.next {
                    continue;
                }
                serde_json::to_writer(&mut chunk, e).map_err(std::io::Error::other)?;
                chunk.push(b'\n');
                self.next = e.seq + 1;
            }
            if finished {
                self.live = None;
            }
            if !chunk.is_empty() || finished {
                self.sent = Some(Instant::now());
                return Ok(Some(Bytes::from(chunk)));
            }
        }
    }
}

/// `first` and the updates that follow it until `deadline` (those already
/// waiting if it passed), or until the build's end, which never waits. So
/// the events of a busy build go out at most once per [`EVENT_BATCH`], one
/// write and one read for all of them instead of one per turn of the state
/// thread. Returns the updates and whether the build is over.
async fn gather(live: &mut Live, first: Arc<Update>, deadline: Instant) -> (Vec<Arc<Update>>, bool) {
    let mut finished = first.finished;
    let mut updates = vec![first];
    // What already waits needs no timer; one timer then serves the wait
    // for the rest, however many updates come.
    while !finished && let Ok(more) = live.try_recv() {
        finished = more.finished;
        updates.push(more);
    }
    let until = tokio::time::sleep_until(deadline);
    tokio::pin!(until);
    while !finished {
        tokio::select! {
            biased;
            more = live.recv() => match more {
                Some(more) => {
                    finished = more.finished;
                    updates.push(more);
                }
                None => break,
            },
            () = &mut until => break,
        }
    }
    (updates, finished)
}

async fn cancel(State(app): State<App>, Path(id): Path<u64>) -> ApiResult<StatusCode> {
    app.shared.input(Input::Cancel { build: id }).await??;
    Ok(StatusCode::NO_CONTENT)
}

/// `?job=NAME`: one job instead of the whole build.
#[derive(Debug, Deserialize)]
struct JobQuery {
    job: Option<String>,
}

async fn suspend(
    State(app): State<App>,
    Path(id): Path<u64>,
    Query(q): Query<JobQuery>,
) -> ApiResult<StatusCode> {
    app.shared.input(Input::Suspend { build: id, job: q.job, resume: false }).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn resume(
    State(app): State<App>,
    Path(id): Path<u64>,
    Query(q): Query<JobQuery>,
) -> ApiResult<StatusCode> {
    app.shared.input(Input::Suspend { build: id, job: q.job, resume: true }).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn retry(State(app): State<App>, Path(id): Path<u64>) -> ApiResult<StatusCode> {
    app.shared.input(Input::Retry { build: id }).await??;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct LogQuery {
    #[serde(default = "default_stream")]
    stream: String,
    /// Stream what the job writes until it ends.
    #[serde(default)]
    follow: bool,
    /// With `follow`: from this byte of the log on (a follower taking up
    /// where its connection broke off).
    #[serde(default)]
    from: u64,
    /// The log of this attempt of the job (default: its latest run's).
    #[serde(default)]
    attempt: Option<u32>,
}

fn default_stream() -> String {
    "stdout".into()
}

async fn job_log(
    State(app): State<App>,
    Path((id, job)): Path<(u64, String)>,
    Query(q): Query<LogQuery>,
) -> ApiResult<Response> {
    if !["stdout", "stderr", "pull", "fetch", "push"].contains(&q.stream.as_str()) {
        return Err(bad("stream must be stdout or stderr (the build stage), pull, fetch or push"));
    }
    // Where it ran, if it did; only if not, whether the build has the job
    // (a status costs time linear in the build).
    let attempt = q.attempt;
    let (url, run) = app
        .shared
        .query(move |s| {
            if let Some(attempt) = attempt {
                match s.attempt_location(id, &job, attempt) {
                    Ok(Some(location)) => return Ok(location),
                    Err(attempts) if s.build_status(id).is_some_and(|b| b.jobs.iter().any(|j| j.name == job)) => {
                        return Err(match attempts.is_empty() {
                            true => format!("job {job} of build {id} has not run"),
                            false => format!(
                                "job {job} of build {id} has no attempt {attempt}; the attempts with logs are {}",
                                attempt_list(&attempts)
                            ),
                        });
                    }
                    // An unknown build or job, or a worker forgotten: said
                    // below as for the latest run.
                    _ => {}
                }
            } else if let Some(location) = s.run_location(id, &job) {
                return Ok(location);
            }
            let Some(status) = s.build_status(id) else { return Err(format!("no build {id}")) };
            Err(match status.jobs.into_iter().find(|j| j.name == job) {
                None => format!("build {id} has no job {job:?}"),
                Some(j) => match j.worker {
                    // It ran, on a worker the coordinator no longer knows.
                    Some(worker) => format!(
                        "job {job} of build {id} ran on worker {worker}, which was lost long ago and is forgotten"
                    ),
                    None => {
                        let why = match j.state {
                            JobState::Cached => match s.ran_in(id, &job) {
                                Some((other, name)) => format!(
                                    ": its result came from the cache, from job {name} of build {other} (`drover \
                                     logs {other} {name}` shows that run's log)"
                                ),
                                None => ": its result came from the cache, from an earlier run".into(),
                            },
                            JobState::Queued => " yet".into(),
                            _ => String::new(),
                        };
                        format!("job {job} of build {id} has not run{why}")
                    }
                },
            })
        })
        .await?
        .map_err(|message| ApiError(StatusCode::NOT_FOUND, message))?;
    let follow = match (q.follow, q.from) {
        (false, _) => String::new(),
        (true, 0) => "&follow=true".to_owned(),
        (true, from) => format!("&follow=true&from={from}"),
    };
    let unavailable = |e: drover_http::HttpError| match e.status() {
        // The worker answered: it has no log of that run.
        Some(404) => ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "its worker ({url}) has no log of run {run}: the run has not reached it yet, or is older \
                 than the logs a worker keeps (its latest 1,000 runs by default)"
            ),
        ),
        _ => ApiError(StatusCode::BAD_GATEWAY, format!("the log is on a worker that did not answer: {e}")),
    };
    let log = format!("{url}/v1/runs/{run}/log?stream={}{follow}", q.stream);
    let stream = app.http.get_stream(&log).await.map_err(unavailable)?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], Body::from_stream(stream)).into_response())
}

/// The attempts of a job's runs (oldest first), for people. A run evicted
/// by preemption or reclaim is not an attempt: the job's next run has the
/// same number, so one number may stand for several runs.
fn attempt_list(attempts: &[u32]) -> String {
    let mut had: Vec<(u32, usize)> = Vec::new();
    for &a in attempts {
        match had.last_mut() {
            Some((last, runs)) if *last == a => *runs += 1,
            _ => had.push((a, 1)),
        }
    }
    let listed: Vec<String> = had
        .iter()
        .map(|&(a, runs)| match runs {
            1 => a.to_string(),
            n => format!(
                "{a} ({n} runs: runs evicted for other jobs keep their attempt's number; the latest is shown)"
            ),
        })
        .collect();
    listed.join(", ")
}

async fn missing(State(app): State<App>, JsonBody(req): JsonBody<MissingRequest>) -> Json<MissingReply> {
    let missing = req.digests.into_iter().filter(|d| !app.blobs.has_blob(&Key(d.0))).collect();
    Json(MissingReply { missing })
}

async fn put_blob(
    State(app): State<App>,
    Path(digest): Path<String>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let digest = parse_hash(&digest)?;
    if declared_length(&headers).is_some_and(|n| n > app.max_blob) {
        return Err(ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("blob {digest}: a source file is at most {} bytes", app.max_blob),
        ));
    }
    let key = Key(digest.0);
    if app.blobs.has_blob(&key) {
        return Ok(StatusCode::NO_CONTENT);
    }
    let reader = upload(body, app.max_blob, app.upload_idle);
    let blobs = app.blobs.clone();
    let slot = app.uploads.clone().acquire_owned().await.map_err(|_| Stopped)?;
    let result = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let mut sync = tokio_util::io::SyncIoBridge::new(reader);
        blobs.put_blob(&mut sync, &key)
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match result {
        Ok(_) => Ok(StatusCode::CREATED),
        // The coordinator's own disk failed it (full, say): not the
        // client's doing, and worth trying again later.
        Err(drover_cas::CasError::Io { context, source }) if !is_upload_error(&source) => Err(ApiError(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("the coordinator cannot store blob {digest}: {context}: {source}"),
        )),
        Err(e) => Err(bad(format!("blob {digest} rejected: {e}"))),
    }
}

/// Whether an I/O error of a blob's upload came from reading the request
/// (a client that stalled or broke off), not from writing the blob down: a
/// full disk or quota, a file past the process's size limit, a read-only
/// or vanished directory.
fn is_upload_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{FileTooLarge, NotFound, QuotaExceeded, ReadOnlyFilesystem, StorageFull};
    !matches!(e.kind(), StorageFull | QuotaExceeded | FileTooLarge | ReadOnlyFilesystem | NotFound)
}

async fn get_blob(State(app): State<App>, Path(digest): Path<String>) -> ApiResult<Response> {
    let digest = parse_hash(&digest)?;
    let path = app
        .blobs
        .blob_path(&Key(digest.0))
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no blob {digest}")))?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| ApiError(StatusCode::NOT_FOUND, format!("blob {digest}: {e}")))?;
    let stream = tokio_util::io::ReaderStream::new(file);
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(stream)).into_response())
}

/// `PUT /v1/cache/{job}?run=N`: the run that made the output.
#[derive(Debug, Deserialize)]
struct PushQuery {
    run: Option<u64>,
}

/// `PUT /v1/cache/{job}`: a worker pushes an output, in the pack format.
/// Every file and the tree are verified as they arrive; an output already
/// here is read, verified and dropped (so concurrent pushes of one output
/// both succeed).
async fn put_cached(
    State(app): State<App>,
    Path(job): Path<String>,
    Query(q): Query<PushQuery>,
    body: Body,
) -> ApiResult<StatusCode> {
    let job = parse_hash(&job)?;
    // Only an output the cluster built is taken: from the run the job is
    // assigned to (its report may still be on its way), or with the tree
    // a worker reported for a successful run of it. Anything else under a
    // job's ID would be served to every build that needs the job.
    let (tree, assigned) = app
        .shared
        .query(move |s| (s.output_tree(job), q.run.and_then(|r| s.run_job(r)) == Some(job)))
        .await?;
    if tree.is_none() && !assigned {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "no run of job {job} is in flight or succeeded: only an output the cluster built is taken"
            ),
        ));
    }
    let reader = upload(body, u64::MAX, app.upload_idle);
    let cache = app.cache.clone();
    let slot = app.uploads.clone().acquire_owned().await.map_err(|_| Stopped)?;
    let result = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let mut sync = tokio_util::io::SyncIoBridge::new(reader);
        let info = cache.unpack(&Key(job.0), tree.map(|t| Key(t.0)).as_ref(), &mut sync);
        (info, cache.take_evicted())
    })
    .await
    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (info, evicted) = result;
    if !evicted.is_empty() {
        let jobs = evicted.into_iter().map(|k| Hash32(k.0)).collect();
        app.shared.input(Input::Uncached { jobs }).await??;
    }
    let info = info.map_err(|e| bad(format!("output {job} rejected: {e}")))?;
    app.shared.input(Input::Cached { job, tree: Hash32(info.tree.0) }).await??;
    Ok(StatusCode::CREATED)
}

/// `GET /v1/cache/{job}`: an output from the shared cache, in the pack
/// format. A stored file found damaged cuts the stream short (the reader
/// rejects it) and drops the output from the cache.
async fn get_cached(State(app): State<App>, Path(job): Path<String>) -> ApiResult<Response> {
    let job = parse_hash(&job)?;
    let key = Key(job.0);
    if app.cache.artifact_info(&key).is_none() {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("output {job} is not in the shared cache")));
    }
    let cache = app.cache.clone();
    let shared = app.shared.clone();
    let runtime = tokio::runtime::Handle::current();
    // Packed on a blocking thread, which a reader that stops reading holds
    // no longer than `drover_http::STALL_LIMIT`.
    let body = Body::from_stream(drover_http::write_stream(move |out| {
        if let Err(e) = cache.pack(&key, out) {
            tracing::warn!("serving cached output {key}: {e}");
        }
        let evicted: Vec<Hash32> = cache.take_evicted().into_iter().map(|k| Hash32(k.0)).collect();
        if !evicted.is_empty() {
            // Best effort: the solver then stops offering these.
            runtime.spawn(async move {
                let _ = shared.input(Input::Uncached { jobs: evicted }).await;
            });
        }
    }));
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

async fn artifact_location(
    State(app): State<App>,
    Path(job): Path<String>,
) -> ApiResult<Json<ArtifactLocation>> {
    let job = parse_hash(&job)?;
    let (holders, tree, artifact) = app
        .shared
        .query(move |s| (s.artifact_holders(job), s.output_tree(job), s.artifact_alias(job)))
        .await?;
    Ok(Json(ArtifactLocation { tree, holders, artifact }))
}

async fn workers(State(app): State<App>) -> ApiResult<Json<Vec<WorkerStatus>>> {
    Ok(Json(app.shared.query(|s| s.workers()).await?))
}

async fn queues(State(app): State<App>) -> ApiResult<Json<Vec<drover_proto::QueueView>>> {
    Ok(Json(app.shared.query(|s| s.queues()).await?))
}

async fn register(
    State(app): State<App>,
    JsonBody(req): JsonBody<RegisterRequest>,
) -> ApiResult<Json<drover_proto::RegisterReply>> {
    crate::checks::registration(&req).map_err(bad)?;
    // Two workers under one name would act as one (each reporting for the
    // other's runs, each taking the other's mail): a live worker's name is
    // only for that worker again (at its URL, as after a restart of either
    // side). Another must wait for its lease to run out. (Nothing tells a
    // worker restarted on another port from another worker of the same
    // name whose address the coordinator cannot reach, so the address is
    // not tried here: two such workers would knock each other out in turn.)
    let name = req.name.clone();
    let holder = app.shared.query(move |s| s.live_worker_url(&name).map(str::to_owned)).await?;
    if let Some(url) = holder
        && url != req.url
    {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "a live worker named {:?} is at {url}: give each worker its own --name (this one is at {}); \
                 the name is free again once that worker leaves or its lease runs out",
                req.name, req.url
            ),
        ));
    }
    match app.shared.input(Input::Register(req)).await?? {
        // The new session's mailbox is open (and mail for the old one void)
        // by now: the state thread carried out the registration's effects
        // before answering.
        Reply::Registered(reply) => {
            Ok(Json(drover_proto::RegisterReply { readers: app.tokens.readers(), ..reply }))
        }
        other => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("unexpected reply {other:?}"))),
    }
}

/// The longest a poll is held open.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// The worker must register (again): it has no session with this process.
fn reregister() -> Json<PollReply> {
    Json(PollReply { reregister: true, ..PollReply::default() })
}

/// The long poll, also the heartbeat: answers as soon as there is mail (or
/// its version, for a `notify_only` poll), else after `wait_ms`.
/// `POST /v1/workers/{id}/leave`: the worker is shutting down. It is lost
/// at once, not when its lease runs out, so its runs go back to the queues
/// now; to work again it registers again.
async fn leave(State(app): State<App>, Path(id): Path<u64>) -> ApiResult<StatusCode> {
    app.shared.input(Input::Leave { worker: id }).await??;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/workers/unreachable`: a client or worker could not connect to
/// the live worker at a URL. The coordinator tries too, and if the
/// connection is refused (nothing listens there: the worker's process is
/// gone) it takes the worker as lost now, as after a missed lease, instead of
/// when its lease runs out: what it held is built again, its runs go
/// elsewhere. A worker that is only slow, or stopped, still takes the
/// connection, and keeps its lease.
async fn unreachable(
    State(app): State<App>,
    JsonBody(req): JsonBody<drover_proto::UnreachableRequest>,
) -> ApiResult<Json<drover_proto::UnreachableReply>> {
    let url = req.url.clone();
    let Some(id) = app.shared.query(move |s| s.live_worker_at(&url)).await? else {
        return Ok(Json(drover_proto::UnreachableReply { lost: false }));
    };
    let lost =
        crate::watchdog::lose_if_gone(&app.shared, id, &req.url, "a client or worker could not reach it")
            .await?;
    Ok(Json(drover_proto::UnreachableReply { lost }))
}

/// `POST /v1/workers/{id}/drain`: the worker shuts down once its runs end;
/// nothing new goes to it until it registers again.
async fn drain(State(app): State<App>, Path(id): Path<u64>) -> ApiResult<StatusCode> {
    app.shared.input(Input::Drain { worker: id }).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn poll(
    State(app): State<App>,
    Path(id): Path<u64>,
    JsonBody(req): JsonBody<PollRequest>,
) -> ApiResult<Json<PollReply>> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_WAIT);
    let Some((notify, true)) = app.shared.mailbox(id, |mb| (mb.notify.clone(), mb.open())) else {
        return Ok(reregister());
    };
    if app.shared.renewal_due(id, app.renew_every)
        && app.shared.input(Input::Poll { worker: id }).await?? == Reply::Reregister
    {
        return Ok(reregister());
    }
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let answer = app.shared.mailbox(id, |mb| {
            if !mb.open() {
                Some(PollReply { reregister: true, ..PollReply::default() })
            } else if req.notify_only {
                let mail = mb.waiting().filter(|&version| version > req.seen)?;
                Some(PollReply { mail, ..PollReply::default() })
            } else {
                mb.has_mail().then(|| mb.take(None))
            }
        });
        match answer {
            Some(Some(answer)) => return Ok(Json(answer)),
            None => return Ok(reregister()),
            Some(None) => {}
        }
        // Woken for mail a report took meanwhile: wait on.
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Ok(Json(PollReply::default()));
        }
    }
}

/// A worker's report: recorded (unless it holds only display notes), and
/// answered with the worker's mail if it asks (`Report::deliver`).
async fn report(
    State(app): State<App>,
    Path(id): Path<u64>,
    JsonBody(mut report): JsonBody<Report>,
) -> ApiResult<Json<PollReply>> {
    let deliver = Delivery { take: std::mem::take(&mut report.deliver), received: report.received.take() };
    let stages = std::mem::take(&mut report.stages);
    if app.shared.mailbox(id, |mb| mb.open()) != Some(true) {
        // Kept by the worker, and sent again once it has registered.
        return Ok(reregister());
    }
    // Stages are display only: kept aside, not recorded; only those of a
    // worker with a session, and only short names (a stage is a word).
    let stages = stages.into_iter().filter(|n| n.stage.len() <= 32 && !n.stage.contains(char::is_control));
    app.shared.note_stages(stages.collect(), &report.finished);
    if report == Report::default() {
        // Nothing to record: a worker taking its mail, or stage notes.
        let answer = if deliver.take {
            match app.shared.mailbox(id, |mb| mb.take(deliver.received)) {
                Some(mail) => mail,
                None => return Ok(reregister()),
            }
        } else {
            PollReply::default()
        };
        return Ok(Json(answer));
    }
    Ok(Json(app.shared.report(id, report, deliver).await?))
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use drover_proto::PollRequest;

    use super::*;

    fn request(content_type: Option<&str>, body: &str) -> Request {
        let mut req = Request::builder().method("POST").uri("/");
        if let Some(t) = content_type {
            req = req.header(header::CONTENT_TYPE, t);
        }
        req.body(Body::from(body.to_owned())).expect("request")
    }

    /// What a handler's client would see: the status and body of the
    /// rejection, or the decoded value.
    async fn outcome<T>(result: Result<T, JsonRejection>) -> Result<T, (StatusCode, Bytes)> {
        match result {
            Ok(value) => Ok(value),
            Err(rejection) => {
                let response = rejection.into_response();
                let status = response.status();
                Err((status, to_bytes(response.into_body(), usize::MAX).await.expect("body")))
            }
        }
    }

    fn update(seq: u64, finished: bool) -> Arc<Update> {
        let kind = drover_proto::EventKind::JobQueued { job: format!("j{seq}") };
        Arc::new(Update { events: vec![drover_proto::BuildEvent { seq, at: 0, kind }], finished })
    }

    fn seqs(updates: &[Arc<Update>]) -> Vec<u64> {
        updates.iter().flat_map(|u| u.events.iter().map(|e| e.seq)).collect()
    }

    /// Updates that come before the deadline join the chunk; later ones
    /// wait for the next. (Tokio's paused clock: no real time passes.)
    #[tokio::test(start_paused = true)]
    async fn events_gather_until_the_deadline() {
        let (tx, mut live) = tokio::sync::mpsc::channel(8);
        let start = Instant::now();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(EVENT_BATCH / 2).await;
            tx.send(update(1, false)).await.expect("send");
            tokio::time::sleep(EVENT_BATCH).await;
            tx.send(update(2, false)).await.expect("send");
            tx.send(update(3, false)).await.expect("send");
        });
        let (updates, finished) = gather(&mut live, update(0, false), start + EVENT_BATCH).await;
        assert_eq!((seqs(&updates), finished), (vec![0, 1], false));
        sender.await.expect("sender");
        // Past its deadline, a chunk takes what waits and goes at once.
        let first = live.recv().await.expect("update 2");
        let (updates, finished) = gather(&mut live, first, start).await;
        assert_eq!((seqs(&updates), finished), (vec![2, 3], false));
    }

    /// The build's end goes out at once, with what came before it.
    #[tokio::test(start_paused = true)]
    async fn the_builds_end_does_not_wait_for_the_deadline() {
        let (tx, mut live) = tokio::sync::mpsc::channel(8);
        tx.send(update(1, false)).await.expect("send");
        tx.send(update(2, true)).await.expect("send");
        let deadline = Instant::now() + Duration::from_secs(3600);
        let (updates, finished) = gather(&mut live, update(0, false), deadline).await;
        assert_eq!((seqs(&updates), finished), (vec![0, 1, 2], true));
        assert!(Instant::now() < deadline, "it did not wait");
    }

    /// A submission is read as `Json` reads it, through the spec cache or
    /// not, and refused with the same status and message.
    #[tokio::test]
    async fn a_submission_is_taken_and_refused_as_json_does() {
        let good = r#"{"build": {"name": "b", "sources": [], "jobs": [{"name": "a", "id": "0101010101010101010101010101010101010101010101010101010101010101", "commands": ["true"]}]}, "tenant": "t", "no_cache": false}"#;
        let cases = [
            (Some("application/json"), good),
            (Some("application/json"), good),
            (Some("application/json; charset=utf-8"), good),
            (Some("application/json"), r#"{"build": {"name": "b"}, "tenant": "t", "no_cache": false}"#),
            (
                Some("application/json"),
                r#"{"build": {"name": "b", "sources": [], "jobs": []}, "tenant": "t"}"#,
            ),
            (Some("application/json"), r#"{"build": "#),
            (Some("text/plain"), good),
            (None, good),
        ];
        let specs = SpecCache::default();
        // Only the first good body read through the cache is fresh; one
        // decoded the ordinary way always is.
        let mut seen = std::collections::BTreeSet::new();
        let mut held = Vec::new();
        for (content_type, body) in cases {
            let ours = read_submission(&specs, request(content_type, body)).await;
            let axum = Json::<SubmitRequest>::from_request(request(content_type, body), &()).await;
            match (ours, outcome(axum.map(|Json(v)| v)).await) {
                (Ok((req, cached)), Ok(expected)) => {
                    assert_eq!(req, expected, "{content_type:?} {body}");
                    assert!(cached.as_ref().is_none_or(|c| c.holder.is_none()), "no build was accepted");
                    let fresh = cached.as_ref().is_none_or(|c| c.fresh);
                    assert_eq!(fresh, seen.insert(content_type), "{content_type:?} {body}");
                    // Held, as a build would hold it: the cache keeps specs
                    // only while something does.
                    held.push(req);
                }
                (Err(response), Err(expected)) => {
                    let status = response.status();
                    let text = to_bytes(response.into_body(), usize::MAX).await.expect("body");
                    assert_eq!((status, text), expected, "{content_type:?} {body}");
                }
                (ours, axum) => panic!("{content_type:?} {body}: {:?} against {axum:?}", ours.map(|r| r.0)),
            }
        }
    }

    /// `JsonBody` accepts what `Json` accepts and rejects what it rejects,
    /// with the same status and message.
    #[tokio::test]
    async fn json_body_takes_and_refuses_what_json_does() {
        let cases = [
            (Some("application/json"), r#"{"wait_ms": 5, "seen": 2}"#),
            (Some("application/json; charset=utf-8"), r#"{"wait_ms": 5}"#),
            (Some("application/json"), r#"{"wait_ms": "soon"}"#),
            (Some("application/json"), r#"{"wait_ms": 5"#),
            (Some("application/json"), r#"{"wait_ms": 5} trailing"#),
            (Some("text/plain"), r#"{"wait_ms": 5}"#),
            (None, r#"{"wait_ms": 5}"#),
        ];
        let taken = JsonBody::<PollRequest>::from_request(request(cases[0].0, cases[0].1), &()).await;
        assert!(taken.is_ok_and(|JsonBody(req)| req.wait_ms == 5 && req.seen == 2));
        for (content_type, body) in cases {
            let ours = JsonBody::<PollRequest>::from_request(request(content_type, body), &()).await;
            let axum = Json::<PollRequest>::from_request(request(content_type, body), &()).await;
            assert_eq!(
                outcome(ours.map(|JsonBody(v)| v)).await,
                outcome(axum.map(|Json(v)| v)).await,
                "{content_type:?} {body}"
            );
        }
    }

    /// Runs that share an attempt's number (evictions) are listed once,
    /// with how many there were.
    #[test]
    fn attempts_sharing_a_number_are_listed_once() {
        assert_eq!(attempt_list(&[1, 2, 3]), "1, 2, 3");
        assert_eq!(
            attempt_list(&[1, 1, 1, 2]),
            "1 (3 runs: runs evicted for other jobs keep their attempt's number; the latest is shown), 2"
        );
    }
}
