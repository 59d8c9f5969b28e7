//! The GPU model on a real CUDA device against the CPU reference backend, on
//! every golden fixture — the checks `emu_model.rs` runs on the emulator, for
//! a machine with a GPU (`scripts/gpu-check`). Ignored by default: they need
//! a GPU and a CUDA driver; `MOSHID_CUDA_INCLUDE` names the folder holding
//! `cuda_bf16.h` for NVRTC when it is not found by itself.
//!
//! Reported per fixture: audio-code and text-token agreement rates (greedy),
//! relative errors of text logits and audio; asserted: the f32 model exact
//! (tokens, codes; ≤ 1e-4 audio and logits), the f32 LM reproducing the LM
//! fixtures and their slot reuse exactly, graphs replaying direct launches,
//! and the bf16 models' first-step logits within the bounds the emulator
//! measured.

mod common;

use common::compare::{compare, outputs, params, SLOTS};
use common::fixtures::fixture_dirs;
use moshid_kernels::device::cuda::{CudaDevice, CudaOpenOptions};
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::ops::attention::KvType;
use moshid_kernels::plan::KvDtype;
use moshid_model::checkpoint::CheckpointDir;

fn device() -> CudaDevice {
    // One PTX cache for every device these tests open: NVRTC compiles once.
    let mut opts = CudaOpenOptions {
        cache_dir: Some(std::env::temp_dir().join("moshid-gpu-golden-ptx")),
        ..CudaOpenOptions::default()
    };
    if let Ok(dir) = std::env::var("MOSHID_CUDA_INCLUDE") {
        opts.include_dirs.push(dir.into());
    }
    CudaDevice::open(0, &opts).expect("opening CUDA device 0")
}

fn model(
    dir: &CheckpointDir,
    precision: Precision,
    kv: KvDtype,
    graphs: bool,
) -> GpuModel<CudaDevice> {
    let opts = GpuOptions {
        max_slots: SLOTS,
        precision,
        kv,
        graphs,
        ..GpuOptions::default()
    };
    GpuModel::load(device(), dir, &opts).unwrap()
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_f32_model_matches_the_cpu_backend() {
    for dir in fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        for graphs in [false, true] {
            let mut gpu = model(&d, Precision::F32, KvDtype::F32, graphs);
            let a = compare(&dir, &mut gpu);
            println!("{} cuda f32 graphs={graphs}: {a}", dir.display());
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
            println!("{} cuda bf16 weights, {kv:?} KV: {a}", dir.display());
            assert_eq!(a.output_mismatches, 0, "{}: {a}", dir.display());
            assert!(a.first_logits_rel < bound, "{}: {a}", dir.display());
        }
    }
}

#[test]
#[ignore = "needs a GPU (scripts/gpu-check)"]
fn cuda_lm_reproduces_the_lm_fixtures() {
    for dir in fixture_dirs("lm_config.json") {
        let a = common::lm_golden::run(&dir, device, Precision::F32, KvType::F32);
        println!("{} cuda f32 LM: {a}", dir.display());
        assert_eq!(a.agree, a.entries, "{}: {a}", dir.display());
        assert!(a.logits_rel <= 1e-4, "{}: {a}", dir.display());
        assert_eq!(a.reuse_mismatches, 0, "{}: {a}", dir.display());
        let b = common::lm_golden::run(&dir, device, Precision::Bf16, KvType::Bf16);
        println!("{} cuda bf16 LM: {b}", dir.display());
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
        assert_eq!(
            a,
            b,
            "{}: graph replay differs from direct launches",
            dir.display()
        );
    }
}
