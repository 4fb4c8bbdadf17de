//! A spec submitted again is recorded once: the input log holds the first
//! submission whole and names its build for the later ones, and replaying
//! that log rebuilds the same builds.
//!
//! A real coordinator on loopback with its SQLite log, and a client speaking
//! the HTTP API.

use std::time::Duration;

use drover_coordinator::CoordinatorConfig;
use drover_http::Http;
use drover_proto::{BuildSpec, BuildStatus, Hash32, JobDef, OnError, SubmitReply, SubmitRequest};
use drover_solver::{Input, Solver};

fn request(name: &str, tenant: &str, max_parallel: Option<u32>) -> SubmitRequest {
    let job = |n: &str, needs: &[&str]| JobDef {
        commands: vec![format!("echo {n}")],
        needs: needs.iter().map(|s| s.to_string()).collect(),
        ..JobDef::new(n, Hash32(*blake3::hash(format!("{name}/{n}").as_bytes()).as_bytes()))
    };
    SubmitRequest {
        build: BuildSpec {
            name: name.into(),
            sources: Vec::new(),
            jobs: vec![job("a", &[]), job("b", &["a"])],
        }
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
    let mut config = CoordinatorConfig::new(dir.path().to_owned());
    config.listen = ([127, 0, 0, 1], 0).into();
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
    let first = submit(request("s", "t", None)).await;
    let again = submit(request("s", "u", Some(1))).await;
    let other = submit(request("o", "t", None)).await;
    let third = submit(request("s", "t", None)).await;

    let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
    let mut inputs = Vec::new();
    store
        .replay(|r| inputs.push((r.at, serde_json::from_slice::<Input>(&r.body).expect("a recorded input"))))
        .expect("replay");
    let submits: Vec<String> = inputs
        .iter()
        .filter_map(|(_, input)| match input {
            Input::Submit(req) => Some(format!("{} whole", req.build.name)),
            Input::SubmitLike { like, tenant, max_parallel, .. } => {
                Some(format!("like {like} for {tenant}, {max_parallel:?}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        submits,
        [
            "s whole".to_owned(),
            format!("like {first} for u, Some(1)"),
            "o whole".into(),
            format!("like {first} for t, None")
        ]
    );

    let mut replayed = Solver::new(core);
    for (at, input) in inputs {
        let _ = replayed.handle(drover_core::Millis(at), input);
    }
    for id in [first, again, other, third] {
        let live: BuildStatus =
            http.get_json(&format!("{url}/v1/builds/{id}")).await.expect("the live build's status");
        let from_log = replayed.build_status(id).expect("the replayed build");
        assert_eq!((from_log.name.as_str(), from_log.jobs.len()), (live.name.as_str(), live.jobs.len()));
        assert_eq!(from_log.jobs, live.jobs, "build {id}");
    }
}
