//! Reports to the coordinator: run started, run finished (with its output),
//! artifacts added and evicted, and the stage each run is in (display only:
//! only the latest stage of each run is sent). Job tasks put items in the
//! [`Outbox`]; one task sends whatever has gathered in a single request, and
//! keeps it (in order) until the coordinator has taken it, so nothing is lost
//! while the coordinator restarts.
//!
//! The answer to every report carries the worker's mail (assignments,
//! drops, stops, suspends, resumes; [`drover_proto::Report::deliver`]): the
//! poll only says that mail waits ([`Outbox::fetch`]), so all mail arrives
//! in order, through this one task, and a busy worker gets its next job in
//! the answer to the report of the one before.
//!
//! A start or a stage note alone waits up to [`HOLD`] for company: a quick
//! run's start travels with its end, so it costs one report, not two or
//! three. An end, a fetch of mail and cache news go at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_proto::{HeldArtifact, PollReply, Report, RunResult, RunStage};
use tokio::sync::{Notify, watch};

use crate::Shared;

/// How long a start or a stage note may wait for something else to send.
pub(crate) const HOLD: Duration = Duration::from_millis(20);

/// Reports waiting to be sent, and the session they go to.
#[derive(Debug)]
pub(crate) struct Outbox {
    pending: Mutex<Pending>,
    ready: Notify,
    /// The worker ID of the current session (`None` while registering).
    /// Changed only with [`Pending::generation`], under its lock.
    pub(crate) session: watch::Sender<Option<u64>>,
    /// The latest session generation a report found the coordinator no
    /// longer knows (see [`Outbox::end_session`]): that session's poll
    /// ends, and the worker registers again.
    pub(crate) ended: watch::Sender<u64>,
}

/// What the next report will carry.
#[derive(Debug, Default)]
struct Pending {
    /// Starts, ends and cache news, in order.
    report: Report,
    /// Stages entered since the last report, latest per run.
    stages: BTreeMap<u64, RunStage>,
    /// When the oldest start or stage note still waiting was noted.
    since: Option<Instant>,
    /// Mail up to this version waits at the coordinator (0: none known).
    fetch: u64,
    /// The highest mail version an answer brought this session: sent with
    /// every report that takes mail, so that the coordinator sends again
    /// what a lost answer carried (`Report::received`).
    received: u64,
    /// Ends in the report being sent: still running to the coordinator.
    sending: Vec<u64>,
    /// Counts the changes of [`Outbox::session`]: a session is its worker
    /// ID and its generation (the ID is the same for every registration).
    generation: u64,
}

/// When the next report is due.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    /// Something must go now.
    Now,
    /// Only starts or stage notes wait: send them at this instant, unless
    /// something else comes first.
    At(Instant),
    /// Nothing to send.
    Idle,
}

impl Pending {
    fn due(&self) -> Due {
        let r = &self.report;
        if self.fetch > 0 || !r.finished.is_empty() || !r.added.is_empty() || !r.evicted.is_empty() {
            Due::Now
        } else if let Some(since) = self.since {
            Due::At(since + HOLD)
        } else {
            Due::Idle
        }
    }

    /// Notes that a start or a stage note waits, from `now`.
    fn hold(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// Takes everything for a report that asks for the mail; returns it
    /// with the time its oldest held item was noted.
    fn take(&mut self) -> (Report, Option<Instant>) {
        let mut report = std::mem::take(&mut self.report);
        report.stages = std::mem::take(&mut self.stages).into_values().collect();
        report.deliver = true;
        report.received = Some(self.received);
        self.sending = report.finished.iter().map(|r| r.run).collect();
        (report, self.since.take())
    }

    /// Puts a report that could not be delivered back in front of what
    /// came since.
    fn restore(&mut self, mut sent: Report, since: Option<Instant>) {
        let later = std::mem::take(&mut self.report);
        sent.started.extend(later.started);
        sent.finished.extend(later.finished);
        sent.added.extend(later.added);
        sent.evicted.extend(later.evicted);
        sent.deliver = false;
        // Stage notes are display only: put back those not superseded (and
        // not of runs that ended meanwhile).
        let finished: Vec<u64> = sent.finished.iter().map(|r| r.run).collect();
        for note in std::mem::take(&mut sent.stages) {
            if !finished.contains(&note.run) {
                self.stages.entry(note.run).or_insert(note);
            }
        }
        self.report = sent;
        self.sending.clear();
        self.since = match (since, self.since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// The coordinator took the report, and answered with mail up to
    /// version `taken`.
    fn delivered(&mut self, taken: u64) {
        self.sending.clear();
        self.received = self.received.max(taken);
        if self.fetch <= taken {
            self.fetch = 0;
        }
    }
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            pending: Mutex::new(Pending::default()),
            ready: Notify::new(),
            session: watch::Sender::new(None),
            ended: watch::Sender::new(0),
        }
    }
}

impl Outbox {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().expect("outbox")
    }

    /// Something that must go at once was added.
    fn push(&self, f: impl FnOnce(&mut Report)) {
        f(&mut self.pending().report);
        self.ready.notify_one();
    }

    /// The run started: reported with the next report, at most [`HOLD`]
    /// from now.
    pub(crate) fn started(&self, run: u64) {
        let mut pending = self.pending();
        pending.report.started.push(run);
        pending.hold(Instant::now());
        drop(pending);
        self.ready.notify_one();
    }

    pub(crate) fn finished(&self, result: RunResult) {
        let mut pending = self.pending();
        pending.stages.remove(&result.run);
        pending.report.finished.push(result);
        drop(pending);
        self.ready.notify_one();
    }

    /// The run entered a stage (`waiting` for its tokens, or working).
    pub(crate) fn stage(&self, run: u64, stage: &str, waiting: bool) {
        let note = RunStage { run, stage: stage.to_owned(), waiting };
        let mut pending = self.pending();
        pending.stages.insert(run, note);
        pending.hold(Instant::now());
        drop(pending);
        self.ready.notify_one();
    }

    pub(crate) fn added(&self, artifact: HeldArtifact) {
        self.push(|r| r.added.push(artifact));
    }

    /// Mail up to `version` waits at the coordinator: a report goes at
    /// once to take it.
    pub(crate) fn fetch(&self, version: u64) {
        let mut pending = self.pending();
        pending.fetch = pending.fetch.max(version);
        drop(pending);
        self.ready.notify_one();
    }

    /// Finished runs whose report has not been delivered yet: to the
    /// coordinator they are still running.
    pub(crate) fn undelivered_runs(&self) -> Vec<u64> {
        let pending = self.pending();
        pending.report.finished.iter().map(|r| r.run).chain(pending.sending.iter().copied()).collect()
    }

    /// Sets the session (`None`: ended); returns its generation.
    pub(crate) fn set_session(&self, id: Option<u64>) -> u64 {
        self.change_session(&mut self.pending(), id)
    }

    /// [`Outbox::set_session`], under the lock of what is pending, so that
    /// the ID and the generation change as one.
    fn change_session(&self, pending: &mut Pending, id: Option<u64>) -> u64 {
        // Mail versions belong to a session.
        pending.fetch = 0;
        pending.received = 0;
        pending.generation += 1;
        self.session.send_replace(id);
        pending.generation
    }

    /// The current session's worker ID and generation.
    pub(crate) fn current(&self) -> (Option<u64>, u64) {
        let pending = self.pending();
        (*self.session.borrow(), pending.generation)
    }

    /// Ends the session of generation `generation`, if it is still the
    /// current one, and tells its poll; whether it did. A report refused
    /// for a session the poll already ended (and the worker perhaps
    /// registered again after) ends nothing: the new session stays.
    pub(crate) fn end_session(&self, generation: u64) -> bool {
        let mut pending = self.pending();
        if pending.generation != generation {
            return false;
        }
        self.change_session(&mut pending, None);
        drop(pending);
        self.ended.send_replace(generation);
        true
    }
}

/// Sends reports for as long as the worker lives, and hands the mail in
/// their answers to the session.
pub(crate) async fn run(shared: Arc<Shared>) {
    let outbox = &shared.outbox;
    let mut session = outbox.session.subscribe();
    let mut backoff = Duration::from_millis(50);
    // Whether the cache was last seen holding more than its size.
    let mut over_size = false;
    loop {
        session.mark_unchanged();
        let (Some(id), generation) = outbox.current() else {
            let _ = session.changed().await;
            continue;
        };
        let due = {
            let mut pending = outbox.pending();
            pending
                .report
                .evicted
                .extend(shared.cas.take_evicted().into_iter().map(|k| drover_proto::Hash32(k.0)));
            match shared.cas.reserve_news() {
                Some(true) => tracing::warn!(
                    "the cache's disk is short of the room it keeps free (--cache-keep-free) and nothing more \
                     in the cache can be evicted (what is left is in use): jobs may fail for lack of space"
                ),
                Some(false) => tracing::info!("the cache's disk has the room it keeps free again"),
                None => {}
            }
            let (used, size) = (shared.cas.used_bytes(), shared.cas.max_bytes());
            if (used > size) != over_size {
                over_size = used > size;
                if over_size {
                    tracing::warn!(
                        "the cache is too small: what is in use in it (the inputs of the running jobs, the \
                         outputs waiting to be pushed or being sent to other workers: {used} bytes) is more \
                         than its --cache-size ({size} bytes), so every other entry is evicted at once (outputs \
                         other workers still need too, which are then built again); give the worker a larger \
                         --cache-size"
                    );
                } else {
                    tracing::info!("the cache is within its --cache-size again");
                }
            }
            pending.due()
        };
        let (report, since) = match due {
            Due::Now => outbox.pending().take(),
            Due::At(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => outbox.pending().take(),
                    () = outbox.ready.notified() => continue,
                    _ = session.changed() => continue,
                }
            }
            Due::Idle => {
                tokio::select! {
                    () = outbox.ready.notified() => {}
                    _ = session.changed() => {}
                }
                continue;
            }
        };
        let url = shared.coordinator(&format!("/v1/workers/{id}/report"));
        match shared.http.post_json::<_, PollReply>(&url, &report, None).await {
            Ok(reply) if reply.reregister => {
                outbox.pending().restore(report, since);
                // Unless the session changed since this report went out
                // (the poll heard the same, and the worker may have
                // registered again already): ending that new session would
                // lose its runs and spend their attempts.
                outbox.end_session(generation);
            }
            Ok(reply) => {
                backoff = Duration::from_millis(50);
                outbox.pending().delivered(reply.mail);
                crate::session::apply(&shared, reply);
            }
            Err(e) => {
                tracing::warn!("report not delivered, will retry: {e}");
                outbox.pending().restore(report, since);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The end of run `run`, successful and without output (for tests).
#[cfg(test)]
pub(crate) fn ended(run: u64) -> RunResult {
    RunResult {
        run,
        success: true,
        exit_code: Some(0),
        cached: false,
        detail: String::new(),
        output: None,
        duration_ms: 0,
        stages: BTreeMap::new(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(run: u64) -> RunStage {
        RunStage { run, stage: "build".into(), waiting: false }
    }

    /// A report refused for a session the poll already ended, after the
    /// worker registered again, ends nothing: the new session stays, and
    /// its poll is not told to register again (each refusal made a second
    /// registration, losing the runs just given to the first).
    #[test]
    fn a_late_refusal_does_not_end_the_next_session() {
        let outbox = Outbox::default();
        let first = outbox.set_session(Some(7));
        assert!(outbox.end_session(first), "a refusal ends its own session");
        assert_eq!((*outbox.session.borrow(), *outbox.ended.borrow()), (None, first));
        let second = outbox.set_session(Some(7));
        // The poll hears the refusal first, and the worker registers again.
        outbox.set_session(None);
        let third = outbox.set_session(Some(7));
        assert!(!outbox.end_session(second), "the report's session is gone already");
        assert_eq!(outbox.current(), (Some(7), third));
        assert_eq!(*outbox.ended.borrow(), first, "no poll is told to stop");
    }

    #[test]
    fn a_start_waits_for_its_end_and_goes_with_it() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        assert_eq!(p.due(), Due::Idle);
        p.report.started.push(7);
        p.hold(t0);
        p.stages.insert(7, note(7));
        p.hold(t0 + Duration::from_millis(5));
        // The oldest held item decides.
        assert_eq!(p.due(), Due::At(t0 + HOLD));
        p.stages.remove(&7);
        p.report.finished.push(ended(7));
        assert_eq!(p.due(), Due::Now);
        let (report, since) = p.take();
        assert_eq!(report.started, vec![7]);
        assert_eq!(report.finished.len(), 1);
        assert!(report.stages.is_empty() && report.deliver);
        assert_eq!(since, Some(t0));
        assert_eq!(p.due(), Due::Idle);
    }

    #[test]
    fn a_report_that_failed_keeps_its_order_and_its_deadline() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.report.started.push(1);
        p.hold(t0);
        let (report, since) = p.take();
        p.report.started.push(2);
        p.hold(t0 + Duration::from_millis(9));
        p.restore(report, since);
        assert_eq!(p.report.started, vec![1, 2]);
        assert!(!p.report.deliver);
        assert_eq!(p.due(), Due::At(t0 + HOLD));
    }

    #[test]
    fn reports_that_take_mail_say_which_mail_arrived() {
        let mut p = Pending::default();
        assert_eq!(p.take().0.received, Some(0), "nothing yet this session");
        p.delivered(4);
        let (report, since) = p.take();
        assert_eq!(report.received, Some(4));
        // Its answer was lost: the report goes again, still at 4.
        p.restore(report, since);
        assert_eq!(p.take().0.received, Some(4));
        p.delivered(6);
        p.delivered(5);
        assert_eq!(p.take().0.received, Some(6), "an older answer never lowers it");
    }

    #[test]
    fn mail_is_fetched_until_an_answer_takes_it() {
        let mut p = Pending { fetch: 3, ..Pending::default() };
        assert_eq!(p.due(), Due::Now);
        let (report, _) = p.take();
        assert!(report.deliver && report.started.is_empty());
        // An answer that took older mail leaves the newer to fetch.
        p.fetch = p.fetch.max(5);
        p.delivered(4);
        assert_eq!(p.due(), Due::Now);
        p.delivered(5);
        assert_eq!(p.due(), Due::Idle);
    }

    #[test]
    fn ends_being_sent_still_count_as_running() {
        let mut p = Pending::default();
        p.report.finished.push(ended(4));
        let (report, since) = p.take();
        assert_eq!(p.sending, vec![4]);
        p.restore(report, since);
        assert!(p.sending.is_empty());
        assert_eq!(p.report.finished.len(), 1);
    }
}
