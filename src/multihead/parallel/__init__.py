"""multihead.parallel: attention across processes with torch.distributed (gloo on CPU, NCCL on GPU).

    shard_heads(module, mesh)                          heads across ranks: DTensor tensor parallel
    ring_attention(q, k, v, mask, causal=, layout=, group=)     sequence across ranks: K/V blocks pass a ring
    ulysses_attention(q, k, v, mask, causal=, layout=, group=)  sequence across ranks: all-to-all to heads and back
    shard_sequence(x, layout=, group=)                          this rank's shard of a full sequence
    unshard_sequence(x, layout=, group=)                        the full sequence back from every rank's shard

layout= is required: "contiguous" (rank r holds the r-th of P runs) or "zigzag" (chunks r and 2P-1-r
of 2P, which balances causal work). Both are exact for every mask; it never follows from causal.

Each is equal to one process running mh.attention on the whole tensors, forward and backward, and
bad input raises AttentionError on every rank instead of leaving the others waiting. See
docs/parallel.md for the design and when to choose which.
"""
from multihead.parallel.heads import HeadShards, shard_heads
from multihead.parallel.layout import sequence_segments, shard_sequence, unshard_sequence
from multihead.parallel.ring import ring_attention
from multihead.parallel.ulysses import ulysses_attention

__all__ = [
    "HeadShards",
    "ring_attention",
    "sequence_segments",
    "shard_heads",
    "shard_sequence",
    "ulysses_attention",
    "unshard_sequence",
]
