//! The zygote: one long-lived, single-threaded helper process per
//! [`Supervisor`](crate::Supervisor) that forks a per-job supervisor for each
//! job, instead of the worker executing a (large) binary per job.
//!
//! The worker starts it once, lazily, as `program args…` (see
//! [`Supervisor::new`](crate::Supervisor::new)), with one end of a
//! `SOCK_SEQPACKET` socket pair as its standard input; the program calls
//! [`zygote_main`] before it starts any thread. The zygote starts a session
//! of its own (so the terminal's signals go to the worker only), then serves
//! requests until end of file on the socket (the worker dropped its
//! [`Supervisor`](crate::Supervisor) and every job, or died), and exits.
//!
//! Protocol (every message is one datagram of the socket pair; integers are
//! little-endian):
//!
//! - **start** (worker → zygote): `kind: u8` (1: the job's [`JobSpec`] as
//!   JSON follows; 2: it is in the fourth descriptor), 7 zero bytes,
//!   `token: u64`, the JSON. It carries (`SCM_RIGHTS`) the read end of the
//!   job's control pipe, the write ends of the supervisor's standard output
//!   and standard error pipes, and, for kind 2, a file holding the spec. The
//!   worker keeps the control pipe's write end alone (close-on-exec).
//! - **reply** (zygote → worker): `kind: u8`, 3 zero bytes, `value: i32`,
//!   `token: u64`. Kinds: 1 the supervisor was forked (value: its pid);
//!   2 it exited (value: exit code); 3 it was killed (value: signal);
//!   4 fork failed (value: errno); 5 the request was malformed. Every start
//!   gets 1 then 2 or 3, or 4, or 5.
//!
//! The forked child moves the three descriptors to its standard input,
//! output and error, closes the zygote's own, and runs the per-job
//! supervisor (the `supervisor` module) exactly as an exec'd one would,
//! then exits with its code (`_exit`: the exit handlers and library
//! destructors are the zygote's, not to be run in every supervisor, where
//! they only fault in copy-on-write memory). The zygote closes its copies at once, so the
//! control pipe's only write end stays in the worker: if the worker dies,
//! each supervisor sees end of file and stops its job. The zygote reaps its
//! children (SIGCHLD through a `signalfd`) and reports each exit.
//!
//! [`JobSpec`]: crate::JobSpec

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{MsgFlags, SockType, getsockopt, send, sockopt};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use crate::supervisor::{self, EXIT_SUPERVISOR_ERROR};
use crate::sys;

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

/// A reply from the zygote about one start request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The supervisor was forked, with this pid.
    Started(i32),
    /// The supervisor exited with this code.
    Exited(i32),
    /// The supervisor was killed by this signal.
    Signaled(i32),
    /// `fork` failed with this errno.
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
    /// SIGCHLD; `None` in a forked child, which closes it.
    signals: Option<SignalFd>,
    /// Live children: pid → token of their start request.
    children: BTreeMap<i32, u64>,
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
        Ok(Zygote { socket, signals: Some(signals), children: BTreeMap::new() })
    }

    fn serve(mut self) -> Result<(), String> {
        let mut buf = vec![0u8; REQUEST_HEADER + INLINE_LIMIT + 1];
        loop {
            let (socket_ready, signal_ready) = {
                let Some(signals) = &self.signals else { return Err("no signalfd".to_owned()) };
                let mut fds = [
                    PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
                    PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(format!("poll failed: {e}")),
                }
                let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if signal_ready {
                self.reap()?;
            }
            if socket_ready {
                let received = match sys::recv_with_fds(self.socket.as_fd(), &mut buf) {
                    Ok(received) => received,
                    Err(Errno::EINTR | Errno::EAGAIN) => continue,
                    Err(e) => return Err(format!("cannot read from the worker: {e}")),
                };
                if received.len == 0 && received.fds.is_empty() {
                    // The worker is gone, or done with us. Our children see
                    // end of file on their control pipes if it is gone.
                    return Ok(());
                }
                self.start(&buf[..received.len], received.truncated, received.fds)?;
            }
        }
    }

    /// Reaps every exited child and reports it.
    fn reap(&mut self) -> Result<(), String> {
        if let Some(signals) = &self.signals {
            while let Ok(Some(_)) = signals.read_signal() {}
        }
        loop {
            let (pid, reply) = match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Reply::Exited(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => (pid, Reply::Signaled(signal as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(()),
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("waitpid failed: {e}")),
            };
            if let Some(token) = self.children.remove(&pid.as_raw()) {
                self.reply(token, reply)?;
            }
        }
    }

    fn reply(&self, token: u64, reply: Reply) -> Result<(), String> {
        let message = reply.encode(token);
        loop {
            match send(self.socket.as_fd().as_raw_fd(), &message, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("cannot write to the worker: {e}")),
            }
        }
    }

    /// Handles one start request: forks the job's supervisor.
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
        match sys::fork_single_threaded() {
            Ok(ForkResult::Child) => {
                // Never returns to the loop: the child is a supervisor now.
                drop(self.signals.take());
                let code = run_child(&message[REQUEST_HEADER..], fds);
                let _ = std::io::stdout().flush();
                sys::exit_now(code);
            }
            Ok(ForkResult::Parent { child }) => {
                drop(fds); // the worker's pipes are the child's alone now
                self.children.insert(child.as_raw(), token);
                self.reply(token, Reply::Started(child.as_raw()))
            }
            Err(sys::ForkError::Fork(errno)) => self.reply(token, Reply::ForkFailed(errno as i32)),
            Err(e @ sys::ForkError::Threads(_)) => Err(e.to_string()),
        }
    }
}

/// In the forked child: takes the job's descriptors as standard input
/// (control pipe), output and error (which replaces the zygote's socket and
/// streams), then runs the supervisor; returns its exit code.
fn run_child(inline_spec: &[u8], mut fds: Vec<OwnedFd>) -> i32 {
    let spec_file = if fds.len() == 4 { fds.pop() } else { None };
    let moved = (|| {
        let [control, stdout, stderr] = <[OwnedFd; 3]>::try_from(fds).map_err(|_| Errno::EBADF)?;
        nix::unistd::dup2_stdin(&control)?;
        nix::unistd::dup2_stdout(&stdout)?;
        nix::unistd::dup2_stderr(&stderr)
    })();
    if let Err(e) = moved {
        // Standard error may still be the zygote's.
        let _ = writeln!(std::io::stderr(), "drover-exec supervisor: cannot take the job's pipes: {e}");
        return EXIT_SUPERVISOR_ERROR;
    }
    match spec_file {
        None => supervisor::supervise(inline_spec),
        Some(fd) => {
            let mut file = File::from(fd);
            let mut json = Vec::new();
            let read = file.rewind().and_then(|()| file.read_to_end(&mut json));
            match read {
                Ok(_) => supervisor::supervise(&json),
                Err(e) => {
                    let _ =
                        writeln!(std::io::stderr(), "drover-exec supervisor: cannot read the job spec: {e}");
                    EXIT_SUPERVISOR_ERROR
                }
            }
        }
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
}
