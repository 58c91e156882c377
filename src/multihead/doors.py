"""Doors from the core's classes to the tools: services a tool offers on a core object.

The core (attention, masks, backends, dispatch, module, cache, positions, capture) never imports a
tool. A few methods users expect on core objects are a tool's work:

    MultiHeadAttention.from_module(other)   convert: weights from another attention module
    MultiHeadLatentAttention.from_module    convert: a DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer
    SharedKVAttention.from_module           convert: a DeepSeek V4 attention layer
    attn.to_torch()                         convert: an equal nn.MultiheadAttention
    record._repr_html_()                    explain: a capture record drawn as the interactive page

This module belongs to the package's facade, like cli.py: it attaches those methods to the core's
classes and loads each tool by name on first use. So `import multihead` loads the core alone, and no
import cycle exists, hidden or not: the tools import the core at their top, and nothing the core
imports reaches back to them. The classes declare these methods for type checkers (TYPE_CHECKING).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from torch import nn

from multihead.capture import Recorder
from multihead.latent import MultiHeadLatentAttention
from multihead.module import MultiHeadAttention
from multihead.shared_kv import SharedKVAttention


def tool(name: str) -> ModuleType:
    """The tool module `multihead.<name>`, imported on first use."""
    return importlib.import_module(f"multihead.{name}")


def from_module(cls: type[MultiHeadAttention], module: nn.Module, **hints) -> MultiHeadAttention:
    """A MultiHeadAttention with the weights of `module`, giving the same outputs (same layout).

    Recognises torch.nn.MultiheadAttention, the textbook styles and the common naming conventions;
    hints such as num_heads=... help where the module does not say.
    """
    return tool("convert.registry").from_module(module, **hints)


def latent_from_module(cls: type[MultiHeadLatentAttention], module: nn.Module) -> MultiHeadLatentAttention:
    """The MLA of a transformers DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer, same weights and outputs."""
    return tool("convert.hf_latent").latent_from_module(module)


def shared_kv_from_module(cls: type[SharedKVAttention], module: nn.Module) -> SharedKVAttention:
    """The SharedKVAttention of a transformers DeepseekV4Attention layer, same weights and outputs."""
    return tool("convert.hf_deepseek_v4").shared_kv_from_module(module)


def to_torch(self: MultiHeadAttention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention with the same weights and outputs (where torch can express it)."""
    return tool("convert.to_torch").to_torch(self)


def record_html(self: Recorder) -> str:
    """Jupyter draws a capture record as multihead explain's interactive attention page."""
    return tool("explain.notebook").record_html(self)


MultiHeadAttention.from_module = classmethod(from_module)
MultiHeadAttention.to_torch = to_torch
MultiHeadLatentAttention.from_module = classmethod(latent_from_module)
SharedKVAttention.from_module = classmethod(shared_kv_from_module)
Recorder._repr_html_ = record_html
