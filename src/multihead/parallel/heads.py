"""shard_heads: tensor parallelism over heads with DTensor (Megatron-style attention).

With P ranks in a 1-D mesh, rank r keeps query heads [r H/P, (r+1) H/P) and key/value heads
[r Hkv/P, (r+1) Hkv/P): q_proj, k_proj and v_proj are split by output rows (ColwiseParallel), so
each rank projects only its heads from the replicated input; out_proj is split by input columns
(RowwiseParallel), so each rank multiplies only its heads' slice and one all_reduce sums the
partial outputs. Since head h uses kv head h // (H/Hkv), each rank holds whole kv groups.

    x (B, L, E), replicated -> q (B, H/P, L, D), k, v (B, Hkv/P, L, D) -> attention on H/P heads
      -> (B, L, H/P*D) -> out_proj slice -> all_reduce -> (B, L, O), replicated

The module reshapes by its own num_heads / num_kv_heads, so shard_heads sets them to the local
counts; `module.head_shards` keeps the global counts and the mesh. Per-head ALiBi slopes are cut to
the local heads; the q/k RMSNorm weights, shared by every head, stay whole and sum their gradients
over the mesh. Per-head sink logits are not sharded yet (AttentionError).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from multihead.errors import AttentionError
from multihead.layers.multi_head import MultiHeadAttention
from multihead.parallel.comm import resolve_group
from multihead.parallel.validation import agree, require_same


@dataclass(frozen=True)
class HeadShards:
    """How a module's heads are split: `mesh`, this rank's place in it, and the global head counts."""

    mesh: object  # torch.distributed.device_mesh.DeviceMesh
    rank: int
    world_size: int
    num_heads: int
    num_kv_heads: int

    @property
    def heads(self) -> range:
        """The global indices of the query heads this rank computes."""
        h = self.num_heads // self.world_size
        return range(self.rank * h, (self.rank + 1) * h)


def shard_heads(module: MultiHeadAttention, mesh) -> MultiHeadAttention:
    """Split `module`'s heads over the ranks of `mesh` (a 1-D DeviceMesh, or a ProcessGroup); in place.

    Every rank calls it with the same module (same weights: rank 0's are used everywhere) and then
    calls the module with the same input x; each rank computes H/P heads and every rank gets the
    whole output. World sizes that do not divide H and Hkv raise AttentionError on every rank.
    Returns the module, now holding DTensor projections and num_heads = H/P, num_kv_heads = Hkv/P.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = _as_mesh(mesh, module)
    group = mesh.get_group()

    def describe() -> list[int]:
        _check_module(module, mesh)
        P = mesh.size()
        if module.num_heads % P or module.num_kv_heads % P:
            raise AttentionError(
                f"shard_heads gives each of the {P} ranks whole heads: num_heads={module.num_heads} and "
                f"num_kv_heads={module.num_kv_heads} must both divide by {P}.")
        return [module.num_heads, module.num_kv_heads, module.head_dim, module.embed_dim]

    rows = agree(group, describe, 4, "shard_heads")
    require_same(rows, {"num_heads": 0, "num_kv_heads": 1, "head_dim": 2, "embed_dim": 3}, "shard_heads")
    P, rank = mesh.size(), dist.get_rank(group)
    parallelize_module(module, mesh, {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(),
                                      "v_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
    shards = HeadShards(mesh, rank, P, module.num_heads, module.num_kv_heads)
    module.head_shards = shards
    module.num_heads, module.num_kv_heads = module.num_heads // P, module.num_kv_heads // P
    if module.alibi_slopes is not None:
        module.alibi_slopes = module.alibi_slopes[shards.heads.start:shards.heads.stop].clone()
    for norm in (module.q_norm, module.k_norm):
        if norm is not None and norm.weight is not None:
            norm.weight.register_hook(lambda grad, group=group: _summed(grad, group))
    return module


def _summed(grad: torch.Tensor, group) -> torch.Tensor:
    """A weight shared by every head: each rank saw only its heads, so the gradient is the sum over ranks."""
    total = grad.clone()
    dist.all_reduce(total, group=group)
    return total


def _as_mesh(mesh, module):
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(module, MultiHeadAttention):
        raise AttentionError(f"shard_heads takes a multihead.MultiHeadAttention; got {type(module).__name__}.")
    if isinstance(mesh, dist.ProcessGroup):
        return DeviceMesh.from_group(mesh, module.q_proj.weight.device.type)
    if not isinstance(mesh, DeviceMesh):
        resolve_group(None)  # says so when torch.distributed is not initialised
        raise AttentionError(f"mesh must be a 1-D DeviceMesh (torch.distributed.device_mesh.init_device_mesh) or "
                             f"a ProcessGroup; got {type(mesh).__name__}.")
    if mesh.ndim != 1:
        raise AttentionError(f"shard_heads needs a 1-D mesh of the ranks that split the heads; got a {mesh.ndim}-D "
                             f"mesh of shape {tuple(mesh.shape)}. Pass one dimension, e.g. mesh[\"tp\"].")
    return mesh


def _check_module(module: MultiHeadAttention, mesh) -> None:
    if getattr(module, "head_shards", None) is not None:
        raise AttentionError("this module's heads are already sharded (module.head_shards); shard a fresh module.")
    if module.sinks is not None:
        raise AttentionError("shard_heads does not split per-head sink logits (sinks=True) yet; build the module "
                             "without sinks, or keep it on one device.")
    device = module.q_proj.weight.device.type
    if mesh.device_type != device:
        raise AttentionError(f"the mesh is a {mesh.device_type!r} mesh but the module's parameters are on {device}; "
                             "build the mesh for the device the module lives on.")
