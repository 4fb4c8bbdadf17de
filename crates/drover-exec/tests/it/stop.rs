//! Stopping jobs: timeout, terminate, processes left behind after a
//! successful job, and dropping the handle. In every case, nothing the job
//! started survives, including grandchildren that called `setsid`.

use std::time::Duration;

use drover_exec::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{Fixture, assert_no_survivors, finish, live_processes, quoted, supervisor, wait_until};

/// Starts a child, a `setsid` grandchild (its own session, so out of the
/// job's process group), and a double-forked `setsid` daemon, then says so
/// in `ready` and waits.
pub(crate) const ESCAPING_JOB: &str =
    "setsid sh -c 'sleep 1000' & sleep 1000 & (setsid sleep 1000 &); echo up > ready; wait";

/// Waits until the escaping job's processes are all up, and checks that some
/// really left the supervisor's session.
fn wait_for_escapees(fx: &Fixture, supervisor_pid: u32) {
    fx.wait_for_file("ready");
    wait_until("the job's sleeps to start", || {
        fx.processes().iter().filter(|p| p.cmdline == "sleep 1000").count() >= 3
    });
    let escaped = fx.processes().into_iter().filter(|p| p.session != supervisor_pid as i32).count();
    assert!(escaped >= 2, "the setsid processes are in sessions of their own: {:#?}", fx.processes());
}

#[tokio::test]
async fn terminate_kills_children_and_setsid_grandchildren() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&[ESCAPING_JOB, "echo never"])).await.expect("start");
    wait_for_escapees(&fx, job.pid());
    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_no_survivors(&fx);
    let report = job.report().expect("report");
    assert!(report.terminated);
    assert!(report.leftover_processes >= 4, "{report:?}");
    assert!(!fx.stdout().contains("never"));
}

#[tokio::test]
async fn a_timed_out_job_is_stopped_entirely() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&[ESCAPING_JOB]);
    spec.timeout = Some(Duration::from_secs(3));
    let mut job = supervisor().start(&spec).await.expect("start");
    let pid = job.pid();
    // The job is up long before its timeout; check it really escaped.
    wait_for_escapees(&fx, pid);
    assert_eq!(finish(&mut job).await, Outcome::TimedOut);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn a_timeout_kills_the_commands_whole_process_group() {
    let fx = Fixture::new();
    // The command's shell records its PID, which is also its process group
    // ID, then starts a shell whose two sleeps are its grandchildren. The
    // trailing `echo` keeps the outer shell from exec-ing the inner one.
    let mut spec = fx.spec(&["echo $$ > pgid; sh -c 'sleep 100 & sleep 100'; echo unreachable"]);
    spec.timeout = Some(Duration::from_secs(3));
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("pgid");
    let pgid: i32 = std::fs::read_to_string(fx.work().join("pgid")).unwrap().trim().parse().unwrap();
    wait_until("both sleeps", || fx.processes().iter().filter(|p| p.cmdline == "sleep 100").count() == 2);
    let group = fx.processes();
    assert!(group.len() >= 4, "two shells and two sleeps: {group:#?}");
    assert!(group.iter().all(|p| p.pgrp == pgid), "one process group: {group:#?}");

    assert_eq!(finish(&mut job).await, Outcome::TimedOut);
    // Checked over every process of the machine, not only the marked ones.
    let left: Vec<_> = live_processes().into_iter().filter(|(_, stat)| stat.pgrp == pgid).collect();
    assert!(left.is_empty(), "processes survived in the job's process group: {left:#?}");
    assert_no_survivors(&fx);
    assert!(!fx.stdout().contains("unreachable"));
    assert!(job.report().expect("report").terminated);
}

#[tokio::test]
async fn processes_ignoring_sigterm_are_killed_after_the_grace_period() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["trap '' TERM; setsid sleep 1000 & sleep 1000 & echo up > ready; wait"]);
    spec.kill_grace = Duration::from_millis(300);
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("ready");
    wait_until("both sleeps", || fx.processes().iter().filter(|p| p.cmdline == "sleep 1000").count() == 2);
    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_no_survivors(&fx);
    let killed_after = job.report().expect("report").killed_after_ms.expect("SIGKILL was needed");
    assert!(killed_after >= 300, "killed {killed_after} ms after SIGTERM, not after the grace");
}

/// A timed-out job that ignores SIGTERM holds on a kill grace longer; the
/// report says so, and when.
#[tokio::test]
async fn a_timed_out_job_that_ignores_sigterm_is_reported_killed_after_the_grace() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["trap '' TERM; sleep 1000 & echo up > ready; wait"]);
    // Time enough for the shell to set its trap first, however busy the
    // machine.
    spec.timeout = Some(Duration::from_secs(3));
    spec.kill_grace = Duration::from_millis(300);
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("ready");
    assert_eq!(finish(&mut job).await, Outcome::TimedOut);
    assert_no_survivors(&fx);
    let killed_after = job.report().expect("report").killed_after_ms.expect("SIGKILL was needed");
    assert!(killed_after >= 300, "killed {killed_after} ms after SIGTERM, not after the grace");
}

#[tokio::test]
async fn sigterm_reaches_the_job_which_may_clean_up_within_the_grace_period() {
    let fx = Fixture::new();
    let marker = fx.path("got-term");
    let command =
        format!("trap 'echo term > {}; exit 0' TERM; sleep 1000 & echo up > ready; wait", quoted(&marker));
    let mut spec = fx.spec(&[&command]);
    spec.kill_grace = Duration::from_secs(30);
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("ready");
    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_eq!(std::fs::read_to_string(&marker).expect("the trap ran"), "term\n");
    assert_no_survivors(&fx);
    assert_eq!(job.report().expect("report").killed_after_ms, None, "SIGTERM was enough");
}

#[tokio::test]
async fn a_daemon_left_behind_by_a_successful_job_is_killed() {
    let fx = Fixture::new();
    let spec = fx.spec(&[
        "setsid sh -c 'sleep 1000' > /dev/null 2>&1 &",
        "(setsid sleep 1000 > /dev/null 2>&1 &); echo started",
    ]);
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_no_survivors(&fx);
    let report = job.report().expect("report");
    assert!(!report.terminated);
    assert!(report.leftover_processes >= 2, "{report:?}");
    assert!(fx.stderr().contains("still running after the job's commands ended"), "{}", fx.stderr());
}

#[tokio::test]
async fn terminate_after_the_end_changes_nothing() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&["true"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    job.terminate();
    assert_eq!(job.wait().await, Outcome::Succeeded);
    assert!(job.suspend().is_err());
}

#[tokio::test]
async fn terminate_from_another_task_through_a_handle() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&["sleep 1000 & echo up > ready; wait"])).await.expect("start");
    let handle = job.handle();
    let ready = fx.work().join("ready");
    let stopper = tokio::task::spawn_blocking(move || {
        wait_until("ready", || ready.exists());
        handle.terminate();
    });
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    stopper.await.expect("stopper");
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn a_killed_supervisor_leaves_no_process_in_its_session() {
    let fx = Fixture::new();
    let mut job = supervisor()
        .start(&fx.spec(&["sleep 1000 & sh -c 'sleep 1000; true' & echo up > ready; wait"]))
        .await
        .expect("start");
    fx.wait_for_file("ready");
    wait_until("both sleeps", || fx.processes().iter().filter(|p| p.cmdline == "sleep 1000").count() == 2);
    kill(Pid::from_raw(job.pid() as i32), Signal::SIGKILL).expect("kill the supervisor");
    let outcome = finish(&mut job).await;
    assert!(
        matches!(&outcome, Outcome::SupervisorLost(message) if message.contains("signal")),
        "the supervisor's death is reported: {outcome:?}"
    );
    assert!(job.report().is_none());
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn dropping_a_running_job_stops_it() {
    let fx = Fixture::new();
    let job = supervisor().start(&fx.spec(&[ESCAPING_JOB])).await.expect("start");
    wait_for_escapees(&fx, job.pid());
    drop(job);
    wait_until("the dropped job's processes to be gone", || fx.processes().is_empty());
}
