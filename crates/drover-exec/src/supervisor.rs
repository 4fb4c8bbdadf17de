//! The supervisor process: the small synchronous program that runs one job's
//! commands and makes sure nothing the job started outlives it.
//!
//! It is forked by the zygote (the `zygote` module) for each
//! [`Supervisor::start`](crate::Supervisor::start), runs [`supervise`] with
//! the job's spec, and:
//!
//! 1. blocks SIGTERM, SIGINT, SIGHUP and SIGCHLD and reads them from a
//!    `signalfd` (no signal handler, so no `unsafe`); starts a new session
//!    (`setsid`); becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
//!    every orphaned descendant — including one that called `setsid` or
//!    `setpgid` to leave the job's process group — is reparented to it;
//! 2. decodes the [`JobSpec`] (JSON, sent by the worker), writes `ready`
//!    on standard output, and runs the commands one by one (`posix_spawn`, so
//!    that they start with an empty signal mask), each in its own process
//!    group, stopping at the first that fails; the commands' standard output
//!    and error are pipes the supervisor copies to the log files as the
//!    bytes arrive, creating each file (and its directory) on its first
//!    byte, so a job that prints nothing costs no file;
//! 3. on a stop request (SIGTERM/SIGINT/SIGHUP, or end of file on the control
//!    pipe, i.e. the worker is gone) sends SIGTERM then SIGCONT to the running
//!    command's process group and to every descendant of the supervisor found
//!    in `/proc` (by parent links from every process's `/proc/<pid>/stat`),
//!    waits up to [`JobSpec::kill_grace`] for them to exit, then SIGKILLs
//!    every descendant, sweep after sweep, until it has no child left (a
//!    process whose parent is killed is reparented to the supervisor, and
//!    found by the next sweep);
//! 4. when the commands are done, treats every process still alive the same
//!    way (a job leaves no daemon behind), reaps every child (`waitpid(-1)`),
//!    copies what is left in the log pipes, writes the [`JobReport`] on
//!    standard output as one line (`report ` and JSON) after `ready`, and
//!    exits with one of the `EXIT_*` codes.
//!
//! The control pipe (the supervisor's standard input, when it is a pipe)
//! carries one byte per request from the worker: `S` (job suspended: start no
//! new command, stop every descendant) and `R` (job resumed: continue every
//! descendant). Bytes are read in order, so a quick suspend/resume/suspend
//! ends suspended.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::procfs;
use crate::spec::{JobReport, JobSpec};

/// Supervisor exit code: every command exited 0.
pub const EXIT_SUCCEEDED: i32 = 0;
/// Supervisor exit code: a command exited with a non-zero code.
pub const EXIT_FAILED: i32 = 1;
/// Supervisor exit code: a command was killed by a signal.
pub const EXIT_SIGNALED: i32 = 2;
/// Supervisor exit code: the job was stopped by a stop request.
pub const EXIT_TERMINATED: i32 = 3;
/// Supervisor exit code: a command could not be started.
pub const EXIT_SPAWN_FAILED: i32 = 4;
/// Supervisor exit code: the supervisor itself failed (bad spec,
/// report not sent); details on its standard error. The zygote also
/// exits with it when it cannot serve.
pub const EXIT_SUPERVISOR_ERROR: i32 = 125;

/// The line the supervisor writes on standard output once it handles
/// signals and control requests.
pub(crate) const READY_LINE: &str = "ready";

/// What starts the line that carries the [`JobReport`] (JSON follows), the
/// supervisor's last words on standard output.
pub(crate) const REPORT_PREFIX: &str = "report ";

/// Longest wait between two looks at the children when nothing is signalled.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Wait between two SIGKILL sweeps while processes are still dying.
const KILL_INTERVAL: Duration = Duration::from_millis(10);
/// How long SIGKILL sweeps go on when every process left refuses signals.
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);
/// Bytes read from a log pipe at once.
const LOG_CHUNK: usize = 64 * 1024;
/// Bytes read from a log pipe at once until a read fills them.
const SMALL_LOG_READ: usize = 4096;
/// Most reads from one log pipe per wake-up, so a job that writes without
/// pause cannot keep the supervisor from its other duties.
const LOG_READS_PER_WAKE: usize = 16;
/// Most reads from one log pipe once the job is over (only a process that
/// refused to die could still be writing).
const LOG_READS_AT_END: usize = 4096;

/// Runs one job from its [`JobSpec`] (JSON) as the per-job supervisor
/// process, and returns the process's exit code (one of the `EXIT_*`
/// codes). Called by the zygote in the child it forked for the job, whose
/// standard input is the control pipe, standard output the pipe the worker
/// reads `ready` from, and standard error the pipe of its own messages.
///
/// The process must have a single thread, since signals are blocked for
/// the calling thread only.
pub(crate) fn supervise(spec_json: &[u8]) -> i32 {
    match run(spec_json) {
        Ok(code) => code,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "drover-exec supervisor: {message}");
            EXIT_SUPERVISOR_ERROR
        }
    }
}

fn run(spec_json: &[u8]) -> Result<i32, String> {
    // Signals first: until they are blocked, a SIGTERM would kill us outright
    // (harmless only because nothing is started yet).
    let mut mask = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
        mask.add(signal);
    }
    mask.thread_block().map_err(|e| format!("cannot block signals: {e}"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("cannot create a signalfd: {e}"))?;
    // A new session also detaches the job from the worker's terminal. This
    // fails only if we already lead a process group; we then keep it.
    let _ = nix::unistd::setsid();
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a child subreaper: {e}"))?;

    let mut spec: JobSpec = serde_json::from_slice(spec_json).map_err(|e| format!("bad job spec: {e}"))?;
    // The supervisor changes directory to run commands: pin relative paths
    // to the directory it started in (the worker sends absolute ones).
    for path in [&mut spec.cwd, &mut spec.stdout, &mut spec.stderr] {
        *path = std::path::absolute(&*path).map_err(|e| format!("bad path {}: {e}", path.display()))?;
    }

    let control = control_pipe();
    let logs = Logs::new(&spec)?;
    let mut out = std::io::stdout();
    writeln!(out, "{READY_LINE}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot report ready: {e}"))?;

    let mut sup = Supervisor {
        me: std::process::id() as i32,
        signals,
        control,
        stop_requests: 0,
        held: false,
        current: None,
        current_status: None,
        no_children: false,
        grace: spec.kill_grace,
        logs,
    };
    let report = sup.run_job(&spec);
    send_report(&report)?;
    Ok(exit_code(&report))
}

/// The worker's control pipe: our standard input if it is a pipe (it always
/// is when the zygote forked us).
fn control_pipe() -> Option<File> {
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let file = File::from(fd);
    let is_pipe = file.metadata().map(|m| m.file_type().is_fifo()).unwrap_or(false);
    is_pipe.then_some(file)
}

fn exit_code(report: &JobReport) -> i32 {
    if report.spawn_error.is_some() {
        EXIT_SPAWN_FAILED
    } else if report.terminated {
        EXIT_TERMINATED
    } else if report.signal.is_some() {
        EXIT_SIGNALED
    } else if report.exit_code.is_some_and(|c| c != 0) {
        EXIT_FAILED
    } else {
        EXIT_SUCCEEDED
    }
}

/// Sends the report to the worker: one line on standard output, in one
/// write (the worker reads everything up to end of file, which comes when
/// we exit).
fn send_report(report: &JobReport) -> Result<(), String> {
    let json = serde_json::to_string(report).map_err(|e| format!("cannot encode the report: {e}"))?;
    let line = format!("{REPORT_PREFIX}{json}\n");
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot send the report: {e}"))
}

/// One log of the job: the pipe its commands write to, and the file the
/// supervisor copies the pipe to, opened (created, with its directory, if
/// missing; appended to) on the first byte.
#[derive(Debug)]
struct Log {
    path: PathBuf,
    /// Read end, non-blocking; polled by the supervisor.
    reader: File,
    /// Write end, handed to every command. Kept open until the end, so the
    /// read end never sees end of file (which would make `poll` spin).
    writer: File,
    file: Option<File>,
    /// Why the file could not be opened or written, once that happened
    /// (later bytes are dropped).
    error: Option<String>,
}

impl Log {
    fn new(path: &Path) -> Result<Log, String> {
        let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot create a log pipe: {e}"))?;
        let reader = File::from(std::os::fd::OwnedFd::from(reader));
        fcntl(&reader, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| format!("cannot make a log pipe non-blocking: {e}"))?;
        let writer = File::from(std::os::fd::OwnedFd::from(writer));
        Ok(Log { path: path.to_owned(), reader, writer, file: None, error: None })
    }

    /// Copies up to `reads` chunks of what the pipe holds to the file.
    /// Most jobs write little or nothing: reads go to a small buffer on the
    /// stack until one fills it, and only then to a [`LOG_CHUNK`] one (so a
    /// silent job's supervisor allocates and touches no fresh memory here).
    fn drain(&mut self, reads: usize) {
        let mut small = [0u8; SMALL_LOG_READ];
        let mut large = Vec::new();
        for _ in 0..reads {
            let buf: &mut [u8] = if large.is_empty() { &mut small } else { &mut large };
            match self.reader.read(buf) {
                Ok(0) => return,
                Ok(n) => {
                    let filled = n == buf.len();
                    self.write(&buf[..n]);
                    if filled && large.is_empty() {
                        large = vec![0u8; LOG_CHUNK];
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return, // EAGAIN: empty for now
            }
        }
    }

    /// Appends to the file, opening it first if needed.
    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if self.file.is_none() {
            match open_log(&self.path) {
                Ok(file) => self.file = Some(file),
                Err(message) => {
                    self.error = Some(message);
                    return;
                }
            }
        }
        if let Some(file) = &mut self.file
            && let Err(e) = file.write_all(bytes)
        {
            self.error = Some(format!("cannot write log file {}: {e}", self.path.display()));
        }
    }
}

/// The job's standard output and standard error logs (one, when both go to
/// the same file).
#[derive(Debug)]
struct Logs {
    stdout: Log,
    stderr: Option<Log>,
}

impl Logs {
    fn new(spec: &JobSpec) -> Result<Logs, String> {
        let stdout = Log::new(&spec.stdout)?;
        let stderr = if spec.stderr == spec.stdout { None } else { Some(Log::new(&spec.stderr)?) };
        Ok(Logs { stdout, stderr })
    }

    fn stderr(&mut self) -> &mut Log {
        self.stderr.as_mut().unwrap_or(&mut self.stdout)
    }

    fn stderr_writer(&self) -> &File {
        &self.stderr.as_ref().unwrap_or(&self.stdout).writer
    }

    fn each(&mut self) -> impl Iterator<Item = &mut Log> {
        std::iter::once(&mut self.stdout).chain(self.stderr.as_mut())
    }

    /// The first failure to write a log, if any.
    fn error(&self) -> Option<String> {
        std::iter::once(&self.stdout).chain(self.stderr.as_ref()).find_map(|log| log.error.clone())
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy)]
enum Status {
    Exited(i32),
    Signaled(i32),
}

#[derive(Debug)]
struct Supervisor {
    me: i32,
    signals: SignalFd,
    control: Option<File>,
    /// Stop requests received so far (signals, or the worker going away).
    stop_requests: u32,
    /// Suspended by the worker: start no new command.
    held: bool,
    /// The running command (pid, which is also its process group).
    current: Option<i32>,
    /// How the running command ended, once reaped.
    current_status: Option<Status>,
    /// `waitpid` said we have no child at all.
    no_children: bool,
    grace: Duration,
    logs: Logs,
}

impl Supervisor {
    fn run_job(&mut self, spec: &JobSpec) -> JobReport {
        let mut report = self.run_commands(spec);
        // Whatever happened, no process of the job is left to write: copy
        // what the log pipes still hold.
        for log in self.logs.each() {
            log.drain(LOG_READS_AT_END);
        }
        if let Some(message) = self.logs.error()
            && report.spawn_error.is_none()
        {
            report.spawn_error = Some(message);
        }
        report
    }

    fn run_commands(&mut self, spec: &JobSpec) -> JobReport {
        let mut report = JobReport::default();
        let env = spec.effective_env();

        for (index, command) in spec.commands.iter().enumerate() {
            // Handle whatever is pending first: a suspend request sent while
            // the previous command still ran must hold this one back.
            self.pump(Duration::ZERO);
            while self.held && self.stop_requests == 0 {
                self.pump(POLL_INTERVAL);
                self.reap();
            }
            if self.stop_requests > 0 {
                report.terminated = true;
                break;
            }
            let started = Instant::now();
            let spawned =
                spawn_command(command, &spec.cwd, &env, &self.logs.stdout.writer, self.logs.stderr_writer());
            let pid = match spawned {
                Ok(pid) => pid,
                Err(error) => {
                    let message = format!("cannot start command {} (`{command}`): {error}", index + 1);
                    self.log(&message);
                    report.spawn_error = Some(message);
                    break;
                }
            };
            self.current = Some(pid);
            self.current_status = None;
            while self.current_status.is_none() {
                if self.stop_requests > 0 {
                    report.terminated = true;
                    report.leftover_processes = self.shut_down();
                    break;
                }
                self.pump(POLL_INTERVAL);
                self.reap();
            }
            report.duration_ms.push(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
            let status = self.current_status.take();
            self.current = None;
            match status {
                Some(Status::Exited(code)) => report.exit_code = Some(code),
                Some(Status::Signaled(signal)) => report.signal = Some(signal),
                // Only when a process we did not start was given our
                // child's status, which cannot happen: count it as killed.
                None => report.signal = Some(Signal::SIGKILL as i32),
            }
            if report.terminated || report.exit_code != Some(0) {
                break;
            }
        }

        if !report.terminated {
            self.reap();
            // As a subreaper, every descendant left is (or becomes, once its
            // parent exits) our child: with none, there is nothing to scan.
            let left = if self.no_children {
                0
            } else {
                procfs::descendants(self.me).iter().filter(|p| p.alive()).count()
            };
            if left > 0 {
                self.log(&format!(
                    "drover: {left} process(es) still running after the job's commands ended; terminating them"
                ));
                report.leftover_processes = self.shut_down();
            }
        }
        // Whatever happened, leave no child (and so no descendant) behind.
        self.kill_all();
        report
    }

    /// Appends a line to the job's stderr log, after what the job wrote
    /// there so far.
    fn log(&mut self, message: &str) {
        let log = self.logs.stderr();
        log.drain(LOG_READS_AT_END);
        log.write(format!("{message}\n").as_bytes());
    }

    /// SIGTERM (then SIGCONT, so stopped processes see it) to every
    /// descendant and to the running command's process group; waits for them
    /// to exit for the grace period (cut short by a further stop request);
    /// then SIGKILLs whatever is left. Returns how many processes were alive.
    fn shut_down(&mut self) -> usize {
        let requests_before = self.stop_requests;
        self.held = false;
        let command_group = self.current.filter(|_| self.current_status.is_none());
        let count = procfs::descendants(self.me).iter().filter(|p| p.alive()).count();
        for signal in [Signal::SIGTERM, Signal::SIGCONT] {
            if let Some(group) = command_group {
                let _ = killpg(Pid::from_raw(group), signal);
            }
            procfs::signal_descendants(self.me, signal);
        }
        // No deadline if the grace period is too long to represent.
        let deadline = Instant::now().checked_add(self.grace);
        loop {
            self.reap();
            if self.no_children {
                return count;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) || self.stop_requests > requests_before {
                break;
            }
            self.pump(deadline.map_or(POLL_INTERVAL, |d| POLL_INTERVAL.min(d - now)));
        }
        self.kill_all();
        count
    }

    /// SIGKILLs every descendant, again and again, until no child is left.
    /// Orphans of killed processes are reparented to us (subreaper), so the
    /// next sweep finds them as our children.
    ///
    /// Processes that refuse signals (another user's, e.g. after a setuid
    /// `exec`) cannot be killed: once nothing but those is left for
    /// [`GIVE_UP_AFTER`], they are logged and left alone rather than waited
    /// for forever.
    fn kill_all(&mut self) {
        let mut stuck_since: Option<Instant> = None;
        loop {
            self.reap();
            if self.no_children {
                return;
            }
            let (signalled, refused) = procfs::signal_descendants(self.me, Signal::SIGKILL);
            if signalled == 0 && refused > 0 {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GIVE_UP_AFTER {
                    self.log(&format!(
                        "drover: cannot kill {refused} process(es) of the job (permission denied)"
                    ));
                    return;
                }
            } else {
                stuck_since = None;
            }
            self.pump(KILL_INTERVAL);
        }
    }

    /// Reaps every child that has exited, recording the running command's
    /// status, and notes whether any child is left.
    fn reap(&mut self) {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    self.no_children = false;
                    return;
                }
                Ok(WaitStatus::Exited(pid, code)) => self.record(pid, Status::Exited(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => self.record(pid, Status::Signaled(signal as i32)),
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => {
                    self.no_children = true;
                    return;
                }
                Err(_) => {
                    self.no_children = false;
                    return;
                }
            }
        }
    }

    fn record(&mut self, pid: Pid, status: Status) {
        if self.current == Some(pid.as_raw()) {
            self.current_status = Some(status);
        }
    }

    /// Waits up to `timeout` for a signal or a control byte, and handles
    /// what arrived. Children are reaped by the caller.
    fn pump(&mut self, timeout: Duration) {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let (signal_ready, control_ready, logs_ready) = {
            let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            let logs_at = fds.len();
            fds.push(PollFd::new(self.logs.stdout.reader.as_fd(), PollFlags::POLLIN));
            if let Some(stderr) = &self.logs.stderr {
                fds.push(PollFd::new(stderr.reader.as_fd(), PollFlags::POLLIN));
            }
            let control_at = fds.len();
            if let Some(control) = &self.control {
                fds.push(PollFd::new(control.as_fd(), PollFlags::POLLIN));
            }
            if poll(&mut fds, PollTimeout::from(ms)).is_err() {
                return;
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            (
                ready(&fds[0]),
                fds.get(control_at).is_some_and(ready),
                fds[logs_at..control_at].iter().any(ready),
            )
        };
        if logs_ready {
            for log in self.logs.each() {
                log.drain(LOG_READS_PER_WAKE);
            }
        }
        if signal_ready {
            while let Ok(Some(info)) = self.signals.read_signal() {
                let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
                if [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP].iter().any(|s| *s as i32 == signo) {
                    self.stop_requests += 1;
                }
            }
        }
        if control_ready {
            self.read_control();
        }
    }

    fn read_control(&mut self) {
        let Some(control) = &mut self.control else { return };
        let mut buf = [0u8; 64];
        match control.read(&mut buf) {
            Ok(0) | Err(_) => {
                // The worker closed the pipe: it dropped the job or died.
                self.control = None;
                self.stop_requests += 1;
            }
            Ok(n) => {
                for byte in &buf[..n] {
                    match byte {
                        b'S' if self.stop_requests == 0 => {
                            self.held = true;
                            let _ = procfs::stop_descendants(self.me);
                        }
                        b'R' => {
                            self.held = false;
                            let _ = procfs::continue_descendants(self.me);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Opens a log file to append to, creating it and its directory if missing.
fn open_log(path: &Path) -> Result<File, String> {
    let open = || OpenOptions::new().create(true).append(true).open(path);
    let opened = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match path.parent() {
            Some(dir) => std::fs::create_dir_all(dir).and_then(|()| open()),
            None => Err(e),
        },
        other => other,
    };
    opened.map_err(|e| format!("cannot open log file {}: {e}", path.display()))
}

/// Standard signals whose disposition a command gets reset to the default
/// (the Rust runtime ignores SIGPIPE; the worker may have ignored others).
const RESET_SIGNALS: [Signal; 13] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGPIPE,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGCHLD,
    Signal::SIGALRM,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGXFSZ,
];

/// Starts `/bin/sh -c <command>` in `cwd` with exactly `env`, stdin from
/// `/dev/null` and the given logs, in a process group of its own, with an
/// empty signal mask and default signal dispositions; returns its pid.
///
/// `posix_spawn` rather than `std::process::Command`: std makes children
/// inherit the parent's signal mask, and ours blocks SIGTERM (read from a
/// signalfd), which the commands must not inherit; resetting the mask in a
/// `pre_exec` hook would need `unsafe`. `posix_spawn` has no working
/// directory attribute (short of a glibc extension nix does not wrap), so
/// the supervisor, which is single-threaded, moves into `cwd` itself.
fn spawn_command(
    command: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    stdout: &File,
    stderr: &File,
) -> Result<i32, String> {
    let cstring = |s: String| CString::new(s).map_err(|_| "it contains a NUL byte".to_owned());
    let args = [cstring("/bin/sh".to_owned())?, cstring("-c".to_owned())?, cstring(command.to_owned())?];
    let envp = env.iter().map(|(k, v)| cstring(format!("{k}={v}"))).collect::<Result<Vec<_>, _>>()?;
    std::env::set_current_dir(cwd).map_err(|e| {
        if cwd.is_dir() {
            format!("cannot enter working directory {}: {e}", cwd.display())
        } else {
            format!("working directory {} does not exist or is not a directory", cwd.display())
        }
    })?;
    let dev_null = File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;

    let spawn = || -> nix::Result<Pid> {
        let mut actions = PosixSpawnFileActions::init()?;
        actions.add_dup2(dev_null.as_raw_fd(), 0)?;
        actions.add_dup2(stdout.as_raw_fd(), 1)?;
        actions.add_dup2(stderr.as_raw_fd(), 2)?;
        let mut attr = PosixSpawnAttr::init()?;
        attr.set_flags(
            PosixSpawnFlags::POSIX_SPAWN_SETPGROUP
                | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
                | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
        )?;
        attr.set_pgroup(Pid::from_raw(0))?;
        attr.set_sigmask(&SigSet::empty())?;
        let mut defaults = SigSet::empty();
        for signal in RESET_SIGNALS {
            defaults.add(signal);
        }
        attr.set_sigdefault(&defaults)?;
        posix_spawn(c"/bin/sh", &actions, &attr, &args, &envp)
    };
    spawn().map(Pid::as_raw).map_err(|e| format!("posix_spawn of /bin/sh failed: {e}"))
}
