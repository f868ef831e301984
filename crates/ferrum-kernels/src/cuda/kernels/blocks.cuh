// ── GGUF blocks: element i of one block ─────────────────────────────────
__device__ __forceinline__ float deq_q4_0(const u8* b, int i) {
    int j = i & 15; int q = i < 16 ? (b[2 + j] & 15) : (b[2 + j] >> 4);
    return (q - 8) * f16_at(b, 0);
}
__device__ __forceinline__ float deq_q4_1(const u8* b, int i) {
    int j = i & 15; int q = i < 16 ? (b[4 + j] & 15) : (b[4 + j] >> 4);
    return q * f16_at(b, 0) + f16_at(b, 2);
}
__device__ __forceinline__ int q5_val(const u8* qhp, const u8* qs, int i) {
    u32 qh = qhp[0] | (qhp[1] << 8) | (qhp[2] << 16) | ((u32)qhp[3] << 24);
    int j = i & 15;
    if (i < 16) return (qs[j] & 15) | (((qh >> j) << 4) & 0x10);
    return (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
}
__device__ __forceinline__ float deq_q5_0(const u8* b, int i) { return (q5_val(b + 2, b + 6, i) - 16) * f16_at(b, 0); }
__device__ __forceinline__ float deq_q5_1(const u8* b, int i) { return q5_val(b + 4, b + 8, i) * f16_at(b, 0) + f16_at(b, 2); }
__device__ __forceinline__ float deq_q8_0(const u8* b, int i) { return (signed char)b[2 + i] * f16_at(b, 0); }
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* s, int* m) {
    if (j < 4) { *s = q[j] & 63; *m = q[j + 4] & 63; }
    else { *s = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
__device__ __forceinline__ float deq_q4_k(const u8* b, int i) {
    int c = i >> 6, l = i & 31, hi = (i & 63) >= 32, s, m;
    scale_min_k4(2 * c + hi, b + 4, &s, &m);
    u8 x = b[16 + c * 32 + l];
    int q = hi ? (x >> 4) : (x & 15);
    return f16_at(b, 0) * s * q - f16_at(b, 2) * m;
}
__device__ __forceinline__ float deq_q5_k(const u8* b, int i) {
    int c = i >> 6, l = i & 31, hi = (i & 63) >= 32, s, m;
    scale_min_k4(2 * c + hi, b + 4, &s, &m);
    u8 x = b[48 + c * 32 + l];
    int q = (hi ? (x >> 4) : (x & 15)) + ((b[16 + l] & ((hi ? 2 : 1) << (2 * c))) ? 16 : 0);
    return f16_at(b, 0) * s * q - f16_at(b, 2) * m;
}
__device__ __forceinline__ float deq_q6_k(const u8* b, int i) {
    int half = i >> 7, r = i & 127, seg = r >> 5, l = r & 31, is = l >> 4;
    const u8* ql = b + half * 64; const u8* qh = b + 128 + half * 32; const u8* sc = b + 192 + half * 8;
    int lo = (seg & 1) ? ql[l + 32] : ql[l];
    lo = (seg & 2) ? (lo >> 4) : (lo & 15);
    int q = lo | (((qh[l] >> (2 * seg)) & 3) << 4);
    return f16_at(b, 208) * (signed char)sc[is + 2 * seg] * (q - 32);
}
__device__ __forceinline__ float deq_q2_k(const u8* b, int i) {
    int half = i >> 7, r = i & 127, j = r >> 5, part = (r & 31) >> 4, l = r & 15;
    int sc = b[half * 8 + j * 2 + part];
    int q = (b[16 + half * 32 + part * 16 + l] >> (2 * j)) & 3;
    return f16_at(b, 80) * (sc & 15) * q - f16_at(b, 82) * (sc >> 4);
}
__device__ __forceinline__ float deq_q3_k(const u8* b, int i) {
    int half = i >> 7, r = i & 127, j = r >> 5, part = (r & 31) >> 4, l = r & 15;
    int is = half * 8 + j * 2 + part, idx = part * 16 + l;
    const u8* pk = b + 96;
    int low = is < 8 ? (pk[is] & 15) : (pk[is - 8] >> 4);
    int high = (pk[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    int s = (low | (high << 4)) - 32;
    int q = (b[32 + half * 32 + idx] >> (2 * j)) & 3;
    int sub = (b[idx] & (1 << (half * 4 + j))) ? 0 : 4;
    return f16_at(b, 108) * s * (q - sub);
}

// The 4-bit codebook formats (quant/codebook.rs): sixteen signed levels,
// held as four little-endian words so that a lookup is register work.
#define IQ4_LEVELS 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u
#define MX_LEVELS 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu
// Level q (0..15) of the table t0..t3.
__device__ __forceinline__ int level16(u32 t0, u32 t1, u32 t2, u32 t3, int q) {
    u32 w = q < 4 ? t0 : q < 8 ? t1 : q < 12 ? t2 : t3;
    return (signed char)(w >> (8 * (q & 3)));
}
// The four levels picked by the indices in the low nibbles of v's bytes
// (high nibbles zero), as four signed bytes: __byte_perm picks from the
// low eight levels and from the high eight by bits 0..2 of each index,
// and bit 3 chooses between them.
__device__ __forceinline__ int lut16(int v, u32 t0, u32 t1, u32 t2, u32 t3) {
    u32 sel = (v & 0xF) | ((v >> 4) & 0xF0) | ((v >> 8) & 0xF00) | ((v >> 12) & 0xF000);
    u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    u32 m = ((v >> 3) & 0x01010101) * 0xFF;
    return (int)((lo & ~m) | (hi & m));
}
// 2^(e - 128), exactly (ggml_e8m0_to_fp32_half).
__device__ __forceinline__ float e8m0_half(int e) {
    return __int_as_float(e < 2 ? (0x00200000 << e) : ((e - 1) << 23));
}
__device__ __forceinline__ int nibble_at(const u8* qs, int i) {
    int j = i & 15;
    return i < 16 ? (qs[j] & 15) : (qs[j] >> 4);
}
__device__ __forceinline__ float deq_iq4_nl(const u8* b, int i) {
    return f16_at(b, 0) * level16(IQ4_LEVELS, nibble_at(b + 2, i));
}
__device__ __forceinline__ int iq4_xs_scale(const u8* b, int s) {
    int hi = (b[2] | (b[3] << 8)) >> (2 * s);
    return (((b[4 + s / 2] >> (4 * (s & 1))) & 15) | ((hi & 3) << 4)) - 32;
}
__device__ __forceinline__ float deq_iq4_xs(const u8* b, int i) {
    int s = i >> 5;
    return f16_at(b, 0) * iq4_xs_scale(b, s) * level16(IQ4_LEVELS, nibble_at(b + 8 + 16 * s, i & 31));
}
__device__ __forceinline__ float deq_mxfp4(const u8* b, int i) {
    return e8m0_half(b[0]) * level16(MX_LEVELS, nibble_at(b + 1, i));
}
// Whole 16-bit weights: a "block" of one value.
__device__ __forceinline__ float deq_f16(const u8* b, int i) { return f16_at(b, 2 * i); }
__device__ __forceinline__ float bf16_at(const u8* b, int at) {
    return __int_as_float((int)((u32)(b[at] | (b[at + 1] << 8)) << 16));
}
__device__ __forceinline__ float deq_bf16(const u8* b, int i) { return bf16_at(b, 2 * i); }

// Eight consecutive values starting at i (a multiple of 8) of one block:
// the scales are decoded once per eight values. Types without a
// hand-written version go through deq_<type> one value at a time.
#define DEQ8_GENERIC(T) \
__device__ __forceinline__ void deq8_##T(const u8* b, int i, float* o) { \
    for (int e = 0; e < 8; e++) o[e] = deq_##T(b, i + e); \
}
DEQ8_GENERIC(q4_1)
DEQ8_GENERIC(q5_0)
DEQ8_GENERIC(q5_1)
DEQ8_GENERIC(q2_k)
DEQ8_GENERIC(q3_k)
DEQ8_GENERIC(q5_k)
DEQ8_GENERIC(iq4_nl)
DEQ8_GENERIC(iq4_xs)
DEQ8_GENERIC(mxfp4)
DEQ8_GENERIC(f16)
DEQ8_GENERIC(bf16)

__device__ __forceinline__ void deq8_q4_0(const u8* b, int i, float* o) {
    float d = f16_at(b, 0);
    const u8* q = b + 2 + (i & 15);
    int shift = i < 16 ? 0 : 4;
    for (int e = 0; e < 8; e++) o[e] = (((q[e] >> shift) & 15) - 8) * d;
}
__device__ __forceinline__ void deq8_q8_0(const u8* b, int i, float* o) {
    float d = f16_at(b, 0);
    for (int e = 0; e < 8; e++) o[e] = (signed char)b[2 + i + e] * d;
}
__device__ __forceinline__ void deq8_q4_k(const u8* b, int i, float* o) {
    int c = i >> 6, r = i & 63, hi = r >= 32, l0 = r & 31, s, m;
    scale_min_k4(2 * c + hi, b + 4, &s, &m);
    float ds = f16_at(b, 0) * s, dm = f16_at(b, 2) * m;
    // Blocks are 144 bytes from a 256-byte aligned base: this is 8-aligned.
    uint2 w = *(const uint2*)(b + 16 + c * 32 + l0);
    int shift = hi ? 4 : 0;
    for (int e = 0; e < 4; e++) {
        o[e] = ds * ((w.x >> (8 * e + shift)) & 15) - dm;
        o[e + 4] = ds * ((w.y >> (8 * e + shift)) & 15) - dm;
    }
}
__device__ __forceinline__ void deq8_q6_k(const u8* b, int i, float* o) {
    int half = i >> 7, r = i & 127, seg = r >> 5, l0 = r & 31;
    const u8* ql = b + half * 64 + ((seg & 1) ? 32 : 0) + l0;
    const u8* qh = b + 128 + half * 32 + l0;
    float ds = f16_at(b, 208) * (signed char)b[192 + half * 8 + (l0 >> 4) + 2 * seg];
    int lshift = (seg & 2) ? 4 : 0, hshift = 2 * seg;
    for (int e = 0; e < 8; e++) {
        int q = ((ql[e] >> lshift) & 15) | (((qh[e] >> hshift) & 3) << 4);
        o[e] = ds * (q - 32);
    }
}

