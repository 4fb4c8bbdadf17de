//! Job IDs made from a build as a submission states it: how loading a
//! build file makes them, and what a coordinator checks before it takes a
//! client's IDs as cache keys (the same function, so the two agree). A job
//! ID is the key its output is cached and shared under, so an ID that does
//! not match its job's content would let one tenant's submission stand in
//! for another's job (a command that writes something else, cached under
//! the ID of a release job that others then take from the cache).

use std::collections::BTreeMap;

use crate::id::{self, JobKey, Limits};
use crate::{Digest, Gang, SourceFile, schema};

/// One job as a submission states it, in the build's order (every job
/// after the jobs it needs).
#[derive(Debug)]
pub struct StatedJob<'a> {
    pub name: &'a str,
    pub commands: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cpu_millis: u64,
    pub memory: u64,
    pub tokens: &'a BTreeMap<String, u64>,
    pub exclusive: &'a [String],
    pub labels: &'a BTreeMap<String, String>,
    pub needs: &'a [String],
    /// The source paths it sees, or `None` for all of them.
    pub inputs: Option<&'a [String]>,
    pub gang: Option<Gang>,
    pub timeout_ms: Option<u64>,
    pub retries: u32,
    pub retry_on_failure: u32,
    /// The submission's nonce of a job with `cache: false`.
    pub nonce: Option<Digest>,
}

impl<'a> From<&'a crate::Job> for StatedJob<'a> {
    /// A loaded job as a submission of it states it.
    fn from(job: &'a crate::Job) -> StatedJob<'a> {
        StatedJob {
            name: &job.name,
            commands: &job.commands,
            env: &job.env,
            cpu_millis: job.cpu_millis,
            memory: job.memory,
            tokens: &job.tokens,
            exclusive: &job.exclusive,
            labels: &job.labels,
            needs: &job.needs,
            inputs: job.inputs.as_deref(),
            gang: job.gang.clone(),
            timeout_ms: job.timeout_ms,
            retries: job.retries,
            retry_on_failure: job.retry_on_failure,
            nonce: job.nonce,
        }
    }
}

/// Why the IDs of a stated build cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatedError {
    /// A job sees a path that is not a source of the build.
    #[error("job {job:?}: input {path:?} is not a source of the build")]
    UnknownInput {
        /// The job.
        job: String,
        /// The path.
        path: String,
    },
    /// A job lists an input twice.
    #[error("job {job:?}: an input is listed twice")]
    DuplicateInput {
        /// The job.
        job: String,
    },
    /// A job needs one that does not come before it.
    #[error("job {job:?}: its need {need:?} is not an earlier job of the build")]
    NeedNotEarlier {
        /// The job.
        job: String,
        /// The need.
        need: String,
    },
}

/// The ID and early-cutoff key ([`crate::Job::id`], [`crate::Job::own`])
/// of each of `jobs`, made from what they state as [`crate::load`] makes
/// them from a build file. Refused: a need that is not an earlier job of
/// the build, an input that is not one of `sources`, an input listed twice.
pub fn ids(
    sources: &[SourceFile],
    jobs: &[StatedJob<'_>],
) -> Result<Vec<(Digest, Option<Digest>)>, StatedError> {
    let by_path: BTreeMap<&str, &SourceFile> = sources.iter().map(|s| (s.path.as_str(), s)).collect();
    let all_sources = id::sources_digest(sources);
    // Each earlier job's ID without its limits, which its dependents hash.
    let mut bases: BTreeMap<&str, Digest> = BTreeMap::new();
    let mut ids = Vec::with_capacity(jobs.len());
    for job in jobs {
        let seen = match job.inputs {
            None => all_sources,
            Some(paths) => {
                let mut seen = Vec::with_capacity(paths.len());
                for path in paths {
                    seen.push(*by_path.get(path.as_str()).ok_or_else(|| StatedError::UnknownInput {
                        job: job.name.to_owned(),
                        path: path.clone(),
                    })?);
                }
                let count = seen.len();
                seen.sort_unstable_by(|a, b| a.path.cmp(&b.path));
                seen.dedup_by(|a, b| a.path == b.path);
                if seen.len() != count {
                    return Err(StatedError::DuplicateInput { job: job.name.to_owned() });
                }
                id::sources_digest(seen)
            }
        };
        let mut deps = Vec::with_capacity(job.needs.len());
        for need in job.needs {
            let base = bases.get(need.as_str()).ok_or_else(|| StatedError::NeedNotEarlier {
                job: job.name.to_owned(),
                need: need.clone(),
            })?;
            deps.push((need.as_str(), *base));
        }
        let key = JobKey {
            commands: job.commands,
            env: job.env,
            cpu_millis: job.cpu_millis,
            memory: job.memory,
            tokens: job.tokens,
            exclusive: job.exclusive,
            labels: job.labels,
            sources: seen,
            deps,
            gang: job.gang.as_ref().map(|gang| (gang, job.name)),
            uncached: job.nonce,
        };
        let own = key.own();
        let base = key.id();
        bases.insert(job.name, base);
        let limits = Limits {
            timeout_ms: job.timeout_ms,
            retries: job.retries,
            default_retries: schema::DEFAULT_RETRIES,
            retry_on_failure: job.retry_on_failure,
        };
        ids.push((id::with_limits(base, limits), own));
    }
    Ok(ids)
}
