//! A client cannot hold the coordinator's connections: one that sends a
//! request's headers too slowly, or nothing at all, is disconnected, and
//! requests on other connections go on meanwhile.
//!
//! A real coordinator on loopback and raw TCP connections.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Reads until the server closes the connection (or a generous deadline
/// passes, a failure); what it sent before closing.
fn until_closed(mut tcp: TcpStream) -> Vec<u8> {
    tcp.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the connection stayed open: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_or_silent_clients_are_disconnected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::loopback(dir.path());
    config.header_timeout = Duration::from_millis(300);
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let addr = coordinator.url().trim_start_matches("http://").to_owned();
    let (silent, slow) = tokio::task::spawn_blocking(move || {
        let silent = TcpStream::connect(&addr).expect("connect");
        let mut slow = TcpStream::connect(&addr).expect("connect");
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").expect("write");
        // A working client meanwhile.
        let mut ok = TcpStream::connect(&addr).expect("connect");
        ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
        let answer = String::from_utf8(until_closed(ok)).expect("utf-8");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        (until_closed(silent), until_closed(slow))
    })
    .await
    .expect("clients");
    assert!(silent.is_empty(), "nothing to answer a silent client: {silent:?}");
    let slow = String::from_utf8_lossy(&slow);
    assert!(!slow.contains("200"), "the slow request was not served: {slow}");
}

/// An upload that stops sending is refused once it has been idle too long
/// (it held one of the threads every file operation shares).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::loopback(dir.path());
    config.upload_idle = Duration::from_millis(300);
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let addr = coordinator.url().trim_start_matches("http://").to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(&addr).expect("connect");
        let digest = "ab".repeat(32);
        write!(tcp, "PUT /v1/blobs/{digest} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
            .expect("write");
        String::from_utf8_lossy(&until_closed(tcp)).into_owned()
    })
    .await
    .expect("client");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("no data for 0.3 s"), "{answer}");
}

/// Sends one request on a fresh connection and reads the whole answer.
fn exchange(addr: &str, request: &str) -> String {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.write_all(request.as_bytes()).expect("write");
    String::from_utf8_lossy(&until_closed(tcp)).into_owned()
}

/// Every error answer carries `{"error": ...}`, also those made before a
/// handler runs: an unknown route or method, a body of the wrong type or
/// unreadable JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_json_body() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let addr = coordinator.url().trim_start_matches("http://").to_owned();
    tokio::task::spawn_blocking(move || {
        let post = |path: &str, content_type: &str, body: &str| {
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {content_type}\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        let cases = [
            ("GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(), "404"),
            ("DELETE /v1/builds HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(), "405"),
            (post("/v1/builds", "text/plain", "{}"), "415"),
            (post("/v1/builds", "application/json", "{\"build\": "), "400"),
            (post("/v1/workers/register", "application/json", "{\"name\": 1}"), "422"),
        ];
        for (request, status) in cases {
            let answer = exchange(&addr, &request);
            assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{answer}");
            assert!(answer.to_ascii_lowercase().contains("content-type: application/json"), "{answer}");
            let body = answer.split("\r\n\r\n").nth(1).expect("a body");
            let error: drover_proto::ErrorBody = serde_json::from_str(body).expect("an error body");
            assert!(!error.error.is_empty(), "{answer}");
            if status == "405" {
                assert!(answer.to_ascii_lowercase().contains("allow: "), "{answer}");
            }
        }
    })
    .await
    .expect("clients");
}

/// A request that declares a body over the limit is refused at once, before
/// its body is sent: no `100 Continue`, a 413 with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_before_it_is_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::loopback(dir.path());
    config.max_blob = 1_000;
    let coordinator = drover_coordinator::start(config).await.expect("start");
    let addr = coordinator.url().trim_start_matches("http://").to_owned();
    tokio::task::spawn_blocking(move || {
        let digest = "ab".repeat(32);
        for (request, why) in [
            (
                "POST /v1/builds HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 999999999999"
                    .to_owned(),
                "MiB",
            ),
            (format!("PUT /v1/blobs/{digest} HTTP/1.1\r\nContent-Length: 1001"), "at most 1000 bytes"),
        ] {
            let mut tcp = TcpStream::connect(&addr).expect("connect");
            write!(tcp, "{request}\r\nHost: x\r\nExpect: 100-continue\r\n\r\n").expect("write");
            tcp.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
            let mut answer = String::new();
            let mut buf = [0u8; 4096];
            while !answer.contains(why) {
                let n = tcp.read(&mut buf).expect("an answer without the body");
                if n == 0 {
                    break;
                }
                answer.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            assert!(answer.contains(why), "{answer}");
        }
    })
    .await
    .expect("clients");
}
