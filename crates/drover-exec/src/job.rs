//! The worker side: having the zygote hand a job to a supervisor
//! ([`Supervisor::start`]), waiting for it with the job's timeout
//! ([`RunningJob::wait`]), and cancelling, suspending and resuming it
//! ([`RunningJob`], [`JobHandle`]) through the job's control pipe.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::launcher::{Launcher, SupervisorExit, SupervisorFds, Zygote};
use crate::procfs;
use crate::spec::{JobReport, JobSpec};
use crate::supervisor::{EXIT_SUPERVISOR_ERROR, READY_LINE, REPORT_PREFIX};

/// How long [`Supervisor::start`] waits for the supervisor to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Most passes of [`RunningJob::kill_orphans`].
const ORPHAN_SWEEP_LIMIT: u32 = 500;
/// Wait between two passes of [`RunningJob::kill_orphans`].
const ORPHAN_SWEEP_INTERVAL: Duration = Duration::from_millis(10);
/// How much of the supervisor's own standard error is kept for messages.
const STDERR_LIMIT: u64 = 16 * 1024;
/// How much of the job's output pipe after `ready` (the supervisor's
/// report) is read.
const REPORT_LIMIT: u64 = 1024 * 1024;

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every command exited 0.
    Succeeded,
    /// A command exited with a non-zero code; later commands did not run.
    Failed {
        /// The failing command's exit code.
        exit_code: i32,
    },
    /// A command was killed by a signal the job did not get from us.
    Signaled {
        /// The signal number.
        signal: i32,
    },
    /// The job ran longer than [`JobSpec::timeout`] (not counting suspended
    /// time) and was terminated.
    TimedOut,
    /// The job was terminated ([`RunningJob::terminate`], or a stop signal
    /// someone else sent to the supervisor) before its commands were done.
    Cancelled,
    /// A command could not be started (missing working directory, …), a log
    /// could not be written (even after the commands ran: a full disk, say),
    /// or the supervisor failed; the message says which.
    SpawnFailed(String),
    /// The supervisor was killed (by a signal, or with its zygote: the OOM
    /// killer, an operator) before it could report: the worker's machinery
    /// failed, not the job. The message says how.
    SupervisorLost(String),
}

/// Errors of the worker-side API.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A file the job needs could not be prepared.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The supervisor process could not be started, or did not get ready.
    #[error("supervisor did not start: {0}")]
    Supervisor(String),
    /// The job has already ended (or its supervisor is gone).
    #[error("the job is no longer running")]
    NotRunning,
}

/// How to run jobs under supervisor processes: through a **zygote**, one
/// helper process started as `program args…` when the first job needs it
/// (and again if it dies), which keeps a pool of supervisors and hands each
/// job to an idle one (forking one when none is idle). The program must
/// call [`zygote_main`](crate::zygote_main) first thing.
///
/// Clones share the zygote. It exits when this value, its clones and every
/// job started through them have been dropped (or when the worker dies).
#[derive(Debug, Clone)]
pub struct Supervisor {
    launcher: Arc<Launcher>,
}

impl PartialEq for Supervisor {
    /// Same program and arguments (whatever their zygotes).
    fn eq(&self, other: &Self) -> bool {
        self.program() == other.program()
            && self.args() == other.args()
            && self.launcher.env() == other.launcher.env()
    }
}

impl Eq for Supervisor {}

impl Supervisor {
    /// Jobs whose supervisors are kept by a zygote started as `program
    /// args…`: e.g. the `drover` binary with a hidden argument,
    /// `Supervisor::new(std::env::current_exe()?, vec!["__zygote".into()])`,
    /// or this crate's `drover-exec-supervisor` binary with no argument.
    /// Nothing is started until the first job.
    pub fn new(program: PathBuf, args: Vec<OsString>) -> Self {
        Self::with_env(program, args, Vec::new())
    }

    /// [`Supervisor::new`], with `env` added to the environment the zygote
    /// (and so every supervisor) inherits, e.g. to tune the allocator of a
    /// process that forks many small ones. The jobs' commands never see it:
    /// their environment is exactly their spec's.
    pub fn with_env(program: PathBuf, args: Vec<OsString>, env: Vec<(OsString, OsString)>) -> Self {
        Supervisor { launcher: Arc::new(Launcher::new(program, args, env)) }
    }

    /// The zygote's executable.
    pub fn program(&self) -> &Path {
        self.launcher.program()
    }

    /// The zygote's arguments.
    pub fn args(&self) -> &[OsString] {
        self.launcher.args()
    }

    /// The process id of the running zygote, if there is one (none before
    /// the first job, and once it has died until the next job).
    pub fn zygote_pid(&self) -> Option<u32> {
        self.launcher.zygote_pid()
    }

    /// Starts a job: has the zygote (started if none is running) hand it to
    /// a supervisor, and waits until that is ready to handle stop requests
    /// (so that [`RunningJob::terminate`] can never kill it before it can
    /// clean up).
    /// Must be called within a tokio runtime.
    ///
    /// Problems with the job itself (a missing `cwd`, say) are not errors
    /// here: the job then ends with [`Outcome::SpawnFailed`].
    pub async fn start(&self, spec: &JobSpec) -> Result<RunningJob, ExecError> {
        let io = |context: &str| {
            let context = context.to_owned();
            move |source| ExecError::Io { context, source }
        };
        // The zygote's working directory is not ours to rely on.
        let mut spec = spec.clone();
        for path in [&mut spec.cwd, &mut spec.stdout, &mut spec.stderr] {
            *path = std::path::absolute(&*path).map_err(io("cannot make the job's paths absolute"))?;
        }
        let json = serde_json::to_vec(&spec).map_err(|e| ExecError::Io {
            context: "cannot encode the job spec".to_owned(),
            source: std::io::Error::other(e),
        })?;
        // Every pipe is close-on-exec: the worker's ends stay in the worker.
        let (control_reader, control) = std::io::pipe().map_err(io("cannot create the control pipe"))?;
        let (stdout_reader, stdout_writer) = std::io::pipe().map_err(io("cannot create a pipe"))?;
        let (stderr_reader, stderr_writer) = std::io::pipe().map_err(io("cannot create a pipe"))?;
        let stdout = pipe::Receiver::from_owned_fd_unchecked(OwnedFd::from(stdout_reader))
            .map_err(io("cannot read the supervisor's output"))?;
        let stderr = pipe::Receiver::from_owned_fd_unchecked(OwnedFd::from(stderr_reader))
            .map_err(io("cannot read the supervisor's output"))?;
        let fds = SupervisorFds {
            control: OwnedFd::from(control_reader),
            stdout: OwnedFd::from(stdout_writer),
            stderr: OwnedFd::from(stderr_writer),
        };
        let ready = async move {
            // The supervisor's ends are closed here once sent, so that end
            // of file on its output means it is gone.
            let launched = self.launcher.launch(&json, fds).await?;
            let stderr = tokio::spawn(read_limited(stderr));
            let mut line = String::new();
            let mut stdout = BufReader::new(stdout);
            stdout.read_line(&mut line).await.ok();
            Ok::<_, ExecError>((launched, stderr, line.trim_end() == READY_LINE, stdout))
        };
        let (launched, stderr, ready, stdout) =
            tokio::time::timeout(READY_TIMEOUT, ready).await.map_err(|_| {
                ExecError::Supervisor(format!("no answer from the zygote {}", self.program().display()))
            })??;
        let mut exit = launched.exit;
        if !ready {
            // Kill it unless it has exited already (its pid may be reused
            // once it has been reaped). A supervisor that did not write
            // `ready` is never given another job, so the pid is still its.
            if matches!(exit.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                let _ = procfs::signal_pid(launched.pid as i32, Signal::SIGKILL);
            }
            let status = tokio::time::timeout(READY_TIMEOUT, &mut exit).await;
            let status = match status {
                Ok(Ok(status)) => describe(&status),
                Ok(Err(_)) => describe(&lost(&launched.zygote)),
                Err(_) => "still running".to_owned(),
            };
            let stderr = stderr.await.unwrap_or_default();
            return Err(ExecError::Supervisor(format!(
                "{} did not report ready ({status}): {}",
                self.program().display(),
                stderr.trim()
            )));
        }
        let (clock, clock_rx) = watch::channel(Clock::new(Instant::now()));
        let shared = Arc::new(Shared {
            pid: launched.pid,
            exited: AtomicBool::new(false),
            control: Mutex::new(Some(control)),
            clock,
        });
        Ok(RunningJob {
            shared,
            zygote: launched.zygote,
            exit,
            status: None,
            clock_rx,
            stderr: Some(stderr),
            report: Some(tokio::spawn(read_report(stdout))),
            timeout: spec.timeout,
            result: None,
        })
    }
}

/// The exit of a supervisor whose zygote died.
fn lost(zygote: &Zygote) -> SupervisorExit {
    SupervisorExit::Lost(zygote.lost().unwrap_or_else(|| "it went away".to_owned()))
}

/// How the supervisor ended, for messages.
fn describe(exit: &SupervisorExit) -> String {
    match exit {
        SupervisorExit::Exited(code) if *code == EXIT_SUPERVISOR_ERROR => "failed".to_owned(),
        SupervisorExit::Exited(code) => format!("exited with code {code}"),
        SupervisorExit::Signaled(signal) => match Signal::try_from(*signal) {
            Ok(name) => format!("killed by signal {signal} ({name})"),
            Err(_) => format!("killed by signal {signal}"),
        },
        SupervisorExit::Lost(why) => format!("lost: its zygote died ({why})"),
    }
}

async fn read_limited(stream: pipe::Receiver) -> String {
    let mut bytes = Vec::new();
    let mut limited = stream.take(STDERR_LIMIT);
    let _ = limited.read_to_end(&mut bytes).await;
    // Keep draining, so the supervisor never blocks on a full pipe.
    let mut rest = limited.into_inner();
    let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads the rest of the job's output pipe, up to end of file (the
/// supervisor closes it at the job's end, or died): the report line, if it
/// sent one.
async fn read_report(stdout: BufReader<pipe::Receiver>) -> Option<JobReport> {
    let mut bytes = Vec::new();
    let mut limited = stdout.take(REPORT_LIMIT);
    let _ = limited.read_to_end(&mut bytes).await;
    let mut rest = limited.into_inner();
    let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
    let text = std::str::from_utf8(&bytes).ok()?;
    let json = text.lines().find_map(|line| line.strip_prefix(REPORT_PREFIX))?;
    serde_json::from_str(json).ok()
}

/// The job's timeout clock: running time counts, suspended time does not.
#[derive(Debug, Clone, Copy)]
struct Clock {
    started: Instant,
    paused: Duration,
    suspended_since: Option<Instant>,
    stop: Option<StopReason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    TimedOut,
    Cancelled,
}

impl Clock {
    fn new(now: Instant) -> Self {
        Clock { started: now, paused: Duration::ZERO, suspended_since: None, stop: None }
    }

    /// Running (not suspended) time so far.
    fn active(&self, now: Instant) -> Duration {
        let suspended =
            self.suspended_since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        now.saturating_duration_since(self.started).saturating_sub(self.paused + suspended)
    }
}

/// State shared by a [`RunningJob`] and its [`JobHandle`]s.
///
/// Requests reach the job through its control pipe, never as signals to
/// the supervisor's pid: the supervisor runs later jobs under the same
/// pid, and a request that comes after the job's end finds the pipe
/// closed (the supervisor closes its end with the job) instead of reaching
/// the next job.
#[derive(Debug)]
struct Shared {
    pid: u32,
    /// Set once the job has ended: the supervisor may run another job.
    exited: AtomicBool,
    /// Write end of the job's control pipe (see the supervisor module).
    /// Dropping it (with the last handle) makes the supervisor stop the job.
    control: Mutex<Option<std::io::PipeWriter>>,
    clock: watch::Sender<Clock>,
}

impl Shared {
    fn pid(&self) -> i32 {
        self.pid as i32
    }

    fn running(&self) -> Result<(), ExecError> {
        if self.exited.load(Ordering::Acquire) { Err(ExecError::NotRunning) } else { Ok(()) }
    }

    /// Writes one request byte on the control pipe; fails once the
    /// supervisor has closed its end (the job is over) or the pipe was
    /// dropped.
    fn send_control(&self, byte: u8) -> Result<(), ExecError> {
        let mut control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(pipe) = control.as_mut() else { return Err(ExecError::NotRunning) };
        if pipe.write_all(&[byte]).is_err() {
            *control = None;
            return Err(ExecError::NotRunning);
        }
        Ok(())
    }

    fn stop(&self, reason: StopReason) {
        if self.running().is_err() {
            return;
        }
        self.clock.send_modify(|clock| {
            clock.stop.get_or_insert(reason);
            if let Some(since) = clock.suspended_since.take() {
                clock.paused += Instant::now().saturating_duration_since(since);
            }
        });
        // The supervisor sends SIGTERM, then SIGCONT, to every process of
        // the job, waits for the grace period, and SIGKILLs what is left.
        // Failing, the job is over already.
        let _ = self.send_control(b'T');
    }

    fn suspend(&self) -> Result<(), ExecError> {
        self.running()?;
        // The supervisor stops every process of the job, and starts no new
        // command until resumed.
        self.send_control(b'S')?;
        self.clock.send_modify(|clock| {
            clock.suspended_since.get_or_insert_with(Instant::now);
        });
        Ok(())
    }

    fn resume(&self) -> Result<(), ExecError> {
        self.running()?;
        self.send_control(b'R')?;
        self.clock.send_modify(|clock| {
            if let Some(since) = clock.suspended_since.take() {
                clock.paused += Instant::now().saturating_duration_since(since);
            }
        });
        Ok(())
    }
}

/// A started job. [`wait`](Self::wait) for it; [`terminate`](Self::terminate),
/// [`suspend`](Self::suspend) and [`resume`](Self::resume) it, here or from
/// other tasks through a [`JobHandle`].
///
/// Dropping it (and every [`JobHandle`]) before the job has ended closes the
/// job's control pipe, which makes the supervisor terminate the job
/// (SIGTERM, grace, SIGKILL). The same happens if the worker process dies.
#[derive(Debug)]
pub struct RunningJob {
    shared: Arc<Shared>,
    /// The zygote that handed the job to the supervisor (and reports its end).
    zygote: Arc<Zygote>,
    /// The job's end, from the zygote.
    exit: oneshot::Receiver<SupervisorExit>,
    /// The exit, once received.
    status: Option<SupervisorExit>,
    clock_rx: watch::Receiver<Clock>,
    stderr: Option<JoinHandle<String>>,
    /// Reads the supervisor's report (see `read_report`).
    report: Option<JoinHandle<Option<JobReport>>>,
    timeout: Option<Duration>,
    result: Option<(Outcome, Option<JobReport>)>,
}

impl RunningJob {
    /// The supervisor's process id (also its session and process group id).
    /// Supervisors are reused: other jobs, before and after this one, may
    /// have run under the same one.
    pub fn pid(&self) -> u32 {
        self.shared.pid
    }

    /// A cloneable handle to terminate, suspend or resume the job from other
    /// tasks while this one waits.
    pub fn handle(&self) -> JobHandle {
        JobHandle { shared: Arc::clone(&self.shared) }
    }

    /// Waits for the job to end and tells how it ended. Also enforces the
    /// job's timeout, suspended time not counted: when it runs out, the job
    /// is terminated and the outcome is [`Outcome::TimedOut`] (unless its
    /// commands had finished by then).
    ///
    /// Cancel-safe: dropping the future (in a `select!`, say) loses nothing,
    /// and calling it again after the end returns the same outcome.
    pub async fn wait(&mut self) -> Outcome {
        if let Some((outcome, _)) = &self.result {
            return outcome.clone();
        }
        loop {
            if let Some(status) = self.status.clone() {
                self.shared.exited.store(true, Ordering::Release);
                return self.finish(status).await;
            }
            let due = {
                let clock = *self.clock_rx.borrow_and_update();
                match (self.timeout, clock.stop, clock.suspended_since) {
                    (Some(timeout), None, None) => {
                        let now = Instant::now();
                        // None (no deadline) if too far to represent.
                        now.checked_add(timeout.saturating_sub(clock.active(now)))
                    }
                    _ => None,
                }
            };
            tokio::select! {
                exit = &mut self.exit => {
                    self.status = Some(exit.unwrap_or_else(|_| lost(&self.zygote)));
                }
                () = sleep_until(due) => {
                    let clock = *self.clock_rx.borrow();
                    let timeout = self.timeout.unwrap_or(Duration::MAX);
                    if clock.stop.is_none() && clock.suspended_since.is_none() && clock.active(Instant::now()) >= timeout {
                        self.shared.stop(StopReason::TimedOut);
                    }
                }
                _ = self.clock_rx.changed() => {}
            }
        }
    }

    /// The supervisor's report, once [`wait`](Self::wait) has returned (none
    /// if the supervisor could not write it).
    pub fn report(&self) -> Option<&JobReport> {
        self.result.as_ref().and_then(|(_, report)| report.as_ref())
    }

    /// Asks the supervisor to stop the job (a request on the job's control
    /// pipe): it sends SIGTERM to every process of the job, waits
    /// [`JobSpec::kill_grace`], then SIGKILLs what is left. [`wait`](Self::wait) then returns [`Outcome::Cancelled`],
    /// unless the job had already finished. Does nothing once the job has
    /// ended.
    pub fn terminate(&self) {
        self.shared.stop(StopReason::Cancelled);
    }

    /// Suspends the job: the supervisor sends SIGSTOP to every process under
    /// it (not to itself: it stays responsive), and starts no new command
    /// until [`resume`](Self::resume). The timeout clock stops at once; the
    /// processes stop as soon as the supervisor reads the request (it waits
    /// on the control pipe, so at once unless it is busy killing processes).
    pub fn suspend(&self) -> Result<(), ExecError> {
        self.shared.suspend()
    }

    /// Resumes a suspended job: the supervisor sends SIGCONT to every process
    /// under it. The timeout clock runs again.
    pub fn resume(&self) -> Result<(), ExecError> {
        self.shared.resume()
    }

    async fn finish(&mut self, status: SupervisorExit) -> Outcome {
        let report = if matches!(status, SupervisorExit::Lost(_)) {
            // The zygote died, and the supervisor may still run. A report it
            // already sent stands; otherwise kill it and its session (what
            // it might report while being killed is not the job's doing).
            let sent = match self.report.take() {
                Some(task) if task.is_finished() => task.await.ok().flatten(),
                _ => None,
            };
            if sent.is_none() {
                self.kill_lost_session().await;
            }
            sent
        } else {
            // The job is over: the supervisor has closed its output (it
            // closes the job's pipes before it reports the end).
            let report = match self.report.take() {
                Some(task) => task.await.ok().flatten(),
                None => None,
            };
            if report.is_none() {
                // The supervisor died without cleaning up (SIGKILLed, say):
                // kill what it left in its session (processes that left the
                // session with `setsid` are out of reach). If it is alive
                // (it ended the job, but its report could not be read), it
                // left nothing, and nothing of its session is touched while
                // it lives.
                self.kill_orphans().await;
            }
            report
        };
        let stop = self.clock_rx.borrow().stop;
        let outcome = match (&report, stop) {
            (Some(report), _) if !report.terminated => outcome_of(report),
            (Some(_), Some(StopReason::TimedOut)) => Outcome::TimedOut,
            (Some(_), _) => Outcome::Cancelled,
            // No report: the supervisor died or failed.
            (None, Some(StopReason::TimedOut)) => Outcome::TimedOut,
            (None, Some(StopReason::Cancelled)) => Outcome::Cancelled,
            (None, None) => {
                let stderr = match self.stderr.take() {
                    Some(task) => task.await.unwrap_or_default(),
                    None => String::new(),
                };
                let said = match stderr.trim() {
                    "" => String::new(),
                    said => format!(": {said}"),
                };
                let what = format!("job supervisor {}{said}", describe(&status));
                match status {
                    SupervisorExit::Lost(_) | SupervisorExit::Signaled(_) => Outcome::SupervisorLost(what),
                    SupervisorExit::Exited(_) => Outcome::SpawnFailed(what),
                }
            }
        };
        self.result = Some((outcome.clone(), report));
        outcome
    }
}

impl RunningJob {
    /// SIGKILLs the live processes of the dead supervisor's session, pass
    /// after pass (a killed process's children are reparented and may still
    /// be running), until none is left or [`ORPHAN_SWEEP_LIMIT`] passes.
    async fn kill_orphans(&self) {
        let sid = self.shared.pid();
        for _ in 0..ORPHAN_SWEEP_LIMIT {
            if procfs::kill_orphaned_session(sid) == 0 {
                return;
            }
            tokio::time::sleep(ORPHAN_SWEEP_INTERVAL).await;
        }
    }

    /// SIGKILLs the supervisor, whose zygote died so it cannot be waited
    /// for, with its descendants and its session, pass after pass (see
    /// `procfs::kill_lost_supervisor`).
    async fn kill_lost_session(&self) {
        let sid = self.shared.pid();
        for _ in 0..ORPHAN_SWEEP_LIMIT {
            if procfs::kill_lost_supervisor(sid) == 0 {
                return;
            }
            tokio::time::sleep(ORPHAN_SWEEP_INTERVAL).await;
        }
    }
}

impl Drop for RunningJob {
    /// A job dropped before it ended is terminated: a stop request, then its
    /// control pipe is closed. Handles stop working, as the supervisor may
    /// then run another job.
    fn drop(&mut self) {
        if self.result.is_none() {
            self.shared.stop(StopReason::Cancelled);
            self.shared.control.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
        self.shared.exited.store(true, Ordering::Release);
    }
}

fn outcome_of(report: &JobReport) -> Outcome {
    if let Some(message) = &report.spawn_error {
        Outcome::SpawnFailed(message.clone())
    } else if let Some(signal) = report.signal {
        Outcome::Signaled { signal }
    } else {
        match report.exit_code {
            Some(0) | None => Outcome::Succeeded,
            Some(exit_code) => Outcome::Failed { exit_code },
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A cloneable handle on a [`RunningJob`], to control it from other tasks.
/// Same semantics as the methods of the same names on [`RunningJob`].
#[derive(Debug, Clone)]
pub struct JobHandle {
    shared: Arc<Shared>,
}

impl JobHandle {
    /// The supervisor's process id.
    pub fn pid(&self) -> u32 {
        self.shared.pid
    }

    /// See [`RunningJob::terminate`].
    pub fn terminate(&self) {
        self.shared.stop(StopReason::Cancelled);
    }

    /// See [`RunningJob::suspend`].
    pub fn suspend(&self) -> Result<(), ExecError> {
        self.shared.suspend()
    }

    /// See [`RunningJob::resume`].
    pub fn resume(&self) -> Result<(), ExecError> {
        self.shared.resume()
    }
}
