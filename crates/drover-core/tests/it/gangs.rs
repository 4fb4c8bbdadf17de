//! Property tests of gangs: random gangs (members with 1 or 2 slots, a
//! random `min_available`) and plain jobs on a few workers, with exits in a
//! random order. A gang starts with at least `min_available` members in one
//! step or not at all, and a placement that was tried and undone leaves no
//! trace (the invariants compare every worker's and queue's use with the
//! runs after every step).

use std::collections::{BTreeMap, BTreeSet};

use drover_core::{
    Capacity, Config, Decision, Event, GangSpec, JobId, JobResult, JobSpec, Millis, RunId, Scheduler,
    WaiterId, WorkerId,
};
use proptest::prelude::*;
use proptest::sample::Index;

#[derive(Clone, Debug)]
struct GangCase {
    /// Slots of each worker.
    workers: Vec<u32>,
    /// Per gang: (members' slots, min_available).
    gangs: Vec<(Vec<u32>, u32)>,
    plain: usize,
    /// Which run exits next, step after step.
    exits: Vec<Index>,
}

fn gang_case() -> impl Strategy<Value = GangCase> {
    let gang = prop::collection::vec(1..=2u32, 1..=4).prop_flat_map(|slots| {
        let n = slots.len() as u32;
        (Just(slots), 1..=n)
    });
    (
        prop::collection::vec(1..=3u32, 1..=3),
        prop::collection::vec(gang, 1..=3),
        0..6usize,
        prop::collection::vec(any::<Index>(), 0..60),
    )
        .prop_map(|(workers, gangs, plain, exits)| GangCase { workers, gangs, plain, exits })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(200) })]

    #[test]
    fn gangs_start_whole_or_not_at_all(case in gang_case()) {
        let config = Config { cache_timeout: Millis(0), deps_timeout: Millis(0), ..Config::default() };
        let mut s = Scheduler::new(config);
        let mut now = 0;
        let mut handle = |s: &mut Scheduler, e: Event| -> Vec<Decision> {
            now += 1;
            s.handle(Millis(now), e).expect("accepted");
            s.take_decisions()
        };
        let mut all = Vec::new();
        for (w, &slots) in case.workers.iter().enumerate() {
            let capacity = Capacity { slots, cpu: 64_000, memory: 64 << 30, tokens: BTreeMap::new() };
            let joined = Event::WorkerJoined {
                worker: WorkerId(w as u64),
                name: format!("w{w}"),
                capacity,
                labels: BTreeMap::new(),
                artifacts: Vec::new(),
            };
            all.extend(handle(&mut s, joined));
        }
        let mut gang_of: BTreeMap<JobId, (usize, u32)> = BTreeMap::new();
        let mut specs = Vec::new();
        for (g, (members, min)) in case.gangs.iter().enumerate() {
            for (m, &slots) in members.iter().enumerate() {
                let id = JobId::named(&format!("g{g}m{m}"));
                let mut spec = JobSpec::new(id, "t");
                spec.request.slots = slots;
                spec.gang = Some(GangSpec { id: format!("g{g}"), min_available: *min });
                gang_of.insert(id, (g, *min));
                specs.push(spec);
            }
        }
        for p in 0..case.plain {
            specs.push(JobSpec::new(JobId::named(&format!("p{p}")), "u"));
        }
        let mut started: BTreeSet<usize> = BTreeSet::new();
        let mut running: BTreeMap<RunId, JobId> = BTreeMap::new();
        let mut check = |decisions: &[Decision], running: &mut BTreeMap<RunId, JobId>| -> Result<(), TestCaseError> {
            let mut now_started: BTreeMap<usize, u32> = BTreeMap::new();
            for d in decisions {
                if let Decision::Assign { job, run, .. } = d {
                    running.insert(*run, *job);
                    if let Some(&(g, _)) = gang_of.get(job) {
                        *now_started.entry(g).or_default() += 1;
                    }
                }
            }
            for (g, n) in now_started {
                if started.insert(g) {
                    let min = case.gangs[g].1;
                    prop_assert!(n >= min, "gang g{} started with {} of its {} needed", g, n, min);
                }
            }
            Ok(())
        };
        check(&all, &mut running)?;
        for (i, spec) in specs.into_iter().enumerate() {
            let d = handle(&mut s, Event::Schedule { spec, waiter: WaiterId(i as u64) });
            check(&d, &mut running)?;
            prop_assert_eq!(s.check_invariants(), Ok(()));
        }
        for pick in &case.exits {
            let Some(&run) = running.keys().nth(pick.index(running.len().max(1))) else { break };
            running.remove(&run);
            let d = handle(&mut s, Event::JobExited { run, result: JobResult::ok() });
            check(&d, &mut running)?;
            prop_assert_eq!(s.check_invariants(), Ok(()));
        }
    }
}

/// A gang that the live workers could not hold even idle says so in its
/// members' waiting reason; one that only waits for room does not.
#[test]
fn a_gang_larger_than_the_cluster_says_it_waits_for_more_workers() {
    let mut s = Scheduler::new(Config::default());
    let capacity = Capacity { slots: 2, cpu: 64_000, memory: 64 << 30, tokens: BTreeMap::new() };
    let joined = |w: u64| Event::WorkerJoined {
        worker: WorkerId(w),
        name: format!("w{w}"),
        capacity: capacity.clone(),
        labels: BTreeMap::new(),
        artifacts: Vec::new(),
    };
    s.handle(Millis(0), joined(0)).expect("joined");
    let member = |name: &str, gang: &str, min: u32| {
        let mut spec = JobSpec::new(JobId::named(name), "t");
        spec.gang = Some(GangSpec { id: gang.to_owned(), min_available: min });
        Event::Schedule { spec, waiter: WaiterId(1) }
    };
    for m in ["a1", "a2", "a3"] {
        s.handle(Millis(1), member(m, "big", 3)).expect("scheduled");
    }
    let reason = s.waiting_reason(&JobId::named("a1")).expect("queued");
    assert!(reason.contains("could hold at most 2 jobs like this one at once"), "{reason}");
    // A second worker makes room enough: the gang starts.
    s.handle(Millis(2), joined(1)).expect("joined");
    assert!(s.waiting_reason(&JobId::named("a1")).is_none(), "started");
}
