// The pass of one kv head over its keys and values (decode_head.h's blocks, tiles and online softmax), from
// any source of keys: Flat (a contiguous cache: one run) or decode_paged.h's Pages (a run per page).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "decode_head.h"

namespace decode_head {

// One sequence's keys and values in one run (a KVCache's buffers, or a quantized cache's codes), as the
// block loop of one_head reads them: key j's row, its scale, whether it is there (always), and where the
// run that holds it ends (never: one run).
template <typename T>
struct Flat {
  const T* K;
  const T* V;
  int64_t ks, vs;
  const float* k_scale;  // nullptr: not a quantized cache
  const float* v_scale;
  bool present(int64_t) const { return true; }
  int64_t run_end(int64_t) const { return std::numeric_limits<int64_t>::max(); }
  const T* key(int64_t j) const { return K + j * ks; }
  const T* value(int64_t j) const { return V + j * vs; }
  const float* key_scale(int64_t j) const { return k_scale + j; }
  const float* value_scale(int64_t j) const { return v_scale + j; }
};

// Writes rows 0..R-1 of this kv head: out (acc / l, 0 where the row keeps no key) and, when asked, each
// row's log-sum-exp m + log(l) (natural log, -inf where it keeps no key).
template <typename T>
inline void finish_head(const Args& a, int64_t b, int64_t hk, const int64_t* lo, const int64_t* hi, Scratch& w) {
  const int64_t G = a.H / a.Hkv, R = G * a.Lq, row0 = (b * a.H + hk * G) * a.Lq;
  for (int64_t r = 0; r < R; ++r) {
    const bool keeps = lo[r % a.Lq] < hi[r % a.Lq];
    finish_row<T>(a, keeps, a.out + (row0 + r) * a.Dv, r, w);
    if (a.lse) a.lse[row0 + r] = keeps && w.l[r] > 0.0f ? w.m[r] + std::log(w.l[r]) : -kInf;
  }
}

// The pass of kv head hk of sequence b in steps: set up (query rows, sinks, the range [first, last) of keys any
// row keeps), one block of n consecutive keys from j0 at a time (`block`), then the rows written (`finish`).
// head_over runs one head's blocks in order; decode_paged.h interleaves the heads of a page.
template <typename T>
struct HeadPass {
  const Args& a;
  int64_t b, hk;
  Scratch& w;
  QRows q;
  const int64_t *lo, *hi;
  int64_t first = std::numeric_limits<int64_t>::max(), last = 0;

  HeadPass(const Args& a_, int64_t b_, int64_t hk_, Scratch& w_)
      : a(a_), b(b_), hk(hk_), w(w_), q(query_rows<T>(a_, b_, hk_, w_)), lo(a_.lo + b_ * a_.Lq), hi(a_.hi + b_ * a_.Lq) {
    const int64_t G = a.H / a.Hkv, R = G * a.Lq;
    for (int64_t i = 0; i < a.Lq; ++i) {
      if (lo[i] < hi[i]) {
        first = std::min(first, lo[i]);
        last = std::max(last, hi[i]);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      w.m[r] = a.sinks ? a.sinks[hk * G + r / a.Lq] : -kInf;
      w.l[r] = a.sinks ? 1.0f : 0.0f;
    }
    std::fill(w.acc, w.acc + w.acc_size, 0.0f);
  }

  // Keys j0 .. j0+n-1 (n <= kBlock), all present in src, in runs of one piece of memory each: the scores of
  // each run, the softmax of the block, the values of each run.
  template <typename Src, typename A>
  void block(const Src& src, const A& ahead, int64_t j0, int64_t n) {
    for (int64_t o = 0, m; o < n; o += m) {
      m = std::min(n, src.run_end(j0 + o) - j0) - o;
      run_scores(src, ahead, j0, o, m);
    }
    softmax(j0, n);
    for (int64_t o = 0, m; o < n; o += m) {
      m = std::min(n, src.run_end(j0 + o) - j0) - o;
      run_values(src, j0, o, m);
    }
  }

  // The scores of keys j0+o .. j0+o+m-1 (one run), into the block's columns o .. o+m-1.
  template <typename Src, typename A>
  void run_scores(const Src& src, const A& ahead, int64_t j0, int64_t o, int64_t m) {
    const int64_t R = (a.H / a.Hkv) * a.Lq;
    block_scores(q, R, src.key(j0 + o), src.ks, m, a.D, a.scale, w.s + o, ahead, j0 + o);
    if (src.k_scale) decode_simd::fold_scales(w.s + o, R, kBlock, src.key_scale(j0 + o), m);
  }

  void softmax(int64_t j0, int64_t n) {
    const int64_t R = (a.H / a.Hkv) * a.Lq;
    for (int64_t r = 0; r < R; ++r) softmax_row(a, b, hk, r, j0, n, lo[r % a.Lq], hi[r % a.Lq], w.s + r * kBlock, w);
  }

  // The values of keys j0+o .. j0+o+m-1 (one run), weighed by the block's columns o .. o+m-1.
  template <typename Src>
  void run_values(const Src& src, int64_t j0, int64_t o, int64_t m) {
    const int64_t R = (a.H / a.Hkv) * a.Lq;
    if (src.v_scale) decode_simd::fold_scales(w.s + o, R, kBlock, src.value_scale(j0 + o), m);
    block_values(w.s + o, R, src.value(j0 + o), src.vs, m, a.Dv, w.acc);
  }

  void finish() { finish_head<T>(a, b, hk, lo, hi, w); }
};

// Kv head hk of sequence b over the keys and values of src (Flat or Pages): blocks of at most
// block_keys<T>() consecutive keys, each made of runs that lie in one piece of memory (one run for Flat;
// a page each for Pages, where a missing page ends the block and its keys are skipped).
template <typename T, typename Src>
void head_over(const Args& a, int64_t b, int64_t hk, Scratch& w, const Src& src) {
  HeadPass<T> pass(a, b, hk, w);
  const int64_t last = pass.last;
  const Ahead<Src> ahead{src, static_cast<int64_t>(a.D * sizeof(T)), static_cast<int64_t>(a.Dv * sizeof(T)), last};
  for (int64_t j0 = pass.first; j0 < last;) {
    if (!src.present(j0)) {  // a missing page: its keys are not there
      j0 = std::min(last, src.run_end(j0));
      continue;
    }
    const int64_t end = std::min(last, j0 + block_keys<T>());
    int64_t j = j0;  // the block: present runs up to `end`
    while (j < end && src.present(j)) j = std::min(end, src.run_end(j));
    pass.block(src, ahead, j0, j - j0);
    j0 = j;
  }
  pass.finish();
}

template <typename T>
void one_head(const Args& a, int64_t b, int64_t hk, Scratch& w) {
  const T* K = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* V = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  const int64_t s0 = b * a.s_sb + hk * a.s_sh;
  const Flat<T> src{K, V, a.k_sm, a.v_sm, a.k_scale ? a.k_scale + s0 : nullptr, a.v_scale ? a.v_scale + s0 : nullptr};
  head_over<T>(a, b, hk, w, src);
}

}  // namespace decode_head
