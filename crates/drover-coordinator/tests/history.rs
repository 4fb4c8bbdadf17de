//! The coordinator keeps a bounded number of finished builds: its setting
//! is recorded in the input log, older finished builds are forgotten, and a
//! client asking for one is told why it is gone.
//!
//! A real coordinator on loopback with its SQLite log, and a client speaking
//! the HTTP API.

use std::time::Duration;

use drover_coordinator::CoordinatorConfig;
use drover_http::Http;
use drover_proto::{BuildSpec, BuildStatus, Hash32, JobDef, OnError, SubmitReply, SubmitRequest};
use drover_solver::Input;

fn request(n: usize) -> SubmitRequest {
    let job = JobDef {
        commands: vec![format!("echo {n}")],
        ..JobDef::new("a", Hash32(*blake3::hash(format!("job {n}").as_bytes()).as_bytes()))
    };
    SubmitRequest {
        build: BuildSpec { name: format!("b{n}"), sources: Vec::new(), jobs: vec![job] }.into(),
        tenant: "t".into(),
        no_cache: false,
        on_error: OnError::Quit,
        max_parallel: None,
        queue: None,
    }
}

#[tokio::test]
async fn finished_builds_past_the_setting_are_forgotten_and_said_to_be() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = CoordinatorConfig::new(dir.path().to_owned());
    config.listen = ([127, 0, 0, 1], 0).into();
    config.keep_finished_builds = Some(1);
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let http = Http::new(None, Duration::from_secs(30));
    let url = coordinator.url();
    // No worker: each build ends cancelled, which is as finished as any.
    for n in 0..20 {
        let reply: SubmitReply =
            http.post_json(&format!("{url}/v1/builds"), &request(n), None).await.expect("submit");
        http.post(&format!("{url}/v1/builds/{}/cancel", reply.id)).await.expect("cancel");
    }
    let gone = http.get_json::<BuildStatus>(&format!("{url}/v1/builds/1")).await.expect_err("forgotten");
    assert_eq!(gone.status(), Some(404));
    assert!(gone.to_string().contains("build 1 is no longer kept"), "{gone}");
    let latest: BuildStatus =
        http.get_json(&format!("{url}/v1/builds/20")).await.expect("the latest is kept");
    assert_eq!(latest.name, "b19");
    let unknown = http.get_json::<BuildStatus>(&format!("{url}/v1/builds/99")).await.expect_err("never was");
    assert!(unknown.to_string().contains("no build 99"), "{unknown}");

    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let mut settings = Vec::new();
    store
        .replay(|r| {
            if let Ok(Input::KeepFinished { builds }) = serde_json::from_slice::<Input>(&r.body) {
                settings.push(builds);
            }
        })
        .expect("replay");
    assert_eq!(settings, [Some(1)], "the setting is recorded once, at the start");
}
