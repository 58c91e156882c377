// The absorbed MLA decode step's two per-head products, for bfloat16 weights, summed in float32:
//   fold   y[h, m, n] = sum_k x[h, m, k] W[h, k, n]   W (H, K, N): the query (Dn) times W_UK (Dn, C) -> (C)
//   unfold y[h, m, n] = sum_k W[h, n, k] x[h, m, k]   W (H, N, K): W_UV (Dv, C) times the output (C) -> (Dv)
// x (H, M, K) float32 and W contiguous; y (H, M, N) float32; M is a few rows (a decode step).
// Each weight is read once, in order, with the next rows prefetched: torch's bfloat16 bmm runs these
// matrix-vector shapes far below the memory's read rate on the CPU. Written on the vector layer of
// decode_simd.h (AVX-512, AVX2 or portable). Included by decode_kernel.cpp (one build).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "decode_simd.h"

namespace latent_products {

using decode_simd::vec;
using decode_simd::W;

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// fold for one head and one row: y (N) = x (K) @ W (K, N), rows of W streamed in order, up to
// kFoldVecs vectors of columns of sums in registers (all but a few of the registers).
constexpr int kFoldVecs = W == 16 ? 16 : 12;
inline void fold_row(const uint16_t* Wt, const float* x, float* y, int64_t K, int64_t N) {
  constexpr int64_t kAhead = 8;  // rows prefetched ahead
  int64_t c0 = 0;
  while (c0 + W <= N) {
    const int64_t units = std::min<int64_t>(kFoldVecs, (N - c0) / W);
    vec a[kFoldVecs];
    for (int u = 0; u < kFoldVecs; ++u) a[u] = decode_simd::zero();
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t* row = Wt + k * N + c0;
      if (k + kAhead < K) prefetch_bytes(row + kAhead * N, units * W * 2);
      const vec xk = decode_simd::set1(x[k]);
      for (int u = 0; u < kFoldVecs; ++u)
        if (u < units) a[u] = decode_simd::fmadd(xk, decode_simd::widen(row + W * u), a[u]);
    }
    for (int u = 0; u < units; ++u) decode_simd::store(y + c0 + W * u, a[u]);
    c0 += units * W;
  }
  for (int64_t c = c0; c < N; ++c) {
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += x[k] * bf16_to_float(Wt[k * N + c]);
    y[c] = s;
  }
}

// unfold for one head and one row: y (N) = W (N, K) @ x (K), eight rows of W at a time.
inline void unfold_row(const uint16_t* Wt, const float* x, float* y, int64_t K, int64_t N) {
  int64_t n0 = 0;
  if (K % W == 0) {
    for (; n0 + 8 <= N; n0 += 8) {
      if (n0 + 16 <= N) prefetch_bytes(Wt + (n0 + 8) * K, 8 * K * 2);
      vec a[8];
      for (int r = 0; r < 8; ++r) a[r] = decode_simd::zero();
      for (int64_t k = 0; k < K; k += W) {
        const vec xk = decode_simd::load(x + k);
        for (int r = 0; r < 8; ++r) a[r] = decode_simd::fmadd(decode_simd::widen(Wt + (n0 + r) * K + k), xk, a[r]);
      }
      for (int r = 0; r < 8; ++r) y[n0 + r] = decode_simd::reduce_add(a[r]);
    }
  }
  for (int64_t n = n0; n < N; ++n) {
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += bf16_to_float(Wt[n * K + k]) * x[k];
    y[n] = s;
  }
}

// y (H, M, N) = x (H, M, K) @ W (H, K, N) per head (fold) or W (H, N, K) @ x (unfold); all contiguous.
inline void products(const uint16_t* w, const float* x, float* y, int64_t H, int64_t M, int64_t K, int64_t N,
                     bool fold) {
  at::parallel_for(0, H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = x + (h * M + m) * K;
        float* yr = y + (h * M + m) * N;
        if (fold) {
          fold_row(w + h * K * N, xr, yr, K, N);
        } else {
          unfold_row(w + h * N * K, xr, yr, K, N);
        }
      }
    }
  });
}

}  // namespace latent_products
