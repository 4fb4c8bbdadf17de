//! Suspending and resuming jobs: every process under the supervisor stops
//! (state `T`) and continues, the timeout clock stops meanwhile, and a
//! suspended job can still be terminated.

use std::time::Duration;

use drover_exec::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{Fixture, assert_no_survivors, finish, supervisor, wait_until};

const JOB: &str = "sleep 1000 & setsid sleep 1000 & echo up > ready; wait";

/// Every process of the job is stopped: in state `T`, or `D` for a shell
/// waiting in `vfork` for a child that was stopped before it could `exec`
/// (that parent cannot take the stop until its child goes on, and runs
/// nothing meanwhile).
fn all_stopped(fx: &Fixture) -> bool {
    let procs = fx.processes();
    let some_stopped = procs.iter().any(|p| p.state == 'T');
    !procs.is_empty() && procs.iter().all(|p| p.state == 'T' || (p.state == 'D' && some_stopped))
}

fn wait_until_up(fx: &Fixture) {
    fx.wait_for_file("ready");
    wait_until("sh and both sleeps", || fx.processes().len() >= 3);
}

#[tokio::test]
async fn suspend_stops_every_descendant_and_resume_continues_them() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&[JOB])).await.expect("start");
    wait_until_up(&fx);
    let before = fx.processes();

    job.suspend().expect("suspend");
    wait_until("every process of the job to be stopped", || all_stopped(&fx));
    assert_eq!(fx.processes().len(), before.len(), "suspending kills nothing");
    let supervisor_stat = crate::support::stat(job.pid() as i32).expect("supervisor alive");
    assert_ne!(supervisor_stat.state, 'T', "the supervisor itself is not stopped");
    // Suspending twice is harmless.
    job.suspend().expect("suspend again");

    job.resume().expect("resume");
    wait_until("every process of the job to run again", || fx.processes().iter().all(|p| p.state != 'T'));
    assert_eq!(fx.processes().len(), before.len());

    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn a_suspended_job_can_be_terminated() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&[JOB])).await.expect("start");
    wait_until_up(&fx);
    job.suspend().expect("suspend");
    wait_until("stopped", || all_stopped(&fx));
    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn a_suspended_job_starts_no_new_command_until_resumed() {
    let fx = Fixture::new();
    // The first command ends on its own once `go` exists; the second one
    // must not start while the job is suspended.
    let spec = fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done", "echo second > second"]);
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("ready");
    job.suspend().expect("suspend");
    wait_until("stopped", || all_stopped(&fx));
    // Let the first command end: resume only its processes by hand, as if
    // it had been about to finish when the job was suspended.
    // The supervisor stops the job's processes too, when it handles the
    // suspend request: continue them until they are gone.
    std::fs::write(fx.work().join("go"), "").unwrap();
    wait_until("the first command to end", || {
        let processes = fx.processes();
        for p in &processes {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGCONT);
        }
        processes.is_empty()
    });
    // Still suspended: the job does not finish and the second command does
    // not run.
    let waited = tokio::time::timeout(Duration::from_millis(500), job.wait()).await;
    assert!(waited.is_err(), "a suspended job cannot finish: {waited:?}");
    assert!(!fx.work().join("second").exists());
    job.resume().expect("resume");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(std::fs::read_to_string(fx.work().join("second")).unwrap(), "second\n");
}

#[tokio::test]
async fn suspended_time_does_not_count_toward_the_timeout() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["sleep 1000"]);
    spec.timeout = Some(Duration::from_secs(2));
    let mut job = supervisor().start(&spec).await.expect("start");
    job.suspend().expect("suspend");
    // Suspended, the clock is stopped: however long we wait, no timeout.
    let waited = tokio::time::timeout(Duration::from_secs(4), job.wait()).await;
    assert!(waited.is_err(), "a suspended job cannot time out: {waited:?}");
    job.resume().expect("resume");
    assert_eq!(finish(&mut job).await, Outcome::TimedOut);
    assert_no_survivors(&fx);
}
