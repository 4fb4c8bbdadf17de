//! drover build files: parsing and validation, source resolution, and
//! content-addressed job IDs.
//!
//! A build file (`drover.yaml`, or `drover.toml` with the same keys) names
//! the build's sources (globs relative to the file's directory) and its jobs:
//! shell commands with an environment, dependencies (`needs`), an optional
//! selection of the sources they see (`inputs`), resources, worker labels and
//! scheduling hints. [`load`] reads and checks a file, hashes its sources and
//! returns a [`Build`] whose jobs are in dependency order, each with its
//! [`Job::id`]: the cache key, a hash of everything that determines the job's
//! output.
//!
//! Validation reports every problem at once, as [`Diagnostic`]s ordered by
//! line.
//!
//! ```yaml
//! name: hello                          # default: the directory's name
//! sources: ["src/**", "include/*.h"]
//! max_parallel: 4
//! queue: nightly                       # default: the tenant's queue
//! jobs:
//!   - name: compile-a
//!     run: ["cc -c {{src}}/src/a.c -o {{out}}/a.o"]
//!     env: {CFLAGS: "-O2"}
//!     inputs: ["src/a.c", "include/*.h"]
//!   - name: app
//!     needs: [compile-a]
//!     run: ["cc {{dep:compile-a}}/a.o -o {{out}}/app"]
//!     resources: {cpu: 1, memory: 512Mi, tokens: {network: 1}}
//!     exclusive: [network]
//!     labels: {os: linux}
//!     priority: 0
//!     timeout: 10m
//!     retries: 1
//!     retry_on_failure: 2
//!   - name: shard-1
//!     run: ["./test --shard 1/2"]
//!     gang: {name: shards, min_available: 2, on_failure: restart}
//! ```

mod digest;
mod error;
mod glob;
mod graph;
mod id;
mod node;
mod placeholder;
mod schema;
mod sources;
mod stated;
mod suggest;
mod unclosed;
pub mod units;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use digest::{Digest, ParseDigestError, digest_bytes, digest_file};
pub use error::{Diagnostic, GraphError};
pub use placeholder::{PlaceholderError, render};
pub use stated::{StatedError, StatedJob, ids};

use error::Diagnostics;
use schema::{JobSpec, Located};

/// The largest build file accepted, in bytes (16 MiB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most jobs a build file may hold.
pub const MAX_JOBS: usize = schema::MAX_JOBS;

/// A checked build: its sources, hashed, and its jobs in dependency order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    /// `name` from the file, or the name of the build directory.
    pub name: String,
    /// The directory sources are resolved in: the build file's directory
    /// (made absolute) for [`load`], `root` as given for [`parse_str`].
    pub root: PathBuf,
    /// How many jobs of this build may run at once, if limited.
    pub max_parallel: Option<u32>,
    /// The coordinator queue the build goes to, if the file names one.
    pub queue: Option<String>,
    /// Every source file, sorted by path.
    pub sources: Vec<SourceFile>,
    /// Every job, dependencies before dependents, otherwise in file order.
    pub jobs: Vec<Job>,
}

/// One source file of a build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Relative to [`Build::root`], `/`-separated, never `..` nor absolute.
    pub path: String,
    /// BLAKE3 of the contents.
    pub digest: Digest,
    /// Size in bytes.
    pub size: u64,
    /// Whether any execute permission bit is set (always `false` off Unix).
    pub executable: bool,
}

/// One job of a build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Unique within the build: `[A-Za-z0-9._-]+`.
    pub name: String,
    /// Content ID, the cache key: BLAKE3 of a canonical, length-prefixed
    /// encoding of the version tag `drover-job-v2`, the commands, the
    /// environment, the resource class (CPU, memory, tokens, exclusive tokens,
    /// labels), the digest of the `(path, digest, executable)` of every source
    /// the job sees, and the `(name, id)` of each dependency (its ID without
    /// limits); then a `timeout`, `retries` or `retry_on_failure` other
    /// than the defaults, on top (see the `id` module). Not the job's name, the build name,
    /// priority or line: a renamed job, or the same job in another build
    /// file, keeps its ID.
    pub id: Digest,
    /// What the job's output depends on but for its dependencies' outputs
    /// (`drover-own-v1`: the ID's encoding up to the dependencies), the
    /// early cutoff's half of its key; `None` for a gang member.
    pub own: Option<Digest>,
    /// Shell commands run in order, placeholders not yet substituted (see
    /// [`render`]).
    pub commands: Vec<String>,
    /// Environment variables (values may hold placeholders too).
    pub env: BTreeMap<String, String>,
    /// Names of the jobs whose outputs this job reads, as written.
    pub needs: Vec<String>,
    /// The source paths this job sees (sorted), or `None` for all of them.
    pub inputs: Option<Vec<String>>,
    /// CPU request in millicores (default 1000, one core).
    pub cpu_millis: u64,
    /// Memory request in bytes (default 0).
    pub memory: u64,
    /// Named counted resources taken while the job runs.
    pub tokens: BTreeMap<String, u64>,
    /// Tokens taken exclusively on the worker (each is in `tokens`).
    pub exclusive: Vec<String>,
    /// Labels a worker must have to run the job.
    pub labels: BTreeMap<String, String>,
    /// Higher runs first (default 0).
    pub priority: i32,
    /// Time limit of a run, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Reruns allowed after losing a worker under the job (default 1).
    pub retries: u32,
    /// Reruns allowed after a run of the job failed (a flaky test's; default
    /// 0): the job fails only once every run has.
    pub retry_on_failure: u32,
    /// The gang it belongs to, if any.
    pub gang: Option<Gang>,
    /// For a job with `cache: false`: the nonce its ID hashes, new in each
    /// load of the file (see the `id` module).
    pub nonce: Option<Digest>,
    /// Line of the build file where the job starts.
    pub line: usize,
}

/// A gang: jobs of one build that start together or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gang {
    /// Unique within the build.
    pub name: String,
    /// How many of its jobs must be able to start at the same moment
    /// (default: all of them).
    pub min_available: u32,
    /// When a job of the started gang fails: rerun the whole gang (`true`)
    /// or fail like any job (`false`, the default).
    pub restart: bool,
}

/// The formats a build file can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// TOML for `.toml`, YAML otherwise (`.yaml`, `.yml`, anything else).
    fn of(file: &Path) -> Format {
        match file.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("toml") => Format::Toml,
            _ => Format::Yaml,
        }
    }
}

/// Reads, checks and resolves the build file at `path`: YAML for `.yaml` and
/// `.yml`, TOML for `.toml`, YAML for anything else. Sources are resolved
/// relative to the file's directory and hashed.
pub fn load(path: &Path) -> Result<Build, GraphError> {
    load_excluding(path, None)
}

/// [`load`], with directory `exclude` (a path absolute or relative to the
/// working directory) never read for sources: where outputs are exported
/// (`--out`), which a pattern such as `**` would otherwise match, so that
/// every export changed the sources of the next build.
pub fn load_excluding(path: &Path, exclude: Option<&Path>) -> Result<Build, GraphError> {
    let io_error = |source| GraphError::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(io_error)?;
    let mut bytes = Vec::new();
    // Read one byte past the limit to tell a file at the limit from a larger one.
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(io_error)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let root = std::path::absolute(dir).map_err(|source| GraphError::Io { path: dir.to_owned(), source })?;
    if let Some(error) = too_large(path, bytes.len()) {
        return Err(error);
    }
    let excluded = exclude
        .and_then(|dir| std::path::absolute(dir).ok())
        .and_then(|dir| dir.strip_prefix(&root).ok().map(|rel| rel.to_string_lossy().into_owned()))
        .filter(|rel| !rel.is_empty());
    match String::from_utf8(bytes) {
        Ok(text) => parse(path, &text, &root, excluded.as_deref()),
        Err(error) => {
            let valid = &error.as_bytes()[..error.utf8_error().valid_up_to()];
            // Lines end as the parsers end them: `\n`, `\r\n` or a lone `\r`.
            let lone_cr = valid.windows(2).filter(|w| w[0] == b'\r' && w[1] != b'\n').count()
                + usize::from(valid.last() == Some(&b'\r'));
            let line = valid.iter().filter(|&&b| b == b'\n').count() + lone_cr + 1;
            let mut diags = Diagnostics::new(path.to_owned());
            diags.push(Some(line), None, "build file is not valid UTF-8");
            Err(diags.into_error())
        }
    }
}

/// Checks and resolves a build file given as text. `file` is the name used in
/// diagnostics (its extension picks the format, as for [`load`]); `root` is
/// the directory sources are resolved in.
pub fn parse_str(file: &Path, text: &str, root: &Path) -> Result<Build, GraphError> {
    parse(file, text, root, None)
}

/// [`parse_str`], never reading the directory `excluded` (relative to
/// `root`) for sources.
fn parse(file: &Path, text: &str, root: &Path, excluded: Option<&str>) -> Result<Build, GraphError> {
    if let Some(error) = too_large(file, text.len()) {
        return Err(error);
    }
    let mut diags = Diagnostics::new(file.to_owned());
    let parsed = match Format::of(file) {
        Format::Yaml => node::parse_yaml(text),
        Format::Toml => node::parse_toml(text),
    };
    let tree = match parsed {
        Ok(tree) => tree,
        Err(error) => {
            diags.push(error.line, None, error.message);
            return Err(diags.into_error());
        }
    };
    let spec = schema::build_spec(&tree, &mut diags);
    let edges = graph::check(&spec.jobs, &mut diags);
    for job in &spec.jobs {
        check_placeholders(job, &mut diags);
    }
    let source_paths = sources::expand(root, &spec.sources, excluded, &mut diags)?;
    let inputs: Vec<Option<Vec<String>>> = spec
        .jobs
        .iter()
        .map(|job| {
            job.inputs
                .as_ref()
                .map(|patterns| sources::select(root, &source_paths, patterns, job.label(), &mut diags))
        })
        .collect();
    diags.finish()?;

    let sources = sources::hash(root, source_paths)?;
    let name = spec.name.unwrap_or_else(|| default_name(root));
    let jobs = resolve_jobs(spec.jobs, inputs, &edges, &sources);
    Ok(Build {
        name,
        root: root.to_owned(),
        max_parallel: spec.max_parallel,
        queue: spec.queue,
        sources,
        jobs,
    })
}

/// The error for a build file of `len` bytes, if that is over the limit.
fn too_large(file: &Path, len: usize) -> Option<GraphError> {
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    (len > MAX_FILE_BYTES).then(|| {
        let mut diags = Diagnostics::new(file.to_owned());
        diags.push(
            None,
            None,
            format!("build file is larger than {} MiB; refusing to read it", MAX_FILE_BYTES >> 20),
        );
        diags.into_error()
    })
}

/// Every placeholder problem in the job's commands and environment values.
fn check_placeholders(job: &JobSpec, diags: &mut Diagnostics) {
    let needs: Vec<String> = job.needs.iter().map(|need| need.value.clone()).collect();
    let texts = job
        .commands
        .iter()
        .map(|command| (String::new(), command))
        .chain(job.env.iter().map(|(key, value)| (format!("env {key:?}: "), value)));
    for (context, Located { value, line }) in texts {
        for error in placeholder::check(value, &needs) {
            diags.push(Some(*line), job.label(), format!("{context}{error}"));
        }
    }
}

/// The build directory's name.
fn default_name(root: &Path) -> String {
    let canonical = root.canonicalize().ok();
    canonical
        .as_deref()
        .unwrap_or(root)
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "build".to_owned())
}

/// Turns checked job specs into jobs, in topological order, with their IDs.
/// A value no other submission has: this process, the time, and how many
/// nonces it made before (a build file loaded twice in one process within
/// the clock's resolution still gets two).
fn submission_nonce() -> Digest {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"drover-nonce-v1");
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&now.as_nanos().to_le_bytes());
    hasher.update(&made.to_le_bytes());
    hasher.finalize().into()
}

fn resolve_jobs(
    specs: Vec<JobSpec>,
    inputs: Vec<Option<Vec<String>>>,
    edges: &[Vec<usize>],
    sources: &[SourceFile],
) -> Vec<Job> {
    // Made at the first job with `cache: false`, shared by all of them.
    let mut nonce: Option<Digest> = None;
    let names: Vec<String> = specs.iter().map(|spec| spec.label().unwrap_or_default().to_owned()).collect();
    // Each gang's settings; `min_available` defaults to all its jobs.
    let mut sizes: BTreeMap<&str, u32> = BTreeMap::new();
    for spec in &specs {
        if let Some(g) = &spec.gang {
            *sizes.entry(g.name.as_str()).or_default() += 1;
        }
    }
    let gangs: Vec<Option<Gang>> = specs
        .iter()
        .map(|spec| {
            let g = spec.gang.as_ref()?;
            Some(Gang {
                name: g.name.clone(),
                min_available: g.min_available.unwrap_or(sizes[g.name.as_str()]),
                restart: g.restart.unwrap_or(false),
            })
        })
        .collect();
    let mut pending: Vec<Option<(JobSpec, Option<Vec<String>>)>> =
        specs.into_iter().zip(inputs).map(Some).collect();
    let mut jobs = Vec::with_capacity(pending.len());
    // Dependencies come first in the order (which `stated::ids` needs).
    for i in graph::topological_order(edges) {
        let Some((spec, inputs)) = pending[i].take() else { continue };
        jobs.push(Job {
            name: names[i].clone(),
            // Made below, from the job's content, as a coordinator makes
            // them again from a submission.
            id: Digest([0; 32]),
            own: None,
            commands: spec.commands.into_iter().map(|command| command.value).collect(),
            env: spec.env.into_iter().map(|(key, value)| (key, value.value)).collect(),
            needs: spec.needs.into_iter().map(|need| need.value).collect(),
            inputs,
            cpu_millis: spec.cpu_millis,
            memory: spec.memory,
            tokens: spec.tokens,
            exclusive: spec.exclusive.into_iter().map(|token| token.value).collect(),
            labels: spec.labels,
            priority: spec.priority,
            timeout_ms: spec.timeout_ms,
            retries: spec.retries,
            retry_on_failure: spec.retry_on_failure,
            gang: gangs[i].clone(),
            nonce: (!spec.cache).then(|| *nonce.get_or_insert_with(submission_nonce)),
            line: spec.line,
        });
    }
    let stated: Vec<StatedJob<'_>> = jobs.iter().map(StatedJob::from).collect();
    let made = stated::ids(sources, &stated)
        .expect("a checked build's jobs come after their needs and see only its sources, once each");
    for (job, (id, own)) in jobs.iter_mut().zip(made) {
        job.id = id;
        job.own = own;
    }
    jobs
}
