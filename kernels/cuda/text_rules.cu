// Kyutai's text sampling rules (CPU reference: model/src/lm/text_rules.rs),
// applied to a slot-step's text logits before sample_tokens, and the
// history they read, recorded after the token is chosen.
//
// Per slot: rules[slot] = {pad_bonus, context, penalty} (context 0: no
// penalty); hist[slot][cap] u32, a ring of the last `cap` counted tokens
// (neither the padding id, 0, nor the start token text_card), hist_n[slot]
// tokens recorded, of which the newest is at (hist_n − 1) % cap.
//
// text_rules_apply: walking the newest `context` recorded tokens, each
// distinct token's logit (row row_cond of `logits`) is divided by `penalty`
// when ≥ 0, multiplied otherwise; `seen[slot][vocab]` (u8, all zero, left
// all zero) marks tokens already done. Then logit[pad] += pad_bonus.
// Slot-steps with guidance never carry rules (refused at reset).
//
// Geometry: grid = ceil(n_steps / RULES_THREADS), block = RULES_THREADS, a
// thread per step (a slot appears once per launch).
#define RULES_THREADS 128

struct TextRules {
    float pad_bonus;
    int context;
    float penalty;
};

extern "C" __global__ void __launch_bounds__(RULES_THREADS)
text_rules_apply(const SlotStep* __restrict__ steps, int n_steps, float* __restrict__ logits, int ld, int vocab,
                 const TextRules* __restrict__ rules, const u32* __restrict__ hist, const int* __restrict__ hist_n,
                 int cap, unsigned char* __restrict__ seen, int pad) {
    const int s = blockIdx.x * RULES_THREADS + threadIdx.x;
    if (s >= n_steps) return;
    const SlotStep st = steps[s];
    if (!st.active) return;
    const TextRules r = rules[st.slot];
    float* l = logits + (size_t)st.row_cond * ld;
    const u32* h = hist + (size_t)st.slot * cap;
    unsigned char* sn = seen + (size_t)st.slot * vocab;
    const int n = hist_n[st.slot];
    const int m = min(min(r.context, n), cap);
    for (int i = 0; i < m; ++i) {
        const u32 t = h[(n - 1 - i) % cap];
        if ((int)t >= vocab || sn[t]) continue;
        sn[t] = 1;
        l[t] = l[t] >= 0.f ? l[t] / r.penalty : l[t] * r.penalty;
    }
    for (int i = 0; i < m; ++i) {
        const u32 t = h[(n - 1 - i) % cap];
        if ((int)t < vocab) sn[t] = 0;
    }
    if (pad < vocab) l[pad] += r.pad_bonus;
}

// Records text[s] (the chosen token) in the slot's history unless it is
// one the penalty never counts. Geometry as text_rules_apply.
extern "C" __global__ void __launch_bounds__(RULES_THREADS)
text_history_push(const SlotStep* __restrict__ steps, int n_steps, const u32* __restrict__ text,
                  u32* __restrict__ hist, int* __restrict__ hist_n, int cap, int pad, int start) {
    const int s = blockIdx.x * RULES_THREADS + threadIdx.x;
    if (s >= n_steps) return;
    const SlotStep st = steps[s];
    if (!st.active) return;
    const u32 t = text[s];
    if ((int)t == pad || t == 0 || (int)t == start) return;
    const int n = hist_n[st.slot];
    hist[(size_t)st.slot * cap + n % cap] = t;
    // Wraps after 2^31 tokens only modulo cap, which n % cap keeps right as
    // long as cap divides 2^31 (a power of two).
    hist_n[st.slot] = (n + 1) & 0x7fffffff;
}
