//! drover-exec runs one build job's commands as subprocesses such that the
//! job can be cancelled, timed out, suspended and resumed, and nothing it
//! started survives it — including grandchildren that call `setsid()` or
//! `setpgid()` to leave its process group.
//!
//! The worker never spawns a job's commands itself. [`Supervisor::start`]
//! has a **supervisor process** run them. Supervisors are kept by a
//! **zygote**: one long-lived helper process per [`Supervisor`] (so per
//! worker), started when the first job needs it as the `drover` binary
//! re-executed with a hidden argument (or this crate's
//! `drover-exec-supervisor` binary), calling [`zygote_main`] before any
//! thread starts. The zygote keeps a pool of supervisors, forked from it (a
//! small single-threaded process) as needed, and **reuses** them: it hands
//! each job to an idle one, forks one only when none is idle, and lets
//! surplus idle ones exit, so a job costs neither an exec of the large
//! binary nor a fork. The worker talks to it over a Unix socket pair: per
//! job, it creates the job's pipes and sends their far ends with the spec
//! (`SCM_RIGHTS`); the zygote passes them on to a supervisor, closes its
//! copies, and sends back the supervisor's pid, then how the job ended (the
//! supervisor's exit code for it, or how the supervisor died), which a task
//! of the worker hands to the job's [`RunningJob::wait`]. The (private)
//! `zygote` module documents that protocol and the pool.
//!
//! A supervisor starts a session of its own and makes itself a child
//! subreaper, so every orphaned descendant of a job is reparented to it; it
//! runs the commands, each in a process group of its own, and at the end of
//! the job it terminates every descendant it still has (SIGTERM to the
//! command's group and every descendant, then SIGKILL after
//! [`JobSpec::kill_grace`]) and reaps all its children, so nothing of a job
//! is left when the next one starts. Descendants are found through `/proc`:
//! every process whose chain of parents leads to the supervisor is the
//! job's, and since an orphan's new parent is the supervisor, none can leave
//! that tree — not even one that called `setsid()` or `setpgid()` to leave
//! the command's process group. A supervisor keeps nothing else of a job
//! either (descriptors, working directory; see the (private) `supervisor`
//! module, which documents the supervisor's side), and one that cannot vouch
//! for that (a process that refused to die, resource limits changed under
//! it) exits instead of taking another job. [`RunningJob`] is the worker
//! side (timeout, cancel, suspend, resume): requests go through the job's
//! own control pipe, never as signals to the supervisor's pid, which other
//! jobs share.
//!
//! **If the worker dies** (even by SIGKILL), the job dies with it: the
//! supervisor reads the job's control pipe, whose only write end is held by
//! the worker (close-on-exec, so no other process inherits it, and the
//! zygote only ever gets the read end); the kernel closes it with the
//! worker, and end of file on it is a stop request, handled like
//! [`RunningJob::terminate`]. The zygote sees end of file on its socket and
//! exits, and its supervisors exit after it. (`PR_SET_PDEATHSIG` is not
//! used: it fires when the *thread* that spawned the process exits, and
//! tokio's threads come and go.) **If the supervisor dies** during a job
//! without writing its report (SIGKILL, OOM killer), the zygote reports it
//! as the job's end (it is not reused: it is dead), and [`RunningJob::wait`]
//! SIGKILLs the processes left in the supervisor's session. **If the zygote
//! dies**, its jobs can no longer be followed: every job it had handed out
//! ends as if its supervisor had died (the worker SIGKILLs the supervisor,
//! its descendants and its session), idle supervisors exit, and the next
//! [`Supervisor::start`] starts a new zygote.
//!
//! Limitations: Linux only (`/proc`, `signalfd`, `PR_SET_CHILD_SUBREAPER`).
//! Processes the job has started through someone else (`systemd-run`, a
//! container daemon, `ssh localhost`, `at`) are not its descendants and are
//! not found; neither are processes that left the supervisor's session with
//! `setsid()` if the supervisor itself is SIGKILLed (they are reparented to
//! init). Processes that refuse signals (another user's, after a setuid
//! `exec`, when the worker is not privileged) are given up on after a while
//! (and their supervisor is not reused). Cgroups would close these gaps. A
//! job can still reach its supervisor, which is its parent and runs as the
//! same user (signals, `ptrace` where allowed): supervisors isolate jobs
//! from leftovers of earlier jobs, not from a job that sets out to harm
//! later ones. The worker still signals a supervisor by pid in two cases,
//! where it is not given another job: one that did not get ready, killed
//! unless its exit was reported already, and one lost with its zygote; the
//! first is reaped by the zygote a moment before the worker hears of it, so
//! that signal could in principle reach a process that reused the pid (only
//! if the PID space wrapped around meanwhile; pidfds would close this gap).
//! `unsafe` is confined to the private `sys` module (`fork`,
//! `_exit` of a forked supervisor, taking ownership of descriptors
//! received over a socket, and `ioprio_get`).
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
mod plain;
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
