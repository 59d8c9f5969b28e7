//! The per-slot generator state of the sampling kernel.
//!
//! The CPU backend samples with `rand_xoshiro::Xoshiro256PlusPlus`, seeded
//! with `seed_from_u64` (SplitMix64 fills the four state words). The CUDA
//! kernel (`sampling.cu`, `xoshiro_next`) advances the same four words on the
//! device, one `next_u64` per sampled token, exactly when the CPU does; this
//! module computes the initial state on the host at slot reset and carries a
//! host copy of the step function, tested against `rand_xoshiro`, so that the
//! device code has a checked twin.
//!
//! Invariant: [`seed_state`] and [`next_u64`] produce the sequence of
//! `Xoshiro256PlusPlus::seed_from_u64(seed)` bit for bit.

/// The four state words, in the order the kernel stores them.
pub type XoshiroState = [u64; 4];

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The state of `Xoshiro256PlusPlus::seed_from_u64(seed)`.
pub fn seed_state(seed: u64) -> XoshiroState {
    let mut x = seed;
    [
        splitmix64(&mut x),
        splitmix64(&mut x),
        splitmix64(&mut x),
        splitmix64(&mut x),
    ]
}

/// One step of xoshiro256++, as `xoshiro_next` in `sampling.cu`.
pub fn next_u64(s: &mut XoshiroState) -> u64 {
    let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
    let t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s[3].rotate_left(45);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::{RngCore, SeedableRng};

    #[test]
    fn matches_rand_xoshiro_bit_for_bit() {
        for seed in [0u64, 1, 42, 0xdead_beef, u64::MAX] {
            let mut want = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
            let mut got = seed_state(seed);
            for _ in 0..1000 {
                assert_eq!(next_u64(&mut got), want.next_u64(), "seed {seed}");
            }
        }
    }
}
