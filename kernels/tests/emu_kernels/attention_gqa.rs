//! Grouped-query attention (fewer key/value heads than query heads, the
//! official `kv_repeat`) and RoPE over the two halves of each head (the
//! official `rope_concat`) in `rope_kv_write_*` / `attn_decode_*`, against a
//! naive host attention built on the CPU reference's `ops`: the rotated
//! queries, the cache contents (`kv_dim` values per position) and every
//! head's output, over a wrapped ring with two cache rows, whole and split
//! across blocks.

use super::attention::attend;
use super::*;
use moshid_kernels::ops::attention::{AttnShape, KvType};

/// One case: query heads, key/value heads, RoPE layout, f32 or bf16 cache.
struct Case {
    heads: usize,
    kv_heads: usize,
    interleaved: bool,
    bf16_cache: bool,
}

fn run(c: &Case) {
    let (head_dim, cap, steps, kv_rows) = (16usize, 5usize, 8i32, 2usize);
    let (dim, kv_dim) = (c.heads * head_dim, c.kv_heads * head_dim);
    let qkv_dim = dim + 2 * kv_dim;
    let rep = c.heads / c.kv_heads;
    let elem = if c.bf16_cache { 2 } else { 4 };
    let round = |x: f32| if c.bf16_cache { from_bf16(bf16(x)) } else { x };
    let mut dev = EmuDevice::new();
    let mut freqs = vec![0.0; head_dim / 2];
    ops::rope_freqs(head_dim, 20_000.0, &mut freqs);
    let dfreqs = up(&mut dev, &freqs);
    let kc = dev.alloc(kv_rows * cap * kv_dim * elem).unwrap();
    let vc = dev.alloc(kv_rows * cap * kv_dim * elem).unwrap();
    let rope = if c.bf16_cache {
        "rope_kv_write_bf16"
    } else {
        "rope_kv_write_f32"
    };
    let kvt = if c.bf16_cache {
        KvType::Bf16
    } else {
        KvType::F32
    };
    // Host record of the stored keys and values: [cache row][position].
    let mut keys = vec![Vec::<Vec<f32>>::new(); kv_rows];
    let mut vals = vec![Vec::<Vec<f32>>::new(); kv_rows];
    let rotate = |v: &mut [f32], pos: f32| {
        for h in v.chunks_exact_mut(head_dim) {
            if c.interleaved {
                ops::rope_interleaved(h, &freqs, pos);
            } else {
                ops::rope_halves(h, &freqs, pos);
            }
        }
    };
    for p in 0..steps {
        // Two rows: cache row 1 at position p, cache row 0 one step behind.
        let rows: Vec<RowInfo> = (0..kv_rows)
            .map(|r| {
                let pos = (p - r as i32).max(0);
                RowInfo {
                    kv: (kv_rows - 1 - r) as i32,
                    pos,
                    last: pos,
                    step: r as i32,
                    active: (p >= r as i32) as i32,
                }
            })
            .collect();
        let n = rows.len();
        let qkv = det(n * qkv_dim, p as f32 * 2.5 + c.heads as f32);
        let dq = up(&mut dev, &qkv);
        let dr = up(&mut dev, &rows);
        dev.launch(
            k(&dev, rope),
            (n as u32, 1, 1),
            ROPE_THREADS,
            &[
                Arg::Ptr(dq),
                Arg::Ptr(dfreqs),
                Arg::Ptr(dr),
                Arg::Ptr(kc),
                Arg::Ptr(vc),
                Arg::I32(dim as i32),
                Arg::I32(kv_dim as i32),
                Arg::I32(head_dim as i32),
                Arg::I32(cap as i32),
                Arg::I32(c.interleaved as i32),
            ],
        )
        .unwrap();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let shape = AttnShape {
            dim,
            heads: c.heads,
            kv_heads: c.kv_heads,
            rope_interleaved: c.interleaved,
            capacity: cap,
            context: cap,
            rows: n,
        };
        let outs: Vec<(usize, Vec<f32>)> = [1, 2, 5]
            .into_iter()
            .map(|sp| {
                (
                    sp,
                    attend(&mut dev, kvt, true, &shape, (dq, kc, vc, dr), sp),
                )
            })
            .collect();
        let got_q = down::<f32>(&mut dev, dq, n * qkv_dim);
        for (r, ri) in rows.iter().enumerate() {
            let row = &qkv[r * qkv_dim..(r + 1) * qkv_dim];
            if ri.active == 0 {
                for (sp, got) in &outs {
                    let o = &got[r * dim..(r + 1) * dim];
                    assert!(
                        o.iter().all(|&v| v == 0.0),
                        "{sp} splits: masked row {r} is not zero"
                    );
                }
                continue;
            }
            let pos = ri.pos as usize;
            let mut q = row[..dim].to_vec();
            let mut kk = row[dim..dim + kv_dim].to_vec();
            rotate(&mut q, pos as f32);
            rotate(&mut kk, pos as f32);
            assert_close(
                &got_q[r * qkv_dim..r * qkv_dim + dim],
                &q,
                1e-6,
                "rotated q",
            );
            // k and v stay as projected in qkv (k turns on its way to the cache).
            assert_eq!(
                &got_q[r * qkv_dim + dim..(r + 1) * qkv_dim],
                &row[dim..],
                "k and v in qkv"
            );
            let kv = ri.kv as usize;
            if keys[kv].len() <= pos {
                keys[kv].resize(pos + 1, Vec::new());
                vals[kv].resize(pos + 1, Vec::new());
            }
            keys[kv][pos] = kk.iter().map(|&x| round(x)).collect();
            vals[kv][pos] = row[dim + kv_dim..].iter().map(|&x| round(x)).collect();
            let start = (pos + 1).saturating_sub(cap);
            for h in 0..c.heads {
                let (qh, kh) = (&q[h * head_dim..(h + 1) * head_dim], h / rep);
                let mut sc: Vec<f32> = (start..=pos)
                    .map(|j| {
                        let key = &keys[kv][j][kh * head_dim..(kh + 1) * head_dim];
                        qh.iter().zip(key).map(|(a, b)| a * b).sum::<f32>() * scale
                    })
                    .collect();
                ops::softmax_inplace(&mut sc);
                for e in 0..head_dim {
                    let want: f32 = (start..=pos)
                        .zip(&sc)
                        .map(|(j, w)| w * vals[kv][j][kh * head_dim + e])
                        .sum();
                    for (sp, got) in &outs {
                        let g = got[r * dim + h * head_dim + e];
                        assert!(
                            (g - want).abs() < 1e-5 * want.abs().max(1.0),
                            "{} heads / {} kv heads, interleaved {}, bf16 cache {}, {sp} splits: \
                             step {p} row {r} head {h} elem {e}: {g} vs {want}",
                            c.heads,
                            c.kv_heads,
                            c.interleaved,
                            c.bf16_cache
                        );
                    }
                }
            }
        }
        // The cache rows hold exactly kv_dim values per position: the
        // newest key of cache row 1 sits at ring index p % cap.
        let kv = rows[0].kv as usize;
        let at = (kv * cap + rows[0].pos as usize % cap) * kv_dim;
        let stored: Vec<f32> = if c.bf16_cache {
            down::<u16>(&mut dev, kc + (at * 2) as u64, kv_dim)
                .into_iter()
                .map(from_bf16)
                .collect()
        } else {
            down::<f32>(&mut dev, kc + (at * 4) as u64, kv_dim)
        };
        assert_eq!(
            stored, keys[kv][rows[0].pos as usize],
            "cached key, step {p}"
        );
    }
}

#[test]
fn grouped_query_attention_and_rope_halves_match_naive() {
    for (heads, kv_heads) in [(4, 2), (6, 3), (4, 1), (2, 2), (6, 2)] {
        for interleaved in [false, true] {
            run(&Case {
                heads,
                kv_heads,
                interleaved,
                bf16_cache: false,
            });
        }
    }
    run(&Case {
        heads: 4,
        kv_heads: 2,
        interleaved: false,
        bf16_cache: true,
    });
}
