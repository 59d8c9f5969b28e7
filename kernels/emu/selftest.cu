// Kernels that check the emulator itself (kernels/tests/emu_kernels.rs):
// warp shuffles, barriers with exited threads, and the misuses the scheduler
// must report instead of hanging. Compiled into the emulator only (build.rs),
// never by NVRTC: they are not part of moshid's kernels and compile.rs does
// not list them. Every name starts with emu_selftest_.

// out[4·t ..]: xor 1, up 3, down 5, idx (lane 7 of the warp) of t·10.
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_shuffles(int* out) {
    const int t = threadIdx.x, v = t * 10;
    out[4 * t + 0] = __shfl_xor_sync(0xffffffffu, v, 1);
    out[4 * t + 1] = __shfl_up_sync(0xffffffffu, v, 3);
    out[4 * t + 2] = __shfl_down_sync(0xffffffffu, v, 5);
    out[4 * t + 3] = __shfl_sync(0xffffffffu, v, 7);
}

// out[t] = t + 1 (mod blockDim) through shared memory, which is first
// poisoned with -1; `barrier` 0 leaves the second barrier out, so the result
// depends on the order the threads run in.
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_neighbour(int* out, int barrier) {
    __shared__ int s[1024];
    const int t = threadIdx.x;
    s[t] = -1;
    __syncthreads();
    s[t] = t;
    if (barrier) __syncthreads();
    out[t] = s[(t + 1) % blockDim.x];
}

// Threads ≥ live exit first; the others meet at a barrier (sm_70+: exited
// threads drop out of it) and read each other's values.
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_exit_then_sync(int* out, int live) {
    __shared__ int s[1024];
    const int t = threadIdx.x;
    if (t >= live) return;
    s[t] = t;
    __syncthreads();
    out[t] = s[live - 1 - t];
}

// The misuses, by `mode`: 0 a shuffle waiting for a lane that exited; 1 a
// barrier while lanes wait in a shuffle for the thread at it (deadlock); 2
// two different barriers (divergent __syncthreads; the stores around them
// keep the compiler from merging the two calls).
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_misuse(int* out, int mode) {
    const int t = threadIdx.x;
    float v = (float)t;
    if (mode == 0) {
        if (t == 5) return;
        v = warp_sum(v);
    } else if (mode == 1) {
        if (t == 0)
            __syncthreads();
        else
            v = __shfl_xor_sync(0xffffffffu, v, 1);
    } else {
        if (t & 1) {
            out[t] = 1;
            __syncthreads();
            out[t] = 2;
        } else {
            __syncthreads();
            out[t] = 3;
        }
        return;
    }
    out[t] = (int)v;
}

// `rounds` barriers and as many warp sums: the scheduler's cost alone.
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_spin(int* out, int rounds) {
    float v = (float)threadIdx.x;
    for (int r = 0; r < rounds; ++r) {
        __syncthreads();
        v = warp_sum(v) * (1.f / 32.f);
    }
    out[threadIdx.x] = (int)v;
}

// Threads whose index has the parity of the block's write s[t]; after a
// barrier every thread reads s[t]. The others read what no thread of this
// block wrote: the emulator's poison, never a value a neighbouring block
// left there (each block flips which half writes).
extern "C" __global__ void __launch_bounds__(1024) emu_selftest_unwritten_shared(int* out) {
    __shared__ float s_unused[4], s_other[2];
    __shared__ int s[1024];
    const int t = threadIdx.x;
    if (((t + blockIdx.x) & 1) == 0) s[t] = t + 1000 * (int)blockIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[t];
    if (t == 0) out[gridDim.x * blockDim.x + blockIdx.x] = __float_as_int(s_unused[3] + s_other[1]);
}
