//! `GpuMimi` on the emulator device against the official implementation's
//! golden fixtures and the CPU reference.
//!
//! For every fixture folder (every folder under `shared/golden` with a
//! `mimi_config.json`, `shared/golden-next/hibiki-zero-tiny`, and the
//! colon-separated folders of `MOSHID_GOLDEN`):
//! - the streaming encode of `pcm_in`, frame by frame, the 3 streams in one
//!   batch, gives `mimi_codes` exactly; the streaming decode of `mimi_codes`
//!   gives `mimi_pcm_out` within a relative error of 1e-4 (and stays as close
//!   to the CPU `Mimi` on the same inputs);
//! - independence: the streams in other slots of a larger `max_slots`, with
//!   padding rows, the rows in another order and one stream masked for a
//!   call (it does not advance), give the same outputs; a reset slot reused
//!   by another stream gives that stream's outputs from its start;
//! - a captured graph replayed frame after frame (inputs copied into the
//!   same device buffers) gives the same codes and audio as direct launches.

// The PersonaPlex folder list is not used by this target.
#[allow(dead_code)]
#[path = "../../model/tests/golden_fixtures.rs"]
mod fixtures;

use fixtures::rel_err;

use moshid_kernels::device::emu::EmuDevice;
use moshid_kernels::device::{DevPtr, Device};
use moshid_kernels::model::mimi::GpuMimi;
use moshid_kernels::ops::types::SlotStep;
use moshid_model::config::MimiConfig;
use moshid_model::mimi::Mimi;
use moshid_model::weights::Weights;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::time::Instant;

const MAX_REL: f64 = 1e-4;

fn fixture_dirs() -> Vec<PathBuf> {
    fixtures::fixture_dirs("mimi_config.json")
}

struct Io {
    streams: usize,
    codebooks: usize,
    frames: usize,
    pcm_in: Vec<f32>,
    /// `[stream][k][frame]`.
    codes: Vec<i64>,
    pcm_out: Vec<f32>,
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn read_io(dir: &Path) -> Io {
    let bytes = std::fs::read(dir.join("io.safetensors")).expect("io.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("valid io.safetensors");
    let (pcm_in, ps) = fixtures::tensor_f32(&st, "pcm_in");
    let (codes, cs) = fixtures::tensor_i64(&st, "mimi_codes");
    let (pcm_out, os) = fixtures::tensor_f32(&st, "mimi_pcm_out");
    assert_eq!(ps.len(), 3);
    assert_eq!(ps, os);
    assert_eq!(cs[0], ps[0]);
    Io {
        streams: cs[0],
        codebooks: cs[1],
        frames: cs[2],
        pcm_in,
        codes,
        pcm_out,
    }
}

impl Io {
    fn code(&self, stream: usize, k: usize, frame: usize) -> u32 {
        self.codes[(stream * self.codebooks + k) * self.frames + frame] as u32
    }
    fn frame_codes(&self, stream: usize, frame: usize) -> Vec<u32> {
        (0..self.codebooks)
            .map(|k| self.code(stream, k, frame))
            .collect()
    }
    fn pcm(&self, stream: usize, frame: usize, fs: usize) -> &[f32] {
        let base = (stream * self.frames + frame) * fs;
        &self.pcm_in[base..base + fs]
    }
    fn ref_out(&self, stream: usize, fs: usize) -> &[f32] {
        &self.pcm_out[stream * self.frames * fs..(stream + 1) * self.frames * fs]
    }
}

fn config(dir: &Path) -> MimiConfig {
    MimiConfig::from_file(&dir.join("mimi_config.json")).expect("mimi config")
}

fn load_gpu(dev: &mut EmuDevice, dir: &Path, nq: usize, slots: usize, rows: usize) -> GpuMimi {
    let cfg = config(dir);
    let mut w = Weights::open(&dir.join("mimi.safetensors")).expect("mimi weights");
    let m = GpuMimi::load(dev, &cfg, &mut w, nq, slots, rows).expect("GpuMimi::load");
    w.finish().expect("every tensor used");
    assert_eq!(m.num_codebooks(), nq);
    m
}

fn load_cpu(dir: &Path, nq: usize) -> Mimi {
    let cfg = config(dir);
    let mut w = Weights::open(&dir.join("mimi.safetensors")).expect("mimi weights");
    let m = Mimi::load(&cfg, &mut w, nq).expect("Mimi::load");
    w.finish().expect("every tensor used");
    m
}

fn bytes_of<T: Copy>(v: &[T], f: impl Fn(&T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(f).collect()
}

/// One row of a call: `Some((stream, frame))` feeds that stream's frame
/// through `slot`; `None` is an inactive row (padding or a masked slot).
#[derive(Debug, Clone, Copy)]
struct Row {
    slot: usize,
    feed: Option<(usize, usize)>,
}

/// Device buffers for calls of `rows` rows, and the model.
struct Bench {
    dev: EmuDevice,
    mimi: GpuMimi,
    rows: usize,
    steps: DevPtr,
    pcm: DevPtr,
    codes_in: DevPtr,
    codes_out: DevPtr,
    pcm_out: DevPtr,
    /// Extra columns in the codes rows (a wider stride than n_q).
    stride: usize,
}

/// Outputs of one call, per row: codes and audio (active rows only).
type CallOut = Vec<Option<(Vec<u32>, Vec<f32>)>>;

impl Bench {
    fn new(dir: &Path, nq: usize, max_slots: usize, rows: usize) -> Bench {
        let mut dev = EmuDevice::new();
        let mimi = load_gpu(&mut dev, dir, nq, max_slots, rows);
        let fs = mimi.frame_samples();
        let stride = nq + 3;
        let steps = dev.alloc(rows * 16).unwrap();
        let pcm = dev.alloc(rows * fs * 4).unwrap();
        let codes_in = dev.alloc(rows * stride * 4).unwrap();
        let codes_out = dev.alloc(rows * stride * 4).unwrap();
        let pcm_out = dev.alloc(rows * fs * 4).unwrap();
        Bench {
            dev,
            mimi,
            rows,
            steps,
            pcm,
            codes_in,
            codes_out,
            pcm_out,
            stride,
        }
    }

    /// Copies one call's inputs into the device buffers: PCM and codes of
    /// inactive rows are garbage (NaN, out-of-range codes) that must not be
    /// read; the outputs are pre-filled with sentinels.
    fn stage(&mut self, io: &Io, call: &[Row], encode_codes: Option<&[Vec<u32>]>) {
        assert_eq!(call.len(), self.rows);
        let fs = self.mimi.frame_samples();
        let nq = io.codebooks;
        let mut steps = Vec::new();
        let mut pcm = vec![f32::NAN; self.rows * fs];
        let mut codes = vec![u32::MAX; self.rows * self.stride];
        for (j, r) in call.iter().enumerate() {
            steps.push(SlotStep {
                slot: r.slot as i32,
                active: r.feed.is_some() as i32,
                row_cond: j as i32,
                row_null: -1,
            });
            if let Some((s, f)) = r.feed {
                pcm[j * fs..(j + 1) * fs].copy_from_slice(io.pcm(s, f, fs));
                let c = match encode_codes {
                    Some(cs) => cs[j].clone(),
                    None => io.frame_codes(s, f),
                };
                codes[j * self.stride..j * self.stride + nq].copy_from_slice(&c);
            }
        }
        let sb: Vec<u8> = steps
            .iter()
            .flat_map(|s| [s.slot, s.active, s.row_cond, s.row_null])
            .flat_map(i32::to_le_bytes)
            .collect();
        self.dev.upload(self.steps, &sb).unwrap();
        self.dev
            .upload(self.pcm, &bytes_of(&pcm, |v| v.to_le_bytes()))
            .unwrap();
        self.dev
            .upload(self.codes_in, &bytes_of(&codes, |v| v.to_le_bytes()))
            .unwrap();
        let sentinel = vec![0xEEu8; self.rows * self.stride * 4];
        self.dev.upload(self.codes_out, &sentinel).unwrap();
        let sentinel = vec![0x7Fu8; self.rows * fs * 4];
        self.dev.upload(self.pcm_out, &sentinel).unwrap();
    }

    fn issue(&mut self) {
        let (rows, st) = (self.rows, self.stride);
        self.mimi
            .encode(
                &mut self.dev,
                rows,
                self.steps,
                self.pcm,
                self.codes_out,
                st,
            )
            .expect("encode");
        self.mimi
            .decode(
                &mut self.dev,
                rows,
                self.steps,
                self.codes_in,
                st,
                self.pcm_out,
            )
            .expect("decode");
    }

    /// Reads the outputs of a call; checks that inactive rows got no codes
    /// and zero audio.
    fn collect(&mut self, call: &[Row], nq: usize) -> CallOut {
        self.dev.synchronize().unwrap();
        let fs = self.mimi.frame_samples();
        let mut cb = vec![0u8; self.rows * self.stride * 4];
        self.dev.download(self.codes_out, &mut cb).unwrap();
        let codes: Vec<u32> = cb
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut pb = vec![0u8; self.rows * fs * 4];
        self.dev.download(self.pcm_out, &mut pb).unwrap();
        let pcm = f32s(&pb);
        call.iter()
            .enumerate()
            .map(|(j, r)| {
                let c = &codes[j * self.stride..(j + 1) * self.stride];
                assert!(
                    c[nq..].iter().all(|&v| v == 0xEEEE_EEEE),
                    "row {j}: codes written past n_q"
                );
                let p = &pcm[j * fs..(j + 1) * fs];
                match r.feed {
                    Some(_) => Some((c[..nq].to_vec(), p.to_vec())),
                    None => {
                        assert!(
                            c.iter().all(|&v| v == 0xEEEE_EEEE),
                            "inactive row {j}: codes written"
                        );
                        assert!(
                            p.iter().all(|&v| v == 0.0),
                            "inactive row {j}: audio not zero"
                        );
                        None
                    }
                }
            })
            .collect()
    }

    fn run(&mut self, io: &Io, call: &[Row]) -> CallOut {
        self.stage(io, call, None);
        self.issue();
        self.collect(call, io.codebooks)
    }
}

/// Per-stream codes (`[frame][k]`) and audio, gathered from calls' outputs.
#[derive(Debug, Clone, Default, PartialEq)]
struct Streams {
    codes: Vec<Vec<Vec<u32>>>,
    audio: Vec<Vec<f32>>,
}

impl Streams {
    fn new(n: usize) -> Self {
        Streams {
            codes: vec![Vec::new(); n],
            audio: vec![Vec::new(); n],
        }
    }

    fn add(&mut self, call: &[Row], out: CallOut) {
        for (r, o) in call.iter().zip(out) {
            if let (Some((s, f)), Some((c, p))) = (r.feed, o) {
                assert_eq!(self.codes[s].len(), f, "stream {s} frames out of order");
                self.codes[s].push(c);
                self.audio[s].extend_from_slice(&p);
            }
        }
    }
}

fn check_codes(io: &Io, got: &[Vec<u32>], stream: usize, what: &str) {
    assert_eq!(got.len(), io.frames, "{what}: stream {stream}: frames");
    for (f, c) in got.iter().enumerate() {
        assert_eq!(
            c,
            &io.frame_codes(stream, f),
            "{what}: stream {stream}, frame {f}: codes differ"
        );
    }
}

/// The CPU reference on the same inputs: all streams, slot s = stream s,
/// encode of `pcm_in` and decode of `mimi_codes`.
fn cpu_run(mimi: &Mimi, io: &Io) -> Streams {
    let (fs, nq, n) = (mimi.frame_samples(), io.codebooks, io.streams);
    let mut enc = mimi.new_state(n);
    let mut dec = mimi.new_state(n);
    let mut out = Streams::new(n);
    let active = vec![true; n];
    for f in 0..io.frames {
        let pcm: Vec<f32> = (0..n).flat_map(|s| io.pcm(s, f, fs).to_vec()).collect();
        let codes_in: Vec<u32> = (0..n).flat_map(|s| io.frame_codes(s, f)).collect();
        let mut codes = vec![0; n * nq];
        let mut audio = vec![0.0; n * fs];
        mimi.encode_step(&mut enc, &pcm, &active, &mut codes);
        mimi.decode_step(&mut dec, &codes_in, &active, &mut audio);
        for s in 0..n {
            out.codes[s].push(codes[s * nq..(s + 1) * nq].to_vec());
            out.audio[s].extend_from_slice(&audio[s * fs..(s + 1) * fs]);
        }
    }
    out
}

fn plain_calls(io: &Io) -> Vec<Vec<Row>> {
    (0..io.frames)
        .map(|f| {
            (0..io.streams)
                .map(|s| Row {
                    slot: s,
                    feed: Some((s, f)),
                })
                .collect()
        })
        .collect()
}

#[test]
fn encode_and_decode_match_golden_and_cpu() {
    for dir in fixture_dirs() {
        let io = read_io(&dir);
        let name = dir.display().to_string();
        let t0 = Instant::now();
        let mut b = Bench::new(&dir, io.codebooks, io.streams, io.streams);
        let fs = b.mimi.frame_samples();
        assert_eq!(io.pcm_in.len(), io.streams * io.frames * fs);
        let mut got = Streams::new(io.streams);
        for call in plain_calls(&io) {
            let out = b.run(&io, &call);
            got.add(&call, out);
        }
        let secs = t0.elapsed().as_secs_f64();
        for s in 0..io.streams {
            check_codes(&io, &got.codes[s], s, &name);
        }
        let cpu = cpu_run(&load_cpu(&dir, io.codebooks), &io);
        let mut worst = 0f64;
        for s in 0..io.streams {
            let e = rel_err(&got.audio[s], io.ref_out(s, fs));
            assert!(
                e <= MAX_REL,
                "{name}: stream {s}: decoded audio relative error {e:.3e} > {MAX_REL:e}"
            );
            worst = worst.max(e);
            assert_eq!(cpu.codes[s], got.codes[s], "{name}: stream {s}: CPU codes");
        }
        let all = rel_err(&got.audio.concat(), &io.pcm_out);
        let vs_cpu = rel_err(&got.audio.concat(), &cpu.audio.concat());
        let cpu_err = rel_err(&cpu.audio.concat(), &io.pcm_out);
        assert!(vs_cpu <= MAX_REL, "{name}: GPU vs CPU audio {vs_cpu:.3e}");
        let mem = b.mimi.memory();
        println!(
            "{name}: codes exact ({} streams × {} frames × {} codebooks); decoded audio rel. error \
             {all:.3e} vs golden (worst stream {worst:.3e}; CPU reference {cpu_err:.3e}), {vs_cpu:.3e} vs CPU; \
             {} emulator launches, {secs:.1} s; memory {mem:?}",
            io.streams,
            io.frames,
            io.codebooks,
            b.dev.launches(),
        );
    }
}

#[test]
fn streams_are_independent_of_slots_padding_masking_and_reuse() {
    for dir in fixture_dirs() {
        let io = read_io(&dir);
        let name = dir.display().to_string();
        let t0 = Instant::now();
        assert_eq!(io.streams, 3, "the schedule below is written for 3 streams");
        let (max_slots, rows) = (6, 5);
        let mut b = Bench::new(&dir, io.codebooks, max_slots, rows);
        let fs = b.mimi.frame_samples();
        // Streams 0, 1, 2 in slots 4, 1, 3; slots 0, 2, 5 idle. Rows in a
        // varying order with two padding rows (naming idle slots). Stream 1
        // is masked at call 2 (an inactive row naming its slot): it must not
        // advance, so it runs one call behind from then on.
        let place = [4usize, 1, 3];
        let mask_call = 2;
        let mut next = [0usize; 3];
        let mut got = Streams::new(3);
        let mut call_no = 0;
        while next.iter().any(|&f| f < io.frames) {
            let mut call = Vec::new();
            for s in 0..3 {
                let feed = (next[s] < io.frames && !(s == 1 && call_no == mask_call))
                    .then_some((s, next[s]));
                call.push(Row {
                    slot: place[s],
                    feed,
                });
            }
            call.push(Row {
                slot: 0,
                feed: None,
            });
            call.push(Row {
                slot: 5,
                feed: None,
            });
            call.rotate_left(call_no % rows);
            let out = b.run(&io, &call);
            for r in &call {
                if let Some((s, _)) = r.feed {
                    next[s] += 1;
                }
            }
            got.add(&call, out);
            call_no += 1;
        }
        assert_eq!(call_no, io.frames + 1, "stream 1 ran one call behind");
        for s in 0..3 {
            check_codes(
                &io,
                &got.codes[s],
                s,
                &format!("{name} (scattered, masked)"),
            );
            let e = rel_err(&got.audio[s], io.ref_out(s, fs));
            assert!(
                e <= MAX_REL,
                "{name} (scattered, masked): stream {s}: {e:.3e}"
            );
        }
        // The masked stream's outputs are those of an unmasked run.
        let mut plain = Bench::new(&dir, io.codebooks, io.streams, io.streams);
        let mut want = Streams::new(io.streams);
        for call in plain_calls(&io) {
            let out = plain.run(&io, &call);
            want.add(&call, out);
        }
        for s in 0..3 {
            assert_eq!(
                got.codes[s], want.codes[s],
                "{name}: stream {s} codes vs plain run"
            );
            let e = rel_err(&got.audio[s], &want.audio[s]);
            assert!(e <= 1e-6, "{name}: stream {s} audio vs plain run: {e:.3e}");
        }

        // Reuse: stream 0's slot (4) is reset and runs stream 2 from its
        // start, beside stream 1 continuing from scratch in slot 1 (reset
        // too) and a padding row; it must give stream 2's outputs.
        b.mimi.reset_slot(&mut b.dev, place[0]).unwrap();
        b.mimi.reset_slot(&mut b.dev, place[1]).unwrap();
        // 8 frames: 16 transformer steps, the fixtures' rings (context 6) wrap.
        let reuse_frames = io.frames.min(8);
        let mut reuse = Streams::new(3);
        for f in 0..reuse_frames {
            let mut call = vec![
                Row {
                    slot: 2,
                    feed: None,
                },
                Row {
                    slot: place[0],
                    feed: Some((2, f)),
                },
                Row {
                    slot: place[1],
                    feed: Some((1, f)),
                },
                Row {
                    slot: 0,
                    feed: None,
                },
                Row {
                    slot: 5,
                    feed: None,
                },
            ];
            call.rotate_right(f % rows);
            let out = b.run(&io, &call);
            reuse.add(&call, out);
        }
        for s in [1, 2] {
            let n = reuse_frames;
            assert_eq!(
                reuse.codes[s][..],
                want.codes[s][..n],
                "{name} (reset slot): stream {s}"
            );
            let e = rel_err(&reuse.audio[s], &want.audio[s][..n * fs]);
            assert!(
                e <= 1e-6,
                "{name} (reset slot): stream {s} audio vs plain run: {e:.3e}"
            );
        }
        println!(
            "{name}: independence (slots {place:?} of {max_slots}, {rows} rows, stream 1 masked at call {mask_call}, slot reuse) \
             ok in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn captured_graphs_replay_as_direct_launches() {
    for dir in fixture_dirs() {
        let io = read_io(&dir);
        let name = dir.display().to_string();
        let t0 = Instant::now();
        let mut b = Bench::new(&dir, io.codebooks, io.streams, io.streams);
        let fs = b.mimi.frame_samples();
        let (rows, st) = (b.rows, b.stride);
        b.dev.begin_capture().unwrap();
        b.mimi
            .encode(&mut b.dev, rows, b.steps, b.pcm, b.codes_out, st)
            .unwrap();
        let enc = b.dev.end_capture().unwrap();
        b.dev.begin_capture().unwrap();
        b.mimi
            .decode(&mut b.dev, rows, b.steps, b.codes_in, st, b.pcm_out)
            .unwrap();
        let dec = b.dev.end_capture().unwrap();
        let mut got = Streams::new(io.streams);
        for call in plain_calls(&io) {
            b.stage(&io, &call, None);
            b.dev.launch_graph(enc).unwrap();
            b.dev.launch_graph(dec).unwrap();
            let out = b.collect(&call, io.codebooks);
            got.add(&call, out);
        }
        let mut direct = Bench::new(&dir, io.codebooks, io.streams, io.streams);
        let mut want = Streams::new(io.streams);
        for call in plain_calls(&io) {
            let out = direct.run(&io, &call);
            want.add(&call, out);
        }
        for s in 0..io.streams {
            check_codes(&io, &got.codes[s], s, &format!("{name} (graph)"));
        }
        assert_eq!(got.codes, want.codes, "{name}: graph vs direct codes");
        assert_eq!(got.audio, want.audio, "{name}: graph vs direct audio");
        let fs_ok = got.audio.iter().all(|a| a.len() == io.frames * fs);
        assert!(fs_ok);
        println!(
            "{name}: graph replays equal direct launches ({} frames) in {:.1} s",
            io.frames,
            t0.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn random_weights_give_finite_audio() {
    let dir = &fixture_dirs()[0];
    let cfg = config(dir);
    let mut dev = EmuDevice::new();
    let m = GpuMimi::random(&mut dev, &cfg, 8, 2, 2, 42).expect("random");
    let fs = m.frame_samples();
    let steps = dev.alloc(32).unwrap();
    let pcm = dev.alloc(2 * fs * 4).unwrap();
    let codes = dev.alloc(2 * 8 * 4).unwrap();
    let out = dev.alloc(2 * fs * 4).unwrap();
    let s: Vec<u8> = [1i32, 1, 0, -1, 0, 1, 1, -1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dev.upload(steps, &s).unwrap();
    let x: Vec<u8> = (0..2 * fs)
        .map(|i| (i as f32 * 0.01).sin() * 0.3)
        .flat_map(f32::to_le_bytes)
        .collect();
    dev.upload(pcm, &x).unwrap();
    for _ in 0..3 {
        m.encode(&mut dev, 2, steps, pcm, codes, 8).unwrap();
        m.decode(&mut dev, 2, steps, codes, 8, out).unwrap();
    }
    dev.synchronize().unwrap();
    let mut cb = vec![0u8; 2 * 8 * 4];
    dev.download(codes, &mut cb).unwrap();
    assert!(cb
        .chunks_exact(4)
        .all(|c| u32::from_le_bytes(c.try_into().unwrap()) < cfg.quantizer.bins as u32));
    let mut ob = vec![0u8; 2 * fs * 4];
    dev.download(out, &mut ob).unwrap();
    let audio = f32s(&ob);
    assert!(audio.iter().all(|v| v.is_finite()));
    assert!(audio.iter().any(|v| *v != 0.0));
    let mem = m.memory();
    assert!(mem.weights > 0 && mem.state_per_slot > 0 && mem.scratch > 0);
}

/// The real Mimi shape (random weights): its per-slot state is what the
/// memory plan counts, and a few frames of the real geometry (512 channels,
/// 2048-entry codebooks of width 256, head width 64) launch and give finite
/// audio.
#[test]
fn real_shape_matches_the_memory_plan_and_runs() {
    use moshid_kernels::plan::{MemoryPlan, PlanOptions};
    use moshid_model::config::LmConfig;
    let cfg = MimiConfig::mimi_default();
    let t0 = Instant::now();
    let mut dev = EmuDevice::new();
    let m = GpuMimi::random(&mut dev, &cfg, 8, 1, 1, 1).expect("random real-shape Mimi");
    let load = t0.elapsed().as_secs_f64();
    assert_eq!((m.frame_samples(), m.num_codebooks()), (1920, 8));
    let mem = m.memory();
    let plan = MemoryPlan::new(&LmConfig::moshi_7b(), &cfg, &PlanOptions::default());
    assert_eq!(mem.state_per_slot as u64, plan.mimi_state_bytes_per_slot);
    let fs = m.frame_samples();
    let steps = dev.alloc(16).unwrap();
    let pcm = dev.alloc(fs * 4).unwrap();
    let codes = dev.alloc(8 * 4).unwrap();
    let out = dev.alloc(fs * 4).unwrap();
    let s: Vec<u8> = [0i32, 1, 0, -1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dev.upload(steps, &s).unwrap();
    let t1 = Instant::now();
    let frames = 2;
    let mut launches = (0, 0);
    for f in 0..frames {
        let x: Vec<u8> = (0..fs)
            .map(|i| ((i + f * fs) as f32 * 0.01).sin() * 0.3)
            .flat_map(f32::to_le_bytes)
            .collect();
        dev.upload(pcm, &x).unwrap();
        let l0 = dev.launches();
        m.encode(&mut dev, 1, steps, pcm, codes, 8).unwrap();
        let l1 = dev.launches();
        m.decode(&mut dev, 1, steps, codes, 8, out).unwrap();
        launches = (l1 - l0, dev.launches() - l1);
    }
    dev.synchronize().unwrap();
    let mut ob = vec![0u8; fs * 4];
    dev.download(out, &mut ob).unwrap();
    let audio = f32s(&ob);
    assert!(audio.iter().all(|v| v.is_finite()));
    let rms = (audio.iter().map(|v| (v * v) as f64).sum::<f64>() / fs as f64).sqrt();
    assert!(rms > 0.0);
    println!(
        "real Mimi shape, random weights: {mem:?} (plan: {} weight bytes), loaded in {load:.1} s; \
         {frames} frames encode + decode in {:.1} s on the emulator, output rms {rms:.3e}; \
         kernel launches per frame (GEMMs not counted): encode {}, decode {}",
        plan.mimi_weight_bytes,
        t1.elapsed().as_secs_f64(),
        launches.0,
        launches.1
    );
}
