//! The coordinator's shared cache: workers push new outputs there, and a
//! fresh worker serves a job from it as `cached` without running it.

use std::path::Path;

use serde_json::Value;

use crate::harness::{Cluster, eventually, http, job};

fn build_file(cluster: &Cluster, counter: &str) -> std::path::PathBuf {
    cluster.project(
        "shared",
        &format!("jobs:\n  - name: a\n    run: \"echo x >> {counter}; echo hello > {{{{out}}}}/greeting\"\n"),
        &[],
    )
}

fn wait_json(cluster: &Cluster, file: &Path, out: &Path) -> Value {
    crate::harness::wait_json(cluster, file, &["--out", out.to_str().expect("utf-8")]).1
}

/// Kills a worker and waits until the coordinator has declared it lost (so
/// nothing it held counts any more).
fn lose(cluster: &mut Cluster, name: &str) {
    cluster.kill_worker(name);
    eventually("the worker to be declared lost", || {
        let workers = cluster.workers_json();
        workers.as_array()?.iter().any(|w| w["name"] == name && w["alive"] == false).then_some(())
    });
}

fn runs(counter: &str) -> usize {
    std::fs::read_to_string(counter).map(|t| t.lines().count()).unwrap_or(0)
}

#[test]
fn a_fresh_worker_serves_a_job_from_the_shared_cache_without_running_it() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let counter = cluster.scratch("runs");
    let file = build_file(&cluster, &counter);
    let first = wait_json(&cluster, &file, &cluster.dir.path().join("out1"));
    assert_eq!(first["state"], "succeeded", "{first}");
    assert_eq!(runs(&counter), 1);
    let id = job(&first, "a")["id"].as_str().expect("job id").to_owned();
    let cached = eventually("the output in the shared cache", || {
        let (status, body) = http(&cluster.url, "GET", &format!("/v1/cache/{id}"), b"");
        (status == 200 && !body.is_empty()).then_some(body)
    });

    // Two pushes of the same output at once both succeed.
    let pushes: Vec<_> = (0..2)
        .map(|_| {
            let (url, body, path) = (cluster.url.clone(), cached.clone(), format!("/v1/cache/{id}"));
            std::thread::spawn(move || http(&url, "PUT", &path, &body).0)
        })
        .collect();
    for push in pushes {
        assert_eq!(push.join().expect("push"), 201);
    }

    // The worker that built it is gone; a fresh one gets the job and
    // serves it from the shared cache.
    lose(&mut cluster, "w1");
    cluster.add_worker("w2", 1, &[]);
    let out = cluster.dir.path().join("out2");
    let second = wait_json(&cluster, &file, &out);
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(job(&second, "a")["state"], "cached", "{second}");
    assert_eq!(job(&second, "a")["worker"], "w2", "pulled by the fresh worker: {second}");
    assert_eq!(job(&second, "a")["exit_code"], 0, "a cached job exits 0, wherever it was found: {second}");
    assert!(job(&second, "a")["stages"]["pull"].is_u64(), "the pull stage is timed: {second}");
    assert!(job(&first, "a")["stages"]["build"].is_u64(), "the build stage is timed: {first}");
    assert!(job(&first, "a")["stages"]["fetch"].is_u64(), "the fetch stage is timed: {first}");
    assert_eq!(runs(&counter), 1, "it did not run again");
    assert_eq!(std::fs::read_to_string(out.join("a/greeting")).expect("exported"), "hello\n");
}

#[test]
fn a_damaged_output_in_the_shared_cache_is_dropped_and_the_job_runs() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    let counter = cluster.scratch("runs");
    let file = build_file(&cluster, &counter);
    let first = wait_json(&cluster, &file, &cluster.dir.path().join("out1"));
    let id = job(&first, "a")["id"].as_str().expect("job id").to_owned();
    eventually("the output in the shared cache", || {
        (http(&cluster.url, "GET", &format!("/v1/cache/{id}"), b"").0 == 200).then_some(())
    });
    // Damage the stored file.
    let stored = find(&cluster.dir.path().join("coordinator/cache"), "greeting").expect("stored output file");
    let mut perms = std::fs::metadata(&stored).expect("stat").permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&stored, perms).expect("chmod");
    std::fs::write(&stored, "tampered\n").expect("damage");

    lose(&mut cluster, "w1");
    cluster.add_worker("w2", 1, &[]);
    let out = cluster.dir.path().join("out2");
    let second = wait_json(&cluster, &file, &out);
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(job(&second, "a")["state"], "succeeded", "run again, not served damaged: {second}");
    assert_eq!(runs(&counter), 2);
    assert_eq!(std::fs::read_to_string(out.join("a/greeting")).expect("exported"), "hello\n");
}

fn find(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

/// Early cutoff through real processes: a job whose input changed but
/// whose output did not (a comment edited) leaves its dependent (which
/// sees no sources itself, `inputs: []`) cached,
/// not run again; a new job after the dependent reads its earlier output,
/// and `--out` exports an output that is an earlier job's.
#[test]
fn a_dependency_with_the_same_output_runs_none_of_its_dependents() {
    let mut cluster = Cluster::new();
    cluster.add_worker("w1", 1, &[]);
    cluster.add_worker("w2", 1, &[]);
    let counter = cluster.scratch("runs");
    let project = |comment: &str, extra: &str| {
        let build = format!(
            "sources: [data.txt]\njobs:\n  - name: gen\n    run: [\"grep -v '^#' {{{{src}}}}/data.txt > {{{{out}}}}/data\"]\n  \
             - name: use\n    needs: [gen]\n    inputs: []\n    run: [\"echo use >> {counter}; tr a-z A-Z < {{{{dep:gen}}}}/data > {{{{out}}}}/upper\"]\n{extra}"
        );
        cluster.project("cutoff", &build, &[("data.txt", &format!("# {comment}\nhello\n"))])
    };
    let first = wait_json(&cluster, &project("one", ""), &cluster.dir.path().join("out1"));
    assert_eq!(first["state"], "succeeded", "{first}");
    assert_eq!(runs(&counter), 1);

    let pkg = "  - name: pkg\n    needs: [use]\n    inputs: []\n    run: [\"cat {{dep:use}}/upper > {{out}}/pkg\"]\n";
    let out = cluster.dir.path().join("out2");
    let second = wait_json(&cluster, &project("two", pkg), &out);
    assert_eq!(second["state"], "succeeded", "{second}");
    assert_eq!(job(&second, "gen")["state"], "succeeded", "gen's input changed: it ran");
    assert_eq!(job(&second, "use")["state"], "cached", "{second}");
    assert_eq!(runs(&counter), 1, "use did not run again");
    assert_eq!(std::fs::read_to_string(out.join("pkg").join("pkg")).expect("pkg's output"), "HELLO\n");
    let status = cluster.status(second["id"].as_u64().expect("ID"));
    assert!(job(&status, "use")["detail"].as_str().is_some_and(|d| d.contains("early cutoff")), "{status}");

    let out = cluster.dir.path().join("out3");
    let third = wait_json(&cluster, &project("three", ""), &out);
    assert_eq!(job(&third, "use")["state"], "cached", "{third}");
    assert_eq!(std::fs::read_to_string(out.join("use").join("upper")).expect("use's output"), "HELLO\n");
    assert_eq!(runs(&counter), 1);
}

/// A dependency's output larger than the consuming worker's whole cache
/// sends the consumer back to the queue as the worker's fault (another
/// worker may run it); pinned to that worker, it fails saying so. The
/// dependency is not built again: its output is not lost, it only does not
/// fit there.
#[test]
fn an_input_larger_than_the_workers_cache_fails_without_rebuilds() {
    let mut cluster = Cluster::new();
    cluster.add_worker("big", 1, &["--labels", "size=big", "--no-push"]);
    cluster.add_worker("small", 1, &["--labels", "size=small", "--cache-size", "64Ki", "--no-push"]);
    let counter = cluster.scratch("produced");
    let build = format!(
        "jobs:\n  - name: produce\n    labels: {{size: big}}\n    run: \"echo x >> {counter}; head -c 300000 \
         /dev/zero > {{{{out}}}}/blob\"\n  - name: consume\n    needs: [produce]\n    labels: {{size: small}}\n    \
         run: \"wc -c {{{{dep:produce}}}}/blob\"\n"
    );
    let file = cluster.project("too-large", &build, &[]);
    let (code, status) = crate::harness::wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(1), "{status}");
    let consume = job(&status, "consume");
    assert_eq!(consume["state"], "failed", "{status}");
    let detail = consume["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("larger than this worker's whole cache"), "{status}");
    assert_eq!(job(&status, "produce")["attempts"], 1, "{status}");
    assert_eq!(runs(&counter), 1, "produce ran once");
}

/// Whether the coordinator still takes the worker `name` as alive.
fn alive(cluster: &Cluster, name: &str) -> bool {
    let workers = cluster.workers_json();
    workers.as_array().is_some_and(|all| all.iter().any(|w| w["name"] == name && w["alive"] == true))
}

/// A holder whose process is gone (nothing listens at its address) is taken
/// as lost as soon as a client or a worker fails to reach it, not when its
/// lease runs out (two minutes here): `--out` says the output was lost and
/// the next build builds it again; a worker fetching an input from it gets
/// the input built again at once.
#[test]
fn a_holder_that_refuses_connections_is_taken_as_lost_at_once() {
    let mut cluster = Cluster::with_config(None, "[scheduler]\nlease_timeout = \"120s\"\n");
    cluster.add_worker("w1", 1, &["--no-push"]);
    let one = cluster.project("one", "jobs:\n  - name: a\n    run: \"echo a > {{out}}/a\"\n", &[]);
    let out = cluster.dir.path().join("out");
    let out_arg = ["--out", out.to_str().expect("utf-8")];
    let (code, status) = crate::harness::wait_json(&cluster, &one, &[]);
    assert_eq!(code, Some(0), "{status}");
    // A worker reported unreachable while it listens stays.
    let url = cluster.workers_json()[0]["url"].as_str().expect("w1's URL").to_owned();
    let body = format!("{{\"url\":\"{url}\"}}");
    let json = "Content-Type: application/json\r\n";
    let ((code, reply), _) =
        crate::harness::http_with(&cluster.url, "POST", "/v1/workers/unreachable", json, body.as_bytes());
    assert_eq!((code, String::from_utf8_lossy(&reply).contains("\"lost\":false")), (200, true));
    assert!(alive(&cluster, "w1"));
    cluster.add_worker("w2", 1, &["--no-push"]);
    cluster.kill_worker("w1");
    let (exported, status) = crate::harness::wait_output(&cluster, &one, &out_arg);
    assert_eq!(exported.status.code(), Some(1), "{status}");
    let said = String::from_utf8_lossy(&exported.stderr);
    assert!(said.contains("The output was lost with its worker"), "{said}");
    assert_eq!(job(&status, "a")["state"], "cached", "the status is printed all the same: {status}");
    assert!(!alive(&cluster, "w1"), "w1 is taken as lost");
    let (code, status) = crate::harness::wait_json(&cluster, &one, &out_arg);
    assert_eq!((code, &job(&status, "a")["state"]), (Some(0), &Value::from("succeeded")), "{status}");
    assert_eq!(std::fs::read_to_string(out.join("a/a")).expect("exported"), "a\n");

    // A worker fetching an input from a holder that is gone (the consumer
    // is pinned to it: otherwise it would wait for the holder, as jobs wait
    // for the workers that hold their inputs, until the lease ran out).
    let chain = |consumer: &str, labels: &str| {
        format!(
            "jobs:\n  - name: p\n    run: \"echo p > {{{{out}}}}/p\"\n  - name: c\n    needs: [p]\n    run: \"{consumer} \
             {{{{dep:p}}}}/p > {{{{out}}}}/c\"\n    labels: {{{labels}}}\n"
        )
    };
    let file = cluster.project("chain", &chain("cat", ""), &[]);
    let (code, status) = crate::harness::wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    cluster.add_worker("w3", 1, &["--no-push", "--labels", "at=w3"]);
    cluster.kill_worker("w2");
    let file = cluster.project("chain", &chain("wc -c <", "at: w3"), &[]);
    let (code, status) = crate::harness::wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    assert_eq!(job(&status, "p")["state"], "succeeded", "p was built again: {status}");
    assert!(!alive(&cluster, "w2"), "w2 is taken as lost");
}

/// A job sent to a worker whose process is gone (the holder of its input,
/// so placement prefers it) does not wait out the lease (two minutes
/// here): its mail waits untaken, the coordinator finds nothing listening
/// at the worker's address, and takes it as lost.
#[test]
fn mail_left_untaken_by_a_dead_worker_gets_it_taken_as_lost() {
    let mut cluster = Cluster::with_config(None, "[scheduler]\nlease_timeout = \"120s\"\n");
    cluster.add_worker("w1", 1, &["--no-push"]);
    cluster.add_worker("w2", 1, &["--no-push", "--labels", "at=w2"]);
    let first = "jobs:\n  - name: p\n    labels: {at: w2}\n    run: \"echo p > {{out}}/p\"\n";
    let file = cluster.project("dead", first, &[]);
    let (code, status) = crate::harness::wait_json(&cluster, &file, &[]);
    assert_eq!(code, Some(0), "{status}");
    cluster.kill_worker("w2");
    // p as before (its output only on w2), and r, which reads it.
    let second = "jobs:\n  - name: p\n    labels: {at: w2}\n    run: \"echo p > {{out}}/p\"\n  - name: r\n    needs: [p]\n    run: \"cat {{dep:p}}/p > {{out}}/r\"\n";
    let file = cluster.project("dead", second, &[]);
    let id = cluster.submit(&file);
    eventually("w2 to be taken as lost", || (!alive(&cluster, "w2")).then_some(()));
    let status = cluster.status(id);
    assert_ne!(status["state"], "succeeded", "p can only run on w2: {status}");
}
