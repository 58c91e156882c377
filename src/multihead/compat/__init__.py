"""mh.compat.MultiheadAttention: torch.nn.MultiheadAttention, with the attention computed by multihead.

    from multihead.compat import MultiheadAttention   # was: from torch.nn import MultiheadAttention

    attn = MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                              add_zero_attn=False, kdim=None, vdim=None, batch_first=False)
    out, weights = attn(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                        average_attn_weights=True, is_causal=False)

Everything a caller of nn.MultiheadAttention relies on is the same: the constructor, the parameters
(`in_proj_weight` or `q_proj_weight`/`k_proj_weight`/`v_proj_weight`, `in_proj_bias`, `bias_k`/`bias_v`,
`out_proj`), so state dicts load both ways, and the call conventions:

- query (L, B, E) (B, L, E with batch_first=True, or (L, E) unbatched); key (S, B, kdim); value (S, B, vdim).
- masks: in a bool mask True means *blocked*; a float mask is added to the scores. attn_mask is
  (L, S) or (B*H, L, S); key_padding_mask is (B, S).
- add_bias_kv appends one learned key/value (bias_k, bias_v) and add_zero_attn one zero key/value to
  every sequence after the projections; both masks get a column that blocks nothing for each, and the
  weights cover S + 1 or S + 2 keys.
- is_causal=True is a hint that attn_mask *is* the causal mask, so attn_mask is required; where torch
  then drops attn_mask for its built-in causal mask (no key_padding_mask, need_weights=False), so does
  this, before looking at the mask's size.
- need_weights=True returns the weights the output was computed from (after dropout), averaged over
  heads (B, L, S), or per head (B, H, L, S) with average_attn_weights=False.
- a bad call raises what torch raises (AssertionError or RuntimeError), as a CompatAssertionError or
  CompatRuntimeError, which are also multihead.AttentionError. A bad key_padding_mask, which torch
  answers with AssertionError or, on its fast path, RuntimeError, raises a CompatPaddingMaskError of the
  type of the path torch would take (tests/test_compat_transformer.py runs torch's own nn.Transformer
  argument checks with the drop-in inside).
- a bias of another dtype than the query (a half in_proj_bias with a double query) is promoted.

Differences: a query whose keys are all blocked gives 0 and all-zero weights, where torch gives 0 with
need_weights=False but NaN with need_weights=True. is_causal=True without attn_mask always raises, where
torch's own fast path (eval, no grad, self-attention) silently ignores the hint. A half in_proj_bias
with a double query is promoted in both layouts (torch promotes only with batch_first=True).
torch.jit.script raises CompatRuntimeError (a RuntimeError, as torch.jit's own errors) naming
torch.compile and torch.export, which both run it.

The class subclasses nn.MultiheadAttention, so isinstance checks still hold, and overrides forward:
the attention runs in `mh.attention` on multihead's backends (see `mh.dispatch`). Two torch paths
never run it: nested-tensor inputs go to torch's own forward (its fused kernel, or its AssertionError
outside its fast path), and nn.TransformerEncoderLayer's inference fast path (eval, no grad,
batch_first, no hooks) reads in_proj_weight and runs torch's fused kernel without calling forward.
`torch.backends.mha.set_fastpath_enabled(False)` routes the layer through here.
"""
from multihead.compat.errors import CompatAssertionError, CompatPaddingMaskError, CompatRuntimeError
from multihead.compat.multihead_attention import MultiheadAttention

__all__ = ["CompatAssertionError", "CompatPaddingMaskError", "CompatRuntimeError", "MultiheadAttention"]
