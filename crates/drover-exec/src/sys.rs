//! The crate's only `unsafe` code, behind four safe functions the zygote
//! and its supervisors need: forking (only while the process has a single
//! thread), ending a forked child without the zygote's exit handlers,
//! taking ownership of file descriptors received over a Unix socket, and
//! reading the process's I/O priority (a system call with no wrapper).
//!
//! The workspace forbids `unsafe`; this crate denies it and allows it in
//! this module alone.
#![allow(unsafe_code)]

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::unistd::ForkResult;

/// Most file descriptors one message may carry.
pub(crate) const MAX_FDS: usize = 8;

/// Why [`fork_single_threaded`] did not fork.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForkError {
    /// The process has other threads (or their number is unknown): forking
    /// would copy locks they may hold.
    #[error("the process is not single-threaded ({0} threads)")]
    Threads(String),
    /// `fork` itself failed.
    #[error("fork failed: {0}")]
    Fork(#[from] Errno),
}

/// `fork()`, refused unless the calling process has exactly one thread.
pub(crate) fn fork_single_threaded() -> Result<ForkResult, ForkError> {
    // Threads are only ever started by this thread, so none can appear
    // between this check and the fork.
    let threads = std::fs::read_dir("/proc/self/task").map(Iterator::count);
    match threads {
        Ok(1) => {}
        Ok(n) => return Err(ForkError::Threads(n.to_string())),
        Err(e) => return Err(ForkError::Threads(format!("unknown: {e}"))),
    }
    // SAFETY: the process has a single thread (checked above), so no lock
    // (allocator, stdio, environment) can be held by another thread at the
    // fork, and the child may run any code, as a freshly exec'd program
    // would. The zygote is that single-threaded process: it is exec'd
    // before any runtime or thread starts and never starts one.
    Ok(unsafe { nix::unistd::fork() }?)
}

/// The calling process's I/O priority (`ioprio_get(IOPRIO_WHO_PROCESS,
/// 0)`: class and level in one number), or the error.
pub(crate) fn io_priority() -> Result<i64, Errno> {
    const IOPRIO_WHO_PROCESS: nix::libc::c_long = 1;
    // SAFETY: `ioprio_get` takes two integers (who: this process) and
    // touches no memory of ours; its result is a number or -1 with errno.
    let value =
        unsafe { nix::libc::syscall(nix::libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0 as nix::libc::c_long) };
    Errno::result(value)
}

/// Ends the process at once with `code` (`_exit`): no exit handlers, no
/// destructors of loaded libraries, no flush of standard streams (flush
/// first). For a child forked by the zygote, whose exit handlers are the
/// zygote's: running them would only touch (and, copy on write, fault in)
/// memory for nothing, at every job.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` takes no pointer and never returns; it only ends the
    // process, which leaves no Rust invariant behind.
    unsafe { nix::libc::_exit(code) }
}

/// One message received by [`recv_with_fds`].
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes of the message put in the buffer (0 with no descriptor: end of
    /// file).
    pub(crate) len: usize,
    /// The message was longer than the buffer, or carried more descriptors
    /// than fit (those were closed by the kernel).
    pub(crate) truncated: bool,
    /// The descriptors it carried, close-on-exec.
    pub(crate) fds: Vec<OwnedFd>,
}

/// Receives one message (a `SOCK_SEQPACKET` socket keeps message boundaries)
/// with the file descriptors sent along with it (`SCM_RIGHTS`), at most
/// [`MAX_FDS`].
pub(crate) fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> nix::Result<Received> {
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    let mut truncated = msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    match msg.cmsgs() {
        Ok(cmsgs) => {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = cmsg {
                    // SAFETY: the kernel has just installed these
                    // descriptors in our table for this message; nothing
                    // else knows them, so each gets exactly one owner.
                    fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        Err(_) => truncated = true,
    }
    Ok(Received { len: msg.bytes, truncated, fds })
}
