// Token sampling, one block per slot-step (CPU reference:
// model/src/lm/sampling.rs Sampler::sample / sample_top_k, lm/conditioner.rs
// cfg_mix, lm/gen.rs step 4 and 5).
//
// Semantics, per active SlotStep with parameters p = params[slot]:
// - logits are row_cond's, or with guidance (row_null >= 0)
//   null + (cond − null) · cfg_coef, element by element;
// - greedy (use_sampling == 0 or temp <= 0): the first index of the maximum,
//   and the RNG is not touched;
// - otherwise the top_k largest logits (all when top_k is 0 or ≥ vocab) are
//   the candidates; weights exp((l − max) / temp) in f64; one draw
//   u = (next_u64 >> 11) · 2⁻⁵³ · total from the slot's xoshiro256++ state
//   (the same generator and the same number of draws per token as the CPU
//   backend, so a seed gives the same stream of uniforms); the token is the
//   first candidate, in index order, whose running sum exceeds u. Degenerate
//   weights (total not finite or 0) fall back to the argmax without a draw.
// - ties at the top-k boundary keep the lowest indices (the CPU's
//   select_nth_unstable keeps an unspecified subset), and candidates are
//   walked in index order (the CPU walks them in select order): for the same
//   uniform the two backends may pick different tokens; the distribution is
//   the same.
//
// Geometry: grid = (n_steps), block = SAMPLE_THREADS (512). The k-th largest
// key is found by an exact radix select over the order-preserving u32 image
// of the logits, 8 bits a pass from the top (256-bin shared histogram; warp
// 0 finds the bin holding the k-th key with a shuffle scan, 8 bins a lane).
// A pass whose bin is taken whole (its count equals the keys still to take)
// ends the select early: the candidates are then the keys whose selected
// top bits are above or equal to the prefix, the same set the full select
// gives. Passes that need index order give each thread one contiguous chunk
// of ceil(vocab / 512) entries. The weights are computed in f64 as the CPU
// sampler does (only for the ≤ k candidates), so that a uniform picks the
// same token on both. Shared memory: 1 KiB histogram + 16 warp partials;
// independent of vocab.
#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)

__device__ __forceinline__ u64 rotl64(u64 x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256++ (rand_xoshiro::Xoshiro256PlusPlus::next_u64).
__device__ __forceinline__ u64 xoshiro_next(u64* s) {
    const u64 result = rotl64(s[0] + s[3], 23) + s[0];
    const u64 t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

// Order-preserving image of a float (f32::total_cmp order).
__device__ __forceinline__ u32 float_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float logit(const float* __restrict__ cond, const float* __restrict__ nul, float coef,
                                       int i) {
    return nul != nullptr ? nul[i] + (cond[i] - nul[i]) * coef : cond[i];
}

// Inclusive scan over the block; `red` holds SAMPLE_WARPS entries. Returns
// the inclusive prefix of this thread and the block total in *total.
template <typename T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* red, T* total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    if (lane == 31) red[w] = v;
    __syncthreads();
    T before = 0, all = 0;
#pragma unroll
    for (int i = 0; i < SAMPLE_WARPS; ++i) {
        if (i < w) before += red[i];
        all += red[i];
    }
    __syncthreads();
    *total = all;
    return before + v;
}

// Warp 0 of a radix pass: walking the 256 bins from the top, the bin where
// the running count reaches `rest` (lane l sums bins 255 − 8l … 248 − 8l, a
// shuffle scan gives each lane the count above its bins, and the one lane
// whose bins hold the rest-th key walks them). Writes the bin, the keys still
// to take from it, and whether that is all of them. Needs rest ≥ 1 and at
// least rest keys in the histogram.
__device__ __forceinline__ void radix_pick(const int* hist, int rest, int lane, int* digit, int* left,
                                           int* whole) {
    int c[8], mine = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        c[e] = hist[255 - 8 * lane - e];
        mine += c[e];
    }
    int incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    const int before = incl - mine;
    if (before < rest && rest <= incl) {
        int acc = before;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (acc + c[e] >= rest) {
                *digit = 255 - 8 * lane - e;
                *left = rest - acc;
                *whole = c[e] == rest - acc;
                return;
            }
            acc += c[e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_tokens(const float* __restrict__ logits, int vocab, int ld, const SlotStep* __restrict__ steps,
              const SlotParams* __restrict__ params, int audio, u64* __restrict__ rng, u32* __restrict__ out,
              int out_stride) {
    __shared__ int hist[256];
    __shared__ float s_best_v[SAMPLE_WARPS];
    __shared__ int s_best_i[SAMPLE_WARPS];
    __shared__ int s_ired[SAMPLE_WARPS];
    __shared__ double s_dred[SAMPLE_WARPS];
    __shared__ int s_digit, s_rest, s_whole, s_tok, s_last;
    __shared__ double s_u;

    const SlotStep st = steps[blockIdx.x];
    if (!st.active) return;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const SlotParams p = params[st.slot];
    const float* cond = logits + (size_t)st.row_cond * ld;
    const float* nul = st.row_null >= 0 ? logits + (size_t)st.row_null * ld : nullptr;
    const float coef = p.cfg_coef;
    const float temp = audio ? p.temp_audio : p.temp_text;
    const int top_k = audio ? p.top_k_audio : p.top_k_text;
    u32* dst = out + (size_t)blockIdx.x * out_stride;

    // 1. Argmax (first index of the maximum): greedy result, softmax max, fallback.
    float bv = NEG_INF;
    int bi = vocab;
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
        const float v = logit(cond, nul, coef, i);
        if (v > bv || bi == vocab) { bv = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { s_best_v[w] = bv; s_best_i[w] = bi; }
    __syncthreads();
    bv = s_best_v[0];
    bi = s_best_i[0];
#pragma unroll
    for (int i = 1; i < SAMPLE_WARPS; ++i)
        if (s_best_v[i] > bv || (s_best_v[i] == bv && s_best_i[i] < bi)) { bv = s_best_v[i]; bi = s_best_i[i]; }
    const int argmax = bi;
    const float maxv = bv;

    if (!(p.use_sampling && temp > 0.f)) {
        if (tid == 0) *dst = (u32)argmax;
        return;
    }

    // 2. Radix select of the k-th largest key (skipped when every logit is a candidate).
    const int k = (top_k <= 0 || top_k >= vocab) ? vocab : top_k;
    u32 prefix = 0, mask = 0;
    int rest = k;  // ties at the threshold still to take
    const bool select = k < vocab;
    if (select) {
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += SAMPLE_THREADS) hist[b] = 0;
            __syncthreads();
            for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
                const u32 key = float_key(logit(cond, nul, coef, i));
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
            }
            __syncthreads();
            if (w == 0) radix_pick(hist, rest, lane, &s_digit, &s_rest, &s_whole);
            __syncthreads();
            prefix |= (u32)s_digit << shift;
            mask |= 255u << shift;
            rest = s_rest;
            if (s_whole) break;
        }
    }
    // Candidates: (key & mask) > prefix, plus the first `rest` entries with
    // (key & mask) == prefix.

    // 3. Index-ordered chunks: ties before each chunk, then weights.
    const int chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(tid * chunk, vocab), hi = min(lo + chunk, vocab);
    int my_ties = 0;
    if (select)
        for (int i = lo; i < hi; ++i) my_ties += (float_key(logit(cond, nul, coef, i)) & mask) == prefix;
    int ties_total;
    const int tie_base = block_inclusive_scan(my_ties, s_ired, &ties_total) - my_ties;

    const double inv_t = 1.0 / (double)temp;
    const double mx = (double)maxv;
    double my_sum = 0.0;
    int my_last = -1;
    {
        int tie = tie_base;
        for (int i = lo; i < hi; ++i) {
            const float v = logit(cond, nul, coef, i);
            bool in = true;
            if (select) {
                const u32 key = float_key(v) & mask;
                in = key > prefix || (key == prefix && tie < rest);
                tie += key == prefix;
            }
            if (in) {
                const double wgt = exp(((double)v - mx) * inv_t);
                my_sum += wgt;
                if (wgt > 0.0) my_last = i;
            }
        }
    }
    double total;
    const double incl = block_inclusive_scan(my_sum, s_dred, &total);
    const double excl = incl - my_sum;
    if (!(isfinite(total) && total > 0.0)) {
        if (tid == 0) *dst = (u32)argmax;
        return;
    }

    // 4. One draw from the slot's generator, then the thread whose range holds it walks its chunk.
    if (tid == 0) {
        u64* s = rng + (size_t)st.slot * 4;
        u64 state[4] = {s[0], s[1], s[2], s[3]};
        const u64 x = xoshiro_next(state);
        s[0] = state[0]; s[1] = state[1]; s[2] = state[2]; s[3] = state[3];
        s_u = (double)(x >> 11) * (1.0 / 9007199254740992.0) * total;
        s_tok = vocab;
        s_last = -1;
    }
    __syncthreads();
    const double u = s_u;
    if (my_sum > 0.0 && u >= excl && u < incl) {
        double acc = excl;
        int tie = tie_base;
        for (int i = lo; i < hi; ++i) {
            const float v = logit(cond, nul, coef, i);
            bool in = true;
            if (select) {
                const u32 key = float_key(v) & mask;
                in = key > prefix || (key == prefix && tie < rest);
                tie += key == prefix;
            }
            if (in) {
                acc += exp(((double)v - mx) * inv_t);
                if (u < acc) {
                    // Rounding of the scanned sums can let two neighbouring
                    // ranges overlap at their seam: the lower index wins,
                    // whatever the order the threads write in.
                    atomicMin(&s_tok, i);
                    break;
                }
            }
        }
    }
    if (my_last >= 0) atomicMax(&s_last, my_last);
    __syncthreads();
    if (tid == 0) {
        // Rounding left u past every running sum: the last candidate with weight.
        const int tok = s_tok < vocab ? s_tok : (s_last >= 0 ? s_last : argmax);
        *dst = (u32)tok;
    }
}
