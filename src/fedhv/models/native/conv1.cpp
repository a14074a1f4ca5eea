// LeNet's first layer (fedhv/models/native/__init__.py): fused single-input-channel 3x3
// convolution (padding 1) + 2x2 max-pool + bias + ReLU, per group. Shapes (all row-major):
//   x    : B x C planes of H x W values; plane (b, c) starts at x + b*sxb + c*sxc, rows contiguous.
//   w    : [C*K, 9]  (group c's output channel k has the 3x3 taps w[(c*K + k)*9 + 3u + v])
//   bias : [C*K]
//   y    : [B, H/2, W/2, C*K]  (channels last)  y = relu(max_{window} conv(x, w) + bias)
//   idx  : [B, H/2, W/2, C*K]  int32 (float) / int64 (double): window position of the maximum (0..3,
//          row-major, the first maximum as in PyTorch's max_pool2d), or -1 where the ReLU is inactive
//          (y <= 0). Codes as wide as the values: GCC 12 widens a uint8 vector lane by lane.
//   gw   : [C*K, 9], gb : [C*K]  gradients of sum(g * y) for g : [B, H/2, W/2, C*K].
// K <= 16: one vector of 16 lanes holds a group's K output channels (lanes >= K stay zero).
//
#include "common.h"

namespace fedhv {
namespace {

// Copies the C planes of sample b into pad (C x (H+2) x (W+2), border already zero).
template <typename T>
void pad_planes(const T* x, int64_t sxb, int64_t sxc, int64_t b, int64_t c0, int64_t c1, int64_t H, int64_t W,
                T* pad) {
    const int64_t P = W + 2;
    for (int64_t c = c0; c < c1; ++c) {
        const T* src = x + b * sxb + c * sxc;
        T* dst = pad + (c - c0) * (H + 2) * P + P + 1;
        for (int64_t r = 0; r < H; ++r) std::memcpy(dst + r * P, src + r * W, W * sizeof(T));
    }
}

// Group weights as vectors: wv[c*9 + t] lanes k < K = w[(c*K + k)*9 + t]; bv[c] = bias[c*K + k].
template <typename T, typename V>
void weight_vectors(const T* w, const T* bias, int64_t C, int64_t K, V* wv, V* bv) {
    for (int64_t c = 0; c < C; ++c) {
        for (int t = 0; t < 9; ++t) {
            V v = {};
            for (int64_t k = 0; k < K; ++k) v[k] = w[(c * K + k) * 9 + t];
            wv[c * 9 + t] = v;
        }
        V v = {};
        if (bias)
            for (int64_t k = 0; k < K; ++k) v[k] = bias[c * K + k];
        bv[c] = v;
    }
}

template <typename T>
void forward(const T* x, int64_t sxb, int64_t sxc, const T* w, const T* bias, T* y, typename Lanes<T>::Code* idx,
             int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int threads) {
    typedef typename Lanes<T>::V V;
    typedef typename Lanes<T>::I I;
    typedef typename Lanes<T>::Code Code;
    const int64_t Ho = H / 2, Wo = W / 2, P = W + 2, CK = C * K, plane = (H + 2) * P;
    std::vector<V> wv(C * 9), bv(C);
    weight_vectors(w, bias, C, K, wv.data(), bv.data());
    const V* const wp = wv.data();
    const V* const bp = bv.data();
    const int64_t block = 16;
    parallel((B + block - 1) / block, threads, [=](int64_t task) {
        const int64_t b0 = task * block, b1 = std::min(B, (task + 1) * block), end = b1 * Ho * Wo * CK;
        std::vector<T> pad(C * plane, T(0));
        T tail[L];
        Code itail[L];
        for (int64_t b = b0; b < b1; ++b) {
            pad_planes(x, sxb, sxc, b, 0, C, H, W, pad.data());
            for (int64_t i = 0; i < Ho; ++i)
                for (int64_t j = 0; j < Wo; ++j) {
                    const int64_t at = ((b * Ho + i) * Wo + j) * CK;
                    for (int64_t c = 0; c < C; ++c) {
                        const T* p = pad.data() + c * plane + 2 * i * P + 2 * j;
                        const V* wc = wp + c * 9;
                        V a0 = {}, a1 = {}, a2 = {}, a3 = {};  // window positions (0,0) (0,1) (1,0) (1,1)
                        for (int u = 0; u < 3; ++u)
                            for (int v = 0; v < 3; ++v) {
                                const V wt = wc[3 * u + v];
                                a0 += wt * p[u * P + v];
                                a1 += wt * p[u * P + v + 1];
                                a2 += wt * p[(u + 1) * P + v];
                                a3 += wt * p[(u + 1) * P + v + 1];
                            }
                        // First maximum in row-major window order; NaN wins (PyTorch's max_pool2d).
                        V m = a0;
                        I arg = {};
                        I up = (a1 > m) | (a1 != a1);
                        m = up ? a1 : m; arg = up ? I{} + 1 : arg;
                        up = (a2 > m) | (a2 != a2);
                        m = up ? a2 : m; arg = up ? I{} + 2 : arg;
                        up = (a3 > m) | (a3 != a3);
                        m = up ? a3 : m; arg = up ? I{} + 3 : arg;
                        const V o = m + bp[c];
                        const I off = o <= V{};  // ReLU inactive (NaN stays active, as torch.relu)
                        const V out = off ? V{} : o;
                        const I code = off ? I{} - 1 : arg;
                        // A full 16-lane store spills past this group's K lanes into outputs this
                        // thread writes later; only near the end of its block must it stop at K.
                        if (at + c * K + L <= end) {
                            store(y + at + c * K, out);
                            if (idx) store(idx + at + c * K, code);
                        } else {
                            store(tail, out);
                            store(itail, code);
                            for (int64_t k = 0; k < K; ++k) {
                                y[at + c * K + k] = tail[k];
                                if (idx) idx[at + c * K + k] = itail[k];
                            }
                        }
                    }
                }
        }
    });
}

// The same function as forward(), vectorised over pooled columns instead of output channels (used
// where no codes are recorded: inference; with codes the transposition of two tiles costs more
// than the lanes gain, 1.1 vs 0.86 ms for 20 copies x 32 samples, 2 threads): per
// input row pair the 16 vectors X[r][c] (rows 2i+r of the padded plane, columns 2j+c for the L
// pooled columns j) are loaded once from the plane's even- and odd-column halves and reused by all
// K channels and four window positions; 14 of 16 lanes work for a 28-pixel row, against K = 10
// of 16 channel lanes in forward() (1,024 samples: 1.1-1.2 against 1.3-1.5 ms). The L x K result tile
// is transposed into the channels-last output. Sums run in the same order as forward()'s (u, v
// row-major), so the results are equal.
template <typename T>
void forward_cols(const T* x, int64_t sxb, int64_t sxc, const T* w, const T* bias, T* y, int64_t B, int64_t C,
                  int64_t H, int64_t W, int64_t K, int threads) {
    typedef typename Lanes<T>::V V;
    typedef typename Lanes<T>::I I;
    const int64_t Ho = H / 2, Wo = W / 2, CK = C * K;
    const int64_t EW = (Wo + 1 + L + L - 1) / L * L;  // half-row width: every vector load stays inside
    const int64_t block = 16;
    parallel((B + block - 1) / block, threads, [=](int64_t task) {
        std::vector<T> even((H + 2) * EW, T(0)), odd((H + 2) * EW, T(0)), tile(K * L);
        for (int64_t b = task * block; b < std::min(B, (task + 1) * block); ++b)
            for (int64_t c = 0; c < C; ++c) {
                // Padded column 2s is input column 2s - 1 (even half), 2s + 1 is input column 2s (odd).
                const T* src = x + b * sxb + c * sxc;
                for (int64_t r = 0; r < H; ++r) {
                    T* e = even.data() + (r + 1) * EW;
                    T* o = odd.data() + (r + 1) * EW;
                    const T* row = src + r * W;
                    for (int64_t s2 = 0; s2 < Wo; ++s2) {
                        e[s2 + 1] = row[2 * s2 + 1];
                        o[s2] = row[2 * s2];
                    }
                }
                const T* wc = w + c * K * 9;
                const T* bc = bias ? bias + c * K : nullptr;
                for (int64_t i = 0; i < Ho; ++i)
                    for (int64_t j0 = 0; j0 < Wo; j0 += L) {
                        const int64_t n = std::min<int64_t>(L, Wo - j0);
                        V X[4][4];
                        for (int r = 0; r < 4; ++r) {
                            const int64_t at = (2 * i + r) * EW + j0;
                            X[r][0] = load<V>(even.data() + at);
                            X[r][1] = load<V>(odd.data() + at);
                            X[r][2] = load<V>(even.data() + at + 1);
                            X[r][3] = load<V>(odd.data() + at + 1);
                        }
                        for (int64_t k = 0; k < K; ++k) {
                            const T* wk = wc + k * 9;
                            V a0 = {}, a1 = {}, a2 = {}, a3 = {};
                            for (int u = 0; u < 3; ++u)
                                for (int v = 0; v < 3; ++v) {
                                    const T wt = wk[3 * u + v];
                                    a0 += wt * X[u][v];
                                    a1 += wt * X[u][v + 1];
                                    a2 += wt * X[u + 1][v];
                                    a3 += wt * X[u + 1][v + 1];
                                }
                            V m = a0;  // NaN wins, as in forward()
                            I up = (a1 > m) | (a1 != a1);
                            m = up ? a1 : m;
                            up = (a2 > m) | (a2 != a2);
                            m = up ? a2 : m;
                            up = (a3 > m) | (a3 != a3);
                            m = up ? a3 : m;
                            const V val = m + (bc ? bc[k] : T(0));
                            store(tile.data() + k * L, val <= V{} ? V{} : val);
                        }
                        for (int64_t jj = 0; jj < n; ++jj) {
                            const int64_t at = ((b * Ho + i) * Wo + j0 + jj) * CK + c * K;
                            for (int64_t k = 0; k < K; ++k) y[at + k] = tile[k * L + jj];
                        }
                    }
            }
    });
}

// Gradients of sum(g * y): for every pooled position the gradient goes to the window position
// idx names (none where idx == -1). Each task sums a block of samples for all groups; the
// blocks are then added in order, so the result does not depend on the thread count.
template <typename T>
void backward(const T* x, int64_t sxb, int64_t sxc, const T* g, const typename Lanes<T>::Code* idx, T* gw, T* gb,
              int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int threads) {
    typedef typename Lanes<T>::V V;
    typedef typename Lanes<T>::I I;
    typedef typename Lanes<T>::Code Code;
    const int64_t Ho = H / 2, Wo = W / 2, P = W + 2, CK = C * K, plane = (H + 2) * P;
    const int64_t block = 16, blocks = (B + block - 1) / block, total = B * Ho * Wo * CK;
    I lane = {};
    for (int k = 0; k < L; ++k) lane[k] = k < K ? -1 : 0;
    std::vector<V> part(blocks * C * 10);  // per (block, group): 9 tap vectors, then the bias vector
    V* const pp = part.data();
    parallel(blocks, threads, [=](int64_t blk) {
        std::vector<T> pad(C * plane, T(0));
        T gl[L];
        Code il[L];
        V* acc = pp + blk * C * 10;
        for (int64_t b = blk * block; b < std::min(B, (blk + 1) * block); ++b) {
            pad_planes(x, sxb, sxc, b, 0, C, H, W, pad.data());
            for (int64_t i = 0; i < Ho; ++i)
                for (int64_t j = 0; j < Wo; ++j)
                    for (int64_t c = 0; c < C; ++c) {
                        const int64_t at = ((b * Ho + i) * Wo + j) * CK + c * K;
                        V gv;
                        I id;
                        if (at + L <= total) {  // lanes >= K belong to other outputs: masked by `lane`
                            gv = load<V>(g + at);
                            id = load<I>(idx + at);
                        } else {
                            for (int64_t k = 0; k < L; ++k) {
                                gl[k] = k < K ? g[at + k] : T(0);
                                il[k] = k < K ? idx[at + k] : Code(-1);
                            }
                            gv = load<V>(gl);
                            id = load<I>(il);
                        }
                        id = lane ? id : I{} - 1;
                        const V g0 = id == 0 ? gv : V{}, g1 = id == 1 ? gv : V{};
                        const V g2 = id == 2 ? gv : V{}, g3 = id == 3 ? gv : V{};
                        const T* p = pad.data() + c * plane + 2 * i * P + 2 * j;
                        V* a = acc + c * 10;
                        for (int u = 0; u < 3; ++u)
                            for (int v = 0; v < 3; ++v)
                                a[3 * u + v] += g0 * p[u * P + v] + g1 * p[u * P + v + 1] +
                                                g2 * p[(u + 1) * P + v] + g3 * p[(u + 1) * P + v + 1];
                        a[9] += (g0 + g1) + (g2 + g3);
                    }
        }
    });
    for (int64_t c = 0; c < C; ++c) {
        V acc[10] = {};
        for (int64_t blk = 0; blk < blocks; ++blk)
            for (int t = 0; t < 10; ++t) acc[t] += part[(blk * C + c) * 10 + t];
        for (int64_t k = 0; k < K; ++k) {
            for (int t = 0; t < 9; ++t) gw[(c * K + k) * 9 + t] = acc[t][k];
            if (gb) gb[c * K + k] = acc[9][k];
        }
    }
}


}  // namespace
}  // namespace fedhv

using namespace fedhv;

extern "C" {

void fedhv_conv1_forward_f32(const float* x, int64_t sxb, int64_t sxc, const float* w, const float* bias, float* y,
                             int32_t* idx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int threads) {
    if (idx) forward(x, sxb, sxc, w, bias, y, idx, B, C, H, W, K, threads);
    else forward_cols(x, sxb, sxc, w, bias, y, B, C, H, W, K, threads);
}

void fedhv_conv1_forward_f64(const double* x, int64_t sxb, int64_t sxc, const double* w, const double* bias,
                             double* y, int64_t* idx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K,
                             int threads) {
    if (idx) forward(x, sxb, sxc, w, bias, y, idx, B, C, H, W, K, threads);
    else forward_cols(x, sxb, sxc, w, bias, y, B, C, H, W, K, threads);
}

void fedhv_conv1_backward_f32(const float* x, int64_t sxb, int64_t sxc, const float* g, const int32_t* idx, float* gw,
                              float* gb, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int threads) {
    backward(x, sxb, sxc, g, idx, gw, gb, B, C, H, W, K, threads);
}

void fedhv_conv1_backward_f64(const double* x, int64_t sxb, int64_t sxc, const double* g, const int64_t* idx,
                              double* gw, double* gb, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K,
                              int threads) {
    backward(x, sxb, sxc, g, idx, gw, gb, B, C, H, W, K, threads);
}

}  // extern "C"
