//! What a snapshot of the coordinator's state costs: a solver that has run
//! `FINISHED` builds of 500 jobs (every run reported, stage timings and
//! all) and holds `QUEUED` more jobs queued, in builds of 500, on one worker of
//! 4 slots; prints the snapshot's size and the time to write it (CBOR, as
//! the coordinator does) and to read it back, and checks the copy equal.
//!
//! `cargo run --release -p drover-solver --example snapshot_size -- FINISHED QUEUED`

mod common;

use std::time::Instant;

use drover_core::Config;
use drover_solver::Solver;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let finished: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let queued: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let mut solver = Solver::new(Config::default());
    let mut now = 1_000;
    let worker = common::register(&mut solver, now);
    let command = |i: usize| format!("cc -c src/{i}.c -o {{{{out}}}}/{i}.o");
    for b in 0..finished {
        let id = common::submit(&mut solver, now, common::spec(&format!("done{b}"), 500, command));
        common::run_to_end(&mut solver, &mut now, worker, id, |_| {});
    }
    for b in 0..queued.div_ceil(500) {
        common::submit(
            &mut solver,
            now,
            common::spec(&format!("queued{b}"), 500.min(queued - b * 500), command),
        );
    }
    solver.take_effects();
    let started = Instant::now();
    let copy = solver.clone();
    let cloned = started.elapsed();
    drop(copy);
    let started = Instant::now();
    let mut bytes = Vec::new();
    ciborium::into_writer(&solver, &mut bytes).expect("encode");
    let wrote = started.elapsed();
    let started = Instant::now();
    let read: Solver = ciborium::from_reader(&bytes[..]).expect("decode");
    let took = started.elapsed();
    assert!(read == solver, "the copy read back differs");
    println!(
        "{finished} finished builds of 500 jobs, {queued} jobs queued: cloned in {} ms, snapshot {:.1} MB, written in {} ms, read in {} ms",
        cloned.as_millis(),
        bytes.len() as f64 / 1e6,
        wrote.as_millis(),
        took.as_millis()
    );
}
