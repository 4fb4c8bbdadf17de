//! Reports to the coordinator: run started, run finished (with its output),
//! artifacts added and evicted, and the stage each run is in (display only:
//! only the latest stage of each run is sent). Job tasks put items in the
//! [`Outbox`]; one
//! task sends whatever has gathered in a single request, and keeps it (in
//! order) until the coordinator has taken it, so nothing is lost while the
//! coordinator restarts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::collections::BTreeMap;

use drover_proto::{HeldArtifact, PollReply, Report, RunResult, RunStage};
use tokio::sync::{Notify, watch};

use crate::Shared;

/// Reports waiting to be sent, and the session they go to.
#[derive(Debug)]
pub(crate) struct Outbox {
    pending: Mutex<Report>,
    /// Stages entered since the last report, latest per run.
    stages: Mutex<BTreeMap<u64, RunStage>>,
    ready: Notify,
    /// The worker ID of the current session (`None` while registering).
    session: watch::Sender<Option<u64>>,
    /// Set when the coordinator no longer knows this worker.
    pub(crate) reregister: Notify,
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            pending: Mutex::new(Report::default()),
            stages: Mutex::new(BTreeMap::new()),
            ready: Notify::new(),
            session: watch::Sender::new(None),
            reregister: Notify::new(),
        }
    }
}

impl Outbox {
    fn push(&self, f: impl FnOnce(&mut Report)) {
        f(&mut self.pending.lock().expect("outbox"));
        self.ready.notify_one();
    }

    pub(crate) fn started(&self, run: u64) {
        self.push(|r| r.started.push(run));
    }

    pub(crate) fn finished(&self, result: RunResult) {
        self.stages.lock().expect("stages").remove(&result.run);
        self.push(|r| r.finished.push(result));
    }

    /// The run entered a stage (`waiting` for its tokens, or working).
    pub(crate) fn stage(&self, run: u64, stage: &str, waiting: bool) {
        let note = RunStage { run, stage: stage.to_owned(), waiting };
        self.stages.lock().expect("stages").insert(run, note);
        self.ready.notify_one();
    }

    pub(crate) fn added(&self, artifact: HeldArtifact) {
        self.push(|r| r.added.push(artifact));
    }

    /// Finished runs whose report has not been delivered yet: to the
    /// coordinator they are still running.
    pub(crate) fn undelivered_runs(&self) -> Vec<u64> {
        self.pending.lock().expect("outbox").finished.iter().map(|r| r.run).collect()
    }

    pub(crate) fn set_session(&self, id: Option<u64>) {
        self.session.send_replace(id);
    }

    /// Puts a report that could not be delivered back in front of what came
    /// since.
    fn restore(&self, mut sent: Report) {
        let mut pending = self.pending.lock().expect("outbox");
        let later = std::mem::take(&mut *pending);
        sent.started.extend(later.started);
        sent.finished.extend(later.finished);
        sent.added.extend(later.added);
        sent.evicted.extend(later.evicted);
        // Stage notes are display only: put back those not superseded (and
        // not of runs that ended meanwhile).
        let finished: Vec<u64> = sent.finished.iter().map(|r| r.run).collect();
        let mut stages = self.stages.lock().expect("stages");
        for note in std::mem::take(&mut sent.stages) {
            if !finished.contains(&note.run) {
                stages.entry(note.run).or_insert(note);
            }
        }
        *pending = sent;
    }
}

/// Sends reports for as long as the worker lives.
pub(crate) async fn run(shared: Arc<Shared>) {
    let outbox = &shared.outbox;
    let mut session = outbox.session.subscribe();
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(id) = *session.borrow_and_update() else {
            let _ = session.changed().await;
            continue;
        };
        let report = {
            let mut pending = outbox.pending.lock().expect("outbox");
            pending.evicted.extend(shared.cas.take_evicted().into_iter().map(|k| drover_proto::Hash32(k.0)));
            let mut report = std::mem::take(&mut *pending);
            report.stages =
                std::mem::take(&mut *outbox.stages.lock().expect("stages")).into_values().collect();
            report
        };
        if report == Report::default() {
            tokio::select! {
                () = outbox.ready.notified() => {}
                _ = session.changed() => {}
            }
            continue;
        }
        let url = shared.coordinator(&format!("/v1/workers/{id}/report"));
        match shared.http.post_json::<_, PollReply>(&url, &report, None).await {
            Ok(reply) => {
                backoff = Duration::from_millis(50);
                if reply.reregister {
                    outbox.restore(report);
                    outbox.set_session(None);
                    outbox.reregister.notify_one();
                }
            }
            Err(e) => {
                tracing::warn!("report not delivered, will retry: {e}");
                outbox.restore(report);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
