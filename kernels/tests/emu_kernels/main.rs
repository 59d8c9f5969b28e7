//! The kernels of `cuda/` run through `Device::launch` — on the emulator in
//! CI, on a GPU with `MOSHID_TEST_DEVICE=cuda` (`scripts/gpu-check`, one
//! process per family: `emu_kernels attention::`) — checked against the CPU
//! reference of `moshid-model` (`ops`, sampling) or
//! naive host computations: norms, RoPE with the ring KV cache and attention
//! (f32, bf16 and fp8 caches), sampling with its RNG draws, RVQ, streaming
//! convolutions with their state, the activations, GEMMs in every dtype
//! combination, graph capture and replay, and the errors the emulator must
//! report (bad pointers and arguments, capture misuse, a kernel that misuses
//! its warps).
//!
//! Argument orders follow the kernels' signatures in `cuda/*.cu`; block sizes
//! are the `#define`s there.
//!
//! This file holds the host twins of the kernels' structs and the helpers
//! every family's tests share; each family is a module of its own. Every
//! family's tests take their device from [`device`] and write against
//! `dyn Device`, so they run on either device; `scheduler` and `errors`
//! (the emulator's own scheduler, thread orders, poisoning and refusals) use
//! `EmuDevice` by name and are left out on a GPU. The tolerances hold for a
//! GPU too: its `expf`, `erff`, `rsqrtf` are within 2 ulp and its kernels
//! contract multiply-adds (the emulator does neither), so nothing compares a
//! computed float bit for bit with a host value; discrete results (tokens,
//! codes, conversions) are compared exactly where the inputs keep them away
//! from ties.

#[path = "../common/device.rs"]
mod test_device;

mod attention;
mod attention_gqa;
mod conv;
mod elementwise;
mod errors;
mod gemm;
mod gemv;
mod graphs;
mod norms;
mod rvq;
mod sampling;
mod scheduler;
mod short_attn;

use moshid_kernels::device::emu::{EmuDevice, Order};
use moshid_kernels::device::{
    Arg, DType, DevPtr, Device, DeviceError, Gemm, HostBuf, KernelId, NULL,
};
use moshid_kernels::rng;
use moshid_model::ops;

const NORM_THREADS: u32 = 256;
const ROPE_THREADS: u32 = 128;
const EW_THREADS: u32 = 256;
const SAMPLE_THREADS: u32 = 512;
const CONV_THREADS: u32 = 128;

/// The device of a generic test (see the module doc).
fn device() -> Box<dyn Device> {
    test_device::open(test_device::Kind::Emu, true)
}

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
fn up<T: Plain>(dev: &mut dyn Device, v: &[T]) -> DevPtr {
    let p = dev.alloc((v.len() * T::SIZE).max(1)).unwrap();
    dev.upload(p, &bytes(v)).unwrap();
    p
}

/// A zeroed allocation of `n` elements of `T`.
fn zeros<T: Plain>(dev: &mut dyn Device, n: usize) -> DevPtr {
    dev.alloc((n * T::SIZE).max(1)).unwrap()
}

fn write<T: Plain>(dev: &mut dyn Device, p: DevPtr, v: &[T]) {
    dev.upload(p, &bytes(v)).unwrap();
}

fn down<T: Plain>(dev: &mut dyn Device, p: DevPtr, n: usize) -> Vec<T> {
    let mut b = vec![0u8; n * T::SIZE];
    dev.download(p, &mut b).unwrap();
    b.chunks_exact(T::SIZE).map(T::get).collect()
}

fn det(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.7137).sin()).collect()
}

fn k(dev: &dyn Device, name: &str) -> KernelId {
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
