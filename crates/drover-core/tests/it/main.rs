//! Integration tests of drover-core: scenario scripts (`scenarios`), property
//! tests over random event sequences (`properties`, `gangs`) and reservation
//! regressions (`reservations`). One binary, so one link step. The core's
//! purity rules are checked with the solver's in `crates/drover/tests/purity.rs`.

mod gangs;
mod properties;
mod reconfigure;
mod reservations;
mod scenario;
