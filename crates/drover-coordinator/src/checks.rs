//! Checks on the free text of requests, made by the API before the state
//! thread sees them: names that reach other clients' terminals (build,
//! tenant, queue and worker names, labels), a worker's URL (which the
//! coordinator fetches from, with its token), and the environment a job's
//! commands get. A request that fails one is refused with 400 and never
//! reaches the log.
//!
//! These live here rather than in the solver, which checks what a build
//! means (names of jobs, needs, gangs): a log written before a check was
//! added must still replay the same.

use drover_proto::{RegisterRequest, SubmitRequest};

/// Longest name of a build, tenant, queue, worker, label or token.
const MAX_NAME: usize = 256;
/// Longest worker URL.
const MAX_URL: usize = 2048;
/// Most labels and named tokens a worker may advertise.
const MAX_LABELS: usize = 256;

/// A name shown to users: at most [`MAX_NAME`] bytes, no control
/// characters (escape sequences in a name would reach the terminals of
/// `drover status` and `drover workers`).
fn name(what: &str, text: &str) -> Result<(), String> {
    if text.len() > MAX_NAME {
        return Err(format!("{what} is {} bytes long; at most {MAX_NAME}", text.len()));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!("{what} {:?} contains the control character {c:?}", truncated(text)));
    }
    Ok(())
}

/// The start of `text`, for messages.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A worker's registration: its name, URL, labels and tokens.
pub(crate) fn registration(req: &RegisterRequest) -> Result<(), String> {
    if req.name.is_empty() {
        return Err("a worker name cannot be empty".into());
    }
    name("the worker name", &req.name)?;
    worker_url(&req.url)?;
    if req.labels.len() > MAX_LABELS || req.capacity.tokens.len() > MAX_LABELS {
        return Err(format!("a worker advertises at most {MAX_LABELS} labels and {MAX_LABELS} named tokens"));
    }
    for (key, value) in &req.labels {
        name("a label name", key)?;
        name(&format!("the value of label {key}"), value)?;
    }
    for token in req.capacity.tokens.keys() {
        name("a token name", token)?;
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

/// A submission's names and its jobs' environments.
pub(crate) fn submission(req: &SubmitRequest) -> Result<(), String> {
    name("the build name", &req.build.name)?;
    name("the tenant", &req.tenant)?;
    if let Some(queue) = &req.queue {
        name("the queue name", queue)?;
    }
    for job in &req.build.jobs {
        for key in job.env.keys() {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(format!(
                    "job {:?}: environment variable name {:?} is empty or contains '=' or NUL",
                    job.name,
                    truncated(key)
                ));
            }
        }
        if let Some((key, _)) = job.env.iter().find(|(_, value)| value.contains('\0')) {
            return Err(format!("job {:?}: the value of environment variable {key} contains NUL", job.name));
        }
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
}
