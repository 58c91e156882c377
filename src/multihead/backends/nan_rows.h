// The NaN-row rule for kernels that lose it: a query row holding NaN or inf gives a NaN output row, as
// torch's math does (torch 2.13's CPU flash kernel returns such a row as zeros when it has no mask).
//   q (rows, D), out (rows, Dv): contiguous, one dtype, float32 or bfloat16 (bf16: true), by address
// One pass finds the largest exponent field of q; only when it is all ones (NaN or inf somewhere) are the
// rows looked at one by one, and each such row of out is set to NaN, in place. Checked and laid out on the
// Python side (backends/common.py: keep_nan_rows); included by decode_kernel.cpp.
#pragma once

#include <algorithm>
#include <cstdint>

namespace nan_rows {

template <typename Bits>
bool all_finite(const Bits* x, int64_t n, Bits exponent) {
  Bits top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max<Bits>(top, x[i] & exponent);  // vectorises: no branch
  return top != exponent;
}

template <typename Bits>
void mark(const Bits* q, Bits* out, int64_t rows, int64_t D, int64_t Dv, Bits exponent, Bits quiet_nan) {
  if (all_finite(q, rows * D, exponent)) return;  // the common case: one pass over q, nothing written
  for (int64_t r = 0; r < rows; ++r) {
    if (!all_finite(q + r * D, D, exponent)) std::fill(out + r * Dv, out + (r + 1) * Dv, quiet_nan);
  }
}

inline void keep_nan_rows(std::uintptr_t q, std::uintptr_t out, int64_t rows, int64_t D, int64_t Dv, bool bf16) {
  if (bf16) {
    mark<uint16_t>(reinterpret_cast<const uint16_t*>(q), reinterpret_cast<uint16_t*>(out), rows, D, Dv,
                   uint16_t{0x7f80}, uint16_t{0x7fc0});
  } else {
    mark<uint32_t>(reinterpret_cast<const uint32_t*>(q), reinterpret_cast<uint32_t*>(out), rows, D, Dv,
                   0x7f800000u, 0x7fc00000u);
  }
}

}  // namespace nan_rows
