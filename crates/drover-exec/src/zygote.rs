//! The zygote: one long-lived, single-threaded helper process per
//! [`Supervisor`](crate::Supervisor) that keeps a pool of supervisor
//! processes and hands each job to one of them, instead of the worker
//! executing a (large) binary per job, or the zygote forking a process per
//! job.
//!
//! The worker starts it once, lazily, as `program args…` (see
//! [`Supervisor::new`](crate::Supervisor::new)), with one end of a
//! `SOCK_SEQPACKET` socket pair as its standard input; the program calls
//! [`zygote_main`] before it starts any thread. The zygote starts a session
//! of its own (so the terminal's signals go to the worker only), then serves
//! requests until end of file on the socket (the worker dropped its
//! [`Supervisor`](crate::Supervisor) and every job, or died), and exits.
//!
//! Protocol with the worker (every message is one datagram of the socket
//! pair; integers are little-endian):
//!
//! - **start** (worker → zygote): `kind: u8` (1: the job's [`JobSpec`] as
//!   JSON follows; 2: it is in the fourth descriptor), 7 zero bytes,
//!   `token: u64`, the JSON. It carries (`SCM_RIGHTS`) the read end of the
//!   job's control pipe, the write ends of the job's output and error
//!   pipes, and, for kind 2, a file holding the spec. The worker keeps the
//!   control pipe's write end alone (close-on-exec).
//! - **reply** (zygote → worker): `kind: u8`, 3 zero bytes, `value: i32`,
//!   `token: u64`. Kinds: 1 a supervisor took the job (value: its pid;
//!   supervisors are reused, so later jobs get the same pids); 2 the job
//!   ended (value: the supervisor's `EXIT_*` code); 3 the supervisor was
//!   killed during the job (value: signal); 4 no supervisor could take it
//!   (value: errno, of `fork` mostly); 5 the request was malformed. Every
//!   start gets 1 then 2 or 3, or 4, or 5.
//!
//! **The pool.** The zygote hands a start request to the supervisor that
//! became idle last (its pages are the warmest), and forks a new one only
//! when none is idle, so there are about as many supervisors as jobs ever
//! ran at once. A supervisor idle for [`IDLE_TIMEOUT`], beyond the
//! [`MAX_IDLE`] most recent, or after [`MAX_JOBS`] jobs, is let go: the
//! zygote closes its socket, and it exits.
//!
//! Each supervisor has a `SOCK_SEQPACKET` socket pair with the zygote, made
//! before the fork. The zygote forwards the start request on it as it
//! received it (the same bytes and descriptors), closes its own copies of
//! the job's descriptors at once (so the control pipe's only write end
//! stays in the worker: if the worker dies, the supervisor sees end of file
//! and stops the job), and answers 1 with the supervisor's pid. The
//! supervisor runs the job (the `supervisor` module), closes the job's
//! pipes, and sends back a reply of kind 2 (token 0) with the job's exit
//! code, which the zygote relays as the job's end before it counts the
//! supervisor idle. A supervisor that cannot be reused (see the
//! `supervisor` module) exits instead, and one may die (SIGKILL, the OOM
//! killer): the zygote reaps its children (SIGCHLD through a `signalfd`)
//! and answers a job whose supervisor exited during it with 2 and the exit
//! code or 3 and the signal, as the supervisor's exit status says; an idle
//! supervisor's exit is only forgotten. A supervisor that sends anything
//! else is SIGKILLed.
//!
//! A forked supervisor closes every descriptor it inherited from the zygote
//! but its own socket and standard error (the worker's socket, the other
//! supervisors' sockets, the `signalfd`), takes `/dev/null` as standard
//! input and output, and ends with `_exit` (the exit handlers and library
//! destructors are the zygote's, not to be run in every supervisor, where
//! they only fault in copy-on-write memory). When the zygote exits, every
//! idle supervisor sees end of file on its socket and exits; a busy one
//! exits after its job, as it cannot report it.
//!
//! [`JobSpec`]: crate::JobSpec

use std::collections::{BTreeMap, VecDeque};
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, getsockopt, recv, send, sendmsg, socketpair,
    sockopt,
};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use crate::supervisor::{self, EXIT_SUPERVISOR_ERROR};
use crate::{procfs, sys};

/// Start request: the spec's JSON is in the message.
pub(crate) const START_INLINE: u8 = 1;
/// Start request: the spec's JSON is in the fourth descriptor.
pub(crate) const START_SPEC_FILE: u8 = 2;
/// Length of a start request's header.
pub(crate) const REQUEST_HEADER: usize = 16;
/// Specs longer than this go in a file rather than in the message (a
/// datagram must fit the socket's send buffer).
pub(crate) const INLINE_LIMIT: usize = 64 * 1024;
/// Length of a reply.
pub(crate) const REPLY_LEN: usize = 16;

/// How long a supervisor may stay idle before the zygote lets it go.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most idle supervisors kept (the ones idle longest go first).
const MAX_IDLE: usize = 64;
/// Jobs one supervisor runs before the zygote lets it go (a bound on
/// anything that would build up in it, e.g. a fragmented heap).
const MAX_JOBS: u32 = 1000;

/// A reply from the zygote about one start request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A supervisor took the job; its pid.
    Started(i32),
    /// The job ended with this `EXIT_*` code.
    Exited(i32),
    /// The job's supervisor was killed by this signal.
    Signaled(i32),
    /// No supervisor could take the job: `fork` (or handing it over) failed
    /// with this errno.
    ForkFailed(i32),
    /// The request was malformed.
    BadRequest,
}

impl Reply {
    pub(crate) fn encode(self, token: u64) -> [u8; REPLY_LEN] {
        let (kind, value) = match self {
            Reply::Started(pid) => (1, pid),
            Reply::Exited(code) => (2, code),
            Reply::Signaled(signal) => (3, signal),
            Reply::ForkFailed(errno) => (4, errno),
            Reply::BadRequest => (5, 0),
        };
        let mut out = [0u8; REPLY_LEN];
        out[0] = kind;
        out[4..8].copy_from_slice(&value.to_le_bytes());
        out[8..16].copy_from_slice(&token.to_le_bytes());
        out
    }

    /// The reply and its token; `None` if the message is not a reply.
    pub(crate) fn decode(bytes: &[u8]) -> Option<(u64, Reply)> {
        if bytes.len() != REPLY_LEN {
            return None;
        }
        let value = i32::from_le_bytes(bytes[4..8].try_into().ok()?);
        let token = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
        let reply = match bytes[0] {
            1 => Reply::Started(value),
            2 => Reply::Exited(value),
            3 => Reply::Signaled(value),
            4 => Reply::ForkFailed(value),
            5 => Reply::BadRequest,
            _ => return None,
        };
        Some((token, reply))
    }
}

/// The header of a start request.
pub(crate) fn request_header(kind: u8, token: u64) -> [u8; REQUEST_HEADER] {
    let mut out = [0u8; REQUEST_HEADER];
    out[0] = kind;
    out[8..16].copy_from_slice(&token.to_le_bytes());
    out
}

/// Entry point of the zygote process; returns its exit code.
///
/// The zygote is started as `program args…` (see
/// [`Supervisor::new`](crate::Supervisor::new)), with the worker's socket as
/// its standard input. Call it from `main`, before the program starts any
/// thread (a tokio runtime, say), and exit with the code it returns:
///
/// ```ignore
/// if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
///     std::process::exit(drover_exec::zygote_main());
/// }
/// ```
///
/// It returns 0 once the worker has closed the socket, and
/// [`EXIT_SUPERVISOR_ERROR`] (with a message on standard error) if it cannot
/// serve.
pub fn zygote_main() -> i32 {
    match Zygote::new().and_then(Zygote::serve) {
        Ok(()) => 0,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "drover-exec zygote: {message}");
            EXIT_SUPERVISOR_ERROR
        }
    }
}

#[derive(Debug)]
struct Zygote {
    /// The worker's socket: standard input, and no other descriptor.
    socket: std::io::Stdin,
    /// SIGCHLD.
    signals: SignalFd,
    /// Supervisors running a job, by pid.
    busy: BTreeMap<i32, Busy>,
    /// Supervisors waiting for a job.
    idle: Pool<Member>,
}

/// One supervisor, and the zygote's end of its socket.
#[derive(Debug)]
struct Member {
    pid: i32,
    socket: OwnedFd,
    /// Jobs it was given so far.
    jobs: u32,
}

/// A supervisor running a job.
#[derive(Debug)]
struct Busy {
    member: Member,
    /// The job's start request.
    token: u64,
    /// Its socket reached end of file (it is exiting): not polled any more.
    closed: bool,
}

impl Zygote {
    fn new() -> Result<Zygote, String> {
        let socket = std::io::stdin();
        match getsockopt(&socket.as_fd(), sockopt::SockType) {
            Ok(SockType::SeqPacket) => {}
            _ => return Err("standard input must be the worker's SOCK_SEQPACKET socket".to_owned()),
        }
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        mask.thread_block().map_err(|e| format!("cannot block SIGCHLD: {e}"))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| format!("cannot create a signalfd: {e}"))?;
        // Out of the worker's process group and terminal: a Ctrl-C is the
        // worker's to handle (it stops the jobs), not ours.
        let _ = nix::unistd::setsid();
        Ok(Zygote { socket, signals, busy: BTreeMap::new(), idle: Pool::new(IDLE_TIMEOUT, MAX_IDLE) })
    }

    fn serve(mut self) -> Result<(), String> {
        let mut buf = vec![0u8; REQUEST_HEADER + INLINE_LIMIT + 1];
        loop {
            // Idle supervisors let go see end of file and exit.
            drop(self.idle.expire(Instant::now()));
            let timeout = match self.idle.next_expiry() {
                // In whole milliseconds, rounded up, so as not to wake just
                // before the expiry.
                Some(at) => {
                    let ms = at.saturating_duration_since(Instant::now()).as_millis() + 1;
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
                }
                None => PollTimeout::NONE,
            };
            let (socket_ready, signal_ready, done) = {
                let mut fds = vec![
                    PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                ];
                let polled: Vec<i32> =
                    self.busy.iter().filter(|(_, b)| !b.closed).map(|(pid, _)| *pid).collect();
                fds.extend(
                    self.busy
                        .values()
                        .filter(|b| !b.closed)
                        .map(|b| PollFd::new(b.member.socket.as_fd(), PollFlags::POLLIN)),
                );
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(format!("poll failed: {e}")),
                }
                let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
                let done: Vec<i32> = polled
                    .into_iter()
                    .zip(&fds[2..])
                    .filter(|(_, fd)| ready(fd))
                    .map(|(pid, _)| pid)
                    .collect();
                (ready(&fds[0]), ready(&fds[1]), done)
            };
            for pid in done {
                self.job_done(pid)?;
            }
            if signal_ready {
                self.reap()?;
            }
            if socket_ready {
                let received = match sys::recv_with_fds(self.socket.as_fd(), &mut buf) {
                    Ok(received) => received,
                    Err(Errno::EINTR | Errno::EAGAIN) => continue,
                    // The worker exited without reading our last reply
                    // (interrupted, killed): gone, as on end of file below.
                    Err(Errno::ECONNRESET) => return Ok(()),
                    Err(e) => return Err(format!("cannot read from the worker: {e}")),
                };
                if received.len == 0 && received.fds.is_empty() {
                    // The worker is gone, or done with us. Our supervisors see
                    // end of file on their control pipes if it is gone, and on
                    // their sockets once we exit.
                    return Ok(());
                }
                self.start(&buf[..received.len], received.truncated, received.fds)?;
            }
        }
    }

    /// A busy supervisor's socket is readable: the job's end, or end of file.
    fn job_done(&mut self, pid: i32) -> Result<(), String> {
        let Some(busy) = self.busy.get_mut(&pid) else { return Ok(()) };
        match receive_done(&busy.member.socket) {
            Received::Nothing => Ok(()),
            Received::Closed => {
                // It is exiting: the exit status tells how the job ended.
                busy.closed = true;
                Ok(())
            }
            Received::Garbage => {
                // Not to be trusted with this job or another: its exit
                // status (SIGKILL) ends the job.
                busy.closed = true;
                let _ = procfs::signal_pid(pid, Signal::SIGKILL);
                Ok(())
            }
            Received::Done(code) => {
                let Some(Busy { mut member, token, .. }) = self.busy.remove(&pid) else { return Ok(()) };
                member.jobs += 1;
                if member.jobs < MAX_JOBS {
                    drop(self.idle.push(member, Instant::now()));
                }
                self.reply(token, Reply::Exited(code))
            }
        }
    }

    /// Reaps every exited child: reports the end of the job of a busy one,
    /// forgets an idle one.
    fn reap(&mut self) -> Result<(), String> {
        while let Ok(Some(_)) = self.signals.read_signal() {}
        loop {
            let (pid, status) = match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Reply::Exited(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, Reply::Signaled(signal as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(()),
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("waitpid failed: {e}")),
            };
            let pid = pid.as_raw();
            if let Some(busy) = self.busy.remove(&pid) {
                // The end of the job it sent before it died stands.
                let reply = match receive_done(&busy.member.socket) {
                    Received::Done(code) if !busy.closed => Reply::Exited(code),
                    _ => status,
                };
                self.reply(busy.token, reply)?;
            } else {
                drop(self.idle.remove(|member| member.pid == pid));
            }
        }
    }

    fn reply(&self, token: u64, reply: Reply) -> Result<(), String> {
        let message = reply.encode(token);
        loop {
            match send(self.socket.as_fd().as_raw_fd(), &message, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => {}
                // The worker is gone: the next read of its socket ends the
                // zygote.
                Err(Errno::EPIPE | Errno::ECONNRESET) => return Ok(()),
                Err(e) => return Err(format!("cannot write to the worker: {e}")),
            }
        }
    }

    /// Handles one start request: hands it to an idle supervisor, or to a
    /// new one.
    fn start(&mut self, message: &[u8], truncated: bool, fds: Vec<OwnedFd>) -> Result<(), String> {
        let Some(header) = message.get(..REQUEST_HEADER) else {
            let _ = writeln!(std::io::stderr(), "drover-exec zygote: ignored a short message");
            return Ok(());
        };
        let kind = header[0];
        let token = u64::from_le_bytes(header[8..16].try_into().map_err(|_| "bad header")?);
        let wanted = match kind {
            START_INLINE => 3,
            START_SPEC_FILE => 4,
            _ => 0,
        };
        if truncated || wanted == 0 || fds.len() != wanted {
            return self.reply(token, Reply::BadRequest);
        }
        loop {
            let (member, fresh) = match self.idle.pop() {
                Some(member) => (member, false),
                None => match self.fork_supervisor() {
                    Ok(member) => (member, true),
                    Err(Forked::Failed(errno)) => return self.reply(token, Reply::ForkFailed(errno as i32)),
                    Err(Forked::Fatal(message)) => return Err(message),
                },
            };
            match hand_over(&member.socket, message, &fds) {
                Ok(()) => {
                    let pid = member.pid;
                    self.busy.insert(pid, Busy { member, token, closed: false });
                    // The worker's pipes are the supervisor's alone now.
                    drop(fds);
                    return self.reply(token, Reply::Started(pid));
                }
                // A new supervisor that cannot take a job: the job fails
                // (and the supervisor, its socket closed, exits).
                Err(errno) if fresh => return self.reply(token, Reply::ForkFailed(errno as i32)),
                // An idle one died (its exit is not reaped yet) or is
                // unusable: let it go, try the next.
                Err(_) => drop(member),
            }
        }
    }

    /// Forks a supervisor, with a socket pair between it and us.
    fn fork_supervisor(&self) -> Result<Member, Forked> {
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(Forked::Failed)?;
        match sys::fork_single_threaded() {
            Ok(ForkResult::Child) => {
                // Never returns to the loop: the child is a supervisor now.
                let code =
                    std::panic::catch_unwind(|| run_supervisor(&theirs)).unwrap_or(EXIT_SUPERVISOR_ERROR);
                sys::exit_now(code);
            }
            Ok(ForkResult::Parent { child }) => Ok(Member { pid: child.as_raw(), socket: ours, jobs: 0 }),
            Err(sys::ForkError::Fork(errno)) => Err(Forked::Failed(errno)),
            Err(e @ sys::ForkError::Threads(_)) => Err(Forked::Fatal(e.to_string())),
        }
    }
}

/// Why [`Zygote::fork_supervisor`] did not fork.
#[derive(Debug)]
enum Forked {
    /// This time (say the process limit): the job fails.
    Failed(Errno),
    /// For good: the zygote cannot serve.
    Fatal(String),
}

/// What a busy supervisor's socket held.
#[derive(Debug)]
enum Received {
    /// Nothing yet.
    Nothing,
    /// End of file (or an error): the supervisor is exiting.
    Closed,
    /// The job's end, with its exit code.
    Done(i32),
    /// Not a message a supervisor sends.
    Garbage,
}

/// Reads the message a supervisor sends at the end of a job, if it is there.
fn receive_done(socket: &OwnedFd) -> Received {
    let mut buf = [0u8; REPLY_LEN + 1];
    loop {
        return match recv(socket.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => Received::Closed,
            Ok(n) => match Reply::decode(&buf[..n]) {
                Some((_, Reply::Exited(code))) => Received::Done(code),
                _ => Received::Garbage,
            },
            Err(Errno::EAGAIN) => Received::Nothing,
            Err(Errno::EINTR) => continue,
            Err(_) => Received::Closed,
        };
    }
}

/// Forwards a start request to an idle supervisor, with its descriptors.
fn hand_over(socket: &OwnedFd, message: &[u8], fds: &[OwnedFd]) -> Result<(), Errno> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let iov = [IoSlice::new(message)];
    let rights = [ControlMessage::ScmRights(&raw)];
    loop {
        // Never blocks: an idle supervisor's queue is empty, and a message
        // the worker could send fits our buffer too.
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        match sendmsg::<()>(socket.as_raw_fd(), &iov, &rights, flags, None) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// In a forked child: keeps nothing of the zygote's but standard error, and
/// serves as a supervisor on `socket`; returns the exit code.
fn run_supervisor(socket: &OwnedFd) -> i32 {
    // Every other descriptor belongs to the zygote: the worker's socket, the
    // other supervisors' sockets, the signalfd, a start request's pipes.
    // Their owners are in the zygote's stack frames, which this process
    // leaves only by `_exit`, so none is closed twice.
    let keep = [socket.as_raw_fd(), 0, 1, 2];
    let open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drover-exec supervisor: cannot list its descriptors: {e}");
            return EXIT_SUPERVISOR_ERROR;
        }
    };
    for fd in open.into_iter().filter(|fd| !keep.contains(fd)) {
        // EBADF for the directory listing's own, closed already.
        let _ = nix::unistd::close(fd);
    }
    // Standard input (the worker's socket) and output become /dev/null.
    let null = match std::fs::File::open("/dev/null") {
        Ok(null) => null,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "drover-exec supervisor: cannot open /dev/null: {e}");
            return EXIT_SUPERVISOR_ERROR;
        }
    };
    if let Err(e) = nix::unistd::dup2_stdin(&null).and_then(|()| nix::unistd::dup2_stdout(&null)) {
        let _ = writeln!(std::io::stderr(), "drover-exec supervisor: cannot use /dev/null: {e}");
        return EXIT_SUPERVISOR_ERROR;
    }
    drop(null);
    supervisor::serve(socket)
}

/// Idle members, oldest first. [`pop`](Self::pop) takes the one idle
/// since last; the oldest go once idle for `timeout`, or to keep at most
/// `max`.
#[derive(Debug)]
struct Pool<T> {
    members: VecDeque<(T, Instant)>,
    timeout: Duration,
    max: usize,
}

impl<T> Pool<T> {
    fn new(timeout: Duration, max: usize) -> Self {
        Pool { members: VecDeque::new(), timeout, max }
    }

    /// Adds a member idle since `now`; returns the one that had to go to
    /// make room, if any.
    fn push(&mut self, member: T, now: Instant) -> Option<T> {
        self.members.push_back((member, now));
        (self.members.len() > self.max).then(|| self.members.pop_front().map(|(m, _)| m)).flatten()
    }

    /// Takes the member that became idle last.
    fn pop(&mut self) -> Option<T> {
        self.members.pop_back().map(|(member, _)| member)
    }

    /// Takes the first member for which `which` holds.
    fn remove(&mut self, which: impl Fn(&T) -> bool) -> Option<T> {
        let at = self.members.iter().position(|(member, _)| which(member))?;
        self.members.remove(at).map(|(member, _)| member)
    }

    /// Takes every member idle for the timeout or longer at `now`.
    fn expire(&mut self, now: Instant) -> Vec<T> {
        let mut out = Vec::new();
        while let Some((_, since)) = self.members.front()
            && now.saturating_duration_since(*since) >= self.timeout
        {
            out.extend(self.members.pop_front().map(|(member, _)| member));
        }
        out
    }

    /// When the oldest member's idle time runs out.
    fn next_expiry(&self) -> Option<Instant> {
        self.members.front().map(|(_, since)| *since + self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::Started(4242),
            Reply::Exited(125),
            Reply::Signaled(9),
            Reply::ForkFailed(11),
            Reply::BadRequest,
        ] {
            assert_eq!(Reply::decode(&reply.encode(u64::MAX - 3)), Some((u64::MAX - 3, reply)));
        }
        assert_eq!(Reply::decode(&[9u8; REPLY_LEN]), None);
        assert_eq!(Reply::decode(&[1u8; 3]), None);
    }

    #[test]
    fn the_pool_reuses_the_last_idle_and_lets_the_oldest_go() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut pool = Pool::new(s(10), 3);
        assert_eq!(pool.next_expiry(), None);
        assert_eq!(pool.push(1, t0), None);
        assert_eq!(pool.push(2, t0 + s(1)), None);
        assert_eq!(pool.push(3, t0 + s(2)), None);
        // Over the bound: the one idle longest goes.
        assert_eq!(pool.push(4, t0 + s(3)), Some(1));
        // The warmest is reused first.
        assert_eq!(pool.pop(), Some(4));
        assert_eq!(pool.push(5, t0 + s(4)), None);
        assert_eq!(pool.next_expiry(), Some(t0 + s(11)));
        assert_eq!(pool.expire(t0 + s(10)), Vec::<i32>::new());
        assert_eq!(pool.expire(t0 + s(12)), vec![2, 3]);
        assert_eq!(pool.next_expiry(), Some(t0 + s(14)));
        assert_eq!(pool.remove(|m| *m == 7), None);
        assert_eq!(pool.remove(|m| *m == 5), Some(5));
        assert_eq!(pool.pop(), None);
        assert_eq!(pool.expire(t0 + s(100)), Vec::<i32>::new());
    }
}
