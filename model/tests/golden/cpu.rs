//! The whole CPU backend step (Mimi encode → LM step → Mimi decode) on each
//! fixture: no allocation per step, whatever the mix of active slots.

use super::alloc_count::count;
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::lm::GenParams;
use moshid_model::streaming::{SessionParams, StreamingModel};

#[test]
fn cpu_backend_step_does_not_allocate() {
    for dir in super::fixtures::fixture_dirs("lm_config.json") {
        let d = CheckpointDir::open(&dir).unwrap();
        let slots = 4;
        let mut model = CpuModel::load(&d, slots).unwrap();
        let mut gen = GenParams::default();
        if d.lm.has_conditioners() {
            gen = gen.with_hibiki_conditions(3.0);
        }
        for s in 0..slots {
            gen.seed = s as u64;
            model
                .reset_slot(
                    s,
                    &SessionParams {
                        gen: gen.clone(),
                        ..SessionParams::default()
                    },
                )
                .unwrap();
        }
        let mut batch = model.new_batch();
        let (_, probe) = count(|| drop(std::hint::black_box(vec![0u8; 64])));
        assert!(probe > 0, "the allocation counter does not count");
        for t in 0..12 {
            for s in 0..slots {
                batch.exec[s] = (t + s) % 3 != 0;
            }
            for (i, x) in batch.input_pcm.iter_mut().enumerate() {
                *x = 0.2 * (((t * 1920 + i) as f32) * 0.031).sin();
            }
            let (r, n) = count(|| model.step(&mut batch));
            r.unwrap();
            assert_eq!(n, 0, "{}: CPU step {t} allocated {n} times", dir.display());
        }
    }
}
