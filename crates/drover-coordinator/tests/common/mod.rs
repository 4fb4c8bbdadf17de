//! Shared by the coordinator's integration tests.

use std::path::Path;

use drover_coordinator::CoordinatorConfig;

/// The default settings (but no wait for workers to register), with data
/// under `dir` and the server on a free port of the loopback interface.
pub(crate) fn loopback(dir: &Path) -> CoordinatorConfig {
    let mut config = CoordinatorConfig::new(dir.to_owned());
    config.listen = ([127, 0, 0, 1], 0).into();
    // These tests run no worker: a job fails at once for want of one,
    // instead of waiting `no_worker_grace` for one to register.
    config.core.no_worker_grace = drover_core::Millis(0);
    config
}

/// `spec` with each job's ID and early-cutoff key made from its content,
/// as a client makes them from a build file: the coordinator refuses a job
/// whose ID is not its content's. A spec whose IDs cannot be made (a need
/// that is no earlier job) is left as it is, for the coordinator to refuse.
#[allow(dead_code)] // Not every test binary submits builds.
pub(crate) fn sealed(mut spec: drover_proto::BuildSpec) -> drover_proto::BuildSpec {
    let Ok(ids) = drover_coordinator::content_ids(&spec) else { return spec };
    for (job, (id, own)) in spec.jobs.iter_mut().zip(ids) {
        job.id = id;
        job.own = own;
    }
    spec
}
