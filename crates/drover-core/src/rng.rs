//! A seeded splitmix64 generator: the only randomness in the core. Its state is
//! part of the scheduler's state, so replaying events replays every draw.

/// splitmix64 (Steele, Lea and Flood, 2014): tiny, fast and good enough to
/// choose among a handful of queues.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        // Multiply-shift: unbiased enough for n of a few, and branch-free.
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn same_seed_same_draws_and_all_values_reachable() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let draws: Vec<usize> = (0..300).map(|_| a.below(3)).collect();
        assert_eq!(draws, (0..300).map(|_| b.below(3)).collect::<Vec<_>>());
        for v in 0..3 {
            let count = draws.iter().filter(|&&d| d == v).count();
            assert!((60..140).contains(&count), "value {v} drawn {count} times of 300");
        }
    }
}
