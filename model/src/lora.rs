//! LoRA adapters as Kyutai's `moshi-finetune` writes them
//! (`lora.safetensors` beside the base weights, `lora: true` in
//! `config.json`), merged into the base weights when they are read.
//!
//! The rule (moshi `modules/lora.py`, `replace_lora_with_linear`): for every
//! linear layer `<layer>` of the LM, `W' = W + scaling · (B @ A)` with `W` the
//! stored `[out, in]` weight, `A = <layer>.lora_A.weight` `[rank, in]`, `B =
//! <layer>.lora_B.weight` `[out, rank]`; `scaling` is `lora_scaling` as it is
//! (not divided by the rank). `<layer>` is the split-scheme module name
//! (`….self_attn.in_projs.{k}`), which is what [`crate::weights::Weights`]
//! presents whatever the base file stores, so a stacked base takes each
//! step's adapter in its row block. A tensor of the adapter file that is not
//! a `lora_A`/`lora_B` pair (moshi-finetune's `ft_embed` tables) replaces the
//! base tensor of that name, as the official loader's `load_state_dict`
//! does. The merge is computed in float32 (products accumulated in float64)
//! on the values read from the file, before any backend converts them.
//!
//! Refused, naming the tensor: an adapter for a layer the model does not
//! have, a linear layer without its adapter (the official loader fails on
//! both), a pair of the wrong shapes or of another rank than `lora_rank`, a
//! replacement of the wrong shape, and the older stacked adapter layout
//! (`….self_attn.in_proj.lora_A.weight`), which moshi-finetune does not
//! write.
//!
//! Invariants: [`LoraAdapter::check`] reads headers only; a merge reads the
//! two small adapter tensors of one layer and allocates only the merged
//! layer's values.

use crate::config::LoraConfig;
use crate::weights::{Checkpoint, CheckpointError, TensorSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Whether a split-scheme tensor name is the weight of one of the LM's
/// linear layers (every `nn.Linear` the official loader wraps).
pub fn is_linear_weight(name: &str) -> bool {
    name.contains(".self_attn.in_projs.")
        || name.contains(".self_attn.out_projs.")
        || name.ends_with(".linear_in.weight")
        || name.ends_with(".linear_out.weight")
        || name.starts_with("depformer_in.")
        || name.starts_with("linears.")
        || name == "text_linear.weight"
}

/// One layer's adapter: the names of its two tensors.
#[derive(Debug, Clone)]
struct Pair {
    a: String,
    b: String,
}

/// An opened adapter file.
pub struct LoraAdapter {
    ckpt: Checkpoint,
    cfg: LoraConfig,
    /// By the base weight's (split-scheme) name.
    pairs: BTreeMap<String, Pair>,
    /// Plain tensors replacing base tensors of the same name.
    replacements: BTreeSet<String>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("path", &self.ckpt.path())
            .field("layers", &self.pairs.len())
            .field("replacements", &self.replacements.len())
            .finish()
    }
}

fn refuse(path: &Path, why: impl Into<String>) -> CheckpointError {
    CheckpointError::Lora {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// What [`LoraAdapter::check`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraReport {
    /// Linear layers adapted.
    pub layers: usize,
    /// Base tensors replaced whole.
    pub replaced: usize,
    /// The rank.
    pub rank: usize,
    /// The scaling.
    pub scaling: f32,
}

impl LoraAdapter {
    /// Maps an adapter file and sorts its tensors into layer pairs and
    /// replacements (nothing is checked against a model yet).
    pub fn open(path: &Path, cfg: LoraConfig) -> Result<Self, CheckpointError> {
        Self::from_checkpoint(Checkpoint::open(path)?, cfg)
    }

    /// [`LoraAdapter::open`] from the header alone (for checking).
    pub fn open_header(path: &Path, cfg: LoraConfig) -> Result<Self, CheckpointError> {
        Self::from_checkpoint(Checkpoint::open_header(path)?, cfg)
    }

    fn from_checkpoint(ckpt: Checkpoint, cfg: LoraConfig) -> Result<Self, CheckpointError> {
        let path = ckpt.path().to_path_buf();
        let mut pairs: BTreeMap<String, Pair> = BTreeMap::new();
        let mut halves: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        let mut replacements = BTreeSet::new();
        let names: Vec<(String, Vec<usize>)> = ckpt
            .tensors()
            .map(|(n, s)| (n.to_string(), s.to_vec()))
            .collect();
        for (name, _) in names {
            if name.contains(".in_proj.lora_") || name.contains(".out_proj.lora_") {
                return Err(refuse(
                    &path,
                    format!("`{name}`: the older stacked adapter layout is not supported (moshi-finetune writes per-step `in_projs.{{k}}` adapters)"),
                ));
            }
            if let Some(layer) = name.strip_suffix(".lora_A.weight") {
                halves.entry(format!("{layer}.weight")).or_default().0 = Some(name.clone());
            } else if let Some(layer) = name.strip_suffix(".lora_B.weight") {
                halves.entry(format!("{layer}.weight")).or_default().1 = Some(name.clone());
            } else if name.contains("lora_") {
                return Err(refuse(
                    &path,
                    format!("`{name}` is not a LoRA tensor this reader knows"),
                ));
            } else {
                replacements.insert(name);
            }
        }
        for (base, (a, b)) in halves {
            match (a, b) {
                (Some(a), Some(b)) => {
                    pairs.insert(base, Pair { a, b });
                }
                (Some(h), None) | (None, Some(h)) => {
                    return Err(refuse(
                        &path,
                        format!("`{h}` has no matching lora_A/lora_B half"),
                    ))
                }
                (None, None) => unreachable!("an entry is made with one half"),
            }
        }
        Ok(LoraAdapter {
            ckpt,
            cfg,
            pairs,
            replacements,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.ckpt.path()
    }

    /// Checks the adapter against the base model's tensors (`specs`, the
    /// split-scheme names the model reads; `skipped`, tensors the file
    /// stores but the model never computes), from the headers alone.
    pub fn check(
        &self,
        specs: &[TensorSpec],
        skipped: &[TensorSpec],
    ) -> Result<LoraReport, CheckpointError> {
        let path: PathBuf = self.path().to_path_buf();
        let shape_of = |n: &str| -> Option<&[usize]> {
            specs
                .iter()
                .chain(skipped)
                .find(|s| s.name == n)
                .map(|s| s.shape.as_slice())
        };
        for (base, pair) in &self.pairs {
            let Some(shape) = shape_of(base) else {
                return Err(refuse(
                    &path,
                    format!(
                        "`{}` adapts `{base}`, which the model does not have",
                        pair.a
                    ),
                ));
            };
            if shape.len() != 2 || !is_linear_weight(base) {
                return Err(refuse(
                    &path,
                    format!("`{}` adapts `{base}`, which is not a linear layer", pair.a),
                ));
            }
            let (out, inp, r) = (shape[0], shape[1], self.cfg.rank);
            let a = self.shape(&pair.a);
            let b = self.shape(&pair.b);
            if a != [r, inp] || b != [out, r] {
                return Err(refuse(
                    &path,
                    format!(
                        "`{base}`: lora_A {a:?} and lora_B {b:?} do not make a rank-{r} update of a [{out}, {inp}] weight (lora_rank {r})"
                    ),
                ));
            }
        }
        for spec in specs {
            if is_linear_weight(&spec.name) && !self.pairs.contains_key(&spec.name) {
                return Err(refuse(
                    &path,
                    format!(
                        "no adapter for the linear layer `{}` (moshi-finetune adapts every one)",
                        spec.name.trim_end_matches(".weight")
                    ),
                ));
            }
        }
        for name in &self.replacements {
            match shape_of(name) {
                Some(s) if s == self.shape(name).as_slice() => {}
                Some(s) => {
                    return Err(refuse(
                        &path,
                        format!(
                            "`{name}` has shape {:?}, the base tensor {s:?}",
                            self.shape(name)
                        ),
                    ))
                }
                None => {
                    return Err(refuse(
                        &path,
                        format!("`{name}` replaces a tensor the model does not have"),
                    ))
                }
            }
        }
        Ok(LoraReport {
            layers: self.pairs.len(),
            replaced: self.replacements.len(),
            rank: self.cfg.rank,
            scaling: self.cfg.scaling,
        })
    }

    fn shape(&self, name: &str) -> Vec<usize> {
        self.ckpt
            .tensors()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.to_vec())
            .unwrap_or_default()
    }

    /// Whether reading `name` involves the adapter.
    pub fn touches(&self, name: &str) -> bool {
        self.pairs.contains_key(name) || self.replacements.contains(name)
    }

    /// The adapted values of the base tensor `name` of `shape`, given its
    /// stored values `w` (float32), in place.
    pub fn apply(&self, name: &str, shape: &[usize], w: &mut [f32]) -> Result<(), CheckpointError> {
        if self.replacements.contains(name) {
            let v = self.ckpt.read_f32(name, shape)?;
            w.copy_from_slice(&v);
            return Ok(());
        }
        let Some(pair) = self.pairs.get(name) else {
            return Ok(());
        };
        let (out, inp, r) = (shape[0], shape[1], self.cfg.rank);
        let a = self.ckpt.read_f32(&pair.a, &[r, inp])?;
        let b = self.ckpt.read_f32(&pair.b, &[out, r])?;
        let mut row = vec![0.0f64; inp];
        for (o, wr) in w.chunks_exact_mut(inp).enumerate() {
            row.fill(0.0);
            for (k, &bk) in b[o * r..(o + 1) * r].iter().enumerate() {
                let bk = bk as f64;
                for (acc, &av) in row.iter_mut().zip(&a[k * inp..(k + 1) * inp]) {
                    *acc += bk * av as f64;
                }
            }
            // The official order: `(B @ A) · scaling`, then `+ W`.
            for (wv, &d) in wr.iter_mut().zip(&row) {
                *wv += d as f32 * self.cfg.scaling;
            }
        }
        Ok(())
    }
}
