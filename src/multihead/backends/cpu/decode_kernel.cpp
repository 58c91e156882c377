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
//   out    (B, H, Lq, Dv) float32 (the sums are made in float32); lse (B, H, Lq) float32 or absent: each
//          row's log-sum-exp (natural log, sinks included; -inf where the row keeps no key)
// kind: the keys' and values' element type: 0 fp32, 1 bf16, 2 int8 codes, 3 fp8 e4m3 codes; codes come
// with k_scale, v_scale (B, Hkv, M) float32 (decode_quant.h), paged keys with a block table (decode_paged.h).
// Rows with no key give exactly 0; NaN in a query or a visible key or value propagates.
// The G = H / Hkv query heads of a kv head and its Lq rows share one pass: R = G * Lq rows per key.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "decode_head.h"
#include "decode_pass.h"
#include "decode_listed.h"
#include "decode_paged.h"
#include "latent_products.h"
#include "nan_rows.h"

namespace {

using decode_head::Args;
using decode_head::Scratch;
using decode_head::one_head;

template <typename P>
P* at_address(std::uintptr_t address) { return reinterpret_cast<P*>(address); }

enum Kind : int64_t { kF32 = 0, kBF16 = 1, kInt8 = 2, kE4m3 = 3 };

// f.template operator()<T>() for the element type of `kind`.
template <typename F>
void by_kind(int64_t kind, F&& f) {
  switch (kind) {
    case kF32: f.template operator()<float>(); break;
    case kBF16: f.template operator()<uint16_t>(); break;
    case kInt8: f.template operator()<decode_simd::i8>(); break;
    case kE4m3: f.template operator()<decode_simd::e4m3>(); break;
    default: throw std::invalid_argument("decode kernel: kind must be 0 (fp32), 1 (bf16), 2 (int8) or 3 (fp8)");
  }
}

template <typename T>
void run_all(const Args& a) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch w(R, a.D, a.Dv);
    for (int64_t t = begin; t < end; ++t) one_head<T>(a, t / a.Hkv, t % a.Hkv, w);
  });
}

// The addresses every step takes (0: absent) and its sizes (B, H, Hkv, Lq, D, Dv); strides: k's then v's
// along (batch or page, head, slot), then the scales' along (batch or page, head), in elements.
struct Step {
  std::uintptr_t q, qb, k, v, k_scale, v_scale, lo, hi, qpos, slopes, sinks, out, lse;
};

Args args_of(const Step& s, const std::array<int64_t, 6>& sizes, const std::array<int64_t, 8>& strides,
             double scale, double softcap) {
  const auto [B, H, Hkv, Lq, D, Dv] = sizes;
  Args a{at_address<const float>(s.q), at_address<const uint16_t>(s.qb), at_address<const void>(s.k),
         at_address<const void>(s.v), at_address<const int64_t>(s.lo), at_address<const int64_t>(s.hi),
         at_address<const float>(s.qpos), at_address<const float>(s.slopes), at_address<const float>(s.sinks),
         at_address<float>(s.out), B, H, Hkv, Lq, D, Dv, strides[0], strides[1], strides[2], strides[3],
         strides[4], strides[5], static_cast<float>(scale), static_cast<float>(softcap),
         at_address<const float>(s.k_scale), at_address<const float>(s.v_scale), strides[6], strides[7],
         at_address<float>(s.lse)};
  return a;
}

// One decode step over a contiguous cache (k, v (B, Hkv, M, .)), keys of any kind.
void decode_step(const Step& s, int64_t kind, const std::array<int64_t, 6>& sizes,
                 const std::array<int64_t, 8>& strides, double scale, double softcap) {
  const Args a = args_of(s, sizes, strides, scale, softcap);
  by_kind(kind, [&]<typename T>() { run_all<T>(a); });
}

// One decode step over pages (decode_paged.h): table (B, pages_per_seq) int32, pages of page_size tokens.
void paged_step(const Step& s, std::uintptr_t table, int64_t pages_per_seq, int64_t page_size, int64_t kind,
                const std::array<int64_t, 6>& sizes, const std::array<int64_t, 8>& strides, double scale,
                double softcap) {
  const Args a = args_of(s, sizes, strides, scale, softcap);
  const auto* t = at_address<const int32_t>(table);
  by_kind(kind, [&]<typename T>() { decode_paged::run_paged<T>(a, t, pages_per_seq, page_size); });
}

// decode_step over listed rows (decode_listed.h): Lq = 1, idx (B, K) int64 slots; of the first hi[b] of row b
// the distinct ones >= 0 are read (-1 and repeats skipped; hi 0: all K; lo unused); slopes absent; fp32 or
// bf16 keys (kind 0 or 1).
void listed_step(const Step& s, std::uintptr_t idx, int64_t K, int64_t kind, const std::array<int64_t, 6>& sizes,
                 const std::array<int64_t, 8>& strides, double scale, double softcap) {
  const Args a = args_of(s, sizes, strides, scale, softcap);
  if (kind == kBF16) {
    decode_listed::run_listed<uint16_t>(a, at_address<const int64_t>(idx), K);
  } else if (kind == kF32) {
    decode_listed::run_listed<float>(a, at_address<const int64_t>(idx), K);
  } else {
    throw std::invalid_argument("decode kernel: listed rows take fp32 or bf16 keys");
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
  pybind11::class_<Step>(m, "Step")
      .def(pybind11::init<std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                          std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                          std::uintptr_t, std::uintptr_t, std::uintptr_t>());
  m.def("decode_step", &decode_step, "one attention decode step over a contiguous cache (addresses, sizes, strides)");
  m.def("decode_paged", &paged_step, "one decode step over pages read through a block table");
  m.def("decode_listed", &listed_step, "one decode step over listed cache rows (Mask.sparse)");
  m.def("latent_product", &latent_product, "MLA: y = x @ W (fold, W (H, K, N)) or W @ x per head");
  m.def("isa", &isa, "the path this build runs: avx512-bf16, avx512, avx2 or portable-<vector ISA>");
  m.def("keep_nan_rows", &nan_rows::keep_nan_rows, "out rows NaN where the query row holds NaN or inf, in place");
}
