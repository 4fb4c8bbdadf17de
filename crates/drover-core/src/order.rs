//! A sorted set of small keys whose common change is a move: [`Order`].
//!
//! Each leaf queue lists its tenants with queued jobs in the order a draw
//! walks them (`Scheduler::orders`). Nearly every event re-keys one or two
//! of them: a run's start and end move its tenant's dominant share and last
//! service. So the set's hot operation is a move, a key out and its
//! replacement in. For the tens to hundreds of tenants a queue usually has,
//! a sorted vector does a move with two binary searches and one shift of
//! the keys between the two places (a few hundred bytes), where a B-tree
//! does two descents with their key comparisons, node shifts and
//! rebalancing (about 2,100 instructions per event in the core's benchmark,
//! a fifth of all; the vector made the event 7% faster).
//! The shift grows with the number of tenants, so past [`MANY`] keys the set
//! becomes a B-tree, and goes back to a vector below half of that.

use std::collections::BTreeSet;
use std::ops::Bound::{Excluded, Unbounded};

/// Keys beyond which an [`Order`] is a B-tree (a shift of up to this many
/// keys, 8 KiB of 32-byte keys, stays cheaper than two descents).
const MANY: usize = 256;

/// A sorted set of distinct keys.
#[derive(Clone, Debug)]
pub(crate) enum Order<K: Ord + Copy> {
    /// Sorted, at most [`MANY`] keys.
    Few(Vec<K>),
    Many(BTreeSet<K>),
}

impl<K: Ord + Copy> Default for Order<K> {
    fn default() -> Self {
        Order::Few(Vec::new())
    }
}

/// Two orders with the same keys are equal, whatever their form.
impl<K: Ord + Copy> PartialEq for Order<K> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Ord + Copy> Eq for Order<K> {}

/// Written as its keys in order; read back in the form their number calls
/// for.
impl<K: Ord + Copy + serde::Serialize> serde::Serialize for Order<K> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de, K: Ord + Copy + serde::Deserialize<'de>> serde::Deserialize<'de> for Order<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let keys = Vec::<K>::deserialize(deserializer)?;
        if !keys.is_sorted_by(|a, b| a < b) {
            return Err(serde::de::Error::custom("the keys of an order are not sorted and distinct"));
        }
        Ok(if keys.len() <= MANY { Order::Few(keys) } else { Order::Many(keys.into_iter().collect()) })
    }
}

impl<K: Ord + Copy> Order<K> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Order::Few(v) => v.len(),
            Order::Many(s) => s.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The smallest key.
    pub(crate) fn first(&self) -> Option<K> {
        match self {
            Order::Few(v) => v.first().copied(),
            Order::Many(s) => s.first().copied(),
        }
    }

    /// The smallest key greater than `key` (which need not be present).
    pub(crate) fn after(&self, key: &K) -> Option<K> {
        match self {
            Order::Few(v) => v.get(v.partition_point(|k| k <= key)).copied(),
            Order::Many(s) => s.range((Excluded(key), Unbounded)).next().copied(),
        }
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        match self {
            Order::Few(v) => v.binary_search(key).is_ok(),
            Order::Many(s) => s.contains(key),
        }
    }

    /// Every key, in order.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = K> + '_> {
        match self {
            Order::Few(v) => Box::new(v.iter().copied()),
            Order::Many(s) => Box::new(s.iter().copied()),
        }
    }

    /// Takes `old` out (when given; it must be present) and puts `new` in
    /// (when given; it must not be present unless it is `old`).
    pub(crate) fn replace(&mut self, old: Option<K>, new: Option<K>) {
        match self {
            Order::Few(v) => {
                match (old, new) {
                    (Some(old), Some(new)) => {
                        let i = v.binary_search(&old).expect("the old key is filed");
                        debug_assert!(
                            new == old || v.binary_search(&new).is_err(),
                            "the new key is not filed"
                        );
                        // Where `new` goes among the others: the keys between
                        // the two places shift by one toward `i`.
                        let j = v.partition_point(|k| *k < new);
                        if j > i {
                            v.copy_within(i + 1..j, i);
                            v[j - 1] = new;
                        } else {
                            v.copy_within(j..i, j + 1);
                            v[j] = new;
                        }
                    }
                    (Some(old), None) => {
                        let i = v.binary_search(&old).expect("the old key is filed");
                        v.remove(i);
                    }
                    (None, Some(new)) => {
                        let j = v.partition_point(|k| *k < new);
                        debug_assert!(v.get(j) != Some(&new), "the new key is not filed");
                        v.insert(j, new);
                        if v.len() > MANY {
                            *self = Order::Many(v.iter().copied().collect());
                        }
                    }
                    (None, None) => {}
                }
            }
            Order::Many(s) => {
                if let Some(old) = old {
                    let filed = s.remove(&old);
                    debug_assert!(filed, "the old key is filed");
                }
                if let Some(new) = new {
                    let fresh = s.insert(new);
                    debug_assert!(fresh, "the new key is not filed");
                }
                if s.len() < MANY / 2 {
                    *self = Order::Few(s.iter().copied().collect());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of moves, insertions and removals, across both
        /// forms, leaves the keys a `BTreeSet` given the same changes
        /// holds, and answers `first`, `after` and `contains` as it does.
        #[test]
        fn an_order_agrees_with_a_btree_set(steps in prop::collection::vec((0u32..700, 0u32..700, 0u8..4), 1..2_000)) {
            let mut order = Order::default();
            let mut model = BTreeSet::new();
            for (a, b, op) in steps {
                let (old, new) = match op {
                    // Insert a (bulk up: two of four steps grow the set).
                    0 | 1 => (None, (!model.contains(&a)).then_some(a)),
                    // Remove a, if present.
                    2 => (model.contains(&a).then_some(a), None),
                    // Move a to b.
                    _ => match (model.contains(&a), model.contains(&b)) {
                        (true, false) => (Some(a), Some(b)),
                        _ => (None, None),
                    },
                };
                order.replace(old, new);
                if let Some(old) = old {
                    model.remove(&old);
                }
                if let Some(new) = new {
                    model.insert(new);
                }
                prop_assert_eq!(order.len(), model.len());
                prop_assert!(order.iter().eq(model.iter().copied()));
                prop_assert_eq!(order.first(), model.first().copied());
                prop_assert_eq!(order.after(&b), model.range((Excluded(b), Unbounded)).next().copied());
                prop_assert_eq!(order.contains(&b), model.contains(&b));
                if let Order::Few(v) = &order {
                    prop_assert!(v.len() <= MANY);
                }
            }
        }
    }

    #[test]
    fn an_order_becomes_a_tree_past_many_keys_and_a_vector_again_below_half() {
        let mut order = Order::default();
        for k in 0..=MANY as u32 {
            order.replace(None, Some(k));
        }
        assert!(matches!(order, Order::Many(_)));
        let few: Order<u32> = Order::Few((0..=MANY as u32).collect());
        assert_eq!(order, few, "equal keys, either form");
        // 257 keys; taking out the 130 smallest leaves 127, under half.
        let low = (MANY / 2 + 2) as u32;
        for k in 0..low {
            order.replace(Some(k), None);
            assert_eq!(matches!(order, Order::Few(_)), k + 1 == low, "a tree until under half");
        }
        assert!(order.iter().eq(low..=MANY as u32));
        // A move in each direction keeps the vector sorted.
        order.replace(Some(MANY as u32), Some(0));
        order.replace(Some(low), Some(1_000));
        let mut expect: Vec<u32> = (low + 1..MANY as u32).collect();
        expect.insert(0, 0);
        expect.push(1_000);
        assert!(order.iter().eq(expect));
    }
}
