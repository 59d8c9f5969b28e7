//! One CPU step (Mimi encode → LM step → Mimi decode) for batches of 1 and 8
//! streams, on the golden fixtures and on the demo checkpoint.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::cpu::CpuModel;
use moshid_model::lm::GenParams;
use moshid_model::streaming::{SessionParams, StreamingModel};
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden");
    let mut out = Vec::new();
    for name in ["moshi-tiny", "hibiki-tiny"] {
        let p = root.join(name);
        if p.join("lm_config.json").exists() {
            out.push((name.to_string(), p));
        }
    }
    out
}

fn bench_step(c: &mut Criterion) {
    let demo_dir = tempfile::tempdir().expect("temp dir");
    let demo = demo_dir.path().join("demo");
    moshid_model::demo::write_demo(&demo, moshid_model::demo::DEMO_SEED).expect("demo checkpoint");
    let mut models = fixtures();
    models.push(("demo".to_string(), demo));
    let mut group = c.benchmark_group("cpu_step");
    for (name, dir) in models {
        let d = CheckpointDir::open(&dir).expect("checkpoint");
        for batch in [1usize, 8] {
            let mut model = CpuModel::load(&d, batch).expect("weights");
            let mut params = SessionParams {
                gen: GenParams::greedy(),
                ..SessionParams::default()
            };
            if !d.lm.conditioners.is_empty() {
                params.gen = GenParams::greedy().with_hibiki_conditions(3.0);
            }
            for s in 0..batch {
                model.reset_slot(s, &params).expect("reset");
            }
            let mut b = model.new_batch();
            b.exec.iter_mut().for_each(|e| *e = true);
            for (i, x) in b.input_pcm.iter_mut().enumerate() {
                *x = 0.2 * ((i as f32) * 0.013).sin();
            }
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(BenchmarkId::new(name.clone(), batch), &batch, |bench, _| {
                bench.iter(|| model.step(&mut b).expect("step"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
