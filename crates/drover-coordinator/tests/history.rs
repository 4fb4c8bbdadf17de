//! The coordinator keeps a bounded number of finished builds: its setting
//! is recorded in the input log, older finished builds are forgotten, and a
//! client asking for one is told why it is gone.
//!
//! A real coordinator on loopback with its SQLite log, and a client speaking
//! the HTTP API.

mod common;

use std::time::Duration;

use drover_http::Http;
use drover_proto::{BuildSpec, BuildStatus, Hash32, JobDef, OnError, SubmitReply, SubmitRequest};
use drover_solver::Input;

fn request(n: usize) -> SubmitRequest {
    let job = JobDef {
        commands: vec![format!("echo {n}")],
        ..JobDef::new("a", Hash32(*blake3::hash(format!("job {n}").as_bytes()).as_bytes()))
    };
    SubmitRequest {
        build: drover_coordinator::with_content_ids(BuildSpec {
            name: format!("b{n}"),
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

/// The history settings recorded in the log under `dir`, in order.
fn settings(dir: &std::path::Path) -> Vec<Option<u64>> {
    let store = drover_store::Store::open(&dir.join("state.db")).expect("store");
    let mut settings = Vec::new();
    store
        .replay(0, |r| {
            if let Ok(Input::KeepFinished { builds }) = serde_json::from_slice::<Input>(&r.body) {
                settings.push(builds);
            }
        })
        .expect("replay");
    settings
}

#[tokio::test]
async fn finished_builds_past_the_setting_are_forgotten_and_said_to_be() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The log of an earlier coordinator, long ago: three builds that ended
    // at once (no worker could run them) and no history setting.
    let mut store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    for n in 0..3 {
        let record = serde_json::to_vec(&Input::Submit(request(n))).expect("json");
        store.append([(1_000 + n as u64, &record[..])]).expect("append");
    }
    drop(store);
    let mut config = common::loopback(dir.path());
    config.keep_finished_builds = Some(1);
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let gone = http.get_json::<BuildStatus>(&format!("{url}/v1/builds/1")).await.expect_err("forgotten");
    assert_eq!(gone.status(), Some(404));
    assert!(gone.to_string().contains("build 1 is no longer kept"), "{gone}");
    let latest: BuildStatus = http.get_json(&format!("{url}/v1/builds/3")).await.expect("the latest is kept");
    assert_eq!(latest.name, "b2");
    let unknown = http.get_json::<BuildStatus>(&format!("{url}/v1/builds/99")).await.expect_err("never was");
    assert!(unknown.to_string().contains("no build 99"), "{unknown}");
    // A build submitted now ends and is readable beside the one kept (the
    // minute a finished build is kept whatever the setting is the solver
    // tests' to show: no real time passes here).
    let reply: SubmitReply =
        http.post_json(&format!("{url}/v1/builds"), &request(3), None).await.expect("submit");
    let now: BuildStatus = http.get_json(&format!("{url}/v1/builds/{}", reply.id)).await.expect("kept");
    assert!(now.state.is_final(), "{now:?}");
    let still: BuildStatus = http.get_json(&format!("{url}/v1/builds/3")).await.expect("still kept");
    assert_eq!(still.name, "b2");

    assert_eq!(settings(dir.path()), [Some(1)], "the setting is recorded once, at the start");
}

/// A start records the setting only when it differs from the log's: the
/// same setting again adds nothing, another one is recorded.
#[tokio::test]
async fn the_setting_is_recorded_only_when_it_changes() {
    for (logged, now, expected) in [
        (Some(7), Some(7), vec![Some(7)]),
        (Some(7), Some(9), vec![Some(7), Some(9)]),
        (Some(7), None, vec![Some(7), None]),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
        let record = serde_json::to_vec(&Input::KeepFinished { builds: logged }).expect("json");
        store.append([(1_000, &record[..])]).expect("append");
        drop(store);
        let mut config = common::loopback(dir.path());
        config.keep_finished_builds = now;
        let coordinator = drover_coordinator::start(config).await.expect("start");
        drop(coordinator);
        assert_eq!(settings(dir.path()), expected, "logged {logged:?}, configured {now:?}");
    }
}

/// A stream that starts at the beginning of a long history (longer than a
/// page of it) gets every event once, in order, to the build's end: the
/// history goes out a page at a time before the stream follows live.
#[tokio::test]
async fn a_long_history_streams_whole_and_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let mut req = request(0);
    let job = req.build.jobs[0].clone();
    let jobs = (0..6_000)
        .map(|i| JobDef {
            commands: vec![format!("echo {i}")],
            ..JobDef::new(format!("j{i}"), Hash32(*blake3::hash(format!("long {i}").as_bytes()).as_bytes()))
        })
        .chain([job])
        .collect();
    req.build =
        drover_coordinator::with_content_ids(BuildSpec { name: "long".into(), sources: Vec::new(), jobs })
            .into();
    let reply: SubmitReply = http.post_json(&format!("{url}/v1/builds"), &req, None).await.expect("submit");
    // No worker could ever run the jobs: each fails at once, so the history
    // is long and over.
    let mut reader =
        http.get_reader(&format!("{url}/v1/builds/{}/events?from=0", reply.id)).await.expect("events");
    let mut body = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut reader, &mut body).await.expect("read");
    let seqs: Vec<u64> = body
        .lines()
        .map(|line| serde_json::from_str::<drover_proto::BuildEvent>(line).expect("an event").seq)
        .collect();
    assert!(seqs.len() > 12_000, "{} events", seqs.len());
    assert!(seqs.iter().enumerate().all(|(i, &seq)| seq == i as u64), "every event once, in order");
    let status: BuildStatus = http.get_json(&format!("{url}/v1/builds/{}", reply.id)).await.expect("status");
    assert_eq!(status.state, drover_proto::BuildState::Failed);
}

/// `GET /v1/builds?summary=true` lists each kept build with its counts and
/// without its jobs; without it, the whole statuses, a page at a time.
#[tokio::test]
async fn builds_are_listed_whole_or_in_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    let mut ids = Vec::new();
    for n in 0..2 {
        let reply: SubmitReply =
            http.post_json(&format!("{url}/v1/builds"), &request(n), None).await.expect("submit");
        ids.push(reply.id);
    }
    let summaries: Vec<drover_proto::BuildSummary> =
        http.get_json(&format!("{url}/v1/builds?summary=true")).await.expect("summaries");
    let whole: Vec<BuildStatus> = http.get_json(&format!("{url}/v1/builds")).await.expect("statuses");
    assert_eq!(summaries.iter().map(|s| s.id).collect::<Vec<_>>(), ids);
    for (summary, status) in summaries.iter().zip(&whole) {
        assert_eq!((summary.id, &summary.name, summary.state), (status.id, &status.name, status.state));
        assert_eq!(summary.jobs, status.jobs.len() as u64);
        assert_eq!(summary.done, status.jobs.iter().filter(|j| j.state.is_final()).count() as u64);
    }
    // The whole statuses come a page at a time: after a build, the next
    // ones; past the last, none.
    let rest: Vec<BuildStatus> =
        http.get_json(&format!("{url}/v1/builds?after={}", ids[0])).await.expect("the next page");
    assert_eq!(rest.iter().map(|b| b.id).collect::<Vec<_>>(), &ids[1..]);
    let past: Vec<BuildStatus> =
        http.get_json(&format!("{url}/v1/builds?after={}", ids[1])).await.expect("past the last");
    assert!(past.is_empty(), "{past:?}");
}
