// One attention decode step on the CPU: one pass over each kv head's keys and values with an online
// softmax in fp32. Shapes (B batch, H query heads, Hkv kv heads, Lq new rows per sequence, D, Dv):
//   q      (B, H, Lq, D)   float32 or bfloat16, contiguous (a bf16 query meets bf16 keys in `vdpbf16ps`)
//   k, v   (B, Hkv, M, D) / (B, Hkv, M, Dv)  float32 or bfloat16, last dim contiguous (KVCache buffers)
//   lo, hi (B, Lq) int64   row (b, i) keeps keys lo <= j < hi; keys outside [min lo, max hi) are never read
//   qpos   (B, Lq) float32 the query position ALiBi measures distance from (used with slopes)
//   slopes (H,) float32 or empty; sinks (H,) float32 or empty; softcap <= 0: none
//   out    (B, H, Lq, Dv) in q's dtype (the sums are made in float32)
// Rows with no key give exactly 0; NaN in a query or a visible key or value propagates.
// The G = H / Hkv query heads of a kv head and its Lq rows share one pass: R = G * Lq rows per key.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "decode_rows.h"
#include "decode_simd.h"
#include "latent_products.h"
#include "nan_rows.h"

namespace {

using decode_rows::accumulate;
using decode_rows::exp_nonpositive;
using decode_rows::scores;

constexpr int64_t kBlock = 64;  // the most keys per block (the scores' row stride in scratch)
constexpr int64_t kDistance = 64;  // how many keys ahead keys and values are prefetched

// Keys per block: the softmax's bookkeeping runs once a block, and each block reads its keys, then
// its values. Measured on AMD EPYC (Zen 5), 1 thread, cold cache: while the tiles read key rows across
// their columns, fp32 read fastest in blocks of 64 keys and bf16 in blocks of 32; since the D = 128
// tiles read each key and value row in order, blocks of 32 to 128 keys read alike.
template <typename T>
constexpr int64_t block_keys() { return std::is_same<T, float>::value ? 64 : 32; }
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Args {
  const float* q;       // (B, H, Lq, D) float32
  const uint16_t* qb;   // the same as bf16 words when the caller's query was bfloat16, else nullptr
  const void* k;
  const void* v;
  const int64_t* lo;
  const int64_t* hi;
  const float* qpos;
  const float* slopes;  // nullptr: no ALiBi
  const float* sinks;   // nullptr: no sinks
  float* out;
  int64_t B, H, Hkv, Lq, D, Dv;
  int64_t k_sb, k_sh, k_sm, v_sb, v_sh, v_sm;  // strides of k and v in elements
  float scale, softcap;
};

// Per-thread scratch: scores (then weights) of a block, running max, sum and accumulators per row,
// and the query rows with their columns reordered for bf16 keys.
// Each array starts on a 64-byte boundary: a vector load or store that straddles two cache lines costs
// two, and the accumulators are loaded and stored at every block.
struct Scratch {
  std::vector<float> buf;
  float *s, *m, *l, *acc, *qp;
  int64_t acc_size;
  Scratch(int64_t R, int64_t D, int64_t Dv) : acc_size(R * Dv) {
    const auto whole = [](int64_t n) { return (n + 15) / 16 * 16; };  // floats, rounded up to 64 bytes
    buf.resize(whole(R * kBlock) + 2 * whole(R) + whole(R * Dv) + whole(R * D) + 16);
    float* p = buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) / sizeof(float) % 16) % 16;
    for (auto [field, n] : {std::pair<float**, int64_t>{&s, R * kBlock}, {&m, R}, {&l, R}, {&acc, R * Dv},
                            {&qp, R * D}}) {
      *field = p;
      p += whole(n);
    }
  }
};

// The query rows of one kv head (R rows, D apart) in the forms the score tiles read: fp32 (f), fp32
// with each 32 columns stored even columns first (p: for bf16 keys), bf16 words (b: when the caller's
// query was bfloat16, so its values are exactly these; nullptr otherwise).
struct QRows {
  const float* f;
  const float* p;
  const uint16_t* b;
};

#if defined(__AVX512F__)
// Whether the score tiles take head dim D for key type T (whole vectors of 16 fp32 or 32 bf16).
template <typename T>
constexpr bool tiled(int64_t D) { return std::is_same<T, float>::value ? D % 16 == 0 : D % 32 == 0; }

// Scores of rows r0 .. r0+RN-1 against 16 keys (K: the first), in tiles of RN rows x 16/RN keys;
// s: row r0's first score, rows kBlock apart.
template <int RN, typename T>
ALWAYS_INLINE void tile_rows(const QRows& q, int64_t r0, const T* K, int64_t ks, int64_t D, float scale, float* s) {
  constexpr int KN = 16 / RN;
  for (int u0 = 0; u0 < 16; u0 += KN) {
    __m512 a[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
    if constexpr (std::is_same<T, float>::value) {
      if (RN == 4 && D == 128) {
        decode_simd::dot_tile_in_order(q.f + r0 * D, K + u0 * ks, ks, a);
      } else {
        decode_simd::dot_tile<RN, KN>(q.f + r0 * D, D, K + u0 * ks, ks, D, a);
      }
    } else {
#if defined(__AVX512BF16__)
      if (q.b && RN == 4 && D == 128) {
        decode_simd::dot_tile_bf16_in_order(q.b + r0 * D, K + u0 * ks, ks, a);
      } else if (q.b) {
        decode_simd::dot_tile_bf16<RN, KN>(q.b + r0 * D, D, K + u0 * ks, ks, D, a);
      } else
#endif
        decode_simd::dot_tile<RN, KN>(q.p + r0 * D, D, K + u0 * ks, ks, D, a);
    }
    decode_simd::store_tile<RN, KN>(a, scale, s + u0, kBlock);
  }
}

// acc[r][c] += sum_j p[r][j] * V[j][c] for RN rows, 16 * CV columns at a time: each value is loaded
// (and widened) once for all RN rows. Needs Dv % (16 * CV) == 0. p: rows kBlock apart; acc: rows Dv
// apart, for bf16 values with each 32 columns in the order of decode_simd::load64 (even, then odd).
template <int RN, int CV, typename T>
ALWAYS_INLINE void accumulate_rows(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  for (int64_t c0 = 0; c0 < Dv; c0 += 16 * CV) {
    __m512 a[RN][CV];
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < CV; ++u) a[r][u] = _mm512_loadu_ps(acc + r * Dv + c0 + 16 * u);
    for (int64_t j = 0; j < n; ++j) {
      __m512 v[CV];
      for (int u = 0; u < CV; u += 4) decode_simd::load64(V + j * vs + c0 + 16 * u, v + u);
      for (int r = 0; r < RN; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r * kBlock + j]);
        for (int u = 0; u < CV; ++u) a[r][u] = _mm512_fmadd_ps(pj, v[u], a[r][u]);
      }
    }
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < CV; ++u) _mm512_storeu_ps(acc + r * Dv + c0 + 16 * u, a[r][u]);
  }
}
#endif

// Asks for keys and values [from, from + 16) (below `last`) ahead of their use, a tile at a time so that
// the requests spread over the block's work instead of queueing up at its start.
struct Ahead {
  const char *k, *v;
  int64_t k_row, v_row, k_bytes, v_bytes, last;  // row strides and bytes read per row
  void operator()(int64_t from) const {
    const int64_t to = std::min(from + 16, last);
    for (int64_t j = from; j < to; ++j) {
      for (int64_t b = 0; b < k_bytes; b += 64) __builtin_prefetch(k + j * k_row + b, 0, 0);
      for (int64_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(v + j * v_row + b, 0, 0);
    }
  }
};

// The block's scores s[r][j] (rows kBlock apart) for all R rows: on AVX-512, tiles of 16 keys with
// the rows in groups of 4, 2 and 1; the keys past the last whole tile (and every key elsewhere) row by row.
template <typename T>
inline void block_scores(const QRows& q, int64_t R, const T* K, int64_t ks, int64_t n, int64_t D, float scale,
                         float* s, const Ahead& ahead, int64_t j0) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (tiled<T>(D)) {
    for (; j + 16 <= n; j += 16) {
      ahead(j0 + j + kDistance);
      int64_t r0 = 0;
      for (; r0 + 4 <= R; r0 += 4) tile_rows<4>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
      if (r0 + 2 <= R) {
        tile_rows<2>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
        r0 += 2;
      }
      if (r0 < R) tile_rows<1>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
    }
  }
#endif
  for (int64_t t = j; t < n; t += 16) ahead(j0 + t + kDistance);
  for (int64_t r = 0; r < R; ++r) scores(q.f + r * D, K + j * ks, ks, n - j, D, scale, s + r * kBlock + j);
}

// Whether block_values runs the grouped AVX-512 loop (accumulate_rows) for value dim Dv.
constexpr bool grouped_values(int64_t Dv) {
#if defined(__AVX512F__)
  return Dv % 64 == 0;
#else
  return Dv < 0;
#endif
}

// acc[r] += sum_j p[r][j] V[j] for all R rows (p: rows kBlock apart; acc: rows Dv apart). On AVX-512
// with Dv % 64 == 0, each value is loaded once for several rows: rows of 128 whole for two query rows
// (the values are then read in order, which reads faster), else 64 columns for four query rows.
template <typename T>
inline void block_values(const float* p, int64_t R, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  int64_t r0 = 0;
#if defined(__AVX512F__)
  if (grouped_values(Dv)) {
    if (Dv == 128) {  // whole rows, two query rows at a time
      for (; r0 + 2 <= R; r0 += 2) accumulate_rows<2, 8>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
      if (r0 < R) accumulate_rows<1, 8>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
      return;
    }
    for (; r0 + 4 <= R; r0 += 4) accumulate_rows<4, 4>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
    switch (R - r0) {
      case 3: accumulate_rows<3, 4>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv); break;
      case 2: accumulate_rows<2, 4>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv); break;
      case 1: accumulate_rows<1, 4>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv); break;
      default: break;
    }
    return;
  }
#endif
  for (; r0 < R; ++r0) accumulate(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
}

// Softcap, ALiBi and the online softmax of row r over the block's scores sr (n keys from j0, the row
// keeping [lo, hi)): sr becomes the weights, and the row's max, sum and accumulator are brought up to date.
inline void softmax_row(const Args& a, int64_t b, int64_t hk, int64_t r, int64_t j0, int64_t n, int64_t lo,
                        int64_t hi, float* sr, Scratch& w) {
  const int64_t G = a.H / a.Hkv, i = r % a.Lq;
  if (a.softcap > 0.0f) {
    const float inv = 1.0f / a.softcap;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {  // cap * tanh(x / cap), tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|)
      const float y = sr[j] * inv;
      const float e = exp_nonpositive(-2.0f * std::fabs(y));
      const float t = (1.0f - e) / (1.0f + e);
      sr[j] = a.softcap * (y < 0.0f ? -t : (y == y ? t : y));
    }
  }
  if (a.slopes) {
    const float slope = a.slopes[hk * G + r / a.Lq], pos = a.qpos[b * a.Lq + i];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) sr[j] += slope * (static_cast<float>(j0 + j) - pos);
  }
  const int64_t klo = std::clamp<int64_t>(lo - j0, 0, n), khi = std::clamp<int64_t>(hi - j0, klo, n);  // kept
  float mx = w.m[r];
#if defined(__AVX512F__)
  if (klo < khi) mx = decode_simd::block_max(sr, klo, khi, mx);
#else
  for (int64_t j = klo; j < khi; ++j) mx = sr[j] > mx ? sr[j] : mx;  // NaN is passed over
#endif
  if (mx == -kInf) {  // nothing kept yet (scores of -inf, or masked): weights 0
    for (int64_t j = 0; j < n; ++j) {
      sr[j] = j >= klo && j < khi && sr[j] != sr[j] ? sr[j] : 0.0f;  // NaN stays NaN
      w.l[r] += sr[j];
    }
    return;
  }
#if defined(__AVX512F__)
  const float sum = decode_simd::block_exp(sr, n, klo, khi, mx);
#else
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float p = j >= klo && j < khi ? exp_nonpositive(sr[j] - mx) : 0.0f;
    sr[j] = p;
    sum += p;
  }
#endif
  const float old = w.m[r];
  const float corr = old == -kInf ? 0.0f : exp_nonpositive(old - mx);
  w.m[r] = mx;
  w.l[r] = w.l[r] * corr + sum;
  if (corr != 1.0f) {
    float* ar = w.acc + r * a.Dv;
#pragma omp simd
    for (int64_t c = 0; c < a.Dv; ++c) ar[c] *= corr;
  }
}

// The query rows of kv head hk of sequence b in the forms the score tiles read (see QRows).
template <typename T>
inline QRows query_rows(const Args& a, int64_t b, int64_t hk, Scratch& w) {
  const int64_t G = a.H / a.Hkv, R = G * a.Lq, D = a.D, row0 = (b * a.H + hk * G) * a.Lq;
  QRows q{a.q + row0 * D, nullptr, nullptr};
  if (std::is_same<T, float>::value || D % 32 != 0) return q;
#if defined(__AVX512BF16__)
  if (a.qb) {
    q.b = a.qb + row0 * D;
    return q;
  }
#endif
  for (int64_t r = 0; r < R; ++r)  // each 32 columns: the even ones, then the odd ones
    for (int64_t c = 0; c < D; c += 32)
      for (int64_t t = 0; t < 16; ++t) {
        w.qp[r * D + c + t] = q.f[r * D + c + 2 * t];
        w.qp[r * D + c + 16 + t] = q.f[r * D + c + 2 * t + 1];
      }
  q.p = w.qp;
  return q;
}

template <typename T>
void one_head(const Args& a, int64_t b, int64_t hk, Scratch& w) {
  const int64_t G = a.H / a.Hkv, R = G * a.Lq, D = a.D, Dv = a.Dv;
  const QRows q = query_rows<T>(a, b, hk, w);  // the R rows of this kv head
  float* out = a.out + (b * a.H + hk * G) * a.Lq * Dv;
  const T* K = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* V = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  const int64_t* lo = a.lo + b * a.Lq;
  const int64_t* hi = a.hi + b * a.Lq;
  int64_t first = std::numeric_limits<int64_t>::max(), last = 0;
  for (int64_t i = 0; i < a.Lq; ++i) {
    if (lo[i] < hi[i]) {
      first = std::min(first, lo[i]);
      last = std::max(last, hi[i]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const float sink = a.sinks ? a.sinks[hk * G + r / a.Lq] : -kInf;
    w.m[r] = sink;
    w.l[r] = a.sinks ? 1.0f : 0.0f;
  }
  std::fill(w.acc, w.acc + w.acc_size, 0.0f);
  const Ahead ahead{reinterpret_cast<const char*>(K), reinterpret_cast<const char*>(V),
                    static_cast<int64_t>(a.k_sm * sizeof(T)), static_cast<int64_t>(a.v_sm * sizeof(T)),
                    static_cast<int64_t>(D * sizeof(T)), static_cast<int64_t>(Dv * sizeof(T)), last};
  for (int64_t j0 = first; j0 < last; j0 += block_keys<T>()) {
    const int64_t n = std::min(block_keys<T>(), last - j0);
    block_scores(q, R, K + j0 * a.k_sm, a.k_sm, n, D, a.scale, w.s, ahead, j0);
    for (int64_t r = 0; r < R; ++r) softmax_row(a, b, hk, r, j0, n, lo[r % a.Lq], hi[r % a.Lq], w.s + r * kBlock, w);
    block_values(w.s, R, V + j0 * a.v_sm, a.v_sm, n, Dv, w.acc);
  }
  const bool interleaved = !std::is_same<T, float>::value && grouped_values(Dv);  // acc: even, odd columns
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * Dv;
    const float* ar = w.acc + r * Dv;
    const float l = w.l[r];
    const float inv = lo[r % a.Lq] >= hi[r % a.Lq] || l == 0.0f ? 0.0f : 1.0f / l;  // no key: exactly 0
    for (int64_t c = 0; c < Dv; ++c) {
      const int64_t from = interleaved ? (c & ~int64_t{31}) + (c & 1) * 16 + (c & 31) / 2 : c;
      o[c] = inv == 0.0f ? 0.0f : ar[from] * inv;
    }
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

torch::Tensor decode_step(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor lo, torch::Tensor hi,
                          torch::Tensor qpos, torch::Tensor slopes, torch::Tensor sinks, double scale,
                          double softcap) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-D");
  TORCH_CHECK((q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) && q.is_contiguous(),
              "q must be contiguous float32 or bfloat16");
  const bool q_bf16 = q.scalar_type() == at::kBFloat16;
  const torch::Tensor qf = q_bf16 ? q.to(at::kFloat) : q;
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "k and v must share a dtype");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "k and v need a contiguous last dim");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && qpos.is_contiguous(), "ranges must be contiguous");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Dv = v.size(3);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "H must be a multiple of Hkv");
  auto out = torch::empty({B, H, Lq, Dv}, qf.options());
  const uint16_t* qb = q_bf16 ? reinterpret_cast<const uint16_t*>(q.data_ptr()) : nullptr;
  Args a{qf.data_ptr<float>(), qb, k.data_ptr(), v.data_ptr(), lo.data_ptr<int64_t>(), hi.data_ptr<int64_t>(),
         qpos.data_ptr<float>(), slopes.numel() ? slopes.data_ptr<float>() : nullptr,
         sinks.numel() ? sinks.data_ptr<float>() : nullptr, out.data_ptr<float>(), B, H, Hkv, Lq, D, Dv,
         k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), static_cast<float>(scale),
         static_cast<float>(softcap)};
  if (k.scalar_type() == at::kFloat) {
    run_all<float>(a);
  } else {
    TORCH_CHECK(k.scalar_type() == at::kBFloat16, "k and v must be float32 or bfloat16");
    run_all<uint16_t>(a);
  }
  return q_bf16 ? out.to(at::kBFloat16) : out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_step", &decode_step, "one attention decode step");
  m.def("latent_product", &latent_products::products, "MLA: y = x @ W (fold, W (H, K, N)) or W @ x per head");
  m.def("keep_nan_rows", &nan_rows::keep_nan_rows, "out rows NaN where the query row holds NaN or inf, in place");
}
