// Runs one kernel of src/cuda/kernels on the CPU emulation (emu.h) for
// tests/cuda_emulated.rs: inputs and outputs are raw little-endian files,
// launches as cuda/*.rs makes them.
#include "emu.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../src/cuda/kernels/common.cuh"
#include "../../src/cuda/kernels/elementwise.cu"
#include "../../src/cuda/kernels/attention.cu"
#include "../../src/cuda/kernels/blocks.cuh"
#include "../../src/cuda/kernels/dequant.cu"
#include "../../src/cuda/kernels/mmvq.cu"

template <class T>
static std::vector<T> load(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    std::vector<T> out((n + sizeof(T) - 1) / sizeof(T));
    if (fread(out.data(), 1, n, f) != (size_t)n) { fprintf(stderr, "short read %s\n", path); exit(2); }
    fclose(f);
    return out;
}
template <class T>
static void save(const char* path, const T* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(T), n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}
static int ai(const char* s) { return atoi(s); }
static float af(const char* s) { return (float)atof(s); }

// The kernels' pointers must be 16-byte aligned (and blocks 256 as the
// device gives): copy into storage of that alignment.
template <class T>
struct Aligned {
    std::vector<unsigned char> raw;
    T* p;
    size_t n;
    explicit Aligned(size_t count) : raw(count * sizeof(T) + 256), n(count) {
        uintptr_t a = ((uintptr_t)raw.data() + 255) & ~(uintptr_t)255;
        p = (T*)a;
    }
    explicit Aligned(const std::vector<T>& v) : Aligned(v.size()) { memcpy(p, v.data(), v.size() * sizeof(T)); }
};

#define TYPES(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q2_k) X(q3_k) X(q4_k) X(q5_k) X(q6_k) X(iq4_nl) X(iq4_xs) X(mxfp4) X(f16) X(bf16)

static void quantize(const float* x, signed char* xq, float2* xd, int blocks) {
    emu_launch({(unsigned)((blocks * 32 + 255) / 256), 1}, 256, 0, [&] { quantize_q8_1(x, xq, xd, blocks); });
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    std::string op = argv[1];
    if (op == "tune") {  // the compiled-in variant
        printf("%d %d\n", MMVQ_COLS, MMVQ_THREADS);
        return 0;
    }
    if (op == "quantize") {  // x m k -> xq xd
        Aligned<float> x(load<float>(argv[2]));
        int m = ai(argv[3]), k = ai(argv[4]);
        Aligned<signed char> xq((size_t)m * k);
        Aligned<float2> xd((size_t)m * k / 32);
        quantize(x.p, xq.p, xd.p, m * k / 32);
        save(argv[5], xq.p, xq.n);
        save(argv[6], (float*)xd.p, xd.n * 2);
        return 0;
    }
    if (op == "mmvq") {  // type w x m n k -> out
        std::string t = argv[2];
        Aligned<u8> w(load<u8>(argv[3]));
        Aligned<float> x(load<float>(argv[4]));
        int m = ai(argv[5]), n = ai(argv[6]), k = ai(argv[7]);
        Aligned<signed char> xq((size_t)m * k);
        Aligned<float2> xd((size_t)m * k / 32);
        quantize(x.p, xq.p, xd.p, m * k / 32);
        Aligned<float> out((size_t)m * n);
        dim3e grid{(unsigned)((n + MMVQ_COLS - 1) / MMVQ_COLS), (unsigned)((m + MMVQ_ROWS - 1) / MMVQ_ROWS)};
        bool found = false;
        if (m == 1) grid.y = 1;
#define RUN(T) if (t == #T) { found = true; emu_launch(grid, MMVQ_THREADS, 0, [&] { \
            if (m == 1) mmvq1_##T(w.p, (const int*)xq.p, xd.p, out.p, m, n, k); \
            else mmvq_##T(w.p, (const int*)xq.p, xd.p, out.p, m, n, k); }); }
        TYPES(RUN)
#undef RUN
        if (!found) return 3;
        save(argv[8], out.p, out.n);
        return 0;
    }
    if (op == "experts") {  // type w x tiles n k out(in/out) expert_bytes
        std::string t = argv[2];
        Aligned<u8> w(load<u8>(argv[3]));
        Aligned<float> x(load<float>(argv[4]));
        std::vector<unsigned long long> tiles = load<unsigned long long>(argv[5]);
        int n = ai(argv[6]), k = ai(argv[7]);
        Aligned<float> out(load<float>(argv[8]));
        size_t rows = x.n / k;
        Aligned<signed char> xq(rows * k);
        Aligned<float2> xd(rows * k / 32);
        quantize(x.p, xq.p, xd.p, (int)(rows * k / 32));
        // Word 0 of a tile names its expert; the experts' blocks are back to
        // back, expert_bytes each: rewrite to pointers, as the host gives.
        size_t eb = (size_t)ai(argv[9]);
        for (size_t i = 0; i < tiles.size(); i += 2) tiles[i] = (unsigned long long)(uintptr_t)(w.p + tiles[i] * eb);
        Aligned<unsigned long long> dt(tiles);
        dim3e grid{(unsigned)((n + MMVQ_COLS - 1) / MMVQ_COLS), (unsigned)(tiles.size() / 2)};
        bool found = false;
        bool one_row = true;
        for (size_t i = 1; i < tiles.size(); i += 2) one_row &= (tiles[i] >> 32) == 1;
#define RUN(T) if (t == #T) { found = true; emu_launch(grid, MMVQ_THREADS, 0, [&] { \
            if (one_row) mmvq1_experts_##T(dt.p, (const int*)xq.p, xd.p, out.p, n, k); \
            else mmvq_experts_##T(dt.p, (const int*)xq.p, xd.p, out.p, n, k); }); }
        TYPES(RUN)
#undef RUN
        if (!found) return 3;
        save(argv[8], out.p, out.n);
        return 0;
    }
    if (op == "dequant_bf16") {  // type w n k -> out (u16)
        std::string t = argv[2];
        Aligned<u8> w(load<u8>(argv[3]));
        int n = ai(argv[4]), k = ai(argv[5]);
        Aligned<u16> out((size_t)n * k);
        size_t groups = (size_t)n * k / 8;
        dim3e grid{(unsigned)std::min<size_t>((groups + 255) / 256, 65536), 1};
        bool found = false;
#define RUN(T) if (t == #T) { found = true; emu_launch(grid, 256, 0, [&] { dequant_bf16_##T(w.p, out.p, n, k); }); }
        TYPES(RUN)
#undef RUN
        if (!found) return 3;
        save(argv[6], out.p, out.n);
        return 0;
    }
    if (op == "attention") {
        // q kp vp meta nseg qblocks nh nkv hd bs causal scale window tile softcap splits rows out(in/out)
        Aligned<float> q(load<float>(argv[2])), kp(load<float>(argv[3])), vp(load<float>(argv[4]));
        Aligned<int> meta(load<int>(argv[5]));
        int nseg = ai(argv[6]), qblocks = ai(argv[7]), nh = ai(argv[8]), nkv = ai(argv[9]), hd = ai(argv[10]);
        int bs = ai(argv[11]), causal = ai(argv[12]);
        float scale = af(argv[13]);
        int window = ai(argv[14]), tile = ai(argv[15]);
        float softcap = af(argv[16]);
        int splits = ai(argv[17]), rows = ai(argv[18]), maxq = ai(argv[19]);
        Aligned<float> out(load<float>(argv[20]));
        Aligned<float> part((size_t)rows * splits * (hd + 2));
        const int* segs = meta.p;
        const u32* tables = (const u32*)meta.p + 5 * nseg;
        emu_launch({(unsigned)(nseg * nkv * qblocks), (unsigned)splits}, 128, 2 * tile * hd * 4, [&] {
            attention(q.p, kp.p, vp.p, out.p, part.p, segs, tables, qblocks, nh, nkv, hd, bs, causal, scale, window,
                      tile, softcap);
        });
        if (splits > 1)
            emu_launch({(unsigned)((nh * maxq + 3) / 4), (unsigned)nseg}, 128, 0,
                       [&] { attention_combine(part.p, out.p, segs, nh, splits, hd); });
        save(argv[20], out.p, out.n);
        return 0;
    }
    if (op == "rows_qkv") {
        // q k v qn kn cos sin qout kp vp meta nseg nh nkv hd bs eps mode (qout kp vp in/out)
        Aligned<float> q(load<float>(argv[2])), k(load<float>(argv[3])), v(load<float>(argv[4]));
        Aligned<float> qn(load<float>(argv[5])), kn(load<float>(argv[6])), cs(load<float>(argv[7])), sn(load<float>(argv[8]));
        Aligned<float> qo(load<float>(argv[9])), kp(load<float>(argv[10])), vp(load<float>(argv[11]));
        Aligned<int> meta(load<int>(argv[12]));
        int nseg = ai(argv[13]), nh = ai(argv[14]), nkv = ai(argv[15]), hd = ai(argv[16]), bs = ai(argv[17]);
        float eps = af(argv[18]);
        int mode = ai(argv[19]);
        unsigned threads = (unsigned)std::min(std::max((hd / 2 + 31) / 32, 1), 32) * 32;
        emu_launch({(unsigned)(nseg * (nh + 2 * nkv)), 1}, threads, 0, [&] {
            rows_qkv(q.p, k.p, v.p, qn.p, kn.p, cs.p, sn.p, qo.p, kp.p, vp.p, meta.p, (const u32*)meta.p + 5 * nseg,
                     nh, nkv, hd, bs, eps, mode);
        });
        save(argv[9], qo.p, qo.n);
        save(argv[10], kp.p, kp.n);
        save(argv[11], vp.p, vp.n);
        return 0;
    }
    if (op == "kv_append") {  // kp vp nk nv meta nt nkv hd bs (kp vp in/out)
        Aligned<float> kp(load<float>(argv[2])), vp(load<float>(argv[3])), nk(load<float>(argv[4])), nv(load<float>(argv[5]));
        Aligned<int> meta(load<int>(argv[6]));
        int nt = ai(argv[7]), nkv = ai(argv[8]), hd = ai(argv[9]), bs = ai(argv[10]);
        size_t total = (size_t)nkv * nt * hd;
        emu_launch({(unsigned)((total + 255) / 256), 1}, 256, 0, [&] {
            paged_kv_append(kp.p, vp.p, nk.p, nv.p, meta.p, (const u32*)meta.p + 5, nt, nkv, hd, bs);
        });
        save(argv[2], kp.p, kp.n);
        save(argv[3], vp.p, vp.n);
        return 0;
    }
    fprintf(stderr, "unknown op %s\n", op.c_str());
    return 2;
}
