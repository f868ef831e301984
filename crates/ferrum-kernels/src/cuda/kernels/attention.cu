// ── Attention ───────────────────────────────────────────────────────────
// Over paged K/V pools ([block, nkv, bs, hd], see kv_at) for any number of
// segments (sequences, see Seg) in one launch; contiguous caches are the
// case of one block per sequence. Segment s's queries are head-major
// [nh, q_len, hd] at q_off of q, its output likewise in out. hd <= 256.
//
// A block of 4 warps serves 4 (query, head) pairs that read the same KV head
// (the heads of a GQA group, then consecutive queries), so each tile of
// `tile` keys is loaded into shared memory once for all four. Each warp keeps
// an online softmax over the keys it may see (causal bound, sliding window).
// `tile` 0 skips shared memory (prefill, where occupancy matters more).
// blockIdx.x is (segment, KV head, group of four pairs), with qblocks groups
// per (segment, KV head); blocks past a segment's pairs return at once.
// With one split (gridDim.y) the warp writes the normalised output;
// otherwise each split takes a contiguous share of the block's keys and
// writes (max, sum, unnormalised acc[hd]) to `part` at the query's row of
// the call (q_off / hd + head · q_len + query) for attention_combine
// (flash-decoding: a decode step has too few queries to fill the GPU).
// One key of a warp's online softmax: the score q·k (soft-capped), then the
// running max m, sum l and output acc with the key's value row vr. Lane
// `lane` holds dimensions lane + 32t, t < per.
__device__ __forceinline__ void attend_key(const float* qv, const float* kr, const float* vr, float* acc, float& m,
                                           float& l, int per, int hd, int lane, float softcap) {
    float s = 0.f;
    for (int t = 0; t < per; t++) { int d = lane + 32 * t; if (d < hd) s += qv[t] * kr[d]; }
    s = warp_sum(s);
    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
    float mn = fmaxf(m, s), corr = __expf(m - mn), pj = __expf(s - mn);
    l = l * corr + pj;
    for (int t = 0; t < per; t++) { int d = lane + 32 * t; acc[t] = acc[t] * corr + (d < hd ? pj * vr[d] : 0.f); }
    m = mn;
}

extern "C" __global__ void attention(const float* q, const float* kp, const float* vp, float* out, float* part,
                                     const int* segs, const u32* tables, int qblocks, int nh, int nkv, int hd,
                                     int bs, int causal, float scale, int window, int tile, float softcap) {
    EXTERN_SHARED(float, smem);
    float* ks = smem;
    float* vs = smem + tile * hd;
    int per_seg = nkv * qblocks;
    int sg = blockIdx.x / per_seg, kh = (blockIdx.x % per_seg) / qblocks, t4 = blockIdx.x % qblocks;
    Seg S = seg_at(segs, sg);
    int ql = S.q_len, kvl = S.kv_len, pos_offset = S.pos;
    const u32* table = tables + S.table;
    int group = nh / nkv, pairs = ql * group;
    if (t4 * 4 >= pairs) return;  // the whole block
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int idx = t4 * 4 + w;
    bool active = idx < pairs;
    int i = active ? idx / group : 0, h = kh * group + (active ? idx % group : 0);
    size_t row = (size_t)S.q_off / hd + (size_t)h * ql + i;
    const float* qr = q + row * hd;
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
            size_t at = kv_at(table, j, kh, nkv, bs, hd);
            const float* kr = kp + at;
            attend_key(qv, kr, vp + at, acc, m, l, per, hd, lane, softcap);
        }
    }
    for (int t0 = s_lo; tile > 0 && t0 < s_hi; t0 += tile) {
        int n = min(tile, s_hi - t0);
        __syncthreads();
        // Each warp copies whole keys: a key's hd values are contiguous in
        // its block, consecutive keys may not be.
        for (int kk = w; kk < n; kk += 4) {
            size_t at = kv_at(table, t0 + kk, kh, nkv, bs, hd);
            for (int d = lane; d < hd; d += 32) {
                ks[kk * hd + d] = kp[at + d];
                vs[kk * hd + d] = vp[at + d];
            }
        }
        __syncthreads();
        if (!active) continue;
        int j0 = max(lo - t0, 0), j1 = min(hi - t0, n);
        for (int j = j0; j < j1; j++) {
            const float* kr = ks + j * hd;
            attend_key(qv, kr, vs + j * hd, acc, m, l, per, hd, lane, softcap);
        }
    }
    #undef KEY_HI
    #undef KEY_LO
    if (!active) return;
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

// Merges the splits of each query: one warp per query row of a segment
// (blockIdx.y), rows as attention numbers them.
extern "C" __global__ void attention_combine(const float* part, float* out, const int* segs, int nh, int splits,
                                             int hd) {
    Seg S = seg_at(segs, blockIdx.y);
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (r >= nh * S.q_len) return;
    size_t row = (size_t)S.q_off / hd + r;
    const float* pr = part + row * splits * (hd + 2);
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
        out[row * hd + d] = a * inv;
    }
}
