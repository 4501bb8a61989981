//! A deterministic generator with no dependencies, so that test modules shared by path with
//! another workspace (`gpu-adopt` includes `burn-mapped/tests/q8_common`) can include it too.

/// A xorshift64 generator (its state, never zero): the same numbers on every run from the same
/// state.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// A generator for `seed`, mixed so that nearby seeds part at once.
    pub fn seeded(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

impl Iterator for XorShift {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        Some(self.next_u64())
    }
}
