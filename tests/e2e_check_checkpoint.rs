//! `moshid check-checkpoint` on real-sized checkpoint folders of Moshi 7B,
//! Hibiki 2B, Hibiki 1B and Hibiki-Zero 3B, built here header-only: each safetensors
//! file holds a true header (every tensor of the published shape, at its
//! true offset) and a sparse hole where the data would be, so a 15 GB
//! checkpoint costs a few kilobytes of disk. The command must validate
//! each from its headers, print its parameters, KV cache per stream and
//! streams per GPU, and refuse a mis-shaped tensor by name.
//!
//! Layouts as published: Moshi 7B without a config.json (the built-in
//! config), stacked attention names (`self_attn.in_proj_weight`), bf16 LM
//! weights, f32 Mimi; the Hibikis with their config.json (Hibiki 1B with
//! split attention names); Hibiki-Zero's LM in float16.

use moshid_kernels::shapes;
use moshid_model::config::{LmConfig, MimiConfig};
use moshid_model::lm::Lm;
use moshid_model::mimi::Mimi;
use moshid_model::spm::{PieceKind, PieceTable};
use moshid_model::weights::TensorSpec;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Writes a safetensors file of `specs` (in `dtype`, `bytes` per value)
/// whose data is a hole. With `stacked`, per-step attention projections
/// are stored as the published checkpoints store them.
fn write_header_only(path: &Path, specs: &[TensorSpec], dtype: &str, bytes: usize, stacked: bool) {
    let mut tensors: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    // Stacked tensors: prefix → rows per step, step count, cols.
    let mut stacks: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for s in specs {
        let split = [
            (".self_attn.in_projs.", ".self_attn.in_proj_weight"),
            (".self_attn.out_projs.", ".self_attn.out_proj.weight"),
        ]
        .iter()
        .find_map(|(part, whole)| {
            s.name
                .split_once(part)
                .map(|(head, _)| format!("{head}{whole}"))
        });
        match split {
            Some(whole) if stacked => {
                let e = stacks.entry(whole).or_insert((s.shape[0], 0, s.shape[1]));
                e.1 += 1;
            }
            _ => {
                tensors.insert(s.name.clone(), s.shape.clone());
            }
        }
    }
    for (name, (rows, n, cols)) in stacks {
        tensors.insert(name, vec![n * rows, cols]);
    }
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &tensors {
        let len = shape.iter().product::<usize>() * bytes;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.set_len((8 + text.len() + offset) as u64).unwrap();
}

/// A SentencePiece model of `n` pieces (the four control pieces first).
fn write_tokenizer(path: &Path, n: usize) {
    let mut pieces = vec![
        ("<unk>".to_string(), 0.0, PieceKind::Unknown),
        ("<s>".to_string(), 0.0, PieceKind::Control),
        ("</s>".to_string(), 0.0, PieceKind::Control),
        ("<pad>".to_string(), 0.0, PieceKind::Control),
    ];
    pieces.extend((4..n).map(|i| (format!("▁p{i}"), -(i as f32), PieceKind::Normal)));
    let t = PieceTable::from_pieces(pieces).unwrap();
    std::fs::write(path, t.to_model_bytes()).unwrap();
}

/// A header-only folder of the built-in model `name` in the published layout.
fn folder(root: &Path, name: &str, lm_dtype: (&str, usize), stacked: bool) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let lm = shapes::lm_config(name).unwrap();
    if let Some(json) = shapes::config_json(name) {
        std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    }
    let mimi = MimiConfig::mimi_default();
    write_header_only(
        &dir.join(&lm.files.lm),
        &Lm::tensor_specs(&lm),
        lm_dtype.0,
        lm_dtype.1,
        stacked,
    );
    write_header_only(
        &dir.join(&lm.files.mimi),
        &Mimi::tensor_specs(&mimi),
        "F32",
        4,
        false,
    );
    write_tokenizer(&dir.join(&lm.files.tokenizer), lm.text_card);
    dir
}

fn check(dir: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moshid"))
        .arg("check-checkpoint")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number printed after `label` on the line that has it.
fn figure(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no `{label}` in:\n{out}"));
    let rest = &line[line.find(label).unwrap() + label.len()..];
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| !t.is_empty())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{label}` in `{line}`"))
}

/// The streams per GPU table: rows `80 GB` and `141 GB`, columns bf16, fp8.
fn streams(out: &str) -> Vec<[usize; 2]> {
    ["80 GB", "141 GB"]
        .iter()
        .map(|dev| {
            let line = out
                .lines()
                .find(|l| l.trim_start().starts_with(dev))
                .unwrap_or_else(|| panic!("no `{dev}` row in:\n{out}"));
            let n: Vec<usize> = line
                .split_whitespace()
                .skip(2)
                .map(|t| t.parse().unwrap())
                .collect();
            [n[0], n[1]]
        })
        .collect()
}

fn params(lm: &LmConfig) -> usize {
    Lm::tensor_specs(lm).iter().map(TensorSpec::numel).sum()
}

#[test]
fn real_sized_folders_validate_from_their_headers() {
    let t = tempfile::tempdir().unwrap();
    // (name, LM dtype, stacked attention names, KV MB per stream in bf16).
    let cases = [
        ("moshi7b", ("BF16", 2), true, 1572.9),
        ("hibiki2b", ("BF16", 2), true, 368.6),
        ("hibiki1b", ("BF16", 2), false, 196.6),
        ("hibiki-zero-3b", ("F16", 2), true, 344.1),
    ];
    for (name, dtype, stacked, kv_mb) in cases {
        let dir = folder(t.path(), name, dtype, stacked);
        let lm_bytes = std::fs::metadata(dir.join(shapes::lm_config(name).unwrap().files.lm))
            .unwrap()
            .len();
        let started = std::time::Instant::now();
        let (ok, out, err) = check(&dir);
        let ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(ok, "{name}: {err}\n{out}");
        println!("{out}");
        println!(
            "{name}: a {:.1} GB header-only checkpoint checked in {ms:.0} ms (the whole command)",
            lm_bytes as f64 / 1e9
        );
        let lm = shapes::lm_config(name).unwrap();
        assert!(
            out.contains(&format!("({} parameters)", params(&lm))),
            "{out}"
        );
        assert_eq!(figure(&out, "KV cache"), kv_mb, "{name}");
        let table = streams(&out);
        assert!(
            table[0][0] > 0,
            "{name}: not one stream fits on 80 GB:\n{out}"
        );
        assert!(
            table[1][0] > table[0][0] && table[0][1] > table[0][0],
            "{name}: {table:?}"
        );
    }
}

#[test]
fn hibiki_zero_figures_follow_kv_repeat_and_context() {
    let t = tempfile::tempdir().unwrap();
    let dir = folder(t.path(), "hibiki-zero-3b", ("BF16", 2), false);
    let (ok, out, err) = check(&dir);
    assert!(ok, "{err}\n{out}");
    assert!(out.contains("16 heads (8 key/value)"), "{out}");
    assert!(out.contains("context 3000"), "{out}");
    let base = streams(&out);
    // The daemon takes the context from the folder's own config: halve it
    // and the KV per stream halves, more streams fit.
    let mut cfg = shapes::config_json("hibiki-zero-3b").unwrap();
    cfg["context"] = 1500.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (ok, out, err) = check(&dir);
    assert!(ok, "{err}\n{out}");
    assert_eq!(figure(&out, "KV cache"), 172.0);
    let short = streams(&out);
    assert!(short[1][0] > base[1][0], "{short:?} vs {base:?}");
    // Without grouped-query attention the same folder's in-projections
    // have the wrong shape: refused, naming the tensor and the key's effect.
    cfg["kv_repeat"] = 1.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (ok, out, err) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        err.contains("INVALID")
            && err.contains("transformer.layers.0.self_attn.in_projs.0.weight")
            && err.contains("[4096, 2048]")
            && err.contains("[6144, 2048]"),
        "{err}"
    );
    // An unknown value is refused naming its key.
    cfg["kv_repeat"] = 2.into();
    cfg["positional_embedding"] = "alibi".into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (ok, _, err) = check(&dir);
    assert!(
        !ok && err.contains("`positional_embedding`") && err.contains("alibi"),
        "{err}"
    );
}
