"""A padding mask added with the wrong sign: ``scores += mask * 1e9``. It blocks nothing a caller
passing 1 = padding expects: padded keys get +1e9 and take all the weight."""

import torch
from torch import nn


class FlippedSignAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_linear = nn.Linear(hidden_size, hidden_size)
        self.k_linear = nn.Linear(hidden_size, hidden_size)
        self.v_linear = nn.Linear(hidden_size, hidden_size)
        self.o_linear = nn.Linear(hidden_size, hidden_size)

    def heads(self, x):
        return x.reshape(x.size(0), -1, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_state, attention_mask=None):
        batch_size = hidden_state.size(0)
        query = self.heads(self.q_linear(hidden_state))
        key = self.heads(self.k_linear(hidden_state))
        value = self.heads(self.v_linear(hidden_state))
        scores = torch.matmul(query, key.transpose(-1, -2)) / self.head_dim ** 0.5
        if attention_mask is not None:  # the mask's 1 marks padding
            scores += attention_mask * 1e9
        probs = torch.softmax(scores, dim=-1)
        output = torch.matmul(probs, value).transpose(1, 2).reshape(batch_size, -1, self.head_dim * self.num_heads)
        return self.o_linear(output)
