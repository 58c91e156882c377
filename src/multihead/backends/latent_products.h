// The absorbed MLA decode step's two per-head products, for bfloat16 weights, summed in float32:
//   fold   y[h, m, n] = sum_k x[h, m, k] W[h, k, n]   W (H, K, N): the query (Dn) times W_UK (Dn, C) -> (C)
//   unfold y[h, m, n] = sum_k W[h, n, k] x[h, m, k]   W (H, N, K): W_UV (Dv, C) times the output (C) -> (Dv)
// x (H, M, K) float32 and W contiguous; y (H, M, N) float32; M is a few rows (a decode step).
// Each weight is read once, in order, with the next rows prefetched: torch's bfloat16 bmm runs these
// matrix-vector shapes far below the memory's read rate on the CPU. Included by decode_kernel.cpp (one build).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace latent_products {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

#if defined(__AVX512F__)
inline __m512 widen16(const uint16_t* p) {  // 16 bfloat16 -> 16 float32
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}
#endif

// fold for one head and one row: y (N) = x (K) @ W (K, N), rows of W streamed in order.
inline void fold_row(const uint16_t* W, const float* x, float* y, int64_t K, int64_t N) {
  int64_t c0 = 0;
#if defined(__AVX512F__)
  constexpr int64_t kAhead = 8;  // rows prefetched ahead
  while (c0 + 16 <= N) {  // up to 256 columns: 16 registers of sums
    const int64_t units = std::min<int64_t>(16, (N - c0) / 16);
    __m512 a[16];
    for (int u = 0; u < 16; ++u) a[u] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t* row = W + k * N + c0;
      if (k + kAhead < K) prefetch_bytes(row + kAhead * N, units * 32);
      const __m512 xk = _mm512_set1_ps(x[k]);
      for (int u = 0; u < 16; ++u)
        if (u < units) a[u] = _mm512_fmadd_ps(xk, widen16(row + 16 * u), a[u]);
    }
    for (int u = 0; u < units; ++u) _mm512_storeu_ps(y + c0 + 16 * u, a[u]);
    c0 += units * 16;
  }
#endif
  for (int64_t c = c0; c < N; ++c) {
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += x[k] * bf16_to_float(W[k * N + c]);
    y[c] = s;
  }
}

// unfold for one head and one row: y (N) = W (N, K) @ x (K), eight rows of W at a time.
inline void unfold_row(const uint16_t* W, const float* x, float* y, int64_t K, int64_t N) {
  int64_t n0 = 0;
#if defined(__AVX512F__)
  if (K % 16 == 0) {
    for (; n0 + 8 <= N; n0 += 8) {
      if (n0 + 16 <= N) prefetch_bytes(W + (n0 + 8) * K, 8 * K * 2);
      __m512 a[8];
      for (int r = 0; r < 8; ++r) a[r] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        const __m512 xk = _mm512_loadu_ps(x + k);
        for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(widen16(W + (n0 + r) * K + k), xk, a[r]);
      }
      for (int r = 0; r < 8; ++r) y[n0 + r] = _mm512_reduce_add_ps(a[r]);
    }
  }
#endif
  for (int64_t n = n0; n < N; ++n) {
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += bf16_to_float(W[n * K + k]) * x[k];
    y[n] = s;
  }
}

// x (H, M, K) float32, W bfloat16 (H, K, N) for fold or (H, N, K) for unfold -> y (H, M, N) float32
inline torch::Tensor products(torch::Tensor W, torch::Tensor x, bool fold) {
  TORCH_CHECK(W.dim() == 3 && x.dim() == 3 && W.size(0) == x.size(0), "W (H, ., .) and x (H, M, K)");
  TORCH_CHECK(W.scalar_type() == at::kBFloat16 && W.is_contiguous(), "W must be contiguous bfloat16");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32");
  const int64_t H = W.size(0), M = x.size(1), K = x.size(2);
  const int64_t N = fold ? W.size(2) : W.size(1);
  TORCH_CHECK((fold ? W.size(1) : W.size(2)) == K, "W and x must share K");
  auto y = torch::empty({H, M, N}, x.options());
  const auto* w = reinterpret_cast<const uint16_t*>(W.data_ptr());
  const float* xs = x.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  at::parallel_for(0, H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t m = 0; m < M; ++m) {
        const float* xr = xs + (h * M + m) * K;
        float* yr = ys + (h * M + m) * N;
        if (fold) {
          fold_row(w + h * K * N, xr, yr, K, N);
        } else {
          unfold_row(w + h * N * K, xr, yr, K, N);
        }
      }
    }
  });
  return y;
}

}  // namespace latent_products
