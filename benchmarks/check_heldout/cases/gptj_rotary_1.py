"""GPT-J-style attention: rotary embeddings on the first rotary_dim features of each head, pairing
neighbouring features (rotate_every_two) with sin/cos tables whose entries repeat in pairs, applied
while the tensors are still (batch, seq, heads, head_dim). No biases; causal."""
import torch
from torch import nn


def create_sinusoidal_positions(num_pos: int, dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    sinusoid_inp = torch.einsum("i,j->ij", torch.arange(num_pos, dtype=torch.float64), inv_freq)
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)  # in einsum notation: rearrange(x, '... d j -> ... (d j)')


def apply_rotary_pos_emb(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return (tensor * cos) + (rotate_every_two(tensor) * sin)


class GPTJAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        max_positions = config.max_position_embeddings
        self.register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool))
                             .view(1, 1, max_positions, max_positions), persistent=False)
        self.embed_dim = config.n_embd
        self.num_attention_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_attention_heads
        self.scale_attn = self.head_dim ** 0.5
        self.rotary_dim = config.rotary_dim
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        pos_embd_dim = self.rotary_dim or self.head_dim
        self.register_buffer("embed_positions", create_sinusoidal_positions(max_positions, pos_embd_dim), persistent=False)

    def _split_heads(self, tensor):
        return tensor.view(tensor.size()[:-1] + (self.num_attention_heads, self.head_dim))  # (B, L, H, D)

    def forward(self, hidden_states):
        query = self._split_heads(self.q_proj(hidden_states))
        key = self._split_heads(self.k_proj(hidden_states))
        value = self._split_heads(self.v_proj(hidden_states)).permute(0, 2, 1, 3)

        seq_len = hidden_states.shape[1]
        sincos = self.embed_positions[:seq_len].to(hidden_states.dtype)[None]  # (1, L, rotary_dim)
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)

        if self.rotary_dim is not None:
            k_rot, k_pass = key[:, :, :, : self.rotary_dim], key[:, :, :, self.rotary_dim:]
            q_rot, q_pass = query[:, :, :, : self.rotary_dim], query[:, :, :, self.rotary_dim:]
            key = torch.cat([apply_rotary_pos_emb(k_rot, sin, cos), k_pass], dim=-1)
            query = torch.cat([apply_rotary_pos_emb(q_rot, sin, cos), q_pass], dim=-1)
        else:
            key = apply_rotary_pos_emb(key, sin, cos)
            query = apply_rotary_pos_emb(query, sin, cos)
        key = key.permute(0, 2, 1, 3)
        query = query.permute(0, 2, 1, 3)

        attn_weights = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn
        causal_mask = self.bias[:, :, :seq_len, :seq_len]
        mask_value = torch.finfo(attn_weights.dtype).min
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)

        attn_output = torch.matmul(attn_weights, value).permute(0, 2, 1, 3).contiguous()
        attn_output = attn_output.view(attn_output.size()[:-2] + (self.embed_dim,))
        return self.out_proj(attn_output)
