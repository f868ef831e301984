// Ferrum's CUDA kernels, compiled at run time with NVRTC for the device's
// architecture (the files of this folder, concatenated in the order
// device.rs gives). f32 activations; conventions as in backend.rs
// (row-major, linear weights [n, k], head-major attention, half-split RoPE).
//
// The same source also builds on the host against a CPU emulation of the
// CUDA built-ins (tests/cuda_emu), where FERRUM_EMU is defined: that is
// how the kernels are tested without a GPU. Only the few primitives below
// that need PTX differ between the two.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned short u16;

#ifndef FERRUM_EMU
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// f32 to bf16, rounded to nearest even (what cuBLAS's inputs take).
__device__ __forceinline__ u16 f2bf(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#define EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

__device__ __forceinline__ float f16_at(const u8* b, int off) {
    return h2f((u16)(b[off] | (b[off + 1] << 8)));
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? part[lane] : 0.f;
    return warp_sum(v);
}

#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)

// Paged KV: the offset of position p of KV head h in a pool of blocks of
// bs positions ([block, nkv, bs, hd]) through a block table.
__device__ __forceinline__ size_t kv_at(const u32* table, int p, int h, int nkv, int bs, int hd) {
    return (((size_t)table[p / bs] * nkv + h) * bs + p % bs) * hd;
}

// A sequence's part of a paged op: five ints, as the host writes them
// (cuda/meta.rs): where its queries (and output) start in the call's
// head-major q, its queries, its keys, the position of its first query, and
// where its block table starts in the call's tables.
struct Seg { int q_off, q_len, kv_len, pos, table; };
__device__ __forceinline__ Seg seg_at(const int* segs, int s) {
    const int* p = segs + 5 * s;
    Seg r = {p[0], p[1], p[2], p[3], p[4]};
    return r;
}
