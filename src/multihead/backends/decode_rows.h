// The row-by-row loops of the decode kernel (decode_kernel.cpp): one query row's scores against a run
// of keys and its weighted sum of values, in plain C++ that gcc vectorises (the path without AVX-512,
// odd head dims, and the keys past the last whole tile), with AVX-512 loops where the CPU has them.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace decode_rows {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {  // bfloat16 bits -> float32: the top half of the word
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0 (or NaN, which stays NaN), to about 1 ulp; written so that gcc vectorises it.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // 16 bfloat16 -> 16 float32
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

// sr[j] = scale * dot(qr, K[j]) for j < n (K rows `ks` elements apart), widening K on the fly.
template <typename T>
inline void scores(const float* qr, const T* K, int64_t ks, int64_t n, int64_t D, float scale, float* sr) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    for (; j + 8 <= n; j += 8) {  // eight keys: eight independent chains of FMAs
      __m512 a[8];
      for (int u = 0; u < 8; ++u) a[u] = _mm512_setzero_ps();
      for (int64_t c = 0; c < D; c += 16) {
        const __m512 x = _mm512_loadu_ps(qr + c);
        for (int u = 0; u < 8; ++u) a[u] = _mm512_fmadd_ps(x, load16(K + (j + u) * ks + c), a[u]);
      }
      for (int u = 0; u < 8; ++u) sr[j + u] = _mm512_reduce_add_ps(a[u]) * scale;
    }
  }
#endif
  for (; j < n; ++j) {
    const T* k = K + j * ks;
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int64_t c = 0; c < D; ++c) d += qr[c] * widen(k[c]);
    sr[j] = d * scale;
  }
}

// acc[c] += sum_j p[j] * V[j][c] (V rows `vs` elements apart): columns held in registers across the
// block's keys. A weight of 0 (a key this row does not keep) still multiplies its value, as in p @ V.
template <typename T>
inline void accumulate(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  int64_t c0 = 0;
#if defined(__AVX512F__)
  for (; c0 + 128 <= Dv; c0 += 128) {  // eight registers of sums, eight independent chains
    __m512 s[8];
    for (int u = 0; u < 8; ++u) s[u] = _mm512_loadu_ps(acc + c0 + 16 * u);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const T* v = V + j * vs + c0;
      for (int u = 0; u < 8; ++u) s[u] = _mm512_fmadd_ps(pj, load16(v + 16 * u), s[u]);
    }
    for (int u = 0; u < 8; ++u) _mm512_storeu_ps(acc + c0 + 16 * u, s[u]);
  }
  for (; c0 + 16 <= Dv; c0 += 16) {
    __m512 s0 = _mm512_loadu_ps(acc + c0);
    for (int64_t j = 0; j < n; ++j) s0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), load16(V + j * vs + c0), s0);
    _mm512_storeu_ps(acc + c0, s0);
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const T* v = V + j * vs;
#pragma omp simd
    for (int64_t c = c0; c < Dv; ++c) acc[c] += p[j] * widen(v[c]);
  }
}

}  // namespace decode_rows
