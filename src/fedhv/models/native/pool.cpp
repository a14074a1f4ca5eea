// 2x2 max-pool + bias + ReLU of a channels-last map (fedhv/models/native/__init__.py), written per
// group and flattened (the layout the per-copy linear layer reads):
//   h    : [B, H, W, G*K]  channels last;  bias : [G*K]
//   out  : [G, B, K, H/2, W/2]  out = relu(max_window h + bias);  idx : [B, H/2, W/2, G*K] window codes
//   gh   : [B, H, W, G*K]  gradient of sum(g * out), every element written (no zero-fill needed)
//   (codes as in conv1.cpp: window position 0..3 of the first maximum, -1 where the ReLU is off).
#include "common.h"

namespace fedhv {
namespace {

template <typename T>
void pool_forward(const T* h, const T* bias, T* out, typename Lanes<T>::Code* idx, int64_t B, int64_t G, int64_t K,
                  int64_t H, int64_t W, int threads) {
    typedef typename Lanes<T>::V V;
    typedef typename Lanes<T>::I I;
    typedef typename Lanes<T>::Code Code;
    const int64_t Ho = H / 2, Wo = W / 2, GK = G * K, S = Ho * Wo, nv = (GK + L - 1) / L;
    std::vector<int64_t> base(GK + L, 0);  // out offset of channel g*K + k at b = 0, (i, j) = 0
    for (int64_t ch = 0; ch < GK; ++ch) base[ch] = (ch / K) * B * K * S + (ch % K) * S;
    std::vector<V> bv(nv);
    const I keep = first_lanes<I>(GK - (nv - 1) * L);  // the lanes of the last (partial) vector
    for (int64_t v = 0; v < nv; ++v) bv[v] = load_n(bias + v * L, std::min<int64_t>(L, GK - v * L), V{}, keep, false);
    const int64_t* const bp = base.data();
    const V* const bvp = bv.data();
    const T* const h_end = h + B * H * W * GK;
    parallel(B, threads, [=](int64_t b) {
        T o[L];
        Code* const idx_end = idx ? idx + (b + 1) * Ho * Wo * GK : nullptr;
        for (int64_t i = 0; i < Ho; ++i)
            for (int64_t j = 0; j < Wo; ++j) {
                const T* p = h + ((b * H + 2 * i) * W + 2 * j) * GK;
                const int64_t pos = b * K * S + i * Wo + j;
                for (int64_t ch = 0, v = 0; ch < GK; ch += L, ++v) {
                    const int64_t n = std::min<int64_t>(L, GK - ch);
                    const T* q[4] = {p + ch, p + GK + ch, p + W * GK + ch, p + (W + 1) * GK + ch};
                    V a[4];
                    for (int d = 0; d < 4; ++d) a[d] = load_n(q[d], n, V{}, keep, q[d] + L <= h_end);
                    V m = a[0];
                    I arg = {};
                    for (int d = 1; d < 4; ++d) {
                        const I up = (a[d] > m) | (a[d] != a[d]);
                        m = up ? a[d] : m;
                        arg = up ? I{} + d : arg;
                    }
                    const V val = m + bvp[v];
                    const I off = val <= V{};
                    store(o, off ? V{} : val);
                    for (int64_t l = 0; l < n; ++l) out[bp[ch + l] + pos] = o[l];
                    if (idx) {
                        Code* c = idx + ((b * Ho + i) * Wo + j) * GK + ch;
                        store_n(c, off ? I{} - 1 : arg, n, keep, c + L <= idx_end);
                    }
                }
            }
    });
}

template <typename T>
void pool_backward(const T* g, const typename Lanes<T>::Code* idx, T* gh, T* gb, int64_t B, int64_t G, int64_t K,
                   int64_t H, int64_t W, int threads) {
    typedef typename Lanes<T>::V V;
    typedef typename Lanes<T>::I I;
    typedef typename Lanes<T>::Code Code;
    const int64_t Ho = H / 2, Wo = W / 2, GK = G * K, S = Ho * Wo;
    const int64_t block = 16, blocks = (B + block - 1) / block, nv = (GK + L - 1) / L;
    std::vector<int64_t> base(GK);
    for (int64_t ch = 0; ch < GK; ++ch) base[ch] = (ch / K) * B * K * S + (ch % K) * S;
    const int64_t* const bp = base.data();
    std::vector<V> part(blocks * nv);  // bias-gradient partial sums per block of samples
    V* const pp = part.data();
    const Code* const idx_end = idx + B * Ho * Wo * GK;
    const I keep = first_lanes<I>(GK - (nv - 1) * L);
    parallel(blocks, threads, [=](int64_t blk) {
        T gl[L];
        V* acc = pp + blk * nv;
        const int64_t b1 = std::min(B, (blk + 1) * block);
        T* const gh_end = gh + b1 * H * W * GK;  // this task writes samples [blk * block, b1)
        for (int64_t b = blk * block; b < b1; ++b)
            for (int64_t i = 0; i < Ho; ++i)
                for (int64_t j = 0; j < Wo; ++j) {
                    T* q = gh + ((b * H + 2 * i) * W + 2 * j) * GK;
                    const int64_t pos = b * K * S + i * Wo + j;
                    for (int64_t ch = 0, v = 0; ch < GK; ch += L, ++v) {
                        const int64_t n = std::min<int64_t>(L, GK - ch);
                        for (int64_t l = 0; l < L; ++l) gl[l] = l < n ? g[bp[ch + l] + pos] : T(0);
                        const V gv = load<V>(gl);
                        const Code* c = idx + ((b * Ho + i) * Wo + j) * GK + ch;
                        const I id = load_n(c, n, I{} - 1, keep, c + L <= idx_end);
                        acc[v] += id >= 0 ? gv : V{};
                        // Window order (0,0) (0,1) (1,0) (1,1): a partial vector's spill-over lanes are
                        // written back unchanged, and only ever into this task's samples.
                        T* const dst[4] = {q + ch, q + GK + ch, q + W * GK + ch, q + (W + 1) * GK + ch};
                        for (int d = 0; d < 4; ++d) store_n(dst[d], id == d ? gv : V{}, n, keep, dst[d] + L <= gh_end);
                    }
                }
    });
    if (!gb) return;
    for (int64_t v = 0; v < nv; ++v) {
        V acc = {};
        for (int64_t blk = 0; blk < blocks; ++blk) acc += part[blk * nv + v];
        for (int64_t l = 0; l < L && v * L + l < GK; ++l) gb[v * L + l] = acc[l];
    }
}

}  // namespace
}  // namespace fedhv

using namespace fedhv;

extern "C" {

#define FEDHV_POOL(SUFFIX, T)                                                                                   \
    void fedhv_pool_forward_##SUFFIX(const T* h, const T* bias, T* out, Lanes<T>::Code* idx, int64_t B, int64_t G,  \
                                     int64_t K, int64_t H, int64_t W, int threads) {                                \
        pool_forward(h, bias, out, idx, B, G, K, H, W, threads);                                                    \
    }                                                                                                               \
    void fedhv_pool_backward_##SUFFIX(const T* g, const Lanes<T>::Code* idx, T* gh, T* gb, int64_t B, int64_t G,    \
                                      int64_t K, int64_t H, int64_t W, int threads) {                               \
        pool_backward(g, idx, gh, gb, B, G, K, H, W, threads);                                                      \
    }
FEDHV_POOL(f32, float)
FEDHV_POOL(f64, double)

}  // extern "C"
