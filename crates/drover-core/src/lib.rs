//! drover's scheduling core: a pure, deterministic state machine.
//!
//! Events and the current time go in ([`Scheduler::handle`]); decisions come
//! out ([`Scheduler::take_decisions`]): assign a job to a worker, drop or stop
//! a run, deliver a job's completion to its waiters. The next timer deadline is
//! [`Scheduler::poll_timeout`]. The core does no I/O, reads no clock, draws
//! randomness only from a seed in its [`Config`], and keeps its state in
//! ordered containers (and in hash tables it only looks up in, never walks
//! in hash order), so the same events at the same times always give the
//! same decisions, and replaying a recorded event log ([`Scheduler::replay`])
//! rebuilds an equal state.
//!
//! The rules it implements (dedup, artifact locations, distbuild's
//! cache-aware placement, least-recently-served tenants, resources with
//! exclusive tokens, labels, cancellation and worker loss) are described in
//! the repository's `ARCHITECTURE.md`.

#![warn(missing_docs)]

mod held;
mod idmap;
mod order;
mod policy;
mod queue;
mod quota;
mod readers;
mod resources;
mod rng;
mod scheduler;
mod small;
mod types;

pub use quota::DEFAULT_QUEUE;
pub use scheduler::{JobStatus, JobView, QueueAmounts, QueueName, QueueView, Scheduler};
pub use types::{
    CancelStage, Capacity, Completion, Config, Decision, Event, Evict, FailReason, GangSpec, JobId,
    JobResult, JobSpec, Millis, PluginConfig, QueueConfig, QueueLimits, Rejected, Request, RunId, Tier,
    Timer, TimerKind, WaiterId, WorkerId,
};
