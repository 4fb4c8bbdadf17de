//! Progress of a build on standard error: on a terminal, a bar of jobs done
//! out of the total and a line per running job (its worker and elapsed
//! time); otherwise one plain line per event, for logs and CI.
//!
//! Text from elsewhere (names from submissions and workers, what a failed
//! job wrote) goes to people's terminals through [`printable`], here and in
//! the commands' tables.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use drover_proto::{BuildEvent, EventKind, JobState};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows one build's progress.
#[derive(Debug)]
pub(crate) struct Progress {
    /// When the first event shown happened (the coordinator's clock, in
    /// milliseconds): lines give each event's time from there, so a build
    /// followed after it ended reads as it went, not all at `0.00s`.
    first_at: Option<u64>,
    bars: Option<Bars>,
}

#[derive(Debug)]
struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    running: BTreeMap<String, ProgressBar>,
    /// Jobs counted as done: one that goes back to the queue (its output
    /// was lost) is counted out again.
    done: BTreeSet<String>,
}

impl Progress {
    /// Bars on a terminal, lines otherwise.
    pub(crate) fn new(build: u64, jobs: usize) -> Progress {
        let bars = std::io::stderr().is_terminal().then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
            let total = multi.add(ProgressBar::new(jobs as u64));
            total.set_style(
                ProgressStyle::with_template("build {msg} [{bar:30}] {pos}/{len} jobs, {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            total.set_message(build.to_string());
            total.enable_steady_tick(Duration::from_millis(200));
            Bars { multi, total, running: BTreeMap::new(), done: BTreeSet::new() }
        });
        if bars.is_none() {
            eprintln!("build {build}: {jobs} job{}", if jobs == 1 { "" } else { "s" });
        }
        Progress { first_at: None, bars }
    }

    /// Shows one event.
    pub(crate) fn event(&mut self, event: &BuildEvent) {
        match &mut self.bars {
            Some(bars) => bars.event(event),
            None => {
                let first = *self.first_at.get_or_insert(event.at);
                if let Some(line) = line(event) {
                    // One write per line: `eprintln!` writes each piece of
                    // its format on its own (standard error is unbuffered),
                    // about fifteen system calls a line, two lines a job.
                    let secs = event.at.saturating_sub(first) as f64 / 1000.0;
                    let text = format!("[{secs:7.2}s] {line}\n");
                    let _ = std::io::stderr().write_all(text.as_bytes());
                }
            }
        }
    }

    /// Removes the bars (before the final report is printed).
    pub(crate) fn clear(&mut self) {
        if let Some(bars) = self.bars.take() {
            for bar in bars.running.values() {
                bar.finish_and_clear();
            }
            bars.total.finish_and_clear();
            let _ = bars.multi.clear();
        }
    }
}

impl Bars {
    fn event(&mut self, event: &BuildEvent) {
        match &event.kind {
            EventKind::JobStarted { job, worker, attempt } => {
                let bar =
                    self.running.remove(job).unwrap_or_else(|| self.multi.add(ProgressBar::new_spinner()));
                bar.set_style(
                    ProgressStyle::with_template("  {spinner} {msg} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                let retry = if *attempt > 1 { format!(" (attempt {attempt})") } else { String::new() };
                bar.set_message(format!("{} on {}{retry}", printable(job), printable(worker)));
                bar.enable_steady_tick(Duration::from_millis(200));
                self.running.insert(job.clone(), bar);
            }
            EventKind::JobFinished { job, .. }
            | EventKind::JobSkipped { job, .. }
            | EventKind::JobCancelled { job } => {
                if let Some(bar) = self.running.remove(job) {
                    bar.finish_and_clear();
                    self.multi.remove(&bar);
                }
                if self.done.insert(job.clone()) {
                    self.total.inc(1);
                }
                if let Some(text) = line(event)
                    && !matches!(
                        event.kind,
                        EventKind::JobFinished { state: JobState::Succeeded | JobState::Cached, .. }
                    )
                {
                    let _ = self.multi.println(text);
                }
            }
            EventKind::JobRequeued { job, .. } => {
                if let Some(bar) = self.running.remove(job) {
                    bar.finish_and_clear();
                    self.multi.remove(&bar);
                }
                if self.done.remove(job) {
                    self.total.set_position(self.total.position().saturating_sub(1));
                }
                if let Some(text) = line(event) {
                    let _ = self.multi.println(text);
                }
            }
            EventKind::JobSuspended { .. } | EventKind::JobResumed { .. } => {
                if let Some(text) = line(event) {
                    let _ = self.multi.println(text);
                }
            }
            EventKind::BuildRetried { jobs } => {
                let total = self.total.length().unwrap_or(0);
                self.total.set_position(total.saturating_sub(*jobs as u64));
                // Which jobs go back is not listed: each counts once more
                // when it ends again.
                self.done.clear();
                if let Some(text) = line(event) {
                    let _ = self.multi.println(text);
                }
            }
            EventKind::BuildQueued { .. } | EventKind::JobQueued { .. } | EventKind::BuildFinished { .. } => {
            }
        }
    }
}

/// The plain line for an event (`None`: not worth a line).
fn line(event: &BuildEvent) -> Option<String> {
    Some(match &event.kind {
        EventKind::BuildQueued { .. } | EventKind::JobQueued { .. } => return None,
        EventKind::JobStarted { job, worker, attempt } => {
            let retry = if *attempt > 1 { format!(" (attempt {attempt})") } else { String::new() };
            format!("started   {} on {}{retry}", printable(job), printable(worker))
        }
        EventKind::JobFinished { job, state, exit_code, detail } => {
            let mut text = format!("{state:<9} {}", printable(job));
            if let Some(code) = exit_code.filter(|_| *state == JobState::Failed) {
                text.push_str(&format!(" (exit code {code})"));
            }
            if *state == JobState::Failed && !detail.is_empty() {
                // The exit code is on the line already.
                let said = exit_code.map(|code| format!("exit code {code}"));
                let detail = said
                    .as_deref()
                    .and_then(|said| detail.strip_prefix(said))
                    .map_or(detail.as_str(), |rest| rest.strip_prefix("; ").unwrap_or(rest));
                for l in detail.lines() {
                    text.push_str("\n    ");
                    text.push_str(&printable(l));
                }
            }
            text
        }
        EventKind::JobRequeued { job, attempts, reason: None } => format!(
            "requeued  {} ({attempts} attempt(s) so far: worker lost, evicted or gang restarted)",
            printable(job)
        ),
        EventKind::JobRequeued { job, reason: Some(reason), .. } => {
            format!("requeued  {}: {}", printable(job), printable(reason))
        }
        EventKind::JobSuspended { job, evicted_by: None } => format!("suspended {}", printable(job)),
        EventKind::JobSuspended { job, evicted_by: Some(by) } => {
            format!("suspended {} (evicted by {})", printable(job), printable(by))
        }
        EventKind::JobResumed { job } => format!("resumed   {}", printable(job)),
        EventKind::JobSkipped { job, reason } => {
            format!("skipped   {}: {}", printable(job), printable(reason))
        }
        EventKind::JobCancelled { job } => format!("cancelled {}", printable(job)),
        EventKind::BuildFinished { state, .. } => format!("build {state}"),
        EventKind::BuildRetried { jobs } => format!("retrying {jobs} job(s)"),
    })
}

/// `text` as it may be printed to people: every control character but the
/// tab written as an escape (`\n`, `\r`, `\x1b`), so that a name from a
/// submission or a worker, or what a failed job wrote, cannot move the
/// cursor, clear the screen, set the terminal's title or start a line of
/// its own. Text of several lines is shown a line at a time
/// ([`str::lines`]); `--json` and logs are printed as they are.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.contains(|c: char| c.is_control() && c != '\t') {
        return text.into();
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            c if c.is_control() && c != '\t' => shown.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => shown.push(c),
        }
    }
    shown.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(exit_code: Option<i32>, detail: &str) -> BuildEvent {
        let kind = EventKind::JobFinished {
            job: "cc".into(),
            state: JobState::Failed,
            exit_code,
            detail: detail.into(),
        };
        BuildEvent { seq: 3, at: 0, kind }
    }

    /// A failed job's line gives its exit code once, then what it wrote
    /// on standard error, if anything.
    #[test]
    fn a_failure_says_its_exit_code_once() {
        assert_eq!(line(&finished(Some(1), "exit code 1")).unwrap(), "failed    cc (exit code 1)");
        assert_eq!(
            line(&finished(Some(3), "exit code 3; stderr:\nmain.c:3: error")).unwrap(),
            "failed    cc (exit code 3)\n    stderr:\n    main.c:3: error"
        );
        assert_eq!(
            line(&finished(None, "killed by signal 9")).unwrap(),
            "failed    cc\n    killed by signal 9"
        );
    }

    /// What a failed job wrote keeps its lines, but no control character
    /// of it reaches the terminal: not a title-setting escape, not a clear
    /// screen, not a carriage return that would write over the line.
    #[test]
    fn a_failures_detail_reaches_the_terminal_escaped() {
        let detail = "exit code 2; stderr:\n\u{1b}]0;owned\u{7}boom\r\n\u{1b}[2J\tgone\u{9b}31m\rfake ok";
        assert_eq!(
            line(&finished(Some(2), detail)).unwrap(),
            "failed    cc (exit code 2)\n    stderr:\n    \\x1b]0;owned\\x07boom\n    \\x1b[2J\tgone\\x9b31m\\rfake ok"
        );
    }

    /// Names in an event (a job's, a worker's, a reason naming others) are
    /// one line each: a line break in one is shown, not made.
    #[test]
    fn names_in_progress_lines_are_one_line() {
        let kind =
            EventKind::JobStarted { job: "a\nfailed    b".into(), worker: "w\u{1b}[1A".into(), attempt: 1 };
        let started = line(&BuildEvent { seq: 1, at: 0, kind }).unwrap();
        assert_eq!(started, "started   a\\nfailed    b on w\\x1b[1A");
        let kind = EventKind::JobSkipped { job: "c".into(), reason: "needs \u{1b}[2Jb".into() };
        assert_eq!(line(&BuildEvent { seq: 2, at: 0, kind }).unwrap(), "skipped   c: needs \\x1b[2Jb");
        assert_eq!(printable("plain, ünïcode\ttabbed"), "plain, ünïcode\ttabbed");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
    }
}
