//! `GET /metrics`: the coordinator's counts in Prometheus' text format
//! (version 0.0.4), for a scraper. The counts come from the solver in one
//! query ([`Solver::metrics`]), and the input log's (its snapshots) from
//! gauges the state thread keeps; this module only writes them out.
//!
//! Counters count since the input log began: a restarted coordinator
//! replays its log and carries on from the same totals.

use std::fmt::Write;

use drover_solver::Metrics;

use crate::snapshots::LogGauges;
#[cfg(doc)]
use drover_solver::Solver;

/// The content type of the text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family: its `# HELP` and `# TYPE` lines, then a sample per
/// (label set, value).
struct Family<'a> {
    name: &'a str,
    kind: &'a str,
    help: &'a str,
}

impl Family<'_> {
    fn write(&self, out: &mut String, samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value) in samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (key, value)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{key}=\"{}\"", escape(value));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// A label value as the text format wants it: backslash, double quote and
/// newline escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One sample per item, labelled `key` = the item's `label`.
fn by<'a, T: 'a>(
    key: &'static str,
    items: impl IntoIterator<Item = &'a (T, u64)>,
    label: impl Fn(&T) -> String,
) -> Vec<(Vec<(&'static str, String)>, u64)> {
    items.into_iter().map(|(item, n)| (vec![(key, label(item))], *n)).collect()
}

/// The whole `/metrics` page: the solver's counts, and the input log's.
pub(crate) fn render(m: &Metrics, log: &LogGauges) -> String {
    let mut out = String::new();
    let one = |value: u64| [(Vec::new(), value)];
    let load = |gauge: &std::sync::atomic::AtomicU64| gauge.load(std::sync::atomic::Ordering::Relaxed);
    Family {
        name: "drover_log_bytes_since_snapshot",
        kind: "gauge",
        help: "Bytes of inputs recorded since the last snapshot of the state began.",
    }
    .write(&mut out, one(load(&log.since)));
    Family { name: "drover_snapshot_bytes", kind: "gauge", help: "Size of the last snapshot of the state." }
        .write(&mut out, one(load(&log.snapshot_bytes)));
    Family {
        name: "drover_snapshots_total",
        kind: "counter",
        help: "Snapshots of the state since the coordinator started, by result.",
    }
    .write(
        &mut out,
        [
            (vec![("result", "written".to_owned())], load(&log.written)),
            (vec![("result", "failed".to_owned())], load(&log.failed)),
        ],
    );
    Family {
        name: "drover_builds",
        kind: "gauge",
        help: "Builds the coordinator accepted, by state (forgotten ones in the final state they had).",
    }
    .write(&mut out, by("state", &m.builds, ToString::to_string));
    Family { name: "drover_builds_submitted_total", kind: "counter", help: "Builds accepted." }
        .write(&mut out, one(m.builds_submitted));
    Family {
        name: "drover_build_jobs_ended_total",
        kind: "counter",
        help: "Ends of build jobs, by state; each build counts its own end of a job that builds share.",
    }
    .write(&mut out, by("state", &m.build_jobs_ended, ToString::to_string));
    Family {
        name: "drover_runs_ended_total",
        kind: "counter",
        help: "Runs that ended on workers (a job that builds share runs once), by result.",
    }
    .write(&mut out, by("result", &m.runs_ended, |end| end.name().to_owned()));
    Family {
        name: "drover_workers",
        kind: "gauge",
        help: "Registered workers: holding their lease (up), gone without a word (lost), or left on their own (left).",
    }
    .write(
        &mut out,
        [
            (vec![("state", "up".to_owned())], m.workers_up),
            (vec![("state", "lost".to_owned())], m.workers_lost),
            (vec![("state", "left".to_owned())], m.workers_left),
        ],
    );
    Family {
        name: "drover_core_workers",
        kind: "gauge",
        help: "Workers the scheduling core holds: live ones, and lost ones whose place no new worker took yet.",
    }
    .write(&mut out, one(m.core_workers));
    Family {
        name: "drover_workers_draining",
        kind: "gauge",
        help: "Live workers draining: nothing new goes to them.",
    }
    .write(&mut out, one(m.workers_draining));
    Family { name: "drover_slots", kind: "gauge", help: "Job slots of the live workers." }
        .write(&mut out, one(m.slots));
    Family {
        name: "drover_runs_in_flight",
        kind: "gauge",
        help: "Runs on live workers, stopping ones included.",
    }
    .write(&mut out, one(m.runs_in_flight));
    Family {
        name: "drover_jobs_scheduled",
        kind: "gauge",
        help: "Distinct jobs queued or running in the scheduler (a job that builds share counts once).",
    }
    .write(&mut out, one(m.jobs_scheduled));
    Family {
        name: "drover_queue_jobs_queued",
        kind: "gauge",
        help: "Queued jobs per queue (a parent counts its subtree).",
    }
    .write(&mut out, m.queues.iter().map(|(name, queued, _)| (vec![("queue", name.clone())], *queued)));
    Family { name: "drover_queue_runs", kind: "gauge", help: "Runs holding resources per queue." }
        .write(&mut out, m.queues.iter().map(|(name, _, running)| (vec![("queue", name.clone())], *running)));
    out
}

#[cfg(test)]
mod tests {
    use drover_proto::{BuildState, JobState};
    use drover_solver::RunEnd;

    use super::*;

    #[test]
    fn the_page_lists_every_family_with_its_type_and_escapes_label_values() {
        let m = Metrics {
            builds: vec![(BuildState::Running, 2), (BuildState::Succeeded, 5)],
            builds_submitted: 7,
            build_jobs_ended: vec![(JobState::Succeeded, 40), (JobState::Skipped, 1)],
            runs_ended: vec![(RunEnd::Succeeded, 30), (RunEnd::GaveUp, 0)],
            workers_up: 3,
            workers_draining: 1,
            workers_lost: 1,
            workers_left: 2,
            core_workers: 4,
            slots: 12,
            runs_in_flight: 4,
            jobs_scheduled: 9,
            queues: vec![("default".into(), 9, 4), ("a\"b\\c\nd".into(), 0, 0)],
        };
        let log = LogGauges::default();
        log.since.store(1_234, std::sync::atomic::Ordering::Relaxed);
        log.snapshot_bytes.store(5_678, std::sync::atomic::Ordering::Relaxed);
        log.written.store(2, std::sync::atomic::Ordering::Relaxed);
        let page = render(&m, &log);
        for line in [
            "drover_log_bytes_since_snapshot 1234",
            "drover_snapshot_bytes 5678",
            "# TYPE drover_snapshots_total counter",
            "drover_snapshots_total{result=\"written\"} 2",
            "drover_snapshots_total{result=\"failed\"} 0",
            "# TYPE drover_builds gauge",
            "drover_builds{state=\"running\"} 2",
            "drover_builds{state=\"succeeded\"} 5",
            "# TYPE drover_builds_submitted_total counter",
            "drover_builds_submitted_total 7",
            "drover_build_jobs_ended_total{state=\"succeeded\"} 40",
            "drover_build_jobs_ended_total{state=\"skipped\"} 1",
            "drover_runs_ended_total{result=\"succeeded\"} 30",
            "drover_runs_ended_total{result=\"gave_up\"} 0",
            "drover_workers{state=\"up\"} 3",
            "drover_workers{state=\"lost\"} 1",
            "drover_workers{state=\"left\"} 2",
            "drover_core_workers 4",
            "drover_workers_draining 1",
            "drover_slots 12",
            "drover_runs_in_flight 4",
            "drover_jobs_scheduled 9",
            "drover_queue_jobs_queued{queue=\"default\"} 9",
            "drover_queue_runs{queue=\"default\"} 4",
            "drover_queue_jobs_queued{queue=\"a\\\"b\\\\c\\nd\"} 0",
        ] {
            assert!(page.lines().any(|l| l == line), "no line {line:?} in:\n{page}");
        }
        // Every sample line belongs to a family declared above it, once.
        let mut declared = Vec::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().expect("a name");
                assert!(!declared.contains(&name.to_owned()), "{name} declared twice");
                declared.push(name.to_owned());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().expect("a name");
                assert_eq!(declared.last().map(String::as_str), Some(name), "{line}");
            }
        }
        assert_eq!(declared.len(), 15);
    }
}
