"""Sliding-window causal attention (Mistral style, written out): token i attends to itself and the
sliding_window - 1 tokens before it, i.e. keys j with i - sliding_window < j <= i."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class SlidingWindowAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, sliding_window: int = 4096):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.sliding_window = sliding_window
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def window_mask(self, seq_len: int, device) -> torch.Tensor:
        """(seq_len, seq_len) bool, True where query i may read key j."""
        i = torch.arange(seq_len, device=device)[:, None]
        j = torch.arange(seq_len, device=device)[None, :]
        return (j <= i) & (j > i - self.sliding_window)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = hidden_states.shape
        shape = (bsz, seq_len, self.num_heads, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)

        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~self.window_mask(seq_len, scores.device), float("-inf"))
        probs = F.softmax(scores, dim=-1)

        out = (probs @ v).transpose(1, 2).reshape(bsz, seq_len, -1)
        return self.o_proj(out)
