//! The worker's stage tokens (BuildStream's resources, one arbiter for all).
//!
//! Every stage of a run reserves a set of tokens before it starts, all or
//! nothing, and gives them back when it ends:
//!
//! | stage | tokens |
//! |---|---|
//! | pull | `download`, `cache` |
//! | fetch | `download` (only if something is not here yet), `cache` |
//! | build | `process`, `cache`, and the job's own named tokens |
//! | push | `upload`, `cache` |
//!
//! `download` is limited by `--fetchers`, `process` by `--builders`,
//! `upload` by `--pushers`, each named token by the worker's `--tokens`;
//! `cache` (the local artifact cache) is unlimited but counted, so a job
//! that takes a token exclusively (`cache` for one that needs the whole
//! cache, as cache cleanup does) waits for every current user to drain.
//!
//! **Harvest order.** Waiting requests are granted later stages first (push,
//! build, fetch, pull), then in arrival order: a run already far along
//! finishes first, and fetches never crowd out builds. A request that cannot
//! be granted yet does not stop later ones that can (a free builder is never
//! left idle behind a fetch), except that a waiting *exclusive* request
//! blocks every request after it in that order for the tokens it wants
//! (writer preference, so a stream of shared users cannot starve it; only
//! pushes, which come first, still pass it, and they dry up once builds
//! wait). Because that interest is
//! recomputed on every pass in one total order, two exclusive requests on
//! disjoint sets cannot deadlock each other (BuildStream's FIXME).
//!
//! [`Pools`] is the pure bookkeeping (unit-tested); [`Arbiter`] wraps it for
//! the async tasks: [`Arbiter::acquire`] waits for a [`Grant`], and dropping
//! the grant (or the waiting future) gives the tokens back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A run's stage on the worker, in pipeline order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// Getting the result from the shared cache.
    Pull,
    /// Bringing sources and dependency outputs.
    Fetch,
    /// Running the commands and storing the output.
    Build,
    /// Sending the output to the shared cache.
    Push,
}

impl Stage {
    /// Its name in logs, status and the `--stage` option.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Pull => "pull",
            Stage::Fetch => "fetch",
            Stage::Build => "build",
            Stage::Push => "push",
        }
    }
}

/// One kind of token.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Token {
    /// Network fetches (pull and fetch): `--fetchers`.
    Download,
    /// Running commands: `--builders`.
    Process,
    /// Pushes to the shared cache: `--pushers`.
    Upload,
    /// A job's named token (`--tokens`); `cache` is the local cache itself.
    Named(String),
}

/// The name jobs use for the local artifact cache.
pub(crate) const CACHE: &str = "cache";

/// What a stage reserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) stage: Stage,
    /// Tokens and how many of each.
    pub(crate) take: BTreeMap<Token, u64>,
    /// Tokens no one else may hold meanwhile (each also taken once).
    pub(crate) exclusive: BTreeSet<Token>,
}

impl Request {
    /// The tokens a stage always takes: its pool's and a shared `cache`.
    pub(crate) fn stage(stage: Stage) -> Request {
        let pool = match stage {
            Stage::Pull | Stage::Fetch => Token::Download,
            Stage::Build => Token::Process,
            Stage::Push => Token::Upload,
        };
        Request {
            stage,
            take: BTreeMap::from([(pool, 1), (Token::Named(CACHE.to_owned()), 1)]),
            exclusive: BTreeSet::new(),
        }
    }

    /// A stage that only reads and writes the local cache (a fetch with
    /// everything already here): no pool token, just a shared `cache`.
    pub(crate) fn local(stage: Stage) -> Request {
        Request {
            stage,
            take: BTreeMap::from([(Token::Named(CACHE.to_owned()), 1)]),
            exclusive: BTreeSet::new(),
        }
    }

    /// A build stage with the job's own tokens.
    pub(crate) fn build(tokens: &BTreeMap<String, u64>, exclusive: &[String]) -> Request {
        let mut request = Request::stage(Stage::Build);
        for (name, n) in tokens {
            *request.take.entry(Token::Named(name.clone())).or_default() += n;
        }
        for name in exclusive {
            let token = Token::Named(name.clone());
            let n = request.take.entry(token.clone()).or_default();
            *n = (*n).max(1);
            request.exclusive.insert(token);
        }
        request
    }
}

/// The token pools and who waits for them. See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    /// Limits; a token without one is unlimited (but counted).
    limits: BTreeMap<Token, u64>,
    used: BTreeMap<Token, u64>,
    /// Tokens held exclusively.
    held_alone: BTreeSet<Token>,
    /// Waiting requests by (later stage first, arrival).
    waiting: BTreeMap<(std::cmp::Reverse<Stage>, u64), Request>,
    /// Granted requests by ticket.
    granted: BTreeMap<u64, Request>,
    next: u64,
}

impl Pools {
    /// Pools with these limits (tokens not listed are unlimited).
    pub(crate) fn new(limits: BTreeMap<Token, u64>) -> Pools {
        Pools { limits, ..Pools::default() }
    }

    /// Queues a request; returns its ticket. Call [`Pools::harvest`] after.
    pub(crate) fn ask(&mut self, request: Request) -> u64 {
        let ticket = self.next;
        self.next += 1;
        self.waiting.insert((std::cmp::Reverse(request.stage), ticket), request);
        ticket
    }

    /// Whether a request could ever be granted on these pools.
    pub(crate) fn possible(&self, request: &Request) -> Result<(), String> {
        for (token, n) in &request.take {
            if let Some(limit) = self.limits.get(token)
                && n > limit
            {
                return Err(format!(
                    "it needs {n} of token {} and this worker has {limit}",
                    token_name(token)
                ));
            }
        }
        Ok(())
    }

    /// Grants every waiting request that can be granted now, in harvest
    /// order; returns their tickets.
    pub(crate) fn harvest(&mut self) -> Vec<u64> {
        let mut blocked = BTreeSet::new();
        let mut granted = Vec::new();
        let keys: Vec<_> = self.waiting.keys().copied().collect();
        for key in keys {
            let request = &self.waiting[&key];
            let free = !request.take.keys().any(|t| blocked.contains(t)) && self.fits(request);
            if free {
                let request = self.waiting.remove(&key).expect("waiting");
                for (token, n) in &request.take {
                    *self.used.entry(token.clone()).or_default() += n;
                }
                self.held_alone.extend(request.exclusive.iter().cloned());
                self.granted.insert(key.1, request);
                granted.push(key.1);
            } else {
                // Writer preference: nobody after it may take what it wants
                // alone.
                blocked.extend(request.exclusive.iter().cloned());
            }
        }
        granted
    }

    fn fits(&self, request: &Request) -> bool {
        request.take.iter().all(|(token, n)| {
            let used = self.used.get(token).copied().unwrap_or(0);
            let alone = request.exclusive.contains(token);
            !self.held_alone.contains(token)
                && (!alone || used == 0)
                && self.limits.get(token).is_none_or(|limit| used + n <= *limit)
        })
    }

    /// Gives back a granted request's tokens, or withdraws a waiting one.
    /// Call [`Pools::harvest`] after.
    pub(crate) fn release(&mut self, ticket: u64) {
        if let Some(request) = self.granted.remove(&ticket) {
            for (token, n) in &request.take {
                let used = self.used.get_mut(token).expect("a granted token is counted");
                *used -= n;
                if *used == 0 {
                    self.used.remove(token);
                }
            }
            for token in &request.exclusive {
                self.held_alone.remove(token);
            }
        } else {
            self.waiting.retain(|key, _| key.1 != ticket);
        }
    }

    /// Whether the ticket's request has been granted.
    fn is_granted(&self, ticket: u64) -> bool {
        self.granted.contains_key(&ticket)
    }
}

fn token_name(token: &Token) -> &str {
    match token {
        Token::Download => "download (--fetchers)",
        Token::Process => "process (--builders)",
        Token::Upload => "upload (--pushers)",
        Token::Named(name) => name,
    }
}

/// [`Pools`] for async tasks.
#[derive(Debug)]
pub(crate) struct Arbiter {
    state: Mutex<(Pools, BTreeMap<u64, oneshot::Sender<()>>)>,
}

impl Arbiter {
    /// An arbiter over these pools.
    pub(crate) fn new(pools: Pools) -> Arc<Arbiter> {
        Arc::new(Arbiter { state: Mutex::new((pools, BTreeMap::new())) })
    }

    /// Waits until the request is granted. `Err` if it never can be.
    /// `waiting` is called once if it has to wait.
    pub(crate) async fn acquire(
        self: &Arc<Arbiter>,
        request: Request,
        waiting: impl FnOnce(),
    ) -> Result<Grant, String> {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut state = self.state.lock().expect("tokens");
            state.0.possible(&request)?;
            let ticket = state.0.ask(request);
            state.1.insert(ticket, tx);
            self.wake(&mut state);
            ticket
        };
        // From here on, dropping this future gives the tokens back.
        let grant = Grant { arbiter: self.clone(), ticket };
        if !self.state.lock().expect("tokens").0.is_granted(ticket) {
            waiting();
        }
        let _ = rx.await;
        Ok(grant)
    }

    /// Harvests and tells the granted requests' tasks.
    fn wake(&self, state: &mut (Pools, BTreeMap<u64, oneshot::Sender<()>>)) {
        for ticket in state.0.harvest() {
            if let Some(tx) = state.1.remove(&ticket) {
                let _ = tx.send(());
            }
        }
    }
}

/// Tokens held (or asked for) by a stage; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct Grant {
    arbiter: Arc<Arbiter>,
    ticket: u64,
}

impl Drop for Grant {
    fn drop(&mut self) {
        let mut state = self.arbiter.state.lock().expect("tokens");
        state.1.remove(&self.ticket);
        state.0.release(self.ticket);
        self.arbiter.wake(&mut state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(fetchers: u64, builders: u64) -> Pools {
        Pools::new(BTreeMap::from([
            (Token::Download, fetchers),
            (Token::Process, builders),
            (Token::Upload, 1),
        ]))
    }

    #[test]
    fn later_stages_are_harvested_first() {
        let mut p = pools(1, 1);
        let busy = p.ask(Request::stage(Stage::Fetch));
        assert_eq!(p.harvest(), vec![busy]);
        // A pull arrives before a fetch; both want the one download token.
        let pull = p.ask(Request::stage(Stage::Pull));
        let fetch = p.ask(Request::stage(Stage::Fetch));
        assert!(p.harvest().is_empty());
        p.release(busy);
        assert_eq!(p.harvest(), vec![fetch], "the fetch is further along than the pull");
        p.release(fetch);
        assert_eq!(p.harvest(), vec![pull]);
    }

    #[test]
    fn a_long_fetch_queue_does_not_idle_the_builders() {
        let mut p = pools(1, 2);
        let fetching = p.ask(Request::stage(Stage::Fetch));
        let queued: Vec<u64> = (0..5).map(|_| p.ask(Request::stage(Stage::Fetch))).collect();
        assert_eq!(p.harvest(), vec![fetching]);
        // A run whose inputs are here asks to build: it goes at once.
        let build = p.ask(Request::build(&BTreeMap::new(), &[]));
        assert_eq!(p.harvest(), vec![build]);
        p.release(fetching);
        assert_eq!(p.harvest(), vec![queued[0]]);
    }

    #[test]
    fn named_tokens_are_counted_and_limited() {
        let mut p = Pools::new(BTreeMap::from([(Token::Process, 4), (Token::Named("gpu".into()), 2)]));
        let gpu = |n| Request::build(&BTreeMap::from([("gpu".to_owned(), n)]), &[]);
        assert!(p.possible(&gpu(3)).is_err());
        let a = p.ask(gpu(2));
        let b = p.ask(gpu(1));
        let plain = p.ask(Request::build(&BTreeMap::new(), &[]));
        assert_eq!(p.harvest(), vec![a, plain], "b waits for a gpu; the plain build does not wait behind it");
        p.release(a);
        assert_eq!(p.harvest(), vec![b]);
    }

    #[test]
    fn an_exclusive_cache_user_drains_the_others_and_holds_new_ones_back() {
        let mut p = pools(10, 10);
        let fetch = p.ask(Request::stage(Stage::Fetch));
        let build = p.ask(Request::build(&BTreeMap::new(), &[]));
        assert_eq!(p.harvest(), vec![build, fetch]);
        let cleanup = p.ask(Request::build(&BTreeMap::new(), &[CACHE.to_owned()]));
        assert!(p.harvest().is_empty(), "it waits for the fetch and the build");
        // Newcomers of its stage or earlier ones wait behind it; a push
        // (further along) still goes first.
        let later_build = p.ask(Request::build(&BTreeMap::new(), &[]));
        let pull = p.ask(Request::stage(Stage::Pull));
        let push = p.ask(Request::stage(Stage::Push));
        assert_eq!(p.harvest(), vec![push]);
        p.release(build);
        p.release(fetch);
        assert!(p.harvest().is_empty(), "the push still uses the cache");
        p.release(push);
        assert_eq!(p.harvest(), vec![cleanup]);
        p.release(cleanup);
        assert_eq!(p.harvest(), vec![later_build, pull]);
    }

    #[test]
    fn two_exclusive_requests_on_crossed_tokens_do_not_deadlock() {
        // A is exclusive on x and shares y; B the reverse (BuildStream's
        // deadlock): the first in order goes, then the other.
        let mut p = Pools::new(BTreeMap::from([(Token::Process, 4)]));
        let x = "x".to_owned();
        let y = "y".to_owned();
        let a = p.ask(Request::build(&BTreeMap::from([(y.clone(), 1)]), std::slice::from_ref(&x)));
        let b = p.ask(Request::build(&BTreeMap::from([(x.clone(), 1)]), std::slice::from_ref(&y)));
        assert_eq!(p.harvest(), vec![a]);
        p.release(a);
        assert_eq!(p.harvest(), vec![b]);
    }

    #[test]
    fn a_withdrawn_request_frees_its_place() {
        let mut p = pools(1, 1);
        let first = p.ask(Request::stage(Stage::Fetch));
        assert_eq!(p.harvest(), vec![first]);
        let gone = p.ask(Request::stage(Stage::Fetch));
        let next = p.ask(Request::stage(Stage::Fetch));
        p.release(gone);
        p.release(first);
        assert_eq!(p.harvest(), vec![next]);
    }

    #[tokio::test]
    async fn dropping_a_grant_or_a_wait_gives_the_tokens_back() {
        let arbiter = Arbiter::new(pools(1, 1));
        let held = arbiter.acquire(Request::stage(Stage::Fetch), || {}).await.expect("free");
        let waited = std::cell::Cell::new(false);
        let waiting = arbiter.acquire(Request::stage(Stage::Fetch), || waited.set(true));
        tokio::pin!(waiting);
        // It cannot be granted while the first is held.
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(held);
        let second = waiting.await.expect("granted once the first is dropped");
        assert!(waited.get());
        // An abandoned wait does not keep the token.
        {
            let abandoned = arbiter.acquire(Request::stage(Stage::Fetch), || {});
            tokio::pin!(abandoned);
            assert!(futures::poll!(abandoned.as_mut()).is_pending());
        }
        drop(second);
        let third = arbiter.acquire(Request::stage(Stage::Fetch), || {}).await;
        assert!(third.is_ok());
    }
}
