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
// Pairs (load_pair) give 2W codes in order, two vectors of W (split_pairs<T>() is false).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Whether load_pair gives a pair of vectors as even, then odd columns (bfloat16) rather than in order
// (fp32, and the codes here): the query rows and the value sums are then kept in that order.
template <typename T>
constexpr bool split_pairs() { return std::is_same<T, uint16_t>::value; }

// W codes from p, each widened to an int32 lane: int8 sign-extended, e4m3 bytes sign-extended too
// (bits 8..31 copy the sign bit, which e4m3_bits keeps in bit 31 only).
#if defined(__AVX512F__)
using ivec_q = __m512i;
ALWAYS_INLINE ivec_q lanes_of(const void* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
ALWAYS_INLINE vec to_float(ivec_q x) { return _mm512_cvtepi32_ps(x); }
ALWAYS_INLINE vec e4m3_bits(ivec_q x) {  // (x << 20) & 0x87F00000: sign to bit 31, the 7 low bits to 20..26
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(x, 20), _mm512_set1_epi32(static_cast<int>(0x87F00000u))));
}
#elif defined(__AVX2__) && defined(__FMA__)
using ivec_q = __m256i;
ALWAYS_INLINE ivec_q lanes_of(const void* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
ALWAYS_INLINE vec to_float(ivec_q x) { return _mm256_cvtepi32_ps(x); }
ALWAYS_INLINE vec e4m3_bits(ivec_q x) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(x, 20), _mm256_set1_epi32(static_cast<int>(0x87F00000u))));
}
#else
typedef int8_t bvec __attribute__((vector_size(4)));
using ivec_q = ivec;
ALWAYS_INLINE ivec_q lanes_of(const void* p) {
  bvec b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, ivec);
}
ALWAYS_INLINE vec to_float(ivec_q x) { return __builtin_convertvector(x, vec); }
ALWAYS_INLINE vec e4m3_bits(ivec_q x) { return (vec)((ivec)((uvec)x << 20) & static_cast<int32_t>(0x87F00000u)); }
#endif

// W codes in order -> fp32.
ALWAYS_INLINE vec load_w(const i8* v) { return to_float(lanes_of(v)); }
ALWAYS_INLINE vec load_w(const e4m3* v) { return mul(e4m3_bits(lanes_of(v)), set1(kE4m3Unit)); }

// 2W codes -> two vectors of W, in order (split_pairs is false for the codes).
template <typename Q>
ALWAYS_INLINE void load_codes(const Q* v, vec* x) {
  x[0] = load_w(v);
  x[1] = load_w(v + W);
}
ALWAYS_INLINE void load_pair(const i8* v, vec* x) { load_codes(v, x); }
ALWAYS_INLINE void load_pair(const e4m3* v, vec* x) { load_codes(v, x); }
ALWAYS_INLINE void load_step(const i8* v, vec* x) { load_codes(v, x); }
ALWAYS_INLINE void load_step(const e4m3* v, vec* x) { load_codes(v, x); }

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
