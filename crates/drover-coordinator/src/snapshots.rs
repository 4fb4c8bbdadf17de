//! Snapshots of the solver: the coordinator writes its whole state down
//! now and then and drops the inputs behind it from the log
//! (`drover_store::Store::snapshot`), so the log, and the replay at every
//! start, stay bounded however long the coordinator runs.
//!
//! **When.** Once the records appended since the last snapshot pass
//! [`CoordinatorConfig::snapshot_after`](crate::CoordinatorConfig) bytes
//! and the size of the last snapshot: a snapshot then costs about as much
//! as the log it replaces, a constant share of what is recorded, and the
//! log never holds much more than the state's size besides.
//!
//! **How.** At the start of a turn, when the solver is exactly the log's
//! state (the records up to the last one appended), the state thread
//! copies it (builds are shared between the copy and the live state until
//! one changes, so a copy costs little more than the core's queues) and a
//! thread of its own encodes the copy into `snapshot-SEQ.cbor` in the data
//! directory (written as `.tmp`, its BLAKE3 digest at the end, synced,
//! renamed, the directory synced; a start checks the digest).
//! Its end comes back to the state thread as a command, which records the
//! snapshot in the log (replays start there from then on) and deletes older
//! snapshot files; the records it holds are then dropped a few thousand a
//! turn (about 2 µs each: all at once, a long log would hold the thread up
//! for seconds). A crash at any point leaves either the old snapshot or the
//! new one in force; files no entry names are deleted at the next start,
//! and records left behind a snapshot are dropped then.
//!
//! **Format.** CBOR of the solver (see `drover_solver`'s snapshot module),
//! named [`drover_solver::SNAPSHOT_FORMAT`]; a snapshot of another format
//! (written by another version of drover) is not read, and the coordinator
//! says so instead of starting on a wrong state.
//!
//! **Settings.** A snapshot holds the core's settings of its day, and a
//! log that does not begin with one begins with an [`Input::Configure`]
//! of the settings it was started under (recorded when the log was new),
//! so a replay decides the past as it was decided. If the coordinator now
//! has other settings, it records [`Input::Configure`] after the replay; the core refuses new queues, tenants or tiers while it holds
//! jobs (`drover_core::Scheduler::reconfigure`), and the coordinator then
//! does not start, saying why.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use drover_solver::{Input, SNAPSHOT_FORMAT, Solver};
use drover_store::Store;

use crate::CoordinatorError;

/// The default of [`crate::CoordinatorConfig::snapshot_after`]: 64 MiB of
/// records, about 100,000 jobs' worth, replayed in about two seconds.
pub const SNAPSHOT_AFTER: u64 = 64 << 20;

/// How a snapshot's writing ended, for the state thread.
#[derive(Debug)]
pub(crate) struct Written {
    /// The last record it holds.
    seq: u64,
    /// Its file's size, or why it could not be written.
    result: Result<u64, String>,
    /// How long encoding and writing took.
    took_ms: u64,
}

/// How many of the records a snapshot holds a turn drops (about 10 ms):
/// dropping a long log never holds the state thread up for long.
const DROP_PER_TURN: u64 = 5_000;

/// How soon an idle state thread wakes up to drop more records.
pub(crate) const DROP_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// The log's figures: the state thread's own (it alone writes them), which
/// `/metrics` reads.
#[derive(Debug, Default)]
pub(crate) struct LogGauges {
    /// Bytes of records appended since the last snapshot began (or in the
    /// log, at start).
    pub(crate) since: AtomicU64,
    /// The size of the last snapshot's file.
    pub(crate) snapshot_bytes: AtomicU64,
    /// Snapshots written, and those that failed, since the start.
    pub(crate) written: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// When and where the state thread writes the next snapshot.
#[derive(Debug)]
pub(crate) struct Snapshots {
    /// The data directory (snapshot files beside the log).
    dir: PathBuf,
    /// Bytes of records that call for a snapshot at least (`None`: never).
    after: Option<u64>,
    /// A snapshot is being written.
    writing: bool,
    /// The latest snapshot may hold records still in the log.
    dropping: bool,
    /// How much was recorded since the last snapshot, and its size (also
    /// read by `/metrics`).
    gauges: Arc<LogGauges>,
}

fn file_name(seq: u64) -> String {
    format!("snapshot-{seq}.cbor")
}

impl Snapshots {
    pub(crate) fn new(dir: PathBuf, after: Option<u64>) -> Snapshots {
        Snapshots { dir, after, writing: false, dropping: false, gauges: Arc::default() }
    }

    /// The figures `/metrics` shows, shared with the handlers.
    pub(crate) fn gauges(&self) -> Arc<LogGauges> {
        self.gauges.clone()
    }

    /// Records of `bytes` were appended.
    pub(crate) fn recorded(&mut self, bytes: u64) {
        self.gauges.since.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Are records the latest snapshot holds still to be dropped?
    pub(crate) fn dropping(&self) -> bool {
        self.dropping
    }

    /// Drops some of the records the latest snapshot holds (see
    /// [`DROP_PER_TURN`]).
    pub(crate) fn drop_some(&mut self, store: &mut Store) {
        match store.drop_taken(DROP_PER_TURN) {
            Ok(0) => self.dropping = false,
            Ok(_) => {}
            Err(e) => {
                // Tried again after the next snapshot or start, not every
                // turn: the records only cost room meanwhile.
                tracing::warn!("cannot drop the records a snapshot holds: {e}");
                self.dropping = false;
            }
        }
    }

    /// Is a snapshot due (and none being written)?
    pub(crate) fn due(&self) -> bool {
        let since = self.gauges.since.load(Ordering::Relaxed);
        let last = self.gauges.snapshot_bytes.load(Ordering::Relaxed);
        !self.writing && self.after.is_some_and(|after| since >= after.max(last))
    }

    /// Starts writing `solver`'s state, the state after the last record
    /// appended to `store`, in the background; `done` is called with the
    /// outcome, to be handed to [`Snapshots::finish`] on the state thread.
    pub(crate) fn start(
        &mut self,
        store: &Store,
        solver: &Solver,
        done: impl FnOnce(Written) + Send + 'static,
    ) {
        let seq = store.len();
        let copy = solver.clone();
        let dir = self.dir.clone();
        let spawned = std::thread::Builder::new().name("drover-snapshot".into()).spawn(move || {
            let started = Instant::now();
            // A panic is an error like any other: the state thread must hear
            // of the end, or it would never write another snapshot.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&dir, seq, &copy)))
                .unwrap_or_else(|_| Err(io::Error::other("the writer panicked")))
                .map_err(|e| e.to_string());
            drop(copy);
            done(Written { seq, result, took_ms: started.elapsed().as_millis() as u64 });
        });
        // Tried again once as much more was recorded, either way (not at
        // every turn, copying the state each time).
        self.gauges.since.store(0, Ordering::Relaxed);
        match spawned {
            Ok(_) => self.writing = true,
            Err(e) => tracing::warn!("cannot start writing the state down: {e}"),
        }
    }

    /// A snapshot's writing ended: if its file is written, the log begins
    /// with it from now on (older files are deleted). A failure is logged:
    /// the log still holds every record, and another snapshot is tried
    /// once as much more was recorded.
    pub(crate) fn finish(&mut self, store: &mut Store, written: Written) {
        self.writing = false;
        let Written { seq, result, took_ms } = written;
        let name = file_name(seq);
        let size = match result {
            Ok(size) => size,
            Err(e) => {
                self.gauges.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot write the state down (the log keeps every input): {e}");
                let _ = std::fs::remove_file(self.dir.join(format!("{name}.tmp")));
                let _ = std::fs::remove_file(self.dir.join(&name));
                return;
            }
        };
        if let Err(e) = store.snapshot(seq, SNAPSHOT_FORMAT, &name) {
            self.gauges.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("cannot record the state's snapshot (the log keeps every input): {e}");
            let _ = std::fs::remove_file(self.dir.join(&name));
            return;
        }
        self.gauges.snapshot_bytes.store(size, Ordering::Relaxed);
        self.dropping = true;
        self.gauges.written.fetch_add(1, Ordering::Relaxed);
        remove_others(&self.dir, Some(&name));
        tracing::info!(seq, bytes = size, took_ms, "wrote the state down: the log now begins there");
    }
}

/// Hashes what passes through it (a snapshot file ends with the BLAKE3
/// digest of what comes before).
struct Hashing<T> {
    inner: T,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Encodes `solver` into the snapshot file of record `seq`, its digest
/// after it, durably.
fn write(dir: &Path, seq: u64, solver: &Solver) -> io::Result<u64> {
    let name = file_name(seq);
    let tmp = dir.join(format!("{name}.tmp"));
    let file = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
    let mut out = Hashing { inner: file, hasher: blake3::Hasher::new() };
    ciborium::into_writer(solver, &mut out).map_err(|e| io::Error::other(e.to_string()))?;
    let Hashing { inner: mut file, hasher } = out;
    file.write_all(hasher.finalize().as_bytes())?;
    let file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    let size = file.metadata()?.len();
    std::fs::rename(&tmp, dir.join(&name))?;
    File::open(dir)?.sync_all()?;
    Ok(size)
}

/// Reads a snapshot file back, checking its digest.
fn read(path: &Path) -> Result<Solver, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut input = Hashing { inner: BufReader::with_capacity(1 << 20, file), hasher: blake3::Hasher::new() };
    let solver: Solver = ciborium::from_reader(&mut input).map_err(|e| format!("{}: {e}", path.display()))?;
    let Hashing { inner: mut rest, hasher } = input;
    let mut digest = Vec::new();
    rest.read_to_end(&mut digest).map_err(|e| format!("{}: {e}", path.display()))?;
    if digest != hasher.finalize().as_bytes() {
        return Err(format!(
            "{}: its checksum does not match what it holds: the file is damaged",
            path.display()
        ));
    }
    Ok(solver)
}

/// Is this a snapshot file's name, finished (`snapshot-SEQ.cbor`) or not
/// (`.tmp` after it)?
fn is_snapshot_file(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("snapshot-") else { return false };
    let seq = rest.strip_suffix(".cbor").or_else(|| rest.strip_suffix(".cbor.tmp"));
    seq.is_some_and(|seq| !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes the snapshot files (finished or not) other than `keep`.
fn remove_others(dir: &Path, keep: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_snapshot_file(name) && Some(name) != keep {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The state the log begins with: its latest snapshot read back, or
/// `fresh` if it has none; and the last record the snapshot includes (0
/// without one). Snapshot files the log does not name are deleted.
pub(crate) fn restore(
    store: &Store,
    fresh: Solver,
    snapshots: &mut Snapshots,
) -> Result<(Solver, u64), CoordinatorError> {
    let Some(snapshot) = store.latest_snapshot()? else {
        remove_others(&snapshots.dir, None);
        return Ok((fresh, 0));
    };
    let unreadable = |why: String| CoordinatorError::Snapshot { seq: snapshot.seq, why };
    if snapshot.format != SNAPSHOT_FORMAT {
        return Err(unreadable(format!(
            "it is in format {:?}, written by another version of drover; this one reads {SNAPSHOT_FORMAT:?}",
            snapshot.format
        )));
    }
    let path = snapshots.dir.join(&snapshot.file);
    let solver = read(&path).map_err(unreadable)?;
    // Only once it is read: a file the log does not name may be all there
    // is if the log lost its latest entries.
    remove_others(&snapshots.dir, Some(&snapshot.file));
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    snapshots.gauges.snapshot_bytes.store(size, Ordering::Relaxed);
    snapshots.dropping = true;
    Ok((solver, snapshot.seq))
}

/// After the replay: the core's settings are the configured ones, through a
/// recorded [`Input::Configure`] if the log's differ (it began with a
/// snapshot taken under others). The record to append, if any.
pub(crate) fn configure(
    solver: &mut Solver,
    configured: &drover_core::Config,
    now: u64,
) -> Result<Option<Vec<u8>>, CoordinatorError> {
    if solver.config() == configured {
        return Ok(None);
    }
    let input = Input::Configure { core: Box::new(configured.clone()) };
    let record = serde_json::to_vec(&input).expect("encodable input");
    match solver.handle(drover_core::Millis(now), input) {
        Ok(_) => {
            tracing::info!(
                "the scheduler's settings changed since the state was written down: the new ones apply from now on"
            );
            Ok(Some(record))
        }
        Err(e) => Err(CoordinatorError::Settings(e.to_string())),
    }
}
