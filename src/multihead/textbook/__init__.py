"""The textbook: the five source documents' multi-head attention, each reproduced as written.

Each class keeps its document's constructor, forward signature, layout and mask convention, so that a
learner can paste the document's usage and get the document's numbers. They are standalone teaching
code (plain torch, no multihead core); ``MultiHeadAttention.from_module(obj)`` loads any of them into
the canonical module. The mapping document -> class -> mask convention is in docs/textbook.md.

=========  ==================================  ==========================  ==========================
document   class                               layout                      mask
=========  ==================================  ==========================  ==========================
000        ReshapeTransposeHeads               (B, L, hidden_size)         additive 0/1, 1 = blocked
001        StackedHeads, SplitHeads            (B, L, dim_in)              causal triu buffer
002        ClassicTransformerHeads             (B, L, d_model)             keep, mask == 0 blocked
003        SeqFirstEinsumHeads                 (L, B, d_model)             (Lq, Lk, B), 0 = blocked
004        FoldedBatchHeads                    (B, L, num_hiddens)         valid_lens (B,) / (B, Lq)
=========  ==================================  ==========================  ==========================
"""

from multihead.textbook.classic_transformer_heads import ClassicTransformerHeads
from multihead.textbook.folded_batch_heads import (DotProductAttention, FoldedBatchHeads,
                                                   masked_softmax, sequence_mask, transpose_output,
                                                   transpose_qkv)
from multihead.textbook.reshape_transpose_heads import ReshapeTransposeHeads
from multihead.textbook.seq_first_einsum_heads import PrepareForMultiHeadAttention, SeqFirstEinsumHeads
from multihead.textbook.stacked_and_split_heads import CausalAttention, SplitHeads, StackedHeads

__all__ = [
    # one class per teaching technique
    "ReshapeTransposeHeads",  # document 000
    "StackedHeads",  # document 001, stacked
    "SplitHeads",  # document 001, weight split
    "ClassicTransformerHeads",  # document 002
    "SeqFirstEinsumHeads",  # document 003
    "FoldedBatchHeads",  # document 004
    # the building blocks those classes are made of
    "CausalAttention",  # document 001's single head
    "PrepareForMultiHeadAttention",  # document 003's projection + split
    "DotProductAttention",  # document 004's (d2l) helpers from here on
    "masked_softmax",
    "sequence_mask",
    "transpose_qkv",
    "transpose_output",
]
