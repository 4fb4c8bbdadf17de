//! Checks on the free text and the numbers of requests, made by the API
//! before the state thread sees them: names that reach other clients'
//! terminals (build, tenant, queue and worker names, labels, tokens), a
//! worker's URL (which the coordinator fetches from, with its token) and
//! capacity, and what a submitted job takes with it to a worker: its name
//! (a directory name), commands and environment (under the limits Linux
//! puts on a process's arguments), and the build's source paths (laid out
//! as files on the worker). A request that fails one is refused with 400
//! and never reaches the log.
//!
//! These live here rather than in the solver, which checks what a build
//! means (names of jobs, needs, gangs): a log written before a check was
//! added must still replay the same. Most restate a rule of the build file
//! (drover-graph, which the coordinator does not depend on), so that a
//! submission straight to the API, without the CLI's checks, is held to it
//! too.

use drover_proto::{BuildSpec, Hash32, JobDef, RegisterRequest, SourceFile, SubmitRequest, WorkerCapacity};

/// Longest name of a build, tenant, queue, worker, label or token.
const MAX_NAME: usize = 256;
/// Longest worker URL.
const MAX_URL: usize = 2048;
/// Most labels and named tokens a worker may advertise.
const MAX_LABELS: usize = 256;

/// Longest job name: a job's name is a directory's (`--out DIR/<job>/`),
/// and a file name is at most this long (drover-cas's path rules, Linux's
/// `NAME_MAX`). Also the longest component of a source path.
const MAX_FILE_NAME: usize = drover_cas::manifest::MAX_NAME;

/// Longest source path: the worker lays sources out under a directory of
/// its own, by absolute path, and Linux refuses a path over 4 KiB
/// (drover-cas's `MAX_PATH`, `PATH_MAX`): 1 KiB of that is left for the
/// worker's directory.
const MAX_SOURCE_PATH: usize = drover_cas::manifest::MAX_PATH - 1024;
/// Most components of a source path: every level is a directory the
/// worker makes, makes read-only and removes again for every run that
/// sees it.
const MAX_SOURCE_DEPTH: usize = 256;

/// The longest command or `env` entry (`NAME=value`): drover-graph's
/// `MAX_COMMAND` (schema.rs). Linux passes at most 128 KiB in one argument
/// or environment string (`MAX_ARG_STRLEN`), and placeholders grow a
/// command when they are filled in.
const MAX_COMMAND: usize = 126 * 1024;
/// The most `env` a job may set in all, counted as drover-graph counts it
/// (`MAX_ENV` in schema.rs: each entry's name and value, and two bytes):
/// Linux passes at most 2 MiB of arguments and environment together, and a
/// command and the worker's own variables need room too.
const MAX_ENV: usize = 1024 * 1024;

/// The most reruns a job's `retry_on_failure` may ask for
/// (`MAX_RETRY_ON_FAILURE` in drover-graph's schema.rs).
const MAX_RETRY_ON_FAILURE: u32 = 10;

/// Most slots a worker may offer: Linux runs on at most 8,192 CPUs
/// (`NR_CPUS` at its largest), and a worker runs a job per slot.
const MAX_SLOTS: u32 = 8192;
/// Most CPU a worker may offer, in millicores: 8,192 CPUs.
const MAX_CPU_MILLIS: u64 = 8192 * 1000;
/// Most memory a worker may offer: 4 PiB, all that a 52-bit physical
/// address (the widest of today's 64-bit processors) can reach.
const MAX_MEMORY: u64 = 1 << 52;

/// A name shown to users: at most [`MAX_NAME`] bytes, no control
/// characters (escape sequences in a name would reach the terminals of
/// `drover status` and `drover workers`) and no invisible ones (so that
/// `w\u{200b}1` cannot pass for `w1`).
fn name(what: &str, text: &str) -> Result<(), String> {
    if text.len() > MAX_NAME {
        return Err(format!("{what} is {} bytes long; at most {MAX_NAME}", text.len()));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!("{what} {:?} contains the control character {c:?}", truncated(text)));
    }
    if let Some(c) = text.chars().find(|&c| invisible(c)) {
        return Err(format!(
            "{what} {:?} contains the invisible character U+{:04X}, which would make it look like \
             another name",
            truncated(text),
            u32::from(c)
        ));
    }
    Ok(())
}

/// A name shown to users that must say something: not empty or blank.
fn filled(what: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{what} cannot be empty"));
    }
    name(what, text)
}

/// Characters a terminal shows as nothing, or that reorder the text after
/// them: the soft hyphen, the Arabic letter mark, zero-width spaces and
/// joiners, the direction marks, embeddings, overrides and isolates, the
/// word joiner and invisible operators, and the byte-order mark.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{AD}'
            | '\u{61C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

/// The start of `text`, for messages.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A worker's registration: its name, URL, capacity, labels and tokens.
pub(crate) fn registration(req: &RegisterRequest) -> Result<(), String> {
    filled("the worker name", &req.name)?;
    worker_url(&req.url)?;
    capacity(&req.capacity)?;
    if req.labels.len() > MAX_LABELS || req.capacity.tokens.len() > MAX_LABELS {
        return Err(format!("a worker advertises at most {MAX_LABELS} labels and {MAX_LABELS} named tokens"));
    }
    for (key, value) in &req.labels {
        filled("a label name", key)?;
        name(&format!("the value of label {key}"), value)?;
    }
    for token in req.capacity.tokens.keys() {
        filled("a token name", token)?;
    }
    Ok(())
}

/// What a worker offers: at least one slot, and no more slots, CPU or
/// memory than a machine can have (a mistake, or a worker claiming the
/// whole cluster's work).
fn capacity(capacity: &WorkerCapacity) -> Result<(), String> {
    let WorkerCapacity { slots, cpu_millis, memory, .. } = *capacity;
    if slots == 0 {
        return Err("a worker needs at least one slot".into());
    }
    if slots > MAX_SLOTS {
        return Err(format!(
            "a worker offers {slots} slots; at most {MAX_SLOTS} (no machine runs more jobs at once than that)"
        ));
    }
    if cpu_millis > MAX_CPU_MILLIS {
        return Err(format!(
            "a worker offers {cpu_millis} millicores of CPU; at most {MAX_CPU_MILLIS} ({} CPUs, the most \
             Linux runs on)",
            MAX_CPU_MILLIS / 1000
        ));
    }
    if memory > MAX_MEMORY {
        return Err(format!(
            "a worker offers {memory} bytes of memory; at most {MAX_MEMORY} (4 PiB, the most a 64-bit \
             processor addresses)"
        ));
    }
    Ok(())
}

/// Where peers, clients and the coordinator reach a worker: `http://` or
/// `https://`, a host, maybe a port and a path prefix, and nothing else
/// (no user, query or fragment: the coordinator appends its paths to it,
/// and `http://host/x#` would turn them into a fragment and have it fetch
/// `http://host/x` with its token).
fn worker_url(url: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("worker URL {:?}: {why}", truncated(url)));
    if url.len() > MAX_URL {
        return refuse(&format!("longer than {MAX_URL} bytes"));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return refuse("contains spaces or control characters");
    }
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return refuse("must start with http:// or https://");
    };
    if rest.contains(['?', '#']) {
        return refuse("cannot have a query or a fragment");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return refuse("has no host");
    }
    if authority.contains('@') {
        return refuse("cannot carry a user name or password");
    }
    if url.parse::<axum::http::Uri>().is_err() {
        return refuse("is not a valid URL");
    }
    Ok(())
}

/// A submission: its names, source paths and jobs.
pub(crate) fn submission(req: &SubmitRequest) -> Result<(), String> {
    filled("the build name", &req.build.name)?;
    filled("the tenant", &req.tenant)?;
    if let Some(queue) = &req.queue {
        name("the queue name", queue)?;
    }
    sources(&req.build.sources)?;
    req.build.jobs.iter().try_for_each(job)
}

/// `spec` with each job's ID and early-cutoff key made from its content,
/// as a client makes them from a build file and as the coordinator checks
/// them (for a client of the API that builds specs itself). A spec whose
/// IDs cannot be made (a need that is not an earlier job, an input that
/// is not a source) is returned as it is, for the coordinator to refuse.
pub fn with_content_ids(mut spec: BuildSpec) -> BuildSpec {
    if let Ok(ids) = content_ids(&spec) {
        for (job, (id, own)) in spec.jobs.iter_mut().zip(ids) {
            job.id = id;
            job.own = own;
        }
    }
    spec
}

/// The ID and early-cutoff key each job of `spec` gets from its content,
/// as a client makes them from a build file (`drover_graph::ids`).
pub(crate) fn content_ids(spec: &BuildSpec) -> Result<Vec<(Hash32, Option<Hash32>)>, String> {
    let sources: Vec<drover_graph::SourceFile> = spec
        .sources
        .iter()
        .map(|s| drover_graph::SourceFile {
            path: s.path.clone(),
            digest: drover_graph::Digest(s.digest.0),
            size: s.size,
            executable: s.executable,
        })
        .collect();
    let stated: Vec<drover_graph::StatedJob<'_>> = spec
        .jobs
        .iter()
        .map(|j| drover_graph::StatedJob {
            name: &j.name,
            commands: &j.commands,
            env: &j.env,
            cpu_millis: j.cpu_millis,
            memory: j.memory,
            tokens: &j.tokens,
            exclusive: &j.exclusive,
            labels: &j.labels,
            needs: &j.needs,
            inputs: j.inputs.as_deref(),
            gang: j.gang.as_ref().map(|g| drover_graph::Gang {
                name: g.name.clone(),
                min_available: g.min_available,
                restart: g.restart,
            }),
            timeout_ms: j.timeout_ms,
            retries: j.retries,
            retry_on_failure: j.retry_on_failure,
            nonce: j.nonce.map(|n| drover_graph::Digest(n.0)),
        })
        .collect();
    let made = drover_graph::ids(&sources, &stated).map_err(|e| e.to_string())?;
    Ok(made.into_iter().map(|(id, own)| (Hash32(id.0), own.map(|o| Hash32(o.0)))).collect())
}

/// Every job's ID and early-cutoff key are those its content makes
/// ([`content_ids`]): a job whose ID is not would be cached, and shared
/// with other builds, under another job's key.
pub(crate) fn job_ids(spec: &BuildSpec) -> Result<(), String> {
    for (job, (id, own)) in spec.jobs.iter().zip(content_ids(spec)?) {
        let which = match (job.id != id, job.own.is_some_and(|o| own != Some(o))) {
            (true, _) => "ID",
            (false, true) => "early-cutoff key (own)",
            (false, false) => continue,
        };
        return Err(format!(
            "job {:?}: its {which} is not the one its content makes (a job's ID is its cache key, made \
             from its commands, environment, resources, sources and needs; is the client another \
             drover version?)",
            job.name
        ));
    }
    Ok(())
}

/// The build's source paths: each short enough to lay out, and none a file
/// that another makes a directory (`a` and `a/b`). Clean relative paths,
/// sorted and unique, the solver checks.
fn sources(sources: &[SourceFile]) -> Result<(), String> {
    for source in sources {
        let path = &source.path;
        if path.len() > MAX_SOURCE_PATH {
            return Err(format!(
                "source path {:?} is {} bytes long; at most {MAX_SOURCE_PATH} (workers lay sources out \
                 under their own directories, and Linux takes paths of at most 4 KiB)",
                truncated(path),
                path.len()
            ));
        }
        if let Some(long) = path.split('/').find(|part| part.len() > MAX_FILE_NAME) {
            return Err(format!(
                "source path {:?} has a component of {} bytes; a file name is at most {MAX_FILE_NAME}",
                truncated(path),
                long.len()
            ));
        }
        let depth = path.split('/').count();
        if depth > MAX_SOURCE_DEPTH {
            return Err(format!(
                "source path {:?} is {depth} levels deep; at most {MAX_SOURCE_DEPTH}",
                truncated(path)
            ));
        }
    }
    for source in sources {
        for (slash, _) in source.path.match_indices('/') {
            let dir = &source.path[..slash];
            // A binary search, for the list must be sorted: one that is not
            // is refused by the solver, and a match found is a match all
            // the same.
            if sources.binary_search_by(|s| s.path.as_str().cmp(dir)).is_ok() {
                return Err(format!(
                    "source paths {dir:?} and {:?} conflict: {dir:?} cannot be both a file and a directory",
                    truncated(&source.path)
                ));
            }
        }
    }
    Ok(())
}

/// A job: its name, and what its process gets (commands, environment) and
/// is matched with (labels, tokens, its gang's name).
fn job(job: &JobDef) -> Result<(), String> {
    job_name(&job.name)?;
    let refuse = |what: String| Err(format!("job {:?}: {what}", job.name));
    for (i, command) in job.commands.iter().enumerate() {
        if command.contains('\0') {
            return refuse(format!("command {} contains NUL", i + 1));
        }
        if command.len() > MAX_COMMAND {
            return refuse(format!(
                "command {} is {} KiB long; at most 126 KiB can be run (Linux's limit for one argument \
                 is 128 KiB): put it in a script among the sources and run that",
                i + 1,
                command.len().div_ceil(1024)
            ));
        }
    }
    let mut env = 0;
    for (key, value) in &job.env {
        if key.is_empty() || key.contains(['=', '\0']) {
            return refuse(format!(
                "environment variable name {:?} is empty or contains '=' or NUL",
                truncated(key)
            ));
        }
        if value.contains('\0') {
            return refuse(format!("the value of environment variable {:?} contains NUL", truncated(key)));
        }
        if key.len() + 1 + value.len() > MAX_COMMAND {
            return refuse(format!(
                "environment variable {:?} is {} KiB long; at most 126 KiB can be passed to a job",
                truncated(key),
                (key.len() + 1 + value.len()).div_ceil(1024)
            ));
        }
        env += key.len() + value.len() + 2;
    }
    if env > MAX_ENV {
        return refuse(format!(
            "its environment is {} KiB in all; at most 1 MiB can be passed to a job (Linux limits a \
             command's arguments and environment together to 2 MiB)",
            env.div_ceil(1024)
        ));
    }
    let within = |what: &str, text: &str| filled(what, text).or_else(refuse);
    for (key, value) in &job.labels {
        within("a label name", key)?;
        name(&format!("the value of label {key}"), value).or_else(refuse)?;
    }
    for token in job.tokens.keys().chain(&job.exclusive) {
        within("a token name", token)?;
    }
    if let Some(gang) = &job.gang {
        within("the gang name", &gang.name)?;
        if job.retry_on_failure > 0 {
            return refuse(
                "a gang member has no retry_on_failure: its gang's on_failure: restart runs the whole gang again"
                    .into(),
            );
        }
    }
    if job.retry_on_failure > MAX_RETRY_ON_FAILURE {
        return refuse(format!(
            "retry_on_failure is {}; at most {MAX_RETRY_ON_FAILURE} reruns are allowed",
            job.retry_on_failure
        ));
    }
    Ok(())
}

/// A job's name: letters, digits, `.`, `_` and `-`, not `.` or `..`, at
/// most [`MAX_FILE_NAME`] bytes, for it names directories. The build
/// file's rule (drover-graph's `check_job_name` in schema.rs, private
/// there), and a length the build file leaves to the file system.
fn job_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a job name cannot be empty".into());
    }
    if name.len() > MAX_FILE_NAME {
        return Err(format!(
            "job name {:?} is {} bytes long; at most {MAX_FILE_NAME} (it names a directory)",
            truncated(name),
            name.len()
        ));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!(
            "invalid job name {:?}: {bad:?} is not allowed (use letters, digits, '.', '_' and '-')",
            truncated(name)
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("invalid job name {name:?}: it names a directory, so it cannot be . or .."));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_urls_are_plain_http_addresses() {
        for ok in ["http://127.0.0.1:7701", "https://w1.example:443", "http://[::1]:80", "http://host/prefix"]
        {
            assert_eq!(worker_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:7799/secret.txt#",
            "http://h/?x=1",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "http://user:pw@h:1",
            "http://",
            "http://h x",
            "http://h\u{1b}[2J",
            "",
        ] {
            assert!(worker_url(bad).is_err(), "{bad:?} accepted");
        }
        assert!(worker_url(&format!("http://h/{}", "a".repeat(MAX_URL))).is_err(), "too long");
    }

    #[test]
    fn names_shown_to_users_have_no_control_characters() {
        assert_eq!(name("the build name", "release 1.2 – ünïcode"), Ok(()));
        let err = name("the build name", "build\u{1b}[2J\rOVERWRITE").unwrap_err();
        assert!(err.contains("control character"), "{err}");
        assert!(name("the tenant", &"t".repeat(MAX_NAME + 1)).is_err());
    }

    /// A name cannot pass for another by a character that shows as
    /// nothing or turns the text around; letters of any script are fine.
    #[test]
    fn names_shown_to_users_have_no_invisible_characters() {
        assert_eq!(name("the worker name", "wörker-ŵ1 日本"), Ok(()));
        for bad in ["w\u{200b}1", "w1\u{200f}", "\u{202e}1w", "w\u{2066}1", "\u{feff}w1", "w\u{ad}1"] {
            let err = name("the worker name", bad).expect_err(bad);
            assert!(err.contains("invisible character U+"), "{err}");
        }
        assert_eq!(filled("the tenant", " \t").unwrap_err(), "the tenant cannot be empty");
    }

    /// The build file's job-name rule, with a length: a name is a
    /// directory's.
    #[test]
    fn job_names_are_directory_names() {
        for ok in ["compile-a.1_x", "...", ".a", &"n".repeat(MAX_FILE_NAME)] {
            assert_eq!(job_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "é", "a\u{1b}]0;x\u{7}"] {
            assert!(job_name(bad).is_err(), "{bad:?} accepted");
        }
        let err = job_name(&"n".repeat(100 << 10)).unwrap_err();
        assert!(err.contains("102400 bytes long; at most 255"), "{err}");
    }

    fn source(path: &str) -> SourceFile {
        SourceFile { path: path.into(), digest: drover_proto::Hash32([0; 32]), size: 0, executable: false }
    }

    /// A source is a file: one that another's path takes for a directory
    /// is refused, however far apart the two are in the sorted list.
    #[test]
    fn a_source_cannot_be_a_file_and_a_directory() {
        let ok: Vec<SourceFile> = ["a.c", "a/b", "a/c/d", "ab", "b"].map(source).into();
        assert_eq!(sources(&ok), Ok(()));
        let err = sources(&["a", "a!x", "a.c", "a/b"].map(source)).unwrap_err();
        assert!(err.contains(r#""a" and "a/b" conflict"#), "{err}");
        let err = sources(&["a/b", "a/b/c/d"].map(source)).unwrap_err();
        assert!(err.contains(r#""a/b" and "a/b/c/d""#), "{err}");
    }

    /// Paths the worker could not lay out are refused; those just inside
    /// the limits are not.
    #[test]
    fn source_paths_are_bounded() {
        let deepest = vec!["d"; MAX_SOURCE_DEPTH].join("/");
        let mut longest = format!("{}/", "p".repeat(MAX_FILE_NAME)).repeat(11);
        longest.push_str(&"q".repeat(MAX_SOURCE_PATH - longest.len() - 2));
        longest.push_str("/r");
        assert_eq!(sources(&[source(&deepest), source(&longest)]), Ok(()));
        assert!(sources(&[source(&format!("d/{deepest}"))]).unwrap_err().contains("257 levels deep"));
        let err = sources(&[source(&format!("{longest}x"))]).unwrap_err();
        assert!(err.contains("3073 bytes long; at most 3072"), "{err}");
        let err = sources(&[source(&"f".repeat(MAX_FILE_NAME + 1))]).unwrap_err();
        assert!(err.contains("a component of 256 bytes"), "{err}");
    }

    /// A job's commands and environment within the build file's limits
    /// pass; past them, the job is named and the limit said.
    #[test]
    fn commands_and_environments_have_the_build_files_limits() {
        let mut big = JobDef::new("big", drover_proto::Hash32([1; 32]));
        big.commands = vec!["x".repeat(MAX_COMMAND)];
        big.env.insert("V".into(), "v".repeat(MAX_COMMAND - 2));
        assert_eq!(job(&big), Ok(()));
        big.commands.push("y".repeat(MAX_COMMAND + 1));
        let err = job(&big).unwrap_err();
        assert!(err.starts_with(r#"job "big": command 2 is 127 KiB long"#), "{err}");
        big.commands.pop();
        big.env.insert("V".into(), "v".repeat(MAX_COMMAND - 1));
        let err = job(&big).unwrap_err();
        assert!(err.starts_with(r#"job "big": environment variable "V" is 127 KiB long"#), "{err}");
        big.env = (0..9).map(|i| (format!("V{i}"), "v".repeat(120 << 10))).collect();
        let err = job(&big).unwrap_err();
        assert!(err.starts_with(r#"job "big": its environment is 1081 KiB in all; at most 1 MiB"#), "{err}");
        big.env.clear();
        big.labels.insert(String::new(), "x".into());
        assert_eq!(job(&big).unwrap_err(), r#"job "big": a label name cannot be empty"#);
    }

    fn register(slots: u32, cpu_millis: u64, memory: u64) -> RegisterRequest {
        RegisterRequest {
            name: "w1".into(),
            url: "http://127.0.0.1:7701".into(),
            capacity: WorkerCapacity { slots, cpu_millis, memory, tokens: Default::default() },
            labels: Default::default(),
            artifacts: Vec::new(),
            running: Vec::new(),
        }
    }

    /// A machine's capacity up to what Linux and today's processors allow
    /// is taken; more, or no slot at all, is refused, with the bound.
    #[test]
    fn a_workers_capacity_is_what_a_machine_can_have() {
        assert_eq!(registration(&register(MAX_SLOTS, MAX_CPU_MILLIS, MAX_MEMORY)), Ok(()));
        let refused = |req: RegisterRequest| registration(&req).unwrap_err();
        assert_eq!(refused(register(0, 1000, 1 << 30)), "a worker needs at least one slot");
        assert!(refused(register(MAX_SLOTS + 1, 1000, 1 << 30)).contains("8193 slots; at most 8192"));
        assert!(refused(register(1, MAX_CPU_MILLIS + 1, 1 << 30)).contains("at most 8192000 ("));
        assert!(refused(register(1, 1000, MAX_MEMORY + 1)).contains("(4 PiB"));
        let mut empty_label = register(1, 1000, 1 << 30);
        empty_label.labels.insert(String::new(), "x".into());
        assert_eq!(refused(empty_label), "a label name cannot be empty");
    }
}
