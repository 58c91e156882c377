"""Project the measured communication model onto GPU clusters: how long one attention layer talks
and computes per rank, for heads, ring and Ulysses sharding.

    python -m multihead.parallel.projection      # the Markdown table in docs/parallel.md

Bytes come from multihead.parallel.cost (checked byte for byte against the collectives on gloo);
bandwidths and the compute rate are assumptions, stated in ASSUMPTIONS and in the docs:

    compute     attention FLOPs per rank (4 B H N^2 D, halved when causal, split over P ranks)
                at an achieved rate
    ring        P-1 steps; each step sends one K/V block to the next rank while computing a tile:
                per step max(compute, block / link); the slowest link is InfiniBand once the ring
                leaves a node. It overlaps, so only the excess over compute is exposed.
    Ulysses     two all-to-alls before and after the attention, not overlapped: a rank's bytes
                to ranks in its node go over NVLink, to other nodes over its InfiniBand port,
                both at once.
    heads       one all_reduce of the (B, N, E) output per layer, not overlapped, within a node.
"""
from __future__ import annotations

from dataclasses import dataclass

from multihead.parallel import cost


@dataclass(frozen=True)
class Cluster:
    """Per-GPU rates: bandwidths in GB/s (1e9 bytes/s) per direction, after an efficiency factor."""

    gpus_per_node: int = 8
    nvlink_gb_s: float = 0.8 * 450  # H100 SXM: NVLink 4, 900 GB/s both directions together
    infiniband_gb_s: float = 0.8 * 50  # InfiniBand NDR: 400 Gb/s per port, one port per GPU
    tflops: float = 400.0  # bf16 attention achieved (peak 989 dense); flash-attention kernels reach 35-75%


@dataclass(frozen=True)
class Layer:
    """One attention layer's shapes: a Llama-3-8B-like layer at a long context, bf16."""

    B: int = 1
    N: int = 131072
    H: int = 32
    Hkv: int = 8
    D: int = 128
    item: int = 2
    causal: bool = True
    layout: str = "zigzag"  # the balanced layout: the FLOPs split evenly over P

    @property
    def E(self) -> int:
        return self.H * self.D


ASSUMPTIONS = Cluster()


def compute_ms(layer: Layer, P: int, c: Cluster) -> float:
    """Forward attention FLOPs of one rank, in ms at the achieved rate."""
    flops = 4 * layer.B * layer.H * layer.N**2 * layer.D * (0.5 if layer.causal else 1.0) / P
    return flops / (c.tflops * 1e12) * 1e3


def ring(layer: Layer, P: int, c: Cluster) -> dict:
    sent = cost.ring_bytes(B=layer.B, Hkv=layer.Hkv, D=layer.D, Dv=layer.D, N=layer.N, P=P, rank=0,
                           layout=layer.layout, item=layer.item)
    link = c.nvlink_gb_s if P <= c.gpus_per_node else c.infiniband_gb_s
    talk = cost.seconds(sent, link) * 1e3
    work = compute_ms(layer, P, c)
    return {"sent": sent, "comm": talk, "compute": work, "exposed": max(0.0, talk - work)}


def ulysses(layer: Layer, P: int, c: Cluster) -> dict:
    sent = cost.ulysses_bytes(B=layer.B, H=layer.H, Hkv=layer.Hkv, D=layer.D, Dv=layer.D, N=layer.N, P=P, rank=0,
                              layout=layer.layout, item=layer.item)
    local = min(P, c.gpus_per_node)
    off_node = sent * (P - local) / (P - 1)  # all-to-all peers are spread evenly over the ranks
    talk = max(cost.seconds(sent - off_node, c.nvlink_gb_s), cost.seconds(off_node, c.infiniband_gb_s)) * 1e3
    return {"sent": sent, "comm": talk, "compute": compute_ms(layer, P, c), "exposed": talk}


def heads(layer: Layer, P: int, c: Cluster) -> dict:
    sent = cost.heads_bytes(B=layer.B, L=layer.N, E=layer.E, O=layer.E, P=P, item=layer.item)
    talk = cost.seconds(sent, c.nvlink_gb_s) * 1e3
    return {"sent": sent, "comm": talk, "compute": compute_ms(layer, P, c), "exposed": talk}


def table(layer: Layer = Layer(), c: Cluster = ASSUMPTIONS, world_sizes=(8, 16, 32, 64)) -> str:
    """The projection as Markdown: one row per (P, method) that can run at that P."""
    rows = ["| GPUs (nodes) | method | sent per GPU per layer | comm ms | attention ms | exposed comm ms |",
            "|---|---|---|---|---|---|"]
    for P in world_sizes:
        nodes = max(1, P // c.gpus_per_node)
        methods = [("ring", ring)]
        if layer.H % P == 0 and (layer.Hkv % P == 0 or P % layer.Hkv == 0):
            methods.append(("Ulysses", ulysses))
        if P <= c.gpus_per_node:
            methods.append(("heads (tensor parallel)", heads))
        for name, model in methods:
            m = model(layer, P, c)
            rows.append(f"| {P} ({nodes}) | {name} | {m['sent'] / 1e6:,.0f} MB | {m['comm']:.2f} | "
                        f"{m['compute']:.1f} | {m['exposed']:.2f} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
