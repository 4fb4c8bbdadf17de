//! Tests of the solver's build rules: dependency order, failure and skip,
//! sharing across builds, cancellation, re-attaching workers and replay.

use std::collections::BTreeMap;

use drover_core::{Config, Millis};
use drover_proto::{
    BuildSpec, BuildState, EventKind, Hash32, HeldArtifact, JobDef, JobState, OnError, RegisterRequest,
    Report, RunResult, SubmitRequest, WorkerCapacity,
};

use super::{Effect, Input, KEEP_LOST_WORKERS, Reply, Solver, SolverError};

fn job(name: &str, needs: &[&str]) -> JobDef {
    let mut id = [0u8; 32];
    id[..name.len()].copy_from_slice(name.as_bytes());
    JobDef {
        commands: vec![format!("echo {name}")],
        needs: needs.iter().map(|s| s.to_string()).collect(),
        retries: 1,
        ..JobDef::new(name, Hash32(id))
    }
}

fn submit(jobs: Vec<JobDef>) -> Input {
    submit_with(jobs, OnError::Quit, None)
}

fn submit_with(jobs: Vec<JobDef>, on_error: OnError, max_parallel: Option<u32>) -> Input {
    Input::Submit(SubmitRequest {
        build: BuildSpec { name: "b".into(), sources: Vec::new(), jobs }.into(),
        tenant: "t".into(),
        no_cache: false,
        on_error,
        max_parallel,
        queue: None,
    })
}

fn register(name: &str, slots: u32, running: Vec<u64>) -> Input {
    Input::Register(RegisterRequest {
        name: name.into(),
        url: format!("http://{name}"),
        capacity: WorkerCapacity { slots, cpu_millis: 4000, memory: 1 << 30, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running,
    })
}

fn ok(run: u64, job: &str) -> RunResult {
    let mut id = [0u8; 32];
    id[..job.len()].copy_from_slice(job.as_bytes());
    RunResult {
        run,
        success: true,
        exit_code: Some(0),
        cached: false,
        detail: String::new(),
        output: Some(HeldArtifact { job: Hash32(id), tree: Hash32([7; 32]), size: 1 }),
        duration_ms: 1,
        stages: Default::default(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    }
}

fn failed(run: u64, code: i32) -> RunResult {
    RunResult {
        run,
        success: false,
        exit_code: Some(code),
        cached: false,
        detail: "boom".into(),
        output: None,
        duration_ms: 1,
        stages: Default::default(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    }
}

/// A run that ended before its commands: the output of `need` was to be had
/// from nowhere (lost with its workers).
fn lost_input(run: u64, need: &str) -> RunResult {
    let mut lost = failed(run, 1);
    lost.exit_code = None;
    lost.detail = format!("cannot get the output of {need}");
    lost.lost_inputs = vec![job(need, &[]).id];
    lost
}

/// The job names of assignments, in order.
fn names(runs: &[(u64, u64, String)]) -> Vec<&str> {
    runs.iter().map(|r| r.2.as_str()).collect()
}

/// A solver with a recorded input log and a clock that moves past every
/// locality wait.
struct Harness {
    solver: Solver,
    log: Vec<(Millis, Input)>,
    now: u64,
}

impl Harness {
    fn new() -> Harness {
        Harness { solver: Solver::new(Config::default()), log: Vec::new(), now: 1_000 }
    }

    fn input(&mut self, input: Input) -> Result<Reply, SolverError> {
        self.log.push((Millis(self.now), input.clone()));
        let reply = self.solver.handle(Millis(self.now), input);
        for build in self.solver.builds.values() {
            if let Err(broken) = build.check_room() {
                panic!("after {:?}: {broken}", self.log.last().expect("logged"));
            }
        }
        reply
    }

    /// Lets locality timers expire.
    fn later(&mut self) {
        self.now += 1_000;
        self.input(Input::Tick).expect("tick");
    }

    /// Assignments handed out so far: (worker, run, job name).
    fn assigned(&mut self) -> Vec<(u64, u64, String)> {
        self.assignments().into_iter().map(|(worker, a)| (worker, a.run, a.name)).collect()
    }

    /// Assignments handed out so far, whole, with their workers.
    fn assignments(&mut self) -> Vec<(u64, drover_proto::Assignment)> {
        self.solver
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Assign { worker, assignment } => Some((worker, *assignment)),
                _ => None,
            })
            .collect()
    }

    fn report(&mut self, worker: u64, report: Report) {
        self.input(Input::Report { worker, report }).expect("report");
    }

    /// Replaying the recorded inputs, each through its JSON as the input log
    /// holds it (so nothing is shared that the log does not share), on a
    /// fresh solver rebuilds an equal state; returns the replayed solver.
    fn assert_replays(&mut self) -> Solver {
        let mut replayed = Solver::new(Config::default());
        for (now, input) in &self.log {
            let json = serde_json::to_vec(input).expect("encode");
            let _ = replayed.handle(*now, serde_json::from_slice(&json).expect("decode"));
        }
        replayed.take_effects();
        self.solver.take_effects();
        assert_eq!(replayed, self.solver);
        replayed
    }

    /// Writes the solver's state down and reads it back (in CBOR, as the
    /// coordinator's snapshots do), checks that the copy is equal, and
    /// carries on with the copy (the effects not taken yet move over).
    fn restore_from_snapshot(&mut self) {
        let effects = std::mem::take(&mut self.solver.effects);
        let mut bytes = Vec::new();
        ciborium::into_writer(&self.solver, &mut bytes).expect("encode");
        let mut restored: Solver = ciborium::from_reader(&bytes[..]).expect("decode");
        assert_eq!(restored, self.solver);
        restored.effects = effects;
        self.solver = restored;
    }

    fn states(&self, build: u64) -> Vec<(String, JobState)> {
        let status = self.solver.build_status(build).expect("build");
        status.jobs.into_iter().map(|j| (j.name, j.state)).collect()
    }
}

fn worker_id(reply: Result<Reply, SolverError>) -> u64 {
    match reply {
        Ok(Reply::Registered(r)) => r.worker,
        other => panic!("expected a registration, got {other:?}"),
    }
}

fn build_id(reply: Result<Reply, SolverError>) -> u64 {
    match reply {
        Ok(Reply::Submitted(id)) => id,
        other => panic!("expected a build ID, got {other:?}"),
    }
}

#[test]
fn jobs_run_after_their_needs_and_the_build_succeeds() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"]), job("c", &["a", "b"])])));
    h.later();
    let first = h.assigned();
    assert_eq!(first.iter().map(|a| a.2.as_str()).collect::<Vec<_>>(), ["a"], "only a is ready");
    h.report(w, Report { finished: vec![ok(first[0].1, "a")], ..Report::default() });
    // b reads a's output, which w1 holds: w1 takes it at once.
    let second = h.assigned();
    assert_eq!(second.iter().map(|a| a.2.as_str()).collect::<Vec<_>>(), ["b"]);
    h.report(w, Report { finished: vec![ok(second[0].1, "b")], ..Report::default() });
    let third = h.assigned();
    assert_eq!(third.iter().map(|a| a.2.as_str()).collect::<Vec<_>>(), ["c"]);
    h.report(w, Report { finished: vec![ok(third[0].1, "c")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    let (events, over) = h.solver.events(b, 0).expect("events");
    assert!(over);
    assert!(matches!(events.first().map(|e| &e.kind), Some(EventKind::BuildQueued { jobs: 3 })));
    assert_eq!(
        events.last().map(|e| &e.kind),
        Some(&EventKind::BuildFinished {
            state: BuildState::Succeeded,
            counts: [(JobState::Succeeded, 3)].into(),
        }),
        "the last event says how the jobs ended"
    );
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "events are numbered in order");
}

#[test]
fn a_failure_skips_dependents_and_everything_not_started_but_running_jobs_finish() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        job("bad", &[]),
        job("slow", &[]),
        job("after-bad", &["bad"]),
        job("later", &[]),
    ])));
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.len(), 2, "two slots: bad and slow start");
    let bad = runs.iter().find(|a| a.2 == "bad").expect("bad ran").1;
    let slow = runs.iter().find(|a| a.2 == "slow").expect("slow ran").1;
    h.report(w, Report { finished: vec![failed(bad, 3)], ..Report::default() });
    assert!(h.assigned().is_empty(), "nothing new starts after a failure");
    assert_eq!(
        h.states(b),
        [
            ("bad".to_string(), JobState::Failed),
            ("slow".to_string(), JobState::Running),
            ("after-bad".to_string(), JobState::Skipped),
            ("later".to_string(), JobState::Skipped),
        ]
    );
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.jobs[0].exit_code, Some(3));
    assert_eq!(status.jobs[2].detail, "needs bad, which failed");
    assert_eq!(status.state, BuildState::Running, "slow is still running");
    h.report(w, Report { finished: vec![ok(slow, "slow")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
}

#[test]
fn builds_sharing_a_job_run_it_once_and_both_get_the_result() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b1 = build_id(h.input(submit(vec![job("shared", &[])])));
    let b2 = build_id(h.input(submit(vec![job("shared", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.len(), 1, "one execution for two builds");
    h.report(w, Report { finished: vec![ok(runs[0].1, "shared")], ..Report::default() });
    for b in [b1, b2] {
        assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    }
}

/// A build that joins a job already running for another build sees it
/// running too: on its worker, in its run (so its log is found), with a
/// start event; and it ends with the run.
#[test]
fn a_build_joining_a_running_job_sees_it_run() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b1 = build_id(h.input(submit(vec![job("shared", &[])])));
    h.later();
    let runs = h.assigned();
    h.report(w, Report { started: vec![runs[0].1], ..Report::default() });
    let b2 = build_id(h.input(submit(vec![job("shared", &[])])));
    assert!(h.assigned().is_empty(), "no second run");
    let joined = h.solver.build_status(b2).expect("build").jobs.remove(0);
    assert_eq!(
        (joined.state, joined.worker.as_deref(), joined.attempts),
        (JobState::Running, Some("w1"), 1),
        "{joined:?}"
    );
    let events = h.solver.events(b2, 0).expect("events").0;
    assert!(
        events.iter().any(|e| matches!(&e.kind, EventKind::JobStarted { job, worker, .. } if job == "shared" && worker == "w1")),
        "{events:?}"
    );
    assert_eq!(h.solver.run_location(b2, "shared").map(|r| r.1), Some(runs[0].1), "its log is found");
    h.report(w, Report { finished: vec![ok(runs[0].1, "shared")], ..Report::default() });
    for b in [b1, b2] {
        assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    }
    h.assert_replays();
}

/// The same job twice in one build: the second joins the first's run
/// before its assignment is applied, and each starts once.
#[test]
fn jobs_joining_a_run_being_assigned_start_once() {
    let mut h = Harness::new();
    worker_id(h.input(register("w1", 4, vec![])));
    let same = |name: &str| JobDef { commands: vec!["echo x".into()], ..JobDef::new(name, job("x", &[]).id) };
    let b = build_id(h.input(submit(vec![same("a"), same("b")])));
    h.later();
    assert_eq!(h.assigned().len(), 1, "one run for both");
    let events = h.solver.events(b, 0).expect("events").0;
    let starts: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::JobStarted { job, .. } => Some(job.as_str()),
            _ => None,
        })
        .collect();
    let mut sorted = starts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["a", "b"], "each started once: {starts:?}");
}

/// Two builds run `x` under other limits (two IDs) and share `t`, which
/// needs it: the run of `t` reads the first build's copy. When that copy
/// is lost, the first build builds it again; the second, whose own copy is
/// there, takes `t` out of the failed run and runs it again. Both succeed.
#[test]
fn a_job_that_read_another_builds_lost_copy_of_a_need_runs_again() {
    /// Runs assigned since the last call, as (run, job ID).
    fn assigned(h: &mut Harness) -> Vec<(u64, Hash32)> {
        h.solver
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Assign { assignment, .. } => Some((assignment.run, assignment.job)),
                _ => None,
            })
            .collect()
    }
    /// Every run succeeds, its output filed under its job's ID.
    fn succeed(h: &mut Harness, w: u64, runs: &[(u64, Hash32)]) {
        let finished = runs
            .iter()
            .map(|&(run, id)| {
                let mut done = ok(run, "x");
                done.output.as_mut().expect("output").job = id;
                done
            })
            .collect();
        h.report(w, Report { finished, ..Report::default() });
    }
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let strict = job("x-strict", &[]).id;
    let b1 = build_id(h.input(submit(vec![JobDef { id: strict, ..job("x", &[]) }, job("t", &["x"])])));
    let b2 = build_id(h.input(submit(vec![job("x", &[]), job("t", &["x"])])));
    h.later();
    let xs = assigned(&mut h);
    assert_eq!(xs.len(), 2, "x runs once per ID: {xs:?}");
    succeed(&mut h, w, &xs);
    h.later();
    let t = assigned(&mut h);
    assert_eq!(t.len(), 1, "one run of t for both builds: {t:?}");
    // The run could not get b1's copy of x.
    let mut lost = lost_input(t[0].0, "x");
    lost.lost_inputs = vec![strict];
    h.report(w, Report { finished: vec![lost], ..Report::default() });
    for _ in 0..10 {
        h.later();
        let runs = assigned(&mut h);
        succeed(&mut h, w, &runs);
    }
    for b in [b1, b2] {
        assert_eq!(
            h.solver.build_status(b).expect("build").state,
            BuildState::Succeeded,
            "{:?}",
            h.states(b)
        );
    }
    let events = h.solver.events(b2, 0).expect("events").0;
    assert!(
        events.iter().any(|e| matches!(&e.kind, EventKind::JobRequeued { job, reason: Some(r), .. }
            if job == "t" && r.contains("another build's copy"))),
        "{events:?}"
    );
    h.assert_replays();
}

/// Builds submitted with one spec (one `Arc`, as the coordinator hands
/// identical specs over, or by naming an earlier build) share its plan; an
/// equal spec of its own gets its own; a build like one that does not exist
/// is refused. Either way they run alike, and a replay from the JSON log, where
/// nothing is shared, rebuilds an equal state.
#[test]
fn builds_of_one_spec_share_its_plan() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let Input::Submit(first) = submit(vec![job("a", &[]), job("b", &["a"])]) else { unreachable!() };
    let equal = SubmitRequest { build: std::sync::Arc::new((*first.build).clone()), ..first.clone() };
    let b1 = build_id(h.input(Input::Submit(first.clone())));
    let b2 = build_id(h.input(Input::Submit(first)));
    let b3 = build_id(h.input(Input::Submit(equal)));
    let like = |like: u64, max_parallel: Option<u32>| Input::SubmitLike {
        like,
        tenant: "u".into(),
        no_cache: false,
        on_error: OnError::Continue,
        max_parallel,
        queue: None,
    };
    let b4 = build_id(h.input(like(b1, Some(1))));
    assert_eq!(h.input(like(99, None)), Err(SolverError::UnknownBuild(99)));
    assert_eq!(h.solver.build_with_spec(&h.solver.builds[&b1].plan().spec().clone()), Some(b4), "the latest");
    let plan = |b: u64| h.solver.builds[&b].plan().clone();
    assert!(std::sync::Arc::ptr_eq(&plan(b1), &plan(b2)), "the same spec: one plan");
    assert!(std::sync::Arc::ptr_eq(&plan(b1), &plan(b4)), "like b1: b1's plan");
    assert_eq!(h.solver.build_status(b4).expect("b4").jobs.len(), 2);
    assert!(!std::sync::Arc::ptr_eq(&plan(b1), &plan(b3)), "an equal spec of its own: its own plan");
    assert_eq!(plan(b1), plan(b3));
    h.later();
    for job in ["a", "b"] {
        let runs = h.assigned();
        assert_eq!(names(&runs), [job], "one run for three builds");
        h.report(w, Report { finished: vec![ok(runs[0].1, job)], ..Report::default() });
    }
    for b in [b1, b2, b3, b4] {
        assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    }
    let replayed = h.assert_replays();
    let replayed_plan = |b: u64| replayed.builds[&b].plan().clone();
    assert!(
        std::sync::Arc::ptr_eq(&replayed_plan(b1), &replayed_plan(b4)),
        "replayed, b4 still takes b1's plan"
    );
    // A snapshot read back shares the plans as the builds did.
    h.restore_from_snapshot();
    let plan = |b: u64| h.solver.builds[&b].plan().clone();
    assert!(std::sync::Arc::ptr_eq(&plan(b1), &plan(b2)) && std::sync::Arc::ptr_eq(&plan(b1), &plan(b4)));
    assert!(!std::sync::Arc::ptr_eq(&plan(b1), &plan(b3)));
    assert_eq!(h.solver.build_with_spec(&h.solver.builds[&b1].plan().spec().clone()), Some(b4));
}

/// A spec's mistakes are named in the order a reader meets them: in a job,
/// an unknown need before a need listed twice, and a second job of a name
/// before its needs' repetition.
#[test]
fn a_specs_first_mistake_is_the_one_named() {
    let mut h = Harness::new();
    for (jobs, why) in [
        (vec![job("a", &[]), job("b", &["a", "a"])], "job \"b\" lists a need twice"),
        (
            vec![job("a", &[]), job("b", &["a", "a", "zz"])],
            "job \"b\" needs \"zz\", which is not an earlier job of the build",
        ),
        (vec![job("a", &[]), job("a", &["a", "a"])], "two jobs are named \"a\""),
    ] {
        let refused = h.input(submit(jobs));
        assert_eq!(refused, Err(SolverError::InvalidBuild(why.into())));
    }
}

/// Lets `seconds` pass, worker `w` polling every second (it keeps its lease).
fn pass(h: &mut Harness, w: u64, seconds: u64) {
    for _ in 0..seconds {
        h.now += 1_000;
        h.input(Input::Poll { worker: w }).expect("poll");
    }
}

/// Past what it keeps, the builds that finished longest ago are forgotten
/// (once a quarter more, at least 16, came in; at once on the setting),
/// never a build still running nor one that finished less than a minute
/// ago; the metrics still count them, and a replay of the log forgets the
/// same builds.
#[test]
fn the_builds_finished_longest_ago_are_forgotten_past_what_it_keeps() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    h.input(Input::KeepFinished { builds: Some(2) }).expect("setting");
    let mut held_at_most = 0;
    for n in 0..30 {
        let name = format!("j{n}");
        build_id(h.input(submit(vec![job(&name, &[])])));
        held_at_most = held_at_most.max(h.solver.builds.len());
        h.later();
        let runs = h.assigned();
        assert_eq!(names(&runs), [name.as_str()]);
        h.report(w, Report { finished: vec![ok(runs[0].1, &name)], ..Report::default() });
        pass(&mut h, w, 9); // ten seconds a build
    }
    // Two kept, a pass once 16 more came in, and those of the last minute.
    assert!(held_at_most <= 2 + 16 + 7, "{held_at_most} held");
    assert!(held_at_most >= 2 + 16, "{held_at_most} held: forgotten too early");
    let running = build_id(h.input(submit(vec![job("slow", &[])])));
    h.later();
    let slow = h.assigned();
    assert_eq!(names(&slow), ["slow"]);
    pass(&mut h, w, 60);
    h.input(Input::KeepFinished { builds: Some(2) }).expect("setting again");
    let kept: Vec<u64> = h.solver.builds.keys().copied().collect();
    assert_eq!(kept, [29, 30, running], "the two that finished last, and the running one");
    h.input(Input::KeepFinished { builds: Some(0) }).expect("a new setting");
    let kept: Vec<u64> = h.solver.builds.keys().copied().collect();
    assert_eq!(kept, [running], "never a build still running");
    assert!(h.solver.forgotten(30) && !h.solver.forgotten(running) && !h.solver.forgotten(99));
    assert_eq!(h.solver.build_status(2), None);
    let m = h.solver.metrics();
    assert_eq!(m.builds.iter().find(|(s, _)| *s == BuildState::Succeeded).map(|c| c.1), Some(30));
    assert_eq!(m.build_jobs_ended.iter().find(|(s, _)| *s == JobState::Succeeded).map(|c| c.1), Some(30));
    h.report(w, Report { finished: vec![ok(slow[0].1, "slow")], ..Report::default() });
    h.input(Input::KeepFinished { builds: Some(0) }).expect("the setting, just after it finished");
    assert_eq!(h.solver.build_status(running).expect("kept a minute").state, BuildState::Succeeded);
    pass(&mut h, w, 60);
    h.input(Input::KeepFinished { builds: Some(0) }).expect("a minute later");
    assert!(h.solver.forgotten(running));
    h.assert_replays();
}

/// A page of whole statuses holds builds after the one named until their
/// jobs reach the budget, and at least one build however large.
#[test]
fn build_statuses_come_a_page_at_a_time() {
    let mut h = Harness::new();
    let ids: Vec<u64> = (0..5)
        .map(|n| {
            let jobs = (0..=n).map(|i| job(&format!("p{n}-{i}"), &[])).collect();
            build_id(h.input(submit(jobs)))
        })
        .collect();
    let page = |after: u64, max_jobs: usize| -> Vec<u64> {
        h.solver.builds_page(after, max_jobs).iter().map(|b| b.id).collect()
    };
    // Builds of 1, 2, 3, 4 and 5 jobs.
    assert_eq!(page(0, 3), &ids[..2], "1 + 2 jobs reach 3");
    assert_eq!(page(ids[1], 3), &ids[2..3], "3 jobs at once");
    assert_eq!(page(ids[2], 1), &ids[3..4], "one build even past the budget");
    assert_eq!(page(0, usize::MAX), ids);
    assert!(page(ids[4], 10).is_empty());
}

/// Where a job's latest run went and the timings of its stages live in
/// the record of each build that holds the job, and go with it: a build
/// kept still says both, however many were forgotten before it.
#[test]
fn a_builds_record_says_where_its_jobs_ran_and_how_long_their_stages_took() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    h.input(Input::KeepFinished { builds: Some(2) }).expect("setting");
    let mut last = 0;
    for n in 0..60 {
        let name = format!("j{n}");
        last = build_id(h.input(submit(vec![job(&name, &[])])));
        h.later();
        let runs = h.assigned();
        let mut result = ok(runs[0].1, &name);
        result.stages = BTreeMap::from([("build".to_owned(), 40 + n)]);
        h.report(w, Report { finished: vec![result], ..Report::default() });
        pass(&mut h, w, 9);
    }
    assert!(h.solver.builds.len() < 30, "{} builds", h.solver.builds.len());
    // The latest build still says where its job ran and how long it took.
    let status = h.solver.build_status(last).expect("kept");
    assert_eq!(status.jobs[0].stages, BTreeMap::from([("build".to_owned(), 99)]));
    let (url, _run) = h.solver.run_location(last, "j59").expect("its run's worker");
    assert_eq!(url, "http://w1");
    h.assert_replays();
}

/// The output trees of outputs held nowhere any more (evicted by their
/// workers, not in the shared cache) are swept out once the trees known
/// have doubled; held ones and those in the shared cache stay.
#[test]
fn output_trees_of_outputs_held_nowhere_are_swept() {
    let held = |n: u32| HeldArtifact {
        job: Hash32(blake3::hash(&n.to_le_bytes()).into()),
        tree: Hash32([n as u8; 32]),
        size: 1,
    };
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let first: Vec<HeldArtifact> = (0..5_000).map(held).collect();
    h.report(w, Report { added: first.clone(), ..Report::default() });
    h.input(Input::Cached { job: first[0].job, tree: first[0].tree }).expect("in the shared cache");
    h.report(w, Report { evicted: first.iter().map(|a| a.job).collect(), ..Report::default() });
    assert_eq!(h.solver.output_tree(first[1].job), Some(first[1].tree), "not swept before the trees double");
    let second: Vec<HeldArtifact> = (5_000..10_000).map(held).collect();
    h.report(w, Report { added: second.clone(), ..Report::default() });
    assert_eq!(h.solver.outputs.len(), 5_001, "the second lot and the one in the shared cache");
    assert_eq!(h.solver.output_tree(first[0].job), Some(first[0].tree));
    assert_eq!(h.solver.output_tree(first[1].job), None);
    assert_eq!(h.solver.output_tree(second[0].job), Some(second[0].tree));
    h.assert_replays();
}

#[test]
fn cancelling_a_build_stops_its_running_job_unless_another_build_needs_it() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b1 = build_id(h.input(submit(vec![job("shared", &[]), job("own", &[])])));
    let b2 = build_id(h.input(submit(vec![job("shared", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.len(), 1);
    let run = runs[0].1;
    h.report(w, Report { started: vec![run], ..Report::default() });
    h.input(Input::Cancel { build: b1 }).expect("cancel");
    let effects = h.solver.take_effects();
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Stop { .. } | Effect::Drop { .. })),
        "b2 still needs the shared job: {effects:?}"
    );
    assert_eq!(h.solver.build_status(b1).expect("build").state, BuildState::Cancelled);
    h.input(Input::Cancel { build: b2 }).expect("cancel");
    let effects = h.solver.take_effects();
    assert!(effects.contains(&Effect::Stop { worker: w, run }), "last waiter gone: {effects:?}");
    assert_eq!(h.solver.build_status(b2).expect("build").state, BuildState::Cancelled);
}

#[test]
fn a_start_that_comes_with_the_end_of_a_dropped_run_frees_its_slot() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let run = h.assigned()[0].1;
    // The worker holds the start back; the build is cancelled meanwhile: as
    // far as the coordinator knows the run has not started, so it drops it.
    h.input(Input::Cancel { build: b }).expect("cancel");
    let effects = h.solver.take_effects();
    assert!(effects.contains(&Effect::Drop { worker: w, run }), "{effects:?}");
    let mut ended = failed(run, 1);
    ended.detail = "cancelled".into();
    h.report(w, Report { started: vec![run], finished: vec![ended], ..Report::default() });
    let effects = h.solver.take_effects();
    assert!(!effects.iter().any(|e| matches!(e, Effect::Stop { .. })), "the run was known: {effects:?}");
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Cancelled);
    // The slot is free again.
    h.input(submit(vec![job("c", &[])])).expect("submit");
    h.later();
    assert_eq!(h.assigned().len(), 1);
}

#[test]
fn a_registration_opens_a_session_before_the_work_it_brings() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    h.input(submit(vec![job("a", &[])])).expect("submit");
    h.later();
    assert_eq!(h.assigned().len(), 1);
    // Registered again without the run (its assignment never arrived):
    // mail for the old session is void, the new assignment is not.
    h.input(register("w1", 1, vec![])).expect("register");
    h.later();
    let effects = h.solver.take_effects();
    let registered = effects.iter().position(|e| *e == Effect::Registered { worker: w });
    let assigned = effects.iter().position(|e| matches!(e, Effect::Assign { .. }));
    assert!(registered.is_some() && registered < assigned, "{effects:?}");
}

#[test]
fn a_re_registering_worker_loses_runs_it_no_longer_has_and_stops_unknown_ones() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let run = h.assigned()[0].1;
    // The worker restarted: it runs nothing we gave it, but something else.
    let reply = h.input(register("w1", 1, vec![999])).expect("register");
    let Reply::Registered(r) = reply else { panic!("{reply:?}") };
    assert_eq!(r.worker, w, "same name, same ID");
    assert_eq!(r.stop, vec![999]);
    h.later();
    let again = h.assigned();
    assert_eq!(again.len(), 1, "the lost run is requeued and reassigned");
    assert_ne!(again[0].1, run, "as a new run");
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.jobs[0].attempts, 2);
}

#[test]
fn a_worker_cannot_start_or_end_another_workers_run() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.len(), 1);
    let (owner, run, _) = runs[0].clone();
    let other = if owner == w1 { w2 } else { w1 };
    // The other worker claims the run started, then failed, then succeeded:
    // none of it counts.
    h.report(other, Report { started: vec![run], finished: vec![failed(run, 137)], ..Report::default() });
    h.report(other, Report { finished: vec![ok(run, "a")], ..Report::default() });
    assert_eq!(h.states(b), [("a".to_owned(), JobState::Running)], "still running on its own worker");
    assert!(h.solver.take_effects().iter().all(|e| !matches!(e, Effect::Stop { .. })), "nothing is stopped");
    // Its own worker's word ends it.
    h.report(owner, Report { finished: vec![ok(run, "a")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    h.assert_replays();
}

#[test]
fn invalid_builds_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    for (jobs, why) in [
        (vec![job("a", &["b"]), job("b", &[])], "not an earlier job"),
        (vec![job("a", &[]), job("a", &[])], "two jobs are named"),
        (vec![job("bad name", &[])], "must be letters"),
        (vec![], "no jobs"),
    ] {
        match h.input(submit(jobs)) {
            Err(SolverError::InvalidBuild(msg)) => assert!(msg.contains(why), "{msg}"),
            other => panic!("expected refusal ({why}), got {other:?}"),
        }
    }
    assert!(h.solver.build_ids().is_empty());
    assert_eq!(build_id(h.input(submit(vec![job("a", &[])]))), 1, "no build number was used up");
}

#[test]
fn replaying_the_inputs_rebuilds_an_equal_state() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    worker_id(h.input(register("w2", 1, vec![])));
    build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"]), job("c", &[])])));
    h.later();
    let runs = h.assigned();
    for (worker, run, name) in runs {
        if worker == w {
            h.report(w, Report { started: vec![run], finished: vec![ok(run, &name)], ..Report::default() });
        }
    }
    h.later();
    h.assert_replays();
}

#[test]
fn a_known_result_held_by_a_live_worker_is_cached_without_running() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"])])));
    h.later();
    let a = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(a, "a")], ..Report::default() });
    let b = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(b, "b")], ..Report::default() });
    // The same jobs again: nothing is assigned, both are cached.
    let again = build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"])])));
    assert!(h.assigned().is_empty(), "nothing runs again");
    assert_eq!(h.states(again), [("a".to_string(), JobState::Cached), ("b".to_string(), JobState::Cached)]);
    assert_eq!(h.solver.build_status(again).expect("build").state, BuildState::Succeeded);
    // Without the holder, the result is gone: it runs again.
    h.now += 60_000;
    h.input(Input::Tick).expect("tick");
    assert!(!h.solver.worker_alive(w), "w1 missed its lease");
    h.input(register("w2", 1, vec![])).expect("register");
    let third = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    assert_eq!(h.assigned().len(), 1, "a runs again on w2");
    assert_eq!(h.states(third), [("a".to_string(), JobState::Running)]);
}

#[test]
fn a_no_cache_build_runs_jobs_whose_results_are_known() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let a = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(a, "a")], ..Report::default() });
    let Input::Submit(mut req) = submit(vec![job("a", &[])]) else { unreachable!() };
    req.no_cache = true;
    build_id(h.input(Input::Submit(req)));
    h.later();
    let effects = h.solver.take_effects();
    let assigned: Vec<bool> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Assign { assignment, .. } => Some(assignment.no_cache),
            _ => None,
        })
        .collect();
    assert_eq!(assigned, [true], "assigned again, telling the worker to ignore its cache");
}

/// Independent branches: `bad` fails, `slow` is running, `sibling` and
/// `later` are independent of `bad`, `after-bad` needs it.
fn branches(h: &mut Harness, on_error: OnError) -> (u64, u64, u64) {
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit_with(
        vec![job("bad", &[]), job("slow", &[]), job("after-bad", &["bad"]), job("later", &[])],
        on_error,
        None,
    )));
    h.later();
    let runs = h.assigned();
    let bad = runs.iter().find(|a| a.2 == "bad").expect("bad ran").1;
    let slow = runs.iter().find(|a| a.2 == "slow").expect("slow ran").1;
    h.report(w, Report { started: vec![bad, slow], finished: vec![failed(bad, 3)], ..Report::default() });
    (w, b, slow)
}

#[test]
fn on_error_continue_runs_every_job_that_does_not_depend_on_the_failure() {
    let mut h = Harness::new();
    let (w, b, slow) = branches(&mut h, OnError::Continue);
    h.later();
    let runs = h.assigned();
    assert_eq!(
        runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        ["later"],
        "the independent job still runs"
    );
    h.report(w, Report { finished: vec![ok(slow, "slow"), ok(runs[0].1, "later")], ..Report::default() });
    assert_eq!(
        h.states(b),
        [
            ("bad".to_string(), JobState::Failed),
            ("slow".to_string(), JobState::Succeeded),
            ("after-bad".to_string(), JobState::Skipped),
            ("later".to_string(), JobState::Succeeded),
        ]
    );
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
}

#[test]
fn on_error_terminate_stops_the_running_jobs_at_once() {
    let mut h = Harness::new();
    let (w, b, slow) = branches(&mut h, OnError::Terminate);
    let effects = h.solver.take_effects();
    assert!(effects.contains(&Effect::Stop { worker: w, run: slow }), "slow is stopped: {effects:?}");
    assert_eq!(
        h.states(b),
        [
            ("bad".to_string(), JobState::Failed),
            ("slow".to_string(), JobState::Cancelled),
            ("after-bad".to_string(), JobState::Skipped),
            ("later".to_string(), JobState::Skipped),
        ]
    );
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
}

#[test]
fn on_error_terminate_keeps_a_job_another_build_needs() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b1 =
        build_id(h.input(submit_with(vec![job("bad", &[]), job("shared", &[])], OnError::Terminate, None)));
    let b2 = build_id(h.input(submit(vec![job("shared", &[])])));
    h.later();
    let runs = h.assigned();
    let bad = runs.iter().find(|a| a.2 == "bad").expect("bad ran").1;
    let shared = runs.iter().find(|a| a.2 == "shared").expect("shared ran").1;
    h.report(w, Report { started: vec![bad, shared], finished: vec![failed(bad, 1)], ..Report::default() });
    let effects = h.solver.take_effects();
    assert!(!effects.iter().any(|e| matches!(e, Effect::Stop { .. })), "b2 still needs shared: {effects:?}");
    h.report(w, Report { finished: vec![ok(shared, "shared")], ..Report::default() });
    assert_eq!(h.solver.build_status(b1).expect("build").state, BuildState::Failed);
    assert_eq!(h.solver.build_status(b2).expect("build").state, BuildState::Succeeded);
}

#[test]
fn max_parallel_caps_a_builds_jobs_without_idling_the_cluster() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let capped = build_id(h.input(submit_with(
        vec![job("a1", &[]), job("a2", &[]), job("a3", &[]), job("a4", &[])],
        OnError::Quit,
        Some(2),
    )));
    let other = build_id(h.input(submit(vec![job("o1", &[]), job("o2", &[])])));
    h.later();
    let runs = h.assigned();
    let names: Vec<&str> = runs.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with('a')).count(),
        2,
        "at most 2 of the capped build: {names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| n.starts_with('o')).count(),
        2,
        "the other build fills the rest: {names:?}"
    );
    let mut done: Vec<RunResult> = runs.iter().map(|r| ok(r.1, &r.2)).collect();
    while !done.is_empty() {
        h.report(w, Report { finished: std::mem::take(&mut done), ..Report::default() });
        h.later();
        let runs = h.assigned();
        assert!(runs.len() <= 2, "still capped: {runs:?}");
        done = runs.iter().map(|r| ok(r.1, &r.2)).collect();
    }
    assert_eq!(h.solver.build_status(capped).expect("build").state, BuildState::Succeeded);
    assert_eq!(h.solver.build_status(other).expect("build").state, BuildState::Succeeded);
}

#[test]
fn retry_reruns_the_failed_job_and_what_it_skipped() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![job("good", &[]), job("flaky", &[]), job("after", &["flaky"])])));
    h.later();
    let runs = h.assigned();
    let good = runs.iter().find(|a| a.2 == "good").expect("good ran").1;
    let flaky = runs.iter().find(|a| a.2 == "flaky").expect("flaky ran").1;
    h.report(w, Report { finished: vec![ok(good, "good"), failed(flaky, 1)], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
    h.input(Input::Retry { build: b }).expect("retry");
    h.later();
    let runs = h.assigned();
    assert_eq!(
        runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        ["flaky"],
        "only the failure runs again"
    );
    let runs_flaky = runs[0].1;
    h.report(w, Report { finished: vec![ok(runs_flaky, "flaky")], ..Report::default() });
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["after"]);
    h.report(w, Report { finished: vec![ok(runs[0].1, "after")], ..Report::default() });
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Succeeded);
    assert_eq!(status.jobs[1].attempts, 2, "the retried run counts on from the failed one");
    // Each run's log keeps its own number: the failure retried for, too.
    assert_eq!(h.solver.attempt_location(b, "flaky", 1), Ok(Some(("http://w1".to_owned(), flaky))));
    assert_eq!(h.solver.attempt_location(b, "flaky", 2), Ok(Some(("http://w1".to_owned(), runs_flaky))));
    assert_eq!(h.solver.attempt_location(b, "flaky", 3), Err(vec![1, 2]));
    let retried = h.input(Input::Retry { build: b });
    assert!(matches!(retried, Err(SolverError::CannotRetry(_))), "{retried:?}");
}

/// A retried job whose input's only holder is gone gets that input built
/// again first (it would fail to fetch it otherwise, retry after retry).
#[test]
fn retry_rebuilds_a_lost_input_of_a_retried_job() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"])])));
    h.later();
    let a = h.assigned()[0].1;
    h.report(w1, Report { finished: vec![ok(a, "a")], ..Report::default() });
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["b"]);
    h.report(w1, Report { finished: vec![failed(runs[0].1, 1)], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
    // w1, the only holder of a's output, is lost; w2 comes.
    h.now += 60_000;
    h.input(Input::Tick).expect("tick");
    assert!(!h.solver.worker_alive(w1));
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    h.input(Input::Retry { build: b }).expect("retry");
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["a"], "a is built again first");
    assert_eq!(h.states(b), [("a".to_string(), JobState::Running), ("b".to_string(), JobState::Queued)]);
    h.report(w2, Report { finished: vec![ok(runs[0].1, "a")], ..Report::default() });
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["b"]);
    h.report(w2, Report { finished: vec![ok(runs[0].1, "b")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
}

/// An input whose only holder is lost before its dependent fetched it is
/// built again: the dependent's run reports the input lost, the input runs
/// again on a live worker, and the dependent runs after it. Nothing fails,
/// and the log replays to the same state.
#[test]
fn an_input_lost_with_its_worker_is_built_again_before_its_dependent() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"])])));
    h.later();
    let a = h.assigned()[0].1;
    h.report(w1, Report { finished: vec![ok(a, "a")], ..Report::default() });
    h.later();
    assert_eq!(names(&h.assigned()), ["b"]);
    // w1, the only holder of a's output, is lost; b goes to w2, which can
    // get a's output from nowhere.
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    for _ in 0..12 {
        h.now += 5_000;
        h.input(Input::Poll { worker: w2 }).expect("w2 renews its lease");
    }
    assert!(!h.solver.worker_alive(w1), "w1 lost");
    assert!(h.solver.worker_alive(w2), "w2 alive");
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["b"]);
    h.report(w2, Report { finished: vec![lost_input(runs[0].1, "a")], ..Report::default() });
    assert_eq!(h.states(b), [("a".to_string(), JobState::Running), ("b".to_string(), JobState::Queued)]);
    let runs = h.assigned();
    assert_eq!(names(&runs), ["a"], "a is built again first, on the slot b left");
    h.report(w2, Report { finished: vec![ok(runs[0].1, "a")], ..Report::default() });
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["b"], "then b");
    h.report(w2, Report { finished: vec![ok(runs[0].1, "b")], ..Report::default() });
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Succeeded);
    let events = h.solver.events(b, 0).expect("events").0;
    let rewound: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::JobRequeued { job, reason: Some(r), .. } if !r.starts_with("worker ") => {
                Some(job.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(rewound, ["b", "a"], "both go back, each with its reason (besides a lost run's)");
    let lost = events.iter().find_map(|e| match &e.kind {
        EventKind::JobRequeued { job, reason: Some(r), .. } if r.starts_with("worker ") => Some((job, r)),
        _ => None,
    });
    let (job, reason) = lost.expect("the run lost with w1 is requeued with a reason");
    assert!(job == "b" && reason == "worker w1 missed its lease (nothing heard for 10s)", "{job}: {reason}");
    assert_no_failure(&h, b);
    h.assert_replays();
}

/// A lost input whose rebuild failed is a failure for the next job that
/// loses it too: with `on_error: continue` the build ends instead of waiting
/// for a need that will never be done.
#[test]
fn a_lost_input_whose_rebuild_failed_fails_its_other_dependents() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit_with(
        vec![job("a", &[]), job("k", &["a"]), job("i", &["a"])],
        OnError::Continue,
        None,
    )));
    h.later();
    let a = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(a, "a")], ..Report::default() });
    let runs = h.assigned();
    let run = |name: &str| runs.iter().find(|r| r.2 == name).map(|r| r.1).expect("assigned");
    h.report(w, Report { finished: vec![lost_input(run("k"), "a")], ..Report::default() });
    let again = h.assigned();
    assert_eq!(names(&again), ["a"]);
    h.report(w, Report { finished: vec![failed(again[0].1, 2)], ..Report::default() });
    h.report(w, Report { finished: vec![lost_input(run("i"), "a")], ..Report::default() });
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Failed, "{status:?}");
    let states: Vec<JobState> = status.jobs.iter().map(|j| j.state).collect();
    assert_eq!(states, [JobState::Failed, JobState::Skipped, JobState::Failed]);
}

/// Counts the assignments of each job over `rounds` rounds of time passing,
/// every run succeeding.
fn run_counting(h: &mut Harness, w: u64, rounds: usize, counts: &mut BTreeMap<String, u32>) {
    for _ in 0..rounds {
        h.later();
        for (_, run, name) in h.assigned() {
            *counts.entry(name.clone()).or_default() += 1;
            h.report(w, Report { finished: vec![ok(run, &name)], ..Report::default() });
        }
    }
}

/// No job of build `b` failed on the way.
fn assert_no_failure(h: &Harness, b: u64) {
    let events = h.solver.events(b, 0).expect("events").0;
    assert!(
        !events.iter().any(|e| matches!(e.kind, EventKind::JobFinished { state: JobState::Failed, .. })),
        "no failure on the way"
    );
}

/// A gang handed to the core and waiting for room, whose need is lost
/// (another job's run says so), goes back whole: the need is built again,
/// then the gang starts together as a new instance, and nothing fails.
#[test]
fn a_gang_waiting_on_a_lost_need_goes_back_whole_and_runs_after_it() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        job("n", &[]),
        job("i", &["n"]),
        in_gang(job("g1", &["n"]), "pair", 2, false),
        in_gang(job("g2", &["n"]), "pair", 2, false),
    ])));
    h.later();
    let n = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(n, "n")], ..Report::default() });
    let runs = h.assigned();
    assert_eq!(names(&runs), ["i"], "the gang waits for two slots");
    h.report(w, Report { finished: vec![lost_input(runs[0].1, "n")], ..Report::default() });
    let runs = h.assigned();
    assert_eq!(names(&runs), ["n"], "n is built again before anything that needs it");
    let mut counts = BTreeMap::from([("n".to_owned(), 1)]);
    h.report(w, Report { finished: vec![ok(runs[0].1, "n")], ..Report::default() });
    run_counting(&mut h, w, 8, &mut counts);
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    let want = [("g1", 1), ("g2", 1), ("i", 1), ("n", 1)].map(|(k, v)| (k.to_owned(), v));
    assert_eq!(counts, BTreeMap::from(want));
    h.assert_replays();
}

/// A running gang member whose input is lost sends its whole gang back:
/// the other member's run is stopped, the input is built again, and the
/// gang runs together again after it. No failure is recorded, and the
/// gang's restarts on failure are not used up (it has none here).
#[test]
fn a_gang_member_that_lost_an_input_sends_its_gang_back_whole() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        job("n", &[]),
        in_gang(job("g1", &["n"]), "pair", 2, false),
        in_gang(job("g2", &[]), "pair", 2, false),
    ])));
    h.later();
    let n = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(n, "n")], ..Report::default() });
    h.later();
    let pair = h.assigned();
    let mut started = names(&pair);
    started.sort_unstable();
    assert_eq!(started, ["g1", "g2"]);
    let run = |name: &str| pair.iter().find(|a| a.2 == name).map(|a| a.1).expect("assigned");
    h.report(w, Report { finished: vec![lost_input(run("g1"), "n")], ..Report::default() });
    let effects = h.solver.take_effects();
    let stopped = effects
        .iter()
        .any(|e| matches!(e, Effect::Stop { run: r, .. } | Effect::Drop { run: r, .. } if *r == run("g2")));
    assert!(stopped, "g2's run is called off: {effects:?}");
    let again: Vec<(u64, String)> = effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::Assign { assignment, .. } => Some((assignment.run, assignment.name)),
            _ => None,
        })
        .collect();
    assert_eq!(again.iter().map(|a| a.1.as_str()).collect::<Vec<_>>(), ["n"], "n is built again at once");
    // g2's run ends as called off; n succeeds, then the pair runs again.
    h.report(w, Report { finished: vec![failed(run("g2"), 143)], ..Report::default() });
    h.report(w, Report { finished: vec![ok(again[0].0, "n")], ..Report::default() });
    let mut counts = BTreeMap::from([("n".to_owned(), 0)]);
    run_counting(&mut h, w, 8, &mut counts);
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    let want = [("g1", 1), ("g2", 1), ("n", 0)].map(|(k, v)| (k.to_owned(), v));
    assert_eq!(counts, BTreeMap::from(want), "then the pair once more, together");
    assert_no_failure(&h, b);
    h.assert_replays();
}

/// The lost output of a gang member cannot be built again alone (gangs run
/// whole): the job that needed it keeps its failure, and nothing hangs.
#[test]
fn a_lost_output_of_a_gang_member_is_a_failure() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("g1", &[]), "pair", 2, false),
        in_gang(job("g2", &[]), "pair", 2, false),
        job("x", &["g1"]),
    ])));
    h.later();
    for (_, run, name) in h.assigned() {
        h.report(w, Report { finished: vec![ok(run, &name)], ..Report::default() });
    }
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["x"]);
    h.report(w, Report { finished: vec![lost_input(runs[0].1, "g1")], ..Report::default() });
    run_all(&mut h, w, 5);
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
}

/// A job held back by `max_parallel` whose need goes back leaves the held
/// jobs, and is held once more when the need is done: it runs (here: is
/// found cached) once, whatever another build did meanwhile.
#[test]
fn a_held_job_whose_need_is_lost_is_held_once_again() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b1 = build_id(h.input(submit_with(
        vec![
            job("n", &[]),
            job("i", &["n"]),
            job("h", &["n"]),
            job("z", &["h"]),
            job("z2", &["z"]),
            job("y", &["i"]),
        ],
        OnError::Quit,
        Some(1),
    )));
    h.later();
    let n = h.assigned()[0].1;
    h.report(w, Report { finished: vec![ok(n, "n")], ..Report::default() });
    let runs = h.assigned();
    assert_eq!(names(&runs), ["h"], "the longer path first");
    h.report(w, Report { finished: vec![lost_input(runs[0].1, "n")], ..Report::default() });
    let again = h.assigned();
    assert_eq!(names(&again), ["n"]);
    h.report(w, Report { finished: vec![ok(again[0].1, "n")], ..Report::default() });
    let hs = h.assigned();
    assert_eq!(names(&hs), ["h"], "i is held again");
    // Another build runs i meanwhile.
    build_id(h.input(submit(vec![job("n", &[]), job("i", &["n"])])));
    run_all(&mut h, w, 1);
    h.report(w, Report { finished: vec![ok(hs[0].1, "h")], ..Report::default() });
    run_all(&mut h, w, 5);
    let status = h.solver.build_status(b1).expect("build");
    assert_eq!(status.state, BuildState::Succeeded, "{status:?}");
    let finished = h
        .solver
        .events(b1, 0)
        .expect("events")
        .0
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::JobFinished { job, .. } if job == "i"))
        .count();
    assert_eq!(finished, 1, "i ends once");
}

/// A job that keeps losing its inputs fails after a few rounds instead of
/// rebuilding them forever; a lost output it does not need is a failure at
/// once.
#[test]
fn lost_inputs_send_a_job_back_a_bounded_number_of_times() {
    for (lost_job, expected_rounds) in [("a", 4), ("c", 1)] {
        let mut h = Harness::new();
        let w = worker_id(h.input(register("w1", 1, vec![])));
        let b = build_id(h.input(submit(vec![job("a", &[]), job("c", &[]), job("b", &["a"])])));
        h.later();
        let mut rounds = 0;
        while let Some((_, run, name)) = h.assigned().first().cloned() {
            if name == "b" {
                rounds += 1;
                h.report(w, Report { finished: vec![lost_input(run, lost_job)], ..Report::default() });
            } else {
                h.report(w, Report { finished: vec![ok(run, &name)], ..Report::default() });
            }
            h.later();
        }
        assert_eq!(rounds, expected_rounds, "losing {lost_job}");
        let status = h.solver.build_status(b).expect("build");
        assert_eq!(status.state, BuildState::Failed, "losing {lost_job}");
        assert_eq!(status.jobs[2].state, JobState::Failed);
    }
}

#[test]
fn the_longest_remaining_path_goes_first() {
    let mut h = Harness::new();
    worker_id(h.input(register("w1", 1, vec![])));
    h.input(submit(vec![
        job("short", &[]),
        job("long1", &[]),
        job("long2", &["long1"]),
        job("long3", &["long2"]),
    ]))
    .expect("submit");
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["long1"], "the chain's head first");
}

#[test]
fn durations_of_earlier_runs_order_later_builds() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    // First build: learn that `slow` takes 5 s and `fast` 10 ms.
    h.input(submit(vec![job("fast", &[]), job("slow", &[])])).expect("submit");
    h.later();
    let mut done = Vec::new();
    for (_, run, name) in h.assigned() {
        let mut result = ok(run, &name);
        result.duration_ms = if name == "slow" { 5_000 } else { 10 };
        done.push(result);
    }
    h.report(w, Report { finished: done, ..Report::default() });
    assert_eq!(h.solver.durations.get("slow"), Some(&5_000), "{:?}", h.solver.durations);
    // Second build: the same names with new contents (new IDs) on a worker
    // with one slot; `fast` comes first in the file.
    let mut fast = job("fast", &[]);
    fast.id = Hash32([0xf2; 32]);
    fast.labels = BTreeMap::from([("pool".to_string(), "one".to_string())]);
    let mut slow = job("slow", &[]);
    slow.id = Hash32([0x52; 32]);
    slow.labels = fast.labels.clone();
    let mut one = register("w2", 1, vec![]);
    if let Input::Register(r) = &mut one {
        r.labels = fast.labels.clone();
    }
    let w2 = worker_id(h.input(one));
    h.input(submit(vec![fast, slow])).expect("submit");
    h.later();
    let runs = h.assigned();
    assert!(runs.iter().all(|r| r.0 == w2), "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["slow"], "the slow job starts first");
}

mod random {
    //! Random graphs, shared between builds, with random cancels and runs
    //! that lose an input (its output gone with its worker) and, in the
    //! later properties, gangs and runs that fail: no job runs for builds
    //! that were all cancelled, a gang's members start together, and every
    //! build that was not cancelled ends, failing only where a run of one of
    //! its jobs failed and no gang restart made up for it. Every run's log
    //! replays to an equal state.

    use std::collections::{BTreeMap, BTreeSet};

    use drover_proto::{BuildEvent, BuildStatus};
    use proptest::prelude::*;

    use super::*;
    use crate::build::MAX_GANG_RESTARTS;

    /// A universe of jobs: job `i` (named `j{i}`) needs some earlier jobs,
    /// and may belong to a gang. A build is a subset closed under needs and
    /// gangs, so the same job (same ID, same gang) appears in many, unless
    /// it is private.
    #[derive(Clone, Debug)]
    struct Universe {
        needs: Vec<Vec<usize>>,
        gangs: Vec<Gang>,
        /// Jobs whose ID each build makes its own: with gangs not shared
        /// between builds, every gang member and every job that needs one,
        /// directly or not (an ID stands for the job's inputs too).
        private: Vec<bool>,
    }

    /// A gang of the universe, named `g{k}` after its place: its
    /// `min_available` is its size (all or nothing).
    #[derive(Clone, Debug)]
    struct Gang {
        members: Vec<usize>,
        restart: bool,
    }

    impl Universe {
        /// The gang job `i` belongs to, with its place.
        fn gang_of(&self, i: usize) -> Option<(usize, &Gang)> {
            self.gangs.iter().enumerate().find(|(_, g)| g.members.contains(&i))
        }
    }

    /// The index of job `j{i}`.
    fn index(name: &str) -> usize {
        name[1..].parse().expect("job index")
    }

    fn universe() -> impl Strategy<Value = Universe> {
        (3usize..10).prop_flat_map(|n| {
            proptest::collection::vec(proptest::collection::vec(any::<bool>(), n), n).prop_map(move |m| {
                Universe {
                    needs: (0..n)
                        .map(|i| (0..i).filter(|&j| m[i][j] && (i + j) % 3 != 0).collect())
                        .collect(),
                    gangs: Vec::new(),
                    private: vec![false; n],
                }
            })
        })
    }

    /// A universe where (two times in three) one or two gangs of two or
    /// three jobs each are drawn. They are valid: a job is in one gang at
    /// most, and no member needs another, even through other jobs (the
    /// solver refuses such a gang: its jobs start together). Unless
    /// `shared`, each build has gang jobs of its own (see
    /// [`Universe::private`]).
    fn universe_with_gangs(shared: bool) -> impl Strategy<Value = Universe> {
        universe().prop_flat_map(move |u| {
            let n = u.needs.len();
            let picks =
                proptest::collection::vec((proptest::collection::vec(0..n, 2..4), any::<bool>()), 0..3);
            (Just(u), picks).prop_map(move |(mut u, picks)| {
                // What each job needs, directly or not (needs come earlier).
                let mut below: Vec<BTreeSet<usize>> = Vec::new();
                for needs in &u.needs {
                    let mut all = BTreeSet::new();
                    for &d in needs {
                        all.insert(d);
                        all.extend(below[d].iter().copied());
                    }
                    below.push(all);
                }
                let mut taken = BTreeSet::new();
                // Whether a job of `from` needs one of `to`, directly or not.
                let reaches = |from: &[usize], to: &[usize]| {
                    from.iter().any(|&f| to.iter().any(|t| below[f].contains(t)))
                };
                for (candidates, restart) in picks {
                    let mut members: Vec<usize> = Vec::new();
                    for c in candidates {
                        let related =
                            members.iter().any(|&m| m == c || below[m].contains(&c) || below[c].contains(&m));
                        // Two gangs that need each other are refused at
                        // submission (see
                        // `gangs_that_need_each_other_are_refused`): none
                        // are drawn here.
                        let with = [members.as_slice(), &[c]].concat();
                        let cycle =
                            u.gangs.iter().any(|g| reaches(&g.members, &with) && reaches(&with, &g.members));
                        if !related && !cycle && !taken.contains(&c) {
                            members.push(c);
                        }
                    }
                    if members.len() >= 2 {
                        members.sort_unstable();
                        taken.extend(members.iter().copied());
                        u.gangs.push(Gang { members, restart });
                    }
                }
                if !shared {
                    for i in 0..n {
                        u.private[i] = u.gang_of(i).is_some() || u.needs[i].iter().any(|&d| u.private[d]);
                    }
                }
                u
            })
        })
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Submit the build made of job `top`, everything it needs and the
        /// rest of every gang among those, with what they need (one in three
        /// with `max_parallel`).
        Submit(usize),
        /// Submit job `top` and what it needs but not the rest of its gangs:
        /// refused, for the gang's sake, if that splits a gang.
        SubmitPart(usize),
        /// Cancel the k-th submitted build (if any).
        Cancel(usize),
        /// Workers finish what they run (successfully) and time passes.
        Work,
        /// The k-th run in flight (if any, and if its job needs another)
        /// ends unable to get its first need's output: lost with its worker.
        Lose(usize),
        /// The k-th run in flight (if any) fails: its commands exit with 1.
        Fail(usize),
        /// Over a minute passes and the history setting drops to keeping
        /// none, then back to all: every build that had finished by then is
        /// forgotten (its end is read first, for the checks).
        Forget,
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                3 => (0usize..10).prop_map(Op::Submit),
                1 => (0usize..6).prop_map(Op::Cancel),
                3 => Just(Op::Work),
                1 => (0usize..8).prop_map(Op::Lose),
            ],
            1..30,
        )
    }

    /// [`ops`] with failing runs and split gangs.
    fn ops_with_failures() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                3 => (0usize..10).prop_map(Op::Submit),
                1 => (0usize..10).prop_map(Op::SubmitPart),
                1 => (0usize..6).prop_map(Op::Cancel),
                3 => Just(Op::Work),
                1 => (0usize..8).prop_map(Op::Lose),
                2 => (0usize..8).prop_map(Op::Fail),
                1 => Just(Op::Forget),
            ],
            1..30,
        )
    }

    /// Job `top` and everything it needs; with `gangs`, also the rest of
    /// each gang reached, and what they need.
    fn closure(u: &Universe, top: usize, gangs: bool) -> Vec<usize> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![top];
        while let Some(i) = stack.pop() {
            if seen.insert(i) {
                stack.extend(u.needs[i].iter().copied());
                if gangs && let Some((_, g)) = u.gang_of(i) {
                    stack.extend(g.members.iter().copied());
                }
            }
        }
        seen.into_iter().collect()
    }

    /// Job `i`'s ID in the build numbered `salt` among the submissions.
    fn job_id(u: &Universe, i: usize, salt: u8) -> Hash32 {
        let mut id = job(&format!("j{i}"), &[]).id;
        if u.private[i] {
            id.0[31] = salt;
        }
        id
    }

    /// Job `i` in the build numbered `salt` among the submissions.
    fn def(u: &Universe, i: usize, salt: u8) -> JobDef {
        let needs: Vec<String> = u.needs[i].iter().map(|j| format!("j{j}")).collect();
        let needs: Vec<&str> = needs.iter().map(String::as_str).collect();
        let def = JobDef { id: job_id(u, i, salt), ..job(&format!("j{i}"), &needs) };
        match u.gang_of(i) {
            Some((k, g)) => in_gang(def, &format!("g{k}"), g.members.len() as u32, g.restart),
            // The same content in every build, whatever its ID: a private
            // job whose needs wrote the same outputs (every output here has
            // one tree) takes another build's output by early cutoff. Every
            // third runs again once after a failure.
            None => JobDef {
                own: Some(Hash32([i as u8 + 1; 32])),
                retry_on_failure: u32::from(i.is_multiple_of(3)),
                ..def
            },
        }
    }

    /// Runs in flight: run → (worker, job name, job ID).
    type Running = BTreeMap<u64, (u64, String, Hash32)>;

    /// The cluster under test: two workers of two slots, the builds
    /// submitted, and what the program did to them.
    struct Sim<'a> {
        u: &'a Universe,
        h: Harness,
        workers: [u64; 2],
        builds: Vec<u64>,
        cancelled: BTreeSet<u64>,
        running: Running,
        /// Jobs a run of which the program made fail (or lose the output of
        /// a gang member, which cannot be built again alone): only a build
        /// with one of them may fail.
        disrupted: BTreeSet<Hash32>,
        /// Builds submitted, refused ones included.
        submissions: u8,
        /// Losses per job, kept within what a job survives (three).
        losses: BTreeMap<String, u32>,
        /// How forgotten builds ended, read just before they were.
        forgotten: BTreeMap<u64, (BuildStatus, Vec<BuildEvent>)>,
    }

    impl Sim<'_> {
        fn new(u: &Universe) -> Sim<'_> {
            let mut h = Harness::new();
            let workers = [
                worker_id(h.input(register("w1", 2, vec![]))),
                worker_id(h.input(register("w2", 2, vec![]))),
            ];
            h.solver.take_effects();
            Sim {
                u,
                h,
                workers,
                builds: Vec::new(),
                cancelled: BTreeSet::new(),
                running: Running::new(),
                disrupted: BTreeSet::new(),
                submissions: 0,
                losses: BTreeMap::new(),
                forgotten: BTreeMap::new(),
            }
        }

        /// Handles one input and checks what it caused, at once: every
        /// assignment serves a live build, and gangs start whole (see
        /// [`Sim::check_gangs`]). Every stop or drop of a run is answered
        /// with the run's end, as a further input.
        fn input(&mut self, input: Input) -> Result<Reply, SolverError> {
            let reply = self.h.input(input);
            let mut assigned = Vec::new();
            let mut ended = Vec::new();
            for effect in self.h.solver.take_effects() {
                match effect {
                    Effect::Assign { worker, assignment } => {
                        let live = |b: &u64| !self.cancelled.contains(b);
                        let needed = self.h.solver.build_ids().into_iter().filter(live).any(|b| {
                            let status = self.h.solver.build_status(b).expect("build");
                            status.jobs.iter().any(|j| j.id == assignment.job && !j.state.is_final())
                        });
                        assert!(
                            needed,
                            "{} runs although every build needing it was cancelled",
                            assignment.name
                        );
                        self.running
                            .insert(assignment.run, (worker, assignment.name.clone(), assignment.job));
                        assigned.push((assignment.run, assignment.name));
                    }
                    // A worker answers a stop or drop of a run it does not
                    // have (its assignment withdrawn before it was
                    // delivered) with the run's end too, as the real one
                    // does: the core keeps the run's slot until then.
                    Effect::Stop { worker, run } | Effect::Drop { worker, run } => {
                        self.running.remove(&run);
                        ended.push((worker, run));
                    }
                    _ => {}
                }
            }
            self.check_gangs(&assigned);
            for (worker, run) in ended {
                let mut stopped = failed(run, 143);
                stopped.exit_code = None;
                self.report(worker, Report { finished: vec![stopped], ..Report::default() });
            }
            reply
        }

        /// A gang starts whole: once an input started a member of a gang
        /// for a build, every member of that gang in the build is running
        /// or has its output, never some without the others (each gang's
        /// `min_available` is its size).
        fn check_gangs(&self, assigned: &[(u64, String)]) {
            for (run, name) in assigned {
                let Some((k, gang)) = self.u.gang_of(index(name)) else { continue };
                for b in self.h.solver.build_ids() {
                    if self.h.solver.run_location(b, name).map(|(_, r)| r) != Some(*run) {
                        continue;
                    }
                    let status = self.h.solver.build_status(b).expect("build");
                    for &m in &gang.members {
                        let member = format!("j{m}");
                        let state = status
                            .jobs
                            .iter()
                            .find(|j| j.name == member)
                            .map(|j| j.state)
                            .expect("a build holds its gangs whole");
                        assert!(
                            state == JobState::Running || state.is_success(),
                            "gang g{k}: {member} is {state} in build {b} as {name} starts (run {run}): \
                             {status:?}"
                        );
                    }
                }
            }
        }

        fn report(&mut self, worker: u64, report: Report) {
            self.input(Input::Report { worker, report }).expect("report");
        }

        /// Renews the workers' leases, as their polls do, and lets
        /// locality timers expire.
        fn later(&mut self) {
            for worker in self.workers {
                assert_eq!(
                    self.input(Input::Poll { worker }).expect("poll"),
                    Reply::Done,
                    "worker {worker} was lost"
                );
            }
            self.h.now += 1_000;
            self.input(Input::Tick).expect("tick");
        }

        /// Workers end every run in flight successfully, and time passes.
        fn work(&mut self) {
            for (run, (w, name, id)) in std::mem::take(&mut self.running) {
                let mut done = ok(run, &name);
                done.output.as_mut().expect("an output").job = id;
                self.report(w, Report { started: vec![run], finished: vec![done], ..Report::default() });
            }
            self.later();
        }

        /// The k-th run in flight, taken out of the runs in flight.
        fn take_run(&mut self, k: usize) -> Option<(u64, u64, String, Hash32)> {
            let (&run, _) = self.running.iter().nth(k % self.running.len().max(1))?;
            let (w, name, id) = self.running.remove(&run).expect("in flight");
            Some((run, w, name, id))
        }

        fn apply(&mut self, op: &Op) {
            let u = self.u;
            match *op {
                Op::Submit(top) | Op::SubmitPart(top) => {
                    let whole = matches!(op, Op::Submit(_));
                    let members = closure(u, top % u.needs.len(), whole);
                    let split = u.gangs.iter().any(|g| {
                        let inside = g.members.iter().filter(|m| members.contains(m)).count();
                        inside > 0 && inside < g.members.len()
                    });
                    self.submissions += 1;
                    let jobs = members.iter().map(|&i| def(u, i, self.submissions)).collect();
                    // Some builds hold jobs back (`max_parallel`).
                    let max_parallel = (top % 3 == 0).then_some(1 + (top % 2) as u32);
                    let before = self.h.solver.build_ids();
                    let reply = self.input(submit_with(jobs, OnError::Quit, max_parallel));
                    if split {
                        match reply {
                            Err(SolverError::InvalidBuild(msg)) => {
                                assert!(msg.contains("gang") && msg.contains("min_available"), "{msg}")
                            }
                            other => panic!("a split gang must be refused, got {other:?}"),
                        }
                        assert_eq!(self.h.solver.build_ids(), before, "a refused build changes nothing");
                    } else {
                        self.builds.push(build_id(reply));
                    }
                }
                Op::Cancel(k) => {
                    if let Some(&b) = self.builds.get(k % self.builds.len().max(1)) {
                        if self.forgotten.contains_key(&b) {
                            // Forgotten: it had finished; nothing to cancel.
                            assert_eq!(
                                self.input(Input::Cancel { build: b }),
                                Err(SolverError::UnknownBuild(b))
                            );
                            return;
                        }
                        // Cancelling a finished build changes nothing.
                        if !self.h.solver.build_status(b).expect("build").state.is_final() {
                            self.cancelled.insert(b);
                        }
                        self.input(Input::Cancel { build: b }).expect("cancel");
                    }
                }
                Op::Forget => {
                    for _ in 0..61 {
                        self.later();
                    }
                    for &b in &self.builds {
                        if let Some(status) = self.h.solver.build_status(b).filter(|s| s.state.is_final()) {
                            let events = self.h.solver.events(b, 0).expect("events").0;
                            self.forgotten.entry(b).or_insert((status, events));
                        }
                    }
                    self.input(Input::KeepFinished { builds: Some(0) }).expect("setting");
                    for &b in &self.builds {
                        assert_eq!(
                            self.h.solver.forgotten(b),
                            self.forgotten.contains_key(&b),
                            "build {b}: forgotten exactly when it had finished"
                        );
                    }
                    // Back to keeping all: nothing is forgotten unread.
                    self.input(Input::KeepFinished { builds: None }).expect("setting");
                }
                Op::Work => self.work(),
                Op::Lose(k) => {
                    // The run, its worker and its job's first need, if it
                    // has one and may lose it once more.
                    let target = self.running.iter().nth(k % self.running.len().max(1)).and_then(
                        |(&run, (w, name, id))| {
                            let need = *u.needs[index(name)].first()?;
                            (self.losses.get(name).copied().unwrap_or(0) < 3)
                                .then(|| (run, *w, name.clone(), *id, need))
                        },
                    );
                    if let Some((run, w, name, job, need)) = target {
                        self.running.remove(&run);
                        *self.losses.entry(name).or_default() += 1;
                        if u.gang_of(need).is_some() {
                            // A gang member's output is not built again
                            // alone: the loss is a failure.
                            self.disrupted.insert(job);
                        }
                        let mut lost = lost_input(run, &format!("j{need}"));
                        // A private need is the one of the same build.
                        lost.lost_inputs = vec![job_id(u, need, job.0[31])];
                        self.report(
                            w,
                            Report { started: vec![run], finished: vec![lost], ..Report::default() },
                        );
                    }
                }
                Op::Fail(k) => {
                    if let Some((run, w, _, job)) = self.take_run(k) {
                        self.disrupted.insert(job);
                        let report = Report {
                            started: vec![run],
                            finished: vec![failed(run, 1)],
                            ..Report::default()
                        };
                        self.report(w, report);
                    }
                }
            }
        }

        /// Keeps working, every run succeeding, until nothing runs and
        /// every build is over, for 200 rounds at most (a build that is not
        /// over by then never will be).
        fn drain(&mut self) {
            for _ in 0..200 {
                let over = |b: &u64| {
                    self.forgotten.contains_key(b)
                        || self.h.solver.build_status(*b).expect("build").state.is_final()
                };
                if self.running.is_empty() && self.builds.iter().all(over) {
                    return;
                }
                self.work();
            }
        }

        /// How the builds ended: see [`check_end`].
        fn check_ends(&self) {
            for &b in &self.builds {
                let (status, events) = match self.forgotten.get(&b) {
                    Some(ended) => ended.clone(),
                    None => (
                        self.h.solver.build_status(b).expect("build"),
                        self.h.solver.events(b, 0).expect("events").0,
                    ),
                };
                if self.cancelled.contains(&b) {
                    assert_eq!(status.state, BuildState::Cancelled, "build {b}");
                } else {
                    check_end(self.u, &self.disrupted, &status, &events);
                }
            }
        }
    }

    /// A build that was not cancelled ended. It failed only if a run of
    /// one of its jobs failed, and then because a failure stood: that of a
    /// job outside a gang that restarts, or the failure after a gang's last
    /// restart. If it succeeded, each restarting gang that failed on the
    /// way ran again whole after its last failure: every member succeeded
    /// again, not from the cache, and a member of the build's own started
    /// again in it.
    fn check_end(u: &Universe, disrupted: &BTreeSet<Hash32>, status: &BuildStatus, events: &[BuildEvent]) {
        let b = status.id;
        let failures = || {
            events.iter().enumerate().filter_map(|(at, e)| match &e.kind {
                EventKind::JobFinished { job, state: JobState::Failed, .. } => Some((at, index(job))),
                _ => None,
            })
        };
        match status.state {
            BuildState::Failed => {
                assert!(
                    status.jobs.iter().any(|j| disrupted.contains(&j.id)),
                    "build {b} failed, yet no run of its jobs did: {status:?}"
                );
                let mut restarts: BTreeMap<usize, u32> = BTreeMap::new();
                let stood = failures().any(|(_, i)| match u.gang_of(i) {
                    Some((k, g)) if g.restart => {
                        let n = restarts.entry(k).or_default();
                        *n += 1;
                        *n > MAX_GANG_RESTARTS
                    }
                    _ => true,
                });
                assert!(stood, "build {b} failed, but its gangs had restarts left: {events:?}");
            }
            BuildState::Succeeded => {
                for (k, g) in u.gangs.iter().enumerate().filter(|(_, g)| g.restart) {
                    let Some(last) =
                        failures().filter(|(_, i)| g.members.contains(i)).map(|(at, _)| at).next_back()
                    else {
                        continue;
                    };
                    for &m in &g.members {
                        let member = format!("j{m}");
                        let after = &events[last + 1..];
                        let started = after
                            .iter()
                            .any(|e| matches!(&e.kind, EventKind::JobStarted { job, .. } if *job == member));
                        let succeeded = after.iter().any(|e| {
                            matches!(&e.kind, EventKind::JobFinished { job, state: JobState::Succeeded, .. } if *job == member)
                        });
                        // A shared job may join another build's run instead.
                        assert!(
                            (started || !u.private[m]) && succeeded,
                            "build {b}: gang g{k} restarted, but {member} did not run again: {events:?}"
                        );
                    }
                }
            }
            state => panic!("build {b} never ended: it is {state}: {status:?}"),
        }
    }

    /// Runs the program, lets the workers finish everything, and checks
    /// how every build ended. Halfway, the solver is written down and read
    /// back, and the copy carries on: the final replay of the whole log
    /// must rebuild what the copy came to.
    fn run(u: &Universe, program: &[Op]) {
        let mut s = Sim::new(u);
        for (i, op) in program.iter().enumerate() {
            if i == program.len() / 2 {
                s.h.restore_from_snapshot();
            }
            s.apply(op);
        }
        s.drain();
        s.check_ends();
        s.h.assert_replays();
    }

    /// Found by the shared-gangs property (CI, one case in ~300,000): in a
    /// build with `max_parallel: 1`, a lost output sent `j0` back while
    /// `j3` filled the build's room, so `j0` was held; then `j3`'s own
    /// input was lost and it left the core. The room it left must go to
    /// `j0`, or the build waits forever.
    #[test]
    fn a_held_job_goes_once_gang_members_leave_the_core_after_a_loss() {
        let gang = |members: Vec<usize>| Gang { members, restart: false };
        let u = Universe {
            needs: vec![vec![], vec![], vec![0], vec![2], vec![], vec![], vec![], vec![3, 4], vec![0, 2, 5]],
            gangs: vec![gang(vec![6, 7]), gang(vec![4, 8])],
            private: vec![false; 9],
        };
        use Op::*;
        let program =
            [Submit(0), Submit(4), Work, Submit(2), Work, Submit(2), Submit(6), Lose(5), Lose(5), Submit(0)];
        run(&u, &program);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn cancels_stop_only_unneeded_work_and_survivors_complete(u in universe(), program in ops()) {
            run(&u, &program);
        }

        /// The same with gangs, some restarting on failure, and runs that
        /// fail; each build has gang jobs of its own.
        #[test]
        fn gangs_start_whole_and_builds_with_failing_runs_end(
            u in universe_with_gangs(false),
            program in ops_with_failures(),
        ) {
            run(&u, &program);
        }

        /// The same with the jobs of gangs shared between builds.
        #[test]
        fn shared_gangs_start_whole_and_builds_with_failing_runs_end(
            u in universe_with_gangs(true),
            program in ops_with_failures(),
        ) {
            run(&u, &program);
        }
    }
}

fn in_gang(mut def: JobDef, name: &str, min_available: u32, restart: bool) -> JobDef {
    def.gang = Some(drover_proto::GangDef { name: name.into(), min_available, restart });
    def
}

#[test]
fn a_gang_starts_together_and_restarts_whole_when_a_member_fails() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    build_id(h.input(submit(vec![job("blocker", &[])])));
    h.later();
    let first = h.assigned();
    assert_eq!(first.iter().map(|a| a.2.as_str()).collect::<Vec<_>>(), ["blocker"]);
    let b = build_id(h.input(submit(vec![
        in_gang(job("s1", &[]), "pair", 2, true),
        in_gang(job("s2", &[]), "pair", 2, true),
    ])));
    h.later();
    // One slot is left beside the blocker: the pair waits, holding nothing.
    assert!(h.assigned().is_empty());
    h.report(w, Report { finished: vec![ok(first[0].1, "blocker")], ..Report::default() });
    let pair = h.assigned();
    let mut names: Vec<&str> = pair.iter().map(|a| a.2.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["s1", "s2"], "both start in one step");
    // s1 succeeds, s2 fails: the gang restarts, both run again.
    let run = |name: &str| pair.iter().find(|a| a.2 == name).map(|a| a.1).expect("assigned");
    h.report(w, Report { finished: vec![ok(run("s1"), "s1")], ..Report::default() });
    assert!(h.assigned().is_empty());
    h.report(w, Report { finished: vec![failed(run("s2"), 1)], ..Report::default() });
    let again = h.assigned();
    let mut names: Vec<&str> = again.iter().map(|a| a.2.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["s1", "s2"], "the whole gang runs again, s1 despite its cached result");
    for (_, run, name) in &again {
        h.report(w, Report { finished: vec![ok(*run, name)], ..Report::default() });
    }
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    let (events, _) = h.solver.events(b, 0).expect("events");
    let requeued = events.iter().filter(|e| matches!(e.kind, EventKind::JobRequeued { .. })).count();
    assert_eq!(requeued, 2, "both members were requeued by the restart");
}

#[test]
fn a_gang_that_fails_without_restart_fails_the_build_and_bad_gangs_are_refused() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("s1", &[]), "pair", 2, false),
        in_gang(job("s2", &[]), "pair", 2, false),
    ])));
    h.later();
    let pair = h.assigned();
    assert_eq!(pair.len(), 2);
    h.report(w, Report { finished: vec![failed(pair[0].1, 1)], ..Report::default() });
    h.report(w, Report { finished: vec![ok(pair[1].1, &pair[1].2)], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);

    for (jobs, why) in [
        (vec![in_gang(job("a", &[]), "g", 3, false), in_gang(job("b", &[]), "g", 3, false)], "min_available"),
        (
            vec![in_gang(job("a", &[]), "g", 2, false), in_gang(job("b", &["a"]), "g", 2, false)],
            "another job of the gang",
        ),
        (vec![in_gang(job("a", &[]), "g", 1, false), in_gang(job("b", &[]), "g", 2, false)], "disagree"),
    ] {
        match h.input(submit(jobs)) {
            Err(SolverError::InvalidBuild(msg)) => assert!(msg.contains(why), "{msg}"),
            other => panic!("expected a refusal ({why}), got {other:?}"),
        }
    }
}

/// A build larger than a build file may be is refused, whoever sends it.
#[test]
fn a_build_past_the_job_limit_is_refused() {
    let mut h = Harness::new();
    let jobs: Vec<JobDef> = (0..=100_000).map(|i| job(&format!("j{i}"), &[])).collect();
    let refused = h.input(submit(jobs));
    assert!(matches!(&refused, Err(e) if e.to_string().contains("at most 100,000")), "{refused:?}");
}

/// A job after a wide fan-out names its first unfinished needs and counts
/// the rest.
#[test]
fn a_job_waiting_for_many_needs_names_a_few() {
    let mut h = Harness::new();
    h.input(register("w1", 1, vec![])).expect("w1 registers");
    let mut jobs: Vec<_> = (0..7).map(|i| job(&format!("n{i}"), &[])).collect();
    let needs: Vec<String> = (0..7).map(|i| format!("n{i}")).collect();
    jobs.push(job("after", &needs.iter().map(String::as_str).collect::<Vec<_>>()));
    let b = build_id(h.input(submit_with(jobs, OnError::Quit, None)));
    let status = h.solver.build_status(b).expect("build");
    let after = status.jobs.iter().find(|j| j.name == "after").expect("job");
    assert_eq!(after.detail, "waits for n0, n1, n2, n3, n4 and 2 more");
}

#[test]
fn queued_jobs_say_why_they_wait() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit_with(
        vec![job("a", &[]), job("b", &[]), job("c", &[]), job("after", &["a"])],
        OnError::Quit,
        Some(2),
    )));
    let detail = |h: &Harness, name: &str| {
        let status = h.solver.build_status(b).expect("build");
        status.jobs.iter().find(|j| j.name == name).map(|j| j.detail.clone()).expect("job")
    };
    assert_eq!(detail(&h, "after"), "waits for a");
    assert_eq!(detail(&h, "c"), "held back by max_parallel (2 of the build's jobs at once)");
    // a reads nothing, so any worker may take it at once: w1 runs it, and b
    // finds no room.
    let runs = h.assigned();
    assert_eq!(runs.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["a"]);
    let no_room = "no worker has room for it now (it needs a slot; the workers that can run it: w1)";
    assert_eq!(detail(&h, "b"), no_room);
    // a ends: w1 takes b, and `after` reads a's output, which only w1 holds:
    // it waits for w1 a little before any worker may take it.
    h.report(w, Report { finished: vec![ok(runs[0].1, "a")], ..Report::default() });
    assert_eq!(h.assigned().iter().map(|r| r.2.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(
        detail(&h, "after"),
        "waiting briefly for the workers holding its inputs (w1) before any worker may take it"
    );
    h.later();
    assert_eq!(detail(&h, "after"), no_room);
    // Its only worker drains: room there would be no help, and it says so.
    assert_eq!(h.input(Input::Drain { worker: w }), Ok(Reply::Done));
    assert_eq!(
        detail(&h, "after"),
        "the only workers that could run it are draining (w1): it waits for one that is not"
    );
}

/// A job that needs a token only some workers offer, all of them busy,
/// says so, and which workers could run it: an idle worker without the
/// token is not one of them.
#[test]
fn a_job_waiting_for_a_token_names_it_and_the_workers_that_offer_it() {
    let mut h = Harness::new();
    let mut with_token = register("net", 1, vec![]);
    if let Input::Register(r) = &mut with_token {
        r.capacity.tokens.insert("network".into(), 1);
    }
    worker_id(h.input(with_token));
    worker_id(h.input(register("plain", 1, vec![])));
    let online = |name: &str| JobDef { tokens: [("network".to_owned(), 1)].into(), ..job(name, &[]) };
    let mut alone = online("alone");
    alone.exclusive = vec!["network".into()];
    let b = build_id(h.input(submit(vec![online("first"), online("second"), alone])));
    h.later();
    assert_eq!(names(&h.assigned()), ["first"]);
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(
        status.jobs[1].detail,
        "no worker has room for it now (it needs a slot and 1 network token; the workers that can run it: net)"
    );
    assert_eq!(
        status.jobs[2].detail,
        "no worker has room for it now (it needs a slot and token network to itself; the workers that can run it: net)"
    );
}

/// Runs every assignment to success, round after round.
fn run_all(h: &mut Harness, w: u64, rounds: usize) {
    run_counting(h, w, rounds, &mut BTreeMap::new());
}

#[test]
fn dependents_of_a_restarting_gang_wait_for_the_whole_gang() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("s1", &[]), "pair", 2, true),
        in_gang(job("s2", &[]), "pair", 2, true),
        job("after", &["s1"]),
    ])));
    h.later();
    let pair = h.assigned();
    let run = |name: &str| pair.iter().find(|a| a.2 == name).map(|a| a.1).expect("assigned");
    h.report(w, Report { finished: vec![ok(run("s1"), "s1")], ..Report::default() });
    h.later();
    assert!(h.assigned().is_empty(), "after waits for the whole gang, not just s1");
    h.report(w, Report { finished: vec![failed(run("s2"), 1)], ..Report::default() });
    run_all(&mut h, w, 4);
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
}

#[test]
fn a_gang_member_skipped_by_a_failure_fails_the_gang_instead_of_hanging() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b = build_id(h.input(submit_with(
        vec![
            job("x", &[]),
            in_gang(job("a", &[]), "pair", 2, false),
            in_gang(job("b", &["x"]), "pair", 2, false),
        ],
        OnError::Continue,
        None,
    )));
    h.later();
    let x = h.assigned().into_iter().find(|a| a.2 == "x").expect("x runs first").1;
    h.report(w, Report { finished: vec![failed(x, 1)], ..Report::default() });
    run_all(&mut h, w, 3);
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Failed, "the build ends");
    let a = status.jobs.iter().find(|j| j.name == "a").expect("a");
    assert_eq!(a.state, JobState::Failed);
    assert!(a.detail.contains("gang pair cannot start"), "{}", a.detail);
}

#[test]
fn a_gang_member_served_from_the_cache_lowers_what_the_gang_waits_for() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let gang = |a: &str| {
        vec![
            job("x", &[]),
            in_gang(job(a, &[]), "pair", 2, false),
            in_gang(job("b", &["x"]), "pair", 2, false),
        ]
    };
    let b1 = build_id(h.input(submit(gang("a1"))));
    run_all(&mut h, w, 4);
    assert_eq!(h.solver.build_status(b1).expect("build").state, BuildState::Succeeded);
    // b is cached now; a2 must not wait for a partner that never comes.
    let b2 = build_id(h.input(submit(gang("a2"))));
    run_all(&mut h, w, 4);
    let status = h.solver.build_status(b2).expect("build");
    assert_eq!(status.state, BuildState::Succeeded, "{status:?}");
}

/// Two builds share a gang that restarts on failure: its jobs run once, for
/// both. When a member fails, each build sends the gang again, whole, and
/// both end once it ran again. The first build's restart comes while `b`
/// still runs for the second: its gang waits for that job to leave the
/// core rather than join it (`a` would then wait for a partner that never
/// comes).
#[test]
fn builds_sharing_a_restarting_gang_both_end_after_a_member_fails() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let gang = || vec![in_gang(job("a", &[]), "g", 2, true), in_gang(job("b", &[]), "g", 2, true)];
    let b1 = build_id(h.input(submit(gang())));
    let b2 = build_id(h.input(submit(gang())));
    let pair = h.assigned();
    let mut started = names(&pair);
    started.sort_unstable();
    assert_eq!(started, ["a", "b"], "one run of each, for both builds");
    let run = |name: &str| pair.iter().find(|a| a.2 == name).map(|a| a.1).expect("assigned");
    h.report(w, Report { finished: vec![failed(run("a"), 1)], ..Report::default() });
    h.report(w, Report { finished: vec![ok(run("b"), "b")], ..Report::default() });
    run_all(&mut h, w, 5);
    for b in [b1, b2] {
        let status = h.solver.build_status(b).expect("build");
        assert_eq!(status.state, BuildState::Succeeded, "build {b}: {status:?}");
    }
}

/// Two gangs that need each other can never start: gang `x` waits for `d`,
/// whose need `b` waits for gang `y`, which waits for `c`, whose need `a`
/// waits for gang `x`. The solver refuses a gang one member of which needs
/// another (they start together); across two gangs it is the same
/// deadlock, so such a build is refused, naming the gangs.
#[test]
fn gangs_that_need_each_other_are_refused() {
    let mut h = Harness::new();
    worker_id(h.input(register("w1", 4, vec![])));
    let jobs = vec![
        in_gang(job("a", &[]), "x", 2, false),
        in_gang(job("b", &[]), "y", 2, false),
        in_gang(job("c", &["a"]), "y", 2, false),
        in_gang(job("d", &["b"]), "x", 2, false),
    ];
    match h.input(submit(jobs)) {
        Err(SolverError::InvalidBuild(msg)) => {
            assert!(msg.contains(r#"gangs "x", "y" wait for each other"#), "{msg}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The same gangs, one way round only, are fine: y goes after x.
    let jobs = vec![
        in_gang(job("a", &[]), "x", 2, false),
        in_gang(job("d", &[]), "x", 2, false),
        in_gang(job("b", &["a"]), "y", 2, false),
        in_gang(job("c", &["d"]), "y", 2, false),
    ];
    assert!(matches!(h.input(submit(jobs)), Ok(Reply::Submitted(_))));
}

/// A gang one of whose jobs needs another is named as such, even behind
/// many gangs it holds up (each of those waits too, and is searched first
/// in name order); a bad `min_available` of an earlier gang comes first.
/// The check is linear in the build: a chain of 20,000 one-job gangs, each
/// needing the one before (the shape that took 28 s to check when every
/// gang searched all its ancestors), is accepted.
#[test]
fn a_gang_needing_itself_is_named_behind_the_gangs_it_holds_up() {
    let mut h = Harness::new();
    worker_id(h.input(register("w1", 4, vec![])));
    let mut jobs = vec![in_gang(job("z1", &[]), "z", 2, false), in_gang(job("z2", &["z1"]), "z", 2, false)];
    for i in 0..50 {
        let need = if i == 0 { "z2".to_owned() } else { format!("a{}", i - 1) };
        jobs.push(in_gang(job(&format!("a{i}"), &[need.as_str()]), &format!("a{i:02}"), 1, false));
    }
    match h.input(submit(jobs.clone())) {
        Err(SolverError::InvalidBuild(msg)) => {
            assert!(msg.contains(r#"gang "z": job "z1" is needed by another job of the gang"#), "{msg}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    jobs.push(in_gang(job("b", &[]), "b", 3, false));
    match h.input(submit(jobs)) {
        Err(SolverError::InvalidBuild(msg)) => {
            assert!(msg.contains(r#"gang "b": min_available must be from 1 to its 1 job(s), not 3"#), "{msg}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let chain: Vec<JobDef> = (0..20_000)
        .map(|i| {
            let need = format!("g{}", i.max(1) - 1);
            let needs: &[&str] = if i == 0 { &[] } else { &[need.as_str()] };
            in_gang(job(&format!("g{i}"), needs), &format!("g{i}"), 1, false)
        })
        .collect();
    assert!(matches!(h.input(submit(chain)), Ok(Reply::Submitted(_))));
}

/// A job's needs are resolved to jobs once, at submission: the core gets
/// their IDs and the assignment names each with its ID, in the order the
/// job lists them.
#[test]
fn needs_resolve_to_their_jobs_in_the_listed_order() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 4, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[]), job("b", &[]), job("c", &["b", "a"])])));
    assert_eq!(h.solver.builds[&b].needs_of(2), [1, 0]);
    h.later();
    let first = h.solver.take_effects();
    let runs: Vec<(u64, String)> = first
        .into_iter()
        .filter_map(|e| match e {
            Effect::Assign { assignment, .. } => Some((assignment.run, assignment.name)),
            _ => None,
        })
        .collect();
    let finished = runs.iter().map(|(run, name)| ok(*run, name)).collect();
    h.report(w, Report { finished, ..Report::default() });
    h.later();
    let c = h
        .solver
        .take_effects()
        .into_iter()
        .find_map(|e| match e {
            Effect::Assign { assignment, .. } if assignment.name == "c" => Some(assignment),
            _ => None,
        })
        .expect("c assigned");
    let deps: Vec<(String, Hash32)> = c.deps.iter().map(|d| (d.name.clone(), d.job)).collect();
    assert_eq!(deps, [("b".to_owned(), job("b", &[]).id), ("a".to_owned(), job("a", &[]).id)]);
}

#[test]
fn metrics_count_builds_job_ends_runs_workers_and_queues() {
    use super::RunEnd;
    let mut h = Harness::new();
    worker_id(h.input(register("w1", 3, vec![])));
    worker_id(h.input(register("w2", 2, vec![])));
    let m = h.solver.metrics();
    assert_eq!((m.workers_up, m.workers_lost, m.slots, m.runs_in_flight), (2, 0, 5, 0));
    // Two builds share `shared`; the first also has a failing job with a
    // dependent, skipped.
    let b1 = build_id(h.input(submit(vec![job("shared", &[]), job("bad", &[]), job("after-bad", &["bad"])])));
    let b2 = build_id(h.input(submit(vec![job("shared", &[])])));
    h.later();
    let m = h.solver.metrics();
    assert_eq!(m.builds_submitted, 2);
    assert_eq!(m.jobs_scheduled, 2, "shared once, bad once; after-bad waits in its build");
    let runs = h.assigned();
    let shared = runs.iter().find(|r| r.2 == "shared").expect("shared ran").1;
    let bad = runs.iter().find(|r| r.2 == "bad").expect("bad ran").1;
    let m = h.solver.metrics();
    assert_eq!(m.runs_in_flight, 2);
    let live: u64 = m
        .builds
        .iter()
        .filter(|(s, _)| matches!(s, BuildState::Queued | BuildState::Running))
        .map(|b| b.1)
        .sum();
    assert_eq!(live, 2, "{:?}", m.builds);
    let worker_of = |run: u64| runs.iter().find(|r| r.1 == run).expect("assigned").0;
    h.report(worker_of(bad), Report { finished: vec![failed(bad, 1)], ..Report::default() });
    h.report(worker_of(shared), Report { finished: vec![ok(shared, "shared")], ..Report::default() });
    let m = h.solver.metrics();
    assert_eq!(
        m.builds,
        [
            (BuildState::Queued, 0),
            (BuildState::Running, 0),
            (BuildState::Succeeded, 1),
            (BuildState::Failed, 1),
            (BuildState::Cancelled, 0),
        ]
    );
    assert_eq!(
        m.build_jobs_ended,
        [
            (JobState::Succeeded, 2),
            (JobState::Cached, 0),
            (JobState::Failed, 1),
            (JobState::Cancelled, 0),
            (JobState::Skipped, 1)
        ],
        "each build counts its own end of the shared job"
    );
    assert_eq!(
        m.runs_ended,
        [(RunEnd::Succeeded, 1), (RunEnd::Cached, 0), (RunEnd::Failed, 1), (RunEnd::GaveUp, 0)],
        "the shared job ran once"
    );
    assert_eq!((m.runs_in_flight, m.jobs_scheduled), (0, 0));
    assert!(m.queues.iter().all(|(_, queued, running)| (*queued, *running) == (0, 0)), "{:?}", m.queues);
    assert!(!m.queues.is_empty(), "the default queue is listed");
    // Replay rebuilds the same counts.
    h.assert_replays();
    assert_eq!(h.solver.build_status(b1).expect("b1").state, BuildState::Failed);
    assert_eq!(h.solver.build_status(b2).expect("b2").state, BuildState::Succeeded);
}

#[test]
fn a_worker_that_leaves_hands_its_runs_back_at_once() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!((runs.len(), runs[0].0), (1, w1));
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    // No time passes: the lease has not run out; leaving is enough.
    assert_eq!(h.input(Input::Leave { worker: w1 }), Ok(Reply::Done));
    assert!(!h.solver.worker_alive(w1));
    let again = h.assigned();
    assert_eq!(again.len(), 1, "the run went back to the queue and out again");
    assert_eq!((again[0].0, again[0].2.as_str()), (w2, "a"));
    assert_eq!((h.solver.metrics().workers_lost, h.solver.metrics().workers_left), (0, 1));
    let listed = h.solver.workers().into_iter().find(|w| w.id == w1).expect("listed");
    assert!(listed.left && !listed.alive, "{listed:?}");
    h.report(w2, Report { finished: vec![ok(again[0].1, "a")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    // A worker that left must register again to report.
    assert_eq!(h.input(Input::Poll { worker: w1 }), Ok(Reply::Reregister));
    h.assert_replays();
}

/// A worker found unreachable (a refused connection) is lost at once, as
/// if it had left, and listed as lost; not when it registered again after
/// the connection was tried (it came back at the same address).
#[test]
fn an_unreachable_worker_is_lost_unless_it_registered_since() {
    let mut h = Harness::new();
    h.now += 10_000;
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let tried = h.now - 1;
    h.now += 1_000;
    assert_eq!(h.input(Input::Unreachable { worker: w1, since: tried }), Ok(Reply::Done));
    assert!(h.solver.worker_alive(w1), "it registered after the connection was tried");
    assert_eq!(h.input(Input::Unreachable { worker: w1, since: h.now }), Ok(Reply::Done));
    assert!(!h.solver.worker_alive(w1));
    let listed = h.solver.workers().into_iter().find(|w| w.id == w1).expect("listed");
    assert!(!listed.left && !listed.alive, "lost, not left: {listed:?}");
    assert_eq!(h.input(Input::Unreachable { worker: 99, since: h.now }), Err(SolverError::UnknownWorker(99)));
    h.assert_replays();
}

#[test]
fn workers_lost_long_ago_are_forgotten_and_new_ones_take_their_places() {
    let mut h = Harness::new();
    // A job runs on the first of a fleet of short-lived workers.
    let first = worker_id(h.input(register("short-0", 1, vec![])));
    let early = build_id(h.input(submit(vec![job("x", &[])])));
    h.later();
    let ran = h.assigned();
    assert_eq!(ran[0].0, first);
    h.report(first, Report { finished: vec![ok(ran[0].1, "x")], ..Report::default() });
    let stays = worker_id(h.input(register("stays", 1, vec![])));
    // The fleet, each worker under a new name: two more come and go than
    // the solver keeps listed once lost.
    let mut churned = Vec::new();
    let mut forgotten = Vec::new();
    for i in 0..KEEP_LOST_WORKERS + 2 {
        let w = if i == 0 { first } else { worker_id(h.input(register(&format!("short-{i}"), 1, vec![]))) };
        assert_eq!(h.input(Input::Leave { worker: w }), Ok(Reply::Done));
        churned.push(w);
        forgotten.extend(h.solver.take_effects().into_iter().filter_map(|e| match e {
            Effect::WorkerForgotten { worker } => Some(worker),
            _ => None,
        }));
        if i == KEEP_LOST_WORKERS / 2 {
            h.restore_from_snapshot();
        }
    }
    assert_eq!(forgotten, churned[..2], "the two lost longest ago are forgotten, in order");
    let listed: Vec<String> = h.solver.workers().into_iter().map(|w| w.name).collect();
    assert_eq!(listed.len(), KEEP_LOST_WORKERS + 1);
    assert!(!listed.iter().any(|n| n == "short-0" || n == "short-1"), "forgotten ones are not listed");
    assert!(listed.iter().any(|n| n == "short-2") && listed.iter().any(|n| n == "stays"));
    let m = h.solver.metrics();
    assert_eq!((m.workers_up, m.workers_lost, m.workers_left), (1, 0, KEEP_LOST_WORKERS as u64));
    assert_eq!(m.core_workers, 2, "each newcomer took the place of the one lost before it");
    // The early job still names its worker; its log is nowhere to be had.
    let status = h.solver.build_status(early).expect("early build");
    assert_eq!(status.jobs[0].worker.as_deref(), Some("short-0"));
    assert_eq!(h.solver.run_location(early, "x"), None);
    // A forgotten worker coming back is a new worker, with a new ID, and
    // builds on.
    assert_eq!(h.input(Input::Poll { worker: churned[0] }), Ok(Reply::Reregister));
    let back = worker_id(h.input(register("short-0", 1, vec![])));
    assert!(back > *churned.last().unwrap(), "IDs are not reused: {back}");
    // Back under its name, it is where the early job's log is.
    assert_eq!(h.solver.run_location(early, "x"), Some(("http://short-0".to_owned(), ran[0].1)));
    assert_eq!(h.input(Input::Leave { worker: stays }), Ok(Reply::Done));
    let b = build_id(h.input(submit(vec![job("a", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!((runs.len(), runs[0].0), (1, back));
    h.report(back, Report { finished: vec![ok(runs[0].1, "a")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    assert_eq!(h.solver.metrics().core_workers, 2);
    h.assert_replays();
}

#[test]
fn a_draining_worker_finishes_its_run_and_gets_nothing_new() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![job("a", &[]), job("b", &["a"]), job("c", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(runs.len(), 2, "a and c start on w1's two slots");
    assert_eq!(h.input(Input::Drain { worker: w1 }), Ok(Reply::Done));
    let m = h.solver.metrics();
    assert_eq!((m.workers_up, m.workers_draining), (1, 1));
    let a = runs.iter().find(|r| r.2 == "a").expect("a ran").1;
    h.report(w1, Report { finished: vec![ok(a, "a")], ..Report::default() });
    h.later();
    assert!(h.assigned().is_empty(), "b waits: its only worker drains");
    assert_eq!(h.states(b)[0], ("a".to_string(), JobState::Succeeded), "the running job finished there");
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    h.later();
    let next = h.assigned();
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!((next[0].0, next[0].2.as_str()), (w2, "b"));
    // Registering again ends the drain.
    let c = runs.iter().find(|r| r.2 == "c").expect("c ran").1;
    worker_id(h.input(register("w1", 2, vec![c])));
    assert!(h.solver.worker_alive(w1));
    h.assert_replays();
}

#[test]
fn a_worker_registering_while_jobs_wait_takes_one_without_losing_it() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let mut once = job("once", &[]);
    once.retries = 0;
    let b = build_id(h.input(submit(vec![job("first", &[]), once])));
    h.later();
    let first = h.assigned();
    assert_eq!((first.len(), first[0].0), (1, w1), "w1's only slot");
    // `once` waits; a worker registering now takes it in its registration.
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    let runs = h.assigned();
    assert_eq!(runs.len(), 1, "one assignment, not a lost one and a second: {runs:?}");
    assert_eq!((runs[0].0, runs[0].2.as_str()), (w2, "once"));
    h.report(w2, Report { finished: vec![ok(runs[0].1, "once")], ..Report::default() });
    let status = h.solver.build_status(b).expect("build");
    let once = status.jobs.iter().find(|j| j.name == "once").expect("once");
    assert_eq!((once.state, once.attempts), (JobState::Succeeded, 1), "no retry spent, and none was allowed");
    h.assert_replays();
}

/// A job with ID `[id; 32]`, own content `[own; 32]` (early cutoff) and
/// needs.
fn owned(name: &str, id: u8, own: u8, needs: &[&str]) -> JobDef {
    JobDef {
        own: Some(Hash32([own; 32])),
        needs: needs.iter().map(|n| n.to_string()).collect(),
        commands: vec![format!("make {name}")],
        ..JobDef::new(name, Hash32([id; 32]))
    }
}

/// Run `run` of job `[id; 32]` succeeded with output tree `[tree; 32]`.
fn made(run: u64, id: u8, tree: u8) -> RunResult {
    RunResult {
        output: Some(HeldArtifact { job: Hash32([id; 32]), tree: Hash32([tree; 32]), size: 1 }),
        ..ok(run, "x")
    }
}

/// The assignments handed out so far, without their workers.
fn assignments(h: &mut Harness) -> Vec<drover_proto::Assignment> {
    h.assignments().into_iter().map(|(_, a)| a).collect()
}

/// Early cutoff: a dependency that runs again (its ID changed) and writes
/// what it wrote before leaves its dependents cached, with the earlier
/// outputs: `app` and `test` after a `lib` whose command changed but whose
/// output did not. A job after them reads the earlier artifacts; a `lib`
/// whose output changed runs its dependents.
#[test]
fn a_dependency_that_writes_what_it_wrote_before_runs_none_of_its_dependents() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    // Build 1 runs lib → app → test.
    let jobs = vec![owned("lib", 1, 10, &[]), owned("app", 2, 20, &["lib"]), owned("test", 3, 30, &["app"])];
    let b1 = build_id(h.input(submit(jobs)));
    for (id, tree) in [(1, 7), (2, 8), (3, 9)] {
        h.later();
        let run = assignments(&mut h);
        assert_eq!(run.len(), 1, "one job at a time");
        h.report(w, Report { finished: vec![made(run[0].run, id, tree)], ..Report::default() });
    }
    assert_eq!(h.solver.build_status(b1).expect("build").state, BuildState::Succeeded);

    // Build 2: lib's command changed (new IDs all down the chain), and it
    // writes the same output: app and test are cached, with build 1's
    // artifacts; pkg, new, runs and reads test's output from build 1's.
    let jobs = vec![
        owned("lib", 11, 110, &[]),
        owned("app", 12, 20, &["lib"]),
        owned("test", 13, 30, &["app"]),
        owned("pkg", 14, 40, &["test"]),
    ];
    let b2 = build_id(h.input(submit(jobs)));
    h.later();
    let run = assignments(&mut h);
    assert_eq!(run.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["lib"]);
    h.report(w, Report { finished: vec![made(run[0].run, 11, 7)], ..Report::default() });
    h.later();
    let run = assignments(&mut h);
    assert_eq!(run.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["pkg"], "app and test did not run");
    let dep = &run[0].deps[0];
    assert_eq!(
        (dep.job, dep.artifact, dep.tree),
        (Hash32([13; 32]), Some(Hash32([3; 32])), Some(Hash32([9; 32])))
    );
    assert_eq!(h.solver.artifact_alias(Hash32([13; 32])), Some(Hash32([3; 32])));
    h.report(w, Report { finished: vec![made(run[0].run, 14, 5)], ..Report::default() });
    let status = h.solver.build_status(b2).expect("build");
    assert_eq!(status.state, BuildState::Succeeded);
    let app = status.jobs.iter().find(|j| j.name == "app").expect("app");
    assert_eq!(app.state, JobState::Cached);
    assert!(app.detail.contains("early cutoff"), "{}", app.detail);

    // Build 3: lib changes again, and so does its output: app runs.
    let jobs = vec![owned("lib", 21, 210, &[]), owned("app", 22, 20, &["lib"])];
    h.input(submit(jobs)).expect("submitted");
    h.later();
    let run = assignments(&mut h);
    h.report(w, Report { finished: vec![made(run[0].run, 21, 6)], ..Report::default() });
    h.later();
    let run = assignments(&mut h);
    assert_eq!(run.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["app"], "a new input runs it");
    assert_eq!(run[0].deps[0].artifact, None, "its own dependency's artifact");
    h.assert_replays();
}

/// Early cutoff files a run under the inputs it read: `app` read lib's
/// output 7, and while it ran a `--no-cache` build ran lib again, which
/// wrote 8. A later `app` whose lib wrote 8 did not read what that run
/// read: it runs.
#[test]
fn a_run_is_filed_under_the_outputs_it_read() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    h.input(submit(vec![owned("lib", 1, 10, &[]), owned("app", 2, 20, &["lib"])])).expect("submitted");
    h.later();
    let lib = assignments(&mut h);
    h.report(w, Report { finished: vec![made(lib[0].run, 1, 7)], ..Report::default() });
    h.later();
    let app = assignments(&mut h);
    assert_eq!(app[0].deps[0].tree, Some(Hash32([7; 32])));
    let again = Input::Submit(SubmitRequest {
        build: BuildSpec { name: "again".into(), sources: Vec::new(), jobs: vec![owned("lib", 1, 10, &[])] }
            .into(),
        tenant: "t".into(),
        no_cache: true,
        on_error: OnError::Quit,
        max_parallel: None,
        queue: None,
    });
    h.input(again).expect("submitted");
    h.later();
    let lib = assignments(&mut h);
    h.report(w, Report { finished: vec![made(lib[0].run, 1, 8)], ..Report::default() });
    h.report(w, Report { finished: vec![made(app[0].run, 2, 9)], ..Report::default() });
    let b3 = build_id(h.input(submit(vec![owned("lib", 21, 210, &[]), owned("app", 22, 20, &["lib"])])));
    h.later();
    let lib = assignments(&mut h);
    h.report(w, Report { finished: vec![made(lib[0].run, 21, 8)], ..Report::default() });
    h.later();
    let run = assignments(&mut h);
    assert_eq!(run.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["app"], "{:?}", h.states(b3));
    h.assert_replays();
}

/// The aliases of cut-off jobs stay bounded by what the kept builds use:
/// 300 builds whose root changes its ID but not its output cut off 19 jobs
/// each, and with two finished builds kept, the aliases stay under the
/// sweep's threshold instead of growing with the history.
#[test]
fn aliases_of_forgotten_builds_are_swept() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    h.input(Input::KeepFinished { builds: Some(2) }).expect("setting");
    let chain = |root: u16| -> Vec<JobDef> {
        (0..20u8)
            .map(|i| {
                // A new root gives every job a new ID; job i always writes
                // tree i (`id[31]`).
                let mut id = [0; 32];
                id[..2].copy_from_slice(&root.to_le_bytes());
                id[31] = i;
                let needs = if i == 0 { Vec::new() } else { vec![format!("j{}", i - 1)] };
                let commands = vec![format!("make {i}")];
                JobDef {
                    own: Some(Hash32([i + 1; 32])),
                    needs,
                    commands,
                    ..JobDef::new(format!("j{i}"), Hash32(id))
                }
            })
            .collect()
    };
    let assigned = |h: &mut Harness| -> Vec<(u64, Hash32)> {
        h.assignments().into_iter().map(|(_, a)| (a.run, a.job)).collect()
    };
    for root in 0..300u16 {
        h.input(submit(chain(root))).expect("submitted");
        loop {
            let mut runs = assigned(&mut h);
            if runs.is_empty() {
                h.later();
                h.input(Input::Poll { worker: w }).expect("w1 renews its lease");
                runs = assigned(&mut h);
            }
            if runs.is_empty() {
                break;
            }
            for (run, job) in runs {
                let done = RunResult {
                    output: Some(HeldArtifact { job, tree: Hash32([job.0[31]; 32]), size: 1 }),
                    ..ok(run, "x")
                };
                h.report(w, Report { finished: vec![done], ..Report::default() });
            }
        }
        // Past the time a finished build is kept at least, the worker
        // renewing its lease meanwhile.
        for _ in 0..8 {
            h.now += 9_000;
            h.input(Input::Poll { worker: w }).expect("w1 renews its lease");
        }
    }
    assert!(h.solver.aliases.len() > 19, "jobs were cut off: {}", h.solver.aliases.len());
    assert!(h.solver.aliases.len() <= crate::SWEEP_OUTPUTS_AT, "{} aliases", h.solver.aliases.len());
}

/// A job with `retry_on_failure` reruns after a failed run, shared by
/// every build that waits for it, saying why; it fails only once its
/// reruns are used up, and then as any failure does. The attempts count
/// on across the reruns, and a replay and a snapshot keep the count.
#[test]
fn a_flaky_job_runs_again_after_a_failure_until_its_reruns_are_used_up() {
    let flaky = |name: &str| JobDef { retry_on_failure: 2, ..job(name, &[]) };
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b1 = build_id(h.input(submit(vec![flaky("test"), job("after", &["test"])])));
    let b2 = build_id(h.input(submit(vec![flaky("test")])));
    h.later();
    let first = h.assignments();
    assert_eq!(first.len(), 1, "one run for both builds");
    assert_eq!(first[0].1.attempt, 1);
    h.report(w, Report { finished: vec![failed(first[0].1.run, 1)], ..Report::default() });
    h.restore_from_snapshot();
    h.later();
    let second = h.assignments();
    assert_eq!(second.len(), 1, "the rerun, once for both builds");
    assert_eq!((second[0].1.name.as_str(), second[0].1.attempt), ("test", 2));
    for b in [b1, b2] {
        let status = h.solver.build_status(b).expect("build");
        assert_eq!(status.state, BuildState::Running, "build {b} goes on");
        assert_eq!(status.jobs[0].state, JobState::Running);
        let events = h.solver.events(b, 0).expect("events").0;
        let requeued = events.iter().find_map(|e| match &e.kind {
            EventKind::JobRequeued { reason: Some(reason), .. } => Some(reason.clone()),
            _ => None,
        });
        assert_eq!(
            requeued.as_deref(),
            Some("run 1 failed (boom); running it again (1 of 2 reruns on failure)")
        );
    }
    // The second rerun succeeds: both builds go on as if it never failed.
    h.report(w, Report { finished: vec![failed(second[0].1.run, 1)], ..Report::default() });
    h.later();
    let third = h.assignments();
    assert_eq!(third[0].1.attempt, 3);
    h.report(w, Report { finished: vec![ok(third[0].1.run, "test")], ..Report::default() });
    assert!(h.solver.failed_runs.is_empty(), "the count goes with the job");
    h.later();
    let after = h.assigned();
    assert_eq!(names(&after), ["after"]);
    h.report(w, Report { finished: vec![ok(after[0].1, "after")], ..Report::default() });
    for b in [b1, b2] {
        assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    }
    h.assert_replays();

    // Three failures of two reruns: the job fails, its dependent is skipped.
    let b3 = build_id(
        h.input(submit(vec![JobDef { id: Hash32([9; 32]), ..flaky("test") }, job("after", &["test"])])),
    );
    let mut runs = 0;
    loop {
        h.later();
        let Some((_, a)) = h.assignments().pop() else { break };
        runs += 1;
        h.report(w, Report { finished: vec![failed(a.run, 4)], ..Report::default() });
    }
    assert_eq!(runs, 3, "the run and its two reruns");
    let status = h.solver.build_status(b3).expect("build");
    assert_eq!(status.state, BuildState::Failed);
    assert_eq!((status.jobs[0].state, status.jobs[0].exit_code), (JobState::Failed, Some(4)));
    assert_eq!(status.jobs[1].state, JobState::Skipped);
    assert!(h.solver.failed_runs.is_empty());
    h.assert_replays();
}

/// A failed run is not rerun for a build that stops (another job of it
/// failed first, under `--on-error quit`), nor when it failed for want of
/// its inputs (those are built again instead); a job without
/// `retry_on_failure` fails at once (see the test above it).
#[test]
fn a_flaky_job_does_not_run_again_in_a_stopping_build() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let b =
        build_id(h.input(submit(vec![JobDef { retry_on_failure: 3, ..job("flaky", &[]) }, job("bad", &[])])));
    h.later();
    let runs = h.assigned();
    let run = |name: &str| runs.iter().find(|r| r.2 == name).expect("assigned").1;
    h.report(w, Report { finished: vec![failed(run("bad"), 2)], ..Report::default() });
    h.report(w, Report { finished: vec![failed(run("flaky"), 1)], ..Report::default() });
    h.later();
    assert!(h.assigned().is_empty(), "nothing runs again in a stopping build");
    assert_eq!(h.states(b), [("flaky".to_string(), JobState::Failed), ("bad".to_string(), JobState::Failed)]);
    assert!(h.solver.failed_runs.is_empty());
}

/// A run that failed for want of its inputs is no failure of the job's
/// own: its reruns on failure are not spent on it, and it goes back as
/// many times as any job does before failing.
#[test]
fn lost_inputs_do_not_spend_a_flaky_jobs_reruns() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b =
        build_id(h.input(submit(vec![job("a", &[]), JobDef { retry_on_failure: 5, ..job("b", &["a"]) }])));
    h.later();
    let mut rounds = 0;
    while let Some((_, run, name)) = h.assigned().first().cloned() {
        if name == "b" {
            rounds += 1;
            h.report(w, Report { finished: vec![lost_input(run, "a")], ..Report::default() });
        } else {
            h.report(w, Report { finished: vec![ok(run, &name)], ..Report::default() });
        }
        h.later();
    }
    assert_eq!(rounds, 4, "as a job without reruns");
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
    assert!(h.solver.failed_runs.is_empty());
}

#[test]
fn a_failed_run_is_summed_up_by_how_it_ended_and_its_last_line() {
    let result = |exit_code: Option<i32>, detail: &str| drover_core::JobResult {
        success: false,
        exit_code,
        cached: false,
        detail: detail.into(),
    };
    let cases = [
        (
            Some(5),
            "exit code 5; stderr:\nwarming up\nAssertionError: 3 != 4\n\n",
            "exit code 5: AssertionError: 3 != 4",
        ),
        (None, "timed out after 1s; stdout:\nstill going", "timed out after 1s: still going"),
        (Some(2), "", "exit code 2"),
        (None, "", "no exit code"),
    ];
    for (code, detail, expected) in cases {
        assert_eq!(super::failure_summary(&result(code, detail)), expected);
    }
    let long =
        super::failure_summary(&result(Some(1), &format!("exit code 1; stderr:\n{}", "é".repeat(200))));
    assert!(long.ends_with('…') && long.len() < 200, "{long}");
}

/// Builds that disagree on rerunning a shared flaky job (one is stopping)
/// share one count of its failed runs: the continuing build gets exactly
/// the reruns the job allows, attempts numbered on.
#[test]
fn a_flaky_job_shared_with_a_stopping_build_runs_again_only_as_often_as_allowed() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 3, vec![])));
    let flaky = JobDef { retry_on_failure: 1, ..job("flaky", &[]) };
    let stopping = build_id(h.input(submit(vec![flaky.clone(), job("bad", &[])])));
    let going = build_id(h.input(submit(vec![flaky])));
    h.later();
    let runs = h.assignments();
    let run = |name: &str| runs.iter().find(|(_, a)| a.name == name).expect("assigned").1.run;
    h.report(w, Report { finished: vec![failed(run("bad"), 2)], ..Report::default() });
    let mut attempts = vec![1];
    h.report(w, Report { finished: vec![failed(run("flaky"), 1)], ..Report::default() });
    loop {
        h.later();
        let Some((_, a)) = h.assignments().pop() else { break };
        attempts.push(a.attempt);
        h.report(w, Report { finished: vec![failed(a.run, 1)], ..Report::default() });
    }
    assert_eq!(attempts, [1, 2], "one rerun, for the build that goes on");
    for b in [stopping, going] {
        assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Failed);
    }
    assert!(h.solver.failed_runs.is_empty());
}

/// A run handed back by its worker (its disk failed it) uses an attempt;
/// a failure after it and the rerun count on from there, and each
/// attempt's log is found by its number.
#[test]
fn attempts_count_on_across_a_lost_run_and_a_rerun() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 1, vec![])));
    let b = build_id(h.input(submit(vec![JobDef { retry_on_failure: 1, retries: 2, ..job("flaky", &[]) }])));
    let mut attempts = Vec::new();
    for end in 0..3 {
        h.later();
        let (_, a) = h.assignments().pop().expect("assigned");
        attempts.push(a.attempt);
        let mut result = if end == 2 { ok(a.run, "flaky") } else { failed(a.run, 1) };
        result.worker_fault = end == 0;
        h.report(w, Report { finished: vec![result], ..Report::default() });
    }
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    for attempt in 1..=3 {
        let (_, run) = h.solver.attempt_location(b, "flaky", attempt).expect("kept").expect("its worker");
        assert_eq!(run, attempt as u64, "attempt {attempt} is run {attempt}");
    }
    assert_eq!(h.solver.attempt_location(b, "flaky", 4), Err(vec![1, 2, 3]));
    h.assert_replays();
}

/// A run that several builds share is suspended for all of them: each
/// sees it held, any of them may resume it, and it stays resumable once
/// the build that suspended it is cancelled (it used to stay stopped,
/// its timeout clock paused, with no build able to resume it).
#[test]
fn a_shared_run_suspended_by_one_build_is_held_and_resumable_for_all() {
    let mut h = Harness::new();
    let w = worker_id(h.input(register("w1", 2, vec![])));
    let a = build_id(h.input(submit(vec![job("ticker", &[])])));
    let b = build_id(h.input(submit(vec![job("ticker", &[])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["ticker"], "one run for both builds");
    let run = runs[0].1;
    let detail =
        |h: &Harness, build: u64| h.solver.build_status(build).expect("build").jobs[0].detail.clone();
    let suspends = |h: &mut Harness| -> Vec<(u64, bool)> {
        h.solver
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Suspend { worker, run, resume } => Some((worker * 1000 + run, resume)),
                _ => None,
            })
            .collect()
    };

    h.input(Input::Suspend { build: a, job: Some("ticker".into()), resume: false }).expect("suspend");
    assert_eq!(suspends(&mut h), [(w * 1000 + run, false)]);
    assert_eq!(detail(&h, b), "suspended", "the other build sees its run held");
    // A third build joining the held run sees it held too.
    let c = build_id(h.input(submit(vec![job("ticker", &[])])));
    assert_eq!(detail(&h, c), "suspended");
    h.input(Input::Suspend { build: b, job: Some("ticker".into()), resume: true }).expect("resume from b");
    assert_eq!(suspends(&mut h), [(w * 1000 + run, true)]);
    for build in [a, b, c] {
        assert_eq!(detail(&h, build), "", "build {build}: resumed for all");
    }

    h.input(Input::Suspend { build: a, job: None, resume: false }).expect("suspend again");
    assert_eq!(suspends(&mut h), [(w * 1000 + run, false)]);
    h.input(Input::Cancel { build: a }).expect("cancel");
    assert!(suspends(&mut h).is_empty(), "the run goes on (held) for the other builds");
    h.input(Input::Suspend { build: c, job: None, resume: true }).expect("resume from c");
    assert_eq!(suspends(&mut h), [(w * 1000 + run, true)]);
    let (events, _) = h.solver.events(b, 0).expect("events");
    let held = events.iter().filter(|e| matches!(e.kind, EventKind::JobSuspended { .. })).count();
    let resumed = events.iter().filter(|e| matches!(e.kind, EventKind::JobResumed { .. })).count();
    assert_eq!((held, resumed), (2, 2), "{events:?}");

    h.report(w, Report { finished: vec![ok(run, "ticker")], ..Report::default() });
    for build in [b, c] {
        assert_eq!(h.solver.build_status(build).expect("build").state, BuildState::Succeeded);
    }
    h.assert_replays();
    h.restore_from_snapshot();
}

/// A run that reports one input lost sends back every need of its job
/// whose output is gone: both of a lost worker's outputs are built again
/// in one round, not one round (and one of the job's bounded rewinds) per
/// input as each later run finds the next one missing.
#[test]
fn a_lost_input_sends_back_every_need_whose_output_is_gone() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![job("a1", &[]), job("a2", &[]), job("b", &["a1", "a2"])])));
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["a1", "a2"]);
    h.report(w1, Report { finished: vec![ok(runs[0].1, "a1"), ok(runs[1].1, "a2")], ..Report::default() });
    h.later();
    assert_eq!(names(&h.assigned()), ["b"]);
    let w2 = worker_id(h.input(register("w2", 2, vec![])));
    for _ in 0..12 {
        h.now += 5_000;
        h.input(Input::Poll { worker: w2 }).expect("w2 renews its lease");
    }
    assert!(!h.solver.worker_alive(w1), "w1 lost");
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["b"]);
    // The run found a1 missing first.
    h.report(w2, Report { finished: vec![lost_input(runs[0].1, "a1")], ..Report::default() });
    let mut runs = h.assigned();
    runs.sort_by(|x, y| x.2.cmp(&y.2));
    assert_eq!(names(&runs), ["a1", "a2"], "both go back at once");
    h.report(w2, Report { finished: vec![ok(runs[0].1, "a1"), ok(runs[1].1, "a2")], ..Report::default() });
    h.later();
    let runs = h.assigned();
    assert_eq!(names(&runs), ["b"]);
    h.report(w2, Report { finished: vec![ok(runs[0].1, "b")], ..Report::default() });
    assert_eq!(h.solver.build_status(b).expect("build").state, BuildState::Succeeded);
    assert_no_failure(&h, b);
    h.assert_replays();
}

/// A queued job two tenants share belongs to the one that scheduled it;
/// once that build is cancelled, it moves to the other build's queue
/// instead of waiting under the cancelled tenant's capability (which
/// another build of that tenant keeps full).
#[test]
fn a_shared_job_leaves_the_queue_of_a_cancelled_build() {
    use drover_core::{QueueConfig, QueueLimits};
    let queue = |name: &str, cap: Option<u32>| QueueConfig {
        name: name.into(),
        weight: 1,
        capability: QueueLimits { slots: cap, ..QueueLimits::default() },
        ..QueueConfig::default()
    };
    let config = Config {
        queues: vec![queue("capped", Some(1)), queue("open", None)],
        tenant_queues: [("ml".to_owned(), "capped".to_owned()), ("web".to_owned(), "open".to_owned())].into(),
        ..Config::default()
    };
    let mut h = Harness { solver: Solver::new(config), log: Vec::new(), now: 1_000 };
    let submit_as = |tenant: &str, jobs: Vec<JobDef>| {
        let Input::Submit(mut req) = submit(jobs) else { unreachable!() };
        req.tenant = tenant.into();
        Input::Submit(req)
    };
    worker_id(h.input(register("w1", 4, vec![])));
    // ml's first build fills its queue's one slot; its second queues
    // `shared`, which web's build then joins.
    build_id(h.input(submit_as("ml", vec![job("long", &[])])));
    h.later();
    assert_eq!(names(&h.assigned()), ["long"]);
    let first = build_id(h.input(submit_as("ml", vec![job("shared", &[])])));
    let web = build_id(h.input(submit_as("web", vec![job("shared", &[])])));
    h.later();
    assert!(h.assigned().is_empty(), "shared waits under ml's capability");
    h.input(Input::Cancel { build: first }).expect("cancel");
    h.later();
    assert_eq!(names(&h.assigned()), ["shared"], "web's queue runs it at once");
    assert_eq!(h.states(web), [("shared".to_string(), JobState::Running)]);
    // Each build's status names the queue its jobs go to: its tenant's, or
    // the one it names.
    assert_eq!(h.solver.build_status(web).expect("web's build").queue, "open");
    let Input::Submit(mut named) = submit_as("web", vec![job("other", &[])]) else { unreachable!() };
    named.queue = Some("capped".into());
    let named = build_id(h.input(Input::Submit(named)));
    assert_eq!(h.solver.build_status(named).expect("the named one").queue, "capped");
}

/// A running gang that restarts on failure whose member loses its run
/// with its worker restarts whole: the members still running are stopped
/// and the gang starts together again, instead of the lost member running
/// alone after the others (which needed it beside them) ended. The
/// progress says why.
#[test]
fn a_gang_whose_member_lost_its_worker_restarts_whole() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 1, vec![])));
    let w2 = worker_id(h.input(register("w2", 1, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("m1", &[]), "pair", 2, true),
        in_gang(job("m2", &[]), "pair", 2, true),
    ])));
    h.later();
    let pair = h.assigned();
    assert_eq!(pair.len(), 2, "the gang starts together");
    let on_w1 = pair.iter().find(|a| a.0 == w1).expect("a member on w1").clone();
    h.report(w1, Report { started: vec![on_w1.1], ..Report::default() });
    // w2 is lost; w1 keeps its lease.
    for _ in 0..12 {
        h.now += 5_000;
        h.input(Input::Poll { worker: w1 }).expect("w1 renews its lease");
    }
    assert!(!h.solver.worker_alive(w2));
    let effects = h.solver.take_effects();
    assert!(
        effects.iter().any(|e| matches!(e, Effect::Stop { worker, run } if *worker == w1 && *run == on_w1.1)),
        "the member still running is stopped: {effects:?}"
    );
    let events = h.solver.events(b, 0).expect("events").0;
    assert!(
        events.iter().any(|e| matches!(&e.kind, EventKind::JobRequeued { reason: Some(r), .. }
            if r.starts_with("gang pair restarts whole (1 of 3 restarts): its member"))),
        "{events:?}"
    );
    // The stopped run ends; a new worker comes, and the gang starts again.
    h.report(w1, Report { finished: vec![failed(on_w1.1, 143)], ..Report::default() });
    worker_id(h.input(register("w3", 1, vec![])));
    h.later();
    let mut again = h.assigned();
    again.sort_by(|x, y| x.2.cmp(&y.2));
    assert_eq!(names(&again), ["m1", "m2"], "whole, together");
    for (worker, run, name) in again {
        h.report(worker, Report { finished: vec![ok(run, &name)], ..Report::default() });
    }
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Succeeded);
    // The new instance's runs count on from the first's, whose logs stay
    // readable by attempt.
    assert!(status.jobs.iter().all(|j| j.attempts == 2), "{status:?}");
    assert_eq!(h.solver.attempt_location(b, &on_w1.2, 1), Ok(Some(("http://w1".to_owned(), on_w1.1))));
}

/// A gang that restarts on failure but can never start (its members ask
/// together for more than their queue's capability) fails once, without
/// spending its restarts on a failure that would come again.
#[test]
fn a_gang_that_can_never_start_fails_without_restarting() {
    use drover_core::{QueueConfig, QueueLimits};
    let capped = QueueConfig {
        name: "capped".into(),
        weight: 1,
        capability: QueueLimits { slots: Some(1), ..QueueLimits::default() },
        ..QueueConfig::default()
    };
    let config = Config {
        queues: vec![capped],
        tenant_queues: [("t".to_owned(), "capped".to_owned())].into(),
        ..Config::default()
    };
    let mut h = Harness { solver: Solver::new(config), log: Vec::new(), now: 1_000 };
    worker_id(h.input(register("w1", 4, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("m1", &[]), "pair", 2, true),
        in_gang(job("m2", &[]), "pair", 2, true),
    ])));
    h.later();
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Failed, "{status:?}");
    assert!(
        status
            .jobs
            .iter()
            .any(|j| j.detail.contains("its gang") && j.detail.contains("allows at most 1 slot at once")),
        "{status:?}"
    );
    let events = h.solver.events(b, 0).expect("events").0;
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::JobRequeued { .. })), "{events:?}");
}

/// A gang whose one worker held all of it is lost whole: the core puts
/// it back together (on another worker at once, when there is room), and
/// the gang does not restart on top of that; the build completes, and the
/// members' attempts count on.
#[test]
fn a_gang_lost_whole_with_its_worker_starts_again_without_a_restart() {
    let mut h = Harness::new();
    let w1 = worker_id(h.input(register("w1", 2, vec![])));
    let b = build_id(h.input(submit(vec![
        in_gang(job("m1", &[]), "pair", 2, true),
        in_gang(job("m2", &[]), "pair", 2, true),
    ])));
    h.later();
    let pair = h.assigned();
    assert!(pair.len() == 2 && pair.iter().all(|a| a.0 == w1), "{pair:?}");
    h.report(w1, Report { started: pair.iter().map(|a| a.1).collect(), ..Report::default() });
    let w2 = worker_id(h.input(register("w2", 2, vec![])));
    for _ in 0..12 {
        h.now += 5_000;
        h.input(Input::Poll { worker: w2 }).expect("w2 renews its lease");
    }
    assert!(!h.solver.worker_alive(w1));
    let events = h.solver.events(b, 0).expect("events").0;
    assert!(
        !events.iter().any(
            |e| matches!(&e.kind, EventKind::JobRequeued { reason: Some(r), .. } if r.starts_with("gang"))
        ),
        "no restart: {events:?}"
    );
    h.later();
    let again = h.assignments();
    let mut again: Vec<(u64, u64, String)> = again.into_iter().map(|(w, a)| (w, a.run, a.name)).collect();
    // Assigned in the step that found w1 lost, or just after.
    if again.is_empty() {
        again = h.assigned();
    }
    assert_eq!(again.len(), 2, "{again:?}");
    for (worker, run, name) in again {
        assert_eq!(worker, w2);
        h.report(worker, Report { finished: vec![ok(run, &name)], ..Report::default() });
    }
    let status = h.solver.build_status(b).expect("build");
    assert_eq!(status.state, BuildState::Succeeded, "{status:?}");
    assert!(status.jobs.iter().all(|j| j.attempts == 2), "{status:?}");
}
