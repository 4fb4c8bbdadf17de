//! The mail watchdog: finds workers whose process is gone before their
//! lease runs out.
//!
//! A live worker takes its mail within milliseconds (its long poll is told
//! at once). Mail that waits in a worker's mailbox for [`STALE`] means the
//! worker is stopped, busy, or gone; the coordinator then tries the
//! worker's address, and a refused connection (nothing listens there: its
//! process is gone) makes the worker lost at once ([`Input::Unreachable`]),
//! so its runs go elsewhere now rather than when its lease ends. A worker
//! that is only stopped or slow still takes the connection, and keeps its
//! lease.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;

use drover_solver::Input;
use tokio::time::Instant;

use crate::state::{Shared, Stopped};

/// How long mail may wait untaken before the worker's address is tried.
const STALE: Duration = Duration::from_secs(2);

/// How often the mailboxes are looked at.
const EVERY: Duration = Duration::from_secs(1);

/// Looks at the mailboxes until the coordinator stops.
pub(crate) async fn run(shared: Weak<Shared>) {
    // Per worker: the version of the mail waiting, and since when.
    let mut waiting: BTreeMap<u64, (u64, Instant)> = BTreeMap::new();
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(shared) = shared.upgrade() else { return };
        let now = Instant::now();
        let pending = shared.pending_mail();
        waiting.retain(|worker, _| pending.contains_key(worker));
        let mut stale = Vec::new();
        for (worker, version) in pending {
            let since = waiting.entry(worker).or_insert((version, now));
            if since.0 != version {
                *since = (version, now);
            }
            if now.duration_since(since.1) >= STALE {
                stale.push(worker);
            }
        }
        if stale.is_empty() {
            continue;
        }
        let Ok(workers) = shared.query(|s| s.workers()).await else { return };
        for worker in stale {
            let Some(w) = workers.iter().find(|w| w.id == worker && w.alive) else { continue };
            match lose_if_gone(&shared, worker, &w.url, "its mail waits untaken").await {
                Ok(true) => {
                    waiting.remove(&worker);
                }
                Ok(false) => {}
                Err(Stopped) => return,
            }
        }
    }
}

/// Tries the address `url` of the live worker `worker`; if the connection
/// is refused, the worker is lost now (`why` says what made the
/// coordinator try). Whether it was refused. A worker that registered again
/// meanwhile (at the same address) is left alone by the solver.
pub(crate) async fn lose_if_gone(
    shared: &Shared,
    worker: u64,
    url: &str,
    why: &str,
) -> Result<bool, Stopped> {
    let since = crate::state::now_ms();
    if !refuses_connections(url).await {
        return Ok(false);
    }
    tracing::warn!(worker, url, "nothing listens at a worker's address ({why}): taken as lost now");
    // One forgotten meanwhile is gone already: its refusal changes nothing.
    let _ = shared.input(Input::Unreachable { worker, since }).await?;
    Ok(true)
}

/// Whether a connection to the host and port of `url` (an `http://` URL)
/// is refused, within a few seconds.
async fn refuses_connections(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else { return false };
    let authority = rest.split('/').next().unwrap_or(rest);
    let connect = tokio::net::TcpStream::connect(authority);
    matches!(
        tokio::time::timeout(Duration::from_secs(3), connect).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}
