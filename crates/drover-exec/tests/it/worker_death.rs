//! The worker dying (SIGKILL, so no destructor runs) takes its jobs with it:
//! the supervisor sees its control pipe close and stops the job.
//!
//! The "worker" is this test binary run again, filtered to the single test
//! [`fake_worker`], which starts a job and waits for it; in a normal test run
//! that test finds no job to start and returns at once.

use std::process::{Command, Stdio};

use drover_exec::JobSpec;

use crate::stop::ESCAPING_JOB;
use crate::support::{Fixture, TOKEN_VAR, supervisor, wait_until};

/// Names the job spec (JSON) the fake worker is to run.
const FAKE_WORKER_SPEC: &str = "DROVER_EXEC_TEST_FAKE_WORKER_SPEC";

/// The fake worker: starts the job named by [`FAKE_WORKER_SPEC`], records the
/// supervisor's PID in `supervisor.pid` next to the spec, and waits for the
/// job (it is killed first). A no-op when the variable is not set.
#[tokio::test]
async fn fake_worker() {
    let Some(spec_path) = std::env::var_os(FAKE_WORKER_SPEC) else { return };
    let spec_path = std::path::PathBuf::from(spec_path);
    let spec: JobSpec = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    let mut job = supervisor().start(&spec).await.expect("start");
    std::fs::write(spec_path.with_file_name("supervisor.pid"), job.pid().to_string()).unwrap();
    let outcome = job.wait().await;
    panic!("the fake worker should have been killed, but its job ended: {outcome:?}");
}

#[test]
fn a_job_dies_with_its_worker() {
    let fx = Fixture::new();
    let spec_path = fx.path("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec(&fx.spec(&[ESCAPING_JOB])).unwrap()).unwrap();
    // The worker carries the token too, and so does the supervisor, which
    // inherits the worker's environment.
    let mut worker = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker_death::fake_worker", "--test-threads=1", "--quiet"])
        .env(FAKE_WORKER_SPEC, &spec_path)
        .env(TOKEN_VAR, &fx.token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the fake worker");

    fx.wait_for_file("ready");
    wait_until("the job's sleeps to start", || {
        fx.processes().iter().filter(|p| p.cmdline == "sleep 1000").count() >= 3
    });
    let read_pid = || std::fs::read_to_string(fx.path("supervisor.pid")).ok()?.parse::<i32>().ok();
    wait_until("the fake worker to record the supervisor's PID", || read_pid().is_some());
    let supervisor_pid = read_pid().unwrap();
    let escaped = fx.processes().into_iter().filter(|p| p.session != supervisor_pid).count();
    assert!(escaped >= 2, "some processes left the supervisor's session: {:#?}", fx.processes());
    assert!(fx.processes().iter().any(|p| p.pid == supervisor_pid), "the supervisor is marked too");

    worker.kill().expect("SIGKILL the worker");
    worker.wait().expect("reap the worker");
    wait_until("every process of the job, and the supervisor, to be gone", || fx.processes().is_empty());
}
