//! Queues with weights and quotas (Volcano's proportion plugin), as a tree.
//!
//! Every job belongs to a leaf queue. A queue has a weight, an optional hard
//! `capability`, a `guarantee` and a priority; a queue with children splits
//! what it deserves among them by the same rule, recursively. Amounts have
//! three dimensions: slots (in thousandths, so that a split of 4 slots three
//! ways is not rounded away), CPU (millicores) and memory (bytes).
//!
//! **Deserved share** (per level, for the children of one parent, starting
//! from the whole cluster at the top): in rounds, each queue not yet
//! satisfied is offered `remaining × weight / Σ weights`; its deserved amount
//! is then capped by its real capability (its capability, and what the
//! siblings' guarantees leave), capped by its request (what it holds plus
//! what it has queued: idle demand is not hoarded) and raised to its
//! guarantee. A queue whose request is met, or whose deserved amount stopped
//! growing (capped), leaves the rounds; what it did not take is offered again
//! to the others. Rounds end when nothing is left or nothing changed.
//!
//! Nothing here reads a clock or iterates a hash: it is part of the pure core.

use std::collections::BTreeMap;

use crate::types::{QueueConfig, QueueLimits};

/// Index of a queue in the tree.
pub(crate) type QueueIdx = u32;

/// Offers by weight a round of [`Queues::split`] keeps at hand.
const OFFER_MEMO: usize = 8;

/// Thousandths of a slot per slot.
pub(crate) const SLOT_UNITS: u64 = 1000;

/// Slots (thousandths), CPU (millicores), memory (bytes).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub(crate) struct Amounts(pub(crate) [u64; 3]);

impl Amounts {
    pub(crate) fn new(slots: u32, cpu: u64, memory: u64) -> Amounts {
        Amounts([u64::from(slots) * SLOT_UNITS, cpu, memory])
    }

    fn from_limits(limits: &QueueLimits, unset: u64) -> Amounts {
        Amounts([
            limits.slots.map_or(unset, |s| u64::from(s).saturating_mul(SLOT_UNITS)),
            limits.cpu.unwrap_or(unset),
            limits.memory.unwrap_or(unset),
        ])
    }

    pub(crate) fn add(&mut self, other: Amounts) {
        for d in 0..3 {
            self.0[d] = self.0[d].saturating_add(other.0[d]);
        }
    }

    pub(crate) fn sub(&mut self, other: Amounts) {
        for d in 0..3 {
            self.0[d] = self.0[d].saturating_sub(other.0[d]);
        }
    }

    fn plus(mut self, other: Amounts) -> Amounts {
        self.add(other);
        self
    }

    fn zip(self, other: Amounts, f: impl Fn(u64, u64) -> u64) -> Amounts {
        Amounts(std::array::from_fn(|d| f(self.0[d], other.0[d])))
    }

    /// Every dimension at most `other`'s.
    pub(crate) fn within(&self, other: &Amounts) -> bool {
        (0..3).all(|d| self.0[d] <= other.0[d])
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.0 == [0; 3]
    }

    /// `self / of` in the dimension where it is largest, in millionths
    /// (Volcano's share; `x / 0` counts as 1 when `x > 0`).
    pub(crate) fn share_of(&self, of: &Amounts) -> u64 {
        (0..3)
            .map(|d| match (self.0[d], of.0[d]) {
                (0, _) => 0,
                (_, 0) => 1_000_000,
                (x, y) => scale(x, 1_000_000, y),
            })
            .max()
            .unwrap_or(0)
    }
}

/// `x × m / d`, saturated at `u64::MAX` (`d > 0`). In 64 bits when the
/// product fits, which it does for every amount short of petabytes: the
/// 128-bit division is a library call, and this runs for every queue on
/// every recomputation of the deserved amounts.
fn scale(x: u64, m: u64, d: u64) -> u64 {
    match x.checked_mul(m) {
        Some(p) => p / d,
        None => (u128::from(x) * u128::from(m) / u128::from(d)).min(u128::from(u64::MAX)) as u64,
    }
}

/// One queue's configuration and live totals (its subtree's, for a parent).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct QueueNode {
    pub(crate) name: String,
    pub(crate) parent: Option<QueueIdx>,
    pub(crate) children: Vec<QueueIdx>,
    pub(crate) weight: u64,
    pub(crate) priority: i32,
    pub(crate) reclaimable: bool,
    /// Hard maximum (`u64::MAX` where unset).
    pub(crate) capability: Amounts,
    pub(crate) guarantee: Amounts,
    /// Held by running jobs.
    pub(crate) allocated: Amounts,
    /// Asked for by queued jobs.
    pub(crate) pending: Amounts,
    pub(crate) deserved: Amounts,
    /// The request `deserved` was last computed from.
    asked: Amounts,
    /// Jobs queued and runs holding resources, for people.
    pub(crate) queued_jobs: u64,
    pub(crate) running: u64,
}

impl QueueNode {
    fn request(&self) -> Amounts {
        self.allocated.plus(self.pending)
    }
}

/// The queue tree. Queue 0 is always a leaf named `default` unless the
/// configuration names one itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Queues {
    pub(crate) nodes: Vec<QueueNode>,
    pub(crate) index: BTreeMap<String, QueueIdx>,
    /// Tenant name → leaf queue.
    pub(crate) tenants: BTreeMap<String, QueueIdx>,
    pub(crate) default: QueueIdx,
    /// Requests or the cluster may have changed in a way that moves the
    /// deserved amounts since they were computed (see [`Queues::settle`]).
    pub(crate) dirty: bool,
    /// The cluster's total the deserved amounts were last computed for.
    split_total: Amounts,
    /// The queues without a parent, in index order.
    top: Vec<QueueIdx>,
    /// [`Queues::split`]'s working list, kept between calls.
    scratch: Vec<Sibling>,
}

/// One sibling in [`Queues::split`]'s rounds: what it may reach (its real
/// capability, request and guarantee do not change between rounds), what
/// it deserves so far, and whether it left the rounds. The rounds read
/// these, a few cache lines in a row, instead of the queue nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Sibling {
    queue: QueueIdx,
    weight: u64,
    real_cap: Amounts,
    request: Amounts,
    guarantee: Amounts,
    deserved: Amounts,
    met: bool,
}

/// Can a queue's request going from `before` to `after` move the deserved
/// amounts computed with `deserved` (see [`Queues::charge`])? Not if every
/// dimension keeps its request or stays above its deserved amount.
fn moves(before: Amounts, after: Amounts, deserved: Amounts) -> bool {
    (0..3).any(|d| before.0[d] != after.0[d] && !(before.0[d] > deserved.0[d] && after.0[d] > deserved.0[d]))
}

/// The name of the queue of jobs that name none and whose tenant maps to none.
pub const DEFAULT_QUEUE: &str = "default";

impl Queues {
    /// Builds the tree from a configuration that passed
    /// [`validate`](crate::Config::validate); anything it would refuse is
    /// made harmless here (an unknown parent makes a top-level queue).
    pub(crate) fn new(configs: &[QueueConfig], tenants: &BTreeMap<String, String>) -> Queues {
        let mut q = Queues {
            nodes: Vec::new(),
            index: BTreeMap::new(),
            tenants: BTreeMap::new(),
            default: 0,
            dirty: true,
            // No cluster has this total: the first settle computes.
            split_total: Amounts([u64::MAX; 3]),
            top: Vec::new(),
            scratch: Vec::new(),
        };
        for c in configs {
            if q.index.contains_key(&c.name) {
                continue;
            }
            q.index.insert(c.name.clone(), q.nodes.len() as QueueIdx);
            q.nodes.push(QueueNode {
                name: c.name.clone(),
                parent: None,
                children: Vec::new(),
                weight: u64::from(c.weight.max(1)),
                priority: c.priority,
                reclaimable: c.reclaimable,
                capability: Amounts::from_limits(&c.capability, u64::MAX),
                guarantee: Amounts::from_limits(&c.guarantee, 0),
                allocated: Amounts::default(),
                pending: Amounts::default(),
                deserved: Amounts::default(),
                asked: Amounts::default(),
                queued_jobs: 0,
                running: 0,
            });
        }
        for c in configs {
            let me = q.index[&c.name];
            if let Some(parent) = c.parent.as_ref().and_then(|p| q.index.get(p)).copied()
                && parent != me
                && q.nodes[me as usize].parent.is_none()
                && !q.is_ancestor(me, parent)
            {
                q.nodes[me as usize].parent = Some(parent);
                q.nodes[parent as usize].children.push(me);
            }
        }
        q.default = match q.index.get(DEFAULT_QUEUE) {
            Some(&d) if q.nodes[d as usize].children.is_empty() => d,
            _ => {
                let d = q.nodes.len() as QueueIdx;
                let mut name = DEFAULT_QUEUE.to_owned();
                while q.index.contains_key(&name) {
                    name.push('_');
                }
                q.index.insert(name.clone(), d);
                q.nodes.push(QueueNode {
                    name,
                    parent: None,
                    children: Vec::new(),
                    weight: 1,
                    priority: 0,
                    reclaimable: true,
                    capability: Amounts([u64::MAX; 3]),
                    guarantee: Amounts::default(),
                    allocated: Amounts::default(),
                    pending: Amounts::default(),
                    deserved: Amounts::default(),
                    asked: Amounts::default(),
                    queued_jobs: 0,
                    running: 0,
                });
                d
            }
        };
        for (tenant, queue) in tenants {
            if let Some(&leaf) = q.index.get(queue)
                && q.nodes[leaf as usize].children.is_empty()
            {
                q.tenants.insert(tenant.clone(), leaf);
            }
        }
        q.top = (0..q.nodes.len() as QueueIdx).filter(|&i| q.nodes[i as usize].parent.is_none()).collect();
        q
    }

    fn is_ancestor(&self, of: QueueIdx, mut q: QueueIdx) -> bool {
        while let Some(p) = self.nodes[q as usize].parent {
            if p == of {
                return true;
            }
            q = p;
        }
        false
    }

    /// More than the one implicit queue: quotas and shares apply.
    pub(crate) fn active(&self) -> bool {
        self.nodes.len() > 1 || self.nodes[0].capability != Amounts([u64::MAX; 3])
    }

    /// Whether a capability limits `leaf` or one of its parents: only then
    /// can what a run of `leaf` gives back let another queue's job start.
    pub(crate) fn capped(&self, leaf: QueueIdx) -> bool {
        let mut q = Some(leaf);
        while let Some(i) = q {
            let node = &self.nodes[i as usize];
            if node.capability != Amounts([u64::MAX; 3]) {
                return true;
            }
            q = node.parent;
        }
        false
    }

    /// The leaf queue a job goes to: the one it names, else its tenant's,
    /// else the default. `Err` for a name that is not a leaf queue.
    pub(crate) fn resolve(&self, named: Option<&str>, tenant: &str) -> Result<QueueIdx, String> {
        match named {
            Some(name) => match self.index.get(name) {
                Some(&q) if self.nodes[q as usize].children.is_empty() => Ok(q),
                Some(_) => Err(format!("queue {name} has child queues: jobs go to its leaves")),
                None => Err(format!("no queue named {name}")),
            },
            None => Ok(self.tenants.get(tenant).copied().unwrap_or(self.default)),
        }
    }

    /// Applies `f` to a leaf and each of its ancestors, and marks the
    /// deserved amounts `dirty` if a request changed in a way that can move
    /// them.
    ///
    /// In a dimension where a queue's request exceeds its deserved amount
    /// before and after the change, the request never caps it in
    /// [`Queues::deserve`]'s rounds (deserved amounts only grow from round to
    /// round, up to the result), and the queue is never met by its request
    /// (which needs the request within the deserved amount in every
    /// dimension): if every dimension either keeps its request or stays
    /// above like that, the rounds, and their result, are the same with
    /// either request. In a busy cluster every queue asks for more than it
    /// deserves in what its jobs ask for (and keeps asking for none of what
    /// they do not, say memory), and a job's end or arrival costs no
    /// recomputation.
    pub(crate) fn charge(&mut self, leaf: QueueIdx, mut f: impl FnMut(&mut QueueNode)) {
        let mut q = Some(leaf);
        while let Some(i) = q {
            let node = &mut self.nodes[i as usize];
            let before = node.request();
            f(node);
            if moves(before, node.request(), node.deserved) {
                self.dirty = true;
            }
            q = node.parent;
        }
    }

    /// Why `who` (a job, or a gang's members at once), asking for `amounts`,
    /// can never start in `leaf`: it exceeds the capability of the queue or
    /// of one of its parents.
    pub(crate) fn beyond_capability(&self, leaf: QueueIdx, amounts: Amounts, who: &str) -> Option<String> {
        let mut q = Some(leaf);
        while let Some(i) = q {
            let node = &self.nodes[i as usize];
            if !amounts.within(&node.capability) {
                let d = (0..3).find(|&d| amounts.0[d] > node.capability.0[d]).unwrap_or(0);
                let show = |v: u64| match d {
                    0 => match v / SLOT_UNITS {
                        1 => "1 slot".to_owned(),
                        n => format!("{n} slots"),
                    },
                    1 => crate::scheduler::cpu(v),
                    _ => format!("{} of memory", crate::scheduler::bytes(v)),
                };
                return Some(format!(
                    "{who} asks for {} but queue {} allows at most {} at once",
                    show(amounts.0[d]),
                    node.name,
                    show(node.capability.0[d])
                ));
            }
            q = node.parent;
        }
        None
    }

    /// May a job asking for `amounts` start in `leaf` now? Never beyond any
    /// capability on the way up; with `within_deserved`, never beyond any
    /// deserved amount either.
    pub(crate) fn admits(&self, leaf: QueueIdx, amounts: Amounts, within_deserved: bool) -> bool {
        let mut q = Some(leaf);
        while let Some(i) = q {
            let node = &self.nodes[i as usize];
            let after = node.allocated.plus(amounts);
            if !after.within(&node.capability) || (within_deserved && !after.within(&node.deserved)) {
                return false;
            }
            q = node.parent;
        }
        true
    }

    /// Would a job asking for `amounts` fit under every capability from
    /// `leaf` up once `freed` (held by the leaf's runs now) is given back?
    pub(crate) fn admits_freeing(&self, leaf: QueueIdx, freed: Amounts, amounts: Amounts) -> bool {
        let mut q = Some(leaf);
        while let Some(i) = q {
            let node = &self.nodes[i as usize];
            let mut after = node.allocated;
            after.sub(freed);
            after.add(amounts);
            if !after.within(&node.capability) {
                return false;
            }
            q = node.parent;
        }
        true
    }

    /// A queue's share: what it holds over what it deserves (for the queue
    /// order of `proportion`).
    pub(crate) fn share(&self, q: QueueIdx) -> u64 {
        let node = &self.nodes[q as usize];
        node.allocated.share_of(&node.deserved)
    }

    /// Recomputes the deserved amounts if [`Queues::charge`] saw a change
    /// that may move them and the requests (or `total`) now differ from
    /// those they were computed from in a way that does (the same test,
    /// against the requests of the last computation). Within one step a
    /// request may dip and come back (a started job leaves its queue's
    /// pending amount before its run is charged as allocated): only the
    /// net change counts. Returns whether anything was recomputed.
    pub(crate) fn settle(&mut self, total: Amounts) -> bool {
        if !std::mem::take(&mut self.dirty) {
            return false;
        }
        if total == self.split_total && !self.nodes.iter().any(|n| moves(n.asked, n.request(), n.deserved)) {
            return false;
        }
        self.deserve(total);
        true
    }

    /// Recomputes every queue's deserved amount for a cluster of `total`.
    pub(crate) fn deserve(&mut self, total: Amounts) {
        self.dirty = false;
        self.split_total = total;
        for node in &mut self.nodes {
            node.asked = node.request();
        }
        let top = std::mem::take(&mut self.top);
        self.deserve_level(&top, total);
        self.top = top;
    }

    /// Splits `amount` among `siblings`, then each parent's share among its
    /// children, depth first.
    fn deserve_level(&mut self, siblings: &[QueueIdx], amount: Amounts) {
        self.split(siblings, amount);
        for &c in siblings {
            if self.nodes[c as usize].children.is_empty() {
                continue;
            }
            let children = std::mem::take(&mut self.nodes[c as usize].children);
            let deserved = self.nodes[c as usize].deserved;
            self.deserve_level(&children, deserved);
            self.nodes[c as usize].children = children;
        }
    }

    /// Proportion's rounds among siblings sharing `total`.
    fn split(&mut self, siblings: &[QueueIdx], total: Amounts) {
        let guarantees =
            siblings.iter().fold(Amounts::default(), |sum, &q| sum.plus(self.nodes[q as usize].guarantee));
        let free = total.zip(guarantees, u64::saturating_sub);
        let mut rounds = std::mem::take(&mut self.scratch);
        rounds.extend(siblings.iter().map(|&q| {
            let node = &self.nodes[q as usize];
            Sibling {
                queue: q,
                weight: node.weight,
                // What the siblings' guarantees leave this queue at most.
                real_cap: node.capability.zip(free.plus(node.guarantee), u64::min),
                request: node.request(),
                guarantee: node.guarantee,
                deserved: Amounts::default(),
                met: false,
            }
        }));
        let mut weights: u64 = rounds.iter().map(|s| s.weight).sum();
        let heaviest = rounds.iter().map(|s| s.weight).max().unwrap_or(0);
        let mut remaining = total;
        // Deserved amounts only grow, so `remaining` only shrinks: the rounds
        // end. The bound is a guard, never reached in practice.
        for _ in 0..64 {
            if weights == 0 {
                break;
            }
            let (before, offered_to) = (remaining, weights);
            // A dimension with too little left for even the heaviest queue's
            // offer to reach one unit offers nothing this round: the late
            // rounds only share out what is left of one dimension (memory,
            // in bytes), and skip the divisions of the others.
            let offers = remaining.0.map(|r| r.saturating_mul(heaviest) >= offered_to);
            // Siblings of equal weight get equal offers: the last few
            // weights' offers are kept for the round (queues mostly share a
            // handful of weights), so a round divides once per weight rather
            // than once per queue.
            let mut known: [(u64, Amounts); OFFER_MEMO] = [(0, Amounts::default()); OFFER_MEMO];
            let mut next_slot = 0;
            let mut given = Amounts::default();
            for s in rounds.iter_mut().filter(|s| !s.met) {
                let old = s.deserved;
                let offer = match known.iter().find(|(w, _)| *w == s.weight) {
                    Some(&(_, offer)) => offer,
                    None => {
                        let offer = Amounts(std::array::from_fn(|d| {
                            if offers[d] { scale(remaining.0[d], s.weight, offered_to) } else { 0 }
                        }));
                        known[next_slot] = (s.weight, offer);
                        next_slot = (next_slot + 1) % OFFER_MEMO;
                        offer
                    }
                };
                let deserved = old
                    .plus(offer)
                    .zip(s.real_cap, u64::min)
                    .zip(s.request, u64::min)
                    .zip(s.guarantee, u64::max);
                s.deserved = deserved;
                // Met: asks for no more, or capped (offered something and
                // did not grow). An offer rounded down to nothing is not a
                // cap: the rounds end when nothing moves any more.
                if s.request.within(&deserved) || (deserved == old && !offer.is_zero()) {
                    s.met = true;
                    weights -= s.weight;
                }
                given.add(deserved.zip(old, u64::saturating_sub));
            }
            remaining.sub(given);
            if remaining.is_zero() || remaining == before {
                break;
            }
        }
        for s in rounds.drain(..) {
            self.nodes[s.queue as usize].deserved = s.deserved;
        }
        self.scratch = rounds;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str, weight: u32) -> QueueConfig {
        QueueConfig { name: name.to_owned(), weight, ..QueueConfig::default() }
    }

    fn cpu(n: u64) -> Amounts {
        Amounts([0, n, 0])
    }

    /// Volcano's worked example: 12 CPU; A (weight 1) asks for 2, B (weight
    /// 1, capability 3) for 8, C (weight 2) for 12: A = 2, B = 3, C = 7.
    #[test]
    fn proportion_worked_example() {
        let mut b = queue("b", 1);
        b.capability.cpu = Some(3_000);
        let mut q = Queues::new(&[queue("a", 1), b, queue("c", 2)], &BTreeMap::new());
        for (name, ask) in [("a", 2_000), ("b", 8_000), ("c", 12_000)] {
            let i = q.index[name];
            q.nodes[i as usize].pending = cpu(ask);
        }
        q.deserve(cpu(12_000));
        let got: Vec<u64> =
            ["a", "b", "c"].iter().map(|n| q.nodes[q.index[*n] as usize].deserved.0[1]).collect();
        assert_eq!(got, vec![2_000, 3_000, 7_000]);
    }

    #[test]
    fn guarantees_are_honoured_and_children_split_their_parent() {
        let mut a = queue("a", 1);
        a.guarantee.cpu = Some(9_000);
        let mut child1 = queue("b1", 1);
        child1.parent = Some("b".into());
        let mut child2 = queue("b2", 3);
        child2.parent = Some("b".into());
        let mut q = Queues::new(&[a, queue("b", 1), child1, child2], &BTreeMap::new());
        for name in ["a", "b1", "b2"] {
            let i = q.index[name];
            q.charge(i, |n| n.pending = n.pending.plus(cpu(100_000)));
        }
        q.deserve(cpu(12_000));
        let d = |n: &str| q.nodes[q.index[n] as usize].deserved.0[1];
        // a is raised to its guarantee; b gets the rest, split 1:3.
        assert_eq!((d("a"), d("b"), d("b1"), d("b2")), (9_000, 3_000, 750, 2_250));
        assert!(!q.nodes[q.index["b"] as usize].children.is_empty());
        assert_eq!(q.resolve(Some("b"), "t").unwrap_err(), "queue b has child queues: jobs go to its leaves");
        assert_eq!(q.resolve(None, "t"), Ok(q.default));
    }

    /// A request that dips to its deserved amount and comes back within
    /// one step, or moves only above it, leaves the deserved amounts as they
    /// are without recomputing them; a net change below, or a new cluster
    /// total, recomputes them.
    #[test]
    fn settle_recomputes_only_for_a_net_change_that_can_move_shares() {
        let mut q = Queues::new(&[queue("a", 1), queue("b", 1)], &BTreeMap::new());
        let (a, b) = (q.index["a"], q.index["b"]);
        q.charge(a, |n| n.pending = cpu(2_000));
        q.charge(b, |n| n.pending = cpu(100_000));
        let total = cpu(12_000);
        assert!(q.settle(total), "the first settle computes");
        let d = |q: &Queues, i: QueueIdx| q.nodes[i as usize].deserved.0[1];
        assert_eq!((d(&q, a), d(&q, b)), (2_000, 10_000));
        assert!(!q.settle(total), "nothing changed");
        // a's job ends and another of a's starts: down to 1,000, back to
        // 2,000. Each step could move the shares, the net change cannot.
        q.charge(a, |n| n.pending = cpu(1_000));
        q.charge(a, |n| n.pending = cpu(2_000));
        assert!(q.dirty, "each step was seen");
        assert!(!q.settle(total), "no net change");
        assert!(!q.dirty);
        // b asks for more, above its deserved amount before and after.
        q.charge(b, |n| n.pending = cpu(200_000));
        assert!(!q.dirty && !q.settle(total));
        // a asks for less: b's share grows.
        q.charge(a, |n| n.pending = cpu(1_000));
        assert!(q.settle(total));
        assert_eq!((d(&q, a), d(&q, b)), (1_000, 11_000));
        // A new cluster total always recomputes.
        q.dirty = true;
        assert!(q.settle(cpu(6_000)));
        assert_eq!((d(&q, a), d(&q, b)), (1_000, 5_000));
    }

    #[test]
    fn shares_and_admission() {
        let mut q = Queues::new(&[queue("a", 1)], &BTreeMap::new());
        let a = q.index["a"];
        q.charge(a, |n| n.pending = n.pending.plus(Amounts::new(4, 0, 0)));
        q.deserve(Amounts::new(2, 0, 0));
        assert_eq!(q.nodes[a as usize].deserved, Amounts::new(2, 0, 0));
        q.charge(a, |n| n.allocated = n.allocated.plus(Amounts::new(2, 0, 0)));
        assert!(!q.admits(a, Amounts::new(1, 0, 0), true), "at its deserved share");
        assert!(q.admits(a, Amounts::new(1, 0, 0), false), "no capability");
        assert_eq!(q.share(a), 1_000_000);
    }
}
