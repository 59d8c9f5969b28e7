// Attention over a short per-frame cache in one launch: the depformer's
// layers (at most SA_MAX_KEYS positions, one new position per row and call).
// CPU reference: model/src/lm/transformer.rs Stack::forward / attend; the
// same semantics as attention.cu's rope_kv_write followed by attn_decode
// (read that file's header for the layouts, the RoPE pairs, the ring and the
// window), fused:
// - the row's query and key are rotated (when `freqs` is given) and its key
//   and value stored at ring index pos % capacity, by the block of the first
//   query head of each key/value head;
// - the scores of the window's older positions read the cache (written by
//   earlier calls), the newest one the row's own key and value rounded
//   through the cache type, so nothing in the launch reads what it writes.
//   This needs one new position per row and call (last == pos), which the
//   host checks;
// - softmax in two passes over the ≤ SA_MAX_KEYS scores (kept in registers):
//   max, then exp and sum in position order; the output is Σ e_p·v_p / Σ e_p.
// Masked rows write nothing into the caches and output zeros.
//
// Geometry: grid = (ceil(heads / SA_WARPS), rows), block = SA_THREADS (128):
// warp w takes query head blockIdx.x · 4 + w; lane l the elements 2l, 2l + 1
// (+ 64 j) of the head (head_dim ≤ SA_MAX_HEAD_DIM). No shared memory.
#define SA_THREADS 128
#define SA_WARPS (SA_THREADS / 32)
#define SA_MAX_KEYS 32
#define SA_MAX_HEAD_DIM 256
#define SA_PAIRS (SA_MAX_HEAD_DIM / 64)

// Element e of head vector v (head_dim wide) after RoPE at `pos`, computed
// as rope_kv_write does (same pair, same products).
__device__ __forceinline__ float sa_rope(const float* __restrict__ v, int e, int head_dim, int interleaved,
                                         const float* __restrict__ freqs, float pos) {
    if (freqs == nullptr) return v[e];
    const int half = head_dim / 2;
    int j, i0, i1;
    bool first;
    if (interleaved) {
        j = e / 2;
        i0 = 2 * j;
        i1 = i0 + 1;
        first = (e & 1) == 0;
    } else {
        j = e % half;
        i0 = j;
        i1 = j + half;
        first = e < half;
    }
    const float a = v[i0], b = v[i1];
    float s, c;
    sincosf(freqs[j] * pos, &s, &c);
    return first ? a * c - b * s : a * s + b * c;
}

// x stored as KV and read back.
__device__ __forceinline__ float sa_through(float x, const float*) { return x; }
__device__ __forceinline__ float sa_through(float x, const bf16*) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <typename KV>
__device__ __forceinline__ void short_attn(const float* __restrict__ qkv, const float* __restrict__ freqs,
                                           const RowInfo* __restrict__ rows, KV* __restrict__ k_cache,
                                           KV* __restrict__ v_cache, int heads, int dim, int kv_dim, int head_dim,
                                           int capacity, int context, int interleaved, float scale,
                                           KV* __restrict__ out) {
    const int lane = threadIdx.x & 31, h = blockIdx.x * SA_WARPS + (threadIdx.x >> 5), r = blockIdx.y;
    if (h >= heads) return;
    const RowInfo ri = rows[r];
    KV* o = out + (size_t)r * dim + (size_t)h * head_dim;
    if (!ri.active) {
        for (int e = lane; e < head_dim; e += 32) store(o + e, 0.f);
        return;
    }
    const int repeat = dim / kv_dim, hk = h / repeat;
    const float* q = qkv + (size_t)r * (dim + 2 * kv_dim) + (size_t)h * head_dim;
    const float* kn = qkv + (size_t)r * (dim + 2 * kv_dim) + dim + (size_t)hk * head_dim;
    const float* vn = kn + kv_dim;
    const float pos = (float)ri.pos;
    const size_t row0 = (size_t)ri.kv * capacity, head0 = (size_t)hk * head_dim;
    const size_t slot = (row0 + (size_t)(ri.pos % capacity)) * kv_dim + head0;
    float qv[2 * SA_PAIRS], kv_new[2 * SA_PAIRS], vv_new[2 * SA_PAIRS];
#pragma unroll
    for (int j = 0; j < 2 * SA_PAIRS; ++j) {
        const int e = 2 * lane + 64 * (j / 2) + (j & 1);
        qv[j] = kv_new[j] = vv_new[j] = 0.f;
        if (e < head_dim) {
            qv[j] = sa_rope(q, e, head_dim, interleaved, freqs, pos);
            const float kr = sa_rope(kn, e, head_dim, interleaved, freqs, pos);
            if (h % repeat == 0) {
                store(k_cache + slot + e, kr);
                store(v_cache + slot + e, vn[e]);
            }
            kv_new[j] = sa_through(kr, k_cache);
            vv_new[j] = sa_through(vn[e], v_cache);
        }
    }
    int start = ri.pos + 1 - context;
    start = max(start, ri.last + 1 - capacity);
    start = max(start, 0);
    // Scores, oldest first; the newest position is the row's own key.
    float sc[SA_MAX_KEYS];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < SA_MAX_KEYS; ++i) {
        const int p = start + i;
        sc[i] = NEG_INF;
        if (p > ri.pos) continue;
        const size_t b = (row0 + (size_t)(p % capacity)) * kv_dim + head0;
        float d = 0.f;
#pragma unroll
        for (int j = 0; j < 2 * SA_PAIRS; ++j) {
            const int e = 2 * lane + 64 * (j / 2) + (j & 1);
            if (e < head_dim) d = fmaf(qv[j], p == ri.pos ? kv_new[j] : to_f32(k_cache[b + e]), d);
        }
        sc[i] = warp_sum(d) * scale;
        mx = fmaxf(mx, sc[i]);
    }
    float l = 0.f, acc[2 * SA_PAIRS];
#pragma unroll
    for (int j = 0; j < 2 * SA_PAIRS; ++j) acc[j] = 0.f;
#pragma unroll
    for (int i = 0; i < SA_MAX_KEYS; ++i) {
        const int p = start + i;
        if (p > ri.pos) continue;
        const float ew = expf(sc[i] - mx);
        l += ew;
        const size_t b = (row0 + (size_t)(p % capacity)) * kv_dim + head0;
#pragma unroll
        for (int j = 0; j < 2 * SA_PAIRS; ++j) {
            const int e = 2 * lane + 64 * (j / 2) + (j & 1);
            if (e < head_dim) acc[j] = fmaf(ew, p == ri.pos ? vv_new[j] : to_f32(v_cache[b + e]), acc[j]);
        }
    }
    const float inv = 1.f / l;
#pragma unroll
    for (int j = 0; j < 2 * SA_PAIRS; ++j) {
        const int e = 2 * lane + 64 * (j / 2) + (j & 1);
        if (e < head_dim) store(o + e, acc[j] * inv);
    }
}

// The exact-reference precision: f32 cache and output.
extern "C" __global__ void __launch_bounds__(SA_THREADS)
short_attn_f32(const float* __restrict__ qkv, const float* __restrict__ freqs, const RowInfo* __restrict__ rows,
               float* __restrict__ k_cache, float* __restrict__ v_cache, int heads, int dim, int kv_dim,
               int head_dim, int capacity, int context, int interleaved, float scale, float* __restrict__ out) {
    short_attn(qkv, freqs, rows, k_cache, v_cache, heads, dim, kv_dim, head_dim, capacity, context, interleaved,
               scale, out);
}

// Serving: bf16 cache, bf16 output (feeds the out-projection).
extern "C" __global__ void __launch_bounds__(SA_THREADS)
short_attn_bf16(const float* __restrict__ qkv, const float* __restrict__ freqs, const RowInfo* __restrict__ rows,
                bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int heads, int dim, int kv_dim,
                int head_dim, int capacity, int context, int interleaved, float scale, bf16* __restrict__ out) {
    short_attn(qkv, freqs, rows, k_cache, v_cache, heads, dim, kv_dim, head_dim, capacity, context, interleaved,
               scale, out);
}
