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
