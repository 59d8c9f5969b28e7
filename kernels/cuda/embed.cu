// The delayed token cache and the input embeddings of the LM
// (CPU reference: model/src/lm/gen.rs Lm::step parts 1, 2 and 6;
// lm/embeddings.rs; lm/depformer.rs for the depformer inputs).
//
// Token cache: per slot, K = n_q + 1 rings of CT = max_delay + 2 entries,
// cache[slot][k][CT] (u32), and offset[slot] = steps run since reset. Per
// step t = offset[slot]: user codebook k = 1 + dep_q + j is written at
// (t + delay[k]) % CT; the input of codebook k is the initial token (text:
// text_card, audio: card) while t <= delay[k], else entry t % CT. After
// sampling, t + 1 is stored into offset, the sampled tokens at (t + 1) % CT,
// and once t + 1 > max_delay the undelayed frame
// (t + 1 − max_delay + delay[k]) % CT, k = 0..=dep_q, is read out.
//
// PersonaPlex (NVIDIA's LMGen; CPU reference: gen.rs module doc): the ring
// is `lag` = 1 entry longer, user codes go to (t + delay[k] + lag) % CT and
// mark their entry forced (forced[slot][k][CT], i32, NULL for Kyutai's
// models); force_tokens replaces a sampled token by its forced target
// (t + 1) % CT; token_cache_out clears the flags of entry t % CT.
//
// Invariants: only active SlotSteps read or write a slot's cache or offset;
// each slot appears at most once in a launch (the host guarantees it), so a
// thread per step owns its slot. Precondition: user codes are at most card
// (card itself is the initial / end-of-stream id), as the RVQ encoder produces.
#define TOK_THREADS 128
#define EMB_THREADS 256

// Geometry: grid = ceil(n_steps / TOK_THREADS), block = TOK_THREADS, a thread per step.
extern "C" __global__ void __launch_bounds__(TOK_THREADS)
token_cache_in(const SlotStep* __restrict__ steps, int n_steps, const u32* __restrict__ user_codes, int n_user,
               u32* __restrict__ cache, const int* __restrict__ offset, const int* __restrict__ delays, int K, int CT,
               int dep_q, int card, int text_card, u32* __restrict__ tokens, int lag, int* __restrict__ forced) {
    const int s = blockIdx.x * TOK_THREADS + threadIdx.x;
    if (s >= n_steps) return;
    const SlotStep st = steps[s];
    if (!st.active) return;
    const int t = offset[st.slot];
    u32* c = cache + (size_t)st.slot * K * CT;
    for (int j = 0; j < n_user; ++j) {
        const int k = 1 + dep_q + j;
        const int at = k * CT + (t + delays[k] + lag) % CT;
        c[at] = user_codes[(size_t)s * n_user + j];
        if (forced != nullptr) forced[(size_t)st.slot * K * CT + at] = 1;
    }
    for (int k = 0; k < K; ++k)
        tokens[(size_t)s * K + k] = t <= delays[k] ? (k == 0 ? (u32)text_card : (u32)card) : c[k * CT + t % CT];
}

// Geometry as token_cache_in. text[s], audio[s][dep_q]: the sampled tokens;
// out[s][1 + dep_q] and ready[s] the undelayed frame (ready = 0: none yet).
extern "C" __global__ void __launch_bounds__(TOK_THREADS)
token_cache_out(const SlotStep* __restrict__ steps, int n_steps, const u32* __restrict__ text,
                const u32* __restrict__ audio, u32* __restrict__ cache, int* __restrict__ offset,
                const int* __restrict__ delays, int K, int CT, int dep_q, int max_delay, u32* __restrict__ out,
                int* __restrict__ ready, int* __restrict__ forced) {
    const int s = blockIdx.x * TOK_THREADS + threadIdx.x;
    if (s >= n_steps) return;
    const SlotStep st = steps[s];
    if (!st.active) return;
    const int t = offset[st.slot] + 1;
    offset[st.slot] = t;
    u32* c = cache + (size_t)st.slot * K * CT;
    if (forced != nullptr)
        for (int k = 0; k < K; ++k) forced[(size_t)st.slot * K * CT + k * CT + (t - 1) % CT] = 0;
    c[t % CT] = text[s];
    for (int k = 0; k < dep_q; ++k) c[(1 + k) * CT + t % CT] = audio[(size_t)s * dep_q + k];
    if (t > max_delay) {
        for (int k = 0; k <= dep_q; ++k) out[(size_t)s * (1 + dep_q) + k] = c[k * CT + (t - max_delay + delays[k]) % CT];
        ready[s] = 1;
    } else {
        ready[s] = 0;
    }
}

// tok[s · stride] = the forced target of codebook row k when its entry
// (offset + 1) % CT is forced (PersonaPlex), else left as sampled. Launched
// after the text sampling (k = 0) and after each depformer step (k = 1 + j),
// before token_cache_out. Geometry as token_cache_in.
extern "C" __global__ void __launch_bounds__(TOK_THREADS)
force_tokens(const SlotStep* __restrict__ steps, int n_steps, const u32* __restrict__ cache,
             const int* __restrict__ forced, const int* __restrict__ offset, int K, int CT, int k,
             u32* __restrict__ tok, int stride) {
    const int s = blockIdx.x * TOK_THREADS + threadIdx.x;
    if (s >= n_steps) return;
    const SlotStep st = steps[s];
    if (!st.active) return;
    const size_t at = (size_t)st.slot * K * CT + (size_t)k * CT + (offset[st.slot] + 1) % CT;
    if (forced[at]) tok[(size_t)s * stride] = cache[at];
}

// x[r] = Σ_{k<n_q} audio_emb[k][tok[k+1]] + text_emb[tok[0]] (+ cond[kv row]),
// summed in f32 in that order (the reference's order). audio_emb is the
// stacked [n_q][card + 1][dim] table, text_emb [text_card + 1][dim], both
// bf16 (or f32 in the exact-reference precision), cond [cache rows][dim] f32
// or null. tokens[step][K] from token_cache_in.
// Geometry: grid = (ceil(dim / EMB_THREADS), rows), block = EMB_THREADS.
// Masked rows get zeros.
template <typename T>
__device__ __forceinline__ void embed_sum_t(float* __restrict__ x, const T* __restrict__ audio_emb,
                                            const T* __restrict__ text_emb, const float* __restrict__ cond,
                                            const RowInfo* __restrict__ rows, const u32* __restrict__ tokens, int K,
                                            int card, int dim) {
    const int i = blockIdx.x * EMB_THREADS + threadIdx.x;
    const int r = blockIdx.y;
    if (i >= dim) return;
    const RowInfo ri = rows[r];
    float* xr = x + (size_t)r * dim;
    if (!ri.active) {
        xr[i] = 0.f;
        return;
    }
    const u32* tok = tokens + (size_t)ri.step * K;
    float acc = 0.f;
    for (int k = 0; k + 1 < K; ++k) acc += to_f32(audio_emb[((size_t)k * (card + 1) + tok[k + 1]) * dim + i]);
    acc += to_f32(text_emb[(size_t)tok[0] * dim + i]);
    if (cond != nullptr) acc += cond[(size_t)ri.kv * dim + i];
    xr[i] = acc;
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_sum(float* __restrict__ x, const bf16* __restrict__ audio_emb, const bf16* __restrict__ text_emb,
          const float* __restrict__ cond, const RowInfo* __restrict__ rows, const u32* __restrict__ tokens, int K,
          int card, int dim) {
    embed_sum_t(x, audio_emb, text_emb, cond, rows, tokens, K, card, dim);
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_sum_f32(float* __restrict__ x, const float* __restrict__ audio_emb, const float* __restrict__ text_emb,
              const float* __restrict__ cond, const RowInfo* __restrict__ rows, const u32* __restrict__ tokens, int K,
              int card, int dim) {
    embed_sum_t(x, audio_emb, text_emb, cond, rows, tokens, K, card, dim);
}

// Depformer input: x[r] += table[tok], tok = tokens[rows[r].step · stride]
// (the text token at step 0, audio codebook k − 1 at step k). Full-rank
// tables only. Geometry as embed_sum; masked rows are left as they are.
template <typename T>
__device__ __forceinline__ void embed_add_rows_t(float* __restrict__ x, const T* __restrict__ table,
                                                 const RowInfo* __restrict__ rows, const u32* __restrict__ tokens,
                                                 int stride, int dim) {
    const int i = blockIdx.x * EMB_THREADS + threadIdx.x;
    const int r = blockIdx.y;
    if (i >= dim) return;
    const RowInfo ri = rows[r];
    if (!ri.active) return;
    const u32 t = tokens[(size_t)ri.step * stride];
    x[(size_t)r * dim + i] += to_f32(table[(size_t)t * dim + i]);
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_add_rows(float* __restrict__ x, const bf16* __restrict__ table, const RowInfo* __restrict__ rows,
               const u32* __restrict__ tokens, int stride, int dim) {
    embed_add_rows_t(x, table, rows, tokens, stride, dim);
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_add_rows_f32(float* __restrict__ x, const float* __restrict__ table, const RowInfo* __restrict__ rows,
                   const u32* __restrict__ tokens, int stride, int dim) {
    embed_add_rows_t(x, table, rows, tokens, stride, dim);
}

// Low-rank tables: out[r] = table[tok] ([rows][rank], the table's type), then
// a GEMM with the [dim][rank] projection accumulates into x. Masked rows get
// zeros. Geometry as embed_sum with `rank` in place of dim.
template <typename T>
__device__ __forceinline__ void embed_gather_rows_t(T* __restrict__ out, const T* __restrict__ table,
                                                    const RowInfo* __restrict__ rows, const u32* __restrict__ tokens,
                                                    int stride, int rank) {
    const int i = blockIdx.x * EMB_THREADS + threadIdx.x;
    const int r = blockIdx.y;
    if (i >= rank) return;
    const RowInfo ri = rows[r];
    if (ri.active)
        out[(size_t)r * rank + i] = table[(size_t)tokens[(size_t)ri.step * stride] * rank + i];
    else
        store(out + (size_t)r * rank + i, 0.f);
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_gather_rows(bf16* __restrict__ out, const bf16* __restrict__ table, const RowInfo* __restrict__ rows,
                  const u32* __restrict__ tokens, int stride, int rank) {
    embed_gather_rows_t(out, table, rows, tokens, stride, rank);
}

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_gather_rows_f32(float* __restrict__ out, const float* __restrict__ table, const RowInfo* __restrict__ rows,
                      const u32* __restrict__ tokens, int stride, int rank) {
    embed_gather_rows_t(out, table, rows, tokens, stride, rank);
}

// codes[s][0..n] = value for every step s whose flag[s] is set (Hibiki's
// end-of-stream frame: every user codebook is `card`). Rows whose flag is
// clear are untouched. Geometry as token_cache_in.
extern "C" __global__ void __launch_bounds__(TOK_THREADS)
fill_flagged_rows(u32* __restrict__ codes, int stride, int n, const int* __restrict__ flags, int n_steps, u32 value) {
    const int s = blockIdx.x * TOK_THREADS + threadIdx.x;
    if (s >= n_steps || !flags[s]) return;
    for (int j = 0; j < n; ++j) codes[(size_t)s * stride + j] = value;
}
