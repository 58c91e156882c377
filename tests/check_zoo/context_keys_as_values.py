# Bug: keys-used-as-values. forward(x, context): the context goes through a key and a value Linear,
# but the weights then multiply the keys.
from torch import nn


class ContextAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.from_x = nn.Linear(d_model, d_model)
        self.ctx_a = nn.Linear(d_model, d_model)
        self.ctx_b = nn.Linear(d_model, d_model)
        self.merge = nn.Linear(d_model, d_model)

    def heads(self, t):
        return t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, L, D)

    def forward(self, x, context):
        q, k, v = self.heads(self.from_x(x)), self.heads(self.ctx_a(context)), self.heads(self.ctx_b(context))
        weights = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)
        return self.merge((weights @ k).transpose(1, 2).flatten(2))
