//! The schema walk: turns a [`Node`] tree (from YAML or TOML) into a
//! [`BuildSpec`], reporting every unknown key, wrong type, missing key and bad
//! value as a diagnostic at its line, and carrying on past each one so that a
//! single run reports all of them. Cross-job rules (names, `needs`, cycles,
//! placeholders, sources) are checked later, on the spec.

use std::collections::BTreeMap;

use crate::error::{Diagnostics, shown};
use crate::node::{Entry, Kind, Node};
use crate::suggest::did_you_mean;
use crate::units;

/// The most jobs a build file may hold.
pub(crate) const MAX_JOBS: usize = 100_000;

const BUILD_KEYS: &[&str] = &["name", "sources", "max_parallel", "queue", "jobs"];
const JOB_KEYS: &[&str] = &[
    "name",
    "run",
    "env",
    "needs",
    "inputs",
    "resources",
    "exclusive",
    "labels",
    "priority",
    "timeout",
    "retries",
    "retry_on_failure",
    "cache",
    "gang",
];
/// The most reruns `retry_on_failure` may ask for: a job that failed this
/// often is not flaky.
pub(crate) const MAX_RETRY_ON_FAILURE: u32 = 10;
const RESOURCE_KEYS: &[&str] = &["cpu", "memory", "tokens"];
const GANG_KEYS: &[&str] = &["name", "min_available", "on_failure"];

/// The longest command or `env` entry: Linux passes at most 128 KiB in one
/// argument or environment string (`MAX_ARG_STRLEN`), and placeholders
/// grow a command when they are filled in.
const MAX_COMMAND: usize = 126 * 1024;

/// The most `env` a job may set in all: Linux passes at most a quarter of
/// the stack limit (2 MiB by default) of arguments and environment
/// together, and a command and the worker's own variables need room too.
const MAX_ENV: usize = 1024 * 1024;

/// Default CPU request: one core.
const DEFAULT_CPU_MILLIS: u64 = 1000;
/// Default number of reruns after a worker loss.
pub(crate) const DEFAULT_RETRIES: u32 = 1;

/// A value with the line it was written on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Located<T> {
    pub(crate) value: T,
    pub(crate) line: usize,
}

/// The build file's top level, as written.
#[derive(Debug, Default)]
pub(crate) struct BuildSpec {
    pub(crate) name: Option<String>,
    pub(crate) sources: Vec<Located<String>>,
    pub(crate) max_parallel: Option<u32>,
    pub(crate) queue: Option<String>,
    pub(crate) jobs: Vec<JobSpec>,
}

/// One job, as written. Values that were invalid hold their defaults; the
/// diagnostics say what was wrong.
#[derive(Debug)]
pub(crate) struct JobSpec {
    /// Line where the job starts.
    pub(crate) line: usize,
    /// The job's name, if it has one that is a string (valid or not).
    pub(crate) name: Option<Located<String>>,
    pub(crate) commands: Vec<Located<String>>,
    pub(crate) env: Vec<(String, Located<String>)>,
    pub(crate) needs: Vec<Located<String>>,
    pub(crate) inputs: Option<Vec<Located<String>>>,
    pub(crate) cpu_millis: u64,
    pub(crate) memory: u64,
    pub(crate) tokens: BTreeMap<String, u64>,
    pub(crate) exclusive: Vec<Located<String>>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) priority: i32,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) retries: u32,
    pub(crate) retry_on_failure: u32,
    /// `cache: false`: the job runs in every build (see `id::JobKey`).
    pub(crate) cache: bool,
    pub(crate) gang: Option<GangSpec>,
}

/// A job's `gang:` as written.
#[derive(Debug, Clone)]
pub(crate) struct GangSpec {
    pub(crate) name: String,
    pub(crate) min_available: Option<u32>,
    pub(crate) restart: Option<bool>,
    pub(crate) line: usize,
}

impl JobSpec {
    /// The job's name, for diagnostics.
    pub(crate) fn label(&self) -> Option<&str> {
        self.name.as_ref().map(|name| name.value.as_str())
    }
}

/// Where diagnostics go, and which job they belong to.
struct Cx<'d> {
    diags: &'d mut Diagnostics,
    job: Option<String>,
}

impl Cx<'_> {
    fn error(&mut self, line: usize, message: impl Into<String>) {
        self.diags.push(Some(line), self.job.as_deref(), message);
    }

    fn wrong_type(&mut self, node: &Node, key: &str, expected: &str) {
        // YAML reads an unquoted `true`, `42` or `1.5` as a boolean or a
        // number: where text was meant, say how to write it.
        let written = match &node.kind {
            Kind::Bool(b) => Some(b.to_string()),
            Kind::Int(_, spelling) | Kind::Float(_, spelling) if !spelling.is_empty() => {
                Some(spelling.clone())
            }
            _ => None,
        };
        let hint = match written {
            Some(text) if expected.starts_with("a string") => format!(" (quote it to mean text: \"{text}\")"),
            _ => String::new(),
        };
        self.error(node.line, format!("{key:?} must be {expected}, found {}{hint}", node.kind.describe()));
    }

    /// The entries of a mapping, reporting duplicate keys; `None` (after a
    /// diagnostic) if `node` is not a mapping.
    fn map<'n>(&mut self, node: &'n Node, key: &str) -> Option<&'n [Entry]> {
        let Kind::Map(entries) = &node.kind else {
            self.wrong_type(node, key, "a mapping");
            return None;
        };
        let mut first: BTreeMap<&str, &Entry> = BTreeMap::new();
        for entry in entries {
            if let Some(first) = first.get(entry.key.as_str()) {
                self.error(
                    entry.key_line,
                    format!("duplicate key {:?} (first at line {})", shown(&entry.key), first.key_line),
                );
            } else {
                first.insert(&entry.key, entry);
            }
        }
        Some(entries)
    }

    /// Reports keys not in `known` and returns the first entry of each known key.
    fn fields<'n>(&mut self, entries: &'n [Entry], known: &[&str], within: &str) -> Fields<'n> {
        let mut found: Vec<&'n Entry> = Vec::new();
        for entry in entries {
            if known.contains(&entry.key.as_str()) {
                if !found.iter().any(|e| e.key == entry.key) {
                    found.push(entry);
                }
            } else {
                let hint = match did_you_mean(&entry.key, known.iter().copied()) {
                    hint if !hint.is_empty() => hint,
                    _ => format!(" (expected one of: {})", known.join(", ")),
                };
                self.error(entry.key_line, format!("unknown key {:?}{within}{hint}", shown(&entry.key)));
            }
        }
        Fields(found)
    }

    fn string(&mut self, node: &Node, key: &str) -> Option<String> {
        match &node.kind {
            Kind::Str(s) => Some(s.clone()),
            _ => {
                self.wrong_type(node, key, "a string");
                None
            }
        }
    }

    /// A list of strings, each with its line.
    fn strings(&mut self, node: &Node, key: &str) -> Vec<Located<String>> {
        let Kind::Seq(items) = &node.kind else {
            self.wrong_type(node, key, "a list of strings");
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| match &item.kind {
                Kind::Str(s) => Some(Located { value: s.clone(), line: item.line }),
                _ => {
                    self.wrong_type(item, &format!("{key} entry"), "a string");
                    None
                }
            })
            .collect()
    }

    /// A scalar as text: strings as they are, numbers as written, booleans
    /// as `true`/`false`.
    fn text(&mut self, node: &Node, key: &str) -> Option<String> {
        match &node.kind {
            Kind::Str(s) => Some(s.clone()),
            Kind::Int(_, spelling) | Kind::Float(_, spelling) => Some(spelling.clone()),
            Kind::Bool(b) => Some(b.to_string()),
            _ => {
                self.wrong_type(node, key, "a string, number or boolean");
                None
            }
        }
    }

    /// An integer from `min` to `max`, converted to `T`.
    fn int<T: TryFrom<i128>>(&mut self, node: &Node, key: &str, min: i128, max: i128) -> Option<T> {
        let (value, spelling) = match &node.kind {
            Kind::Int(value, spelling) => (value, spelling),
            // Digits the YAML parser could not hold in 64 bits come as a
            // float: say what range they missed, as for any other integer.
            Kind::Float(_, spelling)
                if !spelling.is_empty()
                    && spelling.trim_start_matches(['-', '+']).chars().all(|c| c.is_ascii_digit()) =>
            {
                self.error(
                    node.line,
                    format!("{key:?} must be an integer from {min} to {max}, got {spelling}"),
                );
                return None;
            }
            _ => {
                self.wrong_type(node, key, "an integer");
                return None;
            }
        };
        let converted = if (min..=max).contains(value) { T::try_from(*value).ok() } else { None };
        if converted.is_none() {
            self.error(node.line, format!("{key:?} must be an integer from {min} to {max}, got {spelling}"));
        }
        converted
    }
}

/// The known keys found in a mapping.
struct Fields<'n>(Vec<&'n Entry>);

impl<'n> Fields<'n> {
    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entry(key).map(|e| &e.value)
    }

    fn entry(&self, key: &str) -> Option<&'n Entry> {
        self.0.iter().find(|e| e.key == key).copied()
    }
}

/// Walks the document `root`.
pub(crate) fn build_spec(root: &Node, diags: &mut Diagnostics) -> BuildSpec {
    let mut cx = Cx { diags, job: None };
    let mut spec = BuildSpec::default();
    if root.kind == Kind::Null {
        cx.error(root.line, "build file is empty");
        return spec;
    }
    let Kind::Map(_) = &root.kind else {
        cx.error(
            root.line,
            format!(
                "build file must be a mapping (of `jobs:` and the like), found {}; a file named *.toml is read \
                 as TOML, any other as YAML",
                root.kind.describe()
            ),
        );
        return spec;
    };
    let Some(entries) = cx.map(root, "build file") else {
        return spec;
    };
    let fields = cx.fields(entries, BUILD_KEYS, "");
    if let Some(node) = fields.get("name") {
        spec.name = cx.string(node, "name");
        if spec.name.as_deref().is_some_and(|name| name.trim().is_empty()) {
            cx.error(node.line, "\"name\" must not be empty");
        }
    }
    if let Some(node) = fields.get("sources") {
        spec.sources = cx.strings(node, "sources");
    }
    if let Some(node) = fields.get("max_parallel") {
        spec.max_parallel = cx.int(node, "max_parallel", 1, u32::MAX.into());
    }
    if let Some(node) = fields.get("queue") {
        spec.queue = cx.string(node, "queue");
        if spec.queue.as_deref().is_some_and(|q| q.trim().is_empty()) {
            cx.error(node.line, "\"queue\" must not be empty");
        }
    }
    match fields.entry("jobs") {
        None => cx.error(root.line, "missing \"jobs\""),
        Some(Entry { value: node, key_line, .. }) => match &node.kind {
            Kind::Seq(items) if items.is_empty() => cx.error(*key_line, "\"jobs\" is empty"),
            Kind::Seq(items) if items.len() > MAX_JOBS => cx
                .error(*key_line, format!("too many jobs: {} (at most {MAX_JOBS} are allowed)", items.len())),
            Kind::Seq(items) => {
                spec.jobs = items.iter().filter_map(|item| job_spec(item, cx.diags)).collect()
            }
            _ => cx.wrong_type(node, "jobs", "a list of jobs"),
        },
    }
    spec
}

fn job_spec(node: &Node, diags: &mut Diagnostics) -> Option<JobSpec> {
    let mut cx = Cx { diags, job: None };
    let Kind::Map(entries) = &node.kind else {
        cx.error(node.line, format!("a job must be a mapping, found {}", node.kind.describe()));
        return None;
    };
    // The name first, so that every other diagnostic can name the job.
    let name = entries.iter().find(|e| e.key == "name").and_then(|e| match &e.value.kind {
        Kind::Str(s) => Some(Located { value: s.clone(), line: e.value.line }),
        _ => None,
    });
    cx.job = name.as_ref().map(|n| n.value.clone());
    let entries = cx.map(node, "job")?;
    let fields = cx.fields(entries, JOB_KEYS, " in job");
    let mut job = JobSpec {
        line: node.line,
        name,
        commands: Vec::new(),
        env: Vec::new(),
        needs: Vec::new(),
        inputs: None,
        cpu_millis: DEFAULT_CPU_MILLIS,
        memory: 0,
        tokens: BTreeMap::new(),
        exclusive: Vec::new(),
        labels: BTreeMap::new(),
        priority: 0,
        timeout_ms: None,
        retries: DEFAULT_RETRIES,
        retry_on_failure: 0,
        cache: true,
        gang: None,
    };

    match fields.get("name") {
        None => cx.error(node.line, "job has no \"name\""),
        Some(value) => match &job.name {
            None => cx.wrong_type(value, "name", "a string"),
            Some(name) => {
                if let Err(message) = check_job_name(&name.value) {
                    cx.error(name.line, message);
                }
            }
        },
    }

    match fields.get("run") {
        None => cx.error(node.line, "job has no \"run\""),
        Some(value) => job.commands = commands(&mut cx, value),
    }

    if let Some(value) = fields.get("env")
        && let Some(entries) = cx.map(value, "env")
    {
        for entry in entries {
            if let Err(message) = check_env_name(&entry.key) {
                cx.error(entry.key_line, message);
            }
            if let Some(text) = cx.text(&entry.value, &format!("env.{}", entry.key)) {
                if text.contains('\0') {
                    cx.error(entry.value.line, format!("env {:?} contains a NUL character", entry.key));
                } else if entry.key.len() + 1 + text.len() > MAX_COMMAND {
                    cx.error(
                        entry.value.line,
                        format!("env {:?} is too long: at most 126 KiB can be passed to a job", entry.key),
                    );
                }
                job.env.push((entry.key.clone(), Located { value: text, line: entry.value.line }));
            }
        }
        let total: usize = job.env.iter().map(|(key, text)| key.len() + text.value.len() + 2).sum();
        if total > MAX_ENV {
            cx.error(
                value.line,
                format!(
                    "env is {} KiB in all: at most 1 MiB of environment can be passed to a job \
                     (Linux limits a command's arguments and environment together to 2 MiB)",
                    total.div_ceil(1024)
                ),
            );
        }
    }

    if let Some(value) = fields.get("needs") {
        job.needs = cx.strings(value, "needs");
    }
    if let Some(value) = fields.get("inputs") {
        job.inputs = Some(cx.strings(value, "inputs"));
    }

    if let Some(value) = fields.get("resources")
        && let Some(entries) = cx.map(value, "resources")
    {
        resources(&mut cx, entries, &mut job);
    }

    if let Some(value) = fields.get("exclusive") {
        job.exclusive = cx.strings(value, "exclusive");
        let mut listed = std::collections::BTreeSet::new();
        for token in &job.exclusive {
            if !listed.insert(token.value.as_str()) {
                cx.error(token.line, format!("exclusive token {:?} is listed twice", token.value));
            } else if !job.tokens.contains_key(&token.value) {
                cx.error(
                    token.line,
                    format!(
                        "exclusive token {:?} is not in resources.tokens (add `tokens: {{{}: 1}}`)",
                        token.value, token.value
                    ),
                );
            }
        }
    }

    if let Some(value) = fields.get("labels")
        && let Some(entries) = cx.map(value, "labels")
    {
        for entry in entries {
            if entry.key.is_empty() {
                cx.error(entry.key_line, "label names must not be empty");
            }
            if let Some(text) = cx.text(&entry.value, &format!("labels.{}", entry.key)) {
                job.labels.entry(entry.key.clone()).or_insert(text);
            }
        }
    }

    if let Some(value) = fields.get("priority") {
        job.priority = cx.int(value, "priority", i32::MIN.into(), i32::MAX.into()).unwrap_or(0);
    }
    if let Some(value) = fields.get("timeout") {
        let text = match &value.kind {
            Kind::Str(s) => Some(s.clone()),
            Kind::Int(_, spelling) | Kind::Float(_, spelling) => Some(spelling.clone()),
            _ => {
                cx.wrong_type(value, "timeout", "a duration such as \"30s\" or \"10m\"");
                None
            }
        };
        if let Some(text) = text {
            match units::parse_duration(&text) {
                Ok(ms) => job.timeout_ms = Some(ms),
                Err(message) => cx.error(value.line, message),
            }
        }
    }
    if let Some(value) = fields.get("retries") {
        job.retries = cx.int(value, "retries", 0, u32::MAX.into()).unwrap_or(DEFAULT_RETRIES);
    }
    if let Some(value) = fields.get("retry_on_failure") {
        job.retry_on_failure = cx.int(value, "retry_on_failure", 0, MAX_RETRY_ON_FAILURE.into()).unwrap_or(0);
    }
    if let Some(value) = fields.get("cache") {
        match value.kind {
            Kind::Bool(cache) => job.cache = cache,
            _ => cx.wrong_type(value, "cache", "true or false"),
        }
    }
    if let Some(value) = fields.get("gang")
        && let Some(entries) = cx.map(value, "gang")
    {
        job.gang = gang(&mut cx, entries, value.line);
        if job.gang.is_some() && job.retry_on_failure > 0 {
            cx.error(
                value.line,
                "a gang member has no \"retry_on_failure\": its gang's \"on_failure: restart\" runs the whole gang again",
            );
        }
    }
    Some(job)
}

/// `gang: {name: shards, min_available: 4, on_failure: fail|restart}`.
fn gang(cx: &mut Cx<'_>, entries: &[Entry], line: usize) -> Option<GangSpec> {
    let fields = cx.fields(entries, GANG_KEYS, " in gang");
    let name = match fields.get("name") {
        None => {
            cx.error(line, "\"gang\" needs a \"name\"");
            None
        }
        Some(node) => cx.string(node, "gang.name").filter(|name| {
            let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !ok {
                cx.error(node.line, format!("gang name {name:?} must be letters, digits, '.', '_' or '-'"));
            }
            ok
        }),
    };
    let min_available =
        fields.get("min_available").and_then(|node| cx.int(node, "gang.min_available", 1, u32::MAX.into()));
    let restart =
        fields.get("on_failure").and_then(|node| match cx.string(node, "gang.on_failure")?.as_str() {
            "fail" => Some(false),
            "restart" => Some(true),
            other => {
                cx.error(
                    node.line,
                    format!("gang.on_failure must be \"fail\" or \"restart\", not {other:?}"),
                );
                None
            }
        });
    Some(GangSpec { name: name?, min_available, restart, line })
}

/// `run`: a string or a non-empty list of strings, none of them empty.
fn commands(cx: &mut Cx<'_>, node: &Node) -> Vec<Located<String>> {
    let commands = match &node.kind {
        Kind::Str(s) => vec![Located { value: s.clone(), line: node.line }],
        Kind::Seq(items) if items.is_empty() => {
            cx.error(node.line, "\"run\" must list at least one command");
            return Vec::new();
        }
        Kind::Seq(_) => cx.strings(node, "run"),
        _ => {
            cx.wrong_type(node, "run", "a string or a list of strings");
            return Vec::new();
        }
    };
    for command in &commands {
        if command.value.trim().is_empty() {
            cx.error(command.line, "empty command in \"run\"");
        } else if command.value.contains('\0') {
            cx.error(command.line, "command contains a NUL character");
        } else if command.value.len() > MAX_COMMAND {
            cx.error(
                command.line,
                format!(
                    "command is {} KiB long: at most 126 KiB can be run (Linux's limit for one \
                     argument is 128 KiB); put it in a script among the sources and run that",
                    command.value.len().div_ceil(1024)
                ),
            );
        }
    }
    commands
}

fn resources(cx: &mut Cx<'_>, entries: &[Entry], job: &mut JobSpec) {
    let fields = cx.fields(entries, RESOURCE_KEYS, " in resources");
    if let Some(node) = fields.get("cpu") {
        let parsed = match &node.kind {
            Kind::Int(_, spelling) | Kind::Float(_, spelling) => Some(units::parse_cpu_number(spelling)),
            Kind::Str(s) => Some(units::parse_cpu_str(s)),
            _ => {
                cx.wrong_type(node, "resources.cpu", "a number of cores (1, 0.5) or millicores (\"500m\")");
                None
            }
        };
        match parsed {
            Some(Ok(millis)) => job.cpu_millis = millis,
            Some(Err(message)) => cx.error(node.line, message),
            None => {}
        }
    }
    if let Some(node) = fields.get("memory") {
        let parsed = match &node.kind {
            // As written, like `cpu`: `0x10` or `1_000` is refused rather
            // than read as YAML's integer.
            Kind::Int(_, spelling) | Kind::Float(_, spelling) => Some(units::parse_size(spelling)),
            Kind::Str(s) => Some(units::parse_size(s)),
            _ => {
                cx.wrong_type(node, "resources.memory", "a size such as 1024, \"512Mi\" or \"2G\"");
                None
            }
        };
        match parsed {
            Some(Ok(bytes)) => job.memory = bytes,
            Some(Err(message)) => cx.error(node.line, message),
            None => {}
        }
    }
    if let Some(node) = fields.get("tokens")
        && let Some(entries) = cx.map(node, "resources.tokens")
    {
        for entry in entries {
            if entry.key.is_empty() {
                cx.error(entry.key_line, "token names must not be empty");
            }
            if let Some(count) =
                cx.int(&entry.value, &format!("resources.tokens.{}", entry.key), 0, u64::MAX.into())
            {
                job.tokens.entry(entry.key.clone()).or_insert(count);
            }
        }
    }
}

/// `[A-Za-z0-9._-]+`, and not `.` or `..` (names become directory names).
fn check_job_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("job name must not be empty".to_owned());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!(
            "invalid job name {name:?}: {bad:?} is not allowed (use letters, digits, '.', '_' and '-')"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("invalid job name {name:?}"));
    }
    Ok(())
}

/// Environment variable names: non-empty, without `=` or NUL.
fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        Err("environment variable names must not be empty".to_owned())
    } else if name.contains(['=', '\0']) {
        Err(format!("invalid environment variable name {name:?}"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names() {
        assert!(check_job_name("compile-a.1_x").is_ok());
        assert!(check_job_name("a b").unwrap_err().contains("' ' is not allowed"));
        assert!(check_job_name("").is_err());
        assert!(check_job_name("..").is_err());
        assert!(check_job_name("é").is_err());
    }

    #[test]
    fn env_names() {
        assert!(check_env_name("CFLAGS").is_ok());
        assert!(check_env_name("A=B").is_err());
        assert!(check_env_name("").is_err());
    }
}
