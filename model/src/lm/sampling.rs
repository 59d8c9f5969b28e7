//! Token sampling as the official `sample_token`: greedy argmax, or a draw
//! from `softmax(logits / temp)` restricted to the `top_k` largest logits.
//!
//! Invariants: nothing allocates (the caller owns the candidate scratch, at
//! least as long as the vocabulary); the draw for a slot depends only on its
//! logits and its own RNG, so a stream's samples do not depend on the batch it
//! shares. The RNG (xoshiro256++) cannot reproduce torch's generator bit for
//! bit; the distribution is the same, and a seed always gives the same draws.

use crate::ops::argmax;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// The per-slot random generator.
pub type SlotRng = Xoshiro256PlusPlus;

/// A generator seeded from a 64-bit seed.
pub fn slot_rng(seed: u64) -> SlotRng {
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

/// How one head's tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Sample (true) or take the argmax (false).
    pub use_sampling: bool,
    /// Temperature; `<= 0` means argmax, as in the official code.
    pub temp: f32,
    /// Keep the `top_k` largest logits; 0 (or ≥ the vocabulary) keeps all.
    pub top_k: usize,
}

impl Sampler {
    /// Greedy decoding.
    pub const GREEDY: Sampler = Sampler {
        use_sampling: false,
        temp: 0.0,
        top_k: 0,
    };

    /// Chooses a token. `scratch` must hold at least `logits.len()` entries.
    pub fn sample(&self, logits: &[f32], rng: &mut SlotRng, scratch: &mut [(f64, u32)]) -> u32 {
        if self.use_sampling && self.temp > 0.0 {
            sample_top_k(logits, self.temp, self.top_k, rng, scratch)
        } else {
            argmax(logits) as u32
        }
    }
}

/// A uniform number in `[0, 1)` with 53 random bits.
fn uniform(rng: &mut SlotRng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Draws from `softmax(logits / temp)` restricted to the `top_k` largest
/// logits (all of them when `top_k` is 0 or not smaller than the vocabulary).
pub fn sample_top_k(
    logits: &[f32],
    temp: f32,
    top_k: usize,
    rng: &mut SlotRng,
    scratch: &mut [(f64, u32)],
) -> u32 {
    let n = logits.len();
    assert!(n > 0 && scratch.len() >= n, "sampling scratch too small");
    let cand = &mut scratch[..n];
    for (i, (c, &l)) in cand.iter_mut().zip(logits).enumerate() {
        *c = (l as f64, i as u32);
    }
    let k = if top_k == 0 || top_k >= n { n } else { top_k };
    if k < n {
        // Largest first; the first k entries are then the top k (unordered).
        cand.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
    }
    let top = &mut cand[..k];
    let max = top.iter().map(|c| c.0).fold(f64::NEG_INFINITY, f64::max);
    let inv_t = 1.0 / temp as f64;
    let mut total = 0.0;
    for c in top.iter_mut() {
        c.0 = ((c.0 - max) * inv_t).exp();
        total += c.0;
    }
    if !(total.is_finite() && total > 0.0) {
        // Degenerate logits (all -inf or NaN): fall back to the argmax.
        return argmax(logits) as u32;
    }
    let u = uniform(rng) * total;
    let mut acc = 0.0;
    for c in top.iter() {
        acc += c.0;
        if u < acc {
            return c.1;
        }
    }
    // Rounding left `u` at the very top: the last candidate with weight.
    top.iter()
        .rev()
        .find(|c| c.0 > 0.0)
        .map_or(top[0].1, |c| c.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_first_argmax() {
        let mut rng = slot_rng(1);
        let mut sc = vec![(0.0, 0); 4];
        assert_eq!(
            Sampler::GREEDY.sample(&[0.0, 2.0, 2.0, 1.0], &mut rng, &mut sc),
            1
        );
        // temp 0 with sampling on is greedy too (the official rule).
        let s = Sampler {
            use_sampling: true,
            temp: 0.0,
            top_k: 3,
        };
        assert_eq!(s.sample(&[0.0, 2.0, 3.0, 1.0], &mut rng, &mut sc), 2);
    }

    #[test]
    fn top_k_frequencies_match_softmax() {
        let logits: Vec<f32> = (0..40)
            .map(|i| ((i * 7919) % 23) as f32 * 0.21 - 1.5)
            .collect();
        let (temp, k) = (0.8f32, 6usize);
        let s = Sampler {
            use_sampling: true,
            temp,
            top_k: k,
        };
        // Expected: softmax(logits / temp) over the k largest.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top = &order[..k];
        let w: Vec<f64> = top
            .iter()
            .map(|&i| ((logits[i] / temp) as f64).exp())
            .collect();
        let z: f64 = w.iter().sum();
        let mut rng = slot_rng(42);
        let mut sc = vec![(0.0, 0); logits.len()];
        let draws = 200_000;
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            counts[s.sample(&logits, &mut rng, &mut sc) as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            match top.iter().position(|&t| t == i) {
                None => assert_eq!(c, 0, "token {i} outside the top {k} was drawn"),
                Some(j) => {
                    let p = w[j] / z;
                    let f = c as f64 / draws as f64;
                    let sd = (p * (1.0 - p) / draws as f64).sqrt();
                    assert!((f - p).abs() < 5.0 * sd + 1e-4, "token {i}: {f} vs {p}");
                }
            }
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let logits: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let s = Sampler {
            use_sampling: true,
            temp: 1.0,
            top_k: 20,
        };
        let mut sc = vec![(0.0, 0); 64];
        let run = |seed| {
            let mut rng = slot_rng(seed);
            let mut sc = vec![(0.0, 0); 64];
            (0..100)
                .map(|_| s.sample(&logits, &mut rng, &mut sc))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // top_k larger than the vocabulary means "all".
        let all = Sampler { top_k: 1000, ..s };
        let mut rng = slot_rng(3);
        assert!((all.sample(&logits, &mut rng, &mut sc) as usize) < 64);
    }
}
