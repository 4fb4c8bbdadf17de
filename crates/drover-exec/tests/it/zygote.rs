//! The zygote: one helper process per `Supervisor` hands every job to a
//! supervisor it forked, reusing them; jobs started concurrently share it;
//! a spec too long for one message still gets through; and when the zygote
//! dies (SIGKILL), the jobs it handed out end without survivors, its idle
//! supervisors exit, and the next job gets a new zygote.

use std::sync::Arc;

use drover_exec::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::stop::ESCAPING_JOB;
use crate::support::{Fixture, assert_no_survivors, finish, stat, supervisor, wait_until};

/// The parent pid of a live process.
fn ppid(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test]
async fn one_zygote_serves_every_job_through_one_reused_supervisor() {
    let supervisor = supervisor();
    assert_eq!(supervisor.zygote_pid(), None, "started lazily");
    let fx = Fixture::new();

    // A job that waits: its supervisor is the zygote's child.
    let spec = fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done"]);
    let mut job = supervisor.start(&spec).await.expect("start");
    let zygote = supervisor.zygote_pid().expect("a zygote runs");
    assert_eq!(ppid(job.pid()), Some(zygote), "the supervisor was forked by the zygote");
    assert_ne!(job.pid(), zygote);
    let first = job.pid();
    fx.wait_for_file("ready");
    std::fs::write(fx.work().join("go"), "").unwrap();
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);

    // Many short jobs, with their own exit codes, through the same zygote:
    // one after the other, they all run under the first job's supervisor
    // (every job forking a supervisor of its own would fail this).
    for i in 0..40 {
        let code = i % 4;
        let mut job = supervisor.start(&fx.spec(&[&format!("echo {i}; exit {code}")])).await.expect("start");
        assert_eq!(job.pid(), first, "job {i} reused the supervisor");
        let expected = if code == 0 { Outcome::Succeeded } else { Outcome::Failed { exit_code: code } };
        assert_eq!(finish(&mut job).await, expected, "job {i}");
        assert_eq!(job.report().expect("report").exit_code, Some(code));
        assert_eq!(supervisor.zygote_pid(), Some(zygote), "job {i} used the same zygote");
    }
    let expected: String = (0..40).map(|i| format!("{i}\n")).collect();
    assert_eq!(fx.stdout(), expected);
    assert_no_survivors(&fx);
    assert_eq!(ppid(first), Some(zygote), "the supervisor waits for the next job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_share_one_zygote() {
    let supervisor = supervisor();
    let fixtures: Vec<Arc<Fixture>> = (0..16).map(|_| Arc::new(Fixture::new())).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, fx) in fixtures.iter().enumerate() {
        let supervisor = supervisor.clone();
        let fx = Arc::clone(fx);
        tasks.spawn(async move {
            let mut job = supervisor.start(&fx.spec(&[&format!("echo job {i}")])).await.expect("start");
            let outcome = finish(&mut job).await;
            (i, outcome, supervisor.zygote_pid())
        });
    }
    let mut zygotes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (i, outcome, zygote) = joined.expect("task");
        assert_eq!(outcome, Outcome::Succeeded, "job {i}");
        assert_eq!(fixtures[i].stdout(), format!("job {i}\n"));
        zygotes.push(zygote.expect("a zygote runs"));
    }
    zygotes.dedup();
    assert_eq!(zygotes.len(), 1, "one zygote served every job: {zygotes:?}");
    for fx in &fixtures {
        assert_no_survivors(fx);
    }
}

#[tokio::test]
async fn a_spec_too_long_for_one_message_is_sent_as_a_file() {
    let fx = Fixture::new();
    // 300 KiB of spec (one argument may not exceed 128 KiB).
    let mut spec = fx.spec(&["echo long"]);
    for i in 0..4 {
        spec.env.insert(format!("FILLER_{i}"), "x".repeat(75 * 1024));
    }
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "long\n");
}

#[tokio::test]
async fn a_killed_zygote_loses_its_jobs_without_survivors_and_is_replaced() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    let mut job = supervisor.start(&fx.spec(&[ESCAPING_JOB])).await.expect("start");
    fx.wait_for_file("ready");
    wait_until("the job's sleeps to start", || {
        fx.processes().iter().filter(|p| p.cmdline == "sleep 1000").count() >= 3
    });
    // A second supervisor, idle once its job is over.
    // (Its fixture lives on: the job may enter its directory after `start`.)
    let short_fx = Fixture::new();
    let mut short = supervisor.start(&short_fx.spec(&["true"])).await.expect("start");
    assert_eq!(finish(&mut short).await, Outcome::Succeeded);
    let idle = short.pid() as i32;
    assert_ne!(idle, job.pid() as i32);
    assert!(stat(idle).is_some_and(|s| s.alive()), "an idle supervisor waits for jobs");
    let zygote = supervisor.zygote_pid().expect("a zygote runs");
    kill(Pid::from_raw(zygote as i32), Signal::SIGKILL).expect("kill the zygote");

    let outcome = finish(&mut job).await;
    assert!(
        matches!(&outcome, Outcome::SupervisorLost(message) if message.contains("zygote")),
        "the supervisor is reported lost with its zygote: {outcome:?}"
    );
    // The supervisor (a subreaper) and every process it had, including the
    // ones that left its session, are gone.
    assert_no_survivors(&fx);
    assert!(stat(job.pid() as i32).is_none_or(|s| !s.alive()), "the supervisor is dead");
    wait_until("the idle supervisor to exit", || stat(idle).is_none_or(|s| !s.alive()));
    assert_eq!(supervisor.zygote_pid(), None, "the dead zygote is forgotten");

    // The next job gets a new zygote.
    let next = Fixture::new();
    let mut job = supervisor.start(&next.spec(&["echo again"])).await.expect("start after the zygote died");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(next.stdout(), "again\n");
    let replacement = supervisor.zygote_pid().expect("a new zygote runs");
    assert_ne!(replacement, zygote);
}

#[tokio::test]
async fn the_zygote_exits_once_its_supervisor_and_jobs_are_dropped() {
    let supervisor = supervisor();
    let fx = Fixture::new();
    let mut job = supervisor
        .start(&fx.spec(&["echo up > ready; while [ ! -e go ]; do sleep 0.01; done"]))
        .await
        .expect("start");
    let zygote = supervisor.zygote_pid().expect("a zygote runs") as i32;
    drop(supervisor);
    // The running job keeps it.
    fx.wait_for_file("ready");
    assert!(stat(zygote).is_some_and(|s| s.alive()), "the zygote serves its running job");
    std::fs::write(fx.work().join("go"), "").unwrap();
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    let idle = job.pid() as i32;
    drop(job);
    wait_until("the zygote to exit", || stat(zygote).is_none_or(|s| !s.alive()));
    wait_until("its idle supervisor to exit", || stat(idle).is_none_or(|s| !s.alive()));
}
