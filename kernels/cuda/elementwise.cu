// Element-wise kernels (CPU reference: model/src/ops.rs silu, gelu, elu;
// lm/transformer.rs gating; mimi/transformer.rs add_scaled; mimi/seanet.rs
// residual sums).
//
// Geometry: 1-D grid-stride loops, block = EW_THREADS (256), any grid size
// (the host launches ceil(n / 256) blocks, capped). No shared memory. These
// kernels hold no per-slot state, so they run over whole buffers: rows of
// masked slots hold zeros (written by the row kernels before them) and stay
// finite.
#define EW_THREADS 256

// act[r][j] = silu(ff[r][j]) · ff[r][hidden + j], ff = [rows][2·hidden] f32
// (gate, then value: the official ActivationGating), act in bf16 for the
// output GEMM (f32 in the exact-reference precision). silu(x) = x / (1 + exp(−x)),
// as the reference.
template <typename OUT>
__device__ __forceinline__ void silu_gate(const float* __restrict__ ff, int hidden, int rows, OUT* __restrict__ act) {
    const size_t n = (size_t)rows * hidden;
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS) {
        const size_t r = e / hidden, j = e % hidden;
        const float g = ff[r * 2 * hidden + j], v = ff[r * 2 * hidden + hidden + j];
        store(act + e, g / (1.f + expf(-g)) * v);
    }
}

extern "C" __global__ void __launch_bounds__(EW_THREADS)
silu_gate_bf16(const float* __restrict__ ff, int hidden, int rows, bf16* __restrict__ act) {
    silu_gate(ff, hidden, rows, act);
}

extern "C" __global__ void __launch_bounds__(EW_THREADS)
silu_gate_f32(const float* __restrict__ ff, int hidden, int rows, float* __restrict__ act) {
    silu_gate(ff, hidden, rows, act);
}

// x = gelu(x), exact erf form (PyTorch's default F.gelu).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
gelu_f32(float* __restrict__ x, size_t n) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS) {
        const float v = x[e];
        x[e] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    }
}

// y = elu(x) with alpha 1 (x > 0 ? x : expm1(x)); y may equal x.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
elu_f32(const float* x, float* y, size_t n) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        y[e] = elu1(x[e]);
}

// x[r][i] += scale[i] · u[r][i] (Mimi's LayerScale residual), dim = scale length.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
add_scaled_f32(float* __restrict__ x, const float* __restrict__ u, const float* __restrict__ scale, int dim,
               size_t n) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        x[e] += scale[e % dim] * u[e];
}

// x += u (SEANet residual blocks with an identity skip).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
add_f32(float* __restrict__ x, const float* __restrict__ u, size_t n) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        x[e] += u[e];
}

// y = bf16(x), round to nearest even.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
f32_to_bf16(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        y[e] = __float2bfloat16_rn(x[e]);
}

// Deterministic pseudo-random fill, uniform in [−scale, scale): element e gets
// splitmix64(seed + e) mapped to the interval. For timing models of real
// shapes with random weights (no checkpoint); never used on a real model.
__device__ __forceinline__ float uniform_at(u64 seed, size_t e, float scale) {
    u64 z = seed + (u64)e * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = (float)(z >> 40) * (1.f / 16777216.f);  // [0, 1)
    return (2.f * u - 1.f) * scale;
}

extern "C" __global__ void __launch_bounds__(EW_THREADS)
fill_uniform_f32(float* __restrict__ y, size_t n, u64 seed, float scale) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        y[e] = uniform_at(seed, e, scale);
}

extern "C" __global__ void __launch_bounds__(EW_THREADS)
fill_uniform_bf16(bf16* __restrict__ y, size_t n, u64 seed, float scale) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        y[e] = __float2bfloat16_rn(uniform_at(seed, e, scale));
}

// y = value over n floats (norm weights of a random model).
extern "C" __global__ void __launch_bounds__(EW_THREADS)
fill_f32(float* __restrict__ y, size_t n, float value) {
    for (size_t e = (size_t)blockIdx.x * EW_THREADS + threadIdx.x; e < n; e += (size_t)gridDim.x * EW_THREADS)
        y[e] = value;
}
