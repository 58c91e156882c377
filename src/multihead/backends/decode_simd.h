// AVX-512 pieces of the decode kernel (decode_kernel.cpp): score tiles of RN query rows x KN keys
// (RN * KN = 16) summed into one vector, the exp of a vector, and the masked max and exp of a row's
// block of scores. Only compiled where the CPU has AVX-512F; `vdpbf16ps` also needs AVX512-BF16.
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace decode_simd {

// The tiles keep their accumulators in registers only when inlined into their loops.
#define ALWAYS_INLINE inline __attribute__((always_inline))

// Lane i of the result is the sum of the 16 lanes of a[i]: a transposing tree of 15 adds and 30
// shuffles, instead of 16 separate horizontal sums.
ALWAYS_INLINE __m512 sum16(const __m512* a) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = a[2i], y = a[2i+1]
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane L: the lane-L sums of a[4i .. 4i+3]
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 f01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 f23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(f01, f23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(f01, f23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// a[r * KN + u] += dot(q row r, key u) over D: fp32 keys, q fp32 (rows qs apart), 16 columns a step.
template <int RN, int KN>
ALWAYS_INLINE void dot_tile(const float* q, int64_t qs, const float* K, int64_t ks, int64_t D, __m512* a) {
  for (int64_t c = 0; c < D; c += 16) {
    __m512 x[RN];
    for (int r = 0; r < RN; ++r) x[r] = _mm512_loadu_ps(q + r * qs + c);
    for (int u = 0; u < KN; ++u) {
      const __m512 k = _mm512_loadu_ps(K + u * ks + c);
      for (int r = 0; r < RN; ++r) a[r * KN + u] = _mm512_fmadd_ps(x[r], k, a[r * KN + u]);
    }
  }
}

// The fp32 tile of 4 rows x 4 keys for D = 128, reading each key row in order: two query rows at a
// time are held in 16 registers while the four keys' 8 vectors each stream past them (the second
// pair of rows finds the keys in L1).
ALWAYS_INLINE void dot_tile_in_order(const float* q, const float* K, int64_t ks, __m512* a) {
  for (int h = 0; h < 2; ++h) {
    __m512 x0[8], x1[8];
    for (int c = 0; c < 8; ++c) {
      x0[c] = _mm512_loadu_ps(q + (2 * h) * 128 + 16 * c);
      x1[c] = _mm512_loadu_ps(q + (2 * h + 1) * 128 + 16 * c);
    }
    for (int u = 0; u < 4; ++u) {
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      for (int c = 0; c < 8; ++c) {
        const __m512 k = _mm512_loadu_ps(K + u * ks + 16 * c);
        s0 = _mm512_fmadd_ps(x0[c], k, s0);
        s1 = _mm512_fmadd_ps(x1[c], k, s1);
      }
      a[(2 * h) * 4 + u] = s0;
      a[(2 * h + 1) * 4 + u] = s1;
    }
  }
}

// The same for bfloat16 keys and an fp32 query whose every 32 columns are stored as their 16 even
// columns, then their 16 odd ones: a key's 32 bf16 words widen to fp32 with one shift (even columns)
// and one mask (odd columns), and the dot product does not depend on the order of the columns.
template <int RN, int KN>
ALWAYS_INLINE void dot_tile(const float* q, int64_t qs, const uint16_t* K, int64_t ks, int64_t D, __m512* a) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t c = 0; c < D; c += 32) {
    __m512 xe[RN], xo[RN];
    for (int r = 0; r < RN; ++r) {
      xe[r] = _mm512_loadu_ps(q + r * qs + c);
      xo[r] = _mm512_loadu_ps(q + r * qs + c + 16);
    }
    for (int u = 0; u < KN; ++u) {
      const __m512i raw = _mm512_loadu_si512(K + u * ks + c);
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(raw, high));
      for (int r = 0; r < RN; ++r) {
        a[r * KN + u] = _mm512_fmadd_ps(xe[r], even, a[r * KN + u]);
        a[r * KN + u] = _mm512_fmadd_ps(xo[r], odd, a[r * KN + u]);
      }
    }
  }
}

#if defined(__AVX512BF16__)
// The same for bfloat16 keys and a query whose values are bfloat16 (qb: its bf16 words, rows qs
// apart): `vdpbf16ps` multiplies pairs of bf16 exactly and adds them in fp32, 32 columns an instruction.
template <int RN, int KN>
ALWAYS_INLINE void dot_tile_bf16(const uint16_t* qb, int64_t qs, const uint16_t* K, int64_t ks, int64_t D, __m512* a) {
  for (int64_t c = 0; c < D; c += 32) {
    __m512bh x[RN];
    for (int r = 0; r < RN; ++r) x[r] = (__m512bh)_mm512_loadu_si512(qb + r * qs + c);
    for (int u = 0; u < KN; ++u) {
      const __m512bh k = (__m512bh)_mm512_loadu_si512(K + u * ks + c);
      for (int r = 0; r < RN; ++r) a[r * KN + u] = _mm512_dpbf16_ps(a[r * KN + u], x[r], k);
    }
  }
}

// The bf16 tile of 4 rows x 4 keys for D = 128 with a bf16 query, reading each key row in order: the
// four query rows sit in 16 registers while each key's 4 vectors stream past them.
ALWAYS_INLINE void dot_tile_bf16_in_order(const uint16_t* qb, const uint16_t* K, int64_t ks, __m512* a) {
  __m512bh x[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) x[r][c] = (__m512bh)_mm512_loadu_si512(qb + r * 128 + 32 * c);
  for (int u = 0; u < 4; ++u) {
    __m512 s[4];
    for (int r = 0; r < 4; ++r) s[r] = _mm512_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const __m512bh k = (__m512bh)_mm512_loadu_si512(K + u * ks + 32 * c);
      for (int r = 0; r < 4; ++r) s[r] = _mm512_dpbf16_ps(s[r], x[r][c], k);
    }
    for (int r = 0; r < 4; ++r) a[r * 4 + u] = s[r];
  }
}
#endif

// Stores the tile's 16 sums (lane r * KN + u: row r, key u), times scale, at s[r * stride + u].
template <int RN, int KN>
ALWAYS_INLINE void store_tile(const __m512* a, float scale, float* s, int64_t stride) {
  const __m512 v = _mm512_mul_ps(sum16(a), _mm512_set1_ps(scale));
  const __mmask16 first = static_cast<__mmask16>((1u << KN) - 1);
  for (int r = 0; r < RN; ++r)  // lanes r*KN .. r*KN+KN-1 land at s + r*stride (masked lanes are not touched)
    _mm512_mask_storeu_ps(s + r * (stride - KN), static_cast<__mmask16>(first << (r * KN)), v);
}

// 64 values from v into four vectors: fp32 as they are; bf16 as each 32 columns' even columns, then
// their odd ones (one shift or one mask per 16 columns).
ALWAYS_INLINE void load64(const float* v, __m512* x) {
  for (int u = 0; u < 4; ++u) x[u] = _mm512_loadu_ps(v + 16 * u);
}
ALWAYS_INLINE void load64(const uint16_t* v, __m512* x) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int h = 0; h < 2; ++h) {
    const __m512i raw = _mm512_loadu_si512(v + 32 * h);
    x[2 * h] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    x[2 * h + 1] = _mm512_castsi512_ps(_mm512_and_si512(raw, high));
  }
}

// exp(x) for lanes x <= 0 (NaN stays NaN), to about 1 ulp: exp_nonpositive of decode_kernel.cpp.
ALWAYS_INLINE __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);  // NaN in x: max returns x
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Lanes t .. t+15 of a block that lie in [lo, hi).
ALWAYS_INLINE __mmask16 kept_lanes(int64_t t, int64_t lo, int64_t hi) {
  const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(t)),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return _mm512_cmp_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(lo)), _MM_CMPINT_NLT) &
         _mm512_cmp_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(hi)), _MM_CMPINT_LT);
}

// The largest of m and the scores s[j], lo <= j < hi (0 <= lo <= hi <= the block's length); NaN
// scores are passed over (they reach the output through their weights).
ALWAYS_INLINE float block_max(const float* s, int64_t lo, int64_t hi, float m) {
  __m512 mv = _mm512_set1_ps(m);
  for (int64_t t = lo & ~int64_t{15}; t < hi; t += 16)
    mv = _mm512_mask_max_ps(mv, kept_lanes(t, lo, hi), _mm512_loadu_ps(s + t), mv);  // NaN in s: keeps mv
  return _mm512_reduce_max_ps(mv);
}

// s[j] = exp(s[j] - m) for lo <= j < hi, 0 for the other j < n; returns their sum. s holds room for
// n rounded up to 16.
ALWAYS_INLINE float block_exp(float* s, int64_t n, int64_t lo, int64_t hi, float m) {
  __m512 sum = _mm512_setzero_ps();
  const __m512 mv = _mm512_set1_ps(m);
  for (int64_t t = 0; t < n; t += 16) {
    const __m512 p = _mm512_maskz_mov_ps(kept_lanes(t, lo, hi), exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv)));
    _mm512_storeu_ps(s + t, p);
    sum = _mm512_add_ps(sum, p);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace decode_simd
#endif
