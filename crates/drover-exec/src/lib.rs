//! drover-exec runs one build job's commands as subprocesses such that the
//! job can be cancelled, timed out, suspended and resumed, and nothing it
//! started survives it — including grandchildren that call `setsid()` or
//! `setpgid()` to leave its process group.
//!
//! The worker never spawns a job's commands itself. [`Supervisor::start`]
//! starts a per-job **supervisor process** (the `drover` binary re-executed
//! with a hidden argument, or this crate's `drover-exec-supervisor` binary,
//! calling [`supervisor_main`]). The supervisor starts a session of its own
//! and makes itself a child subreaper, so every orphaned descendant of the
//! job is reparented to it; it runs the commands, each in a process group of
//! its own, and before it exits it terminates every descendant it still has
//! (SIGTERM to the command's group and every descendant, then SIGKILL after
//! [`JobSpec::kill_grace`]) and reaps all its children. Descendants are found
//! through `/proc`: every process whose chain of parents leads to the
//! supervisor is the job's, and since an orphan's new parent is the
//! supervisor, none can leave that tree — not even one that called `setsid()`
//! or `setpgid()` to leave the command's process group. The (private)
//! `supervisor` module documents the supervisor's protocol; [`RunningJob`]
//! is the worker side (timeout, cancel, suspend, resume).
//!
//! **If the worker dies** (even by SIGKILL), the job dies with it: the
//! supervisor's standard input is a pipe whose only write end is held by the
//! worker (close-on-exec, so no other process inherits it); the kernel closes
//! it with the worker, and end of file on it is a stop request, handled like
//! [`RunningJob::terminate`]. (`PR_SET_PDEATHSIG` is not used: it fires when
//! the *thread* that spawned the supervisor exits, and tokio's threads come
//! and go.) **If the supervisor dies** without writing its report (SIGKILL,
//! OOM killer), [`RunningJob::wait`] SIGKILLs the processes left in the
//! supervisor's session.
//!
//! Limitations: Linux only (`/proc`, `signalfd`, `PR_SET_CHILD_SUBREAPER`).
//! Processes the job has started through someone else (`systemd-run`, a
//! container daemon, `ssh localhost`, `at`) are not its descendants and are
//! not found; neither are processes that left the supervisor's session with
//! `setsid()` if the supervisor itself is SIGKILLed (they are reparented to
//! init). Processes that refuse signals (another user's, after a setuid
//! `exec`, when the worker is not privileged) are given up on after a while.
//! Cgroups would close these gaps.
//!
//! ```ignore
//! let supervisor = Supervisor::new(std::env::current_exe()?, vec!["__supervise".into()]);
//! let mut job = supervisor.start(&spec).await?;
//! match job.wait().await {
//!     Outcome::Succeeded => {}
//!     other => eprintln!("job ended: {other:?}"),
//! }
//! ```

mod job;
mod procfs;
mod spec;
mod supervisor;

pub use job::{ExecError, JobHandle, Outcome, RunningJob, Supervisor};
pub use spec::{DEFAULT_PATH, DEFAULT_TMPDIR, JobReport, JobSpec};
pub use supervisor::{
    EXIT_FAILED, EXIT_SIGNALED, EXIT_SPAWN_FAILED, EXIT_SUCCEEDED, EXIT_SUPERVISOR_ERROR, EXIT_TERMINATED,
    supervisor_main,
};
