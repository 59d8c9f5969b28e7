//! The GPU model's step allocates nothing on the host once a bucket's graph
//! is captured (and nothing in its direct path either): checked on the
//! emulator device with a counting global allocator, for every fixture,
//! graphs on and off, while the mix of active slots changes every step.

#[path = "../../model/tests/golden_alloc.rs"]
mod alloc_count;
mod common;

use alloc_count::count;
use common::compare::{params, SLOTS};
use common::fixtures::fixture_dirs;
use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::model::{GpuModel, GpuOptions, Precision};
use moshid_kernels::plan::KvDtype;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::streaming::StreamingModel;

#[test]
fn gpu_model_step_does_not_allocate() {
    let (_, probe) = count(|| drop(std::hint::black_box(vec![0u8; 64])));
    assert!(probe > 0, "the allocation counter does not count");
    for dir in fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        for graphs in [true, false] {
            let opts = GpuOptions {
                max_slots: SLOTS,
                precision: Precision::Bf16,
                kv: KvDtype::Bf16,
                graphs,
                ..GpuOptions::default()
            };
            let mut model = GpuModel::load(EmuDevice::new(), &d, &opts).unwrap();
            let p = params(&d);
            for s in 0..SLOTS {
                model.reset_slot(s, &p).unwrap();
            }
            let mut batch = model.new_batch();
            // Warm every bucket first (its first step captures its graph).
            for n in 1..=SLOTS {
                batch.exec.fill(false);
                batch.exec[..n].fill(true);
                model.step(&mut batch).unwrap();
            }
            for t in 0..10 {
                for s in 0..SLOTS {
                    batch.exec[s] = (t + s) % 3 != 0;
                }
                for (i, x) in batch.input_pcm.iter_mut().enumerate() {
                    *x = 0.2 * (((t * 1920 + i) as f32) * 0.031).sin();
                }
                let (r, n) = count(|| model.step(&mut batch));
                r.unwrap();
                assert_eq!(
                    n,
                    0,
                    "{}: graphs {graphs}, step {t} allocated {n} times",
                    dir.display()
                );
            }
        }
    }
}
