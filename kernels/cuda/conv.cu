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
// Geometry: block = CONV_THREADS (128) threads. The dense products give
// each thread CONV_TT outputs of one channel that use the same weights
// (conv1d: consecutive output steps; convtr1d: steps `stride` apart, i.e. the
// same kernel tap), so each weight read from L2 serves CONV_TT outputs, and
// flatten (channel, group of outputs) over the threads so that narrow layers
// (Mimi's 32-channel residual convs, the 1-channel output) fill every warp:
// grid = (ceil(c_out · groups / 128), n_steps), channels fastest (a warp reads
// consecutive weights and broadcasts its inputs). Each output accumulates in
// the same order as one output per thread would (and as the CPU reference).
// Depthwise convtr: grid = (ceil(c / 128), output steps, n_steps), a thread
// per channel. State kernels: grid = (n_steps). No shared memory; a direct
// convolution, not an implicit GEMM (future work, after GPU measurements).
#define CONV_THREADS 128
#define CONV_TT 4

extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_stream(const float* __restrict__ x, const float* __restrict__ prev, const float* __restrict__ w,
              const float* __restrict__ bias, const SlotStep* __restrict__ steps, int c_in, int c_out, int kernel,
              int stride, int dilation, int t_in, int history, float* __restrict__ y) {
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
            for (int u = 0; u < CONV_TT; ++u) acc[u] += src[u][i] * wv;
        }
    }
    const float b = bias != nullptr ? bias[o] : 0.f;
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u)
        if (u < n) yo[(size_t)u * c_out] = bias != nullptr ? acc[u] + b : acc[u];
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

// Dense transposed conv. Output step r of the call's full output
// (0 ≤ r < t_in·stride + overlap): r < t_out goes to y (+ the old tail for
// r < overlap, + bias), r ≥ t_out to tail[j][r − t_out]. A thread takes the
// outputs r = phase + stride·(q0 + u), u < CONV_TT: they meet input t = q − m
// at tap phase + stride·m, so each tap's weights serve all of them. Taps go
// from the highest down, so each output sums its inputs in ascending t.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
convtr1d_stream(const float* __restrict__ x, const float* __restrict__ partial, const float* __restrict__ w,
                const float* __restrict__ bias, const SlotStep* __restrict__ steps, int c_in, int c_out, int kernel,
                int stride, int t_in, float* __restrict__ y, float* __restrict__ tail) {
    const int t_out = t_in * stride, overlap = kernel - stride, total = t_out + overlap;
    const int q_count = (total + stride - 1) / stride;
    const int groups = (q_count + CONV_TT - 1) / CONV_TT;
    const int g = blockIdx.x * CONV_THREADS + threadIdx.x, j = blockIdx.y;
    if (g >= c_out * stride * groups) return;
    const int o = g % c_out, rest = g / c_out;
    const int phase = rest % stride, q0 = (rest / stride) * CONV_TT;
    const SlotStep st = steps[j];
    if (!st.active) {
        for (int u = 0; u < CONV_TT; ++u) {
            const int r = phase + stride * (q0 + u);
            if (r < t_out) y[((size_t)j * t_out + r) * c_out + o] = 0.f;
        }
        return;
    }
    float acc[CONV_TT];
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) {
        const int r = phase + stride * (q0 + u);
        acc[u] = r < overlap ? partial[((size_t)st.slot * overlap + r) * c_out + o] : 0.f;
    }
    const float* xj = x + (size_t)j * t_in * c_in;
    for (int m = (kernel - 1 - phase) / stride; m >= 0; --m) {
        const float* xt[CONV_TT];
        bool ok[CONV_TT];
#pragma unroll
        for (int u = 0; u < CONV_TT; ++u) {
            const int t = q0 + u - m;
            ok[u] = t >= 0 && t < t_in;
            // Outside the input: read step 0, dropped.
            xt[u] = xj + (size_t)(ok[u] ? t : 0) * c_in;
        }
        const float* wk = w + (size_t)(phase + stride * m) * c_in * c_out + o;
        float z[CONV_TT];
#pragma unroll
        for (int u = 0; u < CONV_TT; ++u) z[u] = 0.f;
        for (int i = 0; i < c_in; ++i) {
            const float wv = wk[(size_t)i * c_out];
#pragma unroll
            for (int u = 0; u < CONV_TT; ++u) z[u] += xt[u][i] * wv;
        }
#pragma unroll
        for (int u = 0; u < CONV_TT; ++u)
            if (ok[u]) acc[u] += z[u];
    }
    const float b = bias != nullptr ? bias[o] : 0.f;
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) {
        const int r = phase + stride * (q0 + u);
        if (r < t_out)
            y[((size_t)j * t_out + r) * c_out + o] = acc[u] + b;
        else if (r < total)
            tail[((size_t)j * overlap + (r - t_out)) * c_out + o] = (acc[u] + b) - b;
    }
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
