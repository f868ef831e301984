// ── Quantized GEMV on 8-bit activations (decode) ────────────────────────
// A step's activation rows are quantized once per GEMM to q8_1 blocks of
// 32 values (int8 values, then a float2 per block: the scale d and d · Σq,
// so a weight block's offset or minimum multiplies the block's sum), and
// every weight block is dotted against them with __dp4a: four int8 products
// an instruction, where the f32 loop spent four multiply-adds and read four
// times the activation bytes.
//
// Tuning constants (MMVQ_*) are compile-time, so the host can build and
// time variants through the kernel cache (device.rs: FERRUM_CUDA_TUNE).

#ifndef MMVQ_COLS
#define MMVQ_COLS 4   // weight rows (output columns) a block computes
#endif
#ifndef MMVQ_THREADS
#define MMVQ_THREADS 128
#endif
#define MMVQ_ROWS 8   // activation rows a block takes (grid.y tiles more)
  // activation rows a block takes (grid.y tiles more)

// One q8_1 block per warp: x [blocks · 32] -> xq (int8, same order), xd.
extern "C" __global__ void quantize_q8_1(const float* x, signed char* xq, float2* xd, int blocks) {
    int blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (blk >= blocks) return;  // the whole warp
    float v = x[(size_t)blk * 32 + lane];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.f;
    int q = amax > 0.f ? __float2int_rn(v / d) : 0;
    xq[(size_t)blk * 32 + lane] = (signed char)q;
    int s = warp_sum_int(q);
    if (lane == 0) xd[blk] = make_float2(d, d * (float)s);
}

// Loads of 4 bytes at 2-byte alignment (blocks of 18, 22, 34, 110, 210
// bytes put their words at even offsets only).
__device__ __forceinline__ int ld2(const u8* p) {
    const u16* h = (const u16*)p;
    return (int)(h[0] | ((u32)h[1] << 16));
}
__device__ __forceinline__ int ld4(const u8* p) { return *(const int*)p; }
// Bits 0..3 of b to bit 4 of bytes 0..3 (the fifth bit of Q5_0/Q5_1).
__device__ __forceinline__ int bit4(int b) {
    return ((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25);
}
#define LO4(v) ((v) & 0x0F0F0F0F)
#define HI4(v) (((v) >> 4) & 0x0F0F0F0F)

// Per type: QK values and BB bytes a block, U work units a block (one
// thread's share of it per step: 32 values), and
//   W load(block, unit): the unit's weights, decoded as far as they are
//     shared by every activation row;
//   float dot(W, unit, xq, xd): its dot product with one activation row,
//     xq / xd pointing at the row's q8_1 data of this weight block.
// 32-value types: one unit a block. Their low nibbles are values 0..15 and
// the high ones 16..31, so int t's low nibbles pair with activation int t
// and its high ones with int 4 + t.
struct Q4_0 {
    static const int QK = 32, BB = 18, U = 1;
    struct W { int q[4]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        for (int t = 0; t < 4; t++) w.q[t] = ld2(b + 2 + 4 * t);
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        int s = 0;
        for (int t = 0; t < 4; t++) s = __dp4a(HI4(w.q[t]), x[4 + t], __dp4a(LO4(w.q[t]), x[t], s));
        return w.d * (xd[0].x * s - 8.f * xd[0].y);
    }
};
struct Q4_1 {
    static const int QK = 32, BB = 20, U = 1;
    struct W { int q[4]; float d, m; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        w.m = f16_at(b, 2);
        for (int t = 0; t < 4; t++) w.q[t] = ld4(b + 4 + 4 * t);
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        int s = 0;
        for (int t = 0; t < 4; t++) s = __dp4a(HI4(w.q[t]), x[4 + t], __dp4a(LO4(w.q[t]), x[t], s));
        return w.d * xd[0].x * s + w.m * xd[0].y;
    }
};
// Q5: bit i of qh is value i's fifth bit.
struct Q5_0 {
    static const int QK = 32, BB = 22, U = 1;
    struct W { int lo[4], hi[4]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        int qh = ld2(b + 2);
        for (int t = 0; t < 4; t++) {
            int q = ld2(b + 6 + 4 * t);
            w.lo[t] = LO4(q) | bit4(qh >> (4 * t));
            w.hi[t] = HI4(q) | bit4(qh >> (16 + 4 * t));
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        int s = 0;
        for (int t = 0; t < 4; t++) s = __dp4a(w.hi[t], x[4 + t], __dp4a(w.lo[t], x[t], s));
        return w.d * (xd[0].x * s - 16.f * xd[0].y);
    }
};
struct Q5_1 {
    static const int QK = 32, BB = 24, U = 1;
    struct W { int lo[4], hi[4]; float d, m; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        w.m = f16_at(b, 2);
        int qh = ld4(b + 4);
        for (int t = 0; t < 4; t++) {
            int q = ld4(b + 8 + 4 * t);
            w.lo[t] = LO4(q) | bit4(qh >> (4 * t));
            w.hi[t] = HI4(q) | bit4(qh >> (16 + 4 * t));
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        int s = 0;
        for (int t = 0; t < 4; t++) s = __dp4a(w.hi[t], x[4 + t], __dp4a(w.lo[t], x[t], s));
        return w.d * xd[0].x * s + w.m * xd[0].y;
    }
};
struct Q8_0 {
    static const int QK = 32, BB = 34, U = 1;
    struct W { int q[8]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        for (int t = 0; t < 8; t++) w.q[t] = ld2(b + 2 + 4 * t);
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        int s = 0;
        for (int t = 0; t < 8; t++) s = __dp4a(w.q[t], x[t], s);
        return w.d * xd[0].x * s;
    }
};

// Q4_K / Q5_K: unit u = 2c + h holds 16 bytes of the 32 that carry
// sub-blocks 2c (low nibbles) and 2c + 1 (high): positions 16h..16h + 15 of
// both, so q8_1 blocks 2c and 2c + 1, ints 4h..4h + 3. The minimum terms
// take the whole blocks' sums, once, from the h = 0 unit.
__device__ __forceinline__ void kq_scales(const u8* q, int j, int* s, int* m) {
    if (j < 4) { *s = q[j] & 63; *m = q[j + 4] & 63; }
    else { *s = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
struct KW { int lo[4], hi[4]; float dl, dh, ml, mh; };
__device__ __forceinline__ void kq_load_scales(const u8* b, int c, KW& w) {
    float d = f16_at(b, 0), dmin = f16_at(b, 2);
    int sl, ml, sh, mh;
    kq_scales(b + 4, 2 * c, &sl, &ml);
    kq_scales(b + 4, 2 * c + 1, &sh, &mh);
    w.dl = d * sl; w.ml = dmin * ml; w.dh = d * sh; w.mh = dmin * mh;
}
__device__ __forceinline__ float kq_dot(const KW& w, int u, const int* x, const float2* xd) {
    int c = u >> 1, h = u & 1;
    const int4 a = *(const int4*)(x + 2 * c * 8 + 4 * h);
    const int4 e = *(const int4*)(x + (2 * c + 1) * 8 + 4 * h);
    int sl = __dp4a(w.lo[3], a.w, __dp4a(w.lo[2], a.z, __dp4a(w.lo[1], a.y, __dp4a(w.lo[0], a.x, 0))));
    int sh = __dp4a(w.hi[3], e.w, __dp4a(w.hi[2], e.z, __dp4a(w.hi[1], e.y, __dp4a(w.hi[0], e.x, 0))));
    float2 dl = xd[2 * c], dh = xd[2 * c + 1];
    float r = w.dl * dl.x * sl + w.dh * dh.x * sh;
    if (h == 0) r -= w.ml * dl.y + w.mh * dh.y;
    return r;
}
struct Q4_K {
    static const int QK = 256, BB = 144, U = 8;
    typedef KW W;
    static __device__ __forceinline__ W load(const u8* b, int u) {
        int c = u >> 1, h = u & 1;
        W w;
        kq_load_scales(b, c, w);
        uint4 q = *(const uint4*)(b + 16 + c * 32 + h * 16);
        w.lo[0] = LO4(q.x); w.lo[1] = LO4(q.y); w.lo[2] = LO4(q.z); w.lo[3] = LO4(q.w);
        w.hi[0] = HI4(q.x); w.hi[1] = HI4(q.y); w.hi[2] = HI4(q.z); w.hi[3] = HI4(q.w);
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        return kq_dot(w, u, x, xd);
    }
};
// Q5_K: qh byte l carries bit 2c of sub-block 2c's value l and bit 2c + 1
// of sub-block 2c + 1's.
struct Q5_K {
    static const int QK = 256, BB = 176, U = 8;
    typedef KW W;
    static __device__ __forceinline__ W load(const u8* b, int u) {
        int c = u >> 1, h = u & 1;
        W w;
        kq_load_scales(b, c, w);
        uint4 q = *(const uint4*)(b + 48 + c * 32 + h * 16);
        uint4 qh = *(const uint4*)(b + 16 + h * 16);
        u32 qs[4] = {q.x, q.y, q.z, q.w}, hs[4] = {qh.x, qh.y, qh.z, qh.w};
        for (int t = 0; t < 4; t++) {
            w.lo[t] = LO4(qs[t]) | (((hs[t] >> (2 * c)) & 0x01010101) << 4);
            w.hi[t] = HI4(qs[t]) | (((hs[t] >> (2 * c + 1)) & 0x01010101) << 4);
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        return kq_dot(w, u, x, xd);
    }
};

// Q2_K, Q3_K, Q6_K: a half (128 values) is four 32-value segments j whose
// value l shares byte l of the half's packed bits (at shift 2j, or in the
// low / high nibble). Unit u = 4 · half + g takes bytes 8g..8g + 7 of them:
// positions 8g..8g + 7 of all four segments, so q8_1 blocks 4 · half + j,
// ints 2g, 2g + 1; its 16-value scale groups are 2j + g / 2.
// Q6_K's and Q3_K's units: signed values, an integer scale per segment.
struct SW { int v[4][2]; int sc[4]; float d; };
__device__ __forceinline__ float sw_dot(const SW& w, int u, const int* x, const float2* xd) {
    int hf = u >> 2, g = u & 3;
    float r = 0.f;
    for (int j = 0; j < 4; j++) {
        const int* xj = x + (4 * hf + j) * 8 + 2 * g;
        int s = __dp4a(w.v[j][1], xj[1], __dp4a(w.v[j][0], xj[0], 0));
        r += xd[4 * hf + j].x * (float)(w.sc[j] * s);
    }
    return w.d * r;
}
struct Q6_K {
    static const int QK = 256, BB = 210, U = 8;
    typedef SW W;
    static __device__ __forceinline__ W load(const u8* b, int u) {
        int hf = u >> 2, g = u & 3;
        W w;
        w.d = f16_at(b, 208);
        const u8* ql = b + hf * 64 + g * 8;
        const u8* qh = b + 128 + hf * 32 + g * 8;
        for (int t = 0; t < 2; t++) {
            int a = ld2(ql + 4 * t), c = ld2(ql + 32 + 4 * t), h = ld2(qh + 4 * t);
            // Values 0..63 less 32: signed bytes, no carries between them.
            w.v[0][t] = __vsubss4(LO4(a) | ((h << 4) & 0x30303030), 0x20202020);
            w.v[1][t] = __vsubss4(LO4(c) | ((h << 2) & 0x30303030), 0x20202020);
            w.v[2][t] = __vsubss4(HI4(a) | (h & 0x30303030), 0x20202020);
            w.v[3][t] = __vsubss4(HI4(c) | ((h >> 2) & 0x30303030), 0x20202020);
        }
        for (int j = 0; j < 4; j++) w.sc[j] = (signed char)b[192 + hf * 8 + 2 * j + (g >> 1)];
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        return sw_dot(w, u, x, xd);
    }
};
// Q3_K: two bits at shift 2j, less 4 where hmask's bit 4 · half + j is
// clear; 6-bit signed scales.
struct Q3_K {
    static const int QK = 256, BB = 110, U = 8;
    typedef SW W;
    static __device__ __forceinline__ W load(const u8* b, int u) {
        int hf = u >> 2, g = u & 3;
        W w;
        w.d = f16_at(b, 108);
        const u8* qs = b + 32 + hf * 32 + g * 8;
        const u8* hm = b + g * 8;
        for (int t = 0; t < 2; t++) {
            int q = ld2(qs + 4 * t), m = ld2(hm + 4 * t);
            for (int j = 0; j < 4; j++) {
                int sub = (~(m >> (4 * hf + j)) & 0x01010101) << 2;
                w.v[j][t] = __vsubss4((q >> (2 * j)) & 0x03030303, sub);
            }
        }
        const u8* pk = b + 96;
        for (int j = 0; j < 4; j++) {
            int is = hf * 8 + 2 * j + (g >> 1);
            int low = is < 8 ? (pk[is] & 15) : (pk[is - 8] >> 4);
            int high = (pk[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
            w.sc[j] = (low | (high << 4)) - 32;
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        return sw_dot(w, u, x, xd);
    }
};
// Q2_K: two bits at shift 2j; a 4-bit scale and a 4-bit minimum per 16
// values, so the minimum takes the unit's own activation sums.
struct Q2_K {
    static const int QK = 256, BB = 84, U = 8;
    struct W { int v[4][2]; float d[4], m[4]; };
    static __device__ __forceinline__ W load(const u8* b, int u) {
        int hf = u >> 2, g = u & 3;
        W w;
        float d = f16_at(b, 80), dmin = f16_at(b, 82);
        const u8* qs = b + 16 + hf * 32 + g * 8;
        for (int t = 0; t < 2; t++) {
            int q = ld4(qs + 4 * t);
            for (int j = 0; j < 4; j++) w.v[j][t] = (q >> (2 * j)) & 0x03030303;
        }
        for (int j = 0; j < 4; j++) {
            int sc = b[hf * 8 + 2 * j + (g >> 1)];
            w.d[j] = d * (sc & 15);
            w.m[j] = dmin * (sc >> 4);
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        int hf = u >> 2, g = u & 3;
        float r = 0.f;
        for (int j = 0; j < 4; j++) {
            const int* xj = x + (4 * hf + j) * 8 + 2 * g;
            int s = __dp4a(w.v[j][1], xj[1], __dp4a(w.v[j][0], xj[0], 0));
            int sx = __dp4a(0x01010101, xj[1], __dp4a(0x01010101, xj[0], 0));
            r += xd[4 * hf + j].x * (w.d[j] * s - w.m[j] * sx);
        }
        return r;
    }
};

// The codebook formats: the indices looked up into signed levels once per
// load (lut16), then plain int8 dot products; no offset term.
// Σ of 32 int8 products: lo[t] pairs with activation int t, hi[t] with
// int 4 + t (low nibbles values 0..15, high ones 16..31).
__device__ __forceinline__ int lohi_sum(const int* lo, const int* hi, const int* x) {
    int s = 0;
    for (int t = 0; t < 4; t++) s = __dp4a(hi[t], x[4 + t], __dp4a(lo[t], x[t], s));
    return s;
}
struct IQ4_NL {
    static const int QK = 32, BB = 18, U = 1;
    struct W { int lo[4], hi[4]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = f16_at(b, 0);
        for (int t = 0; t < 4; t++) {
            int q = ld2(b + 2 + 4 * t);
            w.lo[t] = lut16(LO4(q), IQ4_LEVELS);
            w.hi[t] = lut16(HI4(q), IQ4_LEVELS);
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        return w.d * xd[0].x * lohi_sum(w.lo, w.hi, x);
    }
};
// MXFP4: 17-byte blocks put the indices at odd offsets: bytes loaded singly.
struct MXFP4 {
    static const int QK = 32, BB = 17, U = 1;
    struct W { int lo[4], hi[4]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int) {
        W w;
        w.d = e8m0_half(b[0]);
        for (int t = 0; t < 4; t++) {
            const u8* p = b + 1 + 4 * t;
            int q = p[0] | (p[1] << 8) | (p[2] << 16) | ((u32)p[3] << 24);
            w.lo[t] = lut16(LO4(q), MX_LEVELS);
            w.hi[t] = lut16(HI4(q), MX_LEVELS);
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        return w.d * xd[0].x * lohi_sum(w.lo, w.hi, x);
    }
};
// IQ4_XS: a unit is one 32-value sub-block (IQ4_NL's layout, 16 bytes from
// byte 8 + 16u, 8-aligned: blocks are 136 bytes) with its own scale.
struct IQ4_XS {
    static const int QK = 256, BB = 136, U = 8;
    struct W { int lo[4], hi[4]; float d; };
    static __device__ __forceinline__ W load(const u8* b, int u) {
        W w;
        w.d = f16_at(b, 0) * iq4_xs_scale(b, u);
        for (int t = 0; t < 4; t++) {
            int q = ld4(b + 8 + 16 * u + 4 * t);
            w.lo[t] = lut16(LO4(q), IQ4_LEVELS);
            w.hi[t] = lut16(HI4(q), IQ4_LEVELS);
        }
        return w;
    }
    static __device__ __forceinline__ float dot(const W& w, int u, const int* x, const float2* xd) {
        return w.d * xd[u].x * lohi_sum(w.lo, w.hi, x + 8 * u);
    }
};

// Whole 16-bit weights, 32 values a unit against one q8_1 block: read in
// the dot (a pointer is all the load keeps), each value times its int8.
template <bool BF>
struct Half16 {
    static const int QK = 32, BB = 64, U = 1;
    struct W { const u8* p; };
    static __device__ __forceinline__ W load(const u8* b, int) { return W{b}; }
    static __device__ __forceinline__ float dot(const W& w, int, const int* x, const float2* xd) {
        float s = 0.f;
        // Rolled: unrolled into every row and column of mmvq_rows, this
        // loop tripled the kernels' compile time (the NVRTC test).
#pragma unroll 1
        for (int t = 0; t < 8; t++) {
            int q = x[t];
            for (int e = 0; e < 4; e++) {
                int at = 8 * t + 2 * e;
                s += (BF ? bf16_at(w.p, at) : f16_at(w.p, at)) * (float)(signed char)(q >> (8 * e));
            }
        }
        return xd[0].x * s;
    }
};
typedef Half16<false> F16;
typedef Half16<true> BF16;

// out[r, col] for MMVQ_COLS columns from col0 and rows r < m (<= R) of the
// q8_1 activation: the block's threads share out the weight units of a row,
// each unit's weights are loaded once for all rows, and the partial sums
// meet in shared memory. R is 1 (one token: 40-52 registers) or MMVQ_ROWS
// (a batch: up to 145 registers, a third of the occupancy).
template <class T, int R>
__device__ __forceinline__ void mmvq_rows(const u8* w, const int* xq, const float2* xd, float* out, int m, int n,
                                          int k, int col0) {
    const int nb = k / T::QK, units = nb * T::U;
    const size_t rb = (size_t)nb * T::BB;
    const int xi = k / 4, xb = k / 32;  // ints and q8_1 blocks a row
    // Fully unrolled, so acc stays in registers.
    float acc[R][MMVQ_COLS];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < MMVQ_COLS; j++) acc[r][j] = 0.f;
    for (int u = threadIdx.x; u < units; u += MMVQ_THREADS) {
        int b = u / T::U, iu = u % T::U;
        const int* x0 = xq + b * (T::QK / 4);
        const float2* d0 = xd + b * (T::QK / 32);
        // Every column's weights first (their loads in flight together),
        // then each activation row once for all of them.
        typename T::W wv[MMVQ_COLS];
#pragma unroll
        for (int j = 0; j < MMVQ_COLS; j++) wv[j] = T::load(w + min(col0 + j, n - 1) * rb + b * T::BB, iu);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < m)
#pragma unroll
                for (int j = 0; j < MMVQ_COLS; j++) acc[r][j] += T::dot(wv[j], iu, x0 + r * xi, d0 + r * xb);
    }
    __shared__ float red[MMVQ_THREADS / 32][R * MMVQ_COLS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int j = 0; j < MMVQ_COLS; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0 && r < m) red[warp][r * MMVQ_COLS + j] = s;
        }
    }
    __syncthreads();
    int o = threadIdx.x;
    if (o < m * MMVQ_COLS && col0 + o % MMVQ_COLS < n) {
        float s = 0.f;
        for (int v = 0; v < MMVQ_THREADS / 32; v++) s += red[v][o];
        out[(size_t)(o / MMVQ_COLS) * n + col0 + o % MMVQ_COLS] = s;
    }
}

// mmvq_<T>: out[m, n] = x[m, k] · w[n, k]ᵀ, x as q8_1 (quantize_q8_1);
// blockIdx.x picks MMVQ_COLS columns, blockIdx.y a tile of MMVQ_ROWS rows.
// mmvq_experts_<T>: every expert of a mixture step in one launch;
// blockIdx.y picks a tile of `tiles` (two words each: the expert's weight
// pointer, then the tile's first row | its row count (<= 8) << 32).
// mmvq1_<T>, mmvq1_experts_<T>: the same for tiles of one row (one token).
template <class S, int R>
__device__ __forceinline__ void mmvq_dense(const u8* w, const int* xq, const float2* xd, float* out, int m, int n,
                                           int k) {
    int r0 = blockIdx.y * R;
    mmvq_rows<S, R>(w, xq + (size_t)r0 * (k / 4), xd + (size_t)r0 * (k / 32), out + (size_t)r0 * n,
                    min(m - r0, R), n, k, blockIdx.x * MMVQ_COLS);
}
template <class S, int R>
__device__ __forceinline__ void mmvq_tiles(const unsigned long long* tiles, const int* xq, const float2* xd,
                                           float* out, int n, int k) {
    unsigned long long p = tiles[2 * blockIdx.y], rr = tiles[2 * blockIdx.y + 1];
    size_t r0 = (u32)rr;
    int m = min((int)(rr >> 32), R);
    mmvq_rows<S, R>((const u8*)p, xq + r0 * (k / 4), xd + r0 * (k / 32), out + r0 * n, m, n, k,
                    blockIdx.x * MMVQ_COLS);
}
#define MMVQ_KERNELS(T, S)                                                                     \
extern "C" __global__ void __launch_bounds__(MMVQ_THREADS) mmvq_##T(                           \
    const u8* w, const int* xq, const float2* xd, float* out, int m, int n, int k) {           \
    mmvq_dense<S, MMVQ_ROWS>(w, xq, xd, out, m, n, k);                                         \
}                                                                                              \
extern "C" __global__ void __launch_bounds__(MMVQ_THREADS) mmvq1_##T(                          \
    const u8* w, const int* xq, const float2* xd, float* out, int m, int n, int k) {           \
    mmvq_dense<S, 1>(w, xq, xd, out, m, n, k);                                                 \
}                                                                                              \
extern "C" __global__ void __launch_bounds__(MMVQ_THREADS) mmvq_experts_##T(                   \
    const unsigned long long* tiles, const int* xq, const float2* xd, float* out, int n, int k) { \
    mmvq_tiles<S, MMVQ_ROWS>(tiles, xq, xd, out, n, k);                                        \
}                                                                                              \
extern "C" __global__ void __launch_bounds__(MMVQ_THREADS) mmvq1_experts_##T(                  \
    const unsigned long long* tiles, const int* xq, const float2* xd, float* out, int n, int k) { \
    mmvq_tiles<S, 1>(tiles, xq, xd, out, n, k);                                                \
}
MMVQ_KERNELS(q4_0, Q4_0)
MMVQ_KERNELS(q4_1, Q4_1)
MMVQ_KERNELS(q5_0, Q5_0)
MMVQ_KERNELS(q5_1, Q5_1)
MMVQ_KERNELS(q8_0, Q8_0)
MMVQ_KERNELS(q2_k, Q2_K)
MMVQ_KERNELS(q3_k, Q3_K)
MMVQ_KERNELS(q4_k, Q4_K)
MMVQ_KERNELS(q5_k, Q5_K)
MMVQ_KERNELS(q6_k, Q6_K)
MMVQ_KERNELS(iq4_nl, IQ4_NL)
MMVQ_KERNELS(iq4_xs, IQ4_XS)
MMVQ_KERNELS(mxfp4, MXFP4)
MMVQ_KERNELS(f16, F16)
MMVQ_KERNELS(bf16, BF16)
