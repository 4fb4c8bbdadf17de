//! Benchmarks of the solver alone: what builds that share their jobs cost it
//! beyond the jobs themselves (issue 4's twenty builds of one graph, without
//! processes, sockets or the log).
//!
//! One round: a fresh solver, 2 workers of 2 slots, and `B` builds of the
//! same 500-job graph (50 wide, 10 deep; each job after one or two of the
//! layer before, as in `drover bench share`) submitted with one spec, as
//! the coordinator hands identical specs over. Then, until every build is
//! over, the oldest run in flight ends: its worker reports it started and
//! succeeded, and the new events of every build are taken, as the
//! coordinator's followers take them. `share/1` and `share/20` time whole
//! rounds; the difference over 19 × 500 is what one more build costs per
//! job it shares (its queued, started and finished events, its waiter in
//! the core, its dependents scheduled).
//!
//! Run with `cargo bench -p drover-solver`; `cargo test --benches` runs
//! each once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use drover_core::{Config, Millis};
use drover_proto::{
    BuildSpec, Hash32, HeldArtifact, JobDef, OnError, RegisterRequest, Report, RunResult, SubmitRequest,
    WorkerCapacity,
};
use drover_solver::{Effect, Input, Reply, Solver};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const JOBS: usize = 500;
const WIDTH: usize = 50;

/// The benchmark's graph.
fn spec() -> Arc<BuildSpec> {
    let jobs = (0..JOBS)
        .map(|i| {
            let mut needs = Vec::new();
            if i >= WIDTH {
                needs.push(format!("n{}", i - WIDTH));
                if i % WIDTH != WIDTH - 1 {
                    needs.push(format!("n{}", i - WIDTH + 1));
                }
            }
            JobDef {
                commands: vec![format!("echo {i} >> count")],
                env: [("DROVER_BENCH_JOB".to_owned(), format!("n{i}"))].into(),
                needs,
                cpu_millis: 1000,
                retries: 1,
                ..JobDef::new(format!("n{i}"), Hash32(*blake3::hash(format!("n{i}").as_bytes()).as_bytes()))
            }
        })
        .collect();
    Arc::new(BuildSpec { name: "share".into(), sources: Vec::new(), jobs })
}

/// One round with `builds` builds of `spec`; returns the events taken.
fn round(spec: &Arc<BuildSpec>, builds: usize) -> usize {
    let mut solver = Solver::new(Config::default());
    let mut now = 1_000;
    let mut workers = Vec::new();
    for w in 0..2 {
        let register = RegisterRequest {
            name: format!("w{w}"),
            url: format!("http://w{w}.invalid"),
            capacity: WorkerCapacity { slots: 2, cpu_millis: 4000, memory: 1 << 30, tokens: BTreeMap::new() },
            labels: BTreeMap::new(),
            artifacts: Vec::new(),
            running: Vec::new(),
        };
        if let Ok(Reply::Registered(r)) = solver.handle(Millis(now), Input::Register(register)) {
            workers.push(r.worker);
        }
    }
    assert_eq!(workers.len(), 2, "workers registered");
    let mut ids = Vec::new();
    for _ in 0..builds {
        let req = SubmitRequest {
            build: spec.clone(),
            tenant: "bench".into(),
            no_cache: false,
            on_error: OnError::Quit,
            max_parallel: None,
            queue: None,
        };
        if let Ok(Reply::Submitted(id)) = solver.handle(Millis(now), Input::Submit(req)) {
            ids.push(id);
        }
    }
    let mut seen: BTreeMap<u64, u64> = ids.iter().map(|&id| (id, 0)).collect();
    let mut running = VecDeque::new();
    let (mut events, mut ended) = (0, 0);
    loop {
        for effect in solver.take_effects() {
            if let Effect::Assign { worker, assignment } = effect {
                running.push_back((worker, assignment.run, assignment.job));
            }
        }
        for (&id, from) in &mut seen {
            if let Some((new, _)) = solver.events(id, *from) {
                *from += new.len() as u64;
                events += new.len();
            }
        }
        let Some((worker, run, job)) = running.pop_front() else {
            // Nothing in flight: the jobs wait out a locality timer.
            match solver.poll_timeout() {
                Some(at) if ended < JOBS => {
                    now = now.max(at.0);
                    let _ = solver.handle(Millis(now), Input::Tick);
                    continue;
                }
                _ => break,
            }
        };
        now += 1;
        let result = RunResult {
            run,
            success: true,
            exit_code: Some(0),
            cached: false,
            detail: String::new(),
            output: Some(HeldArtifact { job, tree: Hash32([7; 32]), size: 0 }),
            duration_ms: 1,
            stages: BTreeMap::new(),
            lost_inputs: Vec::new(),
            worker_fault: false,
        };
        let report = Report { started: vec![run], finished: vec![result], ..Report::default() };
        let _ = solver.handle(Millis(now), Input::Report { worker, report });
        ended += 1;
    }
    assert_eq!(ended, JOBS, "every job ran once");
    for id in ids {
        let state = solver.build_status(id).map(|s| s.state);
        assert_eq!(state, Some(drover_proto::BuildState::Succeeded), "build {id}");
    }
    events
}

fn share(c: &mut Criterion) {
    let spec = spec();
    let mut group = c.benchmark_group("share");
    group.sample_size(20);
    for builds in [1, 20] {
        group.bench_function(builds.to_string(), |b| b.iter(|| round(&spec, builds)));
    }
    group.finish();
}

criterion_group!(benches, share);
criterion_main!(benches);
