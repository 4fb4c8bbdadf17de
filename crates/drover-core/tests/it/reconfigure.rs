//! New settings on a live core: those that only time or weigh decisions
//! take effect at once; new queues wait until the core holds nothing, then
//! it starts afresh with its counters kept.

use std::collections::BTreeMap;

use drover_core::{
    Capacity, Config, Decision, Event, JobId, JobResult, JobSpec, Millis, QueueConfig, Rejected, RunId,
    Scheduler, WaiterId, WorkerId,
};

fn worker(id: u64, artifacts: &[&str]) -> Event {
    Event::WorkerJoined {
        worker: WorkerId(id),
        name: format!("w{id}"),
        capacity: Capacity { slots: 1, cpu: 4000, memory: 8 << 30, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: artifacts.iter().map(|a| JobId::named(a)).collect(),
    }
}

fn job(name: &str, deps: &[&str]) -> Event {
    let mut spec = JobSpec::new(JobId::named(name), "t");
    spec.deps = deps.iter().map(|d| JobId::named(d)).collect();
    Event::Schedule { spec, waiter: WaiterId(1) }
}

/// The run of each assignment decided, by job.
fn assigned(s: &mut Scheduler) -> Vec<(JobId, WorkerId, u64)> {
    s.take_decisions()
        .into_iter()
        .filter_map(|d| match d {
            Decision::Assign { job, worker, run, .. } => Some((job, worker, run.0)),
            _ => None,
        })
        .collect()
}

/// A longer DepsTimeout keeps a job in the queue of its dependency's
/// holder longer, from the change on: another idle worker gets it only
/// once the new wait is over.
#[test]
fn timing_settings_take_effect_at_once() {
    let config = Config {
        cache_timeout: Millis(100),
        deps_timeout: Millis(100),
        lease_timeout: Millis(60_000),
        ..Config::default()
    };
    let mut s = Scheduler::new(config.clone());
    s.handle(Millis(0), worker(1, &["d"])).expect("w1 holds d");
    s.handle(Millis(0), job("busy", &[])).expect("busy");
    assert_eq!(assigned(&mut s).len(), 1, "w1 runs busy");
    s.handle(Millis(0), worker(2, &[])).expect("w2");
    s.reconfigure(Config { deps_timeout: Millis(10_000), ..config }).expect("a new wait");
    assert_eq!(s.config().deps_timeout, Millis(10_000));
    s.handle(Millis(0), job("a", &["d"])).expect("a waits for w1");
    s.handle(Millis(5_000), Event::Tick).expect("tick");
    assert_eq!(assigned(&mut s), [], "w2 took a before the new DepsTimeout");
    s.handle(Millis(10_001), Event::Tick).expect("tick");
    let late = assigned(&mut s);
    assert_eq!(late.iter().map(|(j, w, _)| (*j, *w)).collect::<Vec<_>>(), [(JobId::named("a"), WorkerId(2))]);
}

/// New queues are refused while a job is queued, and change nothing; once
/// the core is empty they are taken: workers must register again, and run
/// IDs go on from where they were.
#[test]
fn new_queues_wait_for_an_empty_core() {
    let mut s = Scheduler::new(Config::default());
    s.handle(Millis(0), worker(1, &[])).expect("w1");
    s.handle(Millis(0), job("a", &[])).expect("a");
    let first = assigned(&mut s);
    assert_eq!(first.len(), 1);
    s.handle(Millis(1), job("b", &[])).expect("b waits for the slot");
    let queues =
        Config { queues: vec![QueueConfig { name: "ci".into(), ..Default::default() }], ..Config::default() };
    let before = s.clone();
    let changed = "the queues (their names, weights, limits or parents)".to_owned();
    assert_eq!(s.reconfigure(queues.clone()), Err(Rejected::Busy { changed, jobs: 2, runs: 1 }));
    assert!(s == before, "a refused change changes nothing");
    let ok = JobResult { success: true, exit_code: Some(0), cached: false, detail: String::new() };
    s.handle(Millis(2), Event::JobExited { run: RunId(first[0].2), result: ok.clone() }).expect("a ends");
    let second = assigned(&mut s);
    assert_eq!(second.len(), 1, "b runs");
    s.handle(Millis(3), Event::JobExited { run: RunId(second[0].2), result: ok }).expect("b ends");
    s.reconfigure(queues.clone()).expect("an empty core takes new queues");
    assert_eq!(s.config().queues, queues.queues);
    assert!(!s.worker_alive(WorkerId(1)), "workers register again");
    s.handle(Millis(4), worker(1, &[])).expect("w1 again");
    s.handle(Millis(4), job("c", &[])).expect("c");
    let third = assigned(&mut s);
    assert_eq!(third.len(), 1);
    assert!(third[0].2 > second[0].2, "run IDs go on: {} after {}", third[0].2, second[0].2);
}
