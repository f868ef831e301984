// Ferrum's CUDA kernels, compiled at run time with NVRTC for the device's
// architecture. f32 activations; conventions as in backend.rs (row-major,
// linear weights [n, k], head-major attention, half-split RoPE).

typedef unsigned char u8;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float f16_at(const u8* b, int off) {
    return h2f((unsigned short)(b[off] | (b[off + 1] << 8)));
}
__device__ __forceinline__ float warp_sum(float v) {
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

// ── Norms (one block per row) ───────────────────────────────────────────
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, float eps, int dim) {
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* o = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

extern "C" __global__ void fused_add_rms_norm(float* res, const float* x, const float* w, float* out, float eps, int dim) {
    float* r = res + (size_t)blockIdx.x * dim;
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* o = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = r[i] + xr[i];
        r[i] = v;
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = r[i] * inv * w[i];
}

extern "C" __global__ void layer_norm(const float* x, const float* g, const float* b, float* out, float eps, int dim) {
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* o = out + (size_t)blockIdx.x * dim;
    float s = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / dim;
    float v = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) { float d = xr[i] - mean; v += d * d; }
    float inv = rsqrtf(block_sum(v) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = (xr[i] - mean) * inv * g[i] + b[i];
}

// ── Element-wise ────────────────────────────────────────────────────────
#define GRID_LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)

extern "C" __global__ void add_inplace(float* r, const float* x, int n) { GRID_LOOP(i, n) r[i] += x[i]; }

// dst[rows[i], :] += w[i] * src[i, :]; rows are distinct within a call.
extern "C" __global__ void scale_add_rows(const float* src, const unsigned* rows, const float* w,
                                          float* dst, int n, int dim) {
    GRID_LOOP(t, (size_t)n * dim) {
        size_t i = t / dim, c = t % dim;
        dst[(size_t)rows[i] * dim + c] += w[i] * src[t];
    }
}

// dst[t, :] += sum over j < per of w[t * per + j] * src[rows[t * per + j], :]:
// each token's expert outputs, in the order given, without atomics.
extern "C" __global__ void gather_add_rows(const float* src, const unsigned* rows, const float* w,
                                           float* dst, int tokens, int per, int dim) {
    GRID_LOOP(t, (size_t)tokens * dim) {
        size_t r = t / dim, c = t % dim;
        float acc = dst[t];
        for (int j = 0; j < per; j++) acc += w[r * per + j] * src[(size_t)rows[r * per + j] * dim + c];
        dst[t] = acc;
    }
}

extern "C" __global__ void add_bias(float* d, const float* b, int rows, int cols) {
    GRID_LOOP(i, (size_t)rows * cols) d[i] += b[i % cols];
}

extern "C" __global__ void gelu_erf(const float* x, float* out, int n) {
    GRID_LOOP(i, n) { float v = x[i]; out[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }
}

extern "C" __global__ void silu_mul(const float* gu, float* out, int tokens, int im) {
    GRID_LOOP(e, (size_t)tokens * im) {
        size_t t = e / im, i = e % im;
        float g = gu[t * 2 * im + i], u = gu[t * 2 * im + im + i];
        out[e] = g / (1.f + expf(-g)) * u;
    }
}

extern "C" __global__ void gelu_tanh_mul(const float* gu, float* out, int tokens, int im) {
    GRID_LOOP(e, (size_t)tokens * im) {
        size_t t = e / im, i = e % im;
        float g = gu[t * 2 * im + i], u = gu[t * 2 * im + im + i];
        float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[e] = 0.5f * g * (1.f + tanhf(inner)) * u;
    }
}

extern "C" __global__ void split_qkv(const float* qkv, float* q, float* k, float* v, int tokens, int qd, int kvd) {
    int w = qd + 2 * kvd;
    GRID_LOOP(e, (size_t)tokens * w) {
        size_t t = e / w; int c = e % w;
        float x = qkv[e];
        if (c < qd) q[t * qd + c] = x;
        else if (c < qd + kvd) k[t * kvd + c - qd] = x;
        else v[t * kvd + c - qd - kvd] = x;
    }
}

extern "C" __global__ void embedding(const float* table, const u32* ids, float* out, int tokens, int dim) {
    GRID_LOOP(e, (size_t)tokens * dim) {
        size_t t = e / dim, c = e % dim;
        out[e] = table[(size_t)ids[t] * dim + c];
    }
}

// out[r, j] = x[r, order[j]]: an act-order weight's input order.
extern "C" __global__ void gather_columns(const float* x, const u32* order, float* out, int m, int k) {
    GRID_LOOP(e, (size_t)m * k) {
        size_t r = e / k, j = e % k;
        out[e] = x[r * k + order[j]];
    }
}

// [heads, tokens, dim] -> [tokens, heads, dim]
extern "C" __global__ void head_to_token(const float* src, float* dst, int tokens, int heads, int dim) {
    GRID_LOOP(e, (size_t)tokens * heads * dim) {
        size_t h = e / ((size_t)tokens * dim), r = e % ((size_t)tokens * dim);
        size_t t = r / dim, c = r % dim;
        dst[(t * heads + h) * dim + c] = src[e];
    }
}

// New head-major rows [nkv, nt, hd] into caches [nkv, cap, hd] at cache_len.
extern "C" __global__ void kv_append(float* ck, float* cv, const float* nk, const float* nv, int cache_len, int cap, int nt, int nkv, int hd) {
    GRID_LOOP(e, (size_t)nkv * nt * hd) {
        size_t h = e / ((size_t)nt * hd), r = e % ((size_t)nt * hd);
        size_t t = r / hd, c = r % hd;
        size_t dst = (h * cap + cache_len + t) * hd + c;
        ck[dst] = nk[e];
        cv[dst] = nv[e];
    }
}

// One block of hd/2 threads (rounded up to 32) per (token, head): token-major
// in, head-major out, with optional per-head RMSNorm (mode 1) and RoPE
// (modes 1, 2) on (d, d + hd/2) pairs.
extern "C" __global__ void qk_norm_rope(const float* in, const float* nw, const float* cs, const float* sn, float* out,
                                        int tokens, int heads, int hd, int pos_offset, float eps, int mode) {
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    const float* src = in + ((size_t)t * heads + h) * hd;
    float* dst = out + ((size_t)h * tokens + t) * hd;
    int half = hd / 2;
    if (mode == 0) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = src[i];
        return;
    }
    float scale = 1.f;
    if (mode == 1) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += src[i] * src[i];
        scale = rsqrtf(block_sum(ss) / hd + eps);
    }
    int p = pos_offset + t;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = src[i] * scale, b = src[i + half] * scale;
        if (mode == 1) { a *= nw[i]; b *= nw[i + half]; }
        float c = cs[(size_t)p * half + i], s = sn[(size_t)p * half + i];
        dst[i] = a * c - b * s;
        dst[i + half] = b * c + a * s;
    }
}

// ── Attention ───────────────────────────────────────────────────────────
// q [b, nh, ql, hd]; k, v [b, nkv, stride, hd]; out like q. hd <= 256.
// A block of 4 warps serves 4 (query, head) pairs that read the same KV head
// (the heads of a GQA group, then consecutive queries), so each tile of
// `tile` keys is loaded into shared memory once for all four. Each warp keeps
// an online softmax over the keys it may see (causal bound, sliding window).
// `tile` 0 skips shared memory (prefill, where occupancy matters more).
// With splits == 1 the warp writes the normalised output; otherwise each of
// gridDim.y splits takes a contiguous share of the block's keys and writes
// (max, sum, unnormalised acc[hd]) to `part` for attention_combine
// (flash-decoding: a decode step has too few queries to fill the GPU).
extern "C" __global__ void attention(const float* q, const float* k, const float* v, float* out, float* part,
                                     int nh, int nkv, int ql, int kvl, int stride, int hd, int pos_offset,
                                     int causal, float scale, int window, int tile, float softcap) {
    extern __shared__ float smem[];
    float* ks = smem;
    float* vs = smem + tile * hd;
    int group = nh / nkv, pairs = ql * group;
    int per_bk = (pairs + 3) / 4;
    int bk = blockIdx.x / per_bk, t4 = blockIdx.x % per_bk;
    int b = bk / nkv, kh = bk % nkv;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int idx = t4 * 4 + w;
    bool active = idx < pairs;
    int i = active ? idx / group : 0, h = kh * group + (active ? idx % group : 0);
    const float* kb = k + ((size_t)b * nkv + kh) * stride * hd;
    const float* vb = v + ((size_t)b * nkv + kh) * stride * hd;
    const float* qr = q + (((size_t)b * nh + h) * ql + i) * hd;
    float qv[8], acc[8];
    int per = (hd + 31) / 32;
    for (int j = 0; j < per; j++) { int d = lane + 32 * j; qv[j] = (active && d < hd) ? qr[d] * scale : 0.f; acc[j] = 0.f; }
    // Visible keys [lo, hi) of query row r; monotone in r.
    #define KEY_HI(r) (causal ? min(kvl, pos_offset + (r) + 1) : kvl)
    #define KEY_LO(r) ((window > 0 && pos_offset + (r) + 1 > window) ? pos_offset + (r) + 1 - window : 0)
    int hi = KEY_HI(i), lo = KEY_LO(i);
    int first = (t4 * 4) / group, last = (min(t4 * 4 + 3, pairs - 1)) / group;
    int b_lo = KEY_LO(first), b_hi = KEY_HI(last);
    int splits = gridDim.y, sp = blockIdx.y;
    int chunk = (b_hi - b_lo + splits - 1) / splits;
    int s_lo = b_lo + sp * chunk, s_hi = min(b_hi, s_lo + chunk);
    float m = __int_as_float(0xff800000), l = 0.f;  // -inf
    if (tile == 0 && active) {
        // Many queries (prefill): plenty of warps to hide latency, so read
        // K/V straight from global memory (L2) at full occupancy.
        for (int j = max(lo, s_lo); j < min(hi, s_hi); j++) {
            const float* kr = kb + (size_t)j * hd;
            float s = 0.f;
            for (int t = 0; t < per; t++) { int d = lane + 32 * t; if (d < hd) s += qv[t] * kr[d]; }
            s = warp_sum(s);
            if (softcap > 0.f) s = softcap * tanhf(s / softcap);
            float mn = fmaxf(m, s), corr = __expf(m - mn), pj = __expf(s - mn);
            l = l * corr + pj;
            const float* vr = vb + (size_t)j * hd;
            for (int t = 0; t < per; t++) { int d = lane + 32 * t; acc[t] = acc[t] * corr + (d < hd ? pj * vr[d] : 0.f); }
            m = mn;
        }
    }
    for (int t0 = s_lo; tile > 0 && t0 < s_hi; t0 += tile) {
        int n = min(tile, s_hi - t0);
        __syncthreads();
        for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
            ks[e] = kb[(size_t)t0 * hd + e];
            vs[e] = vb[(size_t)t0 * hd + e];
        }
        __syncthreads();
        if (!active) continue;
        int j0 = max(lo - t0, 0), j1 = min(hi - t0, n);
        for (int j = j0; j < j1; j++) {
            const float* kr = ks + j * hd;
            float s = 0.f;
            for (int t = 0; t < per; t++) { int d = lane + 32 * t; if (d < hd) s += qv[t] * kr[d]; }
            s = warp_sum(s);
            if (softcap > 0.f) s = softcap * tanhf(s / softcap);
            float mn = fmaxf(m, s), corr = __expf(m - mn), pj = __expf(s - mn);
            l = l * corr + pj;
            const float* vr = vs + j * hd;
            for (int t = 0; t < per; t++) { int d = lane + 32 * t; acc[t] = acc[t] * corr + (d < hd ? pj * vr[d] : 0.f); }
            m = mn;
        }
    }
    #undef KEY_HI
    #undef KEY_LO
    if (!active) return;
    size_t row = ((size_t)b * nh + h) * ql + i;
    if (splits == 1) {
        float* o = out + row * hd;
        float inv = l > 0.f ? 1.f / l : 0.f;
        for (int t = 0; t < per; t++) { int d = lane + 32 * t; if (d < hd) o[d] = acc[t] * inv; }
        return;
    }
    float* pr = part + (row * splits + sp) * (hd + 2);
    if (lane == 0) { pr[0] = m; pr[1] = l; }
    for (int t = 0; t < per; t++) { int d = lane + 32 * t; if (d < hd) pr[2 + d] = acc[t]; }
}

// Merges the splits of each query: one warp per (batch, head, query).
extern "C" __global__ void attention_combine(const float* part, float* out, int nwarps, int splits, int hd) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= nwarps) return;
    const float* pr = part + (size_t)warp * splits * (hd + 2);
    float mx = __int_as_float(0xff800000);
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, pr[s * (hd + 2)]);
    float L = 0.f;
    for (int s = 0; s < splits; s++) {
        float ms = pr[s * (hd + 2)];
        if (ms > __int_as_float(0xff800000)) L += pr[s * (hd + 2) + 1] * __expf(ms - mx);
    }
    float inv = L > 0.f ? 1.f / L : 0.f;
    for (int d = lane; d < hd; d += 32) {
        float a = 0.f;
        for (int s = 0; s < splits; s++) {
            float ms = pr[s * (hd + 2)];
            if (ms > __int_as_float(0xff800000)) a += pr[s * (hd + 2) + 2 + d] * __expf(ms - mx);
        }
        out[(size_t)warp * hd + d] = a * inv;
    }
}

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
#define QUANT_KERNELS(T, QK, BB) DEQUANT_KERNEL(T, QK, BB) GENERIC_COLS(T, QK, BB) GEMV_KERNELS(T)

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
            float d = h2f((unsigned short)(dm & 0xffff)), dmin = h2f((unsigned short)(dm >> 16));
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
