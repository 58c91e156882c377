// The NaN-row rule for kernels that lose it: a query row holding NaN or inf gives a NaN output row, as
// torch's math does (torch 2.13's CPU flash kernel returns such a row as zeros when it has no mask).
//   q   (R, D) rows, out (R, Dv) rows: contiguous CPU tensors, float32 or bfloat16 (each its own dtype)
// One pass finds the largest exponent field of q; only when it is all ones (NaN or inf somewhere) are the
// rows looked at one by one, and each such row of out is set to NaN, in place. Included by decode_kernel.cpp.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace nan_rows {

template <typename Bits>
bool all_finite(const Bits* x, int64_t n, Bits exponent) {
  Bits top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max<Bits>(top, x[i] & exponent);  // vectorises: no branch
  return top != exponent;
}

template <typename Bits>
void mark(const Bits* q, int64_t rows, int64_t D, Bits exponent, torch::Tensor out) {
  if (all_finite(q, rows * D, exponent)) return;  // the common case: one pass over q, nothing written
  const int64_t Dv = out.size(-1);
  const bool half = out.scalar_type() == at::kBFloat16;
  for (int64_t r = 0; r < rows; ++r) {
    if (all_finite(q + r * D, D, exponent)) continue;
    if (half) {
      auto* o = reinterpret_cast<uint16_t*>(out.data_ptr()) + r * Dv;
      std::fill(o, o + Dv, uint16_t{0x7fc0});  // bfloat16 quiet NaN
    } else {
      float* o = out.data_ptr<float>() + r * Dv;
      std::fill(o, o + Dv, std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// Returns false, touching nothing, for inputs it does not take (another dtype, layout or device): the
// caller then keeps the rule with torch ops.
inline bool keep_nan_rows(torch::Tensor out, torch::Tensor q) {
  const auto taken = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.dim() >= 1 && t.is_contiguous() &&
           (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  if (!taken(q) || !taken(out)) return false;
  const int64_t D = q.size(-1), rows = D ? q.numel() / D : 0, Dv = out.size(-1);
  if ((Dv ? out.numel() / Dv : 0) != rows) return false;
  if (rows == 0 || D == 0) return true;
  if (q.scalar_type() == at::kFloat) {
    mark<uint32_t>(reinterpret_cast<const uint32_t*>(q.data_ptr()), rows, D, 0x7f800000u, out);
  } else {
    mark<uint16_t>(reinterpret_cast<const uint16_t*>(q.data_ptr()), rows, D, uint16_t{0x7f80}, out);
  }
  return true;
}

}  // namespace nan_rows
