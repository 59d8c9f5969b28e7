//! Header-only checkpoints: real-sized checkpoint folders whose safetensors
//! headers list every tensor of a model with its true shape while the data
//! region is a hole (a sparse file), so a 15 GB Moshi 7B folder costs a few
//! kilobytes of disk and is written in milliseconds.
//!
//! They are for tests and tools that must see a real model's shapes without
//! its weights: header validation (`check-checkpoint`), the memory plans,
//! the start-up preflight. Reading a tensor of one gives zeros (the hole),
//! so nothing should load one for its numbers.
//!
//! The folder is in the published layout ([`write_published_dir`]): the LM
//! weights in bf16 with the stacked attention names the published
//! checkpoints use (`…self_attn.in_proj_weight`, `…self_attn.out_proj.weight`),
//! Mimi in float32, and a SentencePiece model with `text_card` pieces.
//!
//! Invariants: a written file is a valid safetensors file of the full size
//! (the header's offsets tile the data region, which the file's length
//! covers); the same inputs always write the same bytes.

use crate::checkpoint::DirError;
use crate::config::{LmConfig, MimiConfig};
use crate::lm::Lm;
use crate::mimi::Mimi;
use crate::spm::{PieceKind, PieceTable};
use crate::weights::TensorSpec;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DirError + '_ {
    move |source| DirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a safetensors file holding `tensors` (name, shape) as `dtype`,
/// with a hole for their data. Returns the file's length.
pub fn write_file(path: &Path, tensors: &[TensorSpec], dtype: Dtype) -> Result<u64, DirError> {
    let elem = (dtype.bitsize() / 8) as u64;
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for t in tensors {
        let bytes = t.numel() as u64 * elem;
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": format!("{dtype:?}"),
                "shape": t.shape,
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header).expect("a JSON map serialises");
    // The data region starts 8-byte aligned, as safetensors writes it.
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    std::fs::write(path, &out).map_err(io(path))?;
    let len = out.len() as u64 + offset;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    file.set_len(len).map_err(io(path))?;
    Ok(len)
}

/// The tensors with the split attention names (`…self_attn.in_projs.{i}.weight`,
/// `…self_attn.out_projs.{i}.weight`) stacked into the published ones, in
/// the order they first appear.
pub fn stacked(specs: &[TensorSpec]) -> Vec<TensorSpec> {
    let mut out: Vec<TensorSpec> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for t in specs {
        let stacked = [
            (".self_attn.in_projs.", ".self_attn.in_proj_weight"),
            (".self_attn.out_projs.", ".self_attn.out_proj.weight"),
        ]
        .iter()
        .find_map(|(split, joined)| {
            let (head, tail) = t.name.split_once(split)?;
            let step = tail.strip_suffix(".weight")?;
            step.parse::<usize>().ok()?;
            Some(format!("{head}{joined}"))
        });
        match stacked {
            Some(name) if t.shape.len() == 2 => match index.get(&name) {
                Some(&i) => out[i].shape[0] += t.shape[0],
                None => {
                    index.insert(name.clone(), out.len());
                    out.push(TensorSpec::new(name, &t.shape));
                }
            },
            _ => out.push(t.clone()),
        }
    }
    out
}

/// A SentencePiece model of `n` pieces (`<unk>`, `<s>`, `</s>`, `<pad>`,
/// then `▁p4`, `▁p5`, …): the size check of a real tokenizer, no real text.
pub fn placeholder_pieces(n: usize) -> PieceTable {
    let special = [
        ("<unk>", PieceKind::Unknown),
        ("<s>", PieceKind::Control),
        ("</s>", PieceKind::Control),
        ("<pad>", PieceKind::Control),
    ];
    let pieces = (0..n.max(special.len())).map(|i| match special.get(i) {
        Some((p, k)) => (p.to_string(), 0.0, *k),
        None => (format!("\u{2581}p{i}"), -(i as f32), PieceKind::Normal),
    });
    PieceTable::from_pieces(pieces).expect("distinct placeholder pieces")
}

/// Writes a header-only folder in the published layout for `lm` and `mimi`:
/// `config.json` when `config` is given (its file-name keys name the
/// files; absent: the Moshi 7B layout, which ships none), the LM weights in
/// bf16 with stacked attention names, Mimi in float32, and a tokenizer of
/// `text_card` pieces. A Mimi config file is written when the config names one.
pub fn write_published_dir(
    dir: &Path,
    lm: &LmConfig,
    mimi: &MimiConfig,
    config: Option<&serde_json::Value>,
    mimi_config: Option<&serde_json::Value>,
) -> Result<(), DirError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if let Some(c) = config {
        let p = dir.join("config.json");
        std::fs::write(&p, serde_json::to_vec_pretty(c).expect("JSON")).map_err(io(&p))?;
    }
    if let (Some(name), Some(c)) = (&lm.files.mimi_config, mimi_config) {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec_pretty(c).expect("JSON")).map_err(io(&p))?;
    }
    write_file(
        &dir.join(&lm.files.lm),
        &stacked(&Lm::tensor_specs(lm)),
        Dtype::BF16,
    )?;
    write_file(
        &dir.join(&lm.files.mimi),
        &stacked(&Mimi::tensor_specs(mimi)),
        Dtype::F32,
    )?;
    let p = dir.join(&lm.files.tokenizer);
    std::fs::write(&p, placeholder_pieces(lm.text_card).to_model_bytes()).map_err(io(&p))?;
    Ok(())
}

/// A header-only `kyutai/moshiko-pytorch-bf16` folder: no config.json (the
/// built-in Moshi 7B config), `model.safetensors` of 15.4 GB in bf16,
/// `tokenizer-e351c8d8-checkpoint125.safetensors`, `tokenizer_spm_32k_3.model`.
pub fn write_moshi_7b(dir: &Path) -> Result<(), DirError> {
    write_published_dir(
        dir,
        &LmConfig::moshi_7b(),
        &MimiConfig::mimi_default(),
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointDir;
    use crate::weights::Checkpoint;

    #[test]
    fn moshi_7b_validates_from_headers_and_costs_no_disk() {
        let t = tempfile::tempdir().unwrap();
        write_moshi_7b(t.path()).unwrap();
        let lm = t.path().join("model.safetensors");
        let len = std::fs::metadata(&lm).unwrap().len();
        assert!(len > 15_000_000_000, "{len}");
        let d = CheckpointDir::open(t.path()).unwrap();
        let r = d.check().unwrap();
        assert!(
            (7_600_000_000..7_800_000_000).contains(&r.lm_params),
            "{}",
            r.lm_params
        );
        assert_eq!(r.tokenizer_pieces, Some(32000));
        // The published stacked names are what the file holds (`check`
        // above validated every per-step name cut from them by shape).
        let ck = Checkpoint::open_header(&lm).unwrap();
        assert!(ck.tensors().any(
            |(n, s)| n == "transformer.layers.31.self_attn.in_proj_weight" && s == [3 * 4096, 4096]
        ));
        assert!(ck
            .tensors()
            .any(|(n, s)| n == "depformer.layers.5.self_attn.in_proj_weight"
                && s == [8 * 3 * 1024, 1024]));
        assert!(!ck.tensors().any(|(n, _)| n.contains(".in_projs.")));
    }

    #[test]
    fn a_truncated_file_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("w.safetensors");
        let len = write_file(&p, &[TensorSpec::new("a", &[4, 4])], Dtype::F32).unwrap();
        assert!(Checkpoint::open_header(&p).is_ok());
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(len - 1).unwrap();
        let e = Checkpoint::open_header(&p).err().unwrap().to_string();
        assert!(e.contains("the file holds"), "{e}");
    }
}
