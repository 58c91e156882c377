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

#include <algorithm>
#include <cstdint>
#include <vector>

#include "decode_pass.h"

namespace decode_paged {

using decode_head::Args;

// Where key t of one sequence and kv head lies: page table[t / ps], slot t % ps (by shifts and masks when ps
// is a power of two: a division per key cost more than the key's arithmetic, 2 to 3 times the step's time).
template <typename T>
struct Pages {
  const int32_t* table;  // this sequence's row of the block table
  int64_t ps;            // tokens per page
  int shift;             // log2(ps) when ps is a power of two, else -1
  const T* K;            // kv head hk of page 0
  const T* V;
  int64_t k_page, v_page, ks, vs;  // page and slot strides
  const float* k_scale;  // kv head hk of page 0's scales; nullptr: not codes
  const float* v_scale;
  int64_t s_page;
  int64_t page(int64_t t) const { return shift >= 0 ? t >> shift : t / ps; }
  int64_t slot(int64_t t) const { return shift >= 0 ? t & (ps - 1) : t % ps; }
  bool present(int64_t t) const { return table[page(t)] >= 0; }
  int64_t run_end(int64_t t) const { return (page(t) + 1) * ps; }
  const T* key(int64_t t) const { return K + table[page(t)] * k_page + slot(t) * ks; }
  const T* value(int64_t t) const { return V + table[page(t)] * v_page + slot(t) * vs; }
  const float* key_scale(int64_t t) const { return k_scale + table[page(t)] * s_page + slot(t); }
  const float* value_scale(int64_t t) const { return v_scale + table[page(t)] * s_page + slot(t); }
};

inline int log2_exact(int64_t n) {  // log2(n) for a power of two, else -1
  return n > 0 && (n & (n - 1)) == 0 ? __builtin_ctzll(static_cast<unsigned long long>(n)) : -1;
}

constexpr int64_t kAheadKeys = 64;  // the least keys ahead of the block that its heads' pages are asked for
// Pages are asked for into the L2 cache (hint 2): into L1 only (hint 0, as the contiguous step asks for its
// rows, which the hardware prefetcher streams into L2 anyway) the paged step ran 2x slower.
constexpr int kLocality = 2;

// Asks for keys [from, to) of one head (within one page: the caller's block) ahead of their use.
template <typename T>
inline void ask(const Pages<T>& src, int64_t from, int64_t to, int64_t D, int64_t Dv) {
  if (from >= to || !src.present(from)) return;
  to = std::min(to, src.run_end(from));
  const char* k = reinterpret_cast<const char*>(src.key(from));
  const char* v = reinterpret_cast<const char*>(src.value(from));
  const int64_t kb = ((to - from - 1) * src.ks + D) * sizeof(T), vb = ((to - from - 1) * src.vs + Dv) * sizeof(T);
  for (int64_t o = 0; o < kb; o += 64) __builtin_prefetch(k + o, 0, kLocality);
  for (int64_t o = 0; o < vb; o += 64) __builtin_prefetch(v + o, 0, kLocality);
}

// The kv heads [h0, h1) of sequence b, interleaved page by page: a block (up to kBlock keys of present pages)
// reads each page's keys for every head in turn, then the softmax of every head, then each page's values for
// every head in turn, so that memory sees each page's heads one after the other, in order. (Blocks of one
// page of 16 measured 10 to 20% slower: the softmax's bookkeeping four times as often.) Read head by
// head instead, each head's slice of a page (page_size * D elements) sits Hkv slices from the next one,
// and the cold step ran at half the contiguous step's speed with pages of 16 (the hardware prefetcher
// follows runs of addresses, not a table).
template <typename T>
void heads_of_pages(const Args& a, const int32_t* table, int64_t pages_per_seq, int64_t ps, int64_t b, int64_t h0,
                    int64_t h1, std::vector<decode_head::Scratch>& scratch) {
  std::vector<Pages<T>> srcs;
  std::vector<decode_head::HeadPass<T>> passes;
  srcs.reserve(h1 - h0);
  passes.reserve(h1 - h0);
  for (int64_t hk = h0; hk < h1; ++hk) {
    srcs.push_back({table + b * pages_per_seq, ps, log2_exact(ps),
                    static_cast<const T*>(a.k) + hk * a.k_sh, static_cast<const T*>(a.v) + hk * a.v_sh,
                    a.k_sb, a.v_sb, a.k_sm, a.v_sm,
                    a.k_scale ? a.k_scale + hk * a.s_sh : nullptr,
                    a.v_scale ? a.v_scale + hk * a.s_sh : nullptr, a.s_sb});
    passes.emplace_back(a, b, hk, scratch[hk - h0]);
  }
  const Pages<T>& first_src = srcs[0];
  const int64_t first = passes[0].first, last = passes[0].last;  // the same for every head of b
  const decode_head::NoAhead none;
  const int64_t ahead = std::max<int64_t>(ps, kAheadKeys);  // keys ahead asked for
  const int64_t H = h1 - h0;
  for (int64_t j0 = first; j0 < last;) {
    if (!first_src.present(j0)) {  // a missing page: its keys are not there
      j0 = std::min(last, first_src.run_end(j0));
      continue;
    }
    const int64_t end = std::min(last, j0 + decode_head::kBlock);
    int64_t j = j0;  // the block: present pages up to `end`
    while (j < end && first_src.present(j)) j = std::min(end, first_src.run_end(j));
    const int64_t n = j - j0;
    for (int64_t o = 0, m; o < n; o += m) {  // each page's keys, head after head
      m = std::min(n, first_src.run_end(j0 + o) - j0) - o;
      for (int64_t h = 0; h < H; ++h) {
        ask(srcs[h], j0 + o + ahead, std::min(last, j0 + o + ahead + m), a.D, a.Dv);
        passes[h].run_scores(srcs[h], none, j0, o, m);
      }
    }
    for (int64_t h = 0; h < H; ++h) passes[h].softmax(j0, n);
    for (int64_t o = 0, m; o < n; o += m) {  // each page's values, head after head
      m = std::min(n, first_src.run_end(j0 + o) - j0) - o;
      for (int64_t h = 0; h < H; ++h) passes[h].run_values(srcs[h], j0, o, m);
    }
    j0 = j;
  }
  for (auto& pass : passes) pass.finish();
}

template <typename T>
void run_paged(const Args& a, const int32_t* table, int64_t pages_per_seq, int64_t ps) {
  const int64_t R = (a.H / a.Hkv) * a.Lq;
  at::parallel_for(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<decode_head::Scratch> scratch;
    for (int64_t h = 0; h < std::min(a.Hkv, end - begin); ++h) scratch.emplace_back(R, a.D, a.Dv);
    for (int64_t t = begin; t < end;) {  // the heads of one sequence in this thread's range, together
      const int64_t b = t / a.Hkv, h0 = t % a.Hkv, h1 = std::min(a.Hkv, h0 + (end - t));
      heads_of_pages<T>(a, table, pages_per_seq, ps, b, h0, h1, scratch);
      t += h1 - h0;
    }
  });
}

}  // namespace decode_paged
