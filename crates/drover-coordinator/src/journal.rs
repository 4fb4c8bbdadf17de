//! What the coordinator tells its operator as it goes (`tracing` at info):
//! builds accepted and ended, workers registered, lost and left. One line each,
//! from the state thread's turns (a replay at start-up says nothing of
//! the past), so `drover serve` shows what its cluster is doing.

use std::collections::BTreeSet;

use drover_core::Millis;
use drover_solver::{Effect, Solver};

/// Build `id`, of `jobs` jobs, was accepted for `tenant`.
pub(crate) fn accepted(solver: &Solver, id: u64, tenant: &str, jobs: usize) {
    let name = solver.build_outcome(id).map(|b| b.name.to_owned()).unwrap_or_default();
    tracing::info!(build = id, name, tenant, jobs, "build accepted");
}

/// The turn's effects that concern the operator: workers that registered
/// or were lost, and builds that ended now.
pub(crate) fn effects(solver: &Solver, effects: &[Effect], now: Millis) {
    let mut builds = BTreeSet::new();
    for effect in effects {
        match effect {
            Effect::Registered { worker } => {
                if let Some((name, url, _)) = solver.worker_name(*worker) {
                    tracing::info!(worker = name, url, "worker registered");
                }
            }
            Effect::WorkerLost { worker } => match solver.worker_name(*worker) {
                Some((name, url, true)) => tracing::info!(worker = name, url, "worker left"),
                Some((name, url, false)) => {
                    tracing::info!(worker = name, url, "worker lost (it missed its lease)")
                }
                None => {}
            },
            Effect::BuildChanged { build } => _ = builds.insert(*build),
            _ => {}
        }
    }
    for id in builds {
        let Some(outcome) = solver.build_outcome(id) else { continue };
        if outcome.finished_at != Some(now) {
            continue;
        }
        let states = solver.build_job_states(id).unwrap_or_default();
        let jobs: Vec<String> = states.iter().map(|(state, n)| format!("{n} {state}")).collect();
        tracing::info!(build = id, name = outcome.name, state = %outcome.state, jobs = jobs.join(", "), "build ended");
    }
}
