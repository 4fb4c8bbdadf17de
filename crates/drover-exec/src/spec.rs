//! What a job is ([`JobSpec`], handed from the worker to the supervisor as
//! JSON, through the zygote) and what became of it ([`JobReport`], which the
//! supervisor sends back on the job's output pipe), plus the environment
//! defaults a job's commands get.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `PATH` given to a job's commands when [`JobSpec::env`] has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `TMPDIR` given to a job's commands when [`JobSpec::env`] has none.
pub const DEFAULT_TMPDIR: &str = "/tmp";

/// One build job to run: its commands and how to run them.
///
/// Every command runs as `/bin/sh -c <command>`, one after the other, in
/// [`cwd`](Self::cwd), stopping at the first one that does not exit 0. A
/// plain command (a program and its arguments, with nothing for the shell
/// to expand or interpret) is started directly instead, with the same
/// result and one process fewer; the private `plain` module says which
/// commands are plain and what the supervisor does in the shell's place.
///
/// The environment of the commands is **exactly** [`env`](Self::env) (nothing
/// is inherited from the worker), except that three variables get a default
/// when the map does not set them:
///
/// - `PATH`: [`DEFAULT_PATH`];
/// - `HOME`: the job's `cwd`;
/// - `TMPDIR`: [`DEFAULT_TMPDIR`].
///
/// Standard input is `/dev/null`; standard output and standard error are
/// pipes, which the supervisor copies, as the bytes arrive, to the ends of
/// the files [`stdout`](Self::stdout) and [`stderr`](Self::stderr) (they may
/// be the same file). A file is opened on its first byte (created if
/// missing, with its directory): a job that writes nothing to a stream
/// leaves no file for it. The supervisor itself adds a line to `stderr`
/// when a command cannot be started and when it had to kill processes left
/// behind by the job. A log that cannot be written makes the job end with
/// [`Outcome::SpawnFailed`](crate::Outcome::SpawnFailed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Shell commands, run in order with `/bin/sh -c` (plain ones without
    /// the shell).
    pub commands: Vec<String>,
    /// Working directory of every command. A missing directory makes the job
    /// end with [`Outcome::SpawnFailed`](crate::Outcome::SpawnFailed).
    pub cwd: PathBuf,
    /// The commands' whole environment (see the type's documentation for the
    /// three defaults).
    pub env: BTreeMap<String, String>,
    /// File the commands' standard output is appended to (created on the
    /// first byte).
    pub stdout: PathBuf,
    /// File the commands' standard error is appended to (created on the
    /// first byte).
    pub stderr: PathBuf,
    /// Limit on the job's running time, suspended time not counted. Enforced
    /// by [`RunningJob::wait`](crate::RunningJob::wait).
    pub timeout: Option<Duration>,
    /// How long the job's processes get between SIGTERM and SIGKILL, when the
    /// job is cancelled or timed out and when processes outlive the job.
    pub kill_grace: Duration,
    /// Bytes each log file keeps at most (`None`: everything). A job that
    /// writes more keeps its first bytes and its last ones (a quarter of
    /// the limit, at most 1 MiB), with a line between them saying how much
    /// was dropped: a job that writes without end cannot fill the disk, and
    /// the end of its output, where errors usually are, stays.
    #[serde(default)]
    pub log_limit: Option<u64>,
}

impl JobSpec {
    /// The environment the commands actually get: [`env`](Self::env) plus the
    /// `PATH`, `HOME`, `TMPDIR` and `PYTHONDONTWRITEBYTECODE=1` defaults (the
    /// last so that Python importing from a dependency's read-only output
    /// writes no `__pycache__` into it).
    pub fn effective_env(&self) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        env.entry("PATH".to_owned()).or_insert_with(|| DEFAULT_PATH.to_owned());
        env.entry("HOME".to_owned()).or_insert_with(|| self.cwd.to_string_lossy().into_owned());
        env.entry("TMPDIR".to_owned()).or_insert_with(|| DEFAULT_TMPDIR.to_owned());
        env.entry("PYTHONDONTWRITEBYTECODE".to_owned()).or_insert_with(|| "1".to_owned());
        env
    }
}

/// What the supervisor reports when it is done (see
/// [`RunningJob::report`](crate::RunningJob::report)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    /// Exit code of the last command that ran (the failing one, if one
    /// failed); `None` if it was killed by a signal or no command ran.
    pub exit_code: Option<i32>,
    /// The signal that killed the last command that ran, if one did.
    pub signal: Option<i32>,
    /// Whether the job was stopped (a stop request on its control pipe,
    /// SIGTERM, SIGINT or SIGHUP to the supervisor, or the worker went away)
    /// before its commands were done.
    pub terminated: bool,
    /// Wall-clock duration of every command that was started, in order, in
    /// milliseconds (suspended time included).
    pub duration_ms: Vec<u64>,
    /// Why a command could not be started, if one could not.
    pub spawn_error: Option<String>,
    /// How many processes the supervisor had to terminate at the end: those
    /// still alive after the last command ended (daemons and other leftovers)
    /// or, for a terminated job, every process of the job at that moment.
    pub leftover_processes: usize,
    /// Whether those processes (or some of them) ignored SIGTERM and had to
    /// be SIGKILLed: how long after SIGTERM, in milliseconds (the kill
    /// grace, unless a further stop request cut it short). `None` if every
    /// process exited on SIGTERM, or none had to be stopped.
    #[serde(default)]
    pub killed_after_ms: Option<u64>,
}
