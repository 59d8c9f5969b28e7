//! Cost of a session's live events on its own core, against a baseline in
//! the same run: writing one text piece to the session's sink (a ring
//! record and the piece's bytes into its text buffer) compared with
//! μ-law-encoding one 20 ms packet (160 samples), the least work a
//! telephony call does per packet; and, on a subscriber's core, draining
//! and rendering that event as SSE.
//!
//! A session writes at most 12.5 text pieces per second (one per model
//! frame); the per-call-second cost is printed with the per-event figures.

use criterion::{criterion_group, criterion_main, Criterion};
use moshid::events::{EventHub, EventsConfig, SessionState};
use moshid::session::record::SessionRecord;
use moshid_model::spm::{PieceKind, PieceTable};
use moshid_telephony::g711::Law;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let hub = EventHub::new(&EventsConfig {
        max_text_bytes: 16 << 20,
        ..EventsConfig::default()
    });
    let rec = SessionRecord::start(1, "bench");
    let mut sink = hub.open(&rec, None, 0, SessionState::Active, None);
    let pieces = PieceTable::from_pieces([
        ("<unk>".to_string(), 0.0, PieceKind::Unknown),
        ("▁hello".to_string(), 0.0, PieceKind::Normal),
    ])
    .unwrap();
    let piece = pieces.text_for_token(1).unwrap();
    let mut frame = 0u64;
    let mut g = c.benchmark_group("session_events");
    g.bench_function("baseline: mu-law encode of one 20 ms packet", |b| {
        let pcm: Vec<f32> = (0..160).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
        let mut out = [0u8; 160];
        b.iter(|| Law::Mu.encode(black_box(&pcm), &mut out));
    });
    g.bench_function("session: one text piece to the sink", |b| {
        b.iter(|| {
            sink.text(black_box(frame), 1, piece);
            frame += 1;
        })
    });
    let mut sub = hub.subscribe("1", 1).unwrap();
    let mut sse = Vec::with_capacity(4096);
    g.bench_function("subscriber: one event drained and rendered as SSE", |b| {
        b.iter(|| {
            sink.text(frame, 1, piece);
            frame += 1;
            sse.clear();
            sub.drain(|seq, e| e.write_sse(seq, &pieces, &mut sse));
            black_box(&sse);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
