# Correct: the older GPT-2 port: Attention(nx, n_ctx, config, scale=False) with Conv1D layers, built
# with scale=True by the model; attention_mask is added after the causal fill with -10000.
import math

import torch
from torch import nn


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight)
        return out.reshape(*x.shape[:-1], self.nf)


class GPT2Attention(nn.Module):
    def __init__(self, nx, n_ctx, config, scale=False):
        super().__init__()
        assert nx % config.n_head == 0
        self.register_buffer("bias", torch.tril(torch.ones(n_ctx, n_ctx)).view(1, 1, n_ctx, n_ctx))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.n_head, self.split_size, self.scale = config.n_head, nx, scale
        self.output_attentions = config.output_attentions
        self.c_attn = Conv1D(3 * nx, nx)
        self.c_proj = Conv1D(nx, nx)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)

    def _attn(self, q, k, v, attention_mask=None):
        w = torch.matmul(q, k)
        if self.scale:
            w = w / math.sqrt(v.size(-1))
        nd, ns = w.size(-2), w.size(-1)
        causal = self.bias[:, :, ns - nd:ns, :ns].bool()
        w = torch.where(causal, w, self.masked_bias.to(w.dtype))
        if attention_mask is not None:
            w = w + attention_mask
        w = self.attn_dropout(nn.functional.softmax(w, dim=-1))
        return torch.matmul(w, v), w

    def forward(self, x, layer_past=None, attention_mask=None):
        query, key, value = self.c_attn(x).split(self.split_size, dim=2)
        heads = lambda t: t.view(*t.shape[:-1], self.n_head, -1)  # noqa: E731
        a, w = self._attn(heads(query).permute(0, 2, 1, 3), heads(key).permute(0, 2, 3, 1),
                          heads(value).permute(0, 2, 1, 3), attention_mask)
        a = a.permute(0, 2, 1, 3).contiguous()
        a = self.c_proj(a.view(*a.shape[:-2], -1))
        return (a, w) if self.output_attentions else (a,)
