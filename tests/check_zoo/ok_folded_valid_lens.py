# Correct: heads folded into the batch (B*H, L, D), d2l's valid_lens of shape (B,) or (B, Lq).
import torch
from torch import nn


class FoldMHA(nn.Module):
    def __init__(self, num_hiddens, num_heads, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.a = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.b = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.c = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.d = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def _fold(self, x):
        B, L, E = x.shape
        return x.view(B, L, self.num_heads, E // self.num_heads).transpose(1, 2).reshape(B * self.num_heads, L, -1)

    def forward(self, queries, keys, values, valid_lens=None):
        q, k, v = self._fold(self.a(queries)), self._fold(self.b(keys)), self._fold(self.c(values))
        s = torch.bmm(q, k.transpose(1, 2)) / q.shape[-1] ** 0.5  # (B*H, Lq, Lk)
        if valid_lens is not None:
            lens = torch.repeat_interleave(valid_lens, self.num_heads, dim=0)
            if lens.dim() == 1:
                lens = lens[:, None]
            s = s.masked_fill(torch.arange(s.shape[-1])[None, None, :] >= lens[..., None], -1e6)
        o = torch.bmm(torch.softmax(s, dim=-1), v)
        B = queries.shape[0]
        o = o.reshape(B, self.num_heads, o.shape[1], -1).transpose(1, 2).reshape(B, o.shape[1], -1)
        return self.d(o)
