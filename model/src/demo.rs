//! The demo checkpoint: a complete, deterministic, random-weight model folder
//! (config, Mimi, LM, SentencePiece pieces) in the published layout, so the
//! daemon runs out of the box with no download.
//!
//! Its weights are random: it produces no speech and no meaningful text. It
//! exists to exercise every part of the data path (codecs, batching, slots,
//! transports) at a size the CPU backend serves in real time.
//!
//! Invariants: the same `seed` always writes byte-identical files; the folder
//! is written beside its destination and renamed into place, so a reader
//! never sees half a checkpoint.

use crate::checkpoint::{CheckpointDir, DirError};
use crate::config::{LmConfig, MimiConfig};
use crate::lm::Lm;
use crate::mimi::Mimi;
use crate::spm::{PieceKind, PieceTable};
use crate::weights::TensorSpec;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

/// Version of the demo layout; bump when the shapes change.
pub const DEMO_VERSION: u32 = 1;

/// The demo's text vocabulary size (and tokenizer pieces).
const DEMO_TEXT_CARD: usize = 128;

/// The demo LM configuration (Moshi-shaped, small).
pub fn demo_lm_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "moshi",
        "moshi_name": "model.safetensors",
        "mimi_name": "mimi.safetensors",
        "tokenizer_name": "tokenizer.model",
        "mimi_config_name": "mimi_config.json",
        "dim": 96, "text_card": DEMO_TEXT_CARD, "existing_text_padding_id": 3,
        "n_q": 16, "dep_q": 8, "card": 256, "num_heads": 4, "num_layers": 2,
        "hidden_scale": 4.125, "causal": true, "layer_scale": null, "context": 250,
        "max_period": 10000, "gating": "silu", "norm": "rms_norm_f32",
        "positional_embedding": "rope",
        "depformer_dim": 48, "depformer_dim_feedforward": 198, "depformer_num_heads": 2,
        "depformer_num_layers": 1, "depformer_layer_scale": null,
        "depformer_multi_linear": true, "depformer_context": 8,
        "depformer_max_period": 10000, "depformer_gating": "silu",
        "depformer_pos_emb": "none", "depformer_weights_per_step": true,
        "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
    })
}

/// The demo Mimi configuration (real ratios and frame size, narrow layers).
pub fn demo_mimi_config() -> serde_json::Value {
    serde_json::json!({
        "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
        "seanet": {"channels": 1, "dimension": 32, "causal": true, "n_filters": 4,
            "n_residual_layers": 1, "activation": "ELU", "compress": 2, "dilation_base": 2,
            "disable_norm_outer_blocks": 0, "kernel_size": 7, "residual_kernel_size": 3,
            "last_kernel_size": 3, "norm": "none", "pad_mode": "constant",
            "ratios": [8, 6, 5, 4], "true_skip": true},
        "quantizer": {"dimension": 16, "n_q": 8, "bins": 256,
            "input_dimension": 32, "output_dimension": 32},
        "transformer": {"d_model": 32, "num_heads": 4, "num_layers": 2, "causal": true,
            "layer_scale": 0.01, "context": 250, "conv_layout": true, "max_period": 10000,
            "gating": "none", "norm": "layer_norm", "positional_embedding": "rope",
            "dim_feedforward": 64, "input_dimension": 32, "output_dimensions": [32]}
    })
}

/// Deterministic normal deviates (Box–Muller over xoshiro256++).
struct Normal {
    rng: Xoshiro256PlusPlus,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64) -> Self {
        Normal {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            spare: None,
        }
    }

    fn uniform(&mut self) -> f64 {
        // 53 random bits in (0, 1].
        ((self.rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }
}

/// Values for one tensor, scaled so activations stay bounded (the same rules
/// the reference fixtures use).
fn random_values(spec: &TensorSpec, g: &mut Normal) -> Vec<f32> {
    let n = spec.numel();
    let name = spec.name.as_str();
    let gen = |g: &mut Normal, f: &dyn Fn(f64, f64) -> f64| -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (z, u) = (g.sample(), g.uniform());
                f(z, u) as f32
            })
            .collect()
    };
    if name.ends_with("_codebook._initialized") {
        vec![1.0; n]
    } else if name.ends_with("_codebook.cluster_usage") {
        gen(g, &|_, u| 0.5 + u)
    } else if name.ends_with("_codebook.embedding_sum") {
        gen(g, &|z, _| z)
    } else if name.ends_with("alpha")
        || name.ends_with("norm1.weight")
        || name.ends_with("norm2.weight")
    {
        gen(g, &|z, _| 1.0 + 0.1 * z)
    } else if name.ends_with("scale") {
        gen(g, &|z, _| 0.1 + 0.05 * z)
    } else if spec.shape.len() > 1 {
        let fan = (n / spec.shape[0]).max(1) as f64;
        gen(g, &|z, _| z / fan.sqrt())
    } else {
        gen(g, &|z, _| 0.05 * z)
    }
}

fn write_weights(path: &Path, specs: &[TensorSpec], seed: u64) -> std::io::Result<()> {
    let mut g = Normal::new(seed);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = specs
        .iter()
        .map(|s| {
            let bytes = random_values(s, &mut g)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            (s.name.clone(), s.shape.clone(), bytes)
        })
        .collect();
    let views = data
        .iter()
        .map(|(n, shape, b)| TensorView::new(Dtype::F32, shape.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// The demo's text pieces: the four control pieces, then short syllables.
fn demo_pieces() -> PieceTable {
    let mut pieces = vec![
        ("<unk>".to_string(), 0.0, PieceKind::Unknown),
        ("<s>".to_string(), 0.0, PieceKind::Control),
        ("</s>".to_string(), 0.0, PieceKind::Control),
        ("<pad>".to_string(), 0.0, PieceKind::Control),
    ];
    let onsets = ["b", "d", "k", "l", "m", "n", "s", "t"];
    let vowels = ["a", "e", "i", "o"];
    let mut i = 0;
    while pieces.len() < DEMO_TEXT_CARD {
        let syl = format!(
            "{}{}",
            onsets[i % onsets.len()],
            vowels[(i / onsets.len()) % vowels.len()]
        );
        let piece = if (i / (onsets.len() * vowels.len())).is_multiple_of(2) {
            format!("▁{syl}")
        } else {
            syl
        };
        let piece = if i >= 2 * onsets.len() * vowels.len() {
            format!("{piece}{}", i / 64)
        } else {
            piece
        };
        pieces.push((piece, -(i as f32) / 10.0, PieceKind::Normal));
        i += 1;
    }
    PieceTable::from_pieces(pieces).expect("demo pieces are valid")
}

/// Writes the demo checkpoint into `dir` (created; replaced atomically).
pub fn write_demo(dir: &Path, seed: u64) -> Result<(), DirError> {
    let io = |source: std::io::Error| DirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let lm_json = demo_lm_config();
    let mimi_json = demo_mimi_config();
    let lm = LmConfig::from_json(&lm_json)?;
    let mimi = MimiConfig::from_json(&mimi_json)?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io)?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("demo"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io)?;
    let pretty =
        |v: &serde_json::Value| serde_json::to_string_pretty(v).expect("JSON values serialise");
    std::fs::write(tmp.join("config.json"), pretty(&lm_json)).map_err(io)?;
    std::fs::write(tmp.join("mimi_config.json"), pretty(&mimi_json)).map_err(io)?;
    std::fs::write(tmp.join("tokenizer.model"), demo_pieces().to_model_bytes()).map_err(io)?;
    write_weights(&tmp.join("model.safetensors"), &Lm::tensor_specs(&lm), seed).map_err(io)?;
    write_weights(
        &tmp.join("mimi.safetensors"),
        &Mimi::tensor_specs(&mimi),
        seed ^ 0x6d69_6d69,
    )
    .map_err(io)?;
    std::fs::write(tmp.join("README"), DEMO_README).map_err(io)?;
    // Move any old folder aside rather than deleting it in place, so a
    // process loading it keeps its files; if another process put a folder
    // there in the meantime, keep theirs (they are identical for one seed).
    let aside = parent.join(format!(
        ".{}.old-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("demo"),
        std::process::id()
    ));
    if dir.exists() {
        let _ = std::fs::rename(dir, &aside);
    }
    let placed = std::fs::rename(&tmp, dir);
    let _ = std::fs::remove_dir_all(&aside);
    if placed.is_err() && dir.join("config.json").is_file() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    placed.map_err(io)?;
    Ok(())
}

/// The demo folder under a cache folder, written on first use.
pub fn ensure_demo(cache_dir: &Path) -> Result<CheckpointDir, DirError> {
    let dir = cache_dir.join(format!("demo-v{DEMO_VERSION}"));
    if let Ok(d) = CheckpointDir::open(&dir) {
        if d.check().is_ok() {
            return Ok(d);
        }
    }
    write_demo(&dir, DEMO_SEED)?;
    let d = CheckpointDir::open(&dir)?;
    d.check()?;
    Ok(d)
}

/// The seed of the embedded demo.
pub const DEMO_SEED: u64 = 0x6d6f_7368_6964;

const DEMO_README: &str = "moshid demo checkpoint\n\n\
This folder was written by moshid. Its weights are RANDOM: the model produces\n\
no speech and no meaningful text. It exists so that `moshid serve` runs out of\n\
the box and exercises the whole data path. Serve a real checkpoint with\n\
`moshid serve --model DIR`.\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_is_deterministic_and_valid() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        write_demo(&a.path().join("d"), 7).unwrap();
        write_demo(&b.path().join("d"), 7).unwrap();
        for f in [
            "config.json",
            "mimi_config.json",
            "tokenizer.model",
            "model.safetensors",
            "mimi.safetensors",
        ] {
            let x = std::fs::read(a.path().join("d").join(f)).unwrap();
            let y = std::fs::read(b.path().join("d").join(f)).unwrap();
            assert!(x == y, "{f} differs between two writes with one seed");
        }
        let d = CheckpointDir::open(&a.path().join("d")).unwrap();
        let report = d.check().unwrap();
        assert_eq!(report.tokenizer_pieces, Some(DEMO_TEXT_CARD));
    }
}
