//! Plain commands, which the supervisor starts without a shell: that no
//! shell runs them, and that what they see and how they end is what the
//! shell would have given them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use drover_exec::Outcome;

use crate::support::{Fixture, finish, supervisor};

/// Writes an executable file.
fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A script that prints the pid of its parent process: the process that
/// started it.
const PARENT_PROBE: &str = "#!/bin/sh\necho $PPID\n";

#[tokio::test]
async fn a_plain_command_runs_without_a_shell_and_any_other_with_one() {
    let fx = Fixture::new();
    executable(&fx.work().join("probe"), PARENT_PROBE);
    let spec = fx.spec(&["./probe", "./probe; :"]);
    let mut job = supervisor().start(&spec).await.expect("start");
    let supervisor_pid = job.pid().to_string();
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    let out = fx.stdout();
    let parents: Vec<&str> = out.lines().collect();
    assert_eq!(parents.len(), 2, "{out}");
    assert_eq!(parents[0], supervisor_pid, "the plain command was started by the supervisor");
    assert_ne!(parents[1], supervisor_pid, "the one with `;` by a shell");
}

#[tokio::test]
async fn the_program_is_searched_on_the_jobs_path_and_gets_its_words_and_pwd() {
    let fx = Fixture::new();
    let bin = fx.path("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    executable(&bin.join("show"), "#!/bin/sh\necho \"$# $1 $2 $PWD\"\n");
    let mut spec = fx.spec(&["show  a=1\t--b:c"]);
    spec.env.insert("PATH".to_owned(), format!("/nonexistent:{}:/usr/bin:/bin", bin.display()));
    spec.env.insert("PWD".to_owned(), "/somewhere/else".to_owned());
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded);
    let work = fx.work().canonicalize().expect("canonical work dir");
    assert_eq!(fx.stdout(), format!("2 a=1 --b:c {}\n", work.display()));
}

#[tokio::test]
async fn a_missing_program_exits_127_and_a_path_that_cannot_run_126() {
    let fx = Fixture::new();
    std::fs::write(fx.work().join("data"), "not a program").expect("write");
    std::fs::create_dir(fx.work().join("dir")).expect("mkdir");
    let path = drover_exec::DEFAULT_PATH;
    for (command, code, message) in [
        (
            "no-such-program-anywhere --flag",
            127,
            format!("drover: no-such-program-anywhere: not found (PATH={path})"),
        ),
        ("./no-such-file", 127, "drover: ./no-such-file: not found".to_owned()),
        ("./data", 126, "drover: ./data: Permission denied".to_owned()),
        ("./dir", 126, "drover: ./dir: Permission denied".to_owned()),
    ] {
        let _ = std::fs::remove_file(fx.path("stderr.log"));
        let mut job = supervisor().start(&fx.spec(&[command, "echo never"])).await.expect("start");
        assert_eq!(finish(&mut job).await, Outcome::Failed { exit_code: code }, "{command}");
        assert_eq!(fx.stderr(), format!("{message}\n"), "{command}");
        assert_eq!(job.report().expect("report").spawn_error, None, "a failed command, not a failed start");
    }
    assert_eq!(fx.stdout(), "", "the job stops at the failed command");
}

#[tokio::test]
async fn the_search_skips_what_cannot_run_and_reads_empty_and_relative_entries_from_the_cwd() {
    let fx = Fixture::new();
    // `tool` on PATH: a directory, then a file without permission, then the
    // program; `here` in the working directory (an empty entry), `rel` in
    // `sub` under it (a relative entry).
    for dir in ["a/tool", "b", "c", "sub"] {
        std::fs::create_dir_all(fx.work().join(dir)).expect("mkdir");
    }
    std::fs::write(fx.work().join("b/tool"), "not a program").expect("write");
    executable(&fx.work().join("c/tool"), "#!/bin/sh\necho tool\n");
    executable(&fx.work().join("here"), "#!/bin/sh\necho here\n");
    executable(&fx.work().join("sub/rel"), "#!/bin/sh\necho rel\n");
    let work = fx.work().display().to_string();
    let mut spec = fx.spec(&["tool", "here", "rel"]);
    spec.env.insert("PATH".to_owned(), format!("{work}/a:{work}/b:{work}/c::sub:/usr/bin:/bin"));
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Succeeded, "{}", fx.stderr());
    assert_eq!(fx.stdout(), "tool\nhere\nrel\n");

    // Only what cannot run: 127, with the reason, as dash counts it.
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.work().join("b")).expect("mkdir");
    std::fs::write(fx.work().join("b/tool"), "not a program").expect("write");
    let mut spec = fx.spec(&["tool"]);
    let path = format!("{}/b", fx.work().display());
    spec.env.insert("PATH".to_owned(), path.clone());
    let mut job = supervisor().start(&spec).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Failed { exit_code: 127 });
    assert_eq!(fx.stderr(), format!("drover: tool: Permission denied (PATH={path})\n"));
}

#[tokio::test]
async fn a_plain_command_killed_by_a_signal_is_reported_as_such() {
    let fx = Fixture::new();
    executable(&fx.work().join("die"), "#!/bin/sh\nkill -SEGV $$\n");
    let mut job = supervisor().start(&fx.spec(&["./die"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Signaled { signal: 11 });
}

#[tokio::test]
async fn an_executable_text_file_without_an_interpreter_line_runs_in_the_shell() {
    let fx = Fixture::new();
    executable(&fx.work().join("script"), "echo from the script\nexit 4\n");
    let mut job = supervisor().start(&fx.spec(&["./script"])).await.expect("start");
    assert_eq!(finish(&mut job).await, Outcome::Failed { exit_code: 4 });
    assert_eq!(fx.stdout(), "from the script\n");
}
