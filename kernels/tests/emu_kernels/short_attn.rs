//! The fused short attention (RoPE, KV write and attention in one launch)
//! against a host model: f32 and bf16 caches, no RoPE, interleaved and
//! halves RoPE, grouped-query heads, a head width over two lane pairs, a
//! ring that wraps, a row masked from its third step on.

use super::*;
use moshid_kernels::ops::attention::{AttnShape, KvType};
use moshid_kernels::ops::short_attn::ShortAttnKernels;

/// What a cache of `kv` stores and reads back for `x`.
fn through(kv: KvType, x: f32) -> f32 {
    match kv {
        KvType::Bf16 => from_bf16(bf16(x)),
        _ => x,
    }
}

/// `v` (one head) rotated by RoPE at `pos` (f64 trigonometry).
fn rope(v: &[f32], freqs: &[f32], pos: usize, interleaved: bool) -> Vec<f32> {
    let hd = v.len();
    let mut out = v.to_vec();
    for (j, f) in freqs.iter().enumerate() {
        let (i0, i1) = if interleaved {
            (2 * j, 2 * j + 1)
        } else {
            (j, j + hd / 2)
        };
        let (s, c) = ((f * pos as f32) as f64).sin_cos();
        let (a, b) = (v[i0] as f64, v[i1] as f64);
        out[i0] = (a * c - b * s) as f32;
        out[i1] = (a * s + b * c) as f32;
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Case {
    kv: KvType,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    /// None: no RoPE; Some(interleaved).
    rope: Option<bool>,
    steps: usize,
}

fn run(c: Case) {
    let mut dev = device();
    let rows = 3;
    let (dim, kv_dim) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let width = dim + 2 * kv_dim;
    let eb = match c.kv {
        KvType::F32 => 4,
        _ => 2,
    };
    let kc = zeros::<u8>(&mut *dev, rows * c.capacity * kv_dim * eb);
    let vc = zeros::<u8>(&mut *dev, rows * c.capacity * kv_dim * eb);
    let freqs: Vec<f32> = (0..c.head_dim / 2)
        .map(|j| 1.0 / 100f32.powf(2.0 * j as f32 / c.head_dim as f32))
        .collect();
    let dfreqs = match c.rope {
        Some(_) => up(&mut *dev, &freqs),
        None => NULL,
    };
    let s = AttnShape {
        dim,
        heads: c.heads,
        kv_heads: c.kv_heads,
        rope_interleaved: c.rope.unwrap_or(true),
        capacity: c.capacity,
        context: c.capacity,
        rows,
    };
    assert!(ShortAttnKernels::takes(&s, c.kv));
    let sa = ShortAttnKernels::resolve(&*dev).unwrap();
    // Host record: per row, per position, the (rotated, stored) key and value.
    let mut keys = vec![vec![Vec::<f32>::new(); c.steps]; rows];
    let mut vals = keys.clone();
    let out_t = match c.kv {
        KvType::F32 => DType::F32,
        _ => DType::Bf16,
    };
    for step in 0..c.steps {
        let qkv = det(rows * width, step as f32 * 3.0 + 0.7);
        let infos: Vec<RowInfo> = (0..rows)
            .map(|r| RowInfo {
                kv: r as i32,
                pos: step as i32,
                last: step as i32,
                step: r as i32,
                active: (r != 1 || step < 2) as i32,
            })
            .collect();
        let (dq, di) = (up(&mut *dev, &qkv), up(&mut *dev, &infos));
        let out = up(&mut *dev, &vec![7u8; rows * dim * eb]);
        sa.attend(&mut *dev, c.kv, dq, dfreqs, di, kc, vc, &s, out)
            .unwrap();
        assert_eq!(
            down::<f32>(&mut *dev, dq, rows * width),
            qkv,
            "qkv is not modified"
        );
        let got = match out_t {
            DType::F32 => down::<f32>(&mut *dev, out, rows * dim),
            DType::Bf16 => down::<u16>(&mut *dev, out, rows * dim)
                .into_iter()
                .map(from_bf16)
                .collect(),
        };
        for r in 0..rows {
            let q = &qkv[r * width..r * width + dim];
            let k = &qkv[r * width + dim..r * width + dim + kv_dim];
            let v = &qkv[r * width + dim + kv_dim..(r + 1) * width];
            if infos[r].active == 0 {
                assert!(
                    got[r * dim..(r + 1) * dim].iter().all(|&x| x == 0.0),
                    "masked row"
                );
                continue;
            }
            let rot = |x: &[f32]| match c.rope {
                Some(il) => rope(x, &freqs, step, il),
                None => x.to_vec(),
            };
            let mut kr = Vec::new();
            for hk in 0..c.kv_heads {
                kr.extend(rot(&k[hk * c.head_dim..(hk + 1) * c.head_dim]));
            }
            keys[r][step] = kr.iter().map(|&x| through(c.kv, x)).collect();
            vals[r][step] = v.iter().map(|&x| through(c.kv, x)).collect();
            let start = (step + 1).saturating_sub(c.capacity);
            for h in 0..c.heads {
                let hk = h / (c.heads / c.kv_heads);
                let qh = rot(&q[h * c.head_dim..(h + 1) * c.head_dim]);
                let seg = hk * c.head_dim..(hk + 1) * c.head_dim;
                let want = host_head(&qh, &keys[r], &vals[r], start..step + 1, seg);
                for (e, &want) in want.iter().enumerate() {
                    let g = got[r * dim + h * c.head_dim + e] as f64;
                    let tol = if out_t == DType::F32 { 2e-5 } else { 8e-3 };
                    assert!(
                        (g - want).abs() <= tol * want.abs().max(1.0),
                        "{c:?} step {step} row {r} head {h} element {e}: {g} vs {want}"
                    );
                }
            }
        }
    }
    check_key_cache(&mut *dev, &c, kc, &keys, kv_dim);
}

/// The key cache holds the newest `capacity` positions of every row as the
/// host record stored them (rounded through the cache type).
fn check_key_cache(
    dev: &mut dyn Device,
    c: &Case,
    kc: DevPtr,
    keys: &[Vec<Vec<f32>>],
    kv_dim: usize,
) {
    let rows = keys.len();
    let kd = match c.kv {
        KvType::F32 => down::<f32>(dev, kc, rows * c.capacity * kv_dim),
        _ => down::<u16>(dev, kc, rows * c.capacity * kv_dim)
            .into_iter()
            .map(from_bf16)
            .collect(),
    };
    for (r, row_keys) in keys.iter().enumerate() {
        let first = c.steps.saturating_sub(c.capacity);
        for (p, key) in row_keys.iter().enumerate().skip(first) {
            if key.is_empty() {
                continue;
            }
            let at = (r * c.capacity + p % c.capacity) * kv_dim;
            for (e, want) in key.iter().enumerate() {
                let g = kd[at + e];
                assert!(
                    (g - want).abs() <= 8e-3 * want.abs().max(1.0),
                    "{c:?}: key cache row {r} position {p}"
                );
            }
        }
    }
}

/// The reference attention of one query head `qh` over positions `live` of
/// a row's stored keys and values (key/value head elements `seg`), in f64.
fn host_head(
    qh: &[f32],
    keys: &[Vec<f32>],
    vals: &[Vec<f32>],
    live: std::ops::Range<usize>,
    seg: std::ops::Range<usize>,
) -> Vec<f64> {
    let scale = (seg.len() as f64).sqrt();
    let scores: Vec<f64> = live
        .clone()
        .map(|p| {
            let d: f64 = qh
                .iter()
                .zip(&keys[p][seg.clone()])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            d / scale
        })
        .collect();
    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ws: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
    let l: f64 = ws.iter().sum();
    seg.clone()
        .map(|e| {
            live.clone()
                .zip(&ws)
                .map(|(p, w)| w * vals[p][e] as f64)
                .sum::<f64>()
                / l
        })
        .collect()
}

#[test]
fn short_attention_matches_a_host_model() {
    let base = Case {
        kv: KvType::F32,
        heads: 4,
        kv_heads: 4,
        head_dim: 64,
        capacity: 8,
        rope: None,
        steps: 8,
    };
    for kv in [KvType::F32, KvType::Bf16] {
        // The depformer's shape: no RoPE, one frame of 8 positions.
        run(Case { kv, ..base });
        // RoPE both ways, grouped-query heads, a head over two lane pairs
        // (80 wide), 5 query heads over two blocks, a ring that wraps.
        run(Case {
            kv,
            rope: Some(true),
            heads: 4,
            kv_heads: 2,
            ..base
        });
        run(Case {
            kv,
            rope: Some(false),
            heads: 5,
            kv_heads: 5,
            head_dim: 80,
            ..base
        });
        run(Case {
            kv,
            capacity: 4,
            steps: 10,
            rope: Some(true),
            ..base
        });
    }
    // Windows longer than the kernel holds, and fp8 caches, are refused.
    let long = AttnShape {
        dim: 64,
        heads: 1,
        kv_heads: 1,
        rope_interleaved: true,
        capacity: 33,
        context: 33,
        rows: 1,
    };
    assert!(!ShortAttnKernels::takes(&long, KvType::F32));
    let fp8 = AttnShape {
        capacity: 8,
        context: 8,
        ..long
    };
    assert!(!ShortAttnKernels::takes(&fp8, KvType::Fp8 { scale: 1.0 }));
    assert!(ShortAttnKernels::takes(&fp8, KvType::Bf16));
}
