//! Short lists kept inside their owner: [`SmallList`].
//!
//! An artifact's holders (one to three workers, usually) are a short list
//! read on hot paths, where a `Vec` costs an allocation for each artifact
//! and a pointer to follow into cold memory on every read. A [`SmallList`] keeps up to `N` items in
//! its owner's own bytes and moves to the heap only past that.

use std::ops::Deref;

/// A list of `T` holding up to `N` items inline, more on the heap. Reads
/// go through the slice it derefs to; two lists with the same items are
/// equal, inline or not.
#[derive(Clone, Debug)]
pub(crate) enum SmallList<T: Copy + Default, const N: usize> {
    Inline {
        len: u8,
        items: [T; N],
    },
    /// Once spilled, a list stays on the heap.
    Heap(Vec<T>),
}

impl<T: Copy + Default, const N: usize> Default for SmallList<T, N> {
    fn default() -> Self {
        SmallList::Inline { len: 0, items: [T::default(); N] }
    }
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for SmallList<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq, const N: usize> Eq for SmallList<T, N> {}

/// Written as the sequence of its items; read back inline if they fit.
impl<T: Copy + Default + serde::Serialize, const N: usize> serde::Serialize for SmallList<T, N> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de, T: Copy + Default + serde::Deserialize<'de>, const N: usize> serde::Deserialize<'de>
    for SmallList<T, N>
{
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let items = Vec::<T>::deserialize(deserializer)?;
        if items.len() > N {
            return Ok(SmallList::Heap(items));
        }
        let mut list = SmallList::default();
        for (at, item) in items.into_iter().enumerate() {
            list.insert(at, item);
        }
        Ok(list)
    }
}

impl<T: Copy + Default, const N: usize> Deref for SmallList<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            SmallList::Inline { len, items } => &items[..*len as usize],
            SmallList::Heap(v) => v,
        }
    }
}

impl<'a, T: Copy + Default, const N: usize> IntoIterator for &'a SmallList<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Copy + Default, const N: usize> SmallList<T, N> {
    /// Moves a full inline list to the heap, with room to grow.
    fn spill(&mut self) -> &mut Vec<T> {
        if let SmallList::Inline { len, items } = self {
            let mut v = Vec::with_capacity(2 * N);
            v.extend_from_slice(&items[..*len as usize]);
            *self = SmallList::Heap(v);
        }
        match self {
            SmallList::Heap(v) => v,
            SmallList::Inline { .. } => unreachable!("spilled just above"),
        }
    }

    /// Inserts `x` at `at`, shifting the rest up.
    pub(crate) fn insert(&mut self, at: usize, x: T) {
        match self {
            SmallList::Inline { len, items } if (*len as usize) < N => {
                let n = *len as usize;
                items.copy_within(at..n, at + 1);
                items[at] = x;
                *len += 1;
            }
            _ => self.spill().insert(at, x),
        }
    }

    /// Takes the item at `at` out, shifting the rest down.
    pub(crate) fn remove(&mut self, at: usize) -> T {
        match self {
            SmallList::Inline { len, items } => {
                let n = *len as usize;
                let x = items[at];
                items.copy_within(at + 1..n, at);
                *len -= 1;
                x
            }
            SmallList::Heap(v) => v.remove(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(usize, u32),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<usize>(), any::<u32>()).prop_map(|(i, x)| Op::Insert(i, x)),
            any::<usize>().prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// A small list behaves as a `Vec`, inline or spilled, and equals
        /// another with the same items.
        #[test]
        fn behaves_as_a_vec(ops in prop::collection::vec(op(), 0..60)) {
            let (mut small, mut vec) = (SmallList::<u32, 3>::default(), Vec::new());
            for op in ops {
                match op {
                    Op::Insert(i, x) => {
                        let at = i % (vec.len() + 1);
                        small.insert(at, x);
                        vec.insert(at, x);
                    }
                    Op::Remove(i) if !vec.is_empty() => {
                        let at = i % vec.len();
                        prop_assert_eq!(small.remove(at), vec.remove(at));
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(&*small, &vec[..]);
                let mut rebuilt = SmallList::<u32, 3>::default();
                for (i, &x) in vec.iter().enumerate() {
                    rebuilt.insert(i, x);
                }
                prop_assert_eq!(&small, &rebuilt);
            }
        }
    }
}
