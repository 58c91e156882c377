// One attention decode step on the CPU: one pass over each kv head's keys and values with an online
// softmax in fp32. Shapes (B batch, H query heads, Hkv kv heads, Lq new rows per sequence, D, Dv):
//   q      (B, H, Lq, D)   float32, contiguous (the caller widens bf16 queries)
//   k, v   (B, Hkv, M, D) / (B, Hkv, M, Dv)  float32 or bfloat16, last dim contiguous (KVCache buffers)
//   lo, hi (B, Lq) int64   row (b, i) keeps keys lo <= j < hi; keys outside [min lo, max hi) are never read
//   qpos   (B, Lq) float32 the query position ALiBi measures distance from (used with slopes)
//   slopes (H,) float32 or empty; sinks (H,) float32 or empty; softcap <= 0: none
//   out    (B, H, Lq, Dv) float32
// Rows with no key give exactly 0; NaN in a query or a visible key or value propagates.
// The G = H / Hkv query heads of a kv head and its Lq rows share one pass: R = G * Lq rows per key.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;  // keys per block: the block's keys and values stay in L1 between passes
constexpr int64_t kDistance = 2 * kBlock;  // how far ahead keys and values are prefetched
constexpr float kInf = std::numeric_limits<float>::infinity();

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {  // bfloat16 bits -> float32: the top half of the word
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0 (or NaN, which stays NaN), to about 1 ulp; written so that gcc vectorises it.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

struct Args {
  const float* q;
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

// Per-thread scratch: scores (then weights) of a block, running max, sum and accumulators per row.
struct Scratch {
  std::vector<float> s, m, l, acc;
  Scratch(int64_t R, int64_t Dv) : s(R * kBlock), m(R), l(R), acc(R * Dv) {}
};

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // 16 bfloat16 -> 16 float32
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

// sr[j] = scale * dot(qr, K[j]) for j < n (K rows `ks` elements apart), widening K on the fly.
template <typename T>
inline void scores(const float* qr, const T* K, int64_t ks, int64_t n, int64_t D, float scale, float* sr) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    for (; j + 8 <= n; j += 8) {  // eight keys: eight independent chains of FMAs
      __m512 a[8];
      for (int u = 0; u < 8; ++u) a[u] = _mm512_setzero_ps();
      for (int64_t c = 0; c < D; c += 16) {
        const __m512 x = _mm512_loadu_ps(qr + c);
        for (int u = 0; u < 8; ++u) a[u] = _mm512_fmadd_ps(x, load16(K + (j + u) * ks + c), a[u]);
      }
      for (int u = 0; u < 8; ++u) sr[j + u] = _mm512_reduce_add_ps(a[u]) * scale;
    }
  }
#endif
  for (; j < n; ++j) {
    const T* k = K + j * ks;
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int64_t c = 0; c < D; ++c) d += qr[c] * widen(k[c]);
    sr[j] = d * scale;
  }
}

// acc[c] += sum_j p[j] * V[j][c] (V rows `vs` elements apart): columns held in registers across the
// block's keys. A weight of 0 (a key this row does not keep) still multiplies its value, as in p @ V.
template <typename T>
inline void accumulate(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  int64_t c0 = 0;
#if defined(__AVX512F__)
  for (; c0 + 128 <= Dv; c0 += 128) {  // eight registers of sums, eight independent chains
    __m512 s[8];
    for (int u = 0; u < 8; ++u) s[u] = _mm512_loadu_ps(acc + c0 + 16 * u);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const T* v = V + j * vs + c0;
      for (int u = 0; u < 8; ++u) s[u] = _mm512_fmadd_ps(pj, load16(v + 16 * u), s[u]);
    }
    for (int u = 0; u < 8; ++u) _mm512_storeu_ps(acc + c0 + 16 * u, s[u]);
  }
  for (; c0 + 16 <= Dv; c0 += 16) {
    __m512 s0 = _mm512_loadu_ps(acc + c0);
    for (int64_t j = 0; j < n; ++j) s0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), load16(V + j * vs + c0), s0);
    _mm512_storeu_ps(acc + c0, s0);
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const T* v = V + j * vs;
#pragma omp simd
    for (int64_t c = c0; c < Dv; ++c) acc[c] += p[j] * widen(v[c]);
  }
}

#if defined(__AVX512F__)
// Scores of RN rows against the block's keys, four keys at a time: each key is loaded (and widened)
// once for all RN rows. Needs D % 16 == 0. s: rows kBlock apart.
template <int RN, typename T>
inline void scores_rows(const float* q, const T* K, int64_t ks, int64_t n, int64_t D, float scale, float* s) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    __m512 a[RN][4];
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
      __m512 kv[4];
      for (int u = 0; u < 4; ++u) kv[u] = load16(K + (j + u) * ks + c);
      for (int r = 0; r < RN; ++r) {
        const __m512 x = _mm512_loadu_ps(q + r * D + c);
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_fmadd_ps(x, kv[u], a[r][u]);
      }
    }
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < 4; ++u) s[r * kBlock + j + u] = _mm512_reduce_add_ps(a[r][u]) * scale;
  }
  for (int r = 0; r < RN; ++r) scores(q + r * D, K + j * ks, ks, n - j, D, scale, s + r * kBlock + j);
}

// acc[r][c] += sum_j p[r][j] * V[j][c] for RN rows, 64 columns at a time: each value is loaded (and
// widened) once for all RN rows. Needs Dv % 64 == 0. p: rows kBlock apart; acc: rows Dv apart.
template <int RN, typename T>
inline void accumulate_rows(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  for (int64_t c0 = 0; c0 < Dv; c0 += 64) {
    __m512 a[RN][4];
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_loadu_ps(acc + r * Dv + c0 + 16 * u);
    for (int64_t j = 0; j < n; ++j) {
      __m512 v[4];
      for (int u = 0; u < 4; ++u) v[u] = load16(V + j * vs + c0 + 16 * u);
      for (int r = 0; r < RN; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r * kBlock + j]);
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_fmadd_ps(pj, v[u], a[r][u]);
      }
    }
    for (int r = 0; r < RN; ++r)
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + r * Dv + c0 + 16 * u, a[r][u]);
  }
}

// The block's scores (or, with `values`, its weighted values) for all R rows, four rows at a time.
template <typename T>
inline void all_rows(bool values, const float* q, const T* KV, int64_t stride, int64_t n, int64_t D, float scale,
                     float* s, float* acc, int64_t R) {
  for (int64_t r0 = 0; r0 < R; r0 += 4) {
    const int64_t rn = std::min<int64_t>(4, R - r0);
    float* sr = s + r0 * kBlock;
    if (values) {
      float* ar = acc + r0 * D;
      switch (rn) {
        case 4: accumulate_rows<4>(sr, KV, stride, n, D, ar); break;
        case 3: accumulate_rows<3>(sr, KV, stride, n, D, ar); break;
        case 2: accumulate_rows<2>(sr, KV, stride, n, D, ar); break;
        default: accumulate_rows<1>(sr, KV, stride, n, D, ar);
      }
    } else {
      const float* qr = q + r0 * D;
      switch (rn) {
        case 4: scores_rows<4>(qr, KV, stride, n, D, scale, sr); break;
        case 3: scores_rows<3>(qr, KV, stride, n, D, scale, sr); break;
        case 2: scores_rows<2>(qr, KV, stride, n, D, scale, sr); break;
        default: scores_rows<1>(qr, KV, stride, n, D, scale, sr);
      }
    }
  }
}
#endif

// Asks for the rows [from, from + kBlock) (below `last`) ahead of their use: the read stays streaming.
template <typename T>
inline void prefetch_block(const T* base, int64_t stride, int64_t from, int64_t last, int64_t row_bytes) {
  const int64_t to = std::min(from + kBlock, last);
  for (int64_t j = from; j < to; ++j) {
    const char* row = reinterpret_cast<const char*>(base + j * stride);
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b, 0, 0);
  }
}

template <typename T>
void one_head(const Args& a, int64_t b, int64_t hk, Scratch& w) {
  const int64_t G = a.H / a.Hkv, R = G * a.Lq, D = a.D, Dv = a.Dv;
  const float* q = a.q + (b * a.H + hk * G) * a.Lq * D;  // the R rows of this kv head, contiguous
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
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  const bool capped = a.softcap > 0.0f;
  for (int64_t j0 = first; j0 < last; j0 += kBlock) {
    const int64_t n = std::min(kBlock, last - j0);
    prefetch_block(K, a.k_sm, j0 + kDistance, last, D * sizeof(T));
    prefetch_block(V, a.v_sm, j0 + kDistance, last, Dv * sizeof(T));
    const T* Kb = K + j0 * a.k_sm;
    const T* Vb = V + j0 * a.v_sm;
    float* s = w.s.data();
    bool grouped = false;  // scores and values of all rows in one pass over the block (AVX-512)
#if defined(__AVX512F__)
    grouped = D % 16 == 0 && Dv % 64 == 0;
    if (grouped) all_rows(false, q, Kb, a.k_sm, n, D, a.scale, s, nullptr, R);
#endif
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + r * D;
      float* sr = s + r * kBlock;
      if (!grouped) scores(qr, Kb, a.k_sm, n, D, a.scale, sr);
      if (capped) {
        const float inv = 1.0f / a.softcap;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {  // cap * tanh(x / cap), tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|)
          const float y = sr[j] * inv;
          const float e = exp_nonpositive(-2.0f * std::fabs(y));
          const float t = (1.0f - e) / (1.0f + e);
          sr[j] = a.softcap * (y < 0.0f ? -t : (y == y ? t : y));
        }
      }
      const int64_t i = r % a.Lq;
      if (a.slopes) {
        const float slope = a.slopes[hk * G + r / a.Lq], pos = a.qpos[b * a.Lq + i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) sr[j] += slope * (static_cast<float>(j0 + j) - pos);
      }
      const int64_t rlo = lo[i] - j0, rhi = hi[i] - j0;
      float mx = w.m[r];
      for (int64_t j = 0; j < n; ++j) {
        const bool kept = j >= rlo && j < rhi;
        mx = kept && sr[j] > mx ? sr[j] : mx;
      }
      if (mx == -kInf) {  // nothing kept yet (scores of -inf, or masked): weights 0
        for (int64_t j = 0; j < n; ++j) {
          const bool kept = j >= rlo && j < rhi;
          sr[j] = kept && sr[j] != sr[j] ? sr[j] : 0.0f;  // NaN stays NaN
          w.l[r] += sr[j];
        }
        continue;
      }
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) {
        const bool kept = j >= rlo && j < rhi;
        const float p = kept ? exp_nonpositive(sr[j] - mx) : 0.0f;
        sr[j] = p;
        sum += p;
      }
      const float old = w.m[r];
      const float corr = old == -kInf ? 0.0f : exp_nonpositive(old - mx);
      w.m[r] = mx;
      w.l[r] = w.l[r] * corr + sum;
      if (corr != 1.0f) {
        float* ar = w.acc.data() + r * Dv;
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) ar[c] *= corr;
      }
    }
#if defined(__AVX512F__)
    if (grouped) {
      all_rows(true, nullptr, Vb, a.v_sm, n, Dv, 0.0f, s, w.acc.data(), R);
      continue;
    }
#endif
    for (int64_t r = 0; r < R; ++r) accumulate(s + r * kBlock, Vb, a.v_sm, n, Dv, w.acc.data() + r * Dv);
  }
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * Dv;
    const float* ar = w.acc.data() + r * Dv;
    const float l = w.l[r];
    const int64_t i = r % a.Lq;
    const bool empty = lo[i] >= hi[i];
    const float inv = 1.0f / l;
#pragma omp simd
    for (int64_t c = 0; c < Dv; ++c) o[c] = (empty || l == 0.0f) ? 0.0f : ar[c] * inv;
  }
}

template <typename T>
void run_all(const Args& a) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch w(R, a.Dv);
    for (int64_t t = begin; t < end; ++t) one_head<T>(a, t / a.Hkv, t % a.Hkv, w);
  });
}

torch::Tensor decode_step(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor lo, torch::Tensor hi,
                          torch::Tensor qpos, torch::Tensor slopes, torch::Tensor sinks, double scale,
                          double softcap) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-D");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be contiguous float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "k and v must share a dtype");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "k and v need a contiguous last dim");
  TORCH_CHECK(lo.is_contiguous() && hi.is_contiguous() && qpos.is_contiguous(), "ranges must be contiguous");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Dv = v.size(3);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "H must be a multiple of Hkv");
  auto out = torch::empty({B, H, Lq, Dv}, q.options());
  Args a{q.data_ptr<float>(), k.data_ptr(), v.data_ptr(), lo.data_ptr<int64_t>(), hi.data_ptr<int64_t>(),
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
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode_step", &decode_step, "one attention decode step"); }
