//! What a snapshot of the coordinator's state costs: a solver that has run
//! `FINISHED` builds of 500 jobs (every run reported, stage timings and
//! all) and holds `QUEUED` more jobs queued, in builds of 500, on one worker of
//! 4 slots; prints the snapshot's size and the time to write it (CBOR, as
//! the coordinator does) and to read it back, and checks the copy equal.
//!
//! `cargo run --release -p drover-solver --example snapshot_size -- FINISHED QUEUED`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use drover_core::{Config, Millis};
use drover_proto::{
    BuildSpec, Hash32, HeldArtifact, JobDef, OnError, RegisterRequest, Report, RunResult, SubmitRequest,
    WorkerCapacity,
};
use drover_solver::{Effect, Input, Reply, Solver};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A build of `jobs` jobs named by `tag`, 50 wide, every job after the one
/// 50 before it.
fn spec(tag: &str, jobs: usize) -> Arc<BuildSpec> {
    let jobs = (0..jobs)
        .map(|i| JobDef {
            commands: vec![format!("cc -c src/{i}.c -o {{{{out}}}}/{i}.o")],
            needs: if i >= 50 { vec![format!("n{}", i - 50)] } else { Vec::new() },
            ..JobDef::new(format!("n{i}"), Hash32(*blake3::hash(format!("{tag}/{i}").as_bytes()).as_bytes()))
        })
        .collect();
    Arc::new(BuildSpec { name: tag.to_owned(), sources: Vec::new(), jobs })
}

fn submit(solver: &mut Solver, now: u64, build: Arc<BuildSpec>) -> u64 {
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

fn main() {
    let mut args = std::env::args().skip(1);
    let finished: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let queued: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let mut solver = Solver::new(Config::default());
    let mut now = 1_000;
    let register = RegisterRequest {
        name: "w".into(),
        url: "http://w.invalid".into(),
        capacity: WorkerCapacity { slots: 4, cpu_millis: 64_000, memory: 1 << 34, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
        running: Vec::new(),
    };
    let Ok(Reply::Registered(registered)) = solver.handle(Millis(now), Input::Register(register)) else {
        panic!("the worker registers");
    };
    let worker = registered.worker;
    for b in 0..finished {
        let id = submit(&mut solver, now, spec(&format!("done{b}"), 500));
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
                now += 1_000;
                let _ = solver.handle(Millis(now), Input::Poll { worker });
                let _ = solver.handle(Millis(now), Input::Tick);
                continue;
            }
            for (run, job) in runs {
                now += 1;
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
                };
                let report = Report { started: vec![run], finished: vec![result], ..Report::default() };
                let _ = solver.handle(Millis(now), Input::Report { worker, report });
            }
        }
    }
    for b in 0..queued.div_ceil(500) {
        submit(&mut solver, now, spec(&format!("queued{b}"), 500.min(queued - b * 500)));
    }
    solver.take_effects();
    let started = Instant::now();
    let copy = solver.clone();
    let cloned = started.elapsed();
    drop(copy);
    let started = Instant::now();
    let mut bytes = Vec::new();
    ciborium::into_writer(&solver, &mut bytes).expect("encode");
    let wrote = started.elapsed();
    let started = Instant::now();
    let read: Solver = ciborium::from_reader(&bytes[..]).expect("decode");
    let took = started.elapsed();
    assert!(read == solver, "the copy read back differs");
    println!(
        "{finished} finished builds of 500 jobs, {queued} jobs queued: cloned in {} ms, snapshot {:.1} MB, written in {} ms, read in {} ms",
        cloned.as_millis(),
        bytes.len() as f64 / 1e6,
        wrote.as_millis(),
        took.as_millis()
    );
}
