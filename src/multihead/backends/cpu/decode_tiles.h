// The decode kernel's tiles (decode_kernel.cpp), written once on the vector layer of decode_simd.h
// (W lanes: 16 on AVX-512, 8 on AVX2, 4 on the portable path):
//   score tiles   RN query rows x KN keys (RN * KN = W) summed into one vector by a transposing tree:
//                 columns first (dot_tile) or each key row whole, in order (dot_tile_rows)
//   value rows    acc[r] += p[r][j] V[j] for RN rows, CV vectors of columns at a time, or one row
//                 reading each value row whole, in order (accumulate_in_order)
//   softmax       the masked max and exp of a row's block of scores
// and, on AVX-512 only, the D = 128 fp32 tile that holds two query rows in registers and the
// `vdpbf16ps` tiles (AVX512-BF16). Keys and values come through decode_simd's load_pair, load_step and
// load_w, one overload per element type: a quantized cache's element type slots in there (int8 or fp8
// widened to fp32), and its per token and head scale folds into each key's score and each value's
// weight, one multiply per key rather than per element.
#pragma once
#include <cstdint>
#include <type_traits>

#include "decode_simd.h"

namespace decode_tiles {

using decode_simd::vec;
using decode_simd::W;

// Whether the score tiles take head dim D for key type T (whole vectors of fp32, pairs of them for bf16).
template <typename T>
constexpr bool tiled(int64_t D) { return std::is_same<T, float>::value ? D % W == 0 : D % (2 * W) == 0; }

// a[r * KN + u] += dot(q row r, key u) over D: fp32 keys, q fp32 (rows qs apart), W columns a step.
template <int RN, int KN>
ALWAYS_INLINE void dot_tile(const float* q, int64_t qs, const float* K, int64_t ks, int64_t D, vec* a) {
  for (int64_t c = 0; c < D; c += W) {
    vec x[RN];
    for (int r = 0; r < RN; ++r) x[r] = decode_simd::load(q + r * qs + c);
    for (int u = 0; u < KN; ++u) {
      const vec k = decode_simd::load(K + u * ks + c);
      for (int r = 0; r < RN; ++r) a[r * KN + u] = decode_simd::fmadd(x[r], k, a[r * KN + u]);
    }
  }
}

// The same for bfloat16 keys (or a quantized cache's codes, decode_quant.h) and an fp32 query whose
// every 2W columns are stored as their W even columns, then their W odd ones: a key's 2W words widen
// with one shift (even) and one mask (odd), and the dot product does not depend on the order of the columns.
template <int RN, int KN, typename T>
ALWAYS_INLINE void dot_tile(const float* q, int64_t qs, const T* K, int64_t ks, int64_t D, vec* a) {
  for (int64_t c = 0; c < D; c += 2 * W) {
    vec xe[RN], xo[RN];
    for (int r = 0; r < RN; ++r) {
      xe[r] = decode_simd::load(q + r * qs + c);
      xo[r] = decode_simd::load(q + r * qs + c + W);
    }
    for (int u = 0; u < KN; ++u) {
      vec k[2];
      decode_simd::load_pair(K + u * ks + c, k);
      for (int r = 0; r < RN; ++r) {
        a[r * KN + u] = decode_simd::fmadd(xe[r], k[0], a[r * KN + u]);
        a[r * KN + u] = decode_simd::fmadd(xo[r], k[1], a[r * KN + u]);
      }
    }
  }
}

// The tile reading each key row whole before the next (in the order memory streams them): one key at
// a time against RN rows, CH = 8 / RN chains of sums per row (the FMA's latency needs about eight).
// fp32 keys take steps of W columns; bf16 keys steps of 2W (a pair: even, then odd columns, with the
// query stored in that order, as for dot_tile).
template <int RN, int KN, typename T>
ALWAYS_INLINE void dot_tile_rows(const float* q, int64_t qs, const T* K, int64_t ks, int64_t D, vec* a) {
  constexpr int CH = RN >= 4 ? 2 : 8 / RN;
  constexpr int64_t step = std::is_same<T, float>::value ? W : 2 * W;  // columns a load gives
  constexpr int per = std::is_same<T, float>::value ? 1 : 2;  // vectors a load gives
  for (int u = 0; u < KN; ++u) {
    const T* k = K + u * ks;
    vec s[RN][CH];
    for (int r = 0; r < RN; ++r)
      for (int h = 0; h < CH; ++h) s[r][h] = decode_simd::zero();
    int64_t c = 0;
    for (; c + CH / per * step <= D; c += CH / per * step)
      for (int h = 0; h < CH; h += per) {
        vec kc[2];
        decode_simd::load_step(k + c + h / per * step, kc);
        for (int r = 0; r < RN; ++r)
          for (int t = 0; t < per; ++t)
            s[r][h + t] = decode_simd::fmadd(decode_simd::load(q + r * qs + c + h / per * step + t * W), kc[t], s[r][h + t]);
      }
    for (; c < D; c += step) {
      vec kc[2];
      decode_simd::load_step(k + c, kc);
      for (int r = 0; r < RN; ++r)
        for (int t = 0; t < per; ++t)
          s[r][t] = decode_simd::fmadd(decode_simd::load(q + r * qs + c + t * W), kc[t], s[r][t]);
    }
    for (int r = 0; r < RN; ++r) {
      for (int h = 1; h < CH; ++h) s[r][0] = decode_simd::add(s[r][0], s[r][h]);
      a[r * KN + u] = s[r][0];
    }
  }
}

// Stores the tile's W sums (lane r * KN + u: row r, key u), times scale, at s[r * stride + u].
template <int RN, int KN>
ALWAYS_INLINE void store_tile(const vec* a, float scale, float* s, int64_t stride) {
  decode_simd::store_tile_lanes<RN, KN>(decode_simd::mul(decode_simd::sum_lanes(a), decode_simd::set1(scale)), s,
                                        stride);
}

// acc[r][c] += sum_j p[r][j] * V[j][c] for RN rows, W * CV columns at a time: each value is loaded
// (and widened) once for all RN rows. Needs Dv % (W * CV) == 0 and CV even. p: rows `ps` apart; acc:
// rows Dv apart, for bf16 values with each 2W columns in the order of load_pair (even, then odd).
template <int RN, int CV, typename T>
ALWAYS_INLINE void accumulate_rows(const float* p, int64_t ps, const T* V, int64_t vs, int64_t n, int64_t Dv,
                                   float* acc) {
  for (int64_t c0 = 0; c0 < Dv; c0 += W * CV) {
    vec a[RN][CV];
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < CV; ++u) a[r][u] = decode_simd::load(acc + r * Dv + c0 + W * u);
    for (int64_t j = 0; j < n; ++j) {
      vec v[CV];
      for (int u = 0; u < CV; u += 2) decode_simd::load_pair(V + j * vs + c0 + W * u, v + u);
      for (int r = 0; r < RN; ++r) {
        const vec pj = decode_simd::set1(p[r * ps + j]);
        for (int u = 0; u < CV; ++u) a[r][u] = decode_simd::fmadd(pj, v[u], a[r][u]);
      }
    }
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < CV; ++u) decode_simd::store(acc + r * Dv + c0 + W * u, a[r][u]);
  }
}

// acc[c] += sum_j p[j] * V[j][c] for one row, reading each value row whole before the next (in the
// order memory streams them), the sums in memory (acc: 2W columns at a time in load_pair's order).
// Needs Dv % (2W) == 0.
template <typename T>
ALWAYS_INLINE void accumulate_in_order(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  for (int64_t j = 0; j < n; ++j) {
    const vec pj = decode_simd::set1(p[j]);
    for (int64_t c = 0; c < Dv; c += 2 * W) {
      vec v[2];
      decode_simd::load_pair(V + j * vs + c, v);
      decode_simd::store(acc + c, decode_simd::fmadd(pj, v[0], decode_simd::load(acc + c)));
      decode_simd::store(acc + c + W, decode_simd::fmadd(pj, v[1], decode_simd::load(acc + c + W)));
    }
  }
}

// The largest of m and the scores s[j], lo <= j < hi (0 <= lo <= hi <= the block's length); NaN
// scores are passed over (they reach the output through their weights).
ALWAYS_INLINE float block_max(const float* s, int64_t lo, int64_t hi, float m) {
  vec mv = decode_simd::set1(m);
  for (int64_t t = lo / W * W; t < hi; t += W)
    mv = decode_simd::max_where(decode_simd::kept(t, lo, hi), decode_simd::load(s + t), mv);
  return decode_simd::reduce_max(mv);
}

// s[j] = exp(s[j] - m) for lo <= j < hi, 0 for the other j < n; returns their sum. s holds room for
// n rounded up to W.
ALWAYS_INLINE float block_exp(float* s, int64_t n, int64_t lo, int64_t hi, float m) {
  vec sum = decode_simd::zero();
  const vec mv = decode_simd::set1(m);
  for (int64_t t = 0; t < n; t += W) {
    const vec e = decode_simd::exp_nonpositive(decode_simd::sub(decode_simd::load(s + t), mv));
    const vec p = decode_simd::zero_unless(decode_simd::kept(t, lo, hi), e);
    decode_simd::store(s + t, p);
    sum = decode_simd::add(sum, p);
  }
  return decode_simd::reduce_add(sum);
}

#if defined(__AVX512F__)
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
#endif

#if defined(__AVX512BF16__)
// bfloat16 keys and a query whose values are bfloat16 (qb: its bf16 words, rows qs apart):
// `vdpbf16ps` multiplies pairs of bf16 exactly and adds them in fp32, 32 columns an instruction.
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

// The same reading each key row whole before the next: one key at a time against RN rows, CH = 8 / RN
// chains per row (RN < 4).
template <int RN, int KN>
ALWAYS_INLINE void dot_tile_bf16_rows(const uint16_t* qb, int64_t qs, const uint16_t* K, int64_t ks, int64_t D,
                                      __m512* a) {
  constexpr int CH = 8 / RN;
  for (int u = 0; u < KN; ++u) {
    const uint16_t* k = K + u * ks;
    __m512 s[RN][CH];
    for (int r = 0; r < RN; ++r)
      for (int h = 0; h < CH; ++h) s[r][h] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 * CH <= D; c += 32 * CH)
      for (int h = 0; h < CH; ++h) {
        const __m512bh kc = (__m512bh)_mm512_loadu_si512(k + c + 32 * h);
        for (int r = 0; r < RN; ++r)
          s[r][h] = _mm512_dpbf16_ps(s[r][h], (__m512bh)_mm512_loadu_si512(qb + r * qs + c + 32 * h), kc);
      }
    for (int h = 0; c < D; c += 32, h = (h + 1) % CH) {
      const __m512bh kc = (__m512bh)_mm512_loadu_si512(k + c);
      for (int r = 0; r < RN; ++r) s[r][h] = _mm512_dpbf16_ps(s[r][h], (__m512bh)_mm512_loadu_si512(qb + r * qs + c), kc);
    }
    for (int r = 0; r < RN; ++r) {
      for (int h = 1; h < CH; ++h) s[r][0] = _mm512_add_ps(s[r][0], s[r][h]);
      a[r * KN + u] = s[r][0];
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

}  // namespace decode_tiles
