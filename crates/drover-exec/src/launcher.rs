//! The worker's end of the zygote (see the `zygote` module): starts it when
//! the first job needs it (and again after it died), sends it one start
//! request per job with the job's pipes, and hands the replies it sends
//! back (a supervisor took the job, the job ended) to the job they are
//! about through one-shot channels, from a dispatcher task that reads the
//! socket.
//!
//! When the zygote dies, every job still waiting for a reply gets a closed
//! channel, which it treats as its supervisor being lost; the next start
//! spawns a new zygote.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, sendmsg, socketpair};
use tokio::io::Interest;
use tokio::net::UnixDatagram;
use tokio::sync::oneshot;

use crate::job::ExecError;
use crate::zygote::{INLINE_LIMIT, Reply, START_INLINE, START_SPEC_FILE, request_header};

/// How long the dispatcher waits for a zygote that closed its socket to exit.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Starts zygotes as `program args…` (with `env` added to the
/// environment it inherits) and keeps the current one.
#[derive(Debug)]
pub(crate) struct Launcher {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    current: Mutex<Option<Arc<Zygote>>>,
}

/// How a job ended, as the zygote saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SupervisorExit {
    /// The supervisor ended it with this exit code (and may be reused), or
    /// exited with it.
    Exited(i32),
    /// The supervisor was killed by this signal during the job.
    Signaled(i32),
    /// The zygote died first (the message says how): the supervisor's fate
    /// is unknown, and it may still be running.
    Lost(String),
}

/// A job handed to a supervisor.
#[derive(Debug)]
pub(crate) struct Launched {
    /// The zygote that handed the job over (kept open while the job runs).
    pub(crate) zygote: Arc<Zygote>,
    /// The supervisor's pid.
    pub(crate) pid: u32,
    /// The job's end, once the zygote has heard of it.
    pub(crate) exit: oneshot::Receiver<SupervisorExit>,
}

/// The job's ends of its pipes, sent to the zygote for the supervisor.
#[derive(Debug)]
pub(crate) struct SupervisorFds {
    /// Read end of the job's control pipe.
    pub(crate) control: OwnedFd,
    /// Write end of the job's output pipe (`ready`, then the report).
    pub(crate) stdout: OwnedFd,
    /// Write end of the job's error pipe (the supervisor's messages about it).
    pub(crate) stderr: OwnedFd,
}

impl Launcher {
    pub(crate) fn new(program: PathBuf, args: Vec<OsString>, env: Vec<(OsString, OsString)>) -> Self {
        Launcher { program, args, env, current: Mutex::new(None) }
    }

    pub(crate) fn program(&self) -> &std::path::Path {
        &self.program
    }

    pub(crate) fn args(&self) -> &[OsString] {
        &self.args
    }

    pub(crate) fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// The pid of the live zygote, if one is running.
    pub(crate) fn zygote_pid(&self) -> Option<u32> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().filter(|z| z.lost().is_none()).map(|z| z.pid)
    }

    /// Asks the zygote (started if none is alive) to hand the job
    /// `spec_json` with the given pipes to a supervisor. Must be called within a
    /// tokio runtime.
    pub(crate) async fn launch(&self, spec_json: &[u8], fds: SupervisorFds) -> Result<Launched, ExecError> {
        let spec_file = if spec_json.len() > INLINE_LIMIT { Some(spec_file(spec_json)?) } else { None };
        let mut retried = false;
        loop {
            let zygote = self.zygote()?;
            match zygote.request(spec_json, spec_file.as_ref(), &fds).await {
                Ok(pending) => return zygote.started(pending, &self.program).await,
                // The zygote died before it could read the request: a new
                // one gets it, once.
                Err(e) if !retried => {
                    zygote.set_lost(format!("cannot write to it: {e}"));
                    retried = true;
                }
                Err(e) => {
                    return Err(ExecError::Supervisor(format!(
                        "cannot send the job to the zygote {}: {e}",
                        self.program.display()
                    )));
                }
            }
        }
    }

    /// The live zygote, started if there is none.
    fn zygote(&self) -> Result<Arc<Zygote>, ExecError> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(zygote) = current.as_ref().filter(|z| z.lost().is_none()) {
            return Ok(Arc::clone(zygote));
        }
        let zygote = Zygote::spawn(&self.program, &self.args, &self.env)?;
        *current = Some(Arc::clone(&zygote));
        Ok(zygote)
    }
}

/// Writes a spec too long for a message to an unnamed temporary file.
fn spec_file(spec_json: &[u8]) -> Result<OwnedFd, ExecError> {
    let io = |source| ExecError::Io { context: "cannot write the job spec file".to_owned(), source };
    let mut file = tempfile::tempfile().map_err(io)?;
    file.write_all(spec_json).map_err(io)?;
    Ok(OwnedFd::from(file))
}

/// One zygote process and the worker's end of its socket. Dropping the
/// last reference (the [`Launcher`] moved on, and every job it started has
/// been dropped) shuts the socket down, and the zygote exits.
#[derive(Debug)]
pub(crate) struct Zygote {
    pid: u32,
    /// The worker's end of the `SOCK_SEQPACKET` pair (tokio's datagram
    /// socket type serves it well: one message per `recv`, 0 bytes at end of
    /// file).
    socket: Arc<UnixDatagram>,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    next_token: u64,
    /// Start requests whose job has not been reported ended.
    pending: BTreeMap<u64, Pending>,
    /// Set once the zygote is gone (or unusable): why.
    lost: Option<String>,
}

impl State {
    /// Marks the zygote lost and drops every waiter (their receivers then
    /// see a closed channel).
    fn lose(&mut self, why: String) {
        self.lost.get_or_insert(why);
        self.pending.clear();
    }
}

#[derive(Debug)]
struct Pending {
    started: Option<oneshot::Sender<Result<i32, String>>>,
    exited: oneshot::Sender<SupervisorExit>,
}

/// A request sent: its channels.
#[derive(Debug)]
struct Requested {
    started: oneshot::Receiver<Result<i32, String>>,
    exited: oneshot::Receiver<SupervisorExit>,
}

impl Zygote {
    fn spawn(
        program: &std::path::Path,
        args: &[OsString],
        env: &[(OsString, OsString)],
    ) -> Result<Arc<Zygote>, ExecError> {
        let zygote_error = |what: &str, e: &dyn std::fmt::Display| {
            ExecError::Supervisor(format!("cannot start the zygote {}: {what}: {e}", program.display()))
        };
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| zygote_error("socketpair", &e))?;
        let ours = std::os::unix::net::UnixDatagram::from(ours);
        ours.set_nonblocking(true).map_err(|e| zygote_error("cannot make its socket non-blocking", &e))?;
        let child = tokio::process::Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| ExecError::Supervisor(format!("cannot run {}: {e}", program.display())))?;
        let pid = child.id().ok_or_else(|| zygote_error("it exited at once", &"no pid"))?;
        let socket =
            Arc::new(UnixDatagram::from_std(ours).map_err(|e| zygote_error("cannot poll its socket", &e))?);
        let state = Arc::new(Mutex::new(State::default()));
        tokio::spawn(dispatch(Arc::clone(&socket), Arc::clone(&state), child, pid));
        Ok(Arc::new(Zygote { pid, socket, state }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the zygote is gone, if it is.
    pub(crate) fn lost(&self) -> Option<String> {
        self.state().lost.clone()
    }

    fn set_lost(&self, why: String) {
        self.state().lose(why);
    }

    /// Sends a start request; an error means the zygote did not get it.
    async fn request(
        &self,
        spec_json: &[u8],
        spec_file: Option<&OwnedFd>,
        fds: &SupervisorFds,
    ) -> std::io::Result<Requested> {
        let (started_tx, started) = oneshot::channel();
        let (exited_tx, exited) = oneshot::channel();
        let token = {
            let mut state = self.state();
            if let Some(why) = &state.lost {
                return Err(std::io::Error::other(why.clone()));
            }
            let token = state.next_token;
            state.next_token += 1;
            state.pending.insert(token, Pending { started: Some(started_tx), exited: exited_tx });
            token
        };
        let mut raw = vec![fds.control.as_raw_fd(), fds.stdout.as_raw_fd(), fds.stderr.as_raw_fd()];
        let header = match spec_file {
            Some(file) => {
                raw.push(file.as_raw_fd());
                request_header(START_SPEC_FILE, token)
            }
            None => request_header(START_INLINE, token),
        };
        let body: &[u8] = if spec_file.is_some() { &[] } else { spec_json };
        let iov = [IoSlice::new(&header), IoSlice::new(body)];
        let rights = [ControlMessage::ScmRights(&raw)];
        let socket = &self.socket;
        let sent = socket
            .async_io(Interest::WRITABLE, || {
                sendmsg::<()>(socket.as_raw_fd(), &iov, &rights, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(std::io::Error::from)
            })
            .await;
        match sent {
            Ok(_) => Ok(Requested { started, exited }),
            Err(e) => {
                self.state().pending.remove(&token);
                Err(e)
            }
        }
    }

    /// Waits for the zygote to say which supervisor took the job.
    async fn started(
        self: Arc<Self>,
        requested: Requested,
        program: &std::path::Path,
    ) -> Result<Launched, ExecError> {
        match requested.started.await {
            Ok(Ok(pid)) => {
                let pid = u32::try_from(pid)
                    .map_err(|_| ExecError::Supervisor(format!("the zygote sent a bad pid {pid}")))?;
                Ok(Launched { zygote: self, pid, exit: requested.exited })
            }
            Ok(Err(message)) => Err(ExecError::Supervisor(message)),
            Err(_) => {
                let why = self.lost().unwrap_or_else(|| "it went away".to_owned());
                Err(ExecError::Supervisor(format!("the zygote {} is gone: {why}", program.display())))
            }
        }
    }
}

impl Drop for Zygote {
    /// No job and no launcher use this zygote any more: end of file for it.
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

/// Marks the zygote lost when the dispatcher ends, however it ends (its
/// runtime may be shut down under it).
struct LoseOnDrop(Arc<Mutex<State>>);

impl Drop for LoseOnDrop {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.lose("the worker stopped reading from it".to_owned());
    }
}

/// Reads the zygote's replies and hands them to their jobs until the socket
/// closes; then reaps the zygote and fails every job still waiting.
async fn dispatch(
    socket: Arc<UnixDatagram>,
    state: Arc<Mutex<State>>,
    mut child: tokio::process::Child,
    pid: u32,
) {
    let guard = LoseOnDrop(Arc::clone(&state));
    let mut buf = [0u8; 64];
    let ended = loop {
        let received = match socket.recv(&mut buf).await {
            Ok(0) => break String::new(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break format!("cannot read from it: {e}"),
        };
        let Some((token, reply)) = Reply::decode(&buf[..received]) else {
            break "it sent a malformed reply".to_owned();
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        let exit = match reply {
            Reply::Started(pid) => {
                if let Some(started) = state.pending.get_mut(&token).and_then(|p| p.started.take()) {
                    let _ = started.send(Ok(pid));
                }
                continue;
            }
            Reply::ForkFailed(errno) => Err(format!("the zygote cannot fork: {}", Errno::from_raw(errno))),
            Reply::BadRequest => Err("the zygote refused the request as malformed".to_owned()),
            Reply::Exited(code) => Ok(SupervisorExit::Exited(code)),
            Reply::Signaled(signal) => Ok(SupervisorExit::Signaled(signal)),
        };
        if let Some(pending) = state.pending.remove(&token) {
            match exit {
                Ok(exit) => {
                    let _ = pending.exited.send(exit);
                }
                Err(message) => {
                    if let Some(started) = pending.started {
                        let _ = started.send(Err(message));
                    }
                }
            }
        }
    };
    // The zygote closed its end: it is exiting (or already dead). Its exit
    // status says why.
    let status = match tokio::time::timeout(ZYGOTE_EXIT_WAIT, child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("cannot wait for it: {e}"),
        Err(_) => {
            let _ = child.start_kill();
            "it closed its socket but did not exit; killed".to_owned()
        }
    };
    let why = if ended.is_empty() {
        format!("pid {pid}, {status}")
    } else {
        format!("pid {pid}, {ended}; {status}")
    };
    state.lock().unwrap_or_else(PoisonError::into_inner).lose(why);
    drop(guard);
}
