"""The communication the parallel attentions use, each a thin layer over torch.distributed.

    resolve_group(group)              None (the default group), a ProcessGroup or a 1-D DeviceMesh
    all_gather_ints(row, group)       one small int64 row per rank -> (P, W) list of lists (checks)
    all_gather_uneven(x, dim, group)  every rank's tensor, whatever its length along `dim`
    ring_exchange(send, recv, group)  send to rank r+1 and receive from rank r-1, point to point
    AllToAll.apply(x, out, in, group) all_to_all_single on flat tensors, differentiable

Every call goes through `torch.distributed`'s public functions, so the group's timeout bounds
every wait, and `multihead.parallel.traffic.count_traffic` sees every tensor that is sent.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from multihead.errors import AttentionError


def resolve_group(group):
    """The ProcessGroup behind `group` (None: the default group). AttentionError for anything else."""
    if not (dist.is_available() and dist.is_initialized()):
        raise AttentionError("torch.distributed is not initialised; call torch.distributed.init_process_group "
                             "(with a timeout) on every rank first.")
    if group is None:
        return dist.group.WORLD
    if isinstance(group, dist.ProcessGroup):
        return group
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise AttentionError(f"group as a DeviceMesh must be 1-D; got a {group.ndim}-D mesh {tuple(group.shape)}. "
                                 "Pass mesh[\"<dim name>\"] or mesh.get_group(<dim>).")
        return group.get_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise AttentionError("this rank is not a member of `group`; only its members may call with it.")
    raise AttentionError(f"group must be None, a torch.distributed ProcessGroup or a 1-D DeviceMesh; "
                         f"got {type(group).__name__}.")


def group_size(group) -> int:
    return dist.get_world_size(resolve_group(group))


def group_rank(group) -> int:
    return dist.get_rank(resolve_group(group))


def global_rank(group, rank: int) -> int:
    """The default-group rank of `group`'s rank `rank` (point-to-point calls address global ranks)."""
    return dist.get_global_rank(group, rank) if group is not dist.group.WORLD else rank


def small_tensor_device(group) -> torch.device:
    """Where the group's small bookkeeping tensors live: CPU for gloo, the current GPU for NCCL."""
    backend = str(dist.get_backend(group))
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def all_gather_ints(row: list[int], group) -> list[list[int]]:
    """Every rank's `row` (the same width everywhere), in rank order. One small all_gather."""
    device = small_tensor_device(group)
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return torch.stack(rows).tolist()


def all_gather_uneven(x: torch.Tensor, dim: int, group, lengths: list[int] | None = None) -> list[torch.Tensor]:
    """Every rank's `x`, which may differ in length along `dim` only; in rank order.

    lengths: every rank's length along `dim` when the caller already knows them (else one small gather).
    The shards are padded to the longest, gathered, and cut back.
    """
    group = resolve_group(group)
    if lengths is None:
        lengths = [row[0] for row in all_gather_ints([x.shape[dim]], group)]
    longest = max(lengths)
    padded = x
    if x.shape[dim] < longest:
        pad_shape = list(x.shape)
        pad_shape[dim] = longest - x.shape[dim]
        padded = torch.cat([x, x.new_zeros(pad_shape)], dim)
    padded = padded.contiguous()
    gathered = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(gathered, padded, group=group)
    return [t.narrow(dim, 0, n) for t, n in zip(gathered, lengths)]


class Pending:
    """Receives posted by `ring_exchange`; `wait()` returns the received tensors once they arrived."""

    def __init__(self, works, received: list[torch.Tensor], sent: list[torch.Tensor]):
        self.works, self.received = works, received
        self.sent = sent  # kept alive until the sends complete

    def wait(self) -> list[torch.Tensor]:
        for work in self.works:
            work.wait()
        return self.received


def ring_exchange(send: list[torch.Tensor], recv_like: list[tuple[tuple[int, ...], torch.dtype]], group) -> Pending:
    """Post sends of `send` to the next rank and receives of `recv_like` (shape, dtype) from the previous.

    Returns at once; the caller computes meanwhile and calls `.wait()`. With one rank nothing moves.
    """
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    if P == 1:
        return Pending([], list(send), [])
    device = send[0].device
    received = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in recv_like]
    nxt, prev = global_rank(group, (rank + 1) % P), global_rank(group, (rank - 1) % P)
    sent = [t.contiguous() for t in send]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in sent]
    ops += [dist.P2POp(dist.irecv, t, prev, group) for t in received]
    return Pending(dist.batch_isend_irecv(ops), received, sent)


class AllToAll(torch.autograd.Function):
    """all_to_all_single of a flat tensor: `in_splits[j]` elements go to rank j, `out_splits[j]` come
    from rank j. Its gradient is the same exchange run backwards (the split lists swapped)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty(sum(out_splits))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return AllToAll.apply(grad.contiguous(), in_splits, out_splits, ctx.group), None, None, None
