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

/// w0 holds the results of `big` and `small`, and runs a dropped run of
/// `big` that still holds its memory; `big` is scheduled again (first
/// queue of w0, but it cannot fit beside that run, so w0 holds back for
/// it), then `small`, which w0 leaves waiting for the reservation. When w0
/// evicts `big`'s result, `big` leaves w0's queues: the reservation must go
/// and w0 take `small` at once, not idle until some other event wakes it.
#[test]
fn a_worker_whose_reserved_job_leaves_its_queues_takes_other_work() {
    let gib = 1u64 << 30;
    let mut s = Scheduler::new(Config::default());
    let w0 = Event::WorkerJoined {
        worker: WorkerId(0),
        name: "w0".into(),
        capacity: Capacity { slots: 2, cpu: 4000, memory: gib, tokens: BTreeMap::new() },
        labels: BTreeMap::new(),
        artifacts: vec![JobId::named("big"), JobId::named("small")],
    };
    s.handle(Millis(0), w0).unwrap();
    let spec = |name: &str, memory: u64| {
        let mut spec = JobSpec::new(JobId::named(name), "t");
        spec.request.memory = memory;
        // A dependency no worker holds: without its own result on w0, the
        // job waits in its dependency stage, in no queue of w0.
        spec.deps = vec![JobId::named("elsewhere")];
        Event::Schedule { spec, waiter: WaiterId(1) }
    };
    s.handle(Millis(0), spec("big", gib)).unwrap();
    assert!(matches!(s.take_decisions().as_slice(), [Decision::Assign { .. }]));
    // Cancelled while assigned: its run holds its memory until w0 reports
    // the exit.
    s.handle(Millis(0), Event::Cancel { job: JobId::named("big"), waiter: WaiterId(1) }).unwrap();
    s.take_decisions();
    s.handle(Millis(0), spec("big", gib)).unwrap();
    s.handle(Millis(0), spec("small", 0)).unwrap();
    assert_eq!(reserved_on(&s, "big"), Some(WorkerId(0)));
    assert!(s.take_decisions().is_empty(), "small waits behind the reservation");
    s.handle(
        Millis(0),
        Event::ArtifactsEvicted { worker: WorkerId(0), artifacts: vec![JobId::named("big")] },
    )
    .unwrap();
    assert_eq!(reserved_on(&s, "big"), None);
    let took_small = s.take_decisions().into_iter().any(|d| {
        matches!(d, Decision::Assign { job, worker, .. } if job == JobId::named("small") && worker == WorkerId(0))
    });
    assert!(took_small, "w0 takes small once big is out of its queues");
    s.check_invariants().expect("invariants");
}
