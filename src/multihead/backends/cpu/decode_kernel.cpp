// Python binding of the decode kernel (decode_head.h) and the MLA products (latent_products.h). The
// tensors are checked and laid out on the Python side (cpu/calls.py), which passes their addresses,
// sizes and strides: the build then needs pybind11 and ATen's parallel_for only, not torch's full
// headers (about 4 s of compiling instead of 25 s), so that each build the tests make stays cheap.
// Shapes (B batch, H query heads, Hkv kv heads, Lq new rows per sequence, D, Dv):
//   q      (B, H, Lq, D)   float32, contiguous; qb: the same as bfloat16 words when the caller's query
//                          was bfloat16 (it then meets bf16 keys in `vdpbf16ps` where the CPU has it)
//   k, v   (B, Hkv, M, D) / (B, Hkv, M, Dv)  float32 or bfloat16, last dim contiguous (KVCache buffers)
//   lo, hi (B, Lq) int64   row (b, i) keeps keys lo <= j < hi; keys outside [min lo, max hi) are never read
//   qpos   (B, Lq) float32 the query position ALiBi measures distance from (used with slopes)
//   slopes (H,) float32 or absent; sinks (H,) float32 or absent; softcap <= 0: none
//   out    (B, H, Lq, Dv) float32 (the sums are made in float32)
// Rows with no key give exactly 0; NaN in a query or a visible key or value propagates.
// The G = H / Hkv query heads of a kv head and its Lq rows share one pass: R = G * Lq rows per key.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <string>

#include "decode_head.h"
#include "decode_listed.h"
#include "decode_quant_step.h"
#include "latent_products.h"
#include "nan_rows.h"

namespace {

using decode_head::Args;
using decode_head::Scratch;
using decode_head::one_head;

template <typename P>
P* at_address(std::uintptr_t address) { return reinterpret_cast<P*>(address); }

template <typename T>
void run_all(const Args& a) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch w(R, a.D, a.Dv);
    for (int64_t t = begin; t < end; ++t) one_head<T>(a, t / a.Hkv, t % a.Hkv, w);
  });
}

// Addresses of 0 stand for absent inputs (qb, slopes, sinks). sizes: (B, H, Hkv, Lq, D, Dv); strides:
// k's then v's along (batch, head, slot), in elements.
void decode_step(std::uintptr_t q, std::uintptr_t qb, std::uintptr_t k, std::uintptr_t v, std::uintptr_t lo,
                 std::uintptr_t hi, std::uintptr_t qpos, std::uintptr_t slopes, std::uintptr_t sinks,
                 std::uintptr_t out, bool bf16, const std::array<int64_t, 6>& sizes,
                 const std::array<int64_t, 6>& strides, double scale, double softcap) {
  const auto [B, H, Hkv, Lq, D, Dv] = sizes;
  const Args a{at_address<const float>(q), at_address<const uint16_t>(qb), at_address<const void>(k),
               at_address<const void>(v), at_address<const int64_t>(lo), at_address<const int64_t>(hi),
               at_address<const float>(qpos), at_address<const float>(slopes), at_address<const float>(sinks),
               at_address<float>(out), B, H, Hkv, Lq, D, Dv, strides[0], strides[1], strides[2], strides[3],
               strides[4], strides[5], static_cast<float>(scale), static_cast<float>(softcap)};
  if (bf16) {
    run_all<uint16_t>(a);
  } else {
    run_all<float>(a);
  }
}

// decode_step over listed rows (decode_listed.h): Lq = 1, idx (B, K) int64 slots; of the first hi[b] of row b
// the distinct ones >= 0 are read (-1 and repeats skipped; hi 0: all K; lo unused); slopes absent.
void listed_step(std::uintptr_t q, std::uintptr_t qb, std::uintptr_t k, std::uintptr_t v, std::uintptr_t idx,
                 int64_t K, std::uintptr_t hi, std::uintptr_t sinks, std::uintptr_t out, bool bf16,
                 const std::array<int64_t, 6>& sizes, const std::array<int64_t, 6>& strides, double scale,
                 double softcap) {
  const auto [B, H, Hkv, Lq, D, Dv] = sizes;
  const Args a{at_address<const float>(q), at_address<const uint16_t>(qb), at_address<const void>(k),
               at_address<const void>(v), nullptr, at_address<const int64_t>(hi), nullptr, nullptr,
               at_address<const float>(sinks), at_address<float>(out), B, H, Hkv, Lq, D, Dv, strides[0],
               strides[1], strides[2], strides[3], strides[4], strides[5], static_cast<float>(scale),
               static_cast<float>(softcap)};
  if (bf16) {
    decode_listed::run_listed<uint16_t>(a, at_address<const int64_t>(idx), K);
  } else {
    decode_listed::run_listed<float>(a, at_address<const int64_t>(idx), K);
  }
}

// y (H, M, N) float32 = x (H, M, K) float32 @ W (H, K, N) bfloat16 per head (fold), or W (H, N, K) @ x.
void latent_product(std::uintptr_t w, std::uintptr_t x, std::uintptr_t y, const std::array<int64_t, 4>& sizes,
                    bool fold) {
  const auto [H, M, K, N] = sizes;
  latent_products::products(at_address<const uint16_t>(w), at_address<const float>(x), at_address<float>(y), H,
                            M, K, N, fold);
}

// The path this build runs, from the target it was compiled for.
std::string isa() {
#if defined(__AVX512BF16__)
  return DECODE_SIMD_PATH "-bf16";  // with the vdpbf16ps score tiles
#else
  return DECODE_SIMD_PATH;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_step", &decode_step, "one attention decode step (addresses, sizes and strides)");
  m.def("decode_listed", &listed_step, "one decode step over listed cache rows (Mask.sparse)");
  m.def("decode_step_quantized", &decode_quant::decode_step_quantized,
        "the decode step over int8 or fp8 e4m3 codes with a scale per token and kv head");
  m.def("latent_product", &latent_product, "MLA: y = x @ W (fold, W (H, K, N)) or W @ x per head");
  m.def("isa", &isa, "the path this build runs: avx512-bf16, avx512, avx2 or portable-<vector ISA>");
  m.def("keep_nan_rows", &nan_rows::keep_nan_rows, "out rows NaN where the query row holds NaN or inf, in place");
}
