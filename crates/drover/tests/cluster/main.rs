//! End-to-end tests with real processes on loopback: `drover serve`,
//! `drover worker` and the client commands, in temporary directories.
//!
//! Every wait is for an observable condition (a file, a status, a process
//! exit) with a generous deadline; no test asserts how long anything took.

mod cache;
mod control;
mod harness;
mod queues;
mod scenarios;
mod snapshots;
mod stages;
mod worker;
mod worker_restart;
