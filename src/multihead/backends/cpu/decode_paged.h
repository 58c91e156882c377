// The decode step over paged keys and values, read in place through a block table (no gather):
//   k pages (P, Hkv, page_size, D), v pages (P, Hkv, page_size, Dv): fp32, bf16, int8 or fp8 e4m3 codes;
//     strides (in elements) along (page, head, slot) passed as Args' k_sb, k_sh, k_sm (v alike)
//   k_scale, v_scale (P, Hkv, page_size) float32 for codes (strides s_sb, s_sh along page and head), else null
//   table (B, pages_per_seq) int32: token t of sequence b is slot t % page_size of page table[b, t / page_size];
//     -1: no page (its keys are not read: they count as masked)
//   lo, hi (B, Lq): row (b, i) keeps keys lo <= t < hi (hi <= pages_per_seq * page_size: the caller checks)
// The same blocks, tiles and online softmax as a contiguous cache (decode_head.h's head_over): a block is
// made of runs of one page each, and the tiles of 16 keys read a page's slots where they lie.
#pragma once
#include <ATen/Parallel.h>

#include <cstdint>

#include "decode_head.h"

namespace decode_paged {

using decode_head::Args;

// Where key t of one sequence and kv head lies: page table[t / ps], slot t % ps.
template <typename T>
struct Pages {
  const int32_t* table;  // this sequence's row of the block table
  int64_t ps;            // tokens per page
  const T* K;            // kv head hk of page 0
  const T* V;
  int64_t k_page, v_page, ks, vs;  // page and slot strides
  const float* k_scale;  // kv head hk of page 0's scales; nullptr: not codes
  const float* v_scale;
  int64_t s_page;
  bool present(int64_t t) const { return table[t / ps] >= 0; }
  int64_t run_end(int64_t t) const { return (t / ps + 1) * ps; }
  const T* key(int64_t t) const { return K + table[t / ps] * k_page + (t % ps) * ks; }
  const T* value(int64_t t) const { return V + table[t / ps] * v_page + (t % ps) * vs; }
  const float* key_scale(int64_t t) const { return k_scale + table[t / ps] * s_page + t % ps; }
  const float* value_scale(int64_t t) const { return v_scale + table[t / ps] * s_page + t % ps; }
};

template <typename T>
void run_paged(const Args& a, const int32_t* table, int64_t pages_per_seq, int64_t ps) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    decode_head::Scratch w(R, a.D, a.Dv);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / a.Hkv, hk = t % a.Hkv;
      const Pages<T> src{table + b * pages_per_seq, ps,
                         static_cast<const T*>(a.k) + hk * a.k_sh, static_cast<const T*>(a.v) + hk * a.v_sh,
                         a.k_sb, a.v_sb, a.k_sm, a.v_sm,
                         a.k_scale ? a.k_scale + hk * a.s_sh : nullptr,
                         a.v_scale ? a.v_scale + hk * a.s_sh : nullptr, a.s_sb};
      decode_head::head_over<T>(a, b, hk, w, src);
    }
  });
}

}  // namespace decode_paged
