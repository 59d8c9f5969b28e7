//! A checkpoint folder: which files make a model, and validating them from
//! their headers alone.
//!
//! Two layouts are recognised, in this order:
//! * the published one: an optional `config.json` (absent: the built-in
//!   Moshi 7B config, as `kyutai/moshiko-pytorch-bf16` ships none) naming
//!   the LM weights (`moshi_name`), the Mimi weights (`mimi_name`), the
//!   tokenizer (`tokenizer_name`) and optionally a Mimi config
//!   (`mimi_config_name`; absent: the real Mimi);
//! * the fixture one: `lm_config.json`, `lm.safetensors`, `mimi_config.json`,
//!   `mimi.safetensors` (and a `tokenizer.model` if present).
//!
//! PersonaPlex: NVIDIA's published folder has an empty `config.json`
//! (its loader reads none and hard-codes Moshi 7B with 16 depformer weight
//! sets), so a folder whose config is absent or empty is recognised as
//! PersonaPlex by its tensors (`depformer_in.15.weight`, or a stacked
//! depformer attention of 16 sets), or by an explicit family setting
//! ([`CheckpointDir::open_as`]); [`Family`] says which.
//!
//! LoRA: a config with `lora: true` needs `lora.safetensors` beside the base
//! weights; it is checked against the model from the headers and merged when
//! the weights are read ([`CheckpointDir::open_lm_weights`]).
//!
//! Invariants: [`CheckpointDir::check`] reads headers only (a 15 GB
//! checkpoint is validated in milliseconds) and fails on the first missing,
//! extra, wrongly shaped or wrongly typed tensor, naming it.

use crate::config::{ConfigError, KvWindow, LmConfig, MimiConfig, ModelType};
use crate::lm::Lm;
use crate::lora::{LoraAdapter, LoraReport};
use crate::mimi::Mimi;
use crate::weights::{Checkpoint, CheckpointError};
use std::path::{Path, PathBuf};

/// Why a checkpoint folder cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A configuration is invalid.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A weights file is invalid.
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The memory for the model's state could not be had.
    #[error("{0}")]
    Alloc(#[from] crate::alloc::AllocError),
    /// A file the layout needs is absent.
    #[error("{0}: not found (needed by the checkpoint folder)")]
    Missing(PathBuf),
}

/// The files and configurations of one model.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    /// The folder.
    pub dir: PathBuf,
    /// LM configuration.
    pub lm: LmConfig,
    /// Mimi configuration.
    pub mimi: MimiConfig,
    /// LM weights.
    pub lm_weights: PathBuf,
    /// Mimi weights.
    pub mimi_weights: PathBuf,
    /// SentencePiece model, when present.
    pub tokenizer: Option<PathBuf>,
    /// The LoRA adapter to merge (`lora: true` in the config).
    pub lora_weights: Option<PathBuf>,
    /// How the model family was decided.
    pub family: Family,
}

/// How a folder's model family was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Family {
    /// The config's `model_type` (or its default, `moshi`).
    Config,
    /// No config: the built-in Moshi 7B.
    BuiltIn,
    /// No config, and the LM's tensors say PersonaPlex (the tensor named).
    Tensors(String),
    /// An explicit setting.
    Setting,
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Family::Config => f.write_str("from the config's model_type"),
            Family::BuiltIn => f.write_str("no config: the built-in Moshi 7B settings"),
            Family::Tensors(t) => write!(f, "recognised by its tensors ({t})"),
            Family::Setting => f.write_str("from the explicit setting"),
        }
    }
}

/// Whether a config file is absent or says nothing (NVIDIA's published
/// `config.json` is empty): then the built-in settings apply.
fn config_is_empty(path: &Path) -> Result<bool, DirError> {
    if !path.exists() {
        return Ok(true);
    }
    let text = std::fs::read_to_string(path).map_err(|source| DirError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let t = text.trim();
    Ok(t.is_empty() || t.chars().filter(|c| !c.is_whitespace()).eq("{}".chars()))
}

/// The tensor of an LM file that shows 16 depformer weight sets
/// (PersonaPlex), if any.
fn personaplex_marker(lm_weights: &Path, depformer_dim: usize) -> Result<Option<String>, DirError> {
    let ck = crate::weights::Checkpoint::open_header(lm_weights)?;
    let stacked_rows = 16 * 3 * depformer_dim;
    let marker = ck.tensors().find_map(|(name, shape)| {
        let hit = name == "depformer_in.15.weight"
            || (name == "depformer.layers.0.self_attn.in_proj_weight"
                && shape.first() == Some(&stacked_rows));
        hit.then(|| name.to_string())
    });
    Ok(marker)
}

/// What a header-only check found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// Moshi or Hibiki.
    pub model_type: ModelType,
    /// LM parameters.
    pub lm_params: usize,
    /// Mimi parameters.
    pub mimi_params: usize,
    /// KV-cache bytes per stream at full context in bf16.
    pub kv_bytes_per_stream_bf16: usize,
    /// Tokenizer pieces, when a tokenizer is present.
    pub tokenizer_pieces: Option<usize>,
    /// The LoRA adapter merged at load, when there is one.
    pub lora: Option<LoraReport>,
}

fn existing(p: PathBuf) -> Result<PathBuf, DirError> {
    if p.is_file() {
        Ok(p)
    } else {
        Err(DirError::Missing(p))
    }
}

impl CheckpointDir {
    /// Resolves the files of a folder and parses its configurations.
    pub fn open(dir: &Path) -> Result<Self, DirError> {
        Self::open_as(dir, None)
    }

    /// [`CheckpointDir::open`], with the model family given explicitly
    /// (`Some(ModelType::PersonaPlex)` for a PersonaPlex folder whatever its
    /// config and tensors say).
    pub fn open_as(dir: &Path, family: Option<ModelType>) -> Result<Self, DirError> {
        let mut d = Self::open_files(dir)?;
        if let Some(t) = family.filter(|t| *t != d.lm.model_type) {
            if t != ModelType::PersonaPlex || d.lm.model_type != ModelType::Moshi {
                return Err(DirError::Config(ConfigError::BadValue {
                    key: "model_type".into(),
                    why: format!(
                        "the setting asks for {t:?}, the folder holds {:?}; only a Moshi-shaped folder can be read as PersonaPlex",
                        d.lm.model_type
                    ),
                }));
            }
            d.lm = LmConfig::personaplex_7b_from(&d.lm)?;
            d.family = Family::Setting;
        }
        if d.lm.model_type == ModelType::PersonaPlex {
            d.mimi.transformer.kv_window = KvWindow::ContextMinusOne;
        }
        if d.lm.lora.is_some() {
            d.lora_weights = Some(existing(dir.join("lora.safetensors"))?);
        }
        Ok(d)
    }

    fn open_files(dir: &Path) -> Result<Self, DirError> {
        let published = dir.join("config.json");
        let fixture = dir.join("lm_config.json");
        if !published.exists() && fixture.exists() {
            let tokenizer = dir.join("tokenizer.model");
            return Ok(CheckpointDir {
                dir: dir.to_path_buf(),
                lm: LmConfig::from_file(&fixture)?,
                mimi: MimiConfig::from_file(&existing(dir.join("mimi_config.json"))?)?,
                lm_weights: existing(dir.join("lm.safetensors"))?,
                mimi_weights: existing(dir.join("mimi.safetensors"))?,
                tokenizer: tokenizer.is_file().then_some(tokenizer),
                lora_weights: None,
                family: Family::Config,
            });
        }
        if !dir.is_dir() {
            return Err(DirError::Missing(dir.to_path_buf()));
        }
        let (mut lm, mut family) = if config_is_empty(&published)? {
            (LmConfig::moshi_7b(), Family::BuiltIn)
        } else {
            (LmConfig::from_file(&published)?, Family::Config)
        };
        let lm_weights = existing(dir.join(&lm.files.lm))?;
        if family == Family::BuiltIn {
            if let Some(marker) = personaplex_marker(&lm_weights, lm.depformer.dim)? {
                lm = LmConfig::personaplex_7b();
                family = Family::Tensors(marker);
            }
        }
        let mimi = match &lm.files.mimi_config {
            Some(name) => MimiConfig::from_file(&existing(dir.join(name))?)?,
            None => MimiConfig::mimi_default(),
        };
        Ok(CheckpointDir {
            dir: dir.to_path_buf(),
            lm_weights,
            mimi_weights: existing(dir.join(&lm.files.mimi))?,
            tokenizer: Some(existing(dir.join(&lm.files.tokenizer))?),
            lm,
            mimi,
            lora_weights: None,
            family,
        })
    }

    /// The LM weights for loading, with the LoRA adapter (if any) merged as
    /// they are read.
    pub fn open_lm_weights(&self) -> Result<crate::weights::Weights, DirError> {
        use crate::weights::Weights;
        Ok(match (&self.lora_weights, self.lm.lora) {
            (Some(p), Some(cfg)) => {
                let a = LoraAdapter::open(p, cfg)?;
                a.check(
                    &Lm::tensor_specs_used(&self.lm),
                    &Lm::tensor_specs_unused(&self.lm),
                )?;
                Weights::open_with_lora(&self.lm_weights, a)?
            }
            _ => Weights::open(&self.lm_weights)?,
        })
    }

    /// Mimi codebooks the model needs (generated and user streams).
    pub fn mimi_codebooks(&self) -> usize {
        self.lm.dep_q.max(self.lm.num_user_codebooks())
    }

    /// Validates every tensor's name, shape and dtype from the headers.
    pub fn check(&self) -> Result<CheckReport, DirError> {
        let lm_params =
            Checkpoint::open_header(&self.lm_weights)?.validate(&Lm::tensor_specs(&self.lm))?;
        let lora = match (&self.lora_weights, self.lm.lora) {
            (Some(p), Some(cfg)) => Some(LoraAdapter::open_header(p, cfg)?.check(
                &Lm::tensor_specs_used(&self.lm),
                &Lm::tensor_specs_unused(&self.lm),
            )?),
            _ => None,
        };
        let mimi_params = Checkpoint::open_header(&self.mimi_weights)?
            .validate(&Mimi::tensor_specs(&self.mimi))?;
        if self.mimi_codebooks() > self.mimi.quantizer.n_q {
            return Err(DirError::Config(ConfigError::BadValue {
                key: "n_q".into(),
                why: format!(
                    "the LM needs {} Mimi codebooks, the Mimi checkpoint has {}",
                    self.mimi_codebooks(),
                    self.mimi.quantizer.n_q
                ),
            }));
        }
        if self.mimi.quantizer.bins != self.lm.card {
            return Err(DirError::Config(ConfigError::BadValue {
                key: "card".into(),
                why: format!(
                    "the LM's card {} differs from Mimi's bins {}",
                    self.lm.card, self.mimi.quantizer.bins
                ),
            }));
        }
        let tokenizer_pieces = match &self.tokenizer {
            Some(p) => {
                let t = crate::spm::PieceTable::from_file(p).map_err(|e| {
                    DirError::Config(ConfigError::BadValue {
                        key: "tokenizer_name".into(),
                        why: e.to_string(),
                    })
                })?;
                if t.len() < self.lm.text_card {
                    return Err(DirError::Config(ConfigError::BadValue {
                        key: "text_card".into(),
                        why: format!(
                            "the tokenizer has {} pieces, fewer than text_card {}",
                            t.len(),
                            self.lm.text_card
                        ),
                    }));
                }
                Some(t.len())
            }
            None => None,
        };
        Ok(CheckReport {
            model_type: self.lm.model_type,
            lm_params,
            mimi_params,
            kv_bytes_per_stream_bf16: self.lm.kv_bytes_per_stream(2),
            tokenizer_pieces,
            lora,
        })
    }
}

/// Opens `dir` and checks it from the headers ([`CheckpointDir::open`] then
/// [`CheckpointDir::check`]).
pub fn open_and_check(dir: &Path) -> Result<(CheckpointDir, CheckReport), DirError> {
    let d = CheckpointDir::open(dir)?;
    let r = d.check()?;
    Ok((d, r))
}

/// The `check-checkpoint` command: prints the report, or the reason and a
/// failure exit code.
pub fn check_command(dir: &Path) -> std::process::ExitCode {
    let started = std::time::Instant::now();
    match open_and_check(dir) {
        Ok((d, r)) => {
            print_report(&d, &r, started.elapsed());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("checkpoint {}: INVALID: {e}", dir.display());
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints what [`CheckpointDir::check`] found, and how long it took.
pub fn print_report(d: &CheckpointDir, r: &CheckReport, elapsed: std::time::Duration) {
    let lm = &d.lm;
    println!("checkpoint {}: OK", d.dir.display());
    println!("  model type        {:?} ({})", r.model_type, d.family);
    if let Some(l) = &r.lora {
        println!(
            "  LoRA              {} ({} layers, {} tables replaced, rank {}, scaling {}): merged at load",
            d.lora_weights.as_deref().unwrap_or(Path::new("?")).display(),
            l.layers,
            l.replaced,
            l.rank,
            l.scaling
        );
    }
    if d.lm.dep_q_stored > d.lm.dep_q {
        println!(
            "  depformer         {} of {} stored steps computed (steps {}..{} predict the user's audio)",
            d.lm.dep_q,
            d.lm.dep_q_stored,
            d.lm.dep_q,
            d.lm.dep_q_stored - 1
        );
    }
    println!(
        "  LM weights        {} ({} parameters)",
        d.lm_weights.display(),
        r.lm_params
    );
    println!(
        "  Mimi weights      {} ({} parameters)",
        d.mimi_weights.display(),
        r.mimi_params
    );
    let kv_heads = lm.num_heads / lm.kv_repeat;
    let heads = if kv_heads == lm.num_heads {
        format!("{} heads", lm.num_heads)
    } else {
        format!("{} heads ({kv_heads} key/value)", lm.num_heads)
    };
    println!(
        "  LM                dim {}, {} layers, {heads}, context {}, {} generated + {} user codebooks",
        lm.dim,
        lm.num_layers,
        lm.context,
        lm.dep_q,
        lm.num_user_codebooks()
    );
    println!(
        "  KV cache          {:.1} MB ({:.3} GiB) per stream at full context (bf16)",
        r.kv_bytes_per_stream_bf16 as f64 / 1e6,
        r.kv_bytes_per_stream_bf16 as f64 / (1u64 << 30) as f64
    );
    match r.tokenizer_pieces {
        Some(n) => println!("  tokenizer         {n} pieces"),
        None => println!("  tokenizer         none (text is not printed)"),
    }
    println!(
        "  checked in        {:.1} ms",
        elapsed.as_secs_f64() * 1000.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::SafeTensors;

    /// Rewrites `file` through `edit(name, shape) -> Some(new shape) | None (drop)`,
    /// plus optional extra tensors.
    fn rewrite(
        file: &Path,
        edit: impl Fn(&str, &[usize]) -> Option<Vec<usize>>,
        extra: &[(&str, Vec<usize>)],
    ) {
        let bytes = std::fs::read(file).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, v) in st.tensors() {
            if let Some(shape) = edit(&name, v.shape()) {
                let n: usize = shape.iter().product();
                owned.push((name.clone(), shape, vec![0u8; n * 4]));
            }
        }
        for (name, shape) in extra {
            let n: usize = shape.iter().product();
            owned.push((name.to_string(), shape.clone(), vec![0u8; n * 4]));
        }
        let views: Vec<(String, TensorView)> = owned
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, file).unwrap();
    }

    fn demo() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("demo");
        crate::demo::write_demo(&d, 3).unwrap();
        (t, d)
    }

    #[test]
    fn missing_tensor_is_named() {
        let (_t, d) = demo();
        rewrite(
            &d.join("model.safetensors"),
            |n, s| (n != "out_norm.alpha").then(|| s.to_vec()),
            &[],
        );
        let e = CheckpointDir::open(&d)
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing tensor `out_norm.alpha`"), "{e}");
    }

    #[test]
    fn wrong_shape_is_named() {
        let (_t, d) = demo();
        rewrite(
            &d.join("mimi.safetensors"),
            |n, s| {
                Some(if n == "decoder.model.0.conv.conv.bias" {
                    vec![s[0] + 1]
                } else {
                    s.to_vec()
                })
            },
            &[],
        );
        let e = CheckpointDir::open(&d)
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("decoder.model.0.conv.conv.bias") && e.contains("expected"),
            "{e}"
        );
    }

    #[test]
    fn extra_tensor_is_named() {
        let (_t, d) = demo();
        rewrite(
            &d.join("model.safetensors"),
            |_, s| Some(s.to_vec()),
            &[("stray.weight", vec![2, 2])],
        );
        let e = CheckpointDir::open(&d)
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("unexpected tensor `stray.weight`"), "{e}");
    }

    #[test]
    fn golden_folders_validate_from_headers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden");
        for name in ["moshi-tiny", "hibiki-tiny"] {
            let d = CheckpointDir::open(&root.join(name)).unwrap();
            let r = d.check().unwrap();
            assert!(r.lm_params > 0 && r.mimi_params > 0);
        }
    }

    #[test]
    fn missing_folder_and_files_are_reported() {
        let t = tempfile::tempdir().unwrap();
        let e = CheckpointDir::open(&t.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
        // An empty folder is a Moshi 7B folder without its weights.
        let e = CheckpointDir::open(t.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }
}
