//! A dropped coordinator leaves nothing running: its server stops and, once
//! no handler or in-process client holds its state, its state thread ends.
//! (A test binary of its own: it counts the process's threads.)

mod common;

use std::time::{Duration, Instant};

/// Threads of this process named like the coordinator's state thread.
fn state_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "drover-state")
        .count()
}

#[tokio::test]
async fn a_dropped_coordinator_ends_its_state_thread_and_stops_listening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordinator = drover_coordinator::start(common::loopback(dir.path())).await.expect("start");
    let (addr, router) = (coordinator.addr(), coordinator.router());
    // A thread names itself once it runs: under load that comes a little
    // after `start` returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while state_threads() == 0 {
        assert!(Instant::now() < deadline, "no state thread");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state_threads(), 1);
    drop(coordinator);
    // An in-process client's router still holds the state: the thread stays.
    assert_eq!(state_threads(), 1);
    drop(router);
    let deadline = Instant::now() + Duration::from_secs(10);
    while state_threads() > 0 {
        assert!(Instant::now() < deadline, "the state thread outlived its coordinator");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
            Ok(_) => panic!("the coordinator still listens at {addr}"),
        }
    };
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}
