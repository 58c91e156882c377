"""Cases run inside a local process group (multihead.parallel.launch), for the test_parallel_* files.

Every rank builds the same full tensors from a fixed seed, computes the one-process reference with
mh.attention (or the unsharded module) and its gradients, then runs the parallel version on its
shard and reports the largest differences. Many cases share one group so that the tests start
few processes: `group_results(P)` runs them all once per world size and caches the answers.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import multihead as mh
from multihead import parallel as par
from multihead.parallel import cost, ring
from multihead.parallel.launch import run_local
from multihead.parallel.traffic import count_traffic

WORLD_SIZES = (2, 4)


@functools.cache
def group_results(world_size: int) -> dict:
    """Every case's result on every rank: {case name: [rank 0's, rank 1's, ...]}."""
    per_rank = run_local(all_cases, world_size, timeout_s=150, collective_timeout_s=30)
    return {name: [r[name] for r in per_rank] for name in per_rank[0]}


def all_cases() -> dict:
    return {**sequence_cases(), **error_cases(), **heads_cases(), **traffic_cases()}


# --- sequence parallel: ring and Ulysses against mh.attention on the whole tensors -------------------

@dataclass(frozen=True)
class Case:
    name: str
    causal: bool = False
    Nq: int = 16
    Nk: int | None = None  # None: self-attention, Nk = Nq
    H: int = 4
    Hkv: int = 4
    B: int = 2
    D: int = 8
    dtype: torch.dtype = torch.float32
    mask: str | None = None  # a key of MASKS
    tile: int | None = None  # ring tile size (None: the default)
    nan_in_padding: bool = False
    only: tuple = ("ring", "ulysses")
    extra: dict = field(default_factory=dict)
    layout: str = ""  # "contiguous" or "zigzag"; "" = the balanced choice: zig-zag when the call is causal

    @property
    def shards(self) -> str:
        causal = self.causal or self.mask in ("bottom_right", "causal_part")
        return self.layout or ("zigzag" if causal else "contiguous")


def _padding(B: int, Nk: int) -> torch.Tensor:
    """(B, Nk), True = padding key: the last three keys of row 0, the first two of the last row."""
    pad = torch.zeros(B, Nk, dtype=torch.bool)
    pad[0, -3:] = True
    pad[-1, :2] = True
    return pad


def _masks(B: int, Nq: int, Nk: int) -> dict:
    lens = torch.tensor([Nk, 0, Nk // 2, 1][:B])  # row 1 keeps no key: fully masked rows must be exact zeros
    pad = _padding(B, Nk)
    seg = torch.arange(Nq).div(5, rounding_mode="floor").expand(B, Nq)  # packed sequences of 5 tokens
    return {
        "lengths": mh.Mask.lengths(lens),
        "lengths+queries": mh.Mask.lengths(torch.tensor([Nk, Nk - 3][:B]), query_lens=torch.tensor([Nq - 2, Nq][:B])),
        "key_padding": mh.Mask.key_padding(pad),
        "bottom_right": mh.Mask.lengths(torch.tensor([Nk - 1, Nk // 2][:B])) & mh.Mask.causal("bottom_right"),
        "window": mh.Mask.window(5),
        "segments": mh.Mask.segments(seg),
        "causal_part": mh.Mask.causal() & mh.Mask.key_padding(pad),
    }


CASES = [
    Case("plain"),
    Case("causal gqa", causal=True, Hkv=2),
    Case("causal lengths gqa", causal=True, Hkv=2, mask="lengths"),
    Case("key padding uneven", Nq=13, mask="key_padding", nan_in_padding=True),
    Case("causal uneven lengths+queries", causal=True, Nq=19, Hkv=2, mask="lengths+queries"),
    Case("bottom-right lengths", Nq=17, mask="bottom_right"),
    Case("causal window", causal=True, Nq=18, mask="window"),
    Case("segments", Nq=15, mask="segments"),
    Case("causal part in mask", Nq=16, mask="causal_part"),
    Case("cross attention", Nq=12, Nk=20, Hkv=2, mask="key_padding"),
    Case("causal cross attention", causal=True, Nq=12, Nk=21),
    Case("mqa", causal=True, Hkv=1, mask="lengths"),
    Case("small tiles", causal=True, Nq=37, Hkv=2, mask="key_padding", tile=3, only=("ring",)),
    Case("float64", causal=True, Nq=14, Hkv=2, mask="lengths", dtype=torch.float64),
    # the other layout than the balanced one: exact as well
    Case("causal gqa, contiguous", causal=True, Hkv=2, layout="contiguous"),
    Case("causal uneven lengths+queries, contiguous", causal=True, Nq=19, Hkv=2, mask="lengths+queries",
         layout="contiguous"),
    Case("causal cross attention, contiguous", causal=True, Nq=12, Nk=21, layout="contiguous"),
    Case("bottom-right lengths, contiguous", Nq=17, mask="bottom_right", layout="contiguous"),
    Case("small tiles, contiguous", causal=True, Nq=37, Hkv=2, mask="key_padding", tile=3, only=("ring",),
         layout="contiguous"),
    Case("key padding uneven, zigzag", Nq=13, mask="key_padding", layout="zigzag"),
    Case("float64, contiguous", causal=True, Nq=14, Hkv=2, mask="lengths", dtype=torch.float64, layout="contiguous"),
]


def sequence_cases() -> dict:
    out = {}
    for case in CASES:
        for name in case.only:
            out[f"{name}: {case.name}"] = _run_sequence_case(case, name)
    return out


def _run_sequence_case(case: Case, name: str) -> dict:
    fn = par.ring_attention if name == "ring" else par.ulysses_attention
    Nk = case.Nk or case.Nq
    g = torch.Generator().manual_seed(0)
    q = torch.randn(case.B, case.H, case.Nq, case.D, generator=g, dtype=case.dtype)
    k, v = (torch.randn(case.B, case.Hkv, Nk, case.D, generator=g, dtype=case.dtype) for _ in range(2))
    dout = torch.randn(case.B, case.H, case.Nq, case.D, generator=g, dtype=case.dtype)
    mask = None if case.mask is None else _masks(case.B, case.Nq, Nk)[case.mask]
    if case.nan_in_padding:  # padded keys are inert: NaN stored there never reaches the output
        pad = _padding(case.B, Nk).view(case.B, 1, Nk, 1)
        k, v = k.masked_fill(pad, float("nan")), v.masked_fill(pad, float("nan"))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = mh.attention(*full, mask, causal=case.causal)
    ref.backward(dout)
    shards = case.shards
    local = [par.shard_sequence(t, layout=shards).detach().requires_grad_() for t in (q, k, v)]
    before = ring.TILE
    ring.TILE = case.tile or before
    try:
        got = fn(*local, mask, causal=case.causal, layout=shards)
    finally:
        ring.TILE = before
    got.backward(par.shard_sequence(dout, layout=shards))
    result = {"dtype": str(case.dtype), "shape": tuple(got.shape)}
    for label, mine, theirs in (("out", got, ref), ("dq", local[0].grad, full[0].grad),
                                ("dk", local[1].grad, full[1].grad), ("dv", local[2].grad, full[2].grad)):
        result[label] = _max_diff(mine.detach(), par.shard_sequence(theirs.detach(), layout=shards))
    result["gathered out"] = _max_diff(par.unshard_sequence(got.detach(), layout=shards), ref.detach())
    if case.mask == "lengths":  # batch row 1 keeps no key at all: its outputs and gradients are exact zeros
        result["masked row largest"] = max(float(t[1].abs().max()) for t in (got.detach(), local[0].grad))
    return result


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


# --- heads: shard_heads against the unsharded module ------------------------------------------------

def heads_cases() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    P = dist.get_world_size()
    mesh = init_device_mesh("cpu", (P,))
    out = {}
    for label, kw, call in (
        ("heads mha causal padding", {"num_heads": 8}, {"causal": True, "pad": True}),
        ("heads gqa qk_norm alibi", {"num_heads": 8, "num_kv_heads": 4, "qk_norm": True, "alibi": True}, {}),
        ("heads rope window", {"num_heads": 8, "num_kv_heads": 4, "rope": "rope", "window": 3}, {"causal": True}),
        ("heads gqa bias off", {"num_heads": 4, "num_kv_heads": 4, "bias": False}, {}),
    ):
        out[label] = _run_heads_case(mesh, kw, call)
    return out


def _run_heads_case(mesh, kw: dict, call: dict) -> dict:
    torch.manual_seed(0)
    E, B, L = 32, 2, 6
    if kw.get("rope"):
        kw = {**kw, "rope": mh.RoPE(E // kw["num_heads"])}
    ref = mh.MultiHeadAttention(E, **kw)
    mod = par.shard_heads(copy.deepcopy(ref), mesh)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, L, E, generator=g)
    dy = torch.randn(B, L, E, generator=g)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, -2:] = True
    mask = mh.Mask.key_padding(pad) if call.get("pad") else None
    xs = [x.clone().requires_grad_() for _ in range(2)]
    y_ref = ref(xs[0], mask=mask, causal=call.get("causal", False))
    y = mod(xs[1], mask=mask, causal=call.get("causal", False))
    y_ref.backward(dy)
    y.backward(dy)
    result = {"out": _max_diff(torch.as_tensor(y.detach()), y_ref.detach()), "dx": _max_diff(xs[1].grad, xs[0].grad),
              "local heads": (mod.num_heads, mod.num_kv_heads), "global heads": (ref.num_heads, ref.num_kv_heads),
              "heads held": list(mod.head_shards.heads)}
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), mod.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        result[f"grad {name}"] = _max_diff(grad, p_ref.grad)
    return result


# --- bad input: AttentionError on every rank, never a hang ------------------------------------------

def error_cases() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    rank, P = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    N = 16
    q, k, v = (torch.randn(2, 4, N, 8, generator=g) for _ in range(3))
    ql, kl, vl = (par.shard_sequence(t, layout="contiguous") for t in (q, k, v))
    q7, k7, v7 = (par.shard_sequence(t[:, :, :7], layout="contiguous") for t in (q, k, v))  # N=7: no zig-zag split
    one_row_more = lambda t: torch.cat([t, t[:, :, :1]], 2) if rank == 1 else t  # noqa: E731
    lens = torch.tensor([N, N - rank])  # every rank a different mask
    pad_local = torch.zeros(2, ql.shape[2], dtype=torch.bool)
    mesh_2d = init_device_mesh("cpu", (P, 1))
    mesh_1d = init_device_mesh("cpu", (P,))
    only_rank0 = dist.new_group([0])
    cases = {
        "shard lengths off the split": lambda f: f(one_row_more(ql), one_row_more(kl), one_row_more(vl)),
        "one rank's q is 3-D": lambda f: f(ql[0] if rank == 1 else ql, kl, vl),
        "ranks disagree on causal": lambda f: f(ql, kl, vl, causal=rank == 1),
        "ranks disagree on the mask": lambda f: f(ql, kl, vl, mh.Mask.lengths(lens)),
        "heads of another size on one rank": lambda f: f(ql[:, :2] if rank == 1 else ql, kl[:, :2] if rank == 1 else kl,
                                                         vl[:, :2] if rank == 1 else vl),
        "a mask kind that cannot shard": lambda f: f(ql, kl, vl, mh.Mask.additive(torch.zeros(N, N))),
        "key padding of the local shard": lambda f: f(ql, kl, vl, mh.Mask.key_padding(pad_local)),
        "too short for the zig-zag split": lambda f: f(*(t[:, :, :1] for t in (ql, kl, vl)), causal=True,
                                                       layout="zigzag"),
        "contiguous shards called as zig-zag": lambda f: f(q7, k7, v7, causal=True, layout="zigzag"),
        "an unknown layout": lambda f: f(ql, kl, vl, layout="zig-zag"),
        "ranks disagree on layout": lambda f: f(ql, kl, vl, layout="zigzag" if rank == 1 else "contiguous"),
        "a 2-D mesh as the group": lambda f: f(ql, kl, vl, group=mesh_2d),
    }
    out = {}
    for label, run in cases.items():
        for name, fn in (("ring", par.ring_attention), ("ulysses", par.ulysses_attention)):
            out[f"error {name}: {label}"] = _outcome(lambda: run(functools.partial(fn, layout="contiguous")))
    out["error ulysses: heads not divisible"] = _outcome(
        lambda: par.ulysses_attention(ql[:, :3], kl[:, :3], vl[:, :3], layout="contiguous"))
    out["error shard_heads: heads not divisible"] = _outcome(
        lambda: par.shard_heads(mh.MultiHeadAttention(24, 6, num_kv_heads=3), mesh_1d))
    out["error shard_heads: 2-D mesh"] = _outcome(lambda: par.shard_heads(mh.MultiHeadAttention(16, 4), mesh_2d))
    out["error shard_heads: sinks on one rank"] = _outcome(
        lambda: par.shard_heads(mh.MultiHeadAttention(16, 4, sinks=rank == 1), mesh_1d))
    out["error shard_heads: module state unchanged"] = _unchanged_after_error(mesh_1d)
    out["error unshard_sequence: dims differ"] = _outcome(
        lambda: par.unshard_sequence(ql[:, :2] if rank == 1 else ql, layout="contiguous"))
    out["error unshard_sequence: contiguous shards gathered as zig-zag"] = _outcome(
        lambda: par.unshard_sequence(q7, layout="zigzag"))
    out["error unshard_sequence: ranks disagree on layout"] = _outcome(
        lambda: par.unshard_sequence(ql, layout="zigzag" if rank == 1 else "contiguous"))
    out["error ring: not a member of the group"] = _outcome(
        lambda: par.ring_attention(ql, kl, vl, group=only_rank0, layout="contiguous"))
    return out


def _outcome(fn) -> list[str]:
    try:
        fn()
    except mh.AttentionError as e:
        return ["AttentionError", str(e)]
    except Exception as e:  # noqa: BLE001 (reported: the test expects AttentionError)
        return [type(e).__name__, str(e)]
    return ["no error", ""]


def _unchanged_after_error(mesh) -> list[str]:
    module = mh.MultiHeadAttention(24, 6, num_kv_heads=3)
    before = {n: p.clone() for n, p in module.state_dict().items()}
    try:
        par.shard_heads(module, mesh)
    except mh.AttentionError:
        pass
    same = all(torch.equal(before[n], p) and type(p) is torch.Tensor for n, p in module.state_dict().items())
    return ["unchanged" if same and module.num_heads == 6 and not hasattr(module, "head_shards") else "changed", ""]


# --- traffic: bytes counted in the collectives against the model in multihead.parallel.cost ---------

def traffic_cases() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    rank, P = dist.get_rank(), dist.get_world_size()
    out = {}
    for label, causal, N, H, Hkv in (("even causal mha", True, 16, 4, 4), ("uneven gqa", False, 13, 4, 2),
                                     ("mqa", True, 16, 4, 1)):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(2, H, N, 8, generator=g)
        k, v = (torch.randn(2, Hkv, N, 8, generator=g) for _ in range(2))
        shards = "zigzag" if causal else "contiguous"
        local = [par.shard_sequence(t, layout=shards).detach().requires_grad_() for t in (q, k, v)]
        shapes = dict(B=2, Hkv=Hkv, D=8, Dv=8, N=N, P=P, rank=rank, layout=shards, item=4)
        for name, fn, kind, model in (("ring", par.ring_attention, "p2p", cost.ring_bytes),
                                      ("ulysses", par.ulysses_attention, "all_to_all", cost.ulysses_bytes)):
            extra = {} if name == "ring" else {"H": H}
            with count_traffic() as fwd:
                y = fn(*local, causal=causal, layout=shards)
            with count_traffic() as both:
                fn(*local, causal=causal, layout=shards).sum().backward()
            out[f"traffic {name}: {label}"] = {
                "forward": (fwd.sent[kind], model(**shapes, **extra)),
                "forward+backward": (both.sent[kind], model(**shapes, **extra, backward=True)),
                "checks": fwd.sent["all_gather"], "out": tuple(y.shape)}
    mesh = init_device_mesh("cpu", (P,))
    torch.manual_seed(0)
    module = par.shard_heads(mh.MultiHeadAttention(32, 8, num_kv_heads=4), mesh)
    x = torch.randn(2, 6, 32, requires_grad=True)
    with count_traffic() as fwd:
        module(x)
    with count_traffic() as both:
        module(x).sum().backward()
    heads = dict(B=2, L=6, E=32, O=32, P=P, item=4)
    out["traffic heads"] = {"forward": (fwd.sent["all_reduce"], cost.heads_bytes(**heads)),
                            "forward+backward": (both.sent["all_reduce"], cost.heads_bytes(**heads, backward=True))}
    return out


# --- documentation ----------------------------------------------------------------------------------

def run_code(code: str) -> str:
    """Run a documentation code block on this rank (assertions inside it are the check)."""
    exec(compile(code, "docs/parallel.md", "exec"), {"__name__": "docs"})
    return "ran"
