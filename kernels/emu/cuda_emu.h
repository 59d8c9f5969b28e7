// The CUDA dialect of kernels/cuda/*.cu for the host C++ compiler: what the
// emulator device (kernels/src/device/emu/) needs so that the very same
// kernel sources compile with g++ and run on the CPU.
//
// build.rs makes one translation unit per module: this header, then (inside
// a namespace of the module's own) common.cuh and the module's .cu file, then
// the module's kernel table. `#include <cuda_bf16.h>` / `<cuda_fp8.h>` in the
// sources resolve to the empty stand-ins in emu/include/.
//
// What it provides, and how close to CUDA:
// - qualifiers (__global__, __device__, __forceinline__, __launch_bounds__)
//   vanish (build.rs reads the launch bounds into the kernel table, where
//   emu.rs checks block sizes against them); __restrict__ is g++'s own;
// - __shared__ is `static __thread`: one copy per OS thread, shared by the
//   fibers of the block being run on it (blocks of a launch run one after
//   another on the launching thread, so "per block" holds; two devices used
//   from two OS threads at once do not share it). CUDA leaves shared memory
//   undefined at the start of a block; here every variable is filled with a
//   garbage pattern (NaN as f32 and as bf16 high halves, a large negative
//   int, a huge double: EMU_SHARED_POISON, which build.rs places after each
//   declaration) by the first thread of each block that reaches it, so a
//   read of what no thread of the block wrote shows;
// - threadIdx / blockIdx / blockDim / gridDim read the scheduler's per-thread
//   context (emu_runtime.cpp sets threadIdx before every switch to a fiber);
// - __syncthreads, __syncwarp and the warp shuffles call into the fiber
//   scheduler (emu_runtime.cpp), which checks their CUDA preconditions
//   (__syncthreads is a macro: a barrier is known by its source line);
// - atomics are plain read-modify-writes: the threads of a block are fibers
//   of one OS thread and blocks never run concurrently;
// - bf16 and fp8 e4m3 convert exactly as CUDA does (round to nearest even;
//   e4m3 saturates to ±448, NaN stays NaN);
// - math functions are glibc's (correctly rounded or close to it; CUDA's
//   expf / erff are within 2 ulp, so results agree to ~1e-6 relative, not bit
//   for bit). FMA contraction is off (build.rs), so the host result is the
//   plain IEEE evaluation of the source.
#ifndef MOSHID_CUDA_EMU_H
#define MOSHID_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static __thread

// ---------------------------------------------------------------- built-in variables

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;

// CUDA's vector types the kernels load through (16- and 8-byte aligned, as
// CUDA declares them, so a misaligned vector load shows under UBSan).
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

// The context of the CUDA thread that runs now (written by the scheduler).
struct emu_ctx_t {
    uint3 thread_idx;
    uint3 block_idx;
    uint3 block_dim;
    uint3 grid_dim;
    // Counts the blocks run on this OS thread (from 1): tells the first
    // thread of a block to reach a __shared__ declaration that it is first.
    unsigned long long block_serial;
};
extern __thread emu_ctx_t emu_ctx;

#define threadIdx (emu_ctx.thread_idx)
#define blockIdx (emu_ctx.block_idx)
#define blockDim (emu_ctx.block_dim)
#define gridDim (emu_ctx.grid_dim)

// ---------------------------------------------------------------- scheduler entry points

extern "C" {
// Block barrier: returns when every live thread of the block has arrived.
// `site` names the barrier in the source ("file:line"): threads that wait
// together must wait at the same one.
void emu_syncthreads(const char* site);
// Warp barrier over the lanes of `mask`.
void emu_syncwarp(unsigned mask);
// A shuffle: `bits` is this lane's value, `src` the lane it reads from (or
// -1: keep its own value). Returns the value of lane `src`.
uint64_t emu_shuffle(unsigned mask, uint64_t bits, int src);
// The running thread has returned from the kernel. Returns 1 when the next
// thread of the pass has been started in its place (on the same stack: the
// caller runs the kernel again), 0 when the caller must return.
int emu_thread_exit(void);
}

// The pattern shared memory holds at the start of every block.
#define EMU_SHARED_POISON_WORD 0xffbad0ffu

// Fills a shared variable with the pattern, word by word from its start.
__forceinline__ void emu_shared_poison(void* p, size_t bytes) {
    unsigned char* b = (unsigned char*)p;
    const unsigned w = EMU_SHARED_POISON_WORD;
    for (size_t i = 0; i < bytes; ++i) b[i] = (unsigned char)(w >> (8 * (i % 4)));
}

// After a __shared__ declaration (build.rs puts it there): poisons the
// variable once per block, when the block's first thread gets to it.
#define EMU_SHARED_POISON(v)                                  \
    do {                                                      \
        static __thread unsigned long long emu_poisoned_in_;  \
        if (emu_poisoned_in_ != emu_ctx.block_serial) {       \
            emu_poisoned_in_ = emu_ctx.block_serial;          \
            emu_shared_poison(&(v), sizeof(v));               \
        }                                                     \
    } while (0)

#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
// A macro rather than a function so that the barrier's identity is its place
// in the source: the host compiler may duplicate or merge the calls (it does
// not know CUDA's convergence rules), the source line stays what it is.
#define __syncthreads() emu_syncthreads(__FILE__ ":" EMU_STR(__LINE__))
__forceinline__ void __syncwarp(unsigned mask = 0xffffffffu) { emu_syncwarp(mask); }

namespace emu_detail {
template <typename T>
__forceinline__ uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T>
__forceinline__ T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}
__forceinline__ int lane_id() { return (int)(emu_ctx.thread_idx.x & 31u); }
}  // namespace emu_detail

// Lanes are grouped in segments of `width` (a power of two ≤ 32), as CUDA.
template <typename T>
__forceinline__ T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    const int lane = emu_detail::lane_id();
    const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
    return emu_detail::from_bits<T>(emu_shuffle(mask, emu_detail::to_bits(v), src));
}
template <typename T>
__forceinline__ T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = emu_detail::lane_id();
    int src = lane ^ lane_mask;
    // A source beyond the lane's segment keeps the lane's own value.
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = -1;
    return emu_detail::from_bits<T>(emu_shuffle(mask, emu_detail::to_bits(v), src));
}
template <typename T>
__forceinline__ T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = emu_detail::lane_id();
    const int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : -1;
    return emu_detail::from_bits<T>(emu_shuffle(mask, emu_detail::to_bits(v), src));
}
template <typename T>
__forceinline__ T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = emu_detail::lane_id();
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : -1;
    return emu_detail::from_bits<T>(emu_shuffle(mask, emu_detail::to_bits(v), src));
}

// ---------------------------------------------------------------- atomics

template <typename T>
__forceinline__ T atomicAdd(T* p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
__forceinline__ T atomicMax(T* p, T v) {
    const T old = *p;
    if (v > old) *p = v;
    return old;
}
template <typename T>
__forceinline__ T atomicMin(T* p, T v) {
    const T old = *p;
    if (v < old) *p = v;
    return old;
}
template <typename T>
__forceinline__ T atomicExch(T* p, T v) {
    const T old = *p;
    *p = v;
    return old;
}
template <typename T>
__forceinline__ T atomicCAS(T* p, T cmp, T v) {
    const T old = *p;
    if (old == cmp) *p = v;
    return old;
}

// ---------------------------------------------------------------- integer and bit helpers

__forceinline__ int min(int a, int b) { return a < b ? a : b; }
__forceinline__ int max(int a, int b) { return a > b ? a : b; }
__forceinline__ unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
__forceinline__ unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
__forceinline__ long long min(long long a, long long b) { return a < b ? a : b; }
__forceinline__ long long max(long long a, long long b) { return a > b ? a : b; }
__forceinline__ unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
__forceinline__ unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

__forceinline__ float __int_as_float(int i) { return emu_detail::from_bits<float>((uint32_t)i); }
__forceinline__ float __uint_as_float(unsigned u) { return emu_detail::from_bits<float>(u); }
__forceinline__ int __float_as_int(float f) { return (int)(uint32_t)emu_detail::to_bits(f); }
__forceinline__ unsigned __float_as_uint(float f) { return (uint32_t)emu_detail::to_bits(f); }
__forceinline__ double __longlong_as_double(long long i) { return emu_detail::from_bits<double>((uint64_t)i); }
__forceinline__ long long __double_as_longlong(double d) { return (long long)emu_detail::to_bits(d); }

// Reciprocal square root (CUDA's is approximate to 2 ulp; this is exact).
__forceinline__ float rsqrtf(float x) { return 1.f / sqrtf(x); }

// ---------------------------------------------------------------- bfloat16

struct __nv_bfloat16 {
    unsigned short __x;
};

__forceinline__ float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.__x << 16); }

// Round to nearest even; NaN becomes the canonical 0x7fff (cvt.rn.bf16.f32).
__forceinline__ __nv_bfloat16 __float2bfloat16_rn(float f) {
    const unsigned x = __float_as_uint(f);
    __nv_bfloat16 r;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        r.__x = 0x7fff;
        return r;
    }
    unsigned hi = x >> 16;
    const unsigned rem = x << 16;
    if (rem > 0x80000000u || (rem == 0x80000000u && (hi & 1u))) ++hi;
    r.__x = (unsigned short)hi;
    return r;
}
__forceinline__ __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

// ---------------------------------------------------------------- fp8 e4m3

namespace emu_detail {
// float → e4m3 with round to nearest even and saturation to ±448 (CUDA's
// __NV_SATFINITE: infinities saturate too); NaN → 0x7f; magnitudes at or
// below 2^-10 (half the smallest subnormal) → signed zero.
__forceinline__ unsigned char float_to_e4m3(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7f;
    const unsigned char sign = (unsigned char)((x >> 24) & 0x80u);
    const uint32_t ax = x & 0x7fffffffu;
    // Thresholds as f32 bit patterns.
    const uint32_t MINDENORM_O2 = 0x3a800000u;  // 2^-10
    const uint32_t OVERFLOW = 0x43e80000u;      // 464 = 448 + half an ulp
    const uint32_t MINNORM = 0x3c800000u;       // 2^-6
    unsigned char res;
    if (ax <= MINDENORM_O2) {
        res = 0;
    } else if (ax > OVERFLOW) {
        res = 0x7e;  // 448 (also for +-inf: satfinite)
    } else if (ax >= MINNORM) {
        const unsigned exp = ((ax >> 23) & 0xffu) - 127u + 7u;
        const unsigned mant = (ax >> 20) & 0x7u;
        res = (unsigned char)((exp << 3) | mant);
        const uint32_t round = ax & 0xfffffu;  // the 20 dropped bits
        const uint32_t half = 0x80000u;
        if (round > half || (round == half && (mant & 1u))) ++res;
    } else {
        // Subnormal: value = m · 2^-9, m in 1..=7 (+1 may round to 2^-6).
        const unsigned exp = ((ax >> 23) & 0xffu);  // biased f32 exponent, 117..=120
        const unsigned shift = 121u - exp;          // 1..=4
        const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;  // 24 significant bits
        // m = mant >> (20 + shift), rounded.
        const unsigned drop = 20u + shift;
        res = (unsigned char)(mant >> drop);
        const uint32_t round = mant & ((1u << drop) - 1u);
        const uint32_t half = 1u << (drop - 1u);
        if (round > half || (round == half && (res & 1u))) ++res;
    }
    return (unsigned char)(res | sign);
}

// e4m3 → float, exact; 0x7f / 0xff are NaN (e4m3 has no infinities).
__forceinline__ float e4m3_to_float(unsigned char b) {
    const unsigned sign = (unsigned)(b & 0x80u) << 24;
    const unsigned e = (b >> 3) & 0xfu, m = b & 0x7u;
    if ((b & 0x7fu) == 0x7fu) return __uint_as_float(0x7fffffffu);
    float v;
    if (e == 0)
        v = (float)m * 0.001953125f;  // m · 2^-9
    else
        v = __uint_as_float(((e - 7u + 127u) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(v) | sign);
}
}  // namespace emu_detail

struct __nv_fp8_e4m3 {
    unsigned char __x;
    __nv_fp8_e4m3() = default;
    explicit __nv_fp8_e4m3(float f) : __x(emu_detail::float_to_e4m3(f)) {}
    explicit __nv_fp8_e4m3(double d) : __x(emu_detail::float_to_e4m3((float)d)) {}
    explicit operator float() const { return emu_detail::e4m3_to_float(__x); }
};

// ---------------------------------------------------------------- the kernel table

namespace emu {

typedef void (*thunk_t)(void**);

// The kind of a kernel parameter, as the Rust side's `Arg`: 'p' pointer,
// 'i' int, 'u' unsigned int, 'f' float, 'U' 64-bit integer; '?' anything else
// (never launchable).
template <typename T>
struct kind {
    static constexpr unsigned char code = std::is_pointer<T>::value ? 'p' : '?';
};
template <> struct kind<int> { static constexpr unsigned char code = 'i'; };
template <> struct kind<unsigned int> { static constexpr unsigned char code = 'u'; };
template <> struct kind<float> { static constexpr unsigned char code = 'f'; };
template <> struct kind<unsigned long> { static constexpr unsigned char code = 'U'; };
template <> struct kind<unsigned long long> { static constexpr unsigned char code = 'U'; };
template <> struct kind<long> { static constexpr unsigned char code = 'U'; };
template <> struct kind<long long> { static constexpr unsigned char code = 'U'; };

// The alignment a pointer parameter's target needs (1 for non-pointers).
template <typename T>
struct target_align {
    static constexpr unsigned char value = 1;
};
template <typename T>
struct target_align<T*> {
    static constexpr unsigned char value = (unsigned char)alignof(T);
};

// A kernel's signature: parameter count, kinds and pointer alignments, and
// the call that reads parameter i from args[i] as its declared type.
template <typename F>
struct sig;
template <typename... P>
struct sig<void(P...)> {
    static constexpr unsigned n = sizeof...(P);
    static constexpr unsigned char kinds[sizeof...(P) + 1] = {kind<P>::code..., 0};
    static constexpr unsigned char aligns[sizeof...(P) + 1] = {target_align<P>::value..., 0};
    // Reads the parameters once, then runs the kernel for the current thread
    // and every thread the scheduler chains after it on this stack.
    template <size_t... I>
    static __forceinline__ void run(void (*f)(P...), void** args, std::index_sequence<I...>) {
        const std::tuple<P...> a(*static_cast<P*>(args[I])...);
        do {
            f(std::get<I>(a)...);
        } while (emu_thread_exit());
    }
};

// thunk<&kernel>(args): the kernel run with its parameters from args.
template <auto F>
void thunk(void** args) {
    using S = sig<std::remove_pointer_t<decltype(F)>>;
    S::run(F, args, std::make_index_sequence<S::n>{});
}

// One row of a module's kernel table (read by emu.rs through emu_runtime.cpp).
struct kernel_info {
    const char* name;
    thunk_t thunk;
    unsigned n_params;
    const unsigned char* kinds;   // n_params codes (see `kind`), NUL-terminated
    const unsigned char* aligns;  // n_params alignments of pointer targets
    unsigned max_threads;         // __launch_bounds__, or 1024
};

}  // namespace emu

// A table row for kernel NAME of namespace NS with launch bounds BOUNDS.
#define EMU_KERNEL(NS, NAME, BOUNDS)                                                              \
    {#NAME, &::emu::thunk<&NS::NAME>, ::emu::sig<decltype(NS::NAME)>::n,                          \
     ::emu::sig<decltype(NS::NAME)>::kinds, ::emu::sig<decltype(NS::NAME)>::aligns, (unsigned)(BOUNDS)}

#endif
