//! The kernels of `cuda/` run on the emulator device through `Device::launch`,
//! checked against the CPU reference of `moshid-model` (`ops`, sampling) or
//! naive host computations: norms, RoPE with the ring KV cache and attention
//! (f32, bf16 and fp8 caches), sampling with its RNG draws, RVQ, streaming
//! convolutions with their state, the activations, GEMMs in every dtype
//! combination, graph capture and replay, and the errors the emulator must
//! report (bad pointers and arguments, capture misuse, a kernel that misuses
//! its warps).
//!
//! Argument orders follow the kernels' signatures in `cuda/*.cu`; block sizes
//! are the `#define`s there.

use moshid_kernels::device::emu::{EmuDevice, Order};
use moshid_kernels::device::{
    Arg, DType, DevPtr, Device, DeviceError, Gemm, HostBuf, KernelId, NULL,
};
use moshid_kernels::rng;
use moshid_model::ops;

const NORM_THREADS: u32 = 256;
const ROPE_THREADS: u32 = 128;
const ATT_THREADS: u32 = 128;
const EW_THREADS: u32 = 256;
const SAMPLE_THREADS: u32 = 512;
const CONV_THREADS: u32 = 128;
const RVQ_THREADS: u32 = 256;
const RVQ_DEC_THREADS: u32 = 128;

// ---------------------------------------------------------------- host twins and helpers

/// `struct SlotStep` of common.cuh.
#[derive(Debug, Clone, Copy)]
struct SlotStep {
    slot: i32,
    active: i32,
    row_cond: i32,
    row_null: i32,
}

/// `struct RowInfo` of common.cuh.
#[derive(Debug, Clone, Copy)]
struct RowInfo {
    kv: i32,
    pos: i32,
    last: i32,
    step: i32,
    active: i32,
}

/// `struct SlotParams` of common.cuh.
#[derive(Debug, Clone, Copy)]
struct SlotParams {
    temp_text: f32,
    temp_audio: f32,
    top_k_text: i32,
    top_k_audio: i32,
    use_sampling: i32,
    cfg_coef: f32,
}

/// Values with a fixed little-endian byte image (the device's layout).
trait Plain: Copy {
    const SIZE: usize;
    fn put(&self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! plain_num {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
        }
    )*};
}
plain_num!(u8, u16, u32, i32, u64, f32);

fn put_i32s(out: &mut Vec<u8>, v: &[i32]) {
    for x in v {
        x.put(out);
    }
}

impl Plain for SlotStep {
    const SIZE: usize = 16;
    fn put(&self, out: &mut Vec<u8>) {
        put_i32s(out, &[self.slot, self.active, self.row_cond, self.row_null]);
    }
    fn get(_: &[u8]) -> Self {
        unimplemented!("never read back")
    }
}

impl Plain for RowInfo {
    const SIZE: usize = 20;
    fn put(&self, out: &mut Vec<u8>) {
        put_i32s(out, &[self.kv, self.pos, self.last, self.step, self.active]);
    }
    fn get(_: &[u8]) -> Self {
        unimplemented!("never read back")
    }
}

impl Plain for SlotParams {
    const SIZE: usize = 24;
    fn put(&self, out: &mut Vec<u8>) {
        self.temp_text.put(out);
        self.temp_audio.put(out);
        put_i32s(out, &[self.top_k_text, self.top_k_audio, self.use_sampling]);
        self.cfg_coef.put(out);
    }
    fn get(_: &[u8]) -> Self {
        unimplemented!("never read back")
    }
}

fn bytes<T: Plain>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for x in v {
        x.put(&mut out);
    }
    out
}

/// A fresh allocation holding `v`.
fn up<T: Plain>(dev: &mut EmuDevice, v: &[T]) -> DevPtr {
    let p = dev.alloc((v.len() * T::SIZE).max(1)).unwrap();
    dev.upload(p, &bytes(v)).unwrap();
    p
}

/// A zeroed allocation of `n` elements of `T`.
fn zeros<T: Plain>(dev: &mut EmuDevice, n: usize) -> DevPtr {
    dev.alloc((n * T::SIZE).max(1)).unwrap()
}

fn write<T: Plain>(dev: &mut EmuDevice, p: DevPtr, v: &[T]) {
    dev.upload(p, &bytes(v)).unwrap();
}

fn down<T: Plain>(dev: &mut EmuDevice, p: DevPtr, n: usize) -> Vec<T> {
    let mut b = vec![0u8; n * T::SIZE];
    dev.download(p, &mut b).unwrap();
    b.chunks_exact(T::SIZE).map(T::get).collect()
}

fn det(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.7137).sin()).collect()
}

fn k(dev: &EmuDevice, name: &str) -> KernelId {
    dev.kernel(name).unwrap()
}

fn bf16(x: f32) -> u16 {
    // Round to nearest even (written differently from the emulator's).
    let b = x.to_bits();
    if x.is_nan() {
        return 0x7fff;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn from_bf16(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The e4m3 value of a byte (0x7f / 0xff: NaN).
fn e4m3_value(b: u8) -> f32 {
    let (s, e, m) = (b >> 7, (b >> 3) & 15, b & 7);
    if b & 0x7f == 0x7f {
        return f32::NAN;
    }
    let v = if e == 0 {
        m as f32 * 2f32.powi(-9)
    } else {
        (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
    };
    if s == 1 {
        -v
    } else {
        v
    }
}

/// CUDA's float → e4m3 (satfinite), by search: the nearest finite value,
/// ties to the even code, ±448 beyond (infinities too), NaN → 0x7f.
fn e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.abs() > 464.0 {
        return 0x7e | sign;
    }
    let a = x.abs() as f64;
    let mut best = 0u8;
    for c in 0u8..0x7f {
        let (d, db) = (
            (e4m3_value(c) as f64 - a).abs(),
            (e4m3_value(best) as f64 - a).abs(),
        );
        if d < db || (d == db && c % 2 == 0 && best % 2 == 1) {
            best = c;
        }
    }
    // Beyond 448 + half an ulp (464) the search would pick 448 too; the
    // rounding tie at 464 keeps 448 (even), so nothing special is needed.
    best | sign
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

fn rows_all(n: usize) -> Vec<RowInfo> {
    (0..n)
        .map(|r| RowInfo {
            kv: r as i32,
            pos: 0,
            last: 0,
            step: r as i32,
            active: 1,
        })
        .collect()
}

fn steps_all(n: usize) -> Vec<SlotStep> {
    (0..n as i32)
        .map(|s| SlotStep {
            slot: s,
            active: 1,
            row_cond: s,
            row_null: -1,
        })
        .collect()
}

// ---------------------------------------------------------------- norms

#[test]
fn rms_norm_matches_the_cpu_in_f32_and_bf16() {
    let mut dev = EmuDevice::new();
    let (n, dim) = (3, 4096);
    let x = det(n * dim, 1.0);
    let alpha = det(dim, 2.0);
    let mut want = vec![0.0; n * dim];
    ops::rms_norm(&x, &alpha, 1e-8, dim, &mut want);
    let (dx, da) = (up(&mut dev, &x), up(&mut dev, &alpha));
    let dy = zeros::<f32>(&mut dev, n * dim);
    let args = |rows: DevPtr, y: DevPtr| {
        [
            Arg::Ptr(dx),
            Arg::Ptr(da),
            Arg::F32(1e-8),
            Arg::I32(dim as i32),
            Arg::Ptr(rows),
            Arg::Ptr(y),
        ]
    };
    let f = k(&dev, "rms_norm_f32");
    dev.launch(f, (n as u32, 1, 1), NORM_THREADS, &args(NULL, dy))
        .unwrap();
    assert_close(
        &down::<f32>(&mut dev, dy, n * dim),
        &want,
        1e-5,
        "rms_norm_f32",
    );

    // bf16 output, the middle row masked (zeros).
    let mut rows = rows_all(n);
    rows[1].active = 0;
    let dr = up(&mut dev, &rows);
    let db = up(&mut dev, &vec![0x5555u16; n * dim]);
    let b = k(&dev, "rms_norm_bf16");
    dev.launch(b, (n as u32, 1, 1), NORM_THREADS, &args(dr, db))
        .unwrap();
    let got = down::<u16>(&mut dev, db, n * dim);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let w = if i / dim == 1 { 0 } else { bf16(w) };
        // One bf16 ulp: the f32 results may differ in their last bits.
        assert!(
            (g as i32 - w as i32).abs() <= 1,
            "rms_norm_bf16[{i}]: {g:#x} vs {w:#x}"
        );
    }
}

#[test]
fn layer_norm_matches_the_cpu() {
    let mut dev = EmuDevice::new();
    let (n, dim) = (4, 512);
    let x: Vec<f32> = det(n * dim, 3.0).iter().map(|v| v * 3.0 + 0.5).collect();
    let (w, b) = (det(dim, 4.0), det(dim, 5.0));
    let mut want = vec![0.0; n * dim];
    ops::layer_norm(&x, &w, &b, 1e-5, dim, &mut want);
    let mut rows = rows_all(n);
    rows[3].active = 0;
    want[3 * dim..].fill(0.0);
    let (dx, dw, dbias, dr) = (
        up(&mut dev, &x),
        up(&mut dev, &w),
        up(&mut dev, &b),
        up(&mut dev, &rows),
    );
    let dy = up(&mut dev, &vec![7.0f32; n * dim]);
    let f = k(&dev, "layer_norm_f32");
    let args = [
        Arg::Ptr(dx),
        Arg::Ptr(dw),
        Arg::Ptr(dbias),
        Arg::F32(1e-5),
        Arg::I32(dim as i32),
        Arg::Ptr(dr),
        Arg::Ptr(dy),
    ];
    dev.launch(f, (n as u32, 1, 1), NORM_THREADS, &args)
        .unwrap();
    assert_close(
        &down::<f32>(&mut dev, dy, n * dim),
        &want,
        1e-5,
        "layer_norm_f32",
    );
}

// ---------------------------------------------------------------- attention

/// The cache element types under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cache {
    F32,
    Bf16,
    Fp8(f32),
}

impl Cache {
    fn bytes(self) -> usize {
        match self {
            Cache::F32 => 4,
            Cache::Bf16 => 2,
            Cache::Fp8(_) => 1,
        }
    }

    /// What a cache stores and reads back for `x`.
    fn round(self, x: f32) -> f32 {
        match self {
            Cache::F32 => x,
            Cache::Bf16 => from_bf16(bf16(x)),
            Cache::Fp8(s) => e4m3_value(e4m3(x * (1.0 / s))) * s,
        }
    }
}

/// One layer's ring caches and a host record of every key and value written,
/// by cache row and position (after RoPE, as stored).
struct Ring {
    cache: Cache,
    dim: usize,
    heads: usize,
    cap: usize,
    context: usize,
    kc: DevPtr,
    vc: DevPtr,
    freqs: Option<(DevPtr, Vec<f32>)>,
    keys: Vec<Vec<Vec<f32>>>,
    vals: Vec<Vec<Vec<f32>>>,
}

impl Ring {
    fn new(
        dev: &mut EmuDevice,
        cache: Cache,
        dim: usize,
        heads: usize,
        cap: usize,
        rows: usize,
        rope: bool,
    ) -> Ring {
        let hd = dim / heads;
        let n = rows * cap * dim * cache.bytes();
        let freqs = rope.then(|| {
            let mut f = vec![0.0; hd / 2];
            ops::rope_freqs(hd, 10_000.0, &mut f);
            (up(dev, &f), f)
        });
        Ring {
            cache,
            dim,
            heads,
            cap,
            context: cap,
            kc: dev.alloc(n).unwrap(),
            vc: dev.alloc(n).unwrap(),
            freqs,
            keys: vec![Vec::new(); rows],
            vals: vec![Vec::new(); rows],
        }
    }

    /// rope_kv_write then attn_decode for `rows`; checks the rotated queries
    /// and the attention output against the host. `qkv` is [rows][3·dim].
    fn step(&mut self, dev: &mut EmuDevice, rows: &[RowInfo], qkv: &[f32], f32_out: bool) {
        let (dim, hd) = (self.dim, self.dim / self.heads);
        let n = rows.len();
        let dq = up(dev, qkv);
        let dr = up(dev, rows);
        let freqs = self.freqs.as_ref().map_or(NULL, |f| f.0);
        let (rope, attn) = match (self.cache, f32_out) {
            (Cache::F32, _) => ("rope_kv_write_f32", "attn_decode_f32"),
            (Cache::Bf16, true) => ("rope_kv_write_bf16", "attn_decode_bf16_f32out"),
            (Cache::Bf16, false) => ("rope_kv_write_bf16", "attn_decode_bf16"),
            (Cache::Fp8(_), _) => ("rope_kv_write_fp8", "attn_decode_fp8"),
        };
        let mut args = vec![
            Arg::Ptr(dq),
            Arg::Ptr(freqs),
            Arg::Ptr(dr),
            Arg::Ptr(self.kc),
            Arg::Ptr(self.vc),
            Arg::I32(dim as i32),
            Arg::I32(hd as i32),
            Arg::I32(self.cap as i32),
        ];
        if let Cache::Fp8(s) = self.cache {
            args.push(Arg::F32(s));
        }
        dev.launch(k(dev, rope), (n as u32, 1, 1), ROPE_THREADS, &args)
            .unwrap();
        let out_bytes = if f32_out { 4 } else { 2 };
        let out = dev.alloc(n * dim * out_bytes).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut args = vec![
            Arg::Ptr(dq),
            Arg::Ptr(self.kc),
            Arg::Ptr(self.vc),
            Arg::Ptr(dr),
            Arg::I32(dim as i32),
            Arg::I32(hd as i32),
            Arg::I32(self.cap as i32),
            Arg::I32(self.context as i32),
            Arg::F32(scale),
        ];
        if let Cache::Fp8(s) = self.cache {
            args.push(Arg::F32(s));
        }
        args.push(Arg::Ptr(out));
        dev.launch(
            k(dev, attn),
            (self.heads as u32, n as u32, 1),
            ATT_THREADS,
            &args,
        )
        .unwrap();
        let got: Vec<f32> = if f32_out {
            down::<f32>(dev, out, n * dim)
        } else {
            down::<u16>(dev, out, n * dim)
                .into_iter()
                .map(from_bf16)
                .collect()
        };
        let got_qkv = down::<f32>(dev, dq, n * 3 * dim);

        // Host: RoPE on q and k, record the stored keys and values; the
        // kernel rotates q in place (k only on its way into the cache).
        let mut host = qkv.to_vec();
        let mut want_qkv = qkv.to_vec();
        for (r, ri) in rows.iter().enumerate() {
            if ri.active == 0 {
                continue;
            }
            let row = &mut host[r * 3 * dim..(r + 1) * 3 * dim];
            if let Some((_, f)) = &self.freqs {
                for h in 0..self.heads {
                    ops::rope_interleaved(&mut row[h * hd..(h + 1) * hd], f, ri.pos as f32);
                    ops::rope_interleaved(
                        &mut row[dim + h * hd..dim + (h + 1) * hd],
                        f,
                        ri.pos as f32,
                    );
                }
            }
            let kv = ri.kv as usize;
            let p = ri.pos as usize;
            let c = self.cache;
            let store = |v: &[f32]| v.iter().map(|&x| c.round(x)).collect::<Vec<f32>>();
            if self.keys[kv].len() <= p {
                self.keys[kv].resize(p + 1, Vec::new());
                self.vals[kv].resize(p + 1, Vec::new());
            }
            self.keys[kv][p] = store(&row[dim..2 * dim]);
            self.vals[kv][p] = store(&row[2 * dim..]);
            want_qkv[r * 3 * dim..r * 3 * dim + dim].copy_from_slice(&row[..dim]);
        }
        assert_close(&got_qkv, &want_qkv, 1e-6, "rotated q");
        for (r, ri) in rows.iter().enumerate() {
            let o = &got[r * dim..(r + 1) * dim];
            if ri.active == 0 {
                assert!(o.iter().all(|&v| v == 0.0), "masked row {r} is not zero");
                continue;
            }
            let (kv, pos, last) = (ri.kv as usize, ri.pos as i64, ri.last as i64);
            let start = (pos + 1 - self.context as i64)
                .max(last + 1 - self.cap as i64)
                .max(0) as usize;
            let q = &host[r * 3 * dim..r * 3 * dim + dim];
            for h in 0..self.heads {
                let qh = &q[h * hd..(h + 1) * hd];
                let mut sc: Vec<f32> = (start..=pos as usize)
                    .map(|j| {
                        qh.iter()
                            .zip(&self.keys[kv][j][h * hd..])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                ops::softmax_inplace(&mut sc);
                for e in 0..hd {
                    let want: f32 = (start..=pos as usize)
                        .zip(&sc)
                        .map(|(j, w)| w * self.vals[kv][j][h * hd + e])
                        .sum();
                    let g = o[h * hd + e];
                    let tol = if f32_out {
                        1e-4
                    } else {
                        1e-2 * want.abs().max(0.05)
                    };
                    assert!(
                        (g - want).abs() < tol,
                        "{:?} row {r} pos {pos} head {h} elem {e}: {g} vs {want}",
                        self.cache
                    );
                }
            }
        }
    }
}

#[test]
fn attention_over_a_wrapped_ring_matches_naive() {
    // One row, f32 cache, 9 steps over a ring of 5.
    for cache in [Cache::F32, Cache::Bf16] {
        let mut dev = EmuDevice::new();
        let (dim, heads, cap, steps) = (128, 2, 5, 9);
        let mut ring = Ring::new(&mut dev, cache, dim, heads, cap, 1, true);
        for p in 0..steps {
            let row = RowInfo {
                kv: 0,
                pos: p,
                last: p,
                step: 0,
                active: 1,
            };
            ring.step(&mut dev, &[row], &det(3 * dim, p as f32 * 3.0), true);
        }
    }
}

#[test]
fn attention_rows_slots_masks_and_bf16_output() {
    // Three cache rows (slots) at different positions, one masked row, a
    // head width of 256 (the maximum), the LM's bf16 output.
    let (dim, heads, cap) = (512, 2, 7);
    let mut dev = EmuDevice::new();
    let mut ring = Ring::new(&mut dev, Cache::Bf16, dim, heads, cap, 3, true);
    // Slot s uses cache row 2 − s; slot 1 is masked every third step and
    // slot 2 starts at step 2: a masked step does not advance its position.
    let mut pos = [0i32; 3];
    for t in 0..12 {
        let rows: Vec<RowInfo> = (0..3)
            .map(|s| {
                let masked = (s == 1 && t % 3 == 0) || (s == 2 && t < 2);
                RowInfo {
                    kv: 2 - s as i32,
                    pos: pos[s],
                    last: pos[s],
                    step: s as i32,
                    active: !masked as i32,
                }
            })
            .collect();
        for (s, r) in rows.iter().enumerate() {
            pos[s] += r.active;
        }
        ring.step(
            &mut dev,
            &rows,
            &det(3 * 3 * dim, t as f32 * 5.0 + 1.0),
            false,
        );
    }
}

#[test]
fn attention_with_several_steps_per_call_and_no_rope() {
    // Mimi's calls: t = 3 rows of one slot per call (last = the call's newest
    // position), a ring of 4 and context 4, so early queries of a call see
    // fewer keys once the ring wrapped.
    let (dim, heads, cap) = (64, 4, 4);
    let mut dev = EmuDevice::new();
    let mut ring = Ring::new(&mut dev, Cache::F32, dim, heads, cap, 1, false);
    for call in 0..4 {
        let rows: Vec<RowInfo> = (0..3)
            .map(|i| RowInfo {
                kv: 0,
                pos: 3 * call + i,
                last: 3 * call + 2,
                step: 0,
                active: 1,
            })
            .collect();
        ring.step(&mut dev, &rows, &det(3 * 3 * dim, call as f32 + 0.5), true);
    }
}

#[test]
fn attention_with_an_fp8_cache() {
    let (dim, heads, cap) = (128, 1, 6);
    let mut dev = EmuDevice::new();
    let mut ring = Ring::new(&mut dev, Cache::Fp8(0.125), dim, heads, cap, 1, true);
    for p in 0..8 {
        let row = RowInfo {
            kv: 0,
            pos: p,
            last: p,
            step: 0,
            active: 1,
        };
        ring.step(&mut dev, &[row], &det(3 * dim, p as f32 * 7.0), false);
    }
}

#[test]
fn a_query_with_an_empty_window_gets_zeros_not_nan() {
    // `last` a whole ring ahead of `pos`: no key of the window survives (a
    // call writing more positions than the ring holds, which hosts refuse).
    let (dim, heads, cap) = (64, 2, 3);
    let mut dev = EmuDevice::new();
    let qkv = up(&mut dev, &det(3 * dim, 1.0));
    let kc = up(&mut dev, &det(cap * dim, 2.0));
    let vc = up(&mut dev, &det(cap * dim, 3.0));
    let row = RowInfo {
        kv: 0,
        pos: 1,
        last: 1 + cap as i32,
        step: 0,
        active: 1,
    };
    let rows = up(&mut dev, &[row]);
    let out = up(&mut dev, &vec![f32::NAN; dim]);
    let hd = dim / heads;
    let args = [
        Arg::Ptr(qkv),
        Arg::Ptr(kc),
        Arg::Ptr(vc),
        Arg::Ptr(rows),
        Arg::I32(dim as i32),
        Arg::I32(hd as i32),
        Arg::I32(cap as i32),
        Arg::I32(cap as i32),
        Arg::F32(1.0 / (hd as f32).sqrt()),
        Arg::Ptr(out),
    ];
    dev.launch(
        k(&dev, "attn_decode_f32"),
        (heads as u32, 1, 1),
        ATT_THREADS,
        &args,
    )
    .unwrap();
    assert_eq!(down::<f32>(&mut dev, out, dim), vec![0.0; dim]);
}

#[test]
fn bf16_and_fp8_conversions_are_cuda_s() {
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        448.0,
        -448.0,
        449.0,
        463.9,
        464.0,
        464.1,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        2f32.powi(-6),
        2f32.powi(-7) * 1.5,
        2f32.powi(-9),
        2f32.powi(-10),
        2f32.powi(-10) * 1.0001,
        2f32.powi(-9) * 2.5,
        2f32.powi(-9) * 3.5,
        1.0625,
        1.1875,
        -3.3,
        0.3,
    ];
    let mut vals: Vec<f32> = specials.to_vec();
    vals.extend(det(998, 0.25).iter().map(|v| v * 600.0));
    vals.extend((0..1000).map(|i| f32::from_bits(0x3a00_0000 + i * 0x9_1f3d)));
    let n = vals.len();
    let mut dev = EmuDevice::new();
    // bf16 through f32_to_bf16.
    let dx = up(&mut dev, &vals);
    let dy = zeros::<u16>(&mut dev, n);
    dev.launch(
        k(&dev, "f32_to_bf16"),
        (n.div_ceil(256) as u32, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(dx), Arg::Ptr(dy), Arg::U64(n as u64)],
    )
    .unwrap();
    let got = down::<u16>(&mut dev, dy, n);
    for (v, g) in vals.iter().zip(&got) {
        assert_eq!(*g, bf16(*v), "bf16({v})");
    }
    // fp8 through rope_kv_write_fp8 (no RoPE, scale 1): k goes to k_cache.
    let dim = vals.len().div_ceil(2) * 2;
    let mut qkv = vec![0.0f32; 3 * dim];
    qkv[dim..dim + n].copy_from_slice(&vals);
    let dq = up(&mut dev, &qkv);
    let dr = up(&mut dev, &rows_all(1));
    let (kc, vc) = (zeros::<u8>(&mut dev, dim), zeros::<u8>(&mut dev, dim));
    dev.launch(
        k(&dev, "rope_kv_write_fp8"),
        (1, 1, 1),
        ROPE_THREADS,
        &[
            Arg::Ptr(dq),
            Arg::Ptr(NULL),
            Arg::Ptr(dr),
            Arg::Ptr(kc),
            Arg::Ptr(vc),
            Arg::I32(dim as i32),
            Arg::I32(dim as i32),
            Arg::I32(1),
            Arg::F32(1.0),
        ],
    )
    .unwrap();
    let got = down::<u8>(&mut dev, kc, dim);
    for (v, g) in vals.iter().zip(&got) {
        assert_eq!(*g, e4m3(*v), "e4m3({v:e}) = {g:#04x}");
    }
}

// ---------------------------------------------------------------- sampling

/// The kernel's semantics on the host: top-k by (logit desc, index asc),
/// walked in index order, one draw.
fn sample_ref(logits: &[f32], temp: f32, top_k: usize, u: f64) -> u32 {
    let n = logits.len();
    let k = if top_k == 0 || top_k >= n { n } else { top_k };
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut inset = vec![false; n];
    for &i in &idx[..k] {
        inset[i] = true;
    }
    let max = logits[idx[0]] as f64;
    let w: Vec<f64> = (0..n)
        .map(|i| {
            if inset[i] {
                ((logits[i] as f64 - max) / temp as f64).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = w.iter().sum();
    let u = u * total;
    let mut acc = 0.0;
    for (i, wi) in w.iter().enumerate() {
        if inset[i] {
            acc += wi;
            if u < acc {
                return i as u32;
            }
        }
    }
    unreachable!("u beyond the total")
}

struct Sampling {
    logits: DevPtr,
    steps: DevPtr,
    params: DevPtr,
    rng: DevPtr,
    out: DevPtr,
}

fn sample(dev: &mut EmuDevice, s: &Sampling, vocab: usize, n: usize, audio: bool) -> Vec<u32> {
    dev.launch(
        k(dev, "sample_tokens"),
        (n as u32, 1, 1),
        SAMPLE_THREADS,
        &[
            Arg::Ptr(s.logits),
            Arg::I32(vocab as i32),
            Arg::I32(vocab as i32),
            Arg::Ptr(s.steps),
            Arg::Ptr(s.params),
            Arg::I32(audio as i32),
            Arg::Ptr(s.rng),
            Arg::Ptr(s.out),
            Arg::I32(1),
        ],
    )
    .unwrap();
    down::<u32>(dev, s.out, n)
}

#[test]
fn sampling_greedy_top1_and_rng_draws() {
    // Greedy, top-1 and the RNG's draw count.
    let mut dev = EmuDevice::new();
    let vocab = 48_000;
    let mut logits = det(2 * vocab, 5.0);
    logits[1234] = 9.0;
    logits[vocab + 77] = 9.0;
    logits[vocab + 4000] = 9.0; // a tie: the first index wins
    let greedy = SlotParams {
        temp_text: 0.7,
        temp_audio: 0.8,
        top_k_text: 25,
        top_k_audio: 250,
        use_sampling: 0,
        cfg_coef: 1.0,
    };
    let top1 = SlotParams {
        use_sampling: 1,
        top_k_text: 1,
        ..greedy
    };
    let seeds = [rng::seed_state(7), rng::seed_state(8)];
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps_all(2)),
        params: up(&mut dev, &[greedy, greedy]),
        rng: up(&mut dev, &seeds.concat()),
        out: zeros::<u32>(&mut dev, 2),
    };
    for (params, draws) in [([greedy, greedy], 0), ([top1, top1], 1)] {
        write(&mut dev, s.params, &params);
        assert_eq!(sample(&mut dev, &s, vocab, 2, false), vec![1234, 77]);
        // Greedy leaves the generator alone; a sampled token draws once.
        let mut want = seeds;
        if draws == 1 {
            for st in &mut want {
                rng::next_u64(st);
            }
        }
        assert_eq!(down::<u64>(&mut dev, s.rng, 8), want.concat());
        write(&mut dev, s.rng, &seeds.concat());
    }
}

#[test]
fn sampling_draws_as_the_cpu_and_the_kernel_s_rules() {
    let mut dev = EmuDevice::new();
    let vocab = 2048 + 17;
    let n = 4;
    let logits: Vec<f32> = det(n * vocab, 11.0).iter().map(|v| v * 4.0).collect();
    let seeds: Vec<[u64; 4]> = (0..n as u64).map(|i| rng::seed_state(100 + i)).collect();
    // Step 3 is masked: its output must stay untouched.
    let mut steps = steps_all(n);
    steps[3].active = 0;
    let params = SlotParams {
        temp_text: 0.8,
        temp_audio: 1.3,
        top_k_text: 0,
        top_k_audio: 50,
        use_sampling: 1,
        cfg_coef: 1.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps),
        params: up(&mut dev, &vec![params; n]),
        rng: up(&mut dev, &seeds.concat()),
        out: up(&mut dev, &vec![u32::MAX; n]),
    };
    let mut host = seeds.clone();
    let mut cpu_rngs: Vec<_> = (0..n as u64)
        .map(|i| moshid_model::lm::slot_rng(100 + i))
        .collect();
    for round in 0..5 {
        let audio = round % 2 == 1;
        let got = sample(&mut dev, &s, vocab, n, audio);
        for j in 0..3 {
            let l = &logits[j * vocab..(j + 1) * vocab];
            let x = rng::next_u64(&mut host[j]);
            let u = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let (temp, top_k) = if audio { (1.3, 50) } else { (0.8, 0) };
            assert_eq!(
                got[j],
                sample_ref(l, temp, top_k, u),
                "round {round} step {j}"
            );
            // All candidates in index order: the CPU sampler draws the same token.
            let mut sc = vec![(0.0, 0); vocab];
            let cpu = moshid_model::lm::sample_top_k(l, temp, top_k, &mut cpu_rngs[j], &mut sc);
            if top_k == 0 {
                assert_eq!(got[j], cpu, "round {round} step {j}: the CPU sampler");
            }
        }
        assert_eq!(got[3], u32::MAX, "a masked step writes nothing");
        let mut want = host.clone();
        want[3] = seeds[3];
        assert_eq!(
            down::<u64>(&mut dev, s.rng, 4 * n),
            want.concat(),
            "round {round}"
        );
    }
}

#[test]
fn sampling_with_guidance_mixes_the_rows() {
    let mut dev = EmuDevice::new();
    let vocab = 1000;
    let mut logits = det(2 * vocab, 2.0);
    // cond favours 10, null 20; coef 3: null + (cond − null)·3 favours 10 more.
    logits[10] = 5.0;
    logits[vocab + 20] = 6.0;
    logits[20] = 5.5;
    let steps = [SlotStep {
        slot: 0,
        active: 1,
        row_cond: 0,
        row_null: 1,
    }];
    let p = SlotParams {
        temp_text: 0.0,
        temp_audio: 0.0,
        top_k_text: 0,
        top_k_audio: 0,
        use_sampling: 1,
        cfg_coef: 3.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps),
        params: up(&mut dev, &[p]),
        rng: up(&mut dev, &rng::seed_state(1)),
        out: zeros::<u32>(&mut dev, 1),
    };
    let mixed: Vec<f32> = (0..vocab)
        .map(|i| logits[vocab + i] + (logits[i] - logits[vocab + i]) * 3.0)
        .collect();
    assert_eq!(
        sample(&mut dev, &s, vocab, 1, false)[0],
        ops::argmax(&mixed) as u32
    );
    // Sampled with guidance, top 5.
    let p = SlotParams {
        temp_text: 0.9,
        top_k_text: 5,
        ..p
    };
    write(&mut dev, s.params, &[p]);
    let mut st = rng::seed_state(1);
    let x = rng::next_u64(&mut st);
    let u = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    assert_eq!(
        sample(&mut dev, &s, vocab, 1, false)[0],
        sample_ref(&mixed, 0.9, 5, u)
    );
}

// ---------------------------------------------------------------- RVQ

fn transpose_books(book: &[f32], books: usize, bins: usize, dq: usize) -> (Vec<f32>, Vec<f32>) {
    let mut books_t = vec![0.0; books * dq * bins];
    let mut norms = vec![0.0; books * bins];
    for c in 0..books {
        for b in 0..bins {
            let e = &book[(c * bins + b) * dq..(c * bins + b + 1) * dq];
            norms[c * bins + b] = e.iter().map(|v| v * v).sum();
            for d in 0..dq {
                books_t[(c * dq + d) * bins + b] = e[d];
            }
        }
    }
    (books_t, norms)
}

#[test]
fn rvq_encode_finds_nearest_and_decode_sums() {
    // Both distance paths: the expanded form and the exact-distance path (≤ 25
    // entries), a masked step and a code out of range.
    for (n, dq, bins, books) in [(4, 256, 2048, 3), (3, 32, 20, 2)] {
        let mut dev = EmuDevice::new();
        let book = det(books * bins * dq, 9.0);
        let (books_t, norms) = transpose_books(&book, books, bins, dq);
        let x = det(n * dq, 3.0);
        let mut steps = steps_all(n);
        steps[n - 1].active = 0;
        let dx = up(&mut dev, &x);
        let dbt = up(&mut dev, &books_t);
        let dn = up(&mut dev, &norms);
        let ds = up(&mut dev, &steps);
        let stride = books + 1;
        let codes = up(&mut dev, &vec![7777u32; n * stride]);
        dev.launch(
            k(&dev, "rvq_encode"),
            (n as u32, 1, 1),
            RVQ_THREADS,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(dbt),
                Arg::Ptr(dn),
                Arg::Ptr(ds),
                Arg::I32(books as i32),
                Arg::I32(dq as i32),
                Arg::I32(bins as i32),
                Arg::I32((bins > 25) as i32),
                Arg::Ptr(codes),
                Arg::I32(stride as i32),
                Arg::I32(1),
            ],
        )
        .unwrap();
        let mut got = down::<u32>(&mut dev, codes, n * stride);
        for r in 0..n {
            assert_eq!(got[r * stride], 7777, "column 0 is not the quantizer's");
            if r == n - 1 {
                assert!(got[r * stride..(r + 1) * stride].iter().all(|&c| c == 7777));
                continue;
            }
            let mut res = x[r * dq..(r + 1) * dq].to_vec();
            for c in 0..books {
                let dist = |b: usize| -> f32 {
                    (0..dq)
                        .map(|d| (res[d] - book[(c * bins + b) * dq + d]).powi(2))
                        .sum()
                };
                let best = (0..bins)
                    .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                    .unwrap();
                assert_eq!(
                    got[r * stride + 1 + c] as usize,
                    best,
                    "row {r} codebook {c}"
                );
                for d in 0..dq {
                    res[d] -= book[(c * bins + best) * dq + d];
                }
            }
        }
        // Decode; step 0's last code is made out of range (fault[0] set, no contribution).
        got[books] = bins as u32;
        for r in 0..n {
            got[r * stride] = 0;
        }
        write(&mut dev, codes, &got);
        let q = zeros::<f32>(&mut dev, n * dq);
        let fault = zeros::<i32>(&mut dev, n);
        dev.launch(
            k(&dev, "rvq_decode"),
            (dq.div_ceil(RVQ_DEC_THREADS as usize) as u32, n as u32, 1),
            RVQ_DEC_THREADS,
            &[
                Arg::Ptr(codes),
                Arg::I32(stride as i32),
                Arg::I32(1),
                Arg::Ptr(dbt),
                Arg::Ptr(ds),
                Arg::I32(books as i32),
                Arg::I32(dq as i32),
                Arg::I32(bins as i32),
                Arg::Ptr(q),
                Arg::Ptr(fault),
            ],
        )
        .unwrap();
        let q = down::<f32>(&mut dev, q, n * dq);
        for r in 0..n - 1 {
            for d in 0..dq {
                let want: f32 = (0..books)
                    .filter(|&c| got[r * stride + 1 + c] < bins as u32)
                    .map(|c| book[(c * bins + got[r * stride + 1 + c] as usize) * dq + d])
                    .sum();
                assert!(
                    (q[r * dq + d] - want).abs() < 1e-5,
                    "decode row {r} dim {d}"
                );
            }
        }
        assert!(q[(n - 1) * dq..].iter().all(|&v| v == 0.0));
        let mut want_fault = vec![0; n];
        want_fault[0] = 1;
        assert_eq!(down::<i32>(&mut dev, fault, n), want_fault);
    }
}

// ---------------------------------------------------------------- streaming convolutions

/// Device-layout conv weights `[kernel][c_in][c_out]`.
fn conv_w(kernel: usize, c_in: usize, c_out: usize, seed: f32) -> Vec<f32> {
    det(kernel * c_in * c_out, seed)
        .iter()
        .map(|v| v * 0.3)
        .collect()
}

#[test]
fn conv1d_stream_and_state_match_a_naive_streaming_conv() {
    // Two slots over five calls; slot 1 skips call 2 (masked step, state
    // untouched); slot 0 uses replicate padding (first input step fills the
    // history). c_out = 200 spans two blocks of 128 threads.
    let (c_in, c_out, kernel, stride, dilation, t_in) = (5, 200, 4, 2, 2, 4);
    let history = (kernel - 1) * dilation + 1 - stride;
    let t_out = t_in / stride;
    let mut dev = EmuDevice::new();
    let w = conv_w(kernel, c_in, c_out, 1.0);
    let bias = det(c_out, 2.0);
    let (dw, db) = (up(&mut dev, &w), up(&mut dev, &bias));
    let max_slots = 3;
    // Slot indices 2 and 0 (state rows are per slot, not per step).
    let slot_of = [2usize, 0];
    let prev = zeros::<f32>(&mut dev, max_slots * history * c_in);
    let first = up(&mut dev, &[0i32, 0, 1]);
    let mut streams: Vec<Vec<f32>> = vec![Vec::new(); 2];
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); 2];
    for call in 0..5 {
        let steps: Vec<SlotStep> = (0..2)
            .map(|j| SlotStep {
                slot: slot_of[j] as i32,
                active: (j == 0 || call != 2) as i32,
                row_cond: j as i32,
                row_null: -1,
            })
            .collect();
        let x = det(2 * t_in * c_in, call as f32 * 13.0 + 0.5);
        let (dx, ds) = (up(&mut dev, &x), up(&mut dev, &steps));
        let y = up(&mut dev, &vec![9.0f32; 2 * t_out * c_out]);
        let grid3 = (2u32, 1u32, 1u32);
        dev.launch(
            k(&dev, "conv1d_replicate_pad"),
            grid3,
            CONV_THREADS,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(prev),
                Arg::Ptr(first),
                Arg::Ptr(ds),
                Arg::I32(c_in as i32),
                Arg::I32(t_in as i32),
                Arg::I32(history as i32),
            ],
        )
        .unwrap();
        dev.launch(
            k(&dev, "conv1d_stream"),
            (c_out.div_ceil(128) as u32, t_out as u32, 2),
            CONV_THREADS,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(prev),
                Arg::Ptr(dw),
                Arg::Ptr(db),
                Arg::Ptr(ds),
                Arg::I32(c_in as i32),
                Arg::I32(c_out as i32),
                Arg::I32(kernel as i32),
                Arg::I32(stride as i32),
                Arg::I32(dilation as i32),
                Arg::I32(t_in as i32),
                Arg::I32(history as i32),
                Arg::Ptr(y),
            ],
        )
        .unwrap();
        dev.launch(
            k(&dev, "conv1d_state_update"),
            grid3,
            CONV_THREADS,
            &[
                Arg::Ptr(dx),
                Arg::Ptr(prev),
                Arg::Ptr(first),
                Arg::Ptr(ds),
                Arg::I32(c_in as i32),
                Arg::I32(t_in as i32),
                Arg::I32(history as i32),
            ],
        )
        .unwrap();
        let got = down::<f32>(&mut dev, y, 2 * t_out * c_out);
        for j in 0..2 {
            let yj = &got[j * t_out * c_out..(j + 1) * t_out * c_out];
            if steps[j].active == 0 {
                assert!(
                    yj.iter().all(|&v| v == 0.0),
                    "a masked step's outputs are zero"
                );
                continue;
            }
            let xj = &x[j * t_in * c_in..(j + 1) * t_in * c_in];
            if streams[j].is_empty() {
                // History: replicate padding for slot 2 (step 0), zeros for slot 0.
                let pad: Vec<f32> = if slot_of[j] == 2 {
                    xj[..c_in].to_vec()
                } else {
                    vec![0.0; c_in]
                };
                for _ in 0..history {
                    streams[j].extend_from_slice(&pad);
                }
            }
            streams[j].extend_from_slice(xj);
            outs[j].extend_from_slice(yj);
        }
    }
    assert_eq!(
        down::<i32>(&mut dev, first, 3),
        vec![0, 0, 0],
        "first flags cleared"
    );
    // The naive conv over each slot's whole stream.
    for j in 0..2 {
        let s = &streams[j];
        let steps_in = s.len() / c_in - history;
        for t in 0..steps_in / stride {
            for o in 0..c_out {
                let mut acc = 0.0f32;
                for kk in 0..kernel {
                    let v = t * stride + kk * dilation;
                    for i in 0..c_in {
                        acc += s[v * c_in + i] * w[(kk * c_in + i) * c_out + o];
                    }
                }
                let want = acc + bias[o];
                let g = outs[j][t * c_out + o];
                assert!(
                    (g - want).abs() < 1e-5,
                    "slot step {j} output {t} channel {o}: {g} vs {want}"
                );
            }
        }
        // The state is the last `history` input steps.
        let p = down::<f32>(&mut dev, prev, max_slots * history * c_in);
        let slot = slot_of[j];
        assert_eq!(
            &p[slot * history * c_in..(slot + 1) * history * c_in],
            &s[s.len() - history * c_in..],
            "state of slot {slot}"
        );
    }
}

#[test]
fn convtr1d_dense_and_depthwise_match_a_naive_transposed_conv() {
    for depthwise in [false, true] {
        let (c, kernel, stride, t_in) = (130, 6, 2, 3);
        let (c_in, c_out) = if depthwise { (c, c) } else { (7, c) };
        let overlap = kernel - stride;
        let t_out = t_in * stride;
        let mut dev = EmuDevice::new();
        let w = if depthwise {
            det(c * kernel, 3.0)
        } else {
            conv_w(kernel, c_in, c_out, 3.0)
        };
        let bias = det(c_out, 4.0);
        let (dw, db) = (up(&mut dev, &w), up(&mut dev, &bias));
        let partial = zeros::<f32>(&mut dev, 2 * overlap * c_out);
        let steps = [SlotStep {
            slot: 1,
            active: 1,
            row_cond: 0,
            row_null: -1,
        }];
        let ds = up(&mut dev, &steps);
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for call in 0..4 {
            let x = det(t_in * c_in, call as f32 * 2.0 + 0.1);
            let dx = up(&mut dev, &x);
            let y = zeros::<f32>(&mut dev, t_out * c_out);
            let tail = zeros::<f32>(&mut dev, overlap * c_out);
            let mut args = vec![
                Arg::Ptr(dx),
                Arg::Ptr(partial),
                Arg::Ptr(dw),
                Arg::Ptr(db),
                Arg::Ptr(ds),
            ];
            if depthwise {
                args.push(Arg::I32(c as i32));
            } else {
                args.extend([Arg::I32(c_in as i32), Arg::I32(c_out as i32)]);
            }
            args.extend([
                Arg::I32(kernel as i32),
                Arg::I32(stride as i32),
                Arg::I32(t_in as i32),
                Arg::Ptr(y),
                Arg::Ptr(tail),
            ]);
            let name = if depthwise {
                "convtr1d_dw_stream"
            } else {
                "convtr1d_stream"
            };
            dev.launch(
                k(&dev, name),
                (c_out.div_ceil(128) as u32, (t_out + overlap) as u32, 1),
                CONV_THREADS,
                &args,
            )
            .unwrap();
            dev.launch(
                k(&dev, "convtr1d_state_update"),
                (1, 1, 1),
                CONV_THREADS,
                &[
                    Arg::Ptr(tail),
                    Arg::Ptr(partial),
                    Arg::Ptr(ds),
                    Arg::I32((overlap * c_out) as i32),
                ],
            )
            .unwrap();
            xs.extend_from_slice(&x);
            ys.extend(down::<f32>(&mut dev, y, t_out * c_out));
        }
        // Slot 0's state was never touched.
        assert!(down::<f32>(&mut dev, partial, overlap * c_out)
            .iter()
            .all(|&v| v == 0.0));
        let total_in = xs.len() / c_in;
        for r in 0..total_in * stride {
            for o in 0..c_out {
                let mut acc = 0.0f32;
                for t in 0..total_in {
                    let kk = r as i64 - (t * stride) as i64;
                    if kk < 0 || kk >= kernel as i64 {
                        continue;
                    }
                    let kk = kk as usize;
                    if depthwise {
                        acc += xs[t * c + o] * w[o * kernel + kk];
                    } else {
                        for i in 0..c_in {
                            acc += xs[t * c_in + i] * w[(kk * c_in + i) * c_out + o];
                        }
                    }
                }
                let want = acc + bias[o];
                let g = ys[r * c_out + o];
                assert!(
                    (g - want).abs() < 1e-5,
                    "depthwise {depthwise} step {r} channel {o}: {g} vs {want}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- element-wise

#[test]
fn activations_match_the_cpu() {
    let mut dev = EmuDevice::new();
    let (rows, hidden) = (3, 1000);
    let ff: Vec<f32> = det(rows * 2 * hidden, 1.5)
        .iter()
        .map(|v| v * 6.0)
        .collect();
    let dff = up(&mut dev, &ff);
    let act = zeros::<u16>(&mut dev, rows * hidden);
    // A small grid: the grid-stride loop covers the rest.
    dev.launch(
        k(&dev, "silu_gate_bf16"),
        (3, 1, 1),
        EW_THREADS,
        &[
            Arg::Ptr(dff),
            Arg::I32(hidden as i32),
            Arg::I32(rows as i32),
            Arg::Ptr(act),
        ],
    )
    .unwrap();
    let got = down::<u16>(&mut dev, act, rows * hidden);
    for r in 0..rows {
        for j in 0..hidden {
            let (g, v) = (ff[r * 2 * hidden + j], ff[r * 2 * hidden + hidden + j]);
            let want = bf16(ops::silu(g) * v);
            let e = got[r * hidden + j];
            assert!(
                (e as i32 - want as i32).abs() <= 1,
                "silu gate [{r}][{j}]: {e:#x} vs {want:#x}"
            );
        }
    }
    let n = 5000;
    let x: Vec<f32> = det(n, 0.5).iter().map(|v| v * 5.0).collect();
    let dx = up(&mut dev, &x);
    dev.launch(
        k(&dev, "gelu_f32"),
        (n.div_ceil(256) as u32, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(dx), Arg::U64(n as u64)],
    )
    .unwrap();
    let want: Vec<f32> = x.iter().map(|&v| ops::gelu(v)).collect();
    assert_close(&down::<f32>(&mut dev, dx, n), &want, 1e-6, "gelu");
    // elu in place (y == x is allowed).
    write(&mut dev, dx, &x);
    dev.launch(
        k(&dev, "elu_f32"),
        (7, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(dx), Arg::Ptr(dx), Arg::U64(n as u64)],
    )
    .unwrap();
    let want: Vec<f32> = x.iter().map(|&v| ops::elu(v)).collect();
    assert_close(&down::<f32>(&mut dev, dx, n), &want, 1e-6, "elu");
}

// ---------------------------------------------------------------- GEMM

fn put_matrix(dev: &mut EmuDevice, v: &[f32], t: DType) -> (DevPtr, Vec<f32>) {
    match t {
        DType::F32 => (up(dev, v), v.to_vec()),
        DType::Bf16 => {
            let b: Vec<u16> = v.iter().map(|&x| bf16(x)).collect();
            let seen = b.iter().map(|&x| from_bf16(x)).collect();
            (up(dev, &b), seen)
        }
    }
}

#[test]
fn gemm_in_every_dtype_combination() {
    let (m, n, kk) = (5, 70, 37);
    let (lda, ldb, ldc) = (kk + 3, kk + 1, n + 2);
    let types = [DType::F32, DType::Bf16];
    for at in types {
        for bt in types {
            for ct in types {
                let mut dev = EmuDevice::new();
                let (da, a) = put_matrix(&mut dev, &det(m * lda, 1.0), at);
                let (db, b) = put_matrix(&mut dev, &det(n * ldb, 2.0), bt);
                let c0 = det(m * ldc, 3.0);
                let (dc, c_seen) = put_matrix(&mut dev, &c0, ct);
                let (alpha, beta) = (0.75, 0.5);
                let g = Gemm {
                    m,
                    n,
                    k: kk,
                    a: da,
                    a_type: at,
                    lda,
                    b: db,
                    b_type: bt,
                    ldb,
                    c: dc,
                    c_type: ct,
                    ldc,
                    alpha,
                    beta,
                };
                dev.gemm(&g).unwrap();
                let got: Vec<f32> = match ct {
                    DType::F32 => down::<f32>(&mut dev, dc, m * ldc),
                    DType::Bf16 => down::<u16>(&mut dev, dc, m * ldc)
                        .into_iter()
                        .map(from_bf16)
                        .collect(),
                };
                for i in 0..m {
                    for j in 0..ldc {
                        let idx = i * ldc + j;
                        if j >= n {
                            assert_eq!(got[idx], c_seen[idx], "padding of C is left alone");
                            continue;
                        }
                        let dot: f64 = (0..kk)
                            .map(|p| a[i * lda + p] as f64 * b[j * ldb + p] as f64)
                            .sum();
                        let want = (alpha as f64 * dot + beta as f64 * c_seen[idx] as f64) as f32;
                        let tol = match ct {
                            DType::F32 => 1e-5,
                            DType::Bf16 => 1.0 / 128.0,
                        };
                        assert!(
                            (got[idx] - want).abs() <= tol * want.abs().max(1.0),
                            "{at:?}·{bt:?}→{ct:?} [{i}][{j}]: {} vs {want}",
                            got[idx]
                        );
                    }
                }
            }
        }
    }
    // beta = 0: C is not read (NaN in C does not leak).
    let mut dev = EmuDevice::new();
    let da = up(&mut dev, &[1.0f32, 2.0]);
    let db = up(&mut dev, &[3.0f32, 4.0]);
    let dc = up(&mut dev, &[f32::NAN]);
    let g = Gemm {
        m: 1,
        n: 1,
        k: 2,
        a: da,
        a_type: DType::F32,
        lda: 2,
        b: db,
        b_type: DType::F32,
        ldb: 2,
        c: dc,
        c_type: DType::F32,
        ldc: 1,
        alpha: 1.0,
        beta: 0.0,
    };
    dev.gemm(&g).unwrap();
    assert_eq!(down::<f32>(&mut dev, dc, 1), vec![11.0]);
    // An operand that does not fit its allocation is refused.
    let bad = Gemm {
        k: 3,
        lda: 3,
        ldb: 3,
        ..g
    };
    assert!(matches!(dev.gemm(&bad), Err(DeviceError::Shape { .. })));
}

// ---------------------------------------------------------------- graphs

/// One step of work: host input → gelu → GEMM → copy, fill → host output.
struct StepBufs {
    hin: HostBuf,
    hout: HostBuf,
    x: DevPtr,
    w: DevPtr,
    y: DevPtr,
    z: DevPtr,
}

const GM: usize = 4;
const GK: usize = 64;
const GN: usize = 48;

fn issue_step(dev: &mut EmuDevice, s: &StepBufs) {
    dev.copy_to_device(s.x, &s.hin, 0, GM * GK * 4).unwrap();
    dev.launch(
        k(dev, "gelu_f32"),
        (1, 1, 1),
        EW_THREADS,
        &[Arg::Ptr(s.x), Arg::U64((GM * GK) as u64)],
    )
    .unwrap();
    dev.gemm(&Gemm {
        m: GM,
        n: GN,
        k: GK,
        a: s.x,
        a_type: DType::F32,
        lda: GK,
        b: s.w,
        b_type: DType::Bf16,
        ldb: GK,
        c: s.y,
        c_type: DType::F32,
        ldc: GN,
        alpha: 1.0,
        beta: 0.0,
    })
    .unwrap();
    dev.memset_zero(s.z, GN * 4).unwrap();
    dev.copy_on_device(s.z + (GN * 4) as u64, s.y, GM * GN * 4)
        .unwrap();
    dev.copy_to_host(&s.hout, 4, s.z, (GM + 1) * GN * 4)
        .unwrap();
}

fn step_bufs(dev: &mut EmuDevice) -> StepBufs {
    let w: Vec<u16> = det(GN * GK, 8.0).iter().map(|&v| bf16(v)).collect();
    StepBufs {
        hin: dev.alloc_host(GM * GK * 4).unwrap(),
        hout: dev.alloc_host(4 + (GM + 1) * GN * 4).unwrap(),
        x: dev.alloc(GM * GK * 4).unwrap(),
        w: up(dev, &w),
        y: dev.alloc(GM * GN * 4).unwrap(),
        z: up(dev, &vec![5.0f32; (GM + 1) * GN]),
    }
}

#[test]
fn a_captured_graph_replays_as_direct_execution() {
    let mut dev = EmuDevice::new();
    let mut s = step_bufs(&mut dev);
    dev.begin_capture().unwrap();
    issue_step(&mut dev, &s);
    let graph = dev.end_capture().unwrap();
    // Nothing ran while capturing.
    assert!(down::<f32>(&mut dev, s.z, (GM + 1) * GN)
        .iter()
        .all(|&v| v == 5.0));
    assert!(s
        .hout
        .slice::<f32>(0, 1 + (GM + 1) * GN)
        .iter()
        .all(|&v| v == 0.0));

    let mut direct = EmuDevice::new();
    let mut d = step_bufs(&mut direct);
    for round in 0..2 {
        let input = det(GM * GK, round as f32 * 10.0 + 1.0);
        s.hin.slice_mut::<f32>(0, GM * GK).copy_from_slice(&input);
        d.hin.slice_mut::<f32>(0, GM * GK).copy_from_slice(&input);
        dev.launch_graph(graph).unwrap();
        dev.synchronize().unwrap();
        issue_step(&mut direct, &d);
        direct.synchronize().unwrap();
        let got = s.hout.slice::<f32>(0, 1 + (GM + 1) * GN);
        let want = d.hout.slice::<f32>(0, 1 + (GM + 1) * GN);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "round {round}"
        );
        assert!(got[1..=GN].iter().all(|&v| v == 0.0), "memset");
        assert!(got[GN + 1..].iter().any(|&v| v != 0.0), "GEMM output");
    }
    // A graph launched inside a capture is refused (as CUDA does) and the
    // capture is discarded.
    dev.begin_capture().unwrap();
    assert!(matches!(
        dev.launch_graph(graph),
        Err(DeviceError::Capture(_))
    ));
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    assert_eq!(dev.launches(), 2, "one launch per replay");
}

#[test]
fn capture_misuse_is_an_error() {
    let mut dev = EmuDevice::new();
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    assert!(matches!(
        dev.launch_graph(moshid_kernels::device::GraphId(3)),
        Err(DeviceError::Capture(_))
    ));
    dev.begin_capture().unwrap();
    assert!(matches!(dev.begin_capture(), Err(DeviceError::Capture(_))));
    // The failed nested begin discarded the capture.
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    let p = dev.alloc(16).unwrap();
    for refused in 0..5 {
        dev.begin_capture().unwrap();
        let r = match refused {
            0 => dev.alloc(16).map(|_| ()),
            1 => dev.alloc_host(16).map(|_| ()),
            2 => dev.upload(p, &[0; 4]),
            3 => dev.download(p, &mut [0; 4]),
            _ => dev.synchronize(),
        };
        assert!(
            matches!(r, Err(DeviceError::Capture(_))),
            "call {refused}: {r:?}"
        );
        assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    }
    // A failed check while capturing discards the capture too.
    dev.begin_capture().unwrap();
    assert!(matches!(
        dev.memset_zero(p, 17),
        Err(DeviceError::Shape { .. })
    ));
    assert!(matches!(dev.end_capture(), Err(DeviceError::Capture(_))));
    // An empty capture is a graph that does nothing.
    dev.begin_capture().unwrap();
    let g = dev.end_capture().unwrap();
    dev.launch_graph(g).unwrap();
    dev.synchronize().unwrap();
}

// ---------------------------------------------------------------- errors

fn norm_args(x: DevPtr, a: DevPtr, y: DevPtr) -> [Arg; 6] {
    [
        Arg::Ptr(x),
        Arg::Ptr(a),
        Arg::F32(1e-5),
        Arg::I32(64),
        Arg::Ptr(NULL),
        Arg::Ptr(y),
    ]
}

#[test]
fn bad_pointers_and_arguments_are_refused_before_running() {
    let mut dev = EmuDevice::with_memory(1 << 20);
    let f = k(&dev, "rms_norm_f32");
    let x = up(&mut dev, &det(64, 1.0));
    let a = up(&mut dev, &det(64, 2.0));
    let y = up(&mut dev, &vec![3.0f32; 64]);
    let shape = |r: Result<(), DeviceError>, what: &str| match r {
        Err(DeviceError::Shape { why, .. }) => eprintln!("{what}: {why}"),
        other => panic!("{what}: expected a shape error, got {other:?}"),
    };
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, 0xdead_0000)),
        "bogus pointer",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y + 256)),
        "one past the end",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y + 2)),
        "misaligned",
    );
    shape(
        dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)[..5]),
        "too few",
    );
    let mut wrong = norm_args(x, a, y);
    wrong[2] = Arg::I32(1);
    shape(dev.launch(f, (1, 1, 1), 256, &wrong), "int for float");
    shape(
        dev.launch(f, (1, 1, 1), 512, &norm_args(x, a, y)),
        "over the launch bounds",
    );
    shape(
        dev.launch(f, (0, 1, 1), 256, &norm_args(x, a, y)),
        "empty grid",
    );
    shape(
        dev.launch(f, (1, 1, 1), 0, &norm_args(x, a, y)),
        "empty block",
    );
    shape(dev.upload(y + 200, &[0; 100]), "upload past the end");
    shape(dev.copy_on_device(x, 0x1000, 4), "copy from nowhere");
    let mut other = EmuDevice::new();
    let foreign = other.alloc_host(64).unwrap();
    shape(
        dev.copy_to_device(x, &foreign, 0, 4),
        "another device's host buffer",
    );
    let mine = dev.alloc_host(64).unwrap();
    shape(dev.copy_to_device(x, &mine, 32, 64), "past the host buffer");
    assert!(matches!(
        dev.kernel("no_such_kernel"),
        Err(DeviceError::UnknownKernel(_))
    ));
    assert!(matches!(
        dev.alloc(2 << 20),
        Err(DeviceError::OutOfMemory { .. })
    ));
    let (free, total) = dev.memory().unwrap();
    assert_eq!(total, 1 << 20);
    assert_eq!(free, total - 3 * 256);
    // Nothing ran: y is as uploaded, and the device still works.
    assert_eq!(down::<f32>(&mut dev, y, 64), vec![3.0; 64]);
    dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)).unwrap();
    dev.synchronize().unwrap();
}

#[test]
fn a_warp_shuffle_over_missing_lanes_faults_the_device() {
    // rms_norm's block_sum shuffles whole warps: with 100 threads the last
    // warp has 4 lanes, so lane 4 of its full-mask shuffle does not exist.
    let mut dev = EmuDevice::new();
    let f = k(&dev, "rms_norm_f32");
    let x = up(&mut dev, &det(64, 1.0));
    let a = up(&mut dev, &det(64, 2.0));
    let y = zeros::<f32>(&mut dev, 64);
    match dev.launch(f, (1, 1, 1), 100, &norm_args(x, a, y)) {
        Err(DeviceError::Call { why, .. }) => {
            assert!(why.contains("does not exist"), "{why}");
            eprintln!("{why}");
        }
        other => panic!("expected a launch error, got {other:?}"),
    }
    // Faulted: everything fails from now on, synchronize included.
    assert!(dev.synchronize().is_err());
    assert!(dev.launch(f, (1, 1, 1), 256, &norm_args(x, a, y)).is_err());
    assert!(dev.download(y, &mut [0; 4]).is_err());
}

// ---------------------------------------------------------------- the scheduler itself

#[test]
fn scheduler_shuffles_barriers_and_misuses() {
    let mut dev = EmuDevice::new();
    let n = 96;
    let out = zeros::<i32>(&mut dev, 4 * 1024);
    dev.launch(
        k(&dev, "emu_selftest_shuffles"),
        (1, 1, 1),
        n,
        &[Arg::Ptr(out)],
    )
    .unwrap();
    let got = down::<i32>(&mut dev, out, 4 * n as usize);
    for t in 0..n as i32 {
        let (lane, base) = (t % 32, t - t % 32);
        let v = |l: i32| (base + l) * 10;
        let g = &got[4 * t as usize..4 * t as usize + 4];
        assert_eq!(g[0], v(lane ^ 1), "xor, thread {t}");
        assert_eq!(
            g[1],
            if lane >= 3 { v(lane - 3) } else { v(lane) },
            "up, thread {t}"
        );
        assert_eq!(
            g[2],
            if lane + 5 < 32 { v(lane + 5) } else { v(lane) },
            "down, thread {t}"
        );
        assert_eq!(g[3], v(7), "idx, thread {t}");
    }
    // A missing barrier shows in every order; with it, every order agrees.
    for order in [Order::Reverse, Order::Forward, Order::Shuffled(5)] {
        dev.set_order(order);
        let want: Vec<i32> = (0..256).map(|t| (t + 1) % 256).collect();
        for barrier in [1, 0] {
            let out = zeros::<i32>(&mut dev, 256);
            dev.launch(
                k(&dev, "emu_selftest_neighbour"),
                (1, 1, 1),
                256,
                &[Arg::Ptr(out), Arg::I32(barrier)],
            )
            .unwrap();
            let got = down::<i32>(&mut dev, out, 256);
            if barrier == 1 {
                assert_eq!(got, want, "{order:?}");
            } else {
                assert_ne!(got, want, "{order:?}: the race went unnoticed");
            }
        }
        // Exited threads drop out of the barrier.
        let out = up(&mut dev, &vec![-1i32; 128]);
        dev.launch(
            k(&dev, "emu_selftest_exit_then_sync"),
            (1, 1, 1),
            128,
            &[Arg::Ptr(out), Arg::I32(40)],
        )
        .unwrap();
        let got = down::<i32>(&mut dev, out, 128);
        let want: Vec<i32> = (0..128).map(|t| if t < 40 { 39 - t } else { -1 }).collect();
        assert_eq!(got, want, "{order:?}");
    }
    // The misuses are errors (each faults its device).
    for (mode, words) in [(0, "exited"), (1, "deadlock"), (2, "divergent")] {
        let mut dev = EmuDevice::new();
        let out = zeros::<i32>(&mut dev, 64);
        match dev.launch(
            k(&dev, "emu_selftest_misuse"),
            (2, 1, 1),
            64,
            &[Arg::Ptr(out), Arg::I32(mode)],
        ) {
            Err(DeviceError::Call { why, .. }) => {
                assert!(why.contains(words), "mode {mode}: {why}");
                eprintln!("mode {mode}: {why}");
            }
            other => panic!("mode {mode}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_order() {
    // The kernels with barriers and shuffles, in three orders, bit for bit.
    let run = |order: Order| -> (Vec<u32>, Vec<f32>, Vec<u32>) {
        let mut dev = EmuDevice::new();
        dev.set_order(order);
        let vocab = 3000;
        let logits: Vec<f32> = det(2 * vocab, 1.0).iter().map(|v| v * 3.0).collect();
        let p = SlotParams {
            temp_text: 0.9,
            temp_audio: 0.9,
            top_k_text: 40,
            top_k_audio: 40,
            use_sampling: 1,
            cfg_coef: 1.0,
        };
        let s = Sampling {
            logits: up(&mut dev, &logits),
            steps: up(&mut dev, &steps_all(2)),
            params: up(&mut dev, &[p, p]),
            rng: up(&mut dev, &[rng::seed_state(3), rng::seed_state(4)].concat()),
            out: zeros::<u32>(&mut dev, 2),
        };
        let mut toks = Vec::new();
        for _ in 0..4 {
            toks.extend(sample(&mut dev, &s, vocab, 2, false));
        }
        let (n, dim) = (2, 1000);
        let x = up(&mut dev, &det(n * dim, 2.0));
        let (w, b) = (up(&mut dev, &det(dim, 3.0)), up(&mut dev, &det(dim, 4.0)));
        let y = zeros::<f32>(&mut dev, n * dim);
        dev.launch(
            k(&dev, "layer_norm_f32"),
            (n as u32, 1, 1),
            NORM_THREADS,
            &[
                Arg::Ptr(x),
                Arg::Ptr(w),
                Arg::Ptr(b),
                Arg::F32(1e-5),
                Arg::I32(dim as i32),
                Arg::Ptr(NULL),
                Arg::Ptr(y),
            ],
        )
        .unwrap();
        let (dq, bins, books) = (64, 300, 2);
        let (bt, norms) = transpose_books(&det(books * bins * dq, 5.0), books, bins, dq);
        let xq = up(&mut dev, &det(3 * dq, 6.0));
        let (dbt, dn, ds) = (
            up(&mut dev, &bt),
            up(&mut dev, &norms),
            up(&mut dev, &steps_all(3)),
        );
        let codes = zeros::<u32>(&mut dev, 3 * books);
        dev.launch(
            k(&dev, "rvq_encode"),
            (3, 1, 1),
            RVQ_THREADS,
            &[
                Arg::Ptr(xq),
                Arg::Ptr(dbt),
                Arg::Ptr(dn),
                Arg::Ptr(ds),
                Arg::I32(books as i32),
                Arg::I32(dq as i32),
                Arg::I32(bins as i32),
                Arg::I32(1),
                Arg::Ptr(codes),
                Arg::I32(books as i32),
                Arg::I32(0),
            ],
        )
        .unwrap();
        (
            toks,
            down::<f32>(&mut dev, y, n * dim),
            down::<u32>(&mut dev, codes, 3 * books),
        )
    };
    let base = run(Order::Reverse);
    for order in [Order::Forward, Order::Shuffled(1), Order::Shuffled(99)] {
        let r = run(order);
        assert_eq!(r.0, base.0, "{order:?}: tokens");
        assert_eq!(
            r.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            base.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{order:?}: layer norm"
        );
        assert_eq!(r.2, base.2, "{order:?}: codes");
    }
}

#[test]
fn devices_on_several_threads_do_not_share_scheduler_state() {
    // Shared memory and fibers are per OS thread: concurrent launches of the
    // same kernel (same `__shared__` variables) on four threads stay exact.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut dev = EmuDevice::new();
                let (n, dim) = (8, 2048);
                let x = det(n * dim, t as f32 * 3.0);
                let alpha = det(dim, 1.0);
                let mut want = vec![0.0; n * dim];
                ops::rms_norm(&x, &alpha, 1e-6, dim, &mut want);
                let (dx, da) = (up(&mut dev, &x), up(&mut dev, &alpha));
                let dy = zeros::<f32>(&mut dev, n * dim);
                for _ in 0..20 {
                    dev.launch(
                        k(&dev, "rms_norm_f32"),
                        (n as u32, 1, 1),
                        NORM_THREADS,
                        &[
                            Arg::Ptr(dx),
                            Arg::Ptr(da),
                            Arg::F32(1e-6),
                            Arg::I32(dim as i32),
                            Arg::Ptr(NULL),
                            Arg::Ptr(dy),
                        ],
                    )
                    .unwrap();
                    assert_close(&down::<f32>(&mut dev, dy, n * dim), &want, 1e-5, "rms_norm");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

// ---------------------------------------------------------------- speed

#[test]
fn emulator_speed() {
    // Not a pass/fail check: prints the figures of the emulator's cost
    // (run with --nocapture to see them).
    let mut dev = EmuDevice::new();
    // A conv launch of 128 threads × 5,000 blocks (t_out 50 × 100 steps),
    // small channels so that the scheduler's cost dominates.
    let (c_in, c_out, kernel, t_in, n_steps) = (4, 128, 3, 50, 100);
    let history = kernel - 1;
    let x = up(&mut dev, &det(n_steps * t_in * c_in, 1.0));
    let prev = zeros::<f32>(&mut dev, n_steps * history * c_in);
    let w = up(&mut dev, &conv_w(kernel, c_in, c_out, 2.0));
    let steps = up(&mut dev, &steps_all(n_steps));
    let y = zeros::<f32>(&mut dev, n_steps * t_in * c_out);
    let args = [
        Arg::Ptr(x),
        Arg::Ptr(prev),
        Arg::Ptr(w),
        Arg::Ptr(NULL),
        Arg::Ptr(steps),
        Arg::I32(c_in as i32),
        Arg::I32(c_out as i32),
        Arg::I32(kernel as i32),
        Arg::I32(1),
        Arg::I32(1),
        Arg::I32(t_in as i32),
        Arg::I32(history as i32),
        Arg::Ptr(y),
    ];
    let f = k(&dev, "conv1d_stream");
    let t0 = std::time::Instant::now();
    dev.launch(f, (1, t_in as u32, n_steps as u32), CONV_THREADS, &args)
        .unwrap();
    let conv = t0.elapsed();
    let s0 = dev.fiber_switches();
    // Barrier-heavy: sampling (512 threads, ~15 barriers and many shuffles).
    let vocab = 2048;
    let p = SlotParams {
        temp_text: 0.9,
        temp_audio: 0.9,
        top_k_text: 40,
        top_k_audio: 40,
        use_sampling: 1,
        cfg_coef: 1.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &det(16 * vocab, 1.0)),
        steps: up(&mut dev, &steps_all(16)),
        params: up(&mut dev, &vec![p; 16]),
        rng: up(&mut dev, &vec![1u64; 64]),
        out: zeros::<u32>(&mut dev, 16),
    };
    let t1 = std::time::Instant::now();
    sample(&mut dev, &s, vocab, 16, false);
    let samp = t1.elapsed();
    let switches = dev.fiber_switches() - s0;
    // The scheduler alone: 256 threads, 200 rounds of a barrier and a warp sum.
    let out = zeros::<i32>(&mut dev, 256);
    let s1 = dev.fiber_switches();
    let t2 = std::time::Instant::now();
    dev.launch(
        k(&dev, "emu_selftest_spin"),
        (1, 1, 1),
        256,
        &[Arg::Ptr(out), Arg::I32(200)],
    )
    .unwrap();
    let spin = t2.elapsed();
    let spin_switches = dev.fiber_switches() - s1;
    eprintln!(
        "emulator: conv1d_stream 128 threads × 5000 blocks in {:.1} ms ({:.0} ns per thread); \
         sample_tokens 16 blocks × 512 threads in {:.1} ms ({} fiber switches); \
         barriers and warp sums: {} switches in {:.1} ms ({:.1} M switches/s)",
        conv.as_secs_f64() * 1e3,
        conv.as_secs_f64() * 1e9 / 640_000.0,
        samp.as_secs_f64() * 1e3,
        switches,
        spin_switches,
        spin.as_secs_f64() * 1e3,
        spin_switches as f64 / spin.as_secs_f64() / 1e6
    );
}
