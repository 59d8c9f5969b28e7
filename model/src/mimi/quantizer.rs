//! Mimi's split residual vector quantizer (official
//! `SplitResidualVectorQuantizer`): `rvq_first` (one codebook) and `rvq_rest`
//! (the others) both quantize the same latent, each after its own 1×1-conv
//! input projection; decoding sums each part's codebook vectors, applies its
//! output projection, and adds the two parts.
//!
//! A codebook vector is `embedding_sum / max(cluster_usage, 1e-5)` (the
//! official `EuclideanCodebook.epsilon`). The nearest neighbour reproduces
//! `torch.cdist(p=2)` followed by `argmin` (first index on ties): with more
//! than 25 codebook entries torch takes its matrix-product path,
//! `sqrt(max(0, [−2x, ‖x‖², 1]·[e, 1, ‖e‖²]))`, which we compute the same way
//! (the `[e, 1, ‖e‖²]` rows are precomputed at load); with 25 or fewer entries it
//! takes the direct `sqrt(Σ(x−e)²)`, and so do we.
//!
//! Invariants: codebooks beyond the ones used are read (every tensor is
//! taken) but not kept; `encode`/`decode` do not allocate.

use super::linear::PackedLinear;
use crate::config::QuantizerConfig;
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// The official `EuclideanCodebook` epsilon.
const CODEBOOK_EPS: f32 = 1e-5;
/// torch.cdist switches to its matrix-product path above this many rows.
const CDIST_MM_THRESHOLD: usize = 25;

#[derive(Debug, Clone)]
struct Rvq {
    /// `quantizer.rvq_first` / `quantizer.rvq_rest`.
    prefix: String,
    /// Codebooks stored in the checkpoint.
    stored: usize,
    /// Codebooks used.
    used: usize,
    /// `[dq][d]`.
    in_proj: PackedLinear,
    /// `[d][dq]`.
    out_proj: PackedLinear,
    /// Per used codebook, the vectors `[bins][dq]`.
    books: Vec<Vec<f32>>,
    /// Per used codebook, the rows `[e, 1, ‖e‖²]` (`[bins][dq + 2]`) for the distances.
    dist: Vec<PackedLinear>,
}

/// Scratch for `encode`/`decode` over at most `rows` rows.
#[derive(Debug, Clone)]
pub(crate) struct QuantScratch {
    xq: Vec<f32>,
    x1: Vec<f32>,
    dists: Vec<f32>,
    qsum: Vec<f32>,
    part: Vec<f32>,
}

/// The split RVQ with `used` active codebooks (1 in `rvq_first`, `used − 1` in `rvq_rest`).
#[derive(Debug, Clone)]
pub(crate) struct SplitRvq {
    d: usize,
    dq: usize,
    bins: usize,
    used: usize,
    first: Rvq,
    rest: Rvq,
}

impl SplitRvq {
    /// A skeleton for `cfg` using `used` codebooks (1 ≤ used ≤ n_q).
    pub(crate) fn new(cfg: &QuantizerConfig, used: usize) -> Self {
        assert!(
            used >= 1 && used <= cfg.n_q,
            "num_codebooks must be between 1 and the {} stored, got {used}",
            cfg.n_q
        );
        let rvq = |name: &str, stored: usize, used: usize| Rvq {
            prefix: format!("quantizer.{name}"),
            stored,
            used,
            in_proj: PackedLinear::default(),
            out_proj: PackedLinear::default(),
            books: Vec::new(),
            dist: Vec::new(),
        };
        SplitRvq {
            d: cfg.input_dimension,
            dq: cfg.dimension,
            bins: cfg.bins,
            used,
            first: rvq("rvq_first", 1, 1),
            rest: rvq("rvq_rest", cfg.n_q - 1, used - 1),
        }
    }

    /// Codebooks used per frame.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    pub(crate) fn bins(&self) -> usize {
        self.bins
    }

    fn rvq_specs(&self, r: &Rvq, out: &mut Vec<TensorSpec>) {
        out.push(TensorSpec::new(
            format!("{}.input_proj.weight", r.prefix),
            &[self.dq, self.d, 1],
        ));
        out.push(TensorSpec::new(
            format!("{}.output_proj.weight", r.prefix),
            &[self.d, self.dq, 1],
        ));
        for i in 0..r.stored {
            let p = format!("{}.vq.layers.{i}._codebook", r.prefix);
            out.push(TensorSpec::new(format!("{p}._initialized"), &[1]));
            out.push(TensorSpec::new(format!("{p}.cluster_usage"), &[self.bins]));
            out.push(TensorSpec::new(
                format!("{p}.embedding_sum"),
                &[self.bins, self.dq],
            ));
        }
    }

    pub(crate) fn specs(&self, out: &mut Vec<TensorSpec>) {
        self.rvq_specs(&self.first, out);
        self.rvq_specs(&self.rest, out);
    }

    pub(crate) fn load(&mut self, weights: &mut Weights) -> Result<(), CheckpointError> {
        let (d, dq, bins) = (self.d, self.dq, self.bins);
        for r in [&mut self.first, &mut self.rest] {
            let w = weights.take(&format!("{}.input_proj.weight", r.prefix), &[dq, d, 1])?;
            r.in_proj = PackedLinear::from_rows(&w, dq, d);
            let w = weights.take(&format!("{}.output_proj.weight", r.prefix), &[d, dq, 1])?;
            r.out_proj = PackedLinear::from_rows(&w, d, dq);
            r.books.clear();
            r.dist.clear();
            for i in 0..r.stored {
                let p = format!("{}.vq.layers.{i}._codebook", r.prefix);
                // `_initialized` only matters for training.
                weights.take(&format!("{p}._initialized"), &[1])?;
                let usage = weights.take(&format!("{p}.cluster_usage"), &[bins])?;
                let sum = weights.take(&format!("{p}.embedding_sum"), &[bins, dq])?;
                if i >= r.used {
                    continue;
                }
                let (book, aug) = codebook(&sum, &usage, dq);
                r.books.push(book);
                r.dist.push(PackedLinear::from_rows(&aug, bins, dq + 2));
            }
        }
        Ok(())
    }

    pub(crate) fn new_scratch(&self, rows: usize) -> QuantScratch {
        QuantScratch {
            xq: vec![0.0; rows * self.dq],
            x1: vec![0.0; rows * (self.dq + 2)],
            dists: vec![0.0; rows * self.bins],
            qsum: vec![0.0; rows * self.dq],
            part: vec![0.0; rows * self.d],
        }
    }

    /// Codes `[n][used]` of the latents `[n][d]`.
    pub(crate) fn encode(&self, sc: &mut QuantScratch, emb: &[f32], n: usize, codes: &mut [u32]) {
        let mut col = 0;
        for r in [&self.first, &self.rest] {
            if r.used == 0 {
                continue;
            }
            r.in_proj.forward(emb, n, &mut sc.xq[..n * self.dq]);
            for (book, dist) in r.books.iter().zip(&r.dist) {
                self.nearest(sc, book, dist, n, codes, col);
                col += 1;
            }
        }
    }

    /// For each row of `sc.xq`: the nearest entry of `book` into
    /// `codes[row·used + col]`, and the residual update.
    fn nearest(
        &self,
        sc: &mut QuantScratch,
        book: &[f32],
        dist: &PackedLinear,
        n: usize,
        codes: &mut [u32],
        col: usize,
    ) {
        let (dq, bins) = (self.dq, self.bins);
        let w = dq + 2;
        if bins > CDIST_MM_THRESHOLD {
            for (x, x1) in sc.xq[..n * dq]
                .chunks_exact(dq)
                .zip(sc.x1.chunks_exact_mut(w))
            {
                for (a, b) in x1.iter_mut().zip(x) {
                    *a = -2.0 * b;
                }
                x1[dq] = x.iter().map(|v| v * v).sum();
                x1[dq + 1] = 1.0;
            }
            dist.forward(&sc.x1, n, &mut sc.dists[..n * bins]);
            for v in &mut sc.dists[..n * bins] {
                *v = v.max(0.0).sqrt();
            }
        } else {
            for r in 0..n {
                let x = &sc.xq[r * dq..(r + 1) * dq];
                for (e, out) in book
                    .chunks_exact(dq)
                    .zip(&mut sc.dists[r * bins..(r + 1) * bins])
                {
                    let s: f32 = x.iter().zip(e).map(|(a, b)| (a - b) * (a - b)).sum();
                    *out = s.sqrt();
                }
            }
        }
        for r in 0..n {
            let dist = &sc.dists[r * bins..(r + 1) * bins];
            let mut best = 0;
            for (i, v) in dist.iter().enumerate() {
                if *v < dist[best] {
                    best = i;
                }
            }
            codes[r * self.used + col] = best as u32;
            let e = &book[best * dq..(best + 1) * dq];
            for (x, v) in sc.xq[r * dq..(r + 1) * dq].iter_mut().zip(e) {
                *x -= v;
            }
        }
    }

    /// Latents `[n][d]` of the codes `[n][used]`.
    pub(crate) fn decode(&self, sc: &mut QuantScratch, codes: &[u32], n: usize, out: &mut [f32]) {
        let (dq, d) = (self.dq, self.d);
        let mut col = 0;
        let mut first_part = true;
        for r in [&self.first, &self.rest] {
            if r.used == 0 {
                continue;
            }
            sc.qsum[..n * dq].fill(0.0);
            for book in &r.books {
                for row in 0..n {
                    let c = codes[row * self.used + col] as usize;
                    assert!(
                        c < self.bins,
                        "code {c} out of range (codebook size {})",
                        self.bins
                    );
                    let e = &book[c * dq..(c + 1) * dq];
                    for (q, v) in sc.qsum[row * dq..(row + 1) * dq].iter_mut().zip(e) {
                        *q += v;
                    }
                }
                col += 1;
            }
            if first_part {
                r.out_proj.forward(&sc.qsum, n, &mut out[..n * d]);
                first_part = false;
            } else {
                r.out_proj.forward(&sc.qsum, n, &mut sc.part[..n * d]);
                for (o, p) in out[..n * d].iter_mut().zip(&sc.part) {
                    *o += p;
                }
            }
        }
    }
}

/// The vectors `e = embedding_sum / max(cluster_usage, eps)` (`[bins][dq]`)
/// and the distance rows `[e, 1, ‖e‖²]` (`[bins][dq + 2]`).
fn codebook(sum: &[f32], usage: &[f32], dq: usize) -> (Vec<f32>, Vec<f32>) {
    let w = dq + 2;
    let mut book = vec![0.0; usage.len() * dq];
    let mut aug = vec![0.0; usage.len() * w];
    for (((e, row), s), u) in book
        .chunks_exact_mut(dq)
        .zip(aug.chunks_exact_mut(w))
        .zip(sum.chunks_exact(dq))
        .zip(usage)
    {
        let u = u.max(CODEBOOK_EPS);
        for (o, v) in e.iter_mut().zip(s) {
            *o = v / u;
        }
        row[..dq].copy_from_slice(e);
        row[dq] = 1.0;
        row[dq + 1] = e.iter().map(|v| v * v).sum();
    }
    (book, aug)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rvq(bins: usize, used: usize) -> SplitRvq {
        let cfg = QuantizerConfig {
            dimension: 3,
            n_q: 4,
            bins,
            input_dimension: 4,
            output_dimension: 4,
        };
        let mut q = SplitRvq::new(&cfg, used);
        let eye = |o: usize, i: usize| -> Vec<f32> {
            (0..o * i)
                .map(|k| if k / i == k % i { 1.0 } else { 0.0 })
                .collect()
        };
        for r in [&mut q.first, &mut q.rest] {
            r.in_proj = PackedLinear::from_rows(&eye(3, 4), 3, 4);
            r.out_proj = PackedLinear::from_rows(&eye(4, 3), 4, 3);
            for b in 0..r.used {
                let sum: Vec<f32> = (0..bins * 3)
                    .map(|k| ((k + 7 * b) as f32 * 0.77).sin())
                    .collect();
                let (book, aug) = codebook(&sum, &vec![1.0; bins], 3);
                r.books.push(book);
                r.dist.push(PackedLinear::from_rows(&aug, bins, 5));
            }
        }
        q
    }

    #[test]
    fn both_distance_paths_find_nearest_and_decode_sums() {
        for bins in [16, 40] {
            let q = rvq(bins, 3);
            let mut sc = q.new_scratch(2);
            let emb = [0.3, -0.2, 0.5, 9.0, -0.4, 0.1, 0.0, 9.0];
            let mut codes = [0u32; 6];
            q.encode(&mut sc, &emb, 2, &mut codes);
            for r in 0..2 {
                // Brute force: rvq_first's single code, then rvq_rest's residual chain.
                let x = &emb[r * 4..r * 4 + 3];
                let near = |book: &[f32], x: &[f32]| -> usize {
                    let dist = |i: usize| -> f32 {
                        (0..3).map(|k| (x[k] - book[i * 3 + k]).powi(2)).sum()
                    };
                    (0..bins)
                        .min_by(|&a, &b| dist(a).partial_cmp(&dist(b)).unwrap())
                        .unwrap()
                };
                assert_eq!(codes[r * 3] as usize, near(&q.first.books[0], x));
                let c1 = near(&q.rest.books[0], x);
                assert_eq!(codes[r * 3 + 1] as usize, c1);
                let res: Vec<f32> = (0..3).map(|k| x[k] - q.rest.books[0][c1 * 3 + k]).collect();
                assert_eq!(codes[r * 3 + 2] as usize, near(&q.rest.books[1], &res));
            }
            let mut out = [0.0; 8];
            q.decode(&mut sc, &codes, 2, &mut out);
            let e = |b: &[f32], c: u32, k: usize| b[c as usize * 3 + k];
            for (k, o) in out.iter().enumerate().take(3) {
                let want = e(&q.first.books[0], codes[0], k)
                    + (e(&q.rest.books[0], codes[1], k) + e(&q.rest.books[1], codes[2], k));
                assert!((o - want).abs() < 1e-6);
            }
            assert_eq!(out[3], 0.0);
        }
    }
}
