"""A weightless QK-norm (as modded-nanogpt writes it, per head) put before the head split: the learner normalises
q and k across all heads together (over d_model); each head's q and k should be normalised over its own
head_dim. (OLMo 2 normalises the whole width on purpose, with a learned weight of that width.)"""

import torch
import torch.nn.functional as F
from torch import nn


class NormedQKAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_k = nn.Linear(d_model, d_model, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        b, n, d_model = x.shape
        q = F.rms_norm(self.to_q(x), (d_model,), eps=1e-6)  # (b, n, d_model): all heads at once
        k = F.rms_norm(self.to_k(x), (d_model,), eps=1e-6)
        q, k, v = (t.view(b, n, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, self.to_v(x)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
