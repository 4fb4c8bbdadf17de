//! drover-exec runs one build job's commands as subprocesses such that the
//! job can be cancelled, timed out, suspended and resumed, and nothing it
//! started survives it — including grandchildren that call `setsid()` or
//! `setpgid()` to leave its process group.
//!
//! The worker never spawns a job's commands itself. [`Supervisor::start`]
//! has a per-job **supervisor process** run them. Supervisors are forked by
//! a **zygote**: one long-lived helper process per [`Supervisor`] (so per
//! worker), started when the first job needs it as the `drover` binary
//! re-executed with a hidden argument (or this crate's
//! `drover-exec-supervisor` binary), calling [`zygote_main`] before any
//! thread starts. Forking that small single-threaded process costs far less
//! than executing the large binary once per job. The worker talks to it over
//! a Unix socket pair: per job, it creates the supervisor's pipes and sends
//! their far ends with the spec (`SCM_RIGHTS`); the zygote forks, closes
//! its copies, reaps the supervisor and sends its exit status back, which a
//! task of the worker hands to the job's [`RunningJob::wait`]. The (private)
//! `zygote` module documents that protocol.
//!
//! The supervisor starts a session of its own
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
//! worker (close-on-exec, so no other process inherits it, and the zygote
//! only ever gets the read end); the kernel closes it with the worker, and
//! end of file on it is a stop request, handled like
//! [`RunningJob::terminate`]. The zygote sees end of file on its socket and
//! exits. (`PR_SET_PDEATHSIG` is not used: it fires when the *thread* that
//! spawned the process exits, and tokio's threads come and go.) **If the
//! supervisor dies** without writing its report (SIGKILL, OOM killer),
//! [`RunningJob::wait`] SIGKILLs the processes left in the supervisor's
//! session. **If the zygote dies**, its supervisors can no longer be waited
//! for: every job it forked ends as if its supervisor had died (the worker
//! SIGKILLs the supervisor, its descendants and its session), and the next
//! [`Supervisor::start`] starts a new zygote.
//!
//! Limitations: Linux only (`/proc`, `signalfd`, `PR_SET_CHILD_SUBREAPER`).
//! Processes the job has started through someone else (`systemd-run`, a
//! container daemon, `ssh localhost`, `at`) are not its descendants and are
//! not found; neither are processes that left the supervisor's session with
//! `setsid()` if the supervisor itself is SIGKILLed (they are reparented to
//! init). Processes that refuse signals (another user's, after a setuid
//! `exec`, when the worker is not privileged) are given up on after a while.
//! Cgroups would close these gaps. The zygote reaps a supervisor a moment
//! before the worker hears of it: a terminate, suspend or resume sent in
//! that moment signals a PID that could in principle have been reused
//! (only if the PID space wrapped around meanwhile; pidfds would close this
//! gap). `unsafe` is confined to the private `sys` module (`fork`, `_exit`
//! of a forked supervisor, and taking ownership of descriptors received
//! over the socket).
//!
//! ```ignore
//! // In `main`, before any thread:
//! // if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
//! //     std::process::exit(drover_exec::zygote_main());
//! // }
//! let supervisor = Supervisor::new(std::env::current_exe()?, vec!["__zygote".into()]);
//! let mut job = supervisor.start(&spec).await?;
//! match job.wait().await {
//!     Outcome::Succeeded => {}
//!     other => eprintln!("job ended: {other:?}"),
//! }
//! ```

mod job;
mod launcher;
mod procfs;
mod spec;
mod supervisor;
mod sys;
mod zygote;

pub use job::{ExecError, JobHandle, Outcome, RunningJob, Supervisor};
pub use spec::{DEFAULT_PATH, DEFAULT_TMPDIR, JobReport, JobSpec};
pub use supervisor::{
    EXIT_FAILED, EXIT_SIGNALED, EXIT_SPAWN_FAILED, EXIT_SUCCEEDED, EXIT_SUPERVISOR_ERROR, EXIT_TERMINATED,
};
pub use zygote::zygote_main;
