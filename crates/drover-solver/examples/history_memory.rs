//! How much memory the solver holds per finished build, with and without a
//! bound on the history it keeps (`Input::KeepFinished`).
//!
//! Runs `BUILDS` builds of 500 jobs one after the other (each with a spec
//! of its own, 50 wide, every job after the one 50 before it) on one worker
//! of 4 slots, every run reported finished with the timings of its stages,
//! then lets over a minute pass and prints the builds held and the growth
//! of the process's resident memory. With `CACHED`, the worker's cache holds
//! the outputs of the latest `CACHED` builds only: it reports the older
//! ones evicted, as a cache of bounded size does.
//!
//! `cargo run --release -p drover-solver --example history_memory -- BUILDS [KEEP [CACHED]]`

mod common;

use std::collections::VecDeque;

use drover_core::{Config, Millis};
use drover_proto::{Hash32, Report};
use drover_solver::{Input, Solver};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The process's resident memory, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn main() {
    let mut args = std::env::args().skip(1);
    let builds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(600);
    let keep: Option<u64> = args.next().and_then(|a| a.parse().ok());
    let cached: Option<usize> = args.next().and_then(|a| a.parse().ok());
    // The outputs in the worker's cache, by build, oldest first.
    let mut cache: VecDeque<Vec<Hash32>> = VecDeque::new();
    let mut solver = Solver::new(Config::default());
    let mut now = 1_000;
    let worker = common::register(&mut solver, now);
    let _ = solver.handle(Millis(now), Input::KeepFinished { builds: keep });
    let before = resident();
    for b in 0..builds {
        let spec = common::spec(&format!("b{b}"), 500, |i| format!("echo {i} > {{{{out}}}}/x"));
        let id = common::submit(&mut solver, now, spec);
        cache.push_back(Vec::new());
        if let Some(cached) = cached
            && cache.len() > cached
        {
            let evicted = cache.pop_front().unwrap_or_default();
            let report = Report { evicted, ..Report::default() };
            let _ = solver.handle(Millis(now), Input::Report { worker, report });
        }
        common::run_to_end(&mut solver, &mut now, worker, id, |job| {
            if let Some(outputs) = cache.back_mut() {
                outputs.push(job);
            }
        });
    }
    // Past the minute a finished build is kept whatever the setting.
    for _ in 0..61 {
        now += 1_000;
        let _ = solver.handle(Millis(now), Input::Poll { worker });
    }
    let _ = solver.handle(Millis(now), Input::KeepFinished { builds: keep });
    let grown = resident().saturating_sub(before);
    println!(
        "{builds} builds of 500 jobs, keeping {}, outputs cached of {} builds: {} held, resident memory grew {} MB ({} KB per build)",
        keep.map_or("all".to_owned(), |k| k.to_string()),
        cached.map_or("all".to_owned(), |k| k.to_string()),
        solver.build_ids().len(),
        grown >> 20,
        grown / 1024 / builds.max(1) as u64
    );
}
