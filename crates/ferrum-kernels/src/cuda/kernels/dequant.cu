// Per type: dequantize a whole [n, k] weight (for cuBLAS at m > 8), and a
// GEMV-style kernel for m <= 8 rows that reads the blocks once: one warp per
// output column. `gemv_experts_<T>` runs the same for every expert of a
// mixture step in one launch: blockIdx.y picks a tile of `tiles` (two words
// each: the expert's weight pointer, then the tile's first row | its row
// count (<= 8) << 32).
#define DEQUANT_KERNEL(T, QK, BB)                                                             \
extern "C" __global__ void dequant_##T(const u8* w, float* out, int n, int k) {              \
    size_t rb = (size_t)(k / QK) * BB;                                                        \
    GRID_LOOP(e, (size_t)n * k) {                                                             \
        size_t row = e / k; int i = e % k;                                                    \
        out[e] = deq_##T(w + row * rb + (size_t)(i / QK) * BB, i % QK);                       \
    }                                                                                         \
}
// The same in bf16 for cuBLAS's tensor-core GEMM (prefill): eight values
// a thread, stored as one 16-byte word. k is a multiple of eight.
#define DEQUANT_BF16_KERNEL(T, QK, BB)                                                        \
extern "C" __global__ void dequant_bf16_##T(const u8* w, u16* out, int n, int k) {           \
    size_t rb = (size_t)(k / QK) * BB;                                                        \
    GRID_LOOP(e, (size_t)n * k / 8) {                                                         \
        size_t row = e * 8 / k; int i = (int)(e * 8 % k);                                     \
        float v[8];                                                                           \
        deq8_##T(w + row * rb + (size_t)(i / QK) * BB, i % QK, v);                            \
        uint4 o;                                                                              \
        o.x = f2bf(v[0]) | ((u32)f2bf(v[1]) << 16);                                           \
        o.y = f2bf(v[2]) | ((u32)f2bf(v[3]) << 16);                                           \
        o.z = f2bf(v[4]) | ((u32)f2bf(v[5]) << 16);                                           \
        o.w = f2bf(v[6]) | ((u32)f2bf(v[7]) << 16);                                           \
        ((uint4*)out)[e] = o;                                                                 \
    }                                                                                         \
}
// The generic column loop: each lane takes groups of eight values in turn,
// so a warp reads 256 consecutive values' bytes per step.
#define GENERIC_COLS(T, QK, BB)                                                               \
__device__ __forceinline__ void gemv_cols_##T(const u8* w, const float* x, float* out, int m, int n, int k) { \
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;          \
    if (col >= n) return;                                                                     \
    const u8* row = w + (size_t)col * (k / QK) * BB;                                          \
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                  \
    for (int i = lane * 8; i < k; i += 256) {                                                 \
        float wv[8];                                                                          \
        deq8_##T(row + (size_t)(i / QK) * BB, i % QK, wv);                                    \
        for (int r = 0; r < 8; r++) {                                                         \
            if (r >= m) break;                                                                \
            const float4* xv = (const float4*)(x + (size_t)r * k + i);                        \
            float4 a = xv[0], c = xv[1];                                                      \
            acc[r] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w                   \
                    + wv[4] * c.x + wv[5] * c.y + wv[6] * c.z + wv[7] * c.w;                  \
        }                                                                                     \
    }                                                                                         \
    for (int r = 0; r < 8; r++) {                                                             \
        if (r >= m) break;                                                                    \
        float s = warp_sum(acc[r]);                                                           \
        if (lane == 0) out[(size_t)r * n + col] = s;                                          \
    }                                                                                         \
}
#define GEMV_KERNELS(T)                                                                       \
extern "C" __global__ void gemv_##T(const u8* w, const float* x, float* out, int m, int n, int k) { \
    gemv_cols_##T(w, x, out, m, n, k);                                                        \
}                                                                                             \
extern "C" __global__ void gemv_experts_##T(const unsigned long long* tiles, const float* x, float* out, int n, int k) { \
    unsigned long long p = tiles[2 * blockIdx.y], rr = tiles[2 * blockIdx.y + 1];             \
    size_t r0 = (u32)rr; int m = (int)(rr >> 32);                                             \
    gemv_cols_##T((const u8*)p, x + r0 * k, out + r0 * n, m, n, k);                           \
}
#define QUANT_KERNELS(T, QK, BB) DEQUANT_KERNEL(T, QK, BB) DEQUANT_BF16_KERNEL(T, QK, BB) GENERIC_COLS(T, QK, BB) GEMV_KERNELS(T)

// Dense Q4_K columns (the format most checkpoints ship) for gemv_q4_k:
// each warp takes Q4K_COLS consecutive columns (the launch sizes its grid
// for that); eight lanes share a 144-byte superblock, each with one 16-byte
// load of 32 four-bit values per column (16 of sub-block 2c in the low
// nibbles, 16 of sub-block 2c + 1 in the high), so a warp reads four
// superblocks per column per step in wide loads, and each activation value
// it loads serves Q4K_COLS columns. On an H200 (llama3-8b shapes, tg128)
// this ran at 110 tok/s against 101 for the generic loop, which stays the
// experts' kernel: their short matrices (Qwen3-30B-A3B, tg64) did better
// with a warp per column, 103 against 95 tok/s (docs/perf-log.md).
#define Q4K_COLS 4
__device__ __forceinline__ void gemv_cols4_q4_k(const u8* w, const float* x, float* out, int m, int n, int k) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    int col0 = warp * Q4K_COLS;
    if (col0 >= n) return;
    int nb = k / 256, c = (lane & 7) >> 1, h = lane & 1;
    size_t rb = (size_t)nb * 144;
    float acc[8][Q4K_COLS];
    for (int r = 0; r < 8; r++)
        for (int j = 0; j < Q4K_COLS; j++) acc[r][j] = 0.f;
    for (int b = lane >> 3; b < nb; b += 4) {
        u32 qw[Q4K_COLS][4];
        float dl[Q4K_COLS], dh[Q4K_COLS], ml[Q4K_COLS], mh[Q4K_COLS];
        for (int j = 0; j < Q4K_COLS; j++) {
            int col = min(col0 + j, n - 1);
            // Superblocks are 144 bytes from a 256-byte aligned base and
            // rows are whole superblocks: word and 16-byte loads are aligned.
            const u8* blk = w + (size_t)col * rb + (size_t)b * 144;
            u32 dm = *(const u32*)blk;
            int sl, mnl, sh, mnh;
            scale_min_k4(2 * c, blk + 4, &sl, &mnl);
            scale_min_k4(2 * c + 1, blk + 4, &sh, &mnh);
            float d = h2f((u16)(dm & 0xffff)), dmin = h2f((u16)(dm >> 16));
            dl[j] = d * sl; dh[j] = d * sh; ml[j] = dmin * mnl; mh[j] = dmin * mnh;
            uint4 q = *(const uint4*)(blk + 16 + c * 32 + h * 16);
            qw[j][0] = q.x; qw[j][1] = q.y; qw[j][2] = q.z; qw[j][3] = q.w;
        }
        const float* xb = x + (size_t)b * 256 + c * 64 + h * 16;
        for (int r = 0; r < 8; r++) {
            if (r >= m) break;
            const float4* xl = (const float4*)(xb + (size_t)r * k);
            const float4* xh = (const float4*)(xb + (size_t)r * k + 32);
            float4 a[4], e[4];
            float suml = 0.f, sumh = 0.f;
            for (int t = 0; t < 4; t++) {
                a[t] = xl[t]; e[t] = xh[t];
                suml += a[t].x + a[t].y + a[t].z + a[t].w;
                sumh += e[t].x + e[t].y + e[t].z + e[t].w;
            }
            for (int j = 0; j < Q4K_COLS; j++) {
                float lo = 0.f, hi = 0.f;
                for (int t = 0; t < 4; t++) {
                    u32 v = qw[j][t];
                    lo += (float)(v & 15) * a[t].x + (float)((v >> 8) & 15) * a[t].y
                        + (float)((v >> 16) & 15) * a[t].z + (float)((v >> 24) & 15) * a[t].w;
                    hi += (float)((v >> 4) & 15) * e[t].x + (float)((v >> 12) & 15) * e[t].y
                        + (float)((v >> 20) & 15) * e[t].z + (float)(v >> 28) * e[t].w;
                }
                acc[r][j] += dl[j] * lo + dh[j] * hi - ml[j] * suml - mh[j] * sumh;
            }
        }
    }
    for (int r = 0; r < 8; r++) {
        if (r >= m) break;
        for (int j = 0; j < Q4K_COLS; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0 && col0 + j < n) out[(size_t)r * n + col0 + j] = s;
        }
    }
}
DEQUANT_KERNEL(q4_k, 256, 144)
DEQUANT_BF16_KERNEL(q4_k, 256, 144)
GENERIC_COLS(q4_k, 256, 144)
extern "C" __global__ void gemv_q4_k(const u8* w, const float* x, float* out, int m, int n, int k) {
    gemv_cols4_q4_k(w, x, out, m, n, k);
}
extern "C" __global__ void gemv_experts_q4_k(const unsigned long long* tiles, const float* x, float* out, int n, int k) {
    unsigned long long p = tiles[2 * blockIdx.y], rr = tiles[2 * blockIdx.y + 1];
    size_t r0 = (u32)rr; int m = (int)(rr >> 32);
    gemv_cols_q4_k((const u8*)p, x + r0 * k, out + r0 * n, m, n, k);
}

QUANT_KERNELS(q4_0, 32, 18)
QUANT_KERNELS(q4_1, 32, 20)
QUANT_KERNELS(q5_0, 32, 22)
QUANT_KERNELS(q5_1, 32, 24)
QUANT_KERNELS(q8_0, 32, 34)
QUANT_KERNELS(q2_k, 256, 84)
QUANT_KERNELS(q3_k, 256, 110)
QUANT_KERNELS(q5_k, 256, 176)
QUANT_KERNELS(q6_k, 256, 210)
QUANT_KERNELS(iq4_nl, 32, 18)
QUANT_KERNELS(iq4_xs, 256, 136)
QUANT_KERNELS(mxfp4, 32, 17)
QUANT_KERNELS(f16, 1, 2)
QUANT_KERNELS(bf16, 1, 2)

// Activations to bf16 for the tensor-core GEMM.
extern "C" __global__ void to_bf16(const float* x, u16* out, int n) { GRID_LOOP(i, n) out[i] = f2bf(x[i]); }
