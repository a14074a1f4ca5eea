// Shared pieces of fedhv's compiled kernels (fedhv/models/native/__init__.py explains the maths
// and the calling conventions; the .cpp files are compiled at first use and loaded with ctypes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace fedhv {


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

}  // namespace fedhv
