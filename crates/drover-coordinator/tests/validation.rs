//! What a client sends straight to the API, without the CLI's build-file
//! checks, is held to the same rules: job names that are directory names,
//! commands and environments Linux can pass to a process, source paths a
//! worker can lay out, names that say something and cannot pass for
//! others, and a worker capacity a machine can have. Each is refused with
//! 400 and a `{"error": ...}` naming what is wrong, and leaves nothing
//! behind.
//!
//! A real coordinator on loopback, and a client speaking the HTTP API.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use drover_http::{Http, HttpError};
use drover_proto::{
    BuildSpec, Hash32, JobDef, OnError, RegisterReply, RegisterRequest, SourceFile, SubmitReply,
    SubmitRequest, WorkerCapacity,
};

/// A coordinator and a client of it.
struct Api {
    url: String,
    http: Http,
    _coordinator: drover_coordinator::Coordinator,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn start() -> Api {
        let dir = tempfile::tempdir().expect("tempdir");
        let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
        Api {
            url: coordinator.url(),
            http: Http::new(None, Duration::from_secs(60)),
            _coordinator: coordinator,
            _dir: dir,
        }
    }

    /// Submits `req`: the build's ID, or the status and error of a refusal.
    async fn submit(&self, req: &SubmitRequest) -> Result<u64, (u16, String)> {
        self.http
            .post_json::<_, SubmitReply>(&format!("{}/v1/builds", self.url), req, None)
            .await
            .map(|reply| reply.id)
            .map_err(refusal)
    }

    /// Registers `req`: the worker's ID, or the status and error of a refusal.
    async fn register(&self, req: &RegisterRequest) -> Result<u64, (u16, String)> {
        self.http
            .post_json::<_, RegisterReply>(&format!("{}/v1/workers/register", self.url), req, None)
            .await
            .map(|reply| reply.worker)
            .map_err(refusal)
    }

    /// Asserts that `req` is refused with 400 and an error saying `why`.
    async fn refuses(&self, req: &SubmitRequest, why: &str) {
        match self.submit(req).await {
            Err((400, error)) => assert!(error.contains(why), "refused, but not for {why:?}: {error}"),
            other => panic!("expected a 400 saying {why:?}, got {other:?}"),
        }
    }

    /// How many builds the coordinator holds.
    async fn builds(&self) -> usize {
        let summaries: Vec<serde_json::Value> =
            self.http.get_json(&format!("{}/v1/builds?summary=true", self.url)).await.expect("builds");
        summaries.len()
    }
}

/// The status and the error body's text of a refused request.
fn refusal(e: HttpError) -> (u16, String) {
    match e {
        HttpError::Status { status, message, .. } => (status, message),
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// A build of one job, `job`, running `true`.
fn one_job(job: JobDef) -> SubmitRequest {
    SubmitRequest {
        build: drover_coordinator::with_content_ids(BuildSpec {
            name: "b".into(),
            sources: Vec::new(),
            jobs: vec![job],
        })
        .into(),
        tenant: "t".into(),
        no_cache: false,
        on_error: OnError::Quit,
        max_parallel: None,
        queue: None,
    }
}

fn job(name: &str) -> JobDef {
    JobDef {
        commands: vec!["true".into()],
        ..JobDef::new(name, Hash32(*blake3::hash(name.as_bytes()).as_bytes()))
    }
}

#[tokio::test]
async fn job_names_are_held_to_the_build_files_rule() {
    let api = Api::start().await;
    let long = "n".repeat(100 << 10);
    for (name, why) in [
        (".", r#"invalid job name ".""#),
        ("..", r#"invalid job name "..""#),
        ("a/b", r#"invalid job name "a/b": '/' is not allowed"#),
        ("a\u{1b}]0;owned\u{7}", r#"invalid job name "a\u{1b}]0;owned\u{7}""#),
        (long.as_str(), "is 102400 bytes long; at most 255"),
    ] {
        api.refuses(&one_job(job(name)), why).await;
    }
    assert_eq!(api.builds().await, 0, "nothing was submitted");
    api.submit(&one_job(job("compile-a.1_x"))).await.expect("a good name");
}

#[tokio::test]
async fn commands_and_environments_have_the_build_files_limits() {
    let api = Api::start().await;
    let mut long_command = job("cc");
    long_command.commands.push("x".repeat(127 << 10));
    api.refuses(&one_job(long_command), r#"job "cc": command 2 is 127 KiB long; at most 126 KiB"#).await;
    let mut long_value = job("cc");
    long_value.env.insert("CFLAGS".into(), "-O2 ".repeat(32 << 10));
    api.refuses(&one_job(long_value), r#"job "cc": environment variable "CFLAGS" is 129 KiB long"#).await;
    let mut large_env = job("cc");
    large_env.env = (0..9).map(|i| (format!("V{i}"), "v".repeat(120 << 10))).collect();
    api.refuses(&one_job(large_env), r#"job "cc": its environment is 1081 KiB in all; at most 1 MiB"#).await;
    let mut nul = job("cc");
    nul.commands.push("echo a\0b".into());
    api.refuses(&one_job(nul), r#"job "cc": command 2 contains NUL"#).await;
    assert_eq!(api.builds().await, 0, "nothing was submitted");
    // Up to the limits, as the build file allows.
    let mut largest = job("cc");
    largest.commands = vec!["x".repeat(126 << 10)];
    largest.env = (0..8).map(|i| (format!("V{i}"), "v".repeat(120 << 10))).collect();
    api.submit(&one_job(largest)).await.expect("within the limits");
}

#[tokio::test]
async fn reruns_on_failure_are_bounded_and_not_for_gang_members() {
    let api = Api::start().await;
    let many = JobDef { retry_on_failure: 11, ..job("test") };
    api.refuses(&one_job(many), r#"job "test": retry_on_failure is 11; at most 10 reruns"#).await;
    let ganged = JobDef {
        retry_on_failure: 1,
        gang: Some(drover_proto::GangDef { name: "g".into(), min_available: 1, restart: false }),
        ..job("rank")
    };
    api.refuses(&one_job(ganged), r#"job "rank": a gang member has no retry_on_failure"#).await;
    assert_eq!(api.builds().await, 0, "nothing was submitted");
    api.submit(&one_job(JobDef { retry_on_failure: 10, ..job("test") })).await.expect("within the limit");
}

#[tokio::test]
async fn source_paths_must_be_laid_out_as_files() {
    let api = Api::start().await;
    let with_sources = |paths: &[&str]| {
        let mut req = one_job(job("a"));
        let mut build = (*req.build).clone();
        build.sources = paths
            .iter()
            .map(|path| SourceFile {
                path: (*path).into(),
                digest: Hash32(*blake3::hash(path.as_bytes()).as_bytes()),
                size: 1,
                executable: false,
            })
            .collect();
        req.build = build.into();
        req
    };
    // Sorted, as the CLI sends them: `a` and `a/b` are not neighbours.
    api.refuses(&with_sources(&["a", "a!", "a.c", "a/b"]), r#"source paths "a" and "a/b" conflict"#).await;
    let long = format!("{}/f", "d".repeat(200)).repeat(20);
    api.refuses(&with_sources(&[&long]), "is 4040 bytes long; at most 3072").await;
    let deep = "d/".repeat(1000) + "f";
    api.refuses(&with_sources(&[&deep]), "is 1001 levels deep; at most 256").await;
    assert_eq!(api.builds().await, 0, "nothing was submitted");
    // Fine paths get as far as the uploads they lack.
    api.refuses(&with_sources(&["a.c", "a/b", "a/c/d"]), "3 source file(s) were not uploaded").await;
}

/// Build and tenant names must say something, and no name shown to users
/// may hide a character that makes it look like another.
#[tokio::test]
async fn names_are_not_empty_and_have_no_invisible_characters() {
    let api = Api::start().await;
    let mut no_tenant = one_job(job("a"));
    no_tenant.tenant = String::new();
    api.refuses(&no_tenant, "the tenant cannot be empty").await;
    let mut blank = one_job(job("a"));
    blank.build = BuildSpec { name: " ".into(), ..(*blank.build).clone() }.into();
    api.refuses(&blank, "the build name cannot be empty").await;
    let mut hidden = one_job(job("a"));
    hidden.tenant = "team\u{200b}".into();
    api.refuses(&hidden, "the tenant \"team\\u{200b}\" contains the invisible character U+200B").await;
    let mut reversed = one_job(job("a"));
    reversed.build = BuildSpec { name: "release-\u{202e}1.2".into(), ..(*reversed.build).clone() }.into();
    api.refuses(&reversed, "invisible character U+202E").await;
    let mut label = job("a");
    label.labels.insert("pool\u{1b}[2J".into(), "big".into());
    api.refuses(&one_job(label), r#"job "a": a label name "pool\u{1b}[2J" contains the control character"#)
        .await;
    assert_eq!(api.builds().await, 0, "nothing was submitted");
}

fn worker(name: &str, slots: u32, cpu_millis: u64, memory: u64) -> RegisterRequest {
    RegisterRequest {
        name: name.into(),
        url: "http://127.0.0.1:9".into(),
        capacity: WorkerCapacity { slots, cpu_millis, memory, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running: Vec::new(),
    }
}

/// A worker cannot claim more than a machine has, nor pose as another
/// under a name that looks the same, nor carry an empty label.
#[tokio::test]
async fn a_registration_is_refused_absurd_capacity_and_lookalike_names() {
    let api = Api::start().await;
    let mut empty_label = worker("w1", 4, 4000, 8 << 30);
    empty_label.labels.insert(String::new(), "x".into());
    for (req, why) in [
        (worker("w1", 1_000_000_000, 4000, 8 << 30), "1000000000 slots; at most 8192"),
        (worker("w1", 4, u64::MAX, 8 << 30), "at most 8192000 (8192 CPUs"),
        (worker("w1", 4, 4000, u64::MAX), "bytes of memory; at most 4503599627370496 (4 PiB"),
        (
            worker("w\u{200b}1", 4, 4000, 8 << 30),
            "the worker name \"w\\u{200b}1\" contains the invisible character",
        ),
        (worker("", 4, 4000, 8 << 30), "the worker name cannot be empty"),
        (empty_label, "a label name cannot be empty"),
    ] {
        match api.register(&req).await {
            Err((400, error)) => assert!(error.contains(why), "refused, but not for {why:?}: {error}"),
            other => panic!("expected a 400 saying {why:?}, got {other:?}"),
        }
    }
    let workers: Vec<serde_json::Value> =
        api.http.get_json(&format!("{}/v1/workers", api.url)).await.expect("workers");
    assert!(workers.is_empty(), "no worker joined: {workers:?}");
    // The largest machine there can be is welcome.
    api.register(&worker("w1", 8192, 8_192_000, 1 << 52)).await.expect("a big machine");
}

/// A job's ID is its cache key, shared by every tenant: a submission whose
/// job claims another job's ID (a different command, cached under the ID
/// of a release job that others then take from the cache) is refused, and
/// so is a need that is not an earlier job. The ID its content makes is
/// taken; a job with `cache: false` states the nonce its ID hashes.
#[tokio::test]
async fn a_job_whose_id_is_not_its_contents_is_refused() {
    let api = Api::start().await;
    let release = one_job(JobDef { commands: vec!["echo genuine > {{out}}/x".into()], ..job("release") });
    let genuine = release.build.jobs[0].id;
    let mut poisoned =
        one_job(JobDef { commands: vec!["echo POISONED > {{out}}/x".into()], ..job("release") });
    let mut build = (*poisoned.build).clone();
    build.jobs[0].id = genuine;
    poisoned.build = build.into();
    api.refuses(&poisoned, "job \"release\": its ID is not the one its content makes").await;
    assert_eq!(api.builds().await, 0, "nothing was submitted");
    api.submit(&release).await.expect("the genuine job is taken");
    // A nonce makes another ID, which the coordinator makes again too.
    let mut fresh = one_job(JobDef { nonce: Some(Hash32([9; 32])), ..job("publish") });
    assert_ne!(fresh.build.jobs[0].id, one_job(job("publish")).build.jobs[0].id);
    api.submit(&fresh).await.expect("a job with a nonce");
    let mut build = (*fresh.build).clone();
    build.jobs[0].nonce = Some(Hash32([8; 32]));
    fresh.build = build.into();
    api.refuses(&fresh, "its ID is not the one its content makes").await;
}
