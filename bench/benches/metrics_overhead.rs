//! What per-core stage metrics cost: the same load with the switch off and
//! on, in one run, on one thread.
//!
//! The load per stream-frame: Ogg Opus encode of one 1920-sample frame
//! (`moshid::codec`), decode it back, push the PCM through the stream's lane
//! (with a push stamp while on), then per tick `Engine::tick` with a model
//! that costs nothing (drain, batch fill, step, outputs) and the drain of the
//! outputs — what an I/O core and the engine do for a frame, without
//! sockets. With the switch on, the bench records the stages an I/O core
//! records (decode, encode, the push stamp and frame count) and the engine
//! records its own (frame_wait, batch_fill, model_step, frames).
//!
//! Reported: CPU time of this thread per stream-frame (`CLOCK_THREAD_CPUTIME_ID`),
//! off and on, over interleaved rounds; the ratio on/off (median of adjacent
//! pairs; goal ≤ 1.02); and the cost of one recorded stage in ns (the record
//! alone, and with its two clock reads), and of a stage while off.
//!
//! `cargo bench -p moshid-bench --bench metrics_overhead` (args: streams,
//! ticks per round, rounds per mode).

use moshid::codec::{DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder, FRAME_SAMPLES};
use moshid::engine::records::{FromEngine, ToEngine, ToEngineKind};
use moshid::engine::thread::Engine;
use moshid::engine::{core_links, CorePort, EngineShared};
use moshid::metrics::{Owner, Stage, StageRecorder};
use moshid_bench::ZeroCostModel;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time consumed by the calling thread, in nanoseconds.
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (64-bit time_t on the
    // 64-bit Linux targets this workspace builds for); the clock id is valid.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Elsewhere: wall time (noisier).
#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

struct Stream {
    slot: u32,
    generation: u32,
    encoder: OggOpusEncoder,
    decoder: OggOpusDecoder,
}

struct Load {
    shared: Arc<EngineShared>,
    engine: Engine,
    port: CorePort,
    /// The bench's "I/O core" recorder (its only writer).
    core: StageRecorder,
    streams: Vec<Stream>,
    input: Box<[f32; FRAME_SAMPLES]>,
    ogg: Vec<u8>,
    rec: Box<ToEngine>,
}

impl Load {
    fn new(streams: usize) -> Load {
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
        let core = shared.metrics.register(Owner::Core(0), 1, streams);
        let mut port = ports.remove(0);
        let mut rec = Box::<ToEngine>::default();
        let mut list = Vec::new();
        for t in moshid_bench::open_slots(&shared, &mut port, streams) {
            let encoder = OggOpusEncoder::new(EncoderConfig::default()).expect("encoder");
            let decoder = OggOpusDecoder::new(DecoderConfig {
                trim_pre_skip: false,
                ..DecoderConfig::default()
            })
            .expect("decoder");
            list.push(Stream {
                slot: t.slot,
                generation: t.generation,
                encoder,
                decoder,
            });
        }
        engine.tick(0);
        port.from_engine.drain(|_: &FromEngine| {});
        let mut input = Box::new([0.0f32; FRAME_SAMPLES]);
        for (i, x) in input.iter_mut().enumerate() {
            *x = 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 24_000.0).sin();
        }
        let ogg = vec![0u8; list[0].encoder.max_output_bytes_per_frame()];
        rec.kind = ToEngineKind::Frame;
        Load {
            shared,
            engine,
            port,
            core,
            streams: list,
            input,
            ogg,
            rec,
        }
    }

    /// One tick's worth: every stream encodes, decodes and pushes a frame;
    /// the engine ticks; the outputs are drained. Stages are recorded when
    /// the switch is on (read once, as a session reads it per message batch).
    /// Without `codec`, the frame is pushed as is (lanes and tick only).
    fn tick(&mut self, codec: bool) {
        let on = self.shared.metrics.enabled();
        for s in &mut self.streams {
            if !codec {
                self.rec.pcm.copy_from_slice(&self.input[..]);
                self.rec.slot = s.slot;
                self.rec.generation = s.generation;
                self.rec.pushed_at = on.then(Instant::now);
                self.port
                    .to_engine
                    .try_push(&self.rec)
                    .expect("lane sized for every slot");
                if on {
                    self.core.frames(1);
                }
                continue;
            }
            let t = on.then(Instant::now);
            let n = s
                .encoder
                .encode_frame(&self.input, &mut self.ogg)
                .expect("encode");
            let t = t.map(|t| {
                let now = Instant::now();
                self.core
                    .record(Stage::Encode, now.saturating_duration_since(t));
                now
            });
            s.decoder.push_bytes(&self.ogg[..n]).expect("decode");
            let mut filled = 0;
            while let Some(pcm) = s.decoder.next_pcm().expect("decode") {
                let take = pcm.len().min(FRAME_SAMPLES - filled);
                self.rec.pcm[filled..filled + take].copy_from_slice(&pcm[..take]);
                filled += take;
            }
            if let Some(t) = t {
                self.core.record(Stage::Decode, t.elapsed());
            }
            self.rec.slot = s.slot;
            self.rec.generation = s.generation;
            self.rec.pushed_at = on.then(Instant::now);
            self.port
                .to_engine
                .try_push(&self.rec)
                .expect("lane sized for every slot");
            if on {
                self.core.frames(1);
            }
        }
        self.engine.tick(0);
        let got = self.port.from_engine.drain(|r: &FromEngine| {
            black_box(r.text_token);
        });
        assert_eq!(got, self.streams.len());
    }
}

/// CPU ns per stream-frame over `ticks` ticks.
fn round(load: &mut Load, on: bool, ticks: usize, codec: bool) -> f64 {
    load.shared.metrics.set_enabled(on);
    let t0 = thread_cpu_ns();
    for _ in 0..ticks {
        load.tick(codec);
    }
    (thread_cpu_ns() - t0) as f64 / (ticks * load.streams.len()) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians of CPU ns per stream-frame off and on, and of the on/off ratio of
/// adjacent rounds (the mode that goes first alternates so drift cancels).
fn compare(load: &mut Load, ticks: usize, rounds: usize, codec: bool) -> (f64, f64, f64) {
    // Warm caches, codec state and the branch predictors in both modes.
    round(load, false, ticks, codec);
    round(load, true, ticks, codec);
    let (mut off, mut on, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (a, b) = if r % 2 == 0 {
            let a = round(load, false, ticks, codec);
            (a, round(load, true, ticks, codec))
        } else {
            let b = round(load, true, ticks, codec);
            (round(load, false, ticks, codec), b)
        };
        off.push(a);
        on.push(b);
        ratios.push(b / a);
    }
    (median(&mut off), median(&mut on), median(&mut ratios))
}

/// ns per iteration of `f` over `iters` iterations (CPU time).
fn per_iter(iters: u64, mut f: impl FnMut(u64)) -> f64 {
    let t0 = thread_cpu_ns();
    for i in 0..iters {
        f(i);
    }
    (thread_cpu_ns() - t0) as f64 / iters as f64
}

fn main() {
    // `cargo bench` passes `--bench`; numbers are positional.
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let streams = args.first().copied().unwrap_or(64);
    let ticks = args.get(1).copied().unwrap_or(25);
    let rounds = args.get(2).copied().unwrap_or(12);

    let mut load = Load::new(streams);
    let (m_off, m_on, m_ratio) = compare(&mut load, ticks, rounds, true);
    // The same without the codec: the metrics' cost against the daemon's own
    // per-frame work only (an upper bound on the relative overhead).
    let (b_off, b_on, b_ratio) = compare(&mut load, ticks * 20, rounds, false);
    let recorded = load.shared.metrics.snapshots();
    let frames_per_mode = (rounds * ticks * streams) as u64;
    let engine = recorded
        .iter()
        .find(|s| s.owner == Owner::Engine)
        .expect("engine registered");
    assert!(
        engine.stage(Stage::FrameWait).count() >= frames_per_mode,
        "the on rounds recorded frame_wait for every frame"
    );

    // One recorded stage, alone and with its clock reads; a stage while off.
    let rec = load.shared.metrics.register(Owner::Core(1), 1, streams);
    let iters = 20_000_000u64;
    let record_ns = per_iter(iters, |i| {
        rec.record(Stage::Send, Duration::from_nanos(black_box(i & 0xFFFF)))
    });
    let timed_ns = per_iter(iters / 4, |_| {
        let t = Instant::now();
        rec.record(Stage::Send, t.elapsed());
    });
    load.shared.metrics.set_enabled(false);
    let registry = &load.shared.metrics;
    let off_ns = per_iter(iters, |_| {
        let t = black_box(registry.enabled()).then(Instant::now);
        if let Some(t) = t {
            rec.record(Stage::Send, t.elapsed());
        }
    });

    println!("metrics_overhead: {streams} streams, {ticks} ticks x {rounds} rounds per mode (CPU time of one thread)");
    println!("  per stream-frame, metrics off: {m_off:.0} ns (median)");
    println!("  per stream-frame, metrics on:  {m_on:.0} ns (median)");
    println!(
        "  ratio on/off: {m_ratio:.4} (median of adjacent pairs; goal <= 1.02); difference of medians {:+.0} ns",
        m_on - m_off
    );
    println!(
        "  without the codec (lanes + tick only): off {b_off:.0} ns, on {b_on:.0} ns per stream-frame, ratio {b_ratio:.3}"
    );
    println!("  one recorded stage: {record_ns:.1} ns (record only), {timed_ns:.1} ns (with its two clock reads)");
    println!("  one stage with metrics off: {off_ns:.2} ns (switch read, no clock)");
}
