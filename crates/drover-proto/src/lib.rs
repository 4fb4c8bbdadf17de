//! drover's wire types: the JSON bodies exchanged between clients, the
//! coordinator and workers over HTTP (all on one port per process).
//!
//! Paths (coordinator): `POST /v1/builds` ([`SubmitRequest`] →
//! [`SubmitReply`]), `GET /v1/builds[/{id}]` ([`BuildStatus`]; the list a
//! page at a time, `?after=ID`: the builds after build `ID` holding about
//! 20,000 jobs, empty past the last; `?summary=true`: every
//! [`BuildSummary`]),
//! `GET /v1/builds/{id}/events?from=N` (newline-delimited [`BuildEvent`]s:
//! the whole history, then live events until the build ends),
//! `POST /v1/builds/{id}/cancel`, `GET /v1/builds/{id}/jobs/{name}/log`,
//! `POST /v1/blobs/missing` ([`MissingRequest`] → [`MissingReply`]),
//! `PUT|GET /v1/blobs/{digest}`, `GET /v1/workers` ([`WorkerStatus`] list),
//! `POST /v1/workers/register` ([`RegisterRequest`] → [`RegisterReply`]),
//! `POST /v1/workers/{id}/poll` ([`PollRequest`] → [`PollReply`], a long
//! poll that is also the heartbeat), `POST /v1/workers/{id}/report`
//! ([`Report`] → [`PollReply`]), `POST /v1/workers/{id}/drain` (no body:
//! nothing new goes to the worker until it registers again) and `POST
//! /v1/workers/{id}/leave` (no body: the worker is lost at once, its runs
//! requeued), `POST /v1/workers/unreachable` ([`UnreachableRequest`] →
//! [`UnreachableReply`]: a holder that could not be reached). A worker's *mail* (assignments, drops,
//! stops, suspends, resumes) reaches it in exactly one answer: a poll's,
//! or, for a worker that asks for it ([`Report::deliver`]), a report's, so
//! a busy worker gets its next job in the answer to the report of the one
//! before. The coordinator also serves `GET /metrics` (Prometheus' text
//! format, not JSON). Workers serve `GET /v1/artifacts/{job}` (a packed
//! artifact) and `GET /v1/runs/{run}/log?stream=stdout|stderr`.

pub use drover_core::{QueueAmounts, QueueView};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte digest or content ID, written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hash32(pub [u8; 32]);

impl Hash32 {
    /// The 64 hex digits, written without the formatting machinery (IDs and
    /// digests fill builds, assignments and reports, and `{:02x}` per byte
    /// was a visible share of encoding them).
    fn hex(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        out
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_string()[..12])
    }
}

/// A digest that is not 64 hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadHash(pub String);

impl fmt::Display for BadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a 64-digit hex digest: {:?}", self.0)
    }
}

impl std::error::Error for BadHash {}

impl FromStr for Hash32 {
    type Err = BadHash;
    fn from_str(s: &str) -> Result<Self, BadHash> {
        let bad = || BadHash(s.chars().take(80).collect());
        if s.len() != 64 {
            return Err(bad());
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (b, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            *b = digit(pair[0]).zip(digit(pair[1])).map(|(hi, lo)| hi << 4 | lo).ok_or_else(bad)?;
        }
        Ok(Hash32(out))
    }
}

/// 64 hex digits in a human-readable format (JSON); 32 bytes in a binary
/// one (a snapshot's CBOR), as a [`drover_core::JobId`].
impl Serialize for Hash32 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !s.is_human_readable() {
            return drover_core::JobId(self.0).serialize(s);
        }
        s.serialize_str(std::str::from_utf8(&self.hex()).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for Hash32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// Reads the digits where they are, without a `String` per hash.
        struct Digits;
        impl serde::de::Visitor<'_> for Digits {
            type Value = Hash32;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Hash32, E> {
                s.parse().map_err(E::custom)
            }
        }
        if !d.is_human_readable() {
            return drover_core::JobId::deserialize(d).map(|id| Hash32(id.0));
        }
        d.deserialize_str(Digits)
    }
}

impl From<Hash32> for drover_core::JobId {
    fn from(h: Hash32) -> Self {
        drover_core::JobId(h.0)
    }
}

impl From<drover_core::JobId> for Hash32 {
    fn from(id: drover_core::JobId) -> Self {
        Hash32(id.0)
    }
}

/// One source file of a build: uploaded by content, materialised read-only
/// under `{{src}}` on the worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Relative, `/`-separated, never escaping the source root.
    pub path: String,
    /// blake3 of the content.
    pub digest: Hash32,
    /// Bytes.
    pub size: u64,
    /// The executable bit.
    pub executable: bool,
}

/// One job of a submitted build, as the client resolved it.
///
/// Fields at their default are left out of the JSON (and read back as
/// the default): a build of many plain jobs is sent, logged and read
/// without them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDef {
    /// Unique within the build.
    pub name: String,
    /// Content ID (blake3 of commands, environment, resources, sources and
    /// dependency IDs).
    pub id: Hash32,
    /// The same but for the dependencies (`drover-own-v1`): with the
    /// digests of its dependencies' outputs, the key under which a job
    /// whose dependencies ran again but wrote what they wrote before finds
    /// its earlier output (early cutoff). `None`: no early cutoff (a gang
    /// member, or an older client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<Hash32>,
    /// Shell commands, run in order with `sh -c` (a plain one without the
    /// shell: see drover-exec); placeholders unrendered.
    pub commands: Vec<String>,
    /// Environment variables (placeholders allowed in values).
    #[serde(default, skip_serializing_if = "is_default")]
    pub env: BTreeMap<String, String>,
    /// Names of the jobs whose outputs this one reads.
    #[serde(default, skip_serializing_if = "is_default")]
    pub needs: Vec<String>,
    /// Millicores.
    #[serde(default, skip_serializing_if = "is_default")]
    pub cpu_millis: u64,
    /// Bytes.
    #[serde(default, skip_serializing_if = "is_default")]
    pub memory: u64,
    /// Named tokens.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tokens: BTreeMap<String, u64>,
    /// Tokens taken exclusively on the worker.
    #[serde(default, skip_serializing_if = "is_default")]
    pub exclusive: Vec<String>,
    /// Required worker labels.
    #[serde(default, skip_serializing_if = "is_default")]
    pub labels: BTreeMap<String, String>,
    /// Higher runs first within its tenant.
    #[serde(default, skip_serializing_if = "is_default")]
    pub priority: i32,
    /// Milliseconds; the worker stops the job after this long.
    #[serde(default, skip_serializing_if = "is_default")]
    pub timeout_ms: Option<u64>,
    /// Reruns allowed after worker losses.
    #[serde(default, skip_serializing_if = "is_default")]
    pub retries: u32,
    /// Reruns allowed after failed runs (a flaky job's): the job fails
    /// only once every run has.
    #[serde(default, skip_serializing_if = "is_default")]
    pub retry_on_failure: u32,
    /// The source paths this job sees (`None`: all of the build's sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<String>>,
    /// The gang it belongs to: it starts only together with enough of the
    /// gang's other jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangDef>,
    /// For a job with `cache: false`: the submission's nonce, which its ID
    /// hashes (so that the coordinator can make the ID again from the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<Hash32>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl JobDef {
    /// A job that runs nothing and asks for nothing: no commands,
    /// environment, needs, resources, labels or retries, default priority,
    /// no timeout, every source, no gang. Set the rest with struct update
    /// syntax.
    pub fn new(name: impl Into<String>, id: Hash32) -> JobDef {
        JobDef {
            name: name.into(),
            id,
            own: None,
            commands: Vec::new(),
            env: BTreeMap::new(),
            needs: Vec::new(),
            cpu_millis: 0,
            memory: 0,
            tokens: BTreeMap::new(),
            exclusive: Vec::new(),
            labels: BTreeMap::new(),
            priority: 0,
            timeout_ms: None,
            retries: 0,
            retry_on_failure: 0,
            inputs: None,
            gang: None,
            nonce: None,
        }
    }
}

/// A gang of a build: jobs that start all at once or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangDef {
    /// Unique within the build.
    pub name: String,
    /// How many of its jobs must be able to start at the same moment.
    pub min_available: u32,
    /// When one of its jobs fails: rerun the whole gang (up to 3 times)
    /// instead of failing.
    #[serde(default)]
    pub restart: bool,
}

/// A build, as submitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildSpec {
    /// For people.
    pub name: String,
    /// All source files (every job sees all of them).
    pub sources: Vec<SourceFile>,
    /// The jobs, every job after the jobs it needs.
    pub jobs: Vec<JobDef>,
}

/// `POST /v1/builds`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The build: shared, so that builds submitted with the same spec keep
    /// one copy of it (see the coordinator's `SpecCache`).
    pub build: Arc<BuildSpec>,
    /// Whose build (for fairness); defaults to "default".
    pub tenant: String,
    /// Re-run jobs even when a cached result exists.
    pub no_cache: bool,
    /// What the rest of the build does when a job fails.
    #[serde(default)]
    pub on_error: OnError,
    /// At most this many of the build's jobs queued or running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// The leaf queue of the coordinator the build's jobs go to (default:
    /// the tenant's queue, else `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// [`SubmitRequest`] as a client sends it, borrowing the build: the same
/// JSON, without copying a large build first.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SubmitRequestRef<'a> {
    /// The build.
    pub build: &'a BuildSpec,
    /// Whose build.
    pub tenant: &'a str,
    /// Re-run jobs even when a cached result exists.
    pub no_cache: bool,
    /// What the rest of the build does when a job fails.
    pub on_error: OnError,
    /// At most this many of the build's jobs queued or running at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// The leaf queue the build's jobs go to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<&'a str>,
}

/// A build's policy when one of its jobs fails (BuildStream's on-error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Start nothing new in the build; running jobs finish.
    #[default]
    Quit,
    /// Run every job that does not depend on a failure.
    Continue,
    /// Stop the build's running jobs now (shared jobs keep running for the
    /// other builds that need them).
    Terminate,
}

/// Reply to [`SubmitRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitReply {
    /// The new build's ID.
    pub id: u64,
}

/// `POST /v1/blobs/missing`: which of these digests does the coordinator
/// lack?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingRequest {
    /// Digests to check.
    pub digests: Vec<Hash32>,
}

/// Reply to [`MissingRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingReply {
    /// The digests to upload.
    pub missing: Vec<Hash32>,
}

/// A build's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildState {
    /// Nothing started yet.
    Queued,
    /// Something started.
    Running,
    /// Every job succeeded (or was cached).
    Succeeded,
    /// A job failed.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl BuildState {
    /// Is the build over?
    pub fn is_final(self) -> bool {
        matches!(self, BuildState::Succeeded | BuildState::Failed | BuildState::Cancelled)
    }
}

/// A job's state within a build (ordered as declared).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for its dependencies or for a worker.
    Queued,
    /// Sent to a worker.
    Running,
    /// Ran and succeeded.
    Succeeded,
    /// Its result was already known; nothing ran.
    Cached,
    /// Ran and failed (or could not be run).
    Failed,
    /// Cancelled with its build.
    Cancelled,
    /// Not run because something it needed failed (or the build stopped).
    Skipped,
}

impl JobState {
    /// Is the job over?
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }

    /// Did it produce its output?
    pub fn is_success(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Cached)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Cached => "cached",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Skipped => "skipped",
        };
        f.pad(s)
    }
}

impl fmt::Display for BuildState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            BuildState::Queued => "queued",
            BuildState::Running => "running",
            BuildState::Succeeded => "succeeded",
            BuildState::Failed => "failed",
            BuildState::Cancelled => "cancelled",
        };
        f.pad(s)
    }
}

/// One job in [`BuildStatus`] (the contract of `status --json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Its name in the build.
    pub name: String,
    /// Content ID.
    pub id: Hash32,
    /// Where it stands.
    pub state: JobState,
    /// The worker of its latest attempt, by name.
    pub worker: Option<String>,
    /// Attempts started.
    pub attempts: u32,
    /// Exit code of the failing command, or 0.
    pub exit_code: Option<i32>,
    /// Why it failed or was skipped, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Milliseconds per stage of its latest finished run (`pull`, `fetch`,
    /// `build`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<String, u64>,
    /// The stage a running job is in on its worker now (`pull`, `fetch` or
    /// `build`), if the worker said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The running job waits for its stage's tokens on the worker.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stage_waiting: bool,
}

/// `GET /v1/builds/{id}` (and `status --json`, `run --json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStatus {
    /// The build's ID.
    pub id: u64,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Whose build it is.
    #[serde(default)]
    pub tenant: String,
    /// The coordinator queue its jobs go to: the one it named (its build
    /// file's `queue`, or `--queue`), else its tenant's.
    #[serde(default)]
    pub queue: String,
    /// Where it stands.
    pub state: BuildState,
    /// Its jobs, in build-file order.
    pub jobs: Vec<JobStatus>,
}

/// `GET /v1/builds?summary=true`: a build without its jobs, for listings
/// (`drover status` without a build): a few dozen bytes where the whole
/// status of a large build is megabytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildSummary {
    /// The build's ID.
    pub id: u64,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Whose build it is.
    #[serde(default)]
    pub tenant: String,
    /// Where it stands.
    pub state: BuildState,
    /// How many jobs it has.
    pub jobs: u64,
    /// How many of them are over (succeeded, cached, failed, cancelled or
    /// skipped).
    pub done: u64,
}

/// What happened in a build, in order; the stream of `GET
/// /v1/builds/{id}/events`. Read in one pass (through `FlatEvent`): every
/// client following a build parses each of its events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BuildEvent {
    /// Position in the build's stream, from 0.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The kinds of [`BuildEvent`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The build was accepted.
    BuildQueued {
        /// Number of jobs.
        jobs: usize,
    },
    /// A job's dependencies are done; it waits for a worker.
    JobQueued {
        /// Job name.
        job: String,
    },
    /// A job was sent to a worker.
    JobStarted {
        /// Job name.
        job: String,
        /// Worker name.
        worker: String,
        /// 1 for the first attempt.
        attempt: u32,
    },
    /// A job ended.
    JobFinished {
        /// Job name.
        job: String,
        /// succeeded, cached or failed.
        state: JobState,
        /// Exit code of the failing command, or 0.
        exit_code: Option<i32>,
        /// Why it failed, for people.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
    /// A running job was suspended (its processes stopped).
    JobSuspended {
        /// Job name.
        job: String,
        /// Set when an eviction suspended it (`evict = "suspend"`): the
        /// job it made room for, for people. Unset for `drover suspend`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evicted_by: Option<String>,
    },
    /// A suspended job was resumed.
    JobResumed {
        /// Job name.
        job: String,
    },
    /// A job waits again: its worker was lost, it was evicted, its gang
    /// restarted, or an output it needs was lost and is built again (a job
    /// that had finished then runs again too).
    JobRequeued {
        /// Job name.
        job: String,
        /// Attempts so far.
        attempts: u32,
        /// Why, when it is not the usual (its worker was lost, it was
        /// evicted, its gang restarted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A job will not run.
    JobSkipped {
        /// Job name.
        job: String,
        /// Why.
        reason: String,
    },
    /// A job was cancelled.
    JobCancelled {
        /// Job name.
        job: String,
    },
    /// The build ended.
    BuildFinished {
        /// How.
        state: BuildState,
        /// How many of its jobs ended in each state (states no job is in
        /// are left out), so that a client following the build can say how
        /// it went without asking for its whole status.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        counts: BTreeMap<JobState, usize>,
    },
    /// `drover retry`: the failed, skipped and cancelled jobs are queued
    /// again; a `build_finished` follows when they are over.
    BuildRetried {
        /// How many jobs were queued again.
        jobs: usize,
    },
}

/// The tag of an [`EventKind`], as written in `event`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EventTag {
    BuildQueued,
    JobQueued,
    JobStarted,
    JobFinished,
    JobSuspended,
    JobResumed,
    JobRequeued,
    JobSkipped,
    JobCancelled,
    BuildFinished,
    BuildRetried,
}

/// Every field of every kind of [`BuildEvent`], read in one pass. The
/// derived reading of a flattened, internally tagged enum first copies each
/// event into a generic tree and then reads that again, about 40% slower
/// for the clients that follow builds.
#[derive(Deserialize)]
struct FlatEvent {
    seq: u64,
    at: u64,
    event: EventTag,
    job: Option<String>,
    worker: Option<String>,
    attempt: Option<u32>,
    attempts: Option<u32>,
    jobs: Option<usize>,
    /// A [`JobState`] or a [`BuildState`], by the tag.
    state: Option<String>,
    exit_code: Option<i32>,
    detail: Option<String>,
    evicted_by: Option<String>,
    reason: Option<String>,
    counts: Option<BTreeMap<JobState, usize>>,
}

impl<'de> Deserialize<'de> for BuildEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        fn need<T, E: Error>(v: Option<T>, field: &'static str) -> Result<T, E> {
            v.ok_or_else(|| E::missing_field(field))
        }
        fn state<'a, T: Deserialize<'a>, E: Error>(s: &'a Option<String>) -> Result<T, E> {
            T::deserialize(serde::de::value::StrDeserializer::<E>::new(need(s.as_deref(), "state")?))
        }
        let f = FlatEvent::deserialize(d)?;
        let job = f.job;
        let kind = match f.event {
            EventTag::BuildQueued => EventKind::BuildQueued { jobs: need(f.jobs, "jobs")? },
            EventTag::JobQueued => EventKind::JobQueued { job: need(job, "job")? },
            EventTag::JobStarted => EventKind::JobStarted {
                job: need(job, "job")?,
                worker: need(f.worker, "worker")?,
                attempt: need(f.attempt, "attempt")?,
            },
            EventTag::JobFinished => EventKind::JobFinished {
                job: need(job, "job")?,
                state: state(&f.state)?,
                exit_code: f.exit_code,
                detail: f.detail.unwrap_or_default(),
            },
            EventTag::JobSuspended => {
                EventKind::JobSuspended { job: need(job, "job")?, evicted_by: f.evicted_by }
            }
            EventTag::JobResumed => EventKind::JobResumed { job: need(job, "job")? },
            EventTag::JobRequeued => EventKind::JobRequeued {
                job: need(job, "job")?,
                attempts: need(f.attempts, "attempts")?,
                reason: f.reason,
            },
            EventTag::JobSkipped => {
                EventKind::JobSkipped { job: need(job, "job")?, reason: need(f.reason, "reason")? }
            }
            EventTag::JobCancelled => EventKind::JobCancelled { job: need(job, "job")? },
            EventTag::BuildFinished => {
                EventKind::BuildFinished { state: state(&f.state)?, counts: f.counts.unwrap_or_default() }
            }
            EventTag::BuildRetried => EventKind::BuildRetried { jobs: need(f.jobs, "jobs")? },
        };
        Ok(BuildEvent { seq: f.seq, at: f.at, kind })
    }
}

/// What a worker offers, as sent at registration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCapacity {
    /// Jobs at once.
    pub slots: u32,
    /// Millicores.
    pub cpu_millis: u64,
    /// Bytes.
    pub memory: u64,
    /// Named tokens.
    pub tokens: BTreeMap<String, u64>,
}

/// An artifact a worker holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldArtifact {
    /// The job whose output it is.
    pub job: Hash32,
    /// Digest of the packed tree.
    pub tree: Hash32,
    /// Bytes.
    pub size: u64,
}

/// `POST /v1/workers/register`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// Stable name (defaults to its address).
    pub name: String,
    /// Base URL where peers fetch artifacts, e.g. `http://127.0.0.1:7701`.
    pub url: String,
    /// What it offers.
    pub capacity: WorkerCapacity,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its cache.
    pub artifacts: Vec<HeldArtifact>,
    /// Runs it is still running (after a coordinator restart).
    pub running: Vec<u64>,
}

/// Reply to [`RegisterRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// The worker's ID for later calls.
    pub worker: u64,
    /// Milliseconds: poll more often than this or be declared lost.
    pub lease_ms: u64,
    /// Runs it reported that the coordinator does not know: stop them.
    pub stop: Vec<u64>,
    /// When workers have a token of their own (`drover serve
    /// --worker-token`), the digest of the clients' token
    /// (`drover_http::token_digest`): the worker serves artifacts and logs
    /// to a request that presents either token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<Hash32>,
}

/// `POST /v1/workers/{id}/poll`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollRequest {
    /// Longest time to hold the request open when there is nothing to do.
    pub wait_ms: u64,
    /// The worker takes its mail only through reports ([`Report::deliver`]):
    /// the poll never takes it, and answers with [`PollReply::mail`] as
    /// soon as mail newer than `seen` waits. Mail then reaches the worker
    /// through one ordered stream of answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_only: bool,
    /// With `notify_only`: the last [`PollReply::mail`] this session
    /// received (0 at first); only newer mail ends the poll early.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seen: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A dependency's output, for a job about to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepInput {
    /// The name the job's commands use (`{{dep:NAME}}`).
    pub name: String,
    /// The dependency's job ID (also its artifact's key).
    pub job: Hash32,
    /// Digest of its packed tree, to verify a fetched copy.
    pub tree: Option<Hash32>,
    /// Base URLs of workers holding it, best first.
    pub holders: Vec<String>,
    /// The job whose artifact holds this output, when it is not `job`'s
    /// own: the dependency's inputs were those of an earlier run of another
    /// job (early cutoff), and that run's output is fetched and read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Hash32>,
}

impl DepInput {
    /// The key of the artifact that holds the dependency's output.
    pub fn artifact(&self) -> Hash32 {
        self.artifact.unwrap_or(self.job)
    }
}

/// Work sent to a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The run: report with it.
    pub run: u64,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Content ID.
    pub job: Hash32,
    /// A name for logs (one of the builds' names for the job).
    pub name: String,
    /// Commands with placeholders.
    pub commands: Vec<String>,
    /// Environment with placeholders.
    pub env: BTreeMap<String, String>,
    /// Milliseconds.
    pub timeout_ms: Option<u64>,
    /// Every source file the job sees.
    pub sources: Vec<SourceFile>,
    /// Outputs of the jobs it needs.
    pub deps: Vec<DepInput>,
    /// Run the commands even if the output is already in the worker's cache.
    pub no_cache: bool,
    /// The coordinator's shared cache holds the result: fetch it from there
    /// (`GET /v1/cache/{job}`) instead of running, if it can be had.
    #[serde(default)]
    pub pull: bool,
    /// Named tokens the job takes on the worker (the worker enforces them
    /// too, in its build stage).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tokens: BTreeMap<String, u64>,
    /// Tokens it takes exclusively: its build waits until no other stage of
    /// any run on the worker uses them, and holds new users back meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusive: Vec<String>,
}

/// Reply to [`PollRequest`], and to a [`Report`] (whose answer carries
/// the mail only if the report asked for it, [`Report::deliver`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollReply {
    /// Start these.
    pub assign: Vec<Assignment>,
    /// Do not start these (assigned, then cancelled).
    pub drop: Vec<u64>,
    /// Stop these (running, then cancelled).
    pub stop: Vec<u64>,
    /// Suspend these: SIGSTOP to the run's processes; its timeout stops.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspend: Vec<u64>,
    /// Resume these: SIGCONT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resume: Vec<u64>,
    /// The coordinator does not know this worker (it restarted with fresh
    /// state, or declared it lost): register again.
    pub reregister: bool,
    /// The version of the worker's mail this answer speaks of (versions
    /// grow as mail is added; 0: none). From a `notify_only` poll: mail up
    /// to this version waits (send it back as [`PollRequest::seen`]), and a
    /// report with [`Report::deliver`] takes it. From an answer that takes
    /// the mail: everything up to this version was taken.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mail: u64,
}

impl PollReply {
    /// Does it carry mail (anything for the worker to act on)?
    pub fn has_mail(&self) -> bool {
        !self.assign.is_empty()
            || !self.drop.is_empty()
            || !self.stop.is_empty()
            || !self.suspend.is_empty()
            || !self.resume.is_empty()
    }
}

/// How a run ended, as the worker reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// The run.
    pub run: u64,
    /// Did every command succeed (and the output get stored)?
    pub success: bool,
    /// The failing command's exit code, or 0.
    pub exit_code: Option<i32>,
    /// The output was already in the worker's cache: nothing ran.
    pub cached: bool,
    /// For people: the tail of stderr, or what went wrong.
    pub detail: String,
    /// The output artifact, when it succeeded.
    pub output: Option<HeldArtifact>,
    /// Milliseconds the commands ran.
    pub duration_ms: u64,
    /// Milliseconds in each stage the run went through: `pull` (from the
    /// shared cache), `fetch` (sources and dependencies), `build` (the
    /// commands and storing the output).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<String, u64>,
    /// With a failure before the commands ran: dependencies whose outputs
    /// the worker could get from no holder and not from the shared cache
    /// (their workers are gone). The coordinator builds them again and runs
    /// the job after them, without counting this run as an attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_inputs: Vec<Hash32>,
    /// The worker failed the run, not the job: its own disk could not be
    /// written (full, or its cache directory gone; the worker then takes
    /// nothing new), or the run's supervisor was killed under it. The job
    /// goes back to the queue as for a lost worker.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub worker_fault: bool,
}

/// `POST /v1/workers/{id}/report`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Runs that started. A worker may hold a start back for a few
    /// milliseconds so that a quick run's start travels with its end, in
    /// one report; the coordinator shows a job running from its
    /// assignment, and treats a run whose start it has not heard of as not
    /// started (a cancel drops it instead of stopping it: the worker does
    /// the same for both).
    pub started: Vec<u64>,
    /// Runs that ended.
    pub finished: Vec<RunResult>,
    /// Artifacts that appeared in its cache (other than outputs above).
    pub added: Vec<HeldArtifact>,
    /// Artifacts it evicted.
    pub evicted: Vec<Hash32>,
    /// The stage each run in flight is in now (display only: the
    /// coordinator shows it in the status and does not record it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<RunStage>,
    /// Answer with the worker's mail, as a poll would (the worker applies
    /// the answer like a poll's). Without it the answer never carries mail,
    /// so a worker that does not know this field loses nothing. A report
    /// with only this set is how a `notify_only` worker takes its mail.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deliver: bool,
    /// With `deliver`: the highest [`PollReply::mail`] version an answer
    /// has brought this session (0 before the first). The coordinator keeps
    /// the mail of its last answer until a report says it arrived, and sends
    /// it again, ahead of anything newer, to a report that says it did not
    /// (the answer was lost with its connection). A worker that leaves this
    /// out gets each piece of mail once, whatever became of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received: Option<u64>,
}

/// Where a run in flight stands on its worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStage {
    /// The run.
    pub run: u64,
    /// Its stage now: `pull`, `fetch` or `build`.
    pub stage: String,
    /// It waits for the stage's tokens.
    pub waiting: bool,
}

/// `GET /v1/workers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Its ID (as in `POST /v1/workers/{id}/leave`).
    #[serde(default)]
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its base URL.
    pub url: String,
    /// Registered and holding its lease.
    pub alive: bool,
    /// Not alive because it left on its own (drained or stopped), not
    /// because it missed its lease.
    #[serde(default, skip_serializing_if = "is_default")]
    pub left: bool,
    /// Alive, but shutting down once its runs end: nothing new goes to it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub draining: bool,
    /// What it offers.
    pub capacity: WorkerCapacity,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Runs in flight on it.
    pub running: usize,
}

/// `POST /v1/workers/unreachable`: a client or worker could not connect to
/// a live worker (a holder of an output it fetched).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreachableRequest {
    /// The worker's URL, as the coordinator gave it.
    pub url: String,
}

/// Reply to [`UnreachableRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreachableReply {
    /// Nothing listens at that URL any more: the coordinator took the
    /// worker there as lost (what it held is built again elsewhere).
    pub lost: bool,
}

/// `GET /v1/artifacts/{job}`: where a job's output can be fetched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactLocation {
    /// Digest of its packed tree, to verify the copy.
    pub tree: Option<Hash32>,
    /// Base URLs of live workers holding it.
    pub holders: Vec<String>,
    /// The job whose artifact holds it, when that is another job's (early
    /// cutoff): fetch that one (from the holders, or the shared cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Hash32>,
}

/// An error body: every non-2xx reply carries one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for people.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of event reads back as it was written (optional fields
    /// set and unset), and events that lack a field, name an unknown kind or
    /// carry a wrong state are refused.
    #[test]
    fn events_round_trip_and_bad_ones_are_refused() {
        let job = || "n1".to_owned();
        let kinds = vec![
            EventKind::BuildQueued { jobs: 3 },
            EventKind::JobQueued { job: job() },
            EventKind::JobStarted { job: job(), worker: "w\"1".into(), attempt: 2 },
            EventKind::JobFinished {
                job: job(),
                state: JobState::Failed,
                exit_code: Some(3),
                detail: "x\ny".into(),
            },
            EventKind::JobFinished {
                job: job(),
                state: JobState::Cached,
                exit_code: None,
                detail: String::new(),
            },
            EventKind::JobSuspended { job: job(), evicted_by: Some("n2".into()) },
            EventKind::JobSuspended { job: job(), evicted_by: None },
            EventKind::JobResumed { job: job() },
            EventKind::JobRequeued { job: job(), attempts: 1, reason: Some("lost".into()) },
            EventKind::JobRequeued { job: job(), attempts: 1, reason: None },
            EventKind::JobSkipped { job: job(), reason: "a dependency failed".into() },
            EventKind::JobCancelled { job: job() },
            EventKind::BuildFinished { state: BuildState::Cancelled, counts: BTreeMap::new() },
            EventKind::BuildFinished {
                state: BuildState::Failed,
                counts: BTreeMap::from([(JobState::Succeeded, 4), (JobState::Failed, 1)]),
            },
            EventKind::BuildRetried { jobs: 2 },
        ];
        // Each kind is among them (the match fails to compile when a kind
        // is added, as a reminder to add it here).
        let mut seen = std::collections::BTreeSet::new();
        for (seq, kind) in kinds.into_iter().enumerate() {
            seen.insert(match &kind {
                EventKind::BuildQueued { .. } => 0,
                EventKind::JobQueued { .. } => 1,
                EventKind::JobStarted { .. } => 2,
                EventKind::JobFinished { .. } => 3,
                EventKind::JobSuspended { .. } => 4,
                EventKind::JobResumed { .. } => 5,
                EventKind::JobRequeued { .. } => 6,
                EventKind::JobSkipped { .. } => 7,
                EventKind::JobCancelled { .. } => 8,
                EventKind::BuildFinished { .. } => 9,
                EventKind::BuildRetried { .. } => 10,
            });
            let event = BuildEvent { seq: seq as u64, at: 1_700_000_000_000, kind };
            let line = serde_json::to_string(&event).unwrap();
            let read: BuildEvent = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(read, event, "{line}");
        }
        assert_eq!(seen.len(), 11);
        for (bad, why) in [
            (r#"{"seq":0,"at":1,"event":"job_started","job":"a","attempt":1}"#, "missing field `worker`"),
            (r#"{"seq":0,"at":1,"event":"job_exploded","job":"a"}"#, "unknown variant"),
            (r#"{"seq":0,"at":1,"event":"build_finished","state":"melted"}"#, "melted"),
            (r#"{"seq":0,"event":"job_queued","job":"a"}"#, "missing field `at`"),
            (r#"{"seq":0,"at":1,"event":"job_finished","job":"a","exit_code":0}"#, "missing field `state`"),
            (r#"{"seq":0,"at":1,"event":"job_finished","job":"a","state":"queued_up"}"#, "queued_up"),
            (r#"{"seq":0,"at":1,"event":"build_finished","state":"skipped"}"#, "skipped"),
            (r#"{"seq":0,"at":1,"event":"job_skipped","job":"a"}"#, "missing field `reason`"),
            (r#"{"seq":0,"at":1,"event":"job_cancelled"}"#, "missing field `job`"),
        ] {
            let e = serde_json::from_str::<BuildEvent>(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// A borrowed submit request is the owned one's JSON, with and without
    /// its optional fields.
    #[test]
    fn a_borrowed_submit_request_serializes_as_the_owned_one() {
        let mut job = JobDef::new("a", Hash32([1; 32]));
        job.commands = vec!["true".into()];
        let build = BuildSpec { name: "b".into(), sources: Vec::new(), jobs: vec![job] };
        for (max_parallel, queue) in [(None, None), (Some(3), Some("ci".to_owned()))] {
            let owned = SubmitRequest {
                build: Arc::new(build.clone()),
                tenant: "t".into(),
                no_cache: true,
                on_error: OnError::Continue,
                max_parallel,
                queue: queue.clone(),
            };
            let borrowed = SubmitRequestRef {
                build: &build,
                tenant: "t",
                no_cache: true,
                on_error: OnError::Continue,
                max_parallel,
                queue: queue.as_deref(),
            };
            assert_eq!(
                serde_json::to_string(&borrowed).expect("json"),
                serde_json::to_string(&owned).expect("json")
            );
        }
    }

    /// A job's fields at their default are left out of its JSON and read
    /// back as the default; JSON that spells them out reads the same.
    #[test]
    fn a_job_leaves_out_its_default_fields() {
        let plain = JobDef { commands: vec!["true".into()], ..JobDef::new("a", Hash32([1; 32])) };
        let json = serde_json::to_string(&plain).expect("json");
        assert_eq!(json, format!(r#"{{"name":"a","id":"{}","commands":["true"]}}"#, "01".repeat(32)));
        assert_eq!(serde_json::from_str::<JobDef>(&json).expect("parse"), plain);
        let spelled = format!(
            r#"{{"name":"a","id":"{}","commands":["true"],"env":{{}},"needs":[],"cpu_millis":0,"memory":0,
            "tokens":{{}},"exclusive":[],"labels":{{}},"priority":0,"timeout_ms":null,"retries":0}}"#,
            "01".repeat(32)
        );
        assert_eq!(serde_json::from_str::<JobDef>(&spelled).expect("parse"), plain);
        let mut full = plain.clone();
        full.env.insert("K".into(), "v".into());
        full.needs = vec!["b".into()];
        (full.cpu_millis, full.memory, full.priority, full.timeout_ms, full.retries) =
            (500, 1 << 20, -1, Some(9), 2);
        full.tokens.insert("gpu".into(), 1);
        full.exclusive = vec!["gpu".into()];
        full.labels.insert("os".into(), "linux".into());
        let json = serde_json::to_string(&full).expect("json");
        assert_eq!(serde_json::from_str::<JobDef>(&json).expect("parse"), full);
    }

    #[test]
    fn hashes_round_trip_as_hex_and_reject_garbage() {
        let h = Hash32([0xab; 32]);
        let json = serde_json::to_string(&h).expect("json");
        assert_eq!(json, format!("\"{}\"", "ab".repeat(32)));
        assert_eq!(serde_json::from_str::<Hash32>(&json).expect("parse"), h);
        assert!("zz".repeat(32).parse::<Hash32>().is_err());
        assert!("ab".parse::<Hash32>().is_err());
        // 64 bytes, not 64 digits.
        assert!("é".repeat(32).parse::<Hash32>().is_err());
        assert!(format!("+{}", "a".repeat(63)).parse::<Hash32>().is_err());
        let every: Vec<u8> = (0..=255).collect();
        for bytes in every.chunks(32) {
            let h = Hash32(bytes.try_into().expect("32 bytes"));
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(h.to_string(), hex);
            assert_eq!(serde_json::to_string(&h).expect("json"), format!("\"{hex}\""));
            assert_eq!(hex.parse::<Hash32>(), Ok(h));
            assert_eq!(hex.to_uppercase().parse::<Hash32>(), Ok(h), "upper case is read too");
            let escaped = format!("\"\\u00{:02x}{}\"", hex.as_bytes()[0], &hex[1..]);
            assert_eq!(serde_json::from_str::<Hash32>(&escaped).expect("parse"), h, "{escaped}");
        }
    }

    #[test]
    fn status_json_has_the_documented_shape() {
        let status = BuildStatus {
            id: 3,
            name: "hello".into(),
            tenant: "web".into(),
            queue: "ci".into(),
            state: BuildState::Failed,
            jobs: vec![JobStatus {
                name: "a".into(),
                id: Hash32([1; 32]),
                state: JobState::Skipped,
                worker: None,
                attempts: 0,
                exit_code: None,
                detail: String::new(),
                stages: BTreeMap::new(),
                stage: None,
                stage_waiting: false,
            }],
        };
        let v: serde_json::Value = serde_json::to_value(&status).expect("json");
        assert_eq!(v["state"], "failed");
        assert_eq!(v["tenant"], "web");
        assert_eq!(v["queue"], "ci");
        assert_eq!(v["jobs"][0]["state"], "skipped");
        for key in ["name", "id", "state", "worker", "attempts", "exit_code"] {
            assert!(v["jobs"][0].get(key).is_some(), "missing {key}");
        }
    }
}
