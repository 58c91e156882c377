"""from_module: other people's attention modules in, an equivalent MultiHeadAttention out.

`registry` holds the converters, one per style; `linears_to_module` is the one builder they share.
"""
from multihead.convert.registry import from_module, linears_to_module, register_converter

__all__ = ["from_module", "linears_to_module", "register_converter"]
