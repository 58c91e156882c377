"""How a leaf layer with a weight of its own applies it: a learner's Linear class or GPT-2's Conv1D, told apart by
calling the layer once."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def leaf_layout(layer: nn.Module) -> str | None:
    """How a leaf layer with a 2-D ``weight`` (and an optional ``bias``) of its own applies them, checked by
    calling it once: "linear" for F.linear(x, weight (out, in), bias) (a Linear class of the learner's own),
    "conv1d" for x @ weight (in, out) + bias (GPT-2's Conv1D); None otherwise, and for nn.Linear itself."""
    params = dict(layer.named_parameters(recurse=False))
    weight, bias = params.get("weight"), params.get("bias")
    if (list(layer.children()) or set(params) - {"weight", "bias"} or weight is None or weight.dim() != 2
            or isinstance(weight, nn.UninitializedParameter) or isinstance(layer, nn.Linear)):
        return None
    for layout, width, rows in (("linear", weight.shape[1], weight.shape[0]), ("conv1d", weight.shape[0],
                                                                                 weight.shape[1])):
        if bias is not None and bias.shape != (rows,):
            continue
        x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        try:
            with torch.no_grad():
                got = layer(x)
                want = F.linear(x, weight if layout == "linear" else weight.t(), bias)
        except Exception:
            continue
        if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                torch.allclose(got, want, 1e-4, 1e-4, equal_nan=True):  # torch.empty weights may hold NaN
            return layout
    return None
