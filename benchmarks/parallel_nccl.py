"""multihead.parallel on NCCL, one GPU per process. Never run by the tests; run it on a GPU machine:

    PYTHONPATH=src torchrun --standalone --nproc-per-node=8 benchmarks/parallel_nccl.py \
        --json benchmarks/parallel_nccl.json

1. Equal to one GPU: ring_attention and ulysses_attention (fp32, causal, key padding, GQA, uneven
   shards) against mh.attention on the whole tensors, outputs and the gradients of q, k, v; and
   shard_heads against the whole module. Largest difference over ranks.
2. Bytes counted in NCCL's collectives (multihead.parallel.traffic) against the model
   (multihead.parallel.cost), forward and forward+backward.
3. Time and memory at a long context (default B=1, N=65536, H=32, Hkv=8, D=128, bf16, causal):
   ring and Ulysses, forward and forward+backward, medians of CUDA-event timings (the slowest
   rank), peak memory per rank (torch.cuda.max_memory_allocated over what was allocated before);
   against mh.attention on one GPU holding the whole sequence (rank 0 alone).
Rank 0 prints the results and one JSON line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
import torch.distributed as dist

import multihead as mh
from multihead import parallel
from multihead.parallel import cost
from multihead.parallel.traffic import count_traffic


def largest(x: float) -> float:
    """The largest value of x over ranks."""
    t = torch.tensor([x], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def equality(device) -> dict:
    """Largest |parallel - one GPU| over ranks, per method and quantity (fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    B, H, Hkv, N, D = 2, 8, 4, 1000 + dist.get_world_size() - 1, 64  # N chosen so the shards are uneven
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g).to(device)
    k, v = (torch.randn(B, Hkv, N, D, generator=g).to(device) for _ in range(2))
    dout = torch.randn(B, H, N, D, generator=g).to(device)
    pad = torch.zeros(B, N, dtype=torch.bool, device=device)
    pad[1, -37:] = True
    mask = mh.Mask.key_padding(pad)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = mh.attention(*full, mask, causal=True)
    ref.backward(dout)
    found = {}
    for name, fn in (("ring", parallel.ring_attention), ("ulysses", parallel.ulysses_attention)):
        local = [parallel.shard_sequence(t, layout="zigzag").detach().requires_grad_() for t in (q, k, v)]
        out = fn(*local, mask, causal=True, layout="zigzag")
        out.backward(parallel.shard_sequence(dout, layout="zigzag"))
        for label, mine, theirs in (("out", out, ref), ("dq", local[0].grad, full[0].grad),
                                    ("dk", local[1].grad, full[1].grad), ("dv", local[2].grad, full[2].grad)):
            diff = (mine.detach() - parallel.shard_sequence(theirs.detach(), layout="zigzag")).abs().max()
            found[f"{name} {label}"] = largest(float(diff))
    found.update(heads_equality(device))
    return found


def heads_equality(device) -> dict:
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    P = dist.get_world_size()
    torch.manual_seed(0)
    whole = mh.MultiHeadAttention(64 * P, 2 * P, num_kv_heads=P, device=device)
    sharded = parallel.shard_heads(copy.deepcopy(whole), init_device_mesh("cuda", (P,)))
    x = torch.randn(2, 128, 64 * P, generator=torch.Generator().manual_seed(1)).to(device)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    y_whole, y = whole(xs[0], causal=True), sharded(xs[1], causal=True)
    y_whole.sum().backward()
    y.sum().backward()
    return {"heads out": largest(float((y - y_whole).abs().max())),
            "heads dx": largest(float((xs[1].grad - xs[0].grad).abs().max()))}


def median_ms(fn, rounds: int, warmup: int, together: bool = True) -> float:
    """Median ms of `fn` over `rounds`, timed with CUDA events; together: every rank starts each round
    at a barrier."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        if together:
            dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def peak_rise_mib(fn) -> float:
    """The rise of allocated CUDA memory on this GPU while `fn` runs, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def long_context(args, device) -> list[dict]:
    P, rank = dist.get_world_size(), dist.get_rank()
    B, H, Hkv, N, D = 1, args.heads, args.kv_heads, args.length, args.head_dim
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device=device).manual_seed(rank)
    L = parallel.layout.shard_lengths(N, P, "zigzag")[rank]
    q = torch.randn(B, H, L, D, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hkv, L, D, generator=g, device=device, dtype=dtype) for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    item = torch.finfo(dtype).bits // 8
    shape = dict(B=B, Hkv=Hkv, D=D, Dv=D, N=N, P=P, rank=rank, layout="zigzag", item=item)
    rows = []
    for name, fn, model in (("ring", parallel.ring_attention, lambda bwd: cost.ring_bytes(**shape, backward=bwd)),
                            ("ulysses", parallel.ulysses_attention,
                             lambda bwd: cost.ulysses_bytes(**shape, H=H, backward=bwd))):
        if name == "ulysses" and (H % P or (Hkv % P and P % Hkv)):
            continue

        def forward(fn=fn):
            with torch.no_grad():
                fn(q, k, v, causal=True, layout="zigzag")

        def step(fn=fn):
            torch.autograd.grad(fn(*leaves, causal=True, layout="zigzag").sum(), leaves)

        for pass_, call in (("forward", forward), ("forward+backward", step)):
            with count_traffic() as traffic:
                call()
            sent = traffic.total - traffic.sent["all_gather"]
            rows.append({"method": name, "pass": pass_, "ms": largest(median_ms(call, args.rounds, 2)),
                         "peak MiB/rank": largest(peak_rise_mib(call)), "sent MB/rank": largest(sent / 1e6),
                         "model MB/rank": largest(model(pass_ != "forward") / 1e6)})
    rows += one_gpu(B, H, Hkv, N, D, dtype, device, args) if rank == 0 else []
    dist.barrier()
    return rows


def one_gpu(B, H, Hkv, N, D, dtype, device, args) -> list[dict]:
    """mh.attention on the whole sequence on this GPU alone (no collectives: rank 0 only)."""
    try:
        q = torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, Hkv, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    except torch.OutOfMemoryError:
        return [{"method": "one GPU", "pass": "-", "note": "the whole sequence does not fit one GPU"}]
    calls = {"forward": lambda: mh.attention(q.detach(), k.detach(), v.detach(), causal=True),
             "forward+backward": lambda: torch.autograd.grad(mh.attention(q, k, v, causal=True).sum(), (q, k, v))}
    return [{"method": "one GPU", "pass": pass_, "ms": median_ms(call, args.rounds, 2, together=False),
             "peak MiB/rank": peak_rise_mib(call)} for pass_, call in calls.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the JSON line here (rank 0)")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=300), device_id=device)
    try:
        result = {"world_size": dist.get_world_size(), "gpu": torch.cuda.get_device_name(device),
                  "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                  "equality (largest |diff|, fp32)": equality(device), "long context": long_context(args, device),
                  "sizes": vars(args)}
        if dist.get_rank() == 0:
            for key, value in result["equality (largest |diff|, fp32)"].items():
                print(f"{key:>12}: {value:.2e}")
            for row in result["long context"]:
                print(row)
            line = json.dumps(result)
            print(line)
            if args.json:
                with open(args.json, "w") as f:
                    f.write(line + "\n")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
