//! RoPE with the ring KV cache and single-query attention against a naive host
//! attention (f32, bf16 and fp8 caches, wrapped rings, masked rows, several
//! steps per call, the window split across blocks at every boundary), and the
//! bf16/fp8 conversions against CUDA's rules.

use super::*;
use moshid_kernels::ops::attention::{attn_partial_floats, AttnKernels, AttnShape, KvType};

/// Attention of `rows` rows through the ops layer (`attend_split`): `splits`
/// splits, a partial buffer allocated for them; returns the output as f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    dev: &mut dyn Device,
    kv: KvType,
    f32_out: bool,
    shape: &AttnShape,
    (dq, kc, vc, dr): (DevPtr, DevPtr, DevPtr, DevPtr),
    splits: usize,
) -> Vec<f32> {
    let kern = AttnKernels::resolve(&*dev).unwrap();
    let (n, dim) = (shape.rows, shape.dim);
    let out_type = if f32_out { DType::F32 } else { DType::Bf16 };
    let out = dev.alloc(n * dim * out_type.bytes()).unwrap();
    // Poisoned, so an element the kernels leave unwritten shows.
    if f32_out {
        write(dev, out, &vec![f32::NAN; n * dim]);
    } else {
        write(dev, out, &vec![0x7fc0u16; n * dim]);
    }
    let floats = attn_partial_floats(shape, splits);
    let partial = if floats > 0 {
        up(dev, &vec![f32::NAN; floats])
    } else {
        NULL
    };
    kern.attend_split(
        dev,
        kv,
        out_type,
        dq,
        (kc, vc, dr),
        shape,
        (splits, partial),
        out,
    )
    .unwrap();
    if f32_out {
        down::<f32>(dev, out, n * dim)
    } else {
        down::<u16>(dev, out, n * dim)
            .into_iter()
            .map(from_bf16)
            .collect()
    }
}

/// The cache element types under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cache {
    F32,
    Bf16,
    Fp8(f32),
}

impl Cache {
    fn kv(self) -> KvType {
        match self {
            Cache::F32 => KvType::F32,
            Cache::Bf16 => KvType::Bf16,
            Cache::Fp8(scale) => KvType::Fp8 { scale },
        }
    }

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
    /// Each step attends once per split count here, each checked.
    splits: Vec<usize>,
}

impl Ring {
    fn new(
        dev: &mut dyn Device,
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
            splits: vec![1],
        }
    }

    /// rope_kv_write then attn_decode for `rows`; checks the rotated queries
    /// and the attention output against the host. `qkv` is [rows][3·dim].
    fn step(&mut self, dev: &mut dyn Device, rows: &[RowInfo], qkv: &[f32], f32_out: bool) {
        let (dim, hd) = (self.dim, self.dim / self.heads);
        let n = rows.len();
        let dq = up(dev, qkv);
        let dr = up(dev, rows);
        let freqs = self.freqs.as_ref().map_or(NULL, |f| f.0);
        let rope = match self.cache {
            Cache::F32 => "rope_kv_write_f32",
            Cache::Bf16 => "rope_kv_write_bf16",
            Cache::Fp8(_) => "rope_kv_write_fp8",
        };
        let mut args = vec![
            Arg::Ptr(dq),
            Arg::Ptr(freqs),
            Arg::Ptr(dr),
            Arg::Ptr(self.kc),
            Arg::Ptr(self.vc),
            Arg::I32(dim as i32),
            Arg::I32(dim as i32), // kv_dim: one key/value head per query head
            Arg::I32(hd as i32),
            Arg::I32(self.cap as i32),
            Arg::I32(1), // interleaved RoPE pairs
        ];
        if let Cache::Fp8(s) = self.cache {
            args.push(Arg::F32(s));
        }
        dev.launch(k(dev, rope), (n as u32, 1, 1), ROPE_THREADS, &args)
            .unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let shape = AttnShape {
            dim,
            heads: self.heads,
            kv_heads: self.heads,
            rope_interleaved: true,
            capacity: self.cap,
            context: self.context,
            rows: n,
        };
        let outs: Vec<(usize, Vec<f32>)> = self
            .splits
            .clone()
            .into_iter()
            .map(|sp| {
                let got = attend(
                    dev,
                    self.cache.kv(),
                    f32_out,
                    &shape,
                    (dq, self.kc, self.vc, dr),
                    sp,
                );
                (sp, got)
            })
            .collect();
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
        for (splits, got) in &outs {
            self.check(rows, &host, got, *splits, f32_out, scale);
        }
    }

    /// Checks one attention output against the host's (`host`: the rotated
    /// qkv rows).
    fn check(
        &self,
        rows: &[RowInfo],
        host: &[f32],
        got: &[f32],
        splits: usize,
        f32_out: bool,
        scale: f32,
    ) {
        let (dim, hd) = (self.dim, self.dim / self.heads);
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
                        "{:?} {splits} splits, row {r} pos {pos} head {h} elem {e}: {g} vs {want}",
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
        let mut dev = device();
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
    let mut dev = device();
    let mut ring = Ring::new(&mut dev, Cache::Bf16, dim, heads, cap, 3, true);
    ring.splits = vec![1, 3];
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
    let mut dev = device();
    let mut ring = Ring::new(&mut dev, Cache::F32, dim, heads, cap, 1, false);
    ring.splits = vec![1, 2, 3];
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
    let mut dev = device();
    let mut ring = Ring::new(&mut dev, Cache::Fp8(0.125), dim, heads, cap, 1, true);
    ring.splits = vec![1, 2, 5];
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
    let mut dev = device();
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
    let shape = AttnShape {
        dim,
        heads,
        kv_heads: heads,
        rope_interleaved: true,
        capacity: cap,
        context: cap,
        rows: 1,
    };
    for splits in [1, 3] {
        let got = attend(
            &mut dev,
            KvType::F32,
            true,
            &shape,
            (qkv, kc, vc, rows),
            splits,
        );
        assert_eq!(got, vec![0.0; dim], "{splits} splits");
    }
}

#[test]
fn split_attention_matches_at_every_split_boundary() {
    // One row stepping over a ring of 40 (wrapping at step 40), every
    // window attended whole and cut into 2, 3, 7 and 32 splits (empty
    // splits included, and runs that cross the blocks' rounds of keys);
    // head widths of 128 (16 lanes a key in bf16), 24 (three chunks of
    // eight on four lanes: one lane idles) and 8 (one lane a key).
    for (cache, dim, heads) in [
        (Cache::Bf16, 256, 2),
        (Cache::F32, 48, 2),
        (Cache::Fp8(0.5), 16, 2),
    ] {
        let mut dev = device();
        let cap = 40;
        let mut ring = Ring::new(&mut dev, cache, dim, heads, cap, 1, true);
        ring.splits = vec![1, 2, 3, 7, 32];
        for p in 0..47 {
            let row = RowInfo {
                kv: 0,
                pos: p,
                last: p,
                step: 0,
                active: 1,
            };
            ring.step(
                &mut dev,
                &[row],
                &det(3 * dim, p as f32 * 1.7),
                cache == Cache::F32,
            );
        }
    }
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
    let mut dev = device();
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
            Arg::I32(dim as i32),
            Arg::I32(1),
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
