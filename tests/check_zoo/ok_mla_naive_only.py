# Correct: multi-head latent attention written from the DeepSeek-V2 paper's equations, naive form only
# (no absorbed path): the keys and values come out of a compressed latent c = W_DKV x, the queries out of
# a query latent W_DQ x; the rotary key W_KR x is shared by every head (RoPE, half-split pairs).
import torch
from torch import nn


def rope(x, base=10000.0):
    """x (B, H, T, R) turned by positions 0 .. T-1 (pairs i, i + R/2)."""
    T, R = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, R, 2, dtype=torch.float32) / R)
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat((angles, angles), -1).cos().to(x.dtype), torch.cat((angles, angles), -1).sin().to(x.dtype)
    x1, x2 = x[..., :R // 2], x[..., R // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class PaperMLA(nn.Module):
    def __init__(self, d_model, n_heads, d_c=8, d_cq=12, d_h=4, d_rope=4):
        super().__init__()
        self.n_heads, self.d_h, self.d_rope = n_heads, d_h, d_rope
        self.W_DQ = nn.Linear(d_model, d_cq, bias=False)
        self.W_UQ = nn.Linear(d_cq, n_heads * d_h, bias=False)
        self.W_QR = nn.Linear(d_cq, n_heads * d_rope, bias=False)
        self.W_DKV = nn.Linear(d_model, d_c, bias=False)
        self.W_UK = nn.Linear(d_c, n_heads * d_h, bias=False)
        self.W_UV = nn.Linear(d_c, n_heads * d_h, bias=False)
        self.W_KR = nn.Linear(d_model, d_rope, bias=False)
        self.W_O = nn.Linear(n_heads * d_h, d_model, bias=False)

    def forward(self, h):
        B, T, _ = h.shape
        heads = lambda t: t.view(B, T, self.n_heads, -1).transpose(1, 2)  # noqa: E731
        c_q, c_kv = self.W_DQ(h), self.W_DKV(h)
        q = torch.cat((heads(self.W_UQ(c_q)), rope(heads(self.W_QR(c_q)))), dim=-1)
        k_rope = rope(self.W_KR(h)[:, None]).expand(-1, self.n_heads, -1, -1)
        k = torch.cat((heads(self.W_UK(c_kv)), k_rope), dim=-1)
        v = heads(self.W_UV(c_kv))
        scores = q @ k.transpose(-2, -1) / (self.d_h + self.d_rope) ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.W_O(out.transpose(1, 2).reshape(B, T, -1))
