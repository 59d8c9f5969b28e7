// Matrix-vector products for a few rows (M ≤ GV_MAX_ROWS): the LM's
// projections at small batches, where a GEMM streams its weights once and
// the time is the weight bytes over the memory bandwidth. CPU reference: the
// GEMM of model/src/ops.rs (y = x · Wᵀ) with the input transforms of
// norm.cu (rms_norm) and elementwise.cu (silu_gate, f32_to_bf16) applied on
// the fly.
//
// y[m][n] (+)= Σ_k x'[m][k] · w[n][k] for m < M, n < N; w is [N][K] (the
// nn.Linear layout) of T (bf16, or f32 in the exact-reference precision); y
// is f32 [M][N], overwritten or accumulated into (the residual stream).
// x' is the GEMM input the separate kernels would have written, rounded to
// T as they store it:
// - plain: x is [M][K] of T;
// - cast:  x is [M][K] f32, x' = T(x) (the depformer heads' input, bf16);
// - rms:   x is the f32 residual stream [M][K], x' = T(x · (alpha · inv))
//          with inv = 1 / sqrt(Σ x² / K + eps), the sum taken exactly as
//          rms_norm's (same block size, same strides, same tree), so x' is
//          bit for bit the norm kernel's output; rows whose RowInfo is
//          inactive get x' = 0 (rows may be null: all active);
// - silu:  x is the gated FFN's [M][2K] f32, x' = T(silu(x[k]) · x[K + k])
//          as silu_gate.
//
// Geometry: block = GV_THREADS (256) threads in groups of nt, nt the power
// of two that covers one pass over K in 16-byte chunks, between 32 and 256
// (a function of K only); grid = (ceil(N / (GV_COLS · 256 / nt))). Each
// group computes GV_COLS (4) columns for every row: its thread t takes the
// chunks t, t + nt, … of 16 bytes of each weight row (8 bf16 or 4 f32: a
// group reads up to 4 KiB of a row per step, in whole lines), multiplies
// them with the same chunk of each x' row, and keeps M × 4 running sums (M ≤
// 2 or ≤ 8 by the kernel's name, so that the one-row case keeps few
// registers). The sums are added through shared memory, 32 threads at a
// time in thread order and then those sums in order, so every output's
// summation order depends on K only: a row's result does not depend on the
// other rows of the call. Shared memory: M · 4 · 8 · 33 + 264 floats (9
// KiB for M ≤ 2, 34 KiB for M ≤ 8). Needs K % 8 == 0 (16-byte aligned rows); the host takes cuBLAS
// otherwise and above GV_MAX_ROWS rows.
#define GV_THREADS 256
#define GV_WARPS (GV_THREADS / 32)
#define GV_COLS 4
#define GV_MAX_ROWS 8

#define GV_PLAIN 0
#define GV_CAST 1
#define GV_RMS 2
#define GV_SILU 3

// Sixteen bytes moved as one access.
struct alignas(16) gv_u4 {
    u32 v[4];
};

// The E = 16 / sizeof(T) values of T at p (16-byte aligned) as f32.
__device__ __forceinline__ void gv_load(const bf16* p, float* out) {
    const gv_u4 q = *reinterpret_cast<const gv_u4*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(q.v[i] << 16);
        out[2 * i + 1] = __uint_as_float(q.v[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void gv_load(const float* p, float* out) {
    const gv_u4 q = *reinterpret_cast<const gv_u4*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(q.v[i]);
}

// n floats at p (16-byte aligned, n a multiple of 4).
template <int N>
__device__ __forceinline__ void gv_floats(const float* p, float* out) {
#pragma unroll
    for (int i = 0; i < N; i += 4) gv_load(p + i, out + i);
}

// x rounded to T, back as f32 (what a GEMM reading a stored T sees).
__device__ __forceinline__ float gv_round(float x, const bf16*) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ float gv_round(float x, const float*) { return x; }

template <typename T, int PRO, int MAXR>
__device__ __forceinline__ void gemv(const void* __restrict__ xv, const T* __restrict__ w,
                                     const float* __restrict__ alpha, const RowInfo* __restrict__ rows, float eps,
                                     int m_rows, int n_cols, int k_len, int nt, int accumulate,
                                     float* __restrict__ y) {
    // part holds each thread's sums, a 32-thread segment per 33-float line
    // (the padding puts the segments a reader warp walks in distinct banks).
    constexpr int E = 16 / (int)sizeof(T), V = MAXR * GV_COLS;
    __shared__ float part[MAXR * GV_COLS * GV_WARPS * 33];
    __shared__ float wsum[GV_MAX_ROWS * GV_COLS * GV_WARPS];
    __shared__ float red[GV_WARPS];
    __shared__ float s_inv[GV_MAX_ROWS];
    __shared__ int s_live[GV_MAX_ROWS];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    // Group g of nt threads takes columns n0 .. n0 + 3; t is its thread.
    const int g = tid / nt, t = tid % nt, groups = GV_THREADS / nt;
    const int n0 = (blockIdx.x * groups + g) * GV_COLS;
    const float* xf = static_cast<const float*>(xv);
    const T* xt = static_cast<const T*>(xv);

    if (PRO == GV_RMS) {
        // Σ x² per row as rms_norm_row (256 threads, the same strides,
        // warp tree and warp order).
        for (int m = 0; m < MAXR && m < m_rows; ++m) {
            const float* xr = xf + (size_t)m * k_len;
            float sq = 0.f;
            for (int i = tid; i < k_len; i += GV_THREADS) sq += xr[i] * xr[i];
            sq = warp_sum(sq);
            if (lane == 0) red[wid] = sq;
            __syncthreads();
            if (tid == 0) {
                float tot = 0.f;
#pragma unroll
                for (int i = 0; i < GV_WARPS; ++i) tot += red[i];
                s_live[m] = rows == nullptr || rows[m].active;
                s_inv[m] = 1.f / sqrtf(tot / (float)k_len + eps);
            }
            __syncthreads();
        }
    }

    float acc[MAXR][GV_COLS];
#pragma unroll
    for (int m = 0; m < MAXR; ++m)
#pragma unroll
        for (int c = 0; c < GV_COLS; ++c) acc[m][c] = 0.f;
    for (int k = t * E; k < k_len; k += nt * E) {
        float wv[GV_COLS][E];
#pragma unroll
        for (int c = 0; c < GV_COLS; ++c) {
            if (n0 + c < n_cols)
                gv_load(w + (size_t)(n0 + c) * k_len + k, wv[c]);
            else
#pragma unroll
                for (int e = 0; e < E; ++e) wv[c][e] = 0.f;
        }
#pragma unroll
        for (int m = 0; m < MAXR; ++m) {
            if (m >= m_rows) break;
            float xe[E];
            if (PRO == GV_PLAIN) {
                gv_load(xt + (size_t)m * k_len + k, xe);
            } else if (PRO == GV_CAST) {
                gv_floats<E>(xf + (size_t)m * k_len + k, xe);
#pragma unroll
                for (int e = 0; e < E; ++e) xe[e] = gv_round(xe[e], w);
            } else if (PRO == GV_RMS) {
                float al[E];
                gv_floats<E>(xf + (size_t)m * k_len + k, xe);
                gv_floats<E>(alpha + k, al);
                const float inv = s_inv[m];
                const bool live = s_live[m] != 0;
#pragma unroll
                for (int e = 0; e < E; ++e) xe[e] = live ? gv_round(xe[e] * (al[e] * inv), w) : 0.f;
            } else {
                float gt[E];
                gv_floats<E>(xf + (size_t)m * 2 * k_len + k, gt);
                gv_floats<E>(xf + (size_t)m * 2 * k_len + k_len + k, xe);
#pragma unroll
                for (int e = 0; e < E; ++e) xe[e] = gv_round(gt[e] / (1.f + expf(-gt[e])) * xe[e], w);
            }
#pragma unroll
            for (int c = 0; c < GV_COLS; ++c)
#pragma unroll
                for (int e = 0; e < E; ++e) acc[m][c] += xe[e] * wv[c][e];
        }
    }
    // The group's partial sums of each output, added 32 threads at a time
    // in thread order, then those sums in order (through shared memory: a
    // few barriers instead of a shuffle tree per output).
#pragma unroll
    for (int m = 0; m < MAXR; ++m)
#pragma unroll
        for (int c = 0; c < GV_COLS; ++c) part[((m * GV_COLS + c) * GV_WARPS + wid) * 33 + lane] = acc[m][c];
    __syncthreads();
    const int seg = nt / 32;  // 32-thread segments per group
    for (int i = tid; i < V * groups * seg; i += GV_THREADS) {
        // Segment gs of value v: threads 32·gs .. 32·gs + 31 (group gs / seg).
        const int v = i / (groups * seg), gs = i % (groups * seg);
        const float* p = &part[(v * GV_WARPS + gs) * 33];
        float s = 0.f;
#pragma unroll
        for (int l = 0; l < 32; ++l) s += p[l];
        wsum[i] = s;
    }
    __syncthreads();
    for (int i = tid; i < V * groups; i += GV_THREADS) {
        const int v = i / groups, gg = i % groups, m = v / GV_COLS, c = v % GV_COLS;
        const int n = (blockIdx.x * groups + gg) * GV_COLS + c;
        if (m >= m_rows || n >= n_cols) continue;
        float s = 0.f;
        for (int j = 0; j < seg; ++j) s += wsum[(v * groups + gg) * seg + j];
        float* dst = y + (size_t)m * n_cols + n;
        *dst = accumulate ? *dst + s : s;
    }
}

// The kernels: gemv_<weights>[_<transform>]_x<most rows>. Parameters: x
// (T or f32 by the transform), w, alpha (rms only, else null), rows
// (RowInfo per row or null; rms only), eps, M, N, K, the group size nt,
// accumulate, y.
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_x2(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
             const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
             float* __restrict__ y) {
    gemv<bf16, GV_PLAIN, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_x8(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
             const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
             float* __restrict__ y) {
    gemv<bf16, GV_PLAIN, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_cast_x2(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                  const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                  float* __restrict__ y) {
    gemv<bf16, GV_CAST, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_cast_x8(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                  const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                  float* __restrict__ y) {
    gemv<bf16, GV_CAST, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_rms_x2(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                 const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                 float* __restrict__ y) {
    gemv<bf16, GV_RMS, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_rms_x8(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                 const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                 float* __restrict__ y) {
    gemv<bf16, GV_RMS, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_silu_x2(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                  const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                  float* __restrict__ y) {
    gemv<bf16, GV_SILU, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_bf16_silu_x8(const float* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ alpha,
                  const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                  float* __restrict__ y) {
    gemv<bf16, GV_SILU, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_x2(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
            const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
            float* __restrict__ y) {
    gemv<float, GV_PLAIN, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_x8(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
            const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
            float* __restrict__ y) {
    gemv<float, GV_PLAIN, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_rms_x2(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
                const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                float* __restrict__ y) {
    gemv<float, GV_RMS, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_rms_x8(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
                const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                float* __restrict__ y) {
    gemv<float, GV_RMS, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_silu_x2(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
                 const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                 float* __restrict__ y) {
    gemv<float, GV_SILU, 2>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
extern "C" __global__ void __launch_bounds__(GV_THREADS)
gemv_f32_silu_x8(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ alpha,
                 const RowInfo* __restrict__ rows, float eps, int m_rows, int n_cols, int k_len, int group, int accumulate,
                 float* __restrict__ y) {
    gemv<float, GV_SILU, 8>(x, w, alpha, rows, eps, m_rows, n_cols, k_len, group, accumulate, y);
}
