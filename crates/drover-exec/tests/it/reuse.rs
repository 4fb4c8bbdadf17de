//! Supervisors are reused, job after job, and keep nothing of one job for
//! the next: no process (what a job leaves running is killed at its end,
//! before the next job starts), no descriptor, working directory or
//! environment, and no request meant for an earlier job. Jobs running at
//! once have supervisors of their own. A supervisor whose attributes a job
//! changed, or that was killed, is not reused; one that lives long does not
//! grow; and one left idle exits after a while.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use drover_exec::{ExecError, Outcome, Supervisor};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{Fixture, assert_no_survivors, finish, quoted, stat, supervisor, wait_until};

/// Lists the shell's descriptors (by a child, with no redirection: the
/// shell's own glob, pipes or saved descriptors would show), then its
/// umask, directory and environment.
const PROBE: &str = "ls /proc/$$/fd; echo \"umask $(umask)\"; pwd; env";

fn gone(pid: u32) -> bool {
    stat(pid as i32).is_none_or(|s| !s.alive())
}

/// A process's open descriptors.
fn fds(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the supervisor's descriptors")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A process's working directory.
fn cwd(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/cwd")).expect("the supervisor's directory")
}

/// A `kB` line of `/proc/<pid>/status`.
fn status_kb(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find_map(|l| l.strip_prefix(name)).expect(name);
    line.trim_start_matches(':').trim().trim_end_matches("kB").trim().parse().expect(name)
}

async fn run(supervisor: &Supervisor, fx: &Fixture, commands: &[&str]) -> u32 {
    let mut job = supervisor.start(&fx.spec(commands)).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded, "{commands:?}: {}", fx.stderr());
    job.pid()
}

#[tokio::test]
async fn what_a_job_leaves_running_is_gone_before_the_next_job_starts() {
    let supervisor = supervisor();
    let first = Fixture::new();
    let bg = first.path("bg.pid");
    let spec = first.spec(&[
        &format!("sleep 1000 & echo $! > {}", quoted(&bg)),
        "(setsid sleep 1000 > /dev/null 2>&1 &); echo started",
    ]);
    let mut job = supervisor.start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert!(job.report().expect("report").leftover_processes >= 2, "{:?}", job.report());
    // Killed, and reaped, by the time the job is reported over.
    assert_no_survivors(&first);
    let bg: u32 = std::fs::read_to_string(&bg).unwrap().trim().parse().unwrap();
    assert!(gone(bg), "the background process is gone");

    let next = Fixture::new();
    let mut second = supervisor
        .start(&next.spec(&[&format!("kill -0 {bg} 2>/dev/null || echo clean")]))
        .await
        .expect("start");
    assert_eq!(second.pid(), job.pid(), "the same supervisor runs the next job");
    assert_eq!(finish(&mut second).await, Outcome::Succeeded);
    assert_eq!(next.stdout(), "clean\n");
    let report = second.report().expect("report");
    assert_eq!(report.leftover_processes, 0, "nothing of the first job is the second's");
    assert_eq!(next.stderr(), "");
}

#[tokio::test]
async fn no_descriptor_directory_or_variable_of_a_job_is_left_for_the_next() {
    let supervisor = supervisor();
    let first = Fixture::new();
    let mut spec = first.spec(&[PROBE, "umask 077; cd /; exec 7>/dev/null; export LEAK=1"]);
    spec.env.insert("ONLY_FIRST".to_owned(), "1".to_owned());
    let mut job = supervisor.start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    let pid = job.pid();
    let idle_fds = fds(pid);
    let home = std::env::current_dir().unwrap();
    assert_eq!(cwd(pid), home, "back in its own directory between jobs");

    let second = Fixture::new();
    let mut spec = second.spec(&[PROBE]);
    spec.env.insert("ONLY_SECOND".to_owned(), "1".to_owned());
    let mut job = supervisor.start(&spec).await.expect("start");
    assert_eq!(job.pid(), pid, "the same supervisor runs the next job");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);

    let lines = |fx: &Fixture, prefix: &str| -> Vec<String> {
        fx.stdout().lines().filter_map(|l| l.strip_prefix(prefix)).map(str::to_owned).collect()
    };
    // Standard input, output and error: nothing else reaches a command.
    assert!(first.stdout().starts_with("0\n1\n2\numask "), "{}", first.stdout());
    assert!(second.stdout().starts_with("0\n1\n2\numask "), "{}", second.stdout());
    assert_eq!(lines(&first, "umask "), lines(&second, "umask "));
    let out = second.stdout();
    assert!(out.lines().any(|l| l == second.work().display().to_string()), "{out}");
    assert!(out.contains("ONLY_SECOND=1") && !out.contains("ONLY_FIRST") && !out.contains("LEAK"), "{out}");
    assert_eq!(cwd(pid), home);
    assert_eq!(fds(pid), idle_fds, "the supervisor holds the same descriptors between jobs");
}

/// A job that changes, from inside, something its supervisor's later
/// commands would inherit (`change`, after recording it with `show >
/// before`) retires that supervisor: the next job runs under another one and
/// sees what the first saw (`show > after`). Returns what it saw.
async fn assert_retired_after(show: &str, change: &str) -> String {
    let supervisor = supervisor();
    let fx = Fixture::new();
    // The command's parent is its supervisor.
    let changed = run(&supervisor, &fx, &[&format!("{show} > before; {change}")]).await;
    assert!(gone(changed), "the supervisor exited instead of waiting for a job");
    let next = run(&supervisor, &fx, &[&format!("{show} > after")]).await;
    assert_ne!(next, changed);
    let read = |name: &str| std::fs::read_to_string(fx.work().join(name)).unwrap();
    assert_eq!(read("after"), read("before"));
    read("after")
}

#[tokio::test]
async fn a_supervisor_whose_limits_a_job_changed_is_not_reused() {
    if !Path::new("/usr/bin/prlimit").exists() {
        eprintln!("skipped: no /usr/bin/prlimit");
        return;
    }
    let after = assert_retired_after("ulimit -n", "prlimit --pid $PPID --nofile=64:").await;
    assert_ne!(after, "64\n");
}

#[tokio::test]
async fn a_supervisor_whose_oom_score_a_job_raised_is_not_reused() {
    // Raising one's parent's OOM score needs no privilege.
    assert_retired_after("cat /proc/self/oom_score_adj", "echo 900 > /proc/$PPID/oom_score_adj").await;
}

#[tokio::test]
async fn a_supervisor_whose_io_priority_a_job_changed_is_not_reused() {
    if !Path::new("/usr/bin/ionice").exists() {
        eprintln!("skipped: no /usr/bin/ionice");
        return;
    }
    assert_retired_after("ionice -p $$", "ionice -c 3 -p $PPID").await;
}

#[tokio::test]
async fn jobs_at_once_have_supervisors_of_their_own_which_later_jobs_reuse() {
    let supervisor = supervisor();
    let wave = |n: usize| {
        let supervisor = supervisor.clone();
        async move {
            let fixtures: Vec<Fixture> = (0..n).map(|_| Fixture::new()).collect();
            let mut jobs = Vec::new();
            for fx in &fixtures {
                let spec = fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done"]);
                jobs.push(supervisor.start(&spec).await.expect("start"));
            }
            // Every job is running before any ends.
            for fx in &fixtures {
                fx.wait_for_file("ready");
            }
            let pids: BTreeSet<u32> = jobs.iter().map(|j| j.pid()).collect();
            for fx in &fixtures {
                std::fs::write(fx.work().join("go"), "").unwrap();
            }
            for job in &mut jobs {
                assert_eq!(finish(job).await, Outcome::Succeeded);
            }
            pids
        }
    };
    let first = wave(4).await;
    assert_eq!(first.len(), 4, "one supervisor per running job: {first:?}");
    let second = wave(3).await;
    assert_eq!(second.len(), 3);
    assert!(second.is_subset(&first), "idle supervisors are reused: {second:?} {first:?}");
}

#[tokio::test]
async fn a_supervisor_killed_during_a_job_is_replaced() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    let mut job = supervisor
        .start(&fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done"]))
        .await
        .expect("start");
    fx.wait_for_file("ready");
    kill(Pid::from_raw(job.pid() as i32), Signal::SIGKILL).expect("kill the supervisor");
    let outcome = finish(&mut job).await;
    assert!(
        matches!(&outcome, Outcome::SupervisorLost(message) if message.contains("signal 9")),
        "the supervisor's death ends the job: {outcome:?}"
    );
    assert_no_survivors(&fx);

    let next = Fixture::new();
    let pid = run(&supervisor, &next, &["echo again"]).await;
    assert_ne!(pid, job.pid(), "a new supervisor");
    assert_eq!(next.stdout(), "again\n");
}

#[tokio::test]
async fn a_supervisor_killed_while_idle_is_replaced() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    let idle = run(&supervisor, &fx, &["true"]).await;
    kill(Pid::from_raw(idle as i32), Signal::SIGKILL).expect("kill the supervisor");
    // Reaped by the zygote, which forgets it.
    wait_until("the zygote to reap the supervisor", || stat(idle as i32).is_none());
    let next = run(&supervisor, &fx, &["echo again"]).await;
    assert_ne!(next, idle);
    assert_eq!(fx.stdout(), "again\n");
}

#[tokio::test]
async fn requests_for_an_ended_job_do_not_reach_the_next() {
    let supervisor = supervisor();
    let first = Fixture::new();
    let mut ended = supervisor.start(&first.spec(&["true"])).await.expect("start");
    let handle = ended.handle();
    assert_eq!(finish(&mut ended).await, Outcome::Succeeded);

    let fx = Fixture::new();
    let mut job = supervisor
        .start(&fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done; echo done"]))
        .await
        .expect("start");
    assert_eq!(job.pid(), ended.pid(), "the same supervisor runs the next job");
    fx.wait_for_file("ready");
    handle.terminate();
    ended.terminate();
    assert!(matches!(handle.suspend(), Err(ExecError::NotRunning)));
    assert!(matches!(handle.resume(), Err(ExecError::NotRunning)));
    assert!(fx.processes().iter().all(|p| p.state != 'T'), "nothing was stopped: {:#?}", fx.processes());
    std::fs::write(fx.work().join("go"), "").unwrap();
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "done\n");
}

#[tokio::test]
async fn a_long_lived_supervisor_does_not_grow() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    // Output on both logs, and a process left behind to kill.
    let commands = ["echo out; echo err >&2", "sleep 1000 & true"];
    let mut pid = 0;
    for _ in 0..100 {
        pid = run(&supervisor, &fx, &commands).await;
    }
    let before = (fds(pid), status_kb(pid, "VmData"), status_kb(pid, "RssAnon"));
    for i in 0..200 {
        assert_eq!(run(&supervisor, &fx, &commands).await, pid, "job {i} reused the supervisor");
    }
    let after = (fds(pid), status_kb(pid, "VmData"), status_kb(pid, "RssAnon"));
    assert_eq!(after.0, before.0, "the same descriptors");
    // Measured: no growth at all once warm (the slack is for the allocator).
    assert!(after.1 <= before.1 + 64, "the heap grew from {} kB to {} kB", before.1, after.1);
    assert!(after.2 <= before.2 + 64, "anonymous memory grew from {} kB to {} kB", before.2, after.2);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn an_idle_supervisor_is_let_go_after_a_while() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    let idle = run(&supervisor, &fx, &["true"]).await;
    assert!(!gone(idle), "idle, it waits for the next job");
    // The zygote lets it go after its idle timeout (10 s): it exits, and
    // the zygote reaps it.
    wait_until("the idle supervisor to exit", || stat(idle as i32).is_none());
    let zygote = supervisor.zygote_pid().expect("the zygote stays");
    let next = run(&supervisor, &fx, &["true"]).await;
    assert_ne!(next, idle, "a new supervisor");
    assert_eq!(supervisor.zygote_pid(), Some(zygote));
}
