//! How much memory the solver holds per finished build, with and without a
//! bound on the history it keeps (`Input::KeepFinished`).
//!
//! Runs `BUILDS` builds of 500 jobs one after the other (each with a spec
//! of its own, 50 wide, every job after the one 50 before it) on one worker
//! of 4 slots, every run reported finished with the timings of its stages,
//! then lets over a minute pass and prints the builds held and the growth
//! of the process's resident memory. With `CACHED`, the worker's cache holds
//! the outputs of the latest `CACHED` builds only: it reports the older
//! ones evicted, as a cache of bounded size does.
//!
//! `cargo run --release -p drover-solver --example history_memory -- BUILDS [KEEP [CACHED]]`

use std::collections::BTreeMap;
use std::sync::Arc;

use drover_core::{Config, Millis};
use drover_proto::{
    BuildSpec, Hash32, HeldArtifact, JobDef, OnError, RegisterRequest, Report, RunResult, SubmitRequest,
    WorkerCapacity,
};
use drover_solver::{Effect, Input, Reply, Solver};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The process's resident memory, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()).unwrap_or(0) * 4096
}

/// Build `b`'s spec.
fn spec(b: usize) -> Arc<BuildSpec> {
    let jobs = (0..500)
        .map(|i| JobDef {
            commands: vec![format!("echo {i} > {{{{out}}}}/x")],
            needs: if i >= 50 { vec![format!("n{}", i - 50)] } else { Vec::new() },
            ..JobDef::new(format!("n{i}"), Hash32(*blake3::hash(format!("{b}/{i}").as_bytes()).as_bytes()))
        })
        .collect();
    Arc::new(BuildSpec { name: format!("b{b}"), sources: Vec::new(), jobs })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let builds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(600);
    let keep: Option<u64> = args.next().and_then(|a| a.parse().ok());
    let cached: Option<usize> = args.next().and_then(|a| a.parse().ok());
    // The outputs in the worker's cache, by build, oldest first.
    let mut cache: std::collections::VecDeque<Vec<Hash32>> = std::collections::VecDeque::new();
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
    let _ = solver.handle(Millis(now), Input::KeepFinished { builds: keep });
    let before = resident();
    for b in 0..builds {
        let req = SubmitRequest {
            build: spec(b),
            tenant: "t".into(),
            no_cache: false,
            on_error: OnError::Quit,
            max_parallel: None,
            queue: None,
        };
        let Ok(Reply::Submitted(id)) = solver.handle(Millis(now), Input::Submit(req)) else {
            panic!("build {b} is accepted");
        };
        cache.push_back(Vec::new());
        if let Some(cached) = cached
            && cache.len() > cached
        {
            let evicted = cache.pop_front().unwrap_or_default();
            let report = Report { evicted, ..Report::default() };
            let _ = solver.handle(Millis(now), Input::Report { worker, report });
        }
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
                now += 1_000;
                let _ = solver.handle(Millis(now), Input::Poll { worker });
                let _ = solver.handle(Millis(now), Input::Tick);
                continue;
            }
            for (run, job) in runs {
                now += 1;
                if let Some(outputs) = cache.back_mut() {
                    outputs.push(job);
                }
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
    // Past the minute a finished build is kept whatever the setting.
    for _ in 0..61 {
        now += 1_000;
        let _ = solver.handle(Millis(now), Input::Poll { worker });
    }
    let _ = solver.handle(Millis(now), Input::KeepFinished { builds: keep });
    let grown = resident().saturating_sub(before);
    println!(
        "{builds} builds of 500 jobs, keeping {}, outputs cached of {} builds: {} held, resident memory grew {} MB ({} KB per build)",
        keep.map_or("all".to_owned(), |k| k.to_string()),
        cached.map_or("all".to_owned(), |k| k.to_string()),
        solver.build_ids().len(),
        grown >> 20,
        grown / 1024 / builds.max(1) as u64
    );
}
