// fedhv's compiled kernels (fedhv/models/native/__init__.py explains the maths and the calling
// conventions; this file is compiled at first use and loaded with ctypes).
//
// 1. conv1: fused single-input-channel 3x3 convolution (padding 1) + 2x2 max-pool + bias + ReLU,
//    per group (LeNet's first layer). Shapes (all row-major):
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
// 2. pool: 2x2 max-pool + bias + ReLU of a channels-last map, written per group and flattened
//    (the layout the per-copy linear layer reads):
//   h    : [B, H, W, G*K]  channels last;  bias : [G*K]
//   out  : [G, B, K, H/2, W/2]  out = relu(max_window h + bias);  idx : [B, H/2, W/2, G*K] codes as above
//   gh   : [B, H, W, G*K]  gradient of sum(g * out), every element written (no zero-fill needed)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int L = 16;
typedef float vf __attribute__((vector_size(L * sizeof(float))));
typedef double vd __attribute__((vector_size(L * sizeof(double))));
typedef int32_t vi32 __attribute__((vector_size(L * sizeof(int32_t))));
typedef int64_t vi64 __attribute__((vector_size(L * sizeof(int64_t))));

template <typename T> struct Lanes;
template <> struct Lanes<float> { typedef vf V; typedef vi32 I; typedef int32_t Code; };
template <> struct Lanes<double> { typedef vd V; typedef vi64 I; typedef int64_t Code; };

template <typename V, typename T> inline V load(const T* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
template <typename V, typename T> inline void store(T* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

// Runs f(t) for t in [0, n) on up to `threads` threads. With OpenMP (the default build) these are
// the threads of the process's OpenMP runtime, which is PyTorch's own: the library is loaded after
// torch, so its libgomp.so.1 dependency resolves to the copy torch already loaded, and no second
// pool of threads competes with torch's (spinning) workers for the cores.
template <typename F> void parallel(int64_t n, int threads, const F& f) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (n > 1 && threads > 1)
    for (int64_t t = 0; t < n; ++t) f(t);
#else
    const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(threads, n));
    std::vector<std::thread> pool;
    for (int64_t r = 1; r < workers; ++r)
        pool.emplace_back([=, &f] { for (int64_t t = r; t < n; t += workers) f(t); });
    for (int64_t t = 0; t < n; t += workers) f(t);
    for (auto& th : pool) th.join();
#endif
}

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


// The n <= L values at p as a vector, lanes >= n set to `fill`. `safe`: all L lanes lie inside
// the tensor, so one full load is made and `keep` (lanes < n all ones) selects in registers.
template <typename V, typename I, typename T>
inline V load_n(const T* p, int64_t n, const V& fill, const I& keep, bool safe) {
    if (n == L) return load<V>(p);
    if (safe) return keep ? load<V>(p) : fill;
    T tmp[L];
    store(tmp, fill);
    for (int64_t l = 0; l < n; ++l) tmp[l] = p[l];
    return load<V>(tmp);
}

// Writes lanes < n of v to p. `safe`: the L lanes at p lie in memory only this thread writes
// (and nothing writes between the read and the write here), so lanes >= n are written back unchanged.
template <typename V, typename I, typename T>
inline void store_n(T* p, const V& v, int64_t n, const I& keep, bool safe) {
    if (n == L) return store(p, v);
    if (safe) return store(p, keep ? v : load<V>(p));
    T tmp[L];
    store(tmp, v);
    for (int64_t l = 0; l < n; ++l) p[l] = tmp[l];
}

// Lanes < n all ones.
template <typename I> inline I first_lanes(int64_t n) {
    I m = {};
    for (int l = 0; l < L; ++l) m[l] = l < n ? -1 : 0;
    return m;
}

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

extern "C" {

int fedhv_conv1_lanes() { return L; }

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
