//! Cross-job checks and ordering: unique names, known `needs`, no
//! self-dependency, no dependency cycle (each cycle named, `a -> b -> a`),
//! gangs whose members agree and do not wait for each other,
//! and the topological order jobs are returned in (dependencies first, ties in
//! file order).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::error::{Diagnostics, shown};
use crate::schema::JobSpec;
use crate::suggest::Suggestions;

/// Checks names and `needs`. Returns, for each job, the indices of the jobs
/// it needs (only edges that point at a known, other job), and reports every
/// dependency cycle among them.
pub(crate) fn check(jobs: &[JobSpec], diags: &mut Diagnostics) -> Vec<Vec<usize>> {
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        let Some(name) = &job.name else { continue };
        match index.get(name.value.as_str()) {
            Some(&first) => diags.push(
                Some(name.line),
                Some(&name.value),
                format!("duplicate job name {:?} (first defined at line {})", name.value, jobs[first].line),
            ),
            None => {
                index.insert(&name.value, i);
            }
        }
    }

    let mut edges = vec![Vec::new(); jobs.len()];
    let mut suggestions = Suggestions::new();
    for (i, job) in jobs.iter().enumerate() {
        let label = job.label();
        let mut listed = std::collections::BTreeSet::new();
        for need in &job.needs {
            if !listed.insert(need.value.as_str()) {
                diags.push(
                    Some(need.line),
                    label,
                    format!("{:?} is listed twice in needs", shown(&need.value)),
                );
            } else if label == Some(need.value.as_str()) {
                diags.push(Some(need.line), label, "job depends on itself");
            } else if let Some(&target) = index.get(need.value.as_str()) {
                edges[i].push(target);
            } else {
                // Not the job itself: that would be a cycle.
                let hint = suggestions
                    .did_you_mean(&need.value, index.keys().copied().filter(|name| Some(*name) != label));
                diags.push(
                    Some(need.line),
                    label,
                    format!("unknown dependency {:?}{hint}", shown(&need.value)),
                );
            }
        }
    }

    let cycles = cycles(&edges);
    let mut searches = Searches::new(jobs.len());
    let gangs = check_gangs(jobs, &edges, cycles.is_empty(), &mut searches, diags);
    if let Some(gangs) = gangs
        && cycles.is_empty()
    {
        check_gang_order(jobs, &edges, &gangs, &mut searches, diags);
    }
    for cycle in cycles {
        let names: Vec<&str> = cycle.iter().map(|&i| jobs[i].label().unwrap_or("?")).collect();
        let first = &jobs[cycle[0]];
        diags.push(
            Some(first.line),
            first.label(),
            format!("dependency cycle: {} -> {}", names.join(" -> "), names[0]),
        );
    }
    edges
}

/// Searches through the jobs a gang's jobs need, directly or not: they
/// share one budget of visits in proportion to the build (so that a file of
/// many gangs is checked in linear time, the searches past it left out:
/// the file has a mistake either way), and one array of marks.
struct Searches {
    budget: usize,
    /// The search that last visited each job.
    marks: Vec<usize>,
    search: usize,
}

impl Searches {
    fn new(jobs: usize) -> Searches {
        Searches { budget: 8 * jobs + 100_000, marks: vec![usize::MAX; jobs], search: 0 }
    }

    /// Visits every job that `members` need, directly or not (each once),
    /// handing each to `visit`; false if the budget ran out first.
    fn needed(&mut self, members: &[usize], edges: &[Vec<usize>], mut visit: impl FnMut(usize)) -> bool {
        self.search += 1;
        let mut stack: Vec<usize> = members.iter().flat_map(|&m| edges[m].iter().copied()).collect();
        while let Some(d) = stack.pop() {
            if std::mem::replace(&mut self.marks[d], self.search) == self.search {
                continue;
            }
            let Some(left) = self.budget.checked_sub(1) else { return false };
            self.budget = left;
            visit(d);
            stack.extend(edges[d].iter().copied());
        }
        true
    }
}

/// Members of one gang give the same `min_available` and `on_failure`, at
/// most as many as they are, and none needs another, even indirectly: a
/// gang's members start at the same moment. Returns each gang's members,
/// by name, if no member needs another. Such a gang never starts, so in a
/// graph without cycles only the gangs the build would leave waiting (see
/// [`stuck_gangs`]) are searched.
fn check_gangs<'a>(
    jobs: &'a [JobSpec],
    edges: &[Vec<usize>],
    acyclic: bool,
    searches: &mut Searches,
    diags: &mut Diagnostics,
) -> Option<BTreeMap<&'a str, Vec<usize>>> {
    let mut apart = true;
    let mut gangs: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, job) in jobs.iter().enumerate() {
        if let Some(gang) = &job.gang {
            gangs.entry(gang.name.as_str()).or_default().push(i);
        }
    }
    for (name, members) in &gangs {
        let first = jobs[members[0]].gang.as_ref().expect("member");
        // Unset means the default: all the gang's jobs, and "fail".
        let settings = |g: &crate::schema::GangSpec| {
            (g.min_available.unwrap_or(members.len() as u32), g.restart.unwrap_or(false))
        };
        for &m in &members[1..] {
            let gang = jobs[m].gang.as_ref().expect("member");
            let (mine, theirs) = (settings(gang), settings(first));
            if mine != theirs {
                let what = match (mine.0 != theirs.0, mine.1 != theirs.1) {
                    (true, true) => "min_available and on_failure differ",
                    (true, false) => "min_available differs",
                    _ => "on_failure differs",
                };
                diags.push(
                    Some(gang.line),
                    jobs[m].label(),
                    format!(
                        "gang {name:?}: {what} from job {:?} (line {}); every member of a gang says the same",
                        jobs[members[0]].label().unwrap_or("?"),
                        first.line
                    ),
                );
            }
        }
        if let Some(min) = first.min_available
            && min as usize > members.len()
        {
            diags.push(
                Some(first.line),
                jobs[members[0]].label(),
                format!("gang {name:?}: min_available is {min} but it has {} job(s)", members.len()),
            );
        }
    }
    let candidates: Vec<&str> =
        if acyclic { stuck_gangs(jobs, edges, &gangs) } else { gangs.keys().copied().collect() };
    for name in candidates {
        // One search from every member's needs: reaching a member means
        // another member needs it, maybe indirectly.
        let mut found = Vec::new();
        let whole = searches.needed(&gangs[name], edges, |d| {
            if jobs[d].gang.as_ref().is_some_and(|g| g.name == name) {
                found.push(d);
            }
        });
        for d in found {
            apart = false;
            diags.push(
                Some(jobs[d].gang.as_ref().expect("member").line),
                jobs[d].label(),
                format!("gang {name:?}: another job of the gang needs this one (its jobs start together)"),
            );
        }
        if !whole {
            break;
        }
    }
    apart.then_some(gangs)
}

/// The gangs that would never start, in name order. A gang goes on once
/// all its members' needs are done: plays the build out (jobs go on as
/// their needs are done, gangs once all their members' are), in time
/// linear in the build, and names the gangs left waiting. Only for a graph
/// without cycles.
fn stuck_gangs<'a>(
    jobs: &[JobSpec],
    edges: &[Vec<usize>],
    gangs: &BTreeMap<&'a str, Vec<usize>>,
) -> Vec<&'a str> {
    let mut waiting: Vec<usize> = edges.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); jobs.len()];
    for (i, needs) in edges.iter().enumerate() {
        for &d in needs {
            dependents[d].push(i);
        }
    }
    let mut ready: BTreeMap<&str, usize> = BTreeMap::new();
    let mut needs_done: Vec<usize> = (0..jobs.len()).filter(|&i| waiting[i] == 0).collect();
    let mut over = Vec::new();
    while let Some(i) = needs_done.pop() {
        match &jobs[i].gang {
            None => over.push(i),
            Some(g) => {
                let n = ready.entry(g.name.as_str()).or_insert(0);
                *n += 1;
                if *n == gangs[g.name.as_str()].len() {
                    over.extend(gangs[g.name.as_str()].iter().copied());
                }
            }
        }
        for j in over.drain(..) {
            for &d in &dependents[j] {
                waiting[d] -= 1;
                if waiting[d] == 0 {
                    needs_done.push(d);
                }
            }
        }
    }
    gangs
        .iter()
        .filter(|(name, members)| ready.get(*name).copied().unwrap_or(0) < members.len())
        .map(|(name, _)| *name)
        .collect()
}

/// No two gangs wait for each other. If a job of gang `x` needs (directly
/// or not) a job of gang `y` and the other way round, neither ever starts:
/// reports each gang left waiting, at its first member, with the waiting
/// gangs its jobs need. Only for a graph without cycles, whose gangs'
/// members (`gangs`, by name) do not need each other.
fn check_gang_order(
    jobs: &[JobSpec],
    edges: &[Vec<usize>],
    gangs: &BTreeMap<&str, Vec<usize>>,
    searches: &mut Searches,
    diags: &mut Diagnostics,
) {
    if gangs.len() < 2 {
        return;
    }
    let stuck = stuck_gangs(jobs, edges, gangs);
    for &name in &stuck {
        let members = &gangs[name];
        // The waiting gangs this one's jobs need, directly or not.
        let mut waits_for = std::collections::BTreeSet::new();
        let whole = searches.needed(members, edges, |d| {
            if let Some(g) = &jobs[d].gang
                && g.name != name
                && stuck.binary_search(&g.name.as_str()).is_ok()
            {
                waits_for.insert(format!("{:?}", g.name));
            }
        });
        let first = &jobs[members[0]];
        let waits_for: Vec<String> = waits_for.into_iter().collect();
        let others = match waits_for.len() {
            // The search was cut short (see `Searches`).
            _ if !whole => "other gangs, which never start".to_owned(),
            1 => format!("gang {}, which never starts", waits_for[0]),
            _ => format!("gangs {}, which never start", waits_for.join(", ")),
        };
        diags.push(
            first.gang.as_ref().map(|g| g.line),
            first.label(),
            format!(
                "gang {name:?} can never start: its jobs need, directly or not, jobs of {others} either: gangs \
                 that need each other wait forever (a gang's jobs start together, once all their needs are \
                 done)"
            ),
        );
    }
}

/// One cycle per strongly connected component with more than one job: the
/// component's first job (in file order), then a shortest path back to it.
fn cycles(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let component = components(edges);
    let mut sizes = vec![0usize; edges.len()];
    for &c in &component {
        sizes[c] += 1;
    }
    let mut seen = vec![false; edges.len()];
    let mut found = Vec::new();
    // One array for every search, each clearing what it set (a search per
    // component allocating its own was quadratic in a file of many cycles).
    let mut parent: Vec<Option<usize>> = vec![None; edges.len()];
    let mut touched = Vec::new();
    for start in 0..edges.len() {
        let c = component[start];
        if sizes[c] < 2 || seen[c] {
            continue;
        }
        seen[c] = true;
        // Breadth-first search from `start` inside the component, back to it.
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(at) = queue.pop_front() {
            for &next in &edges[at] {
                if component[next] != c {
                    continue;
                }
                if next == start {
                    last = Some(at);
                    break 'search;
                }
                if parent[next].is_none() && next != start {
                    parent[next] = Some(at);
                    touched.push(next);
                    queue.push_back(next);
                }
            }
        }
        let mut path = Vec::new();
        let mut at = last;
        while let Some(node) = at {
            path.push(node);
            at = if node == start { None } else { parent[node] };
        }
        path.reverse();
        found.push(path);
        for node in touched.drain(..) {
            parent[node] = None;
        }
    }
    found
}

/// Tarjan's strongly connected components (iterative): a component number
/// for each node.
fn components(edges: &[Vec<usize>]) -> Vec<usize> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let mut order = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut component = vec![UNSEEN; n];
    let mut next_order = 0;
    let mut next_component = 0;
    for root in 0..n {
        if order[root] != UNSEEN {
            continue;
        }
        // (node, index of the next edge to follow)
        let mut calls = vec![(root, 0)];
        order[root] = next_order;
        low[root] = next_order;
        next_order += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (node, ref mut edge)) = calls.last_mut() {
            if let Some(&next) = edges[node].get(*edge) {
                *edge += 1;
                if order[next] == UNSEEN {
                    order[next] = next_order;
                    low[next] = next_order;
                    next_order += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    calls.push((next, 0));
                } else if on_stack[next] {
                    low[node] = low[node].min(order[next]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component[member] = next_component;
                    if member == node {
                        break;
                    }
                }
                next_component += 1;
            }
        }
    }
    component
}

/// Job indices with every job after the jobs it needs; among jobs that are
/// ready at the same time, the earlier one in the file first. `edges` must be
/// acyclic.
pub(crate) fn topological_order(edges: &[Vec<usize>]) -> Vec<usize> {
    let mut waiting: Vec<usize> = edges.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); edges.len()];
    for (job, needs) in edges.iter().enumerate() {
        for &need in needs {
            dependents[need].push(job);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        waiting.iter().enumerate().filter(|&(_, &w)| w == 0).map(|(i, _)| Reverse(i)).collect();
    let mut order = Vec::with_capacity(edges.len());
    while let Some(Reverse(job)) = ready.pop() {
        order.push(job);
        for &dependent in &dependents[job] {
            waiting[dependent] -= 1;
            if waiting[dependent] == 0 {
                ready.push(Reverse(dependent));
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topological_order_keeps_file_order_for_ties() {
        // 0 needs 2; 1 needs nothing; 2 needs nothing; 3 needs 0 and 1.
        let edges = vec![vec![2], vec![], vec![], vec![0, 1]];
        assert_eq!(topological_order(&edges), vec![1, 2, 0, 3]);
    }

    #[test]
    fn one_cycle_per_component() {
        // 0 -> 1 -> 2 -> 0, and 3 <-> 4, and 5 alone needing 0.
        let edges = vec![vec![1], vec![2], vec![0], vec![4], vec![3], vec![0]];
        assert_eq!(cycles(&edges), vec![vec![0, 1, 2], vec![3, 4]]);
        assert!(cycles(&[vec![], vec![0]]).is_empty());
    }

    #[test]
    fn shortest_cycle_through_the_first_job() {
        // 0 -> 1 -> 2 -> 3 -> 0 and the shortcut 1 -> 3.
        let edges = vec![vec![1], vec![2, 3], vec![3], vec![0]];
        assert_eq!(cycles(&edges), vec![vec![0, 1, 3]]);
    }
}
