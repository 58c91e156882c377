// The NaN-row rule for kernels that lose it: a query row holding NaN or inf gives a NaN output row, as
// torch's math does (torch 2.13's CPU flash kernel returns such a row as zeros when it has no mask).
//   q   (B, H, L, D) float32 or bfloat16 (bf16: true), by address, last dim contiguous, strides (in
//       elements) stride_b, stride_h, stride_l
//   out (B, H, L, Dv) of q's dtype, contiguous
// One pass finds the largest exponent field of q's rows; only when it is all ones (NaN or inf somewhere) are
// the rows looked at one by one, and each such row of out is set to NaN, in place. Checked and laid out on
// the Python side (backends/common.py: keep_nan_rows); included by decode_kernel.cpp.
#pragma once

#include <algorithm>
#include <cstdint>

namespace nan_rows {

template <typename Bits>
Bits top_exponent(const Bits* x, int64_t n, Bits exponent) {
  Bits top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max<Bits>(top, x[i] & exponent);  // vectorises: no branch
  return top;
}

template <typename Bits>
void mark(const Bits* q, Bits* out, int64_t B, int64_t H, int64_t L, int64_t D, int64_t Dv, int64_t sb, int64_t sh,
          int64_t sl, Bits exponent, Bits quiet_nan) {
  Bits top = 0;  // one pass over every row first: the common answer (all finite) writes nothing
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) top = std::max<Bits>(top, top_exponent(q + b * sb + h * sh + l * sl, D, exponent));
  if (top != exponent) return;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        if (top_exponent(q + b * sb + h * sh + l * sl, D, exponent) != exponent) continue;
        Bits* o = out + ((b * H + h) * L + l) * Dv;
        std::fill(o, o + Dv, quiet_nan);
      }
}

inline void keep_nan_rows(std::uintptr_t q, std::uintptr_t out, int64_t B, int64_t H, int64_t L, int64_t D,
                          int64_t Dv, int64_t sb, int64_t sh, int64_t sl, bool bf16) {
  if (bf16) {
    mark<uint16_t>(reinterpret_cast<const uint16_t*>(q), reinterpret_cast<uint16_t*>(out), B, H, L, D, Dv, sb, sh,
                   sl, uint16_t{0x7f80}, uint16_t{0x7fc0});
  } else {
    mark<uint32_t>(reinterpret_cast<const uint32_t*>(q), reinterpret_cast<uint32_t*>(out), B, H, L, D, Dv, sb, sh,
                   sl, 0x7f800000u, 0x7fc00000u);
  }
}

}  // namespace nan_rows
