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

// One head's row on its way into attention: optional RMSNorm over the head
// (mode 1, weight nw) and RoPE on (d, d + hd/2) pairs at position p (modes
// 1, 2); mode 0 copies. Run by a whole block (block_sum), hd/2 threads or
// more.
__device__ void norm_rope_head(const float* src, float* dst, const float* nw, const float* cs, const float* sn,
                               int hd, int p, float eps, int mode) {
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
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = src[i] * scale, b = src[i + half] * scale;
        if (mode == 1) { a *= nw[i]; b *= nw[i + half]; }
        float c = cs[(size_t)p * half + i], s = sn[(size_t)p * half + i];
        dst[i] = a * c - b * s;
        dst[i + half] = b * c + a * s;
    }
}

// One block of hd/2 threads (rounded up to 32) per (token, head): token-major
// in, head-major out, through norm_rope_head.
extern "C" __global__ void qk_norm_rope(const float* in, const float* nw, const float* cs, const float* sn, float* out,
                                        int tokens, int heads, int hd, int pos_offset, float eps, int mode) {
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    norm_rope_head(in + ((size_t)t * heads + h) * hd, out + ((size_t)h * tokens + t) * hd, nw, cs, sn, hd,
                   pos_offset + t, eps, mode);
}

// New head-major rows [nkv, nt, hd] of one sequence (segment 0 of segs)
// into a paged pool at positions pos..pos + nt.
extern "C" __global__ void paged_kv_append(float* kp, float* vp, const float* nk, const float* nv, const int* segs,
                                           const u32* tables, int nt, int nkv, int hd, int bs) {
    Seg s = seg_at(segs, 0);
    const u32* table = tables + s.table;
    GRID_LOOP(e, (size_t)nkv * nt * hd) {
        int h = e / ((size_t)nt * hd), t = (e / hd) % nt, c = e % hd;
        size_t dst = kv_at(table, s.pos + t, h, nkv, bs, hd) + c;
        kp[dst] = nk[e];
        vp[dst] = nv[e];
    }
}

// A decode batch's Q, K and V (one token per segment, its row q_off / (nh·hd)
// of the token-major q, k, v): Q through mode into q_out at q_off (one
// token's heads are its row), K through mode and V as it is into the pools
// at the segment's position. One block per (segment, head of Q, K or V).
extern "C" __global__ void rows_qkv(const float* q, const float* k, const float* v, const float* qn, const float* kn,
                                    const float* cs, const float* sn, float* q_out, float* kp, float* vp,
                                    const int* segs, const u32* tables, int nh, int nkv, int hd, int bs, float eps,
                                    int mode) {
    int per = nh + 2 * nkv;
    int sg = blockIdx.x / per, h = blockIdx.x % per;
    Seg s = seg_at(segs, sg);
    size_t r = s.q_off / ((size_t)nh * hd);
    if (h < nh) {
        norm_rope_head(q + (r * nh + h) * hd, q_out + s.q_off + (size_t)h * hd, qn, cs, sn, hd, s.pos, eps, mode);
        return;
    }
    h -= nh;
    bool is_v = h >= nkv;
    if (is_v) h -= nkv;
    size_t dst = kv_at(tables + s.table, s.pos, h, nkv, bs, hd);
    if (is_v) norm_rope_head(v + (r * nkv + h) * hd, vp + dst, kn, cs, sn, hd, s.pos, eps, 0);
    else norm_rope_head(k + (r * nkv + h) * hd, kp + dst, kn, cs, sn, hd, s.pos, eps, mode);
}
