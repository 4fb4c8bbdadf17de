//! Reservations follow the worker: a worker that changes (labels, capacity,
//! evicted artifacts) keeps a reservation only for a job it could still run
//! and still sees; and a refused re-registration leaves no trace.

use std::collections::BTreeMap;

use drover_core::{
    Capacity, Config, Decision, Event, JobId, JobResult, JobSpec, JobStatus, Millis, Rejected, Scheduler,
    WaiterId, WorkerId,
};

fn worker(id: u64, slots: u32, os: &str, artifacts: &[&str]) -> Event {
    Event::WorkerJoined {
        worker: WorkerId(id),
        name: format!("w{id}"),
        capacity: Capacity { slots, cpu: 4000, memory: 8 << 30, tokens: BTreeMap::new() },
        labels: BTreeMap::from([("os".to_owned(), os.to_owned())]),
        artifacts: artifacts.iter().map(|a| JobId::named(a)).collect(),
    }
}

fn job(name: &str, tenant: &str, slots: u32, deps: &[&str], os: Option<&str>) -> Event {
    let mut spec = JobSpec::new(JobId::named(name), tenant);
    spec.request.slots = slots;
    spec.deps = deps.iter().map(|d| JobId::named(d)).collect();
    spec.labels = os.map(|os| ("os".to_owned(), os.to_owned())).into_iter().collect();
    Event::Schedule { spec, waiter: WaiterId(1) }
}

fn reserved_on(s: &Scheduler, name: &str) -> Option<WorkerId> {
    match s.job_view(&JobId::named(name)).map(|v| v.status) {
        Some(JobStatus::Queued { reserved_on, .. }) => reserved_on,
        _ => None,
    }
}

/// w0 reserves room for `b` (needs os=linux, 2 slots; w0 runs `a` in one
/// of its 2 slots), then re-registers as os=mac with 3 slots: b must not
/// be assigned there.
#[test]
fn a_reservation_ends_when_the_worker_loses_the_jobs_label() {
    let mut s = Scheduler::new(Config::default());
    s.handle(Millis(0), worker(0, 2, "linux", &["d"])).unwrap();
    s.handle(Millis(0), worker(1, 2, "linux", &[])).unwrap(); // b's class stays placeable
    s.handle(Millis(0), job("a", "t1", 1, &["d"], None)).unwrap();
    s.handle(Millis(0), job("b", "t2", 2, &["d"], Some("linux"))).unwrap();
    assert_eq!(reserved_on(&s, "b"), Some(WorkerId(0)));
    s.handle(Millis(1), worker(0, 3, "mac", &[])).unwrap();
    let wrong = s.take_decisions().into_iter().any(|d| {
        matches!(d, Decision::Assign { job, worker, .. } if job == JobId::named("b") && worker == WorkerId(0))
    });
    assert!(!wrong, "b (os=linux) assigned to w0 (os=mac)");
}

/// w0 reserves room for `b` (seen in its second queue through the
/// dependency d), then evicts d: b is in none of w0's queues and must
/// wait its DepsTimeout (100 ms), yet w0 takes it at 1 ms.
#[test]
fn a_reservation_ends_when_the_worker_no_longer_sees_the_job() {
    let mut s = Scheduler::new(Config::default());
    s.handle(Millis(0), worker(0, 2, "linux", &["d"])).unwrap();
    s.handle(Millis(0), worker(1, 2, "linux", &[])).unwrap();
    s.handle(Millis(0), job("a", "t1", 1, &["d"], None)).unwrap();
    s.handle(Millis(0), job("b", "t2", 2, &["d"], None)).unwrap();
    let run_a = match s.take_decisions().as_slice() {
        [Decision::Assign { run, .. }] => *run,
        other => panic!("{other:?}"),
    };
    assert_eq!(reserved_on(&s, "b"), Some(WorkerId(0)));
    s.handle(Millis(0), Event::ArtifactsEvicted { worker: WorkerId(0), artifacts: vec![JobId::named("d")] })
        .unwrap();
    s.handle(Millis(1), Event::JobExited { run: run_a, result: JobResult::ok() }).unwrap();
    let status = s.job_view(&JobId::named("b")).map(|v| v.status);
    assert!(matches!(status, Some(JobStatus::Queued { .. })), "b is {status:?} at 1 ms");
}

/// w0 reserves room for `b` (3 slots), then shrinks to 1 slot: it can
/// never run b, but keeps the reservation and so leaves `c` (which only
/// w0 can run) waiting while it sits idle.
#[test]
fn a_reservation_ends_when_the_worker_shrinks_below_the_job() {
    let mut s = Scheduler::new(Config::default());
    s.handle(Millis(0), worker(0, 3, "mac", &["d"])).unwrap();
    s.handle(Millis(0), worker(1, 3, "linux", &["e"])).unwrap();
    for x in ["x0", "x1", "x2"] {
        s.handle(Millis(0), job(x, "t1", 1, &["e"], None)).unwrap(); // keep w1 busy
    }
    s.handle(Millis(0), job("a", "t1", 1, &["d"], None)).unwrap();
    let run_a = match s.take_decisions().last() {
        Some(Decision::Assign { run, worker, .. }) if *worker == WorkerId(0) => *run,
        other => panic!("{other:?}"),
    };
    s.handle(Millis(0), job("b", "t2", 3, &["d"], None)).unwrap();
    assert_eq!(reserved_on(&s, "b"), Some(WorkerId(0)));
    s.handle(Millis(0), worker(0, 1, "mac", &[])).unwrap();
    s.handle(Millis(0), Event::JobExited { run: run_a, result: JobResult::ok() }).unwrap();
    s.handle(Millis(0), job("c", "t3", 1, &[], Some("mac"))).unwrap();
    s.handle(Millis(1000), Event::Tick).unwrap();
    let c = s.job_view(&JobId::named("c")).map(|v| v.status);
    assert!(
        matches!(c, Some(JobStatus::Assigned { .. })),
        "c is {c:?}; w0 is idle, reserving 3 of its 1 slot"
    );
}

/// "A refused event changes nothing": a refused re-registration still
/// interns the token names of its capacity.
#[test]
fn a_refused_registration_changes_nothing() {
    let mut s = Scheduler::new(Config::default());
    s.handle(Millis(0), worker(0, 1, "linux", &["d"])).unwrap();
    s.handle(Millis(0), job("a", "t", 1, &["d"], None)).unwrap(); // assigned to w0 at once
    let before = s.clone();
    let Event::WorkerJoined { worker, name, labels, artifacts, .. } = worker(0, 0, "linux", &[]) else {
        unreachable!()
    };
    let capacity = Capacity { slots: 0, cpu: 0, memory: 0, tokens: BTreeMap::from([("gpu".to_owned(), 1)]) };
    let refused = s.handle(Millis(0), Event::WorkerJoined { worker, name, capacity, labels, artifacts });
    assert_eq!(refused, Err(Rejected::CapacityBelowUsage(WorkerId(0))));
    assert!(s == before, "the refused event changed the state");
}
