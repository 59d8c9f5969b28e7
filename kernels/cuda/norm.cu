// Row normalisations (CPU reference: model/src/ops.rs rms_norm, layer_norm).
//
// Geometry: grid = (rows), block = NORM_THREADS (256); one block per row,
// each thread strides over the row. Shared memory: NORM_THREADS/32 floats.
// Numerics mirror the reference: f32 sums, inv = 1 / sqrt(mean + eps) (not
// rsqrtf), RMSNorm output x · (alpha · inv), LayerNorm (x − mean) · inv · w + b.
// Rows whose RowInfo is inactive are written as zeros (`rows` may be null:
// every row active).
#define NORM_THREADS 256

template <typename OUT>
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ x, const float* __restrict__ alpha,
                                             float eps, int dim, const RowInfo* __restrict__ rows,
                                             OUT* __restrict__ y) {
    __shared__ float red[NORM_THREADS / 32];
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * dim;
    OUT* yr = y + (size_t)r * dim;
    if (rows != nullptr && !rows[r].active) {
        for (int i = threadIdx.x; i < dim; i += NORM_THREADS) store(yr + i, 0.f);
        return;
    }
    float s = 0.f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) s += xr[i] * xr[i];
    s = block_sum<NORM_THREADS>(s, red);
    const float inv = 1.f / sqrtf(s / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) store(yr + i, xr[i] * (alpha[i] * inv));
}

// y[r] = rms_norm(x[r]) · alpha, y in bf16 (feeds a cuBLAS bf16 GEMM).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ alpha, float eps, int dim,
              const RowInfo* __restrict__ rows, bf16* __restrict__ y) {
    rms_norm_row(x, alpha, eps, dim, rows, y);
}

// The same with an f32 output.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
rms_norm_f32(const float* __restrict__ x, const float* __restrict__ alpha, float eps, int dim,
             const RowInfo* __restrict__ rows, float* __restrict__ y) {
    rms_norm_row(x, alpha, eps, dim, rows, y);
}

// y[r] = layer_norm(x[r]) · w + b. Two passes over the row (mean, then
// centred squares), as the reference.
template <typename OUT>
__device__ __forceinline__ void layer_norm_row(const float* __restrict__ x, const float* __restrict__ w,
                                               const float* __restrict__ b, float eps, int dim,
                                               const RowInfo* __restrict__ rows, OUT* __restrict__ y) {
    __shared__ float red[NORM_THREADS / 32];
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * dim;
    OUT* yr = y + (size_t)r * dim;
    if (rows != nullptr && !rows[r].active) {
        for (int i = threadIdx.x; i < dim; i += NORM_THREADS) store(yr + i, 0.f);
        return;
    }
    float s = 0.f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) s += xr[i];
    const float mean = block_sum<NORM_THREADS>(s, red) / (float)dim;
    float v = 0.f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) {
        const float c = xr[i] - mean;
        v += c * c;
    }
    const float inv = 1.f / sqrtf(block_sum<NORM_THREADS>(v, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) store(yr + i, (xr[i] - mean) * inv * w[i] + b[i]);
}

// LayerNorm, all f32 (Mimi's transformers; the LM's depformer heads in f32 mode).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
layer_norm_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
               float eps, int dim, const RowInfo* __restrict__ rows, float* __restrict__ y) {
    layer_norm_row(x, w, b, eps, dim, rows, y);
}

// LayerNorm with a bf16 output (the depformer's head norms, feeding the
// heads' bf16 GEMMs).
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
layer_norm_bf16(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                float eps, int dim, const RowInfo* __restrict__ rows, bf16* __restrict__ y) {
    layer_norm_row(x, w, b, eps, dim, rows, y);
}
