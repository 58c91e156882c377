"""multihead.parallel: attention across processes with torch.distributed (gloo on CPU, NCCL on GPU).

    shard_heads(module, mesh)                          heads across ranks: DTensor tensor parallel
    ring_attention(q, k, v, mask, causal=, group=)     sequence across ranks: K/V blocks pass around a ring
    ulysses_attention(q, k, v, mask, causal=, group=)  sequence across ranks: all-to-all to head shards and back
    shard_sequence(x, causal=, group=)                 this rank's shard of a full sequence (zig-zag when causal)
    unshard_sequence(x, causal=, group=)               the full sequence back from every rank's shard

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
