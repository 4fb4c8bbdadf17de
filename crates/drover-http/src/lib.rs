//! drover's HTTP/JSON client: a thin layer over hyper that adds the bearer
//! token, JSON bodies, readable errors (the server's `{"error": ...}` body),
//! time limits, and streaming downloads and uploads (artifacts straight
//! into a content-addressed store; bodies written or read by blocking code,
//! in bounded chunks).
//!
//! **In-process requests.** A client made [`Http::with_local`] hands the
//! requests for one base URL (an embedded coordinator's) straight to that
//! server's router in this process: the same handlers, middleware, bodies
//! and answers, without the socket, the HTTP/1 encoding and parsing on
//! both sides, or the hand-offs between their tasks.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use drover_proto::Hash32;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, BodyStream, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::AsyncRead;

type Body = BoxBody<Bytes, std::io::Error>;
/// An answer's body, from the network or from a router in this process.
type Answer = hyper::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

/// A failed request.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The server could not be reached or the connection broke.
    #[error("cannot reach {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The server answered with an error status.
    #[error("{url}: {status}: {message}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The server's explanation.
        message: String,
    },
    /// The request took longer than its limit.
    #[error("{url}: no answer within {secs}s")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        secs: u64,
    },
    /// The answer was not what was expected.
    #[error("{url}: bad response: {message}")]
    Decode {
        /// The URL.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// A downloaded artifact was refused by the store (a digest mismatch,
    /// a cut-short stream, an unsafe path, a full store).
    #[error("{url}: {source}")]
    Artifact {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: drover_cas::CasError,
    },
    /// The URL (or the token) cannot make a request: not `http://` (the
    /// client has no TLS), no host, characters a URL or header cannot hold.
    #[error("{url}: not a usable URL: {message}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// A local file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl HttpError {
    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// What a server answers a request without the cluster's token.
pub const TOKEN_REQUIRED: &str = "a valid token is required (--token or DROVER_TOKEN)";

/// Whether a request's headers carry `Bearer <token>` (always true when no
/// token is configured). Shared by the coordinator's and the workers'
/// servers, so both check tokens alike. The scheme's name is matched in any
/// case (RFC 9110); the token is compared in time that does not depend on
/// where it first differs, so that answers cannot be timed to guess it.
pub fn authorized(headers: &hyper::HeaderMap, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    bearer(headers).is_some_and(|presented| same_secret(presented.as_bytes(), token.as_bytes()))
}

/// The token a request presents as `Bearer <token>`, if any.
fn bearer(headers: &hyper::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, presented) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| presented.trim_start())
}

/// What a server that must accept a token without holding it checks it
/// by: a worker learns the digest of the clients' token from the
/// coordinator when the cluster gives workers a token of their own.
pub fn token_digest(token: &str) -> Hash32 {
    Hash32(blake3::derive_key("drover 2026-11 client token", token.as_bytes()))
}

/// Whether a request presents a token whose [`token_digest`] is `digest`.
pub fn authorized_by_digest(headers: &hyper::HeaderMap, digest: &Hash32) -> bool {
    bearer(headers).is_some_and(|presented| same_secret(&token_digest(presented).0, &digest.0))
}

/// `a == b`, looking at every byte whatever the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A streamed response body.
pub type ByteStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// Bytes per chunk of a body written by blocking code ([`write_stream`]).
const WRITE_CHUNK: usize = 1 << 20;
/// Chunks of such a body waiting for the connection, at most: with the one
/// being filled and the one being sent, a body holds at most 6 MiB.
const WRITE_QUEUE: usize = 4;

/// How long the producer of a [`write_stream`] body waits for its reader
/// to take a chunk before it takes the reader for gone: its writes then
/// fail (`TimedOut`), and its blocking thread is free again. A peer that
/// stops reading an artifact it asked for holds no thread for longer.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// [`write_stream`] bodies being produced at once in a process, at most
/// (each holds a blocking thread and up to 6 MiB): more wait their turn,
/// holding neither. A reader waits for a turn at most about
/// [`STALL_LIMIT`], however its peers behave (see [`Http::get_artifact`]).
const MAX_PRODUCERS: usize = 64;

/// The turns of [`MAX_PRODUCERS`].
static PRODUCERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_PRODUCERS);

/// A body written by `produce` on a blocking thread (an artifact being
/// packed, say), sent in chunks of 1 MiB that move to the connection
/// without another copy. Memory stays bounded: `produce` blocks while
/// [`WRITE_QUEUE`] chunks wait, at most [`MAX_PRODUCERS`] bodies are
/// produced at once (the others wait for a turn before they start), and a
/// reader that takes nothing for [`STALL_LIMIT`] is given up on. If the
/// body is dropped (the peer went away), its writes fail with
/// `BrokenPipe`. The body ends when `produce` returns, whatever it wrote: a
/// producer that fails leaves a short body, which the reader of a pack
/// rejects. Call from within a Tokio runtime.
pub fn write_stream(produce: impl FnOnce(&mut dyn std::io::Write) + Send + 'static) -> ByteStream {
    write_stream_with(STALL_LIMIT, produce)
}

/// [`write_stream`] with another stall limit.
fn write_stream_with(
    stall: Duration,
    produce: impl FnOnce(&mut dyn std::io::Write) + Send + 'static,
) -> ByteStream {
    let (tx, mut rx) = tokio::sync::mpsc::channel(WRITE_QUEUE);
    let runtime = tokio::runtime::Handle::current();
    tokio::spawn(async move {
        let Ok(turn) = PRODUCERS.acquire().await else { return };
        if tx.is_closed() {
            // Its reader left while it waited.
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let mut writer = ChunkWriter { tx, buf: Vec::with_capacity(WRITE_CHUNK), runtime, stall };
            produce(&mut writer);
            let _ = std::io::Write::flush(&mut writer);
        })
        .await;
    });
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|chunk| chunk.map(Ok))))
}

/// The writing end of [`write_stream`].
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
    /// To wait for room with a limit, from the blocking thread.
    runtime: tokio::runtime::Handle,
    stall: Duration,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(WRITE_CHUNK)));
        match self.runtime.block_on(tokio::time::timeout(self.stall, self.tx.send(chunk))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the body's reader went away"))
            }
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the body's reader took nothing for {}s", self.stall.as_secs()),
            )),
        }
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(WRITE_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == WRITE_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    /// Sends what is buffered (called once, at the end).
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() { Ok(()) } else { self.send() }
    }
}

/// Chunks of a body read ahead for blocking code ([`read_stream`]), at
/// most: hyper hands over chunks of at most about 400 KiB, so a body holds
/// at most some 6 MiB.
const READ_AHEAD: usize = 16;

/// A blocking reader of `stream` (for an artifact being unpacked, say). A
/// task reads the stream ahead, up to [`READ_AHEAD`] chunks, while the
/// reader's thread works on what came before, so the connection keeps
/// receiving meanwhile. Dropping the reader stops the task and drops the
/// stream. Call from within a Tokio runtime, and read from a blocking
/// thread (`spawn_blocking`).
pub fn read_stream(mut stream: ByteStream) -> impl std::io::Read + Send + use<> {
    let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                // The reader is gone: stop waiting for the peer.
                () = tx.closed() => break,
            };
            let Some(item) = item else { break };
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    ChunkReader { rx, current: Bytes::new() }
}

/// The reading end of [`read_stream`].
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    current: Bytes,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// The client. Cheap to clone; connections are pooled.
#[derive(Clone, Debug)]
pub struct Http {
    client: Client<HttpConnector, Body>,
    token: Option<String>,
    timeout: Duration,
    /// How long a sender may keep an artifact's reader waiting beyond
    /// `timeout` ([`STALL_LIMIT`]; shorter in tests).
    stall: Duration,
    /// Requests for URLs under this base go to this router, in process.
    local: Option<(std::sync::Arc<str>, axum::Router)>,
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

impl Http {
    /// A client that sends `token` (if any) as a bearer token. `timeout`
    /// bounds every request except streams.
    pub fn new(token: Option<String>, timeout: Duration) -> Http {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        // An idle pooled connection is dropped well before a drover server
        // would close it (see `HEADER_TIMEOUT`), so that a request is not
        // sent on a connection the server is closing.
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(IDLE_TIMEOUT).build(connector);
        Http { client, token, timeout, stall: STALL_LIMIT, local: None }
    }

    /// This client, with the requests for URLs under `base` (say
    /// `http://127.0.0.1:7700`) handed to `router` in this process instead
    /// of sent over a socket: for a server embedded in the same process.
    pub fn with_local(mut self, base: &str, router: axum::Router) -> Http {
        self.local = Some((base.trim_end_matches('/').into(), router));
        self
    }

    /// The router to hand a request for `url` to, if it is under the local
    /// base.
    fn local_for(&self, url: &str) -> Option<axum::Router> {
        let (base, router) = self.local.as_ref()?;
        let rest = url.strip_prefix(&**base)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| router.clone())
    }

    /// Sends `req` over the network, or to the local router.
    async fn exchange(&self, req: Request<Body>, url: &str) -> Result<Answer, HttpError> {
        use futures::FutureExt;
        use tower_service::Service;
        if let Some(mut router) = self.local_for(url) {
            // A handler that panics fails this request, as it would close
            // its connection over the network, not the caller's task.
            let call = std::panic::AssertUnwindSafe(router.call(req.map(axum::body::Body::new)));
            let resp = match call.catch_unwind().await {
                Ok(Ok(resp)) => resp,
                Ok(Err(never)) => match never {},
                Err(_) => {
                    let message = "the server failed while handling the request".to_owned();
                    return Err(HttpError::Connect { url: url.to_owned(), message });
                }
            };
            return Ok(resp.map(|b| BodyExt::boxed_unsync(b.map_err(std::io::Error::other))));
        }
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| HttpError::Connect { url: url.to_owned(), message: error_chain(&e) })?;
        Ok(resp.map(|b| BodyExt::boxed_unsync(b.map_err(std::io::Error::other))))
    }

    fn request(
        &self,
        method: Method,
        url: &str,
        body: Body,
        content_type: &str,
    ) -> Result<Request<Body>, HttpError> {
        let bad = |message: String| HttpError::Url { url: url.to_owned(), message };
        let uri: hyper::Uri = url.parse().map_err(|e: hyper::http::uri::InvalidUri| bad(e.to_string()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(bad("expected http://HOST:PORT (this client speaks plain http only)".into()));
        }
        let mut builder =
            Request::builder().method(method).uri(uri).header(header::CONTENT_TYPE, content_type);
        if let Some(token) = &self.token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        builder.body(body).map_err(|e| bad(format!("{e} (is the token one line of printable characters?)")))
    }

    async fn send(&self, req: Request<Body>, limit: Option<Duration>) -> Result<Answer, HttpError> {
        let url = req.uri().to_string();
        let fut = self.exchange(req, &url);
        let resp = match limit {
            Some(limit) => tokio::time::timeout(limit, fut)
                .await
                .map_err(|_| HttpError::Timeout { url: url.clone(), secs: limit.as_secs() })?,
            None => fut.await,
        }?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        // Not drover's error body (another server answered, an HTML page
        // say): its first line, cut short, is enough to say who answered.
        let message = serde_json::from_slice::<drover_proto::ErrorBody>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| foreign_message(&body));
        let message = if message.is_empty() { reason(status) } else { message };
        Err(HttpError::Status { url, status: status.as_u16(), message })
    }

    async fn read_all(&self, url: &str, resp: Answer) -> Result<Bytes, HttpError> {
        resp.into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| HttpError::Connect { url: url.to_owned(), message: error_chain(&e) })
    }

    /// GET a JSON document.
    pub async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, HttpError> {
        let req = self.request(Method::GET, url, full(Bytes::new()), "application/json")?;
        let resp = self.send(req, Some(self.timeout)).await?;
        let body = self.read_all(url, resp).await?;
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::Decode { url: url.to_owned(), message: e.to_string() })
    }

    /// POST a JSON body and read a JSON answer. `limit` overrides the default
    /// time limit (for long polls).
    pub async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        url: &str,
        body: &B,
        limit: Option<Duration>,
    ) -> Result<T, HttpError> {
        let bytes = serde_json::to_vec(body).expect("serialisable body");
        let req = self.request(Method::POST, url, full(bytes), "application/json")?;
        let resp = self.send(req, Some(limit.unwrap_or(self.timeout))).await?;
        let body = self.read_all(url, resp).await?;
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::Decode { url: url.to_owned(), message: e.to_string() })
    }

    /// POST with an empty body, ignoring the answer's body.
    pub async fn post(&self, url: &str) -> Result<(), HttpError> {
        let req = self.request(Method::POST, url, full(Bytes::new()), "application/json")?;
        let resp = self.send(req, Some(self.timeout)).await?;
        self.read_all(url, resp).await.map(|_| ())
    }

    /// PUT a local file, streamed.
    pub async fn put_file(&self, url: &str, path: &Path) -> Result<(), HttpError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| HttpError::File { path: path.display().to_string(), source })?;
        self.put_reader(url, file).await
    }

    /// PUT a body read from `reader`, streamed.
    pub async fn put_reader(
        &self,
        url: &str,
        reader: impl tokio::io::AsyncRead + Send + Sync + 'static,
    ) -> Result<(), HttpError> {
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024).map_ok(Frame::data);
        let req = self.request(
            Method::PUT,
            url,
            BodyExt::boxed(StreamBody::new(stream)),
            "application/octet-stream",
        )?;
        let resp = self.send(req, None).await?;
        self.read_all(url, resp).await.map(|_| ())
    }

    /// GET an artifact in the pack format and commit it to `cas` as `job`,
    /// verified as it arrives (against `tree` too, if known). A sender that
    /// sends nothing for [`STALL_LIMIT`] and the client's time limit (it
    /// stopped, or the network between us broke) fails the download, so the
    /// caller can try another holder instead of waiting for ever; a drover
    /// sender busy with readers that stopped reading frees a turn for this
    /// one within the stall limit.
    pub async fn get_artifact(
        &self,
        url: &str,
        cas: &std::sync::Arc<drover_cas::Cas>,
        job: drover_cas::Key,
        tree: Option<drover_cas::Key>,
    ) -> Result<drover_cas::ArtifactInfo, HttpError> {
        let stream = idle_limited(self.get_stream(url).await?, self.stall + self.timeout);
        let mut reader = read_stream(stream);
        let cas = cas.clone();
        let stored = tokio::task::spawn_blocking(move || cas.unpack(&job, tree.as_ref(), &mut reader))
            .await
            .map_err(|e| HttpError::Decode { url: url.to_owned(), message: e.to_string() })?;
        stored.map_err(|source| HttpError::Artifact { url: url.to_owned(), source })
    }

    /// Tells the coordinator (`POST` to its `unreachable` URL,
    /// `/v1/workers/unreachable`) that the worker at `holder` could not be
    /// reached; whether it found nothing listening there and took that
    /// worker as lost. A coordinator that cannot be asked counts as no.
    pub async fn report_unreachable(&self, unreachable: &str, holder: &str) -> bool {
        let request = drover_proto::UnreachableRequest { url: holder.to_owned() };
        let reply = self.post_json::<_, drover_proto::UnreachableReply>(unreachable, &request, None).await;
        reply.is_ok_and(|r| r.lost)
    }

    /// GET an artifact's pack into the new directory `dir` (outside any
    /// cache: an export), verified against `tree` if given
    /// ([`drover_cas::unpack_to_dir`]), with the limits of
    /// [`Http::get_artifact`]. On failure `dir` is removed.
    pub async fn get_artifact_into(
        &self,
        url: &str,
        dir: std::path::PathBuf,
        tree: Option<drover_cas::Key>,
    ) -> Result<drover_cas::ArtifactInfo, HttpError> {
        let stream = idle_limited(self.get_stream(url).await?, self.stall + self.timeout);
        let mut reader = read_stream(stream);
        let stored =
            tokio::task::spawn_blocking(move || drover_cas::unpack_to_dir(&mut reader, &dir, tree.as_ref()))
                .await
                .map_err(|e| HttpError::Decode { url: url.to_owned(), message: e.to_string() })?;
        stored.map_err(|source| HttpError::Artifact { url: url.to_owned(), source })
    }

    /// GET a body as a stream of chunks (downloads, logs, event streams).
    pub async fn get_stream(&self, url: &str) -> Result<ByteStream, HttpError> {
        let req = self.request(Method::GET, url, full(Bytes::new()), "application/octet-stream")?;
        let resp = self.send(req, Some(self.timeout)).await?;
        let stream = BodyStream::new(resp.into_body())
            .try_filter_map(|frame| async move { Ok(frame.into_data().ok()) })
            .map_err(|e| std::io::Error::other(error_chain(&e)));
        Ok(Box::pin(stream))
    }

    /// GET a body as an `AsyncRead`.
    pub async fn get_reader(&self, url: &str) -> Result<impl AsyncRead + Send + Unpin + use<>, HttpError> {
        Ok(tokio_util::io::StreamReader::new(self.get_stream(url).await?))
    }
}

/// `stream`, failing (`TimedOut`) once no chunk has come for `idle` (a
/// download, an upload): a peer that stalls holds its reader no longer.
pub fn idle_limited(stream: ByteStream, idle: Duration) -> ByteStream {
    Box::pin(futures::stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(item)) => Some((item, Some(stream))),
            Ok(None) => None,
            Err(_) => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no data for {:.1} s", idle.as_secs_f64()),
                );
                Some((Err(e), None))
            }
        }
    }))
}

/// The first non-blank line of a body that is not drover's, at most 200
/// characters of it.
fn foreign_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    let more = line.chars().count() > 200 || text.trim() != line;
    let mut message: String = line.chars().take(200).collect();
    if more {
        message.push_str(" …");
    }
    message
}

fn reason(status: StatusCode) -> String {
    status.canonical_reason().unwrap_or("error").to_owned()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// How long a client may take to send a request's headers, from the moment
/// the server waits for them (also on an idle kept-alive connection):
/// longer, and the connection is closed. A client that opens connections
/// and sends nothing (or one header line at a time) cannot hold them.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the client keeps an idle connection for another request: a
/// third of [`HEADER_TIMEOUT`], after which a drover server closes it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections served at once; past it, new ones wait in the
/// listener's queue until one closes (rather than the process running out
/// of file descriptors, which fails every request).
pub const MAX_CONNECTIONS: usize = 4_096;

/// Serves `router` on `listener` until the task is dropped: HTTP/1.1 (what
/// drover's clients speak), Nagle's algorithm off on every connection (a streamed response
/// sends its headers first, and with Nagle on its first body bytes would
/// wait for the client's delayed acknowledgement, 40 ms on Linux), at most
/// [`MAX_CONNECTIONS`] at once, each closed if a request's headers take
/// longer than `header_timeout` (see [`HEADER_TIMEOUT`]), and a request
/// failed if its body stalls that long ([`IdleBody`]).
pub async fn serve(listener: tokio::net::TcpListener, router: axum::Router, header_timeout: Duration) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, mostly: wait for some to close.
                tracing::warn!("cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Only a latency cost if it fails: nothing to report to anyone.
        let _ = tcp.set_nodelay(true);
        let service = Routed(router.clone(), header_timeout);
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
            // A connection that breaks or times out concerns its client only.
            let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await;
            drop(slot);
        });
    }
}

/// Middleware: every error a drover server answers carries `{"error": ...}`, as
/// drover-proto says, also those that axum's extractors and routing make: a
/// body refused (400, 413, 415, 422), an unknown route (404) or method (405,
/// its `Allow` header kept). Their text (or the status's reason, for an
/// empty one) becomes the error.
pub async fn json_errors(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let response = next.run(req).await;
    let status = response.status();
    let json = response.headers().get(header::CONTENT_TYPE).is_some_and(|t| t == "application/json");
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    let error =
        if text.is_empty() { status.canonical_reason().unwrap_or("error").to_lowercase() } else { text };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    axum::response::IntoResponse::into_response((parts, axum::Json(drover_proto::ErrorBody { error })))
}

/// The router as a hyper service, its requests' bodies limited by
/// [`IdleBody`] to the given idle time.
#[derive(Clone, Debug)]
struct Routed(axum::Router, Duration);

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Routed {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = axum::routing::future::RouteFuture<std::convert::Infallible>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let idle = self.1;
        let req = req.map(|body| axum::body::Body::new(IdleBody { inner: body, idle, deadline: None }));
        // A router is always ready: no need to poll it first.
        tower_service::Service::call(&mut self.0.clone(), req)
    }
}

/// A request's body that fails once its client has sent nothing of it for
/// `idle` while the handler waited for more: a client that sends its
/// headers and then a body slowly, or not at all, holds its connection
/// (and what the handler gathered) no longer than one that is slow with
/// its headers. The wait counts from the handler's first read.
struct IdleBody {
    inner: hyper::body::Incoming,
    idle: Duration,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl hyper::body::Body for IdleBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.deadline = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        let e =
                            format!("the client sent nothing of its request's body for {}s", idle.as_secs());
                        Poll::Ready(Some(Err(e.into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL no request can be made of (no scheme, no host, a token that
    /// cannot be a header) is an error naming it, not a panic.
    #[tokio::test]
    async fn an_unusable_url_or_token_is_an_error() {
        let http = Http::new(None, Duration::from_secs(1));
        for url in ["127.0.0.1:9/v1/builds", "ftp://x/y", "http:///v1", "http://a b/"] {
            match http.get_json::<serde_json::Value>(url).await {
                Err(HttpError::Url { url: named, .. }) => assert_eq!(named, url),
                other => panic!("{url}: {other:?}"),
            }
        }
        let http = Http::new(Some("two\nlines".into()), Duration::from_secs(1));
        let e = http.post("http://127.0.0.1:9/x").await.expect_err("a token with a newline");
        assert!(matches!(&e, HttpError::Url { .. }) && e.to_string().contains("token"), "{e}");
    }

    /// Another server's error page is cut to its first line.
    #[test]
    fn a_foreign_error_body_is_cut_to_its_first_line() {
        assert_eq!(foreign_message(b"\n  Not here  \n"), "Not here");
        assert_eq!(foreign_message(b"<!DOCTYPE HTML>\n<html>...</html>"), "<!DOCTYPE HTML> …");
        let long = "x".repeat(300);
        assert_eq!(foreign_message(long.as_bytes()), format!("{} …", "x".repeat(200)));
        assert_eq!(foreign_message(b""), "");
    }

    /// Requests under the local base reach the router in this process (no
    /// server listens there), with their bodies, answers, errors and
    /// streams; a handler that panics fails its request only; a URL that
    /// only starts with the same characters goes to the network.
    async fn boom() -> &'static str {
        panic!("a handler's bug")
    }

    #[tokio::test]
    async fn requests_under_the_local_base_reach_the_router_without_a_socket() {
        use axum::routing::{get, post};
        let router = axum::Router::new()
            .route("/v1/echo", post(|body: String| async move { axum::Json(format!("got {body}")) }))
            .route(
                "/v1/missing",
                get(|| async {
                    (
                        axum::http::StatusCode::NOT_FOUND,
                        axum::Json(serde_json::json!({"error": "no such thing"})),
                    )
                }),
            )
            .route("/v1/panic", get(boom))
            .route(
                "/v1/stream",
                get(|| async {
                    axum::body::Body::from_stream(write_stream(|out| {
                        out.write_all(&[7u8; 300_000]).expect("write")
                    }))
                }),
            );
        // A port nothing listens on: only the local route can answer.
        let base = "http://127.0.0.1:9";
        let http = Http::new(None, Duration::from_secs(5)).with_local(&format!("{base}/"), router);
        let got: String = http.post_json(&format!("{base}/v1/echo"), &"hello", None).await.expect("echo");
        assert_eq!(got, "got \"hello\"");
        match http.get_json::<String>(&format!("{base}/v1/missing")).await {
            Err(HttpError::Status { status: 404, message, .. }) => assert_eq!(message, "no such thing"),
            other => panic!("unexpected {other:?}"),
        }
        let mut body = Vec::new();
        let mut stream = http.get_stream(&format!("{base}/v1/stream")).await.expect("stream");
        while let Some(chunk) = stream.next().await {
            body.extend_from_slice(&chunk.expect("chunk"));
        }
        assert_eq!(body, vec![7u8; 300_000]);
        let failed = http.get_json::<String>(&format!("{base}/v1/panic")).await;
        assert!(matches!(failed, Err(HttpError::Connect { .. })), "{failed:?}");
        let elsewhere = http.get_json::<String>(&format!("{base}0/v1/echo")).await;
        assert!(matches!(elsewhere, Err(HttpError::Connect { .. })), "{elsewhere:?}");
    }

    /// A reader that takes nothing frees the producer's thread: its writes
    /// fail once the stall limit has passed.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_producer_whose_reader_takes_nothing_is_given_up_on() {
        let (done, result) = tokio::sync::oneshot::channel();
        let body = write_stream_with(Duration::from_millis(50), move |out| {
            let chunk = vec![0u8; WRITE_CHUNK];
            let _ = done.send((0..100).try_for_each(|_| out.write_all(&chunk)));
        });
        let error = result.await.expect("the producer ends").expect_err("its writes fail");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
        drop(body);
    }

    /// A sender that stops in the middle of an artifact fails the download
    /// once it has sent nothing for the client's time limit.
    #[tokio::test]
    async fn a_download_that_stalls_fails() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/a", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut request).await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nDROVERPK";
            tokio::io::AsyncWriteExt::write_all(&mut tcp, head).await.expect("write");
            // Then nothing, with the connection open.
            std::future::pending::<()>().await;
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let cas = Arc::new(drover_cas::Cas::open(dir.path(), u64::MAX).expect("cas"));
        let http = Http { stall: Duration::ZERO, ..Http::new(None, Duration::from_millis(200)) };
        let failed = http.get_artifact(&url, &cas, drover_cas::Key([1; 32]), None).await;
        let error = failed.expect_err("the download fails").to_string();
        assert!(error.contains("no data for 0.2 s"), "{error}");
        server.abort();
    }

    /// A request whose body stops coming is answered with an error once it
    /// has sent nothing for the server's limit, instead of holding its
    /// connection and handler.
    #[tokio::test]
    async fn a_request_body_that_stalls_is_refused() {
        use axum::routing::post;
        let router =
            axum::Router::new().route("/x", post(|body: Bytes| async move { body.len().to_string() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(listener, router, Duration::from_millis(200)));
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\n0123456789";
        tokio::io::AsyncWriteExt::write_all(&mut tcp, request).await.expect("write");
        let mut answer = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tcp, &mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
        server.abort();
    }

    #[tokio::test]
    async fn a_written_body_arrives_whole_in_bounded_chunks() {
        let data: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let stream = write_stream(move |out| {
            for piece in data.chunks(70_001) {
                out.write_all(piece).expect("write");
            }
        });
        let chunks: Vec<Bytes> = stream.try_collect().await.expect("body");
        assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= WRITE_CHUNK), "chunk sizes");
        assert_eq!(chunks.len(), 4, "three full chunks and the rest");
        assert_eq!(chunks.concat(), expected);
    }

    #[tokio::test]
    async fn a_read_stream_yields_every_chunk_then_the_error() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"hello, ")),
            Ok(Bytes::new()),
            Ok(Bytes::from(vec![7u8; 100_000])),
            Err(std::io::Error::other("cut")),
        ];
        let mut reader = read_stream(Box::pin(futures::stream::iter(chunks)));
        let (data, error) = tokio::task::spawn_blocking(move || {
            let mut data = Vec::new();
            let error = std::io::Read::read_to_end(&mut reader, &mut data).expect_err("the error");
            (data, error.to_string())
        })
        .await
        .expect("join");
        assert_eq!(data.len(), 7 + 100_000);
        assert!(data.starts_with(b"hello, ") && data[7..].iter().all(|&b| b == 7));
        assert_eq!(error, "cut");

        let stream = write_stream(|out| out.write_all(&[1; 3 << 20]).expect("write"));
        let mut reader = read_stream(stream);
        let all = tokio::task::spawn_blocking(move || {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut reader, &mut data).map(|_| data)
        })
        .await
        .expect("join")
        .expect("read");
        assert_eq!(all, vec![1; 3 << 20]);
    }

    #[tokio::test]
    async fn dropping_a_read_stream_drops_its_stream() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // A body that never sends anything; it signals when dropped.
        let stream = futures::stream::pending::<Result<Bytes, std::io::Error>>().map(move |item| {
            let _keep = &tx;
            item
        });
        drop(read_stream(Box::pin(stream)));
        assert!(rx.await.is_err(), "the stream (and its sender) was dropped");
    }

    /// Dropped while its producer writes, a body fails the writes.
    #[tokio::test(flavor = "multi_thread")]
    async fn dropping_a_written_body_stops_its_writer() {
        let (started, running) = tokio::sync::oneshot::channel();
        let (tx, rx) = std::sync::mpsc::channel();
        let stream = write_stream(move |out| {
            let _ = started.send(());
            let failed = (0..).try_for_each(|_: u64| out.write_all(&[0; 1 << 16]));
            tx.send(failed.map_err(|e| e.kind())).expect("report");
        });
        running.await.expect("the producer starts");
        drop(stream);
        let outcome = tokio::task::spawn_blocking(move || rx.recv()).await.expect("join").expect("outcome");
        assert_eq!(outcome, Err(std::io::ErrorKind::BrokenPipe));
    }

    #[test]
    fn only_the_configured_bearer_token_is_authorized() {
        let mut headers = hyper::HeaderMap::new();
        assert!(authorized(&headers, None), "no token configured: open");
        assert!(!authorized(&headers, Some("s3cret")), "missing header");
        headers.insert(header::AUTHORIZATION, "Bearer wrong".parse().expect("header"));
        assert!(!authorized(&headers, Some("s3cret")));
        headers.insert(header::AUTHORIZATION, "s3cret".parse().expect("header"));
        assert!(!authorized(&headers, Some("s3cret")), "the Bearer scheme is required");
        headers.insert(header::AUTHORIZATION, "Bearer s3cret".parse().expect("header"));
        assert!(authorized(&headers, Some("s3cret")));
        headers.insert(header::AUTHORIZATION, "bearer s3cret".parse().expect("header"));
        assert!(authorized(&headers, Some("s3cret")), "the scheme's name in any case");
        for wrong in ["Basic s3cret", "Bearer s3cre", "Bearer s3cret2", "Bearer S3cret", "Bearer"] {
            headers.insert(header::AUTHORIZATION, wrong.parse().expect("header"));
            assert!(!authorized(&headers, Some("s3cret")), "{wrong}");
        }
    }

    #[test]
    fn a_token_is_checked_by_its_digest_alike() {
        let digest = token_digest("s3cret");
        assert_ne!(digest, token_digest("s3cret2"));
        let mut headers = hyper::HeaderMap::new();
        assert!(!authorized_by_digest(&headers, &digest), "missing header");
        headers.insert(header::AUTHORIZATION, "bearer s3cret".parse().expect("header"));
        assert!(authorized_by_digest(&headers, &digest));
        for wrong in ["s3cret", "Basic s3cret", "Bearer s3cre", "Bearer S3cret"] {
            headers.insert(header::AUTHORIZATION, wrong.parse().expect("header"));
            assert!(!authorized_by_digest(&headers, &digest), "{wrong}");
        }
    }
}
