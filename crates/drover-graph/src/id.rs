//! Job IDs: the BLAKE3 hash of a canonical encoding of everything that
//! determines a job's output, which makes the ID the job's cache key.
//!
//! Hashed, in this order, after the version tag `drover-job-v2`: the commands
//! in order, the environment, the resource class (CPU millicores, memory
//! bytes, tokens, exclusive tokens, labels), the digest of the sources the
//! job sees (see [`sources_digest`]), and the `(name, id)` of every
//! dependency. (Version 1 hashed every source into every job: a build of
//! 100,000 jobs that each see 1,000 sources hashed 100 million entries;
//! the digest of all the sources is now made once and shared by every job
//! that sees them all.)
//! Maps and sets are hashed sorted; dependencies by name. Every string is
//! prefixed by its byte length and every list by its length, and integers
//! are fixed-width little-endian, so no two different jobs share an encoding.
//!
//! A gang member's ID also hashes the gang's name, `min_available` and
//! `on_failure`, and the member's own name (after the dependencies, under a
//! `gang-v2` tag; jobs outside a gang hash nothing there, so their IDs are
//! unchanged): a job is shared across builds only with the same job of an
//! identical gang, and the members of a gang are as many processes as it
//! has jobs even when their commands are the same (the ranks of one
//! program). (The `gang` tag before it hashed no member name, so that
//! identical members were one job and their gang could never start.)
//!
//! A job's `timeout`, `retries` and `retry_on_failure`, when they are not
//! the defaults (no timeout, one retry, no rerun), are hashed on top of
//! that ID (see [`with_limits`]):
//! builds share a job's run, and its cached result, only when they agree on
//! how long it may run and how often it is tried again, so one build's
//! stricter limit never fails another's run. Its dependents hash the ID
//! without them, since the limits do not change what a successful run
//! writes: changing a job's timeout runs that job again, not its
//! dependents.
//!
//! A job with `cache: false` also hashes its submission's nonce (after the
//! gang, under an `uncached-v1` tag; other jobs hash nothing there): its
//! ID, and so every ID downstream of it, is new in each build, and it has
//! no early-cutoff key of its own. It runs in every build, and its
//! dependents are taken from the cache only by early cutoff, on what it
//! wrote this time.
//!
//! Not hashed: the job's own name (but in a gang), the build name, priority
//! and the line; so the same job in another file, or renamed, keeps its ID.
//! Any change to this encoding must change the version tag, but for one
//! kind: adding, under a tag of its own, what earlier encodings left out
//! (as `drover-limits-v1` did), which changes the IDs of only the jobs that
//! use it.

use std::collections::BTreeMap;

use crate::{Digest, SourceFile};

/// Version tag of the encoding, hashed first.
const VERSION: &str = "drover-job-v2";

/// What a job's ID is computed from.
#[derive(Debug)]
pub(crate) struct JobKey<'a> {
    pub(crate) commands: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) cpu_millis: u64,
    pub(crate) memory: u64,
    pub(crate) tokens: &'a BTreeMap<String, u64>,
    pub(crate) exclusive: &'a [String],
    pub(crate) labels: &'a BTreeMap<String, String>,
    /// The digest of the sources the job sees ([`sources_digest`]).
    pub(crate) sources: Digest,
    /// `(dependency name, dependency id)`, in any order.
    pub(crate) deps: Vec<(&'a str, Digest)>,
    /// The job's gang, and the job's name in it.
    pub(crate) gang: Option<(&'a crate::Gang, &'a str)>,
    /// For a job with `cache: false`: its submission's nonce, so that the
    /// job (and everything downstream) has an ID no earlier build had.
    pub(crate) uncached: Option<Digest>,
}

impl JobKey<'_> {
    /// The job's content without its dependencies (the early cutoff's part
    /// of a job's key, see [`Self::own`]).
    fn content(&self, out: &mut Encoder) {
        out.str("commands");
        out.len(self.commands.len());
        for command in self.commands {
            out.str(command);
        }

        out.str("env");
        out.len(self.env.len());
        for (key, value) in self.env {
            out.str(key);
            out.str(value);
        }

        out.str("resources");
        out.u64(self.cpu_millis);
        out.u64(self.memory);
        out.len(self.tokens.len());
        for (token, count) in self.tokens {
            out.str(token);
            out.u64(*count);
        }
        let mut exclusive: Vec<&str> = self.exclusive.iter().map(String::as_str).collect();
        exclusive.sort_unstable();
        exclusive.dedup();
        out.len(exclusive.len());
        for token in exclusive {
            out.str(token);
        }
        out.len(self.labels.len());
        for (key, value) in self.labels {
            out.str(key);
            out.str(value);
        }

        out.str("sources");
        out.0.update(&self.sources.0);
    }

    /// What the job's output depends on but for its dependencies' outputs,
    /// under the tag `drover-own-v1`: the encoding of the ID up to its
    /// dependencies. With the digests of those outputs it makes the key
    /// of the early cutoff (a job whose dependencies ran again and wrote
    /// what they wrote before takes its earlier output). `None` for a gang
    /// member, which runs with its gang, and for a job that is never cached.
    pub(crate) fn own(&self) -> Option<Digest> {
        if self.gang.is_some() || self.uncached.is_some() {
            return None;
        }
        let mut out = Encoder(blake3::Hasher::new());
        out.str("drover-own-v1");
        self.content(&mut out);
        Some(out.0.finalize().into())
    }

    pub(crate) fn id(mut self) -> Digest {
        let mut out = Encoder(blake3::Hasher::new());
        out.str(VERSION);
        self.content(&mut out);

        out.str("deps");
        self.deps.sort_unstable();
        out.len(self.deps.len());
        for (name, id) in &self.deps {
            out.str(name);
            out.0.update(&id.0);
        }

        if let Some((gang, member)) = self.gang {
            out.str("gang-v2");
            out.str(&gang.name);
            out.u64(u64::from(gang.min_available));
            out.0.update(&[u8::from(gang.restart)]);
            out.str(member);
        }
        if let Some(nonce) = self.uncached {
            out.str("uncached-v1");
            out.0.update(&nonce.0);
        }
        out.0.finalize().into()
    }
}

/// A job's ID from its ID without limits (`base`, what its dependents
/// hash), its timeout, its retries and its reruns on failure: `base`
/// itself with no timeout, the default retries and no reruns, so most
/// jobs' IDs are their base.
pub(crate) fn with_limits(base: Digest, limits: Limits) -> Digest {
    let Limits { timeout_ms, retries, default_retries, retry_on_failure } = limits;
    let mut id = base;
    if timeout_ms.is_some() || retries != default_retries {
        let mut out = Encoder(blake3::Hasher::new());
        out.str("drover-limits-v1");
        out.0.update(&id.0);
        out.0.update(&[u8::from(timeout_ms.is_some())]);
        out.u64(timeout_ms.unwrap_or(0));
        out.u64(u64::from(retries));
        id = out.0.finalize().into();
    }
    // Added after the limits above, under a tag of its own: only the IDs
    // of jobs that ask for reruns changed.
    if retry_on_failure > 0 {
        let mut out = Encoder(blake3::Hasher::new());
        out.str("drover-reruns-v1");
        out.0.update(&id.0);
        out.u64(u64::from(retry_on_failure));
        id = out.0.finalize().into();
    }
    id
}

/// What [`with_limits`] hashes on top of a job's base ID.
pub(crate) struct Limits {
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) retries: u32,
    pub(crate) default_retries: u32,
    pub(crate) retry_on_failure: u32,
}

/// The digest of a set of sources: BLAKE3 of their count and, sorted by
/// path, each one's length-prefixed path, content digest and executable
/// bit, under its own tag.
pub(crate) fn sources_digest<'a>(sources: impl IntoIterator<Item = &'a SourceFile>) -> Digest {
    let mut sorted: Vec<&SourceFile> = sources.into_iter().collect();
    if !sorted.is_sorted_by(|a, b| a.path <= b.path) {
        sorted.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    }
    let mut out = Encoder(blake3::Hasher::new());
    out.str("drover-sources-v1");
    out.len(sorted.len());
    for source in sorted {
        out.str(&source.path);
        out.0.update(&source.digest.0);
        out.0.update(&[u8::from(source.executable)]);
    }
    out.0.finalize().into()
}

struct Encoder(blake3::Hasher);

impl Encoder {
    fn u64(&mut self, value: u64) {
        self.0.update(&value.to_le_bytes());
    }

    fn len(&mut self, len: usize) {
        // usize is at most 64 bits on every supported target.
        self.u64(u64::try_from(len).unwrap_or(u64::MAX));
    }

    fn str(&mut self, text: &str) {
        self.len(text.len());
        self.0.update(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest_bytes;

    fn lp(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }

    /// The encoding, spelled out byte by byte: a change here changes every
    /// cache key and needs a new version tag.
    #[test]
    fn encoding_is_exactly_as_documented() {
        let source =
            SourceFile { path: "src/a.c".into(), digest: digest_bytes(b"int a;"), size: 6, executable: true };
        let dep_id = digest_bytes(b"dep");
        let commands = vec!["cc -c a.c".to_owned(), "true".to_owned()];
        let env = BTreeMap::from([("Z".to_owned(), "1".to_owned()), ("A".to_owned(), "2".to_owned())]);
        let tokens = BTreeMap::from([("net".to_owned(), 1u64)]);
        let exclusive = vec!["net".to_owned()];
        let labels = BTreeMap::from([("os".to_owned(), "linux".to_owned())]);
        let key = JobKey {
            commands: &commands,
            env: &env,
            cpu_millis: 500,
            memory: 1 << 20,
            tokens: &tokens,
            exclusive: &exclusive,
            labels: &labels,
            sources: sources_digest([&source]),
            gang: None,
            deps: vec![("lib", dep_id)],
            uncached: None,
        };

        let mut expected = Vec::new();
        lp(&mut expected, "drover-job-v2");
        lp(&mut expected, "commands");
        expected.extend_from_slice(&2u64.to_le_bytes());
        lp(&mut expected, "cc -c a.c");
        lp(&mut expected, "true");
        lp(&mut expected, "env");
        expected.extend_from_slice(&2u64.to_le_bytes());
        for text in ["A", "2", "Z", "1"] {
            lp(&mut expected, text);
        }
        lp(&mut expected, "resources");
        expected.extend_from_slice(&500u64.to_le_bytes());
        expected.extend_from_slice(&(1u64 << 20).to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes());
        lp(&mut expected, "net");
        expected.extend_from_slice(&1u64.to_le_bytes());
        expected.extend_from_slice(&1u64.to_le_bytes());
        lp(&mut expected, "net");
        expected.extend_from_slice(&1u64.to_le_bytes());
        lp(&mut expected, "os");
        lp(&mut expected, "linux");
        lp(&mut expected, "sources");
        let mut set = Vec::new();
        lp(&mut set, "drover-sources-v1");
        set.extend_from_slice(&1u64.to_le_bytes());
        lp(&mut set, "src/a.c");
        set.extend_from_slice(&source.digest.0);
        set.push(1);
        expected.extend_from_slice(&digest_bytes(&set).0);
        lp(&mut expected, "deps");
        expected.extend_from_slice(&1u64.to_le_bytes());
        lp(&mut expected, "lib");
        expected.extend_from_slice(&dep_id.0);

        assert_eq!(key.id(), digest_bytes(&expected));
    }

    #[test]
    fn length_prefixes_keep_boundaries() {
        let empty = BTreeMap::new();
        let no_tokens = BTreeMap::new();
        let id = |commands: &[String]| {
            JobKey {
                commands,
                env: &empty,
                cpu_millis: 1000,
                memory: 0,
                tokens: &no_tokens,
                exclusive: &[],
                labels: &empty,
                sources: sources_digest([]),
                gang: None,
                deps: Vec::new(),
                uncached: None,
            }
            .id()
        };
        assert_ne!(id(&["ab".into(), "c".into()]), id(&["a".into(), "bc".into()]));
        assert_ne!(id(&["abc".into()]), id(&["ab".into(), "c".into()]));
        assert_ne!(id(&[]), id(&[String::new()]));
    }
}
