//! Submissions read once per distinct build spec.
//!
//! A build spec is most of a submission's bytes (about 230 bytes a job), and
//! the same spec often comes again: a retried pipeline, several pipelines
//! building one commit, twenty builds of one graph at once. The submit
//! handler reads the request's small fields with the spec left as raw JSON,
//! hashes that raw JSON (BLAKE3), and reuses the decoded spec of an earlier
//! submission with the same bytes while a build still holds it; builds
//! submitted with the same spec then share one copy in memory (and the
//! solver one checked plan). The cache holds its specs weakly: it never
//! keeps one alive by itself.
//!
//! A submission whose spec a build already holds is recorded in the input
//! log as "the spec of build N" (`Input::SubmitLike`): the state thread
//! chooses, as it carries the submission out (see `state.rs`), so a burst
//! of twenty is recorded whole once. Only the submission that decoded the
//! spec has its record encoded ahead, in the handler. After a restart the
//! cache is seeded with the specs of the latest replayed builds, encoded
//! as drover's client encodes them, so a build submitted again (each
//! `drover run` starts its coordinator afresh) is still recorded by
//! reference.
//!
//! Anything the fast path cannot read (bad JSON, a missing field) goes
//! through the ordinary decoder, so a bad request gets the same error as
//! ever.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use drover_proto::{BuildSpec, OnError, SubmitRequest};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A submission as sent, with its build left as raw JSON: the same fields,
/// defaults and names as [`SubmitRequest`].
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    build: &'a RawValue,
    tenant: String,
    no_cache: bool,
    #[serde(default)]
    on_error: OnError,
    #[serde(default)]
    max_parallel: Option<u32>,
    #[serde(default)]
    queue: Option<String>,
}

/// At most about this much JSON is encoded to seed the cache at a start.
const SEED_BYTES: usize = 64 << 20;

/// Decoded specs by the BLAKE3 digest of their JSON.
#[derive(Debug, Default)]
pub(crate) struct SpecCache {
    inner: Mutex<Inner>,
}

/// What reading a submission through the cache found out.
#[derive(Debug, PartialEq)]
pub(crate) struct Cached {
    /// Its spec was decoded here, not found: no build holds it yet.
    pub(crate) fresh: bool,
    /// The digest its spec is filed under (for [`SpecCache::accepted`]).
    pub(crate) digest: [u8; 32],
    /// The latest build accepted with this very spec, if the cache knows
    /// one: the state thread checks it before it looks at recent builds.
    pub(crate) holder: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    spec: Weak<BuildSpec>,
    /// The latest build accepted with it.
    build: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    specs: BTreeMap<[u8; 32], Entry>,
    /// Entries whose spec is gone are dropped when the map reaches this
    /// size (then twice what is left, at least 64).
    prune_at: usize,
}

impl SpecCache {
    /// Reads a submission (a JSON body), reusing the spec of an earlier one
    /// with the same spec bytes. `None` if the fast path cannot read it:
    /// the caller then decodes it the ordinary way, for the error.
    pub(crate) fn decode(&self, body: &[u8]) -> Option<(SubmitRequest, Cached)> {
        let envelope: Envelope<'_> = serde_json::from_slice(body).ok()?;
        let raw = envelope.build.get();
        let digest = *blake3::hash(raw.as_bytes()).as_bytes();
        let known = self.lock().specs.get(&digest).and_then(|e| Some((e.spec.upgrade()?, e.build)));
        let (build, fresh, holder) = match known {
            Some((spec, holder)) => (spec, false, holder),
            None => {
                let spec = Arc::new(serde_json::from_str::<BuildSpec>(raw).ok()?);
                // Another submission may have decoded the same bytes
                // meanwhile: the first one in stays the one copy.
                let (spec, fresh) = self.lock().insert(digest, spec);
                (spec, fresh, None)
            }
        };
        // Every field named: a field added to `SubmitRequest` must be added
        // to `Envelope` too.
        let req = SubmitRequest {
            build,
            tenant: envelope.tenant,
            no_cache: envelope.no_cache,
            on_error: envelope.on_error,
            max_parallel: envelope.max_parallel,
            queue: envelope.queue,
        };
        Some((req, Cached { fresh, digest, holder }))
    }

    /// Build `build` was accepted with `spec`, read under `digest`: later
    /// submissions of it name that build as the holder to check first.
    pub(crate) fn accepted(&self, digest: &[u8; 32], spec: &Arc<BuildSpec>, build: u64) {
        if let Some(entry) = self.lock().specs.get_mut(digest)
            && std::ptr::eq(entry.spec.as_ptr(), Arc::as_ptr(spec))
        {
            entry.build = Some(build);
        }
    }

    /// Files specs builds hold (after a restart, the latest replayed
    /// builds', newest first, each with the latest build holding it; only
    /// those whose job IDs are their content's) under
    /// the digest of their JSON as drover's client sends it; stops before
    /// a spec would take the JSON it encodes past [`SEED_BYTES`] (a spec's
    /// size is judged by its jobs' commands, a lower bound).
    pub(crate) fn seed(&self, specs: Vec<(u64, Arc<BuildSpec>)>) {
        let mut encoded = 0;
        for (build, spec) in specs {
            let floor: usize = spec.jobs.iter().flat_map(|j| &j.commands).map(String::len).sum();
            if encoded + floor > SEED_BYTES {
                break;
            }
            // A spec recorded before the coordinator checked job IDs (an
            // older drover's log) is not vouched for: one whose IDs are not
            // its jobs' content is left out, to be checked when it comes.
            if crate::checks::job_ids(&spec).is_err() {
                continue;
            }
            let Ok(json) = serde_json::to_vec(&*spec) else { continue };
            encoded += json.len();
            let digest = *blake3::hash(&json).as_bytes();
            let (kept, _) = self.lock().insert(digest, spec);
            self.accepted(&digest, &kept, build);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is consistent after every statement: a panic elsewhere
        // while it was held leaves nothing half done.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many specs it knows (live or not yet pruned).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().specs.len()
    }
}

impl Inner {
    /// Files `spec` under `digest`, unless a live spec is there already:
    /// returns the one to use, and whether it is `spec`.
    fn insert(&mut self, digest: [u8; 32], spec: Arc<BuildSpec>) -> (Arc<BuildSpec>, bool) {
        if let Some(known) = self.specs.get(&digest).and_then(|e| e.spec.upgrade()) {
            return (known, false);
        }
        self.specs.insert(digest, Entry { spec: Arc::downgrade(&spec), build: None });
        if self.specs.len() >= self.prune_at {
            self.specs.retain(|_, entry| entry.spec.strong_count() > 0);
            self.prune_at = (2 * self.specs.len()).max(64);
        }
        (spec, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_proto::{Hash32, JobDef};

    /// A build of one job, its ID its content's.
    fn build(name: &str) -> BuildSpec {
        let mut job = JobDef::new("a", Hash32([7; 32]));
        job.commands = vec!["echo \"hi\" > {{out}}/x".into()];
        job.needs = Vec::new();
        let mut spec = BuildSpec { name: name.into(), sources: Vec::new(), jobs: vec![job] };
        let ids = crate::checks::content_ids(&spec).expect("ids");
        spec.jobs[0].id = ids[0].0;
        spec
    }

    fn request(name: &str, max_parallel: Option<u32>, queue: Option<&str>) -> SubmitRequest {
        SubmitRequest {
            build: Arc::new(build(name)),
            tenant: "t".into(),
            no_cache: true,
            on_error: OnError::Continue,
            max_parallel,
            queue: queue.map(str::to_owned),
        }
    }

    /// The fast path reads what the ordinary decoder reads: with and
    /// without the optional fields, with unknown fields, with white space.
    #[test]
    fn reads_a_submission_as_the_decoder_does() {
        let cache = SpecCache::default();
        let mut bodies: Vec<String> = [request("b", None, None), request("b", Some(2), Some("ci"))]
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        bodies.push(
            r#" { "extra": [1, {"x": 2}], "tenant": "u", "no_cache": false,
                 "build": {"name": "n", "sources": [], "jobs": [{"name": "a", "id": "0707070707070707070707070707070707070707070707070707070707070707", "commands": ["true"]}]} } "#
                .into(),
        );
        for body in &bodies {
            let ordinary: SubmitRequest = serde_json::from_str(body).expect("decodes");
            assert_eq!(cache.decode(body.as_bytes()).map(|r| r.0), Some(ordinary), "{body}");
        }
    }

    /// A second submission with the same spec bytes gets the same spec,
    /// whatever its other fields; a different spec gets its own.
    #[test]
    fn submissions_with_the_same_spec_share_it() {
        let cache = SpecCache::default();
        let body = |r: &SubmitRequest| serde_json::to_vec(r).expect("json");
        let first = cache.decode(&body(&request("b", None, None))).expect("reads").0;
        let again = cache.decode(&body(&request("b", Some(3), Some("q")))).expect("reads").0;
        let other = cache.decode(&body(&request("c", None, None))).expect("reads").0;
        assert!(Arc::ptr_eq(&first.build, &again.build));
        assert_eq!(again.max_parallel, Some(3));
        assert!(!Arc::ptr_eq(&first.build, &other.build));
        assert_eq!(other.build.name, "c");
    }

    /// Only the submission that decoded a spec says so; a spec decoded
    /// again after its last holder went is fresh again.
    #[test]
    fn says_which_submission_decoded_the_spec() {
        let cache = SpecCache::default();
        let body = serde_json::to_vec(&request("b", None, None)).expect("json");
        let first = cache.decode(&body).expect("reads");
        let second = cache.decode(&body).expect("reads");
        assert!(first.1.fresh && !second.1.fresh);
        drop((first, second));
        assert!(cache.decode(&body).expect("reads").1.fresh);
    }

    /// Once a build is accepted with a spec, later submissions of it name
    /// that build; a build accepted with another copy of the spec is not
    /// named.
    #[test]
    fn names_the_latest_build_accepted_with_the_spec() {
        let cache = SpecCache::default();
        let body = serde_json::to_vec(&request("b", None, None)).expect("json");
        let (first, cached) = cache.decode(&body).expect("reads");
        assert_eq!(cached.holder, None);
        cache.accepted(&cached.digest, &first.build, 7);
        assert_eq!(cache.decode(&body).expect("reads").1.holder, Some(7));
        cache.accepted(&cached.digest, &first.build, 9);
        cache.accepted(&cached.digest, &Arc::new(build("b")), 11);
        assert_eq!(cache.decode(&body).expect("reads").1.holder, Some(9));
    }

    /// Two submissions that decode the same bytes at once end up with one
    /// copy: the first filed.
    #[test]
    fn a_race_to_decode_keeps_the_first_copy() {
        let cache = SpecCache::default();
        let first = Arc::new(build("b"));
        let (kept, filed) = cache.lock().insert([1; 32], first.clone());
        assert!(filed && Arc::ptr_eq(&kept, &first));
        let (kept, filed) = cache.lock().insert([1; 32], Arc::new(build("b")));
        assert!(!filed && Arc::ptr_eq(&kept, &first), "the second decoder takes the first copy");
    }

    /// A seeded spec (a replayed build's) is the one a submission of the
    /// same spec, as drover's client encodes it, gets.
    #[test]
    fn a_seeded_spec_is_found_by_a_submission_of_it() {
        let cache = SpecCache::default();
        let held = request("b", None, None).build;
        cache.seed(vec![(4, held.clone())]);
        let read =
            cache.decode(&serde_json::to_vec(&request("b", Some(2), None)).expect("json")).expect("reads");
        assert!(Arc::ptr_eq(&read.0.build, &held) && !read.1.fresh);
        assert_eq!(read.1.holder, Some(4));
        // One whose job IDs are not its content's (an older log's) is not
        // vouched for: a submission of it is checked afresh.
        let mut forged = build("f");
        forged.jobs[0].id = Hash32([9; 32]);
        let mut req = request("f", None, None);
        req.build = Arc::new(forged);
        cache.seed(vec![(5, req.build.clone())]);
        let read = cache.decode(&serde_json::to_vec(&req).expect("json")).expect("reads");
        assert_eq!(read.1.holder, None);
    }

    /// A spec no build holds any more is decoded afresh, and the entries of
    /// dropped specs are pruned as the map grows.
    #[test]
    fn holds_specs_weakly() {
        let cache = SpecCache::default();
        let body = serde_json::to_vec(&request("b", None, None)).expect("json");
        let first = cache.decode(&body).expect("reads").0;
        let weak = Arc::downgrade(&first.build);
        drop(first);
        assert_eq!(weak.strong_count(), 0);
        let again = cache.decode(&body).expect("reads").0;
        assert_eq!(again.build.name, "b");
        for i in 0..200 {
            cache.decode(&serde_json::to_vec(&request(&format!("b{i}"), None, None)).expect("json"));
        }
        // Only `again`'s spec is alive: at most one prune's worth of dead
        // entries remain.
        assert!(cache.len() < 128, "{} entries", cache.len());
    }

    /// What the fast path cannot read is left to the ordinary decoder.
    #[test]
    fn leaves_bad_bodies_to_the_decoder() {
        let cache = SpecCache::default();
        for bad in [
            "",
            "{",
            r#"{"tenant": "t", "no_cache": false}"#,
            r#"{"tenant": "t", "no_cache": false, "build": {"name": "n"}}"#,
            r#"{"tenant": 3, "no_cache": false, "build": {"name": "n", "sources": [], "jobs": []}}"#,
        ] {
            assert_eq!(cache.decode(bad.as_bytes()), None, "{bad}");
            assert!(serde_json::from_str::<SubmitRequest>(bad).is_err(), "{bad}");
        }
    }
}
