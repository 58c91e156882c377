// The decode step over listed rows (Mask.sparse): for sequence row b (one query each), every kv head
// reads the distinct cache slots among idx[b, 0 .. hi[b]) (all K when hi is null) of k and v and nothing
// else: -1 (a free slot) and a slot listed again are skipped, the rest read in increasing order. Each
// block of listed slots is copied into a small contiguous buffer, then runs through decode_head.h's
// score tiles, online softmax and value tiles, as a block of consecutive keys does there (lo = 0,
// hi = the distinct count).
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "decode_head.h"

namespace decode_listed {

using namespace decode_head;

// The distinct slots >= 0 among in[0 .. n), increasing, written to out; returns how many.
inline int64_t distinct_slots(const int64_t* in, int64_t n, int64_t* out) {
  std::copy(in, in + n, out);
  if (!std::is_sorted(out, out + n)) std::sort(out, out + n);  // a list sorted already is read as it is
  int64_t kept = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (out[j] >= 0 && (kept == 0 || out[j] != out[kept - 1])) out[kept++] = out[j];
  }
  return kept;
}

template <typename T>
void one_listed_head(const Args& a, const int64_t* idx, int64_t K, int64_t count, int64_t b, int64_t hk,
                     Scratch& w, std::vector<T>& kc, std::vector<T>& vc) {
  const int64_t G = a.H / a.Hkv, R = G, D = a.D, Dv = a.Dv;
  const QRows q = query_rows<T>(a, b, hk, w);  // Lq = 1: the G rows of this kv head
  const T* Kb = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* Vb = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  const int64_t* slots = idx + b * K;
  for (int64_t r = 0; r < R; ++r) {
    w.m[r] = a.sinks ? a.sinks[hk * G + r] : -kInf;
    w.l[r] = a.sinks ? 1.0f : 0.0f;
  }
  std::fill(w.acc, w.acc + w.acc_size, 0.0f);
  const NoAhead none;  // the buffer is in the cache already
  const int64_t distance = prefetch_keys<T>();  // listed rows asked for ahead of their copy: scattered rows
  auto ask = [&](int64_t j) {                    // wait on memory one by one unless several are in flight
    if (j >= count) return;
    const char *kr = reinterpret_cast<const char*>(Kb + slots[j] * a.k_sm),
               *vr = reinterpret_cast<const char*>(Vb + slots[j] * a.v_sm);
    for (int64_t b = 0; b < D * int64_t(sizeof(T)); b += 64) __builtin_prefetch(kr + b, 0, 0);
    for (int64_t b = 0; b < Dv * int64_t(sizeof(T)); b += 64) __builtin_prefetch(vr + b, 0, 0);
  };
  for (int64_t j = 0; j < distance; ++j) ask(j);
  for (int64_t j0 = 0; j0 < count; j0 += block_keys<T>()) {
    const int64_t n = std::min(block_keys<T>(), count - j0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = slots[j0 + j];
      ask(j0 + j + distance);
      std::memcpy(kc.data() + j * D, Kb + slot * a.k_sm, D * sizeof(T));
      std::memcpy(vc.data() + j * Dv, Vb + slot * a.v_sm, Dv * sizeof(T));
    }
    block_scores(q, R, kc.data(), D, n, D, a.scale, w.s, none, j0);
    for (int64_t r = 0; r < R; ++r) softmax_row(a, b, hk, r, j0, n, 0, count, w.s + r * kBlock, w);
    block_values(w.s, R, vc.data(), Dv, n, Dv, w.acc);
  }
  finish_rows<T>(a, R, count > 0, a.out + (b * a.H + hk * G) * Dv, w);
}

template <typename T>
void run_listed(const Args& a, const int64_t* idx, int64_t K) {
  std::vector<int64_t> slots(a.B * K), counts(a.B);  // each row's distinct slots, shared by its kv heads
  at::parallel_for(0, a.B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      counts[b] = distinct_slots(idx + b * K, a.hi ? a.hi[b] : K, slots.data() + b * K);
    }
  });
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch w(a.H / a.Hkv, a.D, a.Dv);
    std::vector<T> kc(block_keys<T>() * a.D), vc(block_keys<T>() * a.Dv);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / a.Hkv;
      one_listed_head<T>(a, slots.data(), K, counts[b], b, t % a.Hkv, w, kc, vc);
    }
  });
}

}  // namespace decode_listed
