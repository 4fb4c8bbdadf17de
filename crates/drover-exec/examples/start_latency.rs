//! Times the start of jobs' supervisors: runs `true` jobs one after the
//! other through one [`Supervisor`] and prints the mean time of
//! [`Supervisor::start`] and of a whole job (start and wait).
//!
//! `cargo run --release -p drover-exec --example start_latency -- [JOBS
//! [PROGRAM ARGS…]]`: the supervisor is `PROGRAM ARGS…` (say
//! `target/release/drover __zygote`), by default this crate's
//! `drover-exec-supervisor` binary (build it first: `cargo build --release
//! -p drover-exec`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use drover_exec::{JobSpec, Outcome, Supervisor};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let jobs: u32 = args.next().map(|n| n.to_string_lossy().parse()).transpose()?.unwrap_or(200);
    let program = match args.next() {
        Some(program) => PathBuf::from(program),
        None => {
            let exe = std::env::current_exe()?;
            let dir = exe.parent().and_then(|d| d.parent()).ok_or("no target directory")?;
            dir.join("drover-exec-supervisor")
        }
    };
    let supervisor = Supervisor::new(program, args.collect());
    let tmp = tempfile::tempdir()?;
    let spec = JobSpec {
        commands: vec!["true".to_owned()],
        cwd: tmp.path().to_owned(),
        env: BTreeMap::new(),
        stdout: tmp.path().join("stdout.log"),
        stderr: tmp.path().join("stderr.log"),
        timeout: None,
        kill_grace: Duration::from_secs(1),
        log_limit: None,
    };
    let (mut starting, mut total) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..jobs {
        let begin = Instant::now();
        let mut job = supervisor.start(&spec).await?;
        starting += begin.elapsed();
        let outcome = job.wait().await;
        total += begin.elapsed();
        if outcome != Outcome::Succeeded {
            return Err(format!("job ended: {outcome:?}").into());
        }
    }
    let mean = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(jobs);
    println!(
        "{jobs} sequential `true` jobs: start {:.3} ms, whole job {:.3} ms (mean)",
        mean(starting),
        mean(total)
    );
    Ok(())
}
