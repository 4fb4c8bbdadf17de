//! Jobs that run to their end: output, working directory and environment,
//! failures, signals, spawn failures, and the supervisor's report.

use std::collections::BTreeSet;

use drover_exec::{ExecError, JobSpec, Outcome, Supervisor};

use crate::support::{Fixture, TOKEN_VAR, assert_no_survivors, finish, supervisor, wait_until};

#[tokio::test]
async fn a_multi_command_job_succeeds_in_its_cwd_with_its_env() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo one", "echo two >&2", "pwd", "echo \"greeting=$GREETING\"", "env"]);
    spec.env.insert("GREETING".to_owned(), "hello world".to_owned());
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);

    let out = fx.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "one");
    assert_eq!(lines[1], fx.work().display().to_string(), "pwd");
    assert_eq!(lines[2], "greeting=hello world");
    assert_eq!(fx.stderr(), "two\n");

    // The environment is exactly the spec's, plus the documented defaults
    // (and what sh itself exports).
    let vars: BTreeSet<&str> = lines[3..].iter().filter_map(|l| l.split_once('=')).map(|(k, _)| k).collect();
    let allowed = BTreeSet::from([
        "GREETING",
        TOKEN_VAR,
        "PATH",
        "HOME",
        "TMPDIR",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ]);
    assert!(vars.is_subset(&allowed), "unexpected variables: {:?}", vars.difference(&allowed));
    for required in ["GREETING", TOKEN_VAR, "PATH", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE"] {
        assert!(vars.contains(required), "{required} missing from {vars:?}");
    }
    assert!(out.contains(&format!("HOME={}\n", fx.work().display())));
    assert!(out.contains(&format!("PATH={}\n", drover_exec::DEFAULT_PATH)));

    let report = job.report().expect("report");
    assert_eq!(report.duration_ms.len(), 5);
    assert_eq!(report.exit_code, Some(0));
    assert!(!report.terminated);
    assert_eq!(report.leftover_processes, 0);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn given_path_home_and_tmpdir_are_kept() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo \"$PATH|$HOME|$TMPDIR\""]);
    spec.env.insert("PATH".to_owned(), "/bin:/usr/bin".to_owned());
    spec.env.insert("HOME".to_owned(), "/home/nobody".to_owned());
    spec.env.insert("TMPDIR".to_owned(), "/var/tmp".to_owned());
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "/bin:/usr/bin|/home/nobody|/var/tmp\n");
}

#[tokio::test]
async fn logs_are_appended_to() {
    let fx = Fixture::new();
    std::fs::write(fx.path("stdout.log"), "earlier\n").unwrap();
    let mut job = supervisor().start(&fx.spec(&["echo later"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "earlier\nlater\n");
}

#[tokio::test]
async fn a_failing_command_stops_the_job_with_its_exit_code() {
    let fx = Fixture::new();
    let spec = fx.spec(&["echo before", "echo failing; exit 3", "echo after"]);
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Failed { exit_code: 3 });
    assert_eq!(fx.stdout(), "before\nfailing\n");
    let report = job.report().expect("report");
    assert_eq!(report.duration_ms.len(), 2);
    assert_eq!(report.exit_code, Some(3));
    // Waiting again gives the same answer.
    assert_eq!(job.wait().await, Outcome::Failed { exit_code: 3 });
}

#[tokio::test]
async fn a_command_killed_by_a_signal_is_reported() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&["kill -KILL $$"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Signaled { signal: 9 });
}

#[tokio::test]
async fn a_missing_cwd_is_a_spawn_failure_with_a_clear_message() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo never"]);
    spec.cwd = fx.path("missing-dir");
    let mut job = supervisor().start(&spec).await.expect("start");
    let outcome = finish(&mut job).await;
    let Outcome::SpawnFailed(message) = outcome else { panic!("expected SpawnFailed, got {outcome:?}") };
    assert!(message.contains("working directory"), "{message}");
    assert!(message.contains("missing-dir"), "{message}");
    assert!(message.contains("does not exist"), "{message}");
    assert!(fx.stderr().contains(&message), "the message is also in the job's stderr log");
    assert_eq!(fx.stdout(), "");
}

#[tokio::test]
async fn an_empty_job_succeeds() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&[])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
}

#[tokio::test]
async fn a_program_that_is_no_supervisor_fails_to_start() {
    let fx = Fixture::new();
    let err = Supervisor::new("/bin/true".into(), Vec::new()).start(&fx.spec(&["echo"])).await.unwrap_err();
    assert!(matches!(err, ExecError::Supervisor(_)), "{err}");
    let err =
        Supervisor::new(fx.path("no-such-binary"), vec!["__zygote".into()]).start(&fx.spec(&["echo"])).await;
    assert!(matches!(err, Err(ExecError::Supervisor(_))), "{err:?}");
}

#[tokio::test]
async fn a_job_that_writes_nothing_leaves_no_log_file() {
    let fx = Fixture::new();
    let mut job = supervisor().start(&fx.spec(&["true", "echo err >&2"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert!(!fx.path("stdout.log").exists(), "nothing was written to stdout");
    assert_eq!(fx.stderr(), "err\n");
}

#[tokio::test]
async fn a_log_file_is_created_with_its_directory_on_the_first_byte() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo out", "echo err >&2"]);
    spec.stdout = fx.path("run/7/stdout.log");
    spec.stderr = fx.path("run/7/stderr.log");
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(std::fs::read_to_string(&spec.stdout).unwrap(), "out\n");
    assert_eq!(std::fs::read_to_string(&spec.stderr).unwrap(), "err\n");
}

#[tokio::test]
async fn one_file_for_both_streams_keeps_their_order() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo a; echo b >&2; echo c", "echo d >&2"]);
    spec.stderr = spec.stdout.clone();
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "a\nb\nc\nd\n");
}

#[tokio::test]
async fn a_log_is_readable_while_the_job_runs() {
    let fx = Fixture::new();
    let commands = ["echo early; touch ready; while [ ! -e go ]; do sleep 0.01; done; echo late"];
    let mut job = supervisor().start(&fx.spec(&commands)).await.expect("start");
    fx.wait_for_file("ready");
    wait_until("the first line to reach the log", || fx.stdout() == "early\n");
    std::fs::write(fx.work().join("go"), "").unwrap();
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(fx.stdout(), "early\nlate\n");
}

#[tokio::test]
async fn a_log_that_cannot_be_written_fails_the_job() {
    let fx = Fixture::new();
    std::fs::write(fx.path("not-a-dir"), "").unwrap();
    let mut spec = fx.spec(&["echo hi"]);
    spec.stdout = fx.path("not-a-dir/stdout.log");
    let mut job = supervisor().start(&spec).await.expect("start");
    let outcome = finish(&mut job).await;
    let Outcome::SpawnFailed(message) = outcome else { panic!("expected SpawnFailed, got {outcome:?}") };
    assert!(message.contains("log file"), "{message}");
    assert_eq!(job.report().map(|r| r.exit_code), Some(Some(0)), "the command itself ran");
}

#[tokio::test]
async fn much_output_is_copied_whole() {
    let fx = Fixture::new();
    // Far more than a pipe holds, on both streams.
    let mut job = supervisor()
        .start(&fx.spec(&["head -c 3000000 /dev/zero | tr '\\0' x; head -c 300000 /dev/zero >&2"]))
        .await
        .expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    let out = fx.stdout();
    assert_eq!(out.len(), 3_000_000);
    assert!(out.bytes().all(|b| b == b'x'));
    assert_eq!(std::fs::metadata(fx.path("stderr.log")).unwrap().len(), 300_000);
}

#[tokio::test]
async fn output_around_the_first_read_size_is_copied_whole() {
    // The supervisor reads 4 KiB at first, 64 KiB once a read fills that:
    // sizes on and around the switch, written at once and in pieces.
    for size in [4095, 4096, 4097, 8192, 70_000] {
        let fx = Fixture::new();
        let command = format!("head -c {size} /dev/zero | tr '\\0' y; printf z; printf z");
        let mut job = supervisor().start(&fx.spec(&[&command])).await.expect("start");
        assert_eq!(finish(&mut job).await, Outcome::Succeeded);
        let out = fx.stdout();
        assert_eq!(out.len(), size + 2, "{size}");
        assert!(out[..size].bytes().all(|b| b == b'y') && out.ends_with("zz"), "{size}");
    }
}

#[tokio::test]
async fn extreme_timeout_and_grace_are_accepted() {
    let fx = Fixture::new();
    let mut spec = fx.spec(&["true"]);
    spec.timeout = Some(std::time::Duration::MAX);
    spec.kill_grace = std::time::Duration::MAX;
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);

    // Terminated, the job exits on SIGTERM: no need to wait for the grace.
    let spec = JobSpec { commands: vec!["sleep 1000 & echo up > ready; wait".to_owned()], ..spec };
    let mut job = supervisor().start(&spec).await.expect("start");
    fx.wait_for_file("ready");
    job.terminate();
    assert_eq!(finish(&mut job).await, Outcome::Cancelled);
    assert_no_survivors(&fx);
}

#[tokio::test]
async fn the_zygotes_extra_environment_stays_out_of_the_jobs() {
    let fx = Fixture::new();
    let supervisor = Supervisor::with_env(
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_drover-exec-supervisor")),
        Vec::new(),
        vec![("DROVER_EXEC_ZYGOTE_ONLY".into(), "yes".into())],
    );
    let mut job = supervisor.start(&fx.spec(&["env"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert!(!fx.stdout().contains("DROVER_EXEC_ZYGOTE_ONLY"), "the job saw the zygote's variable");
    let pid = supervisor.zygote_pid().expect("a zygote runs");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the zygote's environment");
    assert!(
        environ.split(|&b| b == 0).any(|var| var == b"DROVER_EXEC_ZYGOTE_ONLY=yes"),
        "the zygote did not get its variable"
    );
    assert_ne!(supervisor, crate::support::supervisor(), "the environment is part of what a supervisor is");
}

/// A log past its limit keeps its first bytes and its last quarter of the
/// limit (from the first whole line in it), with a line between them
/// saying how much was dropped; the job is not held back, and a log within
/// its limit is whole.
#[tokio::test]
async fn a_log_past_its_limit_keeps_its_head_and_its_tail() {
    let fx = Fixture::new();
    // 588,895 bytes on stdout; a little on stderr, after it.
    let mut spec = fx.spec(&["seq 1 100000", "echo 'the error at the end' >&2"]);
    spec.log_limit = Some(64 * 1024);
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);

    let whole: String = (1..=100_000).map(|n| format!("{n}\n")).collect();
    let (head, tail) = (48 * 1024, 16 * 1024);
    // The last 16 KiB start within a line: the kept end starts after it.
    let cut = whole.len() - tail;
    let start = cut + whole[cut..].find('\n').expect("a newline") + 1;
    assert_ne!(whole.as_bytes()[cut - 1], b'\n', "the test cuts within a line");
    let out = fx.stdout();
    let marker = format!(
        "\n[drover: this log passed its limit of 65536 bytes: {} bytes were dropped here; its last {} bytes follow]\n",
        start - head,
        whole.len() - start
    );
    assert_eq!(out, format!("{}{marker}{}", &whole[..head], &whole[start..]));
    assert_eq!(fx.stderr(), "the error at the end\n", "a log within its limit is whole");

    // A limit too small for a tail still says what it dropped.
    let fx = Fixture::new();
    let mut spec = fx.spec(&["echo hello"]);
    spec.log_limit = Some(2);
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    assert_eq!(
        fx.stdout(),
        "he\n[drover: this log passed its limit of 2 bytes: 4 bytes were dropped here; its last 0 bytes follow]\n"
    );
}
