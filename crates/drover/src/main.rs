//! The `drover` command: one binary for the embedded cluster (`run`), the
//! coordinator (`serve`), a worker (`worker`) and the client commands
//! (`submit`, `status`, `cancel`, `workers`, `logs`).
//!
//! Exit codes: 0 success; 1 the build failed or was cancelled (or the
//! cluster could not be reached after the build was submitted); 2 bad usage
//! or bad input, with nothing submitted. Output into a pipe that closed
//! (`drover workers | head -1`) ends the command quietly with 141, as the
//! SIGPIPE that a C program would get.

/// `println!` to standard output that never panics: see [`print_line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod bench;
mod cli;
mod client;
mod cluster;
mod progress;
mod units;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// mimalloc, which on Linux asks for transparent huge pages for its large
/// regions: the coordinator's core state is pointer-heavy and read cold
/// (one job's queues, indexes and timers spread over a few hundred
/// megabytes at a million queued jobs), and fewer TLB misses shorten every
/// decision by about a sixth (BENCHMARKS.md, the core's twelfth-session
/// results; the core's benchmark runs on the same allocator). A worker's
/// zygote and supervisors run with the huge pages off (`cluster.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Writes a line to standard output. A reader that went away (a closed
/// pipe) ends the process quietly with 141, as SIGPIPE would (Rust ignores
/// SIGPIPE, so `println!` panics there instead); another error ends it
/// with 1 and says why.
fn print_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("drover: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// An error writing to standard output, for `?`: a reader that went away
/// ends the process quietly with 141, as in [`print_line`].
fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    anyhow::Error::new(e).context("cannot write to standard output")
}

/// How a command failed, and so which exit code it gets.
#[derive(Debug)]
enum Failure {
    /// The build ended without success.
    Build,
    /// Bad usage or bad input; nothing was submitted.
    Usage(anyhow::Error),
    /// Something broke after the request was made.
    Runtime(anyhow::Error),
}

/// An error and its causes, joined by `: `, leaving out a cause whose text
/// an outer message already quotes (an I/O error's message often does).
fn describe(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Runtime(e)
    }
}

fn main() -> ExitCode {
    // Jobs run under supervisors forked by a zygote: each worker starts this
    // binary once as its zygote. Before the runtime: the zygote forks.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == cluster::ZYGOTE_ARG) {
        let code = drover_exec::zygote_main();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = Cli::parse();
    init_tracing(cli.verbose, matches!(cli.command, Command::Serve(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("drover: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Build) => ExitCode::from(1),
        Err(Failure::Usage(e)) => {
            eprintln!("drover: {}", describe(&e));
            ExitCode::from(2)
        }
        Err(Failure::Runtime(e)) => {
            eprintln!("drover: {}", describe(&e));
            ExitCode::from(1)
        }
    }
}

/// Logs go to standard error, as `DROVER_LOG` (or `-v`) filters them,
/// coloured only where [`colour_logs`] says: warnings, or more with
/// `-v`/`-vv`; `drover serve` also says what its cluster does (builds
/// accepted and ended, workers registered and lost) without `-v`.
fn init_tracing(verbose: u8, serve: bool) {
    use std::io::IsTerminal;
    let default = match verbose {
        0 if serve => "warn,drover_coordinator=info",
        0 => "warn",
        1 => "info,drover=info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = colour_logs(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
}

/// Whether log lines get colours (ANSI escape codes): only on a terminal,
/// so that `drover serve 2> serve.log` writes plain text, and not when
/// `NO_COLOR` is set to anything but the empty string
/// (<https://no-color.org/>).
fn colour_logs(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

async fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Run(args) => cluster::run(args).await,
        Command::Serve(args) => cluster::serve(args).await,
        Command::Worker(args) => cluster::worker(*args).await,
        Command::Submit(args) => client::submit(args).await,
        Command::Status(args) => client::status(args).await,
        Command::Cancel(args) => client::cancel(args).await,
        Command::Retry(args) => client::retry(args).await,
        Command::Suspend(args) => client::suspend(args, false).await,
        Command::Resume(args) => client::suspend(args, true).await,
        Command::Workers(args) => client::workers(args).await,
        Command::Queues(args) => client::queues(args).await,
        Command::Logs(args) => client::logs(args).await,
        Command::Bench(args) => bench::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::{colour_logs, describe};

    /// Colours on a terminal only, and never under a non-empty `NO_COLOR`.
    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        let set = |v: &'static str| Some(std::ffi::OsStr::new(v));
        assert!(colour_logs(true, None));
        assert!(colour_logs(true, set("")), "an empty NO_COLOR is as if unset");
        assert!(!colour_logs(true, set("1")));
        assert!(!colour_logs(false, None), "a file or a pipe gets plain text");
        assert!(!colour_logs(false, set("")));
    }

    /// An error that quotes its source in its own message, as
    /// `drover_cas::CasError::Io` does.
    #[derive(Debug)]
    struct Quoting(std::io::Error);

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "create out/a: {}", self.0)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// A cause whose text the message above it already quotes is left out.
    #[test]
    fn an_errors_causes_are_printed_once() {
        let e =
            anyhow::Error::new(Quoting(std::io::Error::from_raw_os_error(20))).context("exporting to out/a");
        assert_eq!(describe(&e), "exporting to out/a: create out/a: Not a directory (os error 20)");
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(2)).context("reading x");
        assert_eq!(describe(&e), "reading x: No such file or directory (os error 2)");
    }
}
