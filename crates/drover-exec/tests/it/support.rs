//! Shared helpers of the integration tests: a per-test directory and job
//! spec, the supervisor binary, and `/proc` probes that find a test's
//! processes by a unique token in their environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use drover_exec::{JobSpec, Outcome, RunningJob, Supervisor};

/// Upper bound for anything a test waits for; never reached when all is well.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// Name of the environment variable carrying a test's token.
pub(crate) const TOKEN_VAR: &str = "DROVER_EXEC_TEST_TOKEN";

/// The supervisor built from this crate.
pub(crate) fn supervisor() -> Supervisor {
    Supervisor::new(PathBuf::from(env!("CARGO_BIN_EXE_drover-exec-supervisor")), Vec::new())
}

/// A temporary directory with a `work` subdirectory (the job's cwd) and logs,
/// and a token that every process of the job inherits.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) token: String,
}

impl Fixture {
    pub(crate) fn new() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let token =
            format!("t{}x{n}x{}", std::process::id(), dir.path().file_name().unwrap().to_string_lossy());
        Fixture { dir, token }
    }

    pub(crate) fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A spec running `commands` in `work`, with the token in its environment
    /// and a two-second kill grace.
    pub(crate) fn spec(&self, commands: &[&str]) -> JobSpec {
        JobSpec {
            commands: commands.iter().map(|c| (*c).to_owned()).collect(),
            cwd: self.work(),
            env: BTreeMap::from([(TOKEN_VAR.to_owned(), self.token.clone())]),
            stdout: self.path("stdout.log"),
            stderr: self.path("stderr.log"),
            timeout: None,
            kill_grace: Duration::from_secs(2),
            log_limit: None,
        }
    }

    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(self.path("stdout.log")).unwrap_or_default()
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }

    /// Live (non-zombie) processes carrying this fixture's token.
    pub(crate) fn processes(&self) -> Vec<Proc> {
        marked_processes(&self.token)
    }

    /// Waits until `path` (relative to `work`) exists: the job's way of
    /// saying it got somewhere.
    pub(crate) fn wait_for_file(&self, name: &str) {
        let path = self.work().join(name);
        wait_until(&format!("{} to exist", path.display()), || path.exists());
    }
}

/// One process, as far as the tests care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) state: char,
    pub(crate) pgrp: i32,
    pub(crate) session: i32,
    pub(crate) cmdline: String,
}

/// The `/proc/<pid>/stat` fields the tests look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) state: char,
    pub(crate) pgrp: i32,
    pub(crate) session: i32,
}

impl Stat {
    /// Neither a zombie nor dead.
    pub(crate) fn alive(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Reads `/proc/<pid>/stat`; `None` if the process is gone.
pub(crate) fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state ppid pgrp session …
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
    })
}

/// Every live process of the machine (that this PID namespace shows).
pub(crate) fn live_processes() -> Vec<(i32, Stat)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            Some((pid, stat(pid).filter(Stat::alive)?))
        })
        .collect()
}

/// Live processes whose environment holds `TOKEN_VAR=token`.
pub(crate) fn marked_processes(token: &str) -> Vec<Proc> {
    let needle = format!("{TOKEN_VAR}={token}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let found = environ.split(|b| *b == 0).any(|var| var == needle.as_bytes());
        if !found {
            continue;
        }
        let Some(Stat { state, pgrp, session }) = stat(pid).filter(Stat::alive) else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ").trim().to_owned();
        out.push(Proc { pid, state, pgrp, session, cmdline });
    }
    out
}

/// Polls `condition` every 10 ms until it holds; panics after [`DEADLINE`].
pub(crate) fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the job with an upper bound, so a broken test fails instead of
/// hanging.
pub(crate) async fn finish(job: &mut RunningJob) -> Outcome {
    tokio::time::timeout(DEADLINE, job.wait()).await.expect("job did not end within the deadline")
}

/// Asserts that no process of the fixture's job is alive.
pub(crate) fn assert_no_survivors(fixture: &Fixture) {
    let left = fixture.processes();
    assert!(left.is_empty(), "processes survived the job: {left:#?}");
}

/// Path as a shell-quoted string (the tests' paths have no quotes).
pub(crate) fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}
