//! A cluster of real `drover` processes for a test, torn down on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `drover` binary under test.
pub(crate) fn drover() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_drover"));
    cmd.env_remove("DROVER_COORDINATOR")
        .env_remove("DROVER_TOKEN")
        .env_remove("DROVER_WORKER_TOKEN")
        .env_remove("DROVER_LOG");
    cmd
}

/// Waits for `condition`, polling, until `what` times out (a failure).
pub(crate) fn eventually<T>(what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A coordinator and workers, each a child process.
pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) url: String,
    port: u16,
    coordinator: Option<Child>,
    workers: Vec<(String, Child)>,
    token: Option<String>,
    /// The workers' own token, if they have one (`--worker-token`).
    worker_token: Option<String>,
    /// The coordinator's standard error after its "listening" line.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Scheduler settings that make losses quick to notice in tests.
const CONFIG: &str = "[scheduler]\nlease_timeout = \"1500ms\"\n";

impl Cluster {
    /// A coordinator alone.
    pub(crate) fn new() -> Cluster {
        Cluster::with_token(None)
    }

    /// A coordinator that requires `token`, if given.
    pub(crate) fn with_token(token: Option<&str>) -> Cluster {
        Cluster::configured(token, "")
    }

    /// A coordinator that requires `token` from clients and `workers` from
    /// workers.
    pub(crate) fn with_tokens(token: &str, workers: &str) -> Cluster {
        Cluster::start(Some(token), Some(workers), CONFIG)
    }

    /// A coordinator whose config file has `extra` after the test settings.
    pub(crate) fn configured(token: Option<&str>, extra: &str) -> Cluster {
        Cluster::with_config(token, &format!("{CONFIG}{extra}"))
    }

    /// A coordinator with this whole config file.
    pub(crate) fn with_config(token: Option<&str>, config: &str) -> Cluster {
        Cluster::start(token, None, config)
    }

    fn start(token: Option<&str>, worker_token: Option<&str>, config: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.toml"), config).expect("config");
        let mut cluster = Cluster {
            dir,
            url: String::new(),
            port: 0,
            coordinator: None,
            workers: Vec::new(),
            token: token.map(str::to_owned),
            worker_token: worker_token.map(str::to_owned),
            log: Default::default(),
        };
        cluster.start_coordinator();
        cluster
    }

    /// Starts the coordinator (again, on the same port and data after the
    /// first time).
    pub(crate) fn start_coordinator(&mut self) {
        let mut cmd = drover();
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data")
            .arg(self.dir.path().join("coordinator"))
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(token) = &self.token {
            cmd.env("DROVER_TOKEN", token);
        }
        if let Some(token) = &self.worker_token {
            cmd.env("DROVER_WORKER_TOKEN", token);
        }
        let mut child = cmd.spawn().expect("start drover serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines.next().expect("drover serve exited before listening").expect("read stderr");
            if let Some(url) = line.strip_prefix("drover coordinator listening on ") {
                break url.to_owned();
            }
        };
        // Keep draining its standard error so it never blocks on a full
        // pipe, keeping the lines for `coordinator_log`.
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                log.lock().expect("log").push(line);
            }
        });
        self.port = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        self.url = url;
        self.coordinator = Some(child);
    }

    /// The lines the coordinator logged so far (after it said where it
    /// listens).
    pub(crate) fn coordinator_log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    /// Kills the coordinator with SIGKILL.
    pub(crate) fn kill_coordinator(&mut self) {
        let mut child = self.coordinator.take().expect("coordinator running");
        child.kill().expect("kill coordinator");
        child.wait().expect("reap coordinator");
    }

    /// Starts a worker named `name` with `slots` and extra arguments, and
    /// waits until the coordinator sees it alive.
    pub(crate) fn add_worker(&mut self, name: &str, slots: u32, extra: &[&str]) {
        let mut cmd = drover();
        cmd.args(["worker", "--coordinator", &self.url, "--name", name, "--slots", &slots.to_string()])
            .arg("--cache")
            .arg(self.dir.path().join(name))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(token) = self.worker_token.as_ref().or(self.token.as_ref()) {
            cmd.env("DROVER_TOKEN", token);
        }
        let child = cmd.spawn().expect("start drover worker");
        self.workers.push((name.to_owned(), child));
        eventually(&format!("worker {name} to register"), || {
            let workers = self.workers_json();
            workers.as_array()?.iter().any(|w| w["name"] == name && w["alive"] == true).then_some(())
        });
    }

    /// Kills a worker with SIGKILL.
    pub(crate) fn kill_worker(&mut self, name: &str) {
        let i = self.workers.iter().position(|(n, _)| n == name).expect("worker exists");
        let (_, mut child) = self.workers.remove(i);
        child.kill().expect("kill worker");
        child.wait().expect("reap worker");
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to the coordinator's process.
    pub(crate) fn signal_coordinator(&self, signal: &str) {
        let child = self.coordinator.as_ref().expect("coordinator running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// The process ID of a worker.
    pub(crate) fn worker_pid(&self, name: &str) -> u32 {
        self.workers.iter().find(|(n, _)| n == name).expect("worker exists").1.id()
    }

    /// Sends a signal (`STOP`, `CONT`, ...) to a worker's process.
    pub(crate) fn signal_worker(&self, name: &str, signal: &str) {
        let (_, child) = self.workers.iter().find(|(n, _)| n == name).expect("worker exists");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for a worker's process to exit on its own; its exit status.
    pub(crate) fn worker_exit(&mut self, name: &str) -> std::process::ExitStatus {
        let i = self.workers.iter().position(|(n, _)| n == name).expect("worker exists");
        let status =
            eventually(&format!("worker {name} to exit"), || self.workers[i].1.try_wait().expect("wait"));
        self.workers.remove(i);
        status
    }

    /// A client command against this cluster.
    pub(crate) fn client(&self, args: &[&str]) -> Command {
        let mut cmd = drover();
        cmd.args(args).env("DROVER_COORDINATOR", &self.url).current_dir(self.dir.path());
        if let Some(token) = &self.token {
            cmd.env("DROVER_TOKEN", token);
        }
        cmd
    }

    /// Runs a client command to its end.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.client(args).output().expect("run drover")
    }

    pub(crate) fn workers_json(&self) -> Value {
        let out = self.run(&["workers", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// `drover status BUILD --json`.
    pub(crate) fn status(&self, build: u64) -> Value {
        let out = self.run(&["status", &build.to_string(), "--json"]);
        assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// The build's status once it is over (neither queued nor running).
    pub(crate) fn final_status(&self, build: u64) -> Value {
        eventually("the build to finish", || {
            let status = self.status(build);
            (status["state"] != "running" && status["state"] != "queued").then_some(status)
        })
    }

    /// Writes a build file (and sources) into a fresh directory; returns the
    /// build file's path.
    pub(crate) fn project(&self, name: &str, build: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = self.dir.path().join(name);
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write source");
        }
        std::fs::create_dir_all(&root).expect("mkdir");
        let file = root.join("drover.yaml");
        std::fs::write(&file, build).expect("write build file");
        file
    }

    /// `drover submit FILE`: the build's ID.
    pub(crate) fn submit(&self, file: &Path) -> u64 {
        let out = self.run(&["submit", file.to_str().expect("utf-8")]);
        assert!(out.status.success(), "submit failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("a build ID alone on stdout")
    }

    /// The path of a scratch file outside every sandbox.
    pub(crate) fn scratch(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().expect("utf-8").to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.workers {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(child) = &mut self.coordinator {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `drover submit FILE --wait --json EXTRA...`: the exit code and the final
/// status.
pub(crate) fn wait_json(cluster: &Cluster, file: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    let (out, status) = wait_output(cluster, file, extra);
    (out.status.code(), status)
}

/// [`wait_json`], with the whole output (the progress is on its standard
/// error).
pub(crate) fn wait_output(cluster: &Cluster, file: &Path, extra: &[&str]) -> (Output, Value) {
    let mut args = vec!["submit", file.to_str().expect("utf-8"), "--wait", "--json"];
    args.extend_from_slice(extra);
    let out = cluster.run(&args);
    let status = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no status JSON ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr)));
    (out, status)
}

/// `drover logs BUILD JOB --follow` (standard error discarded), with the
/// lines it prints on a channel: a broken follow fails a test at a
/// generous deadline ([`next_line`]) instead of hanging it.
pub(crate) fn follow_log(
    cluster: &Cluster,
    build: u64,
    job: &str,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut follow = cluster
        .client(&["logs", &build.to_string(), job, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("drover logs --follow");
    let stdout = follow.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.expect("read"));
        }
    });
    (follow, rx)
}

/// The next line of a [`follow_log`], if one comes within a minute.
pub(crate) fn next_line(lines: &std::sync::mpsc::Receiver<String>) -> Option<String> {
    lines.recv_timeout(Duration::from_secs(60)).ok()
}

/// The job named `name` in a status document.
pub(crate) fn job<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["jobs"].as_array().expect("jobs").iter().find(|j| j["name"] == name).expect("job in status")
}

/// Whether a process is gone (or a zombie waiting to be reaped).
pub(crate) fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A TCP relay on loopback to port `to` that cuts its first connection
/// (closed before reading a byte) and relays every later one: a peer that
/// fails once, for a reason that may pass. Its threads live as long as the
/// test process.
pub(crate) struct CutOnce {
    pub(crate) port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CutOnce {
    pub(crate) fn start(to: u16) -> CutOnce {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let cut = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if counted.fetch_max(1, Ordering::SeqCst) == 0 {
                    drop(client);
                    continue;
                }
                if let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) {
                    relay(client, server);
                }
            }
        });
        CutOnce { port, cut }
    }

    /// Connections cut so far.
    pub(crate) fn cut(&self) -> usize {
        self.cut.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies each way between two connections until each side ends.
fn relay(a: std::net::TcpStream, b: std::net::TcpStream) {
    for (mut from, mut to) in
        [(a.try_clone(), b.try_clone()), (Ok(b), Ok(a))].into_iter().filter_map(|(f, t)| f.ok().zip(t.ok()))
    {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    }
}

/// A port free on loopback now, for a process that binds it right after.
/// Taken below Linux's ephemeral range (32768 and up), where neither an
/// outgoing connection nor a listener on port 0 can take it meanwhile;
/// where to start looking depends on the process and the call, so parallel
/// tests rarely try the same ones.
pub(crate) fn free_port() -> u16 {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let start = 20_000 + ((std::process::id() + call * 997) % 12_000) as u16;
    (start..32_000)
        .chain(20_000..start)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free port below 32000")
}

/// A bare HTTP/1.1 request to the coordinator at `url`: (status, body).
pub(crate) fn http(url: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    http_with(url, method, path, "", body).0
}

/// [`http`] with `headers` (each line ending in `\r\n`) added: (status,
/// body), and the response's head.
pub(crate) fn http_with(
    url: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> ((u16, Vec<u8>), String) {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("send");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).expect("read");
    let split = reply.windows(4).position(|w| w == b"\r\n\r\n").expect("headers") + 4;
    let head = String::from_utf8_lossy(&reply[..split]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
    let mut body = reply[split..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    ((status, body), head)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line = data.windows(2).position(|w| w == b"\r\n").expect("chunk size");
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..line]).trim(), 16).expect("hex size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[line + 2..line + 2 + size]);
        data = &data[line + 2 + size + 2..];
    }
}
