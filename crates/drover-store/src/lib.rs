//! drover's durable input log.
//!
//! The coordinator is a deterministic state machine: it records every input
//! (with the time it was handled at) before acting on it, and rebuilds its
//! state after a crash by replaying the log. This crate is that log: SQLite in
//! WAL mode with `synchronous = FULL`, one transaction per batch (group
//! commit: the coordinator appends everything it handled in one loop turn at
//! once), and a small key-value table for metadata.
//!
//! The log may begin with a **snapshot**: the state after the inputs up to
//! some record, in a file the caller wrote (and made durable) beside the
//! database, recorded by [`Store::snapshot`]. A replay then starts from the
//! snapshot and reads only the records after it ([`Store::latest_snapshot`],
//! [`Store::replay`]); the records it holds are dropped a few at a time
//! ([`Store::drop_taken`]).

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

/// A failure of the log. The coordinator treats any of them as fatal: it must
/// not act on inputs it could not record.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused.
    #[error("state database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: String,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer drover.
    #[error("state database {path} has schema version {found}; this drover understands up to {supported}")]
    TooNew {
        /// The database file.
        path: String,
        /// Its schema version.
        found: i64,
        /// Ours.
        supported: i64,
    },
}

/// 2: the log may hold `SubmitLike` records, which name an earlier build
/// instead of repeating its spec; a drover that does not know them must not
/// replay such a log (it would skip them, and every later build would get
/// another ID). A version 1 log is a version 2 log without them: opening it
/// marks it version 2.
/// 3: the log may hold `KeepFinished` records, after which a replay forgets
/// old finished builds; a drover that skipped them would keep those builds
/// and write records naming them that a newer one could not replay. An
/// older log is read as it is and marked 3.
/// 4: the log may begin with a snapshot instead of the first inputs; a
/// drover that does not know snapshots would replay the inputs after it on
/// an empty state. An older log is read as it is and marked 4.
const SCHEMA_VERSION: i64 = 4;

/// What an appended batch survives once [`Store::append`] returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// A crash of the process (SIGKILL, panic, OOM kill): the batch is in
    /// the write-ahead log, in the operating system's hands. Power loss or
    /// a kernel crash may lose the last batches. No fsync per batch.
    #[default]
    ProcessCrash,
    /// Also power loss and kernel crashes: every batch is fsynced.
    PowerLoss,
}

/// One recorded input: when it was handled (milliseconds) and its encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Position in the log, from 1.
    pub seq: u64,
    /// The `now` it was handled at.
    pub at: u64,
    /// The encoded input.
    pub body: Vec<u8>,
}

/// The state after the inputs up to record `seq`, as the coordinator wrote
/// it down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The last record it includes.
    pub seq: u64,
    /// The format of its file, as its writer named it.
    pub format: String,
    /// The file that holds it, as its writer named it.
    pub file: String,
}

/// The log. Not `Sync`: one thread owns it.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: String,
    next_seq: u64,
    durability: Durability,
}

impl Store {
    /// Opens (or creates) the log at `path`, durable against power loss.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, Durability::PowerLoss)
    }

    /// Opens (or creates) the log at `path` with the given durability.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Store, StoreError> {
        let name = path.display().to_string();
        let err = |source| StoreError::Sqlite { path: name.clone(), source };
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        let synchronous = match durability {
            Durability::PowerLoss => "FULL",
            Durability::ProcessCrash => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", synchronous).map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS inputs (seq INTEGER PRIMARY KEY, at INTEGER NOT NULL, body BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS snapshots (seq INTEGER PRIMARY KEY, format TEXT NOT NULL, file TEXT NOT NULL);",
        )
        .map_err(err)?;
        let mut store = Store { conn, path: name.clone(), next_seq: 1, durability };
        match store.meta("schema_version")? {
            None => store.set_meta("schema_version", &SCHEMA_VERSION.to_string())?,
            Some(v) => {
                let found = v.parse::<i64>().unwrap_or(i64::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::TooNew { path: name, found, supported: SCHEMA_VERSION });
                }
                if found < SCHEMA_VERSION {
                    store.set_meta("schema_version", &SCHEMA_VERSION.to_string())?;
                }
            }
        }
        // Records go on after the last one, kept or taken into a snapshot.
        let last: Option<i64> = store
            .conn
            .query_row(
                "SELECT MAX(seq) FROM (SELECT seq FROM inputs UNION ALL SELECT seq FROM snapshots)",
                [],
                |r| r.get(0),
            )
            .map_err(err)?;
        store.next_seq = last.map_or(1, |s| s as u64 + 1);
        Ok(store)
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite { path: self.path.clone(), source }
    }

    /// Appends a batch durably, in one transaction; returns the sequence
    /// number of its last record. When this returns, the batch survives
    /// what the store's [`Durability`] says.
    pub fn append<'a>(
        &mut self,
        batch: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<u64, StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite { path: path.clone(), source };
        let tx = self.conn.transaction().map_err(err)?;
        let mut seq = self.next_seq;
        {
            let mut insert =
                tx.prepare_cached("INSERT INTO inputs (seq, at, body) VALUES (?1, ?2, ?3)").map_err(err)?;
            for (at, body) in batch {
                insert.execute(params![seq as i64, at as i64, body]).map_err(err)?;
                seq += 1;
            }
        }
        tx.commit().map_err(err)?;
        self.next_seq = seq;
        Ok(seq - 1)
    }

    /// Records that `file` (already durable) holds the state after the
    /// records up to `seq` (the last one appended, or an earlier one), in
    /// place of any older snapshot: a replay then starts from it. The
    /// records it holds stay until [`Store::drop_taken`] drops them. This
    /// commit survives power loss whatever the store's [`Durability`], so
    /// the caller may delete the older snapshot's file once it returns.
    pub fn snapshot(&mut self, seq: u64, format: &str, file: &str) -> Result<(), StoreError> {
        let path = self.path.clone();
        let err = |source| StoreError::Sqlite { path: path.clone(), source };
        let relaxed = self.durability == Durability::ProcessCrash;
        if relaxed {
            self.conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        }
        let committed = (|| {
            let tx = self.conn.transaction()?;
            tx.execute(
                "INSERT OR REPLACE INTO snapshots (seq, format, file) VALUES (?1, ?2, ?3)",
                params![seq as i64, format, file],
            )?;
            tx.execute("DELETE FROM snapshots WHERE seq < ?1", [seq as i64])?;
            tx.commit()
        })();
        if relaxed {
            // Failing to relax again leaves later commits synced too: safe,
            // and no reason to report a commit that was made as failed.
            let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
        }
        committed.map_err(err)
    }

    /// Drops at most `limit` of the oldest records the latest snapshot
    /// holds (about 2 µs each here); returns how many it dropped, 0 once
    /// none is left. A few at a time, so that dropping a long log never
    /// holds the caller up for long.
    pub fn drop_taken(&mut self, limit: u64) -> Result<u64, StoreError> {
        let Some(snapshot) = self.latest_snapshot()? else { return Ok(0) };
        let first: Option<i64> =
            self.conn.query_row("SELECT MIN(seq) FROM inputs", [], |r| r.get(0)).map_err(self.err())?;
        let Some(first) = first.map(|f| f as u64).filter(|&f| f <= snapshot.seq) else { return Ok(0) };
        let last = snapshot.seq.min(first.saturating_add(limit.max(1) - 1));
        let dropped =
            self.conn.execute("DELETE FROM inputs WHERE seq <= ?1", [last as i64]).map_err(self.err())?;
        Ok(dropped as u64)
    }

    /// The latest snapshot, if the log begins with one.
    pub fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        self.conn
            .query_row("SELECT seq, format, file FROM snapshots ORDER BY seq DESC LIMIT 1", [], |r| {
                Ok(Snapshot { seq: r.get::<_, i64>(0)? as u64, format: r.get(1)?, file: r.get(2)? })
            })
            .optional()
            .map_err(self.err())
    }

    /// Calls `f` with every record after `after` (0: every record), in
    /// order.
    pub fn replay(&self, after: u64, mut f: impl FnMut(Record)) -> Result<u64, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT seq, at, body FROM inputs WHERE seq > ?1 ORDER BY seq")
            .map_err(self.err())?;
        let mut rows = stmt.query([after as i64]).map_err(self.err())?;
        let mut count = 0;
        while let Some(row) = rows.next().map_err(self.err())? {
            let seq: i64 = row.get(0).map_err(self.err())?;
            let at: i64 = row.get(1).map_err(self.err())?;
            let body: Vec<u8> = row.get(2).map_err(self.err())?;
            f(Record { seq: seq as u64, at: at as u64, body });
            count += 1;
        }
        Ok(count)
    }

    /// Records appended to the log since it began (those a snapshot took
    /// included): the sequence number of the last one.
    pub fn len(&self) -> u64 {
        self.next_seq - 1
    }

    /// Has nothing been appended since the log began?
    pub fn is_empty(&self) -> bool {
        self.next_seq == 1
    }

    /// A metadata value.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(self.err())
    }

    /// Sets a metadata value durably.
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = ?2",
                [key, value],
            )
            .map(|_| ())
            .map_err(self.err())
    }
}
