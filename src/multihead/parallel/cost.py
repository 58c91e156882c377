"""The communication model: bytes one rank sends per attention call, from the shapes alone.

Shapes: B batch, H heads, Hkv kv heads, D head dim (Dv for values), N global length, P ranks,
L_r = rank r's shard length, E = H*D, O the output width; `item` bytes per element of the inputs,
`acc` of the gradient accumulators (at least float32).

    ring, forward      the K and V blocks of every rank but the next travel through rank r once:
                       sum_{s != r+1} L_s B Hkv (D + Dv) item  =  (P-1)/P  N B Hkv (D+Dv) item  (even shards)
    ring, backward     the K and V blocks again, plus the dK and dV accumulators of every block once:
                       forward  +  N B Hkv (D + Dv) acc
    Ulysses, forward   q, k, v and the output each cross one all-to-all, less the chunk a rank keeps:
                       (P-1)/P (N/P) B (H D + Hkv D + Hkv Dv + H Dv) item  ~  4 N E B item / P   (MHA)
    Ulysses, backward  the same exchanges run backwards: each rank sends what it received in the
                       forward (the same bytes when shards are even)
    heads, forward     one all_reduce of the (B, L, O) output: 2 (P-1)/P B L O item
    heads, backward    one all_reduce of the input's gradient per projection fed by x

These are the volumes `traffic.count_traffic` measures (tests check them byte for byte), and the
basis of the multi-GPU projections in docs/parallel.md.
"""
from __future__ import annotations

from multihead.parallel.layout import shard_lengths


def ring_bytes(*, B: int, Hkv: int, D: int, Dv: int, N: int, P: int, rank: int, layout: str, item: int,
               acc: int = 4, backward: bool = False) -> int:
    """Bytes rank `rank` sends in one ring_attention forward (and backward, if asked)."""
    lengths = shard_lengths(N, P, layout)
    width = B * Hkv * (D + Dv)
    forward = sum(lengths[s] for s in range(P) if s != (rank + 1) % P) * width * item  # 0 when P = 1
    if not backward:
        return forward
    return 2 * forward + (N * width * acc if P > 1 else 0)


def ulysses_bytes(*, B: int, H: int, Hkv: int, D: int, Dv: int, N: int, P: int, rank: int, layout: str,
                  item: int, backward: bool = False) -> int:
    """Bytes rank `rank` sends in one ulysses_attention forward (and backward, if asked).

    Backward runs each exchange the other way: a rank sends what it received in the forward, which
    equals what it sent when the shards are even.
    """
    L = shard_lengths(N, P, layout)[rank]
    kv_heads = max(Hkv, P)  # fewer kv heads than ranks: each is repeated to P heads before the exchange
    per_position = (H // P) * D + (kv_heads // P) * (D + Dv)  # q, k, v features of one rank's heads
    sent = B * L * (P - 1) * per_position + B * (H // P) * (N - L) * Dv  # q, k, v out; the output back
    received = B * (N - L) * per_position + B * (H // P) * L * (P - 1) * Dv
    return (sent + (received if backward else 0)) * item


def heads_bytes(*, B: int, L: int, E: int, O: int, P: int, item: int, projections_fed_by_x: int = 3,
                backward: bool = False) -> int:
    """Bytes one rank sends in a shard_heads module call: the output's all_reduce (and, backward, one
    all_reduce of x's gradient per projection that reads x)."""
    all_reduce = lambda n: 2 * (P - 1) * n * item // P  # noqa: E731
    forward = all_reduce(B * L * O)
    return forward + (projections_fed_by_x * all_reduce(B * L * E) if backward else 0)


def seconds(num_bytes: float, bandwidth_gb_s: float, latency_us: float = 0.0, messages: int = 0) -> float:
    """Time to send `num_bytes` at `bandwidth_gb_s` (GB/s = 1e9 bytes/s), plus `messages` x latency."""
    return num_bytes / (bandwidth_gb_s * 1e9) + messages * latency_us * 1e-6
