"""torch.nn.MultiheadAttention and mh.compat.MultiheadAttention side by side, for the test_compat_* files."""
from __future__ import annotations

import torch
from torch import nn

from multihead.compat import MultiheadAttention


def twins(E: int, H: int, *, seed: int = 0, dtype: torch.dtype | None = None, **kwargs):
    """(torch's module, ours) with the same parameters: ours loads torch's state dict (bias_k ... included)."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, H, dtype=dtype, **kwargs)
    with torch.no_grad():  # torch starts biases at 0; random ones make a wrong bias visible
        for name, p in theirs.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.5)
    ours = MultiheadAttention(E, H, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def run(module: nn.Module, inputs, **call_kwargs):
    """(out, weights, input grads, {name: param grad}) of module(*inputs, **call_kwargs) and a backward.

    `inputs` may repeat a tensor (self-attention): the same object stays the same leaf, so torch's
    `query is key` paths are taken on both sides.
    """
    leaves = {}
    args = [leaves.setdefault(id(t), t.detach().clone().requires_grad_()) for t in inputs]
    module.zero_grad(set_to_none=True)
    out, weights = module(*args, **call_kwargs)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    loss = (out * upstream).sum() + (0 if weights is None else weights.float().square().sum())
    loss.backward()
    return out.detach(), weights, [t.grad for t in leaves.values()], {n: p.grad for n, p in module.named_parameters()}


def assert_runs_equal(got, expected, **tol) -> None:
    """Two run() results agree: outputs, weights, input grads, every parameter's grad."""
    out_o, w_o, in_o, par_o = got
    out_t, w_t, in_t, par_t = expected
    torch.testing.assert_close(out_o, out_t, **tol)
    assert (w_o is None) == (w_t is None)
    if w_t is not None:
        torch.testing.assert_close(w_o, w_t, **tol)
    for a, b in zip(in_o, in_t, strict=True):
        torch.testing.assert_close(a, b, **tol)
    assert par_o.keys() == par_t.keys()
    for name in par_t:
        assert (par_o[name] is None) == (par_t[name] is None), name
        if par_t[name] is not None:
            torch.testing.assert_close(par_o[name], par_t[name], **tol, msg=lambda m: f"grad of {name}: {m}")


def inputs_for(B: int, L: int, S: int, E: int, kdim: int, vdim: int, batch_first: bool, *, unbatched: bool = False,
               self_attention: bool = False, dtype=torch.float32, seed: int = 1):
    """(query, key, value) in torch's layout; self_attention repeats one tensor three times."""
    g = torch.Generator().manual_seed(seed)

    def make(n, width):
        shape = (n, width) if unbatched else ((B, n, width) if batch_first else (n, B, width))
        return torch.randn(shape, generator=g).to(dtype)

    if self_attention:
        x = make(L, E)
        return x, x, x
    return make(L, E), make(S, kdim), make(S, vdim)
