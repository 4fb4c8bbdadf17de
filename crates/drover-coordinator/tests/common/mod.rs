//! Shared by the coordinator's integration tests.

use std::path::Path;

use drover_coordinator::CoordinatorConfig;

/// The default settings, with data under `dir` and the server on a free
/// port of the loopback interface.
pub(crate) fn loopback(dir: &Path) -> CoordinatorConfig {
    let mut config = CoordinatorConfig::new(dir.to_owned());
    config.listen = ([127, 0, 0, 1], 0).into();
    config
}
