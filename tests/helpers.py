"""Shared test helpers. Each block is a clearly named function; append new ones, do not copy."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from multihead.bench import cli


# --- plain-math multi-head attention (float64 reference) ------------------------------------------

def reference_mha(x_q, x_k, x_v, *, wq, wk, wv, num_heads, wo=None, bq=None, bk=None, bv=None,
                  bo=None, keep_mask=None, scale=None):
    """Multi-head attention written as plain loops in float64, batch-first.

    x_q (B, Lq, Eq), x_k (B, Lk, Ek), x_v (B, Lk, Ev). Weights are nn.Linear-style (out, in):
    wq, wk (H*D, E*), wv (H*Dv, Ev), wo (out, H*Dv) or None for no output projection; biases or None.
    Head h owns rows [h*D, (h+1)*D) of wq/wk/wv. keep_mask: bool broadcastable to (B, H, Lq, Lk),
    True = may attend (every query must keep at least one key). scale defaults to 1/sqrt(D).
    Returns (B, Lq, out) in float64.
    """
    f64 = lambda t: None if t is None else t.detach().to(torch.float64)  # noqa: E731
    x_q, x_k, x_v, wq, wk, wv, wo = map(f64, (x_q, x_k, x_v, wq, wk, wv, wo))
    bq, bk, bv, bo = map(f64, (bq, bk, bv, bo))
    B, Lq, Lk = x_q.shape[0], x_q.shape[1], x_k.shape[1]
    D, Dv = wq.shape[0] // num_heads, wv.shape[0] // num_heads
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    keep = None if keep_mask is None else torch.broadcast_to(keep_mask.bool(), (B, num_heads, Lq, Lk))

    def project(x, w, b, rows):
        out = x @ w[rows].T
        return out if b is None else out + b[rows]

    heads = []
    for h in range(num_heads):
        q = project(x_q, wq, bq, slice(h * D, (h + 1) * D))  # (B, Lq, D)
        k = project(x_k, wk, bk, slice(h * D, (h + 1) * D))  # (B, Lk, D)
        v = project(x_v, wv, bv, slice(h * Dv, (h + 1) * Dv))  # (B, Lk, Dv)
        out_h = torch.zeros(B, Lq, Dv, dtype=torch.float64)
        for b in range(B):
            for i in range(Lq):
                scores = torch.stack([(q[b, i] * k[b, j]).sum() * scale for j in range(Lk)])
                allowed = torch.ones(Lk, dtype=torch.bool) if keep is None else keep[b, h, i]
                weights = torch.where(allowed, torch.exp(scores - scores[allowed].max()), 0.0)
                weights = weights / weights.sum()
                out_h[b, i] = (weights[:, None] * v[b]).sum(0)
        heads.append(out_h)
    out = torch.cat(heads, dim=-1)  # (B, Lq, H*Dv), head h in columns [h*Dv, (h+1)*Dv)
    if wo is not None:
        out = out @ wo.T + (0 if bo is None else bo)
    return out


def randn64(*shape, seed: int | None = None) -> torch.Tensor:
    """Standard normal float64 tensor of `shape`: from its own generator when `seed` is given, else from
    torch's global random state."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def linear_params(linear, prefix: str) -> dict:
    """{prefix + 'w': weight, prefix + 'b': bias or None} of an nn.Linear, for reference_mha(**...)."""
    return {f"w{prefix}": linear.weight, f"b{prefix}": linear.bias}


# --- attention core reference (B, H, L, D) and the drift tolerance rule ---------------------------
# The tolerance rule (as in PyTorch's SDPA tests and flash-attn): run the *same* reference in the
# low-precision dtype, measure how far it drifts from float64, and allow the implementation under
# test twice that drift (plus a tiny floor) instead of a hand-picked atol.

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reference_attention(q, k, v, keep=None, bias=None, scale=None, compute_dtype=torch.float64):
    """softmax(q k^T * scale + bias, blocked -> -inf) v, written independently of multihead.

    q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); keep bool / bias float broadcastable to
    (B, H, Lq, Lk). Rows with no kept key give 0. Computed and returned in `compute_dtype`.
    """
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    head_of = torch.arange(H) // (H // Hkv)  # query head h reads kv head h // group
    k, v = k[:, head_of], v[:, head_of]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        scores = scores + bias.to(compute_dtype)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: NaN -> 0
    return torch.einsum("bhqk,bhkd->bhqd", weights, v)


def drift_tolerance(reference_fn, inputs, dtype, floor=1e-6):
    """2x the max drift of `reference_fn` run in `dtype` against float64 (values and input grads),
    plus one rounding step of `dtype` at the result's magnitude.

    reference_fn(*tensors, compute_dtype=...) -> Tensor.
    Returns ((out64, grads64), (tol_out, [tol_grad per input])).
    """
    def run(compute_dtype):
        leaves = [t.detach().to(dtype).to(compute_dtype).requires_grad_() for t in inputs]
        out = reference_fn(*leaves, compute_dtype=compute_dtype)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]
        return out.double(), [g.double() for g in grads]

    out64, grads64 = run(torch.float64)
    out_lp, grads_lp = run(dtype)
    eps = torch.finfo(dtype).eps  # plus one rounding step of the result dtype at the result's size
    tol = 2 * max_abs_diff(out_lp, out64) + eps * out64.abs().max().item() + floor
    grad_tols = [2 * max_abs_diff(a, b) + eps * b.abs().max().item() + floor for a, b in zip(grads_lp, grads64)]
    return (out64, grads64), (tol, grad_tols)


def max_abs_diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


# --- two modules with the same weights: same outputs and same gradients ---------------------------

def assert_same_forward_and_grads(ours, theirs, inputs, call, *, seed=None, atol=0.0, rtol=0.0):
    """Run ``call(module, *leaves)`` on both modules with fresh copies of ``inputs``; assert equal.

    Compares the outputs, the gradients of every floating input, and the gradients of every parameter
    with the same name, for one random upstream gradient. ``seed`` reseeds torch before each forward
    (so dropout draws the same masks). Default tolerance 0: the same operations in the same order.
    """
    def run(module):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor)
                  else t for t in inputs]
        module.zero_grad(set_to_none=True)
        if seed is not None:
            torch.manual_seed(seed)
        out = call(module, *leaves)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
        out.backward(upstream)
        input_grads = [t.grad for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        param_grads = {n: p.grad for n, p in module.named_parameters()}
        return out.detach(), input_grads, param_grads

    out_a, in_a, par_a = run(ours)
    out_b, in_b, par_b = run(theirs)
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=rtol, msg=lambda m: f"outputs differ: {m}")
    for i, (ga, gb) in enumerate(zip(in_a, in_b)):
        torch.testing.assert_close(ga, gb, atol=atol, rtol=rtol, msg=lambda m: f"input {i} grad differs: {m}")
    assert par_a.keys() == par_b.keys(), f"parameter names differ: {sorted(par_a)} vs {sorted(par_b)}"
    for name in par_a:
        torch.testing.assert_close(par_a[name], par_b[name], atol=atol, rtol=rtol,
                                   msg=lambda m: f"grad of {name} differs: {m}")
    return out_a


# --- decoding: prefill, then one token at a time, against the full forward --------------------------

def decoded_step_by_step(mod, x: torch.Tensor, prefill: int) -> torch.Tensor:
    """mod's output for x (B, L, E) computed with a fresh cache: the first `prefill` tokens in one call,
    then one token per call; (B, L, O), to compare with mod(x) row by row."""
    B, L, _ = x.shape
    cache = mod.new_cache(B, L)
    steps = [mod(x[:, :prefill], cache=cache)] + [mod(x[:, t:t + 1], cache=cache) for t in range(prefill, L)]
    return torch.cat(steps, dim=1)


def assert_compiles_across_lengths(mod, features: int, lengths=(5, 11)) -> None:
    """torch.compile(mod, fullgraph=True, dynamic=True) equals eager at each length (batch 2)."""
    torch._dynamo.reset()
    compiled = torch.compile(mod, fullgraph=True, dynamic=True)
    for length in lengths:
        x = torch.randn(2, length, features)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), mod(x), atol=1e-5, rtol=1e-5)


# --- multihead bench: one suite through the command, at tiny sizes ------------------------------------

def run_suite_quick(name: str, sizes_class, tiny, out: Path) -> tuple[dict, str, Path]:
    """`multihead bench --suite NAME --quick --rounds 1` with `sizes_class.quick()` returning `tiny`,
    writing into `out`: (the suite's JSON data, the Markdown text, the plot folder)."""
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--suite", name, "--quick", "--rounds", "1", "--no-progress",
                              "--json", str(out / "r.json"), "--markdown", str(out / "r.md"),
                              "--plot", str(out / "plots")])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sizes_class, "quick", classmethod(lambda cls: tiny))
        assert cli.main(args) == 0
    return json.loads((out / "r.json").read_text()), (out / "r.md").read_text(), out / "plots"


# --- converted modules: same forward and backward as their source ---------------------------------

def assert_same_forward_backward(run_source, run_converted, inputs, *, atol=1e-10, rtol=1e-10):
    """run_source(*inputs) and run_converted(*inputs) agree in output and in every input's gradient.

    inputs: tensors (float64 recommended); fresh leaf copies requiring grad are passed to each run.
    The gradient is taken of (output * fixed random weights).sum(), so every output element counts.
    """
    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
        grads = torch.autograd.grad((out * weights).sum(), leaves)
        return out.detach(), grads

    out_source, grads_source = run(run_source)
    out_converted, grads_converted = run(run_converted)
    torch.testing.assert_close(out_converted, out_source, atol=atol, rtol=rtol)
    for index, (got, expected) in enumerate(zip(grads_converted, grads_source)):
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, msg=lambda m: f"input {index} grad: {m}")


# --- explain CLI (used by test_explain_cli*.py) ----------------------------------------------------

def plain_terminal(monkeypatch, columns: int = 80) -> None:
    """No locale, no forced colour, `columns` wide: a fresh terminal as CI sees it."""
    for var in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", str(columns))


# --- multihead check: learner files made by editing a check-zoo module ------------------------------

CHECK_ZOO = Path(__file__).parent / "check_zoo"


def edited_zoo_file(folder, zoo_file: str, *edits: tuple[str, str], name: str | None = None) -> Path:
    """tests/check_zoo/<zoo_file> written into `folder` (as `name`, default the same name) with each
    (old, new) edit applied. Every `old` must occur, so that an edit can never silently do nothing."""
    text = (CHECK_ZOO / zoo_file).read_text()
    for old, new in edits:
        assert old in text, f"{old!r} is not in {zoo_file}"
        text = text.replace(old, new)
    path = Path(folder) / (name or zoo_file)
    path.write_text(text)
    return path


# --- one Mask of every kind (torch.compile / export tests) -----------------------------------------

MASK_KINDS = ("keep", "block", "additive", "lengths", "lengths_query", "key_padding", "causal_top_left",
              "causal_bottom_right", "window", "alibi", "segments", "chunks")


def mask_of_kind(kind: str, B: int, H: int, Lq: int, Lk: int, seed: int = 0):
    """A `multihead.Mask` of `kind` for (B, H, Lq, Lk), random but reproducible from `seed`.

    Where the kind can express it, batch row 0 has a query (or a whole sequence) that keeps no key,
    so fully masked rows are always exercised.
    """
    import multihead as mh

    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
    keep[0, :, 0] = False  # a fully masked query row
    lens = torch.randint(1, Lk + 1, (B,), generator=g)
    lens[0] = 0  # a sequence with no valid key
    builders = {
        "keep": lambda: mh.Mask.keep(keep),
        "block": lambda: mh.Mask.block(~keep),
        "additive": lambda: mh.Mask.additive(torch.randn(B, 1, Lq, Lk, generator=g).masked_fill(~keep, float("-inf"))),
        "lengths": lambda: mh.Mask.lengths(lens),
        "lengths_query": lambda: mh.Mask.lengths(lens, torch.randint(0, Lq + 1, (B,), generator=g)),
        "key_padding": lambda: mh.Mask.key_padding(torch.arange(Lk) >= lens[:, None]),
        "causal_top_left": lambda: mh.Mask.causal(),
        "causal_bottom_right": lambda: mh.Mask.causal("bottom_right"),
        "window": lambda: mh.Mask.causal() & mh.Mask.window(3),
        "alibi": lambda: mh.Mask.alibi(torch.rand(H, generator=g)),
        "chunks": lambda: mh.Mask.causal() & mh.Mask.chunks(4),
        "segments": lambda: mh.Mask.segments((torch.arange(Lq) >= Lq // 2).long().expand(B, Lq).contiguous(),
                                             (torch.arange(Lk) >= Lk // 2 + 1).long().expand(B, Lk).contiguous()),
    }
    return builders[kind]()


# --- multi-head latent attention reference (DeepSeek MLA, naive form) ------------------------------

def reference_mla(mla, x, compute_dtype=torch.float64, keep=None):
    """A MultiHeadLatentAttention's output, written out plainly in `compute_dtype`, causal, positions 0..L-1.

    Reads the module's weights (kv_b_proj per head, the two RMSNorms, RoPE angles from `mla.rope.cos_sin`)
    and expands every head's keys and values. x (B, L, E) -> (B, L, E) in compute_dtype. keep: bool
    broadcastable to (B, H, L, L) (True = may attend), and-ed with causal.
    """
    cast = lambda t: None if t is None else t.to(compute_dtype)  # noqa: E731  (keeps autograd)
    B, L, _ = x.shape
    H, C, Dn, R, Dv = mla.num_heads, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    x = cast(x)

    def linear(layer, t):
        out = t @ cast(layer.weight).T
        return out if layer.bias is None else out + cast(layer.bias)

    def rms(norm, t):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps) * cast(norm.weight)

    q = linear(mla.q_proj, x) if mla.q_proj is not None else linear(
        mla.q_b_proj, rms(mla.q_a_layernorm, linear(mla.q_a_proj, x)))
    q = q.view(B, L, H, Dn + R).transpose(1, 2)  # (B, H, L, Dn + R)
    latent, k_rope = linear(mla.kv_a_proj_with_mqa, x).split((C, R), dim=-1)
    latent = rms(mla.kv_a_layernorm, latent)  # (B, L, C)
    cos, sin = (cast(t) for t in mla.rope.cos_sin(torch.arange(L)))  # (1, L, R)

    def turn(t):  # t (..., L, R), pairs (2k, 2k + 1) when interleaved, else (k, k + R/2)
        if mla.rope.interleaved:
            a, b = t[..., 0::2], t[..., 1::2]
            other = torch.stack((-b, a), dim=-1).flatten(-2)
        else:
            other = torch.cat((-t[..., R // 2:], t[..., :R // 2]), dim=-1)
        return t * cos + other * sin

    q = torch.cat((q[..., :Dn], turn(q[..., Dn:])), dim=-1)
    kv = linear(mla.kv_b_proj, latent).view(B, L, H, Dn + Dv).transpose(1, 2)  # (B, H, L, Dn + Dv)
    k = torch.cat((kv[..., :Dn], turn(k_rope[:, None]).expand(B, H, L, R)), dim=-1)
    scores = q @ k.transpose(-1, -2) * mla.scale  # (B, H, L, L)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    if keep is not None:
        allowed = allowed & keep
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ kv[..., Dn:]  # (B, H, L, Dv)
    return linear(mla.o_proj, out.transpose(1, 2).reshape(B, L, H * Dv))
