"""Reading what a model's module (or its config) says about itself, under every spelling its families use.

Libraries name the same fact differently, and rename it between releases: an RMSNorm keeps its epsilon
as `eps` (torch's nn.RMSNorm, Llama 4 before transformers 5.25) or `variance_epsilon` (Llama's RMSNorm,
Llama 4 from 5.25); a head count is `num_heads`, `num_attention_heads`, `n_head`... The converters read
every such fact through `model_attribute`, which tries each spelling in SPELLINGS and, where none is
there, raises an AttentionError naming the module's class, the fact and the spellings tried, never
a raw AttributeError. A new release that renames one more attribute needs one more spelling here.
Reading never changes the module.
"""
from __future__ import annotations

from multihead.errors import AttentionError

# The spellings of each fact, tried in this order; a fact not listed here is read under its own name.
SPELLINGS: dict[str, tuple[str, ...]] = {
    "eps": ("eps", "variance_epsilon", "epsilon"),  # a norm's epsilon (the checker looks for these too)
    # labml: heads, nanoGPT: n_head, HF: num_attention_heads / num_heads, nn.Transformer: nhead,
    # the Annotated Transformer: h
    "num_heads": ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads", "nhead", "num_head",
                  "head_num", "nheads", "n_heads_q", "h"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),  # the same, as configs spell it
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads"),
    "head_dim": ("head_dim", "attention_head_size", "head_size"),
    "hidden_size": ("hidden_size", "embed_dim", "n_embd", "d_model"),
    "layer_idx": ("layer_idx", "layer_id"),
}
_REQUIRED = object()


def spellings(fact: str) -> tuple[str, ...]:
    """The attribute names `fact` goes by, in the order they are tried."""
    return SPELLINGS.get(fact, (fact,))


def model_attribute(owner, fact: str, default=_REQUIRED, *, types: tuple[type, ...] | None = None):
    """The value of `fact` on `owner` (a module or a config) under its first spelling that is there.

    types: when given, only a value of one of these types counts (bool is not an int here unless asked for);
    spellings holding something else are passed over. Where no spelling gives a value, `default` when
    one is given, else AttentionError naming type(owner), the fact, the spellings tried and what they held.
    """
    tried = spellings(fact)
    held = []
    for name in tried:
        value = getattr(owner, name, _REQUIRED)  # getattr with a default: a missing name raises nothing
        if value is _REQUIRED:
            continue
        if types is None or _fits(value, types):
            return value
        held.append(f"{name}={type(value).__name__}")
    if default is not _REQUIRED:
        return default
    wanted = f" ({' or '.join(t.__name__ for t in types)})" if types else ""
    found = f"; found only {', '.join(held)}" if held else ""
    raise AttentionError(
        f"{type(owner).__name__} does not say its {fact}{wanted}: expected an attribute named "
        f"{' or '.join(map(repr, tried))}{found}. A library release may have renamed it; the spellings multihead "
        "knows are in multihead.convert.model_attributes.SPELLINGS."
    )


def _fits(value, types: tuple[type, ...]) -> bool:
    """isinstance(value, types), with bool counting as an int only when bool is among the types."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))
