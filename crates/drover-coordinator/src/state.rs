//! The state thread: the one owner of the solver and the input log.
//!
//! Requests arrive as [`Command`]s on a channel. Each turn of the loop takes
//! every command waiting (group commit), applies the inputs to the solver,
//! appends them to the log in one transaction, and only then answers the
//! requests and carries out the effects: nothing becomes visible before it is
//! durable. Queries run after the commit, on the same thread, so they never
//! see state that could still be lost. Timers of the core wake the loop up.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drover_core::Millis;
use drover_proto::{Assignment, RunResult, RunStage};
use drover_solver::{Effect, Input, Reply, Solver, SolverError};
use drover_store::Store;
use tokio::sync::{Notify, oneshot, watch};

/// Most commands handled in one turn (one transaction).
const MAX_BATCH: usize = 4096;

/// Most stage notes kept (the oldest runs' are dropped first).
const MAX_STAGE_NOTES: usize = 100_000;

/// Work for the state thread.
pub(crate) enum Command {
    /// Apply and record an input.
    Input { input: Input, reply: oneshot::Sender<Result<Reply, SolverError>> },
    /// Read the state.
    Query(Box<dyn FnOnce(&Solver) + Send>),
}

/// What a worker's long poll will pick up.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    pub(crate) assign: Vec<Assignment>,
    pub(crate) drop: Vec<u64>,
    pub(crate) stop: Vec<u64>,
    pub(crate) suspend: Vec<u64>,
    pub(crate) resume: Vec<u64>,
    pub(crate) notify: Arc<Notify>,
}

/// State shared between the HTTP handlers and the state thread.
#[derive(Debug)]
pub(crate) struct Shared {
    tx: Mutex<Sender<Command>>,
    pub(crate) mailboxes: Mutex<BTreeMap<u64, Mailbox>>,
    /// Bumped whenever any build's event stream grows.
    pub(crate) version: watch::Sender<u64>,
    /// When each worker's lease was last renewed through a recorded poll.
    renewed: Mutex<BTreeMap<u64, std::time::Instant>>,
    /// The stage each run in flight is in, as its worker last said (display
    /// only, not recorded).
    stages: Mutex<BTreeMap<u64, RunStage>>,
}

/// The state thread is gone (the log failed, or the coordinator is stopping).
#[derive(Debug)]
pub(crate) struct Stopped;

impl Shared {
    fn send(&self, cmd: Command) -> Result<(), Stopped> {
        self.tx.lock().expect("sender lock").send(cmd).map_err(|_| Stopped)
    }

    /// Applies an input durably and returns the solver's reply.
    pub(crate) async fn input(&self, input: Input) -> Result<Result<Reply, SolverError>, Stopped> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Input { input, reply })?;
        rx.await.map_err(|_| Stopped)
    }

    /// Reads the state.
    pub(crate) async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Solver) -> T + Send + 'static,
    ) -> Result<T, Stopped> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Query(Box::new(move |s| {
            let _ = tx.send(f(s));
        })))?;
        rx.await.map_err(|_| Stopped)
    }

    /// Whether a poll from `worker` should renew its lease (and so be
    /// recorded): at most once per `every`, so that busy workers polling
    /// many times a second do not grow the log with renewals.
    pub(crate) fn renewal_due(&self, worker: u64, every: Duration) -> bool {
        let now = std::time::Instant::now();
        let mut renewed = self.renewed.lock().expect("renewals");
        match renewed.get(&worker) {
            Some(&last) if now.duration_since(last) < every => false,
            _ => {
                renewed.insert(worker, now);
                true
            }
        }
    }

    /// Notes the stages runs entered, and forgets those of runs that ended.
    pub(crate) fn note_stages(&self, notes: Vec<RunStage>, finished: &[RunResult]) {
        let mut stages = self.stages.lock().expect("stages");
        for note in notes {
            stages.insert(note.run, note);
        }
        for result in finished {
            stages.remove(&result.run);
        }
        // Runs lost with their worker never report an end: keep the map
        // from growing without bound.
        while stages.len() > MAX_STAGE_NOTES {
            stages.pop_first();
        }
    }

    /// The stage of each run in flight, as last reported.
    pub(crate) fn stages(&self) -> BTreeMap<u64, RunStage> {
        self.stages.lock().expect("stages").clone()
    }

    /// The mailbox's notifier, creating the mailbox if needed.
    pub(crate) fn notifier(&self, worker: u64) -> Arc<Notify> {
        self.mailboxes.lock().expect("mailboxes").entry(worker).or_default().notify.clone()
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Rebuilds the solver from the log, records the restart, and starts the
/// state thread.
pub(crate) fn start(mut store: Store, mut solver: Solver) -> Result<Arc<Shared>, drover_store::StoreError> {
    let mut replayed = 0u64;
    let mut undecodable = 0u64;
    store.replay(|rec| match serde_json::from_slice::<Input>(&rec.body) {
        Ok(input) => {
            let _ = solver.handle(Millis(rec.at), input);
            replayed += 1;
        }
        Err(_) => undecodable += 1,
    })?;
    if undecodable > 0 {
        tracing::warn!(undecodable, "skipped log records this version cannot read");
    }
    solver.take_effects();
    if replayed > 0 {
        // Time stood still for the cluster while the coordinator was down.
        let now = now_ms();
        let input = Input::Restarted;
        let body = serde_json::to_vec(&input).expect("encodable input");
        let _ = solver.handle(Millis(now), input);
        store.append([(now, &body[..])])?;
        solver.take_effects();
        tracing::info!(replayed, "recovered state from the log");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (version, _) = watch::channel(0);
    let shared = Arc::new(Shared {
        tx: Mutex::new(tx),
        mailboxes: Mutex::new(BTreeMap::new()),
        version,
        renewed: Mutex::new(BTreeMap::new()),
        stages: Mutex::new(BTreeMap::new()),
    });
    let thread_shared = shared.clone();
    std::thread::Builder::new()
        .name("drover-state".into())
        .spawn(move || run(store, solver, rx, thread_shared))
        .expect("spawn the state thread");
    Ok(shared)
}

fn run(mut store: Store, mut solver: Solver, rx: Receiver<Command>, shared: Arc<Shared>) {
    loop {
        let wait = solver.poll_timeout().map(|at| Duration::from_millis(at.0.saturating_sub(now_ms())));
        let mut batch = Vec::new();
        match wait {
            Some(wait) => match rx.recv_timeout(wait) {
                Ok(cmd) => batch.push(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => return,
            },
        }
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => break,
            }
        }
        let now = now_ms();
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut replies = Vec::new();
        let mut queries = Vec::new();
        let mut apply = |solver: &mut Solver, input: Input| {
            let body = serde_json::to_vec(&input).expect("encodable input");
            records.push((now, body));
            solver.handle(Millis(now), input)
        };
        if solver.poll_timeout().is_some_and(|at| at.0 <= now) {
            let _ = apply(&mut solver, Input::Tick);
        }
        for cmd in batch {
            match cmd {
                Command::Input { input, reply } => replies.push((reply, apply(&mut solver, input))),
                Command::Query(f) => queries.push(f),
            }
        }
        if !records.is_empty()
            && let Err(e) = store.append(records.iter().map(|(at, body)| (*at, &body[..])))
        {
            // Acting on inputs that were not recorded would break recovery:
            // stop here; requests fail and the process must be restarted.
            tracing::error!("cannot record state, stopping the coordinator: {e}");
            return;
        }
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
        for f in queries {
            f(&solver);
        }
        perform(&shared, solver.take_effects());
    }
}

fn perform(shared: &Shared, effects: Vec<Effect>) {
    let mut changed = false;
    let mut mailboxes = shared.mailboxes.lock().expect("mailboxes");
    for effect in effects {
        match effect {
            Effect::Assign { worker, assignment } => {
                let mb = mailboxes.entry(worker).or_default();
                mb.assign.push(*assignment);
                mb.notify.notify_one();
            }
            Effect::Drop { worker, run } => {
                let mb = mailboxes.entry(worker).or_default();
                mb.assign.retain(|a| a.run != run);
                mb.drop.push(run);
                mb.notify.notify_one();
            }
            Effect::Stop { worker, run } => {
                let mb = mailboxes.entry(worker).or_default();
                mb.stop.push(run);
                mb.notify.notify_one();
            }
            Effect::Suspend { worker, run, resume } => {
                let mb = mailboxes.entry(worker).or_default();
                // The last request for a run wins: the worker applies the
                // two lists in one order, not in the order they came.
                mb.suspend.retain(|r| *r != run);
                mb.resume.retain(|r| *r != run);
                if resume {
                    mb.resume.push(run)
                } else {
                    mb.suspend.push(run)
                }
                mb.notify.notify_one();
            }
            Effect::WorkerLost { worker } => {
                if let Some(mb) = mailboxes.get_mut(&worker) {
                    mb.assign.clear();
                    mb.drop.clear();
                    mb.stop.clear();
                    mb.suspend.clear();
                    mb.resume.clear();
                    mb.notify.notify_one();
                }
            }
            Effect::BuildChanged { .. } => changed = true,
        }
    }
    drop(mailboxes);
    if changed {
        shared.version.send_modify(|v| *v += 1);
    }
}
