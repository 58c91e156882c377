# Bug: forward-misspelled. The method is spelled Forward (capital F); nn.Module only calls forward, so
# calling the module raises NotImplementedError. The maths inside is right.
import torch
from torch import nn


class SelfAttentionBlock(nn.Module):
    def __init__(self, d_model, nhead):
        super().__init__()
        self.nhead = nhead
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def Forward(self, src):
        q, k, v = self.in_proj(src).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.nhead, -1)) for t in (q, k, v))  # (B, L, H, D)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
        heads = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)
        return self.out_proj(heads.flatten(2))
