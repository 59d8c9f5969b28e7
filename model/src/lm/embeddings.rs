//! Token embeddings (`ScaledEmbedding` of the official code), optionally
//! low-rank: a table of `rank`-wide rows followed by a `[dim, rank]`
//! projection (`{name}.low_rank.weight`).
//!
//! Invariants: tokens are never the official "zero" id (−1) here: every token
//! the LM step embeds is a real or an initial token, so the zeroing branch of
//! the official module has nothing to do. Lookups index the table directly and
//! never allocate.

use super::linear::linear_acc;
use crate::weights::{CheckpointError, TensorSpec, Weights};

/// One embedding table.
pub(crate) struct Embedding {
    /// `[rows, width]`, row-major; `width` is the rank when low-rank.
    table: Vec<f32>,
    rows: usize,
    width: usize,
    /// Output width.
    dim: usize,
    /// `[dim, rank]` projection of a low-rank embedding.
    low_rank: Option<Vec<f32>>,
}

impl Embedding {
    /// The tensors of an embedding called `name` (e.g. `emb.0`).
    pub(crate) fn specs(
        name: &str,
        rows: usize,
        dim: usize,
        rank: Option<usize>,
        out: &mut Vec<TensorSpec>,
    ) {
        out.push(TensorSpec::new(
            format!("{name}.weight"),
            &[rows, rank.unwrap_or(dim)],
        ));
        if let Some(r) = rank {
            out.push(TensorSpec::new(
                format!("{name}.low_rank.weight"),
                &[dim, r],
            ));
        }
    }

    /// Loads an embedding called `name`.
    pub(crate) fn load(
        w: &mut Weights,
        name: &str,
        rows: usize,
        dim: usize,
        rank: Option<usize>,
    ) -> Result<Self, CheckpointError> {
        let width = rank.unwrap_or(dim);
        let table = w.take(&format!("{name}.weight"), &[rows, width])?;
        let low_rank = match rank {
            Some(r) => Some(w.take(&format!("{name}.low_rank.weight"), &[dim, r])?),
            None => None,
        };
        Ok(Embedding {
            table,
            rows,
            width,
            dim,
            low_rank,
        })
    }

    /// Width of a stored row (the rank of a low-rank embedding).
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The stored row of a token.
    #[inline]
    pub(crate) fn row(&self, token: u32) -> &[f32] {
        let t = token as usize;
        assert!(
            t < self.rows,
            "token {t} outside an embedding of {} rows",
            self.rows
        );
        &self.table[t * self.width..(t + 1) * self.width]
    }

    /// Mutable stored row (for the Hibiki loader rule).
    pub(crate) fn row_mut(&mut self, token: usize) -> &mut [f32] {
        &mut self.table[token * self.width..(token + 1) * self.width]
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// `y[r] += embed(tokens[r])` for every row `r` (y is `[n, dim]`).
    /// `tmp` (`[n, rank]`) holds the gathered low-rank rows.
    pub(crate) fn add_rows(
        &self,
        tokens: impl Iterator<Item = u32>,
        y: &mut [f32],
        tmp: &mut [f32],
    ) {
        match &self.low_rank {
            None => {
                for (t, yr) in tokens.zip(y.chunks_exact_mut(self.dim)) {
                    for (o, e) in yr.iter_mut().zip(self.row(t)) {
                        *o += e;
                    }
                }
            }
            Some(proj) => {
                let mut n = 0;
                for (t, tr) in tokens.zip(tmp.chunks_exact_mut(self.width)) {
                    tr.copy_from_slice(self.row(t));
                    n += 1;
                }
                linear_acc(&tmp[..n * self.width], n, proj, self.dim, self.width, y);
            }
        }
    }
}
