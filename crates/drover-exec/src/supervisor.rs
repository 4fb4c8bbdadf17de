//! The supervisor process: the small synchronous program that runs a job's
//! commands and makes sure nothing the job started outlives it.
//!
//! Supervisors are forked by the zygote (the `zygote` module) and **reused**:
//! each runs [`serve`], which takes jobs from the zygote one at a time (a
//! start request on its socket: the job's spec and its three pipes) and,
//! after each, tells the zygote the job's exit code and waits for the next.
//!
//! Once, when forked, a supervisor blocks SIGTERM, SIGINT, SIGHUP and
//! SIGCHLD and reads them from a `signalfd` (no signal handler, so no
//! `unsafe`); starts a new session (`setsid`); becomes a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so every orphaned descendant — including one
//! that called `setsid` or `setpgid` to leave the job's process group — is
//! reparented to it; and notes its working directory and what its commands
//! would inherit from it that someone else could change (`Inherited`).
//! Then, for each job:
//!
//! 1. drops any signal left pending since the last job (between jobs there is
//!    no job to stop); decodes the [`JobSpec`] (JSON, sent by the worker),
//!    writes `ready` on the job's output pipe, and runs the commands one by
//!    one (`/bin/sh -c`, or the program itself for a plain command: see the
//!    `plain` module), with `posix_spawn`, so that they start with an empty
//!    signal mask and default dispositions, and with the job's pipes and
//!    `/dev/null` as their only descriptors, each in its own process group,
//!    stopping at the first that fails; the commands' standard output and
//!    error are pipes the supervisor copies to the log files as the bytes
//!    arrive, creating each file (and its directory) on its first byte, so a
//!    job that prints nothing costs no file, and keeping within the spec's
//!    `log_limit` (its head as it comes, its tail once the job is over);
//! 2. on a stop request (`T` on the control pipe, SIGTERM/SIGINT/SIGHUP, or
//!    end of file on the control pipe, i.e. the worker dropped the job or is
//!    gone) sends SIGTERM then SIGCONT to the running command's process group
//!    and to every descendant of the supervisor found in `/proc` (by parent
//!    links from every process's `/proc/<pid>/stat`), waits up to
//!    [`JobSpec::kill_grace`] for them to exit, then SIGKILLs every
//!    descendant, sweep after sweep, until it has no child left (a process
//!    whose parent is killed is reparented to the supervisor, and found by the
//!    next sweep);
//! 3. when the commands are done, treats every process still alive the same
//!    way (a job leaves no daemon behind, and nothing of it is left for the
//!    next job), reaps every child (`waitpid(-1)`) until it has none,
//!    copies what is left in the log pipes, writes the [`JobReport`] on the
//!    output pipe as one line (`report ` and JSON) after `ready`, closes the
//!    job's pipes (the worker sees end of file) and returns to the working
//!    directory it was forked in;
//! 4. tells the zygote the job's exit code (one of the `EXIT_*` codes) and
//!    waits for the next job.
//!
//! A supervisor that cannot vouch for a clean slate is not reused: it exits
//! with the job's exit code instead (which the zygote reports as it reaps
//! it), when it failed ([`EXIT_SUPERVISOR_ERROR`]: a bad request or spec, the
//! report not sent, so also whenever it did not write `ready`), when a
//! process of the job refused to die, when it cannot return to its working
//! directory, or when something changed what its commands inherit from it
//! (resource limits, nice value, scheduling policy, CPU affinity, signal mask
//! and dispositions: say a job's `prlimit --pid $PPID`). Nothing else of a
//! job stays in the process: it changes no environment variable, umask or
//! signal disposition of its own, opens every descriptor close-on-exec and
//! closes it with the job, and keeps no state between jobs.
//!
//! The control pipe carries one byte per request from the worker: `S` (job
//! suspended: start no new command, stop every descendant), `R` (job resumed:
//! continue every descendant) and `T` (stop the job, as above). Bytes are
//! read in order, so a quick suspend/resume/suspend ends suspended. Requests
//! go through the job's own pipe rather than as signals to the supervisor's
//! pid because the pid serves one job after another: a request that comes
//! late finds the pipe closed instead of reaching the next job.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CpuSet, sched_getaffinity};
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::resource::{Resource, getrlimit};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{MsgFlags, send};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::plain;
use crate::procfs;
use crate::spec::{JobReport, JobSpec};
use crate::sys;
use crate::zygote::{INLINE_LIMIT, REQUEST_HEADER, Reply, START_INLINE, START_SPEC_FILE};

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

/// The line the supervisor writes on the job's output pipe once it handles
/// signals and control requests.
pub(crate) const READY_LINE: &str = "ready";

/// What starts the line that carries the [`JobReport`] (JSON follows), the
/// supervisor's last words on the job's output pipe.
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
/// The most a log over its limit keeps of its end (see
/// [`JobSpec::log_limit`]).
const LOG_TAIL: u64 = 1 << 20;

/// Runs a supervisor forked by the zygote, until the zygote closes `socket`
/// (it has no more use for this supervisor, or is gone) or a job leaves the
/// process unfit for another (see the module documentation); returns the
/// process's exit code: 0, or the last job's `EXIT_*` code.
///
/// Standard input and output must be `/dev/null`, and standard error where
/// the supervisor's own messages go between jobs; `socket` and those must
/// be the only open descriptors. The process must have a single thread,
/// since signals are blocked for the calling thread only.
pub(crate) fn serve(socket: &OwnedFd) -> i32 {
    let mut process = match Process::new() {
        Ok(process) => process,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "drover-exec supervisor: {message}");
            return EXIT_SUPERVISOR_ERROR;
        }
    };
    let mut buf = vec![0u8; REQUEST_HEADER + INLINE_LIMIT + 1];
    loop {
        let received = match sys::recv_with_fds(socket.as_fd(), &mut buf) {
            Ok(received) => received,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                let _ =
                    writeln!(std::io::stderr(), "drover-exec supervisor: cannot read from the zygote: {e}");
                return EXIT_SUPERVISOR_ERROR;
            }
        };
        if received.len == 0 && received.fds.is_empty() {
            return 0;
        }
        let ended = process.job(&buf[..received.len], received.truncated, received.fds);
        if !ended.reusable {
            return ended.code;
        }
        let done = Reply::Exited(ended.code).encode(0);
        if send(socket.as_raw_fd(), &done, MsgFlags::MSG_NOSIGNAL).is_err() {
            // The zygote is gone: nobody will send another job.
            return ended.code;
        }
    }
}

/// How a job ended for the supervisor.
#[derive(Debug, Clone, Copy)]
struct Ended {
    /// Its `EXIT_*` code.
    code: i32,
    /// Whether the supervisor may run another job.
    reusable: bool,
}

/// What a supervisor keeps from one job to the next.
#[derive(Debug)]
struct Process {
    me: i32,
    /// SIGTERM, SIGINT, SIGHUP and SIGCHLD (blocked).
    signals: SignalFd,
    /// The directory the supervisor was forked in, returned to after each job.
    home: OwnedFd,
    /// What the commands inherit, as it was when the supervisor started.
    inherited: Inherited,
    /// Where to read it again after each job.
    proc_files: ProcFiles,
}

/// The job's pipes, from the worker: closed when the job ends.
#[derive(Debug)]
struct JobIo {
    /// The read end of the control pipe (taken by the running job).
    control: Option<File>,
    /// Where `ready` and the report go.
    out: File,
    /// Where the supervisor's own messages about the job go.
    err: File,
}

impl Process {
    fn new() -> Result<Process, String> {
        // Signals first: until they are blocked, a SIGTERM would kill us outright
        // (harmless only because no job is started yet).
        let mut mask = SigSet::empty();
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
            mask.add(signal);
        }
        mask.thread_block().map_err(|e| format!("cannot block signals: {e}"))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| format!("cannot create a signalfd: {e}"))?;
        // A new session also detaches the jobs from the worker's terminal.
        // This fails only if we already lead a process group; we then keep it.
        let _ = nix::unistd::setsid();
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let home = nix::fcntl::open(".", flags, Mode::empty())
            .map_err(|e| format!("cannot open the working directory: {e}"))?;
        let proc_files = ProcFiles::open().map_err(|e| format!("cannot open /proc/self: {e}"))?;
        let inherited = Inherited::now(&proc_files).ok_or("cannot read the process's attributes")?;
        Ok(Process { me: std::process::id() as i32, signals, home, inherited, proc_files })
    }

    /// Runs the job of one start request (see the `zygote` module), and
    /// leaves the process as it found it if it can.
    fn job(&mut self, message: &[u8], truncated: bool, mut fds: Vec<OwnedFd>) -> Ended {
        let failed = Ended { code: EXIT_SUPERVISOR_ERROR, reusable: false };
        let kind = message.first().copied();
        let spec_file = if kind == Some(START_SPEC_FILE) { fds.pop() } else { None };
        let Ok([control, out, err]) = <[OwnedFd; 3]>::try_from(fds) else {
            let _ =
                writeln!(std::io::stderr(), "drover-exec supervisor: a malformed request from the zygote");
            return failed;
        };
        let mut io = JobIo { control: Some(File::from(control)), out: File::from(out), err: File::from(err) };
        let spec_json = match (kind, spec_file) {
            _ if truncated || message.len() < REQUEST_HEADER => Err("a malformed request".to_owned()),
            (Some(START_INLINE), None) => Ok(message[REQUEST_HEADER..].to_vec()),
            (Some(START_SPEC_FILE), Some(fd)) => read_spec_file(fd),
            _ => Err("a malformed request".to_owned()),
        };
        // Whatever was signalled since the last job was about no job.
        while let Ok(Some(_)) = self.signals.read_signal() {}
        let mut clean = false;
        let code = match spec_json.and_then(|json| self.run(&json, &mut io, &mut clean)) {
            Ok(code) => code,
            Err(message) => {
                let _ = writeln!(io.err, "drover-exec supervisor: {message}");
                EXIT_SUPERVISOR_ERROR
            }
        };
        // End of file for the worker, and no descriptor of the job left.
        drop(io);
        let home = nix::unistd::fchdir(&self.home).is_ok();
        let same = Inherited::now(&self.proc_files).is_some_and(|now| now == self.inherited);
        Ended { code, reusable: code != EXIT_SUPERVISOR_ERROR && clean && home && same }
    }

    /// Runs the job; sets `clean` if it left no process behind.
    fn run(&mut self, spec_json: &[u8], io: &mut JobIo, clean: &mut bool) -> Result<i32, String> {
        let mut spec: JobSpec =
            serde_json::from_slice(spec_json).map_err(|e| format!("bad job spec: {e}"))?;
        // The supervisor changes directory to run commands: pin relative paths
        // to the directory it was forked in (the worker sends absolute ones).
        for path in [&mut spec.cwd, &mut spec.stdout, &mut spec.stderr] {
            *path = std::path::absolute(&*path).map_err(|e| format!("bad path {}: {e}", path.display()))?;
        }
        let logs = Logs::new(&spec)?;
        io.out
            .write_all(format!("{READY_LINE}\n").as_bytes())
            .map_err(|e| format!("cannot report ready: {e}"))?;

        let mut sup = Supervisor {
            me: self.me,
            signals: &self.signals,
            control: io.control.take(),
            stop_requests: 0,
            held: false,
            current: None,
            current_status: None,
            no_children: false,
            grace: spec.kill_grace,
            killed_after: None,
            logs,
        };
        let report = sup.run_job(&spec);
        *clean = sup.no_children;
        drop(sup);
        send_report(&mut io.out, &report)?;
        Ok(exit_code(&report))
    }
}

/// Reads a spec sent in a file (too long for a message).
fn read_spec_file(fd: OwnedFd) -> Result<Vec<u8>, String> {
    let mut file = File::from(fd);
    let mut json = Vec::new();
    file.rewind()
        .and_then(|()| file.read_to_end(&mut json))
        .map_err(|e| format!("cannot read the job spec: {e}"))?;
    Ok(json)
}

/// What a supervisor's commands inherit from it that another process of the
/// same user can change from outside (the supervisor itself changes none of
/// it): resource limits (`prlimit`), CPU affinity (`taskset -p`), and, from
/// `/proc/self/stat`, the signal mask and dispositions and the scheduling
/// (nice value, real-time priority, policy; `renice`, `chrt -p`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inherited {
    limits: Vec<(u64, u64)>,
    affinity: CpuSet,
    stat: Vec<String>,
    /// `/proc/self/oom_score_adj` (a job may raise its parent's).
    oom_score_adj: String,
    /// The I/O priority (a job may lower its parent's with `ionice -p`).
    io_priority: i64,
    /// `/proc/self/cgroup` (a job allowed to may move its parent).
    cgroup: String,
}

/// Every resource limit of Linux.
const RESOURCES: [Resource; 16] = [
    Resource::RLIMIT_AS,
    Resource::RLIMIT_CORE,
    Resource::RLIMIT_CPU,
    Resource::RLIMIT_DATA,
    Resource::RLIMIT_FSIZE,
    Resource::RLIMIT_LOCKS,
    Resource::RLIMIT_MEMLOCK,
    Resource::RLIMIT_MSGQUEUE,
    Resource::RLIMIT_NICE,
    Resource::RLIMIT_NOFILE,
    Resource::RLIMIT_NPROC,
    Resource::RLIMIT_RSS,
    Resource::RLIMIT_RTPRIO,
    Resource::RLIMIT_RTTIME,
    Resource::RLIMIT_SIGPENDING,
    Resource::RLIMIT_STACK,
];

/// The supervisor's own `/proc/self` files that [`Inherited`] reads, kept
/// open: each read from offset 0 renders the file anew, without the path
/// walk, open and close of reading it by name after every job.
#[derive(Debug)]
struct ProcFiles {
    stat: std::fs::File,
    oom_score_adj: std::fs::File,
    cgroup: std::fs::File,
}

impl ProcFiles {
    fn open() -> std::io::Result<ProcFiles> {
        let open = |name: &str| std::fs::File::open(format!("/proc/self/{name}"));
        Ok(ProcFiles { stat: open("stat")?, oom_score_adj: open("oom_score_adj")?, cgroup: open("cgroup")? })
    }
}

/// The whole of an open `/proc` file, read from its start. A read that
/// does not fill the buffer got the rest of the file (`/proc` files fill
/// what they are asked for while they have more): no read just to see the
/// end, which would render the file once more.
fn read_whole(file: &std::fs::File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match file.read_at(&mut buf, out.len() as u64) {
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if n < buf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

impl Inherited {
    /// The calling process's, its `/proc/self` files read through
    /// `files`; `None` if something cannot be read.
    fn now(files: &ProcFiles) -> Option<Inherited> {
        let limits = RESOURCES.iter().map(|r| getrlimit(*r).ok()).collect::<Option<Vec<_>>>()?;
        let affinity = sched_getaffinity(Pid::from_raw(0)).ok()?;
        let stat = procfs::inherited_fields(&read_whole(&files.stat)?)?;
        let oom_score_adj = read_whole(&files.oom_score_adj)?;
        let io_priority = crate::sys::io_priority().ok()?;
        let cgroup = read_whole(&files.cgroup)?;
        Some(Inherited { limits, affinity, stat, oom_score_adj, io_priority, cgroup })
    }
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

/// Sends the report to the worker: one line on the job's output pipe, in
/// one write (the worker reads everything up to end of file, which comes
/// when the supervisor closes the pipe at the job's end).
fn send_report(out: &mut File, report: &JobReport) -> Result<(), String> {
    let json = serde_json::to_string(report).map_err(|e| format!("cannot encode the report: {e}"))?;
    let line = format!("{REPORT_PREFIX}{json}\n");
    out.write_all(line.as_bytes()).map_err(|e| format!("cannot send the report: {e}"))
}

/// How far into a log's kept end [`Log::finish`] looks for the end of the
/// line the cut fell in.
const LINE_SEARCH: usize = 4096;

/// One log of the job: the pipe its commands write to, and the file the
/// supervisor copies the pipe to, opened (created, with its directory, if
/// missing; appended to) on the first byte. Past its limit, the file gets
/// no more bytes; the latest ones are kept aside and written after a line
/// saying what was dropped, once the job is over ([`Log::finish`]).
#[derive(Debug)]
struct Log {
    path: PathBuf,
    /// Bytes that go to the file as they come.
    head: u64,
    /// Bytes of the end kept aside past the head.
    tail_size: usize,
    written: u64,
    /// What came past the head: at most `tail_size` of the latest bytes.
    tail: std::collections::VecDeque<u8>,
    /// Bytes that came past the head and were pushed out of the tail.
    dropped: u64,
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
    fn new(path: &Path, limit: Option<u64>) -> Result<Log, String> {
        let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot create a log pipe: {e}"))?;
        let reader = File::from(std::os::fd::OwnedFd::from(reader));
        fcntl(&reader, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| format!("cannot make a log pipe non-blocking: {e}"))?;
        let writer = File::from(std::os::fd::OwnedFd::from(writer));
        let limit = limit.unwrap_or(u64::MAX);
        let tail_size = (limit / 4).min(LOG_TAIL);
        Ok(Log {
            path: path.to_owned(),
            head: limit - tail_size,
            tail_size: tail_size as usize,
            written: 0,
            tail: std::collections::VecDeque::new(),
            dropped: 0,
            reader,
            writer,
            file: None,
            error: None,
        })
    }

    /// Writes what was kept of the end of a log over its limit, after a
    /// line saying how much was dropped before it. Called once the job is
    /// over.
    fn finish(&mut self) {
        if self.tail.is_empty() && self.dropped == 0 {
            return;
        }
        let mut tail: Vec<u8> = std::mem::take(&mut self.tail).into();
        // The kept end starts at a line's start: the partial line the cut
        // fell in (if it ends within a few KiB) is dropped with the rest.
        if self.dropped > 0
            && let Some(newline) = tail.iter().take(LINE_SEARCH).position(|&b| b == b'\n')
        {
            tail.drain(..=newline);
            self.dropped += newline as u64 + 1;
        }
        if self.dropped > 0 {
            let line = format!(
                "\n[drover: this log passed its limit of {} bytes: {} bytes were dropped here; its last {} bytes follow]\n",
                self.head + self.tail_size as u64,
                self.dropped,
                tail.len()
            );
            self.append(line.as_bytes());
        }
        self.append(&tail);
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

    /// Appends to the file up to the head's size; past it, keeps the latest
    /// bytes aside for [`Log::finish`].
    fn write(&mut self, bytes: &[u8]) {
        let room = self.head.saturating_sub(self.written).min(bytes.len() as u64) as usize;
        let (now, later) = bytes.split_at(room);
        if !now.is_empty() {
            self.written += now.len() as u64;
            self.append(now);
        }
        if later.is_empty() {
            return;
        }
        self.tail.extend(later);
        let over = self.tail.len().saturating_sub(self.tail_size);
        self.tail.drain(..over);
        self.dropped += over as u64;
    }

    /// Appends to the file, opening it first if needed.
    fn append(&mut self, bytes: &[u8]) {
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
        let stdout = Log::new(&spec.stdout, spec.log_limit)?;
        let stderr =
            if spec.stderr == spec.stdout { None } else { Some(Log::new(&spec.stderr, spec.log_limit)?) };
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

/// One job's run.
#[derive(Debug)]
struct Supervisor<'p> {
    me: i32,
    signals: &'p SignalFd,
    /// The job's control pipe, until end of file.
    control: Option<File>,
    /// Stop requests received so far (signals, `T` on the control pipe, or
    /// the worker going away).
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
    /// How long after SIGTERM the processes of the job that outlived it
    /// were SIGKILLed, if any did (see `JobReport::killed_after_ms`).
    killed_after: Option<Duration>,
    logs: Logs,
}

impl Supervisor<'_> {
    fn run_job(&mut self, spec: &JobSpec) -> JobReport {
        let mut report = self.run_commands(spec);
        // Whatever happened, no process of the job is left to write: copy
        // what the log pipes still hold.
        for log in self.logs.each() {
            log.drain(LOG_READS_AT_END);
            log.finish();
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
                Ok(Started::Running(pid)) => pid,
                Ok(Started::Failed(code, line)) => {
                    self.log(&line);
                    report.duration_ms.push(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
                    report.exit_code = Some(code);
                    break;
                }
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
        report.killed_after_ms =
            self.killed_after.map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
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
        let terminated = Instant::now();
        // No deadline if the grace period is too long to represent.
        let deadline = terminated.checked_add(self.grace);
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
        self.killed_after = Some(terminated.elapsed());
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
                        b'T' => self.stop_requests += 1,
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

/// How starting a command went.
#[derive(Debug)]
enum Started {
    /// It runs: its pid (also its process group).
    Running(i32),
    /// A plain command whose program could not run, counted as the shell
    /// would count it: the exit code (127 not found, 126 not executable)
    /// and the line for standard error.
    Failed(i32, String),
}

/// Starts a command in `cwd` with exactly `env` (see [`spawn`]): a plain
/// one (see the `plain` module) as its program directly, any other as
/// `/bin/sh -c <command>`.
///
/// The supervisor, which is single-threaded, moves into `cwd` itself (and
/// back to its own directory once the job is over): `posix_spawn` has no
/// working directory attribute (short of a glibc extension nix does not
/// wrap).
fn spawn_command(
    command: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
    stdout: &File,
    stderr: &File,
) -> Result<Started, String> {
    let cstring = |s: String| CString::new(s).map_err(|_| "it contains a NUL byte".to_owned());
    std::env::set_current_dir(cwd).map_err(|e| {
        if cwd.is_dir() {
            format!("cannot enter working directory {}: {e}", cwd.display())
        } else {
            format!("working directory {} does not exist or is not a directory", cwd.display())
        }
    })?;
    let dev_null = File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    let io = [&dev_null, stdout, stderr];

    if let Some(words) = plain::words(command) {
        let program = words[0];
        let args = words.iter().map(|w| cstring((*w).to_owned())).collect::<Result<Vec<_>, _>>()?;
        let mut env = env.clone();
        if let Some(pwd) = working_directory(env.get("PWD")) {
            env.insert("PWD".to_owned(), pwd);
        }
        let envp = env_strings(&env)?;
        let mut refused = None;
        for candidate in plain::candidates(program, env.get("PATH").map_or("", String::as_str)) {
            let path =
                CString::new(candidate.into_os_string().into_vec()).map_err(|_| "a path with a NUL byte")?;
            match spawn(&path, &args, &envp, io) {
                Ok(pid) => return Ok(Started::Running(pid.as_raw())),
                // Neither a binary nor a `#!` script: the shell runs it.
                Err(Errno::ENOEXEC) => return spawn_shell(command, envp, io),
                Err(Errno::ENOENT | Errno::ENOTDIR) => {}
                Err(e) => refused = Some(e),
            }
        }
        // As dash counts it: 126 for a path that cannot run, 127 for a name
        // no directory of `PATH` has a runnable file for.
        let path = env.get("PATH").map_or("", String::as_str);
        return Ok(match refused {
            Some(e) if program.contains('/') => {
                Started::Failed(126, format!("drover: {program}: {}", e.desc()))
            }
            Some(e) => Started::Failed(127, format!("drover: {program}: {} (PATH={path})", e.desc())),
            None if program.contains('/') => Started::Failed(127, format!("drover: {program}: not found")),
            None => Started::Failed(127, format!("drover: {program}: not found (PATH={path})")),
        });
    }
    spawn_shell(command, env_strings(env)?, io)
}

/// `name=value` strings for `env`.
fn env_strings(env: &BTreeMap<String, String>) -> Result<Vec<CString>, String> {
    env.iter()
        .map(|(k, v)| {
            CString::new(format!("{k}={v}")).map_err(|_| "the environment contains a NUL byte".to_owned())
        })
        .collect()
}

/// Starts `/bin/sh -c <command>`.
fn spawn_shell(command: &str, envp: Vec<CString>, io: [&File; 3]) -> Result<Started, String> {
    let command = CString::new(command).map_err(|_| "it contains a NUL byte".to_owned())?;
    let args = [c"/bin/sh".to_owned(), c"-c".to_owned(), command];
    spawn(c"/bin/sh", &args, &envp, io)
        .map(|pid| Started::Running(pid.as_raw()))
        .map_err(|e| format!("posix_spawn of /bin/sh failed: {e}"))
}

/// `PWD` for a command the supervisor starts itself, as the shell would set
/// it: the given one if it is an absolute name of the working directory,
/// else the working directory's physical path (`None`: leave it as given,
/// the working directory has no name to give).
fn working_directory(given: Option<&String>) -> Option<String> {
    let same = |a: &Path, b: &Path| match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    match given {
        Some(pwd) if Path::new(pwd).is_absolute() && same(Path::new(pwd), Path::new(".")) => {
            Some(pwd.clone())
        }
        _ => std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned()),
    }
}

/// Starts `path` with `args` and exactly `envp`, stdin, stdout and stderr
/// from `io`, in a process group of its own, with an empty signal mask and
/// default signal dispositions.
///
/// `posix_spawn` rather than `std::process::Command`: std makes children
/// inherit the parent's signal mask, and ours blocks SIGTERM (read from a
/// signalfd), which the commands must not inherit; resetting the mask in a
/// `pre_exec` hook would need `unsafe`. glibc's `posix_spawn` reports a
/// failed exec as its error.
fn spawn(path: &CStr, args: &[CString], envp: &[CString], io: [&File; 3]) -> Result<Pid, Errno> {
    let mut actions = PosixSpawnFileActions::init()?;
    for (fd, file) in (0..).zip(io) {
        actions.add_dup2(file.as_raw_fd(), fd)?;
    }
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
    posix_spawn(path, &actions, &attr, args, envp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole file comes back whatever its size against the buffer's, and
    /// an open `/proc/self` file reads the same as by name.
    #[test]
    fn read_whole_reads_every_byte_from_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        for len in [0, 1, 4095, 4096, 4097, 10_000] {
            let path = dir.path().join(format!("f{len}"));
            let data: String = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            std::fs::write(&path, &data).expect("write");
            let file = std::fs::File::open(&path).expect("open");
            assert_eq!(read_whole(&file).as_deref(), Some(data.as_str()), "{len} bytes");
            assert_eq!(read_whole(&file).as_deref(), Some(data.as_str()), "{len} bytes, read again");
        }
        let cgroup = std::fs::File::open("/proc/self/cgroup").expect("open");
        let by_name = std::fs::read_to_string("/proc/self/cgroup").expect("read");
        assert_eq!(read_whole(&cgroup), Some(by_name));
    }
}
