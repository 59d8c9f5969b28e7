// Mimi's streaming convolutions with per-slot state (CPU reference:
// model/src/mimi/conv.rs StreamingConv1d / StreamingConvTr1d, resample.rs).
//
// Activations are time-major, one row block per slot-step j of the batch:
// x[j][t][c]. Per-slot state lives in [max_slots][…] buffers indexed by
// SlotStep::slot; masked steps neither read nor write state and get zero
// outputs. Device weight layouts (reordered on upload so that consecutive
// threads, which own consecutive output channels, read consecutive weights):
// - conv:   [kernel][c_in][c_out]  (checkpoint [c_out][c_in][kernel]);
// - convtr: [kernel][c_in][c_out]  (checkpoint [c_in][c_out][kernel]);
// - depthwise convtr: [c][kernel]  (checkpoint [c][1][kernel], unchanged).
//
// conv1d: history = (kernel − 1)·dilation + 1 − stride input steps are kept
// per slot (prev[slot][history][c_in]); a call sees prev ++ x and produces
// t_in / stride outputs without padding. Replicate padding (the learnt
// down-sampler) fills a fresh slot's history with its first input step.
// convtr1d: the call's full output has t_in·stride + overlap steps
// (overlap = kernel − stride); its first `overlap` steps add the previous
// call's tail (partial[slot][overlap][c_out], without bias); its last
// `overlap` steps become the new tail, computed as (acc + bias) − bias like
// the reference. The new tail goes to a per-batch scratch (`tail`) first and
// is copied into the slot state by convtr1d_state_update, because other
// blocks of the same launch still read the old tail.
//
// Two ways of computing the products, chosen by the host per layer:
// - the implicit GEMM (conv_gemm, below the direct kernels): rows are the
//   output steps of every slot-step (per phase of a transposed conv),
//   columns the output channels, the reduction runs over (tap, input
//   channel) and reads the im2col matrix straight from prev ++ x (or x) and
//   the weights as they are laid out; for layers with c_out ≥ 8;
// - the direct kernels (conv1d_stream): each thread CONV_TT outputs of one
//   channel, for the narrow layers (the 1-channel output conv), where a
//   64-column tile would be mostly empty.
// Both can apply ELU to every input they read (the SEANet ELU before a conv,
// fused: the state keeps the raw input, and elu(0) = 0 for a fresh slot) and
// add a residual to every output (`res`, laid out as y: y = res + (conv +
// bias), the SEANet skip; y may be res).
//
// Direct kernels' geometry: block = CONV_THREADS (128) threads. The dense
// products give each thread CONV_TT outputs of one channel that use the same
// weights (consecutive output steps), so each weight read from L2 serves
// CONV_TT outputs, and flatten (channel, group of outputs) over the threads
// so that narrow layers fill every warp: grid = (ceil(c_out · groups / 128),
// n_steps), channels fastest (a warp reads consecutive weights and
// broadcasts its inputs). Each output accumulates in ascending (tap, input
// channel) order, as the CPU reference. Depthwise convtr: grid = (ceil(c /
// 128), output steps, n_steps), a thread per channel. State kernels: grid =
// (n_steps). No shared memory.
#define CONV_THREADS 128
#define CONV_TT 4

extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_stream(const float* __restrict__ x, const float* __restrict__ prev, const float* __restrict__ w,
              const float* __restrict__ bias, const float* res, const SlotStep* __restrict__ steps, int c_in,
              int c_out, int kernel, int stride, int dilation, int t_in, int history, int elu, float* y) {
    const int t_out = t_in / stride;
    const int groups = (t_out + CONV_TT - 1) / CONV_TT;
    const int g = blockIdx.x * CONV_THREADS + threadIdx.x, j = blockIdx.y;
    if (g >= c_out * groups) return;
    const int o = g % c_out, t0 = (g / c_out) * CONV_TT;
    const int n = min(CONV_TT, t_out - t0);
    float* yo = y + ((size_t)j * t_out + t0) * c_out + o;
    const SlotStep st = steps[j];
    if (!st.active) {
        for (int u = 0; u < n; ++u) yo[(size_t)u * c_out] = 0.f;
        return;
    }
    const float* xj = x + (size_t)j * t_in * c_in;
    const float* pj = prev + (size_t)st.slot * history * c_in;
    float acc[CONV_TT];
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) acc[u] = 0.f;
    for (int k = 0; k < kernel; ++k) {
        const float* src[CONV_TT];
#pragma unroll
        for (int u = 0; u < CONV_TT; ++u) {
            // Outputs past the end (u >= n) read step t0's inputs, dropped.
            const int v = (t0 + (u < n ? u : 0)) * stride + k * dilation;
            src[u] = v < history ? pj + (size_t)v * c_in : xj + (size_t)(v - history) * c_in;
        }
        const float* wk = w + (size_t)k * c_in * c_out + o;
        for (int i = 0; i < c_in; ++i) {
            const float wv = wk[(size_t)i * c_out];
#pragma unroll
            for (int u = 0; u < CONV_TT; ++u) acc[u] += (elu ? elu1(src[u][i]) : src[u][i]) * wv;
        }
    }
    const float b = bias != nullptr ? bias[o] : 0.f;
    const float* ro = res != nullptr ? res + ((size_t)j * t_out + t0) * c_out + o : nullptr;
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) {
        if (u >= n) continue;
        const float v = bias != nullptr ? acc[u] + b : acc[u];
        yo[(size_t)u * c_out] = ro != nullptr ? ro[(size_t)u * c_out] + v : v;
    }
}

// Before conv1d_stream of a replicate-padded conv: a slot whose first[slot]
// is set gets its history filled with its first input step.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_replicate_pad(const float* __restrict__ x, float* __restrict__ prev, const int* __restrict__ first,
                     const SlotStep* __restrict__ steps, int c_in, int t_in, int history) {
    const SlotStep st = steps[blockIdx.x];
    if (!st.active || !first[st.slot]) return;
    const float* x0 = x + (size_t)blockIdx.x * t_in * c_in;
    float* pj = prev + (size_t)st.slot * history * c_in;
    for (int e = threadIdx.x; e < history * c_in; e += CONV_THREADS) pj[e] = x0[e % c_in];
}

// After conv1d_stream: prev ← the last `history` steps of prev ++ x, i.e.
// new prev[v] = (prev ++ x)[t_in + v]. In place: the block walks the state in
// ascending chunks, reading a chunk's sources (all at higher indices) before
// a barrier and writing after it. Clears first[slot] when `first` is given.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_state_update(const float* __restrict__ x, float* __restrict__ prev, int* __restrict__ first,
                    const SlotStep* __restrict__ steps, int c_in, int t_in, int history) {
    const SlotStep st = steps[blockIdx.x];
    if (!st.active) return;
    const float* xj = x + (size_t)blockIdx.x * t_in * c_in;
    float* pj = prev + (size_t)st.slot * history * c_in;
    const int total = history * c_in;
    for (int c0 = 0; c0 < total; c0 += CONV_THREADS) {
        const int e = c0 + threadIdx.x;
        // Threads past the end read the last element and drop it, so that no
        // branch precedes the barrier (a host compiler would otherwise
        // duplicate the barrier into both arms, which the emulator reports).
        const int u = min(e, total - 1) + t_in * c_in;  // flat index into prev ++ x
        const float v = u < total ? pj[u] : xj[u - total];
        __syncthreads();
        if (e < total) pj[e] = v;
        __syncthreads();
    }
    if (first != nullptr && threadIdx.x == 0) first[st.slot] = 0;
}

// Depthwise (groups = channels) transposed conv: the learnt up-sampler.
// Same output split as convtr1d_stream; w is [c][kernel].
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
convtr1d_dw_stream(const float* __restrict__ x, const float* __restrict__ partial, const float* __restrict__ w,
                   const float* __restrict__ bias, const SlotStep* __restrict__ steps, int channels, int kernel,
                   int stride, int t_in, float* __restrict__ y, float* __restrict__ tail) {
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    const int r = blockIdx.y, j = blockIdx.z;
    const int t_out = t_in * stride, overlap = kernel - stride;
    if (c >= channels) return;
    const SlotStep st = steps[j];
    if (!st.active) {
        if (r < t_out) y[((size_t)j * t_out + r) * channels + c] = 0.f;
        return;
    }
    float acc = 0.f;
    if (r < overlap) acc = partial[((size_t)st.slot * overlap + r) * channels + c];
    for (int t = 0; t < t_in; ++t) {
        const int kk = r - t * stride;
        if (kk < 0 || kk >= kernel) continue;
        acc += x[((size_t)j * t_in + t) * channels + c] * w[(size_t)c * kernel + kk];
    }
    const float b = bias != nullptr ? bias[c] : 0.f;
    if (r < t_out)
        y[((size_t)j * t_out + r) * channels + c] = acc + b;
    else
        tail[((size_t)j * overlap + (r - t_out)) * channels + c] = (acc + b) - b;
}

// After a transposed conv: partial[slot] ← tail[j] (overlap · c_out floats).
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
convtr1d_state_update(const float* __restrict__ tail, float* __restrict__ partial,
                      const SlotStep* __restrict__ steps, int n) {
    const SlotStep st = steps[blockIdx.x];
    if (!st.active) return;
    const float* src = tail + (size_t)blockIdx.x * n;
    float* dst = partial + (size_t)st.slot * n;
    for (int e = threadIdx.x; e < n; e += CONV_THREADS) dst[e] = src[e];
}

// ---------------------------------------------------------------- implicit GEMM
//
// conv1d: row r = j·t_out + t (slot-step j, output step t), column o, and
// the reduction index kk = tap·c_in + i reads (prev ++ x_j)[t·stride +
// tap·dilation][i] and w[tap][i][o] (w is then the [K][c_out] matrix as
// laid out). Transposed conv: the outputs of phase p = r_out mod stride,
// q = r_out div stride (0 ≤ q < ceil((t_out + overlap) / stride)), meet
// input t = q − m through tap p + stride·m; per phase, row r = j·q_count + q
// and kk = mi·c_in + i with m = taps_p − 1 − mi (ascending input step), so
// A reads x_j[q − m][i] (zero outside the call's input) and B the weight row
// (p + stride·m)·c_in + i.
//
// Each output is one running sum over its split's range of kk in ascending
// order (the whole range with one split). With s splits (the host picks s
// from the layer's shape and the steps per slot, never from the batch size,
// so a stream's numbers do not depend on the batch it is in) each block
// writes its partial sums to part[split][phase][row][c_out] and
// conv_gemm_reduce adds them in split order, then applies the epilogue: the
// same one conv_gemm applies itself with one split.
//
// Geometry: block = CG_THREADS (128) threads, a BM × CG_BN tile of outputs
// (BM = CG_BM = 32: conv_gemm; CG_BM_TALL = 64: conv_gemm_tall, for layers
// with many rows per slot-step), thread (ty, tx) = (tid / 16, tid % 16) the
// BM/8 × 4 outputs rows (BM/8)·ty.., columns 4·tx..; grid = (ceil(c_out /
// 64), phases · ceil(rows / BM), splits). The reduction walks CG_BK (32) at
// a time through shared memory (A as [kk][row], BM + 4 floats a line so
// that the 16-byte reads stay aligned and a warp's stores of 32 consecutive
// kk fall on 8 banks, not 1; B as [kk][col]), loaded from global memory in
// whole lines (consecutive threads: consecutive kk of a row, consecutive
// columns of B), the next slice into registers while the current one is
// used. Shared memory: 32 · (BM + 4) + 32 · 64 floats (12.5 or 16.5 KiB).
// Each output's order is the same in both tile sizes.
// conv_gemm_reduce: a grid-stride loop over phases · rows · c_out,
// block = CG_RED_THREADS (256), no shared memory.
#define CG_THREADS 128
#define CG_BM 32
#define CG_BM_TALL 64
#define CG_BN 64
#define CG_BK 32
#define CG_BU (CG_BK * CG_BN / CG_THREADS)  // B values a thread loads per slice
#define CG_RED_THREADS 256

// Four floats moved as one 16-byte access (float4 without the CUDA header).
struct alignas(16) cg_f4 {
    float v[4];
};

// Where the outputs of one conv_gemm go and what the epilogue adds.
struct CgOut {
    const float* bias;     // [c_out] or null
    const float* res;      // conv1d: [n][t_out][c_out] or null
    const float* partial;  // convtr: the old tails [max_slots][overlap][c_out]
    const SlotStep* steps;
    float* y;
    float* tail;  // convtr: the new tails [n][overlap][c_out]
    int c_out, rows, stride, t_out, overlap, transposed;
};

// The output (row r of phase p, column o) from its finished sum.
__device__ __forceinline__ void cg_epilogue(const CgOut& e, int p, int r, int o, float acc) {
    const int j = r / e.rows, q = r % e.rows;
    const SlotStep st = e.steps[j];
    const float b = e.bias != nullptr ? e.bias[o] : 0.f;
    if (!e.transposed) {
        const size_t idx = (size_t)r * e.c_out + o;
        float v = 0.f;
        if (st.active) {
            v = e.bias != nullptr ? acc + b : acc;
            if (e.res != nullptr) v = e.res[idx] + v;
        }
        e.y[idx] = v;
        return;
    }
    const int ro = p + e.stride * q;
    if (ro >= e.t_out + e.overlap) return;
    if (!st.active) {
        if (ro < e.t_out) e.y[((size_t)j * e.t_out + ro) * e.c_out + o] = 0.f;
        return;
    }
    float v = acc;
    if (ro < e.overlap) v = e.partial[((size_t)st.slot * e.overlap + ro) * e.c_out + o] + v;
    if (ro < e.t_out)
        e.y[((size_t)j * e.t_out + ro) * e.c_out + o] = v + b;
    else
        e.tail[((size_t)j * e.overlap + (ro - e.t_out)) * e.c_out + o] = (v + b) - b;
}

__device__ __forceinline__ CgOut cg_out(const float* bias, const float* res, const float* partial,
                                        const SlotStep* steps, float* y, float* tail, int c_out, int kernel,
                                        int stride, int t_in, int transposed) {
    CgOut e;
    e.bias = bias;
    e.res = res;
    e.partial = partial;
    e.steps = steps;
    e.y = y;
    e.tail = tail;
    e.c_out = c_out;
    e.stride = stride;
    e.transposed = transposed;
    e.overlap = transposed ? kernel - stride : 0;
    e.t_out = transposed ? t_in * stride : t_in / stride;
    e.rows = transposed ? (e.t_out + e.overlap + stride - 1) / stride : e.t_out;
    return e;
}

template <int BM>
__device__ __forceinline__ void conv_gemm_tile(const float* __restrict__ x, const float* __restrict__ prev,
                                               const float* __restrict__ w, const float* __restrict__ bias,
                                               const float* res, const float* __restrict__ partial,
                                               const SlotStep* __restrict__ steps, float* y,
                                               float* __restrict__ tail, float* __restrict__ part, int n, int c_in,
                                               int c_out, int kernel, int stride, int dilation, int t_in, int hist,
                                               int transposed, int elu, int k_split) {
    constexpr int ALD = BM + 4;                          // A line (floats)
    constexpr int AU = BM * CG_BK / CG_THREADS;          // A values a thread loads per slice
    constexpr int TM = BM / 8;                           // output rows per thread
    __shared__ cg_f4 As[CG_BK][ALD / 4];
    __shared__ cg_f4 Bs[CG_BK][CG_BN / 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const CgOut e = cg_out(bias, res, partial, steps, y, tail, c_out, kernel, stride, t_in, transposed);
    const int m_rows = n * e.rows, row_tiles = (m_rows + BM - 1) / BM;
    const int p = blockIdx.y / row_tiles, r0 = (blockIdx.y % row_tiles) * BM, c0 = blockIdx.x * CG_BN;
    const int taps = transposed ? (kernel - 1 - p) / stride + 1 : kernel;
    const int k_all = taps * c_in;
    const int kb = blockIdx.z * k_split, ke = min(kb + k_split, k_all);

    // This thread's A rows (tid / 32 + 4u) and B column (tid % 64) never change.
    int a_j[AU], a_t[AU], a_slot[AU];
    bool a_live[AU];
#pragma unroll
    for (int u = 0; u < AU; ++u) {
        const int r = r0 + (tid >> 5) + 4 * u;
        a_live[u] = false;
        a_j[u] = a_t[u] = a_slot[u] = 0;
        if (r < m_rows) {
            a_j[u] = r / e.rows;
            a_t[u] = r % e.rows;
            const SlotStep st = steps[a_j[u]];
            a_live[u] = st.active != 0;
            a_slot[u] = st.slot;
        }
    }
    const int b_col = c0 + (tid & 63);
    float a_reg[AU], b_reg[CG_BU];
    // Loads the slice [k0, k0 + CG_BK) of A and B into the registers.
    auto load = [&](int k0) {
        const int kk = k0 + (tid & 31);
        const int tap = kk / c_in, i = kk - tap * c_in;
#pragma unroll
        for (int u = 0; u < AU; ++u) {
            float v = 0.f;
            if (kk < ke && a_live[u]) {
                if (!transposed) {
                    const int s = a_t[u] * stride + tap * dilation;
                    v = s < hist ? prev[((size_t)a_slot[u] * hist + s) * c_in + i]
                                 : x[((size_t)a_j[u] * t_in + (s - hist)) * c_in + i];
                } else {
                    const int t = a_t[u] - (taps - 1 - tap);
                    if (t >= 0 && t < t_in) v = x[((size_t)a_j[u] * t_in + t) * c_in + i];
                }
                if (elu) v = elu1(v);
            }
            a_reg[u] = v;
        }
#pragma unroll
        for (int u = 0; u < CG_BU; ++u) {
            const int bk = k0 + (tid >> 6) + 2 * u;
            float v = 0.f;
            if (bk < ke && b_col < c_out) {
                int row = bk;
                if (transposed) {
                    const int mi = bk / c_in, bi = bk - mi * c_in;
                    row = (p + stride * (taps - 1 - mi)) * c_in + bi;
                }
                v = w[(size_t)row * c_out + b_col];
            }
            b_reg[u] = v;
        }
    };

    float acc[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[i][jj] = 0.f;
    if (kb < ke) load(kb);
    for (int k0 = kb; k0 < ke; k0 += CG_BK) {
        float* as = &As[0][0].v[0];
        float* bs = &Bs[0][0].v[0];
#pragma unroll
        for (int u = 0; u < AU; ++u) as[(tid & 31) * ALD + (tid >> 5) + 4 * u] = a_reg[u];
#pragma unroll
        for (int u = 0; u < CG_BU; ++u) bs[((tid >> 6) + 2 * u) * CG_BN + (tid & 63)] = b_reg[u];
        __syncthreads();
        if (k0 + CG_BK < ke) load(k0 + CG_BK);
#pragma unroll
        for (int kk = 0; kk < CG_BK; ++kk) {
            const cg_f4 b = Bs[kk][tx];
#pragma unroll
            for (int h = 0; h < TM / 4; ++h) {
                const cg_f4 a = As[kk][ty * (TM / 4) + h];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj) acc[4 * h + i][jj] += a.v[i] * b.v[jj];
            }
        }
        __syncthreads();
    }

    const int splits = gridDim.z;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = r0 + TM * ty + i;
        if (r >= m_rows) continue;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int o = c0 + 4 * tx + jj;
            if (o >= c_out) continue;
            if (splits == 1)
                cg_epilogue(e, p, r, o, acc[i][jj]);
            else
                part[(((size_t)blockIdx.z * (gridDim.y / row_tiles) + p) * m_rows + r) * c_out + o] = acc[i][jj];
        }
    }
}

// 32-row tiles (the layers with few rows per slot-step, split or not).
extern "C" __global__ void __launch_bounds__(CG_THREADS)
conv_gemm(const float* __restrict__ x, const float* __restrict__ prev, const float* __restrict__ w,
          const float* __restrict__ bias, const float* res, const float* __restrict__ partial,
          const SlotStep* __restrict__ steps, float* y, float* __restrict__ tail, float* __restrict__ part,
          int n, int c_in, int c_out, int kernel, int stride, int dilation, int t_in, int hist, int transposed,
          int elu, int k_split) {
    conv_gemm_tile<32>(x, prev, w, bias, res, partial, steps, y, tail, part, n, c_in, c_out, kernel, stride,
                       dilation, t_in, hist, transposed, elu, k_split);
}

// 64-row tiles (the layers with many rows per slot-step: twice the products
// per shared-memory read).
extern "C" __global__ void __launch_bounds__(CG_THREADS)
conv_gemm_tall(const float* __restrict__ x, const float* __restrict__ prev, const float* __restrict__ w,
               const float* __restrict__ bias, const float* res, const float* __restrict__ partial,
               const SlotStep* __restrict__ steps, float* y, float* __restrict__ tail, float* __restrict__ part,
               int n, int c_in, int c_out, int kernel, int stride, int dilation, int t_in, int hist,
               int transposed, int elu, int k_split) {
    conv_gemm_tile<64>(x, prev, w, bias, res, partial, steps, y, tail, part, n, c_in, c_out, kernel, stride,
                       dilation, t_in, hist, transposed, elu, k_split);
}

// After conv_gemm with `splits` > 1: each output's partial sums added in
// split order, then conv_gemm's epilogue.
extern "C" __global__ void __launch_bounds__(CG_RED_THREADS)
conv_gemm_reduce(const float* __restrict__ part, const float* __restrict__ bias, const float* res,
                 const float* __restrict__ partial, const SlotStep* __restrict__ steps, float* y,
                 float* __restrict__ tail, int n, int c_out, int kernel, int stride, int t_in, int transposed,
                 int splits) {
    const CgOut e = cg_out(bias, res, partial, steps, y, tail, c_out, kernel, stride, t_in, transposed);
    const int phases = transposed ? stride : 1;
    const size_t per_phase = (size_t)n * e.rows * c_out, total = phases * per_phase;
    for (size_t idx = (size_t)blockIdx.x * CG_RED_THREADS + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * CG_RED_THREADS) {
        float acc = part[idx];
        for (int s = 1; s < splits; ++s) acc += part[(size_t)s * total + idx];
        const int p = (int)(idx / per_phase);
        const size_t rest = idx % per_phase;
        cg_epilogue(e, p, (int)(rest / c_out), (int)(rest % c_out), acc);
    }
}
