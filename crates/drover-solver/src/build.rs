//! One build: its jobs' states, what each failure skips, and its ordered event
//! stream.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use drover_core::{JobId, JobSpec, Millis, Request, WaiterId};
use drover_proto::{
    BuildEvent, BuildSpec, BuildState, BuildStatus, EventKind, JobDef, JobState, JobStatus, OnError,
    SourceFile, SubmitRequest,
};

/// The most unfinished needs a waiting job's status names (the rest are
/// counted): a job after a fan-out of hundreds would list them all.
const LISTED_NEEDS: usize = 5;

/// The expected duration of a job no earlier run tells about.
const DEFAULT_DURATION_MS: u64 = 1_000;

/// Most jobs one build may have: as many as a build file may hold
/// (`drover_graph::MAX_JOBS`), so a submission made without one (straight
/// to the API) cannot be ten times larger.
const MAX_JOBS: usize = 100_000;
/// Most times a gang with `on_failure: restart` is rerun.
pub(crate) const MAX_GANG_RESTARTS: u32 = 3;
/// Most times one job goes back to wait for needs whose outputs were lost
/// (see [`Build::rewind`]); a job that loses its inputs more often fails.
const MAX_REWINDS: u32 = 3;

/// What a rewind does: the core waiters to cancel, and the jobs going back
/// whose needs are all done (to schedule).
type Rewind = (Vec<(JobId, WaiterId)>, Vec<u32>);

/// What a gang restart does: the core waiters to cancel, and the members
/// to schedule again.
pub(crate) type GangRestart = (Vec<(JobId, WaiterId)>, Vec<u32>);

/// A gang of the build and its restarts so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct GangRec {
    members: Vec<u32>,
    min_available: u32,
    restart: bool,
    restarts: u32,
    /// Instances sent to the core so far, less one: a restart or a lost
    /// input sends the gang again as a new instance.
    instance: u32,
    /// Members whose needs are done, held until the whole gang is ready.
    ready: std::collections::BTreeSet<u32>,
    /// This instance of the gang went to the core.
    sent: bool,
    /// The `min_available` the core was given (what the cache left open).
    core_min: u32,
}

/// A gang whose members are all ready (or over): the ready ones go on
/// together.
pub(crate) struct GangRelease {
    pub(crate) name: String,
    pub(crate) members: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct JobRec {
    state: JobState,
    /// The worker of its latest run, and its name: a worker lost long ago
    /// is forgotten (see `KEEP_LOST_WORKERS`), its jobs still name it.
    worker: Option<(u64, Arc<str>)>,
    run: Option<u64>,
    /// The attempt its latest run was, counted across `drover retry`:
    /// `before` plus the run's own attempt in the core.
    attempts: u32,
    /// The attempts of its runs before the build was last retried (the
    /// core counts a job sent to it again from 1).
    #[serde(default)]
    before: u32,
    exit_code: Option<i32>,
    detail: String,
    /// Set while the core holds the job for this build.
    waiter: Option<WaiterId>,
    /// Its run was suspended by `drover suspend` (and not resumed since).
    suspended: bool,
    /// Its run is suspended by an eviction, for this job (for people); the
    /// core resumes it. Kept apart from `suspended`: the run's processes
    /// continue only once neither holds them.
    evicted: Option<String>,
    /// Times it went back to wait for needs whose outputs were lost.
    rewinds: u32,
    /// Milliseconds per stage of the latest of its runs that ended, as its
    /// worker reported them (kept with the build, so they go with it).
    stages: BTreeMap<String, u64>,
    /// Its earlier runs, for their logs (`drover logs --attempt`): attempt,
    /// run, worker. A boxed slice, made again on each change: most jobs run
    /// once, and a record stays small.
    #[serde(default)]
    earlier: Option<Box<[EarlierRun]>>,
}

/// Earlier runs of a job kept for their logs.
const MAX_EARLIER_RUNS: usize = 16;

impl JobRec {
    /// Files its latest run among the earlier ones (its log stays
    /// readable by attempt), if it has one.
    fn keep_earlier_run(&mut self) {
        let (Some(run), Some((worker, name))) = (self.run, self.worker.take()) else { return };
        let mut earlier = self.earlier.take().map(Vec::from).unwrap_or_default();
        earlier.push(EarlierRun { attempt: self.attempts, run, worker, name });
        // Bounded however often it runs again (`drover retry` after retry):
        // the latest of them are kept.
        if earlier.len() > MAX_EARLIER_RUNS {
            earlier.remove(0);
        }
        self.earlier = Some(earlier.into_boxed_slice());
    }

    /// The job leaves its run for a new one in the core (a gang sent again,
    /// a need rebuilt): the run is kept among the earlier ones, and the
    /// new run's attempts count on from it (the core counts from 1 again).
    fn retire_run(&mut self) {
        self.keep_earlier_run();
        self.run = None;
        self.worker = None;
        self.before = self.attempts;
    }
}

/// A run of a job before its latest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct EarlierRun {
    attempt: u32,
    run: u64,
    worker: u64,
    name: Arc<str>,
}

/// What a build's spec says, checked, with its graph by index: the same
/// for every build submitted with that spec, so builds that share a spec
/// (the coordinator hands them one `Arc`) share one plan too.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Plan {
    spec: Arc<BuildSpec>,
    index: BTreeMap<String, u32>,
    /// Every job's needs by index, in the order of its `needs`: those of
    /// job `i` are `needs[needs_at[i]..needs_at[i + 1]]` (looked up by name
    /// once, not each time one of the build's jobs goes to the core).
    needs: Vec<u32>,
    needs_at: Vec<usize>,
    dependents: Vec<Vec<u32>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Build {
    id: u64,
    tenant: String,
    no_cache: bool,
    on_error: OnError,
    max_parallel: Option<u32>,
    queue: Option<String>,
    /// Jobs ready to run but held back by `max_parallel`, in order.
    held: VecDeque<u32>,
    /// Jobs the core holds for this build (queued or running there).
    in_core: u32,
    /// Per job: expected milliseconds on the longest path from it to the
    /// build's end, itself included (critical-path order).
    path: Vec<u64>,
    /// The spec, checked, and its graph by index: shared with the other
    /// builds submitted with the same spec (and so written once in a
    /// snapshot, apart from the builds: see `Solver`'s `Serialize`).
    #[serde(skip)]
    plan: Arc<Plan>,
    /// Needs not yet succeeded, per job.
    pending: Vec<u32>,
    jobs: Vec<JobRec>,
    pub(crate) state: BuildState,
    cancelled: bool,
    /// A job failed: nothing new starts.
    stopping: bool,
    pub(crate) events: Vec<BuildEvent>,
    /// How many of its jobs' ends it has recorded, by state (a job that
    /// ran again after a retry counts again): for the coordinator's
    /// metrics, without a walk over the jobs.
    pub(crate) ended: BTreeMap<JobState, u64>,
    gangs: BTreeMap<String, GangRec>,
    /// Jobs rerun by a gang restart: they run even when a result is cached.
    rerun: std::collections::BTreeSet<u32>,
    /// Every job before this index was over when last looked at (see
    /// `all_over`).
    over_before: usize,
    /// When it last finished (a retried build finishes again).
    pub(crate) finished_at: Option<Millis>,
}

/// The build's gangs, checked: members agree on their settings, there are
/// at least `min_available` of them, and none needs another, even through
/// other jobs (they start together).
fn gangs(
    jobs: &[JobDef],
    index: &BTreeMap<String, u32>,
    dependents: &[Vec<u32>],
) -> Result<BTreeMap<String, GangRec>, String> {
    let mut gangs: BTreeMap<String, GangRec> = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(g) = &job.gang else { continue };
        if !valid_name(&g.name) {
            return Err(format!(
                "job {:?}: gang name {:?} must be letters, digits, '.', '_' or '-'",
                job.name, g.name
            ));
        }
        let rec = gangs.entry(g.name.clone()).or_insert_with(|| GangRec {
            members: Vec::new(),
            min_available: g.min_available,
            restart: g.restart,
            restarts: 0,
            instance: 0,
            ready: std::collections::BTreeSet::new(),
            sent: false,
            core_min: g.min_available,
        });
        if (rec.min_available, rec.restart) != (g.min_available, g.restart) {
            return Err(format!("gang {:?}: its jobs disagree on min_available or on_failure", g.name));
        }
        rec.members.push(i as u32);
    }
    // The first gang (by name) whose min_available is out of range.
    let bad_min = gangs
        .iter()
        .find(|(_, rec)| rec.min_available == 0 || rec.min_available as usize > rec.members.len());
    let stuck = if gangs.is_empty() { Vec::new() } else { gangs_stuck(jobs, dependents, &gangs) };
    // A gang one of whose jobs needs another of its jobs, directly or not,
    // never starts, so it is among the stuck ones: only those are searched,
    // in name order, before the first gang with a bad min_available (the
    // first mistake is the one named). The searches share a budget in
    // proportion to the build, so that a hostile build of many gangs costs
    // linear time; past it, the plainer message below names them.
    let mut budget = 8 * jobs.len() + 10_000;
    for name in stuck.iter().copied().take_while(|name| bad_min.is_none_or(|(bad, _)| name < &bad.as_str())) {
        match needed_member(jobs, index, &gangs[name].members, &mut budget) {
            Search::Found(d) => {
                return Err(format!(
                    "gang {name:?}: job {:?} is needed by another job of the gang (its jobs start together)",
                    jobs[d as usize].name
                ));
            }
            Search::None => {}
            Search::OutOfBudget => break,
        }
    }
    if let Some((name, rec)) = bad_min {
        return Err(format!(
            "gang {name:?}: min_available must be from 1 to its {} job(s), not {}",
            rec.members.len(),
            rec.min_available
        ));
    }
    if !stuck.is_empty() {
        // The first ten, in name order: enough to find the mistake.
        let mut names: Vec<String> = stuck.iter().take(10).map(|name| format!("{name:?}")).collect();
        if stuck.len() > names.len() {
            names.push(format!("and {} more", stuck.len() - names.len()));
        }
        return Err(format!(
            "gangs {} wait for each other: a job of one needs, directly or not, a job of another (a gang's \
             jobs start together, once all their needs are done)",
            names.join(", ")
        ));
    }
    Ok(gangs)
}

/// What a search for a gang's job needed by another of its jobs found.
enum Search {
    /// This member is needed by another, directly or not.
    Found(u32),
    /// No member is.
    None,
    /// The shared budget of visits ran out first.
    OutOfBudget,
}

/// One search from every member's needs: reaching a member means one member
/// needs another, directly or not. Each job visited takes one from `budget`.
fn needed_member(
    jobs: &[JobDef],
    index: &BTreeMap<String, u32>,
    members: &[u32],
    budget: &mut usize,
) -> Search {
    let member: std::collections::BTreeSet<u32> = members.iter().copied().collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut stack: Vec<u32> =
        members.iter().flat_map(|&m| jobs[m as usize].needs.iter().map(|n| index[n])).collect();
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        let Some(left) = budget.checked_sub(1) else { return Search::OutOfBudget };
        *budget = left;
        if member.contains(&d) {
            return Search::Found(d);
        }
        stack.extend(jobs[d as usize].needs.iter().map(|n| index[n]));
    }
    Search::None
}

/// The gangs that could never start, in name order. A gang goes on once all
/// its members' needs are done, so a gang one of whose jobs needs another
/// of its jobs never would, nor would two gangs that wait for each other (a
/// job of one needs, directly or not, a job of the other, and the other way
/// round, as in `a` (gang x), `b` (gang y), `c` needs `a` (gang y), `d`
/// needs `b` (gang x)): their builds would wait forever. Plays the build
/// out, in time linear in its size, jobs going on as their needs are done
/// and gangs once all their members' are, and names the gangs left waiting.
fn gangs_stuck<'a>(
    jobs: &[JobDef],
    dependents: &[Vec<u32>],
    gangs: &'a BTreeMap<String, GangRec>,
) -> Vec<&'a str> {
    let mut waiting: Vec<usize> = jobs.iter().map(|j| j.needs.len()).collect();
    // Members of each gang whose needs are done.
    let mut ready: BTreeMap<&str, usize> = BTreeMap::new();
    let mut needs_done: Vec<u32> = (0..jobs.len() as u32).filter(|&i| waiting[i as usize] == 0).collect();
    let mut over = Vec::new();
    while let Some(i) = needs_done.pop() {
        match &jobs[i as usize].gang {
            None => over.push(i),
            Some(g) => {
                let n = ready.entry(g.name.as_str()).or_insert(0);
                *n += 1;
                if *n == gangs[&g.name].members.len() {
                    over.extend(gangs[&g.name].members.iter().copied());
                }
            }
        }
        for j in over.drain(..) {
            for &d in &dependents[j as usize] {
                waiting[d as usize] -= 1;
                if waiting[d as usize] == 0 {
                    needs_done.push(d);
                }
            }
        }
    }
    gangs
        .iter()
        .filter(|(name, rec)| ready.get(name.as_str()).copied().unwrap_or(0) < rec.members.len())
        .map(|(name, _)| name.as_str())
        .collect()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

/// An empty plan: what a build read from a snapshot holds until its own
/// plan, written apart, is given back to it.
impl Default for Plan {
    fn default() -> Plan {
        Plan {
            spec: Arc::new(BuildSpec { name: String::new(), sources: Vec::new(), jobs: Vec::new() }),
            index: BTreeMap::new(),
            needs: Vec::new(),
            needs_at: Vec::new(),
            dependents: Vec::new(),
        }
    }
}

impl Plan {
    /// The spec it was made from.
    pub(crate) fn spec(&self) -> &Arc<BuildSpec> {
        &self.spec
    }

    /// Has the build a job of this name?
    pub(crate) fn has_job(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Was this plan made from `spec` itself (not merely an equal one)?
    pub(crate) fn is_of(&self, spec: &Arc<BuildSpec>) -> bool {
        Arc::ptr_eq(&self.spec, spec)
    }

    /// Checks a spec (everything that depends on it alone) and indexes its
    /// graph.
    fn new(spec: Arc<BuildSpec>) -> Result<Plan, String> {
        if spec.jobs.is_empty() {
            return Err("the build has no jobs".into());
        }
        if spec.jobs.len() > MAX_JOBS {
            return Err(format!("the build has {} jobs; at most 100,000 are allowed", spec.jobs.len()));
        }
        for s in &spec.sources {
            if !valid_path(&s.path) {
                return Err(format!("source path {:?} is not a clean relative path", s.path));
            }
        }
        if !spec.sources.windows(2).all(|w| w[0].path < w[1].path) {
            return Err("source paths must be sorted and unique".into());
        }
        let mut index = BTreeMap::new();
        let mut needs = Vec::new();
        let mut needs_at = Vec::with_capacity(spec.jobs.len() + 1);
        needs_at.push(0);
        let mut dependents = vec![Vec::new(); spec.jobs.len()];
        // The last job that named each job as a need: a second mention by
        // the same job is a need listed twice.
        let mut named_by = vec![u32::MAX; spec.jobs.len()];
        for (i, job) in spec.jobs.iter().enumerate() {
            if !valid_name(&job.name) {
                return Err(format!("job name {:?} must be letters, digits, '.', '_' or '-'", job.name));
            }
            if job.commands.is_empty() {
                return Err(format!("job {:?} has no commands", job.name));
            }
            let mut twice = false;
            for need in &job.needs {
                // Needs must come earlier: that is what makes the graph acyclic.
                let Some(&d) = index.get(need) else {
                    return Err(format!(
                        "job {:?} needs {need:?}, which is not an earlier job of the build",
                        job.name
                    ));
                };
                twice |= std::mem::replace(&mut named_by[d as usize], i as u32) == i as u32;
                dependents[d as usize].push(i as u32);
                needs.push(d);
            }
            needs_at.push(needs.len());
            if index.insert(job.name.clone(), i as u32).is_some() {
                return Err(format!("two jobs are named {:?}", job.name));
            }
            if twice {
                return Err(format!("job {:?} lists a need twice", job.name));
            }
            if let Some(inputs) = &job.inputs {
                for path in inputs {
                    if spec.sources.binary_search_by(|s| s.path.as_str().cmp(path)).is_err() {
                        return Err(format!(
                            "job {:?} sees {path:?}, which is not a source of the build",
                            job.name
                        ));
                    }
                }
            }
        }
        Ok(Plan { spec, index, needs, needs_at, dependents })
    }
}

impl Build {
    /// Checks and accepts a submitted build. `known`: the plan of an
    /// earlier build, used if it was made from the very same spec (the
    /// same `Arc`), which saves checking it again.
    pub(crate) fn new(
        id: u64,
        req: SubmitRequest,
        now: Millis,
        durations: &BTreeMap<String, u64>,
        known: Option<&Arc<Plan>>,
    ) -> Result<Build, String> {
        let plan = match known {
            Some(plan) if plan.is_of(&req.build) => plan.clone(),
            _ => Arc::new(Plan::new(req.build)?),
        };
        let Plan { spec, index, dependents, .. } = &*plan;
        let gangs = gangs(&spec.jobs, index, dependents)?;
        let tenant = if req.tenant.is_empty() { "default".to_owned() } else { req.tenant };
        let pending = spec.jobs.iter().map(|j| j.needs.len() as u32).collect();
        let jobs = vec![
            JobRec {
                state: JobState::Queued,
                worker: None,
                run: None,
                attempts: 0,
                before: 0,
                exit_code: None,
                detail: String::new(),
                waiter: None,
                suspended: false,
                evicted: None,
                rewinds: 0,
                stages: BTreeMap::new(),
                earlier: None,
            };
            spec.jobs.len()
        ];
        // Needs come earlier, so a backward pass sees dependents first.
        let mut path = vec![0u64; spec.jobs.len()];
        for i in (0..spec.jobs.len()).rev() {
            let own = durations.get(&spec.jobs[i].name).copied().unwrap_or(DEFAULT_DURATION_MS);
            let after = dependents[i].iter().map(|&d| path[d as usize]).max().unwrap_or(0);
            path[i] = own.saturating_add(after);
        }
        if req.max_parallel == Some(0) {
            return Err("max_parallel must be at least 1".into());
        }
        // Every job ends once, between the build's first and last events:
        // room for that much at once (a job that runs adds its queued and
        // started events too, so most builds grow it twice more, not a
        // dozen times from empty).
        let events = Vec::with_capacity(jobs.len() + 2);
        let mut build = Build {
            id,
            tenant,
            no_cache: req.no_cache,
            on_error: req.on_error,
            max_parallel: req.max_parallel,
            queue: req.queue,
            held: VecDeque::new(),
            in_core: 0,
            path,
            plan,
            pending,
            jobs,
            state: BuildState::Queued,
            cancelled: false,
            stopping: false,
            events,
            ended: BTreeMap::new(),
            gangs,
            rerun: std::collections::BTreeSet::new(),
            over_before: 0,
            finished_at: None,
        };
        build.event(now, EventKind::BuildQueued { jobs: build.jobs.len() });
        Ok(build)
    }

    fn event(&mut self, now: Millis, kind: EventKind) {
        let ended = match kind {
            EventKind::JobFinished { state, .. } => Some(state),
            EventKind::JobSkipped { .. } => Some(JobState::Skipped),
            EventKind::JobCancelled { .. } => Some(JobState::Cancelled),
            _ => None,
        };
        if let Some(state) = ended {
            *self.ended.entry(state).or_default() += 1;
        }
        let seq = self.events.len() as u64;
        self.events.push(BuildEvent { seq, at: now.0, kind });
    }

    /// The build's plan, for a later build with the same spec.
    pub(crate) fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Gives a build read from a snapshot its plan back.
    pub(crate) fn set_plan(&mut self, plan: Arc<Plan>) {
        self.plan = plan;
    }

    fn name_of(&self, i: u32) -> String {
        self.plan.spec.jobs[i as usize].name.clone()
    }

    pub(crate) fn def(&self, i: u32) -> &JobDef {
        &self.plan.spec.jobs[i as usize]
    }

    /// Job `i`'s needs, by index, in the order of its `needs`.
    pub(crate) fn needs_of(&self, i: u32) -> &[u32] {
        &self.plan.needs[self.plan.needs_at[i as usize]..self.plan.needs_at[i as usize + 1]]
    }

    /// Should job `i` ignore cached results (the build's choice, or a gang
    /// restart)?
    pub(crate) fn must_run(&self, i: u32) -> bool {
        self.no_cache || self.rerun.contains(&i)
    }

    /// After gang member `i` failed (or lost its run, `what` says which):
    /// if its gang restarts on failure and has restarts left, every member
    /// goes back to the queue (cancelling those the core holds) and runs
    /// again, cache or not. Returns the core waiters to cancel and the
    /// members to schedule; `None` if the failure stands.
    pub(crate) fn restart_gang(&mut self, i: u32, what: &str, now: Millis) -> Option<GangRestart> {
        let name = self.def(i).gang.as_ref()?.name.clone();
        let gang = self.gangs.get_mut(&name)?;
        if !gang.restart || gang.restarts >= MAX_GANG_RESTARTS || self.stopping || self.cancelled {
            return None;
        }
        gang.restarts += 1;
        let restarts = gang.restarts;
        let member = self.name_of(i);
        let reason = format!(
            "gang {name} restarts whole ({restarts} of {MAX_GANG_RESTARTS} restarts): its member {member} {what}"
        );
        let mut cancel = Vec::new();
        let mut again = self.send_gang_again(&name, &mut cancel, Some(&reason), now);
        self.order(&mut again);
        Some((cancel, again))
    }

    /// The runs of the other members of job `i`'s gang, if it restarts on
    /// failure: the runs this build saw them start (the caller asks the
    /// core which of those still run).
    pub(crate) fn restarting_partner_runs(&self, i: u32) -> Vec<u64> {
        let Some(g) = &self.def(i).gang else { return Vec::new() };
        let Some(gang) = self.gangs.get(&g.name).filter(|gang| gang.restart) else { return Vec::new() };
        gang.members
            .iter()
            .filter(|&&m| m != i && self.jobs[m as usize].state == JobState::Running)
            .filter_map(|&m| self.jobs[m as usize].run)
            .collect()
    }

    /// Sends gang `name` back whole, as a new instance: every member's core
    /// waiter is cancelled (into `cancel`), every member not waiting for a
    /// need goes back to the queue and runs again, cache or not, and those
    /// whose needs are done are returned, to be scheduled (they gather
    /// until the whole gang is ready). A member still waiting for a need
    /// joins the new instance when the need is done.
    fn send_gang_again(
        &mut self,
        name: &str,
        cancel: &mut Vec<(JobId, WaiterId)>,
        reason: Option<&str>,
        now: Millis,
    ) -> Vec<u32> {
        let Some(gang) = self.gangs.get_mut(name) else { return Vec::new() };
        gang.instance += 1;
        gang.sent = false;
        gang.ready.clear();
        let (members, restart) = (gang.members.clone(), gang.restart);
        // Whose success its dependents counted (see `unblocked_by`): each
        // member's own, or, in a gang that restarts, all of them at once.
        // They wait for it again: its next success counts once more.
        let all_succeeded = members.iter().all(|&m| self.jobs[m as usize].state.is_success());
        let mut again = Vec::new();
        for m in members {
            if let Some(w) = self.take_waiter(m) {
                cancel.push((JobId::from(self.plan.spec.jobs[m as usize].id), w));
            }
            let rec = &mut self.jobs[m as usize];
            if rec.state == JobState::Queued && self.pending[m as usize] > 0 {
                continue; // not started yet: it will join the new gang when ready
            }
            if if restart { all_succeeded } else { rec.state.is_success() } {
                for &d in &self.plan.dependents[m as usize] {
                    self.pending[d as usize] += 1;
                }
            }
            let rec = &mut self.jobs[m as usize];
            rec.state = JobState::Queued;
            rec.retire_run();
            rec.exit_code = None;
            rec.detail.clear();
            let attempts = rec.attempts;
            self.rerun.insert(m);
            let job = self.name_of(m);
            self.event(now, EventKind::JobRequeued { job, attempts, reason: reason.map(str::to_owned) });
            if self.pending[m as usize] == 0 {
                again.push(m);
            }
        }
        // Held back by `max_parallel`, a dependent that waits for a member
        // again is held anew once the member is done.
        let pending = &self.pending;
        self.held.retain(|&h| pending[h as usize] == 0);
        again
    }

    /// The sources job `i` sees.
    pub(crate) fn sources_of(&self, i: u32) -> Vec<SourceFile> {
        match &self.def(i).inputs {
            None => self.plan.spec.sources.clone(),
            Some(inputs) => {
                let seen: std::collections::BTreeSet<&str> = inputs.iter().map(String::as_str).collect();
                self.plan.spec.sources.iter().filter(|s| seen.contains(s.path.as_str())).cloned().collect()
            }
        }
    }

    /// Jobs with no needs.
    pub(crate) fn ready_roots(&self) -> Vec<u32> {
        let mut ready: Vec<u32> =
            (0..self.jobs.len() as u32).filter(|&i| self.pending[i as usize] == 0).collect();
        self.order(&mut ready);
        ready
    }

    /// Puts jobs handed to the core together in the order the core would
    /// pick them (priority, then the longest remaining path), since an idle
    /// worker takes the first one at once.
    fn order(&self, jobs: &mut [u32]) {
        jobs.sort_by_key(|&i| {
            (std::cmp::Reverse(self.def(i).priority), std::cmp::Reverse(self.path[i as usize]), i)
        });
    }

    /// Whose job this build's jobs are, and the queue it names for them.
    pub(crate) fn owner(&self) -> (&str, Option<&str>) {
        (&self.tenant, self.queue.as_deref())
    }

    /// The core's view of a job.
    pub(crate) fn core_spec(&self, i: u32) -> JobSpec {
        let def = self.def(i);
        JobSpec {
            id: def.id.into(),
            tenant: self.tenant.clone(),
            deps: self.needs_of(i).iter().map(|&d| JobId::from(self.def(d).id)).collect(),
            request: Request {
                slots: 1,
                cpu: def.cpu_millis,
                memory: def.memory,
                tokens: def.tokens.clone(),
            },
            exclusive: def.exclusive.clone(),
            labels: def.labels.clone(),
            priority: def.priority,
            path: self.path[i as usize],
            max_attempts: def.retries.saturating_add(1),
            queue: self.queue.clone(),
            gang: def.gang.as_ref().map(|g| {
                let rec = &self.gangs[&g.name];
                drover_core::GangSpec {
                    id: format!("{}/{}#{}", self.id, g.name, rec.instance),
                    min_available: rec.core_min,
                }
            }),
        }
    }

    /// Whether job `i` belongs to a gang.
    pub(crate) fn in_gang(&self, i: u32) -> bool {
        self.def(i).gang.is_some()
    }

    /// Gang member `i`'s needs are done: it waits for the rest of its gang.
    pub(crate) fn gang_ready(&mut self, i: u32) {
        if let Some(g) = &self.plan.spec.jobs[i as usize].gang
            && let Some(rec) = self.gangs.get_mut(&g.name)
        {
            rec.ready.insert(i);
        }
    }

    /// Gangs whose every member is ready or over (and some are ready):
    /// their ready members go on together, now. Each is marked sent.
    pub(crate) fn take_ready_gangs(&mut self) -> Vec<GangRelease> {
        let mut out = Vec::new();
        for (name, rec) in &mut self.gangs {
            let complete =
                rec.members.iter().all(|m| rec.ready.contains(m) || self.jobs[*m as usize].state.is_final());
            if rec.sent || rec.ready.is_empty() || !complete {
                continue;
            }
            rec.sent = true;
            out.push(GangRelease {
                name: name.clone(),
                members: std::mem::take(&mut rec.ready).into_iter().collect(),
            });
        }
        out
    }

    /// Whether job `i` was cancelled or skipped: it will not run.
    pub(crate) fn called_off(&self, i: u32) -> bool {
        matches!(self.jobs[i as usize].state, JobState::Cancelled | JobState::Skipped)
    }

    /// Puts a released gang's `members` back, ready, to be released again
    /// later (see `Solver::release_gangs`).
    pub(crate) fn hold_gang(&mut self, name: &str, members: &[u32]) {
        if let Some(rec) = self.gangs.get_mut(name) {
            rec.sent = false;
            rec.ready.extend(members.iter().copied());
        }
    }

    /// The gang's `min_available`, and how many of its members already
    /// succeeded.
    pub(crate) fn gang_needs(&self, name: &str) -> (u32, u32) {
        let rec = &self.gangs[name];
        let done = rec.members.iter().filter(|&&m| self.jobs[m as usize].state.is_success()).count();
        (rec.min_available, done as u32)
    }

    /// Sets the `min_available` the core gets for this gang instance.
    pub(crate) fn set_core_min(&mut self, name: &str, min: u32) {
        if let Some(rec) = self.gangs.get_mut(name) {
            rec.core_min = min;
        }
    }

    /// Whether `max_parallel` lets one more job go to the core.
    pub(crate) fn has_room(&self) -> bool {
        self.max_parallel.is_none_or(|m| self.in_core < m)
    }

    /// What the tests hold of every build after every input: `in_core`
    /// counts the jobs with a core waiter, and no job waits in `held`
    /// while there is room for it.
    #[cfg(test)]
    pub(crate) fn check_room(&self) -> Result<(), String> {
        let waiting = self.jobs.iter().filter(|rec| rec.waiter.is_some()).count();
        if waiting != self.in_core as usize {
            return Err(format!("build {}: {} jobs in the core, counted {}", self.id, waiting, self.in_core));
        }
        let stuck = self.held.iter().find(|&&i| {
            let rec = &self.jobs[i as usize];
            rec.state == JobState::Queued && rec.waiter.is_none() && self.pending[i as usize] == 0
        });
        match stuck {
            Some(&i) if self.has_room() && !self.state.is_final() => {
                Err(format!("build {}: {} held back although it has room", self.id, self.name_of(i)))
            }
            _ => Ok(()),
        }
    }

    /// Holds a ready job back until the build has room.
    pub(crate) fn hold(&mut self, i: u32) {
        self.held.push_back(i);
    }

    /// The next held job that may go to the core now, if any.
    pub(crate) fn next_held(&mut self) -> Option<u32> {
        while self.has_room() {
            let i = self.held.pop_front()?;
            let rec = &self.jobs[i as usize];
            // Skipped or cancelled while it waited, or waiting again for a
            // need whose output was lost.
            if rec.state == JobState::Queued && rec.waiter.is_none() && self.pending[i as usize] == 0 {
                return Some(i);
            }
        }
        None
    }

    /// Marks the running jobs (or the one named) suspended or resumed;
    /// returns their (worker, run, whether the worker is to be told: not
    /// while an eviction holds the run too). A named job must be running
    /// (and, to resume, suspended).
    pub(crate) fn suspend(
        &mut self,
        job: Option<&str>,
        resume: bool,
        now: Millis,
    ) -> Result<Vec<(u64, u64, bool)>, String> {
        let targets: Vec<u32> = match job {
            Some(name) => {
                let &i = self
                    .plan
                    .index
                    .get(name)
                    .ok_or_else(|| format!("build {} has no job {name:?}", self.id))?;
                let rec = &self.jobs[i as usize];
                if rec.state != JobState::Running || rec.run.is_none() {
                    return Err(format!("job {name} is {}, not running", rec.state));
                }
                if resume && !rec.suspended && rec.evicted.is_some() {
                    return Err(format!(
                        "job {name} was suspended by an eviction; it resumes once its worker has room"
                    ));
                }
                if resume && !rec.suspended {
                    return Err(format!("job {name} is not suspended"));
                }
                if !resume && rec.suspended {
                    return Err(format!("job {name} is already suspended"));
                }
                vec![i]
            }
            None => (0..self.jobs.len() as u32)
                .filter(|&i| {
                    let rec = &self.jobs[i as usize];
                    rec.state == JobState::Running && rec.run.is_some() && rec.suspended == resume
                })
                .collect(),
        };
        if targets.is_empty() {
            // Say what there is: a build whose running jobs are all
            // suspended already is not a build with nothing running.
            let (running, suspended) = self
                .jobs
                .iter()
                .filter(|rec| rec.state == JobState::Running && rec.run.is_some())
                .fold((0, 0), |(r, s), rec| (r + 1, s + usize::from(rec.suspended)));
            return Err(match (resume, running) {
                (_, 0) => format!("build {} has no job running", self.id),
                (true, _) => format!("build {} has no suspended job ({running} running)", self.id),
                (false, _) => {
                    format!("build {}: its {suspended} running job(s) are suspended already", self.id)
                }
            });
        }
        let mut runs = Vec::new();
        for i in targets {
            let rec = &mut self.jobs[i as usize];
            rec.suspended = !resume;
            // A run an eviction also holds stays stopped until the core
            // resumes it.
            if let (Some((worker, _)), Some(run)) = (&rec.worker, rec.run) {
                runs.push((*worker, run, rec.evicted.is_none()));
            }
            let job = self.name_of(i);
            self.event(
                now,
                if resume {
                    EventKind::JobResumed { job }
                } else {
                    EventKind::JobSuspended { job, evicted_by: None }
                },
            );
        }
        Ok(runs)
    }

    /// Another build suspended (or resumed) `run`, which job `i` shares:
    /// this build sees it held (or let go) too, and may resume it. Whether
    /// that changed anything.
    pub(crate) fn shared_suspension(&mut self, i: u32, run: u64, suspended: bool, now: Millis) -> bool {
        let rec = &mut self.jobs[i as usize];
        if rec.state != JobState::Running || rec.run != Some(run) || rec.suspended == suspended {
            return false;
        }
        rec.suspended = suspended;
        let job = self.name_of(i);
        let kind = match suspended {
            true => EventKind::JobSuspended { job, evicted_by: None },
            false => EventKind::JobResumed { job },
        };
        self.event(now, kind);
        true
    }

    /// Whether `drover suspend` holds job `i`'s run `run`.
    pub(crate) fn holds_suspended(&self, i: u32, run: u64) -> bool {
        let rec = &self.jobs[i as usize];
        rec.suspended && rec.run == Some(run)
    }

    /// Job `i`'s run was suspended by an eviction for job `by`.
    pub(crate) fn evicted(&mut self, i: u32, by: String, now: Millis) {
        self.jobs[i as usize].evicted = Some(by.clone());
        let job = self.name_of(i);
        self.event(now, EventKind::JobSuspended { job, evicted_by: Some(by) });
    }

    /// The core resumed job `i`'s run after an eviction; whether its
    /// processes may continue (not if `drover suspend` holds them too).
    pub(crate) fn evict_resumed(&mut self, i: u32, now: Millis) -> bool {
        let rec = &mut self.jobs[i as usize];
        rec.evicted = None;
        let held = rec.suspended;
        let job = self.name_of(i);
        self.event(now, EventKind::JobResumed { job });
        !held
    }

    /// Takes job `i`'s core waiter, if the core holds it for this build.
    fn take_waiter(&mut self, i: u32) -> Option<WaiterId> {
        let waiter = self.jobs[i as usize].waiter.take();
        if waiter.is_some() {
            self.in_core -= 1;
        }
        waiter
    }

    pub(crate) fn queued(&mut self, i: u32, waiter: WaiterId, now: Millis) {
        self.jobs[i as usize].waiter = Some(waiter);
        self.in_core += 1;
        let job = self.name_of(i);
        self.event(now, EventKind::JobQueued { job });
    }

    pub(crate) fn started(
        &mut self,
        i: u32,
        worker: u64,
        run: u64,
        attempt: u32,
        worker_name: Arc<str>,
        now: Millis,
    ) {
        let rec = &mut self.jobs[i as usize];
        // Joined to this run before the core's assignment was applied
        // (`Solver::hand_to_core`): it started once.
        if rec.state == JobState::Running && rec.run == Some(run) {
            return;
        }
        rec.state = JobState::Running;
        rec.suspended = false;
        rec.evicted = None;
        let attempt = rec.before + attempt;
        let name = worker_name.to_string();
        // The run before goes to the earlier ones, its log still readable.
        if rec.run.is_some_and(|r| r != run) {
            rec.keep_earlier_run();
        }
        rec.worker = Some((worker, worker_name));
        rec.run = Some(run);
        rec.attempts = attempt;
        if self.state == BuildState::Queued {
            self.state = BuildState::Running;
        }
        let job = self.name_of(i);
        self.event(now, EventKind::JobStarted { job, worker: name, attempt });
    }

    /// Whether job `i` may run again after a failed run: it is still
    /// waited for (not called off) and the build goes on.
    pub(crate) fn may_rerun(&self, i: u32) -> bool {
        !self.stopping && !self.cancelled && self.jobs[i as usize].waiter.is_some()
    }

    /// Job `i`'s run failed after `attempts` attempts and the job runs
    /// again (`retry_on_failure`): it leaves its core waiter (the caller
    /// hands it to the core again) and is queued, saying why.
    pub(crate) fn failed_run(&mut self, i: u32, attempts: u32, reason: &str, now: Millis) {
        self.take_waiter(i);
        self.requeued(i, attempts, reason, now);
    }

    /// The attempt job `i`'s latest run was in the core (not counting
    /// the runs before a `drover retry`).
    pub(crate) fn attempts(&self, i: u32) -> u32 {
        let rec = &self.jobs[i as usize];
        rec.attempts - rec.before
    }

    /// Job `i` goes back to the queue after `attempts` attempts in the
    /// core, for `reason`.
    pub(crate) fn requeued(&mut self, i: u32, attempts: u32, reason: &str, now: Millis) {
        let attempts = self.jobs[i as usize].before + attempts;
        self.jobs[i as usize].state = JobState::Queued;
        self.jobs[i as usize].evicted = None;
        let job = self.name_of(i);
        self.event(now, EventKind::JobRequeued { job, attempts, reason: Some(reason.to_owned()) });
    }

    pub(crate) fn finished(
        &mut self,
        i: u32,
        state: JobState,
        exit_code: Option<i32>,
        detail: String,
        now: Millis,
    ) {
        self.take_waiter(i);
        let rec = &mut self.jobs[i as usize];
        rec.state = state;
        rec.suspended = false;
        rec.evicted = None;
        rec.exit_code = exit_code;
        rec.detail = detail.clone();
        if self.state == BuildState::Queued {
            self.state = BuildState::Running;
        }
        let job = self.name_of(i);
        self.event(now, EventKind::JobFinished { job, state, exit_code, detail });
    }

    /// After job `i` succeeded: the dependents whose needs are now all done.
    pub(crate) fn unblocked_by(&mut self, i: u32) -> Vec<u32> {
        // The output of a gang that restarts on failure is final only once
        // every member has succeeded: its dependents wait for all of them.
        let sources: Vec<u32> = match &self.plan.spec.jobs[i as usize].gang {
            Some(g) if self.gangs[&g.name].restart => {
                let members = &self.gangs[&g.name].members;
                if !members.iter().all(|&m| self.jobs[m as usize].state.is_success()) {
                    return Vec::new();
                }
                members.clone()
            }
            _ => vec![i],
        };
        let mut ready = Vec::new();
        for &d in sources.iter().flat_map(|&s| self.plan.dependents[s as usize].iter()) {
            self.pending[d as usize] -= 1;
            let rec = &self.jobs[d as usize];
            if self.pending[d as usize] == 0
                && !self.stopping
                && rec.state == JobState::Queued
                && rec.waiter.is_none()
            {
                ready.push(d);
            }
        }
        self.order(&mut ready);
        ready
    }

    /// After job `i` failed: its dependents are skipped; with on-error
    /// `quit` so is everything else not yet running, and with `terminate`
    /// the running jobs are cancelled too. Returns the core waiters to
    /// cancel.
    pub(crate) fn stop_after_failure(&mut self, i: u32, now: Millis) -> Vec<(JobId, WaiterId)> {
        let failed = self.name_of(i);
        if self.on_error != OnError::Continue {
            self.stopping = true;
        }
        let mut downstream = vec![false; self.jobs.len()];
        let mut stack = vec![i];
        while let Some(j) = stack.pop() {
            for &d in &self.plan.dependents[j as usize] {
                if !downstream[d as usize] {
                    downstream[d as usize] = true;
                    stack.push(d);
                }
            }
        }
        let mut cancel = Vec::new();
        for j in 0..self.jobs.len() as u32 {
            let state = self.jobs[j as usize].state;
            let skip =
                state == JobState::Queued && (downstream[j as usize] || self.on_error != OnError::Continue);
            let terminate = state == JobState::Running && self.on_error == OnError::Terminate;
            if !skip && !terminate {
                continue;
            }
            if let Some(w) = self.take_waiter(j) {
                cancel.push((JobId::from(self.plan.spec.jobs[j as usize].id), w));
            }
            let job = self.name_of(j);
            let rec = &mut self.jobs[j as usize];
            if terminate {
                rec.state = JobState::Cancelled;
                rec.detail = format!("terminated after {failed} failed");
                self.event(now, EventKind::JobCancelled { job });
                continue;
            }
            rec.state = JobState::Skipped;
            let reason = if downstream[j as usize] {
                format!("needs {failed}, which failed")
            } else {
                format!("the build stopped after {failed} failed")
            };
            rec.detail = reason.clone();
            self.event(now, EventKind::JobSkipped { job, reason });
        }
        cancel
    }

    /// Puts a finished build's failed, skipped and cancelled jobs back in
    /// the queue (attempt counts are kept), with every job that succeeded but
    /// whose output is gone (`available` says no: no live worker and no
    /// shared cache holds it) if a job going back needs it, directly or
    /// through others going back; returns those whose needs are all done.
    pub(crate) fn retry(
        &mut self,
        now: Millis,
        available: impl Fn(&JobDef) -> bool,
    ) -> Result<Vec<u32>, String> {
        match self.state {
            BuildState::Succeeded => return Err(format!("build {} succeeded: nothing to retry", self.id)),
            s if !s.is_final() => {
                return Err(format!("build {} is still {s}: retry it once it ends", self.id));
            }
            _ => {}
        }
        // A gang that restarts on failure reruns whole: its output counts
        // only when every member succeeded in one go.
        for gang in self.gangs.values_mut() {
            gang.sent = false;
            gang.ready.clear();
            if gang.restart && gang.members.iter().any(|&m| !self.jobs[m as usize].state.is_success()) {
                for &m in &gang.members {
                    self.jobs[m as usize].state = JobState::Failed;
                    self.rerun.insert(m);
                }
            }
        }
        // What goes back: every job that did not succeed, and, upwards from
        // those, each need whose output is gone.
        let mut again: Vec<bool> = self.jobs.iter().map(|rec| !rec.state.is_success()).collect();
        let mut stack: Vec<u32> = (0..self.jobs.len() as u32).filter(|&i| again[i as usize]).collect();
        while let Some(i) = stack.pop() {
            for need in &self.plan.spec.jobs[i as usize].needs {
                let n = self.plan.index[need];
                if !again[n as usize] && !available(&self.plan.spec.jobs[n as usize]) {
                    again[n as usize] = true;
                    stack.push(n);
                }
            }
        }
        let mut jobs = 0;
        for (rec, again) in self.jobs.iter_mut().zip(again) {
            if again {
                rec.state = JobState::Queued;
                rec.exit_code = None;
                rec.detail.clear();
                rec.rewinds = 0;
                // Its runs from here on count on from those before, so
                // that each attempt's log keeps its own number.
                rec.before = rec.attempts;
                jobs += 1;
            }
        }
        for (i, def) in self.plan.spec.jobs.iter().enumerate() {
            self.pending[i] = def
                .needs
                .iter()
                .filter(|n| !self.jobs[self.plan.index[*n] as usize].state.is_success())
                .count() as u32;
        }
        self.held.clear();
        self.stopping = false;
        self.cancelled = false;
        self.state = BuildState::Running;
        self.event(now, EventKind::BuildRetried { jobs });
        let mut ready: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|&i| self.jobs[i as usize].state == JobState::Queued && self.pending[i as usize] == 0)
            .collect();
        self.order(&mut ready);
        Ok(ready)
    }

    /// Whether one of `lost` is the output of a need of job `i`.
    pub(crate) fn lost_a_need(&self, i: u32, lost: &[JobId]) -> bool {
        self.needs_of(i).iter().any(|&n| lost.contains(&JobId::from(self.def(n).id)))
    }

    /// A run of job `i` lost inputs none of which is a need of `i` here: it
    /// read another build's copy of a need (the same work under other
    /// limits, so another ID). `i` leaves that run, back to queued, and
    /// goes again on its own (the caller schedules it once the run's end is
    /// in): returns its core waiter to cancel. `None` if a lost input is
    /// `i`'s own (see [`Build::rewind`]), or the build stops anyway.
    pub(crate) fn leave_foreign_loss(
        &mut self,
        i: u32,
        lost: &[JobId],
        now: Millis,
    ) -> Option<(JobId, WaiterId)> {
        if self.stopping || self.cancelled || self.jobs[i as usize].rewinds >= MAX_REWINDS {
            return None;
        }
        // A gang member does not leave its gang's run alone.
        if self.in_gang(i) || self.lost_a_need(i, lost) {
            return None;
        }
        // Only a job in the run leaves it.
        self.jobs[i as usize].waiter?;
        self.jobs[i as usize].rewinds += 1;
        let reason = "its run read another build's copy of an input, which was lost; it runs again";
        self.out_of_its_run(i, reason, now)
    }

    /// Job `i` leaves its run (its core waiter, returned if it had one, is
    /// for the caller to cancel) and is queued again, for `reason`.
    fn out_of_its_run(&mut self, i: u32, reason: &str, now: Millis) -> Option<(JobId, WaiterId)> {
        let waiter = self.take_waiter(i).map(|w| (JobId::from(self.def(i).id), w));
        let rec = &mut self.jobs[i as usize];
        rec.state = JobState::Queued;
        rec.retire_run();
        let (job, attempts) = (self.name_of(i), self.jobs[i as usize].attempts);
        self.event(now, EventKind::JobRequeued { job, attempts, reason: Some(reason.to_owned()) });
        waiter
    }

    /// Job `i`'s run could not get the outputs of `lost` (needs whose
    /// outputs no live worker and not the shared cache could give: their
    /// workers are gone). Those needs go back to the queue (unless another
    /// loss sent them back already), with every need of theirs whose output
    /// is gone too (`available` says no), and run again, cache or not; job
    /// `i` and the other dependents of what goes back that the core holds
    /// but has not started wait for them again. A gang among those (`i`'s,
    /// or one with a member not started that needs what goes back) goes
    /// back whole, as a new instance: its running members are called off,
    /// and it starts together again once its needs are done. Nothing counts
    /// as a failure, an attempt or a gang restart. Returns the core waiters
    /// to cancel and the jobs to schedule; `None` if the failure stands: no
    /// lost output is a need of `i`, a gang member's output would go back
    /// (it cannot run alone), the build is stopping, or `i` already went
    /// back [`MAX_REWINDS`] times.
    pub(crate) fn rewind(
        &mut self,
        i: u32,
        lost: &[JobId],
        available: impl Fn(&JobDef) -> bool,
        now: Millis,
    ) -> Option<Rewind> {
        if self.stopping || self.cancelled || self.jobs[i as usize].rewinds >= MAX_REWINDS {
            return None;
        }
        let lost_needs: Vec<u32> = self
            .needs_of(i)
            .iter()
            .copied()
            .filter(|&n| lost.contains(&JobId::from(self.def(n).id)))
            .collect();
        // A lost need that did not succeed is on its way already (another
        // job's loss sent it back): `i` only waits for it, unless that
        // rebuild is over and failed.
        if lost_needs.is_empty()
            || lost_needs.iter().any(|&n| {
                let state = self.jobs[n as usize].state;
                !state.is_success() && !matches!(state, JobState::Queued | JobState::Running)
            })
        {
            return None;
        }
        let mut again = vec![false; self.jobs.len()];
        // The lost needs, and any other need of `i` whose output is gone
        // too (its worker was lost since): all of them are built again in
        // one round, not one round (and one rewind of `i`) each.
        let mut stack: Vec<u32> = self
            .needs_of(i)
            .iter()
            .copied()
            .filter(|&n| self.jobs[n as usize].state.is_success())
            .filter(|&n| lost_needs.contains(&n) || !available(self.def(n)))
            .collect();
        for &n in &stack {
            again[n as usize] = true;
        }
        while let Some(j) = stack.pop() {
            for &n in self.needs_of(j) {
                if !again[n as usize] && self.jobs[n as usize].state.is_success() && !available(self.def(n)) {
                    again[n as usize] = true;
                    stack.push(n);
                }
            }
        }
        let back: Vec<u32> = (0..self.jobs.len() as u32).filter(|&j| again[j as usize]).collect();
        // Gangs go to the core whole: a gang member's output cannot be
        // built again alone, so a loss of one keeps the failure.
        if back.iter().any(|&j| self.in_gang(j)) {
            return None;
        }
        // A gang that waits on what goes back goes back whole, as a new
        // instance (see `send_gang_again`): `i`'s own, and one with a member
        // not started yet that needs what goes back (a running member has
        // its inputs already).
        let gangs: std::collections::BTreeSet<String> = std::iter::once(i)
            .chain(back.iter().flat_map(|&j| self.plan.dependents[j as usize].iter().copied()))
            .filter(|&d| d == i || self.jobs[d as usize].state == JobState::Queued)
            .filter_map(|d| self.def(d).gang.as_ref().map(|g| g.name.clone()))
            .collect();
        self.jobs[i as usize].rewinds += 1;
        let mut cancel = Vec::new();
        let mut waits = vec![i];
        for &j in &back {
            let rec = &mut self.jobs[j as usize];
            rec.state = JobState::Queued;
            rec.exit_code = None;
            rec.detail.clear();
            self.rerun.insert(j);
            for k in 0..self.plan.dependents[j as usize].len() {
                let d = self.plan.dependents[j as usize][k];
                self.pending[d as usize] += 1;
                let rec = &self.jobs[d as usize];
                if rec.state == JobState::Queued && rec.waiter.is_some() {
                    waits.push(d);
                }
            }
        }
        // Held back by `max_parallel`, a dependent now waits for its need
        // again: it is held anew once the need is done.
        let pending = &self.pending;
        self.held.retain(|&h| pending[h as usize] == 0);
        waits.sort_unstable();
        waits.dedup();
        for d in waits {
            let reason = if d == i {
                "an input's output is gone (its worker was lost, or evicted it); it waits for it to be built again"
            } else {
                "waits for a need whose output was lost to be built again"
            };
            cancel.extend(self.out_of_its_run(d, reason, now));
        }
        for &j in &back {
            let (job, attempts) = (self.name_of(j), self.jobs[j as usize].attempts);
            let reason =
                Some("its output is gone (its worker was lost, or evicted it); built again".to_owned());
            self.event(now, EventKind::JobRequeued { job, attempts, reason });
        }
        let mut ready: Vec<u32> = back.into_iter().filter(|&j| self.pending[j as usize] == 0).collect();
        let reason = "its gang waits for a need whose output was lost to be built again";
        for gang in gangs {
            ready.extend(self.send_gang_again(&gang, &mut cancel, Some(reason), now));
        }
        self.order(&mut ready);
        Some((cancel, ready))
    }

    /// Cancels every job not yet over. Returns the core waiters to cancel.
    pub(crate) fn cancel_all(&mut self, now: Millis) -> Vec<(JobId, WaiterId)> {
        self.cancelled = true;
        let mut cancel = Vec::new();
        for j in 0..self.jobs.len() as u32 {
            if self.jobs[j as usize].state.is_final() {
                continue;
            }
            if let Some(w) = self.take_waiter(j) {
                cancel.push((JobId::from(self.plan.spec.jobs[j as usize].id), w));
            }
            self.jobs[j as usize].state = JobState::Cancelled;
            let job = self.name_of(j);
            self.event(now, EventKind::JobCancelled { job });
        }
        cancel
    }

    /// Ends the build if every job is over; true if it just ended.
    pub(crate) fn finish_if_done(&mut self, now: Millis) -> bool {
        if self.state.is_final() || !self.all_over() {
            return false;
        }
        self.state = if self.cancelled {
            BuildState::Cancelled
        } else if self.jobs.iter().all(|j| j.state.is_success()) {
            BuildState::Succeeded
        } else {
            BuildState::Failed
        };
        let state = self.state;
        let mut counts = BTreeMap::new();
        for job in &self.jobs {
            *counts.entry(job.state).or_insert(0) += 1;
        }
        self.event(now, EventKind::BuildFinished { state, counts });
        self.finished_at = Some(now);
        true
    }

    /// Whether every job is over. Called after every job's end, so it must
    /// not scan the whole build each time (a 50,000-job build would pay
    /// quadratically): it moves a cursor past the jobs found over, and only
    /// once the cursor reaches the end checks the jobs before it again (a
    /// retry may have put some back).
    fn all_over(&mut self) -> bool {
        while self.jobs.get(self.over_before).is_some_and(|j| j.state.is_final()) {
            self.over_before += 1;
        }
        if self.over_before < self.jobs.len() {
            return false;
        }
        match self.jobs.iter().position(|j| !j.state.is_final()) {
            Some(i) => {
                self.over_before = i;
                false
            }
            None => true,
        }
    }

    /// The latest run of job `job` and the worker it went to (its ID and
    /// name).
    pub(crate) fn latest_run(&self, job: &str) -> Option<(u64, u64, &str)> {
        let rec = &self.jobs[*self.plan.index.get(job)? as usize];
        let (worker, name) = rec.worker.as_ref()?;
        Some((rec.run?, *worker, name))
    }

    /// The ID of job `job`, if the build has it.
    pub(crate) fn job_id(&self, job: &str) -> Option<drover_proto::Hash32> {
        Some(self.plan.spec.jobs[*self.plan.index.get(job)? as usize].id)
    }

    /// A job with ID `id` that ran in this build and succeeded: its name.
    pub(crate) fn succeeded_as(&self, id: drover_proto::Hash32) -> Option<&str> {
        let jobs = self.plan.spec.jobs.iter().zip(&self.jobs);
        jobs.filter(|(def, rec)| def.id == id && rec.state == JobState::Succeeded && rec.run.is_some())
            .map(|(def, _)| def.name.as_str())
            .next()
    }

    /// The run of job `job` that was its attempt `attempt` (run, worker,
    /// worker name), the latest or an earlier one kept.
    pub(crate) fn run_of_attempt(&self, job: &str, attempt: u32) -> Option<(u64, u64, &str)> {
        let rec = &self.jobs[*self.plan.index.get(job)? as usize];
        if rec.attempts == attempt {
            return self.latest_run(job);
        }
        let earlier = rec.earlier.as_deref()?;
        let e = earlier.iter().rev().find(|e| e.attempt == attempt)?;
        Some((e.run, e.worker, &e.name))
    }

    /// The attempts of job `job` whose logs may be had, oldest first.
    pub(crate) fn attempts_of(&self, job: &str) -> Vec<u32> {
        let Some(&i) = self.plan.index.get(job) else { return Vec::new() };
        let rec = &self.jobs[i as usize];
        let mut attempts: Vec<u32> = rec.earlier.iter().flat_map(|e| e.iter().map(|e| e.attempt)).collect();
        attempts.extend(rec.run.map(|_| rec.attempts));
        attempts
    }

    /// Job `i`'s run ended, its worker says, with these stage timings.
    pub(crate) fn ran_stages(&mut self, i: u32, stages: &BTreeMap<String, u64>) {
        self.jobs[i as usize].stages.clone_from(stages);
    }

    /// Why a queued job the core does not hold yet waits: its needs, or
    /// the build's `max_parallel`.
    fn outside_core(&self, i: u32) -> String {
        if self.held.contains(&i) {
            let limit = self.max_parallel.unwrap_or(0);
            return format!("held back by max_parallel ({limit} of the build's jobs at once)");
        }
        let waiting: Vec<&str> = self
            .def(i)
            .needs
            .iter()
            .filter(|n| !self.jobs[self.plan.index[*n] as usize].state.is_success())
            .map(String::as_str)
            .collect();
        match waiting.len() {
            0 => String::new(),
            n if n > LISTED_NEEDS => {
                format!("waits for {} and {} more", waiting[..LISTED_NEEDS].join(", "), n - LISTED_NEEDS)
            }
            _ => format!("waits for {}", waiting.join(", ")),
        }
    }

    /// How many of its jobs are in each state now (a walk over the jobs).
    pub(crate) fn job_states(&self) -> BTreeMap<JobState, u64> {
        let mut states = BTreeMap::new();
        for rec in &self.jobs {
            *states.entry(rec.state).or_default() += 1;
        }
        states
    }

    /// The build without its jobs' details.
    pub(crate) fn summary(&self) -> drover_proto::BuildSummary {
        drover_proto::BuildSummary {
            id: self.id,
            name: self.plan.spec.name.clone(),
            tenant: self.tenant.clone(),
            state: self.state,
            jobs: self.jobs.len() as u64,
            done: self.jobs.iter().filter(|rec| rec.state.is_final()).count() as u64,
        }
    }

    pub(crate) fn status(&self) -> BuildStatus {
        BuildStatus {
            id: self.id,
            name: self.plan.spec.name.clone(),
            tenant: self.tenant.clone(),
            // The solver resolves it (`Solver::build_status`).
            queue: String::new(),
            state: self.state,
            jobs: self
                .plan
                .spec
                .jobs
                .iter()
                .zip(&self.jobs)
                .enumerate()
                .map(|(i, (def, rec))| JobStatus {
                    name: def.name.clone(),
                    id: def.id,
                    state: rec.state,
                    worker: rec.worker.as_ref().map(|(_, name)| name.to_string()),
                    attempts: rec.attempts,
                    exit_code: rec.exit_code,
                    detail: match (rec.state, rec.waiter) {
                        (JobState::Queued, None) if rec.detail.is_empty() => self.outside_core(i as u32),
                        (JobState::Running, _) if rec.suspended => "suspended".to_owned(),
                        (JobState::Running, _) if let Some(by) = &rec.evicted => {
                            format!("suspended (evicted by {by})")
                        }
                        _ => rec.detail.clone(),
                    },
                    stages: if rec.state.is_final() { rec.stages.clone() } else { BTreeMap::new() },
                    stage: None,
                    stage_waiting: false,
                })
                .collect(),
        }
    }
}
