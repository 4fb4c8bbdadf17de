//! `drover bench`: end-to-end benchmarks on an embedded cluster, next to the
//! floor the machine allows. Prints a Markdown table (BENCHMARKS.md keeps
//! the results).
//!
//! - `throughput`: N independent `true` jobs on 2 workers with 2 slots each,
//!   against the floor of spawning `sh -c true` N times, 2 at a time.
//! - `chain`: N jobs, each needing the one before; the scheduling overhead
//!   of a link is the time from a job's end to its successor's start as the
//!   coordinator saw them.
//! - `noop`: a graph of N jobs built once, then again with everything cached.
//! - `share`: 20 builds of the same 500-job graph submitted at once, against
//!   one alone, five rounds of each alternated (each on a fresh cluster),
//!   medians compared: executions are counted by the jobs themselves; the
//!   CPU time of drover's own process in each round is reported too.
//! - `makespan`: random DAGs of `sleep` jobs (10 to 80 ms) on 2 workers with
//!   2 slots each; the makespan against max(critical path, work / slots),
//!   for each DAG's first build and for the same build again without the
//!   cache, once the first recorded its jobs' durations.
//! - `transfer`: a job on one worker writes one large file (1 GiB by
//!   default); a job pinned to the other worker needs it, so that worker
//!   fetches the output (streamed, verified) before running `true`: the
//!   rate is the size over that job's time, and the process's peak memory
//!   growth shows the transfer is not buffered whole. Its CPU time, and the
//!   floors of this machine (a file written and fsynced, blake3 on one
//!   thread, loopback TCP), say what bounds the rate.
//! - `queues`: three queues weighted 1:2:3, each kept busy by a build of
//!   200 ms jobs, on 2 workers with 3 slots each; the slot-seconds each
//!   queue received over a window, against its weight (Jain's index).
//! - `pull`: a worker process that pushes to the coordinator's shared cache
//!   builds N small jobs; once every output is in the shared cache it is
//!   killed, and a fresh worker with an empty cache gets the same build,
//!   every job of which must end `cached`, pulled from the shared cache.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use drover_proto::{BuildEvent, BuildState, BuildStatus, EventKind, JobState};

use crate::Failure;
use crate::cli::{BenchArgs, Scenario};
use crate::client;
use crate::cluster::{Embedded, Offer};

/// One measured row.
#[derive(Debug)]
struct Row {
    name: String,
    value: String,
    target: String,
}

/// Runs the chosen scenarios and prints the table.
pub(crate) async fn run(args: BenchArgs) -> Result<(), Failure> {
    let dir = crate::client::Scratch::new()?;
    let mut rows = Vec::new();
    let all = args.scenario == Scenario::All;
    if all || args.scenario == Scenario::Throughput {
        rows.extend(throughput(dir.path(), args.jobs).await?);
    }
    if all || args.scenario == Scenario::Chain {
        rows.extend(chain(dir.path(), args.chain).await?);
    }
    if all || args.scenario == Scenario::Noop {
        rows.extend(noop(dir.path(), args.noop).await?);
    }
    if all || args.scenario == Scenario::Share {
        rows.extend(share(dir.path()).await?);
    }
    if all || args.scenario == Scenario::Makespan {
        rows.extend(makespan(dir.path()).await?);
    }
    if all || args.scenario == Scenario::Queues {
        rows.extend(queues(dir.path(), args.seconds).await?);
    }
    if all || args.scenario == Scenario::Pull {
        rows.extend(pull(dir.path(), args.pull).await?);
    }
    if all || args.scenario == Scenario::Transfer {
        let size = crate::units::size("--size", &args.size).map_err(Failure::Usage)?;
        rows.extend(transfer(dir.path(), size).await?);
    }
    outln!("| benchmark | result | target |\n|---|---|---|");
    for row in rows {
        outln!("| {} | {} | {} |", row.name, row.value, row.target);
    }
    Ok(())
}

/// Writes a build file of `jobs` (name, needs, command) and loads it. Each
/// job gets its name in its environment (`DROVER_BENCH_JOB`): the content ID
/// covers the environment, so jobs of different names are different jobs
/// even when their commands and needs are the same, and a command needs no
/// marker of its own (which could make it more than a plain command).
fn build_file(
    dir: &Path,
    name: &str,
    jobs: &[(String, Vec<String>, String)],
) -> Result<client::Loaded, Failure> {
    let mut text = String::from("jobs:\n");
    for (job, needs, command) in jobs {
        let _ =
            writeln!(text, "  - name: {job}\n    run: [\"{command}\"]\n    env: {{DROVER_BENCH_JOB: {job}}}");
        if !needs.is_empty() {
            let _ = writeln!(text, "    needs: [{}]", needs.join(", "));
        }
    }
    let project = dir.join(name);
    std::fs::create_dir_all(&project).context("scratch project").map_err(Failure::Runtime)?;
    let file = project.join("drover.yaml");
    std::fs::write(&file, text).context("scratch build file").map_err(Failure::Runtime)?;
    client::load(&file)
}

/// Submits and waits, returning the events and the time from submission to
/// the end.
async fn measure(
    cluster: &Embedded,
    loaded: &client::Loaded,
) -> Result<(Vec<BuildEvent>, Duration), Failure> {
    let mut events = Vec::new();
    let (_, elapsed) = timed_build(cluster, loaded, false, |e| events.push(e.clone())).await?;
    Ok((events, elapsed))
}

/// Submits and waits, handing each event to `on_event` (a benchmark that
/// reads none keeps none: copying them is no part of what it measures);
/// with `no_cache`, every job runs even if its output is known. Returns the
/// build's ID and the time from submission to the end.
async fn timed_build(
    cluster: &Embedded,
    loaded: &client::Loaded,
    no_cache: bool,
    on_event: impl FnMut(&BuildEvent),
) -> Result<(u64, Duration), Failure> {
    let http = cluster.http();
    let start = Instant::now();
    let options = client::Options {
        tenant: "bench".into(),
        no_cache,
        on_error: drover_proto::OnError::Quit,
        max_parallel: None,
        queue: None,
        patient: false,
    };
    let id = client::submit_loaded(&http, &cluster.url, loaded, &options).await?;
    let ended = client::follow_events(&http, &cluster.url, id, 0, on_event).await?;
    let elapsed = start.elapsed();
    if ended.state != BuildState::Succeeded {
        return Err(Failure::Runtime(anyhow::anyhow!("the benchmark build ended {}", ended.state)));
    }
    Ok((id, elapsed))
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

async fn throughput(dir: &Path, n: usize) -> Result<Vec<Row>, Failure> {
    eprintln!("throughput: {n} independent jobs on 2 workers x 2 slots ...");
    let jobs: Vec<_> = (0..n).map(|i| (format!("j{i}"), Vec::new(), format!("true {i}"))).collect();
    let loaded = build_file(dir, "throughput", &jobs)?;
    let cluster = Embedded::start(&dir.join("throughput-state"), 2, 2).await?;
    let (_, elapsed) = timed_build(&cluster, &loaded, false, |_| {}).await?;
    eprintln!("throughput: the floor (sh -c true, {n} times, 2 at a time) ...");
    let floor = tokio::task::spawn_blocking(move || spawn_floor(n))
        .await
        .context("floor")
        .map_err(Failure::Runtime)?
        .map_err(Failure::Runtime)?;
    let ours = rate(n, elapsed);
    let floor_rate = rate(n, floor);
    Ok(vec![
        Row {
            name: format!("throughput, {n} `true` jobs"),
            value: format!("{ours:.0} jobs/s ({:.1}s)", elapsed.as_secs_f64()),
            target: String::new(),
        },
        Row {
            name: "floor: `sh -c true`, 2 at a time".into(),
            value: format!("{floor_rate:.0} jobs/s"),
            target: String::new(),
        },
        Row {
            name: "throughput / floor".into(),
            value: format!("{:.0}%", 100.0 * ours / floor_rate),
            target: "at least 70%".into(),
        },
    ])
}

/// Spawns `sh -c true` `n` times on two threads.
fn spawn_floor(n: usize) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let spawn = |count: usize| -> anyhow::Result<()> {
        for i in 0..count {
            let status = std::process::Command::new("sh").arg("-c").arg(format!("true {i}")).status()?;
            anyhow::ensure!(status.success(), "sh -c true failed");
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let a = scope.spawn(|| spawn(n / 2));
        let b = spawn(n - n / 2);
        a.join().map_err(|_| anyhow::anyhow!("floor thread panicked"))??;
        b
    })?;
    Ok(start.elapsed())
}

async fn chain(dir: &Path, n: usize) -> Result<Vec<Row>, Failure> {
    eprintln!("chain: {n} dependent jobs ...");
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            let needs = if i == 0 { Vec::new() } else { vec![format!("c{}", i - 1)] };
            (format!("c{i}"), needs, format!("true {i}"))
        })
        .collect();
    let loaded = build_file(dir, "chain", &jobs)?;
    let cluster = Embedded::start(&dir.join("chain-state"), 2, 2).await?;
    let (events, elapsed) = measure(&cluster, &loaded).await?;
    let mut finished = BTreeMap::new();
    let mut started = BTreeMap::new();
    for e in &events {
        match &e.kind {
            EventKind::JobFinished { job, .. } => {
                finished.insert(job.clone(), e.at);
            }
            EventKind::JobStarted { job, .. } => {
                started.insert(job.clone(), e.at);
            }
            _ => {}
        }
    }
    let mut gaps: Vec<u64> = (1..n)
        .filter_map(|i| {
            Some(started.get(&format!("c{i}"))?.saturating_sub(*finished.get(&format!("c{}", i - 1))?))
        })
        .collect();
    gaps.sort_unstable();
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    let p90 = gaps.get(gaps.len() * 9 / 10).copied().unwrap_or(0);
    Ok(vec![
        Row {
            name: format!("chain of {n}: wall time per link (job included)"),
            value: format!("{:.2} ms", elapsed.as_secs_f64() * 1000.0 / n as f64),
            target: String::new(),
        },
        Row {
            name: format!("chain of {n}: scheduling overhead per link, median (p90)"),
            value: format!("{median} ms ({p90} ms), at the coordinator's millisecond clock"),
            target: "under 2 ms".into(),
        },
    ])
}

async fn noop(dir: &Path, n: usize) -> Result<Vec<Row>, Failure> {
    eprintln!("noop: {n} jobs built, then rebuilt with everything cached ...");
    let jobs = layered(n, |i| format!("echo {i} > {{{{out}}}}/r"));
    let loaded = build_file(dir, "noop", &jobs)?;
    let cluster = Embedded::start(&dir.join("noop-state"), 2, 2).await?;
    let (_, cold) = timed_build(&cluster, &loaded, false, |_| {}).await?;
    let (events, warm) = measure(&cluster, &loaded).await?;
    let cached = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::JobFinished { state: JobState::Cached, .. }))
        .count();
    if cached != n {
        return Err(Failure::Runtime(anyhow::anyhow!("the rebuild ran {} of {n} jobs again", n - cached)));
    }
    Ok(vec![
        Row {
            name: format!("first build of {n} jobs"),
            value: format!("{:.2} s", cold.as_secs_f64()),
            target: String::new(),
        },
        Row {
            name: format!("no-op rebuild of {n} jobs (all cached)"),
            value: format!("{:.3} s", warm.as_secs_f64()),
            target: "under 2 s".into(),
        },
    ])
}

/// `n` jobs in layers of 50, each needing two jobs of the layer before.
fn layered(n: usize, command: impl Fn(usize) -> String) -> Vec<(String, Vec<String>, String)> {
    let width = 50;
    (0..n)
        .map(|i| {
            let mut needs = Vec::new();
            if i >= width {
                needs.push(format!("n{}", i - width));
                if i % width != width - 1 {
                    needs.push(format!("n{}", i - width + 1));
                }
            }
            (format!("n{i}"), needs, command(i))
        })
        .collect()
}

async fn share(dir: &Path) -> Result<Vec<Row>, Failure> {
    let (n, builds, rounds) = (500, 20, 5);
    eprintln!(
        "share: {builds} concurrent builds of one {n}-job graph, against one alone, {rounds} rounds each ..."
    );
    let run = |name: String, count: usize| {
        let dir = dir.to_owned();
        async move {
            let counter = dir.join(format!("{name}-executions"));
            let path = counter.display().to_string();
            let jobs = layered(n, |i| format!("echo {i} >> {path}"));
            let loaded = std::sync::Arc::new(build_file(&dir, &name, &jobs)?);
            let cluster =
                std::sync::Arc::new(Embedded::start(&dir.join(format!("{name}-state")), 2, 2).await?);
            // Each client a task of its own, as separate `drover submit
            // --wait` processes would be: not all polled in turn by one.
            let (start, cpu) = (Instant::now(), cpu_seconds());
            let clients = (0..count).map(|_| {
                let (cluster, loaded) = (cluster.clone(), loaded.clone());
                tokio::spawn(async move { timed_build(&cluster, &loaded, false, |_| {}).await })
            });
            let all = futures::future::join_all(clients).await;
            let (elapsed, cpu) = (start.elapsed(), cpu_seconds() - cpu);
            for result in all {
                result.context("a client task").map_err(Failure::Runtime)??;
            }
            let executions = std::fs::read_to_string(&counter).map(|t| t.lines().count()).unwrap_or(0);
            Ok::<_, Failure>((elapsed.as_secs_f64(), cpu, executions))
        }
    };
    // Alternated, each on a fresh cluster, so that a slow stretch of the
    // machine weighs on both sides alike; medians compared.
    let (mut alone, mut together, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu_alone, mut cpu_together) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (secs, cpu, executions) = run(format!("share-alone-{round}"), 1).await?;
        alone.push(secs);
        cpu_alone.push(cpu);
        runs.push(executions);
        let (secs, cpu, executions) = run(format!("share-{builds}-{round}"), builds).await?;
        together.push(secs);
        cpu_together.push(cpu);
        runs.push(executions);
    }
    let (a, t) = (median(&mut alone), median(&mut together));
    let (cpu_a, cpu_t) = (median(&mut cpu_alone), median(&mut cpu_together));
    let range = |v: &[f64]| format!("{:.2}–{:.2} s", v[0], v[v.len() - 1]);
    let executions = if runs.iter().all(|&r| r == n) {
        format!("{n} executions in every run")
    } else {
        format!("executions per run: {runs:?}")
    };
    Ok(vec![
        Row {
            name: format!("one build of {n} jobs alone (median of {rounds})"),
            value: format!("{a:.2} s ({})", range(&alone)),
            target: String::new(),
        },
        Row {
            name: format!("{builds} concurrent builds of the same {n} jobs (median of {rounds})"),
            value: format!("{t:.2} s ({}), {:.2}x one alone; {executions}", range(&together), t / a),
            target: format!("{n} executions, within 1.3x"),
        },
        Row {
            // The wall time's ratio moves by a tenth from run to run here;
            // the CPU the extra builds cost says more about a change.
            name: "drover's own CPU per round, one build / twenty (median; the jobs and their supervisors not counted)"
                .into(),
            value: format!("{:.2} s / {:.2} s", cpu_a, cpu_t),
            target: String::new(),
        },
    ])
}

/// The median of `v` (sorted in place; the upper one of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A small deterministic generator (splitmix64) for the random DAGs.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

async fn makespan(dir: &Path) -> Result<Vec<Row>, Failure> {
    let slots = 4u64;
    let mut rows = Vec::new();
    let (mut ratios, mut rebuilt) = (Vec::new(), Vec::new());
    let mut seed = 7u64;
    for graph in 0..5 {
        let n = 40 + (next(&mut seed) % 41) as usize;
        let width = 2 + (next(&mut seed) % 12) as usize;
        let mut durations = Vec::new();
        let mut jobs = Vec::new();
        for i in 0..n {
            let ms = 10 + next(&mut seed) % 71;
            let layer = i / width;
            let mut needs = Vec::new();
            if layer > 0 {
                for _ in 0..1 + next(&mut seed) % 2 {
                    let j = (layer - 1) * width + (next(&mut seed) as usize % width);
                    let name = format!("g{graph}n{j}");
                    if !needs.contains(&name) {
                        needs.push(name);
                    }
                }
            }
            durations.push((ms, needs.clone()));
            jobs.push((format!("g{graph}n{i}"), needs, format!("sleep 0.{ms:03}")));
        }
        // Lower bound: the longest path of sleeps, or the work over the slots.
        let mut finish = vec![0u64; n];
        for i in 0..n {
            let start = durations[i]
                .1
                .iter()
                .map(|name| {
                    finish[name.rsplit('n').next().and_then(|k| k.parse::<usize>().ok()).unwrap_or(0)]
                })
                .max()
                .unwrap_or(0);
            finish[i] = start + durations[i].0;
        }
        let critical = finish.iter().copied().max().unwrap_or(0);
        let work: u64 = durations.iter().map(|d| d.0).sum();
        let bound = critical.max(work.div_ceil(slots));
        eprintln!("makespan: graph {graph}: {n} jobs, {width} wide, bound {bound} ms ...");
        let loaded = build_file(dir, &format!("makespan-{graph}"), &jobs)?;
        let cluster = Embedded::start(&dir.join(format!("makespan-{graph}-state")), 2, 2).await?;
        let (_, elapsed) = timed_build(&cluster, &loaded, false, |_| {}).await?;
        // The same build again, nothing taken from the cache: the
        // critical path now uses the durations the first build recorded.
        let (_, again) = timed_build(&cluster, &loaded, true, |_| {}).await?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (ratio, known) = (ms(elapsed) / bound as f64, ms(again) / bound as f64);
        ratios.push(ratio);
        rebuilt.push(known);
        rows.push(Row {
            name: format!("makespan, random DAG {graph} ({n} jobs, {width} wide)"),
            value: format!(
                "{:.0} ms against a bound of {bound} ms: {ratio:.2}x; again, durations known: {:.0} ms, {known:.2}x",
                ms(elapsed),
                ms(again)
            ),
            target: String::new(),
        });
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    rows.push(Row {
        name: "makespan / bound, mean of first builds".into(),
        value: format!("{:.2}x", mean(&ratios)),
        target: "at most 1.10".into(),
    });
    rows.push(Row {
        name: "makespan / bound, mean of the same builds again (`--no-cache`, durations known)".into(),
        value: format!("{:.2}x", mean(&rebuilt)),
        target: String::new(),
    });
    Ok(rows)
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n at worst.
fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 { 1.0 } else { sum * sum / (x.len() as f64 * squares) }
}

async fn queues(dir: &Path, seconds: u64) -> Result<Vec<Row>, Failure> {
    const WEIGHTS: [(&str, u32); 3] = [("light", 1), ("medium", 2), ("heavy", 3)];
    const JOB_MS: u64 = 200;
    const WARM_UP_MS: u64 = 2_000;
    let (workers, slots) = (2u32, 3u32);
    let total_slots = u64::from(workers * slots);
    eprintln!("queues: 3 queues weighted 1:2:3 on {workers} workers x {slots} slots, {seconds} s ...");
    let cluster =
        Embedded::start_with(&dir.join("queues-state"), workers, slots, &Offer::default(), |core| {
            core.queues = WEIGHTS
                .iter()
                .map(|&(name, weight)| drover_core::QueueConfig {
                    name: name.into(),
                    weight,
                    ..drover_core::QueueConfig::default()
                })
                .collect();
        })
        .await?;
    // Enough jobs that every queue could fill the whole cluster throughout.
    let n = (total_slots * (WARM_UP_MS + seconds * 1000) / JOB_MS + total_slots) as usize;
    let http = cluster.http();
    let mut ids = Vec::new();
    for (name, _) in WEIGHTS {
        let jobs: Vec<_> =
            (0..n).map(|i| (format!("{name}{i}"), Vec::new(), format!("sleep 0.{JOB_MS:03}"))).collect();
        let loaded = build_file(dir, &format!("queues-{name}"), &jobs)?;
        let options = client::Options {
            tenant: name.into(),
            no_cache: true,
            on_error: drover_proto::OnError::Quit,
            max_parallel: None,
            queue: Some(name.into()),
            patient: false,
        };
        ids.push(client::submit_loaded(&http, &cluster.url, &loaded, &options).await?);
    }
    // Follow the three builds; cancel them once the window is over.
    let follow = futures::future::join_all(ids.iter().map(|&id| {
        let http = http.clone();
        let url = cluster.url.clone();
        async move {
            let mut events = Vec::new();
            client::follow_events(&http, &url, id, 0, |e| events.push(e.clone())).await.map(|_| events)
        }
    }));
    let stop = async {
        tokio::time::sleep(Duration::from_millis(WARM_UP_MS + seconds * 1000 + 500)).await;
        for &id in &ids {
            let _ = http.post(&client::api(&cluster.url, &format!("/v1/builds/{id}/cancel"))).await;
        }
    };
    let (followed, ()) = tokio::join!(follow, stop);
    // Slot-milliseconds each queue held inside the window, as the
    // coordinator saw its jobs start and end.
    let mut runs = Vec::new();
    for events in followed {
        let events = events?;
        let mut started = BTreeMap::new();
        let mut held = Vec::new();
        for e in &events {
            match &e.kind {
                EventKind::JobStarted { job, .. } => {
                    started.insert(job.clone(), e.at);
                }
                EventKind::JobFinished { job, .. } | EventKind::JobCancelled { job, .. } => {
                    if let Some(start) = started.remove(job) {
                        held.push((start, e.at));
                    }
                }
                _ => {}
            }
        }
        runs.push(held);
    }
    let first = runs.iter().flatten().map(|r| r.0).min().unwrap_or(0);
    let (from, to) = (first + WARM_UP_MS, first + WARM_UP_MS + seconds * 1000);
    let delivered: Vec<f64> = runs
        .iter()
        .map(|held| held.iter().map(|&(a, b)| b.min(to).saturating_sub(a.max(from)) as f64).sum())
        .collect();
    let total: f64 = delivered.iter().sum();
    let weight_sum: f64 = WEIGHTS.iter().map(|w| f64::from(w.1)).sum();
    let ratios: Vec<f64> =
        delivered.iter().zip(WEIGHTS).map(|(d, (_, w))| d / (total * f64::from(w) / weight_sum)).collect();
    let share = |d: f64| format!("{:.1}%", 100.0 * d / total);
    Ok(vec![
        Row {
            name: format!("queues 1:2:3 over {seconds} s, share of slot-seconds"),
            value: format!(
                "light {}, medium {}, heavy {} (entitled 16.7%, 33.3%, 50.0%); cluster {:.0}% busy",
                share(delivered[0]),
                share(delivered[1]),
                share(delivered[2]),
                100.0 * total / (total_slots as f64 * (to - from) as f64)
            ),
            target: String::new(),
        },
        Row {
            name: "Jain's index of delivered / entitled".into(),
            value: format!("{:.3}", jain(&ratios)),
            target: "at least 0.95".into(),
        },
    ])
}

/// Peak resident memory of this process so far, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

async fn transfer(dir: &Path, size: u64) -> Result<Vec<Row>, Failure> {
    eprintln!("transfer: a {size}-byte output fetched by the other worker ...");
    let text = format!(
        "jobs:\n  - name: make\n    run: [\"head -c {size} /dev/zero > {{{{out}}}}/big\"]\n    labels: {{worker: local-1}}\n  \
         - name: take\n    needs: [make]\n    run: [\"test -s {{{{dep:make}}}}/big\"]\n    labels: {{worker: local-2}}\n"
    );
    let project = dir.join("transfer");
    std::fs::create_dir_all(&project).context("scratch project").map_err(Failure::Runtime)?;
    let file = project.join("drover.yaml");
    std::fs::write(&file, text).context("scratch build file").map_err(Failure::Runtime)?;
    let loaded = client::load(&file)?;
    let cluster = Embedded::start(&dir.join("transfer-state"), 2, 1).await?;
    let before = peak_rss();
    let cpu_before = cpu_seconds();
    let (events, _) = measure(&cluster, &loaded).await?;
    let cpu = cpu_seconds() - cpu_before;
    let at = |name: &str, started: bool| {
        events.iter().find_map(|e| match &e.kind {
            EventKind::JobStarted { job, .. } if started && job == name => Some(e.at),
            EventKind::JobFinished { job, .. } if !started && job == name => Some(e.at),
            _ => None,
        })
    };
    let (start, end) = (at("take", true).unwrap_or(0), at("take", false).unwrap_or(0));
    let secs = (end.saturating_sub(start)).max(1) as f64 / 1000.0;
    let peak = peak_rss().saturating_sub(before);
    let mut rows = vec![
        Row {
            name: format!("transfer of a {} MiB output between two workers", size >> 20),
            value: format!(
                "{:.0} MB/s ({secs:.2} s for the fetching job, fetch included)",
                size as f64 / 1e6 / secs
            ),
            target: "at least 500 MB/s".into(),
        },
        Row {
            name: "peak memory growth of the process during the build".into(),
            value: format!("{} MiB", peak >> 20),
            target: "bounded (not the whole output)".into(),
        },
        Row {
            name: "CPU time of the process during the build (both jobs)".into(),
            value: format!("{cpu:.2} s"),
            target: String::new(),
        },
    ];
    eprintln!("transfer: the floors (disk, hashing, loopback TCP) ...");
    let scratch = dir.join("transfer-floor");
    let floors = tokio::task::spawn_blocking(move || transfer_floors(&scratch, size))
        .await
        .context("floors")
        .map_err(Failure::Runtime)?
        .map_err(Failure::Runtime)?;
    let names = [
        "floor: write then fsync of one file of that size (256 KiB writes, page cache)",
        "floor: blake3 of that size in memory, one thread",
        "floor: loopback TCP, one connection, 256 KiB writes",
    ];
    rows.extend(names.into_iter().zip(floors).map(|(name, secs)| Row {
        name: name.into(),
        value: format!("{:.0} MB/s", size as f64 / 1e6 / secs),
        target: String::new(),
    }));
    Ok(rows)
}

/// CPU time (user and system) of this process so far, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum();
    ticks as f64 / 100.0
}

/// Seconds to write `size` bytes to a file in `scratch` and fsync it, to
/// hash them with blake3 on one thread, and to send them over loopback TCP.
fn transfer_floors(scratch: &Path, size: u64) -> anyhow::Result<[f64; 3]> {
    use std::io::{Read, Write};
    const BUF: usize = 256 * 1024;
    let buf = vec![0x5au8; BUF];
    let chunks = size.div_ceil(BUF as u64);

    let start = Instant::now();
    let path = scratch.with_extension("bin");
    let mut file = std::fs::File::create(&path)?;
    for _ in 0..chunks {
        file.write_all(&buf)?;
    }
    file.sync_all()?;
    let disk = start.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;

    let block = vec![0xa5u8; 64 << 20];
    let start = Instant::now();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        std::hint::black_box(drover_cas::Key::digest(&block[..n]));
        left -= n as u64;
    }
    let hash = start.elapsed().as_secs_f64();

    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    let start = Instant::now();
    let receiver = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut socket, _) = listener.accept()?;
        let mut sink = vec![0u8; BUF];
        let mut total = 0u64;
        loop {
            match socket.read(&mut sink)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let mut socket = std::net::TcpStream::connect(addr)?;
    for _ in 0..chunks {
        socket.write_all(&buf)?;
    }
    drop(socket);
    let received = receiver.join().map_err(|_| anyhow::anyhow!("the TCP floor's reader panicked"))??;
    anyhow::ensure!(received == chunks * BUF as u64, "the TCP floor lost bytes");
    let tcp = start.elapsed().as_secs_f64();
    Ok([disk, hash, tcp])
}

/// A worker process (this binary's `drover worker`), killed when dropped.
fn worker_process(url: &str, dir: &Path, name: &str) -> Result<tokio::process::Child, Failure> {
    let exe = std::env::current_exe().context("the drover executable").map_err(Failure::Runtime)?;
    tokio::process::Command::new(exe)
        .arg("worker")
        .args(["--coordinator", url, "--name", name, "--slots", "2", "--listen", "127.0.0.1:0"])
        .arg("--cache")
        .arg(dir)
        .env_remove("DROVER_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start a worker process")
        .map_err(Failure::Runtime)
}

/// Waits until the coordinator sees the worker `name` alive (or, with
/// `alive` false, declared lost).
async fn await_worker(http: &drover_http::Http, url: &str, name: &str, alive: bool) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let workers: Vec<drover_proto::WorkerStatus> =
            http.get_json(&client::api(url, "/v1/workers")).await.map_err(anyhow::Error::from)?;
        if workers.iter().any(|w| w.name == name && w.alive == alive) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let what = if alive { "register" } else { "be declared lost" };
            return Err(Failure::Runtime(anyhow::anyhow!("worker {name} did not {what} within 60 s")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the shared cache serves every job of `status`: each output
/// is downloaded whole once found, 32 requests at a time, and those still
/// missing are asked for again after 50 ms. Returns how long that took.
async fn await_pushed(
    http: &drover_http::Http,
    url: &str,
    status: &BuildStatus,
) -> Result<Duration, Failure> {
    use futures::{StreamExt, TryStreamExt};
    let start = Instant::now();
    let deadline = start + Duration::from_secs(300);
    let mut missing: Vec<String> = status.jobs.iter().map(|j| j.id.to_string()).collect();
    loop {
        let found = futures::stream::iter(missing.clone())
            .map(|id| async move {
                match http.get_stream(&client::api(url, &format!("/v1/cache/{id}"))).await {
                    Ok(body) => body
                        .try_for_each(|_| async { Ok(()) })
                        .await
                        .map(|()| true)
                        .map_err(anyhow::Error::from),
                    Err(e) if e.status() == Some(404) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            })
            .buffered(32)
            .try_collect::<Vec<bool>>()
            .await
            .map_err(Failure::Runtime)?;
        missing = missing.into_iter().zip(found).filter(|(_, found)| !found).map(|(id, _)| id).collect();
        if missing.is_empty() {
            return Ok(start.elapsed());
        }
        if Instant::now() > deadline {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "{} outputs never reached the shared cache",
                missing.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn pull(dir: &Path, n: usize) -> Result<Vec<Row>, Failure> {
    eprintln!(
        "pull: {n} jobs built by a pushing worker, then pulled from the shared cache by a fresh one ..."
    );
    let counter = dir.join("pull-executions");
    let path = counter.display().to_string();
    let jobs = layered(n, |i| format!("echo {i} > {{{{out}}}}/r; echo {i} >> {path}"));
    let loaded = build_file(dir, "pull", &jobs)?;
    // A short lease, so that the killed worker is soon declared lost (its
    // outputs then count only in the shared cache).
    let cluster = Embedded::start_with(&dir.join("pull-state"), 0, 2, &Offer::default(), |core| {
        core.lease_timeout = drover_core::Millis(2_000);
    })
    .await?;
    let http = cluster.http();
    let builder = worker_process(&cluster.url, &dir.join("pull-worker-1"), "pull-1")?;
    await_worker(&http, &cluster.url, "pull-1", true).await?;
    let (id, built) = timed_build(&cluster, &loaded, false, |_| {}).await?;
    let first = client::build_status(&http, &cluster.url, id).await?;
    let pushed = await_pushed(&http, &cluster.url, &first).await?;
    drop(builder);
    await_worker(&http, &cluster.url, "pull-1", false).await?;

    let _fresh = worker_process(&cluster.url, &dir.join("pull-worker-2"), "pull-2")?;
    await_worker(&http, &cluster.url, "pull-2", true).await?;
    let (id, pulled) = timed_build(&cluster, &loaded, false, |_| {}).await?;
    let second = client::build_status(&http, &cluster.url, id).await?;
    let executions = std::fs::read_to_string(&counter).map(|t| t.lines().count()).unwrap_or(0);
    let cached = second
        .jobs
        .iter()
        .filter(|j| {
            j.state == JobState::Cached
                && j.worker.as_deref() == Some("pull-2")
                && j.stages.contains_key("pull")
        })
        .count();
    if cached != n || executions != n {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "the pull build should pull all {n} jobs and run none: {cached} pulled, {} executed",
            executions.saturating_sub(n)
        )));
    }
    Ok(vec![
        Row {
            name: format!("build of {n} small jobs on a worker that pushes (1 worker x 2 slots)"),
            value: format!(
                "{:.2} s ({:.0} jobs/s); every output in the shared cache {:.2} s later",
                built.as_secs_f64(),
                rate(n, built),
                pushed.as_secs_f64()
            ),
            target: String::new(),
        },
        Row {
            name: "the same build on a fresh worker, pulled from the shared cache".into(),
            value: format!(
                "{:.2} s ({:.0} jobs/s, {:.2}x the build's time): {cached} cached, {} executed",
                pulled.as_secs_f64(),
                rate(n, pulled),
                pulled.as_secs_f64() / built.as_secs_f64(),
                executions - n
            ),
            target: "report next to the build".into(),
        },
    ])
}
