// Mimi's split residual vector quantizer (CPU reference:
// model/src/mimi/quantizer.rs). The 1×1 input and output projections are
// cuBLAS GEMMs; these kernels do the codebook parts.
//
// Device codebook layout: books_t[c][dq][bins] (transposed, so that threads
// owning consecutive entries read consecutive addresses) and
// norms[c][bins] = ‖e‖² computed on the host in f32 as the reference.
//
// rvq_encode: per step, the residual r (the projected latent) goes through the
// codebooks in order; each picks argmin_b dist(r, e_b) with the first index
// on ties, then r −= e_best. dist follows torch.cdist as the reference does:
// with more than 25 entries sqrt(max(0, −2 r·e + ‖r‖² + ‖e‖²)), otherwise
// sqrt(Σ (r − e)²); the sqrt is kept so that ties fall as in the reference.
// rvq_decode: q[d] = Σ_c books[c][code_c][d], summed in codebook order.
//
// Geometry: rvq_encode grid = (n_steps), block = RVQ_THREADS (256), shared
// memory dq ≤ RVQ_MAX_DIM floats (2 KiB) + reduction slots; rvq_decode
// grid = (ceil(dq / 128), n_steps), block = 128, no shared memory.
#define RVQ_THREADS 256
#define RVQ_MAX_DIM 512
#define RVQ_DEC_THREADS 128

extern "C" __global__ void __launch_bounds__(RVQ_THREADS)
rvq_encode(float* __restrict__ xq, const float* __restrict__ books_t, const float* __restrict__ norms,
           const SlotStep* __restrict__ steps, int n_books, int dq, int bins, int use_mm, u32* __restrict__ codes,
           int codes_stride, int col0) {
    __shared__ float r[RVQ_MAX_DIM];
    __shared__ float red[RVQ_THREADS / 32];
    __shared__ float s_bv[RVQ_THREADS / 32];
    __shared__ int s_bi[RVQ_THREADS / 32];
    const int j = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    if (!steps[j].active) return;
    float* xr = xq + (size_t)j * dq;
    for (int d = tid; d < dq; d += RVQ_THREADS) r[d] = xr[d];
    __syncthreads();
    for (int c = 0; c < n_books; ++c) {
        const float* book = books_t + (size_t)c * dq * bins;
        float sq = 0.f;
        for (int d = tid; d < dq; d += RVQ_THREADS) sq += r[d] * r[d];
        const float xn = block_sum<RVQ_THREADS>(sq, red);
        float bv = 0.f;
        int bi = bins;
        for (int b = tid; b < bins; b += RVQ_THREADS) {
            float acc = 0.f;
            if (use_mm) {
                for (int d = 0; d < dq; ++d) acc += (-2.f * r[d]) * book[(size_t)d * bins + b];
                acc = sqrtf(fmaxf(acc + xn + norms[(size_t)c * bins + b], 0.f));
            } else {
                for (int d = 0; d < dq; ++d) {
                    const float e = r[d] - book[(size_t)d * bins + b];
                    acc += e * e;
                }
                acc = sqrtf(acc);
            }
            if (bi == bins || acc < bv) { bv = acc; bi = b; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi < bins && (bi == bins || ov < bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
        }
        if (lane == 0) { s_bv[w] = bv; s_bi[w] = bi; }
        __syncthreads();
        bv = s_bv[0];
        bi = s_bi[0];
#pragma unroll
        for (int i = 1; i < RVQ_THREADS / 32; ++i) {
            const float ov = s_bv[i];
            const int oi = s_bi[i];
            if (oi < bins && (bi == bins || ov < bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
        }
        if (tid == 0) codes[(size_t)j * codes_stride + col0 + c] = (u32)bi;
        for (int d = tid; d < dq; d += RVQ_THREADS) r[d] -= book[(size_t)d * bins + bi];
        __syncthreads();
    }
}

// q[j][d] = Σ_c books_t[c][d][codes[j][col0 + c]]. A code ≥ bins marks the
// step in fault[j] (when given) and contributes nothing (the CPU panics).
extern "C" __global__ void __launch_bounds__(RVQ_DEC_THREADS)
rvq_decode(const u32* __restrict__ codes, int codes_stride, int col0, const float* __restrict__ books_t,
           const SlotStep* __restrict__ steps, int n_books, int dq, int bins, float* __restrict__ q,
           int* __restrict__ fault) {
    const int d = blockIdx.x * RVQ_DEC_THREADS + threadIdx.x, j = blockIdx.y;
    if (d >= dq) return;
    float* qj = q + (size_t)j * dq;
    if (!steps[j].active) {
        qj[d] = 0.f;
        return;
    }
    float s = 0.f;
    for (int c = 0; c < n_books; ++c) {
        const u32 code = codes[(size_t)j * codes_stride + col0 + c];
        if (code >= (u32)bins) {
            if (fault != nullptr) fault[j] = 1;
            continue;
        }
        s += books_t[((size_t)c * dq + d) * bins + code];
    }
    qj[d] = s;
}
