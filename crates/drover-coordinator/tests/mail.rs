//! How a worker's mail reaches it: in the answer to a report that asks for
//! it (the next job rides on the report of the one before), or in a poll's
//! answer for a worker that does not ask; exactly once either way, also
//! when the two race; and nothing is lost across a coordinator restart.
//!
//! A real coordinator on loopback, and fake workers speaking the HTTP API.
//! Every wait is for an answer, with a generous deadline against hangs; no
//! test asserts how long anything took.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use drover_coordinator::{Coordinator, CoordinatorConfig};
use drover_http::Http;
use drover_proto::{
    Assignment, BuildSpec, BuildState, BuildStatus, Hash32, JobDef, PollReply, PollRequest, RegisterReply,
    RegisterRequest, Report, RunResult, SubmitReply, SubmitRequest, WorkerCapacity,
};
use drover_solver::Input;

/// Against hangs only: a lost assignment would otherwise wait forever.
const DEADLINE: Duration = Duration::from_secs(60);

fn config(dir: &std::path::Path) -> CoordinatorConfig {
    let mut config = common::loopback(dir);
    // Nobody is lost during a test, however slow the machine.
    config.core.lease_timeout = drover_core::Millis(600_000);
    config
}

/// A fresh coordinator in a temporary directory (both kept alive by the
/// caller), and a client of it.
async fn started() -> (tempfile::TempDir, Coordinator, Client) {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(config(dir.path())).await.expect("start");
    let client = Client::new(&coordinator);
    (dir, coordinator, client)
}

/// A client and fake worker of one coordinator.
struct Client {
    http: Http,
    url: String,
}

impl Client {
    fn new(coordinator: &Coordinator) -> Client {
        Client { http: Http::new(None, Duration::from_secs(30)), url: coordinator.url() }
    }

    async fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(&self, path: &str, body: &B) -> T {
        self.http.post_json(&format!("{}{path}", self.url), body, None).await.expect(path)
    }

    async fn register(&self, name: &str, slots: u32, running: Vec<u64>) -> RegisterReply {
        self.post("/v1/workers/register", &register_request(name, slots, running)).await
    }

    async fn submit(&self, name: &str, jobs: usize) -> u64 {
        let reply: SubmitReply = self.post("/v1/builds", &submit_request(name, jobs)).await;
        reply.id
    }

    async fn status(&self, build: u64) -> BuildStatus {
        self.http.get_json(&format!("{}/v1/builds/{build}", self.url)).await.expect("status")
    }

    async fn poll(&self, worker: u64, request: &PollRequest) -> PollReply {
        self.post(&format!("/v1/workers/{worker}/poll"), request).await
    }

    async fn report(&self, worker: u64, report: &Report) -> PollReply {
        self.post(&format!("/v1/workers/{worker}/report"), report).await
    }

    /// Waits, as a worker that takes its mail through reports, until mail
    /// waits, and takes it.
    async fn fetch(&self, worker: u64, seen: u64) -> PollReply {
        loop {
            let notice = self.poll(worker, &notify_only(seen)).await;
            assert!(!notice.reregister && !notice.has_mail(), "a notify-only poll took mail: {notice:?}");
            if notice.mail > seen {
                let mail = self.report(worker, &Report { deliver: true, ..Report::default() }).await;
                assert!(mail.mail >= notice.mail, "the answer took older mail than announced");
                return mail;
            }
        }
    }
}

fn register_request(name: &str, slots: u32, running: Vec<u64>) -> RegisterRequest {
    RegisterRequest {
        name: name.into(),
        url: format!("http://{name}.invalid"),
        capacity: WorkerCapacity { slots, cpu_millis: 64_000, memory: 64 << 30, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running,
    }
}

/// A build of `jobs` independent jobs with distinct IDs.
fn submit_request(name: &str, jobs: usize) -> SubmitRequest {
    let jobs = (0..jobs)
        .map(|i| {
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&(i as u64).to_le_bytes());
            id[8..8 + name.len().min(24)].copy_from_slice(&name.as_bytes()[..name.len().min(24)]);
            JobDef {
                commands: vec![format!("true {i}")],
                env: [("BUILD".to_owned(), name.to_owned())].into(),
                retries: 2,
                ..JobDef::new(format!("j{i}"), Hash32(id))
            }
        })
        .collect();
    SubmitRequest {
        build: drover_coordinator::with_content_ids(BuildSpec {
            name: name.into(),
            sources: Vec::new(),
            jobs,
        })
        .into(),
        tenant: "test".into(),
        no_cache: false,
        on_error: drover_proto::OnError::Continue,
        max_parallel: None,
        queue: None,
    }
}

fn notify_only(seen: u64) -> PollRequest {
    PollRequest { wait_ms: 10_000, notify_only: true, seen }
}

fn ended(a: &Assignment, success: bool) -> RunResult {
    RunResult {
        run: a.run,
        success,
        exit_code: Some(if success { 0 } else { 1 }),
        cached: false,
        detail: if success { String::new() } else { "cancelled".into() },
        output: None,
        duration_ms: 1,
        stages: BTreeMap::new(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    }
}

/// A report of runs that started and ended, asking for the mail.
fn done(runs: &[Assignment]) -> Report {
    Report {
        started: runs.iter().map(|a| a.run).collect(),
        finished: runs.iter().map(|a| ended(a, true)).collect(),
        deliver: true,
        ..Report::default()
    }
}

/// The build's state: its end is recorded with the report that ended it,
/// before that report is answered.
async fn finished(client: &Client, build: u64) -> BuildState {
    client.status(build).await.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_gets_its_next_job_in_the_answer_to_its_report() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let worker = client.register("w", 1, Vec::new()).await.worker;
        let build = client.submit("busy", 5).await;
        let mut requests = 0;
        // Idle: the poll says mail waits, a report takes it.
        let mut mail = client.fetch(worker, 0).await;
        requests += 2;
        let mut runs = BTreeSet::new();
        while !mail.assign.is_empty() {
            assert_eq!(mail.assign.len(), 1, "one slot, one job at a time");
            assert!(runs.insert(mail.assign[0].run), "run delivered twice");
            // Its start rides with its end; the answer brings the next job.
            mail = client.report(worker, &done(&mail.assign)).await;
            requests += 1;
        }
        assert_eq!(runs.len(), 5);
        // One poll and one report to start, then one report per job.
        assert_eq!(requests, 2 + 5);
        assert_eq!(finished(&client, build).await, BuildState::Succeeded);
    })
    .await
    .expect("the build finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_does_not_ask_gets_its_mail_from_the_poll_only() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let worker = client.register("old", 1, Vec::new()).await.worker;
        let build = client.submit("old", 2).await;
        let take = PollRequest { wait_ms: 10_000, notify_only: false, seen: 0 };
        let first = client.poll(worker, &take).await;
        assert_eq!(first.assign.len(), 1);
        // A report that does not ask never takes the mail its end caused.
        let report = Report { deliver: false, ..done(&first.assign) };
        let answer = client.report(worker, &report).await;
        assert!(!answer.has_mail() && !answer.reregister, "{answer:?}");
        let second = client.poll(worker, &take).await;
        assert_eq!(second.assign.len(), 1);
        assert_ne!(second.assign[0].run, first.assign[0].run);
        client.report(worker, &Report { deliver: false, ..done(&second.assign) }).await;
        assert_eq!(finished(&client, build).await, BuildState::Succeeded);
    })
    .await
    .expect("the build finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_and_reports_that_race_deliver_every_assignment_once() {
    const JOBS: usize = 300;
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let client = std::sync::Arc::new(client);
        let worker = client.register("racer", 3, Vec::new()).await.worker;
        let build = client.submit("race", JOBS).await;
        // A worker that both polls the old way (taking the mail) and asks
        // for it in every report: each assignment must reach it once.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Assignment, &'static str)>();
        let poller = {
            let (client, tx) = (client.clone(), tx.clone());
            tokio::spawn(async move {
                let take = PollRequest { wait_ms: 200, notify_only: false, seen: 0 };
                loop {
                    for a in client.poll(worker, &take).await.assign {
                        if tx.send((a, "poll")).is_err() {
                            return;
                        }
                    }
                }
            })
        };
        let mut runs = BTreeSet::new();
        let mut jobs = BTreeSet::new();
        let mut by_report = 0;
        while jobs.len() < JOBS {
            let (a, via) = rx.recv().await.expect("assignments");
            assert!(runs.insert(a.run), "run {} delivered twice", a.run);
            assert!(jobs.insert(a.job), "job {} assigned twice", a.name);
            by_report += usize::from(via == "report");
            let answer = client.report(worker, &done(std::slice::from_ref(&a))).await;
            for next in answer.assign {
                tx.send((next, "report")).expect("send");
            }
        }
        poller.abort();
        assert_eq!(finished(&client, build).await, BuildState::Succeeded);
        assert!(by_report > 0, "no assignment came in a report's answer");
    })
    .await
    .expect("every job was delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_before_its_start_was_heard_of_ends_cleanly() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let worker = client.register("w", 1, Vec::new()).await.worker;
        let build = client.submit("cancelled", 1).await;
        let mail = client.fetch(worker, 0).await;
        let run = mail.assign[0].clone();
        // The worker runs it but holds its start back; meanwhile the build
        // is cancelled. Not started as far as the coordinator knows: drop.
        client.http.post(&format!("{}/v1/builds/{build}/cancel", client.url)).await.expect("cancel");
        let drop = client.fetch(worker, mail.mail).await;
        assert_eq!(drop.drop, vec![run.run], "{drop:?}");
        // Its start arrives with its end: the slot is free again.
        let report = Report {
            started: vec![run.run],
            finished: vec![ended(&run, false)],
            deliver: true,
            ..Report::default()
        };
        let answer = client.report(worker, &report).await;
        assert!(!answer.has_mail() && !answer.reregister, "{answer:?}");
        assert_eq!(client.status(build).await.state, BuildState::Cancelled);
        let next = client.submit("next", 1).await;
        let mail = client.fetch(worker, drop.mail).await;
        assert_eq!(mail.assign.len(), 1, "the slot was freed: {mail:?}");
        client.report(worker, &done(&mail.assign)).await;
        assert_eq!(finished(&client, next).await, BuildState::Succeeded);
    })
    .await
    .expect("the second build finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_an_assignment_that_never_left_its_mailbox_runs_again() {
    tokio::time::timeout(DEADLINE, async {
        let dir = tempfile::tempdir().expect("tempdir");
        // A log that ends just after the coordinator assigned a job to
        // worker "w" (its mail then died with the process): exactly what
        // the coordinator records for a registration and a submission.
        let mut solver = drover_solver::Solver::new(config(dir.path()).core);
        let mut store =
            drover_store::Store::open_with(&dir.path().join("state.db"), Default::default()).expect("store");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
        let now = now.as_millis() as u64;
        let mut record = |solver: &mut drover_solver::Solver, at: u64, input: Input| {
            let body = serde_json::to_vec(&input).expect("json");
            solver.handle(drover_core::Millis(at), input).expect("input");
            store.append([(at, &body[..])]).expect("append");
            solver.take_effects().into_iter().any(|e| matches!(e, drover_solver::Effect::Assign { .. }))
        };
        record(&mut solver, now, Input::Register(register_request("w", 1, Vec::new())));
        let mut assigned = record(&mut solver, now, Input::Submit(submit_request("b", 1)));
        // The job waits for the workers holding its inputs first: its timer.
        while !assigned {
            let at = solver.poll_timeout().expect("a timer");
            assigned = record(&mut solver, at.0, Input::Tick);
        }
        drop(store);

        let coordinator = drover_coordinator::start(config(dir.path())).await.expect("restart");
        let client = Client::new(&coordinator);
        // The worker's session died with the mail: it must register again.
        let answer = client.poll(1, &notify_only(0)).await;
        assert!(answer.reregister, "{answer:?}");
        let report = client.report(1, &Report { deliver: true, ..Report::default() }).await;
        assert!(report.reregister, "{report:?}");
        // It never got the run, so it lists none: the job is assigned anew.
        let worker = client.register("w", 1, Vec::new()).await.worker;
        assert_eq!(worker, 1);
        let mail = client.fetch(worker, 0).await;
        assert_eq!(mail.assign.len(), 1, "{mail:?}");
        assert_eq!(mail.assign[0].attempt, 2, "the first attempt was lost with the mailbox");
        client.report(worker, &done(&mail.assign)).await;
        assert_eq!(finished(&client, 1).await, BuildState::Succeeded);
    })
    .await
    .expect("the build finished after the restart");
}

/// An answer that carried an assignment but never reached the worker (its
/// connection broke after the coordinator wrote it) is not lost: the
/// worker's next report says which mail it last received, gets the
/// assignment again, and, once it says it has that version, never again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mail_of_an_answer_that_never_arrived_comes_again() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let worker = client.register("w", 1, Vec::new()).await.worker;
        let build = client.submit("lost", 2).await;
        let take = |received: u64| Report { deliver: true, received: Some(received), ..Report::default() };
        let notice = client.poll(worker, &notify_only(0)).await;
        assert!(notice.mail > 0, "mail waits");
        let lost = client.report(worker, &take(0)).await;
        assert_eq!(lost.assign.len(), 1, "one slot, one job");
        // The worker never saw `lost`: it reports again, still at 0.
        let again = client.report(worker, &take(0)).await;
        assert_eq!(again.assign, lost.assign, "the lost assignment comes again");
        assert!(again.mail > lost.mail, "under a newer version");
        // Received: the next report takes nothing more.
        let nothing = client.report(worker, &take(again.mail)).await;
        assert!(!nothing.has_mail(), "sent again after it arrived: {nothing:?}");
        // The run ends; its answer brings the other job, once.
        let mut end = done(&again.assign);
        end.received = Some(nothing.mail);
        let next = client.report(worker, &end).await;
        assert_eq!(next.assign.len(), 1);
        assert_ne!(next.assign[0].run, again.assign[0].run);
        let mut end = done(&next.assign);
        end.received = Some(next.mail);
        let last = client.report(worker, &end).await;
        assert!(!last.has_mail(), "{last:?}");
        assert_eq!(finished(&client, build).await, BuildState::Succeeded);
    })
    .await
    .expect("no hang");
}

/// A turn that holds the coordinator up for longer than a worker's lease (a
/// huge submission) does not cost a worker that kept polling its lease: the
/// polls wait in line meanwhile, and once the turn is over the cluster's
/// deadlines move on by its length, as after a restart (recorded as such).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_turn_does_not_cost_a_polling_worker_its_lease() {
    tokio::time::timeout(DEADLINE, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(dir.path());
        // A lease shorter than the huge submission below takes to accept
        // (tens of thousands of jobs, in a test build).
        config.core.lease_timeout = drover_core::Millis(400);
        let coordinator = drover_coordinator::start(config).await.expect("start");
        let client = Client::new(&coordinator);
        let worker = client.register("w", 1, Vec::new()).await.worker;
        let small = client.submit("small", 1).await;
        let mail = client.fetch(worker, 0).await;
        assert_eq!(mail.assign.len(), 1);
        let started = Report { started: vec![mail.assign[0].run], ..Report::default() };
        assert!(!client.report(worker, &started).await.reregister);
        // The worker keeps polling (its heartbeat) throughout.
        let polling = {
            let client = Client::new(&coordinator);
            tokio::spawn(async move {
                loop {
                    let reply =
                        client.poll(worker, &PollRequest { wait_ms: 50, notify_only: true, seen: 0 }).await;
                    assert!(!reply.reregister, "the worker was declared lost");
                }
            })
        };
        let huge = client.submit("huge", 40_000).await;
        // A few more heartbeats after the long turn.
        for _ in 0..3 {
            let reply = client.poll(worker, &PollRequest { wait_ms: 50, notify_only: true, seen: 0 }).await;
            assert!(!reply.reregister, "the worker was declared lost");
        }
        assert!(!polling.is_finished(), "the polling worker was declared lost");
        polling.abort();
        let status = client.status(small).await;
        assert_eq!(status.jobs[0].state, drover_proto::JobState::Running, "{:?}", status.jobs[0]);
        assert_eq!(status.jobs[0].attempts, 1, "its run was never lost");
        // The long turn was followed by a pause of the cluster's clock.
        let store = drover_store::Store::open(&dir.path().join("state.db")).expect("store");
        let mut after_huge = Vec::new();
        let mut seen_huge = false;
        store
            .replay(0, |r| {
                let input: Input = serde_json::from_slice(&r.body).expect("input");
                if seen_huge {
                    after_huge.push(input);
                } else if let Input::Submit(req) = &input {
                    seen_huge = req.build.name == "huge";
                }
            })
            .expect("replay");
        assert!(seen_huge);
        // The next turn first takes the solver's clock to when the thread
        // meant to wake (a tick), then holds the cluster's still.
        assert!(
            matches!(after_huge.as_slice(), [Input::Tick, Input::Restarted, ..]),
            "{:?}",
            after_huge.iter().take(2).collect::<Vec<_>>()
        );
        let _ = huge;
    })
    .await
    .expect("done in time");
}

/// A live worker's name is refused to a worker at another URL (two
/// processes under one name would act as one worker, each answering for
/// the other's runs), with the reason; the same worker registering again at
/// its URL (after either side restarted) is welcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_workers_name_is_not_given_to_another() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let first = client.register("w", 1, Vec::new()).await.worker;
        let mut other = register_request("w", 1, Vec::new());
        other.url = "http://elsewhere.invalid:7701".into();
        let refused: Result<RegisterReply, _> =
            client.http.post_json(&format!("{}/v1/workers/register", client.url), &other, None).await;
        match refused {
            Err(drover_http::HttpError::Status { status: 409, message, .. }) => {
                assert!(message.contains("give each worker its own --name"), "{message}")
            }
            other => panic!("expected 409, got {other:?}"),
        }
        let again = client.register("w", 1, Vec::new()).await.worker;
        assert_eq!(again, first, "the same worker, again");
        // Once it has left, the name is free.
        client.http.post(&format!("{}/v1/workers/{first}/leave", client.url)).await.expect("leave");
        let taken: RegisterReply = client.post("/v1/workers/register", &other).await;
        assert_eq!(taken.worker, first, "the name keeps its ID");
    })
    .await
    .expect("done in time");
}

/// Stage notes (display only) are kept for a worker with a session, and
/// only short ones: a report from a worker that never registered, or a
/// stage of megabytes, leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_registered_workers_short_stage_notes_are_kept() {
    tokio::time::timeout(DEADLINE, async {
        let (_dir, _coordinator, client) = started().await;
        let worker = client.register("w", 1, Vec::new()).await.worker;
        let build = client.submit("staged", 1).await;
        let mail = client.fetch(worker, 0).await;
        let run = mail.assign[0].run;
        let note = |stage: String| drover_proto::RunStage { run, stage, waiting: false };
        let stranger = Report { stages: vec![note("stranger".into())], ..Report::default() };
        assert!(client.report(worker + 100, &stranger).await.reregister);
        let huge = Report { stages: vec![note("x".repeat(1 << 20))], ..Report::default() };
        client.report(worker, &huge).await;
        assert_eq!(client.status(build).await.jobs[0].stage, None, "neither note was kept");
        let fetch = Report { stages: vec![note("fetch".into())], ..Report::default() };
        client.report(worker, &fetch).await;
        assert_eq!(client.status(build).await.jobs[0].stage.as_deref(), Some("fetch"));
    })
    .await
    .expect("done in time");
}
