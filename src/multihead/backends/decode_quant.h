// The decode kernel's quantized element types (a KV cache of int8 or fp8 e4m3 codes, each token and kv
// head with its own fp32 scale): loads that widen W or 2W codes to fp32 in registers, in the forms the
// tiles read (decode_simd.h's load_pair, load_step, load_w and the scalar widen). The scale is not
// applied here: it folds into each key's score and each value's weight (fold_scales), one multiply per
// key instead of one per element.
//   i8    int8 codes, value = code * scale (symmetric: absmax / 127 per token and head)
//   e4m3  float8 e4m3fn codes (1 sign, 4 exponent bits with bias 7, 3 mantissa bits), value = code * scale
// Widening e4m3 is bit arithmetic, the same on every path: the 7 bits below the sign go to fp32's bits
// 20..26 and the sign to bit 31; as an fp32 that is the code's value times 2^-120 (subnormal codes
// included), so one multiply by 2^120 finishes it. The NaN code (0x7F, 0xFF) comes out as 480 (the
// quantizer never writes it: a NaN token's scale is NaN, which reaches the output through the fold).
// Pairs (load_pair) give 2W codes as their even columns, then their odd ones, as for bfloat16.
#pragma once
#include <cstdint>
#include <cstring>

namespace decode_simd {

enum class i8 : int8_t {};    // an int8 code of a quantized cache
enum class e4m3 : uint8_t {};  // a float8 e4m3fn code of a quantized cache

constexpr float kE4m3Unit = 1.329227995784916e36f;  // 2^120: fp32 bits of (code & 0x7F) << 20, times this

inline float widen(i8 x) { return static_cast<float>(static_cast<int8_t>(x)); }
inline float widen(e4m3 x) {
  const uint32_t b = static_cast<uint8_t>(x);
  const uint32_t bits = ((b & 0x7Fu) << 20) | ((b & 0x80u) << 24);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f * kE4m3Unit;
}

#if defined(__AVX512F__)
// Lane i: the 16-bit word i of p (2W bytes), sign-extended (codes 2i and 2i+1: low and high byte).
ALWAYS_INLINE __m512i words(const void* p, bool sign) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return sign ? _mm512_cvtepi16_epi32(raw) : _mm512_cvtepu16_epi32(raw);
}
ALWAYS_INLINE vec to_float(__m512i x) { return _mm512_cvtepi32_ps(x); }
ALWAYS_INLINE vec as_float(__m512i x) { return _mm512_castsi512_ps(x); }
ALWAYS_INLINE __m512i shl(__m512i x, int n) { return _mm512_sll_epi32(x, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE __m512i sra(__m512i x, int n) { return _mm512_sra_epi32(x, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE __m512i bits(__m512i x, uint32_t m) { return _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(m))); }
ALWAYS_INLINE __m512i either(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
ALWAYS_INLINE __m512i codes_i8(const i8* p) {  // W codes in order, sign-extended
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
ALWAYS_INLINE __m512i codes_u8(const e4m3* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
using ivec_q = __m512i;
#elif defined(__AVX2__) && defined(__FMA__)
ALWAYS_INLINE __m256i words(const void* p, bool sign) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return sign ? _mm256_cvtepi16_epi32(raw) : _mm256_cvtepu16_epi32(raw);
}
ALWAYS_INLINE vec to_float(__m256i x) { return _mm256_cvtepi32_ps(x); }
ALWAYS_INLINE vec as_float(__m256i x) { return _mm256_castsi256_ps(x); }
ALWAYS_INLINE __m256i shl(__m256i x, int n) { return _mm256_sll_epi32(x, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE __m256i sra(__m256i x, int n) { return _mm256_sra_epi32(x, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE __m256i bits(__m256i x, uint32_t m) { return _mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(m))); }
ALWAYS_INLINE __m256i either(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
ALWAYS_INLINE __m256i codes_i8(const i8* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
ALWAYS_INLINE __m256i codes_u8(const e4m3* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
using ivec_q = __m256i;
#else
typedef int16_t wvec __attribute__((vector_size(8)));
typedef uint16_t uwvec __attribute__((vector_size(8)));
typedef int8_t bvec __attribute__((vector_size(4)));
typedef uint8_t ubvec __attribute__((vector_size(4)));
ALWAYS_INLINE ivec words(const void* p, bool sign) {
  if (sign) {
    wvec w;
    std::memcpy(&w, p, sizeof w);
    return __builtin_convertvector(w, ivec);
  }
  uwvec w;
  std::memcpy(&w, p, sizeof w);
  return __builtin_convertvector(w, ivec);
}
ALWAYS_INLINE vec to_float(ivec x) { return __builtin_convertvector(x, vec); }
ALWAYS_INLINE vec as_float(ivec x) { return (vec)x; }
ALWAYS_INLINE ivec shl(ivec x, int n) { return (ivec)((uvec)x << n); }
ALWAYS_INLINE ivec sra(ivec x, int n) { return x >> n; }
ALWAYS_INLINE ivec bits(ivec x, uint32_t m) { return x & static_cast<int32_t>(m); }
ALWAYS_INLINE ivec either(ivec a, ivec b) { return a | b; }
ALWAYS_INLINE ivec codes_i8(const i8* p) {
  bvec b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, ivec);
}
ALWAYS_INLINE ivec codes_u8(const e4m3* p) {
  ubvec b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, ivec);
}
using ivec_q = ivec;
#endif

// e4m3 codes sitting in bits 0..7 of each lane (`at` = 0) or bits 8..15 (`at` = 8) -> fp32.
ALWAYS_INLINE vec e4m3_lanes(ivec_q x, int at) {
  const ivec_q magnitude = shl(bits(x, 0x7Fu << at), 20 - at), sign = shl(bits(x, 0x80u << at), 24 - at);
  return mul(as_float(either(magnitude, sign)), set1(kE4m3Unit));
}

// 2W codes -> their even columns (x[0]) and odd columns (x[1]), as load_pair does for bfloat16.
ALWAYS_INLINE void load_pair(const i8* v, vec* x) {
  const ivec_q w = words(v, true);  // (odd << 8 | even), sign-extended from 16 bits
  x[0] = to_float(sra(shl(w, 24), 24));
  x[1] = to_float(sra(w, 8));
}
ALWAYS_INLINE void load_pair(const e4m3* v, vec* x) {
  const ivec_q w = words(v, false);
  x[0] = e4m3_lanes(w, 0);
  x[1] = e4m3_lanes(w, 8);
}
ALWAYS_INLINE void load_step(const i8* v, vec* x) { load_pair(v, x); }
ALWAYS_INLINE void load_step(const e4m3* v, vec* x) { load_pair(v, x); }

// W codes in order.
ALWAYS_INLINE vec load_w(const i8* v) { return to_float(codes_i8(v)); }
ALWAYS_INLINE vec load_w(const e4m3* v) { return e4m3_lanes(codes_u8(v), 0); }

// The scales of a block of n keys: each row's scores times its key's scale (s: R rows `stride`
// apart), or each row's weights times its value's scale.
inline void fold_scales(float* s, int64_t R, int64_t stride, const float* scales, int64_t n) {
  for (int64_t r = 0; r < R; ++r) {
    float* sr = s + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) sr[j] *= scales[j];
  }
}

}  // namespace decode_simd
