//! Integration tests of drover-core: scenario scripts (`scenarios`), property
//! tests over random event sequences (`properties`), reservation regressions
//! (`reservations`), and the crate's
//! dependency rules (`boundaries`). One binary, so one link step.

mod boundaries;
mod properties;
mod reservations;
mod scenario;
