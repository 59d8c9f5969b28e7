// Mimi's split residual vector quantizer (CPU reference:
// model/src/mimi/quantizer.rs). The 1×1 input and output projections are
// cuBLAS GEMMs; these kernels do the codebook parts.
//
// Device codebook layout: books[c][bins][dq] (entry-major: an entry's vector
// is contiguous, so a tile of entries is read in whole cache lines and a
// residual update gathers one contiguous vector) and norms[c][bins] = ‖e‖²
// computed on the host in f32 as the reference.
//
// Encoding, stage by stage (the residual changes after every codebook, so
// stages are sequential; each is one launch over every slot-step and entry):
// codebook c picks argmin_b dist(r, e_b) with the first index on ties, then
// r −= e_best. dist follows torch.cdist as the reference does: with more
// than 25 entries sqrt(max(0, Σ_d (−2 r_d)·e_d + ‖r‖² + ‖e‖²)), otherwise
// sqrt(Σ_d (r_d − e_d)²); sums in ascending d, ‖r‖² too, as the reference;
// the sqrt is kept so that ties fall as in the reference.
//
// rvq_stage(stage = s) for a block of RVQ_ROWS slot-steps and RVQ_TILE
// entries: (1) for s > 0, the code of stage s − 1 is the argmin over the
// per-tile partial minima that launch s − 1 left in part[(s − 1) & 1]
// (ascending tiles, strict <, so the first index wins); blocks of the first
// tile column write it to codes; (2) the residual r = xq − e_{code_0} − … −
// e_{code_{s−1}}, subtracted in stage order (earlier codes are read back from
// codes, written by earlier launches); (3) for s < n_books, the distances of
// the block's rows to its entries and their partial argmin into
// part[s & 1][row][tile] (double-buffered: launch s reads the other half).
// The launch with s == n_books only does (1): it writes the last code.
// Every step of a row depends on that row only, so a stream's codes do not
// depend on the batch it is in.
//
// rvq_decode: q[d] = Σ_c books[c][code_c][d], summed in codebook order.
//
// Geometry: rvq_stage grid = (ceil(bins / RVQ_TILE), ceil(n_steps /
// RVQ_ROWS)) (grid.x = 1 for s == n_books), block = RVQ_THREADS (128): warp w
// owns rows 4w .. 4w + 3 of the tile, lane l entries l and l + 32. Shared
// memory: the residuals (RVQ_ROWS × RVQ_MAX_DIM floats, 32 KiB) and one
// RVQ_DK × RVQ_TILE slice of the entries (8 KiB, rows padded by one). rvq_decode grid =
// (ceil(dq / 128), n_steps), block = 128, no shared memory.
#define RVQ_THREADS 128
#define RVQ_ROWS 16
#define RVQ_TILE 64
#define RVQ_DK 32
#define RVQ_MAX_DIM 512
#define RVQ_DEC_THREADS 128

// A partial minimum: the best distance of a tile and its entry (bins: none).
struct RvqBest {
    float v;
    int i;
};

// (ov, oi) beats (v, i): a smaller distance, or the same at a lower index;
// an absent candidate (index ≥ bins) never wins, a present one beats an
// absent one.
__device__ __forceinline__ bool rvq_better(float ov, int oi, float v, int i, int bins) {
    return oi < bins && (i >= bins || ov < v || (ov == v && oi < i));
}

extern "C" __global__ void __launch_bounds__(RVQ_THREADS)
rvq_stage(const float* __restrict__ xq, const float* __restrict__ books, const float* __restrict__ norms,
          const SlotStep* __restrict__ steps, int n_steps, int n_books, int dq, int bins, int use_mm, int stage,
          RvqBest* __restrict__ part, u32* __restrict__ codes, int codes_stride, int col0) {
    __shared__ float r[RVQ_ROWS][RVQ_MAX_DIM];
    // + 1: the stores (consecutive threads, consecutive rows) hit distinct banks.
    __shared__ float es[RVQ_DK][RVQ_TILE + 1];
    __shared__ float s_xn[RVQ_ROWS];
    __shared__ int s_code[RVQ_ROWS];
    __shared__ int s_live[RVQ_ROWS];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int tiles = (bins + RVQ_TILE - 1) / RVQ_TILE;
    const int j0 = blockIdx.y * RVQ_ROWS;
    const size_t part_half = (size_t)n_steps * tiles;

    if (tid < RVQ_ROWS) {
        const int j = j0 + tid;
        s_live[tid] = j < n_steps && steps[j].active;
    }
    // (1) The previous stage's code: warp w combines rows 4w .. 4w + 3.
    for (int i = 0; i < RVQ_ROWS / 4; ++i) {
        const int row = 4 * w + i, j = j0 + row;
        int bi = bins;
        if (stage > 0 && j < n_steps) {
            const RvqBest* p = part + ((stage - 1) & 1) * part_half + (size_t)j * tiles;
            float bv = 0.f;
            for (int t = lane; t < tiles; t += 32) {
                const RvqBest b = p[t];
                if (rvq_better(b.v, b.i, bv, bi, bins)) { bv = b.v; bi = b.i; }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (rvq_better(ov, oi, bv, bi, bins)) { bv = ov; bi = oi; }
            }
        }
        if (lane == 0) s_code[row] = bi;
    }
    __syncthreads();
    if (stage > 0 && blockIdx.x == 0 && tid < RVQ_ROWS && s_live[tid] && s_code[tid] < bins)
        codes[(size_t)(j0 + tid) * codes_stride + col0 + stage - 1] = (u32)s_code[tid];
    if (stage >= n_books) return;

    // (2) Residuals, subtracted in stage order (dead rows: zeros).
    for (int e = tid; e < RVQ_ROWS * dq; e += RVQ_THREADS) {
        const int row = e / dq, d = e % dq, j = j0 + row;
        float v = 0.f;
        if (s_live[row]) {
            v = xq[(size_t)j * dq + d];
            for (int c = 0; c < stage; ++c) {
                const int code = c == stage - 1 ? s_code[row] : (int)codes[(size_t)j * codes_stride + col0 + c];
                // A missing code (degenerate distances) subtracts nothing.
                if (code < bins) v -= books[((size_t)c * bins + code) * dq + d];
            }
        }
        r[row][d] = v;
    }
    __syncthreads();
    if (tid < RVQ_ROWS) {
        float sq = 0.f;
        for (int d = 0; d < dq; ++d) sq += r[tid][d] * r[tid][d];
        s_xn[tid] = sq;
    }

    // (3) Distances of rows 4w .. 4w + 3 to entries b0 + lane, b0 + lane + 32.
    const int b0 = blockIdx.x * RVQ_TILE;
    const float* book = books + (size_t)stage * bins * dq;
    float acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = 0.f;
    for (int d0 = 0; d0 < dq; d0 += RVQ_DK) {
        __syncthreads();
        for (int e = tid; e < RVQ_DK * RVQ_TILE; e += RVQ_THREADS) {
            const int bb = e / RVQ_DK, dd = e % RVQ_DK;
            const int b = b0 + bb, d = d0 + dd;
            es[dd][bb] = b < bins && d < dq ? book[(size_t)b * dq + d] : 0.f;
        }
        __syncthreads();
        const int dn = min(RVQ_DK, dq - d0);
        for (int dd = 0; dd < dn; ++dd) {
            const float e0 = es[dd][lane], e1 = es[dd][lane + 32];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float rv = r[4 * w + i][d0 + dd];
                if (use_mm) {
                    acc[i][0] += (-2.f * rv) * e0;
                    acc[i][1] += (-2.f * rv) * e1;
                } else {
                    const float u0 = rv - e0, u1 = rv - e1;
                    acc[i][0] += u0 * u0;
                    acc[i][1] += u1 * u1;
                }
            }
        }
    }
    const float* nb = norms + (size_t)stage * bins;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = 4 * w + i, j = j0 + row;
        float bv = 0.f;
        int bi = bins;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int b = b0 + lane + 32 * h;
            if (b >= bins) continue;
            const float dist =
                use_mm ? sqrtf(fmaxf(acc[i][h] + s_xn[row] + nb[b], 0.f)) : sqrtf(acc[i][h]);
            if (rvq_better(dist, b, bv, bi, bins)) { bv = dist; bi = b; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (rvq_better(ov, oi, bv, bi, bins)) { bv = ov; bi = oi; }
        }
        if (lane == 0 && j < n_steps) {
            RvqBest b;
            b.v = bv;
            b.i = bi;
            part[(stage & 1) * part_half + (size_t)j * tiles + blockIdx.x] = b;
        }
    }
}

// q[j][d] = Σ_c books[c][codes[j][col0 + c]][d]. A code ≥ bins marks the
// step in fault[j] (when given) and contributes nothing (the CPU panics).
extern "C" __global__ void __launch_bounds__(RVQ_DEC_THREADS)
rvq_decode(const u32* __restrict__ codes, int codes_stride, int col0, const float* __restrict__ books,
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
        s += books[((size_t)c * bins + code) * dq + d];
    }
    qj[d] = s;
}
