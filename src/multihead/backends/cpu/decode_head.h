// One kv head of the decode step (decode_kernel.cpp): its R = G * Lq query rows against its keys and
// values in blocks, with an online softmax in fp32 (see decode_kernel.cpp for the shapes). Plain C++ on
// the tiles of decode_tiles.h and the row loops of decode_rows.h; no torch, so that it also builds alone.
#pragma once
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
#include "decode_tiles.h"

namespace decode_head {

using decode_rows::accumulate;
using decode_rows::exp_nonpositive;
using decode_rows::scores;

constexpr int64_t kBlock = 64;  // the most keys per block (the scores' row stride in scratch)
constexpr int64_t kDistance = 64;  // how many keys ahead keys and values are prefetched

// Keys ahead to prefetch for element type T: kDistance, and twice as many for a quantized cache's
// one-byte codes: as many bytes ahead as bf16 (read faster so in interleaved runs at 16k keys, G = 1).
template <typename T>
constexpr int64_t prefetch_keys() { return sizeof(T) == 1 ? 2 * kDistance : kDistance; }

// Keys per block: the softmax's bookkeeping runs once a block, and each block reads its keys, then
// its values. Measured on AMD EPYC (AVX-512), 1 thread, cold cache: on AVX-512, fp32 reads fastest in
// blocks of 64 keys and bf16 in blocks of 32; on AVX2 (the x86-64-v3 build on the same CPU) both in
// blocks of 32 (fp32 in blocks of 64 took 10 to 20% longer).
template <typename T>
constexpr int64_t block_keys() { return std::is_same<T, float>::value && decode_simd::W == 16 ? 64 : 32; }
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
  // a quantized cache (decode_quant.h): each key's and value's fp32 scale, (B, Hkv, M) with strides
  // (s_sb, s_sh, 1); nullptr: the keys and values are the numbers themselves
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t s_sb = 0, s_sh = 0;
  float* lse = nullptr;  // (B, H, Lq) float32: each row's log-sum-exp; nullptr: not asked for
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
// with each 2W columns stored even columns first (p: for bf16 keys), bf16 words (b: when the caller's
// query was bfloat16, so its values are exactly these; nullptr otherwise).
struct QRows {
  const float* f;
  const float* p;
  const uint16_t* b;
};

using decode_simd::W;
using decode_tiles::tiled;

// Score tiles take the rows in groups of score_rows<T>() (then 2, then 1): 4 on AVX-512 and for fp32
// keys; 2 for bf16 keys on AVX2 and the portable path, whose query rows do not fit in 16 registers: a
// query vector read from the cache then meets four keys, so the tile loads fewer vectors per FMA.
template <typename T>
constexpr int score_rows() { return W == 16 || std::is_same<T, float>::value ? 4 : 2; }

// The `vdpbf16ps` tiles of RN rows x KN keys, for bf16 keys and a query that was bfloat16 (q.b) on
// AVX512-BF16: whether one ran (else the caller's fp32 tiles run; always for other key types).
template <int RN, int KN, typename T>
ALWAYS_INLINE bool bf16_query_tile(const QRows& q, int64_t r0, const T* K, int64_t ks, int64_t D,
                                   decode_simd::vec* a) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same<T, uint16_t>::value) {
    if (q.b && RN == 4 && D == 128) {
      decode_tiles::dot_tile_bf16_in_order(q.b + r0 * D, K, ks, a);
    } else if (q.b && RN == 4) {
      decode_tiles::dot_tile_bf16<RN, KN>(q.b + r0 * D, D, K, ks, D, a);
    } else if (q.b) {
      decode_tiles::dot_tile_bf16_rows<RN, KN>(q.b + r0 * D, D, K, ks, D, a);
    }
    return q.b != nullptr;
  }
#endif
  return false;
}

// Scores of rows r0 .. r0+RN-1 against 16 keys (K: the first), in tiles of RN rows x W/RN keys;
// s: row r0's first score, rows kBlock apart. Tiles that read each key row whole and in order (the
// order memory streams them in) where that measured faster: fp32 rows in groups under 4 (and all
// groups without AVX-512), a single bf16 row. Not inlined: in its own function the tile's sums and
// query stay in registers (inlined into the block loop, gcc spilled some: 10 to 30% slower on AVX-512).
template <int RN, typename T>
__attribute__((noinline)) void tile_rows(const QRows& q, int64_t r0, const T* K, int64_t ks, int64_t D, float scale, float* s) {
  constexpr int KN = W / RN;
  for (int u0 = 0; u0 < 16; u0 += KN) {
    decode_simd::vec a[W];
    for (int i = 0; i < W; ++i) a[i] = decode_simd::zero();
    if constexpr (std::is_same<T, float>::value) {
#if defined(__AVX512F__)
      if (RN == 4 && D == 128) {
        decode_tiles::dot_tile_in_order(q.f + r0 * D, K + u0 * ks, ks, a);
      } else if (RN == 4) {
        decode_tiles::dot_tile<RN, KN>(q.f + r0 * D, D, K + u0 * ks, ks, D, a);
      } else
#endif
        decode_tiles::dot_tile_rows<RN, KN>(q.f + r0 * D, D, K + u0 * ks, ks, D, a);
    } else if (!bf16_query_tile<RN, KN>(q, r0, K + u0 * ks, ks, D, a)) {
      if (RN == 1) {
        decode_tiles::dot_tile_rows<RN, KN>(q.p + r0 * D, D, K + u0 * ks, ks, D, a);
      } else {
        decode_tiles::dot_tile<RN, KN>(q.p + r0 * D, D, K + u0 * ks, ks, D, a);
      }
    }
    decode_tiles::store_tile<RN, KN>(a, scale, s + u0, kBlock);
  }
}

// Asks for keys and values [from, from + 16) (below `last`) ahead of their use, a tile at a time so that
// the requests spread over the block's work instead of queueing up at its start. Src says where key j's
// and value j's rows are (Flat, or decode_paged.h's Pages); k_bytes, v_bytes: bytes read per row.
template <typename Src>
struct Ahead {
  const Src& src;
  int64_t k_bytes, v_bytes, last;
  void operator()(int64_t from) const {
    const int64_t to = std::min(from + 16, last);
    for (int64_t j = from; j < to; ++j) {
      if (!src.present(j)) continue;
      const char* k = reinterpret_cast<const char*>(src.key(j));
      const char* v = reinterpret_cast<const char*>(src.value(j));
      for (int64_t b = 0; b < k_bytes; b += 64) __builtin_prefetch(k + b, 0, 0);
      for (int64_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(v + b, 0, 0);
    }
  }
};

// No asking ahead (keys copied into a buffer the cache holds already: decode_listed.h).
struct NoAhead {
  void operator()(int64_t) const {}
};

// The block's scores s[r][j] (rows kBlock apart) for all R rows: tiles of 16 keys with the rows in
// groups of score_rows<T>(), 2 and 1; the keys past the last whole tile (and every key of an odd head
// dim) row by row.
template <typename T, typename A>
inline void block_scores(const QRows& q, int64_t R, const T* K, int64_t ks, int64_t n, int64_t D, float scale,
                         float* s, const A& ahead, int64_t j0) {
  int64_t j = 0;
  if (tiled<T>(D)) {
    for (; j + 16 <= n; j += 16) {
      ahead(j0 + j + prefetch_keys<T>());
      int64_t r0 = 0;
      if constexpr (score_rows<T>() == 4) {
        for (; r0 + 4 <= R; r0 += 4) tile_rows<4>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
      }
      for (; r0 + 2 <= R; r0 += 2) tile_rows<2>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
      if (r0 < R) tile_rows<1>(q, r0, K + j * ks, ks, D, scale, s + r0 * kBlock + j);
    }
  }
  for (int64_t t = j; t < n; t += 16) ahead(j0 + t + prefetch_keys<T>());
  for (int64_t r = 0; r < R; ++r) scores(q.f + r * D, K + j * ks, ks, n - j, D, scale, s + r * kBlock + j);
}

// Whether block_values runs its tiles for value dim Dv (they keep each 2W columns of a bf16 row's sums
// in the order of decode_simd::load_pair); else it runs decode_rows::accumulate row by row.
constexpr bool grouped_values(int64_t Dv) { return Dv % (2 * W) == 0; }

constexpr int kRegisters = W == 16 ? 32 : 16;  // vector registers (SSE2 and NEON: 16 and 32; 16 is safe)

// The most vectors of columns CV (8, 4 or 2) whose sums for RN rows fit in the registers beside a pair
// of values and a weight (and, for bf16 values, the words they are widened from and the mask).
template <int RN, typename T>
constexpr int strip_vectors() {
  constexpr int spare = std::is_same<T, float>::value ? 3 : 5;
  return RN * 8 + spare <= kRegisters ? 8 : RN * 4 + spare <= kRegisters ? 4 : 2;
}

// acc for RN rows from W * CV columns at a time (CV from strip_vectors, less where Dv asks).
template <int RN, typename T>
ALWAYS_INLINE void rows_in_strips(const float* p, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  using decode_tiles::accumulate_rows;
  constexpr int CV = strip_vectors<RN, T>();
  if (CV >= 8 && Dv % (8 * W) == 0) {
    accumulate_rows<RN, CV >= 8 ? 8 : 2>(p, kBlock, V, vs, n, Dv, acc);
  } else if (CV >= 4 && Dv % (4 * W) == 0) {
    accumulate_rows<RN, CV >= 4 ? 4 : 2>(p, kBlock, V, vs, n, Dv, acc);
  } else {
    accumulate_rows<RN, 2>(p, kBlock, V, vs, n, Dv, acc);
  }
}

// acc[r] += sum_j p[r][j] V[j] for all R rows (p: rows kBlock apart; acc: rows Dv apart). Where Dv
// allows (grouped_values), each value is loaded for several rows at once. On AVX-512 with Dv = 128,
// two query rows take whole value rows (read in order, which reads faster). Otherwise the first row
// reads each value row whole and in order, its sums in memory (decode_tiles::accumulate_in_order),
// which draws the block's values into the cache in the order memory streams them; the other rows then
// take them from the cache three at a time, in strips of columns (read straight from memory, strips
// read slower).
template <typename T>
inline void block_values(const float* p, int64_t R, const T* V, int64_t vs, int64_t n, int64_t Dv, float* acc) {
  using decode_tiles::accumulate_rows;
  if (!grouped_values(Dv)) {
    for (int64_t r = 0; r < R; ++r) accumulate(p + r * kBlock, V, vs, n, Dv, acc + r * Dv);
    return;
  }
  int64_t r0 = 0;
#if defined(__AVX512F__)
  if (Dv == 128) {  // whole rows, two query rows at a time
    for (; r0 + 2 <= R; r0 += 2) accumulate_rows<2, 8>(p + r0 * kBlock, kBlock, V, vs, n, Dv, acc + r0 * Dv);
    if (r0 < R) accumulate_rows<1, 8>(p + r0 * kBlock, kBlock, V, vs, n, Dv, acc + r0 * Dv);
    return;
  }
#endif
  decode_tiles::accumulate_in_order(p, V, vs, n, Dv, acc);
  for (r0 = 1; r0 + 3 <= R; r0 += 3) rows_in_strips<3>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
  if (R - r0 == 2) rows_in_strips<2>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
  if (R - r0 == 1) rows_in_strips<1>(p + r0 * kBlock, V, vs, n, Dv, acc + r0 * Dv);
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
  if (klo < khi) mx = decode_tiles::block_max(sr, klo, khi, mx);
  if (mx == -kInf) {  // nothing kept yet (scores of -inf, or masked): weights 0
    for (int64_t j = 0; j < n; ++j) {
      sr[j] = j >= klo && j < khi && sr[j] != sr[j] ? sr[j] : 0.0f;  // NaN stays NaN
      w.l[r] += sr[j];
    }
    return;
  }
  const float sum = decode_tiles::block_exp(sr, n, klo, khi, mx);
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
  QRows q{a.q + row0 * D, a.q + row0 * D, nullptr};  // p: in order, unless the key type splits pairs
  if (!decode_simd::split_pairs<T>() || !tiled<T>(D)) return q;
#if defined(__AVX512BF16__)
  if (a.qb && std::is_same<T, uint16_t>::value) {
    q.b = a.qb + row0 * D;
    return q;
  }
#endif
  for (int64_t r = 0; r < R; ++r)  // each 2W columns: the even ones, then the odd ones
    for (int64_t c = 0; c < D; c += 2 * W)
      for (int64_t t = 0; t < W; ++t) {
        w.qp[r * D + c + t] = q.f[r * D + c + 2 * t];
        w.qp[r * D + c + W + t] = q.f[r * D + c + 2 * t + 1];
      }
  q.p = w.qp;
  return q;
}

// Row r's output (Dv floats at o) from its sums: acc / l, exactly 0 where the row keeps no key.
template <typename T>
inline void finish_row(const Args& a, bool keeps, float* o, int64_t r, const Scratch& w) {
  const int64_t Dv = a.Dv;
  const bool interleaved = decode_simd::split_pairs<T>() && grouped_values(Dv);  // acc: even, odd columns
  const float* ar = w.acc + r * Dv;
  const float l = w.l[r];
  const float inv = !keeps || l == 0.0f ? 0.0f : 1.0f / l;  // no key: exactly 0
  for (int64_t c = 0; c < Dv; ++c) {
    const int64_t from = interleaved ? c / (2 * W) * (2 * W) + (c & 1) * W + c % (2 * W) / 2 : c;
    o[c] = inv == 0.0f ? 0.0f : ar[from] * inv;
  }
}

// Rows 0..R-1 (Dv apart from out), every one keeping keys or none.
template <typename T>
inline void finish_rows(const Args& a, int64_t R, bool keeps, float* out, const Scratch& w) {
  for (int64_t r = 0; r < R; ++r) finish_row<T>(a, keeps, out + r * a.Dv, r, w);
}

}  // namespace decode_head
