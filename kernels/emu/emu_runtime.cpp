// The emulator's fiber scheduler: runs a kernel launch on the calling OS
// thread, block after block, each CUDA thread of a block as a fiber.
//
// A block runs in passes: every ready fiber, in a permuted order, runs until
// it reaches a barrier, a warp operation or its end. Then:
// - a __syncthreads completes when every live (not exited) thread of the
//   block waits at it (sm_70+ behaviour: exited threads drop out of the
//   count), and all of them must wait at the same one (same source line);
// - a warp operation completes when every lane of its mask has arrived; a
//   lane of the mask that has exited, or does not exist, is an error;
// - a pass in which nothing can run while threads still wait is a deadlock:
//   an error naming who waits where, never a hang.
// An error abandons the launch (the fibers' stacks are simply reused: kernels
// hold no resources), and the message goes back to the caller.
//
// The permutation: reverse thread order by default (a missing barrier
// between a write by a low thread and a read by a high one shows up), forward
// order, or a seeded shuffle drawn anew for every pass. Blocks follow the
// same order, so a kernel that depends on the order of its blocks shows too.
// "Warps ahead" runs one warp at a time, in a seeded order, each as far as it
// goes (through its warp shuffles, up to a __syncthreads): on a GPU warps
// drift apart between block barriers, so a warp may overwrite shared memory
// that another has not read yet — which lane-by-lane passes never show,
// since every warp operation holds a warp's lanes together.
//
// Fiber switches are a few instructions of assembly on x86-64 (callee-saved
// registers and the stack pointer); other architectures use ucontext, which
// is correct but makes a system call per switch. A thread takes a 64 KiB
// stack (above a guard page: an overflow faults instead of corrupting
// memory) when it starts and gives it back when it exits; a thread that exits
// hands its stack straight to the next thread of the pass if that one has not
// started, so a block without barriers costs two switches, not two per
// thread. Stacks belong to the OS thread and are reused by every launch on it.
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <vector>

// MOSHID_EMU_UCONTEXT forces the portable switch (to test it on x86-64).
#if defined(__x86_64__) && !defined(MOSHID_EMU_UCONTEXT)
#define EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

__thread emu_ctx_t emu_ctx;

namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr unsigned kMaxThreads = 1024;

enum State : unsigned char { READY, BARRIER, WARP, EXITED };

struct Fiber {
#if EMU_ASM_SWITCH
    void* sp;
#else
    ucontext_t uc;
#endif
    State st;
    bool started;      // has run (then it owns a stack until it exits)
    unsigned stack;    // the stack it runs on, once started
    const char* site;  // the barrier it waits at ("file:line")
};

struct Warp {
    uint64_t val[32];
    uint64_t res[32];
    int src[32];
    unsigned mask;     // mask of the operation in progress
    unsigned arrived;  // lanes that have arrived at it
    unsigned exists;   // lanes that exist in this block
    unsigned exited;   // lanes that have exited
    int kind;          // 0 shuffle, 1 syncwarp
};

struct Sched {
    // Stacks: one mapping, a guard page below each fiber's stack.
    char* stacks = nullptr;
    size_t n_stacks = 0;
    size_t page = 4096;

    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    std::vector<unsigned> order;
    std::vector<unsigned> free_stacks;
    unsigned pass_pos = 0;  // position in `order` of the pass being run
    bool ahead = false;     // warps ahead (see permute)
    std::vector<unsigned> warp_order;
#if EMU_ASM_SWITCH
    void* main_sp = nullptr;
#else
    ucontext_t main_uc;
#endif
    unsigned n = 0;  // threads in the block
    unsigned cur = 0;
    unsigned live = 0;
    unsigned at_barrier = 0;
    emu::thunk_t thunk = nullptr;
    void** args = nullptr;
    bool failed = false;
    char msg[512];
    unsigned long long switches = 0;
    uint64_t rng = 0;

    ~Sched() {
        if (stacks) munmap(stacks, n_stacks * (kStackBytes + page));
    }
};

__thread Sched* tls_sched = nullptr;
thread_local std::unique_ptr<Sched> tls_owner;

Sched* sched() {
    if (!tls_sched) {
        tls_owner.reset(new Sched());
        tls_sched = tls_owner.get();
        const long pg = sysconf(_SC_PAGESIZE);
        if (pg > 0) tls_sched->page = (size_t)pg;
    }
    return tls_sched;
}

bool ensure_stacks(Sched* s, unsigned n) {
    if (s->n_stacks >= n) return true;
    if (s->stacks) munmap(s->stacks, s->n_stacks * (kStackBytes + s->page));
    s->stacks = nullptr;
    s->n_stacks = 0;
    const size_t slot = kStackBytes + s->page;
    void* m = mmap(nullptr, n * slot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    char* base = (char*)m;
    for (unsigned i = 0; i < n; ++i) mprotect(base + i * slot, s->page, PROT_NONE);
    s->stacks = base;
    s->n_stacks = n;
    return true;
}

char* stack_top(Sched* s, unsigned i) { return s->stacks + (size_t)(i + 1) * (kStackBytes + s->page); }

// ---------------------------------------------------------------- context switch

#if EMU_ASM_SWITCH
extern "C" void emu_switch(void** save_sp, void* load_sp);
// Saves the callee-saved registers on the current stack, stores the stack
// pointer in *save_sp, loads load_sp and restores what that stack saved.
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
#endif

[[noreturn]] void fiber_main();

// Starts thread i on a free stack (from the scheduler).
void start_fiber(Sched* s, unsigned i) {
    const unsigned stack = s->free_stacks.back();
    s->free_stacks.pop_back();
    Fiber& f = s->fibers[i];
    f.started = true;
    f.stack = stack;
    char* top = stack_top(s, stack);
    s->cur = i;
    emu_ctx.thread_idx.x = i;
    ++s->switches;
#if EMU_ASM_SWITCH
    // [top-8]: a null fake return address of fiber_main; [top-16]: the address
    // emu_switch's `ret` jumps to (16-byte aligned, so that fiber_main starts
    // with rsp ≡ 8 mod 16 as after a call); below, six zeroed registers.
    void** sp = (void**)top;
    *--sp = nullptr;
    *--sp = (void*)&fiber_main;
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    emu_switch(&s->main_sp, sp);
#else
    ucontext_t* uc = &f.uc;
    getcontext(uc);
    uc->uc_stack.ss_sp = top - kStackBytes;
    uc->uc_stack.ss_size = kStackBytes;
    uc->uc_link = nullptr;
    makecontext(uc, (void (*)())fiber_main, 0);
    swapcontext(&s->main_uc, uc);
#endif
}

// Resumes thread i where it waits (from the scheduler).
inline void resume_fiber(Sched* s, unsigned i) {
    s->cur = i;
    emu_ctx.thread_idx.x = i;
    ++s->switches;
#if EMU_ASM_SWITCH
    emu_switch(&s->main_sp, s->fibers[i].sp);
#else
    swapcontext(&s->main_uc, &s->fibers[i].uc);
#endif
}

// From the running fiber back to the scheduler.
inline void yield_to_main(Sched* s) {
    Fiber& f = s->fibers[s->cur];
    ++s->switches;
#if EMU_ASM_SWITCH
    emu_switch(&f.sp, s->main_sp);
#else
    swapcontext(&f.uc, &s->main_uc);
#endif
    // Resumed: threadIdx was set by resume_fiber.
}

// The body of every stack: runs the kernel for its thread, and, through
// emu_thread_exit, for the next threads of the pass as long as they have not
// started yet (a kernel without barriers runs a whole block on one stack with
// two switches); then frees the stack and goes back to the scheduler.
[[noreturn]] void fiber_main() {
    Sched* s = tls_sched;
    s->thunk(s->args);
    s->free_stacks.push_back(s->fibers[s->cur].stack);
    ++s->switches;
#if EMU_ASM_SWITCH
    void* dead;
    emu_switch(&dead, s->main_sp);
#else
    setcontext(&s->main_uc);
#endif
    __builtin_unreachable();
}

// ---------------------------------------------------------------- warp operations

// Common arrival logic; returns the lane's result.
uint64_t warp_arrive(Sched* s, int kind, unsigned mask, uint64_t bits, int src) {
    const unsigned t = s->cur, lane = t & 31, wi = t >> 5;
    Warp& w = s->warps[wi];
    const char* what = kind == 0 ? "shuffle" : "__syncwarp";
    const unsigned bit = 1u << lane;
    if (!(mask & bit)) {
        snprintf(s->msg, sizeof s->msg, "thread %u: warp %s with a mask (0x%08x) that leaves out its own lane", t, what,
                 mask);
        s->failed = true;
        yield_to_main(s);
    }
    if (w.arrived == 0) {
        // The first lane to arrive checks the mask; a lane that exits later
        // while the operation waits is caught in fiber_main.
        const unsigned missing = mask & ~w.exists, gone = mask & w.exited;
        if (missing) {
            snprintf(s->msg, sizeof s->msg,
                     "thread %u: warp %s over mask 0x%08x names lane %d, which does not exist (block of %u threads)",
                     t, what, mask, __builtin_ctz(missing), s->n);
            s->failed = true;
            yield_to_main(s);
        }
        if (gone) {
            const unsigned l = (unsigned)__builtin_ctz(gone);
            snprintf(s->msg, sizeof s->msg,
                     "thread %u: warp %s over mask 0x%08x waits for lane %u (thread %u), which has exited", t, what,
                     mask, l, wi * 32 + l);
            s->failed = true;
            yield_to_main(s);
        }
        w.mask = mask;
        w.kind = kind;
    } else if (w.mask != mask || w.kind != kind) {
        snprintf(s->msg, sizeof s->msg,
                 "thread %u: warp %s over mask 0x%08x while other lanes of warp %u are in a warp %s over mask 0x%08x",
                 t, what, mask, wi, w.kind == 0 ? "shuffle" : "__syncwarp", w.mask);
        s->failed = true;
        yield_to_main(s);
    }
    if (src >= 0 && !(mask & (1u << (src & 31)))) {
        snprintf(s->msg, sizeof s->msg, "thread %u: shuffle reads lane %d, outside its mask 0x%08x", t, src, mask);
        s->failed = true;
        yield_to_main(s);
    }
    w.val[lane] = bits;
    w.src[lane] = src;
    w.arrived |= bit;
    if (w.arrived == mask) {
        // Complete: compute every lane's result before any of them runs on.
        for (unsigned l = 0; l < 32; ++l) {
            if (!(mask & (1u << l))) continue;
            w.res[l] = w.src[l] >= 0 ? w.val[w.src[l] & 31] : w.val[l];
            if (l != lane) s->fibers[wi * 32 + l].st = READY;
        }
        w.arrived = 0;
        return w.res[lane];
    }
    s->fibers[t].st = WARP;
    yield_to_main(s);
    return w.res[lane];
}

void describe_deadlock(Sched* s) {
    unsigned at_bar = 0, at_warp = 0, exited = 0, first_warp = 0;
    for (unsigned i = 0; i < s->n; ++i) {
        switch (s->fibers[i].st) {
            case BARRIER: ++at_bar; break;
            case WARP:
                if (!at_warp) first_warp = i;
                ++at_warp;
                break;
            case EXITED: ++exited; break;
            default: break;
        }
    }
    if (at_warp) {
        const Warp& w = s->warps[first_warp >> 5];
        snprintf(s->msg, sizeof s->msg,
                 "deadlock: %u threads wait at __syncthreads, %u in warp operations (thread %u waits in warp %u for "
                 "lanes 0x%08x of mask 0x%08x), %u exited",
                 at_bar, at_warp, first_warp, first_warp >> 5, w.mask & ~w.arrived, w.mask, exited);
    } else {
        snprintf(s->msg, sizeof s->msg, "deadlock: %u threads wait at __syncthreads, %u exited", at_bar, exited);
    }
    s->failed = true;
}

uint64_t next_rand(Sched* s) {
    // splitmix64
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// order: 0 reverse, 1 forward, other values seed a fresh shuffle per pass;
// with the high bit (warps ahead) the warps are shuffled and each warp's
// lanes run from the highest down, one warp after another (run_block then
// runs each warp as far as it can before the next one starts).
constexpr unsigned kWarpsAhead = 0x80000000u;

void permute(Sched* s, unsigned order, std::vector<unsigned>& v, unsigned n) {
    v.resize(n);
    if (order & kWarpsAhead) {
        const unsigned nw = (n + 31) / 32;
        std::vector<unsigned>& w = s->warp_order;
        w.resize(nw);
        for (unsigned i = 0; i < nw; ++i) w[i] = i;
        for (unsigned i = nw; i > 1; --i) {
            const unsigned j = (unsigned)(next_rand(s) % i);
            const unsigned t = w[i - 1];
            w[i - 1] = w[j];
            w[j] = t;
        }
        unsigned k = 0;
        for (unsigned i = 0; i < nw; ++i) {
            const unsigned lo = w[i] * 32, hi = lo + 32 < n ? lo + 32 : n;
            for (unsigned t = hi; t > lo; --t) v[k++] = t - 1;
        }
        return;
    }
    for (unsigned i = 0; i < n; ++i) v[i] = order == 0 ? n - 1 - i : i;
    if (order >= 2)
        for (unsigned i = n; i > 1; --i) {
            const unsigned j = (unsigned)(next_rand(s) % i);
            const unsigned t = v[i - 1];
            v[i - 1] = v[j];
            v[j] = t;
        }
}

// Whether a lane of warp w is ready to run.
bool warp_ready(const Sched* s, unsigned w) {
    const unsigned lo = w * 32, hi = lo + 32 < s->n ? lo + 32 : s->n;
    for (unsigned t = lo; t < hi; ++t)
        if (s->fibers[t].st == READY) return true;
    return false;
}

bool run_block(Sched* s, unsigned order) {
    for (unsigned i = 0; i < s->n; ++i) {
        Fiber& f = s->fibers[i];
        f.st = READY;
        f.started = false;
        f.site = nullptr;
    }
    s->free_stacks.resize(s->n);
    for (unsigned i = 0; i < s->n; ++i) s->free_stacks[i] = s->n - 1 - i;
    for (unsigned i = 0; i < s->warps.size(); ++i) {
        Warp& w = s->warps[i];
        const unsigned lanes = s->n - i * 32 >= 32 ? 32 : s->n - i * 32;
        w.arrived = 0;
        w.exited = 0;
        w.exists = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
    }
    s->live = s->n;
    s->at_barrier = 0;
    for (;;) {
        bool ran = false;
        if (order >= 2 || s->order.size() != s->n) permute(s, order, s->order, s->n);
        // A fiber may run several fresh threads of the pass in a row (it
        // advances pass_pos): see fiber_main. Warps ahead: at the end of a
        // warp's stretch of the order, its lanes run again while any is
        // ready (past its shuffles, up to a block barrier or its end).
        unsigned seg = 0;
        for (s->pass_pos = 0; s->pass_pos < s->n; ++s->pass_pos) {
            const unsigned i = s->order[s->pass_pos];
            Fiber& f = s->fibers[i];
            if (f.st == READY) {
                if (f.started)
                    resume_fiber(s, i);
                else
                    start_fiber(s, i);
                ran = true;
                if (s->failed) return false;
            }
            if (s->ahead) {
                const unsigned p = s->pass_pos, w = s->order[p] >> 5;
                if (p + 1 == s->n || (s->order[p + 1] >> 5) != w) {
                    if (warp_ready(s, w)) {
                        s->pass_pos = seg - 1;  // the loop's ++ brings it to seg
                        continue;
                    }
                    seg = p + 1;
                }
            }
        }
        if (s->live == 0) return true;
        if (s->at_barrier == s->live) {
            const char* site = nullptr;
            unsigned first = 0;
            for (unsigned i = 0; i < s->n; ++i) {
                Fiber& f = s->fibers[i];
                if (f.st != BARRIER) continue;
                if (!site) {
                    site = f.site;
                    first = i;
                } else if (f.site != site && strcmp(f.site, site) != 0) {
                    snprintf(s->msg, sizeof s->msg,
                             "divergent __syncthreads: thread %u waits at %s, thread %u at %s", first, site, i,
                             f.site);
                    s->failed = true;
                    return false;
                }
                f.st = READY;
            }
            s->at_barrier = 0;
            continue;
        }
        bool ready = false;
        for (unsigned i = 0; i < s->n && !ready; ++i) ready = s->fibers[i].st == READY;
        if (!ran && !ready) {
            describe_deadlock(s);
            return false;
        }
    }
}

}  // namespace

// ---------------------------------------------------------------- entry points for the kernels

extern "C" void emu_syncthreads(const char* site) {
    Sched* s = tls_sched;
    Fiber& f = s->fibers[s->cur];
    f.st = BARRIER;
    f.site = site;
    ++s->at_barrier;
    yield_to_main(s);
}

extern "C" int emu_thread_exit(void) {
    Sched* s = tls_sched;
    const unsigned t = s->cur;
    Fiber& f = s->fibers[t];
    f.st = EXITED;
    --s->live;
    Warp& w = s->warps[t >> 5];
    w.exited |= 1u << (t & 31);
    if (w.arrived != 0 && (w.mask & (1u << (t & 31)))) {
        snprintf(s->msg, sizeof s->msg, "thread %u exited while lanes of its warp %u wait for it in a warp %s", t,
                 t >> 5, w.kind == 0 ? "shuffle" : "__syncwarp");
        s->failed = true;
    }
    const unsigned k = s->pass_pos + 1;
    if (s->failed || k >= s->n) return 0;
    const unsigned next = s->order[k];
    // Warps ahead: never start another warp's thread before this warp is done.
    if (s->ahead && (next >> 5) != (t >> 5)) return 0;
    Fiber& g = s->fibers[next];
    if (g.started || g.st != READY) return 0;
    // Hand the stack over.
    s->pass_pos = k;
    g.started = true;
    g.stack = f.stack;
    s->cur = next;
    emu_ctx.thread_idx.x = next;
    return 1;
}

extern "C" void emu_syncwarp(unsigned mask) { warp_arrive(tls_sched, 1, mask, 0, -1); }

extern "C" uint64_t emu_shuffle(unsigned mask, uint64_t bits, int src) {
    return warp_arrive(tls_sched, 0, mask, bits, src);
}

// ---------------------------------------------------------------- the C ABI of emu.rs

extern "C" {

// Runs `thunk` over grid (x, y, z) of blocks of `block` threads. Returns 0,
// or 1 with a NUL-terminated message in err (at most err_len bytes).
int moshid_emu_launch(emu::thunk_t thunk, const unsigned* grid, unsigned block, void** args, unsigned order,
                      char* err, size_t err_len) {
    Sched* s = sched();
    auto error = [&](const char* m) {
        if (err_len) snprintf(err, err_len, "%s", m);
        return 1;
    };
    if (block == 0 || block > kMaxThreads) return error("block size must be 1..=1024");
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return error("empty grid");
    if (s->n != 0 && s->thunk != nullptr) return error("nested launch from inside a kernel");
    if (!ensure_stacks(s, block)) return error("cannot map fiber stacks");
    s->n = block;
    s->fibers.resize(block);
    s->warps.resize((block + 31) / 32);
    s->thunk = thunk;
    s->args = args;
    s->failed = false;
    s->msg[0] = 0;
    s->rng = order;
    s->ahead = (order & kWarpsAhead) != 0;
    s->order.clear();
    emu_ctx.block_dim = {block, 1, 1};
    emu_ctx.grid_dim = {grid[0], grid[1], grid[2]};
    emu_ctx.thread_idx = {0, 0, 0};
    const unsigned long long total = (unsigned long long)grid[0] * grid[1] * grid[2];
    int rc = 0;
    // Block order: reverse, forward, or b = (k·p + q) mod total with p
    // coprime to total (a seeded bijection).
    unsigned long long p = 1, q = 0;
    if (order >= 2) {
        p = (next_rand(s) % total) | 1;
        for (;;) {
            unsigned long long a = p, c = total;
            while (c) {
                const unsigned long long r = a % c;
                a = c;
                c = r;
            }
            if (a == 1) break;
            p += 2;
        }
        q = next_rand(s) % total;
    }
    for (unsigned long long k = 0; k < total; ++k) {
        unsigned long long b = k;
        if (order == 0)
            b = total - 1 - k;
        else if (order >= 2)
            b = (unsigned long long)(((__uint128_t)k * p + q) % total);
        emu_ctx.block_idx.x = (unsigned)(b % grid[0]);
        emu_ctx.block_idx.y = (unsigned)((b / grid[0]) % grid[1]);
        emu_ctx.block_idx.z = (unsigned)(b / ((unsigned long long)grid[0] * grid[1]));
        // A new block: its shared memory is poisoned anew (EMU_SHARED_POISON).
        ++emu_ctx.block_serial;
        if (!run_block(s, order)) {
            char m[700];
            snprintf(m, sizeof m, "block (%u, %u, %u): %s", emu_ctx.block_idx.x, emu_ctx.block_idx.y,
                     emu_ctx.block_idx.z, s->msg);
            rc = error(m);
            break;
        }
    }
    s->thunk = nullptr;
    s->n = 0;
    return rc;
}

// Device memory for emu.rs: `bytes` (rounded up to 256) of zeroed memory,
// 256-byte aligned, placed at the end of its own mapping and followed by an
// inaccessible guard page, so that a kernel running past the end of a buffer
// faults instead of corrupting its neighbour. The whole mapping is returned
// in *map / *map_len for moshid_emu_free. Null when the mapping fails.
void* moshid_emu_alloc(size_t bytes, void** map, size_t* map_len) {
    const long pg = sysconf(_SC_PAGESIZE);
    const size_t page = pg > 0 ? (size_t)pg : 4096;
    const size_t rounded = (bytes + 255) / 256 * 256;
    const size_t body = (rounded + page - 1) / page * page;
    const size_t len = (body == 0 ? page : body) + page;
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    char* guard = (char*)m + (len - page);
    if (mprotect(guard, page, PROT_NONE) != 0) {
        munmap(m, len);
        return nullptr;
    }
    *map = m;
    *map_len = len;
    return guard - rounded;
}

// Frees a mapping of moshid_emu_alloc.
void moshid_emu_free(void* map, size_t map_len) { munmap(map, map_len); }

// Fiber switches made on this OS thread so far.
unsigned long long moshid_emu_switches(void) { return tls_sched ? tls_sched->switches : 0; }

}  // extern "C"
