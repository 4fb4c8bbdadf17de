//! drover-graph integration tests: each module covers one area of the crate
//! through its public API only.

mod common;
mod diagnostics;
mod example;
mod globs;
mod ids;
mod order;
