//! The worker's HTTP API: `GET /v1/artifacts/{job}` streams an artifact in
//! the pack format to a peer (or a client exporting outputs), and
//! `GET /v1/runs/{run}/log?stream=stdout|stderr|pull|fetch|push` a run's
//! log: the build stage's standard output or error, or the log of another
//! stage (the coordinator proxies `drover logs` here). With a token configured, every
//! request must present it, or the clients' token when workers have one of
//! their own.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use drover_cas::Key;
use serde::Deserialize;

use crate::Shared;
use crate::job::StageLog;
use crate::tokens::Stage;

type Reply = Result<Response, (StatusCode, String)>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let api = Router::new()
        .route("/v1/artifacts/{job}", get(artifact))
        .route("/v1/runs/{run}/log", get(log))
        .layer(middleware::from_fn_with_state(shared.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(api)
        .fallback(not_a_coordinator)
        .layer(middleware::from_fn(drover_http::json_errors))
        .with_state(shared)
}

/// Any other path: most likely a client, or a worker, given this worker's
/// address for the coordinator's.
async fn not_a_coordinator(State(shared): State<Arc<Shared>>) -> (StatusCode, String) {
    let message = format!(
        "this is drover worker {:?}, not a coordinator: give the coordinator's address \
         (--coordinator or $DROVER_COORDINATOR)\n",
        shared.name
    );
    (StatusCode::NOT_FOUND, message)
}

/// A request presents the worker's own token (a peer's, the coordinator's),
/// or the clients' token when the cluster gives workers another one (a
/// client exporting outputs): the coordinator tells the worker its digest.
async fn require_token(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let readers = *shared.readers.lock().expect("readers");
    let allowed = drover_http::authorized(req.headers(), shared.config.token.as_deref())
        || readers.is_some_and(|digest| drover_http::authorized_by_digest(req.headers(), &digest));
    if !allowed {
        return (StatusCode::UNAUTHORIZED, format!("{}\n", drover_http::TOKEN_REQUIRED)).into_response();
    }
    next.run(req).await
}

async fn artifact(State(shared): State<Arc<Shared>>, Path(job): Path<String>) -> Reply {
    let key: Key = job.parse().map_err(|_| (StatusCode::BAD_REQUEST, format!("not a job ID: {job:?}")))?;
    // Pinned from now until it is sent: an eviction between this answer
    // and the packing would cut the stream short.
    let Some(artifact) = shared.cas.artifact(&key) else {
        return Err((StatusCode::NOT_FOUND, format!("no artifact {job} here")));
    };
    let cas = shared.cas.clone();
    let body = Body::from_stream(drover_http::write_stream(move |out| {
        // A failure cuts the stream short, which the reader rejects.
        if let Err(e) = cas.pack(artifact.key(), out) {
            tracing::warn!("serving artifact {key}: {e}");
        }
    }));
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

#[derive(Debug, Deserialize)]
struct LogQuery {
    #[serde(default)]
    stream: Option<String>,
    /// Keep the response open and send what the run writes until it ends.
    #[serde(default)]
    follow: bool,
    /// With `follow`: start at this byte of the log (a follower that lost
    /// its connection takes up where it was).
    #[serde(default)]
    from: u64,
}

/// How often a followed log is checked for new bytes.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A run's log: a file the build stage's supervisor writes, or another
/// stage's log (its file, then the lines the worker still holds).
#[derive(Clone, Copy)]
enum Source {
    Build(&'static str),
    Stage(Stage),
}

/// Bytes `from` on (at most `max`) of a run's log; none if it has none.
async fn read_log(shared: Arc<Shared>, run: u64, source: Source, from: u64, max: usize) -> Vec<u8> {
    let read = move || match source {
        Source::Build(name) => {
            use std::io::{Read, Seek};
            let path = shared.runs_dir().join(run.to_string()).join(name);
            let mut out = Vec::new();
            if let Ok(mut file) = std::fs::File::open(path)
                && file.seek(std::io::SeekFrom::Start(from)).is_ok()
            {
                let _ = file.take(max as u64).read_to_end(&mut out);
            }
            out
        }
        Source::Stage(stage) => StageLog { shared: &shared, run, stage }.read(from, max).unwrap_or_default(),
    };
    tokio::task::spawn_blocking(read).await.unwrap_or_default()
}

/// The log from byte `from`, then what the run writes, until the run ends
/// (then what is left).
fn follow_log(shared: Arc<Shared>, run: u64, source: Source, from: u64) -> Body {
    let state = (shared, from);
    let stream = futures::stream::unfold(state, move |(shared, offset)| async move {
        loop {
            // Read whether the run is still going before reading, so bytes
            // written just before it ended are not missed.
            let running = shared.runs.lock().expect("runs").contains_key(&run);
            let chunk = read_log(shared.clone(), run, source, offset, 1 << 20).await;
            if !chunk.is_empty() {
                let next = offset + chunk.len() as u64;
                return Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(chunk)), (shared, next)));
            }
            if !running {
                return None;
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
    });
    Body::from_stream(stream)
}

async fn log(State(shared): State<Arc<Shared>>, Path(run): Path<u64>, Query(q): Query<LogQuery>) -> Reply {
    let source = match q.stream.as_deref().unwrap_or("stdout") {
        "stdout" => Source::Build("stdout.log"),
        "stderr" => Source::Build("stderr.log"),
        "pull" => Source::Stage(Stage::Pull),
        "fetch" => Source::Stage(Stage::Fetch),
        "push" => Source::Stage(Stage::Push),
        other => {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("stream must be stdout, stderr, pull, fetch or push, not {other:?}"),
            ));
        }
    };
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    let unknown = || (StatusCode::NOT_FOUND, format!("no log for run {run} on this worker"));
    let name = match source {
        _ if q.follow => {
            if !shared.knows_run(run) {
                return Err(unknown());
            }
            return Ok((text, follow_log(shared.clone(), run, source, q.from)).into_response());
        }
        Source::Stage(_) if shared.knows_run(run) => {
            return Ok((text, read_log(shared.clone(), run, source, 0, usize::MAX).await).into_response());
        }
        Source::Stage(_) => return Err(unknown()),
        Source::Build(name) => name,
    };
    let path = shared.runs_dir().join(run.to_string()).join(name);
    let file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        // A run that printed nothing (yet) has no log file: that is an
        // empty log, if the run is running or kept.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && shared.knows_run(run) => {
            return Ok((text, "").into_response());
        }
        Err(_) => return Err(unknown()),
    };
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((text, body).into_response())
}
