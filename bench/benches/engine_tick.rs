//! Engine tick overhead per stream-frame with a model that costs nothing:
//! an I/O core pushes one frame per stream into its lane, the engine drains
//! the lane, fills the batch, "steps", pushes every output back and rings the
//! doorbell, and the core drains its outputs. Reported per stream-frame
//! (criterion's throughput in elements), for 8, 64 and 256 streams.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moshid::engine::records::{FromEngine, ToEngine, ToEngineKind};
use moshid::engine::thread::Engine;
use moshid::engine::{core_links, EngineShared};
use moshid_bench::ZeroCostModel;
use std::sync::Arc;

fn bench_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_tick_per_stream_frame");
    for streams in [8usize, 64, 256] {
        let shared = Arc::new(EngineShared::new(streams, 1, 10.0, 1));
        let (links, mut ports) = core_links(1, streams * 4);
        let mut engine = Engine::new(
            Box::new(ZeroCostModel::new(streams)),
            links,
            shared.clone(),
            4,
            1,
        );
        engine.warm_up();
        let port = &mut ports[0];
        let mut rec = ToEngine::default();
        let tickets = moshid_bench::open_slots(&shared, port, streams);
        engine.tick(0);
        port.from_engine.drain(|_: &FromEngine| {});
        rec.kind = ToEngineKind::Frame;
        group.throughput(Throughput::Elements(streams as u64));
        group.bench_with_input(BenchmarkId::from_parameter(streams), &streams, |b, _| {
            b.iter(|| {
                for t in &tickets {
                    rec.slot = t.slot;
                    rec.generation = t.generation;
                    port.to_engine
                        .try_push(&rec)
                        .expect("lane sized for every slot");
                }
                engine.tick(0);
                let got = port.from_engine.drain(|r: &FromEngine| {
                    std::hint::black_box(r.text_token);
                });
                assert_eq!(got, streams);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_tick);
criterion_main!(benches);
