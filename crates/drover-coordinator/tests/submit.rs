//! A spec submitted again is recorded once: the input log holds the first
//! submission whole and names its build for the later ones, and replaying
//! that log rebuilds the same builds.
//!
//! A real coordinator on loopback with its SQLite log, and a client speaking
//! the HTTP API.

mod common;

use std::time::Duration;

use drover_http::Http;
use drover_proto::{BuildSpec, BuildStatus, Hash32, JobDef, OnError, SubmitReply, SubmitRequest};
use drover_solver::{Input, Solver};

fn request(name: &str, tenant: &str, max_parallel: Option<u32>) -> SubmitRequest {
    let job = |n: &str, needs: &[&str]| JobDef {
        commands: vec![format!("echo {n}")],
        env: [("BUILD".to_owned(), name.to_owned())].into(),
        needs: needs.iter().map(|s| s.to_string()).collect(),
        ..JobDef::new(n, Hash32(*blake3::hash(format!("{name}/{n}").as_bytes()).as_bytes()))
    };
    SubmitRequest {
        build: drover_coordinator::with_content_ids(BuildSpec {
            name: name.into(),
            sources: Vec::new(),
            jobs: vec![job("a", &[]), job("b", &["a"])],
        })
        .into(),
        tenant: tenant.into(),
        no_cache: false,
        on_error: OnError::Quit,
        max_parallel,
        queue: None,
    }
}

#[tokio::test]
async fn a_spec_submitted_again_is_recorded_once_and_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::loopback(dir.path());
    let core = config.core.clone();
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let submit = |req: SubmitRequest| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply: SubmitReply =
                http.post_json(&format!("{url}/v1/builds"), &req, None).await.expect("submit");
            reply.id
        }
    };
    // A burst of one spec (as twenty clients submitting at once), then
    // another spec, then the first again.
    let burst: Vec<u64> = futures::future::join_all((0..20).map(|i| {
        let tenant = if i % 2 == 0 { "t" } else { "u" };
        submit(request("s", tenant, Some(i + 1)))
    }))
    .await;
    let other = submit(request("o", "t", None)).await;
    let again = submit(request("s", "t", None)).await;

    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let mut inputs = Vec::new();
    store
        .replay(0, |r| {
            inputs.push((r.at, serde_json::from_slice::<Input>(&r.body).expect("a recorded input")))
        })
        .expect("replay");
    let submits: Vec<(u64, String)> = inputs
        .iter()
        .filter_map(|(_, input)| match input {
            Input::Submit(req) => {
                Some((req.max_parallel.map_or(0, u64::from), format!("{} whole", req.build.name)))
            }
            Input::SubmitLike { like, max_parallel, .. } => {
                Some((max_parallel.map_or(0, u64::from), format!("like {like}")))
            }
            _ => None,
        })
        .collect();
    let first = *burst.iter().min().expect("a build");
    let whole: Vec<&str> = submits.iter().filter(|s| s.1.ends_with("whole")).map(|s| s.1.as_str()).collect();
    assert_eq!(whole, ["s whole", "o whole"], "each spec whole once: {submits:?}");
    assert_eq!(submits.len(), 22);
    assert!(
        submits.iter().filter(|s| s.1.starts_with("like")).all(|s| s.1 != format!("like {other}")),
        "{submits:?}"
    );
    let mut options: Vec<u64> = submits.iter().filter(|s| s.1 != "o whole").map(|s| s.0).collect();
    options.sort_unstable();
    assert_eq!(options, [0].into_iter().chain(1..=20).collect::<Vec<_>>(), "each keeps its own options");
    assert!(first < other && other < again);

    let mut replayed = Solver::new(core);
    for (at, input) in inputs {
        let _ = replayed.handle(drover_core::Millis(at), input);
    }
    for id in burst.into_iter().chain([other, again]) {
        let live: BuildStatus =
            http.get_json(&format!("{url}/v1/builds/{id}")).await.expect("the live build's status");
        let from_log = replayed.build_status(id).expect("the replayed build");
        assert_eq!((from_log.name.as_str(), from_log.jobs.len()), (live.name.as_str(), live.jobs.len()));
        assert_eq!(from_log.jobs, live.jobs, "build {id}");
    }
}

/// After a restart, a spec a replayed build holds is still recorded by
/// reference when it comes again (as every `drover run` of an unchanged
/// build file brings it to a coordinator started afresh).
#[tokio::test]
async fn after_a_restart_a_spec_seen_before_is_recorded_by_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The log of an earlier coordinator: one build of the spec, recorded
    // whole, as a coordinator records a spec it has not seen.
    let mut store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let first = serde_json::to_vec(&Input::Submit(request("s", "t", None))).expect("json");
    store.append([(1_000, &first[..])]).expect("append");
    drop(store);

    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let reply: SubmitReply =
        http.post_json(&format!("{url}/v1/builds"), &request("s", "u", None), None).await.expect("submit");
    assert_eq!(reply.id, 2);
    let other: SubmitReply =
        http.post_json(&format!("{url}/v1/builds"), &request("o", "u", None), None).await.expect("submit");

    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let mut submits = Vec::new();
    store
        .replay(0, |r| match serde_json::from_slice::<Input>(&r.body).expect("a recorded input") {
            Input::Submit(req) => submits.push(format!("{} whole", req.build.name)),
            Input::SubmitLike { like, tenant, .. } => submits.push(format!("like {like} for {tenant}")),
            _ => {}
        })
        .expect("replay");
    assert_eq!(submits, ["s whole", "like 1 for u", "o whole"]);
    assert_eq!(other.id, 3);
}

/// A spec submitted again after more builds than the state thread looks
/// back over is still recorded by reference: the spec cache names the
/// latest build that holds it. A body with fields this coordinator does not
/// know is recorded without them.
#[tokio::test]
async fn a_spec_submitted_again_long_after_is_recorded_by_reference_and_unknown_fields_are_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let post = |body: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let reply: SubmitReply =
                http.post_json(&format!("{url}/v1/builds"), &body, None).await.expect("submit");
            reply.id
        }
    };
    // The first submission carries fields from a newer client, at the top,
    // in the build and in a job.
    let mut newer = serde_json::to_value(request("s", "t", None)).expect("json");
    newer["from_the_future"] = serde_json::json!(1);
    newer["build"]["colour"] = serde_json::json!("red");
    newer["build"]["jobs"][0]["weight"] = serde_json::json!(3);
    let first = post(newer.clone()).await;
    for i in 0..70 {
        post(serde_json::to_value(request(&format!("o{i}"), "t", None)).expect("json")).await;
    }
    let again = post(newer).await;

    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let mut records = Vec::new();
    store.replay(0, |r| records.push(r.body)).expect("replay");
    // (The first record is the scheduler's settings, whose tiers have weights.)
    let text: Vec<String> = records
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .filter(|t| !t.starts_with("{\"Configure\""))
        .collect();
    assert!(
        text.iter().all(|t| !t.contains("from_the_future") && !t.contains("colour") && !t.contains("weight"))
    );
    let like: Vec<&String> = text.iter().filter(|t| t.starts_with("{\"SubmitLike\"")).collect();
    assert_eq!(like.len(), 1, "{like:?}");
    assert!(like[0].starts_with(&format!("{{\"SubmitLike\":{{\"like\":{first},")), "{}", like[0]);
    assert_eq!(again, first + 71);
}

/// Requests the solver refuses change nothing, so they stay out of the log:
/// an empty build, a cancel or a suspend of a build that does not exist, a
/// suspend of a job the build lacks, a worker leaving that never joined.
/// Each gets its error (400, 404) all the same.
#[tokio::test]
async fn refused_requests_are_answered_and_left_out_of_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let status = |result: Result<(), drover_http::HttpError>| match result {
        Err(drover_http::HttpError::Status { status, .. }) => status,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let recorded = |dir: &std::path::Path| {
        let store = drover_store::Store::open(&dir.join("state.db")).expect("store");
        let mut inputs = Vec::new();
        store
            .replay(0, |r| inputs.push(serde_json::from_slice::<Input>(&r.body).expect("input")))
            .expect("replay");
        inputs
    };
    let kept = |inputs: &[Input]| {
        inputs
            .iter()
            .filter(|i| {
                !matches!(
                    i,
                    Input::Tick | Input::Restarted | Input::KeepFinished { .. } | Input::Configure { .. }
                )
            })
            .count()
    };

    let id = {
        let reply: SubmitReply = http
            .post_json(&format!("{url}/v1/builds"), &request("ok", "t", None), None)
            .await
            .expect("submit");
        reply.id
    };
    let before = kept(&recorded(dir.path()));
    assert_eq!(before, 1, "the accepted submission is recorded");

    let mut empty = request("empty", "t", None);
    empty.build = BuildSpec { name: "empty".into(), sources: Vec::new(), jobs: Vec::new() }.into();
    let refused: Result<SubmitReply, _> = http.post_json(&format!("{url}/v1/builds"), &empty, None).await;
    assert!(matches!(refused, Err(drover_http::HttpError::Status { status: 400, .. })), "{refused:?}");
    assert_eq!(status(http.post(&format!("{url}/v1/builds/999/cancel")).await), 404);
    assert_eq!(status(http.post(&format!("{url}/v1/builds/999/suspend")).await), 404);
    assert_eq!(status(http.post(&format!("{url}/v1/builds/{id}/suspend?job=nope")).await), 404);
    assert_eq!(status(http.post(&format!("{url}/v1/workers/999/leave")).await), 404);
    assert_eq!(status(http.post(&format!("{url}/v1/workers/999/drain")).await), 404);

    // A request the solver accepts after them is recorded: the refused ones
    // were handled (and answered) before it, yet left nothing.
    assert_eq!(
        status(http.post(&format!("{url}/v1/builds/{id}/suspend?job=a")).await),
        409,
        "a is not running"
    );
    http.post(&format!("{url}/v1/builds/{id}/cancel")).await.expect("cancel");
    let inputs = recorded(dir.path());
    assert_eq!(kept(&inputs), before + 1, "only the cancel joined the log: {inputs:?}");
    assert!(matches!(inputs.last(), Some(Input::Cancel { build }) if *build == id), "{inputs:?}");
    drop(coordinator);
}

/// A source's declared size must be its uploaded content's: a build that
/// says otherwise is refused (400, naming the file) and nothing is
/// submitted.
#[tokio::test]
async fn a_source_whose_size_is_not_its_contents_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let file = dir.path().join("a.c");
    std::fs::write(&file, "int main(void) { return 0; }\n").expect("write");
    let digest = Hash32(*blake3::hash(&std::fs::read(&file).expect("read")).as_bytes());
    http.put_file(&format!("{url}/v1/blobs/{digest}"), &file).await.expect("upload");
    let with_size = |size: u64| {
        let mut req = request("sized", "t", None);
        let mut build = (*req.build).clone();
        build.sources =
            vec![drover_proto::SourceFile { path: "a.c".into(), digest, size, executable: false }];
        req.build = drover_coordinator::with_content_ids(build).into();
        req
    };
    let refused = http
        .post_json::<_, SubmitReply>(&format!("{url}/v1/builds"), &with_size(1 << 40), None)
        .await
        .expect_err("a wrong size is refused");
    let message = refused.to_string();
    assert!(
        message.contains("400") && message.contains("source a.c: declared 1099511627776 bytes"),
        "{message}"
    );
    assert!(message.contains("has 29"), "{message}");
    let summaries: Vec<serde_json::Value> =
        http.get_json(&format!("{url}/v1/builds?summary=true")).await.expect("builds");
    assert!(summaries.is_empty(), "nothing was submitted: {summaries:?}");
    let accepted: SubmitReply =
        http.post_json(&format!("{url}/v1/builds"), &with_size(29), None).await.expect("the right size");
    assert_eq!(accepted.id, 1);
}
