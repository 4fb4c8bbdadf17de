//! Plugin tiers (Volcano's): the configured policies, checked by
//! [`Config::validate`] and resolved once, at `Scheduler::new`, into the
//! compact [`Policy`] the hot path reads.
//!
//! Each plugin contributes rules of some kinds, combined tier by tier as in
//! Volcano:
//!
//! - **order rules** (queue order, tenant order, job order): applied in the
//!   order the plugins are listed across the tiers, the first rule that tells
//!   two apart decides (tiers are just concatenated). A rule becomes one
//!   component of a sort key, so an order costs what the fixed order did;
//! - **scores** (`binpack`, `spread`): summed, weighted;
//! - **victims** (preempt, reclaim): within a tier, a candidate is a victim
//!   only if every plugin of the tier with a victim function for the action
//!   accepts it; the first tier that finds any victim decides, the next tier
//!   is asked only if a tier found none (see `Scheduler::victims_for`);
//! - **predicates** (labels, resources, tokens, queue capabilities) are
//!   always on; `predicates` may be listed, for people, and changes nothing.
//!
//! `gang` is not a victim function but a guard: while it is listed (in any
//! tier), gang members are never victims.

use crate::queue::{JobKey, TenantIdx};
use crate::quota::QueueIdx;
use crate::types::Config;

/// The plugins drover knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Plugin {
    Priority,
    Gang,
    Drf,
    Proportion,
    Fairness,
    CriticalPath,
    Binpack,
    Spread,
    Predicates,
}

/// Every plugin by name, in the order errors list them.
const PLUGINS: [(&str, Plugin); 9] = [
    ("priority", Plugin::Priority),
    ("gang", Plugin::Gang),
    ("drf", Plugin::Drf),
    ("proportion", Plugin::Proportion),
    ("fairness", Plugin::Fairness),
    ("critical-path", Plugin::CriticalPath),
    ("binpack", Plugin::Binpack),
    ("spread", Plugin::Spread),
    ("predicates", Plugin::Predicates),
];

fn plugin(name: &str) -> Option<Plugin> {
    PLUGINS.iter().find(|(n, _)| *n == name).map(|&(_, p)| p)
}

/// The problems of `config.tiers`, each in a sentence (for
/// [`Config::validate`]).
pub(crate) fn check_tiers(config: &Config) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen: Vec<(&str, usize)> = Vec::new();
    let known = || PLUGINS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    for (i, tier) in config.tiers.iter().enumerate() {
        let n = i + 1;
        if tier.plugins.is_empty() {
            errors.push(format!("tier {n} lists no plugins"));
        }
        for p in &tier.plugins {
            let Some(kind) = plugin(&p.name) else {
                errors.push(format!("tier {n}: unknown plugin {:?} (known: {})", p.name, known()));
                continue;
            };
            match seen.iter().find(|(name, _)| *name == p.name) {
                Some(&(_, first)) if first == n => {
                    errors.push(format!("tier {n}: plugin {} is listed twice", p.name));
                }
                Some(&(_, first)) => {
                    errors.push(format!("plugin {} is listed in tier {first} and again in tier {n}", p.name));
                }
                None => seen.push((&p.name, n)),
            }
            let scoring = matches!(kind, Plugin::Binpack | Plugin::Spread);
            match p.weight {
                Some(_) if !scoring => {
                    errors.push(format!("plugin {}: only binpack and spread take a weight", p.name));
                }
                Some(0) => errors.push(format!(
                    "plugin {}: weight must be at least 1 (leave the plugin out to switch it off)",
                    p.name
                )),
                _ => {}
            }
            if p.preemptable && kind != Plugin::Drf {
                errors.push(format!("plugin {}: only drf takes preemptable", p.name));
            }
        }
    }
    for (name, weight) in [("binpack", config.binpack), ("spread", config.spread)] {
        if weight > 0 && seen.iter().any(|(n, _)| *n == name) {
            errors.push(format!(
                "{name} is both listed in a tier and given as a weight ({name} = {weight}): keep one"
            ));
        }
    }
    errors
}

/// A rule of the queue order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum QueueRule {
    /// `priority`: higher queue priority first.
    Priority,
    /// `proportion`: the lowest share (allocated over deserved) first.
    Share,
}

/// A rule of the tenant order inside a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum TenantRule {
    /// `priority`: the highest queued priority first.
    Priority,
    /// `drf`: the lowest dominant share first.
    Share,
    /// `fairness`: the least recently served first.
    Served,
}

/// A rule of the job order inside a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum JobRule {
    /// `priority`: higher job priority first.
    Priority,
    /// `critical-path`: the longest remaining path first.
    Path,
}

/// The victim functions of one tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct VictimTier {
    /// `priority` (preempt): only jobs of a lower priority.
    pub(crate) priority: bool,
    /// `drf` with `preemptable` (preempt): only jobs of tenants that keep a
    /// larger dominant share than the preemptor's.
    pub(crate) drf: bool,
    /// `proportion` (reclaim): only jobs of queues that stay at or above
    /// their deserved share.
    pub(crate) proportion: bool,
}

/// Where a tenant is filed in its queue's order: the components of the
/// configured tenant rules, in order (unused ones 0), then the tenant.
pub(crate) type TenantKey = ([u64; 3], TenantIdx);

/// A leaf queue's place in the queue order.
pub(crate) type QueueKey = ([u64; 2], QueueIdx);

/// The tiers, resolved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Policy {
    queue_order: Vec<QueueRule>,
    tenant_order: Vec<TenantRule>,
    job_order: Vec<JobRule>,
    /// `priority` is listed: priorities order and pick victims.
    pub(crate) priority: bool,
    /// `gang` is listed: gangs start all at once and are never victims.
    pub(crate) gang: bool,
    /// `proportion` is listed: the deserved share admits jobs first and
    /// bounds reclaim.
    pub(crate) proportion: bool,
    /// Tiers with at least one victim function, in order.
    pub(crate) victims: Vec<VictimTier>,
    /// Placement score weights (`binpack`, `spread`).
    pub(crate) binpack: u32,
    pub(crate) spread: u32,
}

/// `p` as a key component, highest first.
fn high_first(p: i32) -> u64 {
    (i64::from(i32::MAX) - i64::from(p)) as u64
}

impl Policy {
    /// Resolves `config.tiers` (and the older `binpack`/`spread` weights).
    /// Anything [`check_tiers`] refuses is made harmless: unknown plugins
    /// and second listings are ignored.
    pub(crate) fn new(config: &Config) -> Policy {
        let mut policy = Policy {
            queue_order: Vec::new(),
            tenant_order: Vec::new(),
            job_order: Vec::new(),
            priority: false,
            gang: false,
            proportion: false,
            victims: Vec::new(),
            binpack: config.binpack,
            spread: config.spread,
        };
        let mut seen = Vec::new();
        for tier in &config.tiers {
            let mut victims = VictimTier::default();
            for p in &tier.plugins {
                let Some(kind) = plugin(&p.name).filter(|k| !seen.contains(k)) else { continue };
                seen.push(kind);
                match kind {
                    Plugin::Priority => {
                        policy.priority = true;
                        policy.queue_order.push(QueueRule::Priority);
                        policy.tenant_order.push(TenantRule::Priority);
                        policy.job_order.push(JobRule::Priority);
                        victims.priority = true;
                    }
                    Plugin::Gang => policy.gang = true,
                    Plugin::Drf => {
                        policy.tenant_order.push(TenantRule::Share);
                        victims.drf = p.preemptable;
                    }
                    Plugin::Proportion => {
                        policy.proportion = true;
                        policy.queue_order.push(QueueRule::Share);
                        victims.proportion = true;
                    }
                    Plugin::Fairness => policy.tenant_order.push(TenantRule::Served),
                    Plugin::CriticalPath => policy.job_order.push(JobRule::Path),
                    Plugin::Binpack => policy.binpack = policy.binpack.saturating_add(p.weight.unwrap_or(1)),
                    Plugin::Spread => policy.spread = policy.spread.saturating_add(p.weight.unwrap_or(1)),
                    Plugin::Predicates => {}
                }
            }
            if victims != VictimTier::default() {
                policy.victims.push(victims);
            }
        }
        policy
    }

    /// A leaf queue's key: its `priority`, its `share` of its deserved
    /// amount, in the configured order, then its index.
    pub(crate) fn queue_key(&self, priority: i32, share: u64, q: QueueIdx) -> QueueKey {
        let mut key = [0; 2];
        for (k, rule) in key.iter_mut().zip(&self.queue_order) {
            *k = match rule {
                QueueRule::Priority => high_first(priority),
                QueueRule::Share => share,
            };
        }
        (key, q)
    }

    /// A tenant's key: its highest queued priority (`top`), its dominant
    /// `share`, when it was last `served`, in the configured order, then the
    /// tenant (first arrival).
    pub(crate) fn tenant_key(&self, top: i32, share: u64, served: u64, t: TenantIdx) -> TenantKey {
        let mut key = [0; 3];
        for (k, rule) in key.iter_mut().zip(&self.tenant_order) {
            *k = match rule {
                TenantRule::Priority => high_first(top),
                TenantRule::Share => share,
                TenantRule::Served => served,
            };
        }
        (key, t)
    }

    /// A job's key among its tenant's jobs: its priority and remaining
    /// path in the configured order, then `seq` (first scheduled).
    pub(crate) fn job_key(&self, priority: i32, path: u64, seq: u64) -> JobKey {
        let mut order = [0; 2];
        for (k, rule) in order.iter_mut().zip(&self.job_order) {
            *k = match rule {
                JobRule::Priority => high_first(priority),
                JobRule::Path => u64::MAX - path,
            };
        }
        JobKey { order, seq }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{PluginConfig, Tier};

    #[test]
    fn default_tiers_give_the_fixed_order() {
        let p = Policy::new(&Config::default());
        assert!(p.priority && p.gang && p.proportion);
        assert_eq!(p.queue_order, [QueueRule::Priority, QueueRule::Share]);
        assert_eq!(p.tenant_order, [TenantRule::Priority, TenantRule::Share, TenantRule::Served]);
        assert_eq!(p.job_order, [JobRule::Priority, JobRule::Path]);
        let preempt = VictimTier { priority: true, ..VictimTier::default() };
        let reclaim = VictimTier { proportion: true, ..VictimTier::default() };
        assert_eq!(p.victims, [preempt, reclaim]);
        assert_eq!((p.binpack, p.spread), (0, 0));
        // Higher priority, longer path: smaller keys.
        assert!(p.job_key(5, 0, 9) < p.job_key(4, 100, 1));
        assert!(p.job_key(0, 100, 9) < p.job_key(0, 99, 1));
        assert!(p.tenant_key(i32::MAX, 9, 9, 9) < p.tenant_key(i32::MIN, 0, 0, 0));
        assert!(p.queue_key(1, 900, 3) < p.queue_key(0, 0, 0));
    }

    #[test]
    fn plugins_left_out_drop_their_rules() {
        let config = Config {
            tiers: vec![Tier::of(&["critical-path", "fairness"]), Tier::of(&["drf"])],
            binpack: 2,
            ..Config::default()
        };
        let p = Policy::new(&config);
        assert!(!p.priority && !p.gang && !p.proportion && p.victims.is_empty());
        assert_eq!(p.tenant_key(9, 5, 1, 0), ([1, 5, 0], 0));
        assert_eq!(p.job_key(9, 10, 3), JobKey { order: [u64::MAX - 10, 0], seq: 3 });
        assert_eq!(p.queue_key(9, 5, 2), ([0, 0], 2));
        assert_eq!(p.binpack, 2);
    }

    #[test]
    fn every_problem_is_listed() {
        let weighted = PluginConfig { weight: Some(2), ..PluginConfig::named("drf") };
        let zero = PluginConfig { weight: Some(0), ..PluginConfig::named("spread") };
        let preemptable = PluginConfig { preemptable: true, ..PluginConfig::named("gang") };
        let config = Config {
            tiers: vec![
                Tier::of(&["priority", "nodeorder", "priority", "binpack"]),
                Tier { plugins: vec![weighted, zero, preemptable] },
                Tier::default(),
                Tier::of(&["gang"]),
            ],
            binpack: 1,
            ..Config::default()
        };
        let errors = config.validate().unwrap_err();
        let known = "priority, gang, drf, proportion, fairness, critical-path, binpack, spread, predicates";
        assert_eq!(
            errors,
            [
                format!("tier 1: unknown plugin \"nodeorder\" (known: {known})"),
                "tier 1: plugin priority is listed twice".to_owned(),
                "plugin drf: only binpack and spread take a weight".to_owned(),
                "plugin spread: weight must be at least 1 (leave the plugin out to switch it off)".to_owned(),
                "plugin gang: only drf takes preemptable".to_owned(),
                "tier 3 lists no plugins".to_owned(),
                "plugin gang is listed in tier 2 and again in tier 4".to_owned(),
                "binpack is both listed in a tier and given as a weight (binpack = 1): keep one".to_owned(),
            ]
        );
        assert_eq!(Config::default().validate(), Ok(()));
    }
}
