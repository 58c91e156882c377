"""torch.jit.script on a model holding mh.compat.MultiheadAttention: one clear error, a RuntimeError as
torch.jit's own, naming torch.compile and torch.export; both of those run the drop-in."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.compat import CompatRuntimeError, MultiheadAttention

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")

E, H, B, L = 8, 2, 2, 5


def encoder_layer_holding_the_drop_in() -> nn.TransformerEncoderLayer:
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    ours = MultiheadAttention(E, H, batch_first=True)
    ours.load_state_dict(layer.self_attn.state_dict())
    layer.self_attn = ours
    return layer


def test_scripting_raises_one_clear_runtime_error_and_leaves_the_model_alone():
    layer = encoder_layer_holding_the_drop_in()
    with pytest.raises(RuntimeError, match="torch.compile.*torch.export") as caught:
        torch.jit.script(layer)
    assert isinstance(caught.value, CompatRuntimeError) and isinstance(caught.value, mh.AttentionError)
    assert type(layer.self_attn) is MultiheadAttention  # nothing was swapped behind the caller's back
    torch.jit.script(nn.TransformerEncoderLayer(E, H, batch_first=True))  # torch's own still scripts


class SelfAttention(nn.Module):
    """The drop-in called with a key padding mask, as a model would."""

    def __init__(self):
        super().__init__()
        self.attn = MultiheadAttention(E, H, batch_first=True)

    def forward(self, x, pad):
        return self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]


def test_torch_export_and_torch_compile_run_it_as_the_error_says():
    torch.manual_seed(0)
    model = SelfAttention().eval()
    x, pad = torch.randn(B, L, E), torch.zeros(B, L, dtype=torch.bool)
    pad[1, -2:] = True
    expected = model(x, pad)
    program = torch.export.export(model, (x, pad))
    torch.testing.assert_close(program.module()(x, pad), expected, atol=1e-6, rtol=1e-6)
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # one graph: no Python fallbacks
    torch.testing.assert_close(compiled(x, pad), expected, atol=1e-6, rtol=1e-6)
