// Shared by every kernel source of moshid-kernels. compile.rs prepends this
// file to each .cu source (NVRTC gets one translation unit per module, with a
// #line directive so that diagnostics name the right file and line).
//
// Conventions for every kernel in this folder:
// - One new token per slot per step. A batch of B "slot-steps" (the CUDA-graph
//   bucket) is described by SlotStep[B]; rows of the LM stacks (one per step,
//   two with classifier-free guidance) by RowInfo[rows]. Padding entries of a
//   bucket have active == 0: kernels neither read their state nor write it,
//   and row kernels write zeros into their outputs so no garbage flows on.
// - LM weights are bf16; activations that feed cuBLAS are bf16, the residual
//   stream, norms, softmax and every accumulation are f32. Mimi runs in f32
//   (as the official server runs it), its attention cache may be f32 or bf16.
// - Block sizes are compile-time constants named in each kernel's comment and
//   enforced with __launch_bounds__; shared memory is static and bounded.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef __nv_bfloat16 bf16;
typedef unsigned int u32;
typedef unsigned long long u64;

// The description of one slot-step of the batch (mirrors launch::SlotStep).
struct SlotStep {
    int slot;      // slot index: token cache, RNG, offsets, conv state rows
    int active;    // 0: padding or masked slot, nothing is read or written
    int row_cond;  // batch row of the (conditioned) logits / activations
    int row_null;  // batch row of the guidance (null) logits, or -1
};

// The description of one row of a transformer stack (mirrors launch::RowInfo).
struct RowInfo {
    int kv;      // cache row: slot·rows_per_slot + j (LM), batch row (depformer), slot (Mimi)
    int pos;     // stream position of this row's query and key
    int last;    // last position written into this cache row by this call (== pos when one step per call)
    int step;    // index of the SlotStep this row belongs to (token arrays)
    int active;  // 0: masked row
};

// Per-slot decoding parameters, written at reset (mirrors launch::SlotParams).
struct SlotParams {
    float temp_text;
    float temp_audio;
    int top_k_text;
    int top_k_audio;
    int use_sampling;
    float cfg_coef;   // used where SlotStep::row_null >= 0
};

#define NEG_INF __int_as_float(0xff800000)
#define WARP 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of NT threads (NT a multiple of 32, at most 1024). Every
// thread gets the result. `red` must hold NT/32 floats; the call contains
// __syncthreads and must be reached by every thread of the block.
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < NT / 32; ++i) t += red[i];
    __syncthreads();
    return t;
}

// ELU with alpha 1 (x > 0 ? x : expm1(x)), as the reference's ops::elu.
__device__ __forceinline__ float elu1(float v) { return v > 0.f ? v : expm1f(v); }

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 v) { return float(v); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__nv_fp8_e4m3* p, float v) { *p = __nv_fp8_e4m3(v); }
