//! What the solver's examples share: a one-worker cluster, builds of a
//! fixed shape, and a drive loop that runs a build to its end with every
//! run reported succeeded, as a worker would report it.

use std::collections::BTreeMap;
use std::sync::Arc;

use drover_core::Millis;
use drover_proto::{
    BuildSpec, Hash32, HeldArtifact, JobDef, OnError, RegisterRequest, Report, RunResult, SubmitRequest,
    WorkerCapacity,
};
use drover_solver::{Effect, Input, Reply, Solver};

/// Registers one worker of 4 slots; returns its ID.
pub(crate) fn register(solver: &mut Solver, now: u64) -> u64 {
    let register = RegisterRequest {
        name: "w".into(),
        url: "http://w.invalid".into(),
        capacity: WorkerCapacity { slots: 4, cpu_millis: 64_000, memory: 1 << 34, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running: Vec::new(),
    };
    match solver.handle(Millis(now), Input::Register(register)) {
        Ok(Reply::Registered(registered)) => registered.worker,
        other => panic!("the worker registers: {other:?}"),
    }
}

/// A build named `tag` of `jobs` jobs, 50 wide, every job after the one 50
/// before it; job `i` runs `command(i)`.
pub(crate) fn spec(tag: &str, jobs: usize, command: impl Fn(usize) -> String) -> Arc<BuildSpec> {
    let jobs = (0..jobs)
        .map(|i| JobDef {
            commands: vec![command(i)],
            needs: if i >= 50 { vec![format!("n{}", i - 50)] } else { Vec::new() },
            ..JobDef::new(format!("n{i}"), Hash32(*blake3::hash(format!("{tag}/{i}").as_bytes()).as_bytes()))
        })
        .collect();
    Arc::new(BuildSpec { name: tag.to_owned(), sources: Vec::new(), jobs })
}

/// Submits `build`; returns its ID.
pub(crate) fn submit(solver: &mut Solver, now: u64, build: Arc<BuildSpec>) -> u64 {
    let req = SubmitRequest {
        build,
        tenant: "t".into(),
        no_cache: false,
        on_error: OnError::Quit,
        max_parallel: None,
        queue: None,
    };
    match solver.handle(Millis(now), Input::Submit(req)) {
        Ok(Reply::Submitted(id)) => id,
        other => panic!("the build is accepted: {other:?}"),
    }
}

/// Runs build `id` to its end on `worker`: every run assigned is reported
/// succeeded (with its output and stage timings) a millisecond later, and
/// `ran` hears of each job run; when nothing is assigned, a second passes.
pub(crate) fn run_to_end(
    solver: &mut Solver,
    now: &mut u64,
    worker: u64,
    id: u64,
    mut ran: impl FnMut(Hash32),
) {
    while solver.build_status(id).is_some_and(|s| !s.state.is_final()) {
        let runs: Vec<(u64, Hash32)> = solver
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Assign { assignment, .. } => Some((assignment.run, assignment.job)),
                _ => None,
            })
            .collect();
        if runs.is_empty() {
            // The next jobs wait out a locality timer.
            *now += 1_000;
            let _ = solver.handle(Millis(*now), Input::Poll { worker });
            let _ = solver.handle(Millis(*now), Input::Tick);
            continue;
        }
        for (run, job) in runs {
            *now += 1;
            ran(job);
            let result = RunResult {
                run,
                success: true,
                exit_code: Some(0),
                cached: false,
                detail: String::new(),
                output: Some(HeldArtifact { job, tree: Hash32([7; 32]), size: 1 }),
                duration_ms: 1,
                stages: BTreeMap::from([("fetch".to_owned(), 1), ("build".to_owned(), 3)]),
                lost_inputs: Vec::new(),
                worker_fault: false,
            };
            let report = Report { started: vec![run], finished: vec![result], ..Report::default() };
            let _ = solver.handle(Millis(*now), Input::Report { worker, report });
        }
    }
}
