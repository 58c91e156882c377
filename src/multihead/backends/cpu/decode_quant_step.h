// The decode step over a quantized KV cache (decode_quant.h): int8 or fp8 e4m3 codes for keys and
// values, with an fp32 scale per token and kv head. The same one_head as the float caches
// (decode_head.h), on the code types; each key's scale multiplies its scores and each value's scale
// its weights, after the softmax has summed them. Shapes as decode_kernel.cpp, with
//   k_scale, v_scale (B, Hkv, M) float32, strides (s_sb, s_sh, 1)
#pragma once
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>

#include "decode_head.h"

namespace decode_quant {

template <typename T>
void run_codes(const decode_head::Args& a) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    decode_head::Scratch w(R, a.D, a.Dv);
    for (int64_t t = begin; t < end; ++t) decode_head::one_head<T>(a, t / a.Hkv, t % a.Hkv, w);
  });
}

// Addresses as decode_kernel.cpp's decode_step (0: absent); fp8 true: e4m3 codes, else int8. strides:
// k's then v's along (batch, head, slot), then the scales' along (batch, head).
inline void decode_step_quantized(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t k_scale,
                                  std::uintptr_t v_scale, std::uintptr_t lo, std::uintptr_t hi, std::uintptr_t qpos,
                                  std::uintptr_t slopes, std::uintptr_t sinks, std::uintptr_t out, bool fp8,
                                  const std::array<int64_t, 6>& sizes, const std::array<int64_t, 8>& strides,
                                  double scale, double softcap) {
  const auto [B, H, Hkv, Lq, D, Dv] = sizes;
  const auto f32 = [](std::uintptr_t p) { return reinterpret_cast<const float*>(p); };
  decode_head::Args a{f32(q), nullptr, reinterpret_cast<const void*>(k), reinterpret_cast<const void*>(v),
                      reinterpret_cast<const int64_t*>(lo), reinterpret_cast<const int64_t*>(hi), f32(qpos),
                      f32(slopes), f32(sinks), reinterpret_cast<float*>(out), B, H, Hkv, Lq, D, Dv, strides[0],
                      strides[1], strides[2], strides[3], strides[4], strides[5], static_cast<float>(scale),
                      static_cast<float>(softcap), f32(k_scale), f32(v_scale), strides[6], strides[7]};
  if (fp8) {
    run_codes<decode_simd::e4m3>(a);
  } else {
    run_codes<decode_simd::i8>(a);
  }
}

}  // namespace decode_quant
