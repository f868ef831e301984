// A CPU emulation of the CUDA built-ins the kernels use, so that the very
// source NVRTC compiles (src/cuda/kernels) runs on a machine without a GPU.
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread, run
// in turn until it waits at a barrier or returns; blocks run one after
// another. __syncthreads is a barrier of the block's threads, a warp
// shuffle a barrier of the warp's; threads that return leave both, as
// exited threads do on a GPU. Shared memory is static storage (one block
// runs at a time). Slow next to a GPU, but exact in what it tests:
// indexing, bit decoding, reductions, block-wide control flow.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define FERRUM_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct dim3e { unsigned x = 0, y = 0, z = 0; };
inline dim3e threadIdx;
inline dim3e blockIdx, blockDim, gridDim;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
// Byte i of the result is byte (s >> 4i) & 7 of y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long xy = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((xy >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline int __vsubss4(int a, int b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        d = d < -128 ? -128 : d > 127 ? 127 : d;
        r |= (unsigned)(uint8_t)d << (8 * i);
    }
    return (int)r;
}

inline float h2f(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
inline unsigned short f2bf(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 64);  // NaN stays NaN
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}

// The fibers of the block being run, and the scheduler they yield to.
struct EmuFiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done;
};
inline std::vector<EmuFiber> emu_fibers;
inline ucontext_t emu_sched;
inline unsigned emu_cur;
inline const std::function<void()>* emu_kernel;
inline void emu_yield() { swapcontext(&emu_fibers[emu_cur].ctx, &emu_sched); }

// A barrier of `expected` fibers; leaving (a returned thread) lowers it.
struct EmuBarrier {
    int expected = 0, arrived = 0;
    unsigned phase = 0;
    void arrive_and_wait() {
        unsigned p = phase;
        if (++arrived == expected) {
            arrived = 0;
            phase++;
            return;
        }
        while (phase == p) emu_yield();
    }
    void leave() {
        if (--expected > 0 && arrived == expected) {
            arrived = 0;
            phase++;
        }
    }
};

// Per-block state: the block's barrier, each warp's barrier and exchange
// slots; and the launch's dynamic shared memory.
struct EmuWarp {
    EmuBarrier bar;
    uint64_t vals[32];
};
inline EmuBarrier emu_block_bar;
inline std::vector<EmuWarp> emu_warps;
inline std::vector<unsigned char> emu_smem;
#define EXTERN_SHARED(T, name) T* name = (T*)emu_smem.data()

inline void __syncthreads() { emu_block_bar.arrive_and_wait(); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    EmuWarp& w = emu_warps[threadIdx.x / 32];
    int lane = threadIdx.x % 32;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    w.vals[lane] = bits;
    w.bar.arrive_and_wait();
    uint64_t r = w.vals[lane ^ o];
    w.bar.arrive_and_wait();
    T out;
    memcpy(&out, &r, sizeof(T));
    return out;
}

inline void emu_entry() {
    (*emu_kernel)();
    // An exited thread no longer holds the others up.
    emu_warps[emu_cur / 32].bar.leave();
    emu_block_bar.leave();
    emu_fibers[emu_cur].done = true;
}

// Runs `kernel` (a callable that makes the kernel call) over grid × block
// (x and y of the grid, x of the block: all the kernels use).
inline void emu_launch(dim3e grid, unsigned threads, size_t smem, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    emu_smem.assign(smem + 16, 0);
    emu_kernel = &kernel;
    emu_fibers.resize(threads);
    for (auto& f : emu_fibers) f.stack.resize(256 << 10);
    for (unsigned by = 0; by < std::max(grid.y, 1u); by++) {
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = {bx, by, 0};
            emu_block_bar = EmuBarrier{(int)threads};
            unsigned nw = (threads + 31) / 32;
            emu_warps.assign(nw, EmuWarp{});
            for (unsigned w = 0; w < nw; w++) emu_warps[w].bar.expected = (int)std::min(32u, threads - 32 * w);
            for (auto& f : emu_fibers) {
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = f.stack.data();
                f.ctx.uc_stack.ss_size = f.stack.size();
                f.ctx.uc_link = &emu_sched;
                makecontext(&f.ctx, emu_entry, 0);
                f.done = false;
            }
            for (unsigned left = threads; left > 0;) {
                left = 0;
                for (unsigned t = 0; t < threads; t++) {
                    if (emu_fibers[t].done) continue;
                    emu_cur = t;
                    threadIdx = {t, 0, 0};
                    swapcontext(&emu_sched, &emu_fibers[t].ctx);
                    left += !emu_fibers[t].done;
                }
            }
        }
    }
}
