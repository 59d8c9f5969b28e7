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
// Head widths are multiples of ATT_VEC (8) up to ATT_MAX_HEAD_DIM.
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

// ---------------------------------------------------------------- attention
//
// Flash-Decoding over the ring: grid = (kv_heads · ceil(rep / ATT_HEADS_PER_BLOCK),
// rows, splits), block = ATT_THREADS (4 warps). A block takes one key/value
// head of one row and up to ATT_HEADS_PER_BLOCK of the query heads that
// share it (rep = dim / kv_dim query heads per key/value head: each key is
// read once for all of them), over split z of the row's window: the window's
// n keys cut into `splits` runs of ceil(n / splits). With one split the
// block normalises and writes the output; with more it writes its partial
// result — per query head the running max m (log2 domain), the sum l and
// the unnormalised accumulator — to `part`, [rows][heads][splits][head_dim + 2]
// f32 (accumulator, then m, then l), and attn_combine merges the splits.
//
// Inside a block: a key row of head_dim values is cut into head_dim / 8
// chunks of ATT_VEC = 8 values (one 16-byte load of bf16, 8 bytes of fp8,
// two 16-byte loads of f32); lpk lanes (head_dim / 8 rounded up to a power
// of two; lanes past the row idle) take one key, so a warp holds
// 32 / lpk keys per load and ATT_UNROLL loads of keys and values in flight
// per lane before it computes (AttRaw::unroll). Scores are reduced over the lpk lanes of a
// key by shuffles, the softmax runs online with a warp-wide running max
// (so lanes of different keys can sum their weighted values without
// rescaling), and the warps' results merge through shared memory:
// ATT_WARPS · ATT_HEADS_PER_BLOCK · (ATT_MAX_HEAD_DIM + 2) floats = 8 KiB.
//
// Numerics: scores are q·k · scale · kv_scale · log2(e) (qk_scale from the
// host) and weights exp2 of their difference to the running max, the
// official softmax up to rounding. fp8 e4m3 is widened four values per
// 32-bit word by bit moves alone (sign to bit 31, exponent and mantissa to
// bits 20..26: the f32 of the value times 2^-120, exact for normals and
// subnormals alike since --ftz=false; the host folds 2^120 into qk_scale
// and out_scale). NaN codes (0x7f, 0xff), which the cache never stores from
// finite values (writes saturate to ±448), would read as ±480.
#define ATT_VEC 8
#define ATT_HEADS_PER_BLOCK 2
#define ATT_UNROLL 4
#define ATT_MAX_SPLITS 32

// Loads ATT_VEC values of a cache row, raw (kept in registers until used).
struct AttRawF32 { float4 a, b; };
__device__ __forceinline__ AttRawF32 att_load(const float* p) {
    const float4* v = reinterpret_cast<const float4*>(p);
    AttRawF32 r;
    r.a = v[0];
    r.b = v[1];
    return r;
}
__device__ __forceinline__ uint4 att_load(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 att_load(const __nv_fp8_e4m3* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ AttRawF32 att_zero(const float*) {
    AttRawF32 r;
    r.a.x = r.a.y = r.a.z = r.a.w = r.b.x = r.b.y = r.b.z = r.b.w = 0.f;
    return r;
}
__device__ __forceinline__ uint4 att_zero(const bf16*) {
    uint4 r;
    r.x = r.y = r.z = r.w = 0u;
    return r;
}
__device__ __forceinline__ uint2 att_zero(const __nv_fp8_e4m3*) {
    uint2 r;
    r.x = r.y = 0u;
    return r;
}

// Widens raw values to f32 (fp8: times 2^-120, see above).
__device__ __forceinline__ void att_unpack(const AttRawF32& r, float* x) {
    x[0] = r.a.x; x[1] = r.a.y; x[2] = r.a.z; x[3] = r.a.w;
    x[4] = r.b.x; x[5] = r.b.y; x[6] = r.b.z; x[7] = r.b.w;
}
__device__ __forceinline__ void att_bf16x2(u32 w, float* x) {
    x[0] = __uint_as_float(w << 16);
    x[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void att_unpack(const uint4& r, float* x) {
    att_bf16x2(r.x, x);
    att_bf16x2(r.y, x + 2);
    att_bf16x2(r.z, x + 4);
    att_bf16x2(r.w, x + 6);
}
__device__ __forceinline__ void att_e4m3x4(u32 w, float* x) {
    x[0] = __uint_as_float(((w << 20) & 0x07f00000u) | ((w << 24) & 0x80000000u));
    x[1] = __uint_as_float(((w << 12) & 0x07f00000u) | ((w << 16) & 0x80000000u));
    x[2] = __uint_as_float(((w << 4) & 0x07f00000u) | ((w << 8) & 0x80000000u));
    x[3] = __uint_as_float(((w >> 4) & 0x07f00000u) | (w & 0x80000000u));
}
__device__ __forceinline__ void att_unpack(const uint2& r, float* x) {
    att_e4m3x4(r.x, x);
    att_e4m3x4(r.y, x + 4);
}

// The raw type of ATT_VEC values of KV, and how many keys' loads a lane
// keeps in flight: 4 × 2 × 16 bytes in bf16, the same bytes in fp8 (8 keys),
// 2 keys in f32 (Mimi and the exact mode, where registers, not bandwidth,
// are what is short).
template <typename KV> struct AttRaw;
template <> struct AttRaw<float> { typedef AttRawF32 T; static constexpr int unroll = 2; };
template <> struct AttRaw<bf16> { typedef uint4 T; static constexpr int unroll = ATT_UNROLL; };
template <> struct AttRaw<__nv_fp8_e4m3> { typedef uint2 T; static constexpr int unroll = 2 * ATT_UNROLL; };

// The first position of a row's window (see the file's head).
__device__ __forceinline__ int att_window_start(const RowInfo& ri, int context, int capacity) {
    return max(max(ri.pos + 1 - context, ri.last + 1 - capacity), 0);
}

// A lane's place in a block: lanes per key (a power of two), keys per warp
// load, its key slot and its chunk of the row.
struct AttGeom {
    int lpk, groups, g, c;
    bool has_chunk;
};

__device__ __forceinline__ AttGeom att_geom(int head_dim, int lane) {
    const int chunks = head_dim / ATT_VEC;
    AttGeom ge;
    ge.lpk = 1;
    while (ge.lpk < chunks) ge.lpk <<= 1;
    ge.groups = WARP / ge.lpk;
    ge.g = lane / ge.lpk;
    ge.c = lane % ge.lpk;
    ge.has_chunk = ge.c < chunks;
    return ge;
}

// A lane's running state per query head of the block: its chunk of the
// (scaled) query and of the accumulator; the warp's running max and the
// lane's key slot's running sum.
struct AttLane {
    float q[ATT_HEADS_PER_BLOCK][ATT_VEC], acc[ATT_HEADS_PER_BLOCK][ATT_VEC];
    float m[ATT_HEADS_PER_BLOCK], l[ATT_HEADS_PER_BLOCK];
};

// Where a split's keys live: positions [k0, k1) of cache row `row0 /
// capacity`, the first at ring index ring0; this lane's column.
struct AttKeys {
    int k0, k1, ring0, capacity, kv_dim;
    size_t row0, col;
};

// One round of a warp over keys base + u·groups + g (u < unroll): every load
// of keys and values first, then the scores and the online softmax.
template <typename KV>
__device__ __forceinline__ void att_round(const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
                                          const AttKeys& ks, const AttGeom& ge, int base, AttLane& st) {
    typedef typename AttRaw<KV>::T Raw;
    constexpr int UNROLL = AttRaw<KV>::unroll;
    Raw kr[UNROLL], vr[UNROLL];
    bool ok[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int p = base + u * ge.groups + ge.g;
        ok[u] = p < ks.k1;
        kr[u] = att_zero(k_cache);
        vr[u] = att_zero(v_cache);
        if (ok[u] && ge.has_chunk) {
            int idx = ks.ring0 + (p - ks.k0);
            if (idx >= ks.capacity) idx -= ks.capacity;
            const size_t at = (ks.row0 + (size_t)idx) * ks.kv_dim + ks.col;
            kr[u] = att_load(k_cache + at);
            vr[u] = att_load(v_cache + at);
        }
    }
    float s[UNROLL][ATT_HEADS_PER_BLOCK];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        float x[ATT_VEC];
        att_unpack(kr[u], x);
#pragma unroll
        for (int j = 0; j < ATT_HEADS_PER_BLOCK; ++j) {
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < ATT_VEC; ++i) d = fmaf(st.q[j][i], x[i], d);
            for (int o = ge.lpk >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            s[u][j] = ok[u] ? d : NEG_INF;
        }
    }
#pragma unroll
    for (int j = 0; j < ATT_HEADS_PER_BLOCK; ++j) {
        float mx = s[0][j];
#pragma unroll
        for (int u = 1; u < UNROLL; ++u) mx = fmaxf(mx, s[u][j]);
        for (int o = ge.lpk; o < WARP; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(st.m[j], mx);
        if (m_new == NEG_INF) continue;  // no key yet (uniform over the warp)
        const float corr = exp2f(st.m[j] - m_new);
        st.l[j] *= corr;
#pragma unroll
        for (int i = 0; i < ATT_VEC; ++i) st.acc[j][i] *= corr;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const float pw = exp2f(s[u][j] - m_new);
            float x[ATT_VEC];
            att_unpack(vr[u], x);
            st.l[j] += pw;
#pragma unroll
            for (int i = 0; i < ATT_VEC; ++i) st.acc[j][i] = fmaf(pw, x[i], st.acc[j][i]);
        }
        st.m[j] = m_new;
    }
}

// The block's shared memory for merging its warps.
struct AttShared {
    float acc[ATT_WARPS][ATT_HEADS_PER_BLOCK][ATT_MAX_HEAD_DIM];
    float m[ATT_WARPS][ATT_HEADS_PER_BLOCK], l[ATT_WARPS][ATT_HEADS_PER_BLOCK];
};

// Merges a warp's key slots (one running max per warp: plain sums) into
// shared memory; after the barrier, merges the warps and writes the `nh`
// heads from h0 of row r: the output (one split) or split z's partial result.
template <typename OUT>
__device__ __forceinline__ void att_finish(AttLane& st, const AttGeom& ge, AttShared& sh, int nh, int h0, int r,
                                           int dim, int head_dim, float out_scale, float* __restrict__ part,
                                           OUT* __restrict__ out) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int z = blockIdx.z, splits = gridDim.z, heads = dim / head_dim;
#pragma unroll
    for (int j = 0; j < ATT_HEADS_PER_BLOCK; ++j) {
        for (int o = ge.lpk; o < WARP; o <<= 1) {
            st.l[j] += __shfl_xor_sync(0xffffffffu, st.l[j], o);
#pragma unroll
            for (int i = 0; i < ATT_VEC; ++i) st.acc[j][i] += __shfl_xor_sync(0xffffffffu, st.acc[j][i], o);
        }
        if (ge.g == 0 && ge.has_chunk) {
#pragma unroll
            for (int i = 0; i < ATT_VEC; ++i) sh.acc[w][j][ge.c * ATT_VEC + i] = st.acc[j][i];
        }
        if (lane == 0) {
            sh.m[w][j] = st.m[j];
            sh.l[w][j] = st.l[j];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < nh * head_dim; t += ATT_THREADS) {
        const int j = t / head_dim, e = t % head_dim;
        float mm = NEG_INF;
#pragma unroll
        for (int i = 0; i < ATT_WARPS; ++i) mm = fmaxf(mm, sh.m[i][j]);
        float ll = 0.f, a = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_WARPS; ++i) {
            // A warp that saw no key has m = -inf and l = 0: factor 0.
            const float f = sh.l[i][j] > 0.f ? exp2f(sh.m[i][j] - mm) : 0.f;
            ll += sh.l[i][j] * f;
            a += sh.acc[i][j][e] * f;
        }
        const int h = h0 + j;
        if (splits == 1) {
            // No key in the window (only when one call writes more positions
            // than the ring holds, which the host refuses): zeros, not 0/0.
            store(out + (size_t)r * dim + (size_t)h * head_dim + e, ll > 0.f ? a * (out_scale / ll) : 0.f);
        } else {
            float* pp = part + (((size_t)r * heads + h) * splits + z) * (head_dim + 2);
            pp[e] = a;
            if (e == 0) {
                pp[head_dim] = mm;
                pp[head_dim + 1] = ll;
            }
        }
    }
}

template <typename KV, typename OUT>
__device__ __forceinline__ void attn_split(const float* __restrict__ qkv, const KV* __restrict__ k_cache,
                                           const KV* __restrict__ v_cache, const RowInfo* __restrict__ rows,
                                           int dim, int kv_dim, int head_dim, int capacity, int context,
                                           float qk_scale, float out_scale, float* __restrict__ part,
                                           OUT* __restrict__ out) {
    __shared__ AttShared sh;
    const int rep = dim / kv_dim, hblocks = (rep + ATT_HEADS_PER_BLOCK - 1) / ATT_HEADS_PER_BLOCK;
    const int kvh = blockIdx.x / hblocks, h0 = kvh * rep + (blockIdx.x % hblocks) * ATT_HEADS_PER_BLOCK;
    const int nh = min(ATT_HEADS_PER_BLOCK, kvh * rep + rep - h0);
    const int r = blockIdx.y, z = blockIdx.z, splits = gridDim.z;
    const RowInfo ri = rows[r];
    if (!ri.active) {
        if (splits == 1) {
            for (int i = threadIdx.x; i < nh * head_dim; i += ATT_THREADS)
                store(out + (size_t)r * dim + (size_t)h0 * head_dim + i, 0.f);
        }
        return;
    }
    // This split's keys: positions [k0, k1).
    const int start = att_window_start(ri, context, capacity);
    const int n = max(ri.pos + 1 - start, 0), per = (n + splits - 1) / splits;
    AttKeys ks;
    ks.k0 = start + z * per;
    ks.k1 = min(ks.k0 + per, ri.pos + 1);
    ks.ring0 = ks.k0 % capacity;
    ks.capacity = capacity;
    ks.kv_dim = kv_dim;
    const AttGeom ge = att_geom(head_dim, threadIdx.x & 31);
    ks.row0 = (size_t)ri.kv * capacity;
    ks.col = (size_t)kvh * head_dim + (size_t)ge.c * ATT_VEC;
    AttLane st;
    const float* qrow = qkv + (size_t)r * (dim + 2 * kv_dim);
#pragma unroll
    for (int j = 0; j < ATT_HEADS_PER_BLOCK; ++j) {
        st.m[j] = NEG_INF;
        st.l[j] = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_VEC; ++i) {
            const bool mine = j < nh && ge.has_chunk;
            st.q[j][i] = mine ? qrow[(size_t)(h0 + j) * head_dim + ge.c * ATT_VEC + i] * qk_scale : 0.f;
            st.acc[j][i] = 0.f;
        }
    }
    const int step = ge.groups * AttRaw<KV>::unroll, w = threadIdx.x >> 5;
    for (int base = ks.k0 + w * step; base < ks.k1; base += ATT_WARPS * step)
        att_round(k_cache, v_cache, ks, ge, base, st);
    att_finish(st, ge, sh, nh, h0, r, dim, head_dim, out_scale, part, out);
}

// LM, bf16 cache, bf16 output (feeds the out-projection GEMM).
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_split_bf16(const float* __restrict__ qkv, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                const RowInfo* __restrict__ rows, int dim, int kv_dim, int head_dim, int capacity, int context,
                float qk_scale, float out_scale, float* __restrict__ part, bf16* __restrict__ out) {
    attn_split(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, qk_scale, out_scale, part,
               out);
}

// LM, fp8 e4m3 cache (values stored / kv_scale), bf16 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_split_fp8(const float* __restrict__ qkv, const __nv_fp8_e4m3* __restrict__ k_cache,
               const __nv_fp8_e4m3* __restrict__ v_cache, const RowInfo* __restrict__ rows, int dim, int kv_dim,
               int head_dim, int capacity, int context, float qk_scale, float out_scale, float* __restrict__ part,
               bf16* __restrict__ out) {
    attn_split(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, qk_scale, out_scale, part,
               out);
}

// Mimi and the exact LM mode, f32 cache, f32 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_split_f32(const float* __restrict__ qkv, const float* __restrict__ k_cache, const float* __restrict__ v_cache,
               const RowInfo* __restrict__ rows, int dim, int kv_dim, int head_dim, int capacity, int context,
               float qk_scale, float out_scale, float* __restrict__ part, float* __restrict__ out) {
    attn_split(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, qk_scale, out_scale, part,
               out);
}

// Mimi, bf16 cache, f32 output.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_split_bf16_f32out(const float* __restrict__ qkv, const bf16* __restrict__ k_cache,
                       const bf16* __restrict__ v_cache, const RowInfo* __restrict__ rows, int dim, int kv_dim,
                       int head_dim, int capacity, int context, float qk_scale, float out_scale,
                       float* __restrict__ part, float* __restrict__ out) {
    attn_split(qkv, k_cache, v_cache, rows, dim, kv_dim, head_dim, capacity, context, qk_scale, out_scale, part,
               out);
}

// Merges the splits of attn_split (more than one): grid = (heads, rows),
// block = ATT_THREADS, a thread per output element. Splits that saw no key
// (l = 0) weigh nothing; a row with no key at all, or an inactive row, gets
// zeros.
template <typename OUT>
__device__ __forceinline__ void attn_combine(const float* __restrict__ part, const RowInfo* __restrict__ rows,
                                             int dim, int head_dim, int splits, float out_scale,
                                             OUT* __restrict__ out) {
    const int h = blockIdx.x, r = blockIdx.y, heads = dim / head_dim, stride = head_dim + 2;
    OUT* o = out + (size_t)r * dim + (size_t)h * head_dim;
    if (!rows[r].active) {
        for (int e = threadIdx.x; e < head_dim; e += ATT_THREADS) store(o + e, 0.f);
        return;
    }
    const float* pp = part + ((size_t)r * heads + h) * splits * stride;
    float mm = NEG_INF;
    for (int s = 0; s < splits; ++s)
        if (pp[s * stride + head_dim + 1] > 0.f) mm = fmaxf(mm, pp[s * stride + head_dim]);
    for (int e = threadIdx.x; e < head_dim; e += ATT_THREADS) {
        float ll = 0.f, a = 0.f;
        for (int s = 0; s < splits; ++s) {
            const float l = pp[s * stride + head_dim + 1];
            if (l > 0.f) {
                const float f = exp2f(pp[s * stride + head_dim] - mm);
                ll += l * f;
                a += pp[s * stride + e] * f;
            }
        }
        store(o + e, ll > 0.f ? a * (out_scale / ll) : 0.f);
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_combine_bf16(const float* __restrict__ part, const RowInfo* __restrict__ rows, int dim, int head_dim,
                  int splits, float out_scale, bf16* __restrict__ out) {
    attn_combine(part, rows, dim, head_dim, splits, out_scale, out);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_combine_f32(const float* __restrict__ part, const RowInfo* __restrict__ rows, int dim, int head_dim,
                 int splits, float out_scale, float* __restrict__ out) {
    attn_combine(part, rows, dim, head_dim, splits, out_scale, out);
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
