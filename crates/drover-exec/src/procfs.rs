//! Finding a process's descendants through `/proc`, and signalling them.
//!
//! One pass reads `/proc/<pid>/stat` of every process (pid, state, parent)
//! and walks the parent links down from a root. This does not depend on
//! `/proc/<pid>/task/<tid>/children` (which needs `CONFIG_PROC_CHILDREN`) and
//! sees every process of the machine that is visible in this PID namespace.

use std::collections::{BTreeMap, BTreeSet};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcInfo {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    /// The state letter: `R`, `S`, `D`, `T` (stopped), `t`, `Z` (zombie), …
    pub(crate) state: char,
    /// The session ID.
    pub(crate) session: i32,
}

impl ProcInfo {
    /// Whether the process is still running (not a zombie or dead).
    pub(crate) fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the contents of `/proc/<pid>/stat`. The command name (second field)
/// is in parentheses and may contain spaces and parentheses, so the fields
/// after it are found from the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let _pgrp = rest.next()?;
    let session = rest.next()?.parse().ok()?;
    Some(ProcInfo { pid, ppid, state, session })
}

/// The fields of a `/proc/<pid>/stat` line that the process's children
/// inherit, or that decide what they inherit, and that do not change as it
/// runs: the signal mask, the ignored and the caught signals (fields 32 to
/// 34), the nice value (19), the real-time priority and the scheduling
/// policy (40 and 41).
pub(crate) fn inherited_fields(text: &str) -> Option<Vec<String>> {
    let close = text.rfind(')')?;
    // Field 3 (the state) is the first after the name.
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    [32, 33, 34, 19, 40, 41].iter().map(|n| fields.get(n - 3).map(|f| (*f).to_owned())).collect()
}

/// Reads one process's stat line; `None` if it is gone (or unreadable).
pub(crate) fn stat(pid: i32) -> Option<ProcInfo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Every process visible in `/proc`.
pub(crate) fn all_processes() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            stat(pid)
        })
        .collect()
}

/// Every descendant of `root` (not `root` itself), parents before their
/// children. Zombies are included.
pub(crate) fn descendants(root: i32) -> Vec<ProcInfo> {
    let mut children: BTreeMap<i32, Vec<ProcInfo>> = BTreeMap::new();
    for info in all_processes() {
        children.entry(info.ppid).or_default().push(info);
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::from([root]);
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for child in children.get(&parent).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(child.pid) {
                out.push(*child);
                frontier.push(child.pid);
            }
        }
    }
    out
}

/// Sends `signal` to `pid`, treating "no such process" as done.
pub(crate) fn signal_pid(pid: i32, signal: Signal) -> Result<(), Errno> {
    match kill(Pid::from_raw(pid), signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sends `signal` to every live (non-zombie) descendant of `root`, once.
/// Returns how many could be signalled and how many refused (`EPERM`: a
/// process that changed its user ID, when the caller is not privileged).
pub(crate) fn signal_descendants(root: i32, signal: Signal) -> (usize, usize) {
    let (mut signalled, mut refused) = (0, 0);
    for info in descendants(root) {
        if info.alive() {
            match signal_pid(info.pid, signal) {
                Ok(()) => signalled += 1,
                Err(_) => refused += 1,
            }
        }
    }
    (signalled, refused)
}

/// Stops every descendant of `root` with SIGSTOP, including processes they
/// fork while this runs: passes over `/proc` repeat until one finds no
/// process it has not signalled yet. (A process with SIGSTOP pending cannot
/// complete a fork, so the tree stops growing.) Returns an error only if a
/// signal could not be sent for another reason than the process being gone.
pub(crate) fn stop_descendants(root: i32) -> Result<(), Errno> {
    const MAX_PASSES: usize = 1000;
    let mut signalled = BTreeSet::new();
    for _ in 0..MAX_PASSES {
        let mut fresh = false;
        for info in descendants(root) {
            if info.alive() && signalled.insert(info.pid) {
                fresh = true;
                signal_pid(info.pid, Signal::SIGSTOP)?;
            }
        }
        if !fresh {
            return Ok(());
        }
    }
    Ok(())
}

/// Continues every descendant of `root` with SIGCONT.
pub(crate) fn continue_descendants(root: i32) -> Result<(), Errno> {
    for info in descendants(root) {
        if info.alive() {
            signal_pid(info.pid, Signal::SIGCONT)?;
        }
    }
    Ok(())
}

/// SIGKILLs every live process of the session `sid` once its leader is gone
/// (the processes a SIGKILLed supervisor left behind: its session ID is its
/// PID); returns how many were signalled (0: none is left). Does nothing while any process has
/// the PID `sid`: the kernel does not reuse a PID that still names a live
/// session, so such a process is the leader itself or a newcomer that
/// reused the number after the session emptied, and its session must not be
/// touched.
pub(crate) fn kill_orphaned_session(sid: i32) -> usize {
    if sid <= 1 || stat(sid).is_some() {
        return 0;
    }
    all_processes()
        .into_iter()
        .filter(|p| p.session == sid && p.alive())
        .filter(|p| signal_pid(p.pid, Signal::SIGKILL).is_ok())
        .count()
}

/// One pass of killing a supervisor whose zygote died (so it is no longer
/// a child anyone can wait for) and everything of its job: while the
/// supervisor lives, SIGKILL its descendants (it is a subreaper, so even
/// processes that left its session with `setsid` are among them), and once
/// none is left, the supervisor itself; once it is dead, every live process
/// left in its session. Returns how many processes were signalled (0: none
/// is left).
///
/// A live process with the PID `sid` that is not in session `sid` is a
/// newcomer that reused the number after the session emptied: then there
/// is nothing to do. (One that reused it *and* started a session of its own
/// cannot be told from the supervisor; that takes the supervisor exiting,
/// being reaped and the PID space wrapping around while the zygote dies.)
pub(crate) fn kill_lost_supervisor(sid: i32) -> usize {
    if sid <= 1 {
        return 0;
    }
    match stat(sid) {
        Some(leader) if leader.alive() && leader.session == sid => {
            let (signalled, _) = signal_descendants(sid, Signal::SIGKILL);
            if signalled > 0 {
                return signalled;
            }
            usize::from(signal_pid(sid, Signal::SIGKILL).is_ok())
        }
        Some(leader) if leader.alive() => 0,
        _ => all_processes()
            .into_iter()
            .filter(|p| p.session == sid && p.alive())
            .filter(|p| signal_pid(p.pid, Signal::SIGKILL).is_ok())
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parentheses() {
        let info = parse_stat("4242 (a (weird) name) T 17 4241 4240 0 -1 4194560").unwrap();
        assert_eq!(info, ProcInfo { pid: 4242, ppid: 17, state: 'T', session: 4240 });
    }

    #[test]
    fn picks_the_inherited_fields() {
        // A real line (a shell), with a name holding a space and a parenthesis.
        let line = "1234 (a b) c) S 1 1234 1234 34816 1234 4194304 1189 0 0 0 1 0 0 0 25 5 1 0 \
                    2345 9494528 1234 18446744073709551615 1 1 0 0 0 0 65536 3686404 1266761467 \
                    0 0 0 17 1 7 3 0 0 0 0 0 0 0 0 0 0 0";
        let fields = inherited_fields(line).unwrap();
        assert_eq!(fields, ["65536", "3686404", "1266761467", "5", "7", "3"]);
        assert_eq!(inherited_fields("1 (x) S 1"), None);
    }

    #[test]
    fn sees_own_process() {
        let me = std::process::id() as i32;
        let info = stat(me).expect("own stat");
        assert_eq!(info.pid, me);
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(info.session, nix::unistd::getsid(None).unwrap().as_raw());
        assert!(info.alive());
    }
}
