//! The state thread: the one owner of the solver and the input log.
//!
//! Requests arrive as [`Command`]s on a channel. Each turn of the loop takes
//! every command waiting (group commit), except that it carries out at most
//! one submit, after the others (the rest wait for the next turns: see
//! `next_turn`), applies the inputs to the solver,
//! appends them to the log in one transaction, and only then carries out the
//! effects and answers the requests: nothing becomes visible before it is
//! durable. A report that asks for it is answered with its worker's mail as
//! the turn's effects left it, so a busy worker gets the next job in the
//! answer to the report that freed its slot. Queries run after the commit,
//! on the same thread, so they never see state that could still be lost.
//! Timers of the core wake the loop up.
//!
//! Clients following a build's event stream do not ask the state thread
//! for news: at the end of each turn it hands the new events of every build
//! that changed to that build's followers, once per build (see
//! [`Followers`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drover_core::Millis;
use drover_proto::{BuildEvent, PollReply, Report, RunResult, RunStage, SubmitRequest};
use drover_solver::{Effect, Input, Reply, Solver, SolverError};
use drover_store::Store;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::snapshots::{self, Snapshots};

/// Most commands handled in one turn (one transaction).
const MAX_BATCH: usize = 4096;

/// Most stage notes kept (the oldest runs' are dropped first).
const MAX_STAGE_NOTES: usize = 100_000;

/// Most updates waiting for one follower of a build's events. A follower
/// that falls further behind (its client reads too slowly) is dropped, and
/// follows again from where it is.
const FOLLOW_BACKLOG: usize = 256;

/// Work for the state thread.
pub(crate) enum Command {
    /// Apply an input and write its `record` (see [`record`]).
    Input { input: Input, record: Vec<u8>, reply: oneshot::Sender<Result<Reply, SolverError>> },
    /// Apply a worker's report (`input`, an [`Input::Report`]) and write its
    /// `record`; with `deliver`, the answer also takes the worker's mail
    /// once the turn's effects are in its mailbox.
    Report {
        worker: u64,
        input: Input,
        record: Vec<u8>,
        deliver: Delivery,
        reply: oneshot::Sender<PollReply>,
    },
    /// Read the state.
    Query(Box<dyn FnOnce(&Solver) + Send>),
    /// A snapshot's writing ended (see [`Snapshots::start`]).
    Snapshot(snapshots::Written),
    /// Follow a build's events from `from` (`None` for an unknown build).
    Follow { build: u64, from: u64, reply: oneshot::Sender<Option<Follow>> },
    /// Submit a build: recorded as `Input::SubmitLike` if a build holds its
    /// very spec (`holder`, the latest the spec cache knows, is checked
    /// first), else whole (`record`: encoded ahead, if it was).
    Submit {
        req: SubmitRequest,
        record: Option<Vec<u8>>,
        holder: Option<u64>,
        reply: oneshot::Sender<Result<Reply, SolverError>>,
    },
}

impl Command {
    /// A build submitted: the one command a turn carries out at most once.
    fn is_submit(&self) -> bool {
        matches!(
            self,
            Command::Submit { .. }
                | Command::Input { input: Input::Submit(_) | Input::SubmitLike { .. }, .. }
        )
    }
}

/// What a turn carries out of the commands that came (`batch`, in order):
/// every one that is not a submit, in order, then at most one submit, the
/// oldest of those waiting in `submits` (where the others of `batch` join
/// them). Each answer waits for its whole turn (one transaction), and a
/// burst of large builds submitted together must not hold back the workers
/// waiting meanwhile for their next job in a report's answer. No command
/// can depend on a submit still waiting: its client learns the build's ID
/// from the submit's answer.
fn next_turn(batch: Vec<Command>, submits: &mut VecDeque<Command>) -> Vec<Command> {
    let (mut turn, waiting): (Vec<Command>, Vec<Command>) = batch.into_iter().partition(|c| !c.is_submit());
    submits.extend(waiting);
    turn.extend(submits.pop_front());
    turn
}

/// New events of a build, handed to each of its followers.
#[derive(Debug)]
pub(crate) struct Update {
    pub(crate) events: Vec<BuildEvent>,
    /// The build is over: nothing follows.
    pub(crate) finished: bool,
}

/// Where a follower of a build's events gets them.
pub(crate) type Live = mpsc::Receiver<Arc<Update>>;

/// A build's event stream from a position: the events there are, and, while
/// the build is not over, the rest as they come. The channel closes early if
/// the follower falls behind or the state thread stops; the follower then
/// follows again from the last event it got.
#[derive(Debug)]
pub(crate) struct Follow {
    pub(crate) history: Vec<BuildEvent>,
    pub(crate) finished: bool,
    pub(crate) live: Option<Live>,
}

/// The followers of builds' event streams (owned by the state thread). Each
/// turn's new events of a build are cloned once and shared by all its
/// followers, and only the followers of builds that changed are woken.
#[derive(Debug, Default)]
struct Followers {
    /// By build.
    builds: BTreeMap<u64, Following>,
}

/// The followers of one build.
#[derive(Debug)]
struct Following {
    /// How many of the build's events were handed out.
    seen: u64,
    channels: Vec<mpsc::Sender<Arc<Update>>>,
}

impl Followers {
    /// A new follower of `build` from `from`. Called once the turn's new
    /// events went out, so the history ends where the next update starts
    /// (a follower drops any event it already has, by `seq`, all the same).
    fn add(&mut self, solver: &Solver, build: u64, from: u64, backlog: usize) -> Option<Follow> {
        let (history, finished) = solver.events(build, from)?;
        if finished {
            return Some(Follow { history, finished, live: None });
        }
        let (tx, rx) = mpsc::channel(backlog);
        let seen = solver.event_count(build).unwrap_or(0);
        self.builds
            .entry(build)
            .or_insert_with(|| Following { seen, channels: Vec::new() })
            .channels
            .push(tx);
        Some(Follow { history, finished, live: Some(rx) })
    }

    /// Hands the new events of each build in `changed` to its followers;
    /// drops followers that are gone or too far behind, and every follower
    /// of a build that is over.
    fn publish(&mut self, solver: &Solver, changed: &BTreeSet<u64>) {
        for build in changed {
            let Some(following) = self.builds.get_mut(build) else { continue };
            let Some((events, finished)) = solver.events(*build, following.seen) else {
                self.builds.remove(build);
                continue;
            };
            if events.is_empty() && !finished {
                continue;
            }
            following.seen += events.len() as u64;
            let update = Arc::new(Update { events, finished });
            following.channels.retain(|tx| tx.try_send(update.clone()).is_ok());
            if finished || following.channels.is_empty() {
                self.builds.remove(build);
            }
        }
    }
}

/// A worker's mail: what its next poll (or, if it asks, its next report's
/// answer) takes. Whoever takes it takes all of it, under the lock, so each
/// item reaches the worker in exactly one answer.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    /// The mail (its `reregister` and `mail` fields unused here).
    mail: PollReply,
    /// Bumped whenever mail is added (see `PollRequest::seen`).
    version: u64,
    /// The mail the last answer took, and that answer's version, kept until
    /// the worker says it arrived (see `Report::received`): sent again if
    /// it did not.
    unacked: PollReply,
    unacked_version: u64,
    /// The worker registered with this process and was not lost since.
    /// Mail lives in memory only: after a restart every worker registers
    /// again, listing its runs, so runs whose assignment was still in a
    /// mailbox (or in an answer that never arrived) are requeued.
    open: bool,
    pub(crate) notify: Arc<Notify>,
}

impl Mailbox {
    /// Is there mail?
    pub(crate) fn has_mail(&self) -> bool {
        self.mail.has_mail()
    }

    /// Takes the mail, as the answer to a poll or a report (`reregister`
    /// if the worker has no session here). `received`: the last version the
    /// worker says it got (`Report::received`), for a worker that says so:
    /// the mail of an answer it did not get goes out again, ahead of what
    /// came since, and this answer's mail is kept until it says it got it.
    pub(crate) fn take(&mut self, received: Option<u64>) -> PollReply {
        if !self.open {
            return PollReply { reregister: true, ..PollReply::default() };
        }
        if let Some(got) = received {
            let unacked = std::mem::take(&mut self.unacked);
            if got < self.unacked_version && unacked.has_mail() {
                self.put_back(unacked);
            }
        }
        let taken = PollReply { mail: self.version, ..std::mem::take(&mut self.mail) };
        if received.is_some() && taken.has_mail() {
            self.unacked = taken.clone();
            self.unacked_version = taken.mail;
        }
        taken
    }

    /// Mail taken for an answer that was never sent (the request had gone):
    /// back in the box, ahead of what came since, and no longer kept as
    /// sent. Unless a later answer took it again already (the worker sent
    /// the same report again, saying it had not received it): that answer
    /// carries it, and is kept until acknowledged.
    pub(crate) fn returned(&mut self, taken: PollReply) {
        if taken.mail < self.unacked_version {
            return;
        }
        self.unacked = PollReply::default();
        self.put_back(taken);
    }

    /// Puts mail that was taken but never reached the worker back, ahead of
    /// what came since (a drop or stop that came since still follows the
    /// assignment it is about).
    fn put_back(&mut self, taken: PollReply) {
        let newer = std::mem::replace(&mut self.mail, taken);
        self.mail.assign.extend(newer.assign);
        self.mail.drop.extend(newer.drop);
        self.mail.stop.extend(newer.stop);
        // The last request for a run wins (see `perform`).
        for (run, resume) in
            newer.suspend.iter().map(|r| (*r, false)).chain(newer.resume.iter().map(|r| (*r, true)))
        {
            self.mail.suspend.retain(|r| *r != run);
            self.mail.resume.retain(|r| *r != run);
            if resume {
                self.mail.resume.push(run);
            } else {
                self.mail.suspend.push(run);
            }
        }
        self.version += 1;
    }

    /// The version of the mail waiting, if any (for a `notify_only` poll).
    pub(crate) fn waiting(&self) -> Option<u64> {
        self.has_mail().then_some(self.version)
    }

    /// Does the worker have a session with this process?
    pub(crate) fn open(&self) -> bool {
        self.open
    }
}

/// Whether a report's answer takes the worker's mail (`Report::deliver`),
/// and the last mail version the worker says it received
/// (`Report::received`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) take: bool,
    pub(crate) received: Option<u64>,
}

/// State shared between the HTTP handlers and the state thread.
#[derive(Debug)]
pub(crate) struct Shared {
    tx: Mutex<Sender<Command>>,
    pub(crate) mailboxes: Mutex<BTreeMap<u64, Mailbox>>,
    /// When each worker's lease was last renewed through a recorded poll.
    renewed: Mutex<BTreeMap<u64, std::time::Instant>>,
    /// The stage each run in flight is in, as its worker last said (display
    /// only, not recorded).
    stages: Mutex<BTreeMap<u64, RunStage>>,
    /// The log's figures (see `snapshots::LogGauges`).
    pub(crate) log: Arc<snapshots::LogGauges>,
    /// Why the state thread stopped for good (its log failed), once it did:
    /// the process should end, for a supervisor to start it again.
    pub(crate) failed: tokio::sync::watch::Sender<Option<String>>,
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
        let record = record(&input);
        self.send(Command::Input { input, record, reply })?;
        rx.await.map_err(|_| Stopped)
    }

    /// Submits a build. `fresh`: no build can hold its spec yet, so it will
    /// be recorded whole: its record is encoded here, off the state thread.
    /// `holder`: a build the spec cache knows to hold the very spec.
    pub(crate) async fn submit(
        &self,
        req: SubmitRequest,
        fresh: bool,
        holder: Option<u64>,
    ) -> Result<Result<Reply, SolverError>, Stopped> {
        let record = fresh.then(|| record(&Input::Submit(req.clone())));
        let (reply, rx) = oneshot::channel();
        self.send(Command::Submit { req, record, holder, reply })?;
        rx.await.map_err(|_| Stopped)
    }

    /// Applies a worker's report durably; the answer says whether the
    /// worker must register again and, with `deliver`, carries its mail.
    pub(crate) async fn report(
        &self,
        worker: u64,
        report: Report,
        deliver: Delivery,
    ) -> Result<PollReply, Stopped> {
        let (reply, rx) = oneshot::channel();
        let input = Input::Report { worker, report };
        let record = record(&input);
        self.send(Command::Report { worker, input, record, deliver, reply })?;
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

    /// Follows a build's events from `from`; `None` for an unknown build.
    pub(crate) async fn follow(&self, build: u64, from: u64) -> Result<Option<Follow>, Stopped> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Follow { build, from, reply })?;
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

    /// The workers whose open mailbox holds mail, with its version.
    pub(crate) fn pending_mail(&self) -> BTreeMap<u64, u64> {
        let boxes = self.mailboxes.lock().expect("mailboxes");
        boxes.iter().filter(|(_, mb)| mb.open && mb.has_mail()).map(|(&w, mb)| (w, mb.version)).collect()
    }

    /// Runs `f` on the worker's mailbox; `None` if it has none (it never
    /// registered with this process, or it was forgotten). Requests never
    /// create mailboxes: only the solver's effects do, so workers that are
    /// not (or no longer) known cost nothing here.
    pub(crate) fn mailbox<T>(&self, worker: u64, f: impl FnOnce(&mut Mailbox) -> T) -> Option<T> {
        self.mailboxes.lock().expect("mailboxes").get_mut(&worker).map(f)
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Rebuilds the solver from the log (its snapshot, if it begins with one,
/// then the records after it; `fresh`, under the configured settings, if
/// not), records the restart and any change of settings, and starts the
/// state thread.
pub(crate) fn start(
    mut store: Store,
    fresh: Solver,
    mut snapshots: Snapshots,
) -> Result<Arc<Shared>, crate::CoordinatorError> {
    let configured = fresh.config().clone();
    let (mut solver, after) = snapshots::restore(&store, fresh, &mut snapshots)?;
    let mut replayed = 0u64;
    let mut undecodable = 0u64;
    // Whether the log says which settings it began under: a log that does
    // not begin with a snapshot begins with them (see below), and is
    // replayed under them, not under today's.
    let mut settings_known = after > 0;
    store.replay(after, |rec| {
        snapshots.recorded(rec.body.len() as u64);
        match serde_json::from_slice::<Input>(&rec.body) {
            Ok(input) => {
                match input {
                    // The settings a log without a snapshot began under: its
                    // replay starts from them, as the log did (seed and all;
                    // handled as a change, the draws would go on from
                    // today's seed).
                    Input::Configure { core } if replayed == 0 && after == 0 => {
                        solver = Solver::new(*core);
                        settings_known = true;
                    }
                    input => {
                        let _ = solver.handle(Millis(rec.at), input);
                    }
                }
                replayed += 1;
            }
            Err(_) => undecodable += 1,
        }
    })?;
    if undecodable > 0 {
        tracing::warn!(undecodable, "skipped log records this version cannot read");
    }
    if replayed > 0 && !settings_known {
        tracing::warn!(
            "the log does not say which scheduler settings it was recorded under (an older drover wrote it): \
             it was replayed under the configured ones; if they changed since, builds may read differently"
        );
    }
    solver.take_effects();
    // Recorded together once both are known to apply: a start refused for
    // its settings leaves the log as it was.
    let now = now_ms();
    let mut records = Vec::new();
    if replayed > 0 || after > 0 {
        // Time stood still for the cluster while the coordinator was down.
        let _ = solver.handle(Millis(now), Input::Restarted);
        records.push(record(&Input::Restarted));
        // The workers' mail went with the last process: a run handed to a
        // worker now would wait in a mailbox it no longer polls, and be
        // found lost when it registers again (an attempt spent for
        // nothing). Each live worker drains until it registers again, at
        // its next poll.
        for w in solver.workers().into_iter().filter(|w| w.alive && !w.draining) {
            if solver.handle(Millis(now), Input::Drain { worker: w.id }).is_ok() {
                records.push(record(&Input::Drain { worker: w.id }));
            }
        }
        tracing::info!(snapshot = after, replayed, "recovered state from the log");
    }
    if replayed == 0 && after == 0 {
        // A new log: its first record is the settings it is recorded under,
        // so that a later start under other settings replays it as it was
        // and then changes them (`snapshots::configure`), instead of
        // deciding its past anew under the new ones.
        records.push(record(&Input::Configure { core: Box::new(configured.clone()) }));
    }
    records.extend(snapshots::configure(&mut solver, &configured, now)?);
    store.append(records.iter().map(|body| (now, &body[..])))?;
    solver.take_effects();
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared {
        tx: Mutex::new(tx),
        mailboxes: Mutex::new(BTreeMap::new()),
        renewed: Mutex::new(BTreeMap::new()),
        stages: Mutex::new(BTreeMap::new()),
        log: snapshots.gauges(),
        failed: tokio::sync::watch::Sender::new(None),
    });
    // The thread holds the shared state weakly: once every handler and
    // client has let go of it, the channel closes and the thread ends.
    let thread_shared = Arc::downgrade(&shared);
    std::thread::Builder::new()
        .name("drover-state".into())
        .spawn(move || run(store, solver, snapshots, rx, thread_shared))
        .expect("spawn the state thread");
    Ok(shared)
}

/// An input's record in the log: its JSON. Senders encode their inputs
/// before handing them over, so that the state thread, through which every
/// decision passes, only writes the bytes (a large build's submission takes
/// a millisecond or more to encode).
fn record(input: &Input) -> Vec<u8> {
    serde_json::to_vec(input).expect("encodable input")
}

fn run(
    mut store: Store,
    mut solver: Solver,
    mut snapshots: Snapshots,
    rx: Receiver<Command>,
    weak: std::sync::Weak<Shared>,
) {
    let mut followers = Followers::default();
    // Submits beyond the one a turn carries out, oldest first.
    let mut submits: VecDeque<Command> = VecDeque::new();
    // When the last turn started (see `behind` below).
    let mut last_start = now_ms();
    loop {
        let mut batch = Vec::new();
        let meant = if submits.is_empty() {
            let mut wait =
                solver.poll_timeout().map(|at| Duration::from_millis(at.0.saturating_sub(now_ms())));
            // Records a snapshot holds are dropped a few a turn, idle or not.
            if snapshots.dropping() {
                wait = Some(wait.map_or(snapshots::DROP_PAUSE, |w| w.min(snapshots::DROP_PAUSE)));
            }
            // Awake at least every tenth of a lease, so that a pause of the
            // whole process shows as a wake-up that came late.
            let probe = Duration::from_millis((solver.config().lease_timeout.0 / 10).max(50));
            let wait = wait.map_or(probe, |w| w.min(probe));
            match rx.recv_timeout(wait) {
                Ok(cmd) => batch.push(cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            wait.as_millis() as u64
        } else {
            0
        };
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => break,
            }
        }
        let batch = next_turn(batch, &mut submits);
        // Held for this turn only (see `start`).
        let Some(shared) = weak.upgrade() else { return };
        let now = now_ms();
        // The solver is the log's state: the time to write it down, if
        // enough was recorded since the last time (a copy, written in the
        // background; its end comes back as a command).
        if snapshots.due() {
            let tx = shared.tx.lock().expect("tx").clone();
            snapshots.start(&store, &solver, move |written| {
                let _ = tx.send(Command::Snapshot(written));
            });
        }
        if snapshots.dropping() {
            snapshots.drop_some(&mut store);
        }
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        // This turn starts a tenth of a lease or more after the last one
        // started and the thread's wait: that turn held the thread up (a
        // huge submission, say, or a slow write of the log), or the whole
        // process was paused (stopped, a VM frozen, swapped out). Either
        // way the workers' heartbeats could not be heard meanwhile, so, as
        // after a restart, time stands still for the cluster: the solver's
        // clock goes to when the thread meant to wake (what fell due by
        // then happens), and every deadline moves on by the rest. This
        // comes before anything else of the turn, the due timers included.
        let behind = now.saturating_sub(last_start).saturating_sub(meant);
        if behind >= (solver.config().lease_timeout.0 / 10).max(50) {
            let woke = (last_start + meant).min(now);
            if solver.handle(Millis(woke), Input::Tick).is_ok() {
                records.push((woke, record(&Input::Tick)));
            }
            if solver.handle(Millis(now), Input::Restarted).is_ok() {
                records.push((now, record(&Input::Restarted)));
            }
            tracing::warn!(
                behind_ms = behind,
                "the coordinator was held up (a long turn, or the process paused): the cluster's leases and \
                 waits were paused with it"
            );
        }
        last_start = now;
        let mut answers = Vec::new();
        let mut queries = Vec::new();
        let mut follows = Vec::new();
        // An input the solver refuses changed nothing: it stays out of the
        // log (a refused submission of a million jobs would otherwise be
        // kept, and replayed at every start, for nothing).
        let mut apply = |solver: &mut Solver, input: Input, record: Vec<u8>| {
            let reply = solver.handle(Millis(now), input);
            if reply.is_ok() {
                records.push((now, record));
            }
            reply
        };
        if solver.poll_timeout().is_some_and(|at| at.0 <= now) {
            let _ = apply(&mut solver, Input::Tick, record(&Input::Tick));
        }
        for cmd in batch {
            match cmd {
                Command::Input { input, record, reply } => {
                    answers.push(Answer::Input(reply, apply(&mut solver, input, record)))
                }
                Command::Report { worker, input, record, deliver, reply } => {
                    let reregister = apply(&mut solver, input, record) == Ok(Reply::Reregister);
                    let mail = PollReply { reregister, ..PollReply::default() };
                    let deliver = Delivery { take: deliver.take && !reregister, ..deliver };
                    answers.push(Answer::Report { worker, deliver, mail, reply });
                }
                Command::Submit { req, record: ahead, holder, reply } => {
                    let (tenant, jobs) = (req.tenant.clone(), req.build.jobs.len());
                    // The build that holds this very spec, if one does (the
                    // spec cache hands identical specs over as one `Arc`).
                    let like = holder
                        .filter(|&b| solver.build_holds_spec(b, &req.build))
                        .or_else(|| solver.build_with_spec(&req.build));
                    let input = match like {
                        Some(like) => {
                            let SubmitRequest { build: _, tenant, no_cache, on_error, max_parallel, queue } =
                                req;
                            Input::SubmitLike { like, tenant, no_cache, on_error, max_parallel, queue }
                        }
                        None => Input::Submit(req),
                    };
                    let record = match (&input, ahead) {
                        (Input::Submit(_), Some(ahead)) => ahead,
                        (input, _) => record(input),
                    };
                    let result = apply(&mut solver, input, record);
                    if let Ok(Reply::Submitted(id)) = result {
                        crate::journal::accepted(&solver, id, &tenant, jobs);
                    }
                    answers.push(Answer::Input(reply, result))
                }
                Command::Query(f) => queries.push(f),
                Command::Snapshot(written) => snapshots.finish(&mut store, written),
                Command::Follow { build, from, reply } => follows.push((build, from, reply)),
            }
        }
        if !records.is_empty()
            && let Err(e) = store.append(records.iter().map(|(at, body)| (*at, &body[..])))
        {
            // Acting on inputs that were not recorded would break recovery:
            // stop here; requests fail and the process must be restarted.
            tracing::error!("cannot record state, stopping the coordinator: {e}");
            if let Some(shared) = weak.upgrade() {
                shared.failed.send_replace(Some(format!("cannot record its state: {e}")));
            }
            return;
        }
        snapshots.recorded(records.iter().map(|(_, body)| body.len() as u64).sum());
        let changed = {
            let mut boxes = shared.mailboxes.lock().expect("mailboxes");
            let effects = solver.take_effects();
            crate::journal::effects(&solver, &effects, Millis(now));
            let mut renewed = shared.renewed.lock().expect("renewals");
            for effect in &effects {
                if let Effect::WorkerForgotten { worker } = effect {
                    renewed.remove(worker);
                }
            }
            drop(renewed);
            let (touched, changed) = perform(&mut boxes, effects);
            // Reports that asked for it take their worker's mail now, before
            // any poll is woken for it.
            for answer in &mut answers {
                if let Answer::Report { worker, deliver: Delivery { take: true, received }, mail, .. } =
                    answer
                {
                    // A worker forgotten in this very turn has no mailbox
                    // left: it registers again.
                    *mail = match boxes.get_mut(worker) {
                        Some(mb) => mb.take(*received),
                        None => PollReply { reregister: true, ..PollReply::default() },
                    };
                }
            }
            for worker in touched {
                if let Some(mb) = boxes.get(&worker)
                    && (mb.has_mail() || !mb.open)
                {
                    mb.notify.notify_one();
                }
            }
            changed
        };
        // Answers first: a worker waits for its next job in one, while the
        // event streams' followers only watch.
        for answer in answers {
            match answer {
                Answer::Input(reply, result) => {
                    let _ = reply.send(result);
                }
                Answer::Report { worker, deliver, reply, mail } => {
                    // A worker that gave up waiting (its request timed out or
                    // its connection broke) never gets this answer: the mail
                    // it took goes back, ahead of anything newer, for its
                    // next report or poll.
                    if let Err(mail) = reply.send(mail)
                        && deliver.take
                        && mail.has_mail()
                    {
                        let mut boxes = shared.mailboxes.lock().expect("mailboxes");
                        if let Some(mb) = boxes.get_mut(&worker) {
                            mb.returned(mail);
                            mb.notify.notify_one();
                        }
                    }
                }
            }
        }
        followers.publish(&solver, &changed);
        for f in queries {
            f(&solver);
        }
        for (build, from, reply) in follows {
            let _ = reply.send(followers.add(&solver, build, from, FOLLOW_BACKLOG));
        }
    }
}

/// How a command of the turn is answered once its input is recorded.
enum Answer {
    Input(oneshot::Sender<Result<Reply, SolverError>>, Result<Reply, SolverError>),
    /// `mail`: the answer, which takes the worker's mail if `deliver`.
    Report {
        worker: u64,
        deliver: Delivery,
        mail: PollReply,
        reply: oneshot::Sender<PollReply>,
    },
}

/// Carries out the effects: mail goes into the workers' mailboxes (their
/// polls are woken by the caller, once reports have taken theirs). Returns
/// the workers whose mailboxes changed, and the builds whose event streams
/// grew.
fn perform(mailboxes: &mut BTreeMap<u64, Mailbox>, effects: Vec<Effect>) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let mut changed = BTreeSet::new();
    let mut touched = BTreeSet::new();
    for effect in effects {
        let worker = match &effect {
            Effect::Assign { worker, .. }
            | Effect::Drop { worker, .. }
            | Effect::Stop { worker, .. }
            | Effect::Suspend { worker, .. }
            | Effect::Registered { worker }
            | Effect::WorkerLost { worker } => *worker,
            Effect::BuildChanged { build } => {
                changed.insert(*build);
                continue;
            }
            Effect::WorkerForgotten { worker } => {
                // Lost (in this turn, if more than the kept number were
                // lost at once): a poll waiting on it wakes, finds no
                // mailbox, and is told to register again.
                if let Some(mb) = mailboxes.remove(worker) {
                    mb.notify.notify_one();
                }
                continue;
            }
        };
        touched.insert(worker);
        let mb = mailboxes.entry(worker).or_default();
        match effect {
            Effect::Assign { assignment, .. } => {
                mb.mail.assign.push(*assignment);
                mb.version += 1;
            }
            Effect::Drop { run, .. } => {
                // Withdrawn if not delivered yet; the worker is told either
                // way, and reports the run's end, which frees what the core
                // keeps for it.
                mb.mail.assign.retain(|a| a.run != run);
                mb.mail.drop.push(run);
                mb.version += 1;
            }
            Effect::Stop { run, .. } => {
                mb.mail.stop.push(run);
                mb.version += 1;
            }
            Effect::Suspend { run, resume, .. } => {
                // The last request for a run wins: the worker applies the
                // two lists in one order, not in the order they came.
                mb.mail.suspend.retain(|r| *r != run);
                mb.mail.resume.retain(|r| *r != run);
                if resume {
                    mb.mail.resume.push(run)
                } else {
                    mb.mail.suspend.push(run)
                }
                mb.version += 1;
            }
            Effect::Registered { .. } => {
                // Assignments not delivered are void: the worker did not
                // list their runs, so the solver requeued them.
                mb.mail.assign.clear();
                (mb.unacked, mb.unacked_version) = (PollReply::default(), 0);
                mb.open = true;
            }
            Effect::WorkerLost { .. } => {
                mb.mail = PollReply::default();
                (mb.unacked, mb.unacked_version) = (PollReply::default(), 0);
                mb.open = false;
            }
            Effect::BuildChanged { .. } | Effect::WorkerForgotten { .. } => {}
        }
    }
    (touched, changed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use drover_proto::{
        BuildSpec, EventKind, Hash32, HeldArtifact, JobDef, OnError, RegisterRequest, SubmitRequest,
    };
    use tokio::sync::mpsc::error::TryRecvError;

    use super::*;

    /// A worker's open mailbox holding `mail` at `version`.
    fn open_mailbox(mail: PollReply, version: u64) -> Mailbox {
        Mailbox { open: true, mail, version, ..Mailbox::default() }
    }

    fn mail(drop: &[u64], suspend: &[u64], resume: &[u64]) -> PollReply {
        PollReply {
            drop: drop.to_vec(),
            suspend: suspend.to_vec(),
            resume: resume.to_vec(),
            ..PollReply::default()
        }
    }

    /// Mail taken for an answer that never reached the worker goes back
    /// ahead of what came since; for suspend and resume the later request
    /// for a run still wins.
    #[test]
    fn mail_put_back_goes_ahead_and_later_requests_win() {
        let mut mb = open_mailbox(mail(&[1], &[7], &[8]), 3);
        let taken = mb.take(None);
        assert_eq!(taken.mail, 3);
        assert!(!mb.has_mail());
        // Meanwhile: another drop, run 7 resumed, run 8 suspended again.
        mb.mail = mail(&[2], &[8], &[7]);
        mb.version = 4;
        mb.returned(taken);
        let again = mb.take(None);
        assert_eq!(again.drop, [1, 2], "the older mail comes first");
        assert_eq!(again.suspend, [8]);
        assert_eq!(again.resume, [7]);
        assert!(again.mail > 4, "a poll that saw version 4 learns there is mail again");
    }

    /// A worker that says what it received gets the mail of an answer it
    /// did not get again, ahead of what came since, and nothing twice once
    /// it says it got it; one that does not say gets everything once.
    #[test]
    fn mail_not_received_goes_out_again() {
        let mut mb = open_mailbox(mail(&[1], &[], &[]), 2);
        let lost = mb.take(Some(0));
        assert_eq!((lost.drop.as_slice(), lost.mail), (&[1][..], 2));
        mb.mail = mail(&[2], &[], &[]);
        mb.version = 3;
        let again = mb.take(Some(0));
        assert_eq!(again.drop, [1, 2], "the lost mail first, then the newer");
        assert!(again.mail > 3);
        assert!(!mb.take(Some(again.mail)).has_mail(), "received: not sent again");
        mb.mail = mail(&[3], &[], &[]);
        mb.version += 1;
        let once = mb.take(None);
        assert_eq!(once.drop, [3]);
        assert!(
            !mb.take(None).has_mail() && !mb.take(Some(0)).has_mail(),
            "not kept for a worker that does not say"
        );
    }

    /// A report whose answer could not be handed over, sent again before
    /// that was known (both in one turn): the second answer carries the
    /// mail, and the first one's failure does not put it back a second time.
    #[test]
    fn a_report_sent_again_in_the_same_turn_gets_the_mail_once() {
        let mut mb = open_mailbox(mail(&[1], &[], &[]), 1);
        let first = mb.take(Some(0));
        let second = mb.take(Some(0));
        assert_eq!(second.drop, [1], "the retry carries the mail");
        mb.returned(first);
        assert!(!mb.has_mail(), "and it is not queued again");
        assert!(!mb.take(Some(second.mail)).has_mail());
    }

    /// A burst of submits is carried out one per turn, oldest first, each
    /// after the other commands that came by then.
    #[test]
    fn a_turn_carries_out_one_submit_after_everything_else() {
        let request = |name: &str| SubmitRequest {
            build: BuildSpec { name: name.into(), sources: Vec::new(), jobs: vec![job("a")] }.into(),
            tenant: "t".into(),
            no_cache: false,
            on_error: OnError::Quit,
            max_parallel: None,
            queue: None,
        };
        // Both forms a submit takes: from a client, and recorded (replayed
        // or, like a spec seen before, by reference).
        let submit = |name: &str| match name {
            "s3" => Command::Input {
                record: Vec::new(),
                input: Input::SubmitLike {
                    like: 1,
                    tenant: "t".into(),
                    no_cache: false,
                    on_error: OnError::Quit,
                    max_parallel: None,
                    queue: Some(name.into()),
                },
                reply: oneshot::channel().0,
            },
            "s4" => Command::Input {
                record: Vec::new(),
                input: Input::Submit(request(name)),
                reply: oneshot::channel().0,
            },
            _ => Command::Submit {
                req: request(name),
                record: None,
                holder: None,
                reply: oneshot::channel().0,
            },
        };
        let report = |worker: u64| Command::Report {
            worker,
            input: Input::Report { worker, report: drover_proto::Report::default() },
            record: Vec::new(),
            deliver: Delivery::default(),
            reply: oneshot::channel().0,
        };
        let describe = |turn: &[Command]| -> Vec<String> {
            turn.iter()
                .map(|c| match c {
                    Command::Submit { req, .. } | Command::Input { input: Input::Submit(req), .. } => {
                        req.build.name.clone()
                    }
                    Command::Input { input: Input::SubmitLike { queue: Some(name), .. }, .. } => name.clone(),
                    Command::Report { worker, .. } => format!("report {worker}"),
                    _ => "other".into(),
                })
                .collect()
        };
        let mut submits = VecDeque::new();
        let first =
            next_turn(vec![submit("s1"), submit("s2"), report(1), submit("s3"), report(2)], &mut submits);
        assert_eq!(describe(&first), ["report 1", "report 2", "s1"]);
        let second = next_turn(vec![report(3)], &mut submits);
        assert_eq!(describe(&second), ["report 3", "s2"]);
        let third = next_turn(vec![submit("s4")], &mut submits);
        assert_eq!(describe(&third), ["s3"]);
        assert_eq!(describe(&next_turn(Vec::new(), &mut submits)), ["s4"]);
        assert!(next_turn(Vec::new(), &mut submits).is_empty() && submits.is_empty());
    }

    fn job(name: &str) -> JobDef {
        let mut id = [0u8; 32];
        id[..name.len()].copy_from_slice(name.as_bytes());
        JobDef { commands: vec![format!("echo {name}")], ..JobDef::new(name, Hash32(id)) }
    }

    /// A solver with a worker of one slot and a build of two jobs.
    fn solver_with_build() -> (Solver, u64) {
        let mut solver = Solver::new(drover_core::Config::default());
        solver.handle(Millis(1), register()).expect("registered");
        let submit = Input::Submit(SubmitRequest {
            build: BuildSpec { name: "b".into(), sources: Vec::new(), jobs: vec![job("a"), job("b")] }.into(),
            tenant: "t".into(),
            no_cache: false,
            on_error: OnError::Quit,
            max_parallel: None,
            queue: None,
        });
        let Ok(Reply::Submitted(id)) = solver.handle(Millis(1), submit) else { panic!("not submitted") };
        solver.take_effects();
        (solver, id)
    }

    /// Applies an input at `now` as a turn does and hands the new events
    /// out.
    fn turn(solver: &mut Solver, followers: &mut Followers, now: u64, input: Input) {
        solver.handle(Millis(now), input).expect("accepted");
        let changed = solver
            .take_effects()
            .into_iter()
            .filter_map(|e| match e {
                Effect::BuildChanged { build } => Some(build),
                _ => None,
            })
            .collect();
        followers.publish(solver, &changed);
    }

    /// The worker's report that its first run (job `a`) succeeded: `b`
    /// goes to it next.
    fn first_done() -> Input {
        let done = RunResult {
            run: 1,
            success: true,
            exit_code: Some(0),
            cached: false,
            detail: String::new(),
            output: Some(HeldArtifact { job: job("a").id, tree: Hash32([7; 32]), size: 1 }),
            duration_ms: 1,
            stages: Default::default(),
            lost_inputs: Vec::new(),
            worker_fault: false,
        };
        Input::Report {
            worker: 1,
            report: Report { started: vec![1], finished: vec![done], ..Report::default() },
        }
    }

    fn register() -> Input {
        Input::Register(RegisterRequest {
            name: "w".into(),
            url: "http://w".into(),
            capacity: drover_proto::WorkerCapacity {
                slots: 1,
                cpu_millis: 1000,
                memory: 1 << 30,
                tokens: BTreeMap::new(),
            },
            labels: BTreeMap::new(),
            artifacts: Vec::new(),
            running: Vec::new(),
        })
    }

    /// What a follower got: its history, then every update until its
    /// channel closed (and whether the last one ended the build).
    fn received(follow: Follow) -> (Vec<BuildEvent>, bool) {
        let mut events = follow.history;
        let mut finished = follow.finished;
        if let Some(mut live) = follow.live {
            loop {
                match live.try_recv() {
                    Ok(update) => {
                        assert!(!finished, "an update after the build's end");
                        events.extend(update.events.iter().cloned());
                        finished = update.finished;
                    }
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) => panic!("the channel stayed open"),
                }
            }
        }
        (events, finished)
    }

    /// Followers that joined at different points each get every event from
    /// where they joined, once and in order, and their channels close after
    /// the build's end.
    #[test]
    fn followers_get_each_event_once_in_order_until_the_end() {
        let (mut solver, id) = solver_with_build();
        let mut followers = Followers::default();
        let first = followers.add(&solver, id, 0, FOLLOW_BACKLOG).expect("known build");
        let late_from = solver.event_count(id).expect("known build") - 1;
        // The worker finishes the job it got and gets the next.
        turn(&mut solver, &mut followers, 5_000, first_done());
        let late = followers.add(&solver, id, late_from, FOLLOW_BACKLOG).expect("known build");
        turn(&mut solver, &mut followers, 3, Input::Cancel { build: id });
        let all = solver.events(id, 0).expect("known build").0;
        assert!(matches!(all.last().map(|e| &e.kind), Some(EventKind::BuildFinished { .. })));
        assert_eq!(received(first), (all.clone(), true));
        assert_eq!(received(late), (all[late_from as usize..].to_vec(), true));
        assert!(followers.builds.is_empty(), "followers of a build that is over are let go");
    }

    /// A follower that does not take its updates is dropped once its
    /// backlog is full: it keeps what was queued, sees its channel close, and
    /// following again from there gives the rest.
    #[test]
    fn a_follower_that_falls_behind_is_dropped_and_follows_again() {
        let (mut solver, id) = solver_with_build();
        let mut followers = Followers::default();
        let slow = followers.add(&solver, id, 0, 1).expect("known build");
        let history = slow.history.len();
        turn(&mut solver, &mut followers, 5_000, first_done());
        turn(&mut solver, &mut followers, 3, Input::Cancel { build: id });
        let (got, finished) = received(slow);
        assert!(got.len() > history, "the first update was queued");
        assert!(!finished, "the update with the build's end did not fit");
        let again = followers.add(&solver, id, got.len() as u64, 1).expect("known build");
        assert!(again.finished && again.live.is_none(), "the build is over: history only");
        let mut all = got;
        all.extend(again.history);
        assert_eq!(all, solver.events(id, 0).expect("known build").0);
    }

    /// An unknown build has nothing to follow.
    #[test]
    fn following_an_unknown_build_gives_none() {
        let (solver, id) = solver_with_build();
        assert!(Followers::default().add(&solver, id + 1, 0, FOLLOW_BACKLOG).is_none());
    }
}
