//! The GPU model on a real CUDA device against the CPU reference backend, on
//! every golden fixture — the checks `emu_model.rs` runs on the emulator, for
//! a machine with a GPU (`scripts/gpu-check`, one process per test, with
//! `MOSHID_CUDA_DEBUG_SYNC=1` so that a failure names its kernel). Ignored
//! by default: they need a GPU and a CUDA driver (`MOSHID_TEST_DEVICE=emu`
//! runs them on the emulator, as the runbook's rehearsal does);
//! `MOSHID_CUDA_INCLUDE` names the folder holding `cuda_bf16.h` for NVRTC
//! when it is not found by itself.
//!
//! Reported per fixture, one `AGREEMENT` line each (the runbook's summary
//! collects them): audio-code and text-token agreement rates (greedy),
//! relative errors of text logits and audio; asserted: the f32 model exact
//! (tokens, codes; ≤ 1e-4 audio and logits), the f32 LM reproducing the LM
//! fixtures and their slot reuse exactly, graphs replaying direct launches,
//! and the bf16 models' first-step logits within the bounds the emulator
//! measured.
//!
//! Exactness on a GPU: the f32 models' kernels are compiled with
//! `--fmad=false` (no multiply-add contracted into an FMA, which rounds
//! once where the CPU reference rounds twice), so that only the GEMMs'
//! summation order (cuBLAS's, not the CPU's) and CUDA's last-ulp math
//! functions separate the two; the bf16 models, as served, keep FMA.

mod common;

use common::compare::{compare, outputs, params, SLOTS};
use common::device::{open, Kind};
use common::fixtures::fixture_dirs;
use moshid_kernels::device::Device;
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::ops::attention::KvType;
use moshid_kernels::plan::KvDtype;
use moshid_model::checkpoint::CheckpointDir;

/// The device: CUDA device 0 unless `MOSHID_TEST_DEVICE` says otherwise;
/// the exact f32 mode without FMA contraction (see the module doc).
fn device(precision: Precision) -> Box<dyn Device> {
    open(Kind::Cuda, precision != Precision::F32)
}

/// One line for the runbook's summary.
fn agreement(dir: &std::path::Path, what: &str, a: &dyn std::fmt::Display) {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    println!("AGREEMENT {name} {what}: {a}");
}

fn model(
    dir: &CheckpointDir,
    precision: Precision,
    kv: KvDtype,
    graphs: bool,
) -> GpuModel<Box<dyn Device>> {
    let opts = GpuOptions {
        max_slots: SLOTS,
        precision,
        kv,
        graphs,
        ..GpuOptions::default()
    };
    GpuModel::load(device(precision), dir, &opts).unwrap()
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_f32_model_matches_the_cpu_backend() {
    for dir in fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        for graphs in [false, true] {
            let mut gpu = model(&d, Precision::F32, KvDtype::F32, graphs);
            let a = compare(&dir, &mut gpu);
            agreement(
                &dir,
                &format!("f32 graphs {}", if graphs { "on" } else { "off" }),
                &a,
            );
            assert!(a.outputs > 0, "no output compared");
            assert!(a.exact_within(1e-4), "{}: {a}", dir.display());
        }
    }
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_bf16_model_tracks_the_cpu_backend() {
    for dir in fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        for (kv, bound) in [(KvDtype::Bf16, 0.05), (KvDtype::Fp8E4m3, 0.25)] {
            let mut gpu = model(&d, Precision::Bf16, kv, true);
            let a = compare(&dir, &mut gpu);
            agreement(&dir, &format!("bf16 {kv:?} KV"), &a);
            assert_eq!(a.output_mismatches, 0, "{}: {a}", dir.display());
            assert!(a.first_logits_rel < bound, "{}: {a}", dir.display());
        }
    }
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_lm_reproduces_the_lm_fixtures() {
    for dir in fixture_dirs("lm_config.json") {
        let a =
            common::lm_golden::run(&dir, || device(Precision::F32), Precision::F32, KvType::F32);
        agreement(&dir, "LM f32", &a);
        assert_eq!(a.agree, a.entries, "{}: {a}", dir.display());
        assert!(a.logits_rel <= 1e-4, "{}: {a}", dir.display());
        assert_eq!(a.reuse_mismatches, 0, "{}: {a}", dir.display());
        let b = common::lm_golden::run(
            &dir,
            || device(Precision::Bf16),
            Precision::Bf16,
            KvType::Bf16,
        );
        agreement(&dir, "LM bf16", &b);
        // A reset must leave nothing behind: the reused slot reproduces this
        // model's own tokens (same batch, same GEMM shapes). Stepped alone,
        // differences are the batch composition's (reported, not asserted).
        assert_eq!(b.reuse_self_mismatches, 0, "{}: {b}", dir.display());
    }
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_graphs_replay_what_direct_launches_do() {
    for dir in fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        let p = params(&d);
        let a = outputs(
            &mut model(&d, Precision::Bf16, KvDtype::Bf16, false),
            &p,
            10,
        );
        let b = outputs(&mut model(&d, Precision::Bf16, KvDtype::Bf16, true), &p, 10);
        assert!(!a.is_empty());
        let same = a == b;
        agreement(
            &dir,
            "bf16 graphs vs direct",
            &format!(
                "{} outputs, {}",
                a.len(),
                if same { "identical" } else { "DIFFERENT" }
            ),
        );
        assert!(
            same,
            "{}: graph replay differs from direct launches",
            dir.display()
        );
    }
}
