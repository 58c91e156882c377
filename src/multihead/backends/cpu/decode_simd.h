// The vector layer of the decode kernel and the MLA products: one small set of operations on a vector
// `vec` of W float32 lanes, so that their tiles (decode_tiles.h) are written once. The preprocessor
// picks the target's form:
//   AVX-512F        W = 16 (__m512), lane masks in mask registers
//   AVX2 + FMA      W = 8 (__m256), lane masks as vectors (x86-64-v3)
//   anything else   W = 4 in the compiler's vector extension: plain arithmetic on 16-byte vectors that
//                   the compiler turns into NEON, SSE2 or scalar code (the portable path)
// bfloat16 words are widened by shifts: a vector's worth of int32 holds 2W words, whose even columns
// are the low halves shifted up 16 and whose odd columns are the high halves with the low bits cleared.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// The tiles keep their accumulators in registers only when inlined into their loops.
#define ALWAYS_INLINE inline __attribute__((always_inline))

namespace decode_simd {

// exp(x) for x <= 0 is computed as 2^n p(r), x = n ln2 + r: these are its constants (about 1 ulp).
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kLowest = -87.0f;  // exp(-87) is the least normal float's order: below, the result is ~0

#if defined(__AVX512F__)
#define DECODE_SIMD_PATH "avx512"
constexpr int W = 16;
using vec = __m512;
using lanes = __mmask16;

ALWAYS_INLINE vec zero() { return _mm512_setzero_ps(); }
ALWAYS_INLINE vec set1(float x) { return _mm512_set1_ps(x); }
ALWAYS_INLINE vec load(const float* p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void store(float* p, vec x) { _mm512_storeu_ps(p, x); }
ALWAYS_INLINE vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
ALWAYS_INLINE vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vec fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vec round_nearest(vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ALWAYS_INLINE vec times_pow2(vec p, vec n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n whole

// W bf16 words -> W fp32, in order.
ALWAYS_INLINE vec widen(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
// 2W bf16 words -> their even columns and their odd columns.
ALWAYS_INLINE void widen_pairs(const uint16_t* p, vec& even, vec& odd) {
  const __m512i raw = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Lane i of the result is the sum of the W lanes of a[i]: a transposing tree of 15 adds and 30 shuffles.
ALWAYS_INLINE vec sum_lanes(const vec* a) {
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
ALWAYS_INLINE float reduce_add(vec x) { return _mm512_reduce_add_ps(x); }
ALWAYS_INLINE float reduce_max(vec x) { return _mm512_reduce_max_ps(x); }

// Lanes t .. t+W-1 of a block that lie in [lo, hi).
ALWAYS_INLINE lanes kept(int64_t t, int64_t lo, int64_t hi) {
  const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(t)),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return _mm512_cmp_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(lo)), _MM_CMPINT_NLT) &
         _mm512_cmp_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(hi)), _MM_CMPINT_LT);
}
// The larger of x and m in the lanes of `keep` (x NaN: m), m in the others.
ALWAYS_INLINE vec max_where(lanes keep, vec x, vec m) { return _mm512_mask_max_ps(m, keep, x, m); }
ALWAYS_INLINE vec zero_unless(lanes keep, vec x) { return _mm512_maskz_mov_ps(keep, x); }
ALWAYS_INLINE vec floor_at(vec x, float lowest) { return _mm512_max_ps(_mm512_set1_ps(lowest), x); }  // NaN: x

// s[r * stride + u] = lane r * KN + u of x, for r < RN, u < KN (the sums of a score tile).
template <int RN, int KN>
ALWAYS_INLINE void store_tile_lanes(vec x, float* s, int64_t stride) {
  const __mmask16 first = static_cast<__mmask16>((1u << KN) - 1);
  for (int r = 0; r < RN; ++r)  // lanes r*KN .. r*KN+KN-1 land at s + r*stride (masked lanes are not touched)
    _mm512_mask_storeu_ps(s + r * (stride - KN), static_cast<__mmask16>(first << (r * KN)), x);
}

#elif defined(__AVX2__) && defined(__FMA__)
#define DECODE_SIMD_PATH "avx2"
constexpr int W = 8;
using vec = __m256;
using lanes = __m256;  // all ones in a kept lane

ALWAYS_INLINE vec zero() { return _mm256_setzero_ps(); }
ALWAYS_INLINE vec set1(float x) { return _mm256_set1_ps(x); }
ALWAYS_INLINE vec load(const float* p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void store(float* p, vec x) { _mm256_storeu_ps(p, x); }
ALWAYS_INLINE vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
ALWAYS_INLINE vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vec fnmadd(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vec round_nearest(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
ALWAYS_INLINE vec times_pow2(vec p, vec n) {  // p 2^n for whole n >= -126 (the exponent field built directly)
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

ALWAYS_INLINE vec widen(const uint16_t* p) {  // vpmovzxwd + vpslld 16
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
ALWAYS_INLINE void widen_pairs(const uint16_t* p, vec& even, vec& odd) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Lane i of the result is the sum of the W lanes of a[i]: a transposing tree of 7 adds and 14 shuffles.
ALWAYS_INLINE vec sum_lanes(const vec* a) {
  __m256 b[4], c[2];
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = a[2i], y = a[2i+1]
    b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 2; ++i)  // per 128-bit lane L: the lane-L sums of a[4i .. 4i+3]
    c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20), _mm256_permute2f128_ps(c[0], c[1], 0x31));
}
ALWAYS_INLINE float reduce_add(vec x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
ALWAYS_INLINE float reduce_max(vec x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

ALWAYS_INLINE lanes kept(int64_t t, int64_t lo, int64_t hi) {
  const __m256i j = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(t)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), j);  // j < lo
  const __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), j);  // j < hi
  return _mm256_castsi256_ps(_mm256_andnot_si256(below, inside));
}
ALWAYS_INLINE vec max_where(lanes keep, vec x, vec m) { return _mm256_blendv_ps(m, _mm256_max_ps(x, m), keep); }
ALWAYS_INLINE vec zero_unless(lanes keep, vec x) { return _mm256_and_ps(keep, x); }
ALWAYS_INLINE vec floor_at(vec x, float lowest) { return _mm256_max_ps(_mm256_set1_ps(lowest), x); }

template <int RN, int KN>
ALWAYS_INLINE void store_tile_lanes(vec x, float* s, int64_t stride) {
  alignas(32) float t[W];
  _mm256_store_ps(t, x);
  for (int r = 0; r < RN; ++r)
    for (int u = 0; u < KN; ++u) s[r * stride + u] = t[r * KN + u];
}

#else
#if defined(__ARM_NEON)
#define DECODE_SIMD_PATH "portable-neon"
#elif defined(__SSE2__)
#define DECODE_SIMD_PATH "portable-sse2"
#else
#define DECODE_SIMD_PATH "portable"
#endif
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 words are split into halves of little-endian int32");
constexpr int W = 4;
typedef float vec __attribute__((vector_size(16)));
typedef int32_t ivec __attribute__((vector_size(16)));
typedef uint32_t uvec __attribute__((vector_size(16)));
typedef uint16_t hvec __attribute__((vector_size(8)));
using lanes = ivec;  // -1 in a kept lane

ALWAYS_INLINE vec zero() { return vec{0.0f, 0.0f, 0.0f, 0.0f}; }
ALWAYS_INLINE vec set1(float x) { return vec{x, x, x, x}; }
ALWAYS_INLINE vec load(const float* p) {
  vec x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
ALWAYS_INLINE void store(float* p, vec x) { std::memcpy(p, &x, sizeof x); }
ALWAYS_INLINE vec add(vec a, vec b) { return a + b; }
ALWAYS_INLINE vec sub(vec a, vec b) { return a - b; }
ALWAYS_INLINE vec mul(vec a, vec b) { return a * b; }
ALWAYS_INLINE vec fmadd(vec a, vec b, vec c) { return a * b + c; }
ALWAYS_INLINE vec fnmadd(vec a, vec b, vec c) { return c - a * b; }
ALWAYS_INLINE vec round_nearest(vec x) { return (x + 12582912.0f) - 12582912.0f; }  // |x| < 2^22: 1.5 * 2^23 trick
ALWAYS_INLINE vec times_pow2(vec p, vec n) {
  return p * (vec)((__builtin_convertvector(n, ivec) + 127) << 23);
}

ALWAYS_INLINE vec widen(const uint16_t* p) {
  hvec h;
  std::memcpy(&h, p, sizeof h);
  return (vec)(__builtin_convertvector(h, uvec) << 16);
}
ALWAYS_INLINE void widen_pairs(const uint16_t* p, vec& even, vec& odd) {
  uvec raw;
  std::memcpy(&raw, p, sizeof raw);
  even = (vec)(raw << 16);
  odd = (vec)(raw & 0xFFFF0000u);
}

ALWAYS_INLINE vec sum_lanes(const vec* a) {
  vec s;
  for (int i = 0; i < W; ++i) s[i] = (a[i][0] + a[i][1]) + (a[i][2] + a[i][3]);
  return s;
}
ALWAYS_INLINE float reduce_add(vec x) { return (x[0] + x[1]) + (x[2] + x[3]); }
ALWAYS_INLINE float reduce_max(vec x) {
  const float a = x[0] > x[1] ? x[0] : x[1], b = x[2] > x[3] ? x[2] : x[3];
  return a > b ? a : b;
}

ALWAYS_INLINE vec select(lanes keep, vec a, vec b) {  // a in the kept lanes, b elsewhere
  return (vec)(((ivec)a & keep) | ((ivec)b & ~keep));
}
ALWAYS_INLINE lanes kept(int64_t t, int64_t lo, int64_t hi) {
  const ivec j = ivec{0, 1, 2, 3} + static_cast<int32_t>(t);
  return (j >= static_cast<int32_t>(lo)) & (j < static_cast<int32_t>(hi));
}
ALWAYS_INLINE vec max_where(lanes keep, vec x, vec m) { return select(keep & (x > m), x, m); }  // NaN: m
ALWAYS_INLINE vec zero_unless(lanes keep, vec x) { return select(keep, x, zero()); }
ALWAYS_INLINE vec floor_at(vec x, float lowest) { return select(x < set1(lowest), set1(lowest), x); }  // NaN: x

template <int RN, int KN>
ALWAYS_INLINE void store_tile_lanes(vec x, float* s, int64_t stride) {
  for (int r = 0; r < RN; ++r)
    for (int u = 0; u < KN; ++u) s[r * stride + u] = x[r * KN + u];
}
#endif

// exp(x) for lanes x <= 0 (NaN stays NaN), to about 1 ulp: decode_rows::exp_nonpositive, W lanes at once.
ALWAYS_INLINE vec exp_nonpositive(vec x) {
  x = floor_at(x, kLowest);
  const vec n = round_nearest(mul(x, set1(kLog2e)));
  vec r = fnmadd(n, set1(kLn2Hi), x);
  r = fnmadd(n, set1(kLn2Lo), r);
  vec p = set1(1.0f / 5040.0f);
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = fmadd(p, r, set1(c));
  return times_pow2(p, n);
}

// 2W values into two vectors: fp32 as they are; bf16 as their even columns, then their odd ones.
ALWAYS_INLINE void load_pair(const float* v, vec* x) {
  x[0] = load(v);
  x[1] = load(v + W);
}
ALWAYS_INLINE void load_pair(const uint16_t* v, vec* x) { widen_pairs(v, x[0], x[1]); }

// The columns one load gives, for the tiles that read a row in order: fp32, W columns into x[0]; bf16,
// 2W columns into x[0] (even columns) and x[1] (odd columns).
ALWAYS_INLINE void load_step(const float* v, vec* x) { x[0] = load(v); }
ALWAYS_INLINE void load_step(const uint16_t* v, vec* x) { widen_pairs(v, x[0], x[1]); }

// W values in order (bf16 widened).
ALWAYS_INLINE vec load_w(const float* v) { return load(v); }
ALWAYS_INLINE vec load_w(const uint16_t* v) { return widen(v); }

}  // namespace decode_simd

#include "decode_quant.h"  // the quantized caches' codes: the same loads for int8 and fp8 e4m3
