//! Resource accounting on a worker: capacity, use, exclusive holds and
//! reservations.
//!
//! A job's resource shape is interned as a [`ClassKey`]. A worker can run a
//! class *statically* if its labels match and its capacity covers the request
//! (checked once per worker and class), and *now* if its free resources cover
//! the request, no exclusive hold or pending exclusive interest blocks a token
//! it needs, and, if the worker holds a reservation for another job, enough is
//! left over for that job ([`WorkerResources::fits`]).

use std::collections::{BTreeMap, BTreeSet};

/// Index of an interned token name.
pub(crate) type TokenIdx = u32;

/// A job's resource shape: what it takes, what it takes exclusively, and the
/// labels it needs. Jobs of one class are interchangeable for placement.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct ClassKey {
    pub(crate) slots: u32,
    pub(crate) cpu: u64,
    pub(crate) memory: u64,
    /// Sorted by token; amounts are at least 1.
    pub(crate) tokens: Vec<(TokenIdx, u64)>,
    /// Sorted; each also appears in `tokens`.
    pub(crate) exclusive: Vec<TokenIdx>,
    /// Sorted required labels.
    pub(crate) labels: Vec<(String, String)>,
}

impl ClassKey {
    /// The smallest request of `keys` in slots, CPU and memory (no tokens,
    /// no labels): whatever fits nowhere, none of them fits there.
    pub(crate) fn least<'a>(keys: impl Iterator<Item = &'a ClassKey>) -> Option<ClassKey> {
        keys.fold(None, |least: Option<ClassKey>, k| {
            Some(match least {
                None => ClassKey { slots: k.slots, cpu: k.cpu, memory: k.memory, ..ClassKey::default() },
                Some(l) => ClassKey {
                    slots: l.slots.min(k.slots),
                    cpu: l.cpu.min(k.cpu),
                    memory: l.memory.min(k.memory),
                    ..l
                },
            })
        })
    }

    fn amount(&self, token: TokenIdx) -> u64 {
        self.tokens.binary_search_by_key(&token, |(t, _)| *t).map(|i| self.tokens[i].1).unwrap_or(0)
    }
}

/// Capacity and use of one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct WorkerResources {
    pub(crate) slots: u32,
    pub(crate) cpu: u64,
    pub(crate) memory: u64,
    pub(crate) tokens: BTreeMap<TokenIdx, u64>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) used_slots: u32,
    pub(crate) used_cpu: u64,
    pub(crate) used_memory: u64,
    pub(crate) used_tokens: BTreeMap<TokenIdx, u64>,
    /// Tokens held exclusively by a running job.
    pub(crate) exclusive_held: BTreeSet<TokenIdx>,
}

impl WorkerResources {
    /// Could this worker ever run the class (labels and capacity)?
    pub(crate) fn capable(&self, key: &ClassKey) -> bool {
        key.labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
            && key.slots <= self.slots
            && key.cpu <= self.cpu
            && key.memory <= self.memory
            && key.tokens.iter().all(|(t, n)| self.tokens.get(t).is_some_and(|cap| n <= cap))
    }

    /// Can the class start here now? `reserved` is the class of a job this
    /// worker holds a reservation for, when the asker is someone else: the
    /// asker must leave room for it and keep off the tokens it wants
    /// exclusively.
    pub(crate) fn fits(&self, key: &ClassKey, reserved: Option<&ClassKey>) -> bool {
        let (r_slots, r_cpu, r_mem) = reserved.map_or((0, 0, 0), |r| (r.slots, r.cpu, r.memory));
        if self.used_slots + key.slots + r_slots > self.slots
            || self.used_cpu + key.cpu + r_cpu > self.cpu
            || self.used_memory + key.memory + r_mem > self.memory
        {
            return false;
        }
        for &(token, amount) in &key.tokens {
            if self.exclusive_held.contains(&token) {
                return false;
            }
            let used = self.used_tokens.get(&token).copied().unwrap_or(0);
            let reserved_amount = match reserved {
                Some(r) if r.exclusive.binary_search(&token).is_ok() => return false,
                Some(r) => r.amount(token),
                None => 0,
            };
            let cap = self.tokens.get(&token).copied().unwrap_or(0);
            if used + amount + reserved_amount > cap {
                return false;
            }
        }
        key.exclusive.iter().all(|t| self.used_tokens.get(t).copied().unwrap_or(0) == 0)
    }

    /// Takes the class's resources. The caller checked [`Self::fits`].
    pub(crate) fn take(&mut self, key: &ClassKey) {
        self.used_slots += key.slots;
        self.used_cpu += key.cpu;
        self.used_memory += key.memory;
        for &(token, amount) in &key.tokens {
            *self.used_tokens.entry(token).or_insert(0) += amount;
        }
        self.exclusive_held.extend(key.exclusive.iter().copied());
    }

    /// Gives back what [`Self::take`] took.
    pub(crate) fn release(&mut self, key: &ClassKey) {
        self.used_slots -= key.slots;
        self.used_cpu -= key.cpu;
        self.used_memory -= key.memory;
        for &(token, amount) in &key.tokens {
            if let Some(used) = self.used_tokens.get_mut(&token) {
                *used -= amount;
                if *used == 0 {
                    self.used_tokens.remove(&token);
                }
            }
        }
        for token in &key.exclusive {
            self.exclusive_held.remove(token);
        }
    }

    /// A run of the class is suspended: it gives back its slots and CPU and
    /// keeps its memory and tokens.
    pub(crate) fn suspend(&mut self, key: &ClassKey) {
        self.used_slots -= key.slots;
        self.used_cpu -= key.cpu;
    }

    /// Can a suspended run of the class take its slots and CPU back now,
    /// leaving room for the job the worker is reserved for, if any?
    pub(crate) fn fits_resumed(&self, key: &ClassKey, reserved: Option<&ClassKey>) -> bool {
        let (r_slots, r_cpu, r_mem) = reserved.map_or((0, 0, 0), |r| (r.slots, r.cpu, r.memory));
        self.used_slots + key.slots + r_slots <= self.slots
            && self.used_cpu + key.cpu + r_cpu <= self.cpu
            && self.used_memory + r_mem <= self.memory
    }

    /// A suspended run of the class takes its slots and CPU back.
    pub(crate) fn resume(&mut self, key: &ClassKey) {
        self.used_slots += key.slots;
        self.used_cpu += key.cpu;
    }

    /// Is anything in use beyond capacity? (Checked by the invariants.)
    pub(crate) fn over_committed(&self) -> bool {
        self.used_slots > self.slots
            || self.used_cpu > self.cpu
            || self.used_memory > self.memory
            || self.used_tokens.iter().any(|(t, used)| *used > self.tokens.get(t).copied().unwrap_or(0))
    }

    /// How many runs of the class this worker could hold at once, idle
    /// (`u64::MAX` for a class that asks for nothing it has a limit on).
    pub(crate) fn holds_at_most(&self, key: &ClassKey) -> u64 {
        let within = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
        let tokens = key.tokens.iter().map(|&(t, n)| within(self.tokens.get(&t).copied().unwrap_or(0), n));
        let exclusive = if key.exclusive.is_empty() { u64::MAX } else { 1 };
        tokens
            .fold(within(u64::from(self.slots), u64::from(key.slots)), u64::min)
            .min(within(self.cpu, key.cpu))
            .min(within(self.memory, key.memory))
            .min(exclusive)
    }

    pub(crate) fn free_slot(&self) -> bool {
        self.used_slots < self.slots
    }

    /// Free slots, less those of the reserved class if any.
    pub(crate) fn free_slots_beside(&self, reserved: Option<&ClassKey>) -> u32 {
        (self.slots - self.used_slots.min(self.slots)).saturating_sub(reserved.map_or(0, |r| r.slots))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The idle capacity for a class is its scarcest resource's: slots,
    /// CPU, memory, each token, and one run at a time for a class that
    /// holds a token exclusively.
    #[test]
    fn a_worker_holds_as_many_runs_as_its_scarcest_resource_allows() {
        let worker = WorkerResources {
            slots: 8,
            cpu: 4000,
            memory: 16 << 30,
            tokens: [(0, 3)].into(),
            ..WorkerResources::default()
        };
        let key = |slots, cpu, memory, tokens: Vec<(TokenIdx, u64)>, exclusive: Vec<TokenIdx>| ClassKey {
            slots,
            cpu,
            memory,
            tokens,
            exclusive,
            ..ClassKey::default()
        };
        assert_eq!(worker.holds_at_most(&key(1, 0, 0, vec![], vec![])), 8, "slots");
        assert_eq!(worker.holds_at_most(&key(1, 1500, 0, vec![], vec![])), 2, "CPU");
        assert_eq!(worker.holds_at_most(&key(1, 0, 6 << 30, vec![], vec![])), 2, "memory");
        assert_eq!(worker.holds_at_most(&key(1, 0, 0, vec![(0, 1)], vec![])), 3, "a token");
        assert_eq!(worker.holds_at_most(&key(1, 0, 0, vec![(0, 1)], vec![0]),), 1, "an exclusive token");
        assert_eq!(worker.holds_at_most(&key(0, 0, 0, vec![], vec![])), u64::MAX, "nothing limited");
    }
}
