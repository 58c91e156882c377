"""The KV cache in decoding: each step reads the whole cache to do about one FLOP per byte (so memory,
not arithmetic, sets its speed), and the step's single query is the *last* position, so the causal mask
must be aligned bottom-right; with it, the cache's step-by-step outputs are the full forward's rows.

Shapes: B batch, H query heads, Hkv key/value heads, N cached tokens, Lq new tokens, D head dim,
E embed dim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import multihead as mh
from multihead.caches.kv import KVCache
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

KEPT, BLOCKED = "■", "·"


def flop_counts(fn: Callable[[], object]) -> dict[str, int]:
    """FLOPs per aten op ({"bmm": ..., "mm": ...}) that torch's FlopCounterMode counts while fn runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(op).rsplit(".", 1)[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def nbytes(*tensors: torch.Tensor) -> int:
    """Bytes the tensors' elements take."""
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Cost:
    """Work and memory traffic of one computation: FLOPs done per byte moved is its arithmetic intensity."""

    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def decode_step_cost(attn: mh.MultiHeadAttention, context: int, batch: int = 1) -> tuple[Cost, Cost]:
    """(attention, projections) of the decode step of `attn` (built with backend="math", whose matmuls
    torch can count) whose new token is number `context` = N: it attends to N keys, N - 1 cached
    before it. FLOPs: counted by torch (bmm: the attention, mm: the four projections). Bytes: the
    cached keys and values the step attends to, and the projection weights: the least each part
    must read."""
    D, Hkv, dtype = attn.head_dim, attn.num_kv_heads, attn.q_proj.weight.dtype
    cache = attn.new_cache(batch, context)
    cache.append(*(torch.randn(batch, Hkv, context - 1, D, dtype=dtype) for _ in range(2)))   # N - 1 cached
    token = torch.randn(batch, 1, attn.embed_dim, dtype=dtype)                              # (B, 1, E)
    with torch.no_grad():
        counts = flop_counts(lambda: attn(token, cache=cache))
    read = cache.keys, cache.values                                                         # (B, Hkv, N, D)
    weights = [proj.weight for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)]
    return (Cost(counts.get("bmm", 0), nbytes(*read)),
            Cost(counts.get("mm", 0) + counts.get("addmm", 0), nbytes(*weights)))


def prefill_attention_cost(H: int, Hkv: int, N: int, D: int, dtype: torch.dtype) -> Cost:
    """All N queries at once (causal, math backend: the whole (N, N) score matrix, the masked half
    included), counted by torch on meta tensors (shapes only, nothing computed). Bytes: q, k, v read
    and the output written, once each."""
    q = torch.empty(1, H, N, D, dtype=dtype, device="meta")
    k, v = (torch.empty(1, Hkv, N, D, dtype=dtype, device="meta") for _ in range(2))
    counts = flop_counts(lambda: mh.attention(q, k, v, causal=True, backend="math"))
    return Cost(counts["bmm"], nbytes(q, k, v, q))                                   # out is shaped like q


def gemm_cost(n: int, dtype: torch.dtype) -> Cost:
    """An (n, n) @ (n, n) matrix product, counted by torch on meta tensors: 2 n³ FLOPs on 3 n² numbers."""
    a, b = (torch.empty(n, n, dtype=dtype, device="meta") for _ in range(2))
    return Cost(flop_counts(lambda: a @ b)["mm"], nbytes(a, b, a))


def keep_rows(keep: torch.Tensor | None, Lq: int, Lk: int) -> list[str]:
    """A keep mask (Lq, Lk) (None: keeps all) as one line per query: ■ = may attend, · = blocked."""
    keep = torch.ones(Lq, Lk, dtype=torch.bool) if keep is None else keep.reshape(-1, Lq, Lk)[0]
    return ["".join(KEPT if kept else BLOCKED for kept in row) for row in keep.tolist()]


def causal_rows(align: str, Lq: int, Lk: int) -> list[str]:
    """`keep_rows` of Mask.causal(align) for Lq queries and Lk keys."""
    keep, _ = mh.Mask.causal(align).materialize(1, 1, Lq, Lk)
    return keep_rows(keep, Lq, Lk)


def decode_step_by_step(attn: mh.MultiHeadAttention, x: torch.Tensor,
                        prompt: int) -> tuple[list[torch.Tensor], KVCache]:
    """Outputs of `attn` on x (B, L, E) with a KV cache: the first `prompt` tokens in one call (prefill),
    then one token per call. Returns ([(B, prompt, E), (B, 1, E), ...], the cache)."""
    B, L, _ = x.shape
    cache = attn.new_cache(B, L)
    with torch.no_grad():
        outs = [attn(x[:, :prompt], cache=cache)]
        outs += [attn(x[:, i:i + 1], cache=cache) for i in range(prompt, L)]
    return outs, cache


def turned_keys(attn: mh.MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """The keys (B, Hkv, L, D) of x (B, L, E), turned by the module's RoPE to positions 0..L-1."""
    B, L, _ = x.shape
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    with torch.no_grad():
        q = attn.q_proj(x).view(B, L, H, D).transpose(1, 2)
        k = attn.k_proj(x).view(B, L, Hkv, D).transpose(1, 2)
        return attn.rope(q, k, torch.arange(L))[1]


@topic("kv-cache")
def kv_cache_decoding(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    say.text("text.decode")
    tell_memory_bound(story, say)
    tell_alignment(story, say)
    tell_incremental(story, say)
    say.text("text.closing")


def tell_memory_bound(story: Story, say: Say) -> None:
    """FLOPs and bytes of decode steps, counted, against prefill and a matrix product."""
    E, H, D, dtype = 128, 4, 32, torch.bfloat16
    say.heading("heading.memory")
    say.code("code.step-cost")
    mha = mh.MultiHeadAttention(E, H, bias=False, backend="math", dtype=dtype)
    steps = {N: decode_step_cost(mha, N) for N in (64, 512, 4096)}         # N: (attention, projections)
    prefills = {N: prefill_attention_cost(H, H, N, D, dtype) for N in steps}
    columns = ["label.flops", "label.bytes", "label.step-intensity", "label.prefill-intensity"]
    story.table(["N", *map(say, columns)],
                [[N, f"{a.flops:,}", f"{a.bytes:,}", f"{a.intensity:.2f}", f"{prefills[N].intensity:.0f}"]
                 for N, (a, _) in steps.items()],
                title=say("label.cost-setup", H=H, D=D))
    say.check("check.flops-formula", all(a.flops == 4 * H * N * D for N, (a, _) in steps.items()),
              story.pick("; ", "；").join(say("detail.flops-at", N=N, H=H, D=D, flops=f"{4 * H * N * D:,}")
                                         for N in steps))
    say.check("check.one-flop-per-byte", all(abs(a.intensity - 1.0) < 1e-12 for a, _ in steps.values()),
              say("detail.per-byte-at", ns=story.pick(", ", "、").join(map(str, steps)),
                  values=story.pick(", ", "、").join(f"{a.intensity:.2f}" for a, _ in steps.values())))
    attention, weights = steps[512]
    say.check("check.projections-too", abs(weights.intensity - 1.0) < 1e-12,
              say("detail.flops-bytes", flops=f"{weights.flops:,}", bytes=f"{weights.bytes:,}"))
    gemm = gemm_cost(1024, dtype)
    reuse = all(cost.intensity == N / 2 for N, cost in prefills.items())     # bfloat16: 2 bytes a number
    say.check("check.prefill-and-gemm", reuse and gemm.intensity > 300, say("detail.gemm", intensity=gemm.intensity),
              n=1024)
    batched, batched_weights = decode_step_cost(mha, 512, batch=8)
    say.check("check.batch", abs(batched_weights.intensity - 8.0) < 1e-12 and abs(batched.intensity - 1.0) < 1e-12,
              say("detail.batch", weights=batched_weights.intensity, attention=batched.intensity), B=8)
    mqa = mh.MultiHeadAttention(E, H, num_kv_heads=1, bias=False, backend="math", dtype=dtype)
    grouped, _ = decode_step_cost(mqa, 512)
    say.check("check.gqa", grouped.flops == attention.flops and abs(grouped.intensity - H) < 1e-12,
              say("detail.per-byte", value=grouped.intensity), H=H)
    say.text("text.memory-bound")


def tell_alignment(story: Story, say: Say) -> None:
    """The newest token's query alone: top-left sees key 0, bottom-right gives the full forward's rows."""
    say.heading("heading.alignment")
    say.text("text.alignment")
    Lq, Lk = 3, 6
    aligns = ("top_left", "bottom_right")
    story.table([say("label.query"), *(f'Mask.causal("{a}")' for a in aligns)],
                [[i, *pair] for i, pair in enumerate(zip(*(causal_rows(a, Lq, Lk) for a in aligns)))],
                title=say("label.masks", Lq=Lq, Lk=Lk))
    g = torch.Generator().manual_seed(1)
    N = 8
    q, k, v = (torch.randn(1, 2, N, 16, generator=g, dtype=torch.float64) for _ in range(3))   # (B, H, N, D)
    full = mh.attention(q, k, v, causal=True)                       # (B, H, N, D): one forward, every row
    last, first_value = q[:, :, -1:], v[:, :, :1]                   # the newest token's query alone; v[0]
    top_left = mh.attention(last, k, v, mh.Mask.causal("top_left"))
    say.check("check.top-left-sees-key-0", torch.equal(top_left, first_value), diff_text(top_left, first_value), N=N)
    torch_causal = F.scaled_dot_product_attention(last, k, v, is_causal=True)
    say.check("check.sdpa-top-left", max_diff(torch_causal, first_value) < 1e-12, diff_text(torch_causal, first_value))
    bottom_right = mh.attention(last, k, v, mh.Mask.causal("bottom_right"))
    say.check("check.bottom-right-is-last-row", max_diff(bottom_right, full[:, :, -1:]) < 1e-12,
              diff_text(bottom_right, full[:, :, -1:]), N=N)
    rows = full[:, :, -Lq:]
    right, left = (mh.attention(q[:, :, -Lq:], k, v, mh.Mask.causal(a)) for a in ("bottom_right", "top_left"))
    say.check("check.chunk", max_diff(right, rows) < 1e-12 and max_diff(left, rows) > 0.1,
              f"bottom_right: {diff_text(right, rows)}; top_left: {diff_text(left, rows)}", n=Lq)


def tell_incremental(story: Story, say: Say) -> None:
    """A module with a cache, prefill then one token per call, against its own full causal forward."""
    say.heading("heading.incremental")
    say.code("code.cache")
    L, prompt = 10, 4
    attn = mh.MultiHeadAttention(32, 4, num_kv_heads=2, rope=mh.RoPE(8)).double()
    x = torch.randn(1, L, 32, dtype=torch.float64)                  # (B, L, E)
    with torch.no_grad():
        reference = attn(x, causal=True)                            # (B, L, E): the full causal forward
    outs, cache = decode_step_by_step(attn, x, prompt)
    ends = [prompt, *range(prompt + 1, L + 1)]                     # tokens cached after each call
    story.table([say("label.call"), say("label.new-tokens"), say("label.cached"), "max |diff|"],
                [[i, out.shape[1], end, f"{max_diff(out, reference[:, end - out.shape[1]:end]):.1e}"]
                 for i, (end, out) in enumerate(zip(ends, outs))],
                title=say("label.steps", L=L, prompt=prompt))
    stepped = torch.cat(outs, dim=1)
    say.check("check.steps-equal-full", max_diff(stepped, reference) < 1e-12, diff_text(stepped, reference), L=L)
    turned = turned_keys(attn, x)
    say.check("check.cache-holds-turned-keys", int(cache.lengths[0]) == L and max_diff(cache.keys, turned) < 1e-12,
              diff_text(cache.keys, turned), L=L)
