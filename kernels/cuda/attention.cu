// Rotary embedding, ring KV-cache writes and single-query attention
// (CPU reference: model/src/lm/transformer.rs Stack::forward / attend and
// model/src/mimi/transformer.rs; ops.rs rope_interleaved / rope_halves).
//
// Layouts: `qkv` is the in-projection output, [rows][dim + 2·kv_dim] f32:
// q (heads × head_dim), then k and v (kv_heads × head_dim each; kv_heads =
// heads / kv_repeat, kv_dim = kv_heads · head_dim, so kv_dim == dim without
// grouped-query attention). A cache is one layer's keys (or values):
// [cache rows][capacity][kv_dim], element type KV (bf16, fp8 e4m3 or f32).
// fp8 stores x / kv_scale and reads back · kv_scale. Query head h reads
// key/value head h / (dim / kv_dim), as the official expand_repeated_kv.
//
// RoPE pairs, within each head: (2j, 2j + 1) when `interleaved` (the
// official `rope`), (j, j + head_dim/2) otherwise (`rope_concat`); pair j
// turns by freqs[j] · pos in both layouts.
//
// Ring semantics, per row (RowInfo): the key of position p lives at ring
// index p % capacity. A query at `pos` attends to the positions
//   max(0, pos + 1 − context, last + 1 − capacity) ..= pos
// where `last` is the newest position written into the row's cache by this
// call. With one step per call (the LM: last == pos, context == capacity)
// this is the reference's `min(pos + 1, context, capacity)` window; with t
// steps per call (Mimi, context == capacity) it is the official RingKVCache
// mask, including its consequence that early queries of a call see fewer
// keys once the ring wrapped. Every write of a call (rope_kv_write_*) must be
// complete before its attention launch: they are separate kernels.
//
// NVIDIA's fork (PersonaPlex) labels ring entries from the call's end, so
// its oldest entry is never seen: `last` one past the newest position
// (rows_from_steps' `end_label` = 1) gives exactly its window.
//
// Masked rows (RowInfo::active == 0) write nothing into the caches; their
// attention output is zeros, as is that of a query whose window is empty.
#define ROPE_THREADS 128
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_MAX_HEAD_DIM 256

// Geometry: grid = (rows), block = ROPE_THREADS; a thread per rotary pair
// (the dim/2 pairs of q, then the kv_dim/2 of k) and per value element,
// striding over the row. `freqs` has head_dim/2 entries (computed on the
// host exactly as the reference), or is null for no rotary embedding (the
// depformer). q is rotated in place in qkv; k only on its way into the cache.
template <typename KV>
__device__ __forceinline__ void rope_kv_write(float* __restrict__ qkv, const float* __restrict__ freqs,
                                              const RowInfo* __restrict__ rows, KV* __restrict__ k_cache,
                                              KV* __restrict__ v_cache, int dim, int kv_dim, int head_dim,
                                              int capacity, int interleaved, float inv_kv_scale) {
    const int r = blockIdx.x;
    const RowInfo ri = rows[r];
    if (!ri.active) return;
    float* q = qkv + (size_t)r * (dim + 2 * kv_dim);
    const float* k = q + dim;
    const float* v = k + kv_dim;
    const size_t base = ((size_t)ri.kv * capacity + (size_t)(ri.pos % capacity)) * kv_dim;
    const float pos = (float)ri.pos;
    const int half = head_dim / 2;
    const int q_pairs = dim / 2, pairs = q_pairs + kv_dim / 2;
    for (int p = threadIdx.x; p < pairs; p += ROPE_THREADS) {
        const bool is_q = p < q_pairs;
        const int pp = is_q ? p : p - q_pairs;
        const int j = pp % half;
        const int i0 = (pp / half) * head_dim + (interleaved ? 2 * j : j);
        const int i1 = i0 + (interleaved ? 1 : half);
        const float* src = is_q ? q : k;
        float a = src[i0], b = src[i1];
        if (freqs != nullptr) {
            float s, c;
            sincosf(freqs[j] * pos, &s, &c);
            const float ar = a * c - b * s, br = a * s + b * c;
            a = ar;
            b = br;
        }
        if (is_q) {
            q[i0] = a;
            q[i1] = b;
        } else {
            store(k_cache + base + i0, a * inv_kv_scale);
            store(k_cache + base + i1, b * inv_kv_scale);
        }
    }
    for (int e = threadIdx.x; e < kv_dim; e += ROPE_THREADS) store(v_cache + base + e, v[e] * inv_kv_scale);
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_bf16(float* __restrict__ qkv, const float* __restrict__ freqs, const RowInfo* __restrict__ rows,
                   bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int dim, int kv_dim, int head_dim,
                   int capacity, int interleaved) {
    rope_kv_write(qkv, freqs, rows, k_cache, v_cache, dim, kv_dim, head_dim, capacity, interleaved, 1.f);
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_fp8(float* __restrict__ qkv, const float* __restrict__ freqs, const RowInfo* __restrict__ rows,
                  __nv_fp8_e4m3* __restrict__ k_cache, __nv_fp8_e4m3* __restrict__ v_cache, int dim, int kv_dim,
                  int head_dim, int capacity, int interleaved, float kv_scale) {
    rope_kv_write(qkv, freqs, rows, k_cache, v_cache, dim, kv_dim, head_dim, capacity, interleaved,
                  1.f / kv_scale);
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
rope_kv_write_f32(float* __restrict__ qkv, const float* __restrict__ freqs, const RowInfo* __restrict__ rows,
                  float* __restrict__ k_cache, float* __restrict__ v_cache, int dim, int kv_dim, int head_dim,
                  int capacity, int interleaved) {
    rope_kv_write(qkv, freqs, rows, k_cache, v_cache, dim, kv_dim, head_dim, capacity, interleaved, 1.f);
}

// Two adjacent values of a cache row as f32. `p` is at an even element of a
// row (head_dim and dim are even), so the bf16 and fp8 pairs are one aligned
// 4- or 2-byte load; f32 (Mimi's short cache only) stays two loads.
__device__ __forceinline__ void load_pair(const float* p, float& a, float& b) {
    a = p[0];
    b = p[1];
}
__device__ __forceinline__ void load_pair(const bf16* p, float& a, float& b) {
    const u32 v = *reinterpret_cast<const u32*>(p);
    a = __uint_as_float(v << 16);
    b = __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ void load_pair(const __nv_fp8_e4m3* p, float& a, float& b) {
    const unsigned short v = *reinterpret_cast<const unsigned short*>(p);
    __nv_fp8_e4m3 lo, hi;
    lo.__x = (unsigned char)(v & 0xffu);
    hi.__x = (unsigned char)(v >> 8);
    a = float(lo);
    b = float(hi);
}

// Geometry: grid = (heads, rows), block = ATT_THREADS (4 warps). Lane l holds
// the elements 2l, 2l + 1 (+ 64 j) of the head (head_dim ≤ 256); warp w takes
// two keys per iteration, start + w + 8 i and start + w + 8 i + 4, so that
// every load of a key row is a full 128 bytes of bf16 across the warp and two
// rows are in flight at once; online softmax (running max and sum) over the
// pair. The four warps' partial results are merged through shared memory:
// ATT_WARPS · (ATT_MAX_HEAD_DIM + 2) floats = 4 KiB, whatever the context.
// Scores are q·k · scale with scale = 1/sqrt(head_dim) from the host; the
// fp8 cache's kv_scale is applied once to each score and to the output.
#define ATT_PAIRS (ATT_MAX_HEAD_DIM / 64)
template <typename KV, typename OUT>
__device__ __forceinline__ void attn_decode(const float* __restrict__ qkv, const KV* __restrict__ k_cache,
                                            const KV* __restrict__ v_cache, const RowInfo* __restrict__ rows,
                                            int dim, int kv_dim, int head_dim, int capacity, int context,
                                            float scale, float kv_scale, OUT* __restrict__ out) {
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_HEAD_DIM];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    const int h = blockIdx.x, r = blockIdx.y;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const RowInfo ri = rows[r];
    OUT* o = out + (size_t)r * dim + (size_t)h * head_dim;
    if (!ri.active) {
        for (int e = threadIdx.x; e < head_dim; e += ATT_THREADS) store(o + e, 0.f);
        return;
    }
    const float* q = qkv + (size_t)r * (dim + 2 * kv_dim) + (size_t)h * head_dim;
    int start = ri.pos + 1 - context;
    start = max(start, ri.last + 1 - capacity);
    start = max(start, 0);
    const float qk_scale = scale * kv_scale;
    float qv[2 * ATT_PAIRS], acc[2 * ATT_PAIRS];
#pragma unroll
    for (int j = 0; j < ATT_PAIRS; ++j) {
        const int e = 2 * lane + 64 * j;
        qv[2 * j] = e < head_dim ? q[e] : 0.f;
        qv[2 * j + 1] = e < head_dim ? q[e + 1] : 0.f;
        acc[2 * j] = 0.f;
        acc[2 * j + 1] = 0.f;
    }
    // The key/value head of query head h (kv_repeat = dim / kv_dim).
    const size_t row0 = (size_t)ri.kv * capacity, head0 = (size_t)(h / (dim / kv_dim)) * head_dim;
    float m = NEG_INF, l = 0.f;
    for (int p0 = start + w; p0 <= ri.pos; p0 += 2 * ATT_WARPS) {
        // The second key of the pair, or the first again with weight 0.
        const bool two = p0 + ATT_WARPS <= ri.pos;
        const int p1 = two ? p0 + ATT_WARPS : p0;
        const size_t b0 = (row0 + (size_t)(p0 % capacity)) * kv_dim + head0;
        const size_t b1 = (row0 + (size_t)(p1 % capacity)) * kv_dim + head0;
        float d0 = 0.f, d1 = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_PAIRS; ++j) {
            const int e = 2 * lane + 64 * j;
            if (e < head_dim) {
                float x0, y0, x1, y1;
                load_pair(k_cache + b0 + e, x0, y0);
                load_pair(k_cache + b1 + e, x1, y1);
                d0 = fmaf(qv[2 * j], x0, d0);
                d0 = fmaf(qv[2 * j + 1], y0, d0);
                d1 = fmaf(qv[2 * j], x1, d1);
                d1 = fmaf(qv[2 * j + 1], y1, d1);
            }
        }
        const float s0 = warp_sum(d0) * qk_scale;
        const float s1 = two ? warp_sum(d1) * qk_scale : NEG_INF;
        const float m_new = fmaxf(m, fmaxf(s0, s1));
        const float c = expf(m - m_new);
        const float e0 = expf(s0 - m_new), e1 = expf(s1 - m_new);
        l = l * c + e0 + e1;
#pragma unroll
        for (int j = 0; j < ATT_PAIRS; ++j) {
            const int e = 2 * lane + 64 * j;
            if (e < head_dim) {
                float x0, y0, x1, y1;
                load_pair(v_cache + b0 + e, x0, y0);
                load_pair(v_cache + b1 + e, x1, y1);
                acc[2 * j] = fmaf(e1, x1, fmaf(e0, x0, acc[2 * j] * c));
                acc[2 * j + 1] = fmaf(e1, y1, fmaf(e0, y0, acc[2 * j + 1] * c));
            }
        }
        m = m_new;
    }
#pragma unroll
    for (int j = 0; j < ATT_PAIRS; ++j) {
        const int e = 2 * lane + 64 * j;
        if (e < head_dim) {
            s_acc[w][e] = acc[2 * j];
            s_acc[w][e + 1] = acc[2 * j + 1];
        }
    }
    if (lane == 0) {
        s_m[w] = m;
        s_l[w] = l;
    }
    __syncthreads();
    float mm = s_m[0];
#pragma unroll
    for (int i = 1; i < ATT_WARPS; ++i) mm = fmaxf(mm, s_m[i]);
    float ll = 0.f, f[ATT_WARPS];
#pragma unroll
    for (int i = 0; i < ATT_WARPS; ++i) {
        // A warp that saw no key has m = -inf and l = 0: its factor is 0.
        f[i] = s_l[i] > 0.f ? expf(s_m[i] - mm) : 0.f;
        ll += s_l[i] * f[i];
    }
    // No key in the window (only when one call writes more positions than
    // the ring holds, which the host refuses): zeros, not 0/0.
    const float inv = ll > 0.f ? kv_scale / ll : 0.f;
    for (int e = threadIdx.x; e < head_dim; e += ATT_THREADS) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_WARPS; ++i) t += s_acc[i][e] * f[i];
        store(o + e, t * inv);
    }
}

// LM, bf16 cache, bf16 output (feeds the out-projection GEMM).
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode_bf16(const float* __restrict__ qkv, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                 const RowInfo* __restrict__ rows, int dim, int kv_dim, int head_dim, int capacity, int context,
                 float scale, bf16* __restrict__ out) {
    attn_decode(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, scale, 1.f, out);
}

// LM, fp8 e4m3 cache (values stored / kv_scale), bf16 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode_fp8(const float* __restrict__ qkv, const __nv_fp8_e4m3* __restrict__ k_cache,
                const __nv_fp8_e4m3* __restrict__ v_cache, const RowInfo* __restrict__ rows, int dim, int kv_dim,
                int head_dim, int capacity, int context, float scale, float kv_scale, bf16* __restrict__ out) {
    attn_decode(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, scale, kv_scale, out);
}

// Mimi, f32 cache, f32 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode_f32(const float* __restrict__ qkv, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                const RowInfo* __restrict__ rows, int dim, int kv_dim, int head_dim, int capacity, int context,
                float scale, float* __restrict__ out) {
    attn_decode(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, scale, 1.f, out);
}

// Mimi, bf16 cache, f32 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode_bf16_f32out(const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
                        const bf16* __restrict__ v_cache, const RowInfo* __restrict__ rows, int dim, int kv_dim,
                        int head_dim, int capacity, int context, float scale, float* __restrict__ out) {
    attn_decode(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, scale, 1.f, out);
}

// The transformer rows of a call with t steps per slot-step (Mimi: t =
// downsample stride, one cache row per slot), built on the device from the
// SlotSteps and the per-slot stream positions, which it then advances, so
// that a captured graph replays correctly call after call. Row j·t + i:
//   kv = slot, pos = positions[slot] + i, last = positions[slot] + t − 1,
//   step = j, active = steps[j].active;
// then positions[slot] += t. Inactive steps get inactive rows (step = j,
// other fields 0) and leave every position alone. Active steps must name
// distinct slots. Launch it once per call, before the first layer (every
// layer reads the same rows). Geometry: grid = (ceil(n_steps / ROWS_THREADS)), block =
// ROWS_THREADS (128), a thread per step; no shared memory.
#define ROWS_THREADS 128

extern "C" __global__ void __launch_bounds__(ROWS_THREADS)
rows_from_steps(const SlotStep* __restrict__ steps, int n_steps, int t, int end_label,
                int* __restrict__ positions, RowInfo* __restrict__ rows) {
    const int j = blockIdx.x * ROWS_THREADS + threadIdx.x;
    if (j >= n_steps) return;
    const SlotStep st = steps[j];
    RowInfo* out = rows + (size_t)j * t;
    if (!st.active) {
        for (int i = 0; i < t; ++i) {
            RowInfo r;
            r.kv = 0; r.pos = 0; r.last = 0; r.step = j; r.active = 0;
            out[i] = r;
        }
        return;
    }
    const int p0 = positions[st.slot];
    for (int i = 0; i < t; ++i) {
        RowInfo r;
        r.kv = st.slot; r.pos = p0 + i; r.last = p0 + t - 1 + end_label; r.step = j; r.active = 1;
        out[i] = r;
    }
    positions[st.slot] = p0 + t;
}
