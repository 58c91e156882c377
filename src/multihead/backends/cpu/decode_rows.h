// The row-by-row loops of the decode kernel (decode_kernel.cpp): one query row's scores against a run
// of keys and its weighted sum of values (odd head dims, the keys past the last whole tile), in whole
// vectors of decode_simd.h where the dims allow and plain C++ for what is left.
#pragma once
#include <cstdint>
#include <cstring>

#include "decode_simd.h"

namespace decode_rows {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {  // bfloat16 bits -> float32: the top half of the word
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0 (or NaN, which stays NaN), to about 1 ulp; written so that gcc vectorises it
// (decode_simd::exp_nonpositive is the same, a vector at a time).
inline float exp_nonpositive(float x) {
  x = x < decode_simd::kLowest ? decode_simd::kLowest : x;
  const float t = x * decode_simd::kLog2e;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const float r = (x - n * decode_simd::kLn2Hi) - n * decode_simd::kLn2Lo;
  float p = 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = p * r + c;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

// sr[j] = scale * dot(qr, K[j]) for j < n (K rows `ks` elements apart), widening K on the fly.
template <typename T>
inline void scores(const float* qr, const T* K, int64_t ks, int64_t n, int64_t D, float scale, float* sr) {
  int64_t j = 0;
  if (D % decode_simd::W == 0) {
    for (; j + 8 <= n; j += 8) {  // eight keys: eight independent chains of FMAs
      decode_simd::vec a[8];
      for (int u = 0; u < 8; ++u) a[u] = decode_simd::zero();
      for (int64_t c = 0; c < D; c += decode_simd::W) {
        const decode_simd::vec x = decode_simd::load(qr + c);
        for (int u = 0; u < 8; ++u) a[u] = decode_simd::fmadd(x, decode_simd::load_w(K + (j + u) * ks + c), a[u]);
      }
      for (int u = 0; u < 8; ++u) sr[j + u] = decode_simd::reduce_add(a[u]) * scale;
    }
  }
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
  constexpr int64_t W = decode_simd::W;
  for (; c0 + 8 * W <= Dv; c0 += 8 * W) {  // eight registers of sums, eight independent chains
    decode_simd::vec s[8];
    for (int u = 0; u < 8; ++u) s[u] = decode_simd::load(acc + c0 + W * u);
    for (int64_t j = 0; j < n; ++j) {
      const decode_simd::vec pj = decode_simd::set1(p[j]);
      const T* v = V + j * vs + c0;
      for (int u = 0; u < 8; ++u) s[u] = decode_simd::fmadd(pj, decode_simd::load_w(v + W * u), s[u]);
    }
    for (int u = 0; u < 8; ++u) decode_simd::store(acc + c0 + W * u, s[u]);
  }
  for (; c0 + W <= Dv; c0 += W) {
    decode_simd::vec s0 = decode_simd::load(acc + c0);
    for (int64_t j = 0; j < n; ++j)
      s0 = decode_simd::fmadd(decode_simd::set1(p[j]), decode_simd::load_w(V + j * vs + c0), s0);
    decode_simd::store(acc + c0, s0);
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* v = V + j * vs;
#pragma omp simd
    for (int64_t c = c0; c < Dv; ++c) acc[c] += p[j] * widen(v[c]);
  }
}

}  // namespace decode_rows
