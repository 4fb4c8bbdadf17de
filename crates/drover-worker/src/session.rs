//! The worker's session with the coordinator: register, then long-poll.
//! The poll doubles as the heartbeat that renews the worker's lease, so a
//! poll is always outstanding. It does not take the worker's mail: it says
//! when mail waits, and the report task takes it with a report (so every
//! piece of mail arrives in order, in one stream of answers, [`apply`]d
//! here). When the coordinator does not know the worker (it declared it
//! lost, its state was wiped, or it restarted), the session registers
//! again with the runs still going and the artifacts it holds.

use std::sync::Arc;
use std::time::Duration;

use crate::{RunControl, Shared, job};
use drover_proto::{Hash32, HeldArtifact, PollReply, PollRequest, RegisterReply, RegisterRequest};

/// Registers and polls for as long as the worker lives, or until the
/// coordinator refuses its first registration for good (the reason is left
/// in `Shared::refused`).
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut first = true;
    loop {
        let reply = match register(&shared, first).await {
            Ok(reply) => reply,
            Err(why) => {
                *shared.refused.lock().expect("refused") = Some(why);
                return;
            }
        };
        first = false;
        *shared.readers.lock().expect("readers") = reply.readers;
        for run in &reply.stop {
            tracing::warn!(
                run,
                "the coordinator no longer knows this run (given up, or sent elsewhere, while this worker was \
                 away): stopped"
            );
            stop(&shared, *run);
        }
        let generation = shared.outbox.set_session(Some(reply.worker));
        shared.joined.send_replace(Some(reply.worker));
        tracing::info!(worker = reply.worker, coordinator = %shared.config.coordinator, "registered");
        if shared.draining.load(std::sync::atomic::Ordering::SeqCst) {
            drain(&shared, reply.worker).await;
        }
        poll(&shared, (reply.worker, generation), Duration::from_millis(reply.lease_ms)).await;
        tracing::warn!("the coordinator asked this worker to register again");
    }
}

/// Tells the coordinator that this worker (session `id`) drains: nothing
/// new is to come to it. Retried until answered; a registration that comes
/// in between says it again (so does the one that follows when the
/// coordinator no longer knows the session: it answers 404).
pub(crate) async fn drain(shared: &Shared, id: u64) {
    let url = shared.coordinator(&format!("/v1/workers/{id}/drain"));
    let mut backoff = Duration::from_millis(100);
    loop {
        match shared.http.post(&url).await {
            Ok(()) => break,
            Err(drover_http::HttpError::Status { status: 404, .. }) => {
                tracing::info!(
                    worker = id,
                    "the coordinator no longer knows this session: the next one drains"
                );
                return;
            }
            Err(e) => tracing::warn!("cannot tell the coordinator this worker drains, retrying: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    tracing::info!(worker = id, "draining: running jobs finish, nothing new starts");
}

/// Registers, retrying until the coordinator answers. A `first`
/// registration that the coordinator refuses for a reason retrying cannot
/// fix (400 invalid capacity or labels, 401 or 403 token, an answer that
/// is not a drover coordinator's: [`refused_for_good`]) returns the
/// refusal: the worker never joined, and an
/// operator is at hand to fix its flags. Later, the worker has runs and
/// artifacts that the coordinator may take back once its operator fixes it,
/// so it keeps trying, loudly. (409, a live worker under the same name,
/// passes once that worker's lease runs out.)
async fn register(shared: &Shared, first: bool) -> Result<RegisterReply, String> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut running: Vec<u64> = shared.runs.lock().expect("runs").keys().copied().collect();
        running.extend(shared.outbox.undelivered_runs());
        running.sort_unstable();
        running.dedup();
        let artifacts = shared
            .cas
            .artifacts()
            .into_iter()
            .filter_map(|key| {
                let info = shared.cas.artifact_info(&key)?;
                Some(HeldArtifact { job: Hash32(key.0), tree: Hash32(info.tree.0), size: info.size })
            })
            .collect();
        let request = RegisterRequest {
            name: shared.name.clone(),
            url: shared.url.clone(),
            capacity: shared.config.capacity.clone(),
            labels: shared.config.labels.clone(),
            artifacts,
            running,
        };
        match shared.http.post_json(&shared.coordinator("/v1/workers/register"), &request, None).await {
            Ok(reply) => return Ok(reply),
            Err(e) if first && refused_for_good(&e) => {
                return Err(match e.status() {
                    Some(400 | 401 | 403) => e.to_string(),
                    _ => format!("{e} (is --coordinator the address of a drover coordinator?)"),
                });
            }
            Err(e) => {
                tracing::warn!("cannot register with the coordinator, retrying: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Whether the answer to a registration says that trying again cannot help:
/// a refusal of the request itself (4xx, but for a timeout, a conflict or
/// too many requests, which pass) or an answer that is not a drover
/// coordinator's (a method it does not implement, a body it could not
/// have sent).
fn refused_for_good(e: &drover_http::HttpError) -> bool {
    match e {
        drover_http::HttpError::Status { status, .. } => {
            ((400..500).contains(status) && !matches!(status, 408 | 409 | 429)) || *status == 501
        }
        drover_http::HttpError::Decode { .. } | drover_http::HttpError::Url { .. } => true,
        _ => false,
    }
}

/// Polls until the coordinator asks for a new registration.
async fn poll(shared: &Arc<Shared>, (worker, generation): (u64, u64), lease: Duration) {
    let mut ended = shared.outbox.ended.subscribe();
    // Poll often enough that a slow answer never lets the lease run out.
    let wait = (lease / 3).clamp(Duration::from_millis(100), Duration::from_secs(10));
    let url = shared.coordinator(&format!("/v1/workers/{worker}/poll"));
    let mut backoff = Duration::from_millis(100);
    let mut seen = 0;
    loop {
        let request = PollRequest { wait_ms: wait.as_millis() as u64, notify_only: true, seen };
        let answer = tokio::select! {
            answer = shared.http.post_json::<_, PollReply>(&url, &request, Some(wait + Duration::from_secs(10))) => answer,
            // A report found the coordinator no longer knows this session.
            _ = ended.wait_for(|&g| g == generation) => return,
        };
        match answer {
            Ok(reply) => {
                backoff = Duration::from_millis(100);
                if reply.reregister {
                    shared.outbox.set_session(None);
                    return;
                }
                if reply.mail > seen {
                    seen = reply.mail;
                    shared.outbox.fetch(seen);
                }
                // A coordinator that predates `notify_only` answers with
                // the mail itself.
                apply(shared, reply);
            }
            Err(e) if e.status() == Some(404) => {
                shared.outbox.set_session(None);
                return;
            }
            Err(e) => {
                tracing::warn!("poll failed, retrying: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Acts on the mail in an answer: stops and drops, new runs, suspends and
/// resumes.
pub(crate) fn apply(shared: &Arc<Shared>, mail: PollReply) {
    if !mail.has_mail() {
        return;
    }
    for run in mail.drop.iter().chain(&mail.stop) {
        stop(shared, *run);
    }
    for assignment in mail.assign {
        let control = RunControl::default();
        {
            let mut runs = shared.runs.lock().expect("runs");
            if runs.contains_key(&assignment.run) {
                // Mail sent again after an answer that looked lost: the
                // run is going already.
                continue;
            }
            runs.insert(assignment.run, control.clone());
        }
        tokio::spawn(job::run(shared.clone(), assignment, control));
    }
    for (runs, on) in [(&mail.suspend, true), (&mail.resume, false)] {
        for run in runs {
            if let Some(control) = shared.runs.lock().expect("runs").get(run) {
                control.suspend(on, &shared.tokens);
            }
        }
    }
}

/// Stops a run. A run this worker does not have (withdrawn before it was
/// delivered) is reported as ended at once, so the coordinator frees what
/// it had set aside for it; a duplicate report is ignored there.
fn stop(shared: &Shared, run: u64) {
    if let Some(control) = shared.runs.lock().expect("runs").get(&run) {
        control.cancel.cancel();
        return;
    }
    shared.outbox.finished(drover_proto::RunResult {
        run,
        success: false,
        exit_code: None,
        cached: false,
        detail: "cancelled before it started".into(),
        output: None,
        duration_ms: 0,
        stages: Default::default(),
        lost_inputs: Vec::new(),
        worker_fault: false,
    });
}
